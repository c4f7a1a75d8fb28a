/*
 * test_kv_ring.c: sliding-window layers keep only their window, as a ring
 * (issue 34, item 5), on the CPU backend.
 *
 * Kernels: k_kv_store into a ring of R rows puts position p at row p % R,
 * byte for byte what a whole cache holds at row p, chunks wrapping the
 * ring included; k_attention_kv over a ring gives the same bits as over
 * the whole cache, for every KV type, at the smallest ring a pass allows
 * (window + n - 1) and larger ones.
 *
 * Models (window 8): mistral_sharded (every layer windowed) and Qwen2/Qwen3
 * fixtures made windowed from their second layer (config variants written
 * to a temporary folder: use_sliding_window, max_window_layers 1, so layer
 * 0 keeps every position). A session with n_batch b keeps 8 + b + 1 rows
 * per window layer; against a session whose cache is whole (n_batch = n_ctx
 * makes the ring no smaller than the context) fed the same chunks, the
 * logits after every pass are identical bit for bit, over 190 positions
 * (a 100-token prompt in chunks of b = 1, 3, 8, 13, 64, then 90 decoded),
 * for f32, f16 and int8 caches: the ring changes only where a row lives,
 * and the attention visits the same keys in the same order. The cache's
 * bytes are those plan_kv_bytes gives. engine_session_reuse: a rewind the
 * ring still covers keeps its prefix (the boundary exactly: kv_end -
 * (n_batch + 2)) and continues bit for bit as the whole cache does; one a
 * token further keeps nothing, and the re-evaluation equals a fresh
 * session's. engine_session_score on a ring against a whole cache.
 */
#define _XOPEN_SOURCE 700 /* realpath, symlink, mkdtemp */

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "engine/plan.h"
#include "test_random.h"
#include "test_util.h"

#define WINDOW 8 /* the fixtures' (mistral_sharded's config, and the Qwen variants written here) */

static const k_kv_type all_types[] = {K_KV_F32, K_KV_F16, K_KV_BF16, K_KV_INT8, K_KV_FP8};
static const char *tname(k_kv_type t)
{
    static const char *const n[] = {"?", "f32", "f16", "bf16", "int8", "fp8"};
    return n[t];
}

/* ------------------------------------------------------------- kernels */

static k_kv make_cache(k_kv_type t, size_t rows, int hd, int ring)
{
    k_kv kv = {malloc(rows * hd * k_kv_elem_size(t)), k_kv_has_scales(t) ? malloc(rows * sizeof(float)) : NULL, t,
               ring};
    memset(kv.data, 0xA5, rows * hd * k_kv_elem_size(t));
    if (kv.scales)
        memset(kv.scales, 0xA5, rows * sizeof(float));
    return kv;
}

static void free_cache(k_kv *kv)
{
    free(kv->data);
    free(kv->scales);
}

/*
 * Positions 0 .. total-1 stored in chunks of `chunk` into a whole cache and
 * a ring of R rows; then n queries at the last n positions attend with a
 * window. The ring's rows equal the whole cache's rows of the positions it
 * holds, and the attention's output is the same bits.
 */
static void check_ring(k_kv_type t, int threads, int nh, int nkv, int hd, int total, int chunk, int n, int window,
                       int R)
{
    const int kvd = nkv * hd;
    k_ctx c = {threads, NULL, (size_t)total};
    c.scratch = malloc((size_t)threads * total * sizeof(float));
    float *k = malloc((size_t)total * kvd * sizeof *k), *v = malloc((size_t)total * kvd * sizeof *v);
    fill(k, (size_t)total * kvd, 1.5);
    fill(v, (size_t)total * kvd, 1.0);
    k_kv kf = make_cache(t, (size_t)total * nkv, hd, 0), vf = make_cache(t, (size_t)total * nkv, hd, 0);
    k_kv kr = make_cache(t, (size_t)R * nkv, hd, R), vr = make_cache(t, (size_t)R * nkv, hd, R);
    for (int p = 0; p < total; p += chunk) {
        const int m = total - p < chunk ? total - p : chunk;
        k_kv_store(&c, &kf, k + (size_t)p * kvd, m, p, nkv, hd);
        k_kv_store(&c, &vf, v + (size_t)p * kvd, m, p, nkv, hd);
        k_kv_store(&c, &kr, k + (size_t)p * kvd, m, p, nkv, hd);
        k_kv_store(&c, &vr, v + (size_t)p * kvd, m, p, nkv, hd);
    }
    /* Each position the ring holds, at row p % R. */
    const size_t es = k_kv_elem_size(t), row = (size_t)kvd * es;
    int bad = 0;
    for (int p = total > R ? total - R : 0; p < total; p++) {
        const size_t a = (size_t)(p % R), b = (size_t)p;
        bad += memcmp((char *)kr.data + a * row, (char *)kf.data + b * row, row) != 0;
        bad += memcmp((char *)vr.data + a * row, (char *)vf.data + b * row, row) != 0;
        if (kr.scales)
            bad += memcmp(kr.scales + a * nkv, kf.scales + b * nkv, (size_t)nkv * sizeof(float)) != 0 ||
                   memcmp(vr.scales + a * nkv, vf.scales + b * nkv, (size_t)nkv * sizeof(float)) != 0;
    }
    CHECK_MSG(bad == 0, "%s ring of %d, %d positions in chunks of %d: %d rows differ from the whole cache's", tname(t),
              R, total, chunk, bad);
    /* Attention of the last n positions. */
    const int pos0 = total - n;
    const size_t qn = (size_t)n * nh * hd;
    float *q = malloc(qn * sizeof *q), *of = malloc(qn * sizeof *of), *orr = malloc(qn * sizeof *orr);
    fill(q, qn, 1.5);
    for (size_t i = 0; i < qn; i++)
        of[i] = orr[i] = NAN;
    k_attention_kv(&c, of, q, &kf, &vf, n, pos0, nh, nkv, hd, window);
    k_attention_kv(&c, orr, q, &kr, &vr, n, pos0, nh, nkv, hd, window);
    size_t diff = 0;
    for (size_t i = 0; i < qn; i++)
        diff += memcmp(&of[i], &orr[i], sizeof(float)) != 0 || of[i] != of[i];
    CHECK_MSG(diff == 0, "%s attention over a ring of %d (window %d, n %d at %d, hd %d, %d threads): %zu of %zu "
                         "outputs differ from the whole cache's",
              tname(t), R, window, n, pos0, hd, threads, diff, qn);
    free(q), free(of), free(orr), free(k), free(v), free(c.scratch);
    free_cache(&kf), free_cache(&vf), free_cache(&kr), free_cache(&vr);
}

static void kernel_tests(void)
{
    for (size_t ti = 0; ti < sizeof all_types / sizeof all_types[0]; ti++) {
        const k_kv_type t = all_types[ti];
        /* The smallest ring a pass of n allows (window + n - 1), and larger; chunks that wrap the ring. */
        check_ring(t, 1, 4, 2, 16, 100, 7, 5, 8, 8 + 5 - 1);
        check_ring(t, 1, 4, 2, 16, 100, 1, 1, 8, 8);
        check_ring(t, 2, 8, 2, 64, 300, 13, 13, 32, 32 + 13 + 1);
        check_ring(t, 2, 8, 8, 200, 90, 4, 4, 10, 17); /* rows longer than a decode chunk (128) */
        check_ring(t, 2, 32, 8, 128, 700, 64, 64, 100, 100 + 64 + 1);
        check_ring(t, 1, 4, 4, 32, 20, 6, 6, 8, 25); /* the ring never filled */
    }
}

/* ------------------------------------------------------------- models */

#define CTX 200
#define PROMPT 100
#define GEN 90

static engine_model *load(const char *path)
{
    char err[512] = "";
    engine_model_params mp = engine_model_default_params();
    mp.device = ENGINE_DEVICE_CPU;
    mp.n_threads = 2;
    engine_model *m = NULL;
    CHECK_MSG(engine_model_load(path, &mp, &m, err, sizeof err) == ENGINE_OK, "%s: %s", path, err);
    return m;
}

static engine_session *session(engine_model *m, engine_kv_type kv, int n_batch)
{
    char err[512] = "";
    engine_session_params sp = engine_session_default_params();
    sp.n_ctx = CTX;
    sp.kv_type = kv;
    sp.n_batch = n_batch;
    engine_session *s = NULL;
    CHECK_MSG(engine_session_create(m, &sp, &s, err, sizeof err) == ENGINE_OK, "%s batch %d: %s",
              engine_kv_type_name(kv), n_batch, err);
    return s;
}

static void random_ids(int32_t *ids, int n, int vocab, uint64_t seed)
{
    uint64_t r = seed;
    for (int i = 0; i < n; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)((r >> 33) % (uint64_t)vocab);
    }
}

/* The model's cfg (the tests may read engine internals: the planner's figures are the layout). */
typedef struct model_case {
    const char *name;
    engine_model *m;
    int vocab, window_layers, n_layers;
} model_case;

/*
 * Evaluate ids[0..n) on both sessions in passes of `chunk`, comparing the
 * logits after every pass bit for bit; false (and a check failed) at the
 * first difference. `at` names the step in messages; *last (may be NULL)
 * gets a's last logits.
 */
static bool eval_both(const model_case *mc, engine_session *a, engine_session *b, const int32_t *ids, int n,
                      int chunk, const char *at, const float **last)
{
    for (int i = 0; i < n; i += chunk) {
        const int m = n - i < chunk ? n - i : chunk;
        const float *la = NULL, *lb = NULL;
        if (engine_session_eval(a, ids + i, (size_t)m, &la) != ENGINE_OK ||
            engine_session_eval(b, ids + i, (size_t)m, &lb) != ENGINE_OK) {
            CHECK_MSG(0, "%s %s: eval failed at %d: %s / %s", mc->name, at, i, engine_session_last_error(a),
                      engine_session_last_error(b));
            return false;
        }
        if (memcmp(la, lb, (size_t)mc->vocab * sizeof *la) != 0) {
            double mx = 0.0;
            for (int j = 0; j < mc->vocab; j++)
                mx = fmax(mx, fabs((double)la[j] - lb[j]));
            CHECK_MSG(0, "%s %s: logits after position %d differ from the whole cache's (by up to %.3g)", mc->name,
                      at, engine_session_n_past(a) - 1, mx);
            return false;
        }
        if (last)
            *last = la;
    }
    return true;
}

/* The KV bytes a session of n_batch takes: K and V of each layer, n_ctx rows or the ring. */
static uint64_t want_kv(const model_case *mc, engine_kv_type kv, int n_batch)
{
    engine_model_info info;
    engine_model_get_info(mc->m, &info);
    const int ring = WINDOW + n_batch + 1 < CTX ? WINDOW + n_batch + 1 : CTX;
    const uint64_t rows = (uint64_t)(mc->n_layers - mc->window_layers) * CTX + (uint64_t)mc->window_layers * ring;
    const uint64_t per = kv == ENGINE_KV_F32    ? 4 * (uint64_t)info.head_dim
                         : kv == ENGINE_KV_INT8 ? (uint64_t)info.head_dim + 4
                                                : 2 * (uint64_t)info.head_dim;
    return 2 * rows * (uint64_t)info.n_kv_heads * per;
}

/* A 100-token prompt in passes of n_batch, then 90 greedy tokens, on a ring and on a whole cache. */
static void ring_vs_whole(const model_case *mc, engine_kv_type kv, int n_batch)
{
    engine_session *a = session(mc->m, kv, n_batch), *b = session(mc->m, kv, CTX);
    engine_memory_report ra, rb;
    int32_t ids[PROMPT + GEN];
    char at[64];
    const float *l = NULL;
    if (!a || !b)
        goto out;
    engine_session_memory(a, &ra);
    engine_session_memory(b, &rb);
    CHECK_MSG(ra.kv_cache == want_kv(mc, kv, n_batch) && rb.kv_cache == want_kv(mc, kv, CTX) &&
                  ra.kv_cache < rb.kv_cache,
              "%s %s batch %d: KV %llu bytes (want %llu), whole %llu", mc->name, engine_kv_type_name(kv), n_batch,
              (unsigned long long)ra.kv_cache, (unsigned long long)want_kv(mc, kv, n_batch),
              (unsigned long long)rb.kv_cache);
    /* The planner counts the same bytes. */
    CHECK(plan_kv_bytes(&mc->m->cfg, kv, CTX, n_batch) == ra.kv_cache &&
          plan_kv_bytes(&mc->m->cfg, kv, CTX, CTX) == rb.kv_cache);
    random_ids(ids, PROMPT, mc->vocab, 0x71e9u + (uint64_t)n_batch);
    snprintf(at, sizeof at, "%s batch %d prompt", engine_kv_type_name(kv), n_batch);
    if (!eval_both(mc, a, b, ids, PROMPT, n_batch, at, &l))
        goto out;
    snprintf(at, sizeof at, "%s batch %d decode", engine_kv_type_name(kv), n_batch);
    for (int i = PROMPT; i < PROMPT + GEN; i++) {
        ids[i] = argmax(l, mc->vocab);
        if (!eval_both(mc, a, b, &ids[i], 1, 1, at, &l))
            goto out;
    }
    printf("test_kv_ring: %-24s %-4s n_batch %2d: ring of %3d rows, KV %6llu bytes (whole %6llu), %d positions "
           "equal bit for bit\n",
           mc->name, engine_kv_type_name(kv), n_batch, WINDOW + n_batch + 1, (unsigned long long)ra.kv_cache,
           (unsigned long long)rb.kv_cache, PROMPT + GEN);
out:
    engine_session_free(a);
    engine_session_free(b);
}

/* engine_session_reuse on a ring (n_batch 4: 13 rows) against a whole cache. */
static void reuse(const model_case *mc, engine_kv_type kv)
{
    const int nb = 4, slack = nb + 2; /* a rewind the ring covers: first = k - 7, kept while first + 13 >= kv_end */
    engine_session *a = session(mc->m, kv, nb), *b = session(mc->m, kv, CTX), *c = session(mc->m, kv, CTX);
    int32_t ids[CTX], ids2[CTX], ids3[CTX];
    const float *la = NULL, *lc = NULL;
    size_t ka = 99, kb = 99;
    if (!a || !b || !c)
        goto out;
    random_ids(ids, CTX, mc->vocab, 0xbeefu);
    if (!eval_both(mc, a, b, ids, 150, nb, "reuse: first 150", NULL))
        goto out;
    /* The furthest rewind the ring covers: 150 - 6 = 144 kept, then 20 different ids. */
    memcpy(ids2, ids, sizeof ids2);
    random_ids(ids2 + 150 - slack, 20, mc->vocab, 0xfeedu);
    ids2[150 - slack] = (ids[150 - slack] + 1) % mc->vocab;
    const int n2 = 150 - slack + 20;
    CHECK(engine_session_reuse(a, ids2, (size_t)n2, &ka) == ENGINE_OK &&
          engine_session_reuse(b, ids2, (size_t)n2, &kb) == ENGINE_OK);
    CHECK_MSG(ka == (size_t)(150 - slack) && kb == ka && engine_session_n_past(a) == (int)ka,
              "%s %s: reuse kept %zu on the ring, %zu on the whole cache (want %d)", mc->name,
              engine_kv_type_name(kv), ka, kb, 150 - slack);
    if (!eval_both(mc, a, b, ids2 + ka, n2 - (int)ka, nb, "reuse: after a rewind the ring covers", NULL))
        goto out;
    /* One token further than the ring covers (kv_end n2 = 164, keeping 157 needs 158): nothing kept. */
    const int k3 = n2 - slack - 1;
    memcpy(ids3, ids2, sizeof ids3);
    random_ids(ids3 + k3, 13, mc->vocab, 0xcafeu);
    ids3[k3] = (ids2[k3] + 1) % mc->vocab;
    const int n3 = k3 + 13;
    CHECK(engine_session_reuse(a, ids3, (size_t)n3, &ka) == ENGINE_OK &&
          engine_session_reuse(b, ids3, (size_t)n3, &kb) == ENGINE_OK);
    CHECK_MSG(ka == 0 && kb == (size_t)k3 && engine_session_n_past(a) == 0,
              "%s %s: a rewind past the ring kept %zu (want 0; the whole cache %zu of %d)", mc->name,
              engine_kv_type_name(kv), ka, kb, k3);
    /* The ring's session starts again: as a fresh one given the same passes. */
    if (!eval_both(mc, a, c, ids3, n3, nb, "reuse: after a rewind past the ring", &la))
        goto out;
    /* The whole cache continued from 157: the same logits but for the passes' rounding (the positions from 144
     * were computed in other passes). */
    for (int i = k3; i < n3; i += nb) {
        const int m = n3 - i < nb ? n3 - i : nb;
        CHECK(engine_session_eval(b, ids3 + i, (size_t)m, &lc) == ENGINE_OK);
    }
    double mx = 0.0, scale = 1e-30;
    for (int j = 0; lc && j < mc->vocab; j++) {
        mx = fmax(mx, fabs((double)la[j] - lc[j]));
        scale = fmax(scale, fabs((double)lc[j]));
    }
    CHECK_MSG(lc && mx / scale < 1e-4 && argmax(la, mc->vocab) == argmax(lc, mc->vocab),
              "%s %s: after the ring's restart the logits differ from the whole cache's by %.3g of their scale",
              mc->name, engine_kv_type_name(kv), mx / scale);
    printf("test_kv_ring: %-24s %-4s reuse: a rewind of %d kept (bit for bit), of %d dropped (rerun %.1e of the "
           "scale from the whole cache's)\n",
           mc->name, engine_kv_type_name(kv), slack, slack + 1, mx / scale);
out:
    engine_session_free(a);
    engine_session_free(b);
    engine_session_free(c);
}

/* engine_session_score on a ring (n_batch 5) against a whole cache (one pass): rounding apart, the same. */
static void score(const model_case *mc)
{
    engine_session *a = session(mc->m, ENGINE_KV_F32, 5), *b = session(mc->m, ENGINE_KV_F32, CTX);
    int32_t ids[150];
    double pa[150], pb[150];
    random_ids(ids, 150, mc->vocab, 0x5c0eu);
    if (a && b && engine_session_score(a, ids, 150, 1, pa, NULL, NULL) == ENGINE_OK &&
        engine_session_score(b, ids, 150, 1, pb, NULL, NULL) == ENGINE_OK) {
        double mx = 0.0;
        for (int i = 0; i < 149; i++)
            mx = fmax(mx, fabs(pa[i] - pb[i]));
        CHECK_MSG(mx < 1e-4, "%s: scores on a ring differ by %.3g", mc->name, mx);
    } else {
        CHECK_MSG(0, "%s: scoring failed", mc->name);
    }
    engine_session_free(a);
    engine_session_free(b);
}

static void model_case_run(model_case *mc)
{
    if (!mc->m)
        return;
    engine_model_info info;
    engine_model_get_info(mc->m, &info);
    mc->vocab = info.vocab_size;
    mc->n_layers = info.n_layers;
    const engine_kv_type kvs[] = {ENGINE_KV_F32, ENGINE_KV_F16, ENGINE_KV_INT8};
    const int batches[] = {1, 3, 8, 13, 64};
    for (size_t k = 0; k < sizeof kvs / sizeof kvs[0]; k++)
        for (size_t i = 0; i < sizeof batches / sizeof batches[0]; i++)
            ring_vs_whole(mc, kvs[k], batches[i]);
    reuse(mc, ENGINE_KV_F32);
    reuse(mc, ENGINE_KV_INT8);
    score(mc);
}

/* A copy of fixture `name` in dir whose layers from the second on have a window of 8 (Qwen's config keys). */
static bool windowed_variant(const char *name, const char *dir)
{
    char src[512], rel[256], path[1024];
    snprintf(rel, sizeof rel, "models/%s", name);
    test_data_path(src, sizeof src, rel);
    snprintf(path, sizeof path, "%s/config.json", src);
    json_error_t je;
    json_t *cfg = json_load_file(path, 0, &je);
    if (!cfg)
        return false;
    json_object_set_new(cfg, "use_sliding_window", json_true());
    json_object_set_new(cfg, "sliding_window", json_integer(WINDOW));
    json_object_set_new(cfg, "max_window_layers", json_integer(1));
    json_object_set_new(cfg, "layer_types", json_pack("[ss]", "full_attention", "sliding_attention"));
    snprintf(path, sizeof path, "%s/config.json", dir);
    const int rc = json_dump_file(cfg, path, JSON_INDENT(2));
    json_decref(cfg);
    char from[1200], abs_from[PATH_MAX];
    snprintf(from, sizeof from, "%s/model.safetensors", src);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    return rc == 0 && realpath(from, abs_from) && symlink(abs_from, path) == 0;
}

static void model_tests(void)
{
    char path[512];
    model_case mistral = {"mistral_sharded", load(test_data_path(path, sizeof path, "models/mistral_sharded")), 0, 2,
                          2};
    model_case_run(&mistral);
    engine_model_free(mistral.m);

    static const char *const qwens[] = {"qwen2_bf16", "qwen3_f32"};
    for (size_t i = 0; i < 2; i++) {
        char dir[] = "/tmp/test_kv_ring_XXXXXX", name[64];
        if (!mkdtemp(dir)) {
            CHECK(0);
            continue;
        }
        CHECK_MSG(windowed_variant(qwens[i], dir), "%s: the windowed variant could not be written", qwens[i]);
        snprintf(name, sizeof name, "%s windowed", qwens[i]);
        model_case q = {name, load(dir), 0, 1, 2};
        model_case_run(&q);
        engine_model_free(q.m);
        char f[1100];
        snprintf(f, sizeof f, "%s/config.json", dir);
        unlink(f);
        snprintf(f, sizeof f, "%s/model.safetensors", dir);
        unlink(f);
        rmdir(dir);
    }
}

int main(int argc, char **argv)
{
    const bool all = argc < 2;
    if (all || !strcmp(argv[1], "kernels"))
        kernel_tests();
    if (all || !strcmp(argv[1], "model"))
        model_tests();
    return test_finish("test_kv_ring");
}
