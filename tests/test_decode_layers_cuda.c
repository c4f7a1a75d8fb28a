/*
 * test_decode_layers_cuda.c: the persistent decode kernel (every layer of a
 * decode step in one launch, 4-bit weights) against the CPU's ops
 * (kernels.h) on fresh random layers, caches and input: the residual
 * stream after all layers, every layer's new cache rows, the maximum the
 * head's product is left, and the same bits on a second run. Scratch
 * buffers are poisoned with NaN first. Skips (77) without a GPU or where
 * the kernel does not run (before compute capability 9.0).
 */
#define _POSIX_C_SOURCE 200809L

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/dtype.h"
#include "kernels/kernels.h"
#include "kernels/kernels_cuda.h"
#include "quant/quant.h"
#include "test_random.h"
#include "test_util.h"

typedef struct shape {
    int dim, nh, nkv, hd, ffn, layers, pos;
} shape;

/* Relative max error of got against ref (fp32), as rel_err. */
static double rel_err_f32(const float *got, const float *ref, size_t n)
{
    double *r = malloc(n * sizeof *r);
    for (size_t i = 0; i < n; i++)
        r[i] = ref[i];
    const double e = rel_err(got, r, n);
    free(r);
    return e;
}

static void *dev_from(const void *h, size_t bytes)
{
    void *d = NULL;
    CHECK(cudaMalloc(&d, bytes) == cudaSuccess);
    CHECK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice) == cudaSuccess);
    return d;
}

static void *dev_poisoned(size_t bytes)
{
    void *d = NULL;
    CHECK(cudaMalloc(&d, bytes) == cudaSuccess);
    CHECK(cudaMemset(d, 0xff, bytes) == cudaSuccess); /* NaN */
    return d;
}

/* A random [rows, cols] matrix quantized by the CPU reference; its device copies (data, absmax) into dw, da. */
static void make_matrix(k_dtype type, int rows, int cols, q_weight *qw, void **dw, float **da)
{
    const size_t n = (size_t)rows * cols;
    float *v = malloc(n * sizeof *v);
    fill(v, n, 1.7 / sqrt((double)cols));
    k_weight src = {v, K_F32, rows, cols};
    q_spec spec = {.type = type};
    err_buf e = {0};
    CHECK_MSG(q_quantize_weight(&src, &spec, 2, qw, "test", &e) == ENGINE_OK, "%s", e.msg);
    *dw = dev_from(qw->w.data, n / 2);
    *da = dev_from(qw->w.absmax, n / qw->w.block * sizeof(float));
    free(v);
}

/* head: ask for the head's input maximum (else head_max NULL, as for a 16-bit head). */
static void check_decode_layers(launch_ctx *lc, k_dtype type, shape s, bool head)
{
    const int L = s.layers, dim = s.dim, hd = s.hd, half = hd / 2, qd = s.nh * hd, kvd = s.nkv * hd;
    const int qkvd = qd + 2 * kvd, ffn = s.ffn, pos = s.pos, ctx = pos + 1;
    q_weight *qw = calloc((size_t)L * 4, sizeof *qw);
    decode_layer_w *tab = calloc((size_t)L, sizeof *tab);
    float **norms = calloc((size_t)L * 2, sizeof *norms), **kc = calloc((size_t)L, sizeof *kc),
          **vc = calloc((size_t)L, sizeof *vc);
    void **dev = calloc((size_t)L * 12, sizeof *dev); /* every device buffer of the layers, to free */
    uint16_t *h16 = malloc((size_t)ctx * kvd * sizeof *h16);
    for (int l = 0; l < L; l++) {
        const int rows[4] = {qkvd, dim, 2 * ffn, dim}, cols[4] = {dim, qd, dim, ffn};
        void *dw[4];
        float *da[4];
        for (int k = 0; k < 4; k++) {
            make_matrix(type, rows[k], cols[k], &qw[l * 4 + k], &dw[k], &da[k]);
            dev[l * 12 + 2 * k] = dw[k];
            dev[l * 12 + 2 * k + 1] = da[k];
        }
        for (int k = 0; k < 2; k++) {
            norms[l * 2 + k] = malloc((size_t)dim * sizeof(float));
            for (int i = 0; i < dim; i++)
                norms[l * 2 + k][i] = (float)(1.0 + 0.3 * urand());
            dev[l * 12 + 8 + k] = dev_from(norms[l * 2 + k], (size_t)dim * sizeof(float));
        }
        /* The cache: random fp16 rows before pos (the CPU sees the stored values); row pos poisoned. */
        float *caches[2];
        for (int k = 0; k < 2; k++) {
            caches[k] = malloc((size_t)ctx * kvd * sizeof(float));
            fill(caches[k], (size_t)ctx * kvd, k ? 1.0 : 1.5);
            for (size_t i = 0; i < (size_t)ctx * kvd; i++) {
                h16[i] = (size_t)pos * kvd <= i ? 0xffff : f32_to_f16(caches[k][i]);
                caches[k][i] = f16_to_f32(h16[i]);
            }
            dev[l * 12 + 10 + k] = dev_from(h16, (size_t)ctx * kvd * sizeof *h16);
        }
        kc[l] = caches[0];
        vc[l] = caches[1];
        tab[l] = (decode_layer_w){.wqkv = dw[0], .wo = dw[1], .wgu = dw[2], .wdown = dw[3], .aqkv = da[0],
                                  .ao = da[1], .agu = da[2], .adown = da[3], .attn_norm = dev[l * 12 + 8],
                                  .ffn_norm = dev[l * 12 + 9], .k_cache = dev[l * 12 + 10],
                                  .v_cache = dev[l * 12 + 11]};
    }
    float *x0 = malloc((size_t)dim * sizeof *x0), *hnorm = malloc((size_t)dim * sizeof *hnorm);
    fill(x0, (size_t)dim, 1.0);
    for (int i = 0; i < dim; i++)
        hnorm[i] = (float)(1.0 + 0.3 * urand());
    float *cs = malloc((size_t)ctx * half * sizeof *cs), *sn = malloc((size_t)ctx * half * sizeof *sn);
    for (int p = 0; p < ctx; p++)
        for (int i = 0; i < half; i++) {
            const double ang = p * pow(500000.0, -2.0 * i / hd);
            cs[p * half + i] = (float)cos(ang);
            sn[p * half + i] = (float)sin(ang);
        }

    /* GPU */
    const size_t part = decode_layers_part_floats(lc, s.nh, s.nkv, hd), sync = decode_layers_sync_words(L, s.nkv);
    decode_layers_args a = {.layers = dev_from(tab, (size_t)L * sizeof *tab), .n_layers = L, .dim = dim,
                            .n_heads = s.nh, .n_kv_heads = s.nkv, .head_dim = hd, .ffn_dim = ffn, .n_ctx = ctx,
                            .group = qw[0].w.block, .eps = 1e-5f, .code = dev_from(qw[0].w.code, 16 * sizeof(float)),
                            .cos = dev_from(cs, (size_t)ctx * half * sizeof *cs),
                            .sin = dev_from(sn, (size_t)ctx * half * sizeof *sn), .pos = dev_from(&pos, sizeof pos),
                            .x = dev_from(x0, (size_t)dim * sizeof *x0), .qkv = dev_poisoned((size_t)qkvd * 4),
                            .att = dev_poisoned((size_t)qd * 4), .gu = dev_poisoned((size_t)ffn * 4),
                            .part = dev_poisoned(part * 4), .sync = dev_poisoned(sync * 4),
                            .head_max = head ? dev_poisoned(4) : NULL,
                            .head_norm = head ? dev_from(hnorm, (size_t)dim * sizeof *hnorm) : NULL};
    CHECK_MSG(decode_layers_supported(lc, &a), "decode_layers: %s", lc->err);
    float *got[2];
    uint32_t hmax[2];
    for (int run = 0; run < 2; run++) { /* the second from the same inputs: the same bits */
        CHECK(cudaMemcpy((void *)a.x, x0, (size_t)dim * sizeof *x0, cudaMemcpyHostToDevice) == cudaSuccess);
        hmax[run] = 0;
        if (head)
            CHECK(cudaMemset(a.head_max, 0, 4) == cudaSuccess);
        CHECK_MSG(launch_decode_layers(lc, &a) == 0, "decode_layers: %s", lc->err);
        CHECK(cudaStreamSynchronize(lc->stream) == cudaSuccess);
        got[run] = malloc((size_t)dim * sizeof(float));
        CHECK(cudaMemcpy(got[run], a.x, (size_t)dim * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
        if (head)
            CHECK(cudaMemcpy(&hmax[run], a.head_max, 4, cudaMemcpyDeviceToHost) == cudaSuccess);
    }
    CHECK_MSG(!memcmp(got[0], got[1], (size_t)dim * sizeof(float)) && hmax[0] == hmax[1],
              "decode_layers: a second run gave other bits");

    /* CPU, layer by layer */
    k_ctx kx = {1, NULL, 0};
    kx.scratch_per_thread = k_matmul_scratch_floats(ffn > dim ? ffn : dim) + (size_t)ctx + 65536;
    kx.scratch = malloc(kx.scratch_per_thread * sizeof(float));
    float *x = malloc((size_t)dim * sizeof *x), *xn = malloc((size_t)dim * sizeof *xn);
    float *qkv = malloc((size_t)qkvd * sizeof *qkv), *att = malloc((size_t)qd * sizeof *att);
    float *gu = malloc((size_t)2 * ffn * sizeof *gu), *y = malloc((size_t)dim * sizeof *y);
    memcpy(x, x0, (size_t)dim * sizeof *x);
    const k_weight none = {NULL, K_F32, 0, 0};
    const int p1[1] = {pos};
    double err_kv = 0.0;
    for (int l = 0; l < L; l++) {
        k_weight an = {norms[l * 2], K_F32, 1, dim}, fn = {norms[l * 2 + 1], K_F32, 1, dim};
        k_rmsnorm(&kx, xn, x, 1, dim, &an, 1e-5f);
        k_matmul(&kx, qkv, xn, 1, &qw[l * 4].w, &none);
        k_rope(&kx, qkv, 1, s.nh, hd, p1, cs, sn);
        k_rope(&kx, qkv + qd, 1, s.nkv, hd, p1, cs, sn);
        float *krow = kc[l] + (size_t)pos * kvd, *vrow = vc[l] + (size_t)pos * kvd;
        for (int i = 0; i < kvd; i++) {
            krow[i] = f16_to_f32(f32_to_f16(qkv[qd + i]));
            vrow[i] = f16_to_f32(f32_to_f16(qkv[qd + kvd + i]));
        }
        /* the kernel's new rows */
        float *gk = malloc((size_t)kvd * sizeof *gk), *gv = malloc((size_t)kvd * sizeof *gv);
        for (int k = 0; k < 2; k++) {
            CHECK(cudaMemcpy(h16, (char *)dev[l * 12 + 10 + k] + (size_t)pos * kvd * 2, (size_t)kvd * 2,
                             cudaMemcpyDeviceToHost) == cudaSuccess);
            for (int i = 0; i < kvd; i++)
                (k ? gv : gk)[i] = f16_to_f32(h16[i]);
        }
        err_kv = fmax(err_kv, fmax(rel_err_f32(gk, krow, (size_t)kvd), rel_err_f32(gv, vrow, (size_t)kvd)));
        free(gk), free(gv);
        k_attention(&kx, att, qkv, kc[l], vc[l], 1, pos, s.nh, s.nkv, hd, 0);
        k_matmul(&kx, y, att, 1, &qw[l * 4 + 1].w, &none);
        k_add(&kx, x, y, (size_t)dim);
        k_rmsnorm(&kx, xn, x, 1, dim, &fn, 1e-5f);
        k_matmul(&kx, gu, xn, 1, &qw[l * 4 + 2].w, &none);
        k_swiglu(&kx, gu, gu + ffn, (size_t)ffn);
        k_matmul(&kx, y, gu, 1, &qw[l * 4 + 3].w, &none);
        k_add(&kx, x, y, (size_t)dim);
    }
    /* The products multiply in fp16 (gemv.cu's analysis: 1-2 units of 2^-11
     * of max |y| a product), and the layers carry each other's errors; a
     * wrong tile, row, key or merge is off by O(0.1-1). */
    const double err = rel_err_f32(got[0], x, (size_t)dim);
    float want = 0.0f;
    for (int i = 0; i < dim; i++)
        want = fmaxf(want, fabsf(got[0][i] * hnorm[i]));
    uint32_t wbits;
    memcpy(&wbits, &want, sizeof wbits);
    if (!head)
        wbits = 0;
    CHECK_MSG(err < 6e-3 && err_kv < 1e-2 && hmax[0] == wbits,
              "decode_layers %s dim %d heads %d/%d hd %d ffn %d layers %d pos %d: x %.2e, new k/v %.2e, head max %s",
              type == K_NF4 ? "nf4" : "fp4", dim, s.nh, s.nkv, hd, ffn, L, pos, err, err_kv,
              hmax[0] == wbits ? "ok" : "wrong");
    printf("decode_layers %s dim %d heads %d/%d hd %d ffn %d layers %d pos %d: x %.2e, new k/v %.2e\n",
           type == K_NF4 ? "nf4" : "fp4", dim, s.nh, s.nkv, hd, ffn, L, pos, err, err_kv);

    free(x), free(xn), free(qkv), free(att), free(gu), free(y), free(kx.scratch), free(got[0]), free(got[1]);
    for (int l = 0; l < L; l++) {
        for (int k = 0; k < 4; k++)
            q_weight_free(&qw[l * 4 + k]);
        for (int k = 0; k < 12; k++)
            cudaFree(dev[l * 12 + k]);
        free(norms[l * 2]), free(norms[l * 2 + 1]), free(kc[l]), free(vc[l]);
    }
    const void *bufs[] = {a.layers, a.code, a.cos, a.sin, a.pos, a.x, a.qkv, a.att, a.gu, a.part, a.sync,
                          a.head_max, a.head_norm};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        cudaFree((void *)bufs[i]);
    free(qw), free(tab), free(norms), free(kc), free(vc), free(dev), free(h16), free(x0), free(hnorm), free(cs), free(sn);
}

int main(void)
{
    int n = 0;
    cudaError_t ce = cudaGetDeviceCount(&n);
    if (ce != cudaSuccess || n == 0) {
        printf("test_decode_layers_cuda: SKIP: no CUDA device (%s)\n",
               ce != cudaSuccess ? cudaGetErrorString(ce) : "none");
        return 77;
    }
    int major = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
    if (major < 9) {
        printf("test_decode_layers_cuda: SKIP: compute capability %d.x (the kernel needs 9.0)\n", major);
        return 77;
    }
    test_rng_state = 0x9e3779b97f4a7c15ull;
    launch_ctx lc;
    memset(&lc, 0, sizeof lc);
    CHECK(cudaStreamCreate(&lc.stream) == cudaSuccess);
    cudaDeviceGetAttribute(&lc.n_sms, cudaDevAttrMultiProcessorCount, 0);
    /* small; a 1B-like width (down tiles of 4 pairs); keys spanning several ring slots a split; a group of 8 q
     * heads; the 8B's head_dim and widest rows (down tiles of 2 pairs); the first position (last: no head maximum) */
    static const shape shapes[] = {
        {256, 8, 1, 32, 512, 2, 37},   {512, 8, 2, 64, 8192, 2, 300},   {256, 4, 2, 64, 768, 1, 5000},
        {512, 16, 2, 32, 1024, 3, 129}, {512, 4, 1, 128, 14336, 2, 700}, {1024, 8, 2, 128, 2048, 2, 22},
        {256, 8, 2, 32, 512, 1, 0},
    };
    const size_t ns = sizeof shapes / sizeof shapes[0];
    for (size_t i = 0; i < ns; i++)
        check_decode_layers(&lc, K_NF4, shapes[i], i + 1 < ns);
    check_decode_layers(&lc, K_FP4, shapes[1], true);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    cudaStreamDestroy(lc.stream);
    return test_finish("test_decode_layers_cuda");
}
