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
#include "gemv.cuh"

/*
 * One output row (or gate/up pair) a warp at a time, over the whole grid
 * (rows_walk, gemv.cuh); the table and the wait come after the first
 * step's weight loads, so they overlap the previous kernel's tail.
 */
template <typename C, int IN, bool GLU>
__global__ void __launch_bounds__(GEMV_THREADS) k_gemv(gemv_args a)
{
    extern __shared__ float4 smem[];
    typedef typename C::X X;
    X *xs = reinterpret_cast<X *>(smem); /* the input [cols (+ PAD every VEC columns)] */
    constexpr int OUT = GLU ? 1 : C::ROWS;
    const int half = a.rows / 2, out_rows = GLU ? half : a.rows;
    const int lane = threadIdx.x & 31;
    const int warps_per_block = GEMV_THREADS / 32;
    const int warp = blockIdx.x * warps_per_block + (threadIdx.x >> 5);
    /* y_max: the largest |output * y_max_norm| of the block, then of the grid. */
    __shared__ unsigned blk_max, blk_done;
    float ymx = 0.0f;
    if (threadIdx.x == 0)
        blk_max = blk_done = 0; /* published by stage_input's barrier */
    auto prologue = [&]() {
        /* The 4-bit table reads the weights' code table, as the first loads
         * read the weights; stage_input's barrier publishes it. */
        if constexpr (C::TABLE > 0)
            build_pairs(a.code);
        if constexpr (C::NESTED)
            for (int i = threadIdx.x; i < 256; i += blockDim.x)
                am_code_s[i] = a.am_code[i];
        /* Launched as a programmatic dependent of the previous kernel: the
         * weight loads overlap its tail; its outputs (our input) are read
         * only after this wait. The input, scaled where fp16: the sums are
         * multiplied by what stage_input returns. */
        dependency_wait();
        return stage_input<IN, C::PAD ? C::VEC : 0>(xs, a.x, a.norm, a.cols, a.eps, a.x_max);
    };
    auto emit = [&](int i, float sum, float up) {
        if (GLU) { /* the output is done: silu(gate) * up */
            if (lane == 0) {
                float g = sum, u = up;
                if (a.bias) {
                    g += a.bias[i];
                    u += a.bias[half + i];
                }
                const float h = g / (1.0f + expf(-g)) * u;
                a.y[i] = h;
                if (a.y_max)
                    ymx = fmaxf(ymx, fabsf(a.y_max_norm ? h * a.y_max_norm[i] : h));
            }
        } else if (lane == 0 && i < a.rows) {
            float v = sum + (a.bias ? a.bias[i] : 0.0f);
            if (a.accumulate)
                v += a.y[i];
            a.y[i] = v;
            if (a.y_max)
                ymx = fmaxf(ymx, fabsf(a.y_max_norm ? v * a.y_max_norm[i] : v));
        }
    };
    rows_walk<C, GLU>(a, xs, warp * OUT, gridDim.x * warps_per_block * OUT, out_rows, 0, true, prologue, emit);
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
    auto kern = k_gemv<C, IN, GLU>;
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
    long blocks = (long)c->n_sms * per_sm;
    if (blocks > needed)
        blocks = needed;
    cudaError_t e = launch_pdl(kern, dim3((unsigned)blocks), dim3(GEMV_THREADS), smem, c->stream, *a);
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

/* A quantized matrix's arrays are there and its group fits its type. */
static bool quant_ok(const gemv_args *a)
{
    if (a->wt == K_I8)
        return a->scales && a->group > 0;
    const bool nested = a->am_q && a->am_s2 && a->am_code && a->am_shift >= 0 && a->am_shift < 31;
    return (a->scales || nested) && a->code && a->group > 0 && a->group % 2 == 0;
}

extern "C" int launch_gemv(launch_ctx *c, const gemv_args *a)
{
    if (!a->y || !a->w || !a->x || a->rows <= 0 || a->cols <= 0)
        return launch_fail(c, "gemv: bad arguments (rows %d, cols %d)", a->rows, a->cols);
    if (a->in == GEMV_IN_RMSNORM && !a->norm)
        return launch_fail(c, "gemv: RMSNorm input without norm weights");
    if (a->glu_out && (a->rows % 2 || a->accumulate))
        return launch_fail(c, "gemv: a gated output needs an even row count and no accumulation");
    /* The input in fp32, with 4 spare words every 16 columns at most (tables are static). */
    const size_t smem = ((size_t)a->cols + a->cols / 16 * 4) * sizeof(float);
    const bool aligned = (uintptr_t)a->w % 16 == 0;
    switch (a->wt) {
    case K_I8:
        if (!quant_ok(a))
            return launch_fail(c, "gemv: int8 weights without scales");
        if (chunks_fit(a))
            return a->glu_out ? run_input<chunk_i8_glu>(c, a, smem) : run_input<chunk_i8>(c, a, smem);
        return run_input<chunk_q1<K_I8>>(c, a, smem);
    case K_NF4:
    case K_FP4:
        if (!quant_ok(a))
            return launch_fail(c, "gemv: 4-bit weights without absmax, code table or an even block");
        if (chunks_fit(a)) { /* the input in fp16, 16 spare bytes every 32 columns */
            const size_t half_smem = ((size_t)a->cols + a->cols / 32 * 8) * sizeof(__half);
            return a->am_q ? run_input<chunk_4bit_nested>(c, a, half_smem) : run_input<chunk_4bit>(c, a, half_smem);
        }
        return run_input<chunk_q1<K_NF4>>(c, a, smem);
    default:
        break;
    }
    DISPATCH_TYPE(a->wt, T, {
        constexpr int vec = 16 / (int)sizeof(T);
        if (aligned && a->cols % vec == 0)
            return run_input<chunk_dense<T, vec>>(c, a, smem);
        return run_input<chunk_dense<T, 1>>(c, a, smem);
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
