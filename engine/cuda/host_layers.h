/*
 * host_layers.h: decoder layers the CPU computes during decode (the plan's
 * ENGINE_PLACE_HOST placement), inside the decode graph.
 *
 * Such a layer lives in host memory like a streamed one, and prompts stream
 * it like one. A decode step skips its copy, whose PCIe time is most of a
 * streamed layer's cost, and the CPU computes it while the copy engine
 * uploads the streamed layers after it. Only its matrix products run on the
 * host; its attention (so the KV cache, RoPE, q/k norms and the q/k/v
 * biases) stays on the GPU, and the two sides trade vectors:
 *
 *   x ─D2H─> CPU: rmsnorm, q/k/v products ─H2D─> GPU: attention ─D2H─>
 *   CPU: o product + residual, feed-forward + residual ─H2D─> x
 *
 * (x stays on the host across consecutive hosted layers). The vectors move
 * by small kernels reading and writing mapped pinned memory, not by copies:
 * those would queue behind the streamed layers' uploads on the copy engine
 * (measured: 56 ms a token of such waits with 11 hosted 8B layers). The CPU's work
 * runs in host nodes of the graph (cudaLaunchHostFunc), on the driver's
 * callback thread, which leads an OpenMP team of the model's threads but
 * one (the thread waiting for the step keeps a core).
 */
#ifndef ENGINE_CUDA_HOST_LAYERS_H
#define ENGINE_CUDA_HOST_LAYERS_H

#include "state.h"

typedef struct host_layers host_layers;

/* Pinned vectors and scratch for s's hosted layers (only when the model has some). */
engine_status host_layers_create(const engine_session *s, host_layers **out, err_buf *e);
void host_layers_free(host_layers *h);

/*
 * The launches of hosted layer l around its attention, on lc's stream:
 * before: q/k/v of x into qkv (fetch_x: copy x from the device first);
 * after: the rest of the layer from att (put_x: copy x back to the device
 * after). 0, or -1 with lc->err set.
 */
int host_layer_before(host_layers *h, launch_ctx *lc, int l, const float *x, float *qkv, bool fetch_x);
int host_layer_after(host_layers *h, launch_ctx *lc, int l, const float *att, float *x, bool put_x);

/*
 * A split expert layer l (its experts from `from` on in host memory), in a
 * decode step after the routing: x (the MLP's input before its norm) and
 * the k choices ids cross to the host, whose CPU runs the choices of
 * experts >= from, and their outputs come back into those rows of ys
 * [k, dim] (the device's expert product skips them, GEMV_EXPERT_ABSENT).
 */
int host_experts(host_layers *h, launch_ctx *lc, int l, int from, const float *x, const int32_t *ids, float *ys);

/* Seconds the CPU spent in hosted layers since the last call, for the offload report. */
double host_layers_take_seconds(host_layers *h);

#endif
