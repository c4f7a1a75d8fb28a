/*
 * test_plan_kv.c: the planner's KV cache (issue 34): the bytes of each KV
 * type against the layout written out here, ENGINE_CTX_MAX, the decode
 * bound with the cache full, AUTO's choice (the default type where
 * everything fits, else a smaller cache or streamed weights, whichever the
 * full-context bound prefers) at budgets computed here by hand and over a
 * sweep against the fixed-type plans, fixed types kept, the longest context
 * each type fits (checked against a hand-computed minimum), and the
 * figures behind the targets (the 8B at 6, 8 and 16 GiB with
 * nf4-dq), which it prints; sliding-window layers' rings (window + n_batch
 * + 1 positions) in the bytes, the rows and the longest contexts. No
 * device is touched.
 */
#include <math.h>

#include "test_plan_synth.h"
#include "test_util.h"

#define CONTEXT_BYTES (512 * MiB) /* ENGINE_PLAN_CUDA_CONTEXT_BYTES */
#define HBM 3000e9
#define PCIE 54.7e9

/* One token of KV cache, all layers, written out from the layout (plan.h): K and V, and int8/fp8's fp32 scales. */
static uint64_t kv_tok(const shape *s, engine_kv_type t)
{
    const uint64_t heads = (uint64_t)s->n_layers * s->n_kv, hd = (uint64_t)s->head_dim;
    switch (t) {
    case ENGINE_KV_F32: return 2 * heads * hd * 4;
    case ENGINE_KV_INT8:
    case ENGINE_KV_FP8: return 2 * heads * (hd + 4);
    default: return 2 * heads * hd * 2;
    }
}

static engine_plan *plan_kv(const engine_model *m, uint64_t budget, int n_ctx, engine_quant q, engine_kv_type kv,
                            engine_status *st, char *err, size_t err_size)
{
    engine_plan_params p = engine_plan_default_params();
    p.vram_budget = budget, p.n_ctx = n_ctx, p.quant = q, p.kv_type = kv;
    engine_plan *plan = NULL;
    *st = engine_plan_create(m, &p, &plan, err, err_size);
    return plan;
}

/* The arena a budget gives (arena_create rounds down to 2 MiB). */
static uint64_t arena_of(uint64_t budget)
{
    return (budget - CONTEXT_BYTES) / (2 * MiB) * (2 * MiB);
}

/* The 8B's weights: a layer in format q, its matrices (what streams: all but its two fp32 norms), the tables. */
#define EMB8 (128256ull * 4096 * 2)
#define HEAD8 (EMB8 + 4096 * 4)
#define NORMS8 (2 * 4096 * 4)

static void test_kv_bytes(void)
{
    const shape *shapes[] = {&LLAMA_8B, &LLAMA_1B, &TINY};
    const engine_kv_type types[] = {ENGINE_KV_F32, ENGINE_KV_F16, ENGINE_KV_BF16, ENGINE_KV_INT8, ENGINE_KV_FP8};
    /* The figure: 8B int8 KV is 32 x 2 x 8 x 128 bytes + the scales, 65,536 + 2,048 a token. */
    CHECK(kv_tok(&LLAMA_8B, ENGINE_KV_INT8) == 65536 + 2048 && kv_tok(&LLAMA_8B, ENGINE_KV_F16) == 131072);
    CHECK(kv_tok(&LLAMA_1B, ENGINE_KV_INT8) == 17408 && kv_tok(&LLAMA_1B, ENGINE_KV_F32) == 65536);
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        engine_model *m = synth(shapes[si]);
        const int n_ctx = shapes[si]->max_pos < 1000 ? shapes[si]->max_pos : 1000;
        for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
            engine_status st;
            char err[512];
            engine_plan *p = plan_kv(m, 80 * GiB, n_ctx, ENGINE_QUANT_NONE, types[ti], &st, err, sizeof err);
            CHECK_MSG(st == ENGINE_OK, "%s", err);
            const engine_plan_totals *t = engine_plan_get_totals(p);
            const uint64_t tok = kv_tok(shapes[si], types[ti]), L = (uint64_t)shapes[si]->n_layers;
            CHECK_MSG(t->kv_type == types[ti] && !t->kv_auto && t->kv_bytes_per_token == tok &&
                          t->kv_cache == (uint64_t)n_ctx * tok,
                      "shape %zu %s: %llu a token, %llu in all", si, engine_kv_type_name(types[ti]),
                      (unsigned long long)t->kv_bytes_per_token, (unsigned long long)t->kv_cache);
            CHECK(plan_kv_token_bytes(&m->cfg, types[ti]) == tok &&
                  plan_kv_bytes(&m->cfg, types[ti], n_ctx, 0) == n_ctx * tok);
            for (int l = 0; l < shapes[si]->n_layers; l++)
                CHECK(engine_plan_entry_at(p, 1 + (size_t)l)->kv_bytes == (uint64_t)n_ctx * tok / L);
            engine_plan_free(p);
        }
        synth_free(m);
    }
}

/* n_ctx: 0 the default (min(maximum, 4096)), ENGINE_CTX_MAX the maximum, anything else negative refused. */
static void test_ctx_max(void)
{
    const struct {
        const shape *s;
        int asked, want;
    } cases[] = {{&LLAMA_8B, ENGINE_CTX_MAX, 131072}, {&LLAMA_8B, 0, 4096}, {&SMALL, ENGINE_CTX_MAX, 2048},
                 {&TINY, 0, 512},         {&TINY, ENGINE_CTX_MAX, 512}, {&LLAMA_1B, 777, 777}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        engine_model *m = synth(cases[i].s);
        engine_status st;
        char err[512];
        engine_plan *p = plan_kv(m, 80 * GiB, cases[i].asked, ENGINE_QUANT_NONE, ENGINE_KV_F16, &st, err, sizeof err);
        CHECK_MSG(st == ENGINE_OK && engine_plan_get_totals(p)->n_ctx == cases[i].want, "case %zu: %d (%s)", i,
                  p ? engine_plan_get_totals(p)->n_ctx : -1, err);
        CHECK(p && engine_plan_get_totals(p)->kv_cache == (uint64_t)cases[i].want * kv_tok(cases[i].s, ENGINE_KV_F16));
        CHECK(plan_resolve_ctx(&m->cfg, cases[i].asked) == cases[i].want);
        engine_plan_free(p);
        synth_free(m);
    }
    engine_model *m = synth(&TINY);
    engine_plan_params pp = engine_plan_default_params();
    pp.vram_budget = GiB;
    engine_plan *p = NULL;
    char err[256];
    const int bad_ctx[] = {-2, -4096};
    for (size_t i = 0; i < 2; i++) {
        pp.n_ctx = bad_ctx[i];
        CHECK(engine_plan_create(m, &pp, &p, err, sizeof err) == ENGINE_ERR_INVALID_ARG && !p && strstr(err, "n_ctx"));
    }
    pp.n_ctx = 0, pp.kv_type = (engine_kv_type)6;
    CHECK(engine_plan_create(m, &pp, &p, err, sizeof err) == ENGINE_ERR_INVALID_ARG && !p && strstr(err, "kv_type"));
    pp.kv_type = (engine_kv_type)-1;
    CHECK(engine_plan_create(m, &pp, &p, err, sizeof err) == ENGINE_ERR_INVALID_ARG && !p);
    pp.kv_type = ENGINE_KV_AUTO, pp.n_batch = -1;
    CHECK(engine_plan_create(m, &pp, &p, err, sizeof err) == ENGINE_ERR_INVALID_ARG && !p && strstr(err, "n_batch"));
    synth_free(m);
}

/*
 * The bound with the cache full: every weight read (and streamed) as
 * before, plus the whole cache read at the HBM rate, all resident and
 * streaming alike. tokens_per_second itself leaves the cache out.
 */
static void test_full_ctx_bound(void)
{
    engine_model *m = synth(&LLAMA_8B);
    const uint64_t L = layer_bytes(&LLAMA_8B, ENGINE_QUANT_NONE);
    engine_status st;
    char err[512];
    engine_plan *p = plan_kv(m, 80 * GiB, 32768, ENGINE_QUANT_NONE, ENGINE_KV_F16, &st, err, sizeof err);
    const engine_plan_totals *t = engine_plan_get_totals(p);
    const double read = (double)(32 * L + HEAD8), kv = 32768.0 * 131072;
    CHECK(st == ENGINE_OK && t->read_per_token == 32 * L + HEAD8 && t->kv_cache == (uint64_t)kv);
    CHECK(fabs(t->tokens_per_second - HBM / read) < 1e-9 * t->tokens_per_second);
    CHECK_MSG(fabs(t->full_ctx_tokens_per_second - HBM / (read + kv)) < 1e-9 * t->full_ctx_tokens_per_second,
              "%.4f vs %.4f", t->full_ctx_tokens_per_second, HBM / (read + kv));
    CHECK_MSG(strstr(engine_plan_summary(p), "f16 KV cache, decode bound ") &&
                  strstr(engine_plan_summary(p), "with all 32768 tokens in it") &&
                  !strstr(engine_plan_summary(p), "chosen over"),
              "%s", engine_plan_summary(p));
    engine_plan_free(p);
    /* Streaming at 8 GiB: read / HBM + streamed / PCIe + KV / HBM. */
    p = plan_kv(m, 8 * GiB, 4096, ENGINE_QUANT_NONE, ENGINE_KV_F16, &st, err, sizeof err);
    t = engine_plan_get_totals(p);
    CHECK(st == ENGINE_OK && t->n_layers_streamed > 0);
    const double want = 1.0 / (t->read_per_token / HBM + t->streamed_per_token / PCIE + 4096.0 * 131072 / HBM);
    CHECK_MSG(fabs(t->full_ctx_tokens_per_second - want) < 1e-9 * want, "%.4f vs %.4f", t->full_ctx_tokens_per_second,
              want);
    engine_plan_free(p);
    /* Refused: no bound. */
    p = plan_kv(m, GiB, 4096, ENGINE_QUANT_NONE, ENGINE_KV_F16, &st, err, sizeof err);
    CHECK(st == ENGINE_ERR_OVER_BUDGET && engine_plan_get_totals(p)->full_ctx_tokens_per_second == 0.0);
    engine_plan_free(p);
    synth_free(m);
}

/* Everything fits with the default type: AUTO keeps it (fp16, fp32 for an fp32 model), says it chose. */
static void test_auto_default(void)
{
    const struct {
        const shape *s;
        uint64_t budget;
        int n_ctx;
        engine_kv_type want;
    } cases[] = {{&LLAMA_8B, 80 * GiB, 32768, ENGINE_KV_F16}, {&LLAMA_1B, 16 * GiB, ENGINE_CTX_MAX, ENGINE_KV_F16},
                 {&SMALL, GiB, 2048, ENGINE_KV_F32}, {&TINY, GiB, 512, ENGINE_KV_F32}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        engine_model *m = synth(cases[i].s);
        engine_status st;
        char err[512];
        engine_plan *p = plan_kv(m, cases[i].budget, cases[i].n_ctx, ENGINE_QUANT_NONE, ENGINE_KV_AUTO, &st, err,
                                 sizeof err);
        const engine_plan_totals *t = engine_plan_get_totals(p);
        CHECK_MSG(st == ENGINE_OK && t->kv_type == cases[i].want && t->kv_auto && t->n_layers_streamed == 0 &&
                      engine_plan_entry_at(p, 0)->placement == ENGINE_PLACE_RESIDENT,
                  "case %zu: %s, %d streamed (%s)", i, engine_kv_type_name(t->kv_type), t->n_layers_streamed, err);
        CHECK(t->kv_cache == (uint64_t)t->n_ctx * kv_tok(cases[i].s, cases[i].want));
        engine_plan_free(p);
        synth_free(m);
    }
}

/*
 * Budgets computed here where the default type does not fit but a smaller
 * cache keeps every layer resident: the 8B at nf4 with 32k tokens (fp16
 * KV 4 GiB, int8 2.06 GiB), and an fp32 model, where AUTO takes fp16
 * before int8.
 */
static void test_auto_shrinks(void)
{
    engine_model *m = synth(&LLAMA_8B);
    engine_status st;
    char err[512];
    const int ctx = 32768;
    const uint64_t W = layer_bytes(&LLAMA_8B, ENGINE_QUANT_NF4), M = W - NORMS8;
    const uint64_t kv16 = ctx * kv_tok(&LLAMA_8B, ENGINE_KV_F16), kv8 = ctx * kv_tok(&LLAMA_8B, ENGINE_KV_INT8);
    engine_plan *p = plan_kv(m, 80 * GiB, ctx, ENGINE_QUANT_NF4, ENGINE_KV_F16, &st, err, sizeof err);
    const uint64_t act = engine_plan_get_totals(p)->activations; /* the same for every KV type */
    engine_plan_free(p);
    /* Exactly room for every weight, the int8 cache and the activations. */
    const uint64_t arena = ru(32 * W + EMB8 + HEAD8, 2 * MiB) + ru(kv8, 2 * MiB) + act;
    const uint64_t budget = arena + CONTEXT_BYTES;
    /* Neither fp16 with the embeddings on the host... */
    CHECK(ru(32 * W + HEAD8, 2 * MiB) + ru(kv16, 2 * MiB) + act > arena);
    /* ...so fp16 streams the first k that fit, the embeddings on the host and two buffers of a layer. */
    int k16 = -1;
    for (int k = 1; k <= 32 && k16 < 0; k++)
        if (ru((32 - (uint64_t)k) * W + (uint64_t)k * NORMS8 + HEAD8, 2 * MiB) + ru(2 * M, 2 * MiB) +
                ru(kv16, 2 * MiB) + act <= arena)
            k16 = k;
    CHECK(k16 > 0);
    p = plan_kv(m, budget, ctx, ENGINE_QUANT_NF4, ENGINE_KV_F16, &st, err, sizeof err);
    CHECK_MSG(st == ENGINE_OK && engine_plan_get_totals(p)->n_layers_streamed == k16, "fixed f16 streams %d, want %d",
              engine_plan_get_totals(p)->n_layers_streamed, k16);
    engine_plan_free(p);

    p = plan_kv(m, budget, ctx, ENGINE_QUANT_NF4, ENGINE_KV_AUTO, &st, err, sizeof err);
    const engine_plan_totals *t = engine_plan_get_totals(p);
    CHECK_MSG(st == ENGINE_OK && t->kv_type == ENGINE_KV_INT8 && t->kv_auto && t->n_layers_streamed == 0 &&
                  engine_plan_entry_at(p, 0)->placement == ENGINE_PLACE_RESIDENT && t->free_bytes == 0,
              "%s: %d streamed, %llu free", engine_kv_type_name(t->kv_type), t->n_layers_streamed,
              (unsigned long long)t->free_bytes);
    CHECK(t->kv_cache == kv8 && engine_plan_entry_at(p, 1)->kv_bytes == kv8 / 32);
    const double full8 = HBM / (double)(32 * W + HEAD8 + kv8);
    const double full16 = 1.0 / ((double)((32 - (uint64_t)k16) * W + (uint64_t)k16 * NORMS8 + HEAD8 + kv16) / HBM +
                                 (double)((uint64_t)k16 * M + 4096 * 2) / PCIE);
    CHECK_MSG(fabs(t->full_ctx_tokens_per_second - full8) < 1e-9 * full8, "%.3f vs %.3f", t->full_ctx_tokens_per_second,
              full8);
    char want[160];
    snprintf(want, sizeof want,
             "int8 KV cache, decode bound %.1f tok/s with all 32768 tokens in it (chosen over f16 KV, which would "
             "stream %d layers: %.1f tok/s)",
             full8, k16, full16);
    CHECK_MSG(strstr(engine_plan_summary(p), want) && !strncmp(engine_plan_summary(p), "all resident", 12),
              "'%s' lacks '%s'", engine_plan_summary(p), want);
    engine_plan_free(p);
    /* One 2 MiB unit less: int8 keeps the layers resident with the embeddings on the host. */
    p = plan_kv(m, budget - 2 * MiB, ctx, ENGINE_QUANT_NF4, ENGINE_KV_AUTO, &st, err, sizeof err);
    t = engine_plan_get_totals(p);
    CHECK(st == ENGINE_OK && t->kv_type == ENGINE_KV_INT8 && t->n_layers_streamed == 0 &&
          engine_plan_entry_at(p, 0)->placement == ENGINE_PLACE_STREAMED);
    engine_plan_free(p);
    synth_free(m);

    /* fp32 model (SMALL, 2048 tokens: fp32 KV 64 MiB, fp16 32 MiB, int8 17 MiB). */
    m = synth(&SMALL);
    const uint64_t Ws = layer_bytes(&SMALL, ENGINE_QUANT_NONE), emb = 32000ull * 512 * 4, head = emb + 512 * 4;
    const uint64_t k32 = 2048 * kv_tok(&SMALL, ENGINE_KV_F32), k16s = 2048 * kv_tok(&SMALL, ENGINE_KV_F16),
                   k8 = 2048 * kv_tok(&SMALL, ENGINE_KV_INT8);
    CHECK(k32 == 64 * MiB && k16s == 32 * MiB && k8 == 17 * MiB);
    p = plan_kv(m, GiB, 2048, ENGINE_QUANT_NONE, ENGINE_KV_F32, &st, err, sizeof err);
    const uint64_t act_s = engine_plan_get_totals(p)->activations;
    engine_plan_free(p);
    /* Room for everything with fp16 KV: fp16, every part resident. */
    uint64_t b = CONTEXT_BYTES + ru(8 * Ws + emb + head, 2 * MiB) + ru(k16s, 2 * MiB) + act_s;
    p = plan_kv(m, b, 2048, ENGINE_QUANT_NONE, ENGINE_KV_AUTO, &st, err, sizeof err);
    t = engine_plan_get_totals(p);
    CHECK_MSG(st == ENGINE_OK && t->kv_type == ENGINE_KV_F16 && t->n_layers_streamed == 0 && t->free_bytes == 0 &&
                  engine_plan_entry_at(p, 0)->placement == ENGINE_PLACE_RESIDENT,
              "fp32 model: %s, %d streamed", engine_kv_type_name(t->kv_type), t->n_layers_streamed);
    CHECK(strstr(engine_plan_summary(p), "(chosen over f32 KV, which would stream ") != NULL);
    engine_plan_free(p);
    /* Room for the layers and the head with int8 KV but not fp16 (the embeddings go to the host): int8. */
    b = CONTEXT_BYTES + ru(8 * Ws + head, 2 * MiB) + ru(k8, 2 * MiB) + act_s;
    CHECK(ru(8 * Ws + head, 2 * MiB) + ru(k16s, 2 * MiB) + act_s > b - CONTEXT_BYTES);
    p = plan_kv(m, b, 2048, ENGINE_QUANT_NONE, ENGINE_KV_AUTO, &st, err, sizeof err);
    t = engine_plan_get_totals(p);
    CHECK_MSG(st == ENGINE_OK && t->kv_type == ENGINE_KV_INT8 && t->n_layers_streamed == 0 &&
                  engine_plan_entry_at(p, 0)->placement == ENGINE_PLACE_STREAMED,
              "fp32 model: %s, %d streamed", engine_kv_type_name(t->kv_type), t->n_layers_streamed);
    engine_plan_free(p);
    synth_free(m);
}

/* Whether a plan keeps every part resident. */
static bool all_resident(const engine_plan *p)
{
    for (size_t i = 0; i < engine_plan_n_entries(p); i++)
        if (engine_plan_entry_at(p, i)->placement != ENGINE_PLACE_RESIDENT)
            return false;
    return engine_plan_get_totals(p)->fits;
}

/*
 * AUTO against its rule, over budgets and contexts on the 8B and 1B
 * shapes (bf16 and nf4-dq): each point planned with fp16 and with int8
 * fixed, then AUTO must be fp16 where fp16 keeps everything resident, else
 * int8 where fp16 does not fit or int8's full-context bound is higher,
 * else fp16; its totals are those of the plan of its type. Each fixed
 * plan's full-context bound is recomputed here. The shrunk cache never
 * loses where both fit (its device bytes are fewer, so it streams no
 * more, and it reads less): checked too.
 */
static void test_auto_rule(void)
{
    const shape *shapes[] = {&LLAMA_8B, &LLAMA_1B};
    const engine_quant quants[] = {ENGINE_QUANT_NONE, ENGINE_QUANT_NF4_DQ};
    const int ctxs[] = {4096, 32768, 131072};
    const uint64_t budgets[] = {4 * GiB, 6 * GiB, 8 * GiB, 12 * GiB, 16 * GiB, 24 * GiB, 40 * GiB};
    int n_default = 0, n_int8 = 0, n_refused = 0;
    for (size_t si = 0; si < 2; si++) {
        engine_model *m = synth(shapes[si]);
        for (size_t qi = 0; qi < 2; qi++)
            for (size_t ci = 0; ci < sizeof ctxs / sizeof ctxs[0]; ci++)
                for (size_t bi = 0; bi < sizeof budgets / sizeof budgets[0]; bi++) {
                    engine_status s16, s8, sa;
                    const int ctx = ctxs[ci];
                    const uint64_t b = budgets[bi];
                    engine_plan *f = plan_kv(m, b, ctx, quants[qi], ENGINE_KV_F16, &s16, NULL, 0);
                    engine_plan *i8 = plan_kv(m, b, ctx, quants[qi], ENGINE_KV_INT8, &s8, NULL, 0);
                    engine_plan *a = plan_kv(m, b, ctx, quants[qi], ENGINE_KV_AUTO, &sa, NULL, 0);
                    const engine_plan_totals *tf = engine_plan_get_totals(f), *ti = engine_plan_get_totals(i8),
                                             *ta = engine_plan_get_totals(a);
                    const engine_plan_totals *fixed[] = {tf, ti};
                    for (int k = 0; k < 2; k++)
                        if (fixed[k]->fits) {
                            const double want = 1.0 / (fixed[k]->read_per_token / HBM +
                                                       fixed[k]->streamed_per_token / PCIE + fixed[k]->kv_cache / HBM);
                            CHECK(fabs(fixed[k]->full_ctx_tokens_per_second - want) < 1e-9 * want);
                        }
                    engine_kv_type want;
                    if (all_resident(f))
                        want = ENGINE_KV_F16;
                    else if (!tf->fits || (ti->fits && ti->full_ctx_tokens_per_second > tf->full_ctx_tokens_per_second))
                        want = ENGINE_KV_INT8;
                    else
                        want = ENGINE_KV_F16;
                    const engine_plan_totals *w = want == ENGINE_KV_F16 ? tf : ti;
                    CHECK_MSG(ta->kv_type == want && ta->kv_auto && (sa == ENGINE_OK) == w->fits &&
                                  ta->device_total == w->device_total &&
                                  ta->n_layers_streamed == w->n_layers_streamed &&
                                  ta->full_ctx_tokens_per_second == w->full_ctx_tokens_per_second,
                              "shape %zu %s ctx %d %.0f GiB: auto %s, want %s", si, plan_quant_name(quants[qi]), ctx,
                              (double)b / GiB, engine_kv_type_name(ta->kv_type), engine_kv_type_name(want));
                    if (tf->fits && ti->fits)
                        CHECK(ti->full_ctx_tokens_per_second > tf->full_ctx_tokens_per_second &&
                              ti->n_layers_streamed <= tf->n_layers_streamed);
                    n_default += w->fits && want == ENGINE_KV_F16;
                    n_int8 += w->fits && want == ENGINE_KV_INT8;
                    n_refused += !w->fits;
                    engine_plan_free(f), engine_plan_free(i8), engine_plan_free(a);
                }
        synth_free(m);
    }
    CHECK_MSG(n_default > 5 && n_int8 > 5 && n_refused > 2, "%d fp16, %d int8, %d refused", n_default, n_int8,
              n_refused);
}

/* A fixed type is never changed, however badly it fits. */
static void test_fixed_kept(void)
{
    engine_model *m = synth(&LLAMA_8B);
    engine_status st;
    char err[512];
    const engine_kv_type types[] = {ENGINE_KV_F32, ENGINE_KV_F16, ENGINE_KV_BF16, ENGINE_KV_FP8};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        engine_plan *p = plan_kv(m, 8 * GiB, 32768, ENGINE_QUANT_NF4_DQ, types[i], &st, err, sizeof err);
        const engine_plan_totals *t = engine_plan_get_totals(p);
        CHECK_MSG(t->kv_type == types[i] && !t->kv_auto && t->kv_cache == 32768 * kv_tok(&LLAMA_8B, types[i]),
                  "%s became %s", engine_kv_type_name(types[i]), engine_kv_type_name(t->kv_type));
        CHECK(!strstr(engine_plan_summary(p), "chosen over"));
        /* fp16 streams here where AUTO keeps every layer resident with int8 (test_targets) */
        if (types[i] == ENGINE_KV_F16)
            CHECK(st == ENGINE_OK && t->n_layers_streamed > 0);
        if (types[i] == ENGINE_KV_F32) /* 8 GiB of fp32 cache: refused, the message naming the type */
            CHECK_MSG(st == ENGINE_ERR_OVER_BUDGET && strstr(err, "f32 KV cache 8.00 GiB at --ctx 32768"), "%s", err);
        engine_plan_free(p);
    }
    synth_free(m);
}

/*
 * The minimum of the 8B bf16 with every layer and the head streamed, for a
 * context and KV type, written out: the CUDA context, each layer's norms
 * and the final norm resident, two buffers of a layer's matrices, the
 * cache, the activations (taken from a plan at that context: they do not
 * depend on the type). Mapped bytes, compared with the arena.
 */
static uint64_t min_mapped_8b(const engine_model *m, int ctx, engine_kv_type t)
{
    const uint64_t L = layer_bytes(&LLAMA_8B, ENGINE_QUANT_NONE), M = L - NORMS8;
    engine_status st;
    engine_plan *p = plan_kv(m, 80 * GiB, ctx, ENGINE_QUANT_NONE, ENGINE_KV_F16, &st, NULL, 0);
    const uint64_t act = engine_plan_get_totals(p)->activations;
    engine_plan_free(p);
    return ru(32 * NORMS8 + 4096 * 4, 2 * MiB) + ru(2 * M, 2 * MiB) + ru(ctx * kv_tok(&LLAMA_8B, t), 2 * MiB) + act;
}

/* Refused at the model's whole context on a 6 GiB card: the longest context for each type, checked by hand. */
static void test_refusal_by_type(void)
{
    engine_model *m = synth(&LLAMA_8B);
    const uint64_t budget = 6 * GiB - 512 * MiB, arena = arena_of(budget);
    engine_status st;
    char err[512];
    engine_plan *p = plan_kv(m, budget, ENGINE_CTX_MAX, ENGINE_QUANT_NONE, ENGINE_KV_F16, &st, err, sizeof err);
    const engine_plan_totals *t = engine_plan_get_totals(p);
    CHECK(st == ENGINE_ERR_OVER_BUDGET && t->n_ctx == 131072 && t->kv_type == ENGINE_KV_F16);
    CHECK_MSG(t->minimum == CONTEXT_BYTES + min_mapped_8b(m, 131072, ENGINE_KV_F16), "minimum %llu",
              (unsigned long long)t->minimum);
    const int *by = t->max_ctx_by_kv;
    const engine_kv_type types[] = {ENGINE_KV_F32, ENGINE_KV_F16, ENGINE_KV_INT8};
    for (size_t i = 0; i < 3; i++) {
        const int n = by[types[i]];
        CHECK_MSG(n > 0 && n < 131072 && min_mapped_8b(m, n, types[i]) <= arena &&
                      min_mapped_8b(m, n + 1, types[i]) > arena,
                  "%s: %d tokens", engine_kv_type_name(types[i]), n);
    }
    CHECK(by[ENGINE_KV_BF16] == by[ENGINE_KV_F16] && by[ENGINE_KV_FP8] == by[ENGINE_KV_INT8] &&
          by[ENGINE_KV_AUTO] == by[ENGINE_KV_INT8]);
    CHECK(by[ENGINE_KV_F32] < by[ENGINE_KV_F16] && by[ENGINE_KV_F16] < by[ENGINE_KV_INT8]);
    CHECK(t->max_ctx_that_fits == by[ENGINE_KV_F16]);
    char want[160];
    snprintf(want, sizeof want, "the longest context that fits: %d tokens with f16 or bf16 KV, %d with int8 or fp8",
             by[ENGINE_KV_F16], by[ENGINE_KV_INT8]);
    CHECK_MSG(strstr(err, want) && strstr(err, "f16 KV cache 16.00 GiB at --ctx 131072") && !strchr(err, '\n'),
              "'%s' lacks '%s'", err, want);
    const int by16 = by[ENGINE_KV_F16], by8 = by[ENGINE_KV_INT8];
    engine_plan_free(p);
    /* AUTO refused: planned at int8, the smallest, which is also what its suggested context is for. */
    p = plan_kv(m, budget, ENGINE_CTX_MAX, ENGINE_QUANT_NONE, ENGINE_KV_AUTO, &st, err, sizeof err);
    t = engine_plan_get_totals(p);
    CHECK(st == ENGINE_ERR_OVER_BUDGET && t->kv_type == ENGINE_KV_INT8 && t->max_ctx_that_fits == by8 &&
          t->max_ctx_by_kv[ENGINE_KV_F16] == by16);
    CHECK_MSG(strstr(err, "int8 KV cache") && strstr(err, "it fits with --ctx "), "%s", err);
    engine_plan_free(p);
    p = plan_kv(m, budget, by8, ENGINE_QUANT_NONE, ENGINE_KV_AUTO, &st, err, sizeof err);
    CHECK_MSG(st == ENGINE_OK && engine_plan_get_totals(p)->kv_type == ENGINE_KV_INT8, "%s", err);
    engine_plan_free(p);
    /* An fp32 model names fp32 in the refusal. */
    engine_model *s = synth(&SMALL);
    p = plan_kv(s, 620 * MiB, ENGINE_CTX_MAX, ENGINE_QUANT_NONE, ENGINE_KV_F32, &st, err, sizeof err);
    CHECK_MSG(st == ENGINE_ERR_OVER_BUDGET && strstr(err, " tokens with f32 KV, "), "%s", err);
    engine_plan_free(p);
    synth_free(s);
    /* Within the budget the longest contexts are reported too, up to the model's maximum. */
    p = plan_kv(m, 80 * GiB, 4096, ENGINE_QUANT_NONE, ENGINE_KV_F16, &st, err, sizeof err);
    CHECK(st == ENGINE_OK && engine_plan_get_totals(p)->max_ctx_by_kv[ENGINE_KV_INT8] == 131072 &&
          engine_plan_get_totals(p)->max_ctx_that_fits == 0);
    engine_plan_free(p);
    synth_free(m);
}

/* The prompt batch the activations are sized for: the caller's, at most the context; CUDA's 512 by default. */
static void test_batch(void)
{
    engine_model *m = synth(&LLAMA_8B);
    engine_plan_params pp = engine_plan_default_params();
    pp.vram_budget = 80 * GiB, pp.n_ctx = 4096, pp.kv_type = ENGINE_KV_F16;
    engine_plan *p = NULL;
    CHECK(engine_plan_create(m, &pp, &p, NULL, 0) == ENGINE_OK);
    const uint64_t act512 = engine_plan_get_totals(p)->activations;
    CHECK(engine_plan_get_totals(p)->n_batch == 512);
    engine_plan_free(p);
    pp.n_batch = 64;
    CHECK(engine_plan_create(m, &pp, &p, NULL, 0) == ENGINE_OK);
    const uint64_t act64 = engine_plan_get_totals(p)->activations;
    CHECK(engine_plan_get_totals(p)->n_batch == 64);
    engine_plan_free(p);
    /* A token of batch: x and q f32 (4096 each), act bf16 (the widest, 14336), q/k/v f32 (6144), gate/up f32
     * (2 x 14336), its id: 200,708 bytes; the totals round the region to 2 MiB. */
    const double per = 4096 * 4 + 14336 * 2 + 6144 * 4 + 4096 * 4 + 28672 * 4 + 4, d = (double)(act512 - act64);
    CHECK_MSG(fabs(d - 448 * per) <= 2 * MiB, "512 - 64 tokens: %.0f bytes, want %.0f", d, 448 * per);
    pp.n_batch = 100000;
    CHECK(engine_plan_create(m, &pp, &p, NULL, 0) == ENGINE_OK && engine_plan_get_totals(p)->n_batch == 4096);
    engine_plan_free(p);
    synth_free(m);
}

/*
 * The targets on the 8B shape with nf4-dq: in 8 GiB (and on an
 * RTX 4060's 7.5 GiB) AUTO plans 32k tokens with int8 KV and every layer
 * resident, and the longest int8 context is at least 32k; in 16 GiB,
 * --kv int8 --ctx 131072 fits all resident. The figures are printed.
 */
static void test_targets(void)
{
    engine_model *m = synth(&LLAMA_8B);
    const uint64_t W = layer_bytes(&LLAMA_8B, ENGINE_QUANT_NF4_DQ);
    engine_status st;
    char err[512];
    engine_plan *p = plan_kv(m, 80 * GiB, 4096, ENGINE_QUANT_NF4_DQ, ENGINE_KV_F16, &st, err, sizeof err);
    CHECK_MSG(engine_plan_entry_at(p, 1)->weight_bytes == W && W == 112604160, "nf4-dq layer %llu, want %llu",
              (unsigned long long)engine_plan_entry_at(p, 1)->weight_bytes, (unsigned long long)W);
    engine_plan_free(p);

    p = plan_kv(m, 8 * GiB, 32768, ENGINE_QUANT_NF4_DQ, ENGINE_KV_AUTO, &st, err, sizeof err);
    const engine_plan_totals *t = engine_plan_get_totals(p);
    CHECK_MSG(st == ENGINE_OK && t->kv_type == ENGINE_KV_INT8 && t->n_layers_streamed == 0 &&
                  engine_plan_entry_at(p, 33)->placement == ENGINE_PLACE_RESIDENT &&
                  t->max_ctx_by_kv[ENGINE_KV_INT8] >= 32768,
              "8 GiB: %s, %d streamed, int8 up to %d (%s)", engine_kv_type_name(t->kv_type), t->n_layers_streamed,
              t->max_ctx_by_kv[ENGINE_KV_INT8], err);
    CHECK(t->kv_cache == 32768ull * 67584);
    engine_plan_free(p);
    engine_gpu_info g;
    CHECK(engine_gpu_find("RTX 4060", &g, NULL, 0) == ENGINE_OK);
    engine_plan_params pp = engine_plan_default_params();
    pp.vram_budget = 8 * GiB - 512 * MiB, pp.n_ctx = 32768, pp.quant = ENGINE_QUANT_NF4_DQ;
    pp.hbm_gbps = g.hbm_gbps, pp.pcie_gbps = g.pcie_gbps;
    CHECK(engine_plan_create(m, &pp, &p, err, sizeof err) == ENGINE_OK);
    t = engine_plan_get_totals(p);
    CHECK_MSG(t->kv_type == ENGINE_KV_INT8 && t->n_layers_streamed == 0, "RTX 4060: %s, %d streamed",
              engine_kv_type_name(t->kv_type), t->n_layers_streamed);
    printf("8B nf4-dq, RTX 4060 (7.5 GiB), 32768 tokens: %s KV, %d layers streamed, decode bound %.1f tok/s, %.1f "
           "with the cache full; int8 fits up to %d tokens, f16 %d\n",
           engine_kv_type_name(t->kv_type), t->n_layers_streamed, t->tokens_per_second, t->full_ctx_tokens_per_second,
           t->max_ctx_by_kv[ENGINE_KV_INT8], t->max_ctx_by_kv[ENGINE_KV_F16]);
    engine_plan_free(p);

    p = plan_kv(m, 16 * GiB, 131072, ENGINE_QUANT_NF4_DQ, ENGINE_KV_INT8, &st, err, sizeof err);
    t = engine_plan_get_totals(p);
    CHECK_MSG(st == ENGINE_OK && all_resident(p) && t->kv_cache == 131072ull * 67584, "16 GiB int8 131072: %s", err);
    engine_plan_free(p);

    const uint64_t budgets[] = {6 * GiB, 8 * GiB, 16 * GiB};
    const int ctxs[] = {32768, 131072, ENGINE_CTX_MAX};
    for (size_t bi = 0; bi < 3; bi++)
        for (size_t ci = 0; ci < 3; ci++) {
            p = plan_kv(m, budgets[bi], ctxs[ci], ENGINE_QUANT_NF4_DQ, ENGINE_KV_AUTO, &st, err, sizeof err);
            t = engine_plan_get_totals(p);
            printf("8B nf4-dq, %2.0f GiB, ctx %6d%s: %s%s KV, %2d layers streamed, %.1f tok/s (%.1f with the cache "
                   "full); longest: f16 %d, int8 %d\n",
                   (double)budgets[bi] / GiB, t->n_ctx, ctxs[ci] == ENGINE_CTX_MAX ? " (max)" : "",
                   st == ENGINE_OK ? "" : "refused, ", engine_kv_type_name(t->kv_type), t->n_layers_streamed,
                   t->tokens_per_second, t->full_ctx_tokens_per_second, t->max_ctx_by_kv[ENGINE_KV_F16],
                   t->max_ctx_by_kv[ENGINE_KV_INT8]);
            engine_plan_free(p);
        }
    synth_free(m);
}

/*
 * Sliding-window layers (issue 34, item 5): each keeps a ring of window +
 * n_batch + 1 positions where that is below the context, the rest n_ctx.
 * Mistral 7B's shape (window 4096 on every layer) and the 8B's with a window
 * from layer 20 on (Qwen's max_window_layers), f16 KV: 4 KiB a layer and
 * position.
 */
static const shape MISTRAL_7B = {4096, 32, 32, 8, 128, 14336, 32000, 32768, false, K_BF16};

static void test_windowed(void)
{
    const uint64_t row = 2 * 8 * 128 * 2; /* K and V of 8 kv heads of 128, f16 */
    engine_model *m = synth(&MISTRAL_7B);
    m->cfg.sliding_window = 4096;
    engine_status st;
    char err[512];
    const struct {
        int n_ctx, n_batch, ring;
    } cases[] = {{32768, 0, 4096 + 512 + 1}, {32768, 64, 4096 + 64 + 1}, {4096, 0, 0}, {4609, 0, 0},
                 {4610, 0, 4609},          {ENGINE_CTX_MAX, 1, 4098}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        engine_plan_params pp = engine_plan_default_params();
        pp.vram_budget = 80 * GiB, pp.n_ctx = cases[i].n_ctx, pp.n_batch = cases[i].n_batch;
        pp.kv_type = ENGINE_KV_F16;
        engine_plan *p = NULL;
        CHECK_MSG(engine_plan_create(m, &pp, &p, err, sizeof err) == ENGINE_OK, "%s", err);
        const engine_plan_totals *t = engine_plan_get_totals(p);
        const int ctx = t->n_ctx, rows = cases[i].ring ? cases[i].ring : ctx;
        CHECK_MSG(t->kv_ring_rows == cases[i].ring && t->kv_window_layers == (cases[i].ring ? 32 : 0) &&
                      t->kv_cache == 32 * (uint64_t)rows * row && t->kv_bytes_per_token == 32 * row,
                  "ctx %d batch %d: ring %d (%d layers), KV %llu", ctx, cases[i].n_batch, t->kv_ring_rows,
                  t->kv_window_layers, (unsigned long long)t->kv_cache);
        CHECK(plan_kv_bytes(&m->cfg, ENGINE_KV_F16, ctx, t->n_batch) == t->kv_cache);
        for (int l = 0; l < 32; l++)
            CHECK(engine_plan_entry_at(p, 1 + (size_t)l)->kv_bytes == (uint64_t)rows * row &&
                  plan_kv_layer_bytes(&m->cfg, ENGINE_KV_F16, l, ctx, t->n_batch) == (uint64_t)rows * row);
        engine_plan_free(p);
    }
    /* The cache no longer grows past the ring: with nf4-dq weights --ctx max (32768) fits all resident in 6 GiB;
     * in 4 GiB (streaming) the whole context fits with any type, where without the window f16 reaches less. */
    engine_plan *p = plan_kv(m, 6 * GiB, ENGINE_CTX_MAX, ENGINE_QUANT_NF4_DQ, ENGINE_KV_F16, &st, err, sizeof err);
    const engine_plan_totals *t = engine_plan_get_totals(p);
    CHECK_MSG(st == ENGINE_OK && t->n_ctx == 32768 && all_resident(p), "windowed 7B, 6 GiB: %s", err);
    printf("7B, window 4096, nf4-dq, 6 GiB, ctx 32768: f16 KV %.2f GiB (a ring of %d positions a layer), all "
           "resident\n",
           (double)t->kv_cache / GiB, t->kv_ring_rows);
    engine_plan_free(p);
    p = plan_kv(m, 4 * GiB, ENGINE_CTX_MAX, ENGINE_QUANT_NF4_DQ, ENGINE_KV_F16, &st, err, sizeof err);
    t = engine_plan_get_totals(p);
    CHECK_MSG(st == ENGINE_OK && t->max_ctx_by_kv[ENGINE_KV_F32] == 32768 && t->max_ctx_by_kv[ENGINE_KV_F16] == 32768 &&
                  t->max_ctx_by_kv[ENGINE_KV_INT8] == 32768,
              "windowed 7B, 4 GiB: %s; longest f32 %d, f16 %d, int8 %d", err, t->max_ctx_by_kv[ENGINE_KV_F32],
              t->max_ctx_by_kv[ENGINE_KV_F16], t->max_ctx_by_kv[ENGINE_KV_INT8]);
    engine_plan_free(p);
    m->cfg.sliding_window = 0;
    p = plan_kv(m, 4 * GiB, ENGINE_CTX_MAX, ENGINE_QUANT_NF4_DQ, ENGINE_KV_F16, &st, err, sizeof err);
    t = engine_plan_get_totals(p);
    CHECK_MSG(t->max_ctx_by_kv[ENGINE_KV_F16] < 32768 && t->kv_ring_rows == 0 && t->kv_cache == 32768ull * 32 * row,
              "without the window, f16 reaches %d", t->max_ctx_by_kv[ENGINE_KV_F16]);
    printf("7B without the window, nf4-dq, 4 GiB: the longest context %d tokens with f16 KV, %d with int8\n",
           t->max_ctx_by_kv[ENGINE_KV_F16], t->max_ctx_by_kv[ENGINE_KV_INT8]);
    engine_plan_free(p);
    synth_free(m);

    /* Full layers, then window layers: the 8B's shape with a window from layer 20. */
    m = synth(&LLAMA_8B);
    m->cfg.sliding_window = 4096, m->cfg.sliding_from_layer = 20;
    p = plan_kv(m, 80 * GiB, 32768, ENGINE_QUANT_NONE, ENGINE_KV_F16, &st, err, sizeof err);
    t = engine_plan_get_totals(p);
    CHECK_MSG(st == ENGINE_OK && t->kv_ring_rows == 4609 && t->kv_window_layers == 12 &&
                  t->kv_cache == (20 * 32768ull + 12 * 4609ull) * row,
              "8B window from 20: ring %d, %d layers, KV %llu", t->kv_ring_rows, t->kv_window_layers,
              (unsigned long long)t->kv_cache);
    for (int l = 0; l < 32; l++)
        CHECK(engine_plan_entry_at(p, 1 + (size_t)l)->kv_bytes == (l < 20 ? 32768ull : 4609ull) * row);
    engine_plan_free(p);
    synth_free(m);
}

int main(void)
{
    test_kv_bytes();
    test_ctx_max();
    test_full_ctx_bound();
    test_auto_default();
    test_auto_shrinks();
    test_auto_rule();
    test_fixed_kept();
    test_refusal_by_type();
    test_batch();
    test_targets();
    test_windowed();
    return test_finish("test_plan_kv");
}
