/*
 * log_softmax.cu: what scoring a text needs of each logits row, so the rows
 * need not leave the device: the log of the sum of exp over the row, and
 * the logit of the token that follows (the row's log-probability of it is
 * their difference). One block per row; each thread keeps a running
 * maximum and the sum scaled to it, as flash attention does, and the
 * block merges the pairs.
 */
#include "common.cuh"

#define LSE_THREADS 256

__global__ void k_row_lse(const float *x, int cols, const int32_t *targets, float *out)
{
    const float *row = x + (size_t)blockIdx.x * cols;
    float m = -INFINITY, s = 0.0f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        const float v = row[i];
        if (v > m) {
            s = s * expf(m - v) + 1.0f;
            m = v;
        } else if (v > -INFINITY) {
            s += expf(v - m);
        }
    }
    /* Merge (m, s) pairs: first the warp, then the warps' results through shared memory. */
    for (int o = 16; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        const float mm = fmaxf(m, m2);
        s = (m == -INFINITY ? 0.0f : s * expf(m - mm)) + (m2 == -INFINITY ? 0.0f : s2 * expf(m2 - mm));
        m = mm;
    }
    __shared__ float pm[32], ps[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0)
        pm[warp] = m, ps[warp] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        float mm = -INFINITY;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++)
            mm = fmaxf(mm, pm[w]);
        float ss = 0.0f;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++)
            if (pm[w] != -INFINITY)
                ss += ps[w] * expf(pm[w] - mm);
        const int t = targets ? targets[blockIdx.x] : -1;
        out[2 * blockIdx.x] = mm + logf(ss);
        out[2 * blockIdx.x + 1] = t >= 0 && t < cols ? row[t] : NAN;
    }
}

extern "C" int launch_row_lse(launch_ctx *c, const float *x, int rows, int cols, const int32_t *targets, float *out)
{
    if (!x || !out || rows <= 0 || cols <= 0)
        return launch_fail(c, "row_lse: bad arguments (rows %d, cols %d)", rows, cols);
    k_row_lse<<<rows, LSE_THREADS, 0, c->stream>>>(x, cols, targets, out);
    return launch_check(c, "row_lse");
}
