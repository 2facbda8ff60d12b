/* __m256 arguments and return values through traced functions
 * (exectest/tests/vector_upper.rs, x86_64 with AVX).  Compiled with -mavx and
 * the patch-site flags; the checker has no site. */
#include <immintrin.h>

/* Traced: two __m256d arguments and a double in, __m256d out (ymm0-2). */
__attribute__((noinline)) __m256d avx_scale(__m256d a, __m256d b, double s)
{
    return _mm256_add_pd(_mm256_mul_pd(a, _mm256_set1_pd(s)), b);
}

/* Traced: eight __m256d arguments (ymm0-7), a weighted sum of them out. */
__attribute__((noinline)) __m256d avx_fold8(__m256d a, __m256d b, __m256d c, __m256d d, __m256d e, __m256d f, __m256d g, __m256d h)
{
    __m256d x = _mm256_add_pd(a, _mm256_mul_pd(b, _mm256_set1_pd(2)));
    x = _mm256_add_pd(x, _mm256_mul_pd(c, _mm256_set1_pd(4)));
    x = _mm256_add_pd(x, _mm256_mul_pd(d, _mm256_set1_pd(8)));
    x = _mm256_add_pd(x, _mm256_mul_pd(e, _mm256_set1_pd(16)));
    x = _mm256_add_pd(x, _mm256_mul_pd(f, _mm256_set1_pd(32)));
    x = _mm256_add_pd(x, _mm256_mul_pd(g, _mm256_set1_pd(64)));
    return _mm256_add_pd(x, _mm256_mul_pd(h, _mm256_set1_pd(128)));
}

/* Calls both `rounds` times and returns the number of wrong lanes (0 when
 * every argument and return value kept all 256 bits). */
__attribute__((patchable_function_entry(0, 0))) __attribute__((noinline)) int avx_check(int rounds)
{
    int bad = 0;
    for (int r = 0; r < rounds; r++) {
        double o[4];
        _mm256_storeu_pd(o, avx_scale(_mm256_set_pd(4 + r, 3, 2, 1), _mm256_set_pd(40, 30, 20, 10), 2.0));
        const double want[4] = {12, 24, 36, 48 + 2 * r};
        for (int i = 0; i < 4; i++)
            bad += o[i] != want[i];
        /* Lane i of argument k: 1000 * (i + 1) + k (+ r in lane 3). */
        __m256d v[8];
        for (int k = 0; k < 8; k++)
            v[k] = _mm256_set_pd(4000 + k + r, 3000 + k, 2000 + k, 1000 + k);
        _mm256_storeu_pd(o, avx_fold8(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]));
        for (int i = 0; i < 4; i++) {
            double w = 0;
            for (int k = 0; k < 8; k++)
                w += (1000.0 * (i + 1) + k + (i == 3 ? r : 0)) * (double)(1 << k);
            bad += o[i] != w;
        }
    }
    return bad;
}
