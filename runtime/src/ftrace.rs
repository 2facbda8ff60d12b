//! The engine: registered ops, the trampoline each site uses, and the
//! changes that keep the two in step.
//!
//! Per site the cheapest trampoline wins (issue #4, DESIGN §3.5):
//!
//! | ops tracing the site | site calls |
//! |---|---|
//! | none | nothing: the NOPs stay |
//! | one | a `direct` trampoline of that ops (its thunk and ops in data words; no list walk) |
//! | several | the `list` trampoline, whose [`dispatch::list_func`] looks the site up |
//!
//! (The generator also makes `multiN` trampolines that call N ops from
//! their own data words without a list walk.  The engine does not use them
//! yet: the grace period counts one dispatch guard per pass through a
//! trampoline, and a multi trampoline would take N.)
//!
//! The `regs` tier is used where an ops on the site asked for `SAVE_REGS`,
//! `args` elsewhere.  Trampolines live in [`JitImage`]s allocated next to
//! each module's text (within the site's branch reach): one list image per
//! module, one direct image per (module, ops, tier).
//!
//! Stub entry (x86_64, spec `site.stub`): a site does not `call` its
//! trampoline but `jmp`s to a 16-byte stub of its own that pushes the
//! address after the site and jumps to the trampoline (codegen
//! `program.rs`, "Stub entry": fgraph's hijacked returns are then
//! predicted).  Stubs are made per batch, one block per module, never
//! rewritten: a site that changes trampoline gets a new stub, and the old
//! block is freed after a grace period once no site uses it (a grace period
//! treats stub blocks as trampoline code).
//!
//! Order of a change (so no thread ever reaches freed memory):
//! registering builds images and publishes the new site table *before*
//! patching sites to them; unregistering patches sites away and publishes
//! the table *first*, then waits for a grace period ([`crate::grace`]), and
//! only then frees the ops' images and drops the runtime's reference to the
//! ops.  Objects whose grace period cannot be established (a thread that
//! never answers) are quarantined, never freed under a running thread.

use crate::dispatch::{self, SiteTable};
use crate::exec::{CodeBlock, JitImage};
use crate::ops::{Ops, OpsFlags};
use crate::patch::{Patcher, SiteChange};
use crate::sites::{Discovery, ModuleId, Refused, Site};
use crate::{grace, host_spec, RuntimeError};
use ftramp_codegen::arch::{self, STUB_LEN};
use ftramp_codegen::{image::Image, DataWord, Dispatch, SiteEntry, Tier, Variant};
use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::*};
use std::sync::{Arc, Mutex, OnceLock};

/// Why an ops could not be registered.
#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    #[error("ops {0:#x} is already registered")]
    AlreadyRegistered(usize),
    #[error("ops {0:#x} is not registered")]
    NotRegistered(usize),
    #[error("{site} is already traced by an IPMODIFY ops; at most one may redirect a function")]
    IpModifyConflict { site: String },
    #[error("no patchable site matches {0}")]
    NoSites(String),
    #[error("unknown ops flags {0:#x}")]
    UnknownFlags(u32),
    #[error("cannot (un)register from inside a callback")]
    FromCallback,
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}

/// What a site does now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SiteDispatch {
    Nop,
    /// A direct trampoline of one ops.
    Direct { tier: Tier },
    /// The list trampoline.
    List { tier: Tier },
}

#[derive(Clone, Copy, PartialEq, Eq)]
struct Target {
    dispatch: SiteDispatch,
    /// Trampoline address (0 for `Nop`).
    addr: usize,
}

const NOP: Target = Target { dispatch: SiteDispatch::Nop, addr: 0 };

struct SiteState {
    module: ModuleId,
    nop: Vec<u8>,
    current: Target,
    /// Stub entry: the stub the site jumps to (while `current` is not NOP).
    stub: Option<SiteStub>,
}

/// One site's stub ([`arch::Arch::site_stub`]) in a shared block.
struct SiteStub {
    block: Arc<CodeBlock>,
    at: usize,
}

/// How far from its first site a module's stub block may be placed: the
/// stubs must reach every site of the module and its trampolines with a
/// rel32, so well inside ±2 GiB.
const STUB_REACH: u64 = 1 << 28;

#[derive(Default)]
struct ModuleImages {
    list: Option<JitImage>,
    /// Keyed by (ops address, tier).
    direct: HashMap<(usize, Tier), JitImage>,
}

#[derive(Default)]
struct State {
    discovery: Option<Discovery>,
    ops: Vec<Arc<Ops>>,
    sites: BTreeMap<usize, SiteState>,
    images: HashMap<ModuleId, ModuleImages>,
    /// Things whose grace period could not be established.
    quarantine: Vec<Box<dyn Send>>,
    /// Stub blocks holding stubs that sites no longer jump to (freed by the
    /// next grace period once no site uses the block).
    dead_stubs: Vec<Arc<CodeBlock>>,
}

/// The process-wide ftrace.
pub struct Ftrace {
    state: Mutex<State>,
}

/// How often the module watcher looks for `dlopen`/`dlclose`.
pub const MODULE_WATCH_INTERVAL: std::time::Duration = std::time::Duration::from_millis(10);

/// The loader generation (adds, subs) the module watcher has handled: in a
/// fork child, whose watcher thread is gone, [`refresh_if_modules_changed`]
/// goes on from its parent's, so a `dlopen` the parent's watcher had not
/// handled yet is handled in the child too.
static SEEN_ADDS: AtomicU64 = AtomicU64::new(0);
static SEEN_SUBS: AtomicU64 = AtomicU64::new(0);

fn seen() -> (u64, u64) {
    (SEEN_ADDS.load(Relaxed), SEEN_SUBS.load(Relaxed))
}

fn set_seen(g: (u64, u64)) {
    SEEN_ADDS.store(g.0, Relaxed);
    SEEN_SUBS.store(g.1, Relaxed);
}

/// Starts (once) the thread that re-reads the loaded modules when the
/// loader's counters change, so libraries loaded with `dlopen` are traced
/// without a `refresh()` and unloaded ones are forgotten.  It only reads
/// the counters while no ops is registered.  Threads do not survive
/// `fork`: a child that loads libraries calls [`refresh_if_modules_changed`]
/// (the recorder's writer thread does) or `refresh()`; the runtime starts
/// no thread in a child by itself (qemu-user 7.2 aborts in a child of a
/// multi-threaded process that starts one, and a fork + exec should not pay
/// for one).
fn start_module_watch() {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        WATCHER_PID.store(std::process::id(), Relaxed);
        // Read here, not on the new thread: the caller has just read the
        // modules, and a dlopen before the thread first runs must count.
        set_seen(crate::sites::loader_generation());
        let spawned = crate::thread::spawn_helper("ftramp-modules", || loop {
            std::thread::sleep(MODULE_WATCH_INTERVAL);
            crate::thread::exit_if_only_helpers_remain();
            refresh_if_modules_changed();
        });
        if let Err(e) = spawned {
            eprintln!("ftramp: cannot start the module watcher ({e}); call ftrace().refresh() after dlopen");
        }
    });
}

/// The process the module watcher was started in (0: none).
static WATCHER_PID: AtomicU32 = AtomicU32::new(0);

/// Whether this process has a module watcher thread (not a fork child of
/// the process that started it): if not, [`refresh_if_modules_changed`]
/// is the caller's to call.
pub fn module_watcher_running() -> bool {
    WATCHER_PID.load(Relaxed) == std::process::id()
}

/// Whether every `dlopen`/`dlclose` so far has been handled
/// ([`refresh_if_modules_changed`] would do nothing now).
pub fn modules_handled() -> bool {
    crate::sites::loader_generation() == seen() && !HOOKS_PENDING.load(Relaxed)
}

/// The module watcher's step: if the loader's counters changed since the
/// last step, re-reads the modules and re-applies the registered ops (a
/// busy engine is retried at the next call).  One `dl_iterate_phdr` call
/// when nothing changed.  Safe to call from any thread outside dispatch,
/// also beside the watcher.
pub fn refresh_if_modules_changed() {
    if grace::dispatch_depth() > 0 || (crate::sites::loader_generation() == seen() && !HOOKS_PENDING.load(Relaxed)) {
        return;
    }
    // (Its locks are not held across a fork.)
    let _section = crate::sites::ForkSection::enter();
    // A dlopen in progress finishes first (the audit module's hook, inside
    // it, may be handling its objects), so that this thread neither holds
    // the engine while it waits for the loader nor runs module hooks on
    // objects not relocated yet.
    crate::sites::wait_for_loader();
    let now = crate::sites::loader_generation();
    if now == seen() {
        // Modules patched inside the loader: their hooks.
        if HOOKS_PENDING.swap(false, Relaxed) {
            run_module_hooks();
        }
        return;
    }
    // The unwinder's hooks go into the new modules before their sites are
    // patched (not with the other module hooks, after): a traced function
    // of a library just loaded may throw at once.  Here, not holding the
    // engine: this waits for the loader (`dlsym`, `dlopen(RTLD_NOLOAD)`).
    crate::unwind::rescan();
    let f = ftrace();
    // Registering re-reads the modules anyway.  (In a fork child whose
    // parent forked while its watcher held the engine, the lock stays
    // held: that child's new libraries are then not traced.)
    let Ok(mut st) = f.state.try_lock() else { return };
    if st.ops.is_empty() {
        set_seen(now);
        return;
    }
    if st.refresh().is_ok() {
        // A module loaded since the unwinder's pass (or a pass still
        // running on another thread): nothing new is patched before its
        // hooks are in; the next step looks again.
        if !crate::unwind::hooks_cover(crate::sites::loader_generation()) {
            return;
        }
        if let Ok(old) = st.apply() {
            retire_table(old);
        }
        // An object still being loaded was skipped: look again next time.
        if !st.discovery.as_ref().is_some_and(Discovery::loading) {
            set_seen(now);
        }
        drop(st);
        run_module_hooks();
    }
}

/// How long [`refresh_while_loading`] waits for an engine that another
/// thread holds (none waits for the loader while it holds the engine).
const LOADING_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

/// [`refresh_if_modules_changed`] from inside the loader, in the middle of
/// a `dlopen`: an `LD_AUDIT` module's `la_activity(LA_ACT_CONSISTENT)`,
/// which glibc calls once the new objects are mapped and before it
/// relocates them or runs any of their constructors, on the thread that
/// called `dlopen`, holding the loader's lock.  Sites patched here are
/// traced from the library's first constructor on; left to the module
/// watcher, they were patched ~10 ms later, after the constructors, and
/// calls made into the library before then were not traced.
///
/// Inside the loader no `dlopen` is made (not even to wait for the
/// loader: glibc asserts that the namespace is consistent) and the new
/// objects' site tables, not relocated yet, are read from their files
/// (`sites::LoaderHeld`).  The module hooks
/// ([`on_modules_changed`]) are left to the watcher: the unwinder's are
/// written into GOT slots that the relocation still to come would
/// overwrite, and fgraph's take its registry, which a thread registering a
/// user may hold while it waits for the loader (until then, several fgraph
/// users see the new sites as they see any site not in their bitmaps:
/// those without a filter get their calls).
///
/// This thread holds the loader's lock; no thread waits for that lock
/// while it holds the engine (a refresh does not wait for a `dlopen` in
/// progress: it skips the object, `Discovery::loading`; the patching
/// takes only the loader's list lock, `sites::while_loaded`), so waiting
/// for the engine cannot deadlock.  Still, after [`LOADING_WAIT`] this
/// gives up and leaves the new objects to the watcher, as before.  When it
/// has handled them, the watcher does not refresh again for them: it only
/// runs the module hooks once the loader is done.  Returns whether the new
/// objects were handled.
pub fn refresh_while_loading() -> bool {
    if grace::dispatch_depth() > 0 {
        return false;
    }
    let _held = crate::sites::LoaderHeld::enter();
    let f = ftrace();
    let deadline = std::time::Instant::now() + LOADING_WAIT;
    let mut st = loop {
        match f.state.try_lock() {
            Ok(st) => break st,
            Err(std::sync::TryLockError::Poisoned(_)) => return false,
            Err(std::sync::TryLockError::WouldBlock) => {
                if std::time::Instant::now() >= deadline {
                    return false;
                }
                std::thread::sleep(std::time::Duration::from_micros(100));
            }
        }
    };
    if st.ops.is_empty() || st.discovery.is_none() {
        return false;
    }
    let known: std::collections::HashSet<ModuleId> = st.discovery.as_ref().map(|d| d.modules().iter().map(|m| m.id).collect()).unwrap_or_default();
    if st.refresh().is_err() {
        return false;
    }
    // A new module that starts stack walks (libstdc++ throwing, libgcc_s,
    // a Rust library panicking) cannot have its unwinder hooks before it
    // is relocated: traced calls its constructors make would unwind
    // through hijacked returns it does not know (`std::terminate`).  Such
    // a `dlopen` is left to the watcher, as before.
    let starts_walks = st.discovery.as_ref().is_some_and(|d| {
        d.modules().iter().filter(|m| !known.contains(&m.id)).any(|m| m.imports_any(&crate::unwind::STARTERS))
    });
    if starts_walks {
        return false;
    }
    match st.apply() {
        Ok(old) => retire_table(old),
        Err(_) => return false,
    }
    // Handled, unless a new object could not be read: then the watcher
    // tries again.  The module hooks wait for it either way.
    HOOKS_PENDING.store(true, Relaxed);
    if !st.discovery.as_ref().is_some_and(Discovery::loading) {
        set_seen(crate::sites::loader_generation());
    }
    true
}

/// [`refresh_while_loading`] patched new modules whose module hooks have
/// not run yet: the watcher runs them once the loader is done with them.
static HOOKS_PENDING: AtomicBool = AtomicBool::new(false);

static MODULE_HOOKS: Mutex<Vec<fn()>> = Mutex::new(Vec::new());

/// Registers `hook` to run (on the module watcher thread, without the
/// engine's lock) after the watcher has applied the registered ops to
/// modules loaded or unloaded since: for tracers that keep per-site state
/// of their own (fgraph's user bitmaps).  Registering the same hook twice
/// keeps one.
pub fn on_modules_changed(hook: fn()) {
    let mut h = MODULE_HOOKS.lock().unwrap_or_else(|e| e.into_inner());
    if !h.iter().any(|f| *f as usize == hook as usize) {
        h.push(hook);
    }
}

fn run_module_hooks() {
    let hooks = MODULE_HOOKS.lock().unwrap_or_else(|e| e.into_inner()).clone();
    for h in hooks {
        h();
    }
}

/// The ftrace of this process.
pub fn ftrace() -> &'static Ftrace {
    static F: OnceLock<Ftrace> = OnceLock::new();
    F.get_or_init(|| Ftrace { state: Mutex::new(State::default()) })
}

/// Frees a site table that [`State::apply`] replaced once no thread can be
/// reading it: the list function may be walking it on another thread
/// right now.  Without a grace period of its own (registering needs none
/// otherwise, see [`grace::retire_lazily`]).
fn retire_table(old: Option<Box<SiteTable>>) {
    if let Some(t) = old {
        let bytes = t.approx_bytes();
        grace::retire_lazily(t, bytes);
    }
}

fn tier_of(ops: &[Arc<Ops>]) -> Tier {
    if ops.iter().any(|o| o.get_flags().contains(OpsFlags::SAVE_REGS)) {
        Tier::Regs
    } else {
        Tier::Args
    }
}

impl Ftrace {
    fn lock(&self) -> Result<std::sync::MutexGuard<'_, State>, OpsError> {
        if grace::dispatch_depth() > 0 {
            return Err(OpsError::FromCallback);
        }
        Ok(self.state.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Registers `ops`: every site it traces starts calling it.
    pub fn register(&self, ops: Arc<Ops>) -> Result<usize, OpsError> {
        let mut st = self.lock()?;
        let n = st.admit(&ops, None)?;
        start_module_watch();
        let entry = ops.trampoline_entry();
        ops.entry.store(entry, std::sync::atomic::Ordering::Release);
        st.ops.push(ops);
        match st.apply() {
            Ok(old_table) => retire_table(old_table),
            Err(e) => {
                // Leave things as they were.
                st.ops.pop();
                if let Ok(old_table) = st.apply() {
                    retire_table(old_table);
                }
                return Err(e.into());
            }
        }
        Ok(n)
    }

    /// Unregisters `ops`.  When this returns, its callback is never entered
    /// again and no thread is inside it.
    pub fn unregister(&self, ops: &Arc<Ops>) -> Result<(), OpsError> {
        let mut st = self.lock()?;
        let key = Arc::as_ptr(ops) as usize;
        let Some(i) = st.ops.iter().position(|o| Arc::as_ptr(o) as usize == key) else {
            return Err(OpsError::NotRegistered(key));
        };
        let removed = st.ops.remove(i);
        st.refresh()?;
        let old_table = st.apply()?;
        st.retire_ops(removed, old_table);
        Ok(())
    }

    /// Replaces the registered `old` by `new` in one patching pass: every
    /// site traced by either calls exactly one of the two at any moment —
    /// no window where it calls neither, no call that reaches both.  For a
    /// tracer changing its filter while tracing (fgraph when its set of
    /// users changes).  When this returns, `old`'s callback is not running
    /// and is never entered again.
    pub fn replace(&self, old: &Arc<Ops>, new: Arc<Ops>) -> Result<(), OpsError> {
        let mut st = self.lock()?;
        let key = Arc::as_ptr(old) as usize;
        let Some(i) = st.ops.iter().position(|o| Arc::as_ptr(o) as usize == key) else {
            return Err(OpsError::NotRegistered(key));
        };
        st.admit(&new, Some(i))?;
        let entry = new.trampoline_entry();
        new.entry.store(entry, std::sync::atomic::Ordering::Release);
        let removed = std::mem::replace(&mut st.ops[i], new);
        match st.apply() {
            Ok(old_table) => {
                st.retire_ops(removed, old_table);
                Ok(())
            }
            Err(e) => {
                st.ops[i] = removed;
                if let Ok(old_table) = st.apply() {
                    retire_table(old_table);
                }
                Err(e.into())
            }
        }
    }

    /// Re-reads the loaded modules (after `dlopen`/`dlclose`) and re-applies
    /// every registered ops to them.  A watcher thread does this by itself
    /// within [`MODULE_WATCH_INTERVAL`] of a change; call this to have it
    /// done before the next call into a new library.
    pub fn refresh(&self) -> Result<(), OpsError> {
        let mut st = self.lock()?;
        st.refresh()?;
        let old = st.apply()?;
        if let Some(t) = old {
            st.retire(vec![t], Vec::new());
        }
        Ok(())
    }

    /// Every site and what it does now.
    pub fn site_dispatch(&self) -> Vec<(Site, SiteDispatch)> {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let Some(d) = st.discovery.as_ref() else { return Vec::new() };
        d.sites().map(|s| (s.clone(), st.sites.get(&s.addr).map(|x| x.current.dispatch).unwrap_or(SiteDispatch::Nop))).collect()
    }

    /// Sites that were found but refused (bytes not the expected NOPs).
    pub fn refused(&self) -> Vec<Refused> {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.discovery.as_ref().map(|d| d.refused().cloned().collect()).unwrap_or_default()
    }

    /// Objects kept because their grace period could not be established.
    pub fn quarantined(&self) -> usize {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).quarantine.len()
    }
}

impl State {
    /// The checks before `ops` is registered (in place of `st.ops[replacing]`,
    /// if given): not registered yet, known flags, some site (unless
    /// `ALLOW_NO_SITES`), and no site another `IPMODIFY` ops redirects when it
    /// is one.  Returns how many sites it traces.
    fn admit(&mut self, ops: &Ops, replacing: Option<usize>) -> Result<usize, OpsError> {
        let key = ops as *const Ops as usize;
        if self.ops.iter().any(|o| Arc::as_ptr(o) as usize == key) {
            return Err(OpsError::AlreadyRegistered(key));
        }
        let unknown = ops.get_flags().0 & !OpsFlags::ALL.0;
        if unknown != 0 {
            return Err(OpsError::UnknownFlags(unknown));
        }
        self.refresh()?;
        let d = self.discovery.as_ref().expect("refreshed");
        let matched: Vec<&Site> = d.sites().filter(|s| ops.traces(s)).collect();
        if matched.is_empty() && !ops.get_flags().contains(OpsFlags::ALLOW_NO_SITES) {
            return Err(OpsError::NoSites(ops.describe_filters()));
        }
        if ops.get_flags().contains(OpsFlags::IPMODIFY) {
            let others = || self.ops.iter().enumerate().filter(|&(j, _)| Some(j) != replacing).map(|(_, o)| o);
            for s in &matched {
                if others().any(|o| o.get_flags().contains(OpsFlags::IPMODIFY) && o.traces(s)) {
                    return Err(OpsError::IpModifyConflict { site: s.to_string() });
                }
            }
        }
        Ok(matched.len())
    }

    fn refresh(&mut self) -> Result<(), RuntimeError> {
        match &mut self.discovery {
            None => {
                let d = crate::sites::discover()?;
                // The cheapest NOP for every site not yet in use (Linux's
                // ftrace_init_nop), before any site's bytes are recorded.
                crate::sites::optimize_nops(&d)?;
                self.discovery = Some(d);
            }
            Some(d) => {
                let changes = d.refresh()?;
                for m in changes.removed {
                    // Unmapped: forget its sites without touching them; its
                    // images may still be running a callback: retire them.
                    let gone: Vec<usize> = self.sites.iter().filter(|(_, s)| s.module == m.id).map(|(a, _)| *a).collect();
                    for a in gone {
                        if let Some(SiteState { stub: Some(stub), .. }) = self.sites.remove(&a) {
                            self.quarantine.push(Box::new(stub.block));
                        }
                    }
                    if let Some(imgs) = self.images.remove(&m.id) {
                        self.quarantine.push(Box::new(imgs));
                    }
                }
                // (Only an unload makes a reload possible.)
                let reloaded = changes.unloaded > 0 && forget_reloaded(&mut self.sites, &mut self.dead_stubs, d);
                if !changes.added.is_empty() || reloaded {
                    crate::sites::optimize_nops(d)?;
                }
            }
        }
        Ok(())
    }

    /// Frees, after a grace period, an ops no longer in the list, the
    /// direct trampolines only it used and the replaced site table.
    fn retire_ops(&mut self, removed: Arc<Ops>, old_table: Option<Box<SiteTable>>) {
        let key = Arc::as_ptr(&removed) as usize;
        let mut dead: Vec<Box<dyn Send>> = vec![Box::new(removed)];
        let mut dead_code = Vec::new();
        if let Some(t) = old_table {
            dead.push(t);
        }
        for imgs in self.images.values_mut() {
            let keys: Vec<_> = imgs.direct.keys().filter(|(o, _)| *o == key).copied().collect();
            for k in keys {
                if let Some(img) = imgs.direct.remove(&k) {
                    dead_code.push(img.code_range());
                    dead.push(Box::new(img));
                }
            }
        }
        self.retire(dead, dead_code);
    }

    /// Waits for a grace period, then drops `dead`; quarantines it instead
    /// if some thread could not be confirmed outside dispatch.
    fn retire(&mut self, dead: Vec<Box<dyn Send>>, dead_code: Vec<Range<usize>>) {
        // A thread is not quiescent while it runs trampoline code (live or
        // being retired) or the first bytes of a thunk, before the thunk
        // has marked it as inside dispatch.
        // Stub blocks, live or dead, count as trampoline code too.
        let dead_stubs = std::mem::take(&mut self.dead_stubs);
        let mut blocks: Vec<Range<usize>> =
            self.sites.values().filter_map(|s| s.stub.as_ref()).map(|s| s.block.range()).chain(dead_stubs.iter().map(|b| b.range())).collect();
        blocks.sort_by_key(|r| r.start);
        blocks.dedup();
        let ranges: Vec<Range<usize>> = self
            .images
            .values()
            .flat_map(|m| m.list.iter().chain(m.direct.values()))
            .map(|i| i.code_range())
            .chain(dead_code)
            .chain(blocks)
            .chain(dispatch::thunk_prologues())
            .collect();
        if grace::synchronize(&ranges).is_ok() {
            drop(dead);
            drop(dead_stubs);
            // Anything quarantined earlier is safe now too.
            self.quarantine.clear();
        } else {
            self.quarantine.extend(dead);
            self.quarantine.extend(dead_stubs.into_iter().map(|b| Box::new(b) as Box<dyn Send>));
        }
    }

    fn list_image(&mut self, module: ModuleId, near: usize) -> Result<&JitImage, RuntimeError> {
        let imgs = self.images.entry(module).or_default();
        if imgs.list.is_none() {
            let spec = host_spec();
            let image = Image::generate_opts(
                spec,
                &[Variant::Entry { tier: Tier::Args, dispatch: Dispatch::List }, Variant::Entry { tier: Tier::Regs, dispatch: Dispatch::List }, Variant::Return],
                crate::gen_options(),
            )?;
            let jit = JitImage::install(image, Some(near), spec.raw.site.reach)?;
            set_graph_words(&jit)?;
            jit.set_word(DataWord::ListFunc, dispatch::list_func as *const () as usize);
            jit.set_word(DataWord::FunctionTraceOp, 0);
            // Its return_to_handler is fgraph's (fgraph itself uses one
            // process-wide copy that is never freed).
            jit.set_word(DataWord::ReturnHandler, crate::fgraph::ftrace_return_to_handler as *const () as usize);
            imgs.list = Some(jit);
        }
        Ok(imgs.list.as_ref().expect("just made"))
    }

    fn direct_image(&mut self, module: ModuleId, near: usize, ops: &Arc<Ops>, tier: Tier) -> Result<&JitImage, RuntimeError> {
        let key = (Arc::as_ptr(ops) as usize, tier);
        let imgs = self.images.entry(module).or_default();
        if let std::collections::hash_map::Entry::Vacant(slot) = imgs.direct.entry(key) {
            let spec = host_spec();
            let image = Image::generate_opts(spec, &[Variant::Entry { tier, dispatch: Dispatch::Direct }], crate::gen_options())?;
            let jit = JitImage::install(image, Some(near), spec.raw.site.reach)?;
            set_graph_words(&jit)?;
            jit.set_word(DataWord::DirectOp, Arc::as_ptr(ops) as usize);
            jit.set_word(DataWord::DirectFunc, ops.entry.load(std::sync::atomic::Ordering::Acquire));
            slot.insert(jit);
        }
        Ok(&imgs.direct[&key])
    }

    /// Brings every site in line with the registered ops.  Returns the site
    /// table it replaced (to be freed after a grace period).
    fn apply(&mut self) -> Result<Option<Box<SiteTable>>, RuntimeError> {
        let spec = host_spec();
        let backend = arch::lookup(&spec.name)?;
        let d = self.discovery.take().expect("refreshed");
        let result = (|| {
            let mut table = SiteTable::default();
            let mut want: Vec<(usize, ModuleId, Target)> = Vec::new();
            for site in d.sites() {
                let ops: Vec<Arc<Ops>> = self.ops.iter().filter(|o| o.traces(site)).cloned().collect();
                let near = site.addr;
                let target = match ops.len() {
                    0 => NOP,
                    1 => {
                        let tier = tier_of(&ops);
                        let img = self.direct_image(site.module, near, &ops[0], tier)?;
                        Target { dispatch: SiteDispatch::Direct { tier }, addr: img.entry(Variant::Entry { tier, dispatch: Dispatch::Direct }).expect("made") }
                    }
                    _ => {
                        let tier = tier_of(&ops);
                        let img = self.list_image(site.module, near)?;
                        Target { dispatch: SiteDispatch::List { tier }, addr: img.entry(Variant::Entry { tier, dispatch: Dispatch::List }).expect("made") }
                    }
                };
                // The list function must know the site's ops while the site
                // may call the list trampoline: when it will (target), and
                // while it still may (current), until it is patched away.
                let was_list = self.sites.get(&site.addr).is_some_and(|s| matches!(s.current.dispatch, SiteDispatch::List { .. }));
                if matches!(target.dispatch, SiteDispatch::List { .. }) || was_list {
                    table.entries.push((site.addr, ops.clone()));
                }
                want.push((site.addr, site.module, target));
            }
            table.entries.sort_by_key(|e| e.0);
            // New table first, so list trampolines find their ops as soon
            // as a site reaches them.
            let old = dispatch::publish(table);
            // A new site's NOP bytes, read while its module cannot be
            // unmapped; the new sites of a module the program has just
            // closed are left out (the next refresh forgets the module).
            let sites = &mut self.sites;
            d.while_loaded(|live| {
                for (addr, module, _) in &want {
                    if !sites.contains_key(addr) && live.iter().any(|l| l.id == *module) {
                        sites.insert(*addr, SiteState { module: *module, nop: crate::patch::read_text(*addr, spec.site_len), current: NOP, stub: None });
                    }
                }
            });
            want.retain(|(a, _, _)| self.sites.contains_key(a));
            let changed: Vec<(usize, ModuleId, Target)> = want.iter().filter(|(a, _, t)| self.sites[a].current != *t).copied().collect();
            // Stub entry: a fresh stub per site that gets a trampoline, in
            // one block per module (stubs are never rewritten in place).
            let mut stubs: HashMap<usize, SiteStub> = HashMap::new();
            if crate::site_entry() == SiteEntry::Stub {
                let mut by_module: HashMap<ModuleId, Vec<(usize, usize)>> = HashMap::new();
                for (addr, module, target) in &changed {
                    if target.addr != 0 {
                        by_module.entry(*module).or_default().push((*addr, target.addr));
                    }
                }
                for sites in by_module.values() {
                    let block = Arc::new(CodeBlock::install(sites[0].0, STUB_REACH, sites.len() * STUB_LEN, |base| {
                        let mut code = Vec::with_capacity(sites.len() * STUB_LEN);
                        for (i, (addr, target)) in sites.iter().enumerate() {
                            code.extend(backend.site_stub((base + i * STUB_LEN) as u64, *addr as u64, *target as u64)?);
                        }
                        Ok(code)
                    })?);
                    let base = block.range().start;
                    for (i, (addr, _)) in sites.iter().enumerate() {
                        stubs.insert(*addr, SiteStub { block: block.clone(), at: base + i * STUB_LEN });
                    }
                }
            }
            let mut changes = Vec::new();
            let mut modules = Vec::new();
            for (addr, module, target) in &changed {
                let st = &self.sites[addr];
                // What a site holds for a trampoline (0: none) and its stub, if any.
                let bytes = |tramp: usize, stub: Option<&SiteStub>| -> Result<Vec<u8>, RuntimeError> {
                    Ok(match (tramp, stub) {
                        (0, _) => st.nop.clone(),
                        (_, Some(stub)) => backend.site_jump(*addr as u64, stub.at as u64)?,
                        (t, None) => backend.site_call(*addr as u64, t as u64)?,
                    })
                };
                changes.push(SiteChange::new(*addr, bytes(st.current.addr, st.stub.as_ref())?, bytes(target.addr, stubs.get(addr))?));
                modules.push(*module);
            }
            if !changes.is_empty() {
                // Only modules still loaded, kept mapped while they are
                // patched (the sites of one the program has just closed
                // stay as they are; the next refresh forgets them).
                let (report, gone) = d.while_loaded(|live| {
                    let is_live = |m: &ModuleId| live.iter().any(|l| l.id == *m);
                    let go: Vec<SiteChange> = changes.iter().zip(&modules).filter(|(_, m)| is_live(m)).map(|(c, _)| c.clone()).collect();
                    let gone: Vec<usize> = changes.iter().zip(&modules).filter(|(_, m)| !is_live(m)).map(|(c, _)| c.addr).collect();
                    Patcher::apply(&go).map(|r| (r, gone))
                })?;
                let mut refused: std::collections::HashSet<usize> = report.refused.iter().filter_map(refused_addr).collect();
                refused.extend(gone);
                for (addr, _, target) in &changed {
                    if !refused.contains(addr) {
                        if let Some(s) = self.sites.get_mut(addr) {
                            s.current = *target;
                            // The old stub may still be run by a thread that
                            // jumped to it: freed after a grace period.
                            if let Some(old) = std::mem::replace(&mut s.stub, stubs.remove(addr)) {
                                self.dead_stubs.push(old.block);
                            }
                        }
                    }
                }
            }
            Ok(old)
        })();
        self.discovery = Some(d);
        result
    }
}

/// A library unloaded and loaded again at the same address between two
/// refreshes looks unchanged to discovery (same name, same place), but
/// its text is the file's again: the sites this engine patched hold
/// NOPs.  Such a library's sites are forgotten here, so that `State::apply`
/// patches them anew (they keep their addresses, and so their ids and
/// filters).  One site per library is read, inside the loader's list
/// lock so that it cannot go away meanwhile.  True if one was found.
fn forget_reloaded(sites: &mut BTreeMap<usize, SiteState>, dead_stubs: &mut Vec<Arc<CodeBlock>>, d: &Discovery) -> bool {
    let spec = host_spec();
    let mut patched: HashMap<ModuleId, usize> = HashMap::new();
    for (a, s) in sites.iter() {
        if s.current.addr != 0 {
            patched.entry(s.module).or_insert(*a);
        }
    }
    let mut reloaded = Vec::new();
    for (id, addr) in patched {
        // (The main program is never unloaded.)
        if d.module(id).is_none_or(|m| m.is_main) {
            continue;
        }
        // Not loaded now: the next refresh drops it.  (Read while it cannot
        // be unmapped.)
        let now = d.while_loaded(|live| live.iter().any(|l| l.id == id).then(|| crate::patch::read_text(addr, spec.site_len)));
        if now.is_some_and(|now| spec.nops.iter().any(|n| now.starts_with(n))) {
            reloaded.push(id);
        }
    }
    let gone: Vec<usize> = sites.iter().filter(|(_, s)| reloaded.contains(&s.module)).map(|(a, _)| *a).collect();
    for a in &gone {
        if let Some(SiteState { stub: Some(stub), .. }) = sites.remove(a) {
            // Freed by a grace period once no site uses the block.
            dead_stubs.push(stub.block);
        }
    }
    !gone.is_empty()
}

/// Stub entry: tells an entry image where fgraph's `return_to_handler` and
/// its `ftrace_call_through` are, so that hijacked calls are entered with a
/// `call` (codegen `program.rs`, "Stub entry").  No-op for `call` sites.
fn set_graph_words(jit: &JitImage) -> Result<(), RuntimeError> {
    if crate::site_entry() == SiteEntry::Stub {
        let (ret, call) = crate::fgraph::graph_return_words()?;
        jit.set_word(DataWord::GraphReturn, ret);
        jit.set_word(DataWord::GraphCall, call);
    }
    Ok(())
}

fn refused_addr(e: &RuntimeError) -> Option<usize> {
    match e {
        RuntimeError::UnexpectedSiteBytes { addr, .. } | RuntimeError::BadPatch { addr, .. } => Some(*addr),
        _ => None,
    }
}
