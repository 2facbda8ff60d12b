//! Grace periods (runtime/src/grace.rs): synchronize waits for threads
//! inside dispatch or inside dispatch code, never for idle ones, gives up
//! (and quarantines) on threads that cannot answer, and survives stress.
//!
//! The tests share process-wide state (the signal, the quarantine, the
//! default timeout, and every thread of the process is signalled), so they
//! run one at a time.

use ftramp_runtime::grace::{self, DispatchGuard, GraceResult, StuckState};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicU8, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

/// Timeout of grace periods that must succeed: long, so a heavily loaded
/// machine (threads waiting seconds for a CPU) cannot fail them; a thread
/// that really blocked one would still be caught (the call would hang this
/// long and then return TimedOut).
const PATIENT: Duration = Duration::from_secs(60);

fn sync_ok(ranges: &[std::ops::Range<usize>]) -> GraceResult {
    grace::synchronize_timeout(ranges, PATIENT)
}

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn gettid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::syscall(libc::SYS_gettid) as i32 }
}

fn wait_for(flag: &AtomicBool) {
    while !flag.load(Acquire) {
        thread::yield_now();
    }
}

/// Sets `flag` after `delay`, from another thread.
fn release_after(flag: Arc<AtomicBool>, delay: Duration) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        thread::sleep(delay);
        flag.store(true, Release);
    })
}

/// Sets the flag when dropped, so helper threads stop even if the test
/// panics (they would otherwise keep later tests waiting).
struct StopOnDrop(Arc<AtomicBool>);
impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, SeqCst);
    }
}

/// Dropping it records that it was dropped.
struct DropFlag(Arc<AtomicBool>);
impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, SeqCst);
    }
}

#[test]
fn thread_inside_a_guard_blocks_synchronize_until_it_leaves() {
    let _s = serial();
    for sleeping in [false, true] {
        let (ready, release, left) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let holder = {
            let (ready, release, left) = (ready.clone(), release.clone(), left.clone());
            thread::spawn(move || {
                let g = DispatchGuard::enter();
                ready.store(true, Release);
                while !release.load(Acquire) {
                    if sleeping {
                        // In a system call with depth 1: the signal
                        // interrupts the sleep, the handler sees depth 1.
                        thread::sleep(Duration::from_millis(5));
                    } else {
                        std::hint::spin_loop();
                    }
                }
                left.store(true, SeqCst);
                drop(g);
            })
        };
        wait_for(&ready);
        let delay = Duration::from_millis(300);
        let releaser = release_after(release.clone(), delay);
        let t0 = Instant::now();
        let r = sync_ok(&[]);
        let took = t0.elapsed();
        assert_eq!(r, GraceResult::Ok, "sleeping={sleeping}");
        assert!(left.load(SeqCst), "synchronize returned while a thread was inside dispatch (sleeping={sleeping}, after {took:?})");
        assert!(took >= delay - Duration::from_millis(50), "returned after {took:?}");
        holder.join().unwrap();
        releaser.join().unwrap();
    }
}

// A loop whose every instruction lies in [grace_test_spin, grace_test_spin_end):
// it stores 1 to byte 0 of its argument, then spins until byte 1 is non-zero.
#[cfg(target_arch = "x86_64")]
std::arch::global_asm!(
    ".text",
    ".globl grace_test_spin",
    ".type grace_test_spin, @function",
    "grace_test_spin:",
    "mov byte ptr [rdi], 1",
    "2: pause",
    "cmp byte ptr [rdi + 1], 0",
    "je 2b",
    "ret",
    ".globl grace_test_spin_end",
    "grace_test_spin_end:",
    "ud2",
);
#[cfg(target_arch = "aarch64")]
std::arch::global_asm!(
    ".text",
    ".globl grace_test_spin",
    ".type grace_test_spin, %function",
    "grace_test_spin:",
    "mov w9, #1",
    "strb w9, [x0]",
    "2: yield",
    "ldrb w9, [x0, #1]",
    "cbz w9, 2b",
    "ret",
    ".globl grace_test_spin_end",
    "grace_test_spin_end:",
    "brk #0",
);
#[cfg(target_arch = "riscv64")]
std::arch::global_asm!(
    ".text",
    ".globl grace_test_spin",
    ".type grace_test_spin, @function",
    "grace_test_spin:",
    "li t0, 1",
    "sb t0, 0(a0)",
    "2: lbu t0, 1(a0)",
    "beqz t0, 2b",
    "ret",
    ".globl grace_test_spin_end",
    "grace_test_spin_end:",
    "unimp",
);
#[cfg(target_arch = "s390x")]
std::arch::global_asm!(
    ".text",
    ".globl grace_test_spin",
    ".type grace_test_spin, @function",
    "grace_test_spin:",
    "mvi 0(%r2), 1",
    "2: cli 1(%r2), 0",
    "je 2b",
    "br %r14",
    ".globl grace_test_spin_end",
    "grace_test_spin_end:",
    ".long 0",
);

type SpinFn = unsafe extern "C" fn(*const AtomicU8);

/// The spin routine and the range of its code.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64", target_arch = "riscv64", target_arch = "s390x"))]
fn spin_routine() -> (SpinFn, std::ops::Range<usize>) {
    extern "C" {
        fn grace_test_spin(flags: *const AtomicU8);
        fn grace_test_spin_end();
    }
    (grace_test_spin, grace_test_spin as *const () as usize..grace_test_spin_end as *const () as usize)
}

/// ppc64 has no stable `global_asm!`: the same routine, assembled with
/// powerpc64le-linux-gnu-as (`li 9,1; stb 9,0(3); 1: lbz 9,1(3);
/// cmpwi 9,0; beq 1b; blr`), copied into an executable page.
#[cfg(target_arch = "powerpc64")]
fn spin_routine() -> (SpinFn, std::ops::Range<usize>) {
    const CODE: [u32; 6] = [0x3920_0001, 0x9923_0000, 0x8923_0001, 0x2c09_0000, 0x4182_fff8, 0x4e80_0020];
    let len = std::mem::size_of_val(&CODE);
    // SAFETY: a fresh private mapping, written while read+write, then made
    // read+execute and flushed before its address is used; never unmapped.
    unsafe {
        let p = libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0);
        assert_ne!(p, libc::MAP_FAILED);
        std::ptr::copy_nonoverlapping(CODE.as_ptr() as *const u8, p as *mut u8, len);
        assert_eq!(libc::mprotect(p, 4096, libc::PROT_READ | libc::PROT_EXEC), 0);
        ftramp_runtime::cache::flush_icache(p as usize, len);
        (std::mem::transmute::<*mut libc::c_void, SpinFn>(p), p as usize..p as usize + len)
    }
}

#[test]
fn thread_with_its_pc_in_a_code_range_blocks_until_it_leaves() {
    let _s = serial();
    let (grace_test_spin, range) = spin_routine();
    assert!(range.start < range.end && range.end - range.start < 64, "{range:x?}");
    // [inside, stop]
    let flags: Arc<[AtomicU8; 2]> = Arc::new([AtomicU8::new(0), AtomicU8::new(0)]);
    let left = Arc::new(AtomicBool::new(false));
    let spinner = {
        let (flags, left) = (flags.clone(), left.clone());
        thread::spawn(move || {
            // SAFETY: the routine only stores to flags[0] and loads flags[1].
            unsafe { grace_test_spin(flags.as_ptr()) };
            left.store(true, SeqCst);
        })
    };
    while flags[0].load(Acquire) == 0 {
        thread::yield_now();
    }
    // Outside that range, the same thread does not block anything.
    let t0 = Instant::now();
    assert_eq!(grace::synchronize_timeout(&[], Duration::from_secs(10)), GraceResult::Ok);
    assert!(t0.elapsed() < Duration::from_secs(10));

    let stopper = thread::spawn({
        let flags = flags.clone();
        move || {
            thread::sleep(Duration::from_millis(300));
            flags[1].store(1, Release);
        }
    });
    let r = sync_ok(std::slice::from_ref(&range));
    assert_eq!(r, GraceResult::Ok);
    assert_eq!(flags[1].load(SeqCst), 1, "synchronize returned while a thread ran inside the code range");
    spinner.join().unwrap();
    stopper.join().unwrap();
    assert!(left.load(SeqCst));

    // Still inside after the timeout: TimedOut names it, busy, pc in range.
    let flags: Arc<[AtomicU8; 2]> = Arc::new([AtomicU8::new(0), AtomicU8::new(0)]);
    let tid = Arc::new(AtomicUsize::new(0));
    let spinner = {
        let (flags, tid) = (flags.clone(), tid.clone());
        thread::spawn(move || {
            tid.store(gettid() as usize, SeqCst);
            // SAFETY: as above.
            unsafe { grace_test_spin(flags.as_ptr()) };
        })
    };
    while flags[0].load(Acquire) == 0 {
        thread::yield_now();
    }
    match grace::synchronize_timeout(std::slice::from_ref(&range), Duration::from_millis(200)) {
        GraceResult::TimedOut { threads, .. } => {
            assert_eq!(threads.len(), 1, "{threads:?}");
            assert_eq!(threads[0].tid as usize, tid.load(SeqCst));
            match threads[0].state {
                StuckState::Busy { depth: 0, pc } => assert!(range.contains(&pc), "{pc:#x} not in {range:x?}"),
                s => panic!("{s:?}"),
            }
        }
        r => panic!("{r:?}"),
    }
    flags[1].store(1, Release);
    spinner.join().unwrap();
}

#[test]
fn idle_threads_do_not_block() {
    let _s = serial();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let rx = Arc::new(Mutex::new(rx));
    let mut idle = Vec::new();
    for _ in 0..4 {
        let rx = rx.clone();
        // Blocked in futex (the mutex or the channel).
        idle.push(thread::spawn(move || while rx.lock().unwrap().recv().is_ok() {}));
    }
    let sleeper = thread::spawn(|| thread::sleep(Duration::from_millis(1500)));
    thread::sleep(Duration::from_millis(50));
    let before = grace::stats();
    let t0 = Instant::now();
    for _ in 0..10 {
        assert_eq!(grace::synchronize_timeout(&[], Duration::from_secs(10)), GraceResult::Ok);
    }
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(10), "10 grace periods with idle threads took {took:?}");
    let after = grace::stats();
    assert!(after.signals_sent >= before.signals_sent + 10 * 5, "{before:?} -> {after:?}");
    drop(tx);
    for t in idle {
        t.join().unwrap();
    }
    sleeper.join().unwrap();
    eprintln!("10 grace periods with 5 idle threads: {:?} each; {after:?}", took / 10);
}

#[test]
fn a_thread_blocking_the_signal_times_out_and_quarantines() {
    let _s = serial();
    let sig = grace::signal_number().expect("a real-time signal for grace periods");
    let (ready, unblock) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let _unblock = StopOnDrop(unblock.clone());
    let tid = Arc::new(AtomicUsize::new(0));
    let blocker = {
        let (ready, unblock, tid) = (ready.clone(), unblock.clone(), tid.clone());
        thread::spawn(move || {
            // SAFETY: plain sigset manipulation and this thread's mask.
            unsafe {
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, sig);
                assert_eq!(libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()), 0);
                tid.store(gettid() as usize, SeqCst);
                ready.store(true, Release);
                wait_for(&unblock);
                assert_eq!(libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()), 0);
            }
        })
    };
    wait_for(&ready);
    let t0 = Instant::now();
    match grace::synchronize_timeout(&[], Duration::from_millis(200)) {
        GraceResult::TimedOut { threads, waited } => {
            assert_eq!(threads.len(), 1, "{threads:?}");
            assert_eq!(threads[0].tid as usize, tid.load(SeqCst));
            assert_eq!(threads[0].state, StuckState::NoAnswer);
            assert!(waited >= Duration::from_millis(200));
        }
        r => panic!("{r:?}"),
    }
    assert!(t0.elapsed() < Duration::from_secs(2));

    // defer_free keeps the object instead of freeing it...
    let old_timeout = grace::default_timeout();
    grace::set_default_timeout(Duration::from_millis(100));
    let dropped = Arc::new(AtomicBool::new(false));
    let q0 = grace::quarantine();
    let r = grace::defer_free(DropFlag(dropped.clone()), &[]);
    assert!(matches!(r, GraceResult::TimedOut { .. }), "{r:?}");
    assert!(!dropped.load(SeqCst), "freed although the grace period timed out");
    let q1 = grace::quarantine();
    assert_eq!(q1.pending, q0.pending + 1);
    assert_eq!(q1.quarantined_total, q0.quarantined_total + 1);
    // ... and a later grace period still times out, without flooding the
    // thread's signal queue (one signal stays pending).
    assert!(matches!(grace::reclaim(), GraceResult::TimedOut { .. }));
    assert!(!dropped.load(SeqCst));
    grace::set_default_timeout(old_timeout);

    // Once the thread answers, the next grace period frees it.
    unblock.store(true, Release);
    blocker.join().unwrap();
    assert_eq!(sync_ok(&[]), GraceResult::Ok);
    assert!(dropped.load(SeqCst), "the quarantined object was not freed by a successful grace period");
    let q2 = grace::quarantine();
    assert_eq!(q2.pending, 0);
    assert_eq!(q2.released_total, q1.released_total + 1);
}

#[test]
fn synchronize_inside_dispatch_is_refused_and_retire_defers() {
    let _s = serial();
    let dropped = Arc::new(AtomicBool::new(false));
    {
        let _g = DispatchGuard::enter();
        let _g2 = DispatchGuard::enter();
        assert_eq!(grace::synchronize(&[]), GraceResult::InsideDispatch { depth: 2 });
        let r = grace::defer_free(DropFlag(dropped.clone()), &[]);
        assert_eq!(r, GraceResult::InsideDispatch { depth: 2 });
        assert!(!dropped.load(SeqCst));
    }
    assert!(grace::quarantine().pending >= 1);
    assert_eq!(sync_ok(&[]), GraceResult::Ok);
    assert!(dropped.load(SeqCst));

    // retire() from a "callback" on another thread; freed by the next
    // grace period, not before.
    let dropped = Arc::new(AtomicBool::new(false));
    thread::scope(|s| {
        s.spawn(|| {
            let _g = DispatchGuard::enter();
            grace::retire(DropFlag(dropped.clone()), &[]);
        });
    });
    assert!(!dropped.load(SeqCst));
    assert_eq!(sync_ok(&[]), GraceResult::Ok);
    assert!(dropped.load(SeqCst));
}

#[test]
fn threads_that_exit_do_not_block() {
    let _s = serial();
    let stop = Arc::new(AtomicBool::new(false));
    let _stop = StopOnDrop(stop.clone());
    let spawner = {
        let stop = stop.clone();
        thread::spawn(move || {
            while !stop.load(Relaxed) {
                thread::spawn(|| {
                    let _g = DispatchGuard::enter();
                })
                .join()
                .unwrap();
            }
        })
    };
    for _ in 0..100 {
        assert_eq!(sync_ok(&[]), GraceResult::Ok);
    }
    stop.store(true, Relaxed);
    spawner.join().unwrap();
}

/// The object readers use; poisoned before it is freed.
struct Shared {
    value: AtomicU64,
}
const POISON: u64 = 0xdead_dead_dead_dead;

#[test]
fn stress_readers_in_guards_while_synchronizing_1000_times() {
    let _s = serial();
    static CURRENT: AtomicPtr<Shared> = AtomicPtr::new(std::ptr::null_mut());
    CURRENT.store(Box::into_raw(Box::new(Shared { value: AtomicU64::new(1) })), SeqCst);
    let stop = Arc::new(AtomicBool::new(false));
    let _stop = StopOnDrop(stop.clone());
    let bad = Arc::new(AtomicU64::new(0));
    let sections = Arc::new(AtomicU64::new(0));
    let tids = Arc::new(Mutex::new(Vec::new()));
    let readers: Vec<_> = (0..4)
        .map(|n| {
            let (stop, bad, sections, tids) = (stop.clone(), bad.clone(), sections.clone(), tids.clone());
            thread::spawn(move || {
                // SAFETY: gettid has no preconditions.
                tids.lock().unwrap().push(unsafe { libc::gettid() });
                let mut count = 0u64;
                while !stop.load(Relaxed) {
                    let g = DispatchGuard::enter();
                    let p = CURRENT.load(Acquire);
                    // SAFETY: objects are freed only after a grace period
                    // that began after they were unpublished; we are inside
                    // dispatch.
                    let s = unsafe { &*p };
                    let v = s.value.load(Relaxed);
                    // Stay a while, longer on some threads.
                    for _ in 0..(n * 50) {
                        std::hint::spin_loop();
                    }
                    let v2 = s.value.load(Relaxed);
                    if v == POISON || v2 != v {
                        bad.fetch_add(1, Relaxed);
                    }
                    drop(g);
                    count += 1;
                }
                sections.fetch_add(count, Relaxed);
            })
        })
        .collect();
    let before = grace::stats();
    let t0 = Instant::now();
    for i in 0..1000u64 {
        let new = Box::into_raw(Box::new(Shared { value: AtomicU64::new(i + 2) }));
        let old = CURRENT.swap(new, AcqRel);
        let r = sync_ok(&[]);
        assert_eq!(r, GraceResult::Ok, "iteration {i}");
        // SAFETY: `old` was unpublished before the grace period.
        unsafe {
            (*old).value.store(POISON, Relaxed);
            drop(Box::from_raw(old));
        }
    }
    let took = t0.elapsed();
    // Under qemu-user: none of the readers was ever taken for one of the
    // emulator's threads (and skipped) — which let a reader see a freed
    // object once in CI, when a reader waited for a CPU while qemu handed
    // it our signal.  (Natively the list is always empty.)
    let taken = grace::emulator_threads();
    let tids = tids.lock().unwrap().clone();
    assert!(!tids.iter().any(|t| taken.contains(t)), "readers {tids:?} taken for the emulator's threads {taken:?}");
    stop.store(true, Relaxed);
    for r in readers {
        r.join().unwrap();
    }
    let after = grace::stats();
    // SAFETY: no reader is left.
    drop(unsafe { Box::from_raw(CURRENT.swap(std::ptr::null_mut(), SeqCst)) });
    eprintln!(
        "1000 grace periods in {took:?} ({:?} each) while 4 readers ran {} sections; signals {}, busy answers {}, membarrier {:?}, emulator threads {:?}",
        took / 1000,
        sections.load(Relaxed),
        after.signals_sent - before.signals_sent,
        after.busy_answers - before.busy_answers,
        after.membarrier,
        taken,
    );
    assert_eq!(bad.load(Relaxed), 0, "a reader saw a freed (poisoned) object");
}
