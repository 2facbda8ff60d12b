//! Reading a trace directory (see [`crate::format`]): decoded into memory
//! ([`Trace::open`]), or streamed, each thread read and decoded from its `.dat` file at each pass
//! ([`Trace::open_streaming`], what the commands use: no memory per event).
//!
//! [`Trace::open`] never panics on bad input. It fails only when nothing is readable
//! (no directory, or no trace files in it); any damage after intact data becomes a
//! [`TraceError`] in [`Trace::problems`] naming the file, the byte offset (or line) and what
//! was wrong, and the intact part is kept:
//!
//! - a `.dat` chunk with a bad header: the chunks before it are kept and the reader
//!   re-synchronises on the next valid `FTRC` header after it;
//! - a bad event inside a chunk: the events before it are kept, the rest of that chunk is
//!   skipped (recorded as a [`Lost::Damaged`] gap) and reading goes on with the next chunk;
//! - a chunk cut short by the end of the file: its complete events are kept;
//! - a missing or bad `.sym` line: events of those functions are shown by id;
//! - a missing or bad `.info`: the clock calibration of another process of the trace is
//!   used (they share one), else ticks are taken as nanoseconds.
//!
//! Ticks become nanoseconds with the process's calibration:
//! `ns = base_ns + (ticks - base_ticks) * 1e9 / ticks_per_sec`, in 128-bit arithmetic.
//! The chunks of a thread are ordered by their `seq`; a gap in `seq` is counted as lost
//! chunks ([`Thread::lost_chunks`]) and shown where it happened ([`Thread::losses`]).

use crate::format::{self, ChunkHeader, CHUNK_HEADER_SIZE, CHUNK_MAGIC, EVENT_SIZE};
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A trace problem: the file, where in it, and what was wrong (and what was kept).
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The file could not be read at all.
    #[error("{}: {error}", path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    /// Damage at a byte offset of a binary file.
    #[error("{}: offset {offset}: {what}", path.display())]
    Corrupt {
        path: PathBuf,
        offset: u64,
        what: String,
    },
    /// A bad line of a text file (`.sym`, `.info`, `info`).
    #[error("{}: line {line}: {what}", path.display())]
    BadLine {
        path: PathBuf,
        line: usize,
        what: String,
    },
    /// Anything else about a file or the directory (missing file, not a trace...).
    #[error("{}: {what}", path.display())]
    Invalid { path: PathBuf, what: String },
}

impl TraceError {
    /// The file (or directory) the problem is about.
    pub fn path(&self) -> &Path {
        match self {
            TraceError::Io { path, .. }
            | TraceError::Corrupt { path, .. }
            | TraceError::BadLine { path, .. }
            | TraceError::Invalid { path, .. } => path,
        }
    }
}

/// The trace-wide `info` file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TraceInfo {
    pub version: u32,
    /// `function_graph` or `function` (empty when `info` is missing).
    pub tracer: String,
    pub command: Vec<String>,
    /// `tsc`, `cntvct` or `monotonic`.
    pub clock: String,
    /// Recording options, for display (`key` → value as written).
    pub options: BTreeMap<String, String>,
    /// The clock calibration over the whole run (`[calibration]`, written by
    /// `ftramp record` when the program has ended), which every process's
    /// timestamps use; `None` in traces without it (each process's own).
    pub calibration: Option<Calibration>,
}

impl TraceInfo {
    /// Whether the tracer records exits (function_graph); `function` records entries only.
    pub fn has_exits(&self) -> bool {
        self.tracer != "function"
    }
}

/// Ticks → nanoseconds of one process image (from its `.info`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Calibration {
    pub ticks_per_sec: u64,
    pub base_ticks: u64,
    pub base_ns: u64,
}

impl Calibration {
    /// Ticks are nanoseconds (CLOCK_MONOTONIC).
    pub const IDENTITY: Calibration = Calibration {
        ticks_per_sec: 1_000_000_000,
        base_ticks: 0,
        base_ns: 0,
    };

    /// `base_ns + (ticks - base_ticks) * 1e9 / ticks_per_sec`, clamped to `u64`.
    pub fn to_ns(&self, ticks: u64) -> u64 {
        let tps = self.ticks_per_sec.max(1) as i128;
        let d = ticks as i128 - self.base_ticks as i128;
        let ns = self.base_ns as i128 + d * 1_000_000_000 / tps;
        ns.clamp(0, u64::MAX as i128) as u64
    }
}

impl Default for Calibration {
    fn default() -> Calibration {
        Calibration::IDENTITY
    }
}

/// One function of a process's `.sym`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Symbol {
    pub id: u32,
    pub addr: u64,
    pub size: u64,
    /// Raw (mangled) ELF name, `?` when the recorder did not know it.
    pub name: String,
    pub module: String,
}

/// Entry or exit of a function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    Entry,
    Exit,
}

/// One function entry or exit on a thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    pub kind: EventKind,
    /// Function id: index into the process's `.sym`.
    pub func: u32,
    /// CLOCK_MONOTONIC nanoseconds.
    pub ns: u64,
}

/// What went missing at one point of a thread's event stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lost {
    /// The recorder dropped this many events (its buffers were full).
    Events(u64),
    /// This many whole chunks are missing (a gap in the chunks' `seq`).
    Chunks(u64),
    /// This many bytes of damaged data were skipped.
    Damaged(u64),
}

impl fmt::Display for Lost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = |n: u64| if n == 1 { "" } else { "s" };
        match *self {
            Lost::Events(n) => write!(f, "lost {n} event{}", s(n)),
            Lost::Chunks(n) => write!(f, "lost {n} chunk{}", s(n)),
            Lost::Damaged(n) => write!(f, "skipped {n} damaged byte{}", s(n)),
        }
    }
}

/// A loss at a point of a thread: before `events[at]` (or at the end when `at == len`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loss {
    pub at: usize,
    /// Time of the loss (the chunk's or the previous event's time).
    pub ns: u64,
    pub what: Lost,
}

/// One thing of a thread's recorded stream, in order: an event, or a loss there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Item {
    Event(Event),
    Loss { ns: u64, what: Lost },
}

/// The recorded events of one thread.
///
/// Held in one of two ways: decoded (`events` and `losses`: threads built in memory, and
/// those of [`Trace::open`]), or streamed (a trace opened with [`Trace::open_streaming`]:
/// `events` and `losses` stay empty and [`Thread::for_each`] reads and decodes the thread's
/// chunks from its `.dat` file one at a time at each pass, so that a pass needs memory for
/// one chunk, not 16 bytes per event). Read the events with [`Thread::for_each`] to take
/// both.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Thread {
    pub tid: u32,
    pub events: Vec<Event>,
    /// Events the recorder counted as lost on this thread.
    pub lost: u64,
    /// Chunks missing from the `seq` sequence.
    pub lost_chunks: u64,
    /// Where events, chunks or damaged bytes went missing, in event order.
    pub losses: Vec<Loss>,
    /// The thread's last chunk (flag LAST) was read: it exited while recorded.
    pub exited: bool,
    /// When the calls this thread left open ended, if known: the end of its image
    /// ([`Process::end_ns`]) for a thread that had not exited by then, which the calls
    /// open at an `exit()`, a fatal signal or an `exec` are.  `None`: they are
    /// unfinished, with no known end (the thread exited inside them, or the image ended
    /// unseen).
    pub open_until: Option<u64>,
    /// The loss that ends the thread's stream, when the recorder could not write its last
    /// chunks (a full disk; the `.info`'s `unwritten`): its time (the last event's) and
    /// what was lost.  Its calls still open then are unfinished.
    pub unwritten: Option<(u64, Lost)>,
    /// Where a streamed thread's events are.
    pub(crate) stored: Option<Stored>,
}

/// A streamed thread's chunks, in `seq` order, in its `.dat` file, and the times of its
/// first and last events (found when the trace was opened).
#[derive(Clone)]
pub(crate) struct Stored {
    path: std::sync::Arc<PathBuf>,
    dat: std::sync::Arc<Dat>,
    run: Vec<Chunk>,
    cal: Calibration,
    span: Option<(u64, u64)>,
}

impl fmt::Debug for Stored {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Stored({}: {} chunks)", self.path.display(), self.run.len())
    }
}

impl PartialEq for Stored {
    fn eq(&self, o: &Stored) -> bool {
        std::sync::Arc::ptr_eq(&self.dat, &o.dat) && self.run == o.run
    }
}

impl Eq for Stored {}

impl Thread {
    /// Calls `f` with the thread's events and losses in order (a loss before the event it
    /// came before), decoding a streamed thread's chunks as it goes.
    pub fn for_each(&self, mut f: impl FnMut(Item)) {
        if let Some(st) = &self.stored {
            // Damage was reported when the trace was opened.
            decode_run(&st.path, &st.dat, &st.run, self.tid, &st.cal, &mut Vec::new(), &mut f);
        } else {
            let mut losses = self.losses.iter().peekable();
            for (i, ev) in self.events.iter().enumerate() {
                while let Some(l) = losses.next_if(|l| l.at <= i) {
                    f(Item::Loss { ns: l.ns, what: l.what });
                }
                f(Item::Event(*ev));
            }
            for l in losses {
                f(Item::Loss { ns: l.ns, what: l.what });
            }
        }
        if let Some((ns, what)) = self.unwritten {
            f(Item::Loss { ns, what });
        }
    }

    /// Times of the first and last events; `None` without events.
    pub fn span(&self) -> Option<(u64, u64)> {
        match &self.stored {
            Some(st) => st.span,
            None => Some((self.events.first()?.ns, self.events.last()?.ns)),
        }
    }
}

/// One process image (`task-<pid>-<n>.*`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Process {
    pub pid: u32,
    /// 0 for the first image of the pid, +1 after each exec.
    pub image: u32,
    pub ppid: u32,
    pub exe: String,
    pub args: Vec<String>,
    /// `(pid, image)` of the parent image for a fork child.
    pub forked_from: Option<(u32, u32)>,
    /// How the image ended (`code 0`, `signal 11 (SIGSEGV)`, `exec`...), when known.
    pub exit: Option<String>,
    /// Sorted by id; ids are normally dense from 0.  Shared by the images
    /// whose `.sym` files are the same (fork children write their parent's
    /// table again: a trace of a shell had hundreds of copies, 310 KB each).
    pub symbols: Arc<Vec<Symbol>>,
    pub threads: Vec<Thread>,
    /// Events lost (the `.info`'s `lost`, else the sum over threads).
    pub lost: u64,
    /// Ticks → ns; [`Calibration::IDENTITY`] when unknown.
    pub calibration: Calibration,
    /// When the image began (ns): the `.info`'s `start_ticks`, else its
    /// first event; `None` when neither is known.
    pub start_ns: Option<u64>,
    /// When the image ended (ns): the `.info`'s `end_ticks`, which the recorder writes
    /// as the image ends (`exit`, a fatal signal it catches, `exec`); `None` when it
    /// ended unseen (SIGKILL) or the trace is older.
    pub end_ns: Option<u64>,
    /// Threads whose last chunks the recorder could not write (a full disk): `(tid,
    /// chunks, events)`, the `.info`'s `unwritten`; their threads' streams end with
    /// the loss ([`Thread::unwritten`]).
    pub unwritten: Vec<(u32, u64, u64)>,
    /// More threads lost their last chunks than `unwritten` names (`unwritten_more`):
    /// the calls every thread left open are unfinished.
    pub unwritten_more: bool,
    /// The `.info` file is there but empty: the recorder could not write even its
    /// first lines (a full disk), or the process died as it created it.
    pub info_empty: bool,
}

impl Process {
    /// The symbol of function `id`, if the `.sym` has it.
    pub fn symbol(&self, id: u32) -> Option<&Symbol> {
        match self.symbols.get(id as usize) {
            Some(s) if s.id == id => Some(s),
            _ => self
                .symbols
                .binary_search_by_key(&id, |s| s.id)
                .ok()
                .map(|i| &self.symbols[i]),
        }
    }

    /// Display name of function `id`: the symbol (demangled, without parameters, see
    /// [`demangle`]), else its address, else `#id`.
    pub fn func_name(&self, id: u32) -> String {
        match self.symbol(id) {
            Some(s) if s.name != "?" && !s.name.is_empty() => {
                demangle(&s.name).unwrap_or_else(|| s.name.clone())
            }
            Some(s) => format!("{:#x}", s.addr),
            None => format!("#{id}"),
        }
    }

    /// A short name for the image: the executable's file name.
    pub fn short_name(&self) -> &str {
        let e = self.exe.rsplit('/').next().unwrap_or("");
        if e.is_empty() {
            "?"
        } else {
            e
        }
    }
}

pub use ftramp_demangle::{demangle, demangle_with_params};

/// A trace directory read into memory.
#[derive(Debug)]
pub struct Trace {
    pub dir: PathBuf,
    pub info: TraceInfo,
    /// In the order the images began ([`Process::start_ns`]), then by
    /// (pid, image); images whose start is unknown come last.
    pub processes: Vec<Process>,
    /// Everything that was wrong; the rest was read.
    pub problems: Vec<TraceError>,
}

impl Trace {
    /// Reads the trace directory `dir`, every thread decoded into its `events` and
    /// `losses`. Fails only when nothing is readable.
    pub fn open(dir: &Path) -> Result<Trace, TraceError> {
        Trace::open_as(dir, false)
    }

    /// [`Trace::open`] with streamed threads (see [`Thread`]): every chunk is read and
    /// decoded once to check it (its damage is in `problems` as with `open`), then again
    /// at each [`Thread::for_each`]; nothing is held per event, only where each chunk is.
    pub fn open_streaming(dir: &Path) -> Result<Trace, TraceError> {
        Trace::open_as(dir, true)
    }

    fn open_as(dir: &Path, streamed: bool) -> Result<Trace, TraceError> {
        let entries = std::fs::read_dir(dir).map_err(|error| TraceError::Io {
            path: dir.to_path_buf(),
            error,
        })?;
        let mut problems = Vec::new();
        // (pid, image) → which of info/sym/dat exist.
        let mut tasks: BTreeMap<(u32, u32), [bool; 3]> = BTreeMap::new();
        for e in entries {
            let e = match e {
                Ok(e) => e,
                Err(error) => {
                    problems.push(TraceError::Io {
                        path: dir.to_path_buf(),
                        error,
                    });
                    continue;
                }
            };
            let name = e.file_name();
            let Some((pid, image, ext)) = name.to_str().and_then(format::parse_task_file_name)
            else {
                continue;
            };
            let slot = match ext {
                "info" => 0,
                "sym" => 1,
                "dat" => 2,
                _ => continue,
            };
            tasks.entry((pid, image)).or_default()[slot] = true;
        }

        let info_path = dir.join("info");
        // What is wrong with `info` when its tracer is not known: said below, with the
        // tracer the images' `.info` name.
        let mut info_lacks = None;
        let mut info = if info_path.exists() || tasks.is_empty() {
            match read_text(&info_path, &mut problems) {
                Ok(text) => {
                    let info = parse_trace_info(&info_path, &text, &mut problems);
                    if info.tracer.is_empty() {
                        info_lacks = Some("no `tracer`".to_string());
                    } else if !known_tracer(&info.tracer) {
                        info_lacks = Some(format!("unknown tracer {:?}", info.tracer));
                    }
                    info
                }
                Err(_) if tasks.is_empty() => {
                    return Err(TraceError::Invalid {
                        path: dir.to_path_buf(),
                        what: "not an ftramp trace directory (no `info` and no task-*.dat files)"
                            .into(),
                    })
                }
                Err(error) => {
                    problems.push(TraceError::Io {
                        path: info_path.clone(),
                        error,
                    });
                    info_lacks = Some("unreadable".to_string());
                    TraceInfo::default()
                }
            }
        } else {
            info_lacks = Some("missing".to_string());
            TraceInfo::default()
        };

        let mut processes = Vec::new();
        let mut uncalibrated = Vec::new();
        // The tracer each image's `.info` names (the recorder writes it there
        // too): the trace's, when there is no `info` (a recording made
        // without `ftramp record`, as under qemu-user).
        let mut image_tracers: Vec<String> = Vec::new();
        // The symbol tables read so far, by their files' bytes.
        let mut sym_tables: HashMap<Vec<u8>, Arc<Vec<Symbol>>> = HashMap::new();
        for (&(pid, image), have) in &tasks {
            let mut p = Process {
                pid,
                image,
                ..Default::default()
            };
            let file = |ext: &str| dir.join(format::task_file_name(pid, image, ext));
            let info_file = file("info");
            // Made nanoseconds once the calibration is known.
            let mut start_ticks = None;
            let mut end_ticks = None;
            let calibrated = if have[0] {
                match read_text(&info_file, &mut problems) {
                    Ok(text) => {
                        p.info_empty = text.trim().is_empty();
                        let mut tracer = None;
                        let ok = parse_process_info(&info_file, &text, &mut p, [&mut start_ticks, &mut end_ticks], &mut tracer, &mut problems);
                        image_tracers.extend(tracer);
                        ok
                    }
                    Err(error) => {
                        problems.push(TraceError::Io {
                            path: info_file,
                            error,
                        });
                        false
                    }
                }
            } else {
                problems.push(TraceError::Invalid {
                    path: info_file,
                    what: "missing; process details and clock calibration unknown".into(),
                });
                false
            };
            let sym_file = file("sym");
            if have[1] {
                match std::fs::read(&sym_file) {
                    Ok(bytes) => {
                        p.symbols = match sym_tables.get(&bytes) {
                            Some(t) => Arc::clone(t),
                            None => {
                                let before = problems.len();
                                let t = Arc::new(parse_symbols(&sym_file, &bytes, &mut problems));
                                // (A damaged file is parsed for each image, so that
                                // each is named in its problems.)
                                if problems.len() == before {
                                    sym_tables.insert(bytes, Arc::clone(&t));
                                }
                                t
                            }
                        }
                    }
                    Err(error) => problems.push(TraceError::Io {
                        path: sym_file,
                        error,
                    }),
                }
            } else {
                problems.push(TraceError::Invalid {
                    path: sym_file,
                    what: "missing; functions are shown by id".into(),
                });
            }
            if !calibrated {
                uncalibrated.push(processes.len());
            }
            processes.push((p, have[2], start_ticks, end_ticks));
        }

        if let Some(lacks) = info_lacks {
            image_tracers.sort();
            image_tracers.dedup();
            let missing = lacks == "missing";
            let what = match image_tracers.as_slice() {
                [t] if known_tracer(t) => {
                    info.tracer = t.clone();
                    if missing {
                        format!("missing; command unknown (tracer {t}, as the images' .info say)")
                    } else {
                        format!("{lacks}; read as {t}, as the images' .info say")
                    }
                }
                [] if missing => "missing; tracer and command unknown (read as function_graph)".to_string(),
                [] => format!("{lacks}; read as function_graph"),
                several => format!(
                    "{lacks}{}, and the images' .info name tracers {} (read as function_graph)",
                    if missing { "; command unknown" } else { "" },
                    several.join(", ")
                ),
            };
            problems.push(TraceError::Invalid { path: info_path, what });
        }

        // The run's calibration, when `ftramp record` wrote one, is every
        // process's.
        if let Some(c) = info.calibration {
            for (p, ..) in &mut processes {
                p.calibration = c;
            }
            uncalibrated.clear();
        }
        // Every process of a trace shares the recorder's calibration (FTRAMP_CLOCK):
        // borrow one for the images whose .info is missing or bad.
        let shared = processes
            .iter()
            .enumerate()
            .find(|(i, _)| !uncalibrated.contains(i))
            .map(|(_, (p, ..))| p.calibration);
        for &i in &uncalibrated {
            let p = &mut processes[i].0;
            p.calibration = shared.unwrap_or(Calibration::IDENTITY);
            let how = if shared.is_some() {
                "another process's calibration"
            } else {
                "raw ticks as nanoseconds"
            };
            problems.push(TraceError::Invalid {
                path: dir.join(format::task_file_name(p.pid, p.image, "info")),
                what: format!("no clock calibration; timestamps use {how}"),
            });
        }

        let mut out = Vec::with_capacity(processes.len());
        for (mut p, has_dat, start_ticks, end_ticks) in processes {
            p.start_ns = start_ticks.map(|ticks| p.calibration.to_ns(ticks));
            p.end_ns = end_ticks.map(|ticks| p.calibration.to_ns(ticks));
            let dat = dir.join(format::task_file_name(p.pid, p.image, "dat"));
            if has_dat {
                let data = if streamed {
                    std::fs::metadata(&dat).map(|m| Dat::File {
                        path: dat.clone(),
                        len: m.len() as usize,
                    })
                } else {
                    std::fs::read(&dat).map(Dat::Bytes)
                };
                match data {
                    Ok(data) => {
                        p.threads = read_dat(&dat, data, p.pid, &p.calibration, &mut problems)
                    }
                    Err(error) => problems.push(TraceError::Io { path: dat, error }),
                }
            } else {
                problems.push(TraceError::Invalid {
                    path: dat,
                    what: "missing; no events for this process".into(),
                });
            }
            let thread_lost: u64 = p
                .threads
                .iter()
                .map(|t| t.lost)
                .fold(0, u64::saturating_add);
            p.lost = p.lost.max(thread_lost);
            if p.start_ns.is_none() {
                p.start_ns = p.threads.iter().filter_map(|t| t.span()).map(|s| s.0).min();
            }
            for t in p.threads.iter_mut().filter(|t| !t.exited) {
                // (Events of a thread that ran on while the image ended may come
                // after the end the recorder noted.)
                t.open_until = p.end_ns.map(|end| t.span().map_or(end, |(_, last)| end.max(last)));
                if p.unwritten_more {
                    t.open_until = None;
                }
            }
            end_unwritten_threads(&mut p);
            out.push(p);
        }
        // In the order the images began (a parent before the children it
        // forked, an image before the one its exec made), not by pid: pids
        // wrap, and a child may have a smaller one than its parent.
        out.sort_by_key(|p| (p.start_ns.unwrap_or(u64::MAX), p.pid, p.image));
        Ok(Trace {
            dir: dir.to_path_buf(),
            info,
            processes: out,
            problems,
        })
    }

    /// Earliest event time of the trace (0 when there are no events).
    pub fn start_ns(&self) -> u64 {
        self.processes
            .iter()
            .flat_map(|p| &p.threads)
            .filter_map(|t| t.span().map(|(first, _)| first))
            .min()
            .unwrap_or(0)
    }
}

/// Ends the stream of each thread the `.info`'s `unwritten` names with the loss of its
/// last chunks: its calls still open are unfinished, not running at the image's end
/// (they may have ended in the chunks lost).  A thread none of whose chunks was written
/// gets an empty stream with the loss.
fn end_unwritten_threads(p: &mut Process) {
    for &(tid, chunks, events) in &p.unwritten {
        // The thread's latest incarnation (a tid reused after a thread exited).
        let i = match p.threads.iter().rposition(|t| t.tid == tid && !t.exited) {
            Some(i) => i,
            None => {
                p.threads.push(Thread {
                    tid,
                    ..Default::default()
                });
                p.threads.len() - 1
            }
        };
        let t = &mut p.threads[i];
        let ns = t.span().map_or_else(|| p.end_ns.or(p.start_ns).unwrap_or(0), |(_, last)| last);
        let what = if events > 0 { Lost::Events(events) } else { Lost::Chunks(chunks) };
        if let Lost::Events(n) = what {
            t.lost = t.lost.saturating_add(n);
        }
        t.unwritten = Some((ns, what));
        t.open_until = None;
    }
}

// ---- info files ----

/// The text of an `info` or `.info` file; bytes that are not UTF-8 (damage) are
/// reported and read as U+FFFD, so that only the lines they are on are lost.
fn read_text(path: &Path, problems: &mut Vec<TraceError>) -> std::io::Result<String> {
    let bytes = std::fs::read(path)?;
    Ok(match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => {
            problems.push(TraceError::Corrupt {
                path: path.to_path_buf(),
                offset: e.utf8_error().valid_up_to() as u64,
                what: "not UTF-8; read with U+FFFD in place of the bad bytes".into(),
            });
            String::from_utf8_lossy(e.as_bytes()).into_owned()
        }
    })
}

/// Parses TOML leniently: the whole text if it parses, else line by line (a crash can
/// leave a half-written line, and appended keys may repeat; the last one wins).
fn parse_toml_lenient(path: &Path, text: &str, problems: &mut Vec<TraceError>) -> toml::Table {
    if let Ok(t) = text.parse::<toml::Table>() {
        return t;
    }
    let mut table = toml::Table::new();
    let mut section: Option<String> = None;
    for (i, line) in text.lines().enumerate() {
        let l = line.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        if l.starts_with('[') {
            section = Some(l.trim_matches(['[', ']', ' ']).to_string());
            continue;
        }
        match l.parse::<toml::Table>() {
            Ok(t) => {
                let dst = match &section {
                    None => &mut table,
                    Some(s) => {
                        let v = table
                            .entry(s.clone())
                            .or_insert_with(|| toml::Value::Table(Default::default()));
                        match v {
                            toml::Value::Table(t) => t,
                            _ => continue,
                        }
                    }
                };
                dst.extend(t);
            }
            Err(e) => problems.push(TraceError::BadLine {
                path: path.to_path_buf(),
                line: i + 1,
                what: format!("not `key = value` TOML ({}): {l:?}", e.message()),
            }),
        }
    }
    table
}

fn value_str(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn value_u64(v: &toml::Value) -> Option<u64> {
    match v {
        toml::Value::Integer(i) => u64::try_from(*i).ok(),
        toml::Value::String(s) => s.trim().parse().ok(),
        toml::Value::Float(f) if *f >= 0.0 && f.fract() == 0.0 && *f < u64::MAX as f64 => {
            Some(*f as u64)
        }
        _ => None,
    }
}

fn value_strings(v: &toml::Value) -> Vec<String> {
    match v {
        toml::Value::Array(a) => a.iter().map(value_str).collect(),
        other => vec![value_str(other)],
    }
}

fn parse_trace_info(path: &Path, text: &str, problems: &mut Vec<TraceError>) -> TraceInfo {
    let t = parse_toml_lenient(path, text, problems);
    let mut info = TraceInfo::default();
    for (k, v) in &t {
        match k.as_str() {
            "version" => match value_u64(v) {
                Some(n) if (format::MIN_VERSION as u64..=format::VERSION as u64).contains(&n) => info.version = n as u32,
                _ => problems.push(TraceError::Invalid {
                    path: path.to_path_buf(),
                    what: format!(
                        "version {} (this reader knows {} to {}); reading it as version {}",
                        value_str(v),
                        format::MIN_VERSION,
                        format::VERSION,
                        format::VERSION
                    ),
                }),
            },
            "tracer" => info.tracer = value_str(v),
            "command" => info.command = value_strings(v),
            "clock" => info.clock = value_str(v),
            "calibration" => {
                let get = |key: &str| match v {
                    toml::Value::Table(c) => c.get(key).and_then(value_u64),
                    _ => None,
                };
                match (get("ticks_per_sec").filter(|&n| n > 0), get("base_ticks"), get("base_ns")) {
                    (Some(ticks_per_sec), Some(base_ticks), Some(base_ns)) => {
                        info.calibration = Some(Calibration {
                            ticks_per_sec,
                            base_ticks,
                            base_ns,
                        })
                    }
                    _ => problems.push(TraceError::Invalid {
                        path: path.to_path_buf(),
                        what: format!(
                            "bad `[calibration]` {}; each process's own is used",
                            value_str(v)
                        ),
                    }),
                }
            }
            "options" => {
                if let toml::Value::Table(o) = v {
                    info.options
                        .extend(o.iter().map(|(k, v)| (k.clone(), value_str(v))));
                } else {
                    info.options.insert(k.clone(), value_str(v));
                }
            }
            _ => {
                info.options.insert(k.clone(), value_str(v));
            }
        }
    }
    info
}

fn parse_pid_image(v: &toml::Value) -> Option<(u32, u32)> {
    match v {
        toml::Value::String(s) => {
            let (a, b) = s.trim().split_once('-')?;
            Some((a.parse().ok()?, b.parse().ok()?))
        }
        toml::Value::Array(a) if a.len() == 2 => Some((
            u32::try_from(value_u64(&a[0])?).ok()?,
            u32::try_from(value_u64(&a[1])?).ok()?,
        )),
        toml::Value::Integer(pid) => Some((u32::try_from(*pid).ok()?, 0)),
        _ => None,
    }
}

/// Fills `p` from a `task-*.info`; returns whether the clock calibration was complete.
/// Whether `t` names a tracer the readers know (`function_graph`, `function`).
fn known_tracer(t: &str) -> bool {
    matches!(t, "function_graph" | "function")
}

fn parse_process_info(
    path: &Path,
    text: &str,
    p: &mut Process,
    [start_ticks, end_ticks]: [&mut Option<u64>; 2],
    tracer: &mut Option<String>,
    problems: &mut Vec<TraceError>,
) -> bool {
    let t = parse_toml_lenient(path, text, problems);
    let bad = |problems: &mut Vec<TraceError>, k: &str, v: &toml::Value| {
        problems.push(TraceError::Invalid {
            path: path.to_path_buf(),
            what: format!("bad `{k}` value {v}"),
        })
    };
    let (mut tps, mut bt, mut bn) = (None, None, None);
    for (k, v) in &t {
        let num = value_u64(v);
        match k.as_str() {
            "pid" => match num.and_then(|n| u32::try_from(n).ok()) {
                Some(pid) if pid == p.pid => {}
                _ => problems.push(TraceError::Invalid {
                    path: path.to_path_buf(),
                    what: format!("`pid = {v}` does not match the file name (pid {})", p.pid),
                }),
            },
            "n" | "image" => {}
            "ppid" => match num.and_then(|n| u32::try_from(n).ok()) {
                Some(n) => p.ppid = n,
                None => bad(problems, k, v),
            },
            "exe" => p.exe = value_str(v),
            "args" => p.args = value_strings(v),
            "forked_from" => match parse_pid_image(v) {
                Some(f) => p.forked_from = Some(f),
                None if value_str(v).is_empty() => {}
                None => bad(problems, k, v),
            },
            "ticks_per_sec" => match num.filter(|&n| n > 0) {
                Some(n) => tps = Some(n),
                None => bad(problems, k, v),
            },
            "base_ticks" => match num {
                Some(n) => bt = Some(n),
                None => bad(problems, k, v),
            },
            "base_ns" => match num {
                Some(n) => bn = Some(n),
                None => bad(problems, k, v),
            },
            "lost" => match num {
                Some(n) => p.lost = n,
                None => bad(problems, k, v),
            },
            "exit" => p.exit = Some(value_str(v)),
            "tracer" => *tracer = Some(value_str(v)),
            "start_ticks" => match num {
                Some(n) => *start_ticks = Some(n),
                None => bad(problems, k, v),
            },
            "end_ticks" => match num {
                Some(n) => *end_ticks = Some(n),
                None => bad(problems, k, v),
            },
            "unwritten" => {
                let entry = |e: &toml::Value| match e.as_array().map(|a| a.iter().map(value_u64).collect::<Option<Vec<_>>>()) {
                    Some(Some(n)) if n.len() == 3 => Some((u32::try_from(n[0]).ok()?, n[1], n[2])),
                    _ => None,
                };
                match v.as_array().map(|a| a.iter().map(entry).collect::<Option<Vec<_>>>()) {
                    Some(Some(list)) => p.unwritten = list,
                    _ => bad(problems, k, v),
                }
            }
            "unwritten_more" => p.unwritten_more = v.as_bool().unwrap_or(true),
            _ => {}
        }
    }
    match (tps, bt, bn) {
        (Some(ticks_per_sec), Some(base_ticks), Some(base_ns)) => {
            p.calibration = Calibration {
                ticks_per_sec,
                base_ticks,
                base_ns,
            };
            true
        }
        _ => false,
    }
}

/// Parses a `.sym` file: bad lines are reported and skipped.
fn parse_symbols(path: &Path, bytes: &[u8], problems: &mut Vec<TraceError>) -> Vec<Symbol> {
    let text = String::from_utf8_lossy(bytes);
    let mut syms: Vec<Symbol> = Vec::new();
    let mut lines = text.split('\n').enumerate().peekable();
    while let Some((i, line)) = lines.next() {
        if line.trim().is_empty() {
            continue;
        }
        // The last line may be cut short by a crash: a missing newline is reported too.
        let last_unterminated = lines.peek().is_none();
        match format::SymLine::parse(line) {
            Ok(l) if last_unterminated => problems.push(TraceError::BadLine {
                path: path.to_path_buf(),
                line: i + 1,
                what: format!(
                    "last line has no newline (cut short?); kept as {:?}",
                    l.symbol
                ),
            }),
            Ok(_) => {}
            Err(e) => {
                problems.push(TraceError::BadLine {
                    path: path.to_path_buf(),
                    line: i + 1,
                    what: format!("{e}: {line:?}"),
                });
                continue;
            }
        }
        if let Ok(l) = format::SymLine::parse(line) {
            syms.push(Symbol {
                id: l.id,
                addr: l.addr,
                size: l.size,
                name: l.symbol,
                module: l.module,
            });
        }
    }
    syms.sort_by_key(|s| s.id);
    let before = syms.len();
    syms.dedup_by_key(|s| s.id);
    if syms.len() != before {
        problems.push(TraceError::Invalid {
            path: path.to_path_buf(),
            what: format!(
                "{} duplicate function ids; the first line of each kept",
                before - syms.len()
            ),
        });
    }
    syms
}

// ---- .dat files ----

/// One chunk found: its header and where its payload is in the file.  The
/// payload is decoded straight into its thread's events once the thread's
/// chunks are in order ([`group_threads`]), so a trace's events are held
/// once, not per chunk and then again per thread (a 20 M-event trace took
/// 1.4 GB to replay when they were).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Chunk {
    offset: usize,
    header: ChunkHeader,
    payload: std::ops::Range<usize>,
}

/// A `.dat` file: read whole ([`Trace::open`]), or read where needed
/// ([`Trace::open_streaming`]: positioned reads, nothing held). A streamed file is
/// opened for each pass over it, not held open: a trace of thousands of processes would
/// otherwise take as many file descriptors.
pub(crate) enum Dat {
    Bytes(Vec<u8>),
    /// The file and its length when the trace was opened (a file still being written is
    /// read up to there).
    File { path: PathBuf, len: usize },
}

impl Dat {
    /// Opens the file for a pass.
    fn reader(&self) -> std::io::Result<DatReader<'_>> {
        Ok(match self {
            Dat::Bytes(b) => DatReader::Bytes(b),
            Dat::File { path, len } => DatReader::File {
                file: std::fs::File::open(path)?,
                len: *len,
            },
        })
    }
}

/// A [`Dat`] open for a pass.
enum DatReader<'a> {
    Bytes(&'a [u8]),
    File { file: std::fs::File, len: usize },
}

impl DatReader<'_> {
    fn len(&self) -> usize {
        match self {
            DatReader::Bytes(b) => b.len(),
            DatReader::File { len, .. } => *len,
        }
    }

    /// The bytes of `range` (within [`DatReader::len`]): borrowed, or read into `buf`.
    fn get<'a>(&'a self, range: std::ops::Range<usize>, buf: &'a mut Vec<u8>) -> std::io::Result<&'a [u8]> {
        match self {
            DatReader::Bytes(b) => Ok(&b[range]),
            DatReader::File { file, .. } => {
                use std::os::unix::fs::FileExt;
                buf.clear();
                buf.resize(range.len(), 0);
                file.read_exact_at(buf, range.start as u64)?;
                Ok(buf)
            }
        }
    }
}

/// The chunk header at `pos`; `None` when fewer than its bytes are left.
fn header_at(dat: &DatReader, pos: usize) -> std::io::Result<Option<Result<ChunkHeader, format::FormatError>>> {
    let Some(end) = pos.checked_add(CHUNK_HEADER_SIZE).filter(|&e| e <= dat.len()) else {
        return Ok(None);
    };
    let mut buf = Vec::new();
    let b: &[u8; CHUNK_HEADER_SIZE] = dat.get(pos..end, &mut buf)?.try_into().expect("a header's bytes");
    Ok(Some(ChunkHeader::decode(b)))
}

/// The next offset after `from` where a valid chunk header starts, looked for a block
/// at a time.
fn resync(dat: &DatReader, from: usize) -> std::io::Result<Option<usize>> {
    const BLOCK: usize = 1 << 16;
    let mut buf = Vec::new();
    let mut pos = from;
    while pos < dat.len() {
        // Blocks overlap by a magic's length less one: a magic across two is found.
        let end = dat.len().min(pos + BLOCK + CHUNK_MAGIC.len() - 1);
        let block = dat.get(pos..end, &mut buf)?;
        let mut i = 0;
        while let Some(rel) = block[i..].windows(CHUNK_MAGIC.len()).position(|w| w == CHUNK_MAGIC) {
            let at = pos + i + rel;
            if let Some(Ok(_)) = header_at(dat, at)? {
                return Ok(Some(at));
            }
            i += rel + 1;
        }
        pos += BLOCK;
    }
    Ok(None)
}

/// The first valid chunk header inside a chunk's claimed payload `range`, at a whole
/// number of events from its start (where the chunks that follow a chunk start).
fn header_inside(dat: &DatReader, range: std::ops::Range<usize>, buf: &mut Vec<u8>) -> std::io::Result<Option<usize>> {
    let start = range.start;
    let bytes = dat.get(range, buf)?;
    for (i, w) in bytes.chunks_exact(EVENT_SIZE).enumerate() {
        if w[..CHUNK_MAGIC.len()] == CHUNK_MAGIC {
            let at = start + i * EVENT_SIZE;
            if let Some(Ok(_)) = header_at(dat, at)? {
                return Ok(Some(at));
            }
        }
    }
    Ok(None)
}

fn plural(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

/// Decodes a `.dat` file into threads; damage is reported in `problems`.
fn read_dat(
    path: &Path,
    dat: Dat,
    pid: u32,
    cal: &Calibration,
    problems: &mut Vec<TraceError>,
) -> Vec<Thread> {
    let chunks = match dat.reader().map_err(|e| (Vec::new(), e)).and_then(|r| find_chunks(path, &r, problems)) {
        Ok(chunks) => chunks,
        Err((chunks, error)) => {
            // A read that failed: what came before it is kept.
            problems.push(TraceError::Io {
                path: path.to_path_buf(),
                error,
            });
            chunks
        }
    };
    group_threads(path, dat, pid, chunks, cal, problems)
}

/// The chunks of a `.dat` file, in file order; damage is reported in `problems` (and
/// skipped); a failed read ends the search with the chunks found before it.
fn find_chunks(
    path: &Path,
    dat: &DatReader,
    problems: &mut Vec<TraceError>,
) -> Result<Vec<Chunk>, (Vec<Chunk>, std::io::Error)> {
    let len = dat.len();
    let corrupt = |offset: usize, what: String| TraceError::Corrupt {
        path: path.to_path_buf(),
        offset: offset as u64,
        what,
    };
    let mut chunks: Vec<Chunk> = Vec::new();
    macro_rules! try_read {
        ($e:expr) => {
            match $e {
                Ok(v) => v,
                Err(e) => return Err((chunks, e)),
            }
        };
    }
    let mut pos = 0usize;
    let mut payload = Vec::new();
    while pos < len {
        let intact = plural(chunks.len(), "chunk");
        let header = match try_read!(header_at(dat, pos)) {
            None => {
                problems.push(corrupt(
                    pos,
                    format!(
                        "truncated chunk header: {} of {CHUNK_HEADER_SIZE} bytes before the end of the file; {intact} before it intact",
                        len - pos
                    ),
                ));
                break;
            }
            Some(Err(e)) => {
                let at = pos;
                let what = match try_read!(resync(dat, pos + 1)) {
                    Some(next) => {
                        pos = next;
                        format!("{e}; skipped {} bytes to the next chunk at offset {next} ({intact} before it intact)", next - at)
                    }
                    None => {
                        pos = len;
                        format!(
                            "{e}; the remaining {} bytes have no valid chunk ({intact} before it intact)",
                            len - at
                        )
                    }
                };
                problems.push(corrupt(at, what));
                continue;
            }
            Some(Ok(h)) => h,
        };
        let start = pos + CHUNK_HEADER_SIZE;
        let mut end = start + header.len as usize;
        // Where reading goes on after this chunk.
        let mut next = end;
        if end > len {
            // Cut short, or the length is wrong: prefer a valid header inside the claimed payload.
            match try_read!(resync(dat, start)) {
                Some(at) => {
                    problems.push(corrupt(
                        pos,
                        format!(
                            "chunk of tid {} seq {} claims {} payload bytes but the file ends after {}; a chunk header follows at offset {at}: events up to it kept, reading goes on there",
                            header.tid,
                            header.seq,
                            header.len,
                            len - start
                        ),
                    ));
                    end = at;
                    next = at;
                }
                None => {
                    next = len;
                    let have = (len - start) / EVENT_SIZE * EVENT_SIZE;
                    problems.push(corrupt(
                        pos,
                        format!(
                            "chunk of tid {} seq {} truncated: {} of {} payload bytes present; its {} complete event words kept ({intact} before it intact)",
                            header.tid,
                            header.seq,
                            len - start,
                            header.len,
                            have / EVENT_SIZE
                        ),
                    ));
                    end = start + have;
                }
            }
        } else if let Some(at) = try_read!(header_inside(dat, start..end, &mut payload)) {
            // Its length is wrong: the chunk whose header is inside the claimed payload
            // (and the chunks after it) would otherwise be read as its events.
            problems.push(corrupt(
                pos,
                format!(
                    "chunk of tid {} seq {} claims {} payload bytes, but a chunk header starts inside them at offset {at}: events up to it kept, reading goes on there",
                    header.tid, header.seq, header.len
                ),
            ));
            end = at;
            next = at;
        }
        chunks.push(Chunk {
            offset: pos,
            header,
            payload: start..end,
        });
        pos = next.max(pos + 1);
    }
    Ok(chunks)
}

/// Appends the events and losses of chunk `c` (`payload`: its bytes) to `out`.
fn decode_chunk(
    path: &Path,
    c: &Chunk,
    payload: &[u8],
    cal: &Calibration,
    out: &mut Vec<Item>,
    problems: &mut Vec<TraceError>,
) {
    let (offset, header) = (c.offset, c.header);
    let mut ticks = header.time;
    let mut events = 0usize;
    let mut event = |out: &mut Vec<Item>, kind, func, ticks: u64| {
        events += 1;
        out.push(Item::Event(Event {
            kind,
            func,
            ns: cal.to_ns(ticks),
        }));
    };
    if header.lost > 0 {
        out.push(Item::Loss {
            ns: cal.to_ns(ticks),
            what: Lost::Events(header.lost as u64),
        });
    }
    for (at, ev) in format::events(payload) {
        match ev {
            Ok(format::Event::Entry { func, delta }) => {
                ticks = ticks.wrapping_add(delta as u64);
                event(out, EventKind::Entry, func, ticks);
            }
            Ok(format::Event::Exit { func, delta }) => {
                ticks = ticks.wrapping_add(delta as u64);
                event(out, EventKind::Exit, func, ticks);
            }
            Ok(format::Event::Leaf {
                func,
                delta,
                duration,
            }) => {
                ticks = ticks.wrapping_add(delta as u64);
                event(out, EventKind::Entry, func, ticks);
                ticks = ticks.wrapping_add(duration as u64);
                event(out, EventKind::Exit, func, ticks);
            }
            Ok(format::Event::Time { ticks: abs }) => ticks = abs,
            Ok(format::Event::Lost { count }) => out.push(Item::Loss {
                ns: cal.to_ns(ticks),
                what: Lost::Events(count),
            }),
            Err(e) => {
                let skipped = (payload.len() - at) as u64;
                problems.push(TraceError::Corrupt {
                    path: path.to_path_buf(),
                    offset: (offset + CHUNK_HEADER_SIZE + at) as u64,
                    what: format!(
                        "{e} in the chunk of tid {} seq {} at offset {offset}; its {events} events before it kept, the remaining {skipped} bytes of the chunk skipped",
                        header.tid,
                        header.seq,
                    ),
                });
                out.push(Item::Loss {
                    ns: cal.to_ns(ticks),
                    what: Lost::Damaged(skipped),
                });
                break;
            }
        }
    }
}

/// Calls `f` with the events and losses of a thread's chunks (`run`, in `seq` order): a
/// gap in `seq` is a loss of chunks (at the previous event's time, or the next one's
/// before the first event); a repeated `seq` is reported.
fn decode_run(
    path: &Path,
    dat: &Dat,
    run: &[Chunk],
    tid: u32,
    cal: &Calibration,
    problems: &mut Vec<TraceError>,
    f: &mut impl FnMut(Item),
) {
    let mut next_seq: u64 = 0;
    let mut last_ns: Option<u64> = None;
    // One chunk's items (a chunk's loss of the chunks before it takes the time of its
    // first event when nothing came before).
    let mut items = Vec::new();
    let mut payload = Vec::new();
    let dat = match dat.reader() {
        Ok(r) => r,
        Err(error) => {
            // (The file is gone since the trace was opened.)
            problems.push(TraceError::Io {
                path: path.to_path_buf(),
                error,
            });
            let skipped = run.iter().map(|c| c.payload.len() as u64).sum();
            return f(Item::Loss {
                ns: 0,
                what: Lost::Damaged(skipped),
            });
        }
    };
    for c in run {
        let seq = c.header.seq as u64;
        if seq < next_seq {
            problems.push(TraceError::Corrupt {
                path: path.to_path_buf(),
                offset: c.offset as u64,
                what: format!("chunk of tid {tid} repeats seq {seq}; its events are appended after the first"),
            });
        }
        let gap = seq.saturating_sub(next_seq);
        next_seq = next_seq.max(seq + 1);
        items.clear();
        match dat.get(c.payload.clone(), &mut payload) {
            Ok(bytes) => decode_chunk(path, c, bytes, cal, &mut items, problems),
            Err(error) => {
                // (The file changed since it was opened.)
                problems.push(TraceError::Io {
                    path: path.to_path_buf(),
                    error,
                });
                items.push(Item::Loss {
                    ns: last_ns.unwrap_or(0),
                    what: Lost::Damaged(c.payload.len() as u64),
                });
            }
        }
        if gap > 0 {
            let ns = last_ns.unwrap_or_else(|| {
                items
                    .iter()
                    .find_map(|i| match i {
                        Item::Event(e) => Some(e.ns),
                        Item::Loss { .. } => None,
                    })
                    .unwrap_or(0)
            });
            f(Item::Loss {
                ns,
                what: Lost::Chunks(gap),
            });
        }
        for &i in &items {
            if let Item::Event(e) = i {
                last_ns = Some(e.ns);
            }
            f(i);
        }
    }
}

/// Orders each thread's chunks by seq and joins their events (decoded, or streamed: see
/// [`Thread`]). A tid seen again with seq 0 after a complete run (tid reuse) starts a new
/// thread.
fn group_threads(
    path: &Path,
    dat: Dat,
    pid: u32,
    chunks: Vec<Chunk>,
    cal: &Calibration,
    problems: &mut Vec<TraceError>,
) -> Vec<Thread> {
    // A file read where needed gives streamed threads.
    let streamed = matches!(dat, Dat::File { .. });
    // tid → runs of chunks (one run per incarnation of the tid).
    let mut by_tid: BTreeMap<u32, Vec<Vec<Chunk>>> = BTreeMap::new();
    for c in chunks {
        let runs = by_tid.entry(c.header.tid).or_default();
        let new_run = match runs.last() {
            None => true,
            Some(run) => {
                c.header.seq == 0 && run.iter().any(|o| o.header.seq == 0 || o.header.is_last())
            }
        };
        if new_run {
            runs.push(Vec::new());
        }
        if let Some(run) = runs.last_mut() {
            run.push(c);
        }
    }
    let dat = std::sync::Arc::new(dat);
    let shared_path = std::sync::Arc::new(path.to_path_buf());
    let mut threads = Vec::new();
    for (tid, runs) in by_tid {
        for mut run in runs {
            run.sort_by_key(|c| c.header.seq);
            let mut t = Thread {
                tid,
                exited: run.iter().any(|c| c.header.is_last()),
                ..Default::default()
            };
            if let Dat::Bytes(bytes) = &*dat {
                // Room for exactly its events (a LEAF is two).
                t.events.reserve_exact(
                    run.iter().map(|c| format::count_events(&bytes[c.payload.clone()]) as usize).sum(),
                );
            }
            let mut span: Option<(u64, u64)> = None;
            decode_run(path, &dat, &run, tid, cal, problems, &mut |i| {
                match i {
                    Item::Event(e) => {
                        span = Some((span.map_or(e.ns, |s| s.0), e.ns));
                        if !streamed {
                            t.events.push(e);
                        }
                    }
                    Item::Loss { ns, what } => {
                        match what {
                            Lost::Events(n) => t.lost = t.lost.saturating_add(n),
                            Lost::Chunks(n) => t.lost_chunks += n,
                            Lost::Damaged(_) => {}
                        }
                        if !streamed {
                            t.losses.push(Loss { at: t.events.len(), ns, what });
                        }
                    }
                }
            });
            if streamed {
                t.stored = Some(Stored {
                    path: shared_path.clone(),
                    dat: dat.clone(),
                    run,
                    cal: *cal,
                    span,
                });
            }
            threads.push(t);
        }
    }
    // The main thread first, then by first event time.
    threads.sort_by_key(|t| (t.tid != pid, t.span().map_or(u64::MAX, |s| s.0), t.tid));
    threads
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`resync`] over the whole bytes at once: the model of the block-wise search.
    fn resync_whole(bytes: &[u8], from: usize) -> Option<usize> {
        (from..bytes.len().saturating_sub(CHUNK_HEADER_SIZE - 1))
            .find(|&at| bytes[at..at + CHUNK_HEADER_SIZE].try_into().is_ok_and(|b| ChunkHeader::decode(b).is_ok()))
    }

    /// Valid headers and bare magics (bad headers) around the search's block edges,
    /// one header across an edge: read from a file block by block, the search finds
    /// what a search of the whole bytes finds, from every start.
    #[test]
    fn the_block_wise_search_finds_what_the_whole_bytes_hold() {
        const BLOCK: usize = 1 << 16;
        let mut bytes: Vec<u8> = (0..3 * BLOCK + 500).map(|i| (i * 7 + i / 251) as u8).collect();
        let header = ChunkHeader { tid: 9, seq: 1, len: 8, ..Default::default() }.encode();
        for at in [BLOCK - 2, 2 * BLOCK - 40, 3 * BLOCK + 100] {
            bytes[at..at + CHUNK_HEADER_SIZE].copy_from_slice(&header);
        }
        for at in [100, BLOCK + 40, 2 * BLOCK - 2, 3 * BLOCK + 480] {
            bytes[at..at + 4].copy_from_slice(&CHUNK_MAGIC);
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.dat");
        std::fs::write(&path, &bytes).unwrap();
        let file = Dat::File { path: path.clone(), len: bytes.len() };
        let mem = Dat::Bytes(bytes.clone());
        let (file, mem) = (file.reader().unwrap(), mem.reader().unwrap());
        let mut found = Vec::new();
        for from in (0..bytes.len()).step_by(1999).chain([BLOCK - 3, BLOCK - 2, BLOCK - 1, BLOCK + 40, 2 * BLOCK - 40, 2 * BLOCK - 3, 3 * BLOCK + 100, 3 * BLOCK + 101]) {
            let want = resync_whole(&bytes, from);
            assert_eq!(resync(&file, from).unwrap(), want, "from {from}");
            assert_eq!(resync(&mem, from).unwrap(), want, "from {from}");
            found.extend(want);
        }
        found.sort();
        found.dedup();
        assert_eq!(found, vec![BLOCK - 2, 2 * BLOCK - 40, 3 * BLOCK + 100]);
    }
}
