//! `Ops`, the user-space `struct ftrace_ops`: a callback, flags and the
//! filter that says which functions it traces.
//!
//! ```text
//!   #[repr(C)] Ops
//!   +0   entry  — what trampolines call: a runtime thunk chosen from the
//!                 flags (callsite dispatch calls `op->entry`, so it must be
//!                 the first word, as `func` is in the kernel's ftrace_ops)
//!   +8   func   — the user's callback
//!   +16  private — user data (the C API's `void *private`)
//!   ...  flags, filters, counters (Rust only)
//! ```
//!
//! Filters follow Linux's `set_ftrace_filter` / `set_ftrace_notrace`: an
//! empty filter traces every function; `notrace` removes functions from
//! it.  Each filter item is a site or function address, an exact symbol
//! name, or a glob (`*`, `?`, `[...]`).

use crate::regs::FtraceRegs;
use crate::sites::Site;
use globset::{Glob, GlobMatcher};
use std::sync::atomic::{AtomicU64, Ordering};

/// The callback: `(ip, parent_ip, op, fregs)`, as Linux's `ftrace_func_t`.
/// `ip` is the traced function's patch site, `parent_ip` where it returns.
pub type OpsFunc = extern "C" fn(ip: usize, parent_ip: usize, op: &Ops, fregs: &mut FtraceRegs);

/// Ops flags (Linux `FTRACE_OPS_FL_*`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpsFlags(pub u32);

impl OpsFlags {
    /// The callback sees a full `pt_regs` (`FtraceRegs::register`): the
    /// sites it traces use the `regs` tier.
    pub const SAVE_REGS: OpsFlags = OpsFlags(1 << 0);
    /// The runtime guards the callback against recursion: a traced
    /// function called from inside the callback (on the same thread) does
    /// not call it again; such calls are counted in `Ops::recursion_misses`.
    pub const RECURSION: OpsFlags = OpsFlags(1 << 1);
    /// The callback may redirect the traced function
    /// (`FtraceRegs::set_instruction_pointer`).  At most one IPMODIFY ops
    /// per site.
    pub const IPMODIFY: OpsFlags = OpsFlags(1 << 2);
    /// Registering succeeds even when no loaded site matches the filter
    /// yet: its globs also select the functions of modules loaded later (a
    /// tracer told to record a function of a library the program will
    /// `dlopen`).  Without it such a register fails with `NoSites`.
    pub const ALLOW_NO_SITES: OpsFlags = OpsFlags(1 << 3);

    pub const fn empty() -> OpsFlags {
        OpsFlags(0)
    }
    pub const fn contains(self, other: OpsFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for OpsFlags {
    type Output = OpsFlags;
    fn bitor(self, rhs: OpsFlags) -> OpsFlags {
        OpsFlags(self.0 | rhs.0)
    }
}

/// One item of a filter.
#[derive(Debug, Clone)]
pub enum FilterItem {
    /// A site address or the address of a traced function.
    Addr(usize),
    /// An exact symbol name.
    Symbol(String),
    /// A glob over symbol names.
    Glob(GlobMatcher),
}

/// A set of functions.  Empty matches nothing (as a notrace set) or, as a
/// filter, everything — see [`Ops`].
#[derive(Debug, Clone, Default)]
pub struct Filter {
    items: Vec<FilterItem>,
}

/// A filter item that could not be understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad filter `{item}`: {why}")]
pub struct FilterError {
    pub item: String,
    pub why: String,
}

impl Filter {
    pub fn new() -> Filter {
        Filter::default()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Adds every item of `other` (the union of two non-empty filters).
    pub fn union(mut self, other: &Filter) -> Filter {
        self.items.extend(other.items.iter().cloned());
        self
    }

    /// Adds an address.
    pub fn addr(mut self, addr: usize) -> Filter {
        self.items.push(FilterItem::Addr(addr));
        self
    }

    /// Adds an exact symbol name.
    pub fn symbol(mut self, name: &str) -> Filter {
        self.items.push(FilterItem::Symbol(name.to_string()));
        self
    }

    /// Adds a glob (`tracee_*`, `foo?`, `[ab]*`).
    pub fn glob(mut self, pattern: &str) -> Result<Filter, FilterError> {
        let g = Glob::new(pattern).map_err(|e| FilterError { item: pattern.to_string(), why: e.kind().to_string() })?;
        self.items.push(FilterItem::Glob(g.compile_matcher()));
        Ok(self)
    }

    /// Parses one item as Linux's filter files would: `0x…` is an address,
    /// text with `*?[` a glob, anything else a symbol.
    pub fn parse(mut self, item: &str) -> Result<Filter, FilterError> {
        let item = item.trim();
        if item.is_empty() {
            return Err(FilterError { item: item.into(), why: "empty".into() });
        }
        if let Some(hex) = item.strip_prefix("0x") {
            let a = usize::from_str_radix(hex, 16).map_err(|e| FilterError { item: item.into(), why: e.to_string() })?;
            self.items.push(FilterItem::Addr(a));
            return Ok(self);
        }
        if item.contains(['*', '?', '[']) {
            return self.glob(item);
        }
        self.items.push(FilterItem::Symbol(item.to_string()));
        Ok(self)
    }

    /// Whether `site` is in the set.
    pub fn matches(&self, site: &Site) -> bool {
        let func_addr = site.addr - site.offset_in_symbol;
        self.items.iter().any(|i| match i {
            FilterItem::Addr(a) => *a == site.addr || *a == func_addr || *a == site.record,
            FilterItem::Symbol(s) => site.symbol.as_deref() == Some(s.as_str()),
            FilterItem::Glob(g) => site.symbol.as_deref().is_some_and(|s| g.is_match(s)),
        })
    }
}

/// A tracer: see the module docs for the layout.
#[repr(C)]
pub struct Ops {
    /// Set by the runtime when registering (a thunk that enters the grace
    /// period tracking, and the recursion guard when asked).
    pub(crate) entry: std::sync::atomic::AtomicUsize,
    func: OpsFunc,
    /// User data.
    pub private: usize,
    flags: OpsFlags,
    filter: Filter,
    notrace: Filter,
    pub(crate) recursion_misses: AtomicU64,
    /// `Some` for a *raw entry*: trampolines call `func` itself, not a
    /// thunk — for the runtime's own callbacks that enter dispatch
    /// themselves before touching anything a grace period protects, and
    /// never read their `op` argument (fgraph's entry).  The value is what
    /// the list function calls instead: the same callback without its own
    /// dispatch guard (the list function holds one for the same traced
    /// call; a second at the same stack pointer would look like a section
    /// left by a jump, see `grace::DispatchGuard::enter_at`).
    pub(crate) listed_func: Option<OpsFunc>,
}

impl Ops {
    /// An ops calling `func` on every function (narrow it with
    /// [`Ops::filter`] / [`Ops::notrace`]).
    pub fn new(func: OpsFunc) -> Ops {
        Ops {
            entry: std::sync::atomic::AtomicUsize::new(0),
            func,
            private: 0,
            flags: OpsFlags::empty(),
            filter: Filter::new(),
            notrace: Filter::new(),
            recursion_misses: AtomicU64::new(0),
            listed_func: None,
        }
    }

    /// Makes this a raw entry (see the `listed_func` field).
    pub(crate) fn raw_entry(mut self, listed: OpsFunc) -> Ops {
        self.listed_func = Some(listed);
        self
    }

    /// What a trampoline calls for this ops: `func` for a raw entry, else
    /// the thunk for its flags.
    pub(crate) fn trampoline_entry(&self) -> usize {
        match self.listed_func {
            Some(_) => self.func() as usize,
            None => crate::dispatch::entry_for(self.get_flags()),
        }
    }

    pub fn flags(mut self, flags: OpsFlags) -> Ops {
        self.flags = flags;
        self
    }

    pub fn filter(mut self, filter: Filter) -> Ops {
        self.filter = filter;
        self
    }

    pub fn notrace(mut self, notrace: Filter) -> Ops {
        self.notrace = notrace;
        self
    }

    pub fn private(mut self, private: usize) -> Ops {
        self.private = private;
        self
    }

    pub fn get_flags(&self) -> OpsFlags {
        self.flags
    }

    pub fn func(&self) -> OpsFunc {
        self.func
    }

    /// Whether this ops traces `site`.
    pub fn traces(&self, site: &Site) -> bool {
        (self.filter.is_empty() || self.filter.matches(site)) && !self.notrace.matches(site)
    }

    /// Calls refused by the recursion guard (flag `RECURSION`).
    pub fn recursion_misses(&self) -> u64 {
        self.recursion_misses.load(Ordering::Relaxed)
    }
}

impl std::fmt::Debug for Ops {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ops").field("func", &(self.func as usize)).field("flags", &self.flags).finish_non_exhaustive()
    }
}
