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
 * (d) `bulk`: the weights step with one block an SM, its share of the
 * weights coming through the bulk copy engine into a ring of --ring KB of
 * shared memory, every slot's copy issued before the wait (so up to
 * 132 x ring bytes are in flight while the previous step runs); --carveout
 * asks for that shared-memory carveout (100: the next step's block fits
 * beside this one), --trace stamps each step's first start, first return
 * from the wait, last block done staging and last end (%globaltimer) for
 * steps 100-105 of one more replay. bench/RESULTS.md (2026-11-25) has what
 * it found: the input's reads after the wait queue behind the weights in
 * flight, so a deeper prefetch lengthens the staging by as much as it saves.
 *
 * The counter variants: (a) with the wait on a counter the previous step's
 * blocks post instead of griddepcontrol.wait, and (c) with that counter as
 * the barrier instead of grid_barrier's two round trips.
 *
 *   kchain [--steps N] [--weights BYTES] [--ring KB] [--carveout PCT] [--trace]
 *   (defaults 1000 steps, 9.5e6 bytes: an 8B nf4 o-projection; ring 64)
 */
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "../kernels/cuda/common.cuh" /* block_sum, the PDL wait/trigger and launch */

/* A programmatic dependent launch on st (this benchmark measures that path, which needs sm_90). */
template <typename... P, typename... A>
static cudaError_t launch_dependent(cudaStream_t st, void (*kern)(P...), dim3 grid, dim3 block, size_t smem, A... args)
{
    launch_ctx lc = {};
    lc.stream = st;
    lc.fast[K_OP_PDL] = true;
    return launch_pdl(&lc, kern, grid, block, smem, args...);
}

#define CHECK_CUDA(x)                                                                  \
    do {                                                                               \
        cudaError_t e_ = (x);                                                          \
        if (e_ != cudaSuccess) {                                                       \
            std::fprintf(stderr, "kchain: %s: %s\n", #x, cudaGetErrorString(e_));      \
            std::exit(1);                                                              \
        }                                                                              \
    } while (0)

/*
 * Dependencies through a counter in global memory instead of the grid's
 * completion: every block of a step adds 1 when its outputs are written
 * (counter_post, a release), and the next step waits until the count
 * reaches the block count (counter_wait), without waiting for the step's
 * grid to retire and flush. Measured slower than PDL's wait, both between
 * kernels and as a persistent kernel's barrier (bench/RESULTS.md,
 * 2026-11-26).
 */
__device__ __forceinline__ unsigned ld_relaxed(const unsigned *p)
{
    unsigned v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

/* Called by every thread; thread 0 polls (relaxed, then one acquire fence), the block follows. */
__device__ __forceinline__ void counter_wait(const unsigned *ctr, unsigned target)
{
    if (threadIdx.x == 0) {
        while (ld_relaxed(ctr) < target)
            ;
        asm volatile("fence.acq_rel.gpu;" ::: "memory");
    }
    __syncthreads();
}

/* Called by every thread of the block once its global writes are done. */
__device__ __forceinline__ void counter_post(unsigned *ctr)
{
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0)
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(ctr) : "memory");
}

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
    unsigned *ctr;          /* [steps] counters (counter modes), zero before each replay */
    unsigned long long *trace; /* bulk, optional: [steps][4] first start, first wait done, last stage done, last end */
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

/* The step's input x, RMS-normalised, into xs[COLS] (its block reduction's barriers publish it to all but the
 * last pass; the caller's barrier follows). Through L2 (__ldcg): the persistent kernel's blocks would otherwise
 * find the vector of two steps ago in their L1, which is not coherent. */
__device__ void stage(float *xs, const float *x)
{
    float ss = 0.0f;
    for (int j = threadIdx.x; j < COLS / 4; j += THREADS) {
        const float4 v = __ldcg(reinterpret_cast<const float4 *>(x) + j);
        ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    const float inv = rsqrtf(block_sum(ss) / COLS + 1e-5f);
    for (int j = threadIdx.x; j < COLS; j += THREADS)
        xs[j] = __ldcg(x + j) * inv;
}

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
    stage(xs, x);
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

/* SYNC: 0 plain launches, 1 PDL, 2 PDL launches with the wait on the previous step's counter (counter_wait). */
template <int MODE, int SYNC> __global__ void __launch_bounds__(THREADS) k_step(chain_args a, int step)
{
    __shared__ float xs[COLS];
    prefetch pf;
    if (MODE == WEIGHTS)
        pf.issue(a, step);
    if (SYNC > 0)
        dependents_may_launch(); /* the next step may start its own prefetch */
    if (SYNC == 1)
        dependency_wait();
    if (SYNC == 2 && step > 0)
        counter_wait(a.ctr + step - 1, gridDim.x);
    step_body<MODE>(a, step, pf, xs);
    if (SYNC == 2)
        counter_post(a.ctr + step);
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

/* CTR: the barrier is one counter a step (counter_post / counter_wait), not grid_barrier's two round trips. */
template <int MODE, bool CTR> __global__ void __launch_bounds__(THREADS) k_persistent(chain_args a, int steps)
{
    __shared__ float xs[COLS];
    for (int s = 0; s < steps; s++) {
        prefetch pf;
        if (MODE == WEIGHTS)
            pf.issue(a, s); /* before the barrier, as a persistent decode kernel would */
        if (s > 0 && CTR)
            counter_wait(a.ctr + s - 1, gridDim.x);
        else if (s > 0)
            grid_barrier(a);
        step_body<MODE>(a, s, pf, xs);
        if (CTR)
            counter_post(a.ctr + s);
    }
}

/* ---- (d) weights through the bulk copy engine into a shared-memory ring ---- */

__device__ __forceinline__ void bar_init(uint64_t *bar, unsigned count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count));
}

/* Copy `bytes` (a multiple of 16, both ends 16-byte aligned) to shared memory; `bar` completes when they land. */
__device__ __forceinline__ void bulk_load(void *dst, const void *src, unsigned bytes, uint64_t *bar)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_addr(dst)),
                 "l"(src), "r"(bytes), "r"(smem_addr(bar))
                 : "memory");
}

#define BULK_STAGE 16384
#define BULK_MAX_STAGES 16

/*
 * One block an SM; its share of the step's weights is contiguous and comes
 * in BULK_STAGE pieces through a ring of `nst` slots, every slot's copy
 * issued before the wait, so a block has its whole ring in flight while
 * the previous step still runs (the ring is small enough for the next
 * step's block to sit beside this one).
 */
__device__ __forceinline__ unsigned long long gtime()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}

__global__ void __launch_bounds__(THREADS) k_bulk(chain_args a, int step, int nst)
{
    unsigned long long *tr = a.trace ? a.trace + 4 * (size_t)step : nullptr;
    if (tr && threadIdx.x == 0)
        atomicMin(&tr[0], gtime());
    extern __shared__ __align__(128) unsigned char sm[];
    uint64_t *bars = reinterpret_cast<uint64_t *>(sm);
    float *xs = reinterpret_cast<float *>(sm + 128);
    unsigned char *ring = sm + 128 + COLS * sizeof(float);
    const size_t units = (a.w_per_step + gridDim.x - 1) / gridDim.x; /* 16-byte units a block */
    const size_t first = blockIdx.x * units;
    const size_t mine = first >= a.w_per_step ? 0 : (first + units > a.w_per_step ? a.w_per_step - first : units);
    const unsigned char *src = reinterpret_cast<const unsigned char *>(a.w + (size_t)(step % a.w_slices) * a.w_per_step + first);
    const size_t bytes = mine * 16;
    const int pieces = (int)((bytes + BULK_STAGE - 1) / BULK_STAGE);
    auto piece = [&](int k) { return (unsigned)(k + 1 == pieces ? bytes - (size_t)k * BULK_STAGE : BULK_STAGE); };
    if (threadIdx.x == 0) {
        for (int s = 0; s < nst; s++)
            bar_init(&bars[s], 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        for (int k = 0; k < pieces && k < nst; k++)
            bulk_load(ring + k * BULK_STAGE, src + (size_t)k * BULK_STAGE, piece(k), &bars[k]);
    }
    dependents_may_launch();
    dependency_wait();
    if (tr && threadIdx.x == 0)
        atomicMin(&tr[1], gtime());
    const float *x = a.buf[step & 1];
    float *y = a.buf[(step + 1) & 1];
    stage(xs, x);
    unsigned acc = 0;
    if (tr && threadIdx.x == 0)
        atomicMax(&tr[2], gtime());
    for (int k = 0; k < pieces; k++) {
        const int s = k % nst;
        mbar_wait(&bars[s], (unsigned)(k / nst) & 1u);
        const uint4 *p = reinterpret_cast<const uint4 *>(ring + s * BULK_STAGE);
        for (unsigned j = threadIdx.x; j < piece(k) / 16; j += THREADS) {
            const uint4 u = p[j];
            acc ^= u.x ^ u.y ^ u.z ^ u.w;
        }
        __syncthreads(); /* the slot is read: refill it */
        if (threadIdx.x == 0 && k + nst < pieces)
            bulk_load(ring + s * BULK_STAGE, src + (size_t)(k + nst) * BULK_STAGE, piece(k + nst), &bars[s]);
    }
    const int per = (COLS + gridDim.x - 1) / gridDim.x;
    for (int j = threadIdx.x; j < per; j += THREADS) {
        const int c = blockIdx.x * per + j;
        if (c < COLS)
            y[c] = xs[c] * 0.999f + (acc == 0x9e3779b9u ? 1.0f : 0.0f);
    }
    if (tr && threadIdx.x == 0)
        atomicMax(&tr[3], gtime());
}

template <int MODE, int SYNC> static void launch_step(const chain_args &a, int blocks, int step, cudaStream_t st)
{
    if (SYNC > 0)
        CHECK_CUDA(launch_dependent(st, k_step<MODE, SYNC>, dim3(blocks), dim3(THREADS), 0, a, step));
    else
        k_step<MODE, 0><<<blocks, THREADS, 0, st>>>(a, step);
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
    const size_t cbytes = (size_t)steps * sizeof(unsigned);
    const double pdl = time_graph(st, steps, [&] {
        for (int s = 0; s < steps; s++)
            launch_step<MODE, 1>(a, blocks, s, st);
    });
    const double plain = time_graph(st, steps, [&] {
        for (int s = 0; s < steps; s++)
            launch_step<MODE, 0>(a, blocks, s, st);
    });
    const double ctr = time_graph(st, steps, [&] {
        CHECK_CUDA(cudaMemsetAsync(a.ctr, 0, cbytes, st));
        for (int s = 0; s < steps; s++)
            launch_step<MODE, 2>(a, blocks, s, st);
    });
    /* One launch runs every step (no graph needed): median of 5 after a warm-up. */
    double pers[2];
    for (int v = 0; v < 2; v++) {
        chain_args b = a;
        int n = steps;
        void *args[] = {&b, &n};
        void *kern = v ? (void *)k_persistent<MODE, true> : (void *)k_persistent<MODE, false>;
        cudaEvent_t e0, e1;
        CHECK_CUDA(cudaEventCreate(&e0));
        CHECK_CUDA(cudaEventCreate(&e1));
        std::vector<float> ms;
        for (int r = 0; r < 6; r++) {
            CHECK_CUDA(cudaMemsetAsync(a.ctr, 0, cbytes, st));
            CHECK_CUDA(cudaEventRecord(e0, st));
            CHECK_CUDA(cudaLaunchCooperativeKernel(kern, dim3(coop_blocks), dim3(THREADS), args, 0, st));
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
        pers[v] = ms[ms.size() / 2] * 1000.0 / steps;
    }
    std::printf("%-8s  PDL %6.2f µs a step   plain %6.2f   PDL + counter wait %6.2f   persistent: grid barrier %6.2f, "
                "counters %6.2f\n",
                name, pdl, plain, ctr, pers[0], pers[1]);
}

static void run_bulk(const chain_args &a, int blocks, int nst, int steps, int carveout, bool trace, cudaStream_t st)
{
    const size_t smem = 128 + COLS * sizeof(float) + (size_t)nst * BULK_STAGE;
    CHECK_CUDA(cudaFuncSetAttribute(k_bulk, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    /* Every SM at its largest shared memory, so that the next step's block fits beside this one's. */
    if (carveout >= 0)
        CHECK_CUDA(cudaFuncSetAttribute(k_bulk, cudaFuncAttributePreferredSharedMemoryCarveout, carveout));
    int per_sm = 0;
    CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k_bulk, THREADS, smem));
    std::printf("bulk: %d blocks an SM fit\n", per_sm);
    const double pdl = time_graph(st, steps, [&] {
        for (int s = 0; s < steps; s++) {
            CHECK_CUDA(launch_dependent(st, k_bulk, dim3(blocks), dim3(THREADS), smem, a, s, nst));
            CHECK_CUDA(cudaGetLastError());
        }
    });
    if (trace) { /* one more replay, each step stamped */
        chain_args b = a;
        std::vector<unsigned long long> h(4 * (size_t)steps);
        for (size_t i = 0; i < h.size(); i++)
            h[i] = i % 4 < 2 ? ~0ull : 0ull;
        CHECK_CUDA(cudaMalloc(&b.trace, h.size() * 8));
        CHECK_CUDA(cudaMemcpy(b.trace, h.data(), h.size() * 8, cudaMemcpyHostToDevice));
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CHECK_CUDA(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        for (int s = 0; s < steps; s++)
            CHECK_CUDA(launch_dependent(st, k_bulk, dim3(blocks), dim3(THREADS), smem, b, s, nst));
        CHECK_CUDA(cudaStreamEndCapture(st, &g));
        CHECK_CUDA(cudaGraphInstantiate(&ge, g, 0));
        CHECK_CUDA(cudaGraphLaunch(ge, st)); /* warm-up, then stamped from fresh values */
        CHECK_CUDA(cudaStreamSynchronize(st));
        CHECK_CUDA(cudaMemcpy(b.trace, h.data(), h.size() * 8, cudaMemcpyHostToDevice));
        CHECK_CUDA(cudaGraphLaunch(ge, st));
        CHECK_CUDA(cudaStreamSynchronize(st));

        CHECK_CUDA(cudaMemcpy(h.data(), b.trace, h.size() * 8, cudaMemcpyDeviceToHost));
        std::printf("trace (ns from step 100's first start): step: first block's start, first wait done, last block staged, last end\n");
        const unsigned long long t0 = h[4 * 100];
        for (int s = 100; s < 106 && s < steps; s++)
            std::printf("  %d: %lld %lld %lld %lld\n", s, (long long)(h[4 * s] - t0), (long long)(h[4 * s + 1] - t0),
                        (long long)(h[4 * s + 2] - t0), (long long)(h[4 * s + 3] - t0));
        CHECK_CUDA(cudaFree(b.trace));
    }
    std::printf("bulk      PDL %6.2f µs a step   (%d blocks, ring %d KB: %.1f MB in flight before the wait)\n", pdl,
                blocks, nst * BULK_STAGE / 1024, blocks * (double)nst * BULK_STAGE / 1e6);
}

int main(int argc, char **argv)
{
    int steps = 1000;
    double wbytes = 9.5e6;
    int ring_kb = 64, carveout = -1;
    bool trace = false;
    for (int i = 1; i < argc; i++) {
        if (!std::strcmp(argv[i], "--steps") && i + 1 < argc)
            steps = std::atoi(argv[++i]);
        else if (!std::strcmp(argv[i], "--weights") && i + 1 < argc)
            wbytes = std::atof(argv[++i]);
        else if (!std::strcmp(argv[i], "--carveout") && i + 1 < argc)
            carveout = std::atoi(argv[++i]);
        else if (!std::strcmp(argv[i], "--trace"))
            trace = true;
        else if (!std::strcmp(argv[i], "--ring") && i + 1 < argc)
            ring_kb = std::atoi(argv[++i]);
        else {
            std::fprintf(stderr, "usage: kchain [--steps N] [--weights BYTES] [--ring KB] [--carveout PCT] [--trace]\n");
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
    CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k_persistent<WEIGHTS, false>, THREADS, 0));
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
    CHECK_CUDA(cudaMalloc(&a.ctr, (size_t)steps * sizeof(unsigned)));
    cudaStream_t st;
    CHECK_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));

    std::printf("kchain: %s, %d SMs; %d blocks of %d threads (persistent: %d); %d steps; weights %.2f MB a step\n",
                prop.name, prop.multiProcessorCount, blocks, THREADS, coop, steps, a.w_per_step * 16 / 1e6);
    run_mode<EMPTY>("empty", a, blocks, coop, steps, st);
    run_mode<STAGE>("stage", a, blocks, coop, steps, st);
    run_mode<WEIGHTS>("weights", a, blocks, coop, steps, st);
    run_bulk(a, prop.multiProcessorCount, std::max(1, std::min(ring_kb * 1024 / BULK_STAGE, BULK_MAX_STAGES)), steps, carveout, trace, st);
    std::printf("(weights alone at the HBM bound: %.2f µs a step at 3,076 GB/s)\n", a.w_per_step * 16 / 3076e3);
    return 0;
}
