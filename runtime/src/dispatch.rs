//! What trampolines call: the per-ops thunks and the list function.
//!
//! Every path from a trampoline into user code passes through here first,
//! so the thread is marked as inside dispatch ([`grace::DispatchGuard`])
//! while a callback may run, and unregistering can wait for it.
//!
//! * direct and callsite dispatch call `op->entry`, one of the thunks below
//!   ([`track_thunk`], or [`recursion_thunk`] for `RECURSION` ops);
//! * list dispatch calls [`list_func`], which finds the ops of the calling
//!   site in the published [`SiteTable`] (binary search) and calls each.
//!
//! The table is immutable once published: a change publishes a new one
//! and the old one is freed after a grace period.

use crate::grace::DispatchGuard;
use crate::ops::{Ops, OpsFlags};
use crate::regs::FtraceRegs;
use std::cell::Cell;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::Arc;

thread_local! {
    /// Set while a `RECURSION` callback runs on this thread.
    static IN_GUARDED: Cell<bool> = const { Cell::new(false) };
}

/// Calls `op.func` with the recursion guard when the ops asked for it.
#[inline]
fn call(ip: usize, parent_ip: usize, op: &Ops, fregs: &mut FtraceRegs) {
    if op.get_flags().contains(OpsFlags::RECURSION) {
        if IN_GUARDED.with(|g| g.replace(true)) {
            op.recursion_misses.fetch_add(1, Ordering::Relaxed);
            return;
        }
        (op.func())(ip, parent_ip, op, fregs);
        IN_GUARDED.with(|g| g.set(false));
    } else {
        (op.func())(ip, parent_ip, op, fregs);
    }
}

/// `op->entry` of ops without `RECURSION`.
pub extern "C" fn track_thunk(ip: usize, parent_ip: usize, op: &Ops, fregs: &mut FtraceRegs) {
    let _g = DispatchGuard::enter();
    (op.func())(ip, parent_ip, op, fregs)
}

/// `op->entry` of `RECURSION` ops.
pub extern "C" fn recursion_thunk(ip: usize, parent_ip: usize, op: &Ops, fregs: &mut FtraceRegs) {
    let _g = DispatchGuard::enter();
    call(ip, parent_ip, op, fregs)
}

/// Conservative ranges covering each thunk's code before its guard has
/// marked the thread (its prologue): a thread whose PC is there is treated
/// as inside dispatch by the grace period.
pub fn thunk_prologues() -> Vec<std::ops::Range<usize>> {
    const PROLOGUE: usize = 128;
    [track_thunk as *const () as usize, recursion_thunk as *const () as usize, list_func as *const () as usize]
        .into_iter()
        .map(|a| a..a + PROLOGUE)
        .collect()
}

/// The thunk for an ops' flags.
pub fn entry_for(flags: OpsFlags) -> usize {
    if flags.contains(OpsFlags::RECURSION) {
        recursion_thunk as *const () as usize
    } else {
        track_thunk as *const () as usize
    }
}

/// The ops of every site that uses list dispatch, sorted by site address.
#[derive(Default)]
pub struct SiteTable {
    pub entries: Vec<(usize, Vec<Arc<Ops>>)>,
}

static TABLE: AtomicPtr<SiteTable> = AtomicPtr::new(std::ptr::null_mut());

/// Publishes `table`; returns the previous one, which the caller must keep
/// alive until a grace period has passed.
pub fn publish(table: SiteTable) -> Option<Box<SiteTable>> {
    let new = Box::into_raw(Box::new(table));
    let old = TABLE.swap(new, Ordering::AcqRel);
    // SAFETY: every pointer stored in TABLE came from Box::into_raw above,
    // and the swap hands ownership of the old one back exactly once.
    (!old.is_null()).then(|| unsafe { Box::from_raw(old) })
}

/// `ftrace_ops_list_func`: what `args-list` / `regs-list` trampolines call.
pub extern "C" fn list_func(ip: usize, parent_ip: usize, _op: usize, fregs: &mut FtraceRegs) {
    let _g = DispatchGuard::enter();
    let t = TABLE.load(Ordering::Acquire);
    if t.is_null() {
        return;
    }
    // SAFETY: a published table is only freed after a grace period, and
    // this thread is inside dispatch (the guard above) while it reads it.
    let table = unsafe { &*t };
    if let Ok(i) = table.entries.binary_search_by_key(&ip, |e| e.0) {
        for op in &table.entries[i].1 {
            call(ip, parent_ip, op, fregs);
        }
    }
}
