//! The per-architecture seam.
//!
//! Each arch folder has the same role-named files:
//!
//! * `mod.rs`   — registration: the [`Arch`] implementation;
//! * `emit.rs`  — the [`Emitter`]: one method per generator primitive, each
//!   encoding instructions (dynasmrt where it has the arch);
//! * `reloc.rs` — how a data-word reference is resolved: in place for JIT
//!   code ([`Arch::apply_fixup`]) and as ELF relocations for objects
//!   ([`Arch::elf_relocs`]);
//! * `site.rs`  — the patch site's enabled form ([`Arch::site_call`]; with
//!   stub entry [`Arch::site_jump`] and the per-site [`Arch::site_stub`]).
//!
//! Everything else — which registers to save, offsets, the order of
//! operations — is computed by shared code (`program.rs`, `frame.rs`) from the
//! spec.  "Compiled out" and "not supported" are different errors: an arch
//! that exists but was left out of the build says so.

use crate::program::{CodegenError, DataWord};
use crate::spec::{Reg, Spec};

pub mod aarch64;
pub mod ppc64le;
pub mod riscv64;
pub mod s390x;
pub mod x86_64;

/// How an instruction refers to a data word; resolved by the arch's
/// `reloc.rs`.  One list for all arches so the object writer and the JIT
/// linker stay generic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FixupKind {
    /// x86_64: a rip-relative disp32 whose instruction ends `end` bytes after
    /// the field's start (`S - (P + end)`).
    X86Pc32 { end: u8 },
    /// aarch64: `adrp` page delta (bits 32..12) of the word's address.
    A64AdrpPage21,
    /// aarch64: low 12 bits of the word's address scaled by 8 into an
    /// `ldr Xt, [Xn, #imm]`.
    A64Ldst64Lo12,
    // riscv64, ppc64le and s390x kinds are added below by their backends
    // (append only; each arch's reloc.rs gives the meaning and the ELF types).
    /// riscv64: `auipc` high part of the PC-relative distance to the word
    /// (`R_RISCV_PCREL_HI20`).
    RvPcrelHi20,
    /// riscv64: the I-type low 12 bits (`R_RISCV_PCREL_LO12_I`) of the
    /// distance from the `auipc` `hi_back` bytes earlier to the word.
    RvPcrelLo12I { hi_back: u8 },
    /// s390x: the big-endian 32-bit halfword offset of an `lgrl` (RIL-b),
    /// `at` = the field (instruction + 2): `(S + 2 - P) >> 1`
    /// (`R_390_PC32DBL`, addend +2).
    S390Pc32Dbl,
    /// ppc64le: `addis` immediate `(word - label)@ha` (`R_PPC64_REL16_HA`),
    /// the label (the address `bcl 20,31,$+4` put in LR) `from_label` bytes
    /// before the instruction.
    Ppc64Rel16Ha { from_label: u8 },
    /// ppc64le: `addi` immediate `(word - label)@l` (`R_PPC64_REL16_LO`).
    Ppc64Rel16Lo { from_label: u8 },
}

/// A reference from code to a data word, recorded while emitting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fixup {
    /// Byte offset of the instruction or field, from the start of the code
    /// being emitted (trampoline start while emitting, image start after).
    pub at: usize,
    pub kind: FixupKind,
    pub word: DataWord,
}

/// Where an ELF relocation points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelocTarget {
    /// A data word (in `.data`).
    Data(DataWord),
    /// A position in `.text` (for relocations that refer to another
    /// instruction, as RISC-V `%pcrel_lo` does).
    Code(usize),
}

/// One ELF relocation derived from a [`Fixup`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ElfReloc {
    pub offset: usize,
    pub r_type: object::elf::RelocationType,
    pub target: RelocTarget,
    pub addend: i64,
}

/// The generator primitives; each arch's `emit.rs` implements them.
pub trait Emitter {
    /// `sp += delta`.
    fn adjust_sp(&mut self, delta: i32) -> Result<(), CodegenError>;
    /// `[base + off] = reg`.
    fn store(&mut self, reg: Reg, base: Reg, off: i32) -> Result<(), CodegenError>;
    /// `reg = [base + off]`.
    fn load(&mut self, reg: Reg, base: Reg, off: i32) -> Result<(), CodegenError>;
    /// `dst = src + imm`.
    fn add_imm(&mut self, dst: Reg, src: Reg, imm: i32) -> Result<(), CodegenError>;
    /// `dst = *word`, recording a fixup.
    fn load_data(&mut self, dst: Reg, word: DataWord) -> Result<(), CodegenError>;
    /// Call `*word`; may clobber `scratch`.
    fn call_data(&mut self, word: DataWord, scratch: Reg) -> Result<(), CodegenError>;
    fn call_reg(&mut self, target: Reg) -> Result<(), CodegenError>;
    fn jump_reg(&mut self, target: Reg) -> Result<(), CodegenError>;
    /// Return through the stack (only arches whose `call` pushes).
    fn ret(&mut self) -> Result<(), CodegenError>;
    fn save_flags(&mut self, off: i32, scratch: Reg) -> Result<(), CodegenError>;
    fn restore_flags(&mut self, off: i32, scratch: Reg) -> Result<(), CodegenError>;
    /// `[base + off] = a ; [base + off + size] = b`; arches with a pair
    /// instruction override this (and set `trampoline.pairs` in their spec).
    fn store_pair(&mut self, a: Reg, b: Reg, base: Reg, off: i32, size: i32) -> Result<(), CodegenError> {
        self.store(a, base, off)?;
        self.store(b, base, off + size)
    }
    /// `a = [base + off] ; b = [base + off + size]`.
    fn load_pair(&mut self, a: Reg, b: Reg, base: Reg, off: i32, size: i32) -> Result<(), CodegenError> {
        self.load(a, base, off)?;
        self.load(b, base, off + size)
    }
    /// `[base + off + i*size] = reg(first.enc + i)` for `i < count`; arches
    /// with a store-multiple instruction override this (and set
    /// `trampoline.multiple` in their spec).
    fn store_multiple(&mut self, first: Reg, count: u8, base: Reg, off: i32, size: i32) -> Result<(), CodegenError> {
        for i in 0..count {
            self.store(Reg { class: first.class, enc: first.enc + i }, base, off + i as i32 * size)?;
        }
        Ok(())
    }
    /// `reg(first.enc + i) = [base + off + i*size]` for `i < count`.
    fn load_multiple(&mut self, first: Reg, count: u8, base: Reg, off: i32, size: i32) -> Result<(), CodegenError> {
        for i in 0..count {
            self.load(Reg { class: first.class, enc: first.enc + i }, base, off + i as i32 * size)?;
        }
        Ok(())
    }
    /// Saves sp (through `scratch`) and aligns it down to `align` bytes,
    /// for a call that needs an ABI-aligned stack; [`Emitter::restore_sp`]
    /// undoes it after the call.  Only arches whose spec sets
    /// `trampoline.realign_sp` implement it.
    fn align_sp(&mut self, _scratch: Reg, _align: u32) -> Result<(), CodegenError> {
        Err(CodegenError::Unsupported { arch: "generic", what: "trampoline.realign_sp (stack realignment)".into() })
    }
    /// sp as it was before [`Emitter::align_sp`].
    fn restore_sp(&mut self) -> Result<(), CodegenError> {
        Err(CodegenError::Unsupported { arch: "generic", what: "trampoline.realign_sp (stack realignment)".into() })
    }
    /// Stub entry ([`crate::program::Step::GraphCallCheck`]): only arches
    /// whose spec sets `site.stub`.
    fn graph_call_check(&mut self, _scratch: Reg, _ip: i32, _parent: i32) -> Result<(), CodegenError> {
        Err(CodegenError::Unsupported { arch: "generic", what: "site.stub (stub entry)".into() })
    }
    /// Stub entry: pop the resume address into `scratch` and jump to it.
    fn pop_jump(&mut self, _scratch: Reg) -> Result<(), CodegenError> {
        Err(CodegenError::Unsupported { arch: "generic", what: "site.stub (stub entry)".into() })
    }
    /// Stub entry: `ftrace_call_through` (pop the resume address, call it).
    fn call_through(&mut self, _scratch: Reg) -> Result<(), CodegenError> {
        Err(CodegenError::Unsupported { arch: "generic", what: "site.stub (stub entry)".into() })
    }
    /// Stub entry: return to the address in `target` through the return
    /// predictor ([`crate::program::Step::ReturnReg`]).
    fn return_reg(&mut self, _target: Reg) -> Result<(), CodegenError> {
        Err(CodegenError::Unsupported { arch: "generic", what: "site.stub (stub entry)".into() })
    }
    /// `[base + off] = ` the upper bits of vector register `reg`
    /// ([`crate::program::Step::StoreUpper`]): only arches whose spec sets
    /// `registers.vector_upper_bytes`.
    fn store_upper(&mut self, _reg: Reg, _base: Reg, _off: i32) -> Result<(), CodegenError> {
        Err(CodegenError::Unsupported { arch: "generic", what: "registers.vector_upper_bytes (vector upper bits)".into() })
    }
    /// [`crate::program::Step::RestoreUppers`].
    fn restore_uppers(&mut self, _regs: &[(Reg, i32)], _base: Reg, _scratch: Reg, _tops: &[i32]) -> Result<(), CodegenError> {
        Err(CodegenError::Unsupported { arch: "generic", what: "registers.vector_upper_bytes (vector upper bits)".into() })
    }
    /// [`crate::program::Step::StoreTops`]: only arches whose spec sets
    /// `registers.vector_wider_bytes`.
    fn store_tops(&mut self, _regs: &[(Reg, i32)], _uppers: &[i32], _base: Reg, _scratch: Reg) -> Result<(), CodegenError> {
        Err(CodegenError::Unsupported { arch: "generic", what: "registers.vector_wider_bytes (vector top bits)".into() })
    }
    /// [`crate::program::Step::PopFpStack`]: only arches whose spec sets
    /// `abi.fp_stack_ret`.
    fn pop_fp_stack(&mut self, _max: u8, _base: Reg, _off: i32, _scratch: Reg) -> Result<(), CodegenError> {
        Err(CodegenError::Unsupported { arch: "generic", what: "abi.fp_stack_ret (an FP register stack)".into() })
    }
    /// [`crate::program::Step::PushFpStack`].
    fn push_fp_stack(&mut self, _max: u8, _base: Reg, _off: i32) -> Result<(), CodegenError> {
        Err(CodegenError::Unsupported { arch: "generic", what: "abi.fp_stack_ret (an FP register stack)".into() })
    }
    /// Bytes emitted so far.
    fn pos(&self) -> usize;
    /// The code and its data-word references.
    fn finish(self: Box<Self>) -> Result<(Vec<u8>, Vec<Fixup>), CodegenError>;
}

/// One architecture backend.
pub trait Arch: Sync {
    fn name(&self) -> &'static str;
    /// A fresh emitter for one trampoline.
    fn emitter(&self, spec: &Spec) -> Box<dyn Emitter>;
    /// Bytes that fill the gaps between trampolines (a trap).
    fn padding(&self) -> &'static [u8];
    /// Resolves a fixup in place: `code` is the whole image's code, placed
    /// at `code_addr`; the word is at `word_addr`.
    fn apply_fixup(&self, code: &mut [u8], f: &Fixup, code_addr: u64, word_addr: u64) -> Result<(), CodegenError>;
    /// The ELF relocations an object needs for a fixup.
    fn elf_relocs(&self, f: &Fixup) -> Vec<ElfReloc>;
    /// The ELF relocation type for an absolute 64-bit data word.
    fn elf_abs64(&self) -> object::elf::RelocationType;
    /// The enabled form of a patch site at `site` calling `target`.
    fn site_call(&self, site: u64, target: u64) -> Result<Vec<u8>, CodegenError>;
    /// Stub entry (spec `site.stub`): the site at `site` jumping to its stub
    /// at `stub`.
    fn site_jump(&self, _site: u64, _stub: u64) -> Result<Vec<u8>, CodegenError> {
        Err(CodegenError::Unsupported { arch: self.name(), what: "site.stub (stub entry)".into() })
    }
    /// Stub entry: the stub placed at `at` for the site at `site`, entering
    /// the trampoline `target` with the address after the site pushed.
    /// At most [`STUB_LEN`] bytes.
    fn site_stub(&self, _at: u64, _site: u64, _target: u64) -> Result<Vec<u8>, CodegenError> {
        Err(CodegenError::Unsupported { arch: self.name(), what: "site.stub (stub entry)".into() })
    }
}

/// Bytes reserved per site stub ([`Arch::site_stub`]).
pub const STUB_LEN: usize = 16;

/// Every arch this build knows, compiled in or not.
pub const KNOWN: &[&str] = &["x86_64", "aarch64", "riscv64", "ppc64le", "s390x"];

static ARCHES: &[&dyn Arch] = &[&x86_64::X86_64, &aarch64::Aarch64, &riscv64::Riscv64, &s390x::S390x, &ppc64le::Ppc64le];

/// The backends in this build.
pub fn all() -> impl Iterator<Item = &'static dyn Arch> {
    ARCHES.iter().copied()
}

/// Looks a backend up by name.
pub fn lookup(name: &str) -> Result<&'static dyn Arch, CodegenError> {
    if let Some(a) = ARCHES.iter().find(|a| a.name() == name) {
        return Ok(*a);
    }
    let have = ARCHES.iter().map(|a| a.name()).collect::<Vec<_>>().join(", ");
    if KNOWN.contains(&name) {
        return Err(CodegenError::Unsupported {
            arch: "codegen",
            what: format!("architecture `{name}` has no backend in this build yet (available: {have})"),
        });
    }
    Err(CodegenError::UnknownArch(name.to_string(), have))
}

/// Checks a signed value against a bit width, for typed immediates.
pub fn check_signed(arch: &'static str, what: &'static str, value: i64, bits: u32, range: &'static str) -> Result<i64, CodegenError> {
    let min = -(1i64 << (bits - 1));
    let max = (1i64 << (bits - 1)) - 1;
    if value < min || value > max {
        return Err(CodegenError::OutOfRange { arch, what, value, range });
    }
    Ok(value)
}
