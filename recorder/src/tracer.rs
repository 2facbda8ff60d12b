//! The tracer callbacks: fgraph entry/return (function_graph) and an ops
//! callback (function).  Each is: read the clock, look the site's id up
//! (an exit reads the id its entry noted at its depth instead), append one
//! word to the thread's buffer.
//!
//! With a minimum duration the ENTRY of a call is deferred: entry only
//! notes (id, time) at its depth; at the return, a call that lasted long
//! enough writes the pending ENTRYs of its unwritten ancestors, then its
//! own ENTRY (original times) and its EXIT.  Written frames always form the
//! bottom of the stack (writing a frame writes its ancestors), so one
//! per-thread counter (`written`) says which are written.

use crate::ids::{lookup, NO_ID};
use crate::pool::{emit, local_cached, lose, Local, DEPTH_SLOTS};
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

pub extern "C" fn graph_entry(ent: &GraphEnt, user: &Fgraph, _regs: &mut FtraceRegs) -> bool {
    let d = ent.depth;
    if d >= MAX_DEPTH.load(Relaxed) {
        return false;
    }
    let now = ticks();
    let id = lookup(ent.func);
    let l = local_cached(ent.task_var(user));
    if id == NO_ID {
        l.lose(1);
        return false;
    }
    if let Some(c) = l.ids.get(d) {
        c.set(id);
    }
    if MIN_TICKS.load(Relaxed) == 0 {
        unwound_above(l, d, now);
        l.emit(Event::entry(id, 0), now);
        l.open.set(d + 1);
        return true;
    }
    let Some(t) = l.times.get(d) else {
        // Too deep to keep pending.
        l.lose(1);
        return false;
    };
    t.set(now);
    if l.written.get() > d {
        l.written.set(d);
    }
    true
}

pub extern "C" fn graph_return(ret: &GraphRet, user: &Fgraph, _regs: &mut FtraceRegs) {
    let now = ticks();
    let d = ret.depth;
    let l = local_cached(ret.task_var(user));
    // The id entered at this depth, which is this frame's.
    let id = match l.ids.get(d) {
        Some(c) => c.get(),
        None => lookup(ret.func),
    };
    let min = MIN_TICKS.load(Relaxed);
    if min == 0 {
        unwound_above(l, d + 1, now);
        l.emit(Event::exit(id, 0), now);
        l.open.set(d);
        return;
    }
    if d >= DEPTH_SLOTS {
        return;
    }
    let w = l.written.get();
    if d < w {
        // Entered, and written because a descendant was long enough.
        l.emit(Event::exit(id, 0), now);
        l.written.set(d);
    } else if now.wrapping_sub(l.times[d].get()) >= min {
        for i in w..=d {
            l.emit(Event::entry(l.ids[i].get(), 0), l.times[i].get());
        }
        l.emit(Event::exit(id, 0), now);
        l.written.set(d);
    }
}

/// The `function` tracer's ops callback.
pub extern "C" fn function_entry(ip: usize, _parent: usize, _op: &Ops, _regs: &mut FtraceRegs) {
    let now = ticks();
    let id = lookup(ip);
    if id == NO_ID {
        lose(1);
        return;
    }
    emit(Event::entry(id, 0), now);
}
