/*
 * q4gemm.cu: the fused 4-bit prefill product (kernels/cuda/gemm_q4.cu)
 * against the path it replaces, on the four matrix shapes of an 8B Llama
 * (and the 1B's), 512 tokens:
 *   fused 1, 2  launch_gemm_q4 with one or two 128-token sub-tiles a CTA:
 *               packed weights straight to the tensor cores, the work
 *               shared out over every multiprocessor (tiles split along K)
 *   whole 1, 2  the same with whole tiles, one a CTA, in waves
 *   scratch     the engine's decoding into bf16 + cuBLASLt (the default path)
 *   bf16        cuBLASLt alone on a bf16 matrix (what prefill of an
 *               unquantized model does; the issue's 80% target is against it)
 * Before timing, each shape's fused result is compared with cuBLASLt on
 * the same weights decoded as the kernel decodes them
 * (bf16(bf16(code) * bf16(absmax))), poisoned output first, fresh random
 * inputs, and with an odd token count (37) as well; a relative error above
 * 1e-4 fails the run. "pick" is what the engine uses for the shape
 * (gemm_q4_tiles: 0 is scratch; split or whole as launch_gemm_q4's model
 * chooses), timed again for pick/bf16.
 *   q4gemm [--shapes 8b|1b|all|NAME] [--tokens N]   (default all, 512; NAME: one shape, e.g. "8B down")
 */
#include <algorithm>
#include <iterator>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "../kernels/cuda/gemm_q4.cu"
#include "bench_cuda.cuh"

static const float NF4[16] = {-1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
                              -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
                              0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f,
                              0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f};

static uint16_t bf16_rn(float f)
{
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static float bf16_f(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

static uint32_t rng = 2463534242u;
static uint32_t next_u32()
{
    rng ^= rng << 13;
    rng ^= rng >> 17;
    rng ^= rng << 5;
    return rng;
}

/* The engine's decoding to scratch (launch_dequant's shape). */
__global__ void k_scratch(__nv_bfloat16 *out, const uint32_t *w, const float *absmax, const float *code, size_t total8)
{
    __shared__ float cs[16];
    if (threadIdx.x < 16)
        cs[threadIdx.x] = code[threadIdx.x];
    __syncthreads();
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x; t < total8; t += stride) {
        const uint32_t v = __ldg(w + t);
        const float s = __ldg(absmax + (8 * t) / 64);
        __nv_bfloat162 h[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t b = (v >> (8 * i)) & 0xffu;
            h[i] = __floats2bfloat162_rn(cs[b >> 4] * s, cs[b & 15u] * s);
        }
        *reinterpret_cast<uint4 *>(out + 8 * t) = *reinterpret_cast<uint4 *>(h);
    }
}

/* Where a failed comparison went wrong: the count of bad outputs, the first (token, row) and its values. */
static void report_bad(const char *what, int mode, int n, int rows, const std::vector<float> &got,
                       const std::vector<float> &ref)
{
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < got.size(); i++)
        if (!std::isfinite(got[i]) || std::fabs(got[i] - ref[i]) > 1e-3 * (std::fabs(ref[i]) + 1)) {
            if (!bad++)
                first = i;
        }
    if (bad)
        std::printf("q4gemm: %s mode %d n %d: %zu bad outputs, first token %zu row %zu: %g against %g\n", what, mode, n,
                    bad, first / rows, first % rows, got[first], ref[first]);
}

static double rel_err(const std::vector<float> &got, const std::vector<float> &ref)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < got.size(); i++) {
        const double d = (double)got[i] - ref[i];
        if (!std::isfinite(got[i]))
            return INFINITY;
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return std::sqrt(num / (den > 0 ? den : 1));
}

int main(int argc, char **argv)
{
    const char *which = "all";
    int N = 512;
    for (int i = 1; i < argc; i++) {
        if (!std::strcmp(argv[i], "--shapes") && i + 1 < argc)
            which = argv[++i];
        else if (!std::strcmp(argv[i], "--tokens") && i + 1 < argc)
            N = std::atoi(argv[++i]);
        else {
            std::fprintf(stderr, "usage: q4gemm [--shapes 8b|1b|all|NAME] [--tokens N]\n");
            return 2;
        }
    }
    struct shape {
        const char *name;
        int rows, cols;
        bool big;
    } shapes[] = {{"8B q/k/v", 6144, 4096, true},     {"8B o", 4096, 4096, true},    {"8B gate/up", 28672, 4096, true},
                  {"8B down", 4096, 14336, true},     {"1B q/k/v", 3072, 2048, false}, {"1B o", 2048, 2048, false},
                  {"1B gate/up", 16384, 2048, false}, {"1B down", 2048, 8192, false}};
    const bool named = std::strcmp(which, "8b") && std::strcmp(which, "1b") && std::strcmp(which, "all");
    const auto is_named = [&](const shape &sh) { return !std::strcmp(which, sh.name); };
    if (named && std::none_of(std::begin(shapes), std::end(shapes), is_named)) {
        std::fprintf(stderr, "q4gemm: --shapes %s: not 8b, 1b, all or a shape's name (e.g. \"8B down\")\n", which);
        return 2;
    }
    if (N < 37) {
        std::fprintf(stderr, "q4gemm: --tokens must be at least 37 (the odd count it also checks)\n");
        return 2;
    }
    cudaDeviceProp prop;
    BENCH_CK(cudaGetDeviceProperties(&prop, 0));
    launch_ctx lc = {};
    BENCH_CK(cudaStreamCreateWithFlags(&lc.stream, cudaStreamNonBlocking));
    lc.n_sms = prop.multiProcessorCount;
    lc.fast[K_OP_GEMM_Q4] = gemm_q4_supported();
    if (!lc.fast[K_OP_GEMM_Q4]) {
        std::printf("q4gemm: %s (compute capability %d.%d) does not run the fused product\n", prop.name, prop.major,
                    prop.minor);
        return 1;
    }
    float *code;
    BENCH_CK(cudaMalloc(&code, sizeof NF4));
    BENCH_CK(cudaMemcpy(code, NF4, sizeof NF4, cudaMemcpyHostToDevice));
    std::printf("q4gemm: %s; %d tokens; ms (median of 9); TFLOP/s in brackets\n", prop.name, N);
    gemm_q4_work work = {};
    work.part_bytes = gemm_q4_work_bytes(&lc, 2);
    work.n_count = lc.n_sms;
    work.always_split = true; /* the fused columns; the pick uses the model (pick_work) */
    BENCH_CK(cudaMalloc(&work.part, work.part_bytes));
    BENCH_CK(cudaMalloc(&work.count, lc.n_sms * sizeof(uint32_t)));
    BENCH_CK(cudaMemsetAsync(work.count, 0, lc.n_sms * sizeof(uint32_t), lc.stream));
    gemm_q4_work pick_work = work;
    pick_work.always_split = false;
    std::printf("%-12s %14s %14s %14s %14s %14s %14s %5s %10s %9s\n", "shape", "fused 1", "fused 2", "whole 1",
                "whole 2", "scratch", "bf16", "pick", "pick/bf16", "error");
    int fails = 0;
    for (const shape &sh : shapes) {
        if ((!std::strcmp(which, "8b") && !sh.big) || (!std::strcmp(which, "1b") && sh.big) ||
            (named && std::strcmp(which, sh.name)))
            continue;
        const int rows = sh.rows, cols = sh.cols;
        const size_t nw = (size_t)rows * cols;
        std::vector<uint8_t> hw(nw / 2);
        for (auto &b : hw)
            b = (uint8_t)next_u32();
        std::vector<float> ham(nw / 64);
        for (auto &a : ham)
            a = 0.002f + (next_u32() % 10000) * 5e-6f;
        std::vector<uint16_t> hx((size_t)N * cols), href(nw);
        for (auto &v : hx)
            v = bf16_rn(((int)(next_u32() % 20001) - 10000) / 10000.0f);
        for (size_t i = 0; i < nw; i++) { /* as the kernel decodes: bf16(bf16(code) * bf16(absmax)) */
            const uint8_t b = hw[i / 2];
            const float cv = bf16_f(bf16_rn(NF4[i % 2 ? b & 15 : b >> 4])), av = bf16_f(bf16_rn(ham[i / 64]));
            href[i] = bf16_rn(cv * av);
        }
        uint8_t *dw;
        float *dam, *dy, *dref;
        __nv_bfloat16 *dx, *dwref, *scratch;
        BENCH_CK(cudaMalloc(&dw, nw / 2));
        BENCH_CK(cudaMalloc(&dam, nw / 64 * 4));
        BENCH_CK(cudaMalloc(&dx, (size_t)N * cols * 2));
        BENCH_CK(cudaMalloc(&dwref, nw * 2));
        BENCH_CK(cudaMalloc(&scratch, nw * 2));
        BENCH_CK(cudaMalloc(&dy, (size_t)N * rows * 4));
        BENCH_CK(cudaMalloc(&dref, (size_t)N * rows * 4));
        BENCH_CK(cudaMemcpy(dw, hw.data(), nw / 2, cudaMemcpyHostToDevice));
        BENCH_CK(cudaMemcpy(dam, ham.data(), nw / 64 * 4, cudaMemcpyHostToDevice));
        BENCH_CK(cudaMemcpy(dx, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
        BENCH_CK(cudaMemcpy(dwref, href.data(), nw * 2, cudaMemcpyHostToDevice));
        gemv_args ga = {};
        ga.w = dw;
        ga.wt = K_NF4;
        ga.scales = dam;
        ga.code = code;
        ga.group = 64;
        ga.rows = rows;
        ga.cols = cols;
        bench_gemm gemm_n(N, rows, cols), gemm_37(37, rows, cols);
        double err = 0;
        for (int mode = 0; mode < 4; mode++) {
            const int sub = 1 + mode % 2;
            const gemm_q4_work *wk = mode < 2 ? &work : nullptr;
            for (int n : {N, 37}) {
                /* NaN: every output must be written (on the product's stream: a non-blocking one does not wait
                 * for the legacy stream's memset) */
                BENCH_CK(cudaMemsetAsync(dy, 0xff, (size_t)N * rows * 4, lc.stream));
                if (launch_gemm_q4(&lc, dy, false, dx, K_BF16, &ga, n, sub, wk) != 0) {
                    std::printf("q4gemm: %s\n", lc.err);
                    return 1;
                }
                (n == N ? gemm_n : gemm_37).run(dref, dx, dwref, lc.stream);
                BENCH_CK(cudaStreamSynchronize(lc.stream));
                std::vector<float> got((size_t)n * rows), ref((size_t)n * rows);
                BENCH_CK(cudaMemcpy(got.data(), dy, got.size() * 4, cudaMemcpyDeviceToHost));
                BENCH_CK(cudaMemcpy(ref.data(), dref, ref.size() * 4, cudaMemcpyDeviceToHost));
                report_bad("product", mode, n, rows, got, ref);
                report_bad("accumulate", mode, 37, rows, got, ref);
            err = std::max(err, rel_err(got, ref));
            }
            /* accumulate: y = ref + fused again */
            BENCH_CK(cudaMemcpyAsync(dy, dref, (size_t)37 * rows * 4, cudaMemcpyDeviceToDevice, lc.stream));
            if (launch_gemm_q4(&lc, dy, true, dx, K_BF16, &ga, 37, sub, wk) != 0) {
                std::printf("q4gemm: %s\n", lc.err);
                return 1;
            }
            BENCH_CK(cudaStreamSynchronize(lc.stream));
            std::vector<float> got((size_t)37 * rows), ref((size_t)37 * rows);
            BENCH_CK(cudaMemcpy(got.data(), dy, got.size() * 4, cudaMemcpyDeviceToHost));
            BENCH_CK(cudaMemcpy(ref.data(), dref, ref.size() * 4, cudaMemcpyDeviceToHost));
            for (auto &v : ref)
                v *= 2.0f;
            err = std::max(err, rel_err(got, ref));
        }
        const double flop = 2.0 * rows * cols * N;
        const double t1 = bench_ms(lc.stream, 9, [&] { launch_gemm_q4(&lc, dy, false, dx, K_BF16, &ga, N, 1, &work); });
        const double t2 = bench_ms(lc.stream, 9, [&] { launch_gemm_q4(&lc, dy, false, dx, K_BF16, &ga, N, 2, &work); });
        const double w1 = bench_ms(lc.stream, 9, [&] { launch_gemm_q4(&lc, dy, false, dx, K_BF16, &ga, N, 1, nullptr); });
        const double w2 = bench_ms(lc.stream, 9, [&] { launch_gemm_q4(&lc, dy, false, dx, K_BF16, &ga, N, 2, nullptr); });
        const double ts = bench_ms(lc.stream, 9, [&] {
            k_scratch<<<prop.multiProcessorCount * 16, 256, 0, lc.stream>>>(scratch, (const uint32_t *)dw, dam, code, nw / 8);
            gemm_n.run(dy, dx, scratch, lc.stream);
        });
        const double tb = bench_ms(lc.stream, 9, [&] { gemm_n.run(dy, dx, dwref, lc.stream); });
        BENCH_CK(cudaGetLastError());
        const int pick = gemm_q4_tiles(&lc, &ga, K_BF16, N, &pick_work);
        const double tp =
            pick ? bench_ms(lc.stream, 9, [&] { launch_gemm_q4(&lc, dy, false, dx, K_BF16, &ga, N, pick, &pick_work); }) : ts;
        std::printf("%-12s %6.3f (%4.0f) %6.3f (%4.0f) %6.3f (%4.0f) %6.3f (%4.0f) %6.3f (%4.0f) %6.3f (%4.0f) %5d %10.2f "
                    "%9.1e%s\n",
                    sh.name, t1, flop / t1 / 1e9, t2, flop / t2 / 1e9, w1, flop / w1 / 1e9, w2, flop / w2 / 1e9, ts,
                    flop / ts / 1e9, tb, flop / tb / 1e9, pick, tb / tp, err, err < 1e-4 ? "" : "  FAIL");
        fails += !(err < 1e-4);
        cudaFree(dw), cudaFree(dam), cudaFree(dx), cudaFree(dwref), cudaFree(scratch), cudaFree(dy), cudaFree(dref);
    }
    return fails ? 1 : 0;
}
