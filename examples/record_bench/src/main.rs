//! `cargo run --release -p record-bench`: ftramp record, uftrace record and
//! XRay FDR mode side by side on one C tracee (see the library's docs).

use clap::Parser;
use std::path::PathBuf;

/// ns and bytes per traced call: ftramp record vs uftrace record vs XRay FDR.
#[derive(Parser)]
struct Args {
    /// Loop iterations of the tracee (5 traced calls each).
    #[arg(long, default_value_t = 1_000_000)]
    iterations: u64,
    /// Interleaved rounds, each running every build and tracer once; the fastest run of each is kept.
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// The ftramp binary (default: next to this program, else on PATH).
    #[arg(long)]
    ftramp: Option<PathBuf>,
    /// Keep the builds and traces in the scratch directory.
    #[arg(long)]
    keep: bool,
    /// Also count instructions per traced call with valgrind's callgrind
    /// (exact where times are noisy; takes a minute or two).
    #[arg(long)]
    callgrind: bool,
}

fn main() {
    let a = Args::parse();
    if a.iterations == 0 {
        eprintln!("error: --iterations must be at least 1");
        std::process::exit(2);
    }
    record_bench::run(&record_bench::Options {
        iterations: a.iterations,
        reps: a.reps,
        ftramp: a.ftramp,
        keep: a.keep,
        callgrind: a.callgrind,
    });
}
