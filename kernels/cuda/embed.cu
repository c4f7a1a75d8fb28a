/*
 * embed.cu: the embedding lookup, x[t, :] = emb[ids[t], :] as fp32. The ids
 * are read on the device, so a captured decode graph embeds whatever token
 * the step was given.
 */
#include "common.cuh"

template <typename T>
__global__ void k_embed(float *x, const T *emb, const int32_t *ids, int dim, float mult)
{
    const int t = blockIdx.x;
    embed_row(x + (size_t)t * dim, emb, ids[t], dim, mult);
}

extern "C" int launch_embed(launch_ctx *c, float *x, const void *emb, k_dtype wt, const int32_t *ids, int n, int dim,
                            float mult)
{
    if (!x || !emb || !ids || n <= 0 || dim <= 0 || !(mult > 0.0f))
        return launch_fail(c, "embed: bad arguments (n %d, dim %d)", n, dim);
    /* A block a token. */
    DISPATCH_TYPE(wt, T, k_embed<T><<<n, 256, 0, c->stream>>>(x, static_cast<const T *>(emb), ids, dim, mult));
    return launch_check(c, "embed");
}
