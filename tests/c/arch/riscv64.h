/* riscv64 parts of the execution-test harness (see harness.c). */
#define ARCH_SP_MOD 0 /* sp is 16-byte aligned at every call (psABI) */

/* The pattern arch_call_checked loads into callee-saved register number n
 * (s0 = x8 -> 0x0808080808080808; fsN gets the pattern of sN). */
#define RV_PAT(n) "0x" #n #n #n #n #n #n #n #n
#define RV_LOAD(s, fs, n) "	li " #s ", " RV_PAT(n) "\n	fmv.d.x " #fs ", " #s "\n"
/* Sets bit `bit` of t2 when register `r` (moved to t3) lost its pattern. */
#define RV_CHECK(r, n, bit) "	li t1, " RV_PAT(n) "\n	xor t1, t1, " #r "\n	snez t1, t1\n	slli t1, t1, " #bit "\n	or t2, t2, t1\n"
#define RV_CHECK_FP(f, n, bit) "	fmv.x.d t3, " #f "\n" RV_CHECK(t3, n, bit)

#ifdef ARCH_HARNESS_ASM /* defined by harness.c only */
__asm__(
	".text\n"
	".globl arch_sp_probe\n"
	".type arch_sp_probe,@function\n"
	"arch_sp_probe:\n"
	"	mv t0, sp\n"
	"	lla t1, arch_probe_sp\n	sd t0, 0(t1)\n"
	"	lla t1, arch_probe_calls\n	ld t0, 0(t1)\n	addi t0, t0, 1\n	sd t0, 0(t1)\n"
	"	ret\n"
	".size arch_sp_probe, .-arch_sp_probe\n"

	/* Frame (208 bytes): ra at 0, s0-s11 at 8.., fs0-fs11 at 104.., bad at 200. */
	".globl arch_call_checked\n"
	".type arch_call_checked,@function\n"
	"arch_call_checked:\n"
	"	addi sp, sp, -208\n"
	"	sd ra, 0(sp)\n"
	"	sd s0, 8(sp)\n	sd s1, 16(sp)\n	sd s2, 24(sp)\n	sd s3, 32(sp)\n	sd s4, 40(sp)\n	sd s5, 48(sp)\n"
	"	sd s6, 56(sp)\n	sd s7, 64(sp)\n	sd s8, 72(sp)\n	sd s9, 80(sp)\n	sd s10, 88(sp)\n	sd s11, 96(sp)\n"
	"	fsd fs0, 104(sp)\n	fsd fs1, 112(sp)\n	fsd fs2, 120(sp)\n	fsd fs3, 128(sp)\n	fsd fs4, 136(sp)\n	fsd fs5, 144(sp)\n"
	"	fsd fs6, 152(sp)\n	fsd fs7, 160(sp)\n	fsd fs8, 168(sp)\n	fsd fs9, 176(sp)\n	fsd fs10, 184(sp)\n	fsd fs11, 192(sp)\n"
	"	sd a3, 200(sp)\n"
	"	mv t0, a0\n	mv a0, a1\n	mv a1, a2\n"
	RV_LOAD(s0, fs0, 08) RV_LOAD(s1, fs1, 09) RV_LOAD(s2, fs2, 18) RV_LOAD(s3, fs3, 19)
	RV_LOAD(s4, fs4, 20) RV_LOAD(s5, fs5, 21) RV_LOAD(s6, fs6, 22) RV_LOAD(s7, fs7, 23)
	RV_LOAD(s8, fs8, 24) RV_LOAD(s9, fs9, 25) RV_LOAD(s10, fs10, 26) RV_LOAD(s11, fs11, 27)
	"	jalr t0\n"
	"	li t2, 0\n"
	RV_CHECK(s0, 08, 0) RV_CHECK(s1, 09, 1) RV_CHECK(s2, 18, 2) RV_CHECK(s3, 19, 3)
	RV_CHECK(s4, 20, 4) RV_CHECK(s5, 21, 5) RV_CHECK(s6, 22, 6) RV_CHECK(s7, 23, 7)
	RV_CHECK(s8, 24, 8) RV_CHECK(s9, 25, 9) RV_CHECK(s10, 26, 10) RV_CHECK(s11, 27, 11)
	RV_CHECK_FP(fs0, 08, 12) RV_CHECK_FP(fs1, 09, 13) RV_CHECK_FP(fs2, 18, 14) RV_CHECK_FP(fs3, 19, 15)
	RV_CHECK_FP(fs4, 20, 16) RV_CHECK_FP(fs5, 21, 17) RV_CHECK_FP(fs6, 22, 18) RV_CHECK_FP(fs7, 23, 19)
	RV_CHECK_FP(fs8, 24, 20) RV_CHECK_FP(fs9, 25, 21) RV_CHECK_FP(fs10, 26, 22) RV_CHECK_FP(fs11, 27, 23)
	"	ld a3, 200(sp)\n	sd t2, 0(a3)\n"
	"	fld fs0, 104(sp)\n	fld fs1, 112(sp)\n	fld fs2, 120(sp)\n	fld fs3, 128(sp)\n	fld fs4, 136(sp)\n	fld fs5, 144(sp)\n"
	"	fld fs6, 152(sp)\n	fld fs7, 160(sp)\n	fld fs8, 168(sp)\n	fld fs9, 176(sp)\n	fld fs10, 184(sp)\n	fld fs11, 192(sp)\n"
	"	ld s0, 8(sp)\n	ld s1, 16(sp)\n	ld s2, 24(sp)\n	ld s3, 32(sp)\n	ld s4, 40(sp)\n	ld s5, 48(sp)\n"
	"	ld s6, 56(sp)\n	ld s7, 64(sp)\n	ld s8, 72(sp)\n	ld s9, 80(sp)\n	ld s10, 88(sp)\n	ld s11, 96(sp)\n"
	"	ld ra, 0(sp)\n"
	"	addi sp, sp, 208\n"
	"	ret\n"
	".size arch_call_checked, .-arch_call_checked\n");
#endif

/* The enabled form of a site, `auipc t0, hi ; jalr t0, lo(t0)` (used by the
 * object test; the JIT test uses the generator's own site encoder). */
static inline int arch_site_call(unsigned char *buf, unsigned long site, unsigned long target)
{
	long rel = (long)target - (long)site;
	if (rel < -(1L << 31) - (1L << 11) || rel >= (1L << 31) - (1L << 11))
		return -1;
	long hi = (rel + 0x800) >> 12; /* rounded: jalr sign-extends lo */
	long lo = rel - hi * 4096;
	unsigned int auipc = 0x00000297u | ((unsigned int)hi << 12); /* auipc t0, hi */
	unsigned int jalr = 0x000282e7u | ((unsigned int)lo << 20);  /* jalr t0, lo(t0) */
	for (int i = 0; i < 4; i++) {
		buf[i] = (unsigned char)(auipc >> (8 * i));
		buf[4 + i] = (unsigned char)(jalr >> (8 * i));
	}
	return 8;
}
