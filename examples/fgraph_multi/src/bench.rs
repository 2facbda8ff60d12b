//! The fgraph benchmark: entry only, entry+exit with and without
//! timestamps, two users, fprobe entry only and entry+exit, entry+exit on
//! a three-deep call tree (every traced call returns into a traced caller,
//! which is where a return predictor left out of step costs), and LLVM
//! XRay's no-op handler (entry and exit) on the same empty function, side
//! by side in one run.
//!
//! Two measures per row: wall time per call (best of [`ROUNDS`] rounds
//! that each time every row once, interleaved; noisy on shared machines)
//! and, with `--callgrind`, instructions per call from valgrind's
//! callgrind (exact and repeatable): the difference between two runs with
//! different call counts, divided by the difference in calls, so set-up
//! costs cancel out.

use ftramp_runtime::fgraph::{self, Fgraph, GraphEnt, GraphRet};
use ftramp_runtime::fprobe::{self, EntryAction, Fprobe};
use ftramp_runtime::ops::Filter;
use ftramp_runtime::FtraceRegs;
use ftrace_ops::bench::{build_xray, per_call_ir, xray_ns, xray_source};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

/// What a row times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Untraced,
    /// One user whose entry returns false (skip_timestamp).
    EntryOnly,
    /// One user, entry returns true, no-op ret, timestamps taken.
    EntryExit,
    /// The same with skip_timestamp.
    EntryExitSkip,
    /// Two such users (skip_timestamp): the loop over users.
    TwoUsersSkip,
    /// An fprobe with a no-op entry handler, no exit handler.
    FprobeEntry,
    /// An fprobe with no-op entry and exit handlers.
    FprobeEntryExit,
    /// `EntryExitSkip` on a three-deep call tree (`bench_tree`): every
    /// traced call returns into a traced caller; per traced call.
    TreeEntryExitSkip,
}

impl Mode {
    pub const ALL: [(Mode, &'static str, &'static str); 8] = [
        (Mode::Untraced, "untraced", "untraced"),
        (Mode::EntryOnly, "entry-only", "fgraph entry only"),
        (Mode::EntryExit, "entry-exit", "fgraph entry+exit, timestamps"),
        (Mode::EntryExitSkip, "entry-exit-skip", "fgraph entry+exit, skip_timestamp"),
        (Mode::TwoUsersSkip, "two-users", "2 users entry+exit, skip_timestamp"),
        (Mode::FprobeEntry, "fprobe-entry", "fprobe entry only"),
        (Mode::FprobeEntryExit, "fprobe-entry-exit", "fprobe entry+exit"),
        (Mode::TreeEntryExitSkip, "tree-entry-exit-skip", "fgraph entry+exit, skip, 3-deep tree"),
    ];

    pub fn parse(s: &str) -> Option<Mode> {
        Mode::ALL.iter().find(|m| m.1 == s).map(|m| m.0)
    }
}

extern "C" {
    fn bench_leaf();
    fn bench_tree();
}

extern "C" fn entry_false(_e: &GraphEnt, _g: &Fgraph, _f: &mut FtraceRegs) -> bool {
    false
}

extern "C" fn entry_true(_e: &GraphEnt, _g: &Fgraph, _f: &mut FtraceRegs) -> bool {
    true
}

extern "C" fn ret_nop(_r: &GraphRet, _g: &Fgraph, _f: &mut FtraceRegs) {}

/// Entries and returns seen in the tree mode (checked after its run: every
/// call of the tree traced).  Plain load and store: one thread.
static TREE_CALLS: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

extern "C" fn entry_true_counted(_e: &GraphEnt, _g: &Fgraph, _f: &mut FtraceRegs) -> bool {
    TREE_CALLS[0].store(TREE_CALLS[0].load(Relaxed) + 1, Relaxed);
    true
}

extern "C" fn ret_counted(_r: &GraphRet, _g: &Fgraph, _f: &mut FtraceRegs) {
    TREE_CALLS[1].store(TREE_CALLS[1].load(Relaxed) + 1, Relaxed);
}

fn fp_entry_nop(_fp: &Fprobe, _ip: usize, _ret_ip: usize, _f: &mut FtraceRegs, _d: &mut [u8]) -> EntryAction {
    EntryAction::Continue
}

fn fp_exit_nop(_fp: &Fprobe, _ip: usize, _ret_ip: usize, _f: &mut FtraceRegs, _d: &mut [u8]) {}

/// Registers the mode's users, calls `bench_leaf` `calls` times (the tree
/// mode: `bench_tree` a third as often, three traced calls each),
/// unregisters; ns per traced call.
pub fn time(mode: Mode, calls: u64) -> f64 {
    let tree = mode == Mode::TreeEntryExitSkip;
    let f = || if tree { Filter::new().symbol("bench_tree").symbol("bench_tree_mid").symbol("bench_tree_leaf") } else { Filter::new().symbol("bench_leaf") };
    let user = |entry, skip| Arc::new(Fgraph::new(entry, ret_nop).filter(f()).skip_timestamp(skip));
    let probe = match mode {
        Mode::FprobeEntry => Some(Fprobe::new().entry_handler(fp_entry_nop)),
        Mode::FprobeEntryExit => Some(Fprobe::new().entry_handler(fp_entry_nop).exit_handler(fp_exit_nop)),
        _ => None,
    }
    .map(Arc::new);
    if let Some(fp) = &probe {
        if let Err(e) = fprobe::register_fprobe_syms(fp, &["bench_leaf"]) {
            eprintln!("fgraph_multi: cannot register an fprobe: {e}");
            std::process::exit(2);
        }
    }
    let users = match mode {
        Mode::Untraced | Mode::FprobeEntry | Mode::FprobeEntryExit => vec![],
        Mode::EntryOnly => vec![user(entry_false, true)],
        Mode::EntryExit => vec![user(entry_true, false)],
        Mode::EntryExitSkip => vec![user(entry_true, true)],
        Mode::TreeEntryExitSkip => vec![Arc::new(Fgraph::new(entry_true_counted, ret_counted).filter(f()).skip_timestamp(true))],
        Mode::TwoUsersSkip => vec![user(entry_true, true), user(entry_true, true)],
    };
    for u in &users {
        if let Err(e) = fgraph::register_fgraph(u.clone()) {
            eprintln!("fgraph_multi: cannot register an fgraph user: {e}");
            std::process::exit(2);
        }
    }
    TREE_CALLS.iter().for_each(|c| c.store(0, Relaxed));
    let start = Instant::now();
    if tree {
        for _ in 0..calls / 3 {
            // SAFETY: a plain C function without arguments.
            unsafe { bench_tree() };
        }
    } else {
        for _ in 0..calls {
            // SAFETY: a plain C function without arguments.
            unsafe { bench_leaf() };
        }
    }
    let ns = start.elapsed().as_nanos() as f64;
    for u in &users {
        let _ = fgraph::unregister_fgraph(u);
    }
    if let Some(fp) = &probe {
        let _ = fprobe::unregister_fprobe(fp);
    }
    let traced = if tree { calls / 3 * 3 } else { calls };
    let seen = TREE_CALLS.each_ref().map(|c| c.load(Relaxed));
    if tree && seen != [traced; 2] {
        eprintln!("fgraph_multi: the call tree made {traced} calls, {} entries and {} returns were traced", seen[0], seen[1]);
        std::process::exit(1);
    }
    ns / traced.max(1) as f64
}

struct Row {
    name: String,
    ns: f64,
    ir: Option<f64>,
}

fn ratio(t: &[Row], a: &str, b: &str) -> (f64, Option<f64>) {
    let get = |n: &str| t.iter().find(|r| r.name == n);
    match (get(a), get(b)) {
        (Some(a), Some(b)) => (a.ns / b.ns, a.ir.zip(b.ir).map(|(x, y)| x / y)),
        _ => (f64::NAN, None),
    }
}

/// Timing rounds: every row is timed once per round, rows interleaved,
/// and each row keeps its fastest round.
pub const ROUNDS: usize = 7;

/// Runs the benchmark and prints the table and the ratios.
///
/// The rows are timed in interleaved rounds (each round times every row
/// once, XRay's included) rather than one row's runs back to back: on a
/// shared machine the speed drifts over seconds, and a ratio of two rows
/// timed minutes apart measures the drift as much as the tracers.
pub fn run(calls: u64, callgrind: bool) {
    let exe = std::env::current_exe().expect("own path");
    let xray = build_xray(&xray_source());
    let xray_rows = [("XRay untraced", false), ("XRay no-op handler (entry+exit)", true)];
    for (mode, _, _) in Mode::ALL {
        time(mode, calls / 10); // warm up
    }
    let mut best = vec![f64::INFINITY; Mode::ALL.len() + xray_rows.len()];
    for _ in 0..ROUNDS {
        for (i, (mode, _, _)) in Mode::ALL.iter().enumerate() {
            best[i] = best[i].min(time(*mode, calls));
        }
        if let Some(x) = &xray {
            for (j, (_, traced)) in xray_rows.iter().enumerate() {
                if let Some(ns) = xray_ns(x, calls, *traced) {
                    best[Mode::ALL.len() + j] = best[Mode::ALL.len() + j].min(ns);
                }
            }
        }
    }
    let mut table = Vec::new();
    for (i, (_, arg, name)) in Mode::ALL.iter().enumerate() {
        let ir = callgrind
            .then(|| per_call_ir(&exe, |n| vec!["--quiet".into(), "--mode".into(), arg.to_string(), "--calls".into(), n.to_string()]))
            .flatten();
        table.push(Row { name: name.to_string(), ns: best[i], ir });
    }
    if let Some(x) = xray {
        for (j, (name, traced)) in xray_rows.into_iter().enumerate() {
            let ir = callgrind
                .then(|| per_call_ir(&x, |n| vec![n.to_string(), if traced { "traced".into() } else { "untraced".into() }]))
                .flatten();
            table.push(Row { name: name.to_string(), ns: best[Mode::ALL.len() + j], ir });
        }
        let _ = std::fs::remove_file(x);
    }
    let base = table.iter().find(|r| r.name == "fgraph entry only").map(|r| (r.ns, r.ir)).unwrap_or((f64::NAN, None));
    println!("{:<36} {:>9} {:>11} {:>11} {:>11}", "configuration", "ns/call", "vs entry", "instr/call", "vs entry");
    for r in &table {
        let irs = r.ir.map(|i| format!("{i:.1}")).unwrap_or_else(|| "-".into());
        let irr = match (r.ir, base.1) {
            (Some(i), Some(o)) => format!("{:.2}x", i / o),
            _ => "-".into(),
        };
        println!("{:<36} {:>9.2} {:>10.2}x {:>11} {:>11}", r.name, r.ns, r.ns / base.0, irs, irr);
    }
    println!();
    let show = |what: &str, (ns, ir): (f64, Option<f64>), target: &str| {
        let ir = ir.map(|i| format!("{i:.2}x")).unwrap_or_else(|| "-".into());
        println!("{what:<52} {ns:>6.2}x ns {ir:>7} instr   target {target}");
    };
    println!("ratios (issue 5 targets):");
    show("entry+exit (skip_timestamp) / entry only", ratio(&table, "fgraph entry+exit, skip_timestamp", "fgraph entry only"), "<= 1.8x");
    show("entry+exit (timestamps) / entry only", ratio(&table, "fgraph entry+exit, timestamps", "fgraph entry only"), "<= 1.8x");
    show("fprobe entry+exit / fprobe entry only", ratio(&table, "fprobe entry+exit", "fprobe entry only"), "<= 1.8x");
    let (ns, ir) = ratio(&table, "fgraph entry+exit, skip_timestamp", "fgraph entry+exit, timestamps");
    let gain = |x: f64| format!("{:.0} %", (1.0 - x) * 100.0);
    println!(
        "{:<52} {:>7} ns {:>7} instr   target >= 10 %",
        "skip_timestamp gain (1 - skip / timestamps)",
        gain(ns),
        ir.map(gain).unwrap_or_else(|| "-".into())
    );
    show("fgraph entry+exit (skip_timestamp) / XRay no-op", ratio(&table, "fgraph entry+exit, skip_timestamp", "XRay no-op handler (entry+exit)"), "<= 1.0x");
    show("fgraph entry+exit (timestamps) / XRay no-op", ratio(&table, "fgraph entry+exit, timestamps", "XRay no-op handler (entry+exit)"), "<= 1.0x");
    if !callgrind {
        println!("(instructions per call: add --callgrind; needs valgrind)");
    }
}
