/*
 * swiglu.cu: the gated MLP's activation, h = act(gate) * up from the
 * stacked gate|up product rows, in fp32, written in the type of the next
 * product's input: SiLU (SwiGLU) or tanh GELU (GeGLU, Gemma), one op with
 * two activations.
 */
#include "common.cuh"

template <typename T, bool GELU>
__global__ void k_glu(T *h, const float *gu, long total, int ffn)
{
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < total; i += (long)gridDim.x * blockDim.x) {
        const long t = i / ffn, j = i - t * ffn;
        const float g = gu[t * 2 * ffn + j], u = gu[t * 2 * ffn + ffn + j];
        h[i] = from_f32<T>((GELU ? gelu_tanh(g) : silu(g)) * u);
    }
}

template <bool GELU>
static int run_glu(launch_ctx *c, void *h, k_dtype ht, const float *gu, int n, int ffn, const char *op)
{
    if (!h || !gu || n <= 0 || ffn <= 0)
        return launch_fail(c, "%s: bad arguments (n %d, ffn %d)", op, n, ffn);
    const long total = (long)n * ffn;
    const unsigned blocks = ceil_div(total, 256) < 8192 ? ceil_div(total, 256) : 8192;
    DISPATCH_TYPE(ht, T, k_glu<T, GELU><<<blocks, 256, 0, c->stream>>>(static_cast<T *>(h), gu, total, ffn));
    return launch_check(c, op);
}

extern "C" int launch_swiglu(launch_ctx *c, void *h, k_dtype ht, const float *gu, int n, int ffn)
{
    return run_glu<false>(c, h, ht, gu, n, ffn, "swiglu");
}

extern "C" int launch_geglu(launch_ctx *c, void *h, k_dtype ht, const float *gu, int n, int ffn)
{
    return run_glu<true>(c, h, ht, gu, n, ffn, "geglu");
}
