/* The generated trampoline *object* linked into a C program.
 *
 * Built by exectest/tests/object.rs for every arch with the arch's (cross)
 * gcc, and run natively or under qemu-user:
 *
 *   ftramp gen --arch A -V all -o tramp.o ; ftramp gen --arch A --header -o ftramp.h
 *   CC -O2 objtest.c harness.c abi_driver.c tracee.c tracee_abi.c tracee_callsite.c tramp.o
 *
 * This program supplies ftrace_ops_list_func and ftrace_return_to_handler
 * (the object's only imports), patches the tracees' sites itself, and
 * checks what the tracer sees and what callers get back.  The last line is
 * "N passed, M failed"; the exit status is non-zero on any failure.
 */
#include "ftramp.h"
#include "abi.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

long tracee_args(long a, long b, long c, long d, long e, long f, long g, long h, double x, double y);
long tracee_args_alt(long a, long b, long c, long d, long e, long f, long g, long h, double x, double y);
double tracee_fp(double x, double y, long n);
long double tracee_ld(long double a, long double b);
_Complex long double tracee_cld(long double re, long double im);
long tracee_two(long a, long b);
long tracee_nested(long n);
long tracee_callsite(long a, long b);
long arch_call_checked(void *fn, long a, long b, unsigned long *bad);
void arch_sp_probe(unsigned long ip, unsigned long parent, struct ftrace_ops *op, struct ftrace_regs *fregs);
unsigned long arch_sp_mod(void);
extern unsigned long arch_probe_sp, arch_probe_calls;

#if defined(__x86_64__)
#include "arch/x86_64.h"
#elif defined(__aarch64__)
#include "arch/aarch64.h"
#elif defined(__riscv)
#include "arch/riscv64.h"
#elif defined(__powerpc64__)
#include "arch/ppc64le.h"
#elif defined(__s390x__)
#include "arch/s390x.h"
#endif

/* Uses the whole x87 register stack, as any callee may (x86_64 only). */
#ifndef ARCH_CLOBBER_FP_STACK
#define ARCH_CLOBBER_FP_STACK() \
	do {                    \
	} while (0)
#endif

struct ftrace_ops {
	ftrace_func_t func; /* first word: callsite dispatch calls it */
	unsigned long tag;
};

static int passed, failed;

#define CHECK(cond, ...)                                                   \
	do {                                                               \
		if (cond) {                                                \
			passed++;                                          \
		} else {                                                   \
			failed++;                                          \
			printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
			printf(__VA_ARGS__);                               \
			printf("\n");                                      \
		}                                                          \
	} while (0)

/* ---- the tracer ---------------------------------------------------- */

static unsigned long seen_ip, seen_parent, seen_resume, seen_calls;
/* The fregs pointers the tracer and the return handler got. */
static unsigned long seen_fregs, seen_ret_fregs;
static struct ftrace_ops *seen_op;
static unsigned long seen_args[16];
static double seen_fp[2];
static unsigned long redirect_to;
static int hijack;
static unsigned long shadow[64];
static int shadow_top;
static unsigned long rets[64];
static double fprets[64];
static int nrets;
static long set_ret = LONG_MIN;
static int set_fp;
static double set_fp_value;
/* The tracer and the return handler end with abi_clobber(). */
static int clobber;

static void tracer(unsigned long ip, unsigned long parent, struct ftrace_ops *op, struct ftrace_regs *fregs)
{
	seen_ip = ip;
	seen_parent = parent;
	seen_op = op;
	seen_fregs = (unsigned long)fregs;
	seen_resume = ftrace_regs_get_instruction_pointer(fregs);
	for (unsigned int n = 0; n < FTRACE_REGS_NR_ARGS && n < 16; n++)
		seen_args[n] = ftrace_regs_get_argument(fregs, n);
	seen_fp[0] = ftrace_regs_get_fp_argument(fregs, 0);
	seen_fp[1] = ftrace_regs_get_fp_argument(fregs, 1);
	seen_calls++;
	if (redirect_to)
		ftrace_regs_set_instruction_pointer(fregs, redirect_to);
	if (hijack && shadow_top < 64) {
		shadow[shadow_top++] = ftrace_regs_get_return_address(fregs);
		ftrace_regs_set_return_address(fregs, (unsigned long)return_to_handler);
	}
	if (clobber)
		abi_clobber();
}

static struct ftrace_ops test_ops = { tracer, 0xf7ace };

void ftrace_ops_list_func(unsigned long ip, unsigned long parent_ip, struct ftrace_ops *op, struct ftrace_regs *fregs)
{
	op->func(ip, parent_ip, op, fregs);
}

unsigned long ftrace_return_to_handler(struct ftrace_regs *fregs)
{
	ARCH_CLOBBER_FP_STACK();
	seen_ret_fregs = (unsigned long)fregs;
	if (nrets < 64) {
		rets[nrets] = ftrace_regs_get_return_value(fregs);
		fprets[nrets] = ftrace_regs_get_fp_return_value(fregs);
		nrets++;
	}
	if (set_ret != LONG_MIN)
		ftrace_regs_set_return_value(fregs, (unsigned long)set_ret);
	if (set_fp)
		ftrace_regs_set_fp_return_value(fregs, set_fp_value);
	if (clobber)
		abi_clobber();
	return shadow[--shadow_top];
}

/* ---- patching -------------------------------------------------------- */

static const unsigned char site_nop[] = FTRACE_SITE_NOP;

static unsigned long site_of(void *fn)
{
	const unsigned char *p = (const unsigned char *)fn;
	for (int off = 0; off < 64; off++)
		if (memcmp(p + off, site_nop, FTRACE_SITE_SIZE) == 0)
			return (unsigned long)p + off;
	printf("FAIL: no patch site in %p\n", fn);
	failed++;
	return 0;
}

static void write_code(unsigned long addr, const void *bytes, size_t len)
{
	long page = sysconf(_SC_PAGESIZE);
	unsigned long start = addr & ~(unsigned long)(page - 1);
	unsigned long end = (addr + len + page - 1) & ~(unsigned long)(page - 1);
	mprotect((void *)start, end - start, PROT_READ | PROT_WRITE | PROT_EXEC);
	memcpy((void *)addr, bytes, len);
	mprotect((void *)start, end - start, PROT_READ | PROT_EXEC);
	__builtin___clear_cache((char *)addr, (char *)addr + len);
}

/* Patches fn's site to call tramp; returns the site (0 on failure). */
static unsigned long enable(void *fn, void *tramp)
{
	unsigned char buf[16];
	unsigned long site = site_of(fn);
	if (!site)
		return 0;
	int n = arch_site_call(buf, site, (unsigned long)tramp);
	if (n != FTRACE_SITE_SIZE) {
		printf("FAIL: trampoline %p out of reach of %lx\n", tramp, site);
		failed++;
		return 0;
	}
	write_code(site, buf, n);
	return site;
}

static void disable(unsigned long site)
{
	if (site)
		write_code(site, site_nop, FTRACE_SITE_SIZE);
}

static void reset(void)
{
	seen_ip = seen_parent = seen_resume = seen_calls = 0;
	seen_fregs = seen_ret_fregs = 0;
	seen_op = 0;
	memset(seen_args, 0, sizeof(seen_args));
	redirect_to = 0;
	hijack = 0;
	shadow_top = 0;
	nrets = 0;
	set_ret = LONG_MIN;
	set_fp = 0;
}

/* ---- the checks ------------------------------------------------------ */

struct entry {
	const char *name;
	void *tramp;
	int callsite;
};

static const long A[8] = { 1, -2, 3000000000L, 4, 5, -6, 7, 8 };

static long expect_args(void)
{
	long r = 0;
	for (int i = 0; i < 8; i++)
		r += (i + 1) * A[i];
	return r + 15 + 225;
}

static long call_args(void)
{
	return tracee_args(A[0], A[1], A[2], A[3], A[4], A[5], A[6], A[7], 1.5, 2.25);
}

static void check_entry(const struct entry *e)
{
	unsigned long bad;
	long r;
	void *fn = e->callsite ? (void *)tracee_callsite : (void *)tracee_args;
	unsigned long site;

	if (e->callsite) {
		unsigned long at = site_of(fn) + FTRACE_CALLSITE_OPS_OFFSET;
		struct ftrace_ops *p = &test_ops;
		write_code(at, &p, sizeof(p));
	}

	/* ip, parent ip, ops, arguments. */
	reset();
	site = enable(fn, e->tramp);
	r = e->callsite ? tracee_callsite(6, -4) : call_args();
	disable(site);
	CHECK(r == (e->callsite ? 38 : expect_args()), "%s: result %ld", e->name, r);
	CHECK(seen_calls == 1, "%s: %lu callbacks", e->name, seen_calls);
	CHECK(seen_ip == site, "%s: ip %lx site %lx", e->name, seen_ip, site);
	CHECK(seen_resume == site + FTRACE_SITE_SIZE, "%s: resume %lx", e->name, seen_resume);
	CHECK(seen_op == &test_ops, "%s: op %p", e->name, (void *)seen_op);
	CHECK(seen_fregs % __alignof__(struct ftrace_regs) == 0, "%s: fregs %lx", e->name, seen_fregs);
	if (e->callsite) {
		CHECK(seen_args[0] == 6 && seen_args[1] == (unsigned long)-4, "%s: args", e->name);
	} else {
		for (unsigned int n = 0; n < FTRACE_REGS_NR_ARGS && n < 8; n++)
			CHECK(seen_args[n] == (unsigned long)A[n], "%s: arg %u = %lx", e->name, n, seen_args[n]);
		CHECK(seen_fp[0] == 1.5 && seen_fp[1] == 2.25, "%s: fp args %g %g", e->name, seen_fp[0], seen_fp[1]);
	}

	/* Callee-saved registers and the parent ip. */
	reset();
	void *fn2 = e->callsite ? (void *)tracee_callsite : (void *)tracee_two;
	site = enable(fn2, e->tramp);
	bad = ~0UL;
	r = arch_call_checked(fn2, 12, 34, &bad);
	disable(site);
	CHECK(r == (e->callsite ? 118 : 12034), "%s: result %ld", e->name, r);
	CHECK(bad == 0, "%s: callee-saved registers changed: mask %lx", e->name, bad);
	CHECK(seen_parent > (unsigned long)arch_call_checked && seen_parent < (unsigned long)arch_call_checked + 1024,
	      "%s: parent %lx", e->name, seen_parent);

	if (e->callsite)
		return;

	/* IPMODIFY. */
	reset();
	redirect_to = (unsigned long)tracee_args_alt;
	site = enable(fn, e->tramp);
	r = call_args();
	disable(site);
	CHECK(r == -(1 - 2 + 3000000000L + 4 + 5 - 6 + 7 + 8) - 3 - 1000, "%s: redirect result %ld", e->name, r);

	/* Returns through return_to_handler. */
	reset();
	hijack = 1;
	site = enable(fn, e->tramp);
	r = call_args();
	disable(site);
	CHECK(r == expect_args() && nrets == 1 && rets[0] == (unsigned long)expect_args(), "%s: return %ld (%d)", e->name, r, nrets);
	reset();
	hijack = 1;
	site = enable((void *)tracee_fp, e->tramp);
	double d = tracee_fp(1.5, 4.0, 2);
	disable(site);
	CHECK(d == 8.0 && nrets == 1 && fprets[0] == 8.0, "%s: fp return %g (%g)", e->name, d, fprets[0]);
	/* long double, whose bits a double round trip would lose (x86_64:
	 * st(0), and st(1) for the complex one). */
	volatile long double la = 1.0L + 1.0L / 3, lb = 3.0L - 1.0L / 7;
	long double lwant = la * lb + 0.25L;
	reset();
	hijack = 1;
	site = enable((void *)tracee_ld, e->tramp);
	long double ld = tracee_ld(la, lb);
	disable(site);
	CHECK(ld == lwant && nrets == 1, "%s: long double return %Lg (want %Lg, %d returns)", e->name, ld, lwant, nrets);
	reset();
	hijack = 1;
	site = enable((void *)tracee_cld, e->tramp);
	_Complex long double lc = tracee_cld(la, lb);
	disable(site);
	CHECK(__real__ lc == la * 2 && __imag__ lc == lb * 3 && nrets == 1, "%s: complex long double return %Lg%+Lgi (%d returns)", e->name,
	      __real__ lc, __imag__ lc, nrets);
	reset();
	hijack = 1;
	site = enable((void *)tracee_two, e->tramp);
	bad = ~0UL;
	r = arch_call_checked((void *)tracee_two, 5, 6, &bad);
	disable(site);
	CHECK(r == 5006 && bad == 0, "%s: callee-saved across return_to_handler: %ld %lx", e->name, r, bad);

	/* The return handler changes the return values. */
	reset();
	hijack = 1;
	set_ret = -42;
	site = enable((void *)tracee_two, e->tramp);
	r = tracee_two(1, 2);
	disable(site);
	CHECK(r == -42, "%s: set return value: %ld", e->name, r);
	reset();
	hijack = 1;
	set_fp = 1;
	set_fp_value = 99.5;
	site = enable((void *)tracee_fp, e->tramp);
	d = tracee_fp(2.0, 3.0, 0);
	disable(site);
	CHECK(d == 99.5, "%s: set fp return value: %g", e->name, d);

	/* Nested calls. */
	reset();
	hijack = 1;
	site = enable((void *)tracee_nested, e->tramp);
	r = tracee_nested(6);
	disable(site);
	long want = 1;
	for (int n = 1; n <= 6; n++)
		want = want * 2 + n;
	CHECK(r == want && seen_calls == 7 && nrets == 7 && shadow_top == 0, "%s: nested %ld calls %lu rets %d", e->name, r,
	      seen_calls, nrets);
}

static void check_alignment(const char *name, void *tramp, int callsite)
{
	void *fn = callsite ? (void *)tracee_callsite : (void *)tracee_two;
	unsigned long before = arch_probe_calls, bad = 0;
	unsigned long site = enable(fn, tramp);
	arch_call_checked(fn, 1, 2, &bad);
	disable(site);
	CHECK(arch_probe_calls == before + 1, "%s: probe ran", name);
	CHECK(arch_probe_sp % 16 == arch_sp_mod(), "%s: callback sp %lx misaligned", name, arch_probe_sp);
}

#ifdef ARCH_CALL_MISALIGNED
long arch_call_misaligned(void *fn, long a, long b);

/* fregs, in the entry trampoline's callback and in return_to_handler's, has
 * the alignment the header declares (FTRACE_REGS_ALIGN) also when the traced
 * function was entered on a stack that is 8 mod 16: x86_64 after gcc's
 * -fipa-stack-alignment (the header said 16, and a callback that read
 * `*(__m128d *)fregs->xmm0` faulted), s390x whenever the caller's frame is
 * (its ABI keeps 8 bytes). */
static void check_fregs_alignment(const struct entry *e)
{
	void *fn = e->callsite ? (void *)tracee_callsite : (void *)tracee_two;
	unsigned long align = __alignof__(struct ftrace_regs);

	reset();
	hijack = 1;
	unsigned long site = enable(fn, e->tramp);
	long r = arch_call_misaligned(fn, 3, 4);
	disable(site);
	CHECK(r == (e->callsite ? 25 : 3004) && seen_calls == 1 && nrets == 1, "%s: misaligned entry: %ld, %lu calls, %d returns",
	      e->name, r, seen_calls, nrets);
	CHECK(align == FTRACE_REGS_ALIGN && seen_fregs % align == 0, "%s: misaligned entry: fregs %lx, header says aligned(%lu)",
	      e->name, seen_fregs, align);
	CHECK(seen_ret_fregs % align == 0, "return_to_handler after %s: misaligned entry: fregs %lx, header says aligned(%lu)",
	      e->name, seen_ret_fregs, align);
	reset();
}
#endif

/* The C calling-convention cases (tracee_abi.c) return the untraced bytes
 * through each trampoline with the return hijacked, while the tracer and
 * the return handler scramble the caller-saved registers. */
static void check_abi(const struct entry *e)
{
	static unsigned char want[ABI_OUT_MAX], got[ABI_OUT_MAX];
	unsigned long sites[32];
	int n = 0, calls = abi_run(want);

	reset();
	hijack = clobber = 1;
	for (; abi_tracees[n] && n < 32; n++)
		sites[n] = enable(abi_tracees[n], e->tramp);
	int got_calls = abi_run(got);
	for (int i = 0; i < n; i++)
		disable(sites[i]);
	clobber = 0;
	int diff = 0;
	while (diff < ABI_OUT_MAX && want[diff] == got[diff])
		diff++;
	CHECK(got_calls == calls && diff == ABI_OUT_MAX, "%s: the C ABI cases' results differ from untraced from byte %d", e->name,
	      diff);
	CHECK(seen_calls == (unsigned long)calls && nrets == calls && shadow_top == 0, "%s: %lu entries, %d returns of %d calls",
	      e->name, seen_calls, nrets, calls);
	reset();
}

int main(void)
{
	const struct entry entries[] = {
		{ "ftrace_caller", (void *)ftrace_caller, 0 },
		{ "ftrace_regs_caller", (void *)ftrace_regs_caller, 0 },
		{ "ftrace_direct_caller", (void *)ftrace_direct_caller, 0 },
		{ "ftrace_regs_direct_caller", (void *)ftrace_regs_direct_caller, 0 },
		{ "ftrace_callsite_caller", (void *)ftrace_callsite_caller, 1 },
		{ "ftrace_regs_callsite_caller", (void *)ftrace_regs_callsite_caller, 1 },
	};
	function_trace_op = &test_ops;
	ftrace_direct_op = &test_ops;
	ftrace_direct_func = tracer;
	for (unsigned int i = 0; i < sizeof(entries) / sizeof(entries[0]); i++)
		check_entry(&entries[i]);
	for (unsigned int i = 0; i < sizeof(entries) / sizeof(entries[0]); i++)
		if (!entries[i].callsite)
			check_abi(&entries[i]);
#ifdef ARCH_CALL_MISALIGNED
	for (unsigned int i = 0; i < sizeof(entries) / sizeof(entries[0]); i++)
		check_fregs_alignment(&entries[i]);
#endif

	/* Stack alignment in the callback, through direct and callsite dispatch. */
	static struct ftrace_ops probe_ops = { arch_sp_probe, 2 };
	unsigned long at = site_of((void *)tracee_callsite) + FTRACE_CALLSITE_OPS_OFFSET;
	struct ftrace_ops *p = &probe_ops;
	write_code(at, &p, sizeof(p));
	ftrace_direct_func = arch_sp_probe;
	check_alignment("ftrace_direct_caller", (void *)ftrace_direct_caller, 0);
	check_alignment("ftrace_regs_direct_caller", (void *)ftrace_regs_direct_caller, 0);
	check_alignment("ftrace_callsite_caller", (void *)ftrace_callsite_caller, 1);
	check_alignment("ftrace_regs_callsite_caller", (void *)ftrace_regs_callsite_caller, 1);

	printf("%d passed, %d failed\n", passed, failed);
	return failed != 0;
}
