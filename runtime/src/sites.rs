//! Site discovery: every patchable function entry of the running program
//! and of each shared library it has loaded.
//!
//! ```text
//!  loader list (dl_iterate_phdr)      ELF file (object, ReadCache)
//!  name, load bias, program headers   PT_LOAD headers, __patchable_function_entries /
//!            │                        __mcount_loc (link address, size), FUNC symbols
//!            └───────────┬────────────────────┘
//!                        ▼  under the loader lock, for objects still loaded
//!   read the table at bias + sh_addr (relocated in memory; the file copy of a PIE
//!   holds addends or zeros) → 8-byte addresses → place each among the symbols →
//!   read the site's bytes → a Site (bytes are a NOP form) or a Refused (they are not)
//! ```
//!
//! The compiler records the address of the first NOP.  With
//! `-fpatchable-function-entry=N,M` and M > 0 that address lies M bytes
//! *before* the function's symbol (room for a callsite ops word); the site
//! proper — what is patched into a call, and the `ip` a tracer sees — is
//! then at the symbol, after a landing pad (`endbr64`, `bti c`) if the
//! function starts with one.  With M = 0 the recorded address is the site.
//!
//! Modules are identified between refreshes by (loader name, load bias,
//! program-header address).  [`Discovery::refresh`] drops modules the
//! loader no longer lists without reading their memory, and reads new ones;
//! modules it already knows are not read again (their sites may have been
//! patched since).  Discovery reads memory only inside the loader's lock
//! and only inside the module's readable `PT_LOAD` segments (see
//! `loaded.rs`), so a concurrent `dlclose` can never unmap what is being
//! read; before new libraries are read, [`wait_for_loader`] waits for a
//! `dlopen` in progress to finish relocating them.  Code that patches
//! sites later keeps their modules loaded with [`Discovery::while_loaded`].
//! Inside the loader itself (an audit module's hook, [`LoaderHeld`]) no
//! `dlopen` is made, and the tables of objects not relocated yet are read
//! from their files.
//!
//! Building sites: gcc `-fpatchable-function-entry=N[,M]` on every arch;
//! on x86_64 also `-pg -mfentry -mnop-mcount -mrecord-mcount` (non-PIC
//! code only: `-fno-PIE`; linked into a PIE or a shared library it needs
//! text relocations, because gcc emits `__mcount_loc` read-only).  gcc has
//! no `-mnop-mcount`/`-mrecord-mcount` for aarch64, and ppc64le's
//! `-pg -mprofile-kernel` sites are recorded in no table: discovery finds
//! none there.
//!
//! Limits: a module closed and reopened at the same address between two
//! refreshes keeps its identity (the same file at the same place: the
//! addresses and names are still right, but bytes a patcher wrote there
//! are gone — [`Changes::unloaded`] tells that some object was unloaded
//! since the last refresh).  Without symbols (a stripped library's static
//! functions), a site is taken to start at the recorded address.

mod arch;
pub use arch::landing_pads;
mod elf;
pub(crate) mod loaded;

use crate::patch::{self, TextEdit};
use crate::{host_spec, RuntimeError};
use ftramp_codegen::Spec;
use loaded::{Key, Live};
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::ops::Range;
use std::path::PathBuf;

/// The farthest a recorded address may precede its function's symbol
/// (the M of `-fpatchable-function-entry=N,M`, in bytes).
const MAX_PRE_ENTRY: u64 = 64;

/// Which table the compiler recorded a site in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SiteKind {
    /// `__patchable_function_entries` (`-fpatchable-function-entry=N[,M]`).
    PatchableEntry,
    /// `__mcount_loc` (`-pg -mfentry -mnop-mcount -mrecord-mcount`).
    McountLoc,
}

/// A module of one [`Discovery`]; never reused for another module.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModuleId(u32);

/// A patchable site: its bytes were one of the host spec's NOP forms when
/// it was discovered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Site {
    /// The `site_len` NOP bytes that become the enabled form; the `ip` a
    /// tracer is called with.
    pub addr: usize,
    /// The address the compiler recorded (the first NOP); `addr - record`
    /// is `pre_entry` plus any landing pad.
    pub record: usize,
    /// NOP bytes reserved before the function's symbol, `[record, record +
    /// pre_entry)` (the M of `-fpatchable-function-entry=N,M`).
    pub pre_entry: usize,
    pub module: ModuleId,
    /// The function the site belongs to, if the module has symbols.
    pub symbol: Option<String>,
    /// The site's module has its own unwinder ([`Module::own_unwinder`]):
    /// fgraph, which hijacks returns, leaves it untraced ([`crate::ops::Ops::traces`]).
    pub own_unwinder: bool,
    /// `addr` minus the symbol's address (e.g. 4 after an `endbr64`).
    pub offset_in_symbol: usize,
    pub kind: SiteKind,
    /// [`Site::demangled`], worked out on first use (`Default::default()`
    /// when making a site).
    pub demangled: DemangledName,
}

/// A site's readable name, kept once worked out: filters match it beside
/// the raw symbol, at every refresh, and demangling each time would cost
/// microseconds per C++ site.  Not part of a site's identity (equal
/// whether or not worked out yet).
#[derive(Debug, Clone, Default)]
pub struct DemangledName(std::sync::OnceLock<Option<Box<str>>>);

impl PartialEq for DemangledName {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for DemangledName {}

impl Site {
    /// The symbol's readable name as `ftramp replay` shows it
    /// (`ftramp_demangle::demangle`: C++ without parameters, Rust without
    /// the hash); `None` when the symbol is not mangled (C) or missing.
    pub fn demangled(&self) -> Option<&str> {
        self.demangled.0.get_or_init(|| self.symbol.as_deref().and_then(ftramp_demangle::demangle).map(String::into_boxed_str)).as_deref()
    }

    /// The reserved NOPs before the function.
    pub fn pre_entry_range(&self) -> Range<usize> {
        self.record..self.record + self.pre_entry
    }

    /// Where `callsite-ops` dispatch finds this site's ops word
    /// (`addr + site.callsite_ops_offset`), if those 8 bytes are aligned
    /// and lie inside the reserved NOPs before the function.
    pub fn callsite_word(&self, spec: &Spec) -> Option<usize> {
        let word = self.addr.checked_add_signed(spec.raw.site.callsite_ops_offset as isize)?;
        let reserved = self.pre_entry_range();
        (word % 8 == 0 && reserved.start <= word && word + 8 <= reserved.end).then_some(word)
    }
}

impl fmt::Display for Site {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.addr)?;
        write_symbol(f, self.symbol.as_deref(), self.offset_in_symbol)
    }
}

fn write_symbol(f: &mut fmt::Formatter<'_>, symbol: Option<&str>, offset: usize) -> fmt::Result {
    match (symbol, offset) {
        (Some(s), 0) => write!(f, " <{s}>"),
        (Some(s), o) => write!(f, " <{s}+{o:#x}>"),
        (None, _) => Ok(()),
    }
}

/// Why a recorded site is not patchable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefuseReason {
    /// The site's bytes are none of the host spec's NOP forms.
    NotNop,
    /// The bytes reserved before the function are not NOPs.
    PreEntryNotNop,
    /// The address is not inside an executable, readable segment of its
    /// module.
    OutsideText,
    /// The function's symbol has `st_other` bits the spec refuses
    /// (`site.refuse_st_other`; aarch64: the SVE vector PCS).
    CallingConvention,
    /// The function is the tracer's own ([`is_tracer_code`]).
    TracerCode,
}

impl fmt::Display for RefuseReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RefuseReason::NotNop => "not a NOP form of this architecture",
            RefuseReason::PreEntryNotNop => "the bytes before the function are not NOPs",
            RefuseReason::OutsideText => "outside the module's executable segments",
            RefuseReason::CallingConvention => "the function uses a calling convention the trampolines do not keep (symbol st_other)",
            RefuseReason::TracerCode => "the tracer's own code (ftramp's crates, Rust's allocator shims): tracing it would recurse into the tracer",
        })
    }
}

/// A recorded site that is never patched, with what was found there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The site address (as for [`Site::addr`]), or the recorded address
    /// when it lies outside the module's text.
    pub addr: usize,
    pub module: ModuleId,
    pub symbol: Option<String>,
    pub offset_in_symbol: usize,
    /// The bytes found: the site's `site_len` bytes, or the pre-entry
    /// bytes for [`RefuseReason::PreEntryNotNop`]; empty when unreadable.
    pub found: Vec<u8>,
    pub reason: RefuseReason,
    pub kind: SiteKind,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.addr)?;
        write_symbol(f, self.symbol.as_deref(), self.offset_in_symbol)?;
        write!(f, ": {}; found [", self.reason)?;
        for (i, b) in self.found.iter().enumerate() {
            write!(f, "{}{b:02x}", if i == 0 { "" } else { " " })?;
        }
        f.write_str("]")
    }
}

/// Which symbol table named a module's sites.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SymbolSource {
    Symtab,
    /// Stripped file: exported functions only.
    Dynsym,
    /// No function symbols (or no sites, so none were read).
    None,
}

/// A loaded object whose file could be read.
#[derive(Debug, Clone)]
pub struct Module {
    pub id: ModuleId,
    /// The loader's name (a path), or the main program's path.
    pub name: String,
    /// The file that was read (`/proc/self/exe` for the main program).
    pub path: PathBuf,
    pub is_main: bool,
    /// Load bias: run-time address = link-time address + bias.
    pub bias: usize,
    pub dev: u64,
    pub inode: u64,
    /// In-memory ranges of the executable segments.
    pub text: Vec<Range<usize>>,
    /// Patchable sites, sorted by address.
    pub sites: Vec<Site>,
    pub refused: Vec<Refused>,
    /// Zero entries in the tables (padding, or functions the linker
    /// discarded): skipped, as Linux's `ftrace_process_locs` does.
    pub null_entries: usize,
    /// Functions that begin with a site's NOPs but are in no table: the
    /// compiler made their sites and the link lost their table (g++ 12
    /// ties a C++ file's table to its first function, and drops it with
    /// that function when another object's copy of it is kept; see the
    /// README).  Only counted where the file has a table (symbols are read
    /// only then).
    pub unlisted: usize,
    /// The module defines `_Unwind_RaiseException` itself (linked with
    /// `-static-libgcc`): its throws call that copy directly, with no GOT
    /// slot for the unwinder hooks (`unwind.rs`), so under fgraph an
    /// exception it throws through traced frames meets a hijacked return
    /// and ends in `std::terminate`.  Seen where the full symbol table is
    /// read (a module with sites, not stripped).
    pub own_unwinder: bool,
    pub symbols: SymbolSource,
    key: Key,
}

impl Module {
    /// Whether the module's file imports any of `names` (false when it
    /// cannot be read).
    pub(crate) fn imports_any(&self, names: &[&str]) -> bool {
        elf::imports_any(&self.path, names)
    }

    /// The site at `addr`, if any.
    pub fn site_at(&self, addr: usize) -> Option<&Site> {
        self.sites.binary_search_by_key(&addr, |s| s.addr).ok().map(|i| &self.sites[i])
    }
}

/// Why a loaded object was not read (it is retried on the next refresh).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SkipReason {
    /// No file to read: the vDSO, or an object without a path.
    NoFile,
    /// The file could not be opened (deleted, permissions...).
    Open(String),
    /// Not a readable 64-bit ELF file.
    NotElf(String),
    /// The file has no section headers (so no site tables can be found).
    NoSectionHeaders,
    /// The file's `PT_LOAD` headers differ from the loaded object's (the
    /// file was replaced after loading).
    Mismatch,
    /// A site table does not lie inside a readable segment.
    TableOutsideSegments(&'static str),
    /// The tables hold unrelocated values: the loader is still loading
    /// the object (a concurrent `dlopen`).
    NotRelocated,
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SkipReason::NoFile => f.write_str("no file (vDSO or unnamed object)"),
            SkipReason::Open(e) => write!(f, "cannot open: {e}"),
            SkipReason::NotElf(e) => write!(f, "not a readable ELF64 file: {e}"),
            SkipReason::NoSectionHeaders => f.write_str("no section headers"),
            SkipReason::Mismatch => f.write_str("the file's program headers differ from the loaded object's"),
            SkipReason::TableOutsideSegments(t) => write!(f, "{t} is not inside a readable segment"),
            SkipReason::NotRelocated => f.write_str("site tables not relocated yet (object still loading)"),
        }
    }
}

/// A loaded object that was not read.
#[derive(Debug, Clone)]
pub struct Skipped {
    pub name: String,
    pub bias: usize,
    pub reason: SkipReason,
}

/// What a [`Discovery::refresh`] changed.
#[derive(Debug, Default)]
pub struct Changes {
    /// Modules read for the first time.
    pub added: Vec<ModuleId>,
    /// Modules the loader no longer lists (their memory is gone: never
    /// touch their sites again).
    pub removed: Vec<Module>,
    /// Objects the loader unloaded since the previous refresh (its
    /// `dlpi_subs` counter).  Non-zero while `removed` is empty means an
    /// object was unloaded and loaded again at the same place.
    pub unloaded: u64,
}

/// Counts of [`optimize_nops`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NopStats {
    /// Sites rewritten into the cheaper NOP.
    pub rewritten: usize,
    /// Sites left alone (already the cheapest form, or changed since
    /// discovery).
    pub unchanged: usize,
}

/// The sites of every loaded module.
#[derive(Debug, Default)]
pub struct Discovery {
    modules: Vec<Module>,
    skipped: Vec<Skipped>,
    next_id: u32,
    subs: Option<u64>,
}

pub(crate) use loaded::ForkSection;
pub use loaded::{install_fork_handlers, wait_for_loader, LoaderHeld};

/// The loader's counters of objects ever loaded and unloaded
/// (`dlpi_adds`, `dlpi_subs`): they change with every `dlopen`/`dlclose`.
pub fn loader_generation() -> (u64, u64) {
    loaded::generation()
}

/// Discovers the sites of the program and every library loaded now.
pub fn discover() -> Result<Discovery, RuntimeError> {
    let mut d = Discovery::default();
    d.refresh()?;
    Ok(d)
}

impl Discovery {
    /// An empty discovery; [`Discovery::refresh`] fills it.
    pub fn new() -> Discovery {
        Discovery::default()
    }

    /// Modules that were read, in the order they were found.
    pub fn modules(&self) -> &[Module] {
        &self.modules
    }

    pub fn module(&self, id: ModuleId) -> Option<&Module> {
        self.modules.iter().find(|m| m.id == id)
    }

    /// Loaded objects that could not be read, and why.
    pub fn skipped(&self) -> &[Skipped] {
        &self.skipped
    }

    /// Whether the last refresh skipped an object the loader was still
    /// loading ([`SkipReason::NotRelocated`]): a caller that refreshes when
    /// the loader's counters change should look again although they have
    /// not changed since.
    pub fn loading(&self) -> bool {
        self.skipped.iter().any(|s| matches!(s.reason, SkipReason::NotRelocated))
    }

    /// Every patchable site.
    pub fn sites(&self) -> impl Iterator<Item = &Site> {
        self.modules.iter().flat_map(|m| m.sites.iter())
    }

    /// Every refused site.
    pub fn refused(&self) -> impl Iterator<Item = &Refused> {
        self.modules.iter().flat_map(|m| m.refused.iter())
    }

    /// The site at `addr`.
    pub fn site_at(&self, addr: usize) -> Option<&Site> {
        self.modules.iter().find_map(|m| m.site_at(addr))
    }

    /// Sites of functions named `symbol` (a static function may exist in
    /// several modules).
    pub fn sites_named<'a>(&'a self, symbol: &'a str) -> impl Iterator<Item = &'a Site> {
        self.sites().filter(move |s| s.symbol.as_deref() == Some(symbol))
    }

    /// Runs `f` with the modules of this discovery that are still loaded
    /// (the same instance that was discovered: same name, load bias and
    /// program-header address), inside the loader's list lock, so that none
    /// of them can be unmapped until `f` returns (`dlclose` unlinks an
    /// object under that lock before it unmaps it; see `loaded.rs`).  Their
    /// sites may be patched inside `f`, which must not `dlopen` or
    /// `dlclose` nor wait for a thread that does (the patcher does not: it
    /// waits only for running threads to answer its signal, and a thread
    /// waiting for the lock is not running).  No reference is taken: a
    /// library the program closes meanwhile is unloaded by its `dlclose`,
    /// on the program's thread, once `f` is done (with references, its
    /// destructors ran when the last one went, on the engine's thread or
    /// at exit, out of their order).  Libraries of another `dlmopen`
    /// namespace are left out.
    pub fn while_loaded<R>(&self, f: impl FnOnce(&[&Module]) -> R) -> R {
        loaded::with_loaded(|set| {
            let listed: HashSet<Key> = set.objects().iter().map(|o| o.key()).collect();
            let live: Vec<&Module> = self.modules.iter().filter(|m| listed.contains(&m.key)).collect();
            f(&live)
        })
    }

    /// Brings the discovery up to date with the loader: reads modules
    /// loaded since (`dlopen`), drops modules no longer loaded (`dlclose`)
    /// without touching their memory, retries skipped ones.  Modules
    /// already known are not read again.
    pub fn refresh(&mut self) -> Result<Changes, RuntimeError> {
        let spec = host_spec();
        let known: HashSet<Key> = self.modules.iter().map(|m| m.key.clone()).collect();
        // 1. Which objects are new (a copy of the list; the lock is
        //    released again before any file is read).
        let snapshot = loaded::with_loaded(|set| set.objects().to_vec());
        // 2. Read their files, without holding the loader lock.  (They are
        //    not pinned: a reference taken now would keep a library the
        //    program closes meanwhile loaded until it is dropped, so its
        //    destructors would run here, or at exit, out of their order.
        //    Nor is a dlopen in progress waited for, which would make this
        //    thread wait for the loader's lock holding the caller's locks,
        //    which the audit module's hook, inside the loader, may want.
        //    Their memory is read under the lock in step 3, where only
        //    objects still loaded are listed, and an object the loader has
        //    not relocated yet is skipped as `NotRelocated`: the caller
        //    tries again, see `Discovery::loading`.)
        let mut files: HashMap<Key, (String, PathBuf, Result<elf::Parsed, SkipReason>)> = HashMap::new();
        for obj in snapshot.iter().filter(|o| !known.contains(&o.key())) {
            let path = file_path(obj);
            let parsed = match &path {
                // Inside the loader (see `loaded::LoaderHeld`), the objects
                // it is loading are not relocated yet: their site
                // addresses come from the file.
                Some(p) if loaded::inside_loader() && !obj.is_main => elf::parse(p).map(|mut parsed| {
                    parsed.links = elf::link_values(p, &parsed.tables);
                    parsed
                }),
                Some(p) => elf::parse(p),
                None => Err(SkipReason::NoFile),
            };
            let path = path.unwrap_or_default();
            files.insert(obj.key(), (display_name(obj, &path), path, parsed));
        }
        // 3. Under the lock: keep the known modules still listed, read the
        //    memory of the new ones.  Objects loaded after the snapshot
        //    wait for the next refresh.
        let mut next_id = self.next_id;
        let (still, new, skipped, subs) = loaded::with_loaded(|set| {
            let mut still = HashSet::new();
            let mut new = Vec::new();
            let mut skipped = Vec::new();
            for live in set.iter() {
                let key = live.obj.key();
                if known.contains(&key) {
                    still.insert(key);
                    continue;
                }
                let Some((name, path, parsed)) = files.remove(&key) else { continue };
                let result = parsed.and_then(|p| {
                    let id = ModuleId(next_id);
                    let m = read_module(live, &p, spec, id, name.clone(), path)?;
                    next_id += 1;
                    Ok(m)
                });
                match result {
                    Ok(m) => new.push(m),
                    Err(reason) => skipped.push(Skipped { name, bias: live.obj.bias, reason }),
                }
            }
            (still, new, skipped, set.subs)
        });
        self.next_id = next_id;
        let (kept, removed): (Vec<Module>, Vec<Module>) =
            std::mem::take(&mut self.modules).into_iter().partition(|m| still.contains(&m.key));
        let changes = Changes {
            added: new.iter().map(|m| m.id).collect(),
            removed,
            unloaded: self.subs.map_or(0, |s| subs.wrapping_sub(s)),
        };
        self.modules = kept;
        self.modules.extend(new);
        self.skipped = skipped;
        self.subs = Some(subs);
        Ok(changes)
    }
}

/// The file to read for a loaded object, if it has one.
fn file_path(obj: &loaded::Loaded) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    if obj.is_main {
        return Some(PathBuf::from("/proc/self/exe"));
    }
    // The loader names libraries by the path it opened; a bare name (the
    // vDSO's soname) is no file.
    if !obj.name.contains(&b'/') {
        return None;
    }
    Some(PathBuf::from(std::ffi::OsStr::from_bytes(&obj.name)))
}

fn display_name(obj: &loaded::Loaded, path: &std::path::Path) -> String {
    if obj.is_main {
        if let Ok(exe) = std::fs::read_link(path) {
            return exe.display().to_string();
        }
    }
    String::from_utf8_lossy(&obj.name).into_owned()
}

/// The distinct NOP instructions of the spec's forms (each form's
/// shortest repeating unit): what a run of reserved NOPs may consist of.
fn nop_units(spec: &Spec) -> Vec<&[u8]> {
    let mut units: Vec<&[u8]> = Vec::new();
    for form in &spec.nops {
        let n = form.len();
        let p = (1..=n).find(|p| n % p == 0 && form.chunks(*p).all(|c| c == &form[..*p])).unwrap_or(n);
        if !units.contains(&&form[..p]) {
            units.push(&form[..p]);
        }
    }
    units
}

/// True if `bytes` is a sequence of NOP units.
fn all_nops(bytes: &[u8], units: &[&[u8]]) -> bool {
    // reach[i]: bytes[..i] is a sequence of units.
    let mut reach = vec![false; bytes.len() + 1];
    reach[0] = true;
    for i in 0..bytes.len() {
        if reach[i] {
            for u in units {
                if bytes[i..].starts_with(u) {
                    reach[i + u.len()] = true;
                }
            }
        }
    }
    reach[bytes.len()]
}

/// Whether the file defines the unwinder's throw itself ([`Module::own_unwinder`]).
fn has_own_unwinder(file: &elf::Parsed) -> bool {
    file.symbols.iter().any(|s| s.name == "_Unwind_RaiseException")
}

/// Reads a new module's tables and sites (under the loader lock).
fn read_module(
    live: Live<'_>,
    file: &elf::Parsed,
    spec: &Spec,
    id: ModuleId,
    name: String,
    path: PathBuf,
) -> Result<Module, SkipReason> {
    let obj = live.obj;
    let loads: Vec<_> = obj.segments.iter().filter(|s| s.is_load()).copied().collect();
    if loads != file.loads {
        return Err(SkipReason::Mismatch);
    }
    let mut module = Module {
        id,
        name,
        path,
        is_main: obj.is_main,
        bias: obj.bias,
        dev: file.dev,
        inode: file.inode,
        text: obj.text_ranges(),
        sites: Vec::new(),
        refused: Vec::new(),
        null_entries: 0,
        unlisted: 0,
        own_unwinder: has_own_unwinder(file),
        symbols: file.symbol_source,
        key: obj.key(),
    };
    let units = nop_units(spec);
    let mut entries = 0;
    let mut unrelocated = 0;
    for (i, table) in file.tables.iter().enumerate() {
        let table_name = elf::TABLES.iter().find(|(_, k)| *k == table.kind).map_or("?", |(n, _)| n);
        let addr = obj.bias.wrapping_add(table.addr as usize);
        let bytes = live.read(addr, table.size as usize).ok_or(SkipReason::TableOutsideSegments(table_name))?;
        let records: Vec<usize> = match file.links.as_ref().and_then(|l| l.get(i)) {
            // What the loader's relocation will write (link-time address
            // + bias; 0 stays 0, a null entry).
            Some(link) => link.iter().map(|&v| if v == 0 { 0 } else { obj.bias.wrapping_add(v as usize) }).collect(),
            None => bytes.chunks_exact(8).map(|c| u64::from_ne_bytes(c.try_into().expect("8-byte chunk")) as usize).collect(),
        };
        for record in records {
            entries += 1;
            // Padding between tables of different objects, or an entry of a
            // function the linker discarded (link address 0).
            if record == 0 || record == obj.bias {
                module.null_entries += 1;
                continue;
            }
            match classify(live, file, spec, &units, id, table.kind, record) {
                Ok(site) => module.sites.push(Site { own_unwinder: module.own_unwinder, ..site }),
                Err(refused) => {
                    if refused.reason == RefuseReason::OutsideText {
                        unrelocated += obj.in_text(record.wrapping_add(obj.bias), 1) as usize;
                    }
                    module.refused.push(refused);
                }
            }
        }
    }
    // Unrelocated tables hold zeros or link-time addresses (which the bias
    // would move into the text).  A non-PIE object needs no relocation.
    // (Pinning the library first makes this a second line of defence.)
    let valid = entries - module.null_entries;
    if obj.bias != 0 && entries > 0 && (valid == 0 || unrelocated > 0) {
        return Err(SkipReason::NotRelocated);
    }
    module.sites.sort_by_key(|s| s.addr);
    module.sites.dedup_by_key(|s| s.addr);
    module.refused.sort_by_key(|r| r.addr);
    module.refused.dedup_by_key(|r| r.addr);
    module.unlisted = unlisted(live, file, spec, &module);
    Ok(module)
}

/// The length of the landing pad (`endbr64`, `bti c`) a function at
/// `start` begins with, 0 if none: its site follows the pad.
fn landing_pad_len(live: Live<'_>, start: usize) -> usize {
    arch::landing_pads().iter().find(|p| live.read(start, p.len()).is_some_and(|b| b == **p)).map_or(0, |p| p.len())
}

/// Functions of `file` whose entry (after a landing pad) holds a site's
/// NOPs and is not one of `module`'s sites (see [`Module::unlisted`]).
fn unlisted(live: Live<'_>, file: &elf::Parsed, spec: &Spec, module: &Module) -> usize {
    let obj = live.obj;
    file.symbols
        .iter()
        .filter(|s| s.size as usize >= spec.site_len)
        .filter(|s| {
            let start = obj.bias.wrapping_add(s.start as usize);
            let at = start + landing_pad_len(live, start);
            obj.in_text(at, spec.site_len)
                && module.sites.binary_search_by_key(&at, |x| x.addr).is_err()
                && module.refused.binary_search_by_key(&at, |r| r.addr).is_err()
                && live.read(at, spec.site_len).is_some_and(|b| spec.nops.contains(&b))
        })
        .count()
}

/// Turns one recorded address into a site, or says why it is refused.
fn classify(
    live: Live<'_>,
    file: &elf::Parsed,
    spec: &Spec,
    units: &[&[u8]],
    module: ModuleId,
    kind: SiteKind,
    record: usize,
) -> Result<Site, Refused> {
    let obj = live.obj;
    let refuse = |addr, symbol: Option<&elf::FuncSym>, offset, found, reason| Refused {
        addr,
        module,
        symbol: symbol.map(|s| s.name.clone()),
        offset_in_symbol: offset,
        found,
        reason,
        kind,
    };
    if !obj.in_text(record, 1) {
        return Err(refuse(record, None, 0, Vec::new(), RefuseReason::OutsideText));
    }
    let link = record.wrapping_sub(obj.bias) as u64;
    let sym_addr = |s: &elf::FuncSym| obj.bias.wrapping_add(s.start as usize);
    let (symbol, addr, pre_entry) = match elf::place(&file.symbols, link, MAX_PRE_ENTRY) {
        elf::Place::Inside(s) => (Some(s), record, 0),
        elf::Place::Before(s) => {
            let start = sym_addr(s);
            let pre = live.read(record, start - record).unwrap_or_default();
            let pad = landing_pad_len(live, start);
            if all_nops(&pre, units) {
                (Some(s), start + pad, start - record)
            } else if file.symbol_source == SymbolSource::Symtab {
                // With a full symbol table the gap before a function is
                // its reserved NOPs.
                return Err(refuse(start + pad, Some(s), pad, pre, RefuseReason::PreEntryNotNop));
            } else {
                // Only exported symbols: the record is likely inside an
                // unnamed (static) function.
                (None, record, 0)
            }
        }
        elf::Place::Unknown => (None, record, 0),
    };
    let offset = symbol.map_or(0, |s| addr - sym_addr(s));
    let len = spec.site_len;
    let found = match live.read(addr, len) {
        Some(b) if obj.in_text(addr, len) => b,
        _ => return Err(refuse(addr, symbol, offset, Vec::new(), RefuseReason::OutsideText)),
    };
    if !spec.nops.contains(&found) {
        return Err(refuse(addr, symbol, offset, found, RefuseReason::NotNop));
    }
    if symbol.is_some_and(|s| s.st_other & spec.raw.site.refuse_st_other != 0) {
        return Err(refuse(addr, symbol, offset, found, RefuseReason::CallingConvention));
    }
    if symbol.is_some_and(|s| is_tracer_code(&s.name)) {
        return Err(refuse(addr, symbol, offset, found, RefuseReason::TracerCode));
    }
    // own_unwinder is the module's, set by read_module.
    Ok(Site { addr, record, pre_entry, module, symbol: symbol.map(|s| s.name.clone()), own_unwinder: false, offset_in_symbol: offset, kind, demangled: Default::default() })
}

/// The crates the runtime is built from, as their names appear in Rust
/// symbols (legacy `_ZN14ftramp_runtime…` and v0 `_R…14ftramp_runtime…`
/// alike, and generic code instantiated for their types).
const TRACER_CRATES: [&str; 3] = ["ftramp_runtime", "ftramp_codegen", "ftramp_demangle"];

/// Whether the raw symbol `name` is the tracer's own code: a function of the
/// runtime's crates, or one of Rust's allocator shims, which it calls while
/// patching.  A program that embeds the runtime and builds its whole crate
/// graph with patchable entries (the README's nightly recipe) gives them
/// sites; patching or tracing them makes the tracer run into itself (until
/// the twenty-seventh session, registering an ops for every function ended
/// such a program in a stack overflow, SIGSEGV or SIGTRAP).  Their sites are
/// refused, as the kernel builds its tracer `notrace`.
pub fn is_tracer_code(name: &str) -> bool {
    const SHIMS: [&str; 6] = ["__rust_alloc", "__rust_dealloc", "__rust_realloc", "__rust_no_alloc_shim_is_unstable", "__rdl_", "__rg_"];
    // (Recent rustc mangles the shims as v0 paths of the crate `__rustc`:
    // `_RNvCs…_7___rustc12___rust_alloc`.)
    SHIMS.iter().any(|p| name.starts_with(p)) || name.contains("7___rustc") || TRACER_CRATES.iter().any(|c| name.contains(c))
}

/// Rewrites multi-instruction NOP sites into the cheapest equivalent NOP
/// (as Linux's `ftrace_init_nop`), so an unpatched site costs as little as
/// possible: on x86_64 gcc's five `nop`s become one 5-byte `nopl`; where
/// the architecture has nothing to rewrite this does nothing.
///
/// Only sites of modules still loaded are touched (see
/// [`Discovery::while_loaded`]), and only those still holding the form
/// being replaced (so an enabled site is left alone).  The rewrite goes
/// through [`patch::replace_text_batch`]: one protection change per run of
/// adjacent pages, and the live patching protocol, so threads may be
/// running the sites meanwhile (an architecture with rewrites must have a
/// live protocol; a unit test checks it).  It is cheapest at start-up,
/// before other threads exist.
pub fn optimize_nops(discovery: &Discovery) -> Result<NopStats, RuntimeError> {
    let total = discovery.sites().count();
    let rules = arch::nop_rewrites();
    if rules.is_empty() {
        return Ok(NopStats { rewritten: 0, unchanged: total });
    }
    let len = host_spec().site_len;
    discovery.while_loaded(|modules| {
        let mut rewritten = 0;
        for (from, to) in rules {
            let edits: Vec<TextEdit<'_>> = modules
                .iter()
                .flat_map(|m| m.sites.iter())
                // The module is listed and the list locked, so its text
                // is mapped.
                .filter(|s| patch::read_text(s.addr, len) == *from)
                .map(|s| TextEdit { addr: s.addr, expect: from, new: to })
                .collect();
            if !edits.is_empty() {
                rewritten += edits.len() - patch::replace_text_batch(&edits)?.len();
            }
        }
        Ok(NopStats { rewritten, unchanged: total - rewritten })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site_named(symbol: Option<&str>) -> Site {
        Site {
            addr: 0x1004,
            record: 0x1004,
            pre_entry: 0,
            module: ModuleId(0),
            symbol: symbol.map(str::to_string),
            own_unwinder: false,
            offset_in_symbol: 4,
            kind: SiteKind::PatchableEntry,
            demangled: Default::default(),
        }
    }

    /// The runtime's own functions, generic code instantiated for its types and
    /// Rust's allocator shims are the tracer's; the program's are not.
    #[test]
    fn the_tracers_own_code_is_told_apart() {
        for own in [
            "_ZN14ftramp_runtime5patch7Patcher5apply17h0123456789abcdefE",
            "_RNvNtCs1234_14ftramp_runtime6fgraph4push",
            "_ZN4core3ptr62drop_in_place$LT$ftramp_runtime..ops..Ops$GT$17h0123456789abcdefE",
            "_ZN14ftramp_codegen4emit17h0123456789abcdefE",
            "__rust_alloc",
            "__rust_no_alloc_shim_is_unstable_v2",
            "__rdl_alloc",
            "_RNvCseulmdZsCeCG_7___rustc35___rust_no_alloc_shim_is_unstable_v2",
            "_RNvCseulmdZsCeCG_7___rustc12___rust_alloc",
        ] {
            assert!(is_tracer_code(own), "{own}");
        }
        for program in ["main", "_ZN3pfe2cb17h0123456789abcdefE", "_ZN5alloc3vec12Vec$LT$T$GT$4push17h0123456789abcdefE", "rust_alloc_counter", "ftramp"] {
            assert!(!is_tracer_code(program), "{program}");
        }
    }

    /// Filters match the name replay shows as well as the raw symbol, so a
    /// name copied from a replay selects its function at record time.
    #[test]
    fn filters_match_the_raw_symbol_or_the_name_replay_shows() {
        use crate::ops::Filter;
        let f = |items: &[&str]| items.iter().fold(Filter::new(), |f, i| f.parse(i).unwrap());
        let cpp = site_named(Some("_ZN2ns5parseEPKc"));
        let rust = site_named(Some("_ZN7mycrate6worker3run17h0123456789abcdefE"));
        let rust_v0 = site_named(Some("_RNvCs1234_7mycrate3foo"));
        let c = site_named(Some("parse"));
        let anonymous = site_named(None);
        assert_eq!(cpp.demangled(), Some("ns::parse"));
        for (filter, hits) in [
            (f(&["ns::parse"]), [true, false, false, false]),
            (f(&["ns::*"]), [true, false, false, false]),
            (f(&["*::parse"]), [true, false, false, false]),
            (f(&["parse"]), [false, false, false, true]),
            (f(&["*parse*"]), [true, false, false, true]),
            (f(&["_ZN2ns5parseEPKc"]), [true, false, false, false]),
            (f(&["mycrate::*"]), [false, true, true, false]),
            (f(&["mycrate::worker::run"]), [false, true, false, false]),
            // The hash and parameters are not part of the name.
            (f(&["*17h0123456789abcdef*"]), [false, true, false, false]),
            (f(&["ns::parse(char const*)"]), [false, false, false, false]),
            (f(&["0x1000"]), [true, true, true, true]),
        ] {
            let got = [&cpp, &rust, &rust_v0, &c].map(|s| filter.matches(s));
            assert_eq!(got, hits, "{filter:?}");
            assert!(!filter.matches(&anonymous) || got == [true; 4], "{filter:?} matched a site without a symbol");
        }
    }

    /// A name as replay shows it is a filter that selects it, also with `[`
    /// (slices: `[u8]` is a glob class besides) or `{closure#0}` (braces are
    /// plain characters, in globs too), and a legacy Rust name whose symbol
    /// spells `::` as `..`: until the twenty-eighth session they matched nothing.
    #[test]
    fn filters_match_names_with_brackets_braces_and_legacy_paths() {
        use crate::ops::Filter;
        let f = |item: &str| Filter::new().parse(item).unwrap();
        let slice = site_named(Some("_RNvMCsdVKqR98ewWj_4miniINtB2_6HolderShE4showB2_"));
        let closure = site_named(Some("_RNCINvNtCsi4IsKQVxMg0_3std2rt10lang_startuE0CsdVKqR98ewWj_4mini"));
        let legacy = site_named(Some("_ZN52_$LT$smini..geo..Sq$u20$as$u20$smini..geo..Shape$GT$4area17ha227a8c9b283eb15E"));
        let operator = site_named(Some("_ZNSt6vectorIiSaIiEEixEm"));
        assert_eq!(slice.demangled(), Some("<mini::Holder<[u8]>>::show"));
        assert_eq!(closure.demangled(), Some("std::rt::lang_start::<()>::{closure#0}"));
        assert_eq!(legacy.demangled(), Some("<smini::geo::Sq as smini::geo::Shape>::area"));
        assert_eq!(operator.demangled(), Some("std::vector<int, std::allocator<int> >::operator[]"));
        for (filter, hits) in [
            ("<mini::Holder<[u8]>>::show", [true, false, false, false]),
            ("<mini::Holder<\\[u8\\]>>::show", [true, false, false, false]),
            // In a glob that is not the name itself, `[u8]` is a class: `\[` is a plain `[`.
            ("<mini::Holder<[u8]>>::*", [false, false, false, false]),
            ("<mini::Holder<\\[u8\\]>>::*", [true, false, false, false]),
            ("std::rt::lang_start::<()>::{closure#0}", [false, true, false, false]),
            ("std::rt::*::{closure#0}", [false, true, false, false]),
            ("std::rt::*::{closure#1}", [false, false, false, false]),
            ("<smini::geo::Sq?as?smini::geo::Shape>::area", [false, false, true, false]),
            ("<smini::*>::area", [false, false, true, false]),
            ("*::operator[]", [false, false, false, true]),
        ] {
            let got = [&slice, &closure, &legacy, &operator].map(|s| f(filter).matches(s));
            assert_eq!(got, hits, "{filter}");
        }
    }

    #[test]
    fn nop_units_of_every_spec() {
        for arch in ["x86_64", "aarch64", "riscv64", "ppc64le", "s390x"] {
            let Ok(spec) = Spec::builtin(arch) else { continue };
            let units = nop_units(&spec);
            assert!(!units.is_empty());
            for form in &spec.nops {
                assert!(all_nops(form, &units), "{arch}: {form:02x?}");
            }
        }
        let x86 = Spec::builtin("x86_64").unwrap();
        let units = nop_units(&x86);
        assert!(units.contains(&&[0x90u8][..]));
        assert!(all_nops(&[0x90; 8], &units));
        assert!(!all_nops(&[0x90, 0x90, 0xc3], &units));
        assert!(all_nops(&[], &units));
    }

    #[test]
    fn place_inside_before_unknown() {
        let syms = vec![
            elf::FuncSym::new(0x1000, 0x20, "f"),
            elf::FuncSym::new(0x1040, 0x10, "g"),
            elf::FuncSym::new(0x1100, 0, "h"),
        ];
        assert!(matches!(elf::place(&syms, 0x1000, 64), elf::Place::Inside(s) if s.name == "f"));
        assert!(matches!(elf::place(&syms, 0x1004, 64), elf::Place::Inside(s) if s.name == "f"));
        assert!(matches!(elf::place(&syms, 0x1038, 64), elf::Place::Before(s) if s.name == "g"));
        assert!(matches!(elf::place(&syms, 0x1100, 64), elf::Place::Inside(s) if s.name == "h"));
        assert!(matches!(elf::place(&syms, 0x1080, 16), elf::Place::Unknown));
        assert!(matches!(elf::place(&syms, 0x10, 64), elf::Place::Unknown));
        assert!(matches!(elf::place(&[], 0x10, 64), elf::Place::Unknown));
    }
}
