/*
 * stamp.cu: the device's clock at points of a traced decode step. A stamp
 * waits for the kernel before it (programmatic launch: its wait), reads
 * %globaltimer (ns) and writes it to host memory the host reads once the
 * step is done: slot `slot` of the half of `ring` that the step's position
 * picks (*pos - back, modulo 2, as the argmax ring; back = 1 after the
 * argmax has moved the position on), or of none (pos NULL: slot of the
 * ring as a whole, for the host's calibration of the clock).
 */
#include "common.cuh"

__global__ void k_stamp(unsigned long long *ring, const int32_t *pos, int back, int slot, int per_step)
{
    dependency_wait();
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    ring[(pos ? (size_t)((*pos - back) & 1) * per_step : 0) + slot] = t;
    dependents_may_launch();
}

extern "C" int launch_stamp(launch_ctx *c, uint64_t *ring, const int32_t *pos, int back, int slot, int per_step)
{
    if (!ring || slot < 0 || per_step <= 0 || (pos && slot >= per_step) || back < 0 || back > 1)
        return launch_fail(c, "stamp: bad arguments (slot %d of %d)", slot, per_step);
    cudaError_t e = launch_pdl(c, k_stamp, dim3(1), dim3(1), 0, reinterpret_cast<unsigned long long *>(ring), pos,
                               back, slot, per_step);
    if (e != cudaSuccess)
        return launch_fail(c, "stamp: %s", cudaGetErrorString(e));
    return launch_check(c, "stamp");
}
