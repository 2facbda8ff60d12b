//! Page protection around a batch of code writes.
//!
//! [`Maps`] reads `/proc/self/maps` once per batch: every range to be
//! written must lie in private (copy-on-write) mappings — writing a shared
//! file mapping would change the file — and, for sites, executable ones.
//! [`Writable`] then adds `PROT_WRITE` to the pages of every range, one
//! `mprotect` per run of adjacent pages with the same protection, keeping
//! `PROT_READ`/`PROT_EXEC` as they were: a thread running other code on
//! those pages never faults.  It restores each run's original protection
//! when closed or dropped (also on an early error return), so no page is
//! left writable.  Pages that were already writable are not touched.
//!
//! W^X caveat: between [`Writable::open`] and the restore the pages are
//! writable *and* executable — for the whole batch, not per site.

use crate::{exec::page_size, RuntimeError};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// `mprotect` calls made by patching since start-up.
pub(crate) static MPROTECT_CALLS: AtomicUsize = AtomicUsize::new(0);

#[derive(Debug, Clone, Copy)]
struct Mapping {
    start: usize,
    end: usize,
    prot: i32,
    private: bool,
}

/// The process's mappings.
pub(crate) struct Maps(Vec<Mapping>);

impl Maps {
    pub(crate) fn read() -> Result<Maps, RuntimeError> {
        let text = crate::read_proc("/proc/self/maps").map_err(|err| RuntimeError::Os { call: "read /proc/self/maps", err })?;
        let mut maps: Vec<Mapping> = text.lines().filter_map(parse_line).collect();
        maps.sort_by_key(|m| m.start);
        Ok(Maps(maps))
    }

    /// The mappings covering `[addr, addr+len)`, or None if part of it is
    /// unmapped.
    fn covering(&self, addr: usize, len: usize) -> Option<Vec<Mapping>> {
        let end = addr.checked_add(len.max(1))?;
        let mut out = Vec::new();
        let mut at = addr;
        let i = self.0.partition_point(|m| m.end <= addr);
        for m in &self.0[i..] {
            if at >= end {
                break;
            }
            if m.start > at {
                return None;
            }
            out.push(*m);
            at = m.end;
        }
        (at >= end).then_some(out)
    }

    /// Checks that `[addr, addr+len)` may be patched: mapped, readable,
    /// private, and executable when `code`.
    pub(crate) fn check(&self, addr: usize, len: usize, code: bool) -> Result<(), RuntimeError> {
        let bad = |why: &str| RuntimeError::BadPatch { addr, why: why.to_string() };
        let maps = self.covering(addr, len).ok_or_else(|| bad("not mapped"))?;
        if maps.iter().any(|m| m.prot & libc::PROT_READ == 0) {
            return Err(bad("not readable"));
        }
        if maps.iter().any(|m| !m.private) {
            return Err(bad("in a shared mapping (writing it would change the file)"));
        }
        if code && maps.iter().any(|m| m.prot & libc::PROT_EXEC == 0) {
            return Err(bad("not in executable memory"));
        }
        Ok(())
    }
}

impl Maps {
    /// The initial thread's stack `[lo, hi)` as glibc's `pthread_getattr_np`
    /// computes it: from the page above `stack_end` (`__libc_stack_end`)
    /// down by what `RLIMIT_STACK`'s soft limit leaves of the stack's
    /// mapping above that page (in whole pages), but not below the end of
    /// the mapping under the stack's.  None if no mapping holds `stack_end`.
    pub(crate) fn initial_thread_stack(&self, stack_end: usize, rlimit: usize) -> Option<(usize, usize)> {
        let i = self.0.iter().position(|m| m.start <= stack_end && stack_end < m.end)?;
        let last_to = if i == 0 { 0 } else { self.0[i - 1].end };
        let page = page_size();
        let hi = (stack_end & !(page - 1)) + page;
        let size = (rlimit.wrapping_sub(self.0[i].end - hi) & !(page - 1)).min(hi - last_to);
        Some((hi - size, hi))
    }
}

fn parse_line(line: &str) -> Option<Mapping> {
    let mut it = line.split_whitespace();
    let (a, b) = it.next()?.split_once('-')?;
    let perms = it.next()?.as_bytes();
    if perms.len() < 4 {
        return None;
    }
    let mut prot = 0;
    if perms[0] == b'r' {
        prot |= libc::PROT_READ;
    }
    if perms[1] == b'w' {
        prot |= libc::PROT_WRITE;
    }
    if perms[2] == b'x' {
        prot |= libc::PROT_EXEC;
    }
    Some(Mapping { start: usize::from_str_radix(a, 16).ok()?, end: usize::from_str_radix(b, 16).ok()?, prot, private: perms[3] == b'p' })
}

/// Pages made writable for a batch; restores their protection on
/// [`close`](Writable::close) or drop.
pub(crate) struct Writable {
    /// `(start, len, original protection)` of each run we changed.
    runs: Vec<(usize, usize, i32)>,
    calls: usize,
}

impl Writable {
    /// Makes the pages of `ranges` (`(addr, len)`, each already
    /// [`Maps::check`]ed) writable, keeping read and execute.
    pub(crate) fn open(maps: &Maps, ranges: impl IntoIterator<Item = (usize, usize)>) -> Result<Writable, RuntimeError> {
        let page = page_size();
        // Page-aligned runs covering the ranges, merged when they overlap
        // or touch.
        let mut pages: Vec<(usize, usize)> = ranges.into_iter().map(|(a, l)| (a & !(page - 1), (a + l.max(1)).div_ceil(page) * page)).collect();
        pages.sort();
        let mut merged: Vec<(usize, usize)> = Vec::new();
        for (s, e) in pages {
            match merged.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => merged.push((s, e)),
            }
        }
        // Split each run where the original protection changes; skip
        // pieces that are already writable; re-join equal neighbours.
        let mut runs: Vec<(usize, usize, i32)> = Vec::new();
        for (s, e) in merged {
            let covering = maps.covering(s, e - s).ok_or(RuntimeError::BadPatch { addr: s, why: "page not mapped".into() })?;
            for m in covering {
                let (ps, pe) = (m.start.max(s), m.end.min(e));
                if m.prot & libc::PROT_WRITE != 0 || ps >= pe {
                    continue;
                }
                match runs.last_mut() {
                    Some(last) if last.0 + last.1 == ps && last.2 == m.prot => last.1 += pe - ps,
                    _ => runs.push((ps, pe - ps, m.prot)),
                }
            }
        }
        let mut w = Writable { runs: Vec::new(), calls: 0 };
        for (start, len, prot) in runs {
            w.calls += 1;
            MPROTECT_CALLS.fetch_add(1, Relaxed);
            // SAFETY: [start, start+len) lies in private mappings of this
            // process (checked against /proc/self/maps); adding PROT_WRITE
            // and keeping the other bits changes no memory and removes no
            // permission a running thread relies on.
            if unsafe { libc::mprotect(start as *mut libc::c_void, len, prot | libc::PROT_WRITE) } != 0 {
                return Err(RuntimeError::os("mprotect(+write)")); // `w` restores the runs done so far
            }
            w.runs.push((start, len, prot));
        }
        Ok(w)
    }

    fn restore(&mut self) -> Result<(), RuntimeError> {
        let mut result = Ok(());
        for (start, len, prot) in self.runs.drain(..) {
            self.calls += 1;
            MPROTECT_CALLS.fetch_add(1, Relaxed);
            // SAFETY: restores the original protection of a run this guard
            // made writable; execute permission was never removed.
            if unsafe { libc::mprotect(start as *mut libc::c_void, len, prot) } != 0 && result.is_ok() {
                result = Err(RuntimeError::os("mprotect(-write)"));
            }
        }
        result
    }

    /// Restores the original protections; returns the total number of
    /// `mprotect` calls of the batch.
    pub(crate) fn close(mut self) -> Result<usize, RuntimeError> {
        self.restore()?;
        Ok(self.calls)
    }
}

impl Drop for Writable {
    fn drop(&mut self) {
        let _ = self.restore();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_maps_lines() {
        let m = parse_line("55d0c0a00000-55d0c0a21000 r-xp 00002000 fd:01 123 /bin/x").unwrap();
        assert_eq!((m.start, m.end, m.prot, m.private), (0x55d0c0a00000, 0x55d0c0a21000, libc::PROT_READ | libc::PROT_EXEC, true));
        let m = parse_line("7f0000000000-7f0000001000 rw-s 00000000 00:05 9 /dev/zero").unwrap();
        assert_eq!((m.prot, m.private), (libc::PROT_READ | libc::PROT_WRITE, false));
    }

    #[test]
    fn covering_needs_every_byte_mapped() {
        let maps = Maps(vec![
            Mapping { start: 0x1000, end: 0x3000, prot: 5, private: true },
            Mapping { start: 0x3000, end: 0x4000, prot: 5, private: true },
            Mapping { start: 0x5000, end: 0x6000, prot: 5, private: true },
        ]);
        assert_eq!(maps.covering(0x2ffc, 8).unwrap().len(), 2);
        assert!(maps.covering(0x3ffc, 8).is_none());
        assert!(maps.covering(0x800, 8).is_none());
        assert_eq!(maps.covering(0x5000, 0x1000).unwrap().len(), 1);
    }
}
