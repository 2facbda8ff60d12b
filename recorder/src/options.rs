//! The recorder's options, read from the environment by the constructor
//! (`ftramp record` sets them; they can be set by hand with
//! `LD_PRELOAD=libftramp_recorder.so`).
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `FTRAMP_RECORD_DIR` | trace directory (must exist: a missing one is reported and the program runs untraced); unset: the library does nothing | — |
//! | `FTRAMP_TRACER` | `function_graph` (entry + exit) or `function` (entries) | `function_graph` |
//! | `FTRAMP_FILTER` | globs/symbols to trace, separated by spaces or `;` | everything |
//! | `FTRAMP_NOTRACE` | globs/symbols not to trace | nothing |
//! | `FTRAMP_DEPTH` | deepest call level recorded (function_graph; 1 = outermost calls) | unlimited |
//! | `FTRAMP_MIN_DURATION` | drop calls shorter than this (`10us`, `2ms`, ns if no unit; function_graph) | 0 |
//! | `FTRAMP_MAIN_ONLY` | `1`: only the main executable's functions | `0` |
//! | `FTRAMP_BUFFER_SIZE` | bytes per thread buffer (`64K`, `1M`; 4K..16M) | `128K` |
//! | `FTRAMP_BUFFERS` | buffers in the pool shared by all threads (2..65536; mapped lazily) | `1024` |
//! | `FTRAMP_CLOCK` | the clock calibration to use (`ftramp_runtime::clock::ENV`) | calibrated |
//! | `FTRAMP_RECORD_PID` | pid of `ftramp record` (its direct child prints build advice) | — |
//! | `FTRAMP_QUIET` | `1`: no notes when all goes well (`ftramp record -q`) | `0` |

pub use ftramp_trace::format::record_env::{
    BUFFERS as ENV_BUFFERS, BUFFER_SIZE as ENV_BUFFER_SIZE, DEFAULT_BUFFERS, DEFAULT_BUFFER_SIZE,
    DEPTH as ENV_DEPTH, DIR as ENV_DIR, FILTER as ENV_FILTER, MAIN_ONLY as ENV_MAIN_ONLY,
    MAX_BUFFERS, MAX_BUFFER_SIZE, MIN_BUFFER_SIZE, MIN_DURATION as ENV_MIN_DURATION,
    NOTRACE as ENV_NOTRACE, QUIET as ENV_QUIET, RECORD_PID as ENV_RECORD_PID, TRACER as ENV_TRACER,
};
pub use ftramp_trace::format::{parse_duration_ns, parse_size};

/// Which events are recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tracer {
    FunctionGraph,
    Function,
}

impl Tracer {
    pub fn name(self) -> &'static str {
        match self {
            Tracer::FunctionGraph => "function_graph",
            Tracer::Function => "function",
        }
    }

    pub fn parse(s: &str) -> Option<Tracer> {
        match s {
            "function_graph" => Some(Tracer::FunctionGraph),
            "function" => Some(Tracer::Function),
            _ => None,
        }
    }
}

/// Everything the environment says.
#[derive(Debug, Clone)]
pub struct Options {
    pub dir: std::path::PathBuf,
    pub tracer: Tracer,
    pub filter: Vec<String>,
    pub notrace: Vec<String>,
    /// Calls at depth >= this are not recorded (`usize::MAX`: no limit).
    pub depth: usize,
    pub min_duration_ns: u64,
    pub main_only: bool,
    pub buffer_size: usize,
    pub buffers: usize,
    pub record_pid: Option<u32>,
    /// No notes when all goes well (`ftramp record -q`).
    pub quiet: bool,
}

/// Splits a filter list: spaces or `;` separate items.
pub fn split_list(s: &str) -> Vec<String> {
    s.split(|c: char| c == ';' || c.is_whitespace())
        .filter(|x| !x.is_empty())
        .map(str::to_string)
        .collect()
}

impl Options {
    /// Reads the options; `Ok(None)` when `FTRAMP_RECORD_DIR` is unset (not
    /// recording); `Err` names the bad variable and value.
    pub fn from_env() -> Result<Option<Options>, String> {
        let get = |k: &str| ftramp_runtime::env::var(k).filter(|v| !v.is_empty());
        let Some(dir) = ftramp_runtime::env::var_os(ENV_DIR).filter(|v| !v.is_empty()) else {
            return Ok(None);
        };
        if !std::path::Path::new(&dir).is_dir() {
            return Err(format!(
                "{ENV_DIR}={}: not a directory (it must exist; `ftramp record` creates it)",
                std::path::Path::new(&dir).display()
            ));
        }
        let tracer = match get(ENV_TRACER) {
            None => Tracer::FunctionGraph,
            Some(t) => Tracer::parse(&t)
                .ok_or_else(|| format!("{ENV_TRACER}={t}: expected function_graph or function"))?,
        };
        let depth = match get(ENV_DEPTH) {
            None => usize::MAX,
            Some(d) => match d.parse::<usize>() {
                Ok(n) if n > 0 => n,
                _ => return Err(format!("{ENV_DEPTH}={d}: expected a number >= 1")),
            },
        };
        let min_duration_ns = match get(ENV_MIN_DURATION) {
            None => 0,
            Some(d) => parse_duration_ns(&d).map_err(|e| format!("{ENV_MIN_DURATION}={d}: {e}"))?,
        };
        let buffer_size = match get(ENV_BUFFER_SIZE) {
            None => DEFAULT_BUFFER_SIZE,
            Some(s) => {
                let n = parse_size(&s).map_err(|e| format!("{ENV_BUFFER_SIZE}={s}: {e}"))?;
                if !(MIN_BUFFER_SIZE as u64..=MAX_BUFFER_SIZE as u64).contains(&n) {
                    return Err(format!("{ENV_BUFFER_SIZE}={s}: must be between 4K and 16M"));
                }
                n as usize
            }
        };
        let buffers = match get(ENV_BUFFERS) {
            None => DEFAULT_BUFFERS,
            Some(s) => match s.parse::<usize>() {
                Ok(n) if (2..=MAX_BUFFERS).contains(&n) => n,
                _ => {
                    return Err(format!(
                        "{ENV_BUFFERS}={s}: expected a number between 2 and 65536"
                    ))
                }
            },
        };
        let main_only = match get(ENV_MAIN_ONLY).as_deref() {
            None | Some("0") => false,
            Some("1") => true,
            Some(v) => return Err(format!("{ENV_MAIN_ONLY}={v}: expected 0 or 1")),
        };
        Ok(Some(Options {
            // Absolute: the program may change its directory, and the files
            // are reopened by path (`tracefile.rs`).  Not by `canonicalize`:
            // its `realpath` allocates with the program's `malloc` and frees
            // with its `free`, before the program's constructors (until the
            // twenty-eighth session); `getcwd` here fills a buffer of ours.
            dir: absolute(dir),
            tracer,
            filter: get(ENV_FILTER).map(|s| split_list(&s)).unwrap_or_default(),
            notrace: get(ENV_NOTRACE).map(|s| split_list(&s)).unwrap_or_default(),
            depth,
            min_duration_ns,
            main_only,
            buffer_size,
            buffers,
            record_pid: get(ENV_RECORD_PID).and_then(|p| p.parse().ok()),
            quiet: get(ENV_QUIET).as_deref() == Some("1"),
        }))
    }
}

/// `dir` made absolute against the working directory (left as it is if
/// that cannot be read).
fn absolute(dir: std::ffi::OsString) -> std::path::PathBuf {
    let dir = std::path::PathBuf::from(dir);
    if dir.is_absolute() {
        return dir;
    }
    std::env::current_dir().map(|cwd| cwd.join(&dir)).unwrap_or(dir)
}
