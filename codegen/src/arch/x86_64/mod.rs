//! x86_64 backend (System V).  Registration only; see `emit.rs`, `reloc.rs`
//! and `site.rs` for the three roles.

mod emit;
mod reloc;
mod site;

use super::{Arch, ElfReloc, Emitter, Fixup};
use crate::program::CodegenError;
use crate::spec::Spec;

pub struct X86_64;

/// The name used in errors.
pub(crate) const ARCH: &str = "x86_64";

impl Arch for X86_64 {
    fn name(&self) -> &'static str {
        ARCH
    }
    fn emitter(&self, _spec: &Spec) -> Box<dyn Emitter> {
        Box::new(emit::X64Emitter::new())
    }
    fn padding(&self) -> &'static [u8] {
        &[0xcc] // int3
    }
    fn apply_fixup(&self, code: &mut [u8], f: &Fixup, code_addr: u64, word_addr: u64) -> Result<(), CodegenError> {
        reloc::apply(code, f, code_addr, word_addr)
    }
    fn elf_relocs(&self, f: &Fixup) -> Vec<ElfReloc> {
        reloc::elf(f)
    }
    fn elf_abs64(&self) -> object::elf::RelocationType {
        object::elf::R_X86_64_64
    }
    fn site_call(&self, site: u64, target: u64) -> Result<Vec<u8>, CodegenError> {
        site::call(site, target)
    }
    fn site_jump(&self, site: u64, stub: u64) -> Result<Vec<u8>, CodegenError> {
        site::jump(site, stub)
    }
    fn site_stub(&self, at: u64, site: u64, target: u64) -> Result<Vec<u8>, CodegenError> {
        site::stub(at, site, target)
    }
}
