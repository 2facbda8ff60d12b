//! `libftramp_audit.so`: the `LD_AUDIT` module of `ftramp record`.
//!
//! # Why
//!
//! The recorder is an `LD_PRELOAD` library, and the loader runs the
//! constructors of independent libraries in the reverse of their load
//! order: a library the program links is initialised *before* the preload.
//! So its constructors (and whatever they call) ran before the recorder had
//! patched anything, and their calls were silently missing from the trace;
//! so were the calls of the `atexit` handlers they registered, which run
//! after the recorder's own exit handler.  No constructor of ours can run
//! earlier, but the loader's audit interface can: glibc calls an audit
//! module's `la_activity(LA_ACT_CONSISTENT)` once every object of the
//! program is loaded and relocated and libc's early initialisation is done,
//! and *before* any constructor.  This module then calls the preload's
//! `ftramp_recorder_early_start`, which starts recording there; the
//! preload's own constructor later sees that and does nothing more.
//!
//! # How
//!
//! An audit module lives in a namespace of its own.  This one is `no_std`
//! and links nothing (no `DT_NEEDED`): a module that links libc makes the
//! loader map, relocate and initialise a second libc (and, from Rust's
//! `std`, `libgcc_s`) in every traced process, about 0.4 ms of its start.
//! So it finds the preload by walking the program's link map (remembered
//! from `la_objopen`) and looking the symbol up in each object's GNU hash
//! table; `dlsym` is not used there (glibc's `dlsym` crashes when an audit
//! module calls it from `la_activity` at start-up).  Having no libc, it
//! has no `environ` to hand on, and the program's libc sets its own only
//! in its constructor, after this point: it finds the environment where
//! the kernel put it, after the argument vector that the loader keeps in
//! `_dl_argv`, looked up the same way in the loader's own symbols.  (Not
//! `/proc/self/environ`, which the preload read at first: under qemu-user
//! that is qemu's environment, not the program's, and options given to
//! the program alone, `qemu -E FTRAMP_RECORD_DIR=…`, were not seen.)
//!
//! The same checkpoint comes again inside every `dlopen` that loads
//! something (`LA_ACT_ADD`, then `LA_ACT_CONSISTENT` once the new objects
//! are mapped, before they are relocated or initialised): the module then
//! calls the preload's `ftramp_recorder_objects_added`, which patches them
//! there, so their constructors' calls are recorded too.  It does nothing
//! else: no symbol binding is audited (`la_objopen` returns 0), so calls
//! through the PLT are not slowed down.  Without the preload (a program
//! `ftramp record` execs without recording, say) it does nothing at all.
//!
//! It is built by `build.rs` with `rustc` itself, not as a cargo target: a
//! `no_std` library needs `panic = "abort"`, which a workspace whose tests
//! unwind cannot give one crate.  Nothing in it can panic (no indexing, no
//! arithmetic that overflows checks, no `unwrap`).
//!
//! Every function here is called by the dynamic loader, which is why this
//! crate is all `unsafe` FFI; each block says why it is sound.

#![no_std]

use core::ffi::{c_char, c_uint};
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering::*};

/// `Elf64_Dyn` (every target of ftramp is 64-bit).
#[repr(C)]
pub struct Dyn {
    d_tag: i64,
    d_val: u64,
}

/// `Elf64_Sym`.
#[repr(C)]
struct Sym {
    st_name: u32,
    st_info: u8,
    st_other: u8,
    st_shndx: u16,
    st_value: u64,
    st_size: u64,
}

const DT_NULL: i64 = 0;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_GNU_HASH: i64 = 0x6fff_fef5;
const SHN_UNDEF: u16 = 0;

/// The GNU hash of a symbol name (the `DT_GNU_HASH` function).
fn gnu_hash(name: &[u8]) -> u32 {
    let mut h: u32 = 5381;
    for &c in name {
        h = h.wrapping_mul(33).wrapping_add(c as u32);
    }
    h
}

/// Never called: no operation here panics.  A hang would be seen where
/// undefined behaviour would not.
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    loop {
        core::hint::spin_loop();
    }
}

/// The loader's argument vector (`char **`; a `GLIBC_PRIVATE` symbol of
/// `ld.so`, as old as the loader): the environment follows its NULL.
const DL_ARGV: &[u8] = b"_dl_argv";

/// The symbol the preload exports for an early start.
const EARLY_START: &[u8] = b"ftramp_recorder_early_start";
/// The symbol the preload exports for objects a `dlopen` added.
const OBJECTS_ADDED: &[u8] = b"ftramp_recorder_objects_added";

/// `la_activity`'s flags: the namespace's link map is consistent again;
/// objects are being added; being deleted.
const LA_ACT_CONSISTENT: c_uint = 0;
const LA_ACT_ADD: c_uint = 1;
const LA_ACT_DELETE: c_uint = 2;
/// `Lmid_t` of the program's own namespace.
const LM_ID_BASE: isize = 0;

/// glibc's public `struct link_map` (the fields `<link.h>` declares).
#[repr(C)]
pub struct LinkMap {
    l_addr: usize,
    l_name: *const c_char,
    l_ld: *const Dyn,
    l_next: *const LinkMap,
    l_prev: *const LinkMap,
}

/// The first object of the program's namespace (the executable), and the
/// cookie the loader gave it (`la_activity` names a namespace by its first
/// object's cookie).
static HEAD: AtomicPtr<LinkMap> = AtomicPtr::new(core::ptr::null_mut());
static HEAD_COOKIE: AtomicPtr<usize> = AtomicPtr::new(core::ptr::null_mut());
/// The early start was attempted (once per process image).
static DONE: AtomicBool = AtomicBool::new(false);
/// The preload's `ftramp_recorder_objects_added` (0: none found).
static ADDED_HOOK: AtomicUsize = AtomicUsize::new(0);
/// The program's namespace is between `LA_ACT_ADD` and `LA_ACT_CONSISTENT`
/// (a `dlopen` is mapping objects).
static ADDING: AtomicBool = AtomicBool::new(false);

/// Accepts the loader's interface version (its `LAV_CURRENT`): what
/// changed between versions is the audit of PLT calls, which this module
/// does not do, and a glibc refuses versions older than some (2.36 on
/// aarch64 refuses 1).
///
/// # Safety
/// Called by the dynamic loader.
#[no_mangle]
pub unsafe extern "C" fn la_version(version: c_uint) -> c_uint {
    version
}

/// # Safety
/// Called by the dynamic loader with a valid link map.
#[no_mangle]
pub unsafe extern "C" fn la_objopen(map: *mut LinkMap, lmid: isize, cookie: *mut usize) -> c_uint {
    if lmid == LM_ID_BASE && HEAD.compare_exchange(core::ptr::null_mut(), map, Relaxed, Relaxed).is_ok() {
        HEAD_COOKIE.store(cookie, Relaxed);
    }
    // No LA_FLG_BINDTO / LA_FLG_BINDFROM: no symbol binding is audited.
    0
}

/// # Safety
/// Called by the dynamic loader.
#[no_mangle]
pub unsafe extern "C" fn la_activity(cookie: *mut usize, flag: c_uint) {
    // (The loader calls this under its lock: one call at a time.)
    match flag {
        LA_ACT_ADD => ADDING.store(cookie == HEAD_COOKIE.load(Relaxed), Relaxed),
        LA_ACT_DELETE => ADDING.store(false, Relaxed),
        LA_ACT_CONSISTENT if !DONE.load(Relaxed) => {
            ADDING.store(false, Relaxed);
            // SAFETY: called by the loader, which holds its lock.
            unsafe { start() }
        }
        LA_ACT_CONSISTENT => {
            let hook = ADDED_HOOK.load(Relaxed);
            if ADDING.swap(false, Relaxed) && hook != 0 {
                // SAFETY: the preload defines this symbol as
                // `extern "C" fn()`, and it is loaded for good (a start-up
                // object).
                unsafe {
                    let added: extern "C" fn() = core::mem::transmute(hook);
                    added();
                }
            }
        }
        _ => {}
    }
}

/// The start-up checkpoint: finds the preload and starts it early (and
/// remembers its hook for the objects later `dlopen`s add).
///
/// # Safety
/// Called from `la_activity` at the first `LA_ACT_CONSISTENT`.
unsafe fn start() {
    let mut map = HEAD.load(Relaxed) as *const LinkMap;
    if map.is_null() {
        return;
    }
    DONE.store(true, Relaxed);
    while !map.is_null() {
        // SAFETY: the loader's link map is a valid list while it calls us
        // (it holds its lock), and every object on it is mapped.
        let (found, next) = unsafe { (lookup(&*map, EARLY_START), (*map).l_next) };
        if let Some(addr) = found {
            // SAFETY: as above; the same object.
            if let Some(hook) = unsafe { lookup(&*map, OBJECTS_ADDED) } {
                ADDED_HOOK.store(hook, Relaxed);
            }
            // SAFETY: the loader's list, as above.
            let envp = unsafe { initial_envp(HEAD.load(Relaxed)) };
            // SAFETY: the preload defines this symbol as
            // `extern "C" fn(*const *const c_char)`, taking the process's
            // environment or null (then it finds it itself).
            unsafe {
                let start: unsafe extern "C" fn(*const *const c_char) = core::mem::transmute(addr);
                start(envp);
            }
            return;
        }
        map = next;
    }
}

/// The environment the process started with: the array the kernel put
/// on the initial stack right after the argument vector's NULL, found
/// through the loader's `_dl_argv`.  Null if no object on the list from
/// `map` defines that symbol.
///
/// # Safety
/// `map` is null or the head of the loader's list, which the loader holds.
unsafe fn initial_envp(mut map: *const LinkMap) -> *const *const c_char {
    while !map.is_null() {
        // SAFETY: a loaded object of the loader's list.
        if let Some(addr) = unsafe { lookup(&*map, DL_ARGV) } {
            // SAFETY: `_dl_argv` is the loader's `char **`, set before it
            // loads audit modules, to the NULL-terminated argument vector
            // on the initial stack, which the environment's NULL-terminated
            // vector follows.
            unsafe {
                let mut p = *(addr as *const *const *const c_char);
                if p.is_null() {
                    return core::ptr::null();
                }
                while !(*p).is_null() {
                    p = p.add(1);
                }
                return p.add(1);
            }
        }
        // SAFETY: as above.
        map = unsafe { (*map).l_next };
    }
    core::ptr::null()
}

/// Whether the NUL-terminated string at `p` is `want`, compared byte by
/// byte: `CStr` and slice equality would call libc's `strlen` and `memcmp`,
/// which this module, linking nothing, does not have.
///
/// # Safety
/// `p` points to a NUL-terminated string.
unsafe fn name_is(p: *const u8, want: &[u8]) -> bool {
    for (i, &c) in want.iter().enumerate() {
        // SAFETY: every byte before the string's NUL is readable, and a
        // mismatch (the NUL included) ends the loop.
        if unsafe { *p.add(i) } != c {
            return false;
        }
    }
    // SAFETY: the first `want.len()` bytes matched and are not NUL.
    unsafe { *p.add(want.len()) == 0 }
}

/// `want`'s address in `map`'s dynamic symbol table (GNU hash), if it
/// defines it.
///
/// # Safety
/// `map` is a loaded object of the loader's list.
unsafe fn lookup(map: &LinkMap, want: &[u8]) -> Option<usize> {
    if map.l_ld.is_null() {
        return None;
    }
    // The dynamic section's pointers are absolute once loaded, except
    // where the loader leaves a read-only section as it is (RISC-V, MIPS):
    // then they are offsets from the load address.
    let abs = |p: u64| -> usize {
        let p = p as usize;
        if p < map.l_addr {
            p.wrapping_add(map.l_addr)
        } else {
            p
        }
    };
    let (mut strtab, mut symtab, mut hash_table) = (0usize, 0usize, 0usize);
    let mut d = map.l_ld;
    loop {
        // SAFETY: the dynamic section is an array ended by DT_NULL.
        let e = unsafe { &*d };
        match e.d_tag {
            DT_NULL => break,
            DT_STRTAB => strtab = abs(e.d_val),
            DT_SYMTAB => symtab = abs(e.d_val),
            DT_GNU_HASH => hash_table = abs(e.d_val),
            _ => {}
        }
        // SAFETY: not past DT_NULL.
        d = unsafe { d.add(1) };
    }
    if strtab == 0 || symtab == 0 || hash_table == 0 {
        return None;
    }
    let hash = gnu_hash(want);
    // SAFETY: the GNU hash table's layout: nbuckets, symoffset,
    // bloom_size, bloom_shift (u32 each), bloom words (u64 on 64-bit
    // targets), buckets (u32), chain (u32), all mapped with the object;
    // symbol and string indexes come from that table and the symbols.
    unsafe {
        let h = hash_table as *const u32;
        let (nbuckets, symoffset, bloom_size) = (*h, *h.add(1), *h.add(2));
        if nbuckets == 0 {
            return None;
        }
        let buckets = h.add(4 + 2 * bloom_size as usize);
        let chain = buckets.add(nbuckets as usize);
        // `nbuckets` is not 0, so `%` does not panic.
        let mut i = *buckets.add((hash % nbuckets) as usize);
        if i < symoffset {
            return None;
        }
        loop {
            let h2 = *chain.add(i.wrapping_sub(symoffset) as usize);
            if (h2 | 1) == (hash | 1) {
                let sym = &*(symtab as *const Sym).add(i as usize);
                let name = strtab.wrapping_add(sym.st_name as usize) as *const u8;
                if sym.st_shndx != SHN_UNDEF && name_is(name, want) {
                    return Some(map.l_addr.wrapping_add(sym.st_value as usize));
                }
            }
            if h2 & 1 != 0 {
                return None;
            }
            i = i.wrapping_add(1);
        }
    }
}
