/*
 * cuda_test_util.h: what the CUDA kernel tests share: device buffers
 * poisoned with NaN, results brought back as fp32, the tolerances of the
 * output types, a one-thread CPU context for the reference ops, and the
 * launch context set up as the engine sets it (the capability, any
 * ENGINE_CUDA_CC cap, each op's path), printed.
 */
#ifndef ENGINE_TESTS_CUDA_TEST_UTIL_H
#define ENGINE_TESTS_CUDA_TEST_UTIL_H

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/dtype.h"
#include "kernels/kernels.h"
#include "kernels/kernels_cuda.h"
#include "test_random.h"
#include "test_util.h"

/* ENGINE_TEST_QUICK=1 (gpu_checks.sh under compute-sanitizer, which runs
 * kernels hundreds of times slower): the decode cases deeper than 1,100
 * positions are skipped; every kernel and path still runs, on fewer keys. */
static inline int test_quick(void)
{
    const char *q = getenv("ENGINE_TEST_QUICK");
    return q && *q && strcmp(q, "0") != 0;
}

static inline double rel_err_f(const float *got, const float *ref, size_t n)
{
    double *r = malloc(n * sizeof *r);
    for (size_t i = 0; i < n; i++)
        r[i] = ref[i];
    double e = rel_err(got, r, n);
    free(r);
    return e;
}

static inline void *dev_alloc(size_t bytes)
{
    void *d = NULL;
    CHECK(cudaMalloc(&d, bytes ? bytes : 1) == cudaSuccess);
    CHECK(cudaMemset(d, 0xff, bytes ? bytes : 1) == cudaSuccess); /* NaN in every float type */
    return d;
}

static inline void *dev_from(const void *h, size_t bytes)
{
    void *d = dev_alloc(bytes);
    cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice);
    return d;
}

static inline float *dev_copy(const float *h, size_t n)
{
    return dev_from(h, n * sizeof *h);
}

/* n elements of type t on the device, as fp32 on the host (malloc'd). */
static inline float *host_f32(const void *d, k_dtype t, size_t n)
{
    const size_t es = k_dtype_size(t);
    void *raw = malloc(n * es);
    float *out = malloc(n * sizeof *out);
    CHECK(cudaMemcpy(raw, d, n * es, cudaMemcpyDeviceToHost) == cudaSuccess);
    for (size_t i = 0; i < n; i++)
        out[i] = t == K_F32 ? ((float *)raw)[i]
               : t == K_BF16 ? bf16_to_f32(((uint16_t *)raw)[i]) : f16_to_f32(((uint16_t *)raw)[i]);
    free(raw);
    return out;
}

/* Rounding of an output stored in type t: the tolerance for it. */
static inline double out_tol(k_dtype t)
{
    return t == K_F32 ? 2e-5 : t == K_F16 ? 2e-3 : 1e-2;
}

static inline k_ctx cpu_ctx(int cols)
{
    k_ctx c = {1, NULL, 0};
    c.scratch_per_thread = k_matmul_scratch_floats(cols) + 65536;
    c.scratch = malloc(c.scratch_per_thread * sizeof(float));
    return c;
}

/*
 * The device's launch context with its paths (launch_caps, launch_paths),
 * its stream created. Returns 0, or 77 (skip) with a line saying why when
 * there is no usable device.
 */
static inline int cuda_test_setup(const char *name, launch_ctx *lc)
{
    int n = 0;
    cudaError_t ce = cudaGetDeviceCount(&n);
    if (ce != cudaSuccess || n == 0) {
        printf("%s: SKIP: no CUDA device (%s)\n", name, ce != cudaSuccess ? cudaGetErrorString(ce) : "none");
        return 77;
    }
    memset(lc, 0, sizeof *lc);
    cuda_caps caps;
    char why[256];
    if (launch_caps(0, &caps, why, sizeof why) != 0) {
        printf("%s: SKIP: %s\n", name, why);
        return 77;
    }
    launch_paths(lc, &caps);
    printf("%s: %s, compute capability %d (code %d, cap %d): paths for %d\n", name, caps.name, caps.device_cc,
           caps.code_cc, caps.cap_cc, caps.cc);
    for (int op = 0; op < K_OP_COUNT; op++)
        printf("  %s: %s\n", launch_path_op((k_op)op), launch_path_name(lc, (k_op)op));
    CHECK(cudaStreamCreate(&lc->stream) == cudaSuccess);
    cudaDeviceGetAttribute(&lc->n_sms, cudaDevAttrMultiProcessorCount, 0);
    return 0;
}

#endif
