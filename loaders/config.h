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
    CFG_ROPE_LINEAR    /* positions divided by factor */
} cfg_rope_type;

typedef struct cfg_model {
    char architecture[64];  /* architectures[0], e.g. "LlamaForCausalLM" */
    char model_type[32];    /* "llama", "mistral", "qwen2", "qwen3"        */
    char hidden_act[32];    /* "silu" ("gelu_pytorch_tanh" needs 18 bytes)  */
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
                               Mistral, max_window_layers for Qwen2/3      */
    double rms_eps;         /* rms_norm_eps                                */
    double rope_theta;
    cfg_rope_type rope_type;
    double rope_factor;
    double rope_low_freq_factor;
    double rope_high_freq_factor;
    int rope_original_max_position;
    /* Granite's scalings (the engine clears them to 1 for an architecture
     * without them): */
    double embedding_multiplier; /* embeddings times this (default 1)      */
    double residual_multiplier;  /* each block's output times this before
                                    the residual add (default 1)           */
    double attention_multiplier; /* the attention score scale; 0 when absent
                                    (1/sqrt(head_dim), or the architecture's) */
    double logits_scaling;       /* logits divided by this (default 1)     */
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

/* Parse config.json at path. *out is written only on success. */
engine_status cfg_load_model(const char *path, cfg_model *out, err_buf *e);
/* Parse generation_config.json at path; a missing file is not an error (ENGINE_OK, nothing set). */
engine_status cfg_load_generation(const char *path, cfg_generation *out, err_buf *e);

#endif
