//! The s390x encoder table: each row is one generator primitive (or a
//! patch-site form), the bytes it must produce and their GNU text.  The
//! table is checked four ways:
//!
//! * our backend produces exactly the row's bytes;
//! * GNU `as` (`s390x-linux-gnu-as`, `.machine z13`) assembles the row's
//!   text into the same bytes;
//! * GNU objdump prints the row's text for those bytes;
//! * capstone prints the same text — except for the NOP forms, which
//!   capstone names by their raw instructions (`bcr 0,%r0`, `brcl 0,…`;
//!   DESIGN §7): there only the instruction boundaries are compared.
//!
//! PC-relative operands are written `.+N` (relative to the instruction);
//! objdump's and capstone's absolute targets are turned back into that form.
//! s390x is big-endian and the host is not: every expected byte string here
//! is in memory order, so a host-order leak shows up as swapped bytes.
//! Needs the s390x binutils, like `oracle.rs` (`FTRAMP_SKIP_ORACLE=1`
//! skips the tool checks).

use ftramp_codegen::arch::{self, Emitter, FixupKind, RelocTarget};
use ftramp_codegen::image::Image;
use ftramp_codegen::program::{CodegenError, DataWord};
use ftramp_codegen::spec::{Reg, Spec};
use ftramp_codegen::{listing, object, Variant};
use std::process::Command;

mod common;
use common::{run, tools_skipped};

const ARCH: &str = "s390x";

struct Row {
    what: &'static str,
    emit: fn(&Spec) -> Result<Vec<u8>, CodegenError>,
    /// Bytes in memory order, as objdump prints them.
    hex: &'static str,
    /// GNU text, one entry per instruction.
    gnu: &'static [&'static str],
    /// objdump's spelling where it differs from the input text.
    objdump: Option<&'static [&'static str]>,
    /// Whether capstone's text is compared (false: raw NOP names).
    capstone_text: bool,
}

fn primitive(s: &Spec, f: impl FnOnce(&Spec, &mut dyn Emitter) -> Result<(), CodegenError>) -> Result<Vec<u8>, CodegenError> {
    let mut e = arch::lookup(ARCH).unwrap().emitter(s);
    f(s, e.as_mut())?;
    Ok(e.finish()?.0)
}

macro_rules! row {
    (|$s:ident, $e:ident| $call:expr, $hex:literal, [$($g:literal),*]) => {
        Row {
            what: stringify!($call),
            emit: |spec| primitive(spec, |$s, $e| {
                let _ = $s;
                $call
            }),
            hex: $hex,
            gnu: &[$($g),*],
            objdump: None,
            capstone_text: true,
        }
    };
}

fn r(s: &Spec, name: &str) -> Reg {
    s.reg(name).unwrap_or_else(|| panic!("no register {name}"))
}

fn spec() -> Spec {
    Spec::builtin(ARCH).unwrap()
}

fn table() -> Vec<Row> {
    let mut rows = vec![
        // adjust_sp / add_imm
        row!(|s, e| e.adjust_sp(-512), "e3 f0 fe 00 ff 71", ["lay %r15,-512(%r15)"]),
        row!(|s, e| e.adjust_sp(512), "41 f0 f2 00", ["la %r15,512(%r15)"]),
        row!(|s, e| e.adjust_sp(4096), "e3 f0 f0 00 01 71", ["lay %r15,4096(%r15)"]),
        row!(|s, e| e.adjust_sp(-524288), "e3 f0 f0 00 80 71", ["lay %r15,-524288(%r15)"]),
        row!(|s, e| e.add_imm(r(s, "r5"), r(s, "r15"), 160), "41 50 f0 a0", ["la %r5,160(%r15)"]),
        row!(|s, e| e.add_imm(r(s, "r5"), r(s, "r15"), 4095), "41 50 ff ff", ["la %r5,4095(%r15)"]),
        row!(|s, e| e.add_imm(r(s, "r1"), r(s, "r15"), -8), "e3 10 ff f8 ff 71", ["lay %r1,-8(%r15)"]),
        row!(|s, e| e.add_imm(r(s, "r2"), r(s, "r0"), -6), "ec 20 ff fa 00 d9", ["aghik %r2,%r0,-6"]),
        row!(|s, e| e.add_imm(r(s, "r5"), r(s, "r15"), 0), "b9 04 00 5f", ["lgr %r5,%r15"]),
        row!(|s, e| e.add_imm(r(s, "r14"), r(s, "r2"), 0), "b9 04 00 e2", ["lgr %r14,%r2"]),
        // store / load: general registers (20-bit displacement)
        row!(|s, e| e.store(r(s, "r2"), r(s, "r15"), 160), "e3 20 f0 a0 00 24", ["stg %r2,160(%r15)"]),
        row!(|s, e| e.store(r(s, "r0"), r(s, "r15"), 524287), "e3 00 ff ff 7f 24", ["stg %r0,524287(%r15)"]),
        row!(|s, e| e.store(r(s, "r14"), r(s, "r2"), -8), "e3 e0 2f f8 ff 24", ["stg %r14,-8(%r2)"]),
        row!(|s, e| e.load(r(s, "r4"), r(s, "r2"), -8), "e3 40 2f f8 ff 04", ["lg %r4,-8(%r2)"]),
        row!(|s, e| e.load(r(s, "r1"), r(s, "r4"), 0), "e3 10 40 00 00 04", ["lg %r1,0(%r4)"]),
        row!(|s, e| e.load(r(s, "r13"), r(s, "r15"), -524288), "e3 d0 f0 00 80 04", ["lg %r13,-524288(%r15)"]),
        // vector registers, full 16 bytes (12-bit displacement; RXB for v16-v31)
        row!(|s, e| e.store(r(s, "v0"), r(s, "r15"), 240), "e7 00 f0 f0 00 0e", ["vst %v0,240(%r15)"]),
        row!(|s, e| e.store(r(s, "v24"), r(s, "r15"), 304), "e7 80 f1 30 08 0e", ["vst %v24,304(%r15)"]),
        row!(|s, e| e.load(r(s, "v31"), r(s, "r15"), 4095), "e7 f0 ff ff 08 06", ["vl %v31,4095(%r15)"]),
        row!(|s, e| e.load(r(s, "v6"), r(s, "r15"), 0), "e7 60 f0 00 00 06", ["vl %v6,0(%r15)"]),
        // runs of consecutive registers (trampoline.multiple)
        row!(|s, e| e.store_multiple(r(s, "r2"), 5, r(s, "r15"), 160, 8), "eb 26 f0 a0 00 24", ["stmg %r2,%r6,160(%r15)"]),
        row!(|s, e| e.load_multiple(r(s, "r12"), 2, r(s, "r15"), -8, 8), "eb cd ff f8 ff 04", ["lmg %r12,%r13,-8(%r15)"]),
        row!(|s, e| e.store_multiple(r(s, "v24"), 8, r(s, "r15"), 368, 16), "e7 8f f1 70 0c 3e", ["vstm %v24,%v31,368(%r15)"]),
        row!(|s, e| e.load_multiple(r(s, "v0"), 8, r(s, "r15"), 240, 16), "e7 07 f0 f0 00 36", ["vlm %v0,%v7,240(%r15)"]),
        row!(|s, e| e.load_multiple(r(s, "v15"), 2, r(s, "r15"), 0, 16), "e7 f0 f0 00 04 36", ["vlm %v15,%v16,0(%r15)"]),
        row!(
            |s, e| e.store_multiple(r(s, "v0"), 17, r(s, "r15"), 160, 16),
            "e7 0f f0 a0 00 3e e7 00 f1 a0 08 0e",
            ["vstm %v0,%v15,160(%r15)", "vst %v16,416(%r15)"]
        ),
        // data words: the halfword offset is a fixup, zero here
        row!(|s, e| e.load_data(r(s, "r4"), DataWord::FunctionTraceOp), "c4 48 00 00 00 00", ["lgrl %r4,.+0"]),
        row!(|s, e| e.call_data(DataWord::ListFunc, r(s, "r1")), "c4 18 00 00 00 00 0d e1", ["lgrl %r1,.+0", "basr %r14,%r1"]),
        // calls and jumps
        row!(|s, e| e.call_reg(r(s, "r1")), "0d e1", ["basr %r14,%r1"]),
        row!(|s, e| e.jump_reg(r(s, "r1")), "07 f1", ["br %r1"]),
        row!(|s, e| e.jump_reg(r(s, "r14")), "07 fe", ["br %r14"]),
        // the condition code
        row!(
            |s, e| e.save_flags(496, r(s, "r1")),
            "a7 19 00 00 b2 22 00 10 e3 10 f1 f0 00 24",
            ["lghi %r1,0", "ipm %r1", "stg %r1,496(%r15)"]
        ),
        row!(|s, e| e.restore_flags(496, r(s, "r1")), "e3 10 f1 f0 00 04 04 10", ["lg %r1,496(%r15)", "spm %r1"]),
    ];
    // The patch site: enabled form and the spec's NOP forms.
    rows.push(Row {
        what: "site_call(0x1000, 0x2000)",
        emit: |_| arch::lookup(ARCH).unwrap().site_call(0x1000, 0x2000),
        hex: "c0 05 00 00 08 00",
        gnu: &["brasl %r0,.+4096"],
        objdump: None,
        capstone_text: true,
    });
    rows.push(Row {
        what: "site_call(0x100000000, 0)",
        emit: |_| arch::lookup(ARCH).unwrap().site_call(0x1_0000_0000, 0),
        hex: "c0 05 80 00 00 00",
        gnu: &["brasl %r0,.-4294967296"],
        objdump: None,
        capstone_text: true,
    });
    rows.push(Row {
        what: "spec.nops[0] (-fpatchable-function-entry=3)",
        emit: |s| Ok(s.nops[0].clone()),
        hex: "07 00 07 00 07 00",
        gnu: &["nopr %r0", "nopr %r0", "nopr %r0"],
        objdump: Some(&["nopr", "nopr", "nopr"]),
        capstone_text: false,
    });
    rows.push(Row {
        what: "spec.nops[1] (-mnop-mcount / -mhotpatch)",
        emit: |s| Ok(s.nops[1].clone()),
        hex: "c0 04 00 00 00 00",
        gnu: &["brcl 0,.+0"],
        objdump: Some(&["jgnop .+0"]),
        capstone_text: false,
    });
    rows
}

fn bytes(hex: &str) -> Vec<u8> {
    hex.split_whitespace().map(|b| u8::from_str_radix(b, 16).unwrap()).collect()
}

/// Length of an s390x instruction from its first byte (bits 0-1 of the opcode).
fn insn_len(first: u8) -> usize {
    match first >> 6 {
        0 => 2,
        1 | 2 => 4,
        _ => 6,
    }
}

fn tmpdir(tag: &str) -> std::path::PathBuf {
    common::tmpdir("s390x", tag)
}

const PC_RELATIVE: &[&str] = &["lgrl", "brasl", "brcl", "jgnop"];

/// Spacing- and radix-insensitive form of an instruction at `at`; the last
/// operand of a PC-relative instruction becomes `.+N` / `.-N`.
fn normalize(text: &str, at: usize) -> String {
    let text = text.split('#').next().unwrap_or("").split('<').next().unwrap_or("").trim().to_lowercase();
    let (mnemonic, ops) = text.split_once(char::is_whitespace).unwrap_or((&text, ""));
    let ops: String = ops.chars().filter(|c| !c.is_whitespace()).collect();
    let mut ops: Vec<String> = ops.split(',').filter(|o| !o.is_empty()).map(|o| o.to_string()).collect();
    if PC_RELATIVE.contains(&mnemonic) {
        if let Some(last) = ops.last_mut() {
            let rel = if let Some(r) = last.strip_prefix('.') {
                number(r).unwrap_or_else(|| panic!("bad relative operand {last}"))
            } else {
                number(last).unwrap_or_else(|| panic!("bad target {last}")) - at as i64
            };
            *last = if rel < 0 { format!(".-{}", -rel) } else { format!(".+{rel}") };
        }
    }
    let ops: Vec<String> = ops.iter().map(|o| if o.starts_with('.') { o.clone() } else { radix(o) }).collect();
    format!("{mnemonic} {}", ops.join(",")).trim().to_string()
}

fn number(s: &str) -> Option<i64> {
    let (neg, s) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let v = match s.strip_prefix("0x") {
        // Targets below address 0 wrap around in objdump's 64-bit output.
        Some(h) => u64::from_str_radix(h, 16).ok()? as i64,
        None => s.parse().ok()?,
    };
    Some(if neg { -v } else { v })
}

/// Hex numbers in an operand (`-0x200(%r15)`) in decimal.
fn radix(op: &str) -> String {
    let mut out = String::new();
    let mut token = String::new();
    let flush = |token: &mut String, out: &mut String| {
        match token.strip_prefix("0x").map(|h| i64::from_str_radix(h, 16)) {
            Some(Ok(v)) => out.push_str(&v.to_string()),
            _ => out.push_str(token),
        }
        token.clear();
    };
    for c in op.chars() {
        if c.is_ascii_alphanumeric() {
            token.push(c);
        } else {
            flush(&mut token, &mut out);
            out.push(c);
        }
    }
    flush(&mut token, &mut out);
    out
}

/// `(offset, text)` of every instruction of the table laid end to end.
fn blob(rows: &[Row], pick: impl Fn(&Row) -> &'static [&'static str]) -> (Vec<u8>, Vec<(usize, String)>) {
    let mut blob = Vec::new();
    let mut want = Vec::new();
    for row in rows {
        let b = bytes(row.hex);
        let mut off = 0;
        for g in pick(row) {
            want.push((blob.len() + off, g.to_string()));
            off += insn_len(b[off]);
        }
        assert_eq!(off, b.len(), "{}: the text does not cover the bytes", row.what);
        blob.extend(b);
    }
    (blob, want)
}

#[test]
fn our_bytes_match_the_table() {
    let spec = spec();
    let mut bad = Vec::new();
    for row in table() {
        let want = bytes(row.hex);
        match (row.emit)(&spec) {
            Ok(got) if got == want => {}
            Ok(got) => bad.push(format!("{}: got {got:02x?}, want {want:02x?} ({:?})", row.what, row.gnu)),
            Err(e) => bad.push(format!("{}: {e}", row.what)),
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn gnu_as_assembles_the_table_text_to_the_table_bytes() {
    if tools_skipped() {
        return;
    }
    let dir = tmpdir("as");
    let rows = table();
    let mut src = String::from(".machine z13\n");
    for row in &rows {
        for g in row.gnu {
            src.push_str(g);
            src.push('\n');
        }
    }
    let (want, _) = blob(&rows, |r| r.gnu);
    std::fs::write(dir.join("t.s"), src).unwrap();
    run(Command::new("s390x-linux-gnu-as").arg("-o").arg(dir.join("t.o")).arg(dir.join("t.s")));
    run(Command::new("s390x-linux-gnu-objcopy").args(["-O", "binary", "-j", ".text"]).arg(dir.join("t.o")).arg(dir.join("t.bin")));
    let got = std::fs::read(dir.join("t.bin")).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    // gas pads .text to its alignment with `bcr 0,%r7` (07 07).
    assert!(got.len() >= want.len() && got[want.len()..].chunks(2).all(|c| c == [0x07, 0x07]), "unexpected tail {:02x?}", &got[want.len().min(got.len())..]);
    assert_eq!(got[..want.len()], want[..], "GNU as disagrees with the table");
}

#[test]
fn objdump_and_capstone_print_the_table_text() {
    if tools_skipped() {
        return;
    }
    let rows = table();
    let (code, want) = blob(&rows, |r| r.objdump.unwrap_or(r.gnu));
    let want: Vec<(usize, String)> = want.into_iter().map(|(o, t)| (o, normalize(&t, o))).collect();
    let dir = tmpdir("objdump");
    let path = dir.join("t.bin");
    std::fs::write(&path, &code).unwrap();
    let text = run(Command::new("s390x-linux-gnu-objdump").args(["-D", "-b", "binary", "-m", "s390:64-bit"]).arg(&path));
    let _ = std::fs::remove_dir_all(&dir);
    let objdump: Vec<(usize, String)> = text
        .lines()
        .filter_map(|l| {
            let (addr, rest) = l.trim_start().split_once(':')?;
            let off = usize::from_str_radix(addr.trim(), 16).ok()?;
            let (_hex, insn) = rest.trim_start().split_once('\t')?;
            Some((off, normalize(&insn.replace('\t', " "), off)))
        })
        .collect();
    assert_eq!(objdump, want, "objdump disagrees with the table");

    // Capstone: the same text where it uses GNU names; for the NOP forms
    // only the same instruction boundaries.
    let cs = listing::disassembler(&spec()).unwrap();
    let capstone = listing::decode(&cs, &code, 0);
    let (_, gnu_want) = blob(&rows, |r| r.gnu);
    assert_eq!(capstone.iter().map(|c| c.0).collect::<Vec<_>>(), gnu_want.iter().map(|w| w.0).collect::<Vec<_>>(), "capstone splits the bytes differently");
    let mut i = 0;
    for row in &rows {
        for _ in row.gnu.iter() {
            let (off, _, text) = &capstone[i];
            if row.capstone_text {
                assert_eq!(normalize(text, *off), normalize(&gnu_want[i].1, *off), "capstone, {}", row.what);
            }
            i += 1;
        }
    }
}

#[test]
fn capstone_names_the_nops_raw() {
    // DESIGN §7, pinned so a capstone upgrade that changes it is noticed.
    let cs = listing::disassembler(&spec()).unwrap();
    let text: Vec<String> = listing::decode(&cs, &bytes("07 00 c0 04 00 00 00 00"), 0).into_iter().map(|(o, _, t)| normalize(&t, o)).collect();
    assert_eq!(text, ["bcr 0,%r0", "brcl 0,.+0"]);
}

#[test]
fn data_references_relocate_like_gnu_as() {
    // What `s390x-linux-gnu-as` emits for `lgrl %r1,sym` (readelf -r):
    // R_390_PC32DBL at instruction+2, addend +2.
    let spec = spec();
    let backend = arch::lookup(ARCH).unwrap();
    let mut e = backend.emitter(&spec);
    e.adjust_sp(-160).unwrap();
    e.call_data(DataWord::ReturnHandler, r(&spec, "r1")).unwrap();
    let (_, fixups) = e.finish().unwrap();
    let kinds: Vec<_> = fixups.iter().map(|f| (f.at, f.kind, f.word)).collect();
    assert_eq!(kinds, [(8, FixupKind::S390Pc32Dbl, DataWord::ReturnHandler)]);
    let relocs: Vec<_> = fixups.iter().flat_map(|f| backend.elf_relocs(f)).map(|r| (r.offset, r.r_type, r.target, r.addend)).collect();
    assert_eq!(relocs, [(8, ::object::elf::R_390_PC32DBL, RelocTarget::Data(DataWord::ReturnHandler), 2)]);
    assert_eq!(backend.elf_abs64(), ::object::elf::R_390_64);

    if tools_skipped() {
        return;
    }
    let dir = tmpdir("reloc");
    std::fs::write(dir.join("t.s"), "lay %r15,-160(%r15)\nlgrl %r1,sym\nbasr %r14,%r1\n").unwrap();
    run(Command::new("s390x-linux-gnu-as").arg("-o").arg(dir.join("t.o")).arg(dir.join("t.s")));
    let text = run(Command::new("s390x-linux-gnu-readelf").arg("-rW").arg(dir.join("t.o")));
    let _ = std::fs::remove_dir_all(&dir);
    let line = text.lines().find(|l| l.contains("R_390")).expect("a relocation");
    let f: Vec<&str> = line.split_whitespace().collect();
    assert_eq!((usize::from_str_radix(f[0], 16).unwrap(), f[2], f[f.len() - 1]), (8, "R_390_PC32DBL", "2"), "{line}");
    assert_eq!(u64::from_str_radix(&f[1][f[1].len() - 8..], 16).unwrap(), ::object::elf::R_390_PC32DBL.0 as u64);
}

/// Decodes every `lgrl` of linked code, big-endian, and checks it
/// addresses its word.
#[test]
fn jit_linking_reaches_each_word_big_endian() {
    let spec = spec();
    let image = Image::generate(&spec, &Variant::ALL).unwrap();
    let code_addr = 0x3ff_1234_5000u64;
    for data_addr in [code_addr + 0x1000, code_addr + 0x2468, code_addr - 0xffff_0000, code_addr + 0xffff_f000, code_addr + 0x12_3456 * 8] {
        let code = image.link(code_addr, data_addr).unwrap();
        assert!(!image.fixups.is_empty());
        for f in &image.fixups {
            assert_eq!(f.kind, FixupKind::S390Pc32Dbl);
            let insn = f.at - 2;
            assert_eq!(code[insn], 0xc4, "lgrl opcode at {insn:#x}");
            assert_eq!(code[insn + 1] & 0xf, 0x8, "lgrl opcode at {insn:#x}");
            let half = i32::from_be_bytes(code[f.at..f.at + 4].try_into().unwrap()) as i64;
            let target = (code_addr + insn as u64).wrapping_add((half * 2) as u64);
            let want = data_addr + image.word_offset(f.word).unwrap() as u64;
            assert_eq!(target, want, "{:?} at {:#x} with data at {data_addr:#x}", f.word, f.at);
        }
    }
    // A known value, spelled out: the field is most-significant byte first.
    let f = image.fixups[0];
    let data_addr = 0x10_0000u64;
    let code = image.link(data_addr + image.word_offset(f.word).unwrap() as u64 - 0x2468 - (f.at as u64 - 2), data_addr).unwrap();
    assert_eq!(&code[f.at..f.at + 4], &[0x00, 0x00, 0x12, 0x34]);
    // Out of reach, and misaligned words, are typed errors.
    let far = image.link(code_addr, code_addr + 0x1_0000_1000).unwrap_err();
    assert!(matches!(far, CodegenError::OutOfRange { arch: "s390x", .. }), "{far}");
    let odd = image.link(code_addr, code_addr + 0x1004).unwrap_err();
    assert!(matches!(odd, CodegenError::OutOfRange { arch: "s390x", .. }), "{odd}");
}

#[test]
fn the_object_is_big_endian_s390() {
    let spec = spec();
    let image = Image::generate(&spec, &Variant::ALL).unwrap();
    let obj = object::write(&spec, &image, &Default::default()).unwrap();
    assert_eq!(&obj[..4], b"\x7fELF");
    assert_eq!(obj[4], 2, "ELFCLASS64");
    assert_eq!(obj[5], 2, "ELFDATA2MSB");
    assert_eq!(u16::from_be_bytes([obj[18], obj[19]]), 22, "EM_S390, big-endian");
}

#[test]
fn what_does_not_fit_is_a_typed_error() {
    let spec = spec();
    let backend = arch::lookup(ARCH).unwrap();
    let out_of_range = |res: Result<(), CodegenError>| matches!(res, Err(CodegenError::OutOfRange { arch: "s390x", .. }));
    let mut e = backend.emitter(&spec);
    assert!(out_of_range(e.store(r(&spec, "r2"), r(&spec, "r15"), 524288)));
    assert!(out_of_range(e.load(r(&spec, "r2"), r(&spec, "r15"), -524289)));
    assert!(out_of_range(e.store(r(&spec, "v0"), r(&spec, "r15"), 4096)));
    assert!(out_of_range(e.load(r(&spec, "v24"), r(&spec, "r15"), -16)));
    assert!(out_of_range(e.adjust_sp(-524289)));
    assert!(out_of_range(e.add_imm(r(&spec, "r2"), r(&spec, "r0"), 32768)));
    // r0 is no base register and no branch target.
    assert!(out_of_range(e.store(r(&spec, "r2"), r(&spec, "r0"), 8)));
    assert!(out_of_range(e.call_reg(r(&spec, "r0"))));
    assert!(out_of_range(e.jump_reg(r(&spec, "r0"))));
    assert!(out_of_range(e.call_data(DataWord::ListFunc, r(&spec, "r0"))));
    assert!(out_of_range(e.store_multiple(r(&spec, "r2"), 2, r(&spec, "r15"), 524288, 8)));
    assert!(out_of_range(e.store_multiple(r(&spec, "v0"), 2, r(&spec, "r15"), 4096, 16)));
    assert!(matches!(e.load_multiple(r(&spec, "r2"), 3, r(&spec, "r3"), 0, 8), Err(CodegenError::Unsupported { .. })));
    assert!(matches!(e.store_multiple(r(&spec, "r2"), 2, r(&spec, "r15"), 0, 16), Err(CodegenError::Unsupported { .. })));
    assert!(matches!(e.ret(), Err(CodegenError::Unsupported { .. })));
    assert_eq!(e.pos(), 0, "nothing emitted for refused primitives");
    assert!(matches!(backend.site_call(0x1000, 0x1000 + (1 << 32)), Err(CodegenError::OutOfRange { .. })));
    assert!(matches!(backend.site_call(0x2_0000_0000, 0x2_0000_0000 - (1 << 32) - 2), Err(CodegenError::OutOfRange { .. })));
    assert!(matches!(backend.site_call(0x1000, 0x2001), Err(CodegenError::OutOfRange { .. })));
    assert!(matches!(backend.site_call(0x1001, 0x2001), Err(CodegenError::OutOfRange { .. })));
    assert!(backend.site_call(0x1_0000_0000, 0x1_0000_0000 + (1 << 32) - 2).is_ok());
}
