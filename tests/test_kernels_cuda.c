/*
 * test_kernels_cuda.c: every CUDA launcher but attention's
 * (test_attention_cuda.c) against the CPU op it stands for (kernels.h),
 * on fresh random inputs, every output poisoned with NaN
 * before the launch so that an element left unwritten fails. Inputs in
 * f16/bf16 are rounded first and the CPU sees the rounded values, so the
 * comparison measures the kernel, not the rounding. Skips (77) without a GPU.
 */
#define _POSIX_C_SOURCE 200809L

#include "cuda_test_util.h"
#include "engine/plan.h"
#include "quant/quant.h"

static const k_dtype TYPES[] = {K_F32, K_F16, K_BF16};

static void test_embed(launch_ctx *lc)
{
    for (int ti = 0; ti < 3; ti++) {
        const k_dtype t = TYPES[ti];
        const int vocab = 1000, dim = 96, n = 7;
        float *vals = malloc((size_t)vocab * dim * sizeof *vals);
        void *h = make_weight(t, (size_t)vocab * dim, vals, 1.0);
        void *d = dev_from(h, (size_t)vocab * dim * k_dtype_size(t));
        int32_t ids[7] = {0, 999, 5, 5, 123, 1, 998};
        int32_t *did = dev_from(ids, sizeof ids);
        float *dx = dev_alloc((size_t)n * dim * sizeof(float));
        CHECK_MSG(launch_embed(lc, dx, d, t, did, n, dim, 1.0f) == 0, "%s", lc->err);
        float *got = host_f32(dx, K_F32, (size_t)n * dim), *ref = malloc((size_t)n * dim * sizeof *ref);
        k_ctx kc = cpu_ctx(dim);
        k_weight w = {h, t, vocab, dim};
        k_embed(&kc, ref, &w, ids, n);
        CHECK_MSG(rel_err_f(got, ref, (size_t)n * dim) == 0.0, "embed %s", dtype_name(t));
        free(kc.scratch), free(got), free(ref), free(vals), free(h);
        cudaFree(d), cudaFree(did), cudaFree(dx);
    }
}

static void test_rmsnorm_swiglu_bias(launch_ctx *lc)
{
    static const int dims[] = {8, 64, 172, 2048, 5000};
    for (int ti = 0; ti < 3; ti++)
        for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
            const k_dtype t = TYPES[ti];
            const int n = 5, dim = dims[di];
            const size_t nd = (size_t)n * dim;
            float *x = malloc(nd * sizeof *x), *w = malloc((size_t)dim * sizeof *w), *ref = malloc(nd * sizeof *ref);
            float *up = malloc(nd * sizeof *up), *gu = malloc(2 * nd * sizeof *gu), *b = malloc((size_t)dim * sizeof *b);
            fill(x, nd, 3.0);
            fill(w, (size_t)dim, 1.0);
            fill(up, nd, 2.0);
            fill(b, (size_t)dim, 1.0);
            k_ctx kc = cpu_ctx(dim);
            /* RMSNorm */
            float *dxx = dev_copy(x, nd), *dw = dev_copy(w, (size_t)dim);
            void *dy = dev_alloc(nd * k_dtype_size(t));
            CHECK_MSG(launch_rmsnorm(lc, dy, t, dxx, dw, n, dim, 1e-5f) == 0, "%s", lc->err);
            float *got = host_f32(dy, t, nd);
            k_weight kw = {w, K_F32, 1, dim};
            k_rmsnorm(&kc, ref, x, n, dim, &kw, 1e-5f);
            double e = rel_err_f(got, ref, nd);
            CHECK_MSG(e < out_tol(t), "rmsnorm %s dim %d: %.2e", dtype_name(t), dim, e);
            free(got);
            /* SwiGLU from stacked gate|up rows */
            for (int r = 0; r < n; r++) {
                memcpy(gu + (size_t)r * 2 * dim, x + (size_t)r * dim, (size_t)dim * sizeof *x);
                memcpy(gu + (size_t)r * 2 * dim + dim, up + (size_t)r * dim, (size_t)dim * sizeof *x);
            }
            float *dgu = dev_copy(gu, 2 * nd);
            void *dh = dev_alloc(nd * k_dtype_size(t));
            CHECK_MSG(launch_swiglu(lc, dh, t, dgu, n, dim) == 0, "%s", lc->err);
            got = host_f32(dh, t, nd);
            memcpy(ref, x, nd * sizeof *x);
            k_swiglu(&kc, ref, up, nd);
            e = rel_err_f(got, ref, nd);
            CHECK_MSG(e < out_tol(t), "swiglu %s dim %d: %.2e", dtype_name(t), dim, e);
            free(got);
            /* bias add, in place on fp32 */
            float *db = dev_copy(b, (size_t)dim), *dyy = dev_copy(x, nd);
            CHECK_MSG(launch_bias_add(lc, dyy, db, n, dim) == 0, "%s", lc->err);
            got = host_f32(dyy, K_F32, nd);
            for (size_t i = 0; i < nd; i++)
                ref[i] = x[i] + b[i % dim];
            CHECK_MSG(rel_err_f(got, ref, nd) == 0.0, "bias_add dim %d", dim);
            free(got);
            cudaFree(dxx), cudaFree(dw), cudaFree(dy), cudaFree(dgu), cudaFree(dh), cudaFree(db), cudaFree(dyy);
            free(x), free(w), free(ref), free(up), free(gu), free(b), free(kc.scratch);
        }
}

/* Per-row log-sum-exp and target logit, against double sums on the host. */
static void test_row_lse(launch_ctx *lc)
{
    static const struct {
        int rows, cols;
    } shapes[] = {{1, 1}, {3, 7}, {5, 512}, {17, 32000}, {4, 128256}, {2, 151936}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int rows = shapes[si].rows, cols = shapes[si].cols;
        float *x = malloc((size_t)rows * cols * sizeof *x), out[2 * 32];
        int32_t t[32];
        fill(x, (size_t)rows * cols, 8.0 + 4.0 * (double)si); /* wide logits: the running maximum moves */
        for (int r = 0; r < rows; r++)
            t[r] = r == 1 ? -1 : (int32_t)(((unsigned)r * 2654435761u) % (unsigned)cols);
        float *dx = dev_copy(x, (size_t)rows * cols), *dout = dev_alloc(sizeof out);
        int32_t *dt = dev_alloc(sizeof t);
        cudaMemcpy(dt, t, (size_t)rows * sizeof *t, cudaMemcpyHostToDevice);
        CHECK_MSG(launch_row_lse(lc, dx, rows, cols, dt, dout) == 0, "%s", lc->err);
        cudaMemcpy(out, dout, 2 * (size_t)rows * sizeof *out, cudaMemcpyDeviceToHost);
        for (int r = 0; r < rows; r++) {
            const float *row = x + (size_t)r * cols;
            double mx = -INFINITY, e = 0.0;
            for (int i = 0; i < cols; i++)
                mx = row[i] > mx ? row[i] : mx;
            for (int i = 0; i < cols; i++)
                e += exp((double)row[i] - mx);
            const double want = mx + log(e);
            CHECK_MSG(fabs(out[2 * r] - want) <= 1e-5 * (1.0 + fabs(want)), "row_lse %dx%d row %d: %.7f, want %.7f",
                      rows, cols, r, out[2 * r], want);
            if (t[r] >= 0)
                CHECK_MSG(out[2 * r + 1] == row[t[r]], "row_lse %dx%d row %d: target logit %g, want %g", rows, cols,
                          r, out[2 * r + 1], row[t[r]]);
            else
                CHECK_MSG(isnan(out[2 * r + 1]), "row_lse %dx%d row %d: no target, got %g", rows, cols, r,
                          out[2 * r + 1]);
        }
        cudaFree(dx), cudaFree(dout), cudaFree(dt), free(x);
    }
}

static void test_argmax(launch_ctx *lc)
{
    static const int sizes[] = {1, 7, 512, 513, 65537, 128256, 151936, 262144};
    CHECK(launch_argmax_scratch() == PLAN_ARGMAX_SCRATCH); /* what the planner counts */
    void *scratch = dev_alloc(launch_argmax_scratch());
    CHECK(cudaMemset(scratch, 0, launch_argmax_scratch()) == cudaSuccess); /* once: each launch leaves it so */
    int32_t *ring = NULL; /* the feed's ring in mapped host memory, as decode has it */
    CHECK(cudaMallocHost((void **)&ring, 2 * sizeof *ring) == cudaSuccess);
    int32_t *d_ring = NULL;
    CHECK(cudaHostGetDevicePointer((void **)&d_ring, ring, 0) == cudaSuccess);
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        const int n = sizes[si];
        float *x = malloc((size_t)n * sizeof *x);
        fill(x, (size_t)n, 10.0);
        int want = (int)((urand() + 1.0) * 0.5 * n) % n;
        x[want] = 50.0f;
        if (n > 3) { /* an equal maximum later: the lower index wins */
            int later = want + 1 + (int)((urand() + 1.0) * 0.5 * (n - want - 1));
            if (later < n)
                x[later] = 50.0f;
        }
        float *dx = dev_copy(x, (size_t)n);
        int32_t *dout = dev_alloc(sizeof(int32_t)), got = -1;
        CHECK_MSG(launch_argmax(lc, dout, dx, n, scratch, NULL) == 0, "%s", lc->err);
        cudaMemcpy(&got, dout, sizeof got, cudaMemcpyDeviceToHost);
        CHECK_MSG(got == want, "argmax n %d: %d, want %d", n, got, want);
        /* The feed: token and ring[pos & 1] get the choice, pos advances, the other slot is kept. */
        const int32_t pos0 = (int32_t)si + 40;
        int32_t h[3] = {-1, pos0, -1}; /* token, pos, out */
        int32_t *dh = dev_alloc(sizeof h);
        cudaMemcpy(dh, h, sizeof h, cudaMemcpyHostToDevice);
        ring[0] = ring[1] = -7;
        argmax_feed feed = {.token = dh, .pos = dh + 1, .ring = d_ring};
        /* From the third size on, the chosen token's embedding row into x (both of the row copy's paths:
         * 16-byte groups and single values) and the maxima zeroed. */
        const bool embed = si >= 2 && n <= 65537;
        const k_dtype et = TYPES[si % 3];
        const int dim = si % 2 ? 70 : 64, n_zero = 5 + (int)si;
        void *emb = NULL, *demb = NULL;
        float *vals = NULL, *dxe = NULL;
        uint32_t *dzero = NULL;
        if (embed) {
            vals = malloc((size_t)n * dim * sizeof *vals);
            emb = make_weight(et, (size_t)n * dim, vals, 1.0);
            demb = dev_from(emb, (size_t)n * dim * k_dtype_size(et));
            dxe = dev_alloc((size_t)dim * sizeof(float));
            dzero = dev_alloc((size_t)n_zero * sizeof(uint32_t));
            feed.x = dxe, feed.emb = demb, feed.emb_t = et, feed.dim = dim, feed.emb_mult = 1.0f;
            feed.zero = dzero, feed.n_zero = n_zero;
        }
        CHECK_MSG(launch_argmax(lc, dh + 2, dx, n, scratch, &feed) == 0, "%s", lc->err);
        CHECK(cudaDeviceSynchronize() == cudaSuccess);
        cudaMemcpy(h, dh, sizeof h, cudaMemcpyDeviceToHost);
        CHECK_MSG(h[0] == want && h[1] == pos0 + 1 && ring[pos0 & 1] == want && ring[!(pos0 & 1)] == -7 &&
                      h[2] == want,
                  "argmax feed n %d: token %d pos %d ring %d %d out %d", n, h[0], h[1], ring[0], ring[1], h[2]);
        if (embed) {
            float *ref = malloc((size_t)dim * sizeof *ref), *gx = host_f32(dxe, K_F32, (size_t)dim);
            uint32_t *gz = malloc((size_t)n_zero * sizeof *gz);
            k_ctx kc = cpu_ctx(dim);
            k_weight w = {emb, et, n, dim};
            k_embed(&kc, ref, &w, &want, 1);
            cudaMemcpy(gz, dzero, (size_t)n_zero * sizeof *gz, cudaMemcpyDeviceToHost);
            CHECK_MSG(rel_err_f(gx, ref, (size_t)dim) == 0.0, "argmax feed n %d: embedding row (%s, dim %d)", n,
                      dtype_name(et), dim);
            for (int i = 0; i < n_zero; i++)
                CHECK_MSG(gz[i] == 0, "argmax feed n %d: word %d of %d not zeroed", n, i, n_zero);
            free(kc.scratch), free(ref), free(gx), free(gz), free(emb), free(vals);
            cudaFree(demb), cudaFree(dxe), cudaFree(dzero);
        }
        cudaFree(dh);
        cudaFree(dx), cudaFree(dout), free(x);
    }
    cudaFree(scratch);
    cudaFreeHost(ring);
}

static float round_to(k_dtype t, float v)
{
    return t == K_F32 ? v : t == K_BF16 ? bf16_to_f32(f32_to_bf16(v)) : f16_to_f32(f32_to_f16(v));
}

/* ---- gemv and gemm (decode and prefill matrix products) ---- */

/* Random [rows, cols] weight in type t on host (vals: the same values as fp32) and on the device. */
static void *dev_weight(k_dtype t, size_t n, float *vals, k_weight *hw)
{
    void *h = make_weight(t, n, vals, 1.0);
    void *d = NULL;
    cudaMalloc(&d, n * k_dtype_size(t));
    cudaMemcpy(d, h, n * k_dtype_size(t), cudaMemcpyHostToDevice);
    hw->data = h;
    hw->dtype = t;
    return d;
}

static void check_gemv_chain(launch_ctx *lc, const gemv_args *a, const float *x, const float *norm, const float *y0,
                             const float *ref, int outs, double tol);

static void check_gemv(launch_ctx *lc, k_dtype t, int rows, int cols, gemv_input in, bool acc, bool with_bias)
{
    const size_t nw = (size_t)rows * cols;
    const int xn = cols;
    float *wv = malloc(nw * sizeof *wv), *x = malloc((size_t)xn * sizeof *x), *norm = malloc((size_t)cols * sizeof *norm);
    float *bias = malloc((size_t)rows * sizeof *bias), *y0 = malloc((size_t)rows * sizeof *y0);
    float *got = malloc((size_t)rows * sizeof *got), *xin = malloc((size_t)xn * sizeof *xin);
    k_weight hw = {NULL, t, rows, cols};
    void *dw = dev_weight(t, nw, wv, &hw);
    fill(x, (size_t)xn, 2.0);
    fill(norm, (size_t)cols, 1.0);
    fill(bias, (size_t)rows, 1.0);
    fill(y0, (size_t)rows, 1.0);
    float *dx = dev_copy(x, (size_t)xn), *dn = dev_copy(norm, (size_t)cols), *db = dev_copy(bias, (size_t)rows);
    float *dy = dev_copy(y0, (size_t)rows);
    if (!acc)
        cudaMemset(dy, 0xff, (size_t)rows * sizeof(float)); /* NaN: every row must be written */
    gemv_args a = {.y = dy, .accumulate = acc, .w = dw, .wt = t, .rows = rows, .cols = cols,
                   .bias = with_bias ? db : NULL, .in = in, .x = dx, .norm = dn, .eps = 1e-5f};
    CHECK_MSG(launch_gemv(lc, &a) == 0, "gemv: %s", lc->err);
    CHECK(cudaMemcpy(got, dy, (size_t)rows * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);

    /* The CPU ops on the same inputs. */
    k_ctx kc = cpu_ctx(cols);
    memcpy(xin, x, (size_t)xn * sizeof *x);
    k_weight nwt = {norm, K_F32, 1, cols}, bwt = {bias, K_F32, 1, rows}, none = {NULL, K_F32, 0, 0};
    if (in == GEMV_IN_RMSNORM)
        k_rmsnorm(&kc, xin, x, 1, cols, &nwt, 1e-5f);
    float *ref = malloc((size_t)rows * sizeof *ref);
    k_matmul(&kc, ref, xin, 1, &hw, with_bias ? &bwt : &none);
    double *refd = malloc((size_t)rows * sizeof *refd);
    for (int i = 0; i < rows; i++)
        refd[i] = (double)ref[i] + (acc ? y0[i] : 0.0);
    double e = rel_err(got, refd, (size_t)rows);
    CHECK_MSG(e < 2e-5, "gemv %s %dx%d in %d acc %d bias %d: error %.2e", dtype_name(t), rows, cols, (int)in, acc,
              with_bias, e);
    for (int i = 0; i < rows; i++)
        ref[i] = (float)refd[i];
    check_gemv_chain(lc, &a, x, norm, y0, ref, rows, 2e-5);
    free(refd);
    free(ref);
    free(kc.scratch);
    cudaFree(dw);
    cudaFree(dx);
    cudaFree(dn);
    cudaFree(db);
    cudaFree(dy);
    free((void *)hw.data);
    free(wv);
    free(x);
    free(norm);
    free(bias);
    free(y0);
    free(got);
    free(xin);
}

/* The gated output (decode's gate/up product): silu(W_gate x + b) * (W_up x + b) from stacked rows. */
static void check_gemv_glu(launch_ctx *lc, k_dtype t, int half, int cols, bool with_bias)
{
    const int rows = 2 * half;
    const size_t nw = (size_t)rows * cols;
    float *wv = malloc(nw * sizeof *wv), *x = malloc((size_t)cols * sizeof *x), *norm = malloc((size_t)cols * sizeof *norm);
    float *bias = malloc((size_t)rows * sizeof *bias), *xin = malloc((size_t)cols * sizeof *xin);
    float *gu = malloc((size_t)rows * sizeof *gu);
    k_weight hw = {NULL, t, rows, cols};
    void *dw = dev_weight(t, nw, wv, &hw);
    fill(x, (size_t)cols, 2.0);
    fill(norm, (size_t)cols, 1.0);
    fill(bias, (size_t)rows, 1.0);
    float *dx = dev_copy(x, (size_t)cols), *dn = dev_copy(norm, (size_t)cols), *db = dev_copy(bias, (size_t)rows);
    float *dy = dev_alloc((size_t)half * sizeof(float));
    gemv_args a = {.y = dy, .w = dw, .wt = t, .rows = rows, .cols = cols, .bias = with_bias ? db : NULL,
                   .in = GEMV_IN_RMSNORM, .x = dx, .norm = dn, .eps = 1e-5f, .glu_out = true};
    CHECK_MSG(launch_gemv(lc, &a) == 0, "gemv glu: %s", lc->err);
    float *got = host_f32(dy, K_F32, (size_t)half);
    k_ctx kc = cpu_ctx(cols);
    k_weight nwt = {norm, K_F32, 1, cols}, bwt = {bias, K_F32, 1, rows}, none = {NULL, K_F32, 0, 0};
    k_rmsnorm(&kc, xin, x, 1, cols, &nwt, 1e-5f);
    k_matmul(&kc, gu, xin, 1, &hw, with_bias ? &bwt : &none);
    k_swiglu(&kc, gu, gu + half, (size_t)half);
    double e = rel_err_f(got, gu, (size_t)half);
    CHECK_MSG(e < 2e-5, "gemv glu %s %dx%d bias %d: error %.2e", dtype_name(t), rows, cols, with_bias, e);
    free(kc.scratch), free(got), free((void *)hw.data), free(wv), free(x), free(norm), free(bias), free(xin), free(gu);
    cudaFree(dw), cudaFree(dx), cudaFree(dn), cudaFree(db), cudaFree(dy);
}

/*
 * The product of `a` run again with x_max holding max |x * norm| (|x|
 * without RMSNorm), computed here, and y_max to fill: the result must
 * still match ref, and y_max must hold max |y * g| over the product's own
 * outputs, exactly (g: random weights standing for the next norm's).
 */
static void check_gemv_chain(launch_ctx *lc, const gemv_args *a, const float *x, const float *norm, const float *y0,
                             const float *ref, int outs, double tol)
{
    const bool rms = a->in == GEMV_IN_RMSNORM;
    float xm = 0.0f;
    for (int c = 0; c < a->cols; c++)
        xm = fmaxf(xm, fabsf(rms ? x[c] * norm[c] : x[c]));
    float *g = malloc((size_t)outs * sizeof *g);
    fill(g, (size_t)outs, 1.0);
    float *dg = dev_copy(g, (size_t)outs);
    uint32_t *dm = dev_alloc(2 * sizeof(uint32_t)), m[2] = {0, 0};
    memcpy(&m[1], &xm, sizeof xm);
    cudaMemcpy(dm, m, sizeof m, cudaMemcpyHostToDevice);
    cudaMemcpy(a->y, y0, (size_t)a->rows * sizeof(float), cudaMemcpyHostToDevice);
    if (!a->accumulate)
        cudaMemset(a->y, 0xff, (size_t)a->rows * sizeof(float));
    gemv_args b = *a;
    b.x_max = dm + 1;
    b.y_max = dm;
    b.y_max_norm = dg;
    CHECK_MSG(launch_gemv(lc, &b) == 0, "gemv chain: %s", lc->err);
    float *got = host_f32(a->y, K_F32, (size_t)outs), want = 0.0f;
    const double err = rel_err_f(got, ref, (size_t)outs);
    CHECK_MSG(err < tol, "gemv chain %s %dx%d in %d: error %.2e", dtype_name(a->wt), a->rows, a->cols, (int)a->in, err);
    for (int i = 0; i < outs; i++)
        want = fmaxf(want, fabsf(got[i] * g[i]));
    cudaMemcpy(m, dm, sizeof m, cudaMemcpyDeviceToHost);
    float have;
    memcpy(&have, &m[0], sizeof have);
    CHECK_MSG(have == want, "gemv chain %s %dx%d: output maximum %g, want %g", dtype_name(a->wt), a->rows, a->cols,
              have, want);
    free(got), free(g);
    cudaFree(dg), cudaFree(dm);
}

/*
 * The nested absmax of w (ns blocks) on the device as the engine keeps it
 * (8-bit codes, each nested block's scale and offset side by side, the
 * code table), set in a's fields; free_nested releases it.
 */
static void dev_nested(const k_weight *w, size_t ns, gemv_args *a)
{
    const size_t ng = (ns + w->absmax_block - 1) / w->absmax_block;
    float *s2 = malloc(ng * 2 * sizeof *s2);
    for (size_t j = 0; j < ng; j++)
        s2[2 * j] = w->absmax_scale[j], s2[2 * j + 1] = w->absmax_offset;
    a->scales = NULL;
    a->am_q = dev_from(w->absmax_q, ns);
    a->am_s2 = dev_copy(s2, ng * 2);
    a->am_code = dev_copy(w->absmax_code, 256);
    a->am_shift = __builtin_ctz((unsigned)w->absmax_block);
    free(s2);
}

static void free_nested(gemv_args *a)
{
    cudaFree((void *)a->am_q), cudaFree((void *)a->am_s2), cudaFree((void *)a->am_code);
}

/*
 * Quantized weights: a dense random matrix quantized by the CPU reference
 * (quant/), its arrays uploaded as the engine does (a nested absmax decoded
 * to fp32), then the decode product (plain, RMS-normalised, accumulating,
 * gated) and the prefill decoding against the CPU's k_matmul and
 * k_dequant_row on the same quantized weight. Shapes whose rows are not
 * whole 16-byte chunks take the element-at-a-time path.
 */
static void check_gemv_quant(launch_ctx *lc, k_dtype type, int group, bool dq, int rows, int cols, int mode)
{
    const size_t nw = (size_t)rows * cols;
    float *wv = malloc(nw * sizeof *wv), *x = malloc((size_t)cols * sizeof *x), *norm = malloc((size_t)cols * sizeof *norm);
    float *xin = malloc((size_t)cols * sizeof *xin), *y0 = malloc((size_t)rows * sizeof *y0);
    fill(wv, nw, 1.0);
    fill(x, (size_t)cols, 2.0);
    fill(norm, (size_t)cols, 1.0);
    fill(y0, (size_t)rows, 1.0);
    k_weight src = {wv, K_F32, rows, cols};
    q_spec spec = {.type = type, .group = group, .double_quant = dq};
    q_weight qw;
    err_buf e = {0};
    CHECK_MSG(q_quantize_weight(&src, &spec, 2, &qw, "test", &e) == ENGINE_OK, "%s", e.msg);
    const k_weight *w = &qw.w;
    /* Device copies. */
    const size_t data = type == K_I8 ? nw : (nw + 1) / 2;
    const size_t ns = type == K_I8 ? (size_t)rows * q_int8_n_groups(cols, w->group) : (nw + w->block - 1) / w->block;
    float *scales = malloc(ns * sizeof *scales);
    if (type == K_I8)
        memcpy(scales, w->scales, ns * sizeof *scales);
    else if (w->absmax_q)
        q_8bit_dequantize(w->absmax_code, w->absmax_q, w->absmax_scale, ns, w->absmax_block, w->absmax_offset, scales);
    else
        memcpy(scales, w->absmax, ns * sizeof *scales);
    void *dw = dev_alloc(data);
    cudaMemcpy(dw, w->data, data, cudaMemcpyHostToDevice);
    float *dsc = dev_copy(scales, ns), *dcode = type == K_I8 ? NULL : dev_copy(w->code, 16);
    float *dx = dev_copy(x, (size_t)cols), *dn = dev_copy(norm, (size_t)cols);
    const bool glu = mode == 3, acc = mode == 2, rms = mode >= 1;
    const int outs = glu ? rows / 2 : rows;
    /* CPU */
    k_ctx kc = cpu_ctx(cols);
    memcpy(xin, x, (size_t)cols * sizeof *x);
    k_weight nwt = {norm, K_F32, 1, cols}, none = {NULL, K_F32, 0, 0};
    if (rms)
        k_rmsnorm(&kc, xin, x, 1, cols, &nwt, 1e-5f);
    float *ref = malloc((size_t)rows * sizeof *ref);
    k_matmul(&kc, ref, xin, 1, w, &none);
    if (glu)
        k_swiglu(&kc, ref, ref + outs, (size_t)outs);
    for (int i = 0; i < outs && acc; i++)
        ref[i] += y0[i];
    /* A nested absmax also as the engine keeps it when it can (8-bit). */
    gemv_args nest = {0};
    if (w->absmax_q)
        dev_nested(w, ns, &nest);
    float *dy = dev_copy(y0, (size_t)rows);
    void *dd = dev_alloc(nw * sizeof(uint16_t));
    for (int nested = 0; nested < (w->absmax_q ? 2 : 1); nested++) {
        cudaMemcpy(dy, y0, (size_t)rows * sizeof(float), cudaMemcpyHostToDevice);
        if (!acc)
            cudaMemset(dy, 0xff, (size_t)rows * sizeof(float));
        gemv_args a = {.y = dy, .accumulate = acc, .w = dw, .wt = type, .rows = rows, .cols = cols,
                       .scales = nested ? NULL : dsc, .code = dcode, .group = type == K_I8 ? w->group : w->block,
                       .in = rms ? GEMV_IN_RMSNORM : GEMV_IN_F32, .x = dx, .norm = dn, .eps = 1e-5f, .glu_out = glu};
        if (nested)
            a.scales = NULL, a.am_q = nest.am_q, a.am_s2 = nest.am_s2, a.am_code = nest.am_code,
            a.am_shift = nest.am_shift;
        CHECK_MSG(launch_gemv(lc, &a) == 0, "gemv: %s", lc->err);
        float *got = host_f32(dy, K_F32, (size_t)outs);
        /* The 4-bit chunks (cols a multiple of 32) multiply in fp16: the input
         * and the codes rounded to fp16 (unit roundoff u = 2^-11 = 4.9e-4 each)
         * and up to 8 products summed in fp16 (a rounding each), then fp32.
         * The roundings have random signs, so a row's error grows like its sum
         * does: a model of this arithmetic on these shapes and inputs gives
         * 1-2u of max |y| (at most 9e-4), hence 3e-3. A swapped nibble or a
         * wrong absmax is off by O(0.1-1) and still fails. */
        const double tol = type != K_I8 && cols % 32 == 0 ? 3e-3 : 2e-5;
        double err = rel_err_f(got, ref, (size_t)outs);
        CHECK_MSG(err < tol, "gemv %s group %d dq %d (8-bit on the device %d) %dx%d mode %d: error %.2e",
                  q_spec_name(&spec), group, dq, nested, rows, cols, mode, err);
        /* Again as a link of decode's chain: the input's maximum given (the
         * 4-bit types then stage it in one pass), the output's left behind. */
        check_gemv_chain(lc, &a, x, norm, y0, ref, outs, tol);
        /* Prefill decoding: exactly the CPU's weights (rounded to bf16 here). */
        CHECK_MSG(launch_dequant(lc, dd, K_BF16, &a) == 0, "dequant: %s", lc->err);
        float *gd = host_f32(dd, K_BF16, nw), *row = malloc((size_t)cols * sizeof *row);
        size_t bad = 0;
        for (int r = 0; r < rows; r++) {
            k_dequant_row(w, r, 0, cols, row);
            for (int c = 0; c < cols; c++)
                bad += gd[(size_t)r * cols + c] != bf16_to_f32(f32_to_bf16(row[c]));
        }
        CHECK_MSG(bad == 0, "dequant %s (8-bit absmax on the device %d) %dx%d: %zu elements differ",
                  q_spec_name(&spec), nested, rows, cols, bad);
        free(gd), free(row), free(got);
    }
    free(ref), free(kc.scratch), free(scales);
    free(wv), free(x), free(norm), free(xin), free(y0);
    q_weight_free(&qw);
    cudaFree(dw), cudaFree(dsc), cudaFree(dcode), cudaFree(dx), cudaFree(dn), cudaFree(dy), cudaFree(dd);
    free_nested(&nest);
}

static void test_quant_products(launch_ctx *lc)
{
    /* The last shape has more row pairs than a wave of 4-bit product warps
     * (two blocks of 8 an SM) and fewer row triples: three rows a warp
     * (the last triple not full). */
    const int wave = lc->n_sms * 2 * 8;
    const int shapes[][2] = {{64, 64}, {3072, 2048}, {256, 172}, {130, 96}, {2048, 8192}, {2 * wave + 100, 1024}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int mode = 0; mode < 4; mode++) {
            const int rows = shapes[si][0], cols = shapes[si][1];
            check_gemv_quant(lc, K_I8, 0, false, rows, cols, mode);
            check_gemv_quant(lc, K_I8, Q_INT8_GROUP, false, rows, cols, mode);
            check_gemv_quant(lc, K_NF4, 0, mode & 1, rows, cols, mode);
            check_gemv_quant(lc, K_FP4, 0, false, rows, cols, mode);
        }
    /* Qwen2.5-7B's down product: past Turing's shared memory (the input read in place there, int8 unpadded). */
    check_gemv_quant(lc, K_I8, 0, false, 256, 18944, 0);
    check_gemv_quant(lc, K_I8, Q_INT8_GROUP, false, 256, 18944, 0);
    check_gemv_quant(lc, K_NF4, 0, true, 256, 18944, 0);
}

/* y[n, w rows] set to y0 (acc) or poisoned, then the fused product into it; its result on the host (malloc'd). */
static float *run_gemm_q4(launch_ctx *lc, float *dy, const float *y0, bool acc, const void *dx, k_dtype xt,
                          const gemv_args *w, int n, int nsub, const gemm_q4_work *work)
{
    const size_t ny = (size_t)n * w->rows;
    if (acc)
        cudaMemcpy(dy, y0, ny * sizeof(float), cudaMemcpyHostToDevice);
    else
        cudaMemset(dy, 0xff, ny * sizeof(float));
    CHECK_MSG(launch_gemm_q4(lc, dy, acc, dx, xt, w, n, nsub, work) == 0, "gemm_q4: %s", lc->err);
    return host_f32(dy, K_F32, ny);
}

/*
 * The fused 4-bit prefill product (gemm_q4.cu) on a matrix quantized by the
 * CPU reference, x in xt, output poisoned (or y0 with acc): against the
 * exact product with each weight as the kernel forms it,
 * round(round(code) * round(absmax)) in xt (a wrong fragment layout,
 * nibble or absmax is off by O(1); accumulation order leaves ~1e-7), and
 * against the CPU's fp32 weights within a rounding step of xt. sms: the
 * multiprocessors the work is shared among (tiles split along K; a few
 * make a CTA's range span several tiles and a tile span several CTAs), or
 * 0 for whole tiles (no work memory). A second run must give the same
 * bits and leave the counters zero.
 */
static void check_gemm_q4(launch_ctx *lc, k_dtype type, int group, bool dq, k_dtype xt, int rows, int cols, int n,
                          int nsub, bool acc, int sms)
{
    const size_t nw = (size_t)rows * cols, nx = (size_t)n * cols, ny = (size_t)n * rows;
    float *wv = malloc(nw * sizeof *wv), *xv = malloc(nx * sizeof *xv), *y0 = malloc(ny * sizeof *y0);
    fill(wv, nw, 1.0);
    fill(y0, ny, 1.0);
    k_weight src = {wv, K_F32, rows, cols};
    q_spec spec = {.type = type, .double_quant = dq};
    q_weight qw;
    err_buf e = {0};
    CHECK_MSG(q_quantize_weight(&src, &spec, 2, &qw, "test", &e) == ENGINE_OK, "%s", e.msg);
    const k_weight *w = &qw.w;
    size_t ns = nw / w->block;
    float *am = malloc(ns * sizeof *am);
    if (w->absmax_q)
        q_8bit_dequantize(w->absmax_code, w->absmax_q, w->absmax_scale, ns, w->absmax_block, w->absmax_offset, am);
    else
        memcpy(am, w->absmax, ns * sizeof *am);
    /* A larger group (the kernel reads an absmax every group / 64 steps): every (group / block)-th of the
     * quantizer's absmax stands for its whole group; the exact reference then no longer applies. */
    const int gr = group > 0 ? group : w->block, gk = gr / w->block;
    for (size_t j = 0; j < nw / gr; j++)
        am[j] = am[j * gk];
    ns = nw / gr;
    k_weight hx = {NULL, xt, n, cols};
    void *dxw = dev_weight(xt, nx, xv, &hx); /* xv: x's values after rounding to xt */
    void *dw = dev_from(w->data, nw / 2);
    float *dam = dev_copy(am, ns), *dcode = dev_copy(w->code, 16), *dy = dev_alloc(ny * sizeof(float));
    gemv_args a = {.w = dw, .wt = type, .rows = rows, .cols = cols, .scales = dam, .code = dcode, .group = gr};
    const int sms0 = lc->n_sms;
    lc->n_sms = sms > 0 ? sms : sms0;
    gemm_q4_work work = {.n_count = 256, .always_split = true};
    work.part_bytes = gemm_q4_work_bytes(lc, nsub);
    CHECK(cudaMalloc(&work.part, work.part_bytes) == cudaSuccess);
    CHECK(cudaMalloc((void **)&work.count, 256 * sizeof(uint32_t)) == cudaSuccess);
    cudaMemset(work.part, 0xff, work.part_bytes);
    cudaMemset(work.count, 0, 256 * sizeof(uint32_t));
    float *got = run_gemm_q4(lc, dy, y0, acc, dxw, xt, &a, n, nsub, sms ? &work : NULL);
    float *again = run_gemm_q4(lc, dy, y0, acc, dxw, xt, &a, n, nsub, sms ? &work : NULL);
    uint32_t counts[256];
    cudaMemcpy(counts, work.count, sizeof counts, cudaMemcpyDeviceToHost);
    int dirty = 0;
    for (int i = 0; i < 256; i++)
        dirty += counts[i] != 0;
    CHECK_MSG(memcmp(got, again, ny * sizeof(float)) == 0 && dirty == 0,
              "gemm_q4 %dx%d n %d sub %d on %d SMs: a second run differs or %d counters left", rows, cols, n, nsub,
              lc->n_sms, dirty);
    /* A nested absmax as the engine keeps it (8-bit, decoded in the kernel):
     * the same absmax values, so the same bits. */
    if (w->absmax_q && gk == 1) {
        gemv_args an = a;
        dev_nested(w, ns, &an);
        float *gn = run_gemm_q4(lc, dy, y0, acc, dxw, xt, &an, n, nsub, sms ? &work : NULL);
        CHECK_MSG(memcmp(got, gn, ny * sizeof(float)) == 0, "gemm_q4 %dx%d n %d: the 8-bit absmax gives other bits",
                  rows, cols, n);
        free(gn);
        free_nested(&an);
    }
    lc->n_sms = sms0;
    cudaFree(work.part), cudaFree(work.count);
    free(again);
    /* CPU: the kernel's weights and the exact ones */
    float *wk = malloc(nw * sizeof *wk), *wf = malloc(nw * sizeof *wf);
    const uint8_t *bytes = w->data;
    for (size_t i = 0; i < nw; i++) {
        const int q = i & 1 ? bytes[i / 2] & 15 : bytes[i / 2] >> 4;
        wk[i] = round_to(xt, round_to(xt, w->code[q]) * round_to(xt, am[i / gr]));
    }
    for (int r = 0; r < rows; r++)
        k_dequant_row(w, r, 0, cols, wf + (size_t)r * cols);
    double *rk = malloc(ny * sizeof *rk), *rf = malloc(ny * sizeof *rf);
    for (int t = 0; t < n; t++)
        for (int r = 0; r < rows; r++) {
            double sk = acc ? y0[(size_t)t * rows + r] : 0.0, sf = sk;
            for (int c = 0; c < cols; c++) {
                sk += (double)wk[(size_t)r * cols + c] * xv[(size_t)t * cols + c];
                sf += (double)wf[(size_t)r * cols + c] * xv[(size_t)t * cols + c];
            }
            rk[(size_t)t * rows + r] = sk;
            rf[(size_t)t * rows + r] = sf;
        }
    const double ek = rel_err(got, rk, ny), ef = rel_err(got, rf, ny);
    CHECK_MSG(ek < 1e-5 && (gk > 1 || ef < (xt == K_BF16 ? 8e-3 : 1e-3)),
              "gemm_q4 %s group %d dq %d x %s %dx%d n %d sub %d acc %d sms %d: error %.2e (kernel's weights), %.2e (exact)",
              q_spec_name(&spec), group, dq, dtype_name(xt), rows, cols, n, nsub, acc, sms, ek, ef);
    free(wv), free(xv), free(y0), free(am), free(got), free(wk), free(wf), free(rk), free(rf), free((void *)hx.data);
    q_weight_free(&qw);
    cudaFree(dxw), cudaFree(dw), cudaFree(dam), cudaFree(dcode), cudaFree(dy);
}

static void test_gemm_q4(launch_ctx *lc)
{
    if (!lc->fast[K_OP_GEMM_Q4]) {
        printf("test_kernels_cuda: the fused 4-bit product needs compute capability 9.0 and sm_90a code: not "
               "checked here\n");
        return;
    }
    const int all = lc->n_sms;
    check_gemm_q4(lc, K_NF4, 0, false, K_BF16, 256, 256, 37, 1, false, all);
    check_gemm_q4(lc, K_NF4, 0, true, K_BF16, 384, 512, 300, 2, true, all);
    check_gemm_q4(lc, K_FP4, 0, false, K_BF16, 128, 1024, 129, 1, true, all);
    check_gemm_q4(lc, K_NF4, 128, false, K_BF16, 256, 768, 256, 2, false, all);
    check_gemm_q4(lc, K_NF4, 0, false, K_F16, 256, 256, 200, 2, false, all);
    check_gemm_q4(lc, K_NF4, 0, false, K_F16, 128, 512, 1, 1, true, all);
    /* Whole tiles; tiles split in two, three or more pieces, CTAs spanning tiles. */
    check_gemm_q4(lc, K_NF4, 0, true, K_BF16, 384, 512, 300, 2, true, 0);
    check_gemm_q4(lc, K_NF4, 0, false, K_BF16, 512, 1536, 200, 1, true, 5);
    check_gemm_q4(lc, K_NF4, 128, false, K_BF16, 384, 2048, 300, 2, false, 7);
    check_gemm_q4(lc, K_FP4, 0, false, K_F16, 256, 1024, 129, 1, true, 13);
    /* The engine's choice: shapes it cannot take go to scratch (0). */
    /* (gemm_q4_tiles reads no memory: any 16-byte-aligned address stands for the arrays) */
    float *fake = (float *)(uintptr_t)4096;
    gemv_args a = {.w = fake, .wt = K_NF4, .rows = 100, .cols = 256, .scales = fake, .code = fake, .group = 64};
    CHECK(gemm_q4_tiles(lc, &a, K_BF16, 512, NULL) == 0);
    a.rows = 28672, a.cols = 4096;
    CHECK(gemm_q4_tiles(lc, &a, K_F32, 512, NULL) == 0 && gemm_q4_tiles(lc, &a, K_BF16, 512, NULL) > 0);
    CHECK(launch_gemm_q4(lc, fake, false, fake, K_F32, &a, 512, 1, NULL) == -1 && strstr(lc->err, "gemm_q4"));
    /* y not 16-byte aligned: refused up front (without the check, the tensor map's encode fails instead) */
    CHECK(launch_gemm_q4(lc, fake + 1, false, fake, K_BF16, &a, 512, 1, NULL) == -1 && strstr(lc->err, "unsupported"));
}

static void check_gemm(launch_ctx *lc, k_dtype t, int n, int rows, int cols, bool acc)
{
    const size_t nw = (size_t)rows * cols, nx = (size_t)n * cols, ny = (size_t)n * rows;
    float *wv = malloc(nw * sizeof *wv), *xv = malloc(nx * sizeof *xv), *y0 = malloc(ny * sizeof *y0);
    float *got = malloc(ny * sizeof *got), *ref = malloc(ny * sizeof *ref);
    k_weight hw = {NULL, t, rows, cols}, hx = {NULL, t, n, cols};
    void *dw = dev_weight(t, nw, wv, &hw);
    void *dxw = dev_weight(t, nx, xv, &hx); /* x in the weight type, as the engine feeds it */
    fill(y0, ny, 1.0);
    float *dy = dev_copy(y0, ny);
    if (!acc)
        cudaMemset(dy, 0xff, ny * sizeof(float));
    CHECK_MSG(launch_gemm(lc, dy, acc, dxw, dw, t, n, rows, cols) == 0, "gemm: %s", lc->err);
    CHECK(cudaStreamSynchronize(lc->stream) == cudaSuccess);
    CHECK(cudaMemcpy(got, dy, ny * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
    k_ctx kc = cpu_ctx(cols);
    k_weight none = {NULL, K_F32, 0, 0};
    k_matmul(&kc, ref, xv, n, &hw, &none); /* xv holds x's values after rounding to t */
    double *refd = malloc(ny * sizeof *refd);
    for (size_t i = 0; i < ny; i++)
        refd[i] = (double)ref[i] + (acc ? y0[i] : 0.0);
    double e = rel_err(got, refd, ny);
    CHECK_MSG(e < 2e-5, "gemm %s n %d %dx%d acc %d: error %.2e", dtype_name(t), n, rows, cols, acc, e);
    free(refd);
    free(kc.scratch);
    cudaFree(dw);
    cudaFree(dxw);
    cudaFree(dy);
    free((void *)hw.data);
    free((void *)hx.data);
    free(wv);
    free(xv);
    free(y0);
    free(got);
    free(ref);
}

static void test_matrix_products(launch_ctx *lc)
{
    static const k_dtype types[] = {K_F32, K_F16, K_BF16};
    void *ws = NULL;
    lc->workspace_bytes = 32u << 20;
    cudaMalloc(&ws, lc->workspace_bytes);
    lc->workspace = ws;
    CHECK_MSG(launch_gemm_create(lc) == 0, "%s", lc->err);
    for (int ti = 0; ti < 3; ti++) {
        const k_dtype t = types[ti];
        static const int shapes[][2] = {{1, 8}, {3, 64}, {37, 64}, {100, 172}, {513, 2048}, {300, 14336}};
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int in = 0; in < 4; in++) /* both inputs, with and without accumulate + bias */
                check_gemv(lc, t, shapes[s][0], shapes[s][1], (gemv_input)(in & 1), in >= 2, in >= 2);
        check_gemv(lc, t, 4096, 4096, GEMV_IN_RMSNORM, false, false);
        check_gemv(lc, t, 300, 18944, GEMV_IN_F32, true, false); /* past Turing's shared memory: read in place */
        check_gemv_glu(lc, t, 1, 8, true);
        check_gemv_glu(lc, t, 86, 64, false);
        check_gemv_glu(lc, t, 172, 64, true);
        check_gemv_glu(lc, t, 8192, 2048, true);
        static const int gshapes[][3] = {{1, 64, 64}, {5, 192, 64}, {64, 128, 256}, {300, 512, 1024}, {17, 96, 172}};
        if (t == K_BF16 && !lc->fast[K_OP_BF16]) /* no bf16 products: the engine converts bf16 weights to f16 */
            continue;
        for (size_t s = 0; s < sizeof gshapes / sizeof gshapes[0]; s++)
            for (int acc = 0; acc < 2; acc++)
                check_gemm(lc, t, gshapes[s][0], gshapes[s][1], gshapes[s][2], acc);
    }
    launch_gemm_destroy(lc);
    cudaFree(ws);
}

int main(void)
{
    test_rng_state = 0x2545f4914f6cdd1dull; /* other inputs than the CPU kernel test's */
    launch_ctx lc;
    const int skip = cuda_test_setup("test_kernels_cuda", &lc);
    if (skip)
        return skip;
    test_embed(&lc);
    test_rmsnorm_swiglu_bias(&lc);
    test_argmax(&lc);
    test_row_lse(&lc);
    test_matrix_products(&lc);
    test_quant_products(&lc);
    test_gemm_q4(&lc);
    /* Bad arguments fail with a message and launch nothing. */
    CHECK(launch_rmsnorm(&lc, NULL, K_F32, NULL, NULL, 1, 8, 1e-5f) == -1 && strstr(lc.err, "rmsnorm"));
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    cudaStreamDestroy(lc.stream);
    return test_finish("test_kernels_cuda");
}
