/*
 * argmax.cu: the greedy choice on the device, so decode copies 4 bytes to
 * the host instead of the logits. One block; ties go to the lowest index,
 * as the CPU sampler's.
 */
#include "common.cuh"

#define ARGMAX_THREADS 1024

__global__ void k_argmax(int32_t *out, const float *x, int n)
{
    __shared__ float best_v[ARGMAX_THREADS / 32];
    __shared__ int best_i[ARGMAX_THREADS / 32];
    float v = -INFINITY;
    int idx = 0x7fffffff;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        if (x[i] > v) { /* strictly greater: the first (lowest) index of a thread's equals wins */
            v = x[i];
            idx = i;
        }
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, o);
        const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
        if (ov > v || (ov == v && oi < idx)) {
            v = ov;
            idx = oi;
        }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        best_v[warp] = v;
        best_i[warp] = idx;
    }
    __syncthreads();
    if (warp == 0) {
        v = lane < (int)(blockDim.x >> 5) ? best_v[lane] : -INFINITY;
        idx = lane < (int)(blockDim.x >> 5) ? best_i[lane] : 0x7fffffff;
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, v, o);
            const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
            if (ov > v || (ov == v && oi < idx)) {
                v = ov;
                idx = oi;
            }
        }
        if (lane == 0)
            *out = idx == 0x7fffffff ? 0 : idx;
    }
}

extern "C" int launch_argmax(launch_ctx *c, int32_t *out, const float *x, int n)
{
    if (!out || !x || n <= 0)
        return launch_fail(c, "argmax: bad arguments (n %d)", n);
    k_argmax<<<1, ARGMAX_THREADS, 0, c->stream>>>(out, x, n);
    return launch_check(c, "argmax");
}
