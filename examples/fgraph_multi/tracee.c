/* The program fgraph_multi traces (built with the arch's patch-site
 * flags): nested calls, recursion, and an empty function for the
 * benchmark. */
#define TRACEE __attribute__((noinline, noclone, noipa))

TRACEE long demo_square(long x)
{
	return x * x;
}

TRACEE long demo_sum_squares(long n)
{
	long s = 0;
	for (long i = 1; i <= n; i++)
		s += demo_square(i);
	return s;
}

/* Through a volatile pointer, so that every level is a real call (no
 * compiler turns the recursion into a loop). */
long demo_fib(long n);
static long (*volatile fib)(long) = demo_fib;

TRACEE long demo_fib(long n)
{
	return n < 2 ? n : fib(n - 1) + fib(n - 2);
}

TRACEE long demo_run(long n)
{
	return demo_sum_squares(n) + demo_fib(n);
}

/* The benchmark's tracee (the XRay side has the same body). */
TRACEE void bench_leaf(void)
{
	__asm__ volatile("" ::: "memory");
}

/* The benchmark's call tree: each bench_tree() makes three nested traced
 * calls (the code after each call keeps it a real call, not a jump), so
 * every traced call returns into a traced caller, as in real programs. */
TRACEE void bench_tree_leaf(void)
{
	__asm__ volatile("" ::: "memory");
}

TRACEE void bench_tree_mid(void)
{
	bench_tree_leaf();
	__asm__ volatile("" ::: "memory");
}

TRACEE void bench_tree(void)
{
	bench_tree_mid();
	__asm__ volatile("" ::: "memory");
}
