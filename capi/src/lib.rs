//! The C API of the ftramp runtime: `struct ftrace_ops` from C.
//!
//! Built as `libftramp.a` (staticlib) and `libftramp.so` (cdylib); the
//! declarations are in `include/ftramp.h`, which `tests/header.rs` keeps in
//! step with the functions and constants here.
//!
//! # The handle is the runtime's `Ops`
//!
//! `struct ftrace_ops *` is `Arc::into_raw` of an [`Ops`]: the pointer the
//! runtime hands to callbacks (`&Ops`) is the very pointer C registered, so
//! a callback receives its own handle and `ftramp_ops_private()` is one
//! load.  The C callback is stored as the ops' `func` without a Rust shim:
//!
//! ```text
//!   C     void (*)(unsigned long, unsigned long, struct ftrace_ops *, struct ftrace_regs *)
//!   Rust  extern "C" fn(usize, usize, &Ops, &mut FtraceRegs)
//! ```
//!
//! Both use the C calling convention with the same argument classes: on
//! the LP64 targets this crate builds for, `unsigned long` is 64 bits like
//! `usize` (checked at compile time below), and a reference to a sized type
//! is passed exactly as a pointer.  Rust documents both pairs as
//! ABI-compatible (`fn` pointer "ABI compatibility"), so calling the C
//! function through the Rust type is defined.  The C side never writes
//! through the ops pointer (the struct is opaque to it) and only passes
//! `fregs` back to the accessors here, so the `&Ops` / `&mut FtraceRegs`
//! aliasing rules hold.
//!
//! # Lifetime
//!
//! The C handle owns one strong count.  Registering clones the `Arc` into
//! the engine, which drops it only after unregistering *and* a grace period
//! (no thread left in the callback).  So "the count is 1" means "not
//! registered and no thread can be inside the callback": that is what
//! [`ftramp_ops_add_filter`] (which rebuilds the ops) and [`ftramp_ops_free`]
//! require, and why they are refused with `-EBUSY` otherwise.
//!
//! Calls that change registrations take one API lock; the functions a
//! callback may call (`ftramp_ops_private`, `ftramp_ops_recursion_misses`,
//! `ftrace_regs_*`, `ftramp_last_error`) take no lock, so a callback never
//! waits on a thread that waits for the callback's grace period.
//!
//! # Errors and panics
//!
//! Functions return 0 or a negative errno value (`-EINVAL`, `-EBUSY`, …,
//! see the header) and leave a message naming the bad input for
//! [`ftramp_last_error`].  Null pointers and bad UTF-8 are errors.  Every
//! entry point runs its body under `catch_unwind`, so no panic crosses into
//! C: a panic becomes `-EIO` (or a null / zero result) with its message.

use ftramp_codegen::Tier;
use ftramp_runtime::ftrace::{ftrace, OpsError, SiteDispatch};
use ftramp_runtime::ops::{Filter, Ops, OpsFlags};
use ftramp_runtime::{grace, FtraceRegs};
use libc::{c_char, c_double, c_int, c_uint, c_ulong, c_void};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::convert::identity as code;
use std::ffi::{CStr, CString};
use std::mem::ManuallyDrop;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, MutexGuard};

// The callback's integers are `unsigned long` in C and `usize` in the
// runtime: the same width, or the shared-`func` design does not hold.
const _: () = assert!(std::mem::size_of::<c_ulong>() == std::mem::size_of::<usize>());
const _: () = assert!(std::mem::size_of::<*const Ops>() == std::mem::size_of::<usize>());

/// `ftramp_func_t`: the C callback, as C declares it.
pub type FtrampFunc = unsafe extern "C" fn(ip: c_ulong, parent_ip: c_ulong, op: *mut Ops, fregs: *mut FtraceRegs);

/// `FTRAMP_OPS_FL_SAVE_REGS`
pub const FTRAMP_OPS_FL_SAVE_REGS: c_uint = OpsFlags::SAVE_REGS.0;
/// `FTRAMP_OPS_FL_RECURSION`
pub const FTRAMP_OPS_FL_RECURSION: c_uint = OpsFlags::RECURSION.0;
/// `FTRAMP_OPS_FL_IPMODIFY`
pub const FTRAMP_OPS_FL_IPMODIFY: c_uint = OpsFlags::IPMODIFY.0;
const ALL_FLAGS: c_uint = FTRAMP_OPS_FL_SAVE_REGS | FTRAMP_OPS_FL_RECURSION | FTRAMP_OPS_FL_IPMODIFY;

/// `ftramp_site_dispatch` results.
pub const FTRAMP_SITE_NOP: c_int = 0;
pub const FTRAMP_SITE_DIRECT_ARGS: c_int = 1;
pub const FTRAMP_SITE_DIRECT_REGS: c_int = 2;
pub const FTRAMP_SITE_LIST_ARGS: c_int = 3;
pub const FTRAMP_SITE_LIST_REGS: c_int = 4;

// ---------------------------------------------------------------------------
// Errors

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

struct CError {
    code: c_int,
    msg: String,
}

impl CError {
    fn new(code: c_int, msg: impl Into<String>) -> CError {
        CError { code: -code, msg: msg.into() }
    }
}

fn set_last_error(msg: &str) {
    let c = CString::new(msg.replace('\0', "\\0")).unwrap_or_default();
    // A thread being torn down has no last error any more.
    let _ = LAST_ERROR.try_with(|l| *l.borrow_mut() = c);
}

/// Runs `body` without letting a panic cross into C; failures set the
/// thread's last error.
fn ffi<T>(name: &str, on_error: impl FnOnce(c_int) -> T, body: impl FnOnce() -> Result<T, CError>) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            set_last_error(&format!("{name}: {}", e.msg));
            on_error(e.code)
        }
        Err(panic) => {
            let why = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            set_last_error(&format!("{name}: internal error: {why}"));
            on_error(-libc::EIO)
        }
    }
}

/// `const char *` argument as UTF-8 text.
///
/// # Safety
/// `p` is null or points at a NUL-terminated string.
unsafe fn text<'a>(p: *const c_char, what: &str) -> Result<&'a str, CError> {
    if p.is_null() {
        return Err(CError::new(libc::EINVAL, format!("{what} is NULL")));
    }
    // SAFETY: non-null, and the caller promises a NUL-terminated string.
    let c = unsafe { CStr::from_ptr(p) };
    c.to_str().map_err(|_| CError::new(libc::EINVAL, format!("{what} `{}` is not UTF-8", c.to_string_lossy())))
}

// ---------------------------------------------------------------------------
// Handles

/// What the API keeps per live handle: the filter items as given (an `Ops`
/// is rebuilt from them when one is added, and they name the ops in
/// messages).
#[derive(Default)]
struct HandleState {
    filter: Vec<String>,
    notrace: Vec<String>,
}

type Handles = BTreeMap<usize, HandleState>;

static HANDLES: Mutex<Handles> = Mutex::new(BTreeMap::new());

/// The API lock and the live handles.  Refused inside a callback: the
/// holder may be waiting for that very callback's grace period.
fn handles() -> Result<MutexGuard<'static, Handles>, CError> {
    if grace::dispatch_depth() > 0 {
        return Err(CError::new(libc::EDEADLK, "cannot be called from inside a callback"));
    }
    Ok(HANDLES.lock().unwrap_or_else(|e| e.into_inner()))
}

/// The state of a handle `ftramp_ops_new` returned and nobody freed.
fn known(hs: &mut Handles, op: *const Ops) -> Result<&mut HandleState, CError> {
    if op.is_null() {
        return Err(CError::new(libc::EINVAL, "ops is NULL"));
    }
    hs.get_mut(&(op as usize))
        .ok_or_else(|| CError::new(libc::EINVAL, format!("{op:p} is not an ops from ftramp_ops_new (or it was freed)")))
}

/// The handle's `Arc`, borrowed: dropping the result leaves the count alone.
///
/// # Safety
/// `op` is a live handle (`known` found it), so it came from
/// `Arc::into_raw` and still owns a strong count.
unsafe fn borrow_arc(op: *const Ops) -> ManuallyDrop<Arc<Ops>> {
    // SAFETY: as documented; ManuallyDrop keeps the handle's count.
    ManuallyDrop::new(unsafe { Arc::from_raw(op) })
}

/// Names an ops in messages by its filter.
fn describe(st: &HandleState) -> String {
    let list = |v: &[String]| v.iter().map(|s| format!("`{s}`")).collect::<Vec<_>>().join(", ");
    let mut d = if st.filter.is_empty() { "filter: every function".to_string() } else { format!("filter: {}", list(&st.filter)) };
    if !st.notrace.is_empty() {
        d += &format!("; notrace: {}", list(&st.notrace));
    }
    d
}

fn ops_error(e: OpsError, st: &HandleState) -> CError {
    let code = match &e {
        OpsError::AlreadyRegistered(_) | OpsError::IpModifyConflict { .. } => libc::EBUSY,
        OpsError::NotRegistered(_) => libc::ENOENT,
        OpsError::NoSites(_) => libc::ESRCH,
        OpsError::UnknownFlags(_) => libc::EINVAL,
        OpsError::FromCallback => libc::EDEADLK,
        OpsError::Runtime(_) => libc::EIO,
    };
    if let OpsError::NoSites(_) = e {
        // (The message names the filters already.)
        return CError::new(code, e.to_string());
    }
    CError::new(code, format!("{e} ({})", describe(st)))
}

// ---------------------------------------------------------------------------
// Ops

/// `struct ftrace_ops *ftramp_ops_new(ftramp_func_t func, unsigned int flags, void *private_data)`
///
/// A new, unregistered ops tracing every function (narrow it with
/// [`ftramp_ops_add_filter`] / [`ftramp_ops_add_notrace`]).  NULL on error
/// (`func` NULL, unknown flag bits).
#[no_mangle]
pub extern "C" fn ftramp_ops_new(func: Option<FtrampFunc>, flags: c_uint, private_data: *mut c_void) -> *mut Ops {
    ffi(
        "ftramp_ops_new",
        |_| std::ptr::null_mut(),
        || {
            let func = func.ok_or_else(|| CError::new(libc::EINVAL, "func is NULL"))?;
            if flags & !ALL_FLAGS != 0 {
                return Err(CError::new(libc::EINVAL, format!("unknown flags {:#x}", flags & !ALL_FLAGS)));
            }
            // SAFETY: the two function pointer types are ABI-compatible
            // (module docs: same calling convention, `unsigned long` is
            // `usize`, pointers are passed as references are).
            let func = unsafe { std::mem::transmute::<FtrampFunc, ftramp_runtime::ops::OpsFunc>(func) };
            let mut hs = handles()?;
            let ops = Arc::new(Ops::new(func).flags(OpsFlags(flags)).private(private_data as usize));
            let p = Arc::into_raw(ops);
            hs.insert(p as usize, HandleState::default());
            Ok(p as *mut Ops)
        },
    )
}

/// Adds one filter or notrace item, rebuilding the ops.
///
/// # Safety
/// `item` is NULL or a NUL-terminated string.
unsafe fn add_item(op: *mut Ops, item: *const c_char, notrace: bool) -> Result<c_int, CError> {
    let mut hs = handles()?;
    let st = known(&mut hs, op)?;
    // SAFETY: the caller's promise.
    let item = unsafe { text(item, "filter item") }?.trim().to_string();
    Filter::new().parse(&item).map_err(|e| CError::new(libc::EINVAL, e.to_string()))?;
    // SAFETY: `known` found the handle.
    let mut arc = unsafe { borrow_arc(op) };
    let Some(ops) = Arc::get_mut(&mut arc) else {
        return Err(CError::new(
            libc::EBUSY,
            format!("cannot add `{item}`: the ops is registered, or its unregistering has not finished ({})", describe(st)),
        ));
    };
    if notrace {
        st.notrace.push(item);
    } else {
        st.filter.push(item);
    }
    let build = |items: &[String]| items.iter().try_fold(Filter::new(), |f, i| f.parse(i));
    let filter = build(&st.filter).map_err(|e| CError::new(libc::EINVAL, e.to_string()))?;
    let notrace = build(&st.notrace).map_err(|e| CError::new(libc::EINVAL, e.to_string()))?;
    // The runtime holds no reference (get_mut succeeded): no thread can be
    // reading this ops, and its `entry` is set again on registering.
    *ops = Ops::new(ops.func()).flags(ops.get_flags()).private(ops.private).filter(filter).notrace(notrace);
    Ok(0)
}

/// `int ftramp_ops_add_filter(struct ftrace_ops *ops, const char *item)`
///
/// # Safety
/// `op` is NULL or a pointer; `item` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn ftramp_ops_add_filter(op: *mut Ops, item: *const c_char) -> c_int {
    // SAFETY: the caller's promise about `item`.
    ffi("ftramp_ops_add_filter", code, || unsafe { add_item(op, item, false) })
}

/// `int ftramp_ops_add_notrace(struct ftrace_ops *ops, const char *item)`
///
/// # Safety
/// As [`ftramp_ops_add_filter`].
#[no_mangle]
pub unsafe extern "C" fn ftramp_ops_add_notrace(op: *mut Ops, item: *const c_char) -> c_int {
    // SAFETY: the caller's promise about `item`.
    ffi("ftramp_ops_add_notrace", code, || unsafe { add_item(op, item, true) })
}

/// `int ftramp_register_ftrace_function(struct ftrace_ops *ops)`
///
/// # Safety
/// `op` is NULL or a pointer (checked against the live handles).
#[no_mangle]
pub unsafe extern "C" fn ftramp_register_ftrace_function(op: *mut Ops) -> c_int {
    ffi("ftramp_register_ftrace_function", code, || {
        let mut hs = handles()?;
        let st = known(&mut hs, op)?;
        // SAFETY: a live handle came from Arc::into_raw and owns a count;
        // this adds the one the engine keeps.
        let ops = unsafe {
            Arc::increment_strong_count(op);
            Arc::from_raw(op)
        };
        ftrace().register(ops).map_err(|e| ops_error(e, st))?;
        Ok(0)
    })
}

/// `int ftramp_unregister_ftrace_function(struct ftrace_ops *ops)`: when
/// it returns 0, the callback is never entered again and no thread is in it.
///
/// # Safety
/// `op` is NULL or a pointer (checked against the live handles).
#[no_mangle]
pub unsafe extern "C" fn ftramp_unregister_ftrace_function(op: *mut Ops) -> c_int {
    ffi("ftramp_unregister_ftrace_function", code, || {
        let mut hs = handles()?;
        let st = known(&mut hs, op)?;
        // SAFETY: `known` found the handle.
        let arc = unsafe { borrow_arc(op) };
        ftrace().unregister(&arc).map_err(|e| ops_error(e, st))?;
        Ok(0)
    })
}

/// `int ftramp_ops_free(struct ftrace_ops *ops)`: 0, or `-EBUSY` while
/// registered (or while its unregistering waits for a grace period).
/// NULL is a no-op.
///
/// # Safety
/// `op` is NULL or a pointer (checked against the live handles).
#[no_mangle]
pub unsafe extern "C" fn ftramp_ops_free(op: *mut Ops) -> c_int {
    if op.is_null() {
        return 0;
    }
    ffi("ftramp_ops_free", code, || {
        let mut hs = handles()?;
        let st = known(&mut hs, op)?;
        // SAFETY: `known` found the handle.
        let mut arc = unsafe { borrow_arc(op) };
        if Arc::get_mut(&mut arc).is_none() {
            return Err(CError::new(libc::EBUSY, format!("the ops is still registered or in use ({})", describe(st))));
        }
        hs.remove(&(op as usize));
        // The handle's count was the last: this frees the ops.
        drop(ManuallyDrop::into_inner(arc));
        Ok(0)
    })
}

/// `void *ftramp_ops_private(const struct ftrace_ops *ops)`: the
/// `private_data` given to `ftramp_ops_new` (NULL for NULL).  Lock-free,
/// for callbacks.
///
/// # Safety
/// `op` is NULL, a live handle, or the ops a callback received.
#[no_mangle]
pub unsafe extern "C" fn ftramp_ops_private(op: *const Ops) -> *mut c_void {
    // SAFETY: the caller's promise; reading a field cannot panic.
    unsafe { op.as_ref() }.map_or(std::ptr::null_mut(), |o| o.private as *mut c_void)
}

/// `unsigned long ftramp_ops_recursion_misses(const struct ftrace_ops *ops)`
///
/// # Safety
/// As [`ftramp_ops_private`].
#[no_mangle]
pub unsafe extern "C" fn ftramp_ops_recursion_misses(op: *const Ops) -> c_ulong {
    // SAFETY: the caller's promise; an atomic load cannot panic.
    unsafe { op.as_ref() }.map_or(0, |o| o.recursion_misses() as c_ulong)
}

// ---------------------------------------------------------------------------
// The process

/// `int ftramp_refresh(void)`: re-reads the loaded modules (after
/// `dlopen`/`dlclose`) and applies every registered ops to them.
#[no_mangle]
pub extern "C" fn ftramp_refresh() -> c_int {
    ffi("ftramp_refresh", code, || {
        let _hs = handles()?;
        ftrace().refresh().map_err(|e| ops_error(e, &HandleState::default()))?;
        Ok(0)
    })
}

/// `int ftramp_site_dispatch(unsigned long addr)`: what the site at `addr`
/// (a site or its function's address) calls now, `FTRAMP_SITE_*`;
/// `-ENOENT` for an address that is no known site.
#[no_mangle]
pub extern "C" fn ftramp_site_dispatch(addr: c_ulong) -> c_int {
    ffi("ftramp_site_dispatch", code, || {
        let _hs = handles()?;
        let addr = addr as usize;
        let found = ftrace().site_dispatch().into_iter().find(|(s, _)| s.addr == addr || s.addr - s.offset_in_symbol == addr);
        match found {
            None => Err(CError::new(libc::ENOENT, format!("{addr:#x} is no known patch site"))),
            Some((_, d)) => Ok(match d {
                SiteDispatch::Nop => FTRAMP_SITE_NOP,
                SiteDispatch::Direct { tier: Tier::Args } => FTRAMP_SITE_DIRECT_ARGS,
                SiteDispatch::Direct { tier: Tier::Regs } => FTRAMP_SITE_DIRECT_REGS,
                SiteDispatch::List { tier: Tier::Args } => FTRAMP_SITE_LIST_ARGS,
                SiteDispatch::List { tier: Tier::Regs } => FTRAMP_SITE_LIST_REGS,
            }),
        }
    })
}

/// `const char *ftramp_last_error(void)`: the message of this thread's
/// most recent failed call ("" if none); valid until its next failure.
#[no_mangle]
pub extern "C" fn ftramp_last_error() -> *const c_char {
    // The string lives in the thread's slot until the next failure
    // replaces it; during thread teardown, a static empty string.
    LAST_ERROR.try_with(|l| l.borrow().as_ptr()).unwrap_or(c"".as_ptr())
}

/// `const char *ftramp_arch(void)`: the spec name of the host arch.
#[no_mangle]
pub extern "C" fn ftramp_arch() -> *const c_char {
    static ARCH: std::sync::OnceLock<CString> = std::sync::OnceLock::new();
    ARCH.get_or_init(|| CString::new(ftramp_runtime::HOST_ARCH).unwrap_or_default()).as_ptr()
}

/// `unsigned int ftramp_nr_int_args(void)`: integer argument registers in
/// `struct ftrace_regs` (`ftrace_regs_get_argument` reads 0 past them).
#[no_mangle]
pub extern "C" fn ftramp_nr_int_args() -> c_uint {
    ffi("ftramp_nr_int_args", |_| 0, || Ok(ftramp_runtime::host_spec().int_args.len() as c_uint))
}

/// `unsigned int ftramp_nr_fp_args(void)`
#[no_mangle]
pub extern "C" fn ftramp_nr_fp_args() -> c_uint {
    ffi("ftramp_nr_fp_args", |_| 0, || Ok(ftramp_runtime::host_spec().fp_args.len() as c_uint))
}

// ---------------------------------------------------------------------------
// struct ftrace_regs, through the runtime's layout

/// Runs an accessor: NULL `fregs` gives `default`, a panic too.
fn with_regs<R, T>(name: &str, default: T, fregs: Option<R>, f: impl FnOnce(R) -> Result<T, CError>) -> T
where
    T: Copy,
{
    ffi(
        name,
        |_| default,
        || match fregs {
            None => Err(CError::new(libc::EINVAL, "fregs is NULL")),
            Some(r) => f(r),
        },
    )
}

/// `unsigned long ftrace_regs_get_argument(const struct ftrace_regs *fregs, unsigned int n)`
///
/// # Safety
/// `fregs` is NULL or the pointer a callback received, used during it.
#[no_mangle]
pub unsafe extern "C" fn ftrace_regs_get_argument(fregs: *const FtraceRegs, n: c_uint) -> c_ulong {
    // SAFETY: the caller's promise.
    with_regs("ftrace_regs_get_argument", 0, unsafe { fregs.as_ref() }, |r| Ok(r.argument(n as usize).unwrap_or(0) as c_ulong))
}

/// `int ftrace_regs_set_argument(struct ftrace_regs *fregs, unsigned int n, unsigned long v)`
///
/// # Safety
/// As [`ftrace_regs_get_argument`].
#[no_mangle]
pub unsafe extern "C" fn ftrace_regs_set_argument(fregs: *mut FtraceRegs, n: c_uint, v: c_ulong) -> c_int {
    // SAFETY: the caller's promise.
    with_regs("ftrace_regs_set_argument", -libc::EINVAL, unsafe { fregs.as_mut() }, |r| {
        if r.set_argument(n as usize, v) {
            Ok(0)
        } else {
            Err(CError::new(libc::EINVAL, format!("no integer argument register {n}")))
        }
    })
}

/// `double ftrace_regs_get_fp_argument(const struct ftrace_regs *fregs, unsigned int n)`
///
/// # Safety
/// As [`ftrace_regs_get_argument`].
#[no_mangle]
pub unsafe extern "C" fn ftrace_regs_get_fp_argument(fregs: *const FtraceRegs, n: c_uint) -> c_double {
    // SAFETY: the caller's promise.
    with_regs("ftrace_regs_get_fp_argument", 0.0, unsafe { fregs.as_ref() }, |r| Ok(r.fp_argument(n as usize).unwrap_or(0.0)))
}

/// `unsigned long ftrace_regs_get_return_value(const struct ftrace_regs *fregs)`
///
/// # Safety
/// As [`ftrace_regs_get_argument`].
#[no_mangle]
pub unsafe extern "C" fn ftrace_regs_get_return_value(fregs: *const FtraceRegs) -> c_ulong {
    // SAFETY: the caller's promise.
    with_regs("ftrace_regs_get_return_value", 0, unsafe { fregs.as_ref() }, |r| Ok(r.return_value() as c_ulong))
}

/// `void ftrace_regs_set_return_value(struct ftrace_regs *fregs, unsigned long v)`
///
/// # Safety
/// As [`ftrace_regs_get_argument`].
#[no_mangle]
pub unsafe extern "C" fn ftrace_regs_set_return_value(fregs: *mut FtraceRegs, v: c_ulong) {
    // SAFETY: the caller's promise.
    with_regs("ftrace_regs_set_return_value", (), unsafe { fregs.as_mut() }, |r| {
        r.set_return_value(v);
        Ok(())
    })
}

/// `double ftrace_regs_get_fp_return_value(const struct ftrace_regs *fregs)`
///
/// # Safety
/// As [`ftrace_regs_get_argument`].
#[no_mangle]
pub unsafe extern "C" fn ftrace_regs_get_fp_return_value(fregs: *const FtraceRegs) -> c_double {
    // SAFETY: the caller's promise.
    with_regs("ftrace_regs_get_fp_return_value", 0.0, unsafe { fregs.as_ref() }, |r| Ok(r.fp_return_value().unwrap_or(0.0)))
}

/// `int ftrace_regs_set_fp_return_value(struct ftrace_regs *fregs, double v)`
///
/// # Safety
/// As [`ftrace_regs_get_argument`].
#[no_mangle]
pub unsafe extern "C" fn ftrace_regs_set_fp_return_value(fregs: *mut FtraceRegs, v: c_double) -> c_int {
    // SAFETY: the caller's promise.
    with_regs("ftrace_regs_set_fp_return_value", -libc::EINVAL, unsafe { fregs.as_mut() }, |r| {
        if r.set_fp_return_value(v) {
            Ok(0)
        } else {
            Err(CError::new(libc::EINVAL, "this arch has no FP return register"))
        }
    })
}

/// `unsigned long ftrace_regs_get_instruction_pointer(const struct ftrace_regs *fregs)`:
/// where execution resumes after the callback.
///
/// # Safety
/// As [`ftrace_regs_get_argument`].
#[no_mangle]
pub unsafe extern "C" fn ftrace_regs_get_instruction_pointer(fregs: *const FtraceRegs) -> c_ulong {
    // SAFETY: the caller's promise.
    with_regs("ftrace_regs_get_instruction_pointer", 0, unsafe { fregs.as_ref() }, |r| Ok(r.instruction_pointer() as c_ulong))
}

/// `void ftrace_regs_set_instruction_pointer(struct ftrace_regs *fregs, unsigned long ip)`:
/// redirect (IPMODIFY ops only).
///
/// # Safety
/// As [`ftrace_regs_get_argument`].
#[no_mangle]
pub unsafe extern "C" fn ftrace_regs_set_instruction_pointer(fregs: *mut FtraceRegs, ip: c_ulong) {
    // SAFETY: the caller's promise.
    with_regs("ftrace_regs_set_instruction_pointer", (), unsafe { fregs.as_mut() }, |r| {
        r.set_instruction_pointer(ip as usize);
        Ok(())
    })
}

/// `unsigned long ftrace_regs_get_stack_pointer(const struct ftrace_regs *fregs)`
///
/// # Safety
/// As [`ftrace_regs_get_argument`].
#[no_mangle]
pub unsafe extern "C" fn ftrace_regs_get_stack_pointer(fregs: *const FtraceRegs) -> c_ulong {
    // SAFETY: the caller's promise.
    with_regs("ftrace_regs_get_stack_pointer", 0, unsafe { fregs.as_ref() }, |r| Ok(r.stack_pointer() as c_ulong))
}

/// `unsigned long ftrace_regs_get_frame_pointer(const struct ftrace_regs *fregs)`
///
/// # Safety
/// As [`ftrace_regs_get_argument`].
#[no_mangle]
pub unsafe extern "C" fn ftrace_regs_get_frame_pointer(fregs: *const FtraceRegs) -> c_ulong {
    // SAFETY: the caller's promise.
    with_regs("ftrace_regs_get_frame_pointer", 0, unsafe { fregs.as_ref() }, |r| Ok(r.frame_pointer() as c_ulong))
}

/// `unsigned long ftrace_regs_get_return_address(const struct ftrace_regs *fregs)`
///
/// # Safety
/// As [`ftrace_regs_get_argument`].
#[no_mangle]
pub unsafe extern "C" fn ftrace_regs_get_return_address(fregs: *const FtraceRegs) -> c_ulong {
    // SAFETY: the caller's promise.
    with_regs("ftrace_regs_get_return_address", 0, unsafe { fregs.as_ref() }, |r| Ok(r.return_address() as c_ulong))
}

/// `void ftrace_regs_set_return_address(struct ftrace_regs *fregs, unsigned long ra)`
///
/// # Safety
/// As [`ftrace_regs_get_argument`].
#[no_mangle]
pub unsafe extern "C" fn ftrace_regs_set_return_address(fregs: *mut FtraceRegs, ra: c_ulong) {
    // SAFETY: the caller's promise.
    with_regs("ftrace_regs_set_return_address", (), unsafe { fregs.as_mut() }, |r| {
        r.set_return_address(ra as usize);
        Ok(())
    })
}

/// `int ftrace_regs_get_register(const struct ftrace_regs *fregs, const char *name, unsigned long *value)`:
/// any saved register by its spec name (`rbx`, `x19`, …).  Registers
/// outside `struct ftrace_regs` hold meaningful values only in callbacks
/// of `FTRAMP_OPS_FL_SAVE_REGS` ops.
///
/// # Safety
/// As [`ftrace_regs_get_argument`]; `name` is NULL or a NUL-terminated
/// string; `value` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ftrace_regs_get_register(fregs: *const FtraceRegs, name: *const c_char, value: *mut c_ulong) -> c_int {
    // SAFETY: the caller's promise.
    with_regs("ftrace_regs_get_register", -libc::EINVAL, unsafe { fregs.as_ref() }, |r| {
        // SAFETY: the caller's promise.
        let name = unsafe { text(name, "register name") }?;
        let v = r.register(name).ok_or_else(|| CError::new(libc::EINVAL, format!("no saved register `{name}`")))?;
        if value.is_null() {
            return Err(CError::new(libc::EINVAL, "value is NULL"));
        }
        // SAFETY: non-null, and the caller promises it is writable.
        unsafe { value.write(v as c_ulong) };
        Ok(0)
    })
}
