/* The program the recorder tests record.  Built with the arch's patch-site
 * flags; each mode exercises one situation and prints the program's own
 * call counters ("name count" lines) so the tests can check the trace. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <limits.h>
#include <malloc.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>
#include <unwind.h>

static long n_fib, n_leaf, n_worker, n_spin, n_quick, n_slow, n_before, n_after, n_child;

__attribute__((noinline)) long rec_leaf(long x) { __atomic_add_fetch(&n_leaf, 1, __ATOMIC_RELAXED); return x * 3 + 1; }

__attribute__((noinline)) long rec_fib(long n)
{
    __atomic_add_fetch(&n_fib, 1, __ATOMIC_RELAXED);
    if (n < 2)
        return rec_leaf(n);
    return rec_fib(n - 1) + rec_fib(n - 2);
}

__attribute__((noinline)) void *rec_worker(void *arg)
{
    __atomic_add_fetch(&n_worker, 1, __ATOMIC_RELAXED);
    long k = (long)arg, s = 0;
    for (int i = 0; i < 50; i++)
        s += rec_fib(k);
    return (void *)s;
}

__attribute__((noinline)) void rec_spin(long ns)
{
    __atomic_add_fetch(&n_spin, 1, __ATOMIC_RELAXED);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    do
        clock_gettime(CLOCK_MONOTONIC, &b);
    while ((b.tv_sec - a.tv_sec) * 1000000000L + (b.tv_nsec - a.tv_nsec) < ns);
}

__attribute__((noinline)) void rec_quick(void) { __atomic_add_fetch(&n_quick, 1, __ATOMIC_RELAXED); rec_leaf(1); }
__attribute__((noinline)) void rec_slow(void) { __atomic_add_fetch(&n_slow, 1, __ATOMIC_RELAXED); rec_quick(); rec_spin(2000000); }
__attribute__((noinline)) void rec_before(void) { n_before++; rec_leaf(2); }
__attribute__((noinline)) void rec_after(void) { n_after++; rec_leaf(3); }
__attribute__((noinline)) void rec_child(void) { n_child++; rec_leaf(4); }

__attribute__((noinline)) long rec_deep(long n) { return n > 0 ? rec_deep(n - 1) + 1 : 0; }

__attribute__((noinline)) void rec_crash(volatile int *p) { rec_before(); *p = 1; }

/* Recursion n deep whose innermost call spins 2 ms, and a quick call
 * beside it at each level (a sibling, not an ancestor, of the long one). */
__attribute__((noinline)) long rec_deep_slow(long n)
{
    if (n == 0) {
        rec_spin(2000000);
        return 0;
    }
    long r = rec_deep_slow(n - 1);
    rec_leaf(n);
    __asm__ volatile("" ::: "memory");
    return r + 1;
}

/* The room a PTHREAD_STACK_MIN thread has below its start routine (glibc
 * takes the static TLS of every library out of a thread's stack). */
__attribute__((noinline)) void *rec_stack_room(void *arg)
{
    pthread_attr_t at;
    void *lo;
    size_t size;
    char here;
    pthread_getattr_np(pthread_self(), &at);
    pthread_attr_getstack(&at, &lo, &size);
    pthread_attr_destroy(&at);
    rec_leaf(1);
    *(long *)arg = (long)((uintptr_t)&here - (uintptr_t)lo);
    return NULL;
}

/* Threads sleeping in calls Linux does not restart after a signal handler
 * (nanosleep, poll): counted when one returns EINTR. */
static long n_eintr_sleep, n_eintr_poll;

__attribute__((noinline)) void *rec_sleeper(void *arg)
{
    rec_leaf(1);
    struct timespec ts = { 1, 0 };
    if (nanosleep(&ts, NULL) != 0 && errno == EINTR)
        __atomic_add_fetch(&n_eintr_sleep, 1, __ATOMIC_RELAXED);
    return arg;
}

__attribute__((noinline)) void *rec_poller(void *arg)
{
    rec_leaf(2);
    if (poll(NULL, 0, 1000) < 0 && errno == EINTR)
        __atomic_add_fetch(&n_eintr_poll, 1, __ATOMIC_RELAXED);
    return arg;
}

/* Writes to a pipe whose reader is gone (SIGPIPE). */
__attribute__((noinline)) void rec_write_pipe(int fd)
{
    if (write(fd, "x", 1) < 0)
        perror("write");
}

/* Runs on after main has called pthread_exit. */
__attribute__((noinline)) void *rec_late_worker(void *arg)
{
    usleep(100000);
    for (int i = 0; i < 10; i++)
        rec_after();
    return arg;
}

/* An at_quick_exit handler that calls a traced function. */
static void rec_at_quick_exit(void) { rec_leaf(7); }

static pthread_barrier_t many_barrier;

/* One leaf call before the barrier (the thread holds a buffer), three after. */
__attribute__((noinline)) void *rec_many_worker(void *arg)
{
    __atomic_add_fetch(&n_worker, 1, __ATOMIC_RELAXED);
    rec_leaf(1);
    pthread_barrier_wait(&many_barrier);
    for (int i = 0; i < 3; i++)
        rec_leaf(i);
    return arg;
}

static volatile int spinning_stop;
static long n_spun[2];

__attribute__((noinline)) void *rec_spinner(void *arg)
{
    long i = (long)arg;
    while (!spinning_stop) {
        rec_leaf(i);
        __atomic_add_fetch(&n_spun[i], 1, __ATOMIC_RELEASE);
    }
    return NULL;
}
__attribute__((noinline)) void rec_abort(void) { rec_before(); abort(); }

/* Whether the patch site at the start of `fn` calls a trampoline now. */
static int patched(const void *fn)
{
#if defined(__x86_64__)
    /* `call` to the trampoline, or `jmp` to the site's stub (the default:
     * README "Stub entry"). */
    unsigned char b = *(const volatile unsigned char *)fn;
    return b == 0xe8 || b == 0xe9;
#elif defined(__aarch64__)
    /* Both words: the patcher writes `mov x9, x30` before the `bl`. */
    const volatile unsigned *w = fn;
    return w[0] != 0xd503201f && w[1] != 0xd503201f;
#else
    return 1;
#endif
}

static jmp_buf rec_jb;
static long n_jump;

/* Recurses n levels, then longjmps out of all of them. */
__attribute__((noinline)) void rec_jump(long n)
{
    __atomic_add_fetch(&n_jump, 1, __ATOMIC_RELAXED);
    if (n == 0)
        longjmp(rec_jb, 1);
    rec_jump(n - 1);
    __asm__ volatile("" ::: "memory"); /* not a tail call */
}

/* "coroutine": a coroutine on its own stack (swapcontext) that yields
 * inside traced calls while main steps it from inside traced calls. */
static ucontext_t rec_uc_main, rec_uc_co;
static long n_co_yield, n_co_step;

__attribute__((noinline)) void rec_co_yield(void)
{
    n_co_yield++;
    swapcontext(&rec_uc_co, &rec_uc_main);
}

__attribute__((noinline)) void rec_co_body(void)
{
    for (long i = 0; i < 5; i++) {
        rec_leaf(i);
        rec_co_yield();
    }
}

__attribute__((noinline)) void rec_co_step(void)
{
    n_co_step++;
    swapcontext(&rec_uc_main, &rec_uc_co);
}

static long n_signal;

/* SIGPROF handler: a traced call on top of whatever was interrupted. */
static void rec_on_signal(int sig)
{
    (void)sig;
    n_signal++;
    rec_leaf(sig);
}

/* "first-in-handler": each thread's first traced call (and first event)
 * is a signal handler's, made while the thread is inside malloc/free of
 * blocks that take its arena's lock.  Nothing on that path may allocate. */
#define NOTRACE __attribute__((no_instrument_function, patchable_function_entry(0, 0)))
static volatile long first_done;

static void rec_on_first(int sig)
{
    rec_leaf(sig);
    __atomic_add_fetch(&first_done, 1, __ATOMIC_SEQ_CST);
}

NOTRACE static void *malloc_loop(void *arg)
{
    long want = (long)arg;
    while (__atomic_load_n(&first_done, __ATOMIC_SEQ_CST) < want)
        free(memset(malloc(48 << 10), 1, 64));
    return NULL;
}

NOTRACE static int first_in_handler(int threads)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = rec_on_first;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGUSR2, &sa, NULL);
    for (long i = 1; i <= threads; i++) {
        pthread_t t;
        pthread_create(&t, NULL, malloc_loop, (void *)i);
        struct timespec ms3 = { 0, 3000000 }, ms1 = { 0, 1000000 };
        nanosleep(&ms3, NULL);
        pthread_kill(t, SIGUSR2);
        for (int w = 0; w < 20000 && first_done < i; w++)
            nanosleep(&ms1, NULL);
        if (first_done < i) {
            static const char msg[] = "deadlock: a thread's first traced call, from a signal handler, never returned\n";
            write(2, msg, sizeof msg - 1);
            _exit(3);
        }
        pthread_join(t, NULL);
    }
    return 0;
}

/* Handlers that clean up, restore the default action and raise the signal
 * again, to die by it as untraced: through signal() and sigaction(). */
__attribute__((noinline)) void rec_reraise_signal(int sig)
{
    rec_before();
    signal(sig, SIG_DFL);
    raise(sig);
}

__attribute__((noinline)) void rec_reraise_sigaction(int sig)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    rec_before();
    sigaction(sig, &sa, NULL);
    raise(sig);
}

/* The older calls that restore a default action: sysv_signal and sigset. */
__attribute__((noinline)) void rec_reraise_sysv(int sig)
{
    rec_before();
    sysv_signal(sig, SIG_DFL);
    raise(sig);
}

__attribute__((noinline)) void rec_reraise_sigset(int sig)
{
    rec_before();
    sigset(sig, SIG_DFL);
    raise(sig);
}

/* What signal() is in a program compiled as strict ISO C (-std=c99):
 * glibc's System V signal, one-shot, the signal not blocked in the
 * handler (zstd's abort handler re-raises so). */
extern __sighandler_t __sysv_signal(int, __sighandler_t);
__attribute__((noinline)) void rec_reraise_c99(int sig)
{
    rec_before();
    __sysv_signal(sig, SIG_DFL);
    raise(sig);
}

/* A one-shot handler (SA_RESETHAND): the kernel restores the default
 * action as it delivers the signal, so raising it again dies by it. */
__attribute__((noinline)) void rec_reraise_resethand(int sig)
{
    rec_before();
    raise(sig);
}

/* A pthread key destructor that calls traced functions at thread exit
 * (googletest's ThreadLocal deletes its values there). */
static pthread_key_t dtor_key;

__attribute__((noinline)) void rec_on_key_dtor(void *v)
{
    rec_leaf((long)v);
    rec_leaf((long)v);
}

static void *key_worker(void *arg)
{
    pthread_setspecific(dtor_key, arg);
    rec_leaf((long)arg);
    return NULL;
}

/* The write end of a pipe nobody reads (-1 if none could be made).  No
 * patch site: not part of the traces. */
__attribute__((patchable_function_entry(0, 0))) static int unread_pipe(void)
{
    int p[2];
    if (pipe(p) != 0)
        return -1;
    close(p[0]);
    return p[1];
}

static void counts(void)
{
    printf("rec_fib %ld\nrec_leaf %ld\nrec_worker %ld\nrec_spin %ld\nrec_quick %ld\nrec_slow %ld\n"
           "rec_before %ld\nrec_after %ld\nrec_child %ld\n",
           n_fib, n_leaf, n_worker, n_spin, n_quick, n_slow, n_before, n_after, n_child);
    fflush(stdout);
}

/* A coroutine switched to and from by hand-written assembly (as green
 * threads and Ruby's fibers do), which the runtime does not see: it
 * yields from two traced calls down, five times, and is resumed on. */
#if defined(__x86_64__)
void rec_asm_switch(void **save, void *to);
__asm__(".text\n.globl rec_asm_switch\n.type rec_asm_switch,@function\nrec_asm_switch:\n"
        " push %rbp\n push %rbx\n push %r12\n push %r13\n push %r14\n push %r15\n"
        " mov %rsp,(%rdi)\n mov %rsi,%rsp\n"
        " pop %r15\n pop %r14\n pop %r13\n pop %r12\n pop %rbx\n pop %rbp\n ret\n"
        ".size rec_asm_switch, . - rec_asm_switch\n");
static void *asm_main_sp, *asm_co_sp;
static long asm_value, n_asm_yield, n_asm_produce, n_asm_consume;

__attribute__((noinline)) void rec_asm_yield(long v)
{
    n_asm_yield++;
    asm_value = v;
    rec_asm_switch(&asm_co_sp, asm_main_sp);
}

__attribute__((noinline)) void rec_asm_produce(void)
{
    n_asm_produce++;
    for (long i = 0; i < 5; i++)
        rec_asm_yield(i * 7 + rec_leaf(i));
    asm_value = -1;
    for (;;)
        rec_asm_switch(&asm_co_sp, asm_main_sp);
}

__attribute__((noinline)) long rec_asm_consume(long v)
{
    n_asm_consume++;
    return v * 3 + rec_leaf(v);
}

/* Runs the coroutine to its end; prints the checksum and the counts. */
static int asm_coroutine(void)
{
    size_t size = 256 * 1024;
    char *stack = malloc(size);
    uint64_t *sp = (uint64_t *)(((uintptr_t)(stack + size)) & ~(uintptr_t)15);
    *--sp = 0; /* (alignment: rec_asm_produce starts as if called) */
    *--sp = (uint64_t)(uintptr_t)rec_asm_produce; /* the switch's `ret` */
    for (int i = 0; i < 6; i++)
        *--sp = 0; /* the callee-saved registers it pops */
    asm_co_sp = sp;
    long sum = 0;
    for (int i = 0; i < 7; i++) {
        rec_asm_switch(&asm_main_sp, asm_co_sp);
        sum = sum * 5 + rec_asm_consume(asm_value);
    }
    counts();
    printf("checksum %ld\nrec_asm_yield %ld\nrec_asm_produce %ld\nrec_asm_consume %ld\n", sum, n_asm_yield, n_asm_produce, n_asm_consume);
    return 0;
}
#else
static int asm_coroutine(void)
{
    printf("unsupported 1\n");
    return 0;
}
#endif

/* Forks a child that calls rec_child 7 times, prints its counts and exits
 * with 3; returns the child's exit status (100: it did not exit).  No
 * patch site: the traces are those of the modes that call it. */
__attribute__((patchable_function_entry(0, 0))) static int fork_counting_child(void)
{
    fflush(stdout);
    pid_t c = fork();
    if (c == 0) {
        for (int i = 0; i < 7; i++)
            rec_child();
        counts();
        exit(3);
    }
    int st = 0;
    waitpid(c, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 100;
}

/* "alarm-jump": the classic SIGALRM timeout.  A process-directed SIGALRM
 * every 50 us whose handler siglongjmps back into a loop of traced calls,
 * wherever it landed (often inside the recorder); then rec_tail calls,
 * every one of which the trace must hold. */
static sigjmp_buf rec_alarm_jb;
static volatile long n_alarm_jumps;
static long n_tail;

static void rec_on_alarm(int sig)
{
    (void)sig;
    n_alarm_jumps++;
    siglongjmp(rec_alarm_jb, 1);
}

__attribute__((noinline)) long rec_tail(long x) { n_tail++; return rec_leaf(x) + 1; }

static void alarm_jumps(long jumps, long tail)
{
    static struct itimerval it;
    static volatile long s;
    if (sigsetjmp(rec_alarm_jb, 1) == 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = rec_on_alarm;
        sigaction(SIGALRM, &sa, 0);
        it.it_value.tv_usec = 50;
        it.it_interval.tv_usec = 50;
        setitimer(ITIMER_REAL, &it, 0);
    }
    while (n_alarm_jumps < jumps)
        s += rec_leaf(s & 1023);
    memset(&it, 0, sizeof it);
    setitimer(ITIMER_REAL, &it, 0);
    signal(SIGALRM, SIG_IGN);
    for (long i = 0; i < tail; i++)
        s += rec_tail(i);
}

/* dlopen(path, RTLD_NOW), or the loader's message and exit status 2. */
/* Calls a plugin's function two traced frames down (they survive the
 * exceptions it catches). */
__attribute__((noinline)) long rec_plugin_inner(int (*f)(int), int n)
{
	long r = f(n);
	__asm__ volatile("" ::: "memory");
	return r;
}

__attribute__((noinline)) long rec_plugin_outer(int (*f)(int), int n)
{
	long r = rec_plugin_inner(f, n);
	__asm__ volatile("" ::: "memory");
	return r;
}

static atomic_long sigtraps;
static atomic_int trap_stop;
static void on_sigtrap(int sig)
{
    (void)sig;
    atomic_fetch_add(&sigtraps, 1);
}

__attribute__((noinline)) long rec_trap_work(long i)
{
    __asm__ volatile("" ::: "memory");
    return i + 1;
}

static void *trap_busy(void *arg)
{
    long i = 0;
    while (!atomic_load(&trap_stop))
        i = rec_trap_work(i);
    return arg;
}

static void *open_or_exit(const char *path)
{
	void *h = dlopen(path, RTLD_NOW);
	if (!h) {
		fprintf(stderr, "%s\n", dlerror());
		exit(2);
	}
	return h;
}

/* dlopen-stress: threads loading, calling and closing two libraries while
 * others call a function of the program. */
static const char *stress_libs[2];
enum { STRESS_LOADS = 40, STRESS_CALLS = 100000 };

__attribute__((noinline)) long rec_stress_work(long x)
{
	__asm__ volatile("" : "+r"(x));
	return x * 3 + 1;
}

static void *stress_loader(void *arg)
{
	long id = (long)arg, s = 0;
	for (int i = 0; i < STRESS_LOADS; i++) {
		void *h = open_or_exit(stress_libs[(i + id) % 2]);
		long (*f)(long) = (long (*)(long))dlsym(h, "reclib_sum");
		if (f)
			s += f(10);
		dlclose(h);
	}
	return (void *)s;
}

static void *stress_caller(void *arg)
{
	long s = 0;
	(void)arg;
	for (long i = 0; i < STRESS_CALLS; i++)
		s += rec_stress_work(i);
	return (void *)s;
}

static _Unwind_Reason_Code count_frame(struct _Unwind_Context *ctx, void *arg)
{
    (void)ctx;
    ++*(int *)arg;
    return _URC_NO_REASON;
}

/* backtrace() three traced frames down: glibc reaches libgcc's unwinder
   through its own dlsym, past the runtime's GOT hooks on _Unwind_*; and
   _Unwind_Backtrace through this program's GOT, which they hook. */
__attribute__((noinline)) int rec_bt_inner(void)
{
    /* A buffer longer than the walk, and one it fills (100 n + m); the
       frames _Unwind_Backtrace passes (10000 k). */
    void *frames[128], *few[4];
    int k = 0;
    _Unwind_Backtrace(count_frame, &k);
    int n = k * 10000 + backtrace(frames, 128) * 100 + backtrace(few, 4);
    __asm__ volatile("" ::: "memory");
    return n;
}

__attribute__((noinline)) int rec_bt_middle(void)
{
    int n = rec_bt_inner();
    __asm__ volatile("" ::: "memory");
    return n;
}

__attribute__((noinline)) int rec_bt_outer(void)
{
    int n = rec_bt_middle();
    __asm__ volatile("" ::: "memory");
    return n;
}

/* A crash handler that calls traced functions, then ends the process in a
   way no flush follows (as a watchdog's SIGKILL, or a handler that faults
   or hangs, would). */
static void rec_crash_then_kill(int sig, siginfo_t *info, void *ctx)
{
    (void)sig, (void)info, (void)ctx;
    rec_fib(5);
    kill(getpid(), SIGKILL);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "threads";
    if (!strcmp(mode, "threads")) {
        /* 4 threads + main, recursion. */
        pthread_t t[4];
        for (long i = 0; i < 4; i++)
            pthread_create(&t[i], NULL, rec_worker, (void *)(6 + i));
        rec_worker((void *)5);
        for (int i = 0; i < 4; i++)
            pthread_join(t[i], NULL);
        counts();
        return 0;
    }
    if (!strcmp(mode, "many-threads")) {
        /* N threads alive at once (a barrier holds them), each with events
         * in its buffer: more than the pool's old default of 256 buffers. */
        int n = argc > 2 ? atoi(argv[2]) : 300;
        pthread_t *t = calloc(n, sizeof *t);
        pthread_barrier_init(&many_barrier, NULL, n + 1);
        for (long i = 0; i < n; i++)
            if (pthread_create(&t[i], NULL, rec_many_worker, NULL)) {
                perror("pthread_create");
                return 1;
            }
        pthread_barrier_wait(&many_barrier);
        for (int i = 0; i < n; i++)
            pthread_join(t[i], NULL);
        free(t);
        counts();
        return 0;
    }
    if (!strcmp(mode, "signals")) {
        /* A profiling timer whose handler calls a traced function while
         * main is inside traced functions (and, now and then, inside the
         * recorder's callbacks). */
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = rec_on_signal;
        sa.sa_flags = SA_RESTART;
        sigaction(SIGPROF, &sa, NULL);
        struct itimerval it = { { 0, 50 }, { 0, 50 } };
        setitimer(ITIMER_PROF, &it, NULL);
        long s = 0;
        for (int i = 0; i < 40; i++)
            s += rec_fib(18);
        struct itimerval off = { { 0, 0 }, { 0, 0 } };
        setitimer(ITIMER_PROF, &off, NULL);
        counts();
        printf("rec_signal %ld\n", n_signal);
        return s == 0;
    }
    if (!strcmp(mode, "first-in-handler")) {
        first_in_handler(argc > 2 ? atoi(argv[2]) : 20);
        counts();
        printf("rec_on_first %ld\n", first_done);
        return 0;
    }
    if (!strcmp(mode, "daemon")) {
        /* daemon(3): the parent's calls before it, the child's after. */
        rec_before();
        for (int i = 0; i < 10; i++)
            rec_leaf(i);
        printf("parent_pid %ld\n", (long)getpid());
        fflush(stdout);
        if (daemon(1, 1) != 0)
            return 1;
        for (int i = 0; i < 10; i++)
            rec_after();
        return 0;
    }
    if (!strcmp(mode, "asm-coroutine"))
        return asm_coroutine();
    if (!strcmp(mode, "longjmp")) {
        /* Three times: 4 nested rec_jump calls left by longjmp, then a
         * rec_leaf call from main. */
        for (long i = 0; i < 3; i++) {
            if (!setjmp(rec_jb))
                rec_jump(3);
            rec_leaf(i);
        }
        counts();
        printf("rec_jump %ld\n", n_jump);
        return 0;
    }
    if (!strcmp(mode, "coroutine")) {
        size_t size = 256 * 1024;
        getcontext(&rec_uc_co);
        rec_uc_co.uc_stack.ss_sp = malloc(size);
        rec_uc_co.uc_stack.ss_size = size;
        rec_uc_co.uc_link = &rec_uc_main;
        makecontext(&rec_uc_co, rec_co_body, 0);
        for (int i = 0; i < 6; i++) {
            rec_co_step();
            rec_leaf(100 + i);
        }
        counts();
        printf("rec_co_yield %ld\nrec_co_step %ld\n", n_co_yield, n_co_step);
        return 0;
    }
    if (!strcmp(mode, "alarm-jump")) {
        alarm_jumps(200, 1000);
        printf("rec_tail %ld\nrec_alarm_jumps %ld\n", n_tail, n_alarm_jumps);
        return 0;
    }
    if (!strcmp(mode, "stack-room")) {
        pthread_attr_t at;
        pthread_t t;
        long room = 0;
        pthread_attr_init(&at);
        pthread_attr_setstacksize(&at, PTHREAD_STACK_MIN);
        pthread_create(&t, &at, rec_stack_room, &room);
        pthread_join(t, NULL);
        printf("stack_room %ld\n", room);
        counts();
        return 0;
    }
    if (!strcmp(mode, "first-fd")) {
        /* The descriptor a program's first open gets. */
        int f = open("/dev/null", O_RDONLY);
        printf("first_fd %d\n", f);
        rec_leaf(f);
        counts();
        return 0;
    }
    if (!strcmp(mode, "close-fds")) {
        /* A daemon's start: close every descriptor above 2, then open files
         * of its own, here onto every number up to FILL (the trace's files
         * were somewhere among them), and call traced functions; each file
         * must end up holding its own data only.  Prints the first
         * descriptor an open returns after the closes. */
        int fill = argc > 3 ? atoi(argv[3]) : 0;
        if (fill >= 1023) {
            /* The usual limit, so that the table is full. */
            struct rlimit rl;
            getrlimit(RLIMIT_NOFILE, &rl);
            rl.rlim_cur = 1024;
            setrlimit(RLIMIT_NOFILE, &rl);
        }
        for (int fd = 3; fd < 1024; fd++)
            close(fd);
        int f = open(argv[2], O_CREAT | O_TRUNC | O_WRONLY | O_APPEND, 0644);
        printf("first_fd %d\n", f);
        for (int fd = f + 1; fd <= fill; fd++)
            if (dup2(f, fd) < 0)
                break;
        for (long i = 0; i < 20000; i++)
            rec_leaf(i);
        /* The writer thread (it polls every millisecond) writes the full
         * chunks while the program holds the numbers. */
        usleep(200000);
        static const char data[] = "the program's own data\n";
        write(f, data, sizeof data - 1);
        for (int fd = 3; fd <= (fill > f ? fill : f); fd++)
            close(fd);
        counts();
        return 0;
    }
    if (!strcmp(mode, "loop")) {
        /* Many short calls on one thread (lost events with tiny buffers). */
        long n = argc > 2 ? atol(argv[2]) : 100000;
        for (long i = 0; i < n; i++)
            rec_leaf(i);
        counts();
        return 0;
    }
    if (!strcmp(mode, "duration")) {
        /* rec_slow (2 ms, calls rec_quick and rec_spin) and rec_quick alone. */
        for (int i = 0; i < 3; i++) {
            rec_slow();
            rec_quick();
        }
        counts();
        return 0;
    }
    if (!strcmp(mode, "backtrace")) {
        printf("frames %d\n", rec_bt_outer());
        printf("frames again %d\n", rec_bt_outer());
        return 0;
    }
    if (!strcmp(mode, "titled-daemon")) {
        /* A daemon that sets its process title as nginx, postgres and sshd
           do: it moves its environment elsewhere and writes the title over
           the argv+environ block, so /proc/PID/environ no longer shows the
           variables it started with.  The launcher exits once the title is
           set; the daemon calls rec_fib and ends 1.5 s later. */
        int p[2];
        char c;
        if (pipe(p) != 0)
            return 1;
        if (fork() > 0)
            return read(p[0], &c, 1) == 1 ? 0 : 1;
        extern char **environ;
        char *start = argv[0], *end = argv[argc - 1] + strlen(argv[argc - 1]);
        size_t n = 0;
        for (; environ[n]; n++)
            end = environ[n] + strlen(environ[n]);
        char **copy = malloc((n + 1) * sizeof *copy);
        for (size_t i = 0; i < n; i++)
            copy[i] = strdup(environ[i]);
        copy[n] = NULL;
        environ = copy;
        memset(start, 0, end - start);
        strcpy(start, "rec_tracee: daemon");
        if (write(p[1], "x", 1) != 1)
            return 1;
        rec_fib(10);
        usleep(1500 * 1000);
        return 0;
    }
    if (!strcmp(mode, "fork")) {
        rec_before();
        int code = fork_counting_child();
        rec_after();
        counts();
        return code;
    }
    if (!strcmp(mode, "main-pthread-exit")) {
        /* main ends with pthread_exit; a worker ends the process later. */
        pthread_t t;
        rec_before();
        pthread_create(&t, NULL, rec_late_worker, NULL);
        pthread_exit(NULL);
    }
    if (!strcmp(mode, "exit-via")) {
        /* The ways out of a process besides exit and return from main. */
        for (int i = 0; i < 10; i++)
            rec_after();
        counts();
        fflush(stdout);
        const char *how = argc > 2 ? argv[2] : "";
        if (!strcmp(how, "_Exit"))
            _Exit(3);
        if (!strcmp(how, "quick_exit")) {
            at_quick_exit(rec_at_quick_exit);
            quick_exit(4);
        }
        if (!strcmp(how, "exit_group"))
            syscall(SYS_exit_group, 5);
        return 1;
    }
    if (!strcmp(mode, "exec") || !strcmp(mode, "chdir-exec")) {
        /* chdir-exec: a program that changes its directory, then execs. */
        if (!strcmp(mode, "chdir-exec") && chdir("/") != 0)
            return 3;
        rec_before();
        counts();
        char *args[] = {argv[0], "exec-child", NULL};
        execv("/proc/self/exe", args);
        perror("execv");
        return 1;
    }
    if (!strcmp(mode, "execl") || !strcmp(mode, "execle") || !strcmp(mode, "execlp")) {
        /* The variadic exec functions, with more arguments than fit in registers. */
        extern char **environ;
        rec_before();
        counts();
        if (!strcmp(mode, "execl"))
            execl("/proc/self/exe", argv[0], "exec-child", "a", "b", "c", "d", "e", "f", "g", (char *)NULL);
        else if (!strcmp(mode, "execle"))
            execle("/proc/self/exe", argv[0], "exec-child", "a", "b", "c", "d", "e", "f", "g", (char *)NULL, environ);
        else
            execlp(argv[0], argv[0], "exec-child", "a", "b", "c", "d", "e", "f", "g", (char *)NULL);
        perror(mode);
        return 1;
    }
    if (!strcmp(mode, "fexecve") || !strcmp(mode, "execveat")) {
        /* The exec calls that take a descriptor, with an empty environment. */
        rec_before();
        counts();
        char *args[] = {argv[0], "exec-child", NULL};
        char *env[] = {NULL};
        if (!strcmp(mode, "fexecve")) {
            int fd = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
            if (fd < 0)
                return 3;
            fexecve(fd, args, env);
        } else {
            int dir = open("/proc/self", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
            if (dir < 0)
                return 3;
            execveat(dir, "exe", args, env, 0);
        }
        perror(mode);
        return 1;
    }
    if (!strcmp(mode, "exec-own-preload")) {
        /* An exec with an LD_PRELOAD of the program's own (git's test
           suite sets libc_malloc_debug.so.0): still recorded, and the
           program's preload still loaded (the child prints whether). */
        rec_before();
        counts();
        setenv("LD_PRELOAD", "libm.so.6", 1);
        char *args[] = {argv[0], "exec-child-preload", NULL};
        execv("/proc/self/exe", args);
        perror("execv");
        return 1;
    }
    if (!strcmp(mode, "exec-child-preload")) {
        const char *p = getenv("LD_PRELOAD");
        printf("preload %s\n", p && strstr(p, "libm.so.6") ? "kept" : "lost");
        for (int i = 0; i < 5; i++)
            rec_child();
        counts();
        return 0;
    }
    if (!strcmp(mode, "exec-noenv")) {
        /* An exec with an empty environment: still recorded. */
        rec_before();
        counts();
        char *args[] = {argv[0], "exec-child", NULL};
        char *env[] = {NULL};
        execve("/proc/self/exe", args, env);
        perror("execve");
        return 1;
    }
    if (!strcmp(mode, "vfork-noenv")) {
        /* A program that runs children as dash and CPython do: vfork, then
           exec with an environment of its own.  Each child is recorded, and
           what the recorder makes for the exec in the child (the parent's
           memory) does not pile up in the parent. */
        int n = argc > 2 ? atoi(argv[2]) : 20;
        char *args[] = {argv[0], "exec-child", NULL};
        char *env[] = {"A=1", NULL};
        /* (The first execs fill the allocator's caches.) */
        size_t before = 0;
        for (int i = 0; i < n; i++) {
            if (i == 10)
                before = mallinfo2().uordblks;
            pid_t pid = vfork();
            if (pid == 0) {
                execve("/proc/self/exe", args, env);
                _exit(127);
            }
            int st;
            if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
                return 2;
        }
        printf("heap_growth %ld\n", (long)(mallinfo2().uordblks - before));
        return 0;
    }
    if (!strcmp(mode, "exec-child")) {
        if (argc > 2 && (argc != 9 || strcmp(argv[8], "g")))
            return 9;
        for (int i = 0; i < 5; i++)
            rec_child();
        counts();
        return 0;
    }
    if (!strcmp(mode, "segv-handler-killed")) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = rec_crash_then_kill;
        sa.sa_flags = SA_SIGINFO | SA_RESETHAND | SA_NODEFER;
        sigaction(SIGSEGV, &sa, NULL);
        for (int i = 0; i < 10; i++)
            rec_after();
        counts();
        rec_crash(NULL);
        return 0;
    }
    if (!strcmp(mode, "segv")) {
        for (int i = 0; i < 10; i++)
            rec_after();
        counts();
        rec_crash(NULL);
        return 0;
    }
    if (!strcmp(mode, "deep")) {
        /* Recursion deeper than a shadow stack holds. */
        long depth = argc > 2 ? atol(argv[2]) : 5000;
        printf("rec_deep %ld\n", rec_deep(depth) + 1);
        return 0;
    }
    if (!strncmp(mode, "reraise-", 8)) {
        /* What the program sees of SIGTERM's default action, then its own
         * handler, which dies by SIGTERM. */
        struct sigaction old;
        sigaction(SIGTERM, NULL, &old);
        printf("sigterm_default %d\n", old.sa_handler == SIG_DFL && old.sa_flags == 0);
        /* sigset's view: holding answers the previous (default) action. */
        printf("sigset_hold_default %d\n", sigset(SIGTERM, SIG_HOLD) == SIG_DFL);
        sigrelse(SIGTERM);
        void (*h)(int) = !strcmp(mode, "reraise-signal")      ? rec_reraise_signal
                         : !strcmp(mode, "reraise-sigaction") ? rec_reraise_sigaction
                         : !strcmp(mode, "reraise-sysv")      ? rec_reraise_sysv
                         : !strcmp(mode, "reraise-c99")       ? rec_reraise_c99
                         : !strcmp(mode, "reraise-resethand") ? rec_reraise_resethand
                                                              : rec_reraise_sigset;
        if (!strcmp(mode, "reraise-c99")) {
            __sysv_signal(SIGTERM, h);
        } else if (!strcmp(mode, "reraise-resethand")) {
            struct sigaction sa;
            memset(&sa, 0, sizeof sa);
            sa.sa_handler = h;
            sa.sa_flags = SA_RESETHAND;
            sigaction(SIGTERM, &sa, NULL);
        } else {
            signal(SIGTERM, h);
        }
        /* The one-shot handlers as the program sees them installed. */
        if (!strcmp(mode, "reraise-c99") || !strcmp(mode, "reraise-resethand")) {
            sigaction(SIGTERM, NULL, &old);
            printf("one_shot_seen %d\n", old.sa_handler == h && (old.sa_flags & SA_RESETHAND) != 0 && !(old.sa_flags & SA_SIGINFO));
        }
        for (int i = 0; i < 10; i++)
            rec_after();
        counts();
        fflush(stdout);
        raise(SIGTERM);
        return 0;
    }
    if (!strcmp(mode, "deep-fork")) {
        /* Calls the parent cannot record (deeper than a shadow stack),
         * then a child that records all of its own. */
        printf("rec_deep %ld\n", rec_deep(5000) + 1);
        return fork_counting_child();
    }
    if (!strcmp(mode, "segv-threads")) {
        /* Crash on main while two threads call rec_leaf in a loop: each has
         * finished at least 1000 calls by then. */
        pthread_t t[2];
        for (long i = 0; i < 2; i++)
            pthread_create(&t[i], NULL, rec_spinner, (void *)i);
        while (__atomic_load_n(&n_spun[0], __ATOMIC_ACQUIRE) < 1000 || __atomic_load_n(&n_spun[1], __ATOMIC_ACQUIRE) < 1000)
            usleep(1000);
        rec_crash(NULL);
        return 0;
    }
    if (!strcmp(mode, "sigpipe")) {
        /* `prog | head`: a write to a pipe nobody reads ends the program. */
        int w = unread_pipe();
        if (w < 0)
            return 2;
        for (int i = 0; i < 10; i++)
            rec_after();
        counts();
        fflush(stdout);
        rec_before();
        rec_write_pipe(w);
        return 0;
    }
    if (!strcmp(mode, "abort")) {
        for (int i = 0; i < 10; i++)
            rec_after();
        counts();
        rec_abort();
        return 0;
    }
    if (!strcmp(mode, "dispositions")) {
        /* Whether SIGINT and SIGQUIT are ignored (inherited across exec). */
        struct sigaction i, q;
        sigaction(SIGINT, NULL, &i);
        sigaction(SIGQUIT, NULL, &q);
        rec_leaf(1);
        printf("sigint_ignored %d\nsigquit_ignored %d\n", i.sa_handler == SIG_IGN, q.sa_handler == SIG_IGN);
        return 0;
    }
    if (!strcmp(mode, "fd-reuse")) {
        /* For a number of seconds: free descriptor 3, then dup2 onto it a
         * pipe that holds one byte, read the byte back, close.  Another
         * thread taking the lowest free descriptor meanwhile makes dup2
         * fail (EBUSY), or the read find nothing. */
        long secs = atol(argv[2]), rounds = 0, busy = 0, bad = 0;
        time_t end = time(NULL) + secs;
        while (time(NULL) < end) {
            for (int k = 0; k < 1000; k++, rounds++) {
                int p[2];
                char c;
                if (pipe(p) != 0 || write(p[1], "x", 1) != 1)
                    return 2;
                close(p[1]);
                dup2(p[0], 10);
                close(p[0]);
                if (dup2(10, 3) != 3) {
                    busy++;
                    close(10);
                    continue;
                }
                close(10);
                if (read(3, &c, 1) != 1 || c != 'x')
                    bad++;
                close(3);
                rec_leaf(k);
            }
        }
        printf("fd_reuse_failures %ld\n", busy + bad);
        fprintf(stderr, "%ld rounds\n", rounds);
        return 0;
    }
    if (!strcmp(mode, "kill-children")) {
        /* N children, each sent SIGTERM by the parent: "at-start" at once
         * after the fork (the child would sleep a second), "at-exit" as it
         * ends (after it said so through a pipe, while it writes its
         * trace).  Prints how many there were. */
        int at_exit = !strcmp(argv[2], "at-exit");
        long n = atol(argv[3]);
        for (long i = 0; i < n; i++) {
            int p[2];
            if (pipe(p) != 0)
                return 2;
            pid_t c = fork();
            if (c == 0) {
                close(p[0]);
                for (int k = 0; k < 200; k++)
                    rec_child();
                if (at_exit) {
                    if (write(p[1], "x", 1) != 1)
                        _exit(5);
                    _exit(0);
                }
                sleep(1);
                _exit(0);
            }
            close(p[1]);
            char x;
            if (at_exit && read(p[0], &x, 1) != 1)
                return 3;
            close(p[0]);
            kill(c, SIGTERM);
            int st = 0;
            waitpid(c, &st, 0);
            /* How it ended, as its trace is to say (128 + signal). */
            printf("end_%d %d\n", (int)c, WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st));
        }
        printf("children %ld\n", n);
        return 0;
    }
    if (!strcmp(mode, "deep-slow")) {
        long n = atol(argv[2]);
        printf("rec_deep_slow %ld\n", rec_deep_slow(n) + 1);
        counts();
        return 0;
    }
    if (!strcmp(mode, "key-dtors")) {
        /* 4 threads, each 1 call of rec_leaf and 2 more in its key's
         * destructor at its exit. */
        pthread_key_create(&dtor_key, rec_on_key_dtor);
        for (long i = 0; i < 4; i++) {
            pthread_t t;
            pthread_create(&t, NULL, key_worker, (void *)(i + 1));
            pthread_join(t, NULL);
        }
        counts();
        return 0;
    }
    if (!strcmp(mode, "die-by")) {
        /* Dies by a signal with no handler: "trap" (int3 / brk, a
         * program's own breakpoint, as googletest's break-on-failure),
         * "rtmin+3", "rtmax-3" or a number, raised. */
        const char *what = argv[2];
        for (int i = 0; i < 10; i++)
            rec_after();
        counts();
        fflush(stdout);
        if (!strcmp(what, "trap")) {
#if defined(__x86_64__)
            __asm__ volatile("int3");
#elif defined(__aarch64__)
            __asm__ volatile("brk #0");
#else
            raise(SIGTRAP);
#endif
            return 9;
        }
        if (!strcmp(what, "kill-grace")) {
            /* kill() of itself with the real-time signal the runtime took
             * for its grace periods (the first from SIGRTMAX-2 down with a
             * handler; SIGRTMAX-2 untraced), which has no handler of the
             * program's: it ends the process as untraced. */
            int grace = SIGRTMAX - 2;
            for (int s = SIGRTMAX - 2; s >= SIGRTMIN + 2; s--) {
                struct sigaction cur;
                if (sigaction(s, NULL, &cur) == 0 && cur.sa_handler != SIG_DFL) {
                    grace = s;
                    break;
                }
            }
            printf("kill_grace_sig %d\n", grace);
            fflush(stdout);
            kill(getpid(), grace);
            sleep(2);
            return 9;
        }
        int sig = !strcmp(what, "rtmin+3") ? SIGRTMIN + 3 : !strcmp(what, "rtmax-3") ? SIGRTMAX - 3 : atoi(what);
        raise(sig);
        return 9;
    }
    if (!strcmp(mode, "sigpipe-at-exit")) {
        /* Output buffered for a pipe nobody reads: exit's flush, after
         * main returned, meets SIGPIPE and the process dies by it. */
        int w = unread_pipe();
        if (w < 0)
            return 2;
        for (int i = 0; i < 3; i++)
            rec_after();
        counts();
        fflush(stdout);
        dup2(w, 1);
        printf("never read\n");
        return 0;
    }
    if (!strcmp(mode, "vfork-work")) {
        /* 5 vfork children, each calling traced functions before _exit
         * (as dash and CPython's subprocess run code between vfork and
         * exec): rec_child and 4 rec_leaf calls in each child; the parent
         * calls rec_before (and one rec_leaf in it) after each.  The
         * children run on the parent's memory and are not followed: the
         * trace has the parent's calls only. */
        long statuses = 0;
        for (int i = 0; i < 5; i++) {
            pid_t c = vfork();
            if (c == 0) {
                rec_child();
                for (int k = 0; k < 3; k++)
                    rec_leaf(k);
                _exit(3);
            }
            int st = 0;
            waitpid(c, &st, 0);
            statuses += WIFEXITED(st) ? WEXITSTATUS(st) : 100;
            rec_before();
        }
        printf("vfork_statuses %ld\nvfork_n_child %ld\nvfork_n_before %ld\n", statuses, n_child, n_before);
        return 0;
    }
    if (!strcmp(mode, "dlopen-then-fork")) {
        /* N times: load a library, fork soon after (while the runtime may
         * be handling it on another thread); the child looks a symbol up
         * and calls a traced function.  A child that has not ended after
         * 3 s is counted as hung and killed. */
        long n = atol(argv[3]), hung = 0;
        for (long i = 0; i < n; i++) {
            void *h = open_or_exit(argv[2]);
            for (long d = 0; d < (i % 7) * 300; d++)
                rec_leaf(d);
            pid_t c = fork();
            if (c == 0) {
                if (!dlsym(RTLD_DEFAULT, "printf"))
                    _exit(4);
                rec_child();
                _exit(0);
            }
            int st = 0, k;
            for (k = 0; k < 300 && waitpid(c, &st, WNOHANG) != c; k++)
                usleep(10000);
            if (k == 300) {
                hung++;
                kill(c, SIGKILL);
                waitpid(c, &st, 0);
            } else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
                printf("child_failed %d\n", st);
            }
            dlclose(h);
        }
        printf("hung %ld\n", hung);
        return 0;
    }
    if (!strcmp(mode, "fork-dlopen")) {
        /* A fork child loads a library (as a pre-forked worker does). */
        rec_before();
        fflush(stdout);
        pid_t c = fork();
        if (c == 0) {
            void *h = dlopen(argv[2], RTLD_NOW);
            if (!h)
                _exit(2);
            long (*f)(long) = (long (*)(long))dlsym(h, "reclib_sum");
            for (int i = 0; i < 2000 && !patched(f); i++)
                usleep(1000);
            printf("child_patched %d\n", patched(f));
            f(20);
            fflush(stdout);
            _exit(0);
        }
        int st = 0;
        waitpid(c, &st, 0);
        return WIFEXITED(st) ? WEXITSTATUS(st) : 100;
    }
    if (!strcmp(mode, "dlopen-sleepers")) {
        /* A library loaded (and traced) while two threads sleep. */
        pthread_t t[2];
        pthread_create(&t[0], NULL, rec_sleeper, NULL);
        pthread_create(&t[1], NULL, rec_poller, NULL);
        usleep(100000);
        void *h = open_or_exit(argv[2]);
        long (*f)(long) = (long (*)(long))dlsym(h, "reclib_sum");
        for (int i = 0; i < 500 && !patched(f); i++)
            usleep(1000);
        f(20);
        pthread_join(t[0], NULL);
        pthread_join(t[1], NULL);
        printf("eintr_sleep %ld\neintr_poll %ld\n", n_eintr_sleep, n_eintr_poll);
        counts();
        return 0;
    }
    if (!strcmp(mode, "dlopen-reload")) {
        /* Load, call at once, unload, 20 times: the library mostly comes
         * back at the same address, with its text fresh from the file. */
        long s = 0;
        for (int i = 0; i < 20; i++) {
            void *h = open_or_exit(argv[2]);
            long (*f)(long) = (long (*)(long))dlsym(h, "reclib_sum");
            s += f(20);
            dlclose(h);
        }
        printf("reload_sum %ld\n", s);
        counts();
        return 0;
    }
    if (!strcmp(mode, "rtld-next")) {
        /* From the program, RTLD_NEXT searches the objects after it: the
         * first definition of execve there is the first one at all (the
         * program has none), whether that is libc's or a preload's. */
        void *next = dlsym(RTLD_NEXT, "execve"), *first = dlsym(RTLD_DEFAULT, "execve");
        printf("next_is_first %d\n", next && next == first);
        counts();
        return 0;
    }
    if (!strcmp(mode, "dlopen-stress")) {
        /* argv[2], argv[3]: librec_lib.so and librec_ctor.so. */
        stress_libs[0] = argv[2];
        stress_libs[1] = argv[3];
        pthread_t t[5];
        for (long i = 0; i < 3; i++)
            pthread_create(&t[i], 0, stress_loader, (void *)i);
        for (long i = 3; i < 5; i++)
            pthread_create(&t[i], 0, stress_caller, 0);
        long sum = 0;
        for (int i = 0; i < 5; i++) {
            void *r;
            pthread_join(t[i], &r);
            sum += (long)r;
        }
        printf("stress_sum %ld\n", sum);
        return 0;
    }
    if (!strcmp(mode, "dlopen-plugin")) {
        /* A C++ library that throws in its static initialiser, then
         * catches exceptions under two traced frames of ours (libstdc++ is
         * in the library's scope alone: RTLD_LOCAL, and we are C). */
        void *h = open_or_exit(argv[2]);
        int (*caught)(void) = (int (*)(void))dlsym(h, "plugin_caught");
        printf("plugin_caught %d\n", caught ? caught() : -1);
        int (*catcher)(int) = (int (*)(int))dlsym(h, "plugin_catch");
        printf("plugin_later_caught %ld\n", catcher ? rec_plugin_outer(catcher, 3) : -1);
        dlclose(h);
        return 0;
    }
    if (!strcmp(mode, "dlopen-ctor")) {
        /* Load a library whose constructor calls traced functions and
         * unload it at once, with no dlsym in between: only a library
         * patched inside dlopen, before its constructor, has those calls
         * (and the destructor's and atexit handler's at the dlclose)
         * recorded.  The library prints its own counts. */
        void *h = open_or_exit(argv[2]);
        dlclose(h);
        printf("dlopen_ctor_closed 1\n");
        return 0;
    }
    if (!strcmp(mode, "dlopen-sigtrap")) {
        /* The program sets SIGTRAP's action (argv[3]: handler, ign or dfl),
           keeps a thread calling a traced function, then dlopens a library
           with sites (patched live); then a SIGTRAP of its own. */
        const char *how = argv[3];
        void (*want)(int) = !strcmp(how, "ign") ? SIG_IGN : !strcmp(how, "dfl") ? SIG_DFL : on_sigtrap;
        signal(SIGTRAP, want);
        pthread_t t;
        pthread_create(&t, 0, trap_busy, 0);
        void *h = open_or_exit(argv[2]);
        long (*f)(long) = (long (*)(long))dlsym(h, "reclib_sum");
        for (int i = 0; i < 5000 && getenv("FTRAMP_RECORD_DIR") && !(patched(f) && patched(dlsym(h, "reclib_add"))); i++)
            usleep(1000);
        long s = f(20);
        atomic_store(&trap_stop, 1);
        pthread_join(t, 0);
        struct sigaction now;
        sigaction(SIGTRAP, 0, &now);
        printf("reclib_sum %ld\nreclib_add 20\naction kept %d\ntraps before raise %ld\n", s == 210 ? 1L : -1L,
               now.sa_handler == want, atomic_load(&sigtraps));
        fflush(stdout);
        raise(SIGTRAP);
        printf("traps after raise %ld\n", atomic_load(&sigtraps));
        return 0;
    }
    if (!strcmp(mode, "dlopen")) {
        void *h = open_or_exit(argv[2]);
        long (*f)(long) = (long (*)(long))dlsym(h, "reclib_sum");
        /* The runtime's module watcher patches new libraries within ~10 ms:
         * wait for it (at most 5 s; sleeps end early on its signals). */
        if (argc > 3 && !strcmp(argv[3], "nowait")) {
            /* Not expected to be traced: give the watcher 200 ms anyway. */
            struct timespec a, b;
            clock_gettime(CLOCK_MONOTONIC, &a);
            do {
                usleep(1000);
                clock_gettime(CLOCK_MONOTONIC, &b);
            } while ((b.tv_sec - a.tv_sec) * 1000 + (b.tv_nsec - a.tv_nsec) / 1000000 < 200);
        }
        for (int i = 0; i < 5000 && !(patched(f) && patched(dlsym(h, "reclib_add"))); i++) {
            if (argc > 3)
                break;
            usleep(1000);
        }
        long s = f(20);
        rec_after();
        counts();
        printf("reclib_sum %ld\nreclib_add 20\n", s == 210 ? 1L : -1L);
        return 0;
    }
    fprintf(stderr, "unknown mode %s\n", mode);
    return 2;
}
