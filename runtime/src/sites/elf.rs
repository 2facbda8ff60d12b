//! What discovery needs from a loaded object's ELF file: its `PT_LOAD`
//! headers (to check the file is the object that is mapped), where its
//! site tables are, and its function symbols.
//!
//! Read through `object`'s [`ReadCache`], so only the headers, the symbol
//! tables and their strings are read from disk, never debug info — and the
//! symbol tables only when the file has site tables: most objects a
//! program maps (libc, the recorder itself, with 200 KB of `.symtab`) have
//! none, and `ElfFile64::parse` reads them whole.  Every failure becomes a
//! [`SkipReason`]; nothing here panics on odd files.

use super::loaded::Segment;
use super::{SiteKind, SkipReason, SymbolSource};
use object::elf;
use object::read::elf::{ElfFile64, FileHeader, ProgramHeader, SectionHeader, Sym};
use object::read::ReadCache;
use object::{Endianness, Object, ObjectSection, ObjectSymbol, SymbolKind};
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Section names of the site tables and the kind of site each records.
pub(crate) const TABLES: [(&str, SiteKind); 2] =
    [("__patchable_function_entries", SiteKind::PatchableEntry), ("__mcount_loc", SiteKind::McountLoc)];

/// A site table: 8-byte addresses at link-time address `addr`.
#[derive(Debug, Clone)]
pub(crate) struct Table {
    pub kind: SiteKind,
    pub addr: u64,
    pub size: u64,
}

/// A function symbol (link-time addresses).
#[derive(Debug, Clone)]
pub(crate) struct FuncSym {
    pub start: u64,
    pub size: u64,
    pub name: String,
    global: bool,
    /// The symbol's `st_other` (visibility and arch flags: aarch64's
    /// `STO_AARCH64_VARIANT_PCS`).
    pub st_other: u8,
}

#[cfg(test)]
impl FuncSym {
    pub fn new(start: u64, size: u64, name: &str) -> FuncSym {
        FuncSym { start, size, name: name.into(), global: true, st_other: 0 }
    }
}

/// The parts of an ELF file discovery uses.
#[derive(Debug)]
pub(crate) struct Parsed {
    pub dev: u64,
    pub inode: u64,
    pub loads: Vec<Segment>,
    pub tables: Vec<Table>,
    /// Function symbols sorted by start, one per start address; empty when
    /// the file has no tables (symbols are only read when needed).
    pub symbols: Vec<FuncSym>,
    pub symbol_source: SymbolSource,
    /// Each table's link-time addresses from the file ([`link_values`]),
    /// when discovery reads objects the loader has not relocated yet.
    pub links: Option<Vec<Vec<u64>>>,
}

/// Opens and reads `path`.
pub(crate) fn parse(path: &Path) -> Result<Parsed, SkipReason> {
    let file = File::open(path).map_err(|e| SkipReason::Open(e.to_string()))?;
    let meta = file.metadata().map_err(|e| SkipReason::Open(e.to_string()))?;
    let cache = ReadCache::new(file);
    let not_elf = |e: object::Error| SkipReason::NotElf(e.to_string());
    // The file header, program headers and section headers (with their
    // names) first: the symbol tables only if there are site tables.
    let header = elf::FileHeader64::<Endianness>::parse(&cache).map_err(not_elf)?;
    let endian = header.endian().map_err(not_elf)?;
    let loads = header
        .program_headers(endian, &cache)
        .map_err(not_elf)?
        .iter()
        .filter(|p| p.p_type(endian) == elf::PT_LOAD)
        .map(|p| Segment {
            p_type: p.p_type(endian).0,
            flags: p.p_flags(endian).0,
            offset: p.p_offset(endian),
            vaddr: p.p_vaddr(endian),
            filesz: p.p_filesz(endian),
            memsz: p.p_memsz(endian),
        })
        .collect();
    let sections = header.sections(endian, &cache).map_err(not_elf)?;
    if sections.is_empty() {
        return Err(SkipReason::NoSectionHeaders);
    }
    let mut tables = Vec::new();
    for section in sections.iter() {
        let Ok(name) = sections.section_name(endian, section) else { continue };
        if let Some((_, kind)) = TABLES.iter().find(|(n, _)| n.as_bytes() == name) {
            let size = section.sh_size(endian);
            if size > 0 {
                tables.push(Table { kind: *kind, addr: section.sh_addr(endian), size });
            }
        }
    }
    let (symbols, symbol_source) = if tables.is_empty() {
        (Vec::new(), SymbolSource::None)
    } else {
        functions(&ElfFile64::<Endianness, _>::parse(&cache).map_err(not_elf)?)
    };
    Ok(Parsed { dev: meta.dev(), inode: meta.ino(), loads, tables, symbols, symbol_source, links: None })
}

/// The link-time addresses each of `tables` holds, read from the file at
/// `path` (`None` if it cannot be read as it was by [`parse`]): the
/// section's bytes with its `RELATIVE` dynamic relocations applied.  For
/// an object the loader has mapped but not relocated yet, whose tables in
/// memory still hold what the file holds — link-time addresses where the
/// linker also wrote the addends in place (GNU ld's default, and every
/// `RELR` entry), zeros where it did not (lld's default).
pub(crate) fn link_values(path: &Path, tables: &[Table]) -> Option<Vec<Vec<u64>>> {
    let cache = ReadCache::new(File::open(path).ok()?);
    let elf = ElfFile64::<Endianness, _>::parse(&cache).ok()?;
    let endian = elf.endian();
    let relative = match elf.elf_header().e_machine(endian) {
        elf::EM_X86_64 => elf::R_X86_64_RELATIVE,
        elf::EM_AARCH64 => elf::R_AARCH64_RELATIVE,
        elf::EM_RISCV => elf::R_RISCV_RELATIVE,
        elf::EM_PPC64 => elf::R_PPC64_RELATIVE,
        elf::EM_S390 => elf::R_390_RELATIVE,
        _ => return None,
    };
    let mut values = Vec::with_capacity(tables.len());
    for t in tables {
        let section = elf.sections().find(|s| s.address() == t.addr && s.size() == t.size && TABLES.iter().any(|(n, _)| s.name() == Ok(*n)))?;
        let data = section.data().ok()?;
        let words: Vec<u64> = data.chunks_exact(8).map(|c| object::Endian::read_u64(endian, c.try_into().expect("8-byte chunk"))).collect();
        values.push(words);
    }
    for (offset, r) in elf.dynamic_relocations()? {
        if r.flags() != (object::RelocationFlags::Elf { r_type: relative }) || r.has_implicit_addend() {
            continue;
        }
        for (t, words) in tables.iter().zip(values.iter_mut()) {
            if offset >= t.addr && offset < t.addr + t.size && (offset - t.addr) % 8 == 0 {
                words[((offset - t.addr) / 8) as usize] = r.addend() as u64;
            }
        }
    }
    Some(values)
}

/// Whether the ELF file at `path` imports (has an undefined dynamic symbol
/// named) any of `names`; false when it cannot be read.
pub(crate) fn imports_any(path: &Path, names: &[&str]) -> bool {
    let Ok(file) = File::open(path) else { return false };
    let cache = ReadCache::new(file);
    // `.dynsym` alone (`ElfFile64::parse` would read `.symtab` too).
    let Ok(header) = elf::FileHeader64::<Endianness>::parse(&cache) else { return false };
    let Ok(endian) = header.endian() else { return false };
    let Ok(sections) = header.sections(endian, &cache) else { return false };
    let Ok(dynsym) = sections.symbols(endian, &cache, elf::SHT_DYNSYM) else { return false };
    dynsym.iter().any(|s| s.is_undefined(endian) && dynsym.symbol_name(endian, s).is_ok_and(|n| names.iter().any(|w| w.as_bytes() == n)))
}

/// Function symbols from `.symtab`, or `.dynsym` when the file is stripped.
fn functions<'d, R: object::ReadRef<'d>>(elf: &ElfFile64<'d, Endianness, R>) -> (Vec<FuncSym>, SymbolSource) {
    let symtab = function_symbols(elf.symbols());
    if !symtab.is_empty() {
        return (symtab, SymbolSource::Symtab);
    }
    let dynsym = function_symbols(elf.dynamic_symbols());
    if !dynsym.is_empty() {
        return (dynsym, SymbolSource::Dynsym);
    }
    (Vec::new(), SymbolSource::None)
}

/// Defined function symbols, sorted by start, one per start address:
/// among aliases prefer one with a size, then a global one, then the
/// first name in byte order.
fn function_symbols<'d: 'f, 'f, R: object::ReadRef<'d> + 'f>(symbols: impl Iterator<Item = object::read::elf::ElfSymbol64<'d, 'f, Endianness, R>>) -> Vec<FuncSym> {
    let mut out: Vec<FuncSym> = symbols
        .filter(|s| s.kind() == SymbolKind::Text && !s.is_undefined() && s.address() != 0)
        .filter_map(|s| {
            let name = String::from_utf8_lossy(s.name_bytes().ok()?).into_owned();
            Some(FuncSym { start: s.address(), size: s.size(), name, global: s.is_global(), st_other: s.elf_symbol().st_other.0 })
        })
        .collect();
    out.sort_by(|a, b| (a.start, a.size == 0, !a.global, &a.name).cmp(&(b.start, b.size == 0, !b.global, &b.name)));
    out.dedup_by_key(|s| s.start);
    out
}

/// Where a recorded site address (link-time) lies relative to the
/// function symbols.
pub(crate) enum Place<'a> {
    /// Inside the function (`start <= addr < start + size`).
    Inside(&'a FuncSym),
    /// Before the function's symbol, by at most `max_pre` bytes: the NOPs
    /// of -fpatchable-function-entry=N,M with M > 0.
    Before(&'a FuncSym),
    Unknown,
}

/// Places `addr` among `symbols` (sorted by start).
pub(crate) fn place(symbols: &[FuncSym], addr: u64, max_pre: u64) -> Place<'_> {
    let next = symbols.partition_point(|s| s.start <= addr);
    if let Some(s) = next.checked_sub(1).map(|i| &symbols[i]) {
        if addr == s.start || addr - s.start < s.size {
            return Place::Inside(s);
        }
    }
    match symbols.get(next) {
        Some(s) if s.start - addr <= max_pre => Place::Before(s),
        _ => Place::Unknown,
    }
}
