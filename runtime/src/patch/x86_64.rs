//! x86_64: the breakpoint protocol (as Linux's `text_poke_bp`).
//!
//! Instructions are 1–15 bytes and instruction fetch may see a partly
//! written 5-byte change, so a site never goes directly from old to new:
//!
//! ```text
//!   bytes         NOPs (gcc)        NOP (clang, or rewritten)   enabled
//!   site+0..5     90 90 90 90 90    0f 1f 44 00 00              e8 <rel32 = target - (site+5)>
//!
//!   0. publish the round's sites (table.rs)           new action per site
//!   1. byte 0 := cc (int3) at every site ; flush ; sync_cores
//!   1b. if an old form is several instructions: evacuate threads stopped
//!       inside one back to its byte 0 (signal.rs)
//!   2. bytes 1..len := new[1..] (only if any differ) ; flush ; sync_cores
//!   3. byte 0 := new[0] — the final store, one byte, atomic ; flush ; sync_cores
//!   4. mark the round done
//! ```
//!
//! Between 1 and 3 a thread reaching a site executes `int3`; the SIGTRAP
//! handler ([`fixup`]) finds the site in the round table and emulates the
//! *new* instruction: `call` pushes `site+5` on the interrupted stack and
//! continues at the target; `jmp` continues at the target; a NOP form
//! continues at `site+len`.  A handler that runs after step 3 (the thread
//! was descheduled between trap and handler) finds no `int3` any more and
//! restarts the site.  `flush_icache` is a no-op here (fetch is coherent
//! with stores); `sync_cores` (membarrier SYNC_CORE) serializes every core
//! running the process, as the kernel's `text_poke_sync` does.

use super::table::{self, Action, Entry};
use super::{signal, sync, store_byte, Site, STATS};
use crate::{host_spec, RuntimeError};
use std::sync::atomic::{AtomicU8, Ordering::*};

const INT3: u8 = 0xcc;
const CALL: u8 = 0xe8;
const JMP: u8 = 0xe9;
/// `nopl 0x0(%rax,%rax,1)`: the 5-byte NOP.
const NOPL5: [u8; 5] = [0x0f, 0x1f, 0x44, 0x00, 0x00];

/// How one site changes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plan {
    action: Action,
    /// The old form is not a single instruction.
    evacuate: bool,
}

/// Checks that the change can be made live: the new form must be one we
/// can emulate from the breakpoint.
pub(crate) fn plan(addr: usize, old: &[u8], new: &[u8]) -> Result<Plan, RuntimeError> {
    let rel = |b: &[u8]| i32::from_le_bytes([b[1], b[2], b[3], b[4]]) as isize;
    let action = match new {
        [CALL, ..] if new.len() == 5 => Action::Call((addr + 5).wrapping_add_signed(rel(new))),
        [JMP, ..] if new.len() == 5 => Action::Jump((addr + 5).wrapping_add_signed(rel(new))),
        _ if host_spec().nops.iter().any(|n| n[..] == *new) || new == NOPL5 => Action::Skip,
        _ => {
            return Err(RuntimeError::BadPatch {
                addr,
                why: format!("x86_64: new bytes {new:02x?} are neither `call rel32`, `jmp rel32` nor a NOP form of the spec"),
            })
        }
    };
    let single = old.len() == 5 && (old[0] == CALL || old[0] == JMP || old == NOPL5);
    Ok(Plan { action, evacuate: !single })
}

/// One round of at most [`table::ROUND`] sites (sorted, writable).
pub(crate) fn round(sites: &[Site<'_>]) -> Result<usize, RuntimeError> {
    let entries: Vec<Entry> = sites.iter().map(|s| Entry { addr: s.addr, len: s.new.len(), action: s.plan.action, evacuate: s.plan.evacuate }).collect();
    table::publish(&entries);
    // 1. int3 on every first byte.
    for s in sites {
        store_byte(s.addr, INT3);
    }
    sync(sites);
    // 1b. No thread may stay inside an old multi-instruction form.
    let mut signalled = 0;
    if sites.iter().any(|s| s.plan.evacuate) {
        match signal::evacuate() {
            Ok(n) => signalled = n,
            Err(e) => {
                // Undo step 1: the sites hold their old bytes again.
                for s in sites {
                    store_byte(s.addr, s.old[0]);
                }
                sync(sites);
                table::finish();
                return Err(e);
            }
        }
    }
    // 2. The tail bytes, behind the int3.
    if sites.iter().any(|s| s.old[1..] != s.new[1..]) {
        for s in sites {
            for i in 1..s.new.len() {
                if s.old[i] != s.new[i] {
                    store_byte(s.addr + i, s.new[i]);
                }
            }
        }
        sync(sites);
    }
    // 3. The new first byte: the site is whole again.
    for s in sites {
        store_byte(s.addr, s.new[0]);
    }
    sync(sites);
    table::finish();
    Ok(signalled)
}

/// The SIGTRAP fix-up.  Returns true if the trap was our breakpoint.
/// `may_restart`: the signal is a trap or our own evacuation signal, so a
/// pc just after a breakpoint we have since removed may be restarted.
///
/// # Safety
///
/// Called from the signal handler with the interrupted context.
pub(crate) unsafe fn fixup(uc: &mut libc::ucontext_t, may_restart: bool) -> bool {
    let g = &mut uc.uc_mcontext.gregs;
    let rip = g[libc::REG_RIP as usize] as usize;
    let at = rip.wrapping_sub(1);
    let (entry, byte, interior) = table::read(|t| {
        let entry = t.find(at);
        let byte = if entry.is_some() || table::known::contains(at) {
            // SAFETY: `at` is a site we patched (in the table or the
            // registry): mapped code, readable.
            Some(unsafe { (*(at as *const AtomicU8)).load(Acquire) })
        } else {
            None
        };
        (entry, byte, t.interior(rip))
    });
    match (entry, byte, interior) {
        (Some(e), Some(INT3), _) => {
            match e.action {
                Action::Skip => g[libc::REG_RIP as usize] = (e.addr + e.len) as i64,
                Action::Jump(t) => g[libc::REG_RIP as usize] = t as i64,
                Action::Call(t) => {
                    let sp = (g[libc::REG_RSP as usize] as usize) - 8;
                    // SAFETY: as the `call` would, store the return address
                    // just below the interrupted sp; the kernel put our
                    // signal frame below the red zone (or on the altstack).
                    unsafe { (sp as *mut usize).write(e.addr + e.len) };
                    g[libc::REG_RSP as usize] = sp as i64;
                    g[libc::REG_RIP as usize] = t as i64;
                }
            }
            STATS.traps_emulated.fetch_add(1, Relaxed);
            true
        }
        (_, Some(b), _) if b != INT3 && may_restart => {
            g[libc::REG_RIP as usize] = at as i64;
            STATS.traps_restarted.fetch_add(1, Relaxed);
            true
        }
        (_, _, Some(e)) => {
            g[libc::REG_RIP as usize] = e.addr as i64;
            STATS.threads_moved.fetch_add(1, Relaxed);
            false
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans() {
        let site = 0x1000;
        let p = plan(site, &[0x90; 5], &[CALL, 0xfb, 0x0f, 0, 0]).unwrap();
        assert_eq!(p.action, Action::Call(0x2000));
        assert!(p.evacuate, "five nops are five instructions");
        let p = plan(site, &NOPL5, &[JMP, 0xf6, 0xff, 0xff, 0xff]).unwrap();
        assert_eq!(p.action, Action::Jump(site - 5));
        assert!(!p.evacuate);
        let p = plan(site, &[CALL, 0, 0, 0, 0], &[0x90; 5]).unwrap();
        assert_eq!((p.action, p.evacuate), (Action::Skip, false));
        assert!(matches!(plan(site, &NOPL5, &[0xc3, 0x90, 0x90, 0x90, 0x90]), Err(RuntimeError::BadPatch { .. })));
    }
}
