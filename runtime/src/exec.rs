//! Executable memory for generated trampolines.
//!
//! A [`JitImage`] maps an [`Image`] as code pages (read+execute) followed by
//! data pages (read+write) holding its data words, placed within branch reach
//! of a given address (a patch site or a module's text) when asked.  The
//! pages are never writable and executable at once: the code is written
//! while the mapping is read+write, then switched to read+execute and flushed
//! before its address is handed out.  Retargeting a trampoline is an atomic
//! store to a data word ([`JitImage::set_word`]).

use crate::{cache, RuntimeError};
use ftramp_codegen::{image::Image, DataWord, Variant};
use std::sync::atomic::{AtomicU64, Ordering};

/// The system page size.
pub fn page_size() -> usize {
    static PAGE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    // SAFETY: sysconf has no memory-safety preconditions.
    *PAGE.get_or_init(|| unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize })
}

fn round_up(n: usize, to: usize) -> usize {
    n.div_ceil(to) * to
}

/// Mapped ranges of this process, from `/proc/self/maps`.
fn mapped_ranges() -> Vec<(usize, usize)> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let mut out: Vec<(usize, usize)> = maps
        .lines()
        .filter_map(|l| {
            let range = l.split_whitespace().next()?;
            let (a, b) = range.split_once('-')?;
            Some((usize::from_str_radix(a, 16).ok()?, usize::from_str_radix(b, 16).ok()?))
        })
        .collect();
    out.sort();
    out
}

/// Reserves `size` bytes (read+write) within `reach` of `near`, or anywhere
/// when `near` is `None`.
fn map_near(near: Option<usize>, size: usize, reach: u64) -> Result<usize, RuntimeError> {
    let prot = libc::PROT_READ | libc::PROT_WRITE;
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
    let Some(near) = near else {
        // SAFETY: a fresh anonymous mapping at an address the kernel picks
        // cannot alias any existing Rust object.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), size, prot, flags, -1, 0) };
        if p == libc::MAP_FAILED {
            return Err(RuntimeError::os("mmap"));
        }
        return Ok(p as usize);
    };
    let page = page_size();
    // Leave room so the whole mapping is within reach of `near`.
    let reach = (reach as usize).saturating_sub(size + page).min(isize::MAX as usize);
    let lo = round_up(near.saturating_sub(reach), page).max(0x10000);
    let hi = near.saturating_add(reach);
    // Candidate starts: just after and just before every mapping, nearest
    // to `near` first.
    let ranges = mapped_ranges();
    let mut candidates: Vec<usize> = Vec::new();
    for (s, e) in &ranges {
        candidates.push(*e);
        if *s >= size {
            candidates.push(s - size);
        }
    }
    candidates.retain(|c| *c >= lo && *c + size <= hi && c % page == 0);
    candidates.sort_by_key(|c| c.abs_diff(near));
    for c in candidates {
        if ranges.iter().any(|(s, e)| c < *e && *s < c + size) {
            continue;
        }
        // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping; it
        // fails instead, so no live object can be clobbered.
        let p = unsafe { libc::mmap(c as *mut libc::c_void, size, prot, flags | libc::MAP_FIXED_NOREPLACE, -1, 0) };
        if p == libc::MAP_FAILED {
            continue;
        }
        if p as usize != c {
            // Old kernels ignore the flag and treat the address as a hint.
            // SAFETY: we own the mapping we just got.
            unsafe { libc::munmap(p, size) };
            continue;
        }
        return Ok(c);
    }
    Err(RuntimeError::NoMemoryInReach { near, size, reach: reach as u64 })
}

/// Generated trampolines in executable memory.
pub struct JitImage {
    base: usize,
    code_len: usize,
    total: usize,
    image: Image,
}

// SAFETY: the mapping is owned by the JitImage; code pages are immutable
// after `install`, and data words are only accessed through atomics.
unsafe impl Send for JitImage {}
// SAFETY: as above — shared access only reads code addresses or uses atomic
// data-word operations.
unsafe impl Sync for JitImage {}

impl JitImage {
    /// Maps `image`, within `reach` bytes of `near` when given.
    pub fn install(image: Image, near: Option<usize>, reach: u64) -> Result<JitImage, RuntimeError> {
        let page = page_size();
        let code_len = round_up(image.code.len().max(1), page);
        let data_len = round_up(image.data_size().max(8), page);
        let total = code_len + data_len;
        let base = map_near(near, total, reach)?;
        let code = match image.link(base as u64, (base + code_len) as u64) {
            Ok(c) => c,
            Err(e) => {
                // SAFETY: unmapping the region we just mapped and nobody uses.
                unsafe { libc::munmap(base as *mut libc::c_void, total) };
                return Err(e.into());
            }
        };
        // SAFETY: [base, base+total) is our fresh read+write mapping and
        // `code.len() <= code_len`; nothing else references it yet.
        unsafe {
            std::ptr::copy_nonoverlapping(code.as_ptr(), base as *mut u8, code.len());
            if libc::mprotect(base as *mut libc::c_void, code_len, libc::PROT_READ | libc::PROT_EXEC) != 0 {
                let err = RuntimeError::os("mprotect");
                libc::munmap(base as *mut libc::c_void, total);
                return Err(err);
            }
        }
        cache::flush_icache(base, code.len());
        Ok(JitImage { base, code_len, total, image })
    }

    /// Address of a trampoline.
    pub fn entry(&self, v: Variant) -> Option<usize> {
        self.image.trampoline(v).map(|t| self.base + t.entry)
    }

    /// The code pages.
    pub fn code_range(&self) -> std::ops::Range<usize> {
        self.base..self.base + self.code_len
    }

    /// Start of the code.
    pub fn code_addr(&self) -> usize {
        self.base
    }

    fn word_ref(&self, w: DataWord) -> Option<&AtomicU64> {
        let off = self.image.word_offset(w)?;
        // SAFETY: the word lies inside our read+write data pages, is 8-byte
        // aligned (page start + multiple of 8) and lives as long as `self`.
        Some(unsafe { &*((self.base + self.code_len + off) as *const AtomicU64) })
    }

    /// Sets a data word (one atomic store: trampolines read it with a
    /// single load).  Returns false if the image has no such word.
    pub fn set_word(&self, w: DataWord, value: usize) -> bool {
        match self.word_ref(w) {
            Some(a) => {
                a.store(value as u64, Ordering::Release);
                true
            }
            None => false,
        }
    }

    /// Reads a data word.
    pub fn word(&self, w: DataWord) -> Option<usize> {
        self.word_ref(w).map(|a| a.load(Ordering::Acquire) as usize)
    }

    /// The generated image.
    pub fn image(&self) -> &Image {
        &self.image
    }
}

impl Drop for JitImage {
    fn drop(&mut self) {
        // SAFETY: we own the mapping.  Callers must have unpatched every
        // site that calls into it (the runtime's patcher guarantees this).
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.total) };
    }
}

/// A block of small generated code pieces (the per-site stubs of stub
/// entry), mapped like a [`JitImage`]'s code: written while read+write,
/// then read+execute and flushed before anything jumps to it.  Immutable
/// afterwards; unmapped when dropped (after a grace period, by the engine).
pub struct CodeBlock {
    base: usize,
    len: usize,
}

impl CodeBlock {
    /// Maps `len` bytes within `reach` of `near` and fills them with
    /// `fill(base)`, the code for that address (at most `len` bytes).
    pub fn install(near: usize, reach: u64, len: usize, fill: impl FnOnce(usize) -> Result<Vec<u8>, RuntimeError>) -> Result<CodeBlock, RuntimeError> {
        let len = round_up(len.max(1), page_size());
        let base = map_near(Some(near), len, reach)?;
        let block = CodeBlock { base, len };
        let code = fill(base)?;
        if code.len() > len {
            return Err(RuntimeError::BadPatch { addr: base, why: format!("{} bytes of code for a {len}-byte block", code.len()) });
        }
        // SAFETY: [base, base+len) is our fresh read+write mapping (owned by
        // `block`, unmapped by its Drop on every error path below) and
        // `code.len() <= len`; nothing references it yet.
        unsafe {
            std::ptr::copy_nonoverlapping(code.as_ptr(), base as *mut u8, code.len());
            if libc::mprotect(base as *mut libc::c_void, len, libc::PROT_READ | libc::PROT_EXEC) != 0 {
                return Err(RuntimeError::os("mprotect"));
            }
        }
        cache::flush_icache(base, code.len());
        Ok(block)
    }

    /// The mapped range.
    pub fn range(&self) -> std::ops::Range<usize> {
        self.base..self.base + self.len
    }
}

impl Drop for CodeBlock {
    fn drop(&mut self) {
        // SAFETY: we own the mapping; the engine drops a block only after
        // a grace period shows no thread runs in it and no site jumps to it.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}
