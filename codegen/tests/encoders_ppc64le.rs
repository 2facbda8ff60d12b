//! The ppc64le encoder table: each row is one generator primitive, the
//! instruction words it must produce, and their text three ways — the GNU
//! `as` input that makes them, GNU objdump's spelling and capstone's.
//! Checked:
//!
//! * our emitter produces exactly the row's words;
//! * `powerpc64le-linux-gnu-as -mpower9 -mregnames` assembles the row's
//!   source into the same words (the table was made with it);
//! * `powerpc64le-linux-gnu-objdump` and capstone print the row's texts for
//!   those words (capstone has one known misprint: `bcl 20,31,$+4`, BO=20
//!   "branch always", comes out as `bdnzl` — see oracle.rs);
//! * the data-word relocations are the ones GNU `as` writes for
//!   `addis rX,rX,(word-1b)@ha ; addi rX,rX,(word-1b)@l`, and JIT linking
//!   makes each pair address its word;
//! * every encoder-level instruction's [`Insn::gnu`] text assembles to its
//!   [`Insn::encode`] word, and values that do not fit are typed errors.
//!
//! Needs the ppc64le binutils, like `oracle.rs` (`FTRAMP_SKIP_ORACLE=1`
//! skips the tool checks).

use ftramp_codegen::arch::ppc64le::enc::{Insn, Spr};
use ftramp_codegen::arch::{self, Emitter, FixupKind, RelocTarget};
use ftramp_codegen::image::Image;
use ftramp_codegen::program::{CodegenError, DataWord};
use ftramp_codegen::spec::{Reg, Spec};
use ftramp_codegen::{listing, object, Variant};
use std::process::Command;

mod common;
use common::{run, tools_skipped};

struct Row {
    what: &'static str,
    emit: fn(&Spec, &mut dyn Emitter) -> Result<(), CodegenError>,
    /// Instruction words as objdump prints them.
    words: &'static [u32],
    /// GNU `as` source.
    asm: &'static [&'static str],
    /// `objdump -d` text.
    objdump: &'static [&'static str],
    /// capstone text.
    capstone: &'static [&'static str],
}

macro_rules! row {
    (|$s:ident, $e:ident| $call:expr, [$($w:literal),*], [$($a:literal),*], [$($o:literal),*], [$($c:literal),*]) => {
        Row {
            what: stringify!($call),
            emit: |$s, $e| {
                let _ = $s;
                $call
            },
            words: &[$($w),*],
            asm: &[$($a),*],
            objdump: &[$($o),*],
            capstone: &[$($c),*],
        }
    };
}

fn r(s: &Spec, name: &str) -> Reg {
    s.reg(name).unwrap_or_else(|| panic!("no register {name}"))
}

fn table() -> Vec<Row> {
    vec![
        // adjust_sp: allocation writes the back chain.
        row!(|s, e| e.adjust_sp(-608), [0xf821fda1], ["stdu r1,-608(r1)"], ["stdu r1,-608(r1)"], ["stdu r1, -0x260(r1)"]),
        row!(|s, e| e.adjust_sp(-32768), [0xf8218001], ["stdu r1,-32768(r1)"], ["stdu r1,-32768(r1)"], ["stdu r1, -0x8000(r1)"]),
        row!(|s, e| e.adjust_sp(608), [0x38210260], ["addi r1,r1,608"], ["addi r1,r1,608"], ["addi r1, r1, 0x260"]),
        // store: GPR (DS-form), FPR (stfd), VR (stxv, DQ-form).
        row!(|s, e| e.store(r(s, "r3"), r(s, "r1"), 96), [0xf8610060], ["std r3,96(r1)"], ["std r3,96(r1)"], ["std r3, 0x60(r1)"]),
        row!(|s, e| e.store(r(s, "r0"), r(s, "r1"), 200), [0xf80100c8], ["std r0,200(r1)"], ["std r0,200(r1)"], ["std r0, 0xc8(r1)"]),
        row!(|s, e| e.store(r(s, "r31"), r(s, "r1"), -8), [0xfbe1fff8], ["std r31,-8(r1)"], ["std r31,-8(r1)"], ["std r31, -8(r1)"]),
        row!(|s, e| e.store(r(s, "f1"), r(s, "r1"), 208), [0xd82100d0], ["stfd f1,208(r1)"], ["stfd f1,208(r1)"], ["stfd f1, 0xd0(r1)"]),
        row!(|s, e| e.store(r(s, "f13"), r(s, "r1"), -32768), [0xd9a18000], ["stfd f13,-32768(r1)"], ["stfd f13,-32768(r1)"], ["stfd f13, -0x8000(r1)"]),
        row!(|s, e| e.store(r(s, "f31"), r(s, "r3"), 8), [0xdbe30008], ["stfd f31,8(r3)"], ["stfd f31,8(r3)"], ["stfd f31, 8(r3)"]),
        row!(|s, e| e.store(r(s, "v2"), r(s, "r1"), 416), [0xf44101ad], ["stxv vs34,416(r1)"], ["stxv vs34,416(r1)"], ["stxv v2, 0x1a0(r1)"]),
        row!(|s, e| e.store(r(s, "v31"), r(s, "r1"), 32752), [0xf7e17ffd], ["stxv vs63,32752(r1)"], ["stxv vs63,32752(r1)"], ["stxv v31, 0x7ff0(r1)"]),
        // load
        row!(|s, e| e.load(r(s, "r12"), r(s, "r5"), 0), [0xe9850000], ["ld r12,0(r5)"], ["ld r12,0(r5)"], ["ld r12, 0(r5)"]),
        row!(|s, e| e.load(r(s, "r5"), r(s, "r3"), -16), [0xe8a3fff0], ["ld r5,-16(r3)"], ["ld r5,-16(r3)"], ["ld r5, -0x10(r3)"]),
        row!(|s, e| e.load(r(s, "r2"), r(s, "r1"), 32764), [0xe8417ffc], ["ld r2,32764(r1)"], ["ld r2,32764(r1)"], ["ld r2, 0x7ffc(r1)"]),
        row!(|s, e| e.load(r(s, "f1"), r(s, "r1"), 208), [0xc82100d0], ["lfd f1,208(r1)"], ["lfd f1,208(r1)"], ["lfd f1, 0xd0(r1)"]),
        row!(|s, e| e.load(r(s, "v13"), r(s, "r1"), 592), [0xf5a10259], ["lxv vs45,592(r1)"], ["lxv vs45,592(r1)"], ["lxv v13, 0x250(r1)"]),
        row!(|s, e| e.load(r(s, "v0"), r(s, "r1"), -32768), [0xf4018009], ["lxv vs32,-32768(r1)"], ["lxv vs32,-32768(r1)"], ["lxv v0, -0x8000(r1)"]),
        // add_imm: addi, mr, and moves to/from LR and CTR.
        row!(|s, e| e.add_imm(r(s, "r6"), r(s, "r1"), 608), [0x38c10260], ["addi r6,r1,608"], ["addi r6,r1,608"], ["addi r6, r1, 0x260"]),
        row!(|s, e| e.add_imm(r(s, "r3"), r(s, "r12"), -8), [0x386cfff8], ["addi r3,r12,-8"], ["addi r3,r12,-8"], ["addi r3, r12, -8"]),
        row!(|s, e| e.add_imm(r(s, "r12"), r(s, "r3"), 0), [0x7c6c1b78], ["mr r12,r3"], ["mr r12,r3"], ["mr r12, r3"]),
        row!(|s, e| e.add_imm(r(s, "r6"), r(s, "r1"), 0), [0x7c260b78], ["mr r6,r1"], ["mr r6,r1"], ["mr r6, r1"]),
        row!(|s, e| e.add_imm(r(s, "r12"), r(s, "lr"), 0), [0x7d8802a6], ["mflr r12"], ["mflr r12"], ["mflr r12"]),
        row!(
            |s, e| e.add_imm(r(s, "r3"), r(s, "lr"), -8),
            [0x7c6802a6, 0x3863fff8],
            ["mflr r3", "addi r3,r3,-8"],
            ["mflr r3", "addi r3,r3,-8"],
            ["mflr r3", "addi r3, r3, -8"]
        ),
        row!(|s, e| e.add_imm(r(s, "r12"), r(s, "ctr"), 0), [0x7d8902a6], ["mfctr r12"], ["mfctr r12"], ["mfctr r12"]),
        row!(|s, e| e.add_imm(r(s, "lr"), r(s, "r0"), 0), [0x7c0803a6], ["mtlr r0"], ["mtlr r0"], ["mtlr r0"]),
        row!(|s, e| e.add_imm(r(s, "ctr"), r(s, "r12"), 0), [0x7d8903a6], ["mtctr r12"], ["mtctr r12"], ["mtctr r12"]),
        // data words: the immediates are fixups, left zero.
        row!(
            |s, e| e.load_data(r(s, "r5"), DataWord::FunctionTraceOp),
            [0x429f0005, 0x7ca802a6, 0x3ca50000, 0x38a50000, 0xe8a50000],
            ["bcl 20,31,.+4", "mflr r5", "addis r5,r5,0", "addi r5,r5,0", "ld r5,0(r5)"],
            ["bcl 20,4*cr7+so,0x4", "mflr r5", "addis r5,r5,0", "addi r5,r5,0", "ld r5,0(r5)"],
            ["bdnzl 4", "mflr r5", "addis r5, r5, 0", "addi r5, r5, 0", "ld r5, 0(r5)"]
        ),
        row!(
            |s, e| e.call_data(DataWord::ListFunc, r(s, "r12")),
            [0x429f0005, 0x7d8802a6, 0x3d8c0000, 0x398c0000, 0xe98c0000, 0x7d8903a6, 0x4e800421],
            ["bcl 20,31,.+4", "mflr r12", "addis r12,r12,0", "addi r12,r12,0", "ld r12,0(r12)", "mtctr r12", "bctrl"],
            ["bcl 20,4*cr7+so,0x4", "mflr r12", "addis r12,r12,0", "addi r12,r12,0", "ld r12,0(r12)", "mtctr r12", "bctrl"],
            ["bdnzl 4", "mflr r12", "addis r12, r12, 0", "addi r12, r12, 0", "ld r12, 0(r12)", "mtctr r12", "bctrl"]
        ),
        // calls and jumps: through CTR, callee address in r12 (ELFv2).
        row!(|s, e| e.call_reg(r(s, "r12")), [0x7d8903a6, 0x4e800421], ["mtctr r12", "bctrl"], ["mtctr r12", "bctrl"], ["mtctr r12", "bctrl"]),
        row!(|s, e| e.jump_reg(r(s, "r12")), [0x7d8903a6, 0x4e800420], ["mtctr r12", "bctr"], ["mtctr r12", "bctr"], ["mtctr r12", "bctr"]),
        row!(|s, e| e.jump_reg(r(s, "ctr")), [0x4e800420], ["bctr"], ["bctr"], ["bctr"]),
        row!(|s, e| e.jump_reg(r(s, "lr")), [0x4e800020], ["blr"], ["blr"], ["blr"]),
        // flags: the condition register.
        row!(
            |s, e| e.save_flags(768, r(s, "r12")),
            [0x7d800026, 0xf9810300],
            ["mfcr r12", "std r12,768(r1)"],
            ["mfcr r12", "std r12,768(r1)"],
            ["mfcr r12", "std r12, 0x300(r1)"]
        ),
        row!(
            |s, e| e.restore_flags(768, r(s, "r12")),
            [0xe9810300, 0x7d8ff120],
            ["ld r12,768(r1)", "mtcrf 255,r12"],
            ["ld r12,768(r1)", "mtcr r12"],
            ["ld r12, 0x300(r1)", "mtcrf 0xff, r12"]
        ),
    ]
}

fn spec() -> Spec {
    Spec::builtin("ppc64le").unwrap()
}

fn emit(row: &Row) -> Result<Vec<u8>, CodegenError> {
    let spec = spec();
    let mut e = arch::lookup("ppc64le").unwrap().emitter(&spec);
    (row.emit)(&spec, e.as_mut())?;
    Ok(e.finish()?.0)
}

fn bytes(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

fn tmpdir(tag: &str) -> std::path::PathBuf {
    common::tmpdir("ppc64le", tag)
}

/// Assembles `src` (ELFv2, POWER9, `r`/`f`/`vs` register names) and returns
/// the object's path.
fn assemble(dir: &std::path::Path, src: &str) -> std::path::PathBuf {
    std::fs::write(dir.join("t.s"), format!("\t.abiversion 2\n\t.text\n{src}")).unwrap();
    let obj = dir.join("t.o");
    run(Command::new("powerpc64le-linux-gnu-as").args(["-mpower9", "-mregnames", "-a64", "-mlittle", "-o"]).arg(&obj).arg(dir.join("t.s")));
    obj
}

fn text_section(dir: &std::path::Path, obj: &std::path::Path) -> Vec<u8> {
    let bin = dir.join("t.bin");
    run(Command::new("powerpc64le-linux-gnu-objcopy").args(["-O", "binary", "-j", ".text"]).arg(obj).arg(&bin));
    std::fs::read(bin).unwrap()
}

/// Spacing- and radix-insensitive text: `std r3, 0x60(r1)` == `std r3,96(r1)`.
fn normalize(text: &str) -> String {
    let text = text.trim().to_lowercase();
    let (mnemonic, ops) = text.split_once(char::is_whitespace).unwrap_or((&text, ""));
    let ops: String = ops.chars().filter(|c| !c.is_whitespace()).collect();
    let mut out = format!("{mnemonic} ");
    let mut token = String::new();
    let flush = |token: &mut String, out: &mut String| {
        match token.strip_prefix("0x").map(|h| i64::from_str_radix(h, 16)) {
            Some(Ok(v)) => out.push_str(&v.to_string()),
            _ => out.push_str(token),
        }
        token.clear();
    };
    for c in ops.chars() {
        if c.is_ascii_alphanumeric() || c == '.' || c == '_' {
            token.push(c);
        } else {
            flush(&mut token, &mut out);
            out.push(c);
        }
    }
    flush(&mut token, &mut out);
    out.trim().to_string()
}

#[test]
fn our_bytes_match_the_table() {
    let mut bad = Vec::new();
    for row in table() {
        assert_eq!(row.words.len(), row.asm.len(), "{}", row.what);
        assert_eq!(row.words.len(), row.objdump.len(), "{}", row.what);
        assert_eq!(row.words.len(), row.capstone.len(), "{}", row.what);
        let want = bytes(row.words);
        match emit(&row) {
            Ok(got) if got == want => {}
            Ok(got) => bad.push(format!("{}: got {got:02x?}, want {want:02x?} ({:?})", row.what, row.asm)),
            Err(e) => bad.push(format!("{}: {e}", row.what)),
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn gnu_as_assembles_the_table_source_to_the_table_bytes() {
    if tools_skipped() {
        return;
    }
    let dir = tmpdir("as");
    let rows = table();
    let src: String = rows.iter().flat_map(|r| r.asm).map(|a| format!("\t{a}\n")).collect();
    let want: Vec<u8> = rows.iter().flat_map(|r| bytes(r.words)).collect();
    let got = text_section(&dir, &assemble(&dir, &src));
    let _ = std::fs::remove_dir_all(&dir);
    // Compare word by word for a readable failure.
    let words = |b: &[u8]| b.chunks(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect::<Vec<_>>();
    let asm: Vec<&str> = rows.iter().flat_map(|r| r.asm.iter().copied()).collect();
    for (i, (g, w)) in words(&got).iter().zip(words(&want)).enumerate() {
        assert_eq!(*g, w, "`{}`: GNU as makes {g:#010x}, the table says {w:#010x}", asm[i]);
    }
    assert_eq!(got.len(), want.len());
}

#[test]
fn objdump_and_capstone_print_the_table_text() {
    if tools_skipped() {
        return;
    }
    let rows = table();
    // Each row at offset 0 of its own blob, so branch targets read the same
    // in every row.
    let dir = tmpdir("objdump");
    let mut bad = Vec::new();
    let cs = listing::disassembler(&spec()).unwrap();
    for row in &rows {
        let blob = bytes(row.words);
        let path = dir.join("t.bin");
        std::fs::write(&path, &blob).unwrap();
        let text = run(Command::new("powerpc64le-linux-gnu-objdump").args(["-D", "-b", "binary", "-m", "powerpc:common64", "-EL", "-M", "power9"]).arg(&path));
        let objdump: Vec<String> = text
            .lines()
            .filter_map(|l| {
                let (addr, rest) = l.trim_start().split_once(':')?;
                usize::from_str_radix(addr.trim(), 16).ok()?;
                let (_hex, insn) = rest.trim_start().split_once('\t')?;
                Some(normalize(&insn.replace('\t', " ")))
            })
            .collect();
        let want: Vec<String> = row.objdump.iter().map(|t| normalize(t)).collect();
        if objdump != want {
            bad.push(format!("{}: objdump {objdump:?}, table {want:?}", row.what));
        }
        let capstone: Vec<String> = listing::decode(&cs, &blob, 0).into_iter().map(|(_, _, t)| normalize(&t)).collect();
        let want: Vec<String> = row.capstone.iter().map(|t| normalize(t)).collect();
        if capstone != want {
            bad.push(format!("{}: capstone {capstone:?}, table {want:?}", row.what));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// Every encoder instruction's own GNU text assembles to its word.
#[test]
fn each_insn_gnu_text_assembles_to_its_word() {
    if tools_skipped() {
        return;
    }
    let insns = [
        Insn::Std { rs: 0, ds: 16, ra: 1 },
        Insn::Stdu { rs: 1, ds: -32, ra: 1 },
        Insn::Ld { rt: 31, ds: -32768, ra: 31 },
        Insn::Stfd { frs: 0, d: 32767, ra: 2 },
        Insn::Lfd { frt: 31, d: -1, ra: 30 },
        Insn::Stxv { xs: 0, dq: 16, ra: 1 },
        Insn::Stxv { xs: 31, dq: -16, ra: 1 },
        Insn::Stxv { xs: 32, dq: 0, ra: 9 },
        Insn::Lxv { xt: 63, dq: 32752, ra: 31 },
        Insn::Lxv { xt: 1, dq: 48, ra: 1 },
        Insn::Addi { rt: 0, ra: 1, si: -32768 },
        Insn::Addis { rt: 12, ra: 2, si: 32767 },
        Insn::Addis { rt: 3, ra: 3, si: -1 },
        Insn::Mr { ra: 31, rs: 0 },
        Insn::Mfspr { rt: 0, spr: Spr::Lr },
        Insn::Mfspr { rt: 31, spr: Spr::Ctr },
        Insn::Mtspr { spr: Spr::Lr, rs: 31 },
        Insn::Mtspr { spr: Spr::Ctr, rs: 0 },
        Insn::Mfcr { rt: 0 },
        Insn::Mtcrf { fxm: 0xff, rs: 31 },
        Insn::Mtcrf { fxm: 0x0f, rs: 3 }, // as turns a one-field mask into mtocrf
        Insn::BclNext,
        Insn::Bctr,
        Insn::Bctrl,
        Insn::Blr,
        Insn::B { off: -4 },
        Insn::B { off: (1 << 25) - 4 },
        Insn::Bl { off: -(1 << 25) },
        Insn::Bl { off: 8 },
        Insn::Nop,
        Insn::Trap,
    ];
    let dir = tmpdir("insn");
    let src: String = insns.iter().map(|i| format!("\t{}\n", i.gnu())).collect();
    let got = text_section(&dir, &assemble(&dir, &src));
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(got.len(), insns.len() * 4);
    for (i, insn) in insns.iter().enumerate() {
        let g = u32::from_le_bytes(got[i * 4..i * 4 + 4].try_into().unwrap());
        assert_eq!(g, insn.encode().unwrap(), "`{}` ({insn:?}): GNU as {g:#010x}", insn.gnu());
    }
}

#[test]
fn data_word_pairs_carry_their_fixups() {
    let spec = spec();
    let backend = arch::lookup("ppc64le").unwrap();
    let mut e = backend.emitter(&spec);
    e.adjust_sp(-96).unwrap();
    e.call_data(DataWord::ReturnHandler, r(&spec, "r12")).unwrap();
    let (_, fixups) = e.finish().unwrap();
    let kinds: Vec<_> = fixups.iter().map(|f| (f.at, f.kind)).collect();
    // stdu at 0, bcl at 4, label (mflr) at 8, addis at 12, addi at 16.
    assert_eq!(kinds, [(12, FixupKind::Ppc64Rel16Ha { from_label: 4 }), (16, FixupKind::Ppc64Rel16Lo { from_label: 8 })]);
    let relocs: Vec<_> = fixups.iter().flat_map(|f| backend.elf_relocs(f)).map(|r| (r.offset, r.r_type, r.target, r.addend)).collect();
    assert_eq!(
        relocs,
        [
            (12, ::object::elf::R_PPC64_REL16_HA, RelocTarget::Data(DataWord::ReturnHandler), 4),
            (16, ::object::elf::R_PPC64_REL16_LO, RelocTarget::Data(DataWord::ReturnHandler), 8),
        ]
    );
}

/// `readelf -rW` rows as (offset, type, addend).
fn relocs_of(obj: &std::path::Path) -> Vec<(u64, String, i64)> {
    run(Command::new("powerpc64le-linux-gnu-readelf").arg("-rW").arg(obj))
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            if w.len() < 7 || !w[2].starts_with("R_PPC64") {
                return None;
            }
            let off = u64::from_str_radix(w[0], 16).ok()?;
            let sign = if w[5] == "-" { -1 } else { 1 };
            Some((off, w[2].to_string(), sign * i64::from_str_radix(w[6], 16).ok()?))
        })
        .collect()
}

/// The object's relocations for a data load are exactly GNU as's for the
/// hand-written equivalent (same types, offsets and addends, against a
/// symbol at the word).
#[test]
fn relocations_match_gnu_as() {
    if tools_skipped() {
        return;
    }
    let spec = spec();
    let image = Image::generate(&spec, &[Variant::Return]).unwrap();
    let dir = tmpdir("reloc");
    let ours = dir.join("ours.o");
    std::fs::write(&ours, object::write(&spec, &image, &Default::default()).unwrap()).unwrap();
    // The same code, with the data load written as GNU as source.
    let t = &image.trampolines[0];
    let f = image.fixups.iter().find(|f| matches!(f.kind, FixupKind::Ppc64Rel16Ha { .. })).unwrap();
    let bcl = f.at - 8;
    let mut src = String::new();
    for (i, w) in image.code[t.offset..t.offset + t.len].chunks(4).enumerate() {
        let at = t.offset + i * 4;
        let word = u32::from_le_bytes(w.try_into().unwrap());
        src.push_str(&match at {
            _ if at == bcl + 4 => "1:\tmflr r12\n".to_string(),
            _ if at == f.at => "\taddis r12,r12,(word-1b)@ha\n".to_string(),
            _ if at == f.at + 4 => "\taddi r12,r12,(word-1b)@l\n".to_string(),
            _ => format!("\t.long {word:#010x}\n"),
        });
    }
    src.push_str("\t.data\n\t.p2align 3\nword:\t.quad 0\n");
    let theirs = assemble(&dir, &src);
    let a = relocs_of(&ours);
    let b = relocs_of(&theirs);
    let code_a = text_section(&dir, &ours);
    let code_b = text_section(&dir, &theirs);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(code_a, code_b, "same code");
    // Ours: REL16 pairs in .text, then the absolute word in .data.
    let text_relocs: Vec<_> = a.iter().filter(|r| r.1.starts_with("R_PPC64_REL16")).cloned().collect();
    assert_eq!(text_relocs, b, "GNU as: {b:?}");
    assert_eq!(b.iter().map(|r| r.1.as_str()).collect::<Vec<_>>(), ["R_PPC64_REL16_HA", "R_PPC64_REL16_LO"]);
}

/// Decodes every addis+addi pair of linked code and checks it addresses its word.
#[test]
fn jit_linking_reaches_each_word() {
    let spec = spec();
    let image = Image::generate(&spec, &Variant::ALL).unwrap();
    let code_addr = 0x7fff_1234_5000u64;
    for data_addr in [code_addr + 0x1000, code_addr + 0x8000, code_addr + 0x7ff8, code_addr - 0x7fff_0000, code_addr + 0x7ffe_0000, code_addr + 0x12_3456 * 8] {
        let code = image.link(code_addr, data_addr).unwrap();
        let word = |at: usize| u32::from_le_bytes(code[at..at + 4].try_into().unwrap());
        for f in image.fixups.iter().filter(|f| matches!(f.kind, FixupKind::Ppc64Rel16Ha { .. })) {
            let lo = image.fixups.iter().find(|l| l.at == f.at + 4).expect("pair");
            assert_eq!(lo.kind, FixupKind::Ppc64Rel16Lo { from_label: 8 });
            assert_eq!(lo.word, f.word);
            assert_eq!(word(f.at - 8), 0x429f_0005, "bcl 20,31,$+4 before the label");
            let label = code_addr + f.at as u64 - 4;
            let ha = (word(f.at) & 0xffff) as u16 as i16 as i64;
            let lo = (word(f.at + 4) & 0xffff) as u16 as i16 as i64;
            let target = label.wrapping_add(((ha << 16) + lo) as u64);
            let want = data_addr + image.word_offset(f.word).unwrap() as u64;
            assert_eq!(target, want, "{:?} at {:#x} with data at {data_addr:#x}", f.word, f.at);
        }
    }
    let far = image.link(code_addr, code_addr + 0x8000_0000).unwrap_err();
    assert!(matches!(far, CodegenError::OutOfRange { arch: "ppc64le", .. }), "{far}");
}

#[test]
fn what_does_not_fit_is_a_typed_error() {
    let spec = spec();
    let backend = arch::lookup("ppc64le").unwrap();
    let out_of_range = |res: Result<(), CodegenError>| matches!(res, Err(CodegenError::OutOfRange { arch: "ppc64le", .. }));
    let mut e = backend.emitter(&spec);
    assert!(out_of_range(e.store(r(&spec, "r3"), r(&spec, "r1"), 32768)));
    assert!(out_of_range(e.store(r(&spec, "r3"), r(&spec, "r1"), 6)), "DS-form needs a multiple of 4");
    assert!(out_of_range(e.load(r(&spec, "f1"), r(&spec, "r1"), -32769)));
    assert!(out_of_range(e.store(r(&spec, "v2"), r(&spec, "r1"), 8)), "DQ-form needs a multiple of 16");
    assert!(out_of_range(e.load(r(&spec, "v2"), r(&spec, "r1"), 32768)));
    assert!(out_of_range(e.store(r(&spec, "r3"), r(&spec, "r0"), 8)), "r0 is not a base");
    assert!(out_of_range(e.add_imm(r(&spec, "r3"), r(&spec, "r3"), 32768)));
    assert!(out_of_range(e.add_imm(r(&spec, "r3"), r(&spec, "r0"), 8)), "addi from r0 is li");
    assert!(out_of_range(e.adjust_sp(-32772)));
    assert!(out_of_range(e.adjust_sp(-6)));
    assert!(out_of_range(e.adjust_sp(40000)));
    assert!(matches!(e.ret(), Err(CodegenError::Unsupported { .. })));
    assert!(matches!(e.load_data(r(&spec, "r0"), DataWord::FunctionTraceOp), Err(CodegenError::Unsupported { .. })));
    assert!(matches!(e.call_data(DataWord::ListFunc, r(&spec, "r11")), Err(CodegenError::Unsupported { .. })), "ELFv2 calls need r12");
    assert!(matches!(e.call_reg(r(&spec, "r3")), Err(CodegenError::Unsupported { .. })));
    assert!(matches!(e.store(r(&spec, "lr"), r(&spec, "r1"), 16), Err(CodegenError::Unsupported { .. })));
    assert!(matches!(e.add_imm(r(&spec, "lr"), r(&spec, "r0"), 4), Err(CodegenError::Unsupported { .. })));
    assert_eq!(e.pos(), 0, "nothing emitted for refused primitives");
    for bad in [
        Insn::Stxv { xs: 64, dq: 0, ra: 1 },
        Insn::Std { rs: 32, ds: 0, ra: 1 },
        Insn::Stfd { frs: 32, d: 0, ra: 1 },
        Insn::Addis { rt: 3, ra: 3, si: 0x8000 },
        Insn::Bl { off: 1 << 25 },
        Insn::Bl { off: -(1 << 25) - 4 },
        Insn::B { off: 2 },
    ] {
        assert!(matches!(bad.encode(), Err(CodegenError::OutOfRange { arch: "ppc64le", .. })), "{bad:?}");
    }
}

#[test]
fn the_site_call_is_mflr_r0_then_bl() {
    let spec = spec();
    let backend = arch::lookup("ppc64le").unwrap();
    let site = 0x1000_0040u64;
    // The first word is the disabled form's first word: only the `bl` changes.
    for target in [site + 4 + 0x1ff_fffc, site + 4 - 0x200_0000, site - 0x40] {
        let b = backend.site_call(site, target).unwrap();
        assert_eq!(b.len(), spec.site_len);
        assert_eq!(b[..4], spec.nops[0][..4], "mflr r0 stays");
        let bl = u32::from_le_bytes(b[4..].try_into().unwrap());
        assert_eq!(bl & 0xfc00_0003, 0x4800_0001, "bl");
        let off = (((bl & 0x03ff_fffc) << 6) as i32 >> 6) as i64;
        assert_eq!((site + 4).wrapping_add(off as u64), target);
        let cs = listing::disassembler(&spec).unwrap();
        let text: Vec<String> = listing::decode(&cs, &b, site).into_iter().map(|(_, _, t)| normalize(&t)).collect();
        assert_eq!(text, [normalize("mflr r0"), normalize(&format!("bl {target:#x}"))]);
    }
    for target in [site + 4 + 0x200_0000, site + 4 - 0x200_0004, site + 6] {
        assert!(matches!(backend.site_call(site, target), Err(CodegenError::OutOfRange { .. })), "{target:#x}");
    }
    // Padding between trampolines traps.
    assert_eq!(backend.padding(), Insn::Trap.bytes().unwrap());
    assert_eq!(spec.nops[0], [Insn::Mfspr { rt: 0, spr: Spr::Lr }.bytes().unwrap(), Insn::Nop.bytes().unwrap()].concat());
}
