/*
 * plan_sizes.c: the device bytes the planner prices, as the CUDA backend
 * lays them out: each layer's weights in the format --quant would give
 * them, the session's activation region (one layout both sizes it here and
 * carves it in cuda/session_cuda.c) and the KV cache. Pure arithmetic on
 * shapes; the choices made with these figures are plan.c's.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdlib.h>
#include <string.h>

#include "../quant/quant.h"
#include "plan.h"

static uint64_t round_up(uint64_t x, uint64_t to)
{
    return (x + to - 1) / to * to;
}

const char *plan_quant_name(engine_quant q)
{
    switch (q) {
    case ENGINE_QUANT_INT8: return "int8";
    case ENGINE_QUANT_INT8_G128: return "int8-g128";
    case ENGINE_QUANT_NF4: return "nf4";
    case ENGINE_QUANT_NF4_DQ: return "nf4-dq";
    case ENGINE_QUANT_FP4: return "fp4";
    default: return "none";
    }
}

int plan_default_ctx(const cfg_model *c)
{
    return c->max_position < 4096 ? c->max_position : 4096; /* engine_session_create's default */
}

int plan_resolve_ctx(const cfg_model *c, int n_ctx)
{
    return n_ctx == ENGINE_CTX_MAX ? c->max_position : n_ctx > 0 ? n_ctx : plan_default_ctx(c);
}

/* ------------------------------------------------------------ device sizes */

/* A matrix's format on the device: its own when quantized, else q's (as quantize_on_load makes it). */
typedef struct mat_fmt {
    k_dtype t;
    int group; /* K_I8: columns a scale (0: one per row); 4-bit: elements a block */
} mat_fmt;

static mat_fmt fmt_of(const k_weight *w, engine_quant q)
{
    if (k_dtype_is_quant(w->dtype))
        return (mat_fmt){w->dtype, w->dtype == K_I8 ? w->group : w->block};
    q_spec spec;
    if (!quant_spec_of(q, &spec))
        return (mat_fmt){w->dtype, 0};
    return (mat_fmt){spec.type, spec.type == K_I8 ? spec.group : Q_NF4_BLOCK};
}

/*
 * Whether the device keeps the parts' nested absmax 8-bit (put_nested of
 * cuda/model_cuda.c): q_nested_stackable, for parts quantized in the file
 * or as quantize_on_load will make them (Q_NESTED_BLOCK, one code table).
 */
static bool mat_nested(const k_weight *const *parts, int np, engine_quant q)
{
    if (k_dtype_is_quant(parts[0]->dtype))
        return q_nested_stackable(parts, np);
    q_spec spec;
    if (!quant_spec_of(q, &spec) || spec.type == K_I8 || !spec.double_quant)
        return false;
    for (int i = 0; i + 1 < np; i++) {
        const uint64_t n = (uint64_t)parts[i]->rows * parts[i]->cols;
        if (n % Q_NF4_BLOCK || (n / Q_NF4_BLOCK) % Q_NESTED_BLOCK)
            return false;
    }
    return true;
}

/*
 * put_mat() of cuda/model_cuda.c: parts stacked by rows; dense in wt, or
 * quantized as data, fp32 scales and a 16-entry code table; a nested
 * absmax that lines up across the parts (mat_nested) stays 8-bit: codes,
 * a scale and offset a nested block, the 16- and 256-entry tables. (Other
 * nested parts are decoded to fp32 on upload.)
 */
static void mat_bytes(uint64_t *off, const k_weight *const *parts, int np, k_dtype wt, engine_quant q,
                      uint64_t *deq_elems)
{
    const mat_fmt f = fmt_of(parts[0], q);
    uint64_t elems = 0, data = 0, scales = 0;
    for (int i = 0; i < np; i++) {
        const uint64_t n = (uint64_t)parts[i]->rows * parts[i]->cols;
        const mat_fmt g = fmt_of(parts[i], q);
        elems += n;
        if (g.t == K_I8) {
            data += n;
            scales += (uint64_t)parts[i]->rows * q_int8_n_groups(parts[i]->cols, g.group);
        } else if (k_dtype_is_quant(g.t)) {
            data += (n + 1) / 2;
            scales += (n + (uint64_t)g.group - 1) / (uint64_t)g.group;
        }
    }
    if (!k_dtype_is_quant(f.t)) {
        carve(NULL, off, elems * k_dtype_size(wt), PLAN_ALIGN);
        return;
    }
    carve(NULL, off, data, PLAN_ALIGN);
    if (f.t != K_I8 && mat_nested(parts, np, q)) {
        const uint64_t nb = k_dtype_is_quant(parts[0]->dtype) ? (uint64_t)parts[0]->absmax_block : Q_NESTED_BLOCK;
        carve(NULL, off, scales, PLAN_ALIGN);
        carve(NULL, off, (scales + nb - 1) / nb * 2 * sizeof(float), PLAN_ALIGN);
        carve(NULL, off, 16 * sizeof(float), PLAN_ALIGN);
        carve(NULL, off, 256 * sizeof(float), PLAN_ALIGN);
    } else {
        carve(NULL, off, scales * sizeof(float), PLAN_ALIGN);
        if (f.t != K_I8)
            carve(NULL, off, 16 * sizeof(float), PLAN_ALIGN);
    }
    if (deq_elems && elems > *deq_elems)
        *deq_elems = elems;
}

/* PUT of place(): a vector or matrix converted to `type`. */
static void vec_bytes(uint64_t *off, const k_weight *w, k_dtype type)
{
    carve(NULL, off, (uint64_t)w->rows * w->cols * k_dtype_size(type), PLAN_ALIGN);
}

const char *plan_format_label(const k_weight *w, engine_quant q, k_dtype wt)
{
    if (!k_dtype_is_quant(w->dtype) && q != ENGINE_QUANT_NONE)
        return plan_quant_name(q);
    const mat_fmt f = fmt_of(w, ENGINE_QUANT_NONE);
    switch (f.t) {
    case K_I8: return f.group > 0 ? "int8-g128" : "int8";
    case K_NF4: return w->absmax_q ? "nf4-dq" : "nf4";
    case K_FP4: return "fp4";
    default: break;
    }
    /* Dense matrices take the embeddings' type on the device. */
    return wt == K_F32 ? "f32" : wt == K_F16 ? "f16" : "bf16";
}

engine_status plan_weights_of(const engine_model *m, engine_quant q, plan_weights *w, err_buf *e)
{
    const cfg_model *c = &m->cfg;
    const k_dtype wt = m->tok_emb.dtype; /* model_cuda.c: cm->wt */
    memset(w, 0, sizeof *w);
    const size_t n = c->n_layers > 0 ? (size_t)c->n_layers : 1;
    w->layer = calloc(4 * n, sizeof *w->layer);
    if (!w->layer)
        return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "plan: out of memory for %d layers", c->n_layers);
    w->layer_mats = w->layer + n;
    w->layer_experts = w->layer + 2 * n;
    w->layer_read = w->layer + 3 * n;
    const uint64_t qd = (uint64_t)c->n_heads * c->head_dim, kvd = (uint64_t)c->n_kv_heads * c->head_dim;
    uint64_t off = 0, start;
    vec_bytes(&off, &m->tok_emb, wt);
    off = round_up(off, PLAN_ALIGN);
    w->emb = off;
    start = off;
    if (m->lm_head.data != m->tok_emb.data) {
        const k_weight *head[] = {&m->lm_head};
        /* --quant keeps lm_head (quant_head has already quantized it); prefill
         * multiplies only the last row, through the decode product, so a
         * quantized head is never decoded into the scratch matrix. */
        mat_bytes(&off, head, 1, wt, ENGINE_QUANT_NONE, NULL);
    }
    vec_bytes(&off, &m->out_norm, K_F32);
    off = round_up(off, PLAN_ALIGN);
    w->head = off - start;
    for (int l = 0; l < c->n_layers; l++) {
        const layer_weights *L = &m->layers[l];
        start = off;
        const k_weight *qkv[] = {&L->wq, &L->wk, &L->wv}, *o[] = {&L->wo}, *gu[] = {&L->w_gate, &L->w_up},
                       *down[] = {&L->w_down};
        mat_bytes(&off, qkv, 3, wt, q, &w->deq_elems);
        mat_bytes(&off, o, 1, wt, q, &w->deq_elems);
        if (!L->experts) {
            mat_bytes(&off, gu, 2, wt, q, &w->deq_elems);
            mat_bytes(&off, down, 1, wt, q, &w->deq_elems);
        } else {
            /* An expert layer (put_layer_mats of cuda/model_cuda.c): the
             * router with the shared expert's gate as a last row, as stored
             * (quantize_on_load leaves them); every expert's gate and up
             * stacked, and its down (all of them: which a token picks is
             * known only then); a shared expert likewise. */
            const k_weight *router[] = {&L->router, &L->shared_gate};
            mat_bytes(&off, router, L->shared_gate.data ? 2 : 1, wt, ENGINE_QUANT_NONE, &w->deq_elems);
            const uint64_t ex0 = off;
            for (int x = 0; x < c->n_experts; x++) {
                const k_weight *egu[] = {&L->experts[x].w_gate, &L->experts[x].w_up}, *ed[] = {&L->experts[x].w_down};
                mat_bytes(&off, egu, 2, wt, q, &w->deq_elems);
                mat_bytes(&off, ed, 1, wt, q, &w->deq_elems);
            }
            /* E experts of one stride (each starts aligned; the last one's padding is the next part's
             * alignment), so that an expert's bytes are layer_experts / E exactly. */
            off = round_up(off, PLAN_ALIGN);
            w->layer_experts[l] = off - ex0;
            if (L->shared.w_gate.data) {
                const k_weight *sgu[] = {&L->shared.w_gate, &L->shared.w_up}, *sd[] = {&L->shared.w_down};
                mat_bytes(&off, sgu, 2, wt, q, &w->deq_elems);
                mat_bytes(&off, sd, 1, wt, q, &w->deq_elems);
            }
        }
        off = round_up(off, PLAN_ALIGN);
        w->layer_mats[l] = off - start;
        vec_bytes(&off, &L->attn_norm, K_F32);
        vec_bytes(&off, &L->ffn_norm, K_F32);
        /* Norms on the blocks' outputs (OLMo 2, Gemma's sandwich). */
        if (L->attn_post_norm.data) {
            vec_bytes(&off, &L->attn_post_norm, K_F32);
            vec_bytes(&off, &L->ffn_post_norm, K_F32);
        }
        if (L->q_norm.data) {
            vec_bytes(&off, &L->q_norm, K_F32);
            vec_bytes(&off, &L->k_norm, K_F32);
        }
        /* Biases: q/k/v and gate/up stacked (missing parts zero-filled), o and down alone. */
        if (L->bq.data || L->bk.data || L->bv.data)
            carve(NULL, &off, (qd + 2 * kvd) * sizeof(float), PLAN_ALIGN);
        if (L->bo.data)
            vec_bytes(&off, &L->bo, K_F32);
        if (L->b_gate.data || L->b_up.data)
            carve(NULL, &off, 2 * (uint64_t)c->ffn_dim * sizeof(float), PLAN_ALIGN);
        if (L->b_down.data)
            vec_bytes(&off, &L->b_down, K_F32);
        /* Where each expert's gate/up and down lie from the layer's matrices'
         * base: read on the device by the decode product, resident even when
         * the matrices stream (offsets, so they hold in either slot). */
        if (L->experts)
            carve(NULL, &off, 2 * (uint64_t)c->n_experts * PLAN_EXPERT_ENTRY, PLAN_ALIGN);
        off = round_up(off, PLAN_ALIGN);
        w->layer[l] = off - start;
        /* A token reads its top-k experts of the n (they are all one size). */
        const uint64_t ex = w->layer_experts[l];
        w->layer_read[l] = w->layer[l] - ex + (c->n_experts > 0 ? ex / c->n_experts * c->n_experts_used : 0);
    }
    w->total = off;
    w->format = plan_format_label(c->n_layers > 0 ? &m->layers[0].wq : &m->tok_emb, q, wt);
    return ENGINE_OK;
}

/* Rows a row of `bytes` takes to a multiple of 256 bytes: a power of two. */
static int rows_to_256(uint64_t bytes)
{
    int r = 1;
    while ((bytes * (uint64_t)r) % 256 != 0 && r < 256)
        r *= 2;
    return r;
}

int plan_moe_pad(const cfg_model *c, k_dtype wt)
{
    const uint64_t ws = k_dtype_size(wt), dim = (uint64_t)c->dim, F = (uint64_t)c->moe_ffn_dim;
    const uint64_t row[] = {dim * ws, 2 * F * sizeof(float), F * ws, dim * sizeof(float)};
    int pad = 1;
    for (size_t i = 0; i < sizeof row / sizeof row[0]; i++)
        if (rows_to_256(row[i]) > pad)
            pad = rows_to_256(row[i]);
    return pad;
}

uint64_t plan_session_layout(const cfg_model *c, k_dtype wt, int n_batch, int n_ctx, uint64_t deq_elems,
                             uint64_t argmax_bytes, char *base, plan_session_bufs *out)
{
    const uint64_t nb = (uint64_t)n_batch, ctx = (uint64_t)n_ctx, ws = k_dtype_size(wt);
    const uint64_t qd = (uint64_t)c->n_heads * c->head_dim, kvd = (uint64_t)c->n_kv_heads * c->head_dim;
    const uint64_t half = (uint64_t)c->head_dim / 2;
    uint64_t widest = (uint64_t)c->dim;
    if (qd > widest)
        widest = qd;
    const uint64_t ffn = (uint64_t)model_ffn_max(c); /* a shared expert may be wider */
    if (ffn > widest)
        widest = ffn;
    plan_session_bufs b;
    uint64_t off = 0;
    b.x = carve(base, &off, nb * c->dim * sizeof(float), PLAN_ALIGN);
    b.act = carve(base, &off, nb * widest * ws, PLAN_ALIGN);
    b.qkv = carve(base, &off, nb * (qd + 2 * kvd) * sizeof(float), PLAN_ALIGN);
    b.q = carve(base, &off, nb * qd * sizeof(float), PLAN_ALIGN);
    b.att = carve(base, &off, qd * sizeof(float), PLAN_ALIGN);
    b.gu = carve(base, &off, nb * 2 * ffn * sizeof(float), PLAN_ALIGN);
    b.logits = carve(base, &off, (uint64_t)c->vocab_size * sizeof(float), PLAN_ALIGN);
    b.rope_cos = carve(base, &off, ctx * half * sizeof(float), PLAN_ALIGN);
    b.rope_sin = carve(base, &off, ctx * half * sizeof(float), PLAN_ALIGN);
    /* Gemma 3's sliding layers rotate by tables of their own. */
    b.rope_cos_local = b.rope_sin_local = NULL;
    if (c->rope_local_theta > 0.0) {
        b.rope_cos_local = carve(base, &off, ctx * half * sizeof(float), PLAN_ALIGN);
        b.rope_sin_local = carve(base, &off, ctx * half * sizeof(float), PLAN_ALIGN);
    }
    /* Expert layers route each token to k experts: router logits, the
     * choices, and a prompt's (token, choice) slots grouped by expert, each
     * group's rows from a multiple of plan_moe_pad (decode uses the first
     * k rows). */
    b.moe_logits = b.moe_ids = b.moe_w = b.moe_slot = b.moe_tok = b.moe_first = NULL;
    b.moe_act = b.moe_gu = b.moe_h = b.moe_out = b.moe_sh = b.moe_picks = NULL;
    if (c->n_experts > 0) {
        const uint64_t E = (uint64_t)c->n_experts, slots = nb * (uint64_t)c->n_experts_used;
        const uint64_t rows = slots + E * (uint64_t)(plan_moe_pad(c, wt) - 1), F = (uint64_t)c->moe_ffn_dim;
        b.moe_logits = carve(base, &off, nb * (E + 1) * sizeof(float), PLAN_ALIGN);
        b.moe_ids = carve(base, &off, slots * sizeof(int32_t), PLAN_ALIGN);
        b.moe_w = carve(base, &off, slots * sizeof(float), PLAN_ALIGN);
        b.moe_slot = carve(base, &off, slots * sizeof(int32_t), PLAN_ALIGN);
        b.moe_tok = carve(base, &off, rows * sizeof(int32_t), PLAN_ALIGN);
        b.moe_first = carve(base, &off, (2 * E + 1) * sizeof(int32_t), PLAN_ALIGN);
        b.moe_act = carve(base, &off, rows * c->dim * ws, PLAN_ALIGN);
        b.moe_gu = carve(base, &off, rows * 2 * F * sizeof(float), PLAN_ALIGN);
        b.moe_h = carve(base, &off, rows * F * ws, PLAN_ALIGN);
        b.moe_out = carve(base, &off, rows * c->dim * sizeof(float), PLAN_ALIGN);
        b.moe_sh = carve(base, &off, nb * c->dim * sizeof(float), PLAN_ALIGN);
        b.moe_picks = carve(base, &off, (uint64_t)c->n_layers * E * sizeof(uint32_t), PLAN_ALIGN);
    }
    b.argmax_scratch = carve(base, &off, argmax_bytes, PLAN_ALIGN);
    b.deq = carve(base, &off, deq_elems * ws, PLAN_ALIGN);
    b.ids = carve(base, &off, nb * sizeof(int32_t), PLAN_ALIGN);
    b.cand_ids = carve(base, &off, PLAN_CAND_MAX * sizeof(int32_t), PLAN_ALIGN);
    b.cand_vals = carve(base, &off, PLAN_CAND_MAX * sizeof(float), PLAN_ALIGN);
    b.step = carve(base, &off, PLAN_STEP_INTS * sizeof(int32_t), PLAN_ALIGN);
    b.in_max = carve(base, &off, PLAN_IN_MAX_SLOTS(c->n_layers) * sizeof(uint32_t), PLAN_ALIGN);
    b.q4_count = carve(base, &off, PLAN_Q4_COUNTS * sizeof(uint32_t), PLAN_ALIGN);
    b.attn_part = carve(base, &off, PLAN_ATTN_PART_FLOATS(c) * sizeof(float), PLAN_ALIGN);
    b.attn_count = carve(base, &off, (uint64_t)c->n_kv_heads * sizeof(uint32_t), PLAN_ALIGN);
    if (out)
        *out = b;
    return off;
}

void plan_session_bytes(const cfg_model *c, k_dtype wt, int n_ctx, uint64_t deq_elems, uint64_t *kv,
                        uint64_t *act)
{
    const int nb = n_ctx < PLAN_CUDA_BATCH ? n_ctx : PLAN_CUDA_BATCH;
    *act = plan_session_layout(c, wt, nb, n_ctx, deq_elems, PLAN_ARGMAX_SCRATCH, NULL, NULL);
    *kv = plan_kv_bytes(c, plan_kv_default(wt), n_ctx, nb);
}

/* ---------------------------------------------------------------- KV cache */

engine_kv_type plan_kv_default(k_dtype wt)
{
    return wt == K_F32 ? ENGINE_KV_F32 : ENGINE_KV_F16;
}

/* One kv head's row of K (or of V) at one position, its scale included. */
static uint64_t head_row_bytes(const cfg_model *c, engine_kv_type t)
{
    const uint64_t hd = (uint64_t)c->head_dim;
    switch (t) {
    case ENGINE_KV_F32: return 4 * hd;
    case ENGINE_KV_INT8:
    case ENGINE_KV_FP8: return hd + sizeof(float); /* a byte an element and the row's scale */
    default: return 2 * hd;                       /* f16, bf16 */
    }
}

uint64_t plan_kv_token_bytes(const cfg_model *c, engine_kv_type t)
{
    return 2 * (uint64_t)c->n_layers * (uint64_t)c->n_kv_heads * head_row_bytes(c, t);
}

uint64_t plan_kv_layer_bytes(const cfg_model *c, engine_kv_type t, int layer, int n_ctx, int n_batch)
{
    if (n_ctx <= 0 || layer < 0 || layer >= c->n_layers)
        return 0;
    const int rows = model_kv_rows(c, layer, n_ctx, model_kv_ring(c, n_ctx, n_batch));
    return 2 * (uint64_t)rows * (uint64_t)c->n_kv_heads * head_row_bytes(c, t);
}

uint64_t plan_kv_bytes(const cfg_model *c, engine_kv_type t, int n_ctx, int n_batch)
{
    if (n_ctx <= 0)
        return 0;
    const uint64_t rows = model_kv_row0(c, c->n_layers, n_ctx, model_kv_ring(c, n_ctx, n_batch));
    return 2 * rows * (uint64_t)c->n_kv_heads * head_row_bytes(c, t);
}
