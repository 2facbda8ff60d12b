//! Builds `libftramp_audit.so`, the `LD_AUDIT` module of `ftramp record`
//! (its source and the reasons for it: `src/module.rs`).
//!
//! The module is `no_std` and links nothing, so that the loader does not
//! bring a second libc into each traced process for it; such a library
//! needs `panic = "abort"`, which one crate of a workspace that unwinds
//! cannot have.  So `build.rs` compiles `src/module.rs` with `rustc`
//! directly, and leaves the library where cargo leaves the recorder's
//! (`target/<profile>/` and its `deps/`), where `ftramp record` looks for
//! it.  Depending on this crate (as the CLI and the recorder's tests do) is
//! what builds it.

/// Where this build wrote the module.
pub const MODULE_PATH: &str = concat!(env!("OUT_DIR"), "/libftramp_audit.so");
