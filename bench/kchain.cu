/*
 * kchain.cu: what a kernel boundary costs in a decode graph, apart from the
 * bytes a kernel reads. A decode step is a chain of dependent kernels (five
 * a layer); bench/RESULTS.md (2026-11-23) found each product taking 7-11 µs
 * more than its bytes need. This program times chains of 1,000 steps, one
 * step being:
 *
 *   empty     a kernel that waits for the previous one and writes a word
 *   stage     + what a decode product does before its first product: read
 *             the 4,096-float input, RMS-normalise it into shared memory
 *             (two passes, a block reduction), write its slice of the output
 *   weights   + read W bytes of "weights" (a fresh slice each step, so they
 *             come from memory): the floor of a product of that size
 *
 * each as (a) kernels launched as programmatic dependents (PDL, as the
 * engine's decode graph does; here each lets the next launch at once, the
 * most overlap PDL allows), (b) plain kernels, (c) phases of one
 * persistent kernel separated by a grid-wide barrier, the alternative
 * design. (a) and (b) run as CUDA graphs of `steps` launches, (c) as one
 * launch; per step = that time / steps.
 *
 *   kchain [--steps N] [--weights BYTES]    (default 1000, 9.5e6: an 8B nf4 o-projection)
 */
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "../kernels/cuda/common.cuh" /* block_sum, the PDL wait/trigger and launch */

#define CHECK_CUDA(x)                                                                  \
    do {                                                                               \
        cudaError_t e_ = (x);                                                          \
        if (e_ != cudaSuccess) {                                                       \
            std::fprintf(stderr, "kchain: %s: %s\n", #x, cudaGetErrorString(e_));      \
            std::exit(1);                                                              \
        }                                                                              \
    } while (0)

#define THREADS 256
#define COLS 4096

enum { EMPTY = 0, STAGE = 1, WEIGHTS = 2 };

struct chain_args {
    float *buf[2];          /* the input/output vectors, [COLS] each, alternating */
    const uint4 *w;         /* weights, [w_slices * w_per_step] 16-byte units */
    size_t w_per_step;      /* 16-byte units a step reads */
    int w_slices;           /* slices before the weights wrap around */
    unsigned *bar_count;    /* grid barrier (persistent kernel) */
    unsigned *bar_gen;
};

/* Weight loads issued before the wait (they do not depend on the previous step), summed after. */
struct prefetch {
    uint4 v[4];
    __device__ void issue(const chain_args &a, int step)
    {
        const size_t base = (size_t)(step % a.w_slices) * a.w_per_step;
        const size_t per_block = (a.w_per_step + gridDim.x - 1) / gridDim.x;
        for (int k = 0; k < 4; k++) {
            const size_t i = blockIdx.x * per_block + k * THREADS + threadIdx.x;
            v[k] = k * THREADS + threadIdx.x < per_block && i < a.w_per_step ? a.w[base + i] : make_uint4(0, 0, 0, 0);
        }
    }
    /* The rest of this block's share, then everything folded into one word. */
    __device__ unsigned finish(const chain_args &a, int step)
    {
        const size_t base = (size_t)(step % a.w_slices) * a.w_per_step;
        const size_t per_block = (a.w_per_step + gridDim.x - 1) / gridDim.x;
        unsigned acc = 0;
        for (int k = 0; k < 4; k++)
            acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
        for (size_t j = 4 * THREADS + threadIdx.x; j < per_block; j += THREADS) {
            const size_t i = blockIdx.x * per_block + j;
            if (i < a.w_per_step) {
                const uint4 u = a.w[base + i];
                acc ^= u.x ^ u.y ^ u.z ^ u.w;
            }
        }
        return acc;
    }
};

/* One step's work after the wait: stage buf[step & 1] normalised, write this block's slice of the other. */
template <int MODE> __device__ void step_body(const chain_args &a, int step, prefetch &pf, float *xs)
{
    const float *x = a.buf[step & 1];
    float *y = a.buf[(step + 1) & 1];
    if (MODE == EMPTY) {
        if (blockIdx.x == 0 && threadIdx.x == 0)
            y[0] = __ldcg(x) + 1.0f;
        return;
    }
    /* Through L2 (__ldcg): the persistent kernel's blocks would otherwise
     * find the vector of two steps ago in their L1, which is not coherent. */
    float ss = 0.0f;
    for (int j = threadIdx.x; j < COLS / 4; j += THREADS) {
        const float4 v = __ldcg(reinterpret_cast<const float4 *>(x) + j);
        ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    const float inv = rsqrtf(block_sum(ss) / COLS + 1e-5f);
    for (int j = threadIdx.x; j < COLS; j += THREADS)
        xs[j] = __ldcg(x + j) * inv;
    __syncthreads();
    unsigned acc = MODE == WEIGHTS ? pf.finish(a, step) : 0u;
    /* Each block writes a slice, so the next step depends on every block. */
    const int per = (COLS + gridDim.x - 1) / gridDim.x;
    for (int j = threadIdx.x; j < per; j += THREADS) {
        const int c = blockIdx.x * per + j;
        if (c < COLS)
            y[c] = xs[c] * 0.999f + (acc == 0x9e3779b9u ? 1.0f : 0.0f);
    }
}

template <int MODE, bool PDL> __global__ void __launch_bounds__(THREADS) k_step(chain_args a, int step)
{
    __shared__ float xs[COLS];
    prefetch pf;
    if (MODE == WEIGHTS)
        pf.issue(a, step);
    if (PDL) {
        dependents_may_launch(); /* the next step may start its own prefetch */
        dependency_wait();
    }
    step_body<MODE>(a, step, pf, xs);
}

/* All blocks meet; the last to arrive starts the next generation. */
__device__ void grid_barrier(const chain_args &a)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        volatile unsigned *gen = a.bar_gen;
        const unsigned g = *gen;
        __threadfence();
        if (atomicAdd(a.bar_count, 1u) == gridDim.x - 1) {
            *a.bar_count = 0;
            __threadfence();
            atomicAdd(a.bar_gen, 1u);
        } else {
            while (*gen == g)
                ;
        }
        __threadfence();
    }
    __syncthreads();
}

template <int MODE> __global__ void __launch_bounds__(THREADS) k_persistent(chain_args a, int steps)
{
    __shared__ float xs[COLS];
    for (int s = 0; s < steps; s++) {
        prefetch pf;
        if (MODE == WEIGHTS)
            pf.issue(a, s); /* before the barrier, as a persistent decode kernel would */
        if (s > 0)
            grid_barrier(a);
        step_body<MODE>(a, s, pf, xs);
    }
}

template <int MODE, bool PDL> static void launch_step(const chain_args &a, int blocks, int step, cudaStream_t st)
{
    if (PDL)
        CHECK_CUDA(launch_pdl(k_step<MODE, true>, dim3(blocks), dim3(THREADS), 0, st, a, step));
    else
        k_step<MODE, false><<<blocks, THREADS, 0, st>>>(a, step);
    CHECK_CUDA(cudaGetLastError());
}

/* Median µs per step of a graph built by `build`, 5 timed replays after one warm-up. */
template <typename F> static double time_graph(cudaStream_t st, int steps, F build)
{
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CHECK_CUDA(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    build();
    CHECK_CUDA(cudaStreamEndCapture(st, &g));
    CHECK_CUDA(cudaGraphInstantiate(&ge, g, 0));
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    CHECK_CUDA(cudaGraphLaunch(ge, st));
    std::vector<float> ms;
    for (int r = 0; r < 5; r++) {
        CHECK_CUDA(cudaEventRecord(e0, st));
        CHECK_CUDA(cudaGraphLaunch(ge, st));
        CHECK_CUDA(cudaEventRecord(e1, st));
        CHECK_CUDA(cudaEventSynchronize(e1));
        float t = 0;
        CHECK_CUDA(cudaEventElapsedTime(&t, e0, e1));
        ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    CHECK_CUDA(cudaEventDestroy(e0));
    CHECK_CUDA(cudaEventDestroy(e1));
    CHECK_CUDA(cudaGraphExecDestroy(ge));
    CHECK_CUDA(cudaGraphDestroy(g));
    return ms[ms.size() / 2] * 1000.0 / steps;
}

template <int MODE> static void run_mode(const char *name, const chain_args &a, int blocks, int coop_blocks, int steps,
                                         cudaStream_t st)
{
    const double pdl = time_graph(st, steps, [&] {
        for (int s = 0; s < steps; s++)
            launch_step<MODE, true>(a, blocks, s, st);
    });
    const double plain = time_graph(st, steps, [&] {
        for (int s = 0; s < steps; s++)
            launch_step<MODE, false>(a, blocks, s, st);
    });
    /* One launch runs every step (no graph needed): median of 5 after a warm-up. */
    chain_args b = a;
    int n = steps;
    void *args[] = {&b, &n};
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    std::vector<float> ms;
    for (int r = 0; r < 6; r++) {
        CHECK_CUDA(cudaEventRecord(e0, st));
        CHECK_CUDA(cudaLaunchCooperativeKernel((void *)k_persistent<MODE>, dim3(coop_blocks), dim3(THREADS), args, 0, st));
        CHECK_CUDA(cudaEventRecord(e1, st));
        CHECK_CUDA(cudaEventSynchronize(e1));
        float t = 0;
        CHECK_CUDA(cudaEventElapsedTime(&t, e0, e1));
        if (r > 0)
            ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    CHECK_CUDA(cudaEventDestroy(e0));
    CHECK_CUDA(cudaEventDestroy(e1));
    const double pers = ms[ms.size() / 2] * 1000.0 / steps;
    std::printf("%-8s  PDL %6.2f µs a step   plain %6.2f   persistent (grid barrier) %6.2f\n", name, pdl, plain, pers);
}

int main(int argc, char **argv)
{
    int steps = 1000;
    double wbytes = 9.5e6;
    for (int i = 1; i < argc; i++) {
        if (!std::strcmp(argv[i], "--steps") && i + 1 < argc)
            steps = std::atoi(argv[++i]);
        else if (!std::strcmp(argv[i], "--weights") && i + 1 < argc)
            wbytes = std::atof(argv[++i]);
        else {
            std::fprintf(stderr, "usage: kchain [--steps N] [--weights BYTES]\n");
            return 2;
        }
    }
    if (steps < 2 || wbytes < 16) {
        std::fprintf(stderr, "kchain: --steps must be at least 2 and --weights at least 16\n");
        return 2;
    }
    cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    int per_sm = 0;
    CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k_persistent<WEIGHTS>, THREADS, 0));
    const int blocks = 2 * prop.multiProcessorCount, coop = std::min(per_sm, 2) * prop.multiProcessorCount;

    chain_args a = {};
    a.w_per_step = (size_t)(wbytes / 16);
    a.w_slices = (int)std::max<double>(1.0, 2e9 / (a.w_per_step * 16.0)); /* ~2 GB of weights: no L2 reuse */
    CHECK_CUDA(cudaMalloc(&a.buf[0], COLS * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&a.buf[1], COLS * sizeof(float)));
    CHECK_CUDA(cudaMalloc((void **)&a.w, a.w_per_step * a.w_slices * 16));
    CHECK_CUDA(cudaMemset((void *)a.w, 1, a.w_per_step * a.w_slices * 16));
    std::vector<float> ones(COLS, 1.0f);
    CHECK_CUDA(cudaMemcpy(a.buf[0], ones.data(), COLS * sizeof(float), cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMalloc(&a.bar_count, 2 * sizeof(unsigned)));
    CHECK_CUDA(cudaMemset(a.bar_count, 0, 2 * sizeof(unsigned)));
    a.bar_gen = a.bar_count + 1;
    cudaStream_t st;
    CHECK_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));

    std::printf("kchain: %s, %d SMs; %d blocks of %d threads (persistent: %d); %d steps; weights %.2f MB a step\n",
                prop.name, prop.multiProcessorCount, blocks, THREADS, coop, steps, a.w_per_step * 16 / 1e6);
    run_mode<EMPTY>("empty", a, blocks, coop, steps, st);
    run_mode<STAGE>("stage", a, blocks, coop, steps, st);
    run_mode<WEIGHTS>("weights", a, blocks, coop, steps, st);
    std::printf("(weights alone at the HBM bound: %.2f µs a step at 3,076 GB/s)\n", a.w_per_step * 16 / 3076e3);
    return 0;
}
