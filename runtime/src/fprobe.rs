//! `fprobe`: function entry/exit probes, the user-space `kernel/trace/fprobe.c`.
//!
//! An [`Fprobe`] has an entry handler (which may ask to skip the exit), an
//! exit handler, and up to [`ENTRY_DATA_MAX`] bytes of per-call entry data
//! handed from the one to the other.  It is registered on functions named
//! by globs (a filter and a notfilter, [`register_fprobe`]), by addresses
//! ([`register_fprobe_ips`]) or by symbols ([`register_fprobe_syms`]).
//!
//! # One fgraph user, two tables
//!
//! Every fprobe shares **one** [`Fgraph`] user, registered when the first
//! fprobe registers and unregistered with the last; its filter is the union
//! of the fprobes' sites (each change replaces the user: calls made during
//! that window are not probed).  Its callbacks find the fprobes through an
//! immutable snapshot of two hash tables, published with an atomic pointer
//! and freed after a grace period ([`crate::grace`]):
//!
//! * **by ip**: site address → the fprobes on it (entry);
//! * **by fprobe**: fprobe address → its registration number (exit: is the
//!   fprobe whose entry ran still registered, and by the same registration?
//!   Asked only when the snapshot changed since the entry: each snapshot
//!   has a generation number, and an unchanged one answers yes).
//!
//! # Per-call data on the shadow stack
//!
//! For each fprobe with an exit handler the entry reserves one fgraph data
//! block (plain words: user-space pointers have zero top bits, so nothing
//! is packed into them):
//!
//! ```text
//!   +0   the Fprobe's address (0: its entry handler skipped the exit)
//!   +8   the registration number it was entered under
//!   +16  the generation of the tables the entry saw
//!   +24  entry data (entry_data_size bytes, zeroed)
//! ```
//!
//! At return the exit handler runs only if the tables are those the entry
//! saw, or the by-fprobe table still holds that fprobe with that
//! registration number.  (`ret_ip` is the fgraph frame's return address.)
//!
//! # Unregistering
//!
//! [`unregister_fprobe`] removes the fprobe from the tables, replaces (or
//! drops) the fgraph user — whose unregistration waits for a grace period,
//! so no callback of the old user is running afterwards and its pending
//! returns are skipped — and frees its registration after another grace
//! period.  So when it returns the fprobe's handlers are not running and
//! are never called again for calls entered before, and nothing it owned
//! was freed while a handler used it.  (If a grace period times out, the
//! old objects are quarantined rather than freed: see [`crate::grace`].)
//!
//! `nmissed` counts calls whose entry data did not fit on the shadow stack
//! (the handlers are not called for them).

use crate::fgraph::{self, Fgraph, FgraphError, GraphEnt, GraphRet};
use crate::ftrace::{ftrace, OpsError};
use crate::grace;
use crate::ops::{Filter, FilterError};
use crate::regs::FtraceRegs;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering::*};
use std::sync::{Arc, Mutex, OnceLock};

/// Largest `entry_data_size`, in bytes.
pub const ENTRY_DATA_MAX: usize = 120;
/// Bytes before the entry data in each shadow-stack block (three words).
const HEADER: usize = 24;
const _: () = assert!(HEADER + ENTRY_DATA_MAX <= fgraph::DATA_MAX);

/// What an entry handler asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryAction {
    /// Call the exit handler when the function returns.
    Continue,
    /// No exit handler for this call.
    SkipExit,
}

/// `(fprobe, ip, ret_ip, fregs, entry_data) -> action`: `ip` is the probed
/// function's patch site, `ret_ip` where it returns; `entry_data` has
/// `entry_data_size` bytes, zeroed.
pub type EntryHandler = fn(&Fprobe, usize, usize, &mut FtraceRegs, &mut [u8]) -> EntryAction;
/// `(fprobe, ip, ret_ip, fregs, entry_data)`: the return value is in
/// `fregs` ([`FtraceRegs::return_value`]); `entry_data` is what the entry
/// handler left there.
pub type ExitHandler = fn(&Fprobe, usize, usize, &mut FtraceRegs, &mut [u8]);

/// A probe (`struct fprobe`).  Build it, wrap it in an `Arc`, register it.
pub struct Fprobe {
    entry_handler: Option<EntryHandler>,
    exit_handler: Option<ExitHandler>,
    entry_data_size: usize,
    nmissed: AtomicU64,
    /// User data.
    pub private: usize,
}

impl Default for Fprobe {
    fn default() -> Fprobe {
        Fprobe::new()
    }
}

impl Fprobe {
    pub fn new() -> Fprobe {
        Fprobe { entry_handler: None, exit_handler: None, entry_data_size: 0, nmissed: AtomicU64::new(0), private: 0 }
    }
    pub fn entry_handler(mut self, h: EntryHandler) -> Fprobe {
        self.entry_handler = Some(h);
        self
    }
    pub fn exit_handler(mut self, h: ExitHandler) -> Fprobe {
        self.exit_handler = Some(h);
        self
    }
    /// Bytes of per-call data from entry to exit (at most
    /// [`ENTRY_DATA_MAX`]; more is refused when registering).
    pub fn entry_data_size(mut self, size: usize) -> Fprobe {
        self.entry_data_size = size;
        self
    }
    pub fn private(mut self, private: usize) -> Fprobe {
        self.private = private;
        self
    }
    /// Calls not probed because their entry data did not fit.
    pub fn nmissed(&self) -> u64 {
        self.nmissed.load(Relaxed)
    }
    /// Whether it is registered now.
    pub fn is_registered(self: &Arc<Fprobe>) -> bool {
        registry().probes.iter().any(|p| Arc::ptr_eq(&p.fp, self))
    }
    /// The sites it is registered on (empty when not registered).
    pub fn ips(self: &Arc<Fprobe>) -> Vec<usize> {
        registry().probes.iter().find(|p| Arc::ptr_eq(&p.fp, self)).map(|p| p.ips.clone()).unwrap_or_default()
    }
}

impl std::fmt::Debug for Fprobe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fprobe").field("entry_data_size", &self.entry_data_size).field("nmissed", &self.nmissed()).finish_non_exhaustive()
    }
}

/// Why an fprobe could not be (un)registered.
#[derive(Debug, thiserror::Error)]
pub enum FprobeError {
    #[error("entry_data_size {size} is larger than the maximum of {ENTRY_DATA_MAX} bytes")]
    EntryDataTooLarge { size: usize },
    #[error("the fprobe has neither an entry nor an exit handler")]
    NoHandler,
    #[error("the fprobe matches no patchable function ({0})")]
    NoMatch(String),
    #[error("this fprobe is already registered")]
    AlreadyRegistered,
    #[error("this fprobe is not registered")]
    NotRegistered,
    #[error(transparent)]
    Filter(#[from] FilterError),
    #[error(transparent)]
    Fgraph(#[from] FgraphError),
}

impl From<OpsError> for FprobeError {
    fn from(e: OpsError) -> FprobeError {
        FprobeError::Fgraph(e.into())
    }
}

// ---------------------------------------------------------------------------
// The published tables.

/// One fprobe on a site: its address and registration number.
#[derive(Clone, Copy)]
struct Probe {
    fp: *const Fprobe,
    id: u64,
}

#[derive(Default)]
struct Tables {
    /// Site → its fprobes, sorted by site (binary search: cheaper than
    /// hashing for the few sites a probe set usually has, and predictable).
    by_ip: Box<[(usize, Box<[Probe]>)]>,
    /// (fprobe, registration number) of every registration, sorted: an
    /// exit runs only if its entry's pair is still here.
    live: Box<[(usize, u64)]>,
    /// Distinct for every published snapshot.
    gen: u64,
}

// SAFETY: the raw pointers are only addresses of fprobes kept alive by the
// registry (an Arc each) until a grace period after they leave the tables.
unsafe impl Send for Tables {}
// SAFETY: as above; the tables are never written once published.
unsafe impl Sync for Tables {}

static TABLES: AtomicPtr<Tables> = AtomicPtr::new(std::ptr::null_mut());
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
static NEXT_GEN: AtomicU64 = AtomicU64::new(1);

/// The current tables; valid while the caller is inside dispatch.
fn tables() -> Option<&'static Tables> {
    let t = TABLES.load(Acquire);
    // SAFETY: published tables are freed only after a grace period, and
    // the fgraph callbacks (our only readers) run inside dispatch.
    (!t.is_null()).then(|| unsafe { &*t })
}

struct Reg {
    fp: Arc<Fprobe>,
    id: u64,
    ips: Vec<usize>,
}

#[derive(Default)]
struct Registry {
    probes: Vec<Reg>,
    user: Option<Arc<Fgraph>>,
}

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    static R: OnceLock<Mutex<Registry>> = OnceLock::new();
    R.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner())
}

/// Publishes tables for the current registrations; returns the old ones
/// (to be freed after a grace period).
fn publish(r: &Registry) -> Option<Box<Tables>> {
    let mut t = Tables { gen: NEXT_GEN.fetch_add(1, Relaxed), ..Tables::default() };
    let mut by_ip: BTreeMap<usize, Vec<Probe>> = BTreeMap::new();
    let mut live = Vec::new();
    for p in &r.probes {
        let probe = Probe { fp: Arc::as_ptr(&p.fp), id: p.id };
        live.push((probe.fp as usize, p.id));
        for ip in &p.ips {
            by_ip.entry(*ip).or_default().push(probe);
        }
    }
    live.sort_unstable();
    t.live = live.into_boxed_slice();
    t.by_ip = by_ip.into_iter().map(|(k, v)| (k, v.into_boxed_slice())).collect();
    let old = TABLES.swap(Box::into_raw(Box::new(t)), AcqRel);
    // SAFETY: every pointer in TABLES came from Box::into_raw above and the
    // swap hands the old one back exactly once.
    (!old.is_null()).then(|| unsafe { Box::from_raw(old) })
}

/// Replaces the shared fgraph user by one tracing every registered site
/// (none: no user).
fn rebuild_user(r: &mut Registry) -> Result<(), FprobeError> {
    let mut ips: Vec<usize> = r.probes.iter().flat_map(|p| p.ips.iter().copied()).collect();
    if ips.is_empty() {
        if let Some(old) = r.user.take() {
            // Waits for a grace period: no old callback runs after this.
            fgraph::unregister_fgraph(&old)?;
        }
        return Ok(());
    }
    ips.sort_unstable();
    ips.dedup();
    let filter = ips.iter().fold(Filter::new(), |f, a| f.addr(*a));
    match &r.user {
        // One filter change: functions probed before and after stay probed
        // throughout; exits check their registration in the tables.
        Some(user) => fgraph::set_fgraph_filter(user, filter)?,
        None => {
            let user = Arc::new(Fgraph::new(fp_entry, fp_exit).filter(filter).skip_timestamp(true));
            fgraph::register_fgraph(user.clone())?;
            r.user = Some(user);
        }
    }
    Ok(())
}

/// Registers `fp` on the functions whose symbols match `filter` and not
/// `notfilter` (each a list of globs or names separated by spaces or
/// commas, as Linux's `register_fprobe`).
pub fn register_fprobe(fp: &Arc<Fprobe>, filter: &str, notfilter: Option<&str>) -> Result<(), FprobeError> {
    let parse = |text: &str| -> Result<Filter, FprobeError> {
        let mut f = Filter::new();
        for item in text.split([' ', ',', '\t', '\n']).filter(|s| !s.is_empty()) {
            f = if ftramp_demangle::NamePattern::is_glob(item) { f.glob(item)? } else { f.symbol(item) };
        }
        Ok(f)
    };
    let what = match notfilter {
        Some(n) => format!("filter `{filter}`, notfilter `{n}`"),
        None => format!("filter `{filter}`"),
    };
    let f = parse(filter)?;
    if f.is_empty() {
        return Err(FprobeError::NoMatch(what));
    }
    register_fprobe_filter(fp, &f, &parse(notfilter.unwrap_or(""))?, &what)
}

/// Registers `fp` on the functions at `addrs` (patch sites or function
/// addresses, as [`Filter::addr`]).
pub fn register_fprobe_ips(fp: &Arc<Fprobe>, addrs: &[usize]) -> Result<(), FprobeError> {
    let f = addrs.iter().fold(Filter::new(), |f, a| f.addr(*a));
    register_fprobe_filter(fp, &f, &Filter::new(), &format!("addresses {addrs:#x?}"))
}

/// Registers `fp` on the functions named `syms` (exact names).
pub fn register_fprobe_syms(fp: &Arc<Fprobe>, syms: &[&str]) -> Result<(), FprobeError> {
    let f = syms.iter().fold(Filter::new(), |f, s| f.symbol(s));
    register_fprobe_filter(fp, &f, &Filter::new(), &format!("symbols {syms:?}"))
}

/// Registers `fp` on the sites `filter` matches and `notfilter` does not
/// (an empty `filter` matches nothing here).
pub fn register_fprobe_filter(fp: &Arc<Fprobe>, filter: &Filter, notfilter: &Filter, what: &str) -> Result<(), FprobeError> {
    if grace::dispatch_depth() > 0 {
        return Err(OpsError::FromCallback.into());
    }
    if fp.entry_data_size > ENTRY_DATA_MAX {
        return Err(FprobeError::EntryDataTooLarge { size: fp.entry_data_size });
    }
    if fp.entry_handler.is_none() && fp.exit_handler.is_none() {
        return Err(FprobeError::NoHandler);
    }
    let mut r = registry();
    if r.probes.iter().any(|p| Arc::ptr_eq(&p.fp, fp)) {
        return Err(FprobeError::AlreadyRegistered);
    }
    // Discovery happens on the engine's first use.
    ftrace().refresh()?;
    let mut ips: Vec<usize> = if filter.is_empty() {
        Vec::new()
    } else {
        ftrace().site_dispatch().into_iter().filter(|(s, _)| filter.matches(s) && !notfilter.matches(s)).map(|(s, _)| s.addr).collect()
    };
    ips.sort_unstable();
    ips.dedup();
    if ips.is_empty() {
        return Err(FprobeError::NoMatch(what.to_string()));
    }
    let id = NEXT_ID.fetch_add(1, Relaxed);
    r.probes.push(Reg { fp: fp.clone(), id, ips });
    let old = publish(&r);
    if let Err(e) = rebuild_user(&mut r) {
        r.probes.pop();
        let old2 = publish(&r);
        let _ = rebuild_user(&mut r);
        grace::retire((old, old2), &[]);
        return Err(e);
    }
    // Freed by the next grace period (replacing the user waited for one
    // already, unless it timed out).
    if let Some(old) = old {
        grace::retire(old, &[]);
    }
    Ok(())
}

/// Unregisters `fp`.  When this returns its handlers are not running and
/// are never called again, also not at the return of calls entered before.
pub fn unregister_fprobe(fp: &Arc<Fprobe>) -> Result<(), FprobeError> {
    if grace::dispatch_depth() > 0 {
        return Err(OpsError::FromCallback.into());
    }
    let mut r = registry();
    let i = r.probes.iter().position(|p| Arc::ptr_eq(&p.fp, fp)).ok_or(FprobeError::NotRegistered)?;
    let removed = r.probes.remove(i);
    let old = publish(&r);
    let res = rebuild_user(&mut r);
    // Exits that passed the by-fprobe check before the publish may still
    // be running if the user's grace period failed: wait once more.
    let _ = grace::defer_free((old, removed), &[]);
    res
}

/// Registered fprobes.
pub fn registered() -> usize {
    registry().probes.len()
}

// ---------------------------------------------------------------------------
// The shared fgraph user's callbacks.

extern "C" fn fp_entry(ent: &GraphEnt, _g: &Fgraph, fregs: &mut FtraceRegs) -> bool {
    let Some(t) = tables() else { return false };
    let Ok(i) = t.by_ip.binary_search_by_key(&ent.func, |e| e.0) else { return false };
    let probes = &*t.by_ip[i].1;
    if let [p] = probes {
        // SAFETY: the registry holds an Arc of every fprobe in the tables,
        // released a grace period after it leaves them; we are inside
        // dispatch.
        let fp = unsafe { &*p.fp };
        // The common cases, one fprobe on the site and no entry data: the
        // handler call comes last, so nothing is kept across it.
        if fp.entry_data_size == 0 {
            if let Some(h) = fp.entry_handler {
                let ret_ip = fregs.return_address();
                if fp.exit_handler.is_none() {
                    h(fp, ent.func, ret_ip, fregs, &mut []);
                    return false;
                }
                if reserve_block(t, p, fp, ent).is_none() {
                    return false;
                }
                // (Skipping the exit: fgraph drops the block with the frame.)
                return h(fp, ent.func, ret_ip, fregs, &mut []) == EntryAction::Continue;
            }
        }
    }
    probes_entry(t, probes, ent, fregs)
}

/// Every other case: several fprobes on the site, entry data, no entry
/// handler.
#[inline(never)]
fn probes_entry(t: &Tables, probes: &[Probe], ent: &GraphEnt, fregs: &mut FtraceRegs) -> bool {
    let alone = probes.len() == 1;
    probes.iter().fold(false, |want, p| probe_entry(t, p, ent, fregs, alone) | want)
}

/// Reserves `fp`'s block for this call (its entry data not zeroed) and
/// writes its header (see the module docs); `None`, counted in `nmissed`,
/// when it does not fit.
#[inline(always)]
fn reserve_block(t: &Tables, p: &Probe, fp: &Fprobe, ent: &GraphEnt) -> Option<*mut u64> {
    let Some(b) = ent.reserve(HEADER + fp.entry_data_size) else {
        fp.nmissed.fetch_add(1, Relaxed);
        return None;
    };
    // SAFETY: `b` is a fresh block of at least HEADER bytes, u64-aligned,
    // ours alone until the frame is popped.
    unsafe {
        b.write(p.fp as usize as u64);
        b.add(1).write(p.id);
        b.add(2).write(t.gen);
    }
    Some(b)
}

/// One fprobe's entry: its handler, and its block when it has an exit
/// handler.  True when its exit is wanted.  `alone`: the only fprobe on
/// the site, whose block fgraph drops with the frame when the entry
/// returns false (so a skipped exit needs no mark).
#[inline(always)]
fn probe_entry(t: &Tables, p: &Probe, ent: &GraphEnt, fregs: &mut FtraceRegs, alone: bool) -> bool {
    // SAFETY: the registry holds an Arc of every fprobe in the tables,
    // released a grace period after it leaves them; we are inside
    // dispatch.
    let fp = unsafe { &*p.fp };
    let size = fp.entry_data_size;
    let ret_ip = fregs.return_address();
    if fp.exit_handler.is_none() {
        if let Some(h) = fp.entry_handler {
            if size == 0 {
                h(fp, ent.func, ret_ip, fregs, &mut []);
            } else {
                entry_with_scratch(h, fp, ent.func, ret_ip, fregs);
            }
        }
        return false;
    }
    // The header first: after the handler only its verdict is left.
    let Some(b) = reserve_block(t, p, fp, ent) else { return false };
    // SAFETY: `b` is this call's fresh block of HEADER + size bytes,
    // u64-aligned and initialised (the shadow stack's words), ours alone
    // until the frame is popped.
    let data = unsafe { std::slice::from_raw_parts_mut(b.add(HEADER / 8) as *mut u8, size) };
    data.fill(0);
    let go = match fp.entry_handler {
        Some(h) => h(fp, ent.func, ret_ip, fregs, data) == EntryAction::Continue,
        None => true,
    };
    if !go && !alone {
        // SAFETY: as above.
        unsafe { b.write(0) };
    }
    go
}

/// An entry handler with entry data but no exit: the data lives on this
/// frame (out of line, so that the common paths need no 120-byte frame).
#[inline(never)]
fn entry_with_scratch(h: EntryHandler, fp: &Fprobe, ip: usize, ret_ip: usize, fregs: &mut FtraceRegs) {
    let mut buf = [0u8; ENTRY_DATA_MAX];
    h(fp, ip, ret_ip, fregs, &mut buf[..fp.entry_data_size]);
}

extern "C" fn fp_exit(ret: &GraphRet, _g: &Fgraph, fregs: &mut FtraceRegs) {
    let Some(t) = tables() else { return };
    // The common case, the frame's one block (one fprobe on the site, no
    // other fgraph user's data): no walk.
    match ret.only_block() {
        Some((b, size)) => probe_exit(t, ret, fregs, b, size),
        None => exit_walk(t, ret, fregs),
    }
}

#[inline(never)]
fn exit_walk(t: &Tables, ret: &GraphRet, fregs: &mut FtraceRegs) {
    ret.for_each_block(|b, size| probe_exit(t, ret, fregs, b, size));
}

/// One block's exit: its fprobe's exit handler, if the fprobe is still
/// registered under the registration its entry saw.  (The rare cases are
/// out of line: the common one keeps no registers across calls.)
#[inline(always)]
fn probe_exit(t: &Tables, ret: &GraphRet, fregs: &mut FtraceRegs, b: *mut u64, size: usize) {
    if size < HEADER {
        return;
    }
    // SAFETY: one of this user's blocks of the returning call (ours, at
    // least HEADER bytes), valid during this callback.
    let head = unsafe { std::slice::from_raw_parts(b, HEADER / 8) };
    if head[0] == 0 {
        return;
    }
    if head[2] != t.gen {
        return probe_exit_changed(ret, fregs, b, size);
    }
    call_exit(ret, fregs, b, size)
}

/// [`probe_exit`] when the tables changed since the call's entry: is the
/// fprobe still in them, under the same registration?
#[cold]
#[inline(never)]
fn probe_exit_changed(ret: &GraphRet, fregs: &mut FtraceRegs, b: *mut u64, size: usize) {
    // The current tables, read again rather than passed (the caller's call
    // then takes its arguments in registers); newer than the caller's is
    // as good.
    let Some(t) = tables() else { return };
    // SAFETY: as in probe_exit.
    let head = unsafe { std::slice::from_raw_parts(b, HEADER / 8) };
    if t.live.binary_search(&(head[0] as usize, head[1])).is_ok() {
        call_exit(ret, fregs, b, size)
    }
}

/// Calls the exit handler of the fprobe in block `b` (checked live).
#[inline(always)]
fn call_exit(ret: &GraphRet, fregs: &mut FtraceRegs, b: *mut u64, size: usize) {
    // SAFETY: as in probe_exit; the fprobe is in the tables under the
    // registration its entry saw, so the registry holds it (see fp_entry).
    let (fp, data) = unsafe { (&*(b.read() as usize as *const Fprobe), std::slice::from_raw_parts_mut(b.add(HEADER / 8) as *mut u8, size - HEADER)) };
    if let Some(h) = fp.exit_handler {
        h(fp, ret.func, ret.ret_ip(), fregs, data);
    }
}
