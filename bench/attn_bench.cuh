/*
 * attn_bench.cuh: what the attention benchmarks (attn_decode, attn_prefill)
 * share: the engine's launch context on device 0, and caches of values
 * that are finite in every KV type.
 */
#ifndef ENGINE_ATTN_BENCH_CUH
#define ENGINE_ATTN_BENCH_CUH

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench_cuda.cuh"
#include "kernels/kernels_cuda.h"

/* The launch context as the engine sets it up (capability, ENGINE_CUDA_CC, the path table), on a stream of its
 * own; the device's properties in *prop. Exits with prog's message if there is no usable GPU. */
static launch_ctx attn_bench_ctx(const char *prog, cudaDeviceProp *prop)
{
    cuda_caps caps;
    char err[256];
    if (launch_caps(0, &caps, err, sizeof err)) {
        std::fprintf(stderr, "%s: %s\n", prog, err);
        std::exit(1);
    }
    launch_ctx lc = {};
    BENCH_CK(cudaStreamCreate(&lc.stream));
    BENCH_CK(cudaGetDeviceProperties(prop, 0));
    lc.n_sms = prop->multiProcessorCount;
    launch_paths(&lc, &caps);
    return lc;
}

/* `copies` caches of `rows` 16-bit elements each at dev, back to back: small fp16/bf16 numbers of both signs,
 * which read as bytes are int8/fp8 codes below 0x70 (finite in every type; 1-byte caches use the first half). */
static void attn_bench_fill(void *dev, size_t rows, int copies)
{
    std::vector<uint16_t> h(rows);
    for (size_t i = 0; i < rows; i++)
        h[i] = (uint16_t)((0x3000 + (i * 2654435761u >> 20) % 0x0c00) & 0xff6f) ^ (uint16_t)((i & 1) << 15);
    for (int c = 0; c < copies; c++)
        BENCH_CK(cudaMemcpy(static_cast<char *>(dev) + (size_t)c * rows * 2, h.data(), rows * 2,
                            cudaMemcpyHostToDevice));
}

#endif
