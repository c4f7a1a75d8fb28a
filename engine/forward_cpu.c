/*
 * forward_cpu.c: one pass of the decoder over a batch of new tokens on the
 * CPU, and the RoPE tables it reads. The architecture's feature row decides
 * the optional steps (biases, q/k norms, sliding window, post norms,
 * Granite's multipliers); there is one forward pass for all of them.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "trace.h"

void rope_tables(const cfg_model *c, int n_ctx, float *cos_t, float *sin_t)
{
    const int half = c->head_dim / 2;
    for (int i = 0; i < half; i++) {
        double inv_freq = 1.0 / pow(c->rope_theta, (2.0 * i) / c->head_dim);
        if (c->rope_type == CFG_ROPE_LLAMA3) {
            /* Llama 3.1: long wavelengths slowed by factor, short kept, a smooth ramp between. */
            const double old = c->rope_original_max_position;
            const double low_wavelen = old / c->rope_low_freq_factor;
            const double high_wavelen = old / c->rope_high_freq_factor;
            const double wavelen = 2.0 * 3.14159265358979323846 / inv_freq;
            if (wavelen > low_wavelen) {
                inv_freq /= c->rope_factor;
            } else if (wavelen >= high_wavelen) {
                double smooth = (old / wavelen - c->rope_low_freq_factor) /
                                (c->rope_high_freq_factor - c->rope_low_freq_factor);
                inv_freq = (1.0 - smooth) * inv_freq / c->rope_factor + smooth * inv_freq;
            }
        } else if (c->rope_type == CFG_ROPE_LINEAR) {
            inv_freq /= c->rope_factor;
        }
        /* transformers forms the angle p * inv_freq in fp32 (even for a
         * float64 model); rounding it the same way keeps long positions in
         * step with the reference. */
        const float f = (float)inv_freq;
        for (int p = 0; p < n_ctx; p++) {
            const float angle = (float)p * f;
            cos_t[(size_t)p * half + i] = (float)cos(angle);
            sin_t[(size_t)p * half + i] = (float)sin(angle);
        }
    }
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
        k_rmsnorm(kc, xb, x, n, m->cfg.dim, &L->attn_norm, (float)m->cfg.rms_eps);
        in = xb;
    }
    k_matmul(kc, q, in, n, &L->wq, with_bias ? &L->bq : NULL);
    k_matmul(kc, k, in, n, &L->wk, with_bias ? &L->bk : NULL);
    k_matmul(kc, v, in, n, &L->wv, with_bias ? &L->bv : NULL);
}

/*
 * A block's output xb[n, dim] joins the residual stream x: normed first
 * where the architecture norms outputs (OLMo 2), scaled by Granite's
 * residual_multiplier.
 */
static void residual_add(const engine_model *m, const k_ctx *kc, int n, float *x, float *xb, const k_weight *post_norm)
{
    const cfg_model *c = &m->cfg;
    const size_t len = (size_t)n * c->dim;
    if (post_norm->data)
        k_rmsnorm(kc, xb, xb, n, c->dim, post_norm, (float)c->rms_eps);
    if (c->residual_multiplier != 1.0)
        k_scale(kc, xb, (float)c->residual_multiplier, len);
    k_add(kc, x, xb, len);
}

/* After: x += Wo att + bo, then x += down(silu(gate) * up) of rmsnorm(x)
 * (of x with post norms), each block's output through residual_add. */
void cpu_layer_out(const engine_model *m, const k_ctx *kc, int l, int n, float *x, const float *att, float *xb,
                   float *hb, float *hb2)
{
    const cfg_model *c = &m->cfg;
    const layer_weights *L = &m->layers[l];
    k_matmul(kc, xb, att, n, &L->wo, &L->bo);
    residual_add(m, kc, n, x, xb, &L->attn_post_norm);
    const float *in = x;
    if (L->ffn_norm.data) {
        k_rmsnorm(kc, xb, x, n, c->dim, &L->ffn_norm, (float)c->rms_eps);
        in = xb;
    }
    k_matmul(kc, hb, in, n, &L->w_gate, &L->b_gate);
    k_matmul(kc, hb2, in, n, &L->w_up, &L->b_up);
    k_swiglu(kc, hb, hb2, (size_t)n * c->ffn_dim);
    k_matmul(kc, xb, hb, n, &L->w_down, &L->b_down);
    residual_add(m, kc, n, x, xb, &L->ffn_post_norm);
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
    const float eps = (float)c->rms_eps;
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
        /* Per head (Qwen3), or over each row's whole projection (OLMo 2). */
        const bool whole = m->arch->qk_norm == QK_WHOLE;
        k_rmsnorm(kc, s->q, s->q, whole ? n : n * nh, whole ? nh * hd : hd, &L->q_norm, eps);
        k_rmsnorm(kc, kl, kl, whole ? n : n * nkv, whole ? kvd : hd, &L->k_norm, eps);
    }
    k_rope(kc, s->q, n, nh, hd, s->pos, s->rope_cos, s->rope_sin);
    /* k_attention_kv scales scores by 1/sqrt(head_dim); Granite's
     * attention_multiplier replaces that scale, through q. */
    if (c->attention_multiplier > 0.0)
        k_scale(kc, s->q, (float)(c->attention_multiplier * sqrt((double)hd)), (size_t)n * nh * hd);
    k_rope(kc, kl, n, nkv, hd, s->pos, s->rope_cos, s->rope_sin);
    if (!direct) {
        k_kv_store(kc, &kv_k, kl, n, pos0, nkv, hd);
        k_kv_store(kc, &kv_v, vl, n, pos0, nkv, hd);
    }
    k_attention_kv(kc, s->att, s->q, &kv_k, &kv_v, n, pos0, nh, nkv, hd, window);
    cpu_layer_out(m, kc, l, n, s->x, s->att, s->xb, s->hb, s->hb2);
}

uint64_t cpu_layer_bytes(const engine_model *m, int l)
{
    const layer_weights *L = &m->layers[l];
    const k_weight *w[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
    uint64_t b = 0;
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
        b += k_weight_bytes(w[i]);
    return b;
}

double cpu_layer_rate(const engine_model *m, const int *layers, int n_layers, int n_threads)
{
    const cfg_model *c = &m->cfg;
    const size_t qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
    const size_t widest = qd > (size_t)c->dim ? qd : (size_t)c->dim;
    const size_t per_thread = k_matmul_scratch_floats((int)(widest > (size_t)c->ffn_dim ? widest : (size_t)c->ffn_dim));
    const size_t floats = 2 * (size_t)c->dim + qd + 2 * kvd + widest + 2 * (size_t)c->ffn_dim;
    float *buf = calloc(floats + (size_t)n_threads * per_thread, sizeof *buf);
    if (!buf)
        return 0.0;
    float *x = buf, *xb = x + c->dim, *q = xb + c->dim, *k = q + qd, *v = k + kvd, *att = v + kvd;
    float *hb = att + widest, *hb2 = hb + c->ffn_dim;
    const k_ctx kc = {n_threads, hb2 + c->ffn_dim, per_thread};
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
        }
        const double t = model_seconds() - t0;
        if (pass > 0 && (best == 0.0 || t < best))
            best = t;
    }
    free(buf);
    return best > 0.0 ? (double)bytes / best : 0.0;
}

void forward_cpu(engine_session *s, const int32_t *ids, int n, bool want_logits, float *rows)
{
    const engine_model *m = s->model;
    const cfg_model *c = &m->cfg;
    const k_ctx *kc = &s->kc;
    const int pos0 = s->n_past;

    /* Traced: the boundaries of embed, each layer and the head (trace_t). */
    double *tb = s->trace ? s->trace_t : NULL;
    if (tb)
        tb[0] = trace_now(s->trace);
    for (int t = 0; t < n; t++)
        s->pos[t] = pos0 + t;
    k_embed(kc, s->x, &m->tok_emb, ids, n);
    if (c->embedding_multiplier != 1.0)
        k_scale(kc, s->x, (float)c->embedding_multiplier, (size_t)n * c->dim);
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
        k_rmsnorm(kc, s->xb, s->x, n, c->dim, &m->out_norm, (float)c->rms_eps);
        k_matmul(kc, rows, s->xb, n, &m->lm_head, NULL);
        if (c->logits_scaling != 1.0)
            k_scale(kc, rows, (float)(1.0 / c->logits_scaling), (size_t)n * c->vocab_size);
        if (want_logits)
            memcpy(s->logits, rows + (size_t)(n - 1) * c->vocab_size, (size_t)c->vocab_size * sizeof *s->logits);
    } else if (want_logits) {
        /* Only the last token's logits are needed to continue. */
        const float *last = s->x + (size_t)(n - 1) * c->dim;
        k_rmsnorm(kc, s->xb, last, 1, c->dim, &m->out_norm, (float)c->rms_eps);
        k_matmul(kc, s->logits, s->xb, 1, &m->lm_head, NULL);
        if (c->logits_scaling != 1.0)
            k_scale(kc, s->logits, (float)(1.0 / c->logits_scaling), (size_t)c->vocab_size);
    }
    if (tb)
        tb[2 + c->n_layers] = trace_now(s->trace);
}
