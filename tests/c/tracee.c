/* Functions traced by the execution tests (JIT and object).  Built with the
 * arch's patch-site flags (arch-specs/<arch>.toml `site.flags`) and
 * -fno-ipa-ra, so callers never assume a traced callee leaves caller-saved
 * registers alone. */
#define TRACEE __attribute__((noinline, noclone, noipa))

TRACEE long tracee_args(long a, long b, long c, long d, long e, long f, long g, long h, double x, double y)
{
	return a + 2 * b + 3 * c + 4 * d + 5 * e + 6 * f + 7 * g + 8 * h + (long)(x * 10.0) + (long)(y * 100.0);
}

/* Where an IPMODIFY test redirects tracee_args. */
TRACEE long tracee_args_alt(long a, long b, long c, long d, long e, long f, long g, long h, double x, double y)
{
	return -(a + b + c + d + e + f + g + h) - (long)(x + y) - 1000;
}

TRACEE double tracee_fp(double x, double y, long n)
{
	return x * y + (double)n;
}

TRACEE long tracee_two(long a, long b)
{
	return a * 1000 + b;
}

/* Recursion through a volatile pointer, so the compiler cannot turn it
 * into a loop: each level's entry and return go through the trampolines. */
long tracee_nested(long n);
static long (*volatile nested_self)(long) = tracee_nested;

TRACEE long tracee_nested(long n)
{
	if (n <= 0)
		return 1;
	long r = nested_self(n - 1);
	return r * 2 + n;
}

/* long double returns: x86_64 in the x87 register st(0) (the complex one in
 * st(0) and st(1)), aarch64 in q0, riscv64 in a0:a1, ppc64le in f1:f2 (IBM
 * double-double), s390x through memory. */
TRACEE long double tracee_ld(long double a, long double b)
{
	return a * b + 0.25L;
}

TRACEE _Complex long double tracee_cld(long double re, long double im)
{
	return __builtin_complex(re * 2, im * 3);
}
