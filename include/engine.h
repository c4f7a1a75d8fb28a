/*
 * engine.h: the public C11 API of libengine, an inference engine for large
 * language models stored as Hugging Face safetensors checkpoints.
 *
 * Everything the command-line tools do goes through this header. The
 * library never prints (unless given a log callback), never exits, and keeps
 * no global mutable state: everything lives in the handles below (but for a
 * cache of each device's measured bandwidths, engine_device_bandwidths).
 *
 * Error contract: every fallible call returns an engine_status. Calls that
 * create a handle take an optional caller-owned buffer (err, err_size) that
 * receives a one-line message naming the file and the problem; calls on an
 * existing handle leave their message in engine_*_last_error() of that handle.
 */
#ifndef ENGINE_H
#define ENGINE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(ENGINE_STATIC)
#define ENGINE_API
#elif defined(_WIN32)
#define ENGINE_API __declspec(dllimport)
#elif defined(__GNUC__)
#define ENGINE_API __attribute__((visibility("default")))
#else
#define ENGINE_API
#endif

#define ENGINE_VERSION_MAJOR 0
#define ENGINE_VERSION_MINOR 1
#define ENGINE_VERSION_PATCH 0
#define ENGINE_VERSION_NUMBER \
    (ENGINE_VERSION_MAJOR * 10000 + ENGINE_VERSION_MINOR * 100 + ENGINE_VERSION_PATCH)

/* Runtime version of the linked library, e.g. 100 for 0.1.0. */
ENGINE_API unsigned engine_version_number(void);
/* "0.1.0"; static storage. */
ENGINE_API const char *engine_version_string(void);

/* Status codes. Values are append-only. */
typedef enum engine_status {
    ENGINE_OK = 0,
    ENGINE_ERR_INVALID_ARG = -1,  /* a NULL handle, a bad parameter value  */
    ENGINE_ERR_OUT_OF_MEMORY = -2,/* host allocation failed                */
    ENGINE_ERR_OVER_BUDGET = -3,  /* would exceed the memory budget        */
    ENGINE_ERR_IO = -4,           /* a file could not be opened or read    */
    ENGINE_ERR_FORMAT = -5,       /* a file is malformed or inconsistent   */
    ENGINE_ERR_UNSUPPORTED = -6,  /* valid input this build cannot handle  */
    ENGINE_ERR_CUDA = -7,         /* a CUDA call failed                    */
    ENGINE_ERR_CONTEXT_FULL = -8, /* the session's context length is used up */
    ENGINE_ERR_BUFFER_TOO_SMALL = -9 /* output buffer too small; the size needed is reported */
} engine_status;

/* Short name of a status code, e.g. "bad format"; static storage. */
ENGINE_API const char *engine_status_str(engine_status s);

typedef enum engine_device {
    ENGINE_DEVICE_AUTO = 0, /* CUDA when a GPU is present, else CPU */
    ENGINE_DEVICE_CPU = 1,
    ENGINE_DEVICE_CUDA = 2
} engine_device;

typedef enum engine_log_level {
    ENGINE_LOG_ERROR = 0,
    ENGINE_LOG_WARN = 1,
    ENGINE_LOG_INFO = 2,
    ENGINE_LOG_DEBUG = 3
} engine_log_level;

/* Log sink. msg is one line without a trailing newline, valid during the call. */
typedef void (*engine_log_fn)(engine_log_level level, const char *msg, void *user);

typedef struct engine_model engine_model;         /* weights, config, tokenizer  */
typedef struct engine_session engine_session;     /* KV cache and activations    */
typedef struct engine_tokenizer engine_tokenizer; /* tokenizer.json              */
typedef struct engine_sampler engine_sampler;     /* sampling state and RNG      */
typedef struct engine_trace engine_trace;         /* spans and counters for Perfetto */

/* ------------------------------------------------------------------ model */

/* Quantized weight formats (docs/FORMATS.md). Values are append-only. */
typedef enum engine_quant {
    ENGINE_QUANT_NONE = 0,
    ENGINE_QUANT_INT8 = 1,      /* int8, one fp32 scale per output row          */
    ENGINE_QUANT_NF4 = 2,       /* bitsandbytes NF4, blocks of 64               */
    ENGINE_QUANT_INT8_G128 = 3, /* int8, one scale per 128 input columns        */
    ENGINE_QUANT_NF4_DQ = 4,    /* NF4 with double-quantized (8-bit) absmax     */
    ENGINE_QUANT_FP4 = 5        /* bitsandbytes FP4, blocks of 64               */
} engine_quant;

/*
 * How the KV cache stores keys and values. INT8 and FP8 keep one fp32 scale
 * per token and KV head, for K and for V apart (value = code * scale):
 * INT8 symmetric, scale = max|x| / 127; FP8 as e4m3 (finite, saturating),
 * scale = max|x| / 448. Both are decoded in registers where attention reads
 * them. AUTO: fp32 on the CPU; on CUDA fp16 (fp32 for fp32 models), or what
 * the placement chooses to fit the budget (see engine_plan).
 */
typedef enum engine_kv_type {
    ENGINE_KV_AUTO = 0,
    ENGINE_KV_F32 = 1,
    ENGINE_KV_F16 = 2,
    ENGINE_KV_BF16 = 3,
    ENGINE_KV_INT8 = 4,
    ENGINE_KV_FP8 = 5
} engine_kv_type;

/* "auto", "f32", "f16", "bf16", "int8", "fp8"; NULL for an unknown value. */
ENGINE_API const char *engine_kv_type_name(engine_kv_type t);
/* The type named (as engine_kv_type_name gives it); -1 for an unknown name. */
ENGINE_API int engine_kv_type_parse(const char *name);

/* A context length meaning the model's maximum (max_position_embeddings). */
#define ENGINE_CTX_MAX (-1)

typedef struct engine_model_params {
    engine_device device;  /* default ENGINE_DEVICE_AUTO                   */
    int n_threads;         /* CPU threads; 0 = all cores (default)         */
    uint64_t vram_budget;  /* device bytes for everything the engine puts on the
                              GPU, the CUDA context included (engine_device_reserve
                              says how much of it that takes); 0 = the free memory
                              minus a margin. What does not fit is streamed from
                              host memory as the offload plan decides. */
    engine_log_fn log;     /* NULL: the library stays silent               */
    void *log_user;
    /* Quantize the dense (F32/F16/BF16) linear weights of the decoder layers
     * while loading, into host memory the model owns (embeddings, norms and
     * lm_head stay as stored; already quantized tensors are kept). Default
     * ENGINE_QUANT_NONE. Quantized models run on the CPU and on CUDA. */
    engine_quant quant;
    /* CUDA: the context length the placement leaves room for (the KV cache
     * of one session that long); 0 = min(model maximum, 4096). A longer
     * session may be refused as over the budget. */
    int n_ctx;
    /* CUDA: stream at least this many layers from host memory even where
     * they would fit (spread evenly, as the planner does; more than the
     * model has: the output head and the embeddings too); 0 = only what the
     * budget needs. For tests and measurements. */
    int min_layers_streamed;
    /* CUDA: how many of the streamed layers the CPU computes for each
     * decoded token instead of copying them to the GPU (prompts still
     * stream them): -1 = as many as the planner finds fastest from this
     * host's rate, measured at load (default), 0 = none, N > 0 = N of them
     * (at most all the streamed). */
    int host_layers;
    /* Quantize the output head while loading: ENGINE_QUANT_NONE (default)
     * keeps it as stored. Decode reads the head once per token, as it reads
     * every layer; an INT8 head reads half the bytes of a bf16 one (on a 1B
     * model the head is half of a 4-bit model's bytes). llama.cpp's 4-bit
     * files keep a 6-bit head the same way. A tied head becomes a quantized
     * copy (the embedding table stays as stored for the lookups, so the
     * model holds both). CUDA cannot stream a quantized head: it must fit. */
    engine_quant quant_head;
    /* CUDA: the device memory bandwidth and the pinned host-to-device rate,
     * in GB/s, the placement is planned with (engine_plan_params.hbm_gbps,
     * pcie_gbps); 0 (default) = as measured on the device at load
     * (engine_device_bandwidths). */
    double hbm_gbps;
    double pcie_gbps;
    /* Appended fields: */
    /* CUDA: the KV cache type the placement plans for (sessions of this
     * model default to it); AUTO = as engine_kv_type says. */
    engine_kv_type kv_type;
    /* NULL (default), or a trace (engine_trace_create) that records the
     * load and, unless engine_session_set_trace says otherwise, every
     * session made from this model. The trace must outlive them. */
    engine_trace *trace;
    /* CUDA: the first N mixture-of-experts layers keep all their routed
     * experts in host memory (the CPU runs a token's picks among them for
     * decode, prompts stream them), whatever the budget leaves free, as
     * llama.cpp's --n-cpu-moe; their attention, router and shared experts
     * stay on the GPU. 0 (default): the planner decides; more than the
     * model's expert layers: all of them. Dense layers are not counted. */
    int moe_cpu;
    /* CUDA: what computes decode's picks among the routed experts kept in
     * host memory (engine_moe_host): AUTO (default) the faster at the
     * measured rates, the GPU reading them over PCIe or the CPU. */
    int moe_host;
    /* CUDA: device bytes for a cache of the routed experts the GPU reads
     * from host memory, kept by how often and how lately the router picks
     * them (docs/API.md, Streaming); taken from the budget before the
     * experts are placed. 0 (default): none. */
    uint64_t expert_cache;
} engine_model_params;

/*
 * Who runs a token's picks among the routed experts a budget keeps in host
 * memory, for decode (prompts stream them to the GPU either way):
 * the CPU, at its measured rate (engine_host_layer_rate); or the GPU,
 * whose expert products read them over PCIe where they lie (a pinned
 * host copy laid out as the device lays out experts, so about their size
 * in host memory is pinned on top of the mapped file), at the PCIe rate.
 * AUTO takes the GPU unless the CPU's rate is the higher.
 */
typedef enum engine_moe_host {
    ENGINE_MOE_HOST_AUTO = 0,
    ENGINE_MOE_HOST_CPU = 1,
    ENGINE_MOE_HOST_GPU = 2
} engine_moe_host;

ENGINE_API engine_model_params engine_model_default_params(void);

/*
 * Load a model. path is a .safetensors file (config.json and tokenizer files
 * beside it), a folder holding them, or a model.safetensors.index.json of a
 * sharded checkpoint. Weights are memory-mapped, not copied. A missing
 * tokenizer is not an error (engine_model_tokenizer() then returns NULL).
 * On success *out owns the model; free it with engine_model_free() after
 * every session made from it. On failure *out is NULL and err (if not NULL)
 * receives a one-line message.
 */
ENGINE_API engine_status engine_model_load(const char *path, const engine_model_params *params,
                                           engine_model **out, char *err, size_t err_size);
/* NULL is a no-op. */
ENGINE_API void engine_model_free(engine_model *model);

typedef struct engine_model_info {
    const char *architecture; /* e.g. "LlamaForCausalLM"; valid while the model lives */
    int n_layers;
    int dim;         /* hidden size                          */
    int n_heads;
    int n_kv_heads;
    int head_dim;
    int ffn_dim;     /* intermediate size                    */
    int vocab_size;
    int max_context; /* max_position_embeddings              */
    int bos_id;      /* -1 when none                         */
    int eos_id;      /* first end-of-sequence id, -1 if none */
    uint64_t n_params;
    uint64_t weight_bytes; /* bytes of all weights as stored */
    const char *weight_dtype; /* "f32", "f16", "bf16", "int8", "nf4", "fp4" (the layers' type) */
    engine_device device;     /* where the model runs: CPU or CUDA, never AUTO */
    int tied_embeddings;      /* 1 when the output matrix is the embedding table */
    const char *head_dtype;   /* the output matrix's type, as weight_dtype */
    /* Appended fields: */
    int n_experts;            /* routed experts of a mixture-of-experts layer; 0 for a dense model */
    int n_experts_used;       /* of which a token runs (top-k); 0 for a dense model */
    uint64_t expert_bytes;    /* bytes of all routed experts' weights, of which a token reads its top-k; 0 if dense */
} engine_model_info;

ENGINE_API engine_status engine_model_get_info(const engine_model *model, engine_model_info *info);
/* 1 if id ends generation for this model (EOS from config, generation_config, tokenizer, and the
 * chat template's end-of-turn token: docs/API.md, Chat). */
ENGINE_API int engine_model_is_eos(const engine_model *model, int32_t id);
/* The model's tokenizer, owned by the model; NULL when the model has none. */
ENGINE_API const engine_tokenizer *engine_model_tokenizer(const engine_model *model);
/* Last error message on this model; "" when none. Valid until the next call on it. */
ENGINE_API const char *engine_model_last_error(const engine_model *model);

/* -------------------------------------------------------------- tokenizer */

/*
 * Load a tokenizer from a tokenizer.json file or a folder holding one
 * (tokenizer_config.json beside it supplies BOS/EOS and add_bos). Free with
 * engine_tokenizer_free(). Only for tokenizers not owned by a model.
 */
ENGINE_API engine_status engine_tokenizer_load(const char *path, engine_tokenizer **out,
                                               char *err, size_t err_size);
ENGINE_API void engine_tokenizer_free(engine_tokenizer *tok);

/*
 * Encode UTF-8 text (invalid bytes are read as U+FFFD) into ids[0..cap).
 * add_special: add BOS/EOS as tokenizer_config.json says. Special-token
 * strings inside text are always matched. *n_ids receives the number of ids;
 * when it exceeds cap the call returns ENGINE_ERR_BUFFER_TOO_SMALL and
 * nothing beyond cap is written (call again with a larger buffer).
 */
ENGINE_API engine_status engine_tokenize(const engine_tokenizer *tok, const char *text, size_t len,
                                         int add_special, int32_t *ids, size_t cap, size_t *n_ids);
/*
 * Decode ids to UTF-8 text in buf[0..cap) (NUL-terminated when room allows).
 * skip_special: leave special tokens out. *len receives the text length
 * without the NUL; ENGINE_ERR_BUFFER_TOO_SMALL when len + 1 > cap.
 */
ENGINE_API engine_status engine_detokenize(const engine_tokenizer *tok, const int32_t *ids, size_t n,
                                           int skip_special, char *buf, size_t cap, size_t *len);
ENGINE_API int engine_tokenizer_vocab_size(const engine_tokenizer *tok);
ENGINE_API int32_t engine_tokenizer_bos(const engine_tokenizer *tok); /* -1 if none */
ENGINE_API int32_t engine_tokenizer_eos(const engine_tokenizer *tok); /* -1 if none */
/* Last error on this tokenizer. A tokenizer may encode and decode from
 * several threads at once, but then this message belongs to whichever call
 * failed last. */
ENGINE_API const char *engine_tokenizer_last_error(const engine_tokenizer *tok);

/*
 * Incremental decoding, for programs that run their own evaluate-and-sample
 * loop: push ids one at a time and get the text each one completes (empty
 * while a UTF-8 character is still incomplete). The concatenation of every
 * push and a final flush equals engine_detokenize() of all the ids pushed,
 * so to print only a continuation, push the prompt's ids first and discard
 * their text (as engine_generate does). skip_special: leave special tokens
 * out. The tokenizer must outlive the decoder; a decoder is used by one
 * thread at a time. Free with engine_detokenizer_free() (NULL: no-op).
 */
typedef struct engine_detokenizer engine_detokenizer;
ENGINE_API engine_status engine_detokenizer_create(const engine_tokenizer *tok, int skip_special,
                                                   engine_detokenizer **out);
ENGINE_API void engine_detokenizer_free(engine_detokenizer *d);
/* *text and *len receive the newly completed text, owned by d and valid until the next
 * call on it. ENGINE_ERR_INVALID_ARG for an id outside the vocabulary. */
ENGINE_API engine_status engine_detokenizer_push(engine_detokenizer *d, int32_t id, const char **text,
                                                 size_t *len);
/* The text still held back (an incomplete character comes out as U+FFFD);
 * pushing may go on afterwards. */
ENGINE_API engine_status engine_detokenizer_flush(engine_detokenizer *d, const char **text, size_t *len);

/* ---------------------------------------------------------------- session */

typedef struct engine_session_params {
    int n_ctx;     /* context length in tokens; 0 = min(model maximum, 4096);
                      ENGINE_CTX_MAX = the model's maximum */
    /* Appended fields: */
    engine_kv_type kv_type; /* AUTO = the model's (engine_model_params.kv_type) */
    int n_batch;            /* most prompt tokens one pass takes: the activation memory
                               is sized for it, not for the prompt; 0 = the default
                               (CPU 64, CUDA 512), at most n_ctx */
} engine_session_params;

ENGINE_API engine_session_params engine_session_default_params(void);

/*
 * A session holds the KV cache and every activation buffer, all sized once
 * here from n_ctx: nothing grows per token. A sliding-window layer's cache
 * holds only its last window + n_batch + 1 positions, as a ring, where that
 * is below n_ctx (see engine_session_reuse). Several sessions may share one
 * model. Free sessions before their model.
 */
ENGINE_API engine_status engine_session_create(engine_model *model, const engine_session_params *params,
                                               engine_session **out, char *err, size_t err_size);
ENGINE_API void engine_session_free(engine_session *s);
/* Forget every token (the KV cache is reused, not freed). */
ENGINE_API void engine_session_reset(engine_session *s);
/* Number of tokens in the context so far. */
ENGINE_API int engine_session_n_past(const engine_session *s);
ENGINE_API int engine_session_n_ctx(const engine_session *s);

/*
 * Run ids[0..n) through the model after the tokens already in the context
 * (a batch when n > 1). *logits (may be NULL) receives a pointer to the
 * vocab_size logits of the last of them, owned by the session and valid until
 * the next call on it. ENGINE_ERR_CONTEXT_FULL when n_past + n > n_ctx
 * (nothing is evaluated then).
 */
ENGINE_API engine_status engine_session_eval(engine_session *s, const int32_t *ids, size_t n,
                                             const float **logits);
ENGINE_API const char *engine_session_last_error(const engine_session *s);

/* --------------------------------------------------------------- sampling */

typedef struct engine_sampler_params {
    float temperature;    /* 0 = greedy (default)                    */
    int top_k;            /* 0 = off                                 */
    float top_p;          /* 1 = off                                 */
    float min_p;          /* 0 = off                                 */
    float repeat_penalty; /* 1 = off; applied over the last repeat_last_n tokens */
    int repeat_last_n;    /* default 64; -1 = the whole context      */
    uint64_t seed;        /* same seed, same output                  */
} engine_sampler_params;

ENGINE_API engine_sampler_params engine_sampler_default_params(void);
ENGINE_API engine_status engine_sampler_create(const engine_sampler_params *params, engine_sampler **out);
ENGINE_API void engine_sampler_free(engine_sampler *smp);
/*
 * Pick the next id from logits[0..n_vocab) (not modified). history holds the
 * tokens so far (for the repetition penalty). Returns the id, or -1 on bad
 * arguments or (when sampling, temperature > 0) when every logit is NaN;
 * NaN logits are never drawn.
 */
ENGINE_API int32_t engine_sampler_sample(engine_sampler *smp, const float *logits, int n_vocab,
                                         const int32_t *history, size_t n_history);

/* ------------------------------------------------------------- generation */

/*
 * Called for each generated token. text/len is the newly completed UTF-8
 * text (possibly empty while a character is still incomplete; special
 * tokens such as EOS give none), valid during the call. Return nonzero to
 * stop generating. If the generation ends inside an incomplete character,
 * one last call with id -1 delivers the remaining text (as U+FFFD).
 */
typedef int (*engine_token_fn)(int32_t id, const char *text, size_t len, void *user);

typedef enum engine_stop_reason {
    ENGINE_STOP_LENGTH = 0,   /* n_predict tokens were generated */
    ENGINE_STOP_EOS = 1,      /* the model produced end-of-sequence */
    ENGINE_STOP_CALLBACK = 2, /* the token callback asked to stop */
    ENGINE_STOP_CONTEXT = 3   /* the context is full */
} engine_stop_reason;

typedef struct engine_generate_params {
    int n_predict;                  /* most tokens to generate; default 128 */
    engine_sampler_params sampling;
    engine_token_fn on_token;       /* may be NULL */
    void *user;
} engine_generate_params;

typedef struct engine_generate_stats {
    size_t n_prompt;
    size_t n_generated;
    double prompt_seconds; /* evaluating the prompt        */
    double gen_seconds;    /* generating (after the prompt) */
    engine_stop_reason stop;
} engine_generate_stats;

ENGINE_API engine_generate_params engine_generate_default_params(void);

/*
 * Evaluate the prompt after the tokens already in the context and generate
 * up to n_predict tokens, stopping at EOS. Generated ids (EOS included when
 * produced) go to out_ids[0..cap) if out_ids is not NULL (ids beyond cap are
 * generated but not stored); *n_out (may be NULL) receives how many were
 * generated. Afterwards the context holds the prompt and every generated
 * token except the last, which was sampled but not evaluated: to continue,
 * pass it first in the next prompt. An empty prompt continues from the
 * logits of the last evaluation.
 */
ENGINE_API engine_status engine_generate(engine_session *s, const int32_t *prompt, size_t n_prompt,
                                         const engine_generate_params *params, int32_t *out_ids,
                                         size_t cap, size_t *n_out, engine_generate_stats *stats);

/* ----------------------------------------------------------------- memory */

typedef struct engine_memory_report {
    uint64_t weights_mapped;  /* bytes of weights read from the file mapping   */
    uint64_t weights_owned;   /* bytes of weights the engine copied/converted  */
    uint64_t kv_cache;        /* bytes of the KV cache                         */
    uint64_t activations;     /* bytes of activation and scratch buffers       */
    uint64_t host_total;      /* host bytes the engine allocated in all         */
    uint64_t device_total;    /* device bytes in use (0 on the CPU)            */
    uint64_t device_budget;   /* most device bytes the engine may map          */
    uint64_t device_reserved; /* device address space reserved                 */
    uint64_t device_mapped;   /* device memory mapped now (>= device_total)    */
    uint64_t device_peak;     /* highest device_mapped so far                  */
} engine_memory_report;

ENGINE_API engine_status engine_session_memory(const engine_session *s, engine_memory_report *r);
/* bytes as text, as the engine's own messages write them ("1.50 GiB", "12.0 MiB",
 * "512.0 KiB", "100 B"), into buf of n bytes; returns buf. */
ENGINE_API const char *engine_format_bytes(uint64_t bytes, char *buf, size_t n);

/* ----------------------------------------------------------- quantization */

/* What engine_quantize did with one source tensor; passed to the callback. */
typedef struct engine_quantize_tensor {
    const char *name;      /* valid during the callback                     */
    size_t index, count;   /* position among the source tensors, and their number */
    int quantized;         /* 0: copied as stored                           */
    uint64_t bytes_in;     /* bytes in the source                           */
    uint64_t bytes_out;    /* bytes written for it (all its parts)          */
    double rms;            /* RMS of the source values (quantized only)     */
    double rms_err;        /* RMS of dequantized - source                   */
    double max_err;        /* largest |dequantized - source|                */
} engine_quantize_tensor;

typedef void (*engine_quantize_fn)(const engine_quantize_tensor *t, void *user);

typedef struct engine_quantize_params {
    engine_quant type;          /* default ENGINE_QUANT_NF4                          */
    const char *const *skip;    /* glob patterns (fnmatch) of names to keep as stored */
    size_t n_skip;
    uint64_t max_shard_bytes;   /* start a new shard past this; 0 = 4 GiB            */
    int n_threads;              /* 0 = all cores                                     */
    engine_quantize_fn on_tensor; /* progress; may be NULL                          */
    void *user;
    /* The output head too, in this format (default ENGINE_QUANT_NONE: kept
     * as stored): lm_head.weight, or for a tied model a new lm_head.weight
     * quantized from the embedding table, which stays as stored. Loads as
     * engine_model_params.quant_head makes it. */
    engine_quant head_type;
} engine_quantize_params;

typedef struct engine_quantize_stats {
    uint64_t bytes_in, bytes_out; /* tensor data before and after          */
    size_t n_tensors, n_quantized;
    int n_shards;
} engine_quantize_stats;

ENGINE_API engine_quantize_params engine_quantize_default_params(void);

/*
 * Write a quantized copy of the checkpoint at in (anything
 * engine_model_load accepts) as the folder out, which must not exist: the
 * decoder layers' linear weights (names ending in "_proj.weight", unless a
 * skip pattern matches) in the format docs/FORMATS.md specifies, every other
 * tensor as stored, sharded past max_shard_bytes, with config.json,
 * generation_config.json and the tokenizer files copied. Everything is
 * written under a temporary name beside out and renamed at the end, so an
 * interrupted or failed run never leaves a folder named out; on failure the
 * temporary folder is removed. stats (may be NULL) gets the totals. Under
 * a file-size limit (RLIMIT_FSIZE) the kernel stops the process with
 * SIGXFSZ unless it is ignored: a program that wants the error instead
 * ignores SIGXFSZ, as tools/quantize does (the library leaves signals alone).
 */
ENGINE_API engine_status engine_quantize(const char *in, const char *out, const engine_quantize_params *params,
                                         engine_quantize_stats *stats, char *err, size_t err_size);

/* ---------------------------------------------------------- offload plan */

/*
 * Where each part of a model would live on the GPU under a device memory
 * budget: resident, or kept in host memory and streamed in when needed
 * (at least two layers in flight). Planning is pure arithmetic on the
 * model's shapes and formats: it touches no device, so a model loaded with
 * ENGINE_DEVICE_CPU (its weights only mapped) can be planned on a machine
 * without a GPU. The sizes are those the CUDA backend lays out: dense
 * matrices in the embeddings' type, q/k/v and gate/up stacked, quantized
 * matrices in their own format with fp32 scales, each arena region rounded
 * up to the allocation granularity (2 MiB).
 */

typedef enum engine_placement {
    ENGINE_PLACE_RESIDENT = 0, /* on the GPU for the whole run (an expert layer:
                                  with engine_plan_entry.experts_resident of its
                                  experts; the rest in host memory)               */
    ENGINE_PLACE_STREAMED = 1, /* in host memory, copied to the GPU when needed;
                                  for the embeddings: each token's row is copied */
    ENGINE_PLACE_HOST = 2      /* a layer in host memory that the CPU computes for
                                  each decoded token (its attention runs on the GPU,
                                  its KV cache stays there); prompts stream it      */
} engine_placement;

typedef enum engine_plan_part {
    ENGINE_PLAN_EMBEDDINGS = 0, /* the token embedding table (0 bytes when tied: the output head holds it) */
    ENGINE_PLAN_LAYER = 1,      /* one decoder layer: its matrices, norms and biases                      */
    ENGINE_PLAN_OUTPUT = 2      /* the final norm and the output head                                     */
} engine_plan_part;

#define ENGINE_PLAN_CUDA_CONTEXT_BYTES ((uint64_t)512 << 20) /* default: measured ~0.5 GiB on an H100 */
#define ENGINE_PLAN_HBM_GBPS 3000.0  /* default device memory bandwidth, GB/s (an H100 SXM's)  */
#define ENGINE_PLAN_PCIE_GBPS 54.7   /* default pinned host-to-device bandwidth, GB/s (PCIe 5 x16) */

/* Where a figure the planner used came from. Values are append-only. */
typedef enum engine_figure_source {
    ENGINE_FIGURE_DEFAULT = 0,  /* the built-in default (ENGINE_PLAN_HBM_GBPS, ENGINE_PLAN_PCIE_GBPS) */
    ENGINE_FIGURE_GIVEN = 1,    /* set by the caller (infer: on the command line)                    */
    ENGINE_FIGURE_MEASURED = 2, /* measured on this machine's device (engine_device_bandwidths)      */
    ENGINE_FIGURE_TABLE = 3     /* from the table of GPUs (engine_gpu_find), for gpu_name             */
} engine_figure_source;

typedef struct engine_plan_params {
    uint64_t vram_budget;        /* device bytes for everything, CUDA context included; must be > 0 */
    int n_ctx;                   /* context length; 0 = as engine_session_create chooses;
                                    ENGINE_CTX_MAX = the model's maximum                            */
    engine_quant quant;          /* plan the layers as --quant would make them; NONE = as loaded    */
    uint64_t cuda_context_bytes; /* 0 = ENGINE_PLAN_CUDA_CONTEXT_BYTES                               */
    double hbm_gbps;             /* 0 = ENGINE_PLAN_HBM_GBPS                                         */
    double pcie_gbps;            /* 0 = ENGINE_PLAN_PCIE_GBPS                                        */
    int min_layers_streamed;     /* stream at least this many layers even where more would fit
                                    (as engine_model_params.min_layers_streamed; more than the model
                                    has: the output head and the embeddings too); 0 = as needed     */
    int host_layers;             /* streamed layers the CPU computes for decode (ENGINE_PLACE_HOST,
                                    spread evenly among the streamed): 0 = none (default); -1 = as
                                    many as make decode fastest at host_gbps, the CPU's work
                                    overlapping the other layers' copies; N > 0 = N of them (at most
                                    all the streamed)                                               */
    double host_gbps;            /* the rate at which the CPU computes a layer for one token, in GB of
                                    its weights per second (engine_host_layer_rate); needed when
                                    host_layers is not 0; it also prices the routed experts the CPU
                                    runs (0: they are priced at pcie_gbps)                          */
    /* Appended fields: */
    engine_figure_source hbm_source;  /* where hbm_gbps came from, for the report: DEFAULT with a
                                         value other than ENGINE_PLAN_HBM_GBPS counts as GIVEN      */
    engine_figure_source pcie_source; /* the same for pcie_gbps                                     */
    const char *gpu_name;             /* the card of TABLE figures (engine_gpu_info.name); copied;
                                         may be NULL                                                */
    double shared_gbps;               /* host memory read by the copy engine and the CPU together,
                                         GB/s, when hosted layers run beside streamed copies
                                         (engine_host_shared_rate); 0 = not modelled (default)      */
    engine_kv_type kv_type;           /* the KV cache type to plan; AUTO (default): the default
                                         type (f16, f32 for f32 models) when everything fits, else
                                         int8 or streamed weights, whichever decodes faster at
                                         full context (docs/API.md); any other type is kept         */
    int n_batch;                      /* prompt tokens a pass the activations are sized for
                                         (engine_session_params.n_batch); 0 = CUDA's default (512),
                                         at most n_ctx                                              */
    int moe_cpu;                      /* the first N expert layers keep every routed expert in host
                                         memory (as engine_model_params.moe_cpu); 0 = as the budget
                                         decides (default); more than the expert layers = all       */
    int moe_host;                     /* engine_moe_host: who runs decode's routed experts in host
                                         memory (AUTO: the GPU over PCIe unless host_gbps is the
                                         higher rate)                                                */
    uint64_t expert_cache;            /* device bytes kept for the expert cache (as
                                         engine_model_params.expert_cache); 0 = none                 */
} engine_plan_params;

/* One row of the plan: the embeddings, each layer in order, the output head. */
typedef struct engine_plan_entry {
    engine_plan_part part;
    int layer;                   /* layer index; -1 for the embeddings and the output head          */
    const char *format;          /* "bf16", "f16", "f32", "int8", "int8-g128", "nf4", "nf4-dq", "fp4", "tied"; static */
    uint64_t weight_bytes;       /* bytes on the device in that format                              */
    engine_placement placement;
    uint64_t kv_bytes;           /* this layer's K and V cache (always on the device; a window
                                    layer's ring where it has one); 0 otherwise                     */
    uint64_t bytes_per_token;    /* host-to-device bytes per decoded token; 0 when resident or
                                    computed on the host                                            */
    /* Appended fields: a mixture-of-experts layer is placed an expert at a time. */
    int n_experts;               /* the layer's routed experts; 0 for a dense layer and the other rows */
    int experts_resident;        /* of which on the device: experts 0 .. experts_resident - 1 of a
                                    RESIDENT layer (placement is that of the layer's attention,
                                    router and shared expert, and of these); the others stay in host
                                    memory, the CPU running a token's picks among them for decode
                                    and prompts streaming them. 0 for a STREAMED or HOST layer,
                                    whose experts all go with it                                    */
    uint64_t expert_bytes;       /* one routed expert's device bytes (its gate/up and down, each
                                    padded as laid out); weight_bytes stays the whole layer's       */
} engine_plan_entry;

typedef struct engine_plan_totals {
    uint64_t budget;             /* params.vram_budget                                              */
    int n_ctx;                   /* the context length planned for                                  */
    int fits;                    /* 0: refused, even the minimum is over the budget                 */
    int n_layers;
    int n_layers_streamed;       /* in host memory: streamed and host-computed alike               */
    int n_layers_host;           /* of which the CPU computes for decode (ENGINE_PLACE_HOST)        */
    uint64_t weights_resident;   /* weights held on the device for the whole run                    */
    uint64_t weights_streamed;   /* weights kept in host memory                                     */
    uint64_t stream_buffers;     /* device buffers for the streamed layers in flight                */
    uint64_t kv_cache;
    uint64_t activations;        /* activations, scratch and the cuBLASLt workspace                 */
    uint64_t cuda_context;
    uint64_t device_total;       /* all of the above with arena rounding, CUDA context included     */
    uint64_t free_bytes;         /* budget - device_total; 0 when refused                           */
    uint64_t minimum;            /* the least device memory this model and context need            */
    uint64_t all_resident;       /* device memory to keep every weight resident                     */
    uint64_t read_per_token;     /* resident weight bytes read per decoded token                    */
    uint64_t streamed_per_token; /* host-to-device bytes per decoded token                          */
    uint64_t host_per_token;     /* weight bytes the CPU reads per decoded token                    */
    double tokens_per_second;    /* decode bound: read / HBM + the longer of streamed / PCIe
                                    bandwidth and host-computed / host rate (they overlap)          */
    double resident_tokens_per_second; /* the bound if every weight were resident                   */
    int max_ctx_that_fits;       /* when refused: the longest context that would fit, 0 if none     */
    double hbm_gbps, pcie_gbps;  /* the bandwidths used                                             */
    double host_gbps;            /* the host compute rate used (0: none)                            */
    /* Appended fields: */
    engine_figure_source hbm_source, pcie_source; /* where hbm_gbps and pcie_gbps came from         */
    char gpu_name[48];           /* params.gpu_name ("" when none)                                  */
    double shared_gbps;          /* params.shared_gbps: with hosted layers the bound's host side is
                                    the longest of streamed / PCIe, hosted / host rate and
                                    (streamed + hosted) / shared_gbps (0: the first two only)       */
    engine_kv_type kv_type;      /* the KV cache type planned: params.kv_type, or AUTO's choice     */
    uint64_t kv_bytes_per_token; /* KV cache bytes of one position in every layer (K and V, and the
                                    scales of int8 and fp8): what a token of context takes where no
                                    layer's cache is a ring (kv_window_layers)                      */
    double full_ctx_tokens_per_second; /* decode bound with the cache full: tokens_per_second's
                                    time plus the whole KV cache read at the HBM rate (0 refused)  */
    int max_ctx_by_kv[6];        /* the longest context (up to the model's maximum, or n_ctx when
                                    longer) whose minimum fits the budget, for each KV type, indexed
                                    by engine_kv_type; [ENGINE_KV_AUTO]: the longest of them        */
    int n_batch;                 /* prompt tokens a pass the activations were sized for            */
    int kv_auto;                 /* 1: kv_type is AUTO's choice (params.kv_type was AUTO)           */
    int kv_window_layers;        /* sliding-window layers whose cache is a ring of kv_ring_rows
                                    positions (their last ones) instead of n_ctx; 0: none           */
    int kv_ring_rows;            /* window + n_batch + 1 where that is below n_ctx, else 0          */
    int n_expert_layers;         /* mixture-of-experts layers; 0 for a dense model                  */
    int n_experts, n_experts_used; /* experts a layer and the top-k a token runs: read_per_token and
                                    host_per_token count only those k of each layer's experts, on
                                    the device for its resident experts, on the CPU for the others
                                    (k x in host / n_experts of them on average); a streamed or
                                    hosted layer takes all its experts with it: a streamed one
                                    moves them all                                                  */
    int n_experts_resident;      /* routed experts on the device, summed over the layers            */
    int n_experts_host;          /* routed experts in host memory, summed over the layers (those of
                                    streamed and hosted layers included)                            */
    int experts_host_gpu;        /* 1: decode's GPU reads a token's picks among the host experts of
                                    resident layers over PCIe (counted in streamed_per_token); 0:
                                    the CPU runs them (host_per_token)                              */
    uint64_t expert_cache;       /* device bytes kept for the expert cache (in device_total); the
                                    bound does not count its hits                                  */
} engine_plan_totals;

/* The same plan with the layers quantized to another format (as --quant would). */
typedef struct engine_plan_option {
    engine_quant quant;
    const char *name;            /* "int8", "nf4", ...; static                                       */
    uint64_t weight_bytes;       /* every weight on the device in that format                        */
    uint64_t minimum;            /* least device memory it needs                                     */
    uint64_t all_resident;       /* device memory to keep it all resident                            */
    int fits;                    /* minimum within the budget                                        */
    int fits_resident;           /* all_resident within the budget                                   */
    double tokens_per_second;    /* its decode bound under the same budget (0 when it does not fit)  */
} engine_plan_option;

typedef struct engine_plan engine_plan;

ENGINE_API engine_plan_params engine_plan_default_params(void);

/*
 * Plan model under params (vram_budget required). On ENGINE_OK *out owns
 * the plan; free it with engine_plan_free() (the model may be freed first:
 * the plan copies what it needs). When even the minimum is over the budget
 * the call returns ENGINE_ERR_OVER_BUDGET, err gets one line giving the
 * minimum and what would make it fit (a shorter context, a quantized
 * format), and *out still receives the plan (totals.fits == 0) so a program
 * can read the figures; free it likewise. Other errors leave *out NULL.
 */
ENGINE_API engine_status engine_plan_create(const engine_model *model, const engine_plan_params *params,
                                            engine_plan **out, char *err, size_t err_size);
/* NULL is a no-op. */
ENGINE_API void engine_plan_free(engine_plan *plan);
/* The totals; owned by the plan, valid until engine_plan_free. NULL for a NULL plan. */
ENGINE_API const engine_plan_totals *engine_plan_get_totals(const engine_plan *plan);
/* Rows: the embeddings, the layers in order, then the output head (n_layers + 2). */
ENGINE_API size_t engine_plan_n_entries(const engine_plan *plan);
/* Row i, owned by the plan; NULL when i is out of range. */
ENGINE_API const engine_plan_entry *engine_plan_entry_at(const engine_plan *plan, size_t i);
/* The quantized alternatives (every format but the one planned); same ownership. */
ENGINE_API size_t engine_plan_n_options(const engine_plan *plan);
ENGINE_API const engine_plan_option *engine_plan_option_at(const engine_plan *plan, size_t i);
/*
 * The plan in one line: all resident, or how many layers stream and their
 * speed bound (naming a quantized format that would make it all resident),
 * or the refusal. Owned by the plan.
 */
ENGINE_API const char *engine_plan_summary(const engine_plan *plan);

/*
 * The plan a CUDA model was placed by (the same rows and totals as
 * engine_plan_create gives for its budget and context), owned by the
 * model and valid while it lives; NULL for a model on the CPU.
 */
ENGINE_API const engine_plan *engine_model_plan(const engine_model *model);

/*
 * Device bytes the engine sets aside from a vram_budget for the CUDA
 * context and the runtime's own allocations outside its arena, as
 * measured now on the current device (this creates the CUDA context).
 * ENGINE_ERR_UNSUPPORTED without a CUDA device or backend.
 */
ENGINE_API engine_status engine_device_reserve(uint64_t *bytes);

/*
 * The rate at which this host's CPU computes one token through a decoder
 * layer of model (its matrix products, no attention), in GB of weights per
 * second, with the threads hosted layers use (the model's but one, which
 * waits for the GPU): the planner's host_gbps. Runs the last four layers
 * three times (about 0.1 s for an 8B model's once in memory; the first call
 * faults their pages in).
 */
ENGINE_API engine_status engine_host_layer_rate(const engine_model *model, double *gbps);

/*
 * The current device's memory bandwidth (a device-to-device copy well past
 * its L2 cache, bytes read plus bytes written a second) and its pinned
 * host-to-device rate, in GB/s: what a model loaded on it plans with.
 * Measured once per device and process (a few tens of milliseconds; the
 * result is kept: the library's one cache of measurements) inside a
 * temporary arena of at most vram_budget less the CUDA context's share
 * (0: no limit). Creates the CUDA context. UNSUPPORTED without a CUDA
 * device or backend, OVER_BUDGET when the budget leaves too little to
 * measure past the L2 cache, CUDA if a call fails; INVALID_ARG for NULL.
 * The environment variable ENGINE_MEASURED_GBPS="DEVICE,H2D[,SHARED]"
 * replaces every measurement with those figures (for tests), in any build.
 */
ENGINE_API engine_status engine_device_bandwidths(uint64_t vram_budget, double *device_gbps, double *h2d_gbps);

/*
 * The rate, in GB/s, at which host memory is read while the copy engine
 * uploads from pinned memory and this CPU computes model's layers (as
 * engine_host_layer_rate does) at the same time: the two rates measured
 * together, summed. The planner's shared_gbps. Needs a CUDA device (about
 * 0.1 s for an 8B model; 256 MiB of host memory pinned meanwhile, 32 MiB
 * of device memory within vram_budget); errors as engine_device_bandwidths.
 */
ENGINE_API engine_status engine_host_shared_rate(const engine_model *model, uint64_t vram_budget, double *gbps);

/* ----------------------------------------------------------- known GPUs */

/*
 * A table of common NVIDIA GPUs, so that a plan can be made for a card
 * this machine does not have (infer --dry-run --gpu NAME). Datasheet
 * figures, and the two the planner uses derived from them with stated
 * efficiencies (docs/API.md gives their basis).
 */
#define ENGINE_GPU_MEM_EFFICIENCY 0.90  /* of the datasheet memory bandwidth reached by a copy */
#define ENGINE_GPU_PCIE_EFFICIENCY 0.85 /* of the link's per-direction rate reached by pinned copies */

typedef struct engine_gpu_info {
    const char *name;        /* "RTX 4090", "H100 SXM"; static storage                      */
    double vram_gib;         /* device memory as sold (GB, taken as GiB)                    */
    double mem_gbps;         /* datasheet memory bandwidth, GB/s                            */
    int pcie_gen;            /* host link: PCIe generation ...                              */
    int pcie_lanes;          /* ... and lanes                                               */
    int cc_major, cc_minor;  /* CUDA compute capability                                     */
    const char *source;      /* where the figures come from; static storage                 */
    double hbm_gbps;         /* the planner's figure: mem_gbps x ENGINE_GPU_MEM_EFFICIENCY  */
    double pcie_gbps;        /* the planner's figure: lanes x the generation's rate a lane
                                after encoding x ENGINE_GPU_PCIE_EFFICIENCY                 */
} engine_gpu_info;

/* Rows in the table. */
ENGINE_API size_t engine_gpu_count(void);
/* Row i into *out; INVALID_ARG when i is out of range or out is NULL. */
ENGINE_API engine_status engine_gpu_at(size_t i, engine_gpu_info *out);
/*
 * The row named `name`, matched forgivingly: case, spaces, dashes and
 * underscores ignored, a leading "NVIDIA", "GeForce", "RTX" or "Tesla"
 * optional, and a part of a name ("4090") enough when only one row holds
 * it. INVALID_ARG when none or several match: err gets one line naming
 * the closest or the matching rows.
 */
ENGINE_API engine_status engine_gpu_find(const char *name, engine_gpu_info *out, char *err, size_t err_size);

/* What streaming did in a session: placement, and copy and compute time measured on the device. */
typedef struct engine_offload_times {
    int passes;             /* evaluations measured                                  */
    int tokens;             /* tokens they evaluated                                 */
    double wall_seconds;    /* first event to last, summed over the passes           */
    double copy_seconds;    /* host-to-device copies of streamed weights in progress */
    double compute_seconds; /* the layers and the head computing                     */
    double overlap_seconds; /* copies and compute both in progress                   */
    uint64_t bytes_copied;  /* streamed weight bytes copied                          */
    double host_seconds;    /* the CPU computing host-placed layers                  */
} engine_offload_times;

typedef struct engine_offload_report {
    int n_layers;
    int n_layers_streamed;    /* in host memory, host-computed ones included          */
    int n_layers_host;        /* computed by the CPU for decode (ENGINE_PLACE_HOST)   */
    int embeddings_on_host;   /* each token's embedding row read from host memory     */
    uint64_t bytes_per_token; /* streamed weight bytes per decoded token (a prompt's
                                 passes also stream the hosted layers)                */
    uint64_t stream_buffers;  /* device bytes of the buffers streamed layers go into  */
    uint64_t host_pinned;     /* host bytes pinned for streaming (registered + copies) */
    uint64_t device_reserve;  /* what engine_device_reserve set aside at load          */
    engine_offload_times prefill; /* every batch evaluation since the session began  */
    engine_offload_times decode;  /* engine_session_offload's measured decode steps  */
    /* Appended fields: the expert cache (engine_model_params.expert_cache), the model's. */
    int expert_cache_slots;       /* experts it holds at once; 0: no cache             */
    uint64_t expert_cache_bytes;  /* its device bytes                                  */
    uint64_t expert_cache_hits;   /* picks of experts it may hold that found theirs in it,
                                     since load (prompts' and decode's)                */
    uint64_t expert_cache_misses; /* ... and that did not                              */
} engine_offload_report;

/*
 * Fill r for session s. On CUDA with streamed layers, first measures
 * n_decode (0..16) decode steps: each evaluates the last token again at its
 * own position (as the engine does to recover logits; when that token came
 * from a prompt, its cache row and the logits become the decode path's,
 * equal to the prompt path's within rounding), launched one by one with timing events on the
 * compute and the copy stream. Prefill figures are gathered as prompts
 * run. On the CPU or with nothing streamed, r holds zeros but n_layers.
 */
ENGINE_API engine_status engine_session_offload(engine_session *s, int n_decode, engine_offload_report *r);

/*
 * How often the router picked each routed expert of mixture-of-experts
 * layer `layer` since the session was created: counts[0 .. n_experts) for
 * n >= the model's n_experts (engine_model_info). Every token a pass
 * evaluates counts its k choices (prompts, decode steps, and the steps
 * engine_session_offload times); on CUDA the device counts them as it
 * routes (read back here, after the queued work). INVALID_ARG for a dense
 * layer or too small an n.
 */
ENGINE_API engine_status engine_session_expert_picks(engine_session *s, int layer, uint32_t *counts, int n);

/* ------------------------------------------------------------------ trace */

/*
 * A trace records where time goes, for Perfetto (ui.perfetto.dev) and
 * chrome://tracing: spans for the load (config, mapping and validation,
 * quantize-on-load, upload), for each prompt pass and decode step and,
 * inside a step, for each layer on the track where it ran (the CPU; on
 * CUDA the GPU's compute and copy engine, from the timing events of the
 * passes the engine times); counters (KV cache positions filled, device
 * memory mapped and in use, host memory pinned); and metadata (model,
 * plan, device, budget). It lives in memory until engine_trace_save writes
 * it. Without a trace nothing is recorded and nothing costs. A trace may
 * be shared by a model and its sessions on several threads (calls on it
 * are serialised); each session gets tracks of its own.
 */
/* A new, empty trace in *out; free with engine_trace_free after the models
 * and sessions that record into it. INVALID_ARG, OUT_OF_MEMORY. */
ENGINE_API engine_status engine_trace_create(engine_trace **out);
/* NULL is a no-op. */
ENGINE_API void engine_trace_free(engine_trace *trace);
/* Record key = value (UTF-8, copied) in the trace's metadata; the engine
 * sets "model", "device", "plan", "budget" itself. INVALID_ARG for NULL. */
ENGINE_API engine_status engine_trace_set_metadata(engine_trace *trace, const char *key, const char *value);
/*
 * Write everything recorded so far to path as a trace-event JSON object
 * ({"traceEvents": [...], "displayTimeUnit": "ms", "metadata": {...}});
 * recording may go on, and a later save writes it all again. IO with a
 * one-line message naming path in err when it cannot be written;
 * OUT_OF_MEMORY; INVALID_ARG for NULL.
 */
ENGINE_API engine_status engine_trace_save(engine_trace *trace, const char *path, char *err, size_t err_size);
/* Record s's passes into trace from now on (NULL: stop recording); a
 * session starts with its model's trace. INVALID_ARG for a NULL session. */
ENGINE_API engine_status engine_session_set_trace(engine_session *s, engine_trace *trace);

/* ------------------------------------------------------------------- chat */

/*
 * Chat templates: the Jinja program an instruct model ships (chat_template
 * in tokenizer_config.json, as a string or as a list of named templates of
 * which "default" is used, or "tool_use" when the variables give tools;
 * otherwise chat_template.jinja beside it) lays a conversation out as the
 * model was trained to read it, rendered as transformers'
 * apply_chat_template does. A tokenizer loads its template with it.
 */
typedef struct engine_chat_message {
    const char *role;    /* "system", "user", "assistant", ...: UTF-8 */
    const char *content; /* UTF-8 text                                 */
} engine_chat_message;

typedef struct engine_chat_params {
    int add_generation_prompt;   /* 1 (default): end by opening the assistant's turn          */
    const char *template_source; /* NULL (default): the tokenizer's template; else Jinja source */
    const char *template_name;   /* what errors call template_source (a file name); NULL: "template" */
    const char *variables_json;  /* NULL, or a JSON object of extra template variables
                                    (e.g. {"tools": [...], "date_string": "26 Jul 2024"}),
                                    passed as transformers passes keyword arguments          */
    const char *messages_name;   /* what errors call the JSON of engine_chat_render_json
                                    (a file name); NULL: "messages"                          */
} engine_chat_params;

ENGINE_API engine_chat_params engine_chat_default_params(void);

/*
 * Render msgs[0..n) with tok's chat template (or params->template_source)
 * into buf[0..cap), NUL-terminated. The template sees messages,
 * add_generation_prompt, the config's special-token strings (bos_token,
 * eos_token, ...) and the variables. *len (may be NULL) receives the length
 * of the text without the NUL; ENGINE_ERR_BUFFER_TOO_SMALL when len + 1 >
 * cap (buf may be NULL with cap 0 to ask the size). Other errors leave a
 * one-line message in engine_tokenizer_last_error(tok) naming the template
 * file and the place: FORMAT for a template syntax error (line, column), a
 * raise_exception (its message), an undefined value used where Jinja fails
 * or a limit exceeded; UNSUPPORTED when there is no template.
 */
ENGINE_API engine_status engine_chat_render(const engine_tokenizer *tok, const engine_chat_message *msgs, size_t n,
                                            const engine_chat_params *params, char *buf, size_t cap, size_t *len);
/*
 * The same from JSON text: {"messages": [{"role", "content"}, ...],
 * "variables": {...}} (variables optional, applied after
 * params->variables_json), or a bare list of messages. Messages may carry
 * more fields (tool_calls, ...); each needs a role string and a content
 * (but one with tool_calls). FORMAT for JSON that is malformed (line,
 * column) or lacks them, named by params->messages_name.
 */
ENGINE_API engine_status engine_chat_render_json(const engine_tokenizer *tok, const char *json, size_t json_len,
                                                 const engine_chat_params *params, char *buf, size_t cap,
                                                 size_t *len);
/*
 * Tokenize a rendered prompt: special-token strings in it become their
 * ids, BOS is put first when the tokenizer's config adds one and the text
 * does not begin with it already, and EOS is never added. Buffer contract
 * as engine_tokenize.
 */
ENGINE_API engine_status engine_chat_tokenize(const engine_tokenizer *tok, const char *text, size_t len,
                                              int32_t *ids, size_t cap, size_t *n_ids);
/* 1 when tok has a chat template of its own. */
ENGINE_API int engine_tokenizer_has_chat_template(const engine_tokenizer *tok);

/*
 * Keep the longest prefix of the session's context that equals
 * ids[0..n), at most n - 1 tokens, and forget the rest: then evaluate (or
 * engine_generate) ids[*n_reused..n) to continue. For a chat, render the
 * whole conversation each turn and pass its ids here, so that only the new
 * turn is evaluated (and, where the template re-renders an earlier turn
 * differently, everything from the first token that differs).
 * Sliding-window layers keep only a ring of window + n_batch + 1 positions
 * (when that is below n_ctx): a prefix is kept only while the ring still
 * holds the window before its end. A rewind of up to n_batch + 2 tokens
 * from the furthest position ever written (since the context was empty)
 * always is; from further back nothing is kept (*n_reused = 0).
 */
ENGINE_API engine_status engine_session_reuse(engine_session *s, const int32_t *ids, size_t n, size_t *n_reused);

/* ---------------------------------------------------------------- scoring */

/*
 * Called by engine_session_score for each scored position i with that
 * position's logits (n_vocab floats, the distribution of ids[i]; owned by
 * the session, valid during the call only) and their log normaliser lse
 * (log of the sum of exp, in double): log p(v) = logits[v] - lse.
 */
typedef void (*engine_score_fn)(size_t i, const float *logits, int n_vocab, double lse, void *user);

/*
 * Prompt scoring: run ids[0..n) after the tokens already in the context (as
 * engine_session_eval does) and write logprob[i - first] = log p(ids[i] |
 * context, ids[<i]) for first <= i < n (logprob: caller-owned, n - first
 * entries; may be NULL when fn is given). Each log-softmax is taken in
 * double. 1 <= first <= n: the first id has no prediction within the call.
 * fn (may be NULL) also gets each scored position's whole logits row. Both
 * backends compute every row of a batch: the CPU on the host (n_batch *
 * vocab_size floats allocated for the call), CUDA on the device, where
 * the rows leave it only when fn is given (the log-sum-exp is taken there
 * in fp32; a streamed output head scores one token at a time). Afterwards
 * the context holds all n ids and the session's logits are those after
 * ids[n-1], as after engine_session_eval. Errors as engine_session_eval's
 * (nothing is evaluated on INVALID_ARG or CONTEXT_FULL); OUT_OF_MEMORY when
 * the rows cannot be allocated.
 */
ENGINE_API engine_status engine_session_score(engine_session *s, const int32_t *ids, size_t n, size_t first,
                                              double *logprob, engine_score_fn fn, void *user);

#ifdef __cplusplus
}
#endif

#endif /* ENGINE_H */
