//! Trace directory format v2: the contract between the recorder (`ftramp record`,
//! the LD_PRELOAD library) and the readers (`ftramp replay|report|dump`).
//!
//! ```text
//! <dir>/                      default ftramp.data
//!   info                      TOML: version = 2, tracer, command, clock, options; at the
//!                             end of the run `[calibration]` (ticks_per_sec, base_ticks,
//!                             base_ns), which readers use for every process when present
//!   task-<pid>-<n>.info       TOML per process image (n = 0 for the first image of a pid,
//!                             +1 after each exec); `lost = N`, `end_ticks = T` (when
//!                             the image ended), `unwritten = [[tid, chunks, events]...]`
//!                             (threads whose last chunks could not be written: a full
//!                             disk) and `exit = "..."` appended at its end
//!   task-<pid>-<n>.sym        one function per line, appended as modules load:
//!                             `<id> <addr hex> <size dec or 0> <symbol> <module path>`
//!   task-<pid>-<n>.dat        a sequence of chunks, little-endian
//! ```
//!
//! A chunk is a 32-byte header followed by `len` bytes of events:
//!
//! ```text
//!  off size field
//!   0   4   magic   "FTRC"
//!   4   2   version 2 (readers also take 1, which has no LEAF)
//!   6   2   flags   bit0 LAST (thread exited), bit1 FLUSH (written by a crash/exit flush)
//!   8   4   tid
//!  12   4   seq     per-thread chunk counter from 0 (a gap = chunks lost)
//!  16   4   len     payload bytes after the header (multiple of 8, <= 16 MiB)
//!  20   4   lost    events lost on this thread since its previous chunk (buffers
//!                     full, or in the chunks a gap in seq skips, whose write failed)
//!  24   8   time    absolute ticks; the first event's delta is relative to it
//! ```
//!
//! Each event is one u64 (EXTENDED events take a second u64):
//!
//! ```text
//!  63                               32 31                            2 1  0
//! +-----------------------------------+-------------------------------+----+
//! | delta ticks since previous event  |  function id (.sym index)     |kind|  ENTRY 0 / EXIT 1
//! +-----------------+-----------------+-------------------------------+----+
//! | duration ticks  | delta ticks     |  function id (.sym index)     | 3  |  LEAF
//! +-----------------+-----------------+-------------------------------+----+
//! |             zero                           | sub-kind (bits 2-7)  | 2  |  EXTENDED
//! +--------------------------------------------+----------------------+----+
//! |      next word: TIME = new absolute ticks, LOST = events lost here     |
//! +------------------------------------------------------------------------+
//! ```
//!
//! A LEAF is a call with no event inside it, in one word: its ENTRY `delta` ticks after
//! the previous event and its EXIT `duration` ticks after that (both under 2^16; the
//! running clock is then at the EXIT). The recorder writes the ENTRY at the entry and, when
//! the EXIT finds that ENTRY still the thread's last word with both times small enough,
//! turns it into the LEAF in place; otherwise it writes an EXIT. Leaf calls are usually
//! most calls (3 of the 5 per iteration in the record benchmark's tracee, which records
//! 11.2 bytes per call instead of 16).
//!
//! A TIME event resets the running clock: later deltas are relative to its ticks. It is used
//! when a delta does not fit 32 bits. function_graph writes ENTRY and EXIT (16 bytes per
//! call), function writes ENTRY only. With a minimum duration the ENTRY of a call is written
//! at its exit (with its original time, after the pending ENTRYs of its ancestors), so
//! ENTRY/EXIT order and nesting stay valid.
//!
//! `.sym` lines: the symbol is the raw (mangled) ELF name, which has no spaces; the module
//! path is the rest of the line and may contain spaces. `?` stands for an unknown symbol.

use std::fmt;

/// Format version written into every chunk header and into `info`.
pub const VERSION: u16 = 2;
/// The oldest chunk version readers take (v1 is v2 without LEAF events).
pub const MIN_VERSION: u16 = 1;
/// First four bytes of every chunk.
pub const CHUNK_MAGIC: [u8; 4] = *b"FTRC";
/// Size of [`ChunkHeader`] on disk.
pub const CHUNK_HEADER_SIZE: usize = 32;
/// Largest payload of one chunk.
pub const MAX_CHUNK_PAYLOAD: u32 = 16 << 20;
/// Size of one event word.
pub const EVENT_SIZE: usize = 8;

/// Chunk flag: the last chunk of its thread (the thread exited).
pub const FLAG_LAST: u16 = 1 << 0;
/// Chunk flag: written by a crash or exit flush rather than the writer thread.
pub const FLAG_FLUSH: u16 = 1 << 1;
/// Flags a v1 reader understands; others are reported as an error.
pub const KNOWN_FLAGS: u16 = FLAG_LAST | FLAG_FLUSH;

/// Event kind in bits 0-1.
pub const KIND_ENTRY: u64 = 0;
pub const KIND_EXIT: u64 = 1;
pub const KIND_EXTENDED: u64 = 2;
pub const KIND_LEAF: u64 = 3;
const KIND_MASK: u64 = 0b11;

/// EXTENDED sub-kinds (bits 2-7).
pub const EXT_TIME: u64 = 1;
pub const EXT_LOST: u64 = 2;
const EXT_SHIFT: u32 = 2;
const EXT_MASK: u64 = 0x3f;

const FUNC_SHIFT: u32 = 2;
/// Largest function id an ENTRY/EXIT can carry (30 bits).
pub const MAX_FUNC_ID: u32 = (1 << 30) - 1;
/// An EXIT with this function id (the largest, never given to a function)
/// says that the thread's innermost open call was left without returning
/// (`longjmp`, an exception or a panic unwinding it) by the time of the
/// event: the recorder learns it at the thread's next traced entry or
/// return (fgraph drops such frames) and writes one per call left.
pub const UNWOUND_FUNC: u32 = MAX_FUNC_ID;
const DELTA_SHIFT: u32 = 32;
const LEAF_DURATION_SHIFT: u32 = 48;
/// Largest entry delta and duration a LEAF can carry.
pub const LEAF_MAX: u64 = 0xffff;
/// Largest delta an ENTRY/EXIT can carry; larger gaps need a TIME event first.
pub const MAX_DELTA: u64 = u32::MAX as u64;

/// Why bytes are not a valid chunk header or event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FormatError {
    BadMagic([u8; 4]),
    BadVersion(u16),
    UnknownFlags(u16),
    BadLength(u32),
    /// A LEAF of [`UNWOUND_FUNC`], which closes calls and cannot be one.
    BadLeaf(u64),
    /// EXTENDED event with an unknown sub-kind or non-zero reserved bits.
    BadExtended(u64),
    /// EXTENDED event whose second word is missing (end of payload).
    TruncatedExtended(u64),
}

impl fmt::Display for FormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FormatError::BadMagic(m) => {
                write!(f, "bad chunk magic {:02x?} (expected \"FTRC\")", m)
            }
            FormatError::BadVersion(v) => {
                write!(
                    f,
                    "unsupported chunk version {v} (this reader knows {MIN_VERSION} to {VERSION})"
                )
            }
            FormatError::UnknownFlags(fl) => write!(f, "unknown chunk flags {fl:#06x}"),
            FormatError::BadLength(len) => write!(
                f,
                "bad chunk length {len} (must be a multiple of 8, at most {MAX_CHUNK_PAYLOAD})"
            ),
            FormatError::BadLeaf(w) => {
                write!(f, "LEAF event of the unwound marker in word {w:#018x}")
            }
            FormatError::BadExtended(w) => write!(f, "bad extended event {w:#018x}"),
            FormatError::TruncatedExtended(w) => {
                write!(f, "extended event {w:#018x} without its second word")
            }
        }
    }
}

impl std::error::Error for FormatError {}

/// The 32-byte header in front of every chunk's payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ChunkHeader {
    pub flags: u16,
    pub tid: u32,
    pub seq: u32,
    /// Payload bytes after the header.
    pub len: u32,
    /// Events lost on this thread since its previous chunk.
    pub lost: u32,
    /// Absolute ticks; the first event's delta is relative to it.
    pub time: u64,
}

impl ChunkHeader {
    /// The on-disk bytes (magic and version included).
    pub fn encode(&self) -> [u8; CHUNK_HEADER_SIZE] {
        let mut b = [0u8; CHUNK_HEADER_SIZE];
        b[0..4].copy_from_slice(&CHUNK_MAGIC);
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        b[6..8].copy_from_slice(&self.flags.to_le_bytes());
        b[8..12].copy_from_slice(&self.tid.to_le_bytes());
        b[12..16].copy_from_slice(&self.seq.to_le_bytes());
        b[16..20].copy_from_slice(&self.len.to_le_bytes());
        b[20..24].copy_from_slice(&self.lost.to_le_bytes());
        b[24..32].copy_from_slice(&self.time.to_le_bytes());
        b
    }

    /// Parses and checks a header: magic, version, known flags, length.
    pub fn decode(b: &[u8; CHUNK_HEADER_SIZE]) -> Result<ChunkHeader, FormatError> {
        let magic: [u8; 4] = [b[0], b[1], b[2], b[3]];
        if magic != CHUNK_MAGIC {
            return Err(FormatError::BadMagic(magic));
        }
        let version = u16::from_le_bytes([b[4], b[5]]);
        if !(MIN_VERSION..=VERSION).contains(&version) {
            return Err(FormatError::BadVersion(version));
        }
        let flags = u16::from_le_bytes([b[6], b[7]]);
        if flags & !KNOWN_FLAGS != 0 {
            return Err(FormatError::UnknownFlags(flags));
        }
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let len = u32_at(16);
        if len % EVENT_SIZE as u32 != 0 || len > MAX_CHUNK_PAYLOAD {
            return Err(FormatError::BadLength(len));
        }
        let mut t = [0u8; 8];
        t.copy_from_slice(&b[24..32]);
        Ok(ChunkHeader {
            flags,
            tid: u32_at(8),
            seq: u32_at(12),
            len,
            lost: u32_at(20),
            time: u64::from_le_bytes(t),
        })
    }

    pub fn is_last(&self) -> bool {
        self.flags & FLAG_LAST != 0
    }

    pub fn is_flush(&self) -> bool {
        self.flags & FLAG_FLUSH != 0
    }
}

/// One decoded event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A function was entered `delta` ticks after the previous event.
    Entry { func: u32, delta: u32 },
    /// A function returned `delta` ticks after the previous event.
    Exit { func: u32, delta: u32 },
    /// A function was entered `delta` ticks after the previous event and
    /// returned `duration` ticks later, with no event in between.
    Leaf { func: u32, delta: u16, duration: u16 },
    /// The running clock is now `ticks` (absolute).
    Time { ticks: u64 },
    /// `count` events were lost at this point.
    Lost { count: u64 },
}

impl Event {
    /// The ENTRY word. `func` must be at most [`MAX_FUNC_ID`] (higher bits are dropped).
    #[inline(always)]
    pub const fn entry(func: u32, delta: u32) -> u64 {
        KIND_ENTRY | (((func & MAX_FUNC_ID) as u64) << FUNC_SHIFT) | ((delta as u64) << DELTA_SHIFT)
    }

    /// The EXIT word. `func` must be at most [`MAX_FUNC_ID`] (higher bits are dropped).
    #[inline(always)]
    pub const fn exit(func: u32, delta: u32) -> u64 {
        KIND_EXIT | (((func & MAX_FUNC_ID) as u64) << FUNC_SHIFT) | ((delta as u64) << DELTA_SHIFT)
    }

    /// The LEAF word. `func` must be at most [`MAX_FUNC_ID`] (higher bits are dropped).
    #[inline(always)]
    pub const fn leaf(func: u32, delta: u16, duration: u16) -> u64 {
        Event::leaf_from_entry(Event::entry(func, delta as u32), duration as u64)
    }

    /// The ENTRY word `entry`, whose delta is at most [`LEAF_MAX`], made
    /// the LEAF of a call that returned `duration` (at most [`LEAF_MAX`])
    /// ticks after it.
    #[inline(always)]
    pub const fn leaf_from_entry(entry: u64, duration: u64) -> u64 {
        entry | KIND_LEAF | duration << LEAF_DURATION_SHIFT
    }

    /// The EXIT word that closes the innermost open call as unwound
    /// ([`UNWOUND_FUNC`]).
    #[inline(always)]
    pub const fn unwound(delta: u32) -> u64 {
        Event::exit(UNWOUND_FUNC, delta)
    }

    /// The two words of an EXTENDED TIME event.
    #[inline(always)]
    pub const fn time(ticks: u64) -> [u64; 2] {
        [KIND_EXTENDED | (EXT_TIME << EXT_SHIFT), ticks]
    }

    /// The two words of an EXTENDED LOST event.
    #[inline(always)]
    pub const fn lost(count: u64) -> [u64; 2] {
        [KIND_EXTENDED | (EXT_LOST << EXT_SHIFT), count]
    }

    /// Number of u64 words this event takes.
    pub const fn words(&self) -> usize {
        match self {
            Event::Entry { .. } | Event::Exit { .. } | Event::Leaf { .. } => 1,
            Event::Time { .. } | Event::Lost { .. } => 2,
        }
    }

    /// Appends the event's words to `out`. Function ids above [`MAX_FUNC_ID`] are
    /// truncated; callers keep ids dense so this does not happen in practice.
    pub fn encode_into(&self, out: &mut Vec<u64>) {
        match *self {
            Event::Entry { func, delta } => out.push(Event::entry(func, delta)),
            Event::Exit { func, delta } => out.push(Event::exit(func, delta)),
            Event::Leaf {
                func,
                delta,
                duration,
            } => out.push(Event::leaf(func, delta, duration)),
            Event::Time { ticks } => out.extend_from_slice(&Event::time(ticks)),
            Event::Lost { count } => out.extend_from_slice(&Event::lost(count)),
        }
    }

    /// Decodes the event at the start of `words`; returns it and the number of words used.
    /// `None` when `words` is empty.
    pub fn decode(words: &[u64]) -> Option<Result<(Event, usize), FormatError>> {
        let &w = words.first()?;
        let func = ((w >> FUNC_SHIFT) as u32) & MAX_FUNC_ID;
        let delta = (w >> DELTA_SHIFT) as u32;
        Some(match w & KIND_MASK {
            KIND_ENTRY => Ok((Event::Entry { func, delta }, 1)),
            KIND_EXIT => Ok((Event::Exit { func, delta }, 1)),
            KIND_EXTENDED => {
                if w >> 8 != 0 {
                    return Some(Err(FormatError::BadExtended(w)));
                }
                let Some(&arg) = words.get(1) else {
                    return Some(Err(FormatError::TruncatedExtended(w)));
                };
                match (w >> EXT_SHIFT) & EXT_MASK {
                    EXT_TIME => Ok((Event::Time { ticks: arg }, 2)),
                    EXT_LOST => Ok((Event::Lost { count: arg }, 2)),
                    _ => Err(FormatError::BadExtended(w)),
                }
            }
            _ if func == UNWOUND_FUNC => Err(FormatError::BadLeaf(w)),
            _ => Ok((
                Event::Leaf {
                    func,
                    delta: delta as u16,
                    duration: (w >> LEAF_DURATION_SHIFT) as u16,
                },
                1,
            )),
        })
    }
}

/// Iterates over the events of a chunk payload (little-endian bytes). Yields
/// `(word offset, result)`; after an error it stops.
pub struct Events<'a> {
    bytes: &'a [u8],
    pos: usize,
    done: bool,
}

/// Events of a payload; a trailing partial word (len not a multiple of 8) is ignored.
pub fn events(payload: &[u8]) -> Events<'_> {
    Events {
        bytes: payload,
        pos: 0,
        done: false,
    }
}

impl Iterator for Events<'_> {
    /// Byte offset of the event inside the payload and the decoded event.
    type Item = (usize, Result<Event, FormatError>);

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let word_at = |p: usize| -> Option<u64> {
            let b = self.bytes.get(p..p + EVENT_SIZE)?;
            let mut a = [0u8; 8];
            a.copy_from_slice(b);
            Some(u64::from_le_bytes(a))
        };
        let first = word_at(self.pos)?;
        let mut pair = [first, 0];
        let have = match word_at(self.pos + EVENT_SIZE) {
            Some(second) => {
                pair[1] = second;
                2
            }
            None => 1,
        };
        let at = self.pos;
        match Event::decode(&pair[..have])? {
            Ok((ev, n)) => {
                self.pos += n * EVENT_SIZE;
                Some((at, Ok(ev)))
            }
            Err(e) => {
                self.done = true;
                Some((at, Err(e)))
            }
        }
    }
}

/// The function entries and exits a payload holds (a LEAF is two; TIME and
/// LOST are none), up to its first damaged word.  No allocation (the
/// recorder counts the events of a chunk it could not write, also in a
/// signal handler).
pub fn count_events(payload: &[u8]) -> u64 {
    events(payload)
        .map_while(|(_, e)| e.ok())
        .map(|e| match e {
            Event::Entry { .. } | Event::Exit { .. } => 1,
            Event::Leaf { .. } => 2,
            Event::Time { .. } | Event::Lost { .. } => 0,
        })
        .sum()
}

/// Events as u64 words → little-endian payload bytes.
pub fn words_to_bytes(words: &[u64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(words.len() * EVENT_SIZE);
    for w in words {
        out.extend_from_slice(&w.to_le_bytes());
    }
    out
}

/// One line of a `.sym` file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SymLine {
    pub id: u32,
    pub addr: u64,
    pub size: u64,
    /// Raw ELF symbol name, `?` when unknown.
    pub symbol: String,
    pub module: String,
}

impl SymLine {
    /// The line without its newline: `<id> <addr hex> <size> <symbol> <module>`.
    pub fn to_line(&self) -> String {
        let sym = if self.symbol.is_empty() || self.symbol.contains(char::is_whitespace) {
            // A name with spaces would shift the module column; v1 keeps one token.
            self.symbol.replace(char::is_whitespace, "_")
        } else {
            self.symbol.clone()
        };
        let sym = if sym.is_empty() { "?".to_string() } else { sym };
        format!(
            "{} {:x} {} {} {}",
            self.id, self.addr, self.size, sym, self.module
        )
    }

    /// Parses one line (trailing newline allowed). The error says which field is bad.
    pub fn parse(line: &str) -> Result<SymLine, String> {
        let line = line.trim_end_matches(['\n', '\r']);
        let mut it = line.splitn(5, ' ');
        let mut field = |name: &str| {
            it.next()
                .filter(|s| !s.is_empty())
                .ok_or_else(|| format!("missing {name} field"))
        };
        let id = field("id")?;
        let addr = field("address")?;
        let size = field("size")?;
        let symbol = field("symbol")?.to_string();
        let module = it_rest(field("module"));
        let id = id.parse::<u32>().map_err(|_| format!("bad id {id:?}"))?;
        let addr = u64::from_str_radix(addr, 16).map_err(|_| format!("bad address {addr:?}"))?;
        let size = size
            .parse::<u64>()
            .map_err(|_| format!("bad size {size:?}"))?;
        Ok(SymLine {
            id,
            addr,
            size,
            symbol,
            module,
        })
    }
}

fn it_rest(r: Result<&str, String>) -> String {
    r.map(str::to_string).unwrap_or_default()
}

/// File name of a process image's files: `task-<pid>-<n>.<ext>`.
pub fn task_file_name(pid: u32, image: u32, ext: &str) -> String {
    format!("task-{pid}-{image}.{ext}")
}

/// Parses `task-<pid>-<n>.<ext>` into (pid, n, ext).
pub fn parse_task_file_name(name: &str) -> Option<(u32, u32, &str)> {
    let rest = name.strip_prefix("task-")?;
    let (stem, ext) = rest.split_once('.')?;
    let (pid, n) = stem.split_once('-')?;
    Some((pid.parse().ok()?, n.parse().ok()?, ext))
}

// ---------------------------------------------------------------------------
// Option values as `ftramp record` passes them to the recorder (environment)
// and writes them into `info`: sizes and durations with units.

/// `64K`, `1M`, `4096`, `2G` (K/M/G are powers of 1024; a trailing `B`/`iB`
/// is allowed) → bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    let (num, mul) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let mul = match c.to_ascii_uppercase() {
                'K' => 1u64 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                _ => return Err(format!("unknown size unit `{c}` in `{s}` (use K, M or G)")),
            };
            (&t[..i], mul)
        }
        _ => (t, 1),
    };
    let n: u64 = num
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a size (e.g. 4096, 64K, 1M)"))?;
    n.checked_mul(mul)
        .ok_or_else(|| format!("size `{s}` is too large"))
}

/// `10us`, `1.5ms`, `2s`, `500ns`, `250` (ns) → nanoseconds.
pub fn parse_duration_ns(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| c.is_ascii_alphabetic() || c == 'µ')
        .unwrap_or(t.len());
    let (num, unit) = (t[..split].trim(), t[split..].trim());
    let mul: f64 = match unit {
        "" | "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" | "sec" => 1e9,
        _ => {
            return Err(format!(
                "unknown time unit `{unit}` in `{s}` (use ns, us, ms or s)"
            ))
        }
    };
    let n: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a duration (e.g. 10us, 1.5ms)"))?;
    if !n.is_finite() || n < 0.0 || n * mul > u64::MAX as f64 {
        return Err(format!("duration `{s}` is out of range"));
    }
    Ok((n * mul).round() as u64)
}

/// The environment `ftramp record` passes to the recorder library (see the
/// recorder's `options` module for what each means).
pub mod record_env {
    pub const DIR: &str = "FTRAMP_RECORD_DIR";
    pub const TRACER: &str = "FTRAMP_TRACER";
    pub const FILTER: &str = "FTRAMP_FILTER";
    pub const NOTRACE: &str = "FTRAMP_NOTRACE";
    pub const DEPTH: &str = "FTRAMP_DEPTH";
    pub const MIN_DURATION: &str = "FTRAMP_MIN_DURATION";
    pub const MAIN_ONLY: &str = "FTRAMP_MAIN_ONLY";
    pub const BUFFER_SIZE: &str = "FTRAMP_BUFFER_SIZE";
    pub const BUFFERS: &str = "FTRAMP_BUFFERS";
    pub const RECORD_PID: &str = "FTRAMP_RECORD_PID";
    pub const QUIET: &str = "FTRAMP_QUIET";

    pub const DEFAULT_BUFFER_SIZE: usize = 128 << 10;
    pub const MIN_BUFFER_SIZE: usize = 4 << 10;
    pub const MAX_BUFFER_SIZE: usize = 16 << 20;
    pub const DEFAULT_BUFFERS: usize = 1024;
    pub const MAX_BUFFERS: usize = 65536;
}

/// What to say when a program has no patch sites: `site_flags` are the
/// host arch's (`ftramp cflags`).
pub fn no_sites_advice(exe: &str, site_flags: &str) -> String {
    let n = site_flags
        .split('=')
        .nth(1)
        .and_then(|v| v.split([',', ' ']).next())
        .unwrap_or("5");
    format!(
        "{exe} has no patchable function entries, so nothing in it is traced. Build C/C++ with \
         `{site_flags} -fno-ipa-ra` (`ftramp cflags`; clang: without -fno-ipa-ra, \
         `ftramp cflags --cc clang`); Rust (nightly) with \
         RUSTFLAGS=\"-Z patchable-function-entry={n}\""
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("64k"), Ok(65536));
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size("2GB"), Ok(2 << 30));
        assert!(parse_size("12Q").unwrap_err().contains("unit"));
        assert!(parse_size("abc").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999999999999G").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration_ns("250"), Ok(250));
        assert_eq!(parse_duration_ns("10us"), Ok(10_000));
        assert_eq!(parse_duration_ns("1.5ms"), Ok(1_500_000));
        assert_eq!(parse_duration_ns("2s"), Ok(2_000_000_000));
        assert_eq!(parse_duration_ns("7 ns"), Ok(7));
        assert!(parse_duration_ns("5h").unwrap_err().contains("unit"));
        assert!(parse_duration_ns("-1us").is_err());
        assert!(parse_duration_ns("us").is_err());
    }

    #[test]
    fn header_round_trip_extremes() {
        for h in [
            ChunkHeader::default(),
            ChunkHeader {
                flags: KNOWN_FLAGS,
                tid: u32::MAX,
                seq: u32::MAX,
                len: MAX_CHUNK_PAYLOAD,
                lost: u32::MAX,
                time: u64::MAX,
            },
            ChunkHeader {
                flags: FLAG_LAST,
                tid: 7,
                seq: 3,
                len: 64,
                lost: 1,
                time: 1 << 40,
            },
        ] {
            let b = h.encode();
            assert_eq!(&b[0..4], b"FTRC");
            assert_eq!(u16::from_le_bytes([b[4], b[5]]), 2);
            assert_eq!(ChunkHeader::decode(&b), Ok(h));
        }
    }

    #[test]
    fn header_field_offsets() {
        let h = ChunkHeader {
            flags: 0x0102,
            tid: 0x0304_0506,
            seq: 0x0708_090a,
            len: 0x10,
            lost: 0x1112_1314,
            time: 0x1516_1718_191a_1b1c,
        };
        let b = h.encode();
        assert_eq!(b[6..8], [0x02, 0x01]);
        assert_eq!(b[8..12], [0x06, 0x05, 0x04, 0x03]);
        assert_eq!(b[12..16], [0x0a, 0x09, 0x08, 0x07]);
        assert_eq!(b[16..20], [0x10, 0, 0, 0]);
        assert_eq!(b[20..24], [0x14, 0x13, 0x12, 0x11]);
        assert_eq!(b[24..32], [0x1c, 0x1b, 0x1a, 0x19, 0x18, 0x17, 0x16, 0x15]);
    }

    #[test]
    fn header_rejects_bad_input() {
        let good = ChunkHeader {
            len: 8,
            ..Default::default()
        }
        .encode();
        let mut b = good;
        b[0] = b'X';
        assert!(matches!(
            ChunkHeader::decode(&b),
            Err(FormatError::BadMagic(_))
        ));
        let mut b = good;
        b[4] = 3;
        assert_eq!(ChunkHeader::decode(&b), Err(FormatError::BadVersion(3)));
        let mut b = good;
        b[4] = 0;
        assert_eq!(ChunkHeader::decode(&b), Err(FormatError::BadVersion(0)));
        // Version 1 (no LEAF events yet) is still read.
        let mut b = good;
        b[4] = 1;
        assert_eq!(ChunkHeader::decode(&b).map(|h| h.len), Ok(8));
        let mut b = good;
        b[6] = 0x04;
        assert_eq!(ChunkHeader::decode(&b), Err(FormatError::UnknownFlags(4)));
        let mut b = good;
        b[16] = 9;
        assert_eq!(ChunkHeader::decode(&b), Err(FormatError::BadLength(9)));
        let b = ChunkHeader {
            len: MAX_CHUNK_PAYLOAD + 8,
            ..Default::default()
        }
        .encode();
        assert!(matches!(
            ChunkHeader::decode(&b),
            Err(FormatError::BadLength(_))
        ));
    }

    #[test]
    fn event_round_trip_extremes() {
        let evs = [
            Event::Entry { func: 0, delta: 0 },
            Event::Entry {
                func: MAX_FUNC_ID,
                delta: u32::MAX,
            },
            Event::Exit {
                func: MAX_FUNC_ID,
                delta: u32::MAX,
            },
            Event::Exit {
                func: 12345,
                delta: 1,
            },
            Event::Time { ticks: u64::MAX },
            Event::Time { ticks: 0 },
            Event::Lost { count: u64::MAX },
            Event::Lost { count: 1 },
            Event::Leaf {
                func: 0,
                delta: 0,
                duration: 0,
            },
            Event::Leaf {
                func: MAX_FUNC_ID - 1,
                delta: u16::MAX,
                duration: u16::MAX,
            },
            Event::Leaf {
                func: 7,
                delta: 0x1234,
                duration: 0x8001,
            },
        ];
        let mut words = Vec::new();
        for e in &evs {
            e.encode_into(&mut words);
        }
        assert_eq!(words.len(), evs.iter().map(Event::words).sum::<usize>());
        let bytes = words_to_bytes(&words);
        let got: Vec<Event> = events(&bytes).map(|(_, r)| r.unwrap()).collect();
        assert_eq!(got, evs);
    }

    #[test]
    fn event_bit_layout() {
        assert_eq!(Event::entry(1, 0), 1 << 2);
        assert_eq!(Event::exit(0, 1), 1 | (1 << 32));
        assert_eq!(Event::time(5), [2 | (1 << 2), 5]);
        assert_eq!(Event::lost(5), [2 | (2 << 2), 5]);
        // An id above 30 bits does not spill into the delta.
        assert_eq!(Event::entry(u32::MAX, 0) >> 32, 0);
        assert_eq!(Event::leaf(1, 2, 3), 3 | 1 << 2 | 2 << 32 | 3 << 48);
        // The recorder's in-place LEAF: its ENTRY word with the kind and duration added.
        assert_eq!(
            Event::leaf_from_entry(Event::entry(9, LEAF_MAX as u32), LEAF_MAX),
            Event::leaf(9, u16::MAX, u16::MAX)
        );
    }

    #[test]
    fn event_decode_errors() {
        assert_eq!(Event::decode(&[]), None);
        let unwound_leaf = Event::leaf(UNWOUND_FUNC, 1, 1);
        assert_eq!(
            Event::decode(&[unwound_leaf]),
            Some(Err(FormatError::BadLeaf(unwound_leaf)))
        );
        let bad_sub = 2 | (9 << 2);
        assert_eq!(
            Event::decode(&[bad_sub, 0]),
            Some(Err(FormatError::BadExtended(bad_sub)))
        );
        let reserved = Event::time(0)[0] | (1 << 8);
        assert_eq!(
            Event::decode(&[reserved, 0]),
            Some(Err(FormatError::BadExtended(reserved)))
        );
        let t = Event::time(0)[0];
        assert_eq!(
            Event::decode(&[t]),
            Some(Err(FormatError::TruncatedExtended(t)))
        );
        // The iterator reports the offset and stops after an error.
        let bytes = words_to_bytes(&[Event::entry(1, 2), bad_sub, 0, Event::entry(1, 2)]);
        let got: Vec<_> = events(&bytes).collect();
        assert_eq!(got.len(), 2);
        assert_eq!(got[1], (8, Err(FormatError::BadExtended(bad_sub))));
    }

    #[test]
    fn events_are_counted_with_a_leaf_as_two() {
        let words = [
            Event::entry(1, 0),
            Event::leaf(2, 3, 4),
            Event::time(9)[0],
            Event::time(9)[1],
            Event::exit(1, 5),
            Event::lost(7)[0],
            Event::lost(7)[1],
            Event::leaf(2, 0, 0),
        ];
        assert_eq!(count_events(&words_to_bytes(&words)), 6);
        // Up to the damage only.
        let damaged = [Event::entry(1, 0), Event::leaf(UNWOUND_FUNC, 0, 0), Event::exit(1, 0)];
        assert_eq!(count_events(&words_to_bytes(&damaged)), 1);
    }

    #[test]
    fn sym_line_round_trip() {
        let l = SymLine {
            id: 42,
            addr: 0x7f00_1234_5678,
            size: 0,
            symbol: "_ZN3foo3barEv".into(),
            module: "/tmp/dir with space/libx.so".into(),
        };
        let text = l.to_line();
        assert_eq!(
            text,
            "42 7f0012345678 0 _ZN3foo3barEv /tmp/dir with space/libx.so"
        );
        assert_eq!(SymLine::parse(&format!("{text}\n")), Ok(l));
        assert!(SymLine::parse("x 0 0 f m").unwrap_err().contains("id"));
        assert!(SymLine::parse("1 zz 0 f m")
            .unwrap_err()
            .contains("address"));
        assert!(SymLine::parse("1 0").unwrap_err().contains("size"));
        let spaced = SymLine {
            symbol: "a b".into(),
            ..SymLine::parse("1 0 0 f m").unwrap()
        };
        assert_eq!(SymLine::parse(&spaced.to_line()).unwrap().symbol, "a_b");
    }

    #[test]
    fn advice_names_the_flags() {
        let a = no_sites_advice("/bin/x", "-fpatchable-function-entry=2");
        assert!(
            a.contains("/bin/x") && a.contains("-fpatchable-function-entry=2 -fno-ipa-ra"),
            "{a}"
        );
        assert!(a.contains("patchable-function-entry=2\""), "{a}");
        assert!(a.contains("`ftramp cflags --cc clang`"), "{a}");
    }

    #[test]
    fn task_names() {
        assert_eq!(task_file_name(12, 3, "dat"), "task-12-3.dat");
        assert_eq!(parse_task_file_name("task-12-3.dat"), Some((12, 3, "dat")));
        assert_eq!(parse_task_file_name("task-12.dat"), None);
        assert_eq!(parse_task_file_name("info"), None);
    }
}

/// `s` as a TOML basic string (quoted, with `"`, `\` and control characters
/// escaped): how the recorder and `ftramp record` write text into `info`
/// and `.info` files.
pub fn toml_str(s: &str) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 || c == '\x7f' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `v` as a TOML value: an integer where it fits TOML's i64, else a
/// string (which the reader's number parsing accepts too).
pub fn toml_u64(v: u64) -> String {
    if v <= i64::MAX as u64 {
        v.to_string()
    } else {
        format!("\"{v}\"")
    }
}

#[cfg(test)]
mod toml_str_tests {
    #[test]
    fn quotes_backslashes_and_control_characters_are_escaped() {
        assert_eq!(super::toml_str("a \"b\" c\\d\n\x7f é"), "\"a \\\"b\\\" c\\\\d\\u000a\\u007f é\"");
    }
}
