/*
 * test_arch_cuda.c: the CUDA ops issue 36's architectures added, against
 * the CPU's (kernels.h) on fresh random inputs, outputs poisoned with NaN
 * first: residual_add (post norms, Granite's residual_multiplier),
 * logits_scale (logits_scaling, Gemma 2's final cap), qk_norm_whole
 * (OLMo 2), GeGLU in prefill and in decode's gated product, rmsnorm
 * without weights, embed's multiplier; and attention with a score scale of
 * its own and Gemma 2's soft cap, prefill (both paths) and decode (the
 * staged kernel and the streaming one), with Phi-3's partial rotary at
 * head_dim 96 and Gemma's 256. test_attention_cuda covers the rest of those
 * launchers.
 * Skips (77) without a GPU.
 */
#define _POSIX_C_SOURCE 200809L

#include "cuda_test_util.h"

/* x += mult * rmsnorm(y) * w (w NULL: x += mult * y). */
static void check_residual_add(launch_ctx *lc, int n, int dim, bool norm, float mult)
{
    const size_t len = (size_t)n * dim;
    float *x = malloc(len * sizeof *x), *y = malloc(len * sizeof *y), *w = malloc((size_t)dim * sizeof *w);
    fill(x, len, 2.0), fill(y, len, 3.0), fill(w, (size_t)dim, 1.0);
    float *dx = dev_copy(x, len), *dy = dev_copy(y, len), *dw = dev_copy(w, (size_t)dim);
    CHECK_MSG(launch_residual_add(lc, dx, dy, norm ? dw : NULL, n, dim, 1e-5f, mult) == 0, "%s", lc->err);
    float *got = host_f32(dx, K_F32, len);
    k_ctx kc = cpu_ctx(dim);
    const k_weight wt = {w, K_F32, 1, dim};
    if (norm)
        k_rmsnorm(&kc, y, y, n, dim, &wt, 1e-5f);
    k_scale(&kc, y, mult, len);
    k_add(&kc, x, y, len);
    const double e = rel_err_f(got, x, len);
    CHECK_MSG(e < 2e-6, "residual_add n %d dim %d norm %d mult %g: %.2e", n, dim, norm, (double)mult, e);
    free(x), free(y), free(w), free(got), free(kc.scratch);
    cudaFree(dx), cudaFree(dy), cudaFree(dw);
}

/* x = cap * tanh(x * mult / cap), or x * mult without a cap. */
static void check_logits_scale(launch_ctx *lc, long n, float mult, float cap)
{
    float *x = malloc((size_t)n * sizeof *x);
    fill(x, (size_t)n, 40.0);
    float *dx = dev_copy(x, (size_t)n);
    CHECK_MSG(launch_logits_scale(lc, dx, n, mult, cap) == 0, "%s", lc->err);
    float *got = host_f32(dx, K_F32, (size_t)n);
    k_ctx kc = cpu_ctx(8);
    k_scale(&kc, x, mult, (size_t)n);
    if (cap > 0.0f)
        k_softcap(&kc, x, cap, (size_t)n);
    const double e = rel_err_f(got, x, (size_t)n);
    CHECK_MSG(e < 2e-6, "logits_scale n %ld mult %g cap %g: %.2e", n, (double)mult, (double)cap, e);
    free(x), free(got), free(kc.scratch);
    cudaFree(dx);
}

/* OLMo 2: per token, bias added to q, k and v, then q and k RMS-normed over the whole projection. */
static void check_qk_norm_whole(launch_ctx *lc, int n, int nh, int nkv, int hd, bool with_bias)
{
    const int qd = nh * hd, kvd = nkv * hd, width = qd + 2 * kvd;
    const size_t len = (size_t)n * width;
    float *qkv = malloc(len * sizeof *qkv), *b = malloc((size_t)width * sizeof *b);
    float *qn = malloc((size_t)qd * sizeof *qn), *kn = malloc((size_t)kvd * sizeof *kn);
    fill(qkv, len, 2.0), fill(b, (size_t)width, 0.5), fill(qn, (size_t)qd, 1.0), fill(kn, (size_t)kvd, 1.0);
    float *d = dev_copy(qkv, len), *db = dev_copy(b, (size_t)width), *dqn = dev_copy(qn, (size_t)qd),
          *dkn = dev_copy(kn, (size_t)kvd);
    CHECK_MSG(launch_qk_norm_whole(lc, d, with_bias ? db : NULL, dqn, dkn, n, nh, nkv, hd, 1e-6f) == 0, "%s",
              lc->err);
    float *got = host_f32(d, K_F32, len);
    k_ctx kc = cpu_ctx(width);
    const k_weight qw = {qn, K_F32, 1, qd}, kw = {kn, K_F32, 1, kvd};
    for (int t = 0; t < n; t++) {
        float *r = qkv + (size_t)t * width;
        for (int i = 0; with_bias && i < width; i++)
            r[i] += b[i];
        k_rmsnorm(&kc, r, r, 1, qd, &qw, 1e-6f);
        k_rmsnorm(&kc, r + qd, r + qd, 1, kvd, &kw, 1e-6f);
    }
    const double e = rel_err_f(got, qkv, len);
    CHECK_MSG(e < 2e-6, "qk_norm_whole n %d heads %d/%d hd %d bias %d: %.2e", n, nh, nkv, hd, with_bias, e);
    free(qkv), free(b), free(qn), free(kn), free(got), free(kc.scratch);
    cudaFree(d), cudaFree(db), cudaFree(dqn), cudaFree(dkn);
}

/* GeGLU: prefill's kernel, and decode's gated product with gemv_args.gelu. */
static void check_geglu(launch_ctx *lc, int n, int ffn, int cols)
{
    const size_t len = (size_t)n * 2 * ffn;
    float *gu = malloc(len * sizeof *gu), *ref = malloc((size_t)n * ffn * sizeof *ref);
    fill(gu, len, 4.0);
    float *dgu = dev_copy(gu, len);
    const k_dtype types[] = {K_F32, K_F16, K_BF16};
    k_ctx kc = cpu_ctx(cols > 2 * ffn ? cols : 2 * ffn);
    for (int t = 0; t < n; t++) {
        memcpy(ref + (size_t)t * ffn, gu + (size_t)t * 2 * ffn, (size_t)ffn * sizeof *ref);
        k_geglu(&kc, ref + (size_t)t * ffn, gu + (size_t)t * 2 * ffn + ffn, (size_t)ffn);
    }
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        void *dh = dev_alloc((size_t)n * ffn * k_dtype_size(types[i]));
        CHECK_MSG(launch_geglu(lc, dh, types[i], dgu, n, ffn) == 0, "%s", lc->err);
        float *got = host_f32(dh, types[i], (size_t)n * ffn);
        const double e = rel_err_f(got, ref, (size_t)n * ffn);
        CHECK_MSG(e < (types[i] == K_F32 ? 2e-6 : out_tol(types[i])), "geglu %s n %d ffn %d: %.2e",
                  dtype_name(types[i]), n, ffn, e);
        free(got);
        cudaFree(dh);
    }
    /* Decode: gelu(W_gate x) * (W_up x), the rows stacked, fp32 weights. */
    const int rows = 2 * ffn;
    float *w = malloc((size_t)rows * cols * sizeof *w), *x = malloc((size_t)cols * sizeof *x);
    float *y = malloc((size_t)rows * sizeof *y);
    fill(w, (size_t)rows * cols, 0.5), fill(x, (size_t)cols, 2.0);
    float *dw = dev_copy(w, (size_t)rows * cols), *dx = dev_copy(x, (size_t)cols), *dy = dev_alloc((size_t)ffn * 4);
    gemv_args a = {.y = dy, .w = dw, .wt = K_F32, .rows = rows, .cols = cols, .in = GEMV_IN_F32, .x = dx,
                   .glu_out = true, .gelu = true};
    CHECK_MSG(launch_gemv(lc, &a) == 0, "gemv geglu: %s", lc->err);
    float *got = host_f32(dy, K_F32, (size_t)ffn);
    const k_weight hw = {w, K_F32, rows, cols};
    k_matmul(&kc, y, x, 1, &hw, NULL);
    k_geglu(&kc, y, y + ffn, (size_t)ffn);
    const double e = rel_err_f(got, y, (size_t)ffn);
    CHECK_MSG(e < 2e-5, "gemv geglu %dx%d: %.2e", rows, cols, e);
    free(got), free(w), free(x), free(y), free(gu), free(ref), free(kc.scratch);
    cudaFree(dgu), cudaFree(dw), cudaFree(dx), cudaFree(dy);
}

/* rmsnorm without weights converts (OLMo 2's unnormed inputs); embed scales by its multiplier. */
static void check_convert_and_embed(launch_ctx *lc)
{
    const int n = 3, dim = 200, vocab = 7;
    float *x = malloc((size_t)n * dim * sizeof *x), *emb = malloc((size_t)vocab * dim * sizeof *emb);
    fill(x, (size_t)n * dim, 3.0), fill(emb, (size_t)vocab * dim, 1.0);
    float *dx = dev_copy(x, (size_t)n * dim), *demb = dev_copy(emb, (size_t)vocab * dim);
    void *dy = dev_alloc((size_t)n * dim * 2);
    CHECK_MSG(launch_rmsnorm(lc, dy, K_BF16, dx, NULL, n, dim, 1e-5f) == 0, "%s", lc->err);
    float *got = host_f32(dy, K_BF16, (size_t)n * dim);
    double e = rel_err_f(got, x, (size_t)n * dim);
    CHECK_MSG(e < out_tol(K_BF16), "rmsnorm without weights: %.2e", e);
    free(got);
    const int32_t ids[3] = {4, 0, 6};
    int32_t *dids = dev_from(ids, sizeof ids);
    CHECK_MSG(launch_embed(lc, dx, demb, K_F32, dids, n, dim, 59.75f) == 0, "%s", lc->err);
    got = host_f32(dx, K_F32, (size_t)n * dim);
    for (int t = 0; t < n; t++)
        for (int i = 0; i < dim; i++)
            x[(size_t)t * dim + i] = emb[(size_t)ids[t] * dim + i] * 59.75f;
    e = rel_err_f(got, x, (size_t)n * dim);
    CHECK_MSG(e == 0.0, "embed times 59.75: %.2e", e);
    free(got), free(x), free(emb);
    cudaFree(dx), cudaFree(demb), cudaFree(dy), cudaFree(dids);
}

/* Caches of positions [0, total) on the host as k_kv_store writes them, uploaded (rows [0, upload)). */
typedef struct {
    k_kv h;
    void *d;
    float *ds;
} cache;

static void cache_make(cache *c, k_kv_type t, const float *vals, int total, int nkv, int hd, int upload)
{
    const size_t rows = (size_t)total * nkv, es = k_kv_elem_size(t);
    c->h = (k_kv){malloc(rows * hd * es), k_kv_has_scales(t) ? malloc(rows * sizeof(float)) : NULL, t, 0};
    k_ctx kc = cpu_ctx(hd);
    k_kv_store(&kc, &c->h, vals, total, 0, nkv, hd);
    free(kc.scratch);
    c->d = dev_alloc(rows * hd * es);
    c->ds = c->h.scales ? dev_alloc(rows * sizeof(float)) : NULL;
    cudaMemcpy(c->d, c->h.data, (size_t)upload * nkv * hd * es, cudaMemcpyHostToDevice);
    if (c->ds)
        cudaMemcpy(c->ds, c->h.scales, (size_t)upload * nkv * sizeof(float), cudaMemcpyHostToDevice);
}

static void cache_free(cache *c)
{
    free(c->h.data), free(c->h.scales);
    cudaFree(c->d), cudaFree(c->ds);
}

static const char *kv_name(k_kv_type t)
{
    static const char *const n[] = {"?", "f32", "f16", "bf16", "int8", "fp8"};
    return n[t];
}

/* Prefill attention with a score scale and a soft cap against k_attention_kv_ex on the same cache. */
static void check_prefill(launch_ctx *lc, k_kv_type kvt, int nh, int nkv, int hd, int n, int pos0, int window,
                          float scale, float cap)
{
    const int total = pos0 + n, kvd = nkv * hd;
    float *kv = malloc((size_t)total * kvd * sizeof *kv), *vv = malloc((size_t)total * kvd * sizeof *vv);
    float *q = malloc((size_t)n * nh * hd * sizeof *q), *ref = malloc((size_t)n * nh * hd * sizeof *ref);
    fill(kv, (size_t)total * kvd, 1.5), fill(vv, (size_t)total * kvd, 1.0), fill(q, (size_t)n * nh * hd, 1.5);
    cache K, V;
    cache_make(&K, kvt, kv, total, nkv, hd, total);
    cache_make(&V, kvt, vv, total, nkv, hd, total);
    float *dq = dev_copy(q, (size_t)n * nh * hd), *dout = dev_alloc((size_t)n * nh * hd * sizeof(float));
    const int rc = launch_attention_prefill_ex(lc, dout, K_F32, dq, K.d, V.d, K.ds, V.ds, kvt, n, pos0, nh, nkv, hd,
                                               window, 0, scale, cap);
    if (rc != 0 && strstr(lc->err, "shared memory")) { /* head_dim 256 below Hopper's shared memory */
        printf("test_arch_cuda: prefill head_dim %d refused here: %s\n", hd, lc->err);
    } else {
        CHECK_MSG(rc == 0, "%s", lc->err);
        float *got = host_f32(dout, K_F32, (size_t)n * nh * hd);
        k_ctx kc = cpu_ctx(hd);
        k_attention_kv_ex(&kc, ref, q, &K.h, &V.h, n, pos0, nh, nkv, hd, window, scale > 0 ? scale : 1.0f / sqrtf((float)hd),
                          cap);
        const double e = rel_err_f(got, ref, (size_t)n * nh * hd);
        const double tol = k_kv_has_scales(kvt) ? 5e-4 : 5e-5;
        CHECK_MSG(e < tol, "prefill %s heads %d/%d hd %d n %d pos0 %d window %d scale %g cap %g: %.2e", kv_name(kvt),
                  nh, nkv, hd, n, pos0, window, (double)scale, (double)cap, e);
        free(got), free(kc.scratch);
    }
    free(kv), free(vv), free(q), free(ref), cache_free(&K), cache_free(&V);
    cudaFree(dq), cudaFree(dout);
}

/*
 * Decode with the rope step folded in: position pos's q, k and v from a
 * q/k/v row, RoPE on the first rot elements (tables [ctx, rot/2]), the new
 * k and v into the cache, then attention with the score scale and cap,
 * against the CPU (k_rope_ex, k_kv_store, k_attention_kv_ex). stream: the
 * long-context kernel (which hands shapes it does not serve to the staged
 * one).
 */
static void check_decode(launch_ctx *lc, bool stream, k_kv_type kvt, int nh, int nkv, int hd, int rot, int pos,
                         int window, float scale, float cap, int splits)
{
    const int ctx = pos + 1, kvd = nkv * hd, width = (nh + 2 * nkv) * hd, half = (rot ? rot : hd) / 2;
    float *kv = malloc((size_t)ctx * kvd * sizeof *kv), *vv = malloc((size_t)ctx * kvd * sizeof *vv);
    float *qkv = malloc((size_t)width * sizeof *qkv), *ref = malloc((size_t)nh * hd * sizeof *ref);
    float *cs = malloc((size_t)ctx * half * sizeof *cs), *sn = malloc((size_t)ctx * half * sizeof *sn);
    fill(kv, (size_t)ctx * kvd, 1.5), fill(vv, (size_t)ctx * kvd, 1.0), fill(qkv, (size_t)width, 1.5);
    for (int p = 0; p < ctx; p++)
        for (int i = 0; i < half; i++) {
            const double ang = p * pow(10000.0, -2.0 * i / (2 * half));
            cs[(size_t)p * half + i] = (float)cos(ang);
            sn[(size_t)p * half + i] = (float)sin(ang);
        }
    cache K, V; /* rows [0, pos) uploaded; the kernel writes row pos */
    cache_make(&K, kvt, kv, ctx, nkv, hd, pos);
    cache_make(&V, kvt, vv, ctx, nkv, hd, pos);
    float *dqkv = dev_copy(qkv, (size_t)width), *dcs = dev_copy(cs, (size_t)ctx * half);
    float *dsn = dev_copy(sn, (size_t)ctx * half), *dout = dev_alloc((size_t)nh * hd * sizeof(float));
    float *part = dev_alloc((size_t)nkv * 32 * ((size_t)(nh / nkv) * hd + 2 * (nh / nkv)) * sizeof(float));
    unsigned *count = dev_alloc((size_t)nkv * sizeof(unsigned));
    cudaMemset(count, 0, (size_t)nkv * sizeof(unsigned));
    int *dpos = dev_from(&pos, sizeof pos);
    rope_qkv_args a = {.qkv = dqkv, .eps = 1e-6f, .cos = dcs, .sin = dsn, .k_cache = K.d, .v_cache = V.d,
                       .k_scale = K.ds, .v_scale = V.ds, .kvt = kvt, .pos0 = dpos, .n = 1, .n_heads = nh,
                       .n_kv_heads = nkv, .head_dim = hd, .rotary_dim = rot, .score_scale = scale, .softcap = cap,
                       .part = part, .count = count};
    const int rc = stream ? launch_attention_decode_stream(lc, &a, dout, window, splits)
                          : launch_attention_decode(lc, &a, dout, window, splits);
    if (rc != 0 && strstr(lc->err, "shared memory")) {
        printf("test_arch_cuda: decode head_dim %d refused here: %s\n", hd, lc->err);
    } else {
        CHECK_MSG(rc == 0, "%s", lc->err);
        float *got = host_f32(dout, K_F32, (size_t)nh * hd);
        k_ctx kc = cpu_ctx(width);
        float *q = qkv, *k = qkv + (size_t)nh * hd, *v = k + kvd;
        k_rope_ex(&kc, q, 1, nh, hd, rot ? rot : hd, &pos, cs, sn);
        k_rope_ex(&kc, k, 1, nkv, hd, rot ? rot : hd, &pos, cs, sn);
        k_kv_store(&kc, &K.h, k, 1, pos, nkv, hd);
        k_kv_store(&kc, &V.h, v, 1, pos, nkv, hd);
        k_attention_kv_ex(&kc, ref, q, &K.h, &V.h, 1, pos, nh, nkv, hd, window,
                          scale > 0 ? scale : 1.0f / sqrtf((float)hd), cap);
        const double e = rel_err_f(got, ref, (size_t)nh * hd);
        /* The new k row: rounded to the cache's type on both sides, from fp32 values that may differ in the
         * last bit (fused multiply-adds): one step of the type, then through the softmax. */
        const double tol = kvt == K_KV_F32 ? 5e-5 : kvt == K_KV_F16 ? 3e-3 : kvt == K_KV_BF16 ? 2e-2 : 2e-2;
        CHECK_MSG(e < tol, "decode%s %s heads %d/%d hd %d rot %d pos %d window %d scale %g cap %g splits %d: %.2e",
                  stream ? " (stream)" : "", kv_name(kvt), nh, nkv, hd, rot, pos, window, (double)scale,
                  (double)cap, splits, e);
        free(got), free(kc.scratch);
    }
    free(kv), free(vv), free(qkv), free(ref), free(cs), free(sn), cache_free(&K), cache_free(&V);
    cudaFree(dqkv), cudaFree(dcs), cudaFree(dsn), cudaFree(dout), cudaFree(part), cudaFree(count), cudaFree(dpos);
}

int main(void)
{
    launch_ctx lc;
    const int skip = cuda_test_setup("test_arch_cuda", &lc);
    if (skip)
        return skip;
    test_rng_state = 36; /* inputs of its own, not those of the other tests */
    for (int norm = 0; norm < 2; norm++) {
        check_residual_add(&lc, 3, 64, norm, 1.0f);
        check_residual_add(&lc, 5, 2304, norm, 0.22f);
    }
    check_logits_scale(&lc, 256000, 0.25f, 0.0f);
    check_logits_scale(&lc, 1000, 1.0f, 30.0f);
    check_logits_scale(&lc, 777, 0.5f, 10.0f);
    check_qk_norm_whole(&lc, 4, 4, 2, 16, false);
    check_qk_norm_whole(&lc, 3, 32, 8, 128, true);
    check_geglu(&lc, 3, 64, 32);
    check_geglu(&lc, 2, 1000, 512);
    check_convert_and_embed(&lc);

    /* Prefill: Granite's scale, Gemma 2's cap (small, so that it bites) and window, at head dims 16, 96 (the
     * tensor-core path for 16-bit caches) and 256 (the CUDA-core path). */
    const k_kv_type kvts[] = {K_KV_F32, K_KV_F16, K_KV_BF16, K_KV_INT8};
    for (size_t t = 0; t < sizeof kvts / sizeof kvts[0]; t++) {
        check_prefill(&lc, kvts[t], 4, 2, 16, 50, 0, 0, 0.7f, 0.0f);
        check_prefill(&lc, kvts[t], 4, 2, 16, 50, 0, 8, 0.125f, 2.0f);
        check_prefill(&lc, kvts[t], 8, 2, 96, 70, 10, 0, 0.0f, 0.0f);
        check_prefill(&lc, kvts[t], 8, 4, 96, 33, 5, 0, 0.2f, 5.0f);
        check_prefill(&lc, kvts[t], 2, 1, 256, 40, 3, 8, 0.125f, 2.0f);
    }
    /* Decode, both kernels: scale and cap; Phi-3's partial rotary (96 of which 72 rotate, 16 of which 12);
     * Gemma's head_dim 256 with a window. */
    for (int s = 0; s < 2; s++)
        for (size_t t = 0; t < sizeof kvts / sizeof kvts[0]; t++) {
            check_decode(&lc, s, kvts[t], 4, 2, 16, 12, 40, 0, 0.0f, 0.0f, 2);
            check_decode(&lc, s, kvts[t], 4, 2, 16, 0, 300, 0, 0.7f, 0.0f, 4);
            check_decode(&lc, s, kvts[t], 32, 8, 96, 72, 700, 0, 0.0f, 0.0f, 8);
            check_decode(&lc, s, kvts[t], 16, 8, 256, 0, 500, 8, 0.0625f, 2.0f, 4);
            check_decode(&lc, s, kvts[t], 8, 4, 256, 0, 1200, 0, 0.0625f, 50.0f, 16);
            check_decode(&lc, s, kvts[t], 8, 4, 128, 0, 900, 0, 0.1f, 3.0f, 8);
            check_decode(&lc, s, kvts[t], 12, 4, 128, 0, 900, 0, 0.1f, 3.0f, 8); /* a group of 3 with a cap: staged */
        }
    return test_finish("test_arch_cuda");
}
