//! The ftramp trace directory (format v1): what `ftramp record` writes and
//! `ftramp replay|report|dump` read.

pub mod format;
