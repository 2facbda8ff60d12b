//! Random threads for the tests that check a streaming pass against the call tree:
//! recursion, UNWOUND markers, EXITs of calls further out (longjmp) or of none open,
//! losses anywhere (also after the last event), and calls left open at the end (unfinished,
//! or ended with the image).

use crate::format::UNWOUND_FUNC;
use crate::read::{Event, EventKind, Loss, Lost, Thread};

/// A xorshift generator: the same threads on every run.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    /// A number below `n`.
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// What [`thread`] makes.
pub(crate) struct Shape {
    /// At most this many events.
    pub events: u64,
    /// Functions 0..funcs.
    pub funcs: u64,
    /// At most this many ns between events.
    pub step_ns: u64,
    /// One loss in this many events (0: none).
    pub loss_every: u64,
}

/// A random thread of `tid` shaped by `s`.
pub(crate) fn thread(r: &mut Rng, tid: u32, s: &Shape) -> Thread {
    let (mut events, mut losses, mut ns, mut open) = (Vec::new(), Vec::new(), 1000u64, Vec::new());
    for _ in 0..r.below(s.events + 1) {
        ns += r.below(s.step_ns);
        if s.loss_every > 0 && r.below(s.loss_every) == 0 {
            losses.push(Loss { at: events.len(), ns, what: Lost::Events(r.below(9) + 1) });
        }
        let (kind, func) = match r.below(10) {
            0..=4 => {
                let f = r.below(s.funcs) as u32;
                open.push(f);
                (EventKind::Entry, f)
            }
            // The innermost open call returns (or a return with none open).
            5..=7 => (EventKind::Exit, open.pop().unwrap_or(s.funcs as u32 + 3)),
            8 => (EventKind::Exit, UNWOUND_FUNC),
            // A return of any function: one further out, or none open.
            _ => (EventKind::Exit, r.below(s.funcs + 1) as u32),
        };
        events.push(Event { kind, func, ns });
    }
    if s.loss_every > 0 && r.below(3) == 0 {
        losses.push(Loss { at: events.len(), ns, what: Lost::Chunks(1) });
    }
    // Half the threads were still running when their image ended: their open calls end
    // then (at or after the last event, as the reader makes it).
    let open_until = (r.below(2) == 0).then(|| ns + r.below(s.step_ns + 1));
    Thread { tid, events, losses, open_until, ..Default::default() }
}
