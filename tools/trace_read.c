/*
 * trace_read.c: a trace-event file read for drawing (trace_read.h).
 */
#include "trace_read.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void trace_data_free(trace_data *d)
{
    for (int i = 0; i < d->n_ct; i++)
        free(d->ct[i].ts), free(d->ct[i].v);
    free(d->sp), free(d->tr), free(d->ct);
}

static int track_of(trace_data *d, int tid)
{
    for (int i = 0; i < d->n_tr; i++)
        if (d->tr[i].tid == tid)
            return i;
    track *t = realloc(d->tr, (size_t)(d->n_tr + 1) * sizeof *t);
    if (!t)
        return -1;
    d->tr = t;
    d->tr[d->n_tr] = (track){.tid = tid, .sort = tid};
    return d->n_tr++;
}

static int kind_of(const char *name)
{
    if (!name)
        return K_OTHER;
    return !strncmp(name, "load", 4) ? K_LOAD
           : !strncmp(name, "session", 7) ? K_SESSION
           : !strncmp(name, "GPU compute", 11) ? K_GPU
           : !strncmp(name, "GPU copy", 8) ? K_COPY
           : !strncmp(name, "CPU, hosted", 11) ? K_HOST
                                                  : K_OTHER;
}

static int num(const json_t *o, const char *key, double *v)
{
    const json_t *j = json_object_get(o, key);
    if (!json_is_number(j))
        return -1;
    *v = json_number_value(j);
    return isfinite(*v) ? 0 : -1;
}

static int add_sample(trace_data *d, const char *name, double ts, const json_t *args)
{
    counter *c = NULL;
    for (int i = 0; i < d->n_ct && !c; i++)
        c = !strcmp(d->ct[i].name, name) ? &d->ct[i] : NULL;
    if (!c) {
        counter *g = realloc(d->ct, (size_t)(d->n_ct + 1) * sizeof *g);
        if (!g)
            return -1;
        d->ct = g;
        c = &d->ct[d->n_ct++];
        *c = (counter){.name = name};
    }
    if (c->n == c->cap) {
        const int cap = c->cap ? 2 * c->cap : 64;
        double *tss = realloc(c->ts, (size_t)cap * sizeof *tss);
        if (tss)
            c->ts = tss;
        double *v = tss ? realloc(c->v, (size_t)cap * MAX_SERIES * sizeof *v) : NULL;
        if (!v)
            return -1;
        c->v = v, c->cap = cap;
    }
    double *v = c->v + (size_t)c->n * MAX_SERIES;
    for (int s = 0; s < MAX_SERIES; s++) /* a series missing from a sample keeps its last value */
        v[s] = c->n > 0 ? v[s - MAX_SERIES] : 0.0;
    const char *key;
    const json_t *val;
    json_object_foreach((json_t *)args, key, val)
    {
        if (!json_is_number(val))
            continue;
        int s = 0;
        while (s < c->n_series && strcmp(c->series[s], key))
            s++;
        if (s == MAX_SERIES)
            continue;
        if (s == c->n_series)
            c->series[c->n_series++] = key;
        v[s] = json_number_value(val);
    }
    c->ts[c->n++] = ts;
    return 0;
}

static int cmp_span(const void *a, const void *b)
{
    const span *x = a, *y = b;
    if (x->track != y->track)
        return x->track - y->track;
    if (x->ts != y->ts)
        return x->ts < y->ts ? -1 : 1;
    return x->dur > y->dur ? -1 : x->dur < y->dur;
}

static int cmp_track(const void *a, const void *b)
{
    const track *x = a, *y = b;
    return x->sort != y->sort ? (x->sort < y->sort ? -1 : 1) : x->tid - y->tid;
}

/* The events of root into d; 0, or -1 with err set. */
int trace_read(const json_t *root, trace_data *d, char *err, size_t n)
{
    const json_t *ev = json_is_array(root) ? root : json_object_get(root, "traceEvents");
    if (!json_is_array(ev)) {
        snprintf(err, n, "not a trace-event file: no traceEvents array");
        return -1;
    }
    d->meta = json_is_object(root) ? json_object_get(root, "metadata") : NULL;
    const size_t n_ev = json_array_size(ev);
    d->sp = malloc((n_ev ? n_ev : 1) * sizeof *d->sp);
    if (!d->sp) {
        snprintf(err, n, "out of memory for %zu events", n_ev);
        return -1;
    }
    for (size_t i = 0; i < n_ev; i++) {
        const json_t *e = json_array_get(ev, i);
        const char *ph = json_string_value(json_object_get(e, "ph"));
        const char *name = json_string_value(json_object_get(e, "name"));
        double ts = 0, dur = 0, tid = 0;
        if (!json_is_object(e) || !ph || !name) {
            snprintf(err, n, "not a trace-event file: event %zu lacks a name or a ph", i);
            return -1;
        }
        const int timed = !strcmp(ph, "X") || !strcmp(ph, "C");
        /* Times up to 1e15 us (31 years) and tids that are ints: what the drawing computes with stays finite. */
        if ((timed && (num(e, "ts", &ts) || ts < 0 || ts > 1e15)) || num(e, "tid", &tid) || fabs(tid) > 1e9 ||
            (!strcmp(ph, "X") && (num(e, "dur", &dur) || dur < 0 || dur > 1e15))) {
            snprintf(err, n, "not a trace-event file: event %zu (%.40s) lacks a ts, tid or dur, or one is out of range",
                     i, name);
            return -1;
        }
        const json_t *args = json_object_get(e, "args");
        int t = -2;
        if (!strcmp(ph, "M") && !strcmp(name, "thread_name") && json_string_value(json_object_get(args, "name"))) {
            if ((t = track_of(d, (int)tid)) >= 0)
                d->tr[t].name = json_string_value(json_object_get(args, "name"));
        } else if (!strcmp(ph, "M") && !strcmp(name, "thread_sort_index")) {
            double s;
            if ((t = track_of(d, (int)tid)) >= 0 && num(args, "sort_index", &s) == 0)
                d->tr[t].sort = s;
        } else if (!strcmp(ph, "X")) {
            if ((t = track_of(d, (int)tid)) >= 0) {
                const char *cat = json_string_value(json_object_get(e, "cat"));
                d->sp[d->n_sp++] = (span){name, cat ? cat : "", ts, dur, (int)tid, 0, 0, (int)i};
                d->t_end = ts + dur > d->t_end ? ts + dur : d->t_end;
            }
        } else if (!strcmp(ph, "C") && json_is_object(args)) {
            t = add_sample(d, name, ts, args);
            d->t_end = ts > d->t_end ? ts : d->t_end;
        }
        if (t == -1) {
            snprintf(err, n, "out of memory reading event %zu", i);
            return -1;
        }
    }
    if (d->n_sp == 0) {
        snprintf(err, n, "the trace holds no spans (\"ph\": \"X\") to draw");
        return -1;
    }
    /* Tracks in the viewers' order; spans by track and start, a parent before what it holds. */
    qsort(d->tr, (size_t)d->n_tr, sizeof *d->tr, cmp_track);
    for (int i = 0; i < d->n_tr; i++)
        d->tr[i].kind = kind_of(d->tr[i].name);
    for (int i = 0; i < d->n_sp; i++)
        d->sp[i].track = track_of(d, d->sp[i].tid);
    qsort(d->sp, (size_t)d->n_sp, sizeof *d->sp, cmp_span);
    /* Each span's level: how many spans still open on its track hold it. */
    double open[MAX_LEVELS + 1];
    int n_open = 0, cur = -1;
    for (int i = 0; i < d->n_sp; i++) {
        span *s = &d->sp[i];
        if (s->track != cur)
            cur = s->track, n_open = 0;
        while (n_open > 0 && open[n_open - 1] <= s->ts + 1e-3)
            n_open--;
        s->level = n_open < MAX_LEVELS ? n_open : MAX_LEVELS - 1;
        if (n_open < MAX_LEVELS + 1)
            open[n_open++] = s->ts + s->dur;
        track *t = &d->tr[s->track];
        t->n_spans++;
        t->levels = s->level + 1 > t->levels ? s->level + 1 : t->levels;
    }
    return 0;
}

int trace_overlaps(const span *s, double t0, double t1)
{
    return s->ts < t1 && s->ts + s->dur > t0;
}

/* Does work of the device's tracks start in [t0, t1)? (Start, not overlap: the device's spans are placed from
 * the host time their pass was enqueued, so a pass's last span may reach a little into the next step.) */
static int has_gpu(const trace_data *d, double t0, double t1)
{
    for (int i = 0; i < d->n_sp; i++) {
        const int k = d->tr[d->sp[i].track].kind;
        if ((k == K_GPU || k == K_COPY) && d->sp[i].ts >= t0 && d->sp[i].ts < t1)
            return 1;
    }
    return 0;
}

typedef struct window {
    double t0, t1;
    const span *step;
} window;

static int cmp_window_dur(const void *a, const void *b)
{
    const window *x = a, *y = b;
    const double dx = x->t1 - x->t0, dy = y->t1 - y->t0;
    return dx < dy ? -1 : dx > dy;
}

/*
 * The step drawn zoomed: among the decode steps (the device's own, stamped
 * in its decode graph, when there are any; else the host's with the
 * device's spans in them; else the passes the GPU timed with no host span,
 * as --report's profiled decode steps are; else every decode step; else
 * the prompt passes), the first few left out (warming up), the median by
 * wall time. Its window reaches to the end of the device's work in it.
 */
int trace_pick_zoom(const trace_data *d, zoom *z)
{
    window *w = malloc((size_t)d->n_sp * sizeof *w);
    if (!w)
        return -1;
    int n = 0;
    const char *kinds[] = {"GPU decode step", "decode step", "decode step", "decode step", "prompt pass"};
    for (int pass = 0; pass < 5 && n == 0; pass++) {
        if (pass == 2) { /* the device's passes no host span holds: each starts at its "layer 0" */
            for (int i = 0; i < d->n_sp; i++) {
                const span *s = &d->sp[i];
                if (d->tr[s->track].kind != K_GPU)
                    continue;
                if (!strcmp(s->name, "layer 0") || n == 0)
                    w[n++] = (window){s->ts, s->ts + s->dur, NULL};
                else if (s->ts + s->dur > w[n - 1].t1)
                    w[n - 1].t1 = s->ts + s->dur;
            }
            int kept = 0;
            for (int j = 0; j < n; j++) {
                int held = 0;
                for (int i = 0; i < d->n_sp && !held; i++)
                    held = !strcmp(d->sp[i].cat, "step") && d->sp[i].ts <= w[j].t0 &&
                           w[j].t0 <= d->sp[i].ts + d->sp[i].dur;
                if (!held)
                    w[kept++] = w[j];
            }
            n = kept;
            /* No host span says what they were: --report's profiled decode steps, or perplexity's windows on a
             * GPU, whose passes record none. */
            z->what = "passes timed on the GPU with no host span (--report's decode steps, perplexity's windows)";
            continue;
        }
        for (int i = 0; i < d->n_sp; i++) {
            const span *s = &d->sp[i];
            if (!strcmp(s->cat, "step") && !strcmp(s->name, kinds[pass]) &&
                (pass != 1 || has_gpu(d, s->ts, s->ts + s->dur)))
                w[n++] = (window){s->ts, s->ts + s->dur, s};
        }
        const char *what[] = {"decode steps on the GPU (its graph's stamps)", "decode steps the GPU timed", NULL,
                              "decode steps", "prompt passes"};
        z->what = what[pass];
    }
    if (n == 0) {
        free(w);
        return 0;
    }
    /* In time order (spans are sorted by track first), then the median of those after the first few. */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && w[j].t0 < w[j - 1].t0; j--) {
            const window x = w[j];
            w[j] = w[j - 1], w[j - 1] = x;
        }
    const int skip = n >= 8 ? 3 : n / 3;
    window *rest = malloc((size_t)(n - skip) * sizeof *rest);
    if (!rest) {
        free(w);
        return -1;
    }
    memcpy(rest, w + skip, (size_t)(n - skip) * sizeof *rest);
    qsort(rest, (size_t)(n - skip), sizeof *rest, cmp_window_dur);
    const window m = rest[(n - skip - 1) / 2];
    free(rest);
    z->t0 = m.t0, z->t1 = m.t1, z->step = m.step, z->count = n, z->skipped = skip;
    for (int i = 0; i < n; i++)
        if (w[i].t0 == m.t0)
            z->index = i + 1;
    free(w);
    /* The device's and the CPU's work that began inside the step may end after it. */
    for (int i = 0; i < d->n_sp; i++) {
        const span *s = &d->sp[i];
        const int k = d->tr[s->track].kind;
        if ((k == K_GPU || k == K_COPY || k == K_HOST) && s->ts >= z->t0 && s->ts < z->t1 && s->ts + s->dur > z->t1)
            z->t1 = s->ts + s->dur;
    }
    return 1;
}

/* The spans of track k: [*first, returned end) of d->sp (sorted by track). */
int trace_track_spans(const trace_data *d, int k, int *first)
{
    int i = 0;
    while (i < d->n_sp && d->sp[i].track < k)
        i++;
    *first = i;
    while (i < d->n_sp && d->sp[i].track == k)
        i++;
    return i;
}

/*
 * A track's work as signed spans: its outermost spans, +1 each, where a
 * step that holds spans gives way to them (a stamped "GPU decode step"
 * holds the layers that are the work, waits and all), and its waits (cat
 * "wait": a layer's wait for its copy, inside the layer), -1 each. Sums
 * over them give the time a track worked. Returns the count in *out
 * (malloc'd; NULL when none or out of memory).
 */
typedef struct signed_span {
    double a, b;
    int sign;
} signed_span;

static int track_work(const trace_data *d, int k, signed_span **out)
{
    int i, end = trace_track_spans(d, k, &i), n = 0;
    *out = end > i ? malloc((size_t)(end - i) * sizeof **out) : NULL;
    if (!*out)
        return 0;
    double last_end = -1e300;
    for (; i < end; i++) {
        const span *sp = &d->sp[i];
        if (!strcmp(sp->cat, "wait"))
            (*out)[n++] = (signed_span){sp->ts, sp->ts + sp->dur, -1};
        else if (sp->ts >= last_end - 1e-3 && /* not inside one taken */
                 (strcmp(sp->cat, "step") || i + 1 == end || d->sp[i + 1].ts >= sp->ts + sp->dur - 1e-3)) {
            (*out)[n++] = (signed_span){sp->ts, sp->ts + sp->dur, 1};
            last_end = sp->ts + sp->dur;
        }
    }
    return n;
}

/* The part of [a, b) in [t0, t1). */
static double clipped(double a, double b, double t0, double t1)
{
    a = a > t0 ? a : t0, b = b < t1 ? b : t1;
    return b > a ? b - a : 0;
}

double trace_busy(const trace_data *d, int k, double t0, double t1)
{
    signed_span *w;
    const int n = track_work(d, k, &w);
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += w[i].sign * clipped(w[i].a, w[i].b, t0, t1);
    free(w);
    return sum;
}

double trace_together(const trace_data *d, int k1, int k2, double t0, double t1)
{
    signed_span *x, *y;
    const int nx = track_work(d, k1, &x), ny = track_work(d, k2, &y);
    double sum = 0;
    for (int i = 0; i < nx; i++)
        for (int j = 0; j < ny; j++) {
            const double a = x[i].a > y[j].a ? x[i].a : y[j].a, b = x[i].b < y[j].b ? x[i].b : y[j].b;
            sum += x[i].sign * y[j].sign * clipped(a, b, t0, t1);
        }
    free(x);
    free(y);
    return sum;
}

