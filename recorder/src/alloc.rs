//! The recorder's heap: glibc's allocator, called by its own names
//! (`__libc_malloc` and the rest), never through the `malloc` a program
//! may define.
//!
//! # Why
//!
//! A program can export its own `malloc`, `free` and `realloc`; the loader
//! then binds every library's calls of those names to the program's — the
//! preloaded recorder's too.  bash does this (its own allocator, the
//! default build), and it is single-threaded: its allocator takes no lock.
//! The recorder allocated from its writer and module-watcher threads while
//! bash's main thread allocated too — two threads in an allocator made for
//! one, which can corrupt the program's heap.  And with bash built with
//! patch sites, the recorder's own 11 000 `free` calls before `main` and
//! its helper threads' calls were recorded as the program's.
//!
//! glibc exports its allocator under `__libc_*` names, which programs do
//! not define (an allocator that replaces glibc's defines `malloc`), so
//! this heap is glibc's, thread-safe, whatever the program brings.  Memory
//! never crosses between the two: what the recorder allocates it frees,
//! and what libc functions return (`realpath`'s buffer) is freed with
//! `libc::free`, as before.  Alignments above glibc's (16 bytes) are made
//! by hand rather than with `__libc_memalign`, which sanitizer runtimes
//! intercept on some versions (their heap would then meet glibc's free).
//! The CLI links the recorder's library too and so uses this heap: it is
//! glibc's there as well.

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

extern "C" {
    fn __libc_malloc(size: usize) -> *mut c_void;
    fn __libc_calloc(n: usize, size: usize) -> *mut c_void;
    fn __libc_realloc(p: *mut c_void, size: usize) -> *mut c_void;
    fn __libc_free(p: *mut c_void);
}

/// What glibc's `malloc` guarantees (`MALLOC_ALIGNMENT`: 16 on x86_64 and
/// aarch64).
const LIBC_ALIGN: usize = 16;

/// The allocator; see the module docs.
pub struct LibcHeap;

/// Whether glibc's own alignment serves `layout` (as std's `System` decides
/// for `malloc`).
fn plain(layout: &Layout) -> bool {
    layout.align() <= LIBC_ALIGN && layout.align() <= layout.size()
}

/// A block aligned to `layout.align()` (more than glibc gives) inside a
/// larger one from glibc, whose address is kept in the word before it.
///
/// # Safety
/// `layout` has a non-zero size.
unsafe fn alloc_aligned(layout: Layout, zeroed: bool) -> *mut u8 {
    let align = layout.align().max(std::mem::size_of::<usize>());
    let Some(total) = layout.size().checked_add(align) else {
        return std::ptr::null_mut();
    };
    // SAFETY: glibc's allocator, any size.
    let raw = unsafe {
        if zeroed {
            __libc_calloc(1, total)
        } else {
            __libc_malloc(total)
        }
    } as *mut u8;
    if raw.is_null() {
        return raw;
    }
    // At least one word past `raw` (align >= a word, raw is word-aligned),
    // and `layout.size()` bytes from there fit in `total`.
    let offset = align - (raw as usize & (align - 1));
    // SAFETY: `offset <= align`, inside the block; the word before the
    // aligned address is inside it too (offset >= one word) and aligned.
    unsafe {
        let p = raw.add(offset);
        (p as *mut *mut u8).sub(1).write(raw);
        p
    }
}

/// Frees a block of [`alloc_aligned`].
///
/// # Safety
/// `p` came from [`alloc_aligned`].
unsafe fn free_aligned(p: *mut u8) {
    // SAFETY: the word before `p` holds glibc's block, which holds `p`.
    unsafe { __libc_free((p as *mut *mut u8).sub(1).read() as *mut c_void) }
}

// SAFETY: every block comes from glibc's allocator (thread-safe) with at
// least the layout's size and alignment, and goes back to it by the same
// path, chosen by the layout, which `GlobalAlloc` passes back unchanged.
unsafe impl GlobalAlloc for LibcHeap {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if plain(&layout) {
            // SAFETY: glibc's malloc.
            unsafe { __libc_malloc(layout.size()) as *mut u8 }
        } else {
            // SAFETY: GlobalAlloc callers pass non-zero sizes.
            unsafe { alloc_aligned(layout, false) }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if plain(&layout) {
            // SAFETY: glibc's calloc.
            unsafe { __libc_calloc(1, layout.size()) as *mut u8 }
        } else {
            // SAFETY: as in `alloc`.
            unsafe { alloc_aligned(layout, true) }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if plain(&layout) {
            // SAFETY: `ptr` came from `__libc_malloc`/`__libc_calloc`/`__libc_realloc`.
            unsafe { __libc_free(ptr as *mut c_void) }
        } else {
            // SAFETY: `ptr` came from `alloc_aligned` (same layout).
            unsafe { free_aligned(ptr) }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let new = Layout::from_size_align(new_size, layout.align());
        match new {
            Ok(n) if plain(&layout) && plain(&n) => {
                // SAFETY: `ptr` is a glibc block (plain layout).
                unsafe { __libc_realloc(ptr as *mut c_void, new_size) as *mut u8 }
            }
            Ok(n) => {
                // SAFETY: a new block of the new layout, the old contents
                // copied (the smaller size), the old block freed by its path.
                unsafe {
                    let p = self.alloc(n);
                    if !p.is_null() {
                        std::ptr::copy_nonoverlapping(ptr, p, layout.size().min(new_size));
                        self.dealloc(ptr, layout);
                    }
                    p
                }
            }
            Err(_) => std::ptr::null_mut(),
        }
    }
}

#[global_allocator]
static HEAP: LibcHeap = LibcHeap;

#[cfg(test)]
mod tests {
    use super::*;

    /// Blocks of every alignment path hold their size, are aligned, keep
    /// their contents through `realloc` (within and across paths) and come
    /// back zeroed from `alloc_zeroed`.
    #[test]
    fn blocks_are_aligned_sized_and_keep_their_contents() {
        let h = LibcHeap;
        for align in [1usize, 8, 16, 32, 64, 4096] {
            for size in [1usize, 7, 16, 100, 5000] {
                let l = Layout::from_size_align(size, align).unwrap();
                // SAFETY: non-zero sizes; every block written within its
                // size and freed with its layout.
                unsafe {
                    let z = h.alloc_zeroed(l);
                    assert!(!z.is_null() && (z as usize).is_multiple_of(align), "{size}/{align}");
                    assert!((0..size).all(|i| *z.add(i) == 0), "{size}/{align} zeroed");
                    h.dealloc(z, l);
                    let mut p = h.alloc(l);
                    assert!(!p.is_null() && (p as usize).is_multiple_of(align), "{size}/{align}");
                    for i in 0..size {
                        *p.add(i) = i as u8;
                    }
                    for new_size in [size / 2 + 1, size * 3] {
                        let q = h.realloc(p, l, new_size);
                        assert!(!q.is_null() && (q as usize).is_multiple_of(align), "{size}/{align} -> {new_size}");
                        assert!((0..size.min(new_size)).all(|i| *q.add(i) == i as u8), "{size}/{align} -> {new_size}");
                        let back = h.realloc(q, Layout::from_size_align(new_size, align).unwrap(), size);
                        assert!((0..size.min(new_size)).all(|i| *back.add(i) == i as u8));
                        p = back;
                        // (What a shrink dropped, written again.)
                        for i in 0..size {
                            *p.add(i) = i as u8;
                        }
                    }
                    h.dealloc(p, l);
                }
            }
        }
    }
}
