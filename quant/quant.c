/*
 * quant.c: reference quantization and dequantization of the INT8 and
 * 4-bit (NF4/FP4, bitsandbytes) formats, and whole-weight quantization.
 *
 * The 4-bit and 8-bit blockwise paths follow bitsandbytes' CUDA kernels
 * step for step where rounding is concerned (scale by the fp32 reciprocal
 * of the block absmax, the same strict comparisons against the same fp32
 * thresholds, code * absmax then + offset as two separate roundings), so
 * their output is bit-identical; CMake builds this file with
 * -ffp-contract=off to keep the compiler from fusing those steps.
 */
#include "quant.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

const float q_nf4_code[16] = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f, -0.28444138169288635f,
    -0.18477343022823334f, -0.09105003625154495f, 0.0f, 0.07958029955625534f, 0.16093020141124725f,
    0.24611230194568634f, 0.33791524171829224f, 0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f,
    1.0f,
};

/* bitsandbytes lists the FP4 magnitudes (sign in bit 3) and divides by the
 * largest, 12, in fp32; the divisions below round the same way. */
const float q_fp4_code[16] = {
    0.0f / 12.0f,  0.0625f / 12.0f,  8.0f / 12.0f,  12.0f / 12.0f,  4.0f / 12.0f,  6.0f / 12.0f,
    2.0f / 12.0f,  3.0f / 12.0f,     -0.0f / 12.0f, -0.0625f / 12.0f, -8.0f / 12.0f, -12.0f / 12.0f,
    -4.0f / 12.0f, -6.0f / 12.0f,    -2.0f / 12.0f, -3.0f / 12.0f,
};

/*
 * torch.linspace(start, end, steps) in fp32 as it computes it: the first
 * half counts up from start, the second half down from end, each value one
 * fused multiply-add (with separate roundings 42 of the 256 dynamic-map
 * entries came out an ulp off bitsandbytes' own map).
 */
static void linspace_f32(float start, float end, int steps, float *out)
{
    const float step = (end - start) / (float)(steps - 1);
    const int half = steps / 2;
    for (int i = 0; i < steps; i++)
        out[i] = i < half ? fmaf(step, (float)i, start) : fmaf(-step, (float)(steps - i - 1), end);
}

static int cmp_float(const void *a, const void *b)
{
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

void q_dynamic_map(float code[256])
{
    /* Signed, 7 exponent bits, 8 bits in all: for exponent i the fraction
     * has 2^i steps, the means of linspace(0.1, 1, 2^i + 1) scaled by
     * 10^(i - 6), with both signs; then 0 and 1. 2 * 127 + 2 = 256 values. */
    int n = 0;
    float bounds[65];
    for (int i = 0; i < 7; i++) {
        const int items = (1 << i) + 1;
        linspace_f32(0.1f, 1.0f, items, bounds);
        const float scale = (float)pow(10.0, (double)(i - 6));
        for (int k = 0; k + 1 < items; k++) {
            const float mean = (bounds[k] + bounds[k + 1]) / 2.0f;
            code[n++] = scale * mean;
            code[n++] = -scale * mean;
        }
    }
    code[n++] = 0.0f;
    code[n++] = 1.0f;
    qsort(code, 256, sizeof *code, cmp_float);
}

uint8_t q_nf4_encode(float x)
{
    /* The midpoints between neighbouring codes, as bitsandbytes' decision
     * tree has them; NaN (an all-zero block scaled by 1/0) falls to 0. */
    if (x > 0.03979014977812767f) {
        if (x > 0.3893125355243683f) {
            if (x > 0.6427869200706482f)
                return x > 0.8614784181118011f ? 15 : 14;
            return x > 0.5016634166240692f ? 13 : 12;
        }
        if (x > 0.2035212516784668f)
            return x > 0.2920137718319893f ? 11 : 10;
        return x > 0.1202552504837513f ? 9 : 8;
    }
    if (x > -0.33967943489551544f) {
        if (x > -0.13791173323988914f)
            return x > -0.045525018125772476f ? 7 : 6;
        return x > -0.23460740596055984f ? 5 : 4;
    }
    if (x > -0.6106329262256622f)
        return x > -0.4599952697753906f ? 3 : 2;
    return x > -0.8480964004993439f ? 1 : 0;
}

uint8_t q_fp4_encode(float x)
{
    const uint8_t sign = x < 0 ? 8 : 0;
    x = fabsf(x);
    uint8_t m;
    if (x > 0.29166667f) {
        if (x > 0.583333f)
            m = x > 0.8333333f ? 3 : 2;
        else
            m = x > 0.4166667f ? 5 : 4;
    } else if (x > 0.0859375f) {
        m = x > 0.20833333f ? 7 : 6;
    } else {
        m = x > 0.00260417f ? 1 : 0;
    }
    return (uint8_t)(m + sign);
}

static float block_absmax(const float *x, size_t n)
{
    float m = 0.0f;
    for (size_t i = 0; i < n; i++)
        m = fmaxf(m, fabsf(x[i]));
    return m;
}

void q_4bit_quantize(k_dtype type, const float *x, size_t n, int block, uint8_t *packed, float *absmax,
                     int n_threads)
{
    const size_t nb = (n + block - 1) / block;
    uint8_t (*enc)(float) = type == K_FP4 ? q_fp4_encode : q_nf4_encode;
#pragma omp parallel for num_threads(n_threads) schedule(static) if (n >= 65536)
    for (size_t b = 0; b < nb; b++) {
        const size_t i0 = b * block, len = n - i0 < (size_t)block ? n - i0 : (size_t)block;
        const float am = block_absmax(x + i0, len);
        absmax[b] = am;
        const float inv = 1.0f / am; /* bitsandbytes multiplies by the reciprocal */
        /* block is even, so a block starts on a byte; a short last block is
         * padded with 0 as bitsandbytes' loads pad it. */
        for (size_t j = 0; j < len; j += 2) {
            const float a = x[i0 + j], c = j + 1 < len ? x[i0 + j + 1] : 0.0f;
            packed[(i0 + j) / 2] = (uint8_t)(enc(a * inv) << 4 | enc(c * inv));
        }
    }
}

void q_4bit_dequantize(const float code[16], const uint8_t *packed, const float *absmax, size_t n, int block,
                       float *out, int n_threads)
{
#pragma omp parallel for num_threads(n_threads) schedule(static) if (n >= 65536)
    for (size_t i = 0; i < n; i++) {
        const uint8_t byte = packed[i / 2];
        out[i] = code[(i & 1) ? byte & 15 : byte >> 4] * absmax[i / block];
    }
}

/*
 * bitsandbytes' code search (dQuantize): a 7-step binary search over the
 * sorted table that remembers the entries it passed on either side, then
 * the final pivot against the midpoint towards that neighbour. Bracket
 * ends never visited default to -1 and 1, except at the table's ends.
 */
static uint8_t encode_8bit(const float code[256], float x)
{
    int pivot = 127, upper_p = 255, lower_p = 0;
    float lower = -1.0f, upper = 1.0f, val = code[pivot];
    for (int step = 64; step > 0; step >>= 1) {
        if (x > val) {
            lower_p = pivot;
            lower = val;
            pivot += step;
        } else {
            upper_p = pivot;
            upper = val;
            pivot -= step;
        }
        val = code[pivot];
    }
    if (upper_p == 255)
        upper = code[255];
    if (lower_p == 0)
        lower = code[0];
    if (x > val) {
        const float mid = (upper + val) * 0.5f;
        return (uint8_t)(x > mid ? upper_p : pivot);
    }
    const float mid = (lower + val) * 0.5f;
    return (uint8_t)(x < mid ? lower_p : pivot);
}

void q_8bit_quantize(const float code[256], const float *x, size_t n, int block, uint8_t *q, float *absmax)
{
    const size_t nb = (n + block - 1) / block;
    for (size_t b = 0; b < nb; b++) {
        const size_t i0 = b * block, len = n - i0 < (size_t)block ? n - i0 : (size_t)block;
        const float am = block_absmax(x + i0, len);
        absmax[b] = am;
        const float inv = 1.0f / am;
        for (size_t j = 0; j < len; j++)
            q[i0 + j] = encode_8bit(code, x[i0 + j] * inv);
    }
}

void q_8bit_dequantize(const float code[256], const uint8_t *q, const float *absmax, size_t n, int block,
                       float offset, float *out)
{
    for (size_t i = 0; i < n; i++) {
        const float v = code[q[i]] * absmax[i / block];
        out[i] = v + offset;
    }
}

bool q_nested_stackable(const k_weight *const *parts, int np)
{
    if (np < 1)
        return false;
    const k_weight *p0 = parts[0];
    const int nb = p0->absmax_block;
    if ((p0->dtype != K_NF4 && p0->dtype != K_FP4) || !p0->absmax_q || nb <= 0 || (nb & (nb - 1)))
        return false;
    for (int i = 0; i < np; i++) {
        const k_weight *p = parts[i];
        const uint64_t n = (uint64_t)p->rows * p->cols, blocks = (n + p->block - 1) / p->block;
        if (!p->absmax_q || p->absmax_block != nb || memcmp(p->absmax_code, p0->absmax_code, 256 * sizeof(float)))
            return false;
        if (i + 1 < np && (n % p->block || blocks % nb))
            return false;
    }
    return true;
}

void q_nested_quantize(const float code[256], const float *absmax, size_t nb, uint8_t *aq, float *scale,
                       float *offset)
{
    double sum = 0.0;
    for (size_t i = 0; i < nb; i++)
        sum += absmax[i];
    const float mean = nb ? (float)(sum / (double)nb) : 0.0f;
    float *centred = malloc((nb ? nb : 1) * sizeof *centred);
    if (!centred) {
        /* Callers size nb from a tensor they already hold; a failure here
         * leaves a valid (all-zero codes, zero scale) state rather than garbage. */
        memset(aq, 0, nb);
        memset(scale, 0, (nb + Q_NESTED_BLOCK - 1) / Q_NESTED_BLOCK * sizeof *scale);
        *offset = mean;
        return;
    }
    for (size_t i = 0; i < nb; i++)
        centred[i] = absmax[i] - mean;
    q_8bit_quantize(code, centred, nb, Q_NESTED_BLOCK, aq, scale);
    free(centred);
    *offset = mean;
}

size_t q_int8_n_groups(int cols, int group)
{
    return group > 0 && group < cols ? ((size_t)cols + group - 1) / group : 1;
}

void q_int8_quantize(const float *w, int rows, int cols, int group, int8_t *q, float *scales, int n_threads)
{
    const int g = group > 0 && group < cols ? group : cols;
    const size_t ng = q_int8_n_groups(cols, group);
#pragma omp parallel for num_threads(n_threads) schedule(static) if ((size_t)rows * cols >= 65536)
    for (int r = 0; r < rows; r++) {
        for (size_t k = 0; k < ng; k++) {
            const size_t c0 = k * g, len = (size_t)cols - c0 < (size_t)g ? (size_t)cols - c0 : (size_t)g;
            const float *src = w + (size_t)r * cols + c0;
            const float am = block_absmax(src, len);
            const float s = am / 127.0f;
            scales[(size_t)r * ng + k] = s;
            int8_t *dst = q + (size_t)r * cols + c0;
            for (size_t j = 0; j < len; j++) {
                /* Round to nearest even; |w| <= am keeps |w / s| <= 127 but
                 * for rounding of s itself, hence the clamp. */
                float v = s > 0.0f ? nearbyintf(src[j] / s) : 0.0f;
                v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
                dst[j] = (int8_t)v;
            }
        }
    }
}

void q_int8_dequantize(const int8_t *q, const float *scales, int rows, int cols, int group, float *out,
                       int n_threads)
{
    const int g = group > 0 && group < cols ? group : cols;
    const size_t ng = q_int8_n_groups(cols, group);
#pragma omp parallel for num_threads(n_threads) schedule(static) if ((size_t)rows * cols >= 65536)
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            out[(size_t)r * cols + c] = (float)q[(size_t)r * cols + c] * scales[(size_t)r * ng + c / g];
}
