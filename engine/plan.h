/*
 * plan.h: the offload planner's internals (the public side is the
 * engine_plan_* section of engine.h). Pure arithmetic on a model's shapes
 * and formats: no CUDA call, so it builds and is tested everywhere.
 *
 * The device sizes here repeat the CUDA backend's layouts; each constant
 * names its source, and test_plan_cuda compares the planner's figures with
 * what a CUDA session actually allocates, so a change on either side that
 * is not mirrored fails there.
 */
#ifndef ENGINE_PLAN_H
#define ENGINE_PLAN_H

#include "model.h"

#define PLAN_ALIGN 256                        /* ALIGN of model_cuda.c and session_cuda.c       */
#define PLAN_WORKSPACE ((uint64_t)32 << 20)   /* the cuBLASLt workspace of a CUDA session       */
#define PLAN_CUDA_BATCH 512                   /* tokens per GPU pass (session.c)                */
#define PLAN_ARGMAX_SCRATCH 1028              /* launch_argmax_scratch(): 128 x 8 bytes, a count */
#define PLAN_CAND_MAX 4096                    /* sampling candidates copied to the host at most */
#define PLAN_STEP_INTS 8                      /* the decode step's device ints (cuda/state.h)   */
#define PLAN_Q4_COUNTS 256                    /* gemm_q4_work.count: a CTA each, 132 on an H100 */
#define PLAN_GRANULARITY ((uint64_t)2 << 20)  /* arena regions map in 2 MiB units (HARDWARE.md) */
#define PLAN_EXPERT_ENTRY 48                  /* sizeof(gemv_expert): an expert matrix's offsets */

/* Device bytes of a model's weights as the CUDA backend lays them out. */
typedef struct plan_weights {
    uint64_t emb;        /* tok_emb                                          */
    uint64_t head;       /* lm_head (0 when tied) and out_norm               */
    uint64_t *layer;     /* [n_layers] each layer's matrices, norms, biases  */
    uint64_t *layer_mats;/* [n_layers] of which its four matrices (what streams; the
                            norms and biases of a streamed layer stay resident)  */
    uint64_t *layer_experts; /* [n_layers] of which its routed experts, all of them
                            (0 in a dense layer): streamed whole, read k at a time;
                            n_experts strides of one expert (its gate/up and down,
                            each part aligned, to the next expert's start), so one
                            expert's bytes are layer_experts / n_experts exactly */
    uint64_t *layer_read;/* [n_layers] the bytes a token reads of it: all but the
                            experts it did not pick (n_experts_used of n_experts) */
    uint64_t total;      /* the weights region: every carve, padding included */
    uint64_t deq_elems;  /* the largest quantized matrix (prefill scratch)   */
    const char *format;  /* the layers' format label                         */
} plan_weights;

/*
 * Fill w for m with its dense matrices quantized as q would make them
 * (ENGINE_QUANT_NONE: as loaded); w->layer is malloc'd and holds
 * layer_mats, layer_experts and layer_read too (free(w->layer) frees
 * them all). Mirrors place() and
 * put_mat() of cuda/model_cuda.c: every part (the embeddings, the head,
 * a layer's matrices, a layer's norms and biases) is padded to PLAN_ALIGN,
 * so any subset of parts lays out to the sum of their sizes.
 */
engine_status plan_weights_of(const engine_model *m, engine_quant q, plan_weights *w, err_buf *e);

/* Decode's products pass the largest value of their output to the next
 * product (gemv_args.x_max): 4 slots a layer and one for the head. */
#define PLAN_IN_MAX_SLOTS(n_layers) (4 * (uint64_t)(n_layers) + 1)

/* Decode attention without clusters merges its splits (32 at most, the
 * streaming kernel's; the staged kernel takes 16) through
 * global memory: each split's accumulator and (max, sum) per head. */
#define PLAN_ATTN_PART_FLOATS(c) (32 * ((uint64_t)(c)->n_heads * (c)->head_dim + 2 * (uint64_t)(c)->n_heads))

/*
 * The activation region of a CUDA session: every buffer planned once, in
 * this order. One function both sizes it (base NULL) for the planner and
 * carves it for cuda/session_cuda.c, so the two cannot disagree. argmax_bytes
 * is launch_argmax_scratch() there, PLAN_ARGMAX_SCRATCH here. Returns the
 * bytes; out (may be NULL) gets the buffers.
 */
typedef struct plan_session_bufs {
    void *x;         /* [n_batch, dim] f32 residual stream      */
    void *act;       /* [n_batch, widest] wt                    */
    void *qkv;       /* [n_batch, (nh + 2*nkv) * hd] f32        */
    void *q;         /* [n_batch, nh * hd] f32                  */
    void *att;       /* [nh * hd] f32 (decode)                  */
    void *gu;        /* [n_batch, 2 * ffn] f32                  */
    void *logits;    /* [vocab] f32                             */
    void *rope_cos;  /* [n_ctx, hd / 2] f32                     */
    void *rope_sin;  /* [n_ctx, hd / 2] f32                     */
    void *rope_cos_local; /* [n_ctx, hd / 2] f32 sliding layers' own (cfg.rope_local_theta > 0); else NULL */
    void *rope_sin_local;
    void *argmax_scratch;
    void *deq;       /* [deq_elems] wt: a quantized matrix decoded for prefill */
    void *ids;       /* [n_batch] int32                         */
    void *cand_ids;  /* [PLAN_CAND_MAX] int32                   */
    void *cand_vals; /* [PLAN_CAND_MAX] f32                     */
    void *step;      /* [PLAN_STEP_INTS] int32                  */
    void *in_max;    /* [PLAN_IN_MAX_SLOTS] u32: decode products' input maxima */
    void *q4_count;  /* [PLAN_Q4_COUNTS] u32: the fused 4-bit product's counters */
    void *attn_part; /* [PLAN_ATTN_PART_FLOATS] f32: decode attention's partial results (portable merge) */
    void *attn_count;/* [n_kv_heads] u32: its counters                       */
    /* Expert layers (cfg.n_experts > 0; else NULL). E experts, k a token,
     * slots = n_batch * k (token, choice) pairs; a prompt's slots grouped by
     * expert take up to rows = slots + E * (pad - 1) rows (plan_moe_pad). */
    void *moe_logits;/* [n_batch, E + 1] f32: router logits, then the shared expert's gate */
    void *moe_ids;   /* [slots] int32: each choice's expert       */
    void *moe_w;     /* [slots] f32: its routing weight           */
    void *moe_slot;  /* [slots] int32: its row in the grouped buffers */
    void *moe_tok;   /* [rows] int32: each grouped row's token, -1 for padding */
    void *moe_first; /* [2E + 1] int32: each expert's first row, the rows used, each expert's count */
    void *moe_act;   /* [rows, dim] wt: the rows' inputs          */
    void *moe_gu;    /* [rows, 2 * moe_ffn] f32 (decode: [k, moe_ffn], the gated hidden states) */
    void *moe_h;     /* [rows, moe_ffn] wt                         */
    void *moe_out;   /* [rows, dim] f32: each row's expert output  */
    void *moe_sh;    /* [n_batch, dim] f32: the shared expert's output */
    void *moe_picks; /* [n_layers, E] uint32: how often each expert was picked (launch_moe_route) */
} plan_session_bufs;
/* Rows each expert's group of grouped rows starts at a multiple of, so
 * that every group's rows in the grouped buffers are 256-byte aligned, as
 * cuBLASLt wants its pointers: 1 for real shapes. */
int plan_moe_pad(const cfg_model *c, k_dtype wt);
uint64_t plan_session_layout(const cfg_model *c, k_dtype wt, int n_batch, int n_ctx, uint64_t deq_elems,
                             uint64_t argmax_bytes, char *base, plan_session_bufs *out);

/*
 * The KV cache and activation bytes a CUDA session of n_ctx tokens
 * allocates (the activation region without the workspace), as
 * cuda_session_create() does with its defaults: the KV type
 * plan_kv_default(wt) and PLAN_CUDA_BATCH tokens a pass.
 */
void plan_session_bytes(const cfg_model *c, k_dtype wt, int n_ctx, uint64_t deq_elems, uint64_t *kv,
                        uint64_t *act);

/*
 * The KV cache's layout, which the backends share: K and V each hold every
 * layer's rows, one layer after another, [rows, n_kv_heads, head_dim] in
 * type t (4, 2 or 1 bytes an element); INT8 and FP8 add an fp32 scale per
 * (row, kv head) for K and for V each, [rows, n_kv_heads] likewise. A
 * layer's rows are n_ctx, or for a sliding-window layer the ring
 * model_kv_ring(c, n_ctx, n_batch) where there is one (n_batch: the
 * session's tokens a pass). No padding between the parts, so the bytes
 * are exactly the rows times the bytes of a row. t must be resolved (not
 * AUTO).
 */
uint64_t plan_kv_token_bytes(const cfg_model *c, engine_kv_type t); /* one position in every layer, K and V */
uint64_t plan_kv_layer_bytes(const cfg_model *c, engine_kv_type t, int layer, int n_ctx, int n_batch);
uint64_t plan_kv_bytes(const cfg_model *c, engine_kv_type t, int n_ctx, int n_batch);

/* The type AUTO means where everything fits: fp16 (8x less rounding than
 * bf16 in the same bytes), fp32 for fp32 models (cuda_session_create). */
engine_kv_type plan_kv_default(k_dtype wt);

/* The context length engine_session_create chooses when given n_ctx 0. */
int plan_default_ctx(const cfg_model *c);

/* A requested context length resolved: 0 the default, ENGINE_CTX_MAX the model's maximum. */
int plan_resolve_ctx(const cfg_model *c, int n_ctx);

/* ------------------------------------------------------------ the plan */

#define PLAN_N_OPTIONS 5 /* the quantized formats but the one planned */

struct engine_plan {
    engine_plan_totals totals;
    engine_plan_entry *entries; /* [n_entries]: embeddings, layers, output head */
    size_t n_entries;
    engine_plan_option options[PLAN_N_OPTIONS];
    size_t n_options;
    char summary[ERR_MSG_MAX];
    /* AUTO's other candidate (kv AUTO when there was none), for the summary */
    engine_kv_type alt_kv;
    int alt_k;          /* its layers streamed                          */
    int alt_x_host;     /* its experts of resident layers in host memory */
    bool alt_fits, alt_emb_host, alt_head_streamed;
    double alt_full_tps; /* its decode bound at full context */
};

/* What the summary says of a placement plan.c weighed. */
typedef struct plan_placed {
    int k;              /* layers streamed                                   */
    int x_host;         /* routed experts of resident layers in host memory  */
    bool emb_host, head_streamed;
    uint64_t slots;     /* the two stream slots' bytes                       */
} plan_placed;

/*
 * p->summary from p's totals and options: the chosen placement, or when
 * refused, the least (the minimum's: its slots, and whether it keeps
 * experts in host memory rather than streaming every layer). f32_model:
 * the KV types to name in a refusal include f32. plan_summary.c.
 */
void plan_write_summary(engine_plan *p, const plan_placed *chosen, const plan_placed *least, bool f32_model);

/* "int8", "nf4", ... for a quantization; "none" for ENGINE_QUANT_NONE. Static storage. */
const char *plan_quant_name(engine_quant q);

/* The format label of w on the device once q applies ("bf16", "nf4-dq", ...;
 * dense matrices take wt, the embeddings' type). Static storage. */
const char *plan_format_label(const k_weight *w, engine_quant q, k_dtype wt);

#endif
