//! The ftramp trace directory (format v1): what `ftramp record` writes and
//! `ftramp replay|report|dump` read.

pub mod format;

pub mod calls;
pub mod dump;
pub mod read;
pub mod replay;
pub mod report;

pub use read::{Event, EventKind, Process, Symbol, Thread, Trace, TraceError, TraceInfo};
