//! riscv64 instruction selection for the generator primitives (dynasmrt).
//!
//! Every primitive is one RV64GC instruction, except data-word references:
//! `auipc rd, %pcrel_hi(word) ; ld rd, %pcrel_lo(...)(rd)` with both
//! immediates left zero and recorded as [`Fixup`]s (see `reloc.rs`).
//!
//! When the spec's objects declare RVC (`elf_flags` bit 0), an instruction
//! that has a 16-bit form is emitted in it, as GNU `as` would: `sp`-based
//! loads and stores with scaled offsets, `addi` on `sp`, `mv`, `jr`, `jalr`.
//! The pair that carries a fixup is never compressed (its relocations are
//! defined on the 32-bit forms).  Immediates are checked here and refused
//! with [`CodegenError::OutOfRange`]; dynasm would panic on them.

use super::ARCH;
use crate::arch::{Emitter, Fixup, FixupKind};
use crate::program::{CodegenError, DataWord};
use crate::spec::{Reg, RegClass};
use dynasmrt::riscv::RiscvRelocation;
use dynasmrt::{dynasm, DynasmApi, DynasmLabelApi, VecAssembler};

/// `dynasm!` for RV64 with the I, C and D extensions; whether a C form is
/// used is decided at run time by [`RvEmitter::compressed`].
macro_rules! rv {
    ($ops:expr ; $($t:tt)*) => {
        dynasm!($ops ; .arch riscv64i ; .feature icd ; $($t)*)
    };
}

pub struct RvEmitter {
    ops: VecAssembler<RiscvRelocation>,
    fixups: Vec<Fixup>,
    start: dynasmrt::DynamicLabel,
    /// Use 16-bit encodings where one exists.
    compressed: bool,
}

const ZERO: u8 = 0;
const SP: u8 = 2;

fn range(what: &'static str, value: i64, range: &'static str) -> CodegenError {
    CodegenError::OutOfRange { arch: ARCH, what, value, range }
}

fn unsupported(what: &str) -> CodegenError {
    CodegenError::Unsupported { arch: ARCH, what: what.to_string() }
}

/// Registers x8..x15 (s0, s1, a0..a5 / fs0, fs1, fa0..fa5), the only ones
/// the 3-bit register fields of most C instructions reach.
fn rvc(enc: u8) -> bool {
    (8..16).contains(&enc)
}

fn simm12(what: &'static str, v: i32) -> Result<i32, CodegenError> {
    if (-2048..2048).contains(&v) {
        Ok(v)
    } else {
        Err(range(what, v as i64, "-2048..2047"))
    }
}

fn gpr(r: Reg, what: &str) -> Result<u8, CodegenError> {
    if r.class != RegClass::Gpr {
        return Err(unsupported(&format!("{what}: {:?} register {} is not a general-purpose register", r.class, r.enc)));
    }
    Ok(r.enc)
}

impl RvEmitter {
    pub fn new(compressed: bool) -> Self {
        let mut ops = VecAssembler::new(0);
        let start = ops.new_dynamic_label();
        rv!(ops ; =>start);
        RvEmitter { ops, fixups: Vec::new(), start, compressed }
    }

    fn here(&self) -> usize {
        self.ops.offset().0
    }

    /// One load or store of `reg` at `[base + off]`, 8 bytes wide.
    fn mem(&mut self, store: bool, reg: Reg, base: Reg, off: i32) -> Result<(), CodegenError> {
        let b = gpr(base, "load/store base")?;
        let off = simm12("load/store offset", off)?;
        let r = reg.enc;
        // c.[f]sdsp/c.[f]ldsp: uimm9 scaled by 8; c.[f]sd/c.[f]ld: uimm8 scaled by 8.
        let scaled = self.compressed && off >= 0 && off % 8 == 0;
        let sp_form = scaled && b == SP && off < 512;
        let reg_form = scaled && rvc(b) && rvc(r) && off < 256;
        let uoff = off as u32;
        match (reg.class, store) {
            (RegClass::Gpr, true) => {
                if sp_form {
                    rv!(self.ops ; c.sdsp X(r), [sp, uoff]);
                } else if reg_form {
                    rv!(self.ops ; c.sd X(r), [X(b), uoff]);
                } else {
                    rv!(self.ops ; sd X(r), [X(b), off]);
                }
            }
            (RegClass::Gpr, false) => {
                if r == ZERO {
                    return Err(unsupported("load into the zero register"));
                }
                if sp_form {
                    rv!(self.ops ; c.ldsp X(r), [sp, uoff]);
                } else if reg_form {
                    rv!(self.ops ; c.ld X(r), [X(b), uoff]);
                } else {
                    rv!(self.ops ; ld X(r), [X(b), off]);
                }
            }
            (RegClass::Vector, true) => {
                if sp_form {
                    rv!(self.ops ; c.fsdsp F(r), [sp, uoff]);
                } else if reg_form {
                    rv!(self.ops ; c.fsd F(r), [X(b), uoff]);
                } else {
                    rv!(self.ops ; fsd F(r), [X(b), off]);
                }
            }
            (RegClass::Vector, false) => {
                if sp_form {
                    rv!(self.ops ; c.fldsp F(r), [sp, uoff]);
                } else if reg_form {
                    rv!(self.ops ; c.fld F(r), [X(b), uoff]);
                } else {
                    rv!(self.ops ; fld F(r), [X(b), off]);
                }
            }
            (RegClass::Special, _) => return Err(unsupported("load/store of a special register")),
        }
        Ok(())
    }
}

impl Emitter for RvEmitter {
    fn adjust_sp(&mut self, delta: i32) -> Result<(), CodegenError> {
        self.add_imm(Reg::gpr(SP), Reg::gpr(SP), delta)
    }

    fn store(&mut self, reg: Reg, base: Reg, off: i32) -> Result<(), CodegenError> {
        self.mem(true, reg, base, off)
    }

    fn load(&mut self, reg: Reg, base: Reg, off: i32) -> Result<(), CodegenError> {
        self.mem(false, reg, base, off)
    }

    fn add_imm(&mut self, dst: Reg, src: Reg, imm: i32) -> Result<(), CodegenError> {
        let d = gpr(dst, "add_imm destination")?;
        let s = gpr(src, "add_imm source")?;
        let imm = simm12("addi immediate", imm)?;
        let c = self.compressed;
        if d == ZERO {
            return Err(unsupported("add_imm into the zero register"));
        }
        if imm == 0 {
            if c && s != ZERO {
                rv!(self.ops ; c.mv X(d), X(s));
            } else {
                rv!(self.ops ; mv X(d), X(s));
            }
        } else if c && d == SP && s == SP && imm % 16 == 0 && (-512..512).contains(&imm) {
            rv!(self.ops ; c.addi16sp sp, imm);
        } else if c && s == SP && rvc(d) && imm > 0 && imm % 4 == 0 && imm < 1024 {
            let uimm = imm as u32;
            rv!(self.ops ; c.addi4spn X(d), sp, uimm);
        } else if c && d == s && (-32..32).contains(&imm) {
            rv!(self.ops ; c.addi X(d), imm);
        } else {
            rv!(self.ops ; addi X(d), X(s), imm);
        }
        Ok(())
    }

    fn load_data(&mut self, dst: Reg, word: DataWord) -> Result<(), CodegenError> {
        let d = gpr(dst, "load_data destination")?;
        if d == ZERO {
            return Err(unsupported("load_data into the zero register"));
        }
        let hi = self.here();
        let start = self.start;
        rv!(self.ops ; auipc X(d), =>start);
        self.fixups.push(Fixup { at: hi, kind: FixupKind::RvPcrelHi20, word });
        let lo = self.here();
        rv!(self.ops ; ld X(d), [X(d), 0]);
        self.fixups.push(Fixup { at: lo, kind: FixupKind::RvPcrelLo12I { hi_back: (lo - hi) as u8 }, word });
        Ok(())
    }

    fn call_data(&mut self, word: DataWord, scratch: Reg) -> Result<(), CodegenError> {
        self.load_data(scratch, word)?;
        self.call_reg(scratch)
    }

    fn call_reg(&mut self, target: Reg) -> Result<(), CodegenError> {
        let t = gpr(target, "call target")?;
        if t == ZERO {
            return Err(unsupported("call through the zero register"));
        }
        if self.compressed {
            rv!(self.ops ; c.jalr X(t));
        } else {
            rv!(self.ops ; jalr X(t));
        }
        Ok(())
    }

    fn jump_reg(&mut self, target: Reg) -> Result<(), CodegenError> {
        let t = gpr(target, "jump target")?;
        if t == ZERO {
            return Err(unsupported("jump through the zero register"));
        }
        if self.compressed {
            rv!(self.ops ; c.jr X(t));
        } else {
            rv!(self.ops ; jr X(t));
        }
        Ok(())
    }

    fn ret(&mut self) -> Result<(), CodegenError> {
        Err(unsupported("return through the stack (riscv64 sites keep the return address in a register)"))
    }

    fn save_flags(&mut self, _off: i32, _scratch: Reg) -> Result<(), CodegenError> {
        Err(unsupported("riscv64 has no flags register"))
    }

    fn restore_flags(&mut self, _off: i32, _scratch: Reg) -> Result<(), CodegenError> {
        Err(unsupported("riscv64 has no flags register"))
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
