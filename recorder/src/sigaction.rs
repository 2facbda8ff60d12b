//! `sigaction` and `signal` interposers: the recorder's flush handler
//! stands in for the *default* action of the signals that end a process.
//!
//! The recorder installs its handler for those signals ([`is_fatal`]) where
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
//! effect).  The older ways to set a disposition do the same: `ssignal`
//! (glibc's `signal` under a third name), `sysv_signal` and `__sysv_signal`
//! (what `signal` is in a program compiled as strict ISO C, `-std=c99`)
//! and `sigset`, which are written here on [`sigaction`] as glibc and
//! POSIX describe them (System V's one-shot handlers; `SIG_HOLD`).  All of
//! them are async-signal-safe (system calls and atomics), as `sigaction`
//! and `signal` are: handlers call them.
//!
//! A one-shot handler (`SA_RESETHAND`, as every System V `signal` sets)
//! has the kernel reset the action to the real default when it delivers
//! the signal, behind the interposer's back; the handler that then raises
//! the signal again (zstd's, and any strict-C99 program's `signal(sig,
//! SIG_DFL); raise(sig)`) killed the process with its trace unwritten.
//! For the fatal signals such a handler is installed without the flag,
//! behind [`reset_then_call`], which makes that reset itself — to the
//! recorder's handler — and calls the program's; queries answer the
//! program's action, flag included, and `SIG_DFL` after the reset.

use crate::session::{flush_before_fault_handler, is_fatal, is_fault, on_fatal};
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering::Relaxed};

extern "C" {
    /// glibc's `sigaction`, under the name it also exports.
    fn __sigaction(sig: c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> c_int;
    /// glibc's `signal` (BSD semantics), under its other name.
    fn bsd_signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t;
}

/// The program's one-shot handlers of the fatal signals, by signal number:
/// the handler (0: none) and its flags as the program gave them.
/// [`reset_then_call`] stands in for them.
static ONE_SHOT: [(AtomicUsize, AtomicI32); 65] = [const { (AtomicUsize::new(0), AtomicI32::new(0)) }; 65];

/// The recorder's stand-in for a program's one-shot handler of `sig`
/// (installed without `SA_RESETHAND`, with `SA_SIGINFO`): makes the reset
/// the kernel would have made at delivery — to the default action, which
/// is the recorder's handler — and calls the program's handler as it asked
/// to be called.
extern "C" fn reset_then_call(sig: c_int, info: *mut libc::siginfo_t, ctx: *mut std::ffi::c_void) {
    // (Installed only after `sigaction` filled the slot with a handler.)
    let Some((handler, flags)) = one_shot(sig) else { return };
    real_sigaction(sig, &flush_action(), std::ptr::null_mut());
    // A crash handler (a fault the kernel raised, not one sent) may not
    // let the process end in a way the trace is written at.
    // SAFETY: the kernel's siginfo for this delivery (SA_SIGINFO), if any.
    if is_fault(sig) && !info.is_null() && unsafe { (*info).si_code } > 0 {
        flush_before_fault_handler();
    }
    if flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the program installed this handler with SA_SIGINFO: it
        // takes the kernel's three arguments, which we pass on.
        let f: extern "C" fn(c_int, *mut libc::siginfo_t, *mut std::ffi::c_void) = unsafe { std::mem::transmute(handler) };
        f(sig, info, ctx);
    } else {
        // SAFETY: the program installed this handler without SA_SIGINFO:
        // it takes the signal number.
        let f: extern "C" fn(c_int) = unsafe { std::mem::transmute(handler) };
        f(sig);
    }
}

/// The program's one-shot handler of `sig` and its flags, from [`ONE_SHOT`].
fn one_shot(sig: c_int) -> Option<(usize, c_int)> {
    let (h, flags) = ONE_SHOT.get(usize::try_from(sig).ok()?)?;
    Some((h.load(Relaxed), flags.load(Relaxed)))
}

/// Whether `handler` is [`reset_then_call`].
fn is_one_shot_stand_in(handler: usize) -> bool {
    handler == reset_then_call as *const () as usize
}

/// `SIG_HOLD` (`<signal.h>`, not in the libc crate): `sigset` blocks the
/// signal instead of changing its action.
const SIG_HOLD: libc::sighandler_t = 2;

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
    STANDING_IN.load(Relaxed) && is_fatal(sig)
}

/// What the program sees of `sig`'s action `a`: `SIG_DFL` where the
/// recorder's handler is installed, its own one-shot handler where
/// [`reset_then_call`] stands in for it.
fn as_seen(sig: c_int, a: libc::sigaction) -> libc::sigaction {
    if is_flush(a.sa_sigaction) {
        // SAFETY: sigaction is plain data; all-zero is SIG_DFL, no flags,
        // an empty mask.
        unsafe { std::mem::zeroed() }
    } else if let Some((handler, flags)) = one_shot(sig).filter(|_| is_one_shot_stand_in(a.sa_sigaction)) {
        libc::sigaction { sa_sigaction: handler, sa_flags: flags, ..a }
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
    // SAFETY: `act` and `old` are null or valid (the caller's contract).
    if sig == libc::SIGTRAP && ftramp_runtime::patch::program_sigtrap_action(unsafe { act.as_ref() }, unsafe { old.as_mut() }) {
        // The patcher's handler stays; foreign traps get the program's action.
        return 0;
    }
    if !stands_in_for(sig) {
        return real_sigaction(sig, act, old);
    }
    let flush = flush_action();
    let stand_in;
    // SAFETY: `act` is null or valid (the caller's contract).
    let act = match unsafe { act.as_ref() } {
        Some(a) if a.sa_sigaction == libc::SIG_DFL => &flush as *const libc::sigaction,
        Some(a) if a.sa_flags & libc::SA_RESETHAND != 0 && a.sa_sigaction != libc::SIG_IGN && sig > 0 && (sig as usize) < ONE_SHOT.len() => {
            // (The slot first: a signal delivered right after the install
            // finds the handler it is to call.)
            ONE_SHOT[sig as usize].0.store(a.sa_sigaction, Relaxed);
            ONE_SHOT[sig as usize].1.store(a.sa_flags, Relaxed);
            stand_in = libc::sigaction {
                sa_sigaction: reset_then_call as *const () as usize,
                sa_flags: (a.sa_flags & !libc::SA_RESETHAND) | libc::SA_SIGINFO,
                ..*a
            };
            &stand_in as *const libc::sigaction
        }
        _ => act,
    };
    // SAFETY: sigaction is plain data; all-zero is a valid value.
    let mut prev: libc::sigaction = unsafe { std::mem::zeroed() };
    let r = real_sigaction(sig, act, &mut prev);
    if r == 0 && !old.is_null() {
        // SAFETY: `old` is valid (the caller's contract).
        unsafe { old.write(as_seen(sig, prev)) };
    }
    r
}

/// `signal(3)` as the program calls it.
///
/// # Safety
/// As `signal`.
#[no_mangle]
pub unsafe extern "C" fn signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    // SAFETY: libc's own signal, with the caller's arguments.
    set_handler(sig, handler, |s, h| unsafe { bsd_signal(s, h) })
}

/// `ssignal(3)`, glibc's `signal` under another name.
///
/// # Safety
/// As `signal`.
#[no_mangle]
pub unsafe extern "C" fn ssignal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    // SAFETY: as `signal` (the caller's contract).
    unsafe { signal(sig, handler) }
}

/// `sysv_signal(3)` as the program calls it: glibc's System V `signal`, a
/// one-shot handler that does not block its signal (`SA_RESETHAND |
/// SA_NODEFER`, an empty mask, no `SA_RESTART`), set through [`sigaction`].
///
/// # Safety
/// As `sysv_signal` (any arguments).
#[no_mangle]
pub unsafe extern "C" fn sysv_signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    if handler == libc::SIG_ERR || sig < 1 || sig >= ONE_SHOT.len() as c_int {
        // SAFETY: errno is this thread's.
        unsafe { *libc::__errno_location() = libc::EINVAL };
        return libc::SIG_ERR;
    }
    // SAFETY: sigaction is plain data; all-zero is a valid value (an empty
    // mask).
    let (mut act, mut old): (libc::sigaction, libc::sigaction) = unsafe { std::mem::zeroed() };
    act.sa_sigaction = handler;
    act.sa_flags = libc::SA_RESETHAND | libc::SA_NODEFER;
    // SAFETY: our own action and `old`.
    if unsafe { sigaction(sig, &act, &mut old) } != 0 {
        return libc::SIG_ERR;
    }
    old.sa_sigaction
}

/// `__sysv_signal`: [`sysv_signal`] under the name `<signal.h>` gives
/// `signal` in a program compiled as strict ISO C (`-std=c99`).
///
/// # Safety
/// As `sysv_signal`.
#[no_mangle]
pub unsafe extern "C" fn __sysv_signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    // SAFETY: the caller's contract.
    unsafe { sysv_signal(sig, handler) }
}

/// The `signal` family: a `SIG_DFL` request for a fatal signal installs
/// the recorder's handler, anything else goes to `libc_set`; the previous
/// handler as the program would see it untraced.
fn set_handler(
    sig: c_int,
    handler: libc::sighandler_t,
    libc_set: impl FnOnce(c_int, libc::sighandler_t) -> libc::sighandler_t,
) -> libc::sighandler_t {
    if sig == libc::SIGTRAP && handler != libc::SIG_ERR {
        // As `signal` sets it (BSD semantics), kept by the patcher (see
        // [`sigaction`]).
        // SAFETY: sigaction is plain data; all-zero is a valid value.
        let (mut act, mut old): (libc::sigaction, libc::sigaction) = unsafe { std::mem::zeroed() };
        act.sa_sigaction = handler;
        act.sa_flags = libc::SA_RESTART;
        if ftramp_runtime::patch::program_sigtrap_action(Some(&act), Some(&mut old)) {
            return old.sa_sigaction;
        }
    }
    let prev = if stands_in_for(sig) && handler == libc::SIG_DFL {
        // SAFETY: sigaction is plain data; all-zero is a valid value.
        let mut prev: libc::sigaction = unsafe { std::mem::zeroed() };
        if real_sigaction(sig, &flush_action(), &mut prev) != 0 {
            return libc::SIG_ERR;
        }
        prev.sa_sigaction
    } else {
        libc_set(sig, handler)
    };
    if is_flush(prev) {
        libc::SIG_DFL
    } else if let Some((handler, _)) = one_shot(sig).filter(|_| is_one_shot_stand_in(prev)) {
        handler
    } else {
        prev
    }
}

/// `sigset(3)` as the program calls it (POSIX, as glibc does it): with
/// `SIG_HOLD` it blocks `sig`; with a handler it sets it (no flags, empty
/// mask: through [`sigaction`], so `SIG_DFL` of a fatal signal is the
/// recorder's handler) and unblocks `sig`.  It returns `SIG_HOLD` when
/// `sig` was blocked, else the previous handler as the program sees it.
///
/// # Safety
/// As `sigset` (any arguments).
#[no_mangle]
pub unsafe extern "C" fn sigset(sig: c_int, disp: libc::sighandler_t) -> libc::sighandler_t {
    // SAFETY: sigset_t and sigaction are plain data; all-zero is a valid
    // (empty) value of both.
    let (mut set, mut oset): (libc::sigset_t, libc::sigset_t) = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: filling sets we own; sigaddset refuses a bad `sig` (EINVAL).
    if unsafe { libc::sigemptyset(&mut set) } != 0 || unsafe { libc::sigaddset(&mut set, sig) } != 0 {
        return libc::SIG_ERR;
    }
    let blocked = |oset: &libc::sigset_t| {
        // SAFETY: reading a set we own.
        unsafe { libc::sigismember(oset, sig) == 1 }
    };
    if disp == SIG_HOLD {
        // SAFETY: our own sets.
        if unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut oset) } != 0 {
            return libc::SIG_ERR;
        }
        // SAFETY: a null action only reads, into our own `old`.
        if unsafe { sigaction(sig, std::ptr::null(), &mut old) } != 0 {
            return libc::SIG_ERR;
        }
        return if blocked(&oset) { SIG_HOLD } else { old.sa_sigaction };
    }
    // SAFETY: as above.
    let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
    act.sa_sigaction = disp;
    // SAFETY: our own action and `old`.
    if unsafe { sigaction(sig, &act, &mut old) } != 0 {
        return libc::SIG_ERR;
    }
    // SAFETY: our own sets.
    if unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, &mut oset) } != 0 {
        return libc::SIG_ERR;
    }
    if blocked(&oset) {
        SIG_HOLD
    } else {
        old.sa_sigaction
    }
}
