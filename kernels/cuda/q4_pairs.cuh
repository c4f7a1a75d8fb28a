/*
 * q4_pairs.cuh: the decode products' 4-bit dot product (gemv.cu): a per-lane table of byte -> two fp16 codes in shared
 * memory, and 32 weights times 32 staged fp16 inputs through it.
 */
#ifndef ENGINE_KERNELS_CUDA_Q4_PAIRS_CUH
#define ENGINE_KERNELS_CUDA_Q4_PAIRS_CUH

#include "common.cuh"

/*
 * The decode product's table: byte b of the weights -> its two codes as
 * fp16 (high nibble in the low half: element 2j first, as x pairs lie),
 * one lookup for two weights. A table of 256 words has 8 in each bank and
 * a warp's random lookups would conflict (about 3.5 wavefronts), so each
 * lane has its own copy in its own bank: [byte][lane], 32 KB, and a lookup
 * is one wavefront.
 */
__shared__ __align__(16) uint32_t pair_s[256 * 32]; /* written and read 16 bytes at a time */

static __device__ void build_pairs(const float *code)
{
    for (int b = threadIdx.x; b < 256; b += blockDim.x) {
        const __half2 p = __floats2half2_rn(code[b >> 4], code[b & 15]);
        const uint32_t u = *reinterpret_cast<const uint32_t *>(&p);
        uint4 *row = reinterpret_cast<uint4 *>(pair_s + 32 * b);
#pragma unroll
        for (int i = 0; i < 8; i++) /* rotated: 8 threads' 16-byte stores on distinct banks */
            row[(i + b) & 7] = make_uint4(u, u, u, u);
    }
}

/* The pair for the byte at bits 7..14 of `bits`; lane4: 4 x the lane. */
__device__ __forceinline__ __half2 pair_at(uint32_t bits, uint32_t lane4)
{
    return *reinterpret_cast<const __half2 *>(reinterpret_cast<const char *>(pair_s) + ((bits & 0x7f80u) | lane4));
}

struct alignas(16) half2x4 {
    __half2 p[4];
};

/*
 * 32 weights (16 bytes, high nibble first) of a block with absmax `am`
 * times the staged fp16 input at xs[0..31] (pairs as the weights' bytes
 * lie). The products run on fp16 pairs: a byte's two codes (one lookup)
 * times two input values (a 16-byte read gives 8) in one HFMA2. A half2
 * sums 8 products a half at most (two words), then goes to fp32; the
 * absmax applies in fp32. Needs build_pairs' table. xs must be 16-byte
 * aligned, and visibly so to the compiler: where the caller's pointer
 * arithmetic hides it, x is read as 4-byte words, which conflict across
 * lanes 80 bytes apart (measured: 2x the shared-memory wavefronts).
 */
__device__ __forceinline__ float q4_dot(const uint4 &v, float am, const __half *xs)
{
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
    const uint32_t lane4 = (threadIdx.x & 31) * 4;
    const half2x4 *x8 = reinterpret_cast<const half2x4 *>(xs);
    float2 f[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        __half2 s = __float2half2_rn(0.0f);
#pragma unroll
        for (int k = 2 * h; k < 2 * h + 2; k++) { /* byte j of word k: elements 8k + 2j, 8k + 2j + 1 */
            const half2x4 x = x8[k];
            s = __hfma2(pair_at(w[k] << 7, lane4), x.p[0], s);
            s = __hfma2(pair_at(w[k] >> 1, lane4), x.p[1], s);
            s = __hfma2(pair_at(w[k] >> 9, lane4), x.p[2], s);
            s = __hfma2(pair_at(w[k] >> 17, lane4), x.p[3], s);
        }
        f[h] = __half22float2(s);
    }
    return ((f[0].x + f[0].y) + (f[1].x + f[1].y)) * am;
}

#endif
