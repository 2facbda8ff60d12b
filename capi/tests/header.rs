//! `include/ftramp.h` is hand-written; this keeps it in step with the
//! library: every exported function (`#[no_mangle] extern "C"` in
//! src/lib.rs) is declared with the C types its Rust signature maps to,
//! nothing else is declared, the callback typedef matches `FtrampFunc`, and
//! each `#define FTRAMP_*` has the value of the crate's constant.

use std::collections::BTreeMap;

const HEADER: &str = include_str!("../include/ftramp.h");
const SOURCE: &str = include_str!("../src/lib.rs");

/// `(return type, parameter types)`, normalized C spelling.
type Sig = (String, Vec<String>);

/// One spelling per C type: single spaces, `*` after a space and attached
/// to nothing.
fn norm(t: &str) -> String {
    t.replace('*', " * ").split_whitespace().collect::<Vec<_>>().join(" ")
}

fn strip_comments(mut s: &str) -> String {
    let mut out = String::new();
    while let Some(i) = s.find("/*") {
        out.push_str(&s[..i]);
        let j = s[i..].find("*/").expect("closed comment");
        s = &s[i + j + 2..];
    }
    out.push_str(s);
    out
}

/// Splits `type name` into the type (the declared name dropped).
fn c_type_of_decl(decl: &str) -> (String, String) {
    let d = decl.trim();
    let name_start = d.rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).map_or(0, |i| i + 1);
    (norm(&d[..name_start]), d[name_start..].to_string())
}

fn c_params(params: &str) -> Vec<String> {
    let p = params.trim();
    if p == "void" {
        return Vec::new();
    }
    p.split(',').map(|x| c_type_of_decl(x).0).collect()
}

/// Every function the header declares.
fn header_functions() -> BTreeMap<String, Sig> {
    let text: String = strip_comments(HEADER).lines().filter(|l| !l.trim_start().starts_with('#')).collect::<Vec<_>>().join("\n");
    let mut out = BTreeMap::new();
    for stmt in text.split(';') {
        let stmt = stmt.trim();
        if !stmt.contains('(') || stmt.starts_with("typedef") || stmt.starts_with("extern \"C\"") {
            continue;
        }
        let stmt = stmt.trim_start_matches('}').trim();
        let open = stmt.find('(').unwrap();
        let close = stmt.rfind(')').unwrap();
        let (ret, name) = c_type_of_decl(&stmt[..open]);
        assert!(out.insert(name.clone(), (ret, c_params(&stmt[open + 1..close]))).is_none(), "{name} declared twice");
    }
    out
}

/// The C spelling of a Rust FFI type of src/lib.rs.
fn c_of_rust(t: &str) -> String {
    let t = t.split_whitespace().collect::<Vec<_>>().join(" ");
    let c = match t.as_str() {
        "" => "void",
        "c_int" => "int",
        "c_uint" => "unsigned int",
        "c_ulong" => "unsigned long",
        "c_double" => "double",
        "*mut c_void" => "void *",
        "*const c_char" => "const char *",
        "*mut c_ulong" => "unsigned long *",
        "*mut Ops" => "struct ftrace_ops *",
        "*const Ops" => "const struct ftrace_ops *",
        "*mut FtraceRegs" => "struct ftrace_regs *",
        "*const FtraceRegs" => "const struct ftrace_regs *",
        "Option<FtrampFunc>" => "ftramp_func_t",
        other => panic!("no C spelling for the Rust type `{other}`: add it here and to the header"),
    };
    norm(c)
}

/// `(a: A, b: B) -> R` → signature.
fn rust_sig(params: &str, ret: &str) -> Sig {
    let params = params.trim();
    let ps = if params.is_empty() {
        Vec::new()
    } else {
        params.split(',').map(str::trim).filter(|p| !p.is_empty()).map(|p| c_of_rust(p.split_once(':').expect("name: Type").1)).collect()
    };
    (c_of_rust(ret), ps)
}

/// Every `#[no_mangle]` function of src/lib.rs.
fn rust_functions() -> BTreeMap<String, Sig> {
    let mut out = BTreeMap::new();
    for chunk in SOURCE.split("#[no_mangle]").skip(1) {
        let fn_at = chunk.find("fn ").expect("fn after #[no_mangle]");
        let head = &chunk[..fn_at];
        assert!(head.contains("extern \"C\""), "not extern \"C\": {}", &chunk[..fn_at + 40]);
        let rest = &chunk[fn_at + 3..];
        let open = rest.find('(').unwrap();
        let name = rest[..open].trim().to_string();
        let close = rest.find(')').unwrap();
        let body = rest.find('{').unwrap();
        let ret = rest[close + 1..body].trim().trim_start_matches("->");
        out.insert(name, rust_sig(&rest[open + 1..close], ret));
    }
    out
}

#[test]
fn every_exported_function_is_declared_with_its_c_types() {
    let h = header_functions();
    let r = rust_functions();
    assert!(r.len() >= 25, "parsed only {} Rust functions", r.len());
    let missing: Vec<_> = r.keys().filter(|k| !h.contains_key(*k)).collect();
    let extra: Vec<_> = h.keys().filter(|k| !r.contains_key(*k)).collect();
    assert!(missing.is_empty(), "exported but not in ftramp.h: {missing:?}");
    assert!(extra.is_empty(), "declared in ftramp.h but not exported: {extra:?}");
    for (name, sig) in &r {
        assert_eq!(&h[name], sig, "{name}: header (left) vs library (right)");
    }
}

#[test]
fn the_callback_typedef_matches() {
    let text = strip_comments(HEADER);
    let at = text.find("typedef void (*ftramp_func_t)(").expect("typedef of ftramp_func_t");
    let rest = &text[at + "typedef void (*ftramp_func_t)(".len()..];
    let c = ("void".to_string(), c_params(&rest[..rest.find(')').unwrap()]));
    let at = SOURCE.find("pub type FtrampFunc = unsafe extern \"C\" fn(").expect("FtrampFunc");
    let rest = &SOURCE[at..];
    let open = rest.find('(').unwrap();
    let close = rest.find(')').unwrap();
    let ret = rest[close + 1..rest.find(';').unwrap()].trim().trim_start_matches("->");
    assert_eq!(c, rust_sig(&rest[open + 1..close], ret));
}

#[test]
fn every_constant_has_the_library_value() {
    let lib: BTreeMap<&str, i64> = [
        ("FTRAMP_OPS_FL_SAVE_REGS", ftramp::FTRAMP_OPS_FL_SAVE_REGS as i64),
        ("FTRAMP_OPS_FL_RECURSION", ftramp::FTRAMP_OPS_FL_RECURSION as i64),
        ("FTRAMP_OPS_FL_IPMODIFY", ftramp::FTRAMP_OPS_FL_IPMODIFY as i64),
        ("FTRAMP_SITE_NOP", ftramp::FTRAMP_SITE_NOP as i64),
        ("FTRAMP_SITE_DIRECT_ARGS", ftramp::FTRAMP_SITE_DIRECT_ARGS as i64),
        ("FTRAMP_SITE_DIRECT_REGS", ftramp::FTRAMP_SITE_DIRECT_REGS as i64),
        ("FTRAMP_SITE_LIST_ARGS", ftramp::FTRAMP_SITE_LIST_ARGS as i64),
        ("FTRAMP_SITE_LIST_REGS", ftramp::FTRAMP_SITE_LIST_REGS as i64),
    ]
    .into_iter()
    .collect();
    // Every `pub const FTRAMP_*` of the library is in the table above.
    let in_source: Vec<&str> = SOURCE
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub const "))
        .filter_map(|l| l.split(':').next())
        .filter(|n| n.starts_with("FTRAMP_"))
        .collect();
    assert_eq!(in_source.len(), lib.len(), "update this test's table: {in_source:?}");
    let mut header = BTreeMap::new();
    for l in HEADER.lines() {
        let Some(def) = l.trim().strip_prefix("#define ") else { continue };
        let def = strip_comments(def);
        let (name, value) = def.trim().split_once(' ').unwrap_or((def.trim(), ""));
        if !name.starts_with("FTRAMP_") || name == "FTRAMP_H" {
            continue;
        }
        let v = value.trim().trim_start_matches('(').trim_end_matches(')');
        let v: i64 = match v.split_once("<<") {
            Some((one, shift)) => {
                assert_eq!(one.trim(), "1u", "{l}");
                1 << shift.trim().parse::<u32>().unwrap()
            }
            None => v.parse().unwrap_or_else(|_| panic!("cannot read `{l}`")),
        };
        header.insert(name.to_string(), v);
    }
    let lib: BTreeMap<String, i64> = lib.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    assert_eq!(header, lib, "header (left) vs library (right)");
}

/// Compiles a file including the header twice with `compiler`.
fn compile_header(compiler: &str, lang: &str, std: &str) -> std::io::Result<std::process::Output> {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let out = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("ftramp_h_{lang}.o"));
    let mut c = Command::new(compiler)
        .args(["-x", lang, std, "-Wall", "-Wextra", "-Werror", "-pedantic", "-c", "-o"])
        .arg(&out)
        .arg("-I")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/include"))
        .arg("-")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    c.stdin.take().expect("piped").write_all(b"#include <ftramp.h>\n#include <ftramp.h>\nint ftramp_h_ok;\n")?;
    c.wait_with_output()
}

#[test]
fn the_header_compiles_as_c_on_its_own() {
    let o = compile_header(env!("FTRAMP_CAPI_CC"), "c", "-std=c99").expect("running the C compiler");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// With the host's C++ compiler (the header is the same for every arch);
/// a machine without one says so in the test output.
#[test]
fn the_header_compiles_as_cxx_on_its_own() {
    match compile_header("c++", "c++", "-std=c++11") {
        Ok(o) => assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => println!("note: no C++ compiler (c++: {e}); the header was not checked as C++"),
    }
}

/// The shared library exports exactly the header's functions (nothing of
/// the Rust runtime leaks into its dynamic symbol table).
#[test]
fn the_shared_library_exports_exactly_the_header_functions() {
    use object::{Object, ObjectSymbol};
    let exe = std::env::current_exe().expect("test binary path");
    let so = exe.parent().expect("deps dir").join("libftramp.so");
    let data = std::fs::read(&so).unwrap_or_else(|e| panic!("{}: {e} (cargo builds it before the tests)", so.display()));
    let file = object::File::parse(&*data).expect("an ELF file");
    let exported: std::collections::BTreeSet<String> =
        file.dynamic_symbols().filter(|s| s.is_definition() && s.is_global()).map(|s| s.name().expect("symbol name").to_string()).collect();
    let declared: std::collections::BTreeSet<String> = header_functions().into_keys().collect();
    assert_eq!(exported, declared, "libftramp.so's dynamic symbols (left) vs ftramp.h (right)");
}
