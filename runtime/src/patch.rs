//! Live patching: changing patch sites while other threads run them.
//!
//! [`Patcher::apply`] takes a batch of [`SiteChange`]s (address, the bytes
//! expected there, the bytes to write) and makes them with these
//! guarantees, whatever other threads are doing:
//!
//! * **No torn instruction, no torn site.**  Each architecture has its own
//!   write protocol (bytes before/after and the numbered write order at the
//!   top of its file):
//!   - x86_64 (`patch/x86_64.rs`): the breakpoint protocol of Linux's
//!     `text_poke_bp`.  `90 90 90 90 90` / `0f 1f 44 00 00` ↔
//!     `e8 <rel32>`: (1) `int3` on byte 0 of every site, sync; (2) bytes
//!     1..5, sync; (3) the new byte 0, sync.  A SIGTRAP handler emulates
//!     the new instruction for a thread that meets the `int3`.
//!   - aarch64 (`patch/aarch64.rs`): `nop ; nop` ↔ `mov x9, x30 ; bl`,
//!     aligned single-copy-atomic word stores: enable writes word 0 then
//!     word 1, disable word 1 then word 0; each step is flushed
//!     (`__clear_cache`) and the cores serialized.
//!
//!   Where the old form is several instructions (gcc's five `nop`s; the
//!   two NOP words being enabled) a thread may be stopped between them.
//!   After step 1 no thread can enter such a site any more; the patcher
//!   then *evacuates* the ones already inside (`patch/signal.rs`: a queued
//!   SIGTRAP makes each running or preempted thread check its pc and
//!   restart the site from its first byte) before writing the rest.
//! * **Execute permission is never removed.**  The pages of the whole
//!   batch get `PROT_WRITE` *added* once per run of adjacent pages
//!   (`patch/protect.rs`), and their original protection is restored once
//!   at the end by a guard — also when a step fails.  Threads running other
//!   code on those pages never fault.  W^X caveat: from that first
//!   `mprotect` to the restore, the batch's pages are writable and
//!   executable; nothing is left writable afterwards.
//! * **Only expected bytes are replaced.**  A site whose bytes are not
//!   `old` is refused ([`RuntimeError::UnexpectedSiteBytes`] in
//!   [`Report::refused`]) and nothing is written there; the rest of the
//!   batch goes ahead.  A change that cannot be made safely (unaligned,
//!   overlapping, not in private executable memory, a new form the
//!   breakpoint cannot emulate) fails the whole batch before any write.
//! * **Batches.**  All sites share one protection window and one set of
//!   syncs per step; the trap table holds [`ROUND`] sites, so a bigger
//!   batch runs several rounds inside the same window.
//!
//! One batch runs at a time (a process-wide lock, also taken by
//! [`write_text`]).  Limits: a thread stopped inside a multi-instruction
//! NOP run *and* running a signal handler on top of it is not evacuated
//! (its pc is in the handler's frame); threads that block SIGTRAP are
//! neither evacuated nor, on x86_64, able to survive an `int3`; a `fork`
//! during a batch leaves the child with the batch half done; CET shadow
//! stacks are not updated by the emulated `call`.  Other architectures
//! have no live protocol yet: [`Patcher::apply`] refuses, and
//! [`replace_text`] / [`replace_text_batch`] fall back to plain writes
//! that are only correct while no other thread runs the site.

use crate::{cache, RuntimeError};
use protect::{Maps, Writable};
use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering::*};
use std::sync::{Mutex, MutexGuard};

pub(crate) mod protect;

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod signal;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod table;

#[cfg(target_arch = "aarch64")]
mod aarch64;
#[cfg(target_arch = "aarch64")]
use aarch64 as arch;
#[cfg(target_arch = "x86_64")]
mod x86_64;
#[cfg(target_arch = "x86_64")]
use x86_64 as arch;

/// Architectures without a live patching protocol.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
mod arch {
    use crate::{RuntimeError, HOST_ARCH};

    pub(crate) type Plan = ();

    pub(crate) fn plan(addr: usize, _old: &[u8], _new: &[u8]) -> Result<Plan, RuntimeError> {
        Err(RuntimeError::BadPatch { addr, why: format!("no live patching protocol for {HOST_ARCH} yet") })
    }

    pub(crate) fn round(_sites: &[super::Site<'_>]) -> Result<usize, RuntimeError> {
        unreachable!("plan() refuses every site")
    }
}

/// Whether this architecture has a live patching protocol.
pub const LIVE_PATCHING: bool = cfg!(any(target_arch = "x86_64", target_arch = "aarch64"));

/// Sites per round of a batch.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub const ROUND: usize = table::ROUND;
/// Sites per round of a batch.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub const ROUND: usize = 256;

/// One site to change: `old` must be there, `new` (same length) replaces it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SiteChange {
    pub addr: usize,
    pub old: Vec<u8>,
    pub new: Vec<u8>,
}

impl SiteChange {
    pub fn new(addr: usize, old: impl Into<Vec<u8>>, new: impl Into<Vec<u8>>) -> SiteChange {
        SiteChange { addr, old: old.into(), new: new.into() }
    }
}

/// What one [`Patcher::apply`] did.
#[derive(Debug, Default)]
pub struct Report {
    /// Sites that now hold their `new` bytes (including those that
    /// already did: `old == new`).
    pub patched: usize,
    /// Sites not written because their bytes were not `old`
    /// ([`RuntimeError::UnexpectedSiteBytes`] with the bytes found).
    pub refused: Vec<RuntimeError>,
    /// `mprotect` calls of the batch (adding write, then restoring): two
    /// per run of adjacent pages, 0 if nothing was written.
    pub protection_changes: usize,
    /// Trap-table rounds (see [`ROUND`]).
    pub rounds: usize,
    /// Threads sent the evacuation signal.
    pub threads_signalled: usize,
}

impl Report {
    pub fn refused_count(&self) -> usize {
        self.refused.len()
    }
}

/// Process-wide patching counters (see [`Patcher::stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub batches: usize,
    pub sites_patched: usize,
    pub sites_refused: usize,
    pub protection_changes: usize,
    /// x86_64: threads that met our `int3` and had the new instruction
    /// emulated.
    pub traps_emulated: usize,
    /// x86_64: threads whose handler ran after the `int3` was gone and
    /// that re-executed the site.
    pub traps_restarted: usize,
    pub evacuations: usize,
    pub threads_signalled: usize,
    /// Threads found stopped inside a site and sent back to its start.
    pub threads_moved: usize,
    /// Threads not evacuated because they kept SIGTRAP blocked.
    pub threads_blocking: usize,
}

pub(crate) struct Counters {
    pub batches: AtomicUsize,
    pub sites_patched: AtomicUsize,
    pub sites_refused: AtomicUsize,
    pub traps_emulated: AtomicUsize,
    pub traps_restarted: AtomicUsize,
    pub evacuations: AtomicUsize,
    pub threads_signalled: AtomicUsize,
    pub threads_moved: AtomicUsize,
    pub threads_blocking: AtomicUsize,
}

pub(crate) static STATS: Counters = Counters {
    batches: AtomicUsize::new(0),
    sites_patched: AtomicUsize::new(0),
    sites_refused: AtomicUsize::new(0),
    traps_emulated: AtomicUsize::new(0),
    traps_restarted: AtomicUsize::new(0),
    evacuations: AtomicUsize::new(0),
    threads_signalled: AtomicUsize::new(0),
    threads_moved: AtomicUsize::new(0),
    threads_blocking: AtomicUsize::new(0),
};

/// A validated change, as an arch round sees it.
pub(crate) struct Site<'a> {
    pub addr: usize,
    pub old: &'a [u8],
    pub new: &'a [u8],
    #[cfg_attr(not(any(target_arch = "x86_64", target_arch = "aarch64")), allow(dead_code))]
    pub plan: arch::Plan,
}

static LOCK: Mutex<()> = Mutex::new(());

fn lock() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Stores one byte of code.
pub(crate) fn store_byte(addr: usize, b: u8) {
    // SAFETY: callers pass a byte of a validated range whose pages they
    // made writable (a `Writable` guard is open).
    unsafe { (*(addr as *const AtomicU8)).store(b, Release) };
}

/// Makes the sites' new bytes visible to every core: flush each range,
/// then serialize the cores once.
#[cfg_attr(not(any(target_arch = "x86_64", target_arch = "aarch64")), allow(dead_code))]
pub(crate) fn sync(sites: &[Site<'_>]) {
    for s in sites {
        cache::flush_icache(s.addr, s.new.len());
    }
    cache::sync_cores();
}

/// The process's patcher: one batch at a time.
pub struct Patcher;

impl Patcher {
    /// Applies a batch of site changes safely while other threads run
    /// them (see the module documentation).  `Err` means nothing was
    /// written, except when a round fails after earlier rounds of a batch
    /// larger than [`ROUND`] sites: every site then holds its old or its
    /// new bytes, never a mix.
    pub fn apply(changes: &[SiteChange]) -> Result<Report, RuntimeError> {
        let _lock = lock();
        let mut report = Report::default();
        STATS.batches.fetch_add(1, Relaxed);
        let mut order: Vec<&SiteChange> = changes.iter().collect();
        order.sort_by_key(|c| c.addr);
        for c in &order {
            if c.old.len() != c.new.len() || c.new.is_empty() {
                return Err(RuntimeError::BadPatch { addr: c.addr, why: format!("old ({} bytes) and new ({} bytes) differ in length or are empty", c.old.len(), c.new.len()) });
            }
        }
        for w in order.windows(2) {
            if w[0].addr + w[0].new.len() > w[1].addr {
                return Err(RuntimeError::BadPatch { addr: w[1].addr, why: format!("overlaps the change at {:#x}", w[0].addr) });
            }
        }
        if order.is_empty() {
            return Ok(report);
        }
        let maps = Maps::read()?;
        let mut todo = Vec::new();
        for c in &order {
            maps.check(c.addr, c.new.len(), true)?;
            todo.push(Site { addr: c.addr, old: &c.old, new: &c.new, plan: arch::plan(c.addr, &c.old, &c.new)? });
        }
        todo.retain(|s| {
            let found = read_text(s.addr, s.old.len());
            if found != s.old {
                report.refused.push(RuntimeError::UnexpectedSiteBytes { addr: s.addr, found });
                false
            } else if s.old == s.new {
                report.patched += 1;
                false
            } else {
                true
            }
        });
        STATS.sites_refused.fetch_add(report.refused.len(), Relaxed);
        if todo.is_empty() {
            STATS.sites_patched.fetch_add(report.patched, Relaxed);
            return Ok(report);
        }
        #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
        signal::install()?;
        let guard = Writable::open(&maps, todo.iter().map(|s| (s.addr, s.new.len())))?;
        let mut result = Ok(());
        for chunk in todo.chunks(ROUND) {
            match arch::round(chunk) {
                Ok(signalled) => {
                    report.rounds += 1;
                    report.threads_signalled += signalled;
                    report.patched += chunk.len();
                }
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        STATS.sites_patched.fetch_add(report.patched, Relaxed);
        let calls = guard.close();
        result?;
        report.protection_changes = calls?;
        Ok(report)
    }

    /// The process-wide counters.
    pub fn stats() -> Stats {
        Stats {
            batches: STATS.batches.load(Relaxed),
            sites_patched: STATS.sites_patched.load(Relaxed),
            sites_refused: STATS.sites_refused.load(Relaxed),
            protection_changes: protect::MPROTECT_CALLS.load(Relaxed),
            traps_emulated: STATS.traps_emulated.load(Relaxed),
            traps_restarted: STATS.traps_restarted.load(Relaxed),
            evacuations: STATS.evacuations.load(Relaxed),
            threads_signalled: STATS.threads_signalled.load(Relaxed),
            threads_moved: STATS.threads_moved.load(Relaxed),
            threads_blocking: STATS.threads_blocking.load(Relaxed),
        }
    }
}

/// Has `f` called, instead of the default action, for a SIGTRAP that is
/// not the patcher's (a program's own `int3`, `raise(SIGTRAP)`) when no
/// handler was installed before the patcher's: an embedder that writes
/// its state before the process dies (the recorder) does so and then ends
/// the process by the signal itself.  `f` runs in the SIGTRAP handler, so
/// it must be async-signal-safe.  False where the patcher has no SIGTRAP
/// handler (the arches without a live protocol): SIGTRAP is the
/// embedder's to handle there.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub fn on_foreign_sigtrap(f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void)) -> bool {
    crate::grace::on_foreign_signal(f);
    true
}

/// A program's request to set SIGTRAP's action (`act`, if any; the one it
/// had goes to `old`) while the patcher's handler is installed: the action
/// is kept as the one foreign SIGTRAPs are passed to, and the patcher's
/// handler stays (a program's `signal(SIGTRAP, …)` replaced it until the
/// twenty-eighth session, and the next patch's evacuation signals then
/// went to the program's handler or killed it).  For an embedder that
/// interposes `sigaction` (the recorder).  False, with nothing done, where
/// the handler is not installed (not yet, or not on this arch): the
/// request is then the caller's to pass on.  The mask of `act` is not
/// kept (`old` gets an empty one).  Async-signal-safe.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub fn program_sigtrap_action(act: Option<&libc::sigaction>, old: Option<&mut libc::sigaction>) -> bool {
    let Some((handler, flags)) = signal::set_previous(act.map(|a| (a.sa_sigaction, a.sa_flags))) else { return false };
    if let Some(old) = old {
        // SAFETY: sigaction is plain data; all-zero is a valid value.
        *old = unsafe { std::mem::zeroed() };
        old.sa_sigaction = handler;
        old.sa_flags = flags;
    }
    true
}

/// See the live-protocol arches' version: no handler to keep.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub fn program_sigtrap_action(_act: Option<&libc::sigaction>, _old: Option<&mut libc::sigaction>) -> bool {
    false
}

/// See the live-protocol arches' version: nothing to hand over here.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub fn on_foreign_sigtrap(_f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void)) -> bool {
    false
}

/// Replaces `expect` by `new` at the site `addr` (same length): one
/// [`Patcher::apply`].  Fails without writing if the bytes there are not
/// `expect`.  Without a live protocol for this arch, a plain checked write
/// (correct only while no other thread runs the site).
pub fn replace_text(addr: usize, expect: &[u8], new: &[u8]) -> Result<(), RuntimeError> {
    assert_eq!(expect.len(), new.len(), "replace_text: lengths differ");
    if !LIVE_PATCHING {
        let bad = write_stopped(&[TextEdit { addr, expect, new }])?;
        return match bad.first() {
            Some(_) => Err(RuntimeError::UnexpectedSiteBytes { addr, found: read_text(addr, expect.len()) }),
            None => Ok(()),
        };
    }
    let report = Patcher::apply(&[SiteChange::new(addr, expect, new)])?;
    report.refused.into_iter().next().map_or(Ok(()), Err)
}

/// One replacement of [`replace_text_batch`].
#[derive(Debug, Clone, Copy)]
pub struct TextEdit<'a> {
    pub addr: usize,
    pub expect: &'a [u8],
    pub new: &'a [u8],
}

/// Applies many [`replace_text`] replacements as one batch (one
/// protection change per run of adjacent pages).  Edits whose bytes are
/// not `expect` are not written; their addresses are returned.  Live-safe
/// where [`Patcher::apply`] is (x86_64, aarch64); elsewhere plain writes,
/// correct only while no other thread runs the edited sites.
pub fn replace_text_batch(edits: &[TextEdit<'_>]) -> Result<Vec<usize>, RuntimeError> {
    if !LIVE_PATCHING {
        return write_stopped(edits);
    }
    let changes: Vec<SiteChange> = edits.iter().map(|e| SiteChange::new(e.addr, e.expect, e.new)).collect();
    let report = Patcher::apply(&changes)?;
    let mut bad: Vec<usize> = report
        .refused
        .iter()
        .filter_map(|e| match e {
            RuntimeError::UnexpectedSiteBytes { addr, .. } => Some(*addr),
            _ => None,
        })
        .collect();
    bad.sort_unstable();
    Ok(bad)
}

/// The checked plain write for arches without a live protocol.
fn write_stopped(edits: &[TextEdit<'_>]) -> Result<Vec<usize>, RuntimeError> {
    let _lock = lock();
    let maps = Maps::read()?;
    for e in edits {
        assert_eq!(e.expect.len(), e.new.len(), "replace_text_batch: lengths differ");
        maps.check(e.addr, e.new.len(), false)?;
    }
    let (ok, bad): (Vec<&TextEdit<'_>>, Vec<&TextEdit<'_>>) = edits.iter().partition(|e| read_text(e.addr, e.expect.len()) == e.expect);
    if !ok.is_empty() {
        let guard = Writable::open(&maps, ok.iter().map(|e| (e.addr, e.new.len())))?;
        for e in &ok {
            for (i, b) in e.new.iter().enumerate() {
                store_byte(e.addr + i, *b);
            }
            cache::flush_icache(e.addr, e.new.len());
        }
        guard.close()?;
        cache::sync_cores();
    }
    Ok(bad.iter().map(|e| e.addr).collect())
}

/// Stores `new` at `addr` in a code page (e.g. the ops word before a
/// `callsite` function), under the patcher's lock with the same page
/// protection guard.  One atomic store when `new` is 1, 2, 4 or 8 bytes at
/// an address aligned to its size (so a thread reading it sees the old or
/// the new value); otherwise byte by byte.
pub fn write_text(addr: usize, new: &[u8]) -> Result<(), RuntimeError> {
    let _lock = lock();
    let maps = Maps::read()?;
    maps.check(addr, new.len(), false)?;
    let guard = Writable::open(&maps, [(addr, new.len())])?;
    let aligned = |n: usize| new.len() == n && addr & (n - 1) == 0;
    if aligned(8) {
        // SAFETY: [addr, addr+8) is mapped, private and now writable (the
        // guard), and `addr` is 8-byte aligned.
        unsafe { (*(addr as *const AtomicU64)).store(u64::from_ne_bytes(new.try_into().unwrap()), Release) };
    } else if aligned(4) {
        // SAFETY: as above, 4 bytes, 4-byte aligned.
        unsafe { (*(addr as *const AtomicU32)).store(u32::from_ne_bytes(new.try_into().unwrap()), Release) };
    } else if aligned(2) {
        // SAFETY: as above, 2 bytes, 2-byte aligned.
        unsafe { (*(addr as *const AtomicU16)).store(u16::from_ne_bytes(new.try_into().unwrap()), Release) };
    } else {
        for (i, b) in new.iter().enumerate() {
            store_byte(addr + i, *b);
        }
    }
    guard.close()?;
    cache::flush_icache(addr, new.len());
    cache::sync_cores();
    Ok(())
}

/// Reads `len` bytes of code at `addr` (which must be mapped and
/// readable: a discovered site or a trampoline).
pub fn read_text(addr: usize, len: usize) -> Vec<u8> {
    // SAFETY: callers pass readable code; byte-wise atomic loads, because
    // the patcher may be writing these bytes from another thread.
    (0..len).map(|i| unsafe { (*((addr + i) as *const AtomicU8)).load(Acquire) }).collect()
}
