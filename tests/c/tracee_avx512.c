/* __m512 arguments and return values through traced functions
 * (exectest/tests/vector_upper.rs, x86_64 with AVX-512F).  Compiled with
 * -mavx512f and the patch-site flags; the checker has no site. */
#include <immintrin.h>

/* Traced: two __m512d arguments and a double in, __m512d out (zmm0-2). */
__attribute__((noinline)) __m512d avx512_scale(__m512d a, __m512d b, double s)
{
    return _mm512_add_pd(_mm512_mul_pd(a, _mm512_set1_pd(s)), b);
}

/* Calls it `rounds` times and returns the number of wrong lanes (0 when
 * both arguments and the return value kept all 512 bits). */
__attribute__((patchable_function_entry(0, 0))) __attribute__((noinline)) int avx512_check(int rounds)
{
    int bad = 0;
    for (int r = 0; r < rounds; r++) {
        double o[8];
        __m512d a = _mm512_set_pd(8 + r, 7, 6, 5, 4, 3, 2, 1);
        __m512d b = _mm512_set_pd(800, 700, 600, 500, 400, 300, 200, 100);
        _mm512_storeu_pd(o, avx512_scale(a, b, 2.0));
        for (int i = 0; i < 8; i++)
            bad += o[i] != (i + 1 + (i == 7 ? r : 0)) * 2.0 + 100.0 * (i + 1);
    }
    return bad;
}
