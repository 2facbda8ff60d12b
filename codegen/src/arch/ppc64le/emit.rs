//! ppc64le instruction selection for the generator primitives.
//!
//! dynasmrt has no POWER backend, so the few instructions the primitives
//! need are encoded by [`enc`] below: one [`enc::Insn`] per instruction, with
//! every register number, displacement and branch offset checked when it is
//! encoded ([`CodegenError::OutOfRange`], never truncated).  The encodings
//! are checked against GNU `as`/`objdump` and capstone by
//! `codegen/tests/encoders_ppc64le.rs`.
//!
//! Register contract of the code emitted here (see arch-specs/ppc64le.toml):
//!
//! * `r1` is the stack pointer; frames are allocated with `stdu r1,-n(r1)`,
//!   which also writes the ELFv2 back chain, and freed with `addi r1,r1,n`.
//! * `r0` is never a base register (in `D`-form addressing `r0` reads as 0).
//! * A data word is read PC-relatively (before POWER10 there is no
//!   PC-relative load): `bcl 20,31,$+4 ; mflr rX` puts the address of the
//!   `mflr` (the *label*) in rX, then `addis rX,rX,(word-label)@ha ;
//!   addi rX,rX,(word-label)@l ; ld rX,0(rX)` — exactly what GNU `as`
//!   makes of `(word-1b)@ha` / `@l` (`R_PPC64_REL16_HA` / `R_PPC64_REL16_LO`;
//!   it cannot put a PC-relative `@l` on the DS-form `ld`).  `bcl 20,31,$+4`
//!   is the form processors do not push on the return-address stack.  It
//!   clobbers LR: the shared generator copies the site's LR into the scratch
//!   register before any data load.
//! * Indirect calls go through CTR with the callee's address in `r12`, as
//!   ELFv2 requires for a call to a global entry point (`mtctr r12 ; bctrl`).
//!   A callee may change r2 (TOC); the generator restores it from its slot.
//! * FP registers f0-f31 (VSX 0-31) are stored as 64-bit FPRs (`stfd`/`lfd`),
//!   vector registers v0-v31 (VSX 32-63) at full width with `stxv`/`lxv`
//!   (ISA 3.0, POWER9), whose displacement must be a multiple of 16.

use super::ARCH;
use crate::arch::{Emitter, Fixup, FixupKind};
use crate::program::{CodegenError, DataWord};
use crate::spec::{Reg, RegClass};
use enc::{Insn, Spr};

/// The ppc64 instruction encoder: exactly the instructions the primitives
/// use, little-endian words.
pub mod enc {
    use super::ARCH;
    use crate::program::CodegenError;

    /// Special-purpose registers by SPR number.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Spr {
        Lr,
        Ctr,
    }

    impl Spr {
        pub fn number(self) -> u32 {
            match self {
                Spr::Lr => 8,
                Spr::Ctr => 9,
            }
        }

        /// The SPR with number `n`, if the encoder knows it.
        pub fn from_number(n: u8) -> Option<Spr> {
            match n {
                8 => Some(Spr::Lr),
                9 => Some(Spr::Ctr),
                _ => None,
            }
        }
    }

    /// One instruction.  Register fields are hardware numbers (`Gpr`: 0-31,
    /// FPR: 0-31, VSX: 0-63); displacements and offsets are byte values.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Insn {
        /// `std rs, ds(ra)` (DS-form: multiple of 4).
        Std { rs: u8, ds: i32, ra: u8 },
        /// `stdu rs, ds(ra)`: store and update ra (frame allocation).
        Stdu { rs: u8, ds: i32, ra: u8 },
        /// `ld rt, ds(ra)`.
        Ld { rt: u8, ds: i32, ra: u8 },
        /// `stfd frs, d(ra)`.
        Stfd { frs: u8, d: i32, ra: u8 },
        /// `lfd frt, d(ra)`.
        Lfd { frt: u8, d: i32, ra: u8 },
        /// `stxv xs, dq(ra)` (ISA 3.0, DQ-form: multiple of 16).
        Stxv { xs: u8, dq: i32, ra: u8 },
        /// `lxv xt, dq(ra)`.
        Lxv { xt: u8, dq: i32, ra: u8 },
        /// `addi rt, ra, si` (ra must not be r0: that is `li`).
        Addi { rt: u8, ra: u8, si: i32 },
        /// `addis rt, ra, si` (ra must not be r0: that is `lis`).
        Addis { rt: u8, ra: u8, si: i32 },
        /// `mr ra, rs` (`or ra, rs, rs`).
        Mr { ra: u8, rs: u8 },
        /// `mfspr rt, spr` (`mflr`, `mfctr`).
        Mfspr { rt: u8, spr: Spr },
        /// `mtspr spr, rs` (`mtlr`, `mtctr`).
        Mtspr { spr: Spr, rs: u8 },
        /// `mfcr rt`.
        Mfcr { rt: u8 },
        /// `mtcrf fxm, rs` (`mtcr rs` when fxm is 0xff).
        Mtcrf { fxm: u8, rs: u8 },
        /// `bcl 20,31,$+4`: LR = address of the next instruction.
        BclNext,
        /// `bctr`.
        Bctr,
        /// `bctrl`.
        Bctrl,
        /// `blr`.
        Blr,
        /// `b $+off`.
        B { off: i64 },
        /// `bl $+off`.
        Bl { off: i64 },
        /// `nop` (`ori 0,0,0`).
        Nop,
        /// `trap` (`tw 31,0,0`).
        Trap,
    }

    fn out_of_range(what: &'static str, value: i64, range: &'static str) -> CodegenError {
        CodegenError::OutOfRange { arch: ARCH, what, value, range }
    }

    fn gpr(r: u8) -> Result<u32, CodegenError> {
        if r >= 32 {
            return Err(out_of_range("GPR number", r as i64, "0..31"));
        }
        Ok(r as u32)
    }

    /// A base register of D/DS/DQ-form addressing or `addi`: r0 would read
    /// as the literal 0.
    fn base(r: u8) -> Result<u32, CodegenError> {
        if r == 0 {
            return Err(out_of_range("base register", 0, "r1..r31 (r0 reads as 0)"));
        }
        gpr(r)
    }

    fn fpr(r: u8) -> Result<u32, CodegenError> {
        if r >= 32 {
            return Err(out_of_range("FPR number", r as i64, "0..31"));
        }
        Ok(r as u32)
    }

    fn vsr(r: u8) -> Result<u32, CodegenError> {
        if r >= 64 {
            return Err(out_of_range("VSX register number", r as i64, "0..63"));
        }
        Ok(r as u32)
    }

    /// A signed 16-bit immediate (D-form displacement, `addi`/`addis`).
    fn si16(what: &'static str, v: i32) -> Result<u32, CodegenError> {
        if !(-32768..=32767).contains(&v) {
            return Err(out_of_range(what, v as i64, "-32768..32767"));
        }
        Ok(v as u32 & 0xffff)
    }

    /// A DS-form displacement: signed 16 bits, multiple of 4 (the low two
    /// bits of the field belong to the opcode).
    fn ds(v: i32) -> Result<u32, CodegenError> {
        if v % 4 != 0 || !(-32768..=32764).contains(&v) {
            return Err(out_of_range("DS-form displacement", v as i64, "multiple of 4 in -32768..32764"));
        }
        Ok(v as u32 & 0xfffc)
    }

    /// A DQ-form displacement: signed 16 bits, multiple of 16.
    fn dq(v: i32) -> Result<u32, CodegenError> {
        if v % 16 != 0 || !(-32768..=32752).contains(&v) {
            return Err(out_of_range("DQ-form displacement", v as i64, "multiple of 16 in -32768..32752"));
        }
        Ok(v as u32 & 0xfff0)
    }

    /// A 26-bit I-form branch offset (LI || 0b00): ±32 MiB, multiple of 4.
    fn li26(v: i64) -> Result<u32, CodegenError> {
        if v % 4 != 0 || !(-(1 << 25)..(1 << 25)).contains(&v) {
            return Err(out_of_range("branch offset", v, "multiple of 4 within ±32 MiB"));
        }
        Ok(v as u32 & 0x03ff_fffc)
    }

    fn op(primary: u32) -> u32 {
        primary << 26
    }

    /// X-form opcode 31 with extended opcode `xo`.
    fn x31(xo: u32) -> u32 {
        op(31) | (xo << 1)
    }

    fn spr_field(spr: Spr) -> u32 {
        // The 10-bit SPR field holds the number with its halves swapped.
        let n = spr.number();
        (((n & 0x1f) << 5) | (n >> 5)) << 11
    }

    impl Insn {
        /// The instruction word.
        pub fn encode(self) -> Result<u32, CodegenError> {
            Ok(match self {
                Insn::Std { rs, ds: d, ra } => op(62) | gpr(rs)? << 21 | base(ra)? << 16 | ds(d)?,
                Insn::Stdu { rs, ds: d, ra } => op(62) | gpr(rs)? << 21 | base(ra)? << 16 | ds(d)? | 1,
                Insn::Ld { rt, ds: d, ra } => op(58) | gpr(rt)? << 21 | base(ra)? << 16 | ds(d)?,
                Insn::Stfd { frs, d, ra } => op(54) | fpr(frs)? << 21 | base(ra)? << 16 | si16("D-form displacement", d)?,
                Insn::Lfd { frt, d, ra } => op(50) | fpr(frt)? << 21 | base(ra)? << 16 | si16("D-form displacement", d)?,
                Insn::Stxv { xs, dq: d, ra } => {
                    let x = vsr(xs)?;
                    op(61) | (x & 31) << 21 | base(ra)? << 16 | dq(d)? | (x >> 5) << 3 | 0b101
                }
                Insn::Lxv { xt, dq: d, ra } => {
                    let x = vsr(xt)?;
                    op(61) | (x & 31) << 21 | base(ra)? << 16 | dq(d)? | (x >> 5) << 3 | 0b001
                }
                Insn::Addi { rt, ra, si } => op(14) | gpr(rt)? << 21 | base(ra)? << 16 | si16("addi immediate", si)?,
                Insn::Addis { rt, ra, si } => op(15) | gpr(rt)? << 21 | base(ra)? << 16 | si16("addis immediate", si)?,
                Insn::Mr { ra, rs } => x31(444) | gpr(rs)? << 21 | gpr(ra)? << 16 | gpr(rs)? << 11,
                Insn::Mfspr { rt, spr } => x31(339) | gpr(rt)? << 21 | spr_field(spr),
                Insn::Mtspr { spr, rs } => x31(467) | gpr(rs)? << 21 | spr_field(spr),
                Insn::Mfcr { rt } => x31(19) | gpr(rt)? << 21,
                Insn::Mtcrf { fxm, rs } => x31(144) | gpr(rs)? << 21 | (fxm as u32) << 12,
                // bc BO=20 (always), BI=31, BD=+4, AA=0, LK=1.
                Insn::BclNext => op(16) | 20 << 21 | 31 << 16 | 4 | 1,
                // bcctr / bclr with BO=20 (always).
                Insn::Bctr => op(19) | 20 << 21 | 528 << 1,
                Insn::Bctrl => op(19) | 20 << 21 | 528 << 1 | 1,
                Insn::Blr => op(19) | 20 << 21 | 16 << 1,
                Insn::B { off } => op(18) | li26(off)?,
                Insn::Bl { off } => op(18) | li26(off)? | 1,
                Insn::Nop => op(24),
                Insn::Trap => x31(4) | 31 << 21,
            })
        }

        /// The little-endian bytes.
        pub fn bytes(self) -> Result<[u8; 4], CodegenError> {
            Ok(self.encode()?.to_le_bytes())
        }

        /// The instruction in GNU `as` syntax (`as -mpower9` accepts it and
        /// assembles the same word; branch offsets are relative to `.`).
        pub fn gnu(self) -> String {
            let spr = |s: Spr| match s {
                Spr::Lr => "lr",
                Spr::Ctr => "ctr",
            };
            match self {
                Insn::Std { rs, ds, ra } => format!("std {rs},{ds}({ra})"),
                Insn::Stdu { rs, ds, ra } => format!("stdu {rs},{ds}({ra})"),
                Insn::Ld { rt, ds, ra } => format!("ld {rt},{ds}({ra})"),
                Insn::Stfd { frs, d, ra } => format!("stfd {frs},{d}({ra})"),
                Insn::Lfd { frt, d, ra } => format!("lfd {frt},{d}({ra})"),
                Insn::Stxv { xs, dq, ra } => format!("stxv {xs},{dq}({ra})"),
                Insn::Lxv { xt, dq, ra } => format!("lxv {xt},{dq}({ra})"),
                Insn::Addi { rt, ra, si } => format!("addi {rt},{ra},{si}"),
                Insn::Addis { rt, ra, si } => format!("addis {rt},{ra},{si}"),
                Insn::Mr { ra, rs } => format!("mr {ra},{rs}"),
                Insn::Mfspr { rt, spr: s } => format!("mf{} {rt}", spr(s)),
                Insn::Mtspr { spr: s, rs } => format!("mt{} {rs}", spr(s)),
                Insn::Mfcr { rt } => format!("mfcr {rt}"),
                Insn::Mtcrf { fxm, rs } => format!("mtcrf {fxm},{rs}"),
                Insn::BclNext => "bcl 20,31,.+4".into(),
                Insn::Bctr => "bctr".into(),
                Insn::Bctrl => "bctrl".into(),
                Insn::Blr => "blr".into(),
                Insn::B { off } => format!("b .{off:+}"),
                Insn::Bl { off } => format!("bl .{off:+}"),
                Insn::Nop => "nop".into(),
                Insn::Trap => "trap".into(),
            }
        }
    }
}

pub struct P64Emitter {
    code: Vec<u8>,
    fixups: Vec<Fixup>,
}

/// The stack pointer.
const SP: u8 = 1;
/// The register an ELFv2 indirect call carries the callee's address in.
const CALL_REG: u8 = 12;

fn unsupported(what: impl Into<String>) -> CodegenError {
    CodegenError::Unsupported { arch: ARCH, what: what.into() }
}

fn gpr(r: Reg, role: &str) -> Result<u8, CodegenError> {
    if r.class != RegClass::Gpr {
        return Err(unsupported(format!("{role} must be a general-purpose register, got {r:?}")));
    }
    Ok(r.enc)
}

fn spr(r: Reg) -> Result<Spr, CodegenError> {
    Spr::from_number(r.enc).ok_or_else(|| unsupported(format!("special register with SPR number {}", r.enc)))
}

impl P64Emitter {
    pub fn new() -> Self {
        P64Emitter { code: Vec::new(), fixups: Vec::new() }
    }

    fn here(&self) -> usize {
        self.code.len()
    }

    fn put(&mut self, insn: Insn) -> Result<(), CodegenError> {
        self.code.extend_from_slice(&insn.bytes()?);
        Ok(())
    }

    /// `rt = &word`: `bcl 20,31,$+4 ; label: mflr rt ; addis rt,rt,(word-label)@ha ;
    /// addi rt,rt,(word-label)@l`, the two immediates left zero for fixups.
    fn data_address(&mut self, rt: u8, word: DataWord) -> Result<(), CodegenError> {
        if rt == 0 {
            return Err(unsupported("a data word cannot be loaded into r0 (r0 as a base reads as 0)"));
        }
        self.put(Insn::BclNext)?;
        self.put(Insn::Mfspr { rt, spr: Spr::Lr })?;
        let at = self.here();
        self.put(Insn::Addis { rt, ra: rt, si: 0 })?;
        self.fixups.push(Fixup { at, kind: FixupKind::Ppc64Rel16Ha { from_label: 4 }, word });
        let at = self.here();
        self.put(Insn::Addi { rt, ra: rt, si: 0 })?;
        self.fixups.push(Fixup { at, kind: FixupKind::Ppc64Rel16Lo { from_label: 8 }, word });
        Ok(())
    }

    /// One load or store of `reg` at `[base + off]`.
    fn mem(&mut self, store: bool, reg: Reg, base: Reg, off: i32) -> Result<(), CodegenError> {
        let ra = gpr(base, "base register")?;
        let insn = match (reg.class, store) {
            (RegClass::Gpr, true) => Insn::Std { rs: reg.enc, ds: off, ra },
            (RegClass::Gpr, false) => Insn::Ld { rt: reg.enc, ds: off, ra },
            (RegClass::Vector, true) if reg.enc < 32 => Insn::Stfd { frs: reg.enc, d: off, ra },
            (RegClass::Vector, false) if reg.enc < 32 => Insn::Lfd { frt: reg.enc, d: off, ra },
            (RegClass::Vector, true) => Insn::Stxv { xs: reg.enc, dq: off, ra },
            (RegClass::Vector, false) => Insn::Lxv { xt: reg.enc, dq: off, ra },
            (RegClass::Special, _) => {
                return Err(unsupported("load/store of a special register (move it through a GPR)"));
            }
        };
        self.put(insn)
    }
}

impl Emitter for P64Emitter {
    fn adjust_sp(&mut self, delta: i32) -> Result<(), CodegenError> {
        match delta {
            0 => Ok(()),
            // Allocation stores the back chain (ELFv2 2.2.2.1).
            d if d < 0 => self.put(Insn::Stdu { rs: SP, ds: d, ra: SP }),
            d => self.put(Insn::Addi { rt: SP, ra: SP, si: d }),
        }
    }

    fn store(&mut self, reg: Reg, base: Reg, off: i32) -> Result<(), CodegenError> {
        self.mem(true, reg, base, off)
    }

    fn load(&mut self, reg: Reg, base: Reg, off: i32) -> Result<(), CodegenError> {
        self.mem(false, reg, base, off)
    }

    fn add_imm(&mut self, dst: Reg, src: Reg, imm: i32) -> Result<(), CodegenError> {
        match (dst.class, src.class) {
            (RegClass::Gpr, RegClass::Gpr) if imm == 0 => self.put(Insn::Mr { ra: dst.enc, rs: src.enc }),
            (RegClass::Gpr, RegClass::Gpr) => self.put(Insn::Addi { rt: dst.enc, ra: src.enc, si: imm }),
            (RegClass::Gpr, RegClass::Special) => {
                self.put(Insn::Mfspr { rt: dst.enc, spr: spr(src)? })?;
                if imm != 0 {
                    self.put(Insn::Addi { rt: dst.enc, ra: dst.enc, si: imm })?;
                }
                Ok(())
            }
            (RegClass::Special, RegClass::Gpr) if imm == 0 => self.put(Insn::Mtspr { spr: spr(dst)?, rs: src.enc }),
            _ => Err(unsupported(format!("add_imm {dst:?} <- {src:?} {imm:+}"))),
        }
    }

    fn load_data(&mut self, dst: Reg, word: DataWord) -> Result<(), CodegenError> {
        let rt = gpr(dst, "load_data destination")?;
        self.data_address(rt, word)?;
        self.put(Insn::Ld { rt, ds: 0, ra: rt })
    }

    fn call_data(&mut self, word: DataWord, scratch: Reg) -> Result<(), CodegenError> {
        if scratch != Reg::gpr(CALL_REG) {
            return Err(unsupported("ELFv2 indirect calls carry the callee in r12: trampoline.scratch[0] must be r12"));
        }
        self.load_data(scratch, word)?;
        self.call_reg(scratch)
    }

    fn call_reg(&mut self, target: Reg) -> Result<(), CodegenError> {
        if target != Reg::gpr(CALL_REG) {
            return Err(unsupported("ELFv2 indirect calls carry the callee in r12: call_reg needs r12"));
        }
        self.put(Insn::Mtspr { spr: Spr::Ctr, rs: CALL_REG })?;
        self.put(Insn::Bctrl)
    }

    fn jump_reg(&mut self, target: Reg) -> Result<(), CodegenError> {
        match target.class {
            RegClass::Gpr => {
                self.put(Insn::Mtspr { spr: Spr::Ctr, rs: target.enc })?;
                self.put(Insn::Bctr)
            }
            RegClass::Special => match spr(target)? {
                Spr::Ctr => self.put(Insn::Bctr),
                Spr::Lr => self.put(Insn::Blr),
            },
            RegClass::Vector => Err(unsupported("jump through a vector register")),
        }
    }

    fn ret(&mut self) -> Result<(), CodegenError> {
        Err(unsupported("return through the stack (ppc64 sites keep the return address in LR)"))
    }

    fn save_flags(&mut self, off: i32, scratch: Reg) -> Result<(), CodegenError> {
        let rt = gpr(scratch, "flags scratch")?;
        self.put(Insn::Mfcr { rt })?;
        self.put(Insn::Std { rs: rt, ds: off, ra: SP })
    }

    fn restore_flags(&mut self, off: i32, scratch: Reg) -> Result<(), CodegenError> {
        let rt = gpr(scratch, "flags scratch")?;
        self.put(Insn::Ld { rt, ds: off, ra: SP })?;
        self.put(Insn::Mtcrf { fxm: 0xff, rs: rt })
    }

    fn pos(&self) -> usize {
        self.here()
    }

    fn finish(self: Box<Self>) -> Result<(Vec<u8>, Vec<Fixup>), CodegenError> {
        Ok((self.code, self.fixups))
    }
}
