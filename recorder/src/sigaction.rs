//! `sigaction` and `signal` interposers: the recorder's flush handler
//! stands in for the *default* action of the signals that end a process.
//!
//! The recorder installs its handler for those signals ([`FATAL`]) where
//! the program has none, so that a process killed by one still writes what
//! it recorded.  But a very common pattern replaced it: a program catches
//! SIGINT or SIGTERM, cleans up, then restores the default action and
//! raises the signal again to die "the same way" (shells, coreutils,
//! servers).  The restored default killed the process with the recorder's
//! buffers unwritten — every event of a short-lived process, and `ftramp
//! record` then said it ended without the recorder seeing it end.
//!
//! So a request for `SIG_DFL` on one of these signals, through `sigaction`
//! or `signal`, installs the recorder's handler instead (it writes the
//! trace, then sets the real default and re-raises: the process dies as
//! it would have), and every query answers `SIG_DFL` with no flags where
//! that handler is installed, as the program would see untraced.  Every
//! other request goes to libc unchanged (`__sigaction`, and `bsd_signal`,
//! glibc's `signal` under its other name, so that `siginterrupt` keeps its
//! effect).  Both interposers are async-signal-safe (system calls and one
//! atomic), as `sigaction` and `signal` are: handlers call them.
//!
//! Left: `sysv_signal` and `sigset` requests for `SIG_DFL` still replace
//! the handler (rare in programs; glibc's `signal` is the BSD one).

use crate::session::{on_fatal, FATAL};
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

extern "C" {
    /// glibc's `sigaction`, under the name it also exports.
    fn __sigaction(sig: c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> c_int;
    /// glibc's `signal` (BSD semantics), under its other name.
    fn bsd_signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t;
}

/// Set once the recorder has installed its handlers in this process.
static STANDING_IN: AtomicBool = AtomicBool::new(false);

/// libc's `sigaction`, bypassing the interposer (the recorder's own
/// requests: its handler's restore of the real default must not be turned
/// back into its handler).
pub(crate) fn real_sigaction(sig: c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> c_int {
    // SAFETY: the caller's pointers are null or valid for the call, as
    // sigaction(2) requires; the recorder passes its own locals.
    unsafe { __sigaction(sig, act, old) }
}

/// Restores the real default action of `sig` (libc's: through the
/// interposer it would be the recorder's handler again).
pub(crate) fn restore_default(sig: c_int) {
    // SAFETY: sigaction is plain data; all-zero is SIG_DFL.
    let dfl: libc::sigaction = unsafe { std::mem::zeroed() };
    real_sigaction(sig, &dfl, std::ptr::null_mut());
}

/// Whether `handler` is the recorder's, standing in for `SIG_DFL`.
fn is_flush(handler: usize) -> bool {
    handler == on_fatal as *const () as usize
}

/// The recorder's handler, as installed for `sig`.
pub(crate) fn flush_action() -> libc::sigaction {
    // SAFETY: sigaction is plain data; all-zero is a valid value.
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = on_fatal as *const () as usize;
    sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
    // The program's other handlers wait: one nested above this one would
    // share the alternate stack, and it may call traced functions while
    // the trace is being finished.
    // SAFETY: filling a set we own.
    unsafe { libc::sigfillset(&mut sa.sa_mask) };
    sa
}

/// From now on, `SIG_DFL` requests for the fatal signals install
/// [`flush_action`].
pub(crate) fn stand_in() {
    STANDING_IN.store(true, Relaxed);
}

fn stands_in_for(sig: c_int) -> bool {
    STANDING_IN.load(Relaxed) && FATAL.contains(&sig)
}

/// What the program sees where the recorder's handler is installed.
fn as_seen(a: libc::sigaction) -> libc::sigaction {
    if is_flush(a.sa_sigaction) {
        // SAFETY: sigaction is plain data; all-zero is SIG_DFL, no flags,
        // an empty mask.
        unsafe { std::mem::zeroed() }
    } else {
        a
    }
}

/// `sigaction(2)` as the program calls it.
///
/// # Safety
/// As `sigaction`: `act` and `old` are null or valid.
#[no_mangle]
pub unsafe extern "C" fn sigaction(sig: c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> c_int {
    if !stands_in_for(sig) {
        return real_sigaction(sig, act, old);
    }
    let flush = flush_action();
    // SAFETY: `act` is null or valid (the caller's contract).
    let act = match unsafe { act.as_ref() } {
        Some(a) if a.sa_sigaction == libc::SIG_DFL => &flush as *const libc::sigaction,
        _ => act,
    };
    // SAFETY: sigaction is plain data; all-zero is a valid value.
    let mut prev: libc::sigaction = unsafe { std::mem::zeroed() };
    let r = real_sigaction(sig, act, &mut prev);
    if r == 0 && !old.is_null() {
        // SAFETY: `old` is valid (the caller's contract).
        unsafe { old.write(as_seen(prev)) };
    }
    r
}

/// `signal(3)` as the program calls it.
///
/// # Safety
/// As `signal`.
#[no_mangle]
pub unsafe extern "C" fn signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    let prev = if stands_in_for(sig) && handler == libc::SIG_DFL {
        // SAFETY: sigaction is plain data; all-zero is a valid value.
        let mut prev: libc::sigaction = unsafe { std::mem::zeroed() };
        if real_sigaction(sig, &flush_action(), &mut prev) != 0 {
            return libc::SIG_ERR;
        }
        prev.sa_sigaction
    } else {
        // SAFETY: libc's own signal, with the caller's arguments.
        unsafe { bsd_signal(sig, handler) }
    };
    if is_flush(prev) {
        libc::SIG_DFL
    } else {
        prev
    }
}
