/*
 * attention_decode.cu: attention of one new token against the KV cache
 * (decode), with the rope_qkv step folded in, flash-decoding style: one
 * query gives little parallelism, so the keys are split among blocks that
 * each write their running max, sum and unnormalised output; a second
 * kernel combines them. The position is read from device memory so the
 * decode graph can be replayed at every position.
 */
#include "rope.cuh"

/*
 * A block takes one kv head and one share of the positions; its warps are
 * the q heads of that kv head (GQA), so the K and V rows come from memory
 * once and from L1 for the other heads. Groups wider than the block's warps
 * (a register budget: E > 4 needs more than 128 registers a thread) loop,
 * a warp taking heads warp, warp + warps, ... Within a warp the lanes split
 * the head's dimensions; keys go in groups of DEC_KEYS whose loads are all
 * issued before the first is used, and whose dot products reduce side by side.
 */
#define DEC_KEYS 8
#define DEC_MAX_SPLITS 1024 /* the combine keeps one weight per split in shared memory */

template <int E> struct dec_warps {
    static constexpr int max = E <= 4 ? 16 : 8;
};

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
__global__ void __launch_bounds__(32 * dec_warps<E>::max) k_attention_decode(float *partial, rope_qkv_args a, int window)
{
    extern __shared__ float qs[]; /* [warps][hd]: each warp's q after RoPE */
    const int kvh = blockIdx.x, split = blockIdx.y, splits = gridDim.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    const int nh = a.n_heads, nkv = a.n_kv_heads, hd = a.head_dim, group = nh / nkv, kvd = nkv * hd;
    const T *kc = static_cast<const T *>(a.k_cache), *vc = static_cast<const T *>(a.v_cache);
    dependents_may_launch(); /* the combine and the next product may queue up now */
    const int pos = *a.pos0;
    const int lo0 = window > 0 ? max(0, pos - window + 1) : 0, len = pos + 1 - lo0;
    const int share = (len + splits - 1) / splits;
    const int lo = lo0 + split * share, end = min(lo + share, pos + 1);
    const float scale = rsqrtf((float)hd);

    /* The rope_qkv step for this token, here rather than in a launch of its
     * own: the block whose share holds the new position writes the new k and
     * v into the cache first; every block ropes its q heads below. */
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

#pragma unroll 1
    for (int hq = warp; hq < group; hq += warps) {
        const int h = kvh * group + hq;
        rope_head<float>(qs + warp * hd, a.qkv + (size_t)h * hd, a.bias ? a.bias + (size_t)h * hd : NULL, a.q_norm,
                         a.eps, a.cos, a.sin, pos, hd, true);
        __syncwarp();
        float qv[E], acc[E];
#pragma unroll
        for (int e = 0; e < E; e++) {
            const int d = lane * E + e;
            qv[e] = d < hd ? qs[warp * hd + d] * scale : 0.0f;
            acc[e] = 0.0f;
        }
        __syncwarp(); /* every lane has its q before the next head's overwrites it */
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
}

/*
 * Merge the splits of each head: out = sum_s w_s acc_s / sum_s w_s l_s with
 * w_s = e^(m_s - M). The weights go to shared memory first, so that the sum
 * over splits is a chain of independent loads (unrolled, many in flight)
 * rather than three dependent passes: with 64 splits those passes cost
 * about 25 us a layer, more than the keys themselves.
 */
#define COMBINE_THREADS 128

template <typename O>
__global__ void __launch_bounds__(COMBINE_THREADS) k_attention_combine(O *out, const float *partial, int splits, int hd)
{
    __shared__ float w[DEC_MAX_SPLITS];
    __shared__ float part[COMBINE_THREADS / 32];
    const int h = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    dependents_may_launch();
    dependency_wait(); /* the split results */
    const float *pp = partial + (size_t)h * splits * (hd + 2);
    float mx = -INFINITY;
    for (int s = threadIdx.x; s < splits; s += COMBINE_THREADS) {
        const float ms = pp[(size_t)s * (hd + 2) + hd];
        w[s] = ms;
        mx = fmaxf(mx, ms);
    }
    mx = warp_max(mx);
    if (lane == 0)
        part[warp] = mx;
    __syncthreads();
#pragma unroll
    for (int i = 0; i < COMBINE_THREADS / 32; i++)
        mx = fmaxf(mx, part[i]);
    float den = 0.0f;
    for (int s = threadIdx.x; s < splits; s += COMBINE_THREADS) {
        const float ms = w[s], ws = ms > -INFINITY ? expf(ms - mx) : 0.0f; /* an empty split weighs nothing */
        w[s] = ws;
        den += ws * pp[(size_t)s * (hd + 2) + hd + 1];
    }
    den = block_sum(den); /* its barriers also publish w[] */
    const float inv = den > 0.0f ? 1.0f / den : 0.0f;
    for (int d = threadIdx.x; d < hd; d += COMBINE_THREADS) {
        float num = 0.0f;
#pragma unroll 16
        for (int s = 0; s < splits; s++)
            num += w[s] * pp[(size_t)s * (hd + 2) + d];
        out[(size_t)h * hd + d] = from_f32<O>(num * inv);
    }
}

template <typename T, int E>
static void decode_launch(launch_ctx *c, float *partial, const rope_qkv_args *a, int window, int splits)
{
    const int g = a->n_heads / a->n_kv_heads, warps = g < dec_warps<E>::max ? g : dec_warps<E>::max;
    const dim3 grid((unsigned)a->n_kv_heads, (unsigned)splits), block(32u * (unsigned)warps);
    const size_t smem = (size_t)warps * a->head_dim * sizeof(float);
    k_attention_decode<T, E><<<grid, block, smem, c->stream>>>(partial, *a, window);
}

template <typename T>
static void run_decode(launch_ctx *c, float *partial, const rope_qkv_args *a, int window, int splits)
{
    switch ((a->head_dim + 31) / 32) {
    case 1: decode_launch<T, 1>(c, partial, a, window, splits); break;
    case 2: decode_launch<T, 2>(c, partial, a, window, splits); break;
    case 3: decode_launch<T, 3>(c, partial, a, window, splits); break;
    case 4: decode_launch<T, 4>(c, partial, a, window, splits); break;
    case 5:
    case 6: decode_launch<T, 6>(c, partial, a, window, splits); break;
    default: decode_launch<T, 8>(c, partial, a, window, splits); break;
    }
}

extern "C" size_t launch_attention_decode_scratch(int n_heads, int head_dim, int n_splits)
{
    return (size_t)n_heads * n_splits * (head_dim + 2);
}

extern "C" int launch_attention_decode(launch_ctx *c, const rope_qkv_args *a, void *out, k_dtype ot, int window,
                                       int n_splits, float *partial)
{
    const int nh = a->n_heads, nkv = a->n_kv_heads, hd = a->head_dim;
    if (!out || !a->qkv || !a->k_cache || !a->v_cache || !a->pos0 || !a->cos || !a->sin || !partial || a->n != 1 ||
        nh <= 0 || nkv <= 0 || nh % nkv || hd <= 0 || hd > 256 || hd % 2 || (!a->q_norm) != (!a->k_norm) ||
        n_splits < 1 || n_splits > DEC_MAX_SPLITS)
        return launch_fail(c, "attention_decode: bad arguments (n %d, heads %d/%d, head_dim %d, %d splits)", a->n, nh,
                           nkv, hd, n_splits);
    DISPATCH_TYPE(a->kvt, T, run_decode<T>(c, partial, a, window, n_splits));
    if (launch_check(c, "attention_decode"))
        return -1;
    DISPATCH_TYPE(ot, O, {
        cudaError_t e = launch_pdl(k_attention_combine<O>, dim3(nh), dim3(COMBINE_THREADS), 0, c->stream,
                                   static_cast<O *>(out), static_cast<const float *>(partial), n_splits, hd);
        if (e != cudaSuccess)
            return launch_fail(c, "attention_decode combine: %s", cudaGetErrorString(e));
    });
    return launch_check(c, "attention_decode combine");
}
