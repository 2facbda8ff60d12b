//! `ftramp demo`: builds the bundled C demo (`examples/demo/`: threads,
//! recursion, a call into a shared library) with this machine's patch-site
//! flags, records it with `ftramp record` and replays the trace with
//! `ftramp replay` — the README's first command.
//!
//! The demo's sources are compiled into this binary, so the command needs
//! only a C compiler (`$CC`, else `cc`).

use anyhow::{bail, Context, Result};
use ftramp_codegen::spec::{for_target_arch, Spec};
use std::path::{Path, PathBuf};
use std::process::Command;

const DEMO_C: &str = include_str!("../../examples/demo/demo.c");
const DEMO_UTIL_C: &str = include_str!("../../examples/demo/demo_util.c");
const DEMO_H: &str = include_str!("../../examples/demo/demo.h");

#[derive(clap::Args)]
pub struct DemoArgs {
    /// Trace directory to record into (replaced if it holds an old trace).
    #[arg(short = 'o', long, value_name = "DIR", default_value = "ftramp.data", visible_short_alias = 'd', visible_alias = "dir")]
    output: PathBuf,
    /// Build the demo in DIR and keep it there (default: a scratch
    /// directory removed at the end).
    #[arg(long, value_name = "DIR")]
    build_dir: Option<PathBuf>,
    /// Only build the demo (with --build-dir: to record it yourself).
    #[arg(long, requires = "build_dir")]
    build_only: bool,
    /// Record, but do not replay.
    #[arg(long)]
    no_replay: bool,
}

/// The compiler flags the demo is built with: the host arch's patch-site
/// flags (`ftramp cflags`), without `-fno-ipa-ra` for clang (which has no
/// such flag and does no interprocedural register allocation unless
/// asked), and no sibling calls so that fib's two recursive calls stay
/// calls (gcc turns one into a loop otherwise, and the demo's own counters
/// would no longer match the trace).
pub fn demo_cflags(compiler: &str) -> Result<Vec<String>> {
    let arch = for_target_arch(std::env::consts::ARCH)
        .with_context(|| format!("no arch spec for this machine ({})", std::env::consts::ARCH))?;
    let spec = Spec::builtin(arch)?;
    let mut flags: Vec<String> = ["-O2", "-g"].iter().map(|s| s.to_string()).collect();
    flags.extend(spec.raw.site.flags.split_whitespace().map(String::from));
    if !is_clang(compiler) {
        flags.push("-fno-ipa-ra".into());
    }
    flags.push("-fno-optimize-sibling-calls".into());
    Ok(flags)
}

/// Whether `compiler --version` says clang.
pub(crate) fn is_clang(compiler: &str) -> bool {
    Command::new(compiler)
        .arg("--version")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("clang"))
}

fn cc() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".into())
}

fn run_step(what: &str, cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| {
        format!(
            "{what}: cannot run {:?} (a C compiler is needed: install gcc or set CC)",
            cmd.get_program()
        )
    })?;
    if !status.success() {
        bail!("{what} failed ({status}): {cmd:?}");
    }
    Ok(())
}

/// Writes the demo's sources into `dir` and builds `dir/demo` and
/// `dir/libdemo_util.so`; returns the executable's path.
pub fn build_demo(dir: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for (name, text) in [("demo.c", DEMO_C), ("demo_util.c", DEMO_UTIL_C), ("demo.h", DEMO_H)] {
        let p = dir.join(name);
        std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
    }
    let flags = demo_cflags(&cc())?;
    let lib = dir.join("libdemo_util.so");
    let exe = dir.join("demo");
    run_step(
        "building libdemo_util.so",
        Command::new(cc())
            .args(&flags)
            .args(["-fPIC", "-shared", "-o"])
            .arg(&lib)
            .arg(dir.join("demo_util.c")),
    )?;
    run_step(
        "building demo",
        Command::new(cc())
            .args(&flags)
            .args(["-pthread", "-o"])
            .arg(&exe)
            .arg(dir.join("demo.c"))
            .arg("-L")
            .arg(dir)
            .args(["-ldemo_util", "-Wl,-rpath,$ORIGIN"]),
    )?;
    Ok(exe)
}

/// Removes the scratch build directory when the demo is done.
struct Scratch(Option<PathBuf>);

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Some(d) = &self.0 {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

pub fn run(a: DemoArgs) -> Result<()> {
    let (dir, _scratch) = match &a.build_dir {
        Some(d) => (d.clone(), Scratch(None)),
        None => {
            let d = std::env::temp_dir().join(format!("ftramp-demo-{}", std::process::id()));
            (d.clone(), Scratch(Some(d)))
        }
    };
    let exe = build_demo(&dir)?;
    let me = std::env::current_exe().context("finding the ftramp binary")?;
    let show = |args: &[&std::ffi::OsStr]| {
        let words: Vec<String> = args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        eprintln!("$ ftramp {}", words.join(" "));
    };
    if a.build_only {
        eprintln!(
            "demo built: {} (flags: {})",
            exe.display(),
            demo_cflags(&cc())?.join(" ")
        );
        return Ok(());
    }
    let record: Vec<&std::ffi::OsStr> = vec![
        "record".as_ref(),
        "-o".as_ref(),
        a.output.as_os_str(),
        "--".as_ref(),
        exe.as_os_str(),
    ];
    show(&record);
    run_step("ftramp record", Command::new(&me).args(&record))?;
    if !a.no_replay {
        let replay: Vec<&std::ffi::OsStr> =
            vec!["replay".as_ref(), "-d".as_ref(), a.output.as_os_str()];
        show(&replay);
        run_step("ftramp replay", Command::new(&me).args(&replay))?;
        eprintln!(
            "(the trace stays in {0}: try `ftramp report -d {0}`, `ftramp dump --chrome -d {0}`)",
            a.output.display()
        );
    }
    Ok(())
}
