/*
 * dqsplit.cu: can a few multiprocessors decode quantized weights fast enough
 * to hide the decoding behind cuBLASLt's products on the rest?
 *
 * A quantized prefill decodes each matrix to bf16 and multiplies it with
 * cuBLASLt; the decoding (read 0.5 byte, write 2 bytes a weight) costs the
 * 8B nf4 shape ~6.9 ms of a 21 ms pass, at the memory bandwidth. If S
 * multiprocessors could decode the next matrix while the product runs on
 * the other 132 - S, the decoding would leave the critical path. It pays
 * only if S SMs move enough bytes: this program measures, on the gate/up
 * shape of the 8B model (28,672 x 4,096, 512 tokens):
 *   - the product alone, on every SM and limited to 132 - S (cuBLASLt's SM
 *     count target);
 *   - the decoding alone on S SMs (one block an SM, its shared memory
 *     keeps a second block off): the engine's kernel shape (plain loads
 *     and stores) and a bulk-copy one (tiles in and out of shared memory
 *     by the copy engine);
 *   - both at once on two streams.
 * What it found (bench/RESULTS.md, 2026-11-25, H100): S SMs decode at
 * ~60 GB/s each at best, and at 512 tokens the bf16 product itself reads
 * its matrix at ~1.4 TB/s, so decoding and product together need about as
 * many bytes of HBM as they take serially: overlapped, they took as long
 * as one after the other at every S. Only a product that reads the 4-bit
 * weights itself (0.5 byte a weight, decoded in registers) removes the
 * decoding's bytes.
 *   dqsplit [--sms S,S,...]   (default 16,20,24,32)
 */
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cuda_bf16.h>

#include "../kernels/cuda/common.cuh" /* smem_addr, mbar_wait */
#include "bench_cuda.cuh"

#define ROWS 28672
#define COLS 4096
#define TOKENS 512
#define GROUP 64

__constant__ float code_c[16];

/* ---- the engine's shape: 8 weights a thread, plain loads and stores ---- */
template <int U> __global__ void __launch_bounds__(1024) k_plain(__nv_bfloat16 *out, const uint32_t *w, const float *absmax, size_t total8)
{
    __shared__ float code_s[16]; /* (dynamic shared memory only keeps a second block off the SM) */
    if (threadIdx.x < 16)
        code_s[threadIdx.x] = code_c[threadIdx.x];
    __syncthreads();
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t t0 = (size_t)blockIdx.x * blockDim.x + threadIdx.x; t0 < total8; t0 += U * stride) {
        uint32_t v[U];
        float s[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const size_t t = t0 + u * stride;
            if (t < total8) {
                v[u] = __ldg(w + t);
                s[u] = __ldg(absmax + (8 * t) / GROUP);
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const size_t t = t0 + u * stride;
            if (t >= total8)
                break;
            __nv_bfloat162 h[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const uint32_t b = (v[u] >> (8 * i)) & 0xffu;
                h[i] = __floats2bfloat162_rn(code_s[b >> 4] * s[u], code_s[b & 15u] * s[u]);
            }
            *reinterpret_cast<uint4 *>(out + 8 * t) = *reinterpret_cast<uint4 *>(h);
        }
    }
}

/* ---- bulk copies: tiles of TILE weights in and out of shared memory ---- */
#define TILE 16384                /* weights a tile: 8 KB in, 32 KB out */
#define TILE_IN (TILE / 2 + TILE / GROUP * 4)
#define NI 6                      /* input stages */
#define NO 4                      /* output stages */
#define BULK_THREADS 512

__device__ __forceinline__ void load_tile(void *dst, const void *w, const void *am, uint64_t *bar)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(TILE_IN) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem_addr(dst)),
                 "l"(w), "r"(TILE / 2), "r"(smem_addr(bar))
                 : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_addr((char *)dst + TILE / 2)),
                 "l"(am), "r"(TILE / GROUP * 4), "r"(smem_addr(bar))
                 : "memory");
}

__global__ void __launch_bounds__(BULK_THREADS) k_bulk(__nv_bfloat16 *out, const uint8_t *w, const float *absmax, int tiles)
{
    extern __shared__ __align__(128) unsigned char sm[];
    uint64_t *bar = reinterpret_cast<uint64_t *>(sm);
    unsigned char *in = sm + 128;
    unsigned char *ob = in + NI * TILE_IN;
    __shared__ float code_s[16];
    if (threadIdx.x < 16)
        code_s[threadIdx.x] = code_c[threadIdx.x];
    auto tile_of = [&](int j) { return blockIdx.x + j * gridDim.x; };
    if (threadIdx.x == 0) {
        for (int s = 0; s < NI; s++)
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&bar[s])));
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        for (int j = 0; j < NI && (int)tile_of(j) < tiles; j++)
            load_tile(in + j * TILE_IN, w + (size_t)tile_of(j) * (TILE / 2), absmax + (size_t)tile_of(j) * (TILE / GROUP),
                      &bar[j]);
    }
    __syncthreads();
    for (int j = 0; (int)tile_of(j) < tiles; j++) {
        const int s = j % NI, o = j % NO;
        if (threadIdx.x == 0) /* the store that last used out[o] has read it */
            asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(NO - 1) : "memory");
        mbar_wait(&bar[s], (unsigned)(j / NI) & 1u);
        __syncthreads();
        /* thread t: bytes 16t .. 16t + 15 (weights 32t ..), one absmax (32 | 64) */
        const uint4 v = reinterpret_cast<const uint4 *>(in + s * TILE_IN)[threadIdx.x];
        const float a = reinterpret_cast<const float *>(in + s * TILE_IN + TILE / 2)[threadIdx.x * 32 / GROUP];
        const uint32_t words[4] = {v.x, v.y, v.z, v.w};
        uint4 *dst = reinterpret_cast<uint4 *>(ob + o * TILE * 2) + 4 * threadIdx.x;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            __nv_bfloat162 h[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const uint32_t b = (words[k] >> (8 * i)) & 0xffu;
                h[i] = __floats2bfloat162_rn(code_s[b >> 4] * a, code_s[b & 15u] * a);
            }
            dst[k] = *reinterpret_cast<uint4 *>(h);
        }
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncthreads();
        if (threadIdx.x == 0) {
            asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(
                             out + (size_t)tile_of(j) * TILE),
                         "r"(smem_addr(ob + o * TILE * 2)), "r"(TILE * 2)
                         : "memory");
            asm volatile("cp.async.bulk.commit_group;" ::: "memory");
            const int jn = j + NI;
            if ((int)tile_of(jn) < tiles)
                load_tile(in + s * TILE_IN, w + (size_t)tile_of(jn) * (TILE / 2),
                          absmax + (size_t)tile_of(jn) * (TILE / GROUP), &bar[s]);
        }
    }
    if (threadIdx.x == 0)
        asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

int main(int argc, char **argv)
{
    std::vector<int> sms = {16, 20, 24, 32};
    for (int i = 1; i < argc; i++) {
        if (!std::strcmp(argv[i], "--sms") && i + 1 < argc) {
            sms.clear();
            for (char *p = std::strtok(argv[++i], ","); p; p = std::strtok(nullptr, ","))
                sms.push_back(std::atoi(p));
        } else {
            std::fprintf(stderr, "usage: dqsplit [--sms S,S,...]\n");
            return 2;
        }
    }
    cudaDeviceProp prop;
    BENCH_CK(cudaGetDeviceProperties(&prop, 0));
    for (int S : sms)
        if (S < 1 || S >= prop.multiProcessorCount) {
            std::fprintf(stderr, "dqsplit: --sms: each count must be 1 .. %d (got %d)\n", prop.multiProcessorCount - 1, S);
            return 2;
        }
    const size_t n = (size_t)ROWS * COLS;
    const float nf4[16] = {-1.0f, -0.6961928f, -0.5250731f, -0.3949175f, -0.2844414f, -0.1848449f, -0.0910500f, 0.0f,
                           0.0795803f, 0.1609302f, 0.2461123f, 0.3379152f, 0.4407098f, 0.5626170f, 0.7229568f, 1.0f};
    BENCH_CK(cudaMemcpyToSymbol(code_c, nf4, sizeof nf4));
    uint8_t *w;
    float *am, *y;
    __nv_bfloat16 *scratch, *x;
    BENCH_CK(cudaMalloc(&w, n / 2));
    BENCH_CK(cudaMalloc(&am, n / GROUP * 4));
    BENCH_CK(cudaMalloc(&scratch, n * 2));
    BENCH_CK(cudaMalloc(&x, (size_t)TOKENS * COLS * 2));
    BENCH_CK(cudaMalloc(&y, (size_t)TOKENS * ROWS * 4));
    { /* random contents: zeros run faster than data */
        std::vector<uint32_t> h(n / 8);
        uint32_t s = 12345;
        for (auto &v : h)
            v = s = s * 1664525u + 1013904223u;
        BENCH_CK(cudaMemcpy(w, h.data(), n / 2, cudaMemcpyHostToDevice));
        std::vector<float> a(n / GROUP);
        for (auto &v : a)
            v = 0.01f + (s = s * 1664525u + 1013904223u) % 1000 * 1e-5f;
        BENCH_CK(cudaMemcpy(am, a.data(), a.size() * 4, cudaMemcpyHostToDevice));
        std::vector<__nv_bfloat16> xb((size_t)TOKENS * COLS);
        for (auto &v : xb)
            v = __float2bfloat16(((s = s * 1664525u + 1013904223u) % 2001) / 1000.0f - 1.0f);
        BENCH_CK(cudaMemcpy(x, xb.data(), xb.size() * 2, cudaMemcpyHostToDevice));
    }
    cudaStream_t s0, s1;
    BENCH_CK(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
    BENCH_CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    const size_t bulk_smem = 128 + NI * TILE_IN + NO * TILE * 2;
    BENCH_CK(cudaFuncSetAttribute(k_bulk, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bulk_smem));
    const size_t plain_smem = 120 * 1024;
    BENCH_CK(cudaFuncSetAttribute(k_plain<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)plain_smem));
    BENCH_CK(cudaFuncSetAttribute(k_plain<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)plain_smem));
    BENCH_CK(cudaFuncSetAttribute(k_plain<16>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)plain_smem));
    const double bytes = n / 2 + n / GROUP * 4 + n * 2.0; /* read + written */
    const int tiles = (int)(n / TILE);

    /* Check the bulk kernel against the plain one once (the same function). */
    {
        __nv_bfloat16 *ref;
        BENCH_CK(cudaMalloc(&ref, n * 2));
        BENCH_CK(cudaMemset(ref, 0xff, n * 2));
        BENCH_CK(cudaMemset(scratch, 0x7f, n * 2));
        k_plain<4><<<prop.multiProcessorCount, 1024, plain_smem, s0>>>(ref, (const uint32_t *)w, am, n / 8);
        k_bulk<<<prop.multiProcessorCount, BULK_THREADS, bulk_smem, s0>>>(scratch, w, am, tiles);
        BENCH_CK(cudaStreamSynchronize(s0));
        BENCH_CK(cudaGetLastError());
        std::vector<uint16_t> a(n), b(n);
        BENCH_CK(cudaMemcpy(a.data(), ref, n * 2, cudaMemcpyDeviceToHost));
        BENCH_CK(cudaMemcpy(b.data(), scratch, n * 2, cudaMemcpyDeviceToHost));
        size_t bad = 0;
        for (size_t i = 0; i < n; i++)
            bad += a[i] != b[i];
        std::printf("bulk vs plain decoding: %zu of %zu weights differ\n", bad, n);
        BENCH_CK(cudaFree(ref));
        if (bad)
            return 1;
    }

    bench_gemm full(TOKENS, ROWS, COLS);
    const double g_all = bench_ms(s0, 9, [&] { full.run(y, x, scratch, s0); });
    const double flop = 2.0 * ROWS * COLS * TOKENS;
    std::printf("%s, %d SMs: gate/up shape %d x %d, %d tokens\n", prop.name, prop.multiProcessorCount, ROWS, COLS, TOKENS);
    std::printf("product alone, all SMs: %.3f ms (%.0f TFLOP/s)\n", g_all, flop / g_all / 1e9);
    /* The engine's launch (launch_dequant): 16 blocks of 256 threads an SM, U loads in flight a thread. */
    const unsigned eng_blocks = prop.multiProcessorCount * 16;
    const double p_all = bench_ms(s0, 9, [&] { k_plain<4><<<eng_blocks, 256, 0, s0>>>(scratch, (const uint32_t *)w, am, n / 8); });
    const double p8_all = bench_ms(s0, 9, [&] { k_plain<8><<<eng_blocks, 256, 0, s0>>>(scratch, (const uint32_t *)w, am, n / 8); });
    const double p16_all = bench_ms(s0, 9, [&] { k_plain<16><<<eng_blocks, 256, 0, s0>>>(scratch, (const uint32_t *)w, am, n / 8); });
    const double b_all = bench_ms(s0, 9, [&] { k_bulk<<<prop.multiProcessorCount, BULK_THREADS, bulk_smem, s0>>>(scratch, w, am, tiles); });
    std::printf("decoding alone, all SMs: plain U4 (the engine's) %.3f ms (%.0f GB/s), U8 %.3f (%.0f), U16 %.3f (%.0f), "
                "bulk %.3f (%.0f)\n",
                p_all, bytes / p_all / 1e6, p8_all, bytes / p8_all / 1e6, p16_all, bytes / p16_all / 1e6, b_all,
                bytes / b_all / 1e6);
    /* What overlap cannot beat: the bytes both move (the product reads the decoded matrix and x, writes y). */
    const double prod_bytes = n * 2.0 + (double)TOKENS * COLS * 2 + (double)TOKENS * ROWS * 4;
    std::printf("serial now (product + decoding, all SMs): %.3f ms; the product alone moves %.0f GB/s; both together move "
                "%.0f MB: %.3f ms at 3,020 GB/s\n",
                g_all + p_all, prod_bytes / g_all / 1e6, (bytes + prod_bytes) / 1e6, (bytes + prod_bytes) / 3020e6);
    {
        cudaEvent_t f, j;
        BENCH_CK(cudaEventCreateWithFlags(&f, cudaEventDisableTiming));
        BENCH_CK(cudaEventCreateWithFlags(&j, cudaEventDisableTiming));
        __nv_bfloat16 *other;
        BENCH_CK(cudaMalloc(&other, n * 2));
        const double both_all = bench_ms(s0, 9, [&] {
            BENCH_CK(cudaEventRecord(f, s0));
            BENCH_CK(cudaStreamWaitEvent(s1, f, 0));
            k_plain<4><<<eng_blocks, 256, 0, s1>>>(other, (const uint32_t *)w, am, n / 8);
            full.run(y, x, scratch, s0);
            BENCH_CK(cudaEventRecord(j, s1));
            BENCH_CK(cudaStreamWaitEvent(s0, j, 0));
        });
        std::printf("both at once on two streams, no SM limit: %.3f ms\n", both_all);
        BENCH_CK(cudaFree(other));
    }
    std::printf("%4s %9s | decoding alone on S SMs, ms (GB/s a SM): %-15s %-15s %-15s %-15s | both at once, ms: %-8s %-8s\n",
                "S", "product", "plain U4", "plain U8", "plain U16", "bulk", "U8", "bulk");
    cudaEvent_t fork, join;
    BENCH_CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    BENCH_CK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
    __nv_bfloat16 *scratch2;
    BENCH_CK(cudaMalloc(&scratch2, n * 2));
    const uint32_t *w32 = (const uint32_t *)w;
    for (int S : sms) {
        bench_gemm part(TOKENS, ROWS, COLS, prop.multiProcessorCount - S);
        const double g = bench_ms(s0, 9, [&] { part.run(y, x, scratch, s0); });
        const double p4 = bench_ms(s0, 5, [&] { k_plain<4><<<S, 1024, plain_smem, s0>>>(scratch, w32, am, n / 8); });
        const double p8 = bench_ms(s0, 5, [&] { k_plain<8><<<S, 1024, plain_smem, s0>>>(scratch, w32, am, n / 8); });
        const double p16 = bench_ms(s0, 5, [&] { k_plain<16><<<S, 1024, plain_smem, s0>>>(scratch, w32, am, n / 8); });
        const double b = bench_ms(s0, 5, [&] { k_bulk<<<S, BULK_THREADS, bulk_smem, s0>>>(scratch, w, am, tiles); });
        /* Both: the decoding of "the next matrix" on s1 (launched first, so its S blocks hold S SMs) and the
         * product on s0 with an SM count target of the rest, forked and joined with events. */
        auto both = [&](auto launch) {
            return bench_ms(s0, 5, [&] {
                BENCH_CK(cudaEventRecord(fork, s0));
                BENCH_CK(cudaStreamWaitEvent(s1, fork, 0));
                launch();
                part.run(y, x, scratch, s0);
                BENCH_CK(cudaEventRecord(join, s1));
                BENCH_CK(cudaStreamWaitEvent(s0, join, 0));
            });
        };
        const double b8 = both([&] { k_plain<8><<<S, 1024, plain_smem, s1>>>(scratch2, w32, am, n / 8); });
        const double bb = both([&] { k_bulk<<<S, BULK_THREADS, bulk_smem, s1>>>(scratch2, w, am, tiles); });
        BENCH_CK(cudaGetLastError());
        auto rate = [&](double ms) { return bytes / ms / 1e6 / S; };
        std::printf("%4d %6.3f ms | %41s %6.3f (%5.1f)  %6.3f (%5.1f)  %6.3f (%5.1f)  %6.3f (%5.1f) | %8.3f %8.3f\n", S, g, "",
                    p4, rate(p4), p8, rate(p8), p16, rate(p16), b, rate(b), b8, bb);
    }
    return 0;
}
