//! aarch64 patch site: two NOPs become `mov x9, x30 ; bl target`.

use super::ARCH;
use crate::arch::check_signed;
use crate::program::CodegenError;
use dynasmrt::aarch64::Aarch64Relocation;
use dynasmrt::{dynasm, DynasmLabelApi, VecAssembler};

/// The 8-byte enabled form at `site` calling `target`.
pub fn call(site: u64, target: u64) -> Result<Vec<u8>, CodegenError> {
    check_signed(ARCH, "bl from a patch site", target.wrapping_sub(site + 4) as i64, 28, "±128 MiB")?;
    let mut ops: VecAssembler<Aarch64Relocation> = VecAssembler::new(site as usize);
    dynasm!(ops ; .arch aarch64 ; mov x9, x30 ; bl extern target as usize);
    ops.finalize().map_err(|e| CodegenError::Assembler { arch: ARCH, what: e.to_string() })
}
