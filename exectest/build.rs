//! Builds the C tracees with the target arch's patch-site flags, read from
//! its spec (`site.flags`, `site.callsite_flags`), and the harness without.

use std::path::Path;

fn main() {
    let arch = match std::env::var("CARGO_CFG_TARGET_ARCH").unwrap().as_str() {
        "x86_64" => "x86_64",
        "aarch64" => "aarch64",
        "riscv64" => "riscv64",
        "powerpc64" => "ppc64le",
        "s390x" => "s390x",
        other => panic!("no arch spec for target arch {other}"),
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let spec_path = root.join("arch-specs").join(format!("{arch}.toml"));
    println!("cargo:rerun-if-changed={}", spec_path.display());
    let spec: toml::Table = std::fs::read_to_string(&spec_path).unwrap().parse().unwrap();
    let site = spec["site"].as_table().unwrap();
    let flags = |key: &str| -> Vec<String> { site[key].as_str().unwrap().split_whitespace().map(String::from).collect() };
    let c = root.join("tests").join("c");
    for f in ["tracee.c", "tracee_many.c", "tracee_callsite.c", "harness.c", "arch"] {
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
    b.file(c.join("tracee.c")).file(c.join("tracee_many.c")).compile("ftramp_tracee");
    let mut b = cc::Build::new();
    base(&mut b);
    for f in flags("callsite_flags") {
        b.flag(&f);
    }
    b.file(c.join("tracee_callsite.c")).compile("ftramp_tracee_callsite");
    let mut b = cc::Build::new();
    b.opt_level(2).include(&c).file(c.join("harness.c")).compile("ftramp_harness");
}
