//! fprobe on real patched functions, modelled on the kernel's
//! lib/test_fprobe.c: the entry writes a token into the entry data that the
//! exit checks together with the return value; an entry skipping the exit;
//! the entry_data_size limit; filters by glob/notfilter, address and
//! symbol; two fprobes on one function; and repeated register/unregister
//! while other threads call the probed function.
//!
//! fprobe is process-wide: the tests take a lock and leave nothing
//! registered.
#![cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]

use ftramp_exectest::*;
use ftramp_runtime::fprobe::{self, EntryAction, Fprobe, FprobeError, ENTRY_DATA_MAX};
use ftramp_runtime::FtraceRegs;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard};

static LOCK: Mutex<()> = Mutex::new(());

fn lock() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Default)]
struct Stats {
    entries: AtomicU64,
    exits: AtomicU64,
    bad: AtomicU64,
    /// Entry skips the exit when argument 0 equals this.
    skip_arg: AtomicI64,
    /// Set while unregistered: any handler call then is a failure.
    off: AtomicBool,
    /// Calls seen while `off`.
    late: AtomicU64,
}

fn new_stats() -> &'static Stats {
    let s: &'static Stats = Box::leak(Box::default());
    s.skip_arg.store(i64::MIN, SeqCst);
    s
}

fn stats(fp: &Fprobe) -> &'static Stats {
    // SAFETY: (test) every fprobe here points `private` at a leaked Stats.
    unsafe { &*(fp.private as *const Stats) }
}

fn token(fp: &Fprobe, ip: usize, a: u64, b: u64) -> u64 {
    (fp.private as u64).rotate_left(13) ^ ip as u64 ^ a.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ b.rotate_left(31)
}

/// For tracee_two(a, b): saves a, b and a token; fills the rest.
fn two_entry(fp: &Fprobe, ip: usize, _ret_ip: usize, fregs: &mut FtraceRegs, data: &mut [u8]) -> EntryAction {
    let s = stats(fp);
    if s.off.load(SeqCst) {
        s.late.fetch_add(1, SeqCst);
    }
    s.entries.fetch_add(1, SeqCst);
    let (a, b) = (fregs.argument(0).unwrap(), fregs.argument(1).unwrap());
    if data.iter().any(|b| *b != 0) {
        s.bad.fetch_add(1, SeqCst);
    }
    if a as i64 == s.skip_arg.load(SeqCst) {
        return EntryAction::SkipExit;
    }
    if data.len() >= 24 {
        data[0..8].copy_from_slice(&a.to_ne_bytes());
        data[8..16].copy_from_slice(&b.to_ne_bytes());
        data[16..24].copy_from_slice(&token(fp, ip, a, b).to_ne_bytes());
        for (i, x) in data[24..].iter_mut().enumerate() {
            *x = i as u8 ^ 0x5a;
        }
    }
    EntryAction::Continue
}

fn two_exit(fp: &Fprobe, ip: usize, _ret_ip: usize, fregs: &mut FtraceRegs, data: &mut [u8]) {
    let s = stats(fp);
    if s.off.load(SeqCst) {
        s.late.fetch_add(1, SeqCst);
    }
    s.exits.fetch_add(1, SeqCst);
    let w = |i: usize| u64::from_ne_bytes(data[i * 8..i * 8 + 8].try_into().unwrap());
    let (a, b, t) = (w(0), w(1), w(2));
    let ok = t == token(fp, ip, a, b)
        && fregs.return_value() == (a as i64 * 1000 + b as i64) as u64
        && data[24..].iter().enumerate().all(|(i, x)| *x == i as u8 ^ 0x5a);
    if !ok {
        s.bad.fetch_add(1, SeqCst);
    }
}

fn probe(size: usize) -> (Arc<Fprobe>, &'static Stats) {
    let s = new_stats();
    let fp = Fprobe::new().entry_handler(two_entry).exit_handler(two_exit).entry_data_size(size).private(s as *const Stats as usize);
    (Arc::new(fp), s)
}

fn counts(s: &Stats) -> (u64, u64, u64) {
    (s.entries.load(SeqCst), s.exits.load(SeqCst), s.bad.load(SeqCst))
}

#[test]
fn entry_token_is_checked_at_exit_with_the_return_value() {
    let _l = lock();
    let (fp, s) = probe(24);
    fprobe::register_fprobe_syms(&fp, &["tracee_two"]).unwrap();
    assert!(fp.is_registered());
    assert!(matches!(fprobe::register_fprobe_syms(&fp, &["tracee_two"]), Err(FprobeError::AlreadyRegistered)));
    for i in 0..10 {
        assert_eq!(tracee_two(i, 7), i * 1000 + 7);
    }
    fprobe::unregister_fprobe(&fp).unwrap();
    assert!(!fp.is_registered());
    assert!(matches!(fprobe::unregister_fprobe(&fp), Err(FprobeError::NotRegistered)));
    tracee_two(1, 1);
    assert_eq!(counts(s), (10, 10, 0));
    assert_eq!((fp.nmissed(), fprobe::registered()), (0, 0));
}

#[test]
fn an_entry_skipping_the_exit_gets_no_exit() {
    let _l = lock();
    let (fp, s) = probe(24);
    s.skip_arg.store(5, SeqCst);
    fprobe::register_fprobe(&fp, "tracee_two", None).unwrap();
    {
        assert_eq!(tracee_two(3, 4), 3004);
        assert_eq!(tracee_two(5, 4), 5004);
        assert_eq!(tracee_two(6, 4), 6004);
    }
    fprobe::unregister_fprobe(&fp).unwrap();
    assert_eq!(counts(s), (3, 2, 0));
}

#[test]
fn entry_data_size_is_limited_to_120_bytes() {
    let _l = lock();
    let (big, _) = probe(ENTRY_DATA_MAX + 1);
    let e = fprobe::register_fprobe_syms(&big, &["tracee_two"]).unwrap_err();
    assert!(matches!(e, FprobeError::EntryDataTooLarge { size: 121 }), "{e:?}");
    assert!(e.to_string().contains("121") && e.to_string().contains("120"), "{e}");
    assert!(!big.is_registered());
    let (fp, s) = probe(ENTRY_DATA_MAX);
    fprobe::register_fprobe_syms(&fp, &["tracee_two"]).unwrap();
    assert_eq!(tracee_two(2, 9), 2009);
    fprobe::unregister_fprobe(&fp).unwrap();
    assert_eq!(counts(s), (1, 1, 0));
    let e = fprobe::register_fprobe_syms(&Arc::new(Fprobe::new()), &["tracee_two"]).unwrap_err();
    assert!(matches!(e, FprobeError::NoHandler), "{e:?}");
}

static SEEN: Mutex<Vec<(usize, u64)>> = Mutex::new(Vec::new());

fn record_entry(_fp: &Fprobe, ip: usize, _r: usize, fregs: &mut FtraceRegs, _d: &mut [u8]) -> EntryAction {
    SEEN.lock().unwrap().push((ip, fregs.argument(0).unwrap()));
    EntryAction::Continue
}

fn seen_take() -> Vec<u64> {
    std::mem::take(&mut *SEEN.lock().unwrap()).into_iter().map(|(_, a)| a).collect()
}

#[test]
fn filters_by_glob_notfilter_address_and_symbol() {
    let _l = lock();
    SEEN.lock().unwrap().clear();
    let fp = Arc::new(Fprobe::new().entry_handler(record_entry));
    let call_all = || {
        tracee_args(1, 2, 3, 4, 5, 6, 7, 8, 0.5, 0.25);
        tracee_args_alt(2, 2, 3, 4, 5, 6, 7, 8, 0.5, 0.25);
        tracee_two(3, 1);
        tracee_fp(0.5, 0.5, 4);
        // (Also keeps tracee.c's site table in the link: the linker keeps
        // it only when tracee_nested's section is kept.)
        assert_eq!(tracee_nested(2), expect_nested(2));
    };
    // Glob minus notfilter: tracee_args only.
    fprobe::register_fprobe(&fp, "tracee_args*", Some("tracee_args_alt")).unwrap();
    assert_eq!(fp.ips().len(), 1);
    call_all();
    fprobe::unregister_fprobe(&fp).unwrap();
    assert_eq!(seen_take(), vec![1]);
    // Both globs, spaces and commas.
    fprobe::register_fprobe(&fp, "tracee_args* tracee_t?o,tracee_nothing", None).unwrap();
    call_all();
    fprobe::unregister_fprobe(&fp).unwrap();
    assert_eq!(seen_take(), vec![1, 2, 3]);
    // By address (the function's address).
    fprobe::register_fprobe_ips(&fp, &[tracee_two as *const () as usize]).unwrap();
    call_all();
    fprobe::unregister_fprobe(&fp).unwrap();
    assert_eq!(seen_take(), vec![3]);
    // By symbol; the ip handed over is the site registered.
    fprobe::register_fprobe_syms(&fp, &["tracee_args_alt"]).unwrap();
    let ips = fp.ips();
    call_all();
    fprobe::unregister_fprobe(&fp).unwrap();
    let seen: Vec<(usize, u64)> = std::mem::take(&mut *SEEN.lock().unwrap());
    assert_eq!(seen, vec![(ips[0], 2)]);
    // Nothing matching is refused.
    let e = fprobe::register_fprobe(&fp, "no_such_function_*", None).unwrap_err();
    assert!(matches!(e, FprobeError::NoMatch(_)), "{e:?}");
    assert!(matches!(fprobe::register_fprobe_syms(&fp, &["no_such_function"]), Err(FprobeError::NoMatch(_))));
    assert!(!fp.is_registered());
}

fn data_len_entry(fp: &Fprobe, _ip: usize, _r: usize, _f: &mut FtraceRegs, data: &mut [u8]) -> EntryAction {
    let s = stats(fp);
    s.entries.fetch_add(1, SeqCst);
    if data.len() != 40 || data.iter().any(|b| *b != 0) {
        s.bad.fetch_add(1, SeqCst);
    }
    data.fill(0xa5);
    EntryAction::Continue
}

/// No exit handler: the entry data is the entry's scratch space, of the
/// size asked for and zeroed on every call (the handler dirties it).
#[test]
fn entry_only_data_is_zeroed_and_the_size_asked_for() {
    let _l = lock();
    let s = new_stats();
    let fp = Arc::new(Fprobe::new().entry_handler(data_len_entry).entry_data_size(40).private(s as *const Stats as usize));
    fprobe::register_fprobe_syms(&fp, &["tracee_two"]).unwrap();
    for i in 0..3 {
        tracee_two(i, 1);
    }
    fprobe::unregister_fprobe(&fp).unwrap();
    assert_eq!(counts(s), (3, 0, 0));
    assert_eq!(fp.nmissed(), 0);
}

#[test]
fn two_fprobes_on_one_function_are_both_called() {
    let _l = lock();
    let (a, sa) = probe(24);
    let (b, sb) = probe(100);
    fprobe::register_fprobe_syms(&a, &["tracee_two"]).unwrap();
    fprobe::register_fprobe(&b, "tracee_t*", None).unwrap();
    sb.skip_arg.store(4, SeqCst);
    for i in 0..6 {
        assert_eq!(tracee_two(i, i), i * 1001);
    }
    fprobe::unregister_fprobe(&a).unwrap();
    tracee_two(7, 7);
    fprobe::unregister_fprobe(&b).unwrap();
    assert_eq!(counts(sa), (6, 6, 0));
    assert_eq!(counts(sb), (7, 6, 0));
}

#[test]
fn register_unregister_while_threads_call() {
    let _l = lock();
    let (fp, s) = probe(64);
    let callers = Callers::start(4, |t, n| {
        let (a, b) = (t * 100_000 + n as i64 % 1000, n as i64 % 977);
        assert_eq!(tracee_two(a, b), a * 1000 + b);
    });
    let cycles = if cfg!(target_arch = "x86_64") { 40 } else { 15 };
    let mut total = (0, 0);
    for _ in 0..cycles {
        s.off.store(false, SeqCst);
        fprobe::register_fprobe_syms(&fp, &["tracee_two"]).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(3));
        fprobe::unregister_fprobe(&fp).unwrap();
        s.off.store(true, SeqCst);
        let (e, x, bad) = counts(s);
        assert!(x <= e, "exits {x} > entries {e} in one registration");
        assert_eq!(bad, 0);
        total = (total.0 + e, total.1 + x);
        s.entries.store(0, SeqCst);
        s.exits.store(0, SeqCst);
        std::thread::sleep(std::time::Duration::from_millis(1));
        assert_eq!(s.late.load(SeqCst), 0, "a handler ran after unregister returned");
    }
    let calls = callers.stop();
    assert!(total.0 > 0 && total.1 > 0 && total.0 <= calls, "{total:?} of {calls} calls");
    assert_eq!((s.late.load(SeqCst), s.bad.load(SeqCst), fprobe::registered()), (0, 0, 0));
}


/// For tracee_nested(n): n at entry, checked against the return value.
fn nested_entry(fp: &Fprobe, _ip: usize, _r: usize, fregs: &mut FtraceRegs, data: &mut [u8]) -> EntryAction {
    let s = stats(fp);
    if s.off.load(SeqCst) {
        s.late.fetch_add(1, SeqCst);
    }
    s.entries.fetch_add(1, SeqCst);
    data[..8].copy_from_slice(&fregs.argument(0).unwrap().to_ne_bytes());
    EntryAction::Continue
}

fn nested_exit(fp: &Fprobe, _ip: usize, _r: usize, fregs: &mut FtraceRegs, data: &mut [u8]) {
    let s = stats(fp);
    if s.off.load(SeqCst) {
        s.late.fetch_add(1, SeqCst);
    }
    s.exits.fetch_add(1, SeqCst);
    let n = i64::from_ne_bytes(data[..8].try_into().unwrap());
    if fregs.return_value() as i64 != expect_nested(n) {
        s.bad.fetch_add(1, SeqCst);
    }
}

fn nested_probe(size: usize) -> (Arc<Fprobe>, &'static Stats) {
    let s = new_stats();
    let fp = Fprobe::new().entry_handler(nested_entry).exit_handler(nested_exit).entry_data_size(size).private(s as *const Stats as usize);
    (Arc::new(fp), s)
}

thread_local! {
    /// The arguments of this thread's probed calls in flight, innermost last.
    static IN_FLIGHT: std::cell::RefCell<Vec<i64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// For tracee_nested(n) without entry data: the exit pairs itself with the
/// innermost entry still in flight (kept by the test) and checks the
/// return value against its argument; `skip_arg` skips an exit.
fn nodata_entry(fp: &Fprobe, _ip: usize, _r: usize, fregs: &mut FtraceRegs, data: &mut [u8]) -> EntryAction {
    let s = stats(fp);
    s.entries.fetch_add(1, SeqCst);
    if !data.is_empty() {
        s.bad.fetch_add(1, SeqCst);
    }
    let n = fregs.argument(0).unwrap() as i64;
    if n == s.skip_arg.load(SeqCst) {
        return EntryAction::SkipExit;
    }
    IN_FLIGHT.with(|v| v.borrow_mut().push(n));
    EntryAction::Continue
}

fn nodata_exit(fp: &Fprobe, _ip: usize, _r: usize, fregs: &mut FtraceRegs, data: &mut [u8]) {
    let s = stats(fp);
    s.exits.fetch_add(1, SeqCst);
    let n = IN_FLIGHT.with(|v| v.borrow_mut().pop());
    if !data.is_empty() || n.map(expect_nested) != Some(fregs.return_value() as i64) {
        s.bad.fetch_add(1, SeqCst);
    }
}

fn nodata_probe() -> (Arc<Fprobe>, &'static Stats) {
    let s = new_stats();
    let fp = Fprobe::new().entry_handler(nodata_entry).exit_handler(nodata_exit).private(s as *const Stats as usize);
    (Arc::new(fp), s)
}

#[test]
fn a_probe_without_entry_data_pairs_each_exit_with_its_entry() {
    let _l = lock();
    let (fp, s) = nodata_probe();
    s.skip_arg.store(3, SeqCst);
    fprobe::register_fprobe_syms(&fp, &["tracee_nested"]).unwrap();
    assert_eq!(tracee_nested(6), expect_nested(6));
    fprobe::unregister_fprobe(&fp).unwrap();
    // tracee_nested(6) .. (0): 7 entries, the exit of (3) skipped.
    assert_eq!(counts(s), (7, 6, 0));
    assert_eq!((fp.nmissed(), IN_FLIGHT.with(|v| v.borrow().len())), (0, 0));
}

/// Deep recursion keeps many calls in flight when unregister runs: none
/// of them gets an exit afterwards.
#[test]
fn unregister_with_many_calls_in_flight() {
    let _l = lock();
    let (fp, s) = nested_probe(8);
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut n = 0;
                while !stop.load(SeqCst) {
                    let d = 10 + (n + t) % 20;
                    assert_eq!(tracee_nested(d), expect_nested(d));
                    n += 1;
                }
            })
        })
        .collect();
    let cycles = if cfg!(target_arch = "x86_64") { 30 } else { 10 };
    for _ in 0..cycles {
        s.off.store(false, SeqCst);
        fprobe::register_fprobe_syms(&fp, &["tracee_nested"]).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(2));
        fprobe::unregister_fprobe(&fp).unwrap();
        s.off.store(true, SeqCst);
        let (e, x, bad) = counts(s);
        assert!(x <= e, "exits {x} > entries {e} in one registration");
        assert_eq!(bad, 0);
        s.entries.store(0, SeqCst);
        s.exits.store(0, SeqCst);
        std::thread::sleep(std::time::Duration::from_millis(1));
        assert_eq!(s.late.load(SeqCst), 0, "a handler ran after unregister returned");
    }
    stop.store(true, SeqCst);
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!((s.late.load(SeqCst), s.bad.load(SeqCst)), (0, 0));
}

/// Entry data that does not fit on a thread's shadow stack counts a miss
/// and leaves that call unprobed; the program still runs untouched.
#[test]
fn entry_data_not_fitting_counts_nmissed() {
    let _l = lock();
    // (fprobe's block, nmissed) of a 40-deep recursion on a thread whose
    // shadow stack has `words` words.
    let run = |(fp, s): (Arc<Fprobe>, &'static Stats), words: usize| {
        fprobe::register_fprobe_syms(&fp, &["tracee_nested"]).unwrap();
        // A small shadow stack for the thread created next.
        ftramp_runtime::fgraph::set_stack_words(words);
        let t = std::thread::spawn(|| tracee_nested(40));
        let r = t.join();
        ftramp_runtime::fgraph::set_stack_words(0);
        fprobe::unregister_fprobe(&fp).unwrap();
        assert_eq!(r.unwrap(), expect_nested(40));
        let (e, x, bad) = counts(s);
        assert!((1..41).contains(&e) && x == e && bad == 0, "{words} words: entries {e} exits {x} bad {bad}");
        fp.nmissed()
    };
    assert!(run(nested_probe(ENTRY_DATA_MAX), 200) >= 1);
    // Without entry data the block is the header alone: whether the last
    // frame that fits leaves room for it depends on the stack's size, so
    // several sizes, at least one of which must miss in fprobe rather
    // than in fgraph.
    let missed: Vec<u64> = (200..216).map(|w| run(nodata_probe(), w)).collect();
    assert!(missed.iter().any(|m| *m >= 1), "{missed:?}");
}
