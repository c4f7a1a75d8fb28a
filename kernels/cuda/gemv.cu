/*
 * gemv.cu: the matrix-vector product of decode, y (=|+=) W . in(x).
 *
 * Decode reads every weight once per token, so this kernel is the token
 * rate: it must stream W at the memory bandwidth. Each block first builds
 * the input vector in shared memory as fp32 (plain, RMS-normalised, or the
 * SwiGLU of gate and up: the step before the product costs no launch and no
 * round trip through memory), then each warp walks its rows with 16-byte
 * loads, several in flight per lane, and reduces with shuffles.
 */
#include "common.cuh"

#define GEMV_THREADS 256
#define GEMV_ROWS 2   /* rows a warp works on together      */
#define GEMV_UNROLL 4 /* 16-byte loads in flight per row    */

/* The input vector in fp32, built once per block into xs[cols]. */
template <int IN>
__device__ void stage_input(float *xs, const float *x, const float *norm, int cols, float eps)
{
    if (IN == GEMV_IN_RMSNORM) {
        float ss = 0.0f;
        for (int j = threadIdx.x; j < cols; j += blockDim.x)
            ss += x[j] * x[j];
        ss = block_sum(ss);
        const float inv = rsqrtf(ss / cols + eps);
        for (int j = threadIdx.x; j < cols; j += blockDim.x)
            xs[j] = x[j] * inv * norm[j];
    } else if (IN == GEMV_IN_SWIGLU) {
        for (int j = threadIdx.x; j < cols; j += blockDim.x) {
            const float g = x[j];
            xs[j] = g / (1.0f + expf(-g)) * x[cols + j];
        }
    } else {
        for (int j = threadIdx.x; j < cols; j += blockDim.x)
            xs[j] = x[j];
    }
    __syncthreads();
}

/* Dot of VEC weights (one 16-byte load, or one element) with xs[j..]. */
template <typename T, int VEC>
__device__ __forceinline__ float dot_chunk(const uint4 &raw, const T *scalar, const float *xs)
{
    float s = 0.0f;
    if (VEC == 1) {
        s = to_f32(*scalar) * xs[0];
    } else {
        const T *w = reinterpret_cast<const T *>(&raw);
#pragma unroll
        for (int i = 0; i < VEC; i++)
            s += to_f32(w[i]) * xs[i];
    }
    return s;
}

/*
 * VEC = 16 / sizeof(T) when every row starts 16-byte aligned, else 1.
 * Lane l of a warp takes chunks l, l+32, ... of its rows.
 */
template <typename T, int VEC, int IN>
__global__ void __launch_bounds__(GEMV_THREADS) k_gemv(gemv_args a)
{
    extern __shared__ float xs[];
    stage_input<IN>(xs, a.x, a.norm, a.cols, a.eps);

    const int lane = threadIdx.x & 31;
    const int warps_per_block = GEMV_THREADS / 32;
    const int warp = blockIdx.x * warps_per_block + (threadIdx.x >> 5);
    const int n_warps = gridDim.x * warps_per_block;
    const int chunks = a.cols / VEC;
    const T *W = static_cast<const T *>(a.w);

    for (int r0 = warp * GEMV_ROWS; r0 < a.rows; r0 += n_warps * GEMV_ROWS) {
        float acc[GEMV_ROWS];
        const T *row[GEMV_ROWS];
#pragma unroll
        for (int r = 0; r < GEMV_ROWS; r++) {
            acc[r] = 0.0f;
            /* A missing last row re-reads row r0 and is dropped below. */
            row[r] = W + (size_t)(r0 + r < a.rows ? r0 + r : r0) * a.cols;
        }
        int c = lane;
        for (; c + 32 * (GEMV_UNROLL - 1) < chunks; c += 32 * GEMV_UNROLL) {
            uint4 raw[GEMV_ROWS][GEMV_UNROLL];
#pragma unroll
            for (int r = 0; r < GEMV_ROWS; r++)
#pragma unroll
                for (int u = 0; u < GEMV_UNROLL; u++)
                    if (VEC > 1)
                        raw[r][u] = __ldg(reinterpret_cast<const uint4 *>(row[r]) + c + 32 * u);
#pragma unroll
            for (int r = 0; r < GEMV_ROWS; r++)
#pragma unroll
                for (int u = 0; u < GEMV_UNROLL; u++) {
                    const int j = (c + 32 * u) * VEC;
                    acc[r] += dot_chunk<T, VEC>(raw[r][u], row[r] + j, xs + j);
                }
        }
        for (; c < chunks; c += 32) {
#pragma unroll
            for (int r = 0; r < GEMV_ROWS; r++) {
                uint4 raw = make_uint4(0, 0, 0, 0);
                if (VEC > 1)
                    raw = __ldg(reinterpret_cast<const uint4 *>(row[r]) + c);
                acc[r] += dot_chunk<T, VEC>(raw, row[r] + c * VEC, xs + c * VEC);
            }
        }
#pragma unroll
        for (int r = 0; r < GEMV_ROWS; r++) {
            const float s = warp_sum(acc[r]);
            const int i = r0 + r;
            if (lane == 0 && i < a.rows) {
                float v = s + (a.bias ? a.bias[i] : 0.0f);
                a.y[i] = a.accumulate ? a.y[i] + v : v;
            }
        }
    }
}

template <typename T, int VEC, int IN>
static int run(launch_ctx *c, const gemv_args *a, size_t smem)
{
    auto kern = k_gemv<T, VEC, IN>;
    if (smem > 48 * 1024 &&
        cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess)
        return launch_fail(c, "gemv: %zu bytes of shared memory for %d columns: %s", smem, a->cols,
                           cudaGetErrorString(cudaGetLastError()));
    int per_sm = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, GEMV_THREADS, smem);
    if (per_sm < 1)
        return launch_fail(c, "gemv: %d columns do not fit one block's shared memory", a->cols);
    /* Enough blocks to fill the chip, no more: each block pays for staging x. */
    const long needed = ceil_div(a->rows, (GEMV_THREADS / 32) * GEMV_ROWS);
    long blocks = (long)c->n_sms * (per_sm < 2 ? per_sm : 2);
    if (blocks > needed)
        blocks = needed;
    kern<<<(unsigned)blocks, GEMV_THREADS, smem, c->stream>>>(*a);
    return launch_check(c, "gemv");
}

template <typename T, int VEC>
static int run_input(launch_ctx *c, const gemv_args *a, size_t smem)
{
    switch (a->in) {
    case GEMV_IN_F32: return run<T, VEC, GEMV_IN_F32>(c, a, smem);
    case GEMV_IN_RMSNORM: return run<T, VEC, GEMV_IN_RMSNORM>(c, a, smem);
    case GEMV_IN_SWIGLU: return run<T, VEC, GEMV_IN_SWIGLU>(c, a, smem);
    }
    return launch_fail(c, "gemv: unknown input mode %d", (int)a->in);
}

extern "C" int launch_gemv(launch_ctx *c, const gemv_args *a)
{
    if (!a->y || !a->w || !a->x || a->rows <= 0 || a->cols <= 0)
        return launch_fail(c, "gemv: bad arguments (rows %d, cols %d)", a->rows, a->cols);
    if (a->in == GEMV_IN_RMSNORM && !a->norm)
        return launch_fail(c, "gemv: RMSNorm input without norm weights");
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
