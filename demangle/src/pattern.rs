//! Function-name patterns, one rule for `ftramp record -F/-N` (the runtime's filters) and
//! `ftramp replay -F/-N`, so a name copied from one selects the same functions in the other.
//!
//! Globs as in Linux's filter files: `*`, `?` and `[...]` are wildcards, `\` makes the
//! next character plain (`\[`, `\*`); every other character is itself, `{`, `}` and `,`
//! too (ftrace has no alternatives, and Rust and C++ names hold braces:
//! `std::rt::lang_start::<()>::{closure#0}`, `main::{lambda(int)#1}`).  And a pattern
//! always matches the name equal to it, so a name with `[` is its own pattern:
//! `<mini::Holder<[u8]>>::show`, `std::vector<int>::operator[]`.  Until the twenty-eighth
//! session such a name selected nothing (`[u8]` was a class only), and replay took
//! `{closure#0}` as an alternative (`names_match_themselves_and_braces_are_plain`).

use globset::{GlobBuilder, GlobMatcher};

/// One function-name pattern: see the module docs.
#[derive(Debug, Clone)]
pub struct NamePattern {
    text: Box<str>,
    /// `None` for plain text, or text that is no glob (`[z-a]`, a trailing `\`): it then
    /// matches only the name equal to it.
    glob: Option<GlobMatcher>,
}

impl NamePattern {
    /// Whether `text` has wildcards or escapes (else it is a name, matched as it is).
    pub fn is_glob(text: &str) -> bool {
        text.contains(['*', '?', '[', '\\'])
    }

    pub fn new(text: &str) -> NamePattern {
        let glob = Self::is_glob(text)
            .then(|| {
                GlobBuilder::new(&braces_plain(text))
                    .literal_separator(false)
                    .backslash_escape(true)
                    .allow_unclosed_class(true)
                    .build()
                    .ok()
            })
            .flatten()
            .map(|g| g.compile_matcher());
        NamePattern { text: text.into(), glob }
    }

    /// The pattern as given.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    pub fn matches(&self, name: &str) -> bool {
        *self.text == *name || self.glob.as_ref().is_some_and(|g| g.is_match(name))
    }
}

/// `text` for globset, with `{` and `}` escaped outside classes (globset has no switch to
/// turn its alternatives off; inside a class `\` would be one more member).
fn braces_plain(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        let len = match c {
            '\\' => rest[1..].chars().next().map_or(1, |n| 1 + n.len_utf8()),
            // A class, as globset reads it: `]` first (after `!`/`^`) is a member.
            '[' => {
                let start = 1 + rest[1..].starts_with(['!', '^']) as usize;
                let start = start + rest[start..].starts_with(']') as usize;
                rest[start..].find(']').map_or(1, |end| start + end + 1)
            }
            '{' | '}' => {
                out.push('\\');
                1
            }
            _ => c.len_utf8(),
        };
        out.push_str(&rest[..len]);
        rest = &rest[len..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_themselves_and_braces_are_plain() {
        let m = |p: &str, name: &str| NamePattern::new(p).matches(name);
        // Every name matches itself, wildcards or not.
        for name in [
            "<mini::Holder<[u8]>>::show",
            "<[u8] as core::fmt::Debug>::fmt",
            "core::slice::<impl [T]>::len",
            "std::vector<int, std::allocator<int> >::operator[]",
            "X<&A::operator[], int[5]>::f",
            "std::rt::lang_start::<()>::{closure#0}",
            "main::{lambda(int)#1}::operator()",
            "foo<a,b>::bar",
            "what?",
            "a*b",
        ] {
            assert!(m(name, name), "{name}");
        }
        // `[...]` is a class, `\[` a plain `[`.
        assert!(m("<mini::Holder<[u8]>>::show", "<mini::Holder<u>>::show"));
        assert!(m("<mini::Holder<\\[u8\\]>>::show", "<mini::Holder<[u8]>>::show"));
        assert!(!m("<mini::Holder<\\[u8\\]>>::show", "<mini::Holder<u>>::show"));
        assert!(m("f[ab]", "fa") && !m("f[ab]", "fc") && m("f[!ab]", "fc") && m("f[]]", "f]"));
        // Braces are themselves, inside globs too: no alternatives.
        assert!(m("std::rt::*::{closure#0}", "std::rt::lang_start::<()>::{closure#0}"));
        assert!(!m("std::rt::*::{closure#0}", "std::rt::lang_start::<()>::closure#0"));
        assert!(m("f{a,b}*", "f{a,b}x") && !m("f{a,b}*", "fa"));
        assert!(m("*{lambda(int)#1}*", "main::{lambda(int)#1}::operator()"));
        assert!(m("f[{]*", "f{x") && !m("f[{]*", "f\\x"));
        // `*` crosses `/` (`operator/`), `?` is one character.
        assert!(m("*::operator*", "ns::operator/") && m("b?r", "bar") && !m("b?r", "baar"));
        // No glob: only the name itself.
        assert!(m("f[z-a]", "f[z-a]") && !m("f[z-a]", "fz"));
        assert!(!m("plain", "plainer") && !m("", "x"));
    }

    #[test]
    fn braces_plain_outside_classes_only() {
        assert_eq!(braces_plain("a::{closure#0}"), "a::\\{closure#0\\}");
        assert_eq!(braces_plain("[{}]{"), "[{}]\\{");
        assert_eq!(braces_plain("[]{]}"), "[]{]\\}");
        assert_eq!(braces_plain("[!]{]"), "[!]{]");
        assert_eq!(braces_plain("\\{x[{"), "\\{x[\\{");
        assert_eq!(braces_plain("é{\\"), "é\\{\\");
    }
}
