//! Architecture specs: the declarative half of the generator.
//!
//! One TOML file per architecture in `arch-specs/` says which registers exist,
//! how the calling convention uses them, what a patch site looks like and
//! which slots `struct ftrace_regs` / `struct pt_regs` have.  This module
//! parses such a file ([`RawSpec`], plain serde data) and checks it into a
//! [`Spec`] whose register names are resolved to [`Reg`]s.  Everything the
//! shared generator needs to know about an architecture comes from here; the
//! per-arch backends only know how to encode instructions.
//!
//! A spec that does not parse or does not hold together is rejected with a
//! [`SpecError`] naming the file, the field and the problem.  That includes
//! edits the generator would turn into broken code without noticing: the
//! encoders take register *numbers*, so `arch.name` (which picks the encoder)
//! must go with the register set of the built-in spec of that name; a
//! register the trampolines use as a temporary or jump through must not
//! hold anything at entry or return; the stack pointer is never a slot.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;

/// The built-in specs, embedded at compile time so the tools work from any
/// directory.  `(arch name, file name, text)`.
pub const BUILTIN: &[(&str, &str, &str)] = &[
    ("x86_64", "arch-specs/x86_64.toml", include_str!("../../arch-specs/x86_64.toml")),
    ("aarch64", "arch-specs/aarch64.toml", include_str!("../../arch-specs/aarch64.toml")),
    ("riscv64", "arch-specs/riscv64.toml", include_str!("../../arch-specs/riscv64.toml")),
    ("s390x", "arch-specs/s390x.toml", include_str!("../../arch-specs/s390x.toml")),
    ("ppc64le", "arch-specs/ppc64le.toml", include_str!("../../arch-specs/ppc64le.toml")),
];

/// The spec name for a Cargo `CARGO_CFG_TARGET_ARCH` value, for build
/// scripts that compile C with a target's patch-site flags.
pub fn for_target_arch(target_arch: &str) -> Option<&'static str> {
    Some(match target_arch {
        "x86_64" => "x86_64",
        "aarch64" => "aarch64",
        "riscv64" => "riscv64",
        "powerpc64" => "ppc64le",
        "s390x" => "s390x",
        _ => return None,
    })
}

/// A spec file that could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}{}: {field}: {problem}", .line.map(|(l, c)| format!(":{l}:{c}")).unwrap_or_default())]
pub struct SpecError {
    /// The file the spec came from.
    pub file: String,
    /// Line and column (1-based), when the parser knows them.
    pub line: Option<(usize, usize)>,
    /// The dotted field path, e.g. `abi.int_args`.
    pub field: String,
    /// What is wrong.
    pub problem: String,
}

/// Register classes the generator distinguishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RegClass {
    /// General-purpose (integer/pointer) register.
    Gpr,
    /// FP/SIMD register, saved at the spec's `vector_bytes` width.
    Vector,
    /// Anything else the arch needs by name (aarch64 `sp`, ppc64 `lr`).
    Special,
}

/// A resolved register: class plus hardware encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Reg {
    pub class: RegClass,
    pub enc: u8,
}

impl Reg {
    pub const fn gpr(enc: u8) -> Reg {
        Reg { class: RegClass::Gpr, enc }
    }
    pub const fn vector(enc: u8) -> Reg {
        Reg { class: RegClass::Vector, enc }
    }
    pub const fn special(enc: u8) -> Reg {
        Reg { class: RegClass::Special, enc }
    }
}

/// Byte order of the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Endian {
    Little,
    Big,
}

// ---------------------------------------------------------------------------
// The file as written.

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSpec {
    pub arch: RawArch,
    pub registers: RawRegisters,
    pub abi: RawAbi,
    pub site: RawSite,
    pub trampoline: RawTrampoline,
    pub ftrace_regs: RawSlots,
    pub pt_regs: RawSlots,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawArch {
    pub name: String,
    pub endian: Endian,
    pub elf_machine: u16,
    #[serde(default)]
    pub elf_flags: u32,
    pub capstone: String,
    /// GNU triple of the cross tools (`<triple>-gcc`, `<triple>-objdump`).
    pub gnu_triple: String,
    /// qemu-user binary suffix (`qemu-<name>`); empty for the host arch.
    #[serde(default)]
    pub qemu: String,
    /// Rust target triple.
    pub rust_target: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRegisters {
    pub gpr: Vec<String>,
    #[serde(default)]
    pub special: BTreeMap<String, u8>,
    pub vector: Vec<String>,
    pub vector_bytes: u32,
    /// Bits above `vector_bytes` that the same registers have on some CPUs
    /// (x86_64 AVX: the upper 16 bytes of `ymm`), which code a callback runs
    /// may clobber; trampolines generated with
    /// [`crate::program::GenOptions::vector_upper`] keep them.  0: none.
    #[serde(default)]
    pub vector_upper_bytes: u32,
    /// Bytes above those in the widest form of the same registers (x86_64
    /// AVX-512: the upper 32 bytes of `zmm`), kept by trampolines generated
    /// with [`crate::program::GenOptions::vector_wider`].  0: none.
    #[serde(default)]
    pub vector_wider_bytes: u32,
    #[serde(default)]
    pub flags: Option<String>,
    /// A general-purpose register hardwired to zero (riscv64 `zero`): it
    /// holds no state, so it is never saved and cannot be a slot.
    #[serde(default)]
    pub zero: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAbi {
    pub int_args: Vec<String>,
    pub fp_args: Vec<String>,
    pub int_ret: Vec<String>,
    pub fp_ret: Vec<String>,
    /// Return registers that are the top of a register *stack* (x87:
    /// `st(0)`, `st(1)`); `return_to_handler` pops them before its call.
    /// 0: none.
    #[serde(default)]
    pub fp_stack_ret: u32,
    #[serde(default)]
    pub entry_live: Vec<String>,
    pub callee_saved: Vec<String>,
    /// Argument registers that the ABI also makes callee-saved (s390x
    /// `r6`): the traced function restores the value it got, so a callback
    /// that sets such an argument changes the caller's register after the
    /// call too.  Documentation only (the header's `set_argument` comment);
    /// the trampolines treat them as arguments.  Default: none.
    #[serde(default)]
    pub callee_saved_args: Vec<String>,
    pub stack_pointer: String,
    pub frame_pointer: String,
    #[serde(default)]
    pub link_register: Option<String>,
    #[serde(default)]
    pub toc_register: Option<String>,
    pub stack_alignment: u32,
    pub red_zone: u32,
    #[serde(default)]
    pub call_reserve: u32,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSite {
    pub nops: Vec<String>,
    pub enabled: String,
    pub reach: u64,
    pub site_return: String,
    pub parent: String,
    pub ip_offset: i32,
    #[serde(default)]
    pub clobbers: Vec<String>,
    #[serde(default)]
    pub resume_via: Option<String>,
    /// Registers that receive the return address when resuming the traced
    /// function (default: the ABI link register).
    #[serde(default)]
    pub resume_return_address: Option<Vec<String>>,
    pub callsite_ops_offset: i32,
    pub callsite_flags: String,
    pub flags: String,
    /// The runtime's JIT sites jump (no return-stack entry) to a per-site
    /// stub that pushes the address after the site and jumps to the entry
    /// trampoline, which resumes with a jump and enters a hijacked function
    /// through a `call` placed just before `return_to_handler`
    /// ([`crate::program::SiteEntry::Stub`]).  Only with
    /// `site_return = "stack"`; default off.
    #[serde(default)]
    pub stub: bool,
    /// Bits of a function symbol's `st_other` that make its sites refused
    /// (aarch64: `STO_AARCH64_VARIANT_PCS`, a calling convention the
    /// trampolines do not keep).  Default 0: none.
    #[serde(default)]
    pub refuse_st_other: u8,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTrampoline {
    pub scratch: Vec<String>,
    pub return_via: String,
    /// Merge neighbouring saves/restores into pair instructions
    /// (`Emitter::store_pair` / `load_pair`).
    #[serde(default)]
    pub pairs: bool,
    /// Merge runs of saves/restores of registers with consecutive
    /// encodings to consecutive slots into one store/load-multiple
    /// instruction (`Emitter::store_multiple` / `load_multiple`; s390x
    /// `stmg`/`lmg`, `vstm`/`vlm`).
    #[serde(default)]
    pub multiple: bool,
    /// The stack pointer at a traced function's entry may break the ABI's
    /// alignment (gcc's default `-fipa-stack-alignment` calls a leaf of
    /// the same file without aligning): align it to `abi.stack_alignment`
    /// around every call into the runtime (`Emitter::align_sp`).
    #[serde(default)]
    pub realign_sp: bool,
    /// A vector register that carries nothing at a function entry nor at a
    /// return site, for the upper-bits restore's test (else it uses the
    /// first saved vector register, whose low part is reloaded after).
    #[serde(default)]
    pub vector_scratch: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSlots {
    pub slots: Vec<String>,
}

// ---------------------------------------------------------------------------
// The checked spec.

/// Where something is found at trampoline entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Location {
    /// In a register.
    Reg(Reg),
    /// On the stack, `n` bytes above the trampoline's entry stack pointer.
    Stack(u32),
}

/// One member of `struct ftrace_regs` / `struct pt_regs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SlotKind {
    /// A saved register.
    Reg(Reg),
    /// The traced function's stack pointer at its entry.
    Sp,
    /// Where execution resumes after the callback.
    Ip,
    /// Where the traced function will return.
    ReturnAddress,
    /// The flags register.
    Flags,
}

/// A checked architecture spec with every register name resolved.
#[derive(Debug, Clone)]
pub struct Spec {
    pub raw: RawSpec,
    pub file: String,
    pub name: String,
    pub endian: Endian,
    pub int_args: Vec<Reg>,
    pub fp_args: Vec<Reg>,
    pub int_ret: Vec<Reg>,
    pub fp_ret: Vec<Reg>,
    pub entry_live: Vec<Reg>,
    pub callee_saved: Vec<Reg>,
    /// `abi.callee_saved_args`: a subset of `int_args`.
    pub callee_saved_args: Vec<Reg>,
    pub sp: Reg,
    pub fp: Reg,
    pub lr: Option<Reg>,
    pub toc: Option<Reg>,
    pub stack_alignment: u32,
    pub call_reserve: u32,
    pub vector_bytes: u32,
    /// `registers.vector_upper_bytes` (0: none).
    pub vector_upper_bytes: u32,
    /// `registers.vector_wider_bytes` (0: none).
    pub vector_wider_bytes: u32,
    /// `abi.fp_stack_ret` (0: none).
    pub fp_stack_ret: u32,
    pub nops: Vec<Vec<u8>>,
    pub site_len: usize,
    pub site_return: Location,
    pub parent: Location,
    pub clobbers: Vec<Reg>,
    pub resume_via: Option<Reg>,
    pub resume_return_address: Vec<Reg>,
    pub scratch: Vec<Reg>,
    pub return_via: Reg,
    /// `trampoline.vector_scratch`.
    pub vector_scratch: Option<Reg>,
    pub ftrace_regs: Vec<SlotKind>,
    pub pt_regs: Vec<SlotKind>,
}

impl Spec {
    /// Parses and checks a spec; `file` is only used in error messages.
    pub fn parse(file: &str, text: &str) -> Result<Spec, SpecError> {
        let raw: RawSpec = toml::from_str(text).map_err(|e| {
            let line = e.span().map(|s| line_col(text, s.start));
            SpecError {
                file: file.to_string(),
                line,
                field: "toml".to_string(),
                problem: e.message().to_string(),
            }
        })?;
        Checker { file, text, raw: &raw }.check(raw.clone())
    }

    /// The built-in spec of `arch`.
    pub fn builtin(arch: &str) -> Result<Spec, SpecError> {
        let (_, file, text) = BUILTIN.iter().find(|(n, _, _)| *n == arch).ok_or_else(|| SpecError {
            file: "<builtin>".into(),
            line: None,
            field: "arch".into(),
            problem: format!(
                "unknown architecture `{arch}` (known: {})",
                BUILTIN.iter().map(|b| b.0).collect::<Vec<_>>().join(", ")
            ),
        })?;
        Spec::parse(file, text)
    }

    /// Name of a register as the spec writes it.
    pub fn reg_name(&self, r: Reg) -> String {
        let regs = &self.raw.registers;
        match r.class {
            RegClass::Gpr => regs.gpr.get(r.enc as usize).cloned(),
            RegClass::Vector => regs.vector.get(r.enc as usize).cloned(),
            RegClass::Special => regs.special.iter().find(|(_, e)| **e == r.enc).map(|(n, _)| n.clone()),
        }
        .unwrap_or_else(|| format!("{:?}{}", r.class, r.enc))
    }

    /// Looks a register name up.
    pub fn reg(&self, name: &str) -> Option<Reg> {
        lookup(&self.raw.registers, name)
    }

    /// Bytes of one saved register of class `class`.
    pub fn reg_bytes(&self, class: RegClass) -> u32 {
        match class {
            RegClass::Vector => self.vector_bytes,
            _ => 8,
        }
    }

    /// The name of a slot as the C header and listings print it.
    pub fn slot_name(&self, s: SlotKind) -> String {
        match s {
            SlotKind::Reg(r) => self.reg_name(r),
            SlotKind::Sp => "sp".into(),
            SlotKind::Ip => "ip".into(),
            SlotKind::ReturnAddress => "return_address".into(),
            SlotKind::Flags => "flags".into(),
        }
    }
}

fn lookup(regs: &RawRegisters, name: &str) -> Option<Reg> {
    if let Some(i) = regs.gpr.iter().position(|g| g == name) {
        return Some(Reg::gpr(i as u8));
    }
    if let Some(i) = regs.vector.iter().position(|g| g == name) {
        return Some(Reg::vector(i as u8));
    }
    regs.special.get(name).map(|e| Reg::special(*e))
}

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map(|l| l.chars().count()).unwrap_or(0) + 1;
    (line, col)
}

struct Checker<'a> {
    file: &'a str,
    text: &'a str,
    raw: &'a RawSpec,
}

impl Checker<'_> {
    fn err(&self, field: &str, problem: impl fmt::Display) -> SpecError {
        // Point at the field's key in the file when it can be found.
        let key = field.rsplit('.').next().unwrap_or(field);
        let line = self
            .text
            .lines()
            .position(|l| l.trim_start().starts_with(&format!("{key} ")) || l.trim_start().starts_with(&format!("{key}=")))
            .map(|i| (i + 1, 1));
        SpecError { file: self.file.to_string(), line, field: field.to_string(), problem: problem.to_string() }
    }

    fn reg(&self, field: &str, name: &str) -> Result<Reg, SpecError> {
        lookup(&self.raw.registers, name).ok_or_else(|| self.err(field, format!("unknown register `{name}`")))
    }

    fn gpr(&self, field: &str, name: &str) -> Result<Reg, SpecError> {
        let r = self.reg(field, name)?;
        if r.class != RegClass::Gpr {
            return Err(self.err(field, format!("`{name}` is not a general-purpose register")));
        }
        Ok(r)
    }

    fn list(&self, field: &str, names: &[String], class: Option<RegClass>) -> Result<Vec<Reg>, SpecError> {
        let mut out = Vec::new();
        for n in names {
            let r = self.reg(field, n)?;
            if let Some(c) = class {
                if r.class != c {
                    return Err(self.err(field, format!("`{n}` is a {:?} register, expected {:?}", r.class, c)));
                }
            }
            if out.contains(&r) {
                return Err(self.err(field, format!("`{n}` is listed twice")));
            }
            out.push(r);
        }
        Ok(out)
    }

    /// `allow_special`: a special register is accepted too (ppc64 `lr`);
    /// the generator moves it into a scratch register first.
    fn location(&self, field: &str, s: &str, allow_special: bool) -> Result<Location, SpecError> {
        let s = s.trim();
        if s == "stack" {
            return Ok(Location::Stack(0));
        }
        if let Some(n) = s.strip_prefix("stack+") {
            return n
                .trim()
                .parse::<u32>()
                .map(Location::Stack)
                .map_err(|_| self.err(field, format!("bad stack offset in `{s}`")));
        }
        if allow_special {
            let r = self.reg(field, s)?;
            if r.class == RegClass::Vector {
                return Err(self.err(field, format!("`{s}` is a vector register")));
            }
            return Ok(Location::Reg(r));
        }
        Ok(Location::Reg(self.gpr(field, s)?))
    }

    fn slots(&self, field: &str, names: &[String], sp: Reg) -> Result<Vec<SlotKind>, SpecError> {
        let mut out = Vec::new();
        for n in names {
            let s = match n.as_str() {
                "sp" => SlotKind::Sp,
                "ip" => SlotKind::Ip,
                "return_address" => SlotKind::ReturnAddress,
                "flags" => {
                    if self.raw.registers.flags.is_none() {
                        return Err(self.err(field, "`flags` slot but registers.flags is not set"));
                    }
                    SlotKind::Flags
                }
                _ => {
                    let r = self.reg(field, n)?;
                    if self.raw.registers.zero.as_deref() == Some(n.as_str()) {
                        return Err(self.err(field, format!("`{n}` is hardwired to zero and cannot be a slot")));
                    }
                    if r.class == RegClass::Special {
                        return Err(self.err(field, format!("`{n}` is a special register and cannot be a slot")));
                    }
                    // Restoring it from the frame would load it through
                    // itself while it still points at the frame.
                    if r == sp {
                        return Err(self.err(
                            field,
                            format!("`{n}` is the stack pointer (abi.stack_pointer): its value at entry is the `sp` slot, and a trampoline cannot restore it from a slot"),
                        ));
                    }
                    SlotKind::Reg(r)
                }
            };
            if out.contains(&s) {
                return Err(self.err(field, format!("`{n}` appears twice")));
            }
            out.push(s);
        }
        Ok(out)
    }

    /// `arch.name` selects the encoder (`arch::lookup`), which was written
    /// for the register numbering and ELF machine of the built-in spec of
    /// that name: a spec file may change the ABI use of the registers but not
    /// the registers themselves, or the encoder gets numbers it truncates or
    /// reads as other registers (an aarch64 spec renamed `x86_64` emits x86
    /// code with aarch64 register numbers; `xmm17` encodes as `xmm1`; `sp =
    /// 40` on aarch64 as x8).
    fn check_encoder(&self) -> Result<(), SpecError> {
        let name = &self.raw.arch.name;
        let Some((_, bfile, btext)) = BUILTIN.iter().find(|b| b.0 == name.as_str()) else {
            return Err(self.err(
                "arch.name",
                format!("`{name}` is not an architecture this build has an encoder for (known: {})", BUILTIN.iter().map(|b| b.0).collect::<Vec<_>>().join(", ")),
            ));
        };
        if *btext == self.text {
            return Ok(());
        }
        let builtin: RawSpec = toml::from_str(btext)
            .map_err(|e| self.err("arch.name", format!("the built-in spec {bfile} does not parse: {}", e.message())))?;
        let why = format!("arch.name = \"{name}\" selects the {name} encoder, which uses the registers of {bfile}");
        let (m, bm) = (self.raw.arch.elf_machine, builtin.arch.elf_machine);
        if m != bm {
            return Err(self.err("arch.elf_machine", format!("{m} is not the ELF machine of {name} ({bm}): {why}; is arch.name right?")));
        }
        let (regs, b) = (&self.raw.registers, &builtin.registers);
        for (field, list, blist) in [("registers.gpr", &regs.gpr, &b.gpr), ("registers.vector", &regs.vector, &b.vector)] {
            if let Some(i) = (0..list.len().min(blist.len())).find(|&i| list[i] != blist[i]) {
                return Err(self.err(field, format!("register {i} is `{}`, but register {i} of {name} is `{}`: {why}", list[i], blist[i])));
            }
            if list.len() != blist.len() {
                return Err(self.err(
                    field,
                    format!("lists {} registers, {name} has {} ({} … {}): {why}", list.len(), blist.len(), blist[0], blist[blist.len() - 1]),
                ));
            }
        }
        if regs.special != b.special {
            let show = |m: &BTreeMap<String, u8>| m.iter().map(|(n, e)| format!("{n} = {e}")).collect::<Vec<_>>().join(", ");
            return Err(self.err("registers.special", format!("{{ {} }} is not {name}'s {{ {} }}: {why}", show(&regs.special), show(&b.special))));
        }
        Ok(())
    }

    fn check(&self, raw: RawSpec) -> Result<Spec, SpecError> {
        self.check_encoder()?;
        let regs = &raw.registers;
        if regs.gpr.is_empty() || regs.gpr.len() > 64 {
            return Err(self.err("registers.gpr", "needs 1 to 64 registers"));
        }
        let mut seen = std::collections::HashSet::new();
        for n in regs.gpr.iter().chain(&regs.vector).chain(regs.special.keys()) {
            if !seen.insert(n.as_str()) {
                return Err(self.err("registers", format!("register name `{n}` is defined twice")));
            }
        }
        if let Some(z) = &regs.zero {
            self.gpr("registers.zero", z)?;
        }
        if ![8, 16, 32, 64].contains(&regs.vector_bytes) {
            return Err(self.err("registers.vector_bytes", format!("{} is not 8, 16, 32 or 64", regs.vector_bytes)));
        }
        if ![0, regs.vector_bytes].contains(&regs.vector_upper_bytes) {
            return Err(self.err(
                "registers.vector_upper_bytes",
                format!("{} is neither 0 nor vector_bytes ({})", regs.vector_upper_bytes, regs.vector_bytes),
            ));
        }
        // (The widest form doubles the width again: zmm = 2 × ymm.)
        if regs.vector_wider_bytes != 0 && (regs.vector_upper_bytes == 0 || regs.vector_wider_bytes != regs.vector_bytes + regs.vector_upper_bytes) {
            return Err(self.err(
                "registers.vector_wider_bytes",
                format!("{} is neither 0 nor vector_bytes + vector_upper_bytes ({})", regs.vector_wider_bytes, regs.vector_bytes + regs.vector_upper_bytes),
            ));
        }
        let a = &raw.abi;
        if a.fp_stack_ret > 8 {
            return Err(self.err("abi.fp_stack_ret", format!("{} is more than a register stack of 8 holds", a.fp_stack_ret)));
        }
        let int_args = self.list("abi.int_args", &a.int_args, Some(RegClass::Gpr))?;
        let fp_args = self.list("abi.fp_args", &a.fp_args, Some(RegClass::Vector))?;
        let int_ret = self.list("abi.int_ret", &a.int_ret, Some(RegClass::Gpr))?;
        let fp_ret = self.list("abi.fp_ret", &a.fp_ret, Some(RegClass::Vector))?;
        let entry_live = self.list("abi.entry_live", &a.entry_live, Some(RegClass::Gpr))?;
        let callee_saved = self.list("abi.callee_saved", &a.callee_saved, None)?;
        let callee_saved_args = self.list("abi.callee_saved_args", &a.callee_saved_args, Some(RegClass::Gpr))?;
        if let Some(r) = callee_saved_args.iter().find(|r| !int_args.contains(r)) {
            return Err(self.err("abi.callee_saved_args", format!("`{}` is not an argument register (abi.int_args)", regs.gpr[r.enc as usize])));
        }
        if int_args.len() < 4 {
            return Err(self.err("abi.int_args", "at least 4 integer argument registers are needed for the tracer call"));
        }
        if int_ret.is_empty() {
            return Err(self.err("abi.int_ret", "needs at least one register"));
        }
        let sp = self.reg("abi.stack_pointer", &a.stack_pointer)?;
        let fp = self.gpr("abi.frame_pointer", &a.frame_pointer)?;
        let lr = a.link_register.as_deref().map(|n| self.reg("abi.link_register", n)).transpose()?;
        let toc = a.toc_register.as_deref().map(|n| self.gpr("abi.toc_register", n)).transpose()?;
        if !a.stack_alignment.is_power_of_two() || a.stack_alignment < 8 {
            return Err(self.err("abi.stack_alignment", format!("{} is not a power of two >= 8", a.stack_alignment)));
        }
        if !a.call_reserve.is_multiple_of(8) {
            return Err(self.err("abi.call_reserve", format!("{} is not a multiple of 8", a.call_reserve)));
        }
        for c in &callee_saved {
            if int_args.contains(c) || int_ret.contains(c) {
                return Err(self.err("abi.callee_saved", "a callee-saved register is also an argument or return register"));
            }
        }

        let s = &raw.site;
        let mut nops = Vec::new();
        for (i, text) in s.nops.iter().enumerate() {
            let bytes = parse_hex(text).map_err(|p| self.err(&format!("site.nops[{i}]"), p))?;
            nops.push(bytes);
        }
        let site_len = nops.first().map(|n| n.len()).ok_or_else(|| self.err("site.nops", "needs at least one NOP form"))?;
        if nops.iter().any(|n| n.len() != site_len) {
            return Err(self.err("site.nops", "all NOP forms must have the same length"));
        }
        let site_return = self.location("site.site_return", &s.site_return, true)?;
        let parent = self.location("site.parent", &s.parent, false)?;
        let clobbers = self.list("site.clobbers", &s.clobbers, Some(RegClass::Gpr))?;
        let resume_via = s.resume_via.as_deref().map(|n| self.gpr("site.resume_via", n)).transpose()?;
        let resume_return_address = match &s.resume_return_address {
            Some(list) => self.list("site.resume_return_address", list, None)?,
            None => lr.into_iter().collect(),
        };
        match site_return {
            Location::Stack(0) => {
                if !matches!(parent, Location::Stack(8)) {
                    return Err(self.err("site.parent", "with site_return = \"stack\" the parent must be at \"stack+8\""));
                }
            }
            Location::Stack(_) => return Err(self.err("site.site_return", "only \"stack\" (offset 0) is supported")),
            Location::Reg(_) => {
                if resume_via.is_none() {
                    return Err(self.err("site.resume_via", "needed when the site return address is in a register"));
                }
                if resume_return_address.is_empty() {
                    return Err(self.err("site.resume_return_address", "needed (or abi.link_register) when the site return address is in a register"));
                }
            }
        }
        if let Some(r) = resume_via {
            let n = &regs.gpr[r.enc as usize];
            let why = if int_args.contains(&r) {
                Some("is an argument register (abi.int_args)")
            } else if int_ret.contains(&r) {
                Some("is a return-value register (abi.int_ret)")
            } else if entry_live.contains(&r) {
                Some("carries a value at entry (abi.entry_live)")
            } else if callee_saved.contains(&r) || r == fp {
                Some("is callee-saved (abi.callee_saved)")
            } else if r == sp {
                Some("is the stack pointer")
            } else if Some(r) == toc {
                Some("is the TOC register (abi.toc_register)")
            } else if resume_return_address.contains(&r) {
                Some("gets the return address when resuming (site.resume_return_address)")
            } else {
                None
            };
            if let Some(why) = why {
                return Err(self.err(
                    "site.resume_via",
                    format!("`{n}` {why}: the trampoline overwrites it with the resume address, so the traced function would see it changed"),
                ));
            }
        }
        if s.stub && site_return != Location::Stack(0) {
            return Err(self.err("site.stub", "needs site_return = \"stack\" (the stub pushes the address after the site)"));
        }
        if s.ip_offset >= 0 || s.ip_offset.unsigned_abs() as usize > 64 {
            return Err(self.err("site.ip_offset", format!("{} is not a small negative offset", s.ip_offset)));
        }
        if s.callsite_ops_offset % 8 != 0 {
            return Err(self.err("site.callsite_ops_offset", "must be a multiple of 8 (the ops word is 8-byte aligned)"));
        }

        let t = &raw.trampoline;
        let scratch = self.list("trampoline.scratch", &t.scratch, Some(RegClass::Gpr))?;
        if scratch.is_empty() {
            return Err(self.err("trampoline.scratch", "needs at least one register"));
        }
        let return_via = self.gpr("trampoline.return_via", &t.return_via)?;
        for r in &scratch {
            let name = &regs.gpr[r.enc as usize];
            if int_args.contains(r) || entry_live.contains(r) || int_ret.contains(r) || callee_saved.contains(r) || *r == sp {
                return Err(self.err("trampoline.scratch", format!("`{name}` carries a value at entry or return, or is callee-saved")));
            }
            // The site leaves these two addresses in registers for the
            // trampoline to save; a scratch use before that loses them.
            let held = if site_return == Location::Reg(*r) {
                Some("the address after the site (site.site_return)")
            } else if parent == Location::Reg(*r) {
                Some("the traced function's return address (site.parent)")
            } else if Some(*r) == lr {
                Some("a return address (abi.link_register)")
            } else if Some(*r) == toc {
                Some("the TOC pointer (abi.toc_register)")
            } else {
                None
            };
            if let Some(held) = held {
                return Err(self.err("trampoline.scratch", format!("`{name}` holds {held} at entry, so it cannot be a scratch register")));
            }
        }
        if int_ret.contains(&return_via) || callee_saved.contains(&return_via) {
            return Err(self.err("trampoline.return_via", "must not be a return-value or callee-saved register"));
        }
        let vector_scratch = match &t.vector_scratch {
            None => None,
            Some(n) => {
                let r = self.list("trampoline.vector_scratch", std::slice::from_ref(n), Some(RegClass::Vector))?[0];
                if fp_args.contains(&r) || fp_ret.contains(&r) || callee_saved.contains(&r) {
                    return Err(self.err("trampoline.vector_scratch", format!("`{n}` carries a value at entry or return, or is callee-saved")));
                }
                // Only the upper-bits restore uses it: elsewhere it would be
                // a setting that does nothing.
                if regs.vector_upper_bytes == 0 {
                    return Err(self.err("trampoline.vector_scratch", format!("`{n}` is set, but only used with registers.vector_upper_bytes, which is 0")));
                }
                Some(r)
            }
        };

        let ftrace_regs = self.slots("ftrace_regs.slots", &raw.ftrace_regs.slots, sp)?;
        let pt_regs = self.slots("pt_regs.slots", &raw.pt_regs.slots, sp)?;
        for s in &pt_regs {
            if ftrace_regs.contains(s) {
                return Err(self.err("pt_regs.slots", "a slot of pt_regs repeats one of ftrace_regs"));
            }
        }
        for special in [SlotKind::Sp, SlotKind::Ip, SlotKind::ReturnAddress] {
            if !ftrace_regs.contains(&special) {
                return Err(self.err("ftrace_regs.slots", format!("missing the `{special:?}` slot").to_lowercase()));
            }
        }
        let need = |field: &str, what: &str, list: &[Reg]| -> Result<(), SpecError> {
            for r in list {
                if !ftrace_regs.contains(&SlotKind::Reg(*r)) {
                    let name = lookup_name(regs, *r);
                    return Err(self.err(field, format!("{what} `{name}` has no slot in ftrace_regs")));
                }
            }
            Ok(())
        };
        need("ftrace_regs.slots", "argument register", &int_args)?;
        need("ftrace_regs.slots", "FP argument register", &fp_args)?;
        need("ftrace_regs.slots", "return register", &int_ret)?;
        need("ftrace_regs.slots", "FP return register", &fp_ret)?;
        need("ftrace_regs.slots", "entry-live register", &entry_live)?;
        need("ftrace_regs.slots", "frame pointer", &[fp])?;
        if let Some(toc) = toc {
            need("ftrace_regs.slots", "TOC register", &[toc])?;
        }
        // The regs tier must cover every general-purpose register but the
        // stack pointer, the link register (whose value is `ip` /
        // `return_address`) and a hardwired zero register.
        for (i, n) in regs.gpr.iter().enumerate() {
            let r = Reg::gpr(i as u8);
            if r == sp || Some(r) == lr || regs.zero.as_ref() == Some(n) {
                continue;
            }
            if !ftrace_regs.contains(&SlotKind::Reg(r)) && !pt_regs.contains(&SlotKind::Reg(r)) {
                return Err(self.err("pt_regs.slots", format!("general-purpose register `{n}` is saved by neither ftrace_regs nor pt_regs")));
            }
        }
        if regs.flags.is_some() && !pt_regs.contains(&SlotKind::Flags) {
            return Err(self.err("pt_regs.slots", "registers.flags is set but pt_regs has no `flags` slot"));
        }

        Ok(Spec {
            file: self.file.to_string(),
            name: raw.arch.name.clone(),
            endian: raw.arch.endian,
            int_args,
            fp_args,
            int_ret,
            fp_ret,
            entry_live,
            callee_saved,
            callee_saved_args,
            sp,
            fp,
            lr,
            toc,
            stack_alignment: a.stack_alignment,
            call_reserve: a.call_reserve,
            vector_bytes: regs.vector_bytes,
            vector_upper_bytes: regs.vector_upper_bytes,
            vector_wider_bytes: regs.vector_wider_bytes,
            fp_stack_ret: a.fp_stack_ret,
            nops,
            site_len,
            site_return,
            parent,
            clobbers,
            resume_via,
            resume_return_address,
            scratch,
            return_via,
            vector_scratch,
            ftrace_regs,
            pt_regs,
            raw,
        })
    }
}

fn lookup_name(regs: &RawRegisters, r: Reg) -> String {
    match r.class {
        RegClass::Gpr => regs.gpr[r.enc as usize].clone(),
        RegClass::Vector => regs.vector[r.enc as usize].clone(),
        RegClass::Special => regs.special.iter().find(|(_, e)| **e == r.enc).map(|(n, _)| n.clone()).unwrap_or_default(),
    }
}

/// Parses `"90 90 0f"` into bytes.
pub fn parse_hex(text: &str) -> Result<Vec<u8>, String> {
    text.split_whitespace()
        .map(|b| u8::from_str_radix(b, 16).map_err(|_| format!("`{b}` is not a hex byte")))
        .collect()
}
