/*
 * measure.h: the figures the planner prices a plan with, measured on this
 * machine's device instead of assumed (ENGINE_PLAN_*_GBPS are an H100's):
 * the device's memory bandwidth, the pinned host-to-device rate, and the
 * rate at which host memory serves the copy engine and the CPU together
 * when hosted layers run beside streamed ones.
 *
 * Device memory for a measurement comes from a temporary arena of its own
 * (engine/cuda/arena.c), sized within the room the caller gives (the
 * budget less the CUDA context's share) and released before the model's
 * arena is made, so the budget is never exceeded.
 */
#ifndef ENGINE_CUDA_MEASURE_H
#define ENGINE_CUDA_MEASURE_H

#include <stdint.h>

#include "../model.h"

/* Device bytes a measurement may map under vram_budget (0: no budget, UINT64_MAX). */
uint64_t cuda_measure_room(uint64_t vram_budget);

/*
 * The current device's memory bandwidth (device-to-device copies, bytes
 * read + written a second) and pinned host-to-device rate, GB/s. Measured
 * once per device ordinal and process, then cached (a mutex-guarded
 * table; concurrent callers wait rather than measure at the same time).
 * OVER_BUDGET when room cannot hold buffers well past the L2 cache.
 */
engine_status cuda_measure_device(uint64_t room, double *device_gbps, double *h2d_gbps, err_buf *e);

/* Host memory read by the copy engine and the CPU at the same time. */
typedef struct cuda_shared_rates {
    double copy_gbps;   /* pinned host-to-device copies, while the CPU computes   */
    double host_gbps;   /* the CPU computing m's layers, while the copies run     */
    double shared_gbps; /* the sum: what the planner's shared_gbps takes          */
} cuda_shared_rates;

/*
 * Measured now (not cached: it depends on m and its threads): a thread
 * keeps 32 MiB copies from a 256 MiB pinned buffer in flight while this
 * thread computes m's last layers as cpu_layer_rate() does; each side's
 * bytes over the same interval.
 */
engine_status cuda_measure_shared(const engine_model *m, uint64_t room, cuda_shared_rates *r, err_buf *e);

/*
 * For the placement of m: pp's hbm_gbps and pcie_gbps (and their sources)
 * as measured, or as m's params gave them (GIVEN), else left at the
 * defaults, saying why in m's log (info: a small budget is a normal reason).
 */
void cuda_plan_bandwidths(engine_plan_params *pp, const engine_model *m, uint64_t room);

/* With pp's host_gbps set (hosted layers considered): pp's shared_gbps, measured (0 if that fails). */
void cuda_plan_shared(engine_plan_params *pp, const engine_model *m, uint64_t room);

#endif
