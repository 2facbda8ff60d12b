//! `long double` (st(0)) and `_Complex long double` (st(0), st(1)) return
//! values through `return_to_handler` whose callbacks use the whole x87
//! register stack (x86_64).
//!
//! The psABI has every function entered with the x87 stack empty, and
//! compiled code may then push all eight registers.  A traced function
//! returning a `long double` leaves it in st(0) when it returns into
//! `return_to_handler`, so the trampoline pops it (and st(1)) into its
//! frame before calling the runtime and loads them back after (codegen
//! `program.rs`, "x87 return values").  Without that, the callback's
//! eighth push would overflow onto the return value.  The callbacks here
//! push eight values and pop them, as an ABI-conforming callee may; the C
//! checker (`tests/c/tracee_x87.c`) counts wrong return values, with 80-bit
//! inputs that a `double` round trip would change.
#![cfg(target_arch = "x86_64")]

use ftramp_runtime::fgraph::{self, Fgraph, GraphEnt, GraphRet};
use ftramp_runtime::ops::Filter;
use ftramp_runtime::FtraceRegs;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;

// The checker and its tracees: `tests/c/tracee_x87.c`, built by build.rs.
#[link(name = "ftramp_tracee_x87", kind = "static")]
extern "C" {
    fn x87_check(rounds: i32) -> i32;
}

static RETURNS: AtomicU64 = AtomicU64::new(0);

/// Uses all eight x87 registers, as a callee may: eight pushes, eight pops.
fn fill_the_x87_stack() {
    // SAFETY: (test) the x87 registers are caller-saved and declared
    // clobbered; the stack is left as found (empty, by the ABI).
    unsafe {
        std::arch::asm!(
            "fld1", "fldz", "fld1", "fldz", "fld1", "fldz", "fld1", "fldpi",
            "fstp st(0)", "fstp st(0)", "fstp st(0)", "fstp st(0)",
            "fstp st(0)", "fstp st(0)", "fstp st(0)", "fstp st(0)",
            out("st(0)") _, out("st(1)") _, out("st(2)") _, out("st(3)") _,
            out("st(4)") _, out("st(5)") _, out("st(6)") _, out("st(7)") _,
        );
    }
}

extern "C" fn graph_entry(_ent: &GraphEnt, _user: &Fgraph, _fregs: &mut FtraceRegs) -> bool {
    fill_the_x87_stack();
    true
}

extern "C" fn graph_ret(_ret: &GraphRet, _user: &Fgraph, _fregs: &mut FtraceRegs) {
    RETURNS.fetch_add(1, SeqCst);
    fill_the_x87_stack();
}

#[test]
fn long_double_returns_survive_x87_code_in_return_callbacks() {
    // SAFETY: (test) the checker only calls its three tracees.
    assert_eq!(unsafe { x87_check(3) }, 0, "untraced");
    let f = Filter::new().symbol("x87_scale").symbol("x87_pair").symbol("x87_none");
    let user = Arc::new(Fgraph::new(graph_entry, graph_ret).filter(f).skip_timestamp(true));
    fgraph::register_fgraph(user.clone()).unwrap();
    let r0 = RETURNS.load(SeqCst);
    // SAFETY: as above.
    let bad = unsafe { x87_check(4) };
    let returns = RETURNS.load(SeqCst) - r0;
    fgraph::unregister_fgraph(&user).unwrap();
    assert_eq!(returns, 12, "every call of the three tracees returned through return_to_handler");
    assert_eq!(bad, 0, "wrong return values: st(0) or st(1) was lost in return_to_handler");
    // SAFETY: as above.
    assert_eq!(unsafe { x87_check(2) }, 0, "untraced again");
}

/// The same with `call` sites (the object ABI's `return_to_handler`, which
/// jumps back instead of returning), in a child process.
#[test]
fn call_sites_keep_the_x87_return_values_too() {
    if std::env::var_os("FTRAMP_SITE_ENTRY").is_some() {
        return;
    }
    ftramp_exectest::run_tests_in_child(&["long_double_returns_survive_x87_code_in_return_callbacks"], &[("FTRAMP_SITE_ENTRY", "call")]);
}
