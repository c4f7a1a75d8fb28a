/*
 * rope_qkv.cu: everything between the q/k/v projection and attention, in
 * one launch: bias, per-head q/k RMSNorm (Qwen3), rotate-half RoPE, q out
 * in fp32, k and v into their cache rows (an int8 or fp8 row through fp32
 * and its scale, kv.cuh; a sliding window's ring wraps). One warp per (token, head); the position comes
 * from device memory so the decode graph never changes.
 */
#include "kv.cuh"
#include "rope.cuh"

/* One head's k or v row of position pos into the cache (row pos, or pos % a.ring in a ring): directly in a float
 * type, or through fp32 and a scale. */
template <typename T>
__device__ __forceinline__ void cache_row(void *cache, float *scales, int pos, int kvh, int nkv, int hd,
                                          const float *src, const float *bias, const float *norm, const rope_qkv_args &a,
                                          bool rope)
{
    const int at = a.ring > 0 ? pos % a.ring : pos;
    T *dst = static_cast<T *>(cache) + ((size_t)at * nkv + kvh) * hd;
    if constexpr (kv_quant<T>()) {
        __shared__ float row[256]; /* head_dim <= 256; one warp a block */
        rope_head<float>(row, src, bias, norm, a.eps, a.cos, a.sin, pos, hd, rope_rot(a), rope);
        __syncwarp();
        const float scale = kv_quantize_row<T>(dst, row, hd);
        if ((threadIdx.x & 31) == 0)
            scales[(size_t)at * nkv + kvh] = scale;
    } else {
        rope_head<T>(dst, src, bias, norm, a.eps, a.cos, a.sin, pos, hd, rope_rot(a), rope);
    }
}

template <typename T>
__global__ void k_rope_qkv(rope_qkv_args a)
{
    const int t = blockIdx.x, h = blockIdx.y;
    const int hd = a.head_dim, nh = a.n_heads, nkv = a.n_kv_heads;
    const int width = (nh + 2 * nkv) * hd;
    const int pos = *a.pos0 + t;
    const float *src = a.qkv + (size_t)t * width + (size_t)h * hd;
    const float *bias = a.bias ? a.bias + (size_t)h * hd : NULL;
    if (h < nh)
        rope_head<float>(a.q_out + (size_t)t * nh * hd + (size_t)h * hd, src, bias, a.q_norm, a.eps, a.cos, a.sin, pos,
                         hd, rope_rot(a), true);
    else if (h < nh + nkv)
        cache_row<T>(a.k_cache, a.k_scale, pos, h - nh, nkv, hd, src, bias, a.k_norm, a, true);
    else
        cache_row<T>(a.v_cache, a.v_scale, pos, h - nh - nkv, nkv, hd, src, bias, NULL, a, false);
}

extern "C" int launch_rope_qkv(launch_ctx *c, const rope_qkv_args *a)
{
    if (!a->qkv || !a->cos || !a->sin || !a->q_out || !a->k_cache || !a->v_cache || !a->pos0 || a->n <= 0 ||
        a->n_heads <= 0 || a->n_kv_heads <= 0 || a->n_heads % a->n_kv_heads || a->head_dim <= 0 ||
        a->head_dim % 2 || a->head_dim > 256 || (!a->q_norm) != (!a->k_norm) || a->ring < 0 || a->rotary_dim < 0 ||
        a->rotary_dim > a->head_dim || a->rotary_dim % 2 ||
        (k_kv_has_scales(a->kvt) && (!a->k_scale || !a->v_scale)))
        return launch_fail(c, "rope_qkv: bad arguments (n %d, heads %d/%d, head_dim %d)", a->n, a->n_heads,
                           a->n_kv_heads, a->head_dim);
    const dim3 grid((unsigned)a->n, (unsigned)(a->n_heads + 2 * a->n_kv_heads));
    DISPATCH_KV(a->kvt, T, k_rope_qkv<T><<<grid, 32, 0, c->stream>>>(*a));
    return launch_check(c, "rope_qkv");
}
