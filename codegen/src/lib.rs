//! ftramp-codegen: ftrace trampolines generated from architecture specs.
//!
//! Linux hand-writes `ftrace_caller` and `return_to_handler` in assembly for
//! every architecture.  Here the trampolines are *computed*: a declarative
//! spec per arch ([`spec`]) gives registers, calling convention, patch-site
//! shape and frame layout; shared code ([`frame`], [`program`]) decides the
//! frame and the order of operations; a small backend per arch ([`arch`])
//! encodes the handful of primitives those operations need.  The resulting
//! [`image::Image`] is emitted three ways from the same bytes: linked in place
//! for JIT use ([`image::Image::link`]), as a relocatable ELF object
//! ([`object`]), and as a listing with an independent disassembler
//! ([`listing`]).  [`header`] prints the matching C structs.
//!
//! This crate contains no `unsafe`: it only produces bytes.
#![forbid(unsafe_code)]
// dynasm! expands dynamic register operands with `.into()` even when the
// type already matches.
#![allow(clippy::useless_conversion, clippy::unnecessary_cast)]

pub mod arch;
#[cfg(feature = "build-support")]
pub mod build;
pub mod frame;
pub mod header;
pub mod image;
#[cfg(feature = "listing")]
pub mod listing;
pub mod object;
pub mod program;
pub mod spec;

pub use frame::{FrameLayout, Tier};
pub use image::Image;
pub use program::{CodegenError, DataWord, Dispatch, GenOptions, SiteEntry, Variant};
pub use spec::{Spec, SpecError};
