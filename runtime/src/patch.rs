//! Writing code: patch sites and the ops word beside them.
//!
//! One patch step: check the bytes are what we expect, make the page(s)
//! writable *while keeping them executable* (other threads may be running
//! other code on the same page), store the new bytes, restore read+execute
//! and make the change visible ([`crate::cache`]).  The page is writable and
//! executable only for the duration of that step.
//!
//! This is the single-writer primitive; the ordering that keeps a
//! concurrently executing site from seeing a torn instruction (x86's
//! breakpoint step, aligned atomic stores) is built on it by the patcher.

use crate::{cache, exec::page_size, RuntimeError};

/// Replaces `expect` by `new` at `addr` (same length).  Fails without
/// writing if the bytes there are not `expect`.
pub fn replace_text(addr: usize, expect: &[u8], new: &[u8]) -> Result<(), RuntimeError> {
    assert_eq!(expect.len(), new.len(), "replace_text: lengths differ");
    // SAFETY: callers pass the address of code in a mapped, readable text
    // segment (a discovered site or a trampoline we generated).
    let found = unsafe { std::slice::from_raw_parts(addr as *const u8, expect.len()) }.to_vec();
    if found != expect {
        return Err(RuntimeError::UnexpectedSiteBytes { addr, found });
    }
    write_text(addr, new)
}

/// Stores `new` at `addr` in a code page.
pub fn write_text(addr: usize, new: &[u8]) -> Result<(), RuntimeError> {
    let page = page_size();
    let start = addr & !(page - 1);
    let end = (addr + new.len()).div_ceil(page) * page;
    let len = end - start;
    // SAFETY: [start, end) covers mapped code pages (see `replace_text`);
    // mprotect keeps PROT_EXEC so threads executing there do not fault, and
    // the copy writes only the `new.len()` bytes at `addr`.
    unsafe {
        if libc::mprotect(start as *mut libc::c_void, len, libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC) != 0 {
            return Err(RuntimeError::os("mprotect(+w)"));
        }
        std::ptr::copy_nonoverlapping(new.as_ptr(), addr as *mut u8, new.len());
        if libc::mprotect(start as *mut libc::c_void, len, libc::PROT_READ | libc::PROT_EXEC) != 0 {
            return Err(RuntimeError::os("mprotect(-w)"));
        }
    }
    cache::flush_icache(addr, new.len());
    cache::sync_cores();
    Ok(())
}

/// Reads `len` bytes of code at `addr`.
pub fn read_text(addr: usize, len: usize) -> Vec<u8> {
    // SAFETY: as in `replace_text`: `addr` is readable code.
    unsafe { std::slice::from_raw_parts(addr as *const u8, len) }.to_vec()
}
