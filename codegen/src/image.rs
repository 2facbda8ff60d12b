//! One generated program: the trampolines' code, their data words and the
//! references between them.  JIT use links it in place ([`Image::link`]);
//! the object writer turns the same references into ELF relocations.
//!
//! ```text
//!   code  (read+execute)          data  (read+write, 8-byte words)
//!   +------------------+          +----------------------+
//!   | ftrace_caller    | -------> | function_trace_op    |
//!   | ftrace_regs_...  | -------> | ftrace_ops_list_func |
//!   | return_to_handler| -------> | ftrace_return_to_... |
//!   +------------------+          +----------------------+
//! ```

use crate::arch::{self, Arch, Fixup};
use crate::frame::FrameLayout;
use crate::program::{self, GenOptions, CodegenError, DataWord, SiteEntry, Step, Variant};
use crate::spec::Spec;

/// Trampolines start at this alignment.
pub const TRAMPOLINE_ALIGN: usize = 16;

/// One trampoline inside an [`Image`].
#[derive(Debug, Clone)]
pub struct Trampoline {
    pub variant: Variant,
    pub symbol: &'static str,
    /// Offset in the image's code where its code starts.
    pub offset: usize,
    pub len: usize,
    /// Offset of its symbol: `offset`, except for a stub-entry
    /// `return_to_handler`, whose `ftrace_call_through` prefix comes first.
    pub entry: usize,
    /// Each step with the code offset (image-relative) where it starts.
    pub steps: Vec<(usize, Step)>,
    /// Bytes of stack it allocates ([`program::frame_size_with`]).
    pub frame: u32,
}

/// Generated code plus data words.
#[derive(Debug, Clone)]
pub struct Image {
    pub arch: &'static str,
    pub layout: FrameLayout,
    pub code: Vec<u8>,
    pub fixups: Vec<Fixup>,
    pub trampolines: Vec<Trampoline>,
    /// The data words, 8 bytes each, in this order.
    pub data: Vec<DataWord>,
    /// How sites enter its entry trampolines.
    pub site_entry: SiteEntry,
}

impl Image {
    /// Generates `variants` (in that order) for `spec`.
    pub fn generate(spec: &Spec, variants: &[Variant]) -> Result<Image, CodegenError> {
        let backend = arch::lookup(&spec.name)?;
        Self::generate_with(backend, spec, variants)
    }

    /// As [`Image::generate`], for sites that enter as `entry`
    /// ([`SiteEntry::Stub`] needs a spec with `site.stub`).
    pub fn generate_for(spec: &Spec, variants: &[Variant], entry: SiteEntry) -> Result<Image, CodegenError> {
        Self::generate_opts(spec, variants, GenOptions { entry, ..Default::default() })
    }

    /// As [`Image::generate`], with every generation option
    /// ([`GenOptions::vector_upper`] needs a spec with
    /// `registers.vector_upper_bytes`).
    pub fn generate_opts(spec: &Spec, variants: &[Variant], opts: GenOptions) -> Result<Image, CodegenError> {
        let backend = arch::lookup(&spec.name)?;
        Self::generate_with_opts(backend, spec, variants, opts)
    }

    /// As [`Image::generate`], with an explicit backend.
    pub fn generate_with(backend: &dyn Arch, spec: &Spec, variants: &[Variant]) -> Result<Image, CodegenError> {
        Self::generate_with_opts(backend, spec, variants, GenOptions::default())
    }

    fn generate_with_opts(backend: &dyn Arch, spec: &Spec, variants: &[Variant], opts: GenOptions) -> Result<Image, CodegenError> {
        let entry = opts.entry;
        if entry == SiteEntry::Stub && !spec.raw.site.stub {
            return Err(CodegenError::Unsupported { arch: backend.name(), what: "stub entry (the spec does not set site.stub)".into() });
        }
        if opts.vector_upper && spec.vector_upper_bytes == 0 {
            return Err(CodegenError::Unsupported {
                arch: backend.name(),
                what: "vector upper bits (the spec does not set registers.vector_upper_bytes)".into(),
            });
        }
        if opts.vector_wider && (!opts.vector_upper || spec.vector_wider_bytes == 0) {
            return Err(CodegenError::Unsupported {
                arch: backend.name(),
                what: "vector_wider (needs vector_upper and a spec with registers.vector_wider_bytes)".into(),
            });
        }
        for v in variants {
            if let Variant::Entry { dispatch: program::Dispatch::Multi(n), .. } = *v {
                if !(1..=Variant::MULTI_MAX).contains(&n) {
                    return Err(CodegenError::OutOfRange { arch: backend.name(), what: "tracers of a multi trampoline", value: n as i64, range: "1..=8" });
                }
            }
        }
        let layout = FrameLayout::new(spec);
        let mut code = Vec::new();
        let mut fixups = Vec::new();
        let mut trampolines = Vec::new();
        for &variant in variants {
            while code.len() % TRAMPOLINE_ALIGN != 0 {
                let pad = backend.padding();
                code.extend_from_slice(&pad[..pad.len().min(TRAMPOLINE_ALIGN - code.len() % TRAMPOLINE_ALIGN)]);
            }
            let start = code.len();
            let mut e = backend.emitter(spec);
            let mut placed = Vec::new();
            let mut symbol_at = start;
            for step in program::steps_with(spec, &layout, variant, opts) {
                placed.push((start + e.pos(), step.clone()));
                lower(e.as_mut(), spec, &step)?;
                if matches!(step, Step::CallThrough { .. }) {
                    symbol_at = start + e.pos();
                }
            }
            let (bytes, fx) = e.finish()?;
            fixups.extend(fx.into_iter().map(|f| Fixup { at: f.at + start, ..f }));
            code.extend_from_slice(&bytes);
            let frame = program::frame_size_with(spec, &layout, variant, opts);
            trampolines.push(Trampoline { variant, symbol: variant.symbol(), offset: start, len: bytes.len(), entry: symbol_at, steps: placed, frame });
        }
        let mut data: Vec<DataWord> = DataWord::ALL.into_iter().filter(|w| fixups.iter().any(|f| f.word == *w)).collect();
        if variants.iter().any(|v| matches!(v, Variant::Entry { dispatch: program::Dispatch::List, .. })) && !data.contains(&DataWord::FunctionTraceOp) {
            data.insert(0, DataWord::FunctionTraceOp);
        }
        Ok(Image { arch: backend.name(), layout, code, fixups, trampolines, data, site_entry: entry })
    }

    /// Offset of `ftrace_call_through` (the prefix of a stub-entry
    /// `return_to_handler`), if the image has one.
    pub fn call_through(&self) -> Option<usize> {
        self.trampoline(Variant::Return).filter(|t| t.entry != t.offset).map(|t| t.offset)
    }

    /// Offset of `word` in the data area.
    pub fn word_offset(&self, word: DataWord) -> Option<usize> {
        self.data.iter().position(|w| *w == word).map(|i| i * 8)
    }

    /// Bytes of the data area.
    pub fn data_size(&self) -> usize {
        self.data.len() * 8
    }

    pub fn trampoline(&self, v: Variant) -> Option<&Trampoline> {
        self.trampolines.iter().find(|t| t.variant == v)
    }

    /// The code with every data reference resolved for code placed at
    /// `code_addr` and the data area at `data_addr`.
    pub fn link(&self, code_addr: u64, data_addr: u64) -> Result<Vec<u8>, CodegenError> {
        let backend = arch::lookup(self.arch)?;
        let mut code = self.code.clone();
        for f in &self.fixups {
            let word = self.word_offset(f.word).expect("every fixup's word is in data") as u64;
            backend.apply_fixup(&mut code, f, code_addr, data_addr + word)?;
        }
        Ok(code)
    }
}

/// Dispatches one step to the backend primitive.
fn lower(e: &mut dyn arch::Emitter, spec: &Spec, step: &Step) -> Result<(), CodegenError> {
    match step {
        Step::AdjustSp { delta } => e.adjust_sp(*delta),
        Step::Store { reg, base, off, .. } => e.store(*reg, *base, *off),
        Step::Load { reg, base, off, .. } => e.load(*reg, *base, *off),
        Step::AddImm { dst, src, imm, .. } => e.add_imm(*dst, *src, *imm),
        Step::LoadData { dst, word } => e.load_data(*dst, *word),
        Step::CallData { word, scratch } => e.call_data(*word, *scratch),
        Step::CallReg { target } => e.call_reg(*target),
        Step::JumpReg { target } => e.jump_reg(*target),
        Step::Return => e.ret(),
        Step::GraphCallCheck { scratch, ip, parent } => e.graph_call_check(*scratch, *ip, *parent),
        Step::PopJump { scratch } => e.pop_jump(*scratch),
        Step::ReturnReg { target } => e.return_reg(*target),
        Step::CallThrough { scratch } => e.call_through(*scratch),
        Step::AlignSp { scratch } => e.align_sp(*scratch, spec.stack_alignment),
        Step::RestoreSp => e.restore_sp(),
        Step::StoreUpper { reg, base, off } => e.store_upper(*reg, *base, *off),
        Step::RestoreUppers { regs, base, scratch, tops } => e.restore_uppers(regs, *base, *scratch, tops),
        Step::StoreTops { regs, uppers, base, scratch } => e.store_tops(regs, uppers, *base, *scratch),
        Step::PopFpStack { max, base, off, scratch } => e.pop_fp_stack(*max, *base, *off, *scratch),
        Step::PushFpStack { max, base, off } => e.push_fp_stack(*max, *base, *off),
        Step::SaveFlags { off, scratch } => e.save_flags(*off, *scratch),
        Step::RestoreFlags { off, scratch } => e.restore_flags(*off, *scratch),
        Step::StorePair { a, b, base, off, .. } => e.store_pair(*a, *b, *base, *off, spec.reg_bytes(a.class) as i32),
        Step::LoadPair { a, b, base, off, .. } => e.load_pair(*a, *b, *base, *off, spec.reg_bytes(a.class) as i32),
        Step::StoreMulti { first, count, base, off, .. } => e.store_multiple(*first, *count, *base, *off, spec.reg_bytes(first.class) as i32),
        Step::LoadMulti { first, count, base, off, .. } => e.load_multiple(*first, *count, *base, *off, spec.reg_bytes(first.class) as i32),
    }
}
