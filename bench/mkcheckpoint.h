/*
 * mkcheckpoint.h: what mkcheckpoint's parts share: the shapes and their
 * tensors (mkcheckpoint_shapes.c), the element types, and the errors and
 * text of the writer (mkcheckpoint.c).
 */
#ifndef ENGINE_MKCHECKPOINT_H
#define ENGINE_MKCHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { ARCH_LLAMA, ARCH_GEMMA2, ARCH_GEMMA3, ARCH_PHI3, ARCH_MIXTRAL, ARCH_QWEN3MOE, ARCH_OLMOE } arch_t;

typedef struct shape_def {
    const char *name;
    int hidden, layers, heads, kv_heads, head_dim, ffn, vocab, max_pos;
    bool tied;
    double rms_eps, rope_theta, rope_factor, rope_low, rope_high;
    int rope_orig_max_pos, bos, eos;
    arch_t arch;  /* Llama's layout unless said */
    int window;   /* Gemma: sliding_window */
    int experts, top_k, moe_ffn; /* MoE: experts a layer, routed to per token, each one's width */
} shape_def;

typedef enum { DT_BF16, DT_F16, DT_F32 } dtype_t;
typedef struct dtype_info {
    const char *opt, *st_name, *torch_name;
    unsigned size;
} dtype_info;
extern const dtype_info dtypes[3];

/* A quantized weight's parts, in the order they are written (F32 ones
 * first, so that each stays 4-byte aligned; the JSON is padded so that the
 * group's length is a multiple of 8). */
typedef enum { P_DENSE, P_QMAP, P_NABS, P_NMAP, P_DATA, P_ABSMAX, P_STATE } part_t;

typedef struct tensor_def {
    char name[128];
    int64_t rows, cols; /* cols == 0: a vector of rows elements */
    bool norm;          /* norm weights: all `value` */
    float value;
    uint64_t n, bytes;
    int shard;
    uint64_t offset; /* within its shard's data area */
    int src;         /* the dense tensor's index: its random stream */
    part_t part;     /* P_DENSE, or which part of a quantized weight */
    int64_t mrows, mcols; /* a quantized weight's matrix */
    uint64_t group;  /* P_QMAP: bytes of the whole group (a shard holds all of it) */
} tensor_def;

/* Growable text buffer for the JSON headers. */
typedef struct text {
    char *s;
    size_t len, cap;
} text;

/* A message on stderr, prefixed "mkcheckpoint: ". */
void fail(const char *fmt, ...);
/* printf-style text appended to t (grown as needed): 0, or -1 with a message. */
int text_add(text *t, const char *fmt, ...);

/* The shape of that name, or NULL. */
const shape_def *shape_find(const char *name);
/* config.json of shape s with weights of type dt, appended to t. */
int config_json(text *t, const shape_def *s, dtype_t dt);
/* The dense tensors of s in dt (*out, calloc'd), in transformers' names: their count, or -1 with a message. */
int build_tensors(const shape_def *s, dtype_t dt, tensor_def **out);
/* The linear weights: what --quant quantizes (as tools/quantize picks them). */
bool is_linear(const char *name);

#endif
