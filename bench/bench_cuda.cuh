/*
 * bench_cuda.cuh: what the CUDA benchmark programs share: fail-fast checks
 * of CUDA and cuBLASLt calls, a median timer over device events, and the
 * prefill product as the engine runs it through cuBLASLt (bf16 in, fp32
 * out), optionally held to fewer multiprocessors.
 */
#ifndef ENGINE_BENCH_CUDA_CUH
#define ENGINE_BENCH_CUDA_CUH

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cublasLt.h>
#include <cuda_runtime.h>

#define BENCH_CK(x)                                                                                \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            std::fprintf(stderr, "%s: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__);      \
            std::exit(1);                                                                          \
        }                                                                                          \
    } while (0)
#define BENCH_CKL(x)                                                                               \
    do {                                                                                           \
        cublasStatus_t s_ = (x);                                                                   \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                         \
            std::fprintf(stderr, "%s: %s (line %d)\n", #x, cublasLtGetStatusString(s_), __LINE__); \
            std::exit(1);                                                                          \
        }                                                                                          \
    } while (0)

/* Median ms of `reps` runs of f() on stream st (one untimed run first), each timed with events. */
template <typename F> static double bench_ms(cudaStream_t st, int reps, F f)
{
    cudaEvent_t e0, e1;
    BENCH_CK(cudaEventCreate(&e0));
    BENCH_CK(cudaEventCreate(&e1));
    f();
    std::vector<float> v;
    for (int r = 0; r < reps; r++) {
        BENCH_CK(cudaEventRecord(e0, st));
        f();
        BENCH_CK(cudaEventRecord(e1, st));
        BENCH_CK(cudaEventSynchronize(e1));
        float ms;
        BENCH_CK(cudaEventElapsedTime(&ms, e0, e1));
        v.push_back(ms);
    }
    BENCH_CK(cudaEventDestroy(e0));
    BENCH_CK(cudaEventDestroy(e1));
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

/*
 * y[n, rows] = x[n, cols] . W[rows, cols]^T with x and W bf16, y fp32: the
 * engine's prefill product (kernels/cuda/gemm.c), the algorithm chosen once.
 * sm_target > 0: cuBLASLt's SM count target.
 */
struct bench_gemm {
    cublasLtHandle_t h;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulAlgo_t algo;
    void *ws;
    size_t ws_bytes = 64 << 20;
    bench_gemm(int n, int rows, int cols, int sm_target = 0)
    {
        BENCH_CKL(cublasLtCreate(&h));
        BENCH_CKL(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        const cublasOperation_t tr = CUBLAS_OP_T, nt = CUBLAS_OP_N;
        BENCH_CKL(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &tr, sizeof tr));
        BENCH_CKL(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &nt, sizeof nt));
        if (sm_target > 0)
            BENCH_CKL(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &sm_target,
                                                     sizeof sm_target));
        BENCH_CKL(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, cols, rows, cols));
        BENCH_CKL(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, cols, n, cols));
        BENCH_CKL(cublasLtMatrixLayoutCreate(&d, CUDA_R_32F, rows, n, rows));
        cublasLtMatmulPreference_t pref;
        BENCH_CKL(cublasLtMatmulPreferenceCreate(&pref));
        BENCH_CKL(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                       sizeof ws_bytes));
        cublasLtMatmulHeuristicResult_t res;
        int found = 0;
        BENCH_CKL(cublasLtMatmulAlgoGetHeuristic(h, desc, a, b, d, d, pref, 1, &res, &found));
        cublasLtMatmulPreferenceDestroy(pref);
        if (!found) {
            std::fprintf(stderr, "cuBLASLt has no algorithm for %d x %d x %d\n", n, rows, cols);
            std::exit(1);
        }
        algo = res.algo;
        BENCH_CK(cudaMalloc(&ws, ws_bytes));
    }
    ~bench_gemm()
    {
        cudaFree(ws);
        cublasLtMatrixLayoutDestroy(a);
        cublasLtMatrixLayoutDestroy(b);
        cublasLtMatrixLayoutDestroy(d);
        cublasLtMatmulDescDestroy(desc);
        cublasLtDestroy(h);
    }
    void run(float *y, const void *x, const void *w, cudaStream_t st)
    {
        const float alpha = 1.0f, beta = 0.0f;
        BENCH_CKL(cublasLtMatmul(h, desc, &alpha, w, a, x, b, &beta, y, d, y, d, &algo, ws, ws_bytes, st));
    }
};

#endif
