/*
 * attention_decode.cu: attention of one new token against the KV cache
 * (decode), with the rope_qkv step folded in, flash-decoding style: one
 * query gives little parallelism, so the keys of each kv head are split
 * among the blocks of a thread-block cluster. Within a block each warp
 * takes a share of the keys and keeps its running max, sum and
 * unnormalised output per q head in registers (scores, softmax and values
 * with no barrier between them: as three block-wide phases they took about
 * 3.3 us of a 8B layer's 11 in place); the warps' states merge in shared
 * memory, and the blocks' through distributed shared memory. No partial results
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

#include "rope.cuh"

namespace cg = cooperative_groups;

#define DEC_THREADS 256
#define DEC_MAX_SPLITS 16 /* blocks in a cluster; above 8 needs non-portable cluster sizes */
#define DEC_CHUNK_MAX 128 /* keys staged in shared memory at a time */
#define DEC_SMEM_TARGET (96 * 1024)

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(smem)), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
/* Wait until at most N committed groups of this thread are still in flight. */
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

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

#define DEC_WARPS (DEC_THREADS / 32)
#define DEC_GH 4 /* q heads a warp carries in registers at once (a "pass" over the keys) */
#define DEC_R 2  /* key rows a warp loads and scores at once */

/*
 * Warps a pass: the group's heads go DEC_GH at a time, and each pass's key
 * rows are shared out among this many warps (1 where the passes outnumber
 * the warps: each warp then takes several passes, one after the other).
 */
static __host__ __device__ __forceinline__ int dec_warps_per_pass(int g)
{
    const int passes = (g + DEC_GH - 1) / DEC_GH;
    return passes >= DEC_WARPS ? 1 : DEC_WARPS / passes;
}

/*
 * Shared memory, in order (16-byte aligned first): two buffers of K and V
 * chunks [chunk][hb] granules, the new k and v rows [2][hb]; then fp32: q
 * of each head of the group [G][hd], the block's output accumulator
 * [G][hd], each warp's partial state [G][WP] x (accumulator [hd], max,
 * sum), the block's max and sum [G], the merge's weights
 * [DEC_MAX_SPLITS][G].
 */
struct dec_smem {
    static __host__ __device__ size_t fixed_bytes(int g, int hd, int es)
    {
        const size_t wp = (size_t)dec_warps_per_pass(g);
        return ((size_t)2 * g * hd + g * wp * (hd + 2) + 2 * g + DEC_MAX_SPLITS * g) * 4 + 2 * (size_t)hd * es;
    }
    static __host__ __device__ size_t key_bytes(int hd, int es) { return (size_t)4 * hd * es; }
};

/*
 * The keys of one chunk, one warp's share, for the DEC_GH heads of one
 * pass, entirely in registers: no barrier between scores, softmax and
 * values. A key's row is spread over LK lanes (a segment), a granule or
 * two a lane; a warp holds 32 / LK keys at once. Each lane keeps q and the
 * running max, sum and weighted values of its segment for its granules;
 * the segments merge through shuffles at the end, and the result goes to
 * the warp's slot (continued from there by the next chunk). Scores are in
 * log2 units (q carries log2(e)), so the exponentials are exp2f.
 */
template <typename T, int GPL> struct dec_lane {
    static constexpr int EL = 16 / sizeof(T), E = GPL * EL; /* elements a lane */
    float q[DEC_GH][E], acc[DEC_GH][E], m[DEC_GH], l[DEC_GH];

    /* Merge in the state of the lane `o` apart (a shuffle), head by head. */
    __device__ __forceinline__ void merge_xor(int o)
    {
#pragma unroll
        for (int g = 0; g < DEC_GH; g++) {
            const float mo = __shfl_xor_sync(0xffffffffu, m[g], o), lo = __shfl_xor_sync(0xffffffffu, l[g], o);
            const float mn = fmaxf(m[g], mo);
            const float a = m[g] == -INFINITY ? 0.0f : exp2f(m[g] - mn), b = mo == -INFINITY ? 0.0f : exp2f(mo - mn);
            l[g] = l[g] * a + lo * b;
            m[g] = mn;
#pragma unroll
            for (int e = 0; e < E; e++)
                acc[g][e] = acc[g][e] * a + __shfl_xor_sync(0xffffffffu, acc[g][e], o) * b;
        }
    }
};

template <typename T, int GPL>
__device__ __forceinline__ void dec_chunk(const uint4 *kb, const uint4 *vb, int nk, bool first, const float *qs,
                                          float *pacc, float *pm, float *pl, int G, int hd, int hb, int swz,
                                          float qscale)
{
    typedef dec_lane<T, GPL> L;
    constexpr int EL = L::EL, E = L::E;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int LK = hb >= 32 ? 32 : 1 << (32 - __clz(hb - 1)), KPW = 32 / LK, seg = lane / LK, sl = lane % LK;
    const int passes = (G + DEC_GH - 1) / DEC_GH, WP = dec_warps_per_pass(G), sub = warp % WP;
    const int rows = (nk + KPW - 1) / KPW;
    for (int p = warp / WP; p < passes; p += DEC_WARPS / WP) {
        const int g0 = p * DEC_GH;
        L st;
        /* q of the pass's heads at this lane's granules; the state: empty, or
         * (segment 0) what the previous chunk left in the slot. */
#pragma unroll
        for (int g = 0; g < DEC_GH; g++) {
            const bool from_slot = !first && seg == 0 && g0 + g < G;
            const int slot = (g0 + g) * WP + sub;
            st.m[g] = from_slot ? pm[slot] : -INFINITY;
            st.l[g] = from_slot ? pl[slot] : 0.0f;
#pragma unroll
            for (int j = 0; j < GPL; j++) {
                const int c = sl + 32 * j;
                const bool ok = g0 + g < G && c < hb;
#pragma unroll
                for (int e = 0; e < EL; e += 4) {
                    const float4 qv = ok ? *reinterpret_cast<const float4 *>(qs + (g0 + g) * hd + c * EL + e)
                                         : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                    const float4 av = ok && from_slot ? *reinterpret_cast<const float4 *>(pacc + (size_t)slot * hd + c * EL + e)
                                                      : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                    st.q[g][j * EL + e] = qv.x * qscale, st.q[g][j * EL + e + 1] = qv.y * qscale;
                    st.q[g][j * EL + e + 2] = qv.z * qscale, st.q[g][j * EL + e + 3] = qv.w * qscale;
                    st.acc[g][j * EL + e] = av.x, st.acc[g][j * EL + e + 1] = av.y;
                    st.acc[g][j * EL + e + 2] = av.z, st.acc[g][j * EL + e + 3] = av.w;
                }
            }
        }
        /* Rows sub, sub + WP, ...: DEC_R of them at once, their K and V loads all in flight. */
        for (int r0 = sub; r0 < rows; r0 += WP * DEC_R) {
            uint4 kg[DEC_R][GPL], vg[DEC_R][GPL];
            bool ok[DEC_R];
#pragma unroll
            for (int r = 0; r < DEC_R; r++) {
                const int k = (r0 + r * WP) * KPW + seg;
                ok[r] = r0 + r * WP < rows && k < nk;
#pragma unroll
                for (int j = 0; j < GPL; j++) {
                    const int c = sl + 32 * j;
                    const bool in = ok[r] && c < hb;
                    kg[r][j] = in ? kb[(size_t)k * hb + (c ^ (k & swz))] : make_uint4(0, 0, 0, 0);
                    vg[r][j] = in ? vb[(size_t)k * hb + (c ^ (k & swz))] : make_uint4(0, 0, 0, 0);
                }
            }
            float s[DEC_R][DEC_GH];
#pragma unroll
            for (int r = 0; r < DEC_R; r++) {
                float f[E];
#pragma unroll
                for (int j = 0; j < GPL; j++)
                    granule_f32<T>(kg[r][j], f + j * EL);
#pragma unroll
                for (int g = 0; g < DEC_GH; g++) {
                    float d0 = 0.0f, d1 = 0.0f;
#pragma unroll
                    for (int e = 0; e < E; e += 2) {
                        d0 += st.q[g][e] * f[e];
                        d1 += st.q[g][e + 1] * f[e + 1];
                    }
                    s[r][g] = d0 + d1;
                }
            }
            for (int o = LK / 2; o > 0; o >>= 1)
#pragma unroll
                for (int r = 0; r < DEC_R; r++)
#pragma unroll
                    for (int g = 0; g < DEC_GH; g++)
                        s[r][g] += __shfl_xor_sync(0xffffffffu, s[r][g], o);
#pragma unroll
            for (int g = 0; g < DEC_GH; g++) {
                float mx = -INFINITY;
#pragma unroll
                for (int r = 0; r < DEC_R; r++)
                    mx = ok[r] ? fmaxf(mx, s[r][g]) : mx;
                const float mn = fmaxf(st.m[g], mx);
                const float corr = st.m[g] == -INFINITY ? 0.0f : exp2f(st.m[g] - mn);
                float pr[DEC_R], sum = 0.0f;
#pragma unroll
                for (int r = 0; r < DEC_R; r++) {
                    pr[r] = ok[r] ? exp2f(s[r][g] - mn) : 0.0f;
                    sum += pr[r];
                }
                st.l[g] = st.l[g] * corr + sum;
                st.m[g] = mn;
#pragma unroll
                for (int e = 0; e < E; e++)
                    st.acc[g][e] *= corr;
#pragma unroll
                for (int r = 0; r < DEC_R; r++) {
                    float f[E];
#pragma unroll
                    for (int j = 0; j < GPL; j++)
                        granule_f32<T>(vg[r][j], f + j * EL);
#pragma unroll
                    for (int e = 0; e < E; e++)
                        st.acc[g][e] += pr[r] * f[e];
                }
            }
        }
        /* The warp's segments into one state, then into the slot. */
        for (int o = LK; o < 32; o <<= 1)
            st.merge_xor(o);
        if (seg == 0)
#pragma unroll
            for (int g = 0; g < DEC_GH; g++) {
                if (g0 + g >= G)
                    break;
                const int slot = (g0 + g) * WP + sub;
                if (sl == 0) {
                    pm[slot] = st.m[g];
                    pl[slot] = st.l[g];
                }
#pragma unroll
                for (int j = 0; j < GPL; j++) {
                    const int c = sl + 32 * j;
                    if (c < hb)
#pragma unroll
                        for (int e = 0; e < EL; e += 4)
                            *reinterpret_cast<float4 *>(pacc + (size_t)slot * hd + c * EL + e) =
                                make_float4(st.acc[g][j * EL + e], st.acc[g][j * EL + e + 1],
                                            st.acc[g][j * EL + e + 2], st.acc[g][j * EL + e + 3]);
                }
            }
    }
}

template <typename T>
__global__ void __launch_bounds__(DEC_THREADS, 2) k_attention_decode(float *out, rope_qkv_args a, int window, int chunk)
{
    constexpr int EL = 16 / sizeof(T); /* elements per granule */
    extern __shared__ uint4 sm[];
    cg::cluster_group cluster = cg::this_cluster();
    const int split = (int)cluster.block_rank(), splits = (int)cluster.num_blocks(), kvh = blockIdx.y;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, warps = DEC_WARPS;
    const int nh = a.n_heads, nkv = a.n_kv_heads, hd = a.head_dim, G = nh / nkv, kvd = nkv * hd;
    const int hb = hd / EL, swz = hb % 8 == 0 ? 7 : 0; /* granules a row; the swizzle mask */
    const int WP = dec_warps_per_pass(G);
    uint4 *kbuf = sm, *vbuf = kbuf + (size_t)2 * chunk * hb, *nrow = vbuf + (size_t)2 * chunk * hb;
    float *qs = reinterpret_cast<float *>(nrow + 2 * hb), *os = qs + G * hd, *pacc = os + G * hd;
    float *pm = pacc + (size_t)G * WP * hd, *pl = pm + G * WP, *ms = pl + G * WP, *ls = ms + G, *wt = ls + G;
    const T *kc = static_cast<const T *>(a.k_cache), *vc = static_cast<const T *>(a.v_cache);

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
    dependents_may_launch(); /* the output projection may start loading its weights */
    dependency_wait();       /* the q/k/v product is complete */

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

    if (has_new && !new_in_first)
        __syncthreads(); /* the new rows are in the cache before the later chunk that holds them is copied */

    const float qscale = rsqrtf((float)hd) * 1.4426950408889634f; /* log2(e): the scores in log2 units */
    for (int c0 = lo, b = 0; c0 < end; c0 += chunk, b ^= 1) {
        const int nk = min(chunk, end - c0);
        if (c0 + chunk < end) { /* the next chunk streams in while this one is used */
            load_chunk(c0 + chunk, b ^ 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads(); /* the chunk, q and (the first time) the new rows are in place */
        const uint4 *kb = kbuf + (size_t)b * chunk * hb, *vb = vbuf + (size_t)b * chunk * hb;
        if (sizeof(T) == 4 && hb > 32) /* (16-bit rows up to head_dim 256 are at most 32 granules) */
            dec_chunk<T, sizeof(T) == 4 ? 2 : 1>(kb, vb, nk, c0 == lo, qs, pacc, pm, pl, G, hd, hb, swz, qscale);
        else
            dec_chunk<T, 1>(kb, vb, nk, c0 == lo, qs, pacc, pm, pl, G, hd, hb, swz, qscale);
        __syncthreads(); /* before the buffer is refilled; the slots are complete */
    }

    /* The warps' states into the block's: max, sum and accumulator per head. */
    for (int o = tid; o < G * hd; o += DEC_THREADS) {
        const int g = o / hd, d = o - g * hd;
        float mx = -INFINITY, sum = 0.0f, acc = 0.0f;
        if (lo < end) {
            for (int s = 0; s < WP; s++)
                mx = fmaxf(mx, pm[g * WP + s]);
            for (int s = 0; s < WP; s++) {
                const float m_s = pm[g * WP + s];
                const float w = m_s == -INFINITY ? 0.0f : exp2f(m_s - mx); /* -inf: a warp with no keys */
                sum += w * pl[g * WP + s];
                acc += w * pacc[(size_t)(g * WP + s) * hd + d];
            }
        }
        os[o] = acc;
        if (d == 0) {
            ms[g] = mx;
            ls[g] = sum;
        }
    }

    /* Merge the splits. A warp per head reads every block's max and sum
     * (a lane per block) and leaves the blocks' weights in wt; then block
     * `split` finishes every splits-th output of this kv head, its loads
     * from the others' accumulators all in flight. */
    cluster.sync();
    for (int g = warp; g < G; g += warps) {
        const float m_s = lane < splits ? cluster.map_shared_rank(ms, lane)[g] : -INFINITY;
        const float l_s = lane < splits ? cluster.map_shared_rank(ls, lane)[g] : 0.0f;
        const float mx = warp_max(m_s);
        const float w = m_s == -INFINITY ? 0.0f : exp2f(m_s - mx); /* -inf: a split with no keys */
        const float den = warp_sum(w * l_s);
        if (lane < splits)
            wt[lane * G + g] = w / den;
    }
    __syncthreads();
    float omx = 0.0f; /* for out_max */
    for (int o = split * DEC_THREADS + tid; o < G * hd; o += splits * DEC_THREADS) {
        const int g = o / hd;
        float part[DEC_MAX_SPLITS];
#pragma unroll
        for (int s = 0; s < DEC_MAX_SPLITS; s++)
            part[s] = s < splits ? cluster.map_shared_rank(os, s)[o] : 0.0f;
        float num = 0.0f;
#pragma unroll
        for (int s = 0; s < DEC_MAX_SPLITS; s++)
            if (s < splits)
                num += wt[s * G + g] * part[s];
        out[(size_t)kvh * G * hd + o] = num;
        omx = fmaxf(omx, fabsf(num));
    }
    if (a.out_max) { /* the output projection stages its input knowing this */
        omx = warp_max(omx);
        if (lane == 0 && omx > 0.0f)
            atomicMax(a.out_max, __float_as_uint(omx));
    }
    cluster.sync(); /* the others may still be reading this block's shared memory */
}

template <typename T>
static int run_decode(launch_ctx *c, float *out, const rope_qkv_args *a, int window, int splits)
{
    const int G = a->n_heads / a->n_kv_heads, hd = a->head_dim, es = (int)sizeof(T);
    /* As many keys a chunk as fit the target, at least 16 (then past it). */
    const size_t fixed = dec_smem::fixed_bytes(G, hd, es), per_key = dec_smem::key_bytes(hd, es);
    long chunk = ((long)DEC_SMEM_TARGET - (long)fixed) / (long)per_key;
    chunk = chunk < 16 ? 16 : chunk > DEC_CHUNK_MAX ? DEC_CHUNK_MAX : chunk;
    const size_t smem = fixed + (size_t)chunk * per_key;
    auto kern = k_attention_decode<T>;
    if (smem > 48 * 1024 &&
        cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess)
        return launch_fail(c, "attention_decode: %zu bytes of shared memory (group %d, head_dim %d): %s", smem, G, hd,
                           cudaGetErrorString(cudaGetLastError()));
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)splits, (unsigned)a->n_kv_heads);
    cfg.blockDim = dim3(DEC_THREADS);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = c->stream;
    cudaLaunchAttribute attr[2] = {};
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = (unsigned)splits;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[1].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 2;
    if (splits > 8) { /* a non-portable cluster size: where the device cannot hold one, 8 */
        int clusters = 0;
        if (cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess ||
            cudaOccupancyMaxActiveClusters(&clusters, kern, &cfg) != cudaSuccess || clusters < 1) {
            (void)cudaGetLastError();
            splits = 8;
            cfg.gridDim.x = attr[0].val.clusterDim.x = 8;
        }
    }
    const cudaError_t e = cudaLaunchKernelEx(&cfg, kern, out, *a, window, (int)chunk);
    if (e != cudaSuccess)
        return launch_fail(c, "attention_decode: %s", cudaGetErrorString(e));
    return launch_check(c, "attention_decode");
}

extern "C" int launch_attention_decode(launch_ctx *c, const rope_qkv_args *a, float *out, int window, int n_splits)
{
    const int nh = a->n_heads, nkv = a->n_kv_heads, hd = a->head_dim;
    if (!out || !a->qkv || !a->k_cache || !a->v_cache || !a->pos0 || !a->cos || !a->sin || a->n != 1 || nh <= 0 ||
        nkv <= 0 || nh % nkv || hd <= 0 || hd > 256 || hd % 8 || (!a->q_norm) != (!a->k_norm) || n_splits < 1 ||
        n_splits > DEC_MAX_SPLITS)
        return launch_fail(c, "attention_decode: bad arguments (n %d, heads %d/%d, head_dim %d (a multiple of 8 up "
                              "to 256), %d splits)",
                           a->n, nh, nkv, hd, n_splits);
    DISPATCH_TYPE(a->kvt, T, return run_decode<T>(c, out, a, window, n_splits));
    return 0;
}
