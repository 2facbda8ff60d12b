/* The same tracee under LLVM XRay with a no-op handler, for side-by-side
 * figures (built by the ftrace_ops and fgraph_multi benchmarks with clang-14):
 *
 *   clang++-14 -O2 -fxray-instrument -fxray-instruction-threshold=1 xray_bench.cpp
 *   ./a.out N traced   ->  "ns_per_call <x>"
 */
#include <cstdint>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xray/xray_interface.h>

__attribute__((noinline, xray_always_instrument)) void tracee_relevant(void)
{
	__asm__ volatile("" ::: "memory");
}

__attribute__((xray_never_instrument)) static void handler(int32_t fid, XRayEntryType type)
{
	(void)fid;
	(void)type;
}

__attribute__((xray_never_instrument)) int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 1000000;
	int traced = argc > 2 && strcmp(argv[2], "traced") == 0;
	if (traced) {
		__xray_set_handler(handler);
		__xray_patch();
	}
	struct timespec a, b;
	clock_gettime(CLOCK_MONOTONIC, &a);
	for (long i = 0; i < n; i++)
		tracee_relevant();
	clock_gettime(CLOCK_MONOTONIC, &b);
	double ns = (b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec);
	printf("ns_per_call %.3f\n", ns / n);
	return 0;
}
