/*
 * residual_add.cu: a block's output joining the residual stream where it
 * cannot be folded into the product that made it: normed first (OLMo 2's
 * post norms, Gemma's sandwich norms) and scaled (Granite's
 * residual_multiplier). A block a row. A programmatic dependent: the
 * product after it may launch and load its weights at once; the product's
 * own wait orders its reading x after this kernel.
 */
#include "common.cuh"

__global__ void k_residual_add(float *x, const float *y, const float *w, int dim, float eps, float mult)
{
    dependents_may_launch();
    dependency_wait();
    float *xr = x + (size_t)blockIdx.x * dim;
    const float *yr = y + (size_t)blockIdx.x * dim;
    float g = mult;
    if (w) { /* uniform across the block: every thread reaches block_sum's barriers */
        float ss = 0.0f;
        for (int i = threadIdx.x; i < dim; i += blockDim.x)
            ss += yr[i] * yr[i];
        g *= rsqrtf(block_sum(ss) / dim + eps);
    }
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        xr[i] += yr[i] * (w ? g * w[i] : g);
}

extern "C" int launch_residual_add(launch_ctx *c, float *x, float *y, const float *w, int n, int dim, float eps,
                                   float mult)
{
    if (!x || !y || x == y || n <= 0 || dim <= 0)
        return launch_fail(c, "residual_add: bad arguments (n %d, dim %d)", n, dim);
    const int threads = dim >= 1024 ? 1024 : (dim + 31) / 32 * 32;
    const cudaError_t e = launch_pdl(c, k_residual_add, dim3((unsigned)n), dim3((unsigned)threads), 0, x,
                                     static_cast<const float *>(y), w, dim, eps, mult);
    if (e != cudaSuccess)
        return launch_fail(c, "residual_add: %s", cudaGetErrorString(e));
    return launch_check(c, "residual_add");
}
