/* simd.h: the x86 vector code the CPU kernels share (matmul.c, matmul_quant.c):
 * K_HAVE_AVX2 where the compiler can emit AVX2 and AVX-512 (chosen at run time). */
#ifndef ENGINE_CPU_SIMD_H
#define ENGINE_CPU_SIMD_H

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define K_HAVE_AVX2 1

/* The sum of v's 8 lanes. */
__attribute__((target("avx2"))) static inline float hsum_avx2(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif

#endif
