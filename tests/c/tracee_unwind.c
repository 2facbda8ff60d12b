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
