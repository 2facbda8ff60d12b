//! s390x instruction selection for the generator primitives, and the small
//! encoder ([`insn`]) for the instructions they use (dynasmrt has no s390x
//! backend).
//!
//! | primitive            | instructions                                         |
//! |----------------------|------------------------------------------------------|
//! | `adjust_sp`          | `lay %r15,d(%r15)` (`la` for 0 < d < 4096)            |
//! | `store` / `load`     | `stg` / `lg` (20-bit displacement); vector registers: `vst` / `vl` (full 16 bytes, 12-bit displacement) |
//! | `store_multiple` / `load_multiple` | `stmg` / `lmg`; `vstm` / `vlm` (16 registers at most each) |
//! | `add_imm`            | `lgr` (imm 0), `la` / `lay`; from r0 `aghik` (r0 is no base register) |
//! | `load_data`          | `lgrl` (PC-relative, `R_390_PC32DBL`, ±4 GiB)         |
//! | `call_data`          | `lgrl %rS,word` ; `basr %r14,%rS`                     |
//! | `call_reg` / `jump_reg` | `basr %r14,%rX` / `br %rX`                         |
//! | `save_flags` / `restore_flags` | `lghi 0` + `ipm` + `stg` / `lg` + `spm`      |
//!
//! r0 can be neither a base register (it means "no register") nor a branch
//! target (`br %r0` does not branch): both are rejected with a typed error
//! instead of producing code that silently does something else.  Needs the
//! vector facility (z13) for `vst`/`vl` and distinct-operands (z196) for
//! `aghik`.

use super::ARCH;
use crate::arch::{Emitter, Fixup, FixupKind};
use crate::program::{CodegenError, DataWord};
use crate::spec::{Reg, RegClass};
use insn::{Base, BranchReg, Disp12, Disp20, Gpr, Imm16, Rel32, Vr};

/// The stack pointer (psABI: r15).
const SP: u8 = 15;
/// The register `basr` leaves the return address in (psABI: r14).
const LINK: u8 = 14;

fn unsupported(what: impl Into<String>) -> CodegenError {
    CodegenError::Unsupported { arch: ARCH, what: what.into() }
}

/// The instruction encoder: typed operands and one function per
/// instruction, each returning its bytes in the order they sit in memory
/// (s390x is big-endian: the opcode byte first, immediates
/// most-significant byte first).  Operand constructors check ranges and
/// fail with [`CodegenError::OutOfRange`]; nothing is truncated.
///
/// Formats used (z/Architecture Principles of Operation, chapter 5):
///
/// ```text
///   RR     | op:8 | r1:4 r2:4 |
///   RRE    | op:16 | 0:8 | r1:4 r2:4 |
///   RX-a   | op:8 | r1:4 x2:4 | b2:4 d2:12 |
///   RXY-a  | op:8 | r1:4 x2:4 | b2:4 dl2:12 | dh2:8 | op:8 |
///   RSY-a  | op:8 | r1:4 r3:4 | b2:4 dl2:12 | dh2:8 | op:8 |
///   RIL-b  | op:8 | r1:4 op:4 | i2:32 (halfwords from the instruction) |
///   RI-a   | op:8 | r1:4 op:4 | i2:16 |
///   RIE-d  | op:8 | r1:4 r3:4 | i2:16 | 0:8 | op:8 |
///   VRX    | op:8 | v1:4 x2:4 | b2:4 d2:12 | m3:4 rxb:4 | op:8 |
///   VRS-a  | op:8 | v1:4 v3:4 | b2:4 d2:12 | m4:4 rxb:4 | op:8 |
/// ```
///
/// `rxb` holds the fifth bit of each vector register operand (bit 3 for
/// the first operand, bit 2 for the second).
pub(super) mod insn {
    use super::ARCH;
    use crate::program::CodegenError;

    fn out_of_range(what: &'static str, value: i64, range: &'static str) -> CodegenError {
        CodegenError::OutOfRange { arch: ARCH, what, value, range }
    }

    /// A general register r0..r15.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Gpr(u8);
    impl Gpr {
        pub fn new(n: u8) -> Result<Gpr, CodegenError> {
            if n > 15 {
                return Err(out_of_range("general register number", n as i64, "0..15"));
            }
            Ok(Gpr(n))
        }
        pub const R0: Gpr = Gpr(0);
    }

    /// A general register used as a base: r1..r15 (a base field of 0
    /// means "no base").
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Base(u8);
    impl Base {
        pub fn new(n: u8) -> Result<Base, CodegenError> {
            if n == 0 || n > 15 {
                return Err(out_of_range("base register number (r0 means no base)", n as i64, "1..15"));
            }
            Ok(Base(n))
        }
    }

    /// A general register used as a branch target: r1..r15 (a branch
    /// register field of 0 means "do not branch").
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct BranchReg(u8);
    impl BranchReg {
        pub fn new(n: u8) -> Result<BranchReg, CodegenError> {
            if n == 0 || n > 15 {
                return Err(out_of_range("branch register number (r0 means no branch)", n as i64, "1..15"));
            }
            Ok(BranchReg(n))
        }
    }

    /// A vector register v0..v31.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Vr(u8);
    impl Vr {
        pub fn new(n: u8) -> Result<Vr, CodegenError> {
            if n > 31 {
                return Err(out_of_range("vector register number", n as i64, "0..31"));
            }
            Ok(Vr(n))
        }
    }

    /// An unsigned 12-bit displacement (RX, VRX formats).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Disp12(u16);
    impl Disp12 {
        pub fn new(d: i64) -> Result<Disp12, CodegenError> {
            if !(0..=4095).contains(&d) {
                return Err(out_of_range("12-bit unsigned displacement", d, "0..4095"));
            }
            Ok(Disp12(d as u16))
        }
    }

    /// A signed 20-bit displacement (RXY formats).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Disp20(i32);
    impl Disp20 {
        pub fn new(d: i64) -> Result<Disp20, CodegenError> {
            if !(-(1 << 19)..(1 << 19)).contains(&d) {
                return Err(out_of_range("20-bit signed displacement", d, "-524288..524287"));
            }
            Ok(Disp20(d as i32))
        }
    }

    /// A signed 16-bit immediate.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Imm16(i16);
    impl Imm16 {
        pub fn new(i: i64) -> Result<Imm16, CodegenError> {
            let v = i16::try_from(i).map_err(|_| out_of_range("16-bit signed immediate", i, "-32768..32767"))?;
            Ok(Imm16(v))
        }
    }

    /// A PC-relative offset of a RIL instruction, counted in halfwords from
    /// the instruction's first byte (±4 GiB).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Rel32(i32);
    impl Rel32 {
        /// From a byte distance, which must be even.
        pub fn from_bytes(what: &'static str, bytes: i64) -> Result<Rel32, CodegenError> {
            if bytes % 2 != 0 {
                return Err(out_of_range(what, bytes, "an even distance (targets are 2-byte aligned)"));
            }
            let half = i32::try_from(bytes / 2).map_err(|_| out_of_range(what, bytes, "-4294967296..4294967294 bytes"))?;
            Ok(Rel32(half))
        }
        pub const ZERO: Rel32 = Rel32(0);
        /// The field as stored: big-endian.
        pub fn be_bytes(self) -> [u8; 4] {
            self.0.to_be_bytes()
        }
    }

    fn rr(op: u8, r1: u8, r2: u8) -> [u8; 2] {
        [op, r1 << 4 | r2]
    }

    fn rre(op: u16, r1: u8, r2: u8) -> [u8; 4] {
        [(op >> 8) as u8, op as u8, 0, r1 << 4 | r2]
    }

    fn rx_a(op: u8, r1: u8, x2: u8, b2: Base, d2: Disp12) -> [u8; 4] {
        [op, r1 << 4 | x2, b2.0 << 4 | (d2.0 >> 8) as u8, d2.0 as u8]
    }

    fn rxy_a(op: u16, r1: u8, x2: u8, b2: Base, d2: Disp20) -> [u8; 6] {
        let dl = (d2.0 & 0xfff) as u16;
        let dh = ((d2.0 >> 12) & 0xff) as u8;
        [(op >> 8) as u8, r1 << 4 | x2, b2.0 << 4 | (dl >> 8) as u8, dl as u8, dh, op as u8]
    }

    fn rsy_a(op: u16, r1: u8, r3: u8, b2: Base, d2: Disp20) -> [u8; 6] {
        rxy_a(op, r1, r3, b2, d2)
    }

    fn vrs_a(op: u16, v1: Vr, v3: Vr, b2: Base, d2: Disp12) -> [u8; 6] {
        let rxb = if v1.0 >= 16 { 0x8 } else { 0 } | if v3.0 >= 16 { 0x4 } else { 0 };
        [(op >> 8) as u8, (v1.0 & 0xf) << 4 | (v3.0 & 0xf), b2.0 << 4 | (d2.0 >> 8) as u8, d2.0 as u8, rxb, op as u8]
    }

    fn ril(op: u16, r1: u8, i2: Rel32) -> [u8; 6] {
        let i = i2.be_bytes();
        [(op >> 4) as u8, r1 << 4 | (op & 0xf) as u8, i[0], i[1], i[2], i[3]]
    }

    fn rie_d(op: u16, r1: u8, r3: u8, i2: Imm16) -> [u8; 6] {
        let i = i2.0.to_be_bytes();
        [(op >> 8) as u8, r1 << 4 | r3, i[0], i[1], 0, op as u8]
    }

    fn vrx(op: u16, v1: Vr, x2: u8, b2: Base, d2: Disp12, m3: u8) -> [u8; 6] {
        let rxb = if v1.0 >= 16 { 0x8 } else { 0 };
        [(op >> 8) as u8, (v1.0 & 0xf) << 4 | x2, b2.0 << 4 | (d2.0 >> 8) as u8, d2.0 as u8, m3 << 4 | rxb, op as u8]
    }

    /// `stg %r1,d(%b)`: store 64 bits.
    pub fn stg(r1: Gpr, d: Disp20, b: Base) -> [u8; 6] {
        rxy_a(0xe324, r1.0, 0, b, d)
    }
    /// `lg %r1,d(%b)`: load 64 bits.
    pub fn lg(r1: Gpr, d: Disp20, b: Base) -> [u8; 6] {
        rxy_a(0xe304, r1.0, 0, b, d)
    }
    /// `stmg %r1,%r3,d(%b)`: store r1..r3 (ascending, no wrap here) at
    /// consecutive doublewords.
    pub fn stmg(r1: Gpr, r3: Gpr, d: Disp20, b: Base) -> [u8; 6] {
        rsy_a(0xeb24, r1.0, r3.0, b, d)
    }
    /// `lmg %r1,%r3,d(%b)`.
    pub fn lmg(r1: Gpr, r3: Gpr, d: Disp20, b: Base) -> [u8; 6] {
        rsy_a(0xeb04, r1.0, r3.0, b, d)
    }
    /// `vstm %v1,%v3,d(%b)`: store v1..v3 (at most 16) at consecutive
    /// quadwords (no alignment hint).
    pub fn vstm(v1: Vr, v3: Vr, d: Disp12, b: Base) -> [u8; 6] {
        vrs_a(0xe73e, v1, v3, b, d)
    }
    /// `vlm %v1,%v3,d(%b)`.
    pub fn vlm(v1: Vr, v3: Vr, d: Disp12, b: Base) -> [u8; 6] {
        vrs_a(0xe736, v1, v3, b, d)
    }
    /// `vst %v1,d(%b)`: store 128 bits (no alignment hint).
    pub fn vst(v1: Vr, d: Disp12, b: Base) -> [u8; 6] {
        vrx(0xe70e, v1, 0, b, d, 0)
    }
    /// `vl %v1,d(%b)`: load 128 bits (no alignment hint).
    pub fn vl(v1: Vr, d: Disp12, b: Base) -> [u8; 6] {
        vrx(0xe706, v1, 0, b, d, 0)
    }
    /// `la %r1,d(%b)`: r1 = b + d (64-bit addressing mode).
    pub fn la(r1: Gpr, d: Disp12, b: Base) -> [u8; 4] {
        rx_a(0x41, r1.0, 0, b, d)
    }
    /// `lay %r1,d(%b)`: r1 = b + d, signed 20-bit d.
    pub fn lay(r1: Gpr, d: Disp20, b: Base) -> [u8; 6] {
        rxy_a(0xe371, r1.0, 0, b, d)
    }
    /// `lgr %r1,%r2`.
    pub fn lgr(r1: Gpr, r2: Gpr) -> [u8; 4] {
        rre(0xb904, r1.0, r2.0)
    }
    /// `aghik %r1,%r3,i`: r1 = r3 + i (sets the condition code).
    pub fn aghik(r1: Gpr, r3: Gpr, i: Imm16) -> [u8; 6] {
        rie_d(0xecd9, r1.0, r3.0, i)
    }
    /// `lgrl %r1,target`: load 64 bits from PC + 2*i (doubleword aligned).
    pub fn lgrl(r1: Gpr, i: Rel32) -> [u8; 6] {
        ril(0xc48, r1.0, i)
    }
    /// `brasl %r1,target`: call PC + 2*i, return address in r1.
    pub fn brasl(r1: Gpr, i: Rel32) -> [u8; 6] {
        ril(0xc05, r1.0, i)
    }
    /// `brcl m,target`; with mask 0 a 6-byte no-op (`jgnop`).  Only the
    /// tests use it (to check the spec's NOP forms).
    #[cfg(test)]
    pub fn brcl(mask: u8, i: Rel32) -> Result<[u8; 6], CodegenError> {
        if mask > 15 {
            return Err(out_of_range("branch mask", mask as i64, "0..15"));
        }
        Ok(ril(0xc04, mask, i))
    }
    /// `basr %r1,%r2`: call r2, return address in r1.
    pub fn basr(r1: Gpr, r2: BranchReg) -> [u8; 2] {
        rr(0x0d, r1.0, r2.0)
    }
    /// `br %r2` (`bcr 15,%r2`).
    pub fn br(r2: BranchReg) -> [u8; 2] {
        rr(0x07, 0xf, r2.0)
    }
    /// `nopr %r0` (`bcr 0,%r0`).
    #[cfg(test)]
    pub fn nopr() -> [u8; 2] {
        rr(0x07, 0, 0)
    }
    /// `lghi %r1,i`: r1 = sign-extended i (the condition code is kept).
    pub fn lghi(r1: Gpr, i: Imm16) -> [u8; 4] {
        let i = i.0.to_be_bytes();
        [0xa7, r1.0 << 4 | 0x9, i[0], i[1]]
    }
    /// `ipm %r1`: condition code and program mask into bits 32-39 of r1.
    pub fn ipm(r1: Gpr) -> [u8; 4] {
        rre(0xb222, r1.0, 0)
    }
    /// `spm %r1`: condition code and program mask from bits 34-39 of r1.
    pub fn spm(r1: Gpr) -> [u8; 2] {
        rr(0x04, r1.0, 0)
    }
}

fn gpr(r: Reg, role: &str) -> Result<Gpr, CodegenError> {
    if r.class != RegClass::Gpr {
        return Err(unsupported(format!("{role}: {:?} register {} is not a general register", r.class, r.enc)));
    }
    Gpr::new(r.enc)
}

fn base(r: Reg) -> Result<Base, CodegenError> {
    if r.class != RegClass::Gpr {
        return Err(unsupported(format!("base: {:?} register {} is not a general register", r.class, r.enc)));
    }
    Base::new(r.enc)
}

fn branch(r: Reg) -> Result<BranchReg, CodegenError> {
    if r.class != RegClass::Gpr {
        return Err(unsupported(format!("branch target: {:?} register {} is not a general register", r.class, r.enc)));
    }
    BranchReg::new(r.enc)
}

pub struct S390Emitter {
    code: Vec<u8>,
    fixups: Vec<Fixup>,
}

impl S390Emitter {
    pub fn new() -> Self {
        S390Emitter { code: Vec::new(), fixups: Vec::new() }
    }

    fn put(&mut self, bytes: &[u8]) {
        self.code.extend_from_slice(bytes);
    }

    fn mem(&mut self, store: bool, reg: Reg, b: Reg, off: i32) -> Result<(), CodegenError> {
        let b = base(b)?;
        match reg.class {
            RegClass::Gpr => {
                let (r, d) = (Gpr::new(reg.enc)?, Disp20::new(off as i64)?);
                self.put(&if store { insn::stg(r, d, b) } else { insn::lg(r, d, b) });
            }
            RegClass::Vector => {
                let (v, d) = (Vr::new(reg.enc)?, Disp12::new(off as i64)?);
                self.put(&if store { insn::vst(v, d, b) } else { insn::vl(v, d, b) });
            }
            RegClass::Special => return Err(unsupported("load/store of a special register")),
        }
        Ok(())
    }
}

impl S390Emitter {
    /// `stmg`/`lmg`/`vstm`/`vlm` of `count` registers from `first`, in
    /// chunks of at most 16 (the instructions' limit); one register is a
    /// plain store/load.
    fn multiple(&mut self, store: bool, first: Reg, count: u8, base: Reg, off: i32, size: i32) -> Result<(), CodegenError> {
        let b = self::base(base)?;
        let width = match first.class {
            RegClass::Gpr => 8,
            RegClass::Vector => 16,
            RegClass::Special => return Err(unsupported("load/store multiple of special registers")),
        };
        if size != width {
            return Err(unsupported(format!("store/load multiple with {size}-byte slots ({width}-byte registers)")));
        }
        if !store && (first.enc..first.enc.saturating_add(count)).contains(&base.enc) && first.class == RegClass::Gpr {
            return Err(unsupported("load multiple into its own base register"));
        }
        // Check every operand before emitting anything.
        let mut chunks = Vec::new();
        let mut done = 0u8;
        while done < count {
            let n = (count - done).min(16);
            let (lo, hi) = (first.enc + done, first.enc + done + n - 1);
            let at = off as i64 + done as i64 * size as i64;
            chunks.push((lo, hi, at));
            done += n;
        }
        let mut code = Vec::new();
        for (lo, hi, at) in chunks {
            if lo == hi {
                let r = Reg { class: first.class, enc: lo };
                let mut one = S390Emitter::new();
                one.mem(store, r, base, at as i32)?;
                code.extend(one.code);
                continue;
            }
            match first.class {
                RegClass::Gpr => {
                    let (r1, r3, d) = (Gpr::new(lo)?, Gpr::new(hi)?, Disp20::new(at)?);
                    code.extend(if store { insn::stmg(r1, r3, d, b) } else { insn::lmg(r1, r3, d, b) });
                }
                _ => {
                    let (v1, v3, d) = (Vr::new(lo)?, Vr::new(hi)?, Disp12::new(at)?);
                    code.extend(if store { insn::vstm(v1, v3, d, b) } else { insn::vlm(v1, v3, d, b) });
                }
            }
        }
        self.put(&code);
        Ok(())
    }
}

impl Emitter for S390Emitter {
    fn adjust_sp(&mut self, delta: i32) -> Result<(), CodegenError> {
        self.add_imm(Reg::gpr(SP), Reg::gpr(SP), delta)
    }

    fn store(&mut self, reg: Reg, base: Reg, off: i32) -> Result<(), CodegenError> {
        self.mem(true, reg, base, off)
    }

    fn load(&mut self, reg: Reg, base: Reg, off: i32) -> Result<(), CodegenError> {
        self.mem(false, reg, base, off)
    }

    fn store_multiple(&mut self, first: Reg, count: u8, base: Reg, off: i32, size: i32) -> Result<(), CodegenError> {
        self.multiple(true, first, count, base, off, size)
    }

    fn load_multiple(&mut self, first: Reg, count: u8, base: Reg, off: i32, size: i32) -> Result<(), CodegenError> {
        self.multiple(false, first, count, base, off, size)
    }

    fn add_imm(&mut self, dst: Reg, src: Reg, imm: i32) -> Result<(), CodegenError> {
        let d = gpr(dst, "add_imm destination")?;
        let s = gpr(src, "add_imm source")?;
        if imm == 0 {
            if d != s {
                self.put(&insn::lgr(d, s));
            }
        } else if s == Gpr::R0 {
            // r0 as a base would read as 0: add with distinct operands.
            self.put(&insn::aghik(d, s, Imm16::new(imm as i64)?));
        } else if (1..4096).contains(&imm) {
            self.put(&insn::la(d, Disp12::new(imm as i64)?, base(src)?));
        } else {
            self.put(&insn::lay(d, Disp20::new(imm as i64)?, base(src)?));
        }
        Ok(())
    }

    fn load_data(&mut self, dst: Reg, word: DataWord) -> Result<(), CodegenError> {
        let r = gpr(dst, "load_data destination")?;
        // The halfword offset (bytes 2..6) is filled by the fixup.
        let at = self.code.len() + 2;
        self.put(&insn::lgrl(r, Rel32::ZERO));
        self.fixups.push(Fixup { at, kind: FixupKind::S390Pc32Dbl, word });
        Ok(())
    }

    fn call_data(&mut self, word: DataWord, scratch: Reg) -> Result<(), CodegenError> {
        branch(scratch)?;
        self.load_data(scratch, word)?;
        self.call_reg(scratch)
    }

    fn call_reg(&mut self, target: Reg) -> Result<(), CodegenError> {
        self.put(&insn::basr(Gpr::new(LINK)?, branch(target)?));
        Ok(())
    }

    fn jump_reg(&mut self, target: Reg) -> Result<(), CodegenError> {
        self.put(&insn::br(branch(target)?));
        Ok(())
    }

    fn ret(&mut self) -> Result<(), CodegenError> {
        Err(unsupported("return through the stack (s390x sites keep the return address in a register)"))
    }

    /// The saved word is `cc << 28 | program_mask << 24` (bits 34-39 of
    /// the register, which `ipm` sets and `spm` reads); clearing the
    /// register first keeps the rest zero.
    fn save_flags(&mut self, off: i32, scratch: Reg) -> Result<(), CodegenError> {
        let t = gpr(scratch, "save_flags scratch")?;
        self.put(&insn::lghi(t, Imm16::new(0)?));
        self.put(&insn::ipm(t));
        self.mem(true, scratch, Reg::gpr(SP), off)
    }

    fn restore_flags(&mut self, off: i32, scratch: Reg) -> Result<(), CodegenError> {
        self.mem(false, scratch, Reg::gpr(SP), off)?;
        self.put(&insn::spm(gpr(scratch, "restore_flags scratch")?));
        Ok(())
    }

    fn pos(&self) -> usize {
        self.code.len()
    }

    fn finish(self: Box<Self>) -> Result<(Vec<u8>, Vec<Fixup>), CodegenError> {
        Ok((self.code, self.fixups))
    }
}

#[cfg(test)]
mod tests {
    use super::insn::*;

    // Expected bytes from `s390x-linux-gnu-as` (binutils 2.40); the
    // integration test `encoders_s390x.rs` re-checks them with the tools.
    #[test]
    fn encodings_match_gnu_as() {
        let g = |n| Gpr::new(n).unwrap();
        let b = |n| Base::new(n).unwrap();
        let d20 = |d| Disp20::new(d).unwrap();
        let d12 = |d| Disp12::new(d).unwrap();
        assert_eq!(stg(g(2), d20(160), b(15)), [0xe3, 0x20, 0xf0, 0xa0, 0x00, 0x24]);
        assert_eq!(stg(g(14), d20(-8), b(2)), [0xe3, 0xe0, 0x2f, 0xf8, 0xff, 0x24]);
        assert_eq!(lg(g(13), d20(-524288), b(15)), [0xe3, 0xd0, 0xf0, 0x00, 0x80, 0x04]);
        assert_eq!(stg(g(0), d20(524287), b(15)), [0xe3, 0x00, 0xff, 0xff, 0x7f, 0x24]);
        assert_eq!(vst(Vr::new(24).unwrap(), d12(176), b(15)), [0xe7, 0x80, 0xf0, 0xb0, 0x08, 0x0e]);
        assert_eq!(vl(Vr::new(31).unwrap(), d12(4095), b(15)), [0xe7, 0xf0, 0xff, 0xff, 0x08, 0x06]);
        assert_eq!(lay(g(15), d20(-400), b(15)), [0xe3, 0xf0, 0xfe, 0x70, 0xff, 0x71]);
        assert_eq!(la(g(5), d12(4095), b(15)), [0x41, 0x50, 0xff, 0xff]);
        assert_eq!(aghik(g(2), Gpr::R0, Imm16::new(-6).unwrap()), [0xec, 0x20, 0xff, 0xfa, 0x00, 0xd9]);
        assert_eq!(lgr(g(14), g(2)), [0xb9, 0x04, 0x00, 0xe2]);
        assert_eq!(basr(g(14), BranchReg::new(1).unwrap()), [0x0d, 0xe1]);
        assert_eq!(br(BranchReg::new(14).unwrap()), [0x07, 0xfe]);
        assert_eq!(brasl(Gpr::R0, Rel32::from_bytes("t", 0x1000).unwrap()), [0xc0, 0x05, 0x00, 0x00, 0x08, 0x00]);
        assert_eq!(lgrl(g(4), Rel32::ZERO), [0xc4, 0x48, 0, 0, 0, 0]);
        assert_eq!(brcl(0, Rel32::ZERO).unwrap(), [0xc0, 0x04, 0, 0, 0, 0]);
        assert_eq!(ipm(g(1)), [0xb2, 0x22, 0x00, 0x10]);
        assert_eq!(stmg(g(2), g(6), d20(160), b(15)), [0xeb, 0x26, 0xf0, 0xa0, 0x00, 0x24]);
        assert_eq!(lmg(g(2), g(6), d20(160), b(15)), [0xeb, 0x26, 0xf0, 0xa0, 0x00, 0x04]);
        assert_eq!(vstm(Vr::new(24).unwrap(), Vr::new(31).unwrap(), d12(176), b(15)), [0xe7, 0x8f, 0xf0, 0xb0, 0x0c, 0x3e]);
        assert_eq!(vlm(Vr::new(0).unwrap(), Vr::new(7).unwrap(), d12(176), b(15)), [0xe7, 0x07, 0xf0, 0xb0, 0x00, 0x36]);
        assert_eq!(lghi(g(1), Imm16::new(0).unwrap()), [0xa7, 0x19, 0x00, 0x00]);
        assert_eq!(lghi(g(15), Imm16::new(-2).unwrap()), [0xa7, 0xf9, 0xff, 0xfe]);
        assert_eq!(spm(g(1)), [0x04, 0x10]);
        assert_eq!(nopr(), [0x07, 0x00]);
    }

    #[test]
    fn the_specs_nop_forms_are_three_nopr_and_brcl_0() {
        let spec = crate::spec::Spec::builtin("s390x").unwrap();
        assert_eq!(spec.nops[0], [nopr(), nopr(), nopr()].concat());
        assert_eq!(spec.nops[1], brcl(0, Rel32::ZERO).unwrap());
    }

    #[test]
    fn operands_out_of_range_are_errors() {
        assert!(Disp20::new(524288).is_err());
        assert!(Disp20::new(-524289).is_err());
        assert!(Disp12::new(4096).is_err());
        assert!(Disp12::new(-1).is_err());
        assert!(Imm16::new(32768).is_err());
        assert!(Base::new(0).is_err());
        assert!(BranchReg::new(0).is_err());
        assert!(Vr::new(32).is_err());
        assert!(Gpr::new(16).is_err());
        assert!(Rel32::from_bytes("t", 3).is_err());
        assert!(Rel32::from_bytes("t", 1i64 << 32).is_err());
        assert!(Rel32::from_bytes("t", -(1i64 << 32)).is_ok());
        assert!(Rel32::from_bytes("t", -(1i64 << 32) - 2).is_err());
        assert!(brcl(16, Rel32::ZERO).is_err());
    }
}
