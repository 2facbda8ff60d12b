//! Truncated and corrupted traces: clear errors naming the file and offset, the intact
//! part still read, and no panic on any damage.

mod common;

use common::*;
use ftramp_trace::dump::{self, FoldOptions};
use ftramp_trace::format::{self, CHUNK_HEADER_SIZE};
use ftramp_trace::read::{Calibration, Lost};
use ftramp_trace::replay::{self, ReplayOptions, Select};
use ftramp_trace::report::{self, ReportOptions};
use ftramp_trace::{EventKind, Trace, TraceError};
use std::path::Path;

fn messages(t: &Trace) -> Vec<String> {
    t.problems.iter().map(|p| p.to_string()).collect()
}

fn only_problem(t: &Trace) -> String {
    let m = messages(t);
    assert_eq!(m.len(), 1, "{m:#?}");
    m[0].clone()
}

fn thread(t: &Trace, tid: u32) -> &ftramp_trace::Thread {
    t.processes
        .iter()
        .flat_map(|p| &p.threads)
        .find(|th| th.tid == tid)
        .unwrap()
}

fn edit_dat(dir: &Path, f: impl FnOnce(&mut Vec<u8>)) {
    let p = dat_path(dir, 100, 0);
    let mut b = std::fs::read(&p).unwrap();
    f(&mut b);
    std::fs::write(p, b).unwrap();
}

#[test]
fn missing_or_empty_dir_fails_clearly() {
    let dir = tempdir();
    let missing = dir.path().join("nope");
    let e = open(&missing).unwrap_err();
    assert!(matches!(e, TraceError::Io { .. }));
    assert!(
        e.to_string()
            .starts_with(&format!("{}: ", missing.display())),
        "{e}"
    );
    let e = open(dir.path()).unwrap_err();
    assert!(
        e.to_string().contains("not an ftramp trace directory"),
        "{e}"
    );
}

#[test]
fn truncated_mid_header() {
    let dir = tempdir();
    let l = demo_trace(dir.path());
    // Cut 10 bytes into the third chunk's header (thread 100 seq 1).
    let cut = l.chunks[2] + 10;
    edit_dat(dir.path(), |b| b.truncate(cut));
    let t = open(dir.path()).unwrap();
    let m = only_problem(&t);
    let dat = dat_path(dir.path(), 100, 0);
    assert_eq!(
        m,
        format!(
            "{}: offset {}: truncated chunk header: 10 of 32 bytes before the end of the file; 2 chunks before it intact",
            dat.display(),
            l.chunks[2]
        )
    );
    // Thread 100 keeps its first chunk: 7 events, main unfinished.
    assert_eq!(thread(&t, 100).events.len(), 7);
    assert_eq!(thread(&t, 101).events.len(), 3);
    let mut out = Vec::new();
    replay::replay(&t, &ReplayOptions::default(), &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.contains("            [   100] | } /* main: unfinished */\n"),
        "{text}"
    );
}

#[test]
fn truncated_mid_payload_keeps_complete_events() {
    let dir = tempdir();
    let l = demo_trace(dir.path());
    // The last chunk (thread 101 seq 2: entry c, exit c): keep its header and 12 bytes.
    let cut = l.chunks[3] + CHUNK_HEADER_SIZE + 12;
    edit_dat(dir.path(), |b| b.truncate(cut));
    let t = open(dir.path()).unwrap();
    let m = only_problem(&t);
    assert!(
        m.ends_with(&format!(
            "offset {}: chunk of tid 101 seq 2 truncated: 12 of 16 payload bytes present; its 1 complete event words kept (3 chunks before it intact)",
            l.chunks[3]
        )),
        "{m}"
    );
    let ev = &thread(&t, 101).events;
    assert_eq!(ev.len(), 4);
    assert_eq!((ev[3].kind, ev[3].func), (EventKind::Entry, C));
}

#[test]
fn bad_magic_resynchronises_on_the_next_chunk() {
    let dir = tempdir();
    let l = demo_trace(dir.path());
    edit_dat(dir.path(), |b| {
        b[l.chunks[0]..l.chunks[0] + 4].copy_from_slice(b"XXXX")
    });
    let t = open(dir.path()).unwrap();
    let m = only_problem(&t);
    let skipped = l.chunks[1] - l.chunks[0];
    assert_eq!(
        m,
        format!(
            "{}: offset 0: bad chunk magic [58, 58, 58, 58] (expected \"FTRC\"); skipped {skipped} bytes to the next chunk at offset {} (0 chunks before it intact)",
            dat_path(dir.path(), 100, 0).display(),
            l.chunks[1]
        )
    );
    // Thread 100 lost its seq 0 chunk: counted, and its later chunk still read.
    let th = thread(&t, 100);
    assert_eq!(th.lost_chunks, 1);
    assert_eq!(th.losses[0].what, Lost::Chunks(1));
    assert_eq!(th.events.len(), 5);
    assert_eq!(thread(&t, 101).events.len(), 5);
}

#[test]
fn a_bad_event_keeps_the_events_before_it() {
    let dir = tempdir();
    let l = demo_trace(dir.path());
    // The 4th event of the first chunk (exit b) becomes an EXTENDED event
    // with its id and delta in the bits that must be zero.
    let at = l.chunks[0] + CHUNK_HEADER_SIZE + 3 * 8;
    edit_dat(dir.path(), |b| b[at] = (b[at] & !3) | 2);
    let t = open(dir.path()).unwrap();
    let m = only_problem(&t);
    assert!(
        m.contains(&format!("offset {at}: bad extended event 0x")),
        "{m}"
    );
    assert!(m.ends_with("in the chunk of tid 100 seq 0 at offset 0; its 3 events before it kept, the remaining 32 bytes of the chunk skipped"), "{m}");
    let th = thread(&t, 100);
    // 3 events of chunk 0, then all 5 of seq 1; the damage is marked where it happened.
    assert_eq!(th.events.len(), 8);
    assert_eq!(th.losses[0].what, Lost::Damaged(32));
    assert_eq!(th.losses[0].at, 3);
    let mut out = Vec::new();
    replay::replay(&t, &ReplayOptions::default(), &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.contains("            [   100] |       /* skipped 32 damaged bytes */\n"),
        "{text}"
    );
}

#[test]
fn length_too_big_and_past_the_end() {
    // Over the format's limit: a bad header, read on from the next chunk.
    let dir = tempdir();
    let l = demo_trace(dir.path());
    edit_dat(dir.path(), |b| {
        b[l.chunks[1] + 16..l.chunks[1] + 20].copy_from_slice(&0x7fff_fff8u32.to_le_bytes())
    });
    let t = open(dir.path()).unwrap();
    let m = only_problem(&t);
    assert!(
        m.contains(&format!(
            "offset {}: bad chunk length 2147483640",
            l.chunks[1]
        )),
        "{m}"
    );
    assert!(
        m.contains(&format!(
            "to the next chunk at offset {} (1 chunk before it intact)",
            l.chunks[2]
        )),
        "{m}"
    );
    assert_eq!(thread(&t, 100).events.len(), 12);

    // Within the limit but past the end of the file: the next header is found inside.
    let dir = tempdir();
    let l = demo_trace(dir.path());
    edit_dat(dir.path(), |b| {
        b[l.chunks[1] + 16..l.chunks[1] + 20].copy_from_slice(&(1u32 << 20).to_le_bytes())
    });
    let t = open(dir.path()).unwrap();
    let m = only_problem(&t);
    assert!(
        m.contains(&format!(
            "offset {}: chunk of tid 101 seq 0 claims 1048576 payload bytes but the file ends after",
            l.chunks[1]
        )),
        "{m}"
    );
    assert!(
        m.contains(&format!("a chunk header follows at offset {}", l.chunks[2])),
        "{m}"
    );
    assert_eq!(thread(&t, 100).events.len(), 12);
    assert_eq!(thread(&t, 101).events.len(), 5);
}

/// A length too big but inside the file (found by fuzzing): thread 101's first chunk
/// claims the next chunk (thread 100 seq 1) as its payload, ending on the header of the
/// chunk after it, or 8 bytes into that next chunk.  The swallowed chunk was read as
/// thread 101's events, damaged at its header, and thread 100 lost its second chunk.
#[test]
fn a_length_too_big_inside_the_file_does_not_swallow_the_next_chunk() {
    let claimed_ends = |l: &DemoLayout| [l.chunks[3], l.chunks[2] + 8];
    for which in 0..2 {
        let dir = tempdir();
        let l = demo_trace(dir.path());
        let len = (claimed_ends(&l)[which] - l.chunks[1] - CHUNK_HEADER_SIZE) as u32;
        edit_dat(dir.path(), |b| {
            b[l.chunks[1] + 16..l.chunks[1] + 20].copy_from_slice(&len.to_le_bytes())
        });
        let t = open(dir.path()).unwrap();
        let m = only_problem(&t);
        assert_eq!(
            m,
            format!(
                "{}: offset {}: chunk of tid 101 seq 0 claims {len} payload bytes, but a chunk header starts inside them at offset {}: events up to it kept, reading goes on there",
                dat_path(dir.path(), 100, 0).display(),
                l.chunks[1],
                l.chunks[2]
            )
        );
        let mut out = Vec::new();
        replay::replay(&t, &ReplayOptions::default(), &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.split_once('\n').unwrap().1, DEMO_REPLAY, "claimed end {which}");
    }
}

#[test]
fn missing_sym_shows_ids() {
    let dir = tempdir();
    demo_trace(dir.path());
    let sym = dir.path().join(format::task_file_name(100, 0, "sym"));
    std::fs::remove_file(&sym).unwrap();
    let t = open(dir.path()).unwrap();
    assert_eq!(
        only_problem(&t),
        format!("{}: missing; functions are shown by id", sym.display())
    );
    let mut out = Vec::new();
    replay::replay(
        &t,
        &ReplayOptions {
            select: Select {
                tid: Some(100),
                pid: None,
            },
            ..Default::default()
        },
        &mut out,
    )
    .unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.contains("            [   100] | #0() {\n            [   100] |   #1() {\n"),
        "{text}"
    );
}

#[test]
fn bad_sym_lines_are_named() {
    let dir = tempdir();
    demo_trace(dir.path());
    let sym = dir.path().join(format::task_file_name(100, 0, "sym"));
    let text = std::fs::read_to_string(&sym)
        .unwrap()
        .replace("2 1020 16 b", "2 zz 16 b");
    // A crash cut the last line short.
    let text = format!("{text}5 10");
    std::fs::write(&sym, text).unwrap();
    let t = open(dir.path()).unwrap();
    let m = messages(&t);
    assert_eq!(m.len(), 2, "{m:#?}");
    assert!(
        m[0].starts_with(&format!("{}: line 3: bad address \"zz\"", sym.display())),
        "{}",
        m[0]
    );
    assert!(
        m[1].starts_with(&format!("{}: line 6: missing size field", sym.display())),
        "{}",
        m[1]
    );
    assert_eq!(t.processes[0].func_name(B), "#2");
    assert_eq!(t.processes[0].func_name(C), "c");
}

#[test]
fn missing_or_bad_info() {
    // No .info for process 102: it borrows process 100's calibration.
    let dir = tempdir();
    demo_trace(dir.path());
    let info = dir.path().join(format::task_file_name(102, 0, "info"));
    std::fs::remove_file(&info).unwrap();
    let t = open(dir.path()).unwrap();
    let m = messages(&t);
    assert_eq!(
        m,
        [
            format!(
                "{}: missing; process details and clock calibration unknown",
                info.display()
            ),
            format!(
                "{}: no clock calibration; timestamps use another process's calibration",
                info.display()
            ),
        ]
    );
    assert_eq!(thread(&t, 102).events[0].ns, BASE_NS + 4000);

    // A half-written line and a bad value: the rest of the file is still used.
    let dir = tempdir();
    demo_trace(dir.path());
    let info = dir.path().join(format::task_file_name(100, 0, "info"));
    let text = std::fs::read_to_string(&info)
        .unwrap()
        .replace("ppid = 1", "ppid = \"x\"");
    std::fs::write(&info, format!("{text}exit = \"sig")).unwrap();
    let t = open(dir.path()).unwrap();
    let m = messages(&t);
    assert_eq!(m.len(), 2, "{m:#?}");
    assert!(
        m[0].starts_with(&format!(
            "{}: line 11: not `key = value` TOML",
            info.display()
        )),
        "{}",
        m[0]
    );
    assert_eq!(m[1], format!("{}: bad `ppid` value \"x\"", info.display()));
    assert_eq!(t.processes[0].exit.as_deref(), Some("code 0"));
    assert_eq!(thread(&t, 100).events[11].ns, BASE_NS + 2_020_000);

    // No trace-wide info.
    let dir = tempdir();
    demo_trace(dir.path());
    std::fs::remove_file(dir.path().join("info")).unwrap();
    let t = open(dir.path()).unwrap();
    assert!(only_problem(&t)
        .ends_with("info: missing; tracer and command unknown (read as function_graph)"));
    assert!(t.info.has_exits());

    // No trace-wide info, as a recording made without `ftramp record`
    // (under qemu-user): the tracer the images' .info name is the trace's.
    // Before, a `function` trace was read as function_graph (every call
    // unfinished, nested ever deeper).
    for (tracers, want, has_exits) in [
        (["function", "function"], "tracer function, as the images' .info say", false),
        (["function_graph", "function_graph"], "tracer function_graph, as the images' .info say", true),
        (["function", "function_graph"], "the images' .info name tracers function, function_graph (read as function_graph)", true),
    ] {
        let dir = tempdir();
        demo_trace(dir.path());
        std::fs::remove_file(dir.path().join("info")).unwrap();
        let infos: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "info"))
            .collect();
        assert_eq!(infos.len(), 2);
        for (path, tracer) in infos.iter().zip(tracers) {
            let text = std::fs::read_to_string(path).unwrap();
            std::fs::write(path, format!("{text}tracer = \"{tracer}\"\n")).unwrap();
        }
        let t = open(dir.path()).unwrap();
        assert!(only_problem(&t).contains(want), "{tracers:?}: {}", only_problem(&t));
        assert_eq!(t.info.has_exits(), has_exits, "{tracers:?}");
    }
}

/// One byte that is not UTF-8 in `info` or a `.info` (found by fuzzing) lost the whole
/// file: a `function` trace was then read as function_graph (every call nested in the
/// one before: `replay` of a 700 KB trace wrote gigabytes), and a process lost its
/// calibration.  Now only the damaged line is lost; and when `info` names no known tracer,
/// the one the images' `.info` name is used, as when `info` is missing.
#[test]
fn a_bad_byte_in_an_info_file_loses_only_its_line() {
    let with_tracer = |dir: &Path| {
        for pid in [100, 102] {
            let path = dir.join(format::task_file_name(pid, 0, "info"));
            let text = std::fs::read_to_string(&path).unwrap();
            std::fs::write(&path, format!("{text}tracer = \"function\"\n")).unwrap();
        }
    };
    // `info` of a function trace, a bad byte in its command.
    let dir = tempdir();
    demo_trace(dir.path());
    with_tracer(dir.path());
    let info = dir.path().join("info");
    let text = std::fs::read_to_string(&info).unwrap().replace("tracer = \"function_graph\"", "tracer = \"function\"");
    let at = text.find("demo").unwrap();
    let mut bytes = text.into_bytes();
    bytes[at] = 0xff;
    std::fs::write(&info, &bytes).unwrap();
    let t = open(dir.path()).unwrap();
    assert_eq!(
        only_problem(&t),
        format!("{}: offset {at}: not UTF-8; read with U+FFFD in place of the bad bytes", info.display())
    );
    assert!(!t.info.has_exits());
    assert_eq!(t.info.command, ["\u{fffd}emo", "x"]);

    // Its tracer line damaged (a quote become a bad byte): the images' tracer.
    let dir = tempdir();
    demo_trace(dir.path());
    with_tracer(dir.path());
    let info = dir.path().join("info");
    let mut bytes = std::fs::read(&info).unwrap();
    let at = bytes.windows(9).position(|w| w == b"= \"functi").unwrap() + 2;
    bytes[at] = 0xc3;
    std::fs::write(&info, &bytes).unwrap();
    let t = open(dir.path()).unwrap();
    let m = messages(&t);
    assert_eq!(m.len(), 3, "{m:#?}");
    assert_eq!(m[0], format!("{}: offset {at}: not UTF-8; read with U+FFFD in place of the bad bytes", info.display()));
    assert!(m[1].starts_with(&format!("{}: line 2: not `key = value` TOML", info.display())), "{}", m[1]);
    assert_eq!(m[2], format!("{}: no `tracer`; read as function, as the images' .info say", info.display()));
    assert!(!t.info.has_exits());
    assert_eq!(t.info.command, ["demo", "x"]);

    // A process's .info, a bad byte in its exe: its calibration and exit are kept.
    let dir = tempdir();
    demo_trace(dir.path());
    let pinfo = dir.path().join(format::task_file_name(100, 0, "info"));
    let mut bytes = std::fs::read(&pinfo).unwrap();
    let at = bytes.windows(4).position(|w| w == b"demo").unwrap();
    bytes[at] = 0x80;
    std::fs::write(&pinfo, &bytes).unwrap();
    let t = open(dir.path()).unwrap();
    assert_eq!(
        only_problem(&t),
        format!("{}: offset {at}: not UTF-8; read with U+FFFD in place of the bad bytes", pinfo.display())
    );
    let p = &t.processes[0];
    assert_eq!((p.pid, p.exe.as_str(), p.exit.as_deref()), (100, "/bin/\u{fffd}emo", Some("code 0")));
    assert_eq!(thread(&t, 100).events[11].ns, BASE_NS + 2_020_000);
}

#[test]
fn the_runs_calibration_is_every_processs() {
    // `[calibration]` in the trace's info (ftramp record writes it when the
    // program has ended) replaces the processes' provisional ones: here 4
    // ticks per ns instead of 2, and a base 1 ms later, so an event 4000 ns
    // after the base in the processes' calibration lands at
    // 1 ms + (4000 * 2) / 4 ns.
    let dir = tempdir();
    demo_trace(dir.path());
    let info = dir.path().join("info");
    let text = std::fs::read_to_string(&info).unwrap();
    let run = format!(
        "{text}\n[calibration]\nticks_per_sec = {}\nbase_ticks = {BASE_TICKS}\nbase_ns = {}\n",
        2 * TPS,
        BASE_NS + 1_000_000
    );
    std::fs::write(&info, &run).unwrap();
    let t = open(dir.path()).unwrap();
    assert!(t.problems.is_empty(), "{:#?}", messages(&t));
    assert_eq!(t.info.calibration.map(|c| c.ticks_per_sec), Some(2 * TPS));
    assert_eq!(thread(&t, 102).events[0].ns, BASE_NS + 1_000_000 + 2000);
    for p in &t.processes {
        assert_eq!(p.calibration.ticks_per_sec, 2 * TPS, "process {}", p.pid);
    }
    // It also stands in for a process's missing .info, without a complaint
    // about the clock.
    std::fs::remove_file(dir.path().join(format::task_file_name(102, 0, "info"))).unwrap();
    let t = open(dir.path()).unwrap();
    let m = messages(&t);
    assert_eq!(m.len(), 1, "{m:#?}");
    assert!(m[0].ends_with("missing; process details and clock calibration unknown"), "{}", m[0]);
    assert_eq!(thread(&t, 102).events[0].ns, BASE_NS + 1_000_000 + 2000);

    // A bad one is reported and the processes' own are used.
    std::fs::write(&info, format!("{text}\n[calibration]\nticks_per_sec = 0\nbase_ticks = 1\n")).unwrap();
    let t = open(dir.path()).unwrap();
    let m = messages(&t);
    assert!(m.iter().any(|m| m.contains("bad `[calibration]`") && m.contains("each process's own is used")), "{m:#?}");
    assert_eq!(t.info.calibration, None);
    assert_eq!(thread(&t, 100).events[11].ns, BASE_NS + 2_020_000);
}

#[test]
fn missing_dat() {
    let dir = tempdir();
    demo_trace(dir.path());
    std::fs::remove_file(dat_path(dir.path(), 102, 0)).unwrap();
    let t = open(dir.path()).unwrap();
    assert!(only_problem(&t).ends_with("task-102-0.dat: missing; no events for this process"));
    assert_eq!(t.processes.len(), 2);
}

#[test]
fn calibration_uses_128_bit_math() {
    let c = Calibration {
        ticks_per_sec: 3_000_000_000,
        base_ticks: 1 << 63,
        base_ns: 10,
    };
    assert_eq!(c.to_ns(1 << 63), 10);
    assert_eq!(c.to_ns((1 << 63) + 3_000_000_000), 1_000_000_010);
    assert_eq!(c.to_ns(u64::MAX), 10 + ((1u128 << 63) - 1) as u64 / 3);
    // Before the base: still exact, clamped at 0.
    assert_eq!(c.to_ns((1 << 63) - 30), 0);
    let c = Calibration {
        ticks_per_sec: 1,
        base_ticks: 0,
        base_ns: 0,
    };
    assert_eq!(c.to_ns(u64::MAX), u64::MAX);
}

/// A small deterministic PRNG (xorshift64*), so the damage is reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Reads and renders a damaged trace in every way; a panic fails the test.
fn read_everything(dir: &Path) {
    let Ok(t) = open(dir) else { return };
    for p in &t.problems {
        // Every problem names its file.
        assert!(p.to_string().starts_with(&dir.display().to_string()), "{p}");
    }
    let mut sink = Vec::new();
    replay::replay(&t, &ReplayOptions::default(), &mut sink).unwrap();
    report::report(&t, &ReportOptions::default(), &mut sink).unwrap();
    dump::chrome(&t, &Select::default(), &mut sink).unwrap();
    let _ = dump::folded(&t, &FoldOptions::default());
}

#[test]
fn random_damage_never_panics() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let dir = tempdir();
    let l = demo_trace(dir.path());
    let pristine: Vec<(std::path::PathBuf, Vec<u8>)> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            let b = std::fs::read(&p).unwrap();
            (p, b)
        })
        .collect();
    // FTRAMP_DAMAGE_ROUNDS=N runs more rounds (a longer fuzz-like run).
    let rounds: usize = std::env::var("FTRAMP_DAMAGE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400);
    for round in 0..rounds {
        for (p, b) in &pristine {
            std::fs::write(p, b).unwrap();
        }
        let (path, bytes) = &pristine[rng.below(pristine.len())];
        let mut b = bytes.clone();
        match round % 4 {
            0 => b.truncate(rng.below(b.len() + 1)),
            1 => {
                for _ in 0..1 + rng.below(8) {
                    let i = rng.below(b.len());
                    if let Some(x) = b.get_mut(i) {
                        *x ^= 1 << rng.below(8);
                    }
                }
            }
            2 => {
                // Random bytes over a random span.
                let i = rng.below(b.len());
                let n = rng.below(64);
                for k in i..(i + n).min(b.len()) {
                    b[k] = rng.next() as u8;
                }
            }
            _ => {
                // Header fields of a random chunk of the big .dat set to extremes.
                let (p, bb) = pristine
                    .iter()
                    .find(|(p, _)| p.ends_with("task-100-0.dat"))
                    .unwrap();
                let mut bb = bb.clone();
                let c = l.chunks[rng.below(4)];
                let field = [4, 6, 8, 12, 16, 20, 24][rng.below(7)];
                let v = [0u32, 8, 0xffff_fff8, 1 << 24, u32::MAX][rng.below(5)];
                bb[c + field..c + field + 4].copy_from_slice(&v.to_le_bytes());
                std::fs::write(p, &bb).unwrap();
                read_everything(dir.path());
                continue;
            }
        }
        std::fs::write(path, &b).unwrap();
        read_everything(dir.path());
    }
    assert_eq!(
        l.len,
        pristine
            .iter()
            .find(|(p, _)| p.ends_with("task-100-0.dat"))
            .unwrap()
            .1
            .len()
    );
}

/// Damage to one chunk of the shared `.dat` (bit flips, bytes overwritten, its length set
/// to other values: anything but its tid, which moves it to another thread) leaves the
/// other thread's events and losses as they were, and renders without a panic.  (A
/// length grown over the next chunk took that chunk from the other thread until the
/// reader looked for headers inside a claimed payload.)
#[test]
fn damage_to_one_chunk_leaves_the_other_thread_intact() {
    use ftramp_trace::read::Item;
    let items = |t: &Trace, tid: u32| {
        let mut v: Vec<Item> = Vec::new();
        thread(t, tid).for_each(|i| v.push(i));
        v
    };
    let dir = tempdir();
    let l = demo_trace(dir.path());
    let pristine = std::fs::read(dat_path(dir.path(), 100, 0)).unwrap();
    let t = open(dir.path()).unwrap();
    let want = [items(&t, 100), items(&t, 101)];
    let ends = [l.chunks[1], l.chunks[2], l.chunks[3], l.len];
    let mut rng = Rng(0x5eed_f00d);
    let rounds: usize = std::env::var("FTRAMP_DAMAGE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    for round in 0..rounds {
        let k = rng.below(4);
        let (start, end) = (l.chunks[k], ends[k]);
        let mut b = pristine.clone();
        let what = match rng.below(3) {
            0 => {
                for _ in 0..1 + rng.below(4) {
                    let i = start + rng.below(end - start);
                    b[i] ^= 1 << rng.below(8);
                }
                "bit flips"
            }
            1 => {
                let i = start + rng.below(end - start);
                let v = [0u8, 0xff, 0x80, 0x7f][rng.below(4)];
                for x in &mut b[i..(i + 1 + rng.below(16)).min(end)] {
                    *x = v;
                }
                "bytes overwritten"
            }
            _ => {
                // The length, to the end of a later chunk or a few events more or less.
                let len = (end - start - CHUNK_HEADER_SIZE) as i64;
                let v = [
                    (l.len - start - CHUNK_HEADER_SIZE) as i64,
                    (ends[(k + 1).min(3)] - start - CHUNK_HEADER_SIZE) as i64,
                    len + 8 * (1 + rng.below(6) as i64),
                    len - 8 * (1 + rng.below(3) as i64),
                ][rng.below(4)];
                b[start + 16..start + 20].copy_from_slice(&(v.max(0) as u32).to_le_bytes());
                "length changed"
            }
        };
        // Not the tid, which moves the chunk to another thread (100 and 101 are a bit
        // apart).
        b[start + 8..start + 12].copy_from_slice(&pristine[start + 8..start + 12]);
        std::fs::write(dat_path(dir.path(), 100, 0), &b).unwrap();
        read_everything(dir.path());
        let t = open(dir.path()).unwrap();
        // Chunks 0 and 2 are thread 100's, 1 and 3 thread 101's.
        let (other, i) = [(101, 1), (100, 0)][k % 2];
        assert_eq!(items(&t, other), want[i], "round {round}: {what} in chunk {k}: {:#?}", messages(&t));
    }
}

#[test]
fn garbage_files_never_panic() {
    let mut rng = Rng(42);
    let dir = tempdir();
    let rounds: usize = std::env::var("FTRAMP_DAMAGE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400)
        / 4;
    for round in 0..rounds {
        let len = rng.below(4096);
        let mut b: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        // Sprinkle valid-looking magics so the resync path runs.
        for _ in 0..rng.below(8) {
            let i = rng.below(b.len().saturating_sub(4));
            if i + 8 <= b.len() {
                b[i..i + 4].copy_from_slice(b"FTRC");
                b[i + 4..i + 8].copy_from_slice(&[1, 0, 0, 0]);
            }
        }
        std::fs::write(dat_path(dir.path(), 1, 0), &b).unwrap();
        std::fs::write(dir.path().join(format::task_file_name(1, 0, "sym")), &b).unwrap();
        std::fs::write(dir.path().join(format::task_file_name(1, 0, "info")), &b).unwrap();
        if round % 2 == 0 {
            std::fs::write(dir.path().join("info"), &b).unwrap();
        }
        read_everything(dir.path());
    }
}

#[test]
fn a_huge_symbol_id_does_not_blow_up() {
    let dir = tempdir();
    demo_trace(dir.path());
    let sym = dir.path().join(format::task_file_name(100, 0, "sym"));
    let text = std::fs::read_to_string(&sym).unwrap();
    std::fs::write(&sym, format!("{text}4000000000 1 0 far /bin/demo\n")).unwrap();
    let t = open(dir.path()).unwrap();
    assert!(t.problems.is_empty(), "{:?}", t.problems);
    assert_eq!(t.processes[0].func_name(4_000_000_000), "far");
    let lines = dump::folded(&t, &FoldOptions::default());
    assert_eq!(lines.len(), 10);
}
