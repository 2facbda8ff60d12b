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
    let maps = crate::read_proc("/proc/self/maps").unwrap_or_default();
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
            // SAFETY: we own the mapping we just got.  (Old kernels ignore
            // the flag and treat the address as a hint.)
            unsafe { libc::munmap(p, size) };
            continue;
        }
        return Ok(c);
    }
    Err(RuntimeError::NoMemoryInReach { near, size, reach: reach as u64 })
}

/// An anonymous mapping of ours, made read+write by [`map_near`] and
/// unmapped when dropped.
struct Mapping {
    base: usize,
    len: usize,
}

impl Mapping {
    fn near(near: Option<usize>, len: usize, reach: u64) -> Result<Mapping, RuntimeError> {
        Ok(Mapping { base: map_near(near, len, reach)?, len })
    }

    /// Copies `code` to the start of the still read+write mapping, then
    /// makes its first `code_len` bytes (whole pages, `code.len() <=
    /// code_len <= len`) read+execute and flushes them.  Once, before any
    /// address inside is handed out.
    fn seal_code(&self, code_len: usize, code: &[u8]) -> Result<(), RuntimeError> {
        assert!(code.len() <= code_len && code_len <= self.len);
        // SAFETY: [base, base+len) is our fresh read+write mapping, nothing
        // else references it yet, and `code` fits (asserted above).
        unsafe {
            std::ptr::copy_nonoverlapping(code.as_ptr(), self.base as *mut u8, code.len());
            if libc::mprotect(self.base as *mut libc::c_void, code_len, libc::PROT_READ | libc::PROT_EXEC) != 0 {
                return Err(RuntimeError::os("mprotect"));
            }
        }
        cache::flush_icache(self.base, code.len());
        Ok(())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: we own the mapping.  Its owners drop it only once nothing
        // can run or read it: the runtime's patcher unpatches every site
        // that reaches it and waits for a grace period first.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}

/// Generated trampolines in executable memory.
pub struct JitImage {
    map: Mapping,
    code_len: usize,
    image: Image,
}


impl JitImage {
    /// Maps `image`, within `reach` bytes of `near` when given.
    pub fn install(image: Image, near: Option<usize>, reach: u64) -> Result<JitImage, RuntimeError> {
        let page = page_size();
        let code_len = round_up(image.code.len().max(1), page);
        let data_len = round_up(image.data_size().max(8), page);
        let map = Mapping::near(near, code_len + data_len, reach)?;
        let base = map.base;
        let code = image.link(base as u64, (base + code_len) as u64)?;
        map.seal_code(code_len, &code)?;
        Ok(JitImage { map, code_len, image })
    }

    /// Address of a trampoline.
    pub fn entry(&self, v: Variant) -> Option<usize> {
        self.image.trampoline(v).map(|t| self.map.base + t.entry)
    }

    /// The code pages.
    pub fn code_range(&self) -> std::ops::Range<usize> {
        self.map.base..self.map.base + self.code_len
    }

    /// Start of the code.
    pub fn code_addr(&self) -> usize {
        self.map.base
    }

    fn word_ref(&self, w: DataWord) -> Option<&AtomicU64> {
        let off = self.image.word_offset(w)?;
        // SAFETY: the word lies inside our read+write data pages, is 8-byte
        // aligned (page start + multiple of 8) and lives as long as `self`.
        Some(unsafe { &*((self.map.base + self.code_len + off) as *const AtomicU64) })
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


/// A block of small generated code pieces (the per-site stubs of stub
/// entry), mapped like a [`JitImage`]'s code: written while read+write,
/// then read+execute and flushed before anything jumps to it.  Immutable
/// afterwards; unmapped when dropped (after a grace period, by the engine).
pub struct CodeBlock {
    map: Mapping,
}

impl CodeBlock {
    /// Maps `len` bytes within `reach` of `near` and fills them with
    /// `fill(base)`, the code for that address (at most `len` bytes).
    pub fn install(near: usize, reach: u64, len: usize, fill: impl FnOnce(usize) -> Result<Vec<u8>, RuntimeError>) -> Result<CodeBlock, RuntimeError> {
        let map = Mapping::near(Some(near), round_up(len.max(1), page_size()), reach)?;
        let code = fill(map.base)?;
        if code.len() > map.len {
            return Err(RuntimeError::BadPatch { addr: map.base, why: format!("{} bytes of code for a {}-byte block", code.len(), map.len) });
        }
        map.seal_code(map.len, &code)?;
        Ok(CodeBlock { map })
    }

    /// The mapped range.
    pub fn range(&self) -> std::ops::Range<usize> {
        self.map.base..self.map.base + self.map.len
    }
}
