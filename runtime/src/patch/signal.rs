//! The patcher's SIGTRAP handler and thread evacuation.
//!
//! One handler, installed once with `SA_SIGINFO`, serves two purposes:
//!
//! * **Breakpoints** (x86_64): a thread that runs into the `int3` the
//!   patcher placed on a site's first byte traps here; the arch module
//!   emulates the site's *new* instruction ([`super::arch::fixup`]).
//! * **Evacuation**: when a site's old form is several instructions
//!   (gcc's five 1-byte `nop`s on x86_64; the two NOP words on aarch64), a
//!   thread may have executed its first instruction and be stopped before
//!   the next one.  After the site's first byte/word has been replaced
//!   (step 1), no thread can enter such an interior any more, so the
//!   patcher asks every thread that might be inside one to run this
//!   handler ([`evacuate`]): a signal queued with `rt_tgsigqueueinfo`
//!   (`SI_QUEUE`, our pid, [`MAGIC`] as value).  The handler moves a
//!   thread whose interrupted pc is inside a site back to the site's first
//!   byte (re-running NOPs is harmless), then acknowledges.  Threads
//!   blocked in a system call are not signalled (they can only return to
//!   the instruction after their syscall, never into a site, and are
//!   spared an `EINTR`).  A thread that still blocks SIGTRAP after
//!   [`BLOCKED_GRACE`] is given up on (counted in `threads_blocking`): it
//!   could not survive an x86 `int3` either.
//!
//! SIGTRAP is not a real-time signal: a second one sent while one is
//! pending is dropped.  So every invocation does both jobs, whatever its
//! `si_code` says: the breakpoint fix-up (an `int3` trap may have been
//! merged into our queued signal) and the evacuation acknowledgement (our
//! queued signal may have been merged into an `int3` trap).
//!
//! Anything that is not ours (another `int3`, `raise(SIGTRAP)`) goes to the
//! handler that was installed before ours, or gets the default action.
//! A program that sets SIGTRAP's action after ours is installed must not
//! replace it (the next patch's evacuation signals would go to its handler,
//! or kill it): an embedder that interposes `sigaction` (the recorder) keeps
//! the program's action here instead ([`set_previous`]), and foreign traps
//! go to that.

use super::{arch, STATS};
use crate::RuntimeError;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicUsize, Ordering::*};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// `si_value` of our evacuation signals ("ftramp" in little-endian ASCII).
const MAGIC: usize = 0x0000_706d_6172_7466;

/// How long [`evacuate`] waits for every thread to answer.
const EVACUATION_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a thread that blocks SIGTRAP is waited for before it is
/// assumed to block it for good (and is not evacuated).
const BLOCKED_GRACE: Duration = Duration::from_secs(1);

/// The kernel's `siginfo_t` as `rt_tgsigqueueinfo` fills it on 64-bit
/// Linux (`_sifields._rt`): 128 bytes.
#[repr(C)]
struct QueuedInfo {
    signo: i32,
    errno: i32,
    code: i32,
    _pad: i32,
    pid: i32,
    uid: u32,
    value: usize,
    _rest: [u64; 12],
}
const _: () = assert!(std::mem::size_of::<QueuedInfo>() == 128);
const _: () = assert!(std::mem::size_of::<libc::siginfo_t>() == 128);

/// The action foreign SIGTRAPs get: the handler and flags installed before
/// ours, or set since through [`set_previous`].  Atomics: the handler reads
/// them, and the program may set them from a handler of its own.
static PREVIOUS_HANDLER: AtomicUsize = AtomicUsize::new(libc::SIG_DFL);
static PREVIOUS_FLAGS: AtomicI32 = AtomicI32::new(0);
/// Set once our handler is installed.
static HELD: AtomicBool = AtomicBool::new(false);

/// Replaces the action foreign SIGTRAPs get by `new` (if any) and returns
/// the one they got (handler and flags), when our handler is installed;
/// None (nothing done) before.  Async-signal-safe.
pub(crate) fn set_previous(new: Option<(usize, i32)>) -> Option<(usize, i32)> {
    if !HELD.load(Acquire) {
        return None;
    }
    let old = (PREVIOUS_HANDLER.load(Acquire), PREVIOUS_FLAGS.load(Acquire));
    if let Some((handler, flags)) = new {
        // (Flags first: a trap between the two stores calls the new
        // handler the way it asked, or the old one with the new flags'
        // SA_SIGINFO only if both were installed that way.)
        PREVIOUS_FLAGS.store(flags, Release);
        PREVIOUS_HANDLER.store(handler, Release);
    }
    Some(old)
}

/// Installs the handler (once per process).
pub(crate) fn install() -> Result<(), RuntimeError> {
    static INSTALLED: OnceLock<Result<(), i32>> = OnceLock::new();
    let r = INSTALLED.get_or_init(|| {
        // SAFETY: sigaction with a null new action only reads the current
        // one into `prev`; then we install ours, whose handler is
        // async-signal-safe (atomics, getpid/gettid, the arch fix-up).
        unsafe {
            let mut prev: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGTRAP, std::ptr::null(), &mut prev) != 0 {
                return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
            }
            PREVIOUS_HANDLER.store(prev.sa_sigaction, Release);
            PREVIOUS_FLAGS.store(prev.sa_flags, Release);
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_sigtrap as *const () as usize;
            act.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            libc::sigemptyset(&mut act.sa_mask);
            if libc::sigaction(libc::SIGTRAP, &act, std::ptr::null_mut()) != 0 {
                return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
            }
            HELD.store(true, Release);
            Ok(())
        }
    });
    r.map_err(|e| RuntimeError::Os { call: "sigaction(SIGTRAP)", err: std::io::Error::from_raw_os_error(e) })
}

fn gettid() -> i32 {
    // SAFETY: gettid has no arguments and touches no memory.
    unsafe { libc::syscall(libc::SYS_gettid) as i32 }
}

extern "C" fn on_sigtrap(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo and ucontext for an
    // SA_SIGINFO handler; QueuedInfo has siginfo's size and layout for the
    // fields read; errno is this thread's.  Everything called below is
    // async-signal-safe.
    unsafe {
        let errno = *libc::__errno_location();
        let raw = &*(info as *const QueuedInfo);
        let ours = raw.code == libc::SI_QUEUE && raw.value == MAGIC && raw.pid == libc::getpid();
        let trap = raw.code == libc::SI_KERNEL;
        let consumed = arch::fixup(&mut *(ctx as *mut libc::ucontext_t), ours || trap);
        acknowledge();
        *libc::__errno_location() = errno;
        if !(ours || (consumed && trap)) {
            chain(sig, info, ctx);
        }
    }
}

/// Passes a SIGTRAP that is not ours to the previous disposition.
///
/// # Safety
/// Only from the SIGTRAP handler, with the `info` and `ctx` the kernel
/// passed it.
unsafe fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let (handler, flags) = (PREVIOUS_HANDLER.load(Acquire), PREVIOUS_FLAGS.load(Acquire));
    if flags & libc::SA_RESETHAND != 0 && handler != libc::SIG_IGN && handler != libc::SIG_DFL {
        // A one-shot handler: the kernel would have reset the action.
        let _ = PREVIOUS_HANDLER.compare_exchange(handler, libc::SIG_DFL, AcqRel, Acquire);
    }
    match handler {
        libc::SIG_IGN => {}
        // The default action (core dump), or the embedder's stand-in for it.
        libc::SIG_DFL => crate::grace::default_action(sig, info, ctx),
        h if flags & libc::SA_SIGINFO != 0 => {
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) = std::mem::transmute(h);
            f(sig, info, ctx)
        }
        h => {
            let f: extern "C" fn(libc::c_int) = std::mem::transmute(h);
            f(sig)
        }
    }
}

/// The threads of one evacuation, sorted by tid.
struct Evacuation {
    tids: Vec<i32>,
    answered: Vec<std::sync::atomic::AtomicBool>,
    /// Threads that have not answered: a futex word, woken at 0.
    pending: AtomicI32,
}

impl Evacuation {
    /// Marks thread `i` as answered (once).  Async-signal-safe.
    fn answer(&self, i: usize) {
        if !self.answered[i].swap(true, AcqRel) && self.pending.fetch_sub(1, AcqRel) == 1 {
            // SAFETY: FUTEX_WAKE on a word we own; it reads nothing else.
            unsafe { libc::syscall(libc::SYS_futex, self.pending.as_ptr(), libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG, i32::MAX) };
        }
    }

    /// Sleeps until `pending` changes from `seen` or `timeout` passes.
    fn wait(&self, seen: i32, timeout: Duration) {
        let ts = libc::timespec { tv_sec: timeout.as_secs() as libc::time_t, tv_nsec: timeout.subsec_nanos() as libc::c_long };
        // SAFETY: FUTEX_WAIT reads our futex word and the timespec.
        unsafe { libc::syscall(libc::SYS_futex, self.pending.as_ptr(), libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG, seen, &ts as *const libc::timespec) };
    }
}

static CURRENT: AtomicPtr<Evacuation> = AtomicPtr::new(std::ptr::null_mut());
/// Handlers currently reading `CURRENT` (the list is freed only at 0).
static READERS: AtomicUsize = AtomicUsize::new(0);

/// Marks this thread as answered if an evacuation is running.
fn acknowledge() {
    READERS.fetch_add(1, SeqCst);
    let p = CURRENT.load(SeqCst);
    if !p.is_null() {
        // SAFETY: the list is freed only after CURRENT is cleared and
        // READERS is back to 0, and we incremented READERS before loading.
        let list = unsafe { &*p };
        if let Ok(i) = list.tids.binary_search(&gettid()) {
            list.answer(i);
        }
    }
    READERS.fetch_sub(1, SeqCst);
}

enum ThreadState {
    Gone,
    /// In a system call: not signalled.
    InSyscall,
    Signal,
}

fn is_gone(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH)
}

fn thread_state(tid: i32) -> ThreadState {
    // "running" (running or runnable), "-1 sp pc" (in the kernel but not
    // in a syscall: e.g. a page fault — possibly inside a site) or
    // "nr args… sp pc" (in syscall nr).  Unreadable: signal to be safe.
    // rt_sigreturn is the exception: it returns to the pc saved in the
    // signal frame, which may be inside a site.
    match std::fs::read_to_string(format!("/proc/self/task/{tid}/syscall")) {
        Err(e) if is_gone(&e) => ThreadState::Gone,
        Ok(s) if s.split_whitespace().next().and_then(|n| n.parse::<i64>().ok()).is_some_and(|n| n >= 0 && n != libc::SYS_rt_sigreturn) => ThreadState::InSyscall,
        _ => ThreadState::Signal,
    }
}

/// Whether a thread blocks SIGTRAP (None: gone).
fn blocks_trap(tid: i32) -> Option<bool> {
    let status = match std::fs::read_to_string(format!("/proc/self/task/{tid}/status")) {
        Err(e) if is_gone(&e) => return None,
        r => r.unwrap_or_default(),
    };
    let mask = status.lines().find_map(|l| l.strip_prefix("SigBlk:")).and_then(|m| u64::from_str_radix(m.trim(), 16).ok()).unwrap_or(0);
    Some(mask & (1 << (libc::SIGTRAP - 1)) != 0)
}

fn send(pid: i32, tid: i32) -> std::io::Result<()> {
    // SAFETY: QueuedInfo is plain data laid out as the kernel's siginfo.
    let mut info: QueuedInfo = unsafe { std::mem::zeroed() };
    info.signo = libc::SIGTRAP;
    info.code = libc::SI_QUEUE;
    info.pid = pid;
    // SAFETY: getuid has no preconditions.
    info.uid = unsafe { libc::getuid() };
    info.value = MAGIC;
    loop {
        // SAFETY: rt_tgsigqueueinfo reads the 128-byte info we pass.
        if unsafe { libc::syscall(libc::SYS_rt_tgsigqueueinfo, pid, tid, libc::SIGTRAP, &info as *const QueuedInfo) } == 0 {
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EAGAIN) {
            return Err(err);
        }
        std::thread::yield_now();
    }
}

/// Makes sure no thread is stopped inside a site of the current round
/// whose first byte/word has already been replaced: signals every thread
/// that might be (see the module comment) and waits until each has run the
/// handler or exited.  Returns how many threads were signalled.
pub(crate) fn evacuate() -> Result<usize, RuntimeError> {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    let me = gettid();
    let tasks = crate::thread::task_ids().map_err(|err| RuntimeError::Os { call: "read /proc/self/task", err })?;
    let mut tids: Vec<i32> = tasks
        .into_iter()
        .filter(|&t| t != me)
        .filter(|&t| matches!(thread_state(t), ThreadState::Signal))
        .collect();
    tids.sort_unstable();
    if tids.is_empty() {
        return Ok(0);
    }
    let list = Box::new(Evacuation { answered: tids.iter().map(|_| Default::default()).collect(), pending: AtomicI32::new(tids.len() as i32), tids });
    let list = Box::into_raw(list);
    CURRENT.store(list, SeqCst);
    // SAFETY: `list` stays valid until we free it below.
    let l = unsafe { &*list };
    let mut result = Ok(l.tids.len());
    for (i, &tid) in l.tids.iter().enumerate() {
        match send(pid, tid) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => l.answer(i),
            Err(err) => {
                result = Err(RuntimeError::Os { call: "rt_tgsigqueueinfo(SIGTRAP)", err });
                break;
            }
        }
    }
    STATS.evacuations.fetch_add(1, Relaxed);
    STATS.threads_signalled.fetch_add(l.tids.len(), Relaxed);
    let start = Instant::now();
    let mut next_check = Duration::from_millis(1);
    while result.is_ok() {
        let pending = l.pending.load(Acquire);
        if pending == 0 {
            break;
        }
        let waited = start.elapsed();
        if waited >= next_check {
            // A thread that exited before handling the signal never
            // answers; nor does one that blocks SIGTRAP — but every thread
            // running our handler blocks it for a moment, so only after
            // BLOCKED_GRACE is such a thread given up on.
            for i in 0..l.tids.len() {
                if l.answered[i].load(Acquire) {
                    continue;
                }
                match blocks_trap(l.tids[i]) {
                    None => l.answer(i),
                    Some(true) if waited >= BLOCKED_GRACE => {
                        STATS.threads_blocking.fetch_add(1, Relaxed);
                        l.answer(i);
                    }
                    _ => {}
                }
            }
            next_check = waited * 2;
        }
        if waited >= EVACUATION_TIMEOUT {
            let tids = (0..l.tids.len()).filter(|&i| !l.answered[i].load(Acquire)).map(|i| l.tids[i]).collect();
            result = Err(RuntimeError::ThreadsNotAnswering { tids, waited_ms: waited.as_millis() as u64 });
            break;
        }
        l.wait(pending, next_check.saturating_sub(waited).max(Duration::from_micros(100)));
    }
    CURRENT.store(std::ptr::null_mut(), SeqCst);
    while READERS.load(SeqCst) != 0 {
        std::hint::spin_loop();
    }
    // SAFETY: CURRENT no longer points to the list and no handler is
    // reading it (READERS is 0 after CURRENT was cleared).
    drop(unsafe { Box::from_raw(list) });
    result
}
