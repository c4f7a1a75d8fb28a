/*
 * mkcheckpoint_nf4.c: bitsandbytes NF4 with double quantization, for
 * mkcheckpoint --quant nf4-dq, as docs/FORMATS.md specifies it (the same
 * thresholds, fp32 reciprocal scaling, dynamic map and code search as
 * quant/quant.c, written again here so that the benchmark input stays
 * independent of the engine it measures; test_mkcheckpoint_cli checks the
 * two give the same checkpoint). Built without FMA contraction, as quant/ is.
 */
#include "mkcheckpoint_nf4.h"

#include <math.h>
#include <stdlib.h>

/* bitsandbytes' NF4 code table and the decision tree's fp32 midpoints (docs/FORMATS.md). */
const float NF4_CODE[16] = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f, -0.28444138169288635f,
    -0.18477343022823334f, -0.09105003625154495f, 0.0f, 0.07958029955625534f, 0.16093020141124725f,
    0.24611230194568634f, 0.33791524171829224f, 0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f,
    1.0f,
};
static const float NF4_MID[15] = {
    -0.8480964004993439f, -0.6106329262256622f, -0.4599952697753906f, -0.33967943489551544f,
    -0.23460740596055984f, -0.13791173323988914f, -0.045525018125772476f, 0.03979014977812767f,
    0.1202552504837513f, 0.2035212516784668f, 0.2920137718319893f, 0.3893125355243683f,
    0.5016634166240692f, 0.6427869200706482f, 0.8614784181118011f,
};

/* The largest k with x > NF4_MID[k - 1] (a tie takes the lower code; NaN 0). */
static uint8_t nf4_encode(float x)
{
    uint8_t k = 0;
    while (k < 15 && x > NF4_MID[k])
        k++;
    return k;
}

static int cmp_f32(const void *a, const void *b)
{
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* bitsandbytes' signed dynamic map: torch.linspace's fp32 steps (counting up
 * from the start for the first half, down from the end for the second, each a
 * fused multiply-add), the means of neighbours times 10^(i-6), both signs, 0, 1. */
static void dynamic_map(float map[256])
{
    int n = 0;
    for (int i = 0; i < 7; i++) {
        const int steps = (1 << i) + 1, half = steps / 2;
        const float step = (1.0f - 0.1f) / (float)(steps - 1), scale = (float)pow(10.0, (double)(i - 6));
        float b[65];
        for (int k = 0; k < steps; k++)
            b[k] = k < half ? fmaf(step, (float)k, 0.1f) : fmaf(-step, (float)(steps - k - 1), 1.0f);
        for (int k = 0; k + 1 < steps; k++) {
            const float mean = (b[k] + b[k + 1]) / 2.0f;
            map[n++] = scale * mean;
            map[n++] = -scale * mean;
        }
    }
    map[n++] = 0.0f;
    map[n++] = 1.0f;
    qsort(map, 256, sizeof *map, cmp_f32);
}

/* bitsandbytes' 8-bit code search (dQuantize), fp32 throughout. */
static uint8_t encode_8bit(const float map[256], float x)
{
    int pivot = 127, hi_i = 255, lo_i = 0;
    float lo = -1.0f, hi = 1.0f, val = map[pivot];
    for (int step = 64; step > 0; step >>= 1) {
        if (x > val)
            lo_i = pivot, lo = val, pivot += step;
        else
            hi_i = pivot, hi = val, pivot -= step;
        val = map[pivot];
    }
    if (hi_i == 255)
        hi = map[255];
    if (lo_i == 0)
        lo = map[0];
    if (x > val)
        return (uint8_t)(x > (hi + val) * 0.5f ? hi_i : pivot);
    return (uint8_t)(x < (lo + val) * 0.5f ? lo_i : pivot);
}

void nf4dq_quantize(const float *x, uint64_t n, float *am, uint8_t *packed, uint8_t *absmax_q, float *nested,
                    float map[256], float *offset)
{
    const uint64_t nb = (n + NF4_BLOCK - 1) / NF4_BLOCK, nn = (nb + NESTED_BLOCK - 1) / NESTED_BLOCK;
    /* Blocks are independent; the absmax sum is taken in block order after. */
#pragma omp parallel for schedule(static)
    for (uint64_t b = 0; b < nb; b++) {
        const uint64_t i0 = b * NF4_BLOCK, len = n - i0 < NF4_BLOCK ? n - i0 : NF4_BLOCK;
        float m = 0.0f;
        for (uint64_t j = 0; j < len; j++)
            m = fmaxf(m, fabsf(x[i0 + j]));
        am[b] = m;
        const float inv = 1.0f / m; /* bitsandbytes multiplies by the reciprocal */
        for (uint64_t j = 0; j < len; j += 2) {
            const float a = x[i0 + j], c = j + 1 < len ? x[i0 + j + 1] : 0.0f;
            packed[(i0 + j) / 2] = (uint8_t)(nf4_encode(a * inv) << 4 | nf4_encode(c * inv));
        }
    }
    /* Double quantization: the absmax less their mean (in double, rounded
     * to fp32), 8-bit in blocks of 256 with the dynamic map. */
    double sum = 0.0;
    for (uint64_t b = 0; b < nb; b++)
        sum += am[b];
    *offset = nb ? (float)(sum / (double)nb) : 0.0f;
    dynamic_map(map);
    for (uint64_t b = 0; b < nb; b++)
        am[b] -= *offset;
#pragma omp parallel for schedule(static)
    for (uint64_t k = 0; k < nn; k++) {
        const uint64_t i0 = k * NESTED_BLOCK, len = nb - i0 < NESTED_BLOCK ? nb - i0 : NESTED_BLOCK;
        float m = 0.0f;
        for (uint64_t j = 0; j < len; j++)
            m = fmaxf(m, fabsf(am[i0 + j]));
        nested[k] = m;
        const float inv = 1.0f / m;
        for (uint64_t j = 0; j < len; j++)
            absmax_q[i0 + j] = encode_8bit(map, am[i0 + j] * inv);
    }
}
