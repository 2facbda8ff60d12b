//! `FtraceRegs`: what a callback receives, read through the same
//! [`FrameLayout`] the generator used to store it (one layout per frame).

use crate::host_spec;
use ftramp_codegen::frame::FrameLayout;
use ftramp_codegen::spec::{Reg, SlotKind};
use std::sync::OnceLock;

struct Offsets {
    int_args: Vec<usize>,
    fp_args: Vec<usize>,
    fp_ret: Option<usize>,
    fp: usize,
    layout: FrameLayout,
}

/// The hot offsets as constants (`build.rs`, from the same layout).
pub(crate) mod fixed {
    include!(concat!(env!("OUT_DIR"), "/frame_offsets.rs"));
}

fn offsets() -> &'static Offsets {
    static O: OnceLock<Offsets> = OnceLock::new();
    O.get_or_init(|| {
        let spec = host_spec();
        let layout = FrameLayout::new(spec);
        let at = |k: SlotKind| layout.slot(k).expect("spec checked").offset as usize;
        let reg = |r: &Reg| at(SlotKind::Reg(*r));
        Offsets {
            int_args: spec.int_args.iter().map(reg).collect(),
            fp_args: spec.fp_args.iter().map(reg).collect(),
            fp_ret: spec.fp_ret.first().map(reg),
            fp: reg(&spec.fp),
            layout,
        }
    })
}

/// The saved machine state a trampoline passes to a callback
/// (`struct ftrace_regs *`).  Only ever used behind a reference the
/// trampoline handed out; it points into the trampoline's stack frame.
#[repr(C)]
pub struct FtraceRegs {
    _opaque: [u8; 0],
}

impl FtraceRegs {
    fn read(&self, off: usize) -> u64 {
        // SAFETY: `self` points at a struct ftrace_regs laid out by
        // FrameLayout (the trampoline allocated fregs_size bytes, aligned to
        // FrameLayout::fregs_align >= 8) and every offset used here comes
        // from that layout, a multiple of 8.
        unsafe { ((self as *const Self as *const u8).add(off) as *const u64).read() }
    }

    fn write(&mut self, off: usize, v: u64) {
        // SAFETY: as in `read`; `&mut self` gives exclusive access.
        unsafe { ((self as *mut Self as *mut u8).add(off) as *mut u64).write(v) }
    }

    /// The `n`-th integer argument register (None past the last one).
    pub fn argument(&self, n: usize) -> Option<u64> {
        offsets().int_args.get(n).map(|o| self.read(*o))
    }

    /// Sets the `n`-th integer argument register the traced function gets
    /// (false past the last one).  On s390x argument 4 is `r6`, which the
    /// ABI also makes callee-saved (spec `abi.callee_saved_args`): the
    /// traced function restores the value it got, so setting it changes the
    /// caller's `r6` after the call too.
    pub fn set_argument(&mut self, n: usize, v: u64) -> bool {
        match offsets().int_args.get(n) {
            Some(o) => {
                self.write(*o, v);
                true
            }
            None => false,
        }
    }

    /// The first 8 bytes (in memory order) of the `n`-th FP argument register.
    pub fn fp_argument(&self, n: usize) -> Option<f64> {
        offsets().fp_args.get(n).map(|o| f64::from_bits(self.read(*o)))
    }

    pub fn return_value(&self) -> u64 {
        self.read(fixed::RET)
    }

    pub fn set_return_value(&mut self, v: u64) {
        self.write(fixed::RET, v)
    }

    pub fn fp_return_value(&self) -> Option<f64> {
        offsets().fp_ret.map(|o| f64::from_bits(self.read(o)))
    }

    pub fn set_fp_return_value(&mut self, v: f64) -> bool {
        match offsets().fp_ret {
            Some(o) => {
                self.write(o, v.to_bits());
                true
            }
            None => false,
        }
    }

    /// Where execution resumes after the callback.
    pub fn instruction_pointer(&self) -> usize {
        self.read(fixed::IP) as usize
    }

    /// Redirect: resume at `ip` (IPMODIFY).
    pub fn set_instruction_pointer(&mut self, ip: usize) {
        self.write(fixed::IP, ip as u64)
    }

    /// The traced function's stack pointer at its entry.
    pub fn stack_pointer(&self) -> usize {
        self.read(fixed::SP) as usize
    }

    pub fn frame_pointer(&self) -> usize {
        self.read(offsets().fp) as usize
    }

    /// Where the traced function will return.
    pub fn return_address(&self) -> usize {
        self.read(fixed::RETURN_ADDRESS) as usize
    }

    pub fn set_return_address(&mut self, ra: usize) {
        self.write(fixed::RETURN_ADDRESS, ra as u64)
    }

    /// Any saved register by its spec name (`rbx`, `x19`…).  Registers
    /// outside `struct ftrace_regs` are only valid in `regs`-tier callbacks
    /// (Linux's `ftrace_get_regs`).
    pub fn register(&self, name: &str) -> Option<u64> {
        let r = host_spec().reg(name)?;
        let slot = offsets().layout.slot(SlotKind::Reg(r))?;
        Some(self.read(slot.offset as usize))
    }

    /// The saved flags register (`pt_regs.flags`; `regs` tier only), if
    /// the arch has one.
    pub fn flags(&self) -> Option<u64> {
        let slot = offsets().layout.slot(SlotKind::Flags)?;
        Some(self.read(slot.offset as usize))
    }

    /// Changes the flags the traced function resumes with (`regs` tier).
    pub fn set_flags(&mut self, v: u64) -> bool {
        match offsets().layout.slot(SlotKind::Flags) {
            Some(slot) => {
                self.write(slot.offset as usize, v);
                true
            }
            None => false,
        }
    }

    /// The host layout (for tools that print registers).
    pub fn layout() -> &'static FrameLayout {
        &offsets().layout
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_time_offsets_match_the_runtime_layout() {
        let spec = host_spec();
        let l = FtraceRegs::layout();
        let at = |k: SlotKind| l.slot(k).unwrap().offset as usize;
        assert_eq!(fixed::SP, at(SlotKind::Sp));
        assert_eq!(fixed::IP, at(SlotKind::Ip));
        assert_eq!(fixed::RETURN_ADDRESS, at(SlotKind::ReturnAddress));
        assert_eq!(fixed::RET, at(SlotKind::Reg(spec.int_ret[0])));
    }
}
