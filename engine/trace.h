/*
 * trace.h: the engine's side of engine_trace (engine.h), a recording of
 * spans and counters written as a Chrome trace-event file.
 *
 * Every hook takes the trace pointer first and does nothing when it is
 * NULL, so that the untraced path costs one branch. Times are
 * microseconds since the trace was created, on the monotonic clock
 * (trace_now); spans measured elsewhere (CUDA events) are placed on it by
 * the caller. A trace may be shared by a model and its sessions on
 * several threads: each call takes the trace's mutex.
 */
#ifndef ENGINE_TRACE_H
#define ENGINE_TRACE_H

#include <stdint.h>

#include "engine.h"

/* Microseconds since t was created (0 for NULL). */
double trace_now(const engine_trace *t);
/* A new track (a "thread" in the file) named name, a printf format that may take the
 * track's id once as %d; returns the id (0 for NULL). */
int trace_track(engine_trace *t, const char *name);
#define TRACE_MAX_ARGS 3

/*
 * Recording appends a small struct of pointers and numbers; only
 * engine_trace_save makes the JSON. Names, categories, argument keys and
 * counter series names must be static storage (string literals): a span
 * of a numbered thing (a layer) takes its number as index.
 */
/* A complete ("X") span on track tid, [ts, ts + dur) microseconds. */
void trace_span(engine_trace *t, int tid, const char *name, const char *cat, double ts, double dur);
/* The same named "name index" when index >= 0, with up to two numeric arguments (k NULL: none). */
void trace_span_args(engine_trace *t, int tid, const char *name, int index, const char *cat, double ts, double dur,
                     const char *k0, double v0, const char *k1, double v1);
/* A counter ("C") sample: series[i] = value[i] for i < n (at most TRACE_MAX_ARGS), at ts. */
void trace_counter(engine_trace *t, const char *name, double ts, const char *const *series, const double *value, int n);
/* A process-wide metadata entry (model, plan, device, budget): set once more replaces it. */
void trace_meta(engine_trace *t, const char *key, const char *value);
void trace_meta_num(engine_trace *t, const char *key, double value);

#endif
