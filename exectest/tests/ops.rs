//! Ops on real patched functions, through the runtime's engine: filters,
//! the dispatch chosen per site, the recursion guard, IPMODIFY, and a
//! stress test registering and unregistering while threads call.
//!
//! The engine is process-wide, so the tests take a lock and leave no ops
//! registered.  Live patching exists for x86_64 and aarch64 (issue #4's
//! scope); elsewhere the engine refuses to patch, so these tests are
//! compiled only there.
#![cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]

use ftramp_codegen::Tier;
use ftramp_exectest::*;
use ftramp_runtime::ftrace::{ftrace, OpsError, SiteDispatch};
use ftramp_runtime::ops::{Filter, Ops, OpsFlags};
use ftramp_runtime::FtraceRegs;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard};

static LOCK: Mutex<()> = Mutex::new(());

fn lock() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

macro_rules! addr {
    ($f:expr) => {
        $f as *const () as usize
    };
}

/// A counter per ops, found through `Ops::private`.
fn counter(op: &Ops) -> &AtomicU64 {
    // SAFETY: (test) every ops in this file points `private` at a leaked
    // AtomicU64.
    unsafe { &*(op.private as *const AtomicU64) }
}

fn new_counter() -> usize {
    Box::leak(Box::new(AtomicU64::new(0))) as *const AtomicU64 as usize
}

extern "C" fn count(_ip: usize, _parent: usize, op: &Ops, _fregs: &mut FtraceRegs) {
    counter(op).fetch_add(1, SeqCst);
}

fn count_of(ops: &Arc<Ops>) -> u64 {
    counter(ops).load(SeqCst)
}

fn counting(filter: Filter) -> Arc<Ops> {
    Arc::new(Ops::new(count).filter(filter).private(new_counter()))
}

/// The engine's site of function `f` and what it does now.
fn site_and_dispatch(f: usize) -> (ftramp_runtime::Site, SiteDispatch) {
    ftrace()
        .site_dispatch()
        .into_iter()
        .find(|(s, _)| s.addr - s.offset_in_symbol == f || s.addr == f)
        .unwrap_or_else(|| panic!("no site for {f:#x}"))
}

fn dispatch_of(f: usize) -> SiteDispatch {
    site_and_dispatch(f).1
}

/// The address of function `f`'s patch site.
#[cfg(target_arch = "x86_64")]
fn site_addr_of(f: usize) -> usize {
    site_and_dispatch(f).0.addr
}

#[test]
fn a_symbol_filter_traces_only_that_function_with_a_direct_call() {
    let _l = lock();
    let ops = counting(Filter::new().symbol("tracee_two"));
    assert_eq!(ftrace().register(ops.clone()).unwrap(), 1);
    assert_eq!(dispatch_of(addr!(tracee_two)), SiteDispatch::Direct { tier: Tier::Args });
    assert_eq!(dispatch_of(addr!(tracee_fp)), SiteDispatch::Nop);
    {
        assert_eq!(tracee_two(3, 4), 3004);
        assert_eq!(tracee_fp(2.0, 3.0, 1), 7.0);
        assert_eq!(tracee_two(5, 6), 5006);
    }
    assert_eq!(count_of(&ops), 2);
    ftrace().unregister(&ops).unwrap();
    assert_eq!(dispatch_of(addr!(tracee_two)), SiteDispatch::Nop);
    tracee_two(1, 1);
    assert_eq!(count_of(&ops), 2, "never entered after unregister");
    assert!(matches!(ftrace().unregister(&ops), Err(OpsError::NotRegistered(_))));
}

#[test]
fn globs_addresses_and_notrace() {
    let _l = lock();
    let ops = counting(Filter::new().glob("tracee_args*").unwrap().addr(addr!(tracee_fp)));
    let n = ftrace().register(ops.clone()).unwrap();
    assert_eq!(n, 3, "tracee_args, tracee_args_alt, tracee_fp");
    {
        tracee_args(1, 2, 3, 4, 5, 6, 7, 8, 0.0, 0.0);
        tracee_args_alt(1, 2, 3, 4, 5, 6, 7, 8, 0.0, 0.0);
        tracee_fp(1.0, 1.0, 1);
        tracee_two(1, 2);
    }
    assert_eq!(count_of(&ops), 3);
    ftrace().unregister(&ops).unwrap();

    let ops = Arc::new(
        Ops::new(count)
            .filter(Filter::new().glob("tracee_*").unwrap())
            .notrace(Filter::new().symbol("tracee_nested").glob("tracee_args*").unwrap())
            .private(new_counter()),
    );
    ftrace().register(ops.clone()).unwrap();
    assert_eq!(dispatch_of(addr!(tracee_nested)), SiteDispatch::Nop);
    assert_eq!(dispatch_of(addr!(tracee_args)), SiteDispatch::Nop);
    {
        tracee_nested(3);
        tracee_two(1, 2);
    }
    assert_eq!(count_of(&ops), 1);
    ftrace().unregister(&ops).unwrap();
}

#[test]
fn bad_filters_are_errors() {
    let _l = lock();
    // An unclosed `[` is a plain character (as in ftrace; since the twenty-eighth
    // session): a name that matches nothing here, not a bad glob.
    let unclosed = counting(Filter::new().glob("tracee_[").unwrap());
    assert_eq!(ftrace().register(unclosed).unwrap_err().to_string(), "no patchable site matches the filter `tracee_[`");
    assert!(Filter::new().parse("0xzz").is_err());
    let ops = counting(Filter::new().symbol("no_such_function_anywhere").glob("nor_this_*").unwrap());
    let e = ftrace().register(ops).unwrap_err();
    assert!(matches!(e, OpsError::NoSites(_)));
    // The message names the filter (until the twenty-seventh session: "the ops
    // matches no patchable site", for an fgraph user too).
    assert_eq!(e.to_string(), "no patchable site matches the filter `no_such_function_anywhere`, `nor_this_*`");
    // Flags that do not exist are refused, as the C API does.
    let odd = Arc::new(Ops::new(count).flags(OpsFlags(1 << 20)));
    let e = ftrace().register(odd).unwrap_err();
    assert_eq!(e.to_string(), "unknown ops flags 0x100000");
}

#[test]
fn shared_sites_use_the_list_and_distinct_sites_stay_direct() {
    let _l = lock();
    let a = counting(Filter::new().symbol("tracee_two").symbol("tracee_fp"));
    let b = counting(Filter::new().symbol("tracee_two").symbol("tracee_nested"));
    ftrace().register(a.clone()).unwrap();
    ftrace().register(b.clone()).unwrap();
    assert_eq!(dispatch_of(addr!(tracee_two)), SiteDispatch::List { tier: Tier::Args });
    assert_eq!(dispatch_of(addr!(tracee_fp)), SiteDispatch::Direct { tier: Tier::Args });
    assert_eq!(dispatch_of(addr!(tracee_nested)), SiteDispatch::Direct { tier: Tier::Args });
    {
        for i in 0..10 {
            assert_eq!(tracee_two(i, 1), i * 1000 + 1);
        }
        tracee_fp(1.0, 2.0, 0);
        assert_eq!(tracee_nested(2), expect_nested(2));
    }
    assert_eq!(count_of(&a), 11);
    assert_eq!(count_of(&b), 13);
    ftrace().unregister(&a).unwrap();
    assert_eq!(dispatch_of(addr!(tracee_two)), SiteDispatch::Direct { tier: Tier::Args }, "back to direct");
    tracee_two(0, 0);
    assert_eq!((count_of(&a), count_of(&b)), (11, 14));
    ftrace().unregister(&b).unwrap();
}

static SEEN_CALLEE_SAVED: AtomicU64 = AtomicU64::new(0);

extern "C" fn read_regs(_ip: usize, _parent: usize, _op: &Ops, fregs: &mut FtraceRegs) {
    let spec = ftramp_runtime::host_spec();
    SEEN_CALLEE_SAVED.store(fregs.register(&spec.raw.abi.callee_saved[0]).unwrap_or(0), SeqCst);
}

#[test]
fn save_regs_selects_the_regs_tier() {
    let _l = lock();
    let ops = Arc::new(Ops::new(read_regs).flags(OpsFlags::SAVE_REGS).filter(Filter::new().symbol("tracee_two")));
    ftrace().register(ops.clone()).unwrap();
    assert_eq!(dispatch_of(addr!(tracee_two)), SiteDispatch::Direct { tier: Tier::Regs });
    let mut bad = u64::MAX;
    // SAFETY: the address is a C tracee of (long, long) -> long, as arch_call_checked requires.
    let r = unsafe { arch_call_checked(addr!(tracee_two), 7, 8, &mut bad) };
    assert_eq!((r, bad), (7008, 0));
    let seen = SEEN_CALLEE_SAVED.load(SeqCst);
    let want = match ftramp_runtime::HOST_ARCH {
        "x86_64" => 0x1111111111111101,
        "aarch64" => 0x1919191919191919,
        "riscv64" => 0x0808080808080808,
        "s390x" => 0x0707070707070707,
        _ => 0x1414141414141414,
    };
    assert_eq!(seen, want, "pt_regs holds the caller's callee-saved register");
    // A second, args-only ops on the same site keeps the regs tier.
    let other = counting(Filter::new().symbol("tracee_two"));
    ftrace().register(other.clone()).unwrap();
    assert_eq!(dispatch_of(addr!(tracee_two)), SiteDispatch::List { tier: Tier::Regs });
    ftrace().unregister(&ops).unwrap();
    assert_eq!(dispatch_of(addr!(tracee_two)), SiteDispatch::Direct { tier: Tier::Args });
    ftrace().unregister(&other).unwrap();
}

extern "C" fn reenter(_ip: usize, _parent: usize, op: &Ops, _fregs: &mut FtraceRegs) {
    counter(op).fetch_add(1, SeqCst);
    // A traced function called from the callback.
    tracee_two(0, 0);
}

#[test]
fn the_recursion_guard_stops_a_callback_from_reentering_itself() {
    let _l = lock();
    let ops = Arc::new(Ops::new(reenter).flags(OpsFlags::RECURSION).filter(Filter::new().symbol("tracee_two")).private(new_counter()));
    ftrace().register(ops.clone()).unwrap();
    {
        assert_eq!(tracee_two(1, 2), 1002);
        assert_eq!(tracee_two(3, 4), 3004);
    }
    assert_eq!(count_of(&ops), 2, "outer calls only");
    assert_eq!(ops.recursion_misses(), 2, "one refused inner call each");
    ftrace().unregister(&ops).unwrap();
}

// SAFETY: tests/c/harness.c's jumping callback and the call that arms it
// (harness_call_jumping calls `f` once, under sigsetjmp).
unsafe extern "C" {
    safe static harness_jump_calls: u64;
    fn harness_jumping_cb(ip: usize, parent: usize, op: usize, fregs: usize);
    fn harness_call_jumping(f: extern "C" fn(i64, i64) -> i64, a: i64, b: i64) -> i32;
}

/// A `RECURSION` callback that `siglongjmp`s out of dispatch leaves its
/// guard set; the next traced call finds the section left by the jump and
/// releases the guard with the rest of what the section held, so the
/// callback runs again (without the release it would be refused as a
/// recursion forever).
#[test]
fn a_recursion_guard_left_by_a_jump_is_released() {
    let _l = lock();
    // SAFETY: the C callback has the ops callback's ABI (four words).
    let cb = unsafe { std::mem::transmute::<unsafe extern "C" fn(usize, usize, usize, usize), extern "C" fn(usize, usize, &Ops, &mut FtraceRegs)>(harness_jumping_cb) };
    let ops = Arc::new(Ops::new(cb).flags(OpsFlags::RECURSION).filter(Filter::new().symbol("tracee_two")));
    ftrace().register(ops.clone()).unwrap();
    // SAFETY: (test) a C counter this thread alone writes, read volatile
    // because C code updates it.
    let calls = || unsafe { std::ptr::read_volatile(&raw const harness_jump_calls) };
    let before = calls();
    // SAFETY: tracee_two is a plain C function of two integers.
    assert_eq!(unsafe { harness_call_jumping(tracee_two, 1, 2) }, 1, "the callback jumped out");
    assert_eq!(calls() - before, 1);
    let left = ftramp_runtime::grace::sections_left_by_jump();
    for i in 0..3 {
        assert_eq!(tracee_two(i, 1), i * 1000 + 1);
    }
    assert_eq!(ftramp_runtime::grace::sections_left_by_jump() - left, 1, "the left section was found");
    assert_eq!((calls() - before, ops.recursion_misses()), (4, 0), "the callback ran at each call after the jump");
    assert_eq!(ftramp_runtime::grace::dispatch_depth(), 0);
    ftrace().unregister(&ops).unwrap();
}

extern "C" fn redirect(_ip: usize, _parent: usize, _op: &Ops, fregs: &mut FtraceRegs) {
    fregs.set_instruction_pointer(addr!(tracee_args_alt));
}

#[test]
fn ipmodify_redirects_and_a_second_one_is_refused() {
    let _l = lock();
    let ops = Arc::new(Ops::new(redirect).flags(OpsFlags::IPMODIFY).filter(Filter::new().symbol("tracee_args")));
    ftrace().register(ops.clone()).unwrap();
    let r = tracee_args(1, 2, 3, 4, 5, 6, 7, 8, 1.0, 2.0);
    assert_eq!(r, -(36) - 3 - 1000, "continued in tracee_args_alt");
    let second = Arc::new(Ops::new(redirect).flags(OpsFlags::IPMODIFY).filter(Filter::new().glob("tracee_arg*").unwrap()));
    match ftrace().register(second) {
        Err(OpsError::IpModifyConflict { site }) => assert!(site.contains("tracee_args"), "{site}"),
        other => panic!("expected a conflict, got {other:?}"),
    }
    // A plain ops may share the site.
    let plain = counting(Filter::new().symbol("tracee_args"));
    ftrace().register(plain.clone()).unwrap();
    tracee_args(1, 2, 3, 4, 5, 6, 7, 8, 1.0, 2.0);
    assert_eq!(count_of(&plain), 1);
    ftrace().unregister(&plain).unwrap();
    ftrace().unregister(&ops).unwrap();
    let r = tracee_args(1, 2, 3, 4, 5, 6, 7, 8, 1.0, 2.0);
    assert_eq!(r, expect_args([1, 2, 3, 4, 5, 6, 7, 8], 1.0, 2.0));
}

/// Registers and unregisters a churning ops on `tracee_two` (and on every
/// `tracee_*` site every other round) while four threads call it, with
/// `permanent` counting ops on it throughout; each must see every call.
fn stress(permanent: usize) {
    let _l = lock();
    let whole: Vec<Arc<Ops>> = (0..permanent).map(|_| counting(Filter::new().symbol("tracee_two"))).collect();
    for w in &whole {
        ftrace().register(w.clone()).unwrap();
    }
    let callers = Callers::start(4, |t, n| assert_eq!(tracee_two(t, n as i64), t * 1000 + n as i64));
    let rounds = if cfg!(target_arch = "x86_64") { 400 } else { 100 };
    for i in 0..rounds {
        let f = if i % 2 == 0 { Filter::new().symbol("tracee_two") } else { Filter::new().glob("tracee_*").unwrap() };
        let churn = counting(f);
        ftrace().register(churn.clone()).unwrap();
        ftrace().unregister(&churn).unwrap();
    }
    let calls = callers.stop();
    for w in &whole {
        ftrace().unregister(w).unwrap();
        assert_eq!(count_of(w), calls, "a whole-run ops saw every call");
    }
    assert_eq!(ftrace().quarantined(), 0);
}

/// One permanent ops: the site goes from direct to list dispatch and back
/// with each churning ops.
#[test]
fn stress_register_unregister_while_threads_call() {
    stress(1);
}

/// Two permanent ops: the site stays on the list function, whose site
/// table each register and unregister replaces while the threads walk it
/// (registering used to free the replaced table at once: the walkers read
/// freed memory and crashed).
#[test]
fn stress_register_unregister_while_threads_walk_the_list() {
    stress(2);
}

/// The discovery tests' shared library (built with the arch's site flags).
#[cfg(ftramp_sites)]
#[test]
fn ops_follow_dlopen_and_dlclose() {
    let _l = lock();
    let ops = counting(Filter::new().glob("sites_dl_*").unwrap());
    for round in 0..3 {
        let lib = Lib::open(env!("FTRAMP_SITES_DL_SO"));
        let f = lib.func("sites_dl_tracee");
        if round == 0 {
            ftrace().register(ops.clone()).unwrap();
        } else {
            ftrace().refresh().unwrap();
        }
        let before = count_of(&ops);
        assert_eq!(f(5), 38);
        assert_eq!(count_of(&ops), before + 1, "round {round}: the new module's site is traced");
        lib.close();
        ftrace().refresh().unwrap();
    }
    // Sites of the closed library are gone; nothing else is traced by it.
    assert!(ftrace().site_dispatch().iter().all(|(s, _)| !s.symbol.as_deref().unwrap_or("").starts_with("sites_dl_")));
    ftrace().unregister(&ops).unwrap();
}

/// Without `refresh()`: the module watcher picks the library up by itself.
#[cfg(ftramp_sites)]
#[test]
fn dlopened_libraries_are_traced_without_a_refresh() {
    let _l = lock();
    let keep = counting(Filter::new().symbol("tracee_two"));
    ftrace().register(keep.clone()).unwrap();
    let ops = counting(Filter::new().glob("sites_dl_*").unwrap().symbol("tracee_two"));
    ftrace().register(ops.clone()).unwrap();
    let lib = Lib::open(env!("FTRAMP_SITES_DL_SO"));
    let f = lib.func("sites_dl_tracee");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let before = count_of(&ops);
        assert_eq!(f(1), 10);
        if count_of(&ops) == before + 1 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the new library was never traced");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    lib.close();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while ftrace().site_dispatch().iter().any(|(s, _)| s.symbol.as_deref().unwrap_or("").starts_with("sites_dl_")) {
        assert!(std::time::Instant::now() < deadline, "the closed library's sites were never dropped");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    ftrace().unregister(&ops).unwrap();
    ftrace().unregister(&keep).unwrap();
}

/// x86_64 stub entry (README "Stub entry"): the engine's sites `jmp` to a
/// stub of their own that pushes the address after the site and jumps to
/// the site's trampoline; a site that changes trampoline gets a new stub,
/// and stubs no site uses are unmapped by the grace period of the next
/// unregister.
#[cfg(target_arch = "x86_64")]
#[test]
fn x86_64_sites_jump_to_their_own_stubs_which_are_freed_when_unused() {
    use ftramp_runtime::patch::read_text;
    let _l = lock();
    let rel = |b: &[u8], at: usize| at.wrapping_add_signed(i32::from_le_bytes(b[..4].try_into().unwrap()) as isize);
    // The stub a site jumps to, checked: lea r11, [site+5]; push r11; jmp trampoline.
    let stub_of = |site: usize| -> (usize, usize) {
        let s = read_text(site, 5);
        assert_eq!(s[0], 0xe9, "site {site:#x}: {s:02x?}");
        let stub = rel(&s[1..], site + 5);
        let b = read_text(stub, 16);
        assert_eq!(&b[..3], &[0x4c, 0x8d, 0x1d], "lea r11, [rip+..]: {b:02x?}");
        assert_eq!(rel(&b[3..], stub + 7), site + 5, "the stub pushes the address after the site");
        assert_eq!(&b[7..10], &[0x41, 0x53, 0xe9], "push r11; jmp: {b:02x?}");
        (stub, rel(&b[10..], stub + 14))
    };
    let mapped = |addr: usize| {
        std::fs::read_to_string("/proc/self/maps").unwrap().lines().any(|l| {
            let (a, b) = l.split_whitespace().next().unwrap().split_once('-').unwrap();
            (usize::from_str_radix(a, 16).unwrap()..usize::from_str_radix(b, 16).unwrap()).contains(&addr)
        })
    };
    let a = counting(Filter::new().symbol("tracee_two"));
    let b = counting(Filter::new().symbol("tracee_two"));
    ftrace().register(a.clone()).unwrap();
    let site = site_addr_of(addr!(tracee_two));
    let (stub1, direct) = stub_of(site);
    assert_eq!(tracee_two(1, 2), 1002);
    ftrace().register(b.clone()).unwrap();
    let (stub2, list) = stub_of(site);
    assert_ne!(stub2, stub1, "a new stub for the list trampoline");
    assert_ne!(list, direct);
    assert_eq!(tracee_two(3, 4), 3004);
    assert_eq!((count_of(&a), count_of(&b)), (2, 1));
    ftrace().unregister(&b).unwrap();
    let (stub3, back) = stub_of(site);
    assert!(stub3 != stub1 && stub3 != stub2);
    assert_eq!(back, direct, "the same direct trampoline again");
    assert!(!mapped(stub1) && !mapped(stub2), "stubs no site uses are unmapped after the grace period");
    assert!(mapped(stub3));
    assert_eq!(tracee_two(5, 6), 5006);
    assert_eq!(count_of(&a), 3);
    ftrace().unregister(&a).unwrap();
    assert_ne!(read_text(site, 1)[0], 0xe9, "the NOP is back");
    assert!(!mapped(stub3));
    assert_eq!(tracee_two(7, 8), 7008);
    assert_eq!(count_of(&a), 3);
}

/// `FTRAMP_SITE_ENTRY=call` makes the engine's x86_64 sites `call` their
/// trampoline (no stubs); run in a child process of this test binary,
/// since the choice is made once per process.
#[cfg(target_arch = "x86_64")]
#[test]
fn ftramp_site_entry_call_makes_call_sites() {
    const NAME: &str = "ftramp_site_entry_call_makes_call_sites";
    let forced = std::env::var_os("FTRAMP_SITE_ENTRY").is_some_and(|v| v == "call");
    if !forced {
        run_tests_in_child(&[NAME], &[("FTRAMP_SITE_ENTRY", "call")]);
        return;
    }
    let _l = lock();
    let ops = counting(Filter::new().symbol("tracee_two"));
    ftrace().register(ops.clone()).unwrap();
    let site = site_addr_of(addr!(tracee_two));
    let bytes = ftramp_runtime::patch::read_text(site, 5);
    assert_eq!(bytes[0], 0xe8, "a call site: {bytes:02x?}");
    assert_eq!(tracee_two(2, 3), 2003);
    assert_eq!(count_of(&ops), 1);
    ftrace().unregister(&ops).unwrap();
}
