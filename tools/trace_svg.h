/*
 * trace_svg.h: a trace (the Chrome trace-event JSON that --trace writes)
 * drawn as one SVG timeline: a stand-in for a screenshot of Perfetto, which
 * cannot be taken offline, made from the trace's own data.
 *
 * The picture: a caption from the trace's metadata (model, device, plan,
 * budget); the whole run compressed, one row per track (the load, each
 * session's host or CPU track, the GPU's compute and copy engine, the CPU's
 * hosted layers), spans as boxes labelled where the label fits, nested
 * spans a level below their parent, and a time axis; the counters (KV cache
 * filled, device memory mapped and in use, host memory pinned) as step
 * charts on the same axis; then one decode step zoomed, so that each
 * layer's copy and compute and their overlap can be seen (the median step
 * by wall time after the first few, preferring steps the GPU timed).
 * Plain SVG 1.1: no script, no external files, fonts falling back to the
 * viewer's sans-serif.
 *
 * Each step box of the whole run and each span of the zoomed step carries
 * the event's exact values (<rect class="step" data-tid data-name data-ts
 * data-dur>, printed to 17 significant digits so that they read back as the
 * same doubles), and each counter series its largest value (data-counter,
 * data-series, data-max), so that a test can hold the picture against the
 * JSON. Used by infer, bench and perplexity (--trace-svg) and by the
 * trace_svg tool, which draws a trace written elsewhere.
 */
#ifndef ENGINE_TRACE_SVG_H
#define ENGINE_TRACE_SVG_H

#include <jansson.h>
#include <stdio.h>

/* What the writer found about its own layout (as plan_svg_stats): labels whose estimated boxes overlap. */
typedef struct trace_svg_stats {
    int n_labels;            /* text elements drawn                               */
    int n_overlaps;          /* pairs of them whose boxes overlap (should be 0)   */
    int n_outside;           /* ones reaching past the picture's edges (0)        */
    char first_problem[160]; /* the first such label's text                       */
    double width, height;    /* px                                                */
    int n_spans, n_tracks, n_counters; /* read from the trace                     */
    int zoom_event;          /* the zoomed step: its index in traceEvents; -1: none (or a GPU-timed pass) */
} trace_svg_stats;

/*
 * Draw the trace root (a trace-event object {"traceEvents": [...]}, or the
 * bare array form) to f. source, when not NULL, is named in the caption;
 * note, when not NULL, is a line of its own under the title (e.g. what the
 * picture stands in for). Returns 0; -2 when root is not a trace, or one
 * with no spans to draw; -1 when memory ran out or writing failed; with a
 * one-line reason in err. f stays open.
 */
int trace_svg_write(FILE *f, const json_t *root, const char *source, const char *note, trace_svg_stats *stats,
                    char *err, size_t err_size);

/*
 * Read the trace at json_path and draw it to svg_path (trace_svg_write).
 * Returns 0, or -1 with err set to one line naming the file at fault; a
 * picture that could not be finished is removed.
 */
int trace_svg_file(const char *json_path, const char *svg_path, const char *note, trace_svg_stats *stats,
                   char *err, size_t err_size);

#endif
