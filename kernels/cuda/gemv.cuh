/*
 * gemv.cuh: the parts of the decode products shared by the one-product
 * kernel (gemv.cu) and the fused feed-forward kernel (ffn_decode.cu): the
 * input's staging into shared memory (fp32, or scaled fp16 for the 4-bit
 * types) and the chunk types, which load 16 bytes of a quantized or dense
 * row with its scale and take their dot product with the staged input.
 * gemv.cu's opening comment tells why they are shaped as they are.
 */
#ifndef ENGINE_KERNELS_CUDA_GEMV_CUH
#define ENGINE_KERNELS_CUDA_GEMV_CUH

#include "common.cuh"
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
template <int IN, int P>
__device__ float stage_input(float *xs, const float *x, const float *norm, int cols, float eps, const unsigned *)
{
    const bool rms = IN == GEMV_IN_RMSNORM;
    const bool vec = (cols % 4 == 0) && ((uintptr_t)x % 16 == 0) && (!rms || (uintptr_t)norm % 16 == 0);
    float ss = 0.0f;
    if (vec) {
        const int n4 = cols / 4;
        constexpr int SB = 4; /* groups of 4 a thread at once: loads first, as the fp16 staging below */
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
static __device__ float2 block_sum_max(float s, float m)
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
template <int IN, int P>
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
     * with the norm weights' loads too, so that the registers stay at 128. */
    constexpr int SB = rms ? 2 : 4;
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
 * 8-bit code exactly as the CPU does (the product rounded, then the sum;
 * no fused multiply-add). `table`: the nested code table (am_code, or a
 * copy of it in shared memory).
 */
__device__ __forceinline__ float nested_absmax(const gemv_args &a, const float *table, uint32_t q, size_t b)
{
    const float2 s = __ldg(reinterpret_cast<const float2 *>(a.am_s2) + (b >> a.am_shift));
    return __fadd_rn(__fmul_rn(table[q], s.x), s.y);
}
__device__ __forceinline__ float absmax_at(const gemv_args &a, const float *table, size_t b)
{
    return a.am_q ? nested_absmax(a, table, __ldg(a.am_q + b), b) : __ldg(a.scales + b);
}

/* What the types other than the 4-bit one stage: the input in fp32, no table. */
struct x_f32 {
    typedef float X;
    static constexpr size_t TABLE = 0;
    static constexpr bool NESTED = false;
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
    static constexpr bool NESTED = false;
    uint4 v;
    float am;
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
        return q4_dot(v, __fadd_rn(__fmul_rn(am_code_s[q], s.x), s.y), xs);
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
 * A warp's walk over its row groups first, first + stride, ... below
 * out_rows (C::ROWS rows each; GLU: output j pairs gate row base + j with
 * up row half + base + j, half = a.rows / 2), in steps of C::UNROLL chunks
 * a lane. The loads of the next step are issued before the current one is
 * summed, across row groups too, and the first step's loads go out before
 * prologue() runs (the caller's wait and staging; it returns what the sums
 * are multiplied by): a warp never waits on memory with nothing in flight.
 * emit(i, sum, up) takes each finished output, sums reduced over the warp
 * (every lane calls it; GLU: sum is gate row i's, up its up row's; else
 * once per row i of the group, up unused). With launch_dependents, the
 * last step lets the next kernel start (dependents_may_launch).
 */
template <typename C, bool GLU, typename Prologue, typename Emit>
__device__ __forceinline__ void rows_walk(const gemv_args &a, const typename C::X *xs, int first, int stride,
                                          int out_rows, int base, bool launch_dependents, Prologue prologue,
                                          Emit emit)
{
    constexpr int VEC = C::VEC, STRIDE = VEC + C::PAD, U = C::UNROLL;
    const qinfo qi = C::PAD && a.group > 0 ? make_qinfo(a) : qinfo{0, 0}; /* the 16-byte quantized chunks */
    constexpr int R = GLU ? 2 : C::ROWS;
    const int half = a.rows / 2;
    const int lane = threadIdx.x & 31;
    const int chunks = a.cols / VEC;
    const int per_step = 32 * U;
    const int steps = (chunks + per_step - 1) / per_step; /* per row group */
    const int groups = first < out_rows ? (out_rows - 1 - first) / stride + 1 : 0;
    const int total = groups * steps;

    C cur[R][U], nxt[R][U];
    /* Load step k (row group k / steps, step k % steps) into buf. */
    auto load = [&](C (&buf)[R][U], int group, int step) {
        const int r0 = base + first + group * stride;
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
    if (total > 0)
        load(cur, 0, 0);
    const float xscale = prologue();

    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++)
        acc[r] = 0.0f;
    int group = 0, step = 0;
    for (int k = 0; k < total; k++) {
        const int ng = step + 1 == steps ? group + 1 : group, ns = step + 1 == steps ? 0 : step + 1;
        if (k + 1 < total)
            load(nxt, ng, ns);
        else if (launch_dependents) /* the last step: the next kernel may start loading its weights */
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
        if (ns == 0 && GLU) { /* the output is done */
            const float g = warp_sum(acc[0]) * xscale, u = warp_sum(acc[1]) * xscale;
            acc[0] = acc[1] = 0.0f;
            emit(base + first + group * stride, g, u);
        } else if (ns == 0) { /* the row group is done */
            const int r0 = base + first + group * stride;
#pragma unroll
            for (int r = 0; r < C::ROWS; r++) {
                const float sum = warp_sum(acc[r]) * xscale;
                acc[r] = 0.0f;
                emit(r0 + r, sum, 0.0f);
            }
        }
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int u = 0; u < U; u++)
                cur[r][u] = nxt[r][u];
        group = ng;
        step = ns;
    }
}

#endif
