/*
 * argmax.cu: the greedy choice on the device, so decode copies 4 bytes to
 * the host instead of the logits. One launch: many blocks each reduce a
 * strided slice to (value, index); the last block to finish (a counter in
 * the scratch) reduces those. (A single block reading a 128K vocabulary
 * took 54 us per token on an H100, more than a 1B model's whole
 * attention; a second kernel for the last reduction cost a kernel
 * boundary.) Ties go to the lowest index, as in the CPU sampler.
 *
 * With a feed, the choice also becomes the next decode step's input on the
 * device: token, position + 1, a two-slot ring the host reads (it may lie
 * in mapped host memory, so no copy follows), and where asked the token's
 * embedding row in x and the input maxima zeroed, so the next step starts
 * with its first product instead of a memset and an embedding kernel.
 * Launched as a programmatic dependent of the kernel that writes the
 * logits (the head product).
 */
#include "common.cuh"

#define ARGMAX_BLOCKS 128
#define ARGMAX_THREADS 512

struct best_t {
    float v;
    int i;
};

__device__ __forceinline__ best_t better(best_t a, best_t b)
{
    return (b.v > a.v || (b.v == a.v && b.i < a.i)) ? b : a;
}

/* The block's best of (v, i) per thread; valid in thread 0. */
__device__ best_t block_best(best_t b)
{
    __shared__ best_t part[32];
    for (int o = 16; o > 0; o >>= 1) {
        best_t other = {__shfl_xor_sync(0xffffffffu, b.v, o), __shfl_xor_sync(0xffffffffu, b.i, o)};
        b = better(b, other);
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0)
        part[warp] = b;
    __syncthreads();
    if (warp == 0) {
        b = lane < (int)(blockDim.x >> 5) ? part[lane] : best_t{-INFINITY, 0x7fffffff};
        for (int o = 16; o > 0; o >>= 1) {
            best_t other = {__shfl_xor_sync(0xffffffffu, b.v, o), __shfl_xor_sync(0xffffffffu, b.i, o)};
            b = better(b, other);
        }
    }
    return b;
}

/* The scratch: each block's best, then the count of blocks done (zero between launches). */
struct argmax_scratch_t {
    best_t partial[ARGMAX_BLOCKS];
    unsigned done;
};

template <typename T>
__global__ void __launch_bounds__(ARGMAX_THREADS) k_argmax(int32_t *out, const float *x, int n, argmax_scratch_t *sc,
                                                            argmax_feed feed)
{
    __shared__ bool last;
    __shared__ int32_t chosen;
    dependency_wait(); /* the logits are the previous kernel's */
    best_t b = {-INFINITY, 0x7fffffff};
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        b = better(b, best_t{x[i], i});
    b = block_best(b);
    if (threadIdx.x == 0) {
        sc->partial[blockIdx.x] = b;
        __threadfence();
        last = atomicAdd(&sc->done, 1u) == gridDim.x - 1;
    }
    __syncthreads(); /* (also ends block_best's reads of its shared array before the second use) */
    if (!last)
        return;
    __threadfence();
    b = best_t{-INFINITY, 0x7fffffff};
    if (threadIdx.x < gridDim.x) { /* other blocks' values: from L2, never a stale L1 line */
        b.v = __ldcg(&sc->partial[threadIdx.x].v);
        b.i = __ldcg(&sc->partial[threadIdx.x].i);
    }
    b = block_best(b);
    if (threadIdx.x == 0) {
        const int32_t best = b.i == 0x7fffffff ? 0 : b.i;
        sc->done = 0;
        *out = best;
        chosen = best;
        if (feed.token) {
            const int32_t pos = *feed.pos;
            feed.ring[pos & 1] = best;
            *feed.token = best;
            *feed.pos = pos + 1;
        }
    }
    if (!feed.token)
        return;
    for (int i = threadIdx.x; i < feed.n_zero; i += blockDim.x)
        feed.zero[i] = 0;
    if (feed.x) {
        __syncthreads();
        embed_row(feed.x, static_cast<const T *>(feed.emb), chosen, feed.dim, feed.emb_mult);
    }
}

extern "C" size_t launch_argmax_scratch(void)
{
    return sizeof(argmax_scratch_t);
}

extern "C" int launch_argmax(launch_ctx *c, int32_t *out, const float *x, int n, void *scratch,
                             const argmax_feed *feed)
{
    argmax_feed none = {};
    if (!feed)
        feed = &none;
    if (!out || !x || !scratch || n <= 0 || (feed->token && (!feed->pos || !feed->ring)) ||
        (feed->x && (!feed->token || !feed->emb || feed->dim <= 0 || !(feed->emb_mult > 0.0f))) || (feed->n_zero > 0 && (!feed->zero || !feed->token)))
        return launch_fail(c, "argmax: bad arguments (n %d)", n);
    const int blocks = (int)(ceil_div(n, ARGMAX_THREADS) < ARGMAX_BLOCKS ? ceil_div(n, ARGMAX_THREADS) : ARGMAX_BLOCKS);
    argmax_scratch_t *sc = static_cast<argmax_scratch_t *>(scratch);
    cudaError_t e = cudaSuccess;
    if (!feed->x)
        e = launch_pdl(c, k_argmax<float>, dim3(blocks), dim3(ARGMAX_THREADS), 0, out, x, n, sc, *feed);
    else
        DISPATCH_TYPE(feed->emb_t, T,
                      e = launch_pdl(c, k_argmax<T>, dim3(blocks), dim3(ARGMAX_THREADS), 0, out, x, n, sc,
                                     *feed));
    if (e != cudaSuccess)
        return launch_fail(c, "argmax: %s", cudaGetErrorString(e));
    return launch_check(c, "argmax");
}
