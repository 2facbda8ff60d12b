//! A thread's events as a call tree: what replay, report and dump walk.
//!
//! Nesting comes from the ENTRY/EXIT order. An EXIT normally closes the innermost open
//! call; an EXIT for a call further out (its inner calls left without returning: longjmp,
//! an exception through untraced frames) closes the calls above it as *unwound* at that
//! time; an EXIT with no open call of that function is counted in
//! [`CallTree::unmatched_exits`] and otherwise ignored. Calls still open at the end of
//! the thread are *unfinished*. Traces of the `function` tracer (entries only) give a flat
//! list of calls without end.
//!
//! The tree is kept in one arena and every walk is iterative, so deep recursion in the
//! traced program cannot overflow the reader's stack.
//!
//! [`Walk`] gives the same calls as a stream of [`Step`]s (a call begins, the innermost
//! open call ends, a loss) holding only the open calls: what replay, report and dump use,
//! so that their memory does not grow with the trace (the tree takes about 100 bytes a
//! call; a 2.7 GB trace of Lua's test suite needed more than 24 GB with it). The tree
//! stays for callers that want random access, and as the tests' independent model of
//! the nesting rules.

use crate::read::{Event, EventKind, Item, Lost, Thread};

/// How a call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Its EXIT was recorded at this time.
    Returned(u64),
    /// An outer call's EXIT came first (longjmp, exception): ended by then.
    Unwound(u64),
    /// No EXIT, but still open when the image ended at this time (`exit()` called inside
    /// it, a fatal signal, `exec`): [`Thread::open_until`].
    AtEnd(u64),
    /// No EXIT before the thread's data ended, and no known end (the thread exited
    /// inside it, the image ended unseen, or data was lost).
    Unfinished,
    /// The trace records entries only (`function` tracer).
    NoExit,
}

/// One call of a function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub func: u32,
    pub entry_ns: u64,
    pub end: End,
    /// Number of calls it is nested in.
    pub depth: u32,
    pub children: Vec<Node>,
}

impl Call {
    /// When the call ended, if it did.
    pub fn end_ns(&self) -> Option<u64> {
        match self.end {
            End::Returned(t) | End::Unwound(t) | End::AtEnd(t) => Some(t),
            End::Unfinished | End::NoExit => None,
        }
    }

    /// Duration when the call ended.
    pub fn duration(&self) -> Option<u64> {
        self.end_ns().map(|e| e.saturating_sub(self.entry_ns))
    }
}

/// A child of a call (or a root of the tree): a call, or a loss at that point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Node {
    /// Index into [`CallTree::calls`].
    Call(usize),
    /// A loss: time and what.
    Lost { ns: u64, what: Lost },
}

/// One step of a thread's calls, in time order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// A call begins, nested in `depth` open calls.
    Enter { func: u32, ns: u64, depth: u32 },
    /// The innermost open call (nested in `depth` others) ends; `at_ns` is when it
    /// ended, for an unfinished call its thread's last event time (never before its
    /// entry). In an entries-only trace every `Enter` is followed by its `Leave` with
    /// [`End::NoExit`].
    Leave {
        func: u32,
        entry_ns: u64,
        end: End,
        at_ns: u64,
        depth: u32,
    },
    /// A loss, inside the `depth` open calls.
    Lost { ns: u64, what: Lost, depth: u32 },
}

impl Step {
    /// Duration of an ending call, when it ended (as [`Call::duration`]).
    pub fn duration(&self) -> Option<u64> {
        match *self {
            Step::Leave {
                entry_ns,
                end: End::Returned(t) | End::Unwound(t) | End::AtEnd(t),
                ..
            } => Some(t.saturating_sub(entry_ns)),
            _ => None,
        }
    }
}

/// The calls of one thread as a stream, event by event: the nesting rules of
/// [`CallTree::build`] holding only the open calls.
#[derive(Debug, Clone, Default)]
pub struct Walk {
    has_exits: bool,
    /// (function, entry time) of the open calls, outermost first.
    open: Vec<(u32, u64)>,
    /// How many calls of each function are open, by function id (ids are dense from 0;
    /// those from [`COUNTED_IDS`] on, only in a damaged trace, are not counted): an EXIT
    /// of a function with none open is unmatched without a look through all the open
    /// calls (in a damaged trace, returns without entries under a deep stack made the
    /// walk quadratic).  A vector, not a map: a map cost `report` a third more time.
    open_count: Vec<u32>,
    /// EXITs without a matching open call.
    pub unmatched_exits: u64,
    /// Open calls looked at to match EXITs (each is then closed, so at most
    /// one look per ENTRY: the walk stays linear).
    searched: u64,
}

/// Function ids below this have their open calls counted in [`Walk`] (4 MB at most).
const COUNTED_IDS: usize = 1 << 20;

impl Walk {
    pub fn new(has_exits: bool) -> Walk {
        Walk {
            has_exits,
            ..Default::default()
        }
    }

    /// Calls `f` with the steps of every event and loss of `thread`, the calls still
    /// open at its end last (innermost first: ended at the image's end when
    /// [`Thread::open_until`] knows it, else unfinished).
    pub fn thread(thread: &Thread, has_exits: bool, mut f: impl FnMut(Step)) -> Walk {
        let mut walk = Walk::new(has_exits);
        thread.for_each(|i| match i {
            Item::Event(ev) => walk.event(&ev, &mut f),
            Item::Loss { ns, what } => walk.loss(ns, what, &mut f),
        });
        match thread.open_until {
            Some(end) => walk.finish_at(end, &mut f),
            None => walk.finish(thread.span().map_or(0, |(_, last)| last), &mut f),
        }
        walk
    }

    /// The steps of one event.
    pub fn event(&mut self, ev: &Event, f: &mut impl FnMut(Step)) {
        match ev.kind {
            EventKind::Entry => {
                let depth = self.open.len() as u32;
                f(Step::Enter {
                    func: ev.func,
                    ns: ev.ns,
                    depth,
                });
                if self.has_exits {
                    self.open.push((ev.func, ev.ns));
                    let i = ev.func as usize;
                    if i < COUNTED_IDS {
                        if i >= self.open_count.len() {
                            self.open_count.resize(i + 1, 0);
                        }
                        self.open_count[i] += 1;
                    }
                } else {
                    f(Step::Leave {
                        func: ev.func,
                        entry_ns: ev.ns,
                        end: End::NoExit,
                        at_ns: ev.ns,
                        depth,
                    });
                }
            }
            EventKind::Exit if ev.func == crate::format::UNWOUND_FUNC => {
                // The innermost open call was left without returning.
                if self.open.is_empty() {
                    self.unmatched_exits += 1;
                } else {
                    self.leave(End::Unwound(ev.ns), ev.ns, f);
                }
            }
            EventKind::Exit if (ev.func as usize) < COUNTED_IDS && self.open_count.get(ev.func as usize).is_none_or(|&n| n == 0) => {
                self.unmatched_exits += 1;
            }
            EventKind::Exit => match self.open.iter().rposition(|&(func, _)| func == ev.func) {
                Some(pos) => {
                    self.searched += (self.open.len() - pos) as u64;
                    while self.open.len() > pos + 1 {
                        self.leave(End::Unwound(ev.ns), ev.ns, f);
                    }
                    self.leave(End::Returned(ev.ns), ev.ns, f);
                }
                None => {
                    self.searched += self.open.len() as u64;
                    self.unmatched_exits += 1
                }
            },
        }
    }

    /// The step of a loss at time `ns`.
    pub fn loss(&mut self, ns: u64, what: Lost, f: &mut impl FnMut(Step)) {
        f(Step::Lost {
            ns,
            what,
            depth: self.open.len() as u32,
        });
    }

    /// Ends the calls still open as unfinished (the thread's last event was at
    /// `last_ns`).
    pub fn finish(&mut self, last_ns: u64, f: &mut impl FnMut(Step)) {
        while !self.open.is_empty() {
            self.leave(End::Unfinished, last_ns, f);
        }
    }

    /// Ends the calls still open as [`End::AtEnd`]: still running when the image ended
    /// at `end_ns`.
    pub fn finish_at(&mut self, end_ns: u64, f: &mut impl FnMut(Step)) {
        while let Some(&(_, entry_ns)) = self.open.last() {
            self.leave(End::AtEnd(end_ns.max(entry_ns)), end_ns, f);
        }
    }

    fn leave(&mut self, end: End, at_ns: u64, f: &mut impl FnMut(Step)) {
        if let Some((func, entry_ns)) = self.open.pop() {
            if let Some(n) = self.open_count.get_mut(func as usize) {
                *n -= 1;
            }
            f(Step::Leave {
                func,
                entry_ns,
                end,
                at_ns: at_ns.max(entry_ns),
                depth: self.open.len() as u32,
            });
        }
    }
}

/// The calls of one thread.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallTree {
    pub calls: Vec<Call>,
    pub roots: Vec<Node>,
    /// EXITs without a matching open call.
    pub unmatched_exits: u64,
    /// Time of the thread's last event (0 without events).
    pub last_ns: u64,
}

impl CallTree {
    /// Builds the tree of `thread`; `has_exits` is false for entry-only traces.
    pub fn build(thread: &Thread, has_exits: bool) -> CallTree {
        let mut tree = CallTree {
            last_ns: thread.span().map_or(0, |(_, last)| last),
            ..Default::default()
        };
        let mut open: Vec<usize> = Vec::new();
        thread.for_each(|item| {
            let ev = match item {
                Item::Loss { ns, what } => return tree.push(&open, Node::Lost { ns, what }),
                Item::Event(ev) => ev,
            };
            match ev.kind {
                EventKind::Entry => {
                    let idx = tree.calls.len();
                    tree.calls.push(Call {
                        func: ev.func,
                        entry_ns: ev.ns,
                        end: match (has_exits, thread.open_until) {
                            (false, _) => End::NoExit,
                            (true, None) => End::Unfinished,
                            (true, Some(end)) => End::AtEnd(end.max(ev.ns)),
                        },
                        depth: open.len() as u32,
                        children: Vec::new(),
                    });
                    tree.push(&open, Node::Call(idx));
                    if has_exits {
                        open.push(idx);
                    }
                }
                EventKind::Exit if ev.func == crate::format::UNWOUND_FUNC => {
                    // The innermost open call was left without returning.
                    match open.pop() {
                        Some(c) => tree.calls[c].end = End::Unwound(ev.ns),
                        None => tree.unmatched_exits += 1,
                    }
                }
                EventKind::Exit => {
                    match open.iter().rposition(|&c| tree.calls[c].func == ev.func) {
                        Some(pos) => {
                            for &inner in &open[pos + 1..] {
                                tree.calls[inner].end = End::Unwound(ev.ns);
                            }
                            tree.calls[open[pos]].end = End::Returned(ev.ns);
                            open.truncate(pos);
                        }
                        None => tree.unmatched_exits += 1,
                    }
                }
            }
        });
        tree
    }

    fn push(&mut self, open: &[usize], node: Node) {
        match open.last() {
            Some(&parent) => self.calls[parent].children.push(node),
            None => self.roots.push(node),
        }
    }

    /// Calls in depth-first (entry) order, with each call's parent.
    pub fn preorder(&self) -> Vec<(usize, Option<usize>)> {
        let mut out = Vec::with_capacity(self.calls.len());
        let mut stack: Vec<(usize, Option<usize>)> = Vec::new();
        let push_children =
            |stack: &mut Vec<(usize, Option<usize>)>, nodes: &[Node], parent: Option<usize>| {
                for n in nodes.iter().rev() {
                    if let Node::Call(c) = *n {
                        stack.push((c, parent));
                    }
                }
            };
        push_children(&mut stack, &self.roots, None);
        while let Some((c, parent)) = stack.pop() {
            out.push((c, parent));
            push_children(&mut stack, &self.calls[c].children, Some(c));
        }
        out
    }

    /// Self time of call `c`: its duration minus its direct children's durations.
    /// `None` when the call has not ended.
    pub fn self_ns(&self, c: usize) -> Option<u64> {
        let call = &self.calls[c];
        let d = call.duration()?;
        let children: u64 = call
            .children
            .iter()
            .filter_map(|n| match *n {
                Node::Call(k) => self.calls[k].duration(),
                Node::Lost { .. } => None,
            })
            .fold(0, u64::saturating_add);
        Some(d.saturating_sub(children))
    }

    /// End of call `c` for display of unfinished calls: its end, else the thread's last
    /// event time (never before its entry).
    pub fn end_or_last(&self, c: usize) -> u64 {
        let call = &self.calls[c];
        call.end_ns().unwrap_or(self.last_ns).max(call.entry_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read::{Event, Loss};

    fn ev(kind: EventKind, func: u32, ns: u64) -> Event {
        Event { kind, func, ns }
    }

    #[test]
    fn nesting_unwinding_and_unmatched() {
        use EventKind::*;
        let t = Thread {
            tid: 1,
            events: vec![
                ev(Entry, 0, 0),
                ev(Entry, 1, 10),
                ev(Exit, 1, 20),
                ev(Entry, 2, 30),
                ev(Entry, 3, 35),
                // 2 returns while 3 is open: 3 unwound.
                ev(Exit, 2, 50),
                ev(Exit, 9, 55),
                ev(Entry, 4, 60),
            ],
            losses: vec![Loss {
                at: 3,
                ns: 20,
                what: Lost::Events(5),
            }],
            ..Default::default()
        };
        let tree = CallTree::build(&t, true);
        assert_eq!(tree.roots, vec![Node::Call(0)]);
        assert_eq!(tree.calls[0].end, End::Unfinished);
        assert_eq!(
            tree.calls[0].children,
            vec![
                Node::Call(1),
                Node::Lost {
                    ns: 20,
                    what: Lost::Events(5)
                },
                Node::Call(2),
                Node::Call(4)
            ]
        );
        assert_eq!(tree.calls[1].end, End::Returned(20));
        assert_eq!(tree.calls[2].end, End::Returned(50));
        assert_eq!(tree.calls[3].end, End::Unwound(50));
        assert_eq!(tree.calls[3].depth, 2);
        assert_eq!(tree.unmatched_exits, 1);
        assert_eq!(tree.self_ns(2), Some(20 - 15));
        assert_eq!(tree.self_ns(0), None);
        assert_eq!(tree.end_or_last(0), 60);
        let order: Vec<usize> = tree.preorder().into_iter().map(|(c, _)| c).collect();
        assert_eq!(order, vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn unwound_markers_close_the_innermost_calls() {
        use crate::format::UNWOUND_FUNC as U;
        use EventKind::*;
        let t = Thread {
            tid: 1,
            // 0 { 1 { 2 { -- longjmp/exception back into 0 -- } } 3 {} }
            events: vec![
                ev(Entry, 0, 0),
                ev(Entry, 1, 10),
                ev(Entry, 2, 20),
                ev(Exit, U, 30),
                ev(Exit, U, 30),
                ev(Entry, 3, 40),
                ev(Exit, 3, 45),
                ev(Exit, U, 50),
                ev(Exit, U, 60),
            ],
            ..Default::default()
        };
        let tree = CallTree::build(&t, true);
        assert_eq!(tree.roots, vec![Node::Call(0)]);
        assert_eq!(
            tree.calls[0].children,
            vec![Node::Call(1), Node::Call(3)],
            "3 is 0's child, not nested in the unwound 1 and 2"
        );
        assert_eq!(tree.calls[1].children, vec![Node::Call(2)]);
        assert_eq!(
            (tree.calls[2].end, tree.calls[1].end),
            (End::Unwound(30), End::Unwound(30))
        );
        assert_eq!(
            (tree.calls[3].end, tree.calls[3].depth),
            (End::Returned(45), 1)
        );
        assert_eq!(tree.calls[0].end, End::Unwound(50));
        assert_eq!(tree.unmatched_exits, 1, "a marker with nothing open");
    }

    /// The steps of a tree, depth first: what [`Walk`] must give.
    fn tree_steps(tree: &CallTree) -> Vec<Step> {
        let mut out = Vec::new();
        // (node, depth, closing)
        let mut work: Vec<(Node, u32, bool)> =
            tree.roots.iter().rev().map(|&n| (n, 0, false)).collect();
        while let Some((node, depth, closing)) = work.pop() {
            match node {
                Node::Lost { ns, what } => out.push(Step::Lost { ns, what, depth }),
                Node::Call(c) => {
                    let call = &tree.calls[c];
                    let at_ns = if call.end == End::NoExit {
                        call.entry_ns
                    } else {
                        tree.end_or_last(c)
                    };
                    let leave = Step::Leave {
                        func: call.func,
                        entry_ns: call.entry_ns,
                        end: call.end,
                        at_ns,
                        depth,
                    };
                    if closing {
                        out.push(leave);
                        continue;
                    }
                    assert_eq!(call.depth, depth);
                    out.push(Step::Enter {
                        func: call.func,
                        ns: call.entry_ns,
                        depth,
                    });
                    if call.end == End::NoExit {
                        out.push(leave);
                    } else {
                        work.push((node, depth, true));
                        work.extend(call.children.iter().rev().map(|&k| (k, depth + 1, false)));
                    }
                }
            }
        }
        out
    }

    /// Random threads (recursion, unwound markers, EXITs of calls further out, EXITs
    /// with nothing open, losses anywhere, calls left open) walk as their trees.
    #[test]
    fn the_walk_is_the_trees_depth_first_order() {
        let mut r = crate::testgen::Rng::new(0x9e37_79b9_7f4a_7c15);
        let shape = crate::testgen::Shape { events: 120, funcs: 5, step_ns: 1000, loss_every: 12 };
        for round in 0..500 {
            let t = crate::testgen::thread(&mut r, 1, &shape);
            for has_exits in [true, false] {
                let tree = CallTree::build(&t, has_exits);
                let mut steps = Vec::new();
                let walk = Walk::thread(&t, has_exits, |s| steps.push(s));
                assert_eq!(
                    steps,
                    tree_steps(&tree),
                    "round {round}, has_exits {has_exits}: {:?} {:?}",
                    t.events,
                    t.losses
                );
                assert_eq!(walk.unmatched_exits, tree.unmatched_exits, "round {round}");
            }
        }
    }

    #[test]
    fn entries_only_is_flat() {
        let t = Thread {
            events: vec![ev(EventKind::Entry, 0, 1), ev(EventKind::Entry, 1, 2)],
            ..Default::default()
        };
        let tree = CallTree::build(&t, false);
        assert_eq!(tree.roots, vec![Node::Call(0), Node::Call(1)]);
        assert!(tree
            .calls
            .iter()
            .all(|c| c.end == End::NoExit && c.depth == 0));
    }

    /// A damaged trace (found by fuzzing): n entries, then n returns of a function none
    /// of them entered.  Each return looked through every open call: n² steps (for
    /// 100 000, minutes; `report` of one 800 KB chunk like it took 12 s).  Counted in
    /// steps, not timed.
    #[test]
    fn returns_without_entries_under_a_deep_stack_are_not_quadratic() {
        let n = 20_000;
        let mut events = Vec::new();
        for i in 0..n {
            events.push(ev(EventKind::Entry, (i % 3) as u32, i));
        }
        for i in 0..n {
            events.push(ev(EventKind::Exit, 7, n + i));
        }
        // And one that matches the outermost call: the rest are unwound.
        events.push(ev(EventKind::Exit, 0, 2 * n));
        let t = Thread {
            events,
            ..Default::default()
        };
        let mut leaves = 0;
        let walk = Walk::thread(&t, true, |s| leaves += matches!(s, Step::Leave { .. }) as u64);
        assert_eq!((walk.unmatched_exits, leaves), (n, n));
        assert!(walk.searched <= n, "{} open calls looked at for {n} returns", walk.searched);
    }

    #[test]
    fn deep_recursion_does_not_recurse() {
        let n = 200_000;
        let mut events = Vec::new();
        for i in 0..n {
            events.push(ev(EventKind::Entry, 7, i));
        }
        for i in 0..n {
            events.push(ev(EventKind::Exit, 7, n + i));
        }
        let tree = CallTree::build(
            &Thread {
                events,
                ..Default::default()
            },
            true,
        );
        assert_eq!(tree.preorder().len(), n as usize);
        assert_eq!(tree.calls[n as usize - 1].depth, n as u32 - 1);
        assert_eq!(tree.calls[0].duration(), Some(2 * n - 1));
    }
}
