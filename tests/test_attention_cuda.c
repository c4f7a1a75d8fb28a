/*
 * test_attention_cuda.c: the attention launchers against the CPU's
 * (kernels.h), for every KV cache type: rope_qkv writing the cache rows,
 * decode attention (the cluster merge and the portable one, splits 1-16,
 * windows, GQA groups to 32) and prefill attention (tensor cores and CUDA
 * cores), on fresh random inputs with the outputs and the cache poisoned
 * with NaN first. The CPU reference reads the cache as k_kv_store wrote
 * it, so the comparison measures the kernel, not the cache's rounding.
 * Sliding-window rings (position p at row p % ring): rope_qkv writing a
 * wrapping pass, prefill attention over a ring giving the whole cache's
 * bits; decode over a ring (check_decode_ring), the cluster merge and the
 * portable one.
 * Skips (77) without a GPU.
 */
#define _POSIX_C_SOURCE 200809L

#include "cuda_test_util.h"

/* ---- KV caches of every type (kernels.h's k_kv) ---- */

static const k_kv_type KV_TYPES[] = {K_KV_F32, K_KV_F16, K_KV_BF16, K_KV_INT8, K_KV_FP8};
static const char *kv_name(k_kv_type t)
{
    static const char *const n[] = {"?", "f32", "f16", "bf16", "int8", "fp8"};
    return n[t];
}
/* A cache row's error bound relative to the row's largest value: the type's rounding (one step). */
static double kv_tol(k_kv_type t)
{
    return t == K_KV_F32 ? 2e-5 : t == K_KV_F16 ? 2e-3 : t == K_KV_BF16 ? 1e-2 : t == K_KV_INT8 ? 8.5e-3 : 0.08;
}

/* A cache on the host as the CPU writes it (k_kv_store), and on the device. */
typedef struct {
    k_kv h;           /* host */
    void *d;          /* device data */
    float *d_scales;  /* device scales, or NULL */
    size_t rows;      /* positions * kv heads */
    int hd;
} test_kv;

static void kv_make(test_kv *t, k_kv_type type, int n_pos, int nkv, int hd)
{
    *t = (test_kv){0}; /* h.ring 0: a whole cache (the ring tests set it after) */
    t->rows = (size_t)n_pos * nkv;
    t->hd = hd;
    t->h.type = type;
    t->h.data = malloc(t->rows * hd * k_kv_elem_size(type));
    t->h.scales = k_kv_has_scales(type) ? malloc(t->rows * sizeof(float)) : NULL;
    t->d = dev_alloc(t->rows * hd * k_kv_elem_size(type));
    t->d_scales = t->h.scales ? dev_alloc(t->rows * sizeof(float)) : NULL;
    cudaMemset(t->d, 0xff, t->rows * hd * k_kv_elem_size(type)); /* poison (NaN for the float types) */
    if (t->d_scales)
        cudaMemset(t->d_scales, 0xff, t->rows * sizeof(float));
}

/* Store vals [n_pos, nkv, hd] from position 0 on the host, decode them back into vals (what the cache holds),
 * and copy rows [0, upload_rows) to the device. */
static void kv_fill(test_kv *t, float *vals, int n_pos, int nkv, size_t upload_rows)
{
    k_ctx kc = cpu_ctx(t->hd);
    k_kv_store(&kc, &t->h, vals, n_pos, 0, nkv, t->hd);
    for (size_t r = 0; r < t->rows; r++)
        k_kv_load(&t->h, r, t->hd, vals + r * t->hd);
    const size_t es = k_kv_elem_size(t->h.type);
    cudaMemcpy(t->d, t->h.data, upload_rows * t->hd * es, cudaMemcpyHostToDevice);
    if (t->d_scales)
        cudaMemcpy(t->d_scales, t->h.scales, upload_rows * sizeof(float), cudaMemcpyHostToDevice);
    free(kc.scratch);
}

/* Rows [r0, r0 + n) of the device cache, decoded as the CPU decodes them. */
static float *kv_read(const test_kv *t, size_t r0, size_t n)
{
    const size_t es = k_kv_elem_size(t->h.type);
    k_kv k = {malloc(n * t->hd * es), t->h.scales ? malloc(n * sizeof(float)) : NULL, t->h.type};
    cudaMemcpy(k.data, (const char *)t->d + r0 * t->hd * es, n * t->hd * es, cudaMemcpyDeviceToHost);
    if (k.scales)
        cudaMemcpy(k.scales, t->d_scales + r0, n * sizeof(float), cudaMemcpyDeviceToHost);
    float *out = malloc(n * t->hd * sizeof *out);
    for (size_t r = 0; r < n; r++)
        k_kv_load(&k, r, t->hd, out + r * t->hd);
    free(k.data), free(k.scales);
    return out;
}

static void kv_free(test_kv *t)
{
    free(t->h.data), free(t->h.scales);
    cudaFree(t->d), cudaFree(t->d_scales);
}


/* The nkv rows of positions p0 .. p0+n-1 of a device cache, decoded, from row p (p % ring in a ring). */
static float *kv_read_pos(const test_kv *t, int p0, int n, int nkv, int ring)
{
    float *out = malloc((size_t)n * nkv * t->hd * sizeof *out);
    for (int i = 0; i < n; i++) {
        const int p = p0 + i, at = ring > 0 ? p % ring : p;
        float *r = kv_read(t, (size_t)at * nkv, (size_t)nkv);
        memcpy(out + (size_t)i * nkv * t->hd, r, (size_t)nkv * t->hd * sizeof *r);
        free(r);
    }
    return out;
}

/*
 * q/k/v post-processing: CPU bias + per-head RMSNorm + RoPE against
 * launch_rope_qkv, into a whole cache and into a sliding window's ring of
 * 8 rows (5 tokens at 14..18: rows 6, 7, 0, 1, 2; RoPE by position).
 */
/* Decode through the staged kernel, or (decode_stream) the streaming one of long contexts. */
static bool decode_stream;
static int launch_decode(launch_ctx *lc, const rope_qkv_args *a, float *out, int window, int splits)
{
    return decode_stream ? launch_attention_decode_stream(lc, a, out, window, splits)
                         : launch_attention_decode(lc, a, out, window, splits);
}

static void test_rope_qkv(launch_ctx *lc)
{
    static const int cfg[][4] = {/* heads, kv heads, head_dim, qk norm */
                                 {8, 4, 8, 0}, {4, 2, 16, 1}, {4, 2, 32, 1}, {32, 8, 128, 0}, {16, 16, 64, 1}, {4, 1, 256, 1}};
    for (int ti = 0; ti < 10; ti++) /* each type into a whole cache, then into a ring */
        for (size_t ci = 0; ci < sizeof cfg / sizeof cfg[0]; ci++) {
            const k_kv_type kvt = KV_TYPES[ti % 5];
            const int ring = ti < 5 ? 0 : 8;
            const int nh = cfg[ci][0], nkv = cfg[ci][1], hd = cfg[ci][2], norm = cfg[ci][3];
            const int n = ring ? 5 : 3, pos0 = ring ? 14 : 17, ctx = 40, half = hd / 2, width = (nh + 2 * nkv) * hd;
            const int kvd = nkv * hd, rows = ring ? ring : ctx;
            float *qkv = malloc((size_t)n * width * sizeof *qkv), *bias = malloc((size_t)width * sizeof *bias);
            float *qn = malloc((size_t)hd * sizeof *qn), *kn = malloc((size_t)hd * sizeof *kn);
            float *cs = malloc((size_t)ctx * half * sizeof *cs), *sn = malloc((size_t)ctx * half * sizeof *sn);
            fill(qkv, (size_t)n * width, 2.0);
            fill(bias, (size_t)width, 0.5);
            fill(qn, (size_t)hd, 1.0);
            fill(kn, (size_t)hd, 1.0);
            for (int p = 0; p < ctx; p++)
                for (int i = 0; i < half; i++) {
                    double ang = p * pow(10000.0, -2.0 * i / hd);
                    cs[p * half + i] = (float)cos(ang);
                    sn[p * half + i] = (float)sin(ang);
                }
            int pos = pos0;
            float *dqkv = dev_copy(qkv, (size_t)n * width), *db = dev_copy(bias, (size_t)width);
            float *dqn = dev_copy(qn, (size_t)hd), *dkn = dev_copy(kn, (size_t)hd);
            float *dcs = dev_copy(cs, (size_t)ctx * half), *dsn = dev_copy(sn, (size_t)ctx * half);
            int *dpos = dev_from(&pos, sizeof pos);
            float *dq = dev_alloc((size_t)n * nh * hd * sizeof(float));
            test_kv K, V;
            kv_make(&K, kvt, rows, nkv, hd);
            kv_make(&V, kvt, rows, nkv, hd);
            rope_qkv_args a = {.qkv = dqkv, .bias = db, .q_norm = norm ? dqn : NULL, .k_norm = norm ? dkn : NULL,
                               .eps = 1e-6f, .cos = dcs, .sin = dsn, .q_out = dq, .k_cache = K.d, .v_cache = V.d,
                               .k_scale = K.d_scales, .v_scale = V.d_scales, .kvt = kvt, .ring = ring, .pos0 = dpos,
                               .n = n, .n_heads = nh, .n_kv_heads = nkv, .head_dim = hd};
            CHECK_MSG(launch_rope_qkv(lc, &a) == 0, "%s", lc->err);
            /* CPU */
            k_ctx kc = cpu_ctx(hd);
            float *rq = malloc((size_t)n * nh * hd * sizeof *rq), *rk = malloc((size_t)n * kvd * sizeof *rk);
            float *rv = malloc((size_t)n * kvd * sizeof *rv);
            int poss[5] = {pos0, pos0 + 1, pos0 + 2, pos0 + 3, pos0 + 4};
            for (int t = 0; t < n; t++)
                for (int j = 0; j < width; j++) {
                    float v = qkv[(size_t)t * width + j] + bias[j];
                    if (j < nh * hd)
                        rq[(size_t)t * nh * hd + j] = v;
                    else if (j < nh * hd + kvd)
                        rk[(size_t)t * kvd + j - nh * hd] = v;
                    else
                        rv[(size_t)t * kvd + j - nh * hd - kvd] = v;
                }
            if (norm) {
                k_weight wq = {qn, K_F32, 1, hd}, wk = {kn, K_F32, 1, hd};
                k_rmsnorm(&kc, rq, rq, n * nh, hd, &wq, 1e-6f);
                k_rmsnorm(&kc, rk, rk, n * nkv, hd, &wk, 1e-6f);
            }
            k_rope(&kc, rq, n, nh, hd, poss, cs, sn);
            k_rope(&kc, rk, n, nkv, hd, poss, cs, sn);
            float *gq = host_f32(dq, K_F32, (size_t)n * nh * hd);
            float *gk = kv_read_pos(&K, pos0, n, nkv, ring), *gv = kv_read_pos(&V, pos0, n, nkv, ring);
            double eq = rel_err_f(gq, rq, (size_t)n * nh * hd), ek = rel_err_f(gk, rk, (size_t)n * kvd);
            double ev = rel_err_f(gv, rv, (size_t)n * kvd);
            CHECK_MSG(eq < 2e-5 && ek < kv_tol(kvt) && ev < kv_tol(kvt),
                      "rope_qkv %s heads %d/%d hd %d norm %d ring %d: q %.2e k %.2e v %.2e", kv_name(kvt), nh, nkv,
                      hd, norm, ring, eq, ek, ev);
            /* Rows other than the new ones are untouched (still the poison): row 0, or the ring's row 3. */
            float *before = kv_read(&K, (size_t)(ring ? 3 : 0) * nkv, (size_t)nkv);
            CHECK(before[0] != before[0]);
            free(before);
            free(gq), free(gk), free(gv), free(rq), free(rk), free(rv), free(kc.scratch);
            free(qkv), free(bias), free(qn), free(kn), free(cs), free(sn);
            cudaFree(dqkv), cudaFree(db), cudaFree(dqn), cudaFree(dkn), cudaFree(dcs), cudaFree(dsn);
            cudaFree(dpos), cudaFree(dq), kv_free(&K), kv_free(&V);
        }
}

/* Shared memory below Hopper's (227 KB a block): a capability where some
 * test shapes are refused (with a message) rather than launched. */
#define LESSER_SMEM (227 * 1024)

/* Attention, decode (split) and prefill (tiled), against k_attention on the same (rounded) cache. */
static void check_attention(launch_ctx *lc, k_kv_type kvt, k_dtype ot, int nh, int nkv, int hd, int n, int pos0,
                            int window)
{
    const int total = pos0 + n, kvd = nkv * hd;
    float *kv = malloc((size_t)total * kvd * sizeof *kv), *vv = malloc((size_t)total * kvd * sizeof *vv);
    fill(kv, (size_t)total * kvd, 1.5);
    fill(vv, (size_t)total * kvd, 1.0);
    test_kv K, V; /* the cache as stored; kv and vv become what it holds */
    kv_make(&K, kvt, total, nkv, hd);
    kv_make(&V, kvt, total, nkv, hd);
    kv_fill(&K, kv, total, nkv, K.rows);
    kv_fill(&V, vv, total, nkv, V.rows);
    float *q = malloc((size_t)n * nh * hd * sizeof *q);
    fill(q, (size_t)n * nh * hd, 1.5);
    float *dq = dev_copy(q, (size_t)n * nh * hd);
    void *dout = dev_alloc((size_t)n * nh * hd * k_dtype_size(ot));
    int rc = launch_attention_prefill(lc, dout, ot, dq, K.d, V.d, K.d_scales, V.d_scales, kvt, n, pos0, nh, nkv, hd,
                                      window, 0);
    CHECK_MSG(rc == 0, "%s", lc->err); /* every head_dim fits Turing's 64 KiB (attention_prefill.cu) */
    float *got = host_f32(dout, ot, (size_t)n * nh * hd), *ref = malloc((size_t)n * nh * hd * sizeof *ref);
    k_ctx kc = cpu_ctx(hd);
    k_attention(&kc, ref, q, kv, vv, n, pos0, nh, nkv, hd, window);
    double e = rel_err_f(got, ref, (size_t)n * nh * hd);
    /* The tensor-core path rounds an int8/fp8 cache's V once, as an fp16 one (its scale goes on the weights:
     * attention_prefill.cu's tc_convert); up to 2.5e-4 where a window of 1 makes the output a query's own V row
     * (6.9e-4 when V was multiplied by its scale in fp16). */
    const double tol = ot != K_F32 ? out_tol(ot) : k_kv_has_scales(kvt) ? 5e-4 : 5e-5;
    CHECK_MSG(e < tol, "attention prefill %s->%s heads %d/%d hd %d n %d pos0 %d window %d: %.2e", kv_name(kvt),
              dtype_name(ot), nh, nkv, hd, n, pos0, window, e);
    free(got), free(ref), free(kc.scratch), free(kv), free(vv), free(q), kv_free(&K), kv_free(&V);
    cudaFree(dq), cudaFree(dout);
}

/* ---- sliding-window rings: position p at row p % ring ---- */

/* Store vals [total, nkv, hd] (positions 0 .. total-1) on the host into t as a ring of `ring` rows, a ring's
 * length at a time (later positions overwrite earlier ones' rows), and upload its rows. */
static void kv_fill_ring(test_kv *t, const float *vals, int total, int nkv, int ring)
{
    k_ctx kc = cpu_ctx(t->hd);
    t->h.ring = ring;
    for (int p = 0; p < total; p += ring) {
        const int m = total - p < ring ? total - p : ring;
        k_kv_store(&kc, &t->h, vals + (size_t)p * nkv * t->hd, m, p, nkv, t->hd);
    }
    const size_t rows = (size_t)(total < ring ? total : ring) * nkv, es = k_kv_elem_size(t->h.type);
    cudaMemcpy(t->d, t->h.data, rows * t->hd * es, cudaMemcpyHostToDevice);
    if (t->d_scales)
        cudaMemcpy(t->d_scales, t->h.scales, rows * sizeof(float), cudaMemcpyHostToDevice);
    free(kc.scratch);
}

/*
 * Prefill attention over a ring of `ring` rows holding the last of pos0 + n
 * positions: the same bits as over the whole cache (the tiles visit the
 * same keys in the same order, from other rows), and the CPU's result
 * within check_attention's tolerance.
 */
static void check_attention_ring(launch_ctx *lc, k_kv_type kvt, k_dtype ot, int nh, int nkv, int hd, int n, int pos0,
                                 int window, int ring)
{
    const int total = pos0 + n, kvd = nkv * hd;
    const size_t kn = (size_t)total * kvd, qn = (size_t)n * nh * hd;
    float *kv = malloc(kn * sizeof *kv), *vv = malloc(kn * sizeof *vv), *q = malloc(qn * sizeof *q);
    fill(kv, kn, 1.5);
    fill(vv, kn, 1.0);
    fill(q, qn, 1.5);
    test_kv KW, VW, KR, VR;
    kv_make(&KR, kvt, ring, nkv, hd);
    kv_make(&VR, kvt, ring, nkv, hd);
    kv_fill_ring(&KR, kv, total, nkv, ring);
    kv_fill_ring(&VR, vv, total, nkv, ring);
    kv_make(&KW, kvt, total, nkv, hd); /* the whole cache; kv and vv become what it holds */
    kv_make(&VW, kvt, total, nkv, hd);
    kv_fill(&KW, kv, total, nkv, KW.rows);
    kv_fill(&VW, vv, total, nkv, VW.rows);
    float *dq = dev_copy(q, qn);
    void *dring = dev_alloc(qn * k_dtype_size(ot)), *dwhole = dev_alloc(qn * k_dtype_size(ot));
    int rc = launch_attention_prefill(lc, dring, ot, dq, KR.d, VR.d, KR.d_scales, VR.d_scales, kvt, n, pos0, nh, nkv,
                                      hd, window, ring);
    if (rc == 0)
        rc = launch_attention_prefill(lc, dwhole, ot, dq, KW.d, VW.d, KW.d_scales, VW.d_scales, kvt, n, pos0, nh, nkv,
                                      hd, window, 0);
    CHECK_MSG(rc == 0, "%s", lc->err);
    const size_t ob = qn * k_dtype_size(ot);
    unsigned char *a = malloc(ob), *b = malloc(ob);
    CHECK(cudaMemcpy(a, dring, ob, cudaMemcpyDeviceToHost) == cudaSuccess &&
          cudaMemcpy(b, dwhole, ob, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK_MSG(memcmp(a, b, ob) == 0, "attention prefill %s->%s over a ring of %d (n %d pos0 %d window %d hd %d): "
                                     "not the whole cache's bits",
              kv_name(kvt), dtype_name(ot), ring, n, pos0, window, hd);
    free(a), free(b);
    float *got = host_f32(dring, ot, qn), *ref = malloc(qn * sizeof *ref);
    k_ctx kc = cpu_ctx(hd);
    k_attention(&kc, ref, q, kv, vv, n, pos0, nh, nkv, hd, window);
    const double e = rel_err_f(got, ref, qn);
    const double tol = ot != K_F32 ? out_tol(ot) : k_kv_has_scales(kvt) ? 5e-4 : 5e-5;
    CHECK_MSG(e < tol, "attention prefill %s->%s ring %d heads %d/%d hd %d n %d pos0 %d window %d: %.2e",
              kv_name(kvt), dtype_name(ot), ring, nh, nkv, hd, n, pos0, window, e);
    free(got), free(ref), free(kc.scratch);
    free(kv), free(vv), free(q), kv_free(&KR), kv_free(&VR), kv_free(&KW), kv_free(&VW);
    cudaFree(dq), cudaFree(dring), cudaFree(dwhole);
}

/*
 * Decode over a ring: the kernel writes the new token's k and v at row
 * pos % ring (poisoned before) and attends over the window, which the
 * ring holds (ring >= window).
 */
static void check_decode_ring(launch_ctx *lc, k_kv_type kvt, int nh, int nkv, int hd, int pos, int window, int ring,
                              int splits)
{
    if (test_quick() && pos > 1100)
        return;
    const int total = pos + 1, kvd = nkv * hd, half = hd / 2, width = (nh + 2 * nkv) * hd, slot = pos % ring;
    float *kv = malloc((size_t)total * kvd * sizeof *kv), *vv = malloc((size_t)total * kvd * sizeof *vv);
    fill(kv, (size_t)total * kvd, 1.5);
    fill(vv, (size_t)total * kvd, 1.0);
    float *qkv = malloc((size_t)width * sizeof *qkv), *bias = malloc((size_t)width * sizeof *bias);
    float *cs = malloc((size_t)total * half * sizeof *cs), *sn = malloc((size_t)total * half * sizeof *sn);
    fill(qkv, (size_t)width, 2.0);
    fill(bias, (size_t)width, 0.5);
    for (int p = 0; p < total; p++)
        for (int i = 0; i < half; i++) {
            double ang = p * pow(500000.0, -2.0 * i / hd);
            cs[p * half + i] = (float)cos(ang);
            sn[p * half + i] = (float)sin(ang);
        }
    /* Device: the ring of positions 0 .. pos-1, row pos % ring poisoned (the kernel must write it). */
    test_kv K, V, KW, VW;
    kv_make(&K, kvt, ring, nkv, hd);
    kv_make(&V, kvt, ring, nkv, hd);
    kv_fill_ring(&K, kv, pos, nkv, ring);
    kv_fill_ring(&V, vv, pos, nkv, ring);
    const size_t es = k_kv_elem_size(kvt);
    cudaMemset((char *)K.d + (size_t)slot * kvd * es, 0xff, (size_t)kvd * es);
    cudaMemset((char *)V.d + (size_t)slot * kvd * es, 0xff, (size_t)kvd * es);
    if (K.d_scales) {
        cudaMemset(K.d_scales + (size_t)slot * nkv, 0xff, (size_t)nkv * sizeof(float));
        cudaMemset(V.d_scales + (size_t)slot * nkv, 0xff, (size_t)nkv * sizeof(float));
    }
    /* Host: the whole cache, positions 0 .. pos-1 decoded into kv and vv (nothing uploaded). */
    kv_make(&KW, kvt, total, nkv, hd);
    kv_make(&VW, kvt, total, nkv, hd);
    kv_fill(&KW, kv, pos, nkv, 0);
    kv_fill(&VW, vv, pos, nkv, 0);
    float *dqkv = dev_copy(qkv, (size_t)width), *db = dev_copy(bias, (size_t)width);
    float *dcs = dev_copy(cs, (size_t)total * half), *dsn = dev_copy(sn, (size_t)total * half);
    int *dpos = dev_from(&pos, sizeof pos);
    float *dout = dev_alloc((size_t)nh * hd * sizeof(float));
    uint32_t *dmax = dev_alloc(sizeof(uint32_t));
    cudaMemset(dmax, 0, sizeof(uint32_t));
    const size_t part_n = (size_t)32 * (nh * hd + 2 * nh);
    float *dpart = dev_alloc(part_n * sizeof(float));
    unsigned *dcount = dev_alloc((size_t)nkv * sizeof(unsigned));
    cudaMemset(dpart, 0xff, part_n * sizeof(float));
    cudaMemset(dcount, 0, (size_t)nkv * sizeof(unsigned));
    rope_qkv_args a = {.out_max = dmax, .qkv = dqkv, .bias = db, .eps = 1e-6f, .cos = dcs, .sin = dsn,
                       .k_cache = K.d, .v_cache = V.d, .k_scale = K.d_scales, .v_scale = V.d_scales, .kvt = kvt,
                       .ring = ring, .pos0 = dpos, .n = 1, .n_heads = nh, .n_kv_heads = nkv, .head_dim = hd,
                       .part = dpart, .count = dcount};
    CHECK_MSG(launch_decode(lc, &a, dout, window, splits) == 0, "%s", lc->err);
    /* CPU: the new row as the whole cache stores it at pos, and attention over the whole cache. */
    k_ctx kc = cpu_ctx(hd);
    float *q = malloc((size_t)nh * hd * sizeof *q), *kn_row = kv + (size_t)pos * kvd, *vn_row = vv + (size_t)pos * kvd;
    for (int j = 0; j < width; j++) {
        const float v = qkv[j] + bias[j];
        if (j < nh * hd)
            q[j] = v;
        else if (j < nh * hd + kvd)
            kn_row[j - nh * hd] = v;
        else
            vn_row[j - nh * hd - kvd] = v;
    }
    int p1[1] = {pos};
    k_rope(&kc, q, 1, nh, hd, p1, cs, sn);
    k_rope(&kc, kn_row, 1, nkv, hd, p1, cs, sn);
    k_kv_store(&kc, &KW.h, kn_row, 1, pos, nkv, hd);
    k_kv_store(&kc, &VW.h, vn_row, 1, pos, nkv, hd);
    for (int h = 0; h < nkv; h++) {
        k_kv_load(&KW.h, (size_t)pos * nkv + h, hd, kn_row + (size_t)h * hd);
        k_kv_load(&VW.h, (size_t)pos * nkv + h, hd, vn_row + (size_t)h * hd);
    }
    float *ref = malloc((size_t)nh * hd * sizeof *ref);
    k_attention(&kc, ref, q, kv, vv, 1, pos, nh, nkv, hd, window);
    float *got = host_f32(dout, K_F32, (size_t)nh * hd);
    float *gk = kv_read(&K, (size_t)slot * nkv, (size_t)nkv), *gv = kv_read(&V, (size_t)slot * nkv, (size_t)nkv);
    const double e = rel_err_f(got, ref, (size_t)nh * hd), ek = rel_err_f(gk, kn_row, (size_t)kvd);
    const double ev = rel_err_f(gv, vn_row, (size_t)kvd);
    const double out_bound = kvt == K_KV_F32 ? 5e-5 : kvt == K_KV_FP8 ? 2e-2 : kvt == K_KV_INT8 ? 1e-2 : 2e-3;
    CHECK_MSG(e < out_bound && ek < kv_tol(kvt) && ev < kv_tol(kvt),
              "attention decode %s ring %d heads %d/%d hd %d pos %d window %d splits %d: out %.2e k %.2e v %.2e",
              kv_name(kvt), ring, nh, nkv, hd, pos, window, splits, e, ek, ev);
    free(q), free(ref), free(got), free(gk), free(gv), free(kc.scratch), free(kv), free(vv);
    free(qkv), free(bias), free(cs), free(sn);
    kv_free(&K), kv_free(&V), kv_free(&KW), kv_free(&VW);
    cudaFree(dqkv), cudaFree(db), cudaFree(dcs), cudaFree(dsn), cudaFree(dpos), cudaFree(dout), cudaFree(dmax);
    cudaFree(dpart), cudaFree(dcount);
}

/* The ring cases of one KV type on the paths lc takes. */
static void test_ring(launch_ctx *lc, k_kv_type kvt, k_dtype act)
{
    /* prefill: wrapping tiles, the smallest ring a pass allows (window + n - 1), the session's (window +
     * n_batch + 1), one token, tensor-core shapes (head_dim 64, 128) and CUDA-core ones (32, 256, fp32) */
    check_attention_ring(lc, kvt, act, 4, 2, 32, 20, 100, 8, 8 + 20 + 1);
    check_attention_ring(lc, kvt, K_F32, 4, 2, 64, 13, 77, 16, 16 + 13 - 1);
    check_attention_ring(lc, kvt, act, 8, 2, 128, 64, 300, 100, 100 + 64 + 1);
    check_attention_ring(lc, kvt, K_F32, 8, 8, 128, 130, 1000, 40, 40 + 130 - 1);
    check_attention_ring(lc, kvt, K_F32, 4, 4, 64, 1, 500, 32, 32 + 1 + 1);
    check_attention_ring(lc, kvt, act, 8, 2, 256, 40, 90, 16, 16 + 40 + 1);
    check_attention_ring(lc, kvt, K_F32, 4, 2, 64, 5, 3, 8, 8 + 5 + 1); /* the ring not yet full */
    check_decode_ring(lc, kvt, 4, 2, 32, 100, 8, 8 + 1 + 1, 3);
    check_decode_ring(lc, kvt, 32, 8, 128, 3999, 1000, 1000 + 512 + 1, 16);
    check_decode_ring(lc, kvt, 16, 16, 64, 700, 256, 256 + 2, 7);
    check_decode_ring(lc, kvt, 8, 2, 64, 5, 8, 12, 1); /* the ring not yet full */
}

/*
 * Decode: the q/k/v projection output of the new token goes in; the kernel
 * ropes it, stores the new k and v at row pos, and attends over 0 .. pos.
 * CPU: bias, per-head norm, k_rope, the new row rounded to the cache type,
 * k_attention.
 */
static void check_attention_decode(launch_ctx *lc, k_kv_type kvt, int nh, int nkv, int hd, int pos, int window,
                                   int splits, bool norm)
{
    if (test_quick() && pos > 1100)
        return;
    const int total = pos + 1, kvd = nkv * hd, half = hd / 2, width = (nh + 2 * nkv) * hd;
    float *kv = malloc((size_t)total * kvd * sizeof *kv), *vv = malloc((size_t)total * kvd * sizeof *vv);
    fill(kv, (size_t)total * kvd, 1.5);
    fill(vv, (size_t)total * kvd, 1.0);
    float *qkv = malloc((size_t)width * sizeof *qkv), *bias = malloc((size_t)width * sizeof *bias);
    float *qn = malloc((size_t)hd * sizeof *qn), *kn = malloc((size_t)hd * sizeof *kn);
    float *cs = malloc((size_t)total * half * sizeof *cs), *sn = malloc((size_t)total * half * sizeof *sn);
    fill(qkv, (size_t)width, 2.0);
    fill(bias, (size_t)width, 0.5);
    fill(qn, (size_t)hd, 1.0);
    fill(kn, (size_t)hd, 1.0);
    for (int p = 0; p < total; p++)
        for (int i = 0; i < half; i++) {
            double ang = p * pow(500000.0, -2.0 * i / hd);
            cs[p * half + i] = (float)cos(ang);
            sn[p * half + i] = (float)sin(ang);
        }
    /* Device: the cache without row pos (poisoned: the kernel must write it). */
    test_kv K, V;
    kv_make(&K, kvt, total, nkv, hd);
    kv_make(&V, kvt, total, nkv, hd);
    kv_fill(&K, kv, total, nkv, (size_t)pos * nkv);
    kv_fill(&V, vv, total, nkv, (size_t)pos * nkv);
    float *dqkv = dev_copy(qkv, (size_t)width), *db = dev_copy(bias, (size_t)width);
    float *dqn = dev_copy(qn, (size_t)hd), *dkn = dev_copy(kn, (size_t)hd);
    float *dcs = dev_copy(cs, (size_t)total * half), *dsn = dev_copy(sn, (size_t)total * half);
    int *dpos = dev_from(&pos, sizeof pos);
    float *dout = dev_alloc((size_t)nh * hd * sizeof(float));
    uint32_t *dmax = dev_alloc(sizeof(uint32_t));
    cudaMemset(dmax, 0, sizeof(uint32_t));
    /* The portable merge's partial results (poisoned) and counters (zero, as the session leaves them). */
    const size_t part_n = (size_t)32 * (nh * hd + 2 * nh);
    float *dpart = dev_alloc(part_n * sizeof(float));
    unsigned *dcount = dev_alloc((size_t)nkv * sizeof(unsigned));
    cudaMemset(dpart, 0xff, part_n * sizeof(float));
    cudaMemset(dcount, 0, (size_t)nkv * sizeof(unsigned));
    rope_qkv_args a = {.out_max = dmax, .qkv = dqkv, .bias = db, .q_norm = norm ? dqn : NULL, .k_norm = norm ? dkn : NULL,
                       .eps = 1e-6f, .cos = dcs, .sin = dsn, .k_cache = K.d, .v_cache = V.d,
                       .k_scale = K.d_scales, .v_scale = V.d_scales, .kvt = kvt,
                       .pos0 = dpos, .n = 1, .n_heads = nh, .n_kv_heads = nkv, .head_dim = hd,
                       .part = dpart, .count = dcount};
    const int rc = launch_decode(lc, &a, dout, window, splits);
    if (rc != 0 && strstr(lc->err, "shared memory") && lc->smem_max < LESSER_SMEM) {
        /* A shape beyond a lesser GPU's shared memory is refused with a message, not launched. */
        printf("test_kernels_cuda: refused at %zu bytes of shared memory: %s\n", lc->smem_max, lc->err);
        free(kv), free(vv), free(qkv), free(bias), free(qn), free(kn), free(cs), free(sn);
        kv_free(&K), kv_free(&V), cudaFree(dqkv), cudaFree(db), cudaFree(dqn), cudaFree(dkn), cudaFree(dcs);
        cudaFree(dsn), cudaFree(dpos), cudaFree(dout), cudaFree(dmax), cudaFree(dpart), cudaFree(dcount);
        return;
    }
    CHECK_MSG(rc == 0, "%s", lc->err);
    /* CPU */
    k_ctx kc = cpu_ctx(hd);
    float *q = malloc((size_t)nh * hd * sizeof *q), *kn_row = kv + (size_t)pos * kvd, *vn_row = vv + (size_t)pos * kvd;
    for (int j = 0; j < width; j++) {
        float v = qkv[j] + bias[j];
        if (j < nh * hd)
            q[j] = v;
        else if (j < nh * hd + kvd)
            kn_row[j - nh * hd] = v;
        else
            vn_row[j - nh * hd - kvd] = v;
    }
    if (norm) {
        k_weight wq = {qn, K_F32, 1, hd}, wk = {kn, K_F32, 1, hd};
        k_rmsnorm(&kc, q, q, nh, hd, &wq, 1e-6f);
        k_rmsnorm(&kc, kn_row, kn_row, nkv, hd, &wk, 1e-6f);
    }
    int p1[1] = {pos};
    k_rope(&kc, q, 1, nh, hd, p1, cs, sn);
    k_rope(&kc, kn_row, 1, nkv, hd, p1, cs, sn);
    /* The new row as the CPU stores it, and back as the cache holds it. */
    k_kv_store(&kc, &K.h, kn_row, 1, pos, nkv, hd);
    k_kv_store(&kc, &V.h, vn_row, 1, pos, nkv, hd);
    for (int h = 0; h < nkv; h++) {
        k_kv_load(&K.h, (size_t)pos * nkv + h, hd, kn_row + (size_t)h * hd);
        k_kv_load(&V.h, (size_t)pos * nkv + h, hd, vn_row + (size_t)h * hd);
    }
    float *ref = malloc((size_t)nh * hd * sizeof *ref);
    k_attention(&kc, ref, q, kv, vv, 1, pos, nh, nkv, hd, window);
    float *got = host_f32(dout, K_F32, (size_t)nh * hd);
    float *gk = kv_read(&K, (size_t)pos * nkv, (size_t)nkv), *gv = kv_read(&V, (size_t)pos * nkv, (size_t)nkv);
    double e = rel_err_f(got, ref, (size_t)nh * hd), ek = rel_err_f(gk, kn_row, (size_t)kvd);
    double ev = rel_err_f(gv, vn_row, (size_t)kvd);
    /* The new row can differ by one rounding step of the cache type where the
     * fp32 values before rounding differ in the last bit (rarely: the int8
     * and fp8 rows are mostly identical codes, and the output as close as
     * the 16-bit types'). */
    const double out_bound = kvt == K_KV_F32 ? 5e-5 : kvt == K_KV_FP8 ? 2e-2 : kvt == K_KV_INT8 ? 1e-2 : 2e-3;
    CHECK_MSG(e < out_bound && ek < kv_tol(kvt) && ev < kv_tol(kvt),
              "attention decode %s heads %d/%d hd %d pos %d window %d splits %d norm %d: out %.2e k %.2e v %.2e",
              kv_name(kvt), nh, nkv, hd, pos, window, splits, norm, e, ek, ev);
    /* The output's maximum, posted for the next product's staging: exactly max |out|. */
    float want = 0.0f, have;
    for (int i = 0; i < nh * hd; i++)
        want = fmaxf(want, fabsf(got[i]));
    uint32_t hm;
    cudaMemcpy(&hm, dmax, sizeof hm, cudaMemcpyDeviceToHost);
    memcpy(&have, &hm, sizeof have);
    CHECK_MSG(have == want, "attention decode %s hd %d pos %d splits %d: output maximum %g, want %g", kv_name(kvt), hd,
              pos, splits, have, want);
    /* The counters are left at zero for the next launch. */
    unsigned *counts = malloc((size_t)nkv * sizeof *counts);
    cudaMemcpy(counts, dcount, (size_t)nkv * sizeof *counts, cudaMemcpyDeviceToHost);
    for (int h = 0; h < nkv; h++)
        CHECK_MSG(counts[h] == 0, "attention decode: kv head %d's counter left at %u", h, counts[h]);
    free(counts);
    cudaFree(dmax), cudaFree(dpart), cudaFree(dcount);
    free(q), free(ref), free(got), free(gk), free(gv), free(kc.scratch), free(kv), free(vv);
    free(qkv), free(bias), free(qn), free(kn), free(cs), free(sn);
    kv_free(&K), kv_free(&V), cudaFree(dqkv), cudaFree(db), cudaFree(dqn), cudaFree(dkn), cudaFree(dcs);
    cudaFree(dsn), cudaFree(dpos), cudaFree(dout);
}

static void test_attention_paths(launch_ctx *lc);

/* Each attention path the device can take: as dispatched, then the portable ones where those differ. */
static void test_attention(launch_ctx *lc)
{
    test_attention_paths(lc);
    if (lc->fast[K_OP_ATTN_CLUSTER] || lc->fast[K_OP_ATTN_PREFILL_TC] || lc->fast[K_OP_PDL]) {
        launch_ctx portable = *lc;
        portable.fast[K_OP_ATTN_CLUSTER] = portable.fast[K_OP_ATTN_PREFILL_TC] = portable.fast[K_OP_PDL] = false;
        printf("test_kernels_cuda: attention again on the portable paths\n");
        test_attention_paths(&portable);
    }
}

static void test_attention_paths(launch_ctx *lc)
{
    for (int ti = 0; ti < 5; ti++) {
        const k_kv_type kvt = KV_TYPES[ti];
        const k_dtype act = kvt == K_KV_F32 ? K_F32 : kvt == K_KV_BF16 ? K_BF16 : K_F16; /* the 16-bit output type */
        const bool quant = k_kv_has_scales(kvt);
        /* decode: positions from 0 to thousands (shares of many chunks), splits
         * 1..16 (some with no keys), windows, q/k norms, GQA groups up to 32 */
        if (!quant) /* int8/fp8 rows are whole 16-byte granules */
            check_attention_decode(lc, kvt, 8, 4, 8, 0, 0, 1, false);
        if (!quant) /* int8/fp8 rows are whole 16-byte granules */
            check_attention_decode(lc, kvt, 8, 4, 8, 0, 0, 4, false);
        check_attention_decode(lc, kvt, 8, 2, 64, 5, 0, 8, true);
        check_attention_decode(lc, kvt, 32, 1, 256, 100, 0, 3, false); /* past 48 KB of shared memory */
        check_attention_decode(lc, kvt, 32, 8, 64, 4095, 0, 1, false);
        check_attention_decode(lc, kvt, 4, 2, 16, 37, 0, 4, true);
        check_attention_decode(lc, kvt, 4, 2, 32, 100, 8, 3, true);
        check_attention_decode(lc, kvt, 32, 8, 128, 639, 0, 8, false);
        check_attention_decode(lc, kvt, 32, 8, 128, 3999, 0, 16, false);
        check_attention_decode(lc, kvt, 16, 16, 64, 1000, 256, 7, true);
        check_attention_decode(lc, kvt, 8, 1, 256, 300, 0, 5, true);
        check_attention_decode(lc, kvt, 4, 4, 96, 50, 0, 2, false);
        check_attention_decode(lc, kvt, 28, 4, 128, 200, 0, 10, false);
        check_attention_decode(lc, kvt, 32, 1, 128, 300, 0, 4, false); /* groups wider than a block's warps loop */
        check_attention_decode(lc, kvt, 16, 1, 256, 300, 0, 4, true);
        check_attention_decode(lc, kvt, 32, 8, 128, 3000, 1000, 12, false);
        /* prefill: from the start and after a cached prefix, n not a multiple of the tiles */
        check_attention(lc, kvt, act, 8, 4, 8, 5, 0, 0);
        check_attention(lc, kvt, K_F32, 4, 2, 16, 37, 0, 0);
        check_attention(lc, kvt, act, 4, 2, 32, 64, 30, 8);
        check_attention(lc, kvt, act, 32, 8, 128, 130, 0, 0);
        check_attention(lc, kvt, K_F32, 32, 8, 128, 77, 200, 0);
        check_attention(lc, kvt, act, 8, 2, 256, 40, 10, 16);
        /* tensor-core path shapes: head_dim 48/64/80/112, one token, a window of 1, a long prefix */
        check_attention(lc, kvt, K_F32, 12, 4, 48, 130, 33, 40);
        check_attention(lc, kvt, K_F32, 8, 8, 64, 1, 77, 0);
        check_attention(lc, kvt, act, 14, 2, 64, 65, 100, 0);
        check_attention(lc, kvt, K_F32, 8, 2, 80, 97, 5, 0);
        check_attention(lc, kvt, K_F32, 4, 1, 112, 64, 64, 17);
        check_attention(lc, kvt, K_F32, 4, 2, 128, 129, 3, 1);
        check_attention(lc, kvt, K_F32, 4, 4, 128, 300, 1000, 0);
        test_ring(lc, kvt, act);
        /* The streaming kernel: groups of 1, 2, 4 and 8, head_dim 64, 128 and
         * 256, up to 32 splits, splits that get no keys or too few (a split
         * takes at least 128), windows, a ring; shapes it does not serve
         * (fp32, head_dim 96, a group of 3 on CUDA cores) go to the staged
         * kernel. */
        decode_stream = true;
        check_attention_decode(lc, kvt, 32, 8, 128, 4095, 0, 32, false);
        check_attention_decode(lc, kvt, 32, 8, 128, 3999, 1000, 24, true);
        check_attention_decode(lc, kvt, 8, 2, 64, 5, 0, 8, true);
        check_attention_decode(lc, kvt, 16, 16, 64, 1000, 0, 7, false);
        check_attention_decode(lc, kvt, 16, 8, 256, 700, 0, 5, false);
        check_attention_decode(lc, kvt, 64, 8, 128, 2000, 0, 32, true);
        check_attention_decode(lc, kvt, 4, 1, 64, 300, 0, 3, false);
        check_attention_decode(lc, kvt, 8, 1, 256, 129, 0, 1, true);
        check_attention_decode(lc, kvt, 12, 4, 128, 200, 0, 4, false);
        /* groups of 3, 5, 6 and 7 (Llama 3.2 3B's, Qwen2.5's): the tensor-core kernel, else the staged one */
        check_attention_decode(lc, kvt, 28, 4, 128, 1000, 0, 16, true);
        check_attention_decode(lc, kvt, 20, 4, 64, 700, 0, 8, false);
        check_attention_decode(lc, kvt, 12, 2, 128, 3000, 0, 32, false);
        check_attention_decode(lc, kvt, 24, 8, 128, 1100, 300, 16, true);
        check_attention_decode(lc, kvt, 4, 4, 96, 50, 0, 2, false);
        check_decode_ring(lc, kvt, 32, 8, 128, 3999, 1000, 1000 + 512 + 1, 32);
        check_decode_ring(lc, kvt, 8, 2, 64, 5, 8, 12, 3);
        decode_stream = false;
    }
}

int main(void)
{
    test_rng_state = 0x9e3779b97f4a7c15ull;
    launch_ctx lc;
    const int skip = cuda_test_setup("test_attention_cuda", &lc);
    if (skip)
        return skip;
    test_rope_qkv(&lc);
    test_attention(&lc);
    /* Bad arguments fail with a message and launch nothing: heads not a multiple of the kv heads, an int8
     * cache without its scales. */
    CHECK(launch_attention_prefill(&lc, lc.err, K_F32, (float *)lc.err, lc.err, lc.err, NULL, NULL, K_KV_F32, 4, 0, 6,
                                   4, 16, 0, 0) == -1);
    CHECK(launch_attention_prefill(&lc, lc.err, K_F32, (float *)lc.err, lc.err, lc.err, NULL, NULL, K_KV_INT8, 4, 0,
                                   4, 2, 16, 0, 0) == -1 &&
          strstr(lc.err, "attention_prefill"));
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    cudaStreamDestroy(lc.stream);
    return test_finish("test_attention_cuda");
}
