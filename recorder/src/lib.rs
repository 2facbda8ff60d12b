//! `libftramp_recorder.so`: the library `ftramp record` preloads into the
//! program it runs (`LD_PRELOAD`).  Its constructor reads the options from
//! the environment ([`options`]), discovers the patch sites of the program
//! and its libraries, and registers an fgraph user (function_graph) or an
//! ops (function) before `main`; threads append events to buffers from a
//! preallocated pool ([`pool`]) that a writer thread writes into the trace
//! directory ([`ftramp_trace::format`]).  [`session`] handles fork, exec,
//! exit and crashes.
//!
//! `unsafe` here: the pool's buffers and thread slots (`pool.rs`), the id
//! table (`ids.rs`), signal/atfork/exit handlers (`session.rs`), the
//! exported constructor and `exec*`/`_exit` interposers (this file and the
//! variadic ones in `execl.rs`), each with the reason it is sound.

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod execl;
pub mod ids;
pub mod options;
pub mod pool;
pub mod session;
pub mod tracer;

use std::ffi::{c_char, c_int};

extern "C" fn constructor() {
    // No panic may cross into the loader.
    let _ = std::panic::catch_unwind(session::start);
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

fn enoent() -> c_int {
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
        return enoent();
    }
    // SAFETY: libc's execve has this signature; arguments passed through.
    around_exec(|| unsafe {
        std::mem::transmute::<*mut libc::c_void, ExecveFn>(f)(path, argv, envp)
    })
}

/// # Safety
/// As libc's `execv`.
#[no_mangle]
pub unsafe extern "C" fn execv(path: *const c_char, argv: *const *const c_char) -> c_int {
    let f = next(c"execv");
    if f.is_null() {
        return enoent();
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
        return enoent();
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
        return enoent();
    }
    // SAFETY: libc's execvpe has this signature; arguments passed through.
    around_exec(|| unsafe {
        std::mem::transmute::<*mut libc::c_void, ExecveFn>(f)(file, argv, envp)
    })
}

/// # Safety
/// As libc's `_exit`.
#[no_mangle]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    let _ = std::panic::catch_unwind(|| session::before_exit(status));
    let f = next(c"_exit");
    if !f.is_null() {
        // SAFETY: libc's _exit has this signature.
        unsafe { std::mem::transmute::<*mut libc::c_void, ExitFn>(f)(status) }
    }
    // SAFETY: the raw system call ends the process.
    unsafe { libc::syscall(libc::SYS_exit_group, status as libc::c_long) };
    unreachable!("exit_group returned")
}
