//! Hands the benchmark the target arch's patch-site flags (from its spec)
//! as `ftramp cflags` prints them.

fn main() {
    let spec = ftramp_codegen::build::target_spec();
    println!(
        "cargo:rustc-env=FTRAMP_BENCH_SITE_FLAGS={} -fno-ipa-ra",
        spec.raw.site.flags
    );
    println!("cargo:rerun-if-changed=build.rs");
}
