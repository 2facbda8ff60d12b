/* The caller side of the ABI tests, built WITHOUT patch sites: calls each
 * tracee of tracee_abi.c and keeps every result's bytes, so a traced run
 * can be compared byte for byte with an untraced one; and abi_clobber, the
 * callbacks' register scrambler. */
#include <string.h>
#include "abi.h"

double abi_vsum(int n, ...);
long abi_vmix(int n, ...);
struct abi_big abi_sret(long x, long y);
long abi_big_arg(struct abi_big b, long k);
struct abi_hfa abi_hfa_ret(double x);
double abi_hfa_arg(struct abi_hfa h, double k);
struct abi_mixed abi_mixed_ret(long i, double d);
struct abi_fpair abi_fpair_ret(float x, float y);
struct abi_pair abi_pair_ret(long a, long b);
__int128 abi_i128(__int128 a, __int128 b);
_Complex double abi_cplx(double re, double im);
float abi_float(float a, float b, float c);
double abi_stack_args(long a0, long a1, long a2, long a3, long a4, long a5, long a6, long a7, long a8, long a9,
		      double d0, double d1, double d2, double d3, double d4, double d5, double d6, double d7,
		      double d8, double d9);
long abi_tail(long a, double d);
long abi_tail_callee(long a, double d);

void *const abi_tracees[] = { (void *)abi_vsum,      (void *)abi_vmix,      (void *)abi_sret,       (void *)abi_big_arg,
			      (void *)abi_hfa_ret,   (void *)abi_hfa_arg,   (void *)abi_mixed_ret,  (void *)abi_fpair_ret,
			      (void *)abi_pair_ret,  (void *)abi_i128,      (void *)abi_cplx,       (void *)abi_float,
			      (void *)abi_stack_args, (void *)abi_tail,     (void *)abi_tail_callee, 0 };

struct abi_result abi_results[ABI_RESULTS_MAX];
int abi_nresults;

#define KEEP(v)                                                                       \
	do {                                                                          \
		__typeof__(v) keep_ = (v);                                            \
		if (at + sizeof keep_ <= ABI_OUT_MAX)                                 \
			memcpy(out + at, &keep_, sizeof keep_);                       \
		if (abi_nresults < ABI_RESULTS_MAX)                                   \
			abi_results[abi_nresults++] = (struct abi_result){ #v, at, sizeof keep_ }; \
		at += sizeof keep_;                                                   \
		calls++;                                                              \
	} while (0)

int abi_run(unsigned char *out)
{
	size_t at = 0;
	int calls = 0;
	abi_nresults = 0;
	KEEP(abi_vsum(5, 1.5, -2.25, 3.125, 1e10, -0.0625));
	KEEP(abi_vsum(0));
	KEEP(abi_vmix(6, 11L, 0.5, -7L, 2.75, 1L << 40, -3.0625));
	KEEP(abi_sret(123456789, -42));
	struct abi_big b = { { 1, -2, 3, -4, 5, 1L << 50 } };
	KEEP(abi_big_arg(b, 77));
	KEEP(abi_hfa_ret(1.75));
	struct abi_hfa h = { 0.5, -1.25, 8.0, 1e-3 };
	KEEP(abi_hfa_arg(h, 2.5));
	KEEP(abi_mixed_ret(-99, 10.5));
	KEEP(abi_fpair_ret(1.5f, -2.25f));
	KEEP(abi_pair_ret(1L << 33, -5));
	KEEP(abi_i128(((__int128)0x0123456789abcdefL << 64) | 0xfedcba9876543210UL, -((__int128)1 << 90)));
	KEEP(abi_cplx(3.5, -0.75));
	KEEP(abi_float(2.5f, -4.0f, 0.125f));
	KEEP(abi_stack_args(1, -2, 3, -4, 5, -6, 7, -8, 9, -10, 0.5, 1.5, -2.5, 3.5, -4.5, 5.5, -6.5, 7.5, -8.5, 9.75));
	KEEP(abi_tail(1000, 3.5)); /* two tracees: abi_tail_callee too */
	calls++;
	return at <= ABI_OUT_MAX ? calls : -1;
}

/* The pattern: distinct per register where cheap, never 0. */
void abi_clobber(void)
{
#if defined(__x86_64__)
	__asm__ volatile("movabs $0x5aa5c33c96696900, %%rax\n" /* %al 0: "no vector registers" to a variadic callee */
			 "mov %%rax, %%rcx\n	mov %%rax, %%rdx\n	mov %%rax, %%rsi\n	mov %%rax, %%rdi\n"
			 "mov %%rax, %%r8\n	mov %%rax, %%r9\n	mov %%rax, %%r10\n	mov %%rax, %%r11\n"
			 "movq %%rax, %%xmm0\n	pshufd $0x4e, %%xmm0, %%xmm0\n"
			 "movdqa %%xmm0, %%xmm1\n	movdqa %%xmm0, %%xmm2\n	movdqa %%xmm0, %%xmm3\n"
			 "movdqa %%xmm0, %%xmm4\n	movdqa %%xmm0, %%xmm5\n	movdqa %%xmm0, %%xmm6\n"
			 "movdqa %%xmm0, %%xmm7\n	movdqa %%xmm0, %%xmm8\n	movdqa %%xmm0, %%xmm15\n"
			 "fldpi\n	fstp %%st(0)\n" ::
				 : "rax", "rcx", "rdx", "rsi", "rdi", "r8", "r9", "r10", "r11", "xmm0", "xmm1", "xmm2",
				   "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm15", "cc", "memory");
#elif defined(__aarch64__)
	__asm__ volatile("movz x9, #0x9669\n	movk x9, #0x3cc3, lsl #16\n	movk x9, #0xa55a, lsl #32\n"
			 "movk x9, #0x5aa5, lsl #48\n"
			 "mov x0, x9\n	mov x1, x9\n	mov x2, x9\n	mov x3, x9\n	mov x4, x9\n	mov x5, x9\n"
			 "mov x6, x9\n	mov x7, x9\n	mov x8, x9\n	mov x10, x9\n	mov x11, x9\n	mov x12, x9\n"
			 "mov x13, x9\n	mov x14, x9\n	mov x15, x9\n	mov x16, x9\n	mov x17, x9\n"
			 "dup v0.2d, x9\n	dup v1.2d, x9\n	dup v2.2d, x9\n	dup v3.2d, x9\n"
			 "dup v4.2d, x9\n	dup v5.2d, x9\n	dup v6.2d, x9\n	dup v7.2d, x9\n"
			 "dup v16.2d, x9\n	dup v17.2d, x9\n	dup v31.2d, x9\n"
			 "cmp x9, #0\n" ::
				 : "x0", "x1", "x2", "x3", "x4", "x5", "x6", "x7", "x8", "x9", "x10", "x11", "x12", "x13",
				   "x14", "x15", "x16", "x17", "v0", "v1", "v2", "v3", "v4", "v5", "v6", "v7", "v16", "v17",
				   "v31", "cc", "memory");
#elif defined(__riscv)
	__asm__ volatile("li t0, 0x5aa5c33c96696996\n"
			 "mv a0, t0\n	mv a1, t0\n	mv a2, t0\n	mv a3, t0\n	mv a4, t0\n	mv a5, t0\n"
			 "mv a6, t0\n	mv a7, t0\n	mv t1, t0\n	mv t2, t0\n	mv t3, t0\n	mv t4, t0\n"
			 "mv t5, t0\n	mv t6, t0\n"
			 "fmv.d.x fa0, t0\n	fmv.d.x fa1, t0\n	fmv.d.x fa2, t0\n	fmv.d.x fa3, t0\n"
			 "fmv.d.x fa4, t0\n	fmv.d.x fa5, t0\n	fmv.d.x fa6, t0\n	fmv.d.x fa7, t0\n"
			 "fmv.d.x ft0, t0\n	fmv.d.x ft1, t0\n	fmv.d.x ft11, t0\n" ::
				 : "a0", "a1", "a2", "a3", "a4", "a5", "a6", "a7", "t0", "t1", "t2", "t3", "t4", "t5", "t6",
				   "fa0", "fa1", "fa2", "fa3", "fa4", "fa5", "fa6", "fa7", "ft0", "ft1", "ft11", "memory");
#elif defined(__powerpc64__)
	__asm__ volatile("lis 11, 0x5aa5\n	ori 11, 11, 0xc33c\n	sldi 11, 11, 32\n"
			 "oris 11, 11, 0x9669\n	ori 11, 11, 0x6996\n"
			 "mr 0, 11\n	mr 3, 11\n	mr 4, 11\n	mr 5, 11\n	mr 6, 11\n	mr 7, 11\n	mr 8, 11\n"
			 "mr 9, 11\n	mr 10, 11\n	mr 12, 11\n"
			 "mtvsrd 0, 11\n	mtvsrd 1, 11\n	mtvsrd 2, 11\n	mtvsrd 3, 11\n	mtvsrd 4, 11\n"
			 "mtvsrd 5, 11\n	mtvsrd 6, 11\n	mtvsrd 7, 11\n	mtvsrd 8, 11\n	mtvsrd 9, 11\n"
			 "mtvsrd 10, 11\n	mtvsrd 11, 11\n	mtvsrd 12, 11\n	mtvsrd 13, 11\n"
			 "vspltisw 0, -7\n	vspltisw 1, -7\n	vspltisw 2, -7\n	vspltisw 3, -7\n"
			 "vspltisw 4, -7\n	vspltisw 5, -7\n	vspltisw 13, -7\n	vspltisw 19, -7\n"
			 "cmpdi 11, 0\n" ::
				 : "r0", "r3", "r4", "r5", "r6", "r7", "r8", "r9", "r10", "r11", "r12", "fr0", "fr1", "fr2",
				   "fr3", "fr4", "fr5", "fr6", "fr7", "fr8", "fr9", "fr10", "fr11", "fr12", "fr13", "v0", "v1", "v2",
				   "v3", "v4", "v5", "v13", "v19", "cr0", "memory");
#elif defined(__s390x__)
	__asm__ volatile("llihf %%r1, 0x5aa5c33c\n	iilf %%r1, 0x96696996\n"
			 "lgr %%r0, %%r1\n	lgr %%r2, %%r1\n	lgr %%r3, %%r1\n	lgr %%r4, %%r1\n	lgr %%r5, %%r1\n"
			 "ldgr %%f0, %%r1\n	ldgr %%f1, %%r1\n	ldgr %%f2, %%r1\n	ldgr %%f3, %%r1\n"
			 "ldgr %%f4, %%r1\n	ldgr %%f5, %%r1\n	ldgr %%f6, %%r1\n	ldgr %%f7, %%r1\n"
			 "cghi %%r1, 0\n" ::
				 : "r0", "r1", "r2", "r3", "r4", "r5", "f0", "f1", "f2", "f3", "f4", "f5", "f6", "f7",
				   "cc", "memory");
#else
#error "abi_clobber: unknown arch"
#endif
}
