//! Builds the tracees with the target arch's patch-site flags (from its spec).

use std::path::Path;

fn main() {
    let arch = ftramp_codegen::spec::for_target_arch(&std::env::var("CARGO_CFG_TARGET_ARCH").unwrap()).expect("an arch with a spec");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let spec_path = root.join("arch-specs").join(format!("{arch}.toml"));
    println!("cargo:rerun-if-changed={}", spec_path.display());
    println!("cargo:rerun-if-changed=tracee.c");
    let spec = ftramp_codegen::Spec::builtin(arch).unwrap();
    let flags = spec.raw.site.flags.clone();
    let mut b = cc::Build::new();
    b.opt_level(2).flag("-fno-ipa-ra").flag_if_supported("-fcf-protection=none");
    for f in flags.split_whitespace() {
        b.flag(f);
    }
    b.file("tracee.c").compile("fgraph_multi_tracee");

    // How the sample's tests start the program when it is cross-built: the
    // runner cargo uses (CARGO_TARGET_<TRIPLE>_RUNNER), else qemu-user with
    // the spec's cross sysroot.
    let (host, target) = (std::env::var("HOST").unwrap(), std::env::var("TARGET").unwrap());
    let var = format!("CARGO_TARGET_{}_RUNNER", target.to_uppercase().replace('-', "_"));
    println!("cargo:rerun-if-env-changed={var}");
    let runner = match std::env::var(&var) {
        Ok(r) => r,
        Err(_) if host == target => String::new(),
        Err(_) => format!("qemu-{} -L /usr/{}", spec.raw.arch.qemu, spec.raw.arch.gnu_triple),
    };
    println!("cargo:rustc-env=FTRAMP_SAMPLE_RUNNER={runner}");
}
