//! The C API from C: `tests/c/capi_test.c` (compiled by build.rs against
//! `include/ftramp.h`, with the tracees of `tests/c/tracee.c` built with the
//! arch's patch-site flags) is linked once against `libftramp.a` and once
//! against `libftramp.so`, and run — natively, or under the target's runner
//! (qemu-user) when cross-built.  The program checks exact call counts,
//! arguments, filters (symbol, glob, address, notrace), the dispatch chosen
//! per site, SAVE_REGS, IPMODIFY and its second-ops refusal, RECURSION,
//! errors and their messages, dlopen/dlclose with `ftramp_refresh`, and
//! threads calling while ops come and go; it ends with "N passed, M failed".
//!
//! Live patching exists for x86_64 and aarch64 (issue #4's scope).
#![cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What a Rust staticlib needs from the system (`--print native-static-libs`
/// on linux-gnu).
const NATIVE_LIBS: &[&str] = &["-lgcc_s", "-lutil", "-lrt", "-lpthread", "-lm", "-ldl", "-lc"];

/// The libraries of this crate.  Cargo builds the library target — all
/// three crate types in one rustc run — before the integration tests, into
/// the `deps` directory that holds this test binary.  They are copied to a
/// directory of their own, so `LD_LIBRARY_PATH` names nothing else.
fn libs(dir: &Path) -> (PathBuf, PathBuf) {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("deps dir");
    std::fs::create_dir_all(dir).unwrap();
    let copy = |name: &str| {
        let from = deps.join(name);
        assert!(from.exists(), "{} is missing: cargo should have built it before the tests", from.display());
        let to = dir.join(name);
        std::fs::copy(&from, &to).unwrap_or_else(|e| panic!("copying {}: {e}", from.display()));
        to
    };
    (copy("libftramp.a"), copy("libftramp.so"))
}

fn work_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("capi-{}-{name}", std::env::consts::ARCH))
}

fn link(out: &Path, libs: &[&dyn AsRef<std::ffi::OsStr>]) {
    let mut cmd = Command::new(env!("FTRAMP_CAPI_CC"));
    cmd.arg("-o").arg(out).arg(env!("FTRAMP_CAPI_MAIN_O")).arg(env!("FTRAMP_CAPI_TRACEE_O"));
    for l in libs {
        cmd.arg(l);
    }
    let o = cmd.output().unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(o.status.success(), "{cmd:?} failed:\n{}", String::from_utf8_lossy(&o.stderr));
}

/// Runs `prog` (under the runner when cross-built) with a time limit.
fn run(prog: &Path, env: &[(&str, &Path)]) -> (bool, String) {
    let runner: Vec<&str> = env!("FTRAMP_CAPI_RUNNER").split_whitespace().collect();
    let mut cmd = match runner.split_first() {
        Some((r, args)) => {
            let mut c = Command::new(r);
            c.args(args).arg(prog);
            c
        }
        None => Command::new(prog),
    };
    cmd.arg(env!("FTRAMP_CAPI_DL_SO")).env_remove("LD_LIBRARY_PATH").stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    let start = Instant::now();
    let limit = Duration::from_secs(600);
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!("{cmd:?} still running after {limit:?}:\n{}", String::from_utf8_lossy(&o.stdout));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = child.wait_with_output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    (o.status.success(), text)
}

fn check_report(linkage: &str, ok: bool, out: &str) {
    println!("--- {linkage}:\n{out}");
    let summary = out.lines().find(|l| l.ends_with(" failed")).unwrap_or_else(|| panic!("{linkage}: no summary line:\n{out}"));
    let passed: u32 = summary.split_whitespace().next().unwrap().parse().unwrap();
    assert!(ok && summary.ends_with(", 0 failed"), "{linkage}: {summary}\n{out}");
    assert!(passed > 100, "{linkage}: only {passed} checks ran");
    assert!(out.contains(&format!("ftramp C API test on {}", std::env::consts::ARCH)), "{out}");
}

#[test]
fn c_program_linked_against_the_static_library() {
    let dir = work_dir("static");
    let (a, _) = libs(&dir);
    let prog = dir.join("capi_test_static");
    let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&a];
    args.extend(NATIVE_LIBS.iter().map(|l| l as &dyn AsRef<std::ffi::OsStr>));
    link(&prog, &args);
    // No LD_LIBRARY_PATH: the runtime is inside the executable.
    let (ok, out) = run(&prog, &[]);
    check_report("static", ok, &out);
}

#[test]
fn c_program_linked_against_the_shared_library() {
    let dir = work_dir("shared");
    let (_, so) = libs(&dir);
    let prog = dir.join("capi_test_shared");
    let l = format!("-L{}", so.parent().unwrap().display());
    link(&prog, &[&l, &"-lftramp", &"-lpthread", &"-ldl"]);
    let (ok, out) = run(&prog, &[]);
    assert!(!ok && out.contains("libftramp.so"), "without LD_LIBRARY_PATH the loader must miss libftramp.so:\n{out}");
    let (ok, out) = run(&prog, &[("LD_LIBRARY_PATH", &dir)]);
    check_report("shared", ok, &out);
}
