/*
 * matmul.c: y = x . W^T on the CPU for fp32/fp16/bf16 weights read straight
 * from the file mapping.
 *
 * Decode (one token) is bound by reading W once: each row is converted in
 * registers and dotted with x. A batch (the prompt) converts a block of rows
 * to fp32 once and reuses it for every token, so the conversion cost is
 * paid once per weight, not once per token. The inner dot products have an
 * AVX2/FMA/F16C version chosen at run time and a portable one.
 */
#include <omp.h>
#include <string.h>

#include "../kernels.h"
#include "dtype.h"
#include "quant_cpu.h"
#include "simd.h"


#define ROWS_PER_BLOCK 4

size_t k_matmul_scratch_floats(int max_cols)
{
    return (size_t)ROWS_PER_BLOCK * (size_t)max_cols;
}

size_t k_dtype_size(k_dtype t)
{
    switch (t) {
    case K_F32: return 4;
    case K_F16:
    case K_BF16: return 2;
    case K_I8: return 1;
    case K_NF4:
    case K_FP4: return 0;
    }
    return 0;
}

float k_weight_get(const k_weight *w, size_t i)
{
    switch (w->dtype) {
    case K_F32: return ((const float *)w->data)[i];
    case K_F16: return f16_to_f32(((const uint16_t *)w->data)[i]);
    case K_BF16: return bf16_to_f32(((const uint16_t *)w->data)[i]);
    case K_I8:
    case K_NF4:
    case K_FP4: return k_quant_get(w, i);
    }
    return 0.0f;
}

/* Convert cols elements of one stored row to fp32. */
static void row_to_f32(float *dst, const void *src, k_dtype t, int cols);

/* out[r] = dot(row r of w, x) for r < nr; rows are ld elements apart. */
static void dot_rows_portable(float *out, const void *w, k_dtype t, size_t ld, int nr, const float *x, int cols)
{
    for (int r = 0; r < nr; r++) {
        float s = 0.0f;
        if (t == K_F32) {
            const float *wr = (const float *)w + (size_t)r * ld;
#pragma omp simd reduction(+ : s)
            for (int i = 0; i < cols; i++)
                s += wr[i] * x[i];
        } else {
            const uint16_t *wr = (const uint16_t *)w + (size_t)r * ld;
            if (t == K_BF16) {
#pragma omp simd reduction(+ : s)
                for (int i = 0; i < cols; i++)
                    s += bf16_to_f32(wr[i]) * x[i];
            } else {
                for (int i = 0; i < cols; i++)
                    s += f16_to_f32(wr[i]) * x[i];
            }
        }
        out[r] = s;
    }
}

#ifdef K_HAVE_AVX2
__attribute__((target("avx2,fma,f16c"))) static inline __m256 load8_avx2(const void *w, k_dtype t, size_t i)
{
    if (t == K_F32)
        return _mm256_loadu_ps((const float *)w + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + i));
    if (t == K_F16)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* Up to 4 rows at once so each load of x feeds 4 FMAs. */
__attribute__((target("avx2,fma,f16c"))) static void dot_rows_avx2(float *out, const void *w, k_dtype t, size_t ld,
                                                                   int nr, const float *x, int cols)
{
    size_t es = k_dtype_size(t);
    const char *base = (const char *)w;
    __m256 acc[ROWS_PER_BLOCK];
    for (int r = 0; r < ROWS_PER_BLOCK; r++)
        acc[r] = _mm256_setzero_ps();
    int i = 0;
    if (nr == ROWS_PER_BLOCK) {
        const void *w0 = base, *w1 = base + ld * es, *w2 = base + 2 * ld * es, *w3 = base + 3 * ld * es;
        for (; i + 8 <= cols; i += 8) {
            __m256 xv = _mm256_loadu_ps(x + i);
            acc[0] = _mm256_fmadd_ps(load8_avx2(w0, t, (size_t)i), xv, acc[0]);
            acc[1] = _mm256_fmadd_ps(load8_avx2(w1, t, (size_t)i), xv, acc[1]);
            acc[2] = _mm256_fmadd_ps(load8_avx2(w2, t, (size_t)i), xv, acc[2]);
            acc[3] = _mm256_fmadd_ps(load8_avx2(w3, t, (size_t)i), xv, acc[3]);
        }
    } else {
        for (; i + 8 <= cols; i += 8) {
            __m256 xv = _mm256_loadu_ps(x + i);
            for (int r = 0; r < nr; r++)
                acc[r] = _mm256_fmadd_ps(load8_avx2(base + (size_t)r * ld * es, t, (size_t)i), xv, acc[r]);
        }
    }
    for (int r = 0; r < nr; r++) {
        float s = hsum_avx2(acc[r]);
        const void *wr = base + (size_t)r * ld * es;
        for (int j = i; j < cols; j++) {
            float wv = t == K_F32   ? ((const float *)wr)[j]
                       : t == K_F16 ? f16_to_f32(((const uint16_t *)wr)[j])
                                    : bf16_to_f32(((const uint16_t *)wr)[j]);
            s += wv * x[j];
        }
        out[r] = s;
    }
}

/*
 * A batch's inner tile: 4 fp32 rows against 3 tokens, 12 accumulators, so
 * 7 loads feed 12 FMAs (the 4-row dot needs 5 loads for 4) and the FMA
 * units, not the load ports, set the pace. y[t * ldy + r] for t < 3, r < 4.
 */
__attribute__((target("avx2,fma"))) static void tile4x3_avx2(float *y, size_t ldy, const float *w, size_t ldw,
                                                             const float *x, size_t ldx, int cols)
{
    __m256 a[4][3];
    for (int r = 0; r < 4; r++)
        for (int t = 0; t < 3; t++)
            a[r][t] = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= cols; i += 8) {
        const __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + ldx + i);
        const __m256 x2 = _mm256_loadu_ps(x + 2 * ldx + i);
        for (int r = 0; r < 4; r++) {
            const __m256 wv = _mm256_loadu_ps(w + (size_t)r * ldw + i);
            a[r][0] = _mm256_fmadd_ps(wv, x0, a[r][0]);
            a[r][1] = _mm256_fmadd_ps(wv, x1, a[r][1]);
            a[r][2] = _mm256_fmadd_ps(wv, x2, a[r][2]);
        }
    }
    for (int r = 0; r < 4; r++)
        for (int t = 0; t < 3; t++) {
            float v = hsum_avx2(a[r][t]);
            for (int j = i; j < cols; j++)
                v += w[(size_t)r * ldw + j] * x[(size_t)t * ldx + j];
            y[(size_t)t * ldy + r] = v;
        }
}
#endif

typedef void (*dot_rows_fn)(float *, const void *, k_dtype, size_t, int, const float *, int);
typedef void (*tile_fn)(float *, size_t, const float *, size_t, const float *, size_t, int);

static tile_fn pick_tile(void)
{
#ifdef K_HAVE_AVX2
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return tile4x3_avx2;
#endif
    return NULL;
}

static dot_rows_fn pick_dot_rows(void)
{
#ifdef K_HAVE_AVX2
    /* Every AVX2 CPU (Intel since Haswell, AMD since Excavator) has F16C; clang
     * cannot query "f16c" here, so AVX2 + FMA stands for all three. */
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return dot_rows_avx2;
#endif
    return dot_rows_portable;
}

static void row_to_f32(float *dst, const void *src, k_dtype t, int cols)
{
    if (t == K_F32) {
        memcpy(dst, src, (size_t)cols * sizeof(float));
    } else if (t == K_BF16) {
        const uint16_t *s = src;
        for (int i = 0; i < cols; i++)
            dst[i] = bf16_to_f32(s[i]);
    } else {
        const uint16_t *s = src;
        for (int i = 0; i < cols; i++)
            dst[i] = f16_to_f32(s[i]);
    }
}

void k_matmul(const k_ctx *c, float *y, const float *x, int n, const k_weight *w, const k_weight *bias)
{
    const int rows = w->rows, cols = w->cols;
    const size_t es = k_dtype_size(w->dtype);
    const int n_blocks = (rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK;
    const dot_rows_fn dot = pick_dot_rows();
    const tile_fn tile = pick_tile();
    const int use_bias = bias && bias->data;
    const int parallel = (double)n * rows * cols >= K_PARALLEL_MIN_WORK;

    if (k_dtype_is_quant(w->dtype)) {
        k_matmul_quant(c, y, x, n, w);
    } else if (n == 1) {
#pragma omp parallel for num_threads(c->n_threads) schedule(static) if (parallel)
        for (int b = 0; b < n_blocks; b++) {
            int r0 = b * ROWS_PER_BLOCK;
            int nr = rows - r0 < ROWS_PER_BLOCK ? rows - r0 : ROWS_PER_BLOCK;
            dot(y + r0, (const char *)w->data + (size_t)r0 * cols * es, w->dtype, (size_t)cols, nr, x, cols);
        }
    } else {
#pragma omp parallel num_threads(c->n_threads) if (parallel)
        {
            /* fp32 copy of this thread's current row block, reused for every token;
             * without scratch the stored rows are converted per token instead. */
            float *wf = NULL;
            if (w->dtype != K_F32 && c->scratch && c->scratch_per_thread >= k_matmul_scratch_floats(cols))
                wf = c->scratch + (size_t)omp_get_thread_num() * c->scratch_per_thread;
            float out[ROWS_PER_BLOCK];
#pragma omp for schedule(static)
            for (int b = 0; b < n_blocks; b++) {
                int r0 = b * ROWS_PER_BLOCK;
                int nr = rows - r0 < ROWS_PER_BLOCK ? rows - r0 : ROWS_PER_BLOCK;
                const char *src = (const char *)w->data + (size_t)r0 * cols * es;
                const void *blk = src;
                k_dtype bt = w->dtype;
                if (wf) {
                    for (int r = 0; r < nr; r++)
                        row_to_f32(wf + (size_t)r * cols, src + (size_t)r * cols * es, w->dtype, cols);
                    blk = wf;
                    bt = K_F32;
                }
                int t = 0;
                if (tile && bt == K_F32 && nr == ROWS_PER_BLOCK)
                    for (; t + 3 <= n; t += 3)
                        tile(y + (size_t)t * rows + r0, (size_t)rows, blk, (size_t)cols, x + (size_t)t * cols,
                             (size_t)cols, cols);
                for (; t < n; t++) {
                    dot(out, blk, bt, (size_t)cols, nr, x + (size_t)t * cols, cols);
                    memcpy(y + (size_t)t * rows + r0, out, (size_t)nr * sizeof(float));
                }
            }
        }
    }
    if (use_bias) {
#pragma omp parallel for num_threads(c->n_threads) schedule(static) if (parallel)
        for (int t = 0; t < n; t++)
            for (int r = 0; r < rows; r++)
                y[(size_t)t * rows + r] += k_weight_get(bias, (size_t)r);
    }
}
