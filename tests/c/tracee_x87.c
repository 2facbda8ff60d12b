/* x87 return values through traced functions (exectest/tests/x87_return.rs,
 * x86_64): `long double` returns in st(0), `_Complex long double` in st(0)
 * and st(1).  Compiled with the patch-site flags; the checker has no site. */

/* Traced: a long double out (st(0)); the inputs come on the stack. */
__attribute__((noinline)) long double x87_scale(long double a, long double b)
{
    return a * b + 0.25L;
}

/* Traced: a _Complex long double out (st(0) real, st(1) imaginary). */
__attribute__((noinline)) _Complex long double x87_pair(long double re, long double im)
{
    return __builtin_complex(re * 2, im * 3);
}

/* Traced: a double out (xmm0): the x87 stack is empty at its return. */
__attribute__((noinline)) double x87_none(double a)
{
    return a + 1;
}

/* Calls the three `rounds` times and returns the number of wrong values (0
 * when every return kept all 80 bits).  The inputs need the 64-bit
 * mantissa: a double would round them. */
__attribute__((patchable_function_entry(0, 0))) __attribute__((noinline)) int x87_check(int rounds)
{
    int bad = 0;
    for (int r = 0; r < rounds; r++) {
        volatile long double a = 1.0L + 0x1p-60L * (r + 1), b = 3.0L - 0x1p-62L;
        long double want = a * b + 0.25L;
        bad += x87_scale(a, b) != want;
        _Complex long double c = x87_pair(a, b);
        bad += __real__ c != a * 2;
        bad += __imag__ c != b * 3;
        bad += x87_none(r) != r + 1;
    }
    return bad;
}
