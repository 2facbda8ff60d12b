//! aarch64 instruction selection for the generator primitives (dynasmrt).
//!
//! Data words are reached with `adrp` + `ldr` (±4 GiB), whose immediates are
//! left zero and recorded as [`Fixup`]s.  Jumps use `ret Xn`, which branch
//! target identification does not check, so resuming in a BTI-guarded
//! function after its site is allowed (as Linux's `ret x9`).

use super::ARCH;
use crate::arch::{Emitter, Fixup, FixupKind};
use crate::program::{CodegenError, DataWord};
use crate::spec::{Reg, RegClass};
use dynasmrt::aarch64::Aarch64Relocation;
use dynasmrt::{dynasm, DynasmApi, DynasmLabelApi, VecAssembler};

pub struct A64Emitter {
    ops: VecAssembler<Aarch64Relocation>,
    fixups: Vec<Fixup>,
    start: dynasmrt::DynamicLabel,
}

const SP: u8 = 31;
/// The NZCV system register as `mrs`/`msr` encode it (op0=3 op1=3 CRn=4 CRm=2 op2=0).
const NZCV: u32 = 0x5a10;

fn range(what: &'static str, value: i64, range: &'static str) -> CodegenError {
    CodegenError::OutOfRange { arch: ARCH, what, value, range }
}

impl A64Emitter {
    pub fn new() -> Self {
        let mut ops = VecAssembler::new(0);
        let start = ops.new_dynamic_label();
        dynasm!(ops ; .arch aarch64 ; =>start);
        A64Emitter { ops, fixups: Vec::new(), start }
    }

    fn here(&self) -> usize {
        self.ops.offset().0
    }

    /// `adrp xd, word` with the page delta left for a fixup.
    fn adrp(&mut self, dst: u8, word: DataWord) {
        let at = self.here();
        let start = self.start;
        dynasm!(self.ops ; .arch aarch64 ; adrp X(dst), =>start);
        self.fixups.push(Fixup { at, kind: FixupKind::A64AdrpPage21, word });
    }

    /// `ldr xd, [xd, #:lo12:word]`.
    fn ldr_lo12(&mut self, dst: u8, word: DataWord) {
        let at = self.here();
        dynasm!(self.ops ; .arch aarch64 ; ldr X(dst), [X(dst), 0]);
        self.fixups.push(Fixup { at, kind: FixupKind::A64Ldst64Lo12, word });
    }

    /// One load or store of `reg` at `[base + off]`.
    fn mem(&mut self, store: bool, reg: Reg, base: Reg, off: i32) -> Result<(), CodegenError> {
        let b = base.enc;
        let size = if reg.class == RegClass::Vector { 16 } else { 8 };
        let scaled = off >= 0 && off % size == 0 && off / size < 4096;
        let unscaled = (-256..256).contains(&off);
        if !scaled && !unscaled {
            return Err(range("load/store offset", off as i64, "unsigned multiple of the size < 4096*size, or -256..255"));
        }
        let r = reg.enc;
        let off = off as u32;
        match (reg.class, store, scaled) {
            (RegClass::Gpr, true, true) => dynasm!(self.ops ; .arch aarch64 ; str X(r), [XSP(b), off]),
            (RegClass::Gpr, false, true) => dynasm!(self.ops ; .arch aarch64 ; ldr X(r), [XSP(b), off]),
            (RegClass::Gpr, true, false) => dynasm!(self.ops ; .arch aarch64 ; stur X(r), [XSP(b), off as i32]),
            (RegClass::Gpr, false, false) => dynasm!(self.ops ; .arch aarch64 ; ldur X(r), [XSP(b), off as i32]),
            (RegClass::Vector, true, true) => dynasm!(self.ops ; .arch aarch64 ; str Q(r), [XSP(b), off]),
            (RegClass::Vector, false, true) => dynasm!(self.ops ; .arch aarch64 ; ldr Q(r), [XSP(b), off]),
            (RegClass::Vector, true, false) => dynasm!(self.ops ; .arch aarch64 ; stur Q(r), [XSP(b), off as i32]),
            (RegClass::Vector, false, false) => dynasm!(self.ops ; .arch aarch64 ; ldur Q(r), [XSP(b), off as i32]),
            (RegClass::Special, _, _) => {
                return Err(CodegenError::Unsupported { arch: ARCH, what: "load/store of a special register".into() })
            }
        }
        Ok(())
    }
}

impl A64Emitter {
    /// `stp`/`ldp` of two X or Q registers at `[base + off]` (signed 7-bit
    /// immediate scaled by the register size).
    fn pair(&mut self, store: bool, a: Reg, b: Reg, base: Reg, off: i32, size: i32) -> Result<(), CodegenError> {
        if off % size != 0 || !(-64..64).contains(&(off / size)) {
            return Err(range("stp/ldp offset", off as i64, "multiple of the size, -64..63 times the size"));
        }
        let (ra, rb, bs) = (a.enc, b.enc, base.enc);
        match (a.class, store) {
            (RegClass::Gpr, true) => dynasm!(self.ops ; .arch aarch64 ; stp X(ra), X(rb), [XSP(bs), off]),
            (RegClass::Gpr, false) => dynasm!(self.ops ; .arch aarch64 ; ldp X(ra), X(rb), [XSP(bs), off]),
            (RegClass::Vector, true) => dynasm!(self.ops ; .arch aarch64 ; stp Q(ra), Q(rb), [XSP(bs), off]),
            (RegClass::Vector, false) => dynasm!(self.ops ; .arch aarch64 ; ldp Q(ra), Q(rb), [XSP(bs), off]),
            (RegClass::Special, _) => {
                return Err(CodegenError::Unsupported { arch: ARCH, what: "pair of special registers".into() })
            }
        }
        Ok(())
    }
}

impl Emitter for A64Emitter {
    fn adjust_sp(&mut self, delta: i32) -> Result<(), CodegenError> {
        self.add_imm(Reg::special(SP), Reg::special(SP), delta)
    }

    fn store(&mut self, reg: Reg, base: Reg, off: i32) -> Result<(), CodegenError> {
        self.mem(true, reg, base, off)
    }

    fn load(&mut self, reg: Reg, base: Reg, off: i32) -> Result<(), CodegenError> {
        self.mem(false, reg, base, off)
    }

    fn add_imm(&mut self, dst: Reg, src: Reg, imm: i32) -> Result<(), CodegenError> {
        // Register 31 means sp here (both operands of ADD immediate).
        let (d, s) = (dst.enc, src.enc);
        let mag = imm.unsigned_abs();
        if mag >= 4096 {
            return Err(range("add/sub immediate", imm as i64, "-4095..4095"));
        }
        if imm == 0 && d != SP && s != SP {
            dynasm!(self.ops ; .arch aarch64 ; mov X(d), X(s));
        } else if imm >= 0 {
            dynasm!(self.ops ; .arch aarch64 ; add XSP(d), XSP(s), mag);
        } else {
            dynasm!(self.ops ; .arch aarch64 ; sub XSP(d), XSP(s), mag);
        }
        Ok(())
    }

    fn load_data(&mut self, dst: Reg, word: DataWord) -> Result<(), CodegenError> {
        self.adrp(dst.enc, word);
        self.ldr_lo12(dst.enc, word);
        Ok(())
    }

    fn call_data(&mut self, word: DataWord, scratch: Reg) -> Result<(), CodegenError> {
        self.load_data(scratch, word)?;
        self.call_reg(scratch)
    }

    fn call_reg(&mut self, target: Reg) -> Result<(), CodegenError> {
        dynasm!(self.ops ; .arch aarch64 ; blr X(target.enc));
        Ok(())
    }

    fn jump_reg(&mut self, target: Reg) -> Result<(), CodegenError> {
        dynasm!(self.ops ; .arch aarch64 ; ret X(target.enc));
        Ok(())
    }

    fn ret(&mut self) -> Result<(), CodegenError> {
        Err(CodegenError::Unsupported { arch: ARCH, what: "return through the stack (aarch64 sites keep the return address in a register)".into() })
    }

    fn save_flags(&mut self, off: i32, scratch: Reg) -> Result<(), CodegenError> {
        dynasm!(self.ops ; .arch aarch64 ; mrs X(scratch.enc), NZCV);
        self.mem(true, scratch, Reg::special(SP), off)
    }

    fn restore_flags(&mut self, off: i32, scratch: Reg) -> Result<(), CodegenError> {
        self.mem(false, scratch, Reg::special(SP), off)?;
        dynasm!(self.ops ; .arch aarch64 ; msr NZCV, X(scratch.enc));
        Ok(())
    }

    fn store_pair(&mut self, a: Reg, b: Reg, base: Reg, off: i32, size: i32) -> Result<(), CodegenError> {
        self.pair(true, a, b, base, off, size)
    }

    fn load_pair(&mut self, a: Reg, b: Reg, base: Reg, off: i32, size: i32) -> Result<(), CodegenError> {
        self.pair(false, a, b, base, off, size)
    }

    fn pos(&self) -> usize {
        self.here()
    }

    fn finish(self: Box<Self>) -> Result<(Vec<u8>, Vec<Fixup>), CodegenError> {
        let fixups = self.fixups;
        let mut code = self.ops.finalize().map_err(|e| CodegenError::Assembler { arch: ARCH, what: e.to_string() })?;
        // Leave every relocated immediate zero, as an assembler would for RELA.
        for f in &fixups {
            super::reloc::clear(&mut code, f);
        }
        Ok((code, fixups))
    }
}
