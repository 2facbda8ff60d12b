//! Helpers for the build scripts that compile C with a target's patch-site
//! flags and run test programs for it (exectest, capi, the examples).

use crate::spec::{for_target_arch, Spec};

/// The built-in spec of the arch Cargo is building for
/// (`CARGO_CFG_TARGET_ARCH`); panics with the arch's name if it has none.
pub fn target_spec() -> Spec {
    let target_arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let name = for_target_arch(&target_arch).unwrap_or_else(|| panic!("no arch spec for target arch `{target_arch}`"));
    Spec::builtin(name).expect("built-in specs are valid")
}

/// How a test starts a program built for the target: nothing natively; when
/// cross-building, the runner cargo uses (`CARGO_TARGET_<TRIPLE>_RUNNER`),
/// else qemu-user with the spec's cross sysroot.  Prints the
/// `rerun-if-env-changed` line for that variable.
pub fn test_runner(spec: &Spec) -> String {
    let (host, target) = (std::env::var("HOST").unwrap_or_default(), std::env::var("TARGET").unwrap_or_default());
    let var = format!("CARGO_TARGET_{}_RUNNER", target.to_uppercase().replace('-', "_"));
    println!("cargo:rerun-if-env-changed={var}");
    match std::env::var(&var) {
        Ok(r) => r,
        Err(_) if host == target => String::new(),
        Err(_) => format!("qemu-{} -L /usr/{}", spec.raw.arch.qemu, spec.raw.arch.gnu_triple),
    }
}

/// Compiles the example's `tracee.c` with the target's site flags into the
/// static library `lib` and returns the spec.
pub fn compile_tracee(lib: &str) -> Spec {
    let spec = target_spec();
    println!("cargo:rerun-if-changed=tracee.c");
    let mut b = cc::Build::new();
    b.opt_level(2).flag("-fno-ipa-ra").flag_if_supported("-fcf-protection=none");
    for f in spec.raw.site.flags.split_whitespace() {
        b.flag(f);
    }
    b.file("tracee.c").compile(lib);
    spec
}
