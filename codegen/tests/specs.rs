//! Consistency tests generated for every built-in spec, plus the errors a
//! broken spec gets.

use ftramp_codegen::frame::{FrameLayout, Tier};
use ftramp_codegen::spec::{RegClass, SlotKind, Spec, BUILTIN};

fn each_spec(f: impl Fn(&Spec)) {
    assert!(!BUILTIN.is_empty());
    for (name, file, text) in BUILTIN {
        let spec = Spec::parse(file, text).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(&spec.name, name, "{file}: arch.name must match the registry");
        f(&spec);
    }
}

#[test]
fn layouts_do_not_overlap_and_are_aligned() {
    each_spec(|spec| {
        let l = FrameLayout::new(spec);
        assert_eq!(l.overlaps(), None, "{}: overlapping slots", spec.name);
        assert!(l.aligned(), "{}: a slot is not aligned to its size", spec.name);
        assert_eq!(l.fregs_size % 16, 0);
        assert_eq!(l.pt_regs_size % 16, 0);
        assert!(l.pt_regs_size >= l.fregs_size);
        for tier in [Tier::Args, Tier::Regs] {
            let f = l.frame_size(tier);
            assert_eq!(f % spec.stack_alignment, 0, "{}: frame keeps the stack aligned", spec.name);
            assert!(f >= l.fregs_base() + l.tier_size(tier));
        }
        // pt_regs begins with ftrace_regs: same offsets for the shared slots.
        for s in l.fregs_slots() {
            assert!(s.offset + s.size <= l.fregs_size);
        }
        for s in &l.slots[l.fregs_count..] {
            assert!(s.offset >= l.fregs_size);
        }
    });
}

/// `fregs` lies a multiple of 16 bytes below the sp every trampoline was
/// entered with, so it is exactly as aligned as that sp: 16 bytes only
/// where the ABI and the compilers keep sp so at every call.  The header
/// must not declare more: it said `aligned(16)` on x86_64 (where gcc's
/// `-fipa-stack-alignment` enters functions 8 bytes off) and s390x (8-byte
/// ABI), and gcc then folded a callback's `*(__m128d *)fregs->xmm0` into
/// an aligned `addpd` that faulted.
#[test]
fn the_header_declares_no_more_alignment_than_fregs_has() {
    use ftramp_codegen::program::{fp_stack_area, frame_size_with, upper_area};
    use ftramp_codegen::{GenOptions, Variant};
    each_spec(|spec| {
        let l = FrameLayout::new(spec);
        let opts = [
            GenOptions::default(),
            GenOptions { vector_upper: true, ..Default::default() },
            GenOptions { vector_upper: true, vector_wider: true, ..Default::default() },
        ];
        for v in Variant::ALL.iter().copied().chain((1..=Variant::MULTI_MAX).map(|n| Variant::Entry { tier: Tier::Regs, dispatch: ftramp_codegen::Dispatch::Multi(n) })) {
            for o in opts {
                let below = upper_area(spec, &l, v, o) + fp_stack_area(spec, v) + l.fregs_base();
                assert_eq!((frame_size_with(spec, &l, v, o) % 16, below % 16), (0, 0), "{}: {v}: fregs is 16n below the entry sp", spec.name);
            }
        }
        let entry_sp_align = if spec.raw.trampoline.realign_sp { 8 } else { spec.stack_alignment.min(16) };
        assert_eq!(l.fregs_align, entry_sp_align, "{}", spec.name);
        let want = match spec.name.as_str() {
            "x86_64" | "s390x" => 8,
            _ => 16,
        };
        assert_eq!(l.fregs_align, want, "{}", spec.name);
        let h = ftramp_codegen::header::header(spec, "");
        let declared: Vec<u32> = h.match_indices("aligned(").map(|(i, _)| h[i + 8..].split(')').next().unwrap().parse().unwrap()).collect();
        assert!(!declared.is_empty());
        for n in declared {
            assert!(n <= l.fregs_align, "{}: the header declares aligned({n}), fregs is only {}-byte aligned", spec.name, l.fregs_align);
        }
        assert!(h.contains(&format!("}} __attribute__((aligned({want})));")), "{}", spec.name);
        assert!(h.contains(&format!("#define FTRACE_REGS_ALIGN {want}\n")), "{}", spec.name);
    });
}

#[test]
fn registers_named_by_the_abi_exist_and_have_slots() {
    each_spec(|spec| {
        let l = FrameLayout::new(spec);
        for r in spec.int_args.iter().chain(&spec.int_ret).chain(&spec.entry_live) {
            assert_eq!(r.class, RegClass::Gpr);
            assert!(l.slot(SlotKind::Reg(*r)).is_some(), "{}: {} has no slot", spec.name, spec.reg_name(*r));
        }
        for r in spec.fp_args.iter().chain(&spec.fp_ret) {
            assert_eq!(r.class, RegClass::Vector);
            let s = l.slot(SlotKind::Reg(*r)).expect("fp slot");
            assert_eq!(s.size, spec.vector_bytes, "{}: FP registers saved at full width", spec.name);
        }
        for k in [SlotKind::Sp, SlotKind::Ip, SlotKind::ReturnAddress] {
            assert!(l.fregs_slots().iter().any(|s| s.kind == k), "{}: {k:?} missing", spec.name);
        }
        // Scratch registers never carry anything the traced function or
        // its caller can see.
        for r in &spec.scratch {
            assert!(!spec.int_args.contains(r) && !spec.callee_saved.contains(r) && !spec.int_ret.contains(r));
        }
        // Round trip: every register name resolves back to itself.
        for name in spec.raw.registers.gpr.iter().chain(&spec.raw.registers.vector) {
            assert_eq!(&spec.reg_name(spec.reg(name).unwrap()), name);
        }
        // The site's NOP forms all have the site's length.
        assert!(spec.nops.iter().all(|n| n.len() == spec.site_len));
    });
}

fn broken(edit: impl Fn(&str) -> String) -> String {
    let (_, file, text) = BUILTIN[0];
    let text = edit(text);
    Spec::parse(file, &text).expect_err("a broken spec must be rejected").to_string()
}

#[test]
fn an_unknown_register_is_named_with_its_field() {
    let e = broken(|t| t.replacen("int_args = [\"rdi\"", "int_args = [\"rdj\"", 1));
    assert!(e.contains("abi.int_args") && e.contains("rdj") && e.contains("x86_64.toml"), "{e}");
}

#[test]
fn a_toml_error_has_line_and_column() {
    let e = broken(|t| t.replacen("red_zone = 128", "red_zone = \"lots\"", 1));
    assert!(e.contains("x86_64.toml:"), "{e}");
    let line = t_line(BUILTIN[0].2, "red_zone = 128");
    assert!(e.contains(&format!(":{line}:")), "{e} (expected line {line})");
}

fn t_line(text: &str, needle: &str) -> usize {
    text.lines().position(|l| l.contains(needle)).unwrap() + 1
}

#[test]
fn an_unknown_field_is_rejected() {
    let e = broken(|t| t.replacen("red_zone = 128", "red_zone = 128\nredzone = 3", 1));
    assert!(e.contains("redzone"), "{e}");
}

#[test]
fn a_missing_argument_slot_is_rejected() {
    let e = broken(|t| t.replacen("slots = [\"rdi\", ", "slots = [", 1));
    assert!(e.contains("ftrace_regs.slots") && e.contains("rdi"), "{e}");
}

#[test]
fn a_duplicate_slot_is_rejected() {
    let e = broken(|t| t.replacen("slots = [\"rbx\",", "slots = [\"rbx\", \"rbx\",", 1));
    assert!(e.contains("pt_regs.slots") && e.contains("twice"), "{e}");
}

#[test]
fn a_register_missing_from_both_layouts_is_rejected() {
    let e = broken(|t| t.replacen("slots = [\"rbx\", \"r11\",", "slots = [\"rbx\",", 1));
    assert!(e.contains("r11") && e.contains("neither"), "{e}");
}

#[test]
fn a_scratch_register_that_carries_an_argument_is_rejected() {
    let e = broken(|t| t.replacen("scratch = [\"r11\"]", "scratch = [\"rdi\"]", 1));
    assert!(e.contains("trampoline.scratch") && e.contains("rdi"), "{e}");
}

#[test]
fn bad_nop_bytes_are_rejected() {
    let e = broken(|t| t.replacen("\"90 90 90 90 90\"", "\"90 90 zz 90 90\"", 1));
    assert!(e.contains("site.nops[0]") && e.contains("zz"), "{e}");
}

#[test]
fn an_unknown_arch_is_named() {
    let e = Spec::builtin("mips").unwrap_err().to_string();
    assert!(e.contains("mips") && e.contains("x86_64"), "{e}");
}

#[test]
fn a_hardwired_zero_register_is_never_saved() {
    let (_, file, text) = BUILTIN.iter().find(|b| b.0 == "riscv64").expect("riscv64 spec");
    // As a slot: refused.
    let e = Spec::parse(file, &text.replacen("slots = [\"gp\",", "slots = [\"zero\", \"gp\",", 1)).unwrap_err().to_string();
    assert!(e.contains("pt_regs.slots") && e.contains("hardwired"), "{e}");
    // Not declared: then it is a register that neither layout saves.
    let e = Spec::parse(file, &text.replacen("zero = \"zero\"", "", 1)).unwrap_err().to_string();
    assert!(e.contains("`zero`") && e.contains("neither"), "{e}");
    // Declared as something that is not a general-purpose register.
    let e = Spec::parse(file, &text.replacen("zero = \"zero\"", "zero = \"ft0\"", 1)).unwrap_err().to_string();
    assert!(e.contains("registers.zero"), "{e}");
}

/// The error a built-in spec of `arch` gets after `edit`.
fn broken_arch(arch: &str, edit: impl Fn(&str) -> String) -> String {
    let (_, file, text) = BUILTIN.iter().find(|b| b.0 == arch).expect("built-in spec");
    let edited = edit(text);
    assert_ne!(&edited, text, "the edit must change the spec");
    Spec::parse(file, &edited).expect_err("a broken spec must be rejected").to_string()
}

#[test]
fn a_resume_register_that_carries_a_value_is_rejected() {
    // x0 is an argument: resuming through it hands the traced function
    // the resume address as its first argument.
    let e = broken_arch("aarch64", |t| t.replacen("resume_via = \"x9\"", "resume_via = \"x0\"", 1));
    assert!(e.contains("aarch64.toml") && e.contains("site.resume_via") && e.contains("`x0`") && e.contains("argument"), "{e}");
    // x30 gets the return address when resuming.
    let e = broken_arch("aarch64", |t| t.replacen("resume_via = \"x9\"", "resume_via = \"x30\"", 1));
    assert!(e.contains("site.resume_via") && e.contains("`x30`") && e.contains("resume_return_address"), "{e}");
    let e = broken_arch("riscv64", |t| t.replacen("resume_via = \"t0\"", "resume_via = \"s1\"", 1));
    assert!(e.contains("site.resume_via") && e.contains("`s1`") && e.contains("callee-saved"), "{e}");
}

#[test]
fn a_scratch_register_that_holds_an_address_at_entry_is_rejected() {
    // aarch64: the site's `mov x9, x30` leaves the parent in x9.
    let e = broken_arch("aarch64", |t| t.replacen("scratch = [\"x10\", \"x11\"]", "scratch = [\"x9\", \"x11\"]", 1));
    assert!(e.contains("aarch64.toml") && e.contains("trampoline.scratch") && e.contains("`x9`") && e.contains("site.parent"), "{e}");
    // riscv64: the site's `jal t0, …` leaves the address after it in t0.
    let e = broken_arch("riscv64", |t| t.replacen("scratch = [\"t1\"]", "scratch = [\"t0\"]", 1));
    assert!(e.contains("trampoline.scratch") && e.contains("`t0`") && e.contains("site.site_return"), "{e}");
}

#[test]
fn a_special_register_number_the_encoder_does_not_have_is_rejected() {
    let e = broken_arch("aarch64", |t| t.replacen("special = { sp = 31 }", "special = { sp = 40 }", 1));
    assert!(e.contains("aarch64.toml") && e.contains("registers.special") && e.contains("sp = 40") && e.contains("sp = 31"), "{e}");
}

#[test]
fn an_arch_name_that_does_not_go_with_the_registers_is_rejected() {
    // The ELF machine gives it away first…
    let e = broken_arch("aarch64", |t| t.replacen("name = \"aarch64\"", "name = \"x86_64\"", 1));
    assert!(e.contains("aarch64.toml") && e.contains("arch.elf_machine") && e.contains("183") && e.contains("arch.name"), "{e}");
    let e = broken_arch("x86_64", |t| t.replacen("name = \"x86_64\"", "name = \"aarch64\"", 1));
    assert!(e.contains("x86_64.toml") && e.contains("arch.elf_machine") && e.contains("62"), "{e}");
    // …and the register numbering when that is changed too.
    let e = broken_arch("aarch64", |t| t.replacen("name = \"aarch64\"", "name = \"x86_64\"", 1).replacen("elf_machine = 183", "elf_machine = 62", 1));
    assert!(e.contains("registers.gpr") && e.contains("`x0`") && e.contains("`rax`"), "{e}");
    // A name without an encoder.
    let e = broken_arch("aarch64", |t| t.replacen("name = \"aarch64\"", "name = \"arm64\"", 1));
    assert!(e.contains("arch.name") && e.contains("arm64") && e.contains("aarch64"), "{e}");
}

#[test]
fn a_vector_register_the_encoder_does_not_have_is_rejected() {
    // SSE/VEX encode 16 vector registers: xmm17 would be emitted as xmm1,
    // an argument register.
    let e = broken_arch("x86_64", |t| {
        t.replacen("\"xmm14\", \"xmm15\"]", "\"xmm14\", \"xmm15\", \"xmm16\", \"xmm17\"]", 1).replacen("vector_scratch = \"xmm15\"", "vector_scratch = \"xmm17\"", 1)
    });
    assert!(e.contains("x86_64.toml") && e.contains("registers.vector") && e.contains("18") && e.contains("16"), "{e}");
}

#[test]
fn a_vector_scratch_nothing_uses_is_rejected() {
    let e = broken_arch("x86_64", |t| t.replacen("vector_upper_bytes = 16", "vector_upper_bytes = 0", 1).replacen("vector_wider_bytes = 32", "vector_wider_bytes = 0", 1));
    assert!(e.contains("trampoline.vector_scratch") && e.contains("xmm15") && e.contains("vector_upper_bytes"), "{e}");
}

#[test]
fn the_stack_pointer_as_a_slot_is_rejected() {
    let e = broken(|t| t.replacen("slots = [\"rbx\",", "slots = [\"rsp\", \"rbx\",", 1));
    assert!(e.contains("x86_64.toml") && e.contains("pt_regs.slots") && e.contains("`rsp`") && e.contains("stack pointer"), "{e}");
    let e = broken_arch("s390x", |t| t.replacen("slots = [\"r0\",", "slots = [\"r15\", \"r0\",", 1));
    assert!(e.contains("s390x.toml") && e.contains("pt_regs.slots") && e.contains("`r15`") && e.contains("stack pointer"), "{e}");
}

#[test]
fn a_callee_saved_argument_must_be_an_argument() {
    let e = broken_arch("s390x", |t| t.replacen("callee_saved_args = [\"r6\"]", "callee_saved_args = [\"r7\"]", 1));
    assert!(e.contains("s390x.toml") && e.contains("abi.callee_saved_args") && e.contains("`r7`"), "{e}");
    let (_, file, text) = BUILTIN.iter().find(|b| b.0 == "s390x").unwrap();
    let spec = Spec::parse(file, text).unwrap();
    assert_eq!(spec.callee_saved_args.iter().map(|r| spec.reg_name(*r)).collect::<Vec<_>>(), ["r6"]);
}
