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
//! name, or a glob (`*`, `?`, `[...]`; `{`/`}` are plain characters, and a
//! glob also matches the name equal to it: [`NamePattern`]).

use crate::regs::FtraceRegs;
use crate::sites::Site;
use ftramp_demangle::NamePattern;
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

    /// Every flag there is; registering an ops with another bit set is
    /// refused ([`OpsError::UnknownFlags`](crate::ftrace::OpsError)).
    pub const ALL: OpsFlags = OpsFlags(Self::SAVE_REGS.0 | Self::RECURSION.0 | Self::IPMODIFY.0 | Self::ALLOW_NO_SITES.0);

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
    /// An exact name: the raw symbol or its readable (demangled) one.
    Symbol(String, NameWords),
    /// A glob over the raw symbols and their readable names (and, as a
    /// name, itself: `<mini::Holder<[u8]>>::show`).
    Glob(NamePattern, NameWords),
}

/// The source identifiers a readable name must contain to match a filter
/// item, which every mangled symbol of that name then holds verbatim too
/// (Itanium C++ and Rust manglings spell identifiers out, as `<length>
/// <identifier>`).  A site whose raw symbol lacks one is not demangled
/// for that item: demangling costs about 5 µs per C++ symbol, which a
/// filter would otherwise pay for every site of a large program at every
/// refresh.  Left out, since a mangling may not spell them: words inside
/// `[…]` (glob classes, or slice types a mangling spells its own way) and
/// `{…}` (`{closure#0}`, `{lambda(int)#1}`), numbers and literals,
/// lifetimes, and the words a demangler writes itself or any piece of one
/// (builtin types, `std` and its abbreviated templates, `operator`, thunk
/// and clone notes, closures).  A pattern with an escape has no words.
#[derive(Debug, Clone, Default)]
pub struct NameWords(Box<[Box<str>]>);

impl NameWords {
    const SPELLED_BY_DEMANGLER: &'static [&'static str] = &[
        // C++ builtin types and literals (`i`, `Lb1E`, ...)
        "void", "bool", "char", "wchar_t", "char8_t", "char16_t", "char32_t", "short", "int", "long", "signed",
        "unsigned", "float", "double", "__int128", "__float128", "_Float16", "decltype", "auto", "nullptr_t",
        "const", "volatile", "restrict", "true", "false", "std", "string", "istream", "ostream", "iostream",
        "allocator", "basic_string", "basic_istream", "basic_ostream", "basic_iostream", "char_traits",
        "operator", "new", "delete", "anonymous", "namespace", "lambda", "unnamed", "type", "clone", "vtable",
        "typeinfo", "name", "for", "to", "VTT", "construction", "guard", "variable", "reference", "temporary",
        "thunk", "non", "virtual", "covariant", "return", "transaction", "sizeof", "alignof", "typeid",
        "noexcept", "throw", "abi", "cxx11", "override", "offset", "default", "arg", "parm", "template",
        "parameter", "object", "this", "cast", "static", "local", "initializer",
        // Rust primitives and the demangler's own words
        "u8", "u16", "u32", "u64", "u128", "usize", "i8", "i16", "i32", "i64", "i128", "isize", "f32", "f64",
        "str", "dyn", "mut", "unsafe", "extern", "fn", "impl", "as", "closure", "shim", "C",
    ];

    fn of(pattern: &str) -> NameWords {
        let mut words = Vec::new();
        // Inside `[…]`/`{…}`; the word follows a `'`; it follows a wildcard.
        let (mut depth, mut after_quote, mut after_wild) = (0u32, false, false);
        let mut word = String::new();
        let mut flush = |word: &mut String, keep: bool, piece: bool| {
            // A word next to a wildcard may be a piece of a longer one
            // (`*nsigned*` of `unsigned`), a whole one may not (`ns::*`).
            let demanglers = |w: &str| Self::SPELLED_BY_DEMANGLER.iter().any(|d| if piece { d.contains(w) } else { *d == w });
            if keep && !word.is_empty() && !word.starts_with(|c: char| c.is_ascii_digit()) && !demanglers(word) {
                words.push(std::mem::take(word).into_boxed_str());
            }
            word.clear();
        };
        for c in pattern.chars() {
            if c.is_ascii_alphanumeric() || c == '_' {
                word.push(c);
                continue;
            }
            let wild = matches!(c, '*' | '?');
            flush(&mut word, depth == 0 && !after_quote, after_wild || wild);
            (after_quote, after_wild) = (c == '\'', wild);
            match c {
                '[' | '{' => depth += 1,
                ']' | '}' => depth = depth.saturating_sub(1),
                // An escape: the words around it are not plain text.
                '\\' => return NameWords::default(),
                _ => {}
            }
        }
        flush(&mut word, depth == 0 && !after_quote, after_wild);
        NameWords(words.into_boxed_slice())
    }

    /// Whether `raw` spells every word (so its readable name may match).
    fn spelled_in(&self, raw: &str) -> bool {
        self.0.iter().all(|w| raw.contains(&**w))
    }
}

/// A set of functions.  Empty matches nothing (as a notrace set) or, as a
/// filter, everything — see [`Ops`].
#[derive(Debug, Clone, Default)]
pub struct Filter {
    items: Vec<FilterItem>,
}

/// The items, as given: `` `a`, `b*`, `0x1234` `` (empty: nothing).
impl std::fmt::Display for Filter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, item) in self.items.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            match item {
                FilterItem::Addr(a) => write!(f, "{sep}`{a:#x}`")?,
                FilterItem::Symbol(name, _) => write!(f, "{sep}`{name}`")?,
                FilterItem::Glob(m, _) => write!(f, "{sep}`{}`", m.as_str())?,
            }
        }
        Ok(())
    }
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
        self.items.push(FilterItem::Symbol(name.to_string(), NameWords::of(name)));
        self
    }

    /// Adds a glob (`tracee_*`, `foo?`, `[ab]*`), which also matches the name
    /// equal to it ([`NamePattern`]: one that is no glob, `f[z-a]`, matches
    /// only that name).
    pub fn glob(mut self, pattern: &str) -> Result<Filter, FilterError> {
        self.items.push(FilterItem::Glob(NamePattern::new(pattern), NameWords::of(pattern)));
        Ok(self)
    }

    /// Parses one item as Linux's filter files would: `0x…` is an address,
    /// text with `*?[` (or a `\` escape) a glob, anything else a symbol.
    /// Until the twenty-eighth session a name with `[` (`<mini::Holder<[u8]>>::show`)
    /// was a glob only and did not match itself, and braces in a glob were
    /// alternatives (`std::rt::*::{closure#0}` matched nothing).
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
        if NamePattern::is_glob(item) {
            return self.glob(item);
        }
        self.items.push(FilterItem::Symbol(item.to_string(), NameWords::of(item)));
        Ok(self)
    }

    /// Whether `site` is in the set.  Symbols and globs match the raw
    /// symbol or its readable name ([`Site::demangled`], as `ftramp replay`
    /// shows it): `_ZN2ns5parseEPKc` is matched by `ns::parse`, `ns::*`,
    /// `parse*`-style globs of either form, and by itself.  The readable
    /// name is only worked out for a site the raw symbol did not match.
    pub fn matches(&self, site: &Site) -> bool {
        let func_addr = site.addr - site.offset_in_symbol;
        let name_is = |words: &NameWords, test: &dyn Fn(&str) -> bool| {
            site.symbol.as_deref().is_some_and(|s| test(s) || (words.spelled_in(s) && site.demangled().is_some_and(test)))
        };
        self.items.iter().any(|i| match i {
            FilterItem::Addr(a) => *a == site.addr || *a == func_addr || *a == site.record,
            FilterItem::Symbol(s, w) => name_is(w, &|n| n == s),
            FilterItem::Glob(g, w) => name_is(w, &|n| g.matches(n)),
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
    /// fgraph's ops: its entry hijacks the return, so it leaves out sites
    /// of modules with their own unwinder ([`Ops::traces`]).
    pub(crate) hijacks_returns: bool,
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
            hijacks_returns: false,
        }
    }

    /// Marks fgraph's ops (see the `hijacks_returns` field).
    pub(crate) fn hijacking_returns(mut self) -> Ops {
        self.hijacks_returns = true;
        self
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

    /// Its filters in words, for messages: "the filter `a`, `b*`" (or
    /// "every function"), and " less the notrace `c`" when it has one.
    pub fn describe_filters(&self) -> String {
        let mut s = if self.filter.is_empty() { "every function".to_string() } else { format!("the filter {}", self.filter) };
        if !self.notrace.is_empty() {
            s += &format!(" less the notrace {}", self.notrace);
        }
        s
    }

    pub fn func(&self) -> OpsFunc {
        self.func
    }

    /// Whether this ops traces `site`.  fgraph's never traces a function of
    /// a module with its own copy of the unwinder (`-static-libgcc`,
    /// [`Site::own_unwinder`]): that copy throws with no GOT slot for the
    /// unwinder hooks (`unwind.rs`), so an exception through one of its
    /// hijacked returns would end the program in `std::terminate`.
    pub fn traces(&self, site: &Site) -> bool {
        !(self.hijacks_returns && site.own_unwinder) && (self.filter.is_empty() || self.filter.matches(site)) && !self.notrace.matches(site)
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

#[cfg(test)]
mod tests {
    use super::NameWords;

    /// The words a pattern requires of a raw symbol are spelled in every
    /// symbol whose readable name the pattern matches: checked for every
    /// piece of these names (up to 12 characters, as `*piece*`, and as
    /// prefixes, suffixes and the whole name), so a filter never misses a
    /// function because its symbol was not demangled.
    #[test]
    fn words_a_pattern_requires_are_spelled_by_every_symbol_it_matches() {
        let symbols = [
            "_ZNSt6vectorIiSaIiEE9push_backEOi",
            "_ZN12_GLOBAL__N_16helperEv",
            "_Z3fooIjEvv",
            "_Z3barILb1EEvv",
            "_ZNK2ns5ShapeclEv",
            "_ZN2ns3FooD2Ev",
            "_ZThn8_N2ns3Foo3barEv",
            "_ZNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEE6appendEPKc",
            "_ZZ4mainENKUliE_clEi",
            "_Z5parsePc.isra.0",
            "_ZN2ns5parseB5cxx11Ev",
            "_RNCNvCs1234_7mycrate4main0B3_",
            "_RNvMs_Cs1234_7mycrateNtB4_3Foo3new",
            "_ZN7mycrate6worker3run17h0123456789abcdefE",
            "_ZNSs6appendEPKc",
            "_ZN2ns4loadIA4_cEEvRKT_",
            "_ZnwmRKSt9nothrow_t",
            "_ZN2nsplERKNS_1VES2_",
            "_Z4funcILi100EEvv",
            "_ZN3Foo3barIPFviEEEvT_",
            "_ZN2ns3FooIlE3getEv",
            "_RNvMCsdVKqR98ewWj_4miniINtB2_6HolderShE4showB2_",
            "_RNCINvNtCsi4IsKQVxMg0_3std2rt10lang_startuE0CsdVKqR98ewWj_4mini",
            "_ZN52_$LT$smini..geo..Sq$u20$as$u20$smini..geo..Shape$GT$4area17ha227a8c9b283eb15E",
            "_ZNSt6vectorIiSaIiEEixEm",
        ];
        let mut checked = 0;
        for raw in symbols {
            let name = ftramp_demangle::demangle(raw).unwrap_or_else(|| panic!("{raw} demangles"));
            let chars: Vec<char> = name.chars().collect();
            let mut patterns = vec![name.clone()];
            for i in 0..chars.len() {
                patterns.push(format!("{}*", chars[..i].iter().collect::<String>()));
                patterns.push(format!("*{}", chars[i..].iter().collect::<String>()));
                for j in i + 1..=(i + 12).min(chars.len()) {
                    patterns.push(format!("*{}*", chars[i..j].iter().collect::<String>()));
                }
            }
            // Braces are plain characters; a name with `[` is a pattern for itself.
            for p in patterns.iter().filter(|p| !p.contains(['?', '\\']) && (!p.contains(['[', ']']) || **p == name)) {
                let words = NameWords::of(p);
                assert!(words.spelled_in(raw), "`{p}` matches {name} but requires {:?} of {raw}", words.0);
                checked += 1;
            }
        }
        assert!(checked > 5000, "{checked} patterns");
        // And it does leave most symbols undemangled.
        assert!(!NameWords::of("ns::*").spelled_in("_ZN5other4loadEv"));
        assert!(!NameWords::of("mycrate::worker::run").spelled_in("_ZN7mycrate6worker4stopEv"));
        assert!(NameWords::of("*push_back").spelled_in("_ZNSt6vectorIiSaIiEE9push_backEOi"));
    }
}
