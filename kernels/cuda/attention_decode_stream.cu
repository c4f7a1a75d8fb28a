/*
 * attention_decode_stream.cu: decode attention at long context, where the
 * cache, not the weights, is most of what a token reads. The staged kernel
 * (attention_decode.cu) copies chunks of keys into shared memory and
 * passes four block barriers per chunk; at depth 32k its warps mostly wait
 * on one another and it reads an int8 cache at a fraction of the memory
 * rate (bench/RESULTS.md, "Long contexts"). Here each warp streams keys of
 * its own from global memory into registers and keeps its own online
 * softmax: no shared memory and no barrier between the rope step and the
 * end of the keys.
 *
 * A key's row is read by LPK = head_dim / 8 lanes, 8 elements each (16
 * bytes of fp16/bf16, 8 of int8/fp8), so a warp reads 32 / LPK whole rows
 * per step, coalesced. Each lane holds q of its 8 elements for the G heads
 * of the group, multiplies, and the LPK lanes of a row sum their parts with
 * shuffles; the same lanes then add their 8 elements of the value row,
 * weighted, to accumulators in registers. The row of each step's keys are
 * loaded UNROLL steps ahead of their use. A warp's lanes of one key slot
 * keep their own sums; they, the block's warps and the splits are merged
 * once at the end (the last through global memory, merge_global, as the
 * portable merge of the staged kernel).
 *
 * It serves head_dim 64, 128 and 256 and groups of 1, 2, 4 or 8 q heads,
 * 16-bit and 8-bit caches; launch_attention_decode_stream hands anything
 * else to the staged kernel.
 *
 * Measured (attn_decode, the 8B's shape at depth 32,768, NVIDIA H200,
 * 2026-11-28): 32 splits read an f16 cache at 1,965 GB/s and an int8 one
 * at 981, against the staged kernel's 894-1,003 and 345-417. Left to the
 * compiler (162 registers, one block a multiprocessor) it read 1,508 and
 * 767. It is slower than the staged kernel below about 4,096 keys (at
 * 2,048: 20.8 against 13.7 us a launch), hence the engine's switch.
 *
 * That kernel issues about a thousand instructions per 16 keys of a warp
 * (conversions, multiply-adds of 8 elements a lane per head, shuffled
 * sums): at depth 32k it is bound by issue, not memory (ncu: 0.48
 * instructions a cycle per scheduler, 0.87 eligible warps of 3.84). Where
 * the device has Ampere's mma.sync (paths.cu, K_OP_ATTN_DECODE_TC) the
 * fp16, int8 and fp8 caches at head_dim 64 and 128 go to a second
 * kernel below, k_attention_decode_stream_tc, the same work on tensor
 * cores: 3,253 GB/s (fp16), 2,050 (int8) and 1,959 (fp8) at 16 splits,
 * same machine and shape, 2026-11-30. bf16 caches, head_dim 256 and
 * Turing keep the CUDA-core kernel.
 */
#include "attention_decode.cuh"
#include "mma.cuh"

#define DS_WARPS (DEC_THREADS / 32)
#define DS_EL 8     /* elements of a row per lane */
#define DS_UNROLL 4 /* steps whose rows are in flight before the first is used (2: 1-2% slower) */
#define DS_MINB 2   /* blocks a multiprocessor holds at least (groups up to 4): 128 registers a thread */
#define DS_SPLIT_KEYS 128 /* keys a split takes at least (bar the last) */

/* DS_EL elements of T: 16 bytes of 16-bit elements, 8 of 8-bit ones. */
template <typename T> struct ds_vec {
    typedef typename std::conditional<sizeof(T) == 1, uint2, uint4>::type type;
};

/* An int8 code as a float by a byte permute into 2^23's mantissa and one subtraction (no conversion instruction). */
__device__ __forceinline__ void i8x4_f32(uint32_t w, float *f)
{
    const uint32_t u = w ^ 0x80808080u; /* offset binary: code + 128 */
#pragma unroll
    for (int b = 0; b < 4; b++)
        f[b] = __uint_as_float(__byte_perm(u, 0x4b000000u, 0x7650 | b)) - 8388736.0f;
}

/* The DS_EL elements as raw floats (kv.cuh: int8 and fp8 times the row's kv_mult). */
template <typename T> __device__ __forceinline__ void vec_f32(const typename ds_vec<T>::type v, float *f)
{
    if constexpr (sizeof(T) == 1) {
        if constexpr (std::is_same<T, int8_t>::value) {
            i8x4_f32(v.x, f);
            i8x4_f32(v.y, f + 4);
        } else {
            word_raw<T>(v.x, f);
            word_raw<T>(v.y, f + 4);
        }
    } else {
        granule_f32<T>(v, f);
    }
}

template <typename T> __device__ __forceinline__ typename ds_vec<T>::type load_vec(const T *p)
{
    return __ldcs(reinterpret_cast<const typename ds_vec<T>::type *>(p)); /* read once: evict first */
}

/* The rope step, a warp per task: q of each head of kv head kvh into qs; if
 * has_new (the block's keys hold the new position), its k and v into the
 * cache (int8/fp8: through nrow, fp32, then the codes and the scale). */
template <typename T, int G>
__device__ __forceinline__ void decode_rope_step(const rope_qkv_args &a, int kvh, int pos, bool has_new, float *qs,
                                                 float *nrow)
{
    constexpr bool QUANT = kv_quant<T>();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int nh = a.n_heads, nkv = a.n_kv_heads, hd = a.head_dim, kvd = nkv * hd;
    for (int t = warp; t < G + (has_new ? 2 : 0); t += DS_WARPS) {
        if (t < G) {
            const size_t h = (size_t)(kvh * G + t) * hd;
            rope_head<float>(qs + t * hd, a.qkv + h, a.bias ? a.bias + h : NULL, a.q_norm, a.eps, a.cos, a.sin, pos,
                             hd, rope_rot(a), true);
            continue;
        }
        const int is_v = t - G;
        const size_t src = (size_t)(nh + (is_v ? nkv : 0) + kvh) * hd;
        const size_t pr = (size_t)kv_row(pos, a.ring);
        T *row = static_cast<T *>(is_v ? a.v_cache : a.k_cache) + pr * kvd + (size_t)kvh * hd;
        if constexpr (QUANT) { /* fp32 first, then the codes and the scale */
            float *f = nrow + is_v * hd;
            rope_head<float>(f, a.qkv + src, a.bias ? a.bias + src : NULL, is_v ? NULL : a.k_norm, a.eps, a.cos,
                             a.sin, pos, hd, rope_rot(a), !is_v);
            __syncwarp();
            const float scale = kv_quantize_row<T>(row, f, hd);
            if (lane == 0)
                (is_v ? a.v_scale : a.k_scale)[pr * nkv + kvh] = scale;
        } else {
            rope_head<T>(row, a.qkv + src, a.bias ? a.bias + src : NULL, is_v ? NULL : a.k_norm, a.eps, a.cos,
                         a.sin, pos, hd, rope_rot(a), !is_v);
        }
    }
}

/* A block's start, in both kernels: its share [lo, end) of the keys up to
 * position pos (the last `window` of them where window > 0) and how many
 * splits work (as the staged kernel's portable merge: only as many as
 * there are DS_SPLIT_KEYS keys for; false for a block past them, which
 * does nothing); then, once the q/k/v product is complete, the rope step,
 * after which q is in qs and the new rows are in the cache. */
template <typename T, int G>
__device__ __forceinline__ bool decode_begin(const rope_qkv_args &a, int window, float *qs, float *nrow, int &pos,
                                             int &lo, int &end, int &splits)
{
    pos = *a.pos0;
    const int lo0 = window > 0 ? max(0, pos - window + 1) : 0, len = pos + 1 - lo0;
    splits = min((int)gridDim.x, (len + DS_SPLIT_KEYS - 1) / DS_SPLIT_KEYS);
    if ((int)blockIdx.x >= splits)
        return false;
    const int share = (len + splits - 1) / splits;
    lo = lo0 + (int)blockIdx.x * share;
    end = min(lo + share, pos + 1);
    dependents_may_launch();
    dependency_wait(); /* the q/k/v product is complete */
    decode_rope_step<T, G>(a, blockIdx.y, pos, lo <= pos && pos < end, qs, nrow);
    __syncthreads();
    return true;
}

/* The block's max and sum per head from its warps' (wm, wl): in log2 units
 * (mlog) and natural ones (ms, for merge_global); by the whole block. */
template <int G>
__device__ __forceinline__ void merge_warps(const float (*wm)[G], const float (*wl)[G], float *mlog, float *ms, float *ls)
{
    const int tid = threadIdx.x;
    __syncthreads();
    if (tid < G) {
        float mx = -INFINITY, sum = 0.0f;
        for (int w = 0; w < DS_WARPS; w++)
            mx = fmaxf(mx, wm[w][tid]);
        for (int w = 0; w < DS_WARPS; w++)
            sum += wm[w][tid] == -INFINITY ? 0.0f : wl[w][tid] * exp2f(wm[w][tid] - mx);
        mlog[tid] = mx;
        ms[tid] = mx * 0.6931471805599453f;
        ls[tid] = sum;
    }
    __syncthreads();
}

/* CAP: Gemma 2's soft cap on the scores, a kernel of its own: as a uniform
 * branch on each score it cost every other model's keys 11% (f16) to 19%
 * (int8) of their rate at depth 32k (spills in the key loop). */
template <typename T, int G, bool CAP>
__global__ void __launch_bounds__(DEC_THREADS, G <= 4 ? DS_MINB : 1)
    k_attention_decode_stream(float *out, rope_qkv_args a, int window)
{
    typedef typename ds_vec<T>::type vec;
    constexpr bool QUANT = kv_quant<T>();
    __shared__ __align__(16) float qo[2 * G * 256]; /* q (qs), then the warps' outputs (below) */
    __shared__ float nrow[2 * 256]; /* int8/fp8: the new k and v rows in fp32, before they are quantized */
    __shared__ float wm[DS_WARPS][G], wl[DS_WARPS][G], mlog[G], ms[G], ls[G], wt[G * DEC_PART_SPLITS];
    float *const qs = qo;
    const int split = blockIdx.x, kvh = blockIdx.y;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int nkv = a.n_kv_heads, hd = a.head_dim, kvd = nkv * hd;
    const int lpk = hd / DS_EL, kps = 32 / lpk, slot = lane / lpk, sub = lane - slot * lpk;
    const T *kc = static_cast<const T *>(a.k_cache), *vc = static_cast<const T *>(a.v_cache);

    int pos, lo, end, splits;
    if (!decode_begin<T, G>(a, window, qs, nrow, pos, lo, end, splits))
        return;

    /* This lane's 8 elements of q, scaled so that the scores come out in
     * log2 units (exp2 below): by the score scale (Granite's and Gemma's
     * own, else 1/sqrt(head_dim)) and log2(e). Gemma 2's soft cap in those
     * units: cap * tanh(s / cap) in nats is cap2 * tanh(s2 / cap2) in log2
     * units with cap2 = cap * log2(e). */
    const float qscale = (a.score_scale > 0.0f ? a.score_scale : rsqrtf((float)hd)) * 1.4426950408889634f;
    const float cap2 = a.softcap * 1.4426950408889634f;
    float qr[G][DS_EL];
#pragma unroll
    for (int g = 0; g < G; g++)
#pragma unroll
        for (int e = 0; e < DS_EL; e++)
            qr[g][e] = qs[g * hd + sub * DS_EL + e] * qscale;
    float m[G], l[G], acc[G][DS_EL];
#pragma unroll
    for (int g = 0; g < G; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int e = 0; e < DS_EL; e++)
            acc[g][e] = 0.0f;
    }

    /* The warp's keys: a contiguous part of the block's, whole steps. */
    const int per = ((end - lo + DS_WARPS - 1) / DS_WARPS + kps - 1) / kps * kps;
    const int wlo = lo + warp * per, wend = min(wlo + per, end);
    const size_t col = (size_t)kvh * hd + (size_t)sub * DS_EL;
    for (int k0 = wlo; k0 < wend; k0 += kps * DS_UNROLL) {
        vec kv[DS_UNROLL], vv[DS_UNROLL];
        float ksc[DS_UNROLL], vsc[DS_UNROLL];
        bool live[DS_UNROLL];
#pragma unroll
        for (int u = 0; u < DS_UNROLL; u++) {
            const int key = k0 + u * kps + slot;
            live[u] = key < wend;
            const size_t r = (size_t)kv_row(live[u] ? key : wlo, a.ring);
            kv[u] = load_vec(kc + r * kvd + col);
            vv[u] = load_vec(vc + r * kvd + col);
            if constexpr (QUANT) {
                ksc[u] = __ldcs(a.k_scale + r * nkv + kvh);
                vsc[u] = __ldcs(a.v_scale + r * nkv + kvh);
            }
        }
        /* Scores: this lane's part of each row, summed over the row's lanes. */
        float s[DS_UNROLL][G];
#pragma unroll
        for (int u = 0; u < DS_UNROLL; u++) {
            float f[DS_EL];
            vec_f32<T>(kv[u], f);
#pragma unroll
            for (int g = 0; g < G; g++) {
                float d0 = 0.0f, d1 = 0.0f;
#pragma unroll
                for (int e = 0; e < DS_EL; e += 2) {
                    d0 += f[e] * qr[g][e];
                    d1 += f[e + 1] * qr[g][e + 1];
                }
                s[u][g] = d0 + d1;
            }
        }
        for (int off = lpk >> 1; off > 0; off >>= 1)
#pragma unroll
            for (int u = 0; u < DS_UNROLL; u++)
#pragma unroll
                for (int g = 0; g < G; g++)
                    s[u][g] += __shfl_xor_sync(0xffffffffu, s[u][g], off);
        /* Online softmax over the step's keys of every slot: one max per head. */
#pragma unroll
        for (int g = 0; g < G; g++) {
            float mx = -INFINITY;
#pragma unroll
            for (int u = 0; u < DS_UNROLL; u++) {
                float mult = 1.0f;
                if constexpr (QUANT)
                    mult = kv_mult<T>(ksc[u]);
                if constexpr (CAP)
                    s[u][g] = live[u] ? soft_cap(s[u][g] * mult, cap2) : -INFINITY;
                else
                    s[u][g] = live[u] ? s[u][g] * mult : -INFINITY;
                mx = fmaxf(mx, s[u][g]);
            }
            for (int off = lpk; off < 32; off <<= 1)
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
            const float m_new = fmaxf(m[g], mx); /* finite: the step's first key is live */
            const float corr = exp2f(m[g] - m_new);
            m[g] = m_new;
            l[g] *= corr;
#pragma unroll
            for (int e = 0; e < DS_EL; e++)
                acc[g][e] *= corr;
#pragma unroll
            for (int u = 0; u < DS_UNROLL; u++) {
                s[u][g] = exp2f(s[u][g] - m_new);
                l[g] += s[u][g];
            }
        }
        /* Values: this lane's 8 elements of each row, weighted. */
#pragma unroll
        for (int u = 0; u < DS_UNROLL; u++) {
            float f[DS_EL];
            vec_f32<T>(vv[u], f);
            float mult = 1.0f;
            if constexpr (QUANT)
                mult = kv_mult<T>(vsc[u]);
#pragma unroll
            for (int g = 0; g < G; g++) {
                const float p = s[u][g] * mult;
#pragma unroll
                for (int e = 0; e < DS_EL; e++)
                    acc[g][e] += p * f[e];
            }
        }
    }

    /* The slots' sums into the warp's (every slot has the same max). */
    for (int off = lpk; off < 32; off <<= 1)
#pragma unroll
        for (int g = 0; g < G; g++) {
            l[g] += __shfl_xor_sync(0xffffffffu, l[g], off);
#pragma unroll
            for (int e = 0; e < DS_EL; e++)
                acc[g][e] += __shfl_xor_sync(0xffffffffu, acc[g][e], off);
        }
    /* The warps' into the block's: the block's max, each warp's share weighed to it (natural units for the merge),
     * added in shared memory without atomics (float atomics there are compare-and-swap loops: the tensor-core
     * kernel below spent half of a short launch in them). q is in registers now, so qo holds S = 512 / hd slices
     * of the output; warp w adds its share into slice w % S in turn w / S, and the slices' sum goes to slice 0. */
    if (lane == 0)
#pragma unroll
        for (int g = 0; g < G; g++) {
            wm[warp][g] = m[g];
            wl[warp][g] = l[g];
        }
    merge_warps<G>(wm, wl, mlog, ms, ls);
    const int S = 512 / hd, n_out = G * hd;
    for (int t = 0; t < DS_WARPS / S; t++) {
        if (warp / S == t && slot == 0)
#pragma unroll
            for (int g = 0; g < G; g++) {
                const float w = m[g] == -INFINITY ? 0.0f : exp2f(m[g] - mlog[g]); /* 0: a warp without keys */
                float4 *p = reinterpret_cast<float4 *>(qo + (warp % S) * n_out + g * hd + sub * DS_EL);
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    float4 v = make_float4(acc[g][4 * j] * w, acc[g][4 * j + 1] * w, acc[g][4 * j + 2] * w,
                                           acc[g][4 * j + 3] * w);
                    if (t > 0) {
                        const float4 b = p[j];
                        v.x += b.x, v.y += b.y, v.z += b.z, v.w += b.w;
                    }
                    p[j] = v;
                }
            }
        __syncthreads();
    }
    for (int i = tid; i < n_out; i += DEC_THREADS) {
        float v = qo[i];
        for (int k = 1; k < S; k++)
            v += qo[k * n_out + i];
        qo[i] = v;
    }
    __syncthreads();
    merge_global(out, a, split, splits, kvh, G, hd, qo, ms, ls, wt);
}

/* ---- the tensor-core kernel: the same work on mma.sync (sm_80 on) ---- */

#if TC_COMPILED

/* NW words of a row from p, one load, read once (evict first). */
template <int NW> __device__ __forceinline__ void load_words(uint32_t (&w)[NW], const void *p)
{
    if constexpr (NW == 4) {
        const uint4 v = __ldcs(static_cast<const uint4 *>(p));
        w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    } else if constexpr (NW == 2) {
        const uint2 v = __ldcs(static_cast<const uint2 *>(p));
        w[0] = v.x, w[1] = v.y;
    } else {
        w[0] = __ldcs(static_cast<const unsigned *>(p));
    }
}

/* The XOR on a warp's 16-byte output slots of head h (below): lanes c of a store phase (h / 2 = c) differ in the
 * slot bits their g does not set (KS 8: bit 1; KS 4: bit 0). */
template <int KS> __device__ __forceinline__ int ws_swizzle(int h)
{
    const int c = h >> 1;
    return KS == 8 ? (c & 1) | (c & 2) << 1 : (c & 3) << 1;
}

#endif

/*
 * The long-context decode on tensor cores, for an fp16, int8 or fp8 cache
 * and head_dim 64 or 128 (G q heads of a kv head, 1 to 8). Each warp
 * takes its keys 16 at a time, as the CUDA-core kernel above takes them a
 * row per lane group, with no shared memory or barrier in the loop, the
 * next 16 keys' rows loading while these are used. With g = lane / 4 and
 * c = lane % 4 (mma.cuh's fragment layouts):
 *  - scores S = Q K^T as two 16x8 products (keys 0-7 and 8-15 of the
 *    group): A is q, held in registers for the whole launch, split into
 *    an fp16 value and the fp16 rounding of its remainder (~22 bits of q,
 *    as the prefill kernel): row g holds head g % G's value, row g + 8 its
 *    remainder, so one product gives both and a lane adds its two rows. B
 *    is K^T, column g a key row the lane loads itself. The product's
 *    contraction order is free, so lane c reads the row's 8-dim chunks c,
 *    c + 4, ... in 16-byte loads and k-step s takes half of chunk c + 4
 *    (s / 2). Lane (g, c) ends with head g % G's scores of keys 2c,
 *    2c + 1, 8 + 2c, 9 + 2c (lanes of the same head compute the same);
 *  - the online softmax per head over the 16 (two shuffles), in log2 units;
 *  - O^T += V^T P^T as HD / 16 products of 16 dims x 8 columns: a lane's
 *    weights of those four keys are exactly the B fragment of column g.
 *    Split in two as q: for a group of 1, 2 or 4 heads, columns g < G take
 *    head g's values and columns G .. 2G - 1 the remainders of head g - G,
 *    so one product serves both (other groups: two products; columns G ..
 *    are not used). A is V^T: the
 *    lane loads the four keys' rows, dims (HD / 16) g .. and
 *    (HD / 16)(g + 8) .., and pairs the two keys of a register with one
 *    byte permute (int8, fp8: exact fp16 codes by kv.cuh's i8_pair and
 *    f8_pair). Product i's row m is dim (HD / 16) m + i.
 * An int8 or fp8 key's scale multiplies its score; a value row's scale
 * multiplies the key's weight before it is split, so V is rounded once.
 * Per 16 keys a warp issues 24 (head_dim 64: 12) products and a few dozen
 * other instructions where the CUDA-core kernel issues about a thousand.
 */
template <typename T, int G, int HD, bool CAP>
__global__ void __launch_bounds__(DEC_THREADS, 1) k_attention_decode_stream_tc(float *out, rope_qkv_args a, int window)
{
#if TC_COMPILED
    constexpr bool QUANT = kv_quant<T>(), I8 = std::is_same<T, int8_t>::value;
    constexpr int KS = HD / 16;                 /* k-steps of the scores; products of the output; V dims a row half */
    constexpr int KW = 8 * sizeof(T) / 4;       /* words of an 8-element chunk of K                                   */
    constexpr int VW = KS * sizeof(T) / 4;      /* words of a lane's run of KS elements of V                          */
    constexpr bool ONE = G == 1 || G == 2 || G == 4; /* P's value and remainder in one product (columns g, G + g) */
    __shared__ __align__(16) float qs[G * HD], os[G * HD], ws[DS_WARPS][G * HD]; /* ws: the warps' outputs */
    __shared__ float nrow[2 * HD];
    __shared__ float wm[DS_WARPS][G], wl[DS_WARPS][G], mlog[G], ms[G], ls[G], wt[G * DEC_PART_SPLITS];
    const int split = blockIdx.x, kvh = blockIdx.y;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3, hq = g % G;
    const int nkv = a.n_kv_heads, kvd = nkv * HD;
    const T *kc = static_cast<const T *>(a.k_cache), *vc = static_cast<const T *>(a.v_cache);

    int pos, lo, end, splits;
    if (!decode_begin<T, G>(a, window, qs, nrow, pos, lo, end, splits))
        return;

    /* q's A fragments: rows g and g + 8 (head hq's value and remainder), k-step s's columns 2c, 2c + 1 and
     * 2c + 8, 2c + 9 as dims 8 (c + 4 (s / 2)) + 4 (s % 2) + 0, 1 and + 2, 3: the dims lane c's K loads hold. */
    const float qscale = (a.score_scale > 0.0f ? a.score_scale : rsqrtf((float)HD)) * 1.4426950408889634f;
    const float cap2 = a.softcap * 1.4426950408889634f;
    uint32_t qa[KS][4];
#pragma unroll
    for (int s = 0; s < KS; s++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int d = 8 * (c + 4 * (s >> 1)) + 4 * (s & 1) + 2 * r;
            split2<__half>(qs[hq * HD + d] * qscale, qs[hq * HD + d + 1] * qscale, qa[s][2 * r], qa[s][2 * r + 1]);
        }
    /* int8: K's codes enter the products as code + 1152 (one byte permute a pair, I8); the scores take back
     * 1152 times the sum of q's elements as the products hold them. */
    float koff = 0.0f;
    if constexpr (I8) {
#pragma unroll
        for (int s = 0; s < KS; s++)
#pragma unroll
            for (int r = 0; r < 4; r++) {
                const float2 f = tc_ops<__half>::unpack(qa[s][r]);
                koff += f.x + f.y;
            }
        koff += __shfl_xor_sync(0xffffffffu, koff, 1);
        koff += __shfl_xor_sync(0xffffffffu, koff, 2);
        koff *= 1152.0f;
    }
    float m = -INFINITY, l = 0.0f, acc[KS][4];
#pragma unroll
    for (int i = 0; i < KS; i++)
        acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;

    /* The warp's keys: a contiguous part of the block's, whole groups of 16. */
    const int per = ((end - lo + DS_WARPS - 1) / DS_WARPS + 15) / 16 * 16;
    const int wlo = lo + warp * per, wend = min(wlo + per, end);
    /* A group's rows as a lane loads them. */
    struct rows {
        uint32_t kw[2][KS / 2][KW], vw[4][2][VW];
        float ksc[4], vsc[4];
    };
    auto load = [&](rows &b, int k0) {
#pragma unroll
        for (int t = 0; t < 2; t++) { /* K: key 8t + g of the group, chunks c, c + 4, ... */
            const int key = k0 + 8 * t + g;
            const size_t r = (size_t)kv_row(key < wend ? key : wlo, a.ring);
#pragma unroll
            for (int j = 0; j < KS / 2; j++)
                load_words<KW>(b.kw[t][j], kc + r * kvd + (size_t)kvh * HD + 8 * (c + 4 * j));
        }
#pragma unroll
        for (int i = 0; i < 4; i++) { /* V: keys 2c, 2c + 1, 8 + 2c, 9 + 2c; dims of rows g and g + 8 */
            const int key = k0 + 8 * (i >> 1) + 2 * c + (i & 1);
            const size_t r = (size_t)kv_row(key < wend ? key : wlo, a.ring);
#pragma unroll
            for (int h = 0; h < 2; h++)
                load_words<VW>(b.vw[i][h], vc + r * kvd + (size_t)kvh * HD + KS * (g + 8 * h));
            if constexpr (QUANT) {
                b.ksc[i] = __ldcs(a.k_scale + r * nkv + kvh);
                b.vsc[i] = __ldcs(a.v_scale + r * nkv + kvh);
            }
        }
    };
    auto use = [&](const rows &b, int g0) {
        /* Scores of keys 2c, 2c + 1 (product t = 0) and 8 + 2c, 9 + 2c (t = 1) for head hq. */
        float sc[4];
#pragma unroll
        for (int t = 0; t < 2; t++) {
            float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int s = 0; s < KS; s++) {
                const uint32_t *w = b.kw[t][s >> 1];
                uint32_t b0, b1;
                if constexpr (I8) { /* bytes code + 128 under fp16's 1024: code + 1152 */
                    const uint32_t x = w[s & 1] ^ 0x80808080u;
                    b0 = __byte_perm(x, 0x64646464u, 0x4140u);
                    b1 = __byte_perm(x, 0x64646464u, 0x4342u);
                } else if constexpr (QUANT) {
                    b0 = kv_code_pair<T>(w[s & 1], w[s & 1], 0, 1);
                    b1 = kv_code_pair<T>(w[s & 1], w[s & 1], 2, 3);
                } else {
                    b0 = w[2 * (s & 1)];
                    b1 = w[2 * (s & 1) + 1];
                }
                tc_ops<__half>::mma(d, qa[s], b0, b1);
            }
            sc[2 * t] = d[0] + d[2] - koff; /* the value's row and the remainder's */
            sc[2 * t + 1] = d[1] + d[3] - koff;
        }
        float mx = -INFINITY;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float v = sc[i];
            if constexpr (QUANT)
                v *= b.ksc[i] * kv_code_unit<T>();
            if constexpr (CAP)
                v = soft_cap(v, cap2);
            sc[i] = g0 + 8 * (i >> 1) + 2 * c + (i & 1) < wend ? v : -INFINITY;
            mx = fmaxf(mx, sc[i]);
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m, mx); /* finite: the group's first key is live */
        const float corr = exp2f(m - m_new);
        m = m_new;
        float p[4];
#pragma unroll
        for (int i = 0; i < 4; i++)
            p[i] = exp2f(sc[i] - m_new);
        l = l * corr + ((p[0] + p[1]) + (p[2] + p[3]));
        /* The output's columns 2c and 2c + 1: their corrections from lanes 8c and 8c + 4 (the same heads), where
         * a head's max moved (after the first keys, seldom). */
        if (__any_sync(0xffffffffu, corr != 1.0f)) {
            const float c0 = __shfl_sync(0xffffffffu, corr, 8 * c), c1 = __shfl_sync(0xffffffffu, corr, 8 * c + 4);
#pragma unroll
            for (int i = 0; i < KS; i++) {
                acc[i][0] *= c0;
                acc[i][1] *= c1;
                acc[i][2] *= c0;
                acc[i][3] *= c1;
            }
        }
        if constexpr (QUANT)
#pragma unroll
            for (int i = 0; i < 4; i++)
                p[i] *= b.vsc[i] * (kv_code_unit<T>() * kv_weight_unit<T>());
        uint32_t ph[2], pl[2];
        split2<__half>(p[0], p[1], ph[0], pl[0]);
        split2<__half>(p[2], p[3], ph[1], pl[1]);
        if constexpr (ONE) { /* column g: head g's values, or head g - G's remainders, or nothing */
#pragma unroll
            for (int k = 0; k < 2; k++)
                ph[k] = g < G ? ph[k] : g < 2 * G ? pl[k] : 0u;
        }
#pragma unroll
        for (int i = 0; i < KS; i++) {
            /* V^T's A fragment: registers (keys 2c, 2c+1 | 8+2c, 9+2c) x (row g | g + 8), element i of each run. */
            uint32_t av[4];
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int kp = q >> 1, h = q & 1; /* key pair, row half */
                const uint32_t x = b.vw[2 * kp][h][i * sizeof(T) / 4], y = b.vw[2 * kp + 1][h][i * sizeof(T) / 4];
                if constexpr (QUANT)
                    av[q] = kv_code_pair<T>(x, y, i & 3, i & 3);
                else
                    av[q] = __byte_perm(x, y, (i & 1) ? 0x7632u : 0x5410u);
            }
            tc_ops<__half>::mma(acc[i], av, ph[0], ph[1]);
            if constexpr (!ONE)
                tc_ops<__half>::mma(acc[i], av, pl[0], pl[1]);
        }
    };
    /* The next group's rows load while these are used: two sets of registers, taken in turn (NVIDIA H200,
     * depth 32k, 16 splits: f16 2,606 -> 2,770-2,793 GB/s, int8 1,525 -> 1,610-1,613, where int8 had loaded two
     * groups before using the first; two groups a set spilled, 1,171-1,175). */
    rows ra, rb;
    int k0 = wlo;
    if (k0 < wend)
        load(ra, k0);
    while (k0 < wend) {
        if (k0 + 16 < wend)
            load(rb, k0 + 16);
        use(ra, k0);
        k0 += 16;
        if (k0 >= wend)
            break;
        if (k0 + 16 < wend)
            load(ra, k0 + 16);
        use(rb, k0);
        k0 += 16;
    }

    /* The lanes' sums of head hq into the warp's; the warps' into the block's as the CUDA-core kernel does. */
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const float m0 = __shfl_sync(0xffffffffu, m, 8 * c), m1 = __shfl_sync(0xffffffffu, m, 8 * c + 4);
    if (c == 0 && g < G) {
        wm[warp][g] = m;
        wl[warp][g] = l;
    }
    /* Groups of up to 4: column G + h's remainders onto column h's values, in the lane that holds h (G = 4, 2:
     * lane c + G / 2; G = 1: the lane's other column). */
    if constexpr (G == 1) {
#pragma unroll
        for (int i = 0; i < KS; i++)
            acc[i][0] += acc[i][1], acc[i][2] += acc[i][3];
    } else if constexpr (ONE) {
#pragma unroll
        for (int i = 0; i < KS; i++)
#pragma unroll
            for (int r = 0; r < 4; r++)
                acc[i][r] += __shfl_xor_sync(0xffffffffu, acc[i][r], G / 2);
    }
    merge_warps<G>(wm, wl, mlog, ms, ls);
    /* Each warp's output, weighed to the block's max, into its own slice of ws: head h's dims 8g' .. 8g' + 7 of
     * each half are one lane's acc[.][e] (g' = g, g + 8), two 16-byte stores each, at 16-byte slots swizzled by
     * h / 2 so that the 8 lanes of a store phase hit 8 different slots. Then the slices' sum into os, in warp
     * order (shared-memory float atomics are compare-and-swap loops here: they took half of a launch at depth
     * 2,048). */
#pragma unroll
    for (int e = 0; e < 2; e++) { /* column 2c + e: head 2c + e */
        const int h = 2 * c + e;
        const float mh = e ? m1 : m0;
        if (h >= G) /* a padding head */
            continue;
        const float w = mh == -INFINITY ? 0.0f : exp2f(mh - mlog[h]) * (1.0f / kv_weight_unit<T>()); /* 0: no keys */
#pragma unroll
        for (int half = 0; half < 2; half++)
#pragma unroll
            for (int j = 0; j < KS / 4; j++) {
                const int slot = ((KS / 4) * (g + 8 * half) + j) ^ ws_swizzle<KS>(h);
                reinterpret_cast<float4 *>(ws[warp] + h * HD)[slot] =
                    make_float4(acc[4 * j][2 * half + e] * w, acc[4 * j + 1][2 * half + e] * w,
                                acc[4 * j + 2][2 * half + e] * w, acc[4 * j + 3][2 * half + e] * w);
            }
    }
    __syncthreads();
    for (int q = tid; q < G * HD / 4; q += DEC_THREADS) {
        const int h = q / (HD / 4), slot = (q % (HD / 4)) ^ ws_swizzle<KS>(h);
        float4 sum = reinterpret_cast<const float4 *>(ws[0] + h * HD)[slot];
#pragma unroll
        for (int w = 1; w < DS_WARPS; w++) {
            const float4 v = reinterpret_cast<const float4 *>(ws[w] + h * HD)[slot];
            sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
        }
        reinterpret_cast<float4 *>(os)[q] = sum;
    }
    __syncthreads();
    merge_global(out, a, split, splits, kvh, G, HD, os, ms, ls, wt);
#else
    (void)out, (void)a, (void)window;
#endif
}

/* Whether the tensor-core kernel takes this cache type and head_dim (groups of 1 to 8 heads). */
static bool stream_tc(const launch_ctx *c, k_kv_type kvt, int head_dim)
{
    return c->fast[K_OP_ATTN_DECODE_TC] && (kvt == K_KV_F16 || kvt == K_KV_INT8 || kvt == K_KV_FP8) &&
           (head_dim == 64 || head_dim == 128);
}

/* The q heads of a kv head, or 0. */
static int group_of(int n_heads, int n_kv_heads)
{
    return n_kv_heads > 0 && n_heads % n_kv_heads == 0 ? n_heads / n_kv_heads : 0;
}

static constexpr bool pow2_group(int g) { return g == 1 || g == 2 || g == 4 || g == 8; }

/* Whether a streaming kernel serves the shape: the CUDA-core kernel takes 16- and 8-bit caches, groups of 1, 2, 4
 * or 8 and head_dim 64, 128 or 256; the tensor-core kernel also groups of 3, 5, 6 and 7 (Qwen2.5's, Llama 3.2
 * 3B's), without a soft cap (Gemma 2's, whose head_dim 256 it does not take anyway). */
static bool stream_serves(const launch_ctx *c, k_kv_type kvt, int G, int head_dim, bool cap)
{
    if (kvt == K_KV_F32 || G < 1 || G > 8)
        return false;
    if (pow2_group(G))
        return head_dim == 64 || head_dim == 128 || head_dim == 256;
    return !cap && stream_tc(c, kvt, head_dim);
}

/* The kernel for this cache type, group and head_dim; NULL where stream_serves says no. */
template <typename T, int G> static void (*stream_kernel(const launch_ctx *c, const rope_qkv_args *a))(float *, rope_qkv_args,
                                                                                                      int)
{
    const bool cap = a->softcap > 0.0f;
    if constexpr (std::is_same<T, __half>::value || kv_quant<T>()) {
        if (stream_tc(c, a->kvt, a->head_dim)) {
            if constexpr (pow2_group(G)) {
                if (a->head_dim == 128)
                    return cap ? k_attention_decode_stream_tc<T, G, 128, true> : k_attention_decode_stream_tc<T, G, 128, false>;
                return cap ? k_attention_decode_stream_tc<T, G, 64, true> : k_attention_decode_stream_tc<T, G, 64, false>;
            } else {
                if (cap)
                    return NULL;
                return a->head_dim == 128 ? k_attention_decode_stream_tc<T, G, 128, false>
                                          : k_attention_decode_stream_tc<T, G, 64, false>;
            }
        }
    }
    if constexpr (pow2_group(G))
        return cap ? k_attention_decode_stream<T, G, true> : k_attention_decode_stream<T, G, false>;
    return NULL;
}

template <typename T, int G> static int run_stream(launch_ctx *c, float *out, const rope_qkv_args *a, int window,
                                                   int splits)
{
    auto kern = stream_kernel<T, G>(c, a);
    if (!kern)
        return launch_fail(c, "attention_decode_stream: no kernel for a group of %d at head_dim %d", G, a->head_dim);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)splits, (unsigned)a->n_kv_heads);
    cfg.blockDim = dim3(DEC_THREADS);
    cfg.stream = c->stream;
    cudaLaunchAttribute attr[1] = {};
    cfg.attrs = attr;
    if (c->fast[K_OP_PDL]) {
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.numAttrs = 1;
    }
    const cudaError_t e = cudaLaunchKernelEx(&cfg, kern, out, *a, window);
    if (e != cudaSuccess)
        return launch_fail(c, "attention_decode_stream: %s", cudaGetErrorString(e));
    return launch_check(c, "attention_decode_stream");
}

template <typename T> static int run_stream_g(launch_ctx *c, float *out, const rope_qkv_args *a, int window, int splits)
{
    switch (group_of(a->n_heads, a->n_kv_heads)) {
    case 1: return run_stream<T, 1>(c, out, a, window, splits);
    case 2: return run_stream<T, 2>(c, out, a, window, splits);
    case 3: return run_stream<T, 3>(c, out, a, window, splits);
    case 4: return run_stream<T, 4>(c, out, a, window, splits);
    case 5: return run_stream<T, 5>(c, out, a, window, splits);
    case 6: return run_stream<T, 6>(c, out, a, window, splits);
    case 7: return run_stream<T, 7>(c, out, a, window, splits);
    default: return run_stream<T, 8>(c, out, a, window, splits);
    }
}

extern "C" int attention_decode_stream_splits(const launch_ctx *c, k_kv_type kvt, int n_heads, int n_kv_heads,
                                              int head_dim)
{
    if (n_kv_heads < 1)
        return 1;
    /* The tensor-core kernel holds one block a multiprocessor (184-220 registers a thread): one wave of them (at
     * depth 32k on the H200, 16 splits of 8 kv heads read an fp16 cache at 2,595 GB/s, 32 at 2,049). The CUDA-core
     * kernel: about three a multiprocessor (32 splits there, 1,949 GB/s; 16, 1,364). */
    const bool tc = stream_serves(c, kvt, group_of(n_heads, n_kv_heads), head_dim, false) && stream_tc(c, kvt, head_dim);
    const int per = tc ? c->n_sms / n_kv_heads : (3 * c->n_sms + n_kv_heads - 1) / n_kv_heads;
    return per < 1 ? 1 : per > DEC_PART_SPLITS ? DEC_PART_SPLITS : per;
}

extern "C" int attention_decode_stream_from(const launch_ctx *c, k_kv_type kvt, int n_heads, int n_kv_heads,
                                            int head_dim)
{
    /* 8B shape, H200, 16 splits (us a launch, f16 / int8 / fp8; bench/RESULTS.md, "Long contexts", eighth
     * session): the tensor-core kernel against the staged one with its cluster merge 9.0 / 9.7 / 9.5 against
     * 8.7 / 11.3 / 10.4 at 1,024 keys, 8.7 / 9.4 / 9.4 against 6.2 / 7.7 / 7.2 at 256. The CUDA-core kernel
     * under ENGINE_CUDA_CC=75, at the 32 splits it takes there, against the staged one with the portable merge:
     * 17.9 / 18.7 / 19.3 against 16.7 / 19.0 / 17.6 at 2,048, 18.7 / 18.9 / 19.7 against 20.6 / 21.9 / 20.0 at
     * 3,072. */
    const bool tc = stream_serves(c, kvt, group_of(n_heads, n_kv_heads), head_dim, false) && stream_tc(c, kvt, head_dim);
    return tc ? 1024 : 3072;
}

extern "C" int launch_attention_decode_stream(launch_ctx *c, const rope_qkv_args *a, float *out, int window,
                                              int n_splits)
{
    if (!stream_serves(c, a->kvt, group_of(a->n_heads, a->n_kv_heads), a->head_dim, a->softcap > 0.0f))
        return launch_attention_decode(c, a, out, window, n_splits < DEC_MAX_SPLITS ? n_splits : DEC_MAX_SPLITS);
    if (!out || !a->qkv || !a->k_cache || !a->v_cache || !a->pos0 || !a->cos || !a->sin || a->n != 1 ||
        (!a->q_norm) != (!a->k_norm) || n_splits < 1 || n_splits > DEC_PART_SPLITS || !a->part || !a->count ||
        a->rotary_dim < 0 || a->rotary_dim > a->head_dim || a->rotary_dim % 2 || a->score_scale < 0.0f ||
        a->softcap < 0.0f ||
        (k_kv_has_scales(a->kvt) && (!a->k_scale || !a->v_scale)))
        return launch_fail(c, "attention_decode_stream: bad arguments (n %d, heads %d/%d, head_dim %d, %d splits)",
                           a->n, a->n_heads, a->n_kv_heads, a->head_dim, n_splits);
    switch (a->kvt) {
    case K_KV_F16: return run_stream_g<__half>(c, out, a, window, n_splits);
    case K_KV_BF16: return run_stream_g<__nv_bfloat16>(c, out, a, window, n_splits);
    case K_KV_INT8: return run_stream_g<int8_t>(c, out, a, window, n_splits);
    case K_KV_FP8: return run_stream_g<fp8e4m3>(c, out, a, window, n_splits);
    default: return launch_fail(c, "attention_decode_stream: KV cache type %d", (int)a->kvt);
    }
}
