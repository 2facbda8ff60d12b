//! x86_64 patch site: five NOP bytes become `call rel32` to the trampoline,
//! or with stub entry (spec `site.stub`, the runtime's JIT sites) `jmp rel32`
//! to the site's own 16-byte stub next to the module:
//!
//! ```text
//!   site:  jmp stub                 e9 rel32
//!   stub:  lea r11, [rip + site+5]  4c 8d 1d rel32
//!          push r11                 41 53
//!          jmp trampoline           e9 rel32
//!          int3 int3                (padding)
//! ```
//!
//! The stack at the trampoline is then exactly what `call` leaves; only the
//! CPU's return-stack predictor got nothing to pop (codegen `program.rs`,
//! "Stub entry").  r11 is free at a function entry (psABI: scratch, no
//! argument).

use super::ARCH;
use crate::arch::check_signed;
use crate::program::CodegenError;
use dynasmrt::x64::X64Relocation;
use dynasmrt::{dynasm, DynasmApi, DynasmLabelApi, VecAssembler};

/// `call target` assembled at address `site`.
pub fn call(site: u64, target: u64) -> Result<Vec<u8>, CodegenError> {
    check_signed(ARCH, "call rel32 from a patch site", target.wrapping_sub(site + 5) as i64, 32, "±2 GiB")?;
    let mut ops: VecAssembler<X64Relocation> = VecAssembler::new(site as usize);
    dynasm!(ops ; .arch x64 ; call extern target as usize);
    ops.finalize().map_err(|e| CodegenError::Assembler { arch: ARCH, what: e.to_string() })
}

/// `jmp stub` assembled at address `site`.
pub fn jump(site: u64, stub: u64) -> Result<Vec<u8>, CodegenError> {
    check_signed(ARCH, "jmp rel32 from a patch site to its stub", stub.wrapping_sub(site + 5) as i64, 32, "±2 GiB")?;
    let mut ops: VecAssembler<X64Relocation> = VecAssembler::new(site as usize);
    dynasm!(ops ; .arch x64 ; jmp extern stub as usize);
    ops.finalize().map_err(|e| CodegenError::Assembler { arch: ARCH, what: e.to_string() })
}

/// The stub at `at` for the site at `site`, entering `target`.
pub fn stub(at: u64, site: u64, target: u64) -> Result<Vec<u8>, CodegenError> {
    let resume = site + 5;
    check_signed(ARCH, "stub's lea of the address after the site", resume.wrapping_sub(at + 7) as i64, 32, "±2 GiB")?;
    check_signed(ARCH, "jmp rel32 from a stub to its trampoline", target.wrapping_sub(at + 14) as i64, 32, "±2 GiB")?;
    let mut ops: VecAssembler<X64Relocation> = VecAssembler::new(at as usize);
    dynasm!(ops ; .arch x64
        ; lea r11, [rip + (resume.wrapping_sub(at + 7) as i32)]
        ; push r11
        ; jmp extern target as usize
        ; int3
        ; int3
    );
    let code = ops.finalize().map_err(|e| CodegenError::Assembler { arch: ARCH, what: e.to_string() })?;
    debug_assert_eq!(code.len(), crate::arch::STUB_LEN);
    Ok(code)
}
