/*
 * dlayers.cu: the persistent decode kernel (kernels/cuda/decode_layers.cu)
 * alone, on random 4-bit layers of a real model's shape: its time for all
 * layers of one token against the HBM bound for their bytes, and with
 * --trace where each op's time goes (from %globaltimer stamps the kernel
 * leaves per layer, op and block: entered, input ready, staged, done).
 *
 *   dlayers [--shape 1b|8b] [--pos N] [--reps N] [--trace] [--bw GB/s]
 *   (defaults 8b, position 576, 20 repetitions, bound 3,076 GB/s: the
 *   H100's; give the device's own gpubw figure)
 */
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "../kernels/kernels_cuda.h"
#include "../quant/quant.h"
#include "bench_cuda.cuh"


/* Random bytes (hash of the index), or values lo + (hi - lo) * u of type T. */
__global__ void k_fill_bytes(unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        p[i] = (unsigned char)h;
    }
}
template <typename T> __global__ void k_fill(T *p, size_t n, float lo, float hi, unsigned seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        h ^= h >> 16;
        h *= 2246822519u;
        h ^= h >> 13;
        p[i] = (T)(lo + (hi - lo) * (h & 0xffffff) / 16777216.0f);
    }
}

struct shape {
    const char *name;
    int dim, nh, nkv, hd, ffn, layers;
};

int main(int argc, char **argv)
{
    const shape shapes[] = {{"1b", 2048, 32, 8, 64, 8192, 16}, {"8b", 4096, 32, 8, 128, 14336, 32}};
    shape s = shapes[1];
    int pos = 576, reps = 20;
    bool trace = false;
    double bw = 3076.0;
    for (int i = 1; i < argc; i++) {
        if (!std::strcmp(argv[i], "--shape") && i + 1 < argc) {
            const char *n = argv[++i];
            s = !std::strcmp(n, "1b") ? shapes[0] : !std::strcmp(n, "8b") ? shapes[1] : shape{nullptr, 0, 0, 0, 0, 0, 0};
            if (!s.name) {
                std::fprintf(stderr, "dlayers: unknown shape %s (1b or 8b)\n", n);
                return 2;
            }
        } else if (!std::strcmp(argv[i], "--pos") && i + 1 < argc) {
            pos = std::atoi(argv[++i]);
        } else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = std::atoi(argv[++i]);
        } else if (!std::strcmp(argv[i], "--bw") && i + 1 < argc) {
            bw = std::atof(argv[++i]);
        } else if (!std::strcmp(argv[i], "--trace")) {
            trace = true;
        } else {
            std::fprintf(stderr, "usage: dlayers [--shape 1b|8b] [--pos N] [--reps N] [--trace] [--bw GB/s]\n");
            return 2;
        }
    }
    if (pos < 0 || reps < 1 || bw <= 0) {
        std::fprintf(stderr, "dlayers: --pos, --reps and --bw must be positive\n");
        return 2;
    }
    const int L = s.layers, qd = s.nh * s.hd, kvd = s.nkv * s.hd, ctx = pos + 1, group = Q_NF4_BLOCK;
    const size_t mat[4][2] = {{(size_t)qd + 2 * kvd, (size_t)s.dim}, {(size_t)s.dim, (size_t)qd},
                              {2 * (size_t)s.ffn, (size_t)s.dim}, {(size_t)s.dim, (size_t)s.ffn}};
    launch_ctx lc;
    std::memset(&lc, 0, sizeof lc);
    BENCH_CK(cudaStreamCreateWithFlags(&lc.stream, cudaStreamNonBlocking));
    BENCH_CK(cudaDeviceGetAttribute(&lc.n_sms, cudaDevAttrMultiProcessorCount, 0));
    cudaDeviceProp prop;
    BENCH_CK(cudaGetDeviceProperties(&prop, 0));

    std::vector<decode_layer_w> tab(L);
    size_t bytes = 0; /* weights and absmax a token reads */
    unsigned seed = 1;
    auto fill_bytes = [&](void *p, size_t n) { k_fill_bytes<<<1024, 256>>>(static_cast<unsigned char *>(p), n, seed++); };
    for (int l = 0; l < L; l++) {
        void *w[4];
        float *am[4];
        for (int k = 0; k < 4; k++) {
            const size_t n = mat[k][0] * mat[k][1];
            BENCH_CK(cudaMalloc(&w[k], n / 2));
            BENCH_CK(cudaMalloc(&am[k], n / group * sizeof(float)));
            fill_bytes(w[k], n / 2);
            k_fill<float><<<1024, 256>>>(am[k], n / group, 0.005f, 0.02f, seed++);
            bytes += n / 2 + n / group * sizeof(float);
        }
        float *norm[2];
        for (int k = 0; k < 2; k++) {
            BENCH_CK(cudaMalloc(&norm[k], s.dim * sizeof(float)));
            k_fill<float><<<64, 256>>>(norm[k], s.dim, 0.8f, 1.2f, seed++);
        }
        __half *cache[2];
        for (int k = 0; k < 2; k++) {
            BENCH_CK(cudaMalloc(&cache[k], (size_t)ctx * kvd * sizeof(__half)));
            k_fill<__half><<<1024, 256>>>(cache[k], (size_t)ctx * kvd, -1.0f, 1.0f, seed++);
        }
        tab[l] = decode_layer_w{w[0], w[1], w[2], w[3], am[0], am[1], am[2], am[3], norm[0], norm[1], cache[0], cache[1]};
    }
    BENCH_CK(cudaGetLastError());
    decode_layers_args a = {};
    void *p;
    auto dev = [&](size_t n) {
        BENCH_CK(cudaMalloc(&p, n));
        BENCH_CK(cudaMemset(p, 0, n));
        return p;
    };
    a.layers = static_cast<decode_layer_w *>(dev(L * sizeof(decode_layer_w)));
    BENCH_CK(cudaMemcpy((void *)a.layers, tab.data(), L * sizeof(decode_layer_w), cudaMemcpyHostToDevice));
    a.n_layers = L, a.dim = s.dim, a.n_heads = s.nh, a.n_kv_heads = s.nkv, a.head_dim = s.hd, a.ffn_dim = s.ffn;
    a.n_ctx = ctx, a.group = group, a.eps = 1e-5f;
    a.code = static_cast<float *>(dev(16 * sizeof(float)));
    BENCH_CK(cudaMemcpy((void *)a.code, q_nf4_code, 16 * sizeof(float), cudaMemcpyHostToDevice));
    const int half = s.hd / 2;
    std::vector<float> cs((size_t)ctx * half), sn((size_t)ctx * half);
    for (int q = 0; q < ctx; q++)
        for (int i = 0; i < half; i++) {
            const double ang = q * std::pow(500000.0, -2.0 * i / s.hd);
            cs[(size_t)q * half + i] = (float)std::cos(ang);
            sn[(size_t)q * half + i] = (float)std::sin(ang);
        }
    a.cos = static_cast<float *>(dev(cs.size() * sizeof(float)));
    a.sin = static_cast<float *>(dev(sn.size() * sizeof(float)));
    BENCH_CK(cudaMemcpy((void *)a.cos, cs.data(), cs.size() * sizeof(float), cudaMemcpyHostToDevice));
    BENCH_CK(cudaMemcpy((void *)a.sin, sn.data(), sn.size() * sizeof(float), cudaMemcpyHostToDevice));
    a.pos = static_cast<int *>(dev(sizeof(int)));
    BENCH_CK(cudaMemcpy((void *)a.pos, &pos, sizeof pos, cudaMemcpyHostToDevice));
    std::vector<float> x0(s.dim);
    for (int i = 0; i < s.dim; i++)
        x0[i] = (float)((i * 7919 % 2001) / 1000.0 - 1.0);
    a.x = static_cast<float *>(dev(s.dim * sizeof(float)));
    a.qkv = static_cast<float *>(dev(((size_t)qd + 2 * kvd) * sizeof(float)));
    a.att = static_cast<float *>(dev((size_t)qd * sizeof(float)));
    a.gu = static_cast<float *>(dev((size_t)s.ffn * sizeof(float)));
    a.part = static_cast<float *>(dev(decode_layers_part_floats(&lc, s.nh, s.nkv, s.hd) * sizeof(float)));
    a.sync = static_cast<unsigned *>(dev(decode_layers_sync_words(L, s.nkv) * sizeof(unsigned)));
    if (!decode_layers_supported(&lc, &a)) {
        std::fprintf(stderr, "dlayers: %s\n", lc.err);
        return 1;
    }

    /* Each run from the same input (a device-to-device copy of 16 KB, timed with it). */
    float *x0d = static_cast<float *>(dev(s.dim * sizeof(float)));
    BENCH_CK(cudaMemcpy(x0d, x0.data(), s.dim * sizeof(float), cudaMemcpyHostToDevice));
    auto step = [&] {
        BENCH_CK(cudaMemcpyAsync(a.x, x0d, s.dim * sizeof(float), cudaMemcpyDeviceToDevice, lc.stream));
        if (launch_decode_layers(&lc, &a) != 0) {
            std::fprintf(stderr, "dlayers: %s\n", lc.err);
            std::exit(1);
        }
    };
    const double med = bench_ms(lc.stream, reps, step) * 1e-3, floor_s = bytes / (bw * 1e9);
    std::printf("dlayers: %s, %d SMs; %s shape, %d layers, position %d: %.1f µs a token (median of %d), "
                "%.0f MB of weights and absmax: %.0f GB/s, %.2f of the %.0f GB/s bound (%.1f µs)\n",
                prop.name, lc.n_sms, s.name, L, pos, med * 1e6, reps, bytes / 1e6, bytes / med / 1e9, floor_s / med,
                bw, floor_s * 1e6);
    if (trace) {
        const int G = lc.n_sms;
        const size_t n = (size_t)L * 5 * G * 4;
        std::vector<unsigned long long> h(n);
        a.trace = static_cast<unsigned long long *>(dev(n * sizeof(unsigned long long)));
        step();
        BENCH_CK(cudaStreamSynchronize(lc.stream));
        BENCH_CK(cudaMemcpy(h.data(), a.trace, n * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
        const char *names[5] = {"q/k/v", "attention", "o", "gate/up", "down"};
        /* per op: medians over layers of (median, max over blocks) of each stamp after the previous op's last
         * block was done */
        std::printf("trace: µs after the previous op's last block was done (medians over layers; block median / "
                    "block max)\n%-10s %14s %14s %14s %14s\n",
                    "op", "entered", "input ready", "staged", "done");
        for (int op = 0; op < 5; op++) {
            std::vector<double> stat[4][2];
            for (int l = 0; l < L; l++) {
                if (l == 0 && op == 0)
                    continue;
                const int pl = op == 0 ? l - 1 : l, pop = op == 0 ? 4 : op - 1;
                unsigned long long t0 = 0;
                for (int b = 0; b < G; b++)
                    t0 = std::max(t0, h[(((size_t)pl * 5 + pop) * G + b) * 4 + 3]);
                for (int k = 0; k < 4; k++) {
                    std::vector<double> v;
                    for (int b = 0; b < G; b++) {
                        const unsigned long long t = h[(((size_t)l * 5 + op) * G + b) * 4 + k];
                        if (t)
                            v.push_back(((double)t - (double)t0) * 1e-3);
                    }
                    if (v.empty())
                        continue;
                    std::sort(v.begin(), v.end());
                    stat[k][0].push_back(v[v.size() / 2]);
                    stat[k][1].push_back(v.back());
                }
            }
            std::printf("%-10s", names[op]);
            for (int k = 0; k < 4; k++) {
                for (int j = 0; j < 2; j++)
                    std::sort(stat[k][j].begin(), stat[k][j].end());
                if (stat[k][0].empty())
                    std::printf(" %14s", "-");
                else
                    std::printf(" %6.2f /%6.2f", stat[k][0][stat[k][0].size() / 2], stat[k][1][stat[k][1].size() / 2]);
            }
            std::printf("\n");
        }
    }
    return 0;
}
