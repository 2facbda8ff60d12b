//! ppc64le backend (64-bit ELF V2 ABI).  Registration only; see `emit.rs`
//! (with the instruction encoder, as dynasmrt has no POWER backend),
//! `reloc.rs` and `site.rs` for the three roles.

mod emit;
mod reloc;
mod site;

pub use emit::enc;

use super::{Arch, ElfReloc, Emitter, Fixup};
use crate::program::CodegenError;
use crate::spec::Spec;

pub struct Ppc64le;

pub(crate) const ARCH: &str = "ppc64le";

impl Arch for Ppc64le {
    fn name(&self) -> &'static str {
        ARCH
    }
    fn emitter(&self, _spec: &Spec) -> Box<dyn Emitter> {
        Box::new(emit::P64Emitter::new())
    }
    fn padding(&self) -> &'static [u8] {
        &[0x08, 0x00, 0xe0, 0x7f] // trap
    }
    fn apply_fixup(&self, code: &mut [u8], f: &Fixup, code_addr: u64, word_addr: u64) -> Result<(), CodegenError> {
        reloc::apply(code, f, code_addr, word_addr)
    }
    fn elf_relocs(&self, f: &Fixup) -> Vec<ElfReloc> {
        reloc::elf(f)
    }
    fn elf_abs64(&self) -> object::elf::RelocationType {
        object::elf::R_PPC64_ADDR64
    }
    fn site_call(&self, site: u64, target: u64) -> Result<Vec<u8>, CodegenError> {
        site::call(site, target)
    }
}
