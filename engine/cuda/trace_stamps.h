/*
 * trace_stamps.h: a trace's spans for the decode steps the CUDA graph runs.
 * Events cannot be read per step without breaking the graph into pieces,
 * so while a trace is attached the decode graph is captured with
 * one-thread stamp kernels (kernels/cuda/stamp.cu) that write the device's
 * clock into pinned, mapped host memory: at the step's start and end, at
 * each layer's start, at a streamed layer's end of its wait for its copy,
 * at the head's start, and around each streamed copy on the copy stream
 * (stream.c). Once a step is done its stamps become a "GPU decode step"
 * span holding its layers, the head and the copy waits on the GPU's track,
 * and its copies on the copy engine's. docs/DESIGN.md, "Tracing".
 */
#ifndef ENGINE_CUDA_TRACE_STAMPS_H
#define ENGINE_CUDA_TRACE_STAMPS_H

#include "state.h"

/* A stamped step's slots, in its half of the ring: layer l's start at l, the head's at L, the end at
 * L + 1, the start at L + 2, a streamed layer's end of its wait for its copy at STAMP_READY(L, l),
 * then the j-th copy of the pass from STAMP_COPY(L, j) to STAMP_COPY(L, j) + 1. */
#define STAMP_START(L) ((L) + 2)
#define STAMP_READY(L, l) ((L) + 3 + (l))
#define STAMP_COPY(L, j) (2 * (L) + 3 + 2 * (j))

/* While a stamped graph is being captured, a stamp into slot of the step's half of the ring (back: 1
 * once the argmax has moved the position on); otherwise nothing. 0, or -1 with lc.err set. */
int trace_stamp(cuda_session *cs, int slot, int back);

/* Before a decode step is queued: capture the graphs with stamps while s has a trace, without them
 * otherwise (a change waits for the queued steps and drops the graphs). */
engine_status trace_stamps_follow(engine_session *s, err_buf *e);

/* The decode step at pos is done: where it ran a stamped graph, its spans into the trace. */
void trace_gpu_step(cuda_session *cs, const engine_session *s, int pos);

#endif
