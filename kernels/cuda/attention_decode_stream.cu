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
 */
#include "attention_decode.cuh"

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

/* CAP: Gemma 2's soft cap on the scores, a kernel of its own: as a uniform
 * branch on each score it cost every other model's keys 11% (f16) to 19%
 * (int8) of their rate at depth 32k (spills in the key loop). */
template <typename T, int G, bool CAP>
__global__ void __launch_bounds__(DEC_THREADS, G <= 4 ? DS_MINB : 1)
    k_attention_decode_stream(float *out, rope_qkv_args a, int window)
{
    typedef typename ds_vec<T>::type vec;
    constexpr bool QUANT = kv_quant<T>();
    __shared__ __align__(16) float qs[G * 256], os[G * 256];
    __shared__ float nrow[2 * 256]; /* int8/fp8: the new k and v rows in fp32, before they are quantized */
    __shared__ float wm[DS_WARPS][G], wl[DS_WARPS][G], mlog[G], ms[G], ls[G], wt[G * DEC_PART_SPLITS];
    const int split = blockIdx.x, kvh = blockIdx.y;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int nh = a.n_heads, nkv = a.n_kv_heads, hd = a.head_dim, kvd = nkv * hd;
    const int lpk = hd / DS_EL, kps = 32 / lpk, slot = lane / lpk, sub = lane - slot * lpk;
    const T *kc = static_cast<const T *>(a.k_cache), *vc = static_cast<const T *>(a.v_cache);

    const int pos = *a.pos0;
    const int lo0 = window > 0 ? max(0, pos - window + 1) : 0, len = pos + 1 - lo0;
    /* As the staged kernel's portable merge: only as many splits work as
     * there are DS_SPLIT_KEYS keys for. */
    const int splits = min((int)gridDim.x, (len + DS_SPLIT_KEYS - 1) / DS_SPLIT_KEYS);
    if (split >= splits)
        return;
    const int share = (len + splits - 1) / splits;
    const int lo = lo0 + split * share, end = min(lo + share, pos + 1);

    dependents_may_launch();
    dependency_wait(); /* the q/k/v product is complete */

    /* The rope step, a warp per task: q of each head into qs; in the block
     * whose share holds the new position, its k and v into the cache. */
    const bool has_new = lo <= pos && pos < end;
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
    __syncthreads(); /* q is in qs, the new rows are in the cache */

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
    /* The warps' into the block's: the block's max, each warp's share weighed to it (natural units for the merge). */
    if (lane == 0)
#pragma unroll
        for (int g = 0; g < G; g++) {
            wm[warp][g] = m[g];
            wl[warp][g] = l[g];
        }
    for (int i = tid; i < G * hd; i += DEC_THREADS)
        os[i] = 0.0f;
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
    if (slot == 0)
#pragma unroll
        for (int g = 0; g < G; g++) {
            if (m[g] == -INFINITY) /* a warp without keys */
                continue;
            const float w = exp2f(m[g] - mlog[g]);
#pragma unroll
            for (int e = 0; e < DS_EL; e++)
                atomicAdd(os + g * hd + sub * DS_EL + e, acc[g][e] * w);
        }
    __syncthreads();
    merge_global(out, a, split, splits, kvh, G, hd, os, ms, ls, wt);
}

template <typename T, int G> static int run_stream(launch_ctx *c, float *out, const rope_qkv_args *a, int window,
                                                   int splits)
{
    auto kern = a->softcap > 0.0f ? k_attention_decode_stream<T, G, true> : k_attention_decode_stream<T, G, false>;
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
    switch (a->n_heads / a->n_kv_heads) {
    case 1: return run_stream<T, 1>(c, out, a, window, splits);
    case 2: return run_stream<T, 2>(c, out, a, window, splits);
    case 4: return run_stream<T, 4>(c, out, a, window, splits);
    default: return run_stream<T, 8>(c, out, a, window, splits);
    }
}

extern "C" bool attention_decode_stream_serves(k_kv_type kvt, int n_heads, int n_kv_heads, int head_dim)
{
    const int g = n_kv_heads > 0 && n_heads % n_kv_heads == 0 ? n_heads / n_kv_heads : 0;
    return kvt != K_KV_F32 && (g == 1 || g == 2 || g == 4 || g == 8) &&
           (head_dim == 64 || head_dim == 128 || head_dim == 256);
}

extern "C" int launch_attention_decode_stream(launch_ctx *c, const rope_qkv_args *a, float *out, int window,
                                              int n_splits)
{
    if (!attention_decode_stream_serves(a->kvt, a->n_heads, a->n_kv_heads, a->head_dim))
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
