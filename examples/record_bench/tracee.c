/*
 * The record benchmark's tracee: a loop calling a small function tree.
 *
 *   tracee N [xray]
 *
 * runs N iterations of work(i), each making 5 calls (work -> parse,
 * compute -> leaf_add, leaf_mul), so a traced run records 5 N + 1 calls
 * (main included), and prints `calls <that number>`.
 *
 * The same source is built four ways: plain (untraced), with patch sites
 * (ftramp record), with -pg (uftrace record) and, as C++ with
 * BENCH_XRAY defined, with clang's -fxray-instrument; `xray` as the second
 * argument then starts XRay's FDR mode in main and writes its log at the
 * end (the XRay runtime neither starts nor flushes FDR mode by itself).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef BENCH_XRAY
#include <xray/xray_log_interface.h>
#endif

#if defined(__clang__)
#define FUNC __attribute__((noinline))
#else
#define FUNC __attribute__((noinline, noclone))
#endif
/* Keeps x in a register the compiler must assume changed. */
#define OPAQUE(x) __asm__ volatile("" : "+r"(x))

FUNC long leaf_add(long x)
{
	OPAQUE(x);
	return x + 1;
}

FUNC long leaf_mul(long x)
{
	OPAQUE(x);
	return x * 3;
}

FUNC long compute(long x)
{
	return leaf_add(x) + leaf_mul(x);
}

FUNC long parse(long x)
{
	OPAQUE(x);
	return x ^ 0x5a;
}

FUNC long work(long x)
{
	return compute(parse(x)) + 1;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: %s ITERATIONS [xray]\n", argv[0]);
		return 2;
	}
	long n = atol(argv[1]), sum = 0;
	int xray = argc > 2 && strcmp(argv[2], "xray") == 0;
#ifdef BENCH_XRAY
	if (xray && __xray_log_init_mode("xray-fdr", "") != XRAY_LOG_INITIALIZED) {
		fprintf(stderr, "tracee: XRay FDR mode did not start\n");
		return 1;
	}
#endif
	for (long i = 0; i < n; i++)
		sum += work(i);
#ifdef BENCH_XRAY
	if (xray && (__xray_log_finalize() != XRAY_LOG_FINALIZED || __xray_log_flushLog() != XRAY_LOG_FLUSHED)) {
		fprintf(stderr, "tracee: XRay FDR log not written\n");
		return 1;
	}
#else
	(void)xray;
#endif
	printf("calls %ld sum %ld\n", 5 * n + 1, sum);
	return 0;
}
