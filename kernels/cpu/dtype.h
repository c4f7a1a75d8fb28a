/* dtype.h: conversions between the stored weight types and fp32, inline so
 * that the compiler keeps them in registers inside the kernels' loops. */
#ifndef ENGINE_CPU_DTYPE_H
#define ENGINE_CPU_DTYPE_H

#include <stdint.h>
#include <string.h>

static inline float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even, NaN kept NaN. */
static inline uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* IEEE half to single, subnormals and infinities included, without tables. */
static inline float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        u = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        u = sign;
    } else {
        /* Subnormal: value = man * 2^-24, exact in fp32. */
        float f = (float)man * (1.0f / 16777216.0f);
        memcpy(&u, &f, 4);
        u |= sign;
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Single to half, round to nearest even (used by tests and writers). */
static inline uint16_t f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t absu = u & 0x7fffffffu;
    if (absu > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u);
    if (absu >= 0x47800000u) /* >= 65536 rounds to inf */
        return (uint16_t)(sign | 0x7c00u);
    if (absu < 0x38800000u) { /* below the smallest normal half: subnormal */
        float a;
        memcpy(&a, &absu, 4);
        /* a * 2^24, rounded to nearest even by the FPU's default mode */
        float m = a * 16777216.0f;
        uint32_t mi = (uint32_t)__builtin_nearbyintf(m);
        return (uint16_t)(sign | mi);
    }
    uint32_t exp = ((absu >> 23) - 112u) << 10;
    uint32_t man = (absu >> 13) & 0x3ffu;
    uint32_t h = exp | man;
    uint32_t rest = absu & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
        h++;
    return (uint16_t)(sign | h);
}

/*
 * e4m3fn (the "fn" FP8 of NVIDIA's __NV_E4M3: 4 exponent bits of bias 7, 3
 * mantissa bits, no infinities, 0x7f/0xff NaN, largest finite 448) to fp32.
 * The exponent and mantissa bits shifted to where fp32 keeps its own are
 * the value times 2^-120, subnormals included (they land on fp32
 * subnormals, exactly): a shift and a multiply, no branch, so that the
 * attention loops vectorize. The NaN codes decode as 480; the KV writer
 * never produces them.
 */
static inline float fp8_e4m3_to_f32(uint8_t b)
{
    const uint32_t u = ((uint32_t)(b & 0x80u) << 24) | ((uint32_t)(b & 0x7fu) << 20);
    float f;
    memcpy(&f, &u, 4);
    return f * 0x1p120f;
}

/*
 * fp32 to e4m3fn, round to nearest even, saturating to +-448 (infinities
 * included), subnormals kept, the sign of zero kept, NaN to 0x7f: what
 * CUDA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) gives, so that
 * a cache written on either backend holds the same bytes.
 */
static inline uint8_t f32_to_fp8_e4m3(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    const uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    const uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return 0x7f;
    if (a >= 0x43e00000u) /* 448 and above */
        return (uint8_t)(sign | 0x7e);
    if (a < 0x3c800000u) { /* below 2^-6, the smallest normal: steps of 2^-9 */
        float f;
        memcpy(&f, &a, 4);
        /* a * 2^9 is exact; rounding it (the default mode: nearest even)
         * gives the subnormal's mantissa, and 8 is 2^-6's own code. */
        return (uint8_t)(sign | (uint8_t)__builtin_nearbyintf(f * 512.0f));
    }
    /* Round the 23 mantissa bits to 3, to nearest even; a carry moves into
     * the exponent, as it should. fp32's exponent bias 127 becomes 7. */
    const uint32_t r = a + 0x7ffffu + ((a >> 20) & 1u);
    const uint32_t code = (r >> 20) - (120u << 3);
    return (uint8_t)(sign | (code > 0x7eu ? 0x7eu : code));
}

#endif
