/*
 * forward_cpu.c: one pass of the decoder over a batch of new tokens on the
 * CPU, and the RoPE tables it reads. The architecture's feature row decides
 * the optional steps (biases, q/k norms, sliding windows, post and sandwich
 * norms, Granite's multipliers, Gemma's (1 + w) norms, GeGLU and
 * soft-capping, Phi-3's partial rotary and longrope, mixture-of-experts
 * MLPs in forward_moe.c); there is one forward pass for all of them.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "trace.h"

void rope_tables(const cfg_model *c, int n_ctx, float *cos_t, float *sin_t)
{
    rope_tables_ex(c, n_ctx, false, false, cos_t, sin_t);
}

void rope_tables_ex(const cfg_model *c, int n_ctx, bool local, bool long_factors, float *cos_t, float *sin_t)
{
    /* Gemma 3's sliding layers: their own theta, default or linear only. */
    const cfg_rope_type type = local ? c->rope_local_type : c->rope_type;
    const double theta = local ? c->rope_local_theta : c->rope_theta;
    const double factor = local ? c->rope_local_factor : c->rope_factor;
    const int rot = c->rotary_dim > 0 ? c->rotary_dim : c->head_dim, half = rot / 2;
    /* longrope scales cos and sin themselves (transformers' attention_scaling). */
    const float mscale = type == CFG_ROPE_LONGROPE ? (float)c->rope_attention_factor : 1.0f;
    for (int i = 0; i < half; i++) {
        double inv_freq = 1.0 / pow(theta, (2.0 * i) / rot);
        if (type == CFG_ROPE_LLAMA3) {
            /* Llama 3.1: long wavelengths slowed by factor, short kept, a smooth ramp between. */
            const double old = c->rope_original_max_position;
            const double low_wavelen = old / c->rope_low_freq_factor;
            const double high_wavelen = old / c->rope_high_freq_factor;
            const double wavelen = 2.0 * 3.14159265358979323846 / inv_freq;
            if (wavelen > low_wavelen) {
                inv_freq /= factor;
            } else if (wavelen >= high_wavelen) {
                double smooth = (old / wavelen - c->rope_low_freq_factor) /
                                (c->rope_high_freq_factor - c->rope_low_freq_factor);
                inv_freq = (1.0 - smooth) * inv_freq / factor + smooth * inv_freq;
            }
        } else if (type == CFG_ROPE_LINEAR) {
            inv_freq /= factor;
        } else if (type == CFG_ROPE_LONGROPE) {
            /* Each frequency slowed by its own factor: the short ones while
             * a sequence fits the original context, the long ones after. */
            inv_freq /= long_factors ? c->rope_long_factor[i] : c->rope_short_factor[i];
        }
        /* transformers forms the angle p * inv_freq in fp32 (even for a
         * float64 model); rounding it the same way keeps long positions in
         * step with the reference. */
        const float f = (float)inv_freq;
        for (int p = 0; p < n_ctx; p++) {
            const float angle = (float)p * f;
            cos_t[(size_t)p * half + i] = (float)cos(angle) * mscale;
            sin_t[(size_t)p * half + i] = (float)sin(angle) * mscale;
        }
    }
}

/* RMSNorm as the architecture forms it: Gemma's scales by (1 + w). */
static inline void norm(const engine_model *m, const k_ctx *kc, float *y, const float *x, int n, int dim,
                        const k_weight *w)
{
    k_rmsnorm_ex(kc, y, x, n, dim, w, (float)m->cfg.rms_eps, m->arch->norm_offset ? 1.0f : 0.0f);
}

/*
 * The two halves of a layer around its attention, on n rows; the CPU pass
 * runs both with its attention between them, the GPU pass runs them for
 * layers it leaves to the host (cuda/host_layers.c) with the attention on
 * the device.
 *
 * Before: xb = rmsnorm(x) (x itself with post norms), then q, k, v = W xb,
 * with their biases when with_bias (the GPU's attention adds them itself).
 */
void cpu_layer_qkv(const engine_model *m, const k_ctx *kc, int l, int n, const float *x, float *xb, float *q,
                   float *k, float *v, bool with_bias)
{
    const layer_weights *L = &m->layers[l];
    const float *in = x;
    if (L->attn_norm.data) {
        norm(m, kc, xb, x, n, m->cfg.dim, &L->attn_norm);
        in = xb;
    }
    k_matmul(kc, q, in, n, &L->wq, with_bias ? &L->bq : NULL);
    k_matmul(kc, k, in, n, &L->wk, with_bias ? &L->bk : NULL);
    k_matmul(kc, v, in, n, &L->wv, with_bias ? &L->bv : NULL);
}

/*
 * A block's output xb[n, dim] joins the residual stream x: normed first
 * where the architecture norms outputs (OLMo 2, Gemma), scaled by Granite's
 * residual_multiplier.
 */
static void residual_add(const engine_model *m, const k_ctx *kc, int n, float *x, float *xb, const k_weight *post_norm)
{
    const cfg_model *c = &m->cfg;
    const size_t len = (size_t)n * c->dim;
    if (post_norm->data)
        norm(m, kc, xb, xb, n, c->dim, post_norm);
    if (c->residual_multiplier != 1.0)
        k_scale(kc, xb, (float)c->residual_multiplier, len);
    k_add(kc, x, xb, len);
}

/* After: x += Wo att + bo, then x += down(act(gate) * up) of rmsnorm(x)
 * (of x with NORMS_POST; act SiLU or Gemma's tanh GELU), each block's
 * output through residual_add. */
/* An expert layer's MLP (cpu_moe) needs the session's scratch: s, which
 * only the CPU pass has (the CUDA backend runs no expert layers). */
static void layer_out(const engine_session *s, const engine_model *m, const k_ctx *kc, int l, int n, float *x,
                      const float *att, float *xb, float *hb, float *hb2)
{
    const cfg_model *c = &m->cfg;
    const layer_weights *L = &m->layers[l];
    k_matmul(kc, xb, att, n, &L->wo, &L->bo);
    residual_add(m, kc, n, x, xb, &L->attn_post_norm);
    const float *in = x;
    if (L->ffn_norm.data) {
        norm(m, kc, xb, x, n, c->dim, &L->ffn_norm);
        in = xb;
    }
    if (L->experts) {
        /* Without a session (hosted layers, cpu_layer_rate's timing pass)
         * the caller runs the MLP: cpu_moe_token. */
        if (s)
            cpu_moe(s, l, n, in, xb);
        else
            memset(xb, 0, (size_t)n * c->dim * sizeof *xb);
        residual_add(m, kc, n, x, xb, &L->ffn_post_norm);
        return;
    }
    k_matmul(kc, hb, in, n, &L->w_gate, &L->b_gate);
    k_matmul(kc, hb2, in, n, &L->w_up, &L->b_up);
    if (c->act == CFG_ACT_GELU_TANH)
        k_geglu(kc, hb, hb2, (size_t)n * c->ffn_dim);
    else
        k_swiglu(kc, hb, hb2, (size_t)n * c->ffn_dim);
    k_matmul(kc, xb, hb, n, &L->w_down, &L->b_down);
    residual_add(m, kc, n, x, xb, &L->ffn_post_norm);
}

void cpu_layer_out(const engine_model *m, const k_ctx *kc, int l, int n, float *x, const float *att, float *xb,
                   float *hb, float *hb2)
{
    layer_out(NULL, m, kc, l, n, x, att, xb, hb, hb2);
}

/*
 * Layer l over the n rows of s->x (positions pos0..pos0+n-1, s->pos set):
 * its k and v go into the layer's cache rows, its output is added to x.
 */
void forward_cpu_layer(engine_session *s, int l, int n, int pos0)
{
    const engine_model *m = s->model;
    const cfg_model *c = &m->cfg;
    const k_ctx *kc = &s->kc;
    const int hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads;
    const int kvd = nkv * hd;
    const layer_weights *L = &m->layers[l];
    const k_kv_type kt = (k_kv_type)s->kv_type;
    /* This layer's caches: its rows follow the layers' before it; a window layer's may be a ring. */
    const int window = model_layer_window(c, l), ring = window > 0 ? s->kv_ring : 0;
    const size_t rows = model_kv_row0(c, l, s->n_ctx, s->kv_ring) * nkv, esize = k_kv_elem_size(kt);
    const k_kv kv_k = {(char *)s->k_cache + rows * hd * esize, s->k_scales ? s->k_scales + rows : NULL, kt, ring};
    const k_kv kv_v = {(char *)s->v_cache + rows * hd * esize, s->v_scales ? s->v_scales + rows : NULL, kt, ring};
    /* An fp32 cache takes k and v straight into its rows; another type, or
     * a ring (where the pass's rows may wrap), takes them from k_new/v_new
     * once they are final (k normed and rotated), each row quantized as a
     * whole. */
    const bool direct = kt == K_KV_F32 && ring == 0;
    float *kl = direct ? (float *)kv_k.data + (size_t)pos0 * kvd : s->k_new;
    float *vl = direct ? (float *)kv_v.data + (size_t)pos0 * kvd : s->v_new;

    cpu_layer_qkv(m, kc, l, n, s->x, s->xb, s->q, kl, vl, true);
    if (L->q_norm.data) {
        /* Per head (Qwen3, Gemma 3), or over each row's whole projection (OLMo 2). */
        const bool whole = m->arch->qk_norm == QK_WHOLE;
        norm(m, kc, s->q, s->q, whole ? n : n * nh, whole ? nh * hd : hd, &L->q_norm);
        norm(m, kc, kl, kl, whole ? n : n * nkv, whole ? kvd : hd, &L->k_norm);
    }
    /* Gemma 3's sliding layers rotate by a RoPE of their own. */
    const bool local = window > 0 && s->rope_cos_local;
    const float *cs = local ? s->rope_cos_local : s->rope_cos, *sn = local ? s->rope_sin_local : s->rope_sin;
    k_rope_ex(kc, s->q, n, nh, hd, c->rotary_dim, s->pos, cs, sn);
    k_rope_ex(kc, kl, n, nkv, hd, c->rotary_dim, s->pos, cs, sn);
    if (!direct) {
        k_kv_store(kc, &kv_k, kl, n, pos0, nkv, hd);
        k_kv_store(kc, &kv_v, vl, n, pos0, nkv, hd);
    }
    /* The score scale: 1/sqrt(head_dim), or Granite's attention_multiplier,
     * or Gemma's query_pre_attn_scalar^-1/2 (model_apply_arch put it there). */
    const float scale = c->attention_multiplier > 0.0 ? (float)c->attention_multiplier : 1.0f / sqrtf((float)hd);
    k_attention_kv_ex(kc, s->att, s->q, &kv_k, &kv_v, n, pos0, nh, nkv, hd, window, scale, (float)c->attn_softcap);
    layer_out(s, m, kc, l, n, s->x, s->att, s->xb, s->hb, s->hb2);
}

uint64_t cpu_layer_bytes(const engine_model *m, int l)
{
    const layer_weights *L = &m->layers[l];
    const k_weight *w[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
    uint64_t b = 0;
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
        b += w[i]->data ? k_weight_bytes(w[i]) : 0;
    /* An expert layer's dense MLP matrices are NULL: a token reads its
     * router, its shared expert and top-k of its experts (alike in size). */
    if (L->experts) {
        const moe_expert *e = &L->experts[0];
        const k_weight *x[] = {&L->router, &L->shared_gate, &L->shared.w_gate, &L->shared.w_up, &L->shared.w_down};
        for (size_t i = 0; i < sizeof x / sizeof x[0]; i++)
            b += x[i]->data ? k_weight_bytes(x[i]) : 0;
        b += (uint64_t)m->cfg.n_experts_used *
             (k_weight_bytes(&e->w_gate) + k_weight_bytes(&e->w_up) + k_weight_bytes(&e->w_down));
    }
    return b;
}

double cpu_layer_rate(const engine_model *m, const int *layers, int n_layers, int n_threads)
{
    const cfg_model *c = &m->cfg;
    const size_t qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
    const size_t widest = qd > (size_t)c->dim ? qd : (size_t)c->dim;
    const size_t ffn = (size_t)model_ffn_max(c), cols = widest > ffn ? widest : ffn;
    const size_t per_thread = k_matmul_scratch_floats((int)cols);
    const size_t moe = c->n_experts > 0 ? cpu_moe_token_floats(c) : 0;
    const size_t floats = 2 * (size_t)c->dim + qd + 2 * kvd + widest + 2 * (size_t)c->ffn_dim + moe;
    float *buf = calloc(floats + (size_t)n_threads * per_thread, sizeof *buf);
    if (!buf)
        return 0.0;
    float *x = buf, *xb = x + c->dim, *q = xb + c->dim, *k = q + qd, *v = k + kvd, *att = v + kvd;
    float *hb = att + widest, *hb2 = hb + c->ffn_dim, *moe_scratch = hb2 + c->ffn_dim;
    const k_ctx kc = {n_threads, moe_scratch + moe, per_thread};
    for (int i = 0; i < c->dim; i++)
        x[i] = (float)((i * 7919) % 17) / 17.0f - 0.5f;
    /* The first pass faults the pages in and warms the threads; then the
     * best of two. Several layers, as decode reads them: one layer may fit
     * the CPU's last-level cache (300 MiB on the H100 machine's Xeon) and
     * time its second read from there. */
    double best = 0.0;
    uint64_t bytes = 0;
    for (int i = 0; i < n_layers; i++)
        bytes += cpu_layer_bytes(m, layers[i]);
    for (int pass = 0; pass < 3; pass++) {
        const double t0 = model_seconds();
        for (int i = 0; i < n_layers; i++) {
            cpu_layer_qkv(m, &kc, layers[i], 1, x, xb, q, k, v, false);
            memcpy(att, q, qd * sizeof *att);
            cpu_layer_out(m, &kc, layers[i], 1, x, att, xb, hb, hb2);
            if (m->layers[layers[i]].experts) /* the router's top-k, as a hosted layer runs them */
                cpu_moe_token(m, &kc, layers[i], x, moe_scratch, NULL);
        }
        const double t = model_seconds() - t0;
        if (pass > 0 && (best == 0.0 || t < best))
            best = t;
    }
    free(buf);
    return best > 0.0 ? (double)bytes / best : 0.0;
}

/* Embeddings of n tokens into s->x, scaled where the architecture scales them. */
static void embed(engine_session *s, const int32_t *ids, int n)
{
    const cfg_model *c = &s->model->cfg;
    k_embed(&s->kc, s->x, &s->model->tok_emb, ids, n);
    if (c->embedding_multiplier != 1.0)
        k_scale(&s->kc, s->x, (float)c->embedding_multiplier, (size_t)n * c->dim);
}

/*
 * longrope picks its factors by the length of the sequence a pass ends
 * with, for every position: transformers' Phi-3 computes the whole cache
 * again (prepare_inputs_for_generation drops it) once the sequence passes
 * original_max_position_embeddings, so that every key has the long
 * factors. Here too: a pass that ends past it (or, after the context was
 * cut back, no longer does) switches the tables and first runs the cached
 * positions s->tokens[0, pos0) through the layers again.
 */
static void longrope_select(engine_session *s, int pos0, int n)
{
    const cfg_model *c = &s->model->cfg;
    if (c->rope_type != CFG_ROPE_LONGROPE)
        return;
    const bool want = pos0 + n > c->rope_original_max_position;
    if (want == s->rope_long)
        return;
    s->rope_long = want;
    rope_tables_ex(c, s->n_ctx, false, want, s->rope_cos, s->rope_sin);
    for (int done = 0; done < pos0;) {
        const int chunk = pos0 - done < s->n_batch ? pos0 - done : s->n_batch;
        for (int t = 0; t < chunk; t++)
            s->pos[t] = done + t;
        embed(s, s->tokens + done, chunk);
        for (int l = 0; l < c->n_layers; l++)
            forward_cpu_layer(s, l, chunk, done);
        done += chunk;
    }
}

/* logits[n, vocab] of the n rows of x: final norm, head, Granite's scaling, Gemma 2's cap. */
static void head(const engine_session *s, float *logits, const float *x, int n)
{
    const engine_model *m = s->model;
    const cfg_model *c = &m->cfg;
    const size_t len = (size_t)n * c->vocab_size;
    norm(m, &s->kc, s->xb, x, n, c->dim, &m->out_norm);
    k_matmul(&s->kc, logits, s->xb, n, &m->lm_head, NULL);
    if (c->logits_scaling != 1.0)
        k_scale(&s->kc, logits, (float)(1.0 / c->logits_scaling), len);
    if (c->final_softcap > 0.0)
        k_softcap(&s->kc, logits, (float)c->final_softcap, len);
}

void forward_cpu(engine_session *s, const int32_t *ids, int n, bool want_logits, float *rows)
{
    const engine_model *m = s->model;
    const cfg_model *c = &m->cfg;
    const int pos0 = s->n_past;

    longrope_select(s, pos0, n);
    /* Traced: the boundaries of embed, each layer and the head (trace_t). */
    double *tb = s->trace ? s->trace_t : NULL;
    if (tb)
        tb[0] = trace_now(s->trace);
    for (int t = 0; t < n; t++)
        s->pos[t] = pos0 + t;
    embed(s, ids, n);
    if (tb)
        tb[1] = trace_now(s->trace);
    for (int l = 0; l < c->n_layers; l++) {
        forward_cpu_layer(s, l, n, pos0);
        if (tb)
            tb[2 + l] = trace_now(s->trace);
    }
    s->n_past += n;
    session_wrote(s, s->n_past);

    if (rows) {
        /* Scoring: every row's logits (xb holds n_batch rows). */
        head(s, rows, s->x, n);
        if (want_logits)
            memcpy(s->logits, rows + (size_t)(n - 1) * c->vocab_size, (size_t)c->vocab_size * sizeof *s->logits);
    } else if (want_logits) {
        /* Only the last token's logits are needed to continue. */
        head(s, s->logits, s->x + (size_t)(n - 1) * c->dim, 1);
    }
    if (tb)
        tb[2 + c->n_layers] = trace_now(s->trace);
}
