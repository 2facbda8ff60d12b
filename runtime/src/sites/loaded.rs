//! The loader's list of loaded objects, and reads of their memory while
//! that list cannot change.
//!
//! glibc's `dl_iterate_phdr` holds the loader's `dl_load_write_lock` for
//! the whole iteration (taken recursively, so a callback may iterate
//! again), and `dlclose` takes the same lock to unlink an object from the
//! list *before* it unmaps the object's segments.  Hence, while a callback
//! runs, every object the loader reports is mapped and stays mapped.
//! [`with_loaded`] runs a closure inside such a callback with a snapshot
//! of the list ([`LoadedSet`]); memory of a loaded object is only read
//! through that set ([`Live::read`]), and only inside one of the object's
//! readable `PT_LOAD` segments.  A `LoadedSet` cannot leave the closure,
//! so no read can happen after the lock is released.
//!
//! The closure must not call `dlopen`/`dlclose` and must not wait for a
//! thread that might (or that unwinds a panic: the unwinder iterates the
//! same list), or it deadlocks.
//!
//! An object appears in the list before the loader has applied its
//! relocations (glibc adds it while mapping, relocates later); callers
//! check what they read against the object's segments (see
//! `SkipReason::NotRelocated`).

use std::ffi::CStr;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::{Relaxed, SeqCst}};

/// One program header of a loaded object, as the loader reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Segment {
    pub p_type: u32,
    pub flags: u32,
    pub offset: u64,
    pub vaddr: u64,
    pub filesz: u64,
    pub memsz: u64,
}

impl Segment {
    pub fn is_load(&self) -> bool {
        self.p_type == libc::PT_LOAD
    }
    pub fn readable(&self) -> bool {
        self.flags & libc::PF_R != 0
    }
    pub fn executable(&self) -> bool {
        self.flags & libc::PF_X != 0
    }
}

/// Identity of a loaded object between two iterations: the same name,
/// load bias and program-header address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    pub name: Vec<u8>,
    pub bias: usize,
    pub phdr: usize,
}

/// One object of the loader's list (a copy: holding it keeps nothing
/// mapped).
#[derive(Debug, Clone)]
pub(crate) struct Loaded {
    /// `dlpi_name`: empty for the main program, a path for libraries, a
    /// bare soname for the vDSO.
    pub name: Vec<u8>,
    pub bias: usize,
    pub phdr: usize,
    pub segments: Vec<Segment>,
    /// The main program (its program headers are `AT_PHDR`).
    pub is_main: bool,
}

impl Loaded {
    pub fn key(&self) -> Key {
        Key { name: self.name.clone(), bias: self.bias, phdr: self.phdr }
    }

    /// The `PT_LOAD` segment holding `[addr, addr + len)` in memory.
    pub fn segment_of(&self, addr: usize, len: usize) -> Option<&Segment> {
        let end = addr.checked_add(len)?;
        self.segments.iter().find(|s| {
            let start = self.bias.wrapping_add(s.vaddr as usize);
            s.is_load() && start <= addr && end <= start.saturating_add(s.memsz as usize)
        })
    }

    /// True if `[addr, addr + len)` lies inside one executable, readable
    /// `PT_LOAD` segment.
    pub fn in_text(&self, addr: usize, len: usize) -> bool {
        self.segment_of(addr, len).is_some_and(|s| s.executable() && s.readable())
    }

    /// In-memory ranges of the executable `PT_LOAD` segments.
    pub fn text_ranges(&self) -> Vec<std::ops::Range<usize>> {
        self.segments
            .iter()
            .filter(|s| s.is_load() && s.executable())
            .map(|s| {
                let start = self.bias.wrapping_add(s.vaddr as usize);
                start..start.saturating_add(s.memsz as usize)
            })
            .collect()
    }
}

/// The loader's list, valid only while the loader lock is held.
pub(crate) struct LoadedSet {
    objects: Vec<Loaded>,
    /// `dlpi_adds` / `dlpi_subs`: objects ever loaded / unloaded.
    pub adds: u64,
    pub subs: u64,
}

/// An object of a [`LoadedSet`]: its memory may be read.
#[derive(Clone, Copy)]
pub(crate) struct Live<'a> {
    pub obj: &'a Loaded,
    /// Ties the borrow to the set, which only exists under the lock.
    _set: &'a LoadedSet,
}

impl LoadedSet {
    pub fn objects(&self) -> &[Loaded] {
        &self.objects
    }

    pub fn iter(&self) -> impl Iterator<Item = Live<'_>> {
        self.objects.iter().map(move |obj| Live { obj, _set: self })
    }
}

impl Live<'_> {
    /// Reads `len` bytes at `addr`, or `None` unless the range lies inside
    /// one readable `PT_LOAD` segment of this object.
    pub fn read(&self, addr: usize, len: usize) -> Option<Vec<u8>> {
        if !self.obj.segment_of(addr, len)?.readable() {
            return None;
        }
        Some(
            (0..len)
                // SAFETY: the object is in the loader's list and the lock
                // is held (a `Live` only exists inside `with_loaded`), so
                // its PT_LOAD segments are mapped — the loader maps every
                // one whole, `memsz` included — and this one is readable.
                // Volatile byte reads: the bytes may be code that a
                // patcher rewrites concurrently; we only copy them.
                .map(|i| unsafe { std::ptr::read_volatile((addr + i) as *const u8) })
                .collect(),
        )
    }
}

/// The loader's counters (`dlpi_adds`, `dlpi_subs`), read from the first
/// object `dl_iterate_phdr` reports: no list is collected, so checking
/// for a `dlopen` costs one short call (the module watcher every 10 ms,
/// the recorder's `dlsym`).
pub(crate) fn generation() -> (u64, u64) {
    let _section = ForkSection::enter();
    /// # Safety
    /// Only as `dl_iterate_phdr`'s callback, with `data` the `Option` below.
    unsafe extern "C" fn first(info: *mut libc::dl_phdr_info, size: usize, data: *mut libc::c_void) -> libc::c_int {
        // SAFETY: `data` is the `Option` that `generation` passed and keeps
        // alive for the call; `info` is the loader's, valid during the
        // callback, and holds the counters when `size` covers them.
        unsafe {
            if size >= std::mem::offset_of!(libc::dl_phdr_info, dlpi_subs) + 8 {
                *(data as *mut Option<(u64, u64)>) = Some(((*info).dlpi_adds, (*info).dlpi_subs));
            }
        }
        1 // stop after the first object
    }
    let mut out: Option<(u64, u64)> = None;
    // SAFETY: `first` matches the callback signature and never unwinds;
    // `out` outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(first), &mut out as *mut Option<(u64, u64)> as *mut libc::c_void) };
    out.unwrap_or((0, 0))
}

/// Runs `f` with the loader's list while the loader lock is held (see the
/// module documentation for what `f` must not do).  A panic in `f` is
/// carried across the C callback and resumed here.
pub(crate) fn with_loaded<F: FnOnce(&LoadedSet) -> R, R>(f: F) -> R {
    let _section = ForkSection::enter();
    struct Outer<F, R> {
        f: Option<F>,
        result: Option<std::thread::Result<R>>,
    }

    /// # Safety
    /// Only as `dl_iterate_phdr`'s callback, with `data` the `Outer` below.
    unsafe extern "C" fn outer<F: FnOnce(&LoadedSet) -> R, R>(
        _info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: `data` is the `Outer` that `with_loaded` passed and
        // keeps alive for the whole call; no one else accesses it.
        let state = unsafe { &mut *(data as *mut Outer<F, R>) };
        if let Some(f) = state.f.take() {
            // The lock is held now; take the whole list (the nested call
            // takes the recursive lock again) and run `f` before returning.
            state.result = Some(catch_unwind(AssertUnwindSafe(|| {
                let set = collect();
                f(&set)
            })));
        }
        1 // stop: `f` has run
    }

    let mut state = Outer { f: Some(f), result: None };
    // SAFETY: `outer` matches the callback signature, and `state` outlives
    // the call; the callback never unwinds (panics are caught).
    unsafe { libc::dl_iterate_phdr(Some(outer::<F, R>), &mut state as *mut Outer<F, R> as *mut libc::c_void) };
    match state.result {
        Some(Ok(r)) => r,
        Some(Err(panic)) => resume_unwind(panic),
        // The loader always reports at least the main program; if it did
        // not, there is nothing loaded to protect.
        None => {
            let f = state.f.take().expect("the callback did not run");
            f(&LoadedSet { objects: Vec::new(), adds: 0, subs: 0 })
        }
    }
}

/// Copies the loader's list.  Call only with the loader lock held (from a
/// `dl_iterate_phdr` callback) for the copy to mean anything.
fn collect() -> LoadedSet {
    let mut set = LoadedSet { objects: Vec::new(), adds: 0, subs: 0 };

    /// # Safety
    /// Only as `dl_iterate_phdr`'s callback, with `data` the set above.
    unsafe extern "C" fn each(info: *mut libc::dl_phdr_info, size: usize, data: *mut libc::c_void) -> libc::c_int {
        // SAFETY: `data` is the `LoadedSet` `collect` passed, alive and
        // unaliased for the whole call.
        let set = unsafe { &mut *(data as *mut LoadedSet) };
        let result = catch_unwind(AssertUnwindSafe(|| {
            // SAFETY: the loader passes a valid `dl_phdr_info` for the
            // duration of the callback; `dlpi_name` is a NUL-terminated
            // string (or null) and `dlpi_phdr` points to `dlpi_phnum`
            // program headers inside the object's mapped image.
            let info = unsafe { &*info };
            let name = if info.dlpi_name.is_null() {
                Vec::new()
            } else {
                // SAFETY: see above.
                unsafe { CStr::from_ptr(info.dlpi_name) }.to_bytes().to_vec()
            };
            let phdrs: &[libc::Elf64_Phdr] = if info.dlpi_phdr.is_null() {
                &[]
            } else {
                // SAFETY: see above.
                unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) }
            };
            let segments = phdrs
                .iter()
                .map(|p| Segment {
                    p_type: p.p_type,
                    flags: p.p_flags,
                    offset: p.p_offset,
                    vaddr: p.p_vaddr,
                    filesz: p.p_filesz,
                    memsz: p.p_memsz,
                })
                .collect();
            // The counters exist when the loader's struct is that large.
            if size >= std::mem::offset_of!(libc::dl_phdr_info, dlpi_subs) + 8 {
                set.adds = info.dlpi_adds;
                set.subs = info.dlpi_subs;
            }
            set.objects.push(Loaded {
                name,
                bias: info.dlpi_addr as usize,
                phdr: info.dlpi_phdr as usize,
                segments,
                is_main: info.dlpi_phdr as usize == main_phdr(),
            });
        }));
        // A panic (allocation failure) ends the iteration; the objects
        // collected so far are kept.
        result.is_err() as libc::c_int
    }

    // SAFETY: `each` matches the callback signature and never unwinds;
    // `set` outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(each), &mut set as *mut LoadedSet as *mut libc::c_void) };
    set
}

/// The thread inside the loader (`pthread_self`, 0: none): see
/// [`LoaderHeld`].  One slot is enough, as the loader makes one such call
/// at a time, under its lock; it is not a thread-local, so that reading it
/// never goes through `__tls_get_addr` (which a sanitizer runtime
/// intercepts, and cannot serve early in a process).
static LOADER_THREAD: AtomicUsize = AtomicUsize::new(0);

/// Marks the calling thread as running inside the dynamic loader, in the
/// middle of a `dlopen` (an `LD_AUDIT` module's `la_activity`, called
/// with the loader's lock held after the new objects are mapped and
/// before they are relocated or initialised), until dropped.  Meanwhile:
///
/// * the site tables of the objects being loaded are not relocated yet,
///   so discovery takes their addresses from the file
///   ([`inside_loader`]);
/// * [`wait_for_loader`] does nothing: the lock is this thread's, and a
///   `dlopen` made there would fail glibc's assertion that the namespace
///   is consistent.
pub struct LoaderHeld(usize);

impl LoaderHeld {
    /// Marks the calling thread until the value is dropped.  Only call it
    /// where the loader calls this thread in the middle of a `dlopen` (an
    /// audit module's `la_activity`).
    pub fn enter() -> LoaderHeld {
        LoaderHeld(LOADER_THREAD.swap(crate::thread::pthread_id(), SeqCst))
    }
}

impl Drop for LoaderHeld {
    fn drop(&mut self) {
        LOADER_THREAD.store(self.0, SeqCst);
    }
}

/// Whether the calling thread is inside a `dlopen` (see [`LoaderHeld`]).
pub(crate) fn inside_loader() -> bool {
    LOADER_THREAD.load(SeqCst) == crate::thread::pthread_id()
}

/// Returns once no `dlopen` or `dlclose` is in progress on another thread
/// (it takes and releases the loader's lock, `dl_load_lock`, which those
/// hold until they are done: relocated, initialised, unmapped).  Nothing
/// inside the loader ([`LoaderHeld`]).  Call it holding no lock a thread
/// inside the loader may want (the engine's, the recorder's state): the
/// audit module's hook takes them there.
///
/// Nor while the program is still starting (`ftramp record` starts its
/// threads at the audit module's start-up checkpoint, inside the loader's
/// start-up, which holds no lock): a `dlopen` before the loader has
/// declared the program's namespace consistent fails glibc's assertion
/// `r_state == RT_CONSISTENT` and kills the process.  Nothing can be in
/// progress then but the start-up itself, and the callers' refresh skips
/// what is not relocated yet.  The start-up is over when the loader runs
/// the constructors ([`STARTED`]); later, a `dlopen` in progress holds
/// the loader's lock, which the wait's `dlopen` takes only once it is
/// done (its constructors included: a library patched while they run,
/// before its unwinder hooks exist, saw its initialiser's exceptions end
/// in `std::terminate`).
pub fn wait_for_loader() {
    if inside_loader() || !STARTED.load(SeqCst) {
        return;
    }
    let _section = ForkSection::enter();
    // SAFETY: dlopen of the main program (a null name) with RTLD_NOLOAD
    // loads nothing and runs no constructor (an object already open is
    // only counted); its handle is closed at once, and the main program is
    // never unloaded.
    unsafe {
        let h = libc::dlopen(std::ptr::null(), libc::RTLD_LAZY | libc::RTLD_NOLOAD);
        if !h.is_null() {
            libc::dlclose(h);
        }
    }
}

/// A section of the runtime's that takes locks a `fork` child must not
/// find held: calls into the loader (`dl_iterate_phdr`, the `dlopen` of
/// [`wait_for_loader`]) and the work around them (refreshing the engine
/// after a `dlopen`, the module hooks, which take the engine's, fgraph's
/// and the unwinder's locks).
///
/// `dl_iterate_phdr` holds the loader's `dl_load_write_lock`, which glibc
/// does not reset in a fork child, and the runtime's own locks are plain
/// mutexes: a program thread's `fork` while the module watcher (or the
/// recorder's writer, or another thread's `dlsym` check) was inside one
/// gave a child whose first `dl_iterate_phdr` or module refresh — its own
/// writer's, its `dlsym` check's, an exception's — waited for good (1–2 %
/// of the forks that follow a `dlopen`, seen with CPython's `subprocess`).
/// So the runtime's prepare handler ([`fork_prepare`], registered before
/// the recorder's, so that it runs after it and after every lock the
/// recorder's takes) waits until no section is in progress and keeps new
/// ones waiting until the fork is done.  Sections nest: a thread already
/// inside one goes on.  No thread-local (a sanitizer runtime serves
/// `__tls_get_addr` late): the holders are `pthread_self` values in a few
/// slots.  If sections do not drain within a second (one waiting for
/// something the forking thread holds) the fork goes ahead as before.
pub(crate) struct ForkSection {
    slot: Option<usize>,
}

const FORK_SECTION_SLOTS: usize = 16;
static FORK_SECTIONS: [AtomicUsize; FORK_SECTION_SLOTS] = [const { AtomicUsize::new(0) }; FORK_SECTION_SLOTS];
/// A `fork` is between its prepare handler and its return.
static FORKING: AtomicBool = AtomicBool::new(false);

impl ForkSection {
    /// (Outside a fork — nearly always — a nested section takes a slot of
    /// its own rather than look for its thread's: the scan is left to
    /// the waiting path, which must not wait for its own thread.)
    pub(crate) fn enter() -> ForkSection {
        install_fork_handlers();
        let me = crate::thread::pthread_id();
        loop {
            if !FORKING.load(SeqCst) {
                let slot = FORK_SECTIONS.iter().position(|c| c.compare_exchange(0, me, SeqCst, Relaxed).is_ok());
                if let Some(i) = slot {
                    // (Seen by `fork_prepare`, or it is seen here.)
                    if !FORKING.load(SeqCst) {
                        return ForkSection { slot: Some(i) };
                    }
                    FORK_SECTIONS[i].store(0, SeqCst);
                }
            }
            if FORK_SECTIONS.iter().any(|c| c.load(SeqCst) == me) {
                // Inside a section of this thread's, which the fork waits
                // for: go on.
                return ForkSection { slot: None };
            }
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
    }
}

impl Drop for ForkSection {
    fn drop(&mut self) {
        if let Some(i) = self.slot {
            FORK_SECTIONS[i].store(0, SeqCst);
        }
    }
}

/// Registers [`fork_prepare`] and its parent and child handlers (see
/// [`ForkSection`]), once.
/// The recorder calls it before registering its own, so that this one's
/// prepare runs after the recorder's (prepare handlers run in the reverse
/// order of registration).
pub fn install_fork_handlers() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers handlers that live as long as the process (the
        // runtime is never unloaded while it has threads).
        unsafe { libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child)) };
    });
}

extern "C" fn fork_prepare() {
    FORKING.store(true, SeqCst);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    // (A section of this thread's own — a signal handler forking on top of
    // it — cannot end before the fork: not waited for.)
    let me = crate::thread::pthread_id();
    let busy = || {
        FORK_SECTIONS.iter().any(|c| {
            let h = c.load(SeqCst);
            h != 0 && h != me
        })
    };
    while busy() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_micros(100));
    }
}

extern "C" fn fork_parent() {
    FORKING.store(false, SeqCst);
}

extern "C" fn fork_child() {
    // The other threads, and their calls, are gone.
    for c in &FORK_SECTIONS {
        c.store(0, SeqCst);
    }
    FORKING.store(false, SeqCst);
}

/// Set by the runtime's constructor: the loader runs constructors once the
/// program's start-up is over (or, in a library loaded with `dlopen`,
/// inside that `dlopen`, where no start-up is in progress either).
static STARTED: AtomicBool = AtomicBool::new(false);

#[used]
#[cfg_attr(target_os = "linux", link_section = ".init_array")]
static MARK_STARTED: extern "C" fn() = {
    extern "C" fn mark() {
        STARTED.store(true, SeqCst);
    }
    mark
};

/// The main program's program headers (`AT_PHDR`).
fn main_phdr() -> usize {
    // SAFETY: getauxval only reads the auxiliary vector.
    unsafe { libc::getauxval(libc::AT_PHDR) as usize }
}
