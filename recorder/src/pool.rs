//! Per-thread event buffers from one preallocated pool, and the hot path
//! that appends an event to the calling thread's buffer.
//!
//! ```text
//!  pool (one mmap, NORESERVE): N buffers of `stride` bytes
//!  ┌────────────────┬─────────────────────────────┐
//!  │ chunk header   │ payload: u64 events ...     │  × N
//!  │ (32 bytes)     │ (stride - 32 bytes)         │
//!  └────────────────┴─────────────────────────────┘
//!  state[i]: FREE → OWNED (a thread writes it) → FULL(ticket) → FREE (written)
//! ```
//!
//! A thread owns one buffer at a time and appends to it with plain stores
//! (its [`Slot`]'s write pointer is published with a release store, so a crash
//! flush on another thread sees only complete events).  When it is full
//! the thread writes the chunk header in front of the payload, marks the
//! buffer FULL with a ticket (handoff order) and takes a FREE one; the
//! writer thread writes FULL buffers in ticket order with one `write(2)`
//! each and frees them.  No locks, no syscalls, no allocation on the
//! tracing path.  No FREE buffer: the event is counted as lost, and the
//! count goes into the header of the thread's next chunk.
//!
//! Whoever writes chunks to the `.dat` file holds [`IoLock`]: the writer
//! thread per chunk, the exit/exec/crash flush for the whole flush, so
//! chunks of one thread reach the file in `seq` order.

use crate::tracefile::TraceFile;
use ftramp_trace::format::{ChunkHeader, Event, CHUNK_HEADER_SIZE, LEAF_MAX};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering, Ordering::*};

/// Threads recorded at once (a thread's slot is reused after it exits).
pub const MAX_THREADS: usize = 4096;
const NO_BUF: u32 = u32::MAX;

const FREE: u64 = 0;
const OWNED: u64 = 1;
const FULL: u64 = 2;

/// Slot claim word (`Slot::busy`).
const IDLE: u32 = 0;
const IN_SLOW_PATH: u32 = 1;
const CLOSED: u32 = 2;

/// The buffers.
pub struct Pool {
    base: *mut u8,
    stride: usize,
    n: usize,
    states: Box<[AtomicU64]>,
}

// SAFETY: the raw pointer is to a process-lifetime mapping; who may touch
// which buffer is decided by the atomic `states`.
unsafe impl Sync for Pool {}
// SAFETY: as above.
unsafe impl Send for Pool {}

static POOL: AtomicPtr<Pool> = AtomicPtr::new(std::ptr::null_mut());
static TICKET: AtomicU64 = AtomicU64::new(1);
/// Set by the final flush: no buffer is handed out any more.
static STOPPED: AtomicBool = AtomicBool::new(false);
/// Events lost outside any slot (no slot free, or a thread already torn down).
static LOST_UNSLOTTED: AtomicU64 = AtomicU64::new(0);
/// Events of threads still running after the final flush (the process is
/// ending): not written, and not for want of buffers, so counted apart.
static LOST_AFTER_FLUSH: AtomicU64 = AtomicU64::new(0);
/// Events of calls a thread made after its exit hooks released its slot
/// (the C library's own thread cleanup): no slot can be had any more.
static LOST_AT_THREAD_EXIT: AtomicU64 = AtomicU64::new(0);

impl Pool {
    /// Maps `n` buffers of `size` bytes (header included) and publishes the pool.
    pub fn install(size: usize, n: usize) -> Result<&'static Pool, String> {
        let stride = size.max(CHUNK_HEADER_SIZE + 64) & !7;
        let len = stride.checked_mul(n).ok_or("buffer pool too large")?;
        // SAFETY: a fresh private anonymous mapping aliases nothing; pages
        // are touched (and become resident) only when a buffer is used.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(format!(
                "cannot map {n} buffers of {size} bytes: {}",
                std::io::Error::last_os_error()
            ));
        }
        let pool = Box::leak(Box::new(Pool {
            base: p as *mut u8,
            stride,
            n,
            states: (0..n).map(|_| AtomicU64::new(FREE)).collect(),
        }));
        POOL.store(pool, Release);
        // A thread's slot is released at its exit by the runtime's exit
        // key, which allocates nothing when a thread's first event comes
        // from a signal handler that interrupted malloc.
        ftramp_runtime::thread::prepare();
        if !ftramp_runtime::thread::on_exit(release_slot_at_exit) {
            return Err("the runtime's thread-exit hooks are all taken".into());
        }
        Ok(pool)
    }

    pub fn get() -> Option<&'static Pool> {
        let p = POOL.load(Acquire);
        // SAFETY: set once from a leaked Box, never freed.
        (!p.is_null()).then(|| unsafe { &*p })
    }

    fn buf(&self, i: usize) -> *mut u8 {
        debug_assert!(i < self.n);
        // SAFETY: `i < n`, inside the mapping.
        unsafe { self.base.add(i * self.stride) }
    }

    /// The first `len` bytes of buffer `i` (`len <= stride`).
    fn bytes(&self, i: usize, len: usize) -> &[u8] {
        // SAFETY: inside buffer i of the mapping, which lives for the
        // process; the caller owns the buffer (FULL and being written, or
        // claimed by a flush), so nobody writes these bytes meanwhile.
        unsafe { std::slice::from_raw_parts(self.buf(i), len.min(self.stride)) }
    }

    fn payload_words(&self) -> u32 {
        ((self.stride - CHUNK_HEADER_SIZE) / 8) as u32
    }

    /// Takes the FREE buffer with the lowest index: the pool is mapped
    /// lazily, so reusing low buffers keeps the memory touched (resident)
    /// as small as the threads and the writer's lag need.
    fn acquire(&self) -> Option<usize> {
        (0..self.n).find(|&i| {
            self.states[i].load(Relaxed) == FREE
                && self.states[i]
                    .compare_exchange(FREE, OWNED, Acquire, Relaxed)
                    .is_ok()
        })
    }

    /// The oldest FULL buffer (smallest ticket).
    fn oldest_full(&self) -> Option<usize> {
        let mut best: Option<(u64, usize)> = None;
        for (i, s) in self.states.iter().enumerate() {
            let v = s.load(Acquire);
            if v & 3 == FULL && best.is_none_or(|(t, _)| v >> 2 < t) {
                best = Some((v >> 2, i));
            }
        }
        best.map(|(_, i)| i)
    }

    /// Whether a FULL buffer of thread `tid` waits to be written.  (Under
    /// the [`IoLock`], as [`Pool::write_one`]: only its holder frees a FULL
    /// buffer, so the header read stays the sealed one.)
    fn has_full_of(&self, tid: u32) -> bool {
        self.states.iter().enumerate().any(|(i, s)| {
            s.load(Acquire) & 3 == FULL
                && self.bytes(i, CHUNK_HEADER_SIZE).try_into().is_ok_and(|h| ChunkHeader::decode(h).is_ok_and(|h| h.tid == tid))
        })
    }

    /// Writes the queued tombstones of threads whose other chunks are
    /// written: after them in the file, as the reader expects a thread's
    /// last chunk (it takes a seq 0 after a LAST for a new thread of a
    /// reused tid).
    fn write_tombstones(&self, out: &TraceFile) {
        for t in TOMBS.iter().filter(|t| t.state.load(Acquire) == 2) {
            let tid = t.tid.load(Relaxed);
            if self.has_full_of(tid) {
                continue;
            }
            let h = empty_chunk(ftramp_trace::format::FLAG_LAST, tid, t.seq.load(Relaxed), t.lost.load(Relaxed), t.time.load(Relaxed));
            out.write_chunk(&h);
            t.state.store(0, Release);
        }
    }

    /// Writes the oldest FULL buffer to `out` and frees it; false when
    /// none is FULL.  The caller holds the [`IoLock`].
    pub fn write_one(&self, out: &TraceFile) -> bool {
        self.write_tombstones(out);
        let Some(i) = self.oldest_full() else {
            return false;
        };
        let len = CHUNK_HEADER_SIZE + chunk_len(self.buf(i));
        out.write_chunk(self.bytes(i, len));
        self.states[i].store(FREE, Release);
        true
    }

    /// Frees every buffer and empties every slot except `keep` (a fork child:
    /// the parent's unwritten events are the parent's).
    pub fn reset_after_fork(&self, keep: Option<&Slot>, now: u64) {
        let keep_ptr: *const Slot = keep.map_or(std::ptr::null(), |s| s as *const Slot);
        for s in self.states.iter() {
            s.store(FREE, Relaxed);
        }
        for slot in SLOTS.iter() {
            if std::ptr::eq(slot, keep_ptr) {
                continue;
            }
            slot.busy.store(IDLE, Relaxed);
            slot.in_use.store(0, Relaxed);
            slot.clear();
        }
        STOPPED.store(false, Relaxed);
        // The parent's losses are the parent's (its threads' slots are
        // cleared above; those of its exited threads are here).
        LOST_UNSLOTTED.store(0, Relaxed);
        RETIRED_LOST.store(0, Relaxed);
        LOST_AFTER_FLUSH.store(0, Relaxed);
        LOST_AT_THREAD_EXIT.store(0, Relaxed);
        for t in TOMBS.iter() {
            t.state.store(0, Relaxed);
        }
        if let Some(slot) = keep {
            let b = slot.buf.load(Relaxed);
            slot.clear();
            slot.busy.store(IDLE, Relaxed);
            slot.tid.store(gettid(), Relaxed);
            if b != NO_BUF {
                self.states[b as usize].store(OWNED, Relaxed);
                slot.take(self, b as usize, now);
            }
        }
        IO_LOCK.0.store(0, Release);
    }
}

/// The chunk length (payload bytes) recorded in a buffer's header.
fn chunk_len(buf: *const u8) -> usize {
    let mut h = [0u8; CHUNK_HEADER_SIZE];
    // SAFETY: the header is the first 32 bytes of the buffer.
    unsafe { std::ptr::copy_nonoverlapping(buf, h.as_mut_ptr(), CHUNK_HEADER_SIZE) };
    u32::from_le_bytes([h[16], h[17], h[18], h[19]]) as usize
}

/// `write(2)` until done or an error (async-signal-safe).
pub fn write_all(fd: i32, bytes: &[u8]) -> bool {
    let (mut p, mut len) = (bytes.as_ptr(), bytes.len());
    while len > 0 {
        // SAFETY: `p..p+len` is readable memory the caller owns.
        let n = unsafe { libc::write(fd, p as *const libc::c_void, len) };
        if n < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return false;
        }
        // SAFETY: n <= len bytes were written.
        p = unsafe { p.add(n as usize) };
        len -= n as usize;
    }
    true
}

pub fn gettid() -> u32 {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::gettid() as u32 }
}

/// One recorded thread.  Hot fields first; the owner thread writes them
/// with relaxed atomics (plain stores), flushes on other threads read them.
#[repr(C, align(64))]
pub struct Slot {
    /// Where the next event goes: `words` + the committed events.
    wp: AtomicPtr<u64>,
    /// `words` + the words the current buffer holds (`words`: no room).
    end: AtomicPtr<u64>,
    /// The current buffer's payload (null: none).
    words: AtomicPtr<u64>,
    /// Ticks of the last event written.
    prev: AtomicU64,
    buf: AtomicU32,
    tid: AtomicU32,
    seq: AtomicU32,
    in_use: AtomicU32,
    busy: AtomicU32,
    /// Ticks in the current chunk's header.
    start: AtomicU64,
    /// Events lost before the current chunk (goes into its header).
    chunk_lost: AtomicU64,
    /// Events lost while the thread had no buffer (goes into the next chunk).
    lost_pending: AtomicU64,
    lost_total: AtomicU64,
    /// The alternate signal stack given to the slot's thread (its mapping,
    /// guard page included; 0: none), see [`install_alt_stack`].
    alt: AtomicUsize,
}

impl Slot {
    const fn new() -> Slot {
        Slot {
            wp: AtomicPtr::new(std::ptr::null_mut()),
            end: AtomicPtr::new(std::ptr::null_mut()),
            words: AtomicPtr::new(std::ptr::null_mut()),
            prev: AtomicU64::new(0),
            buf: AtomicU32::new(NO_BUF),
            tid: AtomicU32::new(0),
            seq: AtomicU32::new(0),
            in_use: AtomicU32::new(0),
            busy: AtomicU32::new(IDLE),
            start: AtomicU64::new(0),
            chunk_lost: AtomicU64::new(0),
            lost_pending: AtomicU64::new(0),
            lost_total: AtomicU64::new(0),
            alt: AtomicUsize::new(0),
        }
    }

    /// Committed events in the current buffer.
    fn pos(&self, order: Ordering) -> u32 {
        let wp = self.wp.load(order) as usize;
        (wp.wrapping_sub(self.words.load(Relaxed) as usize) / 8) as u32
    }

    /// Sets the committed events (after `words`).
    fn set_pos(&self, pos: u32, order: Ordering) {
        let w = self.words.load(Relaxed);
        self.wp.store(w.wrapping_add(pos as usize), order);
    }

    /// Words the current buffer holds (0: none, or no room any more).
    fn cap(&self) -> u32 {
        let end = self.end.load(Relaxed) as usize;
        (end.wrapping_sub(self.words.load(Relaxed) as usize) / 8) as u32
    }

    /// Sets the words the current buffer holds (after `words`).
    fn set_cap(&self, cap: u32, order: Ordering) {
        let w = self.words.load(Relaxed);
        self.end.store(w.wrapping_add(cap as usize), order);
    }

    fn clear(&self) {
        self.end.store(std::ptr::null_mut(), Relaxed);
        self.wp.store(std::ptr::null_mut(), Relaxed);
        self.words.store(std::ptr::null_mut(), Relaxed);
        self.buf.store(NO_BUF, Relaxed);
        self.seq.store(0, Relaxed);
        self.chunk_lost.store(0, Relaxed);
        self.lost_pending.store(0, Relaxed);
        self.lost_total.store(0, Relaxed);
    }

    /// Starts writing into buffer `i` (OWNED by this slot).
    fn take(&self, pool: &Pool, i: usize, now: u64) {
        let words = pool.buf(i).wrapping_add(CHUNK_HEADER_SIZE) as *mut u64;
        self.buf.store(i as u32, Relaxed);
        self.words.store(words, Relaxed);
        self.start.store(now, Relaxed);
        self.prev.store(now, Relaxed);
        self.set_pos(0, Release);
        let lost = self.lost_pending.swap(0, Relaxed);
        let mut cap = pool.payload_words();
        if lost > u32::MAX as u64 {
            // The header holds 32 bits; the rest goes into a LOST event.
            let [a, b] = Event::lost(lost - u32::MAX as u64);
            // SAFETY: a buffer holds at least 8 words (Pool::install).
            unsafe {
                words.write(a);
                words.add(1).write(b);
            }
            self.set_pos(2, Release);
            self.chunk_lost.store(u32::MAX as u64, Relaxed);
        } else {
            self.chunk_lost.store(lost, Relaxed);
        }
        cap = cap.max(2);
        self.set_cap(cap, Relaxed);
    }

    /// Writes the chunk header into the current buffer; returns its index.
    fn seal(&self, pool: &Pool, flags: u16) -> Option<usize> {
        let b = self.buf.load(Relaxed);
        if b == NO_BUF {
            return None;
        }
        let h = ChunkHeader {
            flags,
            tid: self.tid.load(Relaxed),
            seq: self.seq.fetch_add(1, Relaxed),
            len: self.pos(Acquire) * 8,
            lost: self.chunk_lost.load(Relaxed).min(u32::MAX as u64) as u32,
            time: self.start.load(Relaxed),
        }
        .encode();
        // SAFETY: the first 32 bytes of a buffer this slot owns.
        unsafe {
            std::ptr::copy_nonoverlapping(h.as_ptr(), pool.buf(b as usize), CHUNK_HEADER_SIZE)
        };
        Some(b as usize)
    }

    /// Hands the current buffer to the writer (FULL, in ticket order).
    fn hand_off(&self, pool: &Pool, flags: u16) {
        if let Some(b) = self.seal(pool, flags) {
            self.buf.store(NO_BUF, Relaxed);
            self.words.store(std::ptr::null_mut(), Relaxed);
            self.end.store(std::ptr::null_mut(), Relaxed);
            self.wp.store(std::ptr::null_mut(), Relaxed);
            let t = TICKET.fetch_add(1, Relaxed);
            pool.states[b].store(FULL | t << 2, Release);
        }
    }

    fn count_lost(&self, n: u64) {
        self.lost_pending.fetch_add(n, Relaxed);
        self.lost_total.fetch_add(n, Relaxed);
    }
}

static SLOTS: [Slot; MAX_THREADS] = [const { Slot::new() }; MAX_THREADS];

/// Call depths whose function id (and entry time) a thread keeps.
pub const DEPTH_SLOTS: usize = 256;

/// Per call depth, the function id entered there (the exit reads it
/// instead of looking the site up again) and its entry time (deferred
/// ENTRYs with a minimum duration): 3 KB per thread, kept with the
/// thread's slot ([`DEPTHS`]) rather than in its thread-local [`Local`].
/// glibc carves every library's static TLS out of each thread's stack, so
/// 3 KB there took 3 KB from every thread of the program, 22 % of a
/// `PTHREAD_STACK_MIN` stack (test `small_thread_stacks_keep_their_room`).
/// Atomics for `Sync`; only the slot's thread touches them (relaxed:
/// plain loads and stores).
pub struct Depths {
    pub ids: [AtomicU32; DEPTH_SLOTS],
    pub times: [AtomicU64; DEPTH_SLOTS],
}

/// The [`Depths`] of each slot (same index as [`SLOTS`]).
static DEPTHS: [Depths; MAX_THREADS] = [const {
    Depths {
        ids: [const { AtomicU32::new(0) }; DEPTH_SLOTS],
        times: [const { AtomicU64::new(0) }; DEPTH_SLOTS],
    }
}; MAX_THREADS];

/// The tracing path's per-thread state, in one small thread-local so that
/// a callback pays for one TLS lookup (`__tls_get_addr`: this is a shared
/// library): the thread's slot and its [`Depths`], then the depth counts,
/// on one cache line (`repr(C)`).
#[repr(C)]
pub struct Local {
    /// This thread's slot (null until its first event).
    cur: Cell<*const Slot>,
    /// The slot's [`Depths`] (null while `cur` is).  Derivable from `cur`
    /// (same index in [`DEPTHS`] as in [`SLOTS`]), but the callbacks'
    /// fast paths are measurably faster loading it than computing it (the
    /// record benchmark's tracee, 8 interleaved runs each: 335 against 350
    /// ms at best).
    depths: Cell<*const Depths>,
    /// function_graph without a minimum duration: calls with an ENTRY
    /// written and no EXIT yet (the fgraph depth after the last event).
    /// More than the depth of a new event means fgraph dropped frames
    /// (longjmp, exception): they get UNWOUND markers.
    pub open: Cell<usize>,
    /// Minimum duration: the frames at depths below this are written.
    pub written: Cell<usize>,
    /// Set by the `vfork` interposer ([`Local::enter_vfork`]): the slot
    /// put aside while a `vfork` child may run on this thread's memory.
    vfork: Cell<Option<*const Slot>>,
}

thread_local! {
    static LOCAL: Local = const {
        Local {
            cur: Cell::new(std::ptr::null()),
            depths: Cell::new(std::ptr::null()),
            written: Cell::new(0),
            open: Cell::new(0),
            vfork: Cell::new(None),
        }
    };
}

impl Local {
    /// The thread's [`Depths`], if it has a slot (no call).
    #[inline(always)]
    pub fn depths(&self) -> Option<&'static Depths> {
        self.slotted().map(|(_, d)| d)
    }

    /// The thread's slot and its [`Depths`], if it has a slot (no call):
    /// `depths` is set after `cur` when a slot is claimed and cleared
    /// before it when released, so `cur` is not tested.
    #[inline(always)]
    pub fn slotted(&self) -> Option<(&'static Slot, &'static Depths)> {
        let d = self.depths.get();
        if d.is_null() {
            return None;
        }
        let p = self.cur.get();
        debug_assert!(!p.is_null());
        // SAFETY: `depths` is null or points into DEPTHS (claim_slot), and
        // while it is not null `cur` points into SLOTS (above).
        Some(unsafe { (&*p, &*d) })
    }

    /// Before `vfork` (its interposer, on the thread calling it): the
    /// child runs on this thread's stack and memory — this very `Local`,
    /// slot, shadow stack — while the thread waits, until it `exec`s or
    /// `_exit`s.  Its calls are not the thread's, and it is not followed
    /// (its `exec`, if any, is): the slot and depths are put aside, so that
    /// the tracer's fast paths fail and its slow paths ask
    /// [`Local::in_vfork_child`], which records nothing for the child and
    /// puts them back in the thread once it runs again.  Until the
    /// thirtieth session the child's calls were written into the thread's
    /// buffer as its own (dash and CPython's `subprocess` run code between
    /// `vfork` and `exec`).
    pub fn enter_vfork(&self) {
        if self.vfork.get().is_none() {
            self.vfork.set(Some(self.cur.get()));
            // (The fast paths test `depths`: cleared first, as when a slot
            // is released.)
            self.depths.set(std::ptr::null());
            self.cur.set(std::ptr::null());
        }
    }

    /// True in a `vfork` child ([`Local::enter_vfork`]): record nothing.
    /// In the thread that called `vfork`, running again (it is the process
    /// being recorded), puts its slot back and returns false.
    #[cold]
    #[inline(never)]
    pub fn in_vfork_child(&self) -> bool {
        let Some(p) = self.vfork.get() else { return false };
        if !crate::session::recording() {
            return true;
        }
        self.cur.set(p);
        if !p.is_null() {
            // The slot's index in SLOTS is its depths' in DEPTHS.
            self.depths.set(&DEPTHS[(p as usize - SLOTS.as_ptr() as usize) / std::mem::size_of::<Slot>()]);
        }
        self.vfork.set(None);
        false
    }

    /// [`Local::depths`], claiming the thread's slot first if it has none
    /// (for notes made before the thread's first event); None when no slot
    /// is free or the thread is exiting.
    pub fn depths_claimed(&self) -> Option<&'static Depths> {
        if self.cur.get().is_null() {
            claim_slot(self).ok()?;
        }
        self.depths()
    }
}

/// This thread's [`Local`].
#[inline(always)]
pub fn local() -> &'static Local {
    let p = LOCAL.with(|l| l as *const Local);
    // SAFETY: a const-initialised thread-local without a destructor lives
    // as long as its thread, and `&Local` cannot leave the thread (Local
    // is not Sync).  Taking the pointer keeps `LocalKey::with` small enough
    // to inline into the callbacks.
    unsafe { &*p }
}

/// [`local`] through the recorder's fgraph task variable, which keeps the
/// address of this thread's [`Local`] after the first call: one thread-local
/// lookup (`__tls_get_addr` in this shared library) less per callback.
#[inline(always)]
pub fn local_cached(task_var: Option<&Cell<u64>>) -> &'static Local {
    let Some(c) = task_var else { return local() };
    let p = c.get();
    if p != 0 {
        // SAFETY: only this function stores into the recorder's task
        // variable, and what it stores is the address of this thread's
        // Local (the task variable is per thread): a const thread-local
        // without destructor, alive until the thread is gone and at the
        // same address in a fork child.
        return unsafe { &*(p as *const Local) };
    }
    let l = local();
    c.set(l as *const Local as u64);
    l
}

/// The [`Local`] the recorder's fgraph task variable holds, if it holds
/// one yet (see [`local_cached`]); no thread-local lookup, no call.
#[inline(always)]
pub fn local_if_cached(task_var: Option<&Cell<u64>>) -> Option<&'static Local> {
    let p = task_var?.get();
    // SAFETY: as in `local_cached`: a non-zero value is the address of this
    // thread's Local.
    (p != 0).then(|| unsafe { &*(p as *const Local) })
}

/// Releases this thread's slot at thread exit (a runtime exit hook,
/// armed when the slot is claimed).
extern "C" fn release_slot_at_exit() {
    // The main thread keeps its slot until the final flush (if it calls
    // pthread_exit, other threads and atexit handlers may still write
    // through it).
    if gettid() == std::process::id() {
        return;
    }
    let Ok(p) = LOCAL.try_with(|l| {
        let _ = l.in_vfork_child();
        l.depths.set(std::ptr::null());
        l.cur.replace(std::ptr::null())
    }) else {
        return;
    };
    if p.is_null() {
        return;
    }
    // SAFETY: `cur` only ever points into SLOTS.
    let slot = unsafe { &*p };
    if slot
        .busy
        .compare_exchange(IDLE, IN_SLOW_PATH, Acquire, Relaxed)
        .is_ok()
    {
        if let Some(pool) = Pool::get() {
            if slot.buf.load(Relaxed) == NO_BUF && !STOPPED.load(Relaxed) {
                // An empty last chunk marks the end and carries the losses;
                // with no buffer free, a tombstone.
                match pool.acquire() {
                    Some(i) => slot.take(pool, i, ftramp_runtime::clock::ticks()),
                    None => bury(slot),
                }
            }
            slot.hand_off(pool, ftramp_trace::format::FLAG_LAST);
        }
        RETIRED_LOST.fetch_add(slot.lost_total.load(Relaxed), Relaxed);
        slot.clear();
        take_back_alt_stack(slot);
        slot.busy.store(IDLE, Release);
        slot.in_use.store(0, Release);
    }
}

/// Lost events of threads that exited.
static RETIRED_LOST: AtomicU64 = AtomicU64::new(0);

/// The last chunk of a thread that exited with no buffer (the pool was
/// empty): a header without events, written by the writer with the next
/// buffers, so that the trace still shows the thread's end and where its
/// last losses were.  `state`: 0 free, 1 being filled, 2 ready.
struct Tombstone {
    state: AtomicU32,
    tid: AtomicU32,
    seq: AtomicU32,
    lost: AtomicU64,
    time: AtomicU64,
}

const TOMBSTONES: usize = 64;
static TOMBS: [Tombstone; TOMBSTONES] = [const {
    Tombstone { state: AtomicU32::new(0), tid: AtomicU32::new(0), seq: AtomicU32::new(0), lost: AtomicU64::new(0), time: AtomicU64::new(0) }
}; TOMBSTONES];

/// Queues `slot`'s last chunk, without events, for the writer.  With every
/// tombstone taken, the thread's end goes unmarked and its last losses are
/// only in the total.
fn bury(slot: &Slot) {
    let Some(t) = TOMBS.iter().find(|t| t.state.compare_exchange(0, 1, Acquire, Relaxed).is_ok()) else {
        return;
    };
    t.tid.store(slot.tid.load(Relaxed), Relaxed);
    t.seq.store(slot.seq.fetch_add(1, Relaxed), Relaxed);
    t.lost.store(slot.lost_pending.swap(0, Relaxed), Relaxed);
    t.time.store(slot.prev.load(Relaxed), Relaxed);
    t.state.store(2, Release);
}

/// The header of a chunk without events: a thread's losses (and, with
/// `FLAG_LAST`, its end) when it has no buffer to carry them.
fn empty_chunk(flags: u16, tid: u32, seq: u32, lost: u64, time: u64) -> [u8; CHUNK_HEADER_SIZE] {
    ChunkHeader { flags, tid, seq, len: 0, lost: lost.min(u32::MAX as u64) as u32, time }.encode()
}

impl Local {
    /// Appends one ENTRY/EXIT word (`base` = the word with delta 0) at `now`.
    #[inline(always)]
    pub fn emit(&self, base: u64, now: u64) {
        if !self.try_emit(base, now) {
            emit_slow(self, base, now)
        }
    }

    /// [`Local::emit`] when the buffer has room and the delta fits the
    /// word: false (nothing done) otherwise.  No calls: the tracer's fast
    /// paths stay leaf functions.
    #[inline(always)]
    pub fn try_emit(&self, base: u64, now: u64) -> bool {
        let p = self.cur.get();
        if p.is_null() {
            return false;
        }
        // SAFETY: `cur` only ever points into SLOTS.
        Self::try_emit_in(unsafe { &*p }, base, now)
    }

    /// [`Local::try_emit`] into `slot`, this thread's (from
    /// [`Local::slotted`]).
    #[inline(always)]
    pub fn try_emit_in(slot: &Slot, base: u64, now: u64) -> bool {
        let wp = slot.wp.load(Relaxed);
        Self::append(slot, wp, now.wrapping_sub(slot.prev.load(Relaxed)), base, now)
    }

    /// The word `base` with `delta` appended at `wp` (`slot`'s write
    /// pointer, as loaded by the caller) and committed, when the buffer has
    /// room and the delta fits the word; false (nothing done) otherwise.
    #[inline(always)]
    fn append(slot: &Slot, wp: *mut u64, delta: u64, base: u64, now: u64) -> bool {
        if wp >= slot.end.load(Relaxed) || delta > u32::MAX as u64 {
            return false;
        }
        // SAFETY: wp < end, a payload word of the buffer this thread owns.
        unsafe { wp.write(base | delta << 32) };
        slot.prev.store(now, Relaxed);
        slot.wp.store(wp.wrapping_add(1), Release);
        true
    }

    /// Writes the EXIT of `id` at `now`: when the buffer's last word is the
    /// ENTRY of `id` and the two times fit, by turning that word into a
    /// LEAF (the format's LEAF: the reader gets the same ENTRY and EXIT
    /// back), else as [`Local::try_emit_in`] does; false (nothing done)
    /// when neither can be done here.  `slot` is this thread's.  No calls:
    /// the tracer's fast paths stay leaf functions.
    ///
    /// The ENTRY was committed, so a crash flush on another thread may be
    /// copying it: it copies the ENTRY or the LEAF (one aligned 8-byte
    /// store), either a valid trace of the moment it copied.
    #[inline(always)]
    pub fn try_emit_exit_in(slot: &Slot, id: u32, now: u64) -> bool {
        let wp = slot.wp.load(Relaxed);
        let delta = now.wrapping_sub(slot.prev.load(Relaxed));
        if wp > slot.words.load(Relaxed) {
            // SAFETY: words < wp <= end: a committed payload word of the
            // buffer this thread owns (no buffer: both null).
            let last = unsafe { wp.sub(1) };
            // SAFETY: as above.
            let w = unsafe { last.read() };
            if w as u32 == Event::entry(id, 0) as u32 && (w >> 32 | delta) <= LEAF_MAX {
                // SAFETY: as above; only this thread writes the buffer.
                unsafe { last.write(Event::leaf_from_entry(w, delta)) };
                slot.prev.store(now, Relaxed);
                return true;
            }
        }
        Self::append(slot, wp, delta, Event::exit(id, 0), now)
    }

    /// Appends the EXIT of `id` at `now`: a LEAF in place of its ENTRY when
    /// that is the last word ([`Local::try_emit_exit_in`]), else one word.
    #[inline(always)]
    pub fn emit_exit(&self, id: u32, now: u64) {
        let p = self.cur.get();
        // SAFETY: `cur` is null or points into SLOTS.
        if p.is_null() || !Self::try_emit_exit_in(unsafe { &*p }, id, now) {
            emit_slow(self, Event::exit(id, 0), now)
        }
    }

    /// Counts `n` events lost on this thread (e.g. no function id).
    pub fn lose(&self, n: u64) {
        let p = self.cur.get();
        if p.is_null() {
            LOST_UNSLOTTED.fetch_add(n, Relaxed);
        } else {
            // SAFETY: `cur` only ever points into SLOTS.
            unsafe { &*p }.count_lost(n);
        }
    }
}

/// [`Local::emit`] on this thread.
#[inline(always)]
pub fn emit(base: u64, now: u64) {
    local().emit(base, now)
}

/// [`Local::lose`] on this thread.
pub fn lose(n: u64) {
    local().lose(n)
}

#[cold]
#[inline(never)]
fn emit_slow(local: &Local, base: u64, now: u64) {
    if local.in_vfork_child() {
        return;
    }
    let Some(pool) = Pool::get() else { return };
    if STOPPED.load(Acquire) {
        // After the final flush (the fast paths fail on the closed slots'
        // zero room and come here): nothing is written any more.
        LOST_AFTER_FLUSH.fetch_add(1, Relaxed);
        return;
    }
    let p = local.cur.get();
    let slot = if p.is_null() {
        match claim_slot(local) {
            Ok(s) => s,
            Err(NoSlot::Exiting) => {
                LOST_AT_THREAD_EXIT.fetch_add(1, Relaxed);
                return;
            }
            Err(NoSlot::AllTaken) => {
                LOST_UNSLOTTED.fetch_add(1, Relaxed);
                return;
            }
        }
    } else {
        // SAFETY: `cur` only ever points into SLOTS.
        unsafe { &*p }
    };
    if slot
        .busy
        .compare_exchange(IDLE, IN_SLOW_PATH, Acquire, Relaxed)
        .is_err()
    {
        // Closed by the final flush, or a signal handler interrupted our
        // own slow path.
        slot.count_lost(1);
        return;
    }
    let delta = now.wrapping_sub(slot.prev.load(Relaxed));
    let need = if delta <= u32::MAX as u64 { 1 } else { 3 };
    if slot.buf.load(Relaxed) != NO_BUF && slot.pos(Relaxed) + need > slot.cap() {
        slot.hand_off(pool, 0);
    }
    if slot.buf.load(Relaxed) == NO_BUF {
        match (!STOPPED.load(Relaxed)).then(|| pool.acquire()).flatten() {
            Some(i) => slot.take(pool, i, now),
            None => {
                slot.count_lost(1);
                slot.busy.store(IDLE, Release);
                return;
            }
        }
    }
    let words = slot.words.load(Relaxed);
    let mut pos = slot.pos(Relaxed) as usize;
    let delta = now.wrapping_sub(slot.prev.load(Relaxed));
    let w = if delta <= u32::MAX as u64 {
        base | delta << 32
    } else {
        for w in Event::time(now) {
            // SAFETY: a fresh buffer or pos + 3 <= cap (checked above).
            unsafe { words.add(pos).write(w) };
            pos += 1;
        }
        base
    };
    // SAFETY: as above.
    unsafe { words.add(pos).write(w) };
    slot.prev.store(now, Relaxed);
    slot.set_pos(pos as u32 + 1, Release);
    slot.busy.store(IDLE, Release);
}

fn claim_slot(local: &Local) -> Result<&'static Slot, NoSlot> {
    // The slot is released at thread exit: not claimable once the thread
    // is exiting.
    if !ftramp_runtime::thread::arm() {
        return Err(NoSlot::Exiting);
    }
    let (i, slot) = SLOTS
        .iter()
        .enumerate()
        .find(|(_, s)| s.in_use.compare_exchange(0, 1, Acquire, Relaxed).is_ok())
        .ok_or(NoSlot::AllTaken)?;
    slot.clear();
    slot.tid.store(gettid(), Relaxed);
    slot.busy.store(IDLE, Relaxed);
    slot.alt.store(install_alt_stack().unwrap_or(0), Relaxed);
    local.cur.set(slot);
    local.depths.set(&DEPTHS[i]);
    Ok(slot)
}

/// Bytes of the alternate signal stack a recording thread gets (and the
/// main thread at start, `session`), above a guard page.
const ALT_STACK_SIZE: usize = 64 << 10;

/// The page size (no lock: glibc answers it from the auxiliary vector, so
/// a signal handler may ask).
fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

/// Gives this thread an alternate signal stack if it has none, and returns
/// its mapping (guard page included), which stays mapped until
/// [`take_back_alt_stack`] or the process's end.  So a stack overflow on
/// the thread still reaches the recorder's handler, which writes the trace
/// (`SA_ONSTACK`): without one the kernel has no stack to run the handler
/// on and kills the process with every thread's unwritten events.  Until
/// the thirtieth session only the main thread had one, and a C program
/// whose second thread recursed for ever (a Perl ithread sorting with a
/// comparator that recursed) left a trace with nothing.  A thread that has
/// one (a Rust thread's own, the program's) keeps it; a program that sets
/// its own later replaces this one.  Async-signal-safe (system calls): the
/// first event of a thread may be a signal handler's.
pub(crate) fn install_alt_stack() -> Option<usize> {
    let page = page_size();
    // SAFETY: sigaltstack with a null new stack only reads the current one
    // into `old`; mmap of fresh anonymous memory, whose lowest page is
    // made inaccessible (a guard, as below a thread stack); sigaltstack of
    // the rest, which stays mapped as said above.
    unsafe {
        let mut old: libc::stack_t = std::mem::zeroed();
        if libc::sigaltstack(std::ptr::null(), &mut old) != 0 || old.ss_flags & libc::SS_DISABLE == 0 {
            return None;
        }
        let p = libc::mmap(std::ptr::null_mut(), ALT_STACK_SIZE + page, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0);
        if p == libc::MAP_FAILED {
            return None;
        }
        libc::mprotect(p, page, libc::PROT_NONE);
        let ss = libc::stack_t { ss_sp: (p as *mut u8).add(page) as *mut libc::c_void, ss_flags: 0, ss_size: ALT_STACK_SIZE };
        if libc::sigaltstack(&ss, std::ptr::null_mut()) != 0 {
            libc::munmap(p, ALT_STACK_SIZE + page);
            return None;
        }
        Some(p as usize)
    }
}

/// At the thread's exit: disables the alternate stack [`install_alt_stack`]
/// gave it (kept in its slot), if it is still the thread's and not in use,
/// and unmaps it (a stack the program put in its place is left alone; ours
/// is then only unmapped).
fn take_back_alt_stack(slot: &Slot) {
    let p = slot.alt.swap(0, Relaxed);
    if p == 0 {
        return;
    }
    let page = page_size();
    // SAFETY: reads the current alternate stack; disables it only when it
    // is ours and the thread is not running on it; unmaps our mapping only
    // when it is no longer the thread's alternate stack.
    unsafe {
        let mut cur: libc::stack_t = std::mem::zeroed();
        if libc::sigaltstack(std::ptr::null(), &mut cur) != 0 {
            return;
        }
        if cur.ss_flags & libc::SS_DISABLE == 0 && cur.ss_sp as usize == p + page {
            if cur.ss_flags & libc::SS_ONSTACK != 0 {
                return; // In use (an exit from a handler on it): left mapped.
            }
            let off = libc::stack_t { ss_sp: std::ptr::null_mut(), ss_flags: libc::SS_DISABLE, ss_size: 0 };
            if libc::sigaltstack(&off, std::ptr::null_mut()) != 0 {
                return;
            }
        }
        libc::munmap(p as *mut libc::c_void, ALT_STACK_SIZE + page);
    }
}

/// Why [`claim_slot`] found none.
enum NoSlot {
    /// The thread is exiting (its exit hooks have run).
    Exiting,
    /// Every slot is in use.
    AllTaken,
}

/// The lock held by whoever writes chunks to the `.dat` file.
pub struct IoLock(AtomicU32);

pub static IO_LOCK: IoLock = IoLock(AtomicU32::new(0));

impl IoLock {
    pub fn try_lock(&self) -> bool {
        self.0.compare_exchange(0, 1, Acquire, Relaxed).is_ok()
    }

    /// Spins (sleeping 100 µs between tries) for at most `tries` tries.
    pub fn lock_for(&self, tries: u32) -> bool {
        for _ in 0..tries {
            if self.try_lock() {
                return true;
            }
            let ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 100_000,
            };
            // SAFETY: nanosleep reads our timespec; async-signal-safe.
            unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
        }
        false
    }

    pub fn unlock(&self) {
        self.0.store(0, Release);
    }
}

/// Writes everything recorded so far to `out`: the FULL buffers in order,
/// then each thread's partial buffer (flag FLUSH), and leaves every slot
/// with an empty buffer and no room: the final flush (exit, crash, exec);
/// threads cannot record any more until [`reopen`].  The caller holds the
/// [`IoLock`].  Async-signal-safe (no allocation, no locks).
pub fn flush_all(out: &TraceFile) {
    let Some(pool) = Pool::get() else { return };
    STOPPED.store(true, SeqCst);
    while pool.write_one(out) {}
    for slot in SLOTS.iter().filter(|s| s.in_use.load(Acquire) != 0) {
        // Wait a little for a thread in its slow path (it may be handing
        // off a buffer); a thread interrupted there by this very signal
        // handler never finishes, so give up after a few tries.
        let mut claimed = false;
        for _ in 0..100 {
            if slot
                .busy
                .compare_exchange(IDLE, CLOSED, Acquire, Relaxed)
                .is_ok()
            {
                claimed = true;
                break;
            }
            std::hint::spin_loop();
        }
        if !claimed {
            continue;
        }
        slot.set_cap(0, SeqCst);
        if slot.buf.load(Relaxed) == NO_BUF {
            // No buffer (it ran out): a header-only chunk carries its losses.
            let lost = slot.lost_pending.swap(0, Relaxed);
            if lost > 0 {
                let seq = slot.seq.fetch_add(1, Relaxed);
                out.write_chunk(&empty_chunk(ftramp_trace::format::FLAG_FLUSH, slot.tid.load(Relaxed), seq, lost, slot.prev.load(Relaxed)));
            }
        }
        if let Some(b) = slot.seal(pool, ftramp_trace::format::FLAG_FLUSH) {
            out.write_chunk(pool.bytes(b, CHUNK_HEADER_SIZE + chunk_len(pool.buf(b))));
            // The same buffer, emptied (events after this point go into it
            // if the process goes on).
            slot.take(pool, b, ftramp_runtime::clock::ticks());
            slot.set_cap(0, SeqCst);
        }
    }
    while pool.write_one(out) {}
}

/// Undoes the `close` of [`flush_all`] (an `exec` that failed).
pub fn reopen() {
    let Some(pool) = Pool::get() else { return };
    STOPPED.store(false, SeqCst);
    for slot in SLOTS.iter().filter(|s| s.in_use.load(Acquire) != 0) {
        if slot.buf.load(Relaxed) != NO_BUF {
            slot.set_cap(pool.payload_words(), Relaxed);
        }
        let _ = slot.busy.compare_exchange(CLOSED, IDLE, Release, Relaxed);
    }
}

/// Events of threads still running after the final flush, not written
/// (not in [`lost_total`]).
pub fn lost_after_flush() -> u64 {
    LOST_AFTER_FLUSH.load(Relaxed)
}

/// Events of calls made after their thread's exit hooks ([`LOST_AT_THREAD_EXIT`]).
pub fn lost_at_thread_exit() -> u64 {
    LOST_AT_THREAD_EXIT.load(Relaxed)
}

/// All events lost so far (live and exited threads) for want of buffers
/// or slots.
pub fn lost_total() -> u64 {
    SLOTS
        .iter()
        .filter(|s| s.in_use.load(Acquire) != 0)
        .map(|s| s.lost_total.load(Relaxed))
        .sum::<u64>()
        + RETIRED_LOST.load(Relaxed)
        + LOST_UNSLOTTED.load(Relaxed)
}

/// This thread's slot, for fork (null if it recorded nothing).
pub fn current_slot() -> Option<&'static Slot> {
    let p = LOCAL.with(|l| {
        let _ = l.in_vfork_child();
        l.cur.get()
    });
    // SAFETY: `cur` only ever points into SLOTS.
    (!p.is_null()).then(|| unsafe { &*p })
}
