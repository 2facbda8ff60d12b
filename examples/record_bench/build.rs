//! Hands the benchmark the target arch's patch-site flags (from its spec)
//! as `ftramp cflags` prints them, plus gcc's -fno-ipa-stack-alignment
//! (README: Building programs for tracing).

fn main() {
    let spec = ftramp_codegen::build::target_spec();
    println!(
        "cargo:rustc-env=FTRAMP_BENCH_SITE_FLAGS={} -fno-ipa-ra -fno-ipa-stack-alignment",
        spec.raw.site.flags
    );
    println!("cargo:rerun-if-changed=build.rs");
}
