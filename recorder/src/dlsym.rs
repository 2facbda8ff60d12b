//! The `dlsym` interposer: a library the program `dlopen`s is patched
//! before the program gets a function of it.
//!
//! The module watcher patches a new library within ~10 ms of its `dlopen`;
//! a program that calls into it at once (`dlopen`, `dlsym`, call: the
//! plugin pattern) ran those first calls untraced.  `dlopen` itself cannot
//! be wrapped by a function that calls it: glibc takes the address its
//! call returns to as the caller, whose `RUNPATH` and `$ORIGIN` find the
//! library, and a wrapper would be that caller.  `dlsym` is the next step
//! of the pattern, so it is wrapped the same way it is called: the stub
//! below saves the arguments, runs
//! [`before_dlsym`] (which has the engine patch, and the recorder name,
//! what any loader change brought first, see [`sync_new_modules`]), and
//! *jumps* to libc's `dlsym`, so that the return address glibc reads (for
//! `RTLD_NEXT` and `RTLD_DEFAULT`) is still the program's.
//!
//! With the audit module, the library is patched earlier still, inside
//! `dlopen` before its constructors run ([`ftramp_recorder_objects_added`]),
//! and the check here finds it known; without it (`FTRAMP_AUDIT=`,
//! an old glibc), calls into a new library made before any `dlsym`, e.g.
//! by its own constructors, are left to the watcher.
//!
//! `dlopen` and `dlmopen` get such a stub with no check, only to give
//! glibc the real return address when a traced function tail-called them
//! under function_graph ([`before_dlopen`]).  (`dlvsym`, which the recorder
//! itself uses to find libc's functions, is left alone.)
//!
//! `vfork` gets a stub too, for another reason: its child runs on the
//! calling thread's memory until it `exec`s or `_exit`s, and a wrapper's
//! frame would be returned from twice.  Its hook puts the thread's slot
//! aside, so that the child's calls are not written as the thread's
//! ([`before_vfork`]).
//!
//! `dlclose` is interposed too (a plain wrapper: glibc's does not look at
//! its caller): before a library can go away, the functions that got ids
//! since the writer last looked are named ([`before_dlclose`]), so that the
//! calls a library loaded and closed at once made (its constructors',
//! destructors') are not left as bare addresses, whoever patched it.

use std::ffi::{c_char, c_void};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// libc's `dlsym`, `dlclose`, `dlopen` and `dlmopen` (0: not looked up yet).
static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);
static REAL_DLCLOSE: AtomicUsize = AtomicUsize::new(0);
static REAL_DLOPEN: AtomicUsize = AtomicUsize::new(0);
static REAL_DLMOPEN: AtomicUsize = AtomicUsize::new(0);
static REAL_VFORK: AtomicUsize = AtomicUsize::new(0);

/// `find()`, looked up once into `cache`.
fn cached(cache: &AtomicUsize, find: impl FnOnce() -> usize) -> usize {
    let r = cache.load(Relaxed);
    if r != 0 {
        return r;
    }
    let p = find();
    cache.store(p, Relaxed);
    p
}

/// libc's `name`, looked up once into `cache` with `dlvsym`, which is not
/// interposed ([`next_versioned`]).
fn real_cached(cache: &AtomicUsize, name: &std::ffi::CStr) -> usize {
    cached(cache, || next_versioned(name))
}

/// libc's `name` (a libdl function), looked up with `dlvsym`, which is not
/// interposed: glibc 2.34 moved them into libc.so.6 as GLIBC_2.34; before,
/// the base version of the arch.
fn next_versioned(name: &std::ffi::CStr) -> usize {
    let versions: &[&std::ffi::CStr] = if cfg!(target_arch = "aarch64") { &[c"GLIBC_2.34", c"GLIBC_2.17"] } else { &[c"GLIBC_2.34", c"GLIBC_2.2.5"] };
    for v in versions {
        // SAFETY: dlvsym with NUL-terminated strings; RTLD_NEXT is valid in
        // a shared object.
        let p = unsafe { libc::dlvsym(libc::RTLD_NEXT, name.as_ptr(), v.as_ptr()) } as usize;
        if p != 0 {
            return p;
        }
    }
    cannot_find(name)
}

/// Says that libc's `name` is missing and stops: without it no call could
/// be answered, and returning into nothing would be worse.
fn cannot_find(name: &std::ffi::CStr) -> ! {
    let msg = format!("ftramp record: cannot find libc's {}\n", name.to_string_lossy());
    // SAFETY: write(2) of a live buffer.
    unsafe { libc::write(2, msg.as_ptr() as *const c_void, msg.len()) };
    std::process::abort()
}

/// What the stub jumps to and with which return address.
#[repr(C)]
struct Jump {
    to: usize,
    ret: usize,
}

/// Run by the stub before every `dlsym`, with the return address `ret` the
/// call has and the stack pointer `sp` it entered with (x86_64: the
/// address of the return address): returns libc's `dlsym` for the stub to
/// jump to, and the return address to give it.
///
/// That is `ret`, the program's, unless a traced function tail-called
/// `dlsym` (`return dlsym(RTLD_NEXT, name);` at `-O2`): under function_graph
/// its own return address, which the jump hands on, is `return_to_handler`,
/// and glibc, which finds the caller's object from it, found none and
/// answered `RTLD_NEXT` with NULL ("RTLD_NEXT used in code not dynamically
/// loaded": a wrapper library's lookup of the next `puts` failed, natively
/// and on aarch64, until the twenty-ninth session).  Then the real return
/// address goes in its place, as untraced: `dlsym` returns straight to the
/// tail-caller's caller, and the tail-caller's frame, left without its
/// return, is dropped as a `longjmp` leaves one (its call shows as
/// unwound).
extern "C" fn before_dlsym(ret: usize, sp: usize) -> Jump {
    let real = real_cached(&REAL_DLSYM, c"dlsym");
    // No panic may cross into the program.
    let _ = std::panic::catch_unwind(sync_new_modules);
    Jump { to: real, ret: ftramp_runtime::fgraph::ret_addr(ret, sp) }
}

std::thread_local! {
    /// This thread is in [`on_program_thread`] (a `dlsym` or `dlclose`
    /// made by what it calls goes straight to libc).
    static IN_SYNC: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The loader generation [`sync_new_modules`] last gave up waiting for
/// (adds in the high half, subs in the low): it does not wait for it again.
static GAVE_UP: AtomicU64 = AtomicU64::new(u64::MAX);

/// How long a `dlsym` waits for the engine, busy with the same change on
/// the watcher thread, before it lets the program go on: a bound for a
/// watcher that cannot go on (waiting for the loader's lock, held by a
/// `dlopen` that waits for this thread), not a budget for the work, which
/// natively takes well under a millisecond for an ordinary library.  Under
/// qemu-user the unwinder's hooks for a library that brings libstdc++
/// (which the watcher now puts in before it patches the library,
/// `unwind::hooks_cover`) and the patching took 30 to 500 ms on a loaded
/// machine, and with the former 50 ms the program often went on before
/// its plugin was traced.
const WAIT: Duration = Duration::from_millis(1000);

/// If a library was loaded or unloaded since the engine last looked, has
/// the engine patch (or forget) it now, on this thread, and the recorder
/// give its functions ids and names.  Not from a tracer callback, nor the
/// runtime's own threads, nor reentered; not before the tracer is
/// registered nor in a child the recorder does not follow.
fn sync_new_modules() {
    use ftramp_runtime::ftrace::{modules_handled, refresh_if_modules_changed};
    // The cheapest tests first.  Nothing at all before recording started: a
    // sanitizer runtime calls dlsym while it sets up its interceptors, and
    // `modules_handled`'s dl_iterate_phdr would then reach TSan's
    // interceptor before it has the real function (a jump to address 0).
    if !crate::session::started_here_or_before_fork() {
        return;
    }
    // Nothing registered for the engine to patch: the recorder looks for
    // a library with sites itself (and then registers the tracer).
    if crate::session::waiting_for_sites() {
        on_program_thread(crate::session::name_new_sites_or_register);
        return;
    }
    if modules_handled() {
        return;
    }
    on_program_thread(|| {
        let gen = crate::session::loader_generation_word;
        if GAVE_UP.load(Relaxed) == gen() {
            return;
        }
        let deadline = Instant::now() + WAIT;
        loop {
            // (Returns at once when the watcher holds the engine: then wait
            // for it to finish the same work.)
            refresh_if_modules_changed();
            if modules_handled() {
                break;
            }
            if Instant::now() >= deadline {
                GAVE_UP.store(gen(), Relaxed);
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        // The new functions' ids and names too: a library unloaded before
        // the writer's next look would leave its calls nameless.
        crate::session::name_new_sites();
    });
}

/// Runs `f` unless this is no program thread to do loader work on: before
/// recording started here (or in the image this was forked from), inside
/// a tracer callback, on the runtime's own threads, or inside another such
/// call on this thread (what `f` calls may `dlsym` or `dlclose` itself).
fn on_program_thread(f: impl FnOnce()) {
    if !crate::session::started_here_or_before_fork()
        || !crate::session::started()
        || ftramp_runtime::grace::dispatch_depth() > 0
        || ftramp_runtime::thread::is_helper()
        || IN_SYNC.with(|b| b.replace(true))
    {
        return;
    }
    f();
    IN_SYNC.with(|b| b.set(false));
}

/// Called by the audit module (`recorder/audit`) inside a `dlopen`, once
/// the loader has mapped the new objects and before it relocates them or
/// runs their constructors (`la_activity(LA_ACT_CONSISTENT)` after
/// `LA_ACT_ADD`), on the thread that called `dlopen`, under the loader's
/// lock: has the engine patch the new objects there
/// ([`ftramp_runtime::ftrace::refresh_while_loading`]) and the recorder
/// name their functions, so that their constructors' calls, and calls the
/// program makes into them before any `dlsym` (callbacks a constructor
/// registered), are recorded.  When the engine or the recorder's state is
/// held by a thread that may be waiting for the loader's lock, it leaves
/// them to the watcher and the writer, as without the audit module.
#[no_mangle]
pub extern "C" fn ftramp_recorder_objects_added() {
    // No panic may cross into the loader.
    let _ = std::panic::catch_unwind(objects_added);
}

fn objects_added() {
    on_program_thread(|| {
        let _held = ftramp_runtime::sites::LoaderHeld::enter();
        if ftramp_runtime::ftrace::refresh_while_loading() {
            crate::session::name_new_sites_while_loading();
        }
    });
}

/// Names what the loader's changes since the writer last looked brought,
/// before the program's `dlclose` can unload it.  Not from the runtime's
/// own threads or calls (which `dlclose` the handles they take to wait for
/// the loader), nor reentered, nor before recording started.
fn before_dlclose() {
    on_program_thread(crate::session::name_new_sites);
}

/// A stub that keeps the first three integer arguments, has `$hook(return
/// address, entry sp)` say where to jump and with which return address
/// (the program's, the real one if it was `return_to_handler`), and jumps
/// there: glibc reads that address as the caller's.
macro_rules! jump_stub {
    ($(#[$doc:meta])* $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty, $hook:ident) => {
        $(#[$doc])*
        #[no_mangle]
        #[unsafe(naked)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            #[cfg(target_arch = "x86_64")]
            std::arch::naked_asm!(
                // rsp = 8 mod 16 at entry; after three pushes: 0 mod 16.
                "push rdi",
                "push rsi",
                "push rdx",
                "mov rdi, [rsp + 24]",
                "lea rsi, [rsp + 24]",
                "call {hook}",
                "mov [rsp + 24], rdx",
                "pop rdx",
                "pop rsi",
                "pop rdi",
                "jmp rax",
                hook = sym $hook,
            );
            #[cfg(target_arch = "aarch64")]
            std::arch::naked_asm!(
                "stp x29, x30, [sp, #-48]!",
                "mov x29, sp",
                "stp x0, x1, [sp, #16]",
                "str x2, [sp, #32]",
                "mov x0, x30",
                "add x1, sp, #48",
                "bl {hook}",
                "mov x16, x0",
                "mov x17, x1",
                "ldp x0, x1, [sp, #16]",
                "ldr x2, [sp, #32]",
                "ldp x29, x30, [sp], #48",
                "mov x30, x17",
                "br x16",
                hook = sym $hook,
            );
        }
    };
}

jump_stub!(
    /// `dlsym`: see the module docs.
    ///
    /// # Safety
    /// As libc's `dlsym`.
    dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void,
    before_dlsym
);

/// `dlclose`: see the module docs.
///
/// # Safety
/// As libc's `dlclose`.
#[no_mangle]
pub unsafe extern "C" fn dlclose(handle: *mut c_void) -> std::ffi::c_int {
    // No panic may cross into the program.
    let _ = std::panic::catch_unwind(before_dlclose);
    let real = real_cached(&REAL_DLCLOSE, c"dlclose");
    // SAFETY: `real` is libc's `dlclose` (found by name and version), whose
    // signature this is; the caller's contract is libc's.
    unsafe {
        let f: unsafe extern "C" fn(*mut c_void) -> std::ffi::c_int = std::mem::transmute(real);
        f(handle)
    }
}

/// Run by the `dlopen` stub: libc's `dlopen` and the return address to give
/// it, the program's, with a hijacked one replaced as for `dlsym`
/// ([`before_dlsym`]).  glibc takes the object that address is in as the
/// caller and searches the library in that caller's `RPATH`/`RUNPATH`
/// (and its namespace): a traced function that tail-calls `dlopen`
/// (`return dlopen(name, RTLD_NOW);` at `-O2`) under function_graph hands
/// on `return_to_handler`, in no object, and glibc searched the main
/// program's paths instead of the calling library's; a plugin found
/// through the library's `RUNPATH` was not found until the twenty-ninth
/// session.
extern "C" fn before_dlopen(ret: usize, sp: usize) -> Jump {
    Jump { to: real_cached(&REAL_DLOPEN, c"dlopen"), ret: ftramp_runtime::fgraph::ret_addr(ret, sp) }
}

/// [`before_dlopen`] for `dlmopen`.
extern "C" fn before_dlmopen(ret: usize, sp: usize) -> Jump {
    Jump { to: real_cached(&REAL_DLMOPEN, c"dlmopen"), ret: ftramp_runtime::fgraph::ret_addr(ret, sp) }
}

jump_stub!(
    /// `dlopen`, which glibc answers from its caller's paths: see
    /// [`before_dlopen`].
    ///
    /// # Safety
    /// As libc's `dlopen`.
    dlopen(file: *const c_char, mode: std::ffi::c_int) -> *mut c_void,
    before_dlopen
);

jump_stub!(
    /// `dlmopen`: see [`before_dlopen`].
    ///
    /// # Safety
    /// As libc's `dlmopen`.
    dlmopen(lmid: libc::Lmid_t, file: *const c_char, mode: std::ffi::c_int) -> *mut c_void,
    before_dlmopen
);

/// Run by the `vfork` stub, in the thread calling `vfork`: puts its slot
/// aside while the child may run ([`crate::pool::Local::enter_vfork`]) and
/// returns libc's `vfork` with the program's return address.  (`vfork`
/// returns twice, so compilers never tail-call it: that address is never
/// a hijacked one.)
extern "C" fn before_vfork(ret: usize, _sp: usize) -> Jump {
    // Not `real_cached`: `vfork` kept its base version in glibc 2.34, and a
    // `dlvsym` of a version it lacks fails, which makes glibc allocate the
    // error with the program's `malloc`.
    let real = cached(&REAL_VFORK, || match crate::next(c"vfork") as usize {
        0 => cannot_find(c"vfork"),
        p => p,
    });
    crate::pool::local().enter_vfork();
    Jump { to: real, ret }
}

jump_stub!(
    /// `vfork`: see [`before_vfork`].
    ///
    /// # Safety
    /// As libc's `vfork`.
    vfork() -> libc::pid_t,
    before_vfork
);
