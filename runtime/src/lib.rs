//! ftramp-runtime: the user-space side of ftrace.
//!
//! * [`sites`] finds every patch site of the program and its libraries;
//! * [`patch`] changes them while other threads run them;
//! * [`exec`] maps generated trampolines next to the code they serve, and
//!   [`cache`] is the one place that makes modified code visible to the CPU;
//! * [`ops`] is `struct ftrace_ops`; [`ftrace`] is the engine that keeps
//!   every site on the cheapest trampoline for the ops that trace it;
//!   [`dispatch`] holds what trampolines call (thunks, the list function);
//! * [`grace`] is the grace period that lets unregistering free safely;
//! * [`clock`] is the cheap timestamp clock (TSC / cntvct, calibrated);
//! * [`regs`] reads `struct ftrace_regs` through the generator's layout;
//! * [`fgraph`] is function-graph tracing (entry + return, shadow stacks);
//! * [`fprobe`] is entry/exit probes on top of one fgraph user;
//! * [`unwind`] hooks the unwinder so exceptions and panics pass hijacked
//!   returns;
//! * [`thread`] is the per-thread block and thread exit without
//!   allocating (a thread's first traced call may be a signal handler's).
//!
//! `unsafe` lives only in `exec.rs`, `cache.rs`, `clock.rs` (counter reads), `patch*`, `regs.rs`,
//! `grace.rs`, `dispatch.rs` (publishing the site table), `fgraph.rs`
//! (the per-thread shadow stacks), `fprobe.rs` (the published tables),
//! `unwind.rs` (GOT hooks, return slots on the stack), `thread.rs` (the
//! exit key) and `sites/loaded.rs`, each block with the reason it is sound.

pub mod cache;
pub mod clock;
pub mod dispatch;
pub mod env;
pub mod exec;
pub mod fgraph;
pub mod fprobe;
pub mod ftrace;
pub mod grace;
pub mod ops;
pub mod patch;
pub mod regs;
pub mod sites;
pub mod thread;
pub mod unwind;

pub use exec::JitImage;
pub use regs::FtraceRegs;
pub use sites::{discover, Discovery, Site};

use ftramp_codegen::{CodegenError, Spec};

/// Errors of the runtime.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Codegen(#[from] CodegenError),
    #[error("{call} failed: {err}")]
    Os { call: &'static str, err: std::io::Error },
    #[error("no free address range of {size} bytes within {reach:#x} bytes of {near:#x}")]
    NoMemoryInReach { near: usize, size: usize, reach: u64 },
    #[error("site {addr:#x} does not hold the expected bytes (found {found:02x?})")]
    UnexpectedSiteBytes { addr: usize, found: Vec<u8> },
    #[error("cannot patch {addr:#x}: {why}")]
    BadPatch { addr: usize, why: String },
    #[error("threads {tids:?} did not answer the patcher's evacuation signal within {waited_ms} ms; the round was undone")]
    ThreadsNotAnswering { tids: Vec<i32>, waited_ms: u64 },
}

impl RuntimeError {
    pub(crate) fn os(call: &'static str) -> RuntimeError {
        RuntimeError::Os { call, err: std::io::Error::last_os_error() }
    }
}

/// The spec name of the architecture this runtime was built for.
pub const HOST_ARCH: &str = if cfg!(target_arch = "x86_64") {
    "x86_64"
} else if cfg!(target_arch = "aarch64") {
    "aarch64"
} else if cfg!(target_arch = "riscv64") {
    "riscv64"
} else if cfg!(all(target_arch = "powerpc64", target_endian = "little")) {
    "ppc64le"
} else if cfg!(target_arch = "s390x") {
    "s390x"
} else {
    "unsupported"
};

/// A `/proc` file's text, read whole in a few large reads.  The kernel
/// makes such a file one read at a time (`/proc/self/maps` walks the
/// mappings under the mm lock for each), and `fs::read_to_string`, which
/// sees a size of 0, starts with 32-byte reads and doubles them: ten reads
/// for a 10 KB `maps`.
pub(crate) fn read_proc(path: &str) -> std::io::Result<String> {
    use std::io::Read;
    let mut text = String::with_capacity(64 << 10);
    std::fs::File::open(path)?.read_to_string(&mut text)?;
    Ok(text)
}

/// The built-in spec of the host architecture, parsed once.
pub fn host_spec() -> &'static Spec {
    static SPEC: std::sync::OnceLock<Spec> = std::sync::OnceLock::new();
    SPEC.get_or_init(|| Spec::builtin(HOST_ARCH).expect("the host arch has a valid built-in spec"))
}

/// How the engine generates its trampolines on this host: [`site_entry`],
/// and the vector registers' upper halves kept where the spec has them and
/// the CPU has them (x86_64 with AVX: `__m256` arguments and return values
/// survive AVX code in a callback; codegen `program.rs`, "Vector upper
/// halves"), and the bits above them where the registers are wider still
/// (AVX-512F: `__m512` arguments and return values, `vector_wider`).
/// `FTRAMP_VECTOR_UPPER=0` (read once) leaves them out, for comparisons.
pub fn gen_options() -> ftramp_codegen::GenOptions {
    static OPTS: std::sync::OnceLock<ftramp_codegen::GenOptions> = std::sync::OnceLock::new();
    *OPTS.get_or_init(|| {
        let off = crate::env::var_os("FTRAMP_VECTOR_UPPER").is_some_and(|v| v == "0");
        let vector_upper = !off && host_spec().vector_upper_bytes > 0 && host_has_vector_upper();
        ftramp_codegen::GenOptions { entry: site_entry(), vector_upper, vector_wider: vector_upper && host_has_wider_vectors() }
    })
}

/// The CPU's vector registers are wider than the spec's upper bits reach
/// (x86_64: AVX-512F, `zmm`).
fn host_has_wider_vectors() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The CPU has the upper vector bits the host spec describes (x86_64: AVX,
/// enabled by the OS).
fn host_has_vector_upper() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// How the engine's sites enter their trampolines on this host: through a
/// per-site stub where the spec sets `site.stub` (x86_64: keeps the
/// return-stack predictor in step, codegen `program.rs` "Stub entry"),
/// else by the site's own call.  `FTRAMP_SITE_ENTRY=call` (read once)
/// makes stub-capable hosts use `call` sites too, for comparisons.
pub fn site_entry() -> ftramp_codegen::SiteEntry {
    use ftramp_codegen::SiteEntry;
    static ENTRY: std::sync::OnceLock<SiteEntry> = std::sync::OnceLock::new();
    *ENTRY.get_or_init(|| {
        let forced_call = crate::env::var_os("FTRAMP_SITE_ENTRY").is_some_and(|v| v == "call");
        if host_spec().raw.site.stub && !forced_call {
            SiteEntry::Stub
        } else {
            SiteEntry::Call
        }
    })
}
