//! Builds the tracees with the target arch's patch-site flags (from its spec).

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
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let spec_path = root.join("arch-specs").join(format!("{arch}.toml"));
    println!("cargo:rerun-if-changed={}", spec_path.display());
    println!("cargo:rerun-if-changed=tracee.c");
    let spec: toml::Table = std::fs::read_to_string(&spec_path).unwrap().parse().unwrap();
    let flags = spec["site"]["flags"].as_str().unwrap().to_string();
    let mut b = cc::Build::new();
    b.opt_level(2).flag("-fno-ipa-ra").flag_if_supported("-fcf-protection=none");
    for f in flags.split_whitespace() {
        b.flag(f);
    }
    b.file("tracee.c").compile("ftrace_ops_tracee");
}
