/* x86_64 parts of the execution-test harness (see harness.c). */
#define ARCH_SP_MOD 8 /* after `call`, rsp + 8 is 16-byte aligned */
/* arch_call_misaligned(fn, a, b) below: fn(a, b) entered with rsp 16-byte aligned. */
#define ARCH_CALL_MISALIGNED 1

/* Eight x87 pushes and pops: a callee may use the whole register stack,
 * which the psABI has empty at every call. */
#define ARCH_CLOBBER_FP_STACK()                                                                      \
	__asm__ volatile("fld1\n fldz\n fld1\n fldz\n fld1\n fldz\n fld1\n fldpi\n"              \
			 "fstp %%st(0)\n fstp %%st(0)\n fstp %%st(0)\n fstp %%st(0)\n"                \
			 "fstp %%st(0)\n fstp %%st(0)\n fstp %%st(0)\n fstp %%st(0)\n" ::                \
				 : "st", "st(1)", "st(2)", "st(3)", "st(4)", "st(5)", "st(6)", "st(7)")

#ifdef ARCH_HARNESS_ASM /* defined by harness.c only */
__asm__(
	".text\n"
	".globl arch_sp_probe\n"
	".type arch_sp_probe,@function\n"
	"arch_sp_probe:\n"
	"	mov %rsp, arch_probe_sp(%rip)\n"
	"	incq arch_probe_calls(%rip)\n"
	"	ret\n"
	".size arch_sp_probe, .-arch_sp_probe\n"

	".globl arch_call_checked\n"
	".type arch_call_checked,@function\n"
	"arch_call_checked:\n"
	"	push %rbx\n	push %rbp\n	push %r12\n	push %r13\n	push %r14\n	push %r15\n"
	"	push %rcx\n" /* 7 pushes: rsp is 16-byte aligned again */
	"	mov %rdi, %rax\n	mov %rsi, %rdi\n	mov %rdx, %rsi\n"
	"	movabs $0x1111111111111101, %rbx\n"
	"	movabs $0x2222222222222202, %rbp\n"
	"	movabs $0x3333333333333303, %r12\n"
	"	movabs $0x4444444444444404, %r13\n"
	"	movabs $0x5555555555555505, %r14\n"
	"	movabs $0x6666666666666606, %r15\n"
	"	call *%rax\n"
	"	pop %rcx\n"
	"	xor %edx, %edx\n"
	"	movabs $0x1111111111111101, %r8\n	cmp %r8, %rbx\n	je 1f\n	or $1, %edx\n1:\n"
	"	movabs $0x2222222222222202, %r8\n	cmp %r8, %rbp\n	je 1f\n	or $2, %edx\n1:\n"
	"	movabs $0x3333333333333303, %r8\n	cmp %r8, %r12\n	je 1f\n	or $4, %edx\n1:\n"
	"	movabs $0x4444444444444404, %r8\n	cmp %r8, %r13\n	je 1f\n	or $8, %edx\n1:\n"
	"	movabs $0x5555555555555505, %r8\n	cmp %r8, %r14\n	je 1f\n	or $16, %edx\n1:\n"
	"	movabs $0x6666666666666606, %r8\n	cmp %r8, %r15\n	je 1f\n	or $32, %edx\n1:\n"
	"	mov %rdx, (%rcx)\n"
	"	pop %r15\n	pop %r14\n	pop %r13\n	pop %r12\n	pop %rbp\n	pop %rbx\n"
	"	ret\n"
	".size arch_call_checked, .-arch_call_checked\n"

	/* A function whose patch site (five NOPs) is followed by reading the
	 * flags: it returns the flags the code after the site sees.  And a
	 * caller that sets the flags to its second argument first. */
	".globl arch_flags_tracee\n"
	".type arch_flags_tracee,@function\n"
	".p2align 4\n"
	"arch_flags_tracee:\n"
	"	.byte 0x90, 0x90, 0x90, 0x90, 0x90\n"
	"	pushfq\n	pop %rax\n	ret\n"
	".size arch_flags_tracee, .-arch_flags_tracee\n"
	/* Calls f(a, b) on a stack that breaks the ABI the way gcc's
	 * -fipa-stack-alignment does: rsp is 16-byte aligned at f's entry. */
	".globl arch_call_misaligned\n"
	".type arch_call_misaligned,@function\n"
	"arch_call_misaligned:\n"
	"	sub $16, %rsp\n"
	"	mov %rdi, %rax\n	mov %rsi, %rdi\n	mov %rdx, %rsi\n"
	"	call *%rax\n"
	"	add $16, %rsp\n"
	"	ret\n"
	".size arch_call_misaligned, .-arch_call_misaligned\n"
	/* A return handler that records its sp, then goes on to the real one
	 * (arch_ret_next). */
	".globl arch_ret_probe\n"
	".type arch_ret_probe,@function\n"
	"arch_ret_probe:\n"
	"	mov %rsp, arch_probe_sp(%rip)\n"
	"	incq arch_probe_calls(%rip)\n"
	"	jmp *arch_ret_next(%rip)\n"
	".size arch_ret_probe, .-arch_ret_probe\n"
	".data\n"
	".globl arch_ret_next\n"
	"arch_ret_next: .quad 0\n"
	".text\n"
	".globl arch_call_with_flags\n"
	".type arch_call_with_flags,@function\n"
	"arch_call_with_flags:\n"
	"	push %rsi\n	popfq\n	jmp *%rdi\n"
	".size arch_call_with_flags, .-arch_call_with_flags\n");
#endif

/* The enabled form of a site (used by the object test; the JIT test uses
 * the generator's own site encoder). */
static inline int arch_site_call(unsigned char *buf, unsigned long site, unsigned long target)
{
	long rel = (long)target - (long)(site + 5);
	if (rel != (int)rel)
		return -1;
	buf[0] = 0xe8;
	for (int i = 0; i < 4; i++)
		buf[1 + i] = (unsigned char)((unsigned long)rel >> (8 * i));
	return 5;
}
