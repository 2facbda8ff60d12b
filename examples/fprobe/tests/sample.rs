//! The sample as a user runs it: arguments and return values of the probed
//! function, the hit count, and a clear failure for a missing symbol.

#![cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]

use std::process::Command;

fn run(args: &[&str]) -> (bool, String) {
    // Cross-built: through qemu-user (see build.rs).
    let runner: Vec<&str> = env!("FTRAMP_SAMPLE_RUNNER").split_whitespace().collect();
    let mut cmd = match runner.split_first() {
        Some((prog, rest)) => {
            let mut c = Command::new(prog);
            c.args(rest).arg(env!("CARGO_BIN_EXE_fprobe"));
            c
        }
        None => Command::new(env!("CARGO_BIN_EXE_fprobe")),
    };
    let out = cmd.args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr))
}

fn lines_with<'a>(out: &'a str, start: &str, has: &str) -> Vec<&'a str> {
    out.lines().filter(|l| l.starts_with(start) && l.contains(has)).collect()
}

#[test]
fn prints_arguments_and_return_values() {
    let (ok, out) = run(&[]);
    assert!(ok, "{out}");
    assert!(out.lines().any(|l| l.starts_with("Planted fprobe at tracee_add: tracee_add+")), "{out}");
    // tracee_work(1) calls tracee_add(1, 6); tracee_work(2) adds (2, 12).
    for (args, ret) in [("(1, 6)", "arg0 was 1, retval = 7"), ("(2, 12)", "arg0 was 2, retval = 14")] {
        assert_eq!(lines_with(&out, "Enter <tracee_add+", args).len(), 1 + (args == "(1, 6)") as usize, "{out}");
        assert!(!lines_with(&out, "Return from <tracee_add+", ret).is_empty(), "{out}");
    }
    assert!(out.contains("tracee_work(1) = 8\n") && out.contains("tracee_work(2) = 22\n"), "{out}");
    assert!(out.lines().any(|l| l == "fprobe at tracee_add unregistered. 3 times hit, 0 times missed"), "{out}");
}

#[test]
fn globs_notfilter_and_entry_only() {
    let (ok, out) = run(&["--symbol", "tracee_*", "--nosym", "tracee_work,tracee_add", "--nargs", "3", "--calls", "1", "--entry-only"]);
    assert!(ok, "{out}");
    assert!(lines_with(&out, "Enter <tracee_mul3+", "args (1, 2, 3)").len() == 1, "{out}");
    // fib(1): one call.
    assert!(lines_with(&out, "Enter <tracee_fib+", "args (1, ").len() == 1, "{out}");
    assert!(!out.contains("Return from"), "{out}");
    assert!(!out.contains("<tracee_add") && !out.contains("Enter <tracee_work"), "{out}");
}

#[test]
fn a_missing_symbol_is_refused() {
    let (ok, out) = run(&["--symbol", "no_such_function"]);
    assert!(!ok, "{out}");
    assert!(out.contains("register_fprobe failed: the fprobe matches no patchable function"), "{out}");
}
