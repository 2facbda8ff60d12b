//! The benchmark's harness on a short run: every tracer whose tool is
//! installed is measured on the tracee's known number of calls and wrote a
//! trace of at least an entry and an exit (8 bytes each) per call, or for
//! ftramp's function_graph one LEAF word per leaf call; a
//! missing tool is skipped with its reason, never silently.

use record_bench::{measure, report, Options, Results, Row, Time};
use std::process::Command;

fn installed(prog: &str) -> bool {
    Command::new(prog)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn every_available_tracer_is_measured() {
    let opts = Options {
        iterations: 2000,
        reps: 1,
        ftramp: None,
        keep: false,
        callgrind: false,
    };
    let dir = std::env::temp_dir().join(format!("ftramp-record-bench-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let res = measure(&opts, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    let text = report(&opts, &res);
    assert!(res.baseline().is_some(), "{text}");
    let calls = 5 * opts.iterations + 1;
    let mut expect = vec![];
    if installed("uftrace") {
        expect.push("uftrace record");
    }
    if installed("clang++-14") {
        expect.push("XRay FDR");
    }
    if record_bench::find_ftramp(None).is_ok() {
        expect.extend(["ftramp record (function_graph)", "ftramp record (function)"]);
    }
    for name in expect {
        let r = res
            .row(name)
            .unwrap_or_else(|| panic!("no row for {name}:\n{text}"));
        assert_eq!(r.calls, calls, "{text}");
        // function records entries only (8 bytes); the others entries and
        // exits (8 bytes each), except that ftramp's function_graph writes
        // a call with nothing inside it (parse, leaf_add, leaf_mul) as one
        // LEAF word when its times fit (a preempted one does not): 3 × 8 +
        // 2 × 16 bytes per iteration, plus what few leaves do not fit,
        // headers, symbols and info.
        let iters = opts.iterations;
        let (min, max) = match name {
            "ftramp record (function)" => (8 * (calls - 1), u64::MAX),
            "ftramp record (function_graph)" => (56 * iters, 60 * iters),
            _ => (16 * (calls - 1), u64::MAX),
        };
        assert!(
            (min..=max).contains(&r.bytes),
            "{name} wrote {} bytes for {calls} calls, not {min}..={max}:\n{text}",
            r.bytes
        );
    }
    for tool in ["uftrace", "XRay", "ftramp"] {
        if res.row(tool).is_none() {
            assert!(
                res.skipped
                    .iter()
                    .any(|s| s.contains(tool) || s.contains("xray")),
                "{tool} neither measured nor skipped:\n{text}"
            );
        }
    }
}

#[test]
fn the_report_compares_with_uftrace_and_the_targets() {
    // CPU time twice the wall time: the ratios stay the same.
    let row = |tracer: &str, wall: f64, bytes: u64| Row {
        tracer: tracer.into(),
        build: "x",
        time: Time {
            wall,
            cpu: 2.0 * wall,
        },
        calls: 1000,
        bytes,
        instr: None,
    };
    let res = Results {
        builds: vec![(
            "plain",
            "cc -O2".into(),
            Time {
                wall: 0.001,
                cpu: 0.002,
            },
        )],
        rows: vec![
            row("ftramp record (function_graph)", 0.021, 16_000),
            row("uftrace record", 0.101, 32_000),
        ],
        skipped: vec!["XRay FDR: no `xray` build".into()],
        base_instr: None,
    };
    let opts = Options {
        iterations: 1000,
        reps: 1,
        ftramp: None,
        keep: false,
        callgrind: false,
    };
    let text = report(&opts, &res);
    // ftramp: (21 - 1) ms / 1000 calls = 20000 ns; uftrace 100000 ns: 0.20x.
    assert!(
        text.contains("ns/call <= 0.5x uftrace: 0.20x met (CPU time: 0.20x)"),
        "{text}"
    );
    assert!(text.contains("16.000 met"), "{text}");
    assert!(text.contains("skipped: XRay FDR"), "{text}");
    let slow = Results {
        rows: vec![
            row("ftramp record (function_graph)", 0.081, 24_000),
            row("uftrace record", 0.101, 32_000),
        ],
        ..res
    };
    let text = report(&opts, &slow);
    assert!(text.contains("0.80x NOT met"), "{text}");
    assert!(text.contains("24.000 NOT met"), "{text}");
    assert!(!text.contains("instructions per traced call"), "{text}");
    // With callgrind figures: instructions over the plain build's, against uftrace's.
    let mut counted = slow;
    counted.base_instr = Some(5.0);
    counted.rows[0].instr = Some(305.0);
    counted.rows[1].instr = Some(605.0);
    let text = report(&opts, &counted);
    let line = text
        .lines()
        .find(|l| l.starts_with("ftramp record (function_graph)") && l.contains("305.0"))
        .unwrap_or_else(|| panic!("{text}"));
    assert_eq!(
        line.split_whitespace().skip(3).collect::<Vec<_>>(),
        ["305.0", "300.0", "0.50x"],
        "{text}"
    );
}
