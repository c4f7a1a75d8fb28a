/*
 * attention_decode.cu: attention of one new token against the KV cache
 * (decode), with the rope_qkv step folded in, flash-decoding style: one
 * query gives little parallelism, so the keys of each kv head are split
 * among blocks; each block keeps a running max, sum and unnormalised
 * output per q head in shared memory, and the blocks' results are merged
 * without a second kernel (with a separate combine launch this op cost
 * about 12 us a layer in the decode of a 1B model, far more than its keys
 * take to read). Two merges, one kernel template (paths.cu chooses):
 *
 * - Hopper (CLUSTER): the splits of a kv head are a thread-block cluster
 *   and merge through distributed shared memory; no partial result goes
 *   through global memory.
 * - Portable (compute capability 7.5): each block writes its partial
 *   result to global memory and counts itself in on its kv head's
 *   counter; the last block to arrive merges them (L2 round trips instead
 *   of shared memory, and that block's tail instead of the cluster's).
 *
 * The cluster merge is pushed, not pulled: each block owns a slice of the outputs,
 * and every block stores its max, sum and accumulator slice into the
 * owner's shared memory with st.async, which counts the bytes on the
 * owner's mbarrier. An owner waits for its bytes, merges and exits. No
 * cluster barrier follows the keys (cluster.sync()'s release put a
 * GPU-wide fence there), no round trip of remote loads, and no exit
 * barrier: nobody reads another block's memory, a block leaves only after
 * every store aimed at it has landed, and st.async takes its data from
 * registers, so a sender need not wait for its stores. (H100, against the
 * pulled merge: 8B nf4-dq +1.3%, 1B nf4 +2.7%, 8B int8 +0.7%. A first
 * version that had each output's thread turn all 16 splits' (max, sum)
 * into weights itself was 0.7% slower on the 8B: the weights are a warp's
 * work, a lane per split.)
 *
 * The kernel is a programmatic dependent of the q/k/v product: the cache
 * rows it reads (all but the new one) do not depend on that product, so
 * their copy into shared memory is issued before dependency_wait() and
 * overlaps the product's tail. The position is read from device memory so
 * the decode graph can be replayed at every position.
 *
 * Keys are read by position: at row key, or key % ring where the layer's
 * cache is a sliding window's ring (rope_qkv_args.ring, kv_row).
 *
 * Keys and values move in 16-byte granules (4-byte copies ran at a few
 * GB/s per multiprocessor), stored with granule g of row k at g ^ (k % 8)
 * so that eight threads reading the same granule of eight rows touch all
 * 32 banks once.
 */
#include "attention_decode.cuh"

#define DEC_CHUNK_MAX 128 /* keys staged in shared memory at a time */
#define DEC_SMEM_TARGET (96 * 1024)
#define DEC_SPLIT_KEYS 64 /* keys a split of the portable merge takes at least (bar the last) */

/* 16 bytes from global to shared memory: asynchronous from sm_80 (cp.async), a plain load and store before. */
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem)
{
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(smem)), "l"(gmem) : "memory");
#else
    *static_cast<uint4 *>(smem) = __ldcg(static_cast<const uint4 *>(gmem));
#endif
}
/* 4 bytes likewise (an int8/fp8 row's scale). */
__device__ __forceinline__ void cp_async4(void *smem, const void *gmem)
{
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem_addr(smem)), "l"(gmem) : "memory");
#else
    *static_cast<float *>(smem) = __ldcg(static_cast<const float *>(gmem));
#endif
}
__device__ __forceinline__ void cp_async_commit()
{
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
/* Wait until at most N committed groups of this thread are still in flight. */
template <int N> __device__ __forceinline__ void cp_async_wait()
{
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

#if __CUDA_ARCH__ >= 900 || !defined(__CUDA_ARCH__)
#define DEC_HAVE_CLUSTERS 1
/* A shared-memory address in the block of the given cluster rank. */
__device__ __forceinline__ unsigned cluster_addr(unsigned a, int rank)
{
    unsigned r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
    return r;
}
/* Stores into another block's shared memory, counted on its mbarrier `bar` (both cluster addresses). */
__device__ __forceinline__ void push4(unsigned dst, float4 v, unsigned bar)
{
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(dst),
                 "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "r"(bar)
                 : "memory");
}
__device__ __forceinline__ void push2(unsigned dst, float a, float b, unsigned bar)
{
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];" ::"r"(dst), "f"(a),
                 "f"(b), "r"(bar)
                 : "memory");
}
#else
#define DEC_HAVE_CLUSTERS 0
#endif

/*
 * How the outputs of a kv head (G x hd) are shared among the cluster's
 * blocks for the merge: block r merges outputs [r * per, r * per + per),
 * and each sender's row in an owner's buffer holds that slice of its
 * accumulator, then its (max, sum) per head, padded to 16 bytes.
 */
struct dec_merge {
    int per, stride;
    __host__ __device__ dec_merge(int g, int hd, int splits)
    {
        per = ((g * hd + splits - 1) / splits + 3) & ~3;
        stride = per + ((2 * g + 3) & ~3);
    }
    /* A bound on splits x stride for every split count (the buffer's size). */
    static __host__ __device__ size_t floats(int g, int hd) { return (size_t)g * hd + (size_t)DEC_MAX_SPLITS * (2 * g + 8); }
};


/*
 * Shared memory, in order (16-byte aligned first): two buffers of K and V
 * chunks [chunk][hb] granules, the new k and v rows [2][hd] (in the cache
 * type; fp32 for int8/fp8, which quantize them from there); then fp32: the
 * cluster merge's buffer (dec_merge; none in the portable merge), per q
 * head of the group q [G][hd] and the output accumulator [G][hd], scores
 * [G][chunk], max, sum and correction [G], and for int8/fp8 the two
 * buffers' K and V row scales [2][chunk] each.
 */
struct dec_smem {
    /* es: bytes an element; quant: int8/fp8 */
    static __host__ __device__ size_t fixed_bytes(int g, int hd, int es, bool quant, bool cluster)
    {
        return ((cluster ? dec_merge::floats(g, hd) : 0) + (size_t)2 * g * hd + 3 * g) * 4 +
               2 * (size_t)hd * (quant ? 4 : es);
    }
    static __host__ __device__ size_t key_bytes(int g, int hd, int es, bool quant)
    {
        return (size_t)4 * hd * es + 4 * g + (quant ? 16 : 0);
    }
};


/* RING: the cache is a sliding window's ring (a kernel of its own, so that the others' code stays as tuned). */
template <typename T, bool CLUSTER, bool RING>
__global__ void __launch_bounds__(DEC_THREADS) k_attention_decode(float *out, rope_qkv_args a, int window, int chunk)
{
    constexpr int EL = 16 / sizeof(T); /* elements per granule */
    extern __shared__ uint4 sm[];
    /* A kv head's splits are blockIdx.x (a cluster spans them: its rank is blockIdx.x too). */
    const int split = blockIdx.x, kvh = blockIdx.y;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, warps = DEC_THREADS / 32;
    const int nh = a.n_heads, nkv = a.n_kv_heads, hd = a.head_dim, G = nh / nkv, kvd = nkv * hd;
    const int hb = hd / EL, swz = hb % 8 == 0 ? 7 : 0; /* granules a row; the swizzle mask */
    constexpr bool QUANT = kv_quant<T>();
    uint4 *kbuf = sm, *vbuf = kbuf + (size_t)2 * chunk * hb, *nrow = vbuf + (size_t)2 * chunk * hb;
    float *recv = reinterpret_cast<float *>(nrow + (QUANT ? hd / 2 : 2 * hb));
    float *qs = recv + (CLUSTER ? dec_merge::floats(G, hd) : 0);
    float *os = qs + G * hd, *sc = os + G * hd, *ms = sc + G * chunk, *ls = ms + G, *cr = ls + G;
    float *ksm = cr + G, *vsm = ksm + 2 * chunk; /* int8/fp8: row scales of the two buffers */
#if DEC_HAVE_CLUSTERS
    __shared__ uint64_t merged; /* the merge's bytes for this block have arrived */
#endif
    const T *kc = static_cast<const T *>(a.k_cache), *vc = static_cast<const T *>(a.v_cache);

    const int pos = *a.pos0; /* copied in before the graph's first kernel */
    const int lo0 = window > 0 ? max(0, pos - window + 1) : 0, len = pos + 1 - lo0;
    /* The portable merge costs a round trip through L2 per split: only as
     * many splits work as there are DEC_SPLIT_KEYS keys for (the others
     * leave at once), and a lone one writes the output itself. */
    const int splits = CLUSTER ? (int)gridDim.x : min((int)gridDim.x, (len + DEC_SPLIT_KEYS - 1) / DEC_SPLIT_KEYS);
    if (split >= splits)
        return;
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
            const size_t at = (size_t)kv_row(key, RING ? a.ring : 0) * kvd + (size_t)kvh * hd + (size_t)c * EL;
            const int to = k * hb + (c ^ (k & swz));
            cp_async16(kb + to, kc + at);
            cp_async16(vb + to, vc + at);
        }
        /* (Braces: without them nvcc 13 dropped the commit below from the
         * kernels where QUANT is false, as if it belonged to the discarded
         * branch; their waits then waited for nothing.) */
        if constexpr (QUANT) {
            for (int k = tid; k < nk; k += DEC_THREADS) {
                const int key = c0 + k;
                if (key == pos && c0 == lo)
                    continue;
                const size_t at = (size_t)kv_row(key, RING ? a.ring : 0) * nkv + kvh;
                cp_async4(ksm + b * chunk + k, a.k_scale + at);
                cp_async4(vsm + b * chunk + k, a.v_scale + at);
            }
        }
        cp_async_commit();
    };
    if (lo < end)
        load_chunk(lo, 0);
    for (int i = tid; i < G * hd; i += DEC_THREADS)
        os[i] = 0.0f;
    for (int g = tid; g < G; g += DEC_THREADS) {
        ms[g] = -INFINITY;
        ls[g] = 0.0f;
    }
    const dec_merge mg(G, hd, splits);
    const int n_out = G * hd, my0 = split * mg.per, my_n = max(0, min(mg.per, n_out - my0));
#if DEC_HAVE_CLUSTERS
    if constexpr (CLUSTER) {
        if (tid == 0) { /* each block sends an owner its slice and its (max, sum) pairs; past the last owner, nothing */
            mbar_init(&merged, 1);
            mbar_expect(&merged, splits > 1 && my_n > 0 ? (unsigned)(splits * (my_n * 4 + G * 8)) : 0u);
            asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        }
        asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory"); /* waited on before the first push */
    }
#endif
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
                             hd, rope_rot(a), true);
            continue;
        }
        const int is_v = t - G;
        const size_t src = (size_t)(nh + (is_v ? nkv : 0) + kvh) * hd;
        const size_t pr = (size_t)kv_row(pos, RING ? a.ring : 0); /* the new row's place in the cache */
        T *row = static_cast<T *>(is_v ? a.v_cache : a.k_cache) + pr * kvd + (size_t)kvh * hd;
        uint4 *cache = reinterpret_cast<uint4 *>(row), *stage = cache;
        const int k = pos - lo;
        if constexpr (QUANT) { /* fp32 first, then the codes and the scale into the cache */
            float *f = reinterpret_cast<float *>(nrow) + is_v * hd;
            rope_head<float>(f, a.qkv + src, a.bias ? a.bias + src : NULL, is_v ? NULL : a.k_norm, a.eps, a.cos,
                             a.sin, pos, hd, rope_rot(a), !is_v);
            __syncwarp();
            const float scale = kv_quantize_row<T>(row, f, hd);
            if (lane == 0) {
                (is_v ? a.v_scale : a.k_scale)[pr * nkv + kvh] = scale;
                if (new_in_first)
                    (is_v ? vsm : ksm)[k] = scale;
            }
            __syncwarp(); /* the codes are read back below */
        } else {
            stage = nrow + is_v * hb;
            rope_head<T>(reinterpret_cast<T *>(stage), a.qkv + src, a.bias ? a.bias + src : NULL,
                         is_v ? NULL : a.k_norm, a.eps, a.cos, a.sin, pos, hd, rope_rot(a), !is_v);
            __syncwarp();
        }
        for (int c = lane; c < hb; c += 32) {
            const uint4 g = stage[c];
            if constexpr (!QUANT)
                cache[c] = g;
            if (new_in_first)
                (is_v ? vbuf : kbuf)[k * hb + (c ^ (k & swz))] = g;
        }
    }
    __syncthreads(); /* the new rows are in the cache before a later chunk reads them */

    /* The score scale (Granite's and Gemma's own, else 1/sqrt(head_dim)) and Gemma 2's soft cap. */
    const float scale = a.score_scale > 0.0f ? a.score_scale : rsqrtf((float)hd), cap = a.softcap;
    /* Value sums: a warp takes PW = 32 / S (head, granule) pairs, each in S
     * key slices (lane = slice x PW + pair; a slice takes every S-th key),
     * and sums the slices with shuffles: no block barrier, no buffer. A
     * warp's reads touch S rows of PW granules: distinct swizzled banks.
     * S is the most slices that fit the block's threads (H200: better
     * than half or a quarter of that, or twice with two pairs a thread). */
    const int pairs = G * hb;
    int S = 1;
    while (S < 32 && pairs * S * 2 <= DEC_THREADS)
        S *= 2;
    const int PW = 32 / S, vthreads = (pairs + PW - 1) / PW * 32; /* whole warps */
    for (int c0 = lo, b = 0; c0 < end; c0 += chunk, b ^= 1) {
        const int nk = min(chunk, end - c0);
        const uint4 *kb = kbuf + (size_t)b * chunk * hb, *vb = vbuf + (size_t)b * chunk * hb;
        if (c0 + chunk < end) { /* the next chunk streams in while this one is used */
            load_chunk(c0 + chunk, b ^ 1);
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
            float mult = scale;
            if constexpr (QUANT)
                mult *= kv_mult<T>(ksm[b * chunk + k]);
            sc[g * chunk + k] = soft_cap((d0 + d1) * mult, cap);
        }
        __syncthreads();

        /* Online softmax: a warp per head turns scores into weights. */
        for (int g = warp; g < G; g += warps)
            warp_softmax_step(sc + g * chunk, nk, ms, ls, cr, g);
        __syncthreads();

        /* Weighted values by key slices, the slices summed into os. */
        for (int t = tid; t < vthreads; t += DEC_THREADS) {
            const int sl = lane / PW, r = (t >> 5) * PW + lane % PW;
            const bool live = r < pairs;
            const int g = live ? r / hb : 0, c = live ? r - g * hb : 0;
            const float *p = sc + g * chunk;
            float acc[EL];
#pragma unroll
            for (int e = 0; e < EL; e++)
                acc[e] = 0.0f;
#pragma unroll 2
            for (int k = sl; live && k < nk; k += S) {
                float f[EL];
                granule_f32<T>(vb[(size_t)k * hb + (c ^ (k & swz))], f);
                float pk = p[k];
                if constexpr (QUANT)
                    pk *= kv_mult<T>(vsm[b * chunk + k]);
#pragma unroll
                for (int e = 0; e < EL; e++)
                    acc[e] += pk * f[e];
            }
            for (int off = PW; off < 32; off <<= 1)
#pragma unroll
                for (int e = 0; e < EL; e++)
                    acc[e] += __shfl_xor_sync(0xffffffffu, acc[e], off);
            if (live && sl == 0)
#pragma unroll
                for (int e = 0; e < EL; e++)
                    os[g * hd + c * EL + e] = os[g * hd + c * EL + e] * cr[g] + acc[e];
        }
        __syncthreads(); /* before the buffer is refilled and sc is overwritten */
    }

    if constexpr (!CLUSTER) {
        merge_global(out, a, split, splits, kvh, G, hd, os, ms, ls, sc);
        return;
    }
#if DEC_HAVE_CLUSTERS
    /* Push this block's share to every owner: its accumulator's slice in
     * 16-byte pieces, and its (max, sum) for every head. st.async needs a
     * cluster of two blocks or more (compute-sanitizer reports a store in
     * a cluster of one as invalid), so a lone block stores to its own
     * shared memory and passes a block barrier instead of the mbarrier. */
    const bool alone = splits == 1;
    asm volatile("barrier.cluster.wait.aligned;" ::: "memory"); /* every block's mbarrier is set up */
    const int owners = (n_out + mg.per - 1) / mg.per, quads = mg.per / 4, items = quads + G;
    for (int t = tid; t < owners * items; t += DEC_THREADS) {
        const int r = t / items, i = t - r * items;
        const unsigned bar = cluster_addr(smem_addr(&merged), r);
        float *row = recv + (size_t)split * mg.stride;
        if (i < quads) {
            const int o = r * mg.per + 4 * i;
            if (o < n_out) {
                const float4 v = *reinterpret_cast<const float4 *>(os + o);
                if (alone)
                    *reinterpret_cast<float4 *>(row + 4 * i) = v;
                else
                    push4(cluster_addr(smem_addr(row + 4 * i), r), v, bar);
            }
        } else {
            const int g = i - quads;
            if (alone) {
                row[mg.per + 2 * g] = ms[g];
                row[mg.per + 2 * g + 1] = ls[g];
            } else {
                push2(cluster_addr(smem_addr(row + mg.per + 2 * g), r), ms[g], ls[g], bar);
            }
        }
    }
    if (alone)
        __syncthreads();

    /* Merge this block's outputs once every split's share has arrived: a
     * warp per head of the slice turns the splits' (max, sum) into weights
     * (a lane per split; a split with no keys sent max -inf: weight 0),
     * then a thread per output sums the splits' slices. The weights go
     * where the scores were (G x chunk floats, chunk >= DEC_MAX_SPLITS). */
    mbar_wait(&merged, 0);
    float *wt = sc;
    const int g0 = my0 / hd, ng = my_n > 0 ? (my0 + my_n - 1) / hd - g0 + 1 : 0;
    for (int j = warp; j < ng; j += warps) {
        const float *pair = recv + (size_t)lane * mg.stride + mg.per + 2 * (g0 + j);
        const float w = split_weight(lane < splits ? pair[0] : -INFINITY, lane < splits ? pair[1] : 0.0f);
        if (lane < splits)
            wt[j * DEC_MAX_SPLITS + lane] = w;
    }
    __syncthreads();
    float omx = 0.0f; /* for out_max */
    for (int t = tid; t < my_n; t += DEC_THREADS) {
        const float *w = wt + ((my0 + t) / hd - g0) * DEC_MAX_SPLITS;
        float num = 0.0f;
#pragma unroll
        for (int s = 0; s < DEC_MAX_SPLITS; s++)
            if (s < splits)
                num += w[s] * recv[(size_t)s * mg.stride + t];
        out[(size_t)kvh * n_out + my0 + t] = num;
        omx = fmaxf(omx, fabsf(num));
    }
    post_out_max(a.out_max, omx); /* the output projection stages its input knowing this */
#endif
}

template <typename T>
static int run_decode(launch_ctx *c, float *out, const rope_qkv_args *a, int window, int splits)
{
    const int G = a->n_heads / a->n_kv_heads, hd = a->head_dim, es = (int)sizeof(T);
    /* As many keys a chunk as fit the target, at least 16 (then past it),
     * or where 16 exceed the block's limit (an fp32 cache at head_dim 256
     * on Turing's 64 KiB: 71,832 bytes for a group of 2) as many as fit,
     * with no more splits than keys a chunk: the portable merge keeps its
     * G x splits weights in the G x chunk scores' room. */
    const bool cluster = c->fast[K_OP_ATTN_CLUSTER], quant = kv_quant<T>();
    if (quant && (hd % 16 || !a->k_scale || !a->v_scale))
        return launch_fail(c, "attention_decode: an int8/fp8 cache needs head_dim a multiple of 16 (%d) and scales",
                           hd);
    const size_t fixed = dec_smem::fixed_bytes(G, hd, es, quant, cluster),
                 per_key = dec_smem::key_bytes(G, hd, es, quant);
    const long target = c->smem_max < DEC_SMEM_TARGET ? (long)c->smem_max : DEC_SMEM_TARGET;
    long chunk = (target - (long)fixed) / (long)per_key;
    chunk = chunk > DEC_CHUNK_MAX ? DEC_CHUNK_MAX : chunk;
    if (chunk < 16) {
        const long fit = ((long)c->smem_max - (long)fixed) / (long)per_key;
        chunk = fit >= 16 ? 16 : fit < 1 ? 1 : fit;
    }
    if (!cluster && splits > chunk)
        splits = (int)chunk;
    const size_t smem = fixed + (size_t)chunk * per_key;
    if (smem > c->smem_max || (cluster && chunk < 16))
        return launch_fail(c, "attention_decode: %zu bytes of shared memory (group %d, head_dim %d), %zu here", smem,
                           G, hd, c->smem_max);
    auto kern = a->ring > 0 ? (cluster ? k_attention_decode<T, true, true> : k_attention_decode<T, false, true>)
                            : (cluster ? k_attention_decode<T, true, false> : k_attention_decode<T, false, false>);
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
    cfg.attrs = attr;
    if (c->fast[K_OP_PDL]) {
        attr[cfg.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[cfg.numAttrs++].val.programmaticStreamSerializationAllowed = 1;
    }
    cudaLaunchAttribute *cl = &attr[cfg.numAttrs];
    if (cluster) {
        cl->id = cudaLaunchAttributeClusterDimension;
        cl->val.clusterDim.x = (unsigned)splits;
        cl->val.clusterDim.y = 1;
        cl->val.clusterDim.z = 1;
        cfg.numAttrs++;
    } else if (!a->part || !a->count || (uintptr_t)a->part % 16) {
        return launch_fail(c, "attention_decode: the portable merge needs its partial results and counters");
    }
    if (cluster && splits > 8) { /* a non-portable cluster size: where the device cannot hold one, 8 */
        int clusters = 0;
        if (cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess ||
            cudaOccupancyMaxActiveClusters(&clusters, kern, &cfg) != cudaSuccess || clusters < 1) {
            (void)cudaGetLastError();
            splits = 8;
            cfg.gridDim.x = cl->val.clusterDim.x = 8;
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
        n_splits > DEC_MAX_SPLITS || a->rotary_dim < 0 || a->rotary_dim > hd || a->rotary_dim % 2 ||
        a->score_scale < 0.0f || a->softcap < 0.0f)
        return launch_fail(c, "attention_decode: bad arguments (n %d, heads %d/%d, head_dim %d (a multiple of 8 up "
                              "to 256), %d splits)",
                           a->n, nh, nkv, hd, n_splits);
    DISPATCH_KV(a->kvt, T, return run_decode<T>(c, out, a, window, n_splits));
    return 0;
}
