/*
 * forward_cuda.c: the decoder on the GPU, the same steps as forward_cpu.c.
 *
 * Two shapes of one pass:
 * - a batch (prompt): matrix products through cuBLASLt on inputs in the
 *   weight type, a tiled causal attention;
 * - one token (decode): matrix-vector kernels that fold the RMSNorm, the
 *   SwiGLU and the residual add into the product, flash-decoding attention,
 *   and an argmax, all captured once into a CUDA graph and replayed per
 *   token: the host launches one graph and waits once.
 * The architecture's row adds steps where it needs them (forward_cpu.c's,
 * in the same places): no input norm and post norms (OLMo 2), sandwich
 * norms (Gemma), Granite's multipliers (embed, residual_add, the score
 * scale, logits_scale), Gemma's embedding scale, GeGLU, score and logit
 * soft-capping and local RoPE, OLMo 2's whole-projection q/k norms
 * (qk_norm_whole), Phi-3's partial rotary. Gemma's (1 + w) norms are in
 * the weights (cuda_layer).
 * Positions and token ids live in device memory (cs->step), written by one
 * copy at the head of the step, so the graph never changes. A second graph
 * without that copy takes the token and position the previous step's
 * argmax left there, so greedy decoding queues step k+1 before it reads
 * token k (cuda_greedy_*): the GPU never waits for the host.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdlib.h>
#include <string.h>

#include "expert_cache_cuda.h"
#include "host_layers.h"
#include "state.h"
#include "trace_stamps.h"
#include "stream.h"

#define TRY(call)                        \
    do {                                 \
        if ((call) != 0)                 \
            return -1;                   \
    } while (0)

static int window_of(const engine_model *m, int layer)
{
    return model_layer_window(&m->cfg, layer);
}

/* The ring of a layer's cache (position p at row p % ring), or 0 where p is at row p. */
static int ring_of(const engine_session *s, int layer)
{
    return window_of(s->model, layer) > 0 ? s->kv_ring : 0;
}

/* A layer's rows in K or V (the layers' rows one after another, plan_kv_bytes's layout). */
static void *layer_cache(const cuda_session *cs, const engine_session *s, void *cache, int layer)
{
    const cfg_model *c = &s->model->cfg;
    const size_t row = (size_t)c->n_kv_heads * c->head_dim * k_kv_elem_size(cs->kvt);
    return (char *)cache + (size_t)model_kv_row0(c, layer, s->n_ctx, s->kv_ring) * row;
}

static float *layer_scales(const engine_session *s, float *scales, int layer)
{
    const cfg_model *c = &s->model->cfg;
    return scales ? scales + (size_t)model_kv_row0(c, layer, s->n_ctx, s->kv_ring) * c->n_kv_heads : NULL;
}

/*
 * What the rope step (and decode attention, which does it itself) takes for
 * a layer. With OLMo 2's whole-projection q/k norms, qk_prepare has already
 * added the bias and normed q and k, so neither is left to it. Gemma 3's
 * sliding layers rotate by tables of their own.
 */
static rope_qkv_args rope_args(cuda_session *cs, const engine_session *s, int layer, int n)
{
    const engine_model *m = s->model;
    const cfg_model *c = &m->cfg;
    const cuda_layer *D = &cs->layers[layer];
    const bool whole = m->arch->qk_norm == QK_WHOLE, local = window_of(m, layer) > 0 && cs->rope_cos_local;
    rope_qkv_args a = {
        .qkv = cs->qkv, .bias = whole ? NULL : D->b_qkv, .q_norm = whole ? NULL : D->q_norm,
        .k_norm = whole ? NULL : D->k_norm, .eps = (float)c->rms_eps,
        .cos = local ? cs->rope_cos_local : cs->rope_cos, .sin = local ? cs->rope_sin_local : cs->rope_sin,
        .q_out = cs->q,
        .k_cache = layer_cache(cs, s, cs->k_cache, layer), .v_cache = layer_cache(cs, s, cs->v_cache, layer),
        .k_scale = layer_scales(s, cs->k_scale, layer), .v_scale = layer_scales(s, cs->v_scale, layer),
        .kvt = cs->kvt, .ring = ring_of(s, layer), .pos0 = cs->step + STEP_POS, .n = n,
        .n_heads = c->n_heads, .n_kv_heads = c->n_kv_heads, .head_dim = c->head_dim, .rotary_dim = c->rotary_dim,
        .score_scale = (float)c->attention_multiplier, .softcap = (float)c->attn_softcap,
        .part = cs->attn_part, .count = cs->attn_count,
    };
    return a;
}

/* OLMo 2's q/k norms over each token's whole projection, before the rope step (rope_args leaves them out). */
static int qk_prepare(cuda_session *cs, const engine_session *s, int layer, int n)
{
    const engine_model *m = s->model;
    const cfg_model *c = &m->cfg;
    const cuda_layer *D = &cs->layers[layer];
    if (m->arch->qk_norm != QK_WHOLE)
        return 0;
    return launch_qk_norm_whole(&cs->lc, cs->qkv, D->b_qkv, D->q_norm, D->k_norm, n, c->n_heads, c->n_kv_heads,
                                c->head_dim, (float)c->rms_eps);
}

/* A block's output y[n, dim] into x where the products could not add it themselves (cs->unfolded). */
static int residual(cuda_session *cs, const engine_session *s, float *y, const float *post_norm, int n)
{
    const cfg_model *c = &s->model->cfg;
    return launch_residual_add(&cs->lc, cs->x, y, post_norm, n, c->dim, (float)c->rms_eps,
                               (float)c->residual_multiplier);
}

/* Granite's logits_scaling and Gemma 2's final soft cap on n logits; nothing for the others. */
static int scale_logits(cuda_session *cs, const engine_session *s, float *logits, long n)
{
    const cfg_model *c = &s->model->cfg;
    if (c->logits_scaling == 1.0 && c->final_softcap <= 0.0)
        return 0;
    return launch_logits_scale(&cs->lc, logits, n, (float)(1.0 / c->logits_scaling), (float)c->final_softcap);
}

/* The matrix fields of a product's arguments. */
static void set_mat(gemv_args *g, const cuda_mat *w)
{
    g->w = w->w;
    g->wt = w->t;
    g->scales = w->scales;
    g->code = w->code;
    g->group = w->group;
    g->am_q = w->am_q;
    g->am_s2 = w->am_s2;
    g->am_code = w->am_code;
    g->am_shift = w->am_shift;
}

/*
 * y[n, rows] (+)= act[n, cols] . W^T through cuBLASLt; a quantized W is
 * decoded into the session's scratch (in the dense type) first, unless it
 * is 4-bit and the fused product (gemm_q4.cu) should be faster for its
 * shape: that one decodes in registers on the way to the tensor cores.
 */
static int product_x(cuda_session *cs, float *y, bool accumulate, const void *x, const cuda_mat *w, int n, int rows,
                     int cols)
{
    const void *dense = w->w;
    if (k_dtype_is_quant(w->t)) {
        gemv_args g = {.rows = rows, .cols = cols};
        set_mat(&g, w);
        const int sub = cs->lc.fast[K_OP_GEMM_Q4] ? gemm_q4_tiles(&cs->lc, &g, cs->cm->wt, n, &cs->q4_work) : 0;
        if (sub)
            return launch_gemm_q4(&cs->lc, y, accumulate, x, cs->cm->wt, &g, n, sub, &cs->q4_work);
        TRY(launch_dequant(&cs->lc, cs->deq, cs->cm->wt, &g));
        dense = cs->deq;
    }
    return launch_gemm(&cs->lc, y, accumulate, x, dense, cs->cm->wt, n, rows, cols);
}

/* The same on the session's product input (act). */
static int product(cuda_session *cs, float *y, bool accumulate, const cuda_mat *w, int n, int rows, int cols)
{
    return product_x(cs, y, accumulate, cs->act, w, n, rows, cols);
}

/* The matrix an expert layer's gate/up product reads its input's maximum for (max_slot): the experts'. */
static const cuda_mat *gu_reader(const cuda_layer *D)
{
    return D->moe ? &D->ex_gu : &D->w_gu;
}

/* Expert e's gate/up (down: its down projection) where the layer's matrices are now. */
static cuda_mat expert_mat(const cuda_layer *D, int e, bool down)
{
    const gemv_expert *o = &D->ex_off[2 * e + down];
    cuda_mat m = down ? D->ex_down : D->ex_gu;
    char *b = e < D->ex_resident ? D->ex_base : D->ex_slot;
    m.w = b + o->w;
    if (m.scales)
        m.scales = (float *)(b + o->scales);
    if (m.code)
        m.code = (float *)(b + o->code);
    if (m.am_q)
        m.am_q = (uint8_t *)(b + o->am_q);
    if (m.am_s2)
        m.am_s2 = (float *)(b + o->am_s2);
    if (m.am_code)
        m.am_code = (float *)(b + o->am_code);
    return m;
}

static bool moe_renorm(const engine_model *m)
{
    return m->arch->moe_renorm || m->cfg.norm_topk_prob;
}

/*
 * An expert layer's MLP for one token (decode, captured in the graph):
 * the router's logits (the shared expert's gate among them) by the decode
 * product with the MLP's norm folded in, as the dense gate/up product
 * does; the routing on the device; the chosen experts' gate/up and down,
 * one launch each over the k choices; the shared expert; and the weighted
 * sum into x. x_max: the input's maximum (max_slot), or NULL.
 */
static int moe_decode(cuda_session *cs, const engine_session *s, int l, uint32_t *x_max)
{
    const engine_model *m = s->model;
    const cfg_model *c = &m->cfg;
    const cuda_layer *D = &cs->layers[l];
    launch_ctx *lc = &cs->lc;
    const int E = c->n_experts, k = c->n_experts_used, F = c->moe_ffn_dim, dim = c->dim;
    const bool shared = D->sh_gu.w != NULL, gelu = c->act == CFG_ACT_GELU_TANH;
    const int nr = E + shared; /* the router's rows: the shared gate is the last */
    const gemv_input in = D->ffn_norm ? GEMV_IN_RMSNORM : GEMV_IN_F32;
    const float eps = (float)c->rms_eps;
    gemv_args r = {.y = cs->moe_logits, .rows = nr, .cols = dim, .in = in, .x = cs->x, .norm = D->ffn_norm,
                   .eps = eps, .x_max = x_max};
    set_mat(&r, &D->router);
    TRY(launch_gemv(lc, &r));
    TRY(launch_moe_route(lc, cs->moe_logits, nr, 1, E, k, moe_renorm(m), cs->moe_ids, cs->moe_w,
                         cs->moe_picks + (size_t)l * E));
    /* A split layer: the CPU runs the choices of the experts in host memory first, into their rows of
     * moe_out; the device's products below skip those choices (GEMV_EXPERT_ABSENT in ex_table). */
    if (D->ex_resident < E && !D->ex_host_gpu)
        TRY(host_experts(cs->host, lc, l, D->ex_resident, cs->x, cs->moe_ids, cs->moe_out));
    /* Choice j's gated hidden state at moe_gu + j * F, its output at moe_out + j * dim. */
    gemv_args gu = {.y = cs->moe_gu, .rows = 2 * F, .cols = dim, .in = in, .x = cs->x, .norm = D->ffn_norm,
                    .eps = eps, .glu_out = true, .gelu = gelu, .x_max = x_max, .experts = D->ex_table,
                    .expert_base = D->ex_base, .expert_ids = cs->moe_ids, .n_choices = k, .x_stride = 0,
                    .y_stride = F};
    set_mat(&gu, &D->ex_gu);
    gemv_args down = {.y = cs->moe_out, .rows = dim, .cols = F, .in = GEMV_IN_F32, .x = cs->moe_gu,
                      .experts = D->ex_table + E, .expert_base = D->ex_base, .expert_ids = cs->moe_ids, .n_choices = k,
                      .x_stride = F, .y_stride = dim};
    set_mat(&down, &D->ex_down);
    if (D->ex_resident > 0 || D->ex_host_gpu) { /* none on the device (--moe-cpu): the host did them all */
        TRY(launch_gemv(lc, &gu));
        TRY(launch_gemv(lc, &down));
    }
    if (shared) {
        const int SF = c->shared_ffn_dim;
        gemv_args sg = {.y = cs->gu, .rows = 2 * SF, .cols = dim, .in = in, .x = cs->x, .norm = D->ffn_norm,
                        .eps = eps, .glu_out = true, .gelu = gelu, .x_max = x_max};
        set_mat(&sg, &D->sh_gu);
        TRY(launch_gemv(lc, &sg));
        gemv_args sd = {.y = cs->moe_sh, .rows = dim, .cols = SF, .in = GEMV_IN_F32, .x = cs->gu};
        set_mat(&sd, &D->sh_down);
        TRY(launch_gemv(lc, &sd));
    }
    /* Unfolded: the sum to moe_sh (each element read before it is written), then residual(). */
    float *dst = cs->unfolded ? cs->moe_sh : NULL;
    TRY(launch_moe_combine(lc, cs->x, dst, cs->moe_out, NULL, cs->moe_w, 1, k, dim, shared ? cs->moe_sh : NULL,
                           cs->moe_logits + E, nr));
    return cs->unfolded ? residual(cs, s, cs->moe_sh, D->ffn_post_norm, 1) : 0;
}

/*
 * An expert layer's MLP for a prompt of n tokens, its input normed in act:
 * router logits by a product, the routing, the (token, choice) slots
 * grouped by expert on the device and their inputs gathered; the groups'
 * sizes cross to the host (the one wait of the layer) so that each picked
 * expert runs its gate/up and down products over its rows alone, and an
 * expert nobody picked costs nothing; then the shared expert, and each
 * token's experts summed into x in the order it chose them.
 */
static int moe_prefill(cuda_session *cs, const engine_session *s, int l, int n)
{
    const engine_model *m = s->model;
    const cfg_model *c = &m->cfg;
    const cuda_layer *D = &cs->layers[l];
    launch_ctx *lc = &cs->lc;
    const k_dtype wt = cs->cm->wt;
    const size_t ws = k_dtype_size(wt);
    const int E = c->n_experts, k = c->n_experts_used, F = c->moe_ffn_dim, dim = c->dim;
    const bool shared = D->sh_gu.w != NULL;
    const int nr = E + shared, cap = n * k + E * (cs->moe_pad - 1);
    TRY(product(cs, cs->moe_logits, false, &D->router, n, nr, dim));
    TRY(launch_moe_route(lc, cs->moe_logits, nr, n, E, k, moe_renorm(m), cs->moe_ids, cs->moe_w,
                         cs->moe_picks + (size_t)l * E));
    TRY(launch_moe_group(lc, cs->moe_ids, n, k, E, cs->moe_pad, cap, cs->moe_first, cs->moe_slot, cs->moe_tok));
    TRY(launch_moe_gather(lc, cs->moe_act, cs->act, wt, cs->moe_tok, cap, dim));
    cudaError_t ce = cudaMemcpyAsync(cs->h_moe_first, cs->moe_first, (2 * (size_t)E + 1) * sizeof(int32_t),
                                     cudaMemcpyDeviceToHost, lc->stream);
    if (ce == cudaSuccess)
        ce = cudaStreamSynchronize(lc->stream);
    if (ce != cudaSuccess)
        return launch_fail(lc, "experts of layer %d: %s", l, cudaGetErrorString(ce));
    const int32_t *first = cs->h_moe_first, *count = first + E + 1;
    for (int e = 0; e < E; e++) {
        if (count[e] <= 0)
            continue;
        const cuda_mat g = expert_mat(D, e, false);
        const size_t r0 = (size_t)first[e];
        TRY(product_x(cs, cs->moe_gu + r0 * 2 * F, false, (char *)cs->moe_act + r0 * dim * ws, &g, count[e], 2 * F,
                      dim));
    }
    /* Every row at once: padding rows are never read. */
    if (c->act == CFG_ACT_GELU_TANH)
        TRY(launch_geglu(lc, cs->moe_h, wt, cs->moe_gu, first[E], F));
    else
        TRY(launch_swiglu(lc, cs->moe_h, wt, cs->moe_gu, first[E], F));
    for (int e = 0; e < E; e++) {
        if (count[e] <= 0)
            continue;
        const cuda_mat d = expert_mat(D, e, true);
        const size_t r0 = (size_t)first[e];
        TRY(product_x(cs, cs->moe_out + r0 * dim, false, (char *)cs->moe_h + r0 * F * ws, &d, count[e], dim, F));
    }
    if (shared) { /* act still holds the input (gathered above); then its hidden state */
        const int SF = c->shared_ffn_dim;
        TRY(product(cs, cs->gu, false, &D->sh_gu, n, 2 * SF, dim));
        if (c->act == CFG_ACT_GELU_TANH)
            TRY(launch_geglu(lc, cs->act, wt, cs->gu, n, SF));
        else
            TRY(launch_swiglu(lc, cs->act, wt, cs->gu, n, SF));
        TRY(product(cs, cs->moe_sh, false, &D->sh_down, n, dim, SF));
    }
    float *dst = cs->unfolded ? cs->moe_sh : NULL;
    TRY(launch_moe_combine(lc, cs->x, dst, cs->moe_out, cs->moe_slot, cs->moe_w, n, k, dim,
                           shared ? cs->moe_sh : NULL, cs->moe_logits + E, nr));
    return cs->unfolded ? residual(cs, s, cs->moe_sh, D->ffn_post_norm, n) : 0;
}

/*
 * Where product k of layer l (0 q/k/v, 1 o, 2 gate/up, 3 down; layer
 * n_layers: the head) finds the largest value of its input, left by the
 * GPU kernel that wrote that input (gemv_args.x_max), or NULL. Only the
 * 4-bit products use it (they stage in fp16, under a scale); the q/k/v
 * product after the embedding or after a CPU-computed layer has no such
 * writer.
 */
static uint32_t *max_slot(cuda_session *cs, int l, int k, const cuda_mat *reader)
{
    /* Unfolded blocks' outputs reach x through residual_add, which posts no maximum; nor does logits_scale. */
    if ((reader->t != K_NF4 && reader->t != K_FP4) || (k == 0 && (l == 0 || stream_hosted(cs, l - 1))) ||
        cs->unfolded)
        return NULL;
    /* Nor does an expert layer's weighted sum; and its down products read k inputs, each finding its own. */
    if ((k == 0 && cs->layers[l - 1].moe) || (k == 3 && cs->layers[l].moe))
        return NULL;
    return cs->in_max + 4 * (size_t)l + k;
}

/* Whether any product of the step gets its input's maximum that way. */
static bool any_max_slot(cuda_session *cs, int n_layers)
{
    for (int l = 0; l < n_layers; l++) {
        const cuda_layer *D = &cs->layers[l];
        if (max_slot(cs, l, 0, &D->wqkv) || max_slot(cs, l, 1, &D->wo) || max_slot(cs, l, 2, gu_reader(D)) ||
            max_slot(cs, l, 3, &D->w_down))
            return true;
    }
    return max_slot(cs, n_layers, 0, &cs->cm->lm_head) != NULL;
}

/*
 * Logits of the last row of x, and their argmax into step[STEP_ARGMAX]; a
 * decode step (feed) also leaves it as the next step's input.
 */
static int head(cuda_session *cs, const engine_session *s, int n, bool feed, const uint32_t *x_max)
{
    const cfg_model *c = &s->model->cfg;
    launch_ctx *lc = &cs->lc;
    gemv_args g = {.y = cs->logits, .rows = c->vocab_size, .cols = c->dim, .in = GEMV_IN_RMSNORM,
                   .x = cs->x + (size_t)(n - 1) * c->dim, .norm = cs->cm->out_norm, .eps = (float)c->rms_eps, .x_max = x_max};
    set_mat(&g, &cs->cm->lm_head);
    if (stream_head_blocks(cs) == 0)
        TRY(launch_gemv(lc, &g));
    for (int b = 0; b < stream_head_blocks(cs); b++) { /* a streamed head: block by block through the slots */
        int r0 = 0, rows = 0;
        void *w = NULL;
        TRY(stream_head_block(cs, b, &w, &r0, &rows));
        g.w = w;
        g.y = cs->logits + r0;
        g.rows = rows;
        TRY(launch_gemv(lc, &g));
        TRY(stream_head_done(cs, b));
    }
    TRY(scale_logits(cs, s, cs->logits, c->vocab_size));
    /* A decode step leaves the next one's input: the token embedded, the maxima zeroed, the ring in host memory. */
    const argmax_feed f = {.token = cs->step + STEP_TOKEN,
                           .pos = cs->step + STEP_POS,
                           .ring = cs->ring,
                           .x = cs->x,
                           .emb = cs->cm->tok_emb,
                           .emb_t = cs->cm->emb_t,
                           .emb_mult = (float)c->embedding_multiplier,
                           .dim = c->dim,
                           .zero = cs->in_max,
                           .n_zero = any_max_slot(cs, c->n_layers) ? PLAN_IN_MAX_SLOTS(c->n_layers) : 0};
    return launch_argmax(lc, cs->step + STEP_ARGMAX, cs->logits, c->vocab_size, cs->argmax_scratch,
                         feed ? &f : NULL);
}

/*
 * Decode attention of layer l: the staged kernel, or from cs->stream_from
 * positions on the streaming one (cs->long_ctx; kernels_cuda.h).
 */
static int attend(cuda_session *cs, const engine_session *s, const rope_qkv_args *ra, int l)
{
    const int window = window_of(s->model, l);
    return cs->long_ctx ? launch_attention_decode_stream(&cs->lc, ra, cs->att, window, cs->n_splits_long)
                        : launch_attention_decode(&cs->lc, ra, cs->att, window, cs->n_splits);
}

/*
 * One token: every launch here is captured into the decode graph. fed: the
 * step before left this one's input (argmax_feed: the token embedded in x,
 * the input maxima zeroed), so it starts with its first product.
 */
static int decode_launches(cuda_session *cs, const engine_session *s, bool fed)
{
    const engine_model *m = s->model;
    const cfg_model *c = &m->cfg;
    launch_ctx *lc = &cs->lc;
    const int dim = c->dim, qd = c->n_heads * c->head_dim, qkvd = qd + 2 * c->n_kv_heads * c->head_dim;
    const float eps = (float)c->rms_eps;

    TRY(trace_stamp(cs, STAMP_START(c->n_layers), 0));
    TRY(stream_begin(cs, s, 1, false, true));
    if (!fed) {
        /* The maxima the kernels post (max_slot) start at zero. */
        if (any_max_slot(cs, c->n_layers) &&
            cudaMemsetAsync(cs->in_max, 0, PLAN_IN_MAX_SLOTS(c->n_layers) * sizeof(uint32_t), lc->stream) !=
                cudaSuccess)
            return launch_fail(lc, "decode: clearing the input maxima: %s", cudaGetErrorString(cudaGetLastError()));
        TRY(launch_embed(lc, cs->x, cs->cm->tok_emb, cs->cm->emb_t, cs->step + STEP_TOKEN, 1, dim,
                         (float)c->embedding_multiplier));
    }
    for (int l = 0; l < c->n_layers; l++) {
        const cuda_layer *D = &cs->layers[l];
        /* The product that reads x after this layer, and its norm. */
        const bool last = l + 1 == c->n_layers;
        const cuda_mat *reader = last ? &cs->cm->lm_head : &cs->layers[l + 1].wqkv;
        const float *next_norm = last ? cs->cm->out_norm : cs->layers[l + 1].attn_norm;
        TRY(trace_stamp(cs, l, 0));
        TRY(stream_before_layer(cs, l));
        if (stream_waits(cs, l))
            TRY(trace_stamp(cs, STAMP_READY(c->n_layers, l), 0));
        rope_qkv_args ra = rope_args(cs, s, l, 1);
        if (stream_hosted(cs, l)) { /* the CPU's products around the GPU's attention */
            const bool next = l + 1 < c->n_layers && stream_hosted(cs, l + 1);
            TRY(host_layer_before(cs->host, lc, l, cs->x, cs->qkv, l == 0 || !stream_hosted(cs, l - 1)));
            TRY(qk_prepare(cs, s, l, 1));
            TRY(attend(cs, s, &ra, l));
            TRY(host_layer_after(cs->host, lc, l, cs->att, cs->x, !next));
            TRY(stream_after_layer(cs, l));
            continue;
        }
        /* Unfolded (cuda_session.unfolded): the attention output to gu[0, dim), the down projection's to
         * gu[ffn, ffn + dim) (it reads gu[0, ffn)), each then added by residual(). */
        const bool unf = cs->unfolded;
        float *o_out = unf ? cs->gu : cs->x, *down_out = unf ? cs->gu + c->ffn_dim : cs->x;
        gemv_args qkv = {.y = cs->qkv, .rows = qkvd, .cols = dim, .in = D->attn_norm ? GEMV_IN_RMSNORM : GEMV_IN_F32,
                         .x = cs->x, .norm = D->attn_norm, .eps = eps, .x_max = max_slot(cs, l, 0, &D->wqkv)};
        set_mat(&qkv, &D->wqkv);
        TRY(launch_gemv(lc, &qkv));
        TRY(qk_prepare(cs, s, l, 1));
        ra.out_max = max_slot(cs, l, 1, &D->wo);
        TRY(attend(cs, s, &ra, l));
        gemv_args o = {.y = o_out, .accumulate = !unf, .rows = dim, .cols = qd, .bias = D->b_o, .in = GEMV_IN_F32,
                       .x = cs->att, .x_max = ra.out_max, .y_max = max_slot(cs, l, 2, gu_reader(D)),
                       .y_max_norm = D->ffn_norm};
        set_mat(&o, &D->wo);
        TRY(launch_gemv(lc, &o));
        if (unf)
            TRY(residual(cs, s, o_out, D->attn_post_norm, 1));
        if (D->moe) {
            TRY(moe_decode(cs, s, l, o.y_max));
            TRY(stream_after_layer(cs, l));
            continue;
        }
        gemv_args gu = {.y = cs->gu, .rows = 2 * c->ffn_dim, .cols = dim, .bias = D->b_gu,
                        .in = D->ffn_norm ? GEMV_IN_RMSNORM : GEMV_IN_F32, .x = cs->x, .norm = D->ffn_norm,
                        .eps = eps, .glu_out = true, .gelu = c->act == CFG_ACT_GELU_TANH, .x_max = o.y_max,
                        .y_max = max_slot(cs, l, 3, &D->w_down)};
        set_mat(&gu, &D->w_gu);
        TRY(launch_gemv(lc, &gu));
        gemv_args down = {.y = down_out, .accumulate = !unf, .rows = dim, .cols = c->ffn_dim, .bias = D->b_down,
                          .in = GEMV_IN_F32, .x = cs->gu, .x_max = gu.y_max, .y_max = max_slot(cs, l + 1, 0, reader),
                          .y_max_norm = next_norm};
        set_mat(&down, &D->w_down);
        TRY(launch_gemv(lc, &down));
        if (unf)
            TRY(residual(cs, s, down_out, D->ffn_post_norm, 1));
        TRY(stream_after_layer(cs, l));
    }
    TRY(trace_stamp(cs, c->n_layers, 0));
    TRY(head(cs, s, 1, true, max_slot(cs, c->n_layers, 0, &cs->cm->lm_head)));
    TRY(trace_stamp(cs, c->n_layers + 1, 1));
    return stream_end(cs);
}

int cuda_decode_eager(cuda_session *cs, const engine_session *s)
{
    cs->long_ctx = s->n_past - 1 >= cs->stream_from;
    return decode_launches(cs, s, false);
}

/* A batch of n tokens at host position pos0 (prompt). */
static int batch_launches(cuda_session *cs, const engine_session *s, int n, int pos0)
{
    const engine_model *m = s->model;
    const cfg_model *c = &m->cfg;
    launch_ctx *lc = &cs->lc;
    const k_dtype wt = cs->cm->wt;
    const int dim = c->dim, qd = c->n_heads * c->head_dim, qkvd = qd + 2 * c->n_kv_heads * c->head_dim;
    const int ffn = c->ffn_dim;
    const float eps = (float)c->rms_eps;

    TRY(stream_begin(cs, s, n, true, false));
    TRY(launch_embed(lc, cs->x, cs->cm->tok_emb, cs->cm->emb_t, cs->ids, n, dim, (float)c->embedding_multiplier));
    /* Unfolded (cuda_session.unfolded): the attention output and the down projection's to gu (free then: the
     * gate/up values are written after the first and read, as act, before the second), then residual(). */
    const bool unf = cs->unfolded;
    float *out = unf ? cs->gu : cs->x;
    for (int l = 0; l < c->n_layers; l++) {
        const cuda_layer *D = &cs->layers[l];
        TRY(stream_before_layer(cs, l));
        TRY(launch_rmsnorm(lc, cs->act, wt, cs->x, D->attn_norm, n, dim, eps)); /* NULL norm: x as it is */
        TRY(product(cs, cs->qkv, false, &D->wqkv, n, qkvd, dim));
        TRY(qk_prepare(cs, s, l, n));
        rope_qkv_args ra = rope_args(cs, s, l, n);
        TRY(launch_rope_qkv(lc, &ra));
        TRY(launch_attention_prefill_ex(lc, cs->act, wt, cs->q, ra.k_cache, ra.v_cache, ra.k_scale, ra.v_scale,
                                        cs->kvt, n, pos0, c->n_heads, c->n_kv_heads, c->head_dim, window_of(m, l),
                                        ra.ring, ra.score_scale, ra.softcap));
        TRY(product(cs, out, !unf, &D->wo, n, dim, qd));
        if (D->b_o)
            TRY(launch_bias_add(lc, out, D->b_o, n, dim));
        if (unf)
            TRY(residual(cs, s, out, D->attn_post_norm, n));
        TRY(launch_rmsnorm(lc, cs->act, wt, cs->x, D->ffn_norm, n, dim, eps));
        if (D->moe) {
            TRY(moe_prefill(cs, s, l, n));
            TRY(stream_after_layer(cs, l));
            continue;
        }
        TRY(product(cs, cs->gu, false, &D->w_gu, n, 2 * ffn, dim));
        if (D->b_gu)
            TRY(launch_bias_add(lc, cs->gu, D->b_gu, n, 2 * ffn));
        if (c->act == CFG_ACT_GELU_TANH)
            TRY(launch_geglu(lc, cs->act, wt, cs->gu, n, ffn));
        else
            TRY(launch_swiglu(lc, cs->act, wt, cs->gu, n, ffn));
        TRY(product(cs, out, !unf, &D->w_down, n, dim, ffn));
        if (D->b_down)
            TRY(launch_bias_add(lc, out, D->b_down, n, dim));
        if (unf)
            TRY(residual(cs, s, out, D->ffn_post_norm, n));
        TRY(stream_after_layer(cs, l));
    }
    TRY(head(cs, s, n, false, NULL));
    return stream_end(cs);
}

/*
 * A decode graph: the layers and the argmax, which leaves the next step's
 * input on the device and its choice in ring slot pos & 1 (host memory).
 * With host_input the step's token and position are copied in first; the
 * other graph takes what the previous step left. (The ring copied out by a
 * memcpy node cost ~10 us a token, 0.5% of an 8B's, on an H100.)
 */
static engine_status capture(cuda_session *cs, const engine_session *s, bool host_input, cudaGraphExec_t *exec,
                             err_buf *e)
{
    cudaStream_t st = cs->lc.stream;
    cudaGraph_t g = NULL;
    cudaError_t ce = cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal);
    if (ce != cudaSuccess)
        return err_set(e, ENGINE_ERR_CUDA, "CUDA graph capture: %s", cudaGetErrorString(ce));
    if (host_input)
        cudaMemcpyAsync(cs->step, cs->h_step, 2 * sizeof(int32_t), cudaMemcpyHostToDevice, st);
    cs->stamping = cs->graphs_stamped;
    int rc = decode_launches(cs, s, !host_input);
    cs->stamping = false;
    ce = cudaStreamEndCapture(st, &g);
    if (rc != 0) {
        if (g)
            cudaGraphDestroy(g);
        return cuda_launch_error(cs, e);
    }
    if (ce == cudaSuccess)
        ce = cudaGraphInstantiate(exec, g, 0);
    if (g)
        cudaGraphDestroy(g);
    if (ce != cudaSuccess) {
        *exec = NULL;
        return err_set(e, ENGINE_ERR_CUDA, "CUDA graph: %s", cudaGetErrorString(ce));
    }
    return ENGINE_OK;
}

/* Queue a batch of the n ids in h_ids at position pos0 (h_step's token and position set from them). */
static int queue_batch(cuda_session *cs, const engine_session *s, int n, int pos0)
{
    cudaStream_t st = cs->lc.stream;
    cs->h_step[STEP_TOKEN] = cs->h_ids[0];
    cs->h_step[STEP_POS] = pos0;
    cudaError_t ce = cudaMemcpyAsync(cs->step, cs->h_step, 2 * sizeof(int32_t), cudaMemcpyHostToDevice, st);
    if (ce == cudaSuccess)
        ce = cudaMemcpyAsync(cs->ids, cs->h_ids, (size_t)n * sizeof(int32_t), cudaMemcpyHostToDevice, st);
    if (ce != cudaSuccess)
        return launch_fail(&cs->lc, "CUDA: %s", cudaGetErrorString(ce));
    return batch_launches(cs, s, n, pos0);
}

/*
 * longrope, as forward_cpu.c's longrope_select: a pass that ends at `end`
 * past the original context (or, after the context was cut back, no longer
 * does) switches the tables to the long (short) factors and first computes
 * the cached positions [0, pos0) again with them, from s->tokens, in
 * batches (each also writes the logits, which the pass after it
 * overwrites). Nothing may be queued on the stream that still reads the
 * tables (the callers have waited for queued steps). The decode graphs
 * read the tables where they are, so they stay valid.
 */
static engine_status longrope_select(engine_session *s, int pos0, int end, err_buf *e)
{
    cuda_session *cs = s->cuda;
    const cfg_model *c = &s->model->cfg;
    cudaStream_t st = cs->lc.stream;
    const bool want = end > c->rope_original_max_position;
    if (c->rope_type != CFG_ROPE_LONGROPE || want == s->rope_long)
        return ENGINE_OK;
    const size_t rot = (size_t)(c->rotary_dim > 0 ? c->rotary_dim : c->head_dim), tab = (size_t)s->n_ctx * (rot / 2);
    float *host = malloc(2 * tab * sizeof *host);
    if (!host)
        return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "out of memory");
    rope_tables_ex(c, s->n_ctx, false, want, host, host + tab);
    cudaError_t ce = cudaMemcpyAsync(cs->rope_cos, host, tab * sizeof(float), cudaMemcpyHostToDevice, st);
    if (ce == cudaSuccess)
        ce = cudaMemcpyAsync(cs->rope_sin, host + tab, tab * sizeof(float), cudaMemcpyHostToDevice, st);
    if (ce == cudaSuccess)
        ce = cudaStreamSynchronize(st); /* before host is freed */
    free(host);
    if (ce != cudaSuccess)
        return err_set(e, ENGINE_ERR_CUDA, "CUDA: %s", cudaGetErrorString(ce));
    s->rope_long = want;
    for (int done = 0; done < pos0;) {
        const int n = pos0 - done < s->n_batch ? pos0 - done : s->n_batch;
        memcpy(cs->h_ids, s->tokens + done, (size_t)n * sizeof *cs->h_ids);
        if (queue_batch(cs, s, n, done) != 0)
            return cuda_launch_error(cs, e);
        ce = cudaStreamSynchronize(st); /* h_ids is read before the next batch refills it */
        if (ce != cudaSuccess)
            return err_set(e, ENGINE_ERR_CUDA, "CUDA: %s", cudaGetErrorString(ce));
        done += n;
    }
    return ENGINE_OK;
}

/*
 * Queue one decode step at position pos, of token id or (id < 0) of the
 * last step's argmax, and record its event. Nothing may be queued that has
 * not yet read h_step when id >= 0 (the graph's first copy reads it).
 */
static engine_status launch_step(engine_session *s, int32_t id, int pos, err_buf *e)
{
    cuda_session *cs = s->cuda;
    const cfg_model *c = &s->model->cfg;
    if (c->rope_type == CFG_ROPE_LONGROPE && (pos + 1 > c->rope_original_max_position) != s->rope_long) {
        /* The step crosses longrope's switch. A step queued before it (greedy: at pos - 1, input
         * q_first_in) is waited for, its argmax becomes this step's token where id < 0, and the cache
         * [0, pos) is computed again, that step's position included. */
        if (cudaStreamSynchronize(cs->lc.stream) != cudaSuccess)
            return err_set(e, ENGINE_ERR_CUDA, "CUDA: %s", cudaGetErrorString(cudaGetLastError()));
        if (cs->q_n > 0) {
            s->tokens[pos - 1] = cs->q_first_in; /* as cuda_greedy_take will write it */
            if (id < 0)
                id = cs->h_step[STEP_RING + ((pos - 1) & 1)];
        }
        if (id < 0)
            return err_set(e, ENGINE_ERR_INVALID_ARG, "decode: no token for position %d", pos);
        engine_status es = longrope_select(s, pos, pos + 1, e);
        if (es)
            return es;
    }
    if (expert_cache_tick(cs, s)) /* swaps queued before the step, outside any capture */
        return cuda_launch_error(cs, e);
    engine_status es = trace_stamps_follow(s, e);
    if (es)
        return es;
    cs->long_ctx = pos >= cs->stream_from;
    cudaGraphExec_t *g = id >= 0 ? &cs->graph[cs->long_ctx] : &cs->graph_fb[cs->long_ctx];
    if (!*g && capture(cs, s, id >= 0, g, e) != ENGINE_OK)
        return e->code;
    if (id >= 0) {
        cs->h_step[STEP_TOKEN] = id;
        cs->h_step[STEP_POS] = pos;
    }
    cudaError_t ce = cudaGraphLaunch(*g, cs->lc.stream);
    if (ce == cudaSuccess)
        ce = cudaEventRecord(cs->step_done[pos & 1], cs->lc.stream);
    cs->stamp_pending[pos & 1] = ce == cudaSuccess && cs->graphs_stamped;
    return ce == cudaSuccess ? ENGINE_OK : err_set(e, ENGINE_ERR_CUDA, "CUDA: %s", cudaGetErrorString(ce));
}

/* The device logits after a dropped step are that step's: evaluate the last token again (same result). */
static engine_status refresh_logits(engine_session *s, err_buf *e)
{
    cuda_session *cs = s->cuda;
    if (!cs->logits_stale)
        return ENGINE_OK;
    engine_status st = launch_step(s, s->tokens[s->n_past - 1], s->n_past - 1, e);
    cudaError_t ce = st ? cudaSuccess : cudaStreamSynchronize(cs->lc.stream);
    if (!st && ce != cudaSuccess)
        st = err_set(e, ENGINE_ERR_CUDA, "CUDA: %s", cudaGetErrorString(ce));
    if (!st)
        cs->logits_stale = false;
    return st;
}

engine_status cuda_forward(engine_session *s, const int32_t *ids, int n, bool want_logits, int32_t *argmax,
                           err_buf *e)
{
    cuda_session *cs = s->cuda;
    cudaStream_t st = cs->lc.stream;
    cudaError_t ce = cudaSuccess;
    cuda_greedy_drop(s);
    cs->logits_stale = false; /* this pass writes them */
    if (n == 1) {
        engine_status es = launch_step(s, ids[0], s->n_past, e);
        if (es)
            return es;
    } else {
        engine_status es = longrope_select(s, s->n_past, s->n_past + n, e);
        if (es)
            return es;
        memcpy(cs->h_ids, ids, (size_t)n * sizeof *ids);
        if (queue_batch(cs, s, n, s->n_past) != 0)
            return cuda_launch_error(cs, e);
        ce = cudaMemcpyAsync(cs->h_step + STEP_ARGMAX, cs->step + STEP_ARGMAX, sizeof(int32_t),
                             cudaMemcpyDeviceToHost, st);
    }
    if (ce == cudaSuccess && n == 1 && cs->host) /* sleep while the CPU works (a blocking-sync event) */
        ce = cudaEventSynchronize(cs->step_done[s->n_past & 1]);
    if (ce == cudaSuccess && want_logits)
        ce = cudaMemcpyAsync(s->logits, cs->logits, (size_t)s->model->cfg.vocab_size * sizeof(float),
                             cudaMemcpyDeviceToHost, st);
    if (ce == cudaSuccess)
        ce = cudaStreamSynchronize(st);
    if (ce != cudaSuccess)
        return err_set(e, ENGINE_ERR_CUDA, "CUDA: %s", cudaGetErrorString(ce));
    if (argmax)
        *argmax = n == 1 ? cs->h_step[STEP_RING + (s->n_past & 1)] : cs->h_step[STEP_ARGMAX];
    if (n == 1)
        trace_gpu_step(cs, s, s->n_past);
    s->n_past += n;
    session_wrote(s, s->n_past);
    return ENGINE_OK;
}

engine_status cuda_greedy_queue(engine_session *s, int32_t id, err_buf *e)
{
    cuda_session *cs = s->cuda;
    const int pos = s->n_past + cs->q_n;
    if (cs->q_n != (id >= 0 ? 0 : 1) || pos >= s->n_ctx)
        return err_set(e, ENGINE_ERR_INVALID_ARG, "greedy decode: cannot queue %s at position %d with %d queued",
                       id >= 0 ? "a token" : "the next step", pos, cs->q_n);
    engine_status st = launch_step(s, id, pos, e);
    if (st)
        return st;
    session_wrote(s, pos + 1); /* its rows are written even if it is dropped */
    if (id >= 0)
        cs->q_first_in = id;
    cs->q_n++;
    cs->logits_stale = false;
    return ENGINE_OK;
}

engine_status cuda_greedy_take(engine_session *s, int32_t *next, err_buf *e)
{
    cuda_session *cs = s->cuda;
    if (cs->q_n == 0)
        return err_set(e, ENGINE_ERR_INVALID_ARG, "greedy decode: nothing queued");
    const int pos = s->n_past;
    /* Only the oldest step is waited for; the one queued after it runs on. */
    cudaError_t ce = cudaEventSynchronize(cs->step_done[pos & 1]);
    if (ce != cudaSuccess) {
        cuda_greedy_drop(s);
        return err_set(e, ENGINE_ERR_CUDA, "CUDA: %s", cudaGetErrorString(ce));
    }
    trace_gpu_step(cs, s, pos);
    s->tokens[pos] = cs->q_first_in;
    /* A step queued after this one takes this one's argmax as its input. */
    cs->q_first_in = *next = cs->h_step[STEP_RING + (pos & 1)];
    cs->q_n--;
    s->n_past++;
    return ENGINE_OK;
}

void cuda_greedy_drop(engine_session *s)
{
    cuda_session *cs = s->cuda;
    if (cs->q_n == 0)
        return;
    cudaStreamSynchronize(cs->lc.stream);
    cs->q_n = 0;
    cs->logits_stale = true;
}

int cuda_sample_candidates(engine_session *s, float temperature, const int32_t **ids, const float **vals, err_buf *e)
{
    cuda_session *cs = s->cuda;
    cudaStream_t st = cs->lc.stream;
    if (refresh_logits(s, e) != ENGINE_OK)
        return -1;
    if (launch_sample_candidates(&cs->lc, cs->logits, s->model->cfg.vocab_size, temperature, CAND_MAX,
                                 cs->step + STEP_COUNT, cs->cand_ids, cs->cand_vals) != 0) {
        cuda_launch_error(cs, e);
        return -1;
    }
    cudaError_t ce = cudaMemcpyAsync(cs->h_step + STEP_COUNT, cs->step + STEP_COUNT, sizeof(int32_t),
                                     cudaMemcpyDeviceToHost, st);
    if (ce == cudaSuccess)
        ce = cudaStreamSynchronize(st);
    const int n = cs->h_step[STEP_COUNT];
    if (ce == cudaSuccess && n > 0 && n <= CAND_MAX) {
        ce = cudaMemcpyAsync(cs->h_cand_ids, cs->cand_ids, (size_t)n * sizeof(int32_t), cudaMemcpyDeviceToHost, st);
        if (ce == cudaSuccess)
            ce = cudaMemcpyAsync(cs->h_cand_vals, cs->cand_vals, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost,
                                 st);
        if (ce == cudaSuccess)
            ce = cudaStreamSynchronize(st);
    }
    if (ce != cudaSuccess) {
        err_set(e, ENGINE_ERR_CUDA, "CUDA: %s", cudaGetErrorString(ce));
        return -1;
    }
    *ids = cs->h_cand_ids;
    *vals = cs->h_cand_vals;
    return n;
}

engine_status cuda_expert_picks(engine_session *s, int l, uint32_t *counts, err_buf *e)
{
    cuda_session *cs = s->cuda;
    const int E = s->model->cfg.n_experts;
    if (!cs->moe_picks)
        return ENGINE_OK;
    uint32_t *dev = malloc((size_t)E * sizeof *dev);
    if (!dev)
        return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "out of memory");
    cudaError_t ce = cudaStreamSynchronize(cs->lc.stream);
    if (ce == cudaSuccess)
        ce = cudaMemcpy(dev, cs->moe_picks + (size_t)l * E, (size_t)E * sizeof *dev, cudaMemcpyDeviceToHost);
    for (int x = 0; ce == cudaSuccess && x < E; x++)
        counts[x] += dev[x];
    free(dev);
    return ce == cudaSuccess ? ENGINE_OK : err_set(e, ENGINE_ERR_CUDA, "CUDA: expert picks: %s", cudaGetErrorString(ce));
}

engine_status cuda_copy_logits(engine_session *s, err_buf *e)
{
    cuda_session *cs = s->cuda;
    if (refresh_logits(s, e) != ENGINE_OK)
        return e->code;
    cudaError_t ce = cudaMemcpyAsync(s->logits, cs->logits, (size_t)s->model->cfg.vocab_size * sizeof(float),
                                     cudaMemcpyDeviceToHost, cs->lc.stream);
    if (ce == cudaSuccess)
        ce = cudaStreamSynchronize(cs->lc.stream);
    return ce == cudaSuccess ? ENGINE_OK : err_set(e, ENGINE_ERR_CUDA, "CUDA: %s", cudaGetErrorString(ce));
}

/*
 * Rows of the device scratch that hold logits for scoring, with their two
 * figures after them (launch_row_lse): the session's gate/up buffer, free
 * between passes. 0 when the head is streamed (its blocks pass through the
 * stream slots one token at a time) or not even one row fits.
 */
int cuda_score_rows_max(const engine_session *s)
{
    const cuda_session *cs = s->cuda;
    const cfg_model *c = &s->model->cfg;
    if (stream_head_blocks(cs) > 0)
        return 0;
    const size_t cap = (size_t)s->n_batch * 2 * c->ffn_dim, per = (size_t)c->vocab_size + 2;
    return cap / per > (size_t)s->n_batch ? s->n_batch : (int)(cap / per);
}

engine_status cuda_score_rows(engine_session *s, int r0, int r1, const int32_t *targets, float *lse_logit,
                              float *rows_out, err_buf *e)
{
    cuda_session *cs = s->cuda;
    const cfg_model *c = &s->model->cfg;
    const cuda_mat *h = &cs->cm->lm_head;
    launch_ctx *lc = &cs->lc;
    const int vocab = c->vocab_size, dim = c->dim, per = cuda_score_rows_max(s);
    if (per <= 0 || r0 < 0 || r1 > s->n_batch || r0 >= r1)
        return err_set(e, ENGINE_ERR_INVALID_ARG, "scoring rows [%d, %d) on the GPU: not possible here", r0, r1);
    float *rows = cs->gu, *figs = cs->gu + (size_t)per * vocab;
    int32_t *d_targets = cs->ids; /* the pass that read the ids is queued before */
    cudaStream_t st = lc->stream;
    for (int a = r0; a < r1; a += per) {
        const int r = r1 - a < per ? r1 - a : per;
        cudaError_t ce = cudaMemcpyAsync(d_targets, targets + (a - r0), (size_t)r * sizeof *targets,
                                         cudaMemcpyHostToDevice, st);
        if (ce != cudaSuccess)
            return err_set(e, ENGINE_ERR_CUDA, "CUDA: %s", cudaGetErrorString(ce));
        const float *xa = cs->x + (size_t)a * dim;
        if (h->t == cs->cm->wt) { /* dense: one product for the rows */
            if (launch_rmsnorm(lc, cs->act, cs->cm->wt, xa, cs->cm->out_norm, r, dim, (float)c->rms_eps) ||
                launch_gemm(lc, rows, false, cs->act, h->w, h->t, r, vocab, dim))
                return cuda_launch_error(cs, e);
        } else { /* quantized: the decode product, row by row */
            for (int j = 0; j < r; j++) {
                gemv_args g = {.y = rows + (size_t)j * vocab, .rows = vocab, .cols = dim, .in = GEMV_IN_RMSNORM,
                               .x = xa + (size_t)j * dim, .norm = cs->cm->out_norm, .eps = (float)c->rms_eps};
                set_mat(&g, h);
                if (launch_gemv(lc, &g))
                    return cuda_launch_error(cs, e);
            }
        }
        if (scale_logits(cs, s, rows, (long)r * vocab) || launch_row_lse(lc, rows, r, vocab, d_targets, figs))
            return cuda_launch_error(cs, e);
        ce = cudaMemcpyAsync(lse_logit + 2 * (size_t)(a - r0), figs, 2 * (size_t)r * sizeof(float),
                             cudaMemcpyDeviceToHost, st);
        if (ce == cudaSuccess && rows_out)
            ce = cudaMemcpyAsync(rows_out + (size_t)(a - r0) * vocab, rows, (size_t)r * vocab * sizeof(float),
                                 cudaMemcpyDeviceToHost, st);
        if (ce == cudaSuccess)
            ce = cudaStreamSynchronize(st);
        if (ce != cudaSuccess)
            return err_set(e, ENGINE_ERR_CUDA, "CUDA: %s", cudaGetErrorString(ce));
    }
    return ENGINE_OK;
}
