/*
 * q4arith.c: how far the 4-bit decode product's arithmetic strays from the
 * exact NF4 product, for the arithmetic the CUDA kernel uses now and for an
 * int8 one proposed for it (bench/RESULTS.md, fourteenth session). CPU only,
 * no GPU: each is emulated bit for bit where it matters.
 *
 *   exact:  sum code[q] * absmax * x in double (the reference).
 *   pairs:  gemv.cu's q4_dot: x scaled by a power of two that brings max |x|
 *           into [2^11, 2^12) and rounded to fp16, the codes in fp16, each
 *           byte's two products fused into an fp16 accumulator (8 products a
 *           half, a rounding each), then fp32 sums times the absmax.
 *   int8:   the codes rounded to int8 (round(127 code)), x quantized to int8
 *           under one scale per 32 (max |x| / 127), integer dot products of
 *           32 (dp4a), then fp32 times absmax / 127 times the scale.
 *
 * Weights: Gaussian, quantized to NF4 by the CPU reference (quant/). Inputs:
 * Gaussian, with a few outlier columns 20x larger (as LLM activations have).
 * Per output row: |y - exact| over max |exact| of the matrix, the measure of
 * test_kernels_cuda's tolerance (3e-3 for the pairs arithmetic).
 *
 *   q4arith [ROWS COLS [OUTLIER]]   (default 4096 x 4096, outliers 20x)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "quant/quant.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double uniform(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return ((rng >> 11) + 0.5) / 9007199254740992.0;
}
static double gauss(void) { return sqrt(-2.0 * log(uniform())) * cos(6.283185307179586 * uniform()); }

/* v rounded once to fp16 (11 significant bits, subnormals below 2^-14, to
 * nearest even; no overflow at these sizes), without a compiler's _Float16. */
static float h(double v)
{
    if (v == 0.0)
        return 0.0f;
    const int e = ilogb(v) < -14 ? -14 : ilogb(v);
    const double quantum = ldexp(1.0, e - 10);
    return (float)(nearbyint(v / quantum) * quantum);
}

int main(int argc, char **argv)
{
    const int rows = argc > 2 ? atoi(argv[1]) : 4096, cols = argc > 2 ? atoi(argv[2]) : 4096;
    const double outlier = argc > 3 ? atof(argv[3]) : 20.0; /* every 97th input this many times larger */
    if (rows < 1 || cols < 32 || cols % 32) {
        fprintf(stderr, "q4arith: ROWS >= 1 and COLS a multiple of 32\n");
        return 2;
    }
    float *w = malloc((size_t)rows * cols * sizeof *w), *x = malloc((size_t)cols * sizeof *x);
    if (!w || !x) {
        fprintf(stderr, "q4arith: out of memory for a %d x %d matrix\n", rows, cols);
        return 1;
    }
    for (size_t i = 0; i < (size_t)rows * cols; i++)
        w[i] = (float)(0.02 * gauss());
    for (int c = 0; c < cols; c++)
        x[c] = (float)(gauss() * (c % 97 == 5 ? outlier : 1.0));
    k_weight src = {.data = w, .dtype = K_F32, .rows = rows, .cols = cols};
    q_spec spec = {.type = K_NF4};
    q_weight q;
    err_buf e = {0};
    if (q_quantize_weight(&src, &spec, 2, &q, "q4arith", &e) != ENGINE_OK) {
        fprintf(stderr, "q4arith: %s\n", e.msg);
        return 1;
    }
    const k_weight *qw = &q.w;
    const uint8_t *data = qw->data;
    /* pairs: x scaled into [2^11, 2^12) and rounded to fp16 */
    double mx = 0.0;
    for (int c = 0; c < cols; c++)
        mx = fmax(mx, fabs(x[c]));
    const int ex = ilogb(mx);
    const double scale = ldexp(1.0, 11 - ex);
    float *xh = malloc((size_t)cols * sizeof *xh), *codeh = malloc(16 * sizeof *codeh);
    signed char *code8 = malloc(16), *xq = malloc((size_t)cols);
    float *xs = malloc((size_t)cols / 32 * sizeof *xs);
    double *ex_y = malloc((size_t)rows * sizeof *ex_y), *pa_y = malloc((size_t)rows * sizeof *pa_y);
    double *i8_y = malloc((size_t)rows * sizeof *i8_y), *c8_y = malloc((size_t)rows * sizeof *c8_y);
    double *x8_y = malloc((size_t)rows * sizeof *x8_y), *d_y = malloc((size_t)rows * sizeof *d_y);
    if (!xh || !codeh || !code8 || !xq || !xs || !ex_y || !pa_y || !i8_y || !c8_y || !x8_y || !d_y) {
        fprintf(stderr, "q4arith: out of memory\n");
        return 1;
    }
    for (int c = 0; c < cols; c++)
        xh[c] = h(x[c] * scale);
    for (int i = 0; i < 16; i++) {
        codeh[i] = h(qw->code[i]);
        code8[i] = (signed char)lrint(127.0 * qw->code[i]);
    }
    /* int8: x under one scale per 32 */
    for (int b = 0; b < cols / 32; b++) {
        float m = 0.0f;
        for (int c = 32 * b; c < 32 * b + 32; c++)
            m = fmaxf(m, fabsf(x[c]));
        xs[b] = m / 127.0f;
        for (int c = 32 * b; c < 32 * b + 32; c++)
            xq[c] = (signed char)(m > 0.0f ? lrintf(x[c] / xs[b]) : 0);
    }
    for (int r = 0; r < rows; r++) {
        double se = 0.0, sc = 0.0, sx = 0.0; /* exact; int8 codes alone; int8 inputs alone */
        float sp = 0.0f, si = 0.0f;
        for (int c0 = 0; c0 < cols; c0 += 32) { /* one chunk: 32 weights, one absmax (blocks of 64) */
            const size_t first = (size_t)r * cols + c0;
            const float am = qw->absmax[first / qw->block];
            float f[2];
            for (int half = 0; half < 2; half++) { /* two words: elements 16 half .. 16 half + 15 */
                float s0 = 0.0f, s1 = 0.0f; /* the half2 accumulator's two halves, fp16 values */
                for (int k = 0; k < 8; k++) {
                    const int e0 = c0 + 16 * half + 2 * k;
                    const uint8_t byte = data[(first + 16 * half + 2 * k) / 2];
                    const int hi = byte >> 4, lo = byte & 15; /* high nibble first */
                    s0 = h((double)codeh[hi] * xh[e0] + s0);
                    s1 = h((double)codeh[lo] * xh[e0 + 1] + s1);
                    se += (double)qw->code[hi] * am * x[e0] + (double)qw->code[lo] * am * x[e0 + 1];
                }
                f[half] = s0 + s1;
            }
            sp += (f[0] + f[1]) * am;
            int dot = 0;
            for (int k = 0; k < 32; k++) {
                const uint8_t byte = data[(first + k) / 2];
                const int n = k % 2 ? byte & 15 : byte >> 4;
                dot += code8[n] * xq[c0 + k];
                sc += code8[n] / 127.0 * am * x[c0 + k];
                sx += (double)qw->code[n] * am * xq[c0 + k] * xs[c0 / 32];
            }
            si += (float)dot * (am / 127.0f) * xs[c0 / 32];
        }
        double sd = 0.0; /* the unquantized weights: how far NF4 itself is */
        for (int c = 0; c < cols; c++)
            sd += (double)w[(size_t)r * cols + c] * x[c];
        d_y[r] = sd;
        ex_y[r] = se;
        pa_y[r] = sp / scale;
        i8_y[r] = si;
        c8_y[r] = sc;
        x8_y[r] = sx;
    }
    double ymax = 0.0, pmax = 0.0, imax = 0.0, prms = 0.0, irms = 0.0, crms = 0.0, xrms = 0.0, drms = 0.0;
    for (int r = 0; r < rows; r++)
        ymax = fmax(ymax, fabs(ex_y[r]));
    for (int r = 0; r < rows; r++) {
        const double pe = fabs(pa_y[r] - ex_y[r]) / ymax, ie = fabs(i8_y[r] - ex_y[r]) / ymax;
        pmax = fmax(pmax, pe), imax = fmax(imax, ie);
        prms += pe * pe, irms += ie * ie;
        crms += pow((c8_y[r] - ex_y[r]) / ymax, 2), xrms += pow((x8_y[r] - ex_y[r]) / ymax, 2);
        drms += pow((d_y[r] - ex_y[r]) / ymax, 2);
    }
    printf("q4arith: %d x %d nf4, error over max |y| (%.4g): pairs max %.2e rms %.2e; int8 max %.2e rms %.2e "
           "(rms of the codes alone %.2e, of the inputs alone %.2e); nf4 itself against the unquantized weights: rms "
           "%.2e\n",
           rows, cols, ymax, pmax, sqrt(prms / rows), imax, sqrt(irms / rows), sqrt(crms / rows), sqrt(xrms / rows),
           sqrt(drms / rows));
    q_weight_free(&q);
    free(w), free(x), free(xh), free(codeh), free(code8), free(xq), free(xs), free(ex_y), free(pa_y), free(i8_y);
    free(c8_y), free(x8_y), free(d_y);
    return 0;
}
