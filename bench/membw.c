/*
 * membw: the host's read bandwidth, the physical bound of CPU decoding
 * (every weight is read once per token). Sums a 1 GiB buffer with all
 * threads, best of 5 passes.
 *   cc -O3 -march=native -fopenmp bench/membw.c -o membw && ./membw
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int main(void)
{
    const size_t n = (1ull << 30) / sizeof(float);
    float *a = malloc(n * sizeof *a);
    if (!a)
        return 1;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++)
        a[i] = (float)(i & 1023);
    double best = 0.0, sink = 0.0;
    for (int pass = 0; pass < 5; pass++) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        double s = 0.0;
#pragma omp parallel for simd schedule(static) reduction(+ : s)
        for (size_t i = 0; i < n; i++)
            s += a[i];
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double sec = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
        double gbs = n * sizeof *a / sec / 1e9;
        if (gbs > best)
            best = gbs;
        sink += s;
    }
    printf("read bandwidth: %.1f GB/s (%d threads, checksum %g)\n", best, omp_get_max_threads(), sink);
    free(a);
    return 0;
}
