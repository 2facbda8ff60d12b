//! The descriptors of the trace files (`.info`, `.sym`, `.dat`), kept out of
//! the program's way and checked before every write.
//!
//! The program must see the descriptors it would see untraced, and must not
//! receive trace bytes in its own files:
//!
//! * The files are opened at a high descriptor number (`F_DUPFD_CLOEXEC`
//!   from three quarters of `RLIMIT_NOFILE`, at most 768), not at the lowest
//!   free one: a program's first `open` still returns 3, as untraced.
//! * A program may close every descriptor above 2 (daemons, `closefrom`,
//!   `close_range`) and open its own files, which may get the number of a
//!   trace file. Each write first checks with `fstat` that the descriptor
//!   is still the file it opened (device and inode), and otherwise reopens
//!   the file by its path (`O_APPEND`, so nothing written is overwritten)
//!   at a new high number, leaving the old number to the program. Left: a
//!   program that closes a trace descriptor and reuses its number between
//!   that check and the write, a window of one system call.
//! * A write that still fails (disk full, the directory removed) is counted,
//!   with its error, and reported at the end ([`report_failures`]), never
//!   silently dropped.
//! * A disk that fills while the program runs must not take the image's
//!   end with it (its `exit` line, its losses): the `.info` gets its
//!   blocks reserved when it is created ([`TraceFile::reserve`]), so that
//!   the lines appended at the end land in space already held.  And a
//!   thread whose last chunks could not be written is named in the `.info`
//!   ([`write_unwritten`]): readers then end its stream with that loss,
//!   instead of taking the calls it left open for calls still running
//!   when the image ended.
//! * The program's file-size limit (`RLIMIT_FSIZE`, `ulimit -f`) applies to
//!   the trace files too, and a write past it sends the process `SIGXFSZ`,
//!   which kills it: a write that would go past it is not made
//!   ([`fits_size_limit`]) and counts as failed, so that the program runs
//!   as untraced and the trace ends at whole chunks and lines.
//!
//! Everything here is async-signal-safe (system calls and atomics, no
//! allocation after [`TraceFile::install`]): the crash flush writes from a
//! signal handler.

use std::ffi::{c_char, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, Ordering::*};

/// One trace file of this process image.
pub struct TraceFile {
    fd: AtomicI32,
    dev: AtomicU64,
    ino: AtomicU64,
    /// The file's path, for a reopen (leaked: a few per process image).
    path: AtomicPtr<c_char>,
}

/// Writes that failed after the reopen, their bytes, and the first error.
static FAILED_WRITES: AtomicU64 = AtomicU64::new(0);
static FAILED_BYTES: AtomicU64 = AtomicU64::new(0);
static FIRST_ERRNO: AtomicI32 = AtomicI32::new(0);
/// Events in `.dat` chunks whose write failed.
static FAILED_EVENTS: AtomicU64 = AtomicU64::new(0);
/// The file-size limit that kept writes from being made (0: none did).
static SIZE_LIMIT_HIT: AtomicU64 = AtomicU64::new(0);

/// A thread whose latest chunks could not be written: how many, and their
/// events (`tid` 0: a free entry).  A later chunk of the thread that is
/// written frees the entry, the gap in its `seq` then telling the loss.
struct UnwrittenTail {
    tid: AtomicU32,
    chunks: AtomicU64,
    events: AtomicU64,
}

/// The threads whose last chunks were not written, for the image's end.
/// Chunks are written under the recorder's I/O lock, one at a time.
static UNWRITTEN: [UnwrittenTail; 64] = [const {
    UnwrittenTail {
        tid: AtomicU32::new(0),
        chunks: AtomicU64::new(0),
        events: AtomicU64::new(0),
    }
}; 64];
/// More threads had chunks unwritten than [`UNWRITTEN`] holds.
static UNWRITTEN_MORE: AtomicBool = AtomicBool::new(false);

impl Default for TraceFile {
    fn default() -> TraceFile {
        TraceFile::new()
    }
}

impl TraceFile {
    pub const fn new() -> TraceFile {
        TraceFile {
            fd: AtomicI32::new(-1),
            dev: AtomicU64::new(0),
            ino: AtomicU64::new(0),
            path: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// Takes `fd`, open on `path`, moved to a high number; closes the
    /// previous one (the parent's, in a fork child).
    pub fn install(&self, fd: i32, path: &Path) {
        let c = CString::new(path.as_os_str().as_bytes()).unwrap_or_default();
        self.path.store(c.into_raw(), Release);
        let (old, fd) = self.adopt(fd);
        if old >= 0 && old != fd {
            // SAFETY: closing a descriptor this module opened: the parent's
            // trace file, in a fork child, where nothing else has run yet.
            unsafe { libc::close(old) };
        }
    }

    /// Makes `fd`, moved to a high number, this file's descriptor, with its
    /// identity; returns the previous descriptor and the new one.
    fn adopt(&self, fd: i32) -> (i32, i32) {
        let fd = ftramp_runtime::thread::move_fd_high(fd);
        let (dev, ino) = identity(fd).unwrap_or((0, 0));
        self.dev.store(dev, Relaxed);
        self.ino.store(ino, Relaxed);
        (self.fd.swap(fd, AcqRel), fd)
    }

    /// The descriptor, checked to be the file opened (reopened if the
    /// program closed or replaced it); -1 when it cannot be reopened.
    pub fn fd(&self) -> i32 {
        let fd = self.fd.load(Acquire);
        if fd >= 0 && identity(fd) == Some((self.dev.load(Relaxed), self.ino.load(Relaxed))) {
            return fd;
        }
        let p = self.path.load(Acquire);
        if p.is_null() {
            return -1;
        }
        // SAFETY: `p` is a NUL-terminated path leaked by `install`, never
        // freed.
        let nfd = unsafe { libc::open(p, libc::O_WRONLY | libc::O_APPEND | libc::O_CLOEXEC) };
        if nfd < 0 {
            return -1;
        }
        // The old number is the program's now (or closed): not closed here.
        self.adopt(nfd).1
    }

    /// Writes all of `bytes` (checked descriptor); a failure is counted.
    pub fn write_all(&self, bytes: &[u8]) -> bool {
        self.write_all_of(&[bytes])
    }

    /// Writes all of `parts`, one after the other, as one write is counted:
    /// none when they do not all fit under the file-size limit.
    fn write_all_of(&self, parts: &[&[u8]]) -> bool {
        let len = parts.iter().map(|p| p.len()).sum();
        let fd = self.fd();
        let fits = fd < 0 || fits_size_limit(fd, len);
        let ok = fd >= 0 && fits && parts.iter().all(|p| crate::pool::write_all(fd, p));
        if !ok {
            let e = if fits { std::io::Error::last_os_error().raw_os_error().unwrap_or(0) } else { libc::EFBIG };
            let _ = FIRST_ERRNO.compare_exchange(0, e, Relaxed, Relaxed);
            FAILED_WRITES.fetch_add(1, Relaxed);
            FAILED_BYTES.fetch_add(len as u64, Relaxed);
        }
        ok
    }

    /// Writes the lines of `text` (each ending in a newline): where the
    /// file-size limit leaves room for only some, those whole lines, and
    /// the rest counts as failed.
    pub fn write_lines(&self, text: &[u8]) -> bool {
        let fd = self.fd();
        if fd >= 0 {
            if let Some(room) = room_under_size_limit(fd).filter(|&r| r < text.len() as u64) {
                if let Some(end) = text[..room as usize].iter().rposition(|&b| b == b'\n') {
                    let (head, tail) = text.split_at(end + 1);
                    return self.write_all(head) && self.write_all(tail);
                }
            }
        }
        self.write_all(text)
    }

    /// Writes one `.dat` chunk (header and payload); the events of a chunk
    /// that cannot be written count as lost ([`failed_events`]), and go
    /// into the `lost` of the thread's next chunk written, or, when none is,
    /// into the `.info`'s `unwritten` ([`write_unwritten`]): each event lost
    /// so is placed in its thread's stream.  A chunk written in part (the
    /// disk filled during the write) is cut off again, so that the file
    /// holds whole chunks and what it holds is not counted as lost.
    pub fn write_chunk(&self, chunk: &[u8]) -> bool {
        use ftramp_trace::format::{ChunkHeader, CHUNK_HEADER_SIZE};
        let Some((head, payload)) = chunk.split_first_chunk::<CHUNK_HEADER_SIZE>() else {
            return self.write_all(chunk);
        };
        let Ok(mut header) = ChunkHeader::decode(head) else {
            return self.write_all(chunk);
        };
        let pending = UNWRITTEN.iter().find(|e| header.tid != 0 && e.tid.load(Relaxed) == header.tid);
        if let Some(e) = pending {
            header.lost = (header.lost as u64).saturating_add(e.events.load(Relaxed)).min(u32::MAX as u64) as u32;
        }
        let before = self.size();
        let ok = self.write_all_of(&[&header.encode(), payload]);
        if ok {
            if let Some(e) = pending {
                e.tid.store(0, Relaxed);
            }
            return true;
        }
        if let Some(before) = before.filter(|&b| self.size().is_some_and(|now| now > b)) {
            self.truncate(before);
        }
        let events = ftramp_trace::format::count_events(payload);
        FAILED_EVENTS.fetch_add(events, Relaxed);
        match pending.or_else(|| UNWRITTEN.iter().find(|e| e.tid.load(Relaxed) == 0)) {
            _ if header.tid == 0 => {}
            Some(e) if e.tid.load(Relaxed) == header.tid => {
                e.chunks.fetch_add(1, Relaxed);
                e.events.fetch_add(events, Relaxed);
            }
            Some(e) => {
                e.chunks.store(1, Relaxed);
                e.events.store(events, Relaxed);
                e.tid.store(header.tid, Relaxed);
            }
            None => UNWRITTEN_MORE.store(true, Relaxed),
        }
        false
    }

    /// Reserves the file's blocks up to `len` bytes without changing its
    /// size (`fallocate` with `FALLOC_FL_KEEP_SIZE`), so that appends up to
    /// there succeed on a disk filled meanwhile.  Best effort: a file system
    /// without `fallocate` just goes without.
    pub fn reserve(&self, len: u64) {
        let fd = self.fd();
        // Never past the program's file-size limit (qemu-user turned a
        // reservation past it into a SIGXFSZ that killed the program).
        let len = room_under_size_limit(fd).map_or(len, |room| len.min(room));
        if len == 0 {
            return;
        }
        // SAFETY: a system call on our own descriptor; it allocates blocks
        // past the end and changes no byte or size the program could see.
        unsafe { libc::fallocate(fd, libc::FALLOC_FL_KEEP_SIZE, 0, len as libc::off_t) };
    }

    /// `ftruncate` of the checked descriptor.
    pub fn truncate(&self, len: u64) {
        // SAFETY: shrinking our own file.
        unsafe { libc::ftruncate(self.fd(), len as libc::off_t) };
    }

    /// The file's size, if it can be read.
    pub fn size(&self) -> Option<u64> {
        stat(self.fd()).map(|st| st.st_size as u64)
    }
}

/// The descriptor of the trace's `info` this process holds a shared lock
/// on (-1: none).
static TRACE_LOCK: AtomicI32 = AtomicI32::new(-1);

/// Holds a shared `flock` on `<dir>/info` while the process records (once
/// per image: a fork child shares its parent's, through the inherited
/// descriptor; an exec closes it, and the new image takes its own), so
/// that an `ftramp record` started into the same directory meanwhile
/// refuses instead of removing the files we write into (`cli/src/record.rs`,
/// `lock_info`).  Best effort: without an `info` (the recorder used
/// without the CLI) or without locks, nothing.
pub fn hold_trace_lock(dir: &Path) {
    if TRACE_LOCK.load(Relaxed) >= 0 {
        return;
    }
    let Ok(c) = CString::new(dir.join("info").as_os_str().as_bytes()) else {
        return;
    };
    // SAFETY: opening a NUL-terminated path read-only, close-on-exec.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return;
    }
    let fd = ftramp_runtime::thread::move_fd_high(fd);
    // SAFETY: flock on the descriptor just opened; it never blocks (a
    // shared lock waits only for an exclusive one, which `ftramp record`
    // takes with LOCK_NB alone, never holding it).
    unsafe { libc::flock(fd, libc::LOCK_SH | libc::LOCK_NB) };
    TRACE_LOCK.store(fd, Relaxed);
}

/// `fstat` of `fd`, or None if it is not open.
fn stat(fd: i32) -> Option<libc::stat> {
    // SAFETY: stat is plain data; fstat fills it, and a bad fd only fails.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some(st)
}

/// Whether `len` more bytes at the end of `fd` stay within the process's
/// file-size limit (always without one); when not, the limit is noted for
/// [`report_failures`].
pub fn fits_size_limit(fd: i32, len: usize) -> bool {
    let fits = room_under_size_limit(fd).is_none_or(|room| len as u64 <= room);
    if !fits {
        SIZE_LIMIT_HIT.store(size_limit().unwrap_or(0), Relaxed);
    }
    fits
}

/// The process's file-size limit, if it has one.
fn size_limit() -> Option<u64> {
    // SAFETY: getrlimit fills the struct we own.
    let mut rl: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_FSIZE, &mut rl) } == 0;
    (ok && rl.rlim_cur != libc::RLIM_INFINITY).then_some(rl.rlim_cur as u64)
}

/// Bytes that can still be added to `fd` under the file-size limit (None:
/// no limit).
fn room_under_size_limit(fd: i32) -> Option<u64> {
    let limit = size_limit()?;
    let end = stat(fd).map_or(0, |st| st.st_size.max(0) as u64);
    Some(limit.saturating_sub(end))
}

/// Device and inode of `fd`, or None if it is not open.
fn identity(fd: i32) -> Option<(u64, u64)> {
    stat(fd).map(|st| (st.st_dev, st.st_ino))
}

/// The end-of-image report of trace writes that failed (async-signal-safe:
/// a fixed buffer, no allocation).
pub fn report_failures(pid: u32) {
    let (n, bytes, errno) = (FAILED_WRITES.load(Relaxed), FAILED_BYTES.load(Relaxed), FIRST_ERRNO.load(Relaxed));
    if n > 0 {
        let mut m = crate::session::StackBuf::new();
        use std::fmt::Write as _;
        let _ = writeln!(
            m,
            "ftramp record: pid {pid}: {n} writes ({bytes} bytes, {} events) to the trace failed ({}); the trace is incomplete",
            FAILED_EVENTS.load(Relaxed),
            errno_name(errno)
        );
        let limit = SIZE_LIMIT_HIT.load(Relaxed);
        if limit > 0 {
            let _ = writeln!(
                m,
                "ftramp record: pid {pid}: the trace files reached the program's file-size limit (RLIMIT_FSIZE, `ulimit -f`) of {limit} bytes: nothing was written past it (which would have killed the program with SIGXFSZ); raise the limit to record everything"
            );
        }
        crate::pool::write_all(2, m.bytes());
    }
}

/// Forgets the failed writes once reported (before an exec), and in a
/// fork child, whose parent reports its own.
pub fn reset_failures() {
    for c in [&FAILED_WRITES, &FAILED_BYTES, &FAILED_EVENTS, &SIZE_LIMIT_HIT] {
        c.store(0, Relaxed);
    }
    FIRST_ERRNO.store(0, Relaxed);
    for e in &UNWRITTEN {
        e.tid.store(0, Relaxed);
    }
    UNWRITTEN_MORE.store(false, Relaxed);
}

/// Appends to `info` the lines naming the threads whose last chunks could
/// not be written (nothing when there are none): `unwritten = [[tid,
/// chunks, events], ...]`, and `unwritten_more = true` when there were more
/// such threads than could be kept.  The readers end those threads'
/// streams with the loss (format.rs).  Async-signal-safe: an entry at a
/// time through a fixed buffer.
pub fn write_unwritten(info: &TraceFile) {
    use std::fmt::Write as _;
    let mut first = true;
    for e in UNWRITTEN.iter() {
        let tid = e.tid.load(Relaxed);
        if tid == 0 {
            continue;
        }
        let mut m = crate::session::StackBuf::new();
        let _ = write!(m, "{}[{tid}, {}, {}]", if first { "unwritten = [" } else { ", " }, e.chunks.load(Relaxed), e.events.load(Relaxed));
        info.write_all(m.bytes());
        first = false;
    }
    if !first {
        info.write_all(b"]\n");
    }
    if UNWRITTEN_MORE.load(Relaxed) {
        info.write_all(b"unwritten_more = true\n");
    }
}

/// Events lost because their chunk could not be written.
pub fn failed_events() -> u64 {
    FAILED_EVENTS.load(Relaxed)
}

/// A name for the errors a trace write meets, without `strerror` (which
/// is not async-signal-safe).
fn errno_name(e: i32) -> &'static str {
    match e {
        libc::ENOSPC => "ENOSPC: no space left on the device",
        libc::EDQUOT => "EDQUOT: disk quota exceeded",
        libc::EFBIG => "EFBIG: file too large",
        libc::EIO => "EIO: input/output error",
        libc::EBADF => "EBADF: the trace file could not be reopened",
        libc::ENOENT => "ENOENT: the trace directory was removed",
        libc::EACCES => "EACCES: permission denied",
        libc::EROFS => "EROFS: read-only file system",
        libc::EMFILE => "EMFILE: too many open files",
        _ => "an I/O error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::IntoRawFd;

    fn temp(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("ftramp-tracefile-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&d);
        d
    }

    /// A trace file installed on a fresh file `name`, and its descriptor.
    fn installed(name: &str) -> (TraceFile, std::path::PathBuf, i32) {
        let p = temp(name);
        let f = std::fs::OpenOptions::new().append(true).create(true).open(&p).unwrap();
        let t = TraceFile::new();
        t.install(f.into_raw_fd(), &p);
        let fd = t.fd.load(Relaxed);
        (t, p, fd)
    }

    #[test]
    fn opens_high_and_survives_the_program_closing_it() {
        let (t, p, fd) = installed("a");
        assert!(fd >= ftramp_runtime::thread::high_fd_base(), "{fd}");
        assert!(t.write_all(b"one\n"));
        // The program closes it and opens a file of its own at that number.
        let other = temp("other");
        // SAFETY: (test) closing the trace descriptor as a program would.
        unsafe { libc::close(fd) };
        let o = std::fs::File::create(&other).unwrap().into_raw_fd();
        // SAFETY: (test) moving the program's file onto the old number.
        assert_eq!(unsafe { libc::dup2(o, fd) }, fd);
        assert!(t.write_all(b"two\n"));
        assert_ne!(t.fd.load(Relaxed), fd, "reopened at another number");
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "one\ntwo\n");
        assert_eq!(std::fs::read_to_string(&other).unwrap(), "", "nothing of the trace in the program's file");
        // SAFETY: (test) closing the test's descriptors.
        unsafe {
            libc::close(fd);
            libc::close(o);
            libc::close(t.fd.load(Relaxed));
        }
        let _ = std::fs::remove_file(&p);
        let _ = std::fs::remove_file(&other);
    }

    /// In a child process (the limit is the process's, and the other
    /// tests write files meanwhile): with SIGXFSZ at its default, a write
    /// past the limit would kill the child.
    #[test]
    fn a_write_past_the_file_size_limit_is_not_made() {
        let (t, p, _) = installed("limit");
        assert!(t.write_all(&[b'x'; 100]));
        // SAFETY: (test) fork; the child makes only system calls (no
        // allocation, no lock) and leaves with _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: (test, child) lowering the child's own limit.
            unsafe { libc::setrlimit(libc::RLIMIT_FSIZE, &libc::rlimit { rlim_cur: 150, rlim_max: libc::RLIM_INFINITY }) };
            let fits = t.write_all(&[b'y'; 30]);
            let past = t.write_all(&[b'z'; 60]);
            let noted = SIZE_LIMIT_HIT.load(Relaxed) == 150;
            // 20 bytes of room: two whole lines of nine letters and a newline.
            let lines = t.write_lines(b"abcdefghi\nbcdefghij\ncdefghijk\n");
            // SAFETY: (test, child) leaving without running the parent's
            // exit handlers.
            unsafe { libc::_exit(fits as i32 | (past as i32) << 1 | (noted as i32) << 2 | (lines as i32) << 3) };
        }
        assert_eq!(exit_code_of(pid), 0b101, "written up to the limit, refused past it, the limit noted, not every line");
        let text = std::fs::read(&p).unwrap();
        assert_eq!(text.len(), 150, "nothing of the refused write, not even its first bytes; the lines that fit");
        assert!(text.ends_with(b"abcdefghi\nbcdefghij\n"), "{:?}", String::from_utf8_lossy(&text));
        let _ = std::fs::remove_file(&p);
    }

    /// The exit code of our child `pid`, once it has exited (not killed: a
    /// write past the file-size limit would have killed it with SIGXFSZ).
    fn exit_code_of(pid: libc::pid_t) -> i32 {
        let mut status = 0;
        // SAFETY: (test) waiting for our child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status), "the child was killed (SIGXFSZ?): status {status:#x}");
        libc::WEXITSTATUS(status)
    }

    /// A chunk of `tid`/`seq` holding `entries` ENTRY events.
    fn chunk(tid: u32, seq: u32, entries: u32) -> Vec<u8> {
        use ftramp_trace::format::{ChunkHeader, Event};
        let mut words = Vec::new();
        for func in 0..entries {
            Event::Entry { func, delta: 1 }.encode_into(&mut words);
        }
        let mut bytes = ChunkHeader { tid, seq, len: 8 * entries, ..Default::default() }.encode().to_vec();
        bytes.extend(words.iter().flat_map(|w| w.to_le_bytes()));
        bytes
    }

    /// The events of chunks whose write failed are placed in their thread's stream: in
    /// the `lost` of the thread's next chunk written (after the gap in `seq`), or, for a
    /// thread none of whose later chunks was written, in the `.info`'s `unwritten`.  In a
    /// child process, whose file-size limit makes the writes fail, then lets them through.
    #[test]
    fn the_events_of_unwritten_chunks_are_placed_in_their_threads_stream() {
        use ftramp_trace::format::{ChunkHeader, CHUNK_HEADER_SIZE};
        let (t, p, _) = installed("unwritten");
        let info = temp("unwritten.info");
        let info_file = std::fs::OpenOptions::new().append(true).create(true).open(&info).unwrap();
        let ti = TraceFile::new();
        ti.install(info_file.into_raw_fd(), &info);
        let first = chunk(7, 0, 2);
        // SAFETY: (test) fork; the child makes system calls and formats into fixed
        // buffers, and leaves with _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let limit = |n: u64| {
                // SAFETY: (test, child) setting the child's own soft limit.
                unsafe { libc::setrlimit(libc::RLIMIT_FSIZE, &libc::rlimit { rlim_cur: n, rlim_max: libc::RLIM_INFINITY }) }
            };
            // (Counters from before the fork are the parent's.)
            reset_failures();
            let ok = t.write_chunk(&first);
            limit(first.len() as u64);
            let refused = !t.write_chunk(&chunk(7, 1, 3)) && !t.write_chunk(&chunk(9, 0, 5)) && !t.write_chunk(&chunk(7, 2, 4));
            limit(libc::RLIM_INFINITY);
            let then = t.write_chunk(&chunk(7, 3, 1));
            write_unwritten(&ti);
            let failed = failed_events() == 12;
            // SAFETY: (test, child) leaving without the parent's exit handlers.
            unsafe { libc::_exit(ok as i32 | (refused as i32) << 1 | (then as i32) << 2 | (failed as i32) << 3) };
        }
        assert_eq!(exit_code_of(pid), 0b1111, "written, refused three times, written, 12 events failed");
        let bytes = std::fs::read(&p).unwrap();
        assert_eq!(bytes.len(), first.len() + CHUNK_HEADER_SIZE + 8, "the first chunk and the last: nothing of the others");
        assert_eq!(&bytes[..first.len()], &first[..]);
        let last = ChunkHeader::decode(bytes[first.len()..][..CHUNK_HEADER_SIZE].try_into().unwrap()).unwrap();
        assert_eq!((last.tid, last.seq, last.lost), (7, 3, 7), "tid 7's chunk after its gap carries the 3 + 4 events lost in it");
        assert_eq!(std::fs::read_to_string(&info).unwrap(), "unwritten = [[9, 1, 5]]\n", "tid 9 wrote nothing after its loss");
        let _ = std::fs::remove_file(&p);
        let _ = std::fs::remove_file(&info);
    }

    #[test]
    fn a_write_that_cannot_be_done_is_counted() {
        let (t, p, fd) = installed("gone");
        // SAFETY: (test) the program closes it, and the file is gone.
        unsafe { libc::close(fd) };
        std::fs::remove_file(&p).unwrap();
        let before = FAILED_WRITES.load(Relaxed);
        assert!(!t.write_all(b"lost\n"));
        assert_eq!(FAILED_WRITES.load(Relaxed), before + 1);
        assert_ne!(FIRST_ERRNO.load(Relaxed), 0);
    }
}
