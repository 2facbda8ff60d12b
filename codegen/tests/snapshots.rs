//! Golden listings of every (arch × variant), in the top-level `snapshots/`
//! folder.  Review changes with `cargo insta review`; re-bless everything
//! with `INSTA_UPDATE=always cargo test -p ftramp-codegen --test snapshots`.
//! The listings carry two views: the generator's steps and capstone's
//! disassembly of the bytes (checked against GNU objdump by `oracle.rs`).

use ftramp_codegen::{arch, image::Image, listing, spec::Spec, Dispatch, GenOptions, SiteEntry, Tier, Variant};

/// Variants outside [`Variant::ALL`] that get a snapshot too: multi
/// dispatch with two (args tier) and three (regs tier) tracers.
fn extra_variants() -> [Variant; 2] {
    [Variant::multi(Tier::Args, 2).unwrap(), Variant::multi(Tier::Regs, 3).unwrap()]
}

#[test]
fn every_arch_and_variant() {
    let mut count = 0;
    for backend in arch::all() {
        let spec = Spec::builtin(backend.name()).unwrap();
        for v in Variant::ALL {
            let image = Image::generate(&spec, &[v]).unwrap();
            let text = listing::image(&spec, &image).unwrap();
            insta::with_settings!({snapshot_path => "../../snapshots", prepend_module_to_snapshot => false, omit_expression => true}, {
                insta::assert_snapshot!(format!("{}__{}", backend.name(), v.name()), text);
            });
            count += 1;
        }
    }
    assert_eq!(count, arch::all().count() * Variant::ALL.len());
}

#[test]
fn every_arch_multi_dispatch() {
    for backend in arch::all() {
        let spec = Spec::builtin(backend.name()).unwrap();
        for v in extra_variants() {
            let image = Image::generate(&spec, &[v]).unwrap();
            let text = listing::image(&spec, &image).unwrap();
            insta::with_settings!({snapshot_path => "../../snapshots", prepend_module_to_snapshot => false, omit_expression => true}, {
                insta::assert_snapshot!(format!("{}__{}", backend.name(), v.name()), text);
            });
        }
    }
}

/// Stub entry (specs with `site.stub`): the entry ends and the
/// `ftrace_call_through` prefix of `return_to_handler`, for the variants
/// the runtime uses, plus one site stub.
#[test]
fn stub_entry_variants() {
    let mut count = 0;
    for backend in arch::all() {
        let spec = Spec::builtin(backend.name()).unwrap();
        if !spec.raw.site.stub {
            assert!(Image::generate_for(&spec, &[Variant::Return], SiteEntry::Stub).is_err(), "{}: stub entry without site.stub", backend.name());
            continue;
        }
        for v in [
            Variant::Entry { tier: Tier::Args, dispatch: Dispatch::Direct },
            Variant::Entry { tier: Tier::Regs, dispatch: Dispatch::List },
            Variant::Return,
        ] {
            let image = Image::generate_for(&spec, &[v], SiteEntry::Stub).unwrap();
            let text = listing::image(&spec, &image).unwrap();
            insta::with_settings!({snapshot_path => "../../snapshots", prepend_module_to_snapshot => false, omit_expression => true}, {
                insta::assert_snapshot!(format!("{}__stub-{}", backend.name(), v.name()), text);
            });
            count += 1;
        }
    }
    assert_eq!(count, 3, "x86_64 has stub entry");
}

/// The upper halves of the vector registers (specs with
/// `registers.vector_upper_bytes`: x86_64 AVX), in the forms the runtime
/// uses (stub entry) — refused where the spec has none.
#[test]
fn vector_upper_variants() {
    let mut count = 0;
    for backend in arch::all() {
        let spec = Spec::builtin(backend.name()).unwrap();
        let opts = GenOptions { entry: if spec.raw.site.stub { SiteEntry::Stub } else { SiteEntry::Call }, vector_upper: true, vector_wider: false };
        if spec.vector_upper_bytes == 0 {
            assert!(Image::generate_opts(&spec, &[Variant::Return], opts).is_err(), "{}: vector_upper without registers.vector_upper_bytes", backend.name());
            continue;
        }
        for v in [Variant::Entry { tier: Tier::Args, dispatch: Dispatch::Direct }, Variant::Return] {
            let image = Image::generate_opts(&spec, &[v], opts).unwrap();
            let text = listing::image(&spec, &image).unwrap();
            insta::with_settings!({snapshot_path => "../../snapshots", prepend_module_to_snapshot => false, omit_expression => true}, {
                insta::assert_snapshot!(format!("{}__upper-stub-{}", backend.name(), v.name()), text);
            });
            count += 1;
        }
        // AVX-512 CPUs: the restore keeps bits 256-511 (EVEX inserts).
        let wider = GenOptions { vector_wider: true, ..opts };
        let image = Image::generate_opts(&spec, &[Variant::Entry { tier: Tier::Args, dispatch: Dispatch::Direct }], wider).unwrap();
        let text = listing::image(&spec, &image).unwrap();
        insta::with_settings!({snapshot_path => "../../snapshots", prepend_module_to_snapshot => false, omit_expression => true}, {
            insta::assert_snapshot!(format!("{}__wider-stub-args-direct", backend.name()), text);
        });
        assert!(
            Image::generate_opts(&spec, &[Variant::Return], GenOptions { vector_upper: false, ..wider }).is_err(),
            "vector_wider without vector_upper is refused"
        );
        count += 1;
    }
    assert_eq!(count, 3, "x86_64 has vector upper halves");
}

/// The x86_64 site stub and the site's `jmp`, decoded by capstone at their
/// addresses: the stub pushes the address after the site and jumps to the
/// trampoline; out-of-reach placements are refused.
#[test]
fn x86_64_site_stub_decodes() {
    let spec = Spec::builtin("x86_64").unwrap();
    let b = arch::lookup("x86_64").unwrap();
    let (site, stub, tramp) = (0x40_1000u64, 0x7000_0000u64, 0x7000_2000u64);
    let cs = listing::disassembler(&spec).unwrap();
    let text = |bytes: &[u8], at: u64| -> Vec<String> { listing::decode(&cs, bytes, at).into_iter().map(|(_, _, t)| t).collect() };
    let s = b.site_stub(stub, site, tramp).unwrap();
    assert_eq!(s.len(), arch::STUB_LEN);
    assert_eq!(
        text(&s, stub),
        [format!("lea r11, [rip - {:#x}]", stub + 7 - (site + 5)), "push r11".into(), format!("jmp {tramp:#x}"), "int3".into(), "int3".into()]
    );
    assert_eq!(text(&b.site_jump(site, stub).unwrap(), site), [format!("jmp {stub:#x}")]);
    assert!(b.site_stub(0x1_0000_0000_0000, site, tramp).is_err());
    assert!(b.site_jump(site, 0x1_0000_0000_0000).is_err());
    assert!(arch::lookup("aarch64").unwrap().site_stub(stub, site, tramp).is_err());
}
