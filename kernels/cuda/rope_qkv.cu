/*
 * rope_qkv.cu: everything between the q/k/v projection and attention, in
 * one launch: bias, per-head q/k RMSNorm (Qwen3), rotate-half RoPE, q out
 * in fp32, k and v into their cache rows. One warp per (token, head); the
 * position comes from device memory so the decode graph never changes.
 */
#include "common.cuh"

template <typename T>
__global__ void k_rope_qkv(rope_qkv_args a)
{
    const int t = blockIdx.x, h = blockIdx.y, lane = threadIdx.x;
    const int hd = a.head_dim, half = hd / 2, nh = a.n_heads, nkv = a.n_kv_heads;
    const int width = (nh + 2 * nkv) * hd, kvd = nkv * hd;
    const int pos = *a.pos0 + t;
    const float *src = a.qkv + (size_t)t * width + (size_t)h * hd;
    const float *bias = a.bias ? a.bias + (size_t)h * hd : NULL;
    const bool is_q = h < nh, is_v = h >= nh + nkv;

    if (is_v) {
        T *dst = static_cast<T *>(a.v_cache) + (size_t)pos * kvd + (size_t)(h - nh - nkv) * hd;
        for (int i = lane; i < hd; i += 32)
            dst[i] = from_f32<T>(src[i] + (bias ? bias[i] : 0.0f));
        return;
    }
    const float *norm = is_q ? a.q_norm : a.k_norm;
    float inv = 1.0f;
    if (norm) {
        float ss = 0.0f;
        for (int i = lane; i < hd; i += 32) {
            const float v = src[i] + (bias ? bias[i] : 0.0f);
            ss += v * v;
        }
        ss = warp_sum(ss);
        inv = rsqrtf(ss / hd + a.eps);
    }
    const float *cs = a.cos + (size_t)pos * half, *sn = a.sin + (size_t)pos * half;
    for (int i = lane; i < half; i += 32) {
        float x0 = src[i] + (bias ? bias[i] : 0.0f), x1 = src[i + half] + (bias ? bias[i + half] : 0.0f);
        if (norm) {
            x0 = x0 * inv * norm[i];
            x1 = x1 * inv * norm[i + half];
        }
        const float r0 = x0 * cs[i] - x1 * sn[i], r1 = x1 * cs[i] + x0 * sn[i];
        if (is_q) {
            float *q = a.q_out + (size_t)t * nh * hd + (size_t)h * hd;
            q[i] = r0;
            q[i + half] = r1;
        } else {
            T *k = static_cast<T *>(a.k_cache) + (size_t)pos * kvd + (size_t)(h - nh) * hd;
            k[i] = from_f32<T>(r0);
            k[i + half] = from_f32<T>(r1);
        }
    }
}

extern "C" int launch_rope_qkv(launch_ctx *c, const rope_qkv_args *a)
{
    if (!a->qkv || !a->cos || !a->sin || !a->q_out || !a->k_cache || !a->v_cache || !a->pos0 || a->n <= 0 ||
        a->n_heads <= 0 || a->n_kv_heads <= 0 || a->n_heads % a->n_kv_heads || a->head_dim <= 0 ||
        a->head_dim % 2 || a->head_dim > 256 || (!a->q_norm) != (!a->k_norm))
        return launch_fail(c, "rope_qkv: bad arguments (n %d, heads %d/%d, head_dim %d)", a->n, a->n_heads,
                           a->n_kv_heads, a->head_dim);
    const dim3 grid((unsigned)a->n, (unsigned)(a->n_heads + 2 * a->n_kv_heads));
    DISPATCH_TYPE(a->kvt, T, k_rope_qkv<T><<<grid, 32, 0, c->stream>>>(*a));
    return launch_check(c, "rope_qkv");
}
