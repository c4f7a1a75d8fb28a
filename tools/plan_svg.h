/*
 * plan_svg.h: the offload plan as one SVG picture (infer --dry-run --svg,
 * infer --report --svg): the --vram budget as a bar filled by its parts,
 * the bytes and time a decoded token moves over PCIe and device memory and
 * the decode bound they give, one row per layer coloured by placement, and,
 * after a run that streamed layers, the measured copy, compute and overlap
 * per pass against the plan. Plain SVG 1.1: no script, no external files,
 * fonts falling back to the viewer's sans-serif.
 *
 * Every number drawn from the plan sits in a <tspan data-key="PATH"
 * data-value="V">, PATH being where `infer --dry-run --json` prints the same
 * figure (e.g. "totals.kv_cache", "entries.3.weight_bytes"), so that a test
 * can hold the picture against the JSON. Only include/engine.h is used.
 */
#ifndef ENGINE_PLAN_SVG_H
#define ENGINE_PLAN_SVG_H

#include <stdio.h>

#include "engine.h"

/* What the writer found about its own layout: labels whose estimated boxes overlap or leave the picture. */
typedef struct plan_svg_stats {
    int n_labels;          /* text elements drawn                                         */
    int n_overlaps;        /* pairs of them whose boxes overlap (should be 0)             */
    int n_outside;         /* ones reaching past the picture's edges (should be 0)        */
    char first_problem[160]; /* the first such label's text, for a test's message         */
    double width, height;  /* the picture's size in px                                    */
} plan_svg_stats;

/*
 * Draw plan (for model, a path: its last component is shown) to f; off,
 * when not NULL, adds what a run measured (engine_session_offload), drawn
 * where it streamed layers. stats, when not NULL, receives the layout check.
 * Returns 0, or -1 when memory ran out or writing to f failed (errno says
 * why). f stays open.
 */
int plan_svg_write(FILE *f, const engine_plan *plan, const char *model, const engine_offload_report *off,
                   plan_svg_stats *stats);

#endif
