/*
 * svg_labels.h: the check both pictures (plan_svg.c, trace_svg.c) make of
 * their own text as they draw it: each label's box, estimated from its
 * length, against the boxes of the labels before it and the picture's
 * width. Their tests want no overlap and nothing outside.
 */
#ifndef ENGINE_SVG_LABELS_H
#define ENGINE_SVG_LABELS_H

typedef struct svg_box {
    double x0, y0, x1, y1;
} svg_box;

typedef struct svg_labels {
    double width;            /* the picture's width: a box past it, or left of 0, is outside */
    svg_box *boxes;          /* the labels so far                                     */
    int n, cap;
    int oom;                 /* a box could not be kept                               */
    int n_labels;            /* labels noted                                          */
    int n_overlaps;          /* pairs of them whose boxes overlap                     */
    int n_outside;           /* ones reaching past the picture's edges                */
    char first_problem[160]; /* the first such label's text, for a test's message     */
} svg_labels;

/* Note a label's box and text: counted, and checked against the ones before. */
void svg_labels_note(svg_labels *sl, svg_box b, const char *text);
void svg_labels_free(svg_labels *sl);

#endif
