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

/*
 * Weight types. K_F32/K_F16/K_BF16 are dense; the rest are quantized
 * (docs/FORMATS.md is the full specification). Values are append-only.
 */
typedef enum k_dtype {
    K_F32 = 0,
    K_F16 = 1,
    K_BF16 = 2,
    K_I8 = 3,  /* int8 weight-only, symmetric, fp32 scale per group of columns */
    K_NF4 = 4, /* bitsandbytes NF4: 4-bit codes, fp32 absmax per block        */
    K_FP4 = 5  /* bitsandbytes FP4: same layout as NF4, another code table    */
} k_dtype;

#define K_QBLOCK_MAX 4096 /* largest NF4/FP4 block (bitsandbytes allows 64..4096) */

/*
 * A weight matrix or vector as stored. A vector is rows = 1. Every pointer
 * is a view (into the file mapping or memory the model owns); none is freed
 * through this struct. The first four fields are all a dense weight uses;
 * the rest are zero/NULL for dense weights.
 *
 * K_I8 (n = rows * cols):
 *   data    int8_t [rows, cols] row-major, value q in [-127, 127]
 *   scales  float  [rows, n_groups], n_groups = ceil(cols / group)
 *   group   columns per scale: cols (one scale per row) or 128
 *   weight(r, c) = (float)q[r, c] * scales[r, c / group]
 *
 * K_NF4 / K_FP4 (bitsandbytes 4-bit; the matrix is flattened row-major,
 * element i = r * cols + c, and cut into blocks of `block` consecutive
 * elements regardless of row boundaries):
 *   data    uint8_t [ceil(n / 2)]: element 2j in the HIGH nibble of byte j,
 *           element 2j+1 in the LOW nibble
 *   code    float [16]: the code table (bitsandbytes' quant_map); nibble v
 *           means code[v]
 *   block   elements per block (64 for NF4 as transformers saves it)
 *   not nested (absmax_q == NULL):
 *     absmax  float [n_blocks], n_blocks = ceil(n / block)
 *     weight(i) = code[nibble(i)] * absmax[i / block]
 *   nested (bitsandbytes compress_statistics / double quantization):
 *     absmax_q      uint8_t [n_blocks]: 8-bit codes of the block absmax
 *     absmax_code   float [256]: their code table (bitsandbytes' dynamic map)
 *     absmax_scale  float [ceil(n_blocks / absmax_block)]
 *     absmax_block  blocks per absmax_scale (256)
 *     absmax_offset float added back after decoding
 *     absmax(b) = absmax_code[absmax_q[b]] * absmax_scale[b / absmax_block] + absmax_offset
 *     (two roundings: the product is rounded to fp32, then the sum)
 *     weight(i) = code[nibble(i)] * absmax(i / block)
 */
typedef struct k_weight {
    const void *data; /* see above; [rows, cols] in dtype for dense types */
    k_dtype dtype;
    int rows;
    int cols;
    const float *scales;       /* K_I8: [rows, ceil(cols / group)]         */
    int group;                 /* K_I8: columns per scale                  */
    const float *code;         /* K_NF4/K_FP4: [16]                        */
    int block;                 /* K_NF4/K_FP4: elements per absmax block   */
    const float *absmax;       /* K_NF4/K_FP4, not nested: [n_blocks]      */
    const uint8_t *absmax_q;   /* nested: [n_blocks]                       */
    const float *absmax_code;  /* nested: [256]                            */
    const float *absmax_scale; /* nested: [ceil(n_blocks / absmax_block)]  */
    int absmax_block;          /* nested: 256                              */
    float absmax_offset;       /* nested                                   */
} k_weight;

/* True for K_I8, K_NF4, K_FP4. */
static inline int k_dtype_is_quant(k_dtype t)
{
    return t == K_I8 || t == K_NF4 || t == K_FP4;
}

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

/* Bytes per element: 4, 2, 2, 1 for F32, F16, BF16, I8; 0 for the packed 4-bit types. */
size_t k_dtype_size(k_dtype t);

/* Element i (row-major) of a weight of any dtype as fp32. Slow for the
 * quantized types (decodes one scale per call): for tests and small tensors. */
float k_weight_get(const k_weight *w, size_t i);

/* Bytes of w's data, scales and absmax arrays together (what reading it costs). */
size_t k_weight_bytes(const k_weight *w);

/*
 * Columns [c0, c0 + n) of row r of w, any dtype, decoded to fp32 into out[n].
 * The CPU reference of every format's decoding.
 */
void k_dequant_row(const k_weight *w, int r, int c0, int n, float *out);

/*
 * y[r - r0] = row r of w . x for r in [r0, r1), one token, on the calling
 * thread alone: the piece of a product that a caller's own parallel region
 * hands each thread (forward_moe.c's host experts). 4-bit rows whose blocks
 * do not straddle rows are decoded in registers and dotted in one pass.
 */
void k_matvec_rows(const k_weight *w, int r0, int r1, const float *x, float *y);

/* The widest x86 vector set the CPU kernels may use where the CPU has it:
 * 2 AVX-512 (default), 1 AVX2, 0 the portable loops; for tests, which run
 * each path on a machine that has the wider ones. */
void k_cpu_isa_cap(int cap);

/*
 * y[n, w.rows] = x[n, w.cols] . w^T (+ bias[w.rows] when bias->data != NULL).
 * Quantized weights are decoded in registers/stack chunks and reused for
 * every token of the batch; accumulation is fp32.
 */
void k_matmul(const k_ctx *c, float *y, const float *x, int n, const k_weight *w, const k_weight *bias);

/* y[n, dim] = x / rms(x) * weight; in place allowed (y == x). */
void k_rmsnorm(const k_ctx *c, float *y, const float *x, int n, int dim, const k_weight *weight, float eps);
/* y = x / rms(x) * (offset + weight): offset 1 is Gemma's norm, whose
 * stored weights are the scales' offsets from 1. */
void k_rmsnorm_ex(const k_ctx *c, float *y, const float *x, int n, int dim, const k_weight *weight, float eps,
                  float offset);

/*
 * Rotary embedding, rotate-half layout (pairs i and i + head_dim/2, as
 * transformers' Llama does) on x[n, n_heads, head_dim] in place. Row t uses
 * cos/sin rows pos[t] of tables [*, head_dim/2].
 */
void k_rope(const k_ctx *c, float *x, int n, int n_heads, int head_dim, const int *pos,
            const float *cos_table, const float *sin_table);
/* k_rope on the first rot_dim elements of each head only (pairs i and
 * i + rot_dim/2; partial_rotary_factor, Phi-3/4), tables [*, rot_dim/2];
 * the rest pass unchanged. */
void k_rope_ex(const k_ctx *c, float *x, int n, int n_heads, int head_dim, int rot_dim, const int *pos,
               const float *cos_table, const float *sin_table);

/*
 * KV cache element types. The values are engine_kv_type's (include/engine.h)
 * for the concrete types, so the engine passes its setting straight through.
 */
typedef enum k_kv_type {
    K_KV_F32 = 1,
    K_KV_F16 = 2,
    K_KV_BF16 = 3,
    K_KV_INT8 = 4, /* symmetric int8 codes, one fp32 scale per (position, kv head) */
    K_KV_FP8 = 5   /* e4m3fn codes (finite, max 448), one fp32 scale per (position, kv head) */
} k_kv_type;

/*
 * One K or V cache of one layer (or the whole cache, as the engine lays it
 * out per layer), as views; nothing here is freed through it.
 *   data    [rows, n_kv_heads, head_dim] elements of `type`: f32, f16 and
 *           bf16 as IEEE/brain floats, INT8 as int8_t codes, FP8 as e4m3fn
 *           bytes (sign, 4 exponent bits of bias 7, 3 mantissa bits;
 *           0x7f/0xff are NaN and never written)
 *   scales  INT8/FP8: float [rows, n_kv_heads]; NULL for the float types
 *   ring    0: position p at row p (rows = the context); > 0: a sliding
 *           window layer's ring of `ring` rows, position p at row p % ring
 *           (the row of p - ring is overwritten when p is stored)
 *   value(p, h, i) = decode(data[r, h, i]) * scales[r, h], r = p's row
 * A row (one position's one head) is quantized as a whole when it is written
 * (k_kv_store): amax = max |x| over the row's head_dim values;
 *   INT8: scale = amax / 127, code = x / scale rounded to nearest even,
 *         clamped to [-127, 127] (a NaN gives 0)
 *   FP8:  scale = amax / 448, code = e4m3fn of x / scale rounded to nearest
 *         even, subnormals included, saturating to +-448 (a NaN gives 0x7f),
 *         the sign of zero kept
 * both divisions IEEE fp32 divisions; a row whose scale comes out 0 (all
 * zeros, or an amax too small to divide) stores scale 0 and codes 0.
 */
typedef struct k_kv {
    void *data;
    float *scales;
    k_kv_type type;
    int ring;
} k_kv;

/* Bytes per cache element: 4, 2, 2, 1, 1; 0 for a value outside k_kv_type. */
size_t k_kv_elem_size(k_kv_type t);
/* Whether the type keeps a scale per row (INT8, FP8). */
static inline int k_kv_has_scales(k_kv_type t)
{
    return t == K_KV_INT8 || t == K_KV_FP8;
}

/*
 * Store x[n, n_kv_heads, head_dim] as the cache rows of positions
 * pos0 .. pos0+n-1 (a ring's wrap around; n at most its rows, or two
 * positions would race for a row), quantizing each (position, head) row as
 * k_kv describes.
 */
void k_kv_store(const k_ctx *c, const k_kv *kv, const float *x, int n, int pos0, int n_kv_heads, int head_dim);

/* Row `row` (= the position's row * n_kv_heads + head) of the cache decoded to out[head_dim]: the reference
 * decoding. */
void k_kv_load(const k_kv *kv, size_t row, int head_dim, float *out);

/*
 * Causal attention of n new tokens at positions pos0 .. pos0+n-1 against the
 * cache. q[n, n_heads, head_dim]; k and v (any k_kv_type, decoded element
 * by element as they are read; never expanded; the same ring) already hold
 * positions 0 .. pos0+n-1, or for a ring at least pos0-window+1 ..
 * pos0+n-1 (ring >= window + n - 1); out[n, n_heads, head_dim]. window > 0
 * limits each token to the last `window` positions (itself included); a
 * ring needs one. Keys are summed in position order whatever their rows,
 * so a ring gives the bits the whole cache gives. Needs
 * c->scratch_per_thread >= pos0 + n.
 */
void k_attention_kv(const k_ctx *c, float *out, const float *q, const k_kv *k, const k_kv *v, int n, int pos0,
                    int n_heads, int n_kv_heads, int head_dim, int window);
/*
 * k_attention_kv with the score scale given (k_attention_kv's is
 * 1/sqrt(head_dim)) and, when softcap > 0, each scaled score s replaced by
 * softcap * tanh(s / softcap) before the softmax (Gemma 2).
 */
void k_attention_kv_ex(const k_ctx *c, float *out, const float *q, const k_kv *k, const k_kv *v, int n, int pos0,
                       int n_heads, int n_kv_heads, int head_dim, int window, float scale, float softcap);
/* k_attention_kv over fp32 caches k_cache/v_cache [n_ctx, n_kv_heads, head_dim]. */
void k_attention(const k_ctx *c, float *out, const float *q, const float *k_cache, const float *v_cache,
                 int n, int pos0, int n_heads, int n_kv_heads, int head_dim, int window);

/* gate[i] = silu(gate[i]) * up[i] for i < n. */
void k_swiglu(const k_ctx *c, float *gate, const float *up, size_t n);

/* gate[i] = gelu_tanh(gate[i]) * up[i] for i < n (GeGLU; tanh-approximated
 * GELU, transformers' gelu_pytorch_tanh). */
void k_geglu(const k_ctx *c, float *gate, const float *up, size_t n);

/* y[i] = cap * tanh(y[i] / cap) for i < n (Gemma 2's final-logit soft-capping). */
void k_softcap(const k_ctx *c, float *y, float cap, size_t n);

/* y[i] += x[i] for i < n. */
void k_add(const k_ctx *c, float *y, const float *x, size_t n);

/* y[i] *= a for i < n. */
void k_scale(const k_ctx *c, float *y, float a, size_t n);

/* y[t, :] = row ids[t] of emb as fp32, for t < n. emb must be dense
 * (F32/F16/BF16): embeddings are never quantized. */
void k_embed(const k_ctx *c, float *y, const k_weight *emb, const int32_t *ids, int n);

#endif
