//! riscv64 patch site: 8 bytes of NOPs (four `c.nop` or two `nop`) become
//!
//! ```text
//!   auipc t0, %hi(target - site)      t0 = site + hi
//!   jalr  t0, %lo(target - site)(t0)  t0 = site + 8, pc = target
//! ```
//!
//! so the trampoline finds the address after the site in t0 and the traced
//! function's return address untouched in ra (Linux's riscv ftrace site).

use super::ARCH;
use crate::program::CodegenError;
use dynasmrt::riscv::RiscvRelocation;
use dynasmrt::{dynasm, DynasmLabelApi, VecAssembler};

/// The 8-byte enabled form at `site` calling `target`.
pub fn call(site: u64, target: u64) -> Result<Vec<u8>, CodegenError> {
    // Checks the ±2 GiB reach with a typed error (dynasm would panic).
    super::reloc::split(target.wrapping_sub(site) as i64)?;
    let mut ops: VecAssembler<RiscvRelocation> = VecAssembler::new(site as usize);
    // `call t0, X` is the auipc+jalr pair with both immediates relative to
    // the auipc (a separate `jalr ... extern X` would be relative to itself).
    dynasm!(ops ; .arch riscv64i ; call t0, extern target as usize);
    ops.finalize().map_err(|e| CodegenError::Assembler { arch: ARCH, what: e.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes `auipc t0, hi ; jalr t0, lo(t0)` back into its target.
    fn target_of(site: u64, b: &[u8]) -> u64 {
        let auipc = u32::from_le_bytes(b[0..4].try_into().unwrap());
        let jalr = u32::from_le_bytes(b[4..8].try_into().unwrap());
        assert_eq!(auipc & 0xfff, 0x297, "auipc t0");
        assert_eq!(jalr & 0xfffff, 0x282e7, "jalr t0, (t0)");
        let hi = (auipc & 0xffff_f000) as i32 as i64;
        let lo = (jalr as i32 >> 20) as i64;
        site.wrapping_add((hi + lo) as u64)
    }

    #[test]
    fn reaches_its_target() {
        for (site, target) in [
            (0x1000u64, 0x2000u64),
            (0x10_0002, 0x10_0802),
            (0x4000_0000, 0x1000),
            (0x1000, 0x1000 + 0x7fff_f7fe),
            (0x9000_0000, 0x9000_0000 - 0x8000_0800),
        ] {
            let b = call(site, target).unwrap();
            assert_eq!(b.len(), 8);
            assert_eq!(target_of(site, &b), target, "site {site:#x} target {target:#x}");
        }
    }

    #[test]
    fn out_of_reach_is_a_typed_error() {
        let e = call(0x1000, 0x1000 + 0x8000_0000).unwrap_err();
        assert!(matches!(e, CodegenError::OutOfRange { arch: "riscv64", .. }), "{e}");
    }
}
