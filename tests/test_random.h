/*
 * test_random.h: random inputs for the kernel tests (CPU and CUDA): a
 * seeded generator, values of any weight type with the fp32 value actually
 * stored, and the relative error every kernel check reports.
 */
#ifndef ENGINE_TEST_RANDOM_H
#define ENGINE_TEST_RANDOM_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/dtype.h"
#include "kernels/kernels.h"

static uint64_t test_rng_state = 0x1234567;

static inline double urand(void) /* uniform in [-1, 1) */
{
    test_rng_state = test_rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(test_rng_state >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

static inline void fill(float *x, size_t n, double scale)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(urand() * scale);
}

/* Relative max error of got against ref (scale = max |ref|); NaN is infinite. */
static inline double rel_err(const float *got, const double *ref, size_t n)
{
    double mx = 0.0, scale = 1e-30;
    for (size_t i = 0; i < n; i++)
        scale = fmax(scale, fabs(ref[i]));
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (!(d == d))
            return INFINITY;
        mx = fmax(mx, d);
    }
    return mx / scale;
}

/* A weight of the given dtype with random values (malloc'd); vals gets them as fp32. */
static inline void *make_weight(k_dtype t, size_t n, float *vals, double scale)
{
    fill(vals, n, scale);
    if (t == K_F32) {
        float *w = malloc(n * sizeof *w);
        memcpy(w, vals, n * sizeof *w);
        return w;
    }
    uint16_t *w = malloc(n * sizeof *w);
    for (size_t i = 0; i < n; i++) {
        w[i] = t == K_BF16 ? f32_to_bf16(vals[i]) : f32_to_f16(vals[i]);
        vals[i] = t == K_BF16 ? bf16_to_f32(w[i]) : f16_to_f32(w[i]); /* the value actually stored */
    }
    return w;
}

static inline const char *dtype_name(k_dtype t)
{
    return t == K_BF16 ? "bf16" : t == K_F16 ? "f16" : "f32";
}

#endif
