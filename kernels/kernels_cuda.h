/*
 * kernels_cuda.h: the CUDA operations of the forward pass, one launcher per
 * op (kernels/cuda/<op>.cu holds the kernel and its launcher). Each op
 * computes what its CPU counterpart in kernels.h computes; the GPU tests
 * check every launcher against those on random inputs.
 *
 * Conventions shared by every launcher:
 * - All pointers are device pointers unless a comment says otherwise.
 * - Matrices are row-major, one row per token. Weights [rows, cols] are in
 *   the model's type `wt` (K_F32, K_F16 or K_BF16); norm weights, biases and
 *   RoPE tables are fp32. Arithmetic accumulates in fp32.
 * - "act" buffers (inputs to cuBLASLt) are in the weight type; the residual
 *   stream and projection outputs are fp32.
 * - A launcher checks its arguments, sizes the grid, launches on c->stream,
 *   checks the launch error and returns 0; on failure it returns -1 and
 *   leaves a one-line message in c->err. It never synchronises, so every
 *   launcher can be captured into a CUDA graph.
 */
#ifndef ENGINE_KERNELS_CUDA_H
#define ENGINE_KERNELS_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The ops with a faster path than the portable one (which needs only
 * compute capability 7.5), each a row of the table in kernels/cuda/paths.cu
 * saying what each path is and what the fast one needs.
 */
typedef enum k_op {
    K_OP_PDL = 0,         /* decode kernels launched as programmatic dependents (9.0)               */
    K_OP_ATTN_CLUSTER,    /* decode attention merged in a cluster's shared memory (9.0)             */
    K_OP_ATTN_PREFILL_TC, /* prefill attention on tensor cores for 16-bit caches (8.0)              */
    K_OP_GEMM_Q4,         /* the fused 4-bit prefill product, launch_gemm_q4 (sm_90a: exactly 9.0)  */
    K_OP_BF16,            /* bf16 products; without them bf16 weights become fp16 at load (8.0)     */
    K_OP_ATTN_DECODE_TC,  /* long-context decode attention on tensor cores, fp16/int8 cache (8.0)  */
    K_OP_COUNT
} k_op;

typedef struct launch_ctx {
    cudaStream_t stream;
    int n_sms;              /* multiprocessors of the device              */
    void *lt;               /* cublasLtHandle_t, for launch_gemm          */
    void *workspace;        /* cuBLASLt workspace (device), from the arena */
    size_t workspace_bytes;
    int cc;                 /* the capability acted on (cuda_caps.cc)     */
    size_t smem_max;        /* shared memory a block may have at cc on this device */
    bool fast[K_OP_COUNT];  /* per op: the fast path (launch_paths), else the portable one */
    char err[256];          /* message of the last failure                */
} launch_ctx;

/*
 * What a device can run, as 10 * major + minor: its own capability, the
 * level of the code it runs from this build (the machine code for it, or
 * PTX compiled by the driver), ENGINE_CUDA_CC's cap (0: none), and the
 * least of the three, which the paths follow.
 */
typedef struct cuda_caps {
    int device_cc, code_cc, cap_cc, cc;
    size_t smem_optin;  /* the device's shared memory a block may opt in to */
    char name[64];
    const char *archs; /* the architectures this build has code for (static) */
} cuda_caps;
/* 0, or -1 with one line in err: below 7.5 (or capped there), no code for the device, a bad ENGINE_CUDA_CC. */
int launch_caps(int device, cuda_caps *caps, char *err, size_t err_size);
/* c->cc and c->fast[] from the table, for caps. */
void launch_paths(launch_ctx *c, const cuda_caps *caps);
/* The op's name, and the path c takes for it (static strings). */
const char *launch_path_op(k_op op);
const char *launch_path_name(const launch_ctx *c, k_op op);

/* Fills c->err (printf-style) and returns -1; for launchers. */
int launch_fail(launch_ctx *c, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* 0, or launch_fail with the pending launch error of `op`. */
int launch_check(launch_ctx *c, const char *op);

/* x[t, :] = row ids[t] of emb [vocab, dim] (wt) as fp32, times mult (the
 * architecture's embedding scale; 1 for most), for t < n. ids on the device. */
int launch_embed(launch_ctx *c, float *x, const void *emb, k_dtype wt, const int32_t *ids, int n, int dim,
                 float mult);

/* y[n, dim] (yt) = x[n, dim] / rms(x) * w[dim]; fp32 in, any type out. In place allowed when yt is K_F32.
 * w NULL: y = x in yt, not normed (OLMo 2's blocks read the residual stream as it is). A norm that scales
 * by (1 + w) (Gemma) has its weights uploaded as 1 + w, so every norm here multiplies by w. */
int launch_rmsnorm(launch_ctx *c, void *y, k_dtype yt, const float *x, const float *w, int n, int dim, float eps);

/*
 * A block's output y[n, dim] joins the residual stream x[n, dim]:
 * x += mult * rmsnorm(y) * w, or x += mult * y where w is NULL (OLMo 2's
 * and Gemma's norms on the blocks' outputs, Granite's
 * residual_multiplier). y may be overwritten.
 */
int launch_residual_add(launch_ctx *c, float *x, float *y, const float *w, int n, int dim, float eps, float mult);

/*
 * The device's clock (%globaltimer, ns) at a point of a traced decode step,
 * written once the kernel before has finished: to ring[(*pos - back) % 2 *
 * per_step + slot] (mapped host memory; the step's half, as the argmax
 * ring's), or with pos NULL to ring[slot] (the host's calibration).
 */
int launch_stamp(launch_ctx *c, uint64_t *ring, const int32_t *pos, int back, int slot, int per_step);

/*
 * The head's logits x[n] in place: x *= mult (Granite's 1 / logits_scaling),
 * then x = cap * tanh(x / cap) where cap > 0 (Gemma 2's final soft-capping).
 */
int launch_logits_scale(launch_ctx *c, float *x, long n, float mult, float cap);

/*
 * OLMo 2's q/k norms, over each token's whole projection rather than per
 * head: in qkv [n, (nh + 2*nkv) * hd] in place, the bias [(nh + 2*nkv) * hd]
 * (NULL: none) is added to every part, then the q part [nh*hd] is
 * RMS-normed and scaled by q_norm [nh*hd], the k part [nkv*hd] by
 * k_norm [nkv*hd]. What follows (rope_qkv, decode attention) then takes
 * no bias and no per-head norm.
 */
int launch_qk_norm_whole(launch_ctx *c, float *qkv, const float *bias, const float *q_norm, const float *k_norm,
                         int n, int n_heads, int n_kv_heads, int head_dim, float eps);

/* y[t, j] += b[j] for t < n, j < cols. */
int launch_bias_add(launch_ctx *c, float *y, const float *b, int n, int cols);
/* y[0..n) = x[0..n) by a kernel; either may be mapped pinned host memory (no copy engine involved). */
int launch_copy_f32(launch_ctx *c, float *y, const float *x, int n);

/*
 * Everything between the q/k/v projection and attention, for n tokens at
 * positions *pos0 + t (pos0 on the device, so a captured graph reads the
 * current position). qkv [n, (nh + 2*nkv) * hd] fp32 as the projection wrote
 * it (q heads, then k heads, then v heads); per token:
 *   1. bias [(nh + 2*nkv) * hd] added when not NULL;
 *   2. per-head RMSNorm of q and k with q_norm/k_norm [hd] when not NULL;
 *   3. RoPE, rotate-half, of the first rot = rotary_dim elements (0: all
 *      hd; pairs i, i + rot/2; the rest pass unrotated, Phi-3's partial
 *      rotary), from tables cos/sin [n_ctx, rot/2];
 *   4. q written to q_out [n, nh*hd] fp32; k and v written into the cache
 *      rows of positions *pos0 + t of k_cache/v_cache [rows, nkv*hd] (type
 *      kvt; int8 and fp8 rows with their scales in k_scale/v_scale
 *      [rows, nkv], as kernels.h's k_kv describes): row p, or p % ring
 *      where the layer's cache is a sliding window's ring (ring > 0).
 */
typedef struct rope_qkv_args {
    unsigned *out_max; /* decode attention: max |out| as float bits, atomically (zero before); or NULL */
    const float *qkv;
    const float *bias, *q_norm, *k_norm; /* each may be NULL */
    float eps;
    const float *cos, *sin;
    float *q_out;
    void *k_cache, *v_cache;
    float *k_scale, *v_scale; /* INT8/FP8 caches: [rows, nkv]; else unused */
    k_kv_type kvt;
    int ring;          /* the cache's rows when it is a ring (position p at row p % ring), 0: p at row p */
    const int *pos0;
    int n, n_heads, n_kv_heads, head_dim;
    int rotary_dim;    /* leading elements of a head RoPE rotates; 0: head_dim */
    /* Decode attention only (launch_rope_qkv ignores them): the score
     * scale, 0 for 1/sqrt(head_dim) (Granite's attention_multiplier,
     * Gemma's query_pre_attn_scalar^-1/2), and the soft cap of the scaled
     * scores, cap * tanh(s / cap) before the softmax, 0 for none (Gemma 2). */
    float score_scale, softcap;
    /* Decode attention's portable merge: partial results [n_kv_heads * 32 *
     * (G * hd + 2 * G)] (G = n_heads / n_kv_heads), and a counter per kv
     * head, zero before the first launch (each launch leaves them zero). */
    float *part;
    unsigned *count;
} rope_qkv_args;
int launch_rope_qkv(launch_ctx *c, const rope_qkv_args *a);

/*
 * Attention of one new token (decode), flash-decoding style, with the
 * rope_qkv step folded in: `r` is what launch_rope_qkv would take for n = 1
 * (q_out unused); the kernel ropes q itself and writes the new k and v into
 * the cache rows at *r->pos0 before using them. The KV length is split
 * among n_splits blocks (1 .. 16), each taking an equal share of whatever
 * length the position gives, and their results are merged into out
 * [nh*hd] fp32:
 * - c->fast[K_OP_ATTN_CLUSTER]: the splits of a kv head are one
 *   thread-block cluster (above 8 only where the device allows
 *   non-portable cluster sizes, else 8) and merge through distributed
 *   shared memory;
 * - otherwise each block writes its partial result to r->part and the
 *   last of a kv head's blocks to finish (r->count) merges them.
 * window > 0: only the last `window` positions (itself included). Launched
 * as a programmatic dependent of the kernel before it (the q/k/v product)
 * where c->fast[K_OP_PDL].
 */
int launch_attention_decode(launch_ctx *c, const rope_qkv_args *r, float *out, int window, int n_splits);
/*
 * The same for long contexts, on every GPU: each warp streams keys of its
 * own into registers with an online softmax of its own (on tensor cores
 * for fp16, int8 and fp8 caches at head_dim 64 and 128 where
 * c->fast[K_OP_ATTN_DECODE_TC]), and the n_splits blocks (1 .. 32) of a kv
 * head merge through r->part. Faster than the
 * staged kernel once the cache is long (from attention_decode_stream_from
 * positions on), slower for short ones. Serves 16- and 8-bit
 * caches, head_dim 64, 128 or 256 and groups of 1, 2, 4 or 8 q heads, and
 * on tensor cores any group of 1 to 8 at head_dim 64 or 128 without a soft
 * cap; other shapes go to launch_attention_decode with at most 16 splits.
 */
int launch_attention_decode_stream(launch_ctx *c, const rope_qkv_args *r, float *out, int window, int n_splits);
/* The n_splits that suits launch_attention_decode_stream on c's device for this shape (1 .. 32). */
int attention_decode_stream_splits(const launch_ctx *c, k_kv_type kvt, int n_heads, int n_kv_heads, int head_dim);
/* The decode position from which launch_attention_decode_stream is the faster kernel for this shape on c's device. */
int attention_decode_stream_from(const launch_ctx *c, k_kv_type kvt, int n_heads, int n_kv_heads, int head_dim);

/*
 * Causal attention of n new tokens at positions pos0 .. pos0+n-1 (host value)
 * against the cache, which already holds positions 0 .. pos0+n-1. Tiled over
 * keys with an online softmax: the n x (pos0+n) score matrix never exists in
 * memory. q [n, nh*hd] fp32; out [n, nh*hd] (ot). window as above. ring > 0:
 * the cache is a ring of that many rows (position p at row p % ring,
 * rope_qkv_args.ring) holding at least positions pos0 - window + 1 ..
 * pos0+n-1 (ring >= window + n - 1), which needs a window.
 */
int launch_attention_prefill(launch_ctx *c, void *out, k_dtype ot, const float *q, const void *k_cache,
                             const void *v_cache, const float *k_scale, const float *v_scale, k_kv_type kvt, int n,
                             int pos0, int n_heads, int n_kv_heads, int head_dim, int window, int ring);
/* The same with the score scale (0: 1/sqrt(head_dim)) and soft cap (0: none) of rope_qkv_args. */
int launch_attention_prefill_ex(launch_ctx *c, void *out, k_dtype ot, const float *q, const void *k_cache,
                                const void *v_cache, const float *k_scale, const float *v_scale, k_kv_type kvt, int n,
                                int pos0, int n_heads, int n_kv_heads, int head_dim, int window, int ring,
                                float score_scale, float softcap);

/* h[n, ffn] (ht) = silu(gu[t, j]) * gu[t, ffn + j]; gu [n, 2*ffn] fp32 (gate then up per row). */
int launch_swiglu(launch_ctx *c, void *h, k_dtype ht, const float *gu, int n, int ffn);
/* The same with tanh-approximated GELU in place of SiLU (GeGLU, Gemma). */
int launch_geglu(launch_ctx *c, void *h, k_dtype ht, const float *gu, int n, int ffn);

/*
 * *out = index of the largest of x[n] (the lowest index among equals);
 * scratch of launch_argmax_scratch() bytes, zeroed once before the first
 * launch (each launch leaves it so). With feed (may be NULL), also
 * ring[*pos & 1] = *token = that index, then ++*pos: the next decode step's
 * input, written on the device (ring may be mapped host memory). Where
 * feed->x is set, x[dim] also gets that token's row of emb (emb_t) times
 * emb_mult (> 0, as launch_embed's mult), and
 * zero[n_zero] is cleared: what a decode step does first. Launched as a
 * programmatic dependent of the kernel before it.
 */
typedef struct argmax_feed {
    int32_t *token; /* [1] */
    int32_t *pos;   /* [1] */
    int32_t *ring;  /* [2] */
    float *x;       /* [dim], or NULL */
    const void *emb;
    k_dtype emb_t;
    float emb_mult; /* > 0 where x is set */
    int dim;
    uint32_t *zero; /* [n_zero] */
    int n_zero;
} argmax_feed;
size_t launch_argmax_scratch(void);
int launch_argmax(launch_ctx *c, int32_t *out, const float *x, int n, void *scratch, const argmax_feed *feed);

/*
 * The sampling candidates of x[n]: every i with x[i] / temperature >=
 * max(x) / temperature - 50, written (in no particular order) as ids and
 * x[i] / temperature, at most cap of them; *count gets how many there were
 * (more than cap means the list is incomplete).
 */
int launch_sample_candidates(launch_ctx *c, const float *x, int n, float temperature, int cap, int32_t *count,
                             int32_t *ids, float *vals);

/*
 * Per row of x[rows, cols] (logits): out[2r] = log(sum_i exp(x[r, i])) and
 * out[2r + 1] = x[r, targets[r]] (NaN where targets is NULL or the id is
 * outside [0, cols)). Scoring a text reads these instead of the rows.
 */
int launch_row_lse(launch_ctx *c, const float *x, int rows, int cols, const int32_t *targets, float *out);

/*
 * Matrix-vector product for one token (decode), bound by reading W once:
 *   y[rows] (= or +=) W[rows, cols] . in(x) (+ bias)
 * where in(x) is prepared once per block in shared memory from
 *   GEMV_IN_F32:     x [cols] fp32
 *   GEMV_IN_RMSNORM: x [cols] fp32, RMS-normalised and scaled by norm[cols]
 * and with glu_out the gate and up rows are paired into silu(gate) * up,
 * so that neither a norm nor the gate costs a launch of its own.
 */
typedef enum gemv_input { GEMV_IN_F32 = 0, GEMV_IN_RMSNORM = 1 } gemv_input;
typedef struct gemv_args {
    float *y;
    bool accumulate;     /* y += ... (residual) instead of y = ...  */
    const void *w;       /* [rows, cols] in wt (layouts of the quantized types: kernels.h) */
    k_dtype wt;          /* any type, the quantized ones included   */
    /* Quantized wt only: K_I8 scales [rows, ceil(cols / group)] with
     * group columns a scale; K_NF4/K_FP4 absmax [rows * cols / group]
     * (decoded fp32, group = the block size) and code [16]. */
    const float *scales;
    const float *code;
    int group;
    /* A nested (double-quantized) 4-bit absmax, kept 8-bit on the device
     * (scales NULL): absmax(b) = am_code[am_q[b]] * am_s2[2 * (b >> am_shift)]
     * + am_s2[2 * (b >> am_shift) + 1], the product rounded, then the sum
     * (kernels.h's nested absmax, with each 2^am_shift blocks' scale and
     * offset side by side). NULL am_q: not nested. */
    const uint8_t *am_q;  /* [rows * cols / group]                        */
    const float *am_s2;   /* [ceil(blocks >> am_shift)][2]: scale, offset */
    const float *am_code; /* [256]                                        */
    int am_shift;
    int rows, cols;
    const float *bias;   /* [rows] or NULL                          */
    gemv_input in;
    const float *x;
    const float *norm;   /* [cols], GEMV_IN_RMSNORM                 */
    float eps;
    bool glu_out;        /* rows = 2*h (gate rows, then up rows): y[h] = silu(gate + b) * (up + b) */
    bool gelu;           /* with glu_out: tanh GELU in place of SiLU (GeGLU, Gemma) */
    /* Decode's chain of products: the kernel that wrote x may leave
     * max |x * norm| (|x| without RMSNorm) as float bits in *x_max, which
     * spares this kernel a pass over x and a block reduction; NULL: found
     * here. y_max (zero before the launch) receives the same for this
     * product's output, times y_max_norm [out rows] when the next product
     * normalises it (NULL: times 1). */
    const unsigned *x_max;
    unsigned *y_max;
    const float *y_max_norm;
    /* Experts (a mixture-of-experts layer's decode): with `experts` set,
     * the launch has n_choices rows of blocks, and row j multiplies the
     * matrix of expert expert_ids[j] (device ints, written by the kernel
     * before, e.g. launch_moe_route) by x + j * x_stride into y + j *
     * y_stride. Each expert's arrays lie at expert_base plus its entry's
     * byte offsets (experts[E], device), so the table stays valid wherever
     * the layer's matrices are (resident, or a stream slot: only the base
     * changes). Every expert has the format of the matrix given above
     * (w, wt, scales, ...: e.g. expert 0's), whose non-NULL arrays say which
     * offsets are read. y_max must be NULL; x_max may be set only where
     * every row reads the same input (x_stride 0). */
    const struct gemv_expert *experts;
    const char *expert_base;
    const int32_t *expert_ids;
    int n_choices;
    int x_stride, y_stride;
} gemv_args;
/* Where one expert's matrix lies: byte offsets from gemv_args.expert_base of
 * what gemv_args names (w, scales, code, am_q, am_s2, am_code); an array the
 * format lacks is 0 and unread. w == GEMV_EXPERT_ABSENT: the expert is not
 * on the device (a split layer's, computed by the host); its choice is
 * skipped, its output rows left as they are. */
typedef struct gemv_expert {
    uint64_t w, scales, code, am_q, am_s2, am_code;
} gemv_expert;
#define GEMV_EXPERT_ABSENT UINT64_MAX
/* Whether a's nested absmax fields are all there (am_shift in range). */
static inline bool gemv_nested_ok(const gemv_args *a)
{
    return a->am_q && a->am_s2 && a->am_code && a->am_shift >= 0 && a->am_shift < 31;
}
int launch_gemv(launch_ctx *c, const gemv_args *a);

/*
 * Mixture-of-experts routing, as forward_moe.c's route(): per token t < n,
 * the softmax over logits[t * ld + e] (e < E <= MOE_MAX_EXPERTS; the sum in
 * double), its top k (<= MOE_MAX_TOPK; highest first, the lower index on a
 * tie) into ids[t * k + j] and their probabilities, renormalised to sum 1
 * where renorm, into w[t * k + j]. A NaN logit counts as -inf, so the ids
 * are always k distinct experts. picks (device [E], may be NULL): each
 * chosen expert's count goes up by one (atomically: the order is free).
 */
#define MOE_MAX_EXPERTS 1024
#define MOE_MAX_TOPK 16
int launch_moe_route(launch_ctx *c, const float *logits, int ld, int n, int E, int k, bool renorm, int32_t *ids,
                     float *w, uint32_t *picks);

/*
 * The n * k (token, choice) slots of ids[n * k] grouped by expert, for the
 * prefill products: expert e's slots are rows [first[e], first[e] +
 * count) of the grouped buffers, in token order, each group starting at a
 * multiple of pad rows (a power of two, so that every group's rows are
 * 256-byte aligned for cuBLASLt); first[E] is the rows used in all, and
 * first[E + 1 + e] expert e's count (first: 2E + 1 ints). slot_of[t * k + j] gets the row of token t's choice j, tok_of[r] the
 * token of row r (-1 for padding), for r < cap (>= n * k + E * (pad - 1)).
 * One block; deterministic.
 */
int launch_moe_group(launch_ctx *c, const int32_t *ids, int n, int k, int E, int pad, int cap, int32_t *first,
                     int32_t *slot_of, int32_t *tok_of);

/* out[r, :] = in[tok_of[r], :] (zeros where tok_of[r] < 0) for r < rows; rows of dim elements in type t. */
int launch_moe_gather(launch_ctx *c, void *out, const void *in, k_dtype t, const int32_t *tok_of, int rows, int dim);

/*
 * Each token's experts summed into the residual stream, in the order it
 * chose them (forward_moe.c's last loop): for t < n,
 *   o = sigmoid(gate[t * gate_ld]) * sh[t, :]   (0 where sh is NULL)
 *   o += w[t * k + j] * ys[slot_of[t * k + j], :]   for j = 0 .. k-1
 * (slot_of NULL: row t * k + j), then x[t, :] += o, or dst[t, :] = o where
 * dst is not NULL (it may be sh). Rows of dim floats.
 */
int launch_moe_combine(launch_ctx *c, float *x, float *dst, const float *ys, const int32_t *slot_of, const float *w,
                       int n, int k, int dim, const float *sh, const float *gate, int gate_ld);

/*
 * A split expert layer's decode (some of its experts on the host): x [dim]
 * and ids [k] into mapped pinned hx and hids; then, after the host has
 * written choice j's output to hys[j * dim ...] for every j with ids[j] >=
 * from, those rows into ys (the others are the device's products).
 */
int launch_moe_to_host(launch_ctx *c, float *hx, int32_t *hids, const float *x, const int32_t *ids, int k, int dim);
int launch_moe_from_host(launch_ctx *c, float *ys, const float *hys, const int32_t *ids, int k, int from, int dim);

/*
 * out[rows, cols] (ot: f16, bf16 or f32) = the quantized matrix of `a`
 * (w, wt, rows, cols, scales, code, group; the rest unused) decoded, for
 * the prefill products, which then run through cuBLASLt.
 */
int launch_dequant(launch_ctx *c, void *out, k_dtype ot, const gemv_args *a);

/*
 * The prefill product of a 4-bit matrix without decoding it into memory:
 * y[n, rows] (+)= x[n, cols] . W^T for the K_NF4/K_FP4 matrix of `w` (w,
 * wt, rows, cols, scales, code, group), x in xt (K_BF16 or K_F16), fp32
 * accumulation; each weight reaches the tensor cores as
 * round(round(code) * round(absmax)) in xt, within a rounding step of what
 * launch_dequant writes. nsub: 128-token sub-tiles a CTA (1 or 2).
 * Needs compute capability 9.0 (gemm_q4_supported), rows a multiple of
 * 128, cols of 256, the group a power-of-two multiple of 64.
 *
 * Where whole tiles would leave multiprocessors idle, one CTA a
 * multiprocessor shares the work out evenly by splitting tiles along K, if
 * `work` has room (gemm_q4_work_bytes; NULL or too small: whole tiles, one
 * a CTA). The result is the same bits run to run.
 * gemm_q4_tiles: the nsub to use for n tokens, or 0 where launch_dequant +
 * launch_gemm should be faster or the shape does not fit.
 */
typedef struct gemm_q4_work {
    void *part;        /* device, partial sums of split tiles; any contents, any use between products */
    size_t part_bytes;
    uint32_t *count;   /* [n_count] device, zero before the first product; each product leaves it zero */
    int n_count;
    bool always_split; /* split wherever there is room, not only where the model expects a gain (tests) */
} gemm_q4_work;
bool gemm_q4_supported(void);
size_t gemm_q4_work_bytes(const launch_ctx *c, int nsub); /* part_bytes for splitting on every multiprocessor */
int gemm_q4_tiles(const launch_ctx *c, const gemv_args *w, k_dtype xt, int n, const gemm_q4_work *work);
int launch_gemm_q4(launch_ctx *c, float *y, bool accumulate, const void *x, k_dtype xt, const gemv_args *w, int n,
                   int nsub, const gemm_q4_work *work);

/*
 * Matrix product through cuBLASLt (prefill): y[n, rows] (= or +=) x[n, cols] . W[rows, cols]^T,
 * x and W in wt, y fp32, fp32 accumulation (no TF32 for fp32 weights).
 * Every pointer 256-byte aligned. Needs c->lt from launch_gemm_create and
 * c->workspace; the algorithm chosen for a shape is kept for the next call.
 */
int launch_gemm_create(launch_ctx *c);  /* sets c->lt */
void launch_gemm_destroy(launch_ctx *c); /* frees c->lt; NULL-safe */
int launch_gemm(launch_ctx *c, float *y, bool accumulate, const void *x, const void *w, k_dtype wt, int n,
                int rows, int cols);

#ifdef __cplusplus
}
#endif

#endif
