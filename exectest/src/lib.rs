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
/// values, stack arguments.
pub mod abi {
    // SAFETY: `abi_run` takes a buffer of `ABI_OUT_MAX` bytes, which `run`
    // passes; `abi_clobber` only changes caller-saved registers, which every
    // call may.  The tracees are declared without their signatures (each
    // is different) only to take their addresses: they are never called
    // from Rust.
    unsafe extern "C" {
        fn abi_run(out: *mut u8) -> i32;
        /// Fills the caller-saved argument and return registers (integer
        /// and vector/FP) with a pattern, as a callback may.
        pub safe fn abi_clobber();
        fn abi_vsum();
        fn abi_vmix();
        fn abi_sret();
        fn abi_big_arg();
        fn abi_hfa_ret();
        fn abi_hfa_arg();
        fn abi_mixed_ret();
        fn abi_fpair_ret();
        fn abi_pair_ret();
        fn abi_i128();
        fn abi_cplx();
        fn abi_float();
        fn abi_stack_args();
        fn abi_tail();
        fn abi_tail_callee();
    }

    /// `ABI_OUT_MAX` of `abi.h`.
    const OUT_MAX: usize = 512;

    /// One run of the driver: the calls of tracees it made (one per
    /// tracee, `abi_vsum` twice) and every result's bytes.
    pub fn run() -> (i32, Vec<u8>) {
        let mut out = vec![0u8; OUT_MAX];
        // SAFETY: `out` has the OUT_MAX bytes abi_run may write.
        let calls = unsafe { abi_run(out.as_mut_ptr()) };
        assert!(calls > 0, "abi_run: results larger than its buffer");
        (calls, out)
    }

    /// Fails, naming the first differing byte and the result it falls in,
    /// unless a traced run's results (`got`) are the untraced ones.
    pub fn assert_same(want: &[u8], got: &[u8], what: &str) {
        if let Some(i) = want.iter().zip(got).position(|(a, b)| a != b) {
            // abi_run's calls in order, with their results' sizes (the
            // same on every 64-bit arch).
            const RESULTS: [(&str, usize); 15] = [
                ("abi_vsum(5, ...)", 8),
                ("abi_vsum(0)", 8),
                ("abi_vmix", 8),
                ("abi_sret", 48),
                ("abi_big_arg", 8),
                ("abi_hfa_ret", 32),
                ("abi_hfa_arg", 8),
                ("abi_mixed_ret", 16),
                ("abi_fpair_ret", 8),
                ("abi_pair_ret", 16),
                ("abi_i128", 16),
                ("abi_cplx", 16),
                ("abi_float", 4),
                ("abi_stack_args", 8),
                ("abi_tail (a sibling call)", 8),
            ];
            let mut at = 0;
            let (name, s, e) = RESULTS
                .iter()
                .find_map(|&(name, size)| {
                    at += size;
                    (i < at).then_some((name, at - size, at))
                })
                .unwrap_or(("(past the results)", i, i + 1));
            panic!("{what}: {name} returned other bytes than untraced:\n  want {:02x?}\n  got  {:02x?}", &want[s..e], &got[s..e]);
        }
    }

    /// The tracees' names and addresses.
    pub fn tracees() -> Vec<(&'static str, usize)> {
        macro_rules! named {
            ($($f:ident),*) => { vec![$((stringify!($f), $f as *const () as usize)),*] };
        }
        named!(abi_vsum, abi_vmix, abi_sret, abi_big_arg, abi_hfa_ret, abi_hfa_arg, abi_mixed_ret, abi_fpair_ret, abi_pair_ret, abi_i128, abi_cplx, abi_float, abi_stack_args, abi_tail, abi_tail_callee)
    }
}
