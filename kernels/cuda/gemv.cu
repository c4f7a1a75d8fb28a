/*
 * gemv.cu: the matrix-vector product of decode, y (=|+=) W . in(x).
 *
 * Decode reads every weight once per token, so this kernel is the token
 * rate: it must stream W at the memory bandwidth. Each block first builds
 * the input vector in shared memory as fp32 (plain or times the RMSNorm
 * weights: the norm costs no launch and no round trip through memory; its
 * 1/rms multiplies the sums at the end, so staging is one pass and one
 * barrier), then each warp
 * walks its rows with 16-byte loads, several in flight per lane, and
 * reduces with shuffles. The gate/up product pairs gate row j with up row
 * j in one warp and writes silu(gate) * up, so SwiGLU needs no launch
 * either (measured better than staging the SwiGLU as the next product's
 * input, which read 2 x 57 KB per block of the 8B down projection).
 *
 * Quantized weights (INT8, NF4/FP4) run through the same kernel: a chunk
 * type loads 16 bytes of a row with its scale and decodes them in
 * registers, so each weight byte is read once. The 4-bit type stages the
 * input as fp16 instead and multiplies pairs (see chunk_4bit); its scale
 * needs the input's largest value, which the kernel that wrote the input
 * leaves behind in decode (x_max, y_max: one pass again, where finding it
 * here took a block reduction and a second pass over x). Staging is worth
 * this care: leaving it out altogether (wrong results, right timing) made
 * 8B decode 13% faster for nf4 and 32% for int8 before these changes.
 */
#include "common.cuh"
#include <type_traits>

#include "q4_pairs.cuh"

#define GEMV_THREADS 256
#ifndef GEMV_ROWS
#define GEMV_ROWS 1   /* rows a warp works on together (1 measured best on H100 for dense weights) */
#endif
#ifndef GEMV_4BIT_UNROLL
#define GEMV_4BIT_UNROLL 4 /* 4-bit chunks a lane a step (2: 8B nf4 364 against 398 tok/s, H100) */
#endif
#ifndef GEMV_NESTED_UNROLL
/* The same with a nested absmax (8B nf4-dq, H100): 4 took 177 registers,
 * one block an SM, 383 tok/s; 3 filled 4,096-column rows unevenly, 408;
 * 2 gives 424. */
#define GEMV_NESTED_UNROLL 2
#endif
#ifndef GEMV_UNROLL
#define GEMV_UNROLL 8 /* 16-byte loads per lane per step */
#endif

/*
 * A third input mode, the launcher's own: the fp32 input read where it is,
 * in global memory (through L1 and L2), not staged. For plain-input
 * products whose staged input would not fit a block's shared memory: the
 * 8B's down product (14,336 columns) on Turing's 64 KB, Qwen2.5-7B's
 * (18,944) too. Chunk types without padding only (the input's layout is
 * then the staged one).
 */
#define GEMV_IN_DIRECT 2

/*
 * The barrier that publishes the staged input, with the block's sum of
 * squares riding on it: each warp leaves its share in part[] first, and
 * after the barrier every thread adds the shares up. Returns 1 / rms of
 * the input for RMSNorm (the products multiply their sums by it, so the
 * input is staged without it and no barrier waits for the sum), else 1.
 */
template <int IN>
__device__ float publish_input(float ss, int cols, float eps)
{
    __shared__ float part[32];
    if (IN == GEMV_IN_RMSNORM) {
        ss = warp_sum(ss);
        if ((threadIdx.x & 31) == 0)
            part[threadIdx.x >> 5] = ss;
    }
    __syncthreads();
    if (IN != GEMV_IN_RMSNORM)
        return 1.0f;
    float t = 0.0f;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++)
        t += part[w];
    return rsqrtf(t / cols + eps);
}

/*
 * The input vector in fp32 (times the norm weights for RMSNorm), built
 * once per block into xs[cols] in one pass of 16-byte loads, several in
 * flight a thread: a block waits for this before its first product. With
 * P > 0, 4 unused words follow every P values (see the quantized chunks;
 * P is a multiple of 4, so a 16-byte group never straddles them). Returns
 * what the sums are multiplied by (1 / rms for RMSNorm).
 */
template <int IN, int P, int SB_PLAIN>
__device__ float stage_input(float *xs, const float *x, const float *norm, int cols, float eps, const unsigned *)
{
    const bool rms = IN == GEMV_IN_RMSNORM;
    const bool vec = (cols % 4 == 0) && ((uintptr_t)x % 16 == 0) && (!rms || (uintptr_t)norm % 16 == 0);
    float ss = 0.0f;
    if (vec) {
        const int n4 = cols / 4;
        /* SB float4 groups a thread at once (4 with the norm weights' loads): loads first, as the fp16 staging below */
        constexpr int SB = rms ? 4 : SB_PLAIN;
        for (int j0 = threadIdx.x; j0 < n4; j0 += SB * blockDim.x) {
            float4 vb[SB], gb[SB];
#pragma unroll
            for (int b = 0; b < SB; b++) {
                const int j = j0 + b * blockDim.x;
                if (j < n4) {
                    vb[b] = reinterpret_cast<const float4 *>(x)[j];
                    if (rms)
                        gb[b] = reinterpret_cast<const float4 *>(norm)[j];
                }
            }
#pragma unroll
            for (int b = 0; b < SB; b++) {
                const int j = j0 + b * blockDim.x;
                if (j >= n4)
                    break;
                float4 v = vb[b];
                if (rms) {
                    const float4 g = gb[b];
                    ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
                    v.x *= g.x;
                    v.y *= g.y;
                    v.z *= g.z;
                    v.w *= g.w;
                }
                *reinterpret_cast<float4 *>(xs + 4 * j + (P > 0 ? 4 * j / P * 4 : 0)) = v;
            }
        }
    } else {
        for (int j = threadIdx.x; j < cols; j += blockDim.x) {
            float v = x[j];
            if (rms) {
                ss += v * v;
                v *= norm[j];
            }
            xs[j + (P > 0 ? j / P * 4 : 0)] = v;
        }
    }
    return publish_input<IN>(ss, cols, eps);
}

/* The sum and the maximum over the block, with one barrier (called once a kernel). */
__device__ float2 block_sum_max(float s, float m)
{
    __shared__ float2 part[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    s = warp_sum(s);
    m = warp_max(m);
    if (lane == 0)
        part[warp] = make_float2(s, m);
    __syncthreads();
    const float2 p = lane < (int)(blockDim.x >> 5) ? part[lane] : make_float2(0.0f, 0.0f);
    return make_float2(warp_sum(p.x), warp_max(p.y));
}

/* Columns 8g .. 8g + 7 of v, as two 16-byte loads where aligned. */
__device__ __forceinline__ void load8(float *f, const float *v, int g, bool vec)
{
    if (vec) {
        const float4 a = reinterpret_cast<const float4 *>(v)[2 * g], b = reinterpret_cast<const float4 *>(v)[2 * g + 1];
        f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++)
            f[i] = v[8 * g + i];
    }
}

/*
 * The input in fp16 for the 4-bit products (cols a multiple of 32), column
 * j at xs[j + j / 32 * 8]: 16 spare bytes after each 32 columns put the
 * 16-byte reads of 8 lanes (chunks 80 bytes apart) on 32 distinct banks.
 * The values are scaled by a power of two that brings the largest |x| into
 * [2^11, 2^12): a partial sum of 8 products (|code| <= 1) then stays below
 * 2^15, inside fp16's range whatever the activations' size (outlier
 * features reach the thousands), and small inputs keep their precision.
 * The scale needs the maximum: in decode's chain of products the kernel
 * that wrote x leaves max |x * norm| in *x_max, and staging is one pass
 * (1 / rms, which the scale does not need, then multiplies the sums and
 * rides on the last barrier); otherwise a first pass and a block
 * reduction find it (fp16 leaves no room to keep fp32 values here, so the
 * second pass reads x again, from the cache). Returns the factor that
 * undoes the scale (and applies 1 / rms where it is not in the values).
 */
template <int IN, int P, int SB_PLAIN>
__device__ float stage_input(__half *xs, const float *x, const float *norm, int cols, float eps,
                             const unsigned *x_max)
{
    const bool rms = IN == GEMV_IN_RMSNORM;
    const bool vec = (uintptr_t)x % 16 == 0 && (!rms || (uintptr_t)norm % 16 == 0);
    const int n8 = cols / 8;
    float ss = 0.0f, v[8], g[8];
    /* Biased exponent e of the largest value: the scale is 2^(138 - e). At
     * least 12 keeps both factors normal; inf (e = 255) stays inf. */
    int e;
    float f; /* what x * norm is multiplied by */
    if (x_max) {
        e = max((int)((*x_max >> 23) & 0xff), 12);
        f = __int_as_float((265 - e) << 23);
    } else {
        float mx = 0.0f;
        for (int j = threadIdx.x; j < n8; j += blockDim.x) {
            load8(v, x, j, vec);
            if (rms)
                load8(g, norm, j, vec);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                if (rms)
                    ss += v[i] * v[i];
                mx = fmaxf(mx, fabsf(rms ? v[i] * g[i] : v[i]));
            }
        }
        const float2 r = block_sum_max(ss, mx);
        const float inv = rms ? rsqrtf(r.x / cols + eps) : 1.0f;
        e = max((__float_as_int(r.y * inv) >> 23) & 0xff, 12);
        f = inv * __int_as_float((265 - e) << 23);
        ss = 0.0f;
    }
    /* SB groups of 8 a thread at once: all their loads, then all their
     * stores. (A loop of load, then store, waited one round trip to L2 per
     * group: 7 of them for the 8B's down product. Batched, 8B int8 decode
     * went from 290 to 302 tok/s, nf4 from 393 to 396, on an H100.) SB = 2
     * with the norm weights' loads too, so that the registers stay at 128;
     * without them SB_PLAIN, as many as the chunk type's registers allow. */
    constexpr int SB = rms ? 2 : SB_PLAIN;
    for (int j0 = threadIdx.x; j0 < n8; j0 += SB * blockDim.x) {
        float vb[SB][8], gb[SB][8];
#pragma unroll
        for (int b = 0; b < SB; b++) {
            const int j = j0 + b * blockDim.x;
            if (j < n8) {
                load8(vb[b], x, j, vec);
                if (rms)
                    load8(gb[b], norm, j, vec);
            }
        }
#pragma unroll
        for (int b = 0; b < SB; b++) {
            const int j = j0 + b * blockDim.x;
            if (j >= n8)
                break;
            const float *xb = vb[b], *nb = gb[b];
            __half2 h[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                if (rms && x_max)
                    ss += xb[2 * i] * xb[2 * i] + xb[2 * i + 1] * xb[2 * i + 1];
                h[i] = rms ? __floats2half2_rn(xb[2 * i] * nb[2 * i] * f, xb[2 * i + 1] * nb[2 * i + 1] * f)
                           : __floats2half2_rn(xb[2 * i] * f, xb[2 * i + 1] * f);
            }
            *reinterpret_cast<uint4 *>(xs + 8 * j + 8 * j / P * 8) = *reinterpret_cast<const uint4 *>(h); /* P: 32 */
        }
    }
    const float undo = __int_as_float((e - 11) << 23);
    if (x_max)
        return publish_input<IN>(ss, cols, eps) * undo;
    __syncthreads();
    return undo;
}

/*
 * One unit of loading and its dot product with the staged input. The lanes
 * of a warp take consecutive chunks; with wide chunks (16 or 32 columns)
 * element i of every lane's chunk would sit in one shared-memory bank, so
 * those chunk types set PAD: the input is staged with 16 spare bytes after
 * each chunk's columns, so 16-byte reads of 8 lanes cover the 32 banks. load()
 * takes the row index and the chunk's index within the row; dot() gets the
 * input at the chunk's first column (the 4-bit type reads its byte table
 * from pair_s, below). VEC: columns a chunk covers; X: the staged input's
 * element (PAD counts those); TABLE: the bytes of static shared memory the
 * type's products read besides the input.
 */
/*
 * What a quantized chunk needs to find its scale without dividing (integer
 * division is a long instruction sequence on the GPU, and it ran once per
 * 16 bytes): scales a row and log2 of the group, a power of two here.
 */
struct qinfo {
    int n_groups, shift;
};

__device__ __forceinline__ qinfo make_qinfo(const gemv_args &a)
{
    qinfo q = {(a.cols + a.group - 1) / a.group, __ffs(a.group) - 1}; /* exact where chunks run: a power of two */
    if (a.group >= a.cols && a.wt == K_I8)
        q.shift = 30; /* one scale a row: every chunk's index is 0 */
    return q;
}

/*
 * Absmax b of a 4-bit matrix: fp32 as stored, or decoded from its nested
 * 8-bit code (nested_absmax_of). `table`: the nested code table (am_code,
 * or a copy of it in shared memory).
 */
__device__ __forceinline__ float nested_absmax(const gemv_args &a, const float *table, uint32_t q, size_t b)
{
    const float2 s = __ldg(reinterpret_cast<const float2 *>(a.am_s2) + (b >> a.am_shift));
    return nested_absmax_of(table[q], s);
}
__device__ __forceinline__ float absmax_at(const gemv_args &a, const float *table, size_t b)
{
    return a.am_q ? nested_absmax(a, table, __ldg(a.am_q + b), b) : __ldg(a.scales + b);
}

/* 16-byte groups a thread stages at once without the norm weights (H100, 8B int8 with an int8 head:
 * 4 325.9, 8 326.9, 16 326.9 tok/s; 8B bf16 183.6, 184.6, 185.7). */
#ifndef GEMV_F32_STAGE
#define GEMV_F32_STAGE 8
#endif
/* What the types other than the 4-bit one stage: the input in fp32, no table. */
struct x_f32 {
    typedef float X;
    static constexpr int STAGE = GEMV_F32_STAGE;
    static constexpr size_t TABLE = 0;
    static constexpr bool NESTED = false, ONE_STEP = false, SPREAD = false;
};

/* Dense: 16 bytes of a row (VEC elements) when rows are 16-byte aligned, else one element. */
template <typename T, int N> struct chunk_dense : x_f32 {
    static constexpr int VEC = N, PAD = 0, UNROLL = GEMV_UNROLL, ROWS = GEMV_ROWS;
    uint4 v;
    __device__ __forceinline__ void load(const gemv_args &a, const qinfo &q, int ri, int c)
    {
        v = __ldg(reinterpret_cast<const uint4 *>(static_cast<const T *>(a.w) + (size_t)ri * a.cols) + c);
    }
    __device__ __forceinline__ float dot(const float *xs) const
    {
        const T *w = reinterpret_cast<const T *>(&v);
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < VEC; i++)
            s += to_f32(w[i]) * xs[i];
        return s;
    }
};
template <typename T> struct chunk_dense<T, 1> : x_f32 {
    static constexpr int VEC = 1, PAD = 0, UNROLL = GEMV_UNROLL, ROWS = GEMV_ROWS;
    T v;
    __device__ __forceinline__ void load(const gemv_args &a, const qinfo &q, int ri, int c)
    {
        v = static_cast<const T *>(a.w)[(size_t)ri * a.cols + c];
    }
    __device__ __forceinline__ float dot(const float *xs) const { return to_f32(v) * xs[0]; }
};

/* INT8: 16 weights and the scale of their group (groups are multiples of 16 here). */
struct chunk_i8 : x_f32 {
    static constexpr int VEC = 16, PAD = 4, UNROLL = GEMV_UNROLL, ROWS = GEMV_ROWS;
    uint4 v;
    float s;
    __device__ __forceinline__ void load(const gemv_args &a, const qinfo &q, int ri, int c)
    {
        v = __ldg(reinterpret_cast<const uint4 *>(static_cast<const int8_t *>(a.w) + (size_t)ri * a.cols) + c);
        s = __ldg(a.scales + (size_t)ri * q.n_groups + ((c * VEC) >> q.shift));
    }
    __device__ __forceinline__ float dot(const float *xs) const
    {
        /* q + 128 as the low byte of 2^23's float: exact, two instructions. */
        const uint32_t w[4] = {v.x ^ 0x80808080u, v.y ^ 0x80808080u, v.z ^ 0x80808080u, v.w ^ 0x80808080u};
        const float4 *x4 = reinterpret_cast<const float4 *>(xs);
        float d = 0.0f, e = 0.0f;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const float4 x = x4[k];
            d += (__uint_as_float(__byte_perm(w[k], 0x4b000000u, 0x7440)) - 8388736.0f) * x.x;
            e += (__uint_as_float(__byte_perm(w[k], 0x4b000000u, 0x7441)) - 8388736.0f) * x.y;
            d += (__uint_as_float(__byte_perm(w[k], 0x4b000000u, 0x7442)) - 8388736.0f) * x.z;
            e += (__uint_as_float(__byte_perm(w[k], 0x4b000000u, 0x7443)) - 8388736.0f) * x.w;
        }
        d += e;
        return d * s;
    }
};

/*
 * The int8 gate/up product: 4 chunks a lane, not 8. Its two rows a warp
 * kept 16 chunks a lane in flight (202 registers: one block an SM); with
 * 4, 8B int8 decode went from 280.5 to 288.0 tok/s (H100). Fewer or more
 * for the other int8 products measured slower.
 */
struct chunk_i8_glu : chunk_i8 {
    static constexpr int UNROLL = 4;
};
/* The int8 chunk with an unpadded input: where the padded one would not fit shared memory. */
struct chunk_i8_flat : chunk_i8 {
    static constexpr int PAD = 0;
};

/*
 * NF4/FP4: 32 weights (16 bytes, high nibble first) and their block's
 * absmax. A warp takes two rows at a time, so each staged input value read
 * from shared memory serves two weights: against one row and 4 or 8 chunks
 * a lane, +5% on the 8B shape (the 4-bit product is bound by its shared-
 * memory reads and their latency, not by DRAM).
 *
 * The products run on fp16 pairs (q4_dot, q4_pairs.cuh). Per 32 weights
 * and row: 16 table reads of one wavefront and 2 input reads of 4 (shared
 * by the two rows), where fp32 took 32 lookups and 4 input reads.
 */
struct chunk_4bit {
    static constexpr int VEC = 32, PAD = 8, UNROLL = GEMV_4BIT_UNROLL, ROWS = 2; /* a step of 2 x 2 KB: two 4096-column rows */
    typedef __half X;
    static constexpr size_t TABLE = sizeof pair_s;
    static constexpr int STAGE = 4; /* groups of 8 inputs a thread stages at once without the norm weights */
    static constexpr bool NESTED = false, ONE_STEP = false, SPREAD = true;
    uint4 v;
    float am;
    static __device__ __forceinline__ void table(const float *code) { build_pairs(code); }
    __device__ __forceinline__ void load(const gemv_args &a, const qinfo &q, int ri, int c)
    {
        const size_t first = (size_t)ri * a.cols + (size_t)c * VEC;
        v = __ldg(reinterpret_cast<const uint4 *>(static_cast<const uint8_t *>(a.w) + first / 2));
        am = __ldg(a.scales + (first >> q.shift));
    }
    __device__ __forceinline__ float dot(const __half *xs) const { return q4_dot(v, am, xs); }
};

/*
 * The 4-bit chunk with a nested absmax: the block's 8-bit code and its
 * scale and offset come with the weights (a quarter of the fp32 absmax's
 * bytes, plus 8 bytes every 2^am_shift blocks, mostly from L1), and the
 * absmax is decoded at the product through a copy of the code table in
 * shared memory.
 */
__shared__ float am_code_s[256];
struct chunk_4bit_nested : chunk_4bit {
    static constexpr size_t TABLE = sizeof pair_s + sizeof am_code_s;
    static constexpr bool NESTED = true;
    static constexpr int UNROLL = GEMV_NESTED_UNROLL;
    /* The 8B's down product's 7 groups a thread in one round trip: 8B nf4-dq with an nf4-dq head 496.8 /
     * 496.0 against 493.3 / 494.5 tok/s with 4 (H100, same call). (The plain chunk keeps 4: 8 measured
     * 0.3% slower on the 1B nf4, whose down product has 4 groups a thread either way.) */
    static constexpr int STAGE = 8;
    uint32_t q;
    float2 s;
    __device__ __forceinline__ void load(const gemv_args &a, const qinfo &qi, int ri, int c)
    {
        const size_t first = (size_t)ri * a.cols + (size_t)c * VEC, b = first >> qi.shift;
        v = __ldg(reinterpret_cast<const uint4 *>(static_cast<const uint8_t *>(a.w) + first / 2));
        q = __ldg(a.am_q + b);
        s = __ldg(reinterpret_cast<const float2 *>(a.am_s2) + (b >> a.am_shift));
    }
    __device__ __forceinline__ float dot(const __half *xs) const
    {
        return q4_dot(v, nested_absmax_of(am_code_s[q], s), xs);
    }
};

/*
 * A 4-bit chunk type taking three rows a warp: for products whose row
 * pairs outnumber the warps of one wave but whose row triples do not (the
 * 8B's 6,144 q/k/v rows: 3,072 pairs for 2,112 warps left 45% of the
 * warps a second row group, a second round trip after the wait). Each
 * warp then has one group, and each input read serves three rows. The
 * plain chunk takes a row in one step (ONE_STEP: no next step's
 * registers; the launcher checks both). H100, 8B: nf4 397 -> 398 tok/s,
 * nf4-dq with an nf4-dq head 474 -> 480, the same bits.
 */
template <typename C> struct chunk_4bit_3rows : C {
    static constexpr int ROWS = 3, STAGE = 4; /* (8 would take it past 128 registers) */
    static constexpr bool ONE_STEP = !C::NESTED;
};

/*
 * The 4-bit chunk without the 32 KB pair table, on an fp32 input: where the
 * table and the fp16 input do not fit a lesser GPU's shared memory (the
 * 8B's down product on Turing's 64 KB). Each nibble's code from the 16 in
 * shared memory (high nibble first, as stored), times the block's absmax
 * (decoded from its nested code where NEST).
 */
__shared__ float code16_s[16];
template <bool NEST> struct chunk_4bit_flat : x_f32 {
    static constexpr int VEC = 32, PAD = 0, UNROLL = GEMV_UNROLL, ROWS = GEMV_ROWS;
    static constexpr size_t TABLE = sizeof code16_s + (NEST ? sizeof am_code_s : 0);
    static constexpr bool NESTED = NEST;
    uint4 v;
    float am;    /* the absmax, or (NEST) its 8-bit code's bits */
    float2 s;    /* NEST: the nested block's scale and offset */
    static __device__ __forceinline__ void table(const float *code)
    {
        if (threadIdx.x < 16)
            code16_s[threadIdx.x] = code[threadIdx.x];
    }
    /* The first loads go out before the tables are in shared memory: the nested code is looked up in dot(). */
    __device__ __forceinline__ void load(const gemv_args &a, const qinfo &qi, int ri, int c)
    {
        const size_t first = (size_t)ri * a.cols + (size_t)c * VEC, b = first >> qi.shift;
        v = __ldg(reinterpret_cast<const uint4 *>(static_cast<const uint8_t *>(a.w) + first / 2));
        if constexpr (NEST) {
            am = __uint_as_float(__ldg(a.am_q + b));
            s = __ldg(reinterpret_cast<const float2 *>(a.am_s2) + (b >> a.am_shift));
        } else {
            am = __ldg(a.scales + b);
        }
    }
    __device__ __forceinline__ float dot(const float *xs) const
    {
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
        float d = 0.0f, e = 0.0f;
#pragma unroll
        for (int k = 0; k < 4; k++)
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const uint32_t b = (w[k] >> (8 * j)) & 255u;
                d += code16_s[b >> 4] * xs[8 * k + 2 * j];
                e += code16_s[b & 15] * xs[8 * k + 2 * j + 1];
            }
        return (d + e) * (NEST ? nested_absmax_of(am_code_s[__float_as_uint(am)], s) : am);
    }
};

/* Any quantized type, one element at a time (shapes the 16-byte chunks do not fit). */
template <k_dtype Q> struct chunk_q1 : x_f32 {
    static constexpr int VEC = 1, PAD = 0, UNROLL = GEMV_UNROLL, ROWS = GEMV_ROWS;
    float v; /* the decoded weight */
    __device__ __forceinline__ void load(const gemv_args &a, const qinfo &q, int ri, int c)
    {
        const size_t i = (size_t)ri * a.cols + c;
        if (Q == K_I8) {
            const int ng = (a.cols + a.group - 1) / a.group;
            v = (float)static_cast<const int8_t *>(a.w)[i] * a.scales[(size_t)ri * ng + c / a.group];
        } else {
            const uint8_t b = static_cast<const uint8_t *>(a.w)[i / 2];
            v = a.code[(i & 1) ? b & 15 : b >> 4] * absmax_at(a, a.am_code, i / a.group);
        }
    }
    __device__ __forceinline__ float dot(const float *xs) const { return v * xs[0]; }
};

/*
 * Each warp owns row groups r0, r0 + stride, ... (C::ROWS rows each) and
 * walks them in steps of C::UNROLL chunks per lane. The loads of the next
 * step are issued before the current one is summed, across row groups too,
 * and the first step's loads go out before the input is staged: a warp
 * never waits on memory with nothing in flight.
 */
template <typename C, int IN, bool GLU, bool EXPERTS>
__global__ void __launch_bounds__(GEMV_THREADS) k_gemv(gemv_args a)
{
    /* The experts' product (gemv_args.experts): row y of the grid is choice
     * y. Its expert is known only once the routing kernel before has run,
     * so the wait comes first and no weight load overlaps that kernel's
     * tail (the dense product's first loads do); then the rest runs on that
     * expert's matrix, input and output. */
    if constexpr (EXPERTS) {
        dependency_wait();
        const gemv_expert t = a.experts[a.expert_ids[blockIdx.y]];
        if (t.w == GEMV_EXPERT_ABSENT) /* the whole block leaves: no barrier is reached */
            return;
        const char *base = a.expert_base;
        a.w = base + t.w;
        if (a.scales)
            a.scales = reinterpret_cast<const float *>(base + t.scales);
        if (a.code)
            a.code = reinterpret_cast<const float *>(base + t.code);
        if (a.am_q)
            a.am_q = reinterpret_cast<const uint8_t *>(base + t.am_q);
        if (a.am_s2)
            a.am_s2 = reinterpret_cast<const float *>(base + t.am_s2);
        if (a.am_code)
            a.am_code = reinterpret_cast<const float *>(base + t.am_code);
        a.x += (size_t)blockIdx.y * a.x_stride;
        a.y += (size_t)blockIdx.y * a.y_stride;
    }
    extern __shared__ float4 smem[];
    typedef typename C::X X;
    X *xs = reinterpret_cast<X *>(smem); /* the input [cols (+ PAD every VEC columns)] */
    constexpr int VEC = C::VEC, STRIDE = VEC + C::PAD, U = C::UNROLL;
    const qinfo qi = a.group > 0 ? make_qinfo(a) : qinfo{0, 0}; /* the 16-byte quantized chunks */
    /* GLU: each output pairs gate row j with up row half + j. */
    constexpr int R = GLU ? 2 : C::ROWS, OUT = GLU ? 1 : C::ROWS;
    const int half = a.rows / 2, out_rows = GLU ? half : a.rows;
    const int lane = threadIdx.x & 31;
    const int warps_per_block = GEMV_THREADS / 32;
    /* SPREAD (the 4-bit gated product): warp w of block b is warp b + w * blocks, so that the last,
     * partial round of outputs spreads over every block instead of filling the first blocks' warps and
     * leaving the others' SMs idle (a multiprocessor streams at about a fixed rate). H100: 1B nf4
     * 1,630 -> 1,690 tok/s (8,192 outputs for 2,112 warps: 3.9 rounds), 8B nf4 406 -> 415, 8B nf4-dq
     * unchanged; int8's gated product measured 0.6% slower that way, and the head no different. */
    const int warp = GLU && C::SPREAD ? (threadIdx.x >> 5) * gridDim.x + blockIdx.x
                                      : blockIdx.x * warps_per_block + (threadIdx.x >> 5);
    const int stride = gridDim.x * warps_per_block * OUT;
    const int chunks = a.cols / VEC;
    const int per_step = 32 * U;
    const int steps = (chunks + per_step - 1) / per_step; /* per row group */
    const int first = warp * OUT;
    const int groups = first < out_rows ? (out_rows - 1 - first) / stride + 1 : 0;
    const int total = C::ONE_STEP ? min(groups * steps, 1) : groups * steps; /* one: the launcher's promise */

    C cur[R][U], nxt[R][U];
    /* Load step k (row group k / steps, step k % steps) into buf. */
    auto load = [&](C (&buf)[R][U], int group, int step) {
        const int r0 = first + group * stride;
#pragma unroll
        for (int r = 0; r < R; r++) {
            /* A row past the end re-reads the group's first row; its sum is dropped. */
            const int ri = GLU ? r0 + r * half : (r0 + r < a.rows ? r0 + r : r0);
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int c = step * per_step + 32 * u + lane;
                if (c < chunks)
                    buf[r][u].load(a, qi, ri, c);
            }
        }
    };
    /* y_max: the largest |output * y_max_norm| of the block, then of the grid. */
    __shared__ unsigned blk_max, blk_done;
    float ymx = 0.0f;
    if (threadIdx.x == 0)
        blk_max = blk_done = 0; /* published by stage_input's barrier */
    if (total > 0)
        load(cur, 0, 0);
    /* The 4-bit table reads the weights' code table, as the loads above read
     * the weights; stage_input's barrier publishes it. */
    if constexpr (C::TABLE > 0)
        C::table(a.code);
    if constexpr (C::NESTED)
        for (int i = threadIdx.x; i < 256; i += blockDim.x)
            am_code_s[i] = a.am_code[i];
    /* Launched as a programmatic dependent of the previous kernel: the
     * weight loads above overlap its tail; its outputs (our input) are
     * read only after this wait. */
    dependency_wait();
    /* The input, scaled where fp16: the sums are multiplied by xscale. */
    float xscale = 1.0f;
    if constexpr (IN == GEMV_IN_DIRECT) {
        xs = const_cast<X *>(reinterpret_cast<const X *>(a.x));
        __syncthreads(); /* blk_max, blk_done */
    } else {
        xscale = stage_input<IN, C::PAD ? VEC : 0, C::STAGE>(xs, a.x, a.norm, a.cols, a.eps, a.x_max);
    }

    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++)
        acc[r] = 0.0f;
    int group = 0, step = 0;
    for (int k = 0; k < total; k++) {
        const int ng = step + 1 == steps ? group + 1 : group, ns = step + 1 == steps ? 0 : step + 1;
        if (!C::ONE_STEP && k + 1 < total)
            load(nxt, ng, ns);
        else /* the last step: the next kernel may start loading its weights */
            dependents_may_launch();
        if (C::ROWS > 1) { /* rows inner, under one test: their dot products share the input reads */
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int c = step * per_step + 32 * u + lane;
                if (c < chunks)
#pragma unroll
                    for (int r = 0; r < R; r++)
                        acc[r] += cur[r][u].dot(xs + c * STRIDE);
            }
        } else { /* (rows inner cost the int8 GLU product 16 registers) */
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int u = 0; u < U; u++) {
                    const int c = step * per_step + 32 * u + lane;
                    if (c < chunks)
                        acc[r] += cur[r][u].dot(xs + c * STRIDE);
                }
        }
        if (ns == 0 && GLU) { /* the output is done: silu(gate) * up, or GeGLU's gelu(gate) * up */
            const int j = first + group * stride;
            float g = warp_sum(acc[0]) * xscale, u = warp_sum(acc[1]) * xscale;
            acc[0] = acc[1] = 0.0f;
            if (lane == 0) {
                if (a.bias) {
                    g += a.bias[j];
                    u += a.bias[half + j];
                }
                const float h = (a.gelu ? gelu_tanh(g) : silu(g)) * u;
                a.y[j] = h;
                if (a.y_max)
                    ymx = fmaxf(ymx, fabsf(a.y_max_norm ? h * a.y_max_norm[j] : h));
            }
        } else if (ns == 0) { /* the row group is done */
            const int r0 = first + group * stride;
#pragma unroll
            for (int r = 0; r < C::ROWS; r++) {
                const float sum = warp_sum(acc[r]) * xscale;
                acc[r] = 0.0f;
                const int i = r0 + r;
                if (lane == 0 && i < a.rows) {
                    float v = sum + (a.bias ? a.bias[i] : 0.0f);
                    if (a.accumulate)
                        v += a.y[i];
                    a.y[i] = v;
                    if (a.y_max)
                        ymx = fmaxf(ymx, fabsf(a.y_max_norm ? v * a.y_max_norm[i] : v));
                }
            }
        }
        if (!C::ONE_STEP)
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int u = 0; u < U; u++)
                    cur[r][u] = nxt[r][u];
        group = ng;
        step = ns;
    }
    if (a.y_max && lane == 0) { /* the block's last warp posts the block's maximum (no barrier) */
        atomicMax(&blk_max, __float_as_uint(ymx));
        __threadfence_block();
        if (atomicAdd(&blk_done, 1u) == (unsigned)(warps_per_block - 1))
            atomicMax(a.y_max, atomicOr(&blk_max, 0u));
    }
}

template <typename C, int IN, bool GLU>
static int run(launch_ctx *c, const gemv_args *a, size_t smem)
{
    auto kern = a->experts ? k_gemv<C, IN, GLU, true> : k_gemv<C, IN, GLU, false>;
    if (smem + C::TABLE > c->smem_max)
        return launch_fail(c, "gemv: %zu bytes of shared memory for %d columns, %zu here", smem + C::TABLE, a->cols,
                           c->smem_max);
    if (smem + C::TABLE > 48 * 1024 &&
        cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess)
        return launch_fail(c, "gemv: %zu bytes of shared memory for %d columns: %s", smem, a->cols,
                           cudaGetErrorString(cudaGetLastError()));
    int per_sm = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, GEMV_THREADS, smem);
    if (per_sm < 1)
        return launch_fail(c, "gemv: %d columns do not fit one block's shared memory", a->cols);
    /* Enough blocks to fill the chip, no more: each block pays for staging x.
     * One wave at most: blocks loop over row groups instead of queueing.
     * (Fewer blocks, so that every warp has the same number of row groups,
     * measured 1-2% slower on the 1B shape and on 4-bit weights.) */
    const long needed = ceil_div(GLU ? a->rows / 2 : ceil_div(a->rows, C::ROWS), GEMV_THREADS / 32);
    /* The experts' product shares the wave among its choices. */
    const int rows_y = a->experts ? a->n_choices : 1;
    long blocks = (long)c->n_sms * per_sm / rows_y;
    if (blocks < 1)
        blocks = 1;
    if (blocks > needed)
        blocks = needed;
    cudaError_t e = launch_pdl(c, kern, dim3((unsigned)blocks, (unsigned)rows_y), dim3(GEMV_THREADS), smem, *a);
    if (e != cudaSuccess)
        return launch_fail(c, "gemv: %s", cudaGetErrorString(e));
    return launch_check(c, "gemv");
}

template <typename C>
static int run_input(launch_ctx *c, const gemv_args *a, size_t smem)
{
    if (a->glu_out)
        return a->in == GEMV_IN_RMSNORM ? run<C, GEMV_IN_RMSNORM, true>(c, a, smem)
                                        : run<C, GEMV_IN_F32, true>(c, a, smem);
    if (smem > c->smem_max && a->in == GEMV_IN_F32 && std::is_same<typename C::X, float>::value && C::PAD == 0)
        return run<C, GEMV_IN_DIRECT, false>(c, a, 0);
    switch (a->in) {
    case GEMV_IN_F32: return run<C, GEMV_IN_F32, false>(c, a, smem);
    case GEMV_IN_RMSNORM: return run<C, GEMV_IN_RMSNORM, false>(c, a, smem);
    }
    return launch_fail(c, "gemv: unknown input mode %d", (int)a->in);
}

static bool pow2(int v) { return v > 0 && (v & (v - 1)) == 0; }

/* Whether a quantized matrix fits the 16-byte chunk types (else one element at a time). */
static bool chunks_fit(const gemv_args *a)
{
    if ((uintptr_t)a->w % 16 != 0)
        return false;
    if (a->wt == K_I8)
        return a->cols % 16 == 0 && (a->group >= a->cols || (a->group % 16 == 0 && pow2(a->group)));
    return a->cols % 32 == 0 && a->group % 32 == 0 && pow2(a->group);
}

/*
 * Whether a 4-bit product takes three rows a warp: not the gated one (two
 * rows a warp by design), its row pairs more than one wave's warps, its
 * row triples no more, and (plain chunks) a row in one step.
 */
template <typename C> static bool three_rows(launch_ctx *c, const gemv_args *a, size_t smem)
{
    typedef chunk_4bit_3rows<C> C3;
    if (a->glu_out || a->experts || (C3::ONE_STEP && a->cols > 32 * C3::VEC * C3::UNROLL))
        return false;
    auto kern = a->in == GEMV_IN_RMSNORM ? k_gemv<C3, GEMV_IN_RMSNORM, false, false>
                                         : k_gemv<C3, GEMV_IN_F32, false, false>;
    int per_sm = 0;
    if ((smem + C3::TABLE > 48 * 1024 &&
         cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess) ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, GEMV_THREADS, smem) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    const long warps = (long)c->n_sms * per_sm * (GEMV_THREADS / 32);
    return ceil_div(a->rows, 2) > warps && ceil_div(a->rows, 3) <= warps;
}

template <typename C> static int run_3rows(launch_ctx *c, const gemv_args *a, size_t smem)
{
    return a->in == GEMV_IN_RMSNORM ? run<chunk_4bit_3rows<C>, GEMV_IN_RMSNORM, false>(c, a, smem)
                                    : run<chunk_4bit_3rows<C>, GEMV_IN_F32, false>(c, a, smem);
}

/* A quantized matrix's arrays are there and its group fits its type. */
static bool quant_ok(const gemv_args *a)
{
    if (a->wt == K_I8)
        return a->scales && a->group > 0;
    return (a->scales || gemv_nested_ok(a)) && a->code && a->group > 0 && a->group % 2 == 0;
}

extern "C" int launch_gemv(launch_ctx *c, const gemv_args *a)
{
    if (!a->y || !a->w || !a->x || a->rows <= 0 || a->cols <= 0)
        return launch_fail(c, "gemv: bad arguments (rows %d, cols %d)", a->rows, a->cols);
    if (a->in == GEMV_IN_RMSNORM && !a->norm)
        return launch_fail(c, "gemv: RMSNorm input without norm weights");
    if (a->glu_out && (a->rows % 2 || a->accumulate))
        return launch_fail(c, "gemv: a gated output needs an even row count and no accumulation");
    if (a->experts && (!a->expert_base || !a->expert_ids || a->n_choices <= 0 || a->n_choices > 65535 ||
                       a->x_stride < 0 || a->y_stride < 0 || a->y_max || (a->x_max && a->x_stride)))
        return launch_fail(c, "gemv: bad expert arguments (%d choices, strides %d and %d)", a->n_choices,
                           a->x_stride, a->y_stride);
    /* The input in fp32, with 4 spare words every 16 columns at most (tables are static). */
    const size_t smem = ((size_t)a->cols + a->cols / 16 * 4) * sizeof(float);
    /* The types without padding need no spare words where those would not fit. */
    const size_t flat = (size_t)a->cols * sizeof(float), plain = smem <= c->smem_max ? smem : flat;
    const bool aligned = (uintptr_t)a->w % 16 == 0;
    switch (a->wt) {
    case K_I8:
        if (!quant_ok(a))
            return launch_fail(c, "gemv: int8 weights without scales");
        if (chunks_fit(a) && a->glu_out)
            return run_input<chunk_i8_glu>(c, a, smem);
        if (chunks_fit(a)) /* unpadded where the padded input would not fit (then staged, or read in place) */
            return smem <= c->smem_max ? run_input<chunk_i8>(c, a, smem) : run_input<chunk_i8_flat>(c, a, flat);
        return run_input<chunk_q1<K_I8>>(c, a, plain);
    case K_NF4:
    case K_FP4:
        if (!quant_ok(a))
            return launch_fail(c, "gemv: 4-bit weights without absmax, code table or an even block");
        if (chunks_fit(a)) { /* the input in fp16, 16 spare bytes every 32 columns */
            const size_t half_smem = ((size_t)a->cols + a->cols / 32 * 8) * sizeof(__half);
            if (half_smem + (a->am_q ? chunk_4bit_nested::TABLE : chunk_4bit::TABLE) > c->smem_max)
                return a->am_q ? run_input<chunk_4bit_flat<true>>(c, a, flat)
                               : run_input<chunk_4bit_flat<false>>(c, a, flat);
            if (a->am_q)
                return three_rows<chunk_4bit_nested>(c, a, half_smem)
                           ? run_3rows<chunk_4bit_nested>(c, a, half_smem)
                           : run_input<chunk_4bit_nested>(c, a, half_smem);
            return three_rows<chunk_4bit>(c, a, half_smem) ? run_3rows<chunk_4bit>(c, a, half_smem)
                                                            : run_input<chunk_4bit>(c, a, half_smem);
        }
        return run_input<chunk_q1<K_NF4>>(c, a, plain);
    default:
        break;
    }
    DISPATCH_TYPE(a->wt, T, {
        constexpr int vec = 16 / (int)sizeof(T);
        if (aligned && a->cols % vec == 0)
            return run_input<chunk_dense<T, vec>>(c, a, plain);
        return run_input<chunk_dense<T, 1>>(c, a, plain);
    });
    return 0;
}

/* ---- decoding a quantized matrix for the prefill products ---- */

template <typename O, k_dtype Q>
__global__ void k_dequant(O *out, gemv_args a)
{
    const size_t n = (size_t)a.rows * a.cols;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const int ri = (int)(i / a.cols), c = (int)(i - (size_t)ri * a.cols);
        chunk_q1<Q> q;
        q.load(a, qinfo{0, 0}, ri, c);
        out[i] = from_f32<O>(q.v);
    }
}

/*
 * The same where the decode product's chunks run, 8 weights a thread at a
 * time: a warp reads 128 (4-bit) or 256 (int8) contiguous bytes and writes
 * 8 x 32 contiguous outputs, every access coalesced, DQ_UNROLL of them in
 * flight a thread. (A 16-byte chunk a thread wrote its 64 bytes of output
 * at a 64-byte stride across the warp: the 8B model's 512-token nf4
 * prefill spent half its time decoding, at 1.45 TB/s of traffic.)
 */
#define DQ_UNROLL 4
/* The 4-bit code table in fp32, for the prefill decoding: exactly the CPU's weights. */
__shared__ float code_s[16];
template <typename O, bool I8>
__global__ void __launch_bounds__(256) k_dequant_words(O *out, gemv_args a)
{
    if (!I8 && threadIdx.x < 16)
        code_s[threadIdx.x] = a.code[threadIdx.x];
    if (!I8 && a.am_q)
        for (int i = threadIdx.x; i < 256; i += blockDim.x)
            am_code_s[i] = a.am_code[i];
    __syncthreads();
    const qinfo qi = make_qinfo(a);
    const size_t total = (size_t)a.rows * a.cols / 8, stride = (size_t)gridDim.x * blockDim.x;
    for (size_t t0 = (size_t)blockIdx.x * blockDim.x + threadIdx.x; t0 < total; t0 += DQ_UNROLL * stride) {
        uint2 v[DQ_UNROLL]; /* int8: 8 bytes; 4-bit: 4 bytes in .x */
        float s[DQ_UNROLL];
#pragma unroll
        for (int u = 0; u < DQ_UNROLL; u++) {
            const size_t t = t0 + u * stride, e = 8 * t; /* the first of its weights */
            if (t >= total)
                break;
            if (I8) {
                v[u] = __ldg(reinterpret_cast<const uint2 *>(a.w) + t);
                const size_t ri = e / (size_t)a.cols;
                s[u] = __ldg(a.scales + ri * qi.n_groups + ((e - ri * a.cols) >> qi.shift));
            } else {
                v[u].x = __ldg(reinterpret_cast<const uint32_t *>(a.w) + t);
                s[u] = absmax_at(a, am_code_s, e >> qi.shift);
            }
        }
#pragma unroll
        for (int u = 0; u < DQ_UNROLL; u++) {
            const size_t t = t0 + u * stride;
            if (t >= total)
                break;
            float f[8];
            if (I8) { /* q + 128 as the low byte of 2^23's float, as chunk_i8 */
                const uint32_t w[2] = {v[u].x ^ 0x80808080u, v[u].y ^ 0x80808080u};
#pragma unroll
                for (int i = 0; i < 8; i++)
                    f[i] = (__uint_as_float(__byte_perm(w[i / 4], 0x4b000000u, 0x7440 + i % 4)) - 8388736.0f) * s[u];
            } else { /* high nibble first, as chunk_4bit */
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const uint32_t b = (v[u].x >> (8 * i)) & 0xffu;
                    f[2 * i] = code_s[b >> 4] * s[u];
                    f[2 * i + 1] = code_s[b & 15u] * s[u];
                }
            }
            constexpr int PER = 16 / sizeof(O); /* outputs a 16-byte store */
            uint4 *dst = reinterpret_cast<uint4 *>(out + 8 * t);
#pragma unroll
            for (int g = 0; g < 8 / PER; g++) {
                uint4 pk;
                O *po = reinterpret_cast<O *>(&pk);
#pragma unroll
                for (int i = 0; i < PER; i++)
                    po[i] = from_f32<O>(f[g * PER + i]);
                dst[g] = pk;
            }
        }
    }
}

extern "C" int launch_dequant(launch_ctx *c, void *out, k_dtype ot, const gemv_args *a)
{
    if (!out || !a->w || a->rows <= 0 || a->cols <= 0 || !k_dtype_is_quant(a->wt) || !quant_ok(a))
        return launch_fail(c, "dequant: bad arguments (type %d, rows %d, cols %d)", (int)a->wt, a->rows, a->cols);
    const size_t n = (size_t)a->rows * a->cols;
    const size_t cap = (size_t)(c->n_sms > 0 ? c->n_sms : 1) * 16;
    const unsigned blocks = (unsigned)(n / 256 + 1 < cap ? n / 256 + 1 : cap);
    const bool chunks = chunks_fit(a);
    DISPATCH_TYPE(ot, O, {
        O *o = static_cast<O *>(out);
        if (a->wt == K_I8 && chunks)
            k_dequant_words<O, true><<<blocks, 256, 0, c->stream>>>(o, *a);
        else if (a->wt == K_I8)
            k_dequant<O, K_I8><<<blocks, 256, 0, c->stream>>>(o, *a);
        else if (chunks)
            k_dequant_words<O, false><<<blocks, 256, 0, c->stream>>>(o, *a);
        else
            k_dequant<O, K_NF4><<<blocks, 256, 0, c->stream>>>(o, *a);
    });
    return launch_check(c, "dequant");
}
