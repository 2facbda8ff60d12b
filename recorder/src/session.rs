//! One recorded process image: its files, the writer thread, function ids
//! and `.sym` lines, the tracer registration, and what happens at fork,
//! exec, exit and crash.

use crate::ids::{self, IdTable, NEXT_ID, OV_COUNT};
use crate::options::{Options, Tracer};
use crate::pool::{self, Pool, IO_LOCK};
use crate::tracefile::{self, TraceFile};
use crate::tracer;
use ftramp_runtime::clock;
use ftramp_runtime::fgraph::{self, Fgraph};
use ftramp_runtime::ftrace::ftrace;
use ftramp_runtime::ops::{Filter, Ops, OpsFlags};
use ftramp_runtime::sites::{self, Discovery, Module, Site};
use ftramp_trace::format::{task_file_name, toml_str, toml_u64, SymLine};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::os::fd::{AsRawFd, IntoRawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

static PID: AtomicU32 = AtomicU32::new(0);
static IMAGE: AtomicU32 = AtomicU32::new(0);
static DAT: TraceFile = TraceFile::new();
static SYM: TraceFile = TraceFile::new();
static INFO: TraceFile = TraceFile::new();
/// Set once the final lines (`lost`, `exit`) are in `.info`.
static FINISHED: AtomicBool = AtomicBool::new(false);
/// `.info` length before the exec lines (undone if the exec fails).
static INFO_LEN_BEFORE_EXEC: AtomicU64 = AtomicU64::new(0);
/// Where the `.info`'s `exit` line starts (0: not written): a signal that
/// ends the process after the trace was finished replaces that line
/// ([`end_by`]), so the file keeps one `exit` key, as TOML wants.
static EXIT_LINE_AT: AtomicU64 = AtomicU64::new(0);
/// Writer threads started (a fork child starts its own); the old one stops.
static WRITER_EPOCH: AtomicUsize = AtomicUsize::new(0);

static OPTIONS: OnceLock<Options> = OnceLock::new();

/// Shadow-stack size per thread, in words (a frame takes 5 or more).
const SHADOW_STACK_WORDS: usize = 16 << 10;

/// The frames a shadow stack of [`SHADOW_STACK_WORDS`] holds (five words
/// each): deeper calls are not recorded, and counted.
const SHADOW_STACK_FRAMES: usize = SHADOW_STACK_WORDS / 5;

/// What the writer thread and fork/dlopen handling share.
struct State {
    disc: Discovery,
    /// Site address → id, for the modules loaded now.
    sites: HashMap<usize, u32>,
    /// `.sym` lines by id (None: handed out, not named yet).
    syms: Vec<Option<SymLine>>,
    /// Lines written to `.sym`.
    written: usize,
    seen_gen: (u64, u64),
    seen_ov: u32,
    /// The function_graph user.
    users: Vec<Arc<Fgraph>>,
    ops: Option<Arc<Ops>>,
    /// Modules [`warn_unlisted`] has warned about.
    warned_unlisted: Vec<String>,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

fn state() -> MutexGuard<'static, Option<State>> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

fn say(msg: &str) {
    let _ = writeln!(std::io::stderr(), "ftramp record: {msg}");
}

/// [`start`] ran in this image.
static BEGUN: AtomicBool = AtomicBool::new(false);

/// Starts recording, once per image: from the audit module's early call
/// (before any constructor), else from the library's constructor.  Called
/// again — by the constructor after an early start — it only pins the
/// trace directory in the environment again: libc's constructor has put
/// back the environment the process started with in between.  Each call
/// first gives the program back its own `GLIBC_TUNABLES`
/// ([`crate::startup`]).  Errors leave the program running untraced.
pub fn start() {
    crate::startup::restore_user_tunables();
    crate::startup::remember_recorder_entry();
    if BEGUN.swap(true, Relaxed) {
        if let Some(opts) = OPTIONS.get() {
            pin_dir_in_env(opts);
        }
        return;
    }
    let opts = match Options::from_env() {
        Ok(Some(o)) => o,
        Ok(None) => return,
        Err(e) => return say(&format!("{e}; the program runs untraced")),
    };
    if let Err(e) = start_with(opts) {
        say(&format!("{e}; the program runs untraced"));
    }
}

/// The images this one execs record into the same directory even if the
/// program changes its own (the variable may have been relative).  Before
/// main, while no other thread of the program reads the environment.
/// (libc's `setenv`, not the program's: bash's bound a shell variable,
/// which its import of the environment then overwrote with the relative
/// one.)  Then keeps the recording variables for those images
/// ([`crate::keep_record_env`]).
fn pin_dir_in_env(opts: &Options) {
    if ftramp_runtime::env::var_os(crate::options::ENV_DIR).is_some_and(|d| std::path::Path::new(&d) != opts.dir) {
        ftramp_runtime::env::set_var(crate::options::ENV_DIR, opts.dir.as_os_str());
    }
    crate::keep_record_env();
}

fn start_with(opts: Options) -> Result<(), String> {
    let opts = OPTIONS.get_or_init(|| opts);
    pin_dir_in_env(opts);
    let c = clock::clock();
    let ticks_per_ns = c.ticks_per_sec as f64 / 1e9;
    tracer::configure(
        opts.depth,
        (opts.min_duration_ns as f64 * ticks_per_ns).ceil() as u64,
    );
    let pid = std::process::id();
    open_image(pid, None)?;

    // Function ids for every site loaded now.
    let disc =
        sites::discover().map_err(|e| format!("cannot read the program's patch sites: {e}"))?;
    let main_sites = disc
        .modules()
        .iter()
        .filter(|m| m.is_main)
        .map(|m| m.sites.len())
        .sum::<usize>();
    let total = disc.sites().count();
    append_info(&format!("sites = {total}\n"));
    if main_sites == 0 && opts.record_pid.is_none() {
        say(&no_sites_advice(&exe_path()));
    }
    let mut warned_unlisted = Vec::new();
    warn_unlisted(opts, disc.modules(), &mut warned_unlisted);
    let mut st = State {
        warned_unlisted,
        disc,
        sites: HashMap::new(),
        syms: Vec::new(),
        written: 0,
        seen_gen: sites::loader_generation(),
        seen_ov: 0,
        users: Vec::new(),
        ops: None,
    };
    let new = funcs(st.disc.modules());
    name_sites(&mut st, &new);
    publish_table(&st);
    write_syms(&mut st);

    Pool::install(opts.buffer_size, opts.buffers)?;
    // Deep recursion: fgraph's default shadow stack (one page) holds ~100
    // frames; mapped per thread, touched only as deep as calls go.
    fgraph::set_stack_words(SHADOW_STACK_WORDS);
    install_handlers();
    // Without sites at start and without filters, the tracer is registered
    // when a library with sites is loaded (see [`WAITING_FOR_SITES`]):
    // registering costs a site-less process — a compiler a build runs,
    // say — its trampolines and watcher thread.  With filters it is
    // registered now, so that the constructors of a library they name are
    // recorded too.  A main-only list stays empty for good.
    if total > 0 || !opts.filter.is_empty() {
        register(&mut st, opts)?;
    } else if !opts.main_only {
        WAITING_FOR_SITES.store(true, Relaxed);
    }
    *state() = Some(st);
    spawn_writer();
    STARTED.store(true, Relaxed);
    Ok(())
}

/// The tracer is not registered yet: the program had no sites at start
/// and no filters were given.  The first look at the loader's changes
/// that finds a library with sites registers it
/// ([`register_once_sites_appear`]): the `dlsym` interposer's, before the
/// program gets a function of the library, or the writer's, within a
/// module-watch interval of the `dlopen`.  Not inside the loader (the
/// audit module's hook): registering starts the engine's watcher thread.
/// So the calls that the library's constructors make are not recorded
/// (with `-F` they are: the tracer is registered at start then).
static WAITING_FOR_SITES: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether the tracer waits for a library with sites
/// ([`WAITING_FOR_SITES`]).
pub(crate) fn waiting_for_sites() -> bool {
    WAITING_FOR_SITES.load(Relaxed)
}

/// Registers the tracer if it was waiting for sites and the modules now
/// loaded have some (called with the state, after their sites were
/// named).  A failure is said once; the program goes on untraced.
fn register_once_sites_appear(st: &mut State) {
    if !WAITING_FOR_SITES.load(Relaxed) || st.sites.is_empty() {
        return;
    }
    WAITING_FOR_SITES.store(false, Relaxed);
    let Some(opts) = OPTIONS.get() else { return };
    if let Err(e) = register(st, opts) {
        if started_by_record(opts) {
            say(&e);
        }
    }
}

/// Recording has started in this image: the tracer is registered (fork
/// children inherit it).
static STARTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether this process image is being recorded and the tracer is in
/// place (see [`recording`]).
pub fn started() -> bool {
    STARTED.load(Relaxed) && recording()
}

/// Whether recording started in this image or the one it was forked from
/// (one load, no system call: [`started`] without the pid test).
pub fn started_here_or_before_fork() -> bool {
    STARTED.load(Relaxed)
}

/// Whether this image is the program `ftramp record` started (its parent is
/// `ftramp record`; also after an exec), or runs without `ftramp record`:
/// where the recorder's notes go to the user's terminal rather than into
/// the stderr of a process its parent may be reading.
fn started_by_record(opts: &Options) -> bool {
    // SAFETY: getppid cannot fail.
    let parent = unsafe { libc::getppid() } as u32;
    opts.record_pid.is_none() || opts.record_pid == Some(parent)
}

/// Warns about the modules of `modules` with functions that have sites but
/// are in no site table, and, under function_graph, those with their own
/// unwinder (whose functions fgraph leaves untraced: `Ops::traces`),
/// once per module and run: in the program
/// `ftramp record` started (not in each image it execs or forks), at start
/// and as it loads libraries.
fn warn_unlisted<'m>(opts: &Options, modules: impl IntoIterator<Item = &'m Module>, warned: &mut Vec<String>) {
    if !started_by_record(opts) {
        return;
    }
    for m in modules.into_iter() {
        if m.unlisted > 0 && !warned.contains(&m.name) {
            say(&unlisted_warning(&m.name, m.unlisted));
            warned.push(m.name.clone());
        }
        let key = format!("{}\0unwinder", m.name);
        if m.own_unwinder && !m.sites.is_empty() && matches!(opts.tracer, Tracer::FunctionGraph) && !warned.contains(&key) {
            say(&format!(
                "{}: it has its own copy of the unwinder (linked with -static-libgcc), which function_graph cannot \
                 tell about the returns it hijacks (an exception thrown through them would end the program in \
                 std::terminate): its functions are not traced; `-t function` records its calls, or link it without \
                 -static-libgcc",
                m.name
            ));
            warned.push(key);
        }
    }
}

/// The warning for a module with functions that have sites but are in
/// no site table ([`sites::Module::unlisted`]).
pub fn unlisted_warning(module: &str, n: usize) -> String {
    let (fns, begin, are) = if n == 1 { ("function", "begins", "is") } else { ("functions", "begin", "are") };
    format!(
        "{module}: {n} {fns} {begin} with a patch site's NOPs but {are} missing from its site table, so {} untraced: \
         g++ 12 drops a C++ file's table when the first function it emits is a template or inline function \
         whose copy from another object is kept; build C++ with clang++ (see the README)",
        if n == 1 { "it runs" } else { "they run" }
    )
}

/// The advice printed when the main program has no patch sites.
pub fn no_sites_advice(exe: &str) -> String {
    ftramp_trace::format::no_sites_advice(exe, &ftramp_runtime::host_spec().raw.site.flags)
}

fn exe_path() -> String {
    std::fs::read_link("/proc/self/exe")
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "the program".into())
}

/// Creates `task-<pid>-<n>.{info,sym,dat}` with the first free `n`, and
/// writes the `.info` header.
fn open_image(pid: u32, forked_from: Option<(u32, u32)>) -> Result<(), String> {
    let opts = OPTIONS.get().ok_or("no options")?;
    let dir = &opts.dir;
    let mut n = 0u32;
    let info = loop {
        let path = dir.join(task_file_name(pid, n, "info"));
        match std::fs::OpenOptions::new()
            .append(true)
            .create_new(true)
            .open(&path)
        {
            Ok(f) => break (f.into_raw_fd(), path),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 100_000 => {
                // The image before an exec the recorder did not see
                // (a raw execve system call): mark how it ended.
                if let Ok(text) = std::fs::read_to_string(&path) {
                    if !text.lines().any(|l| l.starts_with("exit =")) {
                        let line = b"exit = \"exec\"\n";
                        if let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(&path) {
                            if crate::tracefile::fits_size_limit(f.as_raw_fd(), line.len()) {
                                let _ = f.write_all(line);
                            }
                        }
                    }
                }
                n += 1;
            }
            Err(e) => return Err(format!("cannot create {}: {e}", path.display())),
        }
    };
    let open = |ext: &str| {
        let path = dir.join(task_file_name(pid, n, ext));
        std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map(|f| (f.into_raw_fd(), path.clone()))
            .map_err(|e| format!("cannot create {}: {e}", path.display()))
    };
    let sym = open("sym")?;
    let dat = open("dat")?;
    let c = clock::clock();
    let cmdline = std::fs::read("/proc/self/cmdline").unwrap_or_default();
    let args: Vec<String> = cmdline
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| toml_str(&String::from_utf8_lossy(a)))
        .collect();
    // SAFETY: getppid cannot fail.
    let ppid = unsafe { libc::getppid() };
    let mut text = String::new();
    let _ = writeln!(
        text,
        "version = 2\npid = {pid}\nppid = {ppid}\nn = {n}\nexe = {}",
        toml_str(&exe_path())
    );
    let _ = writeln!(text, "args = [{}]", args.join(", "));
    if let Some((p, i)) = forked_from {
        let _ = writeln!(text, "forked_from = \"{p}-{i}\"");
    }
    let _ = writeln!(text, "tracer = \"{}\"", opts.tracer.name());
    let _ = writeln!(text, "clock = \"{}\"", c.kind.name());
    let _ = writeln!(
        text,
        "ticks_per_sec = {}\nbase_ticks = {}\nbase_ns = {}",
        c.ticks_per_sec,
        toml_u64(c.base_ticks),
        toml_u64(c.base_ns)
    );
    // When the image began, on the trace clock: readers list processes in
    // the order they started, which pid order is not once pids wrap.
    let _ = writeln!(text, "start_ticks = {}", toml_u64(clock::ticks()));
    for (file, (fd, path)) in [(&INFO, info), (&SYM, sym), (&DAT, dat)] {
        file.install(fd, &path);
    }
    // Room for the lines the image's end appends, held from now on: a disk
    // that fills meanwhile does not take them (tracefile.rs).
    INFO.reserve(text.len() as u64 + 4096);
    INFO.write_all(text.as_bytes());
    crate::tracefile::hold_trace_lock(dir);
    PID.store(pid, Relaxed);
    IMAGE.store(n, Relaxed);
    EXIT_LINE_AT.store(0, Relaxed);
    FINISHED.store(false, Relaxed);
    Ok(())
}

fn append_info(s: &str) {
    INFO.write_all(s.as_bytes());
}

/// The patch sites of `modules`, and the sites discovery refused because
/// their bytes were not a NOP form when read: the engine, which reads
/// modules on its own, may be patching a `dlopen`ed library (or rewriting
/// its NOPs) at that moment.  A refused address in a filter is harmless:
/// the engine patches only the sites it discovered itself.
fn funcs<'a>(modules: impl IntoIterator<Item = &'a Module>) -> Vec<Site> {
    let mut out = Vec::new();
    for m in modules {
        out.extend(m.sites.iter().cloned());
        out.extend(m.refused.iter().map(|r| Site {
            addr: r.addr,
            record: r.addr,
            pre_entry: 0,
            module: r.module,
            symbol: r.symbol.clone(),
            own_unwinder: m.own_unwinder,
            offset_in_symbol: r.offset_in_symbol,
            kind: r.kind,
            demangled: Default::default(),
        }));
    }
    out
}

/// The function whose site is at `addr`.
fn func_at(disc: &Discovery, addr: usize) -> Option<Site> {
    funcs(disc.modules()).into_iter().find(|f| f.addr == addr)
}

/// Gives ids to `new` functions (reusing an id the overflow table handed out).
fn name_sites(st: &mut State, new: &[Site]) {
    for f in new {
        let id = ids::overflow_id(f.addr).unwrap_or_else(|| NEXT_ID.fetch_add(1, Relaxed));
        st.sites.insert(f.addr, id);
        set_sym(st, id, sym_line(&st.disc, id, f));
    }
}

fn sym_line(disc: &Discovery, id: u32, f: &Site) -> SymLine {
    SymLine {
        id,
        addr: (f.addr - f.offset_in_symbol) as u64,
        size: 0,
        symbol: f.symbol.clone().unwrap_or_else(|| "?".into()),
        module: disc
            .module(f.module)
            .map(|m| m.name.clone())
            .unwrap_or_else(|| "?".into()),
    }
}

fn set_sym(st: &mut State, id: u32, line: SymLine) {
    let i = id as usize;
    if st.syms.len() <= i {
        st.syms.resize(i + 1, None);
    }
    if st.syms[i].is_none() {
        st.syms[i] = Some(line);
    }
}

/// Publishes the id table of the current sites; the old one goes to the
/// runtime's quarantine, freed by the next grace period anyone completes
/// (the writer thread does not wait for one: it would stop writing).
fn publish_table(st: &State) {
    let entries: Vec<(usize, u32)> = st.sites.iter().map(|(&a, &i)| (a, i)).collect();
    if let Some(old) = ids::publish(IdTable::new(&entries)) {
        ftramp_runtime::grace::retire(old, &[]);
    }
}

/// Appends the `.sym` lines of consecutive named ids.
fn write_syms(st: &mut State) {
    let mut text = String::new();
    while let Some(Some(l)) = st.syms.get(st.written) {
        text.push_str(&l.to_line());
        text.push('\n');
        st.written += 1;
    }
    if !text.is_empty() {
        SYM.write_lines(text.as_bytes());
    }
}

/// Says, in the program `ftramp record` started (or without `ftramp
/// record`), that the filters select no function loaded yet.  Not in the
/// processes it starts: the message would go into their stderr, which
/// their parent may be reading (a filter aimed at one program of a build
/// made every other one print it into its output).
fn note_no_match_yet(opts: &Options) {
    // (`-q`: the end of the run says if nothing matched in the end.)
    if started_by_record(opts) && (!opts.quiet || opts.main_only) {
        say(if opts.main_only {
            "no function of the main executable matches the filters: nothing is recorded"
        } else if opts.filter.is_empty() {
            "-N excludes every function loaded at start; functions loaded later that it does not exclude (libraries, programs run) are recorded"
        } else {
            "no function loaded at start matches the filters; matching functions loaded later (libraries, programs run) are recorded"
        });
    }
}

/// Registers the tracer for the options' filters.
fn register(st: &mut State, opts: &Options) -> Result<(), String> {
    let bad = |e: ftramp_runtime::ops::FilterError| format!("{e}");
    let parse = |items: &[String]| {
        items
            .iter()
            .try_fold(Filter::new(), |f, i| f.parse(i))
            .map_err(bad)
    };
    // A module with its own unwinder is left out by fgraph itself
    // (`Ops::traces`), at start and when loaded later; warn_unlisted says so.
    let (filter, notrace) = (parse(&opts.filter)?, parse(&opts.notrace)?);
    let main_ids: std::collections::HashSet<_> = st
        .disc
        .modules()
        .iter()
        .filter(|m| m.is_main)
        .map(|m| m.id)
        .collect();
    let selected = |s: &Site| {
        (!opts.main_only || main_ids.contains(&s.module))
            && (filter.is_empty() || filter.matches(s))
            && !notrace.matches(s)
    };
    // None selected among the functions loaded now: globs may still select
    // some of a library loaded later (not so a main-only list of addresses).
    let none_yet = !funcs(st.disc.modules()).iter().any(&selected);
    if none_yet {
        note_no_match_yet(opts);
        if opts.main_only {
            return Ok(());
        }
    }
    match opts.tracer {
        Tracer::Function => {
            // The engine applies globs to dlopened libraries by itself; the
            // main-only restriction is a list of addresses.
            let mut ops = Ops::new(tracer::function_entry).flags(OpsFlags::RECURSION | OpsFlags::ALLOW_NO_SITES);
            if opts.main_only {
                let addrs: Vec<usize> = funcs(st.disc.modules())
                    .iter()
                    .filter(|s| selected(s))
                    .map(|s| s.addr)
                    .collect();
                ops = ops.filter(addrs.iter().fold(Filter::new(), |f, &a| f.addr(a)));
            } else {
                ops = ops.filter(filter).notrace(notrace);
            }
            let ops = Arc::new(ops);
            ftrace()
                .register(ops.clone())
                .map_err(|e| format!("cannot start tracing: {e}"))?;
            let _ = FUNCTION_OPS.set(ops.clone());
            st.ops = Some(ops);
        }
        Tracer::FunctionGraph => {
            let traced: std::collections::HashSet<usize> = funcs(st.disc.modules())
                .iter()
                .filter(|s| selected(s))
                .map(|s| s.addr)
                .collect();
            // The globs themselves, so that fgraph and the engine apply
            // them to libraries loaded later (no filter change, and so no
            // grace period, at a dlopen); the main-only restriction is a
            // list of addresses, and loaded libraries are never in it.
            let user = if opts.main_only {
                tracer::graph_user().filter(traced.iter().fold(Filter::new(), |f, &a| f.addr(a)))
            } else {
                tracer::graph_user().filter(filter).notrace(notrace)
            };
            let user = Arc::new(user.skip_timestamp(true).allow_no_sites(true));
            fgraph::register_fgraph(user.clone()).map_err(|e| match e {
                // The function tracer hijacks no returns.
                fgraph::FgraphError::ShadowStack => format!(
                    "cannot start tracing: {e}; `ftramp record -t function` records the entries without it"
                ),
                e => format!("cannot start tracing: {e}"),
            })?;
            st.users.push(user);
        }
    }
    Ok(())
}

/// The loader's counters (`sites::loader_generation`) in one word: adds
/// in the high half, subs in the low.
pub(crate) fn loader_generation_word() -> u64 {
    let (adds, subs) = sites::loader_generation();
    adds << 32 | (subs & 0xffff_ffff)
}

/// Picks up `dlopen`/`dlclose` and ids handed out by the overflow table.
/// A `dlopen` still in progress is waited for before the state is taken:
/// the audit module's hook, inside it, names the new functions itself
/// and gives up when the state is held by a thread waiting for the loader.
fn check_modules() {
    static LAST: AtomicU64 = AtomicU64::new(0);
    let gen = loader_generation_word();
    // (Not at the first look: a sanitizer runtime that intercepts dlopen
    // may not be ready for a call yet.)
    let last = LAST.swap(gen, Relaxed);
    if last != 0 && last != gen {
        sites::wait_for_loader();
    }
    check_modules_with(state());
}

fn check_modules_with(mut guard: MutexGuard<'static, Option<State>>) {
    let gen = sites::loader_generation();
    let ov = OV_COUNT.load(Acquire);
    let Some(st) = guard.as_mut() else { return };
    if gen == st.seen_gen && ov == st.seen_ov {
        return;
    }
    let mut changed = false;
    if gen != st.seen_gen
        || ids::overflow_entries()
            .iter()
            .any(|(a, _)| func_at(&st.disc, *a).is_none())
    {
        if let Ok(ch) = st.disc.refresh() {
            for m in &ch.removed {
                for s in &m.sites {
                    st.sites.remove(&s.addr);
                }
                changed |= !m.sites.is_empty();
            }
            let added: Vec<&Module> = ch
                .added
                .iter()
                .filter_map(|id| st.disc.module(*id))
                .collect();
            if let Some(opts) = OPTIONS.get() {
                warn_unlisted(opts, added.iter().copied(), &mut st.warned_unlisted);
            }
            let new = funcs(added);
            changed |= !new.is_empty();
            name_sites(st, &new);
            // An object still being loaded was skipped: look again.
            if !st.disc.loading() {
                st.seen_gen = gen;
            }
        }
    }
    for (addr, id) in ids::overflow_entries() {
        if st.syms.get(id as usize).is_some_and(Option::is_some) {
            continue;
        }
        let line = match func_at(&st.disc, addr) {
            Some(f) => sym_line(&st.disc, id, &f),
            None => SymLine {
                id,
                addr: addr as u64,
                size: 0,
                symbol: "?".into(),
                module: "?".into(),
            },
        };
        set_sym(st, id, line);
    }
    st.seen_ov = ov;
    write_syms(st);
    if changed {
        publish_table(st);
    }
    register_once_sites_appear(st);
}

fn spawn_writer() {
    let epoch = WRITER_EPOCH.fetch_add(1, Relaxed) + 1;
    // With the program's signals blocked: see spawn_helper.
    let r = ftramp_runtime::thread::spawn_helper("ftramp-writer", move || writer_loop(epoch));
    if let Err(e) = r {
        say(&format!(
            "cannot start the writer thread ({e}); events are written at exit only"
        ));
    }
}

fn writer_loop(epoch: usize) {
    let mut last_check = Instant::now();
    while WRITER_EPOCH.load(Relaxed) == epoch {
        let mut wrote = false;
        if let Some(pool) = Pool::get() {
            while IO_LOCK.try_lock() {
                let did = pool.write_one(&DAT);
                IO_LOCK.unlock();
                if !did {
                    break;
                }
                wrote = true;
            }
        }
        if last_check.elapsed() >= ftramp_runtime::ftrace::MODULE_WATCH_INTERVAL {
            // The runtime's module watcher does not survive a fork: in a
            // child, this patches the libraries it loads.
            if !ftramp_runtime::ftrace::module_watcher_running() {
                ftramp_runtime::ftrace::refresh_if_modules_changed();
            }
            check_modules();
            ftramp_runtime::thread::exit_if_only_helpers_remain();
            last_check = Instant::now();
        }
        if !wrote {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

// ---------------------------------------------------------------------------
// Endings: exit, exec, crash.  Each writes what is recorded, then appends
// `lost` and `exit` to `.info` (once).

/// A small stack buffer for messages built inside signal handlers.
pub(crate) struct StackBuf {
    buf: [u8; 512],
    len: usize,
}

impl StackBuf {
    pub(crate) fn new() -> StackBuf {
        StackBuf {
            buf: [0; 512],
            len: 0,
        }
    }
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl std::fmt::Write for StackBuf {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let n = s.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

/// The name of signal `.0` (`SIGRTMIN+3` for a real-time one), written
/// without allocating (signal handlers write it; `ftramp record`'s notes
/// too).
pub struct SignalName(pub i32);

impl std::fmt::Display for SignalName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self.0 {
            libc::SIGSEGV => "SIGSEGV",
            libc::SIGBUS => "SIGBUS",
            libc::SIGILL => "SIGILL",
            libc::SIGFPE => "SIGFPE",
            libc::SIGABRT => "SIGABRT",
            libc::SIGINT => "SIGINT",
            libc::SIGTERM => "SIGTERM",
            libc::SIGHUP => "SIGHUP",
            libc::SIGKILL => "SIGKILL",
            libc::SIGPIPE => "SIGPIPE",
            libc::SIGQUIT => "SIGQUIT",
            libc::SIGALRM => "SIGALRM",
            libc::SIGUSR1 => "SIGUSR1",
            libc::SIGUSR2 => "SIGUSR2",
            libc::SIGXCPU => "SIGXCPU",
            libc::SIGXFSZ => "SIGXFSZ",
            libc::SIGSYS => "SIGSYS",
            libc::SIGVTALRM => "SIGVTALRM",
            libc::SIGPROF => "SIGPROF",
            libc::SIGTRAP => "SIGTRAP",
            SIGSTKFLT => "SIGSTKFLT",
            SIGPWR => "SIGPWR",
            s if (libc::SIGRTMIN()..=libc::SIGRTMAX()).contains(&s) => {
                return match s - libc::SIGRTMIN() {
                    0 => f.write_str("SIGRTMIN"),
                    n => write!(f, "SIGRTMIN+{n}"),
                };
            }
            _ => "signal",
        };
        f.write_str(name)
    }
}

/// fgraph's process-wide miss counters when this process was forked (0 in
/// an image that was not): the parent's misses are reported by the parent.
static MISSES_AT_FORK: AtomicU64 = AtomicU64::new(0);
static EXIT_MISSES_AT_FORK: AtomicU64 = AtomicU64::new(0);
static RECURSION_MISSES_AT_FORK: AtomicU64 = AtomicU64::new(0);

/// The `function` tracer's ops, once registered: its recursion guard's
/// misses are reported at the image's end with fgraph's.
static FUNCTION_OPS: OnceLock<Arc<Ops>> = OnceLock::new();

/// Calls a recursion guard left untraced (a signal handler interrupting a
/// callback) over the process's life: fgraph's (function_graph) and the
/// `function` tracer's ops'.  Async-signal-safe (atomic loads).
fn recursion_misses() -> u64 {
    fgraph::recursion_misses() + FUNCTION_OPS.get().map_or(0, |o| o.recursion_misses())
}

/// How the image ended.
#[derive(Clone, Copy)]
pub enum Ending {
    Code(i32),
    Signal(i32),
    Exec,
}

/// Writes every recorded event and the final `.info` lines.  `tries`:
/// how long to wait for the writer thread's chunk in progress (×100 µs).
/// Async-signal-safe.  Returns false if this image is not being recorded
/// here (another process, or already finished).
fn finish(ending: Ending, tries: u32) -> bool {
    // SAFETY: getpid cannot fail.
    let pid = unsafe { libc::getpid() } as u32;
    if PID.load(Relaxed) != pid || FINISHED.swap(true, SeqCst) {
        return false;
    }
    FINISH_DONE.store(false, SeqCst);
    FINISHING.store(ftramp_runtime::thread::pthread_id(), SeqCst);
    finish_image(pid, ending, tries);
    FINISHING.store(0, SeqCst);
    FINISH_DONE.store(true, SeqCst);
    // A process-ending signal that came on this thread meanwhile was
    // held back by its handler: the trace is complete, the process ends.
    let sig = DEFERRED_SIGNAL.swap(0, SeqCst);
    if sig != 0 {
        end_by(sig);
    }
    true
}

/// The thread running [`finish`] (`pthread_self`; 0: none), whether the
/// last one has completed, and a signal its thread's handler held back
/// ([`on_fatal`]): a SIGTERM that came while a process wrote its trace at
/// exit killed it half-way, with no `exit` line and events unwritten.
static FINISHING: AtomicUsize = AtomicUsize::new(0);
static FINISH_DONE: AtomicBool = AtomicBool::new(false);
static DEFERRED_SIGNAL: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// Ends the process by `sig` once its trace is complete: notes it in the
/// `.info` in place of the `exit` line the finish wrote, restores the
/// default action (libc's, not the interposer) and raises it.
/// Async-signal-safe.
fn end_by(sig: i32) -> ! {
    let mut b = StackBuf::new();
    let _ = writeln!(b, "exit = \"signal {sig} ({})\"", SignalName(sig));
    let at = EXIT_LINE_AT.load(SeqCst);
    if at != 0 {
        INFO.truncate(at);
    }
    INFO.write_all(b.bytes());
    crate::sigaction::restore_default(sig);
    // SAFETY: unblocking and raising `sig`: the default action ends the
    // process (all async-signal-safe).
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::raise(sig);
        libc::_exit(128 + sig)
    }
}

fn finish_image(pid: u32, ending: Ending, tries: u32) {
    // When the image ends, for the readers: the calls still open now end
    // here (`exit()` called inside them, a fatal signal, `exec`).
    let end_ticks = clock::ticks();
    let locked = IO_LOCK.lock_for(tries);
    pool::flush_all(&DAT);
    // Events the buffers could not take, and calls left untraced because
    // a shadow stack was full (their entries and exits are lost too).
    // (fgraph counts for the process's life: an image forked from another
    // counts from the fork, see `fork_child`.)
    let (dropped, missed) = (pool::lost_total(), fgraph::misses().wrapping_sub(MISSES_AT_FORK.load(Relaxed)));
    // And events of threads still running while the process ends, after
    // the flush above: those until now (they go on until the process is
    // gone, hence "at least" below).
    let late_at_flush = pool::lost_after_flush();
    // And calls made while this thread was inside fgraph or the recorder
    // (a signal handler interrupting a callback): the recursion guards
    // (fgraph's, the function tracer's ops') leave them untraced.  Each is
    // an entry and an exit, or an entry alone for the function tracer
    // (whose misses went unreported until the twenty-sixth session).
    let nested = recursion_misses().wrapping_sub(RECURSION_MISSES_AT_FORK.load(Relaxed));
    let per_call = if FUNCTION_OPS.get().is_some() { 1 } else { 2 };
    // And events of calls threads made after their exit hooks had run (the
    // C library's own thread cleanup: glibc's `free` of thread storage),
    // with no shadow stack or buffer left (reported as calls nested too
    // deep or as full buffers until the twenty-eighth session).
    let exiting = pool::lost_at_thread_exit() + 2 * fgraph::exit_misses().wrapping_sub(EXIT_MISSES_AT_FORK.load(Relaxed));
    // And events whose chunk could not be written (reported below).
    let lost = dropped + late_at_flush + 2 * missed + per_call * nested + exiting + tracefile::failed_events();
    if let Ending::Exec = ending {
        if let Some(size) = INFO.size() {
            INFO_LEN_BEFORE_EXEC.store(size, Relaxed);
        }
    }
    let mut b = StackBuf::new();
    // The causes, for `ftramp record`'s summary (the readers ignore them).
    let causes = [dropped, late_at_flush, missed, nested, exiting];
    for (key, n) in LOSS_KEYS.iter().zip(causes) {
        let _ = writeln!(b, "{key} = {n}");
    }
    let _ = writeln!(b, "lost = {lost}");
    let _ = writeln!(b, "end_ticks = {}", toml_u64(end_ticks));
    // The threads whose last chunks the flush could not write: their
    // calls still open were not running at the end, as far as anyone
    // knows (before the twenty-seventh session, replay said they were).
    INFO.write_all(b.bytes());
    b = StackBuf::new();
    tracefile::write_unwritten(&INFO);
    let exit_at = INFO.size().map_or(0, |size| size + b.bytes().len() as u64);
    let _ = match ending {
        Ending::Code(c) => writeln!(b, "exit = \"code {c}\""),
        Ending::Signal(s) => writeln!(b, "exit = \"signal {s} ({})\"", SignalName(s)),
        Ending::Exec => writeln!(b, "exit = \"exec\""),
    };
    INFO.write_all(b.bytes());
    EXIT_LINE_AT.store(exit_at, SeqCst);
    // (Before an exec too: the new image starts its own count, and a
    // child that forks and execs would otherwise report nothing.)
    tracefile::report_failures(pid);
    tracefile::reset_failures();
    // Under `ftramp record`, which sums these from every image's `.info`
    // at the end, nothing is said here: this is the program's stderr, and a
    // process its parent reads (a shell's command substitution, a build's
    // compiler) had the notes in its output.  Without it they are the only
    // report.
    let say_here = !matches!(ending, Ending::Exec) && OPTIONS.get().is_some_and(|o| o.record_pid.is_none());
    for (cause, n) in causes.into_iter().enumerate().filter(|&(_, n)| say_here && n > 0) {
        let mut m = StackBuf::new();
        let _ = write!(m, "ftramp record: pid {pid}: ");
        let _ = write_loss_note(&mut m, cause, n, "");
        let _ = writeln!(m);
        pool::write_all(2, m.bytes());
    }
    // Keep the I/O lock: nothing is written after the final flush (an exec
    // that fails gives it back).
    let _ = locked;
}

/// The `.info` keys of the causes of loss, which `finish_image` writes
/// for `ftramp record`'s summary: buffers full, events after the final
/// flush, calls deeper than a shadow stack, calls made inside the recorder,
/// events of calls made after their thread's exit hooks.
pub const LOSS_KEYS: [&str; 5] = ["lost_buffers", "lost_late", "missed_depth", "missed_nested", "lost_thread_exit"];

/// What `n` losses of cause `cause` (the index of its [`LOSS_KEYS`] key)
/// mean, with `place` (`" in pid 12"`, or nothing) after what was lost:
/// the recorder's note at an image's end and `ftramp record`'s summary.
/// Formats into `out` only (async-signal-safe into a [`StackBuf`]).
pub fn write_loss_note(out: &mut dyn std::fmt::Write, cause: usize, n: u64, place: &str) -> std::fmt::Result {
    match cause {
        0 => write!(out, "{n} events lost{place} (buffers full); try a larger --buffer-size or --buffers"),
        1 => write!(
            out,
            "at least {n} events not written{place}: traced functions were called after the process's final flush, \
             while it was ending (by other threads, or by signal handlers)"
        ),
        2 => write!(
            out,
            "{n} calls not recorded{place} (nested deeper than the {SHADOW_STACK_FRAMES} frames a shadow stack holds; \
             each tail call made by a jump counts as a level, as its frame returns only with its caller's)"
        ),
        3 => write!(
            out,
            "{n} calls not recorded{place} (made while the recorder was running on their thread: by signal handlers \
             that interrupted it, or by a C library function it called that calls the program's own, such as its `malloc`)"
        ),
        _ => write!(
            out,
            "{n} events not recorded{place}: calls made by exiting threads after their last thread-exit hook, \
             when the tracer keeps no state for them any more (the C library's own cleanup, such as glibc's `free` \
             of a thread's storage reaching a traced `free`)"
        ),
    }
}

/// `on_exit` handler: the program's exit status is known here.
extern "C" fn at_exit(status: libc::c_int, _arg: *mut libc::c_void) {
    let _ = std::panic::catch_unwind(|| before_exit(status));
}

/// The status the `quick_exit` interposer saw, for [`at_quick_exit_handler`].
pub static QUICK_EXIT_STATUS: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// `at_quick_exit` handler (registered before `main`, so it runs after the
/// program's own): `quick_exit` ends the process without the `on_exit`
/// handlers.
extern "C" fn at_quick_exit_handler() {
    let status = QUICK_EXIT_STATUS.load(Relaxed);
    let _ = std::panic::catch_unwind(|| before_exit(status));
}

/// Whether this process image is being recorded here (not a fork child the
/// recorder did not see, e.g. a `vfork` child).
pub fn recording() -> bool {
    PID.load(Relaxed) == std::process::id()
}

/// Names the functions that got ids since the writer last looked (not
/// from a signal handler: it allocates and locks).
fn last_names() {
    if PID.load(Relaxed) != std::process::id() {
        return;
    }
    // The writer may hold the state (a dlopen being handled, which can wait
    // for the engine): wait for it a while, but never hang the exit.
    check_modules_waiting(2000, Duration::from_millis(1));
}

/// [`check_modules`] when the state can be had within `tries` pauses (the
/// writer holds it briefly; a thread that holds it itself, e.g. in a
/// signal handler that interrupted it, must not wait for good).
fn check_modules_waiting(tries: u32, pause: Duration) {
    for _ in 0..tries {
        match STATE.try_lock() {
            Ok(g) => return check_modules_with(g),
            Err(std::sync::TryLockError::Poisoned(p)) => return check_modules_with(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => std::thread::sleep(pause),
        }
    }
}

/// Gives the sites of libraries loaded since the writer last looked their
/// ids and names now, on this thread (the `dlsym` interposer: before the
/// program calls into them, and before it may unload them again), waiting
/// at most 50 ms for the writer.
pub(crate) fn name_new_sites() {
    check_modules_waiting(250, Duration::from_micros(200));
}

/// [`name_new_sites`] while the tracer waits for a library with sites
/// ([`WAITING_FOR_SITES`]): the writer may be registering it, holding the
/// state, which takes longer than the patching `name_new_sites` waits for
/// (a grace period; tens of milliseconds under qemu-user), so this waits
/// up to 2 s — the calls the program makes through what its `dlsym`
/// returns are to be recorded.
pub(crate) fn name_new_sites_or_register() {
    check_modules_waiting(10_000, Duration::from_micros(200));
}

/// [`name_new_sites`] inside the loader, in the middle of a `dlopen` (the
/// audit module's hook), waiting at most 100 ms for the writer (which
/// never waits for the loader while it holds the state).
pub(crate) fn name_new_sites_while_loading() {
    check_modules_waiting(1000, Duration::from_micros(100));
}

/// Called by the `_exit` interposer and at exit.
pub fn before_exit(status: i32) {
    last_names();
    finish(Ending::Code(status), 10_000);
}

/// Called before an exec: returns whether the image was finished (undo with
/// [`exec_failed`]).
pub fn before_exec() -> bool {
    last_names();
    finish(Ending::Exec, 10_000)
}

/// The exec failed: the image goes on recording.
pub fn exec_failed() {
    let len = INFO_LEN_BEFORE_EXEC.load(Relaxed);
    // Back to before the exec lines.
    INFO.truncate(len);
    EXIT_LINE_AT.store(0, SeqCst);
    pool::reopen();
    FINISHED.store(false, SeqCst);
    IO_LOCK.unlock();
}

/// Writes what every thread has recorded so far, and lets them go on
/// recording: before a program's own handler of a fault runs
/// ([`crate::sigaction`]'s stand-in).  Such a handler may end the process
/// in a way no flush follows — SIGKILL, a hang a watchdog ends, a fault
/// of its own — or write over memory the recorder reads (redis's crash
/// report tests all anonymous memory in place): the calls up to the fault
/// are on disk first.  Async-signal-safe; skipped if the trace is being
/// finished, or if the writer does not let go of the lock within 50 ms.
pub(crate) fn flush_before_fault_handler() {
    // SAFETY: getpid cannot fail.
    if PID.load(Relaxed) != unsafe { libc::getpid() } as u32 || FINISHED.load(SeqCst) || !IO_LOCK.lock_for(500) {
        return;
    }
    pool::flush_all(&DAT);
    pool::reopen();
    IO_LOCK.unlock();
}

/// The signals whose default action ends the process, whose handler (where
/// the program has none) writes the trace first: the faults, the ones a
/// terminal, a pipe or another process sends (`prog | head` ends `prog`
/// with SIGPIPE), the timers' and the resource limits'.  (SIGTRAP is the
/// patcher's; SIGKILL and SIGSTOP cannot be caught.)
pub(crate) const FATAL: [i32; 18] = [
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGILL,
    libc::SIGFPE,
    libc::SIGABRT,
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGPIPE,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGALRM,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGXCPU,
    libc::SIGXFSZ,
    libc::SIGSYS,
    libc::SIGVTALRM,
    libc::SIGPROF,
];

/// SIGSTKFLT and SIGPWR: their default action ends a process too (Linux's
/// generic numbers, those of every arch the recorder runs on; the libc
/// crate does not name them for glibc).
const SIGSTKFLT: i32 = 16;
const SIGPWR: i32 = 30;

/// The runtime's grace-period signal (0: none), a real-time signal the
/// recorder leaves alone; read before the recorder takes the others.
static GRACE_SIGNAL: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);
/// SIGTRAP is the runtime patcher's, which hands the recorder the traps
/// that are not its own ([`ftramp_runtime::patch::on_foreign_sigtrap`]);
/// false on the arches where the patcher has no SIGTRAP handler.
static SIGTRAP_IS_THE_PATCHERS: AtomicBool = AtomicBool::new(false);

/// Whether `sig`'s default action ends the process and the recorder's
/// handler stands in for it: [`FATAL`], SIGSTKFLT, SIGPWR, the real-time
/// signals but the runtime's own, and SIGTRAP where the patcher does not
/// handle it.  (A process killed by any of these lost its whole trace
/// before the twenty-first session, and `ftramp record` blamed SIGKILL.)
/// Async-signal-safe.
pub(crate) fn is_fatal(sig: i32) -> bool {
    FATAL.contains(&sig)
        || sig == SIGSTKFLT
        || sig == SIGPWR
        || (sig == libc::SIGTRAP && !SIGTRAP_IS_THE_PATCHERS.load(Relaxed))
        || ((libc::SIGRTMIN()..=libc::SIGRTMAX()).contains(&sig) && sig != GRACE_SIGNAL.load(Relaxed))
}

/// Every signal [`is_fatal`] says.
fn fatal_signals() -> impl Iterator<Item = i32> {
    (1..=libc::SIGRTMAX()).filter(|&s| is_fatal(s))
}

/// The [`FATAL`] signals a faulting instruction raises (and raises again
/// if its handler returns).
pub(crate) fn is_fault(sig: i32) -> bool {
    matches!(sig, libc::SIGSEGV | libc::SIGBUS | libc::SIGILL | libc::SIGFPE)
}

/// The handler of the [`FATAL`] signals where the program has none, or
/// asked for the default action ([`crate::sigaction`]).
pub(crate) extern "C" fn on_fatal(sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: getpid cannot fail.
    let ours = PID.load(Relaxed) == unsafe { libc::getpid() } as u32;
    if !finish(Ending::Signal(sig), 500) && ours && FINISHED.load(SeqCst) {
        if FINISH_DONE.load(SeqCst) {
            // Finished already (at exit, before an exec): the process
            // ends by this signal after all, which its `exit` line is to
            // say (a `prog | head` whose exit flush meets SIGPIPE).
            end_by(sig);
        }
        // The trace is being finished (at exit, before an exec, or for an
        // earlier signal).
        if FINISHING.load(SeqCst) == ftramp_runtime::thread::pthread_id() {
            // Under this handler: it can only complete once the handler
            // returns.  A signal sent to the process is held back until
            // then ([`finish`] raises it); a fault in the recorder's own
            // code would come back at once, and ends the process now.
            // SAFETY: the kernel's siginfo for this delivery (SA_SIGINFO).
            let sent = info.is_null() || unsafe { (*info).si_code } <= 0;
            if sent || !is_fault(sig) {
                DEFERRED_SIGNAL.store(sig, SeqCst);
                return;
            }
        } else {
            // On another thread: let it complete (at most 2 s), then end.
            for _ in 0..20_000 {
                if FINISH_DONE.load(SeqCst) {
                    break;
                }
                let ts = libc::timespec { tv_sec: 0, tv_nsec: 100_000 };
                // SAFETY: nanosleep of a local timespec; async-signal-safe.
                unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
            }
            end_by(sig);
        }
    }
    // Restoring the default action and re-raising: the signal is blocked
    // while this handler runs, so it is delivered (and kills the process
    // the same way) when the handler returns.  All async-signal-safe.
    crate::sigaction::restore_default(sig);
    // SAFETY: raise has no memory arguments.
    unsafe { libc::raise(sig) };
}

extern "C" {
    fn at_quick_exit(f: extern "C" fn()) -> libc::c_int;
    fn on_exit(
        f: extern "C" fn(libc::c_int, *mut libc::c_void),
        arg: *mut libc::c_void,
    ) -> libc::c_int;
}

fn install_handlers() {
    // SAFETY: registering handlers; the functions are extern "C" and live
    // as long as the process (this library is never unloaded: LD_PRELOAD).
    unsafe {
        on_exit(at_exit, std::ptr::null_mut());
        at_quick_exit(at_quick_exit_handler);
        // The runtime's first: its prepare handler, which waits for calls
        // into the loader to end, then runs after ours (and the locks ours
        // takes).
        ftramp_runtime::sites::install_fork_handlers();
        libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child));
        // An alternate stack for the main thread, so a stack overflow can
        // still be flushed (kept for the process's life).
        let _ = crate::pool::install_alt_stack();
        use crate::sigaction::{flush_action, real_sigaction};
        // The runtime's signals first: its grace-period signal is a free
        // real-time one, which the loop below would otherwise take.
        GRACE_SIGNAL.store(ftramp_runtime::grace::signal_number().unwrap_or(0), Relaxed);
        // That signal, sent by the program or another process, ends the
        // process as untraced, with the trace written.
        ftramp_runtime::grace::on_foreign_signal(on_fatal);
        SIGTRAP_IS_THE_PATCHERS.store(ftramp_runtime::patch::on_foreign_sigtrap(on_fatal), Relaxed);
        for sig in fatal_signals() {
            let mut old: libc::sigaction = std::mem::zeroed();
            if real_sigaction(sig, std::ptr::null(), &mut old) != 0 || old.sa_sigaction != libc::SIG_DFL {
                continue; // the program (or a library) handles it
            }
            real_sigaction(sig, &flush_action(), std::ptr::null_mut());
        }
        crate::sigaction::stand_in();
    }
}

// ---------------------------------------------------------------------------
// fork: the child is a new process of the trace, with its own files and
// writer thread; the parent's unwritten events stay the parent's.

/// The state's lock, held by a forking thread across the `fork`.  Without a
/// destructor (`ManuallyDrop`: the guard is always taken out and dropped by
/// the fork's handlers), so that a `fork` made after the thread-local
/// destructors ran (from an `atexit` handler, a static destructor) still
/// holds the lock across it.
type ForkGuard = std::cell::RefCell<std::mem::ManuallyDrop<Option<MutexGuard<'static, Option<State>>>>>;
const _: () = assert!(!std::mem::needs_drop::<ForkGuard>());

thread_local! {
    static FORK_GUARD: ForkGuard = const { std::cell::RefCell::new(std::mem::ManuallyDrop::new(None)) };
}

thread_local! {
    /// The signal mask of a forking thread, restored after the fork (see
    /// [`block_sent_signals`]).
    static FORK_MASK: std::cell::Cell<Option<libc::sigset_t>> = const { std::cell::Cell::new(None) };
}

/// Blocks the signals that end a process by being sent (not the faults)
/// on the forking thread until the fork is done: the child starts with
/// them blocked and takes them once its image exists.  A child killed
/// within milliseconds of its fork (a SIGTERM from its parent) was missing
/// from the trace or left empty files: the signal came before the child's
/// image was set up, or while it was being written.
fn block_sent_signals() {
    // SAFETY: sigset operations on locals; pthread_sigmask of this thread.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in fatal_signals().filter(|&s| !is_fault(s) && s != libc::SIGSYS && s != libc::SIGTRAP) {
            libc::sigaddset(&mut set, sig);
        }
        let mut old: libc::sigset_t = std::mem::zeroed();
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old) == 0 {
            let _ = FORK_MASK.try_with(|m| m.set(Some(old)));
        }
    }
}

/// Restores the mask [`block_sent_signals`] saved.
fn restore_fork_mask() {
    if let Some(old) = FORK_MASK.try_with(|m| m.take()).ok().flatten() {
        // SAFETY: restoring this thread's own saved mask.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    }
}

extern "C" fn fork_prepare() {
    let _ = std::panic::catch_unwind(|| {
        if PID.load(Relaxed) == 0 {
            return;
        }
        block_sent_signals();
        let g = state();
        let _ = FORK_GUARD.try_with(|f| **f.borrow_mut() = Some(g));
        // No chunk half written when the child copies the pool (after the
        // final flush the lock stays taken: nothing is written any more).
        let held = !FINISHED.load(SeqCst) && IO_LOCK.lock_for(10_000);
        FORK_HELD_IO.store(held, SeqCst);
    });
}

/// Whether `fork_prepare` took the I/O lock (the parent gives it back).
static FORK_HELD_IO: AtomicBool = AtomicBool::new(false);

extern "C" fn fork_parent() {
    let _ = std::panic::catch_unwind(|| {
        if PID.load(Relaxed) == 0 {
            return;
        }
        if FORK_HELD_IO.swap(false, SeqCst) {
            IO_LOCK.unlock();
        }
        let _ = FORK_GUARD.try_with(|f| f.borrow_mut().take());
        restore_fork_mask();
    });
}

extern "C" fn fork_child() {
    let _ = std::panic::catch_unwind(|| {
        let parent = (PID.load(Relaxed), IMAGE.load(Relaxed));
        if parent.0 == 0 {
            return;
        }
        let mut guard = FORK_GUARD
            .try_with(|f| f.borrow_mut().take())
            .ok()
            .flatten();
        if let Some(pool) = Pool::get() {
            pool.reset_after_fork(pool::current_slot(), clock::ticks());
        }
        MISSES_AT_FORK.store(fgraph::misses(), Relaxed);
        EXIT_MISSES_AT_FORK.store(fgraph::exit_misses(), Relaxed);
        RECURSION_MISSES_AT_FORK.store(recursion_misses(), Relaxed);
        tracefile::reset_failures();
        let pid = std::process::id();
        match open_image(pid, Some(parent)) {
            Ok(()) => {
                if let Some(Some(st)) = guard.as_deref_mut() {
                    let total = st.disc.sites().count();
                    append_info(&format!("sites = {total}\n"));
                    st.written = 0;
                    write_syms(st);
                }
                drop(guard);
                spawn_writer();
            }
            Err(e) => {
                PID.store(0, Relaxed);
                say(&format!("fork child {pid}: {e}; not recorded"));
            }
        }
        // A signal sent meanwhile is taken now, with the image set up.
        restore_fork_mask();
    });
}
