/*
 * attention_decode.cu: attention of one new token against the KV cache
 * (decode), with the rope_qkv step folded in, flash-decoding style: one
 * query gives little parallelism, so the keys of each kv head are split
 * among the blocks of a thread-block cluster; each block keeps a running
 * max, sum and unnormalised output per q head in shared memory, and the
 * blocks merge them through distributed shared memory. No partial results
 * go through global memory and no second kernel runs: with a separate
 * combine launch this op cost about 12 us a layer in the decode of a 1B
 * model, far more than its keys take to read.
 *
 * The kernel is a programmatic dependent of the q/k/v product: the cache
 * rows it reads (all but the new one) do not depend on that product, so
 * their copy into shared memory is issued before dependency_wait() and
 * overlaps the product's tail. The position is read from device memory so
 * the decode graph can be replayed at every position.
 *
 * Keys and values move in 16-byte granules (4-byte copies ran at a few
 * GB/s per multiprocessor), stored with granule g of row k at g ^ (k % 8)
 * so that eight threads reading the same granule of eight rows touch all
 * 32 banks once.
 */
#include <cooperative_groups.h>

#include <type_traits>

#include "q4_pairs.cuh"
#include "rope.cuh"

namespace cg = cooperative_groups;

#define DEC_THREADS 256
#define DEC_MAX_SPLITS 16 /* blocks in a cluster; above 8 needs non-portable cluster sizes */
#define DEC_CHUNK_MAX 128 /* keys staged in shared memory at a time */
#define DEC_SMEM_TARGET (96 * 1024)
#define DEC_SMEM_TARGET_FO (48 * 1024) /* with the projection folded in: its weights need the room */

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(smem)), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async4(void *smem, const void *gmem)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem_addr(smem)), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
/* Wait until at most N committed groups of this thread are still in flight. */
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }
/* A cluster barrier in two halves: arrive once done reading the others'
 * shared memory, wait before leaving (so nobody exits while read). */
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }

/*
 * The EL = 16 / sizeof(T) elements of a granule as fp32. The granule comes
 * by value, as one 16-byte shared-memory load: read through a pointer to
 * its elements, it became eight 2-byte loads per granule (measured: the
 * scores took 1.6x (fp16) and 3.5x (bf16) the fp32 cache's time).
 */
template <typename T> __device__ __forceinline__ void granule_f32(const uint4 g, float *f)
{
    const uint32_t w[4] = {g.x, g.y, g.z, g.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if constexpr (sizeof(T) == 4) {
            f[i] = __uint_as_float(w[i]);
        } else if constexpr (std::is_same<T, __nv_bfloat16>::value) {
            f[2 * i] = __uint_as_float(w[i] << 16);
            f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
        } else {
            const float2 v = __half22float2(*reinterpret_cast<const __half2 *>(&w[i]));
            f[2 * i] = v.x;
            f[2 * i + 1] = v.y;
        }
    }
}

/*
 * Shared memory, in order (16-byte aligned first): with the output
 * projection folded in (FO), its weights [R][C / 32] granules; two buffers
 * of K and V chunks [chunk][hb] granules, the new k and v rows [2][hb];
 * then fp32: per q head of the group q [G][hd] and the output accumulator
 * [G][hd], the value sums of the key slices [DEC_THREADS * EL] (FO: then
 * the merged output [C]), scores [G][chunk], max, sum and correction [G],
 * the merge's weights [DEC_MAX_SPLITS][G]; FO: the projection's absmax
 * [R][C / group]. R rows of the projection a block, C = G * hd columns.
 */
struct dec_smem {
    static __host__ __device__ size_t fixed_bytes(int g, int hd, int es)
    {
        return ((size_t)2 * g * hd + 3 * g + DEC_MAX_SPLITS * g + DEC_THREADS * (16 / es)) * 4 + 2 * (size_t)hd * es;
    }
    static __host__ __device__ size_t key_bytes(int g, int hd, int es) { return (size_t)4 * hd * es + 4 * g; }
    static __host__ __device__ size_t o_bytes(int rows, int cols, int group)
    {
        return (size_t)rows * (cols / 32) * 16 + (size_t)rows * (cols / group) * 4;
    }
};

/* The largest v over the block; every thread gets it (a barrier: what was written before is visible after). */
__device__ __forceinline__ float block_max(float v)
{
    __shared__ float part[DEC_THREADS / 32];
    v = warp_max(v);
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x >> 5] = v;
    __syncthreads();
    float m = 0.0f;
#pragma unroll
    for (int w = 0; w < DEC_THREADS / 32; w++)
        m = fmaxf(m, part[w]);
    return m;
}

/*
 * FO: this block's R rows of x += W_o . in, where in [C] is the merged
 * output of its kv head (largest |value| mx) and W_o's columns of that head
 * wait in shared memory (ow, their absmax oam [R][apr]). The products run
 * as gemv's 4-bit ones do (q4_pairs.cuh: fp16 pairs under a power-of-two
 * scale), a lane keeping its 32 columns in registers for every row. Each kv
 * head's sums go to o.part; the last cluster to finish a slice of rows adds
 * the heads' sums to x in kv-head order, so the result does not depend on
 * which finished first, and posts the new x's maximum for the next product.
 */
__device__ void project_out(const attn_o_args &o, const float *in, const uint4 *ow, const float *oam, float mx,
                            int split, int kvh, int nkv, int C, int R, int Rb, int apr)
{
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, warps = DEC_THREADS / 32;
    const int CPR = C / 32, RPI = 32 / CPR, c = lane % CPR, ro = lane / CPR, ac = c * 32 / o.group;
    const int e = max((__float_as_int(mx) >> 23) & 0xff, 12); /* as gemv's stage_input */
    const float f = __int_as_float((265 - e) << 23), undo = __int_as_float((e - 11) << 23);
    half2x4 xin[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const float4 u = reinterpret_cast<const float4 *>(in + c * 32 + 8 * k)[0];
        const float4 v = reinterpret_cast<const float4 *>(in + c * 32 + 8 * k)[1];
        xin[k].p[0] = __floats2half2_rn(u.x * f, u.y * f);
        xin[k].p[1] = __floats2half2_rn(u.z * f, u.w * f);
        xin[k].p[2] = __floats2half2_rn(v.x * f, v.y * f);
        xin[k].p[3] = __floats2half2_rn(v.z * f, v.w * f);
    }
    cp_async_wait<0>();
    __syncthreads(); /* every thread's weights, absmax and code pairs */
    if (o.dbg && threadIdx.x == 0) {
        unsigned long long t_;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_));
        o.dbg[(blockIdx.y * gridDim.x + blockIdx.x) * 8 + 5] = t_;
    }
    float *part = o.part + (size_t)kvh * o.dim + (size_t)split * R;
    constexpr int NB = 4; /* row groups a warp works on at once: their latencies overlap */
    for (int r0 = warp * RPI * NB; r0 < Rb; r0 += warps * RPI * NB) { /* warp-uniform: shuffles see every lane */
        float d[NB];
#pragma unroll
        for (int j = 0; j < NB; j++) {
            const int r = r0 + j * RPI + ro;
            d[j] = r < Rb ? q4_dot_regs(ow[(size_t)r * CPR + c], oam[(size_t)r * apr + ac], xin) : 0.0f;
        }
        for (int off = CPR / 2; off > 0; off >>= 1)
#pragma unroll
            for (int j = 0; j < NB; j++)
                d[j] += __shfl_xor_sync(0xffffffffu, d[j], off);
#pragma unroll
        for (int j = 0; j < NB; j++) {
            const int r = r0 + j * RPI + ro;
            if (c == 0 && r < Rb)
                part[r] = d[j] * undo;
        }
    }
    __threadfence();
    __syncthreads();
    if (o.dbg && threadIdx.x == 0) {
        unsigned long long t_;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_));
        o.dbg[(blockIdx.y * gridDim.x + blockIdx.x) * 8 + 6] = t_;
    }
    __shared__ unsigned last;
    if (tid == 0)
        last = atomicAdd(o.count + split, 1u) == (unsigned)(nkv - 1);
    __syncthreads();
    if (!last)
        return;
    __threadfence();
    float ymx = 0.0f;
    for (int i = tid; i < Rb; i += DEC_THREADS) {
        const size_t row = (size_t)split * R + i;
        const float xr = o.x[row], br = o.bias ? o.bias[row] : 0.0f;
        float s = 0.0f;
        for (int k0 = 0; k0 < nkv; k0 += 8) { /* 8 loads in flight, then summed in order */
            float p[8];
#pragma unroll
            for (int k = 0; k < 8; k++)
                p[k] = k0 + k < nkv ? __ldcg(o.part + (size_t)(k0 + k) * o.dim + row) : 0.0f;
#pragma unroll
            for (int k = 0; k < 8; k++)
                s += p[k];
        }
        const float v = xr + (o.bias ? s + br : s);
        o.x[row] = v;
        ymx = fmaxf(ymx, fabsf(o.y_max_norm ? v * o.y_max_norm[row] : v));
    }
    if (tid == 0)
        o.count[split] = 0; /* for the next layer's kernel, which starts after this one ends */
    if (o.y_max) {
        ymx = warp_max(ymx);
        if (lane == 0 && ymx > 0.0f)
            atomicMax(o.y_max, __float_as_uint(ymx));
    }
}

#define STAMP(i)                                                                                      \
    if (FO && o.dbg && threadIdx.x == 0) {                                                            \
        unsigned long long t_;                                                                        \
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_));                                       \
        o.dbg[(blockIdx.y * gridDim.x + blockIdx.x) * 8 + (i)] = t_;                                  \
    }
template <typename T, bool FO>
__global__ void __launch_bounds__(DEC_THREADS) k_attention_decode(float *out, rope_qkv_args a, attn_o_args o,
                                                                   int window, int chunk)
{
    constexpr int EL = 16 / sizeof(T); /* elements per granule */
    extern __shared__ uint4 sm[];
    cg::cluster_group cluster = cg::this_cluster();
    const int split = (int)cluster.block_rank(), splits = (int)cluster.num_blocks(), kvh = blockIdx.y;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, warps = DEC_THREADS / 32;
    const int nh = a.n_heads, nkv = a.n_kv_heads, hd = a.head_dim, G = nh / nkv, kvd = nkv * hd;
    const int hb = hd / EL, swz = hb % 8 == 0 ? 7 : 0; /* granules a row; the swizzle mask */
    /* FO: the projection's rows of this block, its columns of this kv head. */
    const int C = G * hd, CPR = C / 32, apr = FO ? C / o.group : 0;
    const int R = FO ? (o.dim + splits - 1) / splits : 0, Rb = FO ? max(0, min(R, o.dim - split * R)) : 0;
    uint4 *ow = sm, *kbuf = sm + (size_t)R * CPR, *vbuf = kbuf + (size_t)2 * chunk * hb, *nrow = vbuf + (size_t)2 * chunk * hb;
    float *qs = reinterpret_cast<float *>(nrow + 2 * hb), *os = qs + G * hd, *red = os + G * hd;
    float *sc = red + DEC_THREADS * EL, *ms = sc + G * chunk, *ls = ms + G, *cr = ls + G, *wt = cr + G;
    float *oam = wt + DEC_MAX_SPLITS * G, *mrg = red; /* FO: red is free once the keys are done */
    const T *kc = static_cast<const T *>(a.k_cache), *vc = static_cast<const T *>(a.v_cache);

    STAMP(0);
    const int pos = *a.pos0; /* copied in before the graph's first kernel */
    const int lo0 = window > 0 ? max(0, pos - window + 1) : 0, len = pos + 1 - lo0;
    const int share = (len + splits - 1) / splits;
    const int lo = lo0 + split * share, end = min(lo + share, pos + 1);

    /* Keys c0 .. c0 + chunk - 1 into buffer b, every copy in flight at
     * once, as one group. The first chunk goes out before the q/k/v product
     * is complete, so its new row (pos) comes from the rope step instead; a
     * later chunk reads it from the cache, where the rope step put it. */
    auto load_chunk = [&](int c0, int b) {
        const int nk = min(chunk, end - c0);
        uint4 *kb = kbuf + (size_t)b * chunk * hb, *vb = vbuf + (size_t)b * chunk * hb;
        for (int i = tid; i < nk * hb; i += DEC_THREADS) {
            const int k = i / hb, c = i - k * hb, key = c0 + k;
            if (key == pos && c0 == lo)
                continue;
            const size_t at = (size_t)key * kvd + (size_t)kvh * hd + (size_t)c * EL;
            const int to = k * hb + (c ^ (k & swz));
            cp_async16(kb + to, kc + at);
            cp_async16(vb + to, vc + at);
        }
        cp_async_commit();
    };
    if (lo < end)
        load_chunk(lo, 0);
    if constexpr (FO) { /* the projection's weights, after the first keys: they are needed later */
        const int qd = nh * hd;
        const uint8_t *w = static_cast<const uint8_t *>(o.w) + (size_t)split * R * (qd / 2) + (size_t)kvh * (C / 2);
        for (int i = tid; i < Rb * CPR; i += DEC_THREADS) {
            const int r = i / CPR;
            cp_async16(ow + i, w + (size_t)r * (qd / 2) + (i - r * CPR) * 16);
        }
        const float *am = o.absmax + ((size_t)split * R * qd + (size_t)kvh * C) / o.group;
        for (int i = tid; i < Rb * apr; i += DEC_THREADS) {
            const int r = i / apr;
            cp_async4(oam + i, am + (size_t)r * (qd / o.group) + (i - r * apr));
        }
        cp_async_commit();
        build_pairs(o.code);
    }
    for (int i = tid; i < G * hd; i += DEC_THREADS)
        os[i] = 0.0f;
    for (int g = tid; g < G; g += DEC_THREADS) {
        ms[g] = -INFINITY;
        ls[g] = 0.0f;
    }
    dependents_may_launch(); /* the output projection may start loading its weights */
    dependency_wait();       /* the q/k/v product is complete */
    STAMP(1);

    /* The rope step, a warp per task, all at once: q of each head of the
     * group into qs; in the block whose share holds the new position, its k
     * and v into the cache (and into the first chunk, when it is there). */
    const bool has_new = lo <= pos && pos < end, new_in_first = has_new && pos < lo + chunk;
    const int tasks = lo < end ? G + (has_new ? 2 : 0) : 0;
    for (int t = warp; t < tasks; t += warps) {
        if (t < G) {
            const size_t h = (size_t)(kvh * G + t) * hd;
            rope_head<float>(qs + t * hd, a.qkv + h, a.bias ? a.bias + h : NULL, a.q_norm, a.eps, a.cos, a.sin, pos,
                             hd, true);
            continue;
        }
        const int is_v = t - G;
        const size_t src = (size_t)(nh + (is_v ? nkv : 0) + kvh) * hd;
        uint4 *stage = nrow + is_v * hb;
        rope_head<T>(reinterpret_cast<T *>(stage), a.qkv + src, a.bias ? a.bias + src : NULL,
                     is_v ? NULL : a.k_norm, a.eps, a.cos, a.sin, pos, hd, !is_v);
        __syncwarp();
        uint4 *cache = reinterpret_cast<uint4 *>(static_cast<T *>(is_v ? a.v_cache : a.k_cache) + (size_t)pos * kvd +
                                                 (size_t)kvh * hd);
        const int k = pos - lo;
        for (int c = lane; c < hb; c += 32) {
            cache[c] = stage[c];
            if (new_in_first)
                (is_v ? vbuf : kbuf)[k * hb + (c ^ (k & swz))] = stage[c];
        }
    }
    __syncthreads(); /* the new rows are in the cache before a later chunk reads them */
    STAMP(2);

    const float scale = rsqrtf((float)hd);
    /* Value sums: thread (slice, head, granule); a slice takes every S-th key. */
    const int pairs = G * hb, S = pairs >= DEC_THREADS ? 1 : DEC_THREADS / pairs;
    for (int c0 = lo, b = 0; c0 < end; c0 += chunk, b ^= 1) {
        const int nk = min(chunk, end - c0);
        const uint4 *kb = kbuf + (size_t)b * chunk * hb, *vb = vbuf + (size_t)b * chunk * hb;
        if (c0 + chunk < end) { /* the next chunk streams in while this one is used */
            load_chunk(c0 + chunk, b ^ 1);
            cp_async_wait<1>();
        } else if (FO && c0 == lo) { /* the projection's weights may still come */
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();

        /* Scores: a thread per (head, key), a granule at a time; q is a broadcast. */
        for (int i = tid; i < G * nk; i += DEC_THREADS) {
            const int g = i / nk, k = i - g * nk;
            const uint4 *kr = kb + (size_t)k * hb;
            const float4 *q = reinterpret_cast<const float4 *>(qs + g * hd);
            float d0 = 0.0f, d1 = 0.0f;
#pragma unroll 4
            for (int c = 0; c < hb; c++) {
                float f[EL];
                granule_f32<T>(kr[c ^ (k & swz)], f);
#pragma unroll
                for (int e = 0; e < EL; e += 4) {
                    const float4 qv = q[(c * EL + e) / 4];
                    d0 += f[e] * qv.x + f[e + 1] * qv.y;
                    d1 += f[e + 2] * qv.z + f[e + 3] * qv.w;
                }
            }
            sc[g * chunk + k] = (d0 + d1) * scale;
        }
        __syncthreads();

        /* Online softmax: a warp per head turns scores into weights. */
        for (int g = warp; g < G; g += warps)
            warp_softmax_step(sc + g * chunk, nk, ms, ls, cr, g);
        __syncthreads();

        /* Weighted values by key slices, then the slices summed into os. */
        for (int t = tid; t < S * pairs; t += DEC_THREADS) {
            const int s = t / pairs, r = t - s * pairs, g = r / hb, c = r - g * hb;
            const float *p = sc + g * chunk;
            float acc[EL];
#pragma unroll
            for (int e = 0; e < EL; e++)
                acc[e] = 0.0f;
#pragma unroll 2
            for (int k = s; k < nk; k += S) {
                float f[EL];
                granule_f32<T>(vb[(size_t)k * hb + (c ^ (k & swz))], f);
                const float pk = p[k];
#pragma unroll
                for (int e = 0; e < EL; e++)
                    acc[e] += pk * f[e];
            }
            float *dst = S == 1 ? NULL : red + ((size_t)s * pairs + r) * EL;
#pragma unroll
            for (int e = 0; e < EL; e++) {
                if (S == 1)
                    os[g * hd + c * EL + e] = os[g * hd + c * EL + e] * cr[g] + acc[e];
                else
                    dst[e] = acc[e];
            }
        }
        if (S > 1) {
            __syncthreads();
            for (int o = tid; o < G * hd; o += DEC_THREADS) {
                float v = os[o] * cr[o / hd];
                for (int s = 0; s < S; s++)
                    v += red[(size_t)s * G * hd + o]; /* [s][g][c][e] is [s][o] */
                os[o] = v;
            }
        }
        __syncthreads(); /* before the buffer is refilled and sc, red are overwritten */
    }

    /* Merge the splits. A warp per head reads every block's max and sum
     * (a lane per block) and leaves the blocks' weights in wt; then block
     * `split` finishes every splits-th output of this kv head (FO: every
     * output, the projection's input), its loads from the others'
     * accumulators all in flight. */
    STAMP(3);
    cluster.sync();
    for (int g = warp; g < G; g += warps) {
        const float m_s = lane < splits ? cluster.map_shared_rank(ms, lane)[g] : -INFINITY;
        const float l_s = lane < splits ? cluster.map_shared_rank(ls, lane)[g] : 0.0f;
        const float mx = warp_max(m_s);
        const float w = m_s == -INFINITY ? 0.0f : expf(m_s - mx); /* -inf: a split with no keys */
        const float den = warp_sum(w * l_s);
        if (lane < splits)
            wt[lane * G + g] = w / den;
    }
    __syncthreads();
    float omx = 0.0f; /* for out_max; FO: the projection input's scale */
    for (int i = (FO ? 0 : split * DEC_THREADS) + tid; i < C; i += (FO ? 1 : splits) * DEC_THREADS) {
        const int g = i / hd;
        float part[DEC_MAX_SPLITS];
#pragma unroll
        for (int s = 0; s < DEC_MAX_SPLITS; s++)
            part[s] = s < splits ? cluster.map_shared_rank(os, s)[i] : 0.0f;
        float num = 0.0f;
#pragma unroll
        for (int s = 0; s < DEC_MAX_SPLITS; s++)
            if (s < splits)
                num += wt[s * G + g] * part[s];
        if (FO)
            mrg[i] = num;
        else
            out[(size_t)kvh * C + i] = num;
        omx = fmaxf(omx, fabsf(num));
    }
    if constexpr (!FO) {
        if (a.out_max) { /* the output projection stages its input knowing this */
            omx = warp_max(omx);
            if (lane == 0 && omx > 0.0f)
                atomicMax(a.out_max, __float_as_uint(omx));
        }
        cluster.sync(); /* the others may still be reading this block's shared memory */
    } else {
        STAMP(4);
        cluster_arrive(); /* done with the others' shared memory */
        const float mx = block_max(omx);
        if (Rb > 0)
            project_out(o, mrg, ow, oam, mx, split, kvh, nkv, C, R, Rb, apr);
        STAMP(7);
        cluster_wait(); /* before leaving: the others may still read this block's accumulators */
    }
}
/* Keys a chunk: as many as fit the target beside the fixed parts, at least 16 (then past it). */
static long decode_chunk(int G, int hd, int es, bool fo)
{
    const long target = fo ? DEC_SMEM_TARGET_FO : DEC_SMEM_TARGET;
    long chunk = (target - (long)dec_smem::fixed_bytes(G, hd, es)) / (long)dec_smem::key_bytes(G, hd, es);
    return chunk < 16 ? 16 : chunk > DEC_CHUNK_MAX ? DEC_CHUNK_MAX : chunk;
}

/*
 * A launch's configuration: n_splits blocks a cluster, or 8 where the
 * device cannot hold a non-portable cluster of more with this much shared
 * memory (FO: its rows of the projection grow as the splits fall). Returns
 * the splits, or 0 (with c->err) where not even that fits.
 */
template <typename T, bool FO>
static int configure(launch_ctx *c, const rope_qkv_args *a, const attn_o_args *o, int splits, cudaLaunchConfig_t *cfg,
                     cudaLaunchAttribute *attr, long *chunk)
{
    const int G = a->n_heads / a->n_kv_heads, hd = a->head_dim, es = (int)sizeof(T);
    *chunk = decode_chunk(G, hd, es, FO);
    const size_t base = dec_smem::fixed_bytes(G, hd, es) + (size_t)*chunk * dec_smem::key_bytes(G, hd, es);
    auto kern = k_attention_decode<T, FO>;
    *cfg = cudaLaunchConfig_t{};
    cfg->blockDim = dim3(DEC_THREADS);
    cfg->stream = c->stream;
    attr[0] = attr[1] = cudaLaunchAttribute{};
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[1].val.programmaticStreamSerializationAllowed = 1;
    cfg->attrs = attr;
    cfg->numAttrs = 2;
    /* FO: the most splits (up to n_splits) whose clusters all fit at once:
     * a second wave of clusters doubles the kernel (measured 34 against
     * 12 us, 1B shape, H100). R = ceil(dim / splits) rows a block. */
    for (; splits >= 1; splits--) {
        const size_t smem =
            base + (FO ? dec_smem::o_bytes((o->dim + splits - 1) / splits, G * hd, o->group) : 0);
        cfg->gridDim = dim3((unsigned)splits, (unsigned)a->n_kv_heads);
        cfg->dynamicSmemBytes = smem;
        attr[0].val.clusterDim.x = (unsigned)splits;
        int clusters = 0;
        const bool ok = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) == cudaSuccess &&
                        (splits <= 8 || cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) ==
                                            cudaSuccess) &&
                        (!FO && splits <= 8 ||
                         (cudaOccupancyMaxActiveClusters(&clusters, kern, cfg) == cudaSuccess &&
                          clusters >= (FO ? a->n_kv_heads : 1)));
        if (ok)
            return splits;
        (void)cudaGetLastError();
        if (!FO) /* a non-portable cluster size the device cannot hold: 8 */
            splits = splits > 8 ? 9 : 1;
    }
    launch_fail(c, "attention_decode: no cluster fits (group %d, head_dim %d)", G, hd);
    return 0;
}

template <typename T, bool FO>
static int run_decode(launch_ctx *c, float *out, const rope_qkv_args *a, const attn_o_args *o, int window, int splits)
{
    cudaLaunchConfig_t cfg;
    cudaLaunchAttribute attr[2];
    long chunk = 0;
    if (!configure<T, FO>(c, a, o, splits, &cfg, attr, &chunk))
        return -1;
    static const attn_o_args none = {};
    const cudaError_t e = cudaLaunchKernelEx(&cfg, k_attention_decode<T, FO>, out, *a, FO ? *o : none, window,
                                             (int)chunk);
    if (e != cudaSuccess)
        return launch_fail(c, "attention_decode: %s", cudaGetErrorString(e));
    return launch_check(c, "attention_decode");
}

static bool decode_args_ok(const rope_qkv_args *a, int n_splits)
{
    const int nh = a->n_heads, nkv = a->n_kv_heads, hd = a->head_dim;
    return a->qkv && a->k_cache && a->v_cache && a->pos0 && a->cos && a->sin && a->n == 1 && nh > 0 && nkv > 0 &&
           nh % nkv == 0 && hd > 0 && hd <= 256 && hd % 8 == 0 && (!a->q_norm) == (!a->k_norm) && n_splits >= 1 &&
           n_splits <= DEC_MAX_SPLITS;
}

extern "C" int launch_attention_decode(launch_ctx *c, const rope_qkv_args *a, float *out, int window, int n_splits)
{
    if (!out || !decode_args_ok(a, n_splits))
        return launch_fail(c, "attention_decode: bad arguments (n %d, heads %d/%d, head_dim %d (a multiple of 8 up "
                              "to 256), %d splits)",
                           a->n, a->n_heads, a->n_kv_heads, a->head_dim, n_splits);
    DISPATCH_TYPE(a->kvt, T, return run_decode<T, false>(c, out, a, NULL, window, n_splits));
    return 0;
}

/* Whether the folded projection takes these shapes, and its shared memory fits the device (configure). */
extern "C" bool attention_decode_o_fits(launch_ctx *c, const rope_qkv_args *a, const attn_o_args *o, int n_splits)
{
    if (!decode_args_ok(a, n_splits) || !o->w || !o->absmax || !o->code || !o->x || !o->part || !o->count ||
        o->dim <= 0 || o->group < 32 || (o->group & (o->group - 1)))
        return false;
    const int G = a->n_heads / a->n_kv_heads, C = G * a->head_dim, qd = a->n_heads * a->head_dim;
    if (C % 32 || 32 % (C / 32) || C % o->group || qd % o->group || n_splits > DEC_O_COUNTS)
        return false;
    cudaLaunchConfig_t cfg;
    cudaLaunchAttribute attr[2];
    long chunk = 0;
    int sp = 0;
    switch (a->kvt) {
    case K_F16: sp = configure<__half, true>(c, a, o, n_splits, &cfg, attr, &chunk); break;
    case K_BF16: sp = configure<__nv_bfloat16, true>(c, a, o, n_splits, &cfg, attr, &chunk); break;
    default: break;
    }
    return sp > 0;
}

extern "C" int launch_attention_decode_o(launch_ctx *c, const rope_qkv_args *a, const attn_o_args *o, int window,
                                         int n_splits)
{
    if (!attention_decode_o_fits(c, a, o, n_splits))
        return launch_fail(c, "attention_decode_o: unsupported shape (heads %d/%d, head_dim %d, dim %d, group %d, "
                              "%d splits)",
                           a->n_heads, a->n_kv_heads, a->head_dim, o->dim, o->group, n_splits);
    switch (a->kvt) {
    case K_F16: return run_decode<__half, true>(c, NULL, a, o, window, n_splits);
    case K_BF16: return run_decode<__nv_bfloat16, true>(c, NULL, a, o, window, n_splits);
    default: break;
    }
    return launch_fail(c, "attention_decode_o: cache type %d", (int)a->kvt);
}
