//! What trampolines call: the per-ops thunks and the list function.
//!
//! Every path from a trampoline into user code passes through here first,
//! so the thread is marked as inside dispatch ([`crate::grace::DispatchGuard`])
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
use crate::thread::ThreadState;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::Arc;

/// Calls `op.func` with the recursion guard when the ops asked for it;
/// `t` is the calling thread's block (the caller's guard looked it up).
#[inline]
fn call(t: &ThreadState, ip: usize, parent_ip: usize, op: &Ops, fregs: &mut FtraceRegs) {
    if let Some(f) = op.listed_func {
        // A raw entry, inside the list function's guard.
        return f(ip, parent_ip, op, fregs);
    }
    if op.get_flags().contains(OpsFlags::RECURSION) {
        if t.in_guarded.replace(true) {
            op.recursion_misses.fetch_add(1, Ordering::Relaxed);
            return;
        }
        (op.func())(ip, parent_ip, op, fregs);
        t.in_guarded.set(false);
    } else {
        (op.func())(ip, parent_ip, op, fregs);
    }
}

/// A dispatch section of thread `t` (the caller's) was left by a jump
/// ([`crate::grace`]): the `RECURSION` guard it held is released.
pub(crate) fn dispatch_left(t: &ThreadState) {
    t.in_guarded.set(false);
}

/// `op->entry` of ops without `RECURSION`.
pub extern "C" fn track_thunk(ip: usize, parent_ip: usize, op: &Ops, fregs: &mut FtraceRegs) {
    let _g = DispatchGuard::enter_at(|| fregs.stack_pointer());
    (op.func())(ip, parent_ip, op, fregs)
}

/// `op->entry` of `RECURSION` ops.
pub extern "C" fn recursion_thunk(ip: usize, parent_ip: usize, op: &Ops, fregs: &mut FtraceRegs) {
    let g = DispatchGuard::enter_at(|| fregs.stack_pointer());
    call(g.thread(), ip, parent_ip, op, fregs)
}

/// Conservative ranges covering each thunk's code before its guard has
/// marked the thread (its prologue): a thread whose PC is there is treated
/// as inside dispatch by the grace period.
pub fn thunk_prologues() -> Vec<std::ops::Range<usize>> {
    [
        track_thunk as *const () as usize,
        recursion_thunk as *const () as usize,
        list_func as *const () as usize,
        crate::fgraph::graph_entry as *const () as usize,
    ]
    .into_iter()
    .map(|a| a..a + THUNK_CODE)
    .collect()
}

/// How many bytes from its start count as a thunk's dispatch code (see
/// [`thunk_prologues`]); `track_thunk`, `recursion_thunk` and fgraph's
/// `graph_entry` are smaller than this whole (a test checks, on every
/// arch), so a thread past their guard's decrement still counts as busy.
/// Generous on purpose: covering a few neighbouring runtime instructions
/// only makes a grace period wait a little longer.  (`graph_entry`, with
/// fgraph's `push` inlined: x86_64 622 bytes in a release executable, 728
/// in the `tls-cache` preload, 550 in the test build; in the test builds
/// under qemu aarch64 408, riscv64 354, s390x 454, ppc64le 536.  The
/// runtime is built optimised in every profile, which a test checks too:
/// unoptimised, the thunks would not fit.)
pub const THUNK_CODE: usize = 1024;

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

impl SiteTable {
    /// Heap bytes the table holds, about (for deferring its free).
    pub fn approx_bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + self.entries.capacity() * std::mem::size_of::<(usize, Vec<Arc<Ops>>)>()
            + self.entries.iter().map(|(_, v)| v.capacity() * std::mem::size_of::<Arc<Ops>>()).sum::<usize>()
    }
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
    let g = DispatchGuard::enter_at(|| fregs.stack_pointer());
    let t = TABLE.load(Ordering::Acquire);
    if t.is_null() {
        return;
    }
    // SAFETY: a published table is only freed after a grace period, and
    // this thread is inside dispatch (the guard above) while it reads it.
    let table = unsafe { &*t };
    if let Ok(i) = table.entries.binary_search_by_key(&ip, |e| e.0) {
        for op in &table.entries[i].1 {
            call(g.thread(), ip, parent_ip, op, fregs);
        }
    }
}

#[cfg(test)]
mod tests {
    /// The workspace builds the runtime optimised in every profile (see
    /// Cargo.toml): unoptimised, the thunks call out before their guard
    /// marks the thread, outside every range a grace period checks.
    #[test]
    #[allow(clippy::assertions_on_constants)] // (a test that fails, not a build)
    fn the_runtime_is_built_optimised() {
        assert!(!cfg!(ftramp_unoptimised), "ftramp-runtime was built with opt-level 0 (Cargo.toml's dev profile override is missing)");
    }

    /// The thunks whose whole code must lie within THUNK_CODE bytes (a
    /// thread after their guard's decrement still returns into a
    /// trampoline): measured from this test binary's symbol table, in the
    /// debug build (the workspace builds the runtime with `opt-level = 2`
    /// there too, see Cargo.toml; release test builds keep no local
    /// symbols for them).
    #[cfg(debug_assertions)]
    #[test]
    fn thunks_fit_in_their_dispatch_code_range() {
        use object::{Object, ObjectSymbol};
        // Referencing them keeps them in the binary.
        assert_eq!(super::thunk_prologues().len(), 4);
        let exe = std::fs::read("/proc/self/exe").unwrap();
        let file = object::File::parse(&*exe).unwrap();
        for name in ["8dispatch11track_thunk", "8dispatch15recursion_thunk", "6fgraph11graph_entry"] {
            let sizes: Vec<u64> = file.symbols().filter(|s| s.name().is_ok_and(|n| n.contains(name))).map(|s| s.size()).collect();
            assert!(!sizes.is_empty(), "{name} not in the symbol table");
            for size in sizes {
                assert!(size > 0 && size as usize <= super::THUNK_CODE, "{name} is {size} bytes, more than THUNK_CODE");
            }
        }
    }
}
