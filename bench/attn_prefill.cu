/*
 * attn_prefill.cu: the prefill attention kernel alone, one chunk of a long
 * prompt against the cache beneath it, for every KV cache type: the time of
 * one launch and its rate in FLOP.
 *
 *   attn_prefill [--pos0 P] [--n N] [--heads H] [--kv-heads K] [--head-dim D]
 *                [--layers L] [--reps R]
 *
 * Defaults: Llama-3.1-8B's shape (32 heads, 8 kv heads, head_dim 128), the
 * last 512-token chunk of a 32,768-token prompt (queries at positions
 * 32,256 .. 32,767: the chunk that costs most), 4 layers' caches used in
 * turn, 20 repetitions. FLOP a launch: 4 x head_dim x heads x the keys each
 * query sees (two products of the causal part), the figure FlashAttention's
 * papers count. ENGINE_CUDA_CC caps the capability as in the engine
 * (the CUDA-core kernel below 8.0).
 */
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "attn_bench.cuh"

static const char *kv_name(k_kv_type t)
{
    return t == K_KV_F16 ? "f16" : t == K_KV_BF16 ? "bf16" : t == K_KV_INT8 ? "int8" : t == K_KV_FP8 ? "fp8" : "f32";
}

int main(int argc, char **argv)
{
    int pos0 = 32768 - 512, n = 512, nh = 32, nkv = 8, hd = 128, layers = 4, reps = 20;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (!strcmp(a, "--pos0")) pos0 = atoi(v);
        else if (!strcmp(a, "--n")) n = atoi(v);
        else if (!strcmp(a, "--heads")) nh = atoi(v);
        else if (!strcmp(a, "--kv-heads")) nkv = atoi(v);
        else if (!strcmp(a, "--head-dim")) hd = atoi(v);
        else if (!strcmp(a, "--layers")) layers = atoi(v);
        else if (!strcmp(a, "--reps")) reps = atoi(v);
        else {
            fprintf(stderr, "attn_prefill: unknown option %s\n", a);
            return 2;
        }
    }
    if (pos0 < 0 || n < 1 || nh < 1 || nkv < 1 || nh % nkv || hd < 16 || hd % 16 || layers < 1 || reps < 1) {
        fprintf(stderr, "attn_prefill: bad shape\n");
        return 2;
    }
    cudaDeviceProp prop;
    launch_ctx lc = attn_bench_ctx("attn_prefill", &prop);
    const int ctx = pos0 + n, kvd = nkv * hd;
    printf("device %s, capability acted on %d, queries %d at positions %d..%d, heads %d/%d, head_dim %d, "
           "%d layers in turn\n",
           prop.name, lc.cc, n, pos0, ctx - 1, nh, nkv, hd, layers);

    const size_t rows = (size_t)ctx * kvd;
    float *q, *out, *scales;
    void *cache;
    BENCH_CK(cudaMalloc(&q, (size_t)n * nh * hd * 4));
    BENCH_CK(cudaMalloc(&out, (size_t)n * nh * hd * 4));
    BENCH_CK(cudaMalloc(&cache, (size_t)layers * 2 * rows * 2)); /* the largest type measured is 2 bytes */
    BENCH_CK(cudaMalloc(&scales, (size_t)layers * 2 * ctx * nkv * 4));
    {
        attn_bench_fill(cache, rows, 2 * layers);
        std::vector<float> f((size_t)n * nh * hd);
        for (size_t i = 0; i < f.size(); i++)
            f[i] = (float)((i * 40503u >> 7) % 200) / 100.0f - 1.0f;
        BENCH_CK(cudaMemcpy(q, f.data(), f.size() * 4, cudaMemcpyHostToDevice));
        std::vector<float> s((size_t)2 * layers * ctx * nkv, 0.01f);
        BENCH_CK(cudaMemcpy(scales, s.data(), s.size() * 4, cudaMemcpyHostToDevice));
    }
    const double flop = 4.0 * hd * nh * ((double)n * pos0 + (double)n * (n + 1) / 2);
    printf("%-5s %10s %10s\n", "kv", "us/launch", "TFLOP/s");
    const k_kv_type types[] = {K_KV_F16, K_KV_BF16, K_KV_INT8, K_KV_FP8};
    for (k_kv_type t : types) {
        const size_t es = t == K_KV_INT8 || t == K_KV_FP8 ? 1 : 2;
        int layer = 0, rc = 0;
        auto run = [&]() {
            for (int l = 0; l < layers && !rc; l++, layer = (layer + 1) % layers)
                rc = launch_attention_prefill(&lc, out, K_BF16, q, (char *)cache + (size_t)(2 * layer) * rows * es,
                                              (char *)cache + (size_t)(2 * layer + 1) * rows * es,
                                              scales + (size_t)(2 * layer) * ctx * nkv,
                                              scales + (size_t)(2 * layer + 1) * ctx * nkv, t, n, pos0, nh, nkv, hd, 0,
                                              0);
        };
        run(); /* first launches (and their errors) outside the timing */
        BENCH_CK(cudaStreamSynchronize(lc.stream));
        const double ms = rc ? 0.0 : bench_ms(lc.stream, reps, run) / layers;
        if (rc) {
            printf("%-5s  failed: %s\n", kv_name(t), lc.err);
            continue;
        }
        printf("%-5s %10.1f %10.1f\n", kv_name(t), ms * 1e3, flop / (ms * 1e-3) / 1e12);
    }
    return 0;
}
