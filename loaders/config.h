/*
 * config.h: the model description read from Hugging Face config.json,
 * generation_config.json and tokenizer_config.json.
 *
 * Fields are accepted in the older layout (top-level rope_theta,
 * rope_scaling) and the newer one (rope_parameters). Values that transformers
 * derives when absent are derived the same way here (head_dim = hidden /
 * heads, n_kv_heads = n_heads, ...). Consistency is checked: positive sizes,
 * heads dividing the width where head_dim is implicit, kv heads dividing
 * heads.
 */
#ifndef ENGINE_CONFIG_H
#define ENGINE_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "../engine/error.h"

#define CFG_MAX_EOS 8

typedef enum cfg_rope_type {
    CFG_ROPE_DEFAULT = 0,
    CFG_ROPE_LLAMA3,   /* factor, low/high_freq_factor, original_max_position_embeddings */
    CFG_ROPE_LINEAR,   /* positions divided by factor */
    CFG_ROPE_LONGROPE  /* Phi-3: per-frequency short/long factors, attention factor,
                          original_max_position_embeddings */
} cfg_rope_type;

/* The MLP's activation (of the gate, times up). */
typedef enum cfg_act {
    CFG_ACT_SILU = 0,  /* "silu" (SwiGLU)                                  */
    CFG_ACT_GELU_TANH  /* "gelu_pytorch_tanh": tanh-approximated GELU (GeGLU) */
} cfg_act;

#define CFG_MAX_LAYERS 1024      /* layers a mixed layer_types list may name */
#define CFG_MAX_ROPE_FACTORS 256 /* longrope factors: rotary_dim / 2 of them */

typedef struct cfg_model {
    char architecture[64];  /* architectures[0], e.g. "LlamaForCausalLM" */
    char model_type[32];    /* "llama", "mistral", "qwen2", "qwen3"        */
    char hidden_act[32];    /* hidden_activation (Gemma), else hidden_act:
                               "silu" ("gelu_pytorch_tanh" needs 18 bytes)  */
    cfg_act act;            /* hidden_act as parsed                        */
    int dim;                /* hidden_size                                 */
    int n_layers;           /* num_hidden_layers                           */
    int n_heads;            /* num_attention_heads                         */
    int n_kv_heads;         /* num_key_value_heads (default n_heads)       */
    int head_dim;           /* head_dim (default dim / n_heads)            */
    int ffn_dim;            /* intermediate_size                           */
    int vocab_size;
    int max_position;       /* max_position_embeddings                     */
    int sliding_window;     /* 0 = none (Mistral v0.1 sets 4096)           */
    int sliding_from_layer; /* first layer the window applies to: 0 for
                               Mistral, max_window_layers for Qwen2/3;
                               n_layers when sliding_layers says instead  */
    uint64_t sliding_layers[CFG_MAX_LAYERS / 64]; /* bit l: layer l has the window
                               too (a layer_types list that mixes them) */
    bool layer_types_given; /* layer_types was in the file (else an
                               architecture may derive it, model.c)      */
    int sliding_window_pattern; /* Gemma 3's older key: every Nth layer
                               global (0: absent)                        */
    double rms_eps;         /* rms_norm_eps                                */
    double rope_theta;
    cfg_rope_type rope_type;
    double rope_factor;
    double rope_low_freq_factor;
    double rope_high_freq_factor;
    int rope_original_max_position;
    int rotary_dim;         /* leading elements of each head RoPE rotates:
                               head_dim * partial_rotary_factor (even)    */
    double rope_attention_factor; /* longrope: cos and sin times this    */
    float rope_short_factor[CFG_MAX_ROPE_FACTORS]; /* longrope: [rotary_dim/2] */
    float rope_long_factor[CFG_MAX_ROPE_FACTORS];  /* longrope, once a sequence
                               passes rope_original_max_position          */
    /* Gemma 3's local (sliding) layers' RoPE: rope_local_base_freq, or
     * rope_parameters.sliding_attention; 0 theta when none was given. */
    double rope_local_theta;
    cfg_rope_type rope_local_type; /* DEFAULT or LINEAR                   */
    double rope_local_factor;
    /* Gemma's attention: */
    double query_pre_attn_scalar; /* scores scaled by its -1/2 power in place
                               of head_dim's; 0 when absent              */
    double attn_softcap;    /* attn_logit_softcapping: scores become
                               cap*tanh(s/cap); 0 null, -1 absent         */
    double final_softcap;   /* final_logit_softcapping, likewise on logits */    /* Granite's scalings (the engine clears them to 1 for an architecture
     * without them): */
    double embedding_multiplier; /* embeddings times this (default 1)      */
    double residual_multiplier;  /* each block's output times this before
                                    the residual add (default 1)           */
    double attention_multiplier; /* the attention score scale; 0 when absent
                                    (1/sqrt(head_dim), or the architecture's) */
    double logits_scaling;       /* logits divided by this (default 1)     */
    /* Mixture of experts (the engine clears them for a dense architecture,
     * model_apply_arch): */
    int n_experts;          /* num_local_experts (Mixtral; transformers 5's
                               Qwen3-MoE) or num_experts; 0: none          */
    int n_experts_used;     /* num_experts_per_tok: the top-k routed to     */
    int moe_ffn_dim;        /* moe_intermediate_size (Qwen2/3-MoE); the
                               architecture may take intermediate_size     */
    int shared_ffn_dim;     /* shared_expert_intermediate_size (Qwen2-MoE);
                               0: no shared expert                         */
    bool norm_topk_prob;    /* the top-k probabilities renormalised to sum 1 */
    int decoder_sparse_step; /* layer l has experts when (l + 1) % step == 0 */
    uint64_t mlp_only_layers[CFG_MAX_LAYERS / 64]; /* bit l: layer l is dense */
    bool clip_qkv_given;    /* OLMoE's clip_qkv is set (not null)           */
    bool tie_embeddings;    /* tie_word_embeddings                         */
    bool attention_bias;    /* q/k/v/o bias (Llama) -- Qwen2 implies q/k/v */
    bool mlp_bias;
    int bos_id;             /* -1 when absent                              */
    int eos_ids[CFG_MAX_EOS];
    int n_eos;
    char torch_dtype[16];   /* "bfloat16", "float32", ... or ""             */
} cfg_model;

/* Defaults for sampling from generation_config.json (absent: unset flags). */
typedef struct cfg_generation {
    bool has_temperature, has_top_k, has_top_p, has_repetition_penalty;
    double temperature, top_p, repetition_penalty;
    int top_k;
    bool do_sample;
    int bos_id;
    int eos_ids[CFG_MAX_EOS];
    int n_eos;
} cfg_generation;

/*
 * Whether layer l routes to experts: n_experts > 0, l + 1 a multiple of
 * decoder_sparse_step and l not in mlp_only_layers (Qwen2/3-MoE; the other
 * MoE architectures have experts in every layer).
 */
static inline bool cfg_layer_moe(const cfg_model *c, int l)
{
    if (c->n_experts <= 0 || (c->decoder_sparse_step > 1 && (l + 1) % c->decoder_sparse_step != 0))
        return false;
    return l >= CFG_MAX_LAYERS || !((c->mlp_only_layers[l / 64] >> (l % 64)) & 1);
}

/* Parse config.json at path. *out is written only on success. */
engine_status cfg_load_model(const char *path, cfg_model *out, err_buf *e);
/* Parse generation_config.json at path; a missing file is not an error (ENGINE_OK, nothing set). */
engine_status cfg_load_generation(const char *path, cfg_generation *out, err_buf *e);

#endif
