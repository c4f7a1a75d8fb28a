/*
 * engine.h: the public C11 API of libengine, an inference engine for large
 * language models stored as Hugging Face safetensors checkpoints.
 *
 * Everything the command-line tools do goes through this header. The
 * library never prints (unless given a log callback), never exits, and keeps
 * no global mutable state: everything lives in the handles below.
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

/* ------------------------------------------------------------------ model */

typedef struct engine_model_params {
    engine_device device;  /* default ENGINE_DEVICE_AUTO                   */
    int n_threads;         /* CPU threads; 0 = all cores (default)         */
    uint64_t vram_budget;  /* device bytes; 0 = free memory minus a margin */
    engine_log_fn log;     /* NULL: the library stays silent               */
    void *log_user;
} engine_model_params;

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
    const char *weight_dtype; /* "f32", "f16", "bf16" (the dominant type) */
    engine_device device;     /* where the model runs: CPU or CUDA, never AUTO */
    int tied_embeddings;      /* 1 when the output matrix is the embedding table */
} engine_model_info;

ENGINE_API engine_status engine_model_get_info(const engine_model *model, engine_model_info *info);
/* 1 if id ends generation for this model (EOS from config, generation_config, tokenizer). */
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

/* ---------------------------------------------------------------- session */

typedef struct engine_session_params {
    int n_ctx;     /* context length in tokens; 0 = min(model maximum, 4096) */
} engine_session_params;

ENGINE_API engine_session_params engine_session_default_params(void);

/*
 * A session holds the KV cache and every activation buffer, all sized once
 * here from n_ctx: nothing grows per token. Several sessions may share one
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

#ifdef __cplusplus
}
#endif

#endif /* ENGINE_H */
