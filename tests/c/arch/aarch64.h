/* aarch64 parts of the execution-test harness (see harness.c). */
#define ARCH_SP_MOD 0 /* sp is always 16-byte aligned */

#ifdef ARCH_HARNESS_ASM /* defined by harness.c only */
__asm__(
	".text\n"
	".globl arch_sp_probe\n"
	".type arch_sp_probe,%function\n"
	"arch_sp_probe:\n"
	"	mov x9, sp\n"
	"	adrp x10, arch_probe_sp\n	str x9, [x10, :lo12:arch_probe_sp]\n"
	"	adrp x10, arch_probe_calls\n	ldr x9, [x10, :lo12:arch_probe_calls]\n	add x9, x9, #1\n	str x9, [x10, :lo12:arch_probe_calls]\n"
	"	ret\n"
	".size arch_sp_probe, .-arch_sp_probe\n"

	".globl arch_call_checked\n"
	".type arch_call_checked,%function\n"
	"arch_call_checked:\n"
	"	stp x29, x30, [sp, #-176]!\n"
	"	stp x19, x20, [sp, #16]\n	stp x21, x22, [sp, #32]\n	stp x23, x24, [sp, #48]\n"
	"	stp x25, x26, [sp, #64]\n	stp x27, x28, [sp, #80]\n"
	"	stp d8, d9, [sp, #96]\n	stp d10, d11, [sp, #112]\n	stp d12, d13, [sp, #128]\n	stp d14, d15, [sp, #144]\n"
	"	str x3, [sp, #160]\n"
	"	mov x9, x0\n	mov x0, x1\n	mov x1, x2\n"
	"	ldr x19, =0x1919191919191919\n	ldr x20, =0x2020202020202020\n	ldr x21, =0x2121212121212121\n"
	"	ldr x22, =0x2222222222222222\n	ldr x23, =0x2323232323232323\n	ldr x24, =0x2424242424242424\n"
	"	ldr x25, =0x2525252525252525\n	ldr x26, =0x2626262626262626\n	ldr x27, =0x2727272727272727\n"
	"	ldr x28, =0x2828282828282828\n	ldr x29, =0x2929292929292929\n"
	"	fmov d8, x19\n	fmov d9, x20\n	fmov d10, x21\n	fmov d11, x22\n"
	"	fmov d12, x23\n	fmov d13, x24\n	fmov d14, x25\n	fmov d15, x26\n"
	"	blr x9\n"
	"	mov x2, #0\n"
	"	ldr x4, =0x1919191919191919\n	cmp x19, x4\n	cset x5, ne\n	orr x2, x2, x5, lsl #0\n"
	"	ldr x4, =0x2020202020202020\n	cmp x20, x4\n	cset x5, ne\n	orr x2, x2, x5, lsl #1\n"
	"	ldr x4, =0x2121212121212121\n	cmp x21, x4\n	cset x5, ne\n	orr x2, x2, x5, lsl #2\n"
	"	ldr x4, =0x2222222222222222\n	cmp x22, x4\n	cset x5, ne\n	orr x2, x2, x5, lsl #3\n"
	"	ldr x4, =0x2323232323232323\n	cmp x23, x4\n	cset x5, ne\n	orr x2, x2, x5, lsl #4\n"
	"	ldr x4, =0x2424242424242424\n	cmp x24, x4\n	cset x5, ne\n	orr x2, x2, x5, lsl #5\n"
	"	ldr x4, =0x2525252525252525\n	cmp x25, x4\n	cset x5, ne\n	orr x2, x2, x5, lsl #6\n"
	"	ldr x4, =0x2626262626262626\n	cmp x26, x4\n	cset x5, ne\n	orr x2, x2, x5, lsl #7\n"
	"	ldr x4, =0x2727272727272727\n	cmp x27, x4\n	cset x5, ne\n	orr x2, x2, x5, lsl #8\n"
	"	ldr x4, =0x2828282828282828\n	cmp x28, x4\n	cset x5, ne\n	orr x2, x2, x5, lsl #9\n"
	"	ldr x4, =0x2929292929292929\n	cmp x29, x4\n	cset x5, ne\n	orr x2, x2, x5, lsl #10\n"
	"	fmov x6, d8\n	ldr x4, =0x1919191919191919\n	cmp x6, x4\n	cset x5, ne\n	orr x2, x2, x5, lsl #11\n"
	"	fmov x6, d9\n	ldr x4, =0x2020202020202020\n	cmp x6, x4\n	cset x5, ne\n	orr x2, x2, x5, lsl #12\n"
	"	fmov x6, d10\n	ldr x4, =0x2121212121212121\n	cmp x6, x4\n	cset x5, ne\n	orr x2, x2, x5, lsl #13\n"
	"	fmov x6, d11\n	ldr x4, =0x2222222222222222\n	cmp x6, x4\n	cset x5, ne\n	orr x2, x2, x5, lsl #14\n"
	"	fmov x6, d12\n	ldr x4, =0x2323232323232323\n	cmp x6, x4\n	cset x5, ne\n	orr x2, x2, x5, lsl #15\n"
	"	fmov x6, d13\n	ldr x4, =0x2424242424242424\n	cmp x6, x4\n	cset x5, ne\n	orr x2, x2, x5, lsl #16\n"
	"	fmov x6, d14\n	ldr x4, =0x2525252525252525\n	cmp x6, x4\n	cset x5, ne\n	orr x2, x2, x5, lsl #17\n"
	"	fmov x6, d15\n	ldr x4, =0x2626262626262626\n	cmp x6, x4\n	cset x5, ne\n	orr x2, x2, x5, lsl #18\n"
	"	ldr x3, [sp, #160]\n	str x2, [x3]\n"
	"	ldp d8, d9, [sp, #96]\n	ldp d10, d11, [sp, #112]\n	ldp d12, d13, [sp, #128]\n	ldp d14, d15, [sp, #144]\n"
	"	ldp x19, x20, [sp, #16]\n	ldp x21, x22, [sp, #32]\n	ldp x23, x24, [sp, #48]\n"
	"	ldp x25, x26, [sp, #64]\n	ldp x27, x28, [sp, #80]\n"
	"	ldp x29, x30, [sp], #176\n"
	"	ret\n"
	".ltorg\n"
	".size arch_call_checked, .-arch_call_checked\n");
#endif

static inline int arch_site_call(unsigned char *buf, unsigned long site, unsigned long target)
{
	long rel = (long)target - (long)(site + 4);
	if (rel < -(1L << 27) || rel >= (1L << 27))
		return -1;
	unsigned int mov = 0xaa1e03e9; /* mov x9, x30 */
	unsigned int bl = 0x94000000 | (((unsigned long)rel >> 2) & 0x3ffffff);
	for (int i = 0; i < 4; i++) {
		buf[i] = (unsigned char)(mov >> (8 * i));
		buf[4 + i] = (unsigned char)(bl >> (8 * i));
	}
	return 8;
}
