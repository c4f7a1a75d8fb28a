/* trace_stamps.c: the decode graph's clock stamps for a trace (trace_stamps.h). */
#include "trace_stamps.h"

#include <math.h>

#include "../trace.h"
#include "stream.h"

#define STAMP_CALIBRATIONS 5 /* brackets of the clock calibration, the narrowest kept */

int trace_stamp(cuda_session *cs, int slot, int back)
{
    return cs->stamping ? launch_stamp(&cs->lc, cs->d_stamps, cs->step + STEP_POS, back, slot, cs->stamp_per) : 0;
}

/*
 * The decode graphs carry stamps while a trace is attached, and none
 * otherwise: on a change the queued work is waited for and the graphs go,
 * captured again when next used. Turning them on makes the ring the first
 * time and calibrates the device's clock against the host's monotonic one
 * (the trace's): a stamp alone on the idle stream between two readings.
 */
engine_status trace_stamps_follow(engine_session *s, err_buf *e)
{
    cuda_session *cs = s->cuda;
    const bool want = s->trace != NULL;
    if (want == cs->graphs_stamped)
        return ENGINE_OK;
    const int per = STAMP_COPY(s->model->cfg.n_layers, stream_decode_copies(cs));
    cudaError_t ce = cudaStreamSynchronize(cs->lc.stream);
    if (ce == cudaSuccess)
        cuda_drop_graphs(cs);
    if (ce == cudaSuccess && want && !cs->h_stamps) {
        ce = cudaHostAlloc((void **)&cs->h_stamps, (2 * (size_t)per + 1) * sizeof(uint64_t), cudaHostAllocMapped);
        if (ce == cudaSuccess)
            ce = cudaHostGetDevicePointer((void **)&cs->d_stamps, cs->h_stamps, 0);
        if (ce != cudaSuccess && cs->h_stamps) {
            cudaFreeHost(cs->h_stamps);
            cs->h_stamps = cs->d_stamps = NULL;
        }
    }
    if (ce == cudaSuccess && want) {
        cs->stamp_per = per;
        /* The stamp lies somewhere between the two readings; the narrowest of
         * a few brackets bounds the offset's error best (on a loaded machine
         * one bracket's synchronisation alone can take a millisecond). */
        double width = INFINITY;
        for (int i = 0; i < STAMP_CALIBRATIONS && ce == cudaSuccess; i++) {
            const double t0 = model_seconds();
            if (launch_stamp(&cs->lc, cs->d_stamps, NULL, 0, 2 * per, 2 * per + 1))
                return cuda_launch_error(cs, e);
            ce = cudaStreamSynchronize(cs->lc.stream);
            const double t1 = model_seconds();
            const volatile uint64_t *ring = cs->h_stamps;
            if (ce == cudaSuccess && t1 - t0 < width) {
                width = t1 - t0;
                cs->stamp_offset_us = (t0 + t1) * 0.5e6 - (double)ring[2 * per] * 1e-3;
            }
        }
    }
    if (ce != cudaSuccess)
        return err_set(e, ENGINE_ERR_CUDA, "CUDA: the decode step's stamps: %s", cudaGetErrorString(ce));
    cs->graphs_stamped = want;
    cs->stamp_pending[0] = cs->stamp_pending[1] = false;
    return ENGINE_OK;
}

/*
 * The decode step at pos is done: where it ran a stamped graph, its spans
 * on the GPU's track, placed by the device's clock. The step's span holds
 * its layers' and the head's, which tile it (each from its stamp to the
 * next), so they nest and add up; the steps follow one another on the
 * stream and so do not overlap.
 */
void trace_gpu_step(cuda_session *cs, const engine_session *s, int pos)
{
    if (!cs->stamp_pending[pos & 1])
        return;
    cs->stamp_pending[pos & 1] = false;
    engine_trace *t = s->trace;
    if (!t)
        return;
    const int L = s->model->cfg.n_layers;
    const volatile uint64_t *g = cs->h_stamps + (size_t)(pos & 1) * cs->stamp_per;
    /* trace time = monotonic time - the trace's start; the stamps' monotonic time = ns / 1000 + offset. */
    const double shift = cs->stamp_offset_us - (model_seconds() * 1e6 - trace_now(t));
    const int tid = s->trace_gpu_tid;
#define AT(i) ((double)g[i] * 1e-3 + shift)
    trace_span_args(t, tid, "GPU decode step", -1, "step", AT(STAMP_START(L)), AT(L + 1) - AT(STAMP_START(L)),
                    "pos", pos, NULL, 0);
    for (int l = 0; l < L; l++) {
        trace_span_args(t, tid, "layer", l, "layer", AT(l), AT(l + 1) - AT(l), NULL, 0, NULL, 0);
        if (stream_waits(cs, l)) /* the layer's wait for its copy, in it */
            trace_span_args(t, tid, "copy wait of layer", l, "wait", AT(l), AT(STAMP_READY(L, l)) - AT(l), NULL, 0,
                            NULL, 0);
    }
    trace_span_args(t, tid, "head", -1, "layer", AT(L), AT(L + 1) - AT(L), NULL, 0, NULL, 0);
#undef AT
    stream_trace_stamped(cs, t, s->trace_copy_tid, g + STAMP_COPY(L, 0), shift);
}

