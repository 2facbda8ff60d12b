//! The runtime's one thread-local block, and thread exit without
//! allocating.
//!
//! A traced call touches the dispatch word ([`crate::grace`]) and the
//! shadow stack ([`crate::fgraph`]) on the way in and on the way out.  In a
//! shared library (the `ftramp record` preload, `libftramp.so`) every
//! distinct thread-local costs a `__tls_get_addr` call per function that
//! uses it; kept in one block, the compiler computes its address once per
//! function.  The block has no destructor, so it is reached without a
//! liveness check and lives at a fixed address until the thread is gone.
//!
//! # Thread exit
//!
//! What a thread holds (its shadow stack, a tracer's per-thread buffer) is
//! released when it exits.  The first traced call of a thread arranges
//! that, and that call may come from a signal handler that interrupted the
//! thread inside `malloc`.  A Rust thread-local with a destructor cannot be
//! used for it: its first access registers the destructor with glibc's
//! `__cxa_thread_atexit_impl`, which `calloc`s — a self-deadlock on the
//! allocator's lock held by the interrupted code (seen: the module watcher
//! interrupted in `free` by a `SIGPROF` whose handler called traced code).
//!
//! So [`arm`] uses one process-wide `pthread_key` whose destructor runs the
//! hooks: creating the key takes no lock and allocates nothing in glibc
//! (a compare-and-swap over its key table), and setting the value of a key
//! below `PTHREAD_KEY_2NDLEVEL_SIZE` (32) writes a word of the thread
//! descriptor.  The key is created at load time (an `.init_array` entry),
//! before the program's own keys, so it is one of the first.  If a program
//! had used up those 32 keys anyway, [`arm`] falls back to a thread-local
//! destructor, which allocates on the thread's first traced call (the
//! hazard above comes back only for that program, and is counted in
//! [`fallback_arms`]).
//!
//! The key destructors run at `pthread_exit` after the thread's C++ and
//! Rust thread-local destructors, so calls those make are still traced;
//! ours puts its work off to glibc's last round of key destructors, after
//! the program's own (see [`key_destructor`]).
//! The main thread's `exit` runs no key destructors: its resources stay
//! until the process is gone (atexit handlers may still call traced code).

use crate::fgraph::Shadow;
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::*};

/// One thread's runtime state.  `repr(C)` with the shadow stack first, at
/// the block's own address: fgraph's entry and return then address the
/// thread block and the shadow stack with one register (4 instructions
/// fewer per entry, 8 per entry+exit, by callgrind — one callee-saved
/// register fewer each).
#[repr(C)]
pub(crate) struct ThreadState {
    /// `fgraph`'s shadow stack (first: see above).
    pub(crate) shadow: Shadow,
    /// `grace`'s dispatch word (generation << 32 | depth).  Written only by
    /// this thread (and by signal handlers on it, which restore it); read
    /// by the grace-period handler, which also runs on this thread.
    pub(crate) dispatch: AtomicU64,
    /// `grace`'s record of where the outermost dispatch section began (the
    /// traced function's stack pointer), to tell a section left by a
    /// `siglongjmp` (see `DispatchGuard::enter_at`).
    pub(crate) dispatch_sp: Cell<usize>,
    /// `dispatch`'s recursion guard: set while a `RECURSION` ops callback
    /// runs on this thread.  Here rather than in a thread-local of its own,
    /// which in a shared library costs a `__tls_get_addr` call per traced
    /// call (22 instructions; the recorder's `function` tracer).
    pub(crate) in_guarded: Cell<bool>,
    /// [`arm`] ran on this thread.
    armed: Cell<bool>,
    /// Rounds of key destructors the exit key's has seen on this thread
    /// (see [`key_destructor`]).
    exit_round: Cell<u8>,
}

thread_local! {
    static THREAD: ThreadState = const { ThreadState { shadow: Shadow::new(), dispatch: AtomicU64::new(0), dispatch_sp: Cell::new(usize::MAX), in_guarded: Cell::new(false), armed: Cell::new(false), exit_round: Cell::new(0) } };
}

/// This thread's block, as a plain reference so that hot paths compute its
/// address once.
#[inline(always)]
pub(crate) fn this() -> &'static ThreadState {
    #[cfg(ftramp_tls_cache)]
    {
        let p = cached::load();
        if !p.is_null() {
            // SAFETY: `p` is this thread's block, cached by `this_slow` on
            // this thread (a thread-local slot); see `this_slow`.
            return unsafe { &*p };
        }
        this_slow()
    }
    #[cfg(not(ftramp_tls_cache))]
    {
        block()
    }
}

/// [`this`] through the Rust thread-local (a `__tls_get_addr` call in a
/// shared library).
#[inline(always)]
fn block() -> &'static ThreadState {
    // SAFETY: the block has no destructor, so the thread-local lives at a
    // fixed address until the thread is gone; `ThreadState` is not `Sync`
    // (the shadow stack's Cells), so the reference never reaches another
    // thread.
    THREAD.with(|t| unsafe { &*(t as *const ThreadState) })
}

/// The thread's first [`this`]: caches the block's address.
#[cfg(ftramp_tls_cache)]
#[cold]
#[inline(never)]
fn this_slow() -> &'static ThreadState {
    let t = block();
    cached::store(t);
    t
}

/// Feature `tls-cache` (the `ftramp record` preload's build): the block's
/// address in an 8-byte *initial-exec* thread-local, one load off the
/// thread pointer (and a test for the thread's first use) where the Rust
/// thread-local costs a `__tls_get_addr` call (x86_64) or a TLS descriptor
/// call (aarch64) in a shared library (on x86_64 two calls per traced
/// call, about 3 ns).  On both it also keeps a thread's first use from
/// allocating: with an `LD_AUDIT` module (`ftramp record`'s), glibc sets
/// up TLS before it loads the preload, and a library without initial-exec
/// references then gets its TLS block from `malloc` on each thread's first
/// use (glibc places it in the static block only if it fits the 512 bytes
/// kept for optional use; ours is larger) — from a signal handler that
/// interrupted `malloc`, a deadlock (seen on aarch64, test
/// `a_threads_first_event_from_a_handler_that_interrupted_malloc`).  Executables reach the Rust thread-local at a
/// constant offset without a test and do without it.  Stable Rust has no
/// switch for the TLS model, so the slot is declared in assembly.  It marks
/// the library `STATIC_TLS`: its whole TLS segment is then placed in the
/// static TLS block, which is sized at start-up for the libraries loaded
/// then — fine for a preload, not for a library that may be `dlopen`ed
/// (glibc keeps little room for those), so libftramp.so goes without.  A
/// `fork` child inherits the slot and the block with the address space, at
/// the same addresses.
#[cfg(ftramp_tls_cache)]
mod cached {
    use super::ThreadState;

    // The slot: 8 bytes of .tbss, hidden, reached through its GOT word
    // (R_X86_64_TPOFF64 / R_AARCH64_TLS_TPREL64: its offset from the
    // thread pointer).  (`%` type prefixes: `@` starts a comment on Arm.)
    std::arch::global_asm!(
        ".pushsection .tbss.ftramp_runtime_this,\"awT\",%nobits",
        ".p2align 3",
        ".globl ftramp_runtime_this",
        ".hidden ftramp_runtime_this",
        ".type ftramp_runtime_this, %object",
        ".size ftramp_runtime_this, 8",
        "ftramp_runtime_this:",
        ".zero 8",
        ".popsection",
    );

    /// The cached address, null before the thread's first [`super::this`].
    #[inline(always)]
    pub(super) fn load() -> *const ThreadState {
        let p: *const ThreadState;
        #[cfg(target_arch = "x86_64")]
        // SAFETY: reads this thread's slot (the GOT word holds its offset
        // from the thread pointer); no other memory, stack or flags.
        // Declared `nomem` so that the compiler computes it once per
        // function, across calls: the slot only ever goes from null to this
        // thread's block, and a stale null just takes `this_slow` again,
        // which returns the block.
        unsafe {
            std::arch::asm!(
                "movq ftramp_runtime_this@GOTTPOFF(%rip), {p}",
                "movq %fs:({p}), {p}",
                p = out(reg) p,
                options(att_syntax, pure, nomem, nostack, preserves_flags),
            );
        }
        #[cfg(target_arch = "aarch64")]
        // SAFETY: as above (tpidr_el0 is the thread pointer).
        unsafe {
            std::arch::asm!(
                "mrs {t}, tpidr_el0",
                "adrp {p}, :gottprel:ftramp_runtime_this",
                "ldr {p}, [{p}, #:gottprel_lo12:ftramp_runtime_this]",
                "ldr {p}, [{t}, {p}]",
                p = out(reg) p,
                t = out(reg) _,
                options(pure, nomem, nostack, preserves_flags),
            );
        }
        p
    }

    /// Caches `t`, this thread's block.
    pub(super) fn store(t: &'static ThreadState) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: writes this thread's slot only (see `load`).
        unsafe {
            std::arch::asm!(
                "movq ftramp_runtime_this@GOTTPOFF(%rip), {o}",
                "movq {p}, %fs:({o})",
                o = out(reg) _,
                p = in(reg) t as *const ThreadState,
                options(att_syntax, nostack, preserves_flags),
            );
        }
        #[cfg(target_arch = "aarch64")]
        // SAFETY: as above.
        unsafe {
            std::arch::asm!(
                "mrs {tp}, tpidr_el0",
                "adrp {o}, :gottprel:ftramp_runtime_this",
                "ldr {o}, [{o}, #:gottprel_lo12:ftramp_runtime_this]",
                "str {p}, [{tp}, {o}]",
                o = out(reg) _,
                tp = out(reg) _,
                p = in(reg) t as *const ThreadState,
                options(nostack, preserves_flags),
            );
        }
    }
}

/// Hooks run at thread exit, in registration order, before the runtime
/// releases its own per-thread state.
static HOOKS: [AtomicUsize; 4] = [const { AtomicUsize::new(0) }; 4];

/// The exit key + 1 (0: not created yet).
static KEY: AtomicUsize = AtomicUsize::new(0);

/// glibc keeps the values of the first 32 keys in the thread descriptor;
/// later ones live in blocks it `calloc`s on first use.
const KEY_2NDLEVEL_SIZE: usize = 32;

static FALLBACKS: AtomicU64 = AtomicU64::new(0);

/// Registers `hook` to run when a thread that called [`arm`] exits (for a
/// tracer's per-thread buffers).  At most 4 hooks; registering the same
/// one twice is a no-op.  Returns false when full.
pub fn on_exit(hook: extern "C" fn()) -> bool {
    let h = hook as usize;
    for slot in &HOOKS {
        match slot.compare_exchange(0, h, AcqRel, Acquire) {
            Ok(_) => return true,
            Err(cur) if cur == h => return true,
            Err(_) => {}
        }
    }
    false
}

/// How many threads had to register their exit with an allocating
/// thread-local destructor (see the module docs).
pub fn fallback_arms() -> u64 {
    FALLBACKS.load(Relaxed)
}

/// glibc's `PTHREAD_DESTRUCTOR_ITERATIONS`: key destructors run in up to
/// this many rounds, another round only while some destructor set a value.
const KEY_ROUNDS: u8 = 4;

/// The exit key's destructor waits for the last round: it sets its value
/// again in the earlier ones, so that the hooks run (and the shadow stack
/// goes) after the program's own key destructors, which glibc calls after
/// ours in each round (our key is one of the first) and which may call
/// traced functions (googletest's `ThreadLocal` deletes its values there;
/// their calls were lost before the twenty-first session, counted as
/// shadow-stack misses).
extern "C" fn key_destructor(_value: *mut libc::c_void) {
    let t = this();
    let round = t.exit_round.get() + 1;
    t.exit_round.set(round);
    if round < KEY_ROUNDS && key().is_some_and(set_exit_key) {
        return;
    }
    run_exit_hooks();
}

fn run_exit_hooks() {
    // glibc cleared the key's value before calling us: a traced call made
    // after this (by a later destructor) arms again, and glibc calls the
    // destructor again (up to PTHREAD_DESTRUCTOR_ITERATIONS rounds).
    this().armed.set(false);
    for slot in &HOOKS {
        let h = slot.load(Acquire);
        if h != 0 {
            // SAFETY: only `on_exit` stores into HOOKS, and only the
            // address of an `extern "C" fn()`.
            let f: extern "C" fn() = unsafe { std::mem::transmute::<usize, extern "C" fn()>(h) };
            f();
        }
    }
    this().shadow.release();
}

/// The exit key, created on first use.  Async-signal-safe in glibc:
/// `pthread_key_create` claims a free entry of its key table by
/// compare-and-swap and allocates nothing.
fn key() -> Option<libc::pthread_key_t> {
    let k = KEY.load(Acquire);
    if k != 0 {
        return Some((k - 1) as libc::pthread_key_t);
    }
    let mut new: libc::pthread_key_t = 0;
    // SAFETY: `new` is a valid out-pointer; the destructor is an extern "C"
    // fn with the signature pthread expects and lives for the process.
    if unsafe { libc::pthread_key_create(&mut new, Some(key_destructor)) } != 0 {
        return None;
    }
    match KEY.compare_exchange(0, new as usize + 1, AcqRel, Acquire) {
        Ok(_) => Some(new),
        Err(won) => {
            // SAFETY: `new` is our key, never handed out or set.
            unsafe { libc::pthread_key_delete(new) };
            Some((won - 1) as libc::pthread_key_t)
        }
    }
}

/// Creates the exit key now if it is not yet (registration paths call
/// this, so that it exists early even where the load-time entry below was
/// not linked).
pub fn prepare() {
    let _ = key();
}

/// Create the key at load time, before the program creates its own keys.
#[used]
#[cfg_attr(target_os = "linux", link_section = ".init_array")]
static CREATE_KEY_AT_LOAD: extern "C" fn() = {
    extern "C" fn create() {
        let _ = key();
    }
    create
};

/// Arranges for this thread's exit to run the hooks and release the
/// runtime's per-thread state.  Called on a thread's first traced call,
/// possibly from a signal handler: allocates nothing unless the program
/// used up glibc's first 32 keys (module docs).  False when the exit
/// cannot be arranged (the key cannot be set, or, in the fallback, the
/// thread's thread-locals are being destroyed): callers then leave the
/// call untraced.  A thread whose hooks already ran arms again (glibc then
/// runs the destructor another round) unless that was the last round.
#[cold]
pub fn arm() -> bool {
    arm_with(key())
}

fn arm_with(key: Option<libc::pthread_key_t>) -> bool {
    let t = this();
    if t.armed.get() {
        return true;
    }
    if t.exit_round.get() >= KEY_ROUNDS {
        // The key's last round has run: nothing would release what a
        // traced call takes now, so the call is left untraced.
        return false;
    }
    match key {
        Some(k) if (k as usize) < KEY_2NDLEVEL_SIZE => {
            if !set_exit_key(k) {
                return false;
            }
        }
        _ => {
            if FALLBACK.try_with(|_| ()).is_err() {
                return false;
            }
            FALLBACKS.fetch_add(1, Relaxed);
        }
    }
    t.armed.set(true);
    true
}

/// Sets this thread's value of the exit key `k` (one of glibc's first 32
/// keys), so that its destructor runs at the thread's exit.
fn set_exit_key(k: libc::pthread_key_t) -> bool {
    // SAFETY: `k` is the live exit key; for keys below 32 glibc stores the
    // value in the thread descriptor (no allocation).  The value only
    // needs to be non-null for the destructor to run.
    unsafe { libc::pthread_setspecific(k, std::ptr::NonNull::<libc::c_void>::dangling().as_ptr()) == 0 }
}

/// The fallback: a thread-local whose destructor runs the hooks.
struct Fallback;

impl Drop for Fallback {
    fn drop(&mut self) {
        run_exit_hooks();
    }
}

thread_local! {
    static FALLBACK: Fallback = const { Fallback };
}

/// Whether this thread runs with a hardware shadow stack (x86_64 CET
/// `SHSTK`, arm64 `GCS`, RISC-V `Zicfiss`): a second stack of return
/// addresses that the CPU checks every `ret` against, so that a return
/// fgraph hijacks would end the process.  glibc turns it on at start-up
/// (for programs whose every object is marked for it, where the tunables
/// ask for it) and threads inherit it, so this thread's answer is the
/// process's.  Kernels and arches without the feature answer no.
pub fn shadow_stack_enabled() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // <asm/prctl.h>: ARCH_SHSTK_STATUS, and its ARCH_SHSTK_SHSTK bit.
        const ARCH_SHSTK_STATUS: libc::c_long = 0x5005;
        const ARCH_SHSTK_SHSTK: u64 = 1;
        let mut features: u64 = 0;
        // SAFETY: arch_prctl(ARCH_SHSTK_STATUS, addr) writes one u64 at
        // `addr`, a live local; kernels without shadow stacks fail with
        // EINVAL and write nothing.
        let r = unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_SHSTK_STATUS, &mut features as *mut u64) };
        r == 0 && features & ARCH_SHSTK_SHSTK != 0
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        // <linux/prctl.h> (Linux 6.13, arm64 GCS and RISC-V):
        // PR_GET_SHADOW_STACK_STATUS and its PR_SHADOW_STACK_ENABLE bit.
        const PR_GET_SHADOW_STACK_STATUS: libc::c_int = 74;
        const PR_SHADOW_STACK_ENABLE: u64 = 1;
        let mut status: u64 = 0;
        // SAFETY: prctl(PR_GET_SHADOW_STACK_STATUS, addr, 0, 0, 0) writes
        // one unsigned long at `addr`, a live local; older kernels and
        // other arches fail with EINVAL and write nothing.
        let r = unsafe { libc::prctl(PR_GET_SHADOW_STACK_STATUS, &mut status as *mut u64, 0 as libc::c_ulong, 0 as libc::c_ulong, 0 as libc::c_ulong) };
        r == 0 && status & PR_SHADOW_STACK_ENABLE != 0
    }
}

/// Starts one of the runtime's helper threads (the module watcher, the
/// recorder's writer) with every signal blocked but the grace period's and
/// the synchronous ones (faults).
///
/// A process-directed signal (`SIGALRM`, `SIGINT`, `SIGCHLD`, a
/// `setitimer` `SIGPROF`) goes to any thread that does not block it.  In a
/// program with one thread of its own, the handler would run on a helper
/// thread the program does not know about — and a handler that
/// `siglongjmp`s, or that touches the main thread's state, then breaks the
/// program (seen: a `SIGALRM` handler's `siglongjmp` ran the writer thread
/// on the main thread's stack).  The mask is set in the spawning thread
/// around the spawn, so the new thread starts with it: no signal can reach
/// it before it runs.
///
/// A bare `pthread_create`, not `std::thread`: Rust's thread start
/// registers thread-local destructors through libc's
/// `__cxa_thread_atexit_impl`, which allocates with the `calloc` the
/// program links — a program's own allocator (bash's, made for one thread,
/// without locks) then ran on the helper while the program's thread was in
/// it too, and the calls were traced as the program's.  Here the thread
/// runs `f` at once (it marks itself a helper first), with a 2 MiB stack
/// as `std::thread`'s, and a panic in `f` ends only the thread (it is the
/// `Err` of [`HelperThread::join`]).
pub fn spawn_helper<F, T>(name: &str, f: F) -> std::io::Result<HelperThread<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    // (Installs the grace handler if it was not yet: the helper must answer.)
    let grace = crate::grace::signal_number();
    // SAFETY: sigset_t is plain data, filled by sigfillset and edited by
    // sigdelset; pthread_sigmask only swaps this thread's mask (restored
    // below, whatever the spawn did).
    let old = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut set);
        for sig in [libc::SIGSEGV, libc::SIGBUS, libc::SIGFPE, libc::SIGILL, libc::SIGTRAP].into_iter().chain(grace) {
            libc::sigdelset(&mut set, sig);
        }
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
        old
    };
    // The main thread's stat file is opened now, while the program is
    // (for the recorder) not running yet (see `main_thread_state`).
    let _ = main_thread_state();
    let result: std::sync::Arc<std::sync::Mutex<Option<std::thread::Result<T>>>> = Default::default();
    let out = result.clone();
    let name = std::ffi::CString::new(name.chars().take(15).collect::<String>()).ok();
    let body: Box<dyn FnOnce() + Send> = Box::new(move || {
        // Named by itself (`PR_SET_NAME`), not by the spawning thread: glibc
        // names another thread by writing `/proc/self/task/<tid>/comm`, and
        // the kernel's reaping of a process that had opened that file waits
        // for its `/proc` entries to be invalidated — 100 ms to 1.2 s per
        // child on a loaded machine (a helper measured libuv's test of 100
        // spawns time out; until the twenty-seventh session every recorded
        // process did so).
        if let Some(name) = &name {
            // SAFETY: prctl with a NUL-terminated name of at most 15 bytes,
            // for the calling thread.
            unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr() as libc::c_ulong, 0, 0, 0) };
        }
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        add_helper(std::process::id(), tid);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        *out.lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
    });
    let r = start_thread(body);
    // SAFETY: restores the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    let thread = r?;
    Ok(HelperThread { thread: Some(thread), result })
}

/// `pthread_create` of a thread that runs `body`, with a 2 MiB stack.
fn start_thread(body: Box<dyn FnOnce() + Send>) -> std::io::Result<libc::pthread_t> {
    extern "C" fn run(arg: *mut libc::c_void) -> *mut libc::c_void {
        // SAFETY: `arg` is the `Box<Box<dyn FnOnce>>` that `start_thread`
        // leaked for this thread alone.
        let body = unsafe { Box::from_raw(arg as *mut Box<dyn FnOnce() + Send>) };
        // (A panic is caught inside `body`; none may leave this C frame.)
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body));
        std::ptr::null_mut()
    }
    let arg = Box::into_raw(Box::new(body));
    // SAFETY: attr is initialised before use and destroyed after;
    // pthread_create gets a C start routine and the leaked box, which the
    // thread takes back (or, if the thread is not created, we do).
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        libc::pthread_attr_init(&mut attr);
        libc::pthread_attr_setstacksize(&mut attr, 2 << 20);
        let mut thread: libc::pthread_t = std::mem::zeroed();
        let e = libc::pthread_create(&mut thread, &attr, run, arg as *mut libc::c_void);
        libc::pthread_attr_destroy(&mut attr);
        if e != 0 {
            drop(Box::from_raw(arg));
            return Err(std::io::Error::from_raw_os_error(e));
        }
        Ok(thread)
    }
}

/// A helper thread of [`spawn_helper`]: detached when dropped, or joined.
pub struct HelperThread<T> {
    thread: Option<libc::pthread_t>,
    result: std::sync::Arc<std::sync::Mutex<Option<std::thread::Result<T>>>>,
}

impl<T> HelperThread<T> {
    /// Waits for the thread to end: what `f` returned, or its panic.
    pub fn join(mut self) -> std::thread::Result<T> {
        if let Some(t) = self.thread.take() {
            // SAFETY: a joinable thread, joined once (taken out of self).
            unsafe { libc::pthread_join(t, std::ptr::null_mut()) };
        }
        let r = self.result.lock().unwrap_or_else(|e| e.into_inner()).take();
        r.unwrap_or_else(|| Err(Box::new("the helper thread ended without a result")))
    }
}

impl<T> Drop for HelperThread<T> {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            // SAFETY: a joinable thread, not joined (taken out of self).
            unsafe { libc::pthread_detach(t) };
        }
    }
}

/// Whether the calling thread is one of this process's helper threads
/// ([`spawn_helper`]).
pub fn is_helper() -> bool {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    let pid = std::process::id();
    HELPERS.iter().any(|h| h.load(Acquire) == helper_word(pid, tid))
}

/// The helper threads started by [`spawn_helper`], as `pid << 32 | tid`
/// (0: free).  A fork child's copy still holds its parent's, which are no
/// thread of the child (and whose tids a thread of the child may get once
/// they are gone): the pid tells them apart, and their entries are free
/// for the child's helpers.  Atomics, not a mutex: a mutex that a thread of
/// the parent held at a `fork` stayed locked in the child, whose first
/// `dlsym` (the recorder's check asks whether it runs on a helper) then
/// waited for good.
static HELPERS: [AtomicU64; 64] = [const { AtomicU64::new(0) }; 64];

fn helper_word(pid: u32, tid: i32) -> u64 {
    (pid as u64) << 32 | tid as u32 as u64
}

fn add_helper(pid: u32, tid: i32) {
    for h in &HELPERS {
        let cur = h.load(Acquire);
        if (cur == 0 || (cur >> 32) as u32 != pid) && h.compare_exchange(cur, helper_word(pid, tid), AcqRel, Acquire).is_ok() {
            return;
        }
    }
}

/// The calling thread's `pthread_self`, as a word (0 is never a thread):
/// for slots that mark a thread without a thread-local, which a sanitizer
/// runtime serves late through `__tls_get_addr`.
pub fn pthread_id() -> usize {
    // SAFETY: pthread_self has no preconditions.
    unsafe { libc::pthread_self() as usize }
}

/// The lowest number the runtime's and the recorder's long-lived
/// descriptors are moved to: three quarters of the descriptor limit, at
/// most 768 (a higher number would make the kernel grow every process's
/// descriptor table to it), so that the program's own `open`s return the
/// numbers they return untraced.
pub fn high_fd_base() -> i32 {
    // SAFETY: getrlimit fills the struct we own.
    let mut rl: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } == 0 { rl.rlim_cur } else { 1024 };
    (soft.min(1024) * 3 / 4).max(3) as i32
}

/// `fd` moved to the first free number at or above [`high_fd_base`]
/// (close-on-exec), closed at its old number; `fd` itself if that fails
/// (no free number there).
pub fn move_fd_high(fd: i32) -> i32 {
    // SAFETY: duplicating a descriptor the caller owns.
    let high = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, high_fd_base()) };
    if high < 0 {
        return fd;
    }
    // SAFETY: closing the caller's own low duplicate.
    unsafe { libc::close(fd) };
    high
}

/// The main thread's state letter (`R`, `S`, `Z`, …) from its `/proc`
/// stat file, kept open at a high descriptor and read with `pread`: the
/// helpers look every 50 ms, and opening the file each time took the
/// program's lowest free descriptor for a moment — a program that had just
/// closed one and was about to `dup2` onto it or open a file there got
/// `EBUSY` or another number (bash's process substitutions failed one time
/// in a thousand).  The file is opened once, when the first helper starts
/// (before `main` for the recorder), and again only in a fork child or if
/// the program closed it; what is read must begin with the process's pid.
fn main_thread_state() -> Option<u8> {
    static FD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);
    static FD_PID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let pid = std::process::id();
    let mut buf = [0u8; 512];
    // The file's text, read again (`pread` moves no file offset, should
    // the number be the program's by now).
    let read = |fd: i32, buf: &mut [u8; 512]| {
        // SAFETY: pread into a buffer we own, of at most its length.
        let n = unsafe { libc::pread(fd, buf.as_mut_ptr() as *mut libc::c_void, buf.len(), 0) };
        n.max(0) as usize
    };
    let mut fd = FD.load(Relaxed);
    let owner = FD_PID.load(Relaxed);
    if fd < 0 || owner != pid {
        if fd >= 0 && read(fd, &mut buf) > 0 && buf.starts_with(format!("{owner} (").as_bytes()) {
            // The parent's, inherited by this fork child.
            // SAFETY: closing our own descriptor (its text says so).
            unsafe { libc::close(fd) };
        }
        let path = std::ffi::CString::new(format!("/proc/self/task/{pid}/stat")).ok()?;
        // SAFETY: open of a NUL-terminated path; the descriptor is ours.
        let new = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        if new < 0 {
            return None;
        }
        fd = move_fd_high(new);
        FD.store(fd, Relaxed);
        FD_PID.store(pid, Relaxed);
    }
    let n = read(fd, &mut buf);
    let text = &buf[..n];
    if !text.starts_with(format!("{pid} (").as_bytes()) {
        // Closed by the program (its number may be another file now):
        // opened again next time.
        FD.store(-1, Relaxed);
        return None;
    }
    // The state follows the parenthesised command name.
    let after = text.iter().rposition(|&b| b == b')')?;
    text[after + 1..].iter().copied().find(|b| !b.is_ascii_whitespace())
}

/// The ids of this process's threads (`/proc/self/task`), read with
/// `getdents64` into a buffer of our own: `std::fs::read_dir` goes through
/// libc's `opendir`, which allocates with the `malloc` the program links —
/// a program's own allocator, made for its one thread (bash's), then ran
/// on a helper thread beside the program's.  Unsorted.
pub(crate) fn task_ids() -> std::io::Result<Vec<i32>> {
    // SAFETY: open of a NUL-terminated path; the descriptor is ours and
    // closed below.
    let fd = unsafe { libc::open(c"/proc/self/task".as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut ids = Vec::new();
    let mut buf = vec![0u8; 4096];
    let result = loop {
        // SAFETY: getdents64 fills at most `buf.len()` bytes of our buffer
        // with whole `linux_dirent64` records.
        let n = unsafe { libc::syscall(libc::SYS_getdents64, fd, buf.as_mut_ptr(), buf.len()) };
        if n < 0 {
            break Err(std::io::Error::last_os_error());
        }
        if n == 0 {
            break Ok(());
        }
        let mut off = 0usize;
        // Each record: d_ino (8), d_off (8), d_reclen (2), d_type (1),
        // then the NUL-terminated name.
        while off + 19 <= n as usize {
            let reclen = u16::from_ne_bytes([buf[off + 16], buf[off + 17]]) as usize;
            if reclen == 0 || off + reclen > n as usize {
                break;
            }
            let name = &buf[off + 19..off + reclen];
            let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
            if let Some(id) = std::str::from_utf8(name).ok().and_then(|s| s.parse::<i32>().ok()) {
                ids.push(id);
            }
            off += reclen;
        }
    };
    // SAFETY: our own descriptor.
    unsafe { libc::close(fd) };
    result.map(|()| ids)
}

/// Ends the process with `exit(0)` when the program's threads are all gone
/// but the helpers keep it alive: its main thread called `pthread_exit`
/// and the others ended since. glibc ends a process with `exit(0)` when
/// its last thread ends, but counts the helpers, which never end: without
/// this the program would hang there forever (as a zombie main thread and
/// the helpers). The helpers' loops call it every few milliseconds; it
/// costs one read of the main thread's `/proc` state while the program
/// runs normally, at most every 50 ms (the first call starts the clock).
pub fn exit_if_only_helpers_remain() {
    static EXITING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    static LAST_MS: AtomicU64 = AtomicU64::new(0);
    let now_ms = START.get_or_init(std::time::Instant::now).elapsed().as_millis() as u64;
    let last = LAST_MS.load(Relaxed);
    if now_ms < last + 50 || LAST_MS.compare_exchange(last, now_ms, Relaxed, Relaxed).is_err() {
        return;
    }
    let pid = std::process::id();
    if main_thread_state() != Some(b'Z') {
        return;
    }
    let Ok(tasks) = task_ids() else { return };
    let helpers: Vec<i32> = HELPERS.iter().map(|h| h.load(Acquire)).filter(|&h| (h >> 32) as u32 == pid).map(|h| h as u32 as i32).collect();
    let only_helpers = tasks.into_iter().filter(|&t| t != pid as i32).all(|t| helpers.contains(&t));
    if only_helpers && !EXITING.swap(true, SeqCst) {
        // SAFETY: exit runs the program's atexit handlers and ends the
        // process, as glibc does when the last thread ends; no program
        // thread is left to race with it.
        unsafe { libc::exit(0) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        static MARKED: Cell<bool> = const { Cell::new(false) };
    }
    static MARKED_EXITS: AtomicU64 = AtomicU64::new(0);

    /// Counts the exits of the threads this test marked (the hook stays
    /// registered for every thread of the test process).
    extern "C" fn count_marked() {
        if MARKED.try_with(Cell::get).unwrap_or(false) {
            MARKED_EXITS.fetch_add(1, SeqCst);
        }
    }

    /// The initial-exec slot caches each thread's own block (feature
    /// `tls-cache`; the workspace's tests build with it, for the recorder).
    #[cfg(ftramp_tls_cache)]
    #[test]
    fn the_tls_cache_holds_each_threads_own_block() {
        // The slot read again, out of line: `load` is declared `nomem`, so
        // inline it would be merged with the read `this` made before the
        // store.
        #[inline(never)]
        fn load_fresh() -> *const ThreadState {
            cached::load()
        }
        let check = || {
            let first = this() as *const ThreadState;
            assert_eq!(first, block() as *const ThreadState);
            assert_eq!(load_fresh(), first, "cached by the first use");
            assert_eq!(this() as *const ThreadState, first);
            first as usize
        };
        let main = check();
        let others: Vec<usize> = (0..4).map(|_| std::thread::spawn(check).join().unwrap()).collect();
        // (Joined threads' blocks may be reused by later threads.)
        assert!(others.iter().all(|o| *o != main), "{main:#x} {others:x?}");
    }

    /// `task_ids` lists this process's threads: the ones a test starts are
    /// there while they run, and so is the calling thread.
    #[test]
    fn task_ids_lists_the_threads() {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let ready = ready_tx.clone();
                std::thread::spawn(move || {
                    // SAFETY: gettid has no preconditions.
                    ready.send(unsafe { libc::gettid() }).unwrap();
                    std::thread::sleep(std::time::Duration::from_millis(300));
                })
            })
            .collect();
        let started: Vec<i32> = (0..3).map(|_| ready_rx.recv().unwrap()).collect();
        let ids = task_ids().unwrap();
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() };
        assert!(ids.contains(&me), "{ids:?}");
        for t in &started {
            assert!(ids.contains(t), "{t} in {ids:?}");
        }
        for t in threads {
            t.join().unwrap();
        }
    }

    /// Helpers block the program's signals (so a process-directed one goes
    /// to the program's threads), but not the grace signal; the spawning
    /// thread's mask is left as it was.
    #[test]
    fn helpers_start_with_the_programs_signals_blocked() {
        let mask = || {
            // SAFETY: reads this thread's mask into a zeroed sigset_t.
            unsafe {
                let mut m: libc::sigset_t = std::mem::zeroed();
                libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut m);
                [libc::SIGALRM, libc::SIGINT, libc::SIGCHLD, libc::SIGPROF, libc::SIGTERM, libc::SIGUSR1, crate::grace::signal_number().unwrap(), libc::SIGSEGV].map(|s| libc::sigismember(&m, s))
            }
        };
        let before = mask();
        let helper = spawn_helper("test-helper", mask).unwrap().join().unwrap();
        assert_eq!(helper, [1, 1, 1, 1, 1, 1, 0, 0]);
        assert_eq!(mask(), before);
        assert_eq!(std::thread::spawn(mask).join().unwrap(), before, "other threads inherit as usual");
    }

    /// A helper has its name (the first 15 bytes) from its first instruction
    /// on: it names itself, rather than the spawning thread naming it through
    /// `/proc/self/task/<tid>/comm` (which slowed the reaping of every recorded
    /// process, see `spawn_helper`).
    #[test]
    fn helpers_name_themselves_at_once() {
        let comm = || std::fs::read_to_string("/proc/thread-self/comm").unwrap();
        for _ in 0..20 {
            let name = spawn_helper("ftramp-test-named-helper", comm).unwrap().join().unwrap();
            assert_eq!(name, "ftramp-test-nam\n");
        }
    }

    #[test]
    fn exit_hooks_run_once_per_armed_thread_with_the_key_or_the_fallback() {
        assert!(on_exit(count_marked));
        assert!(on_exit(count_marked), "registering twice is a no-op");
        let fallbacks = fallback_arms();
        let key = key().expect("the exit key");
        assert!((key as usize) < KEY_2NDLEVEL_SIZE, "created at load, among the first keys: {key}");
        let run = |force_fallback: bool| {
            std::thread::spawn(move || {
                MARKED.with(|m| m.set(true));
                assert!(arm_with(if force_fallback { None } else { Some(key) }));
                assert!(arm(), "armed once per thread");
            })
            .join()
            .unwrap()
        };
        run(false);
        assert_eq!(MARKED_EXITS.load(SeqCst), 1, "the key's destructor ran the hook");
        run(true);
        assert_eq!(MARKED_EXITS.load(SeqCst), 2, "the fallback destructor ran the hook");
        assert_eq!(fallback_arms(), fallbacks + 1);
        // A thread that never armed runs no hook.
        std::thread::spawn(|| MARKED.with(|m| m.set(true))).join().unwrap();
        assert_eq!(MARKED_EXITS.load(SeqCst), 2);
    }

    thread_local! {
        static LATE: Cell<bool> = const { Cell::new(false) };
    }
    static LATE_EXITS: AtomicU64 = AtomicU64::new(0);
    /// What the program's key destructor saw: exits counted, armed.
    static SEEN_BY_PROGRAM_DTOR: AtomicU64 = AtomicU64::new(u64::MAX);

    extern "C" fn count_late() {
        if LATE.try_with(Cell::get).unwrap_or(false) {
            LATE_EXITS.fetch_add(1, SeqCst);
        }
    }

    extern "C" fn program_dtor(_: *mut libc::c_void) {
        SEEN_BY_PROGRAM_DTOR.store(LATE_EXITS.load(SeqCst) * 2 + this().armed.get() as u64, SeqCst);
    }

    /// A program's key destructor (its key made after the runtime's, so
    /// glibc calls it after ours in each round) runs while the thread is
    /// still armed and before the exit hooks, which then run once: what it
    /// traces is recorded, where before the shadow stack and the
    /// recorder's buffer were already gone.
    #[test]
    fn a_programs_key_destructors_run_before_the_exit_hooks() {
        assert!(on_exit(count_late));
        let ours = key().expect("the exit key");
        let mut k: libc::pthread_key_t = 0;
        // SAFETY: a valid out-pointer and an extern "C" destructor.
        assert_eq!(unsafe { libc::pthread_key_create(&mut k, Some(program_dtor)) }, 0);
        assert!(k > ours, "the program's key comes after the runtime's");
        std::thread::spawn(move || {
            LATE.with(|m| m.set(true));
            assert!(arm());
            // SAFETY: our live key; any non-null value.
            assert_eq!(unsafe { libc::pthread_setspecific(k, std::ptr::dangling::<libc::c_void>()) }, 0);
        })
        .join()
        .unwrap();
        assert_eq!(SEEN_BY_PROGRAM_DTOR.load(SeqCst), 1, "no hook had run, and the thread was armed");
        assert_eq!(LATE_EXITS.load(SeqCst), 1, "the hooks ran after it, once");
        // SAFETY: our key, no longer set on any thread.
        unsafe { libc::pthread_key_delete(k) };
    }
}
