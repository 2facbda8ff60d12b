//! Synthetic trace directories written with the format's encoders, for the reader's
//! tests (also included by the CLI's tests).
#![allow(dead_code)]

use ftramp_trace::format::{self, ChunkHeader, Event};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Calibration of the synthetic traces: 2 ticks per ns, tick 1000 = 5 ms.
pub const TPS: u64 = 2_000_000_000;
pub const BASE_TICKS: u64 = 1000;
pub const BASE_NS: u64 = 5_000_000;

/// Ticks of `ns` nanoseconds after the base.
pub fn ticks(ns: u64) -> u64 {
    BASE_TICKS + 2 * ns
}

/// Delta field for `ns` nanoseconds.
pub fn d(ns: u64) -> u32 {
    u32::try_from(2 * ns).expect("delta fits")
}

pub fn entry(func: u32, ns_after: u64) -> Event {
    Event::Entry {
        func,
        delta: d(ns_after),
    }
}

pub fn exit(func: u32, ns_after: u64) -> Event {
    Event::Exit {
        func,
        delta: d(ns_after),
    }
}

/// One chunk's bytes: header (tid, seq, flags, lost, time = ticks(start_ns)) + events.
pub fn chunk(
    tid: u32,
    seq: u32,
    flags: u16,
    lost: u32,
    start_ns: u64,
    events: &[Event],
) -> Vec<u8> {
    let mut words = Vec::new();
    for e in events {
        e.encode_into(&mut words);
    }
    let payload = format::words_to_bytes(&words);
    let h = ChunkHeader {
        flags,
        tid,
        seq,
        len: payload.len() as u32,
        lost,
        time: ticks(start_ns),
    };
    let mut out = h.encode().to_vec();
    out.extend_from_slice(&payload);
    out
}

pub fn write_info(dir: &Path, tracer: &str, command: &[&str]) {
    let cmd: Vec<String> = command.iter().map(|c| format!("{c:?}")).collect();
    std::fs::write(
        dir.join("info"),
        format!(
            "version = 1\ntracer = \"{tracer}\"\ncommand = [{}]\nclock = \"tsc\"\n\n[options]\ndepth = 0\n",
            cmd.join(", ")
        ),
    )
    .unwrap();
}

pub fn write_process_info(
    dir: &Path,
    pid: u32,
    image: u32,
    ppid: u32,
    exe: &str,
    forked_from: Option<&str>,
    tail: &str,
) {
    let mut s = format!(
        "pid = {pid}\nppid = {ppid}\nn = {image}\nexe = {exe:?}\nargs = [\"demo\", \"x\"]\nticks_per_sec = {TPS}\nbase_ticks = {BASE_TICKS}\nbase_ns = {BASE_NS}\n"
    );
    if let Some(f) = forked_from {
        s.push_str(&format!("forked_from = {f:?}\n"));
    }
    s.push_str(tail);
    std::fs::write(dir.join(format::task_file_name(pid, image, "info")), s).unwrap();
}

pub fn write_syms(dir: &Path, pid: u32, image: u32, names: &[&str]) {
    let mut f = std::fs::File::create(dir.join(format::task_file_name(pid, image, "sym"))).unwrap();
    for (i, n) in names.iter().enumerate() {
        let l = format::SymLine {
            id: i as u32,
            addr: 0x1000 + 0x10 * i as u64,
            size: 16,
            symbol: n.to_string(),
            module: "/bin/demo".into(),
        };
        writeln!(f, "{}", l.to_line()).unwrap();
    }
}

pub fn dat_path(dir: &Path, pid: u32, image: u32) -> PathBuf {
    dir.join(format::task_file_name(pid, image, "dat"))
}

/// Function ids of the demo trace.
pub const MAIN: u32 = 0;
pub const A: u32 = 1;
pub const B: u32 = 2;
pub const C: u32 = 3;
pub const WORKER: u32 = 4;

/// Byte offsets of the chunks of task-100-0.dat in [`demo_trace`].
pub struct DemoLayout {
    /// Start of each chunk in task-100-0.dat (thread 100 seq 0, thread 101 seq 0,
    /// thread 100 seq 1, thread 101 seq 2).
    pub chunks: [usize; 4],
    pub len: usize,
}

/// A small function_graph trace (times in ns after BASE_NS):
///
/// process 100 (/bin/demo x, exit code 0):
///   thread 100: main [0, 2_020_000] { a [1000, 2000] { b [1100, 1600], c [1700, 1900] },
///               b [3000, 3500], 3 events lost, c [10_000, 2_010_000] (after a TIME event) }
///   thread 101: worker [1500, unfinished] { b [1600, 1900], chunk seq 1 missing,
///               c [5000, 5050] }
/// process 102 (fork child of 100-0, exit code 0):
///   thread 102: a [4000, 4100]
pub fn demo_trace(dir: &Path) -> DemoLayout {
    demo_trace_as(dir, false)
}

/// Each ENTRY followed by the EXIT of the same function, both times under
/// 2^16 ticks, as one LEAF (what the recorder writes for such calls).
pub fn as_leaves(events: &[Event]) -> Vec<Event> {
    let mut out: Vec<Event> = Vec::new();
    for &e in events {
        match (out.last().copied(), e) {
            (
                Some(Event::Entry { func, delta }),
                Event::Exit {
                    func: f,
                    delta: duration,
                },
            ) if f == func && delta <= 0xffff && duration <= 0xffff => {
                *out.last_mut().unwrap() = Event::Leaf {
                    func,
                    delta: delta as u16,
                    duration: duration as u16,
                };
            }
            _ => out.push(e),
        }
    }
    out
}

/// [`demo_trace`], with its leaf calls written as LEAF events when `leaves`.
pub fn demo_trace_as(dir: &Path, leaves: bool) -> DemoLayout {
    let chunk = |tid, seq, flags, lost, start_ns, events: &[Event]| {
        let events = if leaves { as_leaves(events) } else { events.to_vec() };
        chunk(tid, seq, flags, lost, start_ns, &events)
    };
    std::fs::create_dir_all(dir).unwrap();
    write_info(dir, "function_graph", &["demo", "x"]);
    let names = ["main", "a", "b", "c", "worker"];
    write_process_info(
        dir,
        100,
        0,
        1,
        "/bin/demo",
        None,
        "lost = 3\nexit = \"code 0\"\n",
    );
    write_syms(dir, 100, 0, &names);
    write_process_info(
        dir,
        102,
        0,
        100,
        "/bin/demo",
        Some("100-0"),
        "exit = \"code 0\"\n",
    );
    write_syms(dir, 102, 0, &names);

    let c0 = chunk(
        100,
        0,
        0,
        0,
        0,
        &[
            entry(MAIN, 0),
            entry(A, 1000),
            entry(B, 100),
            exit(B, 500),
            entry(C, 100),
            exit(C, 200),
            exit(A, 100),
        ],
    );
    let c1 = chunk(
        101,
        0,
        0,
        0,
        1500,
        &[entry(WORKER, 0), entry(B, 100), exit(B, 300)],
    );
    let mut c2_events = vec![entry(B, 0), exit(B, 500), Event::Lost { count: 3 }];
    c2_events.push(Event::Time {
        ticks: ticks(10_000),
    });
    c2_events.extend([entry(C, 0), exit(C, 2_000_000), exit(MAIN, 10_000)]);
    let c2 = chunk(100, 1, format::FLAG_LAST, 0, 3000, &c2_events);
    let c3 = chunk(
        101,
        2,
        format::FLAG_FLUSH,
        0,
        5000,
        &[entry(C, 0), exit(C, 50)],
    );
    let mut bytes = Vec::new();
    let mut chunks = [0; 4];
    for (i, c) in [c0, c1, c2, c3].iter().enumerate() {
        chunks[i] = bytes.len();
        bytes.extend_from_slice(c);
    }
    std::fs::write(dat_path(dir, 100, 0), &bytes).unwrap();

    let child = chunk(
        102,
        0,
        format::FLAG_LAST,
        0,
        4000,
        &[entry(A, 0), exit(A, 100)],
    );
    std::fs::write(dat_path(dir, 102, 0), child).unwrap();
    DemoLayout {
        chunks,
        len: bytes.len(),
    }
}

/// Expected `ftramp replay` body of [`demo_trace`] after the first line.
pub const DEMO_REPLAY: &str = "\
#
# process 100 image 0: /bin/demo x (exit: code 0; lost 3 events)

# thread 100: lost 3 events
# DURATION     TID     FUNCTION
            [   100] | main() {
            [   100] |   a() {
   0.500 us [   100] |     b();
   0.200 us [   100] |     c();
   1.000 us [   100] |   } /* a */
   0.500 us [   100] |   b();
            [   100] |   /* lost 3 events */
   2.000 ms [   100] |   c();
   2.020 ms [   100] | } /* main */

# thread 101: 1 chunk missing
# DURATION     TID     FUNCTION
            [   101] | worker() {
   0.300 us [   101] |   b();
            [   101] |   /* lost 1 chunk */
   0.050 us [   101] |   c();
            [   101] | } /* worker: unfinished */
#
# process 102 image 0: /bin/demo x (forked from 100-0; exit: code 0)

# DURATION     TID     FUNCTION
   0.100 us [   102] | a();
";

/// A fresh directory under the system temp dir, removed on drop.
pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("ftramp-trace-test")
        .tempdir()
        .unwrap()
}

/// [`Trace::open`], checked against [`Trace::open_streaming`]: the same problems and, for
/// every thread, the same figures and the same events and losses in the same order. Every
/// test that opens a trace through it checks that replay, report and dump (which read
/// threads only through `for_each` and `span`) see the same trace either way.
pub fn open(dir: &Path) -> Result<ftramp_trace::Trace, ftramp_trace::TraceError> {
    use ftramp_trace::read::Item;
    let decoded = ftramp_trace::Trace::open(dir);
    let streamed = ftramp_trace::Trace::open_streaming(dir);
    let (d, s) = match (&decoded, &streamed) {
        (Ok(d), Ok(s)) => (d, s),
        (Err(d), Err(s)) => {
            assert_eq!(d.to_string(), s.to_string());
            return decoded;
        }
        _ => panic!("{}: one way opens, the other does not", dir.display()),
    };
    let problems = |t: &ftramp_trace::Trace| t.problems.iter().map(|p| p.to_string()).collect::<Vec<_>>();
    assert_eq!(problems(d), problems(s));
    assert_eq!(d.processes.len(), s.processes.len());
    for (dp, sp) in d.processes.iter().zip(&s.processes) {
        assert_eq!((dp.pid, dp.image, dp.lost, dp.start_ns, dp.threads.len()), (sp.pid, sp.image, sp.lost, sp.start_ns, sp.threads.len()));
        for (dt, st) in dp.threads.iter().zip(&sp.threads) {
            assert!(st.events.is_empty() && st.losses.is_empty(), "a streamed thread holds no events");
            assert_eq!((dt.tid, dt.lost, dt.lost_chunks, dt.exited, dt.span()), (st.tid, st.lost, st.lost_chunks, st.exited, st.span()));
            let items = |t: &ftramp_trace::Thread| {
                let mut v: Vec<Item> = Vec::new();
                t.for_each(|i| v.push(i));
                v
            };
            let di = items(dt);
            assert_eq!(di.iter().filter(|i| matches!(i, Item::Event(_))).count(), dt.events.len());
            assert_eq!(di, items(st), "{}: tid {}", dir.display(), dt.tid);
        }
    }
    decoded
}
