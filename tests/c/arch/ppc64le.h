/* ppc64le parts of the execution-test harness (see harness.c).
 *
 * Tracees are built with `-pg -mprofile-kernel`: gcc puts `mflr r0 ; bl _mcount`
 * after each function's local entry point.  This file provides `_mcount` (it
 * returns to the site with LR restored, so an untouched site behaves like a
 * NOP) and, at start-up, turns every `mflr r0 ; bl _mcount` of the program's
 * text into `mflr r0 ; nop`, the spec's disabled form — what Linux's
 * ftrace_init does with `ftrace_make_nop`.  (Every one: only the tracees are
 * built with -pg, and a site left calling `_mcount` would behave the same.)
 */
#define ARCH_SP_MOD 0 /* r1 is 16-byte aligned at every call (ELFv2 2.2.2.1) */

/* The pattern arch_call_checked loads into callee-saved register rN
 * (r14 -> 0x1414141414141414; fN gets the pattern of rN). */
#define PPC_PAT(n) "0x" #n #n
#define PPC_LOAD64(r, n) "	lis " r ", " PPC_PAT(n) "\n	ori " r ", " r ", " PPC_PAT(n) "\n	sldi " r ", " r ", 32\n" \
	"	oris " r ", " r ", " PPC_PAT(n) "\n	ori " r ", " r ", " PPC_PAT(n) "\n"
#define PPC_LOAD(n) PPC_LOAD64("%r" #n, n) "	mtfprd %f" #n ", %r" #n "\n"
/* Sets bit `bit` of %r5 when r`r` (compared with %r12) lost pattern n. */
#define PPC_CHECK_REG(r, n, bit) PPC_LOAD64("%r12", n) "	cmpd " r ", %r12\n	beq 1f\n	li %r11, 1\n	sldi %r11, %r11, " #bit "\n	or %r5, %r5, %r11\n1:\n"
#define PPC_CHECK(n, bit) PPC_CHECK_REG("%r" #n, n, bit)
#define PPC_CHECK_FP(n, bit) "	mffprd %r10, %f" #n "\n" PPC_CHECK_REG("%r10", n, bit)

#ifdef ARCH_HARNESS_ASM /* defined by harness.c only */
#include <elf.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <unistd.h>

__asm__(
	".machine power8\n"
	".abiversion 2\n"
	".text\n"
	/* The profiling hook: at entry LR = the address after the site and
	 * %r0 = the function's return address (`mflr %r0`). */
	".globl _mcount\n"
	".type _mcount,@function\n"
	"_mcount:\n"
	"	mflr %r12\n	mtctr %r12\n	mtlr %r0\n	bctr\n"
	".size _mcount, .-_mcount\n"

	/* A callback: called through CTR with %r12 = its address, it sets up
	 * its own TOC (the trampoline must restore the caller's %r2). */
	".globl arch_sp_probe\n"
	".type arch_sp_probe,@function\n"
	"arch_sp_probe:\n"
	"0:	addis %r2, %r12, .TOC.-0b@ha\n	addi %r2, %r2, .TOC.-0b@l\n"
	"	.localentry arch_sp_probe, .-arch_sp_probe\n"
	"	addis %r9, %r2, arch_probe_sp@toc@ha\n	std %r1, arch_probe_sp@toc@l(%r9)\n"
	"	addis %r9, %r2, arch_probe_calls@toc@ha\n	ld %r10, arch_probe_calls@toc@l(%r9)\n"
	"	addi %r10, %r10, 1\n	std %r10, arch_probe_calls@toc@l(%r9)\n"
	"	blr\n"
	".size arch_sp_probe, .-arch_sp_probe\n"

	/* Frame (400 bytes): ELFv2 header (LR save in the caller's frame at
	 * 416, TOC save at 24), %r14-%r31 at 96.., %f14-%f31 at 240.., bad at 384. */
	".globl arch_call_checked\n"
	".type arch_call_checked,@function\n"
	"arch_call_checked:\n"
	"	mflr %r0\n	std %r0, 16(%r1)\n	stdu %r1, -400(%r1)\n"
	"	std %r2, 24(%r1)\n	std %r6, 384(%r1)\n"
	"	std %r14, 96(%r1)\n	std %r15, 104(%r1)\n	std %r16, 112(%r1)\n	std %r17, 120(%r1)\n	std %r18, 128(%r1)\n	std %r19, 136(%r1)\n"
	"	std %r20, 144(%r1)\n	std %r21, 152(%r1)\n	std %r22, 160(%r1)\n	std %r23, 168(%r1)\n	std %r24, 176(%r1)\n	std %r25, 184(%r1)\n"
	"	std %r26, 192(%r1)\n	std %r27, 200(%r1)\n	std %r28, 208(%r1)\n	std %r29, 216(%r1)\n	std %r30, 224(%r1)\n	std %r31, 232(%r1)\n"
	"	stfd %f14, 240(%r1)\n	stfd %f15, 248(%r1)\n	stfd %f16, 256(%r1)\n	stfd %f17, 264(%r1)\n	stfd %f18, 272(%r1)\n	stfd %f19, 280(%r1)\n"
	"	stfd %f20, 288(%r1)\n	stfd %f21, 296(%r1)\n	stfd %f22, 304(%r1)\n	stfd %f23, 312(%r1)\n	stfd %f24, 320(%r1)\n	stfd %f25, 328(%r1)\n"
	"	stfd %f26, 336(%r1)\n	stfd %f27, 344(%r1)\n	stfd %f28, 352(%r1)\n	stfd %f29, 360(%r1)\n	stfd %f30, 368(%r1)\n	stfd %f31, 376(%r1)\n"
	PPC_LOAD(14) PPC_LOAD(15) PPC_LOAD(16) PPC_LOAD(17) PPC_LOAD(18) PPC_LOAD(19)
	PPC_LOAD(20) PPC_LOAD(21) PPC_LOAD(22) PPC_LOAD(23) PPC_LOAD(24) PPC_LOAD(25)
	PPC_LOAD(26) PPC_LOAD(27) PPC_LOAD(28) PPC_LOAD(29) PPC_LOAD(30) PPC_LOAD(31)
	/* fn(a, b) through CTR with %r12 = fn (ELFv2 global entry). */
	"	mr %r12, %r3\n	mtctr %r3\n	mr %r3, %r4\n	mr %r4, %r5\n"
	"	bctrl\n"
	"	ld %r2, 24(%r1)\n"
	"	li %r5, 0\n"
	PPC_CHECK(14, 0) PPC_CHECK(15, 1) PPC_CHECK(16, 2) PPC_CHECK(17, 3) PPC_CHECK(18, 4) PPC_CHECK(19, 5)
	PPC_CHECK(20, 6) PPC_CHECK(21, 7) PPC_CHECK(22, 8) PPC_CHECK(23, 9) PPC_CHECK(24, 10) PPC_CHECK(25, 11)
	PPC_CHECK(26, 12) PPC_CHECK(27, 13) PPC_CHECK(28, 14) PPC_CHECK(29, 15) PPC_CHECK(30, 16) PPC_CHECK(31, 17)
	PPC_CHECK_FP(14, 18) PPC_CHECK_FP(15, 19) PPC_CHECK_FP(16, 20) PPC_CHECK_FP(17, 21) PPC_CHECK_FP(18, 22)
	PPC_CHECK_FP(19, 23) PPC_CHECK_FP(20, 24) PPC_CHECK_FP(21, 25) PPC_CHECK_FP(22, 26) PPC_CHECK_FP(23, 27)
	PPC_CHECK_FP(24, 28) PPC_CHECK_FP(25, 29) PPC_CHECK_FP(26, 30) PPC_CHECK_FP(27, 31) PPC_CHECK_FP(28, 32)
	PPC_CHECK_FP(29, 33) PPC_CHECK_FP(30, 34) PPC_CHECK_FP(31, 35)
	"	ld %r6, 384(%r1)\n	std %r5, 0(%r6)\n"
	"	ld %r14, 96(%r1)\n	ld %r15, 104(%r1)\n	ld %r16, 112(%r1)\n	ld %r17, 120(%r1)\n	ld %r18, 128(%r1)\n	ld %r19, 136(%r1)\n"
	"	ld %r20, 144(%r1)\n	ld %r21, 152(%r1)\n	ld %r22, 160(%r1)\n	ld %r23, 168(%r1)\n	ld %r24, 176(%r1)\n	ld %r25, 184(%r1)\n"
	"	ld %r26, 192(%r1)\n	ld %r27, 200(%r1)\n	ld %r28, 208(%r1)\n	ld %r29, 216(%r1)\n	ld %r30, 224(%r1)\n	ld %r31, 232(%r1)\n"
	"	lfd %f14, 240(%r1)\n	lfd %f15, 248(%r1)\n	lfd %f16, 256(%r1)\n	lfd %f17, 264(%r1)\n	lfd %f18, 272(%r1)\n	lfd %f19, 280(%r1)\n"
	"	lfd %f20, 288(%r1)\n	lfd %f21, 296(%r1)\n	lfd %f22, 304(%r1)\n	lfd %f23, 312(%r1)\n	lfd %f24, 320(%r1)\n	lfd %f25, 328(%r1)\n"
	"	lfd %f26, 336(%r1)\n	lfd %f27, 344(%r1)\n	lfd %f28, 352(%r1)\n	lfd %f29, 360(%r1)\n	lfd %f30, 368(%r1)\n	lfd %f31, 376(%r1)\n"
	"	addi %r1, %r1, 400\n	ld %r0, 16(%r1)\n	mtlr %r0\n	blr\n"
	".size arch_call_checked, .-arch_call_checked\n");

extern char _mcount[];

/* `bl _mcount` at p -> `nop`. */
static void arch_nop_at(unsigned int *p)
{
	long page = sysconf(_SC_PAGESIZE);
	unsigned long start = (unsigned long)p & ~(unsigned long)(page - 1);
	mprotect((void *)start, 2 * page, PROT_READ | PROT_WRITE | PROT_EXEC);
	*p = 0x60000000; /* nop */
	mprotect((void *)start, 2 * page, PROT_READ | PROT_EXEC);
	__builtin___clear_cache((char *)p, (char *)(p + 1));
}

/* Every `mflr r0 ; bl _mcount` in the main program's executable segments
 * (its program headers from the auxiliary vector, its load bias from
 * PT_PHDR). */
__attribute__((constructor)) static void arch_init_sites(void)
{
	const Elf64_Phdr *phdr = (const Elf64_Phdr *)getauxval(AT_PHDR);
	unsigned long phnum = getauxval(AT_PHNUM), bias = 0;
	for (unsigned long i = 0; i < phnum; i++)
		if (phdr[i].p_type == PT_PHDR)
			bias = (unsigned long)phdr - phdr[i].p_vaddr;
	for (unsigned long i = 0; i < phnum; i++) {
		if (phdr[i].p_type != PT_LOAD || !(phdr[i].p_flags & PF_X))
			continue;
		unsigned int *p = (unsigned int *)((bias + phdr[i].p_vaddr + 3) & ~3UL);
		unsigned int *end = (unsigned int *)(bias + phdr[i].p_vaddr + phdr[i].p_memsz);
		for (; p + 1 < end; p++) {
			unsigned int bl = p[1];
			if (p[0] != 0x7c0802a6 || (bl & 0xfc000003) != 0x48000001)
				continue;
			long off = (long)((int)((bl & 0x03fffffc) << 6) >> 6);
			if ((char *)&p[1] + off == _mcount)
				arch_nop_at(&p[1]);
		}
	}
}
#endif

/* The enabled form of a site (used by the object test; the JIT test uses
 * the generator's own site encoder): `mflr r0 ; bl target`. */
static inline int arch_site_call(unsigned char *buf, unsigned long site, unsigned long target)
{
	long rel = (long)target - (long)(site + 4);
	if (rel < -(1L << 25) || rel >= (1L << 25) || (rel & 3))
		return -1;
	unsigned int mflr = 0x7c0802a6;                               /* mflr r0 */
	unsigned int bl = 0x48000001 | ((unsigned int)rel & 0x03fffffc); /* bl target */
	for (int i = 0; i < 4; i++) {
		buf[i] = (unsigned char)(mflr >> (8 * i));
		buf[4 + i] = (unsigned char)(bl >> (8 * i));
	}
	return 8;
}
