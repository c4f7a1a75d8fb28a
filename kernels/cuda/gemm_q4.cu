/*
 * gemm_q4.cu: the prefill product of a 4-bit matrix (NF4/FP4), y (+)= x . W^T,
 * with W decoded in registers on its way to the tensor cores.
 *
 * Decoding a 4-bit matrix into a bf16 scratch matrix for cuBLASLt writes
 * 2 bytes a weight and reads them again; for a 512-token prefill of an 8B
 * model that costs ~7 ms of 21, and it cannot hide behind the products,
 * which read their matrix at ~1.7 TB/s themselves (bench/dqsplit). Here the
 * weights cross memory once, packed: a CTA computes a tile of 128 weight
 * rows by 128 or 256 tokens (one or two sub-tiles), K 64 at a time (one
 * absmax block):
 *
 *   - a producer thread streams, per K step, the token tile of x (bf16 or
 *     fp16, [tokens][64], 128-byte swizzle) and the tile's packed weights
 *     ([128 rows][32 bytes]) into a ring of shared-memory stages with the
 *     tensor copy engine (TMA), completing on the stage's mbarrier;
 *   - two consumer warpgroups, 64 weight rows each, turn their rows' bytes
 *     into the A fragments of wgmma (register operand): byte -> the two
 *     codes as a bf16 pair (byte permutes over the code table held in
 *     registers; no shared-memory load), times
 *     the block's absmax (one HMUL2), and multiply them with the x tile
 *     (wgmma m64n128k16 or m64n256k16, B from shared memory), fp32
 *     accumulation;
 *   - the fragments of step s + 1 are built while step s's products run
 *     (two fragment buffers; wgmma.wait_group 1 frees the older one and its
 *     stage);
 *   - the output leaves through shared memory, 64 tokens at a time, stored
 *     (or added to the residual) by the tensor copy engine while the
 *     consumers go on.
 *
 * Whole tiles, one a CTA, run in waves, and the last wave of a product of
 * a few hundred tiles leaves many multiprocessors idle (8B gate/up at 512
 * tokens: 448 tiles, 3.4 waves of 132). Where that costs more than
 * splitting, the grid is one CTA a multiprocessor and each takes an equal
 * run of (tile, 256-column) units; a tile cut between CTAs is summed from
 * their partial sums by the CTA holding its first piece (q4_args).
 *
 * On the H100 this beats decoding into scratch + cuBLASLt on the large
 * shapes (8B gate/up 0.195 against 0.279 ms at 512 tokens) and runs at
 * 0.74-0.87 of cuBLASLt's bf16 speed on the 8B's shapes (bench/RESULTS.md).
 * Shared memory is the contended resource: wgmma reads each stage's x tile
 * once a consumer warpgroup, the copies fill it, so the decoding stays out
 * of it.
 *
 * The weights reach the tensor cores as bf16(bf16(code) * bf16(absmax)),
 * where the scratch path rounds code * absmax once: within a bf16 rounding
 * step of the same values (tests/test_kernels_cuda compares with the CPU).
 *
 * sm_90a only (wgmma, setmaxnreg are not in plain sm_90): built for that
 * target alone (CMakeLists.txt), and used where the device is compute
 * capability 9.0 (gemm_q4_supported); elsewhere the prefill decodes into
 * scratch as before.
 */
#include <cuda.h>
#include <cudaTypedefs.h>

#include <atomic>
#include <cmath>
#include <type_traits>

#include "common.cuh"

#define Q4_ROWS 128    /* weight rows a CTA (two consumer warpgroups of 64) */
#define Q4_K 64        /* K a stage: one absmax block of 64 */
#define Q4_UNIT 4      /* K steps a unit of work (256 columns): the consumers' loop is unrolled by 4 */
#define Q4_THREADS 384 /* producer warpgroup + two consumer warpgroups */
#define Q4_A_BYTES (Q4_ROWS * Q4_K / 2)
#define Q4_OUT_BYTES (64 * Q4_ROWS * 4) /* the output tile: 64 tokens at a time, as 4 boxes of 32 rows */

/*
 * A CTA computes NSUB 128-token sub-tiles with each decoded fragment (the
 * decoding is the costly part; a second sub-tile halves it per product, for
 * 128 accumulator registers a thread instead of 64). Its x tile and stage
 * count follow: 16 or 32 KB of x a stage, 6 or 4 stages. A split tile's
 * partial sums take PART_FLOAT4 float4 a piece (its 256 consumer threads'
 * accumulators).
 */
template <int NSUB> struct q4_shape {
    static constexpr int TOK = 128 * NSUB;
    static constexpr int B_BYTES = TOK * Q4_K * 2;
    static constexpr int STAGE_BYTES = B_BYTES + Q4_A_BYTES; /* a multiple of 1024: x tiles stay 1024-aligned */
    static constexpr int STAGES = NSUB == 1 ? 6 : 4;
    static constexpr int SMEM = 1024 + STAGES * STAGE_BYTES + Q4_OUT_BYTES + 2 * STAGES * 8;
    static constexpr size_t PART_FLOAT4 = (size_t)NSUB * 16 * 256;
};

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define Q4_DEVICE 1
#endif

/*
 * The work is units of (tile, 4 K steps), tile t = row tile * ntok + token
 * tile (a row tile's token tiles one after the other, so its weights are
 * read from L2 the second time), unit u of tile t = t * per_tile + K unit.
 * CTA g takes the units [start(g), start(g + 1)), start(g) = g * units /
 * ctas: every multiprocessor gets the same share, whatever the tile count
 * (whole waves of tiles left up to a wave's worth of multiprocessors idle).
 * A tile cut by these boundaries is split among consecutive CTAs. Its
 * first piece in K is the last of its CTA's range, the others are the
 * first of theirs (or all of a range inside the tile): those leave their
 * sums in `part`, a slot a CTA, and count themselves in a counter of the
 * tile (indexed by the first CTA that starts inside it); the first piece's
 * CTA waits for the count, adds them to its own in K order and resets the
 * counter. Writes never wait, so the waits end once every CTA runs, which
 * the cooperative launch guarantees. Whichever CTA finishes first, the
 * sums are the same bits (tried first: every piece written and the last
 * to arrive adding them all, which cost ~10 us a product more).
 */
struct q4_args {
    bool accumulate;
    const float *absmax; /* [rows * cols / group], or NULL with a nested absmax: */
    const uint8_t *am_q; /* gemv_args' nested absmax: codes [rows * cols / group], */
    const float *am_s2;  /* a scale and offset each 2^am_shift of them,          */
    const float *am_code; /* the codes' table [256]                              */
    int am_shift;
    int group;
    int cols;
    int ntok, per_tile;  /* token tiles; units a tile (cols / 256) */
    long long units;     /* row tiles * ntok * per_tile */
    int ctas;            /* the grid */
    float4 *part;        /* [ctas][PART_FLOAT4]: CTA g's first piece, where it is not its tile's first */
    unsigned *count;     /* [ctas], zero on entry and on exit */
};

__device__ inline long long q4_start(const q4_args &a, long long g) { return g * a.units / a.ctas; }
/* The CTA whose units hold u: the largest g with start(g) <= u. */
__device__ inline int q4_owner(const q4_args &a, long long u) { return (int)(((u + 1) * a.ctas + a.units - 1) / a.units) - 1; }

#ifdef Q4_DEVICE
__device__ __forceinline__ void q4_tma_2d(void *dst, const CUtensorMap *map, int c0, int c1, uint64_t *bar)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
                     smem_addr(dst)),
                 "l"(map), "r"(c0), "r"(c1), "r"(smem_addr(bar))
                 : "memory");
}

/* The x tile of a stage as wgmma's B operand: K-major, 128-byte swizzle, 8-row groups 1024 bytes apart. */
__device__ __forceinline__ uint64_t q4_desc(const void *tile)
{
    const uint64_t a = smem_addr(tile);
    return ((a & 0x3ffff) >> 4) | (1ull << 16) | ((uint64_t)(1024 >> 4) << 32) | (1ull << 62);
}

#define Q4_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])

/* d (64 accumulators), a (4 fragment registers), B's descriptor; then scale-d, scale-a, scale-b 1, B not transposed. */
#define Q4_WGMMA_OPERANDS                                                                        \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                    \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "            \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "            \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "           \
    "{%64, %65, %66, %67}, %68, 1, 1, 1, 0;"

/* D[64 rows][128 tokens] += A (registers) . B (shared memory). */
template <bool BF16> __device__ __forceinline__ void q4_wgmma(float (&d)[64], const uint32_t (&a)[4], uint64_t desc)
{
    if constexpr (BF16)
        asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " Q4_WGMMA_OPERANDS
                     : Q4_D8(0), Q4_D8(8), Q4_D8(16), Q4_D8(24), Q4_D8(32), Q4_D8(40), Q4_D8(48), Q4_D8(56)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
    else
        asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " Q4_WGMMA_OPERANDS
                     : Q4_D8(0), Q4_D8(8), Q4_D8(16), Q4_D8(24), Q4_D8(32), Q4_D8(40), Q4_D8(48), Q4_D8(56)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
}

/* The same over 256 tokens in one instruction, d[0] tokens 0..127, d[1] 128..255 (the register order of
 * two n128 products), B's 256 token rows contiguous: the A fragment reaches the tensor cores once for both
 * halves (1% faster than two n128 products on the 8B shapes). */
#define Q4_WGMMA256_OPERANDS \
    "{" \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127" \
    "}, {%128, %129, %130, %131}, %132, 1, 1, 1, 0;"
#define Q4_D64(v) Q4_D8v(v, 0), Q4_D8v(v, 8), Q4_D8v(v, 16), Q4_D8v(v, 24), Q4_D8v(v, 32), Q4_D8v(v, 40), Q4_D8v(v, 48), Q4_D8v(v, 56)
#define Q4_D8v(v, i) "+f"(d[v][i]), "+f"(d[v][i + 1]), "+f"(d[v][i + 2]), "+f"(d[v][i + 3]), "+f"(d[v][i + 4]), \
    "+f"(d[v][i + 5]), "+f"(d[v][i + 6]), "+f"(d[v][i + 7])
template <bool BF16> __device__ __forceinline__ void q4_wgmma256(float (&d)[2][64], const uint32_t (&a)[4], uint64_t desc)
{
    if constexpr (BF16)
        asm volatile("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " Q4_WGMMA256_OPERANDS
                     : Q4_D64(0), Q4_D64(1)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
    else
        asm volatile("wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 " Q4_WGMMA256_OPERANDS
                     : Q4_D64(0), Q4_D64(1)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
}

/* Keeps the compiler from moving accumulator accesses across the asynchronous products. */
__device__ __forceinline__ void q4_fence(float (&d)[64])
{
#pragma unroll
    for (int i = 0; i < 64; i++)
        asm volatile("" : "+f"(d[i])::"memory");
}
#endif

/*
 * The 16 codes as T, split into bytes: lo[i] holds the low bytes of codes
 * 4i .. 4i + 3 (code n in byte n % 4), hi[i] their high bytes. A lookup is
 * byte permutes in registers: 4 codes at once, no shared memory (a shared
 * table, one load a byte, made the 8B shapes' products ~10% slower: the
 * loads competed with wgmma's reads of x for shared-memory bandwidth).
 */
struct q4_lut {
    uint32_t lo[4], hi[4];
};

/* The pairs of two bytes: t's bits 0..15 are byte A then byte B; pa = (code[A >> 4], code[A & 15]) as the
 * low and high half (element 2j first), pb the same of B. */
__device__ __forceinline__ void q4_lut4(const q4_lut &L, uint32_t t, uint32_t &pa, uint32_t &pb)
{
    /* Each nibble's low 3 bits pick among 8 codes' bytes (prmt reads bit 3 as a sign mode: masked); its
     * bit 3 picks the upper half's result (selector byte k + 4). */
    const uint32_t sel = t & 0x7777u, upper = ((t >> 1) & 0x4444u) | 0x3210u;
    const uint32_t rl = __byte_perm(__byte_perm(L.lo[0], L.lo[1], sel), __byte_perm(L.lo[2], L.lo[3], sel), upper);
    const uint32_t rh = __byte_perm(__byte_perm(L.hi[0], L.hi[1], sel), __byte_perm(L.hi[2], L.hi[3], sel), upper);
    pa = __byte_perm(rl, rh, 0x4051u); /* rl, rh byte k: code of nibble k (A low, A high, B low, B high) */
    pb = __byte_perm(rl, rh, 0x6273u);
}

/*
 * One consumer step: stage `st`'s bytes for rows g and g + 8 of this warp
 * -> fragments `a` (4 k16 steps x 4 registers), scaled by the rows'
 * absmax pairs s0, s1. Fragment register j of step k: (row g | g + 8) x
 * (k 2c, 2c + 1 | 2c + 8, 2c + 9) of the step, i.e. byte c of word 2k
 * (registers 0, 1) or 2k + 1 (registers 2, 3) of the row's 32 bytes.
 */
template <typename P>
__device__ __forceinline__ void q4_fragments(uint32_t (&a)[16], const uint8_t *abytes, int row, unsigned c,
                                             const q4_lut &L, P s0, P s1)
{
#ifdef Q4_DEVICE
    const uint4 *r0 = reinterpret_cast<const uint4 *>(abytes + row * (Q4_K / 2));
    const uint4 *r1 = reinterpret_cast<const uint4 *>(abytes + (row + 8) * (Q4_K / 2));
    const uint4 u0 = r0[0], u1 = r0[1], v0 = r1[0], v1 = r1[1];
    const uint32_t w0[8] = {u0.x, u0.y, u0.z, u0.w, u1.x, u1.y, u1.z, u1.w};
    const uint32_t w1[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
    const unsigned gather = c | ((c + 4) << 4); /* byte c of two words */
#pragma unroll
    for (int k = 0; k < 4; k++) {
        uint32_t p[4]; /* row g word 2k, row g + 8 word 2k, row g word 2k + 1, row g + 8 word 2k + 1 */
        q4_lut4(L, __byte_perm(w0[2 * k], w0[2 * k + 1], gather), p[0], p[2]);
        q4_lut4(L, __byte_perm(w1[2 * k], w1[2 * k + 1], gather), p[1], p[3]);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const P q = __hmul2(*reinterpret_cast<const P *>(&p[i]), i % 2 ? s1 : s0);
            a[4 * k + i] = *reinterpret_cast<const uint32_t *>(&q);
        }
    }
#endif
}

template <typename T, int NSUB, bool NESTED>
__global__ void __launch_bounds__(Q4_THREADS, 1)
    k_gemm_q4(const __grid_constant__ CUtensorMap xmap, const __grid_constant__ CUtensorMap wmap,
              const __grid_constant__ CUtensorMap ymap, q4_args a, const float *code)
{
#ifdef Q4_DEVICE
    constexpr bool BF16 = std::is_same<T, __nv_bfloat16>::value;
    typedef typename std::conditional<BF16, __nv_bfloat162, __half2>::type P;
    typedef q4_shape<NSUB> S;
    extern __shared__ uint8_t q4_smem[];
    uint8_t *base = reinterpret_cast<uint8_t *>(((uintptr_t)q4_smem + 1023) & ~(uintptr_t)1023);
    uint8_t *stages = base;
    float *otile = reinterpret_cast<float *>(base + S::STAGES * S::STAGE_BYTES); /* [4 row boxes][64 tokens][32 rows], swizzled */
    uint64_t *full = reinterpret_cast<uint64_t *>(otile + 64 * Q4_ROWS), *empty = full + S::STAGES;
    const int tid = threadIdx.x, wg = tid / 128, lane = tid & 31;
    const int nk = a.cols / Q4_K, me = blockIdx.x;
    const long long u_begin = q4_start(a, me), u_end = q4_start(a, me + 1);

    __shared__ float code2[256]; /* a nested absmax's code table */
    if (NESTED)
        for (int i = tid; i < 256; i += Q4_THREADS)
            code2[i] = a.am_code[i];
    if (tid == 0) {
        for (int s = 0; s < S::STAGES; s++) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&full[s])));
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 8;" ::"r"(smem_addr(&empty[s]))); /* a consumer warp each */
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) { /* the producer: one thread streams every stage of every piece */
        /* The CTA's 384 x 168 registers, redistributed: 128 x 40 here, 256 x 232 for the consumers. (The
         * nested two-sub-tile product spills 44 bytes at 232; 24 and 240, which removes that, made its 8B
         * prefill 1.4% slower.) */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
        if (tid == 0) {
            asm volatile("prefetch.tensormap [%0];" ::"l"(&xmap) : "memory");
            asm volatile("prefetch.tensormap [%0];" ::"l"(&wmap) : "memory");
            int gs = 0; /* stages filled so far: the ring's position and phase */
            for (long long u = u_begin; u < u_end;) {
                const int t = (int)(u / a.per_tile);
                const long long ue = min(u_end, (long long)(t + 1) * a.per_tile);
                const int row0 = (t / a.ntok) * Q4_ROWS, tok0 = (t % a.ntok) * S::TOK;
                const int s1 = (int)(ue - (long long)t * a.per_tile) * Q4_UNIT;
                for (int s = (int)(u - (long long)t * a.per_tile) * Q4_UNIT; s < s1; s++, gs++) {
                    const int st = gs % S::STAGES;
                    if (gs >= S::STAGES)
                        mbar_wait(&empty[st], (unsigned)(gs / S::STAGES - 1) & 1u);
                    uint8_t *dst = stages + st * S::STAGE_BYTES;
                    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(&full[st])),
                                 "r"(S::STAGE_BYTES)
                                 : "memory");
                    q4_tma_2d(dst, &xmap, s * Q4_K, tok0, &full[st]);
                    q4_tma_2d(dst + S::B_BYTES, &wmap, s * (Q4_K / 2), row0, &full[st]);
                }
                u = ue;
            }
        }
        return; /* (the consumers' barriers below are named ones of their 256 threads) */
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");

    /* Consumers: warpgroup wg - 1 owns rows 64 (wg - 1) ..; warp w of it rows 16 w + g, + 8. */
    const int w = (tid / 32) % 4, g = lane / 4;
    const unsigned c = lane & 3;
    const int lrow = 64 * (wg - 1) + 16 * w + g; /* within the tile */
    const int ct = tid - 128;                    /* 0 .. 255 over both consumer warpgroups */
    q4_lut lut = {};
#pragma unroll
    for (int n = 0; n < 16; n++) {
        const T v = T(__ldg(code + n)); /* rounded to nearest */
        const uint32_t u = *reinterpret_cast<const uint16_t *>(&v);
        lut.lo[n / 4] |= (u & 0xffu) << (8 * (n % 4));
        lut.hi[n / 4] |= (u >> 8) << (8 * (n % 4));
    }
    const int gshift = __ffs(a.group / Q4_K) - 1; /* a block of 64 << gshift: steps share an absmax */
    const size_t am_row = (size_t)(a.cols / a.group);
    float d[NSUB][64];
    uint32_t fa[2][16];
    int gs = 0;
    for (long long u = u_begin; u < u_end;) {
        const int t = (int)(u / a.per_tile);
        const long long t0 = (long long)t * a.per_tile, ue = min(u_end, t0 + a.per_tile);
        const int row0 = (t / a.ntok) * Q4_ROWS, tok0 = (t % a.ntok) * S::TOK;
        const int s0 = (int)(u - t0) * Q4_UNIT, s1 = (int)(ue - t0) * Q4_UNIT;
        u = ue;
#pragma unroll
        for (int v = 0; v < NSUB; v++)
#pragma unroll
            for (int i = 0; i < 64; i++)
                d[v][i] = 0.0f;
        /* The rows' absmax for step s + 4 is loaded at step s, so its latency
         * never shows (one step ahead measured the same: the cost was
         * elsewhere). am[i]: steps congruent to i mod 4. */
        /* A nested absmax: its 8-bit code comes 4 steps ahead in the same
         * register (as bits) and is decoded at the step, its scale and
         * offset from L1 (each is shared by 2^am_shift blocks). The 8B
         * nf4-dq prefill runs ~3% slower than with fp32 absmax (bench/
         * RESULTS.md: decoding a step ahead, or reloading the scale only
         * where it changes, measured slower still). */
        const size_t b_r0 = (size_t)(row0 + lrow) * am_row, b_r1 = b_r0 + 8 * am_row;
        auto am_load = [&](size_t b) {
            return NESTED ? __uint_as_float(__ldg(a.am_q + b)) : __ldg(a.absmax + b);
        };
        auto am_value = [&](float raw, size_t b) {
            if (!NESTED)
                return raw;
            const float2 sc = __ldg(reinterpret_cast<const float2 *>(a.am_s2) + (b >> a.am_shift));
            return nested_absmax_of(code2[__float_as_uint(raw)], sc);
        };
        float am[4][2];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            am[i][0] = am_load(b_r0 + ((s0 + i) >> gshift));
            am[i][1] = am_load(b_r1 + ((s0 + i) >> gshift));
        }
        auto step = [&](int s, uint32_t(&f)[16], float(&amv)[2]) {
            const int st = gs % S::STAGES;
            const float v0 = am_value(amv[0], b_r0 + (s >> gshift)), v1 = am_value(amv[1], b_r1 + (s >> gshift));
            P p0, p1;
            if constexpr (BF16) {
                p0 = __float2bfloat162_rn(v0);
                p1 = __float2bfloat162_rn(v1);
            } else {
                p0 = __float2half2_rn(v0);
                p1 = __float2half2_rn(v1);
            }
            if (s + 4 < s1) { /* (64-bit division here took more time than the decoding) */
                amv[0] = am_load(b_r0 + ((s + 4) >> gshift));
                amv[1] = am_load(b_r1 + ((s + 4) >> gshift));
            }
            mbar_wait(&full[st], (unsigned)(gs / S::STAGES) & 1u);
            const uint8_t *stage = stages + st * S::STAGE_BYTES;
            q4_fragments<P>(f, stage + S::B_BYTES, lrow, c, lut, p0, p1);
            const uint64_t desc = q4_desc(stage);
#pragma unroll
            for (int v = 0; v < NSUB; v++)
                q4_fence(d[v]);
            asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const uint32_t fk[4] = {f[4 * k], f[4 * k + 1], f[4 * k + 2], f[4 * k + 3]};
                if constexpr (NSUB == 2) /* + 32 bytes a k16 step, within the swizzled row */
                    q4_wgmma256<BF16>(d, fk, desc + 2 * k);
                else
                    q4_wgmma<BF16>(d[0], fk, desc + 2 * k);
            }
            asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
            asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory"); /* the previous step is done: its fragments, its stage */
#pragma unroll
            for (int v = 0; v < NSUB; v++)
                q4_fence(d[v]);
            if (s > s0 && lane == 0)
                asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(&empty[(gs - 1) % S::STAGES]))
                             : "memory");
            gs++;
        };
        for (int s = s0; s < s1; s += 4) { /* pieces are whole units of 4 steps */
            step(s, fa[0], am[0]);
            step(s + 1, fa[1], am[1]);
            step(s + 2, fa[0], am[2]);
            step(s + 3, fa[1], am[3]);
        }
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
        for (int v = 0; v < NSUB; v++)
            q4_fence(d[v]);
        if (lane == 0) /* the piece's last stage */
            asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(&empty[(gs - 1) % S::STAGES]))
                         : "memory");

        if (s0 > 0 || s1 < nk) { /* a split tile */
            const int glo = q4_owner(a, t0), ghi = q4_owner(a, t0 + a.per_tile - 1);
            unsigned *count = a.count + glo + 1;
            if (me != glo) { /* a later piece (this CTA's first): its sums for the first piece's CTA */
                float4 *mine = a.part + (size_t)me * S::PART_FLOAT4 + ct;
#pragma unroll
                for (int v = 0; v < NSUB; v++)
#pragma unroll
                    for (int i = 0; i < 16; i++)
                        __stcg(mine + (v * 16 + i) * 256,
                               make_float4(d[v][4 * i], d[v][4 * i + 1], d[v][4 * i + 2], d[v][4 * i + 3]));
                __threadfence();
                asm volatile("bar.sync 1, 256;" ::: "memory");
                if (ct == 0)
                    atomicAdd(count, 1u);
                continue;
            }
            /* The tile's first piece, this CTA's last: wait for the others (they are running: the launch is
             * cooperative) and add theirs to its own, in K order. */
            if (ct == 0) {
                unsigned arrived;
                for (;;) {
                    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(arrived) : "l"(count) : "memory");
                    if (arrived == (unsigned)(ghi - glo))
                        break;
                    __nanosleep(64);
                }
                *count = 0; /* ready for the next product */
            }
            asm volatile("bar.sync 1, 256;" ::: "memory");
            for (int gg = glo + 1; gg <= ghi; gg++) {
                const float4 *src = a.part + (size_t)gg * S::PART_FLOAT4 + ct;
#pragma unroll
                for (int v = 0; v < NSUB; v++)
#pragma unroll
                    for (int i = 0; i < 16; i++) {
                        const float4 p = __ldcg(src + (v * 16 + i) * 256);
                        d[v][4 * i] += p.x, d[v][4 * i + 1] += p.y, d[v][4 * i + 2] += p.z, d[v][4 * i + 3] += p.w;
                    }
            }
        }

        /*
         * Out through shared memory, 64 tokens at a time: d[v][4j + (0, 1)]
         * is row g, tokens 128 v + 8j + 2c (+1), d[v][4j + (2, 3)] row g + 8.
         * They go into four [64 tokens][32 rows] boxes, 128-byte swizzled
         * (16-byte chunk ^ token % 8: a warp's 32 stores on 32 banks), which
         * the tensor copy engine stores, or adds to y where it accumulates
         * (one add an element, so the result does not depend on timing), while
         * the consumers go on; the tile is reused once the engine has read it.
         * (The threads' own stores, with the residual's loads in the way, cost
         * 8B nf4 prefill ~1% at 512 tokens, 7% at 128.)
         */
#pragma unroll
        for (int v = 0; v < NSUB; v++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                asm volatile("bar.sync 1, 256;" ::: "memory"); /* the engine has read the tile */
#pragma unroll
                for (int j = 0; j < 8; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int tl = 8 * j + 2 * (int)c + (e & 1), row = lrow + (e < 2 ? 0 : 8);
                        otile[(row >> 5) * 2048 + tl * 32 + ((((row & 31) >> 2) ^ (tl & 7)) << 2) + (row & 3)] =
                            d[v][4 * (8 * h + j) + e];
                    }
                asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); /* for the engine's reads */
                asm volatile("bar.sync 1, 256;" ::: "memory");
                if (ct == 0) {
                    const int tk = tok0 + 128 * v + 64 * h;
#pragma unroll
                    for (int rb = 0; rb < 4; rb++) {
                        const unsigned src = smem_addr(otile + rb * 2048);
                        if (a.accumulate)
                            asm volatile("cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.bulk_group [%0, {%1, %2}], [%3];" ::"l"(
                                             &ymap),
                                         "r"(row0 + 32 * rb), "r"(tk), "r"(src)
                                         : "memory");
                        else
                            asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];" ::"l"(
                                             &ymap),
                                         "r"(row0 + 32 * rb), "r"(tk), "r"(src)
                                         : "memory");
                    }
                    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
                    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
                }
            }
    }
    if (ct == 0) /* the stores complete before the CTA ends */
        asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
#endif
}

/* cuTensorMapEncodeTiled through the runtime (libengine never links libcuda), looked up once: the same
 * function for the whole process, so an atomic cache rather than state in each context. */
static PFN_cuTensorMapEncodeTiled_v12000 q4_encode(void)
{
    static std::atomic<void *> fn{nullptr};
    void *p = fn.load(std::memory_order_relaxed);
    if (!p) {
        enum cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess) {
            (void)cudaGetLastError();
            return NULL;
        }
        fn.store(p, std::memory_order_relaxed);
    }
    return (PFN_cuTensorMapEncodeTiled_v12000)p;
}

/* Whether the fused product runs here: compute capability 9.0 (its code is sm_90a). */
extern "C" bool gemm_q4_supported(void)
{
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return major == 9 && minor == 0 && q4_encode() != NULL;
}

static bool q4_fits(const gemv_args *w, k_dtype xt, const void *x)
{
    const int g = w->group / Q4_K;
    return (w->wt == K_NF4 || w->wt == K_FP4) && (xt == K_BF16 || xt == K_F16) && (w->scales || gemv_nested_ok(w)) &&
           w->code && w->rows % Q4_ROWS == 0 && w->cols % (4 * Q4_K) == 0 && w->group % Q4_K == 0 && g > 0 && (g & (g - 1)) == 0 &&
           w->cols % w->group == 0 && (uintptr_t)w->w % 16 == 0 && (!x || (uintptr_t)x % 16 == 0);
}

/*
 * The grid for a product: one CTA a multiprocessor splitting tiles, where
 * `work` holds two partial slots and a counter a CTA and the model below
 * expects it to be faster (or work->always_split), else one CTA a whole
 * tile.
 *
 * The model, in units of a one-sub-tile CTA's K step (128 rows x 128
 * tokens x 64, ~0.5 us on the H100; a two-sub-tile step costs 1.6, as it
 * decodes once for both): whole tiles run in waves of n_sms; split tiles
 * share the steps out evenly but pay Q4_SPLIT_COST more (~7 us: the
 * partial sums' round trip, the wait, more epilogues a CTA). Fitted to the
 * H100 (bench/q4gemm, bench/RESULTS.md): at 512 tokens splitting pays for
 * the 8B q/k/v, gate/up and down matrices (the 8B o runs whole), at 64-128
 * for every 8B matrix and the 1B's down.
 */
#define Q4_SPLIT_COST 14.0
static double q4_step(int nsub) { return nsub == 2 ? 1.6 : 1.0; }
static int q4_ctas(const launch_ctx *c, long long tiles, long long units, int nk, int nsub, const gemm_q4_work *work,
                   double *cost)
{
    const long long g = std::min<long long>(c->n_sms, units);
    const size_t slot = (nsub == 2 ? q4_shape<2>::PART_FLOAT4 : q4_shape<1>::PART_FLOAT4) * sizeof(float4);
    const double whole = std::ceil((double)tiles / std::max(c->n_sms, 1)) * nk * q4_step(nsub);
    const bool can = g > 0 && g != tiles && work && work->part && (uintptr_t)work->part % 16 == 0 && work->count &&
                     work->n_count >= g && work->part_bytes / slot >= (size_t)g;
    const double split = can ? std::ceil((double)units / g) * Q4_UNIT * q4_step(nsub) + Q4_SPLIT_COST : whole;
    const bool use = can && (work->always_split || split < whole);
    if (cost)
        *cost = use ? split : whole;
    return use ? (int)g : (int)tiles;
}

extern "C" size_t gemm_q4_work_bytes(const launch_ctx *c, int nsub)
{
    return (size_t)std::max(c->n_sms, 0) * (nsub == 2 ? q4_shape<2>::PART_FLOAT4 : q4_shape<1>::PART_FLOAT4) *
           sizeof(float4);
}

/*
 * Sub-tiles for a product of n tokens, or 0 where decoding into scratch and
 * cuBLASLt should be faster: in q4_ctas's units, the scratch path costs
 * 1.83 a 128-row tile's step for the decoding, whatever n, plus 0.66 a 128
 * x 128 tile's for cuBLASLt, whose finer tiles fill a wave as a fraction.
 */
static double q4_cost(const launch_ctx *c, const gemv_args *w, int n, int nsub, const gemm_q4_work *work)
{
    const long long tiles = (long long)(w->rows / Q4_ROWS) * ceil_div(n, 128 * nsub);
    const int nk = w->cols / Q4_K;
    double cost = 0;
    (void)q4_ctas(c, tiles, tiles * (nk / Q4_UNIT), nk, nsub, work, &cost);
    return cost;
}

extern "C" int gemm_q4_tiles(const launch_ctx *c, const gemv_args *w, k_dtype xt, int n, const gemm_q4_work *work)
{
    if (!q4_fits(w, xt, NULL) || n <= 0 || c->n_sms <= 0)
        return 0;
    const double rt = w->rows / Q4_ROWS, sms = c->n_sms, nk = w->cols / Q4_K;
    const double scratch = (rt * 1.83 + 0.66 * rt * ceil_div(n, 128)) * nk / sms;
    const double one = q4_cost(c, w, n, 1, work), two = q4_cost(c, w, n, 2, work);
    if (two < one && two < scratch)
        return 2;
    return one < scratch ? 1 : 0;
}

template <typename T, int NSUB, bool NESTED>
static int q4_launch(launch_ctx *c, const CUtensorMap &xmap, const CUtensorMap &wmap, const CUtensorMap &ymap,
                     q4_args qa, const float *code,
                     const gemm_q4_work *work, int n, int rows)
{
    typedef q4_shape<NSUB> S;
    auto kern = k_gemm_q4<T, NSUB, NESTED>;
    if (cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, S::SMEM) != cudaSuccess)
        return launch_fail(c, "gemm_q4: %d bytes of shared memory: %s", S::SMEM, cudaGetErrorString(cudaGetLastError()));
    qa.ntok = (int)ceil_div(n, S::TOK);
    qa.per_tile = qa.cols / (Q4_K * Q4_UNIT);
    const long long tiles = (long long)(rows / Q4_ROWS) * qa.ntok;
    qa.units = tiles * qa.per_tile;
    qa.ctas = q4_ctas(c, tiles, qa.units, qa.cols / Q4_K, NSUB, work, NULL);
    if (qa.ctas != tiles) { /* split tiles: only then are the partial slots and counters touched */
        qa.part = static_cast<float4 *>(work->part);
        qa.count = work->count;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)qa.ctas);
    cfg.blockDim = dim3(Q4_THREADS);
    cfg.dynamicSmemBytes = S::SMEM;
    cfg.stream = c->stream;
    cudaLaunchAttribute coop;
    coop.id = cudaLaunchAttributeCooperative; /* split tiles wait for other CTAs: all must be resident */
    coop.val.cooperative = 1;
    cfg.attrs = &coop;
    cfg.numAttrs = qa.part ? 1 : 0;
    if (cudaLaunchKernelEx(&cfg, kern, xmap, wmap, ymap, qa, code) != cudaSuccess)
        return launch_fail(c, "gemm_q4: launch of %d CTAs: %s", qa.ctas, cudaGetErrorString(cudaGetLastError()));
    return launch_check(c, "gemm_q4");
}

/* The sub-tiles and the absmax's kind as template arguments. */
template <typename T>
static int q4_launch_sub(launch_ctx *c, const CUtensorMap &xmap, const CUtensorMap &wmap, const CUtensorMap &ymap,
                         const q4_args &qa, const float *code, const gemm_q4_work *work, int n, int rows, int nsub)
{
    if (qa.am_q)
        return nsub == 2 ? q4_launch<T, 2, true>(c, xmap, wmap, ymap, qa, code, work, n, rows)
                         : q4_launch<T, 1, true>(c, xmap, wmap, ymap, qa, code, work, n, rows);
    return nsub == 2 ? q4_launch<T, 2, false>(c, xmap, wmap, ymap, qa, code, work, n, rows)
                     : q4_launch<T, 1, false>(c, xmap, wmap, ymap, qa, code, work, n, rows);
}

extern "C" int launch_gemm_q4(launch_ctx *c, float *y, bool accumulate, const void *x, k_dtype xt, const gemv_args *w,
                              int n, int nsub, const gemm_q4_work *work)
{
    const int rows = w->rows, cols = w->cols;
    if (!y || (uintptr_t)y % 16 || !x || !w->w || n <= 0 || (nsub != 1 && nsub != 2) || !q4_fits(w, xt, x))
        return launch_fail(c, "gemm_q4: unsupported (type %d, x type %d, %d x %d, group %d, %d sub-tiles)", (int)w->wt,
                           (int)xt, rows, cols, w->group, nsub);
    PFN_cuTensorMapEncodeTiled_v12000 encode = q4_encode();
    if (!encode)
        return launch_fail(c, "gemm_q4: the driver has no cuTensorMapEncodeTiled");
    /* x [n, cols] in boxes of 64 columns x the CTA's tokens, 128-byte swizzle (wgmma's B layout); the
     * packed weights [rows, cols / 2 bytes] in boxes of 32 bytes x 128 rows. Rows past n read as zeros. */
    CUtensorMap xmap, wmap;
    const cuuint64_t xdim[2] = {(cuuint64_t)cols, (cuuint64_t)n}, xstride[1] = {(cuuint64_t)cols * 2};
    const cuuint32_t xbox[2] = {Q4_K, (cuuint32_t)(128 * nsub)}, one[2] = {1, 1};
    CUresult r = encode(&xmap, xt == K_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2,
                        const_cast<void *>(x), xdim, xstride, xbox, one, CU_TENSOR_MAP_INTERLEAVE_NONE,
                        CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return launch_fail(c, "gemm_q4: x tensor map (error %d)", (int)r);
    const cuuint64_t wdim[2] = {(cuuint64_t)cols / 2, (cuuint64_t)rows}, wstride[1] = {(cuuint64_t)cols / 2};
    const cuuint32_t wbox[2] = {Q4_K / 2, Q4_ROWS};
    r = encode(&wmap, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void *>(w->w), wdim, wstride, wbox, one,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return launch_fail(c, "gemm_q4: weight tensor map (error %d)", (int)r);
    /* y [n, rows] fp32 in boxes of 32 rows (128 bytes, the swizzle's span) x 64 tokens; rows past n are
     * not written. */
    CUtensorMap ymap;
    const cuuint64_t ydim[2] = {(cuuint64_t)rows, (cuuint64_t)n}, ystride[1] = {(cuuint64_t)rows * 4};
    const cuuint32_t ybox[2] = {32, 64};
    r = encode(&ymap, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, y, ydim, ystride, ybox, one, CU_TENSOR_MAP_INTERLEAVE_NONE,
               CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return launch_fail(c, "gemm_q4: output tensor map (error %d)", (int)r);
    q4_args qa = {};
    qa.accumulate = accumulate, qa.absmax = w->scales, qa.group = w->group;
    qa.am_q = w->scales ? NULL : w->am_q, qa.am_s2 = w->am_s2, qa.am_code = w->am_code, qa.am_shift = w->am_shift;
    qa.cols = cols;
    if (xt == K_BF16)
        return q4_launch_sub<__nv_bfloat16>(c, xmap, wmap, ymap, qa, w->code, work, n, rows, nsub);
    return q4_launch_sub<__half>(c, xmap, wmap, ymap, qa, w->code, work, n, rows, nsub);
}
