/* s390x parts of the execution-test harness (see harness.c). */
/* The psABI keeps r15 8-byte aligned; arch_call_checked enters the callee
   with r15 16-byte aligned, and the trampoline frames are multiples of 16,
   so the callback must see a 16-byte aligned r15 too. */
#define ARCH_SP_MOD 0
/* arch_call_misaligned(fn, a, b) below: fn(a, b) entered with r15 = 8 mod 16,
   as the psABI allows and gcc does whenever a caller's frame is. */
#define ARCH_CALL_MISALIGNED 1

#ifdef ARCH_HARNESS_ASM /* defined by harness.c only */
__asm__(
	".text\n"
	".globl arch_sp_probe\n"
	".type arch_sp_probe,@function\n"
	"arch_sp_probe:\n"
	"	larl %r1,arch_probe_sp\n	stg %r15,0(%r1)\n"
	"	larl %r1,arch_probe_calls\n	lg %r2,0(%r1)\n	aghi %r2,1\n	stg %r2,0(%r1)\n"
	"	br %r14\n"
	".size arch_sp_probe, .-arch_sp_probe\n"

	/* r2 = fn, r3/r4 = its arguments.  Frame: the callee's 160-byte save
	   area, the caller's sp at 160; r15 = 8 mod 16 at the call. */
	".globl arch_call_misaligned\n"
	".type arch_call_misaligned,@function\n"
	"arch_call_misaligned:\n"
	"	stmg %r14,%r15,112(%r15)\n"
	"	lgr %r1,%r15\n	lay %r15,-192(%r15)\n	nill %r15,0xfff0\n	aghi %r15,-8\n"
	"	stg %r1,160(%r15)\n"
	"	lgr %r1,%r2\n	lgr %r2,%r3\n	lgr %r3,%r4\n"
	"	basr %r14,%r1\n"
	"	lg %r15,160(%r15)\n	lmg %r14,%r15,112(%r15)\n"
	"	br %r14\n"
	".size arch_call_misaligned, .-arch_call_misaligned\n"

	/* r2 = fn, r3/r4 = its arguments, r5 = bad.  Frame: 160-byte save area
	   for the callee, caller sp at 160, bad at 168, f8-f15 at 176..239. */
	".globl arch_call_checked\n"
	".type arch_call_checked,@function\n"
	"arch_call_checked:\n"
	"	stmg %r6,%r15,48(%r15)\n"
	"	lgr %r1,%r15\n	lay %r15,-256(%r15)\n	nill %r15,0xfff0\n"
	"	stg %r1,160(%r15)\n	stg %r5,168(%r15)\n"
	"	std %f8,176(%r15)\n	std %f9,184(%r15)\n	std %f10,192(%r15)\n	std %f11,200(%r15)\n	std %f12,208(%r15)\n	std %f13,216(%r15)\n	std %f14,224(%r15)\n	std %f15,232(%r15)\n"
	"	lgr %r1,%r2\n	lgr %r2,%r3\n	lgr %r3,%r4\n"
	"	llihf %r6,0x06060606\n	iilf %r6,0x06060606\n"
	"	llihf %r7,0x07070707\n	iilf %r7,0x07070707\n"
	"	llihf %r8,0x08080808\n	iilf %r8,0x08080808\n"
	"	llihf %r9,0x09090909\n	iilf %r9,0x09090909\n"
	"	llihf %r10,0x10101010\n	iilf %r10,0x10101010\n"
	"	llihf %r11,0x11111111\n	iilf %r11,0x11111111\n"
	"	llihf %r12,0x12121212\n	iilf %r12,0x12121212\n"
	"	llihf %r13,0x13131313\n	iilf %r13,0x13131313\n"
	"	llihf %r0,0x18181818\n	iilf %r0,0x18181818\n	ldgr %f8,%r0\n"
	"	llihf %r0,0x19191919\n	iilf %r0,0x19191919\n	ldgr %f9,%r0\n"
	"	llihf %r0,0x20202020\n	iilf %r0,0x20202020\n	ldgr %f10,%r0\n"
	"	llihf %r0,0x21212121\n	iilf %r0,0x21212121\n	ldgr %f11,%r0\n"
	"	llihf %r0,0x22222222\n	iilf %r0,0x22222222\n	ldgr %f12,%r0\n"
	"	llihf %r0,0x23232323\n	iilf %r0,0x23232323\n	ldgr %f13,%r0\n"
	"	llihf %r0,0x24242424\n	iilf %r0,0x24242424\n	ldgr %f14,%r0\n"
	"	llihf %r0,0x25252525\n	iilf %r0,0x25252525\n	ldgr %f15,%r0\n"
	"	basr %r14,%r1\n"
	"	lghi %r4,0\n"
	"	llihf %r0,0x06060606\n	iilf %r0,0x06060606\n	cgr %r6,%r0\n	je 1f\n	oilf %r4,1\n1:\n"
	"	llihf %r0,0x07070707\n	iilf %r0,0x07070707\n	cgr %r7,%r0\n	je 1f\n	oilf %r4,2\n1:\n"
	"	llihf %r0,0x08080808\n	iilf %r0,0x08080808\n	cgr %r8,%r0\n	je 1f\n	oilf %r4,4\n1:\n"
	"	llihf %r0,0x09090909\n	iilf %r0,0x09090909\n	cgr %r9,%r0\n	je 1f\n	oilf %r4,8\n1:\n"
	"	llihf %r0,0x10101010\n	iilf %r0,0x10101010\n	cgr %r10,%r0\n	je 1f\n	oilf %r4,16\n1:\n"
	"	llihf %r0,0x11111111\n	iilf %r0,0x11111111\n	cgr %r11,%r0\n	je 1f\n	oilf %r4,32\n1:\n"
	"	llihf %r0,0x12121212\n	iilf %r0,0x12121212\n	cgr %r12,%r0\n	je 1f\n	oilf %r4,64\n1:\n"
	"	llihf %r0,0x13131313\n	iilf %r0,0x13131313\n	cgr %r13,%r0\n	je 1f\n	oilf %r4,128\n1:\n"
	"	lgdr %r1,%f8\n	llihf %r0,0x18181818\n	iilf %r0,0x18181818\n	cgr %r1,%r0\n	je 1f\n	oilf %r4,256\n1:\n"
	"	lgdr %r1,%f9\n	llihf %r0,0x19191919\n	iilf %r0,0x19191919\n	cgr %r1,%r0\n	je 1f\n	oilf %r4,512\n1:\n"
	"	lgdr %r1,%f10\n	llihf %r0,0x20202020\n	iilf %r0,0x20202020\n	cgr %r1,%r0\n	je 1f\n	oilf %r4,1024\n1:\n"
	"	lgdr %r1,%f11\n	llihf %r0,0x21212121\n	iilf %r0,0x21212121\n	cgr %r1,%r0\n	je 1f\n	oilf %r4,2048\n1:\n"
	"	lgdr %r1,%f12\n	llihf %r0,0x22222222\n	iilf %r0,0x22222222\n	cgr %r1,%r0\n	je 1f\n	oilf %r4,4096\n1:\n"
	"	lgdr %r1,%f13\n	llihf %r0,0x23232323\n	iilf %r0,0x23232323\n	cgr %r1,%r0\n	je 1f\n	oilf %r4,8192\n1:\n"
	"	lgdr %r1,%f14\n	llihf %r0,0x24242424\n	iilf %r0,0x24242424\n	cgr %r1,%r0\n	je 1f\n	oilf %r4,16384\n1:\n"
	"	lgdr %r1,%f15\n	llihf %r0,0x25252525\n	iilf %r0,0x25252525\n	cgr %r1,%r0\n	je 1f\n	oilf %r4,32768\n1:\n"
	"	lg %r1,168(%r15)\n	stg %r4,0(%r1)\n"
	"	ld %f8,176(%r15)\n	ld %f9,184(%r15)\n	ld %f10,192(%r15)\n	ld %f11,200(%r15)\n	ld %f12,208(%r15)\n	ld %f13,216(%r15)\n	ld %f14,224(%r15)\n	ld %f15,232(%r15)\n"
	"	lg %r15,160(%r15)\n	lmg %r6,%r15,48(%r15)\n"
	"	br %r14\n"
	".size arch_call_checked, .-arch_call_checked\n"

	/* s390x only (exectest/tests/jit.rs): vector argument registers at full
	   width and the condition code.  arch_vec_call(fn) loads
	   arch_vec_pattern into v0-v7 and v24-v31, sets cc 2 and calls fn;
	   arch_vec_tracee (a patch site, then) stores v0-v7/v24-v31 into
	   arch_vec_seen and returns the cc it was entered with;
	   arch_clobber (a callback's helper) zeroes those registers and sets
	   cc 0. */
	".machine push\n"
	".machine z13\n"
	".globl arch_vec_tracee\n"
	".type arch_vec_tracee,@function\n"
	".align 8\n"
	"arch_vec_tracee:\n"
	"	nopr %r0\n	nopr %r0\n	nopr %r0\n"
	"	lghi %r2,0\n	ipm %r2\n	srlg %r2,%r2,28\n"
	"	larl %r1,arch_vec_seen\n	vstm %v0,%v7,0(%r1)\n	vstm %v24,%v31,128(%r1)\n"
	"	br %r14\n"
	".size arch_vec_tracee, .-arch_vec_tracee\n"
	".globl arch_vec_call\n"
	".type arch_vec_call,@function\n"
	"arch_vec_call:\n"
	"	stmg %r14,%r15,112(%r15)\n	lay %r15,-160(%r15)\n"
	"	lgr %r1,%r2\n	larl %r2,arch_vec_pattern\n	vlm %v0,%v7,0(%r2)\n	vlm %v24,%v31,128(%r2)\n"
	"	lghi %r0,1\n	cghi %r0,0\n" /* cc 2: first operand high */
	"	basr %r14,%r1\n"
	"	lmg %r14,%r15,272(%r15)\n	br %r14\n"
	".size arch_vec_call, .-arch_vec_call\n"
	".globl arch_clobber\n"
	".type arch_clobber,@function\n"
	"arch_clobber:\n"
	"	vzero %v0\n	vzero %v1\n	vzero %v2\n	vzero %v3\n	vzero %v4\n	vzero %v5\n	vzero %v6\n	vzero %v7\n"
	"	vzero %v24\n	vzero %v25\n	vzero %v26\n	vzero %v27\n	vzero %v28\n	vzero %v29\n	vzero %v30\n	vzero %v31\n"
	"	lghi %r0,0\n	cghi %r0,0\n" /* cc 0 */
	"	br %r14\n"
	".size arch_clobber, .-arch_clobber\n"
	".machine pop\n");

/* 16 registers x 16 bytes: v0-v7, then v24-v31. */
unsigned char arch_vec_pattern[256] __attribute__((aligned(16))) = {
#define ROW(r) r, r + 1, r + 2, r + 3, r + 4, r + 5, r + 6, r + 7, r + 8, r + 9, r + 10, r + 11, r + 12, r + 13, r + 14, r + 15
	ROW(0x10), ROW(0x20), ROW(0x30), ROW(0x40), ROW(0x50), ROW(0x60), ROW(0x70), ROW(0x80),
	ROW(0x90), ROW(0xa0), ROW(0xb0), ROW(0xc0), ROW(0xd0), ROW(0xe0), ROW(0x01), ROW(0x41),
#undef ROW
};
unsigned char arch_vec_seen[256] __attribute__((aligned(16)));
#endif

/* brasl %r0,target: c0 05, then the halfword distance big-endian. */
static inline int arch_site_call(unsigned char *buf, unsigned long site, unsigned long target)
{
	long rel = (long)target - (long)site;
	if ((rel & 1) || rel < -(1L << 32) || rel > (1L << 32) - 2)
		return -1;
	unsigned long half = (unsigned long)(rel / 2);
	buf[0] = 0xc0;
	buf[1] = 0x05;
	for (int i = 0; i < 4; i++)
		buf[2 + i] = (unsigned char)(half >> (24 - 8 * i));
	return 6;
}
