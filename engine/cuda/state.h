/*
 * state.h: the device-side state of a model and of a session, shared by
 * the CUDA backend's files (upload, session, forward pass).
 */
#ifndef ENGINE_CUDA_STATE_H
#define ENGINE_CUDA_STATE_H

#include <cuda_runtime_api.h>

#include "../../kernels/kernels_cuda.h"
#include "../plan.h"
#include "arena.h"
#include "backend.h"

/*
 * A matrix on the device: dense in the model's type, or quantized (the
 * layouts kernels.h gives for k_weight, with a 4-bit matrix's absmax
 * decoded to fp32 when it was nested).
 */
typedef struct cuda_mat {
    void *w;       /* [rows, cols] in t                                       */
    k_dtype t;
    float *scales; /* K_I8: [rows, ceil(cols / group)]; 4-bit: absmax [n / group] */
    float *code;   /* 4-bit: [16]                                             */
    int group;     /* K_I8: columns a scale; 4-bit: elements a block          */
    /* 4-bit with a nested absmax kept 8-bit (scales NULL; gemv_args has the formula): */
    uint8_t *am_q;  /* [n / group] codes                                      */
    float *am_s2;   /* [ceil(n / group >> am_shift)][2] scale, offset         */
    float *am_code; /* [256]                                                  */
    int am_shift;   /* log2(absmax values a nested scale)                     */
} cuda_mat;

/*
 * One layer on the device. q/k/v are stacked into one matrix and gate/up
 * into another, so decode reads each with one launch; norm weights and
 * biases are fp32.
 */
typedef struct cuda_layer {
    cuda_mat wqkv;    /* [(nh + 2*nkv) * hd, dim]: q rows, k rows, v rows    */
    cuda_mat wo;      /* [dim, nh*hd]                                        */
    cuda_mat w_gu;    /* [2*ffn, dim]: gate rows, then up rows               */
    cuda_mat w_down;  /* [dim, ffn]                                          */
    /* Every norm's weights as the norm multiplies by them: (1 + w) where the
     * architecture's norms scale by that (Gemma), w for the others. */
    float *attn_norm; /* [dim]; NULL with NORMS_POST (OLMo 2)                */
    float *ffn_norm;  /* [dim]; likewise                                     */
    float *attn_post_norm; /* [dim] on attention's output (OLMo 2, Gemma), or NULL */
    float *ffn_post_norm;  /* [dim] on the MLP's output, likewise            */
    float *q_norm;    /* [hd] (QK_HEAD), [nh*hd] (QK_WHOLE) or NULL          */
    float *k_norm;    /* [hd] (QK_HEAD), [nkv*hd] (QK_WHOLE) or NULL         */
    float *b_qkv;     /* [(nh + 2*nkv) * hd] or NULL                         */
    float *b_o;       /* [dim] or NULL                                       */
    float *b_gu;      /* [2*ffn] or NULL                                     */
    float *b_down;    /* [dim] or NULL                                       */
    /* An expert layer (moe; w_gu and w_down then empty). Its matrices lie
     * with the others (resident, or in a stream slot); the experts' are
     * found from ex_base by offsets, which do not depend on where the
     * layer is, so the tables are made once per model. */
    bool moe;
    cuda_mat router;  /* [E (+ 1: the shared expert's gate, Qwen2-MoE), dim] */
    cuda_mat ex_gu;   /* expert 0's [2*moe_ffn, dim] gate rows, then up rows: the format every expert shares */
    cuda_mat ex_down; /* expert 0's [dim, moe_ffn]                           */
    char *ex_base;    /* what the offsets count from: the weights region, or the layer's slot */
    const gemv_expert *ex_off;   /* host [2E]: expert e's gate/up at [2e], its down at [2e + 1] (model-owned) */
    const gemv_expert *ex_table; /* on the device (resident), a table a matrix: [E] gate/up, then [E]
                                    down, as the decode product indexes them by expert id */
    int ex_resident;  /* experts 0 .. ex_resident-1 are with the layer; a split layer's
                         others (stream_model.split) live in host memory: decode's
                         CPU computes them (host_experts), a prompt copies them to
                         ex_slot, where ex_off[2e..] counts from for e >= ex_resident */
    char *ex_slot;    /* set per pass kind by the streaming (stream.c's set_kind) */
    bool ex_host_gpu; /* its experts from ex_resident on are read by decode's products
                         from host memory over PCIe (ex_table points there), not
                         run by the CPU */
    cuda_mat sh_gu;   /* the shared expert's [2*shared_ffn, dim], or w NULL  */
    cuda_mat sh_down; /* [dim, shared_ffn]                                   */
} cuda_layer;

struct cuda_model {
    arena *arena;
    int device;
    int n_sms;
    cuda_caps caps;     /* what the device and this build run (launch_caps) */
    launch_ctx paths;   /* cc, smem_max and fast[]: the paths every session of the model takes */
    k_dtype wt;         /* the dense type: embeddings, activations, dense matrices */
    void *weights;      /* the one arena region all of the below live in   */
    uint64_t weight_bytes;
    void *tok_emb;      /* [vocab, dim] emb_t                              */
    k_dtype emb_t;      /* wt on the device; the file's type when read in place from host memory */
    cuda_mat lm_head;   /* [vocab, dim]; tok_emb when tied                 */
    uint64_t deq_elems; /* the largest quantized matrix (prefill decodes it) */
    float *out_norm;    /* [dim] (1 + w with Gemma's norms, as cuda_layer's) */
    cuda_layer *layers; /* [n_layers], host array of device pointers; a
                           streamed layer's matrices are NULL here (each
                           session points them into its slots)            */
    double upload_seconds;
    struct stream_model *sm; /* the streamed layers' sources; NULL when all resident */
    gemv_expert *ex_offs; /* [n_layers * 2 * n_experts] host: the expert layers' ex_off; NULL without experts */
    engine_plan *plan;  /* the placement (engine_model_plan)               */
    uint64_t reserve;   /* device bytes left out of the budget for the CUDA context */
    struct expert_slots *xc; /* the expert cache (expert_cache_cuda.c); NULL: none */
};

/*
 * Device ints a decode step reads and writes: its input token and position
 * (one copy in, or left there by the previous step's argmax), the argmax,
 * the sampling candidates' count, and the two-slot ring each decode step
 * writes its argmax to (slot pos & 1; one copy out).
 */
enum { STEP_TOKEN = 0, STEP_POS = 1, STEP_ARGMAX = 2, STEP_COUNT = 3, STEP_RING = 4, STEP_INTS = 8 };
_Static_assert(STEP_INTS == PLAN_STEP_INTS, "the planner sizes the step ints");
_Static_assert(sizeof(gemv_expert) == PLAN_EXPERT_ENTRY, "the planner sizes the experts' tables");
#define CAND_MAX PLAN_CAND_MAX /* sampling candidates copied to the host at most */

struct cuda_session {
    cuda_model *cm;
    launch_ctx lc;        /* stream, cuBLASLt handle, workspace          */
    cuda_layer *layers;   /* [n_layers] cm->layers, with the streamed ones in this session's slots */
    struct stream_session *ss; /* slots, copy stream, events; NULL when nothing streams */
    struct host_layers *host;  /* the CPU's side of hosted layers; NULL when none */
    void *kv;             /* arena region: k_cache and v_cache           */
    void *act_region;     /* arena region: everything below but the KV   */
                          /* (lc.workspace is a region of its own)       */
    k_kv_type kvt;        /* KV cache type (kernels.h's k_kv)            */
    void *k_cache;        /* [layers' rows, nkv*hd] kvt: each layer n_ctx rows, or a
                             window layer's ring (s->kv_ring; plan_kv_bytes) */
    void *v_cache;        /* likewise                                    */
    float *k_scale;       /* int8/fp8: [layers' rows, nkv]; else NULL    */
    float *v_scale;       /* likewise                                    */
    float *x;             /* [n_batch, dim] residual stream              */
    void *act;            /* [n_batch, max(dim, nh*hd, ffn)] wt: matrix-product inputs */
    float *qkv;           /* [n_batch, (nh + 2*nkv) * hd]                */
    float *q;             /* [n_batch, nh*hd]                            */
    float *att;           /* [nh*hd] decode attention output             */
    float *gu;            /* [n_batch, 2*ffn]                            */
    float *logits;        /* [vocab]                                     */
    float *rope_cos;      /* [n_ctx, rot/2] (rot: the rotary dims, hd but for Phi-3's partial rotary) */
    float *rope_sin;      /* [n_ctx, rot/2]                              */
    float *rope_cos_local;/* [n_ctx, rot/2] sliding layers' own (Gemma 3's rope_local_theta); else NULL */
    float *rope_sin_local;
    bool unfolded;        /* each block's output passes residual_add before it joins x (post norms,
                             Granite's residual_multiplier): the products write it to scratch */
    void *deq;            /* [cm->deq_elems] wt: a quantized matrix decoded for prefill */
    void *argmax_scratch; /* launch_argmax_scratch() bytes               */
    int32_t *ids;         /* [n_batch]                                   */
    int32_t *cand_ids;    /* [CAND_MAX] sampling candidates              */
    float *cand_vals;     /* [CAND_MAX]                                  */
    int32_t *h_cand_ids;  /* pinned host copies of the above             */
    float *h_cand_vals;
    int32_t *step;        /* [STEP_INTS]                                 */
    uint32_t *in_max;     /* [PLAN_IN_MAX_SLOTS]: zero at each decode step's start */
    gemm_q4_work q4_work; /* the fused 4-bit product's split tiles: deq's bytes and [PLAN_Q4_COUNTS] counters */
    /* Expert layers' buffers (plan_session_bufs says what each holds); NULL without experts. */
    float *moe_logits, *moe_w, *moe_gu, *moe_out, *moe_sh;
    int32_t *moe_ids, *moe_slot, *moe_tok, *moe_first;
    uint32_t *moe_picks;  /* [n_layers, E] device: each expert's picks (engine_session_expert_picks) */
    struct expert_cache_feed *xf; /* this session's feed of the model's expert cache; NULL: none */
    void *moe_act, *moe_h;
    int32_t *h_moe_first; /* pinned host [2E + 1]: a prompt's groups (launch_moe_group), read back once a layer */
    int moe_pad;          /* plan_moe_pad                                */
    float *attn_part;     /* [PLAN_ATTN_PART_FLOATS] decode attention's portable merge */
    unsigned *attn_count; /* [n_kv_heads] its counters, zero between launches */
    int32_t *h_ids;       /* pinned host [n_batch]                       */
    int32_t *h_step;      /* pinned host [STEP_INTS]                     */
    int32_t *ring;        /* h_step + STEP_RING as the device sees it: decode's argmax writes it */
    int n_splits;         /* decode attention splits (the staged kernel)  */
    int n_splits_long;    /* and the streaming kernel's, from stream_from positions on */
    int stream_from;      /* the decode position from which attention streams the cache (long_ctx) */
    bool long_ctx;        /* the step being launched or captured attends with the streaming kernel */
    /* One decode step of a host token, and one of the device's last argmax,
     * each [long_ctx]; NULL until first used. */
    cudaGraphExec_t graph[2], graph_fb[2];
    uint64_t kv_bytes, act_bytes;
    /* Pipelined greedy decode (cuda_greedy_*): evaluations queued, not yet taken. */
    int q_n;              /* 0..2                                        */
    int32_t q_first_in;   /* the oldest one's input token                */
    cudaEvent_t step_done[2]; /* recorded after the decode step at position p, in [p & 1] */
    /* A traced session's decode graphs stamp the device's clock (trace_stamps.c) into a pinned,
     * mapped ring of [2][stamp_per] and a slot for calibration, read when a step is done. */
    uint64_t *h_stamps, *d_stamps;
    int stamp_per;        /* slots a step: STAMP_COPY(L, copies of a decode pass)     */
    double stamp_offset_us; /* trace time (us) = globaltimer (ns) / 1000 + this  */
    bool graphs_stamped;  /* the decode graphs were captured with stamps       */
    bool stamping;        /* decode_launches is capturing a stamped graph       */
    bool stamp_pending[2];/* [p & 1]: the step at p ran a stamped graph, not yet read */
    bool logits_stale;    /* the device logits are a dropped evaluation's */
};

/*
 * Where a block's output needs a step of its own before it joins the
 * residual stream (model_block_out_scaled: a norm on it, OLMo 2's and
 * Gemma's, or Granite's residual_multiplier), the products cannot add it
 * to x themselves: they write it to the gate/up buffer (prefill: the
 * attention output and the down projection's; decode: the attention
 * output at its start, the down projection's after the ffn_dim values it
 * reads, which needs ffn_dim >= dim: model.c refuses the others on CUDA)
 * and launch_residual_add adds it (cuda_session.unfolded).
 */

/* Whether the model's sessions take op's fast path (kernels/cuda/paths.cu). */
static inline bool cuda_takes_fast(const cuda_model *cm, k_op op) { return cm->paths.fast[op]; }

/* engine_status for a failed launcher, naming the op (the message is in lc.err). */
engine_status cuda_launch_error(cuda_session *cs, err_buf *e);
/* Destroy the session's decode graphs (captured again when next used); the caller has waited for
 * the queued steps. */
void cuda_drop_graphs(cuda_session *cs);

#endif
