/*
 * kv.cuh: the KV cache's element types on the device (kernels.h's k_kv,
 * the same bytes the CPU writes): fp32, fp16, bf16, and the two with a
 * scale per (position, kv head), int8 and e4m3 fp8.
 *
 * Readers decode a quantized element to a "raw" float and multiply once
 * per row by kv_mult(scale): an int8 code as itself, an fp8 code as its
 * sign, exponent and mantissa bits moved to fp32's places, which is the
 * value times 2^-120, subnormals included (fp32 subnormals, exact without
 * flush-to-zero), so the 2^120 goes into the row's multiplier. That is a
 * shift and a mask per element on every GPU; Ada's and Hopper's cvt
 * instruction would turn two codes into fp16 and still need the scale,
 * and would need sm_89 code in the build. Writers round with IEEE fp32
 * division and CUDA's saturating e4m3 conversion, as the CPU does.
 */
#ifndef ENGINE_KERNELS_CUDA_KV_CUH
#define ENGINE_KERNELS_CUDA_KV_CUH

#include <type_traits>

#include <cuda_fp8.h>

#include "common.cuh"

struct fp8e4m3 { /* an fp8 cache element: e4m3fn code */
    uint8_t bits;
};

template <typename T> constexpr bool kv_quant() { return std::is_same<T, int8_t>::value || std::is_same<T, fp8e4m3>::value; }

/* The factor a row's raw elements are multiplied by. */
template <typename T> __device__ __forceinline__ float kv_mult(float scale)
{
    if constexpr (std::is_same<T, fp8e4m3>::value)
        return scale * 0x1p120f;
    else
        return scale;
}

/* One element, raw (see above): the value itself for the float types. */
__device__ __forceinline__ float kv_raw(float v) { return v; }
__device__ __forceinline__ float kv_raw(__half v) { return __half2float(v); }
__device__ __forceinline__ float kv_raw(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float kv_raw(int8_t v) { return (float)v; }
__device__ __forceinline__ float kv_raw(fp8e4m3 v)
{
    return __uint_as_float(((uint32_t)(v.bits & 0x80u) << 24) | ((uint32_t)(v.bits & 0x7fu) << 20));
}

/* The four bytes of w as raw elements. */
template <typename T> __device__ __forceinline__ void word_raw(uint32_t w, float *f)
{
#pragma unroll
    for (int b = 0; b < 4; b++) {
        const uint32_t byte = (w >> (8 * b)) & 0xffu;
        if constexpr (std::is_same<T, int8_t>::value)
            f[b] = (float)(int8_t)byte;
        else
            f[b] = __uint_as_float(((byte & 0x80u) << 24) | ((byte & 0x7fu) << 20));
    }
}

/* Two int8 codes as an fp16 pair, exactly: sel puts them at bytes 0 and 2 of
 * a permute of (x, y); each, offset to code + 128, becomes the mantissa of
 * fp16's 1024 (exponent bits 0x64), and 1152 comes off. */
__device__ __forceinline__ uint32_t i8_pair(uint32_t x, uint32_t y, uint32_t sel)
{
    const uint32_t t = (__byte_perm(x, y, sel) & 0x00ff00ffu) ^ 0x64806480u;
    const __half2 h = __hsub2(*reinterpret_cast<const __half2 *>(&t), __float2half2_rn(1152.0f));
    return *reinterpret_cast<const uint32_t *>(&h);
}

/* Two e4m3 codes as an fp16 pair, exactly, each 2^-8 times its value: sel
 * puts them at bytes 1 and 3 of a permute of (x, y); the sign stays at the
 * top of each half, exponent and mantissa move one bit down (fp16 has one
 * more exponent bit), so an e4m3 exponent e reads as 2^(e - 15), not
 * 2^(e - 7), and subnormals as fp16 subnormals. */
__device__ __forceinline__ uint32_t f8_pair(uint32_t x, uint32_t y, uint32_t sel)
{
    const uint32_t t = __byte_perm(x, y, sel);
    return (t & 0x80008000u) | ((t >> 1) & 0x3f803f80u);
}

/* Byte bx of x and byte by of y, two int8 or e4m3 codes, as an fp16 pair (i8_pair, f8_pair): what the attention
 * kernels on tensor cores multiply. */
template <typename T> __device__ __forceinline__ uint32_t kv_code_pair(uint32_t x, uint32_t y, int bx, int by)
{
    if constexpr (std::is_same<T, int8_t>::value)
        return i8_pair(x, y, (uint32_t)(bx | bx << 4 | (4 + by) << 8 | (4 + by) << 12));
    else
        return f8_pair(x, y, (uint32_t)(bx << 4 | (4 + by) << 12));
}

/* What an element of kv_code_pair's pair is multiplied by to give the code's value: 2^8 for e4m3, else 1. */
template <typename T> constexpr float kv_code_unit() { return std::is_same<T, fp8e4m3>::value ? 256.0f : 1.0f; }

/* Those kernels put V's row scale on the softmax weights P before P is split into fp16 value and remainder. For
 * int8, P times the scale (amax / 127) is fp16-subnormal for amax below 7.7e-3; times this power of two, 64,
 * below 1.2e-4, and the output gives it back. e4m3's kv_code_unit does the same for it, so 1 there. */
template <typename T> constexpr float kv_weight_unit() { return std::is_same<T, int8_t>::value ? 64.0f : 1.0f; }

/* Row quantization, by one warp: x[hd] (fp32, any memory) to codes[hd] and its scale, which it returns. */
template <typename T> __device__ __forceinline__ float kv_quantize_row(T *codes, const float *x, int hd)
{
    const int lane = threadIdx.x & 31;
    float amax = 0.0f;
    for (int i = lane; i < hd; i += 32)
        amax = fmaxf(amax, fabsf(x[i]));
    amax = warp_max(amax);
    constexpr float QMAX = std::is_same<T, int8_t>::value ? 127.0f : 448.0f;
    const float scale = amax / QMAX;
    const bool zero = !(scale > 0.0f); /* an all-zero row, or an amax too small to divide by QMAX */
    for (int i = lane; i < hd; i += 32) {
        const float q = zero ? 0.0f : x[i] / scale;
        if constexpr (std::is_same<T, int8_t>::value) {
            const float r = fminf(fmaxf(rintf(q), -127.0f), 127.0f);
            codes[i] = (int8_t)(q == q ? r : 0.0f);
        } else {
            codes[i].bits = (uint8_t)__nv_cvt_float_to_fp8(q, __NV_SATFINITE, __NV_E4M3);
        }
    }
    return zero ? 0.0f : scale;
}

/* The cache row of position key: key, or key % ring in a sliding window's ring (ring > 0). */
__device__ __forceinline__ int kv_row(int key, int ring)
{
    return ring > 0 ? key % ring : key;
}

/* The cache's element type as a template argument (DISPATCH_TYPE's counterpart for k_kv_type). */
#define DISPATCH_KV(kt, T, ...)                                          \
    switch (kt) {                                                        \
    case K_KV_F32: {                                                     \
        typedef float T;                                                 \
        __VA_ARGS__;                                                     \
    } break;                                                             \
    case K_KV_F16: {                                                     \
        typedef __half T;                                                \
        __VA_ARGS__;                                                     \
    } break;                                                             \
    case K_KV_BF16: {                                                    \
        typedef __nv_bfloat16 T;                                         \
        __VA_ARGS__;                                                     \
    } break;                                                             \
    case K_KV_INT8: {                                                    \
        typedef int8_t T;                                                \
        __VA_ARGS__;                                                     \
    } break;                                                             \
    case K_KV_FP8: {                                                     \
        typedef fp8e4m3 T;                                               \
        __VA_ARGS__;                                                     \
    } break;                                                             \
    default:                                                             \
        return launch_fail(c, "unknown KV cache type %d", (int)(kt));   \
    }

#endif
