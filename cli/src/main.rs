//! `ftramp`: generate, list and link ftrace-style trampolines.

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use ftramp_codegen::{arch, header, image::Image, listing, object, spec::Spec, Dispatch, GenOptions, SiteEntry, Tier, Variant};
use std::io::Write as _;
use std::path::PathBuf;

/// `eprintln!` that never panics: with stderr closed (`2>&1 | head` that
/// stopped reading) a message is dropped, and `ftramp record` still exits
/// with the program's status, not a panic's 101.
macro_rules! note {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($t)*);
    }};
}

mod analyze;

mod demo;

mod record;

/// `println!` that ends the program quietly when stdout is closed (a pager
/// or `head` that stopped reading), instead of panicking.
macro_rules! out {
    ($($t:tt)*) => {
        if writeln!(std::io::stdout(), $($t)*).is_err() {
            std::process::exit(0);
        }
    };
}

/// `print!`, likewise.
macro_rules! outp {
    ($($t:tt)*) => {
        if write!(std::io::stdout(), $($t)*).is_err() {
            std::process::exit(0);
        }
    };
}

#[derive(Parser)]
#[command(name = "ftramp", version, about = "Spec-generated ftrace trampolines for user space", long_about = None)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

/// Where the arch spec comes from.
#[derive(clap::Args, Clone)]
struct ArchArgs {
    /// Architecture (see `ftramp archs`).
    #[arg(long, short = 'a', default_value = "x86_64")]
    arch: String,
    /// Use this spec file instead of the built-in `arch-specs/ARCH.toml`.
    #[arg(long, value_name = "FILE")]
    spec: Option<PathBuf>,
}

impl ArchArgs {
    fn load(&self) -> Result<Spec> {
        let spec = match &self.spec {
            Some(p) => {
                let text = std::fs::read_to_string(p).with_context(|| format!("reading spec {}", p.display()))?;
                Spec::parse(&p.display().to_string(), &text)?
            }
            None => Spec::builtin(&self.arch)?,
        };
        arch::lookup(&spec.name)?;
        Ok(spec)
    }
}

/// `--vector-upper`, for the commands that generate trampolines.
#[derive(clap::Args, Clone, Copy)]
struct VectorUpperArg {
    /// Keep the upper halves of the vector registers too (x86_64: `ymm`, for
    /// `__m256` arguments and return values, which AVX code in a callback can
    /// clear); the code then needs a CPU with AVX.  The runtime does this on
    /// its own where the CPU has AVX (see README, "Vector upper halves").
    #[arg(long)]
    vector_upper: bool,
    /// With --vector-upper: keep the bits above the upper halves too (x86_64
    /// AVX-512: bits 256-511 of `zmm`, for `__m512` arguments and return
    /// values; saved only when an upper half is non-zero) and put everything
    /// back with inserts that keep the rest of the register (EVEX
    /// `vinsertf64x4`/`vinsertf32x4`; `vinsertf128` would clear bits
    /// 256-511); the code then needs AVX-512F.  The runtime does this on
    /// its own where the CPU has AVX-512F.
    #[arg(long, requires = "vector_upper")]
    vector_wider: bool,
}

/// The generation options of `ftramp asm` and `ftramp gen`, with
/// `--vector-upper` refused, naming the flag, where the spec has no upper
/// vector bits.
fn gen_options(spec: &Spec, entry: SiteEntry, upper: &VectorUpperArg) -> Result<GenOptions> {
    let VectorUpperArg { vector_upper, vector_wider } = *upper;
    if vector_upper && spec.vector_upper_bytes == 0 {
        bail!(
            "--vector-upper: the {} spec ({}) has no upper vector bits (registers.vector_upper_bytes); only x86_64's has",
            spec.name,
            spec.file
        );
    }
    Ok(GenOptions { entry, vector_upper, vector_wider })
}

#[derive(Subcommand)]
enum Cmd {
    /// List the architectures and trampoline variants this build generates.
    Archs {
        /// Print only the Rust target triples of the available archs (for scripts).
        #[arg(long)]
        rust_targets: bool,
    },
    /// Instructions a traced call executes, per arch and variant: from the
    /// patch site back into the function with an empty callback, along the
    /// common path (every conditional branch taken: they skip the rare
    /// cases, such as an x87 return value to keep).
    Cost,
    /// Print the compiler flags that give a C/C++ file patch sites for ARCH.
    Cflags {
        #[command(flatten)]
        arch: ArchArgs,
        /// Flags for `callsite` dispatch (room for an ops word before each function).
        #[arg(long)]
        callsite: bool,
        /// The compiler the flags are for (default gcc): for clang (a
        /// compiler whose `--version` says so, or whose name contains
        /// "clang"), `-fno-ipa-ra` is left out — clang has no such flag, and
        /// needs none (LLVM allocates registers across functions only when
        /// asked).
        #[arg(long, value_name = "COMPILER", default_value = "gcc")]
        cc: String,
    },
    /// Show generated trampolines: the generator's steps and the bytes
    /// disassembled by capstone, with data-word relocations inline.
    Asm {
        #[command(flatten)]
        arch: ArchArgs,
        /// Variant(s) to show (default: all).  One of: args-list, regs-list,
        /// args-direct, regs-direct, args-callsite, regs-callsite, return,
        /// or args-multiN / regs-multiN (N = 1..8 tracers called in turn).
        #[arg(long, short = 'V', value_name = "VARIANT")]
        variant: Vec<String>,
        /// Show every built-in architecture.
        #[arg(long, conflicts_with = "variant")]
        all: bool,
        /// Show the trampolines as the runtime uses them on archs whose spec sets
        /// `site.stub` (x86_64): sites jump to a per-site stub, the entry
        /// trampolines resume with pop+jmp and `return_to_handler` starts with
        /// `ftrace_call_through` (see README, "Stub entry").
        #[arg(long)]
        stub: bool,
        #[command(flatten)]
        upper: VectorUpperArg,
    },
    /// Run a program and record its function calls into a trace directory
    /// (`ftramp record [options] -- PROG ARGS...`; exits with the program's status).
    ///
    /// Ctrl-C goes to the program; `ftramp record` waits for it to end and
    /// then finishes the trace.  SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1,
    /// SIGUSR2 and SIGALRM sent to `ftramp record`'s pid alone (by a process
    /// outside its process group) are passed on to the program.
    ///
    /// The program runs with the recorder library in `LD_PRELOAD` and its
    /// audit module in `LD_AUDIT` (which starts recording before any
    /// library constructor runs), both found next to this binary or in its
    /// `deps/`; `FTRAMP_PRELOAD` and `FTRAMP_AUDIT` name others
    /// (`FTRAMP_AUDIT=` for no audit module). A program whose libraries
    /// have more initial-exec TLS than glibc keeps spare beside an audit
    /// module (TSan's and LSan's runtimes) also gets a larger
    /// `glibc.rtld.optional_static_tls` in `GLIBC_TUNABLES` while it starts,
    /// and so does each program it starts.
    Record(record::RecordArgs),
    /// Print a recorded trace as a call graph, ftrace `function_graph` style: durations,
    /// indented `{`/`}` per call, one section per process and thread.
    Replay(analyze::ReplayArgs),
    /// Per-function table of a recorded trace: calls, total, self, average and maximum time.
    Report(analyze::ReportArgs),
    /// Write a recorded trace as Chrome trace-event JSON (Perfetto), folded stacks or an
    /// SVG flame graph.
    Dump(analyze::DumpArgs),
    /// Write a relocatable ELF object with the trampolines, or the C header.
    ///
    /// The object exports `ftrace_caller` (args tier, list dispatch),
    /// `ftrace_regs_caller` (regs tier, list dispatch), `return_to_handler`
    /// and the data word `function_trace_op`, and imports only
    /// `ftrace_ops_list_func` and `ftrace_return_to_handler`.
    Gen {
        #[command(flatten)]
        arch: ArchArgs,
        /// Output file (`-` for stdout).
        #[arg(short = 'o', long, value_name = "FILE", required_unless_present = "header")]
        output: Option<PathBuf>,
        /// Print the C header (ftrace_regs/pt_regs layouts and accessors) instead.
        /// With -V it declares exactly the symbols of the object of those
        /// variants; without, those of the default object and of the direct and
        /// callsite variants.
        #[arg(long)]
        header: bool,
        /// Variants to include (default: args-list, regs-list, return).  Direct
        /// variants add the words `ftrace_direct_op` and `ftrace_direct_func`;
        /// `args-multiN` / `regs-multiN` add those plus `ftrace_direct_op_i`
        /// and `ftrace_direct_func_i` for i = 1..N-1.
        #[arg(long, short = 'V', value_name = "VARIANT")]
        variant: Vec<String>,
        /// Prefix for every symbol the object defines (letters, digits and `_`,
        /// not starting with a digit: the header declares the prefixed names).
        #[arg(long, default_value = "")]
        prefix: String,
        #[command(flatten)]
        upper: VectorUpperArg,
    },
    /// Build the bundled C demo (threads, recursion, a shared library) with
    /// this machine's patch-site flags, record it and replay the trace.
    Demo(demo::DemoArgs),
}

fn variants(names: &[String], default: &[Variant]) -> Result<Vec<Variant>> {
    if names.is_empty() {
        return Ok(default.to_vec());
    }
    let mut out = Vec::new();
    for n in names.iter().flat_map(|n| n.split(',')) {
        if n == "all" {
            out.extend(Variant::ALL);
            continue;
        }
        match Variant::parse(n) {
            Some(v) => out.push(v),
            None => bail!(
                "unknown variant `{n}` (known: {}, args-multiN, regs-multiN with N = 1..{}, all)",
                Variant::ALL.iter().map(|v| v.name()).collect::<Vec<_>>().join(", "),
                Variant::MULTI_MAX
            ),
        }
    }
    out.dedup();
    Ok(out)
}

const DEFAULT_OBJECT: [Variant; 3] = [Variant::ALL[0], Variant::ALL[1], Variant::Return];

fn main() {
    // A small stack limit (`ulimit -s 44`) is meant for the program
    // `record` runs, which inherits it: ftramp's own work (clap, the trace
    // reader) then runs on a thread with a stack of its own, 8 MiB mapped
    // when touched.  Until the twenty-eighth session `ftramp --version`
    // overflowed its stack under `ulimit -s 44`.
    if stack_limit() < MIN_STACK {
        let worker = std::thread::Builder::new().name("ftramp".into()).stack_size(8 << 20).spawn(main_on_this_thread);
        match worker.map(|w| w.join()) {
            Ok(Ok(())) => return,
            Ok(Err(_)) => std::process::exit(101),
            // No thread to be had: try on this stack.
            Err(_) => {}
        }
    }
    main_on_this_thread()
}

/// Below this stack limit, [`main`] runs on a thread of its own.
const MIN_STACK: u64 = 1 << 20;

/// The soft `RLIMIT_STACK` (unlimited: `u64::MAX`).
fn stack_limit() -> u64 {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit fills the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_STACK, &mut r) } != 0 {
        return u64::MAX;
    }
    r.rlim_cur
}

fn main_on_this_thread() {
    if let Err(e) = run() {
        // The message and its causes on one line; a bad input is not a
        // crash, so no backtrace even where RUST_BACKTRACE is set.
        note!("Error: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Archs { rust_targets: true } => {
            for b in arch::all() {
                out!("{}", Spec::builtin(b.name())?.raw.arch.rust_target);
            }
        }
        Cmd::Cost => {
            // Every variant, and multi dispatch with two tracers.
            let columns: Vec<Variant> = Variant::ALL.into_iter().chain(Variant::multi(Tier::Args, 2)).collect();
            out!("{:<8} {:>6} {}", "arch", "site", columns.iter().map(|v| format!("{:>14}", v.name())).collect::<String>());
            for b in arch::all() {
                let spec = Spec::builtin(b.name())?;
                let cs = listing::disassembler(&spec)?;
                // The enabled site, assembled for a nearby target.
                let site = b.site_call(0x10_0000, 0x10_1000)?;
                let site_insns = listing::decode(&cs, &site, 0x10_0000).len();
                let mut row = format!("{:<8} {:>6} ", b.name(), site_insns);
                for &v in &columns {
                    let image = Image::generate(&spec, &[v])?;
                    let n = listing::common_path_len(&spec, &listing::decode(&cs, &image.code, 0));
                    // + each callback's `ret` for entry variants; the exit
                    // trampoline is reached by the function's own return.
                    let callbacks = match v {
                        Variant::Return => 0,
                        Variant::Entry { dispatch: Dispatch::Multi(k), .. } => k as usize,
                        Variant::Entry { .. } => 1,
                    };
                    let total = if v == Variant::Return { n + 1 } else { site_insns + n + callbacks };
                    row.push_str(&format!("{total:>14}"));
                }
                out!("{row}");
            }
            out!("(entry variants: site + trampoline + each empty callback's return; `return`: trampoline + the handler's return)");
        }
        Cmd::Cflags { arch: a, callsite, cc } => {
            let spec = a.load()?;
            let site = if callsite { &spec.raw.site.callsite_flags } else { &spec.raw.site.flags };
            if cc.contains("clang") || demo::is_clang(&cc) {
                out!("{site}");
            } else {
                out!("{site} -fno-ipa-ra");
            }
        }
        Cmd::Record(a) => std::process::exit(record::run(a)?),
        Cmd::Replay(a) => analyze::replay(a)?,
        Cmd::Report(a) => analyze::report(a)?,
        Cmd::Dump(a) => analyze::dump(a)?,
        Cmd::Archs { rust_targets: false } => {
            for a in arch::KNOWN {
                match arch::lookup(a) {
                    Ok(_) => {
                        let spec = Spec::builtin(a)?;
                        out!("{a:<8} site: {} ({}), variants: {} args-multiN regs-multiN (N = 1..{})", spec.raw.site.enabled, spec.raw.site.flags,
                            Variant::ALL.iter().map(|v| v.name()).collect::<Vec<_>>().join(" "), Variant::MULTI_MAX);
                    }
                    Err(e) => out!("{a:<8} not available: {e}"),
                }
            }
        }
        Cmd::Asm { arch: a, variant, all, stub, upper } => {
            let specs = if all {
                arch::all().map(|b| Spec::builtin(b.name())).collect::<Result<Vec<_>, _>>()?
            } else {
                vec![a.load()?]
            };
            for spec in specs {
                let vs = variants(&variant, &Variant::ALL)?;
                let entry = if stub { SiteEntry::Stub } else { SiteEntry::Call };
                if stub && !spec.raw.site.stub {
                    if all {
                        continue;
                    }
                    bail!("--stub: the {} spec ({}) has no stub entry (site.stub); only x86_64's has", spec.name, spec.file);
                }
                if all && upper.vector_upper && spec.vector_upper_bytes == 0 {
                    continue;
                }
                let image = Image::generate_opts(&spec, &vs, gen_options(&spec, entry, &upper)?)?;
                out!("==== {} ({}) ====", spec.name, spec.file);
                outp!("{}", listing::image(&spec, &image)?);
            }
        }
        Cmd::Demo(a) => demo::run(a)?,
        Cmd::Gen { arch: a, output, header: want_header, variant, prefix, upper } => {
            let spec = a.load()?;
            // The header declares every prefixed symbol: a prefix that does
            // not make C identifiers gives one that does not compile.
            header::check_prefix(&prefix).map_err(|e| anyhow::anyhow!("--prefix: {e}"))?;
            let bytes = if want_header {
                // With -V: exactly what the object of those variants defines.
                if variant.is_empty() {
                    header::header(&spec, &prefix).into_bytes()
                } else {
                    let vs = variants(&variant, &DEFAULT_OBJECT)?;
                    let image = Image::generate_opts(&spec, &vs, gen_options(&spec, SiteEntry::Call, &upper)?)?;
                    header::header_for(&spec, &prefix, &image).into_bytes()
                }
            } else {
                let vs = variants(&variant, &DEFAULT_OBJECT)?;
                let image = Image::generate_opts(&spec, &vs, gen_options(&spec, SiteEntry::Call, &upper)?)?;
                object::write(&spec, &image, &object::ObjectOptions { prefix })?
            };
            match output.as_deref() {
                None => outp!("{}", String::from_utf8_lossy(&bytes)),
                Some(p) if p.as_os_str() == "-" => {
                    use std::io::Write;
                    std::io::stdout().write_all(&bytes)?;
                }
                Some(p) => std::fs::write(p, &bytes).with_context(|| format!("writing {}", p.display()))?,
            }
        }
    }
    Ok(())
}
