//! `libftramp_recorder.so`: the library `ftramp record` preloads into the
//! program it runs (`LD_PRELOAD`).  Its start — called by the audit module
//! (`recorder/audit`, `LD_AUDIT`) before any constructor runs, else by its
//! own constructor — reads the options from the environment ([`options`]),
//! discovers the patch sites of the program and its libraries, and
//! registers an fgraph user (function_graph) or an ops (function); threads
//! append events to buffers from a preallocated pool ([`pool`]) that a
//! writer thread writes into the trace directory
//! ([`ftramp_trace::format`]).  [`session`] handles fork, exec, exit and
//! crashes.
//!
//! `unsafe` here: the pool's buffers and thread slots (`pool.rs`), the id
//! table (`ids.rs`), signal/atfork/exit handlers (`session.rs`), the
//! exported constructor and early start, the `exec*`/`fexecve`/`posix_spawn*`/`_exit` interposers
//! (this file and the variadic ones in `execl.rs`), the `dlsym` interposer
//! (`dlsym.rs`), the `sigaction`/`signal` interposers (`sigaction.rs`), the
//! trace files' descriptors (`tracefile.rs`), the heap (`alloc.rs`: glibc's
//! allocator by its own names, never a `malloc` the program defines), each
//! with the reason it is sound.

mod alloc;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod dlsym;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod execl;
pub mod ids;
pub mod options;
pub mod pool;
pub mod session;
mod sigaction;
pub mod startup;
pub mod tracefile;
pub mod tracer;

use std::ffi::{c_char, c_int};
use std::sync::atomic::{AtomicPtr, Ordering::Relaxed};

extern "C" fn constructor() {
    // No panic may cross into the loader.
    let _ = std::panic::catch_unwind(session::start);
}

/// Starts recording before any library's constructor runs: called by the
/// audit module (`recorder/audit`) once the program's objects are loaded
/// and relocated and libc's early initialisation is done, but before
/// libc's constructor has set `environ`.  So the environment is set there
/// first: `envp`, which the audit module finds after the loader's
/// argument vector, else (null: a loader without `_dl_argv`) a copy read
/// from `/proc/self/environ`, which at this point is the environment the
/// process was started with — natively; under qemu-user it is qemu's.
/// libc's constructor then sets its own array.  Without it the libraries the
/// program links would run their constructors before this library's,
/// with nothing patched yet.
///
/// # Safety
/// Called by the audit module, single-threaded, before constructors;
/// `envp` is null or the process's NULL-terminated environment.
#[no_mangle]
pub unsafe extern "C" fn ftramp_recorder_early_start(envp: *const *const c_char) {
    extern "C" {
        static mut environ: *const *const c_char;
    }
    if !early_start_supported() {
        return;
    }
    // SAFETY: no other thread exists yet and libc has not set `environ`
    // (null) — it will set it to its own array in its constructor.
    unsafe {
        if environ.is_null() {
            let envp = if envp.is_null() { initial_environment() } else { Some(envp) };
            match envp {
                Some(envp) => environ = envp,
                // No environment to read options from: the constructor starts.
                None => return,
            }
        }
    }
    // No panic may cross into the loader.
    let _ = std::panic::catch_unwind(session::start);
}

/// The environment the process started with, from `/proc/self/environ`,
/// as a NULL-terminated array of strings that lives as long as the
/// process (`environ` may point into it until libc's constructor runs, and
/// strings `getenv` returned meanwhile may be kept).  `None` without
/// `/proc`.
fn initial_environment() -> Option<*const *const c_char> {
    let bytes = std::fs::read("/proc/self/environ").ok()?;
    let strings: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    let mut array: Vec<*const c_char> = Vec::new();
    let mut start = 0;
    for (i, &b) in strings.iter().enumerate() {
        if b == 0 {
            array.push(strings[start..].as_ptr().cast());
            start = i + 1;
        }
    }
    // A last string without its NUL (the kernel stops at the recorded
    // end) would be unterminated: left out.
    array.push(std::ptr::null());
    let array = Box::leak(array.into_boxed_slice()).as_mut_ptr();
    // Kept reachable from a global: libc's constructor replaces `environ`,
    // and a leak checker (LeakSanitizer in a sanitized program) would
    // otherwise report the copy as leaked at exit.
    static INITIAL_ENVIRONMENT: AtomicPtr<*const c_char> = AtomicPtr::new(std::ptr::null_mut());
    INITIAL_ENVIRONMENT.store(array, Relaxed);
    Some(array.cast_const())
}

/// Whether this glibc has done, at the audit module's call, what starting
/// threads needs: 2.34 and later (one libc with `pthread` inside, and
/// `__libc_early_init` run before the audit checkpoint).  Older ones start
/// in the constructor, as without the audit module.
pub fn early_start_supported() -> bool {
    // SAFETY: gnu_get_libc_version returns a static NUL-terminated string.
    let v = unsafe { std::ffi::CStr::from_ptr(libc::gnu_get_libc_version()) };
    let mut parts = v.to_str().unwrap_or("").split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= (2, 34)
}

/// Runs [`constructor`] when the library is loaded, before `main`.
#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = constructor;

type ExecveFn =
    unsafe extern "C" fn(*const c_char, *const *const c_char, *const *const c_char) -> c_int;
type ExitFn = unsafe extern "C" fn(c_int) -> !;

/// The next definition of `name` after this library (libc's).
fn next(name: &std::ffi::CStr) -> *mut libc::c_void {
    // SAFETY: dlsym with a NUL-terminated name; RTLD_NEXT is valid in a
    // shared object.
    unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) }
}

/// The variables an exec'd image needs to be recorded too.
const RECORD_ENV: [&str; 15] = [
    "LD_PRELOAD",
    "LD_AUDIT",
    options::ENV_DIR,
    options::ENV_TRACER,
    options::ENV_FILTER,
    options::ENV_NOTRACE,
    options::ENV_DEPTH,
    options::ENV_MIN_DURATION,
    options::ENV_MAIN_ONLY,
    options::ENV_BUFFER_SIZE,
    options::ENV_BUFFERS,
    options::ENV_RECORD_PID,
    options::ENV_QUIET,
    ftramp_runtime::clock::ENV,
    "FTRAMP_PRELOAD",
];

/// The recording variables as this image started with them (the trace
/// directory made absolute), kept at the start for the images it execs:
/// a program that clears its environment, or removes them from it, before
/// it execs with it (make's test driver keeps a few variables of its own
/// for every `make` it runs) still has them recorded.  Until the
/// twenty-ninth session they were taken from the environment at the exec,
/// and such children ran untraced without a word.
static OWN_RECORD_ENV: std::sync::OnceLock<Vec<(&'static str, std::ffi::OsString)>> = std::sync::OnceLock::new();

/// Keeps [`RECORD_ENV`]'s values ([`OWN_RECORD_ENV`]); at the start, after
/// the trace directory was made absolute in the environment.
pub(crate) fn keep_record_env() {
    let _ = OWN_RECORD_ENV.set(RECORD_ENV.iter().filter_map(|k| Some((*k, ftramp_runtime::env::var_os(k)?))).collect());
}

/// The value of recording variable `k` this image keeps for the images it
/// execs: the one it started with, else (not started) the environment's,
/// read from `environ` — never through the program's `getenv`, which bash
/// replaces with a lookup of its shell variables (and whose calls, made
/// after the flush before an exec, were counted as events lost after the
/// final flush when the exec failed).
fn own_record_var(k: &str) -> Option<std::ffi::OsString> {
    match OWN_RECORD_ENV.get() {
        Some(kept) => kept.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone()),
        None => ftramp_runtime::env::var_os(k),
    }
}

/// The file an exec or spawn of `file` runs: `file` itself, or when
/// `search` and it has no slash, the first executable file of that name in
/// `PATH` (as `execvp` and `posix_spawnp` look for it).
///
/// # Safety
/// `file` is null or a NUL-terminated string.
unsafe fn exec_target(file: *const c_char, search: bool) -> Option<std::path::PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: per the caller's contract.
    let name = unsafe { c_path(file.as_ref()?) };
    if name.as_os_str().is_empty() {
        return None;
    }
    if !search || name.as_os_str().as_bytes().contains(&b'/') {
        return Some(name.to_path_buf());
    }
    let path = ftramp_runtime::env::var_os("PATH").unwrap_or_else(|| "/bin:/usr/bin".into());
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| {
        let Ok(c) = std::ffi::CString::new(p.as_os_str().as_bytes()) else { return false };
        // SAFETY: access(2) with a NUL-terminated path.
        p.is_file() && unsafe { libc::access(c.as_ptr(), libc::X_OK) } == 0
    })
}

/// Variables [`exec_env_changes`] may replace: bit `i` of its mask is
/// `REPLACED[i]`.
const REPLACED: [&str; 3] = ["LD_PRELOAD", "GLIBC_TUNABLES", startup::ENV_USER_TUNABLES];

thread_local! {
    /// The environment last made for an exec or spawn on this thread (its
    /// strings, then the pointer array), kept for the next one rather than
    /// freed: in a `vfork` child (dash and CPython start commands so) it is
    /// the parent's memory, and what the child allocated and did not free
    /// before its exec would stay there for good.  Never destroyed (no
    /// destructor: `ManuallyDrop`), so that an exec or spawn made after the
    /// thread-local destructors ran — from an `atexit` handler, a static
    /// destructor — still finds it (until the twenty-seventh session the
    /// recorder then panicked and the program aborted).  A thread leaves it
    /// allocated at its end: one environment's worth, on the threads that
    /// spawned with an environment of their own.
    static EXEC_ENV: ExecEnv =
        const { std::cell::RefCell::new(std::mem::ManuallyDrop::new((Vec::new(), Vec::new()))) };
    /// The process whose exec is using [`EXEC_ENV`] (0: none).  A pid, not
    /// a flag (nor a `RefCell` borrow held across the exec): a `vfork`
    /// child whose exec succeeded leaves it set in its parent's memory, and
    /// it must then read as free.
    static EXEC_ENV_USER: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// [`EXEC_ENV`]'s type: its strings, then the pointer array.
type ExecEnv = std::cell::RefCell<std::mem::ManuallyDrop<(Vec<u8>, Vec<*const c_char>)>>;

// EXEC_ENV must outlive the thread-local destructors (see there).
const _: () = assert!(!std::mem::needs_drop::<ExecEnv>());

/// Runs `run` with `envp`, or, when recording started in this image or the
/// one it was (v)forked from, with `envp` completed for the new image: the
/// recording variables it lacks (a program that hands exec a cleaned
/// environment is still followed into the new image), `LD_PRELOAD` with
/// the sanitizer runtime of the file it runs (`target`, asked for only
/// then) first, and `GLIBC_TUNABLES` with room for the initial-exec TLS of
/// its libraries beside the audit module ([`startup`]).  Everything worked
/// out is freed before the exec, and the new environment is made in
/// [`EXEC_ENV`].
///
/// # Safety
/// `envp` is null or a NULL-terminated array of NUL-terminated strings.
unsafe fn with_record_env(
    target: impl FnOnce() -> Option<std::path::PathBuf>,
    envp: *const *const c_char,
    run: impl FnOnce(*const *const c_char) -> c_int,
) -> c_int {
    if !session::started_here_or_before_fork() {
        return run(envp);
    }
    // A null environment is an empty one (Linux's `execve`; `execv` after
    // `clearenv`, which leaves `environ` null): completed like any other.
    static NO_ENV: [usize; 1] = [0];
    let envp = if envp.is_null() { NO_ENV.as_ptr().cast::<*const c_char>() } else { envp };
    let pid = std::process::id();
    if EXEC_ENV_USER.get() == pid {
        // An exec from a signal handler in the middle of one.
        return run(envp);
    }
    // SAFETY: `envp` per the caller's contract.  (No panic may cross into
    // the program.)
    let changes = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe { exec_env_changes(target, envp) }));
    let Ok(Some((replaced, added))) = changes else {
        return run(envp);
    };
    EXEC_ENV_USER.set(pid);
    // The new environment, built in EXEC_ENV; no borrow is held across the
    // exec, and everything else is freed before it.
    let new_envp = EXEC_ENV.with(|cell| {
        let mut scratch = cell.borrow_mut();
        let (strings, ptrs) = &mut **scratch;
        strings.clear();
        strings.extend_from_slice(&added);
        drop(added);
        ptrs.clear();
        let mut i = 0;
        loop {
            // SAFETY: a NULL-terminated array of NUL-terminated strings (the
            // caller's contract).
            let p = unsafe { *envp.add(i) };
            if p.is_null() {
                break;
            }
            // SAFETY: as above.
            let s = unsafe { std::ffi::CStr::from_ptr(p) }.to_bytes();
            let name = s.split(|&b| b == b'=').next().unwrap_or(s);
            if !REPLACED.iter().enumerate().any(|(bit, r)| replaced & (1 << bit) != 0 && r.as_bytes() == name) {
                ptrs.push(p);
            }
            i += 1;
        }
        let mut at = 0;
        while at < strings.len() {
            ptrs.push(strings[at..].as_ptr() as *const c_char);
            at += strings[at..].iter().position(|&b| b == 0).map_or(strings.len(), |n| n + 1);
        }
        ptrs.push(std::ptr::null());
        ptrs.as_ptr()
    });
    // EXEC_ENV is left alone until EXEC_ENV_USER is cleared (only this
    // exec could change it: other threads have their own).
    let r = run(new_envp);
    EXEC_ENV_USER.set(0);
    r
}

/// What [`with_record_env`] changes in `envp` for `target`: the mask of
/// [`REPLACED`] variables to leave out, and the NUL-terminated `name=value`
/// strings to add; `None` when nothing changes.
///
/// # Safety
/// `envp` is a NULL-terminated array of NUL-terminated strings.
unsafe fn exec_env_changes(target: impl FnOnce() -> Option<std::path::PathBuf>, envp: *const *const c_char) -> Option<(u8, Vec<u8>)> {
    use std::ffi::{OsStr, OsString};
    use std::os::unix::ffi::OsStrExt;
    // The entries as (name, value).
    let mut entries: Vec<(&[u8], &[u8])> = Vec::new();
    let mut i = 0;
    loop {
        // SAFETY: a NULL-terminated array (the caller's contract).
        let p = unsafe { *envp.add(i) };
        if p.is_null() {
            break;
        }
        // SAFETY: each entry is a NUL-terminated string.
        let s = unsafe { std::ffi::CStr::from_ptr(p) }.to_bytes();
        entries.push(match s.iter().position(|&b| b == b'=') {
            Some(at) => (&s[..at], &s[at + 1..]),
            None => (s, &b""[..]),
        });
        i += 1;
    }
    let value_of = |k: &str| entries.iter().find(|(n, _)| *n == k.as_bytes()).map(|(_, v)| OsStr::from_bytes(v));
    // The value the new image gets: the entry's, else ours (added below).
    let inherited = |k: &str| value_of(k).map(OsStr::to_os_string).or_else(|| own_record_var(k));
    let mut added: Vec<(&str, OsString)> = RECORD_ENV.iter().filter(|k| value_of(k).is_none()).filter_map(|k| Some((*k, own_record_var(k)?))).collect();
    let target = target();
    let mut replaced = 0u8;
    let mut replace = |bit: usize, value: Option<OsString>, added: &mut Vec<(&str, OsString)>| {
        replaced |= 1 << bit;
        added.retain(|(k, _)| *k != REPLACED[bit]);
        added.extend(value.map(|v| (REPLACED[bit], v)));
    };
    // An `LD_PRELOAD` of the program's own gets the recorder too.
    if let Some(own) = value_of("LD_PRELOAD").and_then(startup::with_recorder) {
        replace(0, Some(own), &mut added);
    }
    // The new image's sanitizer runtime first, when it gets the recorder.
    let mut preload = added.iter().find(|(k, _)| *k == "LD_PRELOAD").map(|(_, v)| v.clone()).or_else(|| inherited("LD_PRELOAD"));
    if let (Some(target), Some(current)) = (&target, &preload) {
        if let Some(want) = startup::preload_for(target, current).filter(|w| Some(w.as_os_str()) != value_of("LD_PRELOAD")) {
            replace(0, Some(want.clone()), &mut added);
            preload = Some(want);
        }
    }
    // The initial-exec TLS room, when the new image gets the audit module.
    if let Some(target) = target.filter(|_| inherited("LD_AUDIT").is_some_and(|a| !a.is_empty())) {
        // The user's own tunables, also when `envp` is the one this image
        // started with (main's third argument), which still has ours.
        let saved = value_of(startup::ENV_USER_TUNABLES);
        let current = value_of("GLIBC_TUNABLES");
        let user = saved.map_or(current, startup::decode_user_tunables);
        let want = startup::tunables_for(&target, value_of("LD_LIBRARY_PATH"), preload.as_deref(), user);
        let lossy = |v: Option<&OsStr>| v.map(|u| u.to_string_lossy().into_owned());
        if saved.is_some() || want != lossy(current) {
            replace(1, want.clone().map(OsString::from), &mut added);
            let saved = (want != lossy(user)).then(|| startup::encode_user_tunables(user));
            replace(2, saved, &mut added);
        }
    }
    if added.is_empty() && replaced == 0 {
        return None;
    }
    let mut strings = Vec::new();
    for (k, v) in &added {
        // (A value with a NUL in it cannot be passed.)
        if !v.as_bytes().contains(&0) {
            strings.extend_from_slice(k.as_bytes());
            strings.push(b'=');
            strings.extend_from_slice(v.as_bytes());
            strings.push(0);
        }
    }
    Some((replaced, strings))
}

/// Flushes before an exec, runs it, and resumes recording if it failed.
fn around_exec(run: impl FnOnce() -> c_int) -> c_int {
    let finished = std::panic::catch_unwind(session::before_exec).unwrap_or(false);
    let r = run();
    if finished {
        let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        let _ = std::panic::catch_unwind(session::exec_failed);
        // SAFETY: restoring errno for the caller.
        unsafe { *libc::__errno_location() = errno };
    }
    r
}

fn no_next() -> c_int {
    // SAFETY: setting errno.
    unsafe { *libc::__errno_location() = libc::ENOSYS };
    -1
}

extern "C" {
    /// The process's environment (libc's).
    static environ: *const *const c_char;
}

/// An exec through libc's `name`: flushes first ([`around_exec`]) and
/// completes the environment for the file it runs ([`with_record_env`];
/// `target`, asked for only when needed); `call` runs libc's function,
/// passed as its address, with the environment to use.
///
/// # Safety
/// `call` calls the address as libc's `name`; `envp` as in
/// [`with_record_env`].
unsafe fn exec_through(
    name: &std::ffi::CStr,
    target: impl FnOnce() -> Option<std::path::PathBuf>,
    envp: *const *const c_char,
    call: impl FnOnce(*mut libc::c_void, *const *const c_char) -> c_int,
) -> c_int {
    let f = next(name);
    if f.is_null() {
        return no_next();
    }
    // SAFETY: per this function's contract.
    around_exec(|| unsafe { with_record_env(target, envp, |envp| call(f, envp)) })
}

/// A C string argument as a path.
///
/// # Safety
/// `s` is a NUL-terminated string.
unsafe fn c_path<'a>(s: *const c_char) -> &'a std::path::Path {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: per this function's contract.
    std::path::Path::new(std::ffi::OsStr::from_bytes(unsafe { std::ffi::CStr::from_ptr(s) }.to_bytes()))
}

/// # Safety
/// As libc's `execve`.
#[no_mangle]
pub unsafe extern "C" fn execve(
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    // SAFETY: libc's execve has this signature; arguments passed through
    // (the environment completed for the new image); `path` is the
    // caller's NUL-terminated string.
    unsafe {
        exec_through(c"execve", || exec_target(path, false), envp, |f, envp| {
            std::mem::transmute::<*mut libc::c_void, ExecveFn>(f)(path, argv, envp)
        })
    }
}

/// As libc's, `execve` with the process's environment (so that the new
/// image gets its own `GLIBC_TUNABLES`, see [`with_record_env`]).
///
/// # Safety
/// As libc's `execv`.
#[no_mangle]
pub unsafe extern "C" fn execv(path: *const c_char, argv: *const *const c_char) -> c_int {
    // SAFETY: as execve, with libc's `environ`, read once.
    unsafe { execve(path, argv, environ) }
}

/// As libc's, `execvpe` with the process's environment.
///
/// # Safety
/// As libc's `execvp`.
#[no_mangle]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int {
    // SAFETY: as execvpe, with libc's `environ`, read once.
    unsafe { execvpe(file, argv, environ) }
}

/// # Safety
/// As libc's `execvpe`.
#[no_mangle]
pub unsafe extern "C" fn execvpe(
    file: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    // SAFETY: libc's execvpe has this signature; arguments passed through
    // (the environment completed for the new image); `file` is the
    // caller's NUL-terminated string.
    unsafe {
        exec_through(c"execvpe", || exec_target(file, true), envp, |f, envp| {
            std::mem::transmute::<*mut libc::c_void, ExecveFn>(f)(file, argv, envp)
        })
    }
}

type FexecveFn = unsafe extern "C" fn(c_int, *const *const c_char, *const *const c_char) -> c_int;
type ExecveatFn =
    unsafe extern "C" fn(c_int, *const c_char, *const *const c_char, *const *const c_char, c_int) -> c_int;

/// # Safety
/// As libc's `fexecve`.
#[no_mangle]
pub unsafe extern "C" fn fexecve(fd: c_int, argv: *const *const c_char, envp: *const *const c_char) -> c_int {
    let target = || Some(std::path::PathBuf::from(format!("/proc/self/fd/{fd}")));
    // SAFETY: libc's fexecve has this signature; arguments passed through
    // (the environment completed for the new image).
    unsafe {
        exec_through(c"fexecve", target, envp, |f, envp| std::mem::transmute::<*mut libc::c_void, FexecveFn>(f)(fd, argv, envp))
    }
}

/// # Safety
/// As libc's `execveat` (glibc 2.34 and later).
#[no_mangle]
pub unsafe extern "C" fn execveat(
    dirfd: c_int,
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
    flags: c_int,
) -> c_int {
    // The file it runs: `path`, or `path` under the directory `dirfd`, or
    // `dirfd` itself with AT_EMPTY_PATH and an empty `path`.
    let target = || {
        // SAFETY: the caller's NUL-terminated string.
        let p = unsafe { c_path(path.as_ref()?) };
        let dir = std::path::PathBuf::from(format!("/proc/self/fd/{dirfd}"));
        Some(match () {
            _ if p.as_os_str().is_empty() && flags & libc::AT_EMPTY_PATH != 0 => dir,
            _ if p.is_absolute() || dirfd == libc::AT_FDCWD => p.to_path_buf(),
            _ => dir.join(p),
        })
    };
    // SAFETY: libc's execveat has this signature; arguments passed through
    // (the environment completed for the new image).
    unsafe {
        exec_through(c"execveat", target, envp, |f, envp| {
            std::mem::transmute::<*mut libc::c_void, ExecveatFn>(f)(dirfd, path, argv, envp, flags)
        })
    }
}

type SpawnFn = unsafe extern "C" fn(
    *mut libc::pid_t,
    *const c_char,
    *const libc::posix_spawn_file_actions_t,
    *const libc::posix_spawnattr_t,
    *const *const c_char,
    *const *const c_char,
) -> c_int;

/// `posix_spawn` and `posix_spawnp` (`search`: `file` is looked for in
/// `PATH`): through libc's, with the environment completed for the new
/// image as the exec interposers do (a spawn does not go through them).
macro_rules! spawn_interposer {
    ($name:ident, $search:expr) => {
        /// # Safety
        /// As libc's function of the same name.
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            pid: *mut libc::pid_t,
            file: *const c_char,
            actions: *const libc::posix_spawn_file_actions_t,
            attr: *const libc::posix_spawnattr_t,
            argv: *const *const c_char,
            envp: *const *const c_char,
        ) -> c_int {
            let name = std::ffi::CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()).unwrap();
            let f = next(name);
            if f.is_null() {
                return libc::ENOSYS;
            }
            // SAFETY: libc's function has this signature; arguments passed
            // through (the environment completed); `file` is the caller's
            // NUL-terminated string, `envp` its environment.
            unsafe {
                let f = std::mem::transmute::<*mut libc::c_void, SpawnFn>(f);
                with_record_env(|| exec_target(file, $search), envp, |envp| f(pid, file, actions, attr, argv, envp))
            }
        }
    };
}

spawn_interposer!(posix_spawn, false);
spawn_interposer!(posix_spawnp, true);

/// Finishes the trace, then ends the process through libc's `name`
/// (`_exit`, `_Exit`, `quick_exit`).
///
/// # Safety
/// `name` is a libc function of type [`ExitFn`]; as that function, the
/// call ends the process under whatever the program still runs.
unsafe fn exit_through(name: &std::ffi::CStr, status: c_int) -> ! {
    let _ = std::panic::catch_unwind(|| session::before_exit(status));
    let f = next(name);
    if !f.is_null() {
        // SAFETY: these libc functions have this signature.
        unsafe { std::mem::transmute::<*mut libc::c_void, ExitFn>(f)(status) }
    }
    // SAFETY: the raw system call ends the process.
    unsafe { libc::syscall(libc::SYS_exit_group, status as libc::c_long) };
    unreachable!("exit_group returned")
}

/// # Safety
/// As libc's `daemon(3)`, which this does as its manual says: `fork`, the
/// parent ends with `_exit(0)`, the child calls `setsid`, `chdir("/")`
/// unless `nochdir`, and puts `/dev/null` on descriptors 0-2 unless
/// `noclose` (failing with `ENODEV` if that is no character device).
/// The parent's end then goes through [`_exit`], so its trace is
/// finished: glibc's own `daemon` calls its internal `_exit`, which no
/// interposer sees, and the parent's events were lost, its image reported
/// as ended unseen (every tmux server start, found by a helper; test
/// `daemon_keeps_the_parents_events`).
#[no_mangle]
pub unsafe extern "C" fn daemon(nochdir: c_int, noclose: c_int) -> c_int {
    // SAFETY: fork (the recorder's fork handlers run as for any fork); the
    // parent then ends as `_exit(0)` would.
    match unsafe { libc::fork() } {
        -1 => return -1,
        0 => {}
        // SAFETY: as libc's _exit.
        _ => unsafe { exit_through(c"_exit", 0) },
    }
    // SAFETY: system calls with integer arguments, NUL-terminated paths
    // and a stat buffer of ours.
    unsafe {
        if libc::setsid() == -1 {
            return -1;
        }
        if nochdir == 0 {
            let _ = libc::chdir(c"/".as_ptr());
        }
        if noclose == 0 {
            let fd = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
            if fd == -1 {
                return -1;
            }
            let mut st: libc::stat = std::mem::zeroed();
            if libc::fstat(fd, &mut st) != 0 || st.st_mode & libc::S_IFMT != libc::S_IFCHR {
                libc::close(fd);
                *libc::__errno_location() = libc::ENODEV;
                return -1;
            }
            for target in 0..3 {
                libc::dup2(fd, target);
            }
            if fd > 2 {
                libc::close(fd);
            }
        }
    }
    0
}

/// # Safety
/// As libc's `_exit`.
#[no_mangle]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    // SAFETY: as libc's _exit.
    unsafe { exit_through(c"_exit", status) }
}

/// # Safety
/// As libc's `_Exit` (an alias of `_exit` there, under its own symbol).
#[no_mangle]
pub unsafe extern "C" fn _Exit(status: c_int) -> ! {
    // SAFETY: as libc's _Exit.
    unsafe { exit_through(c"_Exit", status) }
}

/// # Safety
/// As libc's `quick_exit`: the program's `at_quick_exit` handlers run
/// first (they may call traced functions), then the recorder's, registered
/// before them, which finishes the trace with this status.
#[no_mangle]
pub unsafe extern "C" fn quick_exit(status: c_int) -> ! {
    session::QUICK_EXIT_STATUS.store(status, std::sync::atomic::Ordering::Relaxed);
    let f = next(c"quick_exit");
    if !f.is_null() {
        // SAFETY: libc's quick_exit has this signature.
        unsafe { std::mem::transmute::<*mut libc::c_void, ExitFn>(f)(status) }
    }
    // SAFETY: as libc's _exit.
    unsafe { exit_through(c"_exit", status) }
}
