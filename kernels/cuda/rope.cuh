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
 * the cos/sin tables [*, rot/2]: the first rot elements rotate (pairs i,
 * i + rot/2), the rest pass (Phi-3's partial rotary; rot = hd for the
 * others). bias and norm may be NULL; rope = false skips the rotation (v).
 * Called by all 32 lanes of a warp.
 */
template <typename O>
__device__ void rope_head(O *dst, const float *src, const float *bias, const float *norm, float eps,
                          const float *cos_t, const float *sin_t, int pos, int hd, int rot, bool rope)
{
    const int lane = threadIdx.x & 31, half = rot / 2;
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
    /* Each lane loads all it needs for B of its elements (or pairs) before
     * it stores any: a loop of load, then store, waited one round trip to
     * L2 per element, four of them for a 128-wide v row. */
    if (!rope) {
        constexpr int B = 4; /* head_dim 128 in one round */
        for (int i0 = lane; i0 < hd; i0 += 32 * B) {
            float v[B], g[B];
#pragma unroll
            for (int b = 0; b < B; b++) {
                const int i = i0 + 32 * b;
                if (i < hd) {
                    v[b] = src[i] + (bias ? bias[i] : 0.0f);
                    g[b] = norm ? inv * norm[i] : 1.0f;
                }
            }
#pragma unroll
            for (int b = 0; b < B; b++) {
                const int i = i0 + 32 * b;
                if (i < hd)
                    dst[i] = from_f32<O>(v[b] * g[b]);
            }
        }
        return;
    }
    const float *cs = cos_t + (size_t)pos * half, *sn = sin_t + (size_t)pos * half;
    constexpr int B = 2; /* pairs: head_dim 128 in one round */
    for (int i0 = lane; i0 < half; i0 += 32 * B) {
        float x0[B], x1[B], c[B], s[B];
#pragma unroll
        for (int b = 0; b < B; b++) {
            const int i = i0 + 32 * b;
            if (i < half) {
                x0[b] = src[i] + (bias ? bias[i] : 0.0f);
                x1[b] = src[i + half] + (bias ? bias[i + half] : 0.0f);
                if (norm) {
                    x0[b] *= inv * norm[i];
                    x1[b] *= inv * norm[i + half];
                }
                c[b] = cs[i];
                s[b] = sn[i];
            }
        }
#pragma unroll
        for (int b = 0; b < B; b++) {
            const int i = i0 + 32 * b;
            if (i < half) {
                dst[i] = from_f32<O>(x0[b] * c[b] - x1[b] * s[b]);
                dst[i + half] = from_f32<O>(x1[b] * c[b] + x0[b] * s[b]);
            }
        }
    }
    for (int i = rot + lane; i < hd; i += 32) /* the unrotated tail of a partial rotary */
        dst[i] = from_f32<O>((src[i] + (bias ? bias[i] : 0.0f)) * (norm ? inv * norm[i] : 1.0f));
}

/* The elements rope_head rotates for a's heads. */
__host__ __device__ inline int rope_rot(const rope_qkv_args &a) { return a.rotary_dim > 0 ? a.rotary_dim : a.head_dim; }

#endif
