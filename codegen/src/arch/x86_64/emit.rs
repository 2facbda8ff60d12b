//! x86_64 instruction selection for the generator primitives (dynasmrt).
//!
//! Stack adjustments use `lea` so they never change the flags the `regs`
//! tier restores.  Data words are reached rip-relative; the disp32 is left
//! zero and recorded as a [`Fixup`].

use super::ARCH;
use crate::arch::{check_signed, Emitter, Fixup, FixupKind};
use crate::program::{CodegenError, DataWord};
use crate::spec::{Reg, RegClass};
use dynasmrt::x64::X64Relocation;
use dynasmrt::{dynasm, DynasmApi, DynasmLabelApi, VecAssembler};

pub struct X64Emitter {
    ops: VecAssembler<X64Relocation>,
    fixups: Vec<Fixup>,
}

impl X64Emitter {
    pub fn new() -> Self {
        X64Emitter { ops: VecAssembler::new(0), fixups: Vec::new() }
    }

    fn disp(off: i32) -> Result<i32, CodegenError> {
        check_signed(ARCH, "memory displacement", off as i64, 32, "disp32").map(|v| v as i32)
    }

    /// An EVEX.512.66.0F3A instruction with a memory operand `[base +
    /// disp32]`, register `reg` in ModRM.reg, `vvvv` (or none), and the
    /// immediate 1 (the upper lane or half): the AVX-512 inserts and
    /// extracts of the upper bits, which dynasm-rs does not know.  Always a 32-bit
    /// displacement (EVEX scales 8-bit ones by the operand size).  The
    /// objdump oracle checks the bytes.
    fn evex512_0f3a(&mut self, opcode: u8, w1: bool, reg: u8, vvvv: Option<u8>, base: u8, disp: i32) {
        debug_assert!(reg < 16 && base < 16 && vvvv.unwrap_or(0) < 16);
        let inv = |bit: u8| (!bit) & 1;
        // P0: R X B R' 0 0 m m (R, X, B, R' inverted; map 0F3A = 3).
        let p0 = (inv(reg >> 3) << 7) | (1 << 6) | (inv(base >> 3) << 5) | (1 << 4) | 0b11;
        // P1: W vvvv 1 pp (vvvv inverted, 1111 when unused; pp = 66).
        let p1 = (u8::from(w1) << 7) | (((!vvvv.unwrap_or(0)) & 0xf) << 3) | (1 << 2) | 0b01;
        // P2: z L'L b V' aaa (512 bits; V' inverted; no mask).
        let p2 = (0b10 << 5) | (1 << 3);
        let modrm = (0b10 << 6) | ((reg & 7) << 3) | (base & 7);
        let mut bytes = vec![0x62, p0, p1, p2, opcode, modrm];
        if base & 7 == 4 {
            bytes.push(0x24); // SIB: base only
        }
        bytes.extend_from_slice(&disp.to_le_bytes());
        bytes.push(1);
        self.ops.extend(bytes);
    }

    /// `vinsertf32x4 zmmN, zmmN, [base + disp], 1` (W0 18 /r ib): bits
    /// 128-255 of `zmmN` from memory, the rest kept.
    fn vinsertf32x4_lane1(&mut self, n: u8, base: u8, disp: i32) {
        self.evex512_0f3a(0x18, false, n, Some(n), base, disp);
    }

    /// `vinsertf64x4 zmmN, zmmN, [base + disp], 1` (W1 1A /r ib): bits
    /// 256-511 of `zmmN` from memory, the rest kept.
    fn vinsertf64x4_hi(&mut self, n: u8, base: u8, disp: i32) {
        self.evex512_0f3a(0x1a, true, n, Some(n), base, disp);
    }

    /// `vextractf64x4 [base + disp], zmmN, 1` (W1 1B /r ib): bits 256-511 of
    /// `zmmN` to memory.
    fn vextractf64x4_hi(&mut self, n: u8, base: u8, disp: i32) {
        self.evex512_0f3a(0x1b, true, n, None, base, disp);
    }

    /// `scratch = OR of the 16-byte words at [base + offs]`, in VEX.128
    /// form (which writes no wider register), then `vptest`: ZF set when
    /// they are all zero.
    fn or_test(&mut self, offs: &[i32], base: u8, x: u8) -> Result<(), CodegenError> {
        let d0 = Self::disp(offs[0])?;
        dynasm!(self.ops ; .arch x64 ; vmovdqu Rx(x), OWORD [Rq(base) + d0]);
        for &off in &offs[1..] {
            let d = Self::disp(off)?;
            dynasm!(self.ops ; .arch x64 ; vpor Rx(x), Rx(x), OWORD [Rq(base) + d]);
        }
        dynasm!(self.ops ; .arch x64 ; vptest Rx(x), Rx(x));
        Ok(())
    }

    /// Records that the instruction just emitted ends with a disp32 that
    /// must point at `word`.
    fn fixup_last(&mut self, word: DataWord) {
        let end = self.ops.offset().0;
        self.fixups.push(Fixup { at: end - 4, kind: FixupKind::X86Pc32 { end: 4 }, word });
    }
}

fn unsupported(what: String) -> CodegenError {
    CodegenError::Unsupported { arch: ARCH, what }
}

impl Emitter for X64Emitter {
    fn adjust_sp(&mut self, delta: i32) -> Result<(), CodegenError> {
        let d = Self::disp(delta)?;
        dynasm!(self.ops ; .arch x64 ; lea rsp, [rsp + d]);
        Ok(())
    }

    fn store(&mut self, reg: Reg, base: Reg, off: i32) -> Result<(), CodegenError> {
        let d = Self::disp(off)?;
        let b = base.enc;
        match reg.class {
            RegClass::Gpr => dynasm!(self.ops ; .arch x64 ; mov QWORD [Rq(b) + d], Rq(reg.enc)),
            // Slots are 16-byte aligned (frame.rs) but the unaligned form
            // costs nothing extra on current cores and cannot fault.
            RegClass::Vector => dynasm!(self.ops ; .arch x64 ; movdqu OWORD [Rq(b) + d], Rx(reg.enc)),
            RegClass::Special => return Err(unsupported(format!("store of special register {}", reg.enc))),
        }
        Ok(())
    }

    fn load(&mut self, reg: Reg, base: Reg, off: i32) -> Result<(), CodegenError> {
        let d = Self::disp(off)?;
        let b = base.enc;
        match reg.class {
            RegClass::Gpr => dynasm!(self.ops ; .arch x64 ; mov Rq(reg.enc), QWORD [Rq(b) + d]),
            RegClass::Vector => dynasm!(self.ops ; .arch x64 ; movdqu Rx(reg.enc), OWORD [Rq(b) + d]),
            RegClass::Special => return Err(unsupported(format!("load of special register {}", reg.enc))),
        }
        Ok(())
    }

    fn add_imm(&mut self, dst: Reg, src: Reg, imm: i32) -> Result<(), CodegenError> {
        let d = Self::disp(imm)?;
        if imm == 0 {
            dynasm!(self.ops ; .arch x64 ; mov Rq(dst.enc), Rq(src.enc));
        } else {
            dynasm!(self.ops ; .arch x64 ; lea Rq(dst.enc), [Rq(src.enc) + d]);
        }
        Ok(())
    }

    fn load_data(&mut self, dst: Reg, word: DataWord) -> Result<(), CodegenError> {
        dynasm!(self.ops ; .arch x64 ; mov Rq(dst.enc), QWORD [rip + 0x7fff_ffff]);
        self.fixup_last(word);
        Ok(())
    }

    fn call_data(&mut self, word: DataWord, _scratch: Reg) -> Result<(), CodegenError> {
        dynasm!(self.ops ; .arch x64 ; call QWORD [rip + 0x7fff_ffff]);
        self.fixup_last(word);
        Ok(())
    }

    fn call_reg(&mut self, target: Reg) -> Result<(), CodegenError> {
        dynasm!(self.ops ; .arch x64 ; call Rq(target.enc));
        Ok(())
    }

    fn jump_reg(&mut self, target: Reg) -> Result<(), CodegenError> {
        dynasm!(self.ops ; .arch x64 ; jmp Rq(target.enc));
        Ok(())
    }

    fn align_sp(&mut self, scratch: Reg, align: u32) -> Result<(), CodegenError> {
        // The old sp twice: sp stays aligned, and `pop rsp` (which loads
        // rsp from [rsp]) restores it in one instruction.
        let t = scratch.enc;
        dynasm!(self.ops ; .arch x64 ; mov Rq(t), rsp);
        match i8::try_from(-(align as i32)) {
            Ok(mask) => dynasm!(self.ops ; .arch x64 ; and rsp, BYTE mask),
            Err(_) => dynasm!(self.ops ; .arch x64 ; and rsp, -(align as i32)),
        }
        dynasm!(self.ops ; .arch x64 ; push Rq(t) ; push Rq(t));
        Ok(())
    }

    fn restore_sp(&mut self) -> Result<(), CodegenError> {
        dynasm!(self.ops ; .arch x64 ; pop rsp);
        Ok(())
    }

    fn ret(&mut self) -> Result<(), CodegenError> {
        dynasm!(self.ops ; .arch x64 ; ret);
        Ok(())
    }

    fn graph_call_check(&mut self, scratch: Reg, ip: i32, parent: i32) -> Result<(), CodegenError> {
        let (ip, parent) = (Self::disp(ip)?, Self::disp(parent)?);
        let t = scratch.enc;
        dynasm!(self.ops ; .arch x64 ; mov Rq(t), QWORD [rsp + parent] ; cmp Rq(t), QWORD [rip + 0x7fff_ffff]);
        self.fixup_last(DataWord::GraphReturn);
        dynasm!(self.ops ; .arch x64
            ; jne BYTE >plain
            ; mov Rq(t), QWORD [rsp + ip]
            ; mov QWORD [rsp + parent], Rq(t)
            ; mov Rq(t), QWORD [rip + 0x7fff_ffff]
        );
        self.fixup_last(DataWord::GraphCall);
        dynasm!(self.ops ; .arch x64 ; mov QWORD [rsp + ip], Rq(t) ; plain:);
        Ok(())
    }

    fn pop_jump(&mut self, scratch: Reg) -> Result<(), CodegenError> {
        dynasm!(self.ops ; .arch x64 ; pop Rq(scratch.enc) ; jmp Rq(scratch.enc));
        Ok(())
    }

    fn call_through(&mut self, scratch: Reg) -> Result<(), CodegenError> {
        dynasm!(self.ops ; .arch x64 ; pop Rq(scratch.enc) ; call Rq(scratch.enc));
        Ok(())
    }

    fn return_reg(&mut self, target: Reg) -> Result<(), CodegenError> {
        dynasm!(self.ops ; .arch x64 ; push Rq(target.enc) ; ret);
        Ok(())
    }

    fn save_flags(&mut self, off: i32, _scratch: Reg) -> Result<(), CodegenError> {
        // `pop m64` with an rsp base computes the address after the pop's
        // increment, so `off` names the same slot as everywhere else.
        let d = Self::disp(off)?;
        dynasm!(self.ops ; .arch x64 ; pushfq ; pop QWORD [rsp + d]);
        Ok(())
    }

    fn restore_flags(&mut self, off: i32, _scratch: Reg) -> Result<(), CodegenError> {
        // The arithmetic flags only, without `popfq` (microcoded, ~20
        // cycles).  OF first: the saved flags' second byte is
        // `TF IF DF OF IOPL NT 0` from bit 0, which in user mode (IF=1,
        // IOPL=NT=0) is 0x02..0x07 without OF and 0x0a..0x0f with it;
        // `cmp byte, 0x8a` (b - (-118)) overflows exactly for the latter.
        // Then SF ZF AF PF CF from the first byte with `sahf`, which leaves
        // OF alone.  DF is clear at every call and return by the ABI; the
        // system flags cannot change in user mode.  Clobbers ah: the regs
        // tier reloads rax from its slot right after.
        let d = Self::disp(off)?;
        let d1 = Self::disp(off + 1)?;
        dynasm!(self.ops ; .arch x64
            ; cmp BYTE [rsp + d1], -118
            ; mov ah, BYTE [rsp + d]
            ; sahf
        );
        Ok(())
    }

    fn store_upper(&mut self, reg: Reg, base: Reg, off: i32) -> Result<(), CodegenError> {
        let d = Self::disp(off)?;
        if reg.class != RegClass::Vector {
            return Err(unsupported(format!("upper bits of non-vector register {}", reg.enc)));
        }
        // Reads ymm, writes memory: no register write, so the CPU's upper
        // state stays as it is.
        dynasm!(self.ops ; .arch x64 ; vextractf128 OWORD [Rq(base.enc) + d], Ry(reg.enc), 1);
        Ok(())
    }

    fn restore_uppers(&mut self, regs: &[(Reg, i32)], base: Reg, scratch: Reg, tops: &[i32]) -> Result<(), CodegenError> {
        if regs.is_empty() {
            return Ok(());
        }
        let (b, x) = (base.enc, scratch.enc);
        if scratch.class != RegClass::Vector || regs.iter().any(|(r, _)| r.class != RegClass::Vector) {
            return Err(unsupported("upper bits of a non-vector register".into()));
        }
        if !tops.is_empty() && tops.len() != regs.len() {
            return Err(unsupported("top bits for some of the registers only".into()));
        }
        // The OR of the saved halves; only if it is non-zero, inserts put
        // the halves back: 256-bit VEX ones, or (with the top bits) EVEX
        // ones that keep the rest of `zmm`, the top bits first.
        let offs: Vec<i32> = regs.iter().map(|r| r.1).collect();
        self.or_test(&offs, b, x)?;
        dynasm!(self.ops ; .arch x64 ; jz >zero);
        for (i, &(reg, off)) in regs.iter().enumerate() {
            let d = Self::disp(off)?;
            if let Some(&top) = tops.get(i) {
                self.vinsertf64x4_hi(reg.enc, b, Self::disp(top)?);
                self.vinsertf32x4_lane1(reg.enc, b, d);
            } else {
                dynasm!(self.ops ; .arch x64 ; vinsertf128 Ry(reg.enc), Ry(reg.enc), OWORD [Rq(b) + d], 1);
            }
        }
        dynasm!(self.ops ; .arch x64 ; zero:);
        Ok(())
    }

    fn store_tops(&mut self, regs: &[(Reg, i32)], uppers: &[i32], base: Reg, scratch: Reg) -> Result<(), CodegenError> {
        if regs.is_empty() || uppers.is_empty() {
            return Ok(());
        }
        let (b, x) = (base.enc, scratch.enc);
        if scratch.class != RegClass::Vector || regs.iter().any(|(r, _)| r.class != RegClass::Vector) {
            return Err(unsupported("top bits of a non-vector register".into()));
        }
        // Reads zmm, writes memory: a 512-bit instruction, run only when a
        // saved upper half is non-zero (the program has wide values live).
        self.or_test(uppers, b, x)?;
        dynasm!(self.ops ; .arch x64 ; jz >zero);
        for &(reg, off) in regs {
            self.vextractf64x4_hi(reg.enc, b, Self::disp(off)?);
        }
        dynasm!(self.ops ; .arch x64 ; zero:);
        Ok(())
    }

    fn pop_fp_stack(&mut self, max: u8, base: Reg, off: i32, scratch: Reg) -> Result<(), CodegenError> {
        if scratch.class != RegClass::Gpr {
            return Err(unsupported("x87 status test through a non-GPR scratch".into()));
        }
        let (b, t) = (base.enc, scratch.enc);
        // The area: the count at +0, the status word at the save at +2
        // (its TOP tells the restore whether anything was popped), a
        // scratch status word at +4.
        let (count, first, first_hi) = (Self::disp(off)?, Self::disp(off + 2)?, Self::disp(off + 3)?);
        let (status, status_hi) = (Self::disp(off + 4)?, Self::disp(off + 5)?);
        // First the stack's TOP (status word bits 11-13, bits 3-5 of its
        // high byte): 0 at every call and return without an x87 value (the
        // process starts with 0 and compiled code pushes and pops in
        // pairs), so the common case stops there.  Otherwise `fxam`
        // classifies st(0): C3 C2 C0 (bits 14, 10, 8) are 1 0 1 for an
        // empty register.  (`fxam` of an *empty* register is a microcode
        // assist, 125 ns on the Xeon we measured, hence the TOP test
        // first.)  `fstp m80` pops without any conversion: every bit
        // pattern, signalling NaNs included, comes back as it was, and no
        // exception flag is raised.
        dynasm!(self.ops ; .arch x64
            ; fnstsw WORD [Rq(b) + first]
            ; test BYTE [Rq(b) + first_hi], 0x38
            ; jz >empty
            ; mov BYTE [Rq(b) + count], 0
        );
        for i in 0..max {
            let slot = Self::disp(off + 16 * (1 + i as i32))?;
            if i > 0 {
                dynasm!(self.ops ; .arch x64
                    ; fnstsw WORD [Rq(b) + status]
                    ; test BYTE [Rq(b) + status_hi], 0x38
                    ; jz >empty
                );
            }
            dynasm!(self.ops ; .arch x64
                ; fxam
                ; fnstsw WORD [Rq(b) + status]
                ; movzx Rd(t), WORD [Rq(b) + status]
                ; and Rd(t), 0x4500
                ; cmp Rd(t), 0x4100
                ; je >empty
                ; fstp TWORD [Rq(b) + slot]
                ; mov BYTE [Rq(b) + count], (i + 1) as i8
            );
        }
        dynasm!(self.ops ; .arch x64 ; empty:);
        Ok(())
    }

    fn push_fp_stack(&mut self, max: u8, base: Reg, off: i32) -> Result<(), CodegenError> {
        if max == 0 {
            return Ok(());
        }
        let b = base.enc;
        let (count, first_hi) = (Self::disp(off)?, Self::disp(off + 3)?);
        // Nothing was popped when TOP was 0 at the save (the count is not
        // even written then) or when the count is 0.  The last popped goes
        // back first.
        dynasm!(self.ops ; .arch x64
            ; test BYTE [Rq(b) + first_hi], 0x38
            ; jz >none
            ; cmp BYTE [Rq(b) + count], 0
            ; je >none
        );
        for i in (1..max).rev() {
            let slot = Self::disp(off + 16 * (1 + i as i32))?;
            dynasm!(self.ops ; .arch x64
                ; cmp BYTE [Rq(b) + count], (i + 1) as i8
                ; jb >fewer
                ; fld TWORD [Rq(b) + slot]
                ; fewer:
            );
        }
        let first = Self::disp(off + 16)?;
        dynasm!(self.ops ; .arch x64 ; fld TWORD [Rq(b) + first] ; none:);
        Ok(())
    }

    fn pos(&self) -> usize {
        self.ops.offset().0
    }

    fn finish(self: Box<Self>) -> Result<(Vec<u8>, Vec<Fixup>), CodegenError> {
        let mut code = self.ops.finalize().map_err(|e| CodegenError::Assembler { arch: ARCH, what: e.to_string() })?;
        // Leave relocated fields zero, as an assembler would for RELA.
        for f in &self.fixups {
            code[f.at..f.at + 4].fill(0);
        }
        Ok((code, self.fixups))
    }
}
