//! Listings (`ftramp asm`, snapshots): each trampoline twice — as the
//! generator's steps and as its bytes decoded by an independent disassembler
//! (capstone), with data-word references shown inline like `objdump -dr`.

use crate::arch::{lookup, Fixup};
use crate::image::{Image, Trampoline};
use crate::program::{describe, CodegenError};
use crate::spec::Spec;
use capstone::prelude::*;
use std::fmt::Write;

/// A capstone handle for the spec's arch.
pub fn disassembler(spec: &Spec) -> Result<Capstone, CodegenError> {
    let err = |e: capstone::Error| CodegenError::Unsupported { arch: "listing", what: format!("capstone: {e}") };
    let cs = match spec.raw.arch.capstone.as_str() {
        "x86_64" => Capstone::new().x86().mode(arch::x86::ArchMode::Mode64).build(),
        "aarch64" => Capstone::new().arm64().mode(arch::arm64::ArchMode::Arm).build(),
        "riscv64" => Capstone::new()
            .riscv()
            .mode(arch::riscv::ArchMode::RiscV64)
            .extra_mode([arch::riscv::ArchExtraMode::RiscVC].into_iter())
            .build(),
        "ppc64le" => Capstone::new().ppc().mode(arch::ppc::ArchMode::Mode64).endian(capstone::Endian::Little).build(),
        "s390x" => Capstone::new().sysz().mode(arch::sysz::ArchMode::Default).build(),
        other => {
            return Err(CodegenError::Unsupported { arch: "listing", what: format!("no disassembler for `{other}`") })
        }
    };
    cs.map_err(err)
}

/// Decodes `bytes` at `addr` into `(offset, length, text)`; an undecodable
/// tail is reported as `.byte` lines so nothing is hidden.
pub fn decode(cs: &Capstone, bytes: &[u8], addr: u64) -> Vec<(usize, usize, String)> {
    let mut out = Vec::new();
    let mut pos = 0usize;
    while pos < bytes.len() {
        let insns = cs.disasm_all(&bytes[pos..], addr + pos as u64);
        let mut progressed = false;
        if let Ok(insns) = insns {
            for i in insns.iter() {
                let off = (i.address() - addr) as usize;
                let text = format!("{} {}", i.mnemonic().unwrap_or("?"), i.op_str().unwrap_or("")).trim().to_string();
                out.push((off, i.bytes().len(), text));
                pos = off + i.bytes().len();
                progressed = true;
            }
        }
        if !progressed {
            out.push((pos, 1, format!(".byte 0x{:02x}", bytes[pos])));
            pos += 1;
        }
    }
    out
}

/// Instructions executed along the common path of `decoded` (a
/// trampoline decoded at address 0 by [`decode`]): every conditional
/// branch taken.  The trampolines' conditional branches all skip code for
/// a rare case (an x87 return value to keep, non-zero vector upper halves,
/// a hijacked return), so this is what a call with nothing of the sort
/// executes; without conditional branches, every instruction.  x86_64
/// only has them (`j<cc> target`).
pub fn common_path_len(spec: &Spec, decoded: &[(usize, usize, String)]) -> usize {
    common_path(spec, decoded).len()
}

/// The indexes into `decoded` of the instructions [`common_path_len`]
/// counts, in execution order.
pub fn common_path(spec: &Spec, decoded: &[(usize, usize, String)]) -> Vec<usize> {
    let index = |off: usize| decoded.iter().position(|d| d.0 == off);
    let mut path = Vec::new();
    let mut i = 0;
    while let Some((_, _, text)) = decoded.get(i) {
        path.push(i);
        let mut words = text.split_whitespace();
        let mnemonic = words.next().unwrap_or("");
        let conditional = spec.name == "x86_64" && mnemonic.starts_with('j') && mnemonic != "jmp";
        let target = words.last().and_then(|t| usize::from_str_radix(t.trim_start_matches("0x"), 16).ok());
        match (conditional, target.and_then(index)) {
            (true, Some(t)) if t > i => i = t,
            _ => i += 1,
        }
    }
    path
}

fn fixup_text(spec: &Spec, f: &Fixup) -> String {
    let backend = lookup(&spec.name);
    let relocs = backend.map(|b| b.elf_relocs(f)).unwrap_or_default();
    let kinds = relocs.iter().map(|r| format!("R#{}{:+}", r.r_type.0, r.addend)).collect::<Vec<_>>().join(",");
    format!("{:?} -> {} ({kinds})", f.kind, f.word.symbol())
}

/// The listing of one trampoline of `image`.
pub fn trampoline(spec: &Spec, image: &Image, t: &Trampoline) -> Result<String, CodegenError> {
    let cs = disassembler(spec)?;
    let mut s = String::new();
    let frame = t.frame;
    let _ = writeln!(s, "{} ({}, {}): {} bytes, frame {} bytes", t.symbol, spec.name, t.variant, t.len, frame);
    let _ = writeln!(s, "\n-- steps --");
    for (off, step) in &t.steps {
        let _ = writeln!(s, "{:4x}  {}", off - t.offset, describe(spec, step));
    }
    let _ = writeln!(s, "\n-- code (capstone) --");
    let bytes = &image.code[t.offset..t.offset + t.len];
    for (off, len, text) in decode(&cs, bytes, 0) {
        let hex = bytes[off..off + len].iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" ");
        let _ = writeln!(s, "{off:4x}  {hex:<24} {text}");
        for f in image.fixups.iter().filter(|f| f.at >= t.offset + off && f.at < t.offset + off + len) {
            let _ = writeln!(s, "      {:<24}   reloc {}", "", fixup_text(spec, f));
        }
    }
    Ok(s)
}

/// The listing of a whole image, data words included.
pub fn image(spec: &Spec, image: &Image) -> Result<String, CodegenError> {
    let mut s = String::new();
    for t in &image.trampolines {
        s.push_str(&trampoline(spec, image, t)?);
        s.push('\n');
    }
    let _ = writeln!(s, "-- data words --");
    for w in &image.data {
        let init = w.initial_symbol().map(|i| format!("&{i}")).unwrap_or_else(|| "0 (set at run time)".into());
        let _ = writeln!(s, "{:4x}  {:<32} = {init}", image.word_offset(*w).unwrap_or(0), w.symbol());
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{image::Image, Variant};

    /// The x86_64 `return_to_handler` has branches (the x87 return values):
    /// its common path skips `fxam`, the pops and the pushes, and takes the
    /// TOP test and the restore's test; other arches' trampolines are
    /// straight-line, so their path is every instruction.
    #[test]
    fn the_common_path_takes_every_conditional_branch() {
        for arch in ["x86_64", "aarch64"] {
            let spec = Spec::builtin(arch).unwrap();
            let image = Image::generate(&spec, &[Variant::Return]).unwrap();
            let cs = disassembler(&spec).unwrap();
            let decoded = decode(&cs, &image.code, 0);
            let path: Vec<&str> = common_path(&spec, &decoded).into_iter().map(|i| decoded[i].2.as_str()).collect();
            if arch == "aarch64" {
                assert_eq!(path.len(), decoded.len());
                continue;
            }
            assert!(path.len() < decoded.len());
            assert!(path.iter().all(|t| !t.starts_with("fxam") && !t.starts_with("fstp") && !t.starts_with("fld")), "{path:?}");
            assert_eq!(path.iter().filter(|t| t.starts_with("fnstsw")).count(), 1, "{path:?}");
            assert_eq!(path.iter().filter(|t| t.starts_with("je ")).count(), 2, "the save's TOP test and the restore's: {path:?}");
            assert!(path.last().unwrap().starts_with("jmp"), "{path:?}");
        }
    }
}
