//! The sites of the current patch round, as the SIGTRAP handler sees them.
//!
//! The handler may run on any thread at any moment, so everything here is
//! async-signal-safe: fixed static arrays of atomics, no allocation, no
//! lock.  The patcher (one at a time, under `patch`'s lock) rewrites the
//! table between rounds as a seqlock:
//!
//! ```text
//!   SEQ even: the table is stable        SEQ odd: being rewritten
//!   writer: SEQ+1 ; fence ; slots ; COUNT ; ACTIVE ; SEQ+1 (release)
//!   reader: s1 = SEQ (acquire, even) ; read slots and code ; fence ; SEQ == s1 ?
//! ```
//!
//! A round publishes its sites ([`publish`], `ACTIVE` set) *before* its
//! first code write and marks them done ([`finish`], `ACTIVE` cleared)
//! after its last; the entries stay readable until the next round
//! replaces them, so a thread that trapped on a round's breakpoint but was
//! descheduled before its handler ran still finds its site.  On x86_64
//! every address that ever held our breakpoint is also kept in an
//! append-only registry ([`known`]), for a trap whose handler runs even
//! later than that: the breakpoint is gone, the thread restarts the site.

use std::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering::*};

/// Sites per round (Linux's `TP_VEC_MAX` is one page of them); a batch
/// with more sites runs several rounds inside one protection window.
pub(crate) const ROUND: usize = 256;

/// What a thread stopped at a site's first byte does instead of executing
/// it (the x86 breakpoint emulates the *new* instruction).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// A NOP form: continue after the site.
    Skip,
    /// `call rel32`: push `addr + len`, continue at the target.
    Call(usize),
    /// `jmp rel32`: continue at the target.
    Jump(usize),
}

/// One site of a round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub addr: usize,
    pub len: usize,
    pub action: Action,
    /// The old form is several instructions: a thread may be stopped
    /// inside it, and is sent back to `addr` while the round is active.
    pub evacuate: bool,
}

struct Slot {
    addr: AtomicUsize,
    len: AtomicUsize,
    /// `KIND_*` | `EVACUATE`.
    kind: AtomicUsize,
    target: AtomicUsize,
}

const KIND_SKIP: usize = 0;
const KIND_CALL: usize = 1;
const KIND_JUMP: usize = 2;
const KIND_MASK: usize = 3;
const EVACUATE: usize = 4;

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Slot = Slot { addr: AtomicUsize::new(0), len: AtomicUsize::new(0), kind: AtomicUsize::new(0), target: AtomicUsize::new(0) };
static SLOTS: [Slot; ROUND] = [EMPTY; ROUND];
static COUNT: AtomicUsize = AtomicUsize::new(0);
static ACTIVE: AtomicBool = AtomicBool::new(false);
static SEQ: AtomicUsize = AtomicUsize::new(0);

/// Blocks SIGTRAP on this thread while the table is odd, so a handler
/// running on the writer's own thread cannot spin on it forever.
struct TrapBlocked(libc::sigset_t);

impl TrapBlocked {
    fn new() -> TrapBlocked {
        // SAFETY: sigset_t is plain data; the sig*set functions only write
        // the set we pass, pthread_sigmask only this thread's mask.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGTRAP);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
            TrapBlocked(old)
        }
    }
}

impl Drop for TrapBlocked {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved by `new` on this same thread.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut()) };
    }
}

fn write(update: impl FnOnce()) {
    let _blocked = TrapBlocked::new();
    let s = SEQ.load(Relaxed);
    SEQ.store(s + 1, Relaxed);
    fence(Release);
    update();
    SEQ.store(s + 2, Release);
}

/// Publishes a round's sites (sorted by address, at most [`ROUND`]).
pub(crate) fn publish(entries: &[Entry]) {
    assert!(entries.len() <= ROUND && entries.windows(2).all(|w| w[0].addr < w[1].addr));
    #[cfg(target_arch = "x86_64")]
    for e in entries {
        known::add(e.addr);
    }
    write(|| {
        for (slot, e) in SLOTS.iter().zip(entries) {
            let (kind, target) = match e.action {
                Action::Skip => (KIND_SKIP, 0),
                Action::Call(t) => (KIND_CALL, t),
                Action::Jump(t) => (KIND_JUMP, t),
            };
            slot.addr.store(e.addr, Relaxed);
            slot.len.store(e.len, Relaxed);
            slot.kind.store(kind | if e.evacuate { EVACUATE } else { 0 }, Relaxed);
            slot.target.store(target, Relaxed);
        }
        COUNT.store(entries.len(), Relaxed);
        ACTIVE.store(true, Relaxed);
    });
}

/// Marks the round done: its entries stay readable, nobody is evacuated.
pub(crate) fn finish() {
    write(|| ACTIVE.store(false, Relaxed));
}

/// A consistent view of the table, valid inside [`read`].
pub(crate) struct View(());

impl View {
    fn entry(&self, i: usize) -> Entry {
        let s = &SLOTS[i];
        let kind = s.kind.load(Relaxed);
        let target = s.target.load(Relaxed);
        let action = match kind & KIND_MASK {
            KIND_CALL => Action::Call(target),
            KIND_JUMP => Action::Jump(target),
            _ => Action::Skip,
        };
        Entry { addr: s.addr.load(Relaxed), len: s.len.load(Relaxed), action, evacuate: kind & EVACUATE != 0 }
    }

    fn count(&self) -> usize {
        COUNT.load(Relaxed).min(ROUND)
    }

    /// Index of the last entry with `addr <= at` (binary search).
    fn floor(&self, at: usize) -> Option<usize> {
        let (mut lo, mut hi) = (0, self.count());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if SLOTS[mid].addr.load(Relaxed) <= at {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo.checked_sub(1)
    }

    /// The entry of the site starting at `addr`.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn find(&self, addr: usize) -> Option<Entry> {
        self.floor(addr).map(|i| self.entry(i)).filter(|e| e.addr == addr)
    }

    /// While a round is active: the evacuated site whose interior (not its
    /// first byte) holds `pc`.
    pub(crate) fn interior(&self, pc: usize) -> Option<Entry> {
        if !ACTIVE.load(Relaxed) {
            return None;
        }
        self.floor(pc).map(|i| self.entry(i)).filter(|e| e.evacuate && e.addr < pc && pc < e.addr + e.len)
    }
}

/// Runs `f` on a consistent snapshot of the table (retrying while the
/// patcher rewrites it).  Async-signal-safe.
pub(crate) fn read<R>(f: impl Fn(&View) -> R) -> R {
    loop {
        let s1 = SEQ.load(Acquire);
        if s1 & 1 == 1 {
            std::hint::spin_loop();
            continue;
        }
        let r = f(&View(()));
        fence(Acquire);
        if SEQ.load(Relaxed) == s1 {
            return r;
        }
    }
}

/// Every address that ever held our breakpoint (x86_64): append-only,
/// never freed, in segments of doubling size so readers need no lock.
#[cfg(target_arch = "x86_64")]
pub(crate) mod known {
    use std::collections::HashSet;
    use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering::*};
    use std::sync::Mutex;

    const FIRST: usize = 64;
    const SEGMENTS: usize = 40;
    #[allow(clippy::declare_interior_mutable_const)]
    const NULL: AtomicPtr<AtomicUsize> = AtomicPtr::new(std::ptr::null_mut());
    static SEGS: [AtomicPtr<AtomicUsize>; SEGMENTS] = [NULL; SEGMENTS];
    static LEN: AtomicUsize = AtomicUsize::new(0);
    static SET: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

    fn place(i: usize) -> (usize, usize) {
        let seg = (i / FIRST + 1).ilog2() as usize;
        (seg, i - FIRST * ((1 << seg) - 1))
    }

    /// Records `addr` (writer side, under the patcher's lock).
    pub(crate) fn add(addr: usize) {
        let mut set = SET.lock().unwrap_or_else(|e| e.into_inner());
        if !set.get_or_insert_with(HashSet::new).insert(addr) {
            return;
        }
        let i = LEN.load(Relaxed);
        let (seg, off) = place(i);
        let mut p = SEGS[seg].load(Acquire);
        if p.is_null() {
            let fresh: Box<[AtomicUsize]> = (0..FIRST << seg).map(|_| AtomicUsize::new(0)).collect();
            p = Box::leak(fresh).as_mut_ptr();
            SEGS[seg].store(p, Release);
        }
        // SAFETY: segment `seg` holds FIRST << seg slots and off < that; it
        // is leaked, so it lives for the rest of the process.
        unsafe { (*p.add(off)).store(addr, Relaxed) };
        LEN.store(i + 1, Release);
    }

    /// Whether `addr` ever held our breakpoint.  Async-signal-safe; a
    /// linear scan, used only for traps the round table cannot explain.
    pub(crate) fn contains(addr: usize) -> bool {
        let n = LEN.load(Acquire);
        (0..n).any(|i| {
            let (seg, off) = place(i);
            let p = SEGS[seg].load(Acquire);
            // SAFETY: every index below LEN was written into a segment
            // published before LEN (release/acquire); segments are leaked.
            !p.is_null() && unsafe { (*p.add(off)).load(Relaxed) } == addr
        })
    }

    #[cfg(test)]
    #[test]
    fn places_are_dense() {
        assert_eq!(place(0), (0, 0));
        assert_eq!(place(63), (0, 63));
        assert_eq!(place(64), (1, 0));
        assert_eq!(place(64 + 127), (1, 127));
        assert_eq!(place(192), (2, 0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_see_the_published_round() {
        let _lock = super::super::lock();
        let e = |addr, evacuate| Entry { addr, len: 8, action: Action::Call(addr + 0x100), evacuate };
        publish(&[e(0x1000, false), e(0x2000, true), e(0x3000, true)]);
        read(|t| {
            assert_eq!(t.find(0x2000), Some(e(0x2000, true)));
            assert_eq!(t.find(0x2004), None);
            assert_eq!(t.find(0x0fff), None);
            assert_eq!(t.interior(0x2004).map(|e| e.addr), Some(0x2000));
            assert_eq!(t.interior(0x2000), None, "the first byte is not inside");
            assert_eq!(t.interior(0x2008), None);
            assert_eq!(t.interior(0x1004), None, "not evacuated");
        });
        finish();
        read(|t| {
            assert_eq!(t.find(0x3000), Some(e(0x3000, true)), "entries outlive the round");
            assert_eq!(t.interior(0x3004), None, "nobody is moved after the round");
        });
        publish(&[]);
        finish();
    }
}
