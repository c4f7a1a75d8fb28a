/*
 * sample.cu: the part of sampling that reads the whole vocabulary, on the
 * device: the tokens within 50 nats of the best after the temperature (the
 * only ones any filter can keep or a draw can reach, as in the CPU
 * sampler). The host sorts and draws from this short list, so a sampled
 * token costs a few KB over PCIe instead of the logits. The comparison is
 * the CPU sampler's own fp32 expression, so the set is the same.
 */
#include "common.cuh"

#define SAMPLE_THREADS 1024

__global__ void k_sample_candidates(const float *x, int n, float temperature, int cap, int32_t *count, int32_t *ids,
                                    float *vals)
{
    __shared__ float part[SAMPLE_THREADS / 32];
    __shared__ int found;
    float best = -INFINITY;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        best = fmaxf(best, x[i]);
    best = warp_max(best);
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x >> 5] = best;
    if (threadIdx.x == 0)
        found = 0;
    __syncthreads();
    best = -INFINITY;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++)
        best = fmaxf(best, part[w]);
    const float floor = best / temperature - 50.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float l = x[i] / temperature;
        if (l >= floor) {
            const int at = atomicAdd(&found, 1);
            if (at < cap) {
                ids[at] = i;
                vals[at] = l;
            }
        }
    }
    __syncthreads();
    if (threadIdx.x == 0)
        *count = found;
}

extern "C" int launch_sample_candidates(launch_ctx *c, const float *x, int n, float temperature, int cap,
                                        int32_t *count, int32_t *ids, float *vals)
{
    if (!x || !count || !ids || !vals || n <= 0 || cap <= 0 || !(temperature > 0.0f))
        return launch_fail(c, "sample_candidates: bad arguments (n %d, cap %d, temperature %g)", n, cap,
                           (double)temperature);
    k_sample_candidates<<<1, SAMPLE_THREADS, 0, c->stream>>>(x, n, temperature, cap, count, ids, vals);
    return launch_check(c, "sample_candidates");
}
