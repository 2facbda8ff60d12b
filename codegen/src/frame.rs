//! The one definition of `struct ftrace_regs` and `struct pt_regs` per arch.
//!
//! Offsets are computed here, from the spec's slot lists, and nowhere else:
//! the trampoline generator stores and loads through [`FrameLayout`], the C
//! header prints it, and the runtime's `FtraceRegs` accessors read the same
//! offsets.  `struct pt_regs` *begins with* `struct ftrace_regs`, so the
//! argument accessors work for both register tiers and a `regs`-tier
//! callback may view its `ftrace_regs` as a `pt_regs` (Linux's
//! `ftrace_get_regs`).
//!
//! ```text
//!   trampoline frame (sp after the trampoline's own adjustment)
//!   +--------------------+ sp + frame_size   (trampoline entry sp)
//!   | padding            |
//!   +--------------------+ sp + call_reserve + pt_regs_size
//!   | pt_regs extra      |   regs tier only
//!   +--------------------+ sp + call_reserve + fregs_size
//!   | struct ftrace_regs |   fregs pointer passed to the callback
//!   +--------------------+ sp + call_reserve
//!   | call_reserve       |   area the ABI lets a callee use (s390x, ppc64)
//!   +--------------------+ sp
//! ```
//!
//! The frame sizes are multiples of 16, so `struct ftrace_regs` has the
//! alignment of the stack pointer the trampoline was entered with, and no
//! more: [`FrameLayout::fregs_align`].  That is 16 bytes where the ABI keeps
//! sp 16-byte aligned at every call and the compilers follow it (aarch64,
//! riscv64, ppc64le), but 8 on s390x (the ABI keeps 8) and on x86_64, where
//! gcc's `-fipa-stack-alignment` enters a same-file function on a stack
//! that is 16-byte aligned, not 8 mod 16.  On x86_64 the `args` tier could
//! not move its struct anyway: `ip` and `return_address` *are* the stack's
//! return-address slots (`stack_aliased_ip`), so the struct sits where the
//! entry sp puts it.  Aligning it would mean copying those two words in and
//! out behind a test of sp on every call (more than the 5 instructions that
//! realigning only the callbacks' stack costs, `trampoline.realign_sp`), so
//! the header declares the alignment that holds instead of 16, and vector
//! members must be read with unaligned loads there.

use crate::spec::{Location, SlotKind, Spec};

/// One member of the frame structs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    pub kind: SlotKind,
    /// Offset from the start of `struct ftrace_regs`.
    pub offset: u32,
    pub size: u32,
}

/// Register tier: how much of the machine state a trampoline saves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tier {
    /// `struct ftrace_regs`: arguments, return registers, sp, fp, ip,
    /// return address.
    Args,
    /// `struct pt_regs`: every general-purpose register plus flags.
    Regs,
}

/// Offsets of `struct ftrace_regs` and `struct pt_regs` for one arch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameLayout {
    /// `ftrace_regs` slots, then the `pt_regs` extension.
    pub slots: Vec<Slot>,
    /// How many of `slots` belong to `struct ftrace_regs`.
    pub fregs_count: usize,
    /// `sizeof(struct ftrace_regs)`, a multiple of 16.
    pub fregs_size: u32,
    /// `sizeof(struct pt_regs)`, a multiple of 16.
    pub pt_regs_size: u32,
    /// Bytes below the structs for the callee (spec `abi.call_reserve`).
    pub call_reserve: u32,
    pub stack_alignment: u32,
    /// Where the stack's own return-address slots can *be* the `ip` and
    /// `return_address` members (x86_64): `Some(offset of ip)` when the
    /// site's `call` leaves the site return address on the stack with the
    /// traced function's return address just above it, and the spec ends
    /// `struct ftrace_regs` with `ip, return_address` at an aligned offset.
    /// An `args`-tier trampoline then allocates only the struct up to `ip`,
    /// so the two members overlay the two stack slots: nothing is copied in
    /// or written back, and a tracer's change lands where `ret` reads it.
    pub stack_aliased_ip: Option<u32>,
    /// The alignment every trampoline guarantees for the `fregs` pointer
    /// (see the module docs): the stack alignment the traced function was
    /// entered with, 8 where that may be off by 8 (`trampoline.realign_sp`),
    /// at most 16.  The C header declares the structs with exactly this.
    pub fregs_align: u32,
}

fn align(n: u32, a: u32) -> u32 {
    n.div_ceil(a) * a
}

impl FrameLayout {
    /// Lays the slots out in order, each aligned to its size.
    pub fn new(spec: &Spec) -> FrameLayout {
        let mut slots = Vec::new();
        let mut off = 0u32;
        let size_of = |k: &SlotKind| match k {
            SlotKind::Reg(r) => spec.reg_bytes(r.class),
            _ => 8,
        };
        for k in &spec.ftrace_regs {
            let size = size_of(k);
            off = align(off, size);
            slots.push(Slot { kind: *k, offset: off, size });
            off += size;
        }
        let fregs_size = align(off, 16);
        off = fregs_size;
        for k in &spec.pt_regs {
            let size = size_of(k);
            off = align(off, size);
            slots.push(Slot { kind: *k, offset: off, size });
            off += size;
        }
        let pt_regs_size = align(off, 16);
        let fregs = &slots[..spec.ftrace_regs.len()];
        let stack_aliased_ip = match (spec.site_return, spec.parent, fregs) {
            (Location::Stack(0), Location::Stack(8), [.., ip, ra])
                if spec.call_reserve == 0
                    && ip.kind == SlotKind::Ip
                    && ra.kind == SlotKind::ReturnAddress
                    && ra.offset == ip.offset + 8
                    && ip.offset % spec.stack_alignment.max(16) == 0 =>
            {
                Some(ip.offset)
            }
            _ => None,
        };
        let fregs_align = if spec.raw.trampoline.realign_sp { 8 } else { spec.stack_alignment.min(16) };
        FrameLayout {
            stack_aliased_ip,
            fregs_align,
            slots,
            fregs_count: spec.ftrace_regs.len(),
            fregs_size,
            pt_regs_size,
            call_reserve: spec.call_reserve,
            stack_alignment: spec.stack_alignment,
        }
    }

    /// The slots a tier saves.
    pub fn tier_slots(&self, tier: Tier) -> &[Slot] {
        match tier {
            Tier::Args => &self.slots[..self.fregs_count],
            Tier::Regs => &self.slots,
        }
    }

    /// The `struct ftrace_regs` slots only.
    pub fn fregs_slots(&self) -> &[Slot] {
        &self.slots[..self.fregs_count]
    }

    /// The slot holding `kind`, if any.
    pub fn slot(&self, kind: SlotKind) -> Option<Slot> {
        self.slots.iter().copied().find(|s| s.kind == kind)
    }

    /// Size of the struct a tier fills.
    pub fn tier_size(&self, tier: Tier) -> u32 {
        match tier {
            Tier::Args => self.fregs_size,
            Tier::Regs => self.pt_regs_size,
        }
    }

    /// Total stack the trampoline allocates for `tier`: the struct plus the
    /// callee area, rounded to the stack alignment (the trampoline is
    /// entered with an aligned stack on every supported arch).
    pub fn frame_size(&self, tier: Tier) -> u32 {
        align(self.call_reserve + self.tier_size(tier), self.stack_alignment.max(16))
    }

    /// Offset of `struct ftrace_regs` from the trampoline's stack pointer.
    pub fn fregs_base(&self) -> u32 {
        self.call_reserve
    }

    /// Whether any slot overlaps another (used by the consistency tests).
    pub fn overlaps(&self) -> Option<(Slot, Slot)> {
        for (i, a) in self.slots.iter().enumerate() {
            for b in &self.slots[i + 1..] {
                if a.offset < b.offset + b.size && b.offset < a.offset + a.size {
                    return Some((*a, *b));
                }
            }
        }
        None
    }

    /// True when a vector slot is aligned to its width.
    pub fn aligned(&self) -> bool {
        self.slots.iter().all(|s| s.offset % s.size == 0)
    }
}
