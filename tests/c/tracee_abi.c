/* C calling-convention cases for the ABI tests (exectest/tests/abi.rs and
 * jit.rs), built with the arch's patch-site flags.  Each case is a way the
 * psABIs pass arguments or return values that the trampolines must keep
 * intact while callbacks run: variadic calls (x86_64 passes the number of
 * vector registers used in %al), aggregates returned through a hidden
 * pointer (x86_64 %rdi in and %rax out, aarch64 x8, others in the first
 * argument register), homogeneous float aggregates (aarch64 v0-v3, ppc64le
 * f1-f4), mixed integer/float pairs (x86_64 rax+xmm0, riscv64 a0+fa0),
 * packed floats, __int128, complex values, and arguments on the stack.
 * The driver that calls them is abi_driver.c, built without sites. */
#include <stdarg.h>
#include "abi.h"

#define TRACEE __attribute__((noinline, noclone, noipa))

TRACEE double abi_vsum(int n, ...)
{
	va_list ap;
	double s = 0;
	va_start(ap, n);
	for (int i = 0; i < n; i++)
		s = s * 3 + va_arg(ap, double);
	va_end(ap);
	return s;
}

TRACEE long abi_vmix(int n, ...)
{
	va_list ap;
	long s = 0;
	va_start(ap, n);
	for (int i = 0; i < n; i++)
		s = s * 7 + ((i & 1) ? (long)(va_arg(ap, double) * 16) : va_arg(ap, long));
	va_end(ap);
	return s;
}

TRACEE struct abi_big abi_sret(long x, long y)
{
	struct abi_big r;
	for (int i = 0; i < 6; i++)
		r.v[i] = x * (i + 1) - y * i;
	return r;
}

TRACEE long abi_big_arg(struct abi_big b, long k)
{
	long s = k;
	for (int i = 0; i < 6; i++)
		s = s * 5 + b.v[i];
	return s;
}

TRACEE struct abi_hfa abi_hfa_ret(double x)
{
	struct abi_hfa r = { x, x * 2 + 0.5, x * 3 + 0.25, -x };
	return r;
}

TRACEE double abi_hfa_arg(struct abi_hfa h, double k)
{
	return ((h.a * 2 + h.b) * 2 + h.c) * 2 + h.d + k;
}

TRACEE struct abi_mixed abi_mixed_ret(long i, double d)
{
	struct abi_mixed r = { i * 3 + 1, d / 4 };
	return r;
}

TRACEE struct abi_fpair abi_fpair_ret(float x, float y)
{
	struct abi_fpair r = { x + y, x * y };
	return r;
}

TRACEE struct abi_pair abi_pair_ret(long a, long b)
{
	struct abi_pair r = { a - b, a * b };
	return r;
}

TRACEE __int128 abi_i128(__int128 a, __int128 b)
{
	return a * 3 + (b << 7);
}

TRACEE _Complex double abi_cplx(double re, double im)
{
	return __builtin_complex(re * im, re - im);
}

TRACEE float abi_float(float a, float b, float c)
{
	return a * b - c;
}

/* Ten integer and ten floating-point arguments: the last ones are on the
 * stack on every arch. */
TRACEE double abi_stack_args(long a0, long a1, long a2, long a3, long a4, long a5, long a6, long a7, long a8, long a9,
			     double d0, double d1, double d2, double d3, double d4, double d5, double d6, double d7,
			     double d8, double d9)
{
	long l[10] = { a0, a1, a2, a3, a4, a5, a6, a7, a8, a9 };
	double d[10] = { d0, d1, d2, d3, d4, d5, d6, d7, d8, d9 };
	double s = 0;
	for (int i = 0; i < 10; i++)
		s = s * 1.5 + (double)l[i] * (i + 1) + d[i] * (i + 3);
	return s;
}

/* A sibling call: abi_tail jumps to abi_tail_callee (gcc -O2), whose entry
 * then finds the return address abi_tail's entry may have hijacked. */
TRACEE long abi_tail_callee(long a, double d)
{
	return a * 5 + (long)(d * 2);
}

TRACEE long abi_tail(long a, double d)
{
	return abi_tail_callee(a + 1, d * 0.5);
}
