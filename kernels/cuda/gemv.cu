/*
 * gemv.cu: the matrix-vector product of decode, y (=|+=) W . in(x).
 *
 * Decode reads every weight once per token, so this kernel is the token
 * rate: it must stream W at the memory bandwidth. Each block first builds
 * the input vector in shared memory as fp32 (plain or RMS-normalised: the
 * norm costs no launch and no round trip through memory), then each warp
 * walks its rows with 16-byte loads, several in flight per lane, and
 * reduces with shuffles. The gate/up product pairs gate row j with up row
 * j in one warp and writes silu(gate) * up, so SwiGLU needs no launch
 * either (measured better than staging the SwiGLU as the next product's
 * input, which read 2 x 57 KB per block of the 8B down projection).
 */
#include "common.cuh"

#define GEMV_THREADS 256
#ifndef GEMV_ROWS
#define GEMV_ROWS 1   /* rows a warp works on together (1 measured best on H100) */
#endif
#ifndef GEMV_UNROLL
#define GEMV_UNROLL 8 /* 16-byte loads per lane per step */
#endif

/*
 * The input vector in fp32, built once per block into xs[cols]. Loads are
 * 16 bytes wide and unrolled so that many are in flight: a block waits for
 * this before its first product, and a loop of dependent round trips to L2
 * here once cost more than streaming the weights.
 */
template <int IN>
__device__ void stage_input(float *xs, const float *x, const float *norm, int cols, float eps)
{
    const bool vec = (cols % 4 == 0) && ((uintptr_t)x % 16 == 0) && (IN != GEMV_IN_RMSNORM || (uintptr_t)norm % 16 == 0);
    float ss = 0.0f;
    if (vec) {
        const int n4 = cols / 4;
        const float4 *x4 = reinterpret_cast<const float4 *>(x);
        float4 *xs4 = reinterpret_cast<float4 *>(xs);
#pragma unroll 4
        for (int j = threadIdx.x; j < n4; j += blockDim.x) {
            float4 v = x4[j];
            if (IN == GEMV_IN_RMSNORM) {
                /* The norm weight goes in now; the 1/rms factor once it is known. */
                const float4 g = reinterpret_cast<const float4 *>(norm)[j];
                ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
                v.x *= g.x;
                v.y *= g.y;
                v.z *= g.z;
                v.w *= g.w;
            }
            xs4[j] = v;
        }
    } else {
        for (int j = threadIdx.x; j < cols; j += blockDim.x) {
            float v = x[j];
            if (IN == GEMV_IN_RMSNORM) {
                ss += v * v;
                v *= norm[j];
            }
            xs[j] = v;
        }
    }
    if (IN == GEMV_IN_RMSNORM) {
        ss = block_sum(ss); /* its barriers also make xs visible */
        const float inv = rsqrtf(ss / cols + eps);
        for (int j = threadIdx.x; j < cols; j += blockDim.x)
            xs[j] *= inv;
    }
    __syncthreads();
}

/*
 * One unit of loading: 16 bytes of a row (VEC elements) when rows are
 * 16-byte aligned, else a single element.
 */
template <typename T, int VEC> struct chunk {
    uint4 v;
    __device__ __forceinline__ void load(const T *row, int c) { v = __ldg(reinterpret_cast<const uint4 *>(row) + c); }
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
template <typename T> struct chunk<T, 1> {
    T v;
    __device__ __forceinline__ void load(const T *row, int c) { v = row[c]; }
    __device__ __forceinline__ float dot(const float *xs) const { return to_f32(v) * xs[0]; }
};

/*
 * Each warp owns row groups r0, r0 + stride, ... (GEMV_ROWS rows each) and
 * walks them in steps of GEMV_UNROLL chunks per lane. The loads of the next
 * step are issued before the current one is summed, across row groups too,
 * and the first step's loads go out before the input is staged: a warp
 * never waits on memory with nothing in flight.
 */
template <typename T, int VEC, int IN, bool GLU>
__global__ void __launch_bounds__(GEMV_THREADS) k_gemv(gemv_args a)
{
    extern __shared__ float xs[];
    typedef chunk<T, VEC> C;
    /* GLU: each output pairs gate row j with up row half + j. */
    constexpr int R = GLU ? 2 : GEMV_ROWS, OUT = GLU ? 1 : GEMV_ROWS;
    const int half = a.rows / 2, out_rows = GLU ? half : a.rows;
    const int lane = threadIdx.x & 31;
    const int warps_per_block = GEMV_THREADS / 32;
    const int warp = blockIdx.x * warps_per_block + (threadIdx.x >> 5);
    const int stride = gridDim.x * warps_per_block * OUT;
    const int chunks = a.cols / VEC;
    const int per_step = 32 * GEMV_UNROLL;
    const int steps = (chunks + per_step - 1) / per_step; /* per row group */
    const int first = warp * OUT;
    const int groups = first < out_rows ? (out_rows - 1 - first) / stride + 1 : 0;
    const int total = groups * steps;
    const T *W = static_cast<const T *>(a.w);

    C cur[R][GEMV_UNROLL], nxt[R][GEMV_UNROLL];
    /* Load step k (row group k / steps, step k % steps) into buf. */
    auto load = [&](C (&buf)[R][GEMV_UNROLL], int group, int step) {
        const int r0 = first + group * stride;
#pragma unroll
        for (int r = 0; r < R; r++) {
            /* A row past the end re-reads the group's first row; its sum is dropped. */
            const int ri = GLU ? r0 + r * half : (r0 + r < a.rows ? r0 + r : r0);
            const T *row = W + (size_t)ri * a.cols;
#pragma unroll
            for (int u = 0; u < GEMV_UNROLL; u++) {
                const int c = step * per_step + 32 * u + lane;
                if (c < chunks)
                    buf[r][u].load(row, c);
            }
        }
    };
    if (total > 0)
        load(cur, 0, 0);
    /* Launched as a programmatic dependent of the previous kernel: the
     * weight loads above overlap its tail; its outputs (our input) are
     * read only after this wait. */
    dependency_wait();
    stage_input<IN>(xs, a.x, a.norm, a.cols, a.eps);

    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++)
        acc[r] = 0.0f;
    int group = 0, step = 0;
    for (int k = 0; k < total; k++) {
        const int ng = step + 1 == steps ? group + 1 : group, ns = step + 1 == steps ? 0 : step + 1;
        if (k + 1 < total)
            load(nxt, ng, ns);
        else /* the last step: the next kernel may start loading its weights */
            dependents_may_launch();
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int u = 0; u < GEMV_UNROLL; u++) {
                const int c = step * per_step + 32 * u + lane;
                if (c < chunks)
                    acc[r] += cur[r][u].dot(xs + c * VEC);
            }
        if (ns == 0 && GLU) { /* the output is done: silu(gate) * up */
            const int j = first + group * stride;
            float g = warp_sum(acc[0]), u = warp_sum(acc[1]);
            acc[0] = acc[1] = 0.0f;
            if (lane == 0) {
                if (a.bias) {
                    g += a.bias[j];
                    u += a.bias[half + j];
                }
                a.y[j] = g / (1.0f + expf(-g)) * u;
            }
        } else if (ns == 0) { /* the row group is done */
            const int r0 = first + group * stride;
#pragma unroll
            for (int r = 0; r < GEMV_ROWS; r++) {
                const float sum = warp_sum(acc[r]);
                acc[r] = 0.0f;
                const int i = r0 + r;
                if (lane == 0 && i < a.rows) {
                    const float v = sum + (a.bias ? a.bias[i] : 0.0f);
                    a.y[i] = a.accumulate ? a.y[i] + v : v;
                }
            }
        }
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int u = 0; u < GEMV_UNROLL; u++)
                cur[r][u] = nxt[r][u];
        group = ng;
        step = ns;
    }
}

template <typename T, int VEC, int IN, bool GLU>
static int run(launch_ctx *c, const gemv_args *a, size_t smem)
{
    auto kern = k_gemv<T, VEC, IN, GLU>;
    if (smem > 48 * 1024 &&
        cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess)
        return launch_fail(c, "gemv: %zu bytes of shared memory for %d columns: %s", smem, a->cols,
                           cudaGetErrorString(cudaGetLastError()));
    int per_sm = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, GEMV_THREADS, smem);
    if (per_sm < 1)
        return launch_fail(c, "gemv: %d columns do not fit one block's shared memory", a->cols);
    /* Enough blocks to fill the chip, no more: each block pays for staging x. */
    /* One wave at most: blocks loop over row groups instead of queueing. */
    const long needed = GLU ? ceil_div(a->rows / 2, GEMV_THREADS / 32) : ceil_div(a->rows, (GEMV_THREADS / 32) * GEMV_ROWS);
    long blocks = (long)c->n_sms * per_sm;
    if (blocks > needed)
        blocks = needed;
    cudaError_t e = launch_pdl(kern, dim3((unsigned)blocks), dim3(GEMV_THREADS), smem, c->stream, *a);
    if (e != cudaSuccess)
        return launch_fail(c, "gemv: %s", cudaGetErrorString(e));
    return launch_check(c, "gemv");
}

template <typename T, int VEC>
static int run_input(launch_ctx *c, const gemv_args *a, size_t smem)
{
    if (a->glu_out)
        return a->in == GEMV_IN_RMSNORM ? run<T, VEC, GEMV_IN_RMSNORM, true>(c, a, smem)
                                        : run<T, VEC, GEMV_IN_F32, true>(c, a, smem);
    switch (a->in) {
    case GEMV_IN_F32: return run<T, VEC, GEMV_IN_F32, false>(c, a, smem);
    case GEMV_IN_RMSNORM: return run<T, VEC, GEMV_IN_RMSNORM, false>(c, a, smem);
    }
    return launch_fail(c, "gemv: unknown input mode %d", (int)a->in);
}

extern "C" int launch_gemv(launch_ctx *c, const gemv_args *a)
{
    if (!a->y || !a->w || !a->x || a->rows <= 0 || a->cols <= 0)
        return launch_fail(c, "gemv: bad arguments (rows %d, cols %d)", a->rows, a->cols);
    if (a->in == GEMV_IN_RMSNORM && !a->norm)
        return launch_fail(c, "gemv: RMSNorm input without norm weights");
    if (a->glu_out && (a->rows % 2 || a->accumulate))
        return launch_fail(c, "gemv: a gated output needs an even row count and no accumulation");
    const size_t smem = (size_t)a->cols * sizeof(float);
    DISPATCH_TYPE(a->wt, T, {
        const int vec = 16 / (int)sizeof(T);
        const bool aligned = ((uintptr_t)a->w % 16 == 0) && (a->cols % vec == 0);
        if (aligned)
            return run_input<T, 16 / sizeof(T)>(c, a, smem);
        return run_input<T, 1>(c, a, smem);
    });
    return 0;
}
