/*
 * arch.c: the table of supported architectures and the binding of their
 * weights (names and shapes as transformers saves them) to views into the
 * mapping. Every architecture here shares tensor names; what differs is a
 * row of flags (post_attention_layernorm follows attention with NORMS_POST
 * and NORMS_SANDWICH, where Llama's comes before the MLP; Phi-3's fused
 * qkv_proj and gate_up_proj are bound as views of their row blocks, or
 * read as their parts' unfused names where engine_quantize split them).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <math.h>

#include "../kernels/cpu/dtype.h"
#include "model.h"

/*
 * The CUDA pass of the rows marked CUDA_PREVIEW is written but has not yet
 * run on a GPU: the library refuses them on CUDA unless it was built with
 * -DENGINE_CUDA_PREVIEW=ON, which the GPU tests use to check them
 * (test_parity_cuda, test_model_cuda) before their column is set to true
 * (as Granite's, OLMo 2's, Gemma's and Phi-3's were on 2026-11-28).
 */
#ifdef ENGINE_CUDA_PREVIEW
#define CUDA_PREVIEW true
#else
#define CUDA_PREVIEW false
#endif

/* One row per architecture; a feature left out is off (0, false, NULL). */
static const arch_features ARCHES[] = {
    {.name = "LlamaForCausalLM", .label = "Llama", .config_bias = true, .cuda = true},
    {.name = "MistralForCausalLM", .label = "Mistral", .sliding_window = true, .cuda = true},
    {.name = "Qwen2ForCausalLM", .label = "Qwen2", .qkv_bias = true, .sliding_window = true, .cuda = true},
    {.name = "Qwen3ForCausalLM", .label = "Qwen3", .qk_norm = QK_HEAD, .config_bias = true, .sliding_window = true,
     .cuda = true},
    {.name = "GraniteForCausalLM", .label = "Granite", .config_bias = true, .multipliers = true,
     .cuda = true},
    {.name = "Olmo2ForCausalLM", .label = "OLMo 2", .qk_norm = QK_WHOLE, .config_bias = true, .norms = NORMS_POST,
     .cuda = true},
    {.name = "Gemma2ForCausalLM", .label = "Gemma 2", .config_bias = true, .sliding_window = true,
     .norms = NORMS_SANDWICH, .norm_offset = true, .embed_scale = true, .query_scalar = 256, .softcap = true,
     .attn_softcap = 50.0, .final_softcap = 30.0, .window_period = 2, .cuda = true},
    {.name = "Gemma3ForCausalLM", .label = "Gemma 3", .qk_norm = QK_HEAD, .config_bias = true,
     .sliding_window = true, .norms = NORMS_SANDWICH, .norm_offset = true, .embed_scale = true, .query_scalar = 256,
     .softcap = true, .window_period = 6, .local_rope = true, .cuda = true},
    {.name = "Phi3ForCausalLM", .label = "Phi-3", .sliding_window = true, .fused = true, .cuda = true},
    /* Mixture of experts; their CUDA pass (every expert resident, or whole
     * layers streamed or hosted) has not yet run on a GPU. */
    {.name = "MixtralForCausalLM", .label = "Mixtral", .sliding_window = true, .moe = true, .moe_renorm = true,
     .moe_block = "block_sparse_moe", .cuda = true},
    {.name = "Qwen2MoeForCausalLM", .label = "Qwen2-MoE", .qkv_bias = true, .sliding_window = true, .moe = true,
     .moe_ffn_key = true, .moe_shared = true, .moe_sparse_step = true, .cuda = true},
    {.name = "Qwen3MoeForCausalLM", .label = "Qwen3-MoE", .qk_norm = QK_HEAD, .config_bias = true,
     .sliding_window = true, .moe = true, .moe_ffn_key = true, .moe_sparse_step = true, .cuda = true},
    {.name = "OlmoeForCausalLM", .label = "OLMoE", .qk_norm = QK_WHOLE, .config_bias = true, .moe = true,
     .cuda = true},
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
           "Olmo2ForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM, Phi3ForCausalLM, MixtralForCausalLM, "
           "Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, OlmoeForCausalLM";
}

/*
 * The experts' config against the row: cleared for a dense architecture;
 * for an MoE one the count, the top-k and the experts' width must be there
 * (Mixtral and OLMoE size experts by intermediate_size), and the layer
 * choice and renormalisation follow the row.
 */
static engine_status apply_moe(const arch_features *a, cfg_model *c, const char *file, err_buf *e)
{
    if (!a->moe) {
        c->n_experts = c->n_experts_used = c->moe_ffn_dim = c->shared_ffn_dim = 0;
        c->norm_topk_prob = false;
        c->decoder_sparse_step = 1;
        memset(c->mlp_only_layers, 0, sizeof c->mlp_only_layers);
        return ENGINE_OK;
    }
    if (c->n_experts <= 0)
        return err_set(e, ENGINE_ERR_FORMAT, "%s: no '%s' (%s routes to experts)", file,
                       a->moe_block ? "num_local_experts" : "num_experts", a->label);
    if (c->n_experts_used <= 0)
        return err_set(e, ENGINE_ERR_FORMAT, "%s: no 'num_experts_per_tok'", file);
    if (!a->moe_ffn_key)
        c->moe_ffn_dim = c->ffn_dim;
    else if (c->moe_ffn_dim <= 0)
        return err_set(e, ENGINE_ERR_FORMAT, "%s: no 'moe_intermediate_size'", file);
    if (!a->moe_shared)
        c->shared_ffn_dim = 0;
    else if (c->shared_ffn_dim <= 0)
        return err_set(e, ENGINE_ERR_FORMAT, "%s: no 'shared_expert_intermediate_size' (%s has a shared expert)",
                       file, a->label);
    if (!a->moe_sparse_step) {
        c->decoder_sparse_step = 1;
        memset(c->mlp_only_layers, 0, sizeof c->mlp_only_layers);
    }
    if (a->moe_renorm)
        c->norm_topk_prob = true;
    /* OLMoE's clamp of q, k and v: its released checkpoints leave it null. */
    if (c->clip_qkv_given)
        return err_set(e, ENGINE_ERR_UNSUPPORTED, "%s: 'clip_qkv' is set; clamping q/k/v is not supported", file);
    return ENGINE_OK;
}

engine_status model_apply_arch(engine_model *m, const char *file, err_buf *e)
{
    const arch_features *a = m->arch;
    cfg_model *c = &m->cfg;
    engine_status st;
    /* A window in the config of an architecture without one is not used:
     * cleared, so that the config alone says which layers have one. */
    if (!a->sliding_window) {
        c->sliding_window = c->sliding_from_layer = 0;
        memset(c->sliding_layers, 0, sizeof c->sliding_layers);
    }
    /* Gemma's configs before transformers 5 leave layer_types out: every
     * window_period-th layer is global (Gemma 3: sliding_window_pattern). */
    if (a->window_period > 0 && !c->layer_types_given && c->sliding_window > 0) {
        const int period = c->sliding_window_pattern > 0 ? c->sliding_window_pattern : a->window_period;
        if (c->n_layers > CFG_MAX_LAYERS)
            return err_set(e, ENGINE_ERR_UNSUPPORTED, "%s: %d layers alternating sliding and full; at most %d supported",
                           file, c->n_layers, CFG_MAX_LAYERS);
        c->sliding_from_layer = c->n_layers;
        memset(c->sliding_layers, 0, sizeof c->sliding_layers);
        for (int l = 0; l < c->n_layers; l++)
            if ((l + 1) % period != 0)
                c->sliding_layers[l / 64] |= 1ull << (l % 64);
    }
    /* Granite's scalings; GraniteConfig's attention_multiplier defaults to
     * 1 (not 1/sqrt(head_dim)). */
    if (!a->multipliers) {
        c->embedding_multiplier = c->residual_multiplier = c->logits_scaling = 1.0;
        c->attention_multiplier = 0.0;
    } else if (c->attention_multiplier == 0.0) {
        c->attention_multiplier = 1.0;
    }
    /* Gemma scales scores by query_pre_attn_scalar^-1/2: the passes read
     * every score scale from attention_multiplier. */
    if (a->query_scalar > 0) {
        if (c->query_pre_attn_scalar == 0.0)
            c->query_pre_attn_scalar = a->query_scalar;
        c->attention_multiplier = 1.0 / sqrt(c->query_pre_attn_scalar);
    } else {
        c->query_pre_attn_scalar = 0.0;
    }
    if (!a->softcap) {
        c->attn_softcap = c->final_softcap = 0.0;
    } else {
        if (c->attn_softcap < 0.0)
            c->attn_softcap = a->attn_softcap;
        if (c->final_softcap < 0.0)
            c->final_softcap = a->final_softcap;
    }
    if ((st = apply_moe(a, c, file, e)))
        return st;
    if (!a->local_rope) {
        c->rope_local_theta = 0.0;
    } else if (c->rope_local_theta == 0.0) {
        c->rope_local_theta = 10000.0; /* Gemma3TextConfig's default */
    }
    return ENGINE_OK;
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

/*
 * out = rows [row0, row0 + rows) of the bound matrix w, as a view (a fused
 * tensor's part: nothing is copied). Dense and int8 rows are contiguous; a
 * 4-bit matrix's blocks run across rows, so its part must start on a block
 * boundary (and, double-quantized, on one of the absmax scales' blocks).
 */
static engine_status row_view(const engine_model *m, const k_weight *w, int row0, int rows, k_weight *out,
                              const char *name, err_buf *e)
{
    *out = *w;
    out->rows = rows;
    const size_t e0 = (size_t)row0 * (size_t)w->cols;
    if (!k_dtype_is_quant(w->dtype)) {
        out->data = (const char *)w->data + e0 * k_dtype_size(w->dtype);
        return ENGINE_OK;
    }
    if (w->dtype == K_I8) {
        out->data = (const int8_t *)w->data + e0;
        out->scales = w->scales + (size_t)row0 * (size_t)((w->cols + w->group - 1) / w->group);
        return ENGINE_OK;
    }
    const size_t b0 = w->block > 0 ? e0 / (size_t)w->block : 0;
    if (w->block <= 0 || e0 % (size_t)w->block != 0 || e0 % 2 != 0 ||
        (w->absmax_q && b0 % (size_t)w->absmax_block != 0))
        return err_set(e, ENGINE_ERR_UNSUPPORTED, "%s: tensor '%s' is fused and 4-bit, and its part at row %d does "
                       "not start on a quantization block; quantize the original checkpoint instead",
                       st_file_path(m->weights, 0), name, row0);
    out->data = (const uint8_t *)w->data + e0 / 2;
    if (w->absmax_q) {
        out->absmax_q = w->absmax_q + b0;
        out->absmax_scale = w->absmax_scale + b0 / (size_t)w->absmax_block;
    } else {
        out->absmax = w->absmax + b0;
    }
    return ENGINE_OK;
}

/*
 * A stacked expert tensor [E, rows, cols] (transformers 5's in-memory
 * layout, which some checkpoints store) as one [E * rows, cols] matrix whose
 * row blocks are the experts (row_view). Only floating types: quantizing
 * writes stacked experts as their per-expert parts.
 */
static engine_status bind_stacked(engine_model *m, k_weight *w, const char *name, int E, int rows, int cols,
                                  err_buf *e)
{
    memset(w, 0, sizeof *w);
    const st_tensor *t = st_find(m->weights, name);
    const char *file = st_file_path(m->weights, t ? t->shard : 0);
    if (!t)
        return err_set(e, ENGINE_ERR_FORMAT, "%s: tensor '%s' is missing", file, name);
    if (t->dtype != ST_F32 && t->dtype != ST_F16 && t->dtype != ST_BF16)
        return err_set(e, ENGINE_ERR_UNSUPPORTED, "%s: stacked experts '%s' have dtype %s; they are read as F32, "
                       "F16 or BF16 (quantize writes them per expert)", file, name, st_dtype_name(t->dtype));
    if (t->n_dims != 3 || t->shape[0] != E || t->shape[1] != rows || t->shape[2] != cols)
        return err_set(e, ENGINE_ERR_FORMAT, "%s: tensor '%s' is not [%d, %d, %d] as config.json gives", file, name,
                       E, rows, cols);
    if ((uintptr_t)t->data % st_dtype_size(t->dtype) != 0)
        return err_set(e, ENGINE_ERR_UNSUPPORTED, "%s: tensor '%s' data is not %zu-byte aligned in the file", file,
                       name, st_dtype_size(t->dtype));
    *w = (k_weight){.data = t->data, .dtype = to_kdtype(t->dtype), .rows = E * rows, .cols = cols};
    m->n_params += t->n_elements;
    m->weight_bytes += t->nbytes;
    return ENGINE_OK;
}

/*
 * An expert layer's router, experts (into ex[n_experts]) and shared expert.
 * Experts are per-expert tensors (gate_proj/up_proj/down_proj, or Mixtral's
 * w1/w3/w2) under the row's block name or "mlp" (where engine_quantize puts
 * the parts of stacked ones), or stacked gate_up_proj and down_proj.
 */
static engine_status bind_moe(engine_model *m, int l, layer_weights *L, moe_expert *ex, err_buf *e)
{
    static const char *const NAMES[2][3] = {{"gate_proj", "up_proj", "down_proj"}, {"w1", "w3", "w2"}};
    const cfg_model *c = &m->cfg;
    const int dim = c->dim, F = c->moe_ffn_dim, E = c->n_experts;
    const char *blk = m->arch->moe_block ? m->arch->moe_block : "mlp";
    const char *blocks[2] = {blk, "mlp"};
    engine_status st;
    char name[192];
    snprintf(name, sizeof name, "model.layers.%d.%s.gate.weight", l, blk);
    if ((st = bind(m, &L->router, name, E, dim, false, e)))
        return st;
    L->experts = ex;
    for (int b = 0; b < 2; b++) {
        snprintf(name, sizeof name, "model.layers.%d.%s.experts.gate_up_proj", l, blocks[b]);
        if (!st_find(m->weights, name))
            continue;
        k_weight gu, down;
        if ((st = bind_stacked(m, &gu, name, E, 2 * F, dim, e)))
            return st;
        for (int x = 0; x < E && !st; x++)
            if ((st = row_view(m, &gu, x * 2 * F, F, &ex[x].w_gate, name, e)) == ENGINE_OK)
                st = row_view(m, &gu, x * 2 * F + F, F, &ex[x].w_up, name, e);
        snprintf(name, sizeof name, "model.layers.%d.%s.experts.down_proj", l, blocks[b]);
        if (st || (st = bind_stacked(m, &down, name, E, dim, F, e)))
            return st;
        for (int x = 0; x < E && !st; x++)
            st = row_view(m, &down, x * dim, dim, &ex[x].w_down, name, e);
        if (st)
            return st;
        goto shared;
    }
    /* Per expert: the naming (and block) expert 0 uses holds for all. */
    int v = 0, b = 0;
    for (int i = 0; i < 4; i++) {
        snprintf(name, sizeof name, "model.layers.%d.%s.experts.0.%s.weight", l, blocks[i / 2], NAMES[i % 2][0]);
        if (st_find(m->weights, name)) {
            b = i / 2, v = i % 2;
            break;
        }
    }
    for (int x = 0; x < E; x++) {
        k_weight *w[3] = {&ex[x].w_gate, &ex[x].w_up, &ex[x].w_down};
        for (int i = 0; i < 3; i++) {
            snprintf(name, sizeof name, "model.layers.%d.%s.experts.%d.%s.weight", l, blocks[b], x, NAMES[v][i]);
            if ((st = bind(m, w[i], name, i == 2 ? dim : F, i == 2 ? F : dim, false, e)))
                return st;
        }
    }
shared:
    if (c->shared_ffn_dim > 0) {
        const int SF = c->shared_ffn_dim;
        k_weight *w[3] = {&L->shared.w_gate, &L->shared.w_up, &L->shared.w_down};
        for (int i = 0; i < 3; i++) {
            snprintf(name, sizeof name, "model.layers.%d.%s.shared_expert.%s.weight", l, blk, NAMES[0][i]);
            if ((st = bind(m, w[i], name, i == 2 ? dim : SF, i == 2 ? SF : dim, false, e)))
                return st;
        }
        snprintf(name, sizeof name, "model.layers.%d.%s.shared_expert_gate.weight", l, blk);
        if ((st = bind(m, &L->shared_gate, name, 1, dim, false, e)))
            return st;
    }
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

    /* Every expert layer's experts in one block the model owns (the
     * k_weights, not the weights: those stay views). */
    int n_moe = 0;
    for (int l = 0; l < c->n_layers; l++)
        n_moe += a->moe && cfg_layer_moe(c, l);
    free(m->experts);
    m->experts = n_moe ? calloc((size_t)n_moe * (size_t)c->n_experts, sizeof *m->experts) : NULL;
    if (n_moe && !m->experts)
        return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "%s: out of memory for %d layers of %d experts",
                       st_file_path(m->weights, 0), n_moe, c->n_experts);
    n_moe = 0;

    for (int l = 0; l < c->n_layers; l++) {
        layer_weights *L = &m->layers[l];
        memset(L, 0, sizeof *L); /* absent biases and norms stay NULL */
#define LAYER(w, suffix, rows, cols, optional)                                  \
    do {                                                                        \
        snprintf(name, sizeof name, "model.layers.%d.%s", l, (suffix));         \
        BIND(w, rows, cols, optional);                                          \
    } while (0)
        /* NORMS_POST (OLMo 2) norms each block's output instead of its
         * input, NORMS_SANDWICH (Gemma) both: their post_attention_layernorm
         * follows attention, where Llama's comes before the MLP. */
        if (a->norms != NORMS_POST)
            LAYER(&L->attn_norm, "input_layernorm.weight", dim, 0, false);
        /* A fused checkpoint quantized by engine_quantize holds the parts
         * under the unfused names. */
        snprintf(name, sizeof name, "model.layers.%d.self_attn.qkv_proj.weight", l);
        const bool fused = a->fused && st_find(m->weights, name);
        if (fused) {
            k_weight qkv;
            LAYER(&qkv, "self_attn.qkv_proj.weight", qd + 2 * kvd, dim, false);
            if ((st = row_view(m, &qkv, 0, qd, &L->wq, name, e)) ||
                (st = row_view(m, &qkv, qd, kvd, &L->wk, name, e)) ||
                (st = row_view(m, &qkv, qd + kvd, kvd, &L->wv, name, e)))
                return st;
        } else {
            LAYER(&L->wq, "self_attn.q_proj.weight", qd, dim, false);
            LAYER(&L->wk, "self_attn.k_proj.weight", kvd, dim, false);
            LAYER(&L->wv, "self_attn.v_proj.weight", kvd, dim, false);
        }
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
        if (a->norms != NORMS_PRE) {
            LAYER(&L->attn_post_norm, "post_attention_layernorm.weight", dim, 0, false);
            LAYER(&L->ffn_post_norm, "post_feedforward_layernorm.weight", dim, 0, false);
            if (a->norms == NORMS_SANDWICH)
                LAYER(&L->ffn_norm, "pre_feedforward_layernorm.weight", dim, 0, false);
        } else {
            LAYER(&L->ffn_norm, "post_attention_layernorm.weight", dim, 0, false);
        }
        if (a->moe && cfg_layer_moe(c, l)) {
            if ((st = bind_moe(m, l, L, m->experts + (size_t)n_moe++ * c->n_experts, e)))
                return st;
            continue;
        }
        snprintf(name, sizeof name, "model.layers.%d.mlp.gate_up_proj.weight", l);
        if (a->fused && st_find(m->weights, name)) {
            k_weight gu;
            LAYER(&gu, "mlp.gate_up_proj.weight", 2 * ffn, dim, false);
            if ((st = row_view(m, &gu, 0, ffn, &L->w_gate, name, e)) ||
                (st = row_view(m, &gu, ffn, ffn, &L->w_up, name, e)))
                return st;
        } else {
            LAYER(&L->w_gate, "mlp.gate_proj.weight", ffn, dim, false);
            LAYER(&L->w_up, "mlp.up_proj.weight", ffn, dim, false);
        }
        LAYER(&L->w_down, "mlp.down_proj.weight", dim, ffn, false);
        if (c->mlp_bias) {
            LAYER(&L->b_gate, "mlp.gate_proj.bias", ffn, 0, false);
            LAYER(&L->b_up, "mlp.up_proj.bias", ffn, 0, false);
            LAYER(&L->b_down, "mlp.down_proj.bias", dim, 0, false);
        }
#undef LAYER
    }
    /* transformers multiplies by sqrt(hidden_size) cast to the table's dtype
     * (Gemma 2304 -> 48 exactly, but 3584 -> 59.75 in bf16). */
    if (a->embed_scale) {
        const float s = (float)sqrt((double)dim);
        m->cfg.embedding_multiplier = m->tok_emb.dtype == K_BF16  ? bf16_to_f32(f32_to_bf16(s))
                                      : m->tok_emb.dtype == K_F16 ? f16_to_f32(f32_to_f16(s))
                                                                  : s;
    }
#undef BIND
#undef BIND_NAMED
    return ENGINE_OK;
}
