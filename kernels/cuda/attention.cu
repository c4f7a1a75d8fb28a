/*
 * attention.cu: causal grouped-query attention against the KV cache, for a
 * prompt batch (prefill) and for one token (decode).
 *
 * Prefill: a block takes up to 16 queries of one head and walks its keys in tiles of
 * 32 staged in shared memory (fp32), with an online softmax: the score
 * matrix never exists in memory. Within a warp, lane j scores key j of the
 * tile for the warp's 4 queries at once (each K element read from shared
 * memory serves 4 products), then each lane accumulates its own slice of
 * the head's dimensions over the tile's 32 weights.
 *
 * Decode has one query, so its parallelism comes from splitting the keys
 * (flash-decoding): blocks each take an equal share of the positions and
 * write their running max, sum and unnormalised output; a second kernel
 * combines them. The position is read from device memory so the decode
 * graph can be replayed at every position.
 */
#include "rope.cuh"

#define ATT_BQ 16  /* queries per block (4 per warp, 4 warps) */
#define ATT_BK 32  /* keys per tile                           */

/*
 * K and V rows k0 .. k0+ATT_BK-1 of one kv head into shared memory as fp32
 * (rows at or past `end` as zeros). 16-byte loads when a head's row allows,
 * unrolled so that each thread has several in flight: this load, not the
 * arithmetic, is what a decode step's attention waits on.
 */
template <typename T>
__device__ void stage_tile(float *Ks, float *Vs, const T *kc, const T *vc, int k0, int end, int kvd, int kvh, int hd)
{
    constexpr int V = 16 / sizeof(T);
    if ((hd % V) == 0 && (kvd % V) == 0) {
        const int per_row = hd / V, total = ATT_BK * per_row;
#pragma unroll 4
        for (int i = threadIdx.x; i < total; i += blockDim.x) {
            const int j = i / per_row, d0 = (i - j * per_row) * V, key = k0 + j;
            uint4 kr = make_uint4(0, 0, 0, 0), vr = make_uint4(0, 0, 0, 0);
            if (key < end) {
                const size_t at = (size_t)key * kvd + (size_t)kvh * hd + d0;
                kr = *reinterpret_cast<const uint4 *>(kc + at);
                vr = *reinterpret_cast<const uint4 *>(vc + at);
            }
            const T *kt = reinterpret_cast<const T *>(&kr), *vt = reinterpret_cast<const T *>(&vr);
#pragma unroll
            for (int e = 0; e < V; e++) {
                Ks[j * (hd + 1) + d0 + e] = key < end ? to_f32(kt[e]) : 0.0f;
                Vs[j * hd + d0 + e] = key < end ? to_f32(vt[e]) : 0.0f;
            }
        }
        return;
    }
    for (int i = threadIdx.x; i < ATT_BK * hd; i += blockDim.x) {
        const int j = i / hd, d = i - j * hd, key = k0 + j;
        const bool ok = key < end;
        const size_t at = (size_t)key * kvd + (size_t)kvh * hd + d;
        Ks[j * (hd + 1) + d] = ok ? to_f32(kc[at]) : 0.0f;
        Vs[j * hd + d] = ok ? to_f32(vc[at]) : 0.0f;
    }
}

template <typename T, int E> /* E: dimensions per lane, head_dim <= 32 * E */
__global__ void k_attention(void *out, k_dtype ot, const float *q, const T *kc, const T *vc, int pos0, int n, int nh,
                            int nkv, int hd, int window)
{
    extern __shared__ float sm[];
    float *Qs = sm;                          /* [hd][ATT_BQ], scaled       */
    float *Ks = Qs + hd * ATT_BQ;            /* [ATT_BK][hd + 1] (padded)  */
    float *Vs = Ks + ATT_BK * (hd + 1);      /* [ATT_BK][hd]               */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nthreads = blockDim.x;
    const int tq0 = blockIdx.x * ATT_BQ, h = blockIdx.y, kvh = h / (nh / nkv);
    const int kvd = nkv * hd;
    const float scale = rsqrtf((float)hd);

    for (int i = threadIdx.x; i < ATT_BQ * hd; i += nthreads) {
        const int qi = i / hd, d = i - qi * hd, t = tq0 + qi;
        Qs[d * ATT_BQ + qi] = t < n ? q[((size_t)t * nh + h) * hd + d] * scale : 0.0f;
    }
    /* Keys this block needs: from the first query's window start to the last query. */
    const int last_t = min(tq0 + ATT_BQ, n) - 1;
    const int hi = pos0 + last_t;
    const int lo = window > 0 ? max(0, pos0 + tq0 - window + 1) : 0, end = hi + 1;

    float m[4], l[4], acc[4][E];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
#pragma unroll
        for (int e = 0; e < E; e++)
            acc[i][e] = 0.0f;
    }
    int qpos[4];
#pragma unroll
    for (int i = 0; i < 4; i++)
        qpos[i] = tq0 + warp * 4 + i < n ? pos0 + tq0 + warp * 4 + i : -1;

    for (int k0 = lo; k0 < end; k0 += ATT_BK) {
        __syncthreads(); /* the previous tile is no longer read */
        stage_tile(Ks, Vs, kc, vc, k0, end, kvd, kvh, hd);
        __syncthreads();
        if (qpos[0] < 0)
            continue; /* this warp has no queries */
        float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        const float *kr = Ks + lane * (hd + 1);
        const float4 *q4 = reinterpret_cast<const float4 *>(Qs) + warp; /* 4 queries of this warp */
        for (int d = 0; d < hd; d++) {
            const float kd = kr[d];
            const float4 qv = q4[d * (ATT_BQ / 4)];
            s[0] += qv.x * kd;
            s[1] += qv.y * kd;
            s[2] += qv.z * kd;
            s[3] += qv.w * kd;
        }
        const int key = k0 + lane;
        float p[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const bool valid = qpos[i] >= 0 && key < end && key <= qpos[i] && (window <= 0 || key > qpos[i] - window);
            const float si = valid ? s[i] : -INFINITY;
            const float mt = warp_max(si);
            const float mn = fmaxf(m[i], mt);
            if (mn == -INFINITY) { /* nothing visible yet for this query */
                p[i] = 0.0f;
                continue;
            }
            p[i] = valid ? expf(si - mn) : 0.0f;
            const float corr = expf(m[i] - mn);
            l[i] = l[i] * corr + warp_sum(p[i]);
#pragma unroll
            for (int e = 0; e < E; e++)
                acc[i][e] *= corr;
            m[i] = mn;
        }
        for (int j = 0; j < ATT_BK; j++) {
            float v[E];
#pragma unroll
            for (int e = 0; e < E; e++) {
                const int d = lane * E + e;
                v[e] = d < hd ? Vs[j * hd + d] : 0.0f;
            }
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const float pj = __shfl_sync(0xffffffffu, p[i], j);
#pragma unroll
                for (int e = 0; e < E; e++)
                    acc[i][e] += pj * v[e];
            }
        }
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int t = tq0 + warp * 4 + i;
        if (t >= n)
            continue;
        const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
        const size_t o = ((size_t)t * nh + h) * hd;
#pragma unroll
        for (int e = 0; e < E; e++) {
            const int d = lane * E + e;
            if (d >= hd)
                continue;
            const float r = acc[i][e] * inv;
            if (ot == K_F32)
                static_cast<float *>(out)[o + d] = r;
            else if (ot == K_F16)
                static_cast<__half *>(out)[o + d] = __float2half_rn(r);
            else
                static_cast<__nv_bfloat16 *>(out)[o + d] = __float2bfloat16_rn(r);
        }
    }
}

/*
 * Decode: one new token. A block takes one kv head and one share of the
 * positions; its warps are the q heads of that kv head (GQA), so the K and
 * V rows come from memory once and from L1 for the other heads. Within a
 * warp the lanes split the head's dimensions; keys go in groups of
 * DEC_KEYS whose loads are all issued before the first is used, and whose
 * dot products reduce side by side.
 */
#define DEC_KEYS 8

template <typename T, int E>
__device__ __forceinline__ void load_row(float (&out)[E], const T *row, int lane, int hd)
{
#pragma unroll
    for (int e = 0; e < E; e++) {
        const int d = lane * E + e;
        out[e] = d < hd ? to_f32(row[d]) : 0.0f;
    }
}

template <typename T, int E>
__global__ void k_attention_decode(float *partial, rope_qkv_args a, int window)
{
    extern __shared__ float qs[]; /* [warps][hd]: each warp's q after RoPE */
    const int kvh = blockIdx.x, split = blockIdx.y, splits = gridDim.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int nh = a.n_heads, nkv = a.n_kv_heads, hd = a.head_dim;
    const int h = kvh * (nh / nkv) + warp, kvd = nkv * hd;
    const T *kc = static_cast<const T *>(a.k_cache), *vc = static_cast<const T *>(a.v_cache);
    dependents_may_launch(); /* the combine and the next product may queue up now */
    const int pos = *a.pos0;
    const int lo0 = window > 0 ? max(0, pos - window + 1) : 0, len = pos + 1 - lo0;
    const int share = (len + splits - 1) / splits;
    const int lo = lo0 + split * share, end = min(lo + share, pos + 1);
    const float scale = rsqrtf((float)hd);

    /* The rope_qkv step for this token, here rather than in a launch of its
     * own: every block ropes its q heads; the block whose share holds the
     * new position also writes the new k and v into the cache first. */
    rope_head<float>(qs + warp * hd, a.qkv + (size_t)h * hd, a.bias ? a.bias + (size_t)h * hd : NULL, a.q_norm,
                     a.eps, a.cos, a.sin, pos, hd, true);
    if (lo <= pos && pos < end) {
        if (warp == 0) {
            const size_t kh = (size_t)(nh + kvh) * hd, vh = (size_t)(nh + nkv + kvh) * hd;
            T *krow = static_cast<T *>(a.k_cache) + (size_t)pos * kvd + (size_t)kvh * hd;
            T *vrow = static_cast<T *>(a.v_cache) + (size_t)pos * kvd + (size_t)kvh * hd;
            rope_head<T>(krow, a.qkv + kh, a.bias ? a.bias + kh : NULL, a.k_norm, a.eps, a.cos, a.sin, pos, hd, true);
            rope_head<T>(vrow, a.qkv + vh, a.bias ? a.bias + vh : NULL, NULL, a.eps, a.cos, a.sin, pos, hd, false);
        }
        __syncthreads(); /* the new row is visible to every warp of the block */
    }
    __syncwarp();

    float qv[E], acc[E];
#pragma unroll
    for (int e = 0; e < E; e++) {
        const int d = lane * E + e;
        qv[e] = d < hd ? qs[warp * hd + d] * scale : 0.0f;
        acc[e] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int k0 = lo; k0 < end; k0 += DEC_KEYS) {
        float kr[DEC_KEYS][E], vr[DEC_KEYS][E];
#pragma unroll
        for (int j = 0; j < DEC_KEYS; j++) {
            const int key = min(k0 + j, end - 1); /* past the end: re-read the last, weight 0 below */
            const size_t at = (size_t)key * kvd + (size_t)kvh * hd;
            load_row<T, E>(kr[j], kc + at, lane, hd);
            load_row<T, E>(vr[j], vc + at, lane, hd);
        }
        float sc[DEC_KEYS];
#pragma unroll
        for (int j = 0; j < DEC_KEYS; j++) {
            float d = 0.0f;
#pragma unroll
            for (int e = 0; e < E; e++)
                d += qv[e] * kr[j][e];
            sc[j] = d;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
#pragma unroll
            for (int j = 0; j < DEC_KEYS; j++)
                sc[j] += __shfl_xor_sync(0xffffffffu, sc[j], o);
        float mx = m;
#pragma unroll
        for (int j = 0; j < DEC_KEYS; j++)
            if (k0 + j < end)
                mx = fmaxf(mx, sc[j]);
        const float corr = expf(m - mx);
        l *= corr;
#pragma unroll
        for (int e = 0; e < E; e++)
            acc[e] *= corr;
#pragma unroll
        for (int j = 0; j < DEC_KEYS; j++) {
            const float p = k0 + j < end ? expf(sc[j] - mx) : 0.0f;
            l += p;
#pragma unroll
            for (int e = 0; e < E; e++)
                acc[e] += p * vr[j][e];
        }
        m = mx;
    }
    float *pp = partial + ((size_t)h * splits + split) * (hd + 2);
#pragma unroll
    for (int e = 0; e < E; e++)
        if (lane * E + e < hd)
            pp[lane * E + e] = acc[e];
    if (lane == 0) {
        pp[hd] = m;
        pp[hd + 1] = l;
    }
}

/* Merge the splits of each head: out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s. */
template <typename O>
__global__ void k_attention_combine(O *out, const float *partial, int splits, int hd)
{
    const int h = blockIdx.x;
    dependents_may_launch();
    dependency_wait(); /* the split results */
    const float *pp = partial + (size_t)h * splits * (hd + 2);
    float mx = -INFINITY;
    for (int s = 0; s < splits; s++)
        mx = fmaxf(mx, pp[s * (hd + 2) + hd]);
    float den = 0.0f;
    for (int s = 0; s < splits; s++) {
        const float ms = pp[s * (hd + 2) + hd];
        if (ms > -INFINITY)
            den += expf(ms - mx) * pp[s * (hd + 2) + hd + 1];
    }
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float num = 0.0f;
        for (int s = 0; s < splits; s++) {
            const float ms = pp[s * (hd + 2) + hd];
            if (ms > -INFINITY)
                num += expf(ms - mx) * pp[s * (hd + 2) + d];
        }
        out[(size_t)h * hd + d] = from_f32<O>(den > 0.0f ? num / den : 0.0f);
    }
}

template <typename T>
static int run_prefill(launch_ctx *c, void *out, k_dtype ot, const float *q, const void *kc, const void *vc, int pos0,
                       int n, int nh, int nkv, int hd, int window)
{
    const size_t smem = ((size_t)hd * ATT_BQ + ATT_BK * (hd + 1) + ATT_BK * hd) * sizeof(float);
    const dim3 grid(ceil_div(n, ATT_BQ), (unsigned)nh);
    const T *k = static_cast<const T *>(kc), *v = static_cast<const T *>(vc);
    const int e = (hd + 31) / 32;
#define ATT_LAUNCH(EV)                                                                                        \
    do {                                                                                                      \
        auto kern = k_attention<T, EV>;                                                                       \
        if (smem > 48 * 1024)                                                                                 \
            cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);               \
        kern<<<grid, 128, smem, c->stream>>>(out, ot, q, k, v, pos0, n, nh, nkv, hd, window);                 \
    } while (0)
    switch (e) {
    case 1: ATT_LAUNCH(1); break;
    case 2: ATT_LAUNCH(2); break;
    case 3: ATT_LAUNCH(3); break;
    case 4: ATT_LAUNCH(4); break;
    case 5: case 6: ATT_LAUNCH(6); break;
    default: ATT_LAUNCH(8); break;
    }
#undef ATT_LAUNCH
    return launch_check(c, "attention_prefill");
}

template <typename T>
static void run_decode(launch_ctx *c, float *partial, const rope_qkv_args *a, int window, int splits)
{
    const int g = a->n_heads / a->n_kv_heads;
    const dim3 grid((unsigned)a->n_kv_heads, (unsigned)splits), block(32u * (unsigned)g);
    const size_t smem = (size_t)g * a->head_dim * sizeof(float);
    switch ((a->head_dim + 31) / 32) {
    case 1: k_attention_decode<T, 1><<<grid, block, smem, c->stream>>>(partial, *a, window); break;
    case 2: k_attention_decode<T, 2><<<grid, block, smem, c->stream>>>(partial, *a, window); break;
    case 3: k_attention_decode<T, 3><<<grid, block, smem, c->stream>>>(partial, *a, window); break;
    case 4: k_attention_decode<T, 4><<<grid, block, smem, c->stream>>>(partial, *a, window); break;
    case 5:
    case 6: k_attention_decode<T, 6><<<grid, block, smem, c->stream>>>(partial, *a, window); break;
    default: k_attention_decode<T, 8><<<grid, block, smem, c->stream>>>(partial, *a, window); break;
    }
}

static int check_args(launch_ctx *c, const void *out, const float *q, const void *kc, const void *vc, int n, int nh,
                      int nkv, int hd)
{
    if (!out || !q || !kc || !vc || n <= 0 || nh <= 0 || nkv <= 0 || nh % nkv || hd <= 0 || hd > 256 || hd % 2)
        return launch_fail(c, "attention: bad arguments (n %d, heads %d/%d, head_dim %d)", n, nh, nkv, hd);
    return 0;
}

extern "C" size_t launch_attention_decode_scratch(int n_heads, int head_dim, int n_splits)
{
    return (size_t)n_heads * n_splits * (head_dim + 2);
}

extern "C" int launch_attention_decode(launch_ctx *c, const rope_qkv_args *a, void *out, k_dtype ot, int window,
                                       int n_splits, float *partial)
{
    if (check_args(c, out, a->qkv, a->k_cache, a->v_cache, 1, a->n_heads, a->n_kv_heads, a->head_dim) || a->n != 1 ||
        !a->pos0 || !a->cos || !a->sin || (!a->q_norm) != (!a->k_norm) || n_splits < 1 || n_splits > 1024 ||
        !partial)
        return launch_fail(c, "attention_decode: bad arguments (n %d, %d splits)", a->n, n_splits);
    if (a->n_heads / a->n_kv_heads > 32)
        return launch_fail(c, "attention_decode: %d q heads per kv head (at most 32)", a->n_heads / a->n_kv_heads);
    DISPATCH_TYPE(a->kvt, T, run_decode<T>(c, partial, a, window, n_splits));
    if (launch_check(c, "attention_decode"))
        return -1;
    DISPATCH_TYPE(ot, O, {
        cudaError_t e = launch_pdl(k_attention_combine<O>, dim3(a->n_heads), dim3(128), 0, c->stream,
                                   static_cast<O *>(out), static_cast<const float *>(partial), n_splits, a->head_dim);
        if (e != cudaSuccess)
            return launch_fail(c, "attention_decode combine: %s", cudaGetErrorString(e));
    });
    return launch_check(c, "attention_decode combine");
}

extern "C" int launch_attention_prefill(launch_ctx *c, void *out, k_dtype ot, const float *q, const void *k_cache,
                                        const void *v_cache, k_dtype kvt, int n, int pos0, int n_heads,
                                        int n_kv_heads, int head_dim, int window)
{
    if (check_args(c, out, q, k_cache, v_cache, n, n_heads, n_kv_heads, head_dim) || pos0 < 0)
        return -1;
    DISPATCH_TYPE(kvt, T, return run_prefill<T>(c, out, ot, q, k_cache, v_cache, pos0, n, n_heads, n_kv_heads,
                                                head_dim, window));
    return 0;
}
