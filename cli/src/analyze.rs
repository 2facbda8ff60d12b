//! `ftramp replay`, `ftramp report` and `ftramp dump`: reading a trace directory.

use anyhow::{bail, Context, Result};
use ftramp_trace::dump::{self, FoldOptions};
use ftramp_trace::format::parse_duration_ns;
use ftramp_trace::replay::{self, Globs, ReplayOptions, Select};
use ftramp_trace::report::{self, ReportOptions, SortKey};
use ftramp_trace::Trace;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

/// The trace to read and which of its threads.
#[derive(clap::Args)]
pub struct Source {
    /// Trace directory.
    #[arg(
        short = 'd',
        long = "dir",
        value_name = "DIR",
        default_value = "ftramp.data"
    )]
    dir: PathBuf,
    /// Trace directory, named without -d (`ftramp replay my.data`).
    #[arg(value_name = "TRACE_DIR", conflicts_with = "dir")]
    trace_dir: Option<PathBuf>,
    /// Only this process (pid).
    #[arg(long, value_name = "N")]
    pid: Option<u32>,
    /// Only this thread (tid).
    #[arg(long, value_name = "N")]
    tid: Option<u32>,
}

impl Source {
    /// The trace directory: the positional one, else -d (or its default).
    fn dir(&self) -> &Path {
        self.trace_dir.as_deref().unwrap_or(&self.dir)
    }

    fn select(&self) -> Select {
        Select {
            pid: self.pid,
            tid: self.tid,
        }
    }

    /// Opens the trace; its problems go to stderr as warnings. Fails when nothing is
    /// readable, or when --pid/--tid select nothing.
    fn open(&self) -> Result<Trace> {
        let dir = self.dir();
        let t = Trace::open_streaming(dir).with_context(|| {
            let hint = if dir == Path::new("ftramp.data") && !dir.exists() {
                " (record one with `ftramp record -- PROG ARGS`, or name a trace with -d DIR)"
            } else {
                ""
            };
            format!("cannot read trace {}{hint}", dir.display())
        })?;
        const SHOWN: usize = 20;
        for p in t.problems.iter().take(SHOWN) {
            note!("ftramp: warning: {p}");
        }
        if t.problems.len() > SHOWN {
            note!(
                "ftramp: warning: ... and {} more problems in {}",
                t.problems.len() - SHOWN,
                dir.display()
            );
        }
        let sel = self.select();
        // (A --pid whose images recorded no thread, a daemon(3) parent
        // that ended before its first event, is shown as such: its headers.)
        let pid_without_threads = self.tid.is_none() && self.pid.is_some_and(|pid| t.processes.iter().any(|p| p.pid == pid));
        if (self.pid.is_some() || self.tid.is_some()) && !pid_without_threads && sel.threads(&t).next().is_none() {
            // One entry per pid, over its images.
            let mut by_pid: std::collections::BTreeMap<u32, std::collections::BTreeSet<u32>> = Default::default();
            for p in &t.processes {
                by_pid.entry(p.pid).or_default().extend(p.threads.iter().map(|t| t.tid));
            }
            let have: Vec<String> = by_pid
                .iter()
                .map(|(pid, tids)| match tids.is_empty() {
                    true => format!("pid {pid} (no events)"),
                    false => format!("pid {pid} (tids {})", tids.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(" ")),
                })
                .collect();
            bail!(
                "{}: no thread matches{}{} (the trace has: {})",
                dir.display(),
                self.pid.map(|p| format!(" --pid {p}")).unwrap_or_default(),
                self.tid.map(|t| format!(" --tid {t}")).unwrap_or_default(),
                if have.is_empty() {
                    "no threads".to_string()
                } else {
                    have.join(", ")
                }
            );
        }
        Ok(t)
    }
}

/// Arguments of `ftramp replay`.
#[derive(clap::Args)]
pub struct ReplayArgs {
    #[command(flatten)]
    source: Source,
    /// Show only the calls of matching functions and what they call (glob or
    /// name, as for `ftramp record -F`: a name matches itself, braces are
    /// plain, `\[` is a plain `[`; repeatable).
    #[arg(short = 'F', long = "filter", value_name = "GLOB")]
    filter: Vec<String>,
    /// Hide matching functions and what they call (glob; repeatable).
    #[arg(short = 'N', long = "notrace", value_name = "GLOB")]
    notrace: Vec<String>,
    /// Show calls nested at most N deep (1 = only the outermost).
    #[arg(short = 'D', long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    depth: Option<u32>,
    /// Hide calls shorter than TIME (e.g. 500ns, 10us, 1.5ms; a plain number is ns).
    #[arg(long = "min-duration", value_name = "TIME", value_parser = parse_duration_ns)]
    min_duration: Option<u64>,
}

/// Arguments of `ftramp report`.
#[derive(clap::Args)]
pub struct ReportArgs {
    #[command(flatten)]
    source: Source,
    /// Sort by: total, self, calls, avg, max or name.
    #[arg(short = 's', long, value_name = "KEY", default_value = "total", value_parser = SortKey::parse)]
    sort: SortKey,
    /// Show only the first N functions.
    #[arg(short = 'n', long = "limit", value_name = "N")]
    limit: Option<usize>,
}

/// Arguments of `ftramp dump`.
#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["chrome", "flame", "flame_svg"])))]
pub struct DumpArgs {
    #[command(flatten)]
    source: Source,
    /// Chrome trace-event JSON (opens in the Perfetto UI and chrome://tracing).
    #[arg(long)]
    chrome: bool,
    /// Folded stacks, `frame;frame;... <self ns>` per line (flamegraph.pl / inferno input).
    #[arg(long)]
    flame: bool,
    /// An SVG flame graph written to FILE.
    #[arg(long, value_name = "FILE")]
    flame_svg: Option<PathBuf>,
    /// Write to FILE instead of stdout (--chrome, --flame).
    #[arg(short = 'o', long, value_name = "FILE", conflicts_with = "flame_svg")]
    output: Option<PathBuf>,
    /// Folded stacks for the whole trace, without process and thread frames.
    #[arg(long)]
    merged: bool,
}

/// Runs `write` on stdout (buffered); a closed pipe ends the program quietly.
fn to_stdout(write: impl FnOnce(&mut dyn Write) -> io::Result<()>) -> Result<()> {
    let stdout = io::stdout();
    let mut w = BufWriter::new(stdout.lock());
    match write(&mut w).and_then(|()| w.flush()) {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => std::process::exit(0),
        r => Ok(r?),
    }
}

fn to_file_or_stdout(
    path: Option<&Path>,
    write: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> Result<()> {
    match path {
        None => to_stdout(write),
        Some(p) if p.as_os_str() == "-" => to_stdout(write),
        Some(p) => {
            let f =
                std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?;
            let mut w = BufWriter::new(f);
            write(&mut w)
                .and_then(|()| w.flush())
                .with_context(|| format!("writing {}", p.display()))
        }
    }
}

pub fn replay(a: ReplayArgs) -> Result<()> {
    let opts = ReplayOptions {
        select: a.source.select(),
        filter: Globs::new(&a.filter).map_err(anyhow::Error::msg)?,
        notrace: Globs::new(&a.notrace).map_err(anyhow::Error::msg)?,
        depth: a.depth,
        min_ns: a.min_duration,
    };
    let t = a.source.open()?;
    to_stdout(|w| replay::replay(&t, &opts, w))
}

pub fn report(a: ReportArgs) -> Result<()> {
    let t = a.source.open()?;
    let opts = ReportOptions {
        select: a.source.select(),
        sort: a.sort,
        limit: a.limit,
    };
    to_stdout(|w| report::report(&t, &opts, w))
}

pub fn dump(a: DumpArgs) -> Result<()> {
    // `ftramp dump --chrome out.json` reads `out.json` as the trace
    // directory: say what was probably meant.
    if let Some(p) = a.source.trace_dir.as_deref().filter(|p| !p.exists()) {
        let ext = p.extension().and_then(|e| e.to_str()).unwrap_or("");
        if matches!(ext, "json" | "svg" | "folded" | "txt" | "html") {
            bail!(
                "{} is no trace directory (the positional argument names the trace); to write the output to it, use -o {}",
                p.display(),
                p.display()
            );
        }
    }
    let t = a.source.open()?;
    let select = a.source.select();
    if a.chrome {
        return to_file_or_stdout(a.output.as_deref(), |w| dump::chrome(&t, &select, w));
    }
    let lines = dump::folded(
        &t,
        &FoldOptions {
            select,
            merged: a.merged,
        },
    );
    if a.flame {
        return to_file_or_stdout(a.output.as_deref(), |w| {
            lines.iter().try_for_each(|l| writeln!(w, "{l}"))
        });
    }
    let Some(svg) = a.flame_svg else {
        bail!("nothing to dump: pass --chrome, --flame or --flame-svg FILE")
    };
    if lines.is_empty() {
        bail!(
            "{}: no calls to draw (the selected threads have no events)",
            a.source.dir().display()
        );
    }
    let mut opts = inferno::flamegraph::Options::default();
    opts.title = format!("ftramp: {}", t.info.command.join(" "));
    opts.count_name = if t.info.has_exits() {
        "ns".into()
    } else {
        "calls".into()
    };
    let f = std::fs::File::create(&svg).with_context(|| format!("creating {}", svg.display()))?;
    let mut w = BufWriter::new(f);
    inferno::flamegraph::from_lines(&mut opts, lines.iter().map(String::as_str), &mut w)
        .and_then(|()| w.flush())
        .with_context(|| format!("writing the flame graph {}", svg.display()))?;
    Ok(())
}
