//! `ftramp replay`: the call graph of a trace in the style of ftrace's `function_graph`
//! output (and uftrace's replay):
//!
//! ```text
//! # DURATION     TID     FUNCTION
//!             [  4242] | main() {
//!    0.120 us [  4242] |   leaf();
//!             [  4242] |   parent() {
//!    1.250 us [  4242] |     child();
//!    2.003 us [  4242] |   } /* parent */
//!    3.500 us [  4242] | } /* main */
//! ```
//!
//! One section per process image and, inside it, per thread. Returns and leaf calls
//! carry their duration; calls still open when their process image ended (`exit()` called
//! inside them, a fatal signal, `exec`) are marked `running at exit`, with their time until
//! then; calls without an EXIT and no known end (the thread exited inside them, the image
//! was killed unseen) `unfinished`, calls left by an outer return (longjmp, exceptions)
//! `unwound`, and lost
//! events are shown where they happened. `function` tracer traces (entries only) print one
//! line per entry with its time since the start of the trace.

use crate::calls::{End, Step, Walk};
use crate::read::{Process, Thread, Trace};
use std::io::{self, Write};

/// Which processes and threads to show.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Select {
    pub pid: Option<u32>,
    pub tid: Option<u32>,
}

impl Select {
    pub fn process(&self, p: &Process) -> bool {
        (self.pid.is_none() || self.pid == Some(p.pid))
            && (self.tid.is_none() || p.threads.iter().any(|t| Some(t.tid) == self.tid))
    }

    pub fn thread(&self, t: &Thread) -> bool {
        self.tid.is_none() || self.tid == Some(t.tid)
    }

    /// The selected threads of the trace with their process.
    pub fn threads<'a>(
        &'a self,
        trace: &'a Trace,
    ) -> impl Iterator<Item = (&'a Process, &'a Thread)> + 'a {
        trace
            .processes
            .iter()
            .filter(|p| self.process(p))
            .flat_map(move |p| {
                p.threads
                    .iter()
                    .filter(|t| self.thread(t))
                    .map(move |t| (p, t))
            })
    }
}

/// Function-name globs (`*`, `?`, `[...]`), e.g. `-F 'foo*'`, by the rule of `ftramp
/// record`'s filters ([`NamePattern`](ftramp_demangle::NamePattern)): a pattern matches the
/// name equal to it (`<mini::Holder<[u8]>>::show`), and `{`/`}` are plain characters
/// (`std::rt::lang_start::<()>::{closure#0}`; until the twenty-eighth session replay took
/// them as alternatives and such names selected nothing: `globs`).
#[derive(Debug, Clone, Default)]
pub struct Globs {
    patterns: Vec<ftramp_demangle::NamePattern>,
}

impl Globs {
    /// Compiles `patterns` (a pattern that is no glob, `f[z-a]`, is a name).
    pub fn new(patterns: &[String]) -> Result<Globs, String> {
        Ok(Globs {
            patterns: patterns.iter().map(|p| ftramp_demangle::NamePattern::new(p)).collect(),
        })
    }

    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    pub fn matches(&self, name: &str) -> bool {
        self.patterns.iter().any(|p| p.matches(name))
    }
}

/// What `replay` shows.
#[derive(Debug, Clone, Default)]
pub struct ReplayOptions {
    pub select: Select,
    /// Show only the subtrees of matching functions (`-F`).
    pub filter: Globs,
    /// Hide the subtrees of matching functions (`-N`).
    pub notrace: Globs,
    /// Show calls nested at most this deep (1 = only the outermost shown calls).
    pub depth: Option<u32>,
    /// Hide calls (and their subtrees) shorter than this.
    pub min_ns: Option<u64>,
}

/// A duration in uftrace's style, 10 characters: `  1.088 us`, ` 12.345 ms`, `  2.000  s`.
pub fn fmt_duration(ns: u64) -> String {
    Duration(ns).to_string()
}

/// [`fmt_duration`] without allocating.
#[derive(Debug, Clone, Copy)]
pub struct Duration(pub u64);

impl std::fmt::Display for Duration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ns = self.0;
        let (unit, div) = if ns < 1_000_000 {
            ("us", 1_000)
        } else if ns < 1_000_000_000 {
            ("ms", 1_000_000)
        } else {
            (" s", 1_000_000_000)
        };
        let whole = ns / div;
        let frac = ns % div * 1000 / div;
        // `whole.frac` right-aligned in 7 columns.
        let digits = whole.checked_ilog10().unwrap_or(0) as usize + 1;
        let pad = 7usize.saturating_sub(digits + 4);
        write!(f, "{:pad$}{whole}.{frac:03} {unit}", "")
    }
}

const BLANK: &str = "          ";

/// Column header of function_graph sections.
pub const GRAPH_HEADER: &str = "# DURATION     TID     FUNCTION";
/// Column header of `function` tracer sections.
pub const FLAT_HEADER: &str = "#      TIMESTAMP      TID     FUNCTION";

/// Writes the replay of `trace` to `out`.
pub fn replay(trace: &Trace, opts: &ReplayOptions, out: &mut dyn Write) -> io::Result<()> {
    let has_exits = trace.info.has_exits();
    let tracer = if trace.info.tracer.is_empty() {
        "function_graph?"
    } else {
        trace.info.tracer.as_str()
    };
    let mut out = Lazy {
        w: out,
        pending: String::new(),
    };
    writeln!(
        out,
        "# ftramp replay: {} ({tracer}): {}",
        trace.dir.display(),
        shell_words(&trace.info.command)
    )?;
    // With filters, processes and threads that show nothing are left out.
    let filtering = !opts.filter.is_empty() || !opts.notrace.is_empty() || opts.min_ns.is_some();
    let start = trace.start_ns();
    for p in trace.processes.iter().filter(|p| opts.select.process(p)) {
        out.pending = format!("#\n{}\n", process_line(p));
        if !filtering {
            out.emit_pending()?;
        }
        let names: Vec<String> = names_of(p);
        let filter = Matcher::new(&opts.filter, p, &names);
        let notrace = Matcher::new(&opts.notrace, p, &names);
        for t in p.threads.iter().filter(|t| opts.select.thread(t)) {
            let mark = out.pending.len();
            out.pending.push('\n');
            if let Some(note) = thread_note(t) {
                out.pending
                    .push_str(&format!("# thread {}: {note}\n", t.tid));
            }
            if has_exits {
                out.pending.push_str(GRAPH_HEADER);
                out.pending.push('\n');
                let unmatched = graph(t, &names, &filter, &notrace, opts, &mut out)?;
                if unmatched > 0 {
                    writeln!(
                        out,
                        "# thread {}: {unmatched} returns without a recorded entry ignored",
                        t.tid
                    )?;
                }
            } else {
                out.pending.push_str(FLAT_HEADER);
                out.pending.push('\n');
                flat(t, &names, &filter, &notrace, start, &mut out)?;
            }
            // Nothing shown: drop the thread's header lines.
            out.pending.truncate(mark);
        }
        out.pending.clear();
    }
    Ok(())
}

/// A writer that writes its pending header lines before the first thing written.
struct Lazy<'a> {
    w: &'a mut dyn Write,
    pending: String,
}

impl Lazy<'_> {
    fn emit_pending(&mut self) -> io::Result<()> {
        if !self.pending.is_empty() {
            self.w.write_all(self.pending.as_bytes())?;
            self.pending.clear();
        }
        Ok(())
    }
}

impl Write for Lazy<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.emit_pending()?;
        self.w.write(buf)
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.emit_pending()?;
        self.w.write_all(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.w.flush()
    }
}

/// Which function ids of a process match a [`Globs`] (by display or raw symbol name),
/// decided once per id.
struct Matcher<'a> {
    globs: &'a Globs,
    hit: Vec<bool>,
}

impl<'a> Matcher<'a> {
    fn new(globs: &'a Globs, p: &Process, names: &[String]) -> Matcher<'a> {
        let hit = if globs.is_empty() {
            Vec::new()
        } else {
            names
                .iter()
                .enumerate()
                .map(|(id, n)| {
                    globs.matches(n)
                        || p.symbol(id as u32)
                            .is_some_and(|s| s.name != *n && globs.matches(&s.name))
                })
                .collect()
        };
        Matcher { globs, hit }
    }

    fn is_empty(&self) -> bool {
        self.globs.is_empty()
    }

    fn matches(&self, func: u32) -> bool {
        if self.globs.is_empty() {
            return false;
        }
        match self.hit.get(func as usize) {
            Some(&h) => h,
            None => self.globs.matches(&format!("#{func}")),
        }
    }
}

/// Display names of a process's function ids (dense), for quick lookup.
/// Ids are dense from 0; a damaged `.sym` line with a huge id does not make the table huge
/// (such an id is shown as `#id`).
pub(crate) fn names_of(p: &Process) -> Vec<String> {
    let max = p
        .symbols
        .last()
        .map(|s| s.id as usize + 1)
        .unwrap_or(0)
        .min(p.symbols.len() + 4096);
    (0..max as u32).map(|id| p.func_name(id)).collect()
}

pub(crate) fn name(names: &[String], p_func: u32) -> std::borrow::Cow<'_, str> {
    match names.get(p_func as usize) {
        Some(n) => std::borrow::Cow::Borrowed(n.as_str()),
        None => std::borrow::Cow::Owned(format!("#{p_func}")),
    }
}

/// `words` as a shell would need them to run the same command: a word
/// with a space, a quote or another character special to the shell in
/// single quotes (`sh -c '"/usr/bin/postgres" -V'`, not `sh -c
/// "/usr/bin/postgres" -V`, which reads as three words), an empty one as
/// `''`, the others as they are.
pub fn shell_words(words: &[String]) -> String {
    let plain = |w: &str| !w.is_empty() && w.bytes().all(|b| b.is_ascii_alphanumeric() || b"_./:=@%+,-".contains(&b));
    let quoted: Vec<String> = words.iter().map(|w| if plain(w) { w.clone() } else { format!("'{}'", w.replace('\'', "'\\''")) }).collect();
    quoted.join(" ")
}

/// `# process 12 image 0: /bin/demo arg (forked from 11-0; exit: code 0; lost 3 events)`.
pub fn process_line(p: &Process) -> String {
    let mut s = format!(
        "# process {} image {}: {}",
        p.pid,
        p.image,
        if p.exe.is_empty() { "?" } else { &p.exe }
    );
    if p.args.len() > 1 {
        s.push(' ');
        s.push_str(&shell_words(&p.args[1..]));
    }
    let mut notes = Vec::new();
    if let Some((pid, n)) = p.forked_from {
        notes.push(format!("forked from {pid}-{n}"));
    }
    match &p.exit {
        Some(e) => notes.push(format!("exit: {e}")),
        // The recorder writes the `exit` line as the image ends, whatever
        // ends it but SIGKILL (or an exit system call made directly, or a
        // process still running): its last events may be missing too.
        None if p.info_empty => notes.push("exit: not recorded (its .info is empty: the trace could not be written, a full disk, or it was killed as it started)".into()),
        None => notes.push("exit: not recorded (SIGKILL, or still running)".into()),
    }
    if p.lost > 0 {
        notes.push(format!("lost {} events", p.lost));
    }
    if !notes.is_empty() {
        s.push_str(&format!(" ({})", notes.join("; ")));
    }
    s
}

fn thread_note(t: &Thread) -> Option<String> {
    let mut notes = Vec::new();
    if t.lost > 0 {
        notes.push(crate::read::Lost::Events(t.lost).to_string());
    }
    if t.lost_chunks > 0 {
        let s = if t.lost_chunks == 1 { "" } else { "s" };
        notes.push(format!("{} chunk{s} missing", t.lost_chunks));
    }
    (!notes.is_empty()).then(|| notes.join(", "))
}

fn line(
    out: &mut dyn Write,
    dur: Option<u64>,
    tid: u32,
    depth: u32,
    text: std::fmt::Arguments<'_>,
) -> io::Result<()> {
    use std::fmt::Write as _;
    // Made in a string and written at once: formatting piece by piece through the
    // writers took half of a replay's time.
    thread_local! {
        static LINE: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
    }
    LINE.with_borrow_mut(|b| {
        b.clear();
        // (Writing to a String cannot fail.)
        let _ = match dur {
            Some(d) => write!(b, " {} [{tid:>6}] | ", Duration(d)),
            None => write!(b, " {BLANK} [{tid:>6}] | "),
        };
        b.extend(std::iter::repeat_n(' ', 2 * depth as usize));
        let _ = writeln!(b, "{text}");
        out.write_all(b.as_bytes())
    })
}

/// What an open call is to [`Graph`].
#[derive(Debug, Clone, Copy)]
enum Shown {
    /// Not shown, nor anything inside it (`-N`, deeper than `--depth`).
    Skip,
    /// Not shown, but calls inside it may be (outside any `-F` match).
    Through,
    /// Shown at `depth` unless `--min` hides it when it ends. `opened`: its `name() {`
    /// line is written (something inside it is shown), else its line waits at
    /// [`Graph::held`]`[mark]`.
    At {
        depth: u32,
        opened: bool,
        mark: usize,
    },
}

/// A line of [`Graph::held`].
#[derive(Debug)]
enum Held {
    /// The opening line of a call not yet known to be shown or to have shown calls
    /// inside it (written as `name() {` if it turns out to).
    Open { func: u32, depth: u32 },
    /// A loss inside such a call.
    Lost { depth: u32, what: crate::read::Lost },
}

/// The function_graph printer of one thread, fed its [`Step`]s. A call's line is written
/// once it is known to be shown and whether anything inside it is: a call with a shown
/// call inside becomes `name() {` … `}`, one without `name();` with its duration. Without
/// `--min` that is known at the next step; with it, only when the call ends (shorter calls
/// are hidden with everything inside them), so the lines of the open calls not yet known
/// wait in `held`. A shown call inside shows every open call around it (it cannot be
/// shorter than them), so the held lines are always those of the innermost open calls and
/// are written or dropped together.
struct Graph<'a> {
    tid: u32,
    names: &'a [String],
    filter: &'a Matcher<'a>,
    notrace: &'a Matcher<'a>,
    max_depth: u32,
    min_ns: Option<u64>,
    open: Vec<Shown>,
    held: Vec<Held>,
}

impl Graph<'_> {
    fn step(&mut self, s: Step, out: &mut dyn Write) -> io::Result<()> {
        match s {
            Step::Enter { func, .. } => {
                let ctx = match self.open.last() {
                    None if self.filter.is_empty() => Some(0),
                    None | Some(Shown::Through) => None,
                    Some(Shown::Skip) => {
                        self.open.push(Shown::Skip);
                        return Ok(());
                    }
                    Some(&Shown::At { depth, .. }) => Some(depth + 1),
                };
                let shown = if self.notrace.matches(func) {
                    Shown::Skip
                } else {
                    match ctx.or_else(|| self.filter.matches(func).then_some(0)) {
                        None => Shown::Through,
                        Some(depth) if depth >= self.max_depth => Shown::Skip,
                        Some(depth) => {
                            if self.min_ns.is_none() {
                                // Shown: so is every call around it.
                                self.release(out)?;
                            }
                            self.held.push(Held::Open { func, depth });
                            Shown::At {
                                depth,
                                opened: false,
                                mark: self.held.len() - 1,
                            }
                        }
                    }
                };
                self.open.push(shown);
            }
            Step::Lost { what, .. } => {
                let depth = match self.open.last() {
                    None if self.filter.is_empty() => 0,
                    Some(&Shown::At { depth, .. }) => depth + 1,
                    _ => return Ok(()),
                };
                if depth < self.max_depth {
                    // Nothing held: the calls around it are all shown and opened.
                    let now = self.min_ns.is_none() || self.held.is_empty();
                    self.held.push(Held::Lost { depth, what });
                    if now {
                        self.release(out)?;
                    }
                }
            }
            Step::Leave { func, end, .. } => {
                let Some(Shown::At {
                    depth,
                    opened,
                    mark,
                }) = self.open.pop()
                else {
                    return Ok(());
                };
                let dur = s.duration();
                let name = name(self.names, func);
                let hidden = !opened && matches!((self.min_ns, dur), (Some(min), Some(d)) if d < min);
                if hidden {
                    // Hidden, with everything inside it.
                    self.held.truncate(mark);
                    return Ok(());
                }
                if opened || self.held.len() > mark + 1 {
                    // Something inside it is shown (held losses: written now):
                    // `name() {` … `}`.
                    self.release(out)?;
                    let how = match end {
                        End::Returned(_) => "",
                        End::Unwound(_) => ": unwound",
                        End::AtEnd(_) => ": running at exit",
                        End::Unfinished | End::NoExit => ": unfinished",
                    };
                    return line(
                        out,
                        dur,
                        self.tid,
                        depth,
                        format_args!("}} /* {name}{how} */"),
                    );
                }
                self.held.truncate(mark);
                // Shown without anything inside: the calls around it are shown.
                self.release(out)?;
                let how = match end {
                    End::Returned(_) => "",
                    End::Unwound(_) => " /* unwound */",
                    End::AtEnd(_) => " /* running at exit */",
                    End::Unfinished | End::NoExit => " /* unfinished */",
                };
                line(out, dur, self.tid, depth, format_args!("{name}();{how}"))?;
            }
        }
        Ok(())
    }

    /// Writes the held lines: their calls are shown and have shown calls inside.
    fn release(&mut self, out: &mut dyn Write) -> io::Result<()> {
        if self.held.is_empty() {
            return Ok(());
        }
        for h in self.held.drain(..) {
            match h {
                Held::Open { func, depth } => {
                    let n = name(self.names, func);
                    line(out, None, self.tid, depth, format_args!("{n}() {{"))?;
                }
                Held::Lost { depth, what } => {
                    line(out, None, self.tid, depth, format_args!("/* {what} */"))?;
                }
            }
        }
        for s in &mut self.open {
            if let Shown::At { opened, .. } = s {
                *opened = true;
            }
        }
        Ok(())
    }
}

/// Writes the function_graph lines of thread `t`; the number of its returns without a
/// recorded entry.
fn graph(
    t: &Thread,
    names: &[String],
    filter: &Matcher,
    notrace: &Matcher,
    o: &ReplayOptions,
    out: &mut dyn Write,
) -> io::Result<u64> {
    let mut g = Graph {
        tid: t.tid,
        names,
        filter,
        notrace,
        max_depth: o.depth.unwrap_or(u32::MAX),
        min_ns: o.min_ns,
        open: Vec::new(),
        held: Vec::new(),
    };
    let mut result = Ok(());
    let walk = Walk::thread(t, true, |s| {
        if result.is_ok() {
            result = g.step(s, out);
        }
    });
    result?;
    Ok(walk.unmatched_exits)
}

/// Seconds since the start of the trace, 15 characters: `    1.000123456`.
pub fn fmt_timestamp(ns_since_start: u64) -> String {
    format!(
        "{:>5}.{:09}",
        ns_since_start / 1_000_000_000,
        ns_since_start % 1_000_000_000
    )
}

fn flat(
    t: &Thread,
    names: &[String],
    filter: &Matcher,
    notrace: &Matcher,
    start: u64,
    out: &mut dyn Write,
) -> io::Result<()> {
    let tid = t.tid;
    let mut result = Ok(());
    Walk::thread(t, false, |s| {
        if result.is_err() {
            return;
        }
        result = match s {
            Step::Lost { ns, what, .. } => writeln!(
                out,
                " {} [{tid:>6}] | /* {what} */",
                fmt_timestamp(ns.saturating_sub(start))
            ),
            Step::Enter { func, ns, .. } => {
                if notrace.matches(func) || (!filter.is_empty() && !filter.matches(func)) {
                    return;
                }
                writeln!(
                    out,
                    " {} [{tid:>6}] | {}",
                    fmt_timestamp(ns.saturating_sub(start)),
                    name(names, func)
                )
            }
            Step::Leave { .. } => Ok(()),
        };
    });
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calls::{CallTree, Node};

    // The printer as it was over the whole call tree: the model the streaming one must
    // match.
    enum Work {
        /// A node; `Some(depth)` when its parent is shown (or it is a root without -F).
        Visit(Node, Option<u32>),
        /// Print the closing line of call `c` at `depth`.
        Close(usize, u32),
    }

    fn tree_graph(
        tree: &CallTree,
        tid: u32,
        names: &[String],
        filter: &Matcher,
        notrace: &Matcher,
        o: &ReplayOptions,
        out: &mut dyn Write,
    ) -> io::Result<()> {
        let max_depth = o.depth.unwrap_or(u32::MAX);
        let hidden = |c: usize, depth: u32| -> bool {
            let call = &tree.calls[c];
            depth >= max_depth
                || notrace.matches(call.func)
                || matches!((o.min_ns, call.duration()), (Some(min), Some(d)) if d < min)
        };
        let root_ctx = if filter.is_empty() { Some(0) } else { None };
        let mut work: Vec<Work> = tree
            .roots
            .iter()
            .rev()
            .map(|&n| Work::Visit(n, root_ctx))
            .collect();
        while let Some(w) = work.pop() {
            match w {
                Work::Close(c, depth) => {
                    let call = &tree.calls[c];
                    let n = name(names, call.func);
                    let how = match call.end {
                        End::Returned(_) => "",
                        End::Unwound(_) => ": unwound",
                        End::AtEnd(_) => ": running at exit",
                        End::Unfinished | End::NoExit => ": unfinished",
                    };
                    line(
                        out,
                        call.duration(),
                        tid,
                        depth,
                        format_args!("}} /* {n}{how} */"),
                    )?;
                }
                Work::Visit(Node::Lost { what, .. }, ctx) => {
                    if let Some(depth) = ctx.filter(|&d| d < max_depth) {
                        line(out, None, tid, depth, format_args!("/* {what} */"))?;
                    }
                }
                Work::Visit(Node::Call(c), ctx) => {
                    let call = &tree.calls[c];
                    if notrace.matches(call.func) {
                        continue;
                    }
                    let n = name(names, call.func);
                    let depth = match ctx {
                        Some(d) => d,
                        None if filter.matches(call.func) => 0,
                        None => {
                            work.extend(call.children.iter().rev().map(|&k| Work::Visit(k, None)));
                            continue;
                        }
                    };
                    if hidden(c, depth) {
                        continue;
                    }
                    let shown_child = call.children.iter().any(|k| match *k {
                        Node::Lost { .. } => depth + 1 < max_depth,
                        Node::Call(k) => !hidden(k, depth + 1),
                    });
                    if shown_child {
                        line(out, None, tid, depth, format_args!("{n}() {{"))?;
                        work.push(Work::Close(c, depth));
                        work.extend(
                            call.children
                                .iter()
                                .rev()
                                .map(|&k| Work::Visit(k, Some(depth + 1))),
                        );
                    } else {
                        let how = match call.end {
                            End::Returned(_) => "",
                            End::Unwound(_) => " /* unwound */",
                            End::AtEnd(_) => " /* running at exit */",
                            End::Unfinished | End::NoExit => " /* unfinished */",
                        };
                        line(
                            out,
                            call.duration(),
                            tid,
                            depth,
                            format_args!("{n}();{how}"),
                        )?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Random threads (losses anywhere, unwound and unfinished calls, recursion) under
    /// random filters, depth limits and minimum durations print as over the call tree.
    #[test]
    fn streaming_graph_is_the_tree_printers() {
        use crate::read::{Process, Symbol};
        let p = Process {
            symbols: (0..6)
                .map(|id| Symbol {
                    id,
                    addr: 0x1000 + id as u64,
                    size: 1,
                    name: format!("f{id}"),
                    module: String::new(),
                })
                .collect::<Vec<_>>()
                .into(),
            ..Default::default()
        };
        let names = names_of(&p);
        let mut r = crate::testgen::Rng::new(0x0123_4567_89ab_cdef);
        let shape = crate::testgen::Shape { events: 60, funcs: 6, step_ns: 100, loss_every: 10 };
        let mut shown = 0;
        for round in 0..3000 {
            let t = crate::testgen::thread(&mut r, 7, &shape);
            let globs = |g: u64| match g {
                0 | 1 => Globs::default(),
                2 => Globs::new(&["f1".into()]).unwrap(),
                _ => Globs::new(&["f2".into(), "f4".into()]).unwrap(),
            };
            let o = ReplayOptions {
                filter: globs(r.below(4)),
                notrace: globs(r.below(5) / 2),
                depth: [None, Some(1), Some(2), Some(4)][r.below(4) as usize],
                min_ns: [None, None, Some(50), Some(200)][r.below(4) as usize],
                ..Default::default()
            };
            let (filter, notrace) = (
                Matcher::new(&o.filter, &p, &names),
                Matcher::new(&o.notrace, &p, &names),
            );
            let mut want = Vec::new();
            tree_graph(
                &CallTree::build(&t, true),
                t.tid,
                &names,
                &filter,
                &notrace,
                &o,
                &mut want,
            )
            .unwrap();
            let mut got = Vec::new();
            graph(&t, &names, &filter, &notrace, &o, &mut got).unwrap();
            let (want, got) = (
                String::from_utf8(want).unwrap(),
                String::from_utf8(got).unwrap(),
            );
            assert_eq!(
                got, want,
                "round {round}: {o:?}\n{:?}\n{:?}",
                t.events, t.losses
            );
            shown += want.lines().count();
        }
        assert!(shown > 10_000, "the rounds show lines: {shown}");
    }

    /// Headers show a command as a shell would take it: one word per
    /// argument (postgres's `sh -c '"/…/postgres" -V'` read as three).
    #[test]
    fn headers_quote_the_words_a_shell_would_split() {
        let w = |v: &[&str]| shell_words(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(w(&["/bin/demo", "-n", "3", "a=b,c:d"]), "/bin/demo -n 3 a=b,c:d");
        assert_eq!(w(&["sh", "-c", "\"/usr/bin/postgres\" -V"]), "sh -c '\"/usr/bin/postgres\" -V'");
        assert_eq!(w(&["echo", "it's", "", "$HOME", "*"]), "echo 'it'\\''s' '' '$HOME' '*'");
    }

    #[test]
    fn durations() {
        assert_eq!(fmt_duration(0), "  0.000 us");
        assert_eq!(fmt_duration(1_088), "  1.088 us");
        assert_eq!(fmt_duration(999_999), "999.999 us");
        assert_eq!(fmt_duration(1_000_000), "  1.000 ms");
        assert_eq!(fmt_duration(12_345_678), " 12.345 ms");
        assert_eq!(fmt_duration(2_000_000_000), "  2.000  s");
        assert_eq!(fmt_duration(u64::MAX), "18446744073.709  s");
    }

    #[test]
    fn globs() {
        let g = Globs::new(&["foo*".into(), "b?r".into()]).unwrap();
        assert!(g.matches("foobar") && g.matches("bar") && !g.matches("baar"));
        assert!(!Globs::default().matches("x"));
        // A name is its own pattern, `[` or not; braces are plain characters.
        let g = Globs::new(&["<mini::Holder<[u8]>>::show".into(), "std::rt::*::{closure#0}".into(), "[".into()]).unwrap();
        assert!(g.matches("<mini::Holder<[u8]>>::show") && g.matches("[") && !g.matches("<mini::Holder<[u16]>>::show"));
        assert!(g.matches("std::rt::lang_start::<()>::{closure#0}") && !g.matches("std::rt::lang_start::<()>::closure#0"));
        let exact = Globs::new(&["std::rt::lang_start::<()>::{closure#0}".into()]).unwrap();
        assert!(exact.matches("std::rt::lang_start::<()>::{closure#0}"));
    }
}
