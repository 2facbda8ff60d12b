//! replay, report and dump on synthetic traces with hand-computed expectations.

mod common;

use common::*;
use ftramp_trace::dump::{self, FoldOptions};
use ftramp_trace::format;
use ftramp_trace::replay::{self, Globs, ReplayOptions, Select, GRAPH_HEADER};
use ftramp_trace::report::{self, ReportOptions, SortKey};
use ftramp_trace::{EventKind, Trace};
use std::collections::HashMap;

fn replay_text(t: &Trace, o: &ReplayOptions) -> String {
    let mut out = Vec::new();
    replay::replay(t, o, &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

/// The replay without its first line (which names the temp dir).
fn body(text: &str) -> &str {
    text.split_once('\n').unwrap().1
}

fn globs(p: &[&str]) -> Globs {
    Globs::new(&p.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
}

#[test]
fn demo_trace_reads() {
    let dir = tempdir();
    demo_trace(dir.path());
    let t = open(dir.path()).unwrap();
    assert!(t.problems.is_empty(), "{:?}", t.problems);
    assert_eq!(t.info.tracer, "function_graph");
    assert_eq!(t.info.command, ["demo", "x"]);
    assert_eq!(t.info.options.get("depth").map(String::as_str), Some("0"));
    assert_eq!(t.processes.len(), 2);
    let p = &t.processes[0];
    assert_eq!(
        (p.pid, p.image, p.ppid, p.exe.as_str()),
        (100, 0, 1, "/bin/demo")
    );
    assert_eq!(p.exit.as_deref(), Some("code 0"));
    assert_eq!(p.lost, 3);
    assert_eq!(p.symbols.len(), 5);
    assert_eq!(p.func_name(WORKER), "worker");
    assert_eq!(p.func_name(77), "#77");
    assert_eq!(t.processes[1].forked_from, Some((100, 0)));
    let th: Vec<u32> = p.threads.iter().map(|t| t.tid).collect();
    assert_eq!(th, [100, 101]);
    let main = &p.threads[0];
    assert!(main.exited);
    assert_eq!(main.lost, 3);
    assert_eq!(main.events.len(), 12);
    assert_eq!(main.events[0].ns, BASE_NS);
    assert_eq!(main.events[0].kind, EventKind::Entry);
    // After the TIME event: c enters at 10 us, main returns at 2.02 ms.
    assert_eq!(main.events[9].ns, BASE_NS + 10_000);
    assert_eq!(main.events[11].ns, BASE_NS + 2_020_000);
    let worker = &p.threads[1];
    assert_eq!((worker.lost_chunks, worker.exited), (1, false));
    assert_eq!(t.start_ns(), BASE_NS);
}

/// Processes are listed in the order they began, not by pid: a fork child
/// whose pid wrapped below its parent's comes after it, an exec's image
/// after the image it replaced.  `start_ticks` says when; an image without
/// it (an older trace) is placed by its first event, one with neither
/// comes last.
#[test]
fn processes_are_listed_in_the_order_they_began() {
    let dir = tempdir();
    let d = dir.path();
    write_info(d, "function_graph", &["demo"]);
    let start = |ns: u64| format!("start_ticks = {}\n", ticks(ns));
    // (pid, image, start_ticks line, first event at)
    let images: [(u32, u32, String, Option<u64>); 6] = [
        (32000, 0, start(0), Some(10)),
        (300, 0, start(1000), Some(1500)),
        (300, 1, start(2000), None),
        // No start_ticks: its first event places it.
        (20, 0, String::new(), Some(1700)),
        (10, 0, String::new(), None),
        (31000, 0, start(3000), Some(3100)),
    ];
    for (pid, image, tail, first) in &images {
        write_process_info(d, *pid, *image, 1, "/bin/demo", None, tail);
        write_syms(d, *pid, *image, &["main"]);
        let bytes = match first {
            Some(ns) => chunk(*pid, 0, 0, 0, *ns, &[entry(MAIN, 0), exit(MAIN, 5)]),
            None => Vec::new(),
        };
        std::fs::write(dat_path(d, *pid, *image), bytes).unwrap();
    }
    let t = open(d).unwrap();
    let order: Vec<(u32, u32, Option<u64>)> = t.processes.iter().map(|p| (p.pid, p.image, p.start_ns)).collect();
    let at = |ns| Some(BASE_NS + ns);
    assert_eq!(
        order,
        [
            (32000, 0, at(0)),
            (300, 0, at(1000)),
            (20, 0, at(1700)),
            (300, 1, at(2000)),
            (31000, 0, at(3000)),
            (10, 0, None),
        ]
    );
    // The replay follows it.
    let text = replay_text(&t, &ReplayOptions::default());
    let firsts: Vec<usize> = ["32000", "300", "20"].iter().map(|p| text.find(&format!("[{p:>6}]")).unwrap()).collect();
    assert!(firsts.windows(2).all(|w| w[0] < w[1]), "{text}");

    // A bad value is named, and the image is placed by its first event.
    write_process_info(d, 31000, 0, 1, "/bin/demo", None, "start_ticks = \"soon\"\n");
    let t = open(d).unwrap();
    assert!(t.problems.iter().any(|p| p.to_string().contains("bad `start_ticks` value \"soon\"")), "{:?}", t.problems);
    assert_eq!(t.processes.iter().find(|p| p.pid == 31000).unwrap().start_ns, at(3100));
}

#[test]
fn replay_exact() {
    let dir = tempdir();
    demo_trace(dir.path());
    let t = open(dir.path()).unwrap();
    let text = replay_text(&t, &ReplayOptions::default());
    assert_eq!(
        text.lines().next().unwrap(),
        format!(
            "# ftramp replay: {} (function_graph): demo x",
            dir.path().display()
        )
    );
    assert_eq!(body(&text), DEMO_REPLAY);
}

#[test]
fn leaf_events_replay_as_their_entry_and_exit() {
    let (words, leaf_words) = (tempdir(), tempdir());
    let two = demo_trace(words.path());
    let one = demo_trace_as(leaf_words.path(), true);
    // b, c, b and c (thread 100), b and c (101), a (process 102) are leaves
    // with small times: one word each; c's 2 ms exit does not fit (2^16 ticks).
    let dat = |dir: &std::path::Path, pid| std::fs::metadata(dat_path(dir, pid, 0)).unwrap().len();
    assert_eq!(two.len - one.len, 5 * 8);
    assert_eq!(dat(words.path(), 102) - dat(leaf_words.path(), 102), 8);
    let t = open(leaf_words.path()).unwrap();
    assert!(t.problems.is_empty(), "{:?}", t.problems);
    assert_eq!(body(&replay_text(&t, &ReplayOptions::default())), DEMO_REPLAY);
}

#[test]
fn replay_filters() {
    let dir = tempdir();
    demo_trace(dir.path());
    let t = open(dir.path()).unwrap();

    // -F a: only a's subtrees, each at depth 0 (one in process 100, one in 102).
    let o = ReplayOptions {
        filter: globs(&["a"]),
        ..Default::default()
    };
    let text = replay_text(&t, &o);
    let calls: Vec<&str> = text.lines().filter(|l| l.contains(" | ")).collect();
    assert_eq!(
        calls,
        [
            "            [   100] | a() {",
            "   0.500 us [   100] |   b();",
            "   0.200 us [   100] |   c();",
            "   1.000 us [   100] | } /* a */",
            "   0.100 us [   102] | a();",
        ]
    );
    // Threads (and processes) showing nothing are left out.
    assert!(
        !text.contains("[   101]") && text.matches(GRAPH_HEADER).count() == 2,
        "{text}"
    );
    let o = ReplayOptions {
        filter: globs(&["worker"]),
        ..Default::default()
    };
    let text = replay_text(&t, &o);
    assert!(
        !text.contains("process 102") && text.matches(GRAPH_HEADER).count() == 1,
        "{text}"
    );

    // -N 'a' hides a's subtree; --depth 1 makes main a leaf; --tid selects one thread.
    let o = ReplayOptions {
        notrace: globs(&["a"]),
        select: Select {
            tid: Some(100),
            pid: None,
        },
        ..Default::default()
    };
    let text = replay_text(&t, &o);
    assert!(
        !text.contains("a()") && !text.contains("[   101]") && !text.contains("process 102"),
        "{text}"
    );
    assert!(text.contains("   0.500 us [   100] |   b();\n"));
    let o = ReplayOptions {
        depth: Some(1),
        select: Select {
            pid: Some(100),
            tid: None,
        },
        ..Default::default()
    };
    let text = replay_text(&t, &o);
    let calls: Vec<&str> = text.lines().filter(|l| l.contains(" | ")).collect();
    assert_eq!(
        calls,
        [
            "   2.020 ms [   100] | main();",
            "            [   101] | worker(); /* unfinished */"
        ]
    );

    // --min-duration 400ns: c (200 ns), b (300 ns), c (50 ns) and a's short children go.
    let o = ReplayOptions {
        min_ns: Some(400),
        select: Select {
            tid: Some(100),
            pid: None,
        },
        ..Default::default()
    };
    let text = replay_text(&t, &o);
    let calls: Vec<&str> = text.lines().filter(|l| l.contains(" | ")).collect();
    assert_eq!(
        calls,
        [
            "            [   100] | main() {",
            "            [   100] |   a() {",
            "   0.500 us [   100] |     b();",
            "   1.000 us [   100] |   } /* a */",
            "   0.500 us [   100] |   b();",
            "            [   100] |   /* lost 3 events */",
            "   2.000 ms [   100] |   c();",
            "   2.020 ms [   100] | } /* main */",
        ]
    );
}

#[test]
fn replay_function_tracer() {
    let dir = tempdir();
    let d = dir.path();
    write_info(d, "function", &["demo"]);
    write_process_info(d, 7, 0, 1, "/bin/demo", None, "");
    write_syms(d, 7, 0, &["main", "a"]);
    let bytes = chunk(
        7,
        0,
        0,
        2,
        0,
        &[entry(MAIN, 0), entry(A, 1_500), entry(A, 1_000_000_000)],
    );
    std::fs::write(dat_path(d, 7, 0), bytes).unwrap();
    let t = open(d).unwrap();
    assert!(t.problems.is_empty(), "{:?}", t.problems);
    let text = replay_text(&t, &ReplayOptions::default());
    assert_eq!(
        body(&text),
        "\
#
# process 7 image 0: /bin/demo x (exit: not recorded (SIGKILL, or still running); lost 2 events)

# thread 7: lost 2 events
#      TIMESTAMP      TID     FUNCTION
     0.000000000 [     7] | /* lost 2 events */
     0.000000000 [     7] | main
     0.000001500 [     7] | a
     1.000001500 [     7] | a
"
    );
    // The report counts calls only.
    let mut out = Vec::new();
    report::report(&t, &ReportOptions::default(), &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.lines().next().unwrap().ends_with("sorted by calls"),
        "{text}"
    );
    assert!(
        text.contains("           -           -           2           -           -  a\n"),
        "{text}"
    );
}

#[test]
fn report_numbers() {
    let dir = tempdir();
    demo_trace(dir.path());
    let t = open(dir.path()).unwrap();
    let rows: HashMap<String, report::FuncStats> = report::stats(&t, &Select::default())
        .into_iter()
        .map(|s| (s.name.clone(), s))
        .collect();
    let get = |n: &str| {
        let s = &rows[n];
        (
            s.calls,
            s.ended,
            s.total_ns,
            s.self_ns,
            s.avg_ns(),
            s.max_ns,
        )
    };
    // main: 2.02 ms minus a (1000), b (500), c (2_000_000).
    assert_eq!(
        get("main"),
        (1, 1, 2_020_000, 18_500, Some(2_020_000), 2_020_000)
    );
    // a: 1000 ns (self 1000 - 500 - 200) in process 100 and 100 ns in the child.
    assert_eq!(get("a"), (2, 2, 1100, 400, Some(550), 1000));
    assert_eq!(get("b"), (3, 3, 1300, 1300, Some(433), 500));
    assert_eq!(
        get("c"),
        (3, 3, 2_000_250, 2_000_250, Some(666_750), 2_000_000)
    );
    assert_eq!(get("worker"), (1, 0, 0, 0, None, 0));

    let mut out = Vec::new();
    report::report(
        &t,
        &ReportOptions {
            sort: SortKey::Total,
            ..Default::default()
        },
        &mut out,
    )
    .unwrap();
    let text = String::from_utf8(out).unwrap();
    // (The demo trace lost events: the header says so.)
    let lost: u64 = t.processes.iter().map(|p| p.lost).sum();
    assert!(lost > 0);
    assert_eq!(
        text.lines().nth(1),
        Some(format!("# {lost} events lost in these process images: the times of calls around the losses may be wrong").as_str())
    );
    let table: Vec<&str> = text.lines().skip(3).collect();
    assert_eq!(
        table,
        [
            "  Total time   Self time       Calls     Average     Maximum  Function",
            "  ==========  ==========  ==========  ==========  ==========  ====================",
            "    2.020 ms   18.500 us           1    2.020 ms    2.020 ms  main",
            "    2.000 ms    2.000 ms           3  666.750 us    2.000 ms  c",
            "    1.300 us    1.300 us           3    0.433 us    0.500 us  b",
            "    1.100 us    0.400 us           2    0.550 us    1.000 us  a",
            "           -           -           1           -           -  worker",
        ]
    );
    let order = |key: SortKey, pid: Option<u32>| {
        let mut rows = report::stats(&t, &Select { pid, tid: None });
        report::sort(&mut rows, key);
        rows.into_iter().map(|s| s.name).collect::<Vec<_>>()
    };
    assert_eq!(
        order(SortKey::SelfTime, None),
        ["c", "main", "b", "a", "worker"]
    );
    assert_eq!(
        order(SortKey::Calls, None),
        ["b", "c", "a", "main", "worker"]
    );
    assert_eq!(order(SortKey::Avg, None), ["main", "c", "a", "b", "worker"]);
    assert_eq!(order(SortKey::Max, None), ["main", "c", "a", "b", "worker"]);
    assert_eq!(
        order(SortKey::Name, None),
        ["a", "b", "c", "main", "worker"]
    );
    assert_eq!(order(SortKey::Total, Some(102)), ["a"]);
    // -n 2
    let mut out = Vec::new();
    report::report(
        &t,
        &ReportOptions {
            limit: Some(2),
            ..Default::default()
        },
        &mut out,
    )
    .unwrap();
    // Two header lines, the losses' line, the column heads, two rows.
    assert_eq!(String::from_utf8(out).unwrap().lines().count(), 5 + 2);
}

#[test]
fn report_recursion_counts_total_once() {
    let dir = tempdir();
    let d = dir.path();
    write_info(d, "function_graph", &["fib"]);
    write_process_info(d, 5, 0, 1, "/bin/fib", None, "");
    write_syms(d, 5, 0, &["f", "g"]);
    // f [0, 100] { f [10, 80] { f [20, 50] { g [25, 30] } } }
    let ev = [
        entry(0, 0),
        entry(0, 10),
        entry(0, 10),
        entry(1, 5),
        exit(1, 5),
        exit(0, 20),
        exit(0, 30),
        exit(0, 20),
    ];
    std::fs::write(dat_path(d, 5, 0), chunk(5, 0, 0, 0, 0, &ev)).unwrap();
    let t = open(d).unwrap();
    let rows = report::stats(&t, &Select::default());
    let f = rows.iter().find(|s| s.name == "f").unwrap();
    assert_eq!(
        (f.calls, f.total_ns, f.self_ns, f.avg_ns(), f.max_ns),
        (3, 100, 95, Some(66), 100)
    );
    let g = rows.iter().find(|s| s.name == "g").unwrap();
    assert_eq!((g.calls, g.total_ns, g.self_ns), (1, 5, 5));
}

/// C++ overloads (one name without parameters) are rows of their own, named with their
/// parameters, and the total of neither exceeds its caller's (they were one row, whose
/// total counted `load(int)`'s time inside `load(const char*)` twice); static functions of
/// one name in two modules are told apart by module; a function called in two processes is
/// one row.
#[test]
fn report_keeps_overloads_and_namesakes_apart() {
    let dir = tempdir();
    let d = dir.path();
    write_info(d, "function_graph", &["ov"]);
    let syms: [(&str, &str); 5] = [
        ("outer", "/bin/ov"),
        ("_ZN1N4loadEPKc", "/bin/ov"),
        ("_ZN1N4loadEi", "/bin/ov"),
        ("helper", "/lib/liba.so"),
        ("helper", "/lib/libb.so"),
    ];
    for pid in [7, 8] {
        write_process_info(d, pid, 0, 1, "/bin/ov", None, "");
        let mut f = std::fs::File::create(d.join(format::task_file_name(pid, 0, "sym"))).unwrap();
        for (i, (name, module)) in syms.iter().enumerate() {
            let l = format::SymLine { id: i as u32, addr: 0x1000 + 0x10 * i as u64, size: 16, symbol: name.to_string(), module: module.to_string() };
            std::io::Write::write_all(&mut f, format!("{}\n", l.to_line()).as_bytes()).unwrap();
        }
    }
    // outer [0, 100] { load(const char*) [10, 90] { load(int) [20, 80] { helper(a) [30, 40], helper(b) [50, 55] } } }
    let ev = [
        entry(0, 0),
        entry(1, 10),
        entry(2, 10),
        entry(3, 10),
        exit(3, 10),
        entry(4, 10),
        exit(4, 5),
        exit(2, 25),
        exit(1, 10),
        exit(0, 10),
    ];
    std::fs::write(dat_path(d, 7, 0), chunk(7, 0, 0, 0, 0, &ev)).unwrap();
    std::fs::write(dat_path(d, 8, 0), chunk(8, 0, 0, 0, 1000, &ev)).unwrap();
    let t = open(d).unwrap();
    let rows: HashMap<String, (u64, u64)> = report::stats(&t, &Select::default()).into_iter().map(|s| (s.name, (s.calls, s.total_ns))).collect();
    let want: HashMap<String, (u64, u64)> = [
        ("outer", (2, 200)),
        ("N::load(char const*)", (2, 160)),
        ("N::load(int)", (2, 120)),
        ("helper [liba.so]", (2, 20)),
        ("helper [libb.so]", (2, 10)),
    ]
    .into_iter()
    .map(|(n, v)| (n.to_string(), v))
    .collect();
    assert_eq!(rows, want);
    // A name shared by nothing keeps its short form.
    assert_eq!(ftramp_trace::read::demangle_with_params("_ZN1N4loadEi").as_deref(), Some("N::load(int)"));
    assert_eq!(ftramp_trace::read::demangle("_ZN1N4loadEi").as_deref(), Some("N::load"));
}

/// Rows that would read the same are told apart: the copies of one Rust function that
/// several crates instantiated by that crate (v0) or hash (legacy), namesakes of two
/// modules with one file name by a number; a name shared by nothing stays as it is.
/// (Until the twenty-eighth session ripgrep's report had 7 rows reading
/// `<alloc::raw_vec::RawVecInner>::finish_grow [rg]`.)
#[test]
fn report_tells_apart_copies_of_one_function() {
    let dir = tempdir();
    let d = dir.path();
    write_info(d, "function_graph", &["rg"]);
    let grow = "_RNvMs4_NtCsbEht8wFNRx7_5alloc7raw_vecNtB5_11RawVecInner11finish_grow";
    let syms = [
        ("main".to_string(), "/bin/rg"),
        (format!("{grow}CslyTRVWRdONb_8textwrap.llvm.15439000132138301033"), "/bin/rg"),
        (format!("{grow}Cs1Y9xKjMFv6z_10grep_regex.llvm.10828198360505401726"), "/bin/rg"),
        (format!("{grow}Cs1qoVIptFhZX_13grep_searcher"), "/bin/rg"),
        ("_ZN5smini3geo4show17h34d2c47dbe0c315dE".to_string(), "/bin/rg"),
        ("_ZN5smini3geo4show17h0123456789abcdefE".to_string(), "/bin/rg"),
        ("helper".to_string(), "/a/libx.so"),
        ("helper".to_string(), "/b/libx.so"),
    ];
    write_process_info(d, 7, 0, 1, "/bin/rg", None, "");
    let mut f = std::fs::File::create(d.join(format::task_file_name(7, 0, "sym"))).unwrap();
    for (i, (name, module)) in syms.iter().enumerate() {
        let l = format::SymLine { id: i as u32, addr: 0x1000 + 0x10 * i as u64, size: 16, symbol: name.clone(), module: module.to_string() };
        std::io::Write::write_all(&mut f, format!("{}\n", l.to_line()).as_bytes()).unwrap();
    }
    let ev: Vec<_> = (0..syms.len() as u32).flat_map(|i| [entry(i, 1), exit(i, 1)]).collect();
    std::fs::write(dat_path(d, 7, 0), chunk(7, 0, 0, 0, 0, &ev)).unwrap();
    let t = open(d).unwrap();
    let mut names: Vec<String> = report::stats(&t, &Select::default()).into_iter().map(|s| s.name).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "<alloc::raw_vec::RawVecInner>::finish_grow [rg] (crate grep_regex)",
            "<alloc::raw_vec::RawVecInner>::finish_grow [rg] (crate grep_searcher)",
            "<alloc::raw_vec::RawVecInner>::finish_grow [rg] (crate textwrap)",
            "helper [libx.so] #1",
            "helper [libx.so] #2",
            "main",
            "smini::geo::show [rg] (h0123456789abcdef)",
            "smini::geo::show [rg] (h34d2c47dbe0c315d)",
        ]
    );
}

#[test]
fn folded_exact() {
    let dir = tempdir();
    demo_trace(dir.path());
    let t = open(dir.path()).unwrap();
    let lines = dump::folded(&t, &FoldOptions::default());
    assert_eq!(
        lines,
        [
            "demo [100];tid 100;main 18500",
            "demo [100];tid 100;main;a 300",
            "demo [100];tid 100;main;a;b 500",
            "demo [100];tid 100;main;a;c 200",
            "demo [100];tid 100;main;b 500",
            "demo [100];tid 100;main;c 2000000",
            // worker is unfinished: it counts until the thread's last event (5050).
            "demo [100];tid 101;worker 3200",
            "demo [100];tid 101;worker;b 300",
            "demo [100];tid 101;worker;c 50",
            "demo [102];tid 102;a 100",
        ]
    );
    let merged = dump::folded(
        &t,
        &FoldOptions {
            merged: true,
            ..Default::default()
        },
    );
    assert_eq!(
        merged,
        [
            "a 100",
            "main 18500",
            "main;a 300",
            "main;a;b 500",
            "main;a;c 200",
            "main;b 500",
            "main;c 2000000",
            "worker 3200",
            "worker;b 300",
            "worker;c 50"
        ]
    );
}

#[test]
fn folded_caps_deep_recursion() {
    let dir = tempdir();
    let d = dir.path();
    write_info(d, "function_graph", &["deep"]);
    write_process_info(d, 5, 0, 1, "/bin/deep", None, "");
    write_syms(d, 5, 0, &["r"]);
    let n = dump::MAX_FOLDED_DEPTH + 50;
    let mut ev = vec![entry(0, 1); n];
    ev.extend(vec![exit(0, 1); n]);
    std::fs::write(dat_path(d, 5, 0), chunk(5, 0, 0, 0, 0, &ev)).unwrap();
    let t = open(d).unwrap();
    let lines = dump::folded(
        &t,
        &FoldOptions {
            merged: true,
            ..Default::default()
        },
    );
    // Each call has 2 ns of self time (1 before its child enters, 1 after it returns); the
    // innermost has 1.
    assert_eq!(lines.len(), dump::MAX_FOLDED_DEPTH + 1);
    let deepest = lines.iter().find(|l| l.contains("[deeper]")).unwrap();
    assert_eq!(deepest.split(';').count(), dump::MAX_FOLDED_DEPTH + 1);
    assert!(deepest.ends_with(&format!(" {}", 2 * 50 - 1)), "{deepest}");
    let total: u64 = lines
        .iter()
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(total, 2 * n as u64 - 1);
}

#[test]
fn chrome_json_is_valid_and_balanced() {
    let dir = tempdir();
    demo_trace(dir.path());
    let t = open(dir.path()).unwrap();
    let mut out = Vec::new();
    dump::chrome(&t, &Select::default(), &mut out).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out).expect("well-formed JSON");
    assert_eq!(v["displayTimeUnit"], "ns");
    let events = v["traceEvents"].as_array().unwrap();
    let meta: Vec<String> = events
        .iter()
        .filter(|e| e["ph"] == "M")
        .map(|e| {
            format!(
                "{} {} {} {}",
                e["name"], e["pid"], e["tid"], e["args"]["name"]
            )
        })
        .collect();
    assert_eq!(
        meta,
        [
            "\"process_name\" 100 100 \"demo\"",
            "\"process_name\" 102 102 \"demo\"",
            "\"thread_name\" 100 100 \"demo (main)\"",
            "\"thread_name\" 100 101 \"thread 101\"",
            "\"thread_name\" 102 102 \"demo (main)\"",
        ]
    );
    // B/E balance per thread, time never going back.  An E carries no name:
    // it closes the thread's innermost B, whose name it is noted with here.
    let mut stacks: HashMap<(u64, u64), (Vec<String>, f64)> = HashMap::new();
    let (mut begins, mut lost) = (0, 0);
    let mut ends: Vec<(String, &serde_json::Value)> = Vec::new();
    for e in events.iter().filter(|e| e["ph"] != "M") {
        let key = (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap());
        let ts = e["ts"].as_f64().unwrap();
        let (stack, last) = stacks.entry(key).or_default();
        assert!(ts >= *last, "{e}");
        *last = ts;
        match e["ph"].as_str().unwrap() {
            "B" => {
                begins += 1;
                stack.push(e["name"].as_str().unwrap().to_string())
            }
            "E" => {
                assert!(e.get("name").is_none() && e.get("cat").is_none(), "{e}");
                ends.push((stack.pop().expect("an open B"), e));
            }
            "i" => {
                assert_eq!(e["cat"], "lost");
                lost += 1
            }
            ph => panic!("unexpected phase {ph}"),
        }
    }
    assert!(stacks.values().all(|(s, _)| s.is_empty()));
    assert_eq!((begins, lost), (10, 2));
    // Times in µs since the start: main's end is 2020 µs, worker ends unfinished at 5.05 µs.
    let end_main = ends.iter().find(|(n, _)| n == "main").unwrap().1;
    assert_eq!(end_main["ts"].as_f64(), Some(2020.0));
    let end_worker = ends.iter().find(|(n, _)| n == "worker").unwrap().1;
    assert_eq!(end_worker["ts"].as_f64(), Some(5.05));
    assert_eq!(end_worker["args"]["unfinished"], true);
}

#[test]
fn names_needing_escapes_stay_valid() {
    let dir = tempdir();
    let d = dir.path();
    write_info(d, "function_graph", &["we\"ird"]);
    write_process_info(d, 5, 0, 1, "/bin/a\"b\\c", None, "");
    write_syms(d, 5, 0, &["q\"uote\\s;semi"]);
    std::fs::write(
        dat_path(d, 5, 0),
        chunk(5, 0, 0, 0, 0, &[entry(0, 0), exit(0, 7)]),
    )
    .unwrap();
    let t = open(d).unwrap();
    let mut out = Vec::new();
    dump::chrome(&t, &Select::default(), &mut out).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out).expect("well-formed JSON");
    assert!(v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["name"] == "q\"uote\\s;semi"));
    assert_eq!(
        dump::folded(
            &t,
            &FoldOptions {
                merged: true,
                ..Default::default()
            }
        ),
        ["q\"uote\\s:semi 7"]
    );
}

/// 2M calls on 4 threads (32 MB of events): everything is read and counted. Prints the
/// time each stage takes (run: cargo test --release -p ftramp-trace --test analyze -- --ignored --nocapture).
/// Ignored by default because it is a timing run, not a check the other tests lack: the
/// same reading paths are exercised, on smaller traces, by every other test in this file.
#[test]
#[ignore = "a timing run (32 MB of events) for the README's reading speeds; its counts are also checked, but it takes seconds"]
fn large_trace() {
    let dir = tempdir();
    let d = dir.path();
    write_info(d, "function_graph", &["big"]);
    write_process_info(d, 9, 0, 1, "/bin/big", None, "");
    let names: Vec<String> = (0..100).map(|i| format!("f{i}")).collect();
    write_syms(
        d,
        9,
        0,
        &names.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let mut bytes = Vec::new();
    let per_thread = 500_000u32;
    for tid in 9..13 {
        let mut ev = Vec::new();
        let mut seq = 0;
        for i in 0..per_thread {
            // A call tree 3 deep: f(i%10) { f(10 + i%90) }.
            ev.extend([
                entry(i % 10, 5),
                entry(10 + i % 90, 5),
                exit(10 + i % 90, 20),
                exit(i % 10, 5),
            ]);
            if ev.len() >= 65_536 || i + 1 == per_thread {
                bytes.extend(chunk(tid, seq, 0, 0, 0, &ev));
                seq += 1;
                ev.clear();
            }
        }
    }
    std::fs::write(dat_path(d, 9, 0), &bytes).unwrap();
    let t0 = std::time::Instant::now();
    let t = open(d).unwrap();
    let open = t0.elapsed();
    assert!(t.problems.is_empty(), "{:?}", t.problems);
    let calls = 4 * 2 * per_thread as u64;
    let t1 = std::time::Instant::now();
    let mut out = std::io::sink();
    replay::replay(&t, &ReplayOptions::default(), &mut out).unwrap();
    let replay_t = t1.elapsed();
    let t2 = std::time::Instant::now();
    let rows = report::stats(&t, &Select::default());
    let report_t = t2.elapsed();
    assert_eq!(rows.iter().map(|s| s.calls).sum::<u64>(), calls);
    let t3 = std::time::Instant::now();
    dump::chrome(&t, &Select::default(), &mut out).unwrap();
    let chrome_t = t3.elapsed();
    let t4 = std::time::Instant::now();
    let folded = dump::folded(&t, &FoldOptions::default());
    let folded_t = t4.elapsed();
    // Per thread: 10 roots and 90 distinct (i % 10, 10 + i % 90) pairs.
    assert_eq!(folded.len(), 4 * (10 + 90));
    let per = |d: std::time::Duration| d.as_nanos() as f64 / calls as f64;
    println!(
        "{calls} calls, {} MB: open {:.0} ns/call, replay {:.0}, report {:.0}, chrome {:.0}, folded {:.0}",
        bytes.len() >> 20,
        per(open),
        per(replay_t),
        per(report_t),
        per(chrome_t),
        per(folded_t)
    );
}

#[test]
fn names_are_demangled_and_globs_match_either_form() {
    let dir = tempdir();
    let d = dir.path();
    write_info(d, "function_graph", &["cpp"]);
    write_process_info(d, 5, 0, 1, "/bin/cpp", None, "");
    write_syms(
        d,
        5,
        0,
        &[
            "main",
            "_ZN2ns3Foo3barEi",
            "_ZN4core3fmt5write17h0123456789abcdefE",
        ],
    );
    let ev = [
        entry(0, 0),
        entry(1, 1),
        exit(1, 2),
        entry(2, 3),
        exit(2, 4),
        exit(0, 5),
    ];
    std::fs::write(dat_path(d, 5, 0), chunk(5, 0, 0, 0, 0, &ev)).unwrap();
    let t = open(d).unwrap();
    assert_eq!(t.processes[0].symbols[1].name, "_ZN2ns3Foo3barEi");
    let calls = |o: &ReplayOptions| -> Vec<String> {
        replay_text(&t, o)
            .lines()
            .filter(|l| l.contains(" | "))
            .map(|l| l[23..].to_string())
            .collect()
    };
    assert_eq!(
        calls(&ReplayOptions::default()),
        [
            "main() {",
            "  ns::Foo::bar();",
            "  core::fmt::write();",
            "} /* main */"
        ]
    );
    for g in ["ns::*", "_ZN2ns*"] {
        let o = ReplayOptions {
            filter: globs(&[g]),
            ..Default::default()
        };
        assert_eq!(calls(&o), ["ns::Foo::bar();"], "{g}");
    }
    let o = ReplayOptions {
        notrace: globs(&["core::*"]),
        ..Default::default()
    };
    assert_eq!(calls(&o), ["main() {", "  ns::Foo::bar();", "} /* main */"]);
    let rows = report::stats(&t, &Select::default());
    assert!(rows.iter().any(|s| s.name == "ns::Foo::bar"));
}

#[test]
fn exec_images_share_their_pid() {
    let dir = tempdir();
    let d = dir.path();
    write_info(d, "function_graph", &["sh", "-c", "true"]);
    write_process_info(d, 7, 0, 1, "/bin/sh", None, "exit = \"exec\"\n");
    write_process_info(d, 7, 1, 1, "/bin/true", None, "exit = \"code 0\"\n");
    write_syms(d, 7, 0, &["main", "do_exec"]);
    write_syms(d, 7, 1, &["main"]);
    // The first image's main and do_exec never return: exec replaced them.
    std::fs::write(
        dat_path(d, 7, 0),
        chunk(7, 0, format::FLAG_FLUSH, 0, 0, &[entry(0, 0), entry(1, 10)]),
    )
    .unwrap();
    std::fs::write(
        dat_path(d, 7, 1),
        chunk(7, 0, format::FLAG_LAST, 0, 100, &[entry(0, 0), exit(0, 50)]),
    )
    .unwrap();
    let t = open(d).unwrap();
    assert!(t.problems.is_empty(), "{:?}", t.problems);
    let text = replay_text(&t, &ReplayOptions::default());
    assert_eq!(
        body(&text),
        "\
#
# process 7 image 0: /bin/sh x (exit: exec)

# DURATION     TID     FUNCTION
            [     7] | main() {
            [     7] |   do_exec(); /* unfinished */
            [     7] | } /* main: unfinished */
#
# process 7 image 1: /bin/true x (exit: code 0)

# DURATION     TID     FUNCTION
   0.050 us [     7] | main();
"
    );
    let mut out = Vec::new();
    dump::chrome(&t, &Select::default(), &mut out).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let events = v["traceEvents"].as_array().unwrap();
    let meta: Vec<String> = events
        .iter()
        .filter(|e| e["ph"] == "M")
        .map(|e| format!("{} {}", e["name"], e["args"]["name"]))
        .collect();
    assert_eq!(
        meta,
        [
            "\"process_name\" \"sh -> true\"",
            "\"thread_name\" \"sh (main)\""
        ]
    );
    let phases: String = events
        .iter()
        .filter(|e| e["ph"] != "M")
        .map(|e| e["ph"].as_str().unwrap())
        .collect();
    assert_eq!(phases, "BBEEBE");
}

/// A streamed trace holds no file open between passes: a trace of more process images
/// than a process may have open files is read whole, and reading it leaves the count of
/// open files as it was.
#[test]
fn a_streamed_trace_of_many_processes_holds_no_files_open() {
    let dir = tempdir();
    write_info(dir.path(), "function_graph", &["sh"]);
    let n = 300u32;
    for pid in 1000..1000 + n {
        write_process_info(dir.path(), pid, 0, 1, "/bin/sh", None, "");
        write_syms(dir.path(), pid, 0, &["main"]);
        let c = chunk(pid, 0, format::FLAG_LAST, 0, 0, &[entry(0, 10), exit(0, 20)]);
        std::fs::write(dat_path(dir.path(), pid, 0), c).unwrap();
    }
    let fds = || std::fs::read_dir("/proc/self/fd").unwrap().count();
    let before = fds();
    let t = Trace::open_streaming(dir.path()).unwrap();
    let held = fds().saturating_sub(before);
    assert!(t.problems.is_empty(), "{:?}", t.problems);
    // (Other tests run alongside and open files: a margin well under n.)
    assert!(held < 50, "{held} more files open after opening {n} images");
    let mut out = Vec::new();
    report::report(&t, &Default::default(), &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    let main = text.lines().find(|l| l.ends_with("  main")).unwrap_or_else(|| panic!("{text}"));
    assert_eq!(main.split_whitespace().nth(4), Some(n.to_string().as_str()), "{n} calls of main: {text}");
}

/// Images whose `.sym` files are the same share one symbol table (a fork
/// child writes its parent's again: a trace of a shell with 200 subshells
/// took 72 MB and 0.58 s for `report`, now 9 MB and 0.03 s); a damaged file
/// is still parsed, and named, for each image that has it.
#[test]
fn images_with_the_same_symbols_share_one_table() {
    let dir = tempdir();
    demo_trace(dir.path());
    let sym = |pid: u32| dir.path().join(ftramp_trace::format::task_file_name(pid, 0, "sym"));
    std::fs::copy(sym(100), sym(102)).unwrap();
    let t = Trace::open(dir.path()).unwrap();
    let (a, b) = (&t.processes[0], &t.processes[1]);
    assert!(std::sync::Arc::ptr_eq(&a.symbols, &b.symbols), "one table for both");
    assert_eq!(a.symbols.len(), 5);
    assert_eq!(a.func_name(1), b.func_name(1));
    // The same damaged file in both: a problem named for each.
    let text = std::fs::read_to_string(sym(100)).unwrap();
    for pid in [100, 102] {
        std::fs::write(sym(pid), format!("{text}garbage line\n")).unwrap();
    }
    let t = Trace::open(dir.path()).unwrap();
    for pid in [100, 102] {
        assert!(t.problems.iter().any(|p| p.to_string().contains(&sym(pid).display().to_string())), "{pid}: {:?}", t.problems);
    }
    assert!(!std::sync::Arc::ptr_eq(&t.processes[0].symbols, &t.processes[1].symbols));
}

/// Calls still open when their image ended (`exit()` called inside them, a fatal signal,
/// `exec`: the `.info`'s `end_ticks`) end then, in replay, report and dump, on the threads
/// still running at the end; a thread that exited inside a call (its LAST chunk) leaves it
/// unfinished, with no time.
#[test]
fn calls_open_when_the_image_ended_end_with_it() {
    let dir = tempdir();
    let d = dir.path();
    write_info(d, "function_graph", &["demo"]);
    let tail = format!("exit = \"code 0\"\nend_ticks = {}\n", ticks(5000));
    write_process_info(d, 9, 0, 1, "/bin/demo", None, &tail);
    write_syms(d, 9, 0, &["main", "work", "finish", "worker"]);
    // main calls work, then finish, which calls exit(); thread 10 exits inside worker.
    let mut dat = chunk(9, 0, format::FLAG_FLUSH, 0, 0, &[entry(0, 0), entry(1, 100), exit(1, 200), entry(2, 100)]);
    dat.extend(chunk(10, 0, format::FLAG_LAST, 0, 0, &[entry(3, 50)]));
    std::fs::write(dat_path(d, 9, 0), dat).unwrap();
    let t = open(d).unwrap();
    assert!(t.problems.is_empty(), "{:?}", t.problems);
    let p = &t.processes[0];
    assert_eq!(p.end_ns, Some(BASE_NS + 5000));
    let text = replay_text(&t, &ReplayOptions::default());
    for l in [
        "            [     9] | main() {",
        "   0.200 us [     9] |   work();",
        "   4.600 us [     9] |   finish(); /* running at exit */",
        "   5.000 us [     9] | } /* main: running at exit */",
        "            [    10] | worker(); /* unfinished */",
    ] {
        assert!(text.lines().any(|x| x == l), "{l:?} in\n{text}");
    }
    let rows = report::stats(&t, &Select::default());
    let row = |n: &str| rows.iter().find(|s| s.name == n).unwrap().clone();
    assert_eq!((row("main").calls, row("main").ended, row("main").total_ns, row("main").self_ns), (1, 1, 5000, 200));
    assert_eq!((row("finish").ended, row("finish").max_ns), (1, 4600));
    assert_eq!((row("worker").calls, row("worker").ended, row("worker").avg_ns()), (1, 0, None));
    let mut out = Vec::new();
    dump::chrome(&t, &Select::default(), &mut out).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let ends: Vec<String> = v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "E")
        .map(|e| format!("{} {} {}", e["tid"], e["ts"], e["args"]))
        .collect();
    assert_eq!(ends, ["9 0.3 null", "9 5.0 {\"at_exit\":true}", "9 5.0 {\"at_exit\":true}", "10 0.05 {\"unfinished\":true}"]);
}

/// Threads whose last chunks the recorder could not write (a full disk), named in the
/// `.info`'s `unwritten`, end their streams with that loss, and the calls they left open
/// are unfinished, not running at exit (until the twenty-seventh session replay said
/// `main` ran to the end, its return lost with the chunks); a thread none of whose chunks
/// was written shows its loss alone; other threads are as before.  An image whose `.info`
/// is empty says so instead of blaming SIGKILL.  Read whole and streamed.
#[test]
fn threads_whose_last_chunks_were_not_written_end_with_the_loss() {
    let dir = tempdir();
    let d = dir.path();
    write_info(d, "function_graph", &["demo"]);
    let tail = format!("lost = 14\nend_ticks = {}\nunwritten = [[9, 2, 10], [11, 1, 4]]\nexit = \"code 0\"\n", ticks(5000));
    write_process_info(d, 9, 0, 1, "/bin/demo", None, &tail);
    write_syms(d, 9, 0, &["main", "work", "worker"]);
    let mut dat = chunk(9, 0, 0, 0, 0, &[entry(0, 0), entry(1, 100), exit(1, 200), entry(1, 100)]);
    dat.extend(chunk(10, 0, 0, 0, 0, &[entry(2, 50)]));
    std::fs::write(dat_path(d, 9, 0), dat).unwrap();
    std::fs::write(d.join(format::task_file_name(12, 0, "info")), "").unwrap();
    for streamed in [false, true] {
        let t = if streamed { Trace::open_streaming(d).unwrap() } else { open(d).unwrap() };
        let p = t.processes.iter().find(|p| p.pid == 9).unwrap();
        assert_eq!(p.unwritten, [(9, 2, 10), (11, 1, 4)]);
        let lost: Vec<(u32, u64)> = p.threads.iter().map(|t| (t.tid, t.lost)).collect();
        assert_eq!(lost, [(9, 10), (10, 0), (11, 4)], "every event lost is in a thread's stream");
        let text = replay_text(&t, &ReplayOptions::default());
        for l in [
            "   0.200 us [     9] |   work();",
            "            [     9] |   work() {",
            "            [     9] |     /* lost 10 events */",
            "            [     9] |   } /* work: unfinished */",
            "            [     9] | } /* main: unfinished */",
            "   4.950 us [    10] | worker(); /* running at exit */",
            "            [    11] | /* lost 4 events */",
            "# process 12 image 0: ? (exit: not recorded (its .info is empty: the trace could not be written, a full disk, or it was killed as it started))",
        ] {
            assert!(text.lines().any(|x| x == l), "streamed {streamed}: {l:?} in\n{text}");
        }
        assert!(!text.contains("main: running at exit"), "{text}");
    }
}

/// `report` says when the selected images lost events: the calls around a loss show the
/// times of what is left (a memcached helper's run with 4.5 M events lost showed a 1.4 s
/// maximum with no hint).
#[test]
fn report_says_when_events_were_lost() {
    let dir = tempdir();
    let d = dir.path();
    write_info(d, "function_graph", &["demo"]);
    write_process_info(d, 5, 0, 1, "/bin/demo", None, "lost = 12\nexit = \"code 0\"\n");
    write_process_info(d, 6, 0, 1, "/bin/demo", None, "lost = 0\nexit = \"code 0\"\n");
    for pid in [5, 6] {
        write_syms(d, pid, 0, &["main"]);
        std::fs::write(dat_path(d, pid, 0), chunk(pid, 0, format::FLAG_LAST, 0, 0, &[entry(0, 0), exit(0, 10)])).unwrap();
    }
    let t = open(d).unwrap();
    let text = |pid: Option<u32>| {
        let mut out = Vec::new();
        let o = ReportOptions { select: Select { pid, tid: None }, ..Default::default() };
        report::report(&t, &o, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    };
    let said = "# 12 events lost in these process images: the times of calls around the losses may be wrong";
    assert!(text(None).lines().any(|l| l == said), "{}", text(None));
    assert!(text(Some(5)).contains(said));
    assert!(!text(Some(6)).contains("events lost"), "{}", text(Some(6)));
}
