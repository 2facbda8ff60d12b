//! The sample as a user runs it: exact counts with --check-count, and the
//! "Counter called" report with a non-zero exit when a count is wrong.

#![cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]

use std::process::Command;

fn run(args: &[&str]) -> (bool, String) {
    // Cross-built: through qemu-user (see build.rs).
    let runner: Vec<&str> = env!("FTRAMP_SAMPLE_RUNNER").split_whitespace().collect();
    let mut cmd = match runner.split_first() {
        Some((prog, rest)) => {
            let mut c = Command::new(prog);
            c.args(rest).arg(env!("CARGO_BIN_EXE_ftrace_ops"));
            c
        }
        None => Command::new(env!("CARGO_BIN_EXE_ftrace_ops")),
    };
    let out = cmd.args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr))
}

#[test]
fn counts_are_exact_in_every_configuration() {
    for extra in [&[][..], &["--save-regs"], &["--assist-recursion"], &["--nr-ops-irrelevant", "5"], &["--nr-ops-relevant", "3"]] {
        let mut args = vec!["--nr-function-calls", "20000", "--check-count"];
        args.extend_from_slice(extra);
        let (ok, out) = run(&args);
        assert!(ok, "{args:?}: {out}");
        assert!(out.contains("Attempted 20000 calls to tracee_relevant in "), "{out}");
        assert!(!out.contains("Counter called"), "{out}");
    }
}

#[test]
fn a_wrong_count_is_reported_and_fails() {
    let (ok, out) = run(&["--nr-function-calls", "1000", "--check-count", "--expect-calls", "999"]);
    assert!(!ok, "{out}");
    assert!(out.lines().any(|l| l.starts_with("Counter called 1000 times (expected 999)")), "{out}");
}

#[test]
fn the_report_names_the_configuration() {
    let (ok, out) = run(&["--nr-function-calls", "10", "--nr-ops-relevant", "2", "--nr-ops-irrelevant", "1", "--save-regs"]);
    assert!(ok, "{out}");
    for line in ["registering:", "  relevant ops: 2", "  irrelevant ops: 1", "  saving registers: true", "  assist recursion: false"] {
        assert!(out.lines().any(|l| l == line), "missing {line:?} in\n{out}");
    }
}
