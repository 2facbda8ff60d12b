//! The tracer callbacks: fgraph entry/return (function_graph) and an ops
//! callback (function).  Each is: read the clock, look the site's id up,
//! append one word to the thread's buffer.
//!
//! With a minimum duration the ENTRY of a call is deferred: entry only
//! notes (id, time) at its depth; at the return, a call that lasted long
//! enough writes the pending ENTRYs of its unwritten ancestors, then its
//! own ENTRY (original times) and its EXIT.  Written frames always form the
//! bottom of the stack (writing a frame writes its ancestors), so one
//! per-thread counter (`written`) says which are written.

use crate::ids::{lookup, NO_ID};
use crate::pool::{emit, lose};
use ftramp_runtime::clock::ticks;
use ftramp_runtime::fgraph::{Fgraph, GraphEnt, GraphRet};
use ftramp_runtime::ops::Ops;
use ftramp_runtime::FtraceRegs;
use ftramp_trace::format::Event;
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

/// Calls at this depth or deeper are not recorded.
pub static MAX_DEPTH: AtomicUsize = AtomicUsize::new(usize::MAX);
/// Minimum duration in ticks (0: record every call).
pub static MIN_TICKS: AtomicU64 = AtomicU64::new(0);

/// Deepest call kept pending with a minimum duration.
const PENDING_MAX: usize = 256;

struct Pending {
    ids: [Cell<u32>; PENDING_MAX],
    times: [Cell<u64>; PENDING_MAX],
    written: Cell<usize>,
}

thread_local! {
    static PENDING: Pending = const {
        Pending {
            ids: [const { Cell::new(0) }; PENDING_MAX],
            times: [const { Cell::new(0) }; PENDING_MAX],
            written: Cell::new(0),
        }
    };
}

pub extern "C" fn graph_entry(ent: &GraphEnt, _user: &Fgraph, _regs: &mut FtraceRegs) -> bool {
    if ent.depth >= MAX_DEPTH.load(Relaxed) {
        return false;
    }
    let now = ticks();
    let id = lookup(ent.func);
    if id == NO_ID {
        lose(1);
        return false;
    }
    if MIN_TICKS.load(Relaxed) == 0 {
        emit(Event::entry(id, 0), now);
        return true;
    }
    if ent.depth >= PENDING_MAX {
        lose(1);
        return false;
    }
    PENDING.with(|p| {
        p.ids[ent.depth].set(id);
        p.times[ent.depth].set(now);
        if p.written.get() > ent.depth {
            p.written.set(ent.depth);
        }
    });
    true
}

pub extern "C" fn graph_return(ret: &GraphRet, _user: &Fgraph, _regs: &mut FtraceRegs) {
    let now = ticks();
    let id = lookup(ret.func);
    if id == NO_ID {
        lose(1);
        return;
    }
    let min = MIN_TICKS.load(Relaxed);
    if min == 0 {
        emit(Event::exit(id, 0), now);
        return;
    }
    let d = ret.depth;
    if d >= PENDING_MAX {
        return;
    }
    PENDING.with(|p| {
        let w = p.written.get();
        if d < w {
            // Entered, and written because a descendant was long enough.
            emit(Event::exit(id, 0), now);
            p.written.set(d);
        } else if now.wrapping_sub(p.times[d].get()) >= min {
            for i in w..=d {
                emit(Event::entry(p.ids[i].get(), 0), p.times[i].get());
            }
            emit(Event::exit(id, 0), now);
            p.written.set(d);
        }
    });
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
