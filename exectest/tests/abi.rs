//! The C calling conventions through the runtime: the cases of
//! `tests/c/tracee_abi.c` (variadic calls, hidden result pointers, float
//! aggregates, mixed integer/float pairs, `__int128`, complex values,
//! stack arguments) return the same bytes traced as untraced, under ops of
//! both register tiers, fgraph (with timestamps) and fprobe (with entry
//! data), alone and all at once, while every callback scrambles the
//! caller-saved argument and return registers (`abi_clobber`).  The JIT
//! side of the same cases, on every arch, is in `jit.rs`.
//!
//! The engine is process-wide: the tests take a lock and leave nothing
//! registered.
#![cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]

use ftramp_exectest::abi;
use ftramp_runtime::fgraph::{self, Fgraph, GraphEnt, GraphRet};
use ftramp_runtime::fprobe::{self, EntryAction, Fprobe};
use ftramp_runtime::ftrace::ftrace;
use ftramp_runtime::ops::{Filter, Ops, OpsFlags};
use ftramp_runtime::FtraceRegs;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard};

static LOCK: Mutex<()> = Mutex::new(());

fn lock() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Callbacks seen: ops entries, fgraph entries and returns, fprobe entries
/// and exits, and fprobe exits whose entry data was not what the entry
/// wrote.
static OPS: AtomicU64 = AtomicU64::new(0);
static ENTRIES: AtomicU64 = AtomicU64::new(0);
static RETURNS: AtomicU64 = AtomicU64::new(0);
static FP_ENTRIES: AtomicU64 = AtomicU64::new(0);
static FP_EXITS: AtomicU64 = AtomicU64::new(0);
static FP_BAD_DATA: AtomicU64 = AtomicU64::new(0);

fn reset() {
    for c in [&OPS, &ENTRIES, &RETURNS, &FP_ENTRIES, &FP_EXITS, &FP_BAD_DATA] {
        c.store(0, SeqCst);
    }
}

fn tracees() -> Filter {
    Filter::new().glob("abi_*").unwrap()
}

extern "C" fn ops_cb(_ip: usize, _parent: usize, _op: &Ops, _fregs: &mut FtraceRegs) {
    OPS.fetch_add(1, SeqCst);
    abi::abi_clobber();
}

extern "C" fn graph_entry(_ent: &GraphEnt, _g: &Fgraph, _fregs: &mut FtraceRegs) -> bool {
    ENTRIES.fetch_add(1, SeqCst);
    abi::abi_clobber();
    true
}

extern "C" fn graph_ret(_ret: &GraphRet, _g: &Fgraph, _fregs: &mut FtraceRegs) {
    RETURNS.fetch_add(1, SeqCst);
    abi::abi_clobber();
}

/// The entry data: the function's address, twice, then the return address.
fn fp_entry(_fp: &Fprobe, ip: usize, ret_ip: usize, _fregs: &mut FtraceRegs, data: &mut [u8]) -> EntryAction {
    FP_ENTRIES.fetch_add(1, SeqCst);
    for (i, w) in [ip, !ip, ret_ip].iter().enumerate() {
        data[i * 8..i * 8 + 8].copy_from_slice(&(*w as u64).to_ne_bytes());
    }
    abi::abi_clobber();
    EntryAction::Continue
}

fn fp_exit(_fp: &Fprobe, ip: usize, ret_ip: usize, _fregs: &mut FtraceRegs, data: &mut [u8]) {
    FP_EXITS.fetch_add(1, SeqCst);
    let want: Vec<u8> = [ip, !ip, ret_ip].iter().flat_map(|w| (*w as u64).to_ne_bytes()).collect();
    if data[..24] != want[..] {
        FP_BAD_DATA.fetch_add(1, SeqCst);
    }
    abi::abi_clobber();
}

/// Runs the driver traced and checks its results against `want`.
fn check(what: &str, calls: i32, want: &[u8]) {
    let (n, got) = abi::run();
    assert_eq!(n, calls, "{what}");
    abi::assert_same(want, &got, what);
}

fn ops(flags: OpsFlags) -> Arc<Ops> {
    Arc::new(Ops::new(ops_cb).flags(flags).filter(tracees()))
}

fn fgraph_user() -> Arc<Fgraph> {
    Arc::new(Fgraph::new(graph_entry, graph_ret).filter(tracees()).skip_timestamp(false))
}

fn probe() -> Arc<Fprobe> {
    Arc::new(Fprobe::new().entry_handler(fp_entry).exit_handler(fp_exit).entry_data_size(24))
}

#[test]
fn ops_of_both_tiers_keep_the_c_abi() {
    let _l = lock();
    let (calls, want) = abi::run();
    for (tier, flags) in [("args tier", OpsFlags::empty()), ("regs tier", OpsFlags::SAVE_REGS)] {
        reset();
        let o = ops(flags);
        assert_eq!(ftrace().register(o.clone()).unwrap(), abi::tracees().len(), "{tier}: every tracee has a site");
        check(tier, calls, &want);
        ftrace().unregister(&o).unwrap();
        assert_eq!(OPS.load(SeqCst), calls as u64, "{tier}: every call traced");
    }
}

#[test]
fn fgraph_keeps_the_c_abi() {
    let _l = lock();
    let (calls, want) = abi::run();
    reset();
    let u = fgraph_user();
    fgraph::register_fgraph(u.clone()).unwrap();
    check("fgraph", calls, &want);
    fgraph::unregister_fgraph(&u).unwrap();
    assert_eq!((ENTRIES.load(SeqCst), RETURNS.load(SeqCst)), (calls as u64, calls as u64), "every call and return traced");
}

#[test]
fn fprobe_keeps_the_c_abi_and_its_entry_data() {
    let _l = lock();
    let (calls, want) = abi::run();
    reset();
    let fp = probe();
    fprobe::register_fprobe(&fp, "abi_*", None).unwrap();
    check("fprobe", calls, &want);
    fprobe::unregister_fprobe(&fp).unwrap();
    assert_eq!((FP_ENTRIES.load(SeqCst), FP_EXITS.load(SeqCst)), (calls as u64, calls as u64), "every entry and exit");
    assert_eq!(FP_BAD_DATA.load(SeqCst), 0, "entry data intact at exit");
}

/// Everything at once: the sites go through the list function, with two
/// fgraph users (one of them fprobe's) on each frame.
#[test]
fn everything_at_once_keeps_the_c_abi() {
    let _l = lock();
    let (calls, want) = abi::run();
    reset();
    let (a, b, u, fp) = (ops(OpsFlags::empty()), ops(OpsFlags::SAVE_REGS), fgraph_user(), probe());
    ftrace().register(a.clone()).unwrap();
    ftrace().register(b.clone()).unwrap();
    fgraph::register_fgraph(u.clone()).unwrap();
    fprobe::register_fprobe(&fp, "abi_*", None).unwrap();
    check("ops, fgraph and fprobe", calls, &want);
    fprobe::unregister_fprobe(&fp).unwrap();
    fgraph::unregister_fgraph(&u).unwrap();
    ftrace().unregister(&b).unwrap();
    ftrace().unregister(&a).unwrap();
    let n = calls as u64;
    assert_eq!(OPS.load(SeqCst), 2 * n, "both ops on every call");
    assert_eq!((ENTRIES.load(SeqCst), RETURNS.load(SeqCst)), (n, n));
    assert_eq!((FP_ENTRIES.load(SeqCst), FP_EXITS.load(SeqCst), FP_BAD_DATA.load(SeqCst)), (n, n, 0));
    // And untraced again.
    check("after unregistering", calls, &want);
}
