/*
 * quant.h: the INT8 and NF4 weight formats (docs/FORMATS.md): code tables,
 * reference quantization and dequantization on plain arrays (OpenMP), and
 * whole-weight quantization into memory the caller owns.
 *
 * The 4-bit formats reproduce bitsandbytes bit for bit: the same code
 * tables, the same decision thresholds, the same reciprocal-multiply
 * scaling and the same nibble order. quant.c is compiled without fused
 * multiply-add so that its roundings are those bitsandbytes' kernels make.
 */
#ifndef ENGINE_QUANT_H
#define ENGINE_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../engine/error.h"
#include "../kernels/kernels.h"

#define Q_NF4_BLOCK 64     /* elements per absmax block, as transformers saves NF4 */
#define Q_NESTED_BLOCK 256 /* absmax values per nested scale (bitsandbytes)       */
#define Q_INT8_GROUP 128   /* columns per scale in grouped INT8                    */

/* bitsandbytes' NF4 table (get_4bit_type("nf4")), ascending; code 7 is 0. */
extern const float q_nf4_code[16];
/* bitsandbytes' FP4 table (get_4bit_type("fp4")): sign bit 8, magnitudes / 12. */
extern const float q_fp4_code[16];

/* bitsandbytes' signed 8-bit dynamic map (create_dynamic_map()), ascending. */
void q_dynamic_map(float code[256]);

/*
 * Whether 4-bit matrices stacked by rows (q/k/v, gate/up) can keep their
 * nested absmax as it is, 8-bit, in one array: every part nested with the
 * same code table and the same power-of-two nested block, and every part
 * but the last made of whole nested blocks, so that the parts' scales line
 * up when concatenated. (The CUDA backend decodes other nested parts to
 * fp32 on upload.)
 */
bool q_nested_stackable(const k_weight *const *parts, int np);

/* Nibble for a value already scaled into [-1, 1], exactly as bitsandbytes decides it. */
uint8_t q_nf4_encode(float x);
uint8_t q_fp4_encode(float x);

/*
 * 4-bit blockwise quantization of x[n] (flattened row-major): absmax[b] =
 * max |x| over block b (ceil(n / block) blocks), packed[ceil(n / 2)]
 * with element 2j in the high nibble of byte j. type is K_NF4 or K_FP4.
 */
void q_4bit_quantize(k_dtype type, const float *x, size_t n, int block, uint8_t *packed, float *absmax,
                     int n_threads);
/* out[n] = code[nibble] * absmax[block]. */
void q_4bit_dequantize(const float code[16], const uint8_t *packed, const float *absmax, size_t n, int block,
                       float *out, int n_threads);

/*
 * 8-bit blockwise quantization (bitsandbytes quantize_blockwise with its
 * dynamic map): absmax[b] over blocks of `block`, q[i] the entry of
 * code[256] that bitsandbytes' binary search picks for x[i] * (1 / absmax)
 * (the nearest one, up to how it splits midpoints).
 */
void q_8bit_quantize(const float code[256], const float *x, size_t n, int block, uint8_t *q, float *absmax);
/* out[i] = code[q[i]] * absmax[i / block] + offset (two roundings). */
void q_8bit_dequantize(const float code[256], const uint8_t *q, const float *absmax, size_t n, int block,
                       float offset, float *out);

/*
 * Double quantization of 4-bit absmax[nb]: *offset = their mean, then
 * absmax - offset quantized 8-bit in blocks of Q_NESTED_BLOCK with code.
 * scale gets ceil(nb / Q_NESTED_BLOCK) floats.
 */
void q_nested_quantize(const float code[256], const float *absmax, size_t nb, uint8_t *aq, float *scale,
                       float *offset);

/* INT8: one scale per row (group = cols) or per `group` columns. */
size_t q_int8_n_groups(int cols, int group);
void q_int8_quantize(const float *w, int rows, int cols, int group, int8_t *q, float *scales, int n_threads);
void q_int8_dequantize(const int8_t *q, const float *scales, int rows, int cols, int group, float *out,
                       int n_threads);

/* What to make of a dense weight. */
typedef struct q_spec {
    k_dtype type;     /* K_I8, K_NF4 or K_FP4                               */
    int group;        /* K_I8: Q_INT8_GROUP, or 0 for one scale per row     */
    bool double_quant;/* K_NF4/K_FP4: nested quantization of the absmax     */
} q_spec;

/*
 * A quantized weight and the one allocation holding all its arrays. w's
 * pointers point into mem; free with q_weight_free (w is then invalid).
 */
typedef struct q_weight {
    void *mem;
    size_t bytes;
    k_weight w;
} q_weight;

/*
 * Quantize the dense weight src (F32/F16/BF16) as spec says into out.
 * Returns ENGINE_ERR_OUT_OF_MEMORY or ENGINE_ERR_INVALID_ARG (with e set,
 * naming `name`) on failure; out is then empty.
 */
engine_status q_quantize_weight(const k_weight *src, const q_spec *spec, int n_threads, q_weight *out,
                                const char *name, err_buf *e);
void q_weight_free(q_weight *q);

/* Error of a quantized weight against its source, over all elements. */
typedef struct q_error {
    double rms_ref;  /* root mean square of the source values       */
    double rms_err;  /* root mean square of (dequantized - source)  */
    double max_err;  /* largest |dequantized - source|              */
} q_error;

void q_measure_error(const k_weight *src, const k_weight *quant, int n_threads, q_error *out);

/* "int8", "int8-g128", "nf4", "nf4-dq", "fp4", ... for messages and metadata; static storage. */
const char *q_spec_name(const q_spec *spec);

#endif
