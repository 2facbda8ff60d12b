/* Rust panics unwinding through traced C frames, and signal handlers on an
 * alternate stack (exectest/tests/unwind.rs).  Built with the arch's
 * patch-site flags and -fexceptions (unwind tables and cleanups in C). */
#include <setjmp.h>
#include <signal.h>
#include <string.h>

#define TRACEE __attribute__((noinline, noclone, noipa))

/* --- Panics: Rust callback -> C frames with cleanups -> Rust catch_unwind. */

static long cleanups;

TRACEE long unwc_note(long v)
{
	cleanups = cleanups * 3 + v;
	return v;
}

static void run_cleanup(long *v)
{
	unwc_note(*v);
}

/* `cb` may panic: the cleanup runs (calling a traced function), the panic
 * goes on. */
TRACEE long unwc_mid(long (*cb)(long), long n)
{
	long g __attribute__((cleanup(run_cleanup))) = n;
	return cb(n) * 2 + 1;
}

TRACEE long unwc_call(long (*cb)(long), long n)
{
	long g __attribute__((cleanup(run_cleanup))) = 100 + n;
	return unwc_mid(cb, n) + 1;
}

/* `rs` is Rust code that catches a panic of frames it calls. */
TRACEE long unwc_outer(long (*rs)(long), long n)
{
	return rs(n) + 5;
}

long unwc_cleanups(void)
{
	return cleanups;
}

void unwc_reset(void)
{
	cleanups = 0;
}

/* --- Signal handlers on an alternate stack. */

TRACEE long alt_leaf(long n)
{
	return n * 3 + 1;
}

long alt_nest(long n);
static long (*volatile nest_self)(long) = alt_nest;

TRACEE long alt_nest(long n)
{
	return n <= 0 ? alt_leaf(0) : nest_self(n - 1) + alt_leaf(n);
}

static sigjmp_buf *volatile jmp_to;
static volatile long handler_runs, handler_bad;

long alt_jump(long n);
static long (*volatile jump_self)(long) = alt_jump;

/* Leaves n+1 traced frames of the handler by siglongjmp. */
TRACEE long alt_jump(long n)
{
	if (n <= 0)
		siglongjmp(*jmp_to, 1);
	return jump_self(n - 1) + 1;
}

static void on_signal(int sig)
{
	(void)sig;
	handler_runs++;
	if (alt_nest(4) != 35)
		handler_bad++;
	if (jmp_to)
		alt_jump(3);
}

long alt_raise(long n);
static long (*volatile raise_self)(long) = alt_raise;

/* Raises the signal from inside n+1 traced frames. */
TRACEE long alt_raise(long n)
{
	if (n <= 0) {
		raise(SIGUSR2);
		return alt_leaf(7);
	}
	return raise_self(n - 1) + alt_leaf(n);
}

/* alt_raise(n) with a siglongjmp out of the handler back here. */
TRACEE long alt_jmp_driver(long n)
{
	sigjmp_buf buf;
	volatile long r = 0;
	jmp_to = &buf;
	if (sigsetjmp(buf, 1) == 0)
		r = alt_raise(n);
	else
		r = 500 + alt_leaf(n);
	jmp_to = 0;
	return r;
}

/* The SA_ONSTACK handler for SIGUSR2 (0: installed). */
int alt_install(void)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_signal;
	sa.sa_flags = SA_ONSTACK;
	sigemptyset(&sa.sa_mask);
	return sigaction(SIGUSR2, &sa, 0);
}

long alt_handler_runs(void)
{
	return handler_runs;
}

long alt_handler_bad(void)
{
	return handler_bad;
}

/* --- Context switches (swapcontext, setcontext): a coroutine on its own
 * stack entered and left inside traced frames, functions that tail-call
 * the switch, and setcontext back into an earlier frame (like longjmp). */
#include <stdlib.h>
#include <sys/mman.h>
#include <ucontext.h>

static ucontext_t uc_main, uc_co, uc_here;
static long uc_produced, uc_rounds;
static volatile long uc_k;
static char uc_bss_stack[128 * 1024] __attribute__((aligned(16)));

TRACEE long uc_leaf(long x)
{
	return x * 2 + 1;
}

/* Both tail-call the switch (gcc -O2): their return address is the hook's. */
TRACEE void uc_yield(void)
{
	swapcontext(&uc_co, &uc_main);
}

TRACEE long uc_resume(void)
{
	return swapcontext(&uc_main, &uc_co);
}

TRACEE void uc_body(long n)
{
	for (long i = 0; i < n; i++) {
		uc_produced = uc_produced * 3 + uc_leaf(i);
		uc_yield();
	}
}

/* The coroutine's function (tail-calls uc_body); it ends through uc_link. */
TRACEE void uc_entry(void)
{
	uc_body(uc_rounds);
}

TRACEE long uc_step(long i)
{
	uc_resume();
	return uc_leaf(i);
}

/* A coroutine of `n` rounds on a static stack (which 0) or an mmap'ed one
 * (which 1), stepped until it ends: a checksum of what both sides saw. */
TRACEE long uc_run(long n, int which)
{
	size_t size = 128 * 1024;
	char *volatile stack = uc_bss_stack; /* (getcontext returns twice, for gcc) */
	if (which) {
		stack = mmap(0, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (stack == MAP_FAILED)
			return -1;
	}
	uc_produced = 0;
	uc_rounds = n;
	getcontext(&uc_co);
	uc_co.uc_stack.ss_sp = stack;
	uc_co.uc_stack.ss_size = size;
	uc_co.uc_link = &uc_main;
	makecontext(&uc_co, uc_entry, 0);
	long sum = 0;
	for (long i = 0; i <= n; i++)
		sum = sum * 7 + uc_step(i);
	if (which)
		munmap(stack, size);
	return sum * 1000003 + uc_produced;
}

TRACEE void uc_deep2(void)
{
	setcontext(&uc_here);
}

TRACEE void uc_deep(long k)
{
	uc_leaf(k);
	uc_deep2();
	uc_leaf(-1); /* not reached */
}

/* setcontext from deeper traced frames back to a getcontext here, n times. */
TRACEE long uc_setctx(long n)
{
	uc_k = 0;
	getcontext(&uc_here);
	if (uc_k < n) {
		uc_k++;
		uc_deep(uc_k);
	}
	return uc_k * 100 + uc_leaf(uc_k);
}

/* --- backtrace() inside traced frames on a coroutine's stack: the frames
 * it returns, to compare with an untraced run. */
#include <execinfo.h>

static int uc_bt_frames;

TRACEE int uc_bt_inner(long k)
{
	void *pc[64];
	uc_bt_frames = backtrace(pc, 64);
	__asm__ volatile("" ::: "memory"); /* (no tail call above) */
	return uc_bt_frames + (int)uc_leaf(k);
}

TRACEE int uc_bt_outer(long k)
{
	int r = uc_bt_inner(k);
	__asm__ volatile("" ::: "memory");
	return r;
}

static void uc_bt_entry(void)
{
	uc_bt_outer(1);
}

/* Runs `entry` to its end as a coroutine on `stack` (`size` bytes):
 * entered with swapcontext, back here through uc_link.  Also for
 * tracee_unwind.cpp's exceptions on a coroutine's stack. */
void uc_run_on_stack(void (*entry)(void), char *stack, size_t size)
{
	ucontext_t back, co;
	getcontext(&co);
	co.uc_stack.ss_sp = stack;
	co.uc_stack.ss_size = size;
	co.uc_link = &back;
	makecontext(&co, entry, 0);
	swapcontext(&back, &co);
}

/* backtrace()'s frame count two traced calls down on a coroutine's mmap'ed
 * stack (which 1) or on the thread's stack (which 0). */
TRACEE long uc_backtrace(int which)
{
	size_t size = 128 * 1024;
	if (!which) {
		uc_bt_outer(1);
		return uc_bt_frames;
	}
	char *stack = mmap(0, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (stack == MAP_FAILED)
		return -1;
	uc_run_on_stack(uc_bt_entry, stack, size);
	munmap(stack, size);
	return uc_bt_frames;
}

/* --- siglongjmp out of signal handlers that interrupted the runtime: a
 * thread loops over traced calls while another sends it SIGUSR1 every few
 * microseconds; the handler siglongjmps back into the loop, so some
 * signals land inside a trampoline, fgraph or a callback, which are left
 * for good.  The runtime must notice and trace on. */
#include <pthread.h>
#include <time.h>

static sigjmp_buf sj_buf;
static volatile long sj_jumps;
static volatile int sj_stop;

static void sj_handler(int sig)
{
	(void)sig;
	sj_jumps++;
	siglongjmp(sj_buf, 1);
}

TRACEE long sj_leaf(long x)
{
	return x * 3 + 1;
}

TRACEE long sj_mid(long x)
{
	return sj_leaf(x) + sj_leaf(x + 1);
}

static void *sj_sender(void *arg)
{
	pthread_t target = *(pthread_t *)arg;
	struct timespec ts = {0, 5000};
	while (!sj_stop) {
		pthread_kill(target, SIGUSR1);
		nanosleep(&ts, 0);
	}
	return 0;
}

/* Loops until `jumps` handlers have jumped back: the jumps made. */
long sj_run(long jumps)
{
	static struct sigaction sa, old;
	static pthread_t self, sender;
	static volatile long s;
	sj_jumps = 0;
	sj_stop = 0;
	s = 0;
	/* The jump target first: no handler runs before it is set. */
	static sigset_t usr1;
	sigemptyset(&usr1);
	sigaddset(&usr1, SIGUSR1);
	if (sigsetjmp(sj_buf, 1) == 0) {
		memset(&sa, 0, sizeof sa);
		sa.sa_handler = sj_handler;
		sigaction(SIGUSR1, &sa, &old);
		self = pthread_self();
		/* (Blocked until `sender` is written.) */
		pthread_sigmask(SIG_BLOCK, &usr1, 0);
		pthread_create(&sender, 0, sj_sender, &self);
		pthread_sigmask(SIG_UNBLOCK, &usr1, 0);
	}
	while (sj_jumps < jumps)
		s += sj_mid(s & 1023);
	/* (A handler jumping back now finds the loop done again.) */
	pthread_sigmask(SIG_BLOCK, &usr1, 0);
	sj_stop = 1;
	pthread_join(sender, 0);
	/* Drops the signals still pending, then puts everything back. */
	sa.sa_handler = SIG_IGN;
	sigaction(SIGUSR1, &sa, 0);
	sigaction(SIGUSR1, &old, 0);
	pthread_sigmask(SIG_UNBLOCK, &usr1, 0);
	return sj_jumps;
}
