/* svg_labels.c: the pictures' check of their own labels (svg_labels.h). */
#include "svg_labels.h"

#include <stdio.h>
#include <stdlib.h>

void svg_labels_note(svg_labels *sl, svg_box b, const char *text)
{
    sl->n_labels++;
    int bad = b.x0 < 0.0 || b.x1 > sl->width;
    sl->n_outside += bad;
    for (int i = 0; i < sl->n; i++) { /* half a pixel of touching is no overlap */
        const svg_box *o = &sl->boxes[i];
        if (b.x0 < o->x1 - 0.5 && o->x0 < b.x1 - 0.5 && b.y0 < o->y1 - 0.5 && o->y0 < b.y1 - 0.5) {
            sl->n_overlaps++;
            bad = 1;
        }
    }
    if (bad && !sl->first_problem[0])
        snprintf(sl->first_problem, sizeof sl->first_problem, "%.150s", text);
    if (sl->n == sl->cap) {
        const int cap = sl->cap ? 2 * sl->cap : 256;
        svg_box *g = realloc(sl->boxes, (size_t)cap * sizeof *g);
        if (!g) {
            sl->oom = 1;
            return;
        }
        sl->boxes = g, sl->cap = cap;
    }
    sl->boxes[sl->n++] = b;
}

void svg_labels_free(svg_labels *sl)
{
    free(sl->boxes);
    sl->boxes = NULL;
    sl->n = sl->cap = 0;
}
