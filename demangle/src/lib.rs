//! The readable name of a function symbol, defined once: `ftramp replay`,
//! `report` and `dump` show it, and the runtime's filters (`ftramp record
//! -F`/`-N`, fprobe globs) match it beside the raw symbol, so a name copied
//! from a replay selects the same function at record time.
//!
//! Like uftrace's default (`--demangle=simple`): C++ (`_Z…`) without
//! parameter lists or return types, Rust (`_R…`, or legacy `_ZN…17h<hash>E`)
//! without the hash.
//!
//! And the one rule for the patterns that select functions by those names
//! ([`NamePattern`]), in the runtime's filters and in replay's.

pub mod pattern;
pub use pattern::NamePattern;

/// The readable name of a mangled symbol, like uftrace's default (`--demangle=simple`):
/// C++ (`_Z...`) without parameter lists, Rust (`_R...`, or `_ZN...17h<hash>E`) without
/// the hash. `None` when `raw` is not mangled or does not demangle.
pub fn demangle(raw: &str) -> Option<String> {
    let rust_legacy = raw.starts_with("_ZN") && raw.len() > 20 && legacy_rust_hash_end(raw).is_some();
    if raw.starts_with("_R") || rust_legacy {
        if let Ok(d) = rustc_demangle::try_demangle(raw) {
            return Some(format!("{d:#}"));
        }
    }
    if raw.starts_with("_Z") {
        let sym = cpp_demangle::Symbol::new(raw.as_bytes()).ok()?;
        let opts = cpp_demangle::DemangleOptions::new()
            .no_params()
            .no_return_type();
        return sym.demangle_with_options(&opts).ok();
    }
    None
}

/// Where the hash of a legacy Rust symbol ends: after `17h` + 16 hex digits + `E`, at the
/// end of `raw` or before a suffix such as `.llvm.N`.  Not simply at the first `.`: the
/// path of a legacy symbol holds `..` for every `::` inside a generic or trait impl
/// (`_ZN52_$LT$smini..geo..Sq$u20$as$u20$smini..geo..Shape$GT$4area17h…E`), which until
/// the twenty-eighth session were demangled as C++ (`legacy_rust_paths_with_dots`).
fn legacy_rust_hash_end(raw: &str) -> Option<usize> {
    let b = raw.as_bytes();
    (0..b.len().saturating_sub(19)).map(|i| i + 20).find(|&end| {
        b[end - 20..end - 17] == *b"17h"
            && b[end - 17..end - 1].iter().all(u8::is_ascii_hexdigit)
            && b[end - 1] == b'E'
            && (end == b.len() || b[end] == b'.')
    })
}

/// What tells apart Rust symbols that [`demangle`] names alike: the same function copied
/// into several crates of one binary (generic or inline code, as each crate instantiates
/// it) has one name and a symbol per crate.  For a v0 symbol the crate that instantiated
/// it (`crate textwrap` for `…11finish_growCslyTRVWRdONb_8textwrap`), for a legacy one its
/// hash (`h0123456789abcdef`); `None` for other symbols, and for a v0 one whose
/// instantiating crate is not written out.
pub fn rust_instance(raw: &str) -> Option<String> {
    if let Some(end) = raw.starts_with("_ZN").then(|| legacy_rust_hash_end(raw)).flatten() {
        return Some(raw[end - 18..end - 1].to_string());
    }
    let core = raw.strip_prefix("_R")?.split('.').next()?;
    let name = rustc_demangle::try_demangle(raw).ok().map(|d| format!("{d:#}"))?;
    // `Cs<disambiguator>_<length><crate>` at the end, and the symbol without it is the same
    // function (rustc-demangle leaves the instantiating crate out).
    core.match_indices("Cs").find_map(|(at, _)| {
        let (hash, rest) = core[at + 2..].split_once('_')?;
        let digits = rest.find(|c: char| !c.is_ascii_digit())?;
        let krate = &rest[digits..];
        let whole = hash.bytes().all(|c| c.is_ascii_alphanumeric()) && rest[..digits].parse() == Ok(krate.len());
        let same = || rustc_demangle::try_demangle(&format!("_R{}", &core[..at])).is_ok_and(|d| format!("{d:#}") == name);
        (whole && !krate.is_empty() && same()).then(|| format!("crate {krate}"))
    })
}

/// [`demangle`] with the parameters kept (`N::load(char const*)`), to tell overloads
/// apart; Rust symbols have none.
pub fn demangle_with_params(raw: &str) -> Option<String> {
    let short = demangle(raw)?;
    let full = cpp_demangle::Symbol::new(raw.as_bytes())
        .ok()
        .and_then(|sym| sym.demangle_with_options(&cpp_demangle::DemangleOptions::new().no_return_type()).ok());
    // A C++ function's full name is its short one and the parameters (a Rust
    // symbol's, read as C++, ends in its hash instead).
    match full {
        Some(full) if full.strip_prefix(short.as_str()).is_some_and(|rest| rest.starts_with('(')) => Some(full),
        _ => Some(short),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names() {
        assert_eq!(demangle("_ZN3foo3barEv").as_deref(), Some("foo::bar"));
        assert_eq!(demangle("_ZN2ns3FooC2Ei").as_deref(), Some("ns::Foo::Foo"));
        assert_eq!(demangle("_Z5throwi").as_deref(), Some("throw"));
        assert_eq!(demangle("_ZN4core3fmt5write17h0123456789abcdefE").as_deref(), Some("core::fmt::write"));
        assert_eq!(demangle("_RNvCs1234_7mycrate3foo").as_deref(), Some("mycrate::foo"));
        assert_eq!(demangle("main"), None);
        assert_eq!(demangle("_Zjunk"), None);
    }

    /// A legacy Rust symbol whose path holds `..` (`::` inside a trait impl or generic
    /// argument) is Rust, also with an `.llvm.N` suffix: until the twenty-eighth session it
    /// was cut at its first `.` and demangled as C++.
    #[test]
    fn legacy_rust_paths_with_dots() {
        let area = "_ZN52_$LT$smini..geo..Sq$u20$as$u20$smini..geo..Shape$GT$4area17ha227a8c9b283eb15E";
        assert_eq!(demangle(area).as_deref(), Some("<smini::geo::Sq as smini::geo::Shape>::area"));
        assert_eq!(demangle(&format!("{area}.llvm.1234567")).as_deref(), Some("<smini::geo::Sq as smini::geo::Shape>::area"));
        assert_eq!(
            demangle("_ZN4core3ptr45drop_in_place$LT$ftramp_runtime..ops..Ops$GT$17h0123456789abcdefE").as_deref(),
            Some("core::ptr::drop_in_place<ftramp_runtime::ops::Ops>")
        );
        assert_eq!(demangle("_ZN5smini3geo4show17h34d2c47dbe0c315dE.llvm.99").as_deref(), Some("smini::geo::show"));
        // A C++ symbol with something like a hash in it stays C++.
        assert_eq!(demangle("_ZN3foo17h0123456789abcdefEv").as_deref(), Some("foo::h0123456789abcdef"));
    }

    /// The copies of one function in several crates are told apart by the crate that
    /// instantiated them (v0) or their hash (legacy); other symbols have nothing to add.
    #[test]
    fn rust_instances_by_crate_or_hash() {
        let finish_grow = "_RNvMs4_NtCsbEht8wFNRx7_5alloc7raw_vecNtB5_11RawVecInner11finish_grow";
        for (krate, tail) in [("textwrap", "CslyTRVWRdONb_8textwrap.llvm.15439000132138301033"), ("grep_searcher", "Cs1qoVIptFhZX_13grep_searcher")] {
            let raw = format!("{finish_grow}{tail}");
            assert_eq!(demangle(&raw).as_deref(), Some("<alloc::raw_vec::RawVecInner>::finish_grow"));
            assert_eq!(rust_instance(&raw), Some(format!("crate {krate}")));
        }
        assert_eq!(rust_instance("_ZN5smini3geo4show17h34d2c47dbe0c315dE.llvm.99").as_deref(), Some("h34d2c47dbe0c315d"));
        // No instantiating crate: the last `Cs` is the path's own crate.
        assert_eq!(rust_instance("_RNvCs1234_7mycrate3foo"), None);
        assert_eq!(rust_instance("_RNvMCsdVKqR98ewWj_4miniINtB2_6HolderShE4showB2_"), None);
        assert_eq!(rust_instance("_ZN1N4loadEi"), None);
        assert_eq!(rust_instance("main"), None);
    }

    #[test]
    fn parameters_only_where_asked() {
        assert_eq!(demangle_with_params("_ZN1N4loadEPKc").as_deref(), Some("N::load(char const*)"));
        assert_eq!(demangle("_ZN1N4loadEPKc").as_deref(), Some("N::load"));
        // A Rust symbol has no parameters to add.
        assert_eq!(demangle_with_params("_RNvCs1234_7mycrate3foo").as_deref(), Some("mycrate::foo"));
    }
}
