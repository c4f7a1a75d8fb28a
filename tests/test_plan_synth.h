/*
 * test_plan_synth.h: the synthetic models the planner's tests plan (Llama
 * 3.2 1B and 3.1 8B shapes, a tiny and a small f32 one): engine_model
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
    free(m->layers);
    free(m);
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
