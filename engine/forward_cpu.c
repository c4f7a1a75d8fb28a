/*
 * forward_cpu.c: one pass of the decoder over a batch of new tokens on the
 * CPU, and the RoPE tables it reads. The architecture's feature row decides
 * the optional steps (biases, q/k norms, sliding window); there is one
 * forward pass for all of them.
 */
#include <math.h>
#include <string.h>

#include "model.h"

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
 * Layer l over the n rows of s->x (positions pos0..pos0+n-1, s->pos set):
 * its k and v go into the layer's cache rows, its output is added to x.
 */
void forward_cpu_layer(engine_session *s, int l, int n, int pos0)
{
    const engine_model *m = s->model;
    const cfg_model *c = &m->cfg;
    const k_ctx *kc = &s->kc;
    const int dim = c->dim, hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads;
    const int kvd = nkv * hd, ffn = c->ffn_dim;
    const float eps = (float)c->rms_eps;
    const layer_weights *L = &m->layers[l];
    /* k and v are written straight into this layer's cache rows. */
    float *kl = s->k_cache + ((size_t)l * s->n_ctx + pos0) * kvd;
    float *vl = s->v_cache + ((size_t)l * s->n_ctx + pos0) * kvd;

    k_rmsnorm(kc, s->xb, s->x, n, dim, &L->attn_norm, eps);
    k_matmul(kc, s->q, s->xb, n, &L->wq, &L->bq);
    k_matmul(kc, kl, s->xb, n, &L->wk, &L->bk);
    k_matmul(kc, vl, s->xb, n, &L->wv, &L->bv);
    if (L->q_norm.data) {
        k_rmsnorm(kc, s->q, s->q, n * nh, hd, &L->q_norm, eps);
        k_rmsnorm(kc, kl, kl, n * nkv, hd, &L->k_norm, eps);
    }
    k_rope(kc, s->q, n, nh, hd, s->pos, s->rope_cos, s->rope_sin);
    k_rope(kc, kl, n, nkv, hd, s->pos, s->rope_cos, s->rope_sin);
    const int window = m->arch->sliding_window && l >= c->sliding_from_layer ? c->sliding_window : 0;
    k_attention(kc, s->att, s->q, s->k_cache + (size_t)l * s->n_ctx * kvd, s->v_cache + (size_t)l * s->n_ctx * kvd,
                n, pos0, nh, nkv, hd, window);
    k_matmul(kc, s->xb, s->att, n, &L->wo, &L->bo);
    k_add(kc, s->x, s->xb, (size_t)n * dim);

    k_rmsnorm(kc, s->xb, s->x, n, dim, &L->ffn_norm, eps);
    k_matmul(kc, s->hb, s->xb, n, &L->w_gate, &L->b_gate);
    k_matmul(kc, s->hb2, s->xb, n, &L->w_up, &L->b_up);
    k_swiglu(kc, s->hb, s->hb2, (size_t)n * ffn);
    k_matmul(kc, s->xb, s->hb, n, &L->w_down, &L->b_down);
    k_add(kc, s->x, s->xb, (size_t)n * dim);
}

void forward_cpu(engine_session *s, const int32_t *ids, int n, bool want_logits)
{
    const engine_model *m = s->model;
    const cfg_model *c = &m->cfg;
    const k_ctx *kc = &s->kc;
    const int pos0 = s->n_past;

    for (int t = 0; t < n; t++)
        s->pos[t] = pos0 + t;
    k_embed(kc, s->x, &m->tok_emb, ids, n);
    for (int l = 0; l < c->n_layers; l++)
        forward_cpu_layer(s, l, n, pos0);
    s->n_past += n;

    if (want_logits) {
        /* Only the last token's logits are needed to continue. */
        const float *last = s->x + (size_t)(n - 1) * c->dim;
        k_rmsnorm(kc, s->xb, last, 1, c->dim, &m->out_norm, (float)c->rms_eps);
        k_matmul(kc, s->logits, s->xb, 1, &m->lm_head, NULL);
    }
}
