//! Independent check of the encodings: every trampoline object is
//! disassembled by GNU objdump (`<triple>-objdump`) and compared, instruction
//! by instruction, with capstone (which the snapshots use).  Two unrelated
//! disassemblers must agree on instruction boundaries, mnemonics and
//! register operands — so a snapshot that was wrong from day one (say, an
//! encoder that emits a different register than the step asks for) is
//! caught here.  objdump also checks our relocations: each one it prints
//! must name the data word our fixup names.
//!
//! Needs binutils for every arch (`binutils-multiarch` or the cross gcc
//! packages); the README's test command installs them.  Without them the
//! test fails with the command it could not run (set
//! `FTRAMP_SKIP_ORACLE=1` to skip deliberately).

use ftramp_codegen::{arch, arch::RelocTarget, image::Image, listing, object, spec::Spec, GenOptions, SiteEntry, Tier, Variant};
use std::collections::BTreeMap;
use std::process::Command;

fn objdump(spec: &Spec) -> String {
    format!("{}-objdump", spec.raw.arch.gnu_triple)
}

/// `(offset, text)` of each instruction objdump prints, and `(offset, reloc text)`.
fn run_objdump(spec: &Spec, path: &std::path::Path) -> (BTreeMap<usize, String>, Vec<(usize, String)>) {
    let mut cmd = Command::new(objdump(spec));
    cmd.arg("-d").arg("-r").arg("-z");
    if spec.name == "x86_64" {
        cmd.arg("-M").arg("intel");
    }
    // Raw RISC-V mnemonics (`c.sdsp`, `addi`), as capstone prints them,
    // instead of objdump's pseudo-instructions (`sd`, `mv`, `ret`).
    if spec.name == "riscv64" {
        cmd.arg("-M").arg("no-aliases");
    }
    cmd.arg(path);
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {}: {e} (install binutils for {})", objdump(spec), spec.name));
    assert!(out.status.success(), "{} failed: {}", objdump(spec), String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let mut insns = BTreeMap::new();
    let mut relocs = Vec::new();
    for line in text.lines() {
        let Some((addr, rest)) = line.trim_start().split_once(':') else { continue };
        let Ok(off) = usize::from_str_radix(addr.trim(), 16) else { continue };
        let rest = rest.trim_start_matches(['\t', ' ']);
        if rest.starts_with("R_") {
            relocs.push((off, rest.to_string()));
            continue;
        }
        // `hex bytes \t mnemonic \t operands`; a line with bytes only
        // continues the previous instruction.
        let Some((_hex, insn)) = rest.split_once('\t') else { continue };
        insns.insert(off, insn.replace('\t', " ").trim().to_string());
    }
    (insns, relocs)
}

/// Symbol name -> value, from `readelf -sW` (`objdump -t` hides `.L` labels).
fn symbol_values(spec: &Spec, path: &std::path::Path) -> std::collections::HashMap<String, usize> {
    let readelf = format!("{}-readelf", spec.raw.arch.gnu_triple);
    let out = Command::new(&readelf).arg("-sW").arg(path).output().unwrap_or_else(|e| panic!("cannot run {readelf}: {e}"));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            // `Num: Value Size Type Bind Vis Ndx Name`
            let w: Vec<&str> = l.split_whitespace().collect();
            if w.len() < 8 || !w[0].ends_with(':') {
                return None;
            }
            Some((w[7].to_string(), usize::from_str_radix(w[1], 16).ok()?))
        })
        .collect()
}

/// The symbol an objdump relocation line names (`R_X\tsym+0x4` -> `sym`).
fn reloc_symbol(text: &str) -> Option<&str> {
    let target = text.split_whitespace().nth(1)?;
    Some(target.split(['+', '-']).next().unwrap_or(target))
}

/// Lower-cased mnemonic and the multiset of register names in an
/// instruction's text.
fn shape(spec: &Spec, text: &str) -> (String, Vec<String>, Vec<u64>) {
    let text = &expand_ppc64(spec, text);
    // x86 and RISC-V objdump comments start with `#`; elsewhere `#` marks an immediate.
    let text = text.split('<').next().unwrap_or("");
    let text = if matches!(spec.name.as_str(), "x86_64" | "riscv64") { text.split('#').next().unwrap_or("") } else { text };
    let text = text.replace('#', " ").replace("*1", "").to_lowercase();
    // objdump spells out a redundant REX prefix that capstone folds into
    // the instruction (dynasm emits one for dynamic xmm registers).
    let text = text.strip_prefix("rex ").unwrap_or(&text).to_string();
    let mut words = text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '.' || c == '_'));
    let mnemonic = words.next().unwrap_or("").to_string();
    let words: Vec<&str> = words.filter(|w| !w.is_empty()).collect();
    let mut regs: Vec<String> = words.iter().map(|w| alias(spec, w)).filter(|w| is_register(spec, w)).collect();
    regs.sort();
    // Non-zero numbers (displacements, immediates); zero is printed by one
    // tool and implied by the other.
    // objdump prints an x86 branch target as bare hex (`jne 114 <f+0x14>`).
    let bare_hex = spec.name == "x86_64" && mnemonic.starts_with('j');
    let mut nums: Vec<u64> = words
        .iter()
        .filter_map(|w| match w.strip_prefix("0x") {
            Some(h) => u64::from_str_radix(h, 16).ok(),
            None if bare_hex => u64::from_str_radix(w, 16).ok(),
            None => w.parse().ok(),
        })
        .filter(|n| *n != 0)
        .collect();
    nums.sort();
    // PC-relative operands are printed as absolute targets by objdump and
    // relative to the decode address by capstone: compare registers only.
    if PC_RELATIVE.contains(&mnemonic.as_str()) {
        nums.clear();
    }
    (alias_mnemonic(spec, &mnemonic), regs, nums)
}

/// ppc64le: objdump prints `mtcrf 0xff, rX` by its extended mnemonic `mtcr rX`.
fn expand_ppc64(spec: &Spec, text: &str) -> String {
    match text.trim().strip_prefix("mtcr ") {
        Some(rs) if spec.name == "ppc64le" => format!("mtcrf 255,{}", rs.trim()),
        _ => text.to_string(),
    }
}

const PC_RELATIVE: &[&str] = &["bcl", "bdnzl", "adrp", "adr", "auipc", "larl", "lgrl", "lrl", "brasl", "bl", "b", "jal", "brcl", "addpcis"];

fn alias(spec: &Spec, w: &str) -> String {
    match spec.name.as_str() {
        "aarch64" => match w {
            // capstone and objdump name the 128-bit view differently in some
            // versions; both are the same register file.
            _ if w.starts_with('q') && w[1..].parse::<u8>().is_ok() => format!("v{}", &w[1..]),
            "xzr" => "xzr".into(),
            _ => w.to_string(),
        },
        // objdump names VSX registers vsN; capstone (and the spec) name
        // vs0-vs31 by their FPR view fN and vs32-vs63 by their VR view vN.
        "ppc64le" => match w.strip_prefix("vs").and_then(|n| n.parse::<u8>().ok()) {
            Some(n) if n < 32 => format!("f{n}"),
            Some(n) => format!("v{}", n - 32),
            None => w.to_string(),
        },
        _ => w.to_string(),
    }
}

fn alias_mnemonic(spec: &Spec, m: &str) -> String {
    match (spec.name.as_str(), m) {
        ("x86_64", "pushf") => "pushfq".into(),
        ("x86_64", "popf") => "popfq".into(),
        // capstone 5 prints `bcl 20,31,$+4` (BO=20: branch always) as
        // `bdnzl`: its alias printer tests `(BO & 0x12) == 16` and ignores
        // the BO bit 0x04 that turns the CTR decrement off.  The encoder
        // test pins these bytes against GNU as.
        ("ppc64le", "bdnzl") => "bcl".into(),
        _ => m.to_string(),
    }
}

fn is_register(spec: &Spec, w: &str) -> bool {
    spec.reg(w).is_some() || matches!(w, "rip" | "riz" | "sp" | "wzr" | "xzr")
}

/// Every variant, the multi ones (one to eight tracers, both tiers) included.
fn variants() -> Vec<Variant> {
    let multi = [Tier::Args, Tier::Regs].into_iter().flat_map(|t| (1..=Variant::MULTI_MAX).map(move |n| Variant::multi(t, n).unwrap()));
    Variant::ALL.into_iter().chain(multi).collect()
}

fn check_arch(spec: &Spec, opts: GenOptions) -> Vec<String> {
    let image = Image::generate_opts(spec, &variants(), opts).unwrap();
    let obj = object::write(spec, &image, &object::ObjectOptions::default()).unwrap();
    let dir = std::env::temp_dir().join(format!("ftramp-oracle-{}-{}", spec.name, std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("t.o");
    std::fs::write(&path, &obj).unwrap();
    let (theirs, relocs) = run_objdump(spec, &path);
    let symbols = symbol_values(spec, &path);
    let cs = listing::disassembler(spec).unwrap();
    let ours: BTreeMap<usize, String> = listing::decode(&cs, &image.code, 0).into_iter().map(|(o, _, t)| (o, t)).collect();
    let mut problems = Vec::new();
    // Padding between trampolines is a trap filler; compare inside them.
    for t in &image.trampolines {
        let range = t.offset..t.offset + t.len;
        let a: Vec<_> = ours.range(range.clone()).collect();
        let b: Vec<_> = theirs.range(range.clone()).collect();
        if a.len() != b.len() || a.iter().zip(&b).any(|(x, y)| x.0 != y.0) {
            problems.push(format!("{} {}: instruction boundaries differ: capstone {:?} objdump {:?}", spec.name, t.symbol, a, b));
            continue;
        }
        for ((off, c), (_, g)) in a.iter().zip(&b) {
            if shape(spec, c) != shape(spec, g) {
                problems.push(format!("{} {}+{:#x}: capstone `{c}` vs objdump `{g}`", spec.name, t.symbol, *off - t.offset));
            }
        }
    }
    // Every fixup shows up as a relocation naming its word, and nothing else does.
    for f in &image.fixups {
        let want: Vec<_> = arch::lookup(&spec.name).unwrap().elf_relocs(f);
        for r in want {
            let names_word = |at: usize| {
                relocs.iter().any(|(o, text)| *o == at && (text.contains(f.word.symbol()) || text.contains(".data")))
            };
            let found = match r.target {
                RelocTarget::Data(_) => names_word(r.offset),
                // A relocation against another instruction (RISC-V
                // `%pcrel_lo`): its symbol must sit on that instruction,
                // whose own relocation names the word.
                RelocTarget::Code(at) => {
                    relocs.iter().any(|(o, text)| *o == r.offset && reloc_symbol(text).and_then(|s| symbols.get(s)) == Some(&at))
                        && names_word(at)
                }
            };
            if !found {
                problems.push(format!("{}: no relocation at {:#x} for {} (objdump printed {:?})", spec.name, r.offset, f.word.symbol(), relocs));
            }
        }
    }
    let reloc_offsets: std::collections::BTreeSet<usize> =
        image.fixups.iter().flat_map(|f| arch::lookup(&spec.name).unwrap().elf_relocs(f)).map(|r| r.offset).collect();
    for (o, text) in &relocs {
        if !reloc_offsets.contains(o) {
            problems.push(format!("{}: unexpected relocation {text} at {o:#x}", spec.name));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    problems
}

#[test]
fn capstone_and_objdump_agree_on_every_trampoline() {
    if std::env::var_os("FTRAMP_SKIP_ORACLE").is_some() {
        eprintln!("FTRAMP_SKIP_ORACLE set: skipping");
        return;
    }
    let mut problems = Vec::new();
    for backend in arch::all() {
        let spec = Spec::builtin(backend.name()).unwrap();
        problems.extend(check_arch(&spec, GenOptions { entry: SiteEntry::Call, ..Default::default() }));
        if spec.raw.site.stub {
            problems.extend(check_arch(&spec, GenOptions { entry: SiteEntry::Stub, ..Default::default() }));
        }
        // The upper-halves steps (x86_64 AVX), in both site forms, with the
        // VEX restore and with the EVEX one (AVX-512, hand-encoded).
        if spec.vector_upper_bytes > 0 {
            for entry in [SiteEntry::Call, SiteEntry::Stub] {
                if entry == SiteEntry::Stub && !spec.raw.site.stub {
                    continue;
                }
                for vector_wider in [false, true] {
                    problems.extend(check_arch(&spec, GenOptions { entry, vector_upper: true, vector_wider }));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{} disagreements:\n{}", problems.len(), problems.join("\n"));
}

#[test]
fn the_oracle_notices_a_wrong_register() {
    // Sanity check of the comparison itself: a different register must
    // change the shape.
    let spec = Spec::builtin("x86_64").unwrap();
    assert_ne!(shape(&spec, "mov qword ptr [rsp + 8], rsi"), shape(&spec, "mov qword ptr [rsp + 8], rdi"));
    assert_eq!(shape(&spec, "mov qword ptr [rsp + 8], rsi"), shape(&spec, "mov    QWORD PTR [rsp+0x8],rsi"));
}
