/*
 * attention_prefill.cu: causal grouped-query attention of a prompt batch
 * against the KV cache (prefill), tiled over keys with an online softmax:
 * the score matrix never exists in memory.
 *
 * Two paths. With a 16-bit, int8 or fp8 cache and head_dim a multiple of
 * 16 up to 128, or 256 (the real models), the products run on tensor
 * cores (mma.sync m16n8k16, fp32 accumulation; int8/fp8 codes turned into
 * fp16 in shared memory). Their operands are 16-bit, so q and the softmax
 * weights are each split into a 16-bit value and the 16-bit rounding of
 * its remainder, and both halves are multiplied: about 16 bits of q and of
 * the weights survive, and the result matches the fp32 path to ~1e-5 (K
 * and V are exact, they are stored in that type). At head_dim 256 two
 * blocks share each query tile, each weighting half of V's columns.
 * Otherwise (an fp32 cache, head_dim 8 or not a multiple of 16, tiles
 * beyond the block's shared memory, or a GPU before sm_80) a CUDA-core
 * kernel does it, decoding each tile to fp32 in shared memory as it stages
 * it (an int8/fp8 row times its scale, kv.cuh).
 *
 * Keys are read by position: at row key, or key % ring where the layer's
 * cache is a sliding window's ring (ring > 0), each row's address taken
 * alone, so a tile may wrap.
 *
 * Scores are scaled by `scale` (1/sqrt(head_dim), or Granite's and Gemma's
 * own) and, where cap > 0, soft-capped to cap * tanh(s / cap) before the
 * mask and the softmax (Gemma 2). The cap is a runtime value: a uniform
 * branch per score, not a kernel of its own.
 */
#include "kv.cuh"
#include "mma.cuh"


/* ---- CUDA-core path ---- */

#define ATT_BQ 16  /* queries per block (4 per warp, 4 warps) */
#define ATT_BK 32  /* keys per tile: a lane each                */
/* Where a tile of ATT_BK keys of a wide head does not fit the block's
 * shared memory (head_dim 256 on Turing: 82,048 bytes of 64 KiB), tiles
 * of half as many keys: half the lanes score a key, all of them sum. */
#define ATT_BK_NARROW 16

/*
 * K and V rows k0 .. k0+BK-1 of one kv head into shared memory as fp32
 * (rows at or past `end` as zeros; int8 and fp8 rows times their scales,
 * ksc/vsc [rows, nkv]). 16-byte loads when a head's row allows, unrolled
 * so that each thread has several in flight.
 */
template <typename T, int BK>
__device__ void stage_tile(float *Ks, float *Vs, const T *kc, const T *vc, const float *ksc, const float *vsc, int k0,
                           int end, int kvd, int kvh, int hd, int ring)
{
    constexpr int V = 16 / sizeof(T);
    const int nkv = kvd / hd;
    /* A row's multipliers: its scale for int8/fp8 (kv_mult), 1 for the float types, 0 past the end. */
    auto mults = [&](int key, float &km, float &vm) {
        km = vm = key < end ? 1.0f : 0.0f;
        if constexpr (kv_quant<T>())
            if (key < end) {
                km = kv_mult<T>(ksc[(size_t)kv_row(key, ring) * nkv + kvh]);
                vm = kv_mult<T>(vsc[(size_t)kv_row(key, ring) * nkv + kvh]);
            }
    };
    if ((hd % V) == 0 && (kvd % V) == 0) {
        const int per_row = hd / V, total = BK * per_row;
#pragma unroll 4
        for (int i = threadIdx.x; i < total; i += blockDim.x) {
            const int j = i / per_row, d0 = (i - j * per_row) * V, key = k0 + j;
            uint4 kr = make_uint4(0, 0, 0, 0), vr = make_uint4(0, 0, 0, 0);
            if (key < end) {
                const size_t at = (size_t)kv_row(key, ring) * kvd + (size_t)kvh * hd + d0;
                kr = *reinterpret_cast<const uint4 *>(kc + at);
                vr = *reinterpret_cast<const uint4 *>(vc + at);
            }
            float km, vm;
            mults(key, km, vm);
            const T *kt = reinterpret_cast<const T *>(&kr), *vt = reinterpret_cast<const T *>(&vr);
#pragma unroll
            for (int e = 0; e < V; e++) {
                Ks[j * (hd + 1) + d0 + e] = kv_raw(kt[e]) * km;
                Vs[j * hd + d0 + e] = kv_raw(vt[e]) * vm;
            }
        }
        return;
    }
    for (int i = threadIdx.x; i < BK * hd; i += blockDim.x) {
        const int j = i / hd, d = i - j * hd, key = k0 + j;
        const size_t at = (size_t)kv_row(min(key, end - 1), ring) * kvd + (size_t)kvh * hd + d;
        float km, vm;
        mults(key, km, vm);
        Ks[j * (hd + 1) + d] = kv_raw(kc[at]) * km;
        Vs[j * hd + d] = kv_raw(vc[at]) * vm;
    }
}

template <typename T, int E, int BK> /* E: dimensions per lane, head_dim <= 32 * E; BK: keys a tile */
__global__ void k_attention(void *out, k_dtype ot, const float *q, const T *kc, const T *vc, const float *ksc,
                            const float *vsc, int pos0, int n, int nh, int nkv, int hd, int window, int ring,
                            float scale, float cap)
{
    extern __shared__ float sm[];
    float *Qs = sm;                          /* [hd][ATT_BQ], scaled       */
    float *Ks = Qs + hd * ATT_BQ;            /* [BK][hd + 1] (padded)      */
    float *Vs = Ks + BK * (hd + 1);          /* [BK][hd]                   */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nthreads = blockDim.x;
    const int tq0 = blockIdx.x * ATT_BQ, h = blockIdx.y, kvh = h / (nh / nkv);
    const int kvd = nkv * hd;

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

    for (int k0 = lo; k0 < end; k0 += BK) {
        __syncthreads(); /* the previous tile is no longer read */
        stage_tile<T, BK>(Ks, Vs, kc, vc, ksc, vsc, k0, end, kvd, kvh, hd, ring);
        __syncthreads();
        if (qpos[0] < 0)
            continue; /* this warp has no queries */
        float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        const float *kr = Ks + (lane % BK) * (hd + 1); /* lanes past BK repeat a key, masked below */
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
            const bool valid = lane < BK && qpos[i] >= 0 && key < end && key <= qpos[i] &&
                               (window <= 0 || key > qpos[i] - window);
            const float si = valid ? soft_cap(s[i], cap) : -INFINITY;
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
        for (int j = 0; j < BK; j++) {
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

/* ---- tensor-core path ---- */

#define TC_WARPS 8
#define TC_BQ (16 * TC_WARPS) /* queries per block: 16 per warp */
/* Keys per tile. 64 measured faster on the H200 at depth 32k (int8 2,035
 * against 2,185 us, fp16 1,538 against 1,748) but needs more than the 99
 * KiB of shared memory Ampere's and Ada's consumer GPUs give a block. */
#define TC_BK 32
#define TC_STAGES(quant) ((quant) ? 2 : 3) /* stages of K and V rows as 16-bit values */
/* Stages of an int8/fp8 cache's codes, as many tiles as are in flight: three
 * (four measured 4% slower on the H200: 2,275 against 2,180 us), at
 * head_dim 256 two, so that the kernel fits 99 KiB of shared memory
 * (Ampere's and Ada's consumer GPUs, sm_120: 101,376 bytes, all of it). */
#define TC_RAW(hd) ((hd) > 128 ? 2 : 3)

#if TC_COMPILED

__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool full)
{
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(full ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async4(void *dst, const void *src, bool full)
{
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src), "r"(full ? 4 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* Four 8x8 matrices of 16-bit elements from shared memory, one row address per lane. */
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void *p)
{
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const void *p)
{
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");
}

__device__ __forceinline__ void store2(void *out, k_dtype ot, size_t i, float x, float y)
{
    if (ot == K_F32) {
        *reinterpret_cast<float2 *>(static_cast<float *>(out) + i) = make_float2(x, y);
    } else if (ot == K_F16) {
        *reinterpret_cast<__half2 *>(static_cast<__half *>(out) + i) = __floats2half2_rn(x, y);
    } else {
        *reinterpret_cast<__nv_bfloat162 *>(static_cast<__nv_bfloat16 *>(out) + i) = __floats2bfloat162_rn(x, y);
    }
}

/*
 * K and V rows k0 .. k0+TC_BK-1 of one kv head into a shared stage, 16 bytes
 * per copy, asynchronously (the next tile loads while this one is used);
 * rows at or past `end` are zero-filled.
 */
template <typename T, int HD, int LD>
__device__ __forceinline__ void tc_stage(T *ks, T *vs, const T *kc, const T *vc, int k0, int end, int kvd, int kvh,
                                         int ring)
{
    constexpr int CH = HD / 8; /* 16-byte chunks per row */
    for (int i = threadIdx.x; i < 2 * TC_BK * CH; i += blockDim.x) {
        const int which = i / (TC_BK * CH), rem = i - which * TC_BK * CH, r = rem / CH, ch = rem - r * CH;
        const int key = k0 + r;
        const size_t at = (size_t)kv_row(min(key, end - 1), ring) * kvd + (size_t)kvh * HD + ch * 8;
        cp_async16((which ? vs : ks) + r * LD + ch * 8, (which ? vc : kc) + at, key < end);
    }
}

/*
 * An int8/fp8 cache's tile: the codes of K and V rows k0 .. k0+TC_BK-1
 * ([K, V][TC_BK][HD] bytes) and their scales ([K, V][TC_BK]), copied like
 * tc_stage's; rows past `end` zero-filled (scale 0).
 */
template <typename Q, int HD>
__device__ __forceinline__ void tc_stage_codes(uint8_t *raw, float *scl, const Q *kc, const Q *vc, const float *ksc,
                                               const float *vsc, int k0, int end, int kvd, int kvh, int ring)
{
    constexpr int CH = HD / 16;
    const int nkv = kvd / HD;
    for (int i = threadIdx.x; i < 2 * TC_BK * CH; i += blockDim.x) {
        const int which = i / (TC_BK * CH), rem = i - which * TC_BK * CH, r = rem / CH, ch = rem - r * CH;
        const int key = k0 + r;
        const size_t at = (size_t)kv_row(min(key, end - 1), ring) * kvd + (size_t)kvh * HD + ch * 16;
        cp_async16(raw + (which * TC_BK + r) * HD + ch * 16, (which ? vc : kc) + at, key < end);
    }
    for (int i = threadIdx.x; i < 2 * TC_BK; i += blockDim.x) {
        const int which = i / TC_BK, r = i - which * TC_BK, key = k0 + r;
        cp_async4(scl + i, (which ? vsc : ksc) + (size_t)kv_row(min(key, end - 1), ring) * nkv + kvh, key < end);
    }
}

/*
 * The staged codes as fp16 for the mma, two at a time with byte permutes
 * and fp16 arithmetic (i8_pair, f8_pair in kv.cuh: converting through
 * fp32 took a quarter-rate instruction a code and cost the int8 kernel 9%
 * at depth 32k), exactly: every int8 code is an fp16 value, and an e4m3
 * code comes out 2^-8 times its value. The row scales are not applied
 * here: K's multiplies the scores and V's the weights P (k_attention_tc),
 * so V is rounded once, as an fp16 cache rounds it. (V times its scale in
 * fp16 here rounded twice: 6.9e-4 of the exact product where a window of
 * 1 makes a query's output its own V row, against 2.5e-4.)
 */
template <typename Q, int HD, int LD>
__device__ __forceinline__ void tc_convert(__half *ks, __half *vs, const uint8_t *raw)
{
    constexpr int P = HD / 16; /* a thread's item: 8-code chunks c and c + P of one row (16-byte stores side by side) */
    for (int i = threadIdx.x; i < 2 * TC_BK * P; i += blockDim.x) {
        const int which = i / (TC_BK * P), rem = i - which * TC_BK * P, r = rem / P, c = rem - r * P;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int ch = c + h * P;
            const uint2 w = *reinterpret_cast<const uint2 *>(raw + (which * TC_BK + r) * HD + ch * 8);
            uint32_t o[4];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const uint32_t x = e < 2 ? w.x : w.y;
                o[e] = kv_code_pair<Q>(x, x, 2 * (e & 1), 2 * (e & 1) + 1);
            }
            *reinterpret_cast<uint4 *>((which ? vs : ks) + r * LD + ch * 8) = make_uint4(o[0], o[1], o[2], o[3]);
        }
    }
}


#endif

/*
 * A block: TC_BQ queries of one head (16 per warp), keys in tiles of
 * TC_BK staged in shared memory for all its warps. Eight warps, not four,
 * halve the copies a query's keys cost; with ~210 registers a thread
 * either way an SM holds 8 warps (NVIDIA H200, int8 cache at depth 32k,
 * 512 queries: 2,705 -> 2,221 us, fp16 1,994 -> 1,796). Per tile a warp
 * computes S = Q K^T (16 x TC_BK) from Q held
 * in registers as mma A fragments, masks and exponentiates it in
 * registers, and reuses the S accumulators directly as the A fragments of
 * O += P V (the FlashAttention-2 arrangement). Scores are in log2 units
 * (log2(e) folded into q's scale) so the exponentials are exp2f.
 */
/* KC = head_dim / 16; Q: the cache's type (T, or int8/fp8 with T fp16); RING: the cache is a ring (a kernel of
 * its own: reading rows through kv_row cost the int8/fp8 kernels 40 registers of their schedule and 17% of a
 * 32k-token prefill on the H100, 8,223 -> 6,826 tok/s) */
template <typename T, int KC, typename Q, bool RING, int VS>
__global__ void __launch_bounds__(32 * TC_WARPS)
    k_attention_tc(void *out, k_dtype ot, const float *q, const Q *kc, const Q *vc, const float *ksc, const float *vsc,
                   int pos0, int n, int nh, int nkv, int window, int ring, float scale, float cap)
{
#if TC_COMPILED
    constexpr int HD = KC * 16, LD = HD + 8; /* 16 bytes of row padding: ldmatrix rows fall in distinct banks */
    /* VS slices of the output's columns, blockIdx.z this block's: at head_dim 256 a warp's 16 rows of all
     * 256 columns (128 floats a lane) and q's fragments (another 128) would not fit the registers, so two
     * blocks share a query tile, each scoring every key and weighting half of V. */
    constexpr int VC = KC / VS;
    const int dz = (int)blockIdx.z * VC * 16;
    constexpr bool QUANT = kv_quant<Q>();
    extern __shared__ __align__(16) unsigned char tc_smem[];
    /* [NS][K, V][TC_BK][LD] rows as T; int8/fp8: then [NR][K, V][TC_BK][HD] codes, [NR][K, V][TC_BK]
     * scales and [2][K, V][TC_BK] scales, the converted stages' own (tc_smem_bytes) */
    constexpr int NS = TC_STAGES(QUANT), NR = TC_RAW(HD);
    T *sm = reinterpret_cast<T *>(tc_smem);
    uint8_t *raw = reinterpret_cast<uint8_t *>(sm + NS * 2 * TC_BK * LD);
    float *scl = reinterpret_cast<float *>(raw + NR * 2 * TC_BK * HD), *kscl = scl + NR * 2 * TC_BK;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * TC_BQ; /* the longest blocks start first */
    const int h = blockIdx.y, kvh = h / (nh / nkv), kvd = nkv * HD;
    const int lo = window > 0 ? max(0, pos0 + q0 - window + 1) : 0, end = pos0 + min(q0 + TC_BQ, n);
    const int r0 = q0 + warp * 16 + g, r1 = r0 + 8; /* this thread's two query rows */
    const int p0 = pos0 + r0, p1 = pos0 + r1;
    const bool active = q0 + warp * 16 < n;
    const int wlo = pos0 + q0 + warp * 16, whi = pos0 + min(q0 + warp * 16 + 15, n - 1);

    uint32_t qh[KC][4], ql[KC][4];
    /* Scores in log2 units; the soft cap in them is cap * log2(e) (cap * tanh(s / cap) in nats). */
    const float qscale = 1.4426950408889634f * scale, cap2 = cap * 1.4426950408889634f;
#pragma unroll
    for (int kk = 0; kk < KC; kk++)
#pragma unroll
        for (int j = 0; j < 4; j++) { /* A fragment: j&1 picks row g or g+8, j>>1 the upper 8 columns */
            const int row = (j & 1) ? r1 : r0, d = kk * 16 + (j >> 1) * 8 + 2 * t4;
            float2 v = make_float2(0.0f, 0.0f);
            if (row < n)
                v = *reinterpret_cast<const float2 *>(q + ((size_t)row * nh + h) * HD + d);
            split2<T>(v.x * qscale, v.y * qscale, qh[kk][j], ql[kk][j]);
        }

    float o[2 * VC][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < 2 * VC; i++)
        o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;

    /*
     * One barrier a tile. A 16-bit cache's rows arrive two tiles ahead, in
     * three stages: at tile it's barrier every thread's copies of it have
     * landed and every warp is done with tile it - 1, whose stage then takes
     * tile it + 2. An int8/fp8 cache's codes arrive up to NR tiles ahead, in
     * NR stages, and are turned into fp16 one tile ahead, into two stages
     * of rows (their K scales copied beside them): between two barriers a
     * warp converts its share of tile it + 1 and multiplies tile it, so the
     * conversion runs beside other warps' products, not between barriers of
     * its own; the barrier also frees the codes' stage of tile it, which
     * then takes tile it + NR.
     */
    const int ntiles = (end - lo + TC_BK - 1) / TC_BK;
    auto stage = [&](int t) { /* tile t's copies, if it exists; a commit group either way */
        if (t < ntiles) {
            const int k0 = lo + t * TC_BK;
            if constexpr (QUANT)
                tc_stage_codes<Q, HD>(raw + (t % NR) * 2 * TC_BK * HD, scl + (t % NR) * 2 * TC_BK, kc, vc,
                                      ksc, vsc, k0, end, kvd, kvh, RING ? ring : 0);
            else
                tc_stage<T, HD, LD>(sm + (t % NS) * 2 * TC_BK * LD, sm + (t % NS) * 2 * TC_BK * LD + TC_BK * LD, kc,
                                    vc, k0, end, kvd, kvh, RING ? ring : 0);
        }
        cp_async_commit();
    };
    auto convert = [&](int t) { /* tile t's codes, landed and published, as fp16 rows in stage t % 2 */
        if constexpr (QUANT)
            if (t < ntiles) {
                T *ks = sm + (t & 1) * 2 * TC_BK * LD;
                tc_convert<Q, HD, LD>(ks, ks + TC_BK * LD, raw + (t % NR) * 2 * TC_BK * HD);
                for (int i = threadIdx.x; i < 2 * TC_BK; i += blockDim.x) /* the codes' stage is refilled first */
                    kscl[(t & 1) * 2 * TC_BK + i] = scl[(t % NR) * 2 * TC_BK + i];
            }
    };
    stage(0);
    stage(1);
    if constexpr (QUANT) {
        for (int t = 2; t < NR; t++)
            stage(t);
        cp_async_wait<NR - 1>(); /* tile 0's codes */
        __syncthreads();
        convert(0);
    }
    for (int it = 0; it < ntiles; it++) {
        const int k0 = lo + it * TC_BK;
        cp_async_wait<QUANT ? NR - 2 : 1>(); /* 16-bit: tile it's rows; int8/fp8: tile it + 1's codes */
        __syncthreads();
        stage(it + (QUANT ? NR : 2));
        if constexpr (QUANT)
            convert(it + 1);
        /* Skip a tile wholly after the warp's last query or before its first query's window. */
        if (active && k0 <= whi && (window <= 0 || k0 + TC_BK - 1 > wlo - window)) {
            const T *ks = sm + (it % NS) * 2 * TC_BK * LD, *vs = ks + TC_BK * LD;
            constexpr int NT = TC_BK / 8; /* n-tiles of 8 keys */
            float s[NT][4];
#pragma unroll
            for (int i = 0; i < NT; i++)
                s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < KC; kk++)
#pragma unroll
                for (int np = 0; np < NT / 2; np++) { /* keys np*16 .. +15: two n-tiles of 8 */
                    uint32_t b[4];
                    ldsm_x4(b, ks + (np * 16 + ((lane >> 4) & 1) * 8 + (lane & 7)) * LD + kk * 16 + ((lane >> 3) & 1) * 8);
                    tc_ops<T>::mma(s[2 * np], qh[kk], b[0], b[1]);
                    tc_ops<T>::mma(s[2 * np], ql[kk], b[0], b[1]);
                    tc_ops<T>::mma(s[2 * np + 1], qh[kk], b[2], b[3]);
                    tc_ops<T>::mma(s[2 * np + 1], ql[kk], b[2], b[3]);
                }
            /* Accumulator element e of n-tile nt: row (e >> 1 ? g + 8 : g), key nt*8 + 2*t4 + (e & 1). */
            if constexpr (QUANT) { /* K's row scales */
                const float *ksl = kscl + (it & 1) * 2 * TC_BK;
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) /* the codes are exact values (tc_convert) */
                        s[nt][e] *= ksl[nt * 8 + 2 * t4 + (e & 1)] * kv_code_unit<Q>();
            }
            if (cap2 > 0.0f)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        s[nt][e] = soft_cap(s[nt][e], cap2);
            /* The mask, where the tile reaches past the warp's first query or into its last one's window. */
            if (k0 + TC_BK - 1 > wlo || (window > 0 && k0 <= whi - window))
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int key = k0 + nt * 8 + 2 * t4 + (e & 1), p = (e >> 1) ? p1 : p0;
                        if (key > p || (window > 0 && key <= p - window))
                            s[nt][e] = -INFINITY; /* (rows past n are computed on q = 0 and never stored) */
                    }
            float mx[2] = {m[0], m[1]};
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    mx[e >> 1] = fmaxf(mx[e >> 1], s[nt][e]);
            float ref[2], corr[2];
#pragma unroll
            for (int r = 0; r < 2; r++) {
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
                ref[r] = mx[r] == -INFINITY ? 0.0f : mx[r]; /* nothing visible yet: weights 0, no NaN */
                corr[r] = exp2f(m[r] - ref[r]);
                m[r] = mx[r];
                l[r] *= corr[r];
            }
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    s[nt][e] = exp2f(s[nt][e] - ref[e >> 1]);
                    l[e >> 1] += s[nt][e];
                }
            if constexpr (QUANT) { /* V's row scales on the weights, before they are split (tc_convert) */
                const float *vsl = kscl + (it & 1) * 2 * TC_BK + TC_BK;
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        s[nt][e] *= vsl[nt * 8 + 2 * t4 + (e & 1)] * (kv_code_unit<Q>() * kv_weight_unit<Q>());
            }
#pragma unroll
            for (int i = 0; i < 2 * VC; i++) {
                o[i][0] *= corr[0];
                o[i][1] *= corr[0];
                o[i][2] *= corr[1];
                o[i][3] *= corr[1];
            }
#pragma unroll
            for (int c2 = 0; c2 < NT / 2; c2++) { /* keys c2*16 .. +15 */
                uint32_t ph[4], pl[4];
                split2<T>(s[2 * c2][0], s[2 * c2][1], ph[0], pl[0]);
                split2<T>(s[2 * c2][2], s[2 * c2][3], ph[1], pl[1]);
                split2<T>(s[2 * c2 + 1][0], s[2 * c2 + 1][1], ph[2], pl[2]);
                split2<T>(s[2 * c2 + 1][2], s[2 * c2 + 1][3], ph[3], pl[3]);
#pragma unroll
                for (int dp = 0; dp < VC; dp++) { /* dims dz + dp*16 .. +15: two n-tiles of 8 */
                    uint32_t b[4];
                    ldsm_x4_trans(b, vs + (c2 * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * LD + dz + dp * 16 +
                                         ((lane >> 4) & 1) * 8);
                    tc_ops<T>::mma(o[2 * dp], ph, b[0], b[1]);
                    tc_ops<T>::mma(o[2 * dp], pl, b[0], b[1]);
                    tc_ops<T>::mma(o[2 * dp + 1], ph, b[2], b[3]);
                    tc_ops<T>::mma(o[2 * dp + 1], pl, b[2], b[3]);
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        l[r] = l[r] > 0.0f ? (QUANT ? 1.0f / kv_weight_unit<Q>() : 1.0f) / l[r] : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < 2 * VC; i++) {
        const int d = dz + i * 8 + 2 * t4;
        if (r0 < n)
            store2(out, ot, ((size_t)r0 * nh + h) * HD + d, o[i][0] * l[0], o[i][1] * l[0]);
        if (r1 < n)
            store2(out, ot, ((size_t)r1 * nh + h) * HD + d, o[i][2] * l[1], o[i][3] * l[1]);
    }
#endif
}

/* The tensor-core kernel's shared memory (the kernel's layout): at head_dim 128 52,224 bytes (60,672 for codes),
 * at 256 101,376 (101,376). */
static size_t tc_smem_bytes(int hd, size_t elem, bool quant)
{
    return (size_t)TC_STAGES(quant) * 2 * TC_BK * (hd + 8) * elem +
           (quant ? (size_t)TC_RAW(hd) * 2 * TC_BK * (hd + sizeof(float)) + 2 * 2 * TC_BK * sizeof(float) : 0);
}

template <typename T, int KC, typename Q>
static void tc_launch(launch_ctx *c, void *out, k_dtype ot, const float *q, const void *kc, const void *vc,
                      const float *ksc, const float *vsc, int pos0, int n, int nh, int nkv, int window, int ring,
                      float scale, float cap)
{
    constexpr int HD = KC * 16, VS = HD > 128 ? 2 : 1;
    const size_t smem = tc_smem_bytes(HD, sizeof(T), kv_quant<Q>());
    auto kern = ring > 0 ? k_attention_tc<T, KC, Q, true, VS> : k_attention_tc<T, KC, Q, false, VS>;
    if (smem > 48 * 1024)
        cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    const dim3 grid(ceil_div(n, TC_BQ), (unsigned)nh, VS);
    kern<<<grid, 32 * TC_WARPS, smem, c->stream>>>(out, ot, q, static_cast<const Q *>(kc), static_cast<const Q *>(vc),
                                                   ksc, vsc, pos0, n, nh, nkv, window, ring, scale, cap);
}

template <typename T, typename Q>
static void run_tc(launch_ctx *c, void *out, k_dtype ot, const float *q, const void *kc, const void *vc,
                   const float *ksc, const float *vsc, int pos0, int n, int nh, int nkv, int hd, int window, int ring,
                   float scale, float cap)
{
#define TC_CASE(K) tc_launch<T, K, Q>(c, out, ot, q, kc, vc, ksc, vsc, pos0, n, nh, nkv, window, ring, scale, cap)
    switch (hd / 16) {
    case 1: TC_CASE(1); break;
    case 2: TC_CASE(2); break;
    case 3: TC_CASE(3); break;
    case 4: TC_CASE(4); break;
    case 5: TC_CASE(5); break;
    case 6: TC_CASE(6); break;
    case 7: TC_CASE(7); break;
    case 8: TC_CASE(8); break;
    default: TC_CASE(16); break;
    }
#undef TC_CASE
}

template <typename T>
static int run_prefill(launch_ctx *c, void *out, k_dtype ot, const float *q, const void *kc, const void *vc,
                       const float *ksc, const float *vsc, int pos0, int n, int nh, int nkv, int hd, int window,
                       int ring, float scale, float cap)
{
    auto smem_of = [hd](int bk) { return ((size_t)hd * ATT_BQ + (size_t)bk * (hd + 1) + (size_t)bk * hd) * sizeof(float); };
    const bool narrow = smem_of(ATT_BK) > c->smem_max;
    const size_t smem = smem_of(narrow ? ATT_BK_NARROW : ATT_BK);
    if (smem > c->smem_max)
        return launch_fail(c, "attention_prefill: %zu bytes of shared memory (head_dim %d), %zu here", smem, hd,
                           c->smem_max);
    const dim3 grid(ceil_div(n, ATT_BQ), (unsigned)nh);
    const T *k = static_cast<const T *>(kc), *v = static_cast<const T *>(vc);
    const int e = (hd + 31) / 32;
#define ATT_LAUNCH(EV)                                                                                        \
    do {                                                                                                      \
        auto kern = narrow ? k_attention<T, EV, ATT_BK_NARROW> : k_attention<T, EV, ATT_BK>;                  \
        if (smem > 48 * 1024)                                                                                 \
            cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);               \
        kern<<<grid, 128, smem, c->stream>>>(out, ot, q, k, v, ksc, vsc, pos0, n, nh, nkv, hd, window, ring, \
                                             scale, cap);                                                    \
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

extern "C" int launch_attention_prefill_ex(launch_ctx *c, void *out, k_dtype ot, const float *q, const void *k_cache,
                                           const void *v_cache, const float *k_scale, const float *v_scale,
                                           k_kv_type kvt, int n, int pos0, int n_heads, int n_kv_heads, int head_dim,
                                           int window, int ring, float score_scale, float softcap)
{
    if (!out || !q || !k_cache || !v_cache || n <= 0 || pos0 < 0 || n_heads <= 0 || n_kv_heads <= 0 ||
        n_heads % n_kv_heads || head_dim <= 0 || head_dim > 256 || head_dim % 2 ||
        (k_kv_has_scales(kvt) && (!k_scale || !v_scale)) ||
        (ring != 0 && (ring < 0 || window <= 0 || (int64_t)window + n - 1 > ring)) || score_scale < 0.0f ||
        softcap < 0.0f)
        return launch_fail(c, "attention_prefill: bad arguments (n %d, pos0 %d, heads %d/%d, head_dim %d, window %d, "
                              "ring %d)",
                           n, pos0, n_heads, n_kv_heads, head_dim, window, ring);
    const float scale = score_scale > 0.0f ? score_scale : rsqrtf((float)head_dim);
    /* cp.async and the paired stores want 16- and 8-byte alignment; arena buffers have it. */
    const bool aligned = (((uintptr_t)k_cache | (uintptr_t)v_cache) & 15) == 0 && ((uintptr_t)q & 7) == 0 &&
                         ((uintptr_t)out & 7) == 0;
    const bool tc_shape = head_dim % 16 == 0 && (head_dim <= 128 || head_dim == 256) &&
                          tc_smem_bytes(head_dim, 2, k_kv_has_scales(kvt)) <= c->smem_max;
    if (c->fast[K_OP_ATTN_PREFILL_TC] && kvt != K_KV_F32 && tc_shape && aligned) {
        switch (kvt) {
        case K_KV_F16:
            run_tc<__half, __half>(c, out, ot, q, k_cache, v_cache, NULL, NULL, pos0, n, n_heads, n_kv_heads, head_dim,
                                   window, ring, scale, softcap);
            break;
        case K_KV_BF16:
            run_tc<__nv_bfloat16, __nv_bfloat16>(c, out, ot, q, k_cache, v_cache, NULL, NULL, pos0, n, n_heads,
                                                 n_kv_heads, head_dim, window, ring, scale, softcap);
            break;
        case K_KV_INT8:
            run_tc<__half, int8_t>(c, out, ot, q, k_cache, v_cache, k_scale, v_scale, pos0, n, n_heads, n_kv_heads,
                                   head_dim, window, ring, scale, softcap);
            break;
        default:
            run_tc<__half, fp8e4m3>(c, out, ot, q, k_cache, v_cache, k_scale, v_scale, pos0, n, n_heads, n_kv_heads,
                                    head_dim, window, ring, scale, softcap);
            break;
        }
        return launch_check(c, "attention_prefill");
    }
    DISPATCH_KV(kvt, T, return run_prefill<T>(c, out, ot, q, k_cache, v_cache, k_scale, v_scale, pos0, n, n_heads,
                                              n_kv_heads, head_dim, window, ring, scale, softcap));
    return 0;
}

extern "C" int launch_attention_prefill(launch_ctx *c, void *out, k_dtype ot, const float *q, const void *k_cache,
                                        const void *v_cache, const float *k_scale, const float *v_scale,
                                        k_kv_type kvt, int n, int pos0, int n_heads, int n_kv_heads, int head_dim,
                                        int window, int ring)
{
    return launch_attention_prefill_ex(c, out, ot, q, k_cache, v_cache, k_scale, v_scale, kvt, n, pos0, n_heads,
                                       n_kv_heads, head_dim, window, ring, 0.0f, 0.0f);
}
