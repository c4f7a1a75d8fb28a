/*
 * mma.cuh: Ampere's warp-level tensor-core product (mma.sync m16n8k16,
 * fp32 accumulation) for the 16-bit types, shared by the prefill attention
 * kernel and the long-context decode one. Fragment layouts are PTX's
 * (ISA, "Matrix fragments for mma.m16n8k16"): with g = lane / 4 and
 * c = lane % 4, A's registers hold row g then g + 8 of columns 2c, 2c + 1,
 * then the same rows of columns 2c + 8, 2c + 9; B's hold rows 2c, 2c + 1
 * then 2c + 8, 2c + 9 of column g; C's rows g and g + 8 of columns 2c,
 * 2c + 1.
 */
#ifndef ENGINE_KERNELS_CUDA_MMA_CUH
#define ENGINE_KERNELS_CUDA_MMA_CUH

#include "common.cuh"

/* The tensor-core paths need sm_80 (cp.async, m16n8k16 for f16 and bf16):
 * compiled for less, their kernels are empty and never launched (paths.cu). */
#if __CUDA_ARCH__ >= 800 || !defined(__CUDA_ARCH__)
#define TC_COMPILED 1
#else
#define TC_COMPILED 0
#endif
#if TC_COMPILED

/* The 16-bit type's packing and its mma: d += a (16x16, row) . b (16x8, col). */
template <typename T> struct tc_ops;
template <> struct tc_ops<__half> {
    static __device__ __forceinline__ uint32_t pack(float x, float y)
    {
        __half2 h = __floats2half2_rn(x, y);
        return *reinterpret_cast<uint32_t *>(&h);
    }
    static __device__ __forceinline__ float2 unpack(uint32_t u) { return __half22float2(*reinterpret_cast<__half2 *>(&u)); }
    static __device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
    {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};
template <> struct tc_ops<__nv_bfloat16> {
    static __device__ __forceinline__ uint32_t pack(float x, float y)
    {
        __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
        return *reinterpret_cast<uint32_t *>(&h);
    }
    static __device__ __forceinline__ float2 unpack(uint32_t u)
    {
        return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 *>(&u));
    }
    static __device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
    {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

/* (x, y) as a 16-bit pair hi and the pair of what hi leaves out, lo. */
template <typename T> __device__ __forceinline__ void split2(float x, float y, uint32_t &hi, uint32_t &lo)
{
    hi = tc_ops<T>::pack(x, y);
    const float2 h = tc_ops<T>::unpack(hi);
    lo = tc_ops<T>::pack(x - h.x, y - h.y);
}

#endif
#endif
