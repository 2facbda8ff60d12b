//! JIT trampolines called from real patched C functions, for every variant.
//!
//! Each test patches the site of a C tracee (built with the arch's
//! patchable-entry flags) to call a generated trampoline and checks what
//! the tracer sees and what the caller gets back.  Runs natively on x86_64
//! and, cross-built, under qemu-user for the other arches.  Every test runs
//! with sites that `call` the trampolines (module `call`) and, where the
//! spec has stub entry (x86_64), with sites that jump to per-site stubs
//! (module `stub`; codegen `program.rs`, "Stub entry").

use ftramp_codegen::{arch, image::Image, DataWord, Dispatch, SiteEntry, Tier, Variant};
use ftramp_exectest::*;
use ftramp_runtime::{exec::CodeBlock, host_spec, patch, FtraceRegs, JitImage};
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Mutex, MutexGuard};

/// A function's address.
macro_rules! addr {
    ($f:expr) => {
        $f as *const () as usize
    };
}

type Func = unsafe extern "C" fn(usize, usize, *const TestOps, *mut FtraceRegs);

/// Our `struct ftrace_ops`: the callback must be the first word (callsite
/// dispatch calls `op->func`).
#[repr(C)]
struct TestOps {
    func: Func,
    tag: u64,
}

#[derive(Debug, Clone, Default)]
struct Seen {
    ip: usize,
    parent: usize,
    op: usize,
    args: Vec<u64>,
    fp: [f64; 2],
    sp: usize,
    /// The word at `sp` while the callback runs.
    stack_top: usize,
    resume: usize,
    callee_saved0: Option<u64>,
}

static SEEN: Mutex<Vec<Seen>> = Mutex::new(Vec::new());
static RETURNS: Mutex<Vec<(u64, f64)>> = Mutex::new(Vec::new());
static REDIRECT: AtomicUsize = AtomicUsize::new(0);
static HIJACK: AtomicBool = AtomicBool::new(false);
static RETURN_TO_HANDLER: AtomicUsize = AtomicUsize::new(0);
static SET_RET: AtomicI64 = AtomicI64::new(i64::MIN);
static SET_FP_RET: AtomicU64 = AtomicU64::new(0);
static LOCK: Mutex<()> = Mutex::new(());
/// The tracer and the return handler end by scrambling the caller-saved
/// registers ([`abi::abi_clobber`]).
static CLOBBER: AtomicBool = AtomicBool::new(false);
/// The fixture's site entry is [`SiteEntry::Stub`].
static STUB_ENTRY: AtomicBool = AtomicBool::new(false);

thread_local! {
    static SHADOW: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

/// # Safety
/// Only as the trampolines call it: `op` a live [`TestOps`], `fregs` the
/// calling trampoline's frame.
unsafe extern "C" fn tracer(ip: usize, parent: usize, op: *const TestOps, fregs: *mut FtraceRegs) {
    let fregs = &mut *fregs;
    let spec = host_spec();
    lock(&SEEN).push(Seen {
        ip,
        parent,
        op: op as usize,
        args: (0..spec.int_args.len()).map(|n| fregs.argument(n).unwrap()).collect(),
        fp: [fregs.fp_argument(0).unwrap(), fregs.fp_argument(1).unwrap()],
        sp: fregs.stack_pointer(),
        stack_top: *(fregs.stack_pointer() as *const usize),
        resume: fregs.instruction_pointer(),
        callee_saved0: fregs.register(&spec.raw.abi.callee_saved[0]),
    });
    let to = REDIRECT.load(SeqCst);
    if to != 0 {
        fregs.set_instruction_pointer(to);
    }
    if HIJACK.load(SeqCst) {
        SHADOW.with(|s| s.borrow_mut().push(fregs.return_address()));
        fregs.set_return_address(RETURN_TO_HANDLER.load(SeqCst));
    }
    if CLOBBER.load(SeqCst) {
        abi::abi_clobber();
    }
}

/// `ftrace_ops_list_func`: here a list of one.
///
/// # Safety
/// Only as the trampolines call it: `op` a live [`TestOps`], `fregs` the
/// calling trampoline's frame.
unsafe extern "C" fn list_func(ip: usize, parent: usize, op: *const TestOps, fregs: *mut FtraceRegs) {
    ((*op).func)(ip, parent, op, fregs)
}

/// `ftrace_return_to_handler`.
///
/// # Safety
/// Only as `return_to_handler` calls it: `fregs` its frame.
unsafe extern "C" fn ret_handler(fregs: *mut FtraceRegs) -> usize {
    let fregs = &mut *fregs;
    lock(&RETURNS).push((fregs.return_value(), fregs.fp_return_value().unwrap_or(f64::NAN)));
    let v = SET_RET.load(SeqCst);
    if v != i64::MIN {
        fregs.set_return_value(v as u64);
    }
    let f = SET_FP_RET.load(SeqCst);
    if f != 0 {
        fregs.set_fp_return_value(f64::from_bits(f));
    }
    if CLOBBER.load(SeqCst) {
        abi::abi_clobber();
    }
    SHADOW.with(|s| s.borrow_mut().pop().expect("a return we did not hijack"))
}

/// Locks a test global even after another test panicked holding it.
fn lock<T>(m: &'static Mutex<T>) -> MutexGuard<'static, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

struct Fixture {
    jit: JitImage,
    ops: Box<TestOps>,
    _guard: MutexGuard<'static, ()>,
}

/// Trampolines for sites that enter as `entry`; [`with_site`] patches the
/// sites to match (stub entry: a `jmp` to a stub made for the site).
fn fixture(entry: SiteEntry) -> Fixture {
    let guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    STUB_ENTRY.store(entry == SiteEntry::Stub, SeqCst);
    lock(&SEEN).clear();
    lock(&RETURNS).clear();
    REDIRECT.store(0, SeqCst);
    HIJACK.store(false, SeqCst);
    CLOBBER.store(false, SeqCst);
    SET_RET.store(i64::MIN, SeqCst);
    SET_FP_RET.store(0, SeqCst);
    let spec = host_spec();
    let image = Image::generate_for(spec, &Variant::ALL, entry).unwrap();
    let call_through = image.call_through();
    let jit = JitImage::install(image, Some(addr!(tracee_two)), spec.raw.site.reach).unwrap();
    if let Some(off) = call_through {
        // Stub entry: hijacked calls are entered through this image's
        // ftrace_call_through.
        assert!(jit.set_word(DataWord::GraphReturn, jit.entry(Variant::Return).unwrap()));
        assert!(jit.set_word(DataWord::GraphCall, jit.code_addr() + off));
    }
    let ops = Box::new(TestOps { func: tracer, tag: 0x0f7a_ce0f });
    let opp = &*ops as *const TestOps as usize;
    assert!(jit.set_word(DataWord::FunctionTraceOp, opp));
    assert!(jit.set_word(DataWord::ListFunc, addr!(list_func)));
    assert!(jit.set_word(DataWord::ReturnHandler, addr!(ret_handler)));
    assert!(jit.set_word(DataWord::DirectOp, opp));
    assert!(jit.set_word(DataWord::DirectFunc, addr!(tracer)));
    RETURN_TO_HANDLER.store(jit.entry(Variant::Return).unwrap(), SeqCst);
    Fixture { jit, ops, _guard: guard }
}

/// The patch site of a function: the first NOP form of the spec found in
/// its first bytes.
fn site_of(f: usize) -> usize {
    let spec = host_spec();
    let code = patch::read_text(f, 64);
    for off in 0..=(64 - spec.site_len) {
        if spec.nops.iter().any(|n| code[off..off + n.len()] == n[..]) {
            return f + off;
        }
    }
    panic!("no patch site in the first 64 bytes of {f:#x}: {code:02x?}");
}

/// Runs `body` with `f`'s site calling `target` (stub entry: jumping to a
/// stub that enters `target`); restores the NOPs after.
fn with_site<R>(f: usize, target: usize, body: impl FnOnce() -> R) -> R {
    let spec = host_spec();
    let site = site_of(f);
    let nops = patch::read_text(site, spec.site_len);
    let backend = arch::lookup(&spec.name).unwrap();
    let (call, _stub) = if STUB_ENTRY.load(SeqCst) {
        let stub = CodeBlock::install(site, 1 << 28, arch::STUB_LEN, |at| Ok(backend.site_stub(at as u64, site as u64, target as u64)?)).unwrap();
        (backend.site_jump(site as u64, stub.range().start as u64).unwrap(), Some(stub))
    } else {
        (backend.site_call(site as u64, target as u64).unwrap(), None)
    };
    assert_eq!(call.len(), spec.site_len);
    patch::replace_text(site, &nops, &call).unwrap();
    let r = body();
    patch::replace_text(site, &call, &nops).unwrap();
    r
}

/// [`with_site`] for several functions at once.
fn with_sites<R>(fs: &[usize], target: usize, body: &mut dyn FnMut() -> R) -> R {
    match fs.split_first() {
        None => body(),
        Some((f, rest)) => with_site(*f, target, || with_sites(rest, target, body)),
    }
}

fn entry_variants() -> impl Iterator<Item = Variant> {
    Variant::ALL.into_iter().filter(|v| *v != Variant::Return)
}

/// Places the ops pointer in the word before a callsite tracee.
fn set_callsite_ops(f: usize, ops: usize) {
    let spec = host_spec();
    let at = (site_of(f) as isize + spec.raw.site.callsite_ops_offset as isize) as usize;
    patch::write_text(at, &(ops as u64).to_ne_bytes()).unwrap();
}

/// What `arch_call_checked` loads into the first callee-saved register.
static CALLEE_SAVED0_PATTERN: std::sync::LazyLock<std::collections::HashMap<&'static str, u64>> = std::sync::LazyLock::new(|| {
    [("x86_64", 0x1111111111111101), ("aarch64", 0x1919191919191919), ("riscv64", 0x0808080808080808), ("s390x", 0x0707070707070707), ("ppc64le", 0x1414141414141414)].into_iter().collect()
});

const A: [i64; 8] = [1, -2, 3_000_000_000, 4, 5, -6, 7, 8];

fn the_tracer_sees_ip_parent_ops_and_every_argument(entry: SiteEntry) {
    let fx = fixture(entry);
    let spec = host_spec();
    let opp = &*fx.ops as *const TestOps as usize;
    for v in entry_variants().filter(|v| !matches!(v, Variant::Entry { dispatch: Dispatch::Callsite, .. })) {
        lock(&SEEN).clear();
        let f = addr!(tracee_args);
        let got = with_site(f, fx.jit.entry(v).unwrap(), || tracee_args(A[0], A[1], A[2], A[3], A[4], A[5], A[6], A[7], 1.5, 2.25));
        assert_eq!(got, expect_args(A, 1.5, 2.25), "{v}: result");
        let seen = lock(&SEEN).clone();
        assert_eq!(seen.len(), 1, "{v}: one callback");
        let s = &seen[0];
        assert_eq!(s.ip, site_of(f), "{v}: ip is the site");
        assert_eq!(s.resume, site_of(f) + spec.site_len, "{v}: resume after the site");
        assert_eq!(s.op, opp, "{v}: ops pointer");
        for (n, want) in A.iter().enumerate().take(spec.int_args.len()) {
            assert_eq!(s.args[n], *want as u64, "{v}: argument {n}");
        }
        assert_eq!(s.fp, [1.5, 2.25], "{v}: FP arguments");
        assert_ne!(s.parent, 0);
        // The traced function's sp at entry is where the ABI puts it (s390x
        // only promises 8-byte alignment).
        let align = spec.stack_alignment as u64;
        assert_eq!((s.sp as u64 + arch_sp_mod()) % align, 0, "{v}: sp {:#x}", s.sp);
        if spec.name == "x86_64" {
            // The traced function's sp points at its return address.
            assert_eq!(s.stack_top, s.parent, "{v}: sp");
        }
    }
}

fn callsite_dispatch_reads_the_ops_word_before_the_function(entry: SiteEntry) {
    let fx = fixture(entry);
    let opp = &*fx.ops as *const TestOps as usize;
    set_callsite_ops(addr!(tracee_callsite), opp);
    for tier in [Tier::Args, Tier::Regs] {
        lock(&SEEN).clear();
        let v = Variant::Entry { tier, dispatch: Dispatch::Callsite };
        let got = with_site(addr!(tracee_callsite), fx.jit.entry(v).unwrap(), || tracee_callsite(6, -4));
        assert_eq!(got, 6 * 7 - 4);
        let seen = lock(&SEEN).clone();
        assert_eq!(seen.len(), 1, "{v}");
        assert_eq!(seen[0].op, opp);
        assert_eq!(seen[0].ip, site_of(addr!(tracee_callsite)));
        assert_eq!(&seen[0].args[..2], &[6, (-4i64) as u64]);
    }
}

fn callee_saved_registers_and_the_parent_ip_are_right(entry: SiteEntry) {
    let fx = fixture(entry);
    let opp = &*fx.ops as *const TestOps as usize;
    set_callsite_ops(addr!(tracee_callsite), opp);
    for v in entry_variants() {
        lock(&SEEN).clear();
        let f = match v {
            Variant::Entry { dispatch: Dispatch::Callsite, .. } => addr!(tracee_callsite),
            _ => addr!(tracee_two),
        };
        let mut bad = u64::MAX;
        // SAFETY: the address is a C tracee of (long, long) -> long, as arch_call_checked requires.
        let got = with_site(f, fx.jit.entry(v).unwrap(), || unsafe { arch_call_checked(f, 12, 34, &mut bad) });
        let want = if f == addr!(tracee_two) { 12 * 1000 + 34 } else { 12 * 7 + 34 };
        assert_eq!(got, want, "{v}");
        assert_eq!(bad, 0, "{v}: callee-saved registers changed (mask {bad:#x})");
        let seen = lock(&SEEN).clone();
        let caller = addr!(arch_call_checked);
        assert!(seen[0].parent > caller && seen[0].parent < caller + 1024, "{v}: parent_ip {:#x} not in the caller at {caller:#x}", seen[0].parent);
        if let Variant::Entry { tier: Tier::Regs, .. } = v {
            // pt_regs has the caller's callee-saved values.
            let cs0 = seen[0].callee_saved0.expect("callee-saved register in pt_regs");
            assert_eq!(cs0, CALLEE_SAVED0_PATTERN[host_spec().name.as_str()], "{v}: pt_regs.{}", host_spec().raw.abi.callee_saved[0]);
        }
    }
}

fn callbacks_run_on_an_aligned_stack(entry: SiteEntry) {
    let fx = fixture(entry);
    let probe = addr!(arch_sp_probe);
    fx.jit.set_word(DataWord::DirectFunc, probe);
    // SAFETY: a global of the C harness, read as plain data; only C code on this thread writes it.
    let probe_ops = Box::new(TestOps { func: unsafe { std::mem::transmute::<usize, Func>(probe) }, tag: 1 });
    set_callsite_ops(addr!(tracee_callsite), &*probe_ops as *const TestOps as usize);
    for v in entry_variants().filter(|v| !matches!(v, Variant::Entry { dispatch: Dispatch::List, .. })) {
        let f = match v {
            Variant::Entry { dispatch: Dispatch::Callsite, .. } => addr!(tracee_callsite),
            _ => addr!(tracee_two),
        };
        // SAFETY: the address is a C tracee of (long, long) -> long, as arch_call_checked requires.
        let before = unsafe { std::ptr::read_volatile(&raw const arch_probe_calls) };
        let mut bad = 0;
        // SAFETY: the address is a C tracee of (long, long) -> long, as arch_call_checked requires.
        with_site(f, fx.jit.entry(v).unwrap(), || unsafe { arch_call_checked(f, 1, 2, &mut bad) });
        // SAFETY: a global of the C harness, read as plain data; only C code on this thread writes it.
        let after = unsafe { std::ptr::read_volatile(&raw const arch_probe_calls) };
        assert_eq!(after, before + 1, "{v}: the probe ran");
        // SAFETY: a global of the C harness, read as plain data; only C code on this thread writes it.
        let sp = unsafe { std::ptr::read_volatile(&raw const arch_probe_sp) };
        assert_eq!(sp % 16, arch_sp_mod(), "{v}: callback sp {sp:#x} misaligned");
    }
}

fn setting_the_ip_redirects_the_call(entry: SiteEntry) {
    let fx = fixture(entry);
    REDIRECT.store(addr!(tracee_args_alt), SeqCst);
    for v in entry_variants().filter(|v| !matches!(v, Variant::Entry { dispatch: Dispatch::Callsite, .. })) {
        let got = with_site(addr!(tracee_args), fx.jit.entry(v).unwrap(), || tracee_args(A[0], A[1], A[2], A[3], A[4], A[5], A[6], A[7], 1.5, 2.25));
        let want = -(A.iter().sum::<i64>()) - 3 - 1000;
        assert_eq!(got, want, "{v}: redirected to tracee_args_alt");
    }
}

/// Hijacked calls entered through `ftrace_call_through`, counted by the
/// probe of [`count_call_throughs`] while [`COUNTING_CALL_THROUGHS`].
static CALL_THROUGHS: AtomicU64 = AtomicU64::new(0);
static COUNTING_CALL_THROUGHS: AtomicBool = AtomicBool::new(false);

/// x86_64 stub entry: a probe put in front of `ftrace_call_through` (the
/// `GraphCall` word) that counts the hijacked calls entered through it,
/// then goes on to the real one.
#[cfg(target_arch = "x86_64")]
fn count_call_throughs(jit: &JitImage) -> CodeBlock {
    let real = jit.word(DataWord::GraphCall).unwrap() as u64;
    let counter = &raw const CALL_THROUGHS as usize;
    let probe = CodeBlock::install(counter, 1 << 28, 22, |at| {
        // lock inc qword [rip + counter] ; jmp [rip] ; .quad real
        let rel = (counter as i64 - (at as i64 + 8)) as i32;
        let mut c = vec![0xf0, 0x48, 0xff, 0x05];
        c.extend(rel.to_le_bytes());
        c.extend([0xff, 0x25, 0, 0, 0, 0]);
        c.extend(real.to_le_bytes());
        Ok(c)
    })
    .unwrap();
    CALL_THROUGHS.store(0, SeqCst);
    assert!(jit.set_word(DataWord::GraphCall, probe.range().start));
    COUNTING_CALL_THROUGHS.store(true, SeqCst);
    probe
}

fn call_throughs() -> Option<u64> {
    COUNTING_CALL_THROUGHS.load(SeqCst).then(|| CALL_THROUGHS.load(SeqCst))
}

fn returns_go_through_return_to_handler(entry: SiteEntry) {
    let fx = fixture(entry);
    HIJACK.store(true, SeqCst);
    COUNTING_CALL_THROUGHS.store(false, SeqCst);
    #[cfg(target_arch = "x86_64")]
    let _probe = (entry == SiteEntry::Stub).then(|| count_call_throughs(&fx.jit));
    let mut hijacked = 0;
    for v in entry_variants().filter(|v| !matches!(v, Variant::Entry { dispatch: Dispatch::Callsite, .. })) {
        lock(&RETURNS).clear();
        let e = fx.jit.entry(v).unwrap();
        let got = with_site(addr!(tracee_args), e, || tracee_args(A[0], A[1], A[2], A[3], A[4], A[5], A[6], A[7], 1.5, 2.25));
        assert_eq!(got, expect_args(A, 1.5, 2.25), "{v}");
        let got = with_site(addr!(tracee_fp), e, || tracee_fp(1.5, 4.0, 2));
        assert_eq!(got, 8.0, "{v}");
        let r = lock(&RETURNS).clone();
        assert_eq!(r.len(), 2, "{v}: both returns seen");
        assert_eq!(r[0].0, expect_args(A, 1.5, 2.25) as u64, "{v}: integer return value");
        assert_eq!(r[1].1, 8.0, "{v}: FP return value");
        // Callee-saved registers survive the exit trampoline too.
        let mut bad = u64::MAX;
        // SAFETY: the address is a C tracee of (long, long) -> long, as arch_call_checked requires.
        let got = with_site(addr!(tracee_two), e, || unsafe { arch_call_checked(addr!(tracee_two), 5, 6, &mut bad) });
        assert_eq!((got, bad), (5006, 0), "{v}");
        hijacked += 3;
        if let Some(n) = call_throughs() {
            // Stub entry: every hijacked call was entered with a `call`
            // from ftrace_call_through, not by a jump.
            assert_eq!(n, hijacked, "{v}: hijacked calls entered through ftrace_call_through");
        }
    }
    assert_eq!(call_throughs().is_some(), cfg!(target_arch = "x86_64") && entry == SiteEntry::Stub);
    SHADOW.with(|s| assert!(s.borrow().is_empty()));
}

fn the_return_handler_can_change_the_return_value(entry: SiteEntry) {
    let fx = fixture(entry);
    HIJACK.store(true, SeqCst);
    let e = fx.jit.entry(Variant::ALL[0]).unwrap();
    SET_RET.store(-42, SeqCst);
    assert_eq!(with_site(addr!(tracee_two), e, || tracee_two(1, 2)), -42);
    SET_RET.store(i64::MIN, SeqCst);
    SET_FP_RET.store(99.5f64.to_bits(), SeqCst);
    assert_eq!(with_site(addr!(tracee_fp), e, || tracee_fp(2.0, 3.0, 0)), 99.5);
}

fn nested_traced_calls_return_in_order(entry: SiteEntry) {
    let fx = fixture(entry);
    HIJACK.store(true, SeqCst);
    for v in [Variant::ALL[0], Variant::ALL[1], Variant::ALL[2]] {
        lock(&SEEN).clear();
        lock(&RETURNS).clear();
        let got = with_site(addr!(tracee_nested), fx.jit.entry(v).unwrap(), || tracee_nested(6));
        assert_eq!(got, expect_nested(6), "{v}");
        assert_eq!(lock(&SEEN).len(), 7, "{v}: entries");
        let rets: Vec<u64> = lock(&RETURNS).iter().map(|r| r.0).collect();
        let want: Vec<u64> = (0..=6).map(|n| expect_nested(n) as u64).collect();
        assert_eq!(rets, want, "{v}: innermost first");
    }
}

/// s390x: the trampolines save v0-v7 and the vector argument registers
/// v24-v31 at their full 16 bytes (a callback may clobber all of them), and
/// the regs tier restores the condition code.
#[cfg(target_arch = "s390x")]
#[test]
fn s390x_vector_registers_and_the_condition_code_survive() {
    extern "C" {
        fn arch_vec_tracee();
        fn arch_vec_call(f: usize) -> u64;
        fn arch_clobber();
        static arch_vec_pattern: [u8; 256];
        static arch_vec_seen: [u8; 256];
    }
    static CLOBBERS: AtomicUsize = AtomicUsize::new(0);
    unsafe extern "C" fn clobbering(_: usize, _: usize, _: *const TestOps, _: *mut FtraceRegs) {
        CLOBBERS.fetch_add(1, SeqCst);
        arch_clobber();
    }
    let fx = fixture(SiteEntry::Call);
    let ops = Box::new(TestOps { func: clobbering, tag: 3 });
    assert!(fx.jit.set_word(DataWord::FunctionTraceOp, &*ops as *const TestOps as usize));
    assert!(fx.jit.set_word(DataWord::DirectFunc, addr!(clobbering)));
    // SAFETY: a global of the C harness, read as plain data; only C code on this thread writes it.
    let pattern = unsafe { std::ptr::read_volatile(&raw const arch_vec_pattern) };
    // SAFETY: a global of the C harness, read as plain data; only C code on this thread writes it.
    let seen = || unsafe { std::ptr::read_volatile(&raw const arch_vec_seen) };
    // SAFETY: the harness calls its own tracee, whose address is passed, with its C signature.
    // (Untraced: the harness itself passes the registers and cc 2 through.)
    assert_eq!(unsafe { arch_vec_call(addr!(arch_vec_tracee)) }, 2);
    assert_eq!(seen(), pattern);
    for v in entry_variants().filter(|v| !matches!(v, Variant::Entry { dispatch: Dispatch::Callsite, .. })) {
        let before = CLOBBERS.load(SeqCst);
        // SAFETY: the harness calls its own tracee, whose address is passed, with its C signature.
        let cc = with_site(addr!(arch_vec_tracee), fx.jit.entry(v).unwrap(), || unsafe { arch_vec_call(addr!(arch_vec_tracee)) });
        assert_eq!(CLOBBERS.load(SeqCst), before + 1, "{v}: the clobbering callback ran");
        let got = seen();
        for (n, reg) in (0..8).chain(24..32).enumerate() {
            assert_eq!(got[n * 16..n * 16 + 16], pattern[n * 16..n * 16 + 16], "{v}: v{reg}");
        }
        if let Variant::Entry { tier: Tier::Regs, .. } = v {
            assert_eq!(cc, 2, "{v}: condition code");
        }
    }
}

/// `(tracer number, ops)` of each call of a [`numbered`] tracer, in order.
static ORDER: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

/// Tracer number `N`: notes itself, then records like [`tracer`].
///
/// # Safety
/// Only as the trampolines call it: `op` a live [`TestOps`], `fregs` the
/// calling trampoline's frame.
unsafe extern "C" fn numbered<const N: usize>(ip: usize, parent: usize, op: *const TestOps, fregs: *mut FtraceRegs) {
    lock(&ORDER).push((N, op as usize));
    tracer(ip, parent, op, fregs)
}

/// A multi trampoline (Linux would walk the ops list here) calls every
/// (func, op) pair of its words in order, all with the site's ip, the
/// parent ip and the same fregs; arguments, the result and callee-saved
/// registers come through as with one tracer.
fn a_multi_trampoline_calls_its_tracers_in_order_with_their_own_ops(entry: SiteEntry) {
    let _fx = fixture(entry);
    let spec = host_spec();
    let tiers = [Tier::Args, Tier::Regs];
    let variants: Vec<Variant> = tiers.iter().map(|t| Variant::multi(*t, 3).unwrap()).collect();
    let jit = JitImage::install(Image::generate_for(spec, &variants, entry).unwrap(), Some(addr!(tracee_two)), spec.raw.site.reach).unwrap();
    let funcs: [Func; 3] = [numbered::<1>, numbered::<2>, numbered::<3>];
    let ops: Vec<Box<TestOps>> = funcs.iter().zip(1..).map(|(f, tag)| Box::new(TestOps { func: *f, tag })).collect();
    let opp: Vec<usize> = ops.iter().map(|o| &**o as *const TestOps as usize).collect();
    for i in 0..3u8 {
        assert!(jit.set_word(DataWord::TracerOp(i), opp[i as usize]));
        assert!(jit.set_word(DataWord::TracerFunc(i), funcs[i as usize] as usize));
    }
    assert!(!jit.set_word(DataWord::TracerOp(3), 0), "a multi3 image has three pairs of words");
    let want_order: Vec<(usize, usize)> = (1..=3).zip(opp.iter().copied()).collect();

    for v in variants {
        // Every argument reaches every tracer; the result is intact.
        lock(&SEEN).clear();
        lock(&ORDER).clear();
        let f = addr!(tracee_args);
        let got = with_site(f, jit.entry(v).unwrap(), || tracee_args(A[0], A[1], A[2], A[3], A[4], A[5], A[6], A[7], 1.5, 2.25));
        assert_eq!(got, expect_args(A, 1.5, 2.25), "{v}: result");
        assert_eq!(*lock(&ORDER), want_order, "{v}: tracers 1, 2, 3, each with its own ops");
        let seen = lock(&SEEN).clone();
        assert_eq!(seen.len(), 3, "{v}");
        for (k, s) in seen.iter().enumerate() {
            assert_eq!(s.ip, site_of(f), "{v}: tracer {}: ip is the site", k + 1);
            assert_eq!(s.resume, site_of(f) + spec.site_len, "{v}: tracer {}: resume after the site", k + 1);
            assert_eq!(s.op, opp[k], "{v}: tracer {}: ops", k + 1);
            assert_eq!((s.parent, s.sp), (seen[0].parent, seen[0].sp), "{v}: tracer {}: the same parent and fregs.sp", k + 1);
            for (n, want) in A.iter().enumerate().take(spec.int_args.len()) {
                assert_eq!(s.args[n], *want as u64, "{v}: tracer {}: argument {n}", k + 1);
            }
            assert_eq!(s.fp, [1.5, 2.25], "{v}: tracer {}: FP arguments", k + 1);
        }
        assert_ne!(seen[0].parent, 0);

        // Callee-saved registers survive three callbacks; parent_ip is the caller.
        lock(&SEEN).clear();
        lock(&ORDER).clear();
        let mut bad = u64::MAX;
        // SAFETY: the address is a C tracee of (long, long) -> long, as arch_call_checked requires.
        let got = with_site(addr!(tracee_two), jit.entry(v).unwrap(), || unsafe { arch_call_checked(addr!(tracee_two), 12, 34, &mut bad) });
        assert_eq!((got, bad), (12 * 1000 + 34, 0), "{v}: result, callee-saved registers changed (mask {bad:#x})");
        assert_eq!(*lock(&ORDER), want_order, "{v}");
        let caller = addr!(arch_call_checked);
        for s in lock(&SEEN).iter() {
            assert!(s.parent > caller && s.parent < caller + 1024, "{v}: parent_ip {:#x} not in the caller at {caller:#x}", s.parent);
            if let Variant::Entry { tier: Tier::Regs, .. } = v {
                assert_eq!(s.callee_saved0, Some(CALLEE_SAVED0_PATTERN[spec.name.as_str()]), "{v}: pt_regs.{}", spec.raw.abi.callee_saved[0]);
            }
        }

        // The tracers share one fregs: the first one's redirect is seen by
        // the later ones (their `ip` argument stays the site) and taken.
        lock(&SEEN).clear();
        REDIRECT.store(addr!(tracee_args_alt), SeqCst);
        let got = with_site(f, jit.entry(v).unwrap(), || tracee_args(A[0], A[1], A[2], A[3], A[4], A[5], A[6], A[7], 1.5, 2.25));
        REDIRECT.store(0, SeqCst);
        assert_eq!(got, -(A.iter().sum::<i64>()) - 3 - 1000, "{v}: redirected to tracee_args_alt");
        let seen = lock(&SEEN).clone();
        assert_eq!(seen.len(), 3, "{v}");
        for s in &seen[1..] {
            assert_eq!((s.ip, s.resume), (site_of(f), addr!(tracee_args_alt)), "{v}: a later tracer");
        }

        // The last tracer runs on an aligned stack too.
        assert!(jit.set_word(DataWord::TracerFunc(2), addr!(arch_sp_probe)));
        // SAFETY: the address is a C tracee of (long, long) -> long, as arch_call_checked requires.
        let before = unsafe { std::ptr::read_volatile(&raw const arch_probe_calls) };
        let mut bad = 0;
        // SAFETY: the address is a C tracee of (long, long) -> long, as arch_call_checked requires.
        with_site(addr!(tracee_two), jit.entry(v).unwrap(), || unsafe { arch_call_checked(addr!(tracee_two), 1, 2, &mut bad) });
        // SAFETY: a global of the C harness, read as plain data; only C code on this thread writes it.
        assert_eq!(unsafe { std::ptr::read_volatile(&raw const arch_probe_calls) }, before + 1, "{v}: the probe ran");
        // SAFETY: a global of the C harness, read as plain data; only C code on this thread writes it.
        let sp = unsafe { std::ptr::read_volatile(&raw const arch_probe_sp) };
        assert_eq!(sp % 16, arch_sp_mod(), "{v}: third callback's sp {sp:#x} misaligned");
        assert!(jit.set_word(DataWord::TracerFunc(2), funcs[2] as usize));
    }
}

#[cfg(target_arch = "x86_64")]
mod flags {
    //! The regs tier restores the arithmetic flags, and a tracer's change
    //! to `pt_regs.flags` is what the code after the site sees.
    use super::*;

    extern "C" {
        fn arch_flags_tracee() -> u64;
        fn arch_call_with_flags(f: usize, flags: u64) -> u64;
    }

    static SET_FLAGS: AtomicU64 = AtomicU64::new(u64::MAX);
    static SEEN_FLAGS: AtomicU64 = AtomicU64::new(0);

    unsafe extern "C" fn flags_tracer(_ip: usize, _parent: usize, _op: *const TestOps, fregs: *mut FtraceRegs) {
        let fregs = &mut *fregs;
        SEEN_FLAGS.store(fregs.flags().unwrap(), SeqCst);
        let v = SET_FLAGS.load(SeqCst);
        if v != u64::MAX {
            fregs.set_flags(v);
        }
    }

    /// CF PF AF ZF SF OF.
    const ARITH: u64 = 0x1 | 0x4 | 0x10 | 0x40 | 0x80 | 0x800;

    #[test]
    fn the_regs_tier_restores_and_changes_the_arithmetic_flags() {
        for entry in [SiteEntry::Call, SiteEntry::Stub] {
            the_regs_tier_restores_and_changes_the_arithmetic_flags_in(entry);
        }
    }

    fn the_regs_tier_restores_and_changes_the_arithmetic_flags_in(entry: SiteEntry) {
        let fx = fixture(entry);
        fx.jit.set_word(DataWord::DirectFunc, addr!(flags_tracer));
        let f = addr!(arch_flags_tracee);
        let v = Variant::Entry { tier: Tier::Regs, dispatch: Dispatch::Direct };
        for want in [0x202 | 0x1 | 0x40 | 0x800, 0x202 | 0x80 | 0x4, 0x202, 0x202 | ARITH] {
            SET_FLAGS.store(u64::MAX, SeqCst);
            // SAFETY: the harness calls its own tracee, whose address is passed, with its C signature.
            let untraced = unsafe { arch_call_with_flags(f, want) };
            assert_eq!(untraced & ARITH, want & ARITH, "the harness itself");
            // SAFETY: the harness calls its own tracee, whose address is passed, with its C signature.
            let got = with_site(f, fx.jit.entry(v).unwrap(), || unsafe { arch_call_with_flags(f, want) });
            assert_eq!(SEEN_FLAGS.load(SeqCst) & ARITH, want & ARITH, "pt_regs.flags at entry ({want:#x})");
            assert_eq!(got & ARITH, want & ARITH, "flags after the site ({want:#x}, got {got:#x})");
            // A tracer's change takes effect.
            let other = (want ^ ARITH) & ARITH | 0x202;
            SET_FLAGS.store(other, SeqCst);
            // SAFETY: the harness calls its own tracee, whose address is passed, with its C signature.
            let got = with_site(f, fx.jit.entry(v).unwrap(), || unsafe { arch_call_with_flags(f, want) });
            assert_eq!(got & ARITH, other & ARITH, "changed flags ({other:#x}, got {got:#x})");
        }
        SET_FLAGS.store(u64::MAX, SeqCst);
    }
}

/// x86_64: gcc (`-fipa-stack-alignment`, on by default) may enter a leaf on
/// a 16-byte aligned rsp, which breaks the ABI's "8 mod 16" at entry; the
/// trampolines realign (`trampoline.realign_sp`), so callbacks and the
/// return handler still get an ABI-aligned stack.
#[cfg(target_arch = "x86_64")]
fn callbacks_get_an_aligned_stack_when_the_traced_function_did_not(entry: SiteEntry) {
    // SAFETY: the x86_64 harness's functions and data
    // (tests/c/arch/x86_64.h) with their C signatures; callers uphold what
    // each one needs (see the uses below).
    unsafe extern "C" {
        fn arch_call_misaligned(f: usize, a: i64, b: i64) -> i64;
        fn arch_ret_probe();
        static mut arch_ret_next: usize;
    }
    let fx = fixture(entry);
    let probe = addr!(arch_sp_probe);
    fx.jit.set_word(DataWord::DirectFunc, probe);
    for v in entry_variants().filter(|v| matches!(v, Variant::Entry { dispatch: Dispatch::Direct, .. })) {
        // SAFETY: a global of the C harness, read as plain data; only C code on this thread writes it.
        let before = unsafe { std::ptr::read_volatile(&raw const arch_probe_calls) };
        // SAFETY: tracee_two is a C function of (long, long) -> long.
        let got = with_site(addr!(tracee_two), fx.jit.entry(v).unwrap(), || unsafe { arch_call_misaligned(addr!(tracee_two), 3, 4) });
        assert_eq!(got, 3004, "{v}");
        // SAFETY: as above.
        let (after, sp) = unsafe { (std::ptr::read_volatile(&raw const arch_probe_calls), std::ptr::read_volatile(&raw const arch_probe_sp)) };
        assert_eq!(after, before + 1, "{v}: the probe ran");
        assert_eq!(sp % 16, arch_sp_mod(), "{v}: callback sp {sp:#x} misaligned after a misaligned entry");
    }
    // The return handler, behind a probe that records its sp.
    fx.jit.set_word(DataWord::DirectFunc, addr!(tracer));
    HIJACK.store(true, SeqCst);
    // SAFETY: written before the handler can run, by this thread only.
    unsafe { arch_ret_next = addr!(ret_handler) };
    assert!(fx.jit.set_word(DataWord::ReturnHandler, addr!(arch_ret_probe)));
    let v = Variant::Entry { tier: Tier::Args, dispatch: Dispatch::Direct };
    // SAFETY: a global of the C harness, read as plain data.
    let before = unsafe { std::ptr::read_volatile(&raw const arch_probe_calls) };
    // SAFETY: tracee_two is a C function of (long, long) -> long.
    let got = with_site(addr!(tracee_two), fx.jit.entry(v).unwrap(), || unsafe { arch_call_misaligned(addr!(tracee_two), 5, 6) });
    assert!(fx.jit.set_word(DataWord::ReturnHandler, addr!(ret_handler)));
    assert_eq!(got, 5006);
    // SAFETY: as above.
    let (after, sp) = unsafe { (std::ptr::read_volatile(&raw const arch_probe_calls), std::ptr::read_volatile(&raw const arch_probe_sp)) };
    assert_eq!(after, before + 1, "the return probe ran");
    assert_eq!(sp % 16, arch_sp_mod(), "return handler sp {sp:#x} misaligned after a misaligned entry");
}

/// The C calling-convention cases (`tests/c/tracee_abi.c`: variadic
/// calls, hidden result pointers, float aggregates, mixed pairs,
/// `__int128`, complex values, stack arguments) return the same bytes
/// traced as untraced, through every entry variant with the return
/// hijacked, while the tracer and the return handler scramble every
/// caller-saved argument and return register.
fn c_abi_cases_survive_clobbering_callbacks(entry: SiteEntry) {
    let fx = fixture(entry);
    let (calls, want) = abi::run();
    let fs = abi::tracees();
    HIJACK.store(true, SeqCst);
    CLOBBER.store(true, SeqCst);
    for v in entry_variants().filter(|v| !matches!(v, Variant::Entry { dispatch: Dispatch::Callsite, .. })) {
        lock(&SEEN).clear();
        lock(&RETURNS).clear();
        let (n, got) = with_sites(&fs, fx.jit.entry(v).unwrap(), &mut abi::run);
        assert_eq!((lock(&SEEN).len(), lock(&RETURNS).len()), (calls as usize, calls as usize), "{v}: every call traced");
        assert_eq!(n, calls, "{v}");
        abi::assert_same(&want, &got, &v.to_string());
    }
    CLOBBER.store(false, SeqCst);
    SHADOW.with(|s| assert!(s.borrow().is_empty()));
}

/// Each test with `call` sites and, where the spec has them, stub sites.
macro_rules! in_both_entries {
    ($($name:ident),* $(,)?) => {
        mod call {
            use super::*;
            $( #[test] fn $name() { super::$name(SiteEntry::Call) } )*
        }
        #[cfg(target_arch = "x86_64")]
        mod stub {
            use super::*;
            $( #[test] fn $name() { super::$name(SiteEntry::Stub) } )*
        }
    };
}

in_both_entries!(
    the_tracer_sees_ip_parent_ops_and_every_argument,
    callsite_dispatch_reads_the_ops_word_before_the_function,
    callee_saved_registers_and_the_parent_ip_are_right,
    callbacks_run_on_an_aligned_stack,
    setting_the_ip_redirects_the_call,
    returns_go_through_return_to_handler,
    the_return_handler_can_change_the_return_value,
    nested_traced_calls_return_in_order,
    a_multi_trampoline_calls_its_tracers_in_order_with_their_own_ops,
    c_abi_cases_survive_clobbering_callbacks
);

#[cfg(target_arch = "x86_64")]
mod x86_64_only {
    use super::*;
    in_both_entries!(callbacks_get_an_aligned_stack_when_the_traced_function_did_not);
}
