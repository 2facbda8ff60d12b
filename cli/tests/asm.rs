//! `ftramp asm --stub` / `--vector-upper`: the trampolines as the runtime uses them where the
//! spec has stub entry (x86_64), and a clear refusal elsewhere.

use std::process::Command;

fn ftramp(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ftramp")).args(args).env_remove("RUST_BACKTRACE").env_remove("RUST_LIB_BACKTRACE").output().unwrap()
}

#[test]
fn stub_listings_show_the_call_through_the_return_and_the_jump_resume() {
    let out = ftramp(&["asm", "--arch", "x86_64", "-V", "return", "-V", "args-direct", "--stub"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let code: Vec<&str> = text.lines().filter(|l| l.starts_with("   0  ") || l.contains("pop r11") || l.contains("jmp r11") || l.contains("call r11")).collect();
    // return_to_handler starts with ftrace_call_through: pop the resume address, call it.
    let ret = text.find("return_to_handler").unwrap();
    let (pop, call) = (text[ret..].find("41 5b                    pop r11").unwrap(), text[ret..].find("41 ff d3                 call r11").unwrap());
    assert!(pop < call, "{code:?}");
    // ...and ends by returning to the caller through the return predictor
    // (push + ret: pops the caller's entry), not with a jump.
    // (return_to_handler is listed first, then the entry trampoline.)
    let listing = &text[ret..text.find("ftrace_direct_caller").filter(|e| *e > ret).expect("the entry trampoline after return_to_handler")];
    let insns: Vec<&str> = listing.lines().filter(|l| l.contains("  ") && (l.trim_end().ends_with("push r11") || l.trim_end().ends_with("ret") || l.contains("jmp"))).collect();
    assert!(insns.len() >= 2 && insns[insns.len() - 2].ends_with("push r11") && insns[insns.len() - 1].trim_end().ends_with(" ret"), "{listing}");
    assert!(!listing.contains("jmp r11"), "{listing}");
    // The entry trampoline resumes with pop + jmp, not ret.
    let entry = text.find("ftrace_direct_caller").unwrap();
    let body = &text[entry..];
    assert!(body.contains("pop r11") && body.contains("jmp r11") && !body.contains(" ret\n"), "{body}");
    assert!(body.contains("return_to_handler_ptr") && body.contains("ftrace_call_through_ptr"), "{body}");
    // Without --stub: the object ABI's `ret`.
    let plain = String::from_utf8(ftramp(&["asm", "--arch", "x86_64", "-V", "args-direct"]).stdout).unwrap();
    assert!(plain.contains(" ret\n") && !plain.contains("ftrace_call_through_ptr"), "{plain}");
}

#[test]
fn stub_listings_are_refused_for_archs_without_stub_entry() {
    let out = ftramp(&["asm", "--arch", "aarch64", "--stub"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("aarch64") && err.contains("site.stub"), "{err}");
}

#[test]
fn vector_upper_listings_save_and_test_the_upper_halves() {
    let out = ftramp(&["asm", "--arch", "x86_64", "-V", "args-direct", "-V", "return", "--vector-upper"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let count = |s: &str, what: &str| s.lines().filter(|l| l.contains(what)).count();
    let entry = &text[text.find("ftrace_direct_caller").unwrap()..text.find("return_to_handler").unwrap()];
    let ret = &text[text.find("return_to_handler").unwrap()..];
    // ymm0-7 at entry, ymm0-1 at return: stored, then put back only after
    // the OR test (the jump over the inserts comes before the first one).
    for (part, n) in [(entry, 8), (ret, 2)] {
        assert_eq!(count(part, "vextractf128 xmmword ptr"), n, "{part}");
        assert_eq!(count(part, "vinsertf128 ymm"), n, "{part}");
        assert_eq!(count(part, "vpor xmm"), n - 1, "{part}");
        let (test, first) = (part.find("vptest").unwrap(), part.find("vinsertf128").unwrap());
        assert!(test < first && part[test..first].contains("je "), "{part}");
    }
    // The same objects without the option have none of it.
    let plain = String::from_utf8(ftramp(&["asm", "--arch", "x86_64", "-V", "args-direct"]).stdout).unwrap();
    assert!(!plain.contains("ymm"), "{plain}");
    // Archs whose spec has no upper bits refuse it, naming the field.
    let out = ftramp(&["gen", "--arch", "aarch64", "--vector-upper", "-o", "-"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("aarch64") && err.contains("vector_upper_bytes"), "{err}");
}

/// `--vector-wider` (AVX-512): bits 256-511 of `zmm` are saved too, and
/// everything goes back with EVEX inserts that keep the rest of the
/// register, tested in a register that carries nothing (xmm15); it needs
/// `--vector-upper`.
#[test]
fn vector_wider_listings_insert_into_zmm() {
    let out = ftramp(&["asm", "--arch", "x86_64", "-V", "args-direct", "-V", "return", "--vector-upper", "--vector-wider"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let count = |what: &str| text.lines().filter(|l| l.contains(what)).count();
    assert_eq!(count("vinsertf32x4 zmm"), 8 + 2, "{text}");
    assert_eq!(count("vinsertf64x4 zmm"), 8 + 2, "{text}");
    assert_eq!(count("vextractf64x4 ymmword ptr"), 8 + 2, "{text}");
    assert_eq!(count("vinsertf128"), 0, "{text}");
    assert_eq!(count("vptest xmm15, xmm15"), 2 * 2, "{text}");
    let out = ftramp(&["asm", "--arch", "x86_64", "--vector-wider"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--vector-upper"));
}
