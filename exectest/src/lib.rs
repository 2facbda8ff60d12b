//! The C side of the execution tests (see `tests/c/`).
#![allow(clippy::too_many_arguments)]

// SAFETY: these are the declarations of tests/c/{tracee,tracee_callsite,
// harness}.c, with their C signatures.  The tracees are plain C functions
// of integers and doubles with no preconditions, so they are declared
// `safe`; `arch_call_checked` calls an arbitrary address and stays unsafe.
unsafe extern "C" {
    pub safe fn tracee_args(a: i64, b: i64, c: i64, d: i64, e: i64, f: i64, g: i64, h: i64, x: f64, y: f64) -> i64;
    pub safe fn tracee_args_alt(a: i64, b: i64, c: i64, d: i64, e: i64, f: i64, g: i64, h: i64, x: f64, y: f64) -> i64;
    pub safe fn tracee_fp(x: f64, y: f64, n: i64) -> f64;
    pub safe fn tracee_two(a: i64, b: i64) -> i64;
    pub safe fn tracee_nested(n: i64) -> i64;
    pub safe fn tracee_callsite(a: i64, b: i64) -> i64;
    /// Calls `f(a, b)` with known values in every callee-saved register.
    pub fn arch_call_checked(f: usize, a: i64, b: i64, bad: *mut u64) -> i64;
    pub fn arch_sp_probe(ip: usize, parent: usize, op: usize, fregs: usize);
    pub safe fn arch_sp_mod() -> u64;
    pub static arch_probe_sp: u64;
    pub static arch_probe_calls: u64;
}

/// The untraced results, computed in Rust.
pub fn expect_args(a: [i64; 8], x: f64, y: f64) -> i64 {
    a.iter().enumerate().map(|(i, v)| (i as i64 + 1) * v).sum::<i64>() + (x * 10.0) as i64 + (y * 100.0) as i64
}

pub fn expect_nested(n: i64) -> i64 {
    if n <= 0 {
        1
    } else {
        expect_nested(n - 1) * 2 + n
    }
}

/// `dlopen`/`dlsym`/`dlclose` of a test library (built by build.rs).
pub struct Lib(*mut libc::c_void);

impl Lib {
    pub fn open(path: impl AsRef<std::path::Path>) -> Lib {
        let path = path.as_ref().to_str().unwrap();
        let c = std::ffi::CString::new(path).unwrap();
        // SAFETY: dlopen of a library built by build.rs (its constructors
        // are the C runtime's).
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!h.is_null(), "dlopen {path} failed");
        Lib(h)
    }

    pub fn sym(&self, name: &str) -> usize {
        let c = std::ffi::CString::new(name).unwrap();
        // SAFETY: `self.0` is a live handle.
        let p = unsafe { libc::dlsym(self.0, c.as_ptr()) };
        assert!(!p.is_null(), "dlsym {name}");
        p as usize
    }

    /// A function of the library taking and returning a long (all the
    /// test libraries' functions do).  Valid until [`Lib::close`].
    pub fn func(&self, name: &str) -> extern "C" fn(i64) -> i64 {
        // SAFETY: the test libraries' functions all take and return a long.
        unsafe { std::mem::transmute::<usize, extern "C" fn(i64) -> i64>(self.sym(name)) }
    }

    pub fn call(&self, name: &str, a: i64) -> i64 {
        self.func(name)(a)
    }

    pub fn close(self) {
        // SAFETY: `self.0` is a live handle, closed once; callers use
        // nothing of the library afterwards.
        assert_eq!(unsafe { libc::dlclose(self.0) }, 0);
    }
}

/// Installs `handler` for `sig` (with `SA_RESTART`); `None` ignores the
/// signal.
pub fn set_signal_handler(sig: i32, handler: Option<extern "C" fn(i32)>) {
    // SAFETY: a zeroed sigaction is valid; the tests' handlers touch only
    // atomics and traced C code.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler.map_or(libc::SIG_IGN, |h| h as *const () as usize);
        sa.sa_flags = libc::SA_RESTART;
        assert_eq!(libc::sigaction(sig, &sa, std::ptr::null_mut()), 0);
    }
}

/// Calls `handler` on SIGPROF every `us` µs of the process's CPU time
/// (the signal lands anywhere: traced bodies, trampolines, callbacks);
/// `None` stops the timer and ignores SIGPROF.
pub fn prof_timer(handler: Option<extern "C" fn(i32)>, us: i64) {
    let tv = libc::timeval { tv_sec: 0, tv_usec: if handler.is_some() { us as _ } else { 0 } };
    let t = libc::itimerval { it_interval: tv, it_value: tv };
    if handler.is_some() {
        set_signal_handler(libc::SIGPROF, handler);
    }
    // SAFETY: setitimer only reads the itimerval we pass.
    assert_eq!(unsafe { libc::setitimer(libc::ITIMER_PROF, &t, std::ptr::null_mut()) }, 0);
    if handler.is_none() {
        set_signal_handler(libc::SIGPROF, None);
    }
}

/// Runs `tests` (exact names) of the current test binary in a child
/// process with `env` set, one thread, and asserts that they all ran and
/// passed (for tests that read a once-per-process setting such as
/// `FTRAMP_SITE_ENTRY` or `FTRAMP_VECTOR_UPPER`).
pub fn run_tests_in_child(tests: &[&str], env: &[(&str, &str)]) {
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.arg("--exact").args(tests).args(["--nocapture", "--test-threads=1"]);
    cmd.envs(env.iter().copied());
    let out = cmd.output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the child ({env:?}) failed:\n{text}");
    assert!(text.contains(&format!("{} passed", tests.len())), "the child ran {tests:?}:\n{text}");
}

/// Threads that call traced functions until stopped, for the stress
/// tests: thread `t` runs `body(t, n)` for n = 0, 1, 2, … .
pub struct Callers {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<u64>>,
}

impl Callers {
    /// Starts `threads` callers.
    pub fn start(threads: i64, body: fn(i64, u64)) -> Callers {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let threads = (0..threads)
            .map(|t| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut n = 0;
                    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                        body(t, n);
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        Callers { stop, threads }
    }

    /// Stops and joins them: the calls of `body` made in all (a panic in
    /// one is the test's).
    pub fn stop(self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.threads.into_iter().map(|t| t.join().unwrap()).sum()
    }
}

/// The C calling-convention cases of `tests/c/tracee_abi.c`, called by
/// `tests/c/abi_driver.c` (see `tests/c/abi.h`): variadic calls, hidden
/// result pointers, float aggregates, mixed pairs, `__int128`, complex
/// values, stack arguments.  The driver lists the tracees and describes
/// the results it kept, so nothing here repeats them.
pub mod abi {
    use std::ffi::{c_char, c_int, c_ulong, CStr};

    /// `struct abi_result` of `abi.h`.
    #[repr(C)]
    struct AbiResult {
        call: *const c_char,
        offset: c_ulong,
        size: c_ulong,
    }

    /// `ABI_OUT_MAX` and `ABI_RESULTS_MAX` of `abi.h`.
    const OUT_MAX: usize = 512;
    const RESULTS_MAX: usize = 32;

    // SAFETY: the declarations of abi_driver.c with their C types.
    // `abi_run` takes a buffer of `ABI_OUT_MAX` bytes, which `run` passes;
    // `abi_clobber` only changes caller-saved registers, which every call
    // may.  The arrays are read as the comments at each read say.
    unsafe extern "C" {
        fn abi_run(out: *mut u8) -> i32;
        /// Fills the caller-saved argument and return registers (integer
        /// and vector/FP) with a pattern, as a callback may.
        pub safe fn abi_clobber();
        static abi_tracees: [usize; 0];
        static abi_results: [AbiResult; RESULTS_MAX];
        static abi_nresults: c_int;
    }

    /// One run of the driver: the calls of tracees it made (one per
    /// tracee, `abi_vsum` twice) and every result's bytes.
    pub fn run() -> (i32, Vec<u8>) {
        let mut out = vec![0u8; OUT_MAX];
        // SAFETY: `out` has the OUT_MAX bytes abi_run may write.
        let calls = unsafe { abi_run(out.as_mut_ptr()) };
        assert!(calls > 0, "abi_run: results larger than its buffer");
        (calls, out)
    }

    /// Fails, naming the first differing byte's result (the driver's call),
    /// unless a traced run's results (`got`) are the untraced ones.
    pub fn assert_same(want: &[u8], got: &[u8], what: &str) {
        let Some(i) = want.iter().zip(got).position(|(a, b)| a != b) else { return };
        // SAFETY: written by abi_run on this thread (the tests call it
        // from one thread at a time), read after it returned; the first
        // `abi_nresults` entries hold static strings.
        let (call, s, e) = unsafe {
            let n = (&raw const abi_nresults).read().clamp(0, RESULTS_MAX as c_int) as usize;
            std::slice::from_raw_parts(&raw const abi_results as *const AbiResult, n)
                .iter()
                .map(|r| (CStr::from_ptr(r.call).to_string_lossy().into_owned(), r.offset as usize, (r.offset + r.size) as usize))
                .find(|(_, s, e)| (*s..*e).contains(&i))
                .unwrap_or(("(past the results)".into(), i, i + 1))
        };
        panic!("{what}: {call} returned other bytes than untraced:\n  want {:02x?}\n  got  {:02x?}", &want[s..e], &got[s..e]);
    }

    /// The tracees' addresses.
    pub fn tracees() -> Vec<usize> {
        let first = &raw const abi_tracees as *const usize;
        // SAFETY: abi_tracees is a constant 0-terminated C array of
        // function addresses: read up to its 0.
        (0..).map(|i| unsafe { first.add(i).read() }).take_while(|&a| a != 0).collect()
    }
}
