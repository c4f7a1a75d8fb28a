/*
 * model.h: the engine's internal view of a loaded model and of a session.
 *
 * A model is a config, a table row of architecture features, and weight
 * views into the safetensors mapping (nothing copied). A session owns one
 * block of host memory holding the KV cache and every activation buffer,
 * sized once from the context length.
 */
#ifndef ENGINE_MODEL_H
#define ENGINE_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "../kernels/kernels.h"
#include "../loaders/config.h"
#include "../loaders/safetensors.h"
#include "../loaders/tokenizer.h"
#include "engine.h"
#include "error.h"

/*
 * What distinguishes the supported architectures. The forward pass reads
 * these flags; it is never copied per architecture.
 */
typedef enum arch_qk_norm {
    QK_NONE = 0,
    QK_HEAD,              /* RMSNorm of each head of q and k, weights [head_dim] (Qwen3) */
    QK_WHOLE              /* RMSNorm of the whole q and k projections, weights
                             [n_heads*head_dim] and [n_kv_heads*head_dim] (OLMo 2) */
} arch_qk_norm;

typedef enum arch_norms {
    NORMS_PRE = 0,        /* RMSNorm on the attention and MLP inputs (Llama)    */
    NORMS_POST,           /* on their outputs before the residual add, none on
                             the inputs (OLMo 2)                                */
    NORMS_SANDWICH        /* on both: input_layernorm, post_attention_layernorm,
                             pre_feedforward_layernorm, post_feedforward_layernorm
                             (Gemma 2 and 3)                                    */
} arch_norms;

typedef struct arch_features {
    const char *name;     /* config.json "architectures"[0]                      */
    const char *label;    /* the family's name in messages, e.g. "Granite"       */
    bool qkv_bias;        /* q/k/v projections always carry a bias (Qwen2)       */
    arch_qk_norm qk_norm; /* RMSNorm on q and k before RoPE                      */
    bool config_bias;     /* config's attention_bias adds q/k/v/o biases         */
    bool sliding_window;  /* config's sliding_window limits attention (Mistral)  */
    arch_norms norms;     /* where the blocks' RMSNorms sit                      */
    bool multipliers;     /* config's embedding/residual/attention multipliers and
                             logits_scaling (Granite); else cleared (no scaling) */
    bool norm_offset;     /* every RMSNorm scales by (1 + w), w as stored (Gemma) */
    bool embed_scale;     /* embeddings times sqrt(hidden_size), rounded to the
                             embedding table's dtype as transformers does (Gemma) */
    int query_scalar;     /* > 0: config's query_pre_attn_scalar (this when
                             absent) sets the score scale, its -1/2 power (Gemma) */
    bool softcap;         /* config's attn_logit_softcapping and
                             final_logit_softcapping apply (Gemma)               */
    double attn_softcap, final_softcap; /* ... their values when absent (Gemma 2:
                             50 and 30; 0: none)                                 */
    int window_period;    /* > 0: without layer_types, every Nth layer is global
                             and the rest slide (sliding_window_pattern, when
                             given, is N); Gemma 2: 2, Gemma 3: 6                */
    bool local_rope;      /* sliding layers have a RoPE of their own
                             (rope_local_base_freq, default 10000; Gemma 3)      */
    bool fused;           /* self_attn.qkv_proj and mlp.gate_up_proj, bound as
                             views of their row blocks (Phi-3); a checkpoint
                             engine_quantize wrote holds them as the unfused
                             names (q_proj, ..., up_proj) instead               */
    /* Mixture of experts: a router ("gate", [n_experts, dim], no bias) whose
     * softmax over all experts picks the top num_experts_per_tok of them for
     * each token; the MLP's output is their outputs weighted by those
     * probabilities. */
    bool moe;             /* routed experts replace the MLP (cfg_layer_moe)   */
    bool moe_renorm;      /* the kept probabilities always renormalised to sum
                             1 (Mixtral: softmax over the chosen); else only
                             with config's norm_topk_prob                     */
    bool moe_ffn_key;     /* experts sized by moe_intermediate_size (Qwen2/3-MoE);
                             else by intermediate_size (Mixtral, OLMoE)      */
    bool moe_shared;      /* a shared expert every token runs, its output times
                             sigmoid(shared_expert_gate . x) (Qwen2-MoE)     */
    bool moe_sparse_step; /* decoder_sparse_step and mlp_only_layers pick the
                             expert layers (Qwen2/3-MoE); else every layer   */
    const char *moe_block; /* the block's tensor-name part: "block_sparse_moe"
                             (Mixtral) or "mlp" (NULL); stacked experts are
                             also looked for under "mlp", transformers 5's name */
    bool cuda;            /* the CUDA backend runs it; else loading on CUDA fails */
} arch_features;

/* The row for an architecture name, or NULL. */
const arch_features *arch_find(const char *name);
/* "LlamaForCausalLM, MistralForCausalLM, ..." for error messages; static storage. */
const char *arch_supported_list(void);

/*
 * One expert's SwiGLU MLP. Bound as views of the mapping: per-expert tensors
 * (experts.N.gate_proj/up_proj/down_proj, or Mixtral's w1/w3/w2), or row
 * blocks of stacked ones (experts.gate_up_proj [n_experts, 2*moe_ffn, dim],
 * experts.down_proj [n_experts, dim, moe_ffn]); quantized while loading, the
 * model owns them.
 */
typedef struct moe_expert {
    k_weight w_gate;           /* [moe_ffn_dim, dim]                      */
    k_weight w_up;             /* [moe_ffn_dim, dim]                      */
    k_weight w_down;           /* [dim, moe_ffn_dim]                      */
} moe_expert;

typedef struct layer_weights {
    k_weight attn_norm;        /* [dim]; data NULL with NORMS_POST        */
    k_weight wq;               /* [n_heads*head_dim, dim]; with a fused qkv_proj
                                  (Phi-3) wq, wk and wv are views of its row blocks */
    k_weight wk;               /* [n_kv_heads*head_dim, dim]              */
    k_weight wv;               /* [n_kv_heads*head_dim, dim]              */
    k_weight wo;               /* [dim, n_heads*head_dim]                 */
    k_weight bq, bk, bv, bo;   /* biases of the above; data NULL if none  */
    k_weight q_norm, k_norm;   /* [head_dim] (QK_HEAD), or [n_heads*head_dim] and
                                  [n_kv_heads*head_dim] (QK_WHOLE); data NULL if none */
    k_weight ffn_norm;         /* [dim]; data NULL with NORMS_POST        */
    k_weight attn_post_norm;   /* [dim] on attention's output (NORMS_POST, NORMS_SANDWICH);
                                  else data NULL */
    k_weight ffn_post_norm;    /* [dim] on the MLP's output, likewise     */
    k_weight w_gate;           /* [ffn_dim, dim]; with a fused gate_up_proj (Phi-3)
                                  w_gate and w_up are views of its halves */
    k_weight w_up;             /* [ffn_dim, dim]                          */
    k_weight w_down;           /* [dim, ffn_dim]                          */
    k_weight b_gate, b_up, b_down; /* data NULL if none                   */
    /* An expert layer (cfg_layer_moe) has these instead of w_gate, w_up and
     * w_down, whose data are then NULL: */
    k_weight router;           /* [n_experts, dim]; data NULL in a dense layer */
    moe_expert *experts;       /* [n_experts] (into engine_model.experts); NULL in a dense layer */
    moe_expert shared;         /* [shared_ffn_dim, dim] ... (Qwen2-MoE); else data NULL */
    k_weight shared_gate;      /* [1, dim] the shared expert's sigmoid gate; else data NULL */
} layer_weights;

/* Rows of the widest MLP hidden state a layer forms: a dense layer's, a
 * shared expert's or (per token and expert) a routed expert's. */
static inline int model_ffn_max(const cfg_model *c)
{
    int f = c->ffn_dim;
    if (c->shared_ffn_dim > f)
        f = c->shared_ffn_dim;
    if (c->n_experts > 0 && c->moe_ffn_dim > f)
        f = c->moe_ffn_dim;
    return f;
}

#define MODEL_MAX_EOS 16

struct chat_source;

struct engine_tokenizer {
    tok_tokenizer *tok;
    struct chat_source *chat; /* chat template and token strings (chat.h); never NULL once loaded */
    err_buf err;
};

struct cuda_model;
struct cuda_session;

struct engine_model {
    engine_device device;      /* ENGINE_DEVICE_CPU or ENGINE_DEVICE_CUDA */
    struct cuda_model *cuda;   /* device weights and arena; NULL on the CPU */
    cfg_model cfg;
    cfg_generation gen;
    const arch_features *arch;
    st_set *weights;           /* the mapping every k_weight points into  */
    k_weight tok_emb;          /* [vocab, dim]                            */
    k_weight out_norm;         /* [dim]                                   */
    k_weight lm_head;          /* [vocab, dim]; tok_emb when tied         */
    layer_weights *layers;     /* [n_layers]                              */
    moe_expert *experts;       /* [expert layers * n_experts] the layers' experts point into; NULL if none */
    engine_tokenizer *tokenizer; /* NULL when the folder has none         */
    int32_t eos[MODEL_MAX_EOS];
    int n_eos;
    int n_threads;
    int plan_ctx;              /* CUDA: context the placement plans for (0: default, ENGINE_CTX_MAX) */
    engine_kv_type kv_type;    /* engine_model_params.kv_type: sessions' default (AUTO: the backend's) */
    int min_streamed;          /* CUDA: layers streamed at least          */
    int host_layers;           /* CUDA: -1 auto, 0 none, N at most N computed on the CPU */
    int moe_cpu;               /* CUDA: the first N expert layers' experts in host memory (engine_model_params) */
    int moe_host;              /* CUDA: who runs decode's host experts (engine_moe_host)                    */
    uint64_t expert_cache;     /* CUDA: device bytes for the expert cache (engine_model_params)             */
    double hbm_gbps, pcie_gbps; /* CUDA: bandwidths to plan with, GB/s; 0: measured (cuda/measure.c) */
    uint64_t n_params;
    uint64_t weight_bytes;     /* bytes of the weights as used (quantized size when quantized) */
    uint64_t owned_bytes;      /* of which the model allocated (quantized while loading) */
    int n_quantized;           /* matrices held in a quantized format     */
    struct q_weight *owned;    /* [n_owned] quantized while loading; NULL if none */
    int n_owned;
    const char *weight_dtype;
    engine_log_fn log;
    void *log_user;
    engine_trace *trace;       /* engine_model_params.trace: the load's and new sessions'; NULL: none */
    int trace_tid;             /* the load's track in it                  */
    err_buf err;
};

struct engine_session {
    engine_model *model;
    struct cuda_session *cuda; /* device buffers; NULL on the CPU        */
    int n_ctx;                 /* tokens the KV cache holds               */
    engine_kv_type kv_type;    /* the cache's element type (CUDA: resolved from AUTO at creation) */
    int n_batch;               /* most tokens evaluated in one pass       */
    int n_past;                /* tokens already in the cache             */
    int kv_ring;               /* rows of each sliding-window layer's cache, a ring (model_kv_ring); 0: none */
    int kv_end;                /* one past the last position written since the context was empty (a
                                  dropped CUDA step's included): what a ring may have overwritten */
    k_ctx kc;                  /* threads and scratch for the kernels     */
    void *block;               /* the one allocation everything below lives in */
    uint64_t block_bytes;
    uint64_t kv_bytes;         /* K and V, their scales included          */
    /* The CPU's caches, each layer's part a k_kv (kernels.h) of kv_type,
     * the layers' parts one after another (model_kv_row0): */
    void *k_cache;             /* [layers' rows, n_kv_heads, head_dim]     */
    void *v_cache;             /* [layers' rows, n_kv_heads, head_dim]     */
    float *k_scales;           /* INT8/FP8: [layers' rows, n_kv_heads]; else NULL */
    float *v_scales;           /* INT8/FP8: [layers' rows, n_kv_heads]; else NULL */
    float *k_new;              /* not F32, or a ring: [n_batch, n_kv_heads*head_dim] a pass's k before it is
                                  stored; else NULL */
    float *v_new;              /* likewise v                              */
    float *x;                  /* [n_batch, dim] residual stream          */
    float *xb;                 /* [n_batch, dim]                          */
    float *q;                  /* [n_batch, n_heads*head_dim]             */
    float *att;                /* [n_batch, n_heads*head_dim]             */
    float *hb;                 /* [n_batch, ffn_dim]                      */
    float *hb2;                /* [n_batch, ffn_dim]                      */
    float *logits;             /* [vocab]                                 */
    float *rope_cos;           /* [n_ctx, head_dim/2]                     */
    float *rope_sin;           /* [n_ctx, head_dim/2]                     */
    float *rope_cos_local;     /* [n_ctx, head_dim/2] sliding layers' own (cfg.rope_local_theta > 0); else NULL */
    float *rope_sin_local;
    bool rope_long;            /* longrope: the tables, and the cache's keys, use the long factors */
    int *pos;                  /* [n_batch]                               */
    /* Expert layers' scratch (cfg.n_experts > 0; else NULL), k = n_experts_used.
     * A pass's (token, choice) pairs are slots, grouped by expert so that
     * each expert reads its weights once for all its tokens: */
    float *moe_logits;         /* [n_batch, n_experts] router logits      */
    float *moe_w;              /* [n_batch * k] each slot's routing weight */
    int *moe_tok;              /* [n_batch * k] each slot's token         */
    int *moe_slot;             /* [n_batch * k] token t's choice j is slot moe_slot[t*k + j] */
    int *moe_first;            /* [2 * (n_experts + 1)] expert e's slots: [first[e], first[e+1]);
                                  then the next free slot of each while they are filled */
    float *moe_x;              /* [n_batch * k, dim] the slots' inputs, then outputs */
    float *moe_h;              /* [n_batch * k, moe_ffn_dim]              */
    float *moe_h2;             /* [n_batch * k, moe_ffn_dim]              */
    float *moe_gate;           /* [n_batch] the shared expert's gate      */
    uint32_t *expert_picks;    /* [n_layers, n_experts] how often the CPU's routing picked each expert
                                  (every expert layer on the CPU; on CUDA the hosted layers', the
                                  device counting the rest: engine_session_expert_picks) */
    int32_t *tokens;           /* [n_ctx] ids in the cache, in order      */
    bool have_logits;          /* logits hold the last evaluated token's  */
    bool device_logits;        /* CUDA: the device holds them (copied on demand) */
    engine_trace *trace;       /* where passes are recorded; NULL: nowhere (trace.h) */
    int trace_tid;             /* the session's track for its passes (and CPU layers) */
    double *trace_t;           /* CPU: [n_layers + 3] a pass's boundaries (embed, layers, head), microseconds */
    int trace_gpu_tid, trace_copy_tid; /* CUDA: tracks of the device's compute and copy engine */
    err_buf err;
};

/* Whether a block's output is normed or scaled before it joins the residual
 * stream (NORMS_POST, NORMS_SANDWICH, Granite's residual_multiplier). */
static inline bool model_block_out_scaled(const engine_model *m)
{
    return m->arch->norms != NORMS_PRE || m->cfg.residual_multiplier != 1.0;
}

/*
 * The KV cache's shape, which both backends and the planner share. Layer l
 * attends to the last model_layer_window(c, l) positions (0: all of them);
 * cfg.sliding_window is 0 for an architecture without windows (model.c).
 */
static inline int model_layer_window(const cfg_model *c, int l)
{
    if (c->sliding_window <= 0)
        return 0;
    const bool slides = l >= c->sliding_from_layer || (l < CFG_MAX_LAYERS && (c->sliding_layers[l / 64] >> (l % 64)) & 1);
    return slides ? c->sliding_window : 0;
}

/*
 * A window layer keeps only its last positions, in a ring of
 * window + n_batch + 1 rows (position p at row p % ring). A pass of n <=
 * n_batch tokens at pos0 stores its n rows before it reads back to
 * pos0 - window + 1: window + n - 1 rows. CUDA's greedy decode keeps up to two
 * steps queued; when it drops them (cuda_greedy_drop) their rows are
 * written, and the last token is evaluated again (refresh_logits) with the
 * rows of the next two positions in the ring: window + 2 rows. The +1
 * covers both at n_batch 1. Returns 0 (no ring: every layer holds n_ctx
 * rows, position p at row p) where no layer has a window or the ring would
 * not be smaller than n_ctx.
 */
static inline int model_kv_ring(const cfg_model *c, int n_ctx, int n_batch)
{
    bool any = false;
    for (int l = 0; l < c->n_layers && !any; l++)
        any = model_layer_window(c, l) > 0;
    if (!any)
        return 0;
    const int64_t r = (int64_t)c->sliding_window + n_batch + 1;
    return r < n_ctx ? (int)r : 0;
}

/* Rows of layer l's cache: the ring for a window layer (ring > 0), else n_ctx. */
static inline int model_kv_rows(const cfg_model *c, int l, int n_ctx, int ring)
{
    return ring > 0 && model_layer_window(c, l) > 0 ? ring : n_ctx;
}

/* Rows of the layers before l: the layers' caches lie one after another in
 * K (and in V, and in their scales); l = n_layers gives the total. */
static inline uint64_t model_kv_row0(const cfg_model *c, int l, int n_ctx, int ring)
{
    uint64_t r = 0;
    for (int i = 0; i < l; i++)
        r += (uint64_t)model_kv_rows(c, i, n_ctx, ring);
    return r;
}

/* Note that positions up to end - 1 have been written into the cache. */
static inline void session_wrote(engine_session *s, int end)
{
    if (end > s->kv_end)
        s->kv_end = end;
}

/*
 * Whether the context cut back to its first k tokens can go on: the next
 * pass at position k needs, in each window layer, the rows of positions
 * k - window + 1 .. k - 1, which the ring holds unless a position a ring's
 * length later has been written since (s->kv_end).
 */
bool session_kv_holds(const engine_session *s, int k);

/*
 * Buffers planned once: n bytes at the running offset *off, rounded up to
 * `align` (a power of two); with base NULL only the size is counted, so one
 * layout function both sizes an allocation and carves it.
 */
static inline void *carve(char *base, uint64_t *off, uint64_t n, uint64_t align)
{
    const uint64_t at = (*off + align - 1) & ~(align - 1);
    *off = at + n;
    return base ? base + at : NULL;
}

/*
 * Split what the user named (a .safetensors file, a folder, an index .json)
 * into the checkpoint's folder and its weights file; both PATH_MAX buffers.
 */
engine_status model_resolve_paths(const char *path, char *dir, char *weights, err_buf *e);

/* Seconds on a monotonic clock, for the timings the engine measures and reports. */
double model_seconds(void);

/* Log through the model's callback, if any. */
void model_log(const engine_model *m, engine_log_level level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/*
 * Bind the quantized tensor t (I8 or U8 plus its companion tensors, as
 * docs/FORMATS.md lays out) as the [rows, cols] matrix name.
 */
engine_status bind_quantized(engine_model *m, k_weight *w, const st_tensor *t, const char *name, int rows, int cols,
                             err_buf *e);
/* Whether name has a bitsandbytes quant_state companion (a 4-bit weight). */
bool has_bnb_state(const engine_model *m, const char *name);

/*
 * Settle the config against the architecture's row (arch.c): values it does
 * not use cleared (a window, multipliers, soft-capping, a local RoPE),
 * defaults it implies filled in (Gemma's query_pre_attn_scalar, caps and
 * window pattern; the score scale into attention_multiplier). file names
 * config.json in errors.
 */
engine_status model_apply_arch(engine_model *m, const char *file, err_buf *e);
/* Bind every weight the architecture needs; errors name the file and tensor.
 * With embed_scale it also sets cfg.embedding_multiplier, which needs the
 * table's dtype. */
engine_status model_bind_weights(engine_model *m, err_buf *e);

/*
 * Run n tokens (n <= s->n_batch) at positions s->n_past... and advance
 * n_past. With want_logits the last token's logits land in s->logits; with
 * rows != NULL every token's logits land in rows[n, vocab] (scoring).
 */
void forward_cpu(engine_session *s, const int32_t *ids, int n, bool want_logits, float *rows);
/* One layer of that pass over the n rows of s->x at positions pos0.. (s->pos set). */
void forward_cpu_layer(engine_session *s, int l, int n, int pos0);
/*
 * The halves of a layer around its attention, for n rows: xb = rmsnorm(x)
 * and q, k, v = W xb (+ biases when with_bias); then x += Wo att + bo and
 * x += the feed-forward of rmsnorm(x) (xb, hb, hb2: scratch of n rows).
 */
void cpu_layer_qkv(const engine_model *m, const k_ctx *kc, int l, int n, const float *x, float *xb, float *q,
                   float *k, float *v, bool with_bias);
void cpu_layer_out(const engine_model *m, const k_ctx *kc, int l, int n, float *x, const float *att, float *xb,
                   float *hb, float *hb2);
/* The MLP of an expert layer over the n rows of in[n, dim] into out[n, dim]
 * (forward_moe.c), with the session's moe_* scratch and hb, hb2 [n,
 * shared_ffn_dim] for a shared expert. in and out may be the same rows. */
void cpu_moe(const engine_session *s, int l, int n, const float *in, float *out);
/* One token's expert MLP of layer l without a session, x [dim] += its output
 * (norms and the residual multiplier applied as the pass applies them;
 * picks [n_experts], may be NULL: each chosen expert's count goes up);
 * the CUDA backend's hosted layers run it after cpu_layer_out, which leaves
 * an expert layer's MLP out. scratch: cpu_moe_token_floats() floats; kc's
 * scratch sized for model_ffn_max columns. */
size_t cpu_moe_token_floats(const cfg_model *c);
void cpu_moe_token(const engine_model *m, const k_ctx *kc, int l, float *x, float *scratch, uint32_t *picks);
/* The chosen experts ids[0..k) of one token that are not on the GPU (ids[j]
 * >= from) of layer l, from its MLP input x [dim] before the norm: choice
 * j's expert output, unweighted, into out[j * dim ...] (the rest of out
 * untouched); the CUDA backend's split expert layers. scratch as
 * cpu_moe_token's. */
void cpu_moe_host_experts(const engine_model *m, const k_ctx *kc, int l, const float *x, const int32_t *ids,
                          int from, float *out, float *scratch);
/* The threads hosted layers use: all but one, which waits for the GPU. */
static inline int model_host_threads(const engine_model *m)
{
    return m->n_threads > 1 ? m->n_threads - 1 : 1;
}
/* Bytes of layer l's matrices as the CPU reads them for one token: the
 * seven, or an expert layer's attention, router, shared expert and top-k
 * experts. */
uint64_t cpu_layer_bytes(const engine_model *m, int l);
/*
 * Bytes per second at which this host computes one token through the given
 * layers' matrices with n_threads (the best of two passes after a warm-up);
 * 0 when out of memory. Reads each layer three times.
 */
double cpu_layer_rate(const engine_model *m, const int *layers, int n_layers, int n_threads);
#define CPU_RATE_LAYERS 4 /* layers timed: more than a large last-level cache holds */

/*
 * engine_session_eval, plus: with argmax != NULL on a backend that can pick
 * the greedy token itself (CUDA), *argmax gets it and the logits are only
 * copied out when logits != NULL. On the CPU *argmax is -1.
 */
/*
 * Draw from candidates already filtered to within 50 nats of the best
 * (ids[n] and logits / temperature, any order), exactly as
 * engine_sampler_sample would from the full logits with no penalty.
 */
int32_t sampler_sample_candidates(engine_sampler *s, const int32_t *ids, const float *scaled, int n);
float sampler_temperature(const engine_sampler *s);

engine_status session_eval(engine_session *s, const int32_t *ids, size_t n, const float **logits, int32_t *argmax);

/* The format an engine_quant names (engine/quantize.c); false for NONE and unknown values. */
struct q_spec;
bool quant_spec_of(engine_quant q, struct q_spec *spec);

/* Fill the RoPE tables [n_ctx, rotary_dim/2] for the config's rope type
 * (longrope: its short factors, the attention factor folded in). */
void rope_tables(const cfg_model *c, int n_ctx, float *cos_t, float *sin_t);
/* Likewise for the sliding layers' own RoPE (local: cfg.rope_local_*), or
 * longrope's long factors (long_factors). */
void rope_tables_ex(const cfg_model *c, int n_ctx, bool local, bool long_factors, float *cos_t, float *sin_t);

#endif
