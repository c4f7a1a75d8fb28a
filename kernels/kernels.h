/*
 * kernels.h: the compute operations of the forward pass, one C function per
 * op. CPU implementations live in kernels/cpu/ (OpenMP); each op's contract
 * (shapes, layouts, precision) is stated here once, and every other backend
 * is tested against these.
 *
 * Activations are fp32, row-major, one row per token. Weights are row-major
 * [rows, cols] in their stored type, read straight from the file mapping and
 * converted in registers; arithmetic accumulates in fp32.
 */
#ifndef ENGINE_KERNELS_H
#define ENGINE_KERNELS_H

#include <stddef.h>
#include <stdint.h>

typedef enum k_dtype { K_F32 = 0, K_F16 = 1, K_BF16 = 2 } k_dtype;

/* A weight matrix or vector as stored. A vector is rows = 1. */
typedef struct k_weight {
    const void *data; /* [rows, cols] in dtype, row-major */
    k_dtype dtype;
    int rows;
    int cols;
} k_weight;

/* Per-call execution settings, owned by the caller (no global state). */
typedef struct k_ctx {
    int n_threads;    /* OpenMP threads for this call; >= 1 */
    float *scratch;   /* n_threads * k_matmul_scratch_floats(max cols), or NULL */
    size_t scratch_per_thread; /* floats of scratch each thread may use */
} k_ctx;

/*
 * Below this many multiply-adds an op runs on one thread: a parallel region
 * costs microseconds, more than small work takes (and far more when the
 * cores are shared with other processes).
 */
#define K_PARALLEL_MIN_WORK (1 << 16)

/* Scratch floats per thread that k_matmul needs to convert weights once per batch. */
size_t k_matmul_scratch_floats(int max_cols);

size_t k_dtype_size(k_dtype t);

/* Element i of a weight (any dtype) as fp32. */
float k_weight_get(const k_weight *w, size_t i);

/* y[n, w.rows] = x[n, w.cols] . w^T (+ bias[w.rows] when bias->data != NULL). */
void k_matmul(const k_ctx *c, float *y, const float *x, int n, const k_weight *w, const k_weight *bias);

/* y[n, dim] = x / rms(x) * weight; in place allowed (y == x). */
void k_rmsnorm(const k_ctx *c, float *y, const float *x, int n, int dim, const k_weight *weight, float eps);

/*
 * Rotary embedding, rotate-half layout (pairs i and i + head_dim/2, as
 * transformers' Llama does) on x[n, n_heads, head_dim] in place. Row t uses
 * cos/sin rows pos[t] of tables [*, head_dim/2].
 */
void k_rope(const k_ctx *c, float *x, int n, int n_heads, int head_dim, const int *pos,
            const float *cos_table, const float *sin_table);

/*
 * Causal attention of n new tokens at positions pos0 .. pos0+n-1 against the
 * cache. q[n, n_heads, head_dim]; k_cache/v_cache [n_ctx, n_kv_heads, head_dim]
 * already hold positions 0 .. pos0+n-1; out[n, n_heads, head_dim]. window > 0
 * limits each token to the last `window` positions (itself included).
 * Needs c->scratch_per_thread >= pos0 + n.
 */
void k_attention(const k_ctx *c, float *out, const float *q, const float *k_cache, const float *v_cache,
                 int n, int pos0, int n_heads, int n_kv_heads, int head_dim, int window);

/* gate[i] = silu(gate[i]) * up[i] for i < n. */
void k_swiglu(const k_ctx *c, float *gate, const float *up, size_t n);

/* y[i] += x[i] for i < n. */
void k_add(const k_ctx *c, float *y, const float *x, size_t n);

/* y[t, :] = row ids[t] of emb (any dtype) as fp32, for t < n. */
void k_embed(const k_ctx *c, float *y, const k_weight *emb, const int32_t *ids, int n);

#endif
