/*
 * paths.cu: which path each op takes on this device, decided in one table.
 *
 * Every op has a portable path that needs only compute capability 7.5
 * (Turing). Some also have a faster one that needs a later GPU: Hopper's
 * programmatic dependent launch and thread-block clusters, Ampere's bf16
 * and m16n8k16 tensor-core instructions, the sm_90a-only wgmma. A fast
 * path runs only where both the device and the code compiled for it have
 * the capability: the code's level is what the device actually runs (the
 * machine code for its capability, or the PTX the driver compiled), read
 * by a probe kernel that reports __CUDA_ARCH__. ENGINE_CUDA_CC caps the
 * capability believed, so that a Hopper GPU takes exactly the paths a
 * lesser one would; a cap below 7.5 makes the device unusable, as a
 * pre-Turing GPU is.
 *
 * Within a kernel, instructions that a level lacks (cp.async and redux.sync
 * before 8.0, griddepcontrol, mbarrier waits and clusters before 9.0) are
 * chosen by __CUDA_ARCH__ at compile time; the table below chooses between
 * kernels and launch forms at run time.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.cuh"

#ifndef ENGINE_CUDA_ARCHS
#define ENGINE_CUDA_ARCHS "unknown"
#endif

/* min_cc: the capability the fast path needs; exact: only that one (machine code of an "a" target). */
typedef struct k_path_row {
    const char *op, *fast, *portable;
    int min_cc;
    bool exact;
} k_path_row;

static const k_path_row k_paths[K_OP_COUNT] = {
    [K_OP_PDL] = {"decode kernel chain", "programmatic dependent launches (griddepcontrol)", "plain launches", 90,
                  false},
    [K_OP_ATTN_CLUSTER] = {"decode attention", "key splits in a thread-block cluster, merged in distributed shared memory",
                           "key splits in separate blocks, the last to finish merging through global memory", 90,
                           false},
    [K_OP_ATTN_PREFILL_TC] = {"prefill attention (16-bit cache)", "tensor cores (mma.sync m16n8k16)", "CUDA cores", 80,
                              false},
    [K_OP_GEMM_Q4] = {"4-bit prefill products", "fused decode into wgmma (sm_90a)",
                      "decoded into scratch, then cuBLASLt", 90, true},
    [K_OP_BF16] = {"bf16 weights", "bf16 products (cuBLASLt, tensor cores)",
                   "converted to fp16 once at load, fp16 products", 80, false},
    [K_OP_ATTN_DECODE_TC] = {"long-context decode attention (fp16, int8 or fp8 cache, head_dim 64 or 128)",
                             "tensor cores (mma.sync m16n8k16)", "CUDA cores", 80, false},
};

__device__ int k_arch_seen;
__global__ void k_arch_probe()
{
#ifdef __CUDA_ARCH__
    k_arch_seen = __CUDA_ARCH__ / 10;
#endif
}

/* ENGINE_CUDA_CC as 10 * major + minor ("75", "7.5", "90"); 0 when unset, -1 when unreadable. */
static int cap_from_env(void)
{
    const char *s = getenv("ENGINE_CUDA_CC");
    if (!s || !*s)
        return 0;
    int major = 0, minor = 0;
    char end = 0;
    if (sscanf(s, "%d.%d%c", &major, &minor, &end) == 2 && major > 0 && major < 100 && minor >= 0 && minor < 10)
        return 10 * major + minor;
    if (sscanf(s, "%d%c", &major, &end) == 1 && major >= 10 && major < 1000)
        return major;
    return -1;
}

extern "C" int launch_caps(int device, cuda_caps *caps, char *err, size_t err_size)
{
    memset(caps, 0, sizeof *caps);
    cudaDeviceProp prop;
    cudaError_t ce = cudaGetDeviceProperties(&prop, device);
    if (ce != cudaSuccess) {
        snprintf(err, err_size, "%s", cudaGetErrorString(ce));
        (void)cudaGetLastError();
        return -1;
    }
    snprintf(caps->name, sizeof caps->name, "%.63s", prop.name);
    caps->device_cc = 10 * prop.major + prop.minor;
    caps->smem_optin = prop.sharedMemPerBlockOptin;
    caps->cap_cc = cap_from_env();
    caps->archs = ENGINE_CUDA_ARCHS;
    if (caps->cap_cc < 0) {
        snprintf(err, err_size, "ENGINE_CUDA_CC=%s is not a compute capability (write it as 75, 8.6 or 90)",
                 getenv("ENGINE_CUDA_CC"));
        return -1;
    }
    const int seen = caps->cap_cc ? (caps->cap_cc < caps->device_cc ? caps->cap_cc : caps->device_cc) : caps->device_cc;
    if (seen < 75) {
        snprintf(err, err_size,
                 "%s has compute capability %d.%d%s; the engine needs 7.5 (Turing) or later (this build has code "
                 "for %s)",
                 prop.name, seen / 10, seen % 10, caps->cap_cc && caps->cap_cc < caps->device_cc ? " (ENGINE_CUDA_CC)" : "",
                 ENGINE_CUDA_ARCHS);
        return -1;
    }
    int current = -1;
    (void)cudaGetDevice(&current);
    if (current != device && (ce = cudaSetDevice(device)) != cudaSuccess) {
        snprintf(err, err_size, "%s", cudaGetErrorString(ce));
        (void)cudaGetLastError();
        return -1;
    }
    /* The level of the code this device runs: a launch fails here, not inside the engine, when there is none. */
    k_arch_probe<<<1, 1>>>();
    int code = 0;
    ce = cudaGetLastError();
    if (ce == cudaSuccess)
        ce = cudaMemcpyFromSymbol(&code, k_arch_seen, sizeof code);
    if (current >= 0 && current != device)
        (void)cudaSetDevice(current);
    if (ce != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(err, err_size, "%s has compute capability %d.%d and this build has no code it can run (%s; it has %s)",
                 prop.name, prop.major, prop.minor, cudaGetErrorString(ce), ENGINE_CUDA_ARCHS);
        return -1;
    }
    caps->code_cc = code;
    caps->cc = seen < code ? seen : code;
    return 0;
}

/* A block's shared memory at each capability (CUDA C Programming Guide, "Compute Capabilities"), so that
 * a capped device is held to what the lesser GPU offers; 0: the device's own. */
static size_t smem_at(int cc)
{
    switch (cc) {
    case 75: return 64 * 1024;
    case 80: case 87: return 163 * 1024;
    case 86: case 89: return 99 * 1024;
    case 90: return 227 * 1024;
    default: return 0;
    }
}

extern "C" void launch_paths(launch_ctx *c, const cuda_caps *caps)
{
    c->cc = caps->cc;
    const size_t at = smem_at(caps->cc);
    c->smem_max = at && at < caps->smem_optin ? at : caps->smem_optin;
    for (int op = 0; op < K_OP_COUNT; op++) {
        const k_path_row *r = &k_paths[op];
        bool fast = r->exact ? caps->cc == r->min_cc && caps->device_cc == r->min_cc : caps->cc >= r->min_cc;
        if (op == K_OP_GEMM_Q4)
            fast = fast && gemm_q4_supported();
        c->fast[op] = fast;
    }
}

extern "C" const char *launch_path_op(k_op op) { return op >= 0 && op < K_OP_COUNT ? k_paths[op].op : "?"; }

extern "C" const char *launch_path_name(const launch_ctx *c, k_op op)
{
    if (op < 0 || op >= K_OP_COUNT)
        return "?";
    return c->fast[op] ? k_paths[op].fast : k_paths[op].portable;
}

#ifndef ENGINE_HAVE_SM90A
/* Built without sm_90a code (an architecture list without 90): the fused 4-bit product does not exist. */
extern "C" bool gemm_q4_supported(void) { return false; }
extern "C" size_t gemm_q4_work_bytes(const launch_ctx *c, int nsub) { return 0; }
extern "C" int gemm_q4_tiles(const launch_ctx *c, const gemv_args *w, k_dtype xt, int n, const gemm_q4_work *work)
{
    return 0;
}
extern "C" int launch_gemm_q4(launch_ctx *c, float *y, bool accumulate, const void *x, k_dtype xt, const gemv_args *w,
                              int n, int nsub, const gemm_q4_work *work)
{
    return launch_fail(c, "gemm_q4: this build has no sm_90a code");
}
#endif
