/*
 * embed.cu: the embedding lookup, x[t, :] = emb[ids[t], :] as fp32. The ids
 * are read on the device, so a captured decode graph embeds whatever token
 * the step was given.
 */
#include "common.cuh"

template <typename T>
__global__ void k_embed(float *x, const T *emb, const int32_t *ids, int dim)
{
    const int t = blockIdx.y;
    const T *row = emb + (size_t)ids[t] * dim;
    float *out = x + (size_t)t * dim;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < dim; i += gridDim.x * blockDim.x)
        out[i] = to_f32(row[i]);
}

extern "C" int launch_embed(launch_ctx *c, float *x, const void *emb, k_dtype wt, const int32_t *ids, int n, int dim)
{
    if (!x || !emb || !ids || n <= 0 || dim <= 0 || n > 65535)
        return launch_fail(c, "embed: bad arguments (n %d, dim %d)", n, dim);
    const dim3 grid(ceil_div(dim, 256) < 8 ? ceil_div(dim, 256) : 8, (unsigned)n);
    DISPATCH_TYPE(wt, T, k_embed<T><<<grid, 256, 0, c->stream>>>(x, static_cast<const T *>(emb), ids, dim));
    return launch_check(c, "embed");
}
