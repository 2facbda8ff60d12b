//! Builds the C tracees with the target arch's patch-site flags, read from
//! its spec (`site.flags`, `site.callsite_flags`), and the harness without.

use std::path::Path;

fn main() {
    let arch = ftramp_codegen::spec::for_target_arch(&std::env::var("CARGO_CFG_TARGET_ARCH").unwrap()).expect("an arch with a spec");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let spec_path = root.join("arch-specs").join(format!("{arch}.toml"));
    println!("cargo:rerun-if-changed={}", spec_path.display());
    let spec = ftramp_codegen::Spec::builtin(arch).unwrap();
    let flags = |key: &str| -> Vec<String> {
        let text = if key == "flags" { &spec.raw.site.flags } else { &spec.raw.site.callsite_flags };
        text.split_whitespace().map(String::from).collect()
    };
    let c = root.join("tests").join("c");
    for f in ["tracee.c", "tracee_many.c", "tracee_fgraph.c", "tracee_fork.c", "tracee_abi.c", "abi.h", "abi_driver.c", "tracee_callsite.c", "harness.c", "arch"] {
        println!("cargo:rerun-if-changed={}", c.join(f).display());
    }
    let base = |b: &mut cc::Build| {
        b.opt_level(2).flag("-fno-ipa-ra").flag("-fno-inline").flag_if_supported("-fcf-protection=none");
    };
    let mut b = cc::Build::new();
    base(&mut b);
    for f in flags("flags") {
        b.flag(&f);
    }
    b.include(&c).file(c.join("tracee.c")).file(c.join("tracee_many.c")).file(c.join("tracee_fgraph.c")).file(c.join("tracee_fork.c"));
    b.file(c.join("tracee_abi.c")).compile("ftramp_tracee");
    let mut b = cc::Build::new();
    base(&mut b);
    for f in flags("callsite_flags") {
        b.flag(&f);
    }
    b.file(c.join("tracee_callsite.c")).compile("ftramp_tracee_callsite");
    // Exceptions and panics through traced frames (tests/unwind.rs, on the
    // arches with live patching): C++ with landing pads, C with cleanups
    // and unwind tables.
    let unwind_tracees: &[_] = match arch {
        "x86_64" | "aarch64" => &[("tracee_unwind.cpp", "ftramp_tracee_unwind_cpp", true), ("tracee_unwind.c", "ftramp_tracee_unwind_c", false)],
        _ => &[],
    };
    for &(file, lib, cpp) in unwind_tracees {
        println!("cargo:rerun-if-changed={}", c.join(file).display());
        let mut b = cc::Build::new();
        base(&mut b);
        b.cpp(cpp).flag("-fexceptions");
        for f in flags("flags") {
            b.flag(&f);
        }
        b.file(c.join(file)).compile(lib);
    }
    if !unwind_tracees.is_empty() {
        // A C++ library the test dlopens after the hooks are in place.
        let out = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap());
        let so = out.join("libftramp_unwind_dl.so");
        println!("cargo:rerun-if-changed={}", c.join("unwind_dl.cpp").display());
        let mut b = cc::Build::new();
        base(&mut b);
        let mut cmd = b.cpp(true).pic(true).get_compiler().to_command();
        cmd.args(flags("flags")).args(["-fexceptions", "-shared", "-o"]).arg(&so).arg(c.join("unwind_dl.cpp"));
        let status = cmd.status().unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
        assert!(status.success(), "{cmd:?} failed");
        println!("cargo:rustc-env=FTRAMP_UNWIND_DL_SO={}", so.display());
    }
    if arch == "x86_64" {
        // One static library per tracee, with the site flags and `extra`.
        let tracee = |file: &str, lib: &str, extra: &[&str]| {
            println!("cargo:rerun-if-changed={}", c.join(file).display());
            let mut b = cc::Build::new();
            base(&mut b);
            for f in extra.iter().map(|f| f.to_string()).chain(flags("flags")) {
                b.flag(&f);
            }
            b.file(c.join(file)).compile(lib);
        };
        // __m256 and __m512 arguments and returns (tests/vector_upper.rs),
        // long double returns in st(0)/st(1) (tests/x87_return.rs).
        tracee("tracee_avx.c", "ftramp_tracee_avx", &["-mavx"]);
        tracee("tracee_avx512.c", "ftramp_tracee_avx512", &["-mavx512f"]);
        tracee("tracee_x87.c", "ftramp_tracee_x87", &[]);
    }
    let mut b = cc::Build::new();
    b.opt_level(2).include(&c).file(c.join("harness.c")).file(c.join("abi_driver.c")).compile("ftramp_harness");
    build_sites(&c.join("sites"), arch, &flags("flags"), &flags("callsite_flags"));
}

/// The C side of the site-discovery tests (`tests/sites.rs`): functions
/// linked into the test binary (plain, and with landing pads before the
/// NOPs), and shared libraries the tests dlopen, whose paths reach the
/// tests as `FTRAMP_SITES_*_SO`.
fn build_sites(dir: &Path, arch: &str, flags: &[String], callsite_flags: &[String]) {
    println!("cargo:rerun-if-changed={}", dir.display());
    // Discovery reads the compiler's site tables.  Flags that record none
    // (ppc64le's -pg -mprofile-kernel) leave nothing to discover: the tests
    // are compiled only with `cfg(ftramp_sites)`.
    println!("cargo::rustc-check-cfg=cfg(ftramp_sites)");
    if !flags.iter().any(|f| f.starts_with("-fpatchable-function-entry") || f == "-mrecord-mcount") {
        return;
    }
    println!("cargo:rustc-cfg=ftramp_sites");
    let pads: &[&str] = match arch {
        "x86_64" => &["-fcf-protection=full"],
        "aarch64" => &["-mbranch-protection=standard"],
        _ => &[],
    };
    let build = |file: &str, lib: &str, site: &[String], extra: &[&str]| {
        let mut b = cc::Build::new();
        b.opt_level(2).flag("-fno-ipa-ra").flag("-fno-inline");
        for f in site.iter().map(String::as_str).chain(extra.iter().copied()) {
            b.flag(f);
        }
        b.file(dir.join(file)).compile(lib);
    };
    let no_pads: &[&str] = if arch == "x86_64" { &["-fcf-protection=none"] } else { &[] };
    build("main.c", "ftramp_sites_main", flags, no_pads);
    build("pad.c", "ftramp_sites_pad", flags, pads);
    build("pad_callsite.c", "ftramp_sites_pad_callsite", callsite_flags, pads);

    // Shared libraries, compiled and linked by the target's C compiler.
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let shared = |file: &str, so: &str, env: &str, pic: bool, extra: &[&str]| {
        let path = out.join(so);
        let mut cmd = cc::Build::new().opt_level(2).pic(pic).get_compiler().to_command();
        cmd.args(extra).arg("-shared").arg("-o").arg(&path).arg(dir.join(file));
        let status = cmd.status().unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
        assert!(status.success(), "{cmd:?} failed");
        println!("cargo:rustc-env={env}={}", path.display());
    };
    let dl_flags: Vec<&str> = flags.iter().map(String::as_str).chain(no_pads.iter().copied()).collect();
    shared("dl.c", "libftramp_sites_dl.so", "FTRAMP_SITES_DL_SO", true, &dl_flags);
    // The same, stripped at link time (-s): .dynsym only.
    let stripped: Vec<&str> = dl_flags.iter().copied().chain(["-s"]).collect();
    shared("dl.c", "libftramp_sites_dl_stripped.so", "FTRAMP_SITES_DL_STRIPPED_SO", true, &stripped);
    if arch == "aarch64" {
        // A function of the SVE vector PCS, which discovery refuses.
        let sve: Vec<&str> = dl_flags.iter().copied().chain(["-march=armv8-a+sve"]).collect();
        shared("sve.c", "libftramp_sites_sve.so", "FTRAMP_SITES_SVE_SO", true, &sve);
    }
    if arch == "x86_64" {
        // -mnop-mcount/-mrecord-mcount need non-PIC code (DESIGN.md §2);
        // __mcount_loc is read-only, so the .so gets text relocations.
        let mcount = ["-fno-PIE", "-pg", "-mfentry", "-mnop-mcount", "-mrecord-mcount", "-fcf-protection=none", "-Wl,-z,notext"];
        shared("mcount.c", "libftramp_sites_mcount.so", "FTRAMP_SITES_MCOUNT_SO", false, &mcount);
    }
}
