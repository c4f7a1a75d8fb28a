/*
 * argmax.cu: the greedy choice on the device, so decode copies 4 bytes to
 * the host instead of the logits. Two launches: many blocks each reduce a
 * strided slice to (value, index), then one block reduces those. (A single
 * block reading a 128K vocabulary took 54 us per token on an H100, more
 * than a 1B model's whole attention.) Ties go to the lowest index, as in
 * the CPU sampler.
 *
 * With a feed, the choice also becomes the next decode step's input on the
 * device (token, position + 1, and a two-slot ring the host reads), so the
 * next step can be queued before the host has seen this one's token.
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

__global__ void k_argmax_blocks(best_t *partial, const float *x, int n)
{
    best_t b = {-INFINITY, 0x7fffffff};
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        b = better(b, best_t{x[i], i});
    b = block_best(b);
    if (threadIdx.x == 0)
        partial[blockIdx.x] = b;
}

__global__ void k_argmax_final(int32_t *out, const best_t *partial, int blocks, argmax_feed feed)
{
    best_t b = threadIdx.x < blocks ? partial[threadIdx.x] : best_t{-INFINITY, 0x7fffffff};
    b = block_best(b);
    if (threadIdx.x == 0) {
        const int32_t best = b.i == 0x7fffffff ? 0 : b.i;
        *out = best;
        if (feed.token) {
            const int32_t pos = *feed.pos;
            feed.ring[pos & 1] = best;
            *feed.token = best;
            *feed.pos = pos + 1;
        }
    }
}

extern "C" size_t launch_argmax_scratch(void)
{
    return ARGMAX_BLOCKS * sizeof(best_t);
}

extern "C" int launch_argmax(launch_ctx *c, int32_t *out, const float *x, int n, void *scratch,
                             const argmax_feed *feed)
{
    const argmax_feed none = {NULL, NULL, NULL};
    if (!feed)
        feed = &none;
    if (!out || !x || !scratch || n <= 0 || (feed->token && (!feed->pos || !feed->ring)))
        return launch_fail(c, "argmax: bad arguments (n %d)", n);
    const int blocks = (int)(ceil_div(n, ARGMAX_THREADS) < ARGMAX_BLOCKS ? ceil_div(n, ARGMAX_THREADS) : ARGMAX_BLOCKS);
    best_t *partial = static_cast<best_t *>(scratch);
    k_argmax_blocks<<<blocks, ARGMAX_THREADS, 0, c->stream>>>(partial, x, n);
    k_argmax_final<<<1, ARGMAX_BLOCKS, 0, c->stream>>>(out, partial, blocks, *feed);
    return launch_check(c, "argmax");
}
