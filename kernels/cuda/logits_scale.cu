/*
 * logits_scale.cu: what some architectures do to the head's logits before
 * anything reads them (the argmax, the sampler's candidates, scoring):
 * Granite divides them by logits_scaling, Gemma 2 soft-caps them.
 */
#include "common.cuh"

__global__ void k_logits_scale(float *x, long n, float mult, float cap)
{
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        x[i] = soft_cap(x[i] * mult, cap);
}

extern "C" int launch_logits_scale(launch_ctx *c, float *x, long n, float mult, float cap)
{
    if (!x || n <= 0 || !(mult > 0.0f) || cap < 0.0f)
        return launch_fail(c, "logits_scale: bad arguments (n %ld, mult %g, cap %g)", n, (double)mult, (double)cap);
    const unsigned blocks = ceil_div(n, 256) < 4096 ? ceil_div(n, 256) : 4096;
    k_logits_scale<<<blocks, 256, 0, c->stream>>>(x, n, mult, cap);
    return launch_check(c, "logits_scale");
}
