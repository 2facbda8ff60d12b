//! What the per-arch encoder tests share: running the cross binutils.

use std::path::PathBuf;
use std::process::Command;

/// True (with a message) when `FTRAMP_SKIP_ORACLE` asks to skip the
/// binutils checks.
pub fn tools_skipped() -> bool {
    let skip = std::env::var_os("FTRAMP_SKIP_ORACLE").is_some();
    if skip {
        eprintln!("FTRAMP_SKIP_ORACLE set: skipping the binutils checks");
    }
    skip
}

/// Runs `cmd`, which must succeed, and returns its standard output.
pub fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e} (install the cross binutils: scripts/test.sh does)"));
    assert!(out.status.success(), "{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A fresh scratch directory for one test of one arch.
pub fn tmpdir(arch: &str, tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ftramp-enc-{arch}-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
