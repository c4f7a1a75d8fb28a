/*
 * moe.cu: the small steps of a mixture-of-experts layer around its
 * products (forward_moe.c's, on the device): routing (softmax, top-k,
 * renormalisation), grouping a prompt's (token, choice) slots by expert,
 * gathering the slots' inputs, and the weighted sum back into the residual
 * stream. The products themselves are gemv.cu's (decode: one launch over
 * the chosen experts) and cuBLASLt's (prefill: one per picked expert).
 *
 * Decode runs these inside its CUDA graph, as programmatic dependents
 * (they wait for the kernel before first thing), so nothing here
 * synchronises with the host. The routing and the weighted sum let the
 * kernel after them launch before they wait: its own wait still orders it
 * after them, and its launch (and a dense product's weight loads) overlap.
 */
#include "common.cuh"

#define ROUTE_WARPS 4 /* tokens a block of the routing kernel */
#define PER_LANE (MOE_MAX_EXPERTS / 32)

/* Whether (v, i) ranks above (bv, bi): the larger logit, the lower index on a tie; i < 0 is nothing. */
__device__ __forceinline__ bool ranks_above(float v, int i, float bv, int bi)
{
    return i >= 0 && (bi < 0 || v > bv || (v == bv && i < bi));
}

/*
 * One warp a token. Lane l holds experts l, l + 32, ...; the maximum and
 * the sum of exponentials (in double, as the CPU) are warp reductions, and
 * each of the k choices is the warp's best not yet taken. Lane 0 keeps the
 * weights and renormalises them in choice order, as the CPU does.
 */
__global__ void __launch_bounds__(32 * ROUTE_WARPS)
    k_moe_route(const float *logits, int ld, int n, int E, int k, bool renorm, int32_t *ids, float *w, uint32_t *picks)
{
    dependents_may_launch(); /* the experts' product may launch; its wait still follows this kernel */
    dependency_wait();
    const int lane = threadIdx.x & 31, t = blockIdx.x * ROUTE_WARPS + (threadIdx.x >> 5);
    if (t >= n)
        return;
    const float *row = logits + (size_t)t * ld;
    float v[PER_LANE];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < PER_LANE; i++) {
        const int e = lane + 32 * i;
        float x = e < E ? row[e] : -INFINITY;
        if (x != x)
            x = -INFINITY;
        v[i] = x;
        mx = fmaxf(mx, x);
    }
    for (int o = 16; o > 0; o >>= 1)
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    /* Each exponential once (a double exp is a long sequence, on one warp): the choices take theirs from
     * the lane that holds them. */
    double ev[PER_LANE], sum = 0.0;
#pragma unroll
    for (int i = 0; i < PER_LANE; i++) {
        ev[i] = lane + 32 * i < E ? exp((double)v[i] - (double)mx) : 0.0;
        sum += ev[i];
    }
    for (int o = 16; o > 0; o >>= 1)
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
    unsigned taken = 0; /* bit i: expert lane + 32 i is chosen */
    float wk[MOE_MAX_TOPK];
    for (int j = 0; j < k; j++) {
        float bv = -INFINITY;
        int bi = -1;
#pragma unroll
        for (int i = 0; i < PER_LANE; i++) {
            const int e = lane + 32 * i;
            if (e < E && !(taken >> i & 1u) && ranks_above(v[i], e, bv, bi)) {
                bv = v[i];
                bi = e;
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ranks_above(ov, oi, bv, bi)) {
                bv = ov;
                bi = oi;
            }
        }
        /* k <= E, so some expert is left: bi >= 0 on every lane. */
        if ((bi & 31) == lane)
            taken |= 1u << (bi >> 5);
        double eb = 0.0;
#pragma unroll
        for (int i = 0; i < PER_LANE; i++)
            if (i == bi >> 5)
                eb = ev[i];
        /* transformers' probabilities are fp32 (router_logits.float()). */
        const float p = (float)(__shfl_sync(0xffffffffu, eb, bi & 31) / sum);
#pragma unroll
        for (int q = 0; q < MOE_MAX_TOPK; q++)
            if (q == j)
                wk[q] = p;
        if (lane == 0) {
            ids[(size_t)t * k + j] = bi;
            if (picks)
                atomicAdd(&picks[bi], 1u);
        }
    }
    if (lane != 0)
        return;
    float s = 1.0f;
    if (renorm) {
        s = 0.0f;
#pragma unroll
        for (int q = 0; q < MOE_MAX_TOPK; q++)
            if (q < k)
                s += wk[q];
    }
#pragma unroll
    for (int q = 0; q < MOE_MAX_TOPK; q++)
        if (q < k)
            w[(size_t)t * k + q] = renorm ? wk[q] / s : wk[q];
}

extern "C" int launch_moe_route(launch_ctx *c, const float *logits, int ld, int n, int E, int k, bool renorm,
                                int32_t *ids, float *w, uint32_t *picks)
{
    if (!logits || !ids || !w || n <= 0 || E <= 0 || E > MOE_MAX_EXPERTS || k <= 0 || k > MOE_MAX_TOPK || k > E ||
        ld < E)
        return launch_fail(c, "moe_route: bad arguments (n %d, experts %d, top %d, ld %d)", n, E, k, ld);
    const unsigned blocks = (unsigned)ceil_div(n, ROUTE_WARPS);
    cudaError_t e = launch_pdl(c, k_moe_route, dim3(blocks), dim3(32 * ROUTE_WARPS), 0, logits, ld, n, E, k, renorm,
                               ids, w, picks);
    if (e != cudaSuccess)
        return launch_fail(c, "moe_route: %s", cudaGetErrorString(e));
    return launch_check(c, "moe_route");
}

/*
 * Grouping, in one block: counts (shared atomics: their order does not
 * matter), the groups' starts (one thread: at most MOE_MAX_EXPERTS), then
 * each warp places the slots of its experts in slot order, 32 slots a step
 * through a ballot, so that the rows and their order are the same every
 * time: token order within an expert, as the CPU groups them.
 */
#define GROUP_THREADS 1024
__global__ void __launch_bounds__(GROUP_THREADS)
    k_moe_group(const int32_t *ids, int slots, int k, int E, int pad, int cap, int32_t *first, int32_t *slot_of,
                int32_t *tok_of)
{
    __shared__ int cnt[MOE_MAX_EXPERTS + 1];
    dependency_wait();
    for (int e = threadIdx.x; e <= E; e += blockDim.x)
        cnt[e] = 0;
    for (int r = threadIdx.x; r < cap; r += blockDim.x)
        tok_of[r] = -1;
    __syncthreads();
    for (int s = threadIdx.x; s < slots; s += blockDim.x) {
        const int e = ids[s];
        if (e >= 0 && e < E)
            atomicAdd(&cnt[e], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) { /* counts to padded starts, in place */
        int at = 0;
        for (int e = 0; e < E; e++) {
            const int c = cnt[e];
            first[E + 1 + e] = c;
            cnt[e] = at;
            at += (c + pad - 1) / pad * pad;
        }
        cnt[E] = at;
    }
    __syncthreads();
    for (int e = threadIdx.x; e <= E; e += blockDim.x)
        first[e] = cnt[e];
    const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    for (int e = threadIdx.x >> 5; e < E; e += warps) {
        int at = cnt[e];
        for (int s0 = 0; s0 < slots; s0 += 32) {
            const int s = s0 + lane;
            const bool mine = s < slots && ids[s] == e;
            const unsigned b = __ballot_sync(0xffffffffu, mine);
            if (mine) {
                const int r = at + __popc(b & ((1u << lane) - 1u));
                slot_of[s] = r;
                tok_of[r] = s / k;
            }
            at += __popc(b);
        }
    }
}

extern "C" int launch_moe_group(launch_ctx *c, const int32_t *ids, int n, int k, int E, int pad, int cap,
                                int32_t *first, int32_t *slot_of, int32_t *tok_of)
{
    const long slots = (long)n * k;
    if (!ids || !first || !slot_of || !tok_of || n <= 0 || k <= 0 || E <= 0 || E > MOE_MAX_EXPERTS || pad <= 0 ||
        (pad & (pad - 1)) || slots > INT32_MAX || cap < slots + (long)E * (pad - 1))
        return launch_fail(c, "moe_group: bad arguments (n %d, top %d, experts %d, pad %d, cap %d)", n, k, E, pad,
                           cap);
    cudaError_t e = launch_pdl(c, k_moe_group, dim3(1), dim3(GROUP_THREADS), 0, ids, (int)slots, k, E, pad, cap,
                               first, slot_of, tok_of);
    if (e != cudaSuccess)
        return launch_fail(c, "moe_group: %s", cudaGetErrorString(e));
    return launch_check(c, "moe_group");
}

/* A block a row; 16 bytes a thread where the rows allow it. */
template <typename T>
__global__ void k_moe_gather(T *out, const T *in, const int32_t *tok_of, int dim)
{
    dependency_wait();
    const int r = blockIdx.x, t = tok_of[r];
    T *o = out + (size_t)r * dim;
    const T *x = t >= 0 ? in + (size_t)t * dim : NULL;
    constexpr int V = 16 / sizeof(T);
    if (dim % V == 0 && (uintptr_t)out % 16 == 0 && (uintptr_t)in % 16 == 0) {
        for (int g = threadIdx.x; g < dim / V; g += blockDim.x)
            reinterpret_cast<uint4 *>(o)[g] = x ? __ldg(reinterpret_cast<const uint4 *>(x) + g) : make_uint4(0, 0, 0, 0);
    } else {
        for (int i = threadIdx.x; i < dim; i += blockDim.x)
            o[i] = x ? x[i] : from_f32<T>(0.0f);
    }
}

extern "C" int launch_moe_gather(launch_ctx *c, void *out, const void *in, k_dtype t, const int32_t *tok_of,
                                 int rows, int dim)
{
    if (!out || !in || !tok_of || rows <= 0 || dim <= 0)
        return launch_fail(c, "moe_gather: bad arguments (rows %d, dim %d)", rows, dim);
    cudaError_t e = cudaSuccess;
    DISPATCH_TYPE(t, T, {
        e = launch_pdl(c, k_moe_gather<T>, dim3((unsigned)rows), dim3(128), 0, static_cast<T *>(out),
                       static_cast<const T *>(in), tok_of, dim);
    });
    if (e != cudaSuccess)
        return launch_fail(c, "moe_gather: %s", cudaGetErrorString(e));
    return launch_check(c, "moe_gather");
}

/* A row of blocks a token, a thread a column: the sum in the CPU's order, each step rounded as its own. */
__global__ void k_moe_combine(float *x, float *dst, const float *ys, const int32_t *slot_of, const float *w, int k,
                              int dim, const float *sh, const float *gate, int gate_ld)
{
    dependents_may_launch(); /* the next layer's product may start loading its weights */
    dependency_wait();
    const int t = blockIdx.x;
    const float g = sh ? 1.0f / (1.0f + expf(-gate[(size_t)t * gate_ld])) : 0.0f;
    for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < dim; i += gridDim.y * blockDim.x) {
        float o = sh ? __fmul_rn(sh[(size_t)t * dim + i], g) : 0.0f;
        for (int j = 0; j < k; j++) {
            const int slot = slot_of ? slot_of[(size_t)t * k + j] : t * k + j;
            o = __fadd_rn(o, __fmul_rn(w[(size_t)t * k + j], ys[(size_t)slot * dim + i]));
        }
        if (dst)
            dst[(size_t)t * dim + i] = o;
        else
            x[(size_t)t * dim + i] += o;
    }
}

extern "C" int launch_moe_combine(launch_ctx *c, float *x, float *dst, const float *ys, const int32_t *slot_of,
                                  const float *w, int n, int k, int dim, const float *sh, const float *gate,
                                  int gate_ld)
{
    if ((!x && !dst) || !ys || !w || n <= 0 || k <= 0 || dim <= 0 || (sh && (!gate || gate_ld <= 0)))
        return launch_fail(c, "moe_combine: bad arguments (n %d, top %d, dim %d)", n, k, dim);
    /* A token's columns over several blocks: one block alone took about 7 us of a decode layer (ncu, H200). */
    const int threads = dim < 256 ? (dim + 31) / 32 * 32 : 256, col_blocks = n < 8 ? ceil_div(dim, threads) : 1;
    cudaError_t e = launch_pdl(c, k_moe_combine, dim3((unsigned)n, (unsigned)col_blocks), dim3((unsigned)threads), 0, x,
                               dst, ys, slot_of, w, k, dim, sh, gate, gate_ld);
    if (e != cudaSuccess)
        return launch_fail(c, "moe_combine: %s", cudaGetErrorString(e));
    return launch_check(c, "moe_combine");
}

/*
 * A split expert layer's vectors across PCIe (mapped pinned memory, as
 * copy.cu moves a hosted layer's): to the host, the MLP input x and the
 * choices; back, the host-computed outputs of the choices whose expert is
 * not on the device. Launched plainly: the host node between them orders
 * them, and what follows waits for them as for any kernel before.
 */
__global__ void k_moe_to_host(float *hx, int32_t *hids, const float *x, const int32_t *ids, int k, int dim)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < dim; i += gridDim.x * blockDim.x)
        hx[i] = x[i];
    if (blockIdx.x == 0 && threadIdx.x < k)
        hids[threadIdx.x] = ids[threadIdx.x];
}

__global__ void k_moe_from_host(float *ys, const float *hys, const int32_t *ids, int k, int from, int dim)
{
    const int j = blockIdx.y;
    if (j >= k || ids[j] < from)
        return;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < dim; i += gridDim.x * blockDim.x)
        ys[(size_t)j * dim + i] = hys[(size_t)j * dim + i];
}

extern "C" int launch_moe_to_host(launch_ctx *c, float *hx, int32_t *hids, const float *x, const int32_t *ids, int k,
                                  int dim)
{
    if (!hx || !hids || !x || !ids || k <= 0 || k > MOE_MAX_TOPK || dim <= 0)
        return launch_fail(c, "moe_to_host: bad arguments (top %d, dim %d)", k, dim);
    const unsigned blocks = ceil_div(dim, 256) < 16 ? ceil_div(dim, 256) : 16;
    k_moe_to_host<<<blocks, 256, 0, c->stream>>>(hx, hids, x, ids, k, dim);
    return launch_check(c, "moe_to_host");
}

extern "C" int launch_moe_from_host(launch_ctx *c, float *ys, const float *hys, const int32_t *ids, int k, int from,
                                    int dim)
{
    if (!ys || !hys || !ids || k <= 0 || k > MOE_MAX_TOPK || dim <= 0 || from < 0)
        return launch_fail(c, "moe_from_host: bad arguments (top %d, dim %d, from %d)", k, dim, from);
    const unsigned bx = ceil_div(dim, 256) < 8 ? ceil_div(dim, 256) : 8;
    k_moe_from_host<<<dim3(bx, (unsigned)k), 256, 0, c->stream>>>(ys, hys, ids, k, from, dim);
    return launch_check(c, "moe_from_host");
}
