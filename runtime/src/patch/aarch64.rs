//! aarch64: aligned word stores, ordered so every mix is harmless.
//!
//! A site is two 4-byte instructions; an aligned 32-bit store is
//! single-copy atomic, so a thread fetches either the old or the new word,
//! never a torn one.  What can mix is the *pair*: a thread may run one
//! word of the old form and the other of the new.  The write order makes
//! every such mix harmless:
//!
//! ```text
//!   word          disabled                  enabled
//!   site+0        d503201f  nop             aa1e03e9  mov x9, x30
//!   site+4        d503201f  nop             94xxxxxx  bl  target   (imm26 = (target - (site+4)) / 4)
//!
//!   enable (both words change):
//!   0. publish the round's sites (for evacuation)
//!   1. word 0 := mov x9, x30 ; flush_icache ; sync_cores
//!   1b. evacuate: a thread that ran the old NOP at +0 and stopped at +4
//!       is sent back to +0 (it would otherwise `bl` with a stale x9)
//!   2. word 1 := bl — the final atomic store ; flush_icache ; sync_cores
//!
//!   disable (the new word 1 is a NOP):
//!   1. word 1 := nop ; flush_icache ; sync_cores      (a thread between
//!      the words now runs `mov x9, x30 ; nop`: x9 is a scratch register)
//!   2. word 0 := nop — the final atomic store ; flush_icache ; sync_cores
//!
//!   one word changes (retarget `bl`, or `mov x9, x30 ; nop` ↔ enabled):
//!   1. that word := new — one atomic store ; flush_icache ; sync_cores
//! ```
//!
//! `flush_icache` is libgcc's `__clear_cache` (DC CVAU, DSB ISH, IC IVAU,
//! DSB ISH, ISB); `sync_cores` (membarrier SYNC_CORE) makes every core
//! running the process execute a context synchronization event, so no core
//! keeps the old word in its pipeline.  Caveat: NOP↔BL are in the ARM ARM's
//! list of instructions that may be modified while another core executes
//! them (B2.2.5, "concurrent modification and execution"); `mov` (ORR) is
//! not, so the word-0 write is architecturally safe only when no thread
//! runs that word at that moment.  Keeping `mov x9, x30 ; nop` as the
//! disabled form after the first enable (as Linux's `ftrace_init_nop` does
//! at load time) makes every later change a single `nop`↔`bl` store.

use super::table::{self, Action, Entry};
use super::{signal, sync, Site, STATS};
use crate::{host_spec, RuntimeError};
use std::sync::atomic::{AtomicU32, Ordering::*};

/// How one site changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plan {
    /// One word changes (index).
    One(usize),
    /// Both change, word 0 first (with an evacuation before word 1).
    Enable,
    /// Both change, word 1 first (its new value is a NOP).
    Disable,
}

fn word(b: &[u8], i: usize) -> u32 {
    u32::from_ne_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
}

fn is_nop_word(b: &[u8], i: usize) -> bool {
    host_spec().nops.iter().any(|n| n.chunks(4).any(|c| c == &b[4 * i..4 * i + 4]))
}

pub(crate) fn plan(addr: usize, old: &[u8], new: &[u8]) -> Result<Plan, RuntimeError> {
    let bad = |why: &str| Err(RuntimeError::BadPatch { addr, why: format!("aarch64: {why}") });
    if addr & 3 != 0 {
        return bad("site not 4-byte aligned");
    }
    if new.len() != 4 && new.len() != 8 {
        return bad("a site is one or two instruction words");
    }
    let changed: Vec<usize> = (0..new.len() / 4).filter(|&i| word(old, i) != word(new, i)).collect();
    Ok(match changed[..] {
        [] => Plan::One(0),
        [i] => Plan::One(i),
        _ if is_nop_word(new, 1) => Plan::Disable,
        _ => Plan::Enable,
    })
}

fn store_word(addr: usize, w: u32) {
    // SAFETY: `addr` is a 4-byte aligned word of a validated site whose
    // pages the caller made writable (see `patch::apply`).
    unsafe { (*(addr as *const AtomicU32)).store(w, Release) };
}

/// One round of at most [`table::ROUND`] sites (sorted, writable).
pub(crate) fn round(sites: &[Site<'_>]) -> Result<usize, RuntimeError> {
    let entries: Vec<Entry> = sites.iter().map(|s| Entry { addr: s.addr, len: s.new.len(), action: Action::Skip, evacuate: s.plan == Plan::Enable }).collect();
    table::publish(&entries);
    let first = |s: &Site<'_>| match s.plan {
        Plan::Enable => Some(0),
        Plan::Disable => Some(1),
        Plan::One(_) => None,
    };
    // 1. The first word of every two-word change.
    let two: Vec<&Site<'_>> = sites.iter().filter(|s| first(s).is_some()).collect();
    for s in &two {
        let i = first(s).unwrap();
        store_word(s.addr + 4 * i, word(s.new, i));
    }
    if !two.is_empty() {
        sync(sites);
    }
    // 1b. Nobody may run the new `bl` after the old word 0.
    let mut signalled = 0;
    if sites.iter().any(|s| s.plan == Plan::Enable) {
        match signal::evacuate() {
            Ok(n) => signalled = n,
            Err(e) => {
                for s in &two {
                    let i = first(s).unwrap();
                    store_word(s.addr + 4 * i, word(s.old, i));
                }
                sync(sites);
                table::finish();
                return Err(e);
            }
        }
    }
    // 2. The remaining word of every site: the final atomic store.
    for s in sites {
        let i = match s.plan {
            Plan::One(i) => i,
            Plan::Enable => 1,
            Plan::Disable => 0,
        };
        store_word(s.addr + 4 * i, word(s.new, i));
    }
    sync(sites);
    table::finish();
    Ok(signalled)
}

/// The evacuation fix-up: a thread stopped between the words of a site
/// being enabled restarts at its first word.  Never a breakpoint here.
///
/// # Safety
///
/// Called from the signal handler with the interrupted context.
pub(crate) unsafe fn fixup(uc: &mut libc::ucontext_t, _may_restart: bool) -> bool {
    let pc = uc.uc_mcontext.pc as usize;
    if let Some(e) = table::read(|t| t.interior(pc)) {
        uc.uc_mcontext.pc = e.addr as u64;
        STATS.threads_moved.fetch_add(1, Relaxed);
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOP2: [u8; 8] = [0x1f, 0x20, 0x03, 0xd5, 0x1f, 0x20, 0x03, 0xd5];
    const ON: [u8; 8] = [0xe9, 0x03, 0x1e, 0xaa, 0x00, 0x00, 0x00, 0x94];
    const HALF: [u8; 8] = [0xe9, 0x03, 0x1e, 0xaa, 0x1f, 0x20, 0x03, 0xd5];

    #[test]
    fn plans() {
        assert_eq!(plan(0x1000, &NOP2, &ON).unwrap(), Plan::Enable);
        assert_eq!(plan(0x1000, &ON, &NOP2).unwrap(), Plan::Disable);
        assert_eq!(plan(0x1000, &HALF, &ON).unwrap(), Plan::One(1));
        assert_eq!(plan(0x1000, &ON, &HALF).unwrap(), Plan::One(1));
        let mut other = ON;
        other[4] = 1;
        assert_eq!(plan(0x1000, &ON, &other).unwrap(), Plan::One(1));
        assert!(plan(0x1002, &NOP2, &ON).is_err());
    }
}
