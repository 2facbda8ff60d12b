//! Compiles the C side of `tests/c_api.rs` (the library itself is pure
//! Rust): the tracees with the target arch's patch-site flags read from its
//! spec (`site.flags`), the test program against `include/ftramp.h`, and a
//! shared library to dlopen.  The test links the objects against the
//! freshly built `libftramp.a` / `libftramp.so`; what it needs reaches it
//! as `FTRAMP_CAPI_*` environment variables.

use std::path::{Path, PathBuf};

fn main() {
    let spec = ftramp_codegen::build::target_spec();
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let c = manifest.join("tests").join("c");
    let include = manifest.join("include");
    for p in [&c, &include] {
        println!("cargo:rerun-if-changed={}", p.display());
    }
    let site_flags: Vec<String> = spec.raw.site.flags.split_whitespace().map(String::from).collect();
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());

    // Tracees: patch sites, no inlining, no interprocedural register
    // allocation (a trampoline may clobber what the ABI lets it clobber).
    let mut b = cc::Build::new();
    b.opt_level(2).flag("-fno-ipa-ra").flag("-fno-inline").flag_if_supported("-fcf-protection=none").cargo_metadata(false);
    for f in &site_flags {
        b.flag(f);
    }
    let tracee = one(b.file(c.join("tracee.c")).compile_intermediates());

    let mut b = cc::Build::new();
    b.opt_level(2)
        .include(&include)
        .warnings(true)
        .extra_warnings(true)
        .flag("-Werror=implicit-function-declaration")
        .cargo_metadata(false);
    let main = one(b.file(c.join("capi_test.c")).compile_intermediates());

    let compiler = cc::Build::new().opt_level(2).pic(true).cargo_metadata(false).get_compiler();
    let so = out.join("libcapi_dl.so");
    let mut cmd = compiler.to_command();
    cmd.args(&site_flags).arg("-fno-ipa-ra").arg("-shared").arg("-o").arg(&so).arg(c.join("dl.c"));
    let status = cmd.status().unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(status.success(), "{cmd:?} failed");

    // How the test runs a program for a foreign target.
    let runner = ftramp_codegen::build::test_runner(&spec);

    let env = |k: &str, v: &Path| println!("cargo:rustc-env={k}={}", v.display());
    env("FTRAMP_CAPI_TRACEE_O", &tracee);
    env("FTRAMP_CAPI_MAIN_O", &main);
    env("FTRAMP_CAPI_DL_SO", &so);
    env("FTRAMP_CAPI_CC", compiler.path());
    println!("cargo:rustc-env=FTRAMP_CAPI_RUNNER={runner}");
}

fn one(objects: Vec<PathBuf>) -> PathBuf {
    assert_eq!(objects.len(), 1, "{objects:?}");
    objects.into_iter().next().unwrap()
}
