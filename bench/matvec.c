/*
 * matvec.c: the CPU's one-token 4-bit row product (k_matvec_rows, what the
 * host experts of a mixture-of-experts layer run) in GB/s of weights, for
 * each vector set this CPU has (k_cpu_isa_cap: AVX-512, AVX2, portable):
 * one matrix of ROWS x COLS in nf4 with double quantization read again and
 * again on one thread (from cache), then MATS of them read once each on 1
 * to THREADS threads in items of 16 rows, as forward_moe.c splits them
 * (from memory). The default is a Qwen3-30B-A3B expert's gate/up.
 *
 *   matvec [ROWS COLS [MATS [THREADS]]]   (default 1536 2048 96 2)
 */
#define _POSIX_C_SOURCE 200809L
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kernels/kernels.h"
#include "quant/quant.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    const int rows = argc > 2 ? atoi(argv[1]) : 1536, cols = argc > 2 ? atoi(argv[2]) : 2048;
    const int mats = argc > 3 ? atoi(argv[3]) : 96, threads = argc > 4 ? atoi(argv[4]) : 2;
    if (rows <= 0 || cols <= 0 || cols % 64 || mats <= 0 || threads <= 0) {
        fprintf(stderr, "usage: matvec [ROWS COLS [MATS [THREADS]]] (COLS a multiple of 64)\n");
        return 2;
    }
    const size_t n = (size_t)rows * cols;
    float *v = malloc(n * sizeof *v), *x = malloc((size_t)cols * sizeof *x);
    float *y = malloc((size_t)rows * mats * sizeof *y);
    q_weight *q = calloc((size_t)mats, sizeof *q);
    if (!v || !x || !y || !q) {
        fprintf(stderr, "matvec: out of memory\n");
        return 1;
    }
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < cols; i++)
        x[i] = (float)((s = s * 6364136223846793005ull + 1) >> 40) / 16777216.0f - 0.5f;
    const q_spec sp = {K_NF4, 0, true};
    for (int m = 0; m < mats; m++) {
        for (size_t i = 0; i < n; i++)
            v[i] = ((float)((s = s * 6364136223846793005ull + 1) >> 40) / 16777216.0f - 0.5f) * 0.04f;
        const k_weight src = {v, K_F32, rows, cols};
        err_buf e;
        if (q_quantize_weight(&src, &sp, threads, &q[m], "w", &e) != ENGINE_OK) {
            fprintf(stderr, "matvec: %s\n", e.msg);
            return 1;
        }
    }
    const double one = (double)k_weight_bytes(&q[0].w), items = rows / 16;
    static const char *const names[] = {"portable", "AVX2", "AVX-512"};
    for (int cap = 2; cap >= 0; cap--) {
        k_cpu_isa_cap(cap);
        double best = 1e30;
        for (int rep = 0; rep < 5; rep++) {
            const double t0 = now();
            for (int it = 0; it < 10; it++)
                k_matvec_rows(&q[0].w, 0, rows, x, y);
            const double dt = (now() - t0) / 10;
            best = dt < best ? dt : best;
        }
        /* A set this CPU lacks falls back to the next narrower one. */
        printf("up to %-8s one thread, from cache: %6.2f GB/s", names[cap], one / best / 1e9);
        for (int th = 1; th <= threads; th++) {
            double t = 1e30;
            for (int rep = 0; rep < 3; rep++) {
                const double t0 = now();
#pragma omp parallel for num_threads(th) schedule(static)
                for (int it = 0; it < mats * (int)items; it++) {
                    const int m = it / (int)items, r0 = it % (int)items * 16;
                    k_matvec_rows(&q[m].w, r0, r0 + 16, x, y + (size_t)m * rows + r0);
                }
                const double dt = now() - t0;
                t = dt < t ? dt : t;
            }
            printf(" | %d thread%s, from memory (%.0f MB): %6.2f GB/s", th, th > 1 ? "s" : "", one * mats / 1e6,
                   one * mats / t / 1e9);
        }
        putchar('\n');
    }
    for (int m = 0; m < mats; m++)
        q_weight_free(&q[m]);
    free(v), free(x), free(y), free(q);
    return 0;
}
