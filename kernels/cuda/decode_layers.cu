/*
 * decode_layers.cu: every layer of a decode step in one persistent kernel,
 * for 4-bit weights.
 *
 * Why: one kernel an op (gemv.cu, attention_decode.cu) leaves the memory
 * idle at each of a layer's five boundaries and through attention, which
 * reads almost nothing: bench/RESULTS.md measured 28 µs a layer beyond the
 * bytes on the 8B NF4 shape, more than half the weights' own time. Here
 * the weights do not wait for dependencies at all. Each block (one a
 * multiprocessor) owns a fixed share of every op: row tiles of the
 * products, a (kv head, key range) unit of attention. A producer warp
 * copies the block's tiles, in the order the block will use them, into a
 * ring of shared memory through the bulk copy engine, as fast as slots
 * free up: while the consumer warps wait for an op's input, the next ops'
 * weights are already landing. Ops depend on each other through counters
 * in global memory: each block adds 1 to an op's counter when its share is
 * written, and an op starts once the previous op's counter reaches the
 * grid's size (every product needs all of its input). Activations are
 * read through L2 (__ldcg): L1 is not coherent between multiprocessors.
 *
 * The arithmetic is gemv.cu's (the staged fp16 input, the 4-bit dot of
 * q4_pairs.cuh, two rows a warp) and attention_decode.cu's (rope, an
 * online softmax per key chunk, splits merged with their max and sum);
 * the splits of a kv head are merged by the last of its blocks to finish.
 *
 * Status: an experiment (the engine takes it only with ENGINE_DECODE=fused).
 * On an H200 it decodes the 8B NF4 shape at 356 tok/s against 454 for the
 * one-kernel-an-op path, the 1B at 1,153 against 1,505: each op's wait for
 * the counter and its staging of the input take longer here, because those
 * reads queue behind the copies streaming in, and the ring (144 KB a
 * multiprocessor) holds only ~4 µs of streaming, less than a layer's waits.
 * bench/RESULTS.md (2026-11-26) has the timeline (bench/dlayers --trace).
 */
#include "common.cuh"
#include "q4_pairs.cuh"
#include "rope.cuh"

/* Consumer warps: with the producer 12 warps (168 registers); 8 and 15 measured slower, and 16 would be
 * allocated as 20 warps and get 96 registers, spilling (bench/RESULTS.md). */
#ifndef DL_CW
#define DL_CW 11
#endif
#define DL_CT (DL_CW * 32)              /* consumer threads                    */
#define DL_THREADS (DL_CT + 32)         /* and the producer warp (the last)    */
#ifndef DL_SLOT
#define DL_SLOT (36 * 1024)             /* bytes a ring slot                   */
#endif
#ifndef DL_NSLOT
#define DL_NSLOT 4
#endif
#define DL_MAX_PAIRS 8                  /* row pairs a product tile at most    */
#define DL_MAX_SPLITS 16

enum { OP_QKV = 0, OP_ATT, OP_O, OP_GU, OP_DOWN, OP_N };

/* The sync words: op counters [n_layers][OP_N], input maxima [n_layers][4], attention arrivals [n_layers][nkv]. */
struct dl_sync {
    unsigned *ctr, *mx, *arrive;
    __host__ __device__ dl_sync(unsigned *s, int n_layers)
        : ctr(s), mx(s + (size_t)n_layers * OP_N), arrive(s + (size_t)n_layers * (OP_N + 4))
    {
    }
};

/* A product's tiles: 2 * rp slot rows a tile (gate/up: rp gate rows, then the same rp up rows). */
struct op_shape {
    int rows; /* outputs (gate/up: pairs) */
    int cols, rp;
    int rb, ab; /* bytes of a row's weights and of its absmax */
    int tiles;
};

__host__ __device__ inline op_shape shape_of(const decode_layers_args &a, int op)
{
    const int qd = a.n_heads * a.head_dim, kvd = a.n_kv_heads * a.head_dim;
    op_shape s;
    s.rows = op == OP_QKV ? qd + 2 * kvd : op == OP_GU ? a.ffn_dim : a.dim;
    s.cols = op == OP_O ? qd : op == OP_DOWN ? a.ffn_dim : a.dim;
    s.rb = s.cols / 2;
    s.ab = s.cols / a.group * 4;
    s.rp = DL_SLOT / (2 * (s.rb + s.ab));
    if (s.rp > DL_MAX_PAIRS)
        s.rp = DL_MAX_PAIRS;
    const int per = op == OP_GU ? s.rp : 2 * s.rp;
    s.tiles = s.rp > 0 ? (s.rows + per - 1) / per : 0;
    return s;
}

/* Keys a slot holds (K then V rows, fp16). */
__host__ __device__ inline int keys_a_slot(int hd) { return DL_SLOT / (4 * hd); }

/* The first of `n` items (tile or unit t goes to block (base + t) % G) that this block takes. */
__device__ __forceinline__ int first_item(int base) { return (int)(((long)blockIdx.x - base % (int)gridDim.x + gridDim.x) % gridDim.x); }

/* The key range [lo, end) of attention unit `split`. */
__device__ __forceinline__ void split_range(int pos, int splits, int split, int &lo, int &end)
{
    const int len = pos + 1, share = (len + splits - 1) / splits;
    lo = split * share;
    end = min(lo + share, len);
}

__device__ __forceinline__ void mbar_arrive(uint64_t *bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbar_arrive_n(uint64_t *bar, unsigned n)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(n) : "memory");
}
/* bytes (a multiple of 16, both ends 16-byte aligned) into shared memory, completing on bar. */
__device__ __forceinline__ void bulk_copy(void *dst, const void *src, unsigned bytes, uint64_t *bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_addr(dst)),
                 "l"(src), "r"(bytes), "r"(smem_addr(bar))
                 : "memory");
}
/* The consumer warps' barrier (the producer runs on). */
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, %0;" ::"n"(DL_CT) : "memory"); }

__device__ __forceinline__ const void *op_weights(const decode_layer_w &L, int op)
{
    return op == OP_QKV ? L.wqkv : op == OP_O ? L.wo : op == OP_GU ? L.wgu : L.wdown;
}
__device__ __forceinline__ const float *op_absmax(const decode_layer_w &L, int op)
{
    return op == OP_QKV ? L.aqkv : op == OP_O ? L.ao : op == OP_GU ? L.agu : L.adown;
}

/* ---- the producer warp: every copy of the block, in the consumers' order ---- */

/* One slot's worth of the block's input: a product tile (up to 4 contiguous copies) or a chunk of cached keys. */
struct piece {
    bool kv;
    int n;                  /* tile: copies                                       */
    const char *src[4];
    unsigned bytes[4], dst[4];
    const char *kc, *vc;    /* kv: this kv head's column of the caches            */
    int c0, nk;             /* kv: rows c0 .. c0 + nk - 1, all but the new one    */
    unsigned total;         /* bytes the slot receives                            */
};

/* Where a walk over the block's pieces stands: layer, op, item (tile or unit), key chunk. */
struct walker {
    int l = 0, op = 0, idx = 0, n = 0, c0 = -1, base = 0;
    bool in_op = false;
};

/* The block's next piece in the consumers' order; false at the end. Every lane of the warp walks alike. */
__device__ bool walk(const decode_layers_args &a, int splits, int pos, walker &w, piece &p)
{
    const int G = gridDim.x, ch = keys_a_slot(a.head_dim);
    const unsigned hrb = (unsigned)a.head_dim * 2;
    while (w.l < a.n_layers) {
        const decode_layer_w &L = a.layers[w.l];
        if (!w.in_op) {
            w.n = w.op == OP_ATT ? a.n_kv_heads * splits : shape_of(a, w.op).tiles;
            w.idx = first_item(w.base);
            w.c0 = -1;
            w.in_op = true;
        }
        if (w.op == OP_ATT) {
            for (; w.idx < w.n; w.idx += G, w.c0 = -1) {
                int lo, end;
                split_range(pos, splits, w.idx % splits, lo, end);
                w.c0 = w.c0 < 0 ? lo : w.c0 + ch;
                if (w.c0 < end) {
                    const size_t col = (size_t)(w.idx / splits) * hrb;
                    p.kv = true;
                    p.kc = static_cast<const char *>(L.k_cache) + col;
                    p.vc = static_cast<const char *>(L.v_cache) + col;
                    p.c0 = w.c0;
                    p.nk = min(ch, end - w.c0);
                    p.total = (unsigned)(p.nk - (w.c0 <= pos && pos < w.c0 + p.nk ? 1 : 0)) * 2 * hrb;
                    return true;
                }
            }
        } else if (w.idx < w.n) {
            const op_shape sh = shape_of(a, w.op);
            const char *wt = static_cast<const char *>(op_weights(L, w.op));
            const char *am = reinterpret_cast<const char *>(op_absmax(L, w.op));
            const unsigned sa = (unsigned)(2 * sh.rp * sh.rb);
            const int t = w.idx;
            w.idx += G;
            p.kv = false;
            if (w.op == OP_GU) {
                const int j0 = t * sh.rp, np = min(sh.rp, sh.rows - j0), up = sh.rows + j0;
                p.n = 4;
                p.src[0] = wt + (size_t)j0 * sh.rb, p.bytes[0] = np * sh.rb, p.dst[0] = 0;
                p.src[1] = wt + (size_t)up * sh.rb, p.bytes[1] = np * sh.rb, p.dst[1] = sh.rp * sh.rb;
                p.src[2] = am + (size_t)j0 * sh.ab, p.bytes[2] = np * sh.ab, p.dst[2] = sa;
                p.src[3] = am + (size_t)up * sh.ab, p.bytes[3] = np * sh.ab, p.dst[3] = sa + sh.rp * sh.ab;
                p.total = (unsigned)np * 2 * (sh.rb + sh.ab);
            } else {
                const int r0 = t * 2 * sh.rp, nr = min(2 * sh.rp, sh.rows - r0);
                p.n = 2;
                p.src[0] = wt + (size_t)r0 * sh.rb, p.bytes[0] = nr * sh.rb, p.dst[0] = 0;
                p.src[1] = am + (size_t)r0 * sh.ab, p.bytes[1] = nr * sh.ab, p.dst[1] = sa;
                p.total = (unsigned)nr * (sh.rb + sh.ab);
            }
            return true;
        }
        w.base += w.n;
        w.in_op = false;
        if (++w.op == OP_N) {
            w.op = 0;
            w.l++;
        }
    }
    return false;
}

/*
 * The producer: each piece into the next ring slot as soon as the consumers
 * have freed it. (Prefetching the pieces beyond the ring into L2 while no
 * slot was free, to keep the memory streaming through the waits, measured
 * slower: the waits' own reads queued behind it. bench/RESULTS.md.)
 */
__device__ void produce(const decode_layers_args &a, int splits, unsigned char *ring, uint64_t *full, uint64_t *empty)
{
    const int lane = threadIdx.x & 31, kvd = a.n_kv_heads * a.head_dim, ch = keys_a_slot(a.head_dim);
    const int pos = *a.pos;
    const unsigned hrb = (unsigned)a.head_dim * 2;
    walker w;
    piece p;
    for (unsigned seq = 0; walk(a, splits, pos, w, p); seq++) {
        const unsigned s = seq % DL_NSLOT, ph = (seq / DL_NSLOT) & 1;
        if (lane == 0) {
            mbar_wait(&empty[s], ph ^ 1);
            mbar_expect(&full[s], p.total);
        }
        __syncwarp();
        unsigned char *slot = ring + (size_t)s * DL_SLOT;
        if (p.kv) {
            for (int k = lane; k < p.nk; k += 32) {
                const int q = p.c0 + k;
                if (q == pos) /* the new row comes from the rope step */
                    continue;
                bulk_copy(slot + (size_t)k * hrb, p.kc + (size_t)q * kvd * 2, hrb, &full[s]);
                bulk_copy(slot + (size_t)(ch + k) * hrb, p.vc + (size_t)q * kvd * 2, hrb, &full[s]);
            }
        } else if (lane == 0) {
            for (int i = 0; i < p.n; i++)
                bulk_copy(slot + p.dst[i], p.src[i], p.bytes[i], &full[s]);
        }
    }
}

/* ---- the consumer warps ---- */

__device__ __forceinline__ void stamp(const decode_layers_args &a, int l, int op, int k)
{
    if (a.trace && threadIdx.x == 0) {
        unsigned long long t;
        asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
        a.trace[(((size_t)l * OP_N + op) * gridDim.x + blockIdx.x) * 4 + k] = t;
    }
}

/* Shared state of the consumers besides the dynamic buffers. */
struct dl_shared {
    float red[2][DL_CW];
    unsigned blk_max;
    int last; /* this block merges its kv head's splits */
};

/* Wait until every block has posted op counter *ctr (thread 0 polls; the consumers follow). */
__device__ void wait_op(const unsigned *ctr)
{
    if (threadIdx.x == 0) {
        unsigned v;
        do
            asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(ctr) : "memory");
        while (v < gridDim.x);
        asm volatile("fence.acq_rel.gpu;" ::: "memory");
    }
    consumers_sync();
}

/* This block's share of an op is written: post its output's maximum (if any) and the counter. */
__device__ void post_op(dl_shared &sh, unsigned *ctr, unsigned *max_slot, float ymx)
{
    __threadfence();
    ymx = warp_max(ymx);
    if ((threadIdx.x & 31) == 0 && ymx > 0.0f)
        atomicMax(&sh.blk_max, __float_as_uint(ymx));
    consumers_sync();
    if (threadIdx.x == 0) {
        if (max_slot && sh.blk_max)
            atomicMax(max_slot, sh.blk_max);
        sh.blk_max = 0;
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(ctr) : "memory");
    }
}

/*
 * The product's input into xs as fp16, column j at xs[j + j / 32 * 8],
 * scaled as gemv.cu's stage_input does (the largest |x * norm| into
 * [2^11, 2^12)); x_max: that maximum as the writer posted it, or NULL to
 * find it here (a first pass). Returns what the sums are multiplied by.
 */
template <bool RMS>
__device__ __noinline__ float stage(dl_shared &sh, __half *xs, const float *x, const float *norm, int cols, float eps,
                       const unsigned *x_max)
{
    const int ct = threadIdx.x, n8 = cols / 8, warp = ct >> 5, lane = ct & 31;
    float ss = 0.0f, f, inv = 1.0f;
    int e;
    auto load8 = [&](float *v, const float *p, int j, bool cg) {
        const float4 u0 = cg ? __ldcg(reinterpret_cast<const float4 *>(p) + 2 * j) : __ldg(reinterpret_cast<const float4 *>(p) + 2 * j);
        const float4 u1 = cg ? __ldcg(reinterpret_cast<const float4 *>(p) + 2 * j + 1) : __ldg(reinterpret_cast<const float4 *>(p) + 2 * j + 1);
        v[0] = u0.x, v[1] = u0.y, v[2] = u0.z, v[3] = u0.w, v[4] = u1.x, v[5] = u1.y, v[6] = u1.z, v[7] = u1.w;
    };
    if (x_max) {
        e = max((int)((__ldcg(x_max) >> 23) & 0xff), 12);
        f = __int_as_float((265 - e) << 23);
    } else {
        float mx = 0.0f, v[8], g[8];
        for (int j = ct; j < n8; j += DL_CT) {
            load8(v, x, j, true);
            if (RMS)
                load8(g, norm, j, false);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                if (RMS)
                    ss += v[i] * v[i];
                mx = fmaxf(mx, fabsf(RMS ? v[i] * g[i] : v[i]));
            }
        }
        ss = warp_sum(ss);
        mx = warp_max(mx);
        if (lane == 0) {
            sh.red[0][warp] = ss;
            sh.red[1][warp] = mx;
        }
        consumers_sync();
        ss = 0.0f;
        mx = 0.0f;
        for (int w = 0; w < DL_CW; w++) {
            ss += sh.red[0][w];
            mx = fmaxf(mx, sh.red[1][w]);
        }
        inv = RMS ? rsqrtf(ss / cols + eps) : 1.0f;
        e = max((__float_as_int(mx * inv) >> 23) & 0xff, 12);
        f = inv * __int_as_float((265 - e) << 23);
        ss = 0.0f;
        consumers_sync(); /* red is written again below */
    }
    /* SB groups of 8 a thread at once: all their loads, then all their stores (one L2 round trip, not SB). */
    constexpr int SB = RMS ? 1 : 2;
    for (int j0 = ct; j0 < n8; j0 += SB * DL_CT) {
        float v[SB][8], g[SB][8];
#pragma unroll
        for (int b = 0; b < SB; b++)
            if (j0 + b * DL_CT < n8) {
                load8(v[b], x, j0 + b * DL_CT, true);
                if (RMS)
                    load8(g[b], norm, j0 + b * DL_CT, false);
            }
#pragma unroll
        for (int b = 0; b < SB; b++) {
            const int j = j0 + b * DL_CT;
            if (j >= n8)
                break;
            __half2 h[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                if (RMS && x_max)
                    ss += v[b][2 * i] * v[b][2 * i] + v[b][2 * i + 1] * v[b][2 * i + 1];
                h[i] = RMS ? __floats2half2_rn(v[b][2 * i] * g[b][2 * i] * f, v[b][2 * i + 1] * g[b][2 * i + 1] * f)
                           : __floats2half2_rn(v[b][2 * i] * f, v[b][2 * i + 1] * f);
            }
            *reinterpret_cast<uint4 *>(xs + 8 * j + j / 4 * 8) = *reinterpret_cast<const uint4 *>(h);
        }
    }
    float undo = __int_as_float((e - 11) << 23);
    if (RMS && x_max) {
        ss = warp_sum(ss);
        if (lane == 0)
            sh.red[0][warp] = ss;
    }
    consumers_sync(); /* publishes xs */
    if (RMS && x_max) {
        float t = 0.0f;
        for (int w = 0; w < DL_CW; w++)
            t += sh.red[0][w];
        undo *= rsqrtf(t / cols + eps);
    }
    return undo;
}

/*
 * One product op of one layer: stage the input, then the block's tiles
 * from the ring, two rows a warp (a gate row and its up row for gate/up),
 * each lane summing its chunks in the order gemv.cu's does.
 */
__device__ __noinline__ void product(const decode_layers_args &a, dl_shared &sh, int l, int op, int &base, unsigned &seq,
                        unsigned char *ring, uint64_t *full, uint64_t *empty, __half *xs)
{
    const dl_sync sy(a.sync, a.n_layers);
    const decode_layer_w &L = a.layers[l];
    const op_shape s = shape_of(a, op);
    const int ct = threadIdx.x, cw = ct >> 5, lane = ct & 31, G = gridDim.x;
    const int t0 = first_item(base);
    base += s.tiles;
    unsigned *const ctr = sy.ctr + (size_t)l * OP_N + op;
    /* Where this op's output maximum goes: the input of the op that reads it (none for q/k/v). */
    const bool last = l + 1 == a.n_layers;
    unsigned *const out_max = op == OP_O ? sy.mx + (size_t)l * 4 + 2
                              : op == OP_GU ? sy.mx + (size_t)l * 4 + 3
                              : op == OP_DOWN ? (last ? a.head_max : sy.mx + (size_t)(l + 1) * 4)
                                              : nullptr;
    const float *out_norm = op == OP_O ? L.ffn_norm : op == OP_DOWN ? (last ? a.head_norm : a.layers[l + 1].attn_norm) : nullptr;
    float ymx = 0.0f;
    stamp(a, l, op, 0);
    if (t0 >= s.tiles) {
        post_op(sh, ctr, out_max, ymx);
        stamp(a, l, op, 3);
        return;
    }
    /* The input: x normalised (q/k/v, gate/up), attention's output (o) or the gated units (down). */
    float xscale;
    if (op == OP_QKV) {
        if (l > 0)
            wait_op(sy.ctr + (size_t)(l - 1) * OP_N + OP_DOWN);
        stamp(a, l, op, 1);
        xscale = stage<true>(sh, xs, a.x, L.attn_norm, s.cols, a.eps, l > 0 ? sy.mx + (size_t)l * 4 : nullptr);
    } else if (op == OP_GU) {
        wait_op(sy.ctr + (size_t)l * OP_N + OP_O);
        stamp(a, l, op, 1);
        xscale = stage<true>(sh, xs, a.x, L.ffn_norm, s.cols, a.eps, sy.mx + (size_t)l * 4 + 2);
    } else {
        wait_op(sy.ctr + (size_t)l * OP_N + op - 1);
        stamp(a, l, op, 1);
        xscale = stage<false>(sh, xs, op == OP_O ? a.att : a.gu, nullptr, s.cols, a.eps, sy.mx + (size_t)l * 4 + (op == OP_O ? 1 : 3));
    }
    stamp(a, l, op, 2);
    /*
     * Work items are (tile, pair): item i of this block's run of tiles goes
     * to warp i % DL_CW, so each warp walks whole row pairs with no barrier
     * between warps, and where a tile has fewer pairs than there are warps
     * (wide rows) several tiles are worked on at once. A slot is free once
     * its pairs are done: each pair's warp arrives on it with its share of
     * DL_CW arrivals.
     */
    const int nc = s.cols / 32, gshift = __ffs(a.group) - 1, aw = s.ab / 4;
    const int per = op == OP_GU ? s.rp : 2 * s.rp; /* rows (gate/up: pairs) a tile */
    int item = 0;
    for (int t = t0; t < s.tiles; t += G) {
        const unsigned si = seq % DL_NSLOT, ph = (seq / DL_NSLOT) & 1;
        seq++;
        const int first = t * per, nr = min(per, s.rows - first);
        const int P = op == OP_GU ? nr : (nr + 1) / 2;
        const int p0 = (cw - item % DL_CW + DL_CW) % DL_CW; /* this warp's first pair of the tile */
        item += P;
        if (p0 >= P)
            continue;
        mbar_wait(&full[si], ph);
        const unsigned char *sw = ring + (size_t)si * DL_SLOT;
        const float *sa = reinterpret_cast<const float *>(sw + (size_t)2 * s.rp * s.rb);
        for (int p = p0; p < P; p += DL_CW) {
            /* The pair's rows in the slot (an odd tile's last row twice: its second sum is dropped) and outputs. */
            const int ia = op == OP_GU ? p : 2 * p, ib = op == OP_GU ? s.rp + p : min(2 * p + 1, nr - 1);
            const int oa = first + (op == OP_GU ? p : 2 * p), ob = op == OP_GU ? -1 : (2 * p + 1 < nr ? oa + 1 : -1);
            /* What the outputs add to and scale their maximum by, loaded before the sums need them. */
            float ra = 0.0f, rb = 0.0f, na = 0.0f, nb = 0.0f;
            if (lane == 0 && (op == OP_O || op == OP_DOWN)) {
                ra = __ldcg(a.x + oa);
                na = out_max ? __ldg(out_norm + oa) : 0.0f;
                if (ob >= 0) {
                    rb = __ldcg(a.x + ob);
                    nb = out_max ? __ldg(out_norm + ob) : 0.0f;
                }
            }
            const uint4 *wa = reinterpret_cast<const uint4 *>(sw + (size_t)ia * s.rb);
            const uint4 *wb = reinterpret_cast<const uint4 *>(sw + (size_t)ib * s.rb);
            const float *aa = sa + (size_t)ia * aw, *ab = sa + (size_t)ib * aw;
            float acc0 = 0.0f, acc1 = 0.0f;
            for (int c = lane; c < nc; c += 32) {
                const __half *xc = static_cast<const __half *>(__builtin_assume_aligned(xs + c * 40, 16));
                const int g = (c * 32) >> gshift;
                acc0 += q4_dot(wa[c], aa[g], xc);
                acc1 += q4_dot(wb[c], ab[g], xc);
            }
            acc0 = warp_sum(acc0) * xscale;
            acc1 = warp_sum(acc1) * xscale;
            if (lane != 0)
                continue;
            if (op == OP_GU) {
                const float h = acc0 / (1.0f + expf(-acc0)) * acc1;
                a.gu[oa] = h;
                ymx = fmaxf(ymx, fabsf(h));
            } else if (op == OP_QKV) {
                a.qkv[oa] = acc0;
                if (ob >= 0)
                    a.qkv[ob] = acc1;
            } else {
                a.x[oa] = acc0 + ra;
                ymx = fmaxf(ymx, fabsf((acc0 + ra) * na));
                if (ob >= 0) {
                    a.x[ob] = acc1 + rb;
                    ymx = fmaxf(ymx, fabsf((acc1 + rb) * nb));
                }
            }
        }
        __syncwarp();
        if (lane == 0) { /* this warp's pairs of the slot are done: its arrivals */
            /* P >= DL_CW: every warp once; else the P warps share DL_CW */
            const int n = P >= DL_CW ? 1 : DL_CW / P + (p0 < DL_CW % P);
            mbar_arrive_n(&empty[si], (unsigned)n);
        }
    }
    post_op(sh, ctr, out_max, ymx);
    stamp(a, l, op, 3);
}

/* Attention scratch in the staging buffer: q, the output accumulator, scores, max, sum, correction, merge weights. */
struct att_smem {
    float *qs, *os, *sc, *ms, *ls, *cr, *wt;
    __half *nrow; /* the new k and v rows [2][hd] */
    __device__ att_smem(void *base, int G, int hd, int ch)
    {
        nrow = static_cast<__half *>(base);
        qs = reinterpret_cast<float *>(nrow + 2 * hd);
        os = qs + G * hd;
        sc = os + G * hd;
        ms = sc + G * ch;
        ls = ms + G;
        cr = ls + G;
        wt = cr + G;
    }
    static __host__ __device__ size_t bytes(int G, int hd, int ch)
    {
        return (size_t)2 * hd * 2 + ((size_t)2 * G * hd + (size_t)G * ch + 3 * G + (size_t)DL_MAX_SPLITS * G) * 4;
    }
};

/* The attention op: rope, this block's key ranges against the ring, partial results, and the merge by the last split. */
__device__ __noinline__ void attention(const decode_layers_args &a, dl_shared &sh, int l, int splits, int &base, unsigned &seq,
                          unsigned char *ring, uint64_t *full, uint64_t *empty, void *scratch)
{
    const dl_sync sy(a.sync, a.n_layers);
    const decode_layer_w &L = a.layers[l];
    const int ct = threadIdx.x, cw = ct >> 5, lane = ct & 31, G = gridDim.x;
    const int nh = a.n_heads, nkv = a.n_kv_heads, hd = a.head_dim, Gq = nh / nkv, kvd = nkv * hd;
    const int units = nkv * splits, ch = keys_a_slot(hd), nG = hd / 8;
    const int u0 = first_item(base);
    base += units;
    unsigned *const ctr = sy.ctr + (size_t)l * OP_N + OP_ATT;
    unsigned *const out_max = sy.mx + (size_t)l * 4 + 1;
    float ymx = 0.0f;
    stamp(a, l, OP_ATT, 0);
    if (u0 >= units) {
        post_op(sh, ctr, out_max, ymx);
        stamp(a, l, OP_ATT, 3);
        return;
    }
    wait_op(sy.ctr + (size_t)l * OP_N + OP_QKV);
    stamp(a, l, OP_ATT, 1);
    const int pos = *a.pos;
    const float scale = rsqrtf((float)hd);
    const size_t pstride = (size_t)2 * Gq + (size_t)Gq * hd; /* a unit's partial result: max, sum, accumulators */
    att_smem m(scratch, Gq, hd, ch);
    for (int u = u0; u < units; u += G) {
        const int kvh = u / splits, split = u % splits;
        int lo, end;
        split_range(pos, splits, split, lo, end);
        const bool has_new = lo <= pos && pos < end;
        /* rope: q of each head of the group; the new k and v into the cache (the block that holds pos) */
        const int tasks = Gq + (has_new ? 2 : 0);
        for (int t = cw; t < tasks; t += DL_CW) {
            if (t < Gq) {
                rope_head<float, true>(m.qs + t * hd, a.qkv + (size_t)(kvh * Gq + t) * hd, nullptr, nullptr, a.eps, a.cos,
                                 a.sin, pos, hd, true);
                continue;
            }
            const int is_v = t - Gq;
            __half *row = m.nrow + is_v * hd;
            rope_head<__half, true>(row, a.qkv + (size_t)(nh + (is_v ? nkv : 0) + kvh) * hd, nullptr, nullptr, a.eps, a.cos,
                              a.sin, pos, hd, !is_v);
            __syncwarp();
            uint4 *cache = reinterpret_cast<uint4 *>(static_cast<__half *>(is_v ? L.v_cache : L.k_cache) +
                                                     (size_t)pos * kvd + (size_t)kvh * hd);
            for (int c = lane; c < nG; c += 32)
                cache[c] = reinterpret_cast<const uint4 *>(row)[c];
        }
        for (int i = ct; i < Gq * hd; i += DL_CT)
            m.os[i] = 0.0f;
        for (int g = ct; g < Gq; g += DL_CT) {
            m.ms[g] = -INFINITY;
            m.ls[g] = 0.0f;
        }
        consumers_sync();
        stamp(a, l, OP_ATT, 2);
        for (int c0 = lo; c0 < end; c0 += ch) {
            const unsigned si = seq % DL_NSLOT, ph = (seq / DL_NSLOT) & 1;
            seq++;
            mbar_wait(&full[si], ph);
            unsigned char *slot = ring + (size_t)si * DL_SLOT;
            const uint4 *kb = reinterpret_cast<const uint4 *>(slot);
            const __half2 *vb = reinterpret_cast<const __half2 *>(slot + (size_t)ch * hd * 2);
            const int nk = min(ch, end - c0);
            if (c0 <= pos && pos < c0 + nk) { /* the new row, which no copy brought */
                const int k = pos - c0;
                for (int i = ct; i < 2 * nG; i += DL_CT)
                    reinterpret_cast<uint4 *>(slot + (size_t)(i < nG ? k : ch + k) * hd * 2)[i % nG] =
                        reinterpret_cast<const uint4 *>(m.nrow)[i];
                asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); /* the slot is refilled by copies later */
                consumers_sync();
            }
            /* scores: a thread per (head, key), granules in a rotated order so that a warp's keys spread over banks */
            for (int i = ct; i < Gq * nk; i += DL_CT) {
                const int g = i / nk, k = i - g * nk;
                const uint4 *kr = kb + (size_t)k * nG;
                const float *q = m.qs + g * hd;
                float d0 = 0.0f, d1 = 0.0f;
                int c = k % nG;
                for (int n = 0; n < nG; n++) {
                    const uint4 kv = kr[c];
                    const float4 qa = reinterpret_cast<const float4 *>(q)[2 * c], qb = reinterpret_cast<const float4 *>(q)[2 * c + 1];
                    const float2 k0 = __half22float2(*reinterpret_cast<const __half2 *>(&kv.x));
                    const float2 k1 = __half22float2(*reinterpret_cast<const __half2 *>(&kv.y));
                    const float2 k2 = __half22float2(*reinterpret_cast<const __half2 *>(&kv.z));
                    const float2 k3 = __half22float2(*reinterpret_cast<const __half2 *>(&kv.w));
                    d0 += k0.x * qa.x + k0.y * qa.y + k2.x * qb.x + k2.y * qb.y;
                    d1 += k1.x * qa.z + k1.y * qa.w + k3.x * qb.z + k3.y * qb.w;
                    if (++c == nG)
                        c = 0;
                }
                m.sc[g * ch + k] = (d0 + d1) * scale;
            }
            consumers_sync();
            /* online softmax: a warp a head */
            for (int g = cw; g < Gq; g += DL_CW)
                warp_softmax_step(m.sc + g * ch, nk, m.ms, m.ls, m.cr, g);
            consumers_sync();
            /* values: a thread per (head, pair of dims) */
            for (int i = ct; i < Gq * hd / 2; i += DL_CT) {
                const int g = i / (hd / 2), d = i - g * (hd / 2);
                const float *p = m.sc + g * ch;
                float2 acc = make_float2(0.0f, 0.0f);
                for (int k = 0; k < nk; k++) {
                    const float2 v = __half22float2(vb[(size_t)k * (hd / 2) + d]);
                    acc.x += p[k] * v.x;
                    acc.y += p[k] * v.y;
                }
                float2 *o = reinterpret_cast<float2 *>(m.os + g * hd) + d;
                const float cr = m.cr[g];
                *o = make_float2(o->x * cr + acc.x, o->y * cr + acc.y);
            }
            __syncwarp();
            if (lane == 0)
                mbar_arrive(&empty[si]);
            consumers_sync(); /* sc and the accumulators are used again */
        }
        /* the partial result; the last of the kv head's splits to arrive merges them all */
        float *part = a.part + (size_t)u * pstride;
        for (int i = ct; i < Gq * hd; i += DL_CT)
            part[2 * Gq + i] = m.os[i];
        for (int g = ct; g < Gq; g += DL_CT) {
            part[g] = m.ms[g];
            part[Gq + g] = m.ls[g];
        }
        __threadfence();
        consumers_sync();
        if (ct == 0) {
            const unsigned old = atomicAdd(sy.arrive + (size_t)l * nkv + kvh, 1u);
            sh.last = old == (unsigned)splits - 1;
            if (sh.last)
                __threadfence();
        }
        consumers_sync();
        if (sh.last) {
            const float *p0 = a.part + (size_t)kvh * splits * pstride;
            for (int g = cw; g < Gq; g += DL_CW) {
                const float m_s = lane < splits ? __ldcg(p0 + lane * pstride + g) : -INFINITY;
                const float l_s = lane < splits ? __ldcg(p0 + lane * pstride + Gq + g) : 0.0f;
                const float mx = warp_max(m_s);
                const float w = m_s == -INFINITY ? 0.0f : expf(m_s - mx);
                const float den = warp_sum(w * l_s);
                if (lane < splits)
                    m.wt[lane * Gq + g] = w / den;
            }
            consumers_sync();
            for (int o = ct; o < Gq * hd; o += DL_CT) {
                const int g = o / hd;
                float num = 0.0f;
                for (int s = 0; s < splits; s++)
                    num += m.wt[s * Gq + g] * __ldcg(p0 + s * pstride + 2 * Gq + o);
                a.att[(size_t)kvh * Gq * hd + o] = num;
                ymx = fmaxf(ymx, fabsf(num));
            }
        }
        consumers_sync(); /* the scratch is used again by the next unit */
    }
    post_op(sh, ctr, out_max, ymx);
    stamp(a, l, OP_ATT, 3);
}

__global__ void __launch_bounds__(DL_THREADS, 1) k_decode_layers(decode_layers_args a, int splits)
{
    extern __shared__ __align__(128) unsigned char dsm[];
    __shared__ uint64_t full[DL_NSLOT], empty[DL_NSLOT];
    __shared__ dl_shared sh;
    unsigned char *ring = dsm;
    __half *xs = reinterpret_cast<__half *>(dsm + (size_t)DL_NSLOT * DL_SLOT);
    if (threadIdx.x == 0) {
        for (int s = 0; s < DL_NSLOT; s++) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], DL_CW);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        sh.blk_max = 0;
    }
    build_pairs(a.code);
    __syncthreads();
    if (threadIdx.x >= DL_CT) {
        produce(a, splits, ring, full, empty);
        return;
    }
    int base = 0;
    unsigned seq = 0;
    for (int l = 0; l < a.n_layers; l++) {
        product(a, sh, l, OP_QKV, base, seq, ring, full, empty, xs);
        attention(a, sh, l, splits, base, seq, ring, full, empty, xs);
        product(a, sh, l, OP_O, base, seq, ring, full, empty, xs);
        product(a, sh, l, OP_GU, base, seq, ring, full, empty, xs);
        product(a, sh, l, OP_DOWN, base, seq, ring, full, empty, xs);
    }
}

/* ---- host side ---- */

static int splits_of(const launch_ctx *c, int n_kv_heads)
{
    const int s = c->n_sms / (n_kv_heads > 0 ? n_kv_heads : 1);
    return s < 1 ? 1 : s > DL_MAX_SPLITS ? DL_MAX_SPLITS : s;
}

extern "C" size_t decode_layers_part_floats(const launch_ctx *c, int n_heads, int n_kv_heads, int head_dim)
{
    const size_t g = (size_t)(n_heads / (n_kv_heads > 0 ? n_kv_heads : 1));
    return (size_t)n_kv_heads * splits_of(c, n_kv_heads) * (2 * g + g * head_dim);
}

extern "C" size_t decode_layers_sync_words(int n_layers, int n_kv_heads)
{
    return (size_t)n_layers * (OP_N + 4 + n_kv_heads);
}

/* Bytes of the staging buffer (the widest input in fp16, padded; attention's scratch shares it). */
static size_t stage_bytes(const decode_layers_args *a)
{
    const int qd = a->n_heads * a->head_dim;
    int cols = a->dim > qd ? a->dim : qd;
    cols = cols > a->ffn_dim ? cols : a->ffn_dim;
    const size_t in = ((size_t)cols + cols / 32 * 8) * sizeof(__half);
    const int G = a->n_heads / a->n_kv_heads;
    const size_t att = att_smem::bytes(G, a->head_dim, keys_a_slot(a->head_dim));
    return (in > att ? in : att + 15) / 16 * 16;
}

static bool aligned16(const void *p) { return (uintptr_t)p % 16 == 0; }

extern "C" bool decode_layers_supported(launch_ctx *c, const decode_layers_args *a)
{
    int dev = 0, major = 0, coop = 0, optin = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) ||
        cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev) ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev)) {
        (void)cudaGetLastError();
        launch_fail(c, "decode_layers: cannot query the device");
        return false;
    }
    if (major < 9 || !coop) {
        launch_fail(c, "decode_layers: needs compute capability 9.0 and cooperative launches");
        return false;
    }
    const int nh = a->n_heads, nkv = a->n_kv_heads, hd = a->head_dim;
    if (a->n_layers < 1 || nh < 1 || nkv < 1 || nh % nkv || hd < 8 || hd > 256 || hd % 8 || nh / nkv > 32 ||
        a->group < 32 || (a->group & (a->group - 1)) || !a->layers || !a->code || !a->pos || !a->x || !a->qkv ||
        !a->att || !a->gu || !a->part || !a->sync || !a->cos || !a->sin || (a->head_max && !a->head_norm)) {
        launch_fail(c, "decode_layers: unsupported shape or missing buffers");
        return false;
    }
    for (int op = 0; op < OP_N; op++) {
        if (op == OP_ATT)
            continue;
        const op_shape s = shape_of(*a, op);
        /* 16-byte chunks, whole absmax blocks a row, 16-byte absmax rows, a pair of rows a slot at least */
        if (s.cols % 32 || s.cols % a->group || (s.cols / a->group) % 4 || s.rp < 1) {
            launch_fail(c, "decode_layers: op %d's %d columns do not fit its tiles", op, s.cols);
            return false;
        }
    }
    if (keys_a_slot(hd) < 1 || stage_bytes(a) + (size_t)DL_NSLOT * DL_SLOT + sizeof(pair_s) + 2048 > (size_t)optin) {
        launch_fail(c, "decode_layers: shared memory (%zu bytes of staging) does not fit", stage_bytes(a));
        return false;
    }
    const void *bufs[] = {a->x, a->qkv, a->att, a->gu, a->part, a->cos, a->sin};
    for (const void *q : bufs)
        if (!aligned16(q)) {
            launch_fail(c, "decode_layers: a buffer is not 16-byte aligned");
            return false;
        }
    return true;
}

extern "C" int launch_decode_layers(launch_ctx *c, const decode_layers_args *a)
{
    if (!decode_layers_supported(c, a))
        return -1;
    const size_t ring = (size_t)DL_NSLOT * DL_SLOT, smem = ring + stage_bytes(a);
    if (cudaFuncSetAttribute(k_decode_layers, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess)
        return launch_fail(c, "decode_layers: %zu bytes of shared memory: %s", smem,
                           cudaGetErrorString(cudaGetLastError()));
    int per_sm = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k_decode_layers, DL_THREADS, smem) != cudaSuccess ||
        per_sm < 1)
        return launch_fail(c, "decode_layers: no multiprocessor holds a block (%zu bytes of shared memory)", smem);
    const int splits = splits_of(c, a->n_kv_heads);
    if (cudaMemsetAsync(a->sync, 0, decode_layers_sync_words(a->n_layers, a->n_kv_heads) * sizeof(unsigned),
                        c->stream) != cudaSuccess)
        return launch_fail(c, "decode_layers: clearing the counters: %s", cudaGetErrorString(cudaGetLastError()));
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)c->n_sms);
    cfg.blockDim = dim3(DL_THREADS);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = c->stream;
    cudaLaunchAttribute attr = {};
    attr.id = cudaLaunchAttributeCooperative; /* every block resident at once: they wait for each other */
    attr.val.cooperative = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    const cudaError_t e = cudaLaunchKernelEx(&cfg, k_decode_layers, *a, splits);
    if (e != cudaSuccess)
        return launch_fail(c, "decode_layers: %s", cudaGetErrorString(e));
    return launch_check(c, "decode_layers");
}
