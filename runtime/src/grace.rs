//! Grace periods: when it is safe to free what a callback may still use.
//!
//! Unregistering an ops must guarantee that, once it returns, the callback
//! is never entered again and nothing the ops uses is freed while another
//! thread may still be inside it — what RCU's `synchronize_rcu()` gives the
//! kernel.  This file is the user-space equivalent.
//!
//! # The read side (hot path)
//!
//! A patch site calls a JIT trampoline; the trampoline loads the ops
//! pointer and the callback address from data words and calls a small
//! runtime thunk, which brackets the user callback with a
//! [`DispatchGuard`]:
//!
//! ```text
//!   site ──call──▶ trampoline ──call──▶ thunk ─▶ DispatchGuard::enter()   depth += 1
//!                  (loads ops,          (prefix)      callback(ip, parent, ops, fregs)
//!                   callback)                    drop(guard)              depth -= 1
//! ```
//!
//! The guard updates one thread-local word with a plain load and store —
//! no atomic read-modify-write, no shared cache line, no fence instruction
//! — and compiler fences ([`compiler_fence`], i.e. `atomic_signal_fence`)
//! so the compiler keeps every access the callback makes between the two
//! updates.  It allocates nothing and is async-signal-safe: a signal
//! handler that enters dispatch on top of an interrupted load/store pair
//! restores the depth before returning (a section it completes there may
//! go uncounted in the generation, which only makes grace periods wait
//! longer).  The word:
//!
//! ```text
//!   63                 32 31                  0
//!  ┌─────────────────────┬─────────────────────┐
//!  │ generation          │ depth               │
//!  └─────────────────────┴─────────────────────┘
//!   enter: word += 1
//!   leave: word -= 1, then generation += 1 if depth is now 0 (branch-free)
//! ```
//!
//! *depth* counts nested guards; *generation* counts outermost sections
//! completed (wrapping).
//!
//! Contract for the code that calls callbacks: one trampoline traversal
//! runs at most one outermost section (the list function takes one guard
//! around the whole walk), the section covers every use of ops and of
//! runtime tables, and nothing after the guard is dropped touches them.
//!
//! A thread is **quiescent** when its depth is 0 *and* its program counter
//! is outside every *dispatch code range*: the trampolines, and the thunk
//! instructions that run with the ops in hand but depth 0 (before the
//! increment; when code is freed, after the decrement too — see below).
//! A quiescent thread holds no reference to any ops and is not running
//! code that will load one without first passing through a data word.
//! A thread seen busy that has since completed **two** outermost sections
//! (its generation advanced by 2) has passed through a quiescent state
//! too; this lets threads that spend most of their time inside callbacks
//! converge in two sections instead of waiting to be caught outside one.
//!
//! # The write side: [`synchronize`]
//!
//! The caller first makes sure no *new* call can reach the object (sites
//! unpatched, data words switched), then calls [`synchronize`], then frees.
//! [`synchronize`]:
//!
//! 1. refuses if the calling thread is itself inside dispatch
//!    ([`GraceResult::InsideDispatch`]: unregistering from a callback must
//!    defer the free — [`retire`]);
//! 2. issues `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` (registered
//!    once), so every thread of the process has executed a full memory
//!    barrier after the caller's unpublishing stores: from now on every
//!    load of a data word anywhere sees the new value (where membarrier is
//!    unavailable — old kernels, seccomp filters — a SeqCst fence on the
//!    caller; step 3 gives the same guarantee per thread, see the
//!    argument);
//! 3. lists every other thread (`/proc/self/task`) and sends each a
//!    dedicated real-time signal with `tgkill`.  The handler (installed
//!    once; `SA_SIGINFO | SA_RESTART | SA_ONSTACK`; async-signal-safe: no
//!    allocation, no lock) reads the interrupted PC from the `ucontext` and
//!    the thread's own dispatch word, decides quiescence and stores the
//!    answer (round, generation, quiescent) as one atomic word (with
//!    `Release`) in the thread's slot of the current request;
//! 4. threads that answered "busy" are asked again after a short backoff
//!    (20 µs doubling to 5 ms) until they answer "quiescent" or their
//!    generation is 2 past their first busy answer; a thread that exits
//!    meanwhile (`ESRCH`, or gone from `/proc`) counts as quiescent;
//! 5. after a timeout (default [`DEFAULT_TIMEOUT`], [`set_default_timeout`])
//!    it gives up with [`GraceResult::TimedOut`], naming the threads and
//!    what they last reported.  The caller must then *not* free:
//!    [`defer_free`] keeps such objects in a quarantine (counted,
//!    [`quarantine`]), and every later successful [`synchronize`] — which
//!    also checks the quarantined objects' code ranges — frees them.
//!
//! Only `GraceResult::Ok` allows freeing.  Nothing here ever frees
//! unsafely or waits forever.
//!
//! # Why this is sufficient
//!
//! Let *U* be the moment the caller finished unpublishing object *X*, and
//! take any other thread *T* that existed at step 3.
//!
//! * The handler runs **on T**, between two of T's instructions, and T
//!   does nothing else while it runs.  So the PC and depth it reads are
//!   T's exact state at one instant, in T's own program order (the
//!   compiler fences keep the compiler from moving the counter updates
//!   across the callback's accesses; the CPU always shows a thread its own
//!   accesses in order).  That instant is after *U*: the handler found
//!   this request published, and the request is published after step 2.
//! * If T was quiescent then, every access T made to *X* before that
//!   instant happens-before our free: the handler's `Release` store of the
//!   answer is read by [`synchronize`] with `Acquire`.
//! * After that instant T cannot reach *X* again: reaching any ops starts
//!   at a site, goes through the trampoline (in a code range) and loads a
//!   data word; that load comes after step 2's barrier — and after the
//!   signal delivery, whose kernel side orders the sender's earlier stores
//!   (the `siglock` release/acquire) even without membarrier — so it sees
//!   the new value, never *X*.  A thread that was mid-way (in the
//!   trampoline, in the thunk prefix, in the callback, or in anything the
//!   callback called) was *not* quiescent and is asked again.
//! * Generations: let T be seen busy after *U* with generation *g*.  The
//!   section T was in, or (if it was in a trampoline or thunk prefix) the
//!   one it was about to open, ends with generation *g+1* and its
//!   trampoline traversal then finishes without touching ops (contract
//!   above).  Generation *g+2* ends a section opened by a later traversal,
//!   which started at a site after *U*: from then on T behaves as a thread
//!   seen quiescent after *U*.  (Sections nested in a callback are not
//!   outermost and do not count.)
//! * Threads created after step 3 started after *U* and cannot hold *X*.
//!
//! A reader-side fence is therefore never needed, with or without
//! membarrier: the observation is made by the observed thread itself, so
//! the plain counter is exact, and the answer's release/acquire pair orders
//! its earlier accesses before the free.
//!
//! # Code ranges
//!
//! Pass to [`synchronize`] the code ranges of what is being retired (a
//! trampoline image about to be unmapped) and register the static thunks
//! once with [`register_dispatch_code`].  For freeing *ops* only, a thunk's
//! range must cover its instructions before the depth increment (the ops
//! pointer is in a register, depth still 0).  For freeing *code*, cover the
//! whole thunk: after the decrement the thunk still returns into the
//! trampoline.  A thunk must not touch the ops after dropping its guard.
//!
//! # Limits
//!
//! * A thread stopped in a trampoline or thunk prefix **and running an
//!   unrelated signal handler on top of it** looks quiescent (its PC is in
//!   the handler; the interrupted context is not visible to us).  Same
//!   limit as the patcher's evacuation (`patch.rs`).
//! * Signals interrupt blocking system calls.  `SA_RESTART` restarts most
//!   of them, but the ones Linux never restarts (`nanosleep`, `poll`,
//!   `epoll_wait`, `select`, … — see signal(7)) return `EINTR` in the
//!   signalled threads, as with any sampling profiler.
//! * A thread that blocks the signal or is stopped by a debugger makes
//!   every grace period time out: its objects stay quarantined (leaked),
//!   never freed unsafely.  The same happens if [`synchronize`] is called
//!   while holding a lock a running callback waits for, and for a thread
//!   that left a dispatch section by a jump (a signal handler that
//!   interrupted it and `siglongjmp`ed out) until its next traced call
//!   notices ([`DispatchGuard::enter_at`]: a section starting at or above
//!   where the outermost one did means that one was left).
//! * In a copy of the runtime loaded with `dlopen`, a thread's first
//!   access to the depth counter may go through `__tls_get_addr`, which in
//!   older glibc can allocate; this matters only if that first access is
//!   the handler's.
//! * The signal is chosen once, the highest real-time signal whose
//!   disposition is still the default ([`signal_number`]); a program that
//!   later installs its own handler on it breaks grace periods (they time
//!   out — safe, but everything retired leaks).  Our handler is harmless
//!   if someone else sends the signal.
//! * Under a user-mode emulator (qemu-user, detected by `/proc/self/exe`
//!   differing from `/proc/self/task/<tid>/exe`), a thread that never
//!   answered and that sleeps with our signal blocked *on the host* and
//!   pending, in two checks 20 ms apart, is taken for one of the
//!   emulator's own threads and skipped (`EmulatorView`): the emulator
//!   applies guest signal masks in software and blocks host signals itself
//!   only while it hands one to the guest, after taking it.  (Until the
//!   twenty-ninth session a program's thread that waited long for a CPU while
//!   the emulator handed it our signal could be taken for the emulator's,
//!   and an object freed under it.)  Natively a thread blocking the signal
//!   makes the grace period time out.
//! * [`synchronize`], [`defer_free`] and [`retire`] take locks and
//!   allocate: not for signal handlers.  `fork` while another thread is
//!   inside [`synchronize`] leaves the child with the writer lock held:
//!   the child must not call it.
//! * Every grace period signals every thread of the process, so its
//!   latency is that of the slowest thread to get a CPU: tens of µs on an
//!   idle machine, milliseconds when the CPUs are oversubscribed.  Batch
//!   frees ([`retire`] many, then one [`reclaim`]).
//! * Code addresses *stored* in stacks (fgraph's return addresses pointing
//!   at `return_to_handler`) are not seen here: that code must not be
//!   retired while shadow stacks hold entries.

use std::any::Any;
use std::marker::PhantomData;
use std::ops::Range;
use std::sync::atomic::{compiler_fence, fence, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// This thread's dispatch word (generation << 32 | depth, see the module
/// documentation), in the runtime's thread-local block
/// ([`crate::thread`]).  Relaxed loads and stores are plain moves.
#[inline(always)]
fn dispatch_word() -> &'static AtomicU64 {
    &crate::thread::this().dispatch
}

const GENERATION_ONE: u64 = 1 << 32;

/// Marks the current thread as inside ftramp dispatch while it lives.
///
/// Runtime thunks create one before calling a user callback and drop it
/// right after; the grace period ([`synchronize`]) waits for every thread
/// holding one.  Guards nest.  Not `Send`: it must be dropped on the
/// thread that created it.
#[must_use = "the thread is inside dispatch only while the guard lives"]
pub struct DispatchGuard {
    /// The thread's block, looked up once for the guard and its section
    /// (the preload's lookup tests for the thread's first use each time).
    t: &'static crate::thread::ThreadState,
    _not_send: PhantomData<*mut ()>,
}

impl DispatchGuard {
    /// Enters dispatch: the depth becomes non-zero before any later access
    /// of this thread (as seen by a signal handler on it).  For sections
    /// that are not a traced call's (no stack pointer to record): a
    /// section entered this way is never taken for one left by a jump.
    #[inline(always)]
    pub fn enter() -> DispatchGuard {
        Self::enter_at(|| usize::MAX)
    }

    /// [`enter`](DispatchGuard::enter) for the dispatch section of a traced
    /// call whose stack pointer at entry (at the return, the returning
    /// function's entry sp) is `sp()` (read only where it is needed, so
    /// that the hot path keeps no register for it).
    ///
    /// The outermost section's `sp` is kept: code running inside it runs
    /// deeper on the stack, so a new section at or above that `sp` (on the
    /// same stack) means the old one was left without its guards being
    /// dropped — a signal handler that interrupted dispatch and
    /// `siglongjmp`ed out.  Its depth would stay non-zero for good (every
    /// grace period timing out on this thread) and fgraph's busy mark set
    /// (the thread traced no more): the new section clears both, and counts
    /// them in [`sections_left_by_jump`].
    ///
    /// Nothing before the depth is raised may leave the caller's code in
    /// an optimised build (the grace period sees a thread there as outside
    /// dispatch, and a thunk's range covers only its own code): the sp is
    /// a load from the trampoline's frame, inlined.  (Unoptimised, even
    /// the thread-local lookup is a call: the workspace builds this crate
    /// optimised in its dev profile too, see the README.)
    #[inline(always)]
    pub fn enter_at(sp: impl Fn() -> usize) -> DispatchGuard {
        let t = crate::thread::this();
        let d = &t.dispatch;
        let mut w = d.load(Relaxed);
        // (Nothing to record or check while the detection is off: the
        // constant folds this away, keeping the hot path as it was.)
        if DETECT_LEFT_SECTIONS {
            if w as u32 == 0 {
                t.dispatch_sp.set(sp());
                // The sp before the depth, in program order, so that a
                // section left by a jump always has one.  A signal handler
                // in between sees depth 0 and its own outermost section
                // ends by resetting the sp (Drop): this section then runs
                // with none (never taken for a left one) rather than with
                // the handler's, deeper one.
                compiler_fence(SeqCst);
            } else {
                // Inside another section, or one left by a jump: the
                // thread counts as inside dispatch throughout.
                if nested(t, sp()) {
                    // The depth now counts this section (and only it).
                    compiler_fence(SeqCst);
                    return DispatchGuard { t, _not_send: PhantomData };
                }
                // (A signal handler may have changed it meanwhile.)
                w = d.load(Relaxed);
            }
        }
        d.store(w.wrapping_add(1), Relaxed);
        compiler_fence(SeqCst);
        DispatchGuard { t, _not_send: PhantomData }
    }

    /// The calling thread's block, as the guard found it.
    #[inline(always)]
    pub(crate) fn thread(&self) -> &'static crate::thread::ThreadState {
        self.t
    }
}

static LEFT_BY_JUMP: AtomicU64 = AtomicU64::new(0);

/// Dispatch sections found left by a jump (all threads; see
/// [`DispatchGuard::enter_at`]).
pub fn sections_left_by_jump() -> u64 {
    LEFT_BY_JUMP.load(Relaxed)
}

/// Whether a section starting at or above the outermost one's entry sp is
/// taken for one left by a jump.  (Kept as a switch: off, the constant
/// folds the sp record away.  It was off for one release after false
/// detections in stress runs: a signal handler's own section in the window
/// between an outermost section's sp record and its depth increment left
/// its deeper sp behind; see the test
/// `a_handler_in_the_entry_window_causes_no_false_detection`.)
const DETECT_LEFT_SECTIONS: bool = true;

/// A section entered inside another (a callback calling traced code, a
/// signal handler), or after one was left by a jump: true when it was
/// ([`left_by_jump`] then counts this section in the depth).
#[cold]
#[inline(never)]
fn nested(t: &crate::thread::ThreadState, sp: usize) -> bool {
    sp >= t.dispatch_sp.get() && sp != usize::MAX && left_by_jump(t, sp)
}

/// A new section at `sp`, at or above where the outermost one began: that
/// one was left, unless this runs on the alternate signal stack and it did
/// not (a handler that interrupted it, on a stack above it).  If left,
/// every section of the thread was: they end (the generation one up, as
/// when a section ends) and the depth counts only the new one — it never
/// passes through 0, as the thread is inside dispatch throughout — and the
/// per-thread busy marks of the runtime's callbacks are cleared.
fn left_by_jump(t: &crate::thread::ThreadState, sp: usize) -> bool {
    let outer = t.dispatch_sp.get();
    let alt = crate::unwind::alt_stack();
    let on_alt = |a: usize| alt.is_some_and(|(lo, hi)| lo <= a && a < hi);
    if on_alt(sp) && !on_alt(outer) {
        return false;
    }
    // The new sp first: a signal handler in between runs deeper than this
    // live section (or on an alternate stack above it), so it is not
    // taken for a jump.
    t.dispatch_sp.set(sp);
    compiler_fence(SeqCst);
    let w = t.dispatch.load(Relaxed);
    t.dispatch.store((w & !0xffff_ffff).wrapping_add(GENERATION_ONE) | 1, Relaxed);
    compiler_fence(SeqCst);
    LEFT_BY_JUMP.fetch_add(1, Relaxed);
    crate::fgraph::dispatch_left();
    crate::dispatch::dispatch_left(t);
    true
}

impl Drop for DispatchGuard {
    #[inline(always)]
    fn drop(&mut self) {
        compiler_fence(SeqCst);
        let t = self.t;
        let d = &t.dispatch;
        // The depth down; the generation up when it reaches 0.  (Written
        // as a choice on the decremented word: `lea`, `add`, `cmov`, seven
        // instructions with the load and store, without a branch.)
        let w = d.load(Relaxed).wrapping_sub(1);
        d.store(if w as u32 == 0 { w.wrapping_add(GENERATION_ONE) } else { w }, Relaxed);
        if DETECT_LEFT_SECTIONS && w as u32 == 0 {
            // No outermost section: no sp (see enter_at).  After the depth
            // reaches 0: a jump out in between leaves depth 0 and a stale
            // sp, which the next outermost section replaces (the other way
            // round it would leave a depth with no sp, never found).
            compiler_fence(SeqCst);
            t.dispatch_sp.set(usize::MAX);
        }
    }
}

/// The current thread's dispatch depth (0: not inside any callback).
pub fn dispatch_depth() -> u32 {
    dispatch_word().load(Relaxed) as u32
}

/// Outermost dispatch sections the current thread has completed (wrapping).
pub fn dispatch_generation() -> u32 {
    (dispatch_word().load(Relaxed) >> 32) as u32
}

/// What [`synchronize`] found.  Only [`GraceResult::Ok`] allows freeing.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "only GraceResult::Ok allows freeing"]
pub enum GraceResult {
    /// Every other thread was seen quiescent after the call started:
    /// objects unpublished before the call may be freed.
    Ok,
    /// Some threads were not seen quiescent within the timeout.  Do not
    /// free; quarantine instead ([`defer_free`] does).
    TimedOut { threads: Vec<StuckThread>, waited: Duration },
    /// The calling thread is inside dispatch (a callback is unregistering):
    /// nothing was waited for.  Defer the free ([`retire`]).
    InsideDispatch { depth: u32 },
    /// The mechanism could not run (`call` failed with `errno`).
    Failed { call: &'static str, errno: i32 },
}

impl GraceResult {
    pub fn is_ok(&self) -> bool {
        matches!(self, GraceResult::Ok)
    }
}

/// A thread that kept a grace period from completing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StuckThread {
    pub tid: i32,
    pub state: StuckState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StuckState {
    /// The signal was not handled (blocked, or the thread is stopped).
    NoAnswer,
    /// Last seen inside dispatch, or with its PC in a dispatch code range.
    Busy { depth: u32, pc: usize },
}

/// Default time [`synchronize`] waits before giving up.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

static TIMEOUT_US: AtomicU64 = AtomicU64::new(DEFAULT_TIMEOUT.as_micros() as u64);

/// Sets the time [`synchronize`] (and [`defer_free`]) wait before giving
/// up with [`GraceResult::TimedOut`].
pub fn set_default_timeout(t: Duration) {
    TIMEOUT_US.store(t.as_micros().min(u64::MAX as u128) as u64, Relaxed);
}

/// The current default timeout.
pub fn default_timeout() -> Duration {
    Duration::from_micros(TIMEOUT_US.load(Relaxed))
}

// ---------------------------------------------------------------------------
// Requests and the signal handler.

/// One thread's answer, packed so the handler publishes it with a single
/// store: `round << 32 | (generation mod 2^31) << 1 | quiescent`.
fn pack(round: u32, generation: u32, quiescent: bool) -> u64 {
    (round as u64) << 32 | ((generation & GEN_MASK) as u64) << 1 | quiescent as u64
}
fn answer_round(a: u64) -> u32 {
    (a >> 32) as u32
}
fn answer_generation(a: u64) -> u32 {
    (a as u32) >> 1
}
fn answer_quiescent(a: u64) -> bool {
    a & 1 != 0
}
const GEN_MASK: u32 = 0x7fff_ffff;

/// Whether generation `now` is at least 2 past `base` (both mod 2^31).
/// Between two answers of a thread far fewer than 2^30 sections pass: it
/// is asked again within [`MAX_BACKOFF`] and handles a pending signal at
/// its next kernel entry (a timer tick at the latest).  A generation that
/// went back (see the word's documentation) reads as "not yet".
fn two_sections_later(base: u32, now: u32) -> bool {
    let d = now.wrapping_sub(base) & GEN_MASK;
    (2..1 << 30).contains(&d)
}

struct Slot {
    /// The round the writer is waiting for (set before each signal).
    asked: AtomicU32,
    /// The last answer ([`pack`]); round 0 = none yet.
    answer: AtomicU64,
    /// PC and depth of the last answer (diagnostics only).
    pc: AtomicUsize,
    depth: AtomicU32,
}

/// One grace period in progress.  Immutable once published except for the
/// slots' atomics.
struct Request {
    ranges: Vec<Range<usize>>,
    /// Sorted; `slots[i]` belongs to `tids[i]`.
    tids: Vec<i32>,
    slots: Vec<Slot>,
}

/// The request handlers answer, or null.
static CURRENT: AtomicPtr<Request> = AtomicPtr::new(std::ptr::null_mut());
/// Handlers currently between loading `CURRENT` and their last access to
/// it; a request is freed only after `CURRENT` is cleared and this is 0.
static HANDLERS: AtomicUsize = AtomicUsize::new(0);
/// Bumped by every answer; the writer sleeps on it (futex).
static ANSWERS: AtomicU32 = AtomicU32::new(0);

/// Wakes the writer sleeping in [`wait_for_answer`].  Async-signal-safe.
fn answer_arrived() {
    ANSWERS.fetch_add(1, Release);
    // SAFETY: FUTEX_WAKE only reads the futex word's address; ANSWERS is
    // a static u32-sized atomic.
    unsafe { libc::syscall(libc::SYS_futex, ANSWERS.as_ptr(), libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG, i32::MAX) };
}

/// Sleeps until [`ANSWERS`] differs from `seen` or `timeout` passes.
fn wait_for_answer(seen: u32, timeout: Duration) {
    if timeout.is_zero() {
        return;
    }
    let ts = libc::timespec { tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t, tv_nsec: timeout.subsec_nanos() as _ };
    // SAFETY: FUTEX_WAIT reads the futex word and the timespec we pass;
    // it returns at once if the word is no longer `seen`.
    unsafe {
        libc::syscall(libc::SYS_futex, ANSWERS.as_ptr(), libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG, seen, &ts as *const libc::timespec)
    };
}

fn gettid() -> i32 {
    // SAFETY: gettid takes no arguments and touches no memory.
    unsafe { libc::syscall(libc::SYS_gettid) as i32 }
}

/// The PC at which the kernel interrupted this thread.
///
/// # Safety
/// `ctx` must be the `ucontext_t` the kernel passed to an `SA_SIGINFO`
/// handler.
#[allow(unreachable_code)]
unsafe fn interrupted_pc(ctx: *const libc::c_void) -> Option<usize> {
    let uc = &*(ctx as *const libc::ucontext_t);
    #[cfg(target_arch = "x86_64")]
    return Some(uc.uc_mcontext.gregs[libc::REG_RIP as usize] as usize);
    #[cfg(target_arch = "aarch64")]
    return Some(uc.uc_mcontext.pc as usize);
    // glibc REG_PC: __gregs[0] holds the pc (x0 is hardwired zero).
    #[cfg(target_arch = "riscv64")]
    return Some(uc.uc_mcontext.__gregs[0] as usize);
    // PT_NIP = 32 in the kernel's pt_regs / glibc gregset_t.
    #[cfg(target_arch = "powerpc64")]
    return Some(uc.uc_mcontext.gp_regs[32] as usize);
    #[cfg(target_arch = "s390x")]
    return Some(uc.uc_mcontext.psw.addr as usize);
    let _ = uc;
    None
}

/// The embedder's stand-in for the default action of a signal one of the
/// runtime's handlers took that was not the runtime's (0: none): see
/// [`on_foreign_signal`].
static FOREIGN_DEFAULT: AtomicUsize = AtomicUsize::new(0);

/// Has `f` stand in for the default action of the signals the runtime's
/// handlers take that are not the runtime's own: the grace-period signal
/// when the program or another process sends it (`kill`, `sigqueue`, a
/// `tgkill` from elsewhere), and a SIGTRAP that is not the patcher's where
/// the program had no handler (`patch::on_foreign_sigtrap`).  The
/// recorder's handler, which writes the trace and then dies by the signal.
/// Without one, the default action is restored and the signal sent again,
/// so that the process ends by it as untraced.  `f` runs in a signal
/// handler: it must be async-signal-safe.  Until the thirtieth session the
/// grace handler took a foreign grace signal as a request and the process
/// lived on (`kill -62 $$` from a Perl script, which untraced ends it).
pub fn on_foreign_signal(f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void)) {
    FOREIGN_DEFAULT.store(f as usize, Release);
}

/// Whether the delivery `info` is not one of the runtime's requests, which
/// it sends with `tgkill` from this process (`SI_TKILL`, our pid).
///
/// # Safety
/// `info` is null or the kernel's siginfo for this delivery.
unsafe fn foreign(info: *const libc::siginfo_t) -> bool {
    // SAFETY: the caller's contract; si_pid is valid for the codes tested.
    unsafe {
        let Some(i) = info.as_ref() else { return false };
        i.si_code == libc::SI_USER || i.si_code == libc::SI_QUEUE || (i.si_code == libc::SI_TKILL && i.si_pid() != libc::getpid())
    }
}

/// The default action of `sig` (terminate, or dump core), or the
/// embedder's stand-in for it ([`on_foreign_signal`]); for the grace
/// handler and the patcher's SIGTRAP handler.
///
/// # Safety
/// Only from a signal handler for `sig` that blocks it, with the `info`
/// and `ctx` the kernel passed.
pub(crate) unsafe fn default_action(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let f = FOREIGN_DEFAULT.load(Acquire);
    // SAFETY: a non-zero value is the handler `on_foreign_signal` stored;
    // sigaction and tgkill are async-signal-safe: the signal, blocked
    // while this handler runs, ends the process once it returns.
    unsafe {
        if f != 0 {
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) = std::mem::transmute(f);
            return f(sig, info, ctx);
        }
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(sig, &dfl, std::ptr::null_mut());
        libc::syscall(libc::SYS_tgkill, libc::getpid(), gettid(), sig);
    }
}

extern "C" fn on_grace_signal(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel's siginfo for this SA_SIGINFO handler.
    if unsafe { foreign(info) } {
        // SAFETY: as a handler, with the kernel's arguments.
        return unsafe { default_action(sig, info, ctx) };
    }
    // SAFETY: the kernel passes a valid ucontext to an SA_SIGINFO handler.
    // errno is this thread's; everything below is async-signal-safe
    // (thread-local and atomic accesses, the gettid syscall, no locks, no
    // allocation).
    unsafe {
        let errno = *libc::__errno_location();
        let pc = interrupted_pc(ctx);
        let word = dispatch_word().load(Relaxed);
        let (depth, generation) = (word as u32, (word >> 32) as u32);
        HANDLERS.fetch_add(1, SeqCst);
        let req = CURRENT.load(SeqCst);
        if !req.is_null() {
            // The request stays allocated while HANDLERS > 0 (we
            // incremented it before loading CURRENT).
            let req = &*req;
            if let Ok(i) = req.tids.binary_search(&gettid()) {
                let slot = &req.slots[i];
                let round = slot.asked.load(Acquire);
                let quiescent = depth == 0 && pc.is_some_and(|pc| !req.ranges.iter().any(|r| r.contains(&pc)));
                slot.pc.store(pc.unwrap_or(0), Relaxed);
                slot.depth.store(depth, Relaxed);
                slot.answer.store(pack(round, generation, quiescent), Release);
                answer_arrived();
            }
        }
        HANDLERS.fetch_sub(1, SeqCst);
        *libc::__errno_location() = errno;
    }
}

/// Installs the handler on a free real-time signal (once per process) and
/// returns that signal.
fn install() -> Result<i32, GraceResult> {
    static SIGNAL: OnceLock<Result<i32, i32>> = OnceLock::new();
    let r = *SIGNAL.get_or_init(|| {
        let (lo, hi) = (libc::SIGRTMIN(), libc::SIGRTMAX());
        let mut last_err = libc::EAGAIN;
        // SIGRTMAX-2 down to SIGRTMIN+2: programs that use real-time
        // signals mostly count up from SIGRTMIN or down from SIGRTMAX, and
        // qemu-user cannot map every guest signal at the ends.
        for sig in (lo + 2..=hi - 2).rev() {
            // SAFETY: sigaction with a null new action only reads the
            // current disposition into `cur`.
            let mut cur: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: as above.
            if unsafe { libc::sigaction(sig, std::ptr::null(), &mut cur) } != 0 {
                last_err = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
                continue;
            }
            if cur.sa_sigaction != libc::SIG_DFL {
                continue;
            }
            // SAFETY: zeroed is a valid sigaction; we install a handler
            // that is async-signal-safe (see on_grace_signal) on a signal
            // nobody handles.
            let ok = unsafe {
                let mut act: libc::sigaction = std::mem::zeroed();
                act.sa_sigaction = on_grace_signal as *const () as usize;
                // SA_ONSTACK: threads with small stacks (Go, coroutines)
                // keep an alternate signal stack for exactly this.  Every
                // other signal is blocked while the handler runs: that
                // stack may be small (Rust threads get a few KiB, meant
                // for a stack-overflow message), and a program's handler
                // nested above ours would run on it too and overflow it
                // (a SIGPROF handler calling traced functions did).  The
                // handler is short; the signals wait for its return.
                act.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART | libc::SA_ONSTACK;
                libc::sigfillset(&mut act.sa_mask);
                libc::sigaction(sig, &act, std::ptr::null_mut()) == 0
            };
            if ok {
                return Ok(sig);
            }
            last_err = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        }
        Err(last_err)
    });
    r.map_err(|errno| GraceResult::Failed { call: "sigaction(real-time signal)", errno })
}

/// The real-time signal grace periods use (installing the handler on
/// first use), or `None` if none could be installed.
pub fn signal_number() -> Option<i32> {
    install().ok()
}

/// Makes the caller's earlier stores visible to, and orders them before
/// the later accesses of, every thread of the process.
fn membarrier() -> bool {
    const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
    const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let registered = *REGISTERED.get_or_init(|| {
        // SAFETY: membarrier takes two integers and touches no memory.
        unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0) == 0 }
    });
    fence(SeqCst);
    // SAFETY: as above.
    registered && unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0) } == 0
}

// ---------------------------------------------------------------------------
// Statistics.

static SYNCHRONIZES: AtomicU64 = AtomicU64::new(0);
static SIGNALS_SENT: AtomicU64 = AtomicU64::new(0);
static BUSY_ANSWERS: AtomicU64 = AtomicU64::new(0);
static TIMEOUTS: AtomicU64 = AtomicU64::new(0);
static EMULATOR_THREADS_FOUND: AtomicU64 = AtomicU64::new(0);
static MEMBARRIER_OK: AtomicI32 = AtomicI32::new(-1);

/// Process-wide grace-period counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Calls of [`synchronize`] that waited (not refused).
    pub synchronizes: u64,
    pub signals_sent: u64,
    /// Answers "busy" (inside dispatch or in a code range) that made us ask again.
    pub busy_answers: u64,
    pub timeouts: u64,
    /// Whether `membarrier(PRIVATE_EXPEDITED)` worked (`None`: not tried yet).
    pub membarrier: Option<bool>,
    /// Threads taken for an emulator's own (see [`emulator_threads`]).
    pub emulator_threads_found: u64,
}

/// The process-wide counters.
pub fn stats() -> Stats {
    Stats {
        synchronizes: SYNCHRONIZES.load(Relaxed),
        signals_sent: SIGNALS_SENT.load(Relaxed),
        busy_answers: BUSY_ANSWERS.load(Relaxed),
        timeouts: TIMEOUTS.load(Relaxed),
        membarrier: match MEMBARRIER_OK.load(Relaxed) {
            -1 => None,
            v => Some(v == 1),
        },
        emulator_threads_found: EMULATOR_THREADS_FOUND.load(Relaxed),
    }
}

// ---------------------------------------------------------------------------
// synchronize.

/// Dispatch code that is always checked (the runtime's thunks).
static DISPATCH_CODE: Mutex<Vec<Range<usize>>> = Mutex::new(Vec::new());

/// Registers code that runs with an ops in hand at depth 0 (a thunk's
/// instructions before its [`DispatchGuard`]); every later [`synchronize`]
/// treats a thread whose PC is there as busy.
pub fn register_dispatch_code(range: Range<usize>) {
    let mut code = lock(&DISPATCH_CODE);
    if !code.contains(&range) {
        code.push(range);
    }
}

/// One grace period at a time.
static WRITER: Mutex<()> = Mutex::new(());

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Waits until every other thread has been seen quiescent (see the module
/// documentation), with the [`default_timeout`].  `code_ranges`: code being
/// retired (trampolines) besides the registered dispatch code.  On `Ok`,
/// quarantined objects retired before this call are freed too.
pub fn synchronize(code_ranges: &[Range<usize>]) -> GraceResult {
    synchronize_timeout(code_ranges, default_timeout())
}

/// [`synchronize`] with an explicit timeout.
pub fn synchronize_timeout(code_ranges: &[Range<usize>], timeout: Duration) -> GraceResult {
    let depth = dispatch_depth();
    if depth > 0 {
        return GraceResult::InsideDispatch { depth };
    }
    let sig = match install() {
        Ok(s) => s,
        Err(e) => return e,
    };
    let _writer = lock(&WRITER);
    // Quarantined objects were unpublished before now: this grace period
    // covers them, and must check their code too.
    let (quarantine_upto, mut ranges) = {
        let q = lock(&QUARANTINE);
        let ranges: Vec<Range<usize>> = q.items.iter().flat_map(|r| r.ranges.iter().cloned()).collect();
        (q.next_seq, ranges)
    };
    ranges.extend(code_ranges.iter().cloned());
    ranges.extend(lock(&DISPATCH_CODE).iter().cloned());
    ranges.retain(|r| !r.is_empty());
    ranges.sort_by_key(|r| (r.start, r.end));
    ranges.dedup();

    let mb = membarrier();
    MEMBARRIER_OK.store(mb as i32, Relaxed);
    SYNCHRONIZES.fetch_add(1, Relaxed);
    let result = wait_for_threads(sig, ranges, timeout);
    drop(_writer);
    if result.is_ok() {
        release_quarantine(quarantine_upto);
    } else {
        TIMEOUTS.fetch_add(matches!(result, GraceResult::TimedOut { .. }) as u64, Relaxed);
    }
    result
}

fn list_threads(me: i32) -> Result<Vec<i32>, GraceResult> {
    let tasks = crate::thread::task_ids()
        .map_err(|e| GraceResult::Failed { call: "read /proc/self/task", errno: e.raw_os_error().unwrap_or(0) })?;
    let mut tids: Vec<i32> = tasks.into_iter().filter(|&t| t != me).collect();
    tids.sort_unstable();
    tids.dedup();
    Ok(tids)
}

/// What `/proc` says of one thread and our signal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct TaskSignal {
    /// The signal is pending for the thread (or the process).
    pending: bool,
    /// Some signal is pending for the thread itself (sent with `tgkill`):
    /// any, because an emulator maps guest signal numbers to other host
    /// numbers (qemu 7.2: guest 62 is host 64), and only an emulator's
    /// threads are judged by it.
    pending_here: bool,
    /// The thread blocks it (on the host, under an emulator).
    blocked: bool,
    /// The thread sleeps (`S` or `D`): not running, not waiting for a CPU.
    sleeping: bool,
}

/// `sig`'s state for thread `tid` (`None`: the thread is gone).
fn signal_state(tid: i32, sig: i32) -> Option<TaskSignal> {
    let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).ok()?;
    Some(parse_task_signal(&status, sig))
}

fn parse_task_signal(status: &str, sig: i32) -> TaskSignal {
    let field = |key: &str| status.lines().find_map(|l| l.strip_prefix(key)).map(str::trim);
    let mask = |key: &str| field(key).and_then(|m| u64::from_str_radix(m, 16).ok()).unwrap_or(0);
    let bit = 1u64 << (sig - 1);
    TaskSignal {
        pending: (mask("SigPnd:") | mask("ShdPnd:")) & bit != 0,
        pending_here: mask("SigPnd:") != 0,
        blocked: mask("SigBlk:") & bit != 0,
        sleeping: field("State:").is_some_and(|s| s.starts_with('S') || s.starts_with('D')),
    }
}

/// Whether this process runs under a user-mode emulator (qemu-user):
/// the emulator makes `/proc/self/exe` name the guest program, but not
/// `/proc/self/task/<tid>/exe`, which names the emulator.
fn emulated() -> bool {
    static EMULATED: OnceLock<bool> = OnceLock::new();
    *EMULATED.get_or_init(|| {
        let own = std::fs::read_link("/proc/self/exe");
        let task = std::fs::read_link(format!("/proc/self/task/{}/exe", gettid()));
        matches!((own, task), (Ok(a), Ok(b)) if a != b)
    })
}

/// Under an emulator, what earlier grace periods learnt of its threads.
///
/// The emulator applies guest signal masks in software and blocks host
/// signals itself only while it hands a host signal over to the guest
/// (from its host handler until the guest handler runs): by then the host
/// signal is no longer pending.  Its own threads (qemu's RCU thread), which
/// never run guest code, block every host signal for good and sleep, so
/// the signal we sent stays pending on them (as whatever host signal the
/// emulator made of it).  A thread found so (blocking
/// our signal on the host, the signal pending on it, sleeping) in two
/// checks [`ANSWER_GRACE`] apart, and that never answered, is taken for one
/// of the emulator's and not signalled again while it stays so.  Any other
/// host-blocked thread is one of the program's on its way to the handler
/// (maybe waiting a long time for a CPU) and we wait for it; a thread that
/// answered once is never taken for the emulator's.
#[derive(Default)]
struct EmulatorView {
    /// Threads that answered a request (sorted).
    guests: Vec<i32>,
    /// Threads taken for the emulator's own (sorted).
    emulator: Vec<i32>,
}

impl EmulatorView {
    /// Forgets the threads that are gone (`live` is sorted).
    fn prune(&mut self, live: &[i32]) {
        self.guests.retain(|t| live.binary_search(t).is_ok());
        self.emulator.retain(|t| live.binary_search(t).is_ok());
    }

    fn answered(&mut self, tid: i32) {
        if let Err(at) = self.guests.binary_search(&tid) {
            self.guests.insert(at, tid);
        }
        if let Ok(at) = self.emulator.binary_search(&tid) {
            self.emulator.remove(at);
        }
    }

    /// Whether a thread in state `s` at a check may be the emulator's.
    fn may_be_emulator(&self, tid: i32, s: TaskSignal) -> bool {
        s.blocked && s.pending_here && s.sleeping && self.guests.binary_search(&tid).is_err()
    }

    fn take_for_emulator(&mut self, tid: i32) {
        if let Err(at) = self.emulator.binary_search(&tid) {
            self.emulator.insert(at, tid);
            EMULATOR_THREADS_FOUND.fetch_add(1, Relaxed);
        }
    }
}

static EMULATOR_VIEW: Mutex<EmulatorView> = Mutex::new(EmulatorView { guests: Vec::new(), emulator: Vec::new() });

/// The live threads currently taken for the emulator's own (empty when not
/// emulated).  For tests and diagnostics.
pub fn emulator_threads() -> Vec<i32> {
    lock(&EMULATOR_VIEW).emulator.clone()
}

#[derive(Clone, Copy)]
enum Wait {
    /// Signal sent at `sent`; resent only if it gets lost.
    Answer { sent: Instant },
    /// Not asked yet, or answered busy: ask (again) at `at`.
    Ask { at: Instant },
    Done,
}

const FIRST_BACKOFF: Duration = Duration::from_micros(20);
const MAX_BACKOFF: Duration = Duration::from_millis(5);
/// How long an unanswered signal may take before we look at the thread.
const ANSWER_GRACE: Duration = Duration::from_millis(20);

fn wait_for_threads(sig: i32, ranges: Vec<Range<usize>>, timeout: Duration) -> GraceResult {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    let tids = match list_threads(gettid()) {
        Ok(t) => t,
        Err(e) => return e,
    };
    if tids.is_empty() {
        return GraceResult::Ok;
    }
    let slots = tids.iter().map(|_| Slot { asked: AtomicU32::new(0), answer: AtomicU64::new(0), pc: AtomicUsize::new(0), depth: AtomicU32::new(0) }).collect();
    let req = Box::into_raw(Box::new(Request { ranges, tids, slots }));
    CURRENT.store(req, SeqCst);
    // SAFETY: `req` stays allocated until we free it below, after
    // unpublishing it and draining the handlers.
    let r = unsafe { &*req };
    let result = run_rounds(r, pid, sig, timeout);
    CURRENT.store(std::ptr::null_mut(), SeqCst);
    while HANDLERS.load(SeqCst) != 0 {
        // A handler between its two HANDLERS updates: a few instructions,
        // unless its thread was preempted there.
        std::thread::yield_now();
    }
    // SAFETY: CURRENT no longer points to the request and no handler that
    // loaded it is still running (HANDLERS was 0 after CURRENT was cleared;
    // later handlers load null).
    drop(unsafe { Box::from_raw(req) });
    result
}

fn run_rounds(r: &Request, pid: i32, sig: i32, timeout: Duration) -> GraceResult {
    let n = r.tids.len();
    let start = Instant::now();
    let mut round = vec![0u32; n];
    let mut backoff = vec![FIRST_BACKOFF; n];
    // Generation of each thread's first busy answer.
    let mut base: Vec<Option<u32>> = vec![None; n];
    let mut wait = vec![Wait::Ask { at: start }; n];
    // Under an emulator: checks that found the thread blocking the signal
    // on the host and sleeping.
    let mut host_blocked = vec![0u8; n];
    let mut answered = vec![false; n];
    let emulated = emulated();
    if emulated {
        let mut view = lock(&EMULATOR_VIEW);
        view.prune(&r.tids);
        for (i, &tid) in r.tids.iter().enumerate() {
            if view.emulator.binary_search(&tid).is_ok()
                && signal_state(tid, sig).is_some_and(|s| view.may_be_emulator(tid, s))
            {
                wait[i] = Wait::Done;
            }
        }
    }
    loop {
        // Read before scanning the slots: an answer stored after this
        // changes it, so the futex wait below cannot miss it.
        let answers = ANSWERS.load(Acquire);
        let now = Instant::now();
        for i in 0..n {
            match wait[i] {
                Wait::Done => {}
                Wait::Ask { at } if now >= at => {
                    round[i] += 1;
                    r.slots[i].asked.store(round[i], Release);
                    // SAFETY: tgkill only sends a signal; our handler is
                    // installed on it.
                    let rc = unsafe { libc::syscall(libc::SYS_tgkill, pid, r.tids[i], sig) };
                    wait[i] = if rc == 0 {
                        SIGNALS_SENT.fetch_add(1, Relaxed);
                        Wait::Answer { sent: now }
                    } else {
                        match std::io::Error::last_os_error().raw_os_error().unwrap_or(0) {
                            // Exited: it holds nothing.
                            libc::ESRCH => Wait::Done,
                            // The real-time signal queue is full: later.
                            libc::EAGAIN => Wait::Ask { at: now + MAX_BACKOFF },
                            errno => return GraceResult::Failed { call: "tgkill", errno },
                        }
                    };
                }
                Wait::Ask { .. } => {}
                Wait::Answer { sent } => {
                    let a = r.slots[i].answer.load(Acquire);
                    if answer_round(a) >= round[i] {
                        if emulated && !answered[i] {
                            answered[i] = true;
                            lock(&EMULATOR_VIEW).answered(r.tids[i]);
                        }
                        let generation = answer_generation(a);
                        if answer_quiescent(a) || base[i].is_some_and(|b| two_sections_later(b, generation)) {
                            wait[i] = Wait::Done;
                        } else {
                            base[i].get_or_insert(generation);
                            BUSY_ANSWERS.fetch_add(1, Relaxed);
                            wait[i] = Wait::Ask { at: now + backoff[i] };
                            backoff[i] = (backoff[i] * 2).min(MAX_BACKOFF);
                        }
                    } else if now.duration_since(sent) >= ANSWER_GRACE {
                        // Slow, blocked, stopped, exited — or the signal
                        // was lost (tid reused).  Resend only in the last
                        // case, so a thread blocking the signal does not
                        // fill the real-time queue.
                        wait[i] = match signal_state(r.tids[i], sig) {
                            None => Wait::Done,
                            // Under an emulator, a host-blocked thread
                            // answers once it runs: wait, unless it looks
                            // like the emulator's own (see EmulatorView).
                            Some(s) if emulated && s.blocked => {
                                let mut view = lock(&EMULATOR_VIEW);
                                if view.may_be_emulator(r.tids[i], s) {
                                    host_blocked[i] += 1;
                                } else {
                                    host_blocked[i] = 0;
                                }
                                if host_blocked[i] >= 2 {
                                    view.take_for_emulator(r.tids[i]);
                                    Wait::Done
                                } else {
                                    Wait::Answer { sent: now }
                                }
                            }
                            Some(s) if s.pending => Wait::Answer { sent: now },
                            Some(_) => Wait::Ask { at: now },
                        };
                    }
                }
            }
        }
        if wait.iter().all(|w| matches!(w, Wait::Done)) {
            return GraceResult::Ok;
        }
        let waited = start.elapsed();
        if waited >= timeout {
            let threads = (0..n)
                .filter(|&i| !matches!(wait[i], Wait::Done))
                .map(|i| {
                    let a = r.slots[i].answer.load(Acquire);
                    let state = if answer_round(a) == 0 {
                        StuckState::NoAnswer
                    } else {
                        StuckState::Busy { depth: r.slots[i].depth.load(Relaxed), pc: r.slots[i].pc.load(Relaxed) }
                    };
                    StuckThread { tid: r.tids[i], state }
                })
                .collect();
            return GraceResult::TimedOut { threads, waited };
        }
        // Sleep until an answer arrives, the next ask is due, an
        // unanswered signal is worth a look, or the deadline.
        let due = wait.iter().fold(start + timeout, |due, w| match *w {
            Wait::Ask { at } => due.min(at),
            Wait::Answer { sent } => due.min(sent + ANSWER_GRACE),
            Wait::Done => due,
        });
        wait_for_answer(answers, due.saturating_duration_since(Instant::now()));
    }
}

// ---------------------------------------------------------------------------
// Deferred freeing and the quarantine.

/// An object waiting for a grace period, with the code ranges a thread
/// must be outside of before it can be freed.
struct Retired {
    seq: u64,
    ranges: Vec<Range<usize>>,
    _obj: Box<dyn Any + Send>,
}

struct QuarantineList {
    items: Vec<Retired>,
    next_seq: u64,
}

static QUARANTINE: Mutex<QuarantineList> = Mutex::new(QuarantineList { items: Vec::new(), next_seq: 0 });
static QUARANTINED_TOTAL: AtomicU64 = AtomicU64::new(0);
static RELEASED_TOTAL: AtomicU64 = AtomicU64::new(0);

/// The quarantine's state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Quarantine {
    /// Objects waiting for a successful grace period (leaked until then).
    pub pending: usize,
    /// Objects ever put there ([`retire`], or a [`defer_free`] whose grace
    /// period failed).
    pub quarantined_total: u64,
    /// Objects freed from there by a later successful [`synchronize`].
    pub released_total: u64,
}

/// The quarantine's counters.
pub fn quarantine() -> Quarantine {
    Quarantine {
        pending: lock(&QUARANTINE).items.len(),
        quarantined_total: QUARANTINED_TOTAL.load(Relaxed),
        released_total: RELEASED_TOTAL.load(Relaxed),
    }
}

/// Hands over an unpublished object without waiting: it is dropped by the
/// next [`synchronize`] that succeeds (from any thread), which also checks
/// `code_ranges`.  Usable inside a callback, where waiting is refused.
pub fn retire<T: Send + 'static>(obj: T, code_ranges: &[Range<usize>]) {
    let mut q = lock(&QUARANTINE);
    let seq = q.next_seq;
    q.next_seq += 1;
    q.items.push(Retired { seq, ranges: code_ranges.to_vec(), _obj: Box::new(obj) });
    QUARANTINED_TOTAL.fetch_add(1, Relaxed);
}

/// Bytes [`retire_lazily`] may hold back before it runs a grace period.
pub const LAZY_LIMIT: usize = 4 << 20;
static LAZY_BYTES: AtomicUsize = AtomicUsize::new(0);

/// [`retire`] for data (no code) replaced because of something the program
/// did — a `dlopen` or `dlclose` changes the site tables and fgraph's
/// bitmaps — without a grace period of its own while the data retired so
/// stays under [`LAZY_LIMIT`] bytes (`bytes`: the object's, about); past
/// that, one grace period frees all of it, as does any other grace period
/// before. A grace period signals every thread, and the blocking calls
/// Linux does not restart (`nanosleep`, `poll`, `epoll_wait`, `select`, …)
/// then return `EINTR` in the threads that were sleeping in them: loading a
/// library must not do that to a program. Not inside dispatch (where the
/// grace period past the limit is refused and the object stays retired).
pub fn retire_lazily<T: Send + 'static>(obj: T, bytes: usize) {
    retire(obj, &[]);
    if LAZY_BYTES.fetch_add(bytes, Relaxed) + bytes > LAZY_LIMIT {
        let _ = reclaim();
    }
}

/// Waits for a grace period covering an unpublished object (and
/// `code_ranges`), then drops it; if the grace period does not complete
/// (timeout, called inside dispatch, failure) the object goes to the
/// quarantine instead ([`retire`]) and the result says why.
pub fn defer_free<T: Send + 'static>(obj: T, code_ranges: &[Range<usize>]) -> GraceResult {
    let r = synchronize(code_ranges);
    if r.is_ok() {
        drop(obj);
    } else {
        retire(obj, code_ranges);
    }
    r
}

/// Retries freeing the quarantine: a grace period with no extra ranges.
pub fn reclaim() -> GraceResult {
    synchronize(&[])
}

/// Drops the quarantined objects retired before sequence number `upto`
/// (outside the lock: a drop may retire or synchronize again).
fn release_quarantine(upto: u64) {
    // (What retire_lazily held back is released below, but for objects
    // retired meanwhile: the count restarts, a little low at worst.)
    LAZY_BYTES.store(0, Relaxed);
    let released: Vec<Retired> = {
        let mut q = lock(&QUARANTINE);
        match q.items.first() {
            Some(oldest) if oldest.seq < upto => {}
            _ => return,
        }
        let (old, young): (Vec<Retired>, Vec<Retired>) = std::mem::take(&mut q.items).into_iter().partition(|r| r.seq < upto);
        q.items = young;
        old
    };
    RELEASED_TOTAL.fetch_add(released.len() as u64, Relaxed);
    drop(released);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `/proc/<pid>/task/<tid>/status` excerpt with signal 64 (bit 63).
    fn status(state: &str, pnd: u64, shd: u64, blk: u64) -> String {
        format!("Name:\tt\nState:\t{state}\nSigQ:\t0/1\nSigPnd:\t{pnd:016x}\nShdPnd:\t{shd:016x}\nSigBlk:\t{blk:016x}\nSigIgn:\t0\n")
    }

    #[test]
    fn the_task_status_is_read_for_our_signal_only() {
        let bit = 1u64 << 63;
        let s = parse_task_signal(&status("S (sleeping)", bit, 0, u64::MAX), 64);
        assert_eq!(s, TaskSignal { pending: true, pending_here: true, blocked: true, sleeping: true });
        let s = parse_task_signal(&status("R (running)", 0, bit, !bit), 64);
        assert_eq!(s, TaskSignal { pending: true, pending_here: false, blocked: false, sleeping: false });
        let s = parse_task_signal(&status("D (disk sleep)", 1, 0, 1), 64);
        assert_eq!(s, TaskSignal { pending: false, pending_here: true, blocked: false, sleeping: true });
        let s = parse_task_signal(&status("t (tracing stop)", 0, 0, 0), 64);
        assert_eq!(s, TaskSignal { pending: false, pending_here: false, blocked: false, sleeping: false });
    }

    /// The emulator's own threads keep our signal blocked and pending and
    /// sleep; a program's thread that the emulator is handing our signal
    /// to has it blocked too, but no longer pending, and may be waiting
    /// for a CPU; a thread that answered once is the program's.
    #[test]
    fn only_sleeping_threads_that_never_answered_and_keep_the_signal_pending_may_be_the_emulators() {
        let emulator = TaskSignal { pending: true, pending_here: true, blocked: true, sleeping: true };
        let mut view = EmulatorView::default();
        assert!(view.may_be_emulator(10, emulator));
        assert!(!view.may_be_emulator(10, TaskSignal { pending_here: false, pending: false, ..emulator }));
        assert!(!view.may_be_emulator(10, TaskSignal { sleeping: false, ..emulator }));
        assert!(!view.may_be_emulator(10, TaskSignal { blocked: false, ..emulator }));
        view.take_for_emulator(10);
        view.take_for_emulator(12);
        assert_eq!(view.emulator, [10, 12]);
        view.answered(10);
        assert!(!view.may_be_emulator(10, emulator));
        assert!(view.may_be_emulator(12, emulator));
        assert_eq!((view.guests.as_slice(), view.emulator.as_slice()), (&[10][..], &[12][..]));
        view.prune(&[11, 12]);
        assert_eq!((view.guests.as_slice(), view.emulator.as_slice()), (&[][..], &[12][..]));
    }

    #[test]
    fn answers_pack_into_one_word() {
        let a = pack(7, 3, false);
        assert_eq!((answer_round(a), answer_generation(a), answer_quiescent(a)), (7, 3, false));
        let a = pack(u32::MAX, u32::MAX, true);
        assert_eq!((answer_round(a), answer_generation(a), answer_quiescent(a)), (u32::MAX, GEN_MASK, true));
    }

    #[test]
    fn generations_compare_across_the_wrap() {
        assert!(!two_sections_later(5, 5));
        assert!(!two_sections_later(5, 6));
        assert!(two_sections_later(5, 7));
        assert!(two_sections_later(GEN_MASK, 1));
        assert!(!two_sections_later(GEN_MASK, 0));
        assert!(!two_sections_later(7, 5));
    }

    /// No handler nests above the grace handler on an alternate stack.
    #[test]
    fn the_handler_blocks_other_signals() {
        let sig = signal_number().expect("installed");
        // SAFETY: reads the current action into a zeroed sigaction.
        let (act, blocked) = unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            assert_eq!(libc::sigaction(sig, std::ptr::null(), &mut act), 0);
            let blocked = [libc::SIGPROF, libc::SIGALRM, libc::SIGUSR1, libc::SIGCHLD, libc::SIGINT, libc::SIGRTMIN()].map(|s| libc::sigismember(&act.sa_mask, s));
            (act, blocked)
        };
        assert_eq!(blocked, [1; 6]);
        assert_ne!(act.sa_flags & libc::SA_ONSTACK, 0);
    }

    #[test]
    fn guards_nest() {
        assert_eq!(dispatch_depth(), 0);
        let g0 = dispatch_generation();
        let a = DispatchGuard::enter();
        let b = DispatchGuard::enter();
        assert_eq!(dispatch_depth(), 2);
        drop(b);
        assert_eq!((dispatch_depth(), dispatch_generation()), (1, g0));
        drop(a);
        assert_eq!((dispatch_depth(), dispatch_generation()), (0, g0 + 1));
    }

    /// For the tests that read the process-wide count of sections left.
    static COUNTER: Mutex<()> = Mutex::new(());

    /// A section at or above where the live outermost one began means that
    /// one was left (a jump out of a handler that interrupted it): the
    /// depth starts again from this section, once.  Nested sections deeper
    /// on the stack are not.
    #[test]
    fn a_section_above_a_left_one_resets_the_depth() {
        let _l = COUNTER.lock().unwrap_or_else(|e| e.into_inner());
        let left = sections_left_by_jump();
        let g0 = dispatch_generation();
        // Left without dropping its guards (what a siglongjmp does).
        std::mem::forget(DispatchGuard::enter_at(|| 0x7000_1000));
        std::mem::forget(DispatchGuard::enter_at(|| 0x7000_0800));
        assert_eq!((dispatch_depth(), sections_left_by_jump()), (2, left));
        let g = DispatchGuard::enter_at(|| 0x7000_1000);
        assert_eq!(dispatch_depth(), 1);
        assert_eq!(sections_left_by_jump(), left + 1);
        let inner = DispatchGuard::enter_at(|| 0x7000_0fff);
        assert_eq!((dispatch_depth(), sections_left_by_jump()), (2, left + 1));
        drop(inner);
        drop(g);
        // The left sections' generation and this one's.
        assert_eq!((dispatch_depth(), dispatch_generation()), (0, g0 + 2));
    }

    /// A signal handler whose own outermost section runs in the window
    /// between an outermost section's recording of its sp and its depth
    /// increment must leave no sp behind: the handler's is deeper than
    /// anything nested later in the interrupted section, which would then
    /// be taken for a section left by a jump — the depth reset under a
    /// live section, wrapping below 0 when it ends (every grace period
    /// then waits on the thread for good) or letting a grace period end
    /// while it runs.
    #[test]
    fn a_handler_in_the_entry_window_causes_no_false_detection() {
        use std::sync::atomic::AtomicBool;
        static STOP: AtomicBool = AtomicBool::new(false);
        static HANDLED: AtomicU64 = AtomicU64::new(0);
        extern "C" fn on_signal(_sig: i32) {
            // This handler runs on the thread's stack, below the loop.
            let here = 0u8;
            let sp = std::hint::black_box(&here) as *const u8 as usize;
            let _g = DispatchGuard::enter_at(|| sp);
            HANDLED.fetch_add(1, Relaxed);
        }
        let _l = COUNTER.lock().unwrap_or_else(|e| e.into_inner());
        let sig = libc::SIGURG;
        // SAFETY: installs a handler that only touches atomics and this
        // thread's dispatch state (no SA_ONSTACK: it runs below the loop).
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(i32) as usize;
            sa.sa_flags = libc::SA_RESTART;
            assert_eq!(libc::sigaction(sig, &sa, std::ptr::null_mut()), 0);
        }
        let left = sections_left_by_jump();
        let worker = std::thread::spawn(|| {
            let mut rounds = 0u64;
            while !STOP.load(Relaxed) {
                let here = 0u8;
                let sp = std::hint::black_box(&here) as *const u8 as usize;
                // The outermost section "of a function" above this frame,
                // and one nested in it at this frame: above any handler's.
                let outer = DispatchGuard::enter_at(|| sp + 4096);
                let inner = DispatchGuard::enter_at(|| sp);
                drop(inner);
                drop(outer);
                rounds += 1;
            }
            (rounds, dispatch_depth())
        });
        let t = {
            use std::os::unix::thread::JoinHandleExt;
            worker.as_pthread_t()
        };
        // (Fewer under qemu-user on the other archs, which delivers signals
        // only between blocks of translated code: slow, and the window is
        // inside one.)
        let signals = if cfg!(target_arch = "x86_64") { 50_000 } else { 10_000 };
        let deadline = Instant::now() + Duration::from_secs(30);
        while HANDLED.load(Relaxed) < signals && Instant::now() < deadline {
            // SAFETY: the worker runs until STOP is set below.
            assert_eq!(unsafe { libc::pthread_kill(t, sig) }, 0);
            std::hint::spin_loop();
        }
        STOP.store(true, Relaxed);
        let (rounds, depth) = worker.join().unwrap();
        assert!(HANDLED.load(Relaxed) > 1000, "{} signals handled", HANDLED.load(Relaxed));
        assert_eq!((sections_left_by_jump() - left, depth), (0, 0), "after {rounds} rounds and {} signals", HANDLED.load(Relaxed));
    }
}
