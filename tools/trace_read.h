/*
 * trace_read.h: a trace-event file read for drawing (trace_svg.c): its
 * spans by track with their nesting levels, its tracks in the viewers'
 * order, its counters as series, and the step worth zooming into. Strings
 * point into the JSON, which must outlive what is read from it.
 */
#ifndef ENGINE_TRACE_READ_H
#define ENGINE_TRACE_READ_H

#include <jansson.h>
#include <stddef.h>

#define MAX_LEVELS 3 /* nesting levels drawn; deeper spans share the last */

enum { K_OTHER, K_LOAD, K_SESSION, K_GPU, K_COPY, K_HOST };

typedef struct span {
    const char *name, *cat; /* the JSON's strings, alive as long as the root */
    double ts, dur;         /* microseconds                                  */
    int tid, track, level;
    int event;              /* index in traceEvents                          */
} span;

typedef struct track {
    int tid;
    double sort;
    const char *name; /* NULL: no thread_name event */
    int kind, levels, n_spans;
} track;

#define MAX_SERIES 4
typedef struct counter {
    const char *name;
    const char *series[MAX_SERIES];
    int n_series, n, cap;
    double *ts;  /* [n]              */
    double *v;   /* [n][MAX_SERIES]  */
} counter;

typedef struct trace_data {
    span *sp;
    int n_sp;
    track *tr;
    int n_tr;
    counter *ct;
    int n_ct;
    double t_end; /* the last span's or sample's end, microseconds */
    const json_t *meta;
} trace_data;


/* The events of root into d (zeroed by the caller); 0, or -1 with a one-line reason in err. */
int trace_read(const json_t *root, trace_data *d, char *err, size_t n);
void trace_data_free(trace_data *d);

typedef struct zoom {
    double t0, t1;      /* the window, microseconds                          */
    const span *step;   /* the host's step span; NULL: a pass the GPU timed alone */
    int index, count;   /* its place among the candidates (1-based), how many */
    int skipped;        /* the first candidates left out of the median       */
    const char *what;   /* the candidates, in words                          */
} zoom;


/* Choose the step to zoom into: 1 with z filled, 0 when the trace has no step, -1 out of memory. */
int trace_pick_zoom(const trace_data *d, zoom *z);

/* Does span s overlap [t0, t1)? */
int trace_overlaps(const span *s, double t0, double t1);
/* The spans of track k: [*first, returned end) of d->sp (sorted by track). */
int trace_track_spans(const trace_data *d, int k, int *first);
/* Time a track worked in [t0, t1): its outermost spans that are not steps (they nest, so they do not overlap),
 * less the waits in them (cat "wait": a layer's wait for its copy). */
double trace_busy(const trace_data *d, int k, double t0, double t1);
/* Time two tracks worked at once in [t0, t1), as trace_busy counts work. */
double trace_together(const trace_data *d, int k1, int k2, double t0, double t1);

#endif
