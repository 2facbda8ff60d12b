//! The traced program behaves as untraced when C++ exceptions and Rust
//! panics unwind through traced frames (the unwinder hooks of
//! `runtime/src/unwind.rs`) and when signal handlers run on an alternate
//! stack (`sigaltstack`) above or below the thread's stack, also left by
//! `siglongjmp`.  Each case runs untraced first and compares.
//!
//! fgraph is process-wide: the tests take a lock and leave no user
//! registered.
#![cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]

// The C tracees are linked into the ftramp-exectest library.
use ftramp_exectest::{prof_timer, Lib};
use ftramp_runtime::fgraph::{self, Fgraph, GraphEnt, GraphRet};
use ftramp_runtime::ops::Filter;
use ftramp_runtime::{unwind, FtraceRegs};
use std::ffi::CStr;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard, Once};

// SAFETY: tests/c/tracee_unwind.cpp's functions with their C signatures;
// integers only, every exception is caught inside.  `unw_trail` returns a
// NUL-terminated buffer and `unw_func` writes through its pointers, so
// those two stay unsafe.
unsafe extern "C" {
    safe fn unw_driver(n: i64) -> i64;
    safe fn unw_loop(iters: i64, n: i64) -> i64;
    safe fn unw_reset();
    safe fn unw_nfuncs() -> i64;
    fn unw_trail() -> *const libc::c_char;
    fn unw_func(f: i64, addr: *mut usize, calls: *mut i64, rets: *mut i64);
}

type Cb = extern "C-unwind" fn(i64) -> i64;

// SAFETY: tests/c/tracee_unwind.c's functions with their C signatures.
// The callbacks may unwind (a Rust panic) through `unwc_call`/`unwc_mid`,
// compiled with -fexceptions, hence "C-unwind".
unsafe extern "C-unwind" {
    safe fn unwc_call(cb: Cb, n: i64) -> i64;
    safe fn unwc_outer(rs: Cb, n: i64) -> i64;
    safe fn unwc_note(v: i64) -> i64;
    safe fn unwc_cleanups() -> i64;
    safe fn unwc_reset();
}

// SAFETY: tests/c/tracee_unwind.c's signal-stack functions; integers only.
// The handler they install runs traced C code and may siglongjmp back into
// `alt_jmp_driver`, which set the jump buffer.
unsafe extern "C" {
    safe fn alt_raise(n: i64) -> i64;
    safe fn alt_jmp_driver(n: i64) -> i64;
    safe fn alt_leaf(n: i64) -> i64;
    safe fn alt_nest(n: i64) -> i64;
    safe fn alt_jump(n: i64) -> i64;
    safe fn alt_install() -> i32;
    safe fn alt_handler_runs() -> i64;
    safe fn alt_handler_bad() -> i64;
}

static LOCK: Mutex<()> = Mutex::new(());

fn lock() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

// ---------------------------------------------------------------------------
// An fgraph user counting entries and returns per function.

const SLOTS: usize = 16;
static FUNCS: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
static ENTRIES: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];
static RETURNS: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];
static UNKNOWN: AtomicU64 = AtomicU64::new(0);

// SAFETY: tests/c/tracee_unwind.c's context-switch functions; integers
// only.  The coroutine they run lives on their own static or mmap'ed stack
// and ends before `uc_run` returns.
unsafe extern "C" {
    safe fn uc_leaf(x: i64) -> i64;
    safe fn uc_yield();
    safe fn uc_resume() -> i64;
    safe fn uc_body(n: i64);
    safe fn uc_entry();
    safe fn uc_step(i: i64) -> i64;
    safe fn uc_run(n: i64, which: i32) -> i64;
    safe fn uc_deep2();
    safe fn uc_deep(k: i64);
    safe fn uc_setctx(n: i64) -> i64;
    safe fn uc_bt_inner(k: i64) -> i32;
    safe fn uc_bt_outer(k: i64) -> i32;
    safe fn uc_backtrace(which: i32) -> i64;
}

// SAFETY: tests/c/tracee_unwind.cpp's coroutine runner: integers only;
// every exception is caught on the coroutine's stack, which ends (through
// uc_link) before `unw_coro` returns.
unsafe extern "C" {
    safe fn unw_coro(iters: i64, which: i32) -> i64;
    safe fn unw_coro_entry();
}

// SAFETY: tests/c/tracee_unwind.cpp's pthread_exit runner: integers only;
// its threads are joined before it returns.
unsafe extern "C" {
    safe fn unw_pexit_run(n: i64) -> i64;
    safe fn unw_pexit_finish(v: i64);
    safe fn unw_pexit_mid(v: i64);
    safe fn unw_pexit_worker(arg: *mut libc::c_void) -> *mut libc::c_void;
    safe fn unw_cancel_run(n: i64) -> i64;
}

// SAFETY: tests/c/tracee_unwind.c's siglongjmp-from-handler loop: integers
// only; it restores SIGUSR1's action and joins its sender thread.
unsafe extern "C" {
    safe fn sj_run(jumps: i64) -> i64;
    safe fn sj_mid(x: i64) -> i64;
    safe fn sj_leaf(x: i64) -> i64;
    safe fn unw_cancel_wait(v: i64);
    safe fn unw_cancel_mid(v: i64);
    safe fn unw_cancel_worker(arg: *mut libc::c_void) -> *mut libc::c_void;
}

fn slot_of(func: usize) -> Option<usize> {
    FUNCS.iter().position(|f| f.load(SeqCst) == func)
}

extern "C" fn count_entry(e: &GraphEnt, _g: &Fgraph, _f: &mut FtraceRegs) -> bool {
    match slot_of(e.func) {
        Some(i) => ENTRIES[i].fetch_add(1, SeqCst),
        None => UNKNOWN.fetch_add(1, SeqCst),
    };
    true
}

extern "C" fn count_ret(r: &GraphRet, _g: &Fgraph, _f: &mut FtraceRegs) {
    match slot_of(r.func) {
        Some(i) => RETURNS[i].fetch_add(1, SeqCst),
        None => UNKNOWN.fetch_add(1, SeqCst),
    };
}

/// Registers a counting user for `funcs` (addresses of traced functions).
fn counting_user(funcs: &[usize]) -> Arc<Fgraph> {
    assert!(funcs.len() <= SLOTS);
    for (i, f) in FUNCS.iter().enumerate() {
        f.store(funcs.get(i).copied().unwrap_or(usize::MAX), SeqCst);
        ENTRIES[i].store(0, SeqCst);
        RETURNS[i].store(0, SeqCst);
    }
    UNKNOWN.store(0, SeqCst);
    let filter = funcs.iter().fold(Filter::new(), |f, a| f.addr(*a));
    let u = Arc::new(Fgraph::new(count_entry, count_ret).filter(filter).skip_timestamp(true));
    fgraph::register_fgraph(u.clone()).unwrap();
    u
}

fn counts(i: usize) -> (u64, u64) {
    (ENTRIES[i].load(SeqCst), RETURNS[i].load(SeqCst))
}

// ---------------------------------------------------------------------------
// C++ exceptions.

/// (address, calls, normal returns) of each function of tracee_unwind.cpp.
fn cpp_funcs() -> Vec<(usize, i64, i64)> {
    (0..unw_nfuncs())
        .map(|f| {
            let (mut a, mut c, mut r) = (0usize, 0i64, 0i64);
            // SAFETY: `f` is below unw_nfuncs(); the pointers are to locals.
            unsafe { unw_func(f, &mut a, &mut c, &mut r) };
            (a, c, r)
        })
        .collect()
}

fn trail() -> String {
    // SAFETY: unw_trail returns its NUL-terminated static buffer.
    unsafe { CStr::from_ptr(unw_trail()) }.to_string_lossy().into_owned()
}

#[test]
fn hooks_are_installed_and_call_through() {
    let _l = lock();
    quiet_booms();
    let n = unwind::install().unwrap();
    assert!(n >= 2, "hooked slots: {n}");
    assert_eq!(unwind::install().unwrap(), n, "idempotent");
    // Untraced exceptions and panics go through the hooks unchanged.
    unw_reset();
    let r = unw_driver(2);
    assert!(r > 0 && trail().contains('C'), "{r} {}", trail());
    assert_eq!(unwc_outer(catching, 3), unwc_outer_expect(3));
}

#[test]
fn cpp_exceptions_through_traced_frames() {
    let _l = lock();
    unw_reset();
    let untraced = (unw_driver(3), trail(), unw_driver(1), unw_loop(20, 2));
    let truth0 = cpp_funcs();
    assert!(truth0.iter().all(|(_, c, _)| *c > 0), "every function ran: {truth0:?}");
    let addrs: Vec<usize> = truth0.iter().map(|f| f.0).collect();
    let u = counting_user(&addrs);
    assert_eq!(unwind::install_error(), None, "registering hooked the unwinder");
    let (stale, misses, restores, unrestored) = (fgraph::stale_frames(), fgraph::misses(), unwind::restores(), unwind::unrestored_frames());
    unw_reset();
    let traced = (unw_driver(3), trail(), unw_driver(1), unw_loop(20, 2));
    let depth = fgraph::depth();
    let truth = cpp_funcs();
    // Many iterations on a small shadow stack: a leak would overflow it.
    fgraph::set_stack_words(256);
    let (r, d, m) = std::thread::spawn(|| (unw_loop(300, 1), fgraph::depth(), fgraph::thread_misses())).join().unwrap();
    fgraph::set_stack_words(0);
    let got: Vec<(u64, u64)> = (0..addrs.len()).map(counts).collect();
    fgraph::unregister_fgraph(&u).unwrap();
    assert_eq!(traced, untraced, "results and trail as untraced");
    assert_eq!(depth, 0);
    assert_eq!((d, m), (0, 0), "no frame leaks, no misses");
    assert_eq!(fgraph::misses(), misses);
    assert!(unwind::restores() > restores, "the hooks restored frames");
    assert_eq!(unwind::unrestored_frames(), unrestored, "every return slot was found");
    assert!(fgraph::stale_frames() > stale, "unwound frames are dropped");
    assert_eq!(UNKNOWN.load(SeqCst), 0);
    // The thread's run counted too: compare the main thread's truth with
    // the callbacks minus what the thread added.
    let thread_truth = {
        unw_reset();
        unw_loop(300, 1);
        cpp_funcs()
    };
    assert_eq!(r, unw_loop_expect(300, 1));
    assert_eq!((untraced.0, untraced.2), (unw_driver_expect(3), unw_driver_expect(1)));
    for (i, ((a, c, ret), (tc, tr))) in truth.iter().zip(thread_truth.iter().map(|t| (t.1, t.2))).enumerate() {
        // Every call entered; every normal return reported; no return for
        // frames an exception unwound.
        assert_eq!(got[i], ((c + tc) as u64, (ret + tr) as u64), "function {i} at {a:#x}: (entries, returns) vs (calls, normal returns)");
    }
}

fn unw_loop_expect(iters: i64, n: i64) -> i64 {
    (0..iters).map(|i| unw_driver_expect(n + i % 3)).sum()
}

/// unw_driver's checksum, from what each case catches.
fn unw_driver_expect(n: i64) -> i64 {
    let catch = |n: i64| 100 + n + 1;
    (catch(n) + 42 + (42 + 7) + 1000 + catch(0)) * 10 + n
}

static PROF_RUNS: AtomicU64 = AtomicU64::new(0);
static PROF_BAD: AtomicU64 = AtomicU64::new(0);

extern "C" fn on_prof(_sig: i32) {
    PROF_RUNS.fetch_add(1, SeqCst);
    if alt_nest(3) != 22 {
        PROF_BAD.fetch_add(1, SeqCst);
    }
}

#[test]
fn cpp_exceptions_while_signal_handlers_call_traced_functions() {
    let _l = lock();
    // SIGPROF lands anywhere: in the unwinder between a hook's restore and
    // the landing pad, in cleanups, in hooks; its handler calls traced C.
    let mut addrs: Vec<usize> = cpp_funcs().iter().map(|f| f.0).collect();
    addrs.extend([alt_nest as *const () as usize, alt_leaf as *const () as usize]);
    let u = counting_user(&addrs);
    unw_reset();
    PROF_RUNS.store(0, SeqCst);
    PROF_BAD.store(0, SeqCst);
    prof_timer(Some(on_prof), 100);
    let (mut rounds, mut wrong) = (0, 0);
    let start = std::time::Instant::now();
    while PROF_RUNS.load(SeqCst) < 100 && start.elapsed() < std::time::Duration::from_secs(20) {
        wrong += usize::from(unw_loop(20, 2) != unw_loop_expect(20, 2));
        rounds += 1;
    }
    prof_timer(None, 0);
    let depth = fgraph::depth();
    let truth = cpp_funcs();
    let got: Vec<(u64, u64)> = (0..addrs.len()).map(counts).collect();
    fgraph::unregister_fgraph(&u).unwrap();
    assert_eq!((wrong, depth, PROF_BAD.load(SeqCst)), (0, 0, 0), "after {rounds} rounds");
    assert!(PROF_RUNS.load(SeqCst) > 0);
    for (i, (a, c, r)) in truth.iter().enumerate() {
        assert_eq!(got[i], (*c as u64, *r as u64), "function {i} at {a:#x}: (entries, returns) vs (calls, normal returns)");
    }
    let n = truth.len();
    assert_eq!(got[n].0, got[n].1, "alt_nest in the handler: every return");
    assert_eq!(got[n + 1].0, got[n + 1].1, "alt_leaf in the handler: every return");
}

// ---------------------------------------------------------------------------
// Rust panics.

struct Boom(i64);

fn quiet_booms() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info.payload().downcast_ref::<Boom>().is_none() {
                default(info);
            }
        }));
    });
}

/// Panics for multiples of 3.
extern "C-unwind" fn maybe_panic(n: i64) -> i64 {
    if n % 3 == 0 {
        std::panic::panic_any(Boom(n));
    }
    n * 10
}

/// Called from traced C (unwc_outer): catches a panic that unwinds through
/// traced C frames with cleanups, then calls a traced function.
extern "C-unwind" fn catching(n: i64) -> i64 {
    let r = match catch_unwind(AssertUnwindSafe(|| unwc_call(maybe_panic, n))) {
        Ok(v) => v,
        Err(p) => -p.downcast::<Boom>().map(|b| b.0).unwrap_or(1000),
    };
    r + unwc_note(1)
}

fn unwc_outer_expect(n: i64) -> i64 {
    let r = if n % 3 == 0 { -n } else { (n * 10 * 2 + 1) + 1 };
    r + 1 + 5
}

#[test]
fn rust_panics_through_traced_c_frames() {
    let _l = lock();
    quiet_booms();
    let run = || {
        unwc_reset();
        let direct: Vec<i64> = (0..12).map(|n| catch_unwind(AssertUnwindSafe(|| unwc_call(maybe_panic, n))).unwrap_or(-1)).collect();
        let outer: Vec<i64> = (0..12).map(|n| unwc_outer(catching, n)).collect();
        (direct, outer, unwc_cleanups())
    };
    let untraced = run();
    assert_eq!(untraced.1, (0..12).map(unwc_outer_expect).collect::<Vec<_>>());
    let funcs = [unwc_call as *const () as usize, unwc_outer as *const () as usize, unwc_note as *const () as usize];
    let u = counting_user(&funcs);
    let (stale, unrestored) = (fgraph::stale_frames(), unwind::unrestored_frames());
    let traced = run();
    // A traced call after the last catch drops what the panics left.
    unwc_note(0);
    let depth = fgraph::depth();
    let got: Vec<(u64, u64)> = (0..3).map(counts).collect();
    fgraph::unregister_fgraph(&u).unwrap();
    assert_eq!(traced, untraced);
    assert_eq!(depth, 0);
    assert!(fgraph::stale_frames() > stale);
    assert_eq!(unwind::unrestored_frames(), unrestored, "every return slot was found");
    // unwc_call: 24 calls, 8 of them panicked (0, 3, 6, 9, twice): no return.
    assert_eq!(got[0], (24, 16), "unwc_call (entries, returns)");
    // unwc_outer survived each panic (caught below it, then a traced
    // call re-hijacked it): every return reported.
    assert_eq!(got[1], (12, 12), "unwc_outer");
    // unwc_note: 2 cleanups per unwc_call (run on return or by the
    // panic's cleanups), 1 per `catching`, and the last one.
    assert_eq!(got[2], (24 * 2 + 12 + 1, 24 * 2 + 12 + 1), "unwc_note");
}

static BT_FRAMES: Mutex<String> = Mutex::new(String::new());

extern "C-unwind" fn capture(n: i64) -> i64 {
    *BT_FRAMES.lock().unwrap() = format!("{}", std::backtrace::Backtrace::force_capture());
    n
}

extern "C-unwind" fn via_call(n: i64) -> i64 {
    unwc_call(capture, n)
}

#[test]
fn backtraces_pass_hijacked_returns() {
    let _l = lock();
    let funcs = [unwc_call as *const () as usize, unwc_outer as *const () as usize];
    let u = counting_user(&funcs);
    let r = unwc_outer(via_call, 4);
    let depth = fgraph::depth();
    let got: Vec<(u64, u64)> = (0..2).map(counts).collect();
    fgraph::unregister_fgraph(&u).unwrap();
    assert_eq!((r, depth), ((4 * 2 + 1) + 1 + 5, 0));
    assert_eq!(got, vec![(1, 1), (1, 1)], "returns still traced after the backtrace");
    let bt = BT_FRAMES.lock().unwrap().clone();
    // The walk went past the hijacked returns (unwc_call's, unwc_outer's)
    // up to the test harness.
    for f in ["unwc_mid", "unwc_call", "unwc_outer", "run_test"] {
        assert!(bt.contains(f), "{f} missing from the backtrace:\n{bt}");
    }
}

/// The pcs an unhooked `_Unwind_Backtrace` (from `dlsym`, so no GOT hook
/// restores first) sees, at most [`RAW_CAP`].
static RAW_PCS: Mutex<Vec<usize>> = Mutex::new(Vec::new());
const RAW_CAP: usize = 1000;

extern "C" {
    fn _Unwind_GetIP(ctx: *mut libc::c_void) -> usize;
}

extern "C" fn raw_frame(ctx: *mut libc::c_void, _arg: *mut libc::c_void) -> libc::c_int {
    let mut pcs = RAW_PCS.lock().unwrap();
    // SAFETY: the unwinder's context for the frame it hands us.
    pcs.push(unsafe { _Unwind_GetIP(ctx) });
    // _URC_NO_REASON, or _URC_END_OF_STACK to stop a walk that loops.
    if pcs.len() < RAW_CAP { 0 } else { 5 }
}

extern "C-unwind" fn raw_capture(n: i64) -> i64 {
    type Trace = extern "C" fn(*mut libc::c_void, *mut libc::c_void) -> libc::c_int;
    // SAFETY: dlsym of a NUL-terminated name; the result, when not null, is
    // libgcc's `_Unwind_Backtrace(trace, arg)`.
    let f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"_Unwind_Backtrace".as_ptr()) };
    assert!(!f.is_null());
    // SAFETY: `f` is that function (above), whose C signature `Trace` matches.
    let f: extern "C" fn(Trace, *mut libc::c_void) -> libc::c_int = unsafe { std::mem::transmute(f) };
    RAW_PCS.lock().unwrap().clear();
    f(raw_frame, std::ptr::null_mut());
    n
}

extern "C-unwind" fn via_raw(n: i64) -> i64 {
    unwc_call(raw_capture, n)
}

/// An unwinder walk that no hook sees and that calls no personality: it
/// meets `return_to_handler` and ends there (its FDE's return address is 0
/// while the slot still holds `return_to_handler`), rather than looping on
/// it; the traced calls go on as usual.
#[test]
fn unhooked_backtraces_end_at_a_hijacked_return() {
    let _l = lock();
    let rth = fgraph::return_to_handler().unwrap();
    // (Registered at the first pthread_cancel otherwise.)
    unwind::register_return_fde();
    let u = counting_user(&[unwc_call as *const () as usize]);
    let r = unwc_outer(via_raw, 4);
    let depth = fgraph::depth();
    let got = counts(0);
    fgraph::unregister_fgraph(&u).unwrap();
    assert_eq!((r, depth), ((4 * 2 + 1) + 1 + 5, 0));
    assert_eq!(got, (1, 1), "unwc_call (entries, returns)");
    let pcs = RAW_PCS.lock().unwrap().clone();
    assert!(pcs.len() < RAW_CAP, "the walk looped: {} frames", pcs.len());
    // (libgcc hands the end of the stack to the callback too, as pc 0.)
    let end = pcs.iter().rposition(|p| *p != 0).map_or(&[][..], |i| &pcs[i..]);
    assert!(end == [rth] || end == [rth, 0], "the walk ends at unwc_call's hijacked return: {pcs:x?}");
    assert_eq!(pcs.iter().filter(|p| **p == rth).count(), 1, "{pcs:x?}");
}

#[test]
fn libraries_loaded_later_get_the_hooks() {
    let _l = lock();
    unwind::install().unwrap();
    let before = unwind::hooked_slots();
    // Our own test library (no constructors), kept loaded.
    let lib = Lib::open(env!("FTRAMP_UNWIND_DL_SO"));
    let sym = |name: &str| lib.sym(name);
    // unwdl_run is `long (long)` and catches what it throws.
    let run = lib.func("unwdl_run");
    let untraced = run(4);
    // Cleanups of deep(0..4): 0, 1, 9, 66, 466; the handler's: 3262.
    assert_eq!(untraced, 100 + 40 + 3262);
    // What the module watcher does after a dlopen.
    unwind::rescan();
    assert!(unwind::hooked_slots() > before, "the new library's GOT was hooked");
    let u = counting_user(&[sym("unwdl_run"), sym("unwdl_deep"), sym("unwdl_cleanup")]);
    let traced = run(4);
    let depth = fgraph::depth();
    let got: Vec<(u64, u64)> = (0..3).map(counts).collect();
    fgraph::unregister_fgraph(&u).unwrap();
    assert_eq!((traced, depth), (untraced, 0));
    assert_eq!(got, vec![(1, 1), (5, 0), (6, 6)], "(entries, returns) of unwdl_run, unwdl_deep, unwdl_cleanup");
}

// ---------------------------------------------------------------------------
// Signal handlers on an alternate stack.

#[derive(Debug, Clone, Copy, PartialEq)]
enum Place {
    Above,
    Below,
}

/// This thread's stack `[lo, hi)`.
fn thread_stack() -> (usize, usize) {
    // SAFETY: pthread_attr_t initialised by pthread_getattr_np, destroyed once.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        assert_eq!(libc::pthread_getattr_np(libc::pthread_self(), &mut attr), 0);
        let (mut a, mut s) = (std::ptr::null_mut(), 0usize);
        assert_eq!(libc::pthread_attr_getstack(&attr, &mut a, &mut s), 0);
        libc::pthread_attr_destroy(&mut attr);
        (a as usize, a as usize + s)
    }
}

const ALT_SIZE: usize = 256 << 10;

/// An alternate stack mapped above or below this thread's stack, if a free
/// place is found.
fn map_alt(place: Place) -> Option<usize> {
    let (lo, hi) = thread_stack();
    for k in 1..256usize {
        let hint = match place {
            Place::Above => hi + k * (16 << 20),
            Place::Below => lo.checked_sub(k * (16 << 20) + ALT_SIZE)?,
        };
        // SAFETY: a fresh anonymous mapping that replaces nothing.
        let p = unsafe {
            libc::mmap(
                hint as *mut libc::c_void,
                ALT_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            continue;
        }
        let a = p as usize;
        if (place == Place::Above && a >= hi) || (place == Place::Below && a + ALT_SIZE <= lo) {
            return Some(a);
        }
        // SAFETY: our own mapping, unused.
        unsafe { libc::munmap(p, ALT_SIZE) };
    }
    None
}

#[derive(Debug, PartialEq)]
struct AltRun {
    plain: i64,
    jumped: i64,
    handler_runs: i64,
    handler_bad: i64,
    depth: usize,
    misses: u64,
}

/// In a new thread with an alternate signal stack at `place`: signals
/// raised from inside traced frames, handled on that stack by traced code;
/// then the same with a siglongjmp out of the handler.  `stale` receives
/// the stale-frame count between the two halves.
fn alt_run(place: Place, stale: &AtomicU64) -> Option<AltRun> {
    std::thread::scope(|s| {
        s.spawn(|| {
            let alt = map_alt(place)?;
            let ss = libc::stack_t { ss_sp: alt as *mut libc::c_void, ss_flags: 0, ss_size: ALT_SIZE };
            // SAFETY: installs a stack we mapped for this thread; removed below before unmapping.
            assert_eq!(unsafe { libc::sigaltstack(&ss, std::ptr::null_mut()) }, 0);
            assert_eq!(alt_install(), 0);
            let (runs, bad) = (alt_handler_runs(), alt_handler_bad());
            let plain = (0..40).map(|i| alt_raise(i % 5)).sum();
            stale.store(fgraph::stale_frames(), SeqCst);
            let jumped = (0..40).map(|i| alt_jmp_driver(i % 5)).sum();
            let r = AltRun {
                plain,
                jumped,
                handler_runs: alt_handler_runs() - runs,
                handler_bad: alt_handler_bad() - bad,
                depth: fgraph::depth(),
                misses: fgraph::thread_misses(),
            };
            let off = libc::stack_t { ss_sp: std::ptr::null_mut(), ss_flags: libc::SS_DISABLE, ss_size: 0 };
            // SAFETY: disables the alternate stack, then unmaps it: no handler runs on it any more.
            unsafe {
                assert_eq!(libc::sigaltstack(&off, std::ptr::null_mut()), 0);
                libc::munmap(alt as *mut libc::c_void, ALT_SIZE);
            }
            Some(r)
        })
        .join()
        .unwrap()
    })
}

fn alt_case(place: Place) {
    let _l = lock();
    let ignored = AtomicU64::new(0);
    let Some(untraced) = alt_run(place, &ignored) else {
        eprintln!("no free place for an alternate stack {place:?} the thread stack: skipped");
        return;
    };
    assert_eq!((untraced.handler_runs, untraced.handler_bad), (80, 0));
    let funcs = [alt_raise as *const () as usize, alt_leaf as *const () as usize, alt_nest as *const () as usize, alt_jump as *const () as usize];
    let u = counting_user(&funcs);
    let stale = fgraph::stale_frames();
    let mid = AtomicU64::new(0);
    let traced = alt_run(place, &mid);
    let got: Vec<(u64, u64)> = (0..4).map(counts).collect();
    let after = fgraph::stale_frames();
    fgraph::unregister_fgraph(&u).unwrap();
    let Some(traced) = traced else { panic!("the alternate stack {place:?} was found untraced, not traced") };
    assert_eq!(traced, untraced);
    // First half: the handlers' frames nested on the interrupted ones,
    // none was taken as stale, every return was reported.
    assert_eq!(mid.load(SeqCst), stale, "no frame dropped without siglongjmp");
    let (raise, leaf, nest, jump) = (got[0], got[1], got[2], got[3]);
    assert_eq!(nest.0, 80 * 5, "alt_nest(4) in every handler");
    assert_eq!(nest.0, nest.1);
    // Second half: alt_jump(3..0) and the alt_raise frames below the
    // handler are left by siglongjmp: dropped, no return.
    assert_eq!(jump, (40 * 4, 0));
    assert!(after - stale >= 40 * 4);
    let raised: u64 = (0..40).map(|i| i % 5 + 1).sum();
    assert_eq!(raise.0, 2 * raised);
    assert_eq!(raise.1, raised, "alt_raise returns only in the first half");
    assert_eq!(leaf.0, leaf.1, "alt_leaf always returns");
}

#[test]
fn sigaltstack_above_the_thread_stack() {
    alt_case(Place::Above);
}

#[test]
fn sigaltstack_below_the_thread_stack() {
    alt_case(Place::Below);
}

// ---------------------------------------------------------------------------
// Context switches.

/// `swapcontext` to a coroutine on another stack and back, inside traced
/// frames, and `setcontext` back into an earlier frame: the switch hooks
/// put every hijacked return address back and drop the frames, so the
/// program runs as untraced and later calls are traced as usual.  Rule:
/// a frame active at a context switch gets no `ret` callback.
#[test]
fn context_switches_through_traced_frames() {
    let _l = lock();
    // Static stack, then an mmap'ed one; setcontext four times.
    let run = || ((0..2).map(|w| uc_run(5, w)).collect::<Vec<_>>(), uc_setctx(4));
    let untraced = run();
    assert_eq!(untraced.1, 4 * 100 + 9);
    let f = |p: *const ()| p as usize;
    let funcs = [
        f(uc_leaf as *const ()),
        f(uc_yield as *const ()),
        f(uc_resume as *const ()),
        f(uc_body as *const ()),
        f(uc_entry as *const ()),
        f(uc_step as *const ()),
        f(uc_run as *const ()),
        f(uc_deep2 as *const ()),
        f(uc_deep as *const ()),
        f(uc_setctx as *const ()),
    ];
    let u = counting_user(&funcs);
    let (stale, hooked) = (fgraph::stale_frames(), unwind::hooked_slots());
    let traced = [run(), run()];
    let depth = fgraph::depth();
    let got: Vec<(u64, u64)> = (0..funcs.len()).map(counts).collect();
    let unknown = UNKNOWN.load(SeqCst);
    fgraph::unregister_fgraph(&u).unwrap();
    assert!(hooked > 0);
    assert_eq!(traced, [untraced.clone(), untraced.clone()], "the program's results");
    assert_eq!(depth, 0, "nothing left on the shadow stack");
    assert_eq!(unknown, 0);
    assert!(fgraph::stale_frames() > stale);
    // Per uc_run(5): 6 steps, each resuming the coroutine once; the
    // coroutine yields 5 times and then ends.  Two uc_run per run(), two
    // run()s.  uc_leaf never spans a switch: every return is seen; every
    // other function is active at one, so none of its returns is.
    let runs = 2 * 2;
    assert_eq!(got[0], ((11 * runs + 5 * 2) as u64, (11 * runs + 5 * 2) as u64), "uc_leaf (entries, returns)");
    assert_eq!(got[1], (5 * runs as u64, 0), "uc_yield");
    assert_eq!(got[2], (6 * runs as u64, 0), "uc_resume");
    assert_eq!(got[3], (runs as u64, 0), "uc_body");
    assert_eq!(got[4], (runs as u64, 0), "uc_entry");
    assert_eq!(got[5], (6 * runs as u64, 0), "uc_step");
    assert_eq!(got[6], (runs as u64, 0), "uc_run");
    assert_eq!(got[7], (4 * 2, 0), "uc_deep2");
    assert_eq!(got[8], (4 * 2, 0), "uc_deep");
    assert_eq!(got[9], (2, 0), "uc_setctx");
}

/// C++ exceptions thrown and caught inside a `makecontext` coroutine (static
/// and mmap'ed stack), through traced frames on it, and `backtrace()` two
/// traced calls down on such a stack: as untraced.  The hooks restore the
/// frames of the stack the unwinder runs on; until the twenty-sixth session
/// that was always the thread's own, so the coroutine's frames kept
/// `return_to_handler`: std::terminate, and a backtrace of 2 frames
/// instead of 5 (found by a helper with Boost-free ucontext programs).
#[test]
fn exceptions_and_backtraces_on_a_coroutines_stack() {
    let _l = lock();
    let run = || ([unw_coro(4, 0), unw_coro(4, 1)], [uc_backtrace(0), uc_backtrace(1)]);
    unw_reset();
    let untraced = run();
    let truth = cpp_funcs();
    assert_eq!(untraced.0, [unw_loop_expect(4, 2); 2]);
    assert!(untraced.1.iter().all(|n| *n >= 3), "backtrace sees the traced frames: {:?}", untraced.1);
    let f = |p: *const ()| p as usize;
    let mut funcs: Vec<usize> = truth.iter().map(|t| t.0).collect();
    funcs.extend([f(unw_coro_entry as *const ()), f(uc_bt_inner as *const ()), f(uc_bt_outer as *const ()), f(uc_backtrace as *const ())]);
    let u = counting_user(&funcs);
    let unrestored = unwind::unrestored_frames();
    unw_reset();
    let traced = run();
    let depth = fgraph::depth();
    let got: Vec<(u64, u64)> = (0..funcs.len()).map(counts).collect();
    let unknown = UNKNOWN.load(SeqCst);
    fgraph::unregister_fgraph(&u).unwrap();
    assert_eq!(traced, untraced, "the program's results and backtraces");
    assert_eq!((depth, unknown), (0, 0));
    assert_eq!(unwind::unrestored_frames(), unrestored, "every return slot was found");
    let n = truth.len();
    for (i, (a, c, r)) in truth.iter().enumerate() {
        assert_eq!(got[i], (*c as u64, *r as u64), "function {i} at {a:#x}: (entries, returns) vs (calls, normal returns)");
    }
    // The coroutines' entries end through uc_link, each returning once;
    // the backtrace functions return normally, on both stacks, except
    // `uc_backtrace(1)`, active at its `swapcontext` (no return callback,
    // the rule of context switches).
    assert_eq!(got[n], (2, 2), "unw_coro_entry");
    assert_eq!((got[n + 1], got[n + 2], got[n + 3]), ((2, 2), (2, 2), (2, 1)), "uc_bt_inner, uc_bt_outer, uc_backtrace");
}

/// `pthread_exit` two traced frames down, the innermost without cleanups:
/// the hook puts the return addresses back first, so glibc's forced unwind
/// runs the destructors of every frame as untraced (without it, none ran).
#[test]
fn pthread_exit_runs_the_destructors_above_traced_frames() {
    let _l = lock();
    let untraced = unw_pexit_run(4);
    assert_eq!(untraced, (1 + 2 + 3 + 4) * 1000 + 4 * 2);
    let f = |p: *const ()| p as usize;
    let funcs = [f(unw_pexit_finish as *const ()), f(unw_pexit_mid as *const ()), f(unw_pexit_worker as *const ())];
    let u = counting_user(&funcs);
    let traced = unw_pexit_run(4);
    let got: Vec<(u64, u64)> = (0..funcs.len()).map(counts).collect();
    fgraph::unregister_fgraph(&u).unwrap();
    assert_eq!(traced, untraced, "exit values and destructors as untraced");
    // Entered by each thread; none returns.
    for (i, name) in ["unw_pexit_finish", "unw_pexit_mid", "unw_pexit_worker"].iter().enumerate() {
        assert_eq!(got[i], (4, 0), "{name} (entries, returns)");
    }
}

/// Handlers that `siglongjmp` out of wherever a signal landed — inside a
/// trampoline, fgraph's push or pop, a callback — leave dispatch sections
/// that never end.  The next traced call finds its stack pointer at or
/// above where the section began and clears what it held (the dispatch
/// depth, fgraph's busy mark): the thread traces on, and grace periods do
/// not wait for it forever (before: not one more call was traced, and the
/// depth stayed non-zero).
#[test]
fn siglongjmp_out_of_handlers_that_interrupted_the_runtime() {
    let _l = lock();
    let funcs = [sj_mid as *const () as usize, sj_leaf as *const () as usize];
    let u = counting_user(&funcs);
    let left = ftramp_runtime::grace::sections_left_by_jump();
    let mut jumps = 0;
    for _ in 0..50 {
        jumps += sj_run(200);
        if ftramp_runtime::grace::sections_left_by_jump() > left {
            break;
        }
    }
    assert!(ftramp_runtime::grace::sections_left_by_jump() > left, "no signal landed in dispatch in {jumps} jumps");
    // (The last jump may have left a section too: the next traced call
    // finds it.)
    let before: Vec<(u64, u64)> = (0..2).map(counts).collect();
    let mut sum = 0;
    for x in 0..1000 {
        sum += sj_mid(x);
    }
    let after: Vec<(u64, u64)> = (0..2).map(counts).collect();
    assert_eq!(ftramp_runtime::grace::dispatch_depth(), 0, "the depth the left sections held was cleared");
    fgraph::unregister_fgraph(&u).unwrap();
    assert_eq!(sum, (0..1000).map(|x| 6 * x + 5).sum::<i64>());
    assert_eq!((after[0].0 - before[0].0, after[0].1 - before[0].1), (1000, 1000), "sj_mid traced after the jumps");
    assert_eq!((after[1].0 - before[1].0, after[1].1 - before[1].1), (2000, 2000), "sj_leaf");
}

/// `pthread_cancel` of threads waiting two traced frames down, in a traced
/// function without cleanups: the forced unwind starts inside libc, so no
/// hook restores first; `return_to_handler`'s FDE and personality let the
/// unwinder through (without them, no destructor ran).
#[test]
fn pthread_cancel_runs_the_destructors_above_traced_frames() {
    let _l = lock();
    let untraced = unw_cancel_run(4);
    assert_eq!(untraced, 4 * 1000 + 4 * 2);
    let f = |p: *const ()| p as usize;
    let funcs = [f(unw_cancel_wait as *const ()), f(unw_cancel_mid as *const ()), f(unw_cancel_worker as *const ())];
    let u = counting_user(&funcs);
    let restores = unwind::restores();
    let traced = unw_cancel_run(4);
    let got: Vec<(u64, u64)> = (0..funcs.len()).map(counts).collect();
    fgraph::unregister_fgraph(&u).unwrap();
    assert_eq!(traced, untraced, "cancellations and destructors as untraced");
    for (i, name) in ["unw_cancel_wait", "unw_cancel_mid", "unw_cancel_worker"].iter().enumerate() {
        assert_eq!(got[i], (4, 0), "{name} (entries, returns)");
    }
    // Each thread's unwinder met a hijacked return and restored there.
    assert!(unwind::restores() >= restores + 4, "restores by the personality");
}
