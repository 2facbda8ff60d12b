//! `ftramp dump`: a trace in other tools' formats.
//!
//! - [`chrome`]: Chrome trace-event JSON (the JSON object form), which the Perfetto UI
//!   and `chrome://tracing` open. Each call is a `B`/`E` pair on its thread (`ts` in
//!   microseconds since the start of the trace); a call still running when its image
//!   ended (`exit()`, a fatal signal, `exec`) ends then with `args.at_exit`, an unfinished
//!   one (no known end) at its thread's last event with `args.unfinished`, an unwound one
//!   carries `args.unwound`; lost events
//!   are instant (`i`) events; processes and threads get `process_name`/`thread_name`
//!   metadata. `function` tracer traces give instant events only.
//! - [`folded`]: folded stacks, one `frame;frame;... value` line per distinct stack with
//!   its self time in nanoseconds (the input of flamegraph.pl and inferno). By default the
//!   stacks start with a process frame (`exe [pid]`) and a thread frame (`tid N`);
//!   `function` tracer traces count calls instead of time.

use crate::calls::{End, Step, Walk};
use crate::read::{Thread, Trace};
use crate::replay::{name, names_of, Select};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::io::{self, Write};

/// Deepest stack written to folded output; the self time of deeper calls is added to a
/// `[deeper]` frame (a folded line repeats its whole stack, so a very deep recursion would
/// otherwise make the output quadratic).
pub const MAX_FOLDED_DEPTH: usize = 1000;

/// A JSON string literal.
pub fn json_str(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            '\r' => o.push_str("\\r"),
            '\t' => o.push_str("\\t"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// Nanoseconds as microseconds with three decimals (exact).
struct Us(u64);

impl std::fmt::Display for Us {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{:03}", self.0 / 1000, self.0 % 1000)
    }
}

/// Writes Chrome trace-event JSON of the selected threads.
pub fn chrome(trace: &Trace, select: &Select, out: &mut dyn Write) -> io::Result<()> {
    chrome_by(trace, select, out, &mut chrome_thread)
}

/// What a thread's Chrome events are written with.
struct ChromeThread<'a> {
    pid: u32,
    has_exits: bool,
    start: u64,
    /// The process's function names as JSON strings, by id.
    jnames: &'a [String],
}

/// Writes a thread's events, each as `,\n{...}` (never the first element: the process's
/// `process_name` came before).
type ThreadWriter<'w> = dyn FnMut(&mut dyn Write, &ChromeThread, &Thread) -> io::Result<()> + 'w;

/// [`chrome`] with the threads' events written by `thread`.
fn chrome_by(
    trace: &Trace,
    select: &Select,
    out: &mut dyn Write,
    thread: &mut ThreadWriter,
) -> io::Result<()> {
    let has_exits = trace.info.has_exits();
    let start = trace.start_ns();
    writeln!(out, "{{\"displayTimeUnit\":\"ns\",")?;
    writeln!(
        out,
        "\"otherData\":{{\"trace\":{},\"tracer\":{},\"command\":{},\"start_ns\":{start}}},",
        json_str(&trace.dir.display().to_string()),
        json_str(&trace.info.tracer),
        json_str(&trace.info.command.join(" "))
    )?;
    write!(out, "\"traceEvents\":[")?;
    let mut first = true;
    let mut ev = |out: &mut dyn Write, body: String| -> io::Result<()> {
        let sep = if first { "\n" } else { ",\n" };
        first = false;
        write!(out, "{sep}{body}")
    };
    // One process_name per pid (exec'd images share the pid): their names joined.
    let mut pid_names: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for p in trace.processes.iter().filter(|p| select.process(p)) {
        let v = pid_names.entry(p.pid).or_default();
        if !v.iter().any(|n| n == p.short_name()) {
            v.push(p.short_name().to_string());
        }
    }
    for (pid, names) in &pid_names {
        ev(
            out,
            format!(
                "{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{pid},\"tid\":{pid},\"args\":{{\"name\":{}}}}}",
                json_str(&names.join(" -> "))
            ),
        )?;
    }
    for p in trace.processes.iter().filter(|p| select.process(p)) {
        let jnames: Vec<String> = names_of(p).iter().map(|n| json_str(n)).collect();
        let pid = p.pid;
        for t in p.threads.iter().filter(|t| select.thread(t)) {
            let tid = t.tid;
            if p.image == 0 || !trace.processes.iter().any(|q| q.pid == pid && q.image == 0) {
                let tname = if tid == pid {
                    format!("{} (main)", p.short_name())
                } else {
                    format!("thread {tid}")
                };
                ev(
                    out,
                    format!(
                        "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{pid},\"tid\":{tid},\"args\":{{\"name\":{}}}}}",
                        json_str(&tname)
                    ),
                )?;
            }
            let ctx = ChromeThread {
                pid,
                has_exits,
                start,
                jnames: &jnames,
            };
            thread(out, &ctx, t)?;
        }
    }
    writeln!(out, "\n]}}")
}

/// The Chrome events of thread `t`: `B`/`E` per call (instants without exits), losses as
/// instants.
fn chrome_thread(out: &mut dyn Write, c: &ChromeThread, t: &Thread) -> io::Result<()> {
    let (pid, tid, start, has_exits) = (c.pid, t.tid, c.start, c.has_exits);
    let func_name = |f: u32| match c.jnames.get(f as usize) {
        Some(n) => Cow::Borrowed(n.as_str()),
        None => Cow::Owned(json_str(&format!("#{f}"))),
    };
    const INSTANT: &str = "i\",\"s\":\"t";
    let mut result = Ok(());
    Walk::thread(t, has_exits, |s| {
        if result.is_err() {
            return;
        }
        let (n, cat, ph, ns, args) = match s {
            Step::Lost { ns, what, .. } => (Cow::Owned(json_str(&what.to_string())), "lost", INSTANT, ns, ""),
            Step::Enter { func, ns, .. } => (func_name(func), "function", if has_exits { "B" } else { INSTANT }, ns, ""),
            Step::Leave { end: End::NoExit, .. } => return,
            Step::Leave { func, end, at_ns, .. } => {
                let args = match end {
                    End::Unwound(_) => ",\"args\":{\"unwound\":true}",
                    End::Unfinished => ",\"args\":{\"unfinished\":true}",
                    End::AtEnd(_) => ",\"args\":{\"at_exit\":true}",
                    End::Returned(_) | End::NoExit => "",
                };
                (func_name(func), "function", "E", at_ns, args)
            }
        };
        result = chrome_event(out, &n, cat, ph, pid, tid, Us(ns.saturating_sub(start)), args);
    });
    result
}

/// One Chrome event, after a comma.  An `E` has no name or category: the
/// format pairs it with the thread's innermost open `B` (its `name` and
/// `cat` are optional, and would repeat the `B`'s: about a fifth of a
/// dump's size).
#[allow(clippy::too_many_arguments)]
fn chrome_event(out: &mut dyn Write, name: &str, cat: &str, ph: &str, pid: u32, tid: u32, ts: Us, args: &str) -> io::Result<()> {
    if ph == "E" {
        write!(out, ",\n{{\"ph\":\"E\",\"pid\":{pid},\"tid\":{tid},\"ts\":{ts}{args}}}")
    } else {
        write!(out, ",\n{{\"name\":{name},\"cat\":\"{cat}\",\"ph\":\"{ph}\",\"pid\":{pid},\"tid\":{tid},\"ts\":{ts}{args}}}")
    }
}

/// Options of [`folded`].
#[derive(Debug, Clone, Default)]
pub struct FoldOptions {
    pub select: Select,
    /// One set of stacks for the whole trace, without process and thread frames.
    pub merged: bool,
}

/// Folded stacks of the selected threads, sorted: `a;b;c <self ns>` (calls for `function`
/// tracer traces). Calls running at exit count until the image ended, unfinished ones until
/// their thread's last event.
pub fn folded(trace: &Trace, opts: &FoldOptions) -> Vec<String> {
    let has_exits = trace.info.has_exits();
    let mut stacks: BTreeMap<String, u64> = BTreeMap::new();
    for p in trace.processes.iter().filter(|p| opts.select.process(p)) {
        let names: Vec<String> = names_of(p).into_iter().map(|n| frame(&n)).collect();
        for t in p.threads.iter().filter(|t| opts.select.thread(t)) {
            let prefix = if opts.merged {
                String::new()
            } else {
                format!("{} [{}];tid {};", frame(p.short_name()), p.pid, t.tid)
            };
            // The current stack as a string; per open call, the path length before it
            // and the time of its direct children that ended.
            let mut path = prefix.clone();
            let mut marks: Vec<(usize, u64)> = Vec::new();
            Walk::thread(t, has_exits, |s| match s {
                Step::Enter { func, .. } => {
                    let before = path.len();
                    if marks.len() < MAX_FOLDED_DEPTH {
                        if !marks.is_empty() {
                            path.push(';');
                        }
                        path.push_str(&name(&names, func));
                    } else if marks.len() == MAX_FOLDED_DEPTH {
                        path.push_str(";[deeper]");
                    }
                    marks.push((before, 0));
                }
                Step::Leave {
                    entry_ns,
                    end,
                    at_ns,
                    ..
                } => {
                    let Some((before, children)) = marks.pop() else {
                        return;
                    };
                    // Self time (unfinished calls until the thread's last event); a
                    // call of an entries-only trace counts 1.
                    let total = at_ns - entry_ns;
                    let value = if end == End::NoExit {
                        1
                    } else {
                        total.saturating_sub(children)
                    };
                    if value > 0 {
                        match stacks.get_mut(&path) {
                            Some(e) => *e = e.saturating_add(value),
                            None => {
                                stacks.insert(path.clone(), value);
                            }
                        }
                    }
                    path.truncate(before);
                    if let Some(parent) = marks.last_mut() {
                        parent.1 = parent.1.saturating_add(total);
                    }
                }
                Step::Lost { .. } => {}
            });
        }
    }
    stacks
        .into_iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect()
}

/// A function name usable as a folded frame (`;` separates frames, newlines end lines).
fn frame(n: &str) -> String {
    n.replace([';', '\n', '\r'], ":")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calls::{CallTree, Node};
    use crate::read::{Event, EventKind, Process, TraceInfo};

    // The Chrome and folded writers as they were over the whole call tree: the models
    // the streaming ones must match.
    fn tree_chrome_thread(out: &mut dyn Write, c: &ChromeThread, t: &Thread) -> io::Result<()> {
        let (pid, tid, start, has_exits, jnames) = (c.pid, t.tid, c.start, c.has_exits, c.jnames);
            let tree = CallTree::build(t, has_exits);
            let mut work: Vec<(Node, bool)> =
                tree.roots.iter().rev().map(|&n| (n, false)).collect();
            while let Some((node, close)) = work.pop() {
                let (n, cat, ph, ns, args) = match node {
                    Node::Lost { ns, what } => {
                        let n = json_str(&what.to_string());
                        (Cow::Owned(n), "lost", "i\",\"s\":\"t", ns, "")
                    }
                    Node::Call(c) => {
                        let call = &tree.calls[c];
                        let n = match jnames.get(call.func as usize) {
                            Some(n) => Cow::Borrowed(n.as_str()),
                            None => Cow::Owned(json_str(&format!("#{}", call.func))),
                        };
                        if call.end == End::NoExit {
                            (n, "function", "i\",\"s\":\"t", call.entry_ns, "")
                        } else if !close {
                            work.push((node, true));
                            work.extend(call.children.iter().rev().map(|&k| (k, false)));
                            (n, "function", "B", call.entry_ns, "")
                        } else {
                            let args = match call.end {
                                End::Unwound(_) => ",\"args\":{\"unwound\":true}",
                                End::Unfinished => ",\"args\":{\"unfinished\":true}",
                                End::AtEnd(_) => ",\"args\":{\"at_exit\":true}",
                                End::Returned(_) | End::NoExit => "",
                            };
                            (n, "function", "E", tree.end_or_last(c), args)
                        }
                    }
                };
                // Never the first element: the process's process_name came before.
                super::chrome_event(out, &n, cat, ph, pid, tid, Us(ns.saturating_sub(start)), args)?;
            }
        Ok(())
    }

    fn tree_folded(trace: &Trace, opts: &FoldOptions) -> Vec<String> {
        let has_exits = trace.info.has_exits();
        let mut stacks: BTreeMap<String, u64> = BTreeMap::new();
        for p in trace.processes.iter().filter(|p| opts.select.process(p)) {
            let names: Vec<String> = names_of(p).into_iter().map(|n| frame(&n)).collect();
            for t in p.threads.iter().filter(|t| opts.select.thread(t)) {
                let tree = CallTree::build(t, has_exits);
                let prefix = if opts.merged {
                    String::new()
                } else {
                    format!("{} [{}];tid {};", frame(p.short_name()), p.pid, t.tid)
                };
                // The current stack as a string, and where each frame starts in it.
                let mut path = prefix.clone();
                let mut marks: Vec<(usize, usize)> = Vec::new(); // (call, path length before it)
                for (c, parent) in tree.preorder() {
                    while let Some(&(top, len)) = marks.last() {
                        if Some(top) == parent {
                            break;
                        }
                        marks.pop();
                        path.truncate(len);
                    }
                    let call = &tree.calls[c];
                    let before = path.len();
                    if marks.len() < MAX_FOLDED_DEPTH {
                        if marks.is_empty() {
                            path.truncate(prefix.len());
                        } else {
                            path.push(';');
                        }
                        path.push_str(&name(&names, call.func));
                    } else if marks.len() == MAX_FOLDED_DEPTH {
                        path.push_str(";[deeper]");
                    }
                    marks.push((c, before));
                    let value = if call.end == End::NoExit {
                        Some(1)
                    } else {
                        self_or_last(&tree, c)
                    };
                    if let Some(v) = value.filter(|&v| v > 0) {
                        match stacks.get_mut(&path) {
                            Some(e) => *e = e.saturating_add(v),
                            None => {
                                stacks.insert(path.clone(), v);
                            }
                        }
                    }
                }
            }
        }
        stacks
            .into_iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect()
    }

    /// Self time of a call, unfinished calls running until the thread's last event.
    fn self_or_last(tree: &CallTree, c: usize) -> Option<u64> {
        let call = &tree.calls[c];
        let total = tree.end_or_last(c) - call.entry_ns;
        let children: u64 = call
            .children
            .iter()
            .filter_map(|n| match *n {
                Node::Call(k) if tree.calls[k].end != End::NoExit => {
                    Some(tree.end_or_last(k) - tree.calls[k].entry_ns)
                }
                _ => None,
            })
            .fold(0, u64::saturating_add);
        Some(total.saturating_sub(children))
    }

    /// Random traces (losses anywhere, unwound and unfinished calls, recursion deeper
    /// than the folded limit, entries-only traces) dump as over the call tree.
    #[test]
    fn streaming_dumps_are_the_tree_writers() {
        let mut r = crate::testgen::Rng::new(0xdead_beef_1234_5678);
        let shape = crate::testgen::Shape { events: 80, funcs: 5, step_ns: 100, loss_every: 10 };
        for round in 0..400 {
            let mut threads = Vec::new();
            for tid in 1..=2 + r.below(2) as u32 {
                let deep = r.below(8) == 0;
                let mut t = crate::testgen::thread(&mut r, tid, &shape);
                let ns = t.events.last().map_or(0, |e| e.ns);
                if deep {
                    // Past MAX_FOLDED_DEPTH.
                    for i in 0..MAX_FOLDED_DEPTH as u64 + 3 {
                        t.events.push(Event {
                            kind: EventKind::Entry,
                            func: 3,
                            ns: ns + i,
                        });
                    }
                }
                threads.push(t);
            }
            let tracer = if r.below(4) == 0 {
                "function"
            } else {
                "function_graph"
            };
            let trace = Trace {
                dir: "t.data".into(),
                info: TraceInfo {
                    tracer: tracer.into(),
                    ..Default::default()
                },
                processes: vec![Process {
                    pid: 1,
                    exe: "/bin/p;q".into(),
                    threads,
                    ..Default::default()
                }],
                problems: Vec::new(),
            };
            let select = Select::default();
            let (mut want, mut got) = (Vec::new(), Vec::new());
            chrome_by(&trace, &select, &mut want, &mut tree_chrome_thread).unwrap();
            chrome(&trace, &select, &mut got).unwrap();
            assert_eq!(
                String::from_utf8(got).unwrap(),
                String::from_utf8(want).unwrap(),
                "round {round}: chrome"
            );
            for merged in [false, true] {
                let o = FoldOptions {
                    merged,
                    ..Default::default()
                };
                assert_eq!(
                    folded(&trace, &o),
                    tree_folded(&trace, &o),
                    "round {round}: folded, merged {merged}"
                );
            }
        }
    }

    #[test]
    fn json_strings() {
        assert_eq!(json_str("a\"b\\c\n\u{1}é"), "\"a\\\"b\\\\c\\n\\u0001é\"");
        assert_eq!(Us(1_234_567).to_string(), "1234.567");
        assert_eq!(Us(5).to_string(), "0.005");
        assert_eq!(frame("a;b\nc"), "a:b:c");
    }
}
