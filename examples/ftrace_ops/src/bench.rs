//! The ftrace-ops benchmark: the sample's configurations side by side in
//! one run, next to LLVM XRay with a no-op handler on the same tracee.
//!
//! Two measures per row: wall time per call (best of several runs; noisy
//! on shared machines) and, with `--callgrind`, instructions per call from
//! valgrind's callgrind (exact and repeatable): the difference between two
//! runs with different call counts, divided by the difference in calls, so
//! set-up costs cancel out.

use crate::{run_config, Config};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The rows: (name, config).
pub fn rows() -> Vec<(&'static str, Config)> {
    let base = Config { calls: 0, relevant: 1, irrelevant: 0, save_regs: false, recursion: false, count: false, expect: None };
    vec![
        ("untraced", Config { relevant: 0, ..base }),
        ("1 ops", base),
        ("1 relevant + 5 irrelevant", Config { irrelevant: 5, ..base }),
        ("2 relevant ops", Config { relevant: 2, ..base }),
        ("1 ops, save_regs", Config { save_regs: true, ..base }),
        ("1 ops, assist_recursion", Config { recursion: true, ..base }),
    ]
}

fn best_ns(cfg: &Config, calls: u64, reps: usize) -> f64 {
    (0..reps).map(|_| run_config(&Config { calls, ..*cfg }).1).fold(f64::INFINITY, f64::min)
}

/// Instructions in a run of `exe args` under callgrind.
pub fn callgrind_ir(exe: &Path, args: &[String]) -> Option<u64> {
    let out = Command::new("valgrind")
        .args(["--tool=callgrind", "--smc-check=all", "--callgrind-out-file=/dev/null"])
        .arg(exe)
        .args(args)
        .output()
        .ok()?;
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err.lines().find(|l| l.contains("Collected :"))?;
    line.rsplit(':').next()?.trim().replace(',', "").parse().ok()
}

/// Instructions per call: two callgrind runs with different call counts
/// (`args(n)` runs n calls), so set-up costs cancel out.
pub fn per_call_ir(exe: &Path, args: impl Fn(u64) -> Vec<String>) -> Option<f64> {
    let (n1, n2) = (20_000u64, 120_000u64);
    let a = callgrind_ir(exe, &args(n1))?;
    let b = callgrind_ir(exe, &args(n2))?;
    Some((b as f64 - a as f64) / (n2 - n1) as f64)
}

/// The XRay side of the benchmarks (an empty function called in a loop,
/// with a no-op handler at entry and exit), shared by ftrace_ops and
/// fgraph_multi.
pub fn xray_source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("xray").join("xray_bench.cpp")
}

/// Builds an XRay benchmark program from `src` with clang++-14; None (with
/// the reason printed) when clang or its XRay runtime is missing.
pub fn build_xray(src: &Path) -> Option<PathBuf> {
    let stem = src.file_stem().and_then(|s| s.to_str()).unwrap_or("xray");
    let out = std::env::temp_dir().join(format!("ftramp-{stem}-{}", std::process::id()));
    let r = Command::new("clang++-14")
        .args(["-O2", "-fxray-instrument", "-fxray-instruction-threshold=1"])
        .arg(src)
        .arg("-o")
        .arg(&out)
        .output();
    match r {
        Ok(o) if o.status.success() => Some(out),
        Ok(o) => {
            eprintln!("XRay: clang++-14 failed: {}", String::from_utf8_lossy(&o.stderr).lines().next().unwrap_or(""));
            None
        }
        Err(e) => {
            eprintln!("XRay: clang++-14 not available ({e}); install clang-14 and libclang-rt-14-dev");
            None
        }
    }
}

/// ns per call of an XRay benchmark program (`N traced|untraced`).
pub fn xray_ns(exe: &Path, calls: u64, traced: bool) -> Option<f64> {
    let out = Command::new(exe).arg(calls.to_string()).arg(if traced { "traced" } else { "untraced" }).output().ok()?;
    let s = String::from_utf8_lossy(&out.stdout);
    s.split_whitespace().nth(1)?.parse().ok()
}

/// Runs the benchmark and prints the table.
pub fn run(calls: u64, callgrind: bool) {
    let exe = std::env::current_exe().expect("own path");
    let mut table: Vec<(String, f64, Option<f64>)> = Vec::new();
    for (name, cfg) in rows() {
        // Warm up once, then the best of five.
        run_config(&Config { calls: calls / 10, ..cfg });
        let ns = best_ns(&cfg, calls, 5);
        let ir = callgrind.then(|| per_call_ir(&exe, |n| cfg.args(n))).flatten();
        table.push((name.to_string(), ns, ir));
    }
    if let Some(x) = build_xray(&xray_source()) {
        for (name, traced) in [("XRay untraced", false), ("XRay no-op handler (entry+exit)", true)] {
            let ns = (0..5).filter_map(|_| xray_ns(&x, calls, traced)).fold(f64::INFINITY, f64::min);
            let ir = callgrind
                .then(|| per_call_ir(&x, |n| vec![n.to_string(), if traced { "traced".into() } else { "untraced".into() }]))
                .flatten();
            table.push((name.to_string(), ns, ir));
        }
        let _ = std::fs::remove_file(x);
    }
    let one = table.iter().find(|r| r.0 == "1 ops").map(|r| (r.1, r.2)).unwrap_or((f64::NAN, None));
    println!("{:<34} {:>10} {:>10} {:>14} {:>10}", "configuration", "ns/call", "vs 1 ops", "instr/call", "vs 1 ops");
    for (name, ns, ir) in &table {
        let irs = ir.map(|i| format!("{i:.1}")).unwrap_or_else(|| "-".into());
        let irr = match (ir, one.1) {
            (Some(i), Some(o)) => format!("{:.2}x", i / o),
            _ => "-".into(),
        };
        println!("{:<34} {:>10.2} {:>9.2}x {:>14} {:>10}", name, ns, ns / one.0, irs, irr);
    }
    if !callgrind {
        println!("(instructions per call: add --callgrind; needs valgrind)");
    }
}
