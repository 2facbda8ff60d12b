//! README's "Building programs for tracing", checked: a C++ program built by
//! g++ and by clang++ with `ftramp cflags`, and a Rust program built by a
//! nightly rustc with `-Z patchable-function-entry`, recorded by `ftramp
//! record`. Each program counts its own calls (`calls <name> <n>`); the
//! trace must hold exactly that many entries of each counted function, and
//! as many exits less the calls an exception unwound (`unwound <name> <n>`:
//! those never return); other functions, e.g. template instances of the
//! standard library, may be traced too. The C++ program throws through two
//! traced frames and must catch exactly as without tracing. A missing
//! compiler skips its case with a message.

#![cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]

use ftramp_trace::read::{demangle, EventKind, Trace};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

const CXX: &str = r#"
#include <atomic>
#include <cstdio>
#include <stdexcept>
#include <vector>
#define FUNC __attribute__((noinline))

static std::atomic<unsigned long> n_ctor, n_area, n_twice, n_total, n_thrower, n_middle, n_thrown;

struct Shape {
    virtual ~Shape() {}
    virtual double area() const = 0;
};

struct Square : Shape {
    double side;
    FUNC explicit Square(double s) : side(s) { n_ctor++; }
    FUNC double area() const override { n_area++; return side * side; }
};

template <typename T> FUNC T twice(T x) { n_twice++; return x + x; }

FUNC double total(const std::vector<Shape *> &shapes)
{
    n_total++;
    double t = 0;
    for (const Shape *s : shapes)
        t += twice(s->area());
    return t;
}

/* Every fourth call throws through middle to main's catch. */
FUNC int thrower(int x)
{
    n_thrower++;
    if (x % 4 == 3) {
        n_thrown++;
        throw std::runtime_error("three");
    }
    return x;
}

FUNC int middle(int x) { n_middle++; return thrower(x) + 1; }

int main()
{
    int caught = 0, sum = 0;
    for (int i = 0; i < 10; i++) {
        try {
            sum += middle(i);
        } catch (const std::runtime_error &) {
            caught++;
        }
    }
    std::printf("caught %d sum %d\n", caught, sum);
    std::vector<Shape *> shapes;
    for (int i = 0; i < 5; i++)
        shapes.push_back(new Square(i));
    double t = 0;
    for (int r = 0; r < 3; r++)
        t += total(shapes);
    for (Shape *s : shapes)
        delete s;
    std::printf("total %g\n", t);
    std::printf("calls main 1\ncalls Square::Square %lu\ncalls Square::area %lu\n", n_ctor.load(), n_area.load());
    std::printf("calls twice<double> %lu\ncalls total %lu\n", n_twice.load(), n_total.load());
    std::printf("calls thrower %lu\ncalls middle %lu\n", n_thrower.load(), n_middle.load());
    /* The calls an exception left never return: no exit is recorded for them. */
    std::printf("unwound thrower %lu\nunwound middle %lu\n", n_thrown.load(), n_thrown.load());
    return 0;
}
"#;

const RUST: &str = r#"
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

static INNER: AtomicU64 = AtomicU64::new(0);
static OUTER: AtomicU64 = AtomicU64::new(0);

#[inline(never)]
fn inner(x: u64) -> u64 {
    INNER.fetch_add(1, Relaxed);
    black_box(x) * 3
}

#[inline(never)]
fn outer(x: u64) -> u64 {
    OUTER.fetch_add(1, Relaxed);
    inner(x) + inner(x + 1)
}

fn main() {
    let mut s = 0;
    for i in 0..black_box(7) {
        s += outer(i);
    }
    println!("sum {s}");
    println!("calls prog::outer {}", OUTER.load(Relaxed));
    println!("calls prog::inner {}", INNER.load(Relaxed));
}
"#;

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ftramp-build-flags-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn runs(prog: &str, args: &[&str]) -> bool {
    Command::new(prog)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// `ftramp cflags` for this machine.
fn cflags() -> Vec<String> {
    cflags_for("gcc")
}

/// `ftramp cflags --cc COMPILER` for this machine.
fn cflags_for(compiler: &str) -> Vec<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_ftramp"))
        .args(["cflags", "-a", std::env::consts::ARCH, "--cc", compiler])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(String::from)
        .collect()
}

fn compile(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What a recorded run holds: the program's own `calls` and `unwound`
/// counts, and the trace's entries and exits, per (demangled) name.
struct Recorded {
    calls: BTreeMap<String, u64>,
    unwound: BTreeMap<String, u64>,
    entries: BTreeMap<String, u64>,
    exits: BTreeMap<String, u64>,
    stdout: String,
}

/// Records `exe` with `ftramp record OPTS`.
fn record(dir: &Path, exe: &Path, opts: &[&str]) -> Recorded {
    let trace_dir = dir.join("trace");
    let out = Command::new(env!("CARGO_BIN_EXE_ftramp"))
        .arg("record")
        .arg("-o")
        .arg(&trace_dir)
        .args(opts)
        .arg("--")
        .arg(exe)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ftramp record failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let counts = |prefix: &str| -> BTreeMap<String, u64> {
        stdout
            .lines()
            .filter_map(|l| {
                let (name, n) = l.strip_prefix(prefix)?.rsplit_once(' ')?;
                Some((name.to_string(), n.parse().ok()?))
            })
            .collect()
    };
    let (want, unwound) = (counts("calls "), counts("unwound "));
    assert!(
        !want.is_empty(),
        "the program printed no counts:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let trace = Trace::open(&trace_dir).expect("the trace opens");
    assert!(trace.problems.is_empty(), "{:?}", trace.problems);
    let (mut entries, mut exits) = (BTreeMap::new(), BTreeMap::new());
    for p in &trace.processes {
        assert_eq!(p.lost, 0);
        for t in &p.threads {
            for e in &t.events {
                let raw = p.func_name(e.func);
                let name = demangle(&raw).unwrap_or(raw);
                let m = if e.kind == EventKind::Entry {
                    &mut entries
                } else {
                    &mut exits
                };
                *m.entry(name).or_insert(0) += 1;
            }
        }
    }
    Recorded {
        calls: want,
        unwound,
        entries,
        exits,
        stdout,
    }
}

/// Records `exe` with `ftramp record OPTS` and checks the counts of the
/// functions `selected` (all the program counts, without filters).
fn check(dir: &Path, exe: &Path, opts: &[&str], selected: impl Fn(&str) -> bool) -> String {
    let r = record(dir, exe, opts);
    if !opts.is_empty() {
        let outside: Vec<_> = r.entries.keys().filter(|n| !selected(n)).collect();
        assert!(outside.is_empty(), "{opts:?} recorded functions outside the filters: {outside:?}");
    }
    for (name, n) in r.calls.iter().filter(|(name, _)| selected(name)) {
        assert_eq!(
            r.entries.get(name),
            Some(n),
            "entries of {name}; traced: {:?}",
            r.entries
        );
        let returned = n - r.unwound.get(name).copied().unwrap_or(0);
        assert_eq!(
            r.exits.get(name).copied().unwrap_or(0),
            returned,
            "exits of {name}; traced: {:?}",
            r.exits
        );
    }
    r.stdout
}

#[test]
fn cxx_built_by_gxx_and_clangxx_is_traced() {
    let mut tested = 0;
    for cxx in ["g++", "clang++-14"] {
        if !runs(cxx, &["--version"]) {
            assert!(std::env::var_os("CI").is_none_or(|v| v != "true"), "CI needs {cxx}");
            eprintln!("skipped: {cxx} is not installed");
            continue;
        }
        let dir = scratch(cxx);
        std::fs::write(dir.join("prog.cpp"), CXX).unwrap();
        // (For clang, `--cc` leaves out gcc's -fno-ipa-ra.)
        let flags = cflags_for(cxx);
        assert_eq!(flags.iter().any(|f| f == "-fno-ipa-ra"), !cxx.starts_with("clang"), "{cxx}: {flags:?}");
        let exe = dir.join("prog");
        compile(
            Command::new(cxx)
                .arg("-O2")
                .args(&flags)
                .arg("-o")
                .arg(&exe)
                .arg(dir.join("prog.cpp")),
        );
        let out = check(&dir, &exe, &[], |_| true);
        // 3 and 7 throw; the other 8 calls return x + 1: 55 - 4 - 8.
        assert!(
            out.contains("caught 2 sum 43"),
            "{cxx}: the exceptions went astray under tracing:\n{out}"
        );
        // Filters name functions as replay shows them (demangled, without
        // parameters): a namespace glob, a template instance, and a plain
        // name whose symbol is mangled (`_Z5totalRKSt6vector...`).
        let opts = ["-F", "Square::*", "-F", "twice<*", "-F", "total", "-N", "Square::~*"];
        let selected = |n: &str| (n.starts_with("Square::") && !n.starts_with("Square::~")) || n.starts_with("twice<") || n == "total";
        check(&dir, &exe, &opts, selected);
        let _ = std::fs::remove_dir_all(&dir);
        tested += 1;
    }
    if tested == 0 {
        eprintln!("skipped: no C++ compiler");
    }
}

/// A C++ program on Boost.Context fibers: generators whose traced functions
/// switch stacks from two calls down, exceptions thrown and caught on a
/// fiber's stack.  Boost switches with its own assembly (`jump_fcontext`,
/// `ontop_fcontext`), which the runtime hooks as it does `swapcontext`: a
/// frame active at a switch gets no exit (the program counts those as
/// `unwound`), every other call returns as recorded.  Before the
/// twenty-sixth session the first switch back ended the program ("a
/// hijacked return found no shadow-stack frame").
const BOOST_FIBERS: &str = r#"
#include <boost/context/fiber.hpp>
#include <cstdio>
#include <stdexcept>
namespace ctx = boost::context;
#define FUNC __attribute__((noinline))

static unsigned long n_leaf, n_deep, n_produce, n_thrower, n_thrown, n_catcher, n_consume, n_main;

FUNC int leaf(int x) { n_leaf++; return x * 2 + 1; }

/* Switches back to main from two traced calls down (produce -> deep). */
FUNC ctx::fiber deep(ctx::fiber &&sink, int i)
{
    n_deep++;
    leaf(i);
    return std::move(sink).resume();
}

FUNC ctx::fiber produce(ctx::fiber &&sink)
{
    n_produce++;
    for (int i = 0; i < 5; i++)
        sink = deep(std::move(sink), i);
    return std::move(sink);
}

FUNC int thrower(int x)
{
    n_thrower++;
    if (x % 2) {
        n_thrown++;
        throw std::runtime_error("odd");
    }
    return leaf(x);
}

FUNC int catcher(int x)
{
    n_catcher++;
    try {
        return thrower(x);
    } catch (const std::exception &) {
        return -1;
    }
}

FUNC int consume(int i) { n_consume++; return leaf(i) + catcher(i); }

int main()
{
    n_main++;
    int sum = 0, caught = 0;
    ctx::fiber f{[](ctx::fiber &&sink) { return produce(std::move(sink)); }};
    for (int i = 0; i < 6; i++) {
        f = std::move(f).resume();
        sum += consume(i);
    }
    ctx::fiber g{[&caught](ctx::fiber &&sink) {
        for (int i = 0; i < 4; i++)
            caught += catcher(i) < 0;
        return std::move(sink);
    }};
    g = std::move(g).resume();
    std::printf("sum %d caught %d\n", sum, caught);
    std::printf("calls leaf %lu\ncalls deep %lu\ncalls produce %lu\ncalls thrower %lu\n", n_leaf, n_deep, n_produce, n_thrower);
    std::printf("calls catcher %lu\ncalls consume %lu\ncalls main %lu\n", n_catcher, n_consume, n_main);
    /* Active at a switch: every deep, produce, and main (it resumes). */
    std::printf("unwound deep %lu\nunwound produce %lu\nunwound main %lu\nunwound thrower %lu\n", n_deep, n_produce, n_main, n_thrown);
    return 0;
}
"#;

/// Exceptions thrown and caught through traced frames after the thread-local destructors
/// have run — a thread's two `thread_local` destructors and then its pthread key
/// destructor, the main thread's `thread_local` destructor, an `atexit` handler and a static
/// destructor at `exit()` — and `posix_spawn` from those last two (the recorder's exec
/// interposer, handed an environment without the recording's variables).
const EXIT_THROWS: &str = r#"
#include <cstdio>
#include <cstdlib>
#include <pthread.h>
#include <spawn.h>
#include <stdexcept>
#include <sys/wait.h>
#include <thread>
extern char **environ;
static long thrower_calls, unwound, caught;
__attribute__((noinline)) void thrower(int n) {
    thrower_calls++;
    unwound++;
    if (n == 0)
        throw std::runtime_error("x");
    thrower(n - 1);
    asm volatile("" ::: "memory"); // not a tail call: a frame per level
}
__attribute__((noinline)) void throw_and_catch(const char *where) {
    try {
        thrower(3);
    } catch (const std::exception &) {
        caught++;
        printf("caught in %s\n", where);
    }
}
__attribute__((noinline)) void spawn_true(const char *where) {
    pid_t pid;
    char *argv[] = {(char *)"true", nullptr};
    // An environment of its own: the recorder adds its variables to it.
    char *envp[] = {getenv("PATH") - 5 /* its "PATH=..." */, (char *)"LANG=C", nullptr};
    int st = -1;
    if (posix_spawnp(&pid, "true", nullptr, nullptr, argv, envp) == 0)
        waitpid(pid, &st, 0);
    printf("spawned in %s: %d\n", where, st);
}
struct Tl {
    const char *name;
    ~Tl() { throw_and_catch(name); }
};
static pthread_key_t key;
static void key_dtor(void *) { throw_and_catch("a key destructor"); }
static void body() {
    thread_local Tl a{"the first thread_local"};
    thread_local Tl b{"the second thread_local"};
    (void)&a;
    (void)&b;
    pthread_setspecific(key, &key);
    throw_and_catch("a thread");
}
struct Last {
    ~Last() {
        throw_and_catch("a static destructor");
        spawn_true("a static destructor");
        printf("calls thrower %ld\nunwound thrower %ld\ncaught %ld\n", thrower_calls, unwound, caught);
    }
} last;
static void at_exit() {
    throw_and_catch("an atexit handler");
    spawn_true("an atexit handler");
}
int main() {
    pthread_key_create(&key, key_dtor);
    atexit(at_exit);
    std::thread(body).join();
    throw_and_catch("main");
    spawn_true("main");
    thread_local Tl m{"main's thread_local"};
    (void)&m;
    return 0;
}
"#;

/// [`EXIT_THROWS`] built by g++ with `flags` in scratch directory `name`, and its
/// untraced run (successful); `None` (skipped, said) without g++ outside CI.
fn build_exit_throws(name: &str, flags: &[&str]) -> Option<(PathBuf, PathBuf, std::process::Output)> {
    let cxx = "g++";
    if !runs(cxx, &["--version"]) {
        assert!(std::env::var_os("CI").is_none_or(|v| v != "true"), "CI needs g++");
        eprintln!("skipped: needs g++");
        return None;
    }
    let dir = scratch(name);
    std::fs::write(dir.join("prog.cpp"), EXIT_THROWS).unwrap();
    let exe = dir.join("prog");
    compile(Command::new(cxx).arg("-O2").args(cflags_for(cxx)).args(flags).arg("-o").arg(&exe).arg(dir.join("prog.cpp")).arg("-pthread"));
    let untraced = Command::new(&exe).output().unwrap();
    assert!(untraced.status.success());
    Some((dir, exe, untraced))
}

/// [`EXIT_THROWS`] behaves as untraced under function_graph, with the exact counts.
/// Until the twenty-seventh session the unwinder hooks' per-thread state had a
/// destructor: once the thread-local destructors had run, the hooks did nothing and each
/// of these throws ended in `std::terminate`; and the recorder's exec interposer panicked
/// in `posix_spawn` at `exit()` (its environment cache was a destroyed thread-local).
#[test]
fn exceptions_and_spawns_after_the_thread_local_destructors() {
    let Some((dir, exe, untraced)) = build_exit_throws("exit-throws", &[]) else { return };
    let want = String::from_utf8_lossy(&untraced.stdout);
    assert!(want.contains("caught 8\n") && want.contains("spawned in a static destructor: 0"), "{want}");
    let out = check(&dir, &exe, &[], |n| n == "thrower");
    assert_eq!(out, want, "the program's output as untraced");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A program linked with its own copy of the unwinder (`-static-libgcc`) throws with no
/// GOT slot for the unwinder hooks: under function_graph its first exception through a
/// hijacked return ended it in `std::terminate` (until the twenty-seventh session).  Its
/// functions are now left untraced, with a warning, and it runs as untraced; `-t function`
/// records them.
#[test]
fn a_program_with_its_own_unwinder_runs_as_untraced() {
    let Some((dir, exe, untraced)) = build_exit_throws("own-unwinder", &["-static-libstdc++", "-static-libgcc"]) else { return };
    for tracer in ["function_graph", "function"] {
        let o = Command::new(env!("CARGO_BIN_EXE_ftramp"))
            .args(["record", "-q", "-t", tracer, "-o"])
            .arg(dir.join(tracer))
            .arg("--")
            .arg(&exe)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{tracer}: {err}");
        assert_eq!(o.stdout, untraced.stdout, "{tracer}: {err}");
        let warned = err.contains("it has its own copy of the unwinder") && err.contains("its functions are not traced");
        assert_eq!(warned, tracer == "function_graph", "{tracer}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A plugin linked with its own copy of the unwinder: each `plugin_run` throws through
/// three of its own frames and catches.
const OWN_UNWINDER_PLUGIN: &str = r#"
#include <stdexcept>
static int depth_calls;
__attribute__((noinline)) static int plugin_dive(int d) {
    depth_calls++;
    if (d == 0) throw std::runtime_error("bottom");
    return plugin_dive(d - 1) + 1;
}
extern "C" int plugin_run(int n) {
    try {
        return plugin_dive(n);
    } catch (const std::exception &e) {
        return depth_calls;
    }
}
"#;

/// A C program that `dlopen`s [`OWN_UNWINDER_PLUGIN`] and counts its own calls.
const OWN_UNWINDER_HOST: &str = r#"
#include <dlfcn.h>
#include <stdio.h>
static int calls;
__attribute__((noinline)) int main_call_plugin(int (*run)(int), int i) {
    calls++;
    return run(i % 4);
}
int main(int argc, char **argv) {
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) { printf("dlopen: %s\n", dlerror()); return 1; }
    int (*run)(int) = (int (*)(int))dlsym(h, "plugin_run");
    long sum = 0;
    for (int i = 0; i < 12; i++) sum += main_call_plugin(run, i);
    printf("sum %ld\n", sum);
    printf("calls main_call_plugin %d\n", calls);
    return 0;
}
"#;

/// The same for a library linked with its own unwinder that the program `dlopen`s: fgraph
/// leaves its functions untraced (`Ops::traces`), the program's own are traced.  Until the
/// twenty-eighth session only modules loaded at start were left out, and this program's
/// first exception through the plugin's hijacked returns ended it in `std::terminate`.
#[test]
fn a_dlopened_library_with_its_own_unwinder_runs_as_untraced() {
    let cxx = "g++";
    if !runs(cxx, &["--version"]) {
        assert!(std::env::var_os("CI").is_none_or(|v| v != "true"), "CI needs g++");
        eprintln!("skipped: needs g++");
        return;
    }
    let dir = scratch("own-unwinder-plugin");
    std::fs::write(dir.join("plugin.cpp"), OWN_UNWINDER_PLUGIN).unwrap();
    std::fs::write(dir.join("host.c"), OWN_UNWINDER_HOST).unwrap();
    let (plugin, exe) = (dir.join("plugin.so"), dir.join("host"));
    compile(Command::new(cxx).args(["-O1", "-shared", "-fPIC", "-static-libstdc++", "-static-libgcc"]).args(cflags_for(cxx)).arg("-o").arg(&plugin).arg(dir.join("plugin.cpp")));
    compile(Command::new("gcc").arg("-O1").args(cflags()).arg("-o").arg(&exe).arg(dir.join("host.c")).arg("-ldl"));
    let untraced = Command::new(&exe).arg(&plugin).output().unwrap();
    assert!(untraced.status.success() && String::from_utf8_lossy(&untraced.stdout).contains("calls main_call_plugin 12"));
    let trace_dir = dir.join("trace");
    let o = Command::new(env!("CARGO_BIN_EXE_ftramp")).args(["record", "-o"]).arg(&trace_dir).arg("--").arg(&exe).arg(&plugin).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert_eq!(o.stdout, untraced.stdout, "{err}");
    assert!(err.contains("plugin.so: it has its own copy of the unwinder") && err.contains("its functions are not traced"), "{err}");
    let trace = Trace::open(&trace_dir).expect("the trace opens");
    let mut names = BTreeMap::new();
    for p in &trace.processes {
        for e in p.threads.iter().flat_map(|t| &t.events) {
            *names.entry((p.func_name(e.func), e.kind == EventKind::Entry)).or_insert(0) += 1;
        }
    }
    let get = |name: &str, entry| names.get(&(name.to_string(), entry)).copied().unwrap_or(0);
    assert_eq!((get("main_call_plugin", true), get("main_call_plugin", false)), (12, 12), "{names:?}");
    assert!(names.keys().all(|(n, _)| !n.contains("plugin_")  || n == "main_call_plugin"), "the plugin's functions were traced: {names:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn boost_context_fibers_are_traced() {
    let cxx = "clang++-14";
    let header = std::path::Path::new("/usr/include/boost/context/fiber.hpp");
    if !runs(cxx, &["--version"]) || !header.exists() {
        let what = "clang++-14 and Boost.Context (apt-get install clang-14 libboost-context-dev)";
        assert!(std::env::var_os("CI").is_none_or(|v| v != "true"), "CI needs {what}");
        eprintln!("skipped: needs {what}");
        return;
    }
    let dir = scratch("boost");
    std::fs::write(dir.join("prog.cpp"), BOOST_FIBERS).unwrap();
    let exe = dir.join("prog");
    compile(
        Command::new(cxx)
            .arg("-O2")
            .args(cflags_for(cxx))
            .arg("-o")
            .arg(&exe)
            .arg(dir.join("prog.cpp"))
            .arg("-lboost_context"),
    );
    let untraced = Command::new(&exe).output().unwrap();
    assert!(untraced.status.success());
    let out = check(&dir, &exe, &[], |_| true);
    assert_eq!(out, String::from_utf8_lossy(&untraced.stdout), "the program's output as untraced");
    assert!(out.contains("sum 48 caught 2"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn rust_built_by_nightly_with_patchable_entries_is_traced() {
    // The nightly toolchain where it is installed, else this stable rustc made to accept
    // the nightly flag (`RUSTC_BOOTSTRAP=1`, as the README says): the test then runs on
    // every machine (until the twenty-eighth session it was skipped without a nightly,
    // which no machine here has).
    let nightly = runs("rustc", &["+nightly", "--version"]);
    // The same number of NOPs as the C flag (`-fpatchable-function-entry=5`).
    let nops = cflags()
        .iter()
        .find_map(|f| {
            f.strip_prefix("-fpatchable-function-entry=")
                .map(String::from)
        })
        .expect("the site flags of this arch use -fpatchable-function-entry");
    let dir = scratch("rust");
    std::fs::write(dir.join("prog.rs"), RUST).unwrap();
    let exe = dir.join("prog");
    compile(
        Command::new("rustc")
            .args(nightly.then_some("+nightly"))
            .env("RUSTC_BOOTSTRAP", "1")
            .args([
                "-O",
                "--crate-name",
                "prog",
                &format!("-Zpatchable-function-entry={nops}"),
                "-o",
            ])
            .arg(&exe)
            .arg(dir.join("prog.rs")),
    );
    check(&dir, &exe, &[], |_| true);
    // A filter with the name replay shows (no hash).
    check(&dir, &exe, &["-F", "prog::inner"], |n| n == "prog::inner");
    let _ = std::fs::remove_dir_all(&dir);
}
