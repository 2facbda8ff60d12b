//! Live patching of real C patch sites while other threads run them
//! (`ftramp_runtime::patch::Patcher`).  Runs natively on x86_64 and,
//! cross-built, under qemu-user on aarch64.  qemu-user keeps instruction
//! fetch coherent by itself, so there the tests check the write order and
//! the evacuation, not the cache maintenance.
//!
//! Every test holds `LOCK`: they patch the same functions and count the
//! same callbacks.  Arches without a live patching protocol
//! (`patch::LIVE_PATCHING`) compile this file to nothing.
#![cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]

use ftramp_codegen::{arch, image::Image, DataWord, Dispatch, Tier, Variant};
use ftramp_exectest::*;
use ftramp_runtime::patch::{self, Patcher, SiteChange};
use ftramp_runtime::{host_spec, FtraceRegs, JitImage, RuntimeError};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Mutex, MutexGuard};

extern "C" {
    static tracee_many: [unsafe extern "C" fn(i64) -> i64; 320];
    static tracee_many_k: [i64; 320];
    static tracee_many_count: u64;
}

/// A function's address.
macro_rules! addr {
    ($f:expr) => {
        $f as *const () as usize
    };
}

static LOCK: Mutex<()> = Mutex::new(());
static HITS_A: AtomicUsize = AtomicUsize::new(0);
static HITS_B: AtomicUsize = AtomicUsize::new(0);
/// The ip every callback must see (0: any).
static EXPECT_IP: AtomicUsize = AtomicUsize::new(0);
/// An ip that was not `EXPECT_IP`.
static WRONG_IP: AtomicUsize = AtomicUsize::new(0);
static IPS: Mutex<Vec<usize>> = Mutex::new(Vec::new());

fn lock() -> MutexGuard<'static, ()> {
    let g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    HITS_A.store(0, SeqCst);
    HITS_B.store(0, SeqCst);
    EXPECT_IP.store(0, SeqCst);
    WRONG_IP.store(0, SeqCst);
    IPS.lock().unwrap().clear();
    g
}

fn check_ip(ip: usize) {
    let want = EXPECT_IP.load(SeqCst);
    if want != 0 && ip != want {
        WRONG_IP.store(ip, SeqCst);
    }
}

extern "C" fn count_a(ip: usize, _parent: usize, _op: usize, _fregs: *mut FtraceRegs) {
    HITS_A.fetch_add(1, SeqCst);
    check_ip(ip);
}

extern "C" fn count_b(ip: usize, _parent: usize, _op: usize, _fregs: *mut FtraceRegs) {
    HITS_B.fetch_add(1, SeqCst);
    check_ip(ip);
}

extern "C" fn record(ip: usize, _parent: usize, _op: usize, _fregs: *mut FtraceRegs) {
    IPS.lock().unwrap().push(ip);
}

const ARGS_DIRECT: Variant = Variant::Entry { tier: Tier::Args, dispatch: Dispatch::Direct };

/// An `args-direct` trampoline calling `callback`, placed in reach of the
/// tracees.
fn trampoline(callback: extern "C" fn(usize, usize, usize, *mut FtraceRegs)) -> JitImage {
    let spec = host_spec();
    let image = Image::generate(spec, &[ARGS_DIRECT]).unwrap();
    let jit = JitImage::install(image, Some(addr!(tracee_two)), spec.raw.site.reach).unwrap();
    assert!(jit.set_word(DataWord::DirectFunc, callback as usize));
    assert!(jit.set_word(DataWord::DirectOp, 0));
    jit
}

/// The patch site of a function: the first NOP form of the spec in its
/// first bytes.
fn site_of(f: usize) -> usize {
    let spec = host_spec();
    let code = patch::read_text(f, 64);
    (0..=64 - spec.site_len).find(|&off| spec.nops.iter().any(|n| code[off..off + n.len()] == n[..])).map(|off| f + off).unwrap_or_else(|| panic!("no patch site at {f:#x}: {code:02x?}"))
}

/// The enabled form of `site` calling `target`.
fn call(site: usize, target: usize) -> Vec<u8> {
    arch::lookup(&host_spec().name).unwrap().site_call(site as u64, target as u64).unwrap()
}

fn many() -> Vec<(unsafe extern "C" fn(i64) -> i64, i64)> {
    // SAFETY: C statics defined in tests/c/tracee_many.c, never written.
    unsafe {
        assert_eq!(tracee_many_count, 320);
        tracee_many.iter().copied().zip(tracee_many_k.iter().copied()).collect()
    }
}

/// The `/proc/self/maps` permissions of the mapping holding `addr`.
fn perms_at(addr: usize) -> String {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    for l in maps.lines() {
        let mut it = l.split_whitespace();
        let (a, b) = it.next().unwrap().split_once('-').unwrap();
        let (a, b) = (usize::from_str_radix(a, 16).unwrap(), usize::from_str_radix(b, 16).unwrap());
        if (a..b).contains(&addr) {
            return it.next().unwrap().to_string();
        }
    }
    panic!("{addr:#x} is not mapped");
}

/// Round trips of the stress tests, two batches each (`FTRAMP_TOGGLES`
/// overrides).  Fewer off x86_64: under qemu-user every code write
/// invalidates translated blocks, and a batch costs milliseconds while four
/// threads spin.
fn toggles() -> usize {
    let default = if cfg!(target_arch = "x86_64") { 1000 } else { 500 };
    std::env::var("FTRAMP_TOGGLES").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Four threads call `tracee_two` in a loop, checking every result, while
/// the main thread switches its site between its NOPs and a call to the
/// trampoline `toggles()` times.  On x86_64 gcc's site is five 1-byte
/// NOPs, so every enable goes through the breakpoint and an evacuation;
/// on aarch64 every enable writes `mov x9, x30` then `bl`.
/// Four threads calling `tracee_two` until `stop`, each result checked;
/// their calls are added to `calls`.
fn spawn_callers<'scope>(s: &'scope std::thread::Scope<'scope, '_>, stop: &'scope AtomicBool, calls: &'scope AtomicUsize) {
    for t in 0..4i64 {
        s.spawn(move || {
            let mut n = 0i64;
            while !stop.load(SeqCst) {
                let a = n % 1000;
                assert_eq!(tracee_two(a, t), a * 1000 + t, "thread {t}, call {n}");
                n += 1;
            }
            calls.fetch_add(n as usize, SeqCst);
        });
    }
}

#[test]
fn toggling_a_site_while_four_threads_call_it() {
    let _g = lock();
    let jit = trampoline(count_a);
    let site = site_of(addr!(tracee_two));
    EXPECT_IP.store(site, SeqCst);
    let nops = patch::read_text(site, host_spec().site_len);
    let on = call(site, jit.entry(ARGS_DIRECT).unwrap());
    let stop = AtomicBool::new(false);
    let calls = AtomicUsize::new(0);
    let before = Patcher::stats();
    let mut signalled = 0;
    std::thread::scope(|s| {
        spawn_callers(s, &stop, &calls);
        for _ in 0..toggles() {
            let r = Patcher::apply(&[SiteChange::new(site, nops.clone(), on.clone())]).unwrap();
            assert_eq!((r.patched, r.refused_count()), (1, 0));
            signalled += r.threads_signalled;
            let r = Patcher::apply(&[SiteChange::new(site, on.clone(), nops.clone())]).unwrap();
            assert_eq!((r.patched, r.refused_count()), (1, 0));
        }
        stop.store(true, SeqCst);
    });
    let after = Patcher::stats();
    let (hits, calls) = (HITS_A.load(SeqCst), calls.load(SeqCst));
    eprintln!(
        "{} toggles: {calls} calls, {hits} traced; {signalled} threads signalled, {} moved back, {} traps emulated, {} restarted",
        toggles(),
        after.threads_moved - before.threads_moved,
        after.traps_emulated - before.traps_emulated,
        after.traps_restarted - before.traps_restarted
    );
    assert_eq!(WRONG_IP.load(SeqCst), 0, "a callback saw another ip");
    assert!(hits > 0 && hits <= calls, "{hits} traced of {calls}");
    assert!(signalled > 0, "enabling from a multi-instruction NOP form evacuates");
    assert_eq!(patch::read_text(site, nops.len()), nops);
}

/// The same with the site retargeted between two trampolines (`call A` ↔
/// `call B`: on x86_64 the breakpoint with no evacuation, on aarch64 one
/// `bl` word).
#[test]
fn retargeting_a_site_while_four_threads_call_it() {
    let _g = lock();
    let (ja, jb) = (trampoline(count_a), trampoline(count_b));
    let site = site_of(addr!(tracee_two));
    EXPECT_IP.store(site, SeqCst);
    let nops = patch::read_text(site, host_spec().site_len);
    let to_a = call(site, ja.entry(ARGS_DIRECT).unwrap());
    let to_b = call(site, jb.entry(ARGS_DIRECT).unwrap());
    assert_ne!(to_a, to_b);
    patch::replace_text(site, &nops, &to_a).unwrap();
    let stop = AtomicBool::new(false);
    let calls = AtomicUsize::new(0);
    std::thread::scope(|s| {
        spawn_callers(s, &stop, &calls);
        for _ in 0..toggles() {
            let r = Patcher::apply(&[SiteChange::new(site, to_a.clone(), to_b.clone())]).unwrap();
            assert_eq!((r.patched, r.threads_signalled), (1, 0), "a single-instruction change needs no evacuation");
            let r = Patcher::apply(&[SiteChange::new(site, to_b.clone(), to_a.clone())]).unwrap();
            assert_eq!(r.patched, 1);
        }
        stop.store(true, SeqCst);
    });
    patch::replace_text(site, &to_a, &nops).unwrap();
    // Stopped and unpatched: every call was traced by A or B.
    let (a, b, calls) = (HITS_A.load(SeqCst), HITS_B.load(SeqCst), calls.load(SeqCst));
    eprintln!("{} retargets: {calls} calls, {a} via A, {b} via B", toggles());
    assert_eq!(WRONG_IP.load(SeqCst), 0, "a callback saw another ip");
    assert_eq!(a + b, calls, "every call while enabled is traced exactly once");
    assert!(a > 0 && b > 0);
}

/// 320 sites on five pages: one batch, two rounds, one `mprotect` to add
/// write and one to restore; every function then calls the trampoline
/// once with its own site as ip; the pages are read+execute again.
#[test]
fn a_batch_changes_protection_once() {
    let _g = lock();
    let jit = trampoline(record);
    let target = jit.entry(ARGS_DIRECT).unwrap();
    let fns = many();
    let sites: Vec<usize> = fns.iter().map(|(f, _)| site_of(addr!(*f))).collect();
    let pages: std::collections::BTreeSet<usize> = sites.iter().map(|s| s / ftramp_runtime::exec::page_size()).collect();
    assert!(pages.len() >= 4, "the sites span {} pages", pages.len());
    let nops: Vec<Vec<u8>> = sites.iter().map(|&s| patch::read_text(s, host_spec().site_len)).collect();
    let enable: Vec<SiteChange> = sites.iter().zip(&nops).map(|(&s, n)| SiteChange::new(s, n.clone(), call(s, target))).collect();
    let r = Patcher::apply(&enable).unwrap();
    assert_eq!((r.patched, r.refused_count(), r.rounds, r.protection_changes), (320, 0, 2, 2), "{r:?}");
    for (f, k) in &fns {
        // SAFETY: functions of tests/c/tracee_many.c.
        assert_eq!(unsafe { f(7) }, 21 + k);
    }
    assert_eq!(*IPS.lock().unwrap(), sites, "each site traced once, in call order");
    for &s in &sites {
        assert_eq!(perms_at(s), "r-xp", "site {s:#x} after enabling");
    }
    let disable: Vec<SiteChange> = enable.iter().map(|c| SiteChange::new(c.addr, c.new.clone(), c.old.clone())).collect();
    let r = Patcher::apply(&disable).unwrap();
    assert_eq!((r.patched, r.rounds, r.protection_changes), (320, 2, 2), "{r:?}");
    for (f, k) in &fns {
        // SAFETY: as above.
        assert_eq!(unsafe { f(1) }, 3 + k);
    }
    assert_eq!(IPS.lock().unwrap().len(), 320, "no call traced after disabling");
    for &s in &sites {
        assert_eq!(perms_at(s), "r-xp", "site {s:#x} after disabling");
    }
}

/// No mapping holding a site is left writable, after enabling, after
/// disabling, and after a batch that failed validation.
#[test]
fn no_site_mapping_is_left_writable() {
    let _g = lock();
    let jit = trampoline(count_a);
    let target = jit.entry(ARGS_DIRECT).unwrap();
    let fns = [addr!(tracee_two), addr!(tracee_fp), addr!(tracee_args), addr!(tracee_nested)];
    let sites: Vec<usize> = fns.iter().map(|&f| site_of(f)).collect();
    let nops: Vec<Vec<u8>> = sites.iter().map(|&s| patch::read_text(s, host_spec().site_len)).collect();
    let writable = || {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let bad: Vec<&str> = maps.lines().filter(|l| l.split_whitespace().nth(1).is_some_and(|p| p.contains('w') && p.contains('x'))).collect();
        assert!(bad.is_empty(), "writable+executable mappings: {bad:#?}");
        for &s in &sites {
            let p = perms_at(s);
            assert!(!p.contains('w') && p.contains('x'), "site {s:#x}: {p}");
        }
    };
    writable();
    let enable: Vec<SiteChange> = sites.iter().zip(&nops).map(|(&s, n)| SiteChange::new(s, n.clone(), call(s, target))).collect();
    assert_eq!(Patcher::apply(&enable).unwrap().patched, 4);
    writable();
    // SAFETY: a C function of tests/c/tracee.c.
    assert_eq!(tracee_two(3, 4), 3004);
    assert_eq!(HITS_A.load(SeqCst), 1);
    // A batch that fails validation (two changes overlap) writes nothing.
    let overlap = [SiteChange::new(sites[0], call(sites[0], target), nops[0].clone()), SiteChange::new(sites[0] + 1, vec![0; 4], vec![0; 4])];
    assert!(matches!(Patcher::apply(&overlap), Err(RuntimeError::BadPatch { .. })));
    assert_eq!(patch::read_text(sites[0], nops[0].len()), call(sites[0], target));
    writable();
    let disable: Vec<SiteChange> = enable.iter().map(|c| SiteChange::new(c.addr, c.new.clone(), c.old.clone())).collect();
    assert_eq!(Patcher::apply(&disable).unwrap().patched, 4);
    writable();
}

/// A site whose bytes are not the expected ones is refused and left
/// alone; the rest of the batch is patched.  A batch of only refused sites
/// does not touch page protection.
#[test]
fn unexpected_bytes_are_refused_and_not_written() {
    let _g = lock();
    let jit = trampoline(count_a);
    let target = jit.entry(ARGS_DIRECT).unwrap();
    let (good, bad) = (site_of(addr!(tracee_fp)), site_of(addr!(tracee_args)));
    let len = host_spec().site_len;
    let (good_nops, bad_nops) = (patch::read_text(good, len), patch::read_text(bad, len));
    // `bad` is claimed to be enabled already: it is not.
    let batch = [SiteChange::new(good, good_nops.clone(), call(good, target)), SiteChange::new(bad, call(bad, target), bad_nops.clone())];
    let r = Patcher::apply(&batch).unwrap();
    assert_eq!((r.patched, r.refused_count()), (1, 1));
    match &r.refused[0] {
        RuntimeError::UnexpectedSiteBytes { addr, found } => assert_eq!((*addr, found), (bad, &bad_nops)),
        e => panic!("{e}"),
    }
    assert_eq!(patch::read_text(bad, len), bad_nops, "refused site untouched");
    assert_eq!(patch::read_text(good, len), call(good, target));
    // SAFETY: a C function of tests/c/tracee.c.
    assert_eq!(tracee_fp(2.0, 3.0, 1), 7.0);
    assert_eq!(HITS_A.load(SeqCst), 1);
    // Only refused sites: no protection change at all.
    let r = Patcher::apply(&[SiteChange::new(bad, call(bad, target), bad_nops.clone())]).unwrap();
    assert_eq!((r.patched, r.refused_count(), r.protection_changes), (0, 1, 0));
    // replace_text reports the refusal as its error.
    let e = patch::replace_text(bad, &call(bad, target), &bad_nops).unwrap_err();
    assert!(matches!(e, RuntimeError::UnexpectedSiteBytes { addr, .. } if addr == bad), "{e}");
    patch::replace_text(good, &call(good, target), &good_nops).unwrap();
}

/// Changes the patcher cannot make safely fail before any write.
#[test]
fn unsafe_changes_are_rejected() {
    let _g = lock();
    let site = site_of(addr!(tracee_two));
    let nops = patch::read_text(site, host_spec().site_len);
    let heap = Box::new([0u8; 64]);
    let rejected = |c: SiteChange| match Patcher::apply(&[c]) {
        Err(RuntimeError::BadPatch { why, .. }) => why,
        r => panic!("accepted: {r:?}"),
    };
    // Not code.
    let why = rejected(SiteChange::new(heap.as_ptr() as usize, heap[..nops.len()].to_vec(), nops.clone()));
    assert!(why.contains("executable"), "{why}");
    // Lengths differ.
    rejected(SiteChange::new(site, nops.clone(), nops[1..].to_vec()));
    if host_spec().name == "x86_64" {
        // A `ret` cannot be emulated from the breakpoint.
        let why = rejected(SiteChange::new(site, nops.clone(), vec![0xc3, 0x90, 0x90, 0x90, 0x90]));
        assert!(why.contains("neither"), "{why}");
    } else {
        // Words must be aligned.
        rejected(SiteChange::new(site + 2, patch::read_text(site + 2, 8), nops.clone()));
    }
    assert_eq!(patch::read_text(site, nops.len()), nops);
}
