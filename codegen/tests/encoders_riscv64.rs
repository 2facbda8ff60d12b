//! The riscv64 encoder table: each row is one generator primitive, the
//! instruction words it must produce and their GNU text
//! (`objdump -M no-aliases` spelling).  The table is checked three ways:
//!
//! * our emitter produces exactly the row's words;
//! * GNU `as` assembles the row's text into the same words (the table was
//!   made with it: `riscv64-linux-gnu-as -march=rv64gc`, 32-bit rows under
//!   `.option norvc`);
//! * GNU objdump and capstone both print the row's text for those words.
//!
//! Rows marked `rvc` use the spec as shipped (RVC objects); the others use
//! the same spec with the RVC bit cleared, which must never produce a 16-bit
//! instruction.  Needs the riscv64 binutils, like `oracle.rs`
//! (`FTRAMP_SKIP_ORACLE=1` skips the tool checks).

use ftramp_codegen::arch::{self, Emitter, FixupKind};
use ftramp_codegen::image::Image;
use ftramp_codegen::program::{CodegenError, DataWord};
use ftramp_codegen::spec::{Reg, Spec, BUILTIN};
use ftramp_codegen::{listing, Variant};
use std::process::Command;

mod common;
use common::{run, tools_skipped};

struct Row {
    rvc: bool,
    what: &'static str,
    emit: fn(&Spec, &mut dyn Emitter) -> Result<(), CodegenError>,
    /// Instruction words as objdump prints them (16 or 32 bits).
    words: &'static [&'static str],
    gnu: &'static [&'static str],
}

macro_rules! row {
    ($rvc:expr, |$s:ident, $e:ident| $call:expr, [$($w:literal),*], [$($g:literal),*]) => {
        Row {
            rvc: $rvc,
            what: stringify!($call),
            emit: |$s, $e| {
                let _ = $s;
                $call
            },
            words: &[$($w),*],
            gnu: &[$($g),*],
        }
    };
}

fn r(s: &Spec, name: &str) -> Reg {
    s.reg(name).unwrap_or_else(|| panic!("no register {name}"))
}

const C: bool = true;
const NO_C: bool = false;

fn table() -> Vec<Row> {
    vec![
        // adjust_sp / add_imm
        row!(C, |s, e| e.adjust_sp(-176), ["7171"], ["c.addi16sp sp,-176"]),
        row!(C, |s, e| e.adjust_sp(496), ["617d"], ["c.addi16sp sp,496"]),
        row!(C, |s, e| e.adjust_sp(-1040), ["bf010113"], ["addi sp,sp,-1040"]),
        row!(C, |s, e| e.adjust_sp(8), ["0121"], ["c.addi sp,8"]),
        row!(C, |s, e| e.add_imm(r(s, "a3"), r(s, "sp"), 176), ["1914"], ["c.addi4spn a3,sp,176"]),
        row!(C, |s, e| e.add_imm(r(s, "a0"), r(s, "t0"), -8), ["ff828513"], ["addi a0,t0,-8"]),
        row!(C, |s, e| e.add_imm(r(s, "a3"), r(s, "sp"), 0), ["868a"], ["c.mv a3,sp"]),
        row!(C, |s, e| e.add_imm(r(s, "ra"), r(s, "a0"), 0), ["80aa"], ["c.mv ra,a0"]),
        row!(C, |s, e| e.add_imm(r(s, "t1"), r(s, "t1"), 31), ["037d"], ["c.addi t1,31"]),
        row!(C, |s, e| e.add_imm(r(s, "t1"), r(s, "sp"), 2047), ["7ff10313"], ["addi t1,sp,2047"]),
        // store
        row!(C, |s, e| e.store(r(s, "a0"), r(s, "sp"), 0), ["e02a"], ["c.sdsp a0,0(sp)"]),
        row!(C, |s, e| e.store(r(s, "ra"), r(s, "sp"), 504), ["ff86"], ["c.sdsp ra,504(sp)"]),
        row!(C, |s, e| e.store(r(s, "a0"), r(s, "sp"), 512), ["20a13023"], ["sd a0,512(sp)"]),
        row!(C, |s, e| e.store(r(s, "a0"), r(s, "sp"), -8), ["fea13c23"], ["sd a0,-8(sp)"]),
        row!(C, |s, e| e.store(r(s, "s1"), r(s, "a0"), 8), ["e504"], ["c.sd s1,8(a0)"]),
        row!(C, |s, e| e.store(r(s, "t0"), r(s, "a0"), 8), ["00553423"], ["sd t0,8(a0)"]),
        row!(C, |s, e| e.store(r(s, "fa0"), r(s, "sp"), 104), ["b4aa"], ["c.fsdsp fa0,104(sp)"]),
        row!(C, |s, e| e.store(r(s, "fs0"), r(s, "a5"), 248), ["bfe0"], ["c.fsd fs0,248(a5)"]),
        row!(C, |s, e| e.store(r(s, "ft0"), r(s, "sp"), 2040), ["7e013c27"], ["fsd ft0,2040(sp)"]),
        // load
        row!(C, |s, e| e.load(r(s, "a1"), r(s, "sp"), 96), ["7586"], ["c.ldsp a1,96(sp)"]),
        row!(C, |s, e| e.load(r(s, "a2"), r(s, "a0"), -8), ["ff853603"], ["ld a2,-8(a0)"]),
        row!(C, |s, e| e.load(r(s, "a0"), r(s, "a2"), 0), ["6208"], ["c.ld a0,0(a2)"]),
        row!(C, |s, e| e.load(r(s, "fa7"), r(s, "sp"), 160), ["388a"], ["c.fldsp fa7,160(sp)"]),
        row!(C, |s, e| e.load(r(s, "fa1"), r(s, "a1"), 16), ["298c"], ["c.fld fa1,16(a1)"]),
        row!(C, |s, e| e.load(r(s, "ft11"), r(s, "t1"), -2048), ["80033f87"], ["fld ft11,-2048(t1)"]),
        // data words: the pair is never compressed; immediates are fixups
        row!(C, |s, e| e.load_data(r(s, "a2"), DataWord::FunctionTraceOp), ["00000617", "00063603"], ["auipc a2,0x0", "ld a2,0(a2)"]),
        row!(
            C,
            |s, e| e.call_data(DataWord::ListFunc, r(s, "t1")),
            ["00000317", "00033303", "9302"],
            ["auipc t1,0x0", "ld t1,0(t1)", "c.jalr t1"]
        ),
        // calls and jumps
        row!(C, |s, e| e.call_reg(r(s, "t1")), ["9302"], ["c.jalr t1"]),
        row!(C, |s, e| e.jump_reg(r(s, "t0")), ["8282"], ["c.jr t0"]),
        row!(C, |s, e| e.jump_reg(r(s, "ra")), ["8082"], ["c.jr ra"]),
        // without the C extension
        row!(NO_C, |s, e| e.adjust_sp(-176), ["f5010113"], ["addi sp,sp,-176"]),
        row!(NO_C, |s, e| e.store(r(s, "a0"), r(s, "sp"), 0), ["00a13023"], ["sd a0,0(sp)"]),
        row!(NO_C, |s, e| e.store(r(s, "fa0"), r(s, "sp"), 104), ["06a13427"], ["fsd fa0,104(sp)"]),
        row!(NO_C, |s, e| e.load(r(s, "ra"), r(s, "sp"), 96), ["06013083"], ["ld ra,96(sp)"]),
        row!(NO_C, |s, e| e.load(r(s, "fa7"), r(s, "sp"), 160), ["0a013887"], ["fld fa7,160(sp)"]),
        row!(NO_C, |s, e| e.add_imm(r(s, "a3"), r(s, "sp"), 0), ["00010693"], ["addi a3,sp,0"]),
        row!(NO_C, |s, e| e.call_reg(r(s, "t1")), ["000300e7"], ["jalr ra,0(t1)"]),
        row!(NO_C, |s, e| e.jump_reg(r(s, "t0")), ["00028067"], ["jalr zero,0(t0)"]),
    ]
}

fn spec(rvc: bool) -> Spec {
    let (_, file, text) = BUILTIN.iter().find(|b| b.0 == "riscv64").expect("riscv64 spec");
    let text = if rvc { text.to_string() } else { text.replacen("elf_flags = 0x5", "elf_flags = 0x4", 1) };
    let spec = Spec::parse(file, &text).unwrap();
    assert_eq!(spec.raw.arch.elf_flags & 1, rvc as u32);
    spec
}

fn emit(row: &Row) -> Result<Vec<u8>, CodegenError> {
    let spec = spec(row.rvc);
    let mut e = arch::lookup("riscv64").unwrap().emitter(&spec);
    (row.emit)(&spec, e.as_mut())?;
    Ok(e.finish()?.0)
}

/// Little-endian bytes of objdump-style instruction words.
fn bytes(words: &[&str]) -> Vec<u8> {
    let mut out = Vec::new();
    for w in words {
        let v = u32::from_str_radix(w, 16).unwrap();
        match w.len() {
            4 => out.extend_from_slice(&(v as u16).to_le_bytes()),
            8 => out.extend_from_slice(&v.to_le_bytes()),
            n => panic!("bad word {w} ({n} digits)"),
        }
    }
    out
}

fn tmpdir(tag: &str) -> std::path::PathBuf {
    common::tmpdir("riscv64", tag)
}

/// Spacing- and radix-insensitive form of an instruction's text, so
/// capstone (`c.sdsp a0, 0x10(sp)`) and objdump (`c.sdsp a0,16(sp)`) compare.
fn normalize(text: &str) -> String {
    let text = text.split('#').next().unwrap_or("").trim().to_lowercase();
    let (mnemonic, ops) = text.split_once(char::is_whitespace).unwrap_or((&text, ""));
    let mut out = format!("{mnemonic} ");
    let ops: String = ops.chars().filter(|c| !c.is_whitespace()).collect();
    let mut token = String::new();
    let flush = |token: &mut String, out: &mut String| {
        match token.strip_prefix("0x").map(|h| i64::from_str_radix(h, 16)) {
            Some(Ok(v)) => out.push_str(&v.to_string()),
            _ => out.push_str(token),
        }
        token.clear();
    };
    for c in ops.chars() {
        if c.is_ascii_alphanumeric() || c == '.' {
            token.push(c);
        } else {
            flush(&mut token, &mut out);
            out.push(c);
        }
    }
    flush(&mut token, &mut out);
    out.trim().to_string()
}

/// Capstone prints a few 32-bit instructions as pseudo-instructions or in
/// its own operand order; spell them the way `objdump -M no-aliases` does.
fn capstone_raw(text: &str) -> String {
    let t = normalize(text);
    let (m, ops) = t.split_once(' ').unwrap_or((&t, ""));
    let ops: Vec<&str> = ops.split(',').collect();
    match (m, ops.as_slice()) {
        ("mv", [d, s]) => format!("addi {d},{s},0"),
        ("jr", [s]) => format!("jalr zero,0({s})"),
        ("jalr", [s]) if !s.contains('(') => format!("jalr ra,0({s})"),
        ("jalr", [d, s, imm]) => format!("jalr {d},{imm}({s})"),
        _ => t,
    }
}

#[test]
fn our_bytes_match_the_table() {
    let mut bad = Vec::new();
    for row in table() {
        let want = bytes(row.words);
        match emit(&row) {
            Ok(got) if got == want => {}
            Ok(got) => bad.push(format!("{} (rvc {}): got {got:02x?}, want {want:02x?} ({:?})", row.what, row.rvc, row.gnu)),
            Err(e) => bad.push(format!("{} (rvc {}): {e}", row.what, row.rvc)),
        }
        if !row.rvc {
            assert!(row.words.iter().all(|w| w.len() == 8), "{}: a 16-bit instruction without RVC", row.what);
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
    let mut src = String::new();
    let mut want = Vec::new();
    for row in table() {
        for g in row.gnu {
            if g.starts_with("c.") {
                src.push_str(&format!("{g}\n"));
            } else {
                // Keep gas from compressing what the row says is 32-bit.
                src.push_str(&format!(".option push\n.option norvc\n{g}\n.option pop\n"));
            }
        }
        want.extend(bytes(row.words));
    }
    std::fs::write(dir.join("t.s"), src).unwrap();
    run(Command::new("riscv64-linux-gnu-as").arg("-march=rv64gc").arg("-o").arg(dir.join("t.o")).arg(dir.join("t.s")));
    run(Command::new("riscv64-linux-gnu-objcopy").args(["-O", "binary", "-j", ".text"]).arg(dir.join("t.o")).arg(dir.join("t.bin")));
    let got = std::fs::read(dir.join("t.bin")).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(got, want, "GNU as disagrees with the table");
}

#[test]
fn objdump_and_capstone_print_the_table_text() {
    if tools_skipped() {
        return;
    }
    let rows = table();
    let mut blob = Vec::new();
    let mut want: Vec<(usize, String)> = Vec::new();
    for row in &rows {
        let mut off = blob.len();
        for (w, g) in row.words.iter().zip(row.gnu) {
            want.push((off, g.to_string()));
            off += w.len() / 2;
        }
        blob.extend(bytes(row.words));
    }
    let dir = tmpdir("objdump");
    let path = dir.join("t.bin");
    std::fs::write(&path, &blob).unwrap();
    let text = run(Command::new("riscv64-linux-gnu-objdump").args(["-D", "-b", "binary", "-m", "riscv:rv64", "-M", "no-aliases"]).arg(&path));
    let _ = std::fs::remove_dir_all(&dir);
    let objdump: Vec<(usize, String)> = text
        .lines()
        .filter_map(|l| {
            let (addr, rest) = l.trim_start().split_once(':')?;
            let off = usize::from_str_radix(addr.trim(), 16).ok()?;
            let (_hex, insn) = rest.trim_start().split_once('\t')?;
            let insn = insn.split('#').next().unwrap_or("").trim().replace('\t', " ");
            Some((off, insn))
        })
        .collect();
    assert_eq!(objdump, want, "objdump disagrees with the table");

    let cs = listing::disassembler(&spec(true)).unwrap();
    let capstone: Vec<(usize, String)> = listing::decode(&cs, &blob, 0).into_iter().map(|(o, _, t)| (o, capstone_raw(&t))).collect();
    let want: Vec<(usize, String)> = want.into_iter().map(|(o, t)| (o, normalize(&t))).collect();
    assert_eq!(capstone, want, "capstone disagrees with the table");
}

#[test]
fn data_word_pairs_carry_their_fixups() {
    let spec = spec(true);
    let mut e = arch::lookup("riscv64").unwrap().emitter(&spec);
    e.adjust_sp(-16).unwrap();
    e.call_data(DataWord::ReturnHandler, r(&spec, "t1")).unwrap();
    let (_, fixups) = e.finish().unwrap();
    let kinds: Vec<_> = fixups.iter().map(|f| (f.at, f.kind)).collect();
    assert_eq!(kinds, [(2, FixupKind::RvPcrelHi20), (6, FixupKind::RvPcrelLo12I { hi_back: 4 })]);
    let backend = arch::lookup("riscv64").unwrap();
    let relocs: Vec<_> = fixups.iter().flat_map(|f| backend.elf_relocs(f)).map(|r| (r.offset, r.r_type, r.target)).collect();
    use ftramp_codegen::arch::RelocTarget;
    assert_eq!(
        relocs,
        [
            (2, object::elf::R_RISCV_PCREL_HI20, RelocTarget::Data(DataWord::ReturnHandler)),
            (6, object::elf::R_RISCV_PCREL_LO12_I, RelocTarget::Code(2)),
        ]
    );
}

/// Decodes every auipc+ld pair of linked code and checks it addresses its word.
#[test]
fn jit_linking_reaches_each_word() {
    let spec = spec(true);
    let image = Image::generate(&spec, &Variant::ALL).unwrap();
    let code_addr = 0x7f00_1234_5000u64;
    for data_addr in [code_addr + 0x1000, code_addr + 0x7ff, code_addr - 0x7fff_0000, code_addr + 0x7fff_0000, code_addr + 0x12_3456 * 8] {
        let code = image.link(code_addr, data_addr).unwrap();
        let word = |at: usize| u32::from_le_bytes(code[at..at + 4].try_into().unwrap());
        for f in image.fixups.iter().filter(|f| f.kind == FixupKind::RvPcrelHi20) {
            let lo = image.fixups.iter().find(|l| l.kind == FixupKind::RvPcrelLo12I { hi_back: 4 } && l.at == f.at + 4).expect("pair");
            assert_eq!(lo.word, f.word);
            let hi = (word(f.at) & 0xffff_f000) as i32 as i64;
            let lo = (word(f.at + 4) as i32 >> 20) as i64;
            let target = (code_addr + f.at as u64).wrapping_add((hi + lo) as u64);
            let want = data_addr + image.word_offset(f.word).unwrap() as u64;
            assert_eq!(target, want, "{:?} at {:#x} with data at {data_addr:#x}", f.word, f.at);
        }
    }
    let far = image.link(code_addr, code_addr + 0x8000_0000).unwrap_err();
    assert!(matches!(far, CodegenError::OutOfRange { arch: "riscv64", .. }), "{far}");
}

#[test]
fn what_does_not_fit_is_a_typed_error() {
    let spec = spec(true);
    let backend = arch::lookup("riscv64").unwrap();
    let out_of_range = |res: Result<(), CodegenError>| matches!(res, Err(CodegenError::OutOfRange { arch: "riscv64", .. }));
    let mut e = backend.emitter(&spec);
    assert!(out_of_range(e.store(r(&spec, "a0"), r(&spec, "sp"), 2048)));
    assert!(out_of_range(e.load(r(&spec, "fa0"), r(&spec, "sp"), -2049)));
    assert!(out_of_range(e.add_imm(r(&spec, "a0"), r(&spec, "a0"), -2049)));
    assert!(out_of_range(e.adjust_sp(4096)));
    assert!(matches!(e.ret(), Err(CodegenError::Unsupported { .. })));
    assert!(matches!(e.save_flags(0, r(&spec, "t1")), Err(CodegenError::Unsupported { .. })));
    assert_eq!(e.pos(), 0, "nothing emitted for refused primitives");
    assert!(matches!(backend.site_call(0x1000, 0x1000 + (1 << 31)), Err(CodegenError::OutOfRange { .. })));
}

#[test]
fn the_site_call_is_auipc_jalr_through_t0() {
    let backend = arch::lookup("riscv64").unwrap();
    let site = 0x10_0002u64;
    let b = backend.site_call(site, site + 0x1234_5ffe).unwrap();
    let cs = listing::disassembler(&spec(true)).unwrap();
    let text: Vec<String> = listing::decode(&cs, &b, site).into_iter().map(|(_, _, t)| capstone_raw(&t)).collect();
    // 0x12345ffe = (0x12346 << 12) - 2: the rounded high part.
    assert_eq!(text, [normalize("auipc t0,0x12346"), normalize("jalr t0,-2(t0)")]);
}
