//! Exceptions, panics, `pthread_exit` and context switches through hijacked
//! returns: hooks on the unwinder's entry points and their kin.
//!
//! [`fgraph`](crate::fgraph) points a traced function's return address at
//! `return_to_handler`.  The unwinder (libgcc's `_Unwind_RaiseException`,
//! `_Unwind_Resume`, `_Unwind_Resume_or_Rethrow`, `_Unwind_ForcedUnwind`:
//! C++ `throw`, Rust panics, cleanups) walks the stack by return addresses,
//! finds no FDE for `return_to_handler` and gives up (`std::terminate`,
//! abort).  The runtime is a library linked into the program, not an
//! `LD_PRELOAD`, so these entry points are hooked where every module calls
//! them: its GOT.
//!
//! # Hooking
//!
//! [`install`] parses the `PT_DYNAMIC` of every loaded module in memory
//! (`DT_JMPREL`/`DT_PLTRELSZ`, `DT_RELA`/`DT_RELASZ`, `DT_SYMTAB`,
//! `DT_STRTAB`) and rewrites the GOT slots of the `JUMP_SLOT` and
//! `GLOB_DAT` relocations that name one of [`HOOKED`] to point at a hook
//! here (RELRO pages are made writable for the write and restored, with
//! the patcher's protection helpers).  A slot is rewritten only when it
//! holds the definition `dlsym(RTLD_DEFAULT)` finds or a lazy-binding stub
//! of the module itself; a slot bound to another definition is left alone.
//! fgraph calls [`install`] when a user registers, and the ops engine's
//! module watcher calls [`rescan`] after `dlopen`s (within
//! [`MODULE_WATCH_INTERVAL`](crate::ftrace::MODULE_WATCH_INTERVAL)).  Hooks
//! stay for the life of the process: hijacked returns may be pending after
//! the last user is gone, and a hook on a thread without frames only calls
//! through.
//!
//! # Restore, then re-hijack
//!
//! Each hook is entered through a two-instruction stub that adds its
//! caller's stack pointer as an argument.  Before calling the real
//! function it **restores** the real return address of every frame of this
//! thread's shadow stack entered above that sp (frames at or below it were
//! unwound already: a landing pad calls `_Unwind_Resume` at the sp of its
//! call that threw), remembers where it wrote (a per-thread table: frame
//! base, entry sp, real return address, slot) and marks the thread
//! *restored*.  Where the slot is:
//!
//! * x86_64: the return address is at the frame's recorded entry sp.
//! * aarch64: `x30` was saved by the function's prologue somewhere in its
//!   own frame, between the next inner traced frame's entry sp (the hook's
//!   caller's sp for the innermost) and this frame's entry sp.  The frame-pointer
//!   chain (frame records `{x29, x30}`, which GCC keeps by default) is
//!   walked first; a record inside that range whose `x30` is
//!   `return_to_handler` is the slot.  Without one, every word of the range
//!   holding `return_to_handler` is restored (a stale copy in dead or
//!   uninitialised memory is harmless to rewrite, and is put back
//!   afterwards).  A frame with no such word is counted
//!   ([`unrestored_frames`]): the unwinder would stop there.
//!
//! The slots live in that side table rather than in a word of each
//! shadow-stack frame: they are needed only from a hook to the re-hijack,
//! so frames keep their size and the entry path stores nothing more.
//!
//! The unwinder then sees the program's own return addresses.  Frames it
//! unwinds are gone; those that survive are **re-hijacked** (the slot gets
//! `return_to_handler` again, but only if it still holds the frame's real
//! return address, so a reused slot is never written):
//!
//! * when the real function returns (no handler found,
//!   `_Unwind_Backtrace`): every frame survived;
//! * at `__cxa_begin_catch`, which the catching frame's landing pad calls
//!   directly: frames whose entry sp is above the landing pad's sp (the
//!   caller's sp, passed by a two-instruction stub) survived, the others
//!   were unwound and are dropped;
//! * otherwise (a cleanup landing pad calling traced functions, a Rust
//!   panic caught by `catch_unwind`) lazily, at the thread's next traced
//!   entry: fgraph first drops the frames below the new call (they were
//!   left, as after a `longjmp`) and re-hijacks those above it.  A canary
//!   in the hook's frame tells whether the unwinder may still be running
//!   (a signal handler calling traced functions meanwhile): then nothing is
//!   re-hijacked yet.
//!
//! Rule for callbacks: frames unwound by an exception or panic are dropped
//! without a `ret` callback (counted in [`fgraph::stale_frames`]), as after a
//! `longjmp`; frames that survive get their `ret` callback when they return,
//! except a surviving frame that returns before any re-hijack (a Rust frame
//! caught a panic and the traced C caller returns with no traced call in
//! between): its return goes straight to the caller and its frame is
//! dropped later, without callback.  In the rare case where such a dropped
//! frame's slot is reused by a call from the same call site, that call's
//! return is reported under the old frame's function; the return address
//! is right either way.
//!
//! # pthread_exit
//!
//! glibc unwinds an exiting thread with `_Unwind_ForcedUnwind`, which it
//! reaches through `dlsym` (no GOT slot to hook), so `pthread_exit` itself
//! is hooked: it restores like `_Unwind_Resume` and never returns.
//!
//! # Context switches
//!
//! `swapcontext` and `setcontext`, and Boost.Context's `jump_fcontext` and
//! `ontop_fcontext` (which Boost's fibers, continuations, Coroutine2 and
//! Fiber reach through the PLT), leave the stack the shadow stack is in
//! step with.  Their hooks (`leave_stack`) restore every frame — on the
//! current stack above the caller, plus a traced function that tail-called
//! the switch, whose return address is the hook's own (a stub passes where
//! it is) — and drop them all: a frame active at a context switch gets no
//! `ret` callback, and the next stack starts with an empty shadow stack.
//!
//! # An FDE for `return_to_handler`
//!
//! An unwind that starts where no hook sees it (`pthread_cancel`: the
//! cancelled thread starts its forced unwind inside libc; an unwinder
//! reached through `dlsym`) still meets hijacked returns.  For those,
//! [`register_return_fde`] registers with the unwinder (`__register_frame`;
//! at the program's first `pthread_cancel`, which is hooked for this, as
//! the registration slows every unwind down a little, see there)
//! an FDE covering the return address `return_to_handler` (and the byte
//! before it, which the unwinder looks up for a return address): a frame
//! of size 0 whose personality routine restores like a hook does, before
//! the unwinder reads the next return address.  That return address is the
//! value of the return-address register as the frame below saved it (x86_64:
//! its slot on the stack; aarch64: where the function saved `x30`), read
//! again after the restore, so it is the real one; while it is still
//! `return_to_handler` (a walk that calls no personality, such as an
//! unhooked `_Unwind_Backtrace`) the rule yields 0, the end of the stack, so
//! no walk loops.
//!
//! Not covered: modules linked statically with the unwinder,
//! `dlopen`ed modules that throw before the module watcher hooked them,
//! and stack switches that do not go through the functions above (other
//! hand-written assembly: libaco's, libco's).
//!
//! [`fgraph::stale_frames`]: crate::fgraph::stale_frames

// Hooks exist on the arches with live patching only.
#![cfg_attr(not(any(target_arch = "x86_64", target_arch = "aarch64")), allow(dead_code))]

use crate::patch::protect::{Maps, Writable};
use crate::sites::loaded::{with_loaded, Key, Live};
use crate::RuntimeError;
use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::*};
use std::sync::Mutex;

/// The hooked functions that start a walk of the stack or switch stacks
/// (the others, `_Unwind_Resume` and `__cxa_begin_catch`, continue or end
/// one a hooked start began): a module that imports one of them must be
/// hooked before traced code can reach it.
pub(crate) const STARTERS: [&str; 11] = [
    "_Unwind_RaiseException",
    "_Unwind_Resume_or_Rethrow",
    "_Unwind_ForcedUnwind",
    "_Unwind_Backtrace",
    "backtrace",
    "swapcontext",
    "setcontext",
    "pthread_exit",
    "pthread_cancel",
    "jump_fcontext",
    "ontop_fcontext",
];

/// The functions hooked, in `Entry` order.
pub const HOOKED: [&str; 13] = [
    "_Unwind_RaiseException",
    "_Unwind_Resume",
    "_Unwind_Resume_or_Rethrow",
    "_Unwind_ForcedUnwind",
    "_Unwind_Backtrace",
    "__cxa_begin_catch",
    "swapcontext",
    "setcontext",
    "pthread_exit",
    "pthread_cancel",
    "backtrace",
    "jump_fcontext",
    "ontop_fcontext",
];

#[derive(Clone, Copy)]
#[repr(usize)]
enum Entry {
    Raise,
    Resume,
    ResumeOrRethrow,
    Forced,
    Backtrace,
    BeginCatch,
    SwapContext,
    SetContext,
    PthreadExit,
    PthreadCancel,
    GlibcBacktrace,
    JumpFcontext,
    OntopFcontext,
}

/// The real functions (0: not found in this process).
static REAL: [AtomicUsize; HOOKED.len()] = [const { AtomicUsize::new(0) }; HOOKED.len()];
static HOOKED_SLOTS: AtomicUsize = AtomicUsize::new(0);
static UNRESTORED: AtomicU64 = AtomicU64::new(0);
static RESTORES: AtomicU64 = AtomicU64::new(0);

/// What the hooks need of fgraph: a thread's shadow stack, while the thread
/// is marked busy (its traced calls are not traced meanwhile, so nothing
/// else changes it).
pub(crate) trait Frames {
    /// `f(base, real return address, entry sp)` for each complete frame,
    /// innermost first, until `f` returns false.
    fn each(&self, f: &mut dyn FnMut(usize, usize, usize) -> bool);
    /// The traced function's patch site of the frame at `base` (0: none).
    fn ip_of(&self, base: usize) -> usize;
    /// Drops the innermost frame (counted as stale).
    fn drop_innermost(&self);
    /// Drops every frame (counted as stale).
    fn drop_all(&self);
    /// The thread's *restored* mark.
    fn set_restored(&self, on: bool);
}

// ---------------------------------------------------------------------------
// Counters.

/// GOT slots pointed at a hook so far (all modules).
pub fn hooked_slots() -> usize {
    HOOKED_SLOTS.load(Relaxed)
}

/// Frames whose return slot could not be found when restoring (aarch64
/// only): an unwinder reaching them stops there.
pub fn unrestored_frames() -> u64 {
    UNRESTORED.load(Relaxed)
}

/// Times a hook restored at least one frame (all threads).
pub fn restores() -> u64 {
    RESTORES.load(Relaxed)
}

// ---------------------------------------------------------------------------
// Installing the hooks.

struct Installed {
    /// Modules whose every matching slot is settled (hooked, or bound
    /// elsewhere).
    done: HashSet<Key>,
    /// The loader's counters at the last pass, and whether some module was
    /// left unsettled (not relocated yet, or an error).
    generation: Option<(u64, u64)>,
    pending: bool,
}

static INSTALLED: Mutex<Option<Installed>> = Mutex::new(None);

/// Hooks the unwinder's entry points in every loaded module (idempotent;
/// also hooks modules loaded since the last call).  Returns the number of
/// GOT slots pointing at a hook.
pub fn install() -> Result<usize, RuntimeError> {
    if !SUPPORTED {
        return Ok(0);
    }
    crate::ftrace::on_modules_changed(rescan);
    let mut g = INSTALLED.lock().unwrap_or_else(|e| e.into_inner());
    let st = g.get_or_insert_with(|| Installed { done: HashSet::new(), generation: None, pending: false });
    // Only the functions some module still to settle imports are looked
    // up: a lookup that fails makes glibc allocate its error message with
    // the allocator the loader was given, which is the program's `malloc`
    // when the program defines one (bash).  A C program imports none of
    // the C++ runtime's functions or Boost.Context's, and each of its
    // `dlopen`s looked all 7 up again: 3 program `malloc` and 6 `free`
    // calls per library loaded, made on the module watcher's thread into
    // an allocator the program wrote for one thread, and recorded as the
    // program's own.  (A successful lookup allocates nothing.)
    let mut wanted = pending_imports(st);
    let mut imported = [false; HOOKED.len()];
    for &(_, e) in wanted.iter().flat_map(|m| &m.slots) {
        imported[e] = true;
    }
    // dlsym takes the loader lock: outside `with_loaded`.
    for (i, name) in HOOKED.iter().enumerate() {
        if imported[i] && REAL[i].load(Relaxed) == 0 {
            let c = std::ffi::CString::new(*name).expect("no NUL in the names");
            // SAFETY: dlsym with a NUL-terminated name only looks it up.
            let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c.as_ptr()) } as usize;
            REAL[i].store(p, Release);
        }
    }
    if imported.iter().zip(&REAL).any(|(&i, r)| i && r.load(Relaxed) == 0) {
        resolve_in_local_scopes(&wanted);
    }
    let real: Vec<usize> = REAL.iter().map(|r| r.load(Acquire)).collect();
    let hooks = hook_addrs();
    let maps = Maps::read()?;
    let (generation, result) = with_loaded(|set| {
        let mut result = Ok(());
        st.pending = false;
        for live in set.iter() {
            if st.done.contains(&live.obj.key()) {
                continue;
            }
            // (Each module's slots found once per pass: by the first one,
            // unless it came since.)
            let key = live.obj.key();
            let slots = match wanted.iter().position(|m| m.key == key) {
                Some(i) => wanted.swap_remove(i).slots,
                None => find_slots(&live),
            };
            match hook_module(live, &slots, &real, &hooks, &maps) {
                Ok(true) => {
                    st.done.insert(live.obj.key());
                }
                Ok(false) => st.pending = true,
                Err(e) => {
                    st.pending = true;
                    let name = if live.obj.is_main { "the main program".into() } else { String::from_utf8_lossy(&live.obj.name).into_owned() };
                    result = Err(RuntimeError::BadPatch { addr: live.obj.bias, why: format!("hooking the unwinder in the GOT of {name}: {e}") });
                }
            }
        }
        // Forget unloaded modules (an address may be reused).
        let keys: HashSet<Key> = set.objects().iter().map(|o| o.key()).collect();
        st.done.retain(|k| keys.contains(k));
        ((set.adds, set.subs), result)
    });
    st.generation = Some(generation);
    result?;
    Ok(HOOKED_SLOTS.load(Relaxed))
}

static INSTALL_ERROR: Mutex<Option<String>> = Mutex::new(None);

/// [`install`], keeping a failure for [`install_error`] instead of
/// returning it (fgraph works without the hooks; exceptions through traced
/// frames do not).
pub(crate) fn install_quietly() {
    let r = install();
    *INSTALL_ERROR.lock().unwrap_or_else(|e| e.into_inner()) = r.err().map(|e| e.to_string());
}

/// Why the last [`install`] fgraph made failed, if it did.
pub fn install_error() -> Option<String> {
    INSTALL_ERROR.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Hooks modules loaded since the last [`install`] (if it ran): the ops
/// engine's module watcher calls this after `dlopen`s, before it patches
/// the new modules' sites ([`hooks_cover`]).  Cheap when nothing changed.
pub fn rescan() {
    {
        let g = INSTALLED.lock().unwrap_or_else(|e| e.into_inner());
        match g.as_ref() {
            None => return,
            Some(st) if st.generation == Some(crate::sites::loader_generation()) && !st.pending => return,
            Some(_) => {}
        }
    }
    install_quietly();
}

/// Whether the hooks are in every module of loader generation `gen` (the
/// loader's counters, `sites::loader_generation`), or are not wanted (no
/// [`install`] yet).  The module watcher patches the sites of new modules
/// only then: a traced function of a library just loaded that throws
/// before its unwinder's slots are hooked meets `return_to_handler` in the
/// unwinder (`std::terminate`).  The watcher used to patch first and hook
/// after, so a program that called into a new C++ library at once could
/// throw in between: under qemu-user, where the hooking took up to 100 ms
/// (more with [`resolve_in_local_scopes`]'s `dlopen`/`dlsym`), a quarter
/// of the runs of the test of an `RTLD_LOCAL` C++ plugin ended in
/// `std::terminate`, most with the lookup (natively the window was well
/// under a millisecond).  False also while another thread is installing
/// (the watcher then looks again at its next step); does not wait for the
/// loader, so a caller may hold the ops engine.  Left: an object the
/// loader was still relocating when the hooks were put in (its slots not
/// bound yet, so left for the next pass) but had finished by the time its
/// sites are read, a window of one concurrent `dlopen`.
pub(crate) fn hooks_cover(gen: (u64, u64)) -> bool {
    let g = match INSTALLED.try_lock() {
        Ok(g) => g,
        Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
        Err(std::sync::TryLockError::WouldBlock) => return false,
    };
    match g.as_ref() {
        None => true,
        Some(st) => st.generation == Some(gen),
    }
}

/// The dynamic-section values the GOT search needs (in-memory addresses).
#[derive(Default, Debug)]
struct Dynamic {
    symtab: usize,
    strtab: usize,
    strsz: usize,
    syment: usize,
    rela: usize,
    relasz: usize,
    relaent: usize,
    jmprel: usize,
    pltrelsz: usize,
    pltrel: u64,
}

/// Dynamic-section tags (ELF gABI).
mod dt {
    pub const NULL: i64 = 0;
    pub const PLTRELSZ: i64 = 2;
    pub const STRTAB: i64 = 5;
    pub const SYMTAB: i64 = 6;
    pub const RELA: i64 = 7;
    pub const RELASZ: i64 = 8;
    pub const RELAENT: i64 = 9;
    pub const STRSZ: i64 = 10;
    pub const SYMENT: i64 = 11;
    pub const PLTREL: i64 = 20;
    pub const JMPREL: i64 = 23;
}

const R_JUMP_SLOT: u32 = if cfg!(target_arch = "aarch64") { 1026 } else { 7 };
const R_GLOB_DAT: u32 = if cfg!(target_arch = "aarch64") { 1025 } else { 6 };
const SUPPORTED: bool = cfg!(any(target_arch = "x86_64", target_arch = "aarch64"));

fn word_at(b: &[u8], i: usize) -> u64 {
    u64::from_ne_bytes(b[i..i + 8].try_into().expect("8 bytes"))
}

/// A dynamic-section address: glibc rewrites `d_ptr` values to absolute
/// addresses in place on most arches; others keep them link-time relative.
fn dyn_addr(live: &Live<'_>, v: u64) -> Option<usize> {
    let v = v as usize;
    if live.obj.bias != 0 && live.obj.segment_of(v, 1).is_some() {
        return Some(v);
    }
    let a = live.obj.bias.wrapping_add(v);
    live.obj.segment_of(a, 1).map(|_| a)
}

fn read_dynamic(live: &Live<'_>) -> Option<Dynamic> {
    let seg = live.obj.segments.iter().find(|s| s.p_type == libc::PT_DYNAMIC)?;
    let at = live.obj.bias.wrapping_add(seg.vaddr as usize);
    let bytes = live.read(at, seg.memsz as usize / 16 * 16)?;
    let mut d = Dynamic { syment: 24, relaent: 24, ..Default::default() };
    for e in bytes.chunks_exact(16) {
        let (tag, val) = (word_at(e, 0) as i64, word_at(e, 8));
        match tag {
            dt::NULL => break,
            dt::SYMTAB => d.symtab = dyn_addr(live, val)?,
            dt::STRTAB => d.strtab = dyn_addr(live, val)?,
            dt::STRSZ => d.strsz = val as usize,
            dt::SYMENT => d.syment = val as usize,
            dt::RELA => d.rela = dyn_addr(live, val)?,
            dt::RELASZ => d.relasz = val as usize,
            dt::RELAENT => d.relaent = val as usize,
            dt::JMPREL => d.jmprel = dyn_addr(live, val)?,
            dt::PLTRELSZ => d.pltrelsz = val as usize,
            dt::PLTREL => d.pltrel = val,
            _ => {}
        }
    }
    (d.symtab != 0 && d.strtab != 0 && d.syment >= 24 && d.relaent >= 24).then_some(d)
}

/// The GOT slots of `live` that name a hooked function: (slot, entry).
fn find_slots(live: &Live<'_>) -> Vec<(usize, usize)> {
    let Some(d) = read_dynamic(live) else { return Vec::new() };
    let Some(strtab) = live.read(d.strtab, d.strsz) else { return Vec::new() };
    let mut tables = vec![(d.rela, d.relasz)];
    if d.pltrel == dt::RELA as u64 {
        tables.push((d.jmprel, d.pltrelsz));
    }
    let mut names: std::collections::HashMap<u32, Option<usize>> = std::collections::HashMap::new();
    let mut out = Vec::new();
    for (at, size) in tables {
        if at == 0 || size == 0 {
            continue;
        }
        let Some(rel) = live.read(at, size / d.relaent * d.relaent) else { continue };
        for r in rel.chunks_exact(d.relaent) {
            let (offset, info) = (word_at(r, 0), word_at(r, 8));
            let (sym, kind) = ((info >> 32) as u32, info as u32);
            if sym == 0 || (kind != R_JUMP_SLOT && kind != R_GLOB_DAT) {
                continue;
            }
            let entry = *names.entry(sym).or_insert_with(|| {
                let s = live.read(d.symtab + sym as usize * d.syment, 24)?;
                let name = u32::from_ne_bytes(s[0..4].try_into().ok()?) as usize;
                let tail = strtab.get(name..)?;
                let end = tail.iter().position(|b| *b == 0)?;
                HOOKED.iter().position(|h| h.as_bytes() == &tail[..end])
            });
            if let Some(e) = entry {
                out.push((live.obj.bias.wrapping_add(offset as usize), e));
            }
        }
    }
    out
}

/// A module not settled yet, as [`pending_imports`] found it.
struct Pending {
    key: Key,
    is_main: bool,
    name: Vec<u8>,
    /// Its GOT slots that name a hooked function ([`find_slots`]).
    slots: Vec<(usize, usize)>,
}

/// The modules not settled yet (not in `st.done`) that import functions of
/// [`HOOKED`], with their slots, in load order.
fn pending_imports(st: &Installed) -> Vec<Pending> {
    with_loaded(|set| {
        set.iter()
            .filter(|l| !st.done.contains(&l.obj.key()))
            .filter_map(|live| {
                let slots = find_slots(&live);
                (!slots.is_empty()).then(|| Pending { key: live.obj.key(), is_main: live.obj.is_main, name: live.obj.name.clone(), slots })
            })
            .collect()
    })
}

/// Finds the functions of [`HOOKED`] that the global lookup did not
/// (`REAL` 0) in the scope of the modules that import them (`wanted`, from
/// [`pending_imports`]): a C program that
/// `dlopen`s a C++ plugin `RTLD_LOCAL` has `libstdc++` (`__cxa_begin_catch`)
/// in the plugin's scope alone.  Until the twenty-seventh session such a
/// slot was left unhooked, and the frames a caught exception left in place
/// lost their returns (shown `unwound` with wrong times).  `dlopen` with
/// `RTLD_NOLOAD` gives the module's handle (and its reference back with
/// `dlclose`); `dlsym` on it searches its dependencies.  Outside the loader
/// lock, as `dlsym` takes it: the names come from a first pass.
fn resolve_in_local_scopes(wanted: &[Pending]) {
    // Only the missing functions a module imports are looked up, and a
    // module whose are all found by then is not opened: the watcher hooks
    // a new library's unwinder before it patches its sites (`hooks_cover`),
    // so this delays the tracing of a `dlopen`ed library (under qemu-user,
    // each `dlopen`/`dlsym` here took milliseconds).
    for m in wanted {
        if m.is_main || m.slots.iter().all(|&(_, e)| REAL[e].load(Relaxed) != 0) {
            continue;
        }
        let Ok(path) = std::ffi::CString::new(m.name.clone()) else { continue };
        // SAFETY: dlopen of a module already loaded (RTLD_NOLOAD: nothing is
        // loaded or run), then lookups by NUL-terminated names, then dlclose
        // of the reference this dlopen took.
        unsafe {
            let h = libc::dlopen(path.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY);
            if h.is_null() {
                continue;
            }
            let mut asked = [false; HOOKED.len()];
            for &(_, e) in &m.slots {
                // (Each function once: a module may name it in two slots.)
                if !std::mem::replace(&mut asked[e], true) && REAL[e].load(Relaxed) == 0 {
                    let c = std::ffi::CString::new(HOOKED[e]).expect("no NUL in the names");
                    let p = libc::dlsym(h, c.as_ptr()) as usize;
                    let _ = REAL[e].compare_exchange(0, p, Release, Relaxed);
                }
            }
            libc::dlclose(h);
        }
    }
}

/// Points `live`'s slots at the hooks.  True when every slot is settled.
fn hook_module(live: Live<'_>, slots: &[(usize, usize)], real: &[usize], hooks: &[usize], maps: &Maps) -> Result<bool, RuntimeError> {
    if live.obj.name.starts_with(b"linux-vdso") || live.obj.name.starts_with(b"linux-gate") {
        return Ok(true);
    }
    let mut settled = true;
    let mut todo = Vec::new();
    for &(slot, e) in slots {
        let Some(cur) = live.read(slot, 8).map(|b| word_at(&b, 0) as usize) else {
            settled = false;
            continue;
        };
        if cur == hooks[e] || real[e] == 0 {
            continue;
        }
        // Bound to the definition we call, or not bound yet (a lazy stub
        // in the module itself, which would bind it on first call).
        if cur == real[e] || live.obj.in_text(cur, 1) {
            todo.push((slot, e));
        } else if cur == 0 || live.obj.segment_of(cur, 1).is_none() && !maps_has_text(maps, cur) {
            // Not relocated yet (the loader is still at it): retry later.
            settled = false;
        }
    }
    if todo.is_empty() {
        return Ok(settled);
    }
    for (slot, _) in &todo {
        maps.check(*slot, 8, false)?;
    }
    let w = Writable::open(maps, todo.iter().map(|(s, _)| (*s, 8)))?;
    for (slot, e) in &todo {
        // SAFETY: `slot` is a GOT entry of a loaded module (the loader lock
        // is held, so it stays mapped), 8-aligned, made writable above; an
        // atomic store, so a thread calling through it concurrently sees
        // either the real function or the hook, which calls it.
        unsafe { AtomicUsize::from_ptr(*slot as *mut usize) }.store(hooks[*e], SeqCst);
        HOOKED_SLOTS.fetch_add(1, Relaxed);
    }
    w.close()?;
    Ok(settled)
}

fn maps_has_text(maps: &Maps, addr: usize) -> bool {
    maps.check(addr, 1, true).is_ok()
}

// ---------------------------------------------------------------------------
// Per-thread state.

#[derive(Clone, Copy)]
struct Restored {
    base: usize,
    sp: usize,
    ret: usize,
    slot: usize,
    /// What the restore wrote into `slot`: `ret` in the form the frame
    /// keeps its return address (signed with its key under pac-ret, see
    /// [`Signing`]).
    real: usize,
    /// What `slot` held before, `return_to_handler` in that form: what a
    /// re-hijack writes back.
    hijacked: usize,
}

/// The frames a hook restored, kept without a destructor: a thread-local
/// whose type needs none is never destroyed, so the hooks keep working in
/// the code that runs after the thread-local destructors — the `thread_local`
/// destructors after them, `atexit` handlers and static destructors at
/// `exit()`, pthread key destructors.  (Until the twenty-seventh session the
/// table was a plain `Vec`: once its destructor had run, the hooks did
/// nothing, and an exception thrown and caught there through traced frames
/// ended the program in `std::terminate`.)  The buffer is freed each time
/// the table is emptied ([`RestoredTable::empty`]), so a thread that exits
/// leaks nothing unless it exits while frames are restored.
struct RestoredTable(std::mem::ManuallyDrop<Vec<Restored>>);

impl RestoredTable {
    const fn new() -> RestoredTable {
        RestoredTable(std::mem::ManuallyDrop::new(Vec::new()))
    }

    /// Forgets every entry and frees the buffer.
    fn empty(&mut self) {
        drop(std::mem::take(&mut *self.0));
    }
}

impl std::ops::Deref for RestoredTable {
    type Target = Vec<Restored>;
    fn deref(&self) -> &Vec<Restored> {
        &self.0
    }
}

impl std::ops::DerefMut for RestoredTable {
    fn deref_mut(&mut self) -> &mut Vec<Restored> {
        &mut self.0
    }
}

struct Thread {
    restored: RefCell<RestoredTable>,
    /// The newest hook's canary: its address (0: none) and value.
    canary_at: Cell<usize>,
    canary: Cell<u64>,
    /// This thread's stack `[lo, hi)`, once known.
    stack: Cell<(usize, usize)>,
    /// The stack the restored frames are on, as [`current_stack`] found it
    /// at the restore: the thread's own, or a coroutine's (`(0, 0)`: none
    /// restored).
    restored_on: Cell<(usize, usize)>,
}

// The hooks must work after the thread-local destructors (see RestoredTable).
const _: () = assert!(!std::mem::needs_drop::<Thread>());

thread_local! {
    static THREAD: Thread = const {
        Thread {
            restored: RefCell::new(RestoredTable::new()),
            canary_at: Cell::new(0),
            canary: Cell::new(0),
            stack: Cell::new((0, 0)),
            restored_on: Cell::new((0, 0)),
        }
    };
}

/// The stack the frames live on as seen from `caller_sp`: the thread's own
/// when `caller_sp` lies on it or on the alternate signal stack; otherwise
/// (a coroutine's stack, `makecontext`, whose bounds are unknown) the range
/// from `caller_sp` up to where the frames' entry sps stop climbing in
/// steps of at most [`MAX_FRAME_GAP`] (after the last context switch every
/// frame on the shadow stack is on the current stack: [`leave_stack`]).
fn current_stack(fr: &dyn Frames, caller_sp: usize, thread: (usize, usize), alt: Option<(usize, usize)>) -> (usize, usize) {
    if within(thread, caller_sp) || alt.is_some_and(|r| within(r, caller_sp)) {
        return thread;
    }
    // (A frame at or below `caller_sp` tail-called the hook, or was
    // unwound.)
    let mut top = caller_sp;
    fr.each(&mut |_, _, fsp| {
        if fsp <= caller_sp {
            return true;
        }
        let up = fsp >= top && fsp - top <= MAX_FRAME_GAP;
        if up {
            top = fsp;
        }
        up
    });
    (caller_sp, top + 8)
}

/// The stack of the frames a hook restored (the thread's own when none).
fn restored_stack(t: &Thread) -> (usize, usize) {
    match t.restored_on.get() {
        (_, 0) => thread_stack(t),
        r => r,
    }
}

/// The alternate signal stack `[lo, hi)`, if one is set (one syscall;
/// async-signal-safe).
pub(crate) fn alt_stack() -> Option<(usize, usize)> {
    let mut ss: libc::stack_t = libc::stack_t { ss_sp: std::ptr::null_mut(), ss_flags: 0, ss_size: 0 };
    // SAFETY: sigaltstack with a null new stack only writes the current one into `ss`.
    if unsafe { libc::sigaltstack(std::ptr::null(), &mut ss) } != 0 || ss.ss_flags & libc::SS_DISABLE != 0 || ss.ss_size == 0 {
        return None;
    }
    Some((ss.ss_sp as usize, ss.ss_sp as usize + ss.ss_size))
}

/// This thread's stack (cached; not async-signal-safe: called only from
/// the hooks).
///
/// For the process's initial thread, computed here from
/// `/proc/self/maps` as glibc's `pthread_getattr_np` does, rather than
/// with it: glibc reads the file with `fopen` and `getline` and copies
/// the thread's CPU set, 13 calls of the `malloc`, `realloc` and `free`
/// the program links (a program's own allocator: bash's, jemalloc's),
/// which ran inside the hook, so fgraph's recursion guard left them
/// untraced and the recorder reported them as calls of signal handlers
/// that had interrupted it (a C program with its own `malloc` calling a
/// C++ library that throws).  Other threads still take
/// `pthread_getattr_np` (no file; 4 such calls, for the CPU set, once per
/// thread), as does the initial thread when the hook runs off its stack
/// (on a coroutine's or the alternate signal stack).
fn thread_stack(t: &Thread) -> (usize, usize) {
    let s = t.stack.get();
    if s.1 != 0 {
        return s;
    }
    let here = &s as *const (usize, usize) as usize;
    let r = match initial_thread_stack() {
        Some(r) if within(r, here) => r,
        _ => stack_of_pthread(),
    };
    t.stack.set(r);
    r
}

/// The initial thread's stack, if this is the initial thread (its tid is
/// the pid) and `/proc/self/maps` can be read.
fn initial_thread_stack() -> Option<(usize, usize)> {
    extern "C" {
        /// The loader's: the top of the initial thread's stack as the
        /// kernel set it up (`__libc_stack_end`, exported by ld.so).
        static __libc_stack_end: *mut c_void;
    }
    // SAFETY: gettid and getpid have no arguments and cannot fail.
    if unsafe { libc::gettid() != libc::getpid() } {
        return None;
    }
    // SAFETY: ld.so sets `__libc_stack_end` before any code of ours runs
    // and never changes it after; reading the pointer's value touches
    // nothing else.
    let stack_end = unsafe { std::ptr::addr_of!(__libc_stack_end).read() } as usize;
    let mut rl = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the limit into `rl`, a live local.
    if stack_end == 0 || unsafe { libc::getrlimit(libc::RLIMIT_STACK, &mut rl) } != 0 {
        return None;
    }
    let limit = usize::try_from(rl.rlim_cur).unwrap_or(usize::MAX);
    Maps::read().ok()?.initial_thread_stack(stack_end, limit)
}

/// This thread's stack by `pthread_getattr_np` (`(0, usize::MAX)`, all
/// of memory, if it fails).
fn stack_of_pthread() -> (usize, usize) {
    // SAFETY: pthread_attr_t is plain data initialised by pthread_getattr_np
    // and destroyed once; pthread_attr_getstack writes two out-parameters.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            return (0, usize::MAX);
        }
        let (mut addr, mut size) = (std::ptr::null_mut(), 0usize);
        let ok = libc::pthread_attr_getstack(&attr, &mut addr, &mut size) == 0;
        libc::pthread_attr_destroy(&mut attr);
        if ok {
            (addr as usize, addr as usize + size)
        } else {
            (0, usize::MAX)
        }
    }
}

/// Where frames may be read and which are alive, as seen from `sp`.
struct Stacks {
    sp: usize,
    thread: (usize, usize),
    alt: Option<(usize, usize)>,
}

fn within(r: (usize, usize), a: usize) -> bool {
    r.0 <= a && a < r.1
}

impl Stacks {
    fn on_alt(&self, a: usize) -> bool {
        self.alt.is_some_and(|r| within(r, a))
    }
    /// A frame whose entry sp is `fsp` is live and readable: above `sp` on
    /// the same stack, or on the thread stack while `sp` is on the
    /// alternate one (an interrupted frame).
    fn live(&self, fsp: usize) -> bool {
        match (self.on_alt(self.sp), self.on_alt(fsp)) {
            (true, true) => fsp > self.sp,
            (true, false) => within(self.thread, fsp),
            (false, true) => false,
            (false, false) => fsp > self.sp && within(self.thread, fsp),
        }
    }
    /// `a` lies on the thread stack or the alternate one.
    fn mapped(&self, a: usize) -> bool {
        within(self.thread, a) || self.on_alt(a)
    }
    /// `[lo, hi)` lies on one stack, above `sp` if that is the same one.
    fn readable(&self, lo: usize, hi: usize) -> bool {
        let r = if self.on_alt(lo) { self.alt.expect("on it") } else { self.thread };
        lo < hi && within(r, lo) && hi <= r.1 && (self.on_alt(self.sp) != self.on_alt(lo) || lo >= self.sp)
    }
}

fn read(a: usize) -> usize {
    // SAFETY: callers pass 8-aligned addresses that `Stacks::live`/
    // `readable`/`mapped` placed on the current stack (the thread's own, or
    // a coroutine's from the hook's sp up to its outermost traced frame's
    // return slot, `current_stack`; or the stack a signal interrupted)
    // above the current sp, or that a restore found there: mapped while
    // the thread runs on it.
    unsafe { std::ptr::read_volatile(a as *const usize) }
}

fn write(a: usize, v: usize) {
    // SAFETY: as in `read`; the word is a return slot of a frame of this
    // thread (or a stale copy of one), written only by this thread.
    unsafe { std::ptr::write_volatile(a as *mut usize, v) }
}

/// How a frame keeps its return address in its slot on aarch64.  A
/// function built with pointer authentication (`-mbranch-protection=
/// standard` or `pac-ret`, the default of Ubuntu's and Fedora's gcc) signs
/// `x30` at entry (`paciasp`, or `pacibsp` with `+b-key`), with the stack
/// pointer it was entered with as the modifier, before it saves it, and
/// authenticates it before its `ret`; libgcc's unwinder authenticates the
/// saved word the same way (`autia1716` with the frame's CFA).  Its slot
/// then holds `return_to_handler` signed, never the plain address: until
/// the twenty-ninth session a restore compared slots with the plain one,
/// found none, and every exception thrown through such a traced frame
/// under function_graph ended the program in `std::terminate` (aarch64
/// under qemu-user, g++ 12 with `-mbranch-protection=standard`).  The
/// restore now recognises the signed forms, and writes the real return
/// address signed the same way (and `return_to_handler` so when it
/// re-hijacks), so that both the unwinder and the frame's own
/// authentication accept it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Signing {
    Plain,
    KeyA,
    KeyB,
}

impl Signing {
    /// `p` as a frame entered with `sp` keeps it under this signing.
    fn sign(self, p: usize, sp: usize) -> usize {
        match self {
            Signing::Plain => p,
            Signing::KeyA => pac(p, sp, false),
            Signing::KeyB => pac(p, sp, true),
        }
    }
}

/// `p` signed with the instruction key A or B and modifier `m`
/// (`pacia1716`/`pacib1716`: hint-space instructions, which leave `p` as it
/// is on a CPU without pointer authentication, where `paciasp` does too).
/// Elsewhere than on aarch64, `p`.
#[inline]
fn pac(p: usize, m: usize, key_b: bool) -> usize {
    #[cfg(target_arch = "aarch64")]
    {
        let mut x17 = p;
        // SAFETY: pacia1716/pacib1716 only compute a value from x16 and x17.
        unsafe {
            if key_b {
                std::arch::asm!("hint #10", inout("x17") x17, in("x16") m, options(nomem, nostack, preserves_flags, pure));
            } else {
                std::arch::asm!("hint #8", inout("x17") x17, in("x16") m, options(nomem, nostack, preserves_flags, pure));
            }
        }
        x17
    }
    #[cfg(not(target_arch = "aarch64"))]
    {
        let _ = (m, key_b);
        p
    }
}

/// The forms of `return_to_handler` a frame entered with `fsp` may keep in
/// its slot: plain, signed with key A, with key B (the same value three
/// times where nothing signs).
fn hijacked_forms(rth: usize, fsp: usize) -> [(usize, Signing); 3] {
    if cfg!(target_arch = "aarch64") {
        [(rth, Signing::Plain), (pac(rth, fsp, false), Signing::KeyA), (pac(rth, fsp, true), Signing::KeyB)]
    } else {
        [(rth, Signing::Plain); 3]
    }
}

/// How a slot holding `v` keeps `return_to_handler`, if it does.  A
/// pointer authentication code is a few bits (7 under qemu-user for
/// 48-bit addresses), so one signature in a hundred or so is all zeros and
/// the signed form *is* the plain one: the value alone cannot tell a frame
/// that signs from one that does not, and a wrong guess writes a return
/// address that the frame's `autiasp` or the unwinder's authentication
/// turns into a faulting one (Lua built as C++ with pac-ret died of SIGSEGV
/// at about one throw in three hundred).  Then the function's code decides
/// (`ip`, its patch site: [`signing_in_code`]).
fn hijacked_form(v: usize, forms: &[(usize, Signing); 3], ip: &dyn Fn() -> usize) -> Option<Signing> {
    let mut found = forms.iter().filter(|(f, _)| *f == v).map(|(_, s)| *s);
    let first = found.next()?;
    match found.next() {
        None => Some(first),
        Some(_) => Some(signing_in_code(ip())),
    }
}

/// How the function whose patch site is at `ip` signs its return address:
/// the `paciasp` (key A) or `pacibsp` (key B) its prologue begins with,
/// looked for in the instructions after the site up to the first return
/// (at most 64: GCC may schedule a few instructions before it, or put the
/// prologue after an early exit), else plain.
fn signing_in_code(ip: usize) -> Signing {
    const PACIASP: u32 = 0xd503_233f;
    const PACIBSP: u32 = 0xd503_237f;
    if !cfg!(target_arch = "aarch64") || ip == 0 {
        return Signing::Plain;
    }
    let site_len = 8;
    for i in 0..64 {
        // SAFETY: the code of a function with a frame on this thread's
        // shadow stack, mapped while the frame is live; reading at most 64
        // instructions on from its site, which a `ret` or the end of the
        // function's text ends first (text is mapped in whole pages and
        // functions are followed by more code or padding).
        let insn = unsafe { std::ptr::read_volatile((ip + site_len + 4 * i) as *const u32) };
        match insn {
            PACIASP => return Signing::KeyA,
            PACIBSP => return Signing::KeyB,
            // ret, retaa, retab
            0xd65f_03c0 | 0xd65f_0bff | 0xd65f_0fff => return Signing::Plain,
            _ => {}
        }
    }
    Signing::Plain
}

/// The return-address slots of the frame `[lo, fsp)` on aarch64: the
/// frame records on the chain in that range whose x30 is `return_to_handler`
/// in one of its `forms`, or else every word there holding one.
fn find_slots_in(lo: usize, fsp: usize, forms: &[(usize, Signing); 3], chain: &[usize], out: &mut Vec<usize>) {
    let start = out.len();
    let hijacked = |v: usize| forms.iter().any(|(f, _)| *f == v);
    out.extend(chain.iter().copied().filter(|a| lo <= *a && *a < fsp && hijacked(read(*a))));
    if out.len() > start {
        return;
    }
    let mut a = (lo + 7) & !7;
    while a + 8 <= fsp {
        if hijacked(read(a)) {
            out.push(a);
        }
        a += 8;
    }
}

/// The x30 slots (`fp + 8`) of the frame-pointer chain from `fp`, from
/// the first record at or above `st.sp` (the hook's own records, if it
/// keeps any, lie between this function's frame and `st.sp`).
fn fp_chain(st: &Stacks, mut fp: usize, out: &mut Vec<usize>) {
    let here = &fp as *const usize as usize;
    for _ in 0..64 {
        if fp >= st.sp || fp <= here || !fp.is_multiple_of(8) || !within(st.thread, fp) && !st.on_alt(fp) {
            break;
        }
        fp = read(fp);
    }
    for _ in 0..100_000 {
        if !fp.is_multiple_of(8) || !st.readable(fp, fp + 16) {
            return;
        }
        out.push(fp + 8);
        let next = read(fp);
        // A signal frame's record points from the alternate stack to the
        // interrupted one; otherwise records go up.
        if next <= fp && st.on_alt(fp) == st.on_alt(next) {
            return;
        }
        fp = next;
    }
}

/// Restores the real return address of every live frame above `st.sp`.
fn restore(fr: &dyn Frames, t: &Thread, st: Stacks, fp: usize, rth: usize) {
    let mut any = false;
    fr.each(&mut |_, _, _| {
        any = true;
        false
    });
    if !any {
        return;
    }
    let sp = st.sp;
    let Ok(mut table) = t.restored.try_borrow_mut() else { return };
    let mut chain = Vec::new();
    if cfg!(target_arch = "aarch64") {
        fp_chain(&st, fp, &mut chain);
    }
    // aarch64: the range searched for this frame's slot is `[lo, fsp)`;
    // frames with the same entry sp (tail calls) share one.
    let (mut lo, mut prev) = (sp, (sp, 0));
    let mut slots = Vec::new();
    let before = table.len();
    fr.each(&mut |base, ret, fsp| {
        if !st.live(fsp) {
            return true;
        }
        let known = table.iter().any(|r| r.base == base && r.sp == fsp && r.ret == ret && st.mapped(r.slot) && read(r.slot) == r.real);
        let forms = hijacked_forms(rth, fsp);
        slots.clear();
        if cfg!(target_arch = "x86_64") {
            if read(fsp) == rth {
                slots.push(fsp);
            }
        } else {
            if fsp == prev.1 {
                lo = prev.0;
            } else if st.on_alt(lo) != st.on_alt(fsp) || lo >= fsp {
                // A frame on another stack than the previous one: its
                // range starts below it, at most 64 KiB.
                let r = if st.on_alt(fsp) { st.alt.expect("on it") } else { st.thread };
                lo = fsp.saturating_sub(64 << 10).max(r.0);
            }
            if st.readable(lo, fsp) {
                find_slots_in(lo, fsp, &forms, &chain, &mut slots);
            }
            if slots.is_empty() && !known && ret != rth {
                UNRESTORED.fetch_add(1, Relaxed);
            }
        }
        for s in &slots {
            let hijacked = read(*s);
            let real = hijacked_form(hijacked, &forms, &|| fr.ip_of(base)).unwrap_or(Signing::Plain).sign(ret, fsp);
            write(*s, real);
            table.push(Restored { base, sp: fsp, ret, slot: *s, real, hijacked });
        }
        prev = (lo, fsp);
        lo = fsp;
        true
    });
    if table.len() > before {
        RESTORES.fetch_add(1, Relaxed);
    }
    if !table.is_empty() {
        fr.set_restored(true);
    }
}

/// Writes `return_to_handler` back into the slots of the restored frames
/// still on the shadow stack that `keep` accepts; forgets the rest.
/// Restored frames on top whose slots no longer hold their return address
/// were unwound (their stack is reused): they are dropped.
fn rehijack(fr: &dyn Frames, t: &Thread, st: &Stacks, rth: usize, keep: &dyn Fn(usize) -> bool) {
    let Ok(mut table) = t.restored.try_borrow_mut() else { return };
    let holds = |r: &Restored| st.mapped(r.slot) && read(r.slot) == r.real;
    let mut dead = 0;
    fr.each(&mut |base, ret, fsp| {
        // (A frame whose return address is `return_to_handler` was
        // tail-called and shares its slot with the next one.)
        let mut mine = table.iter().filter(|r| r.base == base && r.sp == fsp && r.ret == ret).peekable();
        let gone = ret != rth && mine.peek().is_some() && !mine.any(holds);
        dead += usize::from(gone);
        gone
    });
    for _ in 0..dead {
        fr.drop_innermost();
    }
    fr.each(&mut |base, ret, fsp| {
        if keep(fsp) {
            for r in table.iter().filter(|r| r.base == base && r.sp == fsp && r.ret == ret) {
                if holds(r) {
                    write(r.slot, r.hijacked);
                }
            }
        }
        true
    });
    table.empty();
    t.restored_on.set((0, 0));
    t.canary_at.set(0);
    fr.set_restored(false);
}

/// Called by fgraph at a traced entry while the thread is restored (after
/// it dropped the frames below `sp`): re-hijacks the survivors unless the
/// unwinder may still be running.
pub(crate) fn lazy_rehijack(fr: &dyn Frames, sp: usize, rth: usize) {
    let _ = THREAD.try_with(|t| {
        let at = t.canary_at.get();
        if at != 0 && read_canary_if_above(at, sp) == Some(t.canary.get()) {
            // The hook's frame is intact above us: perhaps a signal handler
            // interrupted the unwinder.  Wait for a later entry.
            return;
        }
        // (A coroutine's stack when the restore found the frames there.)
        let thread = match (t.restored_on.get(), t.stack.get()) {
            (r, _) if r.1 != 0 => r,
            (_, (_, 0)) => (0, usize::MAX),
            (_, r) => r,
        };
        let st = Stacks { sp, thread, alt: alt_stack() };
        rehijack(fr, t, &st, rth, &|fsp| st.live(fsp));
    });
}

/// The canary's value when the hook frame at `at` may still be alive as
/// seen from `sp`: `sp` below it on the same stack, or on another stack.
fn read_canary_if_above(at: usize, sp: usize) -> Option<u64> {
    let alt = alt_stack();
    let on_alt = |a: usize| alt.is_some_and(|r| within(r, a));
    if on_alt(at) == on_alt(sp) && sp > at {
        return None;
    }
    // SAFETY: the canary lies on this thread's stack above `sp` (or on the
    // stack a signal interrupted), which is mapped.
    Some(unsafe { std::ptr::read_volatile(at as *const u64) })
}

// ---------------------------------------------------------------------------
// The FDE of return_to_handler.

/// `_URC_CONTINUE_UNWIND` (Itanium C++ ABI, level I).
const URC_CONTINUE_UNWIND: libc::c_int = 8;

/// The `.eh_frame` (one CIE, one FDE, the zero terminator) describing the
/// return address `rth` as a frame of size 0 with personality
/// `personality` (see the module docs): CFA = sp; return address = the
/// return-address register as the frame below saved it, or 0 while that
/// is still `rth`.
fn return_eh_frame(rth: usize, personality: usize) -> Vec<u8> {
    use gimli::write::{Address, CallFrameInstruction, CommonInformationEntry, EhFrame, EndianVec, Expression, FrameDescriptionEntry, FrameTable};
    let (sp, ra) = if cfg!(target_arch = "aarch64") { (gimli::AArch64::SP, gimli::AArch64::X30) } else { (gimli::X86_64::RSP, gimli::X86_64::RA) };
    let encoding = gimli::Encoding { address_size: 8, format: gimli::Format::Dwarf32, version: 1 };
    let mut cie = CommonInformationEntry::new(encoding, 1, -8, ra);
    cie.personality = Some((gimli::DW_EH_PE_absptr, Address::Constant(personality as u64)));
    cie.add_instruction(CallFrameInstruction::Cfa(sp, 0));
    // ra = reg(ra) & mask; if ra == rth { 0 } else { ra }
    // (The mask strips a pointer authentication code: the frame below may
    // keep its return address signed, see `Signing`, and libgcc
    // authenticates it only for a frame whose CIE says so, not for this one.)
    let mut e = Expression::new();
    e.op_breg(ra, 0);
    if cfg!(target_arch = "aarch64") {
        e.op_constu(code_address_mask() as u64);
        e.op(gimli::DW_OP_and);
    }
    e.op(gimli::DW_OP_dup);
    e.op_constu(rth as u64);
    e.op(gimli::DW_OP_ne);
    let keep = e.op_bra();
    e.op(gimli::DW_OP_drop);
    e.op(gimli::DW_OP_lit0);
    e.set_target(keep, e.next_index());
    cie.add_instruction(CallFrameInstruction::ValExpression(ra, e));
    let mut table = FrameTable::default();
    let id = table.add_cie(cie);
    // A return address is looked up one byte before it; a signal frame's
    // pc (interrupted right at `rth`) at it.
    table.add_fde(id, FrameDescriptionEntry::new(Address::Constant(rth as u64 - 1), 2));
    let mut out = EhFrame(EndianVec::new(gimli::LittleEndian));
    table.write_eh_frame(&mut out).expect("a fixed, valid frame table");
    let mut v = out.0.into_vec();
    v.extend_from_slice(&[0; 4]);
    v
}

/// The bits of a code address that are not a pointer authentication code
/// (aarch64: `xpaclri` of the largest lower-half address clears the code's
/// bits and keeps the others; without pointer authentication it is a NOP,
/// and the mask keeps every bit of a user address).
fn code_address_mask() -> usize {
    #[cfg(target_arch = "aarch64")]
    {
        let mut lr: usize = 0x007f_ffff_ffff_ffff;
        // SAFETY: xpaclri (a hint-space instruction) only rewrites x30,
        // which the asm block names as its operand.
        unsafe { std::arch::asm!("hint #7", inout("x30") lr, options(nomem, nostack, preserves_flags, pure)) };
        lr
    }
    #[cfg(not(target_arch = "aarch64"))]
    {
        usize::MAX
    }
}

/// The personality routine of `return_to_handler`'s FDE: the unwinder met
/// a hijacked return that no hook restored (it calls this before reading
/// the frame's return address): restore as a hook does, from here.
extern "C" fn return_personality(_version: libc::c_int, _actions: libc::c_int, _class: u64, _exc: Exc, _ctx: *mut c_void) -> libc::c_int {
    let canary = Cell::new(0u64);
    let sp = &canary as *const Cell<u64> as usize;
    before(&canary, sp, frame_pointer());
    std::hint::black_box(&canary);
    URC_CONTINUE_UNWIND
}

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
extern "C" {
    /// libgcc's (`libgcc_s`, which the Rust standard library links):
    /// registers a `.eh_frame` that must stay valid for the process.
    fn __register_frame(begin: *const u8);
}

/// Registers the FDE of `return_to_handler` with the unwinder, once per
/// process, if the trampoline exists (before it does, no return is
/// hijacked).  The `pthread_cancel` hook calls this; so can a program
/// that starts forced unwinds some other way no hook sees.
///
/// Not done up front because of its cost to programs that never need it:
/// while any frame is registered, libgcc before GCC 13 takes a global
/// mutex for every FDE lookup (each frame of each exception, panic and
/// backtrace, in every thread), where it otherwise asks the loader's
/// lock-free `_dl_find_object`.
pub fn register_return_fde() {
    static DONE: Mutex<bool> = Mutex::new(false);
    let rth = crate::fgraph::return_to_handler_if_made();
    let Ok(mut done) = DONE.lock() else { return };
    if *done || rth == 0 {
        return;
    }
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    {
        let eh = return_eh_frame(rth, return_personality as *const () as usize).leak();
        // SAFETY: a complete `.eh_frame` (CIE, FDE, terminator) leaked, so
        // valid for the rest of the process as libgcc requires; its
        // personality is a function of the signature the ABI calls.
        unsafe { __register_frame(eh.as_ptr()) };
    }
    *done = true;
}

// ---------------------------------------------------------------------------
// The hooks.

/// Restore for a hook called from `caller_sp` whose frame holds `canary`.
fn before(canary: &Cell<u64>, caller_sp: usize, fp: usize) {
    let at = canary as *const Cell<u64> as usize;
    let _ = THREAD.try_with(|t| {
        crate::fgraph::with_thread_frames(|fr, rth| {
            let v = (at as u64).rotate_left(29) ^ 0x6674_7261_6d70_ca11;
            canary.set(v);
            t.canary.set(v);
            t.canary_at.set(at);
            // (On a coroutine's stack, its frames: until the twenty-sixth
            // session only the thread stack's were restored, so an
            // exception thrown and caught inside a `makecontext` coroutine
            // met `return_to_handler` and ended in std::terminate, and
            // `backtrace()` there stopped at the first hijacked return.)
            let alt = alt_stack();
            let cur = current_stack(fr, caller_sp, thread_stack(t), alt);
            t.restored_on.set(cur);
            restore(fr, t, Stacks { sp: caller_sp, thread: cur, alt }, fp, rth);
        });
    });
}

/// Most a traced function's frame is assumed to span when the current
/// stack's bounds are unknown ([`leave_stack`] on a coroutine's stack).
const MAX_FRAME_GAP: usize = 8 << 20;

/// A context switch (`swapcontext`, `setcontext`) called from `caller_sp`,
/// whose return address is at `ret_slot`: the thread leaves its stack,
/// perhaps for good, and the frames on the shadow stack stop being in step
/// with the one it finds.  Every frame's real return address is put back
/// and every frame is dropped, so nothing of this stack returns into
/// `return_to_handler` and the next stack starts with an empty shadow
/// stack.
///
/// The frames are those of the chain above `caller_sp` on the current
/// stack (after the last switch, that is all of them), plus a traced
/// function that tail-called the switch: its return address is the hook's
/// own (`ret_slot`: x86_64 the stack slot, aarch64 the stub's saved x30),
/// put back there.  The current stack is the thread's own when `caller_sp`
/// lies on it (or on the alternate signal stack); otherwise (a coroutine's
/// stack, whose bounds are unknown) it is where the frames' entry sps climb
/// from `caller_sp` in steps of at most [`MAX_FRAME_GAP`].
fn leave_stack(caller_sp: usize, ret_slot: usize, fp: usize) {
    let _ = THREAD.try_with(|t| {
        crate::fgraph::with_thread_frames(|fr, rth| {
            let alt = alt_stack();
            let cur = current_stack(fr, caller_sp, thread_stack(t), alt);
            restore(fr, t, Stacks { sp: caller_sp, thread: cur, alt }, fp, rth);
            if read(ret_slot) == rth {
                // The entry sp of a function that tail-called the hook.
                let tail_sp = if cfg!(target_arch = "x86_64") { ret_slot } else { caller_sp };
                let mut real = None;
                fr.each(&mut |_, ret, fsp| {
                    if fsp == tail_sp && ret != rth {
                        real = Some(ret);
                    }
                    real.is_none() && fsp <= tail_sp
                });
                match real {
                    Some(ret) => write(ret_slot, ret),
                    None => fatal(b"ftramp unwind: a context switch returns to return_to_handler without a frame\n"),
                }
            }
            fr.drop_all();
            if let Ok(mut table) = t.restored.try_borrow_mut() {
                table.empty();
            }
            t.restored_on.set((0, 0));
            t.canary_at.set(0);
            fr.set_restored(false);
        });
    });
}

/// After a real function returned: every frame survived.
fn after() {
    let _ = THREAD.try_with(|t| {
        crate::fgraph::with_thread_frames(|fr, rth| {
            if t.restored.try_borrow().is_ok_and(|r| !r.is_empty()) {
                let st = Stacks { sp: 0, thread: restored_stack(t), alt: alt_stack() };
                rehijack(fr, t, &st, rth, &|_| true);
            }
        });
    });
}

/// The frame pointer (aarch64), for the frame-record chain.
#[inline(always)]
fn frame_pointer() -> usize {
    #[cfg(target_arch = "aarch64")]
    {
        let fp: usize;
        // SAFETY: reads x29 into a register; no memory, no side effects.
        unsafe { std::arch::asm!("mov {}, x29", out(reg) fp, options(nomem, nostack, preserves_flags)) };
        fp
    }
    #[cfg(not(target_arch = "aarch64"))]
    0
}

fn real<F: Copy>(e: Entry) -> F {
    let p = REAL[e as usize].load(Acquire);
    if p == 0 {
        fatal(b"ftramp unwind: a hook ran without its real function\n");
    }
    debug_assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<usize>());
    // SAFETY: `p` is the address dlsym returned for this entry's name, and
    // `F` is that function's C signature (the hooks below pair them).
    unsafe { std::mem::transmute_copy(&p) }
}

fn fatal(msg: &[u8]) -> ! {
    // SAFETY: write(2) of a static buffer; async-signal-safe.
    unsafe { libc::write(2, msg.as_ptr() as *const c_void, msg.len()) };
    std::process::abort()
}

type Exc = *mut c_void;
type Code = libc::c_int;

// Each hook is entered through a two-instruction stub (below) that adds
// the caller's stack pointer as the last argument: frames entered at or
// below it were unwound already (a landing pad calling `_Unwind_Resume`
// runs at the sp of its frame's call that threw), frames above it are
// live.

extern "C-unwind" fn hook_raise(exc: Exc, caller_sp: usize) -> Code {
    let canary = Cell::new(0u64);
    before(&canary, caller_sp, frame_pointer());
    let f: unsafe extern "C-unwind" fn(Exc) -> Code = real(Entry::Raise);
    // SAFETY: the real function, with the caller's argument.
    let r = unsafe { f(exc) };
    std::hint::black_box(&canary);
    after();
    r
}

extern "C-unwind" fn hook_resume(exc: Exc, caller_sp: usize) {
    let canary = Cell::new(0u64);
    before(&canary, caller_sp, frame_pointer());
    let f: unsafe extern "C-unwind" fn(Exc) = real(Entry::Resume);
    // SAFETY: the real function, with the caller's argument.
    unsafe { f(exc) };
    std::hint::black_box(&canary);
    fatal(b"ftramp unwind: _Unwind_Resume returned\n")
}

extern "C-unwind" fn hook_resume_or_rethrow(exc: Exc, caller_sp: usize) -> Code {
    let canary = Cell::new(0u64);
    before(&canary, caller_sp, frame_pointer());
    let f: unsafe extern "C-unwind" fn(Exc) -> Code = real(Entry::ResumeOrRethrow);
    // SAFETY: the real function, with the caller's argument.
    let r = unsafe { f(exc) };
    std::hint::black_box(&canary);
    after();
    r
}

extern "C-unwind" fn hook_forced(exc: Exc, stop: *mut c_void, arg: *mut c_void, caller_sp: usize) -> Code {
    let canary = Cell::new(0u64);
    before(&canary, caller_sp, frame_pointer());
    let f: unsafe extern "C-unwind" fn(Exc, *mut c_void, *mut c_void) -> Code = real(Entry::Forced);
    // SAFETY: the real function, with the caller's arguments.
    let r = unsafe { f(exc, stop, arg) };
    std::hint::black_box(&canary);
    after();
    r
}

/// The caller's `_Unwind_Backtrace` callback, called for every frame but
/// the first ([`hook_backtrace`]'s own).
struct SkipFirstFrame {
    trace: unsafe extern "C-unwind" fn(*mut c_void, *mut c_void) -> Code,
    arg: *mut c_void,
    skipped: bool,
}

extern "C-unwind" fn skip_first_frame(ctx: *mut c_void, arg: *mut c_void) -> Code {
    // SAFETY: `arg` is the `SkipFirstFrame` on hook_backtrace's stack, which
    // outlives the walk that calls this; the walk calls it on one thread.
    let s = unsafe { &mut *(arg as *mut SkipFirstFrame) };
    if !s.skipped {
        s.skipped = true;
        return 0; // _URC_NO_REASON: walk on.
    }
    // SAFETY: the caller's callback, with its own argument and the walk's context.
    unsafe { (s.trace)(ctx, s.arg) }
}

/// `_Unwind_Backtrace`: the walk starts in this hook (the stub jumped here,
/// so the hook's return address is the caller's own), and its frame is
/// left out, as glibc's `backtrace` hook does; until the twenty-eighth
/// session every walk (`RUST_BACKTRACE=full`, the `backtrace` crate) began
/// with `ftramp_runtime::unwind::hook_backtrace`.
extern "C-unwind" fn hook_backtrace(trace: *mut c_void, arg: *mut c_void, caller_sp: usize) -> Code {
    let canary = Cell::new(0u64);
    before(&canary, caller_sp, frame_pointer());
    let f: unsafe extern "C-unwind" fn(*mut c_void, *mut c_void) -> Code = real(Entry::Backtrace);
    let r = if trace.is_null() {
        // SAFETY: the real function, with the caller's arguments.
        unsafe { f(trace, arg) }
    } else {
        let mut skip = SkipFirstFrame {
            // SAFETY: a non-null callback of the walk's type, as the caller passed it.
            trace: unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C-unwind" fn(*mut c_void, *mut c_void) -> Code>(trace) },
            arg,
            skipped: false,
        };
        // SAFETY: the real function, with our callback and its state, which
        // lives on this frame until the walk returns.
        unsafe { f(skip_first_frame as *mut c_void, &mut skip as *mut SkipFirstFrame as *mut c_void) }
    };
    std::hint::black_box(&canary);
    after();
    r
}

/// glibc's `backtrace()`, which reaches libgcc's `_Unwind_Backtrace`
/// through its own `dlsym` (no GOT a hook could rewrite): restored around
/// the whole walk like `_Unwind_Backtrace`, so a program that logs its own
/// stack (a crash or watchdog report) gets every frame, as untraced.
extern "C-unwind" fn hook_glibc_backtrace(buf: *mut *mut c_void, size: libc::c_int, caller_sp: usize) -> libc::c_int {
    let canary = Cell::new(0u64);
    before(&canary, caller_sp, frame_pointer());
    let f: unsafe extern "C-unwind" fn(*mut *mut c_void, libc::c_int) -> libc::c_int = real(Entry::GlibcBacktrace);
    // The walk starts in this hook (the stub jumped here, so the hook's
    // return address is the caller's own): the first frame is left out.
    // Through a buffer one longer, on the stack (crash handlers call
    // `backtrace`, maybe on a small alternate stack: no allocation, and
    // 512 bytes), when the caller's is shorter; else in place, which loses
    // the outermost frame of a buffer the walk fills.
    const ROOM: usize = 64;
    let mut local = [std::ptr::null_mut::<c_void>(); ROOM];
    let n = if size <= 0 {
        0
    } else if (size as usize) < ROOM {
        // SAFETY: the real function, with a buffer of `size + 1` entries of ours.
        let r = unsafe { f(local.as_mut_ptr(), size + 1) }.max(0) as usize;
        let n = r.saturating_sub(1).min(size as usize);
        // SAFETY: the caller's buffer holds `size` >= `n` entries.
        unsafe { std::ptr::copy_nonoverlapping(local.as_ptr().add(1), buf, n) };
        n
    } else {
        // SAFETY: the real function, with the caller's arguments.
        let r = unsafe { f(buf, size) }.max(0) as usize;
        // SAFETY: `r` <= `size` entries of the caller's buffer were written.
        unsafe { std::ptr::copy(buf.add(1), buf, r.saturating_sub(1)) };
        r.saturating_sub(1)
    };
    std::hint::black_box(&canary);
    after();
    n as libc::c_int
}

/// `__cxa_begin_catch`, called by the catching frame's landing pad at the
/// sp of its call that threw: frames entered at or below it were unwound.
extern "C" fn hook_begin_catch(exc: Exc, caller_sp: usize) -> *mut c_void {
    let _ = THREAD.try_with(|t| {
        crate::fgraph::with_thread_frames(|fr, rth| {
            if t.restored.try_borrow().is_ok_and(|r| r.is_empty()) {
                return;
            }
            let st = Stacks { sp: caller_sp, thread: restored_stack(t), alt: alt_stack() };
            let mut dead = 0;
            fr.each(&mut |_, _, fsp| {
                let gone = !st.live(fsp) && (st.on_alt(fsp) == st.on_alt(caller_sp));
                dead += usize::from(gone);
                gone
            });
            for _ in 0..dead {
                fr.drop_innermost();
            }
            rehijack(fr, t, &st, rth, &|fsp| st.live(fsp));
        });
    });
    let f: unsafe extern "C" fn(Exc) -> *mut c_void = real(Entry::BeginCatch);
    // SAFETY: the real function, with the caller's argument.
    unsafe { f(exc) }
}

/// `swapcontext`: the frames of the stack left are dropped ([`leave_stack`]);
/// when the saved context is resumed, the real function returns here.
/// Entered through a `ctx_stub!`, with the caller's sp and where the
/// return address is.
extern "C" fn hook_swapcontext(oucp: *mut c_void, ucp: *const c_void, caller_sp: usize, ret_slot: usize) -> libc::c_int {
    leave_stack(caller_sp, ret_slot, frame_pointer());
    let f: unsafe extern "C" fn(*mut c_void, *const c_void) -> libc::c_int = real(Entry::SwapContext);
    // SAFETY: the real function, with the caller's arguments.
    unsafe { f(oucp, ucp) }
}

/// Boost.Context's `transfer_t` (`{ fcontext_t fctx; void *data; }`),
/// returned in two registers.
#[repr(C)]
struct Transfer {
    fctx: *mut c_void,
    data: *mut c_void,
}

/// Boost.Context's `jump_fcontext(to, vp)` (libboost_context, called
/// through the PLT by the inline code of `fiber`, `continuation`,
/// Coroutine2 and Fiber): a stack switch like `swapcontext`'s, done as
/// [`hook_swapcontext`] does; when the context left is resumed, the real
/// function returns here with what was passed.
extern "C" fn hook_jump_fcontext(to: *mut c_void, vp: *mut c_void, caller_sp: usize, ret_slot: usize) -> Transfer {
    leave_stack(caller_sp, ret_slot, frame_pointer());
    let f: unsafe extern "C" fn(*mut c_void, *mut c_void) -> Transfer = real(Entry::JumpFcontext);
    // SAFETY: the real function, with the caller's arguments.
    unsafe { f(to, vp) }
}

/// Boost.Context's `ontop_fcontext(to, vp, fn)`: a switch to `to` that
/// calls `fn` on top of it first; as [`hook_jump_fcontext`].
extern "C" fn hook_ontop_fcontext(to: *mut c_void, vp: *mut c_void, func: *mut c_void, caller_sp: usize, ret_slot: usize) -> Transfer {
    leave_stack(caller_sp, ret_slot, frame_pointer());
    let f: unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_void) -> Transfer = real(Entry::OntopFcontext);
    // SAFETY: the real function, with the caller's arguments.
    unsafe { f(to, vp, func) }
}

/// `setcontext`: as [`hook_swapcontext`]; returns only on an error.
extern "C" fn hook_setcontext(ucp: *const c_void, caller_sp: usize, ret_slot: usize) -> libc::c_int {
    leave_stack(caller_sp, ret_slot, frame_pointer());
    let f: unsafe extern "C" fn(*const c_void) -> libc::c_int = real(Entry::SetContext);
    // SAFETY: the real function, with the caller's argument.
    unsafe { f(ucp) }
}

/// `pthread_exit`: glibc unwinds the thread with `_Unwind_ForcedUnwind`,
/// which it reaches through `dlsym` (no GOT to hook), running every
/// frame's cleanups; restoring first lets it walk past the traced frames
/// (else it stops at the first hijacked return, and the destructors above
/// it never run).  Like `_Unwind_Resume`, this never returns: the canary
/// stays in this frame while the unwinder runs.
extern "C-unwind" fn hook_pthread_exit(retval: *mut c_void, caller_sp: usize) {
    let canary = Cell::new(0u64);
    before(&canary, caller_sp, frame_pointer());
    let f: unsafe extern "C-unwind" fn(*mut c_void) = real(Entry::PthreadExit);
    // SAFETY: the real function, with the caller's argument.
    unsafe { f(retval) };
    std::hint::black_box(&canary);
    fatal(b"ftramp unwind: pthread_exit returned\n")
}

/// `pthread_cancel`: the cancelled thread starts its forced unwind inside
/// libc, where no hook sees it; `return_to_handler`'s FDE lets the
/// unwinder past its traced frames, so it is registered first (see
/// [`register_return_fde`]).
extern "C" fn hook_pthread_cancel(thread: libc::pthread_t, _caller_sp: usize) -> libc::c_int {
    register_return_fde();
    let f: unsafe extern "C" fn(libc::pthread_t) -> libc::c_int = real(Entry::PthreadCancel);
    // SAFETY: the real function, with the caller's argument.
    unsafe { f(thread) }
}

/// A hook's entry stub: a hidden global function `$name` in its own
/// section whose body is the `x86_64` or the `aarch64` lines, with
/// `{hook}` naming `$hook`.
macro_rules! hook_stub {
    ($name:literal, $hook:path, x86_64: [$($x86:expr),* $(,)?], aarch64: [$($a64:expr),* $(,)?]) => {
        #[cfg(target_arch = "x86_64")]
        std::arch::global_asm!(
            concat!(".pushsection .text.", $name, ",\"ax\",@progbits"),
            concat!(".globl ", $name),
            concat!(".hidden ", $name),
            concat!(".type ", $name, ",@function"),
            concat!($name, ":"),
            $($x86,)*
            concat!(".size ", $name, ", . - ", $name),
            ".popsection",
            hook = sym $hook,
        );
        #[cfg(target_arch = "aarch64")]
        std::arch::global_asm!(
            concat!(".pushsection .text.", $name, ",\"ax\",%progbits"),
            concat!(".globl ", $name),
            concat!(".hidden ", $name),
            concat!(".type ", $name, ",%function"),
            concat!($name, ":"),
            $($a64,)*
            concat!(".size ", $name, ", . - ", $name),
            ".popsection",
            hook = sym $hook,
        );
    };
}

/// A stub `$name` that jumps to `$hook` with the caller's sp in argument
/// register `$x86` / `$a64` (the one after the real function's arguments).
macro_rules! stub {
    ($name:literal, $hook:path, $x86:literal, $a64:literal) => {
        hook_stub!(
            $name,
            $hook,
            // Above the return address: the caller's sp.
            x86_64: [concat!("lea ", $x86, ", [rsp + 8]"), "jmp {hook}"],
            aarch64: [concat!("mov ", $a64, ", sp"), "b {hook}"]
        );
    };
}

/// A stub `$name` for a context-switch hook: `$hook` gets the caller's sp
/// in argument register `$x86` / `$a64` and the address of the return
/// address in the next one (`$x86b` / `$a64b`).  x86_64: the stack slot,
/// and the stub jumps.  aarch64: the stub saves x30 in a frame record of
/// its own, passes that word, and returns with what the hook left there.
macro_rules! ctx_stub {
    ($name:literal, $hook:path, $x86:literal, $x86b:literal, $a64:literal, $a64b:literal) => {
        hook_stub!(
            $name,
            $hook,
            x86_64: [concat!("lea ", $x86, ", [rsp + 8]"), concat!("mov ", $x86b, ", rsp"), "jmp {hook}"],
            aarch64: [
                concat!("mov ", $a64, ", sp"),
                "stp x29, x30, [sp, #-16]!",
                "mov x29, sp",
                concat!("add ", $a64b, ", sp, #8"),
                "bl {hook}",
                "ldp x29, x30, [sp], #16",
                "ret",
            ]
        );
    };
}

stub!("ftramp_unwind_raise", hook_raise, "rsi", "x1");
stub!("ftramp_unwind_resume", hook_resume, "rsi", "x1");
stub!("ftramp_unwind_resume_or_rethrow", hook_resume_or_rethrow, "rsi", "x1");
stub!("ftramp_unwind_forced", hook_forced, "rcx", "x3");
stub!("ftramp_unwind_backtrace", hook_backtrace, "rdx", "x2");
stub!("ftramp_unwind_begin_catch", hook_begin_catch, "rsi", "x1");
ctx_stub!("ftramp_unwind_swapcontext", hook_swapcontext, "rdx", "rcx", "x2", "x3");
ctx_stub!("ftramp_unwind_setcontext", hook_setcontext, "rsi", "rdx", "x1", "x2");
stub!("ftramp_unwind_pthread_exit", hook_pthread_exit, "rsi", "x1");
stub!("ftramp_unwind_pthread_cancel", hook_pthread_cancel, "rsi", "x1");
stub!("ftramp_unwind_glibc_backtrace", hook_glibc_backtrace, "rdx", "x2");
ctx_stub!("ftramp_unwind_jump_fcontext", hook_jump_fcontext, "rdx", "rcx", "x2", "x3");
ctx_stub!("ftramp_unwind_ontop_fcontext", hook_ontop_fcontext, "rcx", "r8", "x3", "x4");

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
extern "C" {
    // Only their addresses are used: they go into GOTs.
    fn ftramp_unwind_raise();
    fn ftramp_unwind_resume();
    fn ftramp_unwind_resume_or_rethrow();
    fn ftramp_unwind_forced();
    fn ftramp_unwind_backtrace();
    fn ftramp_unwind_begin_catch();
    fn ftramp_unwind_swapcontext();
    fn ftramp_unwind_setcontext();
    fn ftramp_unwind_pthread_exit();
    fn ftramp_unwind_pthread_cancel();
    fn ftramp_unwind_glibc_backtrace();
    fn ftramp_unwind_jump_fcontext();
    fn ftramp_unwind_ontop_fcontext();
}

/// The hooks' entry stubs, in [`HOOKED`] order.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn hook_addrs() -> Vec<usize> {
    let stubs: [unsafe extern "C" fn(); HOOKED.len()] = [
        ftramp_unwind_raise,
        ftramp_unwind_resume,
        ftramp_unwind_resume_or_rethrow,
        ftramp_unwind_forced,
        ftramp_unwind_backtrace,
        ftramp_unwind_begin_catch,
        ftramp_unwind_swapcontext,
        ftramp_unwind_setcontext,
        ftramp_unwind_pthread_exit,
        ftramp_unwind_pthread_cancel,
        ftramp_unwind_glibc_backtrace,
        ftramp_unwind_jump_fcontext,
        ftramp_unwind_ontop_fcontext,
    ];
    stubs.iter().map(|f| *f as usize).collect()
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn hook_addrs() -> Vec<usize> {
    Vec::new()
}

#[cfg(test)]
mod tests {
    use gimli::{BaseAddresses, CfaRule, EhFrame, Evaluation, EvaluationResult, LittleEndian, Location, Pointer, RegisterRule, UnwindContext, UnwindSection, Value};

    /// The return address the FDE's rule computes when the return-address
    /// register holds `reg`.
    fn eval_ra(eh: &EhFrame<gimli::EndianSlice<'_, LittleEndian>>, rule: RegisterRule<usize>, ra: gimli::Register, reg: u64) -> u64 {
        let RegisterRule::ValExpression(e) = rule else { panic!("not a val_expression: {rule:?}") };
        let e = e.get(eh).unwrap();
        let encoding = gimli::Encoding { address_size: 8, format: gimli::Format::Dwarf32, version: 4 };
        let mut ev = Evaluation::new(e.0, encoding);
        ev.set_initial_value(0x1000);
        let mut r = ev.evaluate().unwrap();
        loop {
            match r {
                EvaluationResult::Complete => break,
                EvaluationResult::RequiresRegister { register, .. } => {
                    assert_eq!(register, ra, "reads the return-address register");
                    r = ev.resume_with_register(Value::Generic(reg)).unwrap();
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        match ev.result().as_slice() {
            [p] => match p.location {
                Location::Address { address } => address,
                ref l => panic!("{l:?}"),
            },
            ps => panic!("{ps:?}"),
        }
    }

    /// Read back with gimli's reader: the FDE covers `rth - 1` and `rth`
    /// only, names the personality, keeps the CFA at sp and yields the
    /// saved return address, or 0 while that is `rth`.
    #[test]
    fn the_return_fde_is_a_frame_of_size_zero() {
        let (rth, pers) = (0x7f12_3456_7005usize, 0x5555_0000_1230usize);
        let bytes = super::return_eh_frame(rth, pers);
        assert_eq!(bytes[bytes.len() - 4..], [0; 4], "terminated");
        let mut eh = EhFrame::new(&bytes, LittleEndian);
        eh.set_address_size(8);
        let bases = BaseAddresses::default();
        let (sp, ra) = if cfg!(target_arch = "aarch64") { (gimli::AArch64::SP, gimli::AArch64::X30) } else { (gimli::X86_64::RSP, gimli::X86_64::RA) };
        let fde = eh.fde_for_address(&bases, rth as u64, EhFrame::cie_from_offset).unwrap();
        assert_eq!(fde.personality(), Some(Pointer::Direct(pers as u64)));
        assert_eq!(fde.cie().return_address_register(), ra);
        let mut ctx = UnwindContext::new();
        for pc in [rth - 1, rth] {
            let row = eh.unwind_info_for_address(&bases, &mut ctx, pc as u64, EhFrame::cie_from_offset).unwrap();
            assert_eq!(*row.cfa(), CfaRule::RegisterAndOffset { register: sp, offset: 0 }, "pc {pc:#x}");
            assert_eq!(eval_ra(&eh, row.register(ra), ra, 0x4000_1234), 0x4000_1234);
            assert_eq!(eval_ra(&eh, row.register(ra), ra, rth as u64), 0, "not restored: the end");
        }
        for pc in [rth - 2, rth + 1] {
            assert!(eh.unwind_info_for_address(&bases, &mut ctx, pc as u64, EhFrame::cie_from_offset).is_err(), "pc {pc:#x}");
        }
    }
}
