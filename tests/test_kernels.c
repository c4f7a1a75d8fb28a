/*
 * test_kernels.c: every CPU kernel against a plain float64 reference on
 * fresh random inputs, outputs poisoned with NaN first so that an element
 * left unwritten fails.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/dtype.h"
#include "kernels/kernels.h"
#include "test_random.h"
#include "test_util.h"

static void poison(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = NAN;
}

static void test_dtype_conversions(void)
{
    /* Exhaustive over all halves: f16 -> f32 -> f16 is the identity (NaNs stay NaN). */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = f16_to_f32((uint16_t)h);
        if (f != f) {
            bad += !(f16_to_f32(f32_to_f16(f)) != f16_to_f32(f32_to_f16(f)));
            continue;
        }
        bad += f32_to_f16(f) != h;
    }
    CHECK_MSG(bad == 0, "%d half values did not round-trip", bad);
    CHECK(f16_to_f32(0x3c00) == 1.0f);
    CHECK(f16_to_f32(0xc000) == -2.0f);
    CHECK(f16_to_f32(0x0001) == ldexpf(1.0f, -24));
    CHECK(f16_to_f32(0x7bff) == 65504.0f);
    CHECK(bf16_to_f32(0x3f80) == 1.0f);
    CHECK(f32_to_bf16(1.00390625f) == 0x3f80);      /* tie rounds to even */
    CHECK(f32_to_bf16(1.01171875f) == 0x3f82);      /* tie rounds to even (up) */
    CHECK(f32_to_f16(1.0f + ldexpf(1.0f, -11)) == 0x3c00); /* tie to even */
}

static void test_matmul(int threads)
{
    const k_dtype types[] = {K_F32, K_F16, K_BF16};
    const int shapes[][3] = {{1, 37, 70}, {1, 64, 64}, {5, 19, 33}, {9, 130, 264}, {3, 1, 8}};
    for (size_t ti = 0; ti < 3; ti++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
            for (int with_scratch = 0; with_scratch < 2; with_scratch++)
                for (int with_bias = 0; with_bias < 2; with_bias++) {
                    const int n = shapes[si][0], rows = shapes[si][1], cols = shapes[si][2];
                    float *wv = malloc((size_t)rows * cols * sizeof *wv), *bv = malloc((size_t)rows * sizeof *bv);
                    void *wd = make_weight(types[ti], (size_t)rows * cols, wv, 1.0);
                    void *bd = make_weight(types[ti], (size_t)rows, bv, 1.0);
                    float *x = malloc((size_t)n * cols * sizeof *x), *y = malloc((size_t)n * rows * sizeof *y);
                    double *ref = malloc((size_t)n * rows * sizeof *ref);
                    fill(x, (size_t)n * cols, 1.0);
                    poison(y, (size_t)n * rows);
                    for (int t = 0; t < n; t++)
                        for (int r = 0; r < rows; r++) {
                            double s = with_bias ? bv[r] : 0.0;
                            for (int i = 0; i < cols; i++)
                                s += (double)wv[(size_t)r * cols + i] * x[(size_t)t * cols + i];
                            ref[(size_t)t * rows + r] = s;
                        }
                    k_weight w = {wd, types[ti], rows, cols}, b = {bd, types[ti], 1, rows};
                    size_t per = k_matmul_scratch_floats(cols);
                    float *scratch = with_scratch ? malloc((size_t)threads * per * sizeof *scratch) : NULL;
                    k_ctx c = {threads, scratch, with_scratch ? per : 0};
                    k_matmul(&c, y, x, n, &w, with_bias ? &b : NULL);
                    double e = rel_err(y, ref, (size_t)n * rows);
                    if (!with_bias && !with_scratch) { /* one token's rows [0, rows) by k_matvec_rows */
                        poison(y, (size_t)rows);
                        k_matvec_rows(&w, 0, rows, x, y);
                        const double ev = rel_err(y, ref, (size_t)rows);
                        CHECK_MSG(ev < 1e-5, "k_matvec_rows dtype %d %dx%d: rel err %g", (int)types[ti], rows, cols,
                                  ev);
                    }
                    CHECK_MSG(e < 1e-5, "matmul dtype %d n=%d %dx%d scratch=%d bias=%d threads=%d: rel err %g",
                              (int)types[ti], n, rows, cols, with_scratch, with_bias, threads, e);
                    free(wv), free(bv), free(wd), free(bd), free(x), free(y), free(ref), free(scratch);
                }
}

static void test_rmsnorm(void)
{
    const int n = 3, dim = 67;
    float x[3 * 67], y[3 * 67], wv[67];
    double ref[3 * 67];
    for (int ti = 0; ti < 3; ti++) {
        void *wd = make_weight((k_dtype)ti, dim, wv, 2.0);
        fill(x, (size_t)n * dim, 3.0);
        poison(y, (size_t)n * dim);
        for (int t = 0; t < n; t++) {
            double ss = 0;
            for (int i = 0; i < dim; i++)
                ss += (double)x[t * dim + i] * x[t * dim + i];
            double inv = 1.0 / sqrt(ss / dim + 1e-5);
            for (int i = 0; i < dim; i++)
                ref[t * dim + i] = x[t * dim + i] * inv * wv[i];
        }
        k_weight w = {wd, (k_dtype)ti, 1, dim};
        k_ctx c = {2, NULL, 0};
        k_rmsnorm(&c, y, x, n, dim, &w, 1e-5f);
        CHECK_MSG(rel_err(y, ref, (size_t)n * dim) < 1e-6, "rmsnorm dtype %d", ti);
        k_rmsnorm(&c, x, x, n, dim, &w, 1e-5f); /* in place */
        CHECK_MSG(rel_err(x, ref, (size_t)n * dim) < 1e-6, "rmsnorm in place dtype %d", ti);
        free(wd);
    }
}

static void test_rope(void)
{
    const int n = 4, nh = 3, hd = 8, half = 4, ctx = 40;
    float x[4 * 3 * 8], orig[4 * 3 * 8], cs[40 * 4], sn[40 * 4];
    double ref[4 * 3 * 8];
    int pos[4] = {0, 7, 21, 39};
    for (int p = 0; p < ctx; p++)
        for (int i = 0; i < half; i++) {
            double ang = p * pow(10000.0, -2.0 * i / hd);
            cs[p * half + i] = (float)cos(ang);
            sn[p * half + i] = (float)sin(ang);
        }
    fill(x, sizeof x / sizeof x[0], 1.0);
    memcpy(orig, x, sizeof x);
    for (int t = 0; t < n; t++)
        for (int h = 0; h < nh; h++)
            for (int i = 0; i < half; i++) {
                const float *v = orig + (t * nh + h) * hd;
                double ang = pos[t] * pow(10000.0, -2.0 * i / hd);
                ref[(t * nh + h) * hd + i] = v[i] * cos(ang) - v[i + half] * sin(ang);
                ref[(t * nh + h) * hd + i + half] = v[i + half] * cos(ang) + v[i] * sin(ang);
            }
    k_ctx c = {2, NULL, 0};
    k_rope(&c, x, n, nh, hd, pos, cs, sn);
    CHECK_MSG(rel_err(x, ref, sizeof x / sizeof x[0]) < 1e-6, "rope");
}

static void test_attention(void)
{
    const int nh = 6, nkv = 2, hd = 16, ctx = 50, threads = 2;
    const int cases[][3] = {{1, 0, 0}, {1, 30, 0}, {7, 0, 0}, {5, 12, 0}, {9, 20, 8}, {1, 40, 5}}; /* n, pos0, window */
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int n = cases[ci][0], pos0 = cases[ci][1], window = cases[ci][2];
        const size_t kvs = (size_t)nkv * hd;
        float *q = malloc((size_t)n * nh * hd * sizeof *q), *kc = malloc(ctx * kvs * sizeof *kc);
        float *vc = malloc(ctx * kvs * sizeof *vc), *out = malloc((size_t)n * nh * hd * sizeof *out);
        double *ref = malloc((size_t)n * nh * hd * sizeof *ref), sc[64];
        fill(q, (size_t)n * nh * hd, 2.0);
        fill(kc, ctx * kvs, 2.0);
        fill(vc, ctx * kvs, 1.0);
        poison(out, (size_t)n * nh * hd);
        for (int t = 0; t < n; t++)
            for (int h = 0; h < nh; h++) {
                int pos = pos0 + t, kvh = h / (nh / nkv);
                int first = window > 0 && pos + 1 > window ? pos + 1 - window : 0;
                double mx = -1e300, sum = 0;
                for (int p = first; p <= pos; p++) {
                    double s = 0;
                    for (int i = 0; i < hd; i++)
                        s += (double)q[(t * nh + h) * hd + i] * kc[p * kvs + kvh * hd + i];
                    sc[p] = s / sqrt((double)hd);
                    mx = fmax(mx, sc[p]);
                }
                for (int p = first; p <= pos; p++)
                    sum += (sc[p] = exp(sc[p] - mx));
                for (int i = 0; i < hd; i++) {
                    double o = 0;
                    for (int p = first; p <= pos; p++)
                        o += sc[p] / sum * vc[p * kvs + kvh * hd + i];
                    ref[(t * nh + h) * hd + i] = o;
                }
            }
        float *scratch = malloc((size_t)threads * ctx * sizeof *scratch);
        k_ctx c = {threads, scratch, (size_t)ctx};
        k_attention(&c, out, q, kc, vc, n, pos0, nh, nkv, hd, window);
        double e = rel_err(out, ref, (size_t)n * nh * hd);
        CHECK_MSG(e < 1e-5, "attention n=%d pos0=%d window=%d: rel err %g", n, pos0, window, e);
        free(q), free(kc), free(vc), free(out), free(ref), free(scratch);
    }
}

static void test_elementwise(void)
{
    enum { N = 10000 };
    static float g[N], u[N], y[N], x[N];
    static double ref[N];
    k_ctx c = {2, NULL, 0};
    fill(g, N, 6.0);
    fill(u, N, 2.0);
    for (int i = 0; i < N; i++)
        ref[i] = g[i] / (1.0 + exp(-(double)g[i])) * u[i];
    k_swiglu(&c, g, u, N);
    CHECK_MSG(rel_err(g, ref, N) < 1e-6, "swiglu");
    fill(y, N, 1.0);
    fill(x, N, 1.0);
    for (int i = 0; i < N; i++)
        ref[i] = (double)y[i] + x[i];
    k_add(&c, y, x, N);
    CHECK_MSG(rel_err(y, ref, N) < 1e-7, "add");

    float ev[5 * 12], out[3 * 12];
    double eref[3 * 12];
    void *ed = make_weight(K_BF16, 5 * 12, ev, 1.0);
    int32_t ids[3] = {4, 0, 4};
    for (int t = 0; t < 3; t++)
        for (int i = 0; i < 12; i++)
            eref[t * 12 + i] = ev[ids[t] * 12 + i];
    poison(out, 36);
    k_weight e = {ed, K_BF16, 5, 12};
    k_embed(&c, out, &e, ids, 3);
    CHECK_MSG(rel_err(out, eref, 36) == 0.0, "embed");
    free(ed);
}

int main(void)
{
    test_dtype_conversions();
    test_matmul(1);
    test_matmul(3);
    test_rmsnorm();
    test_rope();
    test_attention();
    test_elementwise();
    return test_finish("test_kernels");
}
