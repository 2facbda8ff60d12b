//! Relocatable ELF objects for build-time use (`ftramp gen`).
//!
//! The object holds the image's code in `.text` and its data words in
//! `.data`.  Code reaches the words through the arch's PC-relative
//! relocations; the two words that hold runtime entry points are filled by
//! absolute relocations against the only undefined symbols,
//! `ftrace_ops_list_func` and `ftrace_return_to_handler`.  Exported:
//! the trampolines (`ftrace_caller`, `ftrace_regs_caller`,
//! `return_to_handler`, …) and the writable words `function_trace_op`
//! (and `ftrace_direct_op` / `ftrace_direct_func` with direct variants;
//! a `multiN` variant adds `ftrace_direct_op_i` / `ftrace_direct_func_i`
//! for its tracers `i` = 1..N-1), all optionally prefixed.

use crate::arch::{self, RelocTarget};
use crate::image::Image;
use crate::program::{CodegenError, DataWord};
use crate::spec::{Endian, Spec};
use object::write::{Object, Relocation, StandardSection, Symbol, SymbolId, SymbolSection};
use object::{Architecture, BinaryFormat, Endianness, RelocationFlags, SectionKind, SymbolFlags, SymbolKind, SymbolScope};
use std::collections::HashMap;

/// Options for [`write()`].
#[derive(Debug, Clone, Default)]
pub struct ObjectOptions {
    /// Prepended to every symbol the object defines.
    pub prefix: String,
}

fn object_arch(spec: &Spec) -> Result<Architecture, CodegenError> {
    Ok(match spec.name.as_str() {
        "x86_64" => Architecture::X86_64,
        "aarch64" => Architecture::Aarch64,
        "riscv64" => Architecture::Riscv64,
        "ppc64le" => Architecture::PowerPc64,
        "s390x" => Architecture::S390x,
        other => {
            return Err(CodegenError::Unsupported { arch: "object", what: format!("no ELF machine mapping for `{other}`") })
        }
    })
}

/// Whether a data word is part of the object's interface.
fn exported(word: DataWord) -> bool {
    word.initial_symbol().is_none()
}

/// Writes `image` as an ELF relocatable object.
pub fn write(spec: &Spec, image: &Image, opts: &ObjectOptions) -> Result<Vec<u8>, CodegenError> {
    let backend = arch::lookup(image.arch)?;
    let endian = match spec.endian {
        Endian::Little => Endianness::Little,
        Endian::Big => Endianness::Big,
    };
    let mut obj = Object::new(BinaryFormat::Elf, object_arch(spec)?, endian);
    obj.flags = object::write::FileFlags::Elf { os_abi: object::elf::OsAbi(0), abi_version: 0, e_flags: object::elf::FileFlags(spec.raw.arch.elf_flags) };

    let text = obj.section_id(StandardSection::Text);
    obj.append_section_data(text, &image.code, 16);
    let data = obj.section_id(StandardSection::Data);
    obj.append_section_data(data, &vec![0u8; image.data_size()], 8);
    // No executable stack needed.
    obj.add_section(Vec::new(), b".note.GNU-stack".to_vec(), SectionKind::Note);

    for t in &image.trampolines {
        obj.add_symbol(Symbol {
            name: format!("{}{}", opts.prefix, t.symbol).into_bytes(),
            value: t.entry as u64,
            size: (t.offset + t.len - t.entry) as u64,
            kind: SymbolKind::Text,
            scope: SymbolScope::Linkage,
            weak: false,
            section: SymbolSection::Section(text),
            flags: SymbolFlags::None,
        });
    }
    let mut words: HashMap<DataWord, SymbolId> = HashMap::new();
    for w in &image.data {
        let off = image.word_offset(*w).expect("word in image") as u64;
        let name = if exported(*w) { format!("{}{}", opts.prefix, w.symbol()) } else { format!(".L{}{}", opts.prefix, w.symbol()) };
        let id = obj.add_symbol(Symbol {
            name: name.into_bytes(),
            value: off,
            size: 8,
            kind: SymbolKind::Data,
            scope: if exported(*w) { SymbolScope::Linkage } else { SymbolScope::Compilation },
            weak: false,
            section: SymbolSection::Section(data),
            flags: SymbolFlags::None,
        });
        words.insert(*w, id);
        if let Some(import) = w.initial_symbol() {
            let target = obj.add_symbol(Symbol {
                name: import.as_bytes().to_vec(),
                value: 0,
                size: 0,
                kind: SymbolKind::Text,
                scope: SymbolScope::Unknown,
                weak: false,
                section: SymbolSection::Undefined,
                flags: SymbolFlags::None,
            });
            obj.add_relocation(
                data,
                Relocation { offset: off, symbol: target, addend: 0, flags: RelocationFlags::Elf { r_type: backend.elf_abs64() } },
            )
            .map_err(|e| CodegenError::Unsupported { arch: image.arch, what: e.to_string() })?;
        }
    }
    let mut labels: HashMap<usize, SymbolId> = HashMap::new();
    for f in &image.fixups {
        for r in backend.elf_relocs(f) {
            let symbol = match r.target {
                RelocTarget::Data(w) => words[&w],
                RelocTarget::Code(at) => *labels.entry(at).or_insert_with(|| {
                    obj.add_symbol(Symbol {
                        name: format!(".Lftramp_pc{at}").into_bytes(),
                        value: at as u64,
                        size: 0,
                        kind: SymbolKind::Label,
                        scope: SymbolScope::Compilation,
                        weak: false,
                        section: SymbolSection::Section(text),
                        flags: SymbolFlags::None,
                    })
                }),
            };
            obj.add_relocation(
                text,
                Relocation { offset: r.offset as u64, symbol, addend: r.addend, flags: RelocationFlags::Elf { r_type: r.r_type } },
            )
            .map_err(|e| CodegenError::Unsupported { arch: image.arch, what: e.to_string() })?;
        }
    }
    obj.write().map_err(|e| CodegenError::Unsupported { arch: image.arch, what: format!("writing ELF: {e}") })
}
