/* The functions the fprobe sample probes, built with patch sites. */
#define TRACEE __attribute__((noinline, noclone, noipa))

TRACEE long tracee_add(long a, long b)
{
	return a + b;
}

TRACEE long tracee_mul3(long a, long b, long c)
{
	return a * b * c;
}

/* Recursion through a volatile pointer: every level is a probed call. */
long tracee_fib(long n);
static long (*volatile fib_self)(long) = tracee_fib;

TRACEE long tracee_fib(long n)
{
	return n < 2 ? n : fib_self(n - 1) + fib_self(n - 2);
}

/* What the sample calls: sum of i + 6i for i in 1..=n, plus fib(n % 8). */
TRACEE long tracee_work(long n)
{
	long s = 0;
	for (long i = 1; i <= n; i++)
		s += tracee_add(i, tracee_mul3(i, 2, 3));
	return s + fib_self(n % 8);
}
