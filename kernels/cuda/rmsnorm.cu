/*
 * rmsnorm.cu: y = x / rms(x) * w per row, fp32 in, any type out (the
 * prefill path writes the matrix-product input in the weight type); without
 * w, y = x in that type (a block that reads the residual stream unnormed,
 * OLMo 2's).
 */
#include "common.cuh"

template <typename T>
__global__ void k_rmsnorm(T *y, const float *x, const float *w, int dim, float eps)
{
    const float *xr = x + (size_t)blockIdx.x * dim;
    T *yr = y + (size_t)blockIdx.x * dim;
    if (!w) { /* uniform across the block: no barrier is skipped by some threads only */
        for (int i = threadIdx.x; i < dim; i += blockDim.x)
            yr[i] = from_f32<T>(xr[i]);
        return;
    }
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        ss += xr[i] * xr[i];
    ss = block_sum(ss);
    const float inv = rsqrtf(ss / dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        yr[i] = from_f32<T>(xr[i] * inv * w[i]);
}

extern "C" int launch_rmsnorm(launch_ctx *c, void *y, k_dtype yt, const float *x, const float *w, int n, int dim,
                              float eps)
{
    if (!y || !x || n <= 0 || dim <= 0)
        return launch_fail(c, "rmsnorm: bad arguments (n %d, dim %d)", n, dim);
    const int threads = dim >= 1024 ? 1024 : (dim + 31) / 32 * 32;
    DISPATCH_TYPE(yt, T, k_rmsnorm<T><<<n, threads, 0, c->stream>>>(static_cast<T *>(y), x, w, dim, eps));
    return launch_check(c, "rmsnorm");
}
