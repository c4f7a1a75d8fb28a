/*
 * ffn_decode.cu: a decode layer's feed-forward block, gate/up and down
 * products in one kernel, with no grid-wide wait between them.
 *
 * As two launches the down product waits for the whole gate/up product
 * (the kernel boundary), then stages its 14,336-wide input in every block:
 * 5-6 us a layer beyond its weights' bytes on the 8B shape (ninth session's
 * leave-outs). Here clusters of FFN_CLUSTER blocks each own a slice of the
 * hidden activations h = silu(gate) * up, a multiple of 32 of them. A
 * cluster computes its slice (the gate/up rows, walked as gemv.cu walks
 * them), pushes each value into every block of the cluster through
 * distributed shared memory, and after one cluster barrier multiplies the
 * down matrix's matching columns by it: each block takes 1 / FFN_CLUSTER
 * of the rows. The down weights of that step are already in flight across
 * the barrier. The clusters' partial sums [cluster][dim] go to global
 * scratch; the last cluster to finish a block's rows adds them up in
 * cluster order, with x and the bias, and posts max |x * norm| for the next
 * product. No block ever waits for another cluster.
 *
 * The down product reads its slice as chunk columns: lanes in groups of
 * LPR (the slice's chunks a row, rounded up to a power of two) take the 32
 * weights of one chunk each from consecutive chunks of a row, so a row's
 * slice is one contiguous read (224 bytes on the 8B shape), and the sums
 * of a group's rows are reduced across its lanes by halving exchanges.
 */
#include <cooperative_groups.h>

#include "gemv.cuh"

namespace cg = cooperative_groups;

#ifndef FFN_CLUSTER
#define FFN_CLUSTER 8   /* blocks a cluster: the portable size */
#endif
#define FFN_MAX_CC 32   /* 32-wide chunk columns a cluster's slice holds at most */
/* Rows a lane has in flight in the down product, as many bytes as the
 * gate/up walk has (the nested chunk's larger state would pass 128 registers at 8). */
#define FFN_DOWN_U(C) (C::NESTED ? 4 : 8)

static_assert(FFN_CLUSTER <= FFN_COUNT_WORDS, "a counter for each block of a cluster");

/* The cluster's slice of h in fp32, written by every block of the cluster. */
__shared__ float ffn_h[FFN_MAX_CC * 32];

/*
 * Each lane holds N values; lanes in aligned groups of W (a power of two,
 * W >= N) sum each value over their group by halving exchanges: N - 1 + log2(W / N)
 * shuffles where summing each value on its own takes N log2(W). Afterwards
 * v[0] of lane l is the sum of value (l % W) / (W / N).
 */
template <int N, int O> __device__ __forceinline__ void seg_sums(float *v, int lane)
{
    if constexpr (O > 0) {
        if constexpr (N > 1) {
            const bool hi = lane & O;
#pragma unroll
            for (int i = 0; i < N / 2; i++) {
                const float send = hi ? v[i] : v[i + N / 2], keep = hi ? v[i + N / 2] : v[i];
                v[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
            }
            seg_sums<N / 2, O / 2>(v, lane);
        } else {
            v[0] += __shfl_xor_sync(0xffffffffu, v[0], O);
            seg_sums<1, O / 2>(v, lane);
        }
    }
}

/* C: chunk_4bit or chunk_4bit_nested (both matrices); LPR: lanes a row in the down product. */
template <typename C, int LPR>
__global__ void __launch_bounds__(GEMV_THREADS, 2) k_ffn(ffn_args a)
{
    extern __shared__ float4 smem[];
    __half *xs = reinterpret_cast<__half *>(smem); /* x for gate/up, then the slice of h, fp16 as gemv.cu's */
    constexpr int STRIDE = C::VEC + C::PAD, U = LPR < FFN_DOWN_U(C) ? LPR : FFN_DOWN_U(C), RG = 32 / LPR;
    const gemv_args &g = a.gu, &d = a.down;
    cg::cluster_group cluster = cg::this_cluster();
    const int F = g.rows / 2, D = g.cols, tot = F / 32;
    const int rank = (int)cluster.block_rank(), nc = gridDim.x / FFN_CLUSTER, cl = blockIdx.x / FFN_CLUSTER;
    const int cc0 = (int)((long)cl * tot / nc), ncc = (int)((long)(cl + 1) * tot / nc) - cc0, nh = 32 * ncc;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = GEMV_THREADS / 32;

    /* Distributed shared memory may be written only once its block runs:
     * every block arrives here, and waits before its first push. */
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");

    /* Gate/up: output j of the slice (h index 32 cc0 + j) by warp j % 64 of the cluster. */
    /* Whether the down matrix's tables differ from gate/up's (each matrix has
     * its own copy; the values are the same in a model of one format). */
    __shared__ bool new_code, new_am_code;
    auto prologue = [&]() {
        build_pairs(g.code);
        if constexpr (C::NESTED)
            for (int i = threadIdx.x; i < 256; i += blockDim.x)
                am_code_s[i] = g.am_code[i];
        if (warp == 0) { /* published by stage_input's barrier */
            bool diff = lane < 16 && g.code[lane] != d.code[lane];
            diff = __any_sync(0xffffffffu, diff);
            bool diff_am = false;
            if constexpr (C::NESTED)
                for (int i = lane; i < 256; i += 32)
                    diff_am |= g.am_code[i] != d.am_code[i];
            diff_am = __any_sync(0xffffffffu, diff_am);
            if (lane == 0)
                new_code = diff, new_am_code = diff_am;
        }
        dependency_wait(); /* x is the previous kernel's */
        const float xscale = stage_input<GEMV_IN_RMSNORM, C::VEC>(xs, g.x, g.norm, D, g.eps, g.x_max);
        asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
        return xscale;
    };
    auto emit = [&](int i, float gs, float us) {
        if (g.bias) {
            gs += g.bias[i];
            us += g.bias[F + i];
        }
        const float h = gs / (1.0f + expf(-gs)) * us;
        if (lane < FFN_CLUSTER) /* into every block of the cluster */
            cluster.map_shared_rank(ffn_h, lane)[i - 32 * cc0] = h;
    };
    rows_walk<C, true>(g, xs, rank * warps + warp, FFN_CLUSTER * warps, nh, 32 * cc0, false, prologue, emit);

    /* Down: this block's rows rb .. rb + nrows - 1 in tiles of RG x U rows,
     * tile t by warp t % warps; lane (sub, cc) takes chunk cc0 + cc of row
     * tile + u * RG + sub. The first tile's loads go out before the barrier. */
    const int nrows = D / FFN_CLUSTER, rb = rank * nrows, tiles = (nrows + RG * U - 1) / (RG * U);
    const int sub = lane / LPR, cc = lane % LPR;
    const qinfo qd = make_qinfo(d);
    C cur[U], nxt[U];
    auto load = [&](C (&buf)[U], int t) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int r = t * RG * U + u * RG + sub; /* past the rows: row 0 again, its sum dropped */
            if (cc < ncc)
#ifdef FFN_EXP_CONTIG /* measurement only: the slice's rows as if stored contiguously (wrong sums) */
                buf[u].load(d, qd, 0, cc0 * D + (rb + (r < nrows ? r : 0)) * ncc + cc);
#else
                buf[u].load(d, qd, rb + (r < nrows ? r : 0), cc0 + cc);
#endif
        }
    };
    if (warp < tiles)
        load(cur, warp);
    if (warp + warps < tiles)
        load(nxt, warp + warps);
    /* h's slice is complete in every block: the pushes above are released
     * and acquired by the barrier, and x's staging is over everywhere. */
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
    dependents_may_launch();
    if (new_code) /* published with the slice below */
        build_pairs(d.code);
    if constexpr (C::NESTED)
        if (new_am_code)
            for (int i = threadIdx.x; i < 256; i += blockDim.x)
                am_code_s[i] = d.am_code[i];
    /* The slice in fp16, scaled as stage_input scales: its largest |h|
     * (every warp finds it, so no barrier) into [2^11, 2^12). */
    float mx = 0.0f;
    for (int i = lane; i < nh; i += 32)
        mx = fmaxf(mx, fabsf(ffn_h[i]));
    mx = warp_max(mx);
    const int e = max((__float_as_int(mx) >> 23) & 0xff, 12);
    const float f = __int_as_float((265 - e) << 23), undo = __int_as_float((e - 11) << 23);
    for (int i = threadIdx.x; i < nh / 2; i += blockDim.x) {
        const int j = 2 * i;
        *reinterpret_cast<__half2 *>(xs + j + j / 32 * C::PAD) = __floats2half2_rn(ffn_h[j] * f, ffn_h[j + 1] * f);
    }
    __syncthreads();

    float *part = a.part + (size_t)cl * D + rb;
    for (int t = warp; t < tiles; t += warps) {
        float s[U];
#pragma unroll
        for (int u = 0; u < U; u++)
            s[u] = cc < ncc ? cur[u].dot(xs + cc * STRIDE) : 0.0f;
#pragma unroll
        for (int k = 0; k < U; k++)
            cur[k] = nxt[k];
        if (t + 2 * warps < tiles)
            load(nxt, t + 2 * warps);
        seg_sums<U, LPR / 2>(s, lane);
        const int u = (lane % LPR) / (LPR / U), r = t * RG * U + u * RG + sub;
        if (lane % (LPR / U) == 0 && r < nrows)
            part[r] = s[0] * undo;
    }

    /* The last cluster to finish rows rb .. adds every cluster's sums. */
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(a.count + rank, 1u) == (unsigned)(nc - 1);
        if (last)
            a.count[rank] = 0; /* every cluster has counted: ready for the next launch */
    }
    __syncthreads();
    if (!last)
        return;
    __threadfence();
    /* Thread (k, q): float4 q of the rows, clusters k nc / tpc .. in order;
     * then the tpc sums of each float4 in order. */
    const int q4 = nrows / 4, tpc = GEMV_THREADS / q4;
    float4 *red = reinterpret_cast<float4 *>(smem); /* [tpc][q4]; xs is done with */
    if ((int)threadIdx.x < q4 * tpc) {
        const int q = threadIdx.x % q4, k = threadIdx.x / q4;
        const int s0 = k * nc / tpc, s1 = (k + 1) * nc / tpc;
        const float4 *p = reinterpret_cast<const float4 *>(a.part + rb) + q;
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int s = s0; s < s1; s += 8) {
            float4 v[8];
#pragma unroll
            for (int i = 0; i < 8; i++)
                if (s + i < s1)
                    v[i] = __ldcg(p + (size_t)(s + i) * (D / 4));
#pragma unroll
            for (int i = 0; i < 8; i++)
                if (s + i < s1) {
                    acc.x += v[i].x;
                    acc.y += v[i].y;
                    acc.z += v[i].z;
                    acc.w += v[i].w;
                }
        }
        red[k * q4 + q] = acc;
    }
    __syncthreads();
    float ymx = 0.0f;
    for (int q = threadIdx.x; q < q4; q += blockDim.x) {
        float4 acc = red[q];
        for (int k = 1; k < tpc; k++) {
            const float4 v = red[k * q4 + q];
            acc.x += v.x;
            acc.y += v.y;
            acc.z += v.z;
            acc.w += v.w;
        }
        const float sum[4] = {acc.x, acc.y, acc.z, acc.w};
        for (int i = 0; i < 4; i++) {
            const int n = rb + 4 * q + i;
            const float v = __ldcg(d.y + n) + sum[i] + (d.bias ? d.bias[n] : 0.0f);
            d.y[n] = v;
            ymx = fmaxf(ymx, fabsf(d.y_max_norm ? v * d.y_max_norm[n] : v));
        }
    }
    if (d.y_max) {
        ymx = warp_max(ymx);
        if (lane == 0 && ymx > 0.0f)
            atomicMax(d.y_max, __float_as_uint(ymx));
    }
}

static bool pow2(int v) { return v > 0 && (v & (v - 1)) == 0; }

/* The 4-bit matrix runs as 16-byte chunks (as gemv.cu's chunks_fit) with its absmax plain or nested. */
static bool chunks_4bit(const gemv_args *m, bool nested)
{
    if (m->wt != K_NF4 && m->wt != K_FP4)
        return false;
    if ((uintptr_t)m->w % 16 || m->cols % 32 || m->group % 32 || !pow2(m->group) || !m->code)
        return false;
    return nested ? m->am_q && m->am_s2 && m->am_code && m->am_shift >= 0 && m->am_shift < 31 : m->scales != NULL;
}

static bool shapes_fit(const ffn_args *a)
{
    const gemv_args *g = &a->gu, *d = &a->down;
    const int F = g->rows / 2, D = g->cols;
    if (!g->glu_out || g->in != GEMV_IN_RMSNORM || !g->norm || !g->x || !d->y || !d->accumulate || !a->part ||
        !a->count || g->wt != d->wt || !chunks_4bit(g, g->am_q) || !chunks_4bit(d, g->am_q))
        return false;
    /* down is [D, F]; a block's rows of it are whole float4s, at most 4 a thread in the last sum */
    return d->rows == D && d->cols == F && F % 32 == 0 && D % 32 == 0 && D / FFN_CLUSTER <= 4 * GEMV_THREADS;
}

typedef void (*ffn_kernel)(ffn_args);
template <typename C> static ffn_kernel kernel_for(int lpr)
{
    switch (lpr) {
    case 4: return k_ffn<C, 4>;
    case 8: return k_ffn<C, 8>;
    case 16: return k_ffn<C, 16>;
    case 32: return k_ffn<C, 32>;
    }
    return NULL;
}

/* The input x staged as fp16 with gemv.cu's padding, later the slice of h; the last sum's float4s. */
static size_t smem_bytes(const ffn_args *a)
{
    const size_t x = ((size_t)a->gu.cols + a->gu.cols / 32 * 8) * sizeof(__half);
    const size_t h = (size_t)FFN_MAX_CC * 40 * sizeof(__half), red = (size_t)GEMV_THREADS * 4 * sizeof(float);
    return x > h ? (x > red ? x : red) : (h > red ? h : red);
}

static void config(cudaLaunchConfig_t *cfg, cudaLaunchAttribute *attr, int nc, size_t smem, cudaStream_t st)
{
    *cfg = cudaLaunchConfig_t{};
    cfg->gridDim = dim3((unsigned)(nc * FFN_CLUSTER));
    cfg->blockDim = dim3(GEMV_THREADS);
    cfg->dynamicSmemBytes = smem;
    cfg->stream = st;
    attr[0] = attr[1] = cudaLaunchAttribute{};
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = FFN_CLUSTER;
    attr[0].val.clusterDim.y = attr[0].val.clusterDim.z = 1;
    attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[1].val.programmaticStreamSerializationAllowed = 1;
    cfg->attrs = attr;
    cfg->numAttrs = 2;
}

/*
 * The kernel and its clusters for these matrices: as many clusters as one
 * wave holds and part has room for, at most one a chunk column, each slice
 * FFN_MAX_CC chunks at most. NULL where it does not run.
 */
template <typename C> static ffn_kernel plan(launch_ctx *c, const ffn_args *a, int *nc)
{
    const size_t smem = smem_bytes(a);
    const int tot = a->gu.rows / 2 / 32, D = a->gu.cols;
    int n = tot;
    if ((size_t)n > a->part_floats / D)
        n = (int)(a->part_floats / D);
    ffn_kernel k = NULL;
    for (int pass = 0; pass < 2 && n > 0; pass++) { /* a wave's clusters depend on the kernel, the kernel on them */
        int lpr = 4;
        while (lpr < (tot + n - 1) / n)
            lpr *= 2;
        k = kernel_for<C>(lpr);
        cudaLaunchConfig_t cfg;
        cudaLaunchAttribute attr[2];
        config(&cfg, attr, 1, smem, c->stream);
        cfg.numAttrs = 1; /* the query takes the cluster shape alone */
        int fit = 0;
        if (!k || cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess ||
            (FFN_CLUSTER > 8 && cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1)) ||
            cudaOccupancyMaxActiveClusters(&fit, k, &cfg) != cudaSuccess) {
            (void)cudaGetLastError();
            return NULL;
        }
        if (fit >= n)
            break;
        n = fit;
    }
    *nc = n;
    return n > 0 && (tot + n - 1) / n <= FFN_MAX_CC ? k : NULL;
}

extern "C" bool ffn_decode_fits(launch_ctx *c, const ffn_args *a)
{
    int nc = 0;
    return shapes_fit(a) && (a->gu.am_q ? plan<chunk_4bit_nested>(c, a, &nc) : plan<chunk_4bit>(c, a, &nc));
}

extern "C" int launch_ffn_decode(launch_ctx *c, const ffn_args *a)
{
    if (!shapes_fit(a))
        return launch_fail(c, "ffn_decode: shapes or types this kernel does not take (dim %d, ffn %d)", a->gu.cols,
                           a->gu.rows / 2);
    int nc = 0;
    const ffn_kernel k = a->gu.am_q ? plan<chunk_4bit_nested>(c, a, &nc) : plan<chunk_4bit>(c, a, &nc);
    if (!k)
        return launch_fail(c, "ffn_decode: no wave of %d-block clusters fits (dim %d, ffn %d)", FFN_CLUSTER,
                           a->gu.cols, a->gu.rows / 2);
    cudaLaunchConfig_t cfg;
    cudaLaunchAttribute attr[2];
    config(&cfg, attr, nc, smem_bytes(a), c->stream);
    const cudaError_t e = cudaLaunchKernelEx(&cfg, k, *a);
    if (e != cudaSuccess)
        return launch_fail(c, "ffn_decode: %s", cudaGetErrorString(e));
    return launch_check(c, "ffn_decode");
}
