/*
 * qk_norm_whole.cu: OLMo 2's q/k norms, each over a token's whole q (or k)
 * projection, which the per-head norm of the rope step (rope.cuh) cannot
 * do: that step sees one head a warp. In place on the projection's rows,
 * with the bias added first (the norm is of the biased projection), so
 * that what follows takes neither. A block per (token, part): q, k, and v
 * (v only gets its bias).
 *
 * A programmatic dependent (launch_pdl): it lets the attention after it
 * launch first thing, then waits for the q/k/v product; the attention's
 * own wait still orders it after this kernel.
 */
#include "common.cuh"

__global__ void k_qk_norm_whole(float *qkv, const float *bias, const float *q_norm, const float *k_norm, int qd,
                                int kvd, float eps)
{
    dependents_may_launch();
    dependency_wait();
    const int t = blockIdx.x, part = blockIdx.y;
    const int off = part == 0 ? 0 : part == 1 ? qd : qd + kvd, len = part == 0 ? qd : kvd;
    float *r = qkv + (size_t)t * (qd + 2 * kvd) + off;
    const float *b = bias ? bias + off : NULL, *w = part == 0 ? q_norm : part == 1 ? k_norm : NULL;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < len; i += blockDim.x) {
        const float v = r[i] + (b ? b[i] : 0.0f);
        r[i] = v;
        ss += v * v;
    }
    if (!w) /* v: uniform across the block */
        return;
    const float inv = rsqrtf(block_sum(ss) / len + eps); /* its barriers also order the writes above */
    for (int i = threadIdx.x; i < len; i += blockDim.x)
        r[i] *= inv * w[i];
}

extern "C" int launch_qk_norm_whole(launch_ctx *c, float *qkv, const float *bias, const float *q_norm,
                                    const float *k_norm, int n, int n_heads, int n_kv_heads, int head_dim, float eps)
{
    if (!qkv || !q_norm || !k_norm || n <= 0 || n_heads <= 0 || n_kv_heads <= 0 || head_dim <= 0)
        return launch_fail(c, "qk_norm_whole: bad arguments (n %d, heads %d/%d, head_dim %d)", n, n_heads, n_kv_heads,
                           head_dim);
    const dim3 grid((unsigned)n, bias ? 3u : 2u); /* v's part only to add its bias */
    const cudaError_t e = launch_pdl(c, k_qk_norm_whole, grid, dim3(256), 0, qkv, bias, q_norm, k_norm,
                                     n_heads * head_dim, n_kv_heads * head_dim, eps);
    if (e != cudaSuccess)
        return launch_fail(c, "qk_norm_whole: %s", cudaGetErrorString(e));
    return launch_check(c, "qk_norm_whole");
}
