/* kv.h: decoding KV cache rows (kernels.h's k_kv), shared by the attention
 * kernel and the cache's reference reader. Inline so that each decode loop
 * is compiled where it is used, on the caller's stack buffer. */
#ifndef ENGINE_CPU_KV_H
#define ENGINE_CPU_KV_H

#include <stdint.h>
#include <string.h>

#include "../kernels.h"
#include "dtype.h"

/*
 * f16_to_f32 without branches, so that the decode loop vectorizes: the
 * exponent and mantissa bits shifted to fp32's places are the value times
 * 2^-112, subnormals included; exponent 31 (infinity, NaN) is then set to
 * fp32's 255.
 */
static inline float kv_f16_to_f32(uint16_t h)
{
    const uint32_t a = (uint32_t)(h & 0x7fffu) << 13;
    float f;
    memcpy(&f, &a, 4);
    f *= 0x1p112f;
    uint32_t u;
    memcpy(&u, &f, 4);
    u |= (a >= 0x0f800000u ? 0x7f800000u : 0u) | ((uint32_t)(h & 0x8000u) << 16);
    memcpy(&f, &u, 4);
    return f;
}

/*
 * Elements e .. e+n-1 of kv's data as fp32, without the row's scale (the
 * callers multiply once per row, not once per element).
 */
static inline void kv_decode(const k_kv *kv, size_t e, int n, float *out)
{
    switch (kv->type) {
    case K_KV_F32:
        memcpy(out, (const float *)kv->data + e, (size_t)n * sizeof *out);
        break;
    case K_KV_F16: {
        const uint16_t *s = (const uint16_t *)kv->data + e;
#pragma omp simd
        for (int i = 0; i < n; i++)
            out[i] = kv_f16_to_f32(s[i]);
        break;
    }
    case K_KV_BF16: {
        const uint16_t *s = (const uint16_t *)kv->data + e;
#pragma omp simd
        for (int i = 0; i < n; i++)
            out[i] = bf16_to_f32(s[i]);
        break;
    }
    case K_KV_INT8: {
        const int8_t *s = (const int8_t *)kv->data + e;
#pragma omp simd
        for (int i = 0; i < n; i++)
            out[i] = (float)s[i];
        break;
    }
    case K_KV_FP8: {
        const uint8_t *s = (const uint8_t *)kv->data + e;
#pragma omp simd
        for (int i = 0; i < n; i++)
            out[i] = fp8_e4m3_to_f32(s[i]);
        break;
    }
    }
}

#endif
