//! `ftramp replay|report|dump` on synthetic traces: output, files written and error messages.

#[path = "../../trace/tests/common/mod.rs"]
mod common;

use common::*;
use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Output};

fn ftramp(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ftramp"))
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn ok(args: &[&str]) -> String {
    let o = ftramp(args);
    assert!(
        o.status.success(),
        "ftramp {args:?} failed: {}",
        text(&o.stderr)
    );
    assert_eq!(text(&o.stderr), "", "unexpected warnings");
    text(&o.stdout)
}

fn d(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn replay_prints_the_call_graph() {
    let dir = tempdir();
    demo_trace(dir.path());
    let out = ok(&["replay", "-d", d(dir.path())]);
    let (first, rest) = out.split_once('\n').unwrap();
    assert_eq!(
        first,
        format!(
            "# ftramp replay: {} (function_graph): demo x",
            dir.path().display()
        )
    );
    assert_eq!(rest, DEMO_REPLAY);

    let out = ok(&[
        "replay",
        "-d",
        d(dir.path()),
        "-F",
        "a*",
        "-N",
        "c",
        "--pid",
        "100",
    ]);
    let calls: Vec<&str> = out.lines().filter(|l| l.contains(" | ")).collect();
    assert_eq!(
        calls,
        [
            "            [   100] | a() {",
            "   0.500 us [   100] |   b();",
            "   1.000 us [   100] | } /* a */"
        ]
    );
    let out = ok(&[
        "replay",
        "-d",
        d(dir.path()),
        "--tid",
        "100",
        "--depth",
        "2",
        "--min-duration",
        "0.6us",
    ]);
    let calls: Vec<&str> = out.lines().filter(|l| l.contains(" | ")).collect();
    assert_eq!(
        calls,
        [
            "            [   100] | main() {",
            "   1.000 us [   100] |   a();",
            "            [   100] |   /* lost 3 events */",
            "   2.000 ms [   100] |   c();",
            "   2.020 ms [   100] | } /* main */",
        ]
    );
}

/// `replay DIR`, `report DIR` and `dump DIR` read the trace that `-d DIR` names
/// (the habit of `uftrace replay DIR`-style tools); both at once are refused.
#[test]
fn the_trace_directory_can_be_named_without_d() {
    let dir = tempdir();
    demo_trace(dir.path());
    for cmd in [&["replay"][..], &["report"], &["dump", "--flame"]] {
        let with_d = ok(&[cmd, &["-d", d(dir.path())]].concat());
        let positional = ok(&[cmd, &[d(dir.path())]].concat());
        assert_eq!(positional, with_d, "{cmd:?}");
        assert!(with_d.lines().count() > 3, "{cmd:?}: {with_d}");
    }
    let other = tempdir();
    let o = ftramp(&["report", "-d", d(other.path()), d(dir.path())]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("cannot be used with"), "{}", text(&o.stderr));
    // An output file named where the trace goes: told to use -o.
    let o = ftramp(&["dump", "--chrome", "out.json", "-d", d(dir.path())]);
    assert_eq!(o.status.code(), Some(2), "both a directory and -d: {}", text(&o.stderr));
    let o = ftramp(&["dump", "--chrome", "out.json"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).contains("out.json is no trace directory (the positional argument names the trace); to write the output to it, use -o out.json"), "{}", text(&o.stderr));
    let missing = dir.path().join("none");
    let o = ftramp(&["replay", d(&missing)]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains(&format!("cannot read trace {}", missing.display())),
        "{}",
        text(&o.stderr)
    );
}

#[test]
fn report_sorts_and_limits() {
    let dir = tempdir();
    demo_trace(dir.path());
    let out = ok(&["report", "-d", d(dir.path()), "-s", "calls", "-n", "2"]);
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].ends_with(
            "(function_graph): 2 process images, 3 threads, 5 functions; sorted by calls"
        ),
        "{}",
        lines[0]
    );
    // (The demo trace lost events: a header line says so.)
    assert!(lines[1].contains("events lost in these process images"), "{}", lines[1]);
    assert_eq!(
        &lines[5..],
        [
            "    1.300 us    1.300 us           3    0.433 us    0.500 us  b",
            "    2.000 ms    2.000 ms           3  666.750 us    2.000 ms  c",
        ]
    );
    let out = ok(&["report", "-d", d(dir.path()), "--pid", "102"]);
    assert!(
        out.ends_with("    0.100 us    0.100 us           1    0.100 us    0.100 us  a\n"),
        "{out}"
    );
}

#[test]
fn dump_chrome_flame_and_svg() {
    let dir = tempdir();
    demo_trace(dir.path());
    let json = dir.path().join("out.json");
    assert_eq!(
        ok(&["dump", "-d", d(dir.path()), "--chrome", "-o", d(&json)]),
        ""
    );
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).unwrap()).expect("valid JSON");
    let events = v["traceEvents"].as_array().unwrap();
    let b = events.iter().filter(|e| e["ph"] == "B").count();
    let e = events.iter().filter(|e| e["ph"] == "E").count();
    assert_eq!((b, e), (10, 10));
    // To stdout as well.
    let out = ok(&["dump", "-d", d(dir.path()), "--chrome", "--tid", "102"]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("valid JSON");
    assert_eq!(
        v["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] == "B")
            .count(),
        1
    );

    let out = ok(&[
        "dump",
        "-d",
        d(dir.path()),
        "--flame",
        "--merged",
        "--tid",
        "101",
    ]);
    assert_eq!(out, "worker 3200\nworker;b 300\nworker;c 50\n");

    let svg = dir.path().join("flame.svg");
    assert_eq!(
        ok(&["dump", "-d", d(dir.path()), "--flame-svg", d(&svg)]),
        ""
    );
    let s = std::fs::read_to_string(&svg).unwrap();
    assert!(
        s.starts_with("<?xml") && s.trim_end().ends_with("</svg>"),
        "{}",
        &s[..s.len().min(200)]
    );
    // Every folded line is counted (demo [102]'s 100 ns is too narrow to be drawn).
    assert!(s.contains("<title>all (2,023,650 ns, 100%)</title>"));
    for f in ["main", "worker", "tid 101", "demo [100]"] {
        let titles: Vec<&str> = s
            .match_indices("<title>")
            .map(|(i, _)| &s[i..s[i..].find("</title>").map_or(s.len(), |j| i + j)])
            .collect();
        assert!(
            titles
                .iter()
                .any(|t| t.starts_with(&format!("<title>{f} ("))),
            "{f} missing from the SVG: {titles:?}"
        );
    }
}

#[test]
fn errors_name_the_input() {
    let dir = tempdir();
    let missing = dir.path().join("none");
    let o = ftramp(&["replay", "-d", d(&missing)]);
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    assert!(
        err.contains(&format!("cannot read trace {}", missing.display())),
        "{err}"
    );
    assert!(err.contains("No such file or directory"), "{err}");

    let o = ftramp(&["report", "-d", d(dir.path())]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("not an ftramp trace directory"),
        "{}",
        text(&o.stderr)
    );

    demo_trace(dir.path());
    let o = ftramp(&["report", "-d", d(dir.path()), "-s", "speed"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o.stderr)
            .contains("unknown sort key \"speed\" (known: total, self, calls, avg, max, name)"),
        "{}",
        text(&o.stderr)
    );
    let o = ftramp(&["replay", "-d", d(dir.path()), "--min-duration", "5h"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o.stderr).contains("unknown time unit `h`"),
        "{}",
        text(&o.stderr)
    );
    // An unclosed `[` is a plain one (as in ftrace): `-F '[a'` is a name, which the demo
    // does not have (refused as a bad glob until the twenty-eighth session).
    let o = ftramp(&["replay", "-d", d(dir.path()), "-F", "[a"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(!text(&o.stdout).contains("worker"), "{}", text(&o.stdout));
    let o = ftramp(&["replay", "-d", d(dir.path()), "--tid", "999"]);
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    assert!(err.contains("no thread matches --tid 999 (the trace has: pid 100 (tids 100 101), pid 102 (tids 102))"), "{err}");
    let o = ftramp(&["dump", "-d", d(dir.path())]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o.stderr).contains("--chrome|--flame|--flame-svg"),
        "{}",
        text(&o.stderr)
    );
}

/// `--pid` of a process whose images recorded no thread (a `daemon(3)`
/// parent that ended before its first event was written) shows its
/// headers instead of failing with a list that names that very pid; the
/// list of an unknown pid's error has one entry per pid, over its images.
#[test]
fn a_pid_without_events_is_shown_not_refused() {
    let dir = tempdir();
    let d0 = dir.path();
    write_info(d0, "function_graph", &["demo"]);
    write_process_info(d0, 7, 0, 1, "/bin/demo", None, "exit = \"exec\"\n");
    write_process_info(d0, 7, 1, 1, "/bin/demo", None, "");
    write_process_info(d0, 8, 0, 7, "/bin/demo", Some("7 1"), "exit = \"code 0\"\n");
    for (pid, image) in [(7, 0), (7, 1), (8, 0)] {
        write_syms(d0, pid, image, &["main"]);
    }
    std::fs::write(dat_path(d0, 7, 0), b"").unwrap();
    std::fs::write(dat_path(d0, 7, 1), b"").unwrap();
    std::fs::write(dat_path(d0, 8, 0), chunk(8, 0, ftramp_trace::format::FLAG_LAST, 0, 0, &[entry(0, 0), exit(0, 10)])).unwrap();
    let o = ftramp(&["replay", "-d", d(d0), "--pid", "7"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(out.contains("# process 7 image 0:") && out.contains("# process 7 image 1:") && !out.contains("process 8"), "{out}");
    let o = ftramp(&["report", "-d", d(d0), "--pid", "7"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let o = ftramp(&["replay", "-d", d(d0), "--pid", "9"]);
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    assert!(err.contains("no thread matches --pid 9 (the trace has: pid 7 (no events), pid 8 (tids 8))"), "{err}");
}

/// A bad input is reported in one line, without the stack backtrace that
/// `RUST_BACKTRACE=1` would add to an error returned from `main`.
#[test]
fn errors_are_one_line_even_with_rust_backtrace_set() {
    let dir = tempdir();
    let missing = dir.path().join("none");
    let o = Command::new(env!("CARGO_BIN_EXE_ftramp"))
        .args(["report", "-d", d(&missing)])
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("Error: cannot read trace "), "{err}");
}

#[test]
fn damaged_trace_warns_and_replays_the_rest() {
    let dir = tempdir();
    let l = demo_trace(dir.path());
    let dat = dat_path(dir.path(), 100, 0);
    let mut b = std::fs::read(&dat).unwrap();
    b[l.chunks[1]..l.chunks[1] + 4].copy_from_slice(b"junk");
    std::fs::write(&dat, b).unwrap();
    let o = ftramp(&["replay", "-d", d(dir.path())]);
    assert!(o.status.success());
    let err = text(&o.stderr);
    assert_eq!(
        err,
        format!(
            "ftramp: warning: {}: offset {}: bad chunk magic [6a, 75, 6e, 6b] (expected \"FTRC\"); skipped {} bytes to the next chunk at offset {} (1 chunk before it intact)\n",
            dat.display(),
            l.chunks[1],
            l.chunks[2] - l.chunks[1],
            l.chunks[2]
        )
    );
    let out = text(&o.stdout);
    // Thread 100 complete; thread 101 lost its first chunk (worker's entry), so it starts
    // with the chunk gap and c; the return of worker was never recorded either.
    assert!(
        out.contains("   2.020 ms [   100] | } /* main */\n"),
        "{out}"
    );
    assert!(out.contains("# thread 101: 2 chunks missing\n"), "{out}");
    assert!(
        out.contains("            [   101] | /* lost 2 chunks */\n   0.050 us [   101] | c();\n"),
        "{out}"
    );
}

/// End to end: the bundled demo built, recorded by `ftramp record`, and read back by
/// replay, report and dump — each must account for exactly the calls the demo counted
/// itself (`calls <function> <n>` lines), and the flame graph's time must add up to the
/// time of the outermost calls.
#[test]
fn recorded_demo_reads_back_consistently() {
    let dir = tempdir();
    let build = dir.path().join("build");
    let trace = dir.path().join("trace");
    ok_any(&["demo", "--build-dir", d(&build), "--build-only"]);
    let rec = ftramp(&["record", "-o", d(&trace), "--", d(&build.join("demo"))]);
    assert!(
        rec.status.success(),
        "ftramp record failed: {}",
        text(&rec.stderr)
    );
    let want: HashMap<String, u64> = text(&rec.stdout)
        .lines()
        .filter_map(|l| {
            let mut w = l.strip_prefix("calls ")?.split_whitespace();
            Some((w.next()?.to_string(), w.next()?.parse().ok()?))
        })
        .filter(|(_, n)| *n > 0)
        .collect();
    assert!(want.len() >= 5 && want["main"] == 1, "{want:?}");

    // report: the Calls column.
    let out = ok(&["report", "-d", d(&trace), "-s", "name"]);
    let got: HashMap<String, u64> = out
        .lines()
        .skip(4)
        .map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            (
                cols[cols.len() - 1].to_string(),
                cols[cols.len() - 6].parse().unwrap(),
            )
        })
        .collect();
    assert_eq!(got, want);

    // replay: one line per call, `f() {` or `f();`.
    let out = ok(&["replay", "-d", d(&trace)]);
    let mut lines: HashMap<String, u64> = HashMap::new();
    for l in out
        .lines()
        .filter_map(|l| l.split_once(" | ").map(|(_, f)| f.trim_start()))
    {
        if let Some(f) = l.strip_suffix("() {").or_else(|| l.strip_suffix("();")) {
            *lines.entry(f.to_string()).or_default() += 1;
        }
    }
    assert_eq!(lines, want, "{out}");
    assert!(
        !out.contains("unfinished") && !out.contains("lost"),
        "{out}"
    );

    // Chrome JSON: a B per call, balanced by E; the outermost calls' time per thread.
    let out = ok(&["dump", "-d", d(&trace), "--chrome"]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("valid JSON");
    let mut begins: HashMap<String, u64> = HashMap::new();
    let mut depth: HashMap<u64, (u32, f64)> = HashMap::new();
    let mut outer_us = 0.0;
    for e in v["traceEvents"].as_array().unwrap() {
        let tid = e["tid"].as_u64().unwrap();
        let (dep, since) = depth.entry(tid).or_default();
        match e["ph"].as_str().unwrap() {
            "B" => {
                *begins
                    .entry(e["name"].as_str().unwrap().to_string())
                    .or_default() += 1;
                if *dep == 0 {
                    *since = e["ts"].as_f64().unwrap();
                }
                *dep += 1;
            }
            "E" => {
                *dep -= 1;
                if *dep == 0 {
                    outer_us += e["ts"].as_f64().unwrap() - *since;
                }
            }
            _ => {}
        }
    }
    assert_eq!(begins, want);
    assert!(depth.values().all(|(d, _)| *d == 0));

    // Folded stacks: self times add up to the outermost calls' time (ns vs µs with
    // 3 decimals in the JSON: equal to the nanosecond).
    let out = ok(&["dump", "-d", d(&trace), "--flame"]);
    let total_ns: u64 = out
        .lines()
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(total_ns, (outer_us * 1000.0).round() as u64);
}

fn ok_any(args: &[&str]) -> String {
    let o = ftramp(args);
    assert!(
        o.status.success(),
        "ftramp {args:?} failed: {}",
        text(&o.stderr)
    );
    text(&o.stdout)
}
