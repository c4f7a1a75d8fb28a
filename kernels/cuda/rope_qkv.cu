/*
 * rope_qkv.cu: everything between the q/k/v projection and attention, in
 * one launch: bias, per-head q/k RMSNorm (Qwen3), rotate-half RoPE, q out
 * in fp32, k and v into their cache rows. One warp per (token, head); the
 * position comes from device memory so the decode graph never changes.
 */
#include "rope.cuh"

template <typename T>
__global__ void k_rope_qkv(rope_qkv_args a)
{
    const int t = blockIdx.x, h = blockIdx.y;
    const int hd = a.head_dim, nh = a.n_heads, nkv = a.n_kv_heads;
    const int width = (nh + 2 * nkv) * hd, kvd = nkv * hd;
    const int pos = *a.pos0 + t;
    const float *src = a.qkv + (size_t)t * width + (size_t)h * hd;
    const float *bias = a.bias ? a.bias + (size_t)h * hd : NULL;
    if (h < nh) {
        rope_head<float>(a.q_out + (size_t)t * nh * hd + (size_t)h * hd, src, bias, a.q_norm, a.eps, a.cos, a.sin, pos,
                         hd, true);
    } else if (h < nh + nkv) {
        T *k = static_cast<T *>(a.k_cache) + (size_t)pos * kvd + (size_t)(h - nh) * hd;
        rope_head<T>(k, src, bias, a.k_norm, a.eps, a.cos, a.sin, pos, hd, true);
    } else {
        T *v = static_cast<T *>(a.v_cache) + (size_t)pos * kvd + (size_t)(h - nh - nkv) * hd;
        rope_head<T>(v, src, bias, NULL, a.eps, a.cos, a.sin, pos, hd, false);
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
