/* aarch64: a function with an SVE argument and result, which GCC marks
 * STO_AARCH64_VARIANT_PCS (the SVE vector PCS), beside a plain one.
 * Discovery refuses the first: the trampolines keep only q0-q7, and the
 * SVE PCS has callers expect z8-z23 and p4-p15 preserved
 * (exectest/tests/sites.rs). */
#include <arm_sve.h>

svfloat64_t sites_sve_twice(svfloat64_t a)
{
    return svadd_f64_x(svptrue_b64(), a, a);
}

long sites_sve_plain(long x)
{
    return x * 2 + 1;
}
