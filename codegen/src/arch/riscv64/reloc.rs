//! riscv64: resolving data-word references.
//!
//! A word is reached by the psABI's PC-relative pair
//!
//! ```text
//!   .Lpc: auipc rd, %pcrel_hi(word)        R_RISCV_PCREL_HI20  -> word
//!         ld    rd, %pcrel_lo(.Lpc)(rd)    R_RISCV_PCREL_LO12_I -> .Lpc
//! ```
//!
//! The low part is relative to the `auipc`, not to the `ld`: its ELF
//! relocation names a label on the `auipc` (whose HI20 relocation the
//! linker looks up), so the fixup carries the distance back to it.  No
//! `R_RISCV_RELAX` is emitted, so the linker never rewrites the pair.
//!
//! For JIT code the pair is resolved here: with `d = word - auipc`,
//! `hi = (d + 0x800) >> 12` (the `ld` sign-extends its 12 bits, so `hi` is
//! rounded) and `lo = d - (hi << 12)`, which reaches
//! `-2^31 - 2^11 ..= 2^31 - 2^11 - 1`.

use super::ARCH;
use crate::arch::{ElfReloc, Fixup, FixupKind, RelocTarget};
use crate::program::CodegenError;

/// `auipc`'s imm[31:12] field.
const HI20_MASK: u32 = 0xffff_f000;
/// An I-type instruction's imm[11:0] field.
const LO12_I_MASK: u32 = 0xfff0_0000;

fn word(code: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(code[at..at + 4].try_into().expect("4 bytes"))
}

fn put(code: &mut [u8], at: usize, v: u32) {
    code[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// Zeroes the immediate a fixup will fill.
pub fn clear(code: &mut [u8], f: &Fixup) {
    let mask = match f.kind {
        FixupKind::RvPcrelHi20 => HI20_MASK,
        FixupKind::RvPcrelLo12I { .. } => LO12_I_MASK,
        _ => 0,
    };
    put(code, f.at, word(code, f.at) & !mask);
}

/// Splits a PC-relative distance into the `auipc` and I-type immediates.
pub fn split(delta: i64) -> Result<(u32, u32), CodegenError> {
    const MIN: i64 = -(1 << 31) - (1 << 11);
    const MAX: i64 = (1 << 31) - (1 << 11) - 1;
    if !(MIN..=MAX).contains(&delta) {
        return Err(CodegenError::OutOfRange {
            arch: ARCH,
            what: "auipc-relative distance",
            value: delta,
            range: "-2^31-2^11 ..= 2^31-2^11-1 (±2 GiB)",
        });
    }
    let hi = (delta + 0x800) >> 12;
    let lo = delta - (hi << 12);
    debug_assert!((-2048..2048).contains(&lo));
    Ok(((hi as u32) << 12, (lo as u32) << 20))
}

pub fn apply(code: &mut [u8], f: &Fixup, code_addr: u64, word_addr: u64) -> Result<(), CodegenError> {
    let (auipc_at, mask) = match f.kind {
        FixupKind::RvPcrelHi20 => (f.at, HI20_MASK),
        FixupKind::RvPcrelLo12I { hi_back } => (f.at - hi_back as usize, LO12_I_MASK),
        other => return Err(CodegenError::Unsupported { arch: ARCH, what: format!("fixup kind {other:?}") }),
    };
    let delta = word_addr.wrapping_sub(code_addr + auipc_at as u64) as i64;
    let (hi, lo) = split(delta)?;
    let field = if mask == HI20_MASK { hi } else { lo };
    put(code, f.at, (word(code, f.at) & !mask) | field);
    Ok(())
}

pub fn elf(f: &Fixup) -> Vec<ElfReloc> {
    match f.kind {
        FixupKind::RvPcrelHi20 => {
            vec![ElfReloc { offset: f.at, r_type: object::elf::R_RISCV_PCREL_HI20, target: RelocTarget::Data(f.word), addend: 0 }]
        }
        FixupKind::RvPcrelLo12I { hi_back } => vec![ElfReloc {
            offset: f.at,
            r_type: object::elf::R_RISCV_PCREL_LO12_I,
            target: RelocTarget::Code(f.at - hi_back as usize),
            addend: 0,
        }],
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_rounds_the_high_part() {
        for d in [0i64, 4, 0x7ff, 0x800, 0xfff, -0x800, -0x801, 0x1234_5678, -0x7654_3210, (1 << 31) - 0x801] {
            let (hi, lo) = split(d).unwrap();
            let back = ((hi as i32) as i64) + (((lo as i32) >> 20) as i64);
            assert_eq!(back, d, "{d:#x}");
        }
        assert!(split((1 << 31) - 0x800).is_err());
        assert!(split(-(1 << 31) - 0x801).is_err());
        assert!(split(-(1 << 31) - 0x800).is_ok());
    }
}
