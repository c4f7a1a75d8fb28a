/*
 * matmul_quant.c: the CPU reference for quantized weights (K_I8, K_NF4,
 * K_FP4): decoding a run of a row to fp32, and y = x . W^T.
 *
 * The product decodes a block of 4 rows one chunk of columns at a time
 * into a stack buffer and dots that chunk with every token of the batch
 * before moving on, so each weight is decoded once per call however many
 * tokens there are, and no scratch beyond 4 KiB of stack is needed.
 * Accumulation is fp32. The layouts are those documented on k_weight.
 * Decoding and the dot products have AVX2 versions chosen at run time
 * (8 nibbles expanded by variable shifts, the 16-entry code table looked up
 * with two permutes and a blend); the portable loops are the reference.
 * One token's rows (k_matvec_rows, and k_matmul_quant for one token)
 * decode 4-bit blocks or int8 groups in registers and dot them at once,
 * with no buffer between.
 */
#include <omp.h>
#include <string.h>

#include "../kernels.h"
#include "dtype.h"
#include "quant_cpu.h"
#include "simd.h"


#define QROWS 4     /* rows decoded together: one x load feeds 4 products */
#define QCHUNK 256  /* columns decoded per step: 4 x 256 floats = 4 KiB   */

/* absmax of 4-bit block b, decoded from its 8-bit code when nested. */
static inline float block_absmax(const k_weight *w, size_t b)
{
    if (!w->absmax_q)
        return w->absmax[b];
    const float scaled = w->absmax_code[w->absmax_q[b]] * w->absmax_scale[b / (size_t)w->absmax_block];
    return scaled + w->absmax_offset;
}

static inline int nibble(const uint8_t *p, size_t i)
{
    return (i & 1) ? p[i >> 1] & 0x0f : p[i >> 1] >> 4;
}

float k_quant_get(const k_weight *w, size_t i)
{
    if (w->dtype == K_I8) {
        const size_t r = i / (size_t)w->cols, c = i % (size_t)w->cols;
        const size_t ng = ((size_t)w->cols + w->group - 1) / w->group;
        return (float)((const int8_t *)w->data)[i] * w->scales[r * ng + c / w->group];
    }
    return w->code[nibble(w->data, i)] * block_absmax(w, i / (size_t)w->block);
}

#ifdef K_HAVE_AVX2
/* The codes of elements i .. i + 7 (i a multiple of 8), the table's halves in lo and hi. */
__attribute__((target("avx2,fma"))) static inline __m256 codes8_avx2(const uint8_t *p, size_t i, __m256 lo, __m256 hi)
{
    /* Element 2j is the high nibble of byte j: in a little-endian 32-bit
     * load of 4 bytes, elements 0..7 sit at bits 4, 0, 12, 8, 20, 16, 28, 24. */
    const __m256i shifts = _mm256_setr_epi32(4, 0, 12, 8, 20, 16, 28, 24);
    uint32_t word;
    memcpy(&word, p + i / 2, 4);
    const __m256i idx =
        _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)word), shifts), _mm256_set1_epi32(0x0f));
    const __m256 a = _mm256_permutevar8x32_ps(lo, idx), b = _mm256_permutevar8x32_ps(hi, idx);
    /* bit 3 of the index, moved to the sign bit, picks the upper half. */
    return _mm256_blendv_ps(a, b, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
}

/* out[0..n) from the nibbles of elements i.. (i and n multiples of 8), one absmax. */
__attribute__((target("avx2,fma"))) static void nibbles_avx2(const uint8_t *p, size_t i, size_t n, const float *code,
                                                            float am, float *out)
{
    const __m256 lo = _mm256_loadu_ps(code), hi = _mm256_loadu_ps(code + 8), scale = _mm256_set1_ps(am);
    for (size_t k = 0; k < n; k += 8)
        _mm256_storeu_ps(out + k, _mm256_mul_ps(codes8_avx2(p, i + k, lo, hi), scale));
}

__attribute__((target("avx2,fma"))) static void int8_avx2(const int8_t *q, int n, float sc, float *out)
{
    const __m256 scale = _mm256_set1_ps(sc);
    for (int k = 0; k < n; k += 8) {
        const __m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + k)));
        _mm256_storeu_ps(out + k, _mm256_mul_ps(_mm256_cvtepi32_ps(v), scale));
    }
}
#endif

/* k_dequant_row, with the AVX2 decoders when avx2 is set. */
static void dequant_run(const k_weight *w, int r, int c0, int n, float *out, int avx2)
{
    const size_t base = (size_t)r * w->cols + c0;
    switch (w->dtype) {
    case K_F32: memcpy(out, (const float *)w->data + base, (size_t)n * sizeof(float)); return;
    case K_F16:
        for (int i = 0; i < n; i++)
            out[i] = f16_to_f32(((const uint16_t *)w->data)[base + i]);
        return;
    case K_BF16:
        for (int i = 0; i < n; i++)
            out[i] = bf16_to_f32(((const uint16_t *)w->data)[base + i]);
        return;
    case K_I8: {
        const int8_t *q = (const int8_t *)w->data + base;
        const float *s = w->scales + (size_t)r * (((size_t)w->cols + w->group - 1) / w->group);
        int i = 0;
        while (i < n) {
            /* One run per scale group keeps the inner loop a plain multiply. */
            const int g = (c0 + i) / w->group, end_c = (g + 1) * w->group;
            const int stop = end_c - c0 < n ? end_c - c0 : n;
            const float sc = s[g];
#ifdef K_HAVE_AVX2
            if (avx2 && stop - i >= 8) {
                const int m = (stop - i) & ~7;
                int8_avx2(q + i, m, sc, out + i);
                i += m;
            }
#endif
            for (; i < stop; i++)
                out[i] = (float)q[i] * sc;
        }
        return;
    }
    case K_NF4:
    case K_FP4: {
        const uint8_t *p = w->data;
        const float *code = w->code;
        size_t i = base;
        const size_t end = base + (size_t)n;
        float *o = out;
        while (i < end) {
            /* One run per absmax block: the scale is decoded once per run. */
            const size_t b = i / (size_t)w->block, bend = (b + 1) * (size_t)w->block;
            const size_t stop = bend < end ? bend : end;
            const float am = block_absmax(w, b);
#ifdef K_HAVE_AVX2
            if (avx2 && i % 8 == 0 && stop - i >= 8) {
                const size_t m = (stop - i) & ~(size_t)7;
                nibbles_avx2(p, i, m, code, am, o);
                i += m;
                o += m;
            }
#endif
            for (; i < stop; i++)
                *o++ = code[nibble(p, i)] * am;
        }
        return;
    }
    }
}

/* The widest instruction set the kernels may use (k_cpu_isa_cap): 2 AVX-512, 1 AVX2, 0 neither. */
static int isa_cap = 2;

void k_cpu_isa_cap(int cap)
{
    isa_cap = cap;
}

static int have_avx2(void)
{
#ifdef K_HAVE_AVX2
    return isa_cap >= 1 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

static int have_avx512(void)
{
#ifdef K_HAVE_AVX2
    return isa_cap >= 2 && __builtin_cpu_supports("avx512f");
#else
    return 0;
#endif
}

void k_dequant_row(const k_weight *w, int r, int c0, int n, float *out)
{
    dequant_run(w, r, c0, n, out, have_avx2());
}

size_t k_weight_bytes(const k_weight *w)
{
    const size_t n = (size_t)w->rows * w->cols;
    switch (w->dtype) {
    case K_F32: return n * 4;
    case K_F16:
    case K_BF16: return n * 2;
    case K_I8: return n + (size_t)w->rows * (((size_t)w->cols + w->group - 1) / w->group) * sizeof(float);
    case K_NF4:
    case K_FP4: {
        const size_t nb = (n + w->block - 1) / w->block;
        size_t b = (n + 1) / 2 + 16 * sizeof(float);
        if (w->absmax_q)
            b += nb + 256 * sizeof(float) + (nb + w->absmax_block - 1) / w->absmax_block * sizeof(float);
        else
            b += nb * sizeof(float);
        return b;
    }
    }
    return 0;
}

static inline float dot(const float *a, const float *b, int n)
{
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

#ifdef K_HAVE_AVX2
/* acc[r] = dot(wf[r], x) for r < nr over len columns; one x load feeds 4 FMAs. */
__attribute__((target("avx2,fma"))) static void dot4_avx2(float wf[][QCHUNK], int nr, const float *x, int len,
                                                         float *acc)
{
    __m256 a[QROWS];
    for (int r = 0; r < QROWS; r++)
        a[r] = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= len; i += 8) {
        const __m256 xv = _mm256_loadu_ps(x + i);
        for (int r = 0; r < nr; r++)
            a[r] = _mm256_fmadd_ps(_mm256_loadu_ps(wf[r] + i), xv, a[r]);
    }
    for (int r = 0; r < nr; r++) {
        float v = hsum_avx2(a[r]);
        for (int j = i; j < len; j++)
            v += wf[r][j] * x[j];
        acc[r] = v;
    }
}
#endif

#ifdef K_HAVE_AVX2
/* Row r of a 4-bit w (cols and block multiples of 8, blocks within rows) . x: each block's
 * nibbles decoded in registers and dotted with x, the sum scaled by the block's absmax. */
__attribute__((target("avx2,fma"))) static float row_dot4_avx2(const k_weight *w, int r, const float *x)
{
    const __m256 lo = _mm256_loadu_ps(w->code), hi = _mm256_loadu_ps(w->code + 8);
    const uint8_t *p = (const uint8_t *)w->data + (size_t)r * w->cols / 2;
    const int bs = w->block, nb = w->cols / bs;
    const size_t b0 = (size_t)r * w->cols / bs;
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        __m256 part = _mm256_setzero_ps();
        for (int k = 0; k < bs; k += 8)
            part = _mm256_fmadd_ps(codes8_avx2(p, (size_t)(b * bs + k), lo, hi), _mm256_loadu_ps(x + b * bs + k), part);
        acc = _mm256_fmadd_ps(part, _mm256_set1_ps(block_absmax(w, b0 + (size_t)b)), acc);
    }
    return hsum_avx2(acc);
}
#endif

#ifdef K_HAVE_AVX2
#define XCHUNK 4096 /* columns of x rearranged at a time by matvec4_avx512 (16 KiB of stack) */

/*
 * Rows [r0, r1) of a 4-bit w (blocks multiples of 32, of at most XCHUNK
 * columns, within rows) . x, with AVX-512: 16 bytes widened to one a lane
 * give 32 elements at once, the high nibbles (even elements) by one shift
 * and the low ones (odd) by one mask, each looked up in the 16-entry code
 * table with one permute. x is rearranged once a chunk of columns into
 * each 32's even then odd elements to match, so a row needs no shuffle of
 * its own: three shuffles per 32 weights, where taking them in order
 * needs six.
 */
__attribute__((target("avx512f"))) static void matvec4_avx512(const k_weight *w, int r0, int r1, const float *x,
                                                              float *y)
{
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1)), mask = _mm512_set1_epi32(0x0f);
    const __m512 table = _mm512_loadu_ps(w->code);
    const int cols = w->cols, bs = w->block, chunk = XCHUNK / bs * bs;
    float xs[XCHUNK];
    for (int r = r0; r < r1; r++)
        y[r - r0] = 0.0f;
    for (int c0 = 0; c0 < cols; c0 += chunk) {
        const int len = cols - c0 < chunk ? cols - c0 : chunk; /* whole blocks: cols % bs == 0 */
        for (int c = 0; c < len; c += 32) {
            const __m512 a = _mm512_loadu_ps(x + c0 + c), b = _mm512_loadu_ps(x + c0 + c + 16);
            _mm512_storeu_ps(xs + c, _mm512_permutex2var_ps(a, even, b));
            _mm512_storeu_ps(xs + c + 16, _mm512_permutex2var_ps(a, odd, b));
        }
        for (int r = r0; r < r1; r++) {
            const uint8_t *p = (const uint8_t *)w->data + ((size_t)r * cols + c0) / 2;
            const size_t b0 = ((size_t)r * cols + c0) / bs;
            __m512 acc = _mm512_setzero_ps();
            for (int b = 0; b < len / bs; b++) {
                __m512 hi = _mm512_setzero_ps(), lo = _mm512_setzero_ps();
                for (int k = b * bs; k < (b + 1) * bs; k += 32) {
                    const __m512i lanes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + k / 2)));
                    hi = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(lanes, 4), table),
                                         _mm512_loadu_ps(xs + k), hi);
                    lo = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_and_si512(lanes, mask), table),
                                         _mm512_loadu_ps(xs + k + 16), lo);
                }
                acc = _mm512_fmadd_ps(_mm512_add_ps(hi, lo), _mm512_set1_ps(block_absmax(w, b0 + (size_t)b)), acc);
            }
            y[r - r0] += _mm512_reduce_add_ps(acc);
        }
    }
}
#endif

#ifdef K_HAVE_AVX2
/* Rows [r0, r1) of an int8 w (cols and group multiples of 16) . x: 16 values widened to fp32 a step,
 * each group's sum scaled once. */
__attribute__((target("avx512f"))) static void matvec8_avx512(const k_weight *w, int r0, int r1, const float *x,
                                                              float *y)
{
    const int cols = w->cols, g = w->group, ng = (cols + g - 1) / g;
    for (int r = r0; r < r1; r++) {
        const int8_t *q = (const int8_t *)w->data + (size_t)r * cols;
        const float *sc = w->scales + (size_t)r * ng;
        __m512 acc = _mm512_setzero_ps();
        for (int gi = 0; gi < ng; gi++) {
            const int c1 = (gi + 1) * g < cols ? (gi + 1) * g : cols;
            __m512 part = _mm512_setzero_ps();
            for (int c = gi * g; c < c1; c += 16) {
                const __m512i v = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + c)));
                part = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), _mm512_loadu_ps(x + c), part);
            }
            acc = _mm512_fmadd_ps(part, _mm512_set1_ps(sc[gi]), acc);
        }
        y[r - r0] = _mm512_reduce_add_ps(acc);
    }
}

/* matvec8_avx512 with 8 values a step (cols and group multiples of 8). */
__attribute__((target("avx2,fma"))) static void matvec8_avx2(const k_weight *w, int r0, int r1, const float *x,
                                                            float *y)
{
    const int cols = w->cols, g = w->group, ng = (cols + g - 1) / g;
    for (int r = r0; r < r1; r++) {
        const int8_t *q = (const int8_t *)w->data + (size_t)r * cols;
        const float *sc = w->scales + (size_t)r * ng;
        __m256 acc = _mm256_setzero_ps();
        for (int gi = 0; gi < ng; gi++) {
            const int c1 = (gi + 1) * g < cols ? (gi + 1) * g : cols;
            __m256 part = _mm256_setzero_ps();
            for (int c = gi * g; c < c1; c += 8) {
                const __m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + c)));
                part = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), _mm256_loadu_ps(x + c), part);
            }
            acc = _mm256_fmadd_ps(part, _mm256_set1_ps(sc[gi]), acc);
        }
        y[r - r0] = hsum_avx2(acc);
    }
}
#endif

/* Whether k_matvec_rows decodes w's rows in registers (AVX2 at least; AVX-512 where the widths allow):
 * 4-bit rows of whole blocks of 8k, int8 rows and groups of 8k; else it decodes chunks into a buffer. */
static int rows_fused(const k_weight *w, int avx2)
{
    if (w->dtype == K_I8)
        return avx2 && w->cols % 8 == 0 && w->group % 8 == 0;
    return avx2 && (w->dtype == K_NF4 || w->dtype == K_FP4) && w->block % 8 == 0 && w->cols % w->block == 0;
}

void k_matvec_rows(const k_weight *w, int r0, int r1, const float *x, float *y)
{
    const int avx2 = have_avx2(), cols = w->cols;
#ifdef K_HAVE_AVX2
    if (rows_fused(w, avx2)) {
        if (w->dtype == K_I8) {
            if (cols % 16 == 0 && w->group % 16 == 0 && have_avx512())
                matvec8_avx512(w, r0, r1, x, y);
            else
                matvec8_avx2(w, r0, r1, x, y);
        } else if (w->block % 32 == 0 && w->block <= XCHUNK && have_avx512()) {
            matvec4_avx512(w, r0, r1, x, y);
        } else {
            for (int r = r0; r < r1; r++)
                y[r - r0] = row_dot4_avx2(w, r, x);
        }
        return;
    }
#endif
    float wf[QCHUNK];
    for (int r = r0; r < r1; r++) {
        float sum = 0.0f;
        for (int c0 = 0; c0 < cols; c0 += QCHUNK) {
            const int len = cols - c0 < QCHUNK ? cols - c0 : QCHUNK;
            dequant_run(w, r, c0, len, wf, avx2);
            sum += dot(wf, x + c0, len);
        }
        y[r - r0] = sum;
    }
}

#define MATVEC_ROWS 16 /* rows a work item of one token's fused product */

void k_matmul_quant(const k_ctx *c, float *y, const float *x, int n, const k_weight *w)
{
    const int avx2 = have_avx2();
    const int rows = w->rows, cols = w->cols;
    const int n_blocks = (rows + QROWS - 1) / QROWS;
    const int parallel = (double)n * rows * cols >= K_PARALLEL_MIN_WORK;
    /* One token (decode) of 4-bit or int8 weights: each row decoded in
     * registers and dotted at once (k_matvec_rows), with no buffer between. */
    if (n == 1 && rows_fused(w, avx2)) {
        const int items = (rows + MATVEC_ROWS - 1) / MATVEC_ROWS;
#pragma omp parallel for num_threads(c->n_threads) schedule(static) if (parallel)
        for (int it = 0; it < items; it++) {
            const int r0 = it * MATVEC_ROWS, r1 = r0 + MATVEC_ROWS < rows ? r0 + MATVEC_ROWS : rows;
            k_matvec_rows(w, r0, r1, x, y + r0);
        }
        return;
    }

#pragma omp parallel for num_threads(c->n_threads) schedule(static) if (parallel)
    for (int b = 0; b < n_blocks; b++) {
        const int r0 = b * QROWS, nr = rows - r0 < QROWS ? rows - r0 : QROWS;
        float wf[QROWS][QCHUNK];
        float acc[QROWS];
        for (int t = 0; t < n; t++)
            for (int r = 0; r < nr; r++)
                y[(size_t)t * rows + r0 + r] = 0.0f;
        for (int c0 = 0; c0 < cols; c0 += QCHUNK) {
            const int len = cols - c0 < QCHUNK ? cols - c0 : QCHUNK;
            for (int r = 0; r < nr; r++)
                dequant_run(w, r0 + r, c0, len, wf[r], avx2);
            for (int t = 0; t < n; t++) {
                const float *xt = x + (size_t)t * cols + c0;
#ifdef K_HAVE_AVX2
                if (avx2) {
                    dot4_avx2(wf, nr, xt, len, acc);
                } else
#endif
                    for (int r = 0; r < nr; r++)
                        acc[r] = dot(wf[r], xt, len);
                for (int r = 0; r < nr; r++)
                    y[(size_t)t * rows + r0 + r] += acc[r];
            }
        }
    }
}
