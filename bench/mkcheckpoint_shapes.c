/*
 * mkcheckpoint_shapes.c: the shapes mkcheckpoint writes (the published
 * configs' sizes), their config.json and their tensors as transformers
 * names them.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mkcheckpoint.h"

const dtype_info dtypes[3] = {
    [DT_BF16] = {"bf16", "BF16", "bfloat16", 2},
    [DT_F16] = {"f16", "F16", "float16", 2},
    [DT_F32] = {"f32", "F32", "float32", 4},
};

static const shape_def shapes[] = {
    {"llama-3.2-1b", 2048, 16, 32, 8, 64, 8192, 128256, 131072, true, 1e-5, 500000.0, 32.0, 1.0, 4.0, 8192, 128000,
     128001, ARCH_LLAMA, 0},
    {"llama-3.1-8b", 4096, 32, 32, 8, 128, 14336, 128256, 131072, false, 1e-5, 500000.0, 8.0, 1.0, 4.0, 8192, 128000,
     128001, ARCH_LLAMA, 0},
    /* google/gemma-2-9b: head_dim 256, window 4096 on every other layer, soft-caps 50/30. */
    {"gemma-2-9b", 3584, 42, 16, 8, 256, 14336, 256000, 8192, true, 1e-6, 10000.0, 1.0, 0, 0, 0, 2, 1, ARCH_GEMMA2,
     4096},
    /* google/gemma-3-4b's text model: 5 local (window 1024, theta 10000) to 1 global (1e6, linear 8). */
    {"gemma-3-4b", 2560, 34, 8, 4, 256, 10240, 262208, 131072, true, 1e-6, 1000000.0, 8.0, 0, 0, 0, 2, 1,
     ARCH_GEMMA3, 1024},
    /* microsoft/Phi-3.5-mini-instruct: fused qkv/gate_up, longrope from 4096 to 131072. */
    {"phi-3.5-mini", 3072, 32, 32, 32, 96, 8192, 32064, 131072, false, 1e-5, 10000.0, 0, 0, 0, 4096, 1, 32000,
     ARCH_PHI3, 0},
    /* mistralai/Mixtral-8x7B-v0.1: 8 experts of 14336 (intermediate_size), top 2. */
    {"mixtral-8x7b", 4096, 32, 32, 8, 128, 14336, 32000, 32768, false, 1e-5, 1000000.0, 0, 0, 0, 0, 1, 2,
     ARCH_MIXTRAL, 0, 8, 2, 14336},
    /* Qwen/Qwen3-30B-A3B: 128 experts of 768, top 8, q/k norms, every layer sparse. */
    {"qwen3-30b-a3b", 2048, 48, 32, 4, 128, 6144, 151936, 40960, false, 1e-6, 1000000.0, 0, 0, 0, 0, 151643,
     151645, ARCH_QWEN3MOE, 0, 128, 8, 768},
    /* allenai/OLMoE-1B-7B-0924: 64 experts of 1024, top 8, q/k norms over whole projections. */
    {"olmoe-1b-7b", 2048, 16, 16, 16, 128, 1024, 50304, 4096, false, 1e-5, 10000.0, 0, 0, 0, 0, 50279, 50279,
     ARCH_OLMOE, 0, 64, 8, 1024},
    /* Smoke test: same features as 8B (GQA, untied head, llama3 RoPE), tiny sizes. */
    {"tiny", 64, 2, 4, 2, 16, 176, 512, 2048, false, 1e-5, 500000.0, 8.0, 1.0, 4.0, 256, 1, 2, ARCH_LLAMA, 0},
};

const shape_def *shape_find(const char *name)
{
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
        if (strcmp(name, shapes[k].name) == 0)
            return &shapes[k];
    return NULL;
}

static int llama_config(text *t, const shape_def *s, dtype_t dt)
{
    return text_add(t,
                    "{\n"
                    "  \"architectures\": [\n    \"LlamaForCausalLM\"\n  ],\n"
                    "  \"attention_bias\": false,\n"
                    "  \"attention_dropout\": 0.0,\n"
                    "  \"bos_token_id\": %d,\n"
                    "  \"eos_token_id\": %d,\n"
                    "  \"head_dim\": %d,\n"
                    "  \"hidden_act\": \"silu\",\n"
                    "  \"hidden_size\": %d,\n"
                    "  \"initializer_range\": 0.02,\n"
                    "  \"intermediate_size\": %d,\n"
                    "  \"max_position_embeddings\": %d,\n"
                    "  \"mlp_bias\": false,\n"
                    "  \"model_type\": \"llama\",\n"
                    "  \"num_attention_heads\": %d,\n"
                    "  \"num_hidden_layers\": %d,\n"
                    "  \"num_key_value_heads\": %d,\n"
                    "  \"pretraining_tp\": 1,\n"
                    "  \"rms_norm_eps\": %g,\n"
                    "  \"rope_scaling\": {\n"
                    "    \"factor\": %.1f,\n"
                    "    \"high_freq_factor\": %.1f,\n"
                    "    \"low_freq_factor\": %.1f,\n"
                    "    \"original_max_position_embeddings\": %d,\n"
                    "    \"rope_type\": \"llama3\"\n"
                    "  },\n"
                    "  \"rope_theta\": %.1f,\n"
                    "  \"tie_word_embeddings\": %s,\n"
                    "  \"torch_dtype\": \"%s\",\n"
                    "  \"use_cache\": true,\n"
                    "  \"vocab_size\": %d\n"
                    "}\n",
                    s->bos, s->eos, s->head_dim, s->hidden, s->ffn, s->max_pos, s->heads, s->layers, s->kv_heads,
                    s->rms_eps, s->rope_factor, s->rope_high, s->rope_low, s->rope_orig_max_pos, s->rope_theta,
                    s->tied ? "true" : "false", dtypes[dt].torch_name, s->vocab);
}

/* Gemma 2 and 3 as their configs on the Hub have them (no layer_types: the
 * engine derives the pattern, as transformers does). */
static int gemma_config(text *t, const shape_def *s, dtype_t dt)
{
    const bool g3 = s->arch == ARCH_GEMMA3;
    return text_add(t,
                    "{\n"
                    "  \"architectures\": [\"%s\"],\n"
                    "  \"model_type\": \"%s\",\n"
                    "  \"attention_bias\": false,\n"
                    "  \"attn_logit_softcapping\": %s,\n"
                    "  \"final_logit_softcapping\": %s,\n"
                    "  \"bos_token_id\": %d,\n"
                    "  \"eos_token_id\": %d,\n"
                    "  \"head_dim\": %d,\n"
                    "  \"hidden_activation\": \"gelu_pytorch_tanh\",\n"
                    "  \"hidden_size\": %d,\n"
                    "  \"intermediate_size\": %d,\n"
                    "  \"max_position_embeddings\": %d,\n"
                    "  \"num_attention_heads\": %d,\n"
                    "  \"num_hidden_layers\": %d,\n"
                    "  \"num_key_value_heads\": %d,\n"
                    "  \"query_pre_attn_scalar\": %d,\n"
                    "  \"rms_norm_eps\": %g,\n"
                    "  \"rope_theta\": %.1f,\n"
                    "%s"
                    "  \"sliding_window\": %d,\n"
                    "  \"tie_word_embeddings\": %s,\n"
                    "  \"torch_dtype\": \"%s\",\n"
                    "  \"vocab_size\": %d\n"
                    "}\n",
                    g3 ? "Gemma3ForCausalLM" : "Gemma2ForCausalLM", g3 ? "gemma3_text" : "gemma2",
                    g3 ? "null" : "50.0", g3 ? "null" : "30.0", s->bos, s->eos, s->head_dim, s->hidden, s->ffn,
                    s->max_pos, s->heads, s->layers, s->kv_heads, s->head_dim, s->rms_eps, s->rope_theta,
                    g3 ? "  \"rope_local_base_freq\": 10000.0,\n"
                         "  \"rope_scaling\": {\"factor\": 8.0, \"rope_type\": \"linear\"},\n"
                         "  \"sliding_window_pattern\": 6,\n"
                       : "",
                    s->window, s->tied ? "true" : "false", dtypes[dt].torch_name, s->vocab);
}

/* Phi-3.5-mini's config, its longrope factors made up (monotone, the right count). */
static int phi3_config(text *t, const shape_def *s, dtype_t dt)
{
    int rc = text_add(t,
                      "{\n"
                      "  \"architectures\": [\"Phi3ForCausalLM\"],\n"
                      "  \"model_type\": \"phi3\",\n"
                      "  \"bos_token_id\": %d,\n"
                      "  \"eos_token_id\": %d,\n"
                      "  \"hidden_act\": \"silu\",\n"
                      "  \"hidden_size\": %d,\n"
                      "  \"intermediate_size\": %d,\n"
                      "  \"max_position_embeddings\": %d,\n"
                      "  \"num_attention_heads\": %d,\n"
                      "  \"num_hidden_layers\": %d,\n"
                      "  \"num_key_value_heads\": %d,\n"
                      "  \"original_max_position_embeddings\": %d,\n"
                      "  \"rms_norm_eps\": %g,\n"
                      "  \"rope_theta\": %.1f,\n"
                      "  \"sliding_window\": 262144,\n"
                      "  \"tie_word_embeddings\": %s,\n"
                      "  \"torch_dtype\": \"%s\",\n"
                      "  \"vocab_size\": %d,\n"
                      "  \"rope_scaling\": {\n    \"type\": \"longrope\",\n",
                      s->bos, s->eos, s->hidden, s->ffn, s->max_pos, s->heads, s->layers, s->kv_heads,
                      s->rope_orig_max_pos, s->rms_eps, s->rope_theta, s->tied ? "true" : "false",
                      dtypes[dt].torch_name, s->vocab);
    const int n = s->head_dim / 2;
    for (int f = 0; f < 2 && rc == 0; f++) {
        rc = text_add(t, "    \"%s_factor\": [", f ? "long" : "short");
        for (int i = 0; i < n && rc == 0; i++)
            rc = text_add(t, "%s%.4f", i ? ", " : "", f ? 1.0 + 40.0 * i / (n - 1) : 1.0 + 0.5 * i / (n - 1));
        if (rc == 0)
            rc = text_add(t, "]%s\n", f ? "" : ",");
    }
    return rc ? rc : text_add(t, "  }\n}\n");
}

/* Mixtral, Qwen3-MoE and OLMoE as their published configs have them. */
static int moe_config(text *t, const shape_def *s, dtype_t dt)
{
    const bool mixtral = s->arch == ARCH_MIXTRAL, qwen = s->arch == ARCH_QWEN3MOE;
    int rc = text_add(t,
                      "{\n"
                      "  \"architectures\": [\"%s\"],\n"
                      "  \"model_type\": \"%s\",\n"
                      "  \"attention_bias\": false,\n"
                      "  \"bos_token_id\": %d,\n"
                      "  \"eos_token_id\": %d,\n"
                      "  \"hidden_act\": \"silu\",\n"
                      "  \"hidden_size\": %d,\n"
                      "  \"intermediate_size\": %d,\n"
                      "  \"max_position_embeddings\": %d,\n"
                      "  \"num_attention_heads\": %d,\n"
                      "  \"num_hidden_layers\": %d,\n"
                      "  \"num_key_value_heads\": %d,\n"
                      "  \"%s\": %d,\n"
                      "  \"num_experts_per_tok\": %d,\n"
                      "  \"rms_norm_eps\": %g,\n"
                      "  \"rope_theta\": %.1f,\n"
                      "  \"tie_word_embeddings\": %s,\n"
                      "  \"torch_dtype\": \"%s\",\n",
                      mixtral ? "MixtralForCausalLM" : qwen ? "Qwen3MoeForCausalLM" : "OlmoeForCausalLM",
                      mixtral ? "mixtral" : qwen ? "qwen3_moe" : "olmoe", s->bos, s->eos, s->hidden, s->ffn,
                      s->max_pos, s->heads, s->layers, s->kv_heads, mixtral ? "num_local_experts" : "num_experts",
                      s->experts, s->top_k, s->rms_eps, s->rope_theta, s->tied ? "true" : "false",
                      dtypes[dt].torch_name);
    if (rc == 0 && mixtral)
        rc = text_add(t, "  \"sliding_window\": null,\n");
    if (rc == 0 && qwen)
        rc = text_add(t,
                      "  \"head_dim\": %d,\n"
                      "  \"moe_intermediate_size\": %d,\n"
                      "  \"norm_topk_prob\": true,\n"
                      "  \"decoder_sparse_step\": 1,\n"
                      "  \"mlp_only_layers\": [],\n"
                      "  \"use_sliding_window\": false,\n",
                      s->head_dim, s->moe_ffn);
    if (rc == 0 && s->arch == ARCH_OLMOE)
        rc = text_add(t, "  \"clip_qkv\": null,\n  \"norm_topk_prob\": false,\n  \"pad_token_id\": 1,\n");
    return rc ? rc : text_add(t, "  \"vocab_size\": %d\n}\n", s->vocab);
}

int config_json(text *t, const shape_def *s, dtype_t dt)
{
    if (s->experts > 0)
        return moe_config(t, s, dt);
    return s->arch == ARCH_PHI3 ? phi3_config(t, s, dt)
           : s->arch == ARCH_LLAMA ? llama_config(t, s, dt)
                                   : gemma_config(t, s, dt);
}


int build_tensors(const shape_def *s, dtype_t dt, tensor_def **out)
{
    const bool gemma = s->arch == ARCH_GEMMA2 || s->arch == ARCH_GEMMA3;
    const int n = 2 + (13 + 1 + 3 * s->experts) * s->layers + (s->tied ? 0 : 1); /* at most */
    tensor_def *ts = calloc((size_t)n, sizeof *ts);
    if (!ts) {
        fail("out of memory");
        return -1;
    }
    const int64_t d = s->hidden, q = (int64_t)s->heads * s->head_dim, kv = (int64_t)s->kv_heads * s->head_dim;
    const int64_t ffn = s->ffn;
    /* Gemma's norms scale by 1 + w: 0 is its identity. */
    const float one = gemma ? 0.0f : 1.0f;
    int k = 0;
#define ADD(r, c, nrm, ...)                                                  \
    do {                                                                     \
        snprintf(ts[k].name, sizeof ts[k].name, __VA_ARGS__);                \
        ts[k].rows = (r);                                                    \
        ts[k].cols = (c);                                                    \
        ts[k].norm = (nrm);                                                  \
        ts[k].value = one;                                                   \
        k++;                                                                 \
    } while (0)
    ADD(s->vocab, d, false, "model.embed_tokens.weight");
    for (int l = 0; l < s->layers; l++) {
        ADD(d, 0, true, "model.layers.%d.input_layernorm.weight", l);
        if (s->arch == ARCH_PHI3) {
            ADD(q + 2 * kv, d, false, "model.layers.%d.self_attn.qkv_proj.weight", l);
        } else {
            ADD(q, d, false, "model.layers.%d.self_attn.q_proj.weight", l);
            ADD(kv, d, false, "model.layers.%d.self_attn.k_proj.weight", l);
            ADD(kv, d, false, "model.layers.%d.self_attn.v_proj.weight", l);
        }
        if (s->arch == ARCH_GEMMA3 || s->arch == ARCH_QWEN3MOE) {
            ADD(s->head_dim, 0, true, "model.layers.%d.self_attn.q_norm.weight", l);
            ADD(s->head_dim, 0, true, "model.layers.%d.self_attn.k_norm.weight", l);
        } else if (s->arch == ARCH_OLMOE) {
            ADD(q, 0, true, "model.layers.%d.self_attn.q_norm.weight", l);
            ADD(kv, 0, true, "model.layers.%d.self_attn.k_norm.weight", l);
        }
        ADD(d, q, false, "model.layers.%d.self_attn.o_proj.weight", l);
        ADD(d, 0, true, "model.layers.%d.post_attention_layernorm.weight", l);
        if (gemma) {
            ADD(d, 0, true, "model.layers.%d.pre_feedforward_layernorm.weight", l);
            ADD(d, 0, true, "model.layers.%d.post_feedforward_layernorm.weight", l);
        }
        if (s->experts > 0) {
            /* Per expert, as transformers saves them: Mixtral's w1 (gate),
             * w3 (up), w2 (down) under block_sparse_moe, the others'
             * gate_proj/up_proj/down_proj under mlp; the router is "gate". */
            const bool mx = s->arch == ARCH_MIXTRAL;
            const char *blk = mx ? "block_sparse_moe" : "mlp";
            const int64_t f = s->moe_ffn;
            ADD(s->experts, d, false, "model.layers.%d.%s.gate.weight", l, blk);
            for (int x = 0; x < s->experts; x++) {
                ADD(f, d, false, "model.layers.%d.%s.experts.%d.%s.weight", l, blk, x, mx ? "w1" : "gate_proj");
                ADD(f, d, false, "model.layers.%d.%s.experts.%d.%s.weight", l, blk, x, mx ? "w3" : "up_proj");
                ADD(d, f, false, "model.layers.%d.%s.experts.%d.%s.weight", l, blk, x, mx ? "w2" : "down_proj");
            }
            continue;
        }
        if (s->arch == ARCH_PHI3) {
            ADD(2 * ffn, d, false, "model.layers.%d.mlp.gate_up_proj.weight", l);
        } else {
            ADD(ffn, d, false, "model.layers.%d.mlp.gate_proj.weight", l);
            ADD(ffn, d, false, "model.layers.%d.mlp.up_proj.weight", l);
        }
        ADD(d, ffn, false, "model.layers.%d.mlp.down_proj.weight", l);
    }
    ADD(d, 0, true, "model.norm.weight");
    if (!s->tied)
        ADD(s->vocab, d, false, "lm_head.weight");
#undef ADD
    for (int i = 0; i < k; i++) {
        ts[i].n = (uint64_t)ts[i].rows * (uint64_t)(ts[i].cols ? ts[i].cols : 1);
        ts[i].bytes = ts[i].n * dtypes[dt].size;
        ts[i].src = i;
    }
    *out = ts;
    return k;
}

/* The linear weights: what --quant quantizes (as tools/quantize picks them). */
bool is_linear(const char *name)
{
    const size_t n = strlen(name);
    const char *const sfx[] = {"_proj.weight", ".w1.weight", ".w2.weight", ".w3.weight"};
    for (size_t i = 0; i < sizeof sfx / sizeof sfx[0]; i++)
        if (n >= strlen(sfx[i]) && strcmp(name + n - strlen(sfx[i]), sfx[i]) == 0)
            return true;
    return false;
}
