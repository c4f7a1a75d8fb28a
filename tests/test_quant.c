/*
 * test_quant.c: the quantized formats (quant/) and the CPU dequant-matmul.
 *
 * - The NF4 table against its definition (normal quantiles), the encoders
 *   against an exhaustive nearest-code search, the dynamic map's shape.
 * - quantize -> dequantize error bounds per format on fresh random inputs.
 * - k_matmul and k_matvec_rows on quantized weights against the formats' own dequantize and
 *   a float64 product, outputs poisoned with NaN first.
 * - Double quantization round trip.
 * - bitsandbytes' own output on given inputs (tests/data/quant/bnb_4bit.json,
 *   made by tests/fixtures/make_quant_fixtures.py), reproduced bit for bit;
 *   skipped with a message while that file is absent.
 */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quant/quant.h"
#include "test_random.h"
#include "test_util.h"

static void poison(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = NAN;
}

/* Standard normal quantile by bisection on erfc (double precision). */
static double norm_ppf(double p)
{
    double lo = -10.0, hi = 10.0;
    for (int i = 0; i < 200; i++) {
        double mid = 0.5 * (lo + hi);
        if (0.5 * erfc(-mid / sqrt(2.0)) < p)
            lo = mid;
        else
            hi = mid;
    }
    return 0.5 * (lo + hi);
}

static void test_nf4_table(void)
{
    /* QLoRA's definition (bitsandbytes create_normal_map, offset 0.9677083):
     * 8 positive quantiles of linspace(offset, 0.5, 9)[:-1], 7 negative of
     * linspace(offset, 0.5, 8)[:-1], and 0, normalised by the largest. */
    const double off = 0.9677083;
    double v[16];
    int k = 0;
    for (int i = 0; i < 8; i++)
        v[k++] = norm_ppf(off + (0.5 - off) * i / 8.0);
    for (int i = 0; i < 7; i++)
        v[k++] = -norm_ppf(off + (0.5 - off) * i / 7.0);
    v[k++] = 0.0;
    const double mx = v[0];
    for (int i = 0; i < 16; i++)
        v[i] /= mx;
    for (int i = 0; i < 16; i++) /* sort ascending */
        for (int j = i + 1; j < 16; j++)
            if (v[j] < v[i]) {
                double t = v[i];
                v[i] = v[j];
                v[j] = t;
            }
    for (int i = 0; i < 16; i++)
        CHECK_MSG(fabs(v[i] - q_nf4_code[i]) < 2e-6, "nf4 code %d: %.9f, definition gives %.9f", i, q_nf4_code[i],
                  v[i]);

    /* Each encoder picks the nearest code for every value in [-1, 1] (the
     * thresholds are fp32 midpoints, so a tie may go either way by an ulp). */
    int bad_nf4 = 0, bad_fp4 = 0;
    for (int i = -200000; i <= 200000; i++) {
        const float x = (float)i / 200000.0f;
        const float *codes[2] = {q_nf4_code, q_fp4_code};
        const uint8_t got[2] = {q_nf4_encode(x), q_fp4_encode(x)};
        for (int t = 0; t < 2; t++) {
            float best = INFINITY;
            for (int c = 0; c < 16; c++)
                best = fminf(best, fabsf(x - codes[t][c]));
            if (fabsf(x - codes[t][got[t]]) > best + 1e-6f)
                *(t ? &bad_fp4 : &bad_nf4) += 1;
        }
    }
    CHECK_MSG(bad_nf4 == 0, "nf4 encoder missed the nearest code %d times", bad_nf4);
    CHECK_MSG(bad_fp4 == 0, "fp4 encoder missed the nearest code %d times", bad_fp4);
    for (int c = 0; c < 16; c++)
        CHECK_MSG(q_nf4_encode(q_nf4_code[c]) == c, "nf4 code %d does not encode to itself", c);
    CHECK(q_nf4_encode(NAN) == 0); /* an all-zero block: 0 * (1/0) */
    CHECK(q_fp4_code[3] == 1.0f && q_fp4_code[1] == 0.0625f / 12.0f && signbit(q_fp4_code[8]));

    float map[256];
    q_dynamic_map(map);
    int sorted = 1;
    for (int i = 1; i < 256; i++)
        sorted &= map[i] > map[i - 1];
    CHECK_MSG(sorted, "dynamic map is not strictly increasing");
    CHECK(map[255] == 1.0f && map[0] < -0.99f && map[0] > -1.0f);
    CHECK(fabsf(map[127]) < 1e-6f || fabsf(map[128]) < 1e-6f);
}

/* Dequantize a quantized weight with quant/'s own reference functions. */
static void reference_dequant(const k_weight *w, float *out)
{
    const size_t n = (size_t)w->rows * w->cols;
    if (w->dtype == K_I8) {
        q_int8_dequantize(w->data, w->scales, w->rows, w->cols, w->group == w->cols ? 0 : w->group, out, 2);
        return;
    }
    const size_t nb = (n + w->block - 1) / w->block;
    float *am = malloc(nb * sizeof *am);
    if (w->absmax_q)
        q_8bit_dequantize(w->absmax_code, w->absmax_q, w->absmax_scale, nb, w->absmax_block, w->absmax_offset, am);
    else
        memcpy(am, w->absmax, nb * sizeof *am);
    q_4bit_dequantize(w->code, w->data, am, n, w->block, out, 2);
    free(am);
}

static const q_spec SPECS[] = {
    {K_I8, 0, false}, {K_I8, Q_INT8_GROUP, false}, {K_NF4, 0, false}, {K_NF4, 0, true}, {K_FP4, 0, false},
};

static void test_error_bounds(void)
{
    const int shapes[][2] = {{37, 200}, {64, 256}, {5, 333}, {300, 130}};
    for (size_t si = 0; si < sizeof SPECS / sizeof SPECS[0]; si++)
        for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++) {
            const q_spec *sp = &SPECS[si];
            const int rows = shapes[sh][0], cols = shapes[sh][1];
            const size_t n = (size_t)rows * cols;
            float *v = malloc(n * sizeof *v), *d = malloc(n * sizeof *d);
            void *src_data = make_weight(sh % 2 ? K_BF16 : K_F32, n, v, 0.05);
            for (size_t i = 0; i < n; i += 97) /* outliers make blocks differ in scale */
                v[i] *= 8.0f;
            free(src_data);
            k_weight src = {v, K_F32, rows, cols};
            q_weight q;
            err_buf e;
            CHECK(q_quantize_weight(&src, sp, 2, &q, "w", &e) == ENGINE_OK);
            reference_dequant(&q.w, d);
            /* Per element: half the widest gap between neighbouring codes times the
             * block's absmax, plus, with double quant, how far the decoded absmax
             * is from the true one (bounded separately in test_double_quant). */
            const size_t nb = (n + Q_NF4_BLOCK - 1) / Q_NF4_BLOCK;
            float *am_dq = malloc(nb * sizeof *am_dq);
            if (sp->double_quant)
                q_8bit_dequantize(q.w.absmax_code, q.w.absmax_q, q.w.absmax_scale, nb, q.w.absmax_block,
                                  q.w.absmax_offset, am_dq);
            size_t bad = 0;
            for (size_t i = 0; i < n; i++) {
                double bound;
                if (sp->type == K_I8) {
                    const int g = q.w.group, r = (int)(i / cols), c = (int)(i % cols);
                    bound = 0.5 * q.w.scales[(size_t)r * q_int8_n_groups(cols, sp->group) + c / g] * 1.0001;
                } else {
                    const size_t b = i / Q_NF4_BLOCK, b0 = b * Q_NF4_BLOCK;
                    float am = 0.0f;
                    for (size_t j = b0; j < b0 + Q_NF4_BLOCK && j < n; j++)
                        am = fmaxf(am, fabsf(v[j]));
                    /* NF4's widest gap is between -1 and -0.696; FP4's between 8/12 and 1. */
                    const double half_gap = sp->type == K_NF4 ? (1.0 - 0.6961928009986877) / 2 : (4.0 / 12) / 2;
                    bound = half_gap * am * 1.0001;
                    if (sp->double_quant)
                        bound += fabs((double)am_dq[b] - am) * 1.0001;
                }
                bad += !(fabs((double)d[i] - v[i]) <= bound + 1e-12);
            }
            free(am_dq);
            CHECK_MSG(bad == 0, "%s %dx%d: %zu elements beyond the error bound", q_spec_name(sp), rows, cols, bad);
            q_error qe;
            q_measure_error(&src, &q.w, 2, &qe);
            const double want = sp->type == K_I8 ? 0.03 : 0.3; /* relative RMS error, uniform inputs */
            CHECK_MSG(qe.rms_err / qe.rms_ref < want && qe.rms_err > 0, "%s: relative rms error %g", q_spec_name(sp),
                      qe.rms_err / qe.rms_ref);
            q_weight_free(&q);
            free(v);
            free(d);
        }
}

static void test_matmul(void)
{
    const int shapes[][3] = {{1, 37, 200}, {1, 33, 1000}, {3, 64, 256}, {7, 19, 333}, {2, 130, 600}, {65, 9, 64},
                             {1, 40, 2048}, {1, 17, 5120}}; /* 5120: more columns than one rearranged chunk of x */
    for (size_t si = 0; si < sizeof SPECS / sizeof SPECS[0]; si++)
        for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++)
            for (int with_bias = 0; with_bias < 2; with_bias++) {
                const int n = shapes[sh][0], rows = shapes[sh][1], cols = shapes[sh][2];
                float *v = malloc((size_t)rows * cols * sizeof *v), *d = malloc((size_t)rows * cols * sizeof *d);
                float *bias = malloc((size_t)rows * sizeof *bias);
                float *x = malloc((size_t)n * cols * sizeof *x), *y = malloc((size_t)n * rows * sizeof *y);
                double *ref = malloc((size_t)n * rows * sizeof *ref);
                fill(v, (size_t)rows * cols, 0.1);
                fill(bias, (size_t)rows, 1.0);
                fill(x, (size_t)n * cols, 1.0);
                k_weight src = {v, K_F32, rows, cols}, b = {bias, K_F32, 1, rows}, none = {0};
                q_weight q;
                err_buf e;
                CHECK(q_quantize_weight(&src, &SPECS[si], 2, &q, "w", &e) == ENGINE_OK);
                reference_dequant(&q.w, d);
                for (int t = 0; t < n; t++)
                    for (int r = 0; r < rows; r++) {
                        double s = with_bias ? bias[r] : 0.0;
                        for (int c = 0; c < cols; c++)
                            s += (double)d[(size_t)r * cols + c] * x[(size_t)t * cols + c];
                        ref[(size_t)t * rows + r] = s;
                    }
                /* With every vector set this CPU has: one token's 4-bit product takes
                 * k_matvec_rows's fused rows where AVX2 is there, else decodes in chunks. */
                for (int cap = 2; cap >= 0; cap--)
                    for (int threads = 1; threads <= 2; threads++) {
                        k_cpu_isa_cap(cap);
                        poison(y, (size_t)n * rows);
                        k_ctx kc = {threads, NULL, 0};
                        k_matmul(&kc, y, x, n, &q.w, with_bias ? &b : &none);
                        const double err = rel_err(y, ref, (size_t)n * rows);
                        CHECK_MSG(err < 1e-5, "%s n=%d %dx%d bias=%d threads=%d vector set %d: rel err %g",
                                  q_spec_name(&SPECS[si]), n, rows, cols, with_bias, threads, cap, err);
                    }
                k_cpu_isa_cap(2);
                /* k_matvec_rows: rows [1, rows) of the first token's product (fused in
                 * registers for 4-bit rows of whole blocks, decoded in chunks otherwise),
                 * with AVX-512, AVX2 and neither where this CPU has them. */
                for (int cap = 2; !with_bias && rows > 1 && cap >= 0; cap--) {
                    k_cpu_isa_cap(cap);
                    poison(y, (size_t)rows);
                    k_matvec_rows(&q.w, 1, rows, x, y);
                    const double err = rel_err(y, ref + 1, (size_t)rows - 1);
                    CHECK_MSG(err < 1e-5, "%s %dx%d: k_matvec_rows (vector set %d) rel err %g", q_spec_name(&SPECS[si]),
                              rows, cols, cap, err);
                }
                k_cpu_isa_cap(2);
                /* Element access and partial-row decoding agree with the reference. */
                size_t bad = 0;
                for (size_t i = 0; i < (size_t)rows * cols; i += 7)
                    bad += k_weight_get(&q.w, i) != d[i];
                float part[64];
                const int c0 = cols / 3, len = cols - c0 < 64 ? cols - c0 : 64;
                k_dequant_row(&q.w, rows - 1, c0, len, part);
                for (int i = 0; i < len; i++)
                    bad += part[i] != d[(size_t)(rows - 1) * cols + c0 + i];
                CHECK_MSG(bad == 0, "%s: %zu elements decode differently", q_spec_name(&SPECS[si]), bad);
                q_weight_free(&q);
                free(v), free(d), free(bias), free(x), free(y), free(ref);
            }
}

static void test_double_quant(void)
{
    const size_t sizes[] = {1, 255, 256, 257, 1000};
    float map[256];
    q_dynamic_map(map);
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        const size_t nb = sizes[k], nn = (nb + 255) / 256;
        float *am = malloc(nb * sizeof *am), *back = malloc(nb * sizeof *back), *sc = malloc(nn * sizeof *sc);
        uint8_t *aq = malloc(nb);
        double mean = 0.0;
        for (size_t i = 0; i < nb; i++) {
            am[i] = (float)(0.02 + 0.01 * urand() + (i % 50 == 0 ? 0.05 : 0.0));
            mean += am[i];
        }
        mean /= (double)nb;
        float offset;
        q_nested_quantize(map, am, nb, aq, sc, &offset);
        CHECK(fabs(offset - mean) <= 1e-7 * mean);
        q_8bit_dequantize(map, aq, sc, nb, 256, offset, back);
        /* The dynamic map's steps are at most 0.9/64 of the scale (near 1) and
         * finer below, so every value comes back within half of that. */
        size_t bad = 0;
        for (size_t i = 0; i < nb; i++)
            bad += !(fabsf(back[i] - am[i]) <= 0.0071f * sc[i / 256] + 1e-7f);
        CHECK_MSG(bad == 0, "double quant of %zu values: %zu beyond half a code step", nb, bad);
        free(am), free(back), free(sc), free(aq);
    }
}

#include "test_quant_bnb.h"

int main(void)
{
    test_nf4_table();
    test_error_bounds();
    test_matmul();
    test_double_quant();
    test_bnb_fixture();
    return test_finish("test_quant");
}
