//! `ftramp record [options] -- PROG ARGS…`: runs PROG with the recorder
//! library preloaded (`libftramp_recorder.so`, options in the environment)
//! and leaves a trace directory for `ftramp replay|report|dump`.

use anyhow::{bail, Context, Result};
use ftramp_recorder::startup;
use ftramp_trace::format::record_env as env;
use ftramp_trace::format::{parse_duration_ns, parse_size, toml_str, toml_u64};
use std::ffi::OsString;
use std::fmt::Write as _;
use std::io::Write as _;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicI32, Ordering::SeqCst};

/// The recorder library's file name.
pub const PRELOAD_NAME: &str = "libftramp_recorder.so";
/// Environment variable naming the recorder library to use.
pub const ENV_PRELOAD: &str = "FTRAMP_PRELOAD";

#[derive(clap::Args)]
pub struct RecordArgs {
    /// Trace directory (replaced if it holds an old trace; a directory that
    /// is not a trace is refused).
    #[arg(short = 'o', long, value_name = "DIR", default_value = "ftramp.data", visible_short_alias = 'd', visible_alias = "dir")]
    output: PathBuf,
    /// `function_graph`: entries and exits with durations; `function`: entries only.
    #[arg(short = 't', long, default_value = "function_graph", value_parser = ["function_graph", "function"])]
    tracer: String,
    /// Trace only these functions (glob or name; repeatable).  A glob or
    /// name matches the raw symbol or the name `ftramp replay` shows: C++
    /// and Rust names demangled, without parameters or hash (`ns::load`,
    /// `'ns::*'`, `'mycrate::*'`, or a mangled `_ZN2ns4loadEPKc`).  `*`, `?`
    /// and `[...]` are wildcards, `\[` a plain `[`; braces are plain
    /// (`'std::rt::*::{closure#0}'`); a name matches itself, `[` or not.
    #[arg(short = 'F', long = "filter", value_name = "GLOB")]
    filter: Vec<String>,
    /// Do not trace these functions (glob or name, as for -F; repeatable).
    #[arg(short = 'N', long = "notrace", value_name = "GLOB")]
    notrace: Vec<String>,
    /// Record calls up to this nesting depth (1: outermost traced calls only; function_graph).
    #[arg(short = 'D', long, visible_alias = "max-depth", value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    depth: Option<u64>,
    /// Drop calls shorter than this (e.g. 10us, 1.5ms; function_graph).
    #[arg(long, value_name = "TIME", value_parser = parse_duration_ns)]
    min_duration: Option<u64>,
    /// Only the main executable's functions (not its libraries').
    #[arg(long)]
    main_only: bool,
    /// Bytes per thread buffer, e.g. 64K, 1M (4K..16M; default 128K).
    #[arg(long, value_name = "SIZE", value_parser = parse_buffer_size)]
    buffer_size: Option<u64>,
    /// Buffers in the pool all threads share (default 1024: each live thread holds one; memory is used as buffers fill).
    #[arg(long, value_name = "N")]
    buffers: Option<usize>,
    /// Return when PROG ends, not when the last of its processes does (by default
    /// `ftramp record` waits for the processes PROG left running, as `strace -f`;
    /// with this, they go on recording into DIR after it returns).
    #[arg(long)]
    no_wait: bool,
    /// Say nothing on stderr when all went well: no closing summary and no
    /// note that PROG's processes are waited for.  Losses, processes that
    /// ended unseen, a run that recorded nothing and errors are still said.
    #[arg(short = 'q', long)]
    quiet: bool,
    /// The program and its arguments.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "PROG ARGS"
    )]
    command: Vec<OsString>,
}

/// The audit module's file name (`LD_AUDIT`), looked for next to the
/// recorder library: it starts recording before the constructors of the
/// libraries the program links (see `recorder/audit`).
pub const AUDIT_NAME: &str = "libftramp_audit.so";
/// Environment variable naming the audit module to use (empty: none).
pub const ENV_AUDIT: &str = "FTRAMP_AUDIT";

/// Finds the audit module: `$FTRAMP_AUDIT` (set but empty: none), else
/// next to the recorder library `preload`.  Missing there, recording
/// starts in the recorder's constructor, after the constructors of the
/// libraries the program links: said on stderr.
pub fn find_audit(preload: &Path) -> Result<Option<PathBuf>> {
    if let Some(p) = std::env::var_os(ENV_AUDIT) {
        if p.is_empty() {
            return Ok(None);
        }
        let p = PathBuf::from(p);
        if !p.is_file() {
            bail!("{ENV_AUDIT}={} does not name a file", p.display());
        }
        return Ok(Some(std::fs::canonicalize(&p).unwrap_or(p)));
    }
    // Beside the recorder library, else beside this executable or in its
    // `deps/`: an install that copied both libraries next to `ftramp` but
    // left a newer recorder in `deps/` (which find_preload takes) still has
    // its audit module (until the twenty-eighth session it was said missing).
    let p = preload.with_file_name(AUDIT_NAME);
    if p.is_file() {
        return Ok(Some(p));
    }
    if let Some(found) = beside_ftramp(AUDIT_NAME).ok().into_iter().flatten().find(|c| c.is_file()) {
        return Ok(Some(found));
    }
    note!(
        "ftramp record: {} not found: recording starts in {}'s constructor, so calls made by the constructors \
         of the libraries the program links are not recorded (it is built with the CLI: `cargo build --release \
         -p ftramp`; set {ENV_AUDIT}=/path/to/{AUDIT_NAME}, or {ENV_AUDIT}= to go without it quietly)",
        p.display(),
        preload.display()
    );
    Ok(None)
}

/// Where a library `name` built with the CLI may be: next to this
/// executable, and in its `deps/` (cargo's layout).
fn beside_ftramp(name: &str) -> Result<[PathBuf; 2]> {
    let exe = std::env::current_exe().context("cannot find the ftramp executable's path")?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    Ok([dir.join(name), dir.join("deps").join(name)])
}

/// Finds the recorder library: `$FTRAMP_PRELOAD`, else next to this
/// executable, else in its `deps/` (cargo's layout).
pub fn find_preload() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(ENV_PRELOAD).filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        if !p.is_file() {
            bail!("{ENV_PRELOAD}={} does not name a file", p.display());
        }
        return Ok(std::fs::canonicalize(&p).unwrap_or(p));
    }
    // Cargo leaves the library in deps/ when it is built as the CLI's
    // dependency, and next to the binary when built by itself: take the newer.
    let candidates = beside_ftramp(PRELOAD_NAME)?;
    let newest = candidates
        .iter()
        .filter_map(|c| {
            Some((
                c.metadata().ok().filter(|m| m.is_file())?.modified().ok()?,
                c,
            ))
        })
        .max_by_key(|(t, _)| *t);
    if let Some((_, c)) = newest {
        return Ok(c.clone());
    }
    bail!(
        "the recorder library {PRELOAD_NAME} was not found (looked for {} and {}); it is built with the CLI: \
         `cargo build --release -p ftramp` puts it in target/release/deps/ (and `cargo build --release` of the whole \
         workspace in target/release/ too), or set {ENV_PRELOAD}=/path/to/{PRELOAD_NAME}",
        candidates[0].display(),
        candidates[1].display()
    )
}

/// `prog` as `execvp` would find it, or an error naming it.
fn find_program(prog: &std::ffi::OsStr) -> Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let p = Path::new(prog);
    let executable = |p: &Path| {
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if p.as_os_str().as_encoded_bytes().contains(&b'/') {
        if executable(p) {
            return Ok(p.to_path_buf());
        }
        bail!("program not found or not executable: {}", p.display());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        let c = dir.join(p);
        if executable(&c) {
            return Ok(c);
        }
    }
    if p.as_os_str().as_encoded_bytes().starts_with(b"-") {
        // Options before PROG are clap's; a word that starts with `-` and
        // reaches here was not one of them (a misspelt option), not a program.
        bail!(
            "unknown option `{}` (see `ftramp record --help`; a program whose name starts with `-` is run as ./{})",
            p.display(),
            p.display()
        );
    }
    bail!("program not found: {} (not in PATH)", p.display())
}

/// Opens `dir`'s `info` and `flock`s it with `op`: `None` when it cannot
/// be opened, else the file (held while it lives) or the lock's error.
/// `ftramp record` and every process recording into the trace hold a
/// shared lock on it (the recorder's `tracefile::hold_trace_lock`), so
/// that a second `ftramp record` into the same directory cannot remove
/// the files they write into (until the twenty-seventh session it did,
/// without a word, and the first run's trace was lost).
fn lock_info(dir: &Path, op: libc::c_int) -> Option<std::io::Result<std::fs::File>> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(dir.join("info")).ok()?;
    // SAFETY: flock on the descriptor of the file we just opened.
    Some(if unsafe { libc::flock(f.as_raw_fd(), op) } == 0 { Ok(f) } else { Err(std::io::Error::last_os_error()) })
}

/// Whether `info` of `dir` is locked by someone else (not just a file
/// system without locks).
fn in_use(dir: &Path) -> bool {
    matches!(lock_info(dir, libc::LOCK_EX | libc::LOCK_NB), Some(Err(e)) if e.raw_os_error() == Some(libc::EWOULDBLOCK))
}

/// Makes `dir` an empty trace directory: an old trace (it has `info`) is
/// replaced, an empty directory used, anything else refused.
fn prepare_dir(dir: &Path) -> Result<()> {
    if dir.exists() {
        if !dir.is_dir() {
            bail!("{} exists and is not a directory", dir.display());
        }
        let is_trace =
            std::fs::read_to_string(dir.join("info")).is_ok_and(|t| t.contains("version"));
        let empty = std::fs::read_dir(dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .next()
            .is_none();
        if is_trace {
            if in_use(dir) {
                bail!(
                    "{} is in use: a recording into it is still running (an `ftramp record`, or processes one left \
                     recording); wait for it to end, or record into another directory (-o DIR)",
                    dir.display()
                );
            }
            std::fs::remove_dir_all(dir)
                .with_context(|| format!("removing the old trace {}", dir.display()))?;
        } else if !empty {
            bail!("refusing to overwrite {}: it is not empty and not an ftramp trace directory (no `info` file)", dir.display());
        }
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))
}


fn toml_list(items: &[String]) -> String {
    format!(
        "[{}]",
        items
            .iter()
            .map(|s| toml_str(s))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// Runs `ftramp record`; returns the exit code to end with (the program's).
pub fn run(a: RecordArgs) -> Result<i32> {
    let graph = a.tracer == "function_graph";
    if !graph && a.depth.is_some() {
        bail!("--depth needs the function_graph tracer (the function tracer sees no returns, so no depth)");
    }
    if !graph && a.min_duration.is_some() {
        bail!("--min-duration needs the function_graph tracer (the function tracer records no durations)");
    }
    // (Both checked by clap, which reports a bad value with its usage and
    // status 2 like every other option's; until the twenty-eighth session
    // they were checked here, with status 1.)
    let min_ns = a.min_duration.unwrap_or(0);
    let buffer_size = a.buffer_size.unwrap_or(env::DEFAULT_BUFFER_SIZE as u64);
    if let Some(n) = a.buffers {
        if !(2..=env::MAX_BUFFERS).contains(&n) {
            bail!("--buffers {n}: must be between 2 and {}", env::MAX_BUFFERS);
        }
    }
    for g in a.filter.iter().chain(&a.notrace) {
        ftramp_runtime::ops::Filter::new()
            .parse(g)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        if g.contains(|c: char| c == ';' || c.is_whitespace()) {
            bail!(
                "bad filter `{g}`: filters are separated by spaces and `;`, so a name cannot hold them: \
                 write `?` or `*` for a space (`-F '(anonymous?namespace)::helper'`)"
            );
        }
        // Filters match the raw symbol or the name replay shows, which has
        // no parameter list: `foo(int)` would match nothing, silently.  (But
        // the names of call operators end in `()`: `F::operator()`,
        // `main::{lambda(int)#1}::operator()`, refused until the
        // twenty-seventh session.)
        if g.ends_with(')') && g.contains('(') && !g.ends_with("namespace)") && !g.ends_with("operator()") {
            bail!(
                "bad filter `{g}`: names have no parameter list while recording (they match the raw symbol \
                 or the name `ftramp replay` shows, as `ns::load`): overloads are selected together"
            );
        }
    }
    let prog = find_program(&a.command[0])?;
    let preload = find_preload()?;
    // (Before glibc 2.34 the module could not start recording early, and
    // would only take TLS room.)
    let audit = find_audit(&preload)?.filter(|_| ftramp_recorder::early_start_supported());
    // A program whose allocator lives in a library with TLS that is not
    // initial-exec would die before `main` beside the module (glibc
    // allocates that TLS with the allocator, which recurses:
    // `startup::dynamic_tls_allocator`): it runs without it.  (Until the
    // thirtieth session it died of SIGSEGV under `ftramp record`, a
    // `-fPIC` malloc with one `__thread` counter; untraced it runs.)
    let audit = audit.filter(|_| {
        let (ld_library_path, preload) = (std::env::var_os("LD_LIBRARY_PATH"), std::env::var_os("LD_PRELOAD"));
        let Some(lib) = startup::dynamic_tls_allocator(&prog, ld_library_path.as_deref(), preload.as_deref()) else { return true };
        note!(
            "ftramp record: {lib} defines the allocator and has thread-local storage that is not initial-exec, which \
             glibc would allocate with that allocator beside an audit module, for ever: the program runs without \
             {AUDIT_NAME}, so calls made by the constructors of the libraries it links are not recorded"
        );
        false
    });
    // Room for the initial-exec TLS of the program's libraries beside the
    // audit module (ftramp_recorder::startup): the user's own tunables
    // go back into the environment when the recorder starts.
    let user_tunables = std::env::var_os("GLIBC_TUNABLES");
    let tunables = audit.as_ref().and_then(|_| {
        let (ld_library_path, preload) = (std::env::var_os("LD_LIBRARY_PATH"), std::env::var_os("LD_PRELOAD"));
        startup::tunables_for(&prog, ld_library_path.as_deref(), preload.as_deref(), user_tunables.as_deref())
            .filter(|t| Some(std::ffi::OsStr::new(t)) != user_tunables.as_deref())
    });
    prepare_dir(&a.output)?;
    let dir = std::fs::canonicalize(&a.output)
        .with_context(|| format!("resolving {}", a.output.display()))?;

    // One clock calibration for every process of the trace, measured over
    // the whole run: the processes record with the provisional one, and the
    // final one goes into `info` when the program is done (no waiting for
    // it up front).
    let calibrating = ftramp_runtime::clock::Calibrating::start();
    let clock = &calibrating.provisional;
    let command: Vec<String> = a
        .command
        .iter()
        .map(|s| s.to_string_lossy().into_owned())
        .collect();
    let mut info = String::new();
    let _ = writeln!(
        info,
        "version = 2\ntracer = {}\ncommand = {}\nclock = \"{}\"",
        toml_str(&a.tracer),
        toml_list(&command),
        clock.kind.name()
    );
    let _ = writeln!(
        info,
        "\n[options]\nfilter = {}\nnotrace = {}",
        toml_list(&a.filter),
        toml_list(&a.notrace)
    );
    if let Some(d) = a.depth {
        let _ = writeln!(info, "depth = {d}");
    }
    let _ = writeln!(
        info,
        "min_duration_ns = {min_ns}\nmain_only = {}\nbuffer_size = {buffer_size}",
        a.main_only
    );
    std::fs::write(dir.join("info"), info)
        .with_context(|| format!("writing {}", dir.join("info").display()))?;
    // Held until we return (see `lock_info`).
    let _in_use = lock_info(&dir, libc::LOCK_SH);

    // A sanitizer's runtime insists on coming first among the libraries
    // (ASan aborts otherwise): it goes before the recorder.
    let mut ld_preload = std::ffi::OsString::new();
    for san in startup::sanitizer_runtimes(&prog) {
        ld_preload.push(&san);
        ld_preload.push(" ");
    }
    ld_preload.push(preload.as_os_str());
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|o| !o.is_empty()) {
        ld_preload.push(" ");
        ld_preload.push(old);
    }
    let mut cmd = Command::new(&prog);
    cmd.arg0(&a.command[0]).args(&a.command[1..]);
    if let Some(audit) = &audit {
        let mut ld_audit = audit.as_os_str().to_os_string();
        if let Some(old) = std::env::var_os("LD_AUDIT").filter(|o| !o.is_empty()) {
            ld_audit.push(":");
            ld_audit.push(old);
        }
        cmd.env("LD_AUDIT", ld_audit);
    }
    if let Some(t) = &tunables {
        cmd.env("GLIBC_TUNABLES", t).env(startup::ENV_USER_TUNABLES, startup::encode_user_tunables(user_tunables.as_deref()));
    }
    cmd.env("LD_PRELOAD", ld_preload)
        .env(env::DIR, &dir)
        .env(env::TRACER, &a.tracer)
        .env(env::FILTER, a.filter.join(" "))
        .env(env::NOTRACE, a.notrace.join(" "))
        .env(env::MIN_DURATION, min_ns.to_string())
        .env(env::MAIN_ONLY, if a.main_only { "1" } else { "0" })
        .env(env::BUFFER_SIZE, buffer_size.to_string())
        .env(env::RECORD_PID, std::process::id().to_string())
        .env(env::QUIET, if a.quiet { "1" } else { "0" })
        .env(ftramp_runtime::clock::ENV, clock.env_value());
    match a.depth {
        Some(d) => cmd.env(env::DEPTH, d.to_string()),
        None => cmd.env_remove(env::DEPTH),
    };
    match a.buffers {
        Some(n) => cmd.env(env::BUFFERS, n.to_string()),
        None => cmd.env_remove(env::BUFFERS),
    };
    use std::os::unix::process::CommandExt as _;
    // Ctrl-C, Ctrl-\, hang-ups and `timeout` signal the whole process
    // group: let the program handle them, and finish the trace after it
    // ends; a signal sent to `ftramp record` alone is passed on.  (A
    // handler rather than SIG_IGN: exec resets handlers, so the program
    // starts with the default actions.)
    catch_terminal_signals();
    // Processes the program leaves running (a background job, a daemon)
    // become ours when their parent ends, so that we can wait for them.
    // SAFETY: prctl with integer arguments; not inherited by the child.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    // Children we have before the program starts are not its: a shell that
    // execs `ftramp record` leaves us its own (`2> >(filter)`, `sleep &`),
    // and one may wait for us to end (the filter reads our stderr).
    let inherited = children();
    // If `ftramp record` dies (SIGKILL), the program dies with it, as it
    // would have untraced: a supervisor that stops it by its pid never
    // leaves the program running on (see `catch_terminal_signals`).
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: between fork and exec the closure makes async-signal-safe
    // calls (prctl with integer arguments, getppid, signal) and allocates
    // nothing; a parent already gone is reported as an error before exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 || libc::getppid() != parent {
                return Err(std::io::Error::other("ftramp record ended before the program started"));
            }
            // Ignored before `ftramp record` handled them: ignored in the
            // program, as untraced (exec would reset our handler to the
            // default action).
            let ignored = IGNORED_AT_START.load(SeqCst);
            for sig in TERMINAL_SIGNALS.into_iter().chain(PASSED_ON_SIGNALS).filter(|&s| ignored & (1 << s) != 0) {
                libc::signal(sig, libc::SIG_IGN);
            }
            Ok(())
        })
    };
    let child = cmd.spawn().with_context(|| format!("running {}", prog.display()))?;
    PROGRAM.store(child.id() as libc::pid_t, SeqCst);
    pass_on_pending();
    let program_pid = child.id();
    let status = wait_reaping_orphans(program_pid as libc::pid_t);
    PROGRAM.store(0, SeqCst);
    let left_running = !reap_ended_descendants(&inherited);
    // Waiting for them: a terminal signal (Ctrl-C) ends the wait, and they
    // go on recording, as with --no-wait.
    let mut stopped_waiting = None;
    if left_running && !a.no_wait {
        let running = if a.quiet { Vec::new() } else { still_running(&dir, &preload, &inherited) };
        if !a.quiet {
            note!(
                "ftramp record: {} ended; waiting for the processes it left running{} (--no-wait not to; Ctrl-C stops waiting)",
                prog.display(),
                if running.is_empty() { String::new() } else { format!(" ({})", pid_list(&running)) }
            );
        }
        stopped_waiting = wait_for_descendants(&inherited);
    }
    let still_recording = left_running && (a.no_wait || stopped_waiting.is_some());
    let c = calibrating.finish();
    let calibration = format!(
        "\n# The clock calibration over the whole run, which readers use for every process\n\
         # (the task-*.info files hold the provisional one the processes recorded with).\n\
         [calibration]\nticks_per_sec = {}\nbase_ticks = {}\nbase_ns = {}\n",
        c.ticks_per_sec,
        toml_u64(c.base_ticks),
        toml_u64(c.base_ns)
    );
    let info_path = dir.join("info");
    if let Err(e) = std::fs::OpenOptions::new()
        .append(true)
        .open(&info_path)
        .and_then(|mut f| f.write_all(calibration.as_bytes()))
    {
        note!(
            "ftramp record: cannot add the clock calibration to {}: {e} (the provisional one is used)",
            info_path.display()
        );
    }

    let summary = summarize(&dir);
    if summary.images > 0 && summary.sites == 0 {
        note!("ftramp record: {}", no_sites_advice(&prog));
    }
    if summary.images > 0 && summary.sites > 0 && !summary.events && !a.filter.is_empty() {
        note!(
            "ftramp record: no call of a function matching the filters was recorded ({}): filters match \
             the raw symbol or the name `ftramp replay` shows, see `ftramp record --help`",
            a.filter.iter().map(|f| format!("-F {f}")).collect::<Vec<_>>().join(" ")
        );
    }
    if summary.images == 0 {
        note!(
            "ftramp record: nothing was recorded: {} did not load {} (a statically linked or set-user-ID \
             program ignores LD_PRELOAD, and a program may end before libraries are initialised: see \
             its messages above)",
            prog.display(),
            preload.display()
        );
    }
    let code = match (status.code(), status.signal()) {
        (Some(c), _) => c,
        (None, Some(s)) => {
            // (With -q the status, 128 + s, says it.)
            if !a.quiet {
                note!("ftramp record: {} was killed by signal {s}", prog.display());
            }
            128 + s
        }
        _ => 1,
    };
    let running = if still_recording { still_running(&dir, &preload, &inherited) } else { Vec::new() };
    // (A process still alive that `still_running` did not count — caught in
    // the middle of an `exec`, its environment and mappings changing — has
    // not ended: said once in CI of an `--no-wait` run, for a subshell
    // exec'ing the program.)
    for (pid, n) in summary.unfinished.iter().filter(|(pid, _)| !running.contains(pid) && is_zombie(*pid)) {
        // The program's own status says how it ended: a signal other than
        // SIGKILL whose handler (the recorder's) could not run, not the
        // SIGKILL or exit system call said below (a stack overflow on a
        // thread whose alternate signal stack the program disabled).
        if let Some(s) = status.signal().filter(|&s| *pid == program_pid && s != libc::SIGKILL) {
            note!(
                "ftramp record: pid {pid} (image {n}) was killed by signal {s} ({}) where the recorder's handler \
                 could not run (a stack overflow on a thread other than the main one whose alternate signal \
                 stack the program disabled, or a handler of the program's own in its place): the events still \
                 in its buffers are lost, and not counted",
                ftramp_recorder::session::SignalName(s)
            );
            continue;
        }
        note!(
            "ftramp record: pid {pid} (image {n}) ended without the recorder seeing it end (SIGKILL, or an \
             exit system call made directly), or its end could not be written (its writes to the trace failed: \
             a full disk, or a change of user that closed or may not reopen the trace files; see any note above): \
             the events still in its buffers are lost, and not counted"
        );
    }
    // (An image still starting has an empty `.info` for a moment too: only
    // the processes gone count.)
    let unwritten: Vec<&(u32, u32)> = summary.unwritten.iter().filter(|(pid, _)| !running.contains(pid) && is_zombie(*pid)).collect();
    if !unwritten.is_empty() {
        let pids: Vec<String> = unwritten.iter().map(|(pid, n)| format!("{pid} (image {n})")).collect();
        let (one, files) = (pids.len() == 1, if pids.len() == 1 { "its .info is" } else { "their .info files are" });
        note!(
            "ftramp record: nothing of {} {} is in the trace, not even in the counts of lost events: {files} \
             empty: the recorder could not write to the trace (see any failed writes above), or the process was \
             killed as it started{}",
            if one { "pid" } else { "pids" },
            pids.join(", "),
            free_space_note(&dir)
        );
    }
    if still_recording && !a.quiet {
        note!(
            "ftramp record: {}processes {} left running are still recording into {}{} (the counts below are of now)",
            stopped_waiting
                .map(|s| {
                    let name = match s {
                        libc::SIGINT => "SIGINT",
                        libc::SIGQUIT => "SIGQUIT",
                        libc::SIGTERM => "SIGTERM",
                        _ => "SIGHUP",
                    };
                    format!("stopped waiting ({name}); ")
                })
                .unwrap_or_default(),
            prog.display(),
            a.output.display(),
            if running.is_empty() { String::new() } else { format!(": {}", pid_list(&running)) }
        );
    }
    for note in loss_notes(&summary) {
        note!("ftramp record: {note}");
    }
    if a.quiet && summary.lost == 0 && unwritten.is_empty() {
        return Ok(code);
    }
    note!(
        "ftramp record: {} process image{} recorded in {}{}",
        summary.images,
        if summary.images == 1 { "" } else { "s" },
        a.output.display(),
        if summary.lost > 0 {
            format!(" ({} events lost, see above)", summary.lost)
        } else {
            String::new()
        }
    );
    Ok(code)
}

/// The processes of the trace in `dir` that have not ended, and those of
/// our children (the program's orphans, ours as the subreaper; not the
/// `inherited` ones) that have no image yet: a fork child opens its image
/// in its own after-fork handler, which may run after its parent has
/// ended and we looked (`--no-wait` then named no pid, in 3 of 20 runs of
/// `memcached -d`).  A process counts when it exists and records into
/// `dir`: its environment names `dir` (a pid reused by another process is
/// not taken for one of ours) or, where the process has written over its
/// environment to set its title (nginx, postgres, sshd), names no trace
/// directory at all and the process has the recorder library (`preload`)
/// mapped.
fn still_running(dir: &Path, preload: &Path, inherited: &[libc::pid_t]) -> Vec<u32> {
    let key = format!("{}=", env::DIR);
    // (Maps name the file itself, not a symbolic link to it.)
    let preload = std::fs::canonicalize(preload).unwrap_or_else(|_| preload.to_path_buf());
    let orphans = children().into_iter().filter(|p| inherited.binary_search(p).is_err()).map(|p| p as u32);
    let mut pids: Vec<u32> = summarize(dir)
        .unfinished
        .into_iter()
        .map(|(pid, _)| pid)
        .chain(orphans)
        .filter(|pid| {
            let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else { return false };
            let named = environ.split(|b| *b == 0).find_map(|v| v.strip_prefix(key.as_bytes()));
            let ours = match named {
                Some(d) => Path::new(std::ffi::OsStr::from_bytes(d)) == dir,
                None => std::fs::read(format!("/proc/{pid}/maps"))
                    .is_ok_and(|maps| maps.windows(preload.as_os_str().len()).any(|w| w == preload.as_os_str().as_bytes())),
            };
            ours && !is_zombie(*pid)
        })
        .collect();
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// Our children now (`/proc/*/stat` with our pid as parent): the kernel
/// has no call that lists them everywhere (`/proc/PID/task/TID/children`
/// needs `CONFIG_PROC_CHILDREN`).
fn children() -> Vec<libc::pid_t> {
    let me = std::process::id().to_string();
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut pids: Vec<libc::pid_t> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<libc::pid_t>().ok())
        .filter(|pid| stat_fields(*pid as u32).is_some_and(|f| f.split_whitespace().nth(1) == Some(me.as_str())))
        .collect();
    pids.sort_unstable();
    pids
}

/// Whether a child other than the `inherited` ones is left.
fn program_children_left(inherited: &[libc::pid_t]) -> bool {
    children().iter().any(|p| inherited.binary_search(p).is_err())
}

/// Whether `pid` has ended and waits to be reaped.
fn is_zombie(pid: u32) -> bool {
    // (Gone counts as ended.)
    stat_fields(pid).is_none_or(|f| f.trim_start().starts_with('Z'))
}

/// The fields of `/proc/PID/stat` after the command name (state, ppid, …);
/// `None` when the process is gone.
fn stat_fields(pid: u32) -> Option<String> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(s.rsplit_once(')')?.1.to_string())
}

fn pid_list(pids: &[u32]) -> String {
    let names: Vec<String> = pids.iter().map(|p| format!("pid {p}")).collect();
    names.join(", ")
}

/// What one `waitpid(-1)` found.
enum Reaped {
    /// This process ended, with this status.
    One(libc::pid_t, libc::c_int),
    /// Children remain, none has ended (`WNOHANG`).
    NoneEnded,
    /// No child is left (`ECHILD`).
    NoChild,
}

/// One `waitpid(-1, …, flags)`, retried when a signal interrupts it.
fn reap(flags: libc::c_int) -> Reaped {
    loop {
        let mut st = 0;
        // SAFETY: waitpid fills the status we own.
        match unsafe { libc::waitpid(-1, &mut st, flags) } {
            0 => return Reaped::NoneEnded,
            r if r > 0 => return Reaped::One(r, st),
            _ if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) => continue,
            _ => return Reaped::NoChild,
        }
    }
}

/// Waits for the program (`pid`) and returns how it ended, reaping
/// meanwhile the orphans that become ours as the subreaper (a long-running
/// program that leaves processes behind would otherwise pile up zombies).
fn wait_reaping_orphans(pid: libc::pid_t) -> std::process::ExitStatus {
    loop {
        match reap(0) {
            Reaped::One(r, st) if r == pid => return std::process::ExitStatus::from_raw(st),
            Reaped::One(..) | Reaped::NoneEnded => {}
            // (Reaped elsewhere: cannot happen, no other thread waits.)
            Reaped::NoChild => return std::process::ExitStatus::from_raw(0),
        }
    }
}

/// Reaps the descendants that have ended; true when none of the
/// program's is left (children `inherited` from before it started, which
/// are reaped too if they end, do not count).
fn reap_ended_descendants(inherited: &[libc::pid_t]) -> bool {
    loop {
        match reap(libc::WNOHANG) {
            Reaped::One(..) => {}
            Reaped::NoneEnded => return !program_children_left(inherited),
            Reaped::NoChild => return true,
        }
    }
}

/// Reaps every descendant of the program (they are ours once orphaned, as
/// the subreaper) until none is left; children `inherited` from before it
/// started are not waited for.  (A process orphaned by a descendant is
/// ours before that descendant can be reaped: the check after each reap
/// sees it.)
/// Returns the terminal signal that stopped the wait, if one did.
fn wait_for_descendants(inherited: &[libc::pid_t]) -> Option<libc::c_int> {
    TERMINAL_SIGNAL.store(0, SeqCst);
    while program_children_left(inherited) {
        // The signal may go to another thread of ours (the clock's
        // calibration), where it interrupts no wait of this one: polled,
        // every 20 ms, between reaps of whatever ended.
        match reap(libc::WNOHANG) {
            Reaped::One(..) => continue,
            Reaped::NoChild => break,
            Reaped::NoneEnded => {}
        }
        let sig = TERMINAL_SIGNAL.load(SeqCst);
        if sig != 0 {
            return Some(sig);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    None
}

/// The last terminal signal `ftramp record` got ([`catch_terminal_signals`]).
static TERMINAL_SIGNAL: AtomicI32 = AtomicI32::new(0);

/// The signals [`catch_terminal_signals`] handles.
const TERMINAL_SIGNALS: [libc::c_int; 4] = [libc::SIGINT, libc::SIGQUIT, libc::SIGTERM, libc::SIGHUP];

/// Signals whose default action ends a process and that a supervisor sends
/// to the pid it started to mean the program (dd's and nginx's SIGUSR1, a
/// watchdog's SIGALRM): passed on by [`catch_terminal_signals`]'s rule,
/// and otherwise nothing to `ftramp record` (they do not stop its wait for
/// processes left running).  Until the thirtieth session such a signal
/// ended `ftramp record`, and the program was killed with it
/// (`PR_SET_PDEATHSIG`) without running its handler.
const PASSED_ON_SIGNALS: [libc::c_int; 3] = [libc::SIGUSR1, libc::SIGUSR2, libc::SIGALRM];

/// Those of [`TERMINAL_SIGNALS`] and [`PASSED_ON_SIGNALS`] that were ignored when `ftramp record`
/// started (bit N for signal N): the program starts with them ignored.
static IGNORED_AT_START: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The program's pid while it runs (0 before and after): where
/// [`catch_terminal_signals`] passes a signal on.
static PROGRAM: AtomicI32 = AtomicI32::new(0);

/// A signal to pass on to the program that has not been yet, and its
/// sender.
static PENDING_SIGNAL: AtomicI32 = AtomicI32::new(0);
static PENDING_SENDER: AtomicI32 = AtomicI32::new(0);

/// `--buffer-size`: a size (`64K`, `1M`) between 4K and 16M.
fn parse_buffer_size(s: &str) -> Result<u64, String> {
    let n = parse_size(s)?;
    if !(env::MIN_BUFFER_SIZE as u64..=env::MAX_BUFFER_SIZE as u64).contains(&n) {
        return Err("must be between 4K and 16M".into());
    }
    Ok(n)
}

/// Passes [`PENDING_SIGNAL`] on to the program, if both are there and the
/// program did not send it itself; exactly one of the callers that race
/// for it does (the swap).  Async-signal-safe.
fn pass_on_pending() {
    let program = PROGRAM.load(SeqCst);
    if program > 0 {
        let sig = PENDING_SIGNAL.swap(0, SeqCst);
        if sig != 0 && PENDING_SENDER.load(SeqCst) != program {
            // SAFETY: kill is an async-signal-safe system call.
            unsafe { libc::kill(program, sig) };
        }
    }
}

/// While the program runs: SIGINT, SIGQUIT, SIGTERM and SIGHUP do not end
/// `ftramp record`, which waits for the program to end and finishes the
/// trace; nor do the [`PASSED_ON_SIGNALS`].  (Before, SIGTERM and SIGHUP ended `ftramp record` at once:
/// `timeout` returned while the program was still cleaning up, with the
/// program's status lost and the trace unfinished.)
///
/// Whether one is passed on to the program follows `sudo`'s rule: a
/// signal the terminal sent (Ctrl-C, Ctrl-\, a hang-up: `si_code`
/// positive) went to the whole foreground process group, the program
/// included, and one sent by a process of our own group (`timeout`, which
/// signals its child and then its group; `kill 0`) reached the program
/// too: neither is passed on, since twice would not be as untraced.  One
/// sent by any other process (`kill PID` of `ftramp record` by a
/// supervisor that knows only the pid it started, a service manager) is
/// passed on to the program, once.  (Until the twenty-sixth session none
/// was: a supervisor's SIGINT and SIGTERM did nothing, its SIGKILL ended
/// `ftramp record` alone, and the program ran on, orphaned; since then
/// the program also gets SIGKILL when `ftramp record` dies,
/// `PR_SET_PDEATHSIG`.)  A signal sent to a whole other group that holds
/// both (`kill -TERM -PGID` from outside, a control-group kill) reaches
/// the program twice.  Where the signals are ignored already (a job
/// started with `&` by a shell without job control, `trap '' INT`), the
/// program starts with them ignored, as it would untraced (the child sets
/// them back to `SIG_IGN` before exec: [`IGNORED_AT_START`]), and
/// `ftramp record` does not react to them itself; but one sent to it alone
/// is still passed on, for a program that installs a handler of its own
/// (until the twenty-eighth session `ftramp record` ignored them too, and
/// such a program's `kill -INT` through `ftramp record`'s pid was lost).
fn catch_terminal_signals() {
    extern "C" fn note(sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
        if IGNORED_AT_START.load(SeqCst) & (1 << sig) == 0 && TERMINAL_SIGNALS.contains(&sig) {
            TERMINAL_SIGNAL.store(sig, SeqCst);
        }
        if info.is_null() {
            return;
        }
        // SAFETY: the kernel's siginfo for this SA_SIGINFO handler; the
        // calls are async-signal-safe system calls.
        unsafe {
            let info = &*info;
            // SI_USER (0) and the other negative codes: kill, sigqueue,
            // tgkill; positive: the kernel (the terminal).
            if info.si_code > 0 {
                return;
            }
            let sender = info.si_pid();
            if sender == PROGRAM.load(SeqCst) || libc::getpgid(sender) == libc::getpgrp() {
                return;
            }
            // Passed on by whoever sees the program's pid first: here, or
            // `record` as it stores the pid (a signal that came before,
            // while `spawn` returned: a supervisor that saw the program
            // start signalled us then, and the signal was lost, once in a
            // few runs of the test below on a loaded machine).
            PENDING_SENDER.store(sender, SeqCst);
            PENDING_SIGNAL.store(sig, SeqCst);
            pass_on_pending();
        }
    }
    for sig in TERMINAL_SIGNALS.into_iter().chain(PASSED_ON_SIGNALS) {
        // SAFETY: queries, then installs an async-signal-safe handler that
        // notes the signal (an atomic store) and may pass it on (system
        // calls only).
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN {
                IGNORED_AT_START.fetch_or(1 << sig, SeqCst);
            }
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = note as *const () as libc::sighandler_t;
            act.sa_flags = libc::SA_SIGINFO;
            libc::sigemptyset(&mut act.sa_mask);
            libc::sigaction(sig, &act, std::ptr::null_mut());
        }
    }
}

struct Summary {
    images: usize,
    sites: u64,
    lost: u64,
    /// Per cause (`ftramp_recorder::session::LOSS_KEYS`, in order), the
    /// total and the pids of the images that had some.
    causes: [(u64, Vec<u32>); ftramp_recorder::session::LOSS_KEYS.len()],
    /// Images (pid, image number) whose `.info` has no `exit` line.
    unfinished: Vec<(u32, u32)>,
    /// Images whose `.info` is empty: the recorder could not write even
    /// its first lines (a full disk).
    unwritten: Vec<(u32, u32)>,
    /// Some `.dat` holds an event (or cannot be read as empty).
    events: bool,
}

/// Whether the `.dat` file at `path` holds a chunk with events: walks the
/// chunk headers only, and stops at the first non-empty one (so a big
/// trace costs one read).  Unreadable or damaged counts as holding some.
fn dat_has_events(path: &Path) -> bool {
    use std::os::unix::fs::FileExt;
    use ftramp_trace::format::{ChunkHeader, CHUNK_HEADER_SIZE};
    let Ok(f) = std::fs::File::open(path) else { return true };
    let mut at = 0u64;
    loop {
        let mut b = [0u8; CHUNK_HEADER_SIZE];
        match f.read_exact_at(&mut b, at) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return false,
            Err(_) => return true,
        }
        match ChunkHeader::decode(&b) {
            Ok(h) if h.len == 0 => at += CHUNK_HEADER_SIZE as u64,
            _ => return true,
        }
    }
}

/// Counts the images, their sites and lost events from the `.info` files,
/// and looks for an event in the `.dat` files.
fn summarize(dir: &Path) -> Summary {
    let mut s = Summary {
        images: 0,
        sites: 0,
        lost: 0,
        causes: Default::default(),
        unfinished: Vec::new(),
        unwritten: Vec::new(),
        events: false,
    };
    let Ok(rd) = std::fs::read_dir(dir) else {
        return s;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let (pid, n) = match ftramp_trace::format::parse_task_file_name(&name) {
            Some((_, _, "dat")) if !s.events => {
                s.events = dat_has_events(&e.path());
                continue;
            }
            Some((pid, n, "info")) => (pid, n),
            _ => continue,
        };
        s.images += 1;
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        // The values of the `key = value` lines, last first.
        let values = |key: &'static str| {
            text.lines()
                .rev()
                .filter_map(move |l| Some(l.strip_prefix(key)?.trim_start().strip_prefix('=')?.trim()))
        };
        let num = |key| values(key).find_map(|v| v.parse::<u64>().ok()).unwrap_or(0);
        s.sites += num("sites");
        s.lost += num("lost");
        for (key, (total, pids)) in ftramp_recorder::session::LOSS_KEYS.iter().zip(&mut s.causes) {
            let n = num(key);
            if n > 0 {
                *total += n;
                if !pids.contains(&pid) {
                    pids.push(pid);
                }
            }
        }
        if text.trim().is_empty() {
            s.unwritten.push((pid, n));
        } else if values("exit").next().is_none() {
            s.unfinished.push((pid, n));
        }
    }
    s.unfinished.sort();
    s.unwritten.sort();
    s
}

/// `"; <dir>'s file system is full"` when it has no room left (what makes
/// a recorder's every write fail), else nothing.
fn free_space_note(dir: &Path) -> String {
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
        return String::new();
    };
    // SAFETY: statvfs fills the struct we own from a NUL-terminated path.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } == 0 && st.f_bavail == 0 {
        format!("; the file system of {} is full", dir.display())
    } else {
        String::new()
    }
}

/// What `ftramp record` says at the end about the events and calls its
/// images could not record, one line per cause (the recorder writes the
/// counts into each image's `.info` and says nothing in the program's
/// stderr under `ftramp record`).
fn loss_notes(s: &Summary) -> Vec<String> {
    const SHOWN: usize = 5;
    let mut notes = Vec::new();
    for (cause, (n, pids)) in s.causes.iter().enumerate().filter(|(_, (n, _))| *n > 0) {
        let mut sorted = pids.clone();
        sorted.sort_unstable();
        let mut place = format!(" in {}", pid_list(&sorted[..sorted.len().min(SHOWN)]));
        if sorted.len() > SHOWN {
            place.push_str(&format!(" and {} more", sorted.len() - SHOWN));
        }
        let mut note = String::new();
        let _ = ftramp_recorder::session::write_loss_note(&mut note, cause, *n, &place);
        notes.push(note);
    }
    notes
}

fn no_sites_advice(prog: &Path) -> String {
    let n = table_lost(prog);
    if n > 0 {
        return format!(
            "{} has no patch site table, but {n} of its functions begin with a patch site's NOPs: the link dropped the \
             table, so nothing in it is traced. gcc (12) ties a file's table to the section of its first function, and \
             `--gc-sections` drops it with that function when it is unused and the file was compiled with \
             `-ffunction-sections` (the `cc` crate's default); add `-fno-function-sections`, or build with clang",
            prog.display()
        );
    }
    let flags = ftramp_runtime::host_spec().raw.site.flags.clone();
    ftramp_trace::format::no_sites_advice(&prog.display().to_string(), &flags)
}

/// How many functions of `prog` begin (after a landing pad) with a site's
/// NOPs when it has no site table at all: the compiler made the sites and
/// the link lost the table (0 when it has one, or none begins so, or it
/// cannot be read).  Until the twenty-seventh session such a program got the
/// advice to build with the flags it was built with.
fn table_lost(prog: &Path) -> usize {
    use object::{Object, ObjectSection, ObjectSymbol, SymbolKind};
    let Ok(data) = std::fs::read(prog) else { return 0 };
    let Ok(file) = object::File::parse(&*data) else { return 0 };
    if file.section_by_name("__patchable_function_entries").is_some() || file.section_by_name("__mcount_loc").is_some() {
        return 0;
    }
    let spec = ftramp_runtime::host_spec();
    let pads = ftramp_runtime::sites::landing_pads();
    file.symbols()
        .filter(|s| s.kind() == SymbolKind::Text && s.is_definition() && s.size() as usize >= spec.site_len)
        .filter(|s| {
            let Some(Ok(bytes)) = s.section_index().and_then(|i| file.section_by_index(i).ok()).map(|sec| {
                sec.data_range(s.address(), (spec.site_len + 4) as u64).map(|b| b.unwrap_or_default().to_vec())
            }) else {
                return false;
            };
            let at = pads.iter().find(|p| bytes.starts_with(p)).map_or(0, |p| p.len());
            bytes.get(at..at + spec.site_len).is_some_and(|b| spec.nops.iter().any(|n| n.as_slice() == b))
        })
        .count()
}
