//! `ftramp gen --header`: the header is usable from C and C++ (g++ accepts
//! its static asserts, the object's symbols get C linkage), declares exactly
//! what the object of the same `-V` variants defines (a program using every
//! declaration links against that object), and `-V` / `--prefix` are
//! checked as for the object.  Built and linked for the host (x86_64); a
//! machine without the compiler says so in the test output.

#![cfg(target_arch = "x86_64")]

use object::{Object, ObjectSymbol};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn ftramp(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ftramp")).args(args).env_remove("RUST_BACKTRACE").env_remove("RUST_LIB_BACKTRACE").output().unwrap()
}

fn dir(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("header-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `ftramp gen ARGS -o out`, which must succeed.
fn gen(args: &[&str], out: &Path) {
    let mut all = args.to_vec();
    all.extend(["-o", out.to_str().unwrap()]);
    let o = ftramp(&all);
    assert!(o.status.success(), "ftramp {all:?}: {}", String::from_utf8_lossy(&o.stderr));
}

fn have(tool: &str) -> bool {
    Command::new(tool).arg("--version").output().map(|o| o.status.success()).unwrap_or(false)
}

/// The symbols the header declares after "The object's interface".
fn declared(header: &str) -> BTreeSet<String> {
    let at = header.find("The object's interface").expect("the interface section");
    header[at..]
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let name = if let Some(f) = l.strip_prefix("void ").and_then(|r| r.strip_suffix("(void);")) {
                f
            } else if l.starts_with("extern ") && !l.starts_with("extern \"C\"") {
                l.trim_end_matches(';').rsplit([' ', '*']).next().unwrap()
            } else {
                return None;
            };
            Some(name.to_string())
        })
        .collect()
}

/// The global symbols `object` defines.
fn defined(object: &Path) -> BTreeSet<String> {
    let data = std::fs::read(object).unwrap();
    let file = object::File::parse(&*data).unwrap();
    file.symbols().filter(|s| s.is_definition() && s.is_global()).map(|s| s.name().unwrap().to_string()).collect()
}

/// A C (or C++) program that takes the address of every symbol in `names`
/// (functions and data alike as `const void *`, hence no `-pedantic`).
fn user(header: &Path, names: &BTreeSet<String>) -> String {
    let mut s = format!("#include \"{}\"\n#include \"{}\"\n#include <stdio.h>\n", header.display(), header.display());
    s += "void ftrace_ops_list_func(unsigned long i, unsigned long p, struct ftrace_ops *o, struct ftrace_regs *f) { (void)i; (void)p; (void)o; (void)f; }\n";
    s += "unsigned long ftrace_return_to_handler(struct ftrace_regs *f) { (void)f; return 0; }\n";
    s += "static const unsigned char nops[FTRACE_SITE_NR_NOPS][FTRACE_SITE_SIZE] = FTRACE_SITE_NOPS;\n";
    s += "static const unsigned char nop[FTRACE_SITE_SIZE] = FTRACE_SITE_NOP;\n";
    s += "int main(void) {\n\tconst void *p[] = { nops, nop";
    for n in names {
        s += &format!(", (const void *)&{n}");
    }
    s += " };\n\tprintf(\"%d\\n\", (int)(sizeof p / sizeof p[0]));\n\treturn 0;\n}\n";
    s
}

/// Compiles `source` with `cc` as `lang`, links it against `object` and
/// runs it; returns the number it prints.
fn link_and_run(cc: &str, lang: &str, source: &str, object: &Path, d: &Path) -> usize {
    let ext = if lang == "c" { "c" } else { "cpp" };
    let src = d.join(format!("user.{ext}"));
    std::fs::write(&src, source).unwrap();
    let exe = d.join(format!("user-{ext}"));
    let std = if lang == "c" { "-std=c11" } else { "-std=c++11" };
    let o = Command::new(cc).args([std, "-Wall", "-Wextra", "-Werror"]).arg(&src).arg(object).arg("-o").arg(&exe).output().unwrap();
    assert!(o.status.success(), "{cc} {}:\n{}\n{source}", src.display(), String::from_utf8_lossy(&o.stderr));
    let o = Command::new(&exe).output().unwrap();
    assert!(o.status.success());
    String::from_utf8(o.stdout).unwrap().trim().parse().unwrap()
}

#[test]
fn the_header_compiles_as_cxx_and_its_symbols_link_from_cxx() {
    if !have("g++") {
        println!("note: no g++; the header was not checked as C++");
        return;
    }
    let d = dir("cxx");
    let (h, o) = (d.join("ftramp.h"), d.join("tramp.o"));
    gen(&["gen", "-a", "x86_64", "--header"], &h);
    gen(&["gen", "-a", "x86_64"], &o);
    let text = std::fs::read_to_string(&h).unwrap();
    assert!(text.contains("extern \"C\" {"), "{text}");
    // The default object's symbols: C linkage, or the link fails.
    let names: BTreeSet<String> = ["ftrace_caller", "ftrace_regs_caller", "return_to_handler", "function_trace_op"].map(String::from).into();
    assert_eq!(link_and_run("g++", "c++", &user(&h, &names), &o, &d), names.len() + 2);
}

#[test]
fn the_header_declares_what_the_object_of_the_same_variants_defines() {
    let cc = have("gcc").then_some("gcc");
    let cxx = have("g++").then_some("g++");
    if cc.is_none() {
        println!("note: no gcc; the declarations were compared with the object's symbols but not linked");
    }
    let sets: &[&[&str]] =
        &[&["all"], &["args-list", "return"], &["args-direct"], &["args-multi3", "regs-multi2", "return"], &["regs-multi8"], &["args-multi1", "regs-callsite"]];
    for (i, set) in sets.iter().enumerate() {
        for prefix in ["", "m_"] {
            let d = dir(&format!("variants{i}{prefix}"));
            let (h, o) = (d.join("ftramp.h"), d.join("tramp.o"));
            let mut args = vec!["gen", "-a", "x86_64", "--prefix", prefix];
            for v in *set {
                args.extend(["-V", v]);
            }
            gen(&args, &o);
            args.push("--header");
            gen(&args, &h);
            let text = std::fs::read_to_string(&h).unwrap();
            let (decl, def) = (declared(&text), defined(&o));
            assert_eq!(decl, def, "-V {set:?} --prefix {prefix:?}: declared by the header (left) vs defined by the object (right)");
            for (cc, lang) in [(cc, "c"), (cxx, "c++")] {
                if let Some(cc) = cc {
                    assert_eq!(link_and_run(cc, lang, &user(&h, &decl), &o, &d), decl.len() + 2, "{set:?} {lang}");
                }
            }
        }
    }
    // multiN declares its tracers' words.
    let d = dir("multi");
    gen(&["gen", "-a", "x86_64", "--header", "-V", "args-multi3"], &d.join("h"));
    let text = std::fs::read_to_string(d.join("h")).unwrap();
    for s in ["void ftrace_multi3_caller(void);", "extern struct ftrace_ops *ftrace_direct_op_2;", "extern ftrace_func_t ftrace_direct_func_2;"] {
        assert!(text.contains(s), "{s}\n{text}");
    }
    assert!(!text.contains("ftrace_caller(void)") && !text.contains("ftrace_direct_caller"), "{text}");
}

#[test]
fn a_bad_variant_with_header_is_refused() {
    let o = ftramp(&["gen", "-a", "x86_64", "--header", "-V", "bogus"]);
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("unknown variant `bogus`"), "{e}");
    assert!(o.stdout.is_empty());
}

#[test]
fn a_prefix_that_does_not_make_c_identifiers_is_refused() {
    for (prefix, what) in [("1x-", "`1`"), ("a b", "` `"), ("m-", "`-`"), ("é", "`é`")] {
        for header in [true, false] {
            let mut args = vec!["gen", "-a", "x86_64", "--prefix", prefix, "-o", "/dev/null"];
            if header {
                args.push("--header");
            }
            let o = ftramp(&args);
            assert!(!o.status.success(), "{args:?}");
            let e = String::from_utf8_lossy(&o.stderr);
            assert!(e.contains("--prefix") && e.contains(&format!("`{prefix}`")) && e.contains(what) && e.contains("C identifier"), "{e}");
        }
    }
    for prefix in ["", "m_", "_x9", "A"] {
        let o = ftramp(&["gen", "-a", "x86_64", "--header", "--prefix", prefix]);
        assert!(o.status.success(), "{prefix:?}: {}", String::from_utf8_lossy(&o.stderr));
    }
}

#[test]
fn the_set_argument_comment_warns_of_a_callee_saved_argument_register() {
    let text = |arch: &str| String::from_utf8(ftramp(&["gen", "-a", arch, "--header"]).stdout).unwrap();
    let s390x = text("s390x");
    let at = s390x.find("static inline void ftrace_regs_set_argument").unwrap();
    let comment = &s390x[s390x[..at].rfind("/*").unwrap()..at];
    assert!(comment.contains("Argument 4") && comment.contains("r6") && comment.contains("callee-saved") && comment.contains("caller's r6"), "{comment}");
    for arch in ["x86_64", "aarch64", "riscv64", "ppc64le"] {
        assert!(!text(arch).contains("callee-saved: the traced function restores"), "{arch}");
    }
}

#[test]
fn the_header_lists_every_accepted_nop_form() {
    let x86 = String::from_utf8(ftramp(&["gen", "-a", "x86_64", "--header"]).stdout).unwrap();
    assert!(x86.contains("#define FTRACE_SITE_NR_NOPS 3"), "{x86}");
    assert!(
        x86.contains("#define FTRACE_SITE_NOPS { { 0x90, 0x90, 0x90, 0x90, 0x90 }, { 0x0f, 0x1f, 0x44, 0x00, 0x00 }, { 0x0f, 0x1f, 0x44, 0x00, 0x08 } }"),
        "{x86}"
    );
    let s390x = String::from_utf8(ftramp(&["gen", "-a", "s390x", "--header"]).stdout).unwrap();
    assert!(s390x.contains("{ 0xc0, 0x04, 0x00, 0x00, 0x00, 0x00 }"), "brcl 0,0: {s390x}");
    let rv = String::from_utf8(ftramp(&["gen", "-a", "riscv64", "--header"]).stdout).unwrap();
    assert!(rv.contains("{ 0x13, 0x00, 0x00, 0x00, 0x13, 0x00, 0x00, 0x00 }"), "plain nop: {rv}");
}
