/*
 * copy.cu: y[i] = x[i] by a kernel, for small vectors that cross PCIe
 * through mapped pinned host memory (a hosted layer's x, q/k/v and
 * attention output). A cudaMemcpyAsync of them would wait for the copy
 * engine, which is busy uploading a streamed layer for milliseconds; a
 * kernel reads and writes host memory itself.
 */
#include "common.cuh"

__global__ void k_copy_f32(float *y, const float *x, int n)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        y[i] = x[i];
}

extern "C" int launch_copy_f32(launch_ctx *c, float *y, const float *x, int n)
{
    if (!y || !x || n <= 0)
        return launch_fail(c, "copy: bad arguments (n %d)", n);
    const int blocks = (int)(ceil_div(n, 256) < 64 ? ceil_div(n, 256) : 64);
    k_copy_f32<<<blocks, 256, 0, c->stream>>>(y, x, n);
    return launch_check(c, "copy");
}
