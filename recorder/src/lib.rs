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
//! exported constructor and early start, the `exec*`/`posix_spawn*`/`_exit` interposers
//! (this file and the variadic ones in `execl.rs`), the `dlsym` interposer
//! (`dlsym.rs`), the trace files' descriptors (`tracefile.rs`), each with
//! the reason it is sound.

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod dlsym;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod execl;
pub mod ids;
pub mod options;
pub mod pool;
pub mod session;
pub mod startup;
pub mod tracefile;
pub mod tracer;

use std::ffi::{c_char, c_int};

extern "C" fn constructor() {
    // No panic may cross into the loader.
    let _ = std::panic::catch_unwind(session::start);
}

/// Starts recording before any library's constructor runs: called by the
/// audit module (`recorder/audit`) once the program's objects are loaded
/// and relocated and libc's early initialisation is done, but before
/// libc's constructor has set `environ` (so `envp`, the process's
/// environment, is set there first: libc's constructor sets the same
/// array again).  Without it the libraries the program links would run
/// their constructors before this library's, with nothing patched yet.
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
    // (null) — it will set it to this same array in its constructor.
    unsafe {
        if environ.is_null() {
            environ = envp;
        }
    }
    // No panic may cross into the loader.
    let _ = std::panic::catch_unwind(|| {
        ftramp_runtime::sites::starting_up();
        session::start()
    });
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
const RECORD_ENV: [&str; 14] = [
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
    ftramp_runtime::clock::ENV,
    "FTRAMP_PRELOAD",
];

/// The file an exec or spawn of `file` runs: `file` itself, or when
/// `search` and it has no slash, the first executable file of that name in
/// `PATH` (as `execvp` and `posix_spawnp` look for it).
///
/// # Safety
/// `file` is null or a NUL-terminated string.
unsafe fn exec_target(file: *const c_char, search: bool) -> Option<std::path::PathBuf> {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    if file.is_null() {
        return None;
    }
    // SAFETY: per the caller's contract.
    let name = unsafe { std::ffi::CStr::from_ptr(file) }.to_bytes();
    if name.is_empty() {
        return None;
    }
    if !search || name.contains(&b'/') {
        return Some(std::ffi::OsString::from_vec(name.to_vec()).into());
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/bin:/usr/bin".into());
    std::env::split_paths(&path).map(|d| d.join(std::ffi::OsStr::from_bytes(name))).find(|p| {
        let Ok(c) = std::ffi::CString::new(p.as_os_str().as_bytes()) else { return false };
        // SAFETY: access(2) with a NUL-terminated path.
        p.is_file() && unsafe { libc::access(c.as_ptr(), libc::X_OK) } == 0
    })
}

/// Runs `run` with `envp`, or, when this process is being recorded, with
/// `envp` completed for the new image: the recording variables it lacks
/// (a program that hands exec a cleaned environment is still followed into
/// the new image), `LD_PRELOAD` with `target`'s sanitizer runtime first,
/// and `GLIBC_TUNABLES` with room for the initial-exec TLS of `target`'s
/// libraries beside the audit module ([`startup`]).
///
/// # Safety
/// `envp` is null or a NULL-terminated array of NUL-terminated strings.
unsafe fn with_record_env(
    target: Option<std::path::PathBuf>,
    envp: *const *const c_char,
    run: impl FnOnce(*const *const c_char) -> c_int,
) -> c_int {
    use std::ffi::{CString, OsStr};
    use std::os::unix::ffi::OsStrExt;
    if envp.is_null() {
        return run(envp);
    }
    // Not recording: a `vfork` child (dash runs commands so), whose
    // allocations would stay in its parent once the exec succeeds.  Only
    // the TLS room is seen to there: what is worked out for it is freed
    // before the exec, and a new environment is made (and left behind) only
    // for an image that needs the room.
    let recording = session::recording();
    // The entries as (name, value, pointer).
    let mut entries: Vec<(&[u8], &[u8], *const c_char)> = Vec::new();
    let mut i = 0;
    loop {
        // SAFETY: a NULL-terminated array (the caller's contract).
        let p = unsafe { *envp.add(i) };
        if p.is_null() {
            break;
        }
        // SAFETY: each entry is a NUL-terminated string.
        let s = unsafe { std::ffi::CStr::from_ptr(p) }.to_bytes();
        let (name, value) = match s.iter().position(|&b| b == b'=') {
            Some(at) => (&s[..at], &s[at + 1..]),
            None => (s, &b""[..]),
        };
        entries.push((name, value, p));
        i += 1;
    }
    let has = |k: &str| entries.iter().any(|(n, _, _)| *n == k.as_bytes());
    let value_of = |k: &str| entries.iter().find(|(n, _, _)| *n == k.as_bytes()).map(|(_, v, _)| OsStr::from_bytes(v));
    let var = |k: &str, v: &OsStr| CString::new([k.as_bytes(), b"=", v.as_bytes()].concat()).ok();
    let mut added: Vec<CString> = RECORD_ENV
        .iter()
        .filter(|k| recording && !has(k))
        .filter_map(|k| var(k, &std::env::var_os(k)?))
        .collect();
    let mut replaced: Vec<&str> = Vec::new();
    // The new image's sanitizer runtime first, when it gets the recorder.
    let mut preload = value_of("LD_PRELOAD").map(OsStr::to_os_string).or_else(|| std::env::var_os("LD_PRELOAD").filter(|_| recording));
    if let (Some(target), Some(current)) = (&target, &preload) {
        // (No panic may cross into the program.)
        let want = std::panic::catch_unwind(|| startup::preload_for(target, current)).ok().flatten();
        if let Some(want) = want.filter(|w| Some(w.as_os_str()) != value_of("LD_PRELOAD")) {
            replaced.push("LD_PRELOAD");
            added.retain(|c| !c.as_bytes().starts_with(b"LD_PRELOAD="));
            added.extend(var("LD_PRELOAD", &want));
            preload = Some(want);
        }
    }
    // The initial-exec TLS room, when the new image gets the audit module.
    let audit = value_of("LD_AUDIT").map(OsStr::to_os_string).or_else(|| std::env::var_os("LD_AUDIT").filter(|_| recording));
    if let Some(target) = target.filter(|_| audit.is_some_and(|a| !a.is_empty())) {
        // The user's own, also when `envp` is the one this image started
        // with (main's third argument), which still has ours.
        let saved = value_of(startup::ENV_USER_TUNABLES);
        let current = value_of("GLIBC_TUNABLES");
        let user = saved.map_or(current, startup::decode_user_tunables);
        let preloads: Vec<std::path::PathBuf> = preload
            .as_deref()
            .unwrap_or_default()
            .as_bytes()
            .split(|&b| b == b':' || b == b' ')
            .filter(|p| !p.is_empty())
            .map(|p| std::path::PathBuf::from(OsStr::from_bytes(p)))
            .filter(|p| p.file_name() != Some(OsStr::new(startup::PRELOAD_NAME)))
            .collect();
        // (No panic may cross into the program.)
        let need = std::panic::catch_unwind(|| startup::need(&target, value_of("LD_LIBRARY_PATH"), &preloads))
            .ok()
            .flatten()
            .map_or(0, |(_, n)| n);
        drop(preloads);
        let lossy = |v: Option<&OsStr>| v.map(|u| u.to_string_lossy().into_owned());
        let want = startup::tunables(lossy(user).as_deref(), need);
        if saved.is_some() || want != lossy(current) {
            replaced.extend(["GLIBC_TUNABLES", startup::ENV_USER_TUNABLES]);
            if let Some(w) = &want {
                added.extend(var("GLIBC_TUNABLES", OsStr::new(w)));
            }
            if want != lossy(user) {
                added.extend(var(startup::ENV_USER_TUNABLES, &startup::encode_user_tunables(user)));
            }
        }
    }
    if added.is_empty() && replaced.is_empty() {
        return run(envp);
    }
    let mut ptrs: Vec<*const c_char> = entries
        .iter()
        .filter(|(n, _, _)| !replaced.iter().any(|r| r.as_bytes() == *n))
        .map(|(_, _, p)| *p)
        .collect();
    ptrs.extend(added.iter().map(|c| c.as_ptr()));
    ptrs.push(std::ptr::null());
    run(ptrs.as_ptr())
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

/// # Safety
/// As libc's `execve`.
#[no_mangle]
pub unsafe extern "C" fn execve(
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    let f = next(c"execve");
    if f.is_null() {
        return no_next();
    }
    // SAFETY: libc's execve has this signature; arguments passed through
    // (the environment completed for the new image); `path` is the
    // caller's NUL-terminated string.
    around_exec(|| unsafe {
        with_record_env(exec_target(path, false), envp, |envp| {
            std::mem::transmute::<*mut libc::c_void, ExecveFn>(f)(path, argv, envp)
        })
    })
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
    let f = next(c"execvpe");
    if f.is_null() {
        return no_next();
    }
    // SAFETY: libc's execvpe has this signature; arguments passed through
    // (the environment completed for the new image); `file` is the
    // caller's NUL-terminated string.
    around_exec(|| unsafe {
        with_record_env(exec_target(file, true), envp, |envp| {
            std::mem::transmute::<*mut libc::c_void, ExecveFn>(f)(file, argv, envp)
        })
    })
}

type SpawnFn = unsafe extern "C" fn(
    *mut libc::pid_t,
    *const c_char,
    *const libc::posix_spawn_file_actions_t,
    *const libc::posix_spawnattr_t,
    *const *const c_char,
    *const *const c_char,
) -> c_int;

/// `posix_spawn` or `posix_spawnp` (`search`) of `file` through libc's
/// (`call` passes it the other arguments), with the environment completed
/// for the new image as the exec interposers do (a spawn does not go
/// through them).
///
/// # Safety
/// As libc's `posix_spawn`; `envp` is the caller's.
unsafe fn spawn(
    name: &std::ffi::CStr,
    search: bool,
    file: *const c_char,
    envp: *const *const c_char,
    call: impl FnOnce(SpawnFn, *const *const c_char) -> c_int,
) -> c_int {
    let f = next(name);
    if f.is_null() {
        return libc::ENOSYS;
    }
    // SAFETY: libc's posix_spawn and posix_spawnp have this signature;
    // `file` is the caller's NUL-terminated string, `envp` its environment.
    unsafe {
        let f = std::mem::transmute::<*mut libc::c_void, SpawnFn>(f);
        with_record_env(exec_target(file, search), envp, |envp| call(f, envp))
    }
}

/// # Safety
/// As libc's `posix_spawn`.
#[no_mangle]
pub unsafe extern "C" fn posix_spawn(
    pid: *mut libc::pid_t,
    path: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    // SAFETY: as posix_spawn, the arguments passed through (the
    // environment completed).
    unsafe { spawn(c"posix_spawn", false, path, envp, |f, envp| f(pid, path, actions, attr, argv, envp)) }
}

/// # Safety
/// As libc's `posix_spawnp`.
#[no_mangle]
pub unsafe extern "C" fn posix_spawnp(
    pid: *mut libc::pid_t,
    file: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    // SAFETY: as posix_spawnp, the arguments passed through (the
    // environment completed).
    unsafe { spawn(c"posix_spawnp", true, file, envp, |f, envp| f(pid, file, actions, attr, argv, envp)) }
}

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
