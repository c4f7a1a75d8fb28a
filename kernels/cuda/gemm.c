/*
 * gemm.c: the dense matrix products of prefill, through cuBLASLt.
 *
 * Row-major y[n, rows] = x[n, cols] . W[rows, cols]^T is, in cuBLASLt's
 * column-major terms, D[rows, n] = op_T(A[cols, rows]) . B[cols, n]: the
 * "TN" product, with W and x used in place. Descriptors and the chosen
 * algorithm are kept per shape, so a prefill of 32 layers asks the
 * heuristic once per distinct shape, not once per call.
 */
#include <stdlib.h>
#include <string.h>

#include <cublasLt.h>

#include "../kernels_cuda.h"

#define GEMM_PLANS 32

typedef struct gemm_plan {
    int used;
    k_dtype wt;
    int n, rows, cols;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulAlgo_t algo;
} gemm_plan;

typedef struct gemm_state {
    cublasLtHandle_t handle;
    gemm_plan plans[GEMM_PLANS];
    int next; /* plan slot to reuse when all are taken */
} gemm_state;

static int lt_fail(launch_ctx *c, const char *what, cublasStatus_t s)
{
    return launch_fail(c, "gemm: %s: %s", what, cublasLtGetStatusString(s));
}

int launch_gemm_create(launch_ctx *c)
{
    gemm_state *g = calloc(1, sizeof *g);
    if (!g)
        return launch_fail(c, "gemm: out of memory");
    cublasStatus_t s = cublasLtCreate(&g->handle);
    if (s != CUBLAS_STATUS_SUCCESS) {
        free(g);
        return lt_fail(c, "cublasLtCreate", s);
    }
    c->lt = g;
    return 0;
}

static void plan_clear(gemm_plan *p)
{
    if (!p->used)
        return;
    cublasLtMatrixLayoutDestroy(p->a);
    cublasLtMatrixLayoutDestroy(p->b);
    cublasLtMatrixLayoutDestroy(p->d);
    cublasLtMatmulDescDestroy(p->desc);
    memset(p, 0, sizeof *p);
}

void launch_gemm_destroy(launch_ctx *c)
{
    gemm_state *g = c ? c->lt : NULL;
    if (!g)
        return;
    for (int i = 0; i < GEMM_PLANS; i++)
        plan_clear(&g->plans[i]);
    cublasLtDestroy(g->handle);
    free(g);
    c->lt = NULL;
}

static cudaDataType_t cuda_type(k_dtype t)
{
    return t == K_BF16 ? CUDA_R_16BF : t == K_F16 ? CUDA_R_16F : CUDA_R_32F;
}

static int make_plan(launch_ctx *c, gemm_state *g, gemm_plan *p, k_dtype wt, int n, int rows, int cols)
{
    memset(p, 0, sizeof *p);
    const cudaDataType_t in = cuda_type(wt);
    /* Pure fp32 arithmetic for fp32 weights (no TF32): the fp32 path must
     * match the CPU backend's greedy choices. */
    cublasStatus_t s = cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (s != CUBLAS_STATUS_SUCCESS)
        return lt_fail(c, "descriptor", s);
    const cublasOperation_t tr = CUBLAS_OP_T, nt = CUBLAS_OP_N;
    cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &tr, sizeof tr);
    cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &nt, sizeof nt);
    if ((s = cublasLtMatrixLayoutCreate(&p->a, in, (uint64_t)cols, (uint64_t)rows, cols)) != CUBLAS_STATUS_SUCCESS ||
        (s = cublasLtMatrixLayoutCreate(&p->b, in, (uint64_t)cols, (uint64_t)n, cols)) != CUBLAS_STATUS_SUCCESS ||
        (s = cublasLtMatrixLayoutCreate(&p->d, CUDA_R_32F, (uint64_t)rows, (uint64_t)n, rows)) !=
            CUBLAS_STATUS_SUCCESS) {
        p->used = 1;
        plan_clear(p);
        return lt_fail(c, "matrix layout", s);
    }
    p->used = 1;
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    size_t ws = c->workspace_bytes;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    s = cublasLtMatmulAlgoGetHeuristic(g->handle, p->desc, p->a, p->b, p->d, p->d, pref, 1, &res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (s != CUBLAS_STATUS_SUCCESS || found == 0) {
        plan_clear(p);
        return launch_fail(c, "gemm: cuBLASLt has no algorithm for %s x[%d, %d] . W[%d, %d]^T: %s",
                           wt == K_BF16 ? "bf16" : wt == K_F16 ? "f16" : "f32", n, cols, rows, cols,
                           cublasLtGetStatusString(s));
    }
    p->algo = res.algo;
    p->wt = wt;
    p->n = n;
    p->rows = rows;
    p->cols = cols;
    return 0;
}

int launch_gemm(launch_ctx *c, float *y, bool accumulate, const void *x, const void *w, k_dtype wt, int n, int rows,
                int cols)
{
    gemm_state *g = c->lt;
    if (!g)
        return launch_fail(c, "gemm: no cuBLASLt handle (launch_gemm_create)");
    if (!y || !x || !w || n <= 0 || rows <= 0 || cols <= 0)
        return launch_fail(c, "gemm: bad arguments (n %d, rows %d, cols %d)", n, rows, cols);
    gemm_plan *p = NULL;
    for (int i = 0; i < GEMM_PLANS && !p; i++) {
        gemm_plan *q = &g->plans[i];
        if (q->used && q->wt == wt && q->n == n && q->rows == rows && q->cols == cols)
            p = q;
    }
    if (!p) {
        int slot = -1;
        for (int i = 0; i < GEMM_PLANS && slot < 0; i++)
            if (!g->plans[i].used)
                slot = i;
        if (slot < 0) {
            slot = g->next;
            g->next = (g->next + 1) % GEMM_PLANS;
            plan_clear(&g->plans[slot]);
        }
        p = &g->plans[slot];
        if (make_plan(c, g, p, wt, n, rows, cols) != 0)
            return -1;
    }
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    cublasStatus_t s = cublasLtMatmul(g->handle, p->desc, &alpha, w, p->a, x, p->b, &beta, y, p->d, y, p->d,
                                      &p->algo, c->workspace, c->workspace_bytes, c->stream);
    if (s != CUBLAS_STATUS_SUCCESS)
        return lt_fail(c, "cublasLtMatmul", s);
    return 0;
}
