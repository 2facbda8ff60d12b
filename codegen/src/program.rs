//! The shared generator: from a spec and a variant to a list of [`Step`]s.
//!
//! This is the only place that decides what a trampoline does and in which
//! order; the per-arch backends turn each step into instructions.  Register
//! roles (where the site's return address is, which scratch register to use,
//! where the callee area is) all come from the [`Spec`], offsets from the
//! [`FrameLayout`].
//!
//! Entry trampoline (`ftrace_caller` and its variants), in order:
//!
//! 1. allocate the frame (the struct plus the ABI's callee area);
//! 2. save the tier's registers into their slots (flags last, since saving
//!    them needs a scratch register on some arches);
//! 3. fill the specials: `return_address` (the traced function's own return
//!    address), `ip` (where execution resumes: just after the site) and `sp`
//!    (the traced function's stack pointer at entry);
//! 4. call the tracer as `func(ip, parent_ip, op, fregs)` where `ip` is the
//!    site address and `op` comes from a data word (`list`, `direct`) or from
//!    the word before the function (`callsite`, whose ops' first word is its
//!    callback); a `multiN` trampoline makes N such calls in sequence, each
//!    with its own (func, op) pair of words (see [`Dispatch::Multi`]);
//! 5. restore every saved register from its slot, so a tracer's changes to
//!    arguments take effect;
//! 6. resume at `ip` with `return_address` as the traced function's return
//!    address — both possibly changed by the tracer (IPMODIFY, fgraph).
//!
//! Exit trampoline (`return_to_handler`): save the return registers, call
//! `ftrace_return_to_handler(fregs)`, restore them and jump to the address it
//! returned (return to it, after stub entry: below).
//!
//! # Stub entry (x86_64 JIT sites)
//!
//! A site's `call` pushes the address after the site on the CPU's return
//! stack predictor too.  Resuming with `ret` pops it correctly, but then a
//! hijacked return (fgraph) is always mispredicted: the predictor expects
//! the caller, the return goes to `return_to_handler` — about 11 ns per
//! call on the machines we measured, more than the rest of fgraph's exit.
//! With [`SiteEntry::Stub`] (spec `site.stub`) the site `jmp`s to a per-site
//! stub that pushes the address after the site itself (`lea`, `push`, `jmp`:
//! the stack is then exactly as the `call` left it, so the frame is the
//! same) and the trampoline never returns:
//!
//! * not hijacked: `pop` the resume address and `jmp` to it;
//! * hijacked (the parent slot holds `return_to_handler`, from the data word
//!   [`DataWord::GraphReturn`]): resume at `ftrace_call_through`, a prefix
//!   of the `return_to_handler` trampoline that drops the slot and `call`s
//!   the resume address, so the `call` pushes `return_to_handler` into the
//!   same slot *and* on the predictor: the traced function's `ret` is
//!   predicted, and `return_to_handler` goes back to the caller with
//!   `push` + `ret` ([`Step::ReturnReg`]), which pops the caller's own
//!   predictor entry, predicted too.
//!
//! Nothing is left on the predictor's stack: it stays in step with the
//! program's calls.  (A `jmp` back would leave the caller's entry there,
//! and the return of every caller above would then be mispredicted: a
//! three-level call tree with the innermost call hijacked took 21.5 ns per
//! iteration that way against 4.5 ns with `push` + `ret`, on an Intel
//! Xeon VM.)  Objects keep the `call` form (their ABI, DESIGN §2):
//! their traced function's `ret` pops the caller's entry, mispredicted,
//! and `return_to_handler` then jumps.
//!
//! # Vector upper halves (x86_64 AVX)
//!
//! The `ftrace_regs` vector slots hold `vector_bytes` (x86_64: `xmm`, 16
//! bytes), but on a CPU with AVX the same registers are the low halves of
//! `ymm`, whose upper halves carry `__m256` arguments and return values.
//! The trampolines' legacy-SSE loads and stores leave the upper halves
//! alone, and so does code compiled for baseline x86_64; but AVX code a
//! callback runs (glibc's string functions on CPUs without AVX-512) ends
//! in `vzeroupper`, which clears them.  With [`GenOptions::vector_upper`]
//! a trampoline also stores the upper halves of the registers it saves
//! ([`Step::StoreUpper`], into an area below `struct ftrace_regs`) and, before
//! loading them back, puts the upper halves back only if one of them was
//! non-zero ([`Step::RestoreUppers`]: an OR of the saved halves and a
//! test).  So a program that never has live upper halves (every SSE
//! program, and AVX code between calls, which the compilers clear with
//! `vzeroupper`) never gets a 256-bit register write from a trampoline,
//! which would put the CPU in its "dirty upper state" and slow its SSE
//! code.  The runtime generates this form where the CPU has AVX; objects
//! do it when asked (`ftramp gen --vector-upper`).
//!
//! With AVX-512 the same registers are the low halves of `zmm`, and every
//! VEX-encoded write clears bits 256-511: the test therefore runs in a
//! register that carries nothing (spec `trampoline.vector_scratch`), and
//! with [`GenOptions::vector_wider`] the bits above the `ymm` halves are
//! stored too, only when an upper half is non-zero ([`Step::StoreTops`],
//! so that programs without wide values live never run a 512-bit
//! instruction here), and everything goes back with EVEX inserts that
//! keep the rest of the register.
//!
//! # x87 return values (x86_64)
//!
//! A `long double` comes back in the x87 register st(0), a `_Complex long
//! double` in st(0) and st(1) (spec `abi.fp_stack_ret`).  The x87 registers
//! are a stack, and the psABI has every function called with it empty: a
//! callee may push all eight.  So `return_to_handler`, which calls the
//! runtime while a traced function's x87 return value is live, first pops
//! the non-empty top registers into its frame ([`Step::PopFpStack`]) and
//! pushes them back after the call ([`Step::PushFpStack`]).  Otherwise a
//! callback's eighth push would overflow onto the return value.  The
//! common case, an empty stack, is told by the stack's TOP field (0) in
//! the status word: three instructions at the save, two at the restore
//! (`fxam`, which tells an empty register, is a slow microcode assist on
//! an empty one, so it only runs when TOP is not 0).  Entry trampolines
//! need nothing: the stack is empty at every call.

use crate::frame::{FrameLayout, Tier};
use crate::spec::{Location, Reg, RegClass, SlotKind, Spec};
use std::fmt;

/// How the entry trampoline finds the tracer to call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dispatch {
    /// Call `ftrace_ops_list_func` with `op = function_trace_op`.
    List,
    /// Call one tracer with its ops, both read from data words.
    Direct,
    /// Read the ops pointer from the word before the function and call the
    /// ops' first word (its `func`).
    Callsite,
    /// Call `n` tracers (`1 <= n <= `[`Variant::MULTI_MAX`]) in sequence,
    /// tracer `i` with its own words [`DataWord::TracerOp`]`(i)` and
    /// [`DataWord::TracerFunc`]`(i)` — a dispatcher for exactly the ops of a
    /// site, without the list function's walk.  Every call gets the same
    /// `ip` (the site address) and `parent_ip` (the parent return address
    /// at entry), saved in two words at the top of the frame before the first
    /// call, as the list function passes the same pair to every ops; and the
    /// same `fregs`, so a change a tracer makes to `fregs` (arguments, `ip`,
    /// `return_address`) is seen by the tracers after it and takes effect
    /// when the trampoline returns.
    Multi(u8),
}

/// How a patch site enters the entry trampolines (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum SiteEntry {
    /// The site calls the trampoline (`call`, `bl`, `brasl`): the object ABI.
    #[default]
    Call,
    /// The site jumps to a per-site stub that pushes the address after the
    /// site and jumps to the trampoline (specs with `site.stub`).
    Stub,
}

/// How an image's trampolines are generated, besides their variants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct GenOptions {
    /// How sites enter the entry trampolines.
    pub entry: SiteEntry,
    /// Keep the saved vector registers' upper bits too (spec
    /// `registers.vector_upper_bytes`; x86_64: the upper halves of `ymm`,
    /// which needs a CPU with AVX).  See "Vector upper halves" in the
    /// module docs.
    pub vector_upper: bool,
    /// With `vector_upper`: keep the bits above those too (spec
    /// `registers.vector_wider_bytes`; x86_64 with AVX-512: the upper 256
    /// bits of `zmm`, for `__m512` arguments and return values), and put
    /// the upper bits back with instructions that leave the rest of the
    /// register alone (EVEX `vinsertf64x4`/`vinsertf32x4`; VEX
    /// `vinsertf128` would clear bits 256-511).  The top bits are saved
    /// only when a saved upper half is non-zero ([`Step::StoreTops`]), so
    /// no 512-bit instruction runs for a program that passes nothing wider
    /// than 16 bytes.  Needs AVX-512F.
    pub vector_wider: bool,
}

/// One trampoline kind the generator makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Variant {
    Entry { tier: Tier, dispatch: Dispatch },
    /// `return_to_handler`.
    Return,
}

/// `(args, regs)` names and object symbols of `multi1` .. `multi8`.
const MULTI_NAMES: [(&str, &str); Variant::MULTI_MAX as usize] = [
    ("args-multi1", "regs-multi1"),
    ("args-multi2", "regs-multi2"),
    ("args-multi3", "regs-multi3"),
    ("args-multi4", "regs-multi4"),
    ("args-multi5", "regs-multi5"),
    ("args-multi6", "regs-multi6"),
    ("args-multi7", "regs-multi7"),
    ("args-multi8", "regs-multi8"),
];
const MULTI_SYMBOLS: [(&str, &str); Variant::MULTI_MAX as usize] = [
    ("ftrace_multi1_caller", "ftrace_regs_multi1_caller"),
    ("ftrace_multi2_caller", "ftrace_regs_multi2_caller"),
    ("ftrace_multi3_caller", "ftrace_regs_multi3_caller"),
    ("ftrace_multi4_caller", "ftrace_regs_multi4_caller"),
    ("ftrace_multi5_caller", "ftrace_regs_multi5_caller"),
    ("ftrace_multi6_caller", "ftrace_regs_multi6_caller"),
    ("ftrace_multi7_caller", "ftrace_regs_multi7_caller"),
    ("ftrace_multi8_caller", "ftrace_regs_multi8_caller"),
];

impl Variant {
    /// The most tracers one [`Dispatch::Multi`] trampoline calls.
    pub const MULTI_MAX: u8 = 8;

    /// The `multiN` entry variant of `tier`, if `1 <= n <= MULTI_MAX`.
    pub fn multi(tier: Tier, n: u8) -> Option<Variant> {
        (1..=Variant::MULTI_MAX).contains(&n).then_some(Variant::Entry { tier, dispatch: Dispatch::Multi(n) })
    }

    /// Every variant but the multi ones, in listing order (the multi
    /// variants come from [`Variant::multi`]).
    pub const ALL: [Variant; 7] = [
        Variant::Entry { tier: Tier::Args, dispatch: Dispatch::List },
        Variant::Entry { tier: Tier::Regs, dispatch: Dispatch::List },
        Variant::Entry { tier: Tier::Args, dispatch: Dispatch::Direct },
        Variant::Entry { tier: Tier::Regs, dispatch: Dispatch::Direct },
        Variant::Entry { tier: Tier::Args, dispatch: Dispatch::Callsite },
        Variant::Entry { tier: Tier::Regs, dispatch: Dispatch::Callsite },
        Variant::Return,
    ];

    /// The CLI name: `args-list`, `regs-direct`, …, `return`.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Entry { tier: Tier::Args, dispatch: Dispatch::List } => "args-list",
            Variant::Entry { tier: Tier::Regs, dispatch: Dispatch::List } => "regs-list",
            Variant::Entry { tier: Tier::Args, dispatch: Dispatch::Direct } => "args-direct",
            Variant::Entry { tier: Tier::Regs, dispatch: Dispatch::Direct } => "regs-direct",
            Variant::Entry { tier: Tier::Args, dispatch: Dispatch::Callsite } => "args-callsite",
            Variant::Entry { tier: Tier::Regs, dispatch: Dispatch::Callsite } => "regs-callsite",
            Variant::Entry { tier, dispatch: Dispatch::Multi(n) } => multi_entry(MULTI_NAMES, tier, n, "multi-invalid"),
            Variant::Return => "return",
        }
    }

    /// The symbol the variant gets in objects (Linux's names where Linux has one).
    pub fn symbol(self) -> &'static str {
        match self {
            Variant::Entry { tier: Tier::Args, dispatch: Dispatch::List } => "ftrace_caller",
            Variant::Entry { tier: Tier::Regs, dispatch: Dispatch::List } => "ftrace_regs_caller",
            Variant::Entry { tier: Tier::Args, dispatch: Dispatch::Direct } => "ftrace_direct_caller",
            Variant::Entry { tier: Tier::Regs, dispatch: Dispatch::Direct } => "ftrace_regs_direct_caller",
            Variant::Entry { tier: Tier::Args, dispatch: Dispatch::Callsite } => "ftrace_callsite_caller",
            Variant::Entry { tier: Tier::Regs, dispatch: Dispatch::Callsite } => "ftrace_regs_callsite_caller",
            Variant::Entry { tier, dispatch: Dispatch::Multi(n) } => multi_entry(MULTI_SYMBOLS, tier, n, "ftrace_multi_invalid_caller"),
            Variant::Return => "return_to_handler",
        }
    }

    /// The variant named `name` ([`Variant::name`]): one of [`Variant::ALL`]
    /// or `args-multiN` / `regs-multiN` with `1 <= N <= MULTI_MAX`.
    pub fn parse(name: &str) -> Option<Variant> {
        if let Some(v) = Variant::ALL.into_iter().find(|v| v.name() == name) {
            return Some(v);
        }
        let (tier, n) = match name.split_once("-multi")? {
            ("args", n) => (Tier::Args, n),
            ("regs", n) => (Tier::Regs, n),
            _ => return None,
        };
        // Digits only: no sign, no leading zero.
        if n.starts_with(['+', '0']) {
            return None;
        }
        Variant::multi(tier, n.parse().ok()?)
    }
}

/// The `(args, regs)` entry of `table` for `multiN`; `invalid` outside
/// `1..=MULTI_MAX` (such a variant is refused by [`crate::Image::generate`]).
fn multi_entry(table: [(&'static str, &'static str); Variant::MULTI_MAX as usize], tier: Tier, n: u8, invalid: &'static str) -> &'static str {
    match (table.get((n as usize).wrapping_sub(1)), tier) {
        (Some((args, _)), Tier::Args) => args,
        (Some((_, regs)), Tier::Regs) => regs,
        (None, _) => invalid,
    }
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The 64-bit data words trampolines read.  They live in writable memory
/// apart from the code, so retargeting is one aligned store (DESIGN §3.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DataWord {
    /// `function_trace_op`: the ops passed to the list function.
    FunctionTraceOp,
    /// Address of `ftrace_ops_list_func`.
    ListFunc,
    /// Address of `ftrace_return_to_handler`.
    ReturnHandler,
    /// The ops of tracer `i` (`i < `[`Variant::MULTI_MAX`]) of a direct
    /// (`i` = 0) or multi trampoline: `ftrace_direct_op`,
    /// `ftrace_direct_op_1`, …  Index 0 is also spelled
    /// [`DataWord::DirectOp`].
    TracerOp(u8),
    /// The callback of tracer `i`: `ftrace_direct_func`,
    /// `ftrace_direct_func_1`, …  Index 0 is also spelled
    /// [`DataWord::DirectFunc`].
    TracerFunc(u8),
    /// Stub entry: the address fgraph writes into hijacked return slots
    /// (its `return_to_handler`), 0 for none.
    GraphReturn,
    /// Stub entry: that `return_to_handler`'s `ftrace_call_through` prefix.
    GraphCall,
}

/// Symbols of the indexed words, by index.
const TRACER_OP_SYMBOLS: [&str; Variant::MULTI_MAX as usize] = [
    "ftrace_direct_op",
    "ftrace_direct_op_1",
    "ftrace_direct_op_2",
    "ftrace_direct_op_3",
    "ftrace_direct_op_4",
    "ftrace_direct_op_5",
    "ftrace_direct_op_6",
    "ftrace_direct_op_7",
];
const TRACER_FUNC_SYMBOLS: [&str; Variant::MULTI_MAX as usize] = [
    "ftrace_direct_func",
    "ftrace_direct_func_1",
    "ftrace_direct_func_2",
    "ftrace_direct_func_3",
    "ftrace_direct_func_4",
    "ftrace_direct_func_5",
    "ftrace_direct_func_6",
    "ftrace_direct_func_7",
];

impl DataWord {
    /// The ops of a direct trampoline (`ftrace_direct_op`): tracer 0's.
    /// The name the word had before multi dispatch, kept for callers.
    #[allow(non_upper_case_globals)]
    pub const DirectOp: DataWord = DataWord::TracerOp(0);
    /// The callback of a direct trampoline (`ftrace_direct_func`).
    #[allow(non_upper_case_globals)]
    pub const DirectFunc: DataWord = DataWord::TracerFunc(0);

    /// Every word, in data-area order: an image lays out the words its code
    /// uses in this order (the direct words right after the runtime ones,
    /// then the further tracers' pairs).
    pub const ALL: [DataWord; 5 + 2 * Variant::MULTI_MAX as usize] = {
        let mut all = [DataWord::FunctionTraceOp; 5 + 2 * Variant::MULTI_MAX as usize];
        all[1] = DataWord::ListFunc;
        all[2] = DataWord::ReturnHandler;
        let mut i = 0;
        while i < Variant::MULTI_MAX {
            all[3 + 2 * i as usize] = DataWord::TracerOp(i);
            all[4 + 2 * i as usize] = DataWord::TracerFunc(i);
            i += 1;
        }
        all[3 + 2 * Variant::MULTI_MAX as usize] = DataWord::GraphReturn;
        all[4 + 2 * Variant::MULTI_MAX as usize] = DataWord::GraphCall;
        all
    };

    /// Symbol of the word in objects and listings.
    pub fn symbol(self) -> &'static str {
        match self {
            DataWord::FunctionTraceOp => "function_trace_op",
            DataWord::ListFunc => "ftrace_ops_list_func_ptr",
            DataWord::ReturnHandler => "ftrace_return_to_handler_ptr",
            DataWord::TracerOp(i) => TRACER_OP_SYMBOLS.get(i as usize).copied().unwrap_or("ftrace_direct_op_invalid"),
            DataWord::TracerFunc(i) => TRACER_FUNC_SYMBOLS.get(i as usize).copied().unwrap_or("ftrace_direct_func_invalid"),
            DataWord::GraphReturn => "return_to_handler_ptr",
            DataWord::GraphCall => "ftrace_call_through_ptr",
        }
    }

    /// The external symbol whose address the word holds in objects, if any.
    pub fn initial_symbol(self) -> Option<&'static str> {
        match self {
            DataWord::ListFunc => Some("ftrace_ops_list_func"),
            DataWord::ReturnHandler => Some("ftrace_return_to_handler"),
            _ => None,
        }
    }
}

/// What a step is about, for listings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    None,
    /// A struct member: `fregs.rdi`, `pt_regs.rbx`.
    Slot(String),
    /// Free text.
    Text(&'static str),
}

/// One operation of a trampoline.  `off`s are relative to the stack pointer
/// after step 1 unless a `base` says otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// `sp += delta` (frame allocation keeps any back chain the ABI wants).
    AdjustSp { delta: i32 },
    /// `[base + off] = reg` (vector registers at full width).
    Store { reg: Reg, base: Reg, off: i32, note: Note },
    /// `reg = [base + off]`.
    Load { reg: Reg, base: Reg, off: i32, note: Note },
    /// `dst = src + imm` (a move when `imm` is 0).
    AddImm { dst: Reg, src: Reg, imm: i32, note: Note },
    /// `dst = *word`.
    LoadData { dst: Reg, word: DataWord },
    /// Call the address held in `word`; `scratch` may be clobbered.
    CallData { word: DataWord, scratch: Reg },
    /// Call the address in `target`.
    CallReg { target: Reg },
    /// Jump to the address in `target`.
    JumpReg { target: Reg },
    /// Return through the stack (x86 `ret`).
    Return,
    /// Stub entry, before the registers are restored: if the parent slot
    /// `[sp + parent]` holds `*`[`DataWord::GraphReturn`], move the resume
    /// address from `[sp + ip]` into it and put `*`[`DataWord::GraphCall`]
    /// at `[sp + ip]` (so the resume goes through `ftrace_call_through`).
    /// Clobbers `scratch` and the flags.
    GraphCallCheck { scratch: Reg, ip: i32, parent: i32 },
    /// Stub entry's resume: pop the resume address into `scratch`, jump to it.
    PopJump { scratch: Reg },
    /// `ftrace_call_through`: pop the resume address into `scratch` and call
    /// it; the call's return address is the next instruction,
    /// `return_to_handler`.
    CallThrough { scratch: Reg },
    /// Stub entry's `return_to_handler` end: return to the address in
    /// `target` through the return predictor (x86 `push` + `ret`), which
    /// pops the predictor's entry for the caller's `call` — a jump would
    /// leave it there, and the caller's own return, and every return above
    /// it, would then be mispredicted.
    ReturnReg { target: Reg },
    /// `[base + off] = ` the upper bits of vector register `reg` (spec
    /// `registers.vector_upper_bytes`; x86_64 `vextractf128`).
    StoreUpper { reg: Reg, base: Reg, off: i32 },
    /// Puts back the upper bits [`Step::StoreUpper`] saved at `[base +
    /// off]` of each `(reg, off)` if any of them is non-zero (else they were
    /// all zero, which the callbacks leave them as: compiled code clears
    /// them with `vzeroupper` before it returns).  Clobbers `scratch` (the
    /// spec's `trampoline.vector_scratch`, else one of the registers, whose
    /// low part is loaded afterwards) and the flags.  With `tops` (one
    /// offset per register, [`GenOptions::vector_wider`]), the bits above
    /// go back first from there, and every insert keeps the rest of the
    /// register.
    RestoreUppers { regs: Vec<(Reg, i32)>, base: Reg, scratch: Reg, tops: Vec<i32> },
    /// [`GenOptions::vector_wider`]: if any of the upper bits just saved
    /// at `[base + uppers[i]]` is non-zero, stores the bits above them of
    /// each `(reg, off)` at `[base + off]` (x86_64 `vextractf64x4`).  The
    /// restore makes the same test on the same words, so it loads them back
    /// exactly when they were stored.  Clobbers `scratch` and the flags.
    StoreTops { regs: Vec<(Reg, i32)>, uppers: Vec<i32>, base: Reg, scratch: Reg },
    /// Pops the non-empty registers at the top of the FP register stack,
    /// at most `max` (spec `abi.fp_stack_ret`), into 16-byte slots at
    /// `[base + off + 16 * (1 + i)]` for the `i`-th pop, and records what it
    /// popped in the first 16 bytes ([`fp_stack_area`]; x86_64: the status
    /// word and a count).  Clobbers `scratch` and the flags.
    PopFpStack { max: u8, base: Reg, off: i32, scratch: Reg },
    /// Pushes back what [`Step::PopFpStack`] popped, in reverse order, so
    /// the stack is as it was.  Clobbers the flags.
    PushFpStack { max: u8, base: Reg, off: i32 },
    /// Save sp through `scratch` and align it to the ABI's stack alignment
    /// (specs with `trampoline.realign_sp`); [`Step::RestoreSp`] after the
    /// call undoes it.
    AlignSp { scratch: Reg },
    /// sp as before the last [`Step::AlignSp`].
    RestoreSp,
    /// Save the flags register at `[sp + off]`.
    SaveFlags { off: i32, scratch: Reg },
    /// Restore the flags register from `[sp + off]`.
    RestoreFlags { off: i32, scratch: Reg },
    /// `[base + off] = a ; [base + off + size] = b` in one instruction
    /// (made by [`pair_up`] for arches whose spec sets `trampoline.pairs`).
    StorePair { a: Reg, b: Reg, base: Reg, off: i32, notes: (Note, Note) },
    /// `a = [base + off] ; b = [base + off + size]`.
    LoadPair { a: Reg, b: Reg, base: Reg, off: i32, notes: (Note, Note) },
    /// `[base + off + i*size] = reg(first + i)` for `i < count` in one
    /// instruction (made by [`group_runs`] for arches whose spec sets
    /// `trampoline.multiple`); one note per register.
    StoreMulti { first: Reg, count: u8, base: Reg, off: i32, notes: Vec<Note> },
    /// `reg(first + i) = [base + off + i*size]` for `i < count`.
    LoadMulti { first: Reg, count: u8, base: Reg, off: i32, notes: Vec<Note> },
}

/// Why code could not be generated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodegenError {
    #[error("{arch}: {what} does not fit: {value} (allowed {range})")]
    OutOfRange { arch: &'static str, what: &'static str, value: i64, range: &'static str },
    #[error("{arch}: {what}")]
    Unsupported { arch: &'static str, what: String },
    #[error("{arch}: dynasm: {what}")]
    Assembler { arch: &'static str, what: String },
    #[error(transparent)]
    Spec(#[from] crate::spec::SpecError),
    #[error("architecture `{0}` is not supported by this build (known: {1})")]
    UnknownArch(String, String),
    #[error("unknown variant `{0}` (known: {1})")]
    UnknownVariant(String, String),
}

/// Builds the steps of one trampoline entered from `call` sites.
pub fn steps(spec: &Spec, layout: &FrameLayout, variant: Variant) -> Vec<Step> {
    steps_for(spec, layout, variant, SiteEntry::Call)
}

/// Builds the steps of one trampoline for sites that enter as `entry`
/// ([`SiteEntry::Stub`] only where the spec sets `site.stub`).  A stub-entry
/// `return_to_handler` starts with the [`Step::CallThrough`] prefix.
pub fn steps_for(spec: &Spec, layout: &FrameLayout, variant: Variant, entry: SiteEntry) -> Vec<Step> {
    steps_with(spec, layout, variant, GenOptions { entry, ..Default::default() })
}

/// [`steps_for`] with every generation option ([`GenOptions::vector_upper`]
/// only where the spec has `registers.vector_upper_bytes`).
pub fn steps_with(spec: &Spec, layout: &FrameLayout, variant: Variant, opts: GenOptions) -> Vec<Step> {
    let steps = match variant {
        Variant::Entry { tier, dispatch } => entry_steps(spec, layout, tier, dispatch, opts),
        Variant::Return => return_steps(spec, layout, opts),
    };
    let steps = if spec.raw.trampoline.multiple { group_runs(spec, steps) } else { steps };
    if spec.raw.trampoline.pairs {
        pair_up(spec, steps)
    } else {
        steps
    }
}

/// Merges runs of neighbouring stores (or loads) of registers with
/// consecutive encodings to consecutive slots — register `first + i` at
/// `off + i*size` — into one multiple step.  A run's steps may come in
/// either order (the restore half walks the slots backwards); stores to
/// different addresses, and loads of different registers from different
/// addresses, may be reordered freely.  A load run never includes its base
/// register.
pub fn group_runs(spec: &Spec, steps: Vec<Step>) -> Vec<Step> {
    // (store?, reg, base, off, note) of a plain store/load that may join a run.
    fn item(s: &Step) -> Option<(bool, Reg, Reg, i32, Note)> {
        match s {
            Step::Store { reg, base, off, note } if reg.class != RegClass::Special => Some((true, *reg, *base, *off, note.clone())),
            Step::Load { reg, base, off, note } if reg.class != RegClass::Special && reg != base => {
                Some((false, *reg, *base, *off, note.clone()))
            }
            _ => None,
        }
    }
    let mut out = Vec::with_capacity(steps.len());
    let mut i = 0;
    while i < steps.len() {
        let Some((store, first, base, off, note)) = item(&steps[i]) else {
            out.push(steps[i].clone());
            i += 1;
            continue;
        };
        let size = spec.reg_bytes(first.class) as i32;
        // The run so far: lowest register/offset, count, notes in address order.
        let (mut lo_reg, mut lo_off, mut notes) = (first, off, std::collections::VecDeque::from([note]));
        let mut j = i + 1;
        while let Some((st, reg, b, o, n)) = steps.get(j).and_then(item) {
            if st != store || b != base || reg.class != first.class {
                break;
            }
            let count = notes.len() as i32;
            if o == lo_off + count * size && reg.enc as i32 == lo_reg.enc as i32 + count {
                notes.push_back(n);
            } else if o == lo_off - size && reg.enc as i32 == lo_reg.enc as i32 - 1 {
                notes.push_front(n);
                (lo_reg, lo_off) = (reg, o);
            } else {
                break;
            }
            j += 1;
        }
        if notes.len() < 2 {
            out.push(steps[i].clone());
        } else {
            let (count, notes) = (notes.len() as u8, notes.into_iter().collect());
            out.push(if store {
                Step::StoreMulti { first: lo_reg, count, base, off: lo_off, notes }
            } else {
                Step::LoadMulti { first: lo_reg, count, base, off: lo_off, notes }
            });
        }
        i = j;
    }
    out
}

/// Merges neighbouring stores (or loads) of two registers of one class to
/// adjacent slots into one pair step.  Stores to different addresses may be
/// swapped freely; a load pair is only formed when neither destination is
/// the base register and the two destinations differ.
pub fn pair_up(spec: &Spec, steps: Vec<Step>) -> Vec<Step> {
    let size = |r: &Reg| spec.reg_bytes(r.class) as i32;
    let mut out: Vec<Step> = Vec::with_capacity(steps.len());
    let mut it = steps.into_iter().peekable();
    while let Some(s) = it.next() {
        let paired = match (&s, it.peek()) {
            (
                Step::Store { reg: r1, base: b1, off: o1, note: n1 },
                Some(Step::Store { reg: r2, base: b2, off: o2, note: n2 }),
            ) if b1 == b2 && r1.class == r2.class && r1.class != RegClass::Special && (o1 - o2).abs() == size(r1) => {
                let (a, b, off, notes) = if o1 < o2 { (*r1, *r2, *o1, (n1.clone(), n2.clone())) } else { (*r2, *r1, *o2, (n2.clone(), n1.clone())) };
                Some(Step::StorePair { a, b, base: *b1, off, notes })
            }
            (
                Step::Load { reg: r1, base: b1, off: o1, note: n1 },
                Some(Step::Load { reg: r2, base: b2, off: o2, note: n2 }),
            ) if b1 == b2
                && r1 != r2
                && r1 != b1
                && r2 != b1
                && r1.class == r2.class
                && r1.class != RegClass::Special
                && (o1 - o2).abs() == size(r1) =>
            {
                let (a, b, off, notes) = if o1 < o2 { (*r1, *r2, *o1, (n1.clone(), n2.clone())) } else { (*r2, *r1, *o2, (n2.clone(), n1.clone())) };
                Some(Step::LoadPair { a, b, base: *b1, off, notes })
            }
            _ => None,
        };
        match paired {
            Some(p) => {
                it.next();
                out.push(p);
            }
            None => out.push(s),
        }
    }
    out
}

fn slot_note(spec: &Spec, layout: &FrameLayout, kind: SlotKind) -> Note {
    let idx = layout.slots.iter().position(|s| s.kind == kind).unwrap_or(0);
    let strukt = if idx < layout.fregs_count { "fregs" } else { "pt_regs" };
    Note::Slot(format!("{strukt}.{}", spec.slot_name(kind)))
}

/// Bytes a trampoline allocates: the tier's frame ([`FrameLayout::frame_size`])
/// plus, for a multi trampoline with more than one tracer, the two words
/// that keep `ip` and `parent_ip` for the calls after the first (at the top
/// of the frame, offset [`FrameLayout::frame_size`]; 16 bytes, so the
/// callbacks' stack stays aligned).
pub fn frame_size(layout: &FrameLayout, variant: Variant) -> u32 {
    match variant {
        Variant::Entry { tier, dispatch: Dispatch::Multi(n) } if n > 1 => layout.frame_size(tier) + MULTI_SAVE_AREA,
        Variant::Entry { tier: Tier::Args, .. } if layout.stack_aliased_ip.is_some() => {
            layout.stack_aliased_ip.expect("checked") + layout.fregs_base()
        }
        Variant::Entry { tier, .. } => layout.frame_size(tier),
        Variant::Return => layout.frame_size(Tier::Args),
    }
}

/// See [`frame_size`]: a multiple of every spec's stack alignment (≤ 16).
const MULTI_SAVE_AREA: u32 = 16;

/// The vector registers a variant saves (their `ftrace_regs` slots).
fn saved_vectors(spec: &Spec, layout: &FrameLayout, variant: Variant) -> Vec<Reg> {
    match variant {
        Variant::Entry { tier, .. } => layout
            .tier_slots(tier)
            .iter()
            .filter_map(|s| match s.kind {
                SlotKind::Reg(r) if r.class == RegClass::Vector => Some(r),
                _ => None,
            })
            .collect(),
        Variant::Return => spec.fp_ret.clone(),
    }
}

/// Bytes below `struct ftrace_regs` (above the callee's `call_reserve`)
/// that keep the saved vector registers' upper bits
/// ([`GenOptions::vector_upper`]; 0 without), a multiple of 16.
pub fn upper_area(spec: &Spec, layout: &FrameLayout, variant: Variant, opts: GenOptions) -> u32 {
    if !opts.vector_upper || spec.vector_upper_bytes == 0 {
        return 0;
    }
    let per_reg = spec.vector_upper_bytes + if opts.vector_wider { spec.vector_wider_bytes } else { 0 };
    (saved_vectors(spec, layout, variant).len() as u32 * per_reg).div_ceil(16) * 16
}

/// Bytes of `return_to_handler`'s frame that keep the x87 return registers
/// ([`Step::PopFpStack`]; spec `abi.fp_stack_ret`, 0 without): a 16-byte
/// count slot, then one 16-byte slot per register.  It lies above the
/// upper-bits area, below `struct ftrace_regs`.
pub fn fp_stack_area(spec: &Spec, variant: Variant) -> u32 {
    match variant {
        Variant::Return if spec.fp_stack_ret > 0 => 16 * (1 + spec.fp_stack_ret),
        _ => 0,
    }
}

/// [`frame_size`] with the generation options and the spec's extra areas
/// ([`upper_area`], then [`fp_stack_area`]), which lie below `struct
/// ftrace_regs`.
pub fn frame_size_with(spec: &Spec, layout: &FrameLayout, variant: Variant, opts: GenOptions) -> u32 {
    frame_size(layout, variant) + upper_area(spec, layout, variant, opts) + fp_stack_area(spec, variant)
}

/// The upper-bits steps of `variant` ([`upper_area`], which starts at
/// `[sp + fregs_base]`): the stores, and the restore (both empty without
/// the area).
fn upper_steps(spec: &Spec, layout: &FrameLayout, variant: Variant, opts: GenOptions) -> (Vec<Step>, Vec<Step>) {
    if upper_area(spec, layout, variant, opts) == 0 {
        return (Vec::new(), Vec::new());
    }
    let vectors = saved_vectors(spec, layout, variant);
    let (sp, at) = (spec.sp, layout.fregs_base() as i32);
    let size = spec.vector_upper_bytes as i32;
    let regs: Vec<(Reg, i32)> = vectors.iter().enumerate().map(|(i, r)| (*r, at + i as i32 * size)).collect();
    let mut stores: Vec<Step> = regs.iter().map(|&(reg, off)| Step::StoreUpper { reg, base: sp, off }).collect();
    let scratch = spec.vector_scratch.unwrap_or(vectors[0]);
    // The top bits after every upper half (vector_wider).
    let top_at = at + vectors.len() as i32 * size;
    let tops: Vec<i32> = if opts.vector_wider {
        (0..vectors.len() as i32).map(|i| top_at + i * spec.vector_wider_bytes as i32).collect()
    } else {
        Vec::new()
    };
    if !tops.is_empty() {
        let uppers = regs.iter().map(|r| r.1).collect();
        stores.push(Step::StoreTops { regs: vectors.iter().copied().zip(tops.iter().copied()).collect(), uppers, base: sp, scratch });
    }
    (stores, vec![Step::RestoreUppers { regs, base: sp, scratch, tops }])
}

fn entry_steps(spec: &Spec, layout: &FrameLayout, tier: Tier, dispatch: Dispatch, opts: GenOptions) -> Vec<Step> {
    let sp = spec.sp;
    let t = spec.scratch[0];
    let stub = opts.entry == SiteEntry::Stub;
    let variant = Variant::Entry { tier, dispatch };
    // The upper-bits area, if any, is between the callee's area
    // (`call_reserve`) and `struct ftrace_regs`.
    let below = upper_area(spec, layout, variant, opts) as i32;
    let frame = frame_size_with(spec, layout, variant, opts) as i32;
    // Multi: where `ip` and `parent_ip` are kept for the later calls.
    let saved_ip = below + layout.frame_size(tier) as i32;
    let base = below + layout.fregs_base() as i32;
    let (save_upper, restore_upper) = upper_steps(spec, layout, variant, opts);
    let at = |kind: SlotKind| base + layout.slot(kind).expect("checked by spec").offset as i32;
    let note = |kind: SlotKind| slot_note(spec, layout, kind);
    // Distance from our sp to the trampoline's entry sp.
    let entry = frame;
    // fregs.ip / fregs.return_address are the stack slots themselves (see
    // FrameLayout::stack_aliased_ip): nothing to copy in or write back.
    let aliased = frame as u32 == layout.stack_aliased_ip.map(|o| o + below as u32 + layout.fregs_base()).unwrap_or(u32::MAX)
        && tier == Tier::Args
        && !matches!(dispatch, Dispatch::Multi(n) if n > 1);
    let mut s = Vec::new();

    // 1. Frame.
    s.push(Step::AdjustSp { delta: -frame });

    // 2. Registers of the tier.
    let mut flags_off = None;
    for slot in layout.tier_slots(tier) {
        match slot.kind {
            SlotKind::Reg(reg) => s.push(Step::Store { reg, base: sp, off: at(slot.kind), note: note(slot.kind) }),
            SlotKind::Flags => flags_off = Some(at(slot.kind)),
            _ => {}
        }
    }
    s.extend(save_upper);
    if let Some(off) = flags_off {
        s.push(Step::SaveFlags { off, scratch: t });
    }

    // 3. Specials.  The parent first: on x86 both come through `t`.
    let site_ret = if aliased {
        s.push(Step::Load { reg: t, base: sp, off: at(SlotKind::Ip), note: Note::Text("address after the site (= fregs.ip)") });
        t
    } else {
        copy_specials(spec, &mut s, t, entry, &at, &note)
    };
    // The traced function's sp at its entry: the site's `call` may have
    // pushed the site return address.
    let pushed = if matches!(spec.site_return, Location::Stack(_)) { 8 } else { 0 };
    let arg = &spec.int_args;
    s.push(Step::AddImm { dst: arg[3], src: sp, imm: entry + pushed, note: Note::Text("traced function's sp") });
    s.push(Step::Store { reg: arg[3], base: sp, off: at(SlotKind::Sp), note: note(SlotKind::Sp) });

    // 4. The call: func(ip, parent_ip, op, fregs).
    s.push(Step::AddImm { dst: arg[0], src: site_ret, imm: spec.raw.site.ip_offset, note: Note::Text("ip = site address") });
    s.push(Step::Load { reg: arg[1], base: sp, off: at(SlotKind::ReturnAddress), note: Note::Text("parent_ip") });
    s.push(Step::AddImm { dst: arg[3], src: sp, imm: base, note: Note::Text("fregs") });
    match dispatch {
        Dispatch::List => {
            s.push(Step::LoadData { dst: arg[2], word: DataWord::FunctionTraceOp });
            push_call(spec, &mut s, t, [Step::CallData { word: DataWord::ListFunc, scratch: t }]);
        }
        Dispatch::Direct => {
            s.push(Step::LoadData { dst: arg[2], word: DataWord::TracerOp(0) });
            push_call(spec, &mut s, t, [Step::CallData { word: DataWord::TracerFunc(0), scratch: t }]);
        }
        Dispatch::Callsite => {
            // `t` is the target here: the realignment (which uses it) comes first.
            let op = Step::Load { reg: arg[2], base: arg[0], off: spec.raw.site.callsite_ops_offset, note: Note::Text("op = word before the function") };
            let func = Step::Load { reg: t, base: arg[2], off: 0, note: Note::Text("op->func") };
            push_call(spec, &mut s, t, [op, func, Step::CallReg { target: t }]);
        }
        Dispatch::Multi(n) => {
            // The arguments are caller-saved: keep ip and parent_ip for the
            // calls after the first (fregs is recomputed from sp).
            if n > 1 {
                s.push(Step::Store { reg: arg[0], base: sp, off: saved_ip, note: Note::Text("keep ip") });
                s.push(Step::Store { reg: arg[1], base: sp, off: saved_ip + 8, note: Note::Text("keep parent_ip") });
            }
            for i in 0..n {
                if i > 0 {
                    s.push(Step::Load { reg: arg[0], base: sp, off: saved_ip, note: Note::Text("ip") });
                    s.push(Step::Load { reg: arg[1], base: sp, off: saved_ip + 8, note: Note::Text("parent_ip") });
                    s.push(Step::AddImm { dst: arg[3], src: sp, imm: base, note: Note::Text("fregs") });
                }
                s.push(Step::LoadData { dst: arg[2], word: DataWord::TracerOp(i) });
                push_call(spec, &mut s, t, [Step::CallData { word: DataWord::TracerFunc(i), scratch: t }]);
            }
        }
    }

    // 5. Restore, 6. resume.
    let restore = |s: &mut Vec<Step>| {
        // (Before the flags: it clobbers them.)
        s.extend(restore_upper.iter().cloned());
        if let Some(off) = flags_off {
            s.push(Step::RestoreFlags { off, scratch: t });
        }
        for slot in layout.tier_slots(tier).iter().rev() {
            if let SlotKind::Reg(reg) = slot.kind {
                s.push(Step::Load { reg, base: sp, off: at(slot.kind), note: note(slot.kind) });
            }
        }
    };
    // Stub entry: choose between a plain resume and the call through
    // return_to_handler (module docs), then resume without `ret`.
    let finish = |s: &mut Vec<Step>, n: u32, p: u32| {
        if stub {
            s.push(Step::GraphCallCheck { scratch: t, ip: entry + n as i32, parent: entry + p as i32 });
        }
        restore(s);
        s.push(Step::AdjustSp { delta: frame });
        s.push(if stub { Step::PopJump { scratch: t } } else { Step::Return });
    };
    let parent_slot = || match spec.parent {
        Location::Stack(p) => p,
        Location::Reg(_) => unreachable!("checked by spec"),
    };
    match spec.site_return {
        Location::Stack(n) if aliased => finish(&mut s, n, parent_slot()),
        Location::Stack(n) => {
            // Return address slots first (through the scratch register),
            // then the registers, so a restored scratch stays restored.
            s.push(Step::Load { reg: t, base: sp, off: at(SlotKind::Ip), note: note(SlotKind::Ip) });
            s.push(Step::Store { reg: t, base: sp, off: entry + n as i32, note: Note::Text("resume at ip") });
            s.push(Step::Load { reg: t, base: sp, off: at(SlotKind::ReturnAddress), note: note(SlotKind::ReturnAddress) });
            let p = parent_slot();
            s.push(Step::Store { reg: t, base: sp, off: entry + p as i32, note: Note::Text("traced function returns here") });
            finish(&mut s, n, p);
        }
        Location::Reg(_) => {
            restore(&mut s);
            let via = spec.resume_via.expect("checked by spec");
            // A special register (ppc64 `lr`) is set by a move from the
            // general-purpose register loaded before it, or through `via`.
            let mut loaded: Option<Reg> = None;
            for r in &spec.resume_return_address {
                if r.class == RegClass::Special {
                    let from = match loaded {
                        Some(g) => g,
                        None => {
                            s.push(Step::Load { reg: via, base: sp, off: at(SlotKind::ReturnAddress), note: note(SlotKind::ReturnAddress) });
                            via
                        }
                    };
                    s.push(Step::AddImm { dst: *r, src: from, imm: 0, note: Note::Text("return address") });
                    continue;
                }
                s.push(Step::Load { reg: *r, base: sp, off: at(SlotKind::ReturnAddress), note: note(SlotKind::ReturnAddress) });
                if r.class == RegClass::Gpr {
                    loaded = Some(*r);
                }
            }
            s.push(Step::Load { reg: via, base: sp, off: at(SlotKind::Ip), note: note(SlotKind::Ip) });
            s.push(Step::AdjustSp { delta: frame });
            s.push(Step::JumpReg { target: via });
        }
    }
    s
}

/// Appends `call` (steps that end in a call into the runtime), with sp
/// aligned to the ABI around them where the spec asks
/// (`trampoline.realign_sp`: the traced function may have been entered on
/// a misaligned stack).  `scratch` keeps the old sp for a moment, and
/// nothing in `call` may address the frame through sp.
fn push_call(spec: &Spec, s: &mut Vec<Step>, scratch: Reg, call: impl IntoIterator<Item = Step>) {
    let realign = spec.raw.trampoline.realign_sp;
    if realign {
        s.push(Step::AlignSp { scratch });
    }
    s.extend(call);
    if realign {
        s.push(Step::RestoreSp);
    }
}

/// Copies the traced function's return address and the address after the
/// site into `fregs.return_address` / `fregs.ip`; returns the register that
/// holds the address after the site.
fn copy_specials(spec: &Spec, s: &mut Vec<Step>, t: Reg, entry: i32, at: &dyn Fn(SlotKind) -> i32, note: &dyn Fn(SlotKind) -> Note) -> Reg {
    let sp = spec.sp;
    let parent_reg = match spec.parent {
        Location::Reg(r) => r,
        Location::Stack(n) => {
            s.push(Step::Load { reg: t, base: sp, off: entry + n as i32, note: Note::Text("parent return address") });
            t
        }
    };
    s.push(Step::Store { reg: parent_reg, base: sp, off: at(SlotKind::ReturnAddress), note: note(SlotKind::ReturnAddress) });
    let site_ret = match spec.site_return {
        // A special register (ppc64 `lr`) is first copied into the scratch
        // register: reading it needs a move, and later steps (a PC-relative
        // data load) may clobber it.
        Location::Reg(r) if r.class == RegClass::Special => {
            s.push(Step::AddImm { dst: t, src: r, imm: 0, note: Note::Text("address after the site") });
            t
        }
        Location::Reg(r) => r,
        Location::Stack(n) => {
            s.push(Step::Load { reg: t, base: sp, off: entry + n as i32, note: Note::Text("address after the site") });
            t
        }
    };
    s.push(Step::Store { reg: site_ret, base: sp, off: at(SlotKind::Ip), note: note(SlotKind::Ip) });
    site_ret
}

fn return_steps(spec: &Spec, layout: &FrameLayout, opts: GenOptions) -> Vec<Step> {
    let sp = spec.sp;
    let stub = opts.entry == SiteEntry::Stub;
    let upper = upper_area(spec, layout, Variant::Return, opts) as i32;
    let below = upper + fp_stack_area(spec, Variant::Return) as i32;
    let frame = frame_size_with(spec, layout, Variant::Return, opts) as i32;
    let base = below + layout.fregs_base() as i32;
    let (save_upper, restore_upper) = upper_steps(spec, layout, Variant::Return, opts);
    // The x87 area, above the upper-bits area.
    let fp_stack = (spec.fp_stack_ret > 0).then(|| (spec.fp_stack_ret as u8, layout.fregs_base() as i32 + upper));
    let at = |kind: SlotKind| base + layout.slot(kind).expect("checked by spec").offset as i32;
    let note = |kind: SlotKind| slot_note(spec, layout, kind);
    // The TOC register (ppc64) is saved too: a callee in another module
    // leaves its own TOC in it.
    let saved: Vec<Reg> = spec.int_ret.iter().chain(&spec.fp_ret).copied().chain([spec.fp]).chain(spec.toc).collect();
    let arg0 = spec.int_args[0];
    let mut s = Vec::new();
    if stub {
        s.push(Step::CallThrough { scratch: spec.return_via });
    }
    s.push(Step::AdjustSp { delta: -frame });
    for r in &saved {
        s.push(Step::Store { reg: *r, base: sp, off: at(SlotKind::Reg(*r)), note: note(SlotKind::Reg(*r)) });
    }
    s.extend(save_upper);
    let t = spec.scratch[0];
    if let Some((max, off)) = fp_stack {
        s.push(Step::PopFpStack { max, base: sp, off, scratch: t });
    }
    s.push(Step::AddImm { dst: t, src: sp, imm: frame, note: Note::Text("sp after the return") });
    s.push(Step::Store { reg: t, base: sp, off: at(SlotKind::Sp), note: note(SlotKind::Sp) });
    s.push(Step::AddImm { dst: arg0, src: sp, imm: base, note: Note::Text("fregs") });
    push_call(spec, &mut s, t, [Step::CallData { word: DataWord::ReturnHandler, scratch: t }]);
    s.push(Step::AddImm { dst: spec.return_via, src: spec.int_ret[0], imm: 0, note: Note::Text("the real return address") });
    if let Some((max, off)) = fp_stack {
        s.push(Step::PushFpStack { max, base: sp, off });
    }
    s.extend(restore_upper);
    for r in saved.iter().rev() {
        if *r == spec.fp {
            continue;
        }
        s.push(Step::Load { reg: *r, base: sp, off: at(SlotKind::Reg(*r)), note: note(SlotKind::Reg(*r)) });
    }
    s.push(Step::AdjustSp { delta: frame });
    // From call sites the traced function's `ret` already popped the
    // caller's predictor entry (mispredicted): jump.  From stubs it popped
    // `ftrace_call_through`'s: return, so that the caller's entry goes too.
    s.push(if stub { Step::ReturnReg { target: spec.return_via } } else { Step::JumpReg { target: spec.return_via } });
    s
}

/// Renders a step the way listings show it.
pub fn describe(spec: &Spec, step: &Step) -> String {
    let r = |reg: &Reg| spec.reg_name(*reg);
    let mem = |base: &Reg, off: &i32| {
        if *off < 0 {
            format!("[{}-{}]", r(base), -off)
        } else {
            format!("[{}+{}]", r(base), off)
        }
    };
    let n = |note: &Note| match note {
        Note::None => String::new(),
        Note::Slot(s) => format!("  ; {s}"),
        Note::Text(t) => format!("  ; {t}"),
    };
    match step {
        Step::AdjustSp { delta } => format!("adjust_sp {delta:+}"),
        Step::Store { reg, base, off, note } => format!("store     {} -> {}{}", r(reg), mem(base, off), n(note)),
        Step::Load { reg, base, off, note } => format!("load      {} <- {}{}", r(reg), mem(base, off), n(note)),
        Step::AddImm { dst, src, imm, note } if *imm == 0 => format!("move      {} <- {}{}", r(dst), r(src), n(note)),
        Step::AddImm { dst, src, imm, note } => format!("add_imm   {} <- {} {:+}{}", r(dst), r(src), imm, n(note)),
        Step::LoadData { dst, word } => format!("load_data {} <- {}", r(dst), word.symbol()),
        Step::CallData { word, .. } => format!("call_data {}", word.symbol()),
        Step::CallReg { target } => format!("call_reg  {}", r(target)),
        Step::JumpReg { target } => format!("jump_reg  {}", r(target)),
        Step::Return => "return".to_string(),
        Step::GraphCallCheck { scratch, ip, parent } => format!(
            "graph_call_check via {}: if {} == return_to_handler_ptr, resume through ftrace_call_through_ptr (ip {} moves to the parent slot)",
            r(scratch),
            mem(&spec.sp, parent),
            mem(&spec.sp, ip)
        ),
        Step::ReturnReg { target } => format!("return_reg {}  ; push + ret: pops the caller's return-predictor entry", r(target)),
        Step::PopJump { scratch } => format!("pop_jump  {}  ; resume (no `ret`: the site did not `call`)", r(scratch)),
        Step::CallThrough { scratch } => format!("call_through {}  ; ftrace_call_through: pop the resume address, call it; returns to the next step", r(scratch)),
        Step::StoreUpper { reg, base, off } => format!("store_upper {} -> {}  ; upper bits", r(reg), mem(base, off)),
        Step::RestoreUppers { regs, base, scratch, tops } => format!(
            "restore_uppers {} from {}.. if any is non-zero (test via {}){}",
            regs.iter().map(|(g, _)| r(g)).collect::<Vec<_>>().join(","),
            mem(base, &regs.first().map(|x| x.1).unwrap_or(0)),
            r(scratch),
            match tops.first() {
                Some(t) => format!(", the bits above them first from {}..", mem(base, t)),
                None => String::new(),
            }
        ),
        Step::StoreTops { regs, base, scratch, .. } => format!(
            "store_tops {} -> {}.. if an upper half is non-zero (test via {})  ; bits above the upper ones",
            regs.iter().map(|(g, _)| r(g)).collect::<Vec<_>>().join(","),
            mem(base, &regs.first().map(|x| x.1).unwrap_or(0)),
            r(scratch)
        ),
        Step::PopFpStack { max, base, off, scratch } => format!(
            "pop_fp_stack up to {max} -> {}.., count at {}  ; x87 return values (test via {})",
            mem(base, &(off + 16)),
            mem(base, off),
            r(scratch)
        ),
        Step::PushFpStack { max, base, off } => {
            format!("push_fp_stack up to {max} from {}.., count at {}", mem(base, &(off + 16)), mem(base, off))
        }
        Step::AlignSp { scratch } => format!("align_sp  {} (old sp via {})", spec.stack_alignment, r(scratch)),
        Step::RestoreSp => "restore_sp".to_string(),
        Step::StorePair { a, b, base, off, notes } => {
            format!("store2    {}, {} -> {}{}{}", r(a), r(b), mem(base, off), n(&notes.0), n(&notes.1).replace("  ;", ","))
        }
        Step::LoadPair { a, b, base, off, notes } => {
            format!("load2     {}, {} <- {}{}{}", r(a), r(b), mem(base, off), n(&notes.0), n(&notes.1).replace("  ;", ","))
        }
        Step::StoreMulti { first, count, base, off, notes } | Step::LoadMulti { first, count, base, off, notes } => {
            let last = Reg { class: first.class, enc: first.enc + count - 1 };
            let (verb, arrow) = if matches!(step, Step::StoreMulti { .. }) { ("store", "->") } else { ("load", "<-") };
            let span = |a: &Note, b: &Note| match (a, b) {
                (Note::Slot(a), Note::Slot(b)) => format!("  ; {a} .. {b}"),
                // Free-text notes (a multi trampoline's kept ip/parent_ip)
                // are listed one by one.
                _ => {
                    let texts: Vec<&str> = notes.iter().filter_map(|n| if let Note::Text(t) = n { Some(*t) } else { None }).collect();
                    if texts.is_empty() { String::new() } else { format!("  ; {}", texts.join(", ")) }
                }
            };
            let note = span(notes.first().unwrap_or(&Note::None), notes.last().unwrap_or(&Note::None));
            format!("{:<9} {}..{} {arrow} {}{note}", format!("{verb}{count}"), r(first), r(&last), mem(base, off))
        }
        Step::SaveFlags { off, .. } => format!("save_flags -> {}", mem(&spec.sp, off)),
        Step::RestoreFlags { off, .. } => format!("restore_flags <- {}", mem(&spec.sp, off)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(reg: Reg, off: i32) -> Step {
        Step::Store { reg, base: Reg::special(31), off, note: Note::None }
    }
    fn ld(reg: Reg, base: Reg, off: i32) -> Step {
        Step::Load { reg, base, off, note: Note::None }
    }

    /// The upper-bits area lies above the callee's area and below `struct
    /// ftrace_regs`, inside the frame, for every variant (x86_64's spec with
    /// a callee area of 32 bytes, as s390x and ppc64 have one).
    #[test]
    fn the_upper_area_sits_between_the_callee_area_and_ftrace_regs() {
        let text = include_str!("../../arch-specs/x86_64.toml").replace("call_reserve = 0", "call_reserve = 32");
        assert!(text.contains("call_reserve = 32"));
        let spec = Spec::parse("x86_64-reserve.toml", &text).unwrap();
        let layout = FrameLayout::new(&spec);
        let variants = Variant::ALL.into_iter().chain([Variant::multi(Tier::Args, 3).unwrap(), Variant::multi(Tier::Regs, 2).unwrap()]);
        for v in variants {
            for entry in [SiteEntry::Call, SiteEntry::Stub] {
                let opts = GenOptions { entry, vector_upper: true, ..Default::default() };
                let below = upper_area(&spec, &layout, v, opts) as i32;
                let frame = frame_size_with(&spec, &layout, v, opts) as i32;
                let vectors = saved_vectors(&spec, &layout, v).len() as i32;
                assert_eq!(below, vectors * 16, "{v}");
                let steps = steps_with(&spec, &layout, v, opts);
                let uppers: Vec<i32> = steps.iter().filter_map(|s| if let Step::StoreUpper { off, .. } = s { Some(*off) } else { None }).collect();
                assert_eq!(uppers.len() as i32, vectors, "{v}");
                assert!(uppers.iter().all(|o| (32..32 + below).contains(o) && (o - 32) % 16 == 0), "{v}: {uppers:?}");
                let restores: Vec<&Vec<(Reg, i32)>> = steps.iter().filter_map(|s| if let Step::RestoreUppers { regs, .. } = s { Some(regs) } else { None }).collect();
                assert!(!restores.is_empty() && restores.iter().all(|r| r.iter().map(|x| x.1).collect::<Vec<_>>() == uppers), "{v}");
                // With the top bits (AVX-512): after the upper halves, in
                // the same area, stored under the same test and restored
                // from the same words.
                let wide = GenOptions { vector_wider: true, ..opts };
                let wide_below = upper_area(&spec, &layout, v, wide) as i32;
                assert_eq!(wide_below, vectors * (16 + 32), "{v}");
                let wsteps = steps_with(&spec, &layout, v, wide);
                let tops: Vec<(Vec<i32>, Vec<i32>)> = wsteps
                    .iter()
                    .filter_map(|s| if let Step::StoreTops { regs, uppers, .. } = s { Some((regs.iter().map(|r| r.1).collect(), uppers.clone())) } else { None })
                    .collect();
                assert_eq!(tops.len(), 1, "{v}");
                let (top_offs, tested) = &tops[0];
                assert_eq!(tested, &uppers, "{v}: the store tests the upper halves it stored");
                assert!(top_offs.iter().enumerate().all(|(i, o)| *o == 32 + below + i as i32 * 32), "{v}: {top_offs:?}");
                let wrestores: Vec<&Vec<i32>> = wsteps.iter().filter_map(|s| if let Step::RestoreUppers { tops, .. } = s { Some(tops) } else { None }).collect();
                assert!(!wrestores.is_empty() && wrestores.iter().all(|t| *t == top_offs), "{v}");
                assert!(wsteps.iter().all(|s| !matches!(s, Step::Store { off, .. } if *off >= 32 && *off < 32 + wide_below)), "{v}: a register slot in the area");
                for s in &steps {
                    if let Step::Store { off, .. } = s {
                        if *off < frame {
                            assert!(*off >= 32 + below, "{v}: a register slot at {off} inside the upper area or the callee's");
                        }
                    }
                }
            }
        }
    }

    /// The x87 area of `return_to_handler` lies above the callee's area and
    /// the upper-bits area and below `struct ftrace_regs`; the pop comes
    /// before the call into the runtime and the push after it, with the
    /// same area; entry trampolines have neither (x86_64's spec with a
    /// callee area of 32 bytes).
    #[test]
    fn the_x87_area_sits_below_ftrace_regs_and_brackets_the_call() {
        let text = include_str!("../../arch-specs/x86_64.toml").replace("call_reserve = 0", "call_reserve = 32");
        let spec = Spec::parse("x86_64-reserve.toml", &text).unwrap();
        assert_eq!(spec.fp_stack_ret, 2);
        let layout = FrameLayout::new(&spec);
        for v in Variant::ALL {
            for vector_upper in [false, true] {
                for entry in [SiteEntry::Call, SiteEntry::Stub] {
                    let opts = GenOptions { entry, vector_upper, ..Default::default() };
                    let steps = steps_with(&spec, &layout, v, opts);
                    let pops: Vec<(usize, u8, i32)> = steps.iter().enumerate().filter_map(|(i, s)| if let Step::PopFpStack { max, off, .. } = s { Some((i, *max, *off)) } else { None }).collect();
                    let pushes: Vec<(usize, u8, i32)> = steps.iter().enumerate().filter_map(|(i, s)| if let Step::PushFpStack { max, off, .. } = s { Some((i, *max, *off)) } else { None }).collect();
                    if v != Variant::Return {
                        assert!(pops.is_empty() && pushes.is_empty() && fp_stack_area(&spec, v) == 0, "{v}");
                        continue;
                    }
                    let ([(pi, max, off)], [(qi, qmax, qoff)]) = (pops.as_slice(), pushes.as_slice()) else { panic!("{v}: one pop, one push: {pops:?} {pushes:?}") };
                    assert_eq!((max, off), (qmax, qoff), "the push reads what the pop wrote");
                    assert_eq!(*max, 2);
                    let upper = upper_area(&spec, &layout, v, opts) as i32;
                    let area = fp_stack_area(&spec, v) as i32;
                    assert_eq!(area, 48);
                    assert_eq!(*off, 32 + upper, "above the callee's area and the upper bits");
                    let fregs = 32 + upper + area;
                    let call = steps.iter().position(|s| matches!(s, Step::CallData { word: DataWord::ReturnHandler, .. })).unwrap();
                    assert!(pi < &call && &call < qi, "{v}: pop before the call, push after");
                    for (i, s) in steps.iter().enumerate() {
                        match s {
                            Step::Store { reg, off, .. } if *off < frame_size_with(&spec, &layout, v, opts) as i32 => {
                                assert!(*off >= fregs, "{v}: a register slot at {off} inside the x87 area");
                                if spec.int_ret.contains(reg) || spec.fp_ret.contains(reg) {
                                    assert!(i < *pi, "{v}: the return registers are saved before the x87 pop");
                                }
                            }
                            Step::Load { reg, .. } => assert!(i > *qi || *reg == spec.return_via, "{v}: registers are loaded after the push"),
                            _ => {}
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn neighbouring_stores_pair_in_address_order() {
        let spec = Spec::builtin("aarch64").unwrap();
        let (x0, x1, x2) = (Reg::gpr(0), Reg::gpr(1), Reg::gpr(2));
        let out = pair_up(&spec, vec![st(x1, 8), st(x0, 0), st(x2, 24)]);
        assert_eq!(out.len(), 2);
        assert!(matches!(out[0], Step::StorePair { a, b, off: 0, .. } if a == x0 && b == x1));
        assert_eq!(out[1], st(x2, 24), "a store 16 bytes away stays alone");
    }

    #[test]
    fn loads_pair_only_when_safe() {
        let spec = Spec::builtin("aarch64").unwrap();
        let sp = Reg::special(31);
        let (x0, x1) = (Reg::gpr(0), Reg::gpr(1));
        // Loading into the base register must stay two loads.
        assert_eq!(pair_up(&spec, vec![ld(x0, x0, 0), ld(x1, x0, 8)]).len(), 2);
        // The same destination twice must stay two loads.
        assert_eq!(pair_up(&spec, vec![ld(x0, sp, 0), ld(x0, sp, 8)]).len(), 2);
        // Different classes never pair.
        assert_eq!(pair_up(&spec, vec![ld(x0, sp, 0), ld(Reg::vector(0), sp, 8)]).len(), 2);
        assert!(matches!(pair_up(&spec, vec![ld(x0, sp, 0), ld(x1, sp, 8)])[..], [Step::LoadPair { .. }]));
    }

    #[test]
    fn multi_variants_have_names_symbols_and_parse_back() {
        for tier in [Tier::Args, Tier::Regs] {
            for n in 1..=Variant::MULTI_MAX {
                let v = Variant::multi(tier, n).unwrap();
                assert_eq!(Variant::parse(v.name()), Some(v));
                let t = if tier == Tier::Args { "args" } else { "regs" };
                assert_eq!(v.name(), format!("{t}-multi{n}"));
                let sym = if tier == Tier::Args { format!("ftrace_multi{n}_caller") } else { format!("ftrace_regs_multi{n}_caller") };
                assert_eq!(v.symbol(), sym);
            }
            assert_eq!(Variant::multi(tier, 0), None);
            assert_eq!(Variant::multi(tier, Variant::MULTI_MAX + 1), None);
        }
        for bad in ["args-multi0", "args-multi9", "args-multi", "args-multi02", "args-multi+2", "both-multi2", "args-multi2x"] {
            assert_eq!(Variant::parse(bad), None, "{bad}");
        }
        for v in Variant::ALL {
            assert_eq!(Variant::parse(v.name()), Some(v));
        }
    }

    #[test]
    fn tracer_words_keep_the_direct_names_at_index_zero() {
        assert_eq!(DataWord::DirectOp, DataWord::TracerOp(0));
        assert_eq!(DataWord::DirectFunc.symbol(), "ftrace_direct_func");
        assert_eq!(DataWord::TracerOp(0).symbol(), "ftrace_direct_op");
        assert_eq!(DataWord::TracerOp(3).symbol(), "ftrace_direct_op_3");
        assert_eq!(DataWord::TracerFunc(7).symbol(), "ftrace_direct_func_7");
        // The first five words are laid out as before multi dispatch.
        assert_eq!(
            DataWord::ALL[..5],
            [DataWord::FunctionTraceOp, DataWord::ListFunc, DataWord::ReturnHandler, DataWord::DirectOp, DataWord::DirectFunc]
        );
        let mut syms: Vec<_> = DataWord::ALL.iter().map(|w| w.symbol()).collect();
        syms.sort();
        syms.dedup();
        assert_eq!(syms.len(), DataWord::ALL.len(), "symbols are unique");
    }

    #[test]
    fn a_multi_trampoline_calls_each_pair_once_in_order_with_the_kept_ip() {
        for name in ["x86_64", "aarch64"] {
            let spec = Spec::builtin(name).unwrap();
            let layout = FrameLayout::new(&spec);
            for tier in [Tier::Args, Tier::Regs] {
                let v = Variant::multi(tier, 3).unwrap();
                let steps = steps(&spec, &layout, v);
                let calls: Vec<_> = steps.iter().filter_map(|s| if let Step::CallData { word, .. } = s { Some(*word) } else { None }).collect();
                assert_eq!(calls, [DataWord::TracerFunc(0), DataWord::TracerFunc(1), DataWord::TracerFunc(2)]);
                let ops: Vec<_> = steps.iter().filter_map(|s| if let Step::LoadData { word, .. } = s { Some(*word) } else { None }).collect();
                assert_eq!(ops, [DataWord::TracerOp(0), DataWord::TracerOp(1), DataWord::TracerOp(2)]);
                // The frame grows by the two kept words and stays aligned.
                assert_eq!(frame_size(&layout, v), layout.frame_size(tier) + 16);
                assert_eq!(steps[0], Step::AdjustSp { delta: -(frame_size(&layout, v) as i32) });
                // One tracer needs nothing kept: the same frame as direct.
                assert_eq!(
                    frame_size(&layout, Variant::multi(tier, 1).unwrap()),
                    frame_size(&layout, Variant::Entry { tier, dispatch: Dispatch::Direct })
                );
            }
        }
    }

    #[test]
    fn x86_args_frames_overlay_the_return_address_slots() {
        let spec = Spec::builtin("x86_64").unwrap();
        let layout = FrameLayout::new(&spec);
        let ip = layout.slot(SlotKind::Ip).unwrap().offset;
        assert_eq!(layout.stack_aliased_ip, Some(ip));
        let direct = Variant::Entry { tier: Tier::Args, dispatch: Dispatch::Direct };
        assert_eq!(frame_size(&layout, direct), ip, "fregs.ip is the site's return slot");
        // Nothing is copied into ip/return_address or written back.
        let st = steps(&spec, &layout, direct);
        let touches = |off: i32| st.iter().any(|s| matches!(s, Step::Store { off: o, .. } if *o == off));
        assert!(!touches(ip as i32) && !touches(ip as i32 + 8));
        // The regs tier and return_to_handler keep the full struct.
        assert_eq!(frame_size(&layout, Variant::Entry { tier: Tier::Regs, dispatch: Dispatch::Direct }), layout.frame_size(Tier::Regs));
        assert_eq!(frame_size(&layout, Variant::Return), layout.frame_size(Tier::Args));
        // Register-return arches never alias.
        assert_eq!(FrameLayout::new(&Spec::builtin("aarch64").unwrap()).stack_aliased_ip, None);
    }

    #[test]
    fn a_multi_trampoline_outside_one_to_eight_is_refused() {
        let spec = Spec::builtin("x86_64").unwrap();
        for n in [0, Variant::MULTI_MAX + 1] {
            let v = Variant::Entry { tier: Tier::Args, dispatch: Dispatch::Multi(n) };
            let err = crate::Image::generate(&spec, &[v]).unwrap_err();
            assert!(matches!(err, CodegenError::OutOfRange { value, .. } if value == n as i64), "{err}");
        }
    }

    fn st_at(reg: Reg, base: Reg, off: i32) -> Step {
        Step::Store { reg, base, off, note: Note::None }
    }

    #[test]
    fn runs_of_consecutive_registers_and_slots_merge_in_either_order() {
        let spec = Spec::builtin("aarch64").unwrap();
        let sp = Reg::special(31);
        let g = Reg::gpr;
        // Ascending stores r2..r4, then r9 (next slot, but not the next register).
        let out = group_runs(&spec, vec![st_at(g(2), sp, 16), st_at(g(3), sp, 24), st_at(g(4), sp, 32), st_at(g(9), sp, 40)]);
        assert!(matches!(out[..], [Step::StoreMulti { first, count: 3, off: 16, .. }, Step::Store { .. }] if first == g(2)), "{out:?}");
        // Descending loads (the restore half).
        let out = group_runs(&spec, vec![ld(g(4), sp, 32), ld(g(3), sp, 24), ld(g(2), sp, 16)]);
        assert!(matches!(out[..], [Step::LoadMulti { first, count: 3, off: 16, .. }] if first == g(2)), "{out:?}");
        // A gap in the slots, another base, or another class ends a run.
        assert_eq!(group_runs(&spec, vec![st_at(g(2), sp, 16), st_at(g(3), sp, 32)]).len(), 2);
        assert_eq!(group_runs(&spec, vec![st_at(g(2), sp, 16), st_at(g(3), g(5), 24)]).len(), 2);
        assert_eq!(group_runs(&spec, vec![st_at(g(0), sp, 0), st_at(Reg::vector(1), sp, 8)]).len(), 2);
        // A load run never loads its base register.
        assert_eq!(group_runs(&spec, vec![ld(g(2), g(3), 0), ld(g(3), g(3), 8)]).len(), 2);
        // Stores and loads never mix.
        assert_eq!(group_runs(&spec, vec![st_at(g(2), sp, 16), ld(g(3), sp, 24)]).len(), 2);
    }
}
