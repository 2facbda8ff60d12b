//! x86_64: resolving data-word references.
//!
//! Every reference is a rip-relative disp32 (`mov r64, [rip+d]`,
//! `call [rip+d]`) at the end of its instruction: `d = S - (P + 4)` where
//! `P` is the field's address — `R_X86_64_PC32` with addend -4.

use super::ARCH;
use crate::arch::{check_signed, ElfReloc, Fixup, FixupKind, RelocTarget};
use crate::program::CodegenError;

pub fn apply(code: &mut [u8], f: &Fixup, code_addr: u64, word_addr: u64) -> Result<(), CodegenError> {
    match f.kind {
        FixupKind::X86Pc32 { end } => {
            let p = code_addr.wrapping_add(f.at as u64).wrapping_add(end as u64);
            let d = check_signed(ARCH, "rip-relative data reference", word_addr.wrapping_sub(p) as i64, 32, "±2 GiB")?;
            code[f.at..f.at + 4].copy_from_slice(&(d as i32).to_le_bytes());
            Ok(())
        }
        other => Err(CodegenError::Unsupported { arch: ARCH, what: format!("fixup kind {other:?}") }),
    }
}

pub fn elf(f: &Fixup) -> Vec<ElfReloc> {
    match f.kind {
        FixupKind::X86Pc32 { end } => vec![ElfReloc {
            offset: f.at,
            r_type: object::elf::R_X86_64_PC32,
            target: RelocTarget::Data(f.word),
            addend: -(end as i64),
        }],
        _ => Vec::new(),
    }
}
