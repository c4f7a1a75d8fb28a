/*
 * attn_decode.cu: the decode attention kernels alone at a given depth, for
 * every KV cache type: the staged kernel through both merges (thread-block
 * cluster and the portable one through global memory) and the streaming
 * kernel of long contexts, at several split counts (the staged kernel's at
 * most 16): the time of one launch and the rate at which it reads the
 * cache.
 *
 *   attn_decode [--depth N] [--heads H] [--kv-heads K] [--head-dim D]
 *               [--layers L] [--reps R] [--splits S,S,...]
 *
 * Defaults: Llama-3.1-8B's shape (32 heads, 8 kv heads, head_dim 128) at
 * depth 32,768, 4 layers' caches used in turn (so that a layer's cache is
 * not in L2 from the launch before), 50 repetitions, splits 8,16,32.
 * Bytes read a launch: K and V rows of the depth, and int8/fp8's two row
 * scales; the qkv input and the output are a few kB. ENGINE_CUDA_CC caps
 * the capability as in the engine (no cluster path below 9.0).
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
    int depth = 32768, nh = 32, nkv = 8, hd = 128, layers = 4, reps = 50;
    std::vector<int> split_list = {8, 16, 32};
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (!strcmp(a, "--depth")) depth = atoi(v);
        else if (!strcmp(a, "--heads")) nh = atoi(v);
        else if (!strcmp(a, "--kv-heads")) nkv = atoi(v);
        else if (!strcmp(a, "--head-dim")) hd = atoi(v);
        else if (!strcmp(a, "--layers")) layers = atoi(v);
        else if (!strcmp(a, "--reps")) reps = atoi(v);
        else if (!strcmp(a, "--splits")) {
            split_list.clear();
            for (const char *p = v; *p;) {
                split_list.push_back(atoi(p));
                while (*p && *p != ',') p++;
                if (*p) p++;
            }
        } else {
            fprintf(stderr, "attn_decode: unknown option %s\n", a);
            return 2;
        }
    }
    if (depth < 1 || nh < 1 || nkv < 1 || nh % nkv || hd < 16 || hd % 16 || layers < 1 || reps < 1) {
        fprintf(stderr, "attn_decode: bad shape\n");
        return 2;
    }
    cudaDeviceProp prop;
    launch_ctx lc = attn_bench_ctx("attn_decode", &prop);
    printf("device %s, capability acted on %d, depth %d, heads %d/%d, head_dim %d, %d layers in turn\n", prop.name,
           lc.cc, depth, nh, nkv, hd, layers);

    const int n_ctx = depth, kvd = nkv * hd, G = nh / nkv;
    const size_t rows = (size_t)n_ctx * kvd;
    float *qkv, *cosv, *sinv, *out, *part, *scales;
    int *pos;
    unsigned *count;
    void *cache;
    BENCH_CK(cudaMalloc(&qkv, (size_t)(nh + 2 * nkv) * hd * 4));
    BENCH_CK(cudaMalloc(&cosv, (size_t)n_ctx * hd / 2 * 4));
    BENCH_CK(cudaMalloc(&sinv, (size_t)n_ctx * hd / 2 * 4));
    BENCH_CK(cudaMalloc(&out, (size_t)nh * hd * 4));
    BENCH_CK(cudaMalloc(&part, (size_t)nkv * 32 * ((size_t)G * hd + 2 * G) * 4));
    BENCH_CK(cudaMalloc(&count, (size_t)nkv * 4));
    BENCH_CK(cudaMalloc(&pos, 4));
    BENCH_CK(cudaMalloc(&cache, (size_t)layers * 2 * rows * 2)); /* the largest type measured is 2 bytes */
    BENCH_CK(cudaMalloc(&scales, (size_t)layers * 2 * n_ctx * nkv * 4));
    BENCH_CK(cudaMemset(count, 0, (size_t)nkv * 4));
    {
        attn_bench_fill(cache, rows, 2 * layers);
        std::vector<float> f((size_t)n_ctx * hd / 2 > (size_t)(nh + 2 * nkv) * hd ? (size_t)n_ctx * hd / 2
                                                                                  : (size_t)(nh + 2 * nkv) * hd);
        for (size_t i = 0; i < f.size(); i++)
            f[i] = 0.5f + 0.25f * (float)((i * 40503u >> 7) % 100) / 100.0f;
        BENCH_CK(cudaMemcpy(qkv, f.data(), (size_t)(nh + 2 * nkv) * hd * 4, cudaMemcpyHostToDevice));
        BENCH_CK(cudaMemcpy(cosv, f.data(), (size_t)n_ctx * hd / 2 * 4, cudaMemcpyHostToDevice));
        BENCH_CK(cudaMemcpy(sinv, f.data(), (size_t)n_ctx * hd / 2 * 4, cudaMemcpyHostToDevice));
        std::vector<float> s((size_t)2 * layers * n_ctx * nkv, 0.01f);
        BENCH_CK(cudaMemcpy(scales, s.data(), s.size() * 4, cudaMemcpyHostToDevice));
        const int p = depth - 1;
        BENCH_CK(cudaMemcpy(pos, &p, 4, cudaMemcpyHostToDevice));
    }
    const bool has_cluster = lc.fast[K_OP_ATTN_CLUSTER];
    printf("%-5s %-9s %6s %10s %10s\n", "kv", "kernel", "splits", "us/launch", "GB/s");
    static const char *const variants[] = {"cluster", "portable", "stream"};
    const k_kv_type types[] = {K_KV_F16, K_KV_BF16, K_KV_INT8, K_KV_FP8};
    for (k_kv_type t : types) {
        const size_t es = t == K_KV_INT8 || t == K_KV_FP8 ? 1 : 2;
        const bool quant = es == 1;
        const double bytes = 2.0 * rows * es + (quant ? 2.0 * n_ctx * nkv * 4 : 0.0);
        for (int v = has_cluster ? 0 : 1; v < 3; v++) {
            const bool stream = v == 2;
            lc.fast[K_OP_ATTN_CLUSTER] = v == 0;
            for (int splits : split_list) {
                if (splits > (stream ? 32 : 16))
                    continue;
                int layer = 0, rc = 0;
                auto run = [&]() {
                    for (int l = 0; l < layers && !rc; l++, layer = (layer + 1) % layers) {
                        rope_qkv_args a = {};
                        a.qkv = qkv;
                        a.eps = 1e-5f;
                        a.cos = cosv;
                        a.sin = sinv;
                        a.k_cache = (char *)cache + (size_t)(2 * layer) * rows * es;
                        a.v_cache = (char *)cache + (size_t)(2 * layer + 1) * rows * es;
                        a.k_scale = scales + (size_t)(2 * layer) * n_ctx * nkv;
                        a.v_scale = scales + (size_t)(2 * layer + 1) * n_ctx * nkv;
                        a.kvt = t;
                        a.pos0 = pos;
                        a.n = 1;
                        a.n_heads = nh;
                        a.n_kv_heads = nkv;
                        a.head_dim = hd;
                        a.part = part;
                        a.count = count;
                        rc = stream ? launch_attention_decode_stream(&lc, &a, out, 0, splits)
                                    : launch_attention_decode(&lc, &a, out, 0, splits);
                    }
                };
                /* One graph of the layers' launches, as the engine's decode graph
                 * runs them: the host's launch cost stays out of the figure. */
                cudaGraph_t graph;
                cudaGraphExec_t exec = NULL;
                BENCH_CK(cudaStreamBeginCapture(lc.stream, cudaStreamCaptureModeThreadLocal));
                run();
                BENCH_CK(cudaStreamEndCapture(lc.stream, &graph));
                if (!rc)
                    BENCH_CK(cudaGraphInstantiate(&exec, graph, 0));
                const double ms =
                    rc ? 0.0 : bench_ms(lc.stream, reps, [&]() { BENCH_CK(cudaGraphLaunch(exec, lc.stream)); }) / layers;
                if (exec)
                    cudaGraphExecDestroy(exec);
                cudaGraphDestroy(graph);
                if (rc) {
                    printf("%-5s %-9s %6d  failed: %s\n", kv_name(t), variants[v], splits, lc.err);
                    continue;
                }
                printf("%-5s %-9s %6d %10.1f %10.0f\n", kv_name(t), variants[v], splits,
                       ms * 1e3, bytes / (ms * 1e-3) / 1e9);
            }
        }
        lc.fast[K_OP_ATTN_CLUSTER] = has_cluster;
    }
    return 0;
}
