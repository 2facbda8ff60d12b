/* Architecture helpers for the execution tests, built WITHOUT patchable
 * entries.  The per-arch parts (tests/c/arch/<arch>.h) provide:
 *
 *   long arch_call_checked(void *fn, long a, long b, unsigned long *bad);
 *       Loads a known pattern into every callee-saved register, calls
 *       fn(a, b), and sets *bad to a bit mask of the callee-saved registers
 *       that did not survive (0 = all intact).
 *   void arch_sp_probe(unsigned long ip, unsigned long parent, void *op, void *fregs);
 *       A tracer that records its stack pointer at entry in arch_probe_sp.
 *   ARCH_SP_MOD: what arch_probe_sp % 16 must be under the ABI.
 *   int arch_site_call(unsigned char *buf, unsigned long site, unsigned long target);
 *       (static inline, used by objtest.c) the enabled form of a patch site,
 *       encoded independently of the generator; returns its length or -1.
 * The asm block is guarded by ARCH_HARNESS_ASM so only harness.c emits it.
 */
#define ARCH_HARNESS_ASM
unsigned long arch_probe_sp;
unsigned long arch_probe_calls;

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
#else
#error "no test harness for this architecture"
#endif

unsigned long arch_sp_mod(void)
{
	return ARCH_SP_MOD;
}

/* An ops callback that jumps out of dispatch the first time it is armed
 * (exectest/tests/ops.rs: the recursion guard of a section left by a jump
 * is released), and the call that arms it. */
#include <setjmp.h>
static sigjmp_buf harness_jump_env;
static volatile int harness_jump_armed;
unsigned long harness_jump_calls;

void harness_jumping_cb(unsigned long ip, unsigned long parent, void *op, void *fregs)
{
	(void)ip, (void)parent, (void)op, (void)fregs;
	harness_jump_calls++;
	if (harness_jump_armed) {
		harness_jump_armed = 0;
		siglongjmp(harness_jump_env, 1);
	}
}

/* Calls fn(a, b) with the jump armed: 1 when the callback jumped out of
 * it, 0 when fn returned. */
int harness_call_jumping(long (*fn)(long, long), long a, long b)
{
	if (sigsetjmp(harness_jump_env, 0))
		return 1;
	harness_jump_armed = 1;
	fn(a, b);
	harness_jump_armed = 0;
	return 0;
}
