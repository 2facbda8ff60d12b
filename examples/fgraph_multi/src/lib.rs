//! Two fgraph users at once on a small C program (`tracee.c`).
//!
//! * `graph` prints the call graph with durations, like ftrace's
//!   `function_graph` tracer: `func() {` at entry, `}` with the time spent
//!   at return, `func();` for a call that made no traced call.
//! * `count` counts calls per function, and carries each call's argument
//!   from entry to return in data reserved on the shadow stack
//!   (`reserve_data` / `retrieve_data`): the argument register is
//!   clobbered by the time the function returns.  It skips timestamps.
//!
//! ```text
//! cargo run --release -p fgraph-multi -- --n 4
//! cargo run --release -p fgraph-multi -- --n 5 --count-filter 'demo_s*'
//! cargo run --release -p fgraph-multi -- --bench [--callgrind]
//! ```

pub mod bench;

use clap::Parser;
use ftramp_runtime::fgraph::{self, Fgraph, GraphEnt, GraphRet};
use ftramp_runtime::ops::Filter;
use ftramp_runtime::FtraceRegs;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};

extern "C" {
    fn demo_run(n: i64) -> i64;
    fn bench_leaf();
}

#[derive(Parser, Clone)]
#[command(about = "Two fgraph users at once: a call graph with durations and per-function call counts")]
pub struct Args {
    /// The argument of demo_run.
    #[arg(long, default_value_t = 4)]
    n: i64,
    /// The functions the call graph shows (glob).
    #[arg(long, default_value = "demo_*")]
    graph_filter: String,
    /// The functions counted (glob).
    #[arg(long, default_value = "demo_*")]
    count_filter: String,
    /// Run the benchmark instead (fgraph rows and XRay side by side).
    #[arg(long)]
    bench: bool,
    /// With --bench: instructions per call from valgrind's callgrind.
    #[arg(long)]
    callgrind: bool,
    /// Benchmark child: the mode to time (see bench::Mode).
    #[arg(long, hide = true)]
    mode: Option<String>,
    /// Benchmark child: calls to time.
    #[arg(long, hide = true, default_value_t = 1_000_000)]
    calls: u64,
    /// Benchmark child: print only "<ns per call>".
    #[arg(long, hide = true)]
    quiet: bool,
}

/// The traced functions: (patch site, name), sorted by site.
fn names() -> &'static [(usize, String)] {
    static N: OnceLock<Vec<(usize, String)>> = OnceLock::new();
    N.get_or_init(|| {
        let d = ftramp_runtime::sites::discover().expect("site discovery");
        let mut v: Vec<(usize, String)> =
            d.sites().filter_map(|s| s.symbol.as_ref().filter(|n| n.starts_with("demo_")).map(|n| (s.addr, n.clone()))).collect();
        v.sort();
        v
    })
}

fn index_of(func: usize) -> Option<usize> {
    names().binary_search_by_key(&func, |e| e.0).ok()
}

fn name_of(func: usize) -> &'static str {
    index_of(func).map(|i| names()[i].1.as_str()).unwrap_or("?")
}

// ---------------------------------------------------------------------------
// User "graph": records entries and returns; printed after the run.

#[derive(Clone, Copy, Debug)]
pub enum Event {
    Entry { func: usize, depth: usize },
    Ret { func: usize, depth: usize, ns: u64 },
}

static EVENTS: Mutex<Vec<Event>> = Mutex::new(Vec::new());

extern "C" fn graph_entry(e: &GraphEnt, _g: &Fgraph, _f: &mut FtraceRegs) -> bool {
    EVENTS.lock().unwrap().push(Event::Entry { func: e.func, depth: e.depth });
    true
}

extern "C" fn graph_ret(r: &GraphRet, _g: &Fgraph, _f: &mut FtraceRegs) {
    EVENTS.lock().unwrap().push(Event::Ret { func: r.func, depth: r.depth, ns: r.rettime.saturating_sub(r.calltime) });
}

/// The call graph in ftrace's function_graph layout.
pub fn format_graph(events: &[Event]) -> String {
    let mut out = String::from("# DURATION       FUNCTION CALLS\n#     |          |   |   |   |\n");
    let dur = |ns: u64| format!("{:>9.3} us", ns as f64 / 1000.0);
    let mut i = 0;
    while i < events.len() {
        match events[i] {
            Event::Entry { func, depth } => {
                let indent = "  ".repeat(depth + 1);
                if let Some(Event::Ret { func: f, depth: d, ns }) = events.get(i + 1).copied() {
                    if f == func && d == depth {
                        out += &format!("{} |{indent}{}();\n", dur(ns), name_of(func));
                        i += 2;
                        continue;
                    }
                }
                out += &format!("{:>12} |{indent}{}() {{\n", "", name_of(func));
            }
            Event::Ret { func, depth, ns } => {
                out += &format!("{} |{}}} /* {} */\n", dur(ns), "  ".repeat(depth + 1), name_of(func));
            }
        }
        i += 1;
    }
    out
}

// ---------------------------------------------------------------------------
// User "count": per-function counters; the argument travels in reserved
// data from entry to return.

const MAX_FUNCS: usize = 16;

#[derive(Default)]
struct Counts {
    calls: [AtomicU64; MAX_FUNCS],
    arg_sum: [AtomicU64; MAX_FUNCS],
    ret_sum: [AtomicU64; MAX_FUNCS],
    /// Returns whose reserved data was missing or not this call's.
    bad: AtomicU64,
}

static COUNTS: OnceLock<Counts> = OnceLock::new();

fn counts() -> &'static Counts {
    COUNTS.get_or_init(Default::default)
}

/// The data block: the function's index and the argument.
extern "C" fn count_entry(e: &GraphEnt, _g: &Fgraph, f: &mut FtraceRegs) -> bool {
    let (Some(idx), Some(d)) = (index_of(e.func).filter(|i| *i < MAX_FUNCS), e.reserve_data(16)) else {
        counts().bad.fetch_add(1, Relaxed);
        return false;
    };
    d[..8].copy_from_slice(&(idx as u64).to_ne_bytes());
    d[8..].copy_from_slice(&f.argument(0).unwrap_or(0).to_ne_bytes());
    true
}

extern "C" fn count_ret(r: &GraphRet, _g: &Fgraph, f: &mut FtraceRegs) {
    let c = counts();
    let Some(d) = r.retrieve_data().filter(|d| d.len() == 16) else {
        c.bad.fetch_add(1, Relaxed);
        return;
    };
    let idx = u64::from_ne_bytes(d[..8].try_into().unwrap()) as usize;
    let arg = u64::from_ne_bytes(d[8..].try_into().unwrap());
    if index_of(r.func) != Some(idx) {
        c.bad.fetch_add(1, Relaxed);
        return;
    }
    c.calls[idx].fetch_add(1, Relaxed);
    c.arg_sum[idx].fetch_add(arg, Relaxed);
    c.ret_sum[idx].fetch_add(f.return_value(), Relaxed);
}

pub fn format_counts() -> String {
    let c = counts();
    let mut out = format!("{:<20} {:>8} {:>10} {:>10}\n", "# function", "calls", "sum(arg)", "sum(ret)");
    let mut by_name: Vec<(usize, &String)> = names().iter().map(|e| &e.1).enumerate().take(MAX_FUNCS).collect();
    by_name.sort_by_key(|e| e.1);
    for (i, name) in by_name {
        let n = c.calls[i].load(Relaxed);
        if n != 0 {
            out += &format!("{:<20} {:>8} {:>10} {:>10}\n", name, n, c.arg_sum[i].load(Relaxed) as i64, c.ret_sum[i].load(Relaxed) as i64);
        }
    }
    out
}

fn glob(pattern: &str) -> Filter {
    Filter::new().glob(pattern).unwrap_or_else(|e| {
        eprintln!("fgraph_multi: bad filter {pattern:?}: {e}");
        std::process::exit(2)
    })
}

/// The program: the demo, or the benchmark with `--bench`.
pub fn main_entry() {
    let args = Args::parse();
    if args.bench {
        bench::run(args.calls.max(1_000_000), args.callgrind);
        return;
    }
    if let Some(mode) = &args.mode {
        let Some(m) = bench::Mode::parse(mode) else {
            eprintln!("fgraph_multi: unknown mode {mode:?}");
            std::process::exit(2)
        };
        println!("{:.3}", bench::time(m, args.calls));
        return;
    }
    let _ = names();
    EVENTS.lock().unwrap().reserve(4096);
    let graph = Arc::new(Fgraph::new(graph_entry, graph_ret).filter(glob(&args.graph_filter)));
    let count = Arc::new(Fgraph::new(count_entry, count_ret).filter(glob(&args.count_filter)).skip_timestamp(true));
    for u in [&graph, &count] {
        if let Err(e) = fgraph::register_fgraph(u.clone()) {
            eprintln!("fgraph_multi: cannot register an fgraph user: {e}");
            std::process::exit(2);
        }
    }
    // SAFETY: a plain C function.
    let r = unsafe { demo_run(args.n) };
    let depth = fgraph::depth();
    for u in [&graph, &count] {
        let _ = fgraph::unregister_fgraph(u);
    }
    let events = std::mem::take(&mut *EVENTS.lock().unwrap());
    println!("demo_run({}) = {r}", args.n);
    println!();
    println!("# user \"graph\" ({}): call graph", args.graph_filter);
    print!("{}", format_graph(&events));
    println!();
    println!("# user \"count\" ({}): calls, argument carried in reserved data", args.count_filter);
    print!("{}", format_counts());
    let bad = counts().bad.load(Relaxed);
    let (entries, rets) = events.iter().fold((0, 0), |(e, r), ev| match ev {
        Event::Entry { .. } => (e + 1, r),
        Event::Ret { .. } => (e, r + 1),
    });
    println!();
    println!("# shadow stack: depth {depth} after the run, {} misses, {bad} bad data blocks, {entries} entries / {rets} returns", fgraph::misses());
    if depth != 0 || bad != 0 || entries != rets {
        std::process::exit(1);
    }
    // SAFETY: a plain C function.  (So the benchmark's tracee is linked in.)
    unsafe { bench_leaf() };
}
