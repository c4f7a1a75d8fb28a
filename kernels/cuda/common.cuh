/*
 * common.cuh: what every CUDA kernel file shares: loads and stores of the
 * three element types as fp32, warp and block reductions, and the small
 * table that turns a k_dtype into a template argument.
 */
#ifndef ENGINE_KERNELS_CUDA_COMMON_CUH
#define ENGINE_KERNELS_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "../kernels_cuda.h"

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

/*
 * x[i] = emb[token][i] * mult as fp32, by the whole block: 16 bytes of the
 * row a thread at a time where aligned (the embedding lookup, and decode's
 * argmax embedding the next step's token). mult is the architecture's
 * embedding scale (Granite's embedding_multiplier, Gemma's sqrt(hidden)),
 * 1 for the others; the product is formed in fp32, as the CPU pass does.
 */
template <typename T>
__device__ void embed_row(float *__restrict__ x, const T *__restrict__ emb, int token, int dim, float mult)
{
    constexpr int V = 16 / sizeof(T);
    const T *row = emb + (size_t)token * dim;
    if (dim % V == 0 && (uintptr_t)row % 16 == 0 && (uintptr_t)x % 16 == 0) {
        for (int g = threadIdx.x; g < dim / V; g += blockDim.x) {
            const uint4 w = __ldg(reinterpret_cast<const uint4 *>(row) + g);
            const T *e = reinterpret_cast<const T *>(&w);
#pragma unroll
            for (int k = 0; k < V; k += 4)
                *reinterpret_cast<float4 *>(x + g * V + k) = make_float4(
                    to_f32(e[k]) * mult, to_f32(e[k + 1]) * mult, to_f32(e[k + 2]) * mult, to_f32(e[k + 3]) * mult);
        }
    } else {
        for (int i = threadIdx.x; i < dim; i += blockDim.x)
            x[i] = to_f32(row[i]) * mult;
    }
}

/* The gated activations of the MLP: SiLU (SwiGLU) and tanh-approximated
 * GELU (GeGLU: Gemma's gelu_pytorch_tanh), as kernels/cpu computes them. */
__device__ __forceinline__ float silu(float g) { return g / (1.0f + expf(-g)); }
__device__ __forceinline__ float gelu_tanh(float g)
{
    return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
}

/* A score soft-capped: cap * tanh(s / cap) (Gemma 2); cap <= 0: s. */
__device__ __forceinline__ float soft_cap(float s, float cap) { return cap > 0.0f ? cap * tanhf(s / cap) : s; }

__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/*
 * The warp's maximum in one redux.sync (sm_80+; five shuffle steps
 * before): the float's bits, with the magnitude bits of negatives flipped,
 * order as signed integers the way the floats do (-0 below +0). A NaN
 * counts as -inf, as fmaxf would skip it. Every lane of the warp must
 * call it.
 */
__device__ __forceinline__ float warp_max(float v)
{
    int b = __float_as_int(v != v ? -INFINITY : v);
    b ^= (b >> 31) & 0x7fffffff;
#if __CUDA_ARCH__ >= 800
    b = __reduce_max_sync(0xffffffffu, b);
#else
    for (int o = 16; o > 0; o >>= 1)
        b = max(b, __shfl_xor_sync(0xffffffffu, b, o));
#endif
    return __int_as_float(b ^ ((b >> 31) & 0x7fffffff));
}

/*
 * One step of decode attention's online softmax, by the warp of head g:
 * the chunk's scores s[nk] become their weights exp(s - m) under the
 * running max ms[g], which is updated; the running sum ls[g] is rescaled
 * and grows by the chunk's sum, and cr[g] gets the factor that rescales
 * what was summed before (0 for the first chunk, whose ms[g] is -inf).
 */
__device__ __forceinline__ void warp_softmax_step(float *s, int nk, float *ms, float *ls, float *cr, int g)
{
    const int lane = threadIdx.x & 31;
    float mx = -INFINITY;
    for (int k = lane; k < nk; k += 32)
        mx = fmaxf(mx, s[k]);
    mx = warp_max(mx);
    const float m_new = fmaxf(ms[g], mx);
    float sum = 0.0f;
    for (int k = lane; k < nk; k += 32) {
        const float p = expf(s[k] - m_new);
        s[k] = p;
        sum += p;
    }
    sum = warp_sum(sum);
    if (lane == 0) {
        const float corr = expf(ms[g] - m_new);
        cr[g] = corr;
        ls[g] = ls[g] * corr + sum;
        ms[g] = m_new;
    }
}

/* Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it. */
__device__ __forceinline__ float block_sum(float v)
{
    __shared__ float part[32];
    __shared__ float total;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads(); /* part[] may still be read by a previous call */
    if (lane == 0)
        part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float s = lane < (int)(blockDim.x >> 5) ? part[lane] : 0.0f;
        s = warp_sum(s);
        if (lane == 0)
            total = s;
    }
    __syncthreads();
    return total;
}

/*
 * Type dispatch in one place: DISPATCH_TYPE(dt, T, call) runs `call` with T
 * bound to float, __half or __nv_bfloat16. Unknown types fall to `default`.
 */
#define DISPATCH_TYPE(dt, T, ...)                 \
    switch (dt) {                                 \
    case K_F32: {                                 \
        typedef float T;                          \
        __VA_ARGS__;                              \
    } break;                                      \
    case K_F16: {                                 \
        typedef __half T;                         \
        __VA_ARGS__;                              \
    } break;                                      \
    case K_BF16: {                                \
        typedef __nv_bfloat16 T;                  \
        __VA_ARGS__;                              \
    } break;                                      \
    default:                                      \
        return launch_fail(c, "unknown element type %d", (int)(dt)); \
    }

static inline unsigned ceil_div(long a, long b) { return (unsigned)((a + b - 1) / b); }

/*
 * Programmatic dependent launch (sm_90). A kernel launched with launch_pdl
 * where c->fast[K_OP_PDL] may start while the kernel before it runs, once
 * that one has called dependents_may_launch() (or finished); it must call
 * dependency_wait() before reading anything the earlier kernel writes.
 * Decode uses this so that the next product's weight loads overlap the
 * small kernels. Launched plainly (or compiled below sm_90) both are no-ops:
 * the kernel starts after the one before has finished.
 */
__device__ __forceinline__ void dependency_wait()
{
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void dependents_may_launch()
{
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
#endif
}

/*
 * A nested (double-quantized) absmax from its 8-bit code's table value and
 * its nested block's scale and offset, exactly as the CPU decodes it: the
 * product rounded, then the sum (no fused multiply-add).
 */
__device__ __forceinline__ float nested_absmax_of(float code, float2 s) { return __fadd_rn(__fmul_rn(code, s.x), s.y); }

/* A shared-memory address as the 32-bit operand of PTX's shared-state instructions. */
__device__ __forceinline__ unsigned smem_addr(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }

#if __CUDA_ARCH__ >= 900 || !defined(__CUDA_ARCH__)
/* An mbarrier expecting `count` arrivals; an arrival that also expects
 * `bytes` of transactions (sm_90: the Hopper paths alone use them). */
__device__ __forceinline__ void mbar_init(uint64_t *bar, unsigned count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count));
}
__device__ __forceinline__ void mbar_expect(uint64_t *bar, unsigned bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
/* Wait until the mbarrier at `bar` completes the phase of the given parity (0 or 1). */
__device__ __forceinline__ void mbar_wait(uint64_t *bar, unsigned parity)
{
    asm volatile("{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra W;\n}" ::"r"(
                     smem_addr(bar)),
                 "r"(parity)
                 : "memory");
}
#endif

/* Launch kern as a programmatic dependent where c takes that path, else plainly. */
template <typename... P, typename... A>
static cudaError_t launch_pdl(const launch_ctx *c, void (*kern)(P...), dim3 grid, dim3 block, size_t smem, A... args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = c->stream;
    cudaLaunchAttribute attr = {};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = c->fast[K_OP_PDL] ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kern, static_cast<P>(args)...);
}

#endif
