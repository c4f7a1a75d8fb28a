/*
 * attention_decode.cuh: what the two decode attention kernels share: the
 * staged one for short contexts (attention_decode.cu) and the streaming
 * one for long contexts (attention_decode_stream.cu). A cache granule's
 * elements as floats, and the portable merge of the splits' partial
 * results through global memory.
 */
#ifndef ENGINE_KERNELS_CUDA_ATTENTION_DECODE_CUH
#define ENGINE_KERNELS_CUDA_ATTENTION_DECODE_CUH

#include <type_traits>

#include "kv.cuh"
#include "rope.cuh"

#define DEC_THREADS 256     /* both kernels' blocks */
#define DEC_MAX_SPLITS 16   /* the staged kernel: blocks in a cluster; above 8 needs non-portable cluster sizes */
#define DEC_PART_SPLITS 32  /* splits of a kv head the partial results have room for (kernels_cuda.h) */

/*
 * The EL = 16 / sizeof(T) elements of a granule as fp32 (int8 and fp8: raw,
 * kv.cuh; the row's multiplier is applied per key). The granule comes
 * by value, as one 16-byte shared-memory load: read through a pointer to
 * its elements, it became eight 2-byte loads per granule (measured: the
 * scores took 1.6x (fp16) and 3.5x (bf16) the fp32 cache's time).
 */
template <typename T> __device__ __forceinline__ void granule_f32(const uint4 g, float *f)
{
    const uint32_t w[4] = {g.x, g.y, g.z, g.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if constexpr (sizeof(T) == 1) {
            word_raw<T>(w[i], f + 4 * i);
        } else if constexpr (sizeof(T) == 4) {
            f[i] = __uint_as_float(w[i]);
        } else if constexpr (std::is_same<T, __nv_bfloat16>::value) {
            f[2 * i] = __uint_as_float(w[i] << 16);
            f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
        } else {
            const float2 v = __half22float2(*reinterpret_cast<const __half2 *>(&w[i]));
            f[2 * i] = v.x;
            f[2 * i + 1] = v.y;
        }
    }
}

/*
 * Split `lane`'s weight in its head's merged output, by a whole warp: its
 * (max, sum) from the lanes below `splits` (a split with no keys sent max
 * -inf: weight 0), exp(m_s - max) over the sum of those times each sum.
 */
__device__ __forceinline__ float split_weight(float m_s, float l_s)
{
    const float mx = warp_max(m_s);
    const float w = m_s == -INFINITY ? 0.0f : expf(m_s - mx);
    return w / warp_sum(w * l_s);
}

/* The block's largest |output| into *out_max (the next product stages by it), by every thread. */
__device__ __forceinline__ void post_out_max(unsigned *out_max, float omx)
{
    if (out_max) {
        omx = warp_max(omx);
        if ((threadIdx.x & 31) == 0 && omx > 0.0f)
            atomicMax(out_max, __float_as_uint(omx));
    }
}

/*
 * The portable merge, by every thread of each block of kv head kvh: the
 * block's accumulator os [G][hd] and its (max, sum) per head go to its row
 * of a.part; the last block of the head to count itself in (a.count[kvh])
 * weighs every split's row as the cluster merge does and writes out[],
 * then sets the counter back to zero for the next launch. wt: shared
 * memory for G x splits weights.
 */
static __device__ __noinline__ void merge_global(float *out, const rope_qkv_args &a, int split, int splits, int kvh,
                                                 int G, int hd, const float *os, const float *ms, const float *ls,
                                                 float *wt)
{
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, warps = DEC_THREADS / 32, n_out = G * hd;
    if (splits == 1) { /* nothing to merge: the output is the accumulator over the sum */
        float omx = 0.0f;
        for (int t = tid; t < n_out; t += DEC_THREADS) {
            const float v = os[t] / ls[t / hd];
            out[(size_t)kvh * n_out + t] = v;
            omx = fmaxf(omx, fabsf(v));
        }
        post_out_max(a.out_max, omx);
        return;
    }
    const size_t stride = (size_t)n_out + 2 * G;
    float *base = a.part + (size_t)kvh * DEC_PART_SPLITS * stride, *row = base + (size_t)split * stride;
    for (int i = tid; i < n_out; i += DEC_THREADS)
        row[i] = os[i];
    for (int g = tid; g < G; g += DEC_THREADS) {
        row[n_out + 2 * g] = ms[g];
        row[n_out + 2 * g + 1] = ls[g];
    }
    __shared__ bool last;
    __threadfence(); /* this block's row is visible before its arrival is */
    __syncthreads();
    if (tid == 0)
        last = atomicAdd(a.count + kvh, 1u) == (unsigned)splits - 1;
    __syncthreads();
    if (!last)
        return;
    __threadfence(); /* every other row is read after their arrivals */
    for (int g = warp; g < G; g += warps) {
        const float *pair = base + (size_t)lane * stride + n_out + 2 * g;
        const float w = split_weight(lane < splits ? __ldcg(pair) : -INFINITY, lane < splits ? __ldcg(pair + 1) : 0.0f);
        if (lane < splits)
            wt[g * splits + lane] = w;
    }
    __syncthreads();
    float omx = 0.0f;
    for (int t = tid; t < n_out; t += DEC_THREADS) {
        const float *w = wt + (t / hd) * splits;
        float num = 0.0f;
        for (int s = 0; s < splits; s++)
            num += w[s] * __ldcg(base + (size_t)s * stride + t);
        out[(size_t)kvh * n_out + t] = num;
        omx = fmaxf(omx, fabsf(num));
    }
    if (tid == 0)
        a.count[kvh] = 0;
    post_out_max(a.out_max, omx);
}

#endif
