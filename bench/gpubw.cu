/*
 * gpubw.cu: the GPU's memory bandwidth, the bound every decode figure is
 * divided by. Two measures, as in ../shared/HARDWARE.md: reading 4 GiB of
 * bf16 (a sum, so nothing is written) and a 4 GiB device-to-device copy
 * (bytes read + written). Median of 20 timed runs after warm-up.
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#define CHECK_CUDA(x)                                                              \
    do {                                                                           \
        cudaError_t e_ = (x);                                                      \
        if (e_ != cudaSuccess) {                                                   \
            std::fprintf(stderr, "gpubw: %s: %s\n", #x, cudaGetErrorString(e_));   \
            return 1;                                                              \
        }                                                                          \
    } while (0)

__global__ void read_sum(const uint4 *p, size_t n, float *out)
{
    float s = 0.0f;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint4 v = p[i];
        const __nv_bfloat16 *h = reinterpret_cast<const __nv_bfloat16 *>(&v);
        for (int k = 0; k < 8; k++)
            s += __bfloat162float(h[k]);
    }
    if (s == 12345.0f) /* never true for the data below; keeps the loads */
        *out = s;
}

int main()
{
    const size_t bytes = (size_t)4 << 30;
    void *a = nullptr, *b = nullptr;
    float *sink = nullptr;
    CHECK_CUDA(cudaMalloc(&a, bytes));
    CHECK_CUDA(cudaMalloc(&b, bytes));
    CHECK_CUDA(cudaMalloc(&sink, sizeof(float)));
    CHECK_CUDA(cudaMemset(a, 0x3c, bytes)); /* bf16 0x3c3c: about 0.0115 */
    int sms = 0;
    CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaEvent_t t0, t1;
    cudaEventCreate(&t0);
    cudaEventCreate(&t1);
    std::vector<float> rd, cp;
    for (int it = 0; it < 23; it++) {
        cudaEventRecord(t0);
        read_sum<<<sms * 8, 512>>>(static_cast<const uint4 *>(a), bytes / 16, sink);
        cudaEventRecord(t1);
        CHECK_CUDA(cudaEventSynchronize(t1));
        float ms = 0;
        cudaEventElapsedTime(&ms, t0, t1);
        if (it >= 3)
            rd.push_back(ms);
        cudaEventRecord(t0);
        CHECK_CUDA(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
        cudaEventRecord(t1);
        CHECK_CUDA(cudaEventSynchronize(t1));
        cudaEventElapsedTime(&ms, t0, t1);
        if (it >= 3)
            cp.push_back(ms);
    }
    std::sort(rd.begin(), rd.end());
    std::sort(cp.begin(), cp.end());
    cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    const double r = bytes / (rd[rd.size() / 2] * 1e-3) / 1e9, c = 2.0 * bytes / (cp[cp.size() / 2] * 1e-3) / 1e9;
    std::printf("{\"device\":\"%s\",\"read_gb_s\":%.1f,\"copy_gb_s\":%.1f}\n", prop.name, r, c);
    return 0;
}
