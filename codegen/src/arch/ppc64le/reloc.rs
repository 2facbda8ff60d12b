//! ppc64le: resolving data-word references.
//!
//! A word is reached from a label (the `mflr` after `bcl 20,31,$+4`, whose
//! address the `mflr` reads) by `addis rX,rX,(word-label)@ha` and
//! `addi rX,rX,(word-label)@l`.  The ELF relocations are the ones GNU `as`
//! emits for those operands: `R_PPC64_REL16_HA` / `R_PPC64_REL16_LO` against
//! the word, computing `S + A - P` with the addend `A = P - label` (the
//! instruction's distance from the label; the immediate is the low halfword,
//! at the word's offset 0 on little-endian).
//!
//! `@ha` is the high half adjusted for the sign of the low half:
//! `((v + 0x8000) >> 16)`, so `(ha << 16) + sign_extend(lo) == v`; the pair
//! reaches ±2 GiB.

use super::ARCH;
use crate::arch::{check_signed, ElfReloc, Fixup, FixupKind, RelocTarget};
use crate::program::CodegenError;

fn word(code: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(code[at..at + 4].try_into().expect("4 bytes"))
}

fn put(code: &mut [u8], at: usize, v: u32) {
    code[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// The label a fixup's immediate is relative to, as a distance back from
/// the instruction.
fn from_label(kind: FixupKind) -> Option<u8> {
    match kind {
        FixupKind::Ppc64Rel16Ha { from_label } | FixupKind::Ppc64Rel16Lo { from_label } => Some(from_label),
        _ => None,
    }
}

pub fn apply(code: &mut [u8], f: &Fixup, code_addr: u64, word_addr: u64) -> Result<(), CodegenError> {
    let back = from_label(f.kind).ok_or_else(|| CodegenError::Unsupported { arch: ARCH, what: format!("fixup kind {:?}", f.kind) })?;
    let label = code_addr + f.at as u64 - back as u64;
    let v = check_signed(ARCH, "data word distance", word_addr.wrapping_sub(label) as i64, 32, "±2 GiB")?;
    let imm = match f.kind {
        FixupKind::Ppc64Rel16Ha { .. } => {
            let ha = (v + 0x8000) >> 16;
            check_signed(ARCH, "@ha of the data word distance", ha, 16, "±2 GiB")? as u32 & 0xffff
        }
        _ => v as u32 & 0xffff,
    };
    let insn = word(code, f.at);
    put(code, f.at, (insn & !0xffff) | imm);
    Ok(())
}

pub fn elf(f: &Fixup) -> Vec<ElfReloc> {
    let (r_type, back) = match f.kind {
        FixupKind::Ppc64Rel16Ha { from_label } => (object::elf::R_PPC64_REL16_HA, from_label),
        FixupKind::Ppc64Rel16Lo { from_label } => (object::elf::R_PPC64_REL16_LO, from_label),
        _ => return Vec::new(),
    };
    vec![ElfReloc { offset: f.at, r_type, target: RelocTarget::Data(f.word), addend: back as i64 }]
}
