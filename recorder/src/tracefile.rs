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
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU64, Ordering::*};

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
        let fd = self.fd();
        let fits = fd < 0 || fits_size_limit(fd, bytes.len());
        let ok = fd >= 0 && fits && crate::pool::write_all(fd, bytes);
        if !ok {
            let e = if fits { std::io::Error::last_os_error().raw_os_error().unwrap_or(0) } else { libc::EFBIG };
            let _ = FIRST_ERRNO.compare_exchange(0, e, Relaxed, Relaxed);
            FAILED_WRITES.fetch_add(1, Relaxed);
            FAILED_BYTES.fetch_add(bytes.len() as u64, Relaxed);
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
    /// that cannot be written count as lost ([`failed_events`]).
    pub fn write_chunk(&self, chunk: &[u8]) -> bool {
        let ok = self.write_all(chunk);
        if !ok {
            let payload = chunk.get(ftramp_trace::format::CHUNK_HEADER_SIZE..).unwrap_or(&[]);
            FAILED_EVENTS.fetch_add(ftramp_trace::format::count_events(payload), Relaxed);
        }
        ok
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
        let mut status = 0;
        // SAFETY: (test) waiting for our child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status), "the child was killed (SIGXFSZ?): status {status:#x}");
        assert_eq!(libc::WEXITSTATUS(status), 0b101, "written up to the limit, refused past it, the limit noted, not every line");
        let text = std::fs::read(&p).unwrap();
        assert_eq!(text.len(), 150, "nothing of the refused write, not even its first bytes; the lines that fit");
        assert!(text.ends_with(b"abcdefghi\nbcdefghij\n"), "{:?}", String::from_utf8_lossy(&text));
        let _ = std::fs::remove_file(&p);
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
