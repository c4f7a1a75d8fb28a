/*
 * rope.cuh: one head's step from the q/k/v projection to attention, done by
 * one warp: bias, optional per-head RMSNorm, rotate-half RoPE at a position.
 * Shared by rope_qkv.cu (prompt batches) and attention.cu (decode, which
 * does this itself so that a decode layer has one kernel fewer).
 */
#ifndef ENGINE_KERNELS_CUDA_ROPE_CUH
#define ENGINE_KERNELS_CUDA_ROPE_CUH

#include "common.cuh"

/*
 * dst[hd] = rope(norm(src + bias)) for the head at src (fp32), rows pos of
 * the cos/sin tables [*, hd/2]. bias and norm may be NULL; rope = false
 * skips the rotation (v). Called by all 32 lanes of a warp.
 */
template <typename O>
__device__ void rope_head(O *dst, const float *src, const float *bias, const float *norm, float eps,
                          const float *cos_t, const float *sin_t, int pos, int hd, bool rope)
{
    const int lane = threadIdx.x & 31, half = hd / 2;
    float inv = 1.0f;
    if (norm) {
        float ss = 0.0f;
        for (int i = lane; i < hd; i += 32) {
            const float v = src[i] + (bias ? bias[i] : 0.0f);
            ss += v * v;
        }
        ss = warp_sum(ss);
        inv = rsqrtf(ss / hd + eps);
    }
    if (!rope) {
        for (int i = lane; i < hd; i += 32)
            dst[i] = from_f32<O>((src[i] + (bias ? bias[i] : 0.0f)) * (norm ? inv * norm[i] : 1.0f));
        return;
    }
    const float *cs = cos_t + (size_t)pos * half, *sn = sin_t + (size_t)pos * half;
    for (int i = lane; i < half; i += 32) {
        float x0 = src[i] + (bias ? bias[i] : 0.0f), x1 = src[i + half] + (bias ? bias[i + half] : 0.0f);
        if (norm) {
            x0 = x0 * inv * norm[i];
            x1 = x1 * inv * norm[i + half];
        }
        dst[i] = from_f32<O>(x0 * cs[i] - x1 * sn[i]);
        dst[i + half] = from_f32<O>(x1 * cs[i] + x0 * sn[i]);
    }
}

#endif
