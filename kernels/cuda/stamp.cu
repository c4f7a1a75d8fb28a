/*
 * stamp.cu: the device's clock at points of a traced decode step. A stamp
 * waits for the kernel before it (programmatic launch: its wait), reads
 * %globaltimer (ns) and writes it to host memory the host reads once the
 * step is done: slot `slot` of the half of `ring` that the step's position
 * picks (*pos - back, modulo 2, as the argmax ring; back = 1 after the
 * argmax has moved the position on), or of none (pos NULL: slot of the
 * ring as a whole, for the host's calibration of the clock).
 *
 * It lets the kernel after it launch first thing: that one's own wait
 * still waits for the stamp, and so for the kernel before the stamp, but
 * its launch and its loads before the wait overlap as without stamps.
 * Letting it launch after the clock was read cost 4.8% of the 8B's decode
 * (34 stamps a step), bench/RESULTS.md.
 */
#include "common.cuh"

__global__ void k_stamp(unsigned long long *ring, const int32_t *pos, int back, int slot, int per_step)
{
    dependents_may_launch();
    dependency_wait();
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    ring[(pos ? (size_t)((*pos - back) & 1) * per_step : 0) + slot] = t;
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
