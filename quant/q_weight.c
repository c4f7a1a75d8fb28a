/*
 * q_weight.c: whole weights. Turns a dense k_weight (a view into a
 * checkpoint) into a quantized one whose arrays live in one allocation,
 * and measures what the quantization cost.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quant.h"

#define ALIGN 64

const char *q_spec_name(const q_spec *s)
{
    switch (s->type) {
    case K_I8: return s->group > 0 ? "int8-g128" : "int8";
    case K_NF4: return s->double_quant ? "nf4-dq" : "nf4";
    case K_FP4: return s->double_quant ? "fp4-dq" : "fp4";
    default: return "none";
    }
}

static size_t take(size_t *off, size_t n)
{
    const size_t at = (*off + ALIGN - 1) & ~(size_t)(ALIGN - 1);
    *off = at + n;
    return at;
}

void q_weight_free(q_weight *q)
{
    if (!q)
        return;
    free(q->mem);
    memset(q, 0, sizeof *q);
}

engine_status q_quantize_weight(const k_weight *src, const q_spec *spec, int n_threads, q_weight *out,
                                const char *name, err_buf *e)
{
    memset(out, 0, sizeof *out);
    if (k_dtype_is_quant(src->dtype))
        return err_set(e, ENGINE_ERR_INVALID_ARG, "%s: already quantized", name);
    if (spec->type != K_I8 && spec->type != K_NF4 && spec->type != K_FP4)
        return err_set(e, ENGINE_ERR_INVALID_ARG, "%s: unknown quantization type %d", name, (int)spec->type);
    const int rows = src->rows, cols = src->cols;
    const size_t n = (size_t)rows * cols;
    float *f = malloc(n * sizeof *f);
    if (!f)
        return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "%s: out of memory converting %zu values", name, n);
#pragma omp parallel for num_threads(n_threads) schedule(static) if (n >= 65536)
    for (int r = 0; r < rows; r++)
        k_dequant_row(src, r, 0, cols, f + (size_t)r * cols);
    /* A scale computed from inf or NaN would poison its whole group or block. */
    size_t bad = n;
    for (size_t i = 0; i < n && bad == n; i++)
        if (!isfinite(f[i]))
            bad = i;
    if (bad < n) {
        const char *what = isnan(f[bad]) ? "NaN" : "infinite";
        free(f);
        return err_set(e, ENGINE_ERR_FORMAT, "%s: element %zu is %s; cannot quantize", name, bad, what);
    }

    k_weight *w = &out->w;
    w->dtype = spec->type;
    w->rows = rows;
    w->cols = cols;
    size_t off = 0, o_data, o_scales = 0, o_code = 0, o_aq = 0, o_acode = 0, o_ascale = 0;
    size_t nb = 0, nn = 0;
    if (spec->type == K_I8) {
        w->group = spec->group > 0 && spec->group < cols ? spec->group : cols;
        o_data = take(&off, n);
        o_scales = take(&off, (size_t)rows * q_int8_n_groups(cols, spec->group) * sizeof(float));
    } else {
        nb = (n + Q_NF4_BLOCK - 1) / Q_NF4_BLOCK;
        nn = (nb + Q_NESTED_BLOCK - 1) / Q_NESTED_BLOCK;
        w->block = Q_NF4_BLOCK;
        o_data = take(&off, (n + 1) / 2);
        o_scales = take(&off, nb * sizeof(float)); /* the absmax, before nesting */
        o_code = take(&off, 16 * sizeof(float));
        if (spec->double_quant) {
            o_aq = take(&off, nb);
            o_acode = take(&off, 256 * sizeof(float));
            o_ascale = take(&off, nn * sizeof(float));
        }
    }
    char *mem = aligned_alloc(ALIGN, (off + ALIGN - 1) & ~(size_t)(ALIGN - 1));
    if (!mem) {
        free(f);
        return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "%s: out of memory for %zu bytes of quantized weight", name,
                       off);
    }
    out->mem = mem;
    out->bytes = off;
    w->data = mem + o_data;
    if (spec->type == K_I8) {
        float *scales = (float *)(mem + o_scales);
        q_int8_quantize(f, rows, cols, spec->group, (int8_t *)(mem + o_data), scales, n_threads);
        w->scales = scales;
    } else {
        float *absmax = (float *)(mem + o_scales), *code = (float *)(mem + o_code);
        memcpy(code, spec->type == K_FP4 ? q_fp4_code : q_nf4_code, 16 * sizeof *code);
        w->code = code;
        q_4bit_quantize(spec->type, f, n, Q_NF4_BLOCK, (uint8_t *)(mem + o_data), absmax, n_threads);
        if (spec->double_quant) {
            float *acode = (float *)(mem + o_acode), *ascale = (float *)(mem + o_ascale);
            q_dynamic_map(acode);
            q_nested_quantize(acode, absmax, nb, (uint8_t *)(mem + o_aq), ascale, &w->absmax_offset);
            w->absmax_q = (const uint8_t *)(mem + o_aq);
            w->absmax_code = acode;
            w->absmax_scale = ascale;
            w->absmax_block = Q_NESTED_BLOCK;
            /* The fp32 absmax stays in the block unused; keeping one layout
             * is simpler than a second pass, and it is 1/16 of the codes. */
        } else {
            w->absmax = absmax;
        }
    }
    free(f);
    return ENGINE_OK;
}

void q_measure_error(const k_weight *src, const k_weight *quant, int n_threads, q_error *out)
{
    const int rows = src->rows, cols = src->cols;
    double s_ref = 0.0, s_err = 0.0, mx = 0.0;
#pragma omp parallel num_threads(n_threads) if ((size_t)rows * cols >= 65536)
    {
        float a[256], b[256];
        double l_ref = 0.0, l_err = 0.0, l_mx = 0.0;
#pragma omp for schedule(static)
        for (int r = 0; r < rows; r++)
            for (int c0 = 0; c0 < cols; c0 += 256) {
                const int len = cols - c0 < 256 ? cols - c0 : 256;
                k_dequant_row(src, r, c0, len, a);
                k_dequant_row(quant, r, c0, len, b);
                for (int i = 0; i < len; i++) {
                    const double d = (double)b[i] - a[i];
                    l_ref += (double)a[i] * a[i];
                    l_err += d * d;
                    l_mx = fmax(l_mx, fabs(d));
                }
            }
#pragma omp critical
        {
            s_ref += l_ref;
            s_err += l_err;
            mx = fmax(mx, l_mx);
        }
    }
    const double n = (double)rows * cols;
    out->rms_ref = n > 0 ? sqrt(s_ref / n) : 0.0;
    out->rms_err = n > 0 ? sqrt(s_err / n) : 0.0;
    out->max_err = mx;
}
