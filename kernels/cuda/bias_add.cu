/* bias_add.cu: y[t, j] += b[j], for the projections whose bias no other kernel folds in. */
#include "common.cuh"

__global__ void k_bias_add(float *y, const float *b, long total, int cols)
{
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < total; i += (long)gridDim.x * blockDim.x)
        y[i] += b[i % cols];
}

extern "C" int launch_bias_add(launch_ctx *c, float *y, const float *b, int n, int cols)
{
    if (!y || !b || n <= 0 || cols <= 0)
        return launch_fail(c, "bias_add: bad arguments (n %d, cols %d)", n, cols);
    const long total = (long)n * cols;
    const unsigned blocks = ceil_div(total, 256) < 4096 ? ceil_div(total, 256) : 4096;
    k_bias_add<<<blocks, 256, 0, c->stream>>>(y, b, total, cols);
    return launch_check(c, "bias_add");
}
