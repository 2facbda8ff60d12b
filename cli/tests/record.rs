//! `ftramp record`: records a C program end to end (the recorder library
//! found next to the binary), passes the program's exit status on, and
//! refuses bad input with messages naming it.

use ftramp_trace::read::{EventKind, Trace};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

fn ftramp() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ftramp"))
}

/// Compiles `src` into `out` with `cc`, `opts` and the flags `ftramp
/// cflags` prints, then `libs`.
fn compile(opts: &[&str], out: &Path, src: &Path, libs: &[&str]) {
    let arch = std::env::consts::ARCH;
    let flags = ftramp().args(["cflags", "-a", arch]).output().unwrap();
    assert!(flags.status.success());
    let flags = String::from_utf8(flags.stdout).unwrap();
    let st = Command::new("cc")
        .args(opts)
        .args(flags.split_whitespace())
        .arg("-o")
        .arg(out)
        .arg(src)
        .args(libs)
        .status()
        .unwrap();
    assert!(st.success(), "compiling {} with cc {opts:?}", src.display());
}

/// `recorder/tests/c/rec_tracee.c` built with the flags `ftramp cflags` prints.
fn tracee() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("record-cli-tracee");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../recorder/tests/c/rec_tracee.c");
        compile(&["-O2", "-fno-inline", "-fno-optimize-sibling-calls"], &out, &src, &["-lpthread", "-ldl"]);
        out
    })
}

fn dir(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("record-cli")
        .join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(d.parent().unwrap()).unwrap();
    d
}

fn record(out: &Path, opts: &[&str], prog: &Path, args: &[&str]) -> Output {
    ftramp()
        .arg("record")
        .arg("-o")
        .arg(out)
        .args(opts)
        .arg("--")
        .arg(prog)
        .args(args)
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// An image that ends without the recorder seeing it (an exit system call
/// made directly, as SIGKILL would) is named: its last events are lost and
/// cannot be counted, and the trace's `lost` would not say so.
#[test]
fn an_image_ending_unseen_is_reported() {
    let d = dir("exit-group");
    let o = record(&d, &[], tracee(), &["exit-via", "exit_group"]);
    assert_eq!(o.status.code(), Some(5), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("ended without the recorder seeing it end") && stderr(&o).contains("(image 0)"),
        "{}",
        stderr(&o)
    );
    // A normal end says nothing of the kind.
    let d = dir("exit-normal");
    let o = record(&d, &[], tracee(), &["exit-via", "_Exit"]);
    assert_eq!(o.status.code(), Some(3));
    assert!(!stderr(&o).contains("ended without"), "{}", stderr(&o));
}

/// A sanitizer's runtime must be the first library loaded: `ftramp record`
/// puts it before the recorder in `LD_PRELOAD` (ASan aborted with "ASan
/// runtime does not come first in initial library list" before).  TSan's
/// runtime also has 768 KB of initial-exec TLS, which glibc places only in
/// its surplus once an audit module made it set TLS up early: the surplus
/// is raised for it (the program failed to start with the module before).
/// Also run through `sh -c`, whose exec of the program is the recorder's
/// to give the same room (dash execs from a `vfork` child).
fn sanitizer_program_is_recorded(sanitizer: &str) {
    let dir0 = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("record-cli-{sanitizer}"));
    std::fs::create_dir_all(&dir0).unwrap();
    let src = dir0.join("san.c");
    std::fs::write(
        &src,
        "#include <stdio.h>\n#include <stdlib.h>\n#include <pthread.h>\n\
         __attribute__((noipa)) long leaf(long x) { return x + 1; }\n\
         static void *th(void *a) { long s = 0; for (int i = 0; i < 50; i++) s += leaf(i); return (void *)s; }\n\
         int main(void) { char *p = malloc(16); long s = 0; pthread_t t; void *r;\n\
         pthread_create(&t, 0, th, 0); for (int i = 0; i < 100; i++) s += leaf(i); pthread_join(t, &r);\n\
         p[0] = (char)s; printf(\"%d %ld\\n\", p[0], (long)r); free(p); return 0; }\n",
    )
    .unwrap();
    let exe = dir0.join("san");
    // (The runtimes come with gcc.)
    compile(&["-O1", &format!("-fsanitize={sanitizer}")], &exe, &src, &["-lpthread"]);
    let sh = format!("'{}'", exe.display());
    for (how, prog, args) in [("direct", exe.as_path(), &[][..]), ("sh", Path::new("/bin/sh"), &["-c", sh.as_str()][..])] {
        let d = dir(&format!("{sanitizer}-{how}"));
        let o = record(&d, &[], prog, args);
        assert!(o.status.success(), "{sanitizer} {how}: {}", stderr(&o));
        assert_eq!(String::from_utf8_lossy(&o.stdout), "-70 1275\n", "{sanitizer} {how}");
        let t = Trace::open(&d).unwrap();
        let p = t.processes.iter().find(|p| p.symbols.iter().any(|s| s.name == "leaf")).expect("the program is recorded");
        let leaf = p.symbols.iter().find(|s| s.name == "leaf").unwrap().id;
        let n = p.threads.iter().flat_map(|t| &t.events).filter(|e| e.func == leaf && e.kind == EventKind::Entry).count();
        assert_eq!(n, 150, "{sanitizer} {how}");
    }
}

#[test]
fn an_address_sanitizer_program_is_recorded() {
    sanitizer_program_is_recorded("address");
}

/// Also: the recorder's `dlsym` interposer does nothing before recording
/// starts (TSan's runtime calls `dlsym` while it sets up its interceptors,
/// and the interposer's `dl_iterate_phdr` reached TSan's interceptor of it
/// before that had the real function: the program crashed).
#[test]
fn a_thread_sanitizer_program_is_recorded() {
    sanitizer_program_is_recorded("thread");
}

/// A library loaded at start-up, even one linked only through another, with
/// more initial-exec TLS than glibc keeps spare once an audit module is
/// loaded (4 KB here; with the module and nothing else the program does
/// not start: "cannot allocate memory in static TLS block").  `ftramp
/// record` raises glibc's surplus for it, and so do the exec and
/// `posix_spawn` interposers for each image started from a recorded one:
/// the program runs with the module, so its library's constructor is
/// recorded, and sees its own `GLIBC_TUNABLES`, not ours.  Started
/// directly, by `sh -c` (from dash's `vfork` child), by `posix_spawn` with
/// `environ`, and by `execve` with main's `envp` (which still holds the
/// variables the image started with).
#[test]
fn a_library_with_much_initial_exec_tls_gets_room_beside_the_audit_module() {
    let dir0 = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("record-cli-bigtls");
    std::fs::create_dir_all(&dir0).unwrap();
    let write = |name: &str, text: &str| {
        let p = dir0.join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let big = write("big.c", "__attribute__((tls_model(\"initial-exec\"))) __thread char big_buf[4096];\nint big_touch(int i) { big_buf[i] += 1; return big_buf[i]; }\n");
    let mid = write(
        "mid.c",
        "int big_touch(int);\n__attribute__((noinline)) int mid_call(int i) { return big_touch(i); }\n\
         __attribute__((constructor)) static void mid_init(void) { for (int i = 0; i < 3; i++) mid_call(100 + i); }\n",
    );
    let main = write(
        "m.c",
        "#include <spawn.h>\n#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n#include <sys/wait.h>\n#include <unistd.h>\n\
         extern char **environ;\nint mid_call(int);\n\
         int main(int argc, char **argv, char **envp) {\n\
           int s = 0; for (int i = 0; i < 10; i++) s += mid_call(i);\n\
           const char *t = getenv(\"GLIBC_TUNABLES\");\n\
           printf(\"s %d tunables %s\\n\", s, t ? t : \"-\"); fflush(stdout);\n\
           char *child[] = { argv[0], NULL }; pid_t pid;\n\
           if (argc > 1 && !strcmp(argv[1], \"spawn\")) { if (posix_spawn(&pid, argv[0], 0, 0, child, environ)) return 9; }\n\
           else if (argc > 1 && !strcmp(argv[1], \"envp\")) { if (!(pid = fork())) { execve(argv[0], child, envp); _exit(8); } }\n\
           else return 0;\n\
           int st; waitpid(pid, &st, 0); return WIFEXITED(st) ? WEXITSTATUS(st) : 7; }\n",
    );
    let rpath = "-Wl,-rpath,$ORIGIN";
    compile(&["-O2", "-shared", "-fPIC"], &dir0.join("libbig.so"), &big, &[]);
    compile(&["-O2", "-shared", "-fPIC"], &dir0.join("libmid.so"), &mid, &["-L", dir0.to_str().unwrap(), "-lbig", rpath]);
    let exe = dir0.join("m");
    compile(&["-O2"], &exe, &main, &["-L", dir0.to_str().unwrap(), "-lmid", rpath]);
    let user = "glibc.malloc.perturb=0";
    let sh = format!("'{}'", exe.display());
    for (how, prog, args, images) in [
        ("direct", exe.as_path(), &[][..], 1),
        ("sh", Path::new("/bin/sh"), &["-c", sh.as_str()][..], 1),
        ("spawn", exe.as_path(), &["spawn"][..], 2),
        ("envp", exe.as_path(), &["envp"][..], 2),
    ] {
        let d = dir(&format!("bigtls-{how}"));
        let o = ftramp().args(["record", "-o"]).arg(&d).arg("--").arg(prog).args(args).env("GLIBC_TUNABLES", user).output().unwrap();
        assert!(o.status.success(), "{how}: {}", stderr(&o));
        let line = format!("s 10 tunables {user}\n");
        assert_eq!(String::from_utf8_lossy(&o.stdout), line.repeat(images), "{how}");
        let t = Trace::open(&d).unwrap();
        // Each image of the program: the constructor's 3 calls and main's
        // 10 (a fork child before its exec calls none).
        let calls: Vec<usize> = t
            .processes
            .iter()
            .filter_map(|p| {
                let f = p.symbols.iter().find(|s| s.name == "mid_call")?.id;
                Some(p.threads.iter().flat_map(|t| &t.events).filter(|e| e.func == f && e.kind == EventKind::Entry).count())
            })
            .filter(|&n| n != 0)
            .collect();
        assert_eq!(calls, vec![13; images], "{how}");
    }
}

/// A program whose `malloc` is a library's own with a `__thread` counter
/// (`-fPIC`: general-dynamic TLS) died of SIGSEGV before `main` under
/// `ftramp record` and ran untraced: beside an audit module glibc
/// allocates such a library's TLS with `malloc` at a thread's first use,
/// and that `malloc` touching its TLS allocated again, for ever (any
/// audit module does it; found with a malloc-counting preload on redis in
/// the thirtieth session).  Such a program now runs without the module,
/// and says so; the same library with initial-exec TLS keeps it.  Linked
/// and preloaded, both tracers.
#[test]
fn an_allocator_library_with_dynamic_tls_runs_without_the_audit_module() {
    let dir0 = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("record-cli-tlsmalloc");
    std::fs::create_dir_all(&dir0).unwrap();
    let write = |name: &str, text: &str| {
        let p = dir0.join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let alloc = |model: &str| {
        format!(
            "#include <stddef.h>\n\
             extern void *__libc_malloc(size_t); extern void __libc_free(void *);\n\
             extern void *__libc_calloc(size_t, size_t); extern void *__libc_realloc(void *, size_t);\n\
             static __thread {model} unsigned long count;\n\
             void *malloc(size_t s) {{ count++; return __libc_malloc(s); }}\n\
             void free(void *p) {{ __libc_free(p); }}\n\
             void *calloc(size_t a, size_t b) {{ count++; return __libc_calloc(a, b); }}\n\
             void *realloc(void *p, size_t s) {{ count++; return __libc_realloc(p, s); }}\n\
             unsigned long tls_malloc_count(void) {{ return count; }}\n"
        )
    };
    let dynamic = write("dyn.c", &alloc(""));
    let initial = write("ie.c", &alloc("__attribute__((tls_model(\"initial-exec\")))"));
    let main = write(
        "m.c",
        "#include <stdio.h>\n#include <stdlib.h>\n\
         __attribute__((noinline)) int work(int i) { char *p = malloc(16 + i); int r = p != 0; free(p); return r; }\n\
         int main(void) { int n = 0; for (int i = 0; i < 100; i++) n += work(i); printf(\"%d\\n\", n); return 0; }\n",
    );
    let rpath = "-Wl,-rpath,$ORIGIN";
    let d0 = dir0.to_str().unwrap();
    compile(&["-O2", "-shared", "-fPIC"], &dir0.join("libtlsdyn.so"), &dynamic, &[]);
    compile(&["-O2", "-shared", "-fPIC"], &dir0.join("libtlsie.so"), &initial, &[]);
    let (linked, linked_ie, plain) = (dir0.join("linked"), dir0.join("linked-ie"), dir0.join("plain"));
    compile(&["-O2"], &linked, &main, &["-L", d0, "-ltlsdyn", rpath]);
    compile(&["-O2"], &linked_ie, &main, &["-L", d0, "-ltlsie", rpath]);
    compile(&["-O2"], &plain, &main, &[]);
    let preload_dyn = dir0.join("libtlsdyn.so");
    let preload_ie = dir0.join("libtlsie.so");
    for tracer in ["function_graph", "function"] {
        for (how, prog, preload, dynamic_tls) in [
            ("linked", &linked, None, true),
            ("preloaded", &plain, Some(&preload_dyn), true),
            ("linked-ie", &linked_ie, None, false),
            ("preloaded-ie", &plain, Some(&preload_ie), false),
        ] {
            let d = dir(&format!("tlsmalloc-{how}-{tracer}"));
            let mut c = ftramp();
            c.args(["record", "-t", tracer, "-o"]).arg(&d).arg("--").arg(prog);
            c.env_remove("FTRAMP_AUDIT").env_remove("LD_AUDIT").env_remove("LD_PRELOAD");
            if let Some(p) = preload {
                c.env("LD_PRELOAD", p);
            }
            let o = c.output().unwrap();
            assert!(o.status.success(), "{how} {tracer}: {:?} {}", o.status, stderr(&o));
            assert_eq!(String::from_utf8_lossy(&o.stdout), "100\n", "{how} {tracer}");
            let said = stderr(&o).contains("has thread-local storage that is not initial-exec");
            assert_eq!(said, dynamic_tls, "{how} {tracer}: {}", stderr(&o));
            if dynamic_tls {
                assert!(stderr(&o).contains("libtlsdyn.so defines the allocator"), "{how} {tracer}: {}", stderr(&o));
            }
            let t = Trace::open(&d).unwrap();
            let p = &t.processes[0];
            let f = p.symbols.iter().find(|s| s.name == "work").unwrap_or_else(|| panic!("{how} {tracer}: no work")).id;
            let n = p.threads.iter().flat_map(|t| &t.events).filter(|e| e.func == f && e.kind == EventKind::Entry).count();
            assert_eq!(n, 100, "{how} {tracer}");
        }
    }
}

#[test]
fn records_threads_and_writes_info() {
    let d = dir("threads");
    let o = record(&d, &["-F", "rec_*"], tracee(), &["threads"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("1 process image recorded"),
        "{}",
        stderr(&o)
    );
    let info = std::fs::read_to_string(d.join("info")).unwrap();
    assert!(
        info.contains("tracer = \"function_graph\"") && info.contains("\"threads\"]"),
        "{info}"
    );
    let t = Trace::open(&d).unwrap();
    assert!(t.problems.is_empty(), "{:?}", t.problems);
    let p = &t.processes[0];
    // The clock calibration over the whole run, added when the program
    // ended, replaces the provisional one the process recorded with (same
    // base, rates within 0.1 %).
    let run = t.info.calibration.expect("[calibration] in info");
    let own = std::fs::read_to_string(d.join(format!("task-{}-0.info", p.pid))).unwrap();
    let own_tps: u64 = own.lines().find_map(|l| l.strip_prefix("ticks_per_sec = ")).unwrap().parse().unwrap();
    assert_eq!(p.calibration, run);
    assert!(run.ticks_per_sec.abs_diff(own_tps) * 1000 < run.ticks_per_sec, "{run:?} vs {own_tps}");
    assert!(own.contains(&format!("base_ticks = {}", run.base_ticks)), "{own}");
    let stdout = String::from_utf8_lossy(&o.stdout);
    let want: u64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("rec_fib "))
        .unwrap()
        .parse()
        .unwrap();
    let fib = p.symbols.iter().find(|s| s.name == "rec_fib").unwrap().id;
    let entries = p
        .threads
        .iter()
        .flat_map(|t| &t.events)
        .filter(|e| e.func == fib && e.kind == EventKind::Entry)
        .count();
    assert_eq!(entries as u64, want);
    assert!(
        p.threads
            .iter()
            .flat_map(|t| &t.events)
            .all(|e| p.func_name(e.func) != "main"),
        "-F rec_* leaves main out"
    );
}

#[test]
fn exit_status_is_the_programs() {
    let d = dir("status");
    let o = record(&d, &[], tracee(), &["fork"]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("2 process images recorded"),
        "{}",
        stderr(&o)
    );
    let o = record(&d, &[], tracee(), &["segv"]);
    assert_eq!(o.status.code(), Some(128 + 11));
    assert!(stderr(&o).contains("killed by signal 11"), "{}", stderr(&o));
    // The old trace was replaced.
    let t = Trace::open(&d).unwrap();
    assert_eq!(t.processes.len(), 1);
    assert_eq!(t.processes[0].exit.as_deref(), Some("signal 11 (SIGSEGV)"));
}

/// `-d`/`--dir` name the trace directory as they do for replay, report
/// and dump (and uftrace).
#[test]
fn dir_flag_is_the_same_as_for_replay() {
    for flag in ["-d", "--dir"] {
        let d = dir(&format!("dirflag{flag}"));
        let o = ftramp().args(["record", flag]).arg(&d).args(["-F", "rec_*", "--"]).arg(tracee()).arg("threads").output().unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        let t = Trace::open(&d).unwrap();
        assert_eq!(t.processes.len(), 1, "{flag}");
        let r = ftramp().args(["report", "-d"]).arg(&d).output().unwrap();
        assert!(String::from_utf8_lossy(&r.stdout).contains("rec_worker"), "{flag}: {}", String::from_utf8_lossy(&r.stdout));
    }
}

/// A filter under which no call was recorded is said at the end (a typo,
/// or a demangled-looking glob); a filter that matched says nothing.
/// Events a process could not record are said once, by `ftramp record` at
/// the end, per cause and with the processes' pids, from the counts each
/// image's `.info` holds — not by the recorder into the process's stderr,
/// where a parent reading it (a shell's command substitution, a build
/// reading a compiler) got the notes in the program's output: bash's own
/// tests failed traced for that alone.
#[test]
fn losses_are_summarised_by_record_not_written_into_the_programs_stderr() {
    let exe = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("record-cli-loss-child");
    compile(&["-O2"], &exe, &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/loss_child.c"), &[]);
    let d = dir("loss-child");
    let o = record(&d, &["--buffer-size", "4K", "--buffers", "2"], &exe, &[]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "[child done 200000\n] status 0\n", "{err}");
    let t = Trace::open(&d).unwrap();
    let child = t.processes.iter().find(|p| p.args.last().is_some_and(|a| a == "child")).expect("the child's image");
    assert!(t.processes.iter().all(|p| p.pid == child.pid || p.lost == 0), "only the child loses events");
    assert!(child.lost > 0, "small buffers lose some of 400000 events");
    let line = format!("ftramp record: {} events lost in pid {} (buffers full)", child.lost, child.pid);
    assert_eq!(err.matches("events lost").count(), 2, "once per cause, and the total: {err}");
    assert!(err.contains(&line), "{line} in {err}");
    assert!(err.contains(&format!("({} events lost, see above)", t.processes.iter().map(|p| p.lost).sum::<u64>())), "{err}");
}

/// `-q` leaves the program's stderr as it would be untraced when all went
/// well, and still says what was lost.
#[test]
fn quiet_says_nothing_unless_something_went_wrong() {
    let d = dir("quiet");
    let o = record(&d, &["-q"], tracee(), &["fork"]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let untraced = Command::new(tracee()).arg("fork").output().unwrap();
    assert_eq!(stderr(&o), stderr(&untraced), "as untraced");
    assert_eq!(Trace::open(&d).unwrap().processes.len(), 2);
    // Processes left running are waited for without a word, too.
    let script = format!("(sleep 0.3; exec {} threads > /dev/null) & echo started", tracee().display());
    let o = record(&dir("quiet-background"), &["-q"], Path::new("/bin/sh"), &["-c", &script]);
    assert!(o.status.success() && stderr(&o).is_empty(), "{}", stderr(&o));
    // And left running with --no-wait (the "still recording" note), and a
    // program killed by a signal (its status says it: 128 + 15); both were
    // said despite -q until the twenty-sixth session.
    let script = format!("{0} threads > /dev/null; ({0} threads > /dev/null) & echo started", tracee().display());
    let o = record(&dir("quiet-no-wait"), &["-q", "--no-wait"], Path::new("/bin/sh"), &["-c", &script]);
    assert!(o.status.success() && stderr(&o).is_empty(), "{}", stderr(&o));
    let script = format!("{} threads > /dev/null; kill -TERM $$", tracee().display());
    let o = record(&dir("quiet-killed"), &["-q"], Path::new("/bin/sh"), &["-c", &script]);
    assert_eq!(o.status.code(), Some(128 + 15));
    assert!(stderr(&o).is_empty(), "{}", stderr(&o));

    // The recorder's note in the program's own stderr is left out too (a
    // server logging its stderr got it); a run that recorded nothing is
    // still said at the end.
    let o = record(&dir("quiet-filter"), &["-q", "-F", "rec_nosuch*"], tracee(), &["fork"]);
    let err = stderr(&o);
    assert!(!err.contains("no function loaded at start"), "{err}");
    assert!(err.contains("no call of a function matching the filters was recorded"), "{err}");

    let exe = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("record-cli-loss-child-quiet");
    compile(&["-O2"], &exe, &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/loss_child.c"), &[]);
    let o = record(&dir("quiet-losses"), &["-q", "--buffer-size", "4K", "--buffers", "2"], &exe, &[]);
    let err = stderr(&o);
    assert!(err.contains("(buffers full)") && err.contains("events lost, see above"), "{err}");
}

/// A stack overflow on a thread other than the main one: the recorder gives
/// each recording thread an alternate signal stack, so its handler runs
/// and the trace is written (until the thirtieth session only the main
/// thread had one, and such a crash lost every thread's unwritten events:
/// a Perl ithread recursing through `sort` comparators).  Where the handler
/// still cannot run (the thread disabled that stack), the program is said
/// to have been killed by its signal, as its status says: until the
/// thirtieth session the note blamed SIGKILL or an exit system call.
#[test]
fn a_stack_overflow_on_another_thread_is_recorded_or_named() {
    use std::os::unix::process::ExitStatusExt;
    let exe = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("record-cli-thread-overflow");
    compile(&["-O1", "-fno-optimize-sibling-calls"], &exe, &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/thread_overflow.c"), &["-lpthread"]);
    for tracer in ["function_graph", "function"] {
        let d = dir(&format!("thread-overflow-{tracer}"));
        let o = record(&d, &["-q", "-t", tracer], &exe, &[]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(128 + libc::SIGSEGV), "{tracer}: {err}");
        assert!(!err.contains("could not run") && !err.contains("ended without the recorder seeing it end"), "{tracer}: {err}");
        let t = Trace::open(&d).unwrap();
        let p = &t.processes[0];
        assert_eq!(p.exit.as_deref(), Some("signal 11 (SIGSEGV)"), "{tracer}: {err}");
        let work = p.threads.iter().flat_map(|t| &t.events).filter(|e| e.kind == EventKind::Entry && p.func_name(e.func) == "work").count();
        assert_eq!(work, 1001, "{tracer}: every call of work written: {err}");

        let d = dir(&format!("thread-overflow-no-altstack-{tracer}"));
        let o = record(&d, &["-q", "-t", tracer], &exe, &["no-altstack"]);
        let err = stderr(&o);
        assert_eq!(o.status.signal().or(o.status.code().map(|c| c - 128)), Some(libc::SIGSEGV), "{tracer}: {err}");
        assert!(
            err.contains("was killed by signal 11 (SIGSEGV) where the recorder's handler could not run (a stack overflow on a thread other than the main one"),
            "{tracer}: {err}"
        );
        assert!(!err.contains("ended without the recorder seeing it end"), "{tracer}: {err}");
    }
}

/// An image whose `.info` is empty (what a full disk leaves: the recorder created the file
/// but could not write a line) is said to be missing from the trace, even with `-q`, and
/// is not blamed on SIGKILL (`ended without the recorder seeing it end`, as until the
/// twenty-seventh session).  The program makes such a file itself, as a full disk would
/// leave it.
#[test]
fn an_image_that_could_not_be_written_is_reported() {
    let d = dir("unwritten-image");
    let script = format!("{} threads > /dev/null; : > \"$FTRAMP_RECORD_DIR/task-4000001-0.info\"", tracee().display());
    let o = record(&d, &["-q"], Path::new("/bin/sh"), &["-c", &script]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("nothing of pid 4000001 (image 0) is in the trace, not even in the counts of lost events: its .info is empty"),
        "{err}"
    );
    assert!(!err.contains("ended without the recorder seeing it end"), "{err}");
}

/// A second `ftramp record` into a directory a recording still writes into (an
/// `ftramp record` still running, or the processes one left recording with `--no-wait`)
/// refuses, naming the directory, and the first trace is whole; once they are done, the
/// directory is reused.  Until the twenty-seventh session the second run removed the
/// first one's files without a word, and the first trace was lost.
#[test]
fn a_trace_directory_still_recorded_into_is_not_replaced() {
    let d = dir("in-use");
    let work = dir("in-use-work");
    std::fs::create_dir_all(&work).unwrap();
    let go = work.join("go");
    let refused = |what: &str| {
        let o = record(&d, &[], tracee(), &["fork"]);
        assert_eq!(o.status.code(), Some(1), "{what}: {}", stderr(&o));
        let said = format!("{} is in use: a recording into it is still running", d.display());
        assert!(stderr(&o).contains(&said), "{what}: {}", stderr(&o));
    };
    let waiter = format!("while [ ! -e {0} ]; do sleep 0.05; done; {1} threads", go.display(), tracee().display());
    // An `ftramp record` still running.
    let mut first = ftramp().arg("record").arg("-o").arg(&d).args(["-q", "--", "/bin/sh", "-c", &waiter]).spawn().unwrap();
    while !d.join("info").exists() {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    refused("while ftramp record runs");
    std::fs::write(&go, "").unwrap();
    assert!(first.wait().unwrap().success());
    let t = Trace::open(&d).unwrap();
    let threads = t.processes.iter().filter(|p| p.exe.ends_with("record-cli-tracee")).map(|p| p.threads.len()).sum::<usize>();
    assert_eq!(threads, 5, "the first trace is whole");
    // Processes an `ftramp record --no-wait` left recording.
    std::fs::remove_file(&go).unwrap();
    let o = record(&d, &["-q", "--no-wait"], Path::new("/bin/sh"), &["-c", &format!("({{ {waiter}; }} > /dev/null 2>&1 &)")]);
    assert!(o.status.success(), "{}", stderr(&o));
    refused("while processes left running record");
    std::fs::write(&go, "").unwrap();
    let t0 = std::time::Instant::now();
    loop {
        let o = record(&d, &[], tracee(), &["fork"]);
        if o.status.code() == Some(3) {
            break;
        }
        assert!(t0.elapsed() < std::time::Duration::from_secs(60), "the directory was never free again: {}", stderr(&o));
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// A C program compiled with `-ffunction-sections` and linked with `--gc-sections` whose
/// file's first function is unused loses its whole site table with gcc 12 (the table is
/// tied to that function's section): `ftramp record` says so, and how to keep it, instead
/// of advising the flags it was built with (until the twenty-seventh session).  With a
/// compiler that keeps the table, the functions are traced.
#[test]
fn a_site_table_the_link_dropped_is_reported() {
    let d = dir("gc-sections");
    std::fs::create_dir_all(&d).unwrap();
    let src = d.join("gcs.c");
    std::fs::write(
        &src,
        "#include <stdio.h>\n__attribute__((noinline)) int first_unused(int x) { return x * 7; }\n\
         __attribute__((noinline)) int second(int x) { return x + 1; }\n\
         int main(int argc, char **argv) { printf(\"%d\\n\", second(argc)); return 0; }\n",
    )
    .unwrap();
    let exe = d.join("gcs");
    compile(&["-O2", "-ffunction-sections", "-Wl,--gc-sections"], &exe, &src, &[]);
    let kept = {
        use object::Object;
        let data = std::fs::read(&exe).unwrap();
        object::File::parse(&*data).unwrap().section_by_name("__patchable_function_entries").is_some()
    };
    let o = record(&d.join("trace"), &[], &exe, &[]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    if kept {
        eprintln!("this compiler keeps the table: checked that the functions are traced");
        assert!(!err.contains("nothing in it is traced"), "{err}");
    } else {
        assert!(err.contains("has no patch site table, but 2 of its functions begin with a patch site's NOPs"), "{err}");
        assert!(err.contains("add `-fno-function-sections`"), "{err}");
    }
}

#[test]
fn a_filter_that_recorded_nothing_is_reported() {
    let said = "no call of a function matching the filters was recorded (-F rec_nosuch*)";
    let d = dir("filter-nothing");
    let o = record(&d, &["-F", "rec_nosuch*"], tracee(), &["threads"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains(said), "{}", stderr(&o));
    let o = record(&d, &["-F", "rec_nosuch*", "-F", "rec_*"], tracee(), &["threads"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stderr(&o).contains("no call of a function"), "{}", stderr(&o));
    let t = Trace::open(&d).unwrap();
    assert!(t.processes[0].threads.iter().any(|t| !t.events.is_empty()));
}

#[test]
fn program_without_sites_gets_advice() {
    let d = dir("nosites");
    let o = record(&d, &[], Path::new("true"), &[]);
    assert!(o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("no patchable function entries") && e.contains("-fpatchable-function-entry="),
        "{e}"
    );
    assert_eq!(
        e.matches("no patchable function entries").count(),
        1,
        "said once: {e}"
    );
}

#[test]
fn static_program_is_reported_as_not_recorded() {
    let exe = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("record-cli-static");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../recorder/tests/c/rec_nosites.c");
    let st = Command::new("cc")
        .arg("-static")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .status()
        .unwrap();
    assert!(st.success(), "cc -static (Debian: libc6-dev has libc.a)");
    let d = dir("static");
    let o = record(&d, &[], &exe, &[]);
    assert!(o.status.success());
    assert_eq!(String::from_utf8_lossy(&o.stdout), "ran 42\n");
    assert!(
        stderr(&o).contains("nothing was recorded") && stderr(&o).contains("statically linked"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn bad_input_is_refused_with_a_reason() {
    let d = dir("bad");
    let cases: &[(&[&str], &str, &str)] = &[
        (
            &[],
            "no-such-program-here",
            "program not found: no-such-program-here",
        ),
        (
            &["-t", "function", "-D", "2"],
            "true",
            "--depth needs the function_graph tracer",
        ),
        (
            &["-t", "function", "--min-duration", "1us"],
            "true",
            "--min-duration needs the function_graph tracer",
        ),
        (&["--min-duration", "3 parsecs"], "true", "--min-duration"),
        (&["--buffer-size", "1K"], "true", "between 4K and 16M"),
        (&["-F", "0xoops"], "true", "bad filter `0xoops`"),
        // Names have no parameter list: said before the run, not after.
        (&["-N", "load(int)"], "true", "bad filter `load(int)`: names have no parameter list"),
        (&["-F", "YAML::Load(char*)"], "true", "bad filter `YAML::Load(char*)`: names have no parameter list"),
        (&["-F", "Load YAML"], "true", "write `?` or `*` for a space"),
        // A misspelt option is named as one, not looked up as the program.
        (&["--max-deth", "3"], "true", "unknown option `--max-deth`"),
        // `--max-depth` is the issue's name for `--depth`.
        (
            &["-t", "function", "--max-depth", "2"],
            "true",
            "--depth needs the function_graph tracer",
        ),
    ];
    for (opts, prog, want) in cases {
        let o = record(&d, opts, Path::new(prog), &[]);
        assert!(!o.status.success(), "{opts:?} {prog}");
        assert!(stderr(&o).contains(want), "{opts:?}: {}", stderr(&o));
    }
    // Bad option values are refused by clap, with its hint and status 2 as for
    // every other option (until the twenty-eighth session: status 1, `Error:`).
    for opts in [["--min-duration", "5xs"], ["--buffer-size", "12Q"], ["--buffer-size", "1G"]] {
        let o = record(&d, &opts, Path::new("true"), &[]);
        assert_eq!(o.status.code(), Some(2), "{opts:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(&format!("invalid value '{}' for '{}", opts[1], opts[0])), "{opts:?}: {}", stderr(&o));
    }
    // The names replay shows for call operators end in `()`: not a parameter list.
    for opts in [["-F", "F::operator()"], ["-N", "main::{lambda(int)#1}::operator()"]] {
        let o = record(&d, &opts, Path::new("true"), &[]);
        assert!(o.status.success() && !stderr(&o).contains("bad filter"), "{opts:?}: {}", stderr(&o));
    }
    // A name with `[` or braces is its own pattern (an unclosed `[` a plain one,
    // as in ftrace): `[oops` was refused until the twenty-eighth session.
    for opts in [["-F", "<mini::Holder<[u8]>>::show"], ["-F", "std::rt::*::{closure#0}"], ["-N", "[oops"]] {
        let o = record(&d, &opts, Path::new("true"), &[]);
        assert!(o.status.success() && !stderr(&o).contains("bad filter"), "{opts:?}: {}", stderr(&o));
    }
    let o = record(&d, &["-F", "F::operator()(int)"], Path::new("true"), &[]);
    assert!(stderr(&o).contains("names have no parameter list"), "{}", stderr(&o));
    // A directory that is not a trace is not overwritten.
    let keep = dir("not-a-trace");
    std::fs::create_dir_all(&keep).unwrap();
    std::fs::write(keep.join("precious.txt"), "data").unwrap();
    let o = record(&keep, &[], Path::new("true"), &[]);
    assert!(
        stderr(&o).contains("refusing to overwrite"),
        "{}",
        stderr(&o)
    );
    assert!(keep.join("precious.txt").exists());
    // A preload library that is not there.
    let o = ftramp()
        .env("FTRAMP_PRELOAD", "/nonexistent/libftramp_recorder.so")
        .args(["record", "-o"])
        .arg(dir("preload"))
        .args(["--", "true"])
        .output()
        .unwrap();
    assert!(
        stderr(&o)
            .contains("FTRAMP_PRELOAD=/nonexistent/libftramp_recorder.so does not name a file"),
        "{}",
        stderr(&o)
    );
}

/// The program runs with the audit module (`LD_AUDIT`) found next to the
/// recorder library, ahead of a module of its own; `FTRAMP_AUDIT` names
/// another one, or none when empty (then quietly), and one that is not
/// there is refused.
#[test]
fn the_audit_module_is_set_next_to_the_programs_own() {
    let show = |env: &[(&str, &str)], name: &str| {
        let mut c = ftramp();
        c.args(["record", "-o"]).arg(dir(name)).args(["--", "/bin/sh", "-c", "printf 'LD_AUDIT=%s\\n' \"$LD_AUDIT\""]);
        c.env_remove("FTRAMP_AUDIT").env_remove("LD_AUDIT");
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().unwrap()
    };
    let line = |o: &Output| {
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        out.lines().find_map(|l| l.strip_prefix("LD_AUDIT=").map(String::from)).unwrap_or_else(|| panic!("no LD_AUDIT line in {out:?}"))
    };
    let o = show(&[("LD_AUDIT", "/nonexistent/the-programs-own.so")], "audit-default");
    assert!(o.status.success(), "{}", stderr(&o));
    let (ours, theirs) = line(&o).split_once(':').map(|(a, b)| (a.to_string(), b.to_string())).expect("two modules");
    assert!(ours.ends_with("/libftramp_audit.so") && Path::new(&ours).is_file(), "{ours}");
    assert_eq!(theirs, "/nonexistent/the-programs-own.so");
    assert!(!stderr(&o).contains("libftramp_audit.so not found"), "{}", stderr(&o));
    let o = show(&[("FTRAMP_AUDIT", "")], "audit-none");
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(line(&o), "");
    assert!(!stderr(&o).contains("libftramp_audit.so"), "{}", stderr(&o));
    let o = show(&[("FTRAMP_AUDIT", &ours)], "audit-named");
    assert_eq!(line(&o), ours);
    let o = show(&[("FTRAMP_AUDIT", "/nonexistent/libftramp_audit.so")], "audit-missing");
    assert!(!o.status.success());
    assert!(stderr(&o).contains("FTRAMP_AUDIT=/nonexistent/libftramp_audit.so does not name a file"), "{}", stderr(&o));
}

/// An install with both libraries beside `ftramp` and a newer recorder in
/// its `deps/` (which `find_preload` takes, as in cargo's layout) still
/// finds the audit module beside `ftramp`: until the twenty-eighth session
/// it was looked for in `deps/` only, said missing, and the recording
/// started after the libraries' constructors.
#[test]
fn the_audit_module_beside_ftramp_is_found_when_the_recorder_is_taken_from_deps() {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_ftramp"));
    let built = bin.parent().unwrap();
    let lib = |name: &str| [built.join(name), built.join("deps").join(name)].into_iter().find(|p| p.is_file()).unwrap_or_else(|| panic!("{name} not built"));
    let (recorder, audit) = (lib("libftramp_recorder.so"), lib("libftramp_audit.so"));
    let install = dir("install-layout");
    std::fs::create_dir_all(install.join("deps")).unwrap();
    std::fs::copy(&bin, install.join("ftramp")).unwrap();
    std::fs::copy(&recorder, install.join("libftramp_recorder.so")).unwrap();
    std::fs::copy(&audit, install.join("libftramp_audit.so")).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::copy(&recorder, install.join("deps/libftramp_recorder.so")).unwrap();
    let o = Command::new(install.join("ftramp"))
        .args(["record", "-o"])
        .arg(install.join("trace"))
        .args(["--", "/bin/sh", "-c", "printf 'LD_AUDIT=%s\\n' \"$LD_AUDIT\""])
        .env_remove("FTRAMP_AUDIT")
        .env_remove("FTRAMP_PRELOAD")
        .env_remove("LD_AUDIT")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stderr(&o).contains("not found"), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(out.trim(), format!("LD_AUDIT={}", install.join("libftramp_audit.so").display()), "{}", stderr(&o));
}

#[test]
fn ctrl_c_ends_the_program_and_the_trace_is_finished() {
    // The terminal's Ctrl-C goes to the whole process group: here the
    // program sends SIGINT to its group itself.  `ftramp record` survives
    // it, reports the program's end, passes the status on (128 + 2) and
    // still completes the trace (the run's clock calibration).
    use std::os::unix::process::CommandExt as _;
    let d = dir("ctrl-c");
    let o = ftramp()
        .arg("record")
        .arg("-o")
        .arg(&d)
        .args(["--", "sh", "-c", "kill -INT 0; sleep 5"])
        .process_group(0)
        .output()
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(130), "{err}");
    assert!(err.contains("was killed by signal 2"), "{err}");
    let info = std::fs::read_to_string(d.join("info")).unwrap();
    assert!(info.contains("[calibration]\nticks_per_sec = "), "{info}");
}

/// A program that leaves a process running (a shell's background job) is
/// waited for, as `strace -f` does: `ftramp record` returns with every
/// image of the trace ended (before, it returned at once, said the job
/// "ended without the recorder seeing it end" and counted the images of
/// that moment, while the job went on writing into the trace).  With
/// `--no-wait` it returns when the program ends and names the processes
/// still recording.
#[test]
fn processes_the_program_leaves_running_are_waited_for() {
    let script = format!("(sleep 0.3; exec {} threads > /dev/null) & echo started", tracee().display());
    let d = dir("background");
    let o = record(&d, &[], Path::new("/bin/sh"), &["-c", &script]);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("waiting for the processes it left running"), "{err}");
    assert!(!err.contains("ended without"), "{err}");
    let t = Trace::open(&d).unwrap();
    let job = t.processes.iter().find(|p| p.symbols.iter().any(|s| s.name == "rec_fib")).expect("the job's image");
    assert_eq!(job.exit.as_deref(), Some("code 0"), "recorded to its end");
    assert!(t.processes.iter().all(|p| p.exit.is_some()), "every image ended");

    let d = dir("background-no-wait");
    let o = record(&d, &["--no-wait"], Path::new("/bin/sh"), &["-c", &script]);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("left running are still recording into") && err.contains(": pid "), "named: {err}");
    assert!(!err.contains("waiting for") && !err.contains("ended without"), "{err}");
    // (The job ends on its own.)
    std::thread::sleep(std::time::Duration::from_millis(800));
}

/// Children the shell that execs `ftramp record` already had are not the
/// program's, and are not waited for: `prog 2> >(filter)` gives the filter
/// to the process that becomes `ftramp record`, and the filter waits for
/// its stderr to close (before, both waited for ever); `job & exec ftramp
/// record …` waited for the job.
#[test]
fn children_from_before_the_program_are_not_waited_for() {
    let me = env!("CARGO_BIN_EXE_ftramp");
    let prog = tracee().display().to_string();
    let d = dir("inherited-filter");
    let script = format!("{me} record -o {} -- {prog} fork 2> >(cat >&2); echo status $?", d.display());
    let o = Command::new("timeout").args(["120", "bash", "-c", &script]).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("status 3"), "status {:?}, stdout {out}, stderr {}", o.status, stderr(&o));
    assert!(!stderr(&o).contains("waiting for"), "{}", stderr(&o));

    let d = dir("inherited-job");
    let script = format!("sleep 300 >/dev/null 2>&1 & echo $!; exec {me} record -o {} -- {prog} fork", d.display());
    let o = Command::new("timeout").args(["120", "bash", "-c", &script]).output().unwrap();
    let job = String::from_utf8_lossy(&o.stdout).lines().next().and_then(|l| l.trim().parse::<i32>().ok());
    if let Some(pid) = job {
        // SAFETY: signals the `sleep` the script started (still ours to end).
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(!stderr(&o).contains("waiting for"), "{}", stderr(&o));
    assert_eq!(Trace::open(&d).unwrap().processes.len(), 2, "the program and its child");
}

/// A daemon that writes its title over its environment (nginx, postgres,
/// sshd) is still known as recording: before, its environment no longer
/// named the trace, so `--no-wait` said it had ended unseen with its events
/// lost, and the wait named no pid.
#[test]
fn a_daemon_that_sets_its_title_is_known_as_still_recording() {
    let d = dir("titled-no-wait");
    let o = record(&d, &["--no-wait"], tracee(), &["titled-daemon"]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(!err.contains("ended without"), "{err}");
    assert!(err.contains("left running are still recording into") && err.contains(": pid "), "{err}");
    // (It ends on its own.)
    std::thread::sleep(std::time::Duration::from_millis(2000));

    let d = dir("titled-wait");
    let o = record(&d, &[], tracee(), &["titled-daemon"]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("waiting for the processes it left running (pid "), "{err}");
    let t = Trace::open(&d).unwrap();
    assert_eq!(t.processes.len(), 2, "launcher and daemon");
    assert!(t.processes.iter().all(|p| p.exit.as_deref() == Some("code 0")), "{:?}", t.processes.iter().map(|p| &p.exit).collect::<Vec<_>>());
}

/// A closed stderr (`ftramp record … 2>&1 | head` that stopped reading)
/// loses `ftramp record`'s messages, not the program's exit status
/// (before, writing the summary panicked: status 101).
#[test]
fn a_closed_stderr_keeps_the_programs_status() {
    let d = dir("closed-stderr");
    let mut fds = [0; 2];
    // SAFETY: pipe fills the two descriptors we own.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: closes the read end we own: writes to the pipe then fail.
    unsafe { libc::close(fds[0]) };
    // SAFETY: the write end is ours, and moves into the Stdio.
    let err = unsafe { <std::process::Stdio as std::os::fd::FromRawFd>::from_raw_fd(fds[1]) };
    let st = ftramp().arg("record").arg("-o").arg(&d).arg("--").arg(tracee()).arg("fork").stderr(err).status().unwrap();
    assert_eq!(st.code(), Some(3));
    assert_eq!(Trace::open(&d).unwrap().processes.len(), 2);
}

/// Ctrl-C stops the wait for the processes the program left running (a
/// daemon in a session of its own, which the terminal's signal does not
/// reach): `ftramp record` finishes the trace and names them as still
/// recording, as with --no-wait.  Before, it ignored every terminal
/// signal while waiting, and only SIGKILL ended it (trace unfinished).
#[test]
fn a_terminal_signal_stops_the_wait_for_processes_left_running() {
    use std::io::BufRead;
    let d = dir("stop-waiting");
    let mut child = ftramp()
        .arg("record")
        .arg("-o")
        .arg(&d)
        .args(["--", "/bin/sh", "-c", "setsid sleep 30 >/dev/null 2>&1 & echo started"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut said = String::new();
    while !said.contains("waiting for the processes it left running") {
        let mut line = String::new();
        assert!(err.read_line(&mut line).unwrap() > 0, "ended before waiting: {said}");
        said += &line;
    }
    // Once the sleep records (its image's .info is written at its start).
    let sleeping = || {
        std::fs::read_dir(&d).unwrap().filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok()).any(|i| i.contains("args = [\"sleep\", \"30\"]"))
    };
    for _ in 0..500 {
        if sleeping() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // SAFETY: signals the `ftramp record` we started.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
    let st = child.wait().unwrap();
    // The sleep, named as still recording, and still running: not waited for.
    let pids: Vec<i32> = rest.split("pid ").skip(1).filter_map(|p| p.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()).collect();
    // SAFETY: kill with signal 0 only checks that the process exists.
    let alive = pids.iter().filter(|&&p| unsafe { libc::kill(p, 0) } == 0).count();
    for &pid in &pids {
        // SAFETY: ends the `sleep` this test started.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    assert_eq!((pids.len(), alive), (1, 1), "the sleep named and left running: {rest}");
    assert!(st.success(), "the program's status: {st:?} {rest}");
    assert!(rest.contains("stopped waiting (SIGINT); processes /bin/sh left running are still recording into"), "{rest}");
    assert!(std::fs::read_to_string(d.join("info")).unwrap().contains("[calibration]"), "the trace was finished");
}

/// SIGINT and SIGQUIT ignored where `ftramp record` starts (a shell's `&`
/// job without job control, `trap '' INT`) stay ignored in the program, as
/// without the recorder: its own handler for them, installed over the
/// ignore, turned into the default action at exec, and Ctrl-C then ended
/// a program meant to ignore it.  Not ignored, they stay at the default.
#[test]
fn ignored_terminal_signals_stay_ignored_in_the_program() {
    use std::os::unix::process::CommandExt;
    for ignored in [true, false] {
        let d = dir(&format!("dispositions-{ignored}"));
        let mut c = ftramp();
        c.arg("record").arg("-o").arg(&d).arg("--").arg(tracee()).arg("dispositions");
        if ignored {
            // SAFETY: (test) signal() between fork and exec is
            // async-signal-safe.
            unsafe {
                c.pre_exec(|| {
                    libc::signal(libc::SIGINT, libc::SIG_IGN);
                    libc::signal(libc::SIGQUIT, libc::SIG_IGN);
                    Ok(())
                });
            }
        }
        let o = c.output().unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        let want = format!("sigint_ignored {}\nsigquit_ignored {}\n", ignored as u8, ignored as u8);
        assert_eq!(String::from_utf8_lossy(&o.stdout), want);
    }
}

/// `ulimit -s 44` is for the program `ftramp record` runs: ftramp's own work
/// runs on a thread with a stack of its own then, and the limit reaches the
/// program unchanged.  Until the twenty-eighth session `ftramp --version`
/// overflowed its stack under it.
#[test]
fn ftramp_works_under_a_small_stack_limit() {
    use std::os::unix::process::CommandExt;
    let small = |c: &mut Command| {
        // SAFETY: (test) setrlimit between fork and exec is async-signal-safe.
        unsafe {
            c.pre_exec(|| {
                let r = libc::rlimit { rlim_cur: 44 << 10, rlim_max: libc::RLIM_INFINITY };
                libc::setrlimit(libc::RLIMIT_STACK, &r);
                Ok(())
            });
        }
    };
    let mut c = ftramp();
    c.arg("--version");
    small(&mut c);
    let o = c.output().unwrap();
    assert!(o.status.success() && String::from_utf8_lossy(&o.stdout).starts_with("ftramp "), "{o:?}");
    // A trace read under the limit (the recorder itself needs more of the
    // program's stack than this at start: see the README).
    let d = dir("small-stack");
    let o = ftramp().args(["record", "-q", "-o"]).arg(&d).args(["--"]).arg(tracee()).arg("dispositions").output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    for cmd in ["replay", "report"] {
        let mut c = ftramp();
        c.arg(cmd).arg(&d);
        small(&mut c);
        let o = c.output().unwrap();
        assert!(o.status.success() && String::from_utf8_lossy(&o.stdout).contains("main"), "{cmd}: {o:?}");
    }
}

/// `ftramp record`'s status once it ends, within 10 s of a `signal` sent to it alone;
/// else it and the program (whose pid is in `ready`) are killed and the test fails.
fn ended_or_killed(child: &mut std::process::Child, ready: &Path, signal: &str) -> std::process::ExitStatus {
    let t0 = std::time::Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if t0.elapsed() > std::time::Duration::from_secs(10) {
            let program: i32 = std::fs::read_to_string(ready).unwrap().trim().parse().unwrap();
            // SAFETY: kill of the processes this test started.
            unsafe {
                libc::kill(program, libc::SIGKILL);
                libc::kill(child.id() as i32, libc::SIGKILL);
            }
            let _ = child.wait();
            panic!("{signal} sent to ftramp record never reached the program");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A signal ignored where `ftramp record` starts is still passed on when sent
/// to `ftramp record` alone: the program starts with it ignored (above) but
/// may install a handler of its own (lua.c does for SIGINT), and untraced it
/// would get the signal.  Until the twenty-eighth session `ftramp record`
/// ignored it too, and the program never saw it.  (perl, as POSIX shells may
/// not trap a signal ignored on entry.)
#[test]
fn a_signal_ignored_at_start_and_then_handled_by_the_program_is_passed_on() {
    use std::os::unix::process::CommandExt;
    let work = dir("ignored-pass-on-work");
    std::fs::create_dir_all(&work).unwrap();
    let (ready, got) = (work.join("ready"), work.join("got"));
    let script = r#"$SIG{INT} = sub { open(G, ">>", $ARGV[1]); print G "INT\n"; close G; exit 3 };
        open(F, ">", $ARGV[0]); print F "$$\n"; close F; select(undef, undef, undef, 0.02) while 1;"#;
    let mut c = ftramp();
    c.arg("record").arg("-o").arg(dir("ignored-pass-on")).args(["--", "perl", "-e", script]).arg(&ready).arg(&got).process_group(0);
    // SAFETY: (test) signal() between fork and exec is async-signal-safe.
    unsafe {
        c.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_IGN);
            Ok(())
        });
    }
    let mut child = c.spawn().unwrap();
    let t0 = std::time::Instant::now();
    while !ready.exists() {
        assert!(t0.elapsed() < std::time::Duration::from_secs(20), "the program did not start");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // SAFETY: kill of the child we spawned, by its pid alone.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let st = ended_or_killed(&mut child, &ready, "SIGINT");
    assert_eq!(st.code(), Some(3), "the program's status");
    assert_eq!(std::fs::read_to_string(&got).unwrap(), "INT\n", "handled once");
}

/// SIGTERM and SIGHUP sent to the process group (`timeout`, `kill -TERM
/// -PGID`, a hang-up) reach the program, which handles them as untraced;
/// `ftramp record` waits for it, exits with its status and finishes the
/// trace.  Before, they ended `ftramp record` at once: the caller saw it
/// killed by the signal while the program was still cleaning up, and the
/// trace had no `[calibration]`.  (Sent from outside the group, as here,
/// `ftramp record` passes its copy on as well: the program's trap may run
/// twice, see `a_signal_sent_to_ftramp_record_alone_reaches_the_program`.)
#[test]
fn a_terminating_signal_to_the_process_group_lets_the_program_finish() {
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    for (sig, name) in [(libc::SIGTERM, "TERM"), (libc::SIGHUP, "HUP")] {
        let d = dir(&format!("group-{name}"));
        let work = dir(&format!("group-{name}-work"));
        std::fs::create_dir_all(&work).unwrap();
        let (ready, cleaned) = (work.join("ready"), work.join("cleaned"));
        let script = format!(
            "trap 'sleep 0.3; echo done > {}; exit 3' {name}; echo > {}; while :; do sleep 0.02; done",
            cleaned.display(),
            ready.display()
        );
        let mut child = ftramp().arg("record").arg("-o").arg(&d).args(["--", "/bin/sh", "-c", &script]).process_group(0).spawn().unwrap();
        let t0 = std::time::Instant::now();
        while !ready.exists() {
            assert!(t0.elapsed() < std::time::Duration::from_secs(20), "{name}: the program did not start");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        // SAFETY: kill with the group of the child we spawned.
        assert_eq!(unsafe { libc::kill(-(child.id() as i32), sig) }, 0);
        let st = child.wait().unwrap();
        assert_eq!((st.code(), st.signal()), (Some(3), None), "{name}: the program's status");
        assert!(cleaned.exists(), "{name}: the program finished its cleanup before ftramp record returned");
        let info = std::fs::read_to_string(d.join("info")).unwrap();
        assert!(info.contains("[calibration]"), "{name}: the trace was finished: {info}");
    }
}

/// A signal sent to `ftramp record` alone by another process (a supervisor
/// that knows only the pid it started: memcached's `timedrun`, `docker
/// stop` of a container whose first process it is) is passed on to the
/// program, once, and the trace is finished; and if `ftramp record` is
/// killed, the program is too (`PR_SET_PDEATHSIG`), as it would have been
/// untraced.  Until the twenty-sixth session the program never saw the
/// signal, and after the supervisor's SIGKILL it ran on, orphaned.
#[test]
fn a_signal_sent_to_ftramp_record_alone_reaches_the_program() {
    use std::os::unix::process::CommandExt;
    let work = dir("pass-on-work");
    std::fs::create_dir_all(&work).unwrap();
    let (ready, got) = (work.join("ready"), work.join("got"));
    let wait_for = |p: &std::path::Path| {
        let t0 = std::time::Instant::now();
        while !p.exists() {
            assert!(t0.elapsed() < std::time::Duration::from_secs(20), "the program did not start");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    };
    // SIGUSR1 (and SIGUSR2, SIGALRM): until the thirtieth session it ended
    // `ftramp record`, and the program with it, unhandled.
    for (sig, name) in [(libc::SIGTERM, "TERM"), (libc::SIGINT, "INT"), (libc::SIGUSR1, "USR1")] {
        let _ = std::fs::remove_file(&ready);
        let _ = std::fs::remove_file(&got);
        let d = dir(&format!("pass-on-{name}"));
        let script = format!("trap 'echo {name} >> {}; exit 3' {name}; echo $$ > {}; while :; do sleep 0.02; done", got.display(), ready.display());
        let mut child = ftramp().arg("record").arg("-o").arg(&d).args(["--", "/bin/sh", "-c", &script]).process_group(0).spawn().unwrap();
        wait_for(&ready);
        // SAFETY: kill of the child we spawned, by its pid alone.
        assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
        let st = ended_or_killed(&mut child, &ready, &format!("SIG{name}"));
        assert_eq!(st.code(), Some(3), "SIG{name}: the program's status");
        assert_eq!(std::fs::read_to_string(&got).unwrap(), format!("{name}\n"), "SIG{name}: once");
        let info = std::fs::read_to_string(d.join("info")).unwrap();
        assert!(info.contains("[calibration]"), "SIG{name}: the trace was finished: {info}");
    }
    // SIGKILL, which `ftramp record` cannot pass on: the program dies with it.
    let _ = std::fs::remove_file(&ready);
    let d = dir("pass-on-KILL");
    let script = format!("echo $$ > {}; while :; do sleep 0.02; done", ready.display());
    let mut child = ftramp().arg("record").arg("-o").arg(&d).args(["--", "/bin/sh", "-c", &script]).process_group(0).spawn().unwrap();
    wait_for(&ready);
    let program: i32 = std::fs::read_to_string(&ready).unwrap().trim().parse().unwrap();
    // SAFETY: kill of the child we spawned.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGKILL) }, 0);
    let _ = child.wait();
    let t0 = std::time::Instant::now();
    // (Dead, or a zombie until init reaps it.)
    let alive = || std::fs::read_to_string(format!("/proc/{program}/stat")).is_ok_and(|s| !s.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'));
    while alive() && t0.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    if alive() {
        // SAFETY: kill of the program this test started.
        unsafe { libc::kill(program, libc::SIGKILL) };
        panic!("the program ran on after ftramp record was killed");
    }
}

/// As the subreaper, `ftramp record` reaps the processes the program
/// orphans while it runs (a first version waited for the program alone,
/// and the orphans that ended stayed zombies until it ended: a long-running
/// program that starts background jobs would pile them up).
#[test]
fn orphans_are_reaped_while_the_program_runs() {
    let d = dir("orphans");
    let script = "for i in 1 2 3 4 5; do (sleep 0.01 &); done; sleep 1";
    let mut child = ftramp().arg("record").arg("-o").arg(&d).args(["--", "/bin/sh", "-c", script]).spawn().unwrap();
    // The zombies whose parent is `ftramp record` (pids).
    let zombies = || -> Vec<String> {
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("status")).ok())
            .filter_map(|st| {
                let field = |k: &str| st.lines().find_map(|l| l.strip_prefix(k)).map(str::trim).unwrap_or("").to_string();
                (field("PPid:") == child.id().to_string() && field("State:").starts_with('Z')).then(|| field("Pid:"))
            })
            .collect()
    };
    std::thread::sleep(std::time::Duration::from_millis(500));
    // One that just ended may not be reaped yet on a loaded machine: a
    // zombie still there 300 ms later is one left unreaped.
    let first = zombies();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let left: Vec<String> = zombies().into_iter().filter(|p| first.contains(p)).collect();
    assert!(child.wait().unwrap().success());
    assert!(left.is_empty(), "zombies left: {left:?}");
}
