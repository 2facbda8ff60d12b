//! x86_64 patch site: five NOP bytes become `call rel32` to the trampoline
//! (or to a stub next to the module when the trampoline is out of reach).

use super::ARCH;
use crate::arch::check_signed;
use crate::program::CodegenError;
use dynasmrt::x64::X64Relocation;
use dynasmrt::{dynasm, DynasmLabelApi, VecAssembler};

/// `call target` assembled at address `site`.
pub fn call(site: u64, target: u64) -> Result<Vec<u8>, CodegenError> {
    check_signed(ARCH, "call rel32 from a patch site", target.wrapping_sub(site + 5) as i64, 32, "±2 GiB")?;
    let mut ops: VecAssembler<X64Relocation> = VecAssembler::new(site as usize);
    dynasm!(ops ; .arch x64 ; call extern target as usize);
    ops.finalize().map_err(|e| CodegenError::Assembler { arch: ARCH, what: e.to_string() })
}
