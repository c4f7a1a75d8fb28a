/*
 * test_plan_synth.h: the synthetic models the planner's tests plan (Llama
 * 3.2 1B and 3.1 8B shapes, a tiny and a small f32 one; Mixtral 8x7B and
 * Qwen3-30B-A3B for expert placement): engine_model
 * descriptions with real shapes and weight views pointing at nothing
 * readable (the planner reads shapes only), and the device bytes of their
 * layers written out from docs/FORMATS.md and put_mat, to check the
 * planner's figures against.
 */
#ifndef ENGINE_TEST_PLAN_SYNTH_H
#define ENGINE_TEST_PLAN_SYNTH_H

#include <stdlib.h>

#include "engine/model.h"
#include "engine/plan.h"

#define MiB ((uint64_t)1 << 20)
#define GiB ((uint64_t)1 << 30)

static char data_a[1], data_b[1]; /* distinct addresses: tied means lm_head.data == tok_emb.data */

typedef struct shape {
    int dim, n_layers, n_heads, n_kv, head_dim, ffn, vocab, max_pos;
    bool tied;
    k_dtype dt;
} shape;

static const shape LLAMA_1B = {2048, 16, 32, 8, 64, 8192, 128256, 131072, true, K_BF16};
static const shape LLAMA_8B = {4096, 32, 32, 8, 128, 14336, 128256, 131072, false, K_BF16};
static const shape TINY = {64, 5, 8, 4, 8, 172, 512, 512, false, K_F32};
static const shape SMALL = {512, 8, 8, 8, 64, 2048, 32000, 2048, false, K_F32}; /* 16 MiB layers */

static inline k_weight W(k_dtype t, int rows, int cols)
{
    return (k_weight){data_a, t, rows, cols};
}

/* An engine_model with s's config and weight views pointing at nothing readable (the planner reads shapes only). */
static inline engine_model *synth(const shape *s)
{
    engine_model *m = calloc(1, sizeof *m);
    m->layers = calloc((size_t)s->n_layers, sizeof *m->layers);
    cfg_model *c = &m->cfg;
    c->dim = s->dim, c->n_layers = s->n_layers, c->n_heads = s->n_heads, c->n_kv_heads = s->n_kv;
    c->head_dim = s->head_dim, c->ffn_dim = s->ffn, c->vocab_size = s->vocab, c->max_position = s->max_pos;
    const int qd = s->n_heads * s->head_dim, kvd = s->n_kv * s->head_dim;
    m->tok_emb = W(s->dt, s->vocab, s->dim);
    m->lm_head = m->tok_emb;
    if (!s->tied)
        m->lm_head.data = data_b;
    m->out_norm = W(s->dt, 1, s->dim);
    for (int l = 0; l < s->n_layers; l++) {
        layer_weights *L = &m->layers[l];
        L->attn_norm = W(s->dt, 1, s->dim), L->ffn_norm = W(s->dt, 1, s->dim);
        L->wq = W(s->dt, qd, s->dim), L->wk = W(s->dt, kvd, s->dim), L->wv = W(s->dt, kvd, s->dim);
        L->wo = W(s->dt, s->dim, qd);
        L->w_gate = W(s->dt, s->ffn, s->dim), L->w_up = W(s->dt, s->ffn, s->dim), L->w_down = W(s->dt, s->dim, s->ffn);
    }
    return m;
}

static inline void synth_free(engine_model *m)
{
    free(m->experts);
    free(m->layers);
    free(m);
}

/* A mixture-of-experts shape: every layer routes to n_experts experts of moe_ffn, n_used a token. */
typedef struct moe_shape {
    shape base; /* attention, vocabulary, format (base.ffn unused) */
    int n_experts, n_used, moe_ffn;
} moe_shape;

static const moe_shape MIXTRAL_8X7B = {{4096, 32, 32, 8, 128, 14336, 32000, 32768, false, K_BF16}, 8, 2, 14336};
static const moe_shape QWEN3_30B_A3B = {{2048, 48, 32, 4, 128, 6144, 151936, 40960, false, K_BF16}, 128, 8, 768};

/* synth() with every layer's MLP replaced by a router and s's experts; free with synth_free. */
static inline engine_model *synth_moe(const moe_shape *s)
{
    engine_model *m = synth(&s->base);
    cfg_model *c = &m->cfg;
    const shape *b = &s->base;
    c->n_experts = s->n_experts, c->n_experts_used = s->n_used, c->moe_ffn_dim = s->moe_ffn;
    m->experts = calloc((size_t)b->n_layers * (size_t)s->n_experts, sizeof *m->experts);
    for (int l = 0; l < b->n_layers; l++) {
        layer_weights *L = &m->layers[l];
        L->w_gate = L->w_up = L->w_down = (k_weight){0};
        L->router = W(b->dt, s->n_experts, b->dim);
        L->experts = &m->experts[(size_t)l * (size_t)s->n_experts];
        for (int x = 0; x < s->n_experts; x++) {
            moe_expert *e = &L->experts[x];
            e->w_gate = W(b->dt, s->moe_ffn, b->dim), e->w_up = W(b->dt, s->moe_ffn, b->dim);
            e->w_down = W(b->dt, b->dim, s->moe_ffn);
        }
    }
    return m;
}


static inline uint64_t ru(uint64_t x, uint64_t to) { return (x + to - 1) / to * to; }

/* One stacked matrix of n elements in `rows` rows on the device, written out from docs/FORMATS.md and put_mat. */
static inline uint64_t dev_mat(engine_quant q, k_dtype dense, uint64_t rows, uint64_t cols)
{
    const uint64_t n = rows * cols;
    switch (q) {
    case ENGINE_QUANT_INT8: return ru(n, 256) + ru(rows * 4, 256);
    case ENGINE_QUANT_NF4: return ru(n / 2, 256) + ru(n / 64 * 4, 256) + 256;
    /* Double-quantized: absmax as a byte a block, a scale and offset per 256 blocks, the 16- and 256-entry tables. */
    case ENGINE_QUANT_NF4_DQ: return ru(n / 2, 256) + ru(n / 64, 256) + ru((n / 64 + 255) / 256 * 8, 256) + 256 + 1024;
    default: return n * k_dtype_size(dense);
    }
}

/* A Llama layer (no biases) in format q: q/k/v and gate/up stacked, two fp32 norms. */
static inline uint64_t layer_bytes(const shape *s, engine_quant q)
{
    const uint64_t qd = (uint64_t)s->n_heads * s->head_dim, kvd = (uint64_t)s->n_kv * s->head_dim;
    return dev_mat(q, s->dt, qd + 2 * kvd, s->dim) + dev_mat(q, s->dt, s->dim, qd) +
           dev_mat(q, s->dt, 2 * (uint64_t)s->ffn, s->dim) + dev_mat(q, s->dt, s->dim, s->ffn) +
           2 * ru((uint64_t)s->dim * 4, 256);
}

/* One routed expert of s on the device in format q: its gate/up stacked, its down. */
static inline uint64_t expert_dev_bytes(const moe_shape *s, engine_quant q)
{
    return dev_mat(q, s->base.dt, 2 * (uint64_t)s->moe_ffn, s->base.dim) +
           dev_mat(q, s->base.dt, s->base.dim, s->moe_ffn);
}

/*
 * Plan parameters for the placement tests: the KV type fixed at the
 * default (fp16, fp32 for fp32 models), the one these figures were written
 * for, so that AUTO's choice of a smaller type (test_plan_kv.c) does not
 * move them.
 */
static inline engine_plan_params placement_params(const engine_model *m)
{
    engine_plan_params p = engine_plan_default_params();
    p.kv_type = m->tok_emb.dtype == K_F32 ? ENGINE_KV_F32 : ENGINE_KV_F16;
    return p;
}

#endif
