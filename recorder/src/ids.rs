//! Function ids: patch-site address → dense id (the line of the `.sym` file).
//!
//! The tracing path reads an immutable open-addressing table (linear
//! probing, load ≤ 1/2) published behind an atomic pointer; the writer
//! thread builds a new one when modules come and go and frees the old one
//! after a grace period (callbacks run inside dispatch, so a grace period
//! covers every reader).  A site called before its module is in the table
//! (a `dlopen`ed library patched by the engine's watcher before the writer
//! saw it) gets a fresh id from a fixed-size, insert-only concurrent table
//! ([`overflow`]); the writer names it later.

use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicUsize, Ordering::*};

/// No id: the table is full or another thread is inserting the same site.
pub const NO_ID: u32 = u32::MAX;

/// The published table.
pub struct IdTable {
    shift: u32,
    mask: usize,
    /// Key and id side by side: a probe touches one cache line.
    entries: Box<[Entry]>,
}

/// One slot of an [`IdTable`] (key 0: empty).
#[derive(Clone, Copy)]
#[repr(C)]
struct Entry {
    key: usize,
    id: u32,
}

#[inline(always)]
fn hash(addr: usize, shift: u32) -> usize {
    ((addr as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> shift) as usize
}

impl IdTable {
    /// A table of `(site address, id)`; addresses are non-zero and unique.
    pub fn new(entries: &[(usize, u32)]) -> IdTable {
        let size = (entries.len() * 2).next_power_of_two().max(16);
        let shift = 64 - size.trailing_zeros();
        let mut slots = vec![Entry { key: 0, id: NO_ID }; size].into_boxed_slice();
        for &(a, id) in entries {
            let mut i = hash(a, shift);
            while slots[i].key != 0 && slots[i].key != a {
                i = (i + 1) & (size - 1);
            }
            slots[i] = Entry { key: a, id };
        }
        IdTable {
            shift,
            mask: size - 1,
            entries: slots,
        }
    }

    #[inline(always)]
    pub fn get(&self, addr: usize) -> Option<u32> {
        let base = self.entries.as_ptr();
        let mut i = hash(addr, self.shift);
        loop {
            // SAFETY: `shift` makes the hash smaller than the table's size
            // (a power of two, `mask + 1`), and `i` stays masked below it.
            let e = unsafe { &*base.add(i) };
            if e.key == addr {
                return Some(e.id);
            }
            if e.key == 0 {
                return None;
            }
            i = (i + 1) & self.mask;
        }
    }
}

static TABLE: AtomicPtr<IdTable> = AtomicPtr::new(std::ptr::null_mut());
/// The next id to hand out (the writer and [`overflow`] share it).
pub static NEXT_ID: AtomicU32 = AtomicU32::new(0);

/// Publishes `t`; returns the previous table, which readers may still use
/// until a grace period has passed.
pub fn publish(t: IdTable) -> Option<Box<IdTable>> {
    let old = TABLE.swap(Box::into_raw(Box::new(t)), AcqRel);
    // SAFETY: every pointer in TABLE came from Box::into_raw above and the
    // swap hands it back exactly once.
    (!old.is_null()).then(|| unsafe { Box::from_raw(old) })
}

/// The id of the site at `addr`.
#[inline(always)]
pub fn lookup(addr: usize) -> u32 {
    let t = TABLE.load(Acquire);
    if !t.is_null() {
        // SAFETY: tables are freed only after a grace period, and callers
        // are tracer callbacks, inside dispatch.
        if let Some(id) = unsafe { &*t }.get(addr) {
            return id;
        }
    }
    overflow(addr)
}

/// [`lookup`] in the published table only, None when the site is not
/// there (the caller falls back to [`lookup`]): no call, for the tracer's
/// fast paths.
#[inline(always)]
pub fn lookup_published(addr: usize) -> Option<u32> {
    let t = TABLE.load(Acquire);
    if t.is_null() {
        return None;
    }
    // SAFETY: as in `lookup`.
    unsafe { &*t }.get(addr)
}

const OV_SIZE: usize = 4096;
static OV_KEYS: [AtomicUsize; OV_SIZE] = [const { AtomicUsize::new(0) }; OV_SIZE];
static OV_IDS: [AtomicU32; OV_SIZE] = [const { AtomicU32::new(NO_ID) }; OV_SIZE];
/// Sites inserted into the overflow table (the writer polls it).
pub static OV_COUNT: AtomicU32 = AtomicU32::new(0);

/// Finds or inserts `addr` in the overflow table.
#[cold]
#[inline(never)]
fn overflow(addr: usize) -> u32 {
    if addr == 0 {
        return NO_ID;
    }
    let mut i = hash(addr, 64 - OV_SIZE.trailing_zeros());
    for _ in 0..OV_SIZE {
        match OV_KEYS[i].compare_exchange(0, addr, AcqRel, Acquire) {
            Ok(_) => {
                let id = NEXT_ID.fetch_add(1, Relaxed);
                OV_IDS[i].store(id, Release);
                OV_COUNT.fetch_add(1, Release);
                return id;
            }
            Err(k) if k == addr => return OV_IDS[i].load(Acquire),
            Err(_) => i = (i + 1) % OV_SIZE,
        }
    }
    NO_ID
}

/// The overflow entries with an id: `(addr, id)`.
pub fn overflow_entries() -> Vec<(usize, u32)> {
    OV_KEYS
        .iter()
        .zip(OV_IDS.iter())
        .filter_map(|(k, i)| {
            let (k, i) = (k.load(Acquire), i.load(Acquire));
            (k != 0 && i != NO_ID).then_some((k, i))
        })
        .collect()
}

/// The id the overflow table gave `addr`, if any.
pub fn overflow_id(addr: usize) -> Option<u32> {
    let mut i = hash(addr, 64 - OV_SIZE.trailing_zeros());
    for _ in 0..OV_SIZE {
        match OV_KEYS[i].load(Acquire) {
            0 => return None,
            k if k == addr => return Some(OV_IDS[i].load(Acquire)).filter(|&id| id != NO_ID),
            _ => i = (i + 1) % OV_SIZE,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_finds_every_entry_and_nothing_else() {
        let entries: Vec<(usize, u32)> = (0..1000u32)
            .map(|i| (0x40_0000 + 16 * i as usize, i))
            .collect();
        let t = IdTable::new(&entries);
        for &(a, id) in &entries {
            assert_eq!(t.get(a), Some(id));
        }
        assert_eq!(t.get(0x40_0008), None);
        assert_eq!(t.get(1), None);
        let empty = IdTable::new(&[]);
        assert_eq!(empty.get(0x1000), None);
    }

    #[test]
    fn overflow_assigns_one_id_per_site() {
        let a = overflow(0xdead_0000);
        let b = overflow(0xdead_0010);
        assert_ne!(a, b);
        assert_eq!(overflow(0xdead_0000), a);
        assert_eq!(overflow_id(0xdead_0010), Some(b));
        assert!(overflow_entries().contains(&(0xdead_0000, a)));
        assert_eq!(overflow(0), NO_ID);
    }
}
