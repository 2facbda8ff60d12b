//! The process's environment, read and changed through libc's own
//! `environ`, `setenv` and `unsetenv` rather than through whatever the
//! program calls `getenv` and `setenv`.
//!
//! A program may define these functions itself, and the loader then binds
//! every library's calls of them to the program's: bash does, and its
//! `getenv` answers from its shell variables, its `setenv` binds one (and
//! before `main`, creates its variable tables for it).  `std::env` calls
//! `getenv` and `setenv` by name, so the tracer ran the program's code:
//! its calls were recorded as the program's (or, made between the flush
//! before an exec and that exec's failure, counted as events lost after
//! the process's final flush), and what they answered was not the
//! environment.  These read the `environ` array libc's `getenv` reads,
//! and change it with libc's own functions.

use std::ffi::{CStr, OsStr, OsString};
use std::os::raw::c_char;
use std::os::unix::ffi::OsStrExt;

extern "C" {
    /// The process's environment (libc's, or the program's copy of it).
    static environ: *const *const c_char;
}

/// The value of `name` in the process's environment, as libc's `getenv`
/// finds it.
pub fn var_os(name: &str) -> Option<OsString> {
    if name.is_empty() || name.contains('=') {
        return None;
    }
    let key = name.as_bytes();
    // SAFETY: `environ` is null or a NULL-terminated array of
    // NUL-terminated strings, which is what libc's `getenv` reads too.
    unsafe {
        let mut p = environ;
        if p.is_null() {
            return None;
        }
        while !(*p).is_null() {
            let s = CStr::from_ptr(*p).to_bytes();
            if s.len() > key.len() && s.starts_with(key) && s[key.len()] == b'=' {
                return Some(OsStr::from_bytes(&s[key.len() + 1..]).to_os_string());
            }
            p = p.add(1);
        }
    }
    None
}

/// [`var_os`] as UTF-8 (`None` when not set or not UTF-8).
pub fn var(name: &str) -> Option<String> {
    var_os(name)?.into_string().ok()
}

/// libc's own `name` (the next definition after this object's: the
/// program's executable comes first in the lookup order, libc after the
/// preloaded recorder), or null.
fn libc_fn(name: &CStr) -> *mut libc::c_void {
    // SAFETY: dlsym with a NUL-terminated name.
    unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) }
}

/// Sets `name` to `value` with libc's `setenv`.  Not thread-safe (as
/// `setenv` is not): for the start-up, before the program's threads.
pub fn set_var(name: &str, value: &OsStr) {
    let (Ok(k), Ok(v)) = (std::ffi::CString::new(name), std::ffi::CString::new(value.as_bytes())) else { return };
    let f = libc_fn(c"setenv");
    if f.is_null() {
        return;
    }
    // SAFETY: libc's setenv(const char *, const char *, int).
    unsafe {
        let f: unsafe extern "C" fn(*const c_char, *const c_char, libc::c_int) -> libc::c_int = std::mem::transmute(f);
        f(k.as_ptr(), v.as_ptr(), 1);
    }
}

/// Removes `name` with libc's `unsetenv` (see [`set_var`]).
pub fn remove_var(name: &str) {
    let Ok(k) = std::ffi::CString::new(name) else { return };
    let f = libc_fn(c"unsetenv");
    if f.is_null() {
        return;
    }
    // SAFETY: libc's unsetenv(const char *).
    unsafe {
        let f: unsafe extern "C" fn(*const c_char) -> libc::c_int = std::mem::transmute(f);
        f(k.as_ptr());
    }
}
