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
//! exported constructor and early start, the `exec*`/`_exit` interposers
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
fn early_start_supported() -> bool {
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
type ExecvFn = unsafe extern "C" fn(*const c_char, *const *const c_char) -> c_int;
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

/// Runs `run` with `envp`, or with `envp` plus the recording variables it
/// lacks when this process is being recorded: a program that hands exec a
/// cleaned environment is still followed into the new image.
///
/// # Safety
/// `envp` is null or a NULL-terminated array of NUL-terminated strings.
unsafe fn with_record_env(
    envp: *const *const c_char,
    run: impl FnOnce(*const *const c_char) -> c_int,
) -> c_int {
    use std::os::unix::ffi::OsStrExt;
    if envp.is_null() || !session::recording() {
        return run(envp);
    }
    let mut have: Vec<&[u8]> = Vec::new();
    let mut ptrs: Vec<*const c_char> = Vec::new();
    let mut i = 0;
    loop {
        // SAFETY: a NULL-terminated array (the caller's contract).
        let p = unsafe { *envp.add(i) };
        if p.is_null() {
            break;
        }
        // SAFETY: each entry is a NUL-terminated string.
        let s = unsafe { std::ffi::CStr::from_ptr(p) }.to_bytes();
        have.push(s.split(|&b| b == b'=').next().unwrap_or(s));
        ptrs.push(p);
        i += 1;
    }
    let added: Vec<std::ffi::CString> = RECORD_ENV
        .iter()
        .filter(|k| !have.contains(&k.as_bytes()))
        .filter_map(|k| {
            let v = std::env::var_os(k)?;
            std::ffi::CString::new([k.as_bytes(), b"=", v.as_bytes()].concat()).ok()
        })
        .collect();
    if added.is_empty() {
        return run(envp);
    }
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
    // (the environment completed with the recording variables).
    around_exec(|| unsafe {
        with_record_env(envp, |envp| {
            std::mem::transmute::<*mut libc::c_void, ExecveFn>(f)(path, argv, envp)
        })
    })
}

/// # Safety
/// As libc's `execv`.
#[no_mangle]
pub unsafe extern "C" fn execv(path: *const c_char, argv: *const *const c_char) -> c_int {
    let f = next(c"execv");
    if f.is_null() {
        return no_next();
    }
    // SAFETY: libc's execv has this signature; arguments passed through.
    around_exec(|| unsafe { std::mem::transmute::<*mut libc::c_void, ExecvFn>(f)(path, argv) })
}

/// # Safety
/// As libc's `execvp`.
#[no_mangle]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int {
    let f = next(c"execvp");
    if f.is_null() {
        return no_next();
    }
    // SAFETY: libc's execvp has this signature; arguments passed through.
    around_exec(|| unsafe { std::mem::transmute::<*mut libc::c_void, ExecvFn>(f)(file, argv) })
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
    // (the environment completed with the recording variables).
    around_exec(|| unsafe {
        with_record_env(envp, |envp| {
            std::mem::transmute::<*mut libc::c_void, ExecveFn>(f)(file, argv, envp)
        })
    })
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
