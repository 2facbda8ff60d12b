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
