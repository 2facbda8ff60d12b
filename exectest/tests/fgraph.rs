//! fgraph on real patched functions, modelled on the kernel's fgraph
//! selftests: users storing and checking their own data between entry and
//! return, a local value passed from entry to exit, depths, return values
//! seen and changed, entry refusing the return, shadow-stack overflow,
//! threads, and longjmp out of traced calls.
//!
//! fgraph is process-wide: the tests take a lock and leave no user
//! registered.
#![cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]

use ftramp_exectest::*;
use ftramp_runtime::fgraph::{self, Fgraph, FgraphError, GraphEnt, GraphRet};
use ftramp_runtime::ops::Filter;
use ftramp_runtime::FtraceRegs;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard};

// SAFETY: tests/c/tracee_fgraph.c's functions with their C signatures;
// integers only, no preconditions.
unsafe extern "C" {
    safe fn tracee_jmp_driver(n: i64) -> i64;
    safe fn tracee_jmp_loop(iters: i64, n: i64) -> i64;
}

static LOCK: Mutex<()> = Mutex::new(());

fn lock() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Per-user counters, found through `Fgraph::private`.
#[derive(Default)]
struct Stats {
    entries: AtomicU64,
    rets: AtomicU64,
    bad: AtomicU64,
    /// Set the return value to this (i64::MIN: leave it).
    set_ret: AtomicI64,
    /// Entry returns false when argument 0 equals this.
    refuse_arg: AtomicI64,
    /// (depth at entry, n) for tracee_nested, in order.
    depths: Mutex<Vec<(usize, usize, i64)>>,
    /// (calltime, rettime) of the last return.
    times: Mutex<(u64, u64)>,
}

fn new_stats() -> &'static Stats {
    let s: &'static Stats = Box::leak(Box::default());
    s.set_ret.store(i64::MIN, SeqCst);
    s.refuse_arg.store(i64::MIN, SeqCst);
    s
}

fn stats(g: &Fgraph) -> &'static Stats {
    // SAFETY: (test) every user in this file points `private` at a leaked Stats.
    unsafe { &*(g.private as *const Stats) }
}

/// Each user's token: distinct per user, per function and per argument.
fn token(g: &Fgraph, func: usize, arg: u64) -> u64 {
    (g.private as u64).rotate_left(17) ^ func as u64 ^ arg.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// Reserves a block whose size depends on the user, fills it from the
/// token and the argument, checks it all at return.
extern "C" fn data_entry(ent: &GraphEnt, g: &Fgraph, fregs: &mut FtraceRegs) -> bool {
    let s = stats(g);
    s.entries.fetch_add(1, SeqCst);
    let arg = fregs.argument(0).unwrap();
    if arg as i64 == s.refuse_arg.load(SeqCst) {
        return false;
    }
    let size = 8 + (g.private >> 4) % 200;
    let Some(d) = ent.reserve_data(size) else {
        s.bad.fetch_add(1, SeqCst);
        return false;
    };
    if d.len() != size || d.iter().any(|b| *b != 0) {
        s.bad.fetch_add(1, SeqCst);
    }
    let t = token(g, ent.func, arg);
    d[..8].copy_from_slice(&t.to_ne_bytes());
    for (i, b) in d[8..].iter_mut().enumerate() {
        *b = (t as u8).wrapping_add(i as u8);
    }
    s.depths.lock().unwrap().push((ent.depth, ent.func, arg as i64));
    true
}

extern "C" fn data_ret(ret: &GraphRet, g: &Fgraph, fregs: &mut FtraceRegs) {
    let s = stats(g);
    s.rets.fetch_add(1, SeqCst);
    *s.times.lock().unwrap() = (ret.calltime, ret.rettime);
    let Some(d) = ret.retrieve_data() else {
        s.bad.fetch_add(1, SeqCst);
        return;
    };
    let t = u64::from_ne_bytes(d[..8].try_into().unwrap());
    // The argument register is clobbered by now: find it from the token
    // by checking the whole block instead.
    let ok = d.len() == 8 + (g.private >> 4) % 200 && d[8..].iter().enumerate().all(|(i, b)| *b == (t as u8).wrapping_add(i as u8));
    if !ok {
        s.bad.fetch_add(1, SeqCst);
    }
    // The token is the one of this call: find the entry with this depth.
    let depths = s.depths.lock().unwrap();
    if !depths.iter().any(|(dep, f, a)| *dep == ret.depth && *f == ret.func && token(g, *f, *a as u64) == t) {
        s.bad.fetch_add(1, SeqCst);
    }
    drop(depths);
    let v = s.set_ret.load(SeqCst);
    if v != i64::MIN {
        fregs.set_return_value(v as u64);
    }
}

fn user(filter: Filter) -> (Arc<Fgraph>, &'static Stats) {
    let s = new_stats();
    (Arc::new(Fgraph::new(data_entry, data_ret).filter(filter).private(s as *const Stats as usize)), s)
}

static OPS_CALLS: AtomicU64 = AtomicU64::new(0);

extern "C" fn ops_count(_ip: usize, _parent: usize, _op: &ftramp_runtime::ops::Ops, _f: &mut FtraceRegs) {
    OPS_CALLS.fetch_add(1, SeqCst);
}

/// fgraph and a plain ops on the same functions: the sites go through the
/// list function, which calls fgraph's entry inside its own dispatch guard.
/// That is one dispatch section, not a nested one at the same stack
/// pointer (which would be taken for a section left by a jump, and the
/// depth would end below 0).
#[test]
fn fgraph_and_an_ops_share_a_site_through_the_list_function() {
    let _l = lock();
    let f = || Filter::new().symbol("tracee_nested").symbol("tracee_two");
    let (a, sa) = user(f());
    let ops = Arc::new(ftramp_runtime::ops::Ops::new(ops_count).filter(f()));
    fgraph::register_fgraph(a.clone()).unwrap();
    ftramp_runtime::ftrace::ftrace().register(ops.clone()).unwrap();
    let left = ftramp_runtime::grace::sections_left_by_jump();
    let calls = OPS_CALLS.load(SeqCst);
    assert_eq!(tracee_nested(6), expect_nested(6));
    assert_eq!(tracee_two(3, 4), 3004);
    let depth = ftramp_runtime::grace::dispatch_depth();
    ftramp_runtime::ftrace::ftrace().unregister(&ops).unwrap();
    fgraph::unregister_fgraph(&a).unwrap();
    assert_eq!(depth, 0, "dispatch depth after the calls");
    assert_eq!(ftramp_runtime::grace::sections_left_by_jump(), left, "no section taken for one left by a jump");
    assert_eq!(OPS_CALLS.load(SeqCst) - calls, 8, "the ops saw every call");
    assert_eq!((sa.entries.load(SeqCst), sa.rets.load(SeqCst), sa.bad.load(SeqCst)), (8, 8, 0));
}

#[test]
fn two_users_keep_their_own_data() {
    let _l = lock();
    let f = || Filter::new().symbol("tracee_nested").symbol("tracee_two");
    let (a, sa) = user(f());
    let (b, sb) = user(f().symbol("tracee_args"));
    fgraph::register_fgraph(a.clone()).unwrap();
    fgraph::register_fgraph(b.clone()).unwrap();
    assert!(matches!(fgraph::register_fgraph(a.clone()), Err(FgraphError::AlreadyRegistered)));
    {
        assert_eq!(tracee_nested(6), expect_nested(6));
        assert_eq!(tracee_two(3, 4), 3004);
        assert_eq!(tracee_args(1, 2, 3, 4, 5, 6, 7, 8, 0.5, 0.25), expect_args([1, 2, 3, 4, 5, 6, 7, 8], 0.5, 0.25));
    }
    assert_eq!(fgraph::depth(), 0);
    fgraph::unregister_fgraph(&a).unwrap();
    fgraph::unregister_fgraph(&b).unwrap();
    assert!(matches!(fgraph::unregister_fgraph(&b), Err(FgraphError::NotRegistered)));
    tracee_two(1, 1);
    assert_eq!((sa.entries.load(SeqCst), sa.rets.load(SeqCst), sa.bad.load(SeqCst)), (8, 8, 0));
    assert_eq!((sb.entries.load(SeqCst), sb.rets.load(SeqCst), sb.bad.load(SeqCst)), (9, 9, 0));
}

/// `Fgraph::notrace` leaves functions out that the filter matches: for a
/// lone user (called without bitmaps: the engine must leave those sites
/// unpatched) and beside another user who traces them (the bitmaps decide).
#[test]
fn notrace_leaves_functions_out_alone_and_beside_another_user() {
    let _l = lock();
    let f = || Filter::new().symbol("tracee_nested").symbol("tracee_two");
    let s = new_stats();
    let a = Arc::new(Fgraph::new(data_entry, data_ret).filter(f()).notrace(Filter::new().glob("tracee_tw?").unwrap()).private(s as *const Stats as usize));
    fgraph::register_fgraph(a.clone()).unwrap();
    assert_eq!(tracee_nested(6), expect_nested(6));
    assert_eq!(tracee_two(3, 4), 3004);
    assert_eq!(s.entries.load(SeqCst), 7, "alone: tracee_two left out");
    let (b, sb) = user(f());
    fgraph::register_fgraph(b.clone()).unwrap();
    assert_eq!(tracee_nested(6), expect_nested(6));
    assert_eq!(tracee_two(3, 4), 3004);
    fgraph::unregister_fgraph(&a).unwrap();
    fgraph::unregister_fgraph(&b).unwrap();
    assert_eq!((s.entries.load(SeqCst), s.rets.load(SeqCst), s.bad.load(SeqCst)), (14, 14, 0));
    assert_eq!((sb.entries.load(SeqCst), sb.rets.load(SeqCst), sb.bad.load(SeqCst)), (8, 8, 0));
}

#[test]
fn depths_and_a_local_value_from_entry_to_exit() {
    let _l = lock();
    let (a, s) = user(Filter::new().symbol("tracee_nested"));
    fgraph::register_fgraph(a.clone()).unwrap();
    assert_eq!(tracee_nested(4), expect_nested(4));
    fgraph::unregister_fgraph(&a).unwrap();
    let d = s.depths.lock().unwrap();
    let seen: Vec<(usize, i64)> = d.iter().map(|(dep, _, n)| (*dep, *n)).collect();
    assert_eq!(seen, vec![(0, 4), (1, 3), (2, 2), (3, 1), (4, 0)]);
    assert_eq!((s.rets.load(SeqCst), s.bad.load(SeqCst)), (5, 0));
    // Timestamps were taken (this user does not skip them).
    let (c, r) = *s.times.lock().unwrap();
    assert!(c != 0 && c <= r, "calltime {c} rettime {r}");
}

#[test]
fn return_values_are_seen_and_changed_and_entry_can_refuse_the_return() {
    let _l = lock();
    let (a, s) = user(Filter::new().symbol("tracee_two"));
    s.set_ret.store(42, SeqCst);
    s.refuse_arg.store(5, SeqCst);
    fgraph::register_fgraph(a.clone()).unwrap();
    {
        assert_eq!(tracee_two(3, 4), 42, "changed by the ret callback");
        assert_eq!(tracee_two(5, 4), 5004, "entry refused: no ret callback");
    }
    fgraph::unregister_fgraph(&a).unwrap();
    assert_eq!((s.entries.load(SeqCst), s.rets.load(SeqCst), s.bad.load(SeqCst)), (2, 1, 0));
    assert_eq!(tracee_two(3, 4), 3004);
}

static SKIP_TIMES: Mutex<Vec<(u64, u64)>> = Mutex::new(Vec::new());

extern "C" fn plain_entry(_e: &GraphEnt, _g: &Fgraph, _f: &mut FtraceRegs) -> bool {
    true
}

extern "C" fn times_ret(r: &GraphRet, _g: &Fgraph, _f: &mut FtraceRegs) {
    SKIP_TIMES.lock().unwrap().push((r.calltime, r.rettime));
}

#[test]
fn skip_timestamp_reads_no_clock() {
    let _l = lock();
    SKIP_TIMES.lock().unwrap().clear();
    let u = Arc::new(Fgraph::new(plain_entry, times_ret).filter(Filter::new().symbol("tracee_two")).skip_timestamp(true));
    fgraph::register_fgraph(u.clone()).unwrap();
    assert_eq!(tracee_two(1, 2), 1002);
    fgraph::unregister_fgraph(&u).unwrap();
    assert_eq!(*SKIP_TIMES.lock().unwrap(), vec![(0, 0)]);
}

static UNWOUND: Mutex<Vec<usize>> = Mutex::new(Vec::new());

extern "C" fn unwind_entry(e: &GraphEnt, _g: &Fgraph, f: &mut FtraceRegs) -> bool {
    if f.argument(0) == Some(0) {
        let rth = fgraph::return_to_handler().unwrap();
        let mut idx = 0;
        let mut v = UNWOUND.lock().unwrap();
        for _ in 0..e.depth {
            v.push(fgraph::ret_addr_nth(&mut idx, rth));
        }
    }
    true
}

extern "C" fn nop_ret(_r: &GraphRet, _g: &Fgraph, _f: &mut FtraceRegs) {}

#[test]
fn hijacked_return_addresses_map_back_for_unwinders() {
    let _l = lock();
    UNWOUND.lock().unwrap().clear();
    let u = Arc::new(Fgraph::new(unwind_entry, nop_ret).filter(Filter::new().symbol("tracee_nested")));
    fgraph::register_fgraph(u.clone()).unwrap();
    assert_eq!(tracee_nested(3), expect_nested(3));
    fgraph::unregister_fgraph(&u).unwrap();
    let v = UNWOUND.lock().unwrap().clone();
    assert_eq!(v.len(), 3);
    let rth = fgraph::return_to_handler().unwrap();
    let f = tracee_nested as *const () as usize;
    // Innermost first: the two inner returns land in tracee_nested, the
    // outermost in this test.
    assert!(v.iter().all(|a| *a != rth && *a != 0));
    assert_eq!(v[0], v[1]);
    assert!(v[0] > f && v[0] < f + 256, "{:#x} not in tracee_nested at {f:#x}", v[0]);
    assert!(!(v[2] > f && v[2] < f + 256));
    // Not hijacked: unchanged.
    assert_eq!(fgraph::ret_addr(0x1234, 0), 0x1234);
}

static SMALL: [AtomicU64; 3] = [const { AtomicU64::new(0) }; 3]; // entries, rets, bad

/// Reserves 8 bytes holding the depth; the return checks them.
extern "C" fn small_entry(e: &GraphEnt, _g: &Fgraph, _f: &mut FtraceRegs) -> bool {
    SMALL[0].fetch_add(1, SeqCst);
    match e.reserve_data(8) {
        Some(d) => {
            d.copy_from_slice(&(e.depth as u64 ^ 0x5a5a).to_ne_bytes());
            true
        }
        None => {
            SMALL[2].fetch_add(1, SeqCst);
            false
        }
    }
}

extern "C" fn small_ret(r: &GraphRet, _g: &Fgraph, _f: &mut FtraceRegs) {
    SMALL[1].fetch_add(1, SeqCst);
    if r.retrieve_data().map(|d| u64::from_ne_bytes(d.try_into().unwrap())) != Some(r.depth as u64 ^ 0x5a5a) {
        SMALL[2].fetch_add(1, SeqCst);
    }
}

/// A user of [`small_entry`]/[`small_ret`] on `tracee_nested`, registered, its
/// counters cleared.
fn small_user() -> Arc<Fgraph> {
    SMALL.iter().for_each(|c| c.store(0, SeqCst));
    let u = Arc::new(Fgraph::new(small_entry, small_ret).filter(Filter::new().symbol("tracee_nested")));
    fgraph::register_fgraph(u.clone()).unwrap();
    u
}

/// A size whose byte count would overflow is clamped, and a thread then traces
/// with it (until the twenty-seventh session 2^61 words made a one-page mapping
/// that frames were written past: the thread died of a stack overflow).
#[test]
fn a_huge_shadow_stack_size_is_clamped() {
    let _l = lock();
    let u = small_user();
    fgraph::set_stack_words(1 << 61);
    assert_eq!(fgraph::stack_words(), fgraph::MAX_STACK_WORDS);
    let (r, misses) = std::thread::spawn(|| (tracee_nested(40), fgraph::thread_misses())).join().unwrap();
    fgraph::set_stack_words(0);
    fgraph::unregister_fgraph(&u).unwrap();
    assert_eq!(r, expect_nested(40));
    let [e, ret, bad] = [0, 1, 2].map(|i| SMALL[i].load(SeqCst));
    assert_eq!((e, ret, bad, misses), (41, 41, 0, 0));
}

#[test]
fn shadow_stack_overflow_counts_misses_and_results_stay_right() {
    let _l = lock();
    let u = small_user();
    let before = fgraph::misses();
    // A fresh thread gets a tiny stack: 64 words hold 9 frames of 7 words
    // (4 fixed, 8 bytes of data and its header, the frame header).
    fgraph::set_stack_words(64);
    let (r, misses, depth) = std::thread::spawn(|| {
        let r = tracee_nested(40);
        (r, fgraph::thread_misses(), fgraph::depth())
    })
    .join()
    .unwrap();
    fgraph::set_stack_words(0);
    fgraph::unregister_fgraph(&u).unwrap();
    assert_eq!(r, expect_nested(40));
    assert_eq!(depth, 0);
    assert_eq!(fgraph::thread_misses(), 0, "another thread's misses are its own");
    assert!(fgraph::misses() >= before + misses);
    let [e, ret, bad] = [0, 1, 2].map(|i| SMALL[i].load(SeqCst));
    assert_eq!((e, ret, bad, misses), (9, 9, 0, 41 - 9));
}

#[test]
fn threads_have_their_own_shadow_stacks() {
    let _l = lock();
    let (a, s) = user(Filter::new().symbol("tracee_nested"));
    fgraph::register_fgraph(a.clone()).unwrap();
    let threads: Vec<_> = (0..4)
        .map(|t| {
            std::thread::spawn(move || {
                for i in 0..200 {
                    let n = (t + i) % 12;
                    assert_eq!(tracee_nested(n), expect_nested(n));
                }
                fgraph::depth()
            })
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().unwrap(), 0);
    }
    // Created lazily, freed at thread exit: six threads with a stack each
    // are alive at the barrier, gone after the joins.  (Other test
    // threads exiting meanwhile only lower the counts.)
    let barrier = Arc::new(std::sync::Barrier::new(7));
    let more: Vec<_> = (0..6)
        .map(|_| {
            let b = barrier.clone();
            std::thread::spawn(move || {
                let r = tracee_nested(4);
                b.wait();
                b.wait();
                r
            })
        })
        .collect();
    barrier.wait();
    let alive = fgraph::live_stacks();
    barrier.wait();
    for t in more {
        assert_eq!(t.join().unwrap(), expect_nested(4));
    }
    let after = fgraph::live_stacks();
    assert!(alive >= 6 && after + 6 <= alive, "live shadow stacks: {alive} with the threads, {after} after they exited");
    fgraph::unregister_fgraph(&a).unwrap();
    assert_eq!(s.bad.load(SeqCst), 0);
    assert_eq!(s.entries.load(SeqCst), s.rets.load(SeqCst));
    assert!(s.entries.load(SeqCst) > 800);
}

static JMP_RETS: AtomicUsize = AtomicUsize::new(0);

extern "C" fn count_ret(_r: &GraphRet, _g: &Fgraph, _f: &mut FtraceRegs) {
    JMP_RETS.fetch_add(1, SeqCst);
}

#[test]
fn longjmp_out_of_traced_calls_resynchronises() {
    let _l = lock();
    let untraced = (tracee_jmp_driver(5), tracee_jmp_loop(50, 3));
    assert_eq!(untraced, (1405, 50 * 1403));
    JMP_RETS.store(0, SeqCst);
    let u = Arc::new(Fgraph::new(plain_entry, count_ret).filter(Filter::new().glob("tracee_jmp_*").unwrap()).skip_timestamp(true));
    fgraph::register_fgraph(u.clone()).unwrap();
    let stale = fgraph::stale_frames();
    let misses = fgraph::misses();
    let traced = (tracee_jmp_driver(5), tracee_jmp_loop(50, 3));
    let depth = fgraph::depth();
    // Many iterations on a thread with a small stack: a leak would overflow.
    fgraph::set_stack_words(128);
    let (r, d, m) = std::thread::spawn(|| (tracee_jmp_loop(500, 4), fgraph::depth(), fgraph::thread_misses())).join().unwrap();
    fgraph::set_stack_words(0);
    fgraph::unregister_fgraph(&u).unwrap();
    assert_eq!(traced, untraced);
    assert_eq!((r, d, m), (500 * 1404, 0, 0));
    assert_eq!(depth, 0, "no frame leaks");
    assert_eq!(fgraph::misses(), misses);
    // Driver(5): deep(5..0) = 6 frames dropped; loop(50, 3): 4 per iteration.
    assert!(fgraph::stale_frames() - stale >= 6 + 50 * 4);
    // Returns seen: driver + add (1 + 1), loop + 50 * (driver + add), and
    // 500 * 2 + 1 in the thread.
    assert_eq!(JMP_RETS.load(SeqCst), 2 + 1 + 100 + 1001);
}

#[test]
fn at_most_sixteen_users() {
    let _l = lock();
    let users: Vec<_> = (0..fgraph::MAX_USERS).map(|_| user(Filter::new().symbol("tracee_two"))).collect();
    for (u, _) in &users {
        fgraph::register_fgraph(u.clone()).unwrap();
    }
    let (extra, _) = user(Filter::new().symbol("tracee_two"));
    assert!(matches!(fgraph::register_fgraph(extra), Err(FgraphError::Full)));
    assert_eq!(tracee_two(2, 3), 2003);
    for (u, s) in &users {
        fgraph::unregister_fgraph(u).unwrap();
        assert_eq!((s.entries.load(SeqCst), s.rets.load(SeqCst), s.bad.load(SeqCst)), (1, 1, 0));
    }
}

static RECURSE_CALLS: AtomicU64 = AtomicU64::new(0);

/// Calls a traced function from inside the callback.
extern "C" fn recursing_entry(_e: &GraphEnt, _g: &Fgraph, _f: &mut FtraceRegs) -> bool {
    RECURSE_CALLS.fetch_add(1, SeqCst);
    assert_eq!(tracee_two(7, 8), 7008);
    true
}

#[test]
fn a_callback_calling_traced_functions_does_not_recurse() {
    let _l = lock();
    RECURSE_CALLS.store(0, SeqCst);
    let u = Arc::new(Fgraph::new(recursing_entry, nop_ret).filter(Filter::new().symbol("tracee_two")));
    fgraph::register_fgraph(u.clone()).unwrap();
    let before = fgraph::recursion_misses();
    assert_eq!(tracee_two(1, 2), 1002);
    fgraph::unregister_fgraph(&u).unwrap();
    assert_eq!(RECURSE_CALLS.load(SeqCst), 1);
    assert_eq!(fgraph::recursion_misses() - before, 1);
}

static SIG_BAD: AtomicU64 = AtomicU64::new(0);
static SIG_RUNS: AtomicU64 = AtomicU64::new(0);

extern "C" fn on_alarm(_sig: i32) {
    SIG_RUNS.fetch_add(1, SeqCst);
    if tracee_nested(3) != expect_nested(3) {
        SIG_BAD.fetch_add(1, SeqCst);
    }
}

#[test]
fn signal_handlers_calling_traced_functions_nest_on_the_shadow_stack() {
    let _l = lock();
    SMALL.iter().for_each(|c| c.store(0, SeqCst));
    let u = Arc::new(Fgraph::new(small_entry, small_ret).filter(Filter::new().symbol("tracee_nested")).skip_timestamp(true));
    fgraph::register_fgraph(u.clone()).unwrap();
    prof_timer(Some(on_alarm), 200);
    let mut wrong = 0;
    let start = std::time::Instant::now();
    while SIG_RUNS.load(SeqCst) < 200 && start.elapsed() < std::time::Duration::from_secs(20) {
        for n in 0..10 {
            if tracee_nested(n) != expect_nested(n) {
                wrong += 1;
            }
        }
    }
    prof_timer(None, 0);
    let depth = fgraph::depth();
    fgraph::unregister_fgraph(&u).unwrap();
    assert_eq!((wrong, SIG_BAD.load(SeqCst), depth), (0, 0, 0));
    assert!(SIG_RUNS.load(SeqCst) > 0);
    // Every frame pushed was popped with its own data.
    assert_eq!(SMALL[2].load(SeqCst), 0);
    assert_eq!(SMALL[0].load(SeqCst), SMALL[1].load(SeqCst));
}

static FIRST_CALLS: AtomicU64 = AtomicU64::new(0);

extern "C" fn first_call_in_handler(_sig: i32) {
    if tracee_nested(3) == expect_nested(3) {
        FIRST_CALLS.fetch_add(1, SeqCst);
    }
}

/// A thread's first traced call sets up its shadow stack and its release
/// at thread exit.  Here that call is a signal handler's, on threads
/// interrupted while they hold their malloc arena's lock (blocks above the
/// tcache sizes and below the mmap threshold take it in malloc and free):
/// any allocation on that path deadlocks the thread.
#[test]
fn a_threads_first_traced_call_from_a_handler_that_interrupted_malloc() {
    use std::os::unix::thread::JoinHandleExt;
    let _l = lock();
    SMALL.iter().for_each(|c| c.store(0, SeqCst));
    FIRST_CALLS.store(0, SeqCst);
    let u = Arc::new(Fgraph::new(small_entry, small_ret).filter(Filter::new().symbol("tracee_nested")).skip_timestamp(true));
    fgraph::register_fgraph(u.clone()).unwrap();
    set_signal_handler(libc::SIGUSR2, Some(first_call_in_handler));
    const THREADS: u64 = 40;
    for i in 0..THREADS {
        let (tx, rx) = std::sync::mpsc::channel();
        let h = std::thread::spawn(move || {
            tx.send(()).unwrap();
            while FIRST_CALLS.load(SeqCst) <= i {
                let b = std::hint::black_box(vec![1u8; 48 << 10]);
                drop(b);
            }
        });
        rx.recv().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(3));
        // SAFETY: the thread is alive until FIRST_CALLS passes `i`, which
        // only this signal's handler does.
        assert_eq!(unsafe { libc::pthread_kill(h.as_pthread_t(), libc::SIGUSR2) }, 0);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while FIRST_CALLS.load(SeqCst) <= i && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        if FIRST_CALLS.load(SeqCst) <= i {
            // Deadlocked on its arena's lock, which other threads' mallocs
            // (a panic's message) may need too: report without allocating
            // and end the process.
            let msg = b"a_threads_first_traced_call_from_a_handler_that_interrupted_malloc: FAILED: a thread's first traced call, made by a signal handler that interrupted malloc, never returned (deadlock)\n";
            // SAFETY: write(2) of a static buffer, then _exit: no locks taken.
            unsafe {
                libc::write(2, msg.as_ptr().cast(), msg.len());
                libc::_exit(101);
            }
        }
        h.join().unwrap();
    }
    fgraph::unregister_fgraph(&u).unwrap();
    assert_eq!(FIRST_CALLS.load(SeqCst), THREADS);
    assert_eq!((SMALL[2].load(SeqCst), fgraph::depth()), (0, 0));
    assert_eq!(SMALL[0].load(SeqCst), SMALL[1].load(SeqCst));
    assert!(SMALL[0].load(SeqCst) >= THREADS, "every handler's call was traced");
}

// SAFETY: tests/c/tracee_fork.c's functions with their C signatures.
// `tracee_fork_call` takes a function pointer of the right type, so it is
// safe; `tracee_exec_call` takes C strings the caller must provide.
unsafe extern "C" {
    safe fn tracee_fork_call(after: extern "C" fn(i64) -> i64, n: i64) -> i64;
    fn tracee_exec_call(path: *const libc::c_char, argv: *const *const libc::c_char, n: i64) -> i64;
}

/// Runs in both processes inside the traced `tracee_fork_call`: traced
/// calls nested below it.  1 when all went right (3 in the child).
static FORK_PID: AtomicI64 = AtomicI64::new(0);

extern "C" fn after_fork(pid: i64) -> i64 {
    FORK_PID.store(pid, SeqCst);
    let mut ok = fgraph::depth() == 1;
    for n in 0..8 {
        ok &= tracee_nested(n) == expect_nested(n);
    }
    ok &= fgraph::depth() == 1;
    ok as i64 + if pid == 0 { 2 } else { 0 }
}

/// What either process must have seen after `tracee_fork_call(_, 5)`: a
/// bit per failed check (0: all right).  No allocation, no lock: the child
/// of a multi-threaded process may only do async-signal-safe things.
fn fork_checks(r: i64, want: i64) -> i32 {
    let [e, ret, bad] = [0, 1, 2].map(|i| SMALL[i].load(SeqCst));
    // tracee_fork_call + tracee_nested(0..8): 1 + (1 + 2 + ... + 8) calls.
    let calls = 1 + 36;
    (r != want) as i32 | ((fgraph::depth() != 0) as i32) << 1 | ((e != calls) as i32) << 2 | ((ret != calls) as i32) << 3 | ((bad != 0) as i32) << 4
}

#[test]
fn fork_inside_a_traced_call_keeps_both_processes_tracing() {
    let _l = lock();
    SMALL.iter().for_each(|c| c.store(0, SeqCst));
    let u = Arc::new(Fgraph::new(small_entry, small_ret).filter(Filter::new().symbol("tracee_fork_call").symbol("tracee_nested")).skip_timestamp(true));
    fgraph::register_fgraph(u.clone()).unwrap();
    let r = tracee_fork_call(after_fork, 5);
    if FORK_PID.load(SeqCst) == 0 {
        // The child (after_fork added 2): report by exit status, never
        // return into the test harness.
        let code = fork_checks(r, 35);
        // SAFETY: plain process calls; the child runs only async-signal-safe code before _exit.
        unsafe { libc::_exit(code) };
    }
    let parent = fork_checks(r, 15);
    let child = FORK_PID.load(SeqCst) as libc::pid_t;
    let mut status = 0;
    // SAFETY: plain process calls; the child runs only async-signal-safe code before _exit.
    let pid = unsafe { libc::waitpid(child, &mut status, 0) };
    // The parent goes on tracing after the fork.
    let more = tracee_nested(4);
    let depth = fgraph::depth();
    fgraph::unregister_fgraph(&u).unwrap();
    assert!(child > 0 && pid == child, "fork/wait: {}", std::io::Error::last_os_error());
    assert!(libc::WIFEXITED(status), "child status {status:#x}");
    assert_eq!(libc::WEXITSTATUS(status), 0, "child failed checks (bits: result, depth, entries, returns, data)");
    assert_eq!(parent, 0, "parent failed checks (bits: result, depth, entries, returns, data)");
    assert_eq!((more, depth), (expect_nested(4), 0));
    assert_eq!((SMALL[0].load(SeqCst), SMALL[1].load(SeqCst), SMALL[2].load(SeqCst)), (37 + 5, 37 + 5, 0));
}

#[test]
fn exec_from_inside_a_traced_call() {
    use std::ffi::CString;
    let _l = lock();
    SMALL.iter().for_each(|c| c.store(0, SeqCst));
    let u = Arc::new(Fgraph::new(small_entry, small_ret).filter(Filter::new().symbol("tracee_exec_call").symbol("tracee_nested")).skip_timestamp(true));
    fgraph::register_fgraph(u.clone()).unwrap();
    // A failed exec returns through the hijacked return.
    let missing = CString::new("/nonexistent/ftramp-exec").unwrap();
    let argv = [missing.as_ptr(), std::ptr::null()];
    // SAFETY: NUL-terminated C strings and a NULL-terminated argv, alive for the call.
    assert_eq!(unsafe { tracee_exec_call(missing.as_ptr(), argv.as_ptr(), 4) }, 1004);
    assert_eq!(fgraph::depth(), 0);
    // Successful execs in children: the new program runs untouched and its
    // exit status comes back.
    for (args, want) in [(&["/bin/true"][..], 0), (&["/bin/sh", "-c", "exit 7"], 7)] {
        let c: Vec<CString> = args.iter().map(|a| CString::new(*a).unwrap()).collect();
        let mut argv: Vec<*const libc::c_char> = c.iter().map(|a| a.as_ptr()).collect();
        argv.push(std::ptr::null());
        // SAFETY: NUL-terminated C strings and a NULL-terminated argv, alive for the call.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY: NUL-terminated C strings and a NULL-terminated argv, alive for the call.
            unsafe {
                tracee_exec_call(argv[0], argv.as_ptr(), 0);
                libc::_exit(99);
            }
        }
        let mut status = 0;
        // SAFETY: plain process calls; the child runs only async-signal-safe code before _exit.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status), "{args:?}: status {status:#x}");
        assert_eq!(libc::WEXITSTATUS(status), want, "{args:?}");
    }
    // This process goes on tracing.
    let r = tracee_nested(3);
    let depth = fgraph::depth();
    fgraph::unregister_fgraph(&u).unwrap();
    assert_eq!((r, depth), (expect_nested(3), 0));
    // The failed exec and tracee_nested(3..0); the children's calls were theirs.
    assert_eq!((SMALL[0].load(SeqCst), SMALL[1].load(SeqCst), SMALL[2].load(SeqCst)), (1 + 4, 1 + 4, 0));
}

/// Counts calls in the user's task variable, half through the record's
/// own pointer (no thread-local lookup), half through the thread-local:
/// both reach the same variable.
extern "C" fn task_var_entry(e: &GraphEnt, g: &Fgraph, f: &mut FtraceRegs) -> bool {
    if f.argument(0).unwrap_or(0) & 1 == 0 {
        let c = e.task_var(g).expect("registered");
        c.set(c.get() + 1);
    } else {
        g.with_task_var(|v| *v += 1);
    }
    false
}

#[test]
fn task_variables_are_per_thread_and_per_user() {
    let _l = lock();
    let mk = || Arc::new(Fgraph::new(task_var_entry, nop_ret).filter(Filter::new().symbol("tracee_two")).skip_timestamp(true));
    let (a, b) = (mk(), mk());
    assert_eq!(a.task_var(), None, "not registered");
    fgraph::register_fgraph(a.clone()).unwrap();
    fgraph::register_fgraph(b.clone()).unwrap();
    assert_eq!(a.task_var(), Some(0));
    b.set_task_var(100);
    for i in 0..5 {
        tracee_two(i, 2);
    }
    assert_eq!((a.task_var(), b.task_var()), (Some(5), Some(105)));
    let threads: Vec<_> = (1..=3u64)
        .map(|t| {
            let (a, b) = (a.clone(), b.clone());
            std::thread::spawn(move || {
                for i in 0..t * 10 {
                    tracee_two(i as i64, 2);
                }
                (t, a.task_var(), b.task_var())
            })
        })
        .collect();
    for t in threads {
        let (n, va, vb) = t.join().unwrap();
        assert_eq!((va, vb), (Some(n * 10), Some(n * 10)), "thread {n}");
    }
    assert_eq!((a.task_var(), b.task_var()), (Some(5), Some(105)), "other threads leave ours alone");
    // A user registered again starts from 0 on every thread.
    fgraph::unregister_fgraph(&a).unwrap();
    assert_eq!(a.task_var(), None);
    fgraph::register_fgraph(a.clone()).unwrap();
    assert_eq!(a.task_var(), Some(0));
    fgraph::unregister_fgraph(&a).unwrap();
    fgraph::unregister_fgraph(&b).unwrap();
}

extern "C" fn count_two_entry(e: &GraphEnt, g: &Fgraph, _f: &mut FtraceRegs) -> bool {
    let s = stats(g);
    if e.func == tracee_two as *const () as usize {
        s.entries.fetch_add(1, SeqCst);
    } else {
        s.bad.fetch_add(1, SeqCst);
    }
    true
}

extern "C" fn count_two_ret(_r: &GraphRet, g: &Fgraph, _f: &mut FtraceRegs) {
    stats(g).rets.fetch_add(1, SeqCst);
}

#[test]
fn filter_and_user_changes_leave_no_untraced_window() {
    let _l = lock();
    let s = new_stats();
    let two = || Filter::new().symbol("tracee_two");
    let u = Arc::new(Fgraph::new(count_two_entry, count_two_ret).filter(two()).skip_timestamp(true).private(s as *const Stats as usize));
    fgraph::register_fgraph(u.clone()).unwrap();
    let caller = Callers::start(1, |_, _| assert_eq!(tracee_two(1, 2), 1002));
    for i in 0..10 {
        // The user's own filter grows and shrinks...
        fgraph::set_fgraph_filter(&u, two().symbol("tracee_nested")).unwrap();
        fgraph::set_fgraph_filter(&u, two()).unwrap();
        // ...and other users come and go (the internal ops is replaced).
        let (other, _) = user(Filter::new().symbol(if i % 2 == 0 { "tracee_nested" } else { "tracee_two" }));
        fgraph::register_fgraph(other.clone()).unwrap();
        fgraph::unregister_fgraph(&other).unwrap();
    }
    let calls = caller.stop();
    fgraph::unregister_fgraph(&u).unwrap();
    assert!(calls > 0);
    assert_eq!(s.bad.load(SeqCst), 0);
    assert_eq!(s.entries.load(SeqCst), calls, "every call traced across 40 changes");
    assert_eq!(s.rets.load(SeqCst), calls);
}

extern "C" fn ops_nop(_ip: usize, _parent: usize, _op: &ftramp_runtime::ops::Ops, _f: &mut FtraceRegs) {}

/// fgraph beside plain ops while both change under four calling threads:
/// two users (with different filters: the per-site bitmaps are in use)
/// and an ops trace `tracee_two` for the whole run (the site is on the
/// list function throughout, which calls fgraph's entry), while other ops
/// (on it, or on every `tracee_*` site) and other fgraph users come and
/// go.  Every call is traced exactly once by each whole-run user and the
/// ops, and every result is right.
#[test]
fn fgraph_beside_ops_while_both_come_and_go() {
    use ftramp_runtime::ftrace::ftrace;
    use ftramp_runtime::ops::Ops;
    let _l = lock();
    let s = new_stats();
    let two = || Filter::new().symbol("tracee_two");
    let u = Arc::new(Fgraph::new(count_two_entry, count_two_ret).filter(two()).skip_timestamp(true).private(s as *const Stats as usize));
    fgraph::register_fgraph(u.clone()).unwrap();
    // A second whole-run user with another filter: the per-site bitmaps
    // are in use, and replaced as users come and go.
    let s2 = new_stats();
    let u2 = Arc::new(Fgraph::new(count_two_entry, count_two_ret).filter(two().symbol("tracee_nested")).private(s2 as *const Stats as usize));
    fgraph::register_fgraph(u2.clone()).unwrap();
    let ops = Arc::new(Ops::new(ops_count).filter(two()));
    ftrace().register(ops.clone()).unwrap();
    let ops_before = OPS_CALLS.load(SeqCst);
    let callers = Callers::start(4, |t, n| assert_eq!(tracee_two(t, n as i64 % 1000), t * 1000 + n as i64 % 1000));
    let rounds = if cfg!(target_arch = "x86_64") { 200 } else { 50 };
    for i in 0..rounds {
        let f = if i % 2 == 0 { two() } else { Filter::new().glob("tracee_*").unwrap() };
        let churn = Arc::new(Ops::new(ops_nop).filter(f));
        ftrace().register(churn.clone()).unwrap();
        if i % 10 == 0 {
            let (other, _) = user(two().symbol("tracee_nested"));
            fgraph::register_fgraph(other.clone()).unwrap();
            fgraph::unregister_fgraph(&other).unwrap();
        }
        ftrace().unregister(&churn).unwrap();
    }
    let calls = callers.stop();
    ftrace().unregister(&ops).unwrap();
    fgraph::unregister_fgraph(&u).unwrap();
    fgraph::unregister_fgraph(&u2).unwrap();
    assert!(calls > 0);
    assert_eq!(OPS_CALLS.load(SeqCst) - ops_before, calls, "the whole-run ops saw every call");
    for (i, s) in [s, s2].iter().enumerate() {
        assert_eq!((s.entries.load(SeqCst), s.rets.load(SeqCst), s.bad.load(SeqCst)), (calls, calls, 0), "whole-run user {i} saw every call and return");
    }
    assert_eq!(ftrace().quarantined(), 0);
}

extern "C" fn count_entry(_e: &GraphEnt, g: &Fgraph, _f: &mut FtraceRegs) -> bool {
    stats(g).entries.fetch_add(1, SeqCst);
    true
}

extern "C" fn count_ret_stats(_r: &GraphRet, g: &Fgraph, _f: &mut FtraceRegs) {
    stats(g).rets.fetch_add(1, SeqCst);
}

/// Users with globs see the functions of a library loaded after they
/// registered (the module watcher patches it; fgraph refreshes its
/// per-site bitmaps), one user and several.
#[cfg(ftramp_sites)]
#[test]
fn users_with_globs_trace_libraries_loaded_later() {
    let _l = lock();
    let mk = |f: Filter| {
        let s = new_stats();
        (Arc::new(Fgraph::new(count_entry, count_ret_stats).filter(f).skip_timestamp(true).private(s as *const Stats as usize)), s)
    };
    for users in [1, 2] {
        let all: Vec<_> = (0..users).map(|i| mk(Filter::new().glob("sites_dl_*").unwrap().symbol(if i == 0 { "tracee_two" } else { "tracee_nested" }))).collect();
        for (u, _) in &all {
            fgraph::register_fgraph(u.clone()).unwrap();
        }
        let lib = Lib::open(env!("FTRAMP_SITES_DL_SO"));
        let f = lib.func("sites_dl_tracee");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let before: Vec<u64> = all.iter().map(|(_, s)| s.entries.load(SeqCst)).collect();
            assert_eq!(f(5), 38);
            if all.iter().zip(&before).all(|((_, s), b)| s.entries.load(SeqCst) > *b) {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{users} user(s): the new library was never traced for all of them");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        for (u, s) in &all {
            fgraph::unregister_fgraph(u).unwrap();
            assert_eq!(s.entries.load(SeqCst), s.rets.load(SeqCst));
        }
        lib.close();
    }
}

/// Three threads register and unregister at once — plain ops on every
/// `tracee_*` site, fgraph users, fprobes (which share one fgraph user) —
/// 60 times each, while two threads call traced functions: no deadlock
/// between the engine's, fgraph's and fprobe's locks, no crash, every
/// result right, every fgraph user's data intact, nothing quarantined.
#[test]
fn registrations_from_several_threads_at_once() {
    use ftramp_runtime::ftrace::ftrace;
    use ftramp_runtime::ops::Ops;
    let _l = lock();
    let callers = Callers::start(2, |t, n| {
        assert_eq!(tracee_two(t, n as i64 % 1000), t * 1000 + n as i64 % 1000);
        assert_eq!(tracee_nested(4), expect_nested(4));
    });
    let regs: Vec<_> = (0..3)
        .map(|k| {
            std::thread::spawn(move || {
                for i in 0..60 {
                    match (k + i) % 3 {
                        0 => {
                            let o = Arc::new(Ops::new(ops_nop).filter(Filter::new().glob("tracee_*").unwrap()));
                            ftrace().register(o.clone()).unwrap();
                            ftrace().unregister(&o).unwrap();
                        }
                        1 => {
                            let (u, s) = user(Filter::new().symbol("tracee_two").symbol("tracee_nested"));
                            fgraph::register_fgraph(u.clone()).unwrap();
                            fgraph::unregister_fgraph(&u).unwrap();
                            assert_eq!(s.bad.load(SeqCst), 0);
                        }
                        _ => {
                            let fp = Arc::new(ftramp_runtime::fprobe::Fprobe::new().entry_handler(|_, _, _, _, _| ftramp_runtime::fprobe::EntryAction::Continue).exit_handler(|_, _, _, _, _| {}));
                            ftramp_runtime::fprobe::register_fprobe_syms(&fp, &["tracee_two"]).unwrap();
                            ftramp_runtime::fprobe::unregister_fprobe(&fp).unwrap();
                        }
                    }
                }
            })
        })
        .collect();
    for r in regs {
        r.join().unwrap();
    }
    let n = callers.stop();
    assert!(n > 0);
    assert_eq!(ftrace().quarantined(), 0);
}
