//! s390x backend (zSeries ELF ABI, big-endian).  Registration only; see
//! `emit.rs`, `reloc.rs` and `site.rs` for the three roles.
//!
//! dynasmrt has no s390x backend, so `emit.rs` carries a small encoder for
//! exactly the instructions the primitives need, with typed operands; every
//! multi-byte field is written most-significant byte first, whatever the
//! host's byte order.

mod emit;
mod reloc;
mod site;

use super::{Arch, ElfReloc, Emitter, Fixup};
use crate::program::CodegenError;
use crate::spec::Spec;

pub struct S390x;

pub(crate) const ARCH: &str = "s390x";

impl Arch for S390x {
    fn name(&self) -> &'static str {
        ARCH
    }
    fn emitter(&self, _spec: &Spec) -> Box<dyn Emitter> {
        Box::new(emit::S390Emitter::new())
    }
    fn padding(&self) -> &'static [u8] {
        // Opcode 0x00 is not assigned: executing it raises an operation
        // exception (SIGILL).
        &[0, 0]
    }
    fn apply_fixup(&self, code: &mut [u8], f: &Fixup, code_addr: u64, word_addr: u64) -> Result<(), CodegenError> {
        reloc::apply(code, f, code_addr, word_addr)
    }
    fn elf_relocs(&self, f: &Fixup) -> Vec<ElfReloc> {
        reloc::elf(f)
    }
    fn elf_abs64(&self) -> object::elf::RelocationType {
        object::elf::R_390_64
    }
    fn site_call(&self, site: u64, target: u64) -> Result<Vec<u8>, CodegenError> {
        site::call(site, target)
    }
}
