/*
 * swiglu.cu: h = silu(gate) * up from the stacked gate|up product rows, in
 * fp32, written in the type of the next product's input.
 */
#include "common.cuh"

template <typename T>
__global__ void k_swiglu(T *h, const float *gu, long total, int ffn)
{
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < total; i += (long)gridDim.x * blockDim.x) {
        const long t = i / ffn, j = i - t * ffn;
        const float g = gu[t * 2 * ffn + j], u = gu[t * 2 * ffn + ffn + j];
        h[i] = from_f32<T>(g / (1.0f + expf(-g)) * u);
    }
}

extern "C" int launch_swiglu(launch_ctx *c, void *h, k_dtype ht, const float *gu, int n, int ffn)
{
    if (!h || !gu || n <= 0 || ffn <= 0)
        return launch_fail(c, "swiglu: bad arguments (n %d, ffn %d)", n, ffn);
    const long total = (long)n * ffn;
    const unsigned blocks = ceil_div(total, 256) < 8192 ? ceil_div(total, 256) : 8192;
    DISPATCH_TYPE(ht, T, k_swiglu<T><<<blocks, 256, 0, c->stream>>>(static_cast<T *>(h), gu, total, ffn));
    return launch_check(c, "swiglu");
}
