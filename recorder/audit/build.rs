//! Compiles `src/module.rs` into `libftramp_audit.so` with `rustc` itself
//! (`no_std`, `panic = "abort"`: see `src/lib.rs`), for the target being
//! built and with its linker, and copies it to where cargo puts the
//! recorder library.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let src = Path::new("src/module.rs");
    println!("cargo:rerun-if-changed={}", src.display());
    let env = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("cargo sets {k} for build scripts"));
    let out = PathBuf::from(env("OUT_DIR"));
    let so = out.join("libftramp_audit.so");
    let mut rustc = Command::new(env("RUSTC"));
    rustc
        .args(["--edition", "2021", "--crate-type", "cdylib", "--crate-name", "ftramp_audit"])
        .args(["--target", &env("TARGET")])
        .args(["-C", "panic=abort", "-C", "opt-level=2", "-C", "debuginfo=0", "-C", "strip=debuginfo"])
        .arg("-o")
        .arg(&so)
        .arg(src);
    // aarch64's atomics call out-of-line helpers by default, which ask
    // libc's `getauxval` whether the CPU has LSE: inline them instead.
    if env("TARGET").starts_with("aarch64") {
        rustc.args(["-C", "target-feature=-outline-atomics"]);
    }
    // The linker cargo resolved for the target (.cargo/config.toml's for
    // the cross targets); rustc's default `cc` otherwise.
    if let Ok(linker) = std::env::var("RUSTC_LINKER") {
        rustc.arg("-C").arg(format!("linker={linker}"));
    }
    let status = rustc.status().expect("cannot run rustc");
    assert!(status.success(), "rustc failed to build the audit module ({status})");
    // OUT_DIR is target/<triple>/<profile>/build/ftramp-audit-<hash>/out.
    if let Some(profile_dir) = out.ancestors().nth(3) {
        for dir in [profile_dir.to_path_buf(), profile_dir.join("deps")] {
            if dir.is_dir() {
                let dest = dir.join("libftramp_audit.so");
                // A new file, not an overwrite: processes may have the old one mapped.
                let tmp = dir.join(".libftramp_audit.so.tmp");
                std::fs::copy(&so, &tmp).expect("cannot copy the audit module");
                std::fs::rename(&tmp, &dest).expect("cannot install the audit module");
            }
        }
    }
}
