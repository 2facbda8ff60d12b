//! The ftramp trace directory (format v2; v1 is read too): what `ftramp record` writes and
//! `ftramp replay|report|dump` read.

pub mod format;

pub mod calls;
pub mod dump;
pub mod read;
pub mod replay;
pub mod report;
#[cfg(test)]
mod testgen;

pub use read::{Event, EventKind, Process, Symbol, Thread, Trace, TraceError, TraceInfo};
