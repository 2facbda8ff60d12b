//! The README's main job, `ftramp demo`: the bundled C demo built with the
//! site flags, recorded by `ftramp record` and replayed. The demo counts its
//! own calls per function and prints them (`calls <function> <n>`); the
//! recorded trace must hold exactly those calls, entries and exits, on the
//! main thread and the three workers, with nothing lost.

use ftramp_trace::read::{EventKind, Trace};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ftramp-demo-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn demo(dir: &Path, extra: &[&str], cc: Option<&str>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ftramp"));
    cmd.arg("demo")
        .args(extra)
        .arg("-o")
        .arg(dir.join("trace"))
        .arg("--build-dir")
        .arg(dir.join("build"));
    if let Some(cc) = cc {
        cmd.env("CC", cc);
    }
    let out = cmd.output().expect("running ftramp demo");
    assert!(
        out.status.success(),
        "ftramp demo failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The demo's own counts: `calls <function> <n>` lines.
fn counted(stdout: &[u8]) -> BTreeMap<String, u64> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter_map(|l| {
            let mut w = l.strip_prefix("calls ")?.split_whitespace();
            Some((w.next()?.to_string(), w.next()?.parse().ok()?))
        })
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// Entries and exits per function name over every process and thread.
fn recorded(trace: &Trace, kind: EventKind) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for p in &trace.processes {
        for t in &p.threads {
            for e in t.events.iter().filter(|e| e.kind == kind) {
                *m.entry(p.func_name(e.func)).or_insert(0) += 1;
            }
        }
    }
    m
}

fn check_counts(dir: &Path, cc: Option<&str>) {
    let out = demo(dir, &["--no-replay"], cc);
    let want = counted(&out.stdout);
    // The demo's functions, its library's, and nothing else traced: the
    // reporting functions are built without sites.
    let names: Vec<&str> = want.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "classify",
            "fib",
            "main",
            "process_line",
            "spin",
            "summarize",
            "tokenize",
            "util_checksum",
            "util_mix",
            "util_scale",
            "worker"
        ],
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let trace = Trace::open(&dir.join("trace")).expect("the trace opens");
    assert!(trace.problems.is_empty(), "{:?}", trace.problems);
    assert_eq!(trace.processes.len(), 1, "one process");
    let p = &trace.processes[0];
    assert_eq!(p.lost, 0, "no event lost");
    let busy = p.threads.iter().filter(|t| !t.events.is_empty()).count();
    assert_eq!(busy, 4, "main and three workers recorded calls");
    assert_eq!(recorded(&trace, EventKind::Entry), want, "entries");
    assert_eq!(recorded(&trace, EventKind::Exit), want, "exits");
}

#[test]
fn the_trace_has_the_demos_own_call_counts() {
    let dir = scratch("counts");
    check_counts(&dir, None);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_demo_built_by_clang_is_traced_too() {
    // clang's x86_64 site is one 5-byte NOP, not gcc's five.
    if Command::new("clang-14").arg("--version").output().is_err() {
        assert!(std::env::var_os("CI").is_none_or(|v| v != "true"), "CI needs clang-14");
        eprintln!("skipped: clang-14 is not installed");
        return;
    }
    let dir = scratch("clang");
    check_counts(&dir, Some("clang-14"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_demo_replays_its_call_graph() {
    let dir = scratch("replay");
    let out = demo(&dir, &[], None);
    let text = String::from_utf8_lossy(&out.stdout);
    // The replay follows the demo's own output; every recorded function
    // shows up in it, the recursion nested.
    for f in [
        "main",
        "worker",
        "fib",
        "process_line",
        "tokenize",
        "classify",
        "spin",
        "util_checksum",
        "util_mix",
        "util_scale",
        "summarize",
    ] {
        assert!(
            text.contains(&format!("{f}(")),
            "{f} missing from the replay:\n{text}"
        );
    }
    // Indentation of the function column (after `| `) of fib's lines.
    let fib_depth = text
        .lines()
        .filter_map(|l| l.split_once("| ").map(|(_, f)| f))
        .filter(|f| f.contains("fib()"))
        .map(|f| f.len() - f.trim_start().len())
        .collect::<Vec<_>>();
    assert!(
        fib_depth.iter().max() > fib_depth.iter().min(),
        "fib calls are nested:\n{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn build_only_needs_a_build_dir() {
    let out = Command::new(env!("CARGO_BIN_EXE_ftramp"))
        .args(["demo", "--build-only"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--build-dir"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
