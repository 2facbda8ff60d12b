//! Linux's `samples/ftrace/ftrace-ops.c`, rebuilt on ftramp (the program
//! is `src/main.rs`; the benchmark `src/bench.rs`).
//!
//! Registers `--nr-ops-relevant` ops on `tracee_relevant` and
//! `--nr-ops-irrelevant` on `tracee_irrelevant`, calls `tracee_relevant`
//! `--nr-function-calls` times and reports the time per call, in the
//! sample's words.  The module parameters are flags:
//!
//! ```text
//! cargo run --release -p ftrace-ops -- --nr-ops-relevant 2 --check-count
//! ```

pub mod bench;

use clap::Parser;
use ftramp_runtime::ftrace::ftrace;
use ftramp_runtime::ops::{Filter, Ops, OpsFlags};
use ftramp_runtime::FtraceRegs;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

extern "C" {
    fn tracee_relevant();
    fn tracee_irrelevant();
}

#[derive(Parser, Clone)]
#[command(about = "Linux's samples/ftrace/ftrace-ops.c on ftramp: time calls to a function traced by N ops")]
pub struct Args {
    /// How many times to call tracee_relevant.
    #[arg(long, default_value_t = 100_000)]
    nr_function_calls: u64,
    /// How many ops trace tracee_relevant.
    #[arg(long, default_value_t = 1)]
    nr_ops_relevant: u32,
    /// How many ops trace tracee_irrelevant (never called).
    #[arg(long, default_value_t = 0)]
    nr_ops_irrelevant: u32,
    /// Register the ops with SAVE_REGS (full pt_regs).
    #[arg(long)]
    save_regs: bool,
    /// Register the ops with RECURSION (the runtime guards recursion).
    #[arg(long)]
    assist_recursion: bool,
    /// Count the calls and check the counts are exact.
    #[arg(long)]
    check_count: bool,
    /// Leave the ops registered at the end.
    #[arg(long)]
    persist: bool,
    /// Run the benchmark: every configuration side by side, and LLVM XRay.
    #[arg(long)]
    bench: bool,
    /// With --bench: instructions per call from valgrind's callgrind.
    #[arg(long)]
    callgrind: bool,
    /// Print only "<ns per call>" (used by the benchmark).
    #[arg(long, hide = true)]
    quiet: bool,
    /// The count --check-count expects (default: --nr-function-calls); lets
    /// the tests see the "Counter called" report.
    #[arg(long, hide = true)]
    expect_calls: Option<u64>,
}

/// One configuration of the sample.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    pub calls: u64,
    pub relevant: u32,
    pub irrelevant: u32,
    pub save_regs: bool,
    pub recursion: bool,
    pub count: bool,
    /// What --check-count expects each relevant ops to have counted.
    pub expect: Option<u64>,
}

impl Config {
    /// The command-line arguments that run this configuration.
    pub fn args(&self, calls: u64) -> Vec<String> {
        let mut a = vec![
            "--quiet".to_string(),
            "--nr-function-calls".into(),
            calls.to_string(),
            "--nr-ops-relevant".into(),
            self.relevant.to_string(),
            "--nr-ops-irrelevant".into(),
            self.irrelevant.to_string(),
        ];
        if self.save_regs {
            a.push("--save-regs".into());
        }
        if self.recursion {
            a.push("--assist-recursion".into());
        }
        a
    }
}

extern "C" fn ops_func_nop(_ip: usize, _parent_ip: usize, _op: &Ops, _fregs: &mut FtraceRegs) {}

extern "C" fn ops_func_count(_ip: usize, _parent_ip: usize, op: &Ops, _fregs: &mut FtraceRegs) {
    // SAFETY: every ops of this program points `private` at a live counter
    // (leaked below).
    let count = unsafe { &*(op.private as *const AtomicU64) };
    count.fetch_add(1, Ordering::Relaxed);
}

fn make_ops(n: u32, tracee: &str, count: bool, flags: OpsFlags) -> Vec<Arc<Ops>> {
    let func = if count { ops_func_count } else { ops_func_nop };
    (0..n)
        .map(|_| {
            let counter = Box::leak(Box::new(AtomicU64::new(0))) as *const AtomicU64 as usize;
            Arc::new(Ops::new(func).flags(flags).filter(Filter::new().symbol(tracee)).private(counter))
        })
        .collect()
}

fn count(op: &Ops) -> u64 {
    // SAFETY: see ops_func_count.
    unsafe { &*(op.private as *const AtomicU64) }.load(Ordering::Relaxed)
}

/// Registers the configuration's ops, calls `tracee_relevant` `calls`
/// times, unregisters (unless `persist`) and returns
/// (whether every count was exact, ns per call).
pub fn run_config(cfg: &Config) -> (bool, f64) {
    run(cfg, false, true)
}

fn run(cfg: &Config, persist: bool, quiet: bool) -> (bool, f64) {
    let mut flags = OpsFlags::empty();
    if cfg.save_regs {
        flags = flags | OpsFlags::SAVE_REGS;
    }
    if cfg.recursion {
        flags = flags | OpsFlags::RECURSION;
    }
    let relevant = make_ops(cfg.relevant, "tracee_relevant", cfg.count, flags);
    let irrelevant = make_ops(cfg.irrelevant, "tracee_irrelevant", cfg.count, flags);
    for ops in relevant.iter().chain(&irrelevant) {
        if let Err(e) = ftrace().register(ops.clone()) {
            eprintln!("ftrace_ops: cannot register an ops: {e}");
            std::process::exit(2);
        }
    }

    let start = Instant::now();
    for _ in 0..cfg.calls {
        // SAFETY: a plain C function without arguments.
        unsafe { tracee_relevant() };
    }
    let ns = start.elapsed().as_nanos() as u64;
    let per = ns as f64 / cfg.calls.max(1) as f64;
    if !quiet {
        println!("Attempted {} calls to tracee_relevant in {}ns ({}ns / call)", cfg.calls, ns, ns.checked_div(cfg.calls).unwrap_or(0));
    }

    let mut exact = true;
    if cfg.count {
        for ops in &relevant {
            let c = count(ops);
            let want = cfg.expect.unwrap_or(cfg.calls);
            if c != want {
                println!("Counter called {c} times (expected {want})");
                exact = false;
            }
        }
        for ops in &irrelevant {
            let c = count(ops);
            if c != 0 {
                println!("Counter called {c} times (expected 0)");
                exact = false;
            }
        }
    }
    // SAFETY: as above.  (So the irrelevant tracee is linked in and
    // visibly untraced.)
    unsafe { tracee_irrelevant() };
    if !persist {
        for ops in relevant.iter().chain(&irrelevant) {
            let _ = ftrace().unregister(ops);
        }
    }
    (exact, per)
}

/// The program: the sample, or the benchmark with `--bench`.
pub fn main_entry() {
    let args = Args::parse();
    if args.bench {
        bench::run(args.nr_function_calls.max(1_000_000), args.callgrind);
        return;
    }
    let cfg = Config {
        calls: args.nr_function_calls,
        relevant: args.nr_ops_relevant,
        irrelevant: args.nr_ops_irrelevant,
        save_regs: args.save_regs,
        recursion: args.assist_recursion,
        count: args.check_count,
        expect: args.expect_calls,
    };
    if args.quiet {
        let (_, per) = run(&cfg, args.persist, true);
        println!("{per:.3}");
        return;
    }
    let tracer = if args.check_count { "ops_func_count" } else { "ops_func_nop" };
    println!("registering:");
    println!("  relevant ops: {}", args.nr_ops_relevant);
    println!("    tracee: tracee_relevant");
    println!("    tracer: {tracer}");
    println!("  irrelevant ops: {}", args.nr_ops_irrelevant);
    println!("    tracee: tracee_irrelevant");
    println!("    tracer: {tracer}");
    println!("  saving registers: {}", args.save_regs);
    println!("  assist recursion: {}", args.assist_recursion);
    let (exact, _) = run(&cfg, args.persist, false);
    if !exact {
        std::process::exit(1);
    }
}
