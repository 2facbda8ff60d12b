//! s390x: resolving data-word references.
//!
//! A word is read with `lgrl %rX,word` (RIL-b): bytes 2..6 of the
//! instruction hold a signed 32-bit count of halfwords from the
//! instruction's first byte, big-endian.  The fixup's `at` is that field,
//! so the ELF form is what GNU as emits for `lgrl %r1,sym`:
//! `R_390_PC32DBL` at instruction+2 with addend +2, i.e.
//! `(S + 2 - P) >> 1` with `P` the field's address.  `lgrl` also requires
//! the word to be doubleword aligned.

use super::emit::insn::Rel32;
use super::ARCH;
use crate::arch::{ElfReloc, Fixup, FixupKind, RelocTarget};
use crate::program::CodegenError;

/// Distance from the PC32DBL field back to its instruction.
const FIELD: u64 = 2;

pub fn apply(code: &mut [u8], f: &Fixup, code_addr: u64, word_addr: u64) -> Result<(), CodegenError> {
    match f.kind {
        FixupKind::S390Pc32Dbl => {
            if !word_addr.is_multiple_of(8) {
                return Err(CodegenError::OutOfRange {
                    arch: ARCH,
                    what: "lgrl data word alignment",
                    value: word_addr as i64,
                    range: "multiple of 8",
                });
            }
            let insn = code_addr.wrapping_add(f.at as u64).wrapping_sub(FIELD);
            let rel = Rel32::from_bytes("lgrl PC-relative data reference", word_addr.wrapping_sub(insn) as i64)?;
            code[f.at..f.at + 4].copy_from_slice(&rel.be_bytes());
            Ok(())
        }
        other => Err(CodegenError::Unsupported { arch: ARCH, what: format!("fixup kind {other:?}") }),
    }
}

pub fn elf(f: &Fixup) -> Vec<ElfReloc> {
    match f.kind {
        FixupKind::S390Pc32Dbl => vec![ElfReloc {
            offset: f.at,
            r_type: object::elf::R_390_PC32DBL,
            target: RelocTarget::Data(f.word),
            addend: FIELD as i64,
        }],
        _ => Vec::new(),
    }
}
