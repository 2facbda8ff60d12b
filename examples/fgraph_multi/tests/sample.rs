//! The program as a user runs it: both users' reports, exact, with the
//! call graph's shape (durations vary) and the counts checked.

#![cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]

use std::process::Command;

fn run(args: &[&str]) -> (bool, String) {
    // Cross-built: through qemu-user (see build.rs).
    let runner: Vec<&str> = env!("FTRAMP_SAMPLE_RUNNER").split_whitespace().collect();
    let mut cmd = match runner.split_first() {
        Some((prog, rest)) => {
            let mut c = Command::new(prog);
            c.args(rest).arg(env!("CARGO_BIN_EXE_fgraph_multi"));
            c
        }
        None => Command::new(env!("CARGO_BIN_EXE_fgraph_multi")),
    };
    let out = cmd.args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr))
}

/// The call graph's lines without the duration column; checks every
/// duration is a number where ftrace prints one (leaves and closing
/// braces) and blank on opening lines.
fn graph(out: &str) -> Vec<String> {
    out.lines()
        .skip_while(|l| !l.starts_with("# user \"graph\""))
        .skip(3)
        .take_while(|l| !l.is_empty())
        .map(|l| {
            let (dur, call) = l.split_once(" |").unwrap_or_else(|| panic!("no column in {l:?}"));
            if call.ends_with('{') {
                assert!(dur.trim().is_empty(), "{l:?}");
            } else {
                let us = dur.trim().strip_suffix(" us").unwrap_or_else(|| panic!("no duration in {l:?}"));
                assert!(us.parse::<f64>().is_ok_and(|v| v > 0.0), "{l:?}");
            }
            call.to_string()
        })
        .collect()
}

fn counts(out: &str) -> Vec<String> {
    out.lines().skip_while(|l| !l.starts_with("# user \"count\"")).skip(2).take_while(|l| !l.is_empty()).map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ")).collect()
}

#[test]
fn both_users_report_the_same_run() {
    let (ok, out) = run(&["--n", "4"]);
    assert!(ok, "{out}");
    assert!(out.starts_with("demo_run(4) = 33\n"), "{out}");
    let want = "  demo_run() {
    demo_sum_squares() {
      demo_square();
      demo_square();
      demo_square();
      demo_square();
    } /* demo_sum_squares */
    demo_fib() {
      demo_fib() {
        demo_fib() {
          demo_fib();
          demo_fib();
        } /* demo_fib */
        demo_fib();
      } /* demo_fib */
      demo_fib() {
        demo_fib();
        demo_fib();
      } /* demo_fib */
    } /* demo_fib */
  } /* demo_run */";
    assert_eq!(graph(&out).join("\n"), want, "{out}");
    // fib(4): 9 calls, arguments 4+3+2+1+0+1+2+1+0, results 3+2+1+1+0+1+1+1+0.
    assert_eq!(counts(&out), ["demo_fib 9 14 10", "demo_run 1 4 33", "demo_square 4 10 30", "demo_sum_squares 1 4 30"], "{out}");
    assert!(out.contains("# shadow stack: depth 0 after the run, 0 misses, 0 bad data blocks, 15 entries / 15 returns"), "{out}");
}

#[test]
fn the_users_filter_differently() {
    let (ok, out) = run(&["--n", "6", "--count-filter", "demo_s*", "--graph-filter", "demo_run"]);
    assert!(ok, "{out}");
    assert!(out.starts_with("demo_run(6) = 99\n"), "{out}");
    assert_eq!(graph(&out), ["  demo_run();"], "{out}");
    assert_eq!(counts(&out), ["demo_square 6 21 91", "demo_sum_squares 1 6 91"], "{out}");
    assert!(out.contains("0 bad data blocks, 1 entries / 1 returns"), "{out}");
}

/// A filter that selects no function is refused, naming it.  (An unclosed `[` is a
/// plain character since the twenty-eighth session, as in ftrace: no glob is bad.)
#[test]
fn a_filter_matching_nothing_is_refused() {
    let (ok, out) = run(&["--graph-filter", "demo_[x"]);
    assert!(!ok, "{out}");
    assert!(out.contains("no patchable site matches the filter `demo_[x`"), "{out}");
}

#[test]
fn every_benchmark_mode_runs() {
    for mode in ["untraced", "entry-only", "entry-exit", "entry-exit-skip", "two-users", "fprobe-entry", "fprobe-entry-exit", "tree-entry-exit-skip"] {
        let (ok, out) = run(&["--quiet", "--mode", mode, "--calls", "2000"]);
        assert!(ok, "{mode}: {out}");
        assert!(out.trim().parse::<f64>().is_ok_and(|ns| ns > 0.0), "{mode}: {out}");
    }
    let (ok, out) = run(&["--mode", "nope"]);
    assert!(!ok && out.contains("unknown mode"), "{out}");
}
