//! The one place that makes modified code visible to instruction fetch.
//!
//! Every write to code (new trampolines, a patched site) ends with
//! [`flush_icache`].  qemu-user executes rewritten code correctly without
//! any of this, so tests under qemu cannot catch a missing flush: review
//! changes here against each architecture manual.
//!
//! * x86_64 / s390x: instruction fetch is coherent with stores; other
//!   threads are serialized by [`sync_cores`].
//! * aarch64: clean the data cache to the point of unification, invalidate
//!   the instruction cache, `dsb ish` + `isb` (ARM ARM B2.4.4) — done by
//!   libgcc's `__clear_cache`.
//! * riscv64: `fence.i` only orders the local hart; the kernel's
//!   `riscv_flush_icache` syscall reaches all harts the process runs on —
//!   libgcc's `__clear_cache` calls it.
//! * ppc64: `dcbst`/`sync`/`icbi`/`isync` per line — libgcc's `__clear_cache`.

#[cfg(not(any(target_arch = "x86_64", target_arch = "s390x")))]
extern "C" {
    /// libgcc / compiler-rt: make `[begin, end)` coherent for instruction fetch.
    fn __clear_cache(begin: *mut libc::c_char, end: *mut libc::c_char);
}

/// Makes `len` bytes of code at `addr` visible to instruction fetch on this
/// core.
pub fn flush_icache(addr: usize, len: usize) {
    #[cfg(not(any(target_arch = "x86_64", target_arch = "s390x")))]
    // SAFETY: `__clear_cache` only performs cache maintenance on the given
    // range; it neither reads nor writes memory contents and is valid for
    // any mapped range, which callers guarantee (they just wrote it).
    unsafe {
        __clear_cache(addr as *mut libc::c_char, (addr + len) as *mut libc::c_char);
    }
    #[cfg(any(target_arch = "x86_64", target_arch = "s390x"))]
    let _ = (addr, len);
}

/// Serializes every core running this process (Linux `membarrier`
/// SYNC_CORE), so threads that may have fetched the old bytes of a patched
/// site refetch them.  Silently a no-op where the kernel (or qemu-user)
/// lacks the command: there, a single-threaded patch is still correct.
pub fn sync_cores() {
    const MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE: libc::c_long = 1 << 5;
    const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE: libc::c_long = 1 << 6;
    static REGISTERED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        // SAFETY: membarrier takes two integer arguments and touches no memory.
        unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE, 0) == 0 }
    });
    if ok {
        // SAFETY: as above.
        unsafe {
            libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE, 0);
        }
    }
}
