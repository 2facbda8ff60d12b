//! Linux's `samples/fprobe/fprobe_example.c` on ftramp: probes a function
//! by name, prints its entry arguments and its return value, then the hit
//! and miss counts.  The module parameters are flags:
//!
//! ```text
//! cargo run -p fprobe-example -- --symbol 'tracee_fib' --nargs 1
//! cargo run -p fprobe-example -- --symbol 'tracee_*' --nosym tracee_work
//! ```

use clap::Parser;
use ftramp_runtime::fprobe::{self, EntryAction, Fprobe};
use ftramp_runtime::ftrace::ftrace;
use ftramp_runtime::FtraceRegs;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};

extern "C" {
    fn tracee_work(n: i64) -> i64;
}

#[derive(Parser)]
#[command(about = "Linux's samples/fprobe/fprobe_example.c on ftramp: print a function's arguments and return value")]
struct Args {
    /// The functions to probe: names or globs, separated by commas.
    #[arg(long, default_value = "tracee_add")]
    symbol: String,
    /// Functions not to probe (names or globs).
    #[arg(long)]
    nosym: Option<String>,
    /// How many integer arguments to print.
    #[arg(long, default_value_t = 2)]
    nargs: usize,
    /// Call tracee_work(1..=N).
    #[arg(long, default_value_t = 2)]
    calls: i64,
    /// Only the entry handler (no exit).
    #[arg(long)]
    entry_only: bool,
}

static NARGS: AtomicU64 = AtomicU64::new(0);
static NHIT: AtomicU64 = AtomicU64::new(0);
/// Site → (symbol, offset of the site in it).
static NAMES: OnceLock<HashMap<usize, (String, usize)>> = OnceLock::new();

fn name(ip: usize) -> String {
    match NAMES.get().and_then(|m| m.get(&ip)) {
        Some((s, off)) => format!("{s}+{off:#x}"),
        None => format!("{ip:#x}"),
    }
}

fn sample_entry_handler(_fp: &Fprobe, ip: usize, _ret_ip: usize, fregs: &mut FtraceRegs, data: &mut [u8]) -> EntryAction {
    NHIT.fetch_add(1, Relaxed);
    let args: Vec<String> = (0..NARGS.load(Relaxed) as usize).filter_map(|i| fregs.argument(i)).map(|a| (a as i64).to_string()).collect();
    println!("Enter <{}> ip = {ip:#x}: args ({})", name(ip), args.join(", "));
    // The first argument, for the exit (entry data, as the kernel's sample
    // keeps the entry time).
    if data.len() >= 8 {
        data[..8].copy_from_slice(&fregs.argument(0).unwrap_or(0).to_ne_bytes());
    }
    EntryAction::Continue
}

fn sample_exit_handler(_fp: &Fprobe, ip: usize, ret_ip: usize, fregs: &mut FtraceRegs, data: &mut [u8]) {
    let arg0 = u64::from_ne_bytes(data[..8].try_into().expect("8 bytes of entry data")) as i64;
    println!("Return from <{}> ip = {ip:#x} to rip = {ret_ip:#x}: arg0 was {arg0}, retval = {}", name(ip), fregs.return_value() as i64);
}

fn main() {
    let args = Args::parse();
    NARGS.store(args.nargs as u64, Relaxed);
    if let Err(e) = ftrace().refresh() {
        eprintln!("fprobe: {e}");
        std::process::exit(1);
    }
    let names = ftrace().site_dispatch().into_iter().filter_map(|(s, _)| Some((s.addr, (s.symbol?, s.offset_in_symbol)))).collect();
    let _ = NAMES.set(names);
    let mut fp = Fprobe::new().entry_handler(sample_entry_handler);
    if !args.entry_only {
        fp = fp.exit_handler(sample_exit_handler).entry_data_size(8);
    }
    let fp = Arc::new(fp);
    if let Err(e) = fprobe::register_fprobe(&fp, &args.symbol, args.nosym.as_deref()) {
        eprintln!("register_fprobe failed: {e}");
        std::process::exit(1);
    }
    let mut probed: Vec<String> = fp.ips().iter().map(|ip| name(*ip)).collect();
    probed.sort();
    println!("Planted fprobe at {}: {}", args.symbol, probed.join(", "));
    for n in 1..=args.calls {
        // SAFETY: a plain C function of tracee.c.
        let v = unsafe { tracee_work(n) };
        println!("tracee_work({n}) = {v}");
    }
    if let Err(e) = fprobe::unregister_fprobe(&fp) {
        eprintln!("unregister_fprobe failed: {e}");
        std::process::exit(1);
    }
    println!("fprobe at {} unregistered. {} times hit, {} times missed", args.symbol, NHIT.load(Relaxed), fp.nmissed());
}
