/*
 * test_config.c: config.json and generation_config.json parsing on real
 * model configs (tests/data/config, models/stories260K), both RoPE layouts,
 * and every rejected input: each bad case must give its status and a
 * message naming the file.
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <unistd.h>

#include "loaders/config.h"
#include "tests/test_util.h"

static char tmpdir[64];

static bool load_fixture(const char *rel, cfg_model *m)
{
    char buf[1024];
    err_buf e;
    err_clear(&e);
    memset(m, 0xA5, sizeof *m); /* poison: every field must be written */
    engine_status st = cfg_load_model(test_src_path(buf, sizeof buf, rel), m, &e);
    CHECK_MSG(st == ENGINE_OK, "%s: %s", rel, e.msg);
    return st == ENGINE_OK;
}

static bool near(double a, double b)
{
    return fabs(a - b) <= 1e-12 * fabs(b);
}

static bool same_model(const cfg_model *a, const cfg_model *b)
{
    return strcmp(a->architecture, b->architecture) == 0 && strcmp(a->model_type, b->model_type) == 0 &&
           strcmp(a->hidden_act, b->hidden_act) == 0 && strcmp(a->torch_dtype, b->torch_dtype) == 0 &&
           a->dim == b->dim && a->n_layers == b->n_layers && a->n_heads == b->n_heads &&
           a->n_kv_heads == b->n_kv_heads && a->head_dim == b->head_dim && a->ffn_dim == b->ffn_dim &&
           a->vocab_size == b->vocab_size && a->max_position == b->max_position &&
           a->sliding_window == b->sliding_window && a->rms_eps == b->rms_eps && a->rope_theta == b->rope_theta &&
           a->rope_type == b->rope_type && a->rope_factor == b->rope_factor &&
           a->rope_low_freq_factor == b->rope_low_freq_factor &&
           a->rope_high_freq_factor == b->rope_high_freq_factor &&
           a->rope_original_max_position == b->rope_original_max_position &&
           a->tie_embeddings == b->tie_embeddings && a->attention_bias == b->attention_bias &&
           a->mlp_bias == b->mlp_bias && a->bos_id == b->bos_id && a->n_eos == b->n_eos &&
           memcmp(a->eos_ids, b->eos_ids, sizeof a->eos_ids[0] * (size_t)a->n_eos) == 0;
}

static void test_llama32_1b(void)
{
    cfg_model m;
    if (!load_fixture("tests/data/config/llama-3.2-1b.json", &m))
        return;
    CHECK(strcmp(m.architecture, "LlamaForCausalLM") == 0);
    CHECK(strcmp(m.model_type, "llama") == 0);
    CHECK(strcmp(m.hidden_act, "silu") == 0);
    CHECK(strcmp(m.torch_dtype, "bfloat16") == 0);
    CHECK(m.dim == 2048 && m.n_layers == 16 && m.n_heads == 32 && m.n_kv_heads == 8);
    CHECK(m.head_dim == 64 && m.ffn_dim == 8192 && m.vocab_size == 128256);
    CHECK(m.max_position == 131072 && m.sliding_window == 0);
    CHECK(near(m.rms_eps, 1e-5));
    CHECK(near(m.rope_theta, 500000.0));
    CHECK(m.rope_type == CFG_ROPE_LLAMA3);
    CHECK(near(m.rope_factor, 32.0) && near(m.rope_low_freq_factor, 1.0) && near(m.rope_high_freq_factor, 4.0));
    CHECK(m.rope_original_max_position == 8192);
    CHECK(m.tie_embeddings && !m.attention_bias && !m.mlp_bias);
    CHECK(m.bos_id == 128000 && m.n_eos == 1 && m.eos_ids[0] == 128001);

    /* The same model as transformers 5 writes it: rope_parameters, "dtype". */
    cfg_model m5;
    if (!load_fixture("tests/data/config/llama-3.2-1b-transformers5.json", &m5))
        return;
    CHECK(strcmp(m5.torch_dtype, "bfloat16") == 0);
    CHECK(near(m5.rope_theta, 500000.0) && m5.rope_type == CFG_ROPE_LLAMA3);
    CHECK(near(m5.rope_factor, 32.0) && near(m5.rope_low_freq_factor, 1.0) && near(m5.rope_high_freq_factor, 4.0));
    CHECK(m5.rope_original_max_position == 8192);
    CHECK(same_model(&m, &m5));
}

static void test_llama31_8b(void)
{
    cfg_model m;
    if (!load_fixture("tests/data/config/llama-3.1-8b-instruct.json", &m))
        return;
    CHECK(m.dim == 4096 && m.n_layers == 32 && m.n_heads == 32 && m.n_kv_heads == 8);
    CHECK(m.head_dim == 128 && m.ffn_dim == 14336 && m.vocab_size == 128256);
    CHECK(!m.tie_embeddings);
    CHECK(m.rope_type == CFG_ROPE_LLAMA3 && near(m.rope_factor, 8.0) && near(m.rope_theta, 500000.0));
    CHECK(m.rope_original_max_position == 8192);
    CHECK(m.bos_id == 128000);
    CHECK(m.n_eos == 3 && m.eos_ids[0] == 128001 && m.eos_ids[1] == 128008 && m.eos_ids[2] == 128009);
}

static void test_mistral(void)
{
    cfg_model m;
    if (!load_fixture("tests/data/config/mistral-7b-v0.1.json", &m))
        return;
    CHECK(strcmp(m.architecture, "MistralForCausalLM") == 0 && strcmp(m.model_type, "mistral") == 0);
    CHECK(m.sliding_window == 4096);
    CHECK(m.dim == 4096 && m.head_dim == 128 && m.n_kv_heads == 8 && m.vocab_size == 32000);
    CHECK(m.max_position == 32768 && near(m.rope_theta, 10000.0) && m.rope_type == CFG_ROPE_DEFAULT);
    CHECK(!m.tie_embeddings && !m.attention_bias && !m.mlp_bias);
    CHECK(m.bos_id == 1 && m.n_eos == 1 && m.eos_ids[0] == 2);
}

static void test_qwen(void)
{
    cfg_model m;
    if (load_fixture("tests/data/config/qwen2.5-0.5b.json", &m)) {
        CHECK(strcmp(m.architecture, "Qwen2ForCausalLM") == 0);
        CHECK(m.sliding_window == 0); /* use_sliding_window: false overrides 32768 */
        CHECK(m.dim == 896 && m.n_heads == 14 && m.n_kv_heads == 2 && m.head_dim == 64);
        CHECK(m.ffn_dim == 4864 && m.n_layers == 24 && m.vocab_size == 151936 && m.max_position == 32768);
        CHECK(near(m.rope_theta, 1e6) && near(m.rms_eps, 1e-6) && m.tie_embeddings);
        CHECK(!m.attention_bias); /* Qwen2's q/k/v bias is the architecture's, not the config's */
        CHECK(m.bos_id == 151643 && m.n_eos == 1 && m.eos_ids[0] == 151643);
    }
    if (load_fixture("tests/data/config/qwen3-0.6b.json", &m)) {
        CHECK(strcmp(m.architecture, "Qwen3ForCausalLM") == 0 && strcmp(m.model_type, "qwen3") == 0);
        CHECK(m.dim == 1024 && m.n_heads == 16 && m.head_dim == 128); /* 16 x 128 != 1024 */
        CHECK(m.n_kv_heads == 8 && m.ffn_dim == 3072 && m.n_layers == 28 && m.max_position == 40960);
        CHECK(near(m.rope_theta, 1e6) && m.rope_type == CFG_ROPE_DEFAULT); /* integer theta, null scaling */
        CHECK(m.sliding_window == 0 && m.tie_embeddings);
        CHECK(m.bos_id == 151643 && m.n_eos == 1 && m.eos_ids[0] == 151645);
    }
}

static void test_stories(void)
{
    cfg_model m;
    if (!load_fixture("models/stories260K/config.json", &m))
        return;
    CHECK(m.dim == 64 && m.n_layers == 5 && m.n_heads == 8 && m.n_kv_heads == 4 && m.head_dim == 8);
    CHECK(m.ffn_dim == 172 && m.vocab_size == 512 && m.max_position == 512);
    CHECK(near(m.rope_theta, 10000.0) && m.rope_type == CFG_ROPE_DEFAULT);
    CHECK(strcmp(m.torch_dtype, "float32") == 0 && m.tie_embeddings && near(m.rms_eps, 1e-5));
    CHECK(m.bos_id == 1 && m.n_eos == 1 && m.eos_ids[0] == 2);
}

/* ---------------------------------------------------------- string cases */

static const char *write_tmp(const char *name, const char *text)
{
    static char path[256];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fputs(text, f) < 0 || fclose(f) != 0) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(2);
    }
    return path;
}

/* A minimal valid config with extra members spliced in ("" for none). */
static char *config_with(const char *extra, const char *heads)
{
    static char buf[2048];
    snprintf(buf, sizeof buf,
             "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64, \"num_hidden_layers\": 2,"
             " %s \"intermediate_size\": 128, \"vocab_size\": 100%s%s}",
             heads ? heads : "\"num_attention_heads\": 4,", *extra ? ", " : "", extra);
    return buf;
}

static engine_status load_text(const char *text, cfg_model *m, err_buf *e)
{
    const char *p = write_tmp("config.json", text);
    err_clear(e);
    engine_status st = cfg_load_model(p, m, e);
    unlink(p);
    return st;
}

static void expect_model(const char *text, engine_status want, const char *needle)
{
    cfg_model m;
    memset(&m, 0x5A, sizeof m);
    cfg_model poison = m;
    err_buf e;
    engine_status st = load_text(text, &m, &e);
    CHECK_MSG(st == want, "status %d, want %d (%s) for %s", st, want, e.msg, text);
    if (want == ENGINE_OK)
        return;
    CHECK_MSG(e.code == want, "err code %d", e.code);
    CHECK_MSG(strstr(e.msg, "config.json: ") != NULL, "message '%s' does not name the file", e.msg);
    CHECK_MSG(strstr(e.msg, needle) != NULL, "message '%s' lacks '%s'", e.msg, needle);
    CHECK_MSG(memcmp(&m, &poison, sizeof m) == 0, "output written on failure");
    if (getenv("TEST_VERBOSE"))
        printf("  %s\n", e.msg);
}

static void test_defaults_and_layouts(void)
{
    cfg_model m;
    err_buf e;
    CHECK_MSG(load_text(config_with("", NULL), &m, &e) == ENGINE_OK, "%s", e.msg);
    CHECK(m.n_kv_heads == 4 && m.head_dim == 16 && m.max_position == 2048 && near(m.rms_eps, 1e-6));
    CHECK(strcmp(m.hidden_act, "silu") == 0 && m.model_type[0] == '\0' && m.torch_dtype[0] == '\0');
    CHECK(!m.tie_embeddings && !m.attention_bias && !m.mlp_bias && m.sliding_window == 0);
    CHECK(near(m.rope_theta, 10000.0) && m.rope_type == CFG_ROPE_DEFAULT && near(m.rope_factor, 1.0));
    CHECK(m.bos_id == -1 && m.n_eos == 0);
    CHECK(m.embedding_multiplier == 1.0 && m.residual_multiplier == 1.0 && m.attention_multiplier == 0.0 &&
          m.logits_scaling == 1.0);
    /* Granite's scalings (the architecture's row decides whether they apply, model.c). */
    CHECK(load_text(config_with("\"embedding_multiplier\": 12, \"residual_multiplier\": 0.22,"
                                " \"attention_multiplier\": 0.0078125, \"logits_scaling\": 8.0",
                                NULL),
                    &m, &e) == ENGINE_OK);
    CHECK(near(m.embedding_multiplier, 12.0) && near(m.residual_multiplier, 0.22) &&
          near(m.attention_multiplier, 0.0078125) && near(m.logits_scaling, 8.0));
    CHECK(m.rotary_dim == m.head_dim && m.act == CFG_ACT_SILU && m.attn_softcap == -1.0 && m.final_softcap == -1.0 &&
          m.query_pre_attn_scalar == 0.0 && m.rope_local_theta == 0.0);

    /* Gemma: hidden_activation wins over hidden_act, soft-caps (null: none), local RoPE. */
    CHECK(load_text(config_with("\"hidden_act\": \"silu\", \"hidden_activation\": \"gelu_pytorch_tanh\","
                                " \"attn_logit_softcapping\": null, \"final_logit_softcapping\": 30.0,"
                                " \"query_pre_attn_scalar\": 144, \"rope_theta\": 1e6, \"rope_local_base_freq\": 1e4,"
                                " \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 8.0}",
                                NULL),
                    &m, &e) == ENGINE_OK);
    CHECK(m.act == CFG_ACT_GELU_TANH && m.attn_softcap == 0.0 && near(m.final_softcap, 30.0) &&
          near(m.query_pre_attn_scalar, 144.0));
    CHECK(near(m.rope_theta, 1e6) && m.rope_type == CFG_ROPE_LINEAR && near(m.rope_factor, 8.0) &&
          near(m.rope_local_theta, 1e4) && m.rope_local_type == CFG_ROPE_DEFAULT);
    /* transformers 5's per-layer-type layout of the same. */
    CHECK(load_text(config_with("\"rope_parameters\": {\"full_attention\": {\"rope_type\": \"linear\", \"factor\": 8.0,"
                                " \"rope_theta\": 1e6}, \"sliding_attention\": {\"rope_type\": \"default\","
                                " \"rope_theta\": 20000}}",
                                NULL),
                    &m, &e) == ENGINE_OK);
    CHECK(near(m.rope_theta, 1e6) && m.rope_type == CFG_ROPE_LINEAR && near(m.rope_factor, 8.0) &&
          near(m.rope_local_theta, 20000.0) && m.rope_local_type == CFG_ROPE_DEFAULT);

    /* Phi-3: longrope, the top-level original_max_position_embeddings first,
     * the attention factor from max/original (sqrt(1 + ln 8 / ln 512)), and
     * partial rotary (3/4 of 16). */
    CHECK(load_text(config_with("\"max_position_embeddings\": 4096, \"original_max_position_embeddings\": 512,"
                                " \"partial_rotary_factor\": 0.75, \"rope_scaling\": {\"type\": \"longrope\","
                                " \"short_factor\": [1, 1, 1, 1, 1, 2], \"long_factor\": [1, 2, 3, 4, 5, 6.5],"
                                " \"original_max_position_embeddings\": 99}",
                                NULL),
                    &m, &e) == ENGINE_OK);
    CHECK(m.rope_type == CFG_ROPE_LONGROPE && m.rotary_dim == 12 && m.rope_original_max_position == 512);
    CHECK(m.rope_short_factor[5] == 2.0f && m.rope_long_factor[5] == 6.5f && near(m.rope_factor, 8.0));
    CHECK(fabs(m.rope_attention_factor - sqrt(1.0 + log(8.0) / log(512.0))) < 1e-12);
    CHECK(load_text(config_with("\"rope_scaling\": {\"type\": \"su\", \"short_factor\": [1, 1, 1, 1, 1, 1, 1, 1],"
                                " \"long_factor\": [1, 1, 1, 1, 1, 1, 1, 1], \"attention_factor\": 1.5}",
                                NULL),
                    &m, &e) == ENGINE_OK);
    CHECK(m.rope_type == CFG_ROPE_LONGROPE && m.rope_attention_factor == 1.5 && m.rope_original_max_position == 2048);

    /* Older layout: linear scaling under the pre-4.45 key "type". */
    CHECK(load_text(config_with("\"rope_theta\": 20000, \"rope_scaling\": {\"type\": \"linear\", \"factor\": 4.0}",
                                NULL),
                    &m, &e) == ENGINE_OK);
    CHECK(m.rope_type == CFG_ROPE_LINEAR && near(m.rope_factor, 4.0) && near(m.rope_theta, 20000.0));
    /* Newer layout, theta only inside rope_parameters. */
    CHECK(load_text(config_with("\"rope_parameters\": {\"rope_type\": \"linear\", \"factor\": 2, \"rope_theta\": 5e5}",
                                NULL),
                    &m, &e) == ENGINE_OK);
    CHECK(m.rope_type == CFG_ROPE_LINEAR && near(m.rope_factor, 2.0) && near(m.rope_theta, 5e5));
    CHECK(load_text(config_with("\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1234.5}", NULL), &m,
                    &e) == ENGINE_OK);
    CHECK(m.rope_type == CFG_ROPE_DEFAULT && near(m.rope_theta, 1234.5));
    CHECK(load_text(config_with("\"rope_scaling\": null, \"rope_theta\": 7.0", NULL), &m, &e) == ENGINE_OK);
    CHECK(m.rope_type == CFG_ROPE_DEFAULT && near(m.rope_theta, 7.0));

    /* Nulls read as absent; an explicit head_dim need not divide the width. */
    CHECK(load_text(config_with("\"bos_token_id\": null, \"eos_token_id\": null, \"sliding_window\": null,"
                                " \"head_dim\": 48, \"num_key_value_heads\": 1",
                                NULL),
                    &m, &e) == ENGINE_OK);
    CHECK(m.bos_id == -1 && m.n_eos == 0 && m.sliding_window == 0 && m.head_dim == 48 && m.n_kv_heads == 1);
    CHECK(load_text(config_with("\"sliding_window\": 256, \"use_sliding_window\": true, \"hidden_act\":"
                                " \"gelu_pytorch_tanh\", \"attention_bias\": true, \"mlp_bias\": true",
                                NULL),
                    &m, &e) == ENGINE_OK);
    CHECK(m.sliding_window == 256 && strcmp(m.hidden_act, "gelu_pytorch_tanh") == 0);
    CHECK(m.attention_bias && m.mlp_bias);
    CHECK(m.sliding_from_layer == 2); /* Qwen's default max_window_layers 28, clamped to the 2 layers */

    /* Which layers slide: Mistral all, Qwen from max_window_layers, or as layer_types says. */
    CHECK(load_text(config_with("\"sliding_window\": 64", NULL), &m, &e) == ENGINE_OK);
    CHECK(m.sliding_window == 64 && m.sliding_from_layer == 0);
    CHECK(load_text(config_with("\"sliding_window\": 64, \"use_sliding_window\": true, \"max_window_layers\": 1",
                                NULL),
                    &m, &e) == ENGINE_OK);
    CHECK(m.sliding_window == 64 && m.sliding_from_layer == 1);
    CHECK(load_text(config_with("\"sliding_window\": 64, \"layer_types\": [\"full_attention\", "
                                "\"sliding_attention\"]",
                                NULL),
                    &m, &e) == ENGINE_OK);
    CHECK(m.sliding_window == 64 && m.sliding_from_layer == 1);
    CHECK(load_text(config_with("\"sliding_window\": 64, \"layer_types\": [\"full_attention\", \"full_attention\"]",
                                NULL),
                    &m, &e) == ENGINE_OK);
    CHECK(m.sliding_window == 0);
    /* Any other mix (Gemma's): a bit per sliding layer, none by position. */
    CHECK(load_text(config_with("\"sliding_window\": 64, \"layer_types\": [\"sliding_attention\", \"full_attention\"]",
                                NULL),
                    &m, &e) == ENGINE_OK);
    CHECK(m.sliding_window == 64 && m.sliding_from_layer == 2 && m.sliding_layers[0] == 1 && m.layer_types_given);
    CHECK(load_text(config_with("\"sliding_window\": 64, \"sliding_window_pattern\": 6", NULL), &m, &e) == ENGINE_OK);
    CHECK(m.sliding_window_pattern == 6 && !m.layer_types_given);
    expect_model(config_with("\"layer_types\": [\"full_attention\"]", NULL), ENGINE_ERR_FORMAT, "layer_types");
    expect_model(config_with("\"layer_types\": [\"full_attention\", \"chunked_attention\"]", NULL),
                 ENGINE_ERR_UNSUPPORTED, "chunked_attention");
    CHECK(load_text(config_with("\"eos_token_id\": [5, 6, 7, 8, 9, 10, 11, 12]", NULL), &m, &e) == ENGINE_OK);
    CHECK(m.n_eos == 8 && m.eos_ids[7] == 12);
    CHECK(load_text(config_with("\"max_position_embeddings\": 8192.0", NULL), &m, &e) == ENGINE_OK);
    CHECK(m.max_position == 8192);

    /* Experts: num_local_experts before num_experts; mlp_only_layers as bits. */
    CHECK(m.n_experts == 0 && !cfg_layer_moe(&m, 0));
    CHECK(load_text(config_with("\"num_local_experts\": 8, \"num_experts\": 4, \"num_experts_per_tok\": 2,"
                                " \"moe_intermediate_size\": 32, \"shared_expert_intermediate_size\": 96,"
                                " \"norm_topk_prob\": true, \"decoder_sparse_step\": 2, \"mlp_only_layers\": [1],"
                                " \"clip_qkv\": null",
                                NULL),
                    &m, &e) == ENGINE_OK);
    CHECK(m.n_experts == 8 && m.n_experts_used == 2 && m.moe_ffn_dim == 32 && m.shared_ffn_dim == 96 &&
          m.norm_topk_prob && m.decoder_sparse_step == 2 && m.mlp_only_layers[0] == 2 && !m.clip_qkv_given);
    CHECK(!cfg_layer_moe(&m, 0) && !cfg_layer_moe(&m, 1)); /* not on the step; dense by mlp_only_layers */
    CHECK(load_text(config_with("\"num_experts\": 4, \"num_experts_per_tok\": 4, \"mlp_only_layers\": [1],"
                                " \"clip_qkv\": 8",
                                NULL),
                    &m, &e) == ENGINE_OK);
    CHECK(m.n_experts == 4 && m.decoder_sparse_step == 1 && cfg_layer_moe(&m, 0) && !cfg_layer_moe(&m, 1) &&
          m.clip_qkv_given);
}

static void test_bad_model(void)
{
    expect_model("{\"hidden_size\": 64}", ENGINE_ERR_FORMAT, "no 'architectures'");
    expect_model("{\"architectures\": [], \"hidden_size\": 64}", ENGINE_ERR_FORMAT, "no 'architectures'");
    expect_model("{\"architectures\": \"LlamaForCausalLM\"}", ENGINE_ERR_FORMAT, "'architectures'");
    expect_model("{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64, \"num_hidden_layers\": 2,"
                 " \"num_attention_heads\": 4, \"vocab_size\": 100}",
                 ENGINE_ERR_FORMAT, "no 'intermediate_size'");
    expect_model(config_with("", "\"num_attention_heads\": null,"), ENGINE_ERR_FORMAT, "no 'num_attention_heads'");
    expect_model(config_with("", "\"num_attention_heads\": \"4\","), ENGINE_ERR_FORMAT,
                 "'num_attention_heads' must be an integer, not a string");
    expect_model(config_with("", "\"num_attention_heads\": 4.5,"), ENGINE_ERR_FORMAT, "'num_attention_heads'");
    expect_model(config_with("", "\"num_attention_heads\": 0,"), ENGINE_ERR_FORMAT, "must be positive");
    expect_model(config_with("", "\"num_attention_heads\": -4,"), ENGINE_ERR_FORMAT, "must be positive");
    expect_model(config_with("", "\"num_attention_heads\": 4294967296,"), ENGINE_ERR_FORMAT, "4294967296");
    expect_model(config_with("", "\"num_attention_heads\": 3,"), ENGINE_ERR_FORMAT,
                 "hidden_size 64 is not divisible by num_attention_heads 3");
    expect_model(config_with("\"num_key_value_heads\": 3", NULL), ENGINE_ERR_FORMAT,
                 "num_attention_heads 4 is not divisible by num_key_value_heads 3");
    /* An odd head_dim (which model.c used to refuse after the parse, so
     * fuzz_config saw it pass), and a head count times head_dim past 32
     * bits, which reached arch.c's int products. */
    expect_model("{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 6.0, \"num_hidden_layers\": 1,"
                 " \"num_attention_heads\": 2, \"intermediate_size\": 15, \"vocab_size\": 10}",
                 ENGINE_ERR_FORMAT, "head_dim 3 is odd");
    expect_model(config_with("\"head_dim\": 7", NULL), ENGINE_ERR_FORMAT, "head_dim 7 is odd");
    expect_model(config_with("\"head_dim\": 1073741824", NULL), ENGINE_ERR_FORMAT,
                 "num_attention_heads 4 x head_dim 1073741824 does not fit in 32 bits");
    expect_model(config_with("\"rms_norm_eps\": \"1e-5\"", NULL), ENGINE_ERR_FORMAT, "'rms_norm_eps' must be a number");
    expect_model(config_with("\"rms_norm_eps\": 0", NULL), ENGINE_ERR_FORMAT, "'rms_norm_eps'");
    expect_model(config_with("\"logits_scaling\": 0", NULL), ENGINE_ERR_FORMAT, "'logits_scaling' is 0");
    expect_model(config_with("\"attention_multiplier\": -1", NULL), ENGINE_ERR_FORMAT, "'attention_multiplier'");
    expect_model(config_with("\"residual_multiplier\": \"x\"", NULL), ENGINE_ERR_FORMAT,
                 "'residual_multiplier' must be a number");
    expect_model(config_with("\"tie_word_embeddings\": 1", NULL), ENGINE_ERR_FORMAT, "'tie_word_embeddings'");
    expect_model(config_with("\"sliding_window\": -1", NULL), ENGINE_ERR_FORMAT, "'sliding_window'");
    expect_model(config_with("\"hidden_act\": 3", NULL), ENGINE_ERR_FORMAT, "'hidden_act' must be a string");
    expect_model(config_with("\"model_type\": \"a-model-type-name-longer-than-the-field\"", NULL), ENGINE_ERR_FORMAT,
                 "'model_type'");
    expect_model(config_with("\"bos_token_id\": \"<s>\"", NULL), ENGINE_ERR_FORMAT, "'bos_token_id'");
    expect_model(config_with("\"eos_token_id\": [1, \"x\"]", NULL), ENGINE_ERR_FORMAT, "'eos_token_id'");
    expect_model(config_with("\"eos_token_id\": [1, 2, 3, 4, 5, 6, 7, 8, 9]", NULL), ENGINE_ERR_UNSUPPORTED,
                 "'eos_token_id'");

    expect_model(config_with("\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0}", NULL),
                 ENGINE_ERR_UNSUPPORTED, "'yarn'");
    expect_model(config_with("\"rope_scaling\": {\"type\": \"dynamic\", \"factor\": 2.0}", NULL),
                 ENGINE_ERR_UNSUPPORTED, "'dynamic'");
    expect_model(config_with("\"rope_parameters\": {\"rope_type\": \"longrope\", \"rope_theta\": 1e4}", NULL),
                 ENGINE_ERR_FORMAT, "no 'rope_parameters.short_factor'");
    expect_model(config_with("\"rope_parameters\": {\"rope_type\": \"longrope\", \"short_factor\": [1, 1],"
                             " \"long_factor\": [1, 1]}",
                             NULL),
                 ENGINE_ERR_FORMAT, "'rope_parameters.short_factor' must be a list of 8 numbers");
    expect_model(config_with("\"rope_parameters\": {\"rope_type\": \"longrope\", \"short_factor\": [1, 1, 1, 1,"
                             " 1, 1, 1, 1], \"long_factor\": [1, 1, 1, 1, 1, 1, 1, -2]}",
                             NULL),
                 ENGINE_ERR_FORMAT, "'rope_parameters.long_factor'[7]");
    expect_model(config_with("\"rope_parameters\": {\"chunked_attention\": {\"rope_type\": \"default\"}}", NULL),
                 ENGINE_ERR_UNSUPPORTED, "per-layer-type 'rope_parameters' entry 'chunked_attention'");
    expect_model(config_with("\"rope_parameters\": {\"sliding_attention\": {\"rope_type\": \"llama3\"}}", NULL),
                 ENGINE_ERR_UNSUPPORTED, "'llama3' (rope_parameters.sliding_attention.rope_type)");
    expect_model(config_with("\"partial_rotary_factor\": 0.2", NULL), ENGINE_ERR_UNSUPPORTED, "partial_rotary_factor");
    expect_model(config_with("\"hidden_act\": \"relu\"", NULL), ENGINE_ERR_UNSUPPORTED, "activation 'relu'");
    expect_model(config_with("\"hidden_activation\": \"gelu\"", NULL), ENGINE_ERR_UNSUPPORTED,
                 "activation 'gelu' (hidden_activation)");
    expect_model(config_with("\"attn_logit_softcapping\": 0", NULL), ENGINE_ERR_FORMAT, "'attn_logit_softcapping'");
    expect_model(config_with("\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0}", NULL),
                 ENGINE_ERR_FORMAT, "no 'rope_scaling.low_freq_factor'");
    expect_model(config_with("\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 4,"
                             " \"high_freq_factor\": 4, \"original_max_position_embeddings\": 8192}",
                             NULL),
                 ENGINE_ERR_FORMAT, "high_freq_factor");
    expect_model(config_with("\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": \"2\"}", NULL),
                 ENGINE_ERR_FORMAT, "'rope_scaling.factor' must be a number");
    expect_model(config_with("\"rope_scaling\": {\"rope_type\": 3}", NULL), ENGINE_ERR_FORMAT,
                 "'rope_scaling.rope_type'");
    expect_model(config_with("\"rope_scaling\": {\"factor\": 2.0}", NULL), ENGINE_ERR_FORMAT, "no 'rope_type'");
    expect_model(config_with("\"rope_scaling\": [1]", NULL), ENGINE_ERR_FORMAT, "'rope_scaling' must be an object");
    expect_model(config_with("\"rope_theta\": \"big\"", NULL), ENGINE_ERR_FORMAT, "'rope_theta'");
    expect_model(config_with("\"num_experts\": 4, \"num_experts_per_tok\": 5", NULL), ENGINE_ERR_FORMAT,
                 "'num_experts_per_tok' is 5; it must be at most num_experts (4)");
    expect_model(config_with("\"num_experts_per_tok\": 0", NULL), ENGINE_ERR_FORMAT, "'num_experts_per_tok'");
    expect_model(config_with("\"decoder_sparse_step\": 0", NULL), ENGINE_ERR_FORMAT, "'decoder_sparse_step'");
    expect_model(config_with("\"mlp_only_layers\": [2]", NULL), ENGINE_ERR_FORMAT, "'mlp_only_layers'[0]");
    expect_model(config_with("\"mlp_only_layers\": 1", NULL), ENGINE_ERR_FORMAT,
                 "'mlp_only_layers' must be a list of layer indices");

    expect_model("{\"architectures\": [\"LlamaForCausalLM\"],\n  \"hidden_size\": 64,,\n}", ENGINE_ERR_FORMAT,
                 "line 2");
    expect_model("", ENGINE_ERR_FORMAT, "invalid JSON");
    expect_model("[1, 2]", ENGINE_ERR_FORMAT, "not an object");
    expect_model("{\"a\": 1, \"a\": 2}", ENGINE_ERR_FORMAT, "duplicate");

    cfg_model m;
    err_buf e;
    char path[128];
    snprintf(path, sizeof path, "%s/no_such_config.json", tmpdir);
    CHECK(cfg_load_model(path, &m, &e) == ENGINE_ERR_IO);
    CHECK_MSG(strstr(e.msg, "no_such_config.json: ") != NULL, "%s", e.msg);
    CHECK(cfg_load_model(tmpdir, &m, &e) == ENGINE_ERR_IO); /* a folder */
    CHECK_MSG(strstr(e.msg, tmpdir) != NULL, "%s", e.msg);
    CHECK(cfg_load_model(NULL, &m, &e) == ENGINE_ERR_INVALID_ARG);
}

/* ---------------------------------------------------- generation_config */

static void test_generation(void)
{
    char buf[1024];
    cfg_generation g;
    err_buf e;
    memset(&g, 0xA5, sizeof g);
    CHECK_MSG(cfg_load_generation(test_src_path(buf, sizeof buf,
                                                "tests/data/config/llama-3.1-8b-instruct.generation_config.json"),
                                  &g, &e) == ENGINE_OK,
              "%s", e.msg);
    CHECK(g.has_temperature && near(g.temperature, 0.6) && g.has_top_p && near(g.top_p, 0.9));
    CHECK(!g.has_top_k && !g.has_repetition_penalty && g.do_sample);
    CHECK(g.bos_id == 128000 && g.n_eos == 3 && g.eos_ids[0] == 128001 && g.eos_ids[2] == 128009);

    memset(&g, 0xA5, sizeof g);
    CHECK_MSG(cfg_load_generation(test_src_path(buf, sizeof buf,
                                                "tests/data/config/qwen2.5-0.5b-instruct.generation_config.json"),
                                  &g, &e) == ENGINE_OK,
              "%s", e.msg);
    CHECK(g.has_top_k && g.top_k == 20 && g.has_repetition_penalty && near(g.repetition_penalty, 1.1));
    CHECK(near(g.temperature, 0.7) && near(g.top_p, 0.8) && g.do_sample);
    CHECK(g.n_eos == 2 && g.eos_ids[0] == 151645 && g.eos_ids[1] == 151643 && g.bos_id == 151643);

    memset(&g, 0xA5, sizeof g);
    CHECK(cfg_load_generation(test_src_path(buf, sizeof buf, "models/stories260K/generation_config.json"), &g, &e) ==
          ENGINE_OK);
    CHECK(!g.has_temperature && !g.has_top_k && !g.has_top_p && !g.has_repetition_penalty && !g.do_sample);
    CHECK(g.bos_id == 1 && g.n_eos == 1 && g.eos_ids[0] == 2);

    /* Missing: OK with nothing set. */
    char path[128];
    snprintf(path, sizeof path, "%s/generation_config.json", tmpdir);
    memset(&g, 0xA5, sizeof g);
    CHECK(cfg_load_generation(path, &g, &e) == ENGINE_OK);
    CHECK(!g.has_temperature && !g.has_top_k && !g.has_top_p && !g.has_repetition_penalty && !g.do_sample);
    CHECK(g.bos_id == -1 && g.n_eos == 0);

    static const struct {
        const char *text;
        engine_status want;
        const char *needle;
    } bad[] = {
        {"{\"temperature\": \"hot\"}", ENGINE_ERR_FORMAT, "'temperature'"},
        {"{\"top_k\": 2.5}", ENGINE_ERR_FORMAT, "'top_k'"},
        {"{\"top_p\": 1.5}", ENGINE_ERR_FORMAT, "'top_p'"},
        {"{\"repetition_penalty\": 0}", ENGINE_ERR_FORMAT, "'repetition_penalty'"},
        {"{\"do_sample\": \"yes\"}", ENGINE_ERR_FORMAT, "'do_sample'"},
        {"{\"eos_token_id\": {}}", ENGINE_ERR_FORMAT, "'eos_token_id'"},
        {"{\"temperature\": 0.7,", ENGINE_ERR_FORMAT, "invalid JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *p = write_tmp("generation_config.json", bad[i].text);
        engine_status st = cfg_load_generation(p, &g, &e);
        CHECK_MSG(st == bad[i].want, "%s: status %d (%s)", bad[i].text, st, e.msg);
        CHECK_MSG(strstr(e.msg, "generation_config.json: ") && strstr(e.msg, bad[i].needle), "%s", e.msg);
        if (getenv("TEST_VERBOSE"))
            printf("  %s\n", e.msg);
        unlink(p);
    }
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/test_cfg_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 2;
    }
    test_llama32_1b();
    test_llama31_8b();
    test_mistral();
    test_qwen();
    test_stories();
    test_defaults_and_layouts();
    test_bad_model();
    test_generation();
    rmdir(tmpdir);
    return test_finish("test_config");
}
