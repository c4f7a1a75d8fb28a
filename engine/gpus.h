/*
 * gpus.h: the engine's side of gpus.c (the public side is engine.h's
 * "known GPUs" section and engine_device_bandwidths).
 */
#ifndef ENGINE_GPUS_H
#define ENGINE_GPUS_H

/*
 * The test override of every measured figure, ENGINE_MEASURED_GBPS=
 * "DEVICE,H2D[,SHARED]" (GB/s, each above 0; SHARED absent: 0): 0 when
 * unset, 1 when set and valid (the figures in the out-parameters), -1
 * when malformed.
 */
int gpus_measured_override(double *device_gbps, double *h2d_gbps, double *shared_gbps);

#endif
