//! The generated ELF object, linked into a C program by each arch's gcc
//! and run — natively for the host arch, under qemu-user for the others.
//! The C side is tests/c/objtest.c; it prints "N passed, M failed".
//!
//! Needs the cross gcc and qemu-user (the README's test command installs
//! them).  With `CI=true` a missing tool fails the test; elsewhere that
//! arch is skipped with a message.

#![cfg(target_arch = "x86_64")]

use ftramp_codegen::{arch, header, image::Image, object, spec::Spec, GenOptions, Variant};
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn have(tool: &str) -> bool {
    Command::new(tool).arg("--version").output().map(|o| o.status.success()).unwrap_or(false)
}

fn in_ci() -> bool {
    std::env::var("CI").map(|v| v == "true" || v == "1").unwrap_or(false)
}

/// Builds and runs objtest for one arch; returns its output.
fn run_arch(spec: &Spec) -> Option<String> {
    run_arch_with(spec, GenOptions::default())
}

fn run_arch_with(spec: &Spec, opts: GenOptions) -> Option<String> {
    let host = spec.name == "x86_64";
    let cc = if host { "gcc".to_string() } else { format!("{}-gcc", spec.raw.arch.gnu_triple) };
    let qemu = format!("qemu-{}", spec.raw.arch.qemu);
    for tool in [cc.as_str()].into_iter().chain((!host).then_some(qemu.as_str())) {
        if !have(tool) {
            if in_ci() {
                panic!("{}: `{tool}` is missing (run the README's test command, which installs it)", spec.name);
            }
            eprintln!("SKIP {}: `{tool}` not installed", spec.name);
            return None;
        }
    }
    let dir = std::env::temp_dir().join(format!("ftramp-objtest-{}-{}-{}", spec.name, opts.vector_upper, std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let image = Image::generate_opts(spec, &Variant::ALL, opts).unwrap();
    std::fs::write(dir.join("tramp.o"), object::write(spec, &image, &Default::default()).unwrap()).unwrap();
    std::fs::write(dir.join("ftramp.h"), header::header(spec, "")).unwrap();
    let c = root().join("tests").join("c");
    let common = ["-O2", "-fno-inline", "-fno-ipa-ra"];
    let compile = |src: &str, extra: &str, out: &str| {
        let mut cmd = Command::new(&cc);
        cmd.args(common).args(extra.split_whitespace()).arg("-I").arg(&dir).arg("-I").arg(&c);
        if host {
            cmd.arg("-fcf-protection=none");
        }
        cmd.arg("-c").arg(c.join(src)).arg("-o").arg(dir.join(out));
        let o = cmd.output().unwrap();
        assert!(o.status.success(), "{}: compiling {src}: {}", spec.name, String::from_utf8_lossy(&o.stderr));
    };
    compile("tracee.c", &spec.raw.site.flags, "tracee.o");
    compile("tracee_abi.c", &spec.raw.site.flags, "tracee_abi.o");
    compile("abi_driver.c", "", "abi_driver.o");
    compile("tracee_callsite.c", &spec.raw.site.callsite_flags, "tracee_callsite.o");
    compile("harness.c", "", "harness.o");
    compile("objtest.c", "", "objtest.o");
    let exe = dir.join("objtest");
    let o = Command::new(&cc)
        .args(["objtest.o", "harness.o", "abi_driver.o", "tracee.o", "tracee_abi.o", "tracee_callsite.o", "tramp.o", "-o"])
        .arg(&exe)
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}: linking: {}", spec.name, String::from_utf8_lossy(&o.stderr));
    let o = if host {
        Command::new(&exe).output().unwrap()
    } else {
        Command::new(&qemu).arg("-L").arg(format!("/usr/{}", spec.raw.arch.gnu_triple)).arg(&exe).output().unwrap()
    };
    let out = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(o.status.success(), "{}: objtest failed ({}):\n{out}", spec.name, o.status);
    Some(out)
}

#[test]
fn the_object_links_and_runs_on_every_arch() {
    let mut ran = 0;
    for backend in arch::all() {
        let spec = Spec::builtin(backend.name()).unwrap();
        if let Some(out) = run_arch(&spec) {
            let last = out.lines().last().unwrap_or("");
            let (p, f) = last.split_once(" passed, ").expect("summary line");
            let p: u32 = p.trim().parse().unwrap();
            assert!(f.starts_with("0 failed"), "{}: {out}", spec.name);
            // Every entry variant ran all its checks.
            assert!(p >= 100, "{}: only {p} checks ran:\n{out}", spec.name);
            eprintln!("{}: {last}", spec.name);
            ran += 1;
        }
    }
    assert!(ran > 0, "no arch could be tested");
}

/// `ftramp gen --vector-upper` (x86_64 with AVX): the object with the
/// upper-halves steps passes the same checks (its `ymm` code runs on every
/// call, through the object's relocations).
#[test]
fn the_vector_upper_object_links_and_runs() {
    if !std::arch::is_x86_feature_detected!("avx") {
        eprintln!("skipped: this CPU has no AVX");
        return;
    }
    let spec = Spec::builtin("x86_64").unwrap();
    let out = run_arch_with(&spec, GenOptions { vector_upper: true, ..Default::default() }).expect("gcc is there (the host's)");
    let last = out.lines().last().unwrap_or("");
    let (p, f) = last.split_once(" passed, ").expect("summary line");
    assert!(f.starts_with("0 failed") && p.trim().parse::<u32>().unwrap() >= 100, "{out}");
}
