//! The record benchmark (issue 6): `ftramp record` against `uftrace record`
//! and LLVM XRay's FDR mode, side by side in one run, on one C tracee
//! (`tracee.c`: a loop calling a 5-call function tree).
//!
//! The tracee is built at run time into a scratch directory, once per
//! tracer: plain (`cc -O2`, the baseline), with patch sites (`ftramp
//! cflags`), with `-pg` (uftrace) and with `clang++-14 -fxray-instrument`
//! (XRay). Per tracer:
//!
//! * **ns/call** = (wall time of the whole traced run − wall time of the
//!   plain build's run) / traced calls — start-up, patching, writing the
//!   trace and the tracer's exit all count;
//! * **bytes/call** = size of everything the tracer wrote / traced calls.
//!
//! Each run is repeated and the fastest kept (the machine may be shared),
//! in interleaved rounds: each round runs every build and every tracer
//! once, so that the tracers compared see the same spells of contention.
//! A tracer whose tool is missing is skipped with the reason.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// What the benchmark runs.
#[derive(Clone, Debug)]
pub struct Options {
    /// Loop iterations of the tracee (5 calls each).
    pub iterations: u64,
    /// Rounds (each runs every build and tracer once); the fastest run of each is kept.
    pub reps: usize,
    /// The `ftramp` binary; None: next to this program, else on `PATH`.
    pub ftramp: Option<PathBuf>,
    /// Keep the scratch directory (builds and traces) and print its path.
    pub keep: bool,
    /// Also count instructions per traced call under valgrind's callgrind.
    pub callgrind: bool,
}

/// Iterations of the two callgrind runs whose difference gives the
/// instructions per call (start-up and exit costs cancel out).
pub const CALLGRIND_ITERATIONS: (u64, u64) = (20_000, 120_000);

/// The targets for `ftramp record` (function_graph).
pub const TARGET_VS_UFTRACE: f64 = 0.5;
pub const TARGET_BYTES_PER_CALL: f64 = 16.0;
/// What the bytes target allows on top of the records: chunk headers (32
/// bytes per up-to-128-KiB chunk, 0.02 %), the symbol table and the info
/// files.
pub const METADATA_ALLOWANCE: f64 = 0.001;

/// The C compiler for the gcc builds: `$CC`, else `cc`.
fn cc() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".into())
}

/// One build of the tracee.
#[derive(Clone, Debug)]
pub struct Build {
    pub name: &'static str,
    pub how: String,
    pub exe: PathBuf,
}

/// Runs `cmd`; Err with its stderr when it cannot start or fails.
fn run_ok(cmd: &mut Command) -> Result<std::process::Output, String> {
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {:?}: {e}", cmd.get_program()))?;
    if out.status.success() {
        Ok(out)
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(6).collect();
        Err(format!(
            "{:?} failed ({}): {}",
            cmd.get_program(),
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        ))
    }
}

/// Compiles `tracee.c` with `flags` into `dir/name` (compile and link are
/// separate so `-pg` objects link without gcrt1's profiler start-up).
fn build_gcc(dir: &Path, name: &'static str, flags: &[&str]) -> Result<Build, String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tracee.c");
    let obj = dir.join(format!("{name}.o"));
    let exe = dir.join(name);
    run_ok(
        Command::new(cc())
            .arg("-O2")
            .args(flags)
            .arg("-c")
            .arg(&src)
            .arg("-o")
            .arg(&obj),
    )?;
    run_ok(Command::new(cc()).arg(&obj).arg("-o").arg(&exe))?;
    Ok(Build {
        name,
        how: format!("{} -O2 {}", cc(), flags.join(" "))
            .trim_end()
            .to_string(),
        exe,
    })
}

/// The XRay build: `tracee.c` as C++ with `BENCH_XRAY` (FDR start and
/// flush), through the ftrace-ops benchmark's `build_xray` (clang++-14).
fn build_xray(dir: &Path) -> Result<Build, String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tracee.c");
    let wrapper = dir.join("xray_tracee.cpp");
    std::fs::write(
        &wrapper,
        format!("#define BENCH_XRAY 1\n#include \"{}\"\n", src.display()),
    )
    .map_err(|e| format!("writing {}: {e}", wrapper.display()))?;
    let built = ftrace_ops::bench::build_xray(&wrapper)
        .ok_or("clang++-14 with XRay is not available (install clang-14 and libclang-rt-14-dev)")?;
    let exe = dir.join("xray");
    std::fs::rename(&built, &exe).map_err(|e| format!("moving {}: {e}", built.display()))?;
    Ok(Build {
        name: "xray",
        how: "clang++-14 -O2 -fxray-instrument -fxray-instruction-threshold=1".into(),
        exe,
    })
}

/// Bytes of every file under `path`.
pub fn disk_bytes(path: &Path) -> u64 {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::read_dir(path)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| disk_bytes(&e.path()))
            .sum(),
        Ok(m) => m.len(),
        Err(_) => 0,
    }
}

/// The `calls N` the tracee prints.
fn calls_printed(stdout: &[u8]) -> Option<u64> {
    String::from_utf8_lossy(stdout).lines().find_map(|l| {
        l.strip_prefix("calls ")?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    })
}

/// Seconds of a run: wall clock, and CPU (user + system time of every
/// thread of the run and of the processes it waited for — the tracer's
/// writer threads and helper processes included).  CPU time is the steadier
/// figure when other work shares the machine.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Time {
    pub wall: f64,
    pub cpu: f64,
}

/// User + system seconds of this process's waited-for children so far
/// (`cutime` + `cstime` of `/proc/self/stat`, in clock ticks).
fn children_cpu() -> f64 {
    static TICK: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    let hz = *TICK.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    });
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the `(comm)`: state is field 3, cutime 16, cstime 17.
    let rest: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, r)| r.split_whitespace().collect())
        .unwrap_or_default();
    let field = |n: usize| {
        rest.get(n - 3)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (field(16) + field(17)) / hz
}

/// One measured command of the benchmark: an untraced build or a tracer.
struct Job<'a> {
    /// Called before each run, not timed (a fresh output directory).
    before: Box<dyn Fn() + 'a>,
    make: Box<dyn Fn() -> Command + 'a>,
    /// The fastest run so far (wall and CPU minima taken separately).
    best: Time,
    /// The last run's output, or why a run failed (the job is then dropped).
    last: Result<Option<std::process::Output>, String>,
}

impl<'a> Job<'a> {
    fn new(before: impl Fn() + 'a, make: impl Fn() -> Command + 'a) -> Self {
        Job {
            before: Box::new(before),
            make: Box::new(make),
            best: Time {
                wall: f64::INFINITY,
                cpu: f64::INFINITY,
            },
            last: Ok(None),
        }
    }

    /// The fastest run and the last run's output.
    fn result(self) -> Result<(Time, std::process::Output), String> {
        match self.last {
            Ok(Some(out)) => Ok((self.best, out)),
            Ok(None) => Err("never ran".into()),
            Err(e) => Err(e),
        }
    }
}

/// Runs every job `reps` times in interleaved rounds (each round runs each
/// job once), keeping each job's fastest run.  Interleaved because the
/// machine's speed drifts over seconds when it is shared: runs of two
/// tracers taken minutes apart would compare the drift as much as the
/// tracers, while in rounds both see the same spells of contention.
fn run_rounds(reps: usize, jobs: &mut [Job]) {
    for _ in 0..reps.max(1) {
        for job in jobs.iter_mut().filter(|j| j.last.is_ok()) {
            (job.before)();
            let mut cmd = (job.make)();
            let cpu = children_cpu();
            let t = Instant::now();
            match run_ok(&mut cmd) {
                Ok(out) => {
                    job.best.wall = job.best.wall.min(t.elapsed().as_secs_f64());
                    job.best.cpu = job.best.cpu.min(children_cpu() - cpu);
                    job.last = Ok(Some(out));
                }
                Err(e) => job.last = Err(e),
            }
        }
    }
}

/// A tracer's measured row.
#[derive(Clone, Debug)]
pub struct Row {
    pub tracer: String,
    pub build: &'static str,
    /// The fastest traced run.
    pub time: Time,
    pub calls: u64,
    pub bytes: u64,
    /// Instructions per traced call (`--callgrind`), every process and
    /// thread of the run counted.
    pub instr: Option<f64>,
}

impl Row {
    /// Wall-clock ns per call over the baseline's run.
    pub fn ns_per_call(&self, base: Time) -> f64 {
        (self.time.wall - base.wall) * 1e9 / self.calls as f64
    }

    /// CPU ns per call over the baseline's run.
    pub fn cpu_ns_per_call(&self, base: Time) -> f64 {
        (self.time.cpu - base.cpu) * 1e9 / self.calls as f64
    }

    pub fn bytes_per_call(&self) -> f64 {
        self.bytes as f64 / self.calls as f64
    }
}

/// The command of one traced run: `(executable, output directory)`.
type MakeCommand = Box<dyn Fn(&Path, &Path) -> Command>;

/// How a tracer records the tracee: its row name, which build it runs and
/// the command for one run writing into `out` (a fresh directory).
struct Tracer {
    name: String,
    build: &'static str,
    /// Create the output directory before the run (XRay writes a file into
    /// it; uftrace and ftramp create theirs).
    mkdir: bool,
    command: MakeCommand,
}

/// Where the `ftramp` binary is: `--ftramp`, else next to this program
/// (cargo's target/<profile>/), else `ftramp` on `PATH`.
pub fn find_ftramp(explicit: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(p) = explicit {
        return if p.is_file() {
            Ok(p.to_path_buf())
        } else {
            Err(format!("--ftramp {}: no such file", p.display()))
        };
    }
    let me = std::env::current_exe().map_err(|e| format!("own path: {e}"))?;
    for dir in me.ancestors().skip(1).take(2) {
        let p = dir.join("ftramp");
        if p.is_file() {
            return Ok(p);
        }
    }
    match Command::new("ftramp").arg("--version").output() {
        Ok(o) if o.status.success() => Ok(PathBuf::from("ftramp")),
        _ => Err("the ftramp binary was not found next to this program nor on PATH; build it first: cargo build --release -p ftramp".into()),
    }
}

fn tracers(iterations: u64, ftramp: Option<&Path>) -> Vec<Tracer> {
    let n = iterations.to_string();
    let mut v = Vec::new();
    if let Some(f) = ftramp {
        for tracer in ["function_graph", "function"] {
            let (f, n) = (f.to_path_buf(), n.clone());
            v.push(Tracer {
                name: format!("ftramp record ({tracer})"),
                build: "sites",
                mkdir: false,
                command: Box::new(move |exe, out| {
                    let mut c = Command::new(&f);
                    c.args(["record", "--tracer", tracer, "-o"])
                        .arg(out)
                        .arg("--")
                        .arg(exe)
                        .arg(&n);
                    c
                }),
            });
        }
    }
    let n2 = n.clone();
    v.push(Tracer {
        name: "uftrace record".into(),
        build: "pg",
        mkdir: false,
        command: Box::new(move |exe, out| {
            // --no-libcall: only the tracee's own functions, as ftramp and XRay record.
            let mut c = Command::new("uftrace");
            c.args(["record", "--no-libcall", "-d"])
                .arg(out)
                .arg(exe)
                .arg(&n2);
            c
        }),
    });
    // FDR records ~16 bytes per call plus per-buffer metadata; enough 1 MiB
    // buffers that nothing is dropped.
    let buffers = iterations * 5 * 20 / (1 << 20) + 16;
    v.push(Tracer {
        name: "XRay FDR".into(),
        build: "xray",
        mkdir: true,
        command: Box::new(move |exe, out| {
            let mut c = Command::new(exe);
            c.arg(&n).arg("xray");
            c.env("XRAY_OPTIONS", format!("patch_premain=true xray_mode=xray-fdr verbosity=0 xray_logfile_base={}/xray-log.", out.display()));
            // Threshold 0: record every call (the default, 5 us, drops short calls).
            c.env("XRAY_FDR_OPTIONS", format!("func_duration_threshold_us=0 grace_period_ms=0 buffer_size=1048576 buffer_max={buffers}"));
            c
        }),
    });
    v
}

/// Everything one benchmark run measured.
#[derive(Clone, Debug, Default)]
pub struct Results {
    /// (build name, how it was built, fastest untraced run).
    pub builds: Vec<(&'static str, String, Time)>,
    pub rows: Vec<Row>,
    /// Tracers or builds not measured, with the reason.
    pub skipped: Vec<String>,
    /// Instructions per call of the plain build (`--callgrind`).
    pub base_instr: Option<f64>,
}

impl Results {
    pub fn baseline(&self) -> Option<Time> {
        self.builds.iter().find(|b| b.0 == "plain").map(|b| b.2)
    }

    pub fn row(&self, prefix: &str) -> Option<&Row> {
        self.rows.iter().find(|r| r.tracer.starts_with(prefix))
    }
}

/// Instructions of a run of `cmd` under callgrind, summed over every
/// process (`--trace-children=yes`: uftrace's recorder process, the
/// traced program and `ftramp record` itself).
fn callgrind_total(cmd: &Command) -> Result<u64, String> {
    let mut v = Command::new("valgrind");
    v.args([
        "--tool=callgrind",
        "--trace-children=yes",
        "--smc-check=all",
        "--callgrind-out-file=/dev/null",
    ]);
    v.arg(cmd.get_program()).args(cmd.get_args());
    for (k, val) in cmd.get_envs() {
        match val {
            Some(val) => v.env(k, val),
            None => v.env_remove(k),
        };
    }
    let out = run_ok(&mut v)?;
    let err = String::from_utf8_lossy(&out.stderr);
    let counts: Vec<u64> = err
        .lines()
        .filter_map(|l| {
            l.split_once("Collected :")?
                .1
                .trim()
                .replace(',', "")
                .parse()
                .ok()
        })
        .collect();
    if counts.is_empty() {
        return Err("callgrind reported no instruction count".into());
    }
    Ok(counts.iter().sum())
}

/// Instructions per call of `make(iterations, out)`: two runs, their
/// difference divided by the difference in calls (5 per iteration).
fn callgrind_per_call(dir: &Path, make: impl Fn(u64, &Path) -> Command) -> Result<f64, String> {
    let (n1, n2) = CALLGRIND_ITERATIONS;
    let mut total = [0u64; 2];
    for (i, n) in [n1, n2].into_iter().enumerate() {
        let out = dir.join(format!("callgrind-{i}"));
        let _ = std::fs::remove_dir_all(&out);
        std::fs::create_dir_all(&out).map_err(|e| format!("creating {}: {e}", out.display()))?;
        // Tracers that create their own output directory get a path inside.
        total[i] = callgrind_total(&make(n, &out.join("trace")))?;
        let _ = std::fs::remove_dir_all(&out);
    }
    Ok((total[1] as f64 - total[0] as f64) / (5 * (n2 - n1)) as f64)
}

/// Adds instructions per call to every row (and the plain build's to
/// `res.base_instr`), or says why not.
fn measure_callgrind(dir: &Path, builds: &[Build], ftramp: Option<&Path>, res: &mut Results) {
    if Command::new("valgrind").arg("--version").output().is_err() {
        res.skipped.push(
            "instructions per call: valgrind is not installed (Debian: apt-get install valgrind)"
                .into(),
        );
        return;
    }
    if let Some(plain) = builds.iter().find(|b| b.name == "plain") {
        match callgrind_per_call(dir, |n, _| {
            let mut c = Command::new(&plain.exe);
            c.arg(n.to_string());
            c
        }) {
            Ok(i) => res.base_instr = Some(i),
            Err(e) => res
                .skipped
                .push(format!("instructions of the plain build: {e}")),
        }
    }
    let (n1, n2) = CALLGRIND_ITERATIONS;
    let (t1, t2) = (tracers(n1, ftramp), tracers(n2, ftramp));
    for row in &mut res.rows {
        let (Some(a), Some(b)) = (
            t1.iter().find(|t| t.name == row.tracer),
            t2.iter().find(|t| t.name == row.tracer),
        ) else {
            continue;
        };
        let Some(build) = builds.iter().find(|b| b.name == row.build) else {
            continue;
        };
        let make = |n: u64, out: &Path| {
            let t = if n == n1 { a } else { b };
            if t.mkdir {
                let _ = std::fs::create_dir_all(out);
            }
            (t.command)(&build.exe, out)
        };
        match callgrind_per_call(dir, make) {
            Ok(i) => row.instr = Some(i),
            Err(e) => res
                .skipped
                .push(format!("instructions of {}: {e}", row.tracer)),
        }
    }
}

/// Builds the tracee variants into `dir` and measures every tracer.
pub fn measure(opts: &Options, dir: &Path) -> Results {
    let mut res = Results::default();
    let site_flags: Vec<&str> = env!("FTRAMP_BENCH_SITE_FLAGS").split_whitespace().collect();
    let mut builds: Vec<Build> = Vec::new();
    let attempts: [(&str, Result<Build, String>); 4] = [
        ("plain", build_gcc(dir, "plain", &[])),
        ("sites", build_gcc(dir, "sites", &site_flags)),
        ("pg", build_gcc(dir, "pg", &["-pg"])),
        ("xray", build_xray(dir)),
    ];
    for (name, b) in attempts {
        match b {
            Ok(b) => builds.push(b),
            Err(e) => res.skipped.push(format!("build `{name}`: {e}")),
        }
    }
    let n = opts.iterations.to_string();
    let ftramp = match find_ftramp(opts.ftramp.as_deref()) {
        Ok(p) => Some(p),
        Err(e) => {
            res.skipped.push(format!("ftramp record: {e}"));
            None
        }
    };
    if Command::new("uftrace").arg("--version").output().is_err() {
        res.skipped.push(
            "uftrace record: uftrace is not installed (Debian: apt-get install uftrace)".into(),
        );
    }
    // The tracers that can run: (tracer, its build, its output directory).
    let all = tracers(opts.iterations, ftramp.as_deref());
    let mut runnable: Vec<(&Tracer, &Build, PathBuf)> = Vec::new();
    for t in &all {
        let Some(b) = builds.iter().find(|b| b.name == t.build) else {
            if !res
                .skipped
                .iter()
                .any(|s| s.contains(&format!("`{}`", t.build)))
            {
                res.skipped
                    .push(format!("{}: no `{}` build", t.name, t.build));
            }
            continue;
        };
        if t.name.starts_with("uftrace") && res.skipped.iter().any(|s| s.starts_with("uftrace")) {
            continue;
        }
        let out = dir.join(format!(
            "trace-{}",
            t.name.replace(|c: char| !c.is_ascii_alphanumeric(), "-")
        ));
        runnable.push((t, b, out));
    }
    // Every untraced build and every tracer, run in interleaved rounds.
    let mut jobs: Vec<Job> = builds
        .iter()
        .map(|b| {
            let n = &n;
            Job::new(
                || {},
                move || {
                    let mut c = Command::new(&b.exe);
                    c.arg(n);
                    c
                },
            )
        })
        .collect();
    for (t, b, out) in &runnable {
        jobs.push(Job::new(
            move || {
                let _ = std::fs::remove_dir_all(out);
                if t.mkdir {
                    let _ = std::fs::create_dir_all(out);
                }
            },
            move || (t.command)(&b.exe, out),
        ));
    }
    run_rounds(opts.reps, &mut jobs);
    let mut jobs = jobs.into_iter();
    for (b, job) in builds.iter().zip(jobs.by_ref()) {
        match job.result() {
            Ok((time, _)) => res.builds.push((b.name, b.how.clone(), time)),
            Err(e) => res
                .skipped
                .push(format!("build `{}` does not run: {e}", b.name)),
        }
    }
    for ((t, b, out), job) in runnable.iter().zip(jobs) {
        match job.result() {
            Ok((time, output)) => match calls_printed(&output.stdout) {
                Some(calls) => res.rows.push(Row {
                    tracer: t.name.clone(),
                    build: b.name,
                    time,
                    calls,
                    bytes: disk_bytes(out),
                    instr: None,
                }),
                None => res
                    .skipped
                    .push(format!("{}: the tracee printed no call count", t.name)),
            },
            Err(e) => res.skipped.push(format!("{}: {e}", t.name)),
        }
        if !opts.keep {
            let _ = std::fs::remove_dir_all(out);
        }
    }
    if opts.callgrind {
        measure_callgrind(dir, &builds, ftramp.as_deref(), &mut res);
    }
    res
}

/// The report: builds with their untraced times, tracers with ns (wall
/// and CPU) and bytes per call and their ratio to uftrace, then the
/// targets.
pub fn report(opts: &Options, res: &Results) -> String {
    let mut s = String::new();
    let calls = opts.iterations * 5 + 1;
    let _ = writeln!(
        s,
        "record benchmark: {calls} traced calls per run ({} iterations of a 5-call tree), fastest of {} interleaved rounds",
        opts.iterations, opts.reps
    );
    let _ = writeln!(
        s,
        "\n{:<8} {:>12} {:>8}  compiled with",
        "build", "untraced ms", "cpu ms"
    );
    for (name, how, t) in &res.builds {
        let _ = writeln!(
            s,
            "{name:<8} {:>12.1} {:>8.1}  {how}",
            t.wall * 1e3,
            t.cpu * 1e3
        );
    }
    let Some(base) = res.baseline() else {
        let _ = writeln!(s, "\nno plain build to measure against");
        return s;
    };
    let uf = res.row("uftrace");
    let ratio = |a: f64, b: f64| format!("{:.2}x", a / b);
    let _ = writeln!(
        s,
        "\n{:<30} {:>9} {:>8} {:>8} {:>10} {:>8} {:>8} {:>8}",
        "tracer", "traced ms", "ns/call", "cpu ns", "bytes/call", "ns vs", "cpu vs", "B vs"
    );
    let _ = writeln!(
        s,
        "{:<30} {:>9} {:>8} {:>8} {:>10} {:>8} {:>8} {:>8}",
        "", "", "", "", "", "uftrace", "uftrace", "uftrace"
    );
    for r in &res.rows {
        let (rn, rc, rb) = match uf {
            Some(u) => (
                ratio(r.ns_per_call(base), u.ns_per_call(base)),
                ratio(r.cpu_ns_per_call(base), u.cpu_ns_per_call(base)),
                ratio(r.bytes_per_call(), u.bytes_per_call()),
            ),
            None => ("-".into(), "-".into(), "-".into()),
        };
        let _ = writeln!(
            s,
            "{:<30} {:>9.1} {:>8.1} {:>8.1} {:>10.3} {:>8} {:>8} {:>8}",
            r.tracer,
            r.time.wall * 1e3,
            r.ns_per_call(base),
            r.cpu_ns_per_call(base),
            r.bytes_per_call(),
            rn,
            rc,
            rb
        );
    }
    if res.rows.iter().any(|r| r.instr.is_some()) {
        let base_i = res.base_instr.unwrap_or(0.0);
        let (n1, n2) = CALLGRIND_ITERATIONS;
        let _ = writeln!(
            s,
            "\ninstructions per traced call (callgrind, every process of the run; {n1} vs {n2} iterations; plain build {base_i:.1})"
        );
        let _ = writeln!(
            s,
            "{:<30} {:>10} {:>10} {:>10}",
            "tracer", "instr/call", "over plain", "vs uftrace"
        );
        let uf_i = uf.and_then(|u| u.instr).map(|i| i - base_i);
        for r in res.rows.iter().filter(|r| r.instr.is_some()) {
            let over = r.instr.unwrap_or(0.0) - base_i;
            let vs = uf_i.map(|u| ratio(over, u)).unwrap_or_else(|| "-".into());
            let _ = writeln!(
                s,
                "{:<30} {:>10.1} {:>10.1} {:>10}",
                r.tracer,
                r.instr.unwrap_or(0.0),
                over,
                vs
            );
        }
    }
    for why in &res.skipped {
        let _ = writeln!(s, "skipped: {why}");
    }
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    let _ = writeln!(s, "\ntargets for ftramp record (function_graph):");
    let fg = res.row("ftramp record (function_graph)");
    match (fg, uf) {
        (Some(f), Some(u)) => {
            let wall = f.ns_per_call(base) / u.ns_per_call(base);
            let cpu = f.cpu_ns_per_call(base) / u.cpu_ns_per_call(base);
            let _ = writeln!(
                s,
                "  ns/call <= {TARGET_VS_UFTRACE}x uftrace: {wall:.2}x {} (CPU time: {cpu:.2}x)",
                verdict(wall <= TARGET_VS_UFTRACE)
            );
        }
        _ => {
            let _ = writeln!(s, "  ns/call <= {TARGET_VS_UFTRACE}x uftrace: not measured");
        }
    }
    match fg {
        Some(f) => {
            // The target is about the records; each chunk's 32-byte header,
            // the symbol table and the info files come on top.
            let b = f.bytes_per_call();
            let _ = writeln!(
                s,
                "  bytes/call <= {TARGET_BYTES_PER_CALL} (+ {:.1} % for chunk headers and metadata): {b:.3} {}",
                METADATA_ALLOWANCE * 100.0,
                verdict(b <= TARGET_BYTES_PER_CALL * (1.0 + METADATA_ALLOWANCE))
            );
        }
        None => {
            let _ = writeln!(s, "  bytes/call <= {TARGET_BYTES_PER_CALL}: not measured");
        }
    }
    s
}

/// Runs the whole benchmark in a scratch directory and prints the report.
pub fn run(opts: &Options) -> Results {
    let dir = std::env::temp_dir().join(format!("ftramp-record-bench-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let res = measure(opts, &dir);
    print!("{}", report(opts, &res));
    if opts.keep {
        println!("builds and traces kept in {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    res
}
