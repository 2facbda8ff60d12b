//! `ftramp cflags --callsite`: code built with the printed flags has, before
//! every function, an 8-byte aligned ops word of NOPs that
//! `ip + FTRACE_CALLSITE_OPS_OFFSET` reaches — also where the distribution's
//! compiler turns on landing pads by default (`-fcf-protection` on Ubuntu
//! and Fedora, `-mbranch-protection=standard` on some aarch64 ones), which
//! put `endbr64` / `bti c` at the symbol and the site after it, so the word
//! before the site would overlap the landing pad.

use object::{Object, ObjectSection, ObjectSymbol};
use std::process::Command;

fn ftramp(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_ftramp")).args(args).output().unwrap();
    assert!(out.status.success(), "ftramp {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

const SRC: &str = "
long f1(long a) { return a * 3 + 1; }
char f2(char c) { return c + 1; }
long f3(long a, long b) { return f1(a) * b + f2((char)a); }
short f4(short s) { return s * 5; }
";

/// Compiles SRC with `cc`, the distribution's landing-pad default first
/// (as a CFLAGS default comes before a project's flags) and then
/// `ftramp cflags --callsite`, at `opt`; checks every function.
fn check(arch: &str, cc: &str, pads: &str, nop: &[u8], opt: &str) {
    if Command::new(cc).arg("--version").output().map(|o| !o.status.success()).unwrap_or(true) {
        eprintln!("SKIP {arch}: `{cc}` not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.c"), SRC).unwrap();
    let flags = ftramp(&["cflags", "-a", arch, "--callsite"]);
    let o = Command::new(cc)
        .arg(opt)
        .arg(pads)
        .args(flags.split_whitespace())
        .args(["-c", "t.c", "-o", "t.o"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{cc} {opt} {pads} {flags}: {}", String::from_utf8_lossy(&o.stderr));
    let bytes = std::fs::read(dir.path().join("t.o")).unwrap();
    let obj = object::File::parse(&*bytes).unwrap();
    let mut seen = 0;
    for sym in obj.symbols().filter(|s| s.kind() == object::SymbolKind::Text && s.name().unwrap().starts_with('f')) {
        let name = sym.name().unwrap();
        let sec = obj.section_by_index(sym.section_index().unwrap()).unwrap();
        let data = sec.data().unwrap();
        let at = (sym.address() - sec.address()) as usize;
        assert!(at >= 8, "{arch} {opt}: {name} at {at:#x}: no room before it");
        // The ops word: 8 bytes of the site's NOPs just before the symbol,
        // 8-byte aligned so that replacing it is one atomic store.
        assert!(sec.align() >= 8 && (at - 8).is_multiple_of(8), "{arch} {opt}: {name}'s ops word at {:#x} is not 8-byte aligned ({flags})", at - 8);
        assert!(data[at - 8..at].chunks(nop.len()).all(|c| c == nop), "{arch} {opt}: {name}: {:02x?} before it", &data[at - 8..at]);
        // The site at the symbol itself, no landing pad before it: then
        // ip + FTRACE_CALLSITE_OPS_OFFSET (ip - 8) is that word.
        assert_eq!(&data[at..at + nop.len()], nop, "{arch} {opt}: {name} begins with {:02x?}, not the site ({flags})", &data[at..at + 4]);
        seen += 1;
    }
    assert_eq!(seen, 4, "{arch} {opt}");
}

#[test]
fn callsite_flags_leave_no_landing_pad_before_the_site_and_align_the_ops_word() {
    for opt in ["-O0", "-O2"] {
        if std::env::consts::ARCH == "x86_64" {
            check("x86_64", "gcc", "-fcf-protection=full", &[0x90], opt);
        }
        check("aarch64", "aarch64-linux-gnu-gcc", "-mbranch-protection=standard", &[0x1f, 0x20, 0x03, 0xd5], opt);
    }
}

/// gcc's -O2 aligns functions by itself, -O0 does not: every arch's
/// callsite flags ask for the 8-byte alignment the ops word needs.
#[test]
fn every_arch_callsite_flags_align_functions() {
    for arch in ["x86_64", "aarch64", "riscv64", "ppc64le", "s390x"] {
        let flags = ftramp(&["cflags", "-a", arch, "--callsite"]);
        assert!(flags.split_whitespace().any(|f| f == "-falign-functions=8"), "{arch}: {flags}");
    }
}
