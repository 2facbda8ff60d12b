/* Functions for the fgraph tests (exectest/tests/fgraph.rs): leaving traced
 * calls with longjmp.  Built like tracee.c (the arch's patch-site flags). */
#include <setjmp.h>

#define TRACEE __attribute__((noinline, noclone, noipa))

static jmp_buf *volatile jmp_target;

/* Recursion through a volatile pointer (each level is a traced call), then
 * a longjmp out of all of them. */
long tracee_jmp_deep(long n);
static long (*volatile deep_self)(long) = tracee_jmp_deep;

TRACEE long tracee_jmp_deep(long n)
{
	if (n <= 0)
		longjmp(*jmp_target, 7);
	return deep_self(n - 1) + 1;
}

TRACEE long tracee_jmp_add(long a, long b)
{
	return a + b;
}

/* setjmp, leave n+1 traced calls by longjmp, then call a traced function
 * at the depth of the abandoned outermost one: 1400 + n. */
TRACEE long tracee_jmp_driver(long n)
{
	jmp_buf buf;
	jmp_buf *volatile saved = jmp_target;
	volatile long acc = 0;
	jmp_target = &buf;
	int r = setjmp(buf);
	if (r == 0)
		acc = tracee_jmp_deep(n);
	else
		acc = r * 100;
	acc += tracee_jmp_add(acc, n);
	jmp_target = saved;
	return acc;
}

/* The driver `iters` times from one traced caller. */
TRACEE long tracee_jmp_loop(long iters, long n)
{
	long total = 0;
	for (long i = 0; i < iters; i++)
		total += tracee_jmp_driver(n);
	return total;
}
