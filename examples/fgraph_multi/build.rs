//! Builds the tracees with the target arch's patch-site flags (from its
//! spec), and tells the tests how to start the program when cross-built.

fn main() {
    let spec = ftramp_codegen::build::compile_tracee("fgraph_multi_tracee");
    println!("cargo:rustc-env=FTRAMP_SAMPLE_RUNNER={}", ftramp_codegen::build::test_runner(&spec));
}
