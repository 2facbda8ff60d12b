//! aarch64: resolving data-word references.
//!
//! A word is reached by `adrp xd, word` (page delta, `R_AARCH64_ADR_PREL_PG_HI21`)
//! and `ldr xd, [xd, #:lo12:word]` (`R_AARCH64_LDST64_ABS_LO12_NC`).

use super::ARCH;
use crate::arch::{check_signed, ElfReloc, Fixup, FixupKind, RelocTarget};
use crate::program::CodegenError;

const ADRP_MASK: u32 = (0x3 << 29) | (0x7ffff << 5);
const LO12_MASK: u32 = 0xfff << 10;

fn word(code: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(code[at..at + 4].try_into().expect("4 bytes"))
}

fn put(code: &mut [u8], at: usize, v: u32) {
    code[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// Zeroes the immediate a fixup will fill.
pub fn clear(code: &mut [u8], f: &Fixup) {
    let mask = match f.kind {
        FixupKind::A64AdrpPage21 => ADRP_MASK,
        FixupKind::A64Ldst64Lo12 => LO12_MASK,
        _ => 0,
    };
    put(code, f.at, word(code, f.at) & !mask);
}

pub fn apply(code: &mut [u8], f: &Fixup, code_addr: u64, word_addr: u64) -> Result<(), CodegenError> {
    let p = code_addr + f.at as u64;
    let insn = word(code, f.at);
    let new = match f.kind {
        FixupKind::A64AdrpPage21 => {
            let pages = ((word_addr & !0xfff) as i64).wrapping_sub((p & !0xfff) as i64) >> 12;
            let pages = check_signed(ARCH, "adrp page delta", pages, 21, "±4 GiB")? as u32;
            (insn & !ADRP_MASK) | ((pages & 3) << 29) | (((pages >> 2) & 0x7ffff) << 5)
        }
        FixupKind::A64Ldst64Lo12 => {
            if !word_addr.is_multiple_of(8) {
                return Err(CodegenError::OutOfRange { arch: ARCH, what: "data word alignment", value: word_addr as i64, range: "multiple of 8" });
            }
            (insn & !LO12_MASK) | ((((word_addr & 0xfff) >> 3) as u32) << 10)
        }
        other => return Err(CodegenError::Unsupported { arch: ARCH, what: format!("fixup kind {other:?}") }),
    };
    put(code, f.at, new);
    Ok(())
}

pub fn elf(f: &Fixup) -> Vec<ElfReloc> {
    let r_type = match f.kind {
        FixupKind::A64AdrpPage21 => object::elf::R_AARCH64_ADR_PREL_PG_HI21,
        FixupKind::A64Ldst64Lo12 => object::elf::R_AARCH64_LDST64_ABS_LO12_NC,
        _ => return Vec::new(),
    };
    vec![ElfReloc { offset: f.at, r_type, target: RelocTarget::Data(f.word), addend: 0 }]
}
