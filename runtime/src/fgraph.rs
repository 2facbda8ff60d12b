//! `fgraph`: function-graph tracing, the user-space `kernel/trace/fgraph.c`.
//!
//! Up to [`MAX_USERS`] [`Fgraph`] users see every traced call at entry and
//! (when their entry callback asks for it) at return.  The first user
//! registers one internal [`Ops`] with the engine; its callback pushes a
//! frame on the calling thread's *shadow stack* and points the traced
//! function's return address at `return_to_handler` (a generated
//! `Variant::Return` trampoline), which calls [`ftrace_return_to_handler`]:
//! it pops the frame, calls the users' `ret` callbacks and hands back the
//! real return address.
//!
//! # Shadow stack words
//!
//! One array of `u64` per thread ([`stack_words`], one page by default,
//! plus two sentinel words at the bottom), growing upwards.  A frame:
//!
//! ```text
//!   index          word
//!   fb + 0 ...     data blocks, one per reserve_data() call, in call order:
//!                    [ DATA header ][ ceil(bytes/8) data words ]
//!   top - 5        CALLTIME  ticks of clock::ticks() (0 when every user skips timestamps)
//!   top - 4        FUNC      the traced function's patch site (GraphEnt::func)
//!   top - 3        RET       the real return address
//!   top - 2        SP        the traced function's sp at entry (FtraceRegs::stack_pointer)
//!   top - 1        FRAME header (`off` = its distance from fb)
//!   top            next frame / free
//!
//!   FRAME header                                   DATA header
//!   63         32 31      16 15  12 11     2 1 0   63    16 15  12 11     2 1 0
//!  ┌─────────────┬──────────┬──────┬────────┬───┐ ┌────────┬──────┬────────┬───┐
//!  │ epoch       │ bitmap   │  0   │ off    │ 1 │ │   0    │ user │ bytes  │ 2 │
//!  └─────────────┴──────────┴──────┴────────┴───┘ └────────┴──────┴────────┴───┘
//!
//!   index 0        u64::MAX  sentinel: the SP of "the frame below the first",
//!   index 1        0         so the hot paths read top - 2 without a test
//! ```
//!
//! *bitmap*: the users (slot indexes) whose `ret` runs at return.
//! *epoch*: the registration epoch when the frame was pushed; a slot whose
//! user registered later (a slot reused after an unregister) is skipped at
//! return, so a new user never sees a frame it did not enter.  The fixed
//! words sit at the top of the frame, so the hot paths reach them from
//! `top` alone (no decoding).  The entry writes them before its callbacks
//! at `fb`; each `reserve_data` puts its block where they are and moves
//! them up past it, and the FRAME header goes above them once the
//! callbacks are done (and only if a user wants the return).  `top` stays
//! at `fb` until then, so the frames below stay complete and walkable.  A
//! return's data blocks are found by walking the DATA headers up from
//! `fb`.  Unlike Linux, no pointer packing: words are plain `u64`s.
//!
//! # Resynchronising (longjmp, exceptions, alternate signal stacks)
//!
//! Frames record the traced function's stack pointer at entry.  A return
//! belongs to the innermost frame whose recorded sp is the returning
//! function's entry sp (x86_64: sp - 8 after `ret`; aarch64: sp); frames
//! above it on the shadow stack were left without returning.  Stacks grow
//! down, so a frame whose recorded sp is *below* the sp of a new entry
//! belongs to a call that was left too (`longjmp`, `siglongjmp`, an
//! exception or a panic unwinding through it).  Rule: such frames are
//! **dropped** — their `ret` callbacks are not called — and counted
//! ([`stale_frames`]).  A frame with the *same* sp as a new entry is stale
//! too unless the new call's return address is `return_to_handler` (a tail
//! call from a traced function keeps its caller's hijacked return address
//! and sp).  On x86_64, while one thread alone has a shadow stack, a
//! dropped frame whose return slot still holds `return_to_handler` gets
//! its real return address back there ([`unhijacked_frames`]): it may be a
//! coroutine's, suspended by a switch the runtime did not see.
//!
//! Stacks are ordered only within one stack.  When a frame would be
//! dropped at an entry, `sigaltstack(NULL, &ss)` tells whether the entry
//! runs on the alternate signal stack while the frame lies elsewhere (a
//! handler on an alternate stack *above* the thread stack, entered inside
//! traced calls): that frame and those below it are kept, and the thread
//! is marked `SLOW_ALT` so that its next entry off the alternate stack
//! drops the frames left there (`siglongjmp` out of the handler).  An
//! alternate stack below the thread stack needs nothing more.  Exceptions
//! and panics: the unwinder hooks of [`unwind`](crate::unwind) put the
//! real return addresses back before the unwinder walks the stack and mark
//! the thread `SLOW_RESTORED`; its next entry drops the unwound frames and
//! re-hijacks the survivors (the rule is in that module).  Both marks live
//! in one byte with the busy flag (below), which the entry tests once on
//! its fast path; everything else (first use, recursion, resync, a full
//! stack) is in one cold function.
//!
//! # Guards and counters
//!
//! A per-thread busy flag (`BUSY` in the state byte) is the recursion guard: a traced function called
//! from a callback (or from a signal handler that interrupted fgraph
//! itself) is not traced and is counted in [`recursion_misses`].  A frame
//! that does not fit counts a miss ([`misses`], [`thread_misses`]) and the
//! call runs untraced; so does a call made after the thread's exit hooks
//! released its stack (the C library's own thread cleanup), counted apart
//! ([`exit_misses`]).  Nothing allocates, not even a thread's first
//! traced call, which may be a signal handler's that interrupted `malloc`:
//! the stack is `mmap`ed then, and unmapped when the thread exits through
//! the runtime's exit key ([`crate::thread`]); a `fork` child keeps a copy.
//! A signal handler calling traced functions nests its frames above the
//! interrupted ones.
//!
//! # Filters
//!
//! The internal ops traces the union of the users' filters (every function
//! if any user's filter is empty).  With several users, a per-site bitmap
//! (sorted table, binary search) says which users trace the calling site;
//! with one user its callbacks are called directly, no table, no loop.
//! Changing the set of users replaces the internal ops in one step
//! (`ftrace().replace`), so the users that stay miss no call.

use crate::exec::JitImage;
use crate::ftrace::{ftrace, OpsError};
use crate::grace::{self, DispatchGuard};
use crate::ops::{Filter, Ops};
use crate::regs::{fixed::RET_SP_DELTA, FtraceRegs};
use crate::clock;
use crate::{host_spec, RuntimeError};
use ftramp_codegen::{image::Image, DataWord, Variant};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU16, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex, OnceLock};

/// Users registered at once (bits of the FRAME bitmap).
pub const MAX_USERS: usize = 16;
/// Largest `reserve_data` block, in bytes.
pub const DATA_MAX: usize = 256;

/// The shadow-stack word format (see the module docs).
mod word {
    pub const TYPE_BITS: u32 = 2;
    pub const TYPE_FRAME: u64 = 1;
    pub const TYPE_DATA: u64 = 2;
    pub const OFF_SHIFT: u32 = TYPE_BITS;
    pub const OFF_BITS: u32 = 10;
    pub const USER_SHIFT: u32 = OFF_SHIFT + OFF_BITS;
    pub const USER_BITS: u32 = 4;
    pub const BITMAP_SHIFT: u32 = 16;
    pub const BITMAP_BITS: u32 = 16;
    pub const EPOCH_SHIFT: u32 = 32;

    /// The fixed words, counted down from `top` (see the module docs),
    /// and how many words a frame takes besides its data blocks.
    pub const SP: usize = 2;
    pub const RET: usize = 3;
    pub const FUNC: usize = 4;
    pub const CALLTIME: usize = 5;
    pub const FIXED: usize = 5;
    /// Sentinel words at the bottom of every stack.
    pub const BASE: usize = 2;

    const fn mask(bits: u32) -> u64 {
        (1 << bits) - 1
    }

    pub const fn frame(off: usize, bitmap: u16, epoch: u32) -> u64 {
        TYPE_FRAME | (off as u64) << OFF_SHIFT | (bitmap as u64) << BITMAP_SHIFT | (epoch as u64) << EPOCH_SHIFT
    }
    pub const fn data(bytes: usize, user: usize) -> u64 {
        TYPE_DATA | (bytes as u64) << OFF_SHIFT | (user as u64) << USER_SHIFT
    }
    pub const fn kind(w: u64) -> u64 {
        w & mask(TYPE_BITS)
    }
    /// FRAME: distance from the frame base; DATA: block size in bytes.
    pub const fn off(w: u64) -> usize {
        ((w >> OFF_SHIFT) & mask(OFF_BITS)) as usize
    }
    pub const fn user(w: u64) -> usize {
        ((w >> USER_SHIFT) & mask(USER_BITS)) as usize
    }
    pub const fn bitmap(w: u64) -> u16 {
        ((w >> BITMAP_SHIFT) & mask(BITMAP_BITS)) as u16
    }
    pub const fn epoch(w: u64) -> u32 {
        (w >> EPOCH_SHIFT) as u32
    }
    pub const fn data_words(bytes: usize) -> usize {
        // (bytes < 1024: no overflow; two instructions where div_ceil
        // compiles to four, on fprobe's exit path.)
        (bytes + 7) >> 3
    }
}

/// The largest frame: fixed words and the FRAME header, one full data
/// block (+ header) per user.
pub const MAX_FRAME_WORDS: usize = word::FIXED + MAX_USERS * (word::data_words(DATA_MAX) + 1);

const _: () = {
    assert!(MAX_USERS <= word::BITMAP_BITS as usize);
    assert!(MAX_USERS <= 1 << word::USER_BITS);
    assert!(MAX_FRAME_WORDS < 1 << word::OFF_BITS);
    assert!(DATA_MAX < 1 << word::OFF_BITS);
    assert!(word::USER_SHIFT + word::USER_BITS <= word::BITMAP_SHIFT);
    assert!(word::BITMAP_SHIFT + word::BITMAP_BITS <= word::EPOCH_SHIFT);
    // Round trips of the extreme values.
    let f = word::frame(MAX_FRAME_WORDS, u16::MAX, u32::MAX);
    assert!(word::kind(f) == word::TYPE_FRAME && word::off(f) == MAX_FRAME_WORDS);
    assert!(word::bitmap(f) == u16::MAX && word::epoch(f) == u32::MAX);
    let d = word::data(DATA_MAX, MAX_USERS - 1);
    assert!(word::kind(d) == word::TYPE_DATA && word::off(d) == DATA_MAX && word::user(d) == MAX_USERS - 1);
};

/// What an entry callback gets (`struct ftrace_graph_ent`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct GraphEnt {
    /// The traced function's patch site.
    pub func: usize,
    /// Frames of this thread below this call on the shadow stack.
    pub depth: usize,
    /// The calling thread's shadow stack ([`GraphEnt::task_var`]).
    shadow: *const Shadow,
}

/// What a return callback gets (`struct ftrace_graph_ret`); the return
/// value is in the `FtraceRegs` (`return_value`, `set_return_value`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct GraphRet {
    pub func: usize,
    pub depth: usize,
    /// ns, CLOCK_MONOTONIC; 0 when every user skips timestamps.
    pub calltime: u64,
    pub rettime: u64,
    /// The calling thread's shadow stack ([`GraphRet::task_var`]).
    shadow: *const Shadow,
}

/// Entry callback: `false` = do not call `ret` for this call.
pub type EntryFunc = extern "C" fn(&GraphEnt, &Fgraph, &mut FtraceRegs) -> bool;
/// Return callback.
pub type RetFunc = extern "C" fn(&GraphRet, &Fgraph, &mut FtraceRegs);

/// An fgraph user (`struct fgraph_ops`).
pub struct Fgraph {
    entry: EntryFunc,
    ret: RetFunc,
    /// Read only under the registry lock (rebuild); changed by
    /// [`set_fgraph_filter`].
    filter: Mutex<Filter>,
    /// Functions left out even when the filter matches (fixed at creation).
    notrace: Filter,
    skip_timestamp: bool,
    /// Registers even when its filter matches no loaded function yet.
    allow_no_sites: bool,
    /// User data.
    pub private: usize,
    /// Where and when it is registered (`usize::MAX`: not registered).
    slot: AtomicUsize,
    reg_epoch: AtomicU32,
}

impl Fgraph {
    pub fn new(entry: EntryFunc, ret: RetFunc) -> Fgraph {
        Fgraph { entry, ret, filter: Mutex::new(Filter::new()), notrace: Filter::new(), skip_timestamp: false, allow_no_sites: false, private: 0, slot: AtomicUsize::new(usize::MAX), reg_epoch: AtomicU32::new(0) }
    }
    /// Functions not traced even when the filter matches them (Linux's
    /// `set_graph_notrace`; globs apply to modules loaded later too).
    pub fn notrace(mut self, notrace: Filter) -> Fgraph {
        self.notrace = notrace;
        self
    }
    /// The functions traced (empty: all).
    pub fn filter(self, filter: Filter) -> Fgraph {
        *self.filter.lock().unwrap_or_else(|e| e.into_inner()) = filter;
        self
    }
    /// No clock reads for this user (`calltime`/`rettime` may be 0).
    pub fn skip_timestamp(mut self, skip: bool) -> Fgraph {
        self.skip_timestamp = skip;
        self
    }
    /// Registering succeeds even when the filter matches no loaded function
    /// yet: its globs select functions of libraries loaded later
    /// ([`OpsFlags::ALLOW_NO_SITES`](crate::ops::OpsFlags::ALLOW_NO_SITES)).
    pub fn allow_no_sites(mut self, allow: bool) -> Fgraph {
        self.allow_no_sites = allow;
        self
    }
    pub fn private(mut self, private: usize) -> Fgraph {
        self.private = private;
        self
    }

    /// Runs `f` on the calling thread's task variable for this user
    /// (`fgraph_get_task_var`): one `u64` per thread and registered user,
    /// 0 on each thread when the user registers, kept across its calls.
    /// `None` when the user is not registered (or the thread is exiting).
    pub fn with_task_var<R>(&self, f: impl FnOnce(&mut u64) -> R) -> Option<R> {
        let c = self.task_var_in(shadow())?;
        let mut v = c.get();
        let r = f(&mut v);
        c.set(v);
        Some(r)
    }

    /// This user's task variable in `sh` (reset when the slot's user changed).
    #[inline(always)]
    fn task_var_in<'a>(&self, sh: &'a Shadow) -> Option<&'a Cell<u64>> {
        let slot = self.slot.load(Acquire);
        if slot >= MAX_USERS {
            return None;
        }
        let epoch = self.reg_epoch.load(Relaxed);
        // (No store on the common path: the epoch is written only when
        // the user registered since this thread last looked.)
        if sh.task_epochs[slot].get() != epoch {
            sh.task_epochs[slot].set(epoch);
            sh.task_vars[slot].set(0);
        }
        Some(&sh.task_vars[slot])
    }

    /// This thread's task variable (see [`Fgraph::with_task_var`]).
    pub fn task_var(&self) -> Option<u64> {
        self.with_task_var(|v| *v)
    }

    /// Sets this thread's task variable; false when not registered.
    pub fn set_task_var(&self, value: u64) -> bool {
        self.with_task_var(|v| *v = value).is_some()
    }
}

/// Why an fgraph user could not be (un)registered.
#[derive(Debug, thiserror::Error)]
pub enum FgraphError {
    #[error("{MAX_USERS} fgraph users are registered already")]
    Full,
    #[error("this fgraph user is already registered")]
    AlreadyRegistered,
    #[error("this fgraph user is not registered")]
    NotRegistered,
    #[error(
        "this process runs with a hardware shadow stack (x86_64 CET, arm64 GCS), which would end it at the first \
         return fgraph hijacks; trace it with the shadow stack off (x86_64 glibc: \
         GLIBC_TUNABLES=glibc.cpu.hwcaps=-SHSTK), or with entry-only ops"
    )]
    ShadowStack,
    #[error(transparent)]
    Ops(#[from] OpsError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}

// ---------------------------------------------------------------------------
// Global state: user slots (read by callbacks), the registry (writers).

static SLOTS: [AtomicPtr<Fgraph>; MAX_USERS] = [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_USERS];
/// Epoch at which each slot's user was registered.
static SLOT_EPOCH: [AtomicU32; MAX_USERS] = [const { AtomicU32::new(0) }; MAX_USERS];
static EPOCH: AtomicU32 = AtomicU32::new(0);
/// 1 + the slot of the only user, or 0 (none, or several).
static SINGLE: AtomicUsize = AtomicUsize::new(0);
static TIMESTAMPS: AtomicBool = AtomicBool::new(false);
/// Per-site user bitmaps: sorted by site address.
static MASKS: AtomicPtr<Vec<(usize, u16)>> = AtomicPtr::new(std::ptr::null_mut());
/// The users with an empty filter (all functions): the bitmap of a site
/// missing from `MASKS` (a module loaded since).
static ALL_MASK: AtomicU16 = AtomicU16::new(0);
/// The `return_to_handler` trampoline's address.
static RETURN_TO_HANDLER: AtomicUsize = AtomicUsize::new(0);

static MISSES: AtomicU64 = AtomicU64::new(0);
static EXIT_MISSES: AtomicU64 = AtomicU64::new(0);
static RECURSION_MISSES: AtomicU64 = AtomicU64::new(0);
static STALE: AtomicU64 = AtomicU64::new(0);
static UNHIJACKED: AtomicU64 = AtomicU64::new(0);
static STACK_WORDS: AtomicUsize = AtomicUsize::new(0);
static LIVE_STACKS: AtomicUsize = AtomicUsize::new(0);

#[derive(Default)]
struct Registry {
    users: [Option<Arc<Fgraph>>; MAX_USERS],
    ops: Option<Arc<Ops>>,
}

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    static R: OnceLock<Mutex<Registry>> = OnceLock::new();
    R.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner())
}

/// The largest shadow stack, in words: 2 GiB per thread (a size whose
/// byte count overflowed made a one-page mapping that frames were then
/// written past, until the twenty-seventh session).
pub const MAX_STACK_WORDS: usize = 1 << 28;

/// Sets the size (in `u64` words) of shadow stacks created from now on
/// (threads that already have one keep theirs).  At least
/// 6 (a frame without data, and one word), at most [`MAX_STACK_WORDS`];
/// 0 restores the default (one page).
pub fn set_stack_words(words: usize) {
    STACK_WORDS.store(if words == 0 { 0 } else { words.clamp(word::FIXED + 1, MAX_STACK_WORDS) }, Relaxed);
}

/// The size of shadow stacks created from now on, in words.
pub fn stack_words() -> usize {
    match STACK_WORDS.load(Relaxed) {
        0 => crate::exec::page_size() / 8,
        n => n,
    }
}

/// Calls left untraced because the shadow stack was full (all threads).
pub fn misses() -> u64 {
    MISSES.load(Relaxed)
}

/// Calls left untraced because their thread was exiting (all threads): made
/// after its exit hooks released its shadow stack, by the C library's own
/// thread cleanup (glibc's `__libc_thread_freeres` calls `free` after every
/// key destructor).  Until the twenty-eighth session they counted as
/// [`misses`], which `ftramp record` reported as calls nested too deep.
pub fn exit_misses() -> u64 {
    EXIT_MISSES.load(Relaxed)
}

/// Traced calls skipped by the recursion guard (all threads).
pub fn recursion_misses() -> u64 {
    RECURSION_MISSES.load(Relaxed)
}

/// Frames dropped by resynchronisation (calls left by longjmp & co).
pub fn stale_frames() -> u64 {
    STALE.load(Relaxed)
}

/// Dropped frames whose real return address was put back in their return
/// slot, which still held `return_to_handler` (a context suspended by a
/// stack switch the runtime did not see; all threads; x86_64).
pub fn unhijacked_frames() -> u64 {
    UNHIJACKED.load(Relaxed)
}

/// Shadow stacks mapped now: one per thread that made a traced call and
/// has not exited (a thread's stack is unmapped at its exit; the main
/// thread's stays until the process ends).
pub fn live_stacks() -> usize {
    LIVE_STACKS.load(Relaxed)
}

/// The address traced functions return to while hijacked.
pub fn return_to_handler() -> Result<usize, RuntimeError> {
    return_image().map(|j| j.entry(Variant::Return).expect("made"))
}

/// [`return_to_handler`] if it was made already, else 0 (no return has
/// been hijacked).
pub(crate) fn return_to_handler_if_made() -> usize {
    RETURN_TO_HANDLER.load(Acquire)
}

/// `(return_to_handler, ftrace_call_through)` for the entry trampolines of
/// stub entry (codegen `program.rs`, "Stub entry"); the second is 0 where
/// the sites `call` their trampoline.
pub(crate) fn graph_return_words() -> Result<(usize, usize), RuntimeError> {
    let j = return_image()?;
    Ok((j.entry(Variant::Return).expect("made"), j.image().call_through().map_or(0, |o| j.code_addr() + o)))
}

fn return_image() -> Result<&'static JitImage, RuntimeError> {
    static IMG: OnceLock<Result<JitImage, String>> = OnceLock::new();
    // The image is never freed: a hijacked return may reach it at any time.
    let img = IMG.get_or_init(|| {
        let spec = host_spec();
        let make = || -> Result<JitImage, RuntimeError> {
            let image = Image::generate_opts(spec, &[Variant::Return], crate::gen_options())?;
            let jit = JitImage::install(image, None, spec.raw.site.reach)?;
            jit.set_word(DataWord::ReturnHandler, ftrace_return_to_handler as *const () as usize);
            Ok(jit)
        };
        let r = make().map_err(|e| e.to_string());
        if let Ok(j) = &r {
            RETURN_TO_HANDLER.store(j.entry(Variant::Return).expect("made"), Release);
        }
        r
    });
    match img {
        Ok(j) => Ok(j),
        Err(e) => Err(RuntimeError::BadPatch { addr: 0, why: format!("return_to_handler: {e}") }),
    }
}

/// Registers `user`.
pub fn register_fgraph(user: Arc<Fgraph>) -> Result<(), FgraphError> {
    if grace::dispatch_depth() > 0 {
        return Err(OpsError::FromCallback.into());
    }
    // Refused before anything is set up: hijacked returns and a shadow
    // stack cannot go together (see `thread::shadow_stack_enabled`).
    if crate::thread::shadow_stack_enabled() || pretend_shadow_stack() {
        return Err(FgraphError::ShadowStack);
    }
    return_to_handler()?;
    // Calibrated here, not in a traced call, and only for a user that
    // wants times (the TSC's calibration takes 4 ms; fprobe's user and
    // other skip_timestamp users need none).
    if !user.skip_timestamp {
        clock::clock();
    }
    crate::thread::prepare();
    // Exceptions and panics through hijacked returns (a failure loses only
    // that: unwind::install_error).
    crate::unwind::install_quietly();
    crate::ftrace::on_modules_changed(refresh_masks);
    let mut r = registry();
    if r.users.iter().flatten().any(|u| Arc::ptr_eq(u, &user)) {
        return Err(FgraphError::AlreadyRegistered);
    }
    let slot = r.users.iter().position(Option::is_none).ok_or(FgraphError::Full)?;
    let epoch = EPOCH.fetch_add(1, Relaxed).wrapping_add(1);
    SLOT_EPOCH[slot].store(epoch, Relaxed);
    user.reg_epoch.store(epoch, Relaxed);
    user.slot.store(slot, Release);
    SLOTS[slot].store(Arc::as_ptr(&user) as *mut Fgraph, Release);
    r.users[slot] = Some(user.clone());
    if let Err(e) = rebuild(&mut r) {
        SLOTS[slot].store(std::ptr::null_mut(), Release);
        user.slot.store(usize::MAX, Release);
        r.users[slot] = None;
        let _ = rebuild(&mut r);
        return Err(e);
    }
    Ok(())
}

/// Changes the functions a registered `user` traces, without a window:
/// functions it traces before and after are traced throughout, and its
/// frames in flight still reach its return callback.
pub fn set_fgraph_filter(user: &Arc<Fgraph>, filter: Filter) -> Result<(), FgraphError> {
    if grace::dispatch_depth() > 0 {
        return Err(OpsError::FromCallback.into());
    }
    let mut r = registry();
    if !r.users.iter().flatten().any(|u| Arc::ptr_eq(u, user)) {
        return Err(FgraphError::NotRegistered);
    }
    let old = std::mem::replace(&mut *user.filter.lock().unwrap_or_else(|e| e.into_inner()), filter);
    if let Err(e) = rebuild(&mut r) {
        *user.filter.lock().unwrap_or_else(|e| e.into_inner()) = old;
        let _ = rebuild(&mut r);
        return Err(e);
    }
    Ok(())
}

/// Unregisters `user`: when this returns its callbacks are not running
/// and are never called again (pending returns skip it).
pub fn unregister_fgraph(user: &Arc<Fgraph>) -> Result<(), FgraphError> {
    if grace::dispatch_depth() > 0 {
        return Err(OpsError::FromCallback.into());
    }
    let mut r = registry();
    let slot = r.users.iter().position(|u| u.as_ref().is_some_and(|u| Arc::ptr_eq(u, user))).ok_or(FgraphError::NotRegistered)?;
    SLOTS[slot].store(std::ptr::null_mut(), Release);
    user.slot.store(usize::MAX, Release);
    let removed = r.users[slot].take();
    let res = rebuild(&mut r);
    // Return handlers may still hold it: free after a grace period.
    let _ = grace::defer_free(removed, &[]);
    res
}

/// Brings the internal ops in line with the current users.  The filter
/// change is one engine [`replace`](crate::ftrace::Ftrace::replace): a
/// function traced before and after is traced throughout (no window), and
/// while sites change, the exact per-site bitmaps decide who is called.
fn rebuild(r: &mut Registry) -> Result<(), FgraphError> {
    let users: Vec<(usize, &Arc<Fgraph>)> = r.users.iter().enumerate().filter_map(|(i, u)| u.as_ref().map(|u| (i, u))).collect();
    let filters: Vec<std::sync::MutexGuard<'_, Filter>> = users.iter().map(|(_, u)| u.filter.lock().unwrap_or_else(|e| e.into_inner())).collect();
    TIMESTAMPS.store(users.iter().any(|(_, u)| !u.skip_timestamp), Relaxed);
    // Bitmaps decide until the sites are patched for the new filter.
    SINGLE.store(0, Release);
    if users.is_empty() {
        if let Some(old) = r.ops.take() {
            ftrace().unregister(&old)?;
        }
        return Ok(());
    }
    // Discovery happens on the engine's first use.
    ftrace().refresh()?;
    // Users called at every site (no filter, no notrace).
    let all = users.iter().zip(&filters).filter(|((_, u), f)| f.is_empty() && u.notrace.is_empty()).fold(0u16, |m, ((i, _), _)| m | 1 << i);
    let masks = site_masks(&users, &filters);
    // The users' own filters and notrace (globs too), so that the engine
    // also traces matching functions of modules loaded later. A lone user
    // is called without bitmaps, so its notrace must keep its sites
    // unpatched; with several, the bitmaps leave each one's out.
    let filter = if filters.iter().any(|f| f.is_empty()) { Filter::new() } else { filters.iter().fold(Filter::new(), |f, u| f.union(u)) };
    let notrace = match users.as_slice() {
        [(_, u)] => u.notrace.clone(),
        _ => Filter::new(),
    };
    ALL_MASK.store(all, Relaxed);
    publish_masks(masks, false);
    let mut ops = Ops::new(graph_entry).filter(filter).notrace(notrace).raw_entry(graph_entry_listed).hijacking_returns();
    if users.iter().any(|(_, u)| u.allow_no_sites) {
        ops = ops.flags(crate::ops::OpsFlags::ALLOW_NO_SITES);
    }
    let ops = Arc::new(ops);
    match r.ops.take() {
        Some(old) => {
            if let Err(e) = ftrace().replace(&old, ops.clone()) {
                r.ops = Some(old);
                return Err(e.into());
            }
        }
        None => {
            ftrace().register(ops.clone())?;
        }
    }
    r.ops = Some(ops);
    SINGLE.store(if users.len() == 1 { users[0].0 + 1 } else { 0 }, Release);
    Ok(())
}

/// Publishes the per-site bitmaps; the old ones are freed after a grace
/// period, or (`lazy`: after a module change) by a later one
/// ([`grace::retire_lazily`]: loading a library must not interrupt the
/// program's sleeping threads).
fn publish_masks(masks: Vec<(usize, u16)>, lazy: bool) {
    let old = MASKS.swap(Box::into_raw(Box::new(masks)), AcqRel);
    if !old.is_null() {
        // SAFETY: every pointer in MASKS came from Box::into_raw here and
        // the swap hands the old one back exactly once.
        let old = unsafe { Box::from_raw(old) };
        if lazy {
            let bytes = old.capacity() * std::mem::size_of::<(usize, u16)>();
            grace::retire_lazily(old, bytes);
        } else {
            let _ = grace::defer_free(old, &[]);
        }
    }
}

/// The per-site user bitmaps of the current users over the current sites.
fn site_masks(users: &[(usize, &Arc<Fgraph>)], filters: &[std::sync::MutexGuard<'_, Filter>]) -> Vec<(usize, u16)> {
    let mut masks: Vec<(usize, u16)> = Vec::new();
    for (site, _) in ftrace().site_dispatch() {
        let m = users.iter().zip(filters).filter(|((_, u), f)| (f.is_empty() || f.matches(&site)) && !u.notrace.matches(&site)).fold(0u16, |m, ((i, _), _)| m | 1 << i);
        if m != 0 {
            masks.push((site.addr, m));
        }
    }
    masks.sort_unstable();
    masks
}

/// After `dlopen`/`dlclose` (the engine's module watcher): the bitmaps for
/// the new set of sites, so several users with globs see new modules'
/// functions too (one user is called without bitmaps).
fn refresh_masks() {
    let r = registry();
    let users: Vec<(usize, &Arc<Fgraph>)> = r.users.iter().enumerate().filter_map(|(i, u)| u.as_ref().map(|u| (i, u))).collect();
    if users.is_empty() {
        return;
    }
    let filters: Vec<std::sync::MutexGuard<'_, Filter>> = users.iter().map(|(_, u)| u.filter.lock().unwrap_or_else(|e| e.into_inner())).collect();
    publish_masks(site_masks(&users, &filters), true);
}

// ---------------------------------------------------------------------------
// Per-thread shadow stack.

/// A thread's shadow stack and fgraph state.  No `Drop`: the thread-local
/// is then accessed without a liveness check on every traced call; the
/// mapping is released at thread exit by the runtime's exit key
/// (`thread::arm`, which allocates nothing: the first call may be a
/// signal handler's).
pub(crate) struct Shadow {
    /// The words (null before the thread's first traced call; [`NO_STACK`]
    /// after its release).
    stack: Cell<*mut u64>,
    /// Index limit (usable words + [`word::BASE`]); 0 while the thread has
    /// no stack, so that every room check fails.
    len: Cell<usize>,
    /// The words mapped at `stack` (set before `stack`; `len` is set from
    /// it once the stack is ready).
    mapped: Cell<usize>,
    /// The end of the complete frames.
    top: Cell<usize>,
    /// While entry callbacks run: where the next data block goes, with the
    /// fixed words of the frame being built there (`top` stays at the
    /// frame base meanwhile).
    cur: Cell<usize>,
    depth: Cell<usize>,
    /// [`BUSY`] | [`SLOW_RESTORED`] | [`SLOW_ALT`]: 0 almost always.
    state: Cell<u8>,
    misses: Cell<u64>,
    /// While a callback runs: its user's slot.
    cur_user: Cell<usize>,
    /// Per-user task variables (`fgraph_get_task_var`), and the epoch of
    /// the user each belongs to (a new user of the slot starts from 0).
    task_vars: [Cell<u64>; MAX_USERS],
    task_epochs: [Cell<u32>; MAX_USERS],
    /// The alternate signal stack `[lo, hi)` while [`SLOW_ALT`] is set.
    alt: Cell<(usize, usize)>,
}

/// fgraph is running on this thread (push, pop or a callback): the
/// recursion guard.
const BUSY: u8 = 1;
/// The unwinder hooks restored real return addresses on this thread
/// (`unwind.rs`): the next entry re-hijacks the frames that survived.
const SLOW_RESTORED: u8 = 2;
/// Frames were pushed on the alternate signal stack, above the thread's
/// frames: the next entry off that stack drops them (left by siglongjmp).
const SLOW_ALT: u8 = 4;
const SLOW: u8 = SLOW_RESTORED | SLOW_ALT;

/// What a released stack points at: the sentinel alone, never written
/// (`len` is 0), so that a return finds no frame instead of faulting.
static NO_STACK: [u64; word::BASE] = [u64::MAX, 0];

/// A complete frame: its base and its top (one past the FRAME header).
#[derive(Clone, Copy)]
struct Frame {
    fb: usize,
    top: usize,
}

impl Shadow {
    pub(crate) const fn new() -> Shadow {
        Shadow {
            stack: Cell::new(std::ptr::null_mut()),
            len: Cell::new(0),
            mapped: Cell::new(0),
            top: Cell::new(word::BASE),
            cur: Cell::new(word::BASE),
            depth: Cell::new(0),
            state: Cell::new(0),
            misses: Cell::new(0),
            cur_user: Cell::new(0),
            task_vars: [const { Cell::new(0) }; MAX_USERS],
            task_epochs: [const { Cell::new(0) }; MAX_USERS],
            alt: Cell::new((0, 0)),
        }
    }

    /// Maps the stack on the thread's first traced call (mmap:
    /// async-signal-safe) and arranges for its unmapping at thread exit.
    ///
    /// A signal handler may interrupt this and never come back (it
    /// `siglongjmp`s): the mapping is recorded in `stack` as soon as it
    /// exists, and `len`, set last, is the commit, so the next call
    /// finishes the work instead of mapping again (or mistaking the thread
    /// for an exiting one).
    #[cold]
    fn ensure(&self) -> Ensured {
        if self.len.get() != 0 {
            return Ensured::Ready;
        }
        if std::ptr::eq(self.stack.get(), NO_STACK.as_ptr()) {
            // Released (the thread is exiting).
            return Ensured::Exiting;
        }
        if self.stack.get().is_null() {
            let words = stack_words() + word::BASE;
            // Arranges the release at thread exit without allocating; when
            // it cannot (thread::arm: the thread is exiting), the call runs
            // untraced.
            if !crate::thread::arm() {
                return Ensured::Exiting;
            }
            let Some(bytes) = words.checked_mul(8) else { return Ensured::NoRoom };
            // SAFETY: a fresh anonymous mapping aliases nothing.
            let p = unsafe {
                libc::mmap(std::ptr::null_mut(), bytes, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
            };
            if p == libc::MAP_FAILED {
                return Ensured::NoRoom;
            }
            self.mapped.set(words);
            self.stack.set(p as *mut u64);
        }
        let (p, words) = (self.stack.get(), self.mapped.get());
        // SAFETY: `p` is this thread's mapping of `words` > BASE words (made
        // above, or by an earlier call that was interrupted).
        unsafe { p.copy_from_nonoverlapping(NO_STACK.as_ptr(), word::BASE) };
        self.top.set(word::BASE);
        self.cur.set(word::BASE);
        self.len.set(words);
        LIVE_STACKS.fetch_add(1, Relaxed);
        Ensured::Ready
    }

    /// Unmaps the stack (thread exit, after the exit hooks).
    pub(crate) fn release(&self) {
        // `len` first: from here on no room check passes (a signal handler
        // calling traced code meanwhile runs untraced).
        let had = self.len.replace(0) != 0;
        let p = self.stack.replace(NO_STACK.as_ptr() as *mut u64);
        if !p.is_null() && !std::ptr::eq(p, NO_STACK.as_ptr()) {
            // SAFETY: our own mapping of `mapped` words; the thread is
            // exiting and, with `len` 0, nothing reads it again (NO_STACK
            // instead).
            unsafe { libc::munmap(p as *mut libc::c_void, self.mapped.get() * 8) };
            if had {
                LIVE_STACKS.fetch_sub(1, Relaxed);
            }
        }
        self.top.set(word::BASE);
        self.cur.set(word::BASE);
        self.depth.set(0);
    }

    #[inline(always)]
    fn get(&self, i: usize) -> u64 {
        debug_assert!(i < self.len.get().max(word::BASE));
        // SAFETY: `i < len` (callers keep every index below `top <= len`;
        // with no stack, `top` is BASE and only the sentinel below it is
        // read, from NO_STACK) and the mapping lives until the thread's
        // exit (`release`).
        unsafe { self.stack.get().add(i).read() }
    }

    #[inline(always)]
    fn set(&self, i: usize, v: u64) {
        debug_assert!(i < self.len.get());
        // SAFETY: as in `get` (writes are always checked against `len`);
        // only this thread touches its stack.
        unsafe { self.stack.get().add(i).write(v) }
    }

    #[inline(always)]
    fn ptr(&self, i: usize) -> *mut u64 {
        // SAFETY: in bounds, as in `get`.
        unsafe { self.stack.get().add(i) }
    }

    /// The innermost complete frame.
    #[inline(always)]
    fn top_frame(&self) -> Option<Frame> {
        let top = self.top.get();
        if top <= word::BASE {
            return None;
        }
        let h = self.get(top - 1);
        debug_assert_eq!(word::kind(h), word::TYPE_FRAME);
        Some(Frame { fb: top - 1 - word::off(h), top })
    }

    #[inline(always)]
    fn sp_of(&self, f: Frame) -> usize {
        self.get(f.top - word::SP) as usize
    }

    #[inline(always)]
    fn ret_of(&self, f: Frame) -> usize {
        self.get(f.top - word::RET) as usize
    }

    /// The complete frames, innermost first.
    fn frames(&self) -> impl Iterator<Item = Frame> + '_ {
        let mut top = self.top.get();
        std::iter::from_fn(move || {
            if top <= word::BASE || self.len.get() == 0 {
                return None;
            }
            let h = self.get(top - 1);
            if word::kind(h) != word::TYPE_FRAME || word::off(h) < word::FIXED - 1 || word::off(h) > top - 1 - word::BASE {
                return None;
            }
            let f = Frame { fb: top - 1 - word::off(h), top };
            top = f.fb;
            Some(f)
        })
    }

    /// The current return callback's user's data blocks in the frame
    /// returned from (the top one: nothing is pushed while busy), in
    /// reservation order: (word index, bytes).
    #[inline(always)]
    fn ret_blocks(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        let (mut at, end) = match self.top_frame() {
            Some(f) => (f.fb, f.top - word::FIXED),
            None => (0, 0),
        };
        let user = self.cur_user.get();
        std::iter::from_fn(move || {
            while at < end {
                let w = self.get(at);
                if word::kind(w) != word::TYPE_DATA {
                    return None;
                }
                let b = (at + 1, word::off(w));
                at += 1 + word::data_words(b.1);
                if word::user(w) == user {
                    return Some(b);
                }
            }
            None
        })
    }

    /// A data block's bytes.  Callers hand out each block only for the
    /// callback it belongs to (one borrow at a time).
    #[allow(clippy::mut_from_ref)]
    fn block(&self, (at, size): (usize, usize)) -> &mut [u8] {
        debug_assert!(at + word::data_words(size) <= self.len.get());
        // SAFETY: the block lies in this thread's stack below `top`; a
        // block is popped only after the callbacks its frame serves, and
        // its bytes are reached only through this one borrow at a time.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(at) as *mut u8, size) }
    }

    /// Moves a frame-in-construction's fixed words from `from` to `to`
    /// (`..+ FIXED - 1`, both below `len`).
    #[inline(always)]
    fn move_fixed(&self, from: usize, to: usize) {
        debug_assert!(from.max(to) + word::FIXED - 1 <= self.len.get());
        // SAFETY: both ranges lie below `len` (the callers' room checks);
        // `copy` allows the overlap.
        unsafe { std::ptr::copy(self.ptr(from), self.ptr(to), word::FIXED - 1) }
    }

    fn pop(&self, f: Frame) {
        self.top.set(f.fb);
        self.depth.set(self.depth.get() - 1);
    }

    /// Drops frames left without returning (see the module docs).
    #[cold]
    fn resync_entry(&self, sp: usize, ret: usize) {
        let rth = RETURN_TO_HANDLER.load(Relaxed);
        let mut alt = None;
        while let Some(f) = self.top_frame() {
            let fsp = self.sp_of(f);
            if fsp > sp || (fsp == sp && ret == rth) {
                break;
            }
            // Stacks are ordered only within one stack: a handler on an
            // alternate stack above the thread's sees the frames it
            // interrupted below it.  Those are kept, and the frames pushed
            // on the alternate stack are dropped once the thread is off it.
            let alt = *alt.get_or_insert_with(|| match self.state.get() & SLOW_ALT {
                0 => crate::unwind::alt_stack(),
                _ => Some(self.alt.get()),
            });
            if let Some(r) = alt {
                if within(r, sp) && !within(r, fsp) {
                    self.alt.set(r);
                    self.state.set(self.state.get() | SLOW_ALT);
                    break;
                }
            }
            self.unhijack_dropped(f, sp, rth);
            self.pop(f);
            STALE.fetch_add(1, Relaxed);
        }
    }

    /// Before frame `f` is dropped as left without returning, at an entry
    /// or a return whose entry sp is `sp`: if its return slot still holds
    /// `rth` (x86_64: the word at its recorded sp), puts its real return
    /// address back there.  A frame dropped by the stack-pointer rule may
    /// belong to a context suspended on another stack by a switch the
    /// runtime did not see (assembly: Ruby's fibers, green threads): when
    /// it is resumed, the call then returns as untraced (no `ret` callback,
    /// the rule of context switches) instead of meeting `return_to_handler`
    /// with no frame left, which ended the program.  The slot is read and
    /// written with `process_vm_readv`/`writev` on this process, which fail
    /// instead of faulting if the stack was unmapped since.  Slots just
    /// below `sp`, where this thread's trampoline and runtime frames are
    /// now, are left alone (a frame there was left for good, by `longjmp`).
    ///
    /// Only while this thread is the only one with a shadow stack: then
    /// every `return_to_handler` in memory was written by this thread.
    /// With others, the stack of a coroutine that ended may have gone back
    /// to a pool and be running another thread's coroutine, whose own
    /// hijacked return can sit in the very same slot: writing this frame's
    /// return address there sent that thread's return into this thread's
    /// old caller (Ruby's test of 100 threads each resuming 1 000 fibers,
    /// which share one pool of fiber stacks, died in `rb_bug`).  Such a
    /// frame is only dropped, as before.  aarch64 keeps its return address
    /// in `x30`, saved wherever the function chose: nothing is done there.
    #[cold]
    fn unhijack_dropped(&self, f: Frame, sp: usize, rth: usize) {
        if !cfg!(target_arch = "x86_64") || LIVE_STACKS.load(Acquire) != 1 {
            return;
        }
        let slot = self.sp_of(f);
        let here = &slot as *const usize as usize;
        if (here.saturating_sub(OWN_FRAMES_BELOW)..=sp).contains(&slot) {
            return;
        }
        if self_read(slot) == Some(rth) {
            let _ = self_write(slot, self.ret_of(f));
            UNHIJACKED.fetch_add(1, Relaxed);
        }
    }

    /// [`resync_entry`](Shadow::resync_entry), and what the slow-path
    /// marks ask for.
    #[cold]
    fn resync_slow(&self, sp: usize, ret: usize) {
        if self.state.get() & SLOW == 0 {
            return self.resync_entry(sp, ret);
        }
        if self.state.get() & SLOW_ALT != 0 {
            let r = self.alt.get();
            if !within(r, sp) {
                // Off the alternate stack: its frames were left.
                while let Some(f) = self.top_frame() {
                    if !within(r, self.sp_of(f)) {
                        break;
                    }
                    self.pop(f);
                    STALE.fetch_add(1, Relaxed);
                }
                self.state.set(self.state.get() & !SLOW_ALT);
            }
        }
        self.resync_entry(sp, ret);
        if self.state.get() & SLOW_RESTORED != 0 {
            crate::unwind::lazy_rehijack(&ShadowFrames(self), sp, RETURN_TO_HANDLER.load(Relaxed));
        }
    }

    /// The top of the frame of a function returning with entry sp `sp`
    /// when it is not the top one: the innermost frame with that sp (the
    /// frames above it were left without returning and are dropped,
    /// whatever their sp: they may lie on another stack); `None` without
    /// one.  (No guess at a frame with another sp: its return address
    /// belongs to another call, and returning there would run the program
    /// on in the wrong place.)
    #[cold]
    #[inline(never)]
    fn resync_return(&self, sp: usize) -> Option<usize> {
        let left = self.frames().position(|f| self.sp_of(f) == sp)?;
        let rth = RETURN_TO_HANDLER.load(Relaxed);
        for _ in 0..left {
            let f = self.top_frame()?;
            self.unhijack_dropped(f, sp, rth);
            self.pop(f);
            STALE.fetch_add(1, Relaxed);
        }
        self.top_frame().map(|f| f.top)
    }
}

/// Bytes below the current frame that [`Shadow::unhijack_dropped`] leaves
/// alone besides the range up to the entry sp (red zones, a signal frame).
const OWN_FRAMES_BELOW: usize = 64 << 10;

/// The word at `addr` in this process, or `None` where nothing is mapped
/// (`process_vm_readv` on ourselves: no fault).
fn self_read(addr: usize) -> Option<usize> {
    let mut v = 0usize;
    let local = libc::iovec { iov_base: &mut v as *mut usize as *mut libc::c_void, iov_len: 8 };
    let remote = libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: 8 };
    // SAFETY: the kernel copies 8 bytes from `addr` of this process into
    // `v` (a local), or fails with EFAULT; it touches nothing else.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    (n == 8).then_some(v)
}

/// Writes the word `v` at `addr` in this process; false where nothing
/// writable is mapped (`process_vm_writev` on ourselves: no fault).
fn self_write(addr: usize, v: usize) -> bool {
    let local = libc::iovec { iov_base: &v as *const usize as *mut libc::c_void, iov_len: 8 };
    let remote = libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: 8 };
    // SAFETY: the kernel copies the 8 bytes of `v` to `addr` of this
    // process, or fails; the callers pass the return slot of a frame this
    // thread hijacked and dropped (a word that held `return_to_handler`
    // just before), outside this thread's live frames.
    let n = unsafe { libc::process_vm_writev(libc::getpid(), &local, 1, &remote, 1, 0) };
    n == 8
}

fn within(r: (usize, usize), a: usize) -> bool {
    r.0 <= a && a < r.1
}

/// A thread's shadow stack as `unwind.rs` sees it.
struct ShadowFrames<'a>(&'a Shadow);

impl crate::unwind::Frames for ShadowFrames<'_> {
    fn each(&self, f: &mut dyn FnMut(usize, usize, usize) -> bool) {
        for fr in self.0.frames() {
            if !f(fr.fb, self.0.ret_of(fr), self.0.sp_of(fr)) {
                break;
            }
        }
    }
    fn ip_of(&self, base: usize) -> usize {
        self.0.frames().find(|f| f.fb == base).map_or(0, |f| self.0.get(f.top - word::FUNC) as usize)
    }
    fn drop_innermost(&self) {
        if let Some(f) = self.0.top_frame() {
            self.0.pop(f);
            STALE.fetch_add(1, Relaxed);
        }
    }
    fn drop_all(&self) {
        while self.0.top_frame().is_some() {
            self.drop_innermost();
        }
    }
    fn set_restored(&self, on: bool) {
        let s = self.0.state.get();
        self.0.state.set(if on { s | SLOW_RESTORED } else { s & !SLOW_RESTORED });
    }
}

/// For the unwinder hooks: runs `f` with this thread's frames and the
/// `return_to_handler` address while the thread is marked busy (its traced
/// calls go untraced meanwhile).  `None` when the thread has no shadow
/// stack or is inside fgraph.
pub(crate) fn with_thread_frames<R>(f: impl FnOnce(&dyn crate::unwind::Frames, usize) -> R) -> Option<R> {
    let sh = shadow();
    if sh.len.get() == 0 || sh.state.get() & BUSY != 0 {
        return None;
    }
    sh.state.set(sh.state.get() | BUSY);
    let r = f(&ShadowFrames(sh), RETURN_TO_HANDLER.load(Relaxed));
    sh.state.set(sh.state.get() & !BUSY);
    Some(r)
}

/// This thread's [`Shadow`], as a plain reference so that the hot paths
/// inline into the trampolines' callees.
#[inline(always)]
fn shadow() -> &'static Shadow {
    &crate::thread::this().shadow
}

/// The user in `slot`, if still registered and registered at or before
/// `epoch`.
#[inline(always)]
fn user_at(slot: usize, epoch: u32) -> Option<&'static Fgraph> {
    let slot = slot % MAX_USERS;
    let p = SLOTS[slot].load(Acquire);
    if p.is_null() || SLOT_EPOCH[slot].load(Relaxed).wrapping_sub(epoch) as i32 > 0 {
        return None;
    }
    // SAFETY: the registry owns the Arc while the slot is set, and frees it
    // only after a grace period; this thread is inside dispatch (the
    // caller's DispatchGuard) while it uses the reference.
    Some(unsafe { &*p })
}

/// The users tracing site `ip` (several users).
fn mask_of(ip: usize) -> u16 {
    let t = MASKS.load(Acquire);
    let all = ALL_MASK.load(Relaxed);
    if t.is_null() {
        return all;
    }
    // SAFETY: published tables are freed only after a grace period, and
    // the caller is inside dispatch.
    let t = unsafe { &*t };
    t.binary_search_by_key(&ip, |e| e.0).map(|i| t[i].1).unwrap_or(all)
}

/// The internal ops' callback, called by the trampolines directly (a raw
/// entry: it enters dispatch itself and never reads `op`): push a frame,
/// call the entry callbacks.  [`push`] is inlined (one call level and its
/// register saves fewer, 10 instructions per traced call), and the rare
/// cases stay out of line ([`push_slow`], [`call_entries`]), so that the
/// whole function stays within the [`crate::dispatch::THUNK_CODE`] bytes
/// the grace period treats as dispatch code (a thread before the guard's
/// increment or after its decrement still returns into a trampoline that
/// must not be freed; a test checks the size on every arch).
pub(crate) extern "C" fn graph_entry(ip: usize, _parent: usize, _op: &Ops, fregs: &mut FtraceRegs) {
    let g = DispatchGuard::enter_at(|| fregs.stack_pointer());
    push(&g.thread().shadow, ip, fregs);
}

/// [`graph_entry`] as the list function calls it, inside its guard.
extern "C" fn graph_entry_listed(ip: usize, _parent: usize, _op: &Ops, fregs: &mut FtraceRegs) {
    push(shadow(), ip, fregs);
}

/// A dispatch section of this thread was left by a jump ([`crate::grace`]):
/// fgraph was interrupted there (push, pop or a callback) and will not
/// finish, so its busy mark goes, and the depth is counted again from the
/// frames (`top` moves in one store, the depth in the next: the jump may
/// have come between).  A frame it was building is not on the stack yet;
/// one it pushed or was popping is left to the stack-pointer rule (dropped
/// at the next entry above it).
pub(crate) fn dispatch_left() {
    let sh = shadow();
    sh.state.set(sh.state.get() & !BUSY);
    sh.depth.set(sh.frames().count());
}

/// Whether a thread's shadow stack could be had ([`Shadow::ensure`]).
enum Ensured {
    Ready,
    /// The thread is exiting: its exit hooks have run, or cannot be arranged.
    Exiting,
    /// No mapping could be made.
    NoRoom,
}

/// Counts a call left untraced for want of room, and leaves.
#[cold]
#[inline(never)]
fn miss(sh: &Shadow) {
    sh.misses.set(sh.misses.get() + 1);
    MISSES.fetch_add(1, Relaxed);
    sh.state.set(sh.state.get() & !BUSY);
}

/// Everything [`push`]'s fast path leaves out: the recursion guard, the
/// thread's first call, frames to drop, the slow-path marks, a full stack.
/// Marks the thread busy and returns true when the call is to be traced
/// (with `top` the new frame's base).
#[cold]
#[inline(never)]
fn push_slow(sh: &Shadow, sp: usize, ret: usize) -> bool {
    if sh.state.get() & BUSY != 0 {
        RECURSION_MISSES.fetch_add(1, Relaxed);
        return false;
    }
    sh.state.set(sh.state.get() | BUSY);
    if sh.len.get() == 0 {
        match sh.ensure() {
            Ensured::Ready => {}
            Ensured::Exiting => {
                EXIT_MISSES.fetch_add(1, Relaxed);
                sh.state.set(sh.state.get() & !BUSY);
                return false;
            }
            Ensured::NoRoom => {
                miss(sh);
                return false;
            }
        }
    }
    let stale = match sh.top_frame() {
        Some(f) => {
            let tsp = sh.sp_of(f);
            tsp < sp || (tsp == sp && ret != RETURN_TO_HANDLER.load(Relaxed))
        }
        None => false,
    };
    if stale || sh.state.get() & SLOW != 0 {
        sh.resync_slow(sp, ret);
    }
    if sh.top.get() + word::FIXED > sh.len.get() {
        miss(sh);
        return false;
    }
    true
}

/// The entry: the common case (not busy, no marks, room, the top frame's
/// sp above this call's) tests one byte, one bound and one word.  The
/// frame's fixed words are written before the callbacks, at the data
/// cursor (the reservations move them up, see [`GraphEnt::reserve`]), so
/// that only the FRAME header is left for after them.
#[inline(always)]
fn push(sh: &Shadow, ip: usize, fregs: &mut FtraceRegs) {
    let sp = fregs.stack_pointer();
    let ret = fregs.return_address();
    let top = sh.top.get();
    // The sentinel below the first frame makes `top - SP` readable
    // whenever the stack exists (`len` is 0 otherwise).
    let fast = sh.state.get() == 0 && top + word::FIXED <= sh.len.get() && {
        let tsp = sh.get(top - word::SP) as usize;
        tsp > sp || (tsp == sp && ret == RETURN_TO_HANDLER.load(Relaxed))
    };
    if fast {
        sh.state.set(BUSY);
    } else if !push_slow(sh, sp, ret) {
        return;
    }
    // The new frame's base (push_slow may have dropped frames); `top`
    // stays there until the frame is complete.
    let fb = sh.top.get();
    let calltime = if TIMESTAMPS.load(Relaxed) { clock::ticks() } else { 0 };
    // At `top - n` of a frame without data.
    let w = sh.stack.get();
    debug_assert!(fb + word::FIXED <= sh.len.get());
    // SAFETY: `fb + FIXED <= len`, checked above (fast or slow); one load
    // of the base, as the stores cannot change it.
    unsafe {
        w.add(fb + word::FIXED - word::CALLTIME).write(calltime);
        w.add(fb + word::FIXED - word::FUNC).write(ip as u64);
        w.add(fb + word::FIXED - word::RET).write(ret as u64);
        w.add(fb + word::FIXED - word::SP).write(sp as u64);
    }
    sh.cur.set(fb);
    let epoch = EPOCH.load(Relaxed);
    let ent = GraphEnt { func: ip, depth: sh.depth.get(), shadow: sh };
    let want = match SINGLE.load(Acquire) {
        0 => call_entries(sh, &ent, fregs, epoch),
        s => {
            // (Data a lone user reserved is dropped with the frame when it
            // does not want the return.)
            let slot = (s - 1) % MAX_USERS;
            match user_at(slot, epoch) {
                Some(u) => {
                    sh.cur_user.set(slot);
                    ((u.entry)(&ent, u, fregs) as u16) << slot
                }
                None => 0,
            }
        }
    };
    if want != 0 {
        // Room: checked above for a frame without data, and by `reserve`
        // for each block with the fixed words after it.
        let hd = sh.cur.get() + word::FIXED - 1;
        sh.set(hd, word::frame(hd - sh.top.get(), want, epoch));
        sh.top.set(hd + 1);
        sh.depth.set(sh.depth.get() + 1);
        fregs.set_return_address(RETURN_TO_HANDLER.load(Relaxed));
    }
    sh.state.set(sh.state.get() & !BUSY);
}

/// The entry callbacks of several users: the bitmap of those that want
/// the return.
#[inline(never)]
fn call_entries(sh: &Shadow, ent: &GraphEnt, fregs: &mut FtraceRegs, epoch: u32) -> u16 {
    let mut want = 0u16;
    let mut m = mask_of(ent.func);
    while m != 0 {
        let slot = m.trailing_zeros() as usize;
        m &= m - 1;
        if let Some(u) = user_at(slot, epoch) {
            let mark = sh.cur.get();
            sh.cur_user.set(slot);
            if (u.entry)(ent, u, fregs) {
                want |= 1 << slot;
            } else if sh.cur.get() != mark {
                // Its data is not needed: the fixed words move back down.
                sh.move_fixed(sh.cur.get(), mark);
                sh.cur.set(mark);
            }
        }
    }
    want
}

impl GraphEnt {
    /// The calling thread's task variable of `user` (the user whose
    /// callback got this record), as [`Fgraph::with_task_var`] but without
    /// a thread-local lookup: the record knows its thread.
    #[inline]
    pub fn task_var(&self, user: &Fgraph) -> Option<&Cell<u64>> {
        user.task_var_in(self.sh())
    }

    #[inline(always)]
    fn sh(&self) -> &Shadow {
        // SAFETY: `shadow` is the calling thread's block, which lives until
        // the thread is gone; the record is not Send (raw pointer) and lives
        // only during the callback on that thread.
        unsafe { &*self.shadow }
    }

    /// Reserves `size` (≤ [`DATA_MAX`]) bytes on the shadow stack for this
    /// call, zeroed, which the same user finds in its return callback
    /// ([`GraphRet::retrieve_data`]).  Only valid inside an entry callback;
    /// `None` when there is no room (or outside one).
    #[allow(clippy::mut_from_ref)]
    pub fn reserve_data(&self, size: usize) -> Option<&mut [u8]> {
        let at = self.reserve_at(size)?;
        let sh = self.sh();
        for i in 0..word::data_words(size) {
            sh.set(at + i, 0);
        }
        // Reserved above for this call and never handed out twice; it lives
        // until the frame is popped, after the return callbacks, and the
        // borrow is tied to `self`, which lives only during the entry
        // callback.
        Some(sh.block((at, size)))
    }

    /// [`reserve_data`](GraphEnt::reserve_data) without the zeroing (the
    /// words hold what the stack held, initialised memory) and for the
    /// runtime's own entry callbacks only (fprobe's): `0 < size <=
    /// DATA_MAX`, called from an entry callback, so only the room is
    /// checked.  The block's first word, valid for `size` bytes until the
    /// frame is popped (after the return callbacks) or dropped.
    #[inline(always)]
    pub(crate) fn reserve(&self, size: usize) -> Option<*mut u64> {
        debug_assert!(size != 0 && size <= DATA_MAX);
        debug_assert!(self.sh().state.get() & BUSY != 0 && self.sh().cur.get() >= self.sh().top.get());
        self.place(size).map(|at| self.sh().ptr(at))
    }

    #[inline(always)]
    fn reserve_at(&self, size: usize) -> Option<usize> {
        // Only between push's setting `cur` and the frame's completion
        // (`cur` at or above `top`: elsewhere it would reach into complete
        // frames).
        let sh = self.sh();
        if size == 0 || size > DATA_MAX || sh.state.get() & BUSY == 0 || sh.cur.get() < sh.top.get() {
            return None;
        }
        self.place(size)
    }

    /// Puts a block of `size` bytes at the data cursor, if the header, the
    /// block and the fixed words after it fit (which keeps every write
    /// inside the stack): its first word's index.
    #[inline(always)]
    fn place(&self, size: usize) -> Option<usize> {
        let sh = self.sh();
        let at = sh.cur.get();
        let next = at + 1 + word::data_words(size);
        if next + word::FIXED > sh.len.get() {
            return None;
        }
        // The fixed words move up past the block.
        sh.move_fixed(at, next);
        sh.set(at, word::data(size, sh.cur_user.get()));
        sh.cur.set(next);
        Some(at + 1)
    }
}

impl GraphRet {
    #[inline(always)]
    fn sh(&self) -> &Shadow {
        // SAFETY: as in GraphEnt::sh.
        unsafe { &*self.shadow }
    }

    /// The data this user reserved at entry (the first block), or `None`.
    /// Only valid inside a return callback.
    #[allow(clippy::mut_from_ref)]
    pub fn retrieve_data(&self) -> Option<&mut [u8]> {
        let sh = self.sh();
        sh.ret_blocks().next().map(|b| sh.block(b))
    }

    /// As [`GraphEnt::task_var`].
    #[inline]
    pub fn task_var(&self, user: &Fgraph) -> Option<&Cell<u64>> {
        user.task_var_in(self.sh())
    }

    /// Calls `f` with each block this user reserved at entry, in
    /// reservation order (one walk of the frame; fprobe's exit).
    pub fn for_each_data(&self, mut f: impl FnMut(&mut [u8])) {
        let sh = self.sh();
        for b in sh.ret_blocks() {
            f(sh.block(b));
        }
    }

    /// The returning call's one data block, when the frame holds exactly
    /// one and it is this user's: its first word and size in bytes (valid
    /// until the callback returns).  fprobe's exit fast path: no walk.
    #[inline(always)]
    pub(crate) fn only_block(&self) -> Option<(*mut u64, usize)> {
        let sh = self.sh();
        // The frame returned from is the top one (nothing is pushed while
        // busy); it exists, so `top_frame`'s empty-stack test is skipped.
        let top = sh.top.get();
        let f = Frame { fb: top - 1 - word::off(sh.get(top - 1)), top };
        let w = sh.get(f.fb);
        let size = word::off(w);
        let only = word::kind(w) == word::TYPE_DATA && word::user(w) == sh.cur_user.get() && f.fb + 1 + word::data_words(size) == f.top - word::FIXED;
        only.then(|| (sh.ptr(f.fb + 1), size))
    }

    /// [`for_each_data`](GraphRet::for_each_data) with the blocks' first
    /// words and sizes in bytes (valid until the callback returns).
    #[inline(always)]
    pub(crate) fn for_each_block(&self, mut f: impl FnMut(*mut u64, usize)) {
        let sh = self.sh();
        for (at, size) in sh.ret_blocks() {
            f(sh.ptr(at), size);
        }
    }

    /// The real return address of the returning call (what the entry saw
    /// as `fregs.return_address()`).
    #[inline(always)]
    pub(crate) fn ret_ip(&self) -> usize {
        let sh = self.sh();
        sh.get(sh.top.get() - word::RET) as usize
    }

    /// The `n`-th block (0: the first, as [`GraphRet::retrieve_data`]) this
    /// user reserved at entry, in reservation order, or `None`.  Only valid
    /// inside a return callback.
    #[allow(clippy::mut_from_ref)]
    pub fn retrieve_data_nth(&self, n: usize) -> Option<&mut [u8]> {
        let sh = self.sh();
        sh.ret_blocks().nth(n).map(|b| sh.block(b))
    }
}

/// Called by `return_to_handler` with the traced function's return
/// registers: pops the frame, calls the return callbacks, returns the real
/// return address.
pub extern "C" fn ftrace_return_to_handler(fregs: &mut FtraceRegs) -> usize {
    // The returning function's sp at its entry.
    let sp = fregs.stack_pointer().wrapping_sub(RET_SP_DELTA);
    let g = DispatchGuard::enter_at(|| sp);
    pop_return(&g.thread().shadow, fregs, sp)
}

#[cold]
fn fatal(msg: &[u8]) -> ! {
    // SAFETY: write(2) of a static buffer; async-signal-safe.
    unsafe { libc::write(2, msg.as_ptr() as *const libc::c_void, msg.len()) };
    std::process::abort()
}

/// The return: the common case (not busy, no marks, the top frame is the
/// returning call's) keeps nothing but the thread's block in registers
/// across the callbacks; the rest is in [`pop_slow`].
#[inline(always)]
fn pop_return(sh: &Shadow, fregs: &mut FtraceRegs, sp: usize) -> usize {
    let top = sh.top.get();
    // (With no frame, the sentinel's u64::MAX never matches.)
    if sh.state.get() != 0 || sh.get(top - word::SP) as usize != sp {
        return pop_slow(sh, fregs, sp);
    }
    sh.state.set(BUSY);
    let ret = pop_frame(sh, fregs);
    // Nothing changes the state while busy.
    sh.state.set(0);
    ret
}

/// [`pop_return`] when the thread is marked (busy, slow-path marks) or the
/// frame returned from is not the top one (frames above it were left
/// without returning).
#[cold]
#[inline(never)]
fn pop_slow(sh: &Shadow, fregs: &mut FtraceRegs, sp: usize) -> usize {
    let state = sh.state.get();
    sh.state.set(state | BUSY);
    if sh.get(sh.top.get() - word::SP) as usize != sp && sh.resync_return(sp).is_none() {
        fatal(b"ftramp fgraph: a hijacked return found no shadow-stack frame (a stack switch the runtime did not see?)\n");
    }
    let ret = pop_frame(sh, fregs);
    sh.state.set(state);
    ret
}

/// Calls the return callbacks of the top frame, pops it, returns its real
/// return address.
#[inline(always)]
fn pop_frame(sh: &Shadow, fregs: &mut FtraceRegs) -> usize {
    let top = sh.top.get();
    let head = sh.get(top - 1);
    let mut rec = GraphRet { func: sh.get(top - word::FUNC) as usize, depth: sh.depth.get() - 1, calltime: 0, rettime: 0, shadow: sh };
    // A frame pushed with a time gets one at return.
    let calltime = sh.get(top - word::CALLTIME);
    if calltime != 0 {
        (rec.calltime, rec.rettime) = clock::ticks_pair_to_ns(calltime, clock::ticks());
    }
    // (A complete frame's bitmap is never 0.)
    let m = word::bitmap(head);
    if m & m.wrapping_sub(1) == 0 {
        let slot = m.trailing_zeros() as usize;
        if let Some(u) = user_at(slot, word::epoch(head)) {
            sh.cur_user.set(slot);
            (u.ret)(&rec, u, fregs);
        }
    } else {
        call_rets(sh, &rec, fregs, head);
    }
    // The frame is still the top one (nothing is pushed while busy); `top`
    // is read again rather than kept across the callbacks (one register
    // fewer to save).
    let top = sh.top.get();
    let ret = sh.get(top - word::RET) as usize;
    sh.top.set(top - 1 - word::off(head));
    sh.depth.set(sh.depth.get() - 1);
    ret
}

/// The return callbacks of several users (FRAME header `head`).
#[inline(never)]
fn call_rets(sh: &Shadow, rec: &GraphRet, fregs: &mut FtraceRegs, head: u64) {
    let epoch = word::epoch(head);
    let mut m = word::bitmap(head);
    while m != 0 {
        let slot = m.trailing_zeros() as usize;
        m &= m - 1;
        if let Some(u) = user_at(slot, epoch) {
            sh.cur_user.set(slot);
            (u.ret)(rec, u, fregs);
        }
    }
}

/// This thread's shadow-stack depth (frames pushed and not yet popped).
pub fn depth() -> usize {
    shadow().depth.get()
}

/// Calls this thread left untraced because its shadow stack was full.
pub fn thread_misses() -> u64 {
    shadow().misses.get()
}

/// For unwinders: the real return address behind `ret` for the traced
/// call whose stack pointer at entry was `entry_sp` (x86_64: the address of
/// the return-address slot; aarch64: the CFA), on this thread.  `ret` is
/// returned unchanged when it is not `return_to_handler` or no frame
/// matches.
pub fn ret_addr(ret: usize, entry_sp: usize) -> usize {
    if ret == 0 || ret != RETURN_TO_HANDLER.load(Relaxed) {
        return ret;
    }
    let sh = shadow();
    sh.frames().find(|f| sh.sp_of(*f) == entry_sp).map(|f| sh.ret_of(f)).unwrap_or(ret)
}

/// For backtraces walking outwards: the real return address of the
/// `*idx`-th hijacked return met so far (start with `*idx = 0`; each call
/// that resolves `return_to_handler` advances it).
pub fn ret_addr_nth(idx: &mut usize, ret: usize) -> usize {
    if ret == 0 || ret != RETURN_TO_HANDLER.load(Relaxed) {
        return ret;
    }
    let sh = shadow();
    match sh.frames().nth(*idx).map(|f| sh.ret_of(f)) {
        Some(r) => {
            *idx += 1;
            r
        }
        None => ret,
    }
}

/// Tests: [`register_fgraph`] finds a shadow stack (no machine here has one).
#[cfg(test)]
static PRETEND_SHADOW_STACK: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

#[inline(always)]
fn pretend_shadow_stack() -> bool {
    #[cfg(test)]
    return PRETEND_SHADOW_STACK.load(Relaxed);
    #[cfg(not(test))]
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    extern "C" fn entry(_: &GraphEnt, _: &Fgraph, _: &mut FtraceRegs) -> bool {
        true
    }
    extern "C" fn ret(_: &GraphRet, _: &Fgraph, _: &mut FtraceRegs) {}

    #[test]
    fn a_shadow_stack_refuses_registration_before_anything_is_set_up() {
        PRETEND_SHADOW_STACK.store(true, Relaxed);
        let r = register_fgraph(Arc::new(Fgraph::new(entry, ret)));
        PRETEND_SHADOW_STACK.store(false, Relaxed);
        let e = r.expect_err("refused");
        assert!(matches!(e, FgraphError::ShadowStack), "{e}");
        assert!(e.to_string().contains("GLIBC_TUNABLES=glibc.cpu.hwcaps=-SHSTK"), "{e}");
        assert_eq!(registry().users.iter().flatten().count(), 0, "nothing registered");
        assert_eq!(RETURN_TO_HANDLER.load(Relaxed), 0, "no trampoline made");
    }

    /// The kernel enables a user shadow stack only on a CPU whose flags
    /// list `user_shstk`: elsewhere the query must say no (a wrong answer
    /// would refuse fgraph everywhere).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn no_shadow_stack_where_the_cpu_has_none() {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap();
        let flags = cpuinfo.lines().find(|l| l.starts_with("flags")).unwrap();
        if !flags.split_whitespace().any(|f| f == "user_shstk") {
            assert!(!crate::thread::shadow_stack_enabled());
        }
    }
}
