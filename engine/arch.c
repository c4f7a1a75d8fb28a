/*
 * arch.c: the table of supported architectures and the binding of their
 * weights (names and shapes as transformers saves them) to views into the
 * mapping. Every architecture here shares tensor names; what differs is a
 * row of flags (OLMo 2's post_attention_layernorm is the one name whose
 * place differs, model_bind_weights).
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "model.h"

static const arch_features ARCHES[] = {
    /* name                 label      qkv_bias qk_norm    config_bias sliding_window post_norms multipliers cuda */
    {"LlamaForCausalLM",    "Llama",   false,   QK_NONE,   true,       false,         false,     false,      true},
    {"MistralForCausalLM",  "Mistral", false,   QK_NONE,   false,      true,          false,     false,      true},
    {"Qwen2ForCausalLM",    "Qwen2",   true,    QK_NONE,   false,      true,          false,     false,      true},
    {"Qwen3ForCausalLM",    "Qwen3",   false,   QK_HEAD,   true,       true,          false,     false,      true},
    {"GraniteForCausalLM",  "Granite", false,   QK_NONE,   true,       false,         false,     true,       false},
    {"Olmo2ForCausalLM",    "OLMo 2",  false,   QK_WHOLE,  true,       false,         true,      false,      false},
};

const arch_features *arch_find(const char *name)
{
    for (size_t i = 0; i < sizeof ARCHES / sizeof ARCHES[0]; i++)
        if (strcmp(ARCHES[i].name, name) == 0)
            return &ARCHES[i];
    return NULL;
}

const char *arch_supported_list(void)
{
    return "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, GraniteForCausalLM, "
           "Olmo2ForCausalLM";
}

static k_dtype to_kdtype(st_dtype t)
{
    return t == ST_F16 ? K_F16 : t == ST_BF16 ? K_BF16 : K_F32;
}

/*
 * Look up name and check it is a floating tensor of shape [rows, cols]
 * (cols == 0: a vector of rows elements). optional: absence is not an error
 * and leaves w->data NULL.
 */
static engine_status bind(engine_model *m, k_weight *w, const char *name, int rows, int cols, bool optional,
                          err_buf *e)
{
    memset(w, 0, sizeof *w);
    const st_tensor *t = st_find(m->weights, name);
    const char *file = st_file_path(m->weights, 0);
    if (!t) {
        if (optional)
            return ENGINE_OK;
        return err_set(e, ENGINE_ERR_FORMAT, "%s: tensor '%s' is missing", file, name);
    }
    file = st_file_path(m->weights, t->shard);
    if (t->dtype == ST_I8 || t->dtype == ST_U8 || has_bnb_state(m, name))
        return bind_quantized(m, w, t, name, rows, cols, e);
    if (t->dtype != ST_F32 && t->dtype != ST_F16 && t->dtype != ST_BF16)
        return err_set(e, ENGINE_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s; this build reads F32, F16, BF16 and quantized I8/U8",
                       file, name, st_dtype_name(t->dtype));
    bool ok = cols == 0 ? (t->n_dims == 1 && t->shape[0] == rows)
                        : (t->n_dims == 2 && t->shape[0] == rows && t->shape[1] == cols);
    if (!ok) {
        char got[96] = "", want[48];
        size_t off = 0;
        for (int i = 0; i < t->n_dims && off < sizeof got; i++)
            off += (size_t)snprintf(got + off, sizeof got - off, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
        if (cols == 0)
            snprintf(want, sizeof want, "%d", rows);
        else
            snprintf(want, sizeof want, "%d, %d", rows, cols);
        return err_set(e, ENGINE_ERR_FORMAT, "%s: tensor '%s' has shape [%s], expected [%s] from config.json", file,
                       name, got, want);
    }
    /* Kernels load elements through typed pointers; writers pad headers so
     * data is aligned, and a file that is not would need copying first. */
    if ((uintptr_t)t->data % st_dtype_size(t->dtype) != 0)
        return err_set(e, ENGINE_ERR_UNSUPPORTED, "%s: tensor '%s' data is not %zu-byte aligned in the file", file,
                       name, st_dtype_size(t->dtype));
    w->data = t->data;
    w->dtype = to_kdtype(t->dtype);
    w->rows = cols == 0 ? 1 : rows;
    w->cols = cols == 0 ? rows : cols;
    m->n_params += t->n_elements;
    m->weight_bytes += t->nbytes;
    return ENGINE_OK;
}

engine_status model_bind_weights(engine_model *m, err_buf *e)
{
    const cfg_model *c = &m->cfg;
    const arch_features *a = m->arch;
    const int dim = c->dim, hd = c->head_dim, qd = c->n_heads * hd, kvd = c->n_kv_heads * hd, ffn = c->ffn_dim;
    const bool attn_bias = a->config_bias && c->attention_bias;
    const bool qkv_bias = a->qkv_bias || attn_bias;
    engine_status st;
    char name[160];

#define BIND(w, rows, cols, optional)                                    \
    do {                                                                 \
        if ((st = bind(m, (w), name, (rows), (cols), (optional), e)))    \
            return st;                                                   \
    } while (0)
#define BIND_NAMED(w, nm, rows, cols, optional)        \
    do {                                               \
        snprintf(name, sizeof name, "%s", (nm));       \
        BIND(w, rows, cols, optional);                 \
    } while (0)

    BIND_NAMED(&m->tok_emb, "model.embed_tokens.weight", c->vocab_size, dim, false);
    /* k_embed reads rows of a dense table; a quantized one would have to be
     * decoded per token, which no writer here produces. */
    if (k_dtype_is_quant(m->tok_emb.dtype))
        return err_set(e, ENGINE_ERR_UNSUPPORTED, "%s: 'model.embed_tokens.weight' is quantized; embeddings must be "
                       "F32, F16 or BF16", st_file_path(m->weights, st_find(m->weights, name)->shard));
    BIND_NAMED(&m->out_norm, "model.norm.weight", dim, 0, false);
    /* Tied checkpoints usually omit lm_head; some keep a copy, which is then used. */
    BIND_NAMED(&m->lm_head, "lm_head.weight", c->vocab_size, dim, c->tie_embeddings);
    if (!m->lm_head.data)
        m->lm_head = m->tok_emb;

    for (int l = 0; l < c->n_layers; l++) {
        layer_weights *L = &m->layers[l];
        memset(L, 0, sizeof *L); /* absent biases and norms stay NULL */
#define LAYER(w, suffix, rows, cols, optional)                                  \
    do {                                                                        \
        snprintf(name, sizeof name, "model.layers.%d.%s", l, (suffix));         \
        BIND(w, rows, cols, optional);                                          \
    } while (0)
        /* OLMo 2 norms each block's output instead of its input: its
         * post_attention_layernorm follows attention, where Llama's comes
         * before the MLP. */
        if (!a->post_norms)
            LAYER(&L->attn_norm, "input_layernorm.weight", dim, 0, false);
        LAYER(&L->wq, "self_attn.q_proj.weight", qd, dim, false);
        LAYER(&L->wk, "self_attn.k_proj.weight", kvd, dim, false);
        LAYER(&L->wv, "self_attn.v_proj.weight", kvd, dim, false);
        LAYER(&L->wo, "self_attn.o_proj.weight", dim, qd, false);
        if (qkv_bias) {
            LAYER(&L->bq, "self_attn.q_proj.bias", qd, 0, false);
            LAYER(&L->bk, "self_attn.k_proj.bias", kvd, 0, false);
            LAYER(&L->bv, "self_attn.v_proj.bias", kvd, 0, false);
        }
        if (attn_bias)
            LAYER(&L->bo, "self_attn.o_proj.bias", dim, 0, false);
        if (a->qk_norm != QK_NONE) {
            LAYER(&L->q_norm, "self_attn.q_norm.weight", a->qk_norm == QK_WHOLE ? qd : hd, 0, false);
            LAYER(&L->k_norm, "self_attn.k_norm.weight", a->qk_norm == QK_WHOLE ? kvd : hd, 0, false);
        }
        if (a->post_norms) {
            LAYER(&L->attn_post_norm, "post_attention_layernorm.weight", dim, 0, false);
            LAYER(&L->ffn_post_norm, "post_feedforward_layernorm.weight", dim, 0, false);
        } else {
            LAYER(&L->ffn_norm, "post_attention_layernorm.weight", dim, 0, false);
        }
        LAYER(&L->w_gate, "mlp.gate_proj.weight", ffn, dim, false);
        LAYER(&L->w_up, "mlp.up_proj.weight", ffn, dim, false);
        LAYER(&L->w_down, "mlp.down_proj.weight", dim, ffn, false);
        if (c->mlp_bias) {
            LAYER(&L->b_gate, "mlp.gate_proj.bias", ffn, 0, false);
            LAYER(&L->b_up, "mlp.up_proj.bias", ffn, 0, false);
            LAYER(&L->b_down, "mlp.down_proj.bias", dim, 0, false);
        }
#undef LAYER
    }
#undef BIND
#undef BIND_NAMED
    return ENGINE_OK;
}
