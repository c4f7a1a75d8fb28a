/* kv.c: writing rows into the KV cache in its type (quantizing INT8 and FP8
 * rows as they arrive) and the reference reader of one row. */
#include <math.h>
#include <omp.h>

#include "../kernels.h"
#include "dtype.h"
#include "kv.h"

size_t k_kv_elem_size(k_kv_type t)
{
    switch (t) {
    case K_KV_F32: return 4;
    case K_KV_F16:
    case K_KV_BF16: return 2;
    case K_KV_INT8:
    case K_KV_FP8: return 1;
    }
    return 0;
}

/* Largest |x[i]| of a row; a NaN is passed over (fmaxf keeps the other). */
static float row_amax(const float *x, int n)
{
    float m = 0.0f;
    for (int i = 0; i < n; i++)
        m = fmaxf(m, fabsf(x[i]));
    return m;
}

/* x / scale to nearest even, clamped to [-127, 127]; a NaN is 0 (as CUDA's float-to-int conversion gives). */
static int8_t int8_code(float x, float scale)
{
    const float y = x / scale;
    if (!(y == y))
        return 0;
    const float r = __builtin_nearbyintf(y);
    return (int8_t)(r > 127.0f ? 127 : r < -127.0f ? -127 : (int)r);
}

/* Row `row` of the cache from x[hd]. */
static void store_row(const k_kv *kv, size_t row, const float *x, int hd)
{
    const size_t e = row * (size_t)hd;
    switch (kv->type) {
    case K_KV_F32:
        memcpy((float *)kv->data + e, x, (size_t)hd * sizeof *x);
        return;
    case K_KV_F16: {
        uint16_t *d = (uint16_t *)kv->data + e;
        for (int i = 0; i < hd; i++)
            d[i] = f32_to_f16(x[i]);
        return;
    }
    case K_KV_BF16: {
        uint16_t *d = (uint16_t *)kv->data + e;
        for (int i = 0; i < hd; i++)
            d[i] = f32_to_bf16(x[i]);
        return;
    }
    case K_KV_INT8:
    case K_KV_FP8: {
        const int fp8 = kv->type == K_KV_FP8;
        /* Dividing by the scale (not multiplying by its inverse) is what the
         * layout specifies, so both backends round alike. */
        const float scale = row_amax(x, hd) / (fp8 ? 448.0f : 127.0f);
        kv->scales[row] = scale;
        uint8_t *d = (uint8_t *)kv->data + e;
        if (scale == 0.0f) {
            /* All zeros, or an amax so small its scale underflows: x / 0 would be NaN. */
            memset(d, 0, (size_t)hd);
            return;
        }
        for (int i = 0; i < hd; i++)
            d[i] = fp8 ? f32_to_fp8_e4m3(x[i] / scale) : (uint8_t)int8_code(x[i], scale);
        return;
    }
    }
}

void k_kv_store(const k_ctx *c, const k_kv *kv, const float *x, int n, int pos0, int n_kv_heads, int head_dim)
{
    const int rows = n * n_kv_heads;
#pragma omp parallel for num_threads(c->n_threads) schedule(static) \
    if ((double)rows * head_dim >= K_PARALLEL_MIN_WORK)
    for (int r = 0; r < rows; r++) {
        const int pos = pos0 + r / n_kv_heads, at = kv->ring > 0 ? pos % kv->ring : pos;
        store_row(kv, (size_t)at * n_kv_heads + (size_t)(r % n_kv_heads), x + (size_t)r * head_dim, head_dim);
    }
}

void k_kv_load(const k_kv *kv, size_t row, int head_dim, float *out)
{
    kv_decode(kv, row * (size_t)head_dim, head_dim, out);
    if (k_kv_has_scales(kv->type)) {
        const float s = kv->scales[row];
        for (int i = 0; i < head_dim; i++)
            out[i] *= s;
    }
}
