//! Golden listings of every (arch × variant), in the top-level `snapshots/`
//! folder.  Review changes with `cargo insta review`; re-bless everything
//! with `INSTA_UPDATE=always cargo test -p ftramp-codegen --test snapshots`.
//! The listings carry two views: the generator's steps and capstone's
//! disassembly of the bytes (checked against GNU objdump by `oracle.rs`).

use ftramp_codegen::{arch, image::Image, listing, spec::Spec, Tier, Variant};

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
