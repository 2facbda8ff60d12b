//! riscv64 backend (LP64D psABI, RV64GC).  Registration only; see `emit.rs`,
//! `reloc.rs` and `site.rs` for the three roles.

mod emit;
mod reloc;
mod site;

use super::{Arch, ElfReloc, Emitter, Fixup};
use crate::program::CodegenError;
use crate::spec::Spec;

pub struct Riscv64;

pub(crate) const ARCH: &str = "riscv64";

/// `e_flags` bit saying the object may contain compressed instructions.
const EF_RISCV_RVC: u32 = 0x1;

impl Arch for Riscv64 {
    fn name(&self) -> &'static str {
        ARCH
    }
    fn emitter(&self, spec: &Spec) -> Box<dyn Emitter> {
        // Compressed encodings only when the spec's objects declare RVC.
        Box::new(emit::RvEmitter::new(spec.raw.arch.elf_flags & EF_RISCV_RVC != 0))
    }
    fn padding(&self) -> &'static [u8] {
        // All-zero parcels are defined illegal instructions (`c.unimp` with
        // RVC, and 0x00000000 without); two bytes keep any RVC alignment.
        &[0, 0]
    }
    fn apply_fixup(&self, code: &mut [u8], f: &Fixup, code_addr: u64, word_addr: u64) -> Result<(), CodegenError> {
        reloc::apply(code, f, code_addr, word_addr)
    }
    fn elf_relocs(&self, f: &Fixup) -> Vec<ElfReloc> {
        reloc::elf(f)
    }
    fn elf_abs64(&self) -> object::elf::RelocationType {
        object::elf::R_RISCV_64
    }
    fn site_call(&self, site: u64, target: u64) -> Result<Vec<u8>, CodegenError> {
        site::call(site, target)
    }
}
