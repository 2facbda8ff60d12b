//! `__m256` arguments and return values through traced functions whose
//! callbacks run AVX code (x86_64 with AVX): the trampolines keep the upper
//! halves of `ymm0-7` at entry and of `ymm0-1` at return (codegen
//! `program.rs`, "Vector upper halves").
//!
//! Ops of both register tiers (`args`, and `regs` with `SAVE_REGS`) and an
//! fgraph user (its return goes through `return_to_handler`) trace them.
//! The callbacks fill the upper halves and then clear them the way glibc's
//! AVX string functions end (`vzeroupper`), so a trampoline that kept only
//! the `xmm` halves hands the traced function (or its caller) wrong lanes.  The C checker (`tests/c/tracee_avx.c`) counts
//! them.  The other tests run the first in a child process: with the upper
//! halves left out (`FTRAMP_VECTOR_UPPER=0`), where the lanes must be wrong
//! (the check can fail), and with `call` sites (`FTRAMP_SITE_ENTRY=call`),
//! both ways.
#![cfg(target_arch = "x86_64")]

use ftramp_runtime::fgraph::{self, Fgraph, GraphEnt, GraphRet};
use ftramp_runtime::ftrace::ftrace;
use ftramp_runtime::ops::{Filter, Ops, OpsFlags};
use ftramp_runtime::FtraceRegs;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;

// The checker and its tracees: `tests/c/tracee_avx.c`, built by build.rs.
#[link(name = "ftramp_tracee_avx", kind = "static")]
extern "C" {
    fn avx_check(rounds: i32) -> i32;
}

// `tests/c/tracee_avx512.c`: one traced function with __m512d arguments.
#[link(name = "ftramp_tracee_avx512", kind = "static")]
extern "C" {
    fn avx512_check(rounds: i32) -> i32;
}

/// Set in the child of [`without_the_upper_halves_the_lanes_are_wrong`].
const EXPECT_CLOBBER: &str = "FTRAMP_TEST_EXPECT_CLOBBER";

static ENTRIES: AtomicU64 = AtomicU64::new(0);
static RETURNS: AtomicU64 = AtomicU64::new(0);

/// The in-process tests share the counters (and register ops and fgraph
/// users): one at a time.
static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn lock() -> std::sync::MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// What AVX code in a callback can leave in the upper halves: cleared by
/// `vzeroupper`, then all ones in ymm0-7 and back to clear — the last
/// state a `vzeroupper`-ending function leaves (zero), after upper halves
/// that were anything.
fn clobber_upper_halves() {
    // SAFETY: (test) the callbacks run only where the CPU has AVX (the
    // test returns early elsewhere).
    unsafe { clobber_avx() }
}

/// # Safety
/// Only on a CPU with AVX.
#[target_feature(enable = "avx")]
unsafe fn clobber_avx() {
    // SAFETY: (test) only caller-saved vector registers change, which the
    // asm declares clobbered.
    unsafe {
        std::arch::asm!(
            "vpcmpeqd ymm0, ymm0, ymm0",
            "vmovdqa ymm1, ymm0", "vmovdqa ymm2, ymm0", "vmovdqa ymm3, ymm0",
            "vmovdqa ymm4, ymm0", "vmovdqa ymm5, ymm0", "vmovdqa ymm6, ymm0", "vmovdqa ymm7, ymm0",
            "vzeroupper",
            out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _,
            out("ymm4") _, out("ymm5") _, out("ymm6") _, out("ymm7") _,
        );
    }
}

extern "C" fn ops_entry(_ip: usize, _parent: usize, _op: &Ops, _fregs: &mut FtraceRegs) {
    ENTRIES.fetch_add(1, SeqCst);
    clobber_upper_halves();
}

extern "C" fn graph_entry(_ent: &GraphEnt, _user: &Fgraph, _fregs: &mut FtraceRegs) -> bool {
    clobber_upper_halves();
    true
}

extern "C" fn graph_ret(_ret: &GraphRet, _user: &Fgraph, _fregs: &mut FtraceRegs) {
    RETURNS.fetch_add(1, SeqCst);
    clobber_upper_halves();
}

fn has_avx() -> bool {
    std::arch::is_x86_feature_detected!("avx")
}

/// Traces `funcs` with ops of both register tiers (an args-tier ops with
/// the fgraph user, then a `regs`-tier ops alone) whose callbacks clear
/// the upper halves, runs `check` (the wrong lanes it counts) under each
/// and checks that each of its `calls` traced calls was seen, and the
/// lanes: wrong where the child runs without the upper halves
/// (`EXPECT_CLOBBER`), all right otherwise (`lost` says what would be).
fn check_both_tiers(funcs: &[&str], calls: u64, check: impl Fn() -> i32, lost: &str) {
    let expect_clobber = std::env::var_os(EXPECT_CLOBBER).is_some();
    let f = || funcs.iter().fold(Filter::new(), |f, s| f.symbol(s));
    for (flags, graph) in [(OpsFlags::empty(), true), (OpsFlags::SAVE_REGS, false)] {
        let (e0, r0) = (ENTRIES.load(SeqCst), RETURNS.load(SeqCst));
        let ops = Arc::new(Ops::new(ops_entry).flags(flags).filter(f()));
        ftrace().register(ops.clone()).unwrap();
        let user = Arc::new(Fgraph::new(graph_entry, graph_ret).filter(f()).skip_timestamp(true));
        if graph {
            fgraph::register_fgraph(user.clone()).unwrap();
        }
        let bad = check();
        let (entries, returns) = (ENTRIES.load(SeqCst) - e0, RETURNS.load(SeqCst) - r0);
        if graph {
            fgraph::unregister_fgraph(&user).unwrap();
        }
        ftrace().unregister(&ops).unwrap();
        assert_eq!((entries, returns), (calls, if graph { calls } else { 0 }), "{flags:?}: every call traced");
        if expect_clobber {
            assert!(bad > 0, "{flags:?}: without the upper halves the callbacks' vzeroupper must show in the lanes");
        } else {
            assert_eq!(bad, 0, "{flags:?}: wrong lanes: {lost}");
        }
    }
}

#[test]
fn m256_arguments_and_returns_survive_avx_code_in_callbacks() {
    let _l = lock();
    if !has_avx() {
        // Nothing to keep, and the tracee cannot run.
        assert!(!ftramp_runtime::gen_options().vector_upper, "vector_upper needs AVX");
        eprintln!("skipped: this CPU has no AVX");
        return;
    }
    let expect_clobber = std::env::var_os(EXPECT_CLOBBER).is_some();
    assert_eq!(ftramp_runtime::gen_options().vector_upper, !expect_clobber);
    // SAFETY: (test) the checker only calls the two AVX tracees; the CPU has AVX.
    assert_eq!(unsafe { avx_check(3) }, 0, "untraced");

    // SAFETY: as above.
    check_both_tiers(&["avx_scale", "avx_fold8"], 6, || unsafe { avx_check(3) }, "an upper half was lost at entry or return");
    // SAFETY: as above.
    assert_eq!(unsafe { avx_check(2) }, 0, "untraced again");
}

/// Runs the `__m256` and `__m512` tests in a child process with `env` set.
fn run_child(env: &[(&str, &str)]) {
    ftramp_exectest::run_tests_in_child(
        &["m256_arguments_and_returns_survive_avx_code_in_callbacks", "m512_arguments_and_returns_survive_avx_code_in_callbacks"],
        env,
    );
}

#[test]
fn without_the_upper_halves_the_lanes_are_wrong() {
    if !has_avx() || std::env::var_os(EXPECT_CLOBBER).is_some() {
        return;
    }
    run_child(&[("FTRAMP_VECTOR_UPPER", "0"), (EXPECT_CLOBBER, "1")]);
}

/// The same with `call` sites (the object ABI's trampolines: the entry
/// returns with `ret`, `return_to_handler` jumps back).
#[test]
fn call_sites_keep_the_upper_halves_too() {
    if !has_avx() || std::env::var_os("FTRAMP_SITE_ENTRY").is_some() {
        return;
    }
    run_child(&[("FTRAMP_SITE_ENTRY", "call")]);
    run_child(&[("FTRAMP_SITE_ENTRY", "call"), ("FTRAMP_VECTOR_UPPER", "0"), (EXPECT_CLOBBER, "1")]);
}

/// On AVX-512 CPUs `__m512d` arguments and return values keep all 512 bits
/// through trampolines whose callbacks run AVX code ending in `vzeroupper`
/// (which clears bits 128-511 of `zmm0-15`), with ops of both tiers and
/// fgraph: the trampolines save the bits above the `ymm` halves too
/// (`vector_wider`) and put everything back with inserts that keep the rest
/// of the register.  In the child without the upper halves, lanes must be
/// wrong.
#[test]
fn m512_arguments_and_returns_survive_avx_code_in_callbacks() {
    let _l = lock();
    if !std::arch::is_x86_feature_detected!("avx512f") {
        eprintln!("skipped: this CPU has no AVX-512F");
        return;
    }
    let expect_clobber = std::env::var_os(EXPECT_CLOBBER).is_some();
    assert_eq!(ftramp_runtime::gen_options().vector_wider, !expect_clobber);
    // SAFETY: (test) the checker only calls its AVX-512 tracee; the CPU has AVX-512F.
    assert_eq!(unsafe { avx512_check(3) }, 0, "untraced");
    // SAFETY: as above.
    check_both_tiers(&["avx512_scale"], 3, || unsafe { avx512_check(3) }, "bits 128-511 of a zmm argument or return value were lost");
}
