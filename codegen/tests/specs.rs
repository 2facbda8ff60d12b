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
