//! The tracer callbacks: fgraph entry/return (function_graph) and an ops
//! callback (function).  Each is: read the clock, look the site's id up
//! (an exit reads the id its entry noted at its depth instead), append one
//! word to the thread's buffer; an exit whose ENTRY is still the buffer's
//! last word turns that word into a LEAF instead (one word per leaf call).
//!
//! With a minimum duration the ENTRY of a call is deferred: entry only
//! notes (id, time) at its depth; at the return, a call that lasted long
//! enough writes the pending ENTRYs of its unwritten ancestors, then its
//! own ENTRY (original times) and its EXIT.  Written frames always form the
//! bottom of the stack (writing a frame writes its ancestors), so one
//! per-thread counter (`written`) says which are written.  Calls deeper
//! than the [`DEPTH_SLOTS`] that can be kept pending are written at once,
//! whatever their duration.
//!
//! function_graph's common case has a fast path per callback, a leaf
//! function without calls (so no registers to save): no depth limit or
//! minimum duration in the way ([`FAST_DEPTH`]), the thread's [`Local`]
//! cached in the fgraph task variable (no thread-local lookup), the site
//! in the published id table, no frames to close as unwound, and room in
//! the buffer.  Anything else goes to the general path, out of line.

use crate::ids::{lookup, lookup_published, NO_ID};
use crate::pool::{emit, local, local_cached, local_if_cached, lose, Depths, Local, DEPTH_SLOTS};
use ftramp_runtime::clock::ticks;
use ftramp_runtime::fgraph::{Fgraph, GraphEnt, GraphRet};
use ftramp_runtime::ops::Ops;
use ftramp_runtime::FtraceRegs;
use ftramp_trace::format::Event;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

/// Calls at this depth or deeper are not recorded.
pub static MAX_DEPTH: AtomicUsize = AtomicUsize::new(usize::MAX);
/// Minimum duration in ticks (0: record every call).
pub static MIN_TICKS: AtomicU64 = AtomicU64::new(0);
/// Calls at depths below this may take the fast paths: the depth limit
/// capped at [`DEPTH_SLOTS`] when there is no minimum duration and the
/// fast paths' clock read is [`ticks`]'s; 0 (never) otherwise.  The
/// callbacks read it from their user's `private` word ([`graph_user`]),
/// next to the registration words fgraph reads anyway.
static FAST_DEPTH: AtomicUsize = AtomicUsize::new(0);

/// The function_graph user: the only way the callbacks are registered, so
/// `private` is always [`FAST_DEPTH`] (call [`configure`] before).
pub fn graph_user() -> Fgraph {
    Fgraph::new(graph_entry, graph_return).private(FAST_DEPTH.load(Relaxed))
}

/// Sets the depth limit and the minimum duration (before registering).
pub fn configure(max_depth: usize, min_ticks: u64) {
    MAX_DEPTH.store(max_depth, Relaxed);
    MIN_TICKS.store(min_ticks, Relaxed);
    let clock_ok = !cfg!(target_arch = "x86_64")
        || ftramp_runtime::clock::clock().kind == ftramp_runtime::clock::ClockKind::Tsc;
    let fast = if min_ticks == 0 && clock_ok {
        max_depth.min(DEPTH_SLOTS)
    } else {
        0
    };
    FAST_DEPTH.store(fast, Relaxed);
}

/// [`ticks`] without its clock-kind test (x86_64: the fast paths run only
/// when the clock is the TSC, see [`configure`]).
#[inline(always)]
fn fast_ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: rdtsc has no memory effects; every x86_64 CPU has it.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        ticks()
    }
}

/// Closes, as unwound, the calls fgraph dropped since the last event: more
/// open than the `depth` of the event now (see [`Local::open`]).
#[inline(always)]
fn unwound_above(l: &Local, depth: usize, now: u64) {
    let open = l.open.get();
    if open > depth {
        for _ in depth..open {
            l.emit(Event::unwound(0), now);
        }
    }
}

extern "C" fn graph_entry(ent: &GraphEnt, user: &Fgraph, _regs: &mut FtraceRegs) -> bool {
    let d = ent.depth;
    if d < user.private {
        if let Some(l) = local_if_cached(ent.task_var(user)) {
            if l.open.get() <= d {
                if let (Some(id), Some((slot, dp))) = (lookup_published(ent.func), l.slotted()) {
                    // SAFETY: d < user.private, which is FAST_DEPTH (only
                    // `graph_user` registers this callback), <= DEPTH_SLOTS,
                    // the length of `ids`.
                    unsafe { dp.ids.get_unchecked(d) }.store(id, Relaxed);
                    let (base, now) = (Event::entry(id, 0), fast_ticks());
                    if Local::try_emit_in(slot, base, now) {
                        l.open.set(d + 1);
                        return true;
                    }
                    return emit_slow_then_open(l, base, now, d + 1);
                }
            }
        }
    }
    graph_entry_slow(ent, user)
}

/// The fast paths' event when the buffer has no room (or the delta does
/// not fit the word): the general [`Local::emit`], then `open`; true (a
/// tail call for both callbacks, so that they save no registers; the
/// `black_box` keeps the compiler from returning the constant in the
/// caller instead, after a call that is then no tail call).
#[cold]
#[inline(never)]
extern "C" fn emit_slow_then_open(l: &Local, base: u64, now: u64, open: usize) -> bool {
    l.emit(base, now);
    l.open.set(open);
    std::hint::black_box(true)
}

/// [`graph_entry`] in every case.
#[cold]
#[inline(never)]
extern "C" fn graph_entry_slow(ent: &GraphEnt, user: &Fgraph) -> bool {
    let d = ent.depth;
    let l = local_cached(ent.task_var(user));
    if l.in_vfork_child() || d >= MAX_DEPTH.load(Relaxed) {
        return false;
    }
    let now = ticks();
    let id = lookup(ent.func);
    if id == NO_ID {
        l.lose(1);
        return false;
    }
    if MIN_TICKS.load(Relaxed) == 0 {
        unwound_above(l, d, now);
        // (The emit claims the thread's slot, which holds its depths.)
        l.emit(Event::entry(id, 0), now);
        if let Some(c) = l.depths().and_then(|dp| dp.ids.get(d)) {
            c.store(id, Relaxed);
        }
        l.open.set(d + 1);
        return true;
    }
    // No slot (none free, or the thread is exiting): counted.
    let Some(dp) = l.depths_claimed() else {
        l.lose(1);
        return false;
    };
    let (Some(c), Some(t)) = (dp.ids.get(d), dp.times.get(d)) else {
        // Too deep to keep pending: written at once, after its pending
        // ancestors (those deeper than DEPTH_SLOTS were written so too),
        // whatever its duration — deep recursion whose innermost call is
        // long was lost whole before, ancestors included.
        write_pending(l, dp, l.written.get().min(DEPTH_SLOTS)..DEPTH_SLOTS);
        l.emit(Event::entry(id, 0), now);
        l.written.set(d + 1);
        return true;
    };
    c.store(id, Relaxed);
    t.store(now, Relaxed);
    if l.written.get() > d {
        l.written.set(d);
    }
    true
}

extern "C" fn graph_return(ret: &GraphRet, user: &Fgraph, _regs: &mut FtraceRegs) {
    let d = ret.depth;
    if d < user.private {
        if let Some(l) = local_if_cached(ret.task_var(user)) {
            if let (true, Some((slot, dp))) = (l.open.get() <= d + 1, l.slotted()) {
                // SAFETY: d < user.private, which is FAST_DEPTH (only
                // `graph_user` registers this callback), <= DEPTH_SLOTS,
                // the length of `ids`.
                let id = unsafe { dp.ids.get_unchecked(d) }.load(Relaxed);
                let (base, now) = (Event::exit(id, 0), fast_ticks());
                if Local::try_emit_exit_in(slot, id, now) {
                    l.open.set(d);
                    return;
                }
                emit_slow_then_open(l, base, now, d);
                return;
            }
        }
    }
    graph_return_slow(ret, user)
}

/// [`graph_return`] in every case.
#[cold]
#[inline(never)]
extern "C" fn graph_return_slow(ret: &GraphRet, user: &Fgraph) {
    let now = ticks();
    let d = ret.depth;
    let l = local_cached(ret.task_var(user));
    if l.in_vfork_child() {
        return;
    }
    // The id entered at this depth, which is this frame's.
    let id = match l.depths().and_then(|dp| dp.ids.get(d)) {
        Some(c) => c.load(Relaxed),
        None => lookup(ret.func),
    };
    let min = MIN_TICKS.load(Relaxed);
    if min == 0 {
        unwound_above(l, d + 1, now);
        l.emit_exit(id, now);
        l.open.set(d);
        return;
    }
    if d >= DEPTH_SLOTS {
        // Written at its entry (see graph_entry_slow).
        l.emit_exit(id, now);
        l.written.set(d);
        return;
    }
    let Some(dp) = l.depths() else {
        // Its entry had no slot either (counted there).
        l.lose(1);
        return;
    };
    let w = l.written.get();
    if d < w {
        // Entered, and written because a descendant was long enough.
        l.emit_exit(id, now);
        l.written.set(d);
    } else if now.wrapping_sub(dp.times[d].load(Relaxed)) >= min {
        write_pending(l, dp, w..d + 1);
        l.emit_exit(id, now);
        l.written.set(d);
    }
}

/// Writes the pending ENTRYs (minimum duration) of the calls at `depths`,
/// with their entry times.
fn write_pending(l: &Local, dp: &Depths, depths: std::ops::Range<usize>) {
    for i in depths {
        l.emit(Event::entry(dp.ids[i].load(Relaxed), 0), dp.times[i].load(Relaxed));
    }
}

/// The `function` tracer's ops callback.
pub extern "C" fn function_entry(ip: usize, _parent: usize, _op: &Ops, _regs: &mut FtraceRegs) {
    let now = ticks();
    let id = lookup(ip);
    if id == NO_ID {
        // (Not in a `vfork` child: its calls are not the thread's.)
        if !local().in_vfork_child() {
            lose(1);
        }
        return;
    }
    // (In a `vfork` child the slot is put aside: `emit`'s slow path drops
    // the event.)
    emit(Event::entry(id, 0), now);
}
