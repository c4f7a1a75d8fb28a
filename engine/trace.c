/*
 * trace.c: engine_trace, spans and counters kept as trace events in memory
 * and written as one Chrome trace-event JSON object
 * ({"traceEvents": [...], "displayTimeUnit": "ms", "metadata": {...}}),
 * which Perfetto (ui.perfetto.dev) and chrome://tracing open as they are.
 *
 * One process (pid 1, named "engine" with the metadata as its labels);
 * each track a thread with a thread_name event. Nothing here runs unless
 * a trace is attached (trace.h).
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime under -std=c11 */

#include "trace.h"

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "error.h"

#define TRACE_PID 1

/* One event as recorded: cheap to append; made JSON only by engine_trace_save. */
typedef struct trace_event {
    const char *name;       /* static storage; with index >= 0 written as "name index" */
    int index;
    const char *cat;        /* static storage; NULL for a counter */
    char ph;                /* 'X' or 'C' */
    int tid;
    double ts, dur;         /* microseconds */
    int n_args;
    const char *key[TRACE_MAX_ARGS]; /* static storage */
    double val[TRACE_MAX_ARGS];
} trace_event;

struct engine_trace {
    pthread_mutex_t mu;
    double t0;       /* monotonic seconds at creation */
    json_t *tracks;  /* array of the tracks' metadata events, as they were made */
    json_t *meta;    /* object: process-wide metadata */
    int n_tracks;
    trace_event *ev; /* [n_ev] of cap_ev */
    size_t n_ev, cap_ev;
};

static double mono_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* A new event at the end, under t->mu; NULL when out of memory (the event is dropped). */
static trace_event *append(engine_trace *t)
{
    if (t->n_ev == t->cap_ev) {
        const size_t cap = t->cap_ev ? 2 * t->cap_ev : 1024;
        trace_event *ev = realloc(t->ev, cap * sizeof *ev);
        if (!ev)
            return NULL;
        t->ev = ev;
        t->cap_ev = cap;
    }
    return &t->ev[t->n_ev++];
}

engine_status engine_trace_create(engine_trace **out)
{
    if (!out)
        return ENGINE_ERR_INVALID_ARG;
    *out = NULL;
    engine_trace *t = calloc(1, sizeof *t);
    if (!t)
        return ENGINE_ERR_OUT_OF_MEMORY;
    t->tracks = json_array();
    t->meta = json_object();
    if (!t->tracks || !t->meta || pthread_mutex_init(&t->mu, NULL) != 0) {
        json_decref(t->tracks);
        json_decref(t->meta);
        free(t);
        return ENGINE_ERR_OUT_OF_MEMORY;
    }
    t->t0 = mono_seconds();
    json_array_append_new(t->tracks, json_pack("{s:s, s:s, s:i, s:i, s:i, s:{s:s}}", "name", "process_name", "ph", "M",
                                               "ts", 0, "pid", TRACE_PID, "tid", 0, "args", "name", "engine"));
    *out = t;
    return ENGINE_OK;
}

void engine_trace_free(engine_trace *t)
{
    if (!t)
        return;
    json_decref(t->tracks);
    json_decref(t->meta);
    free(t->ev);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

double trace_now(const engine_trace *t)
{
    return t ? (mono_seconds() - t->t0) * 1e6 : 0.0;
}

int trace_track(engine_trace *t, const char *name)
{
    if (!t)
        return 0;
    pthread_mutex_lock(&t->mu);
    const int tid = ++t->n_tracks;
    char label[128];
    snprintf(label, sizeof label, name, tid);
    json_array_append_new(t->tracks, json_pack("{s:s, s:s, s:i, s:i, s:i, s:{s:s}}", "name", "thread_name", "ph", "M",
                                               "ts", 0, "pid", TRACE_PID, "tid", tid, "args", "name", label));
    /* Tracks sort in the order they were made. */
    json_array_append_new(t->tracks, json_pack("{s:s, s:s, s:i, s:i, s:i, s:{s:i}}", "name", "thread_sort_index", "ph",
                                               "M", "ts", 0, "pid", TRACE_PID, "tid", tid, "args", "sort_index", tid));
    pthread_mutex_unlock(&t->mu);
    return tid;
}

void trace_span_args(engine_trace *t, int tid, const char *name, int index, const char *cat, double ts, double dur,
                     const char *k0, double v0, const char *k1, double v1)
{
    if (!t)
        return;
    pthread_mutex_lock(&t->mu);
    trace_event *e = append(t);
    if (e) {
        e->name = name;
        e->index = index;
        e->cat = cat ? cat : "engine";
        e->ph = 'X';
        e->tid = tid;
        e->ts = ts;
        e->dur = dur > 0.0 ? dur : 0.0;
        e->n_args = 0;
        if (k0)
            e->key[e->n_args] = k0, e->val[e->n_args++] = v0;
        if (k1)
            e->key[e->n_args] = k1, e->val[e->n_args++] = v1;
    }
    pthread_mutex_unlock(&t->mu);
}

void trace_span(engine_trace *t, int tid, const char *name, const char *cat, double ts, double dur)
{
    trace_span_args(t, tid, name, -1, cat, ts, dur, NULL, 0, NULL, 0);
}

void trace_counter(engine_trace *t, const char *name, double ts, const char *const *series, const double *value, int n)
{
    if (!t)
        return;
    pthread_mutex_lock(&t->mu);
    trace_event *e = append(t);
    if (e) {
        e->name = name;
        e->index = -1;
        e->cat = NULL;
        e->ph = 'C';
        e->tid = 0;
        e->ts = ts;
        e->dur = 0.0;
        e->n_args = n < TRACE_MAX_ARGS ? n : TRACE_MAX_ARGS;
        for (int i = 0; i < e->n_args; i++)
            e->key[i] = series[i], e->val[i] = value[i];
    }
    pthread_mutex_unlock(&t->mu);
}

/* The JSON of a recorded event. */
static json_t *event_json(const trace_event *e)
{
    char name[64];
    if (e->index >= 0)
        snprintf(name, sizeof name, "%s %d", e->name, e->index);
    else
        snprintf(name, sizeof name, "%s", e->name);
    json_t *j = json_pack("{s:s, s:s#, s:f, s:i, s:i}", "name", name, "ph", &e->ph, (size_t)1, "ts", e->ts, "pid",
                          TRACE_PID, "tid", e->tid);
    if (!j)
        return NULL;
    if (e->ph == 'X') {
        json_object_set_new(j, "cat", json_string(e->cat));
        json_object_set_new(j, "dur", json_real(e->dur));
    }
    if (e->n_args > 0 || e->ph == 'C') {
        json_t *args = json_object();
        for (int i = 0; i < e->n_args; i++)
            json_object_set_new(args, e->key[i], json_real(e->val[i]));
        json_object_set_new(j, "args", args);
    }
    return j;
}

void trace_meta(engine_trace *t, const char *key, const char *value)
{
    if (!t || !key || !value)
        return;
    pthread_mutex_lock(&t->mu);
    json_object_set_new(t->meta, key, json_string(value));
    pthread_mutex_unlock(&t->mu);
}

void trace_meta_num(engine_trace *t, const char *key, double value)
{
    if (!t || !key)
        return;
    pthread_mutex_lock(&t->mu);
    json_object_set_new(t->meta, key, json_real(value));
    pthread_mutex_unlock(&t->mu);
}

engine_status engine_trace_set_metadata(engine_trace *t, const char *key, const char *value)
{
    if (!t || !key || !value)
        return ENGINE_ERR_INVALID_ARG;
    trace_meta(t, key, value);
    return ENGINE_OK;
}

engine_status engine_trace_save(engine_trace *t, const char *path, char *err, size_t err_size)
{
    err_buf e;
    err_clear(&e);
    if (!t || !path) {
        err_set(&e, ENGINE_ERR_INVALID_ARG, "engine_trace_save: trace and path must not be NULL");
        err_copy_out(&e, err, err_size);
        return ENGINE_ERR_INVALID_ARG;
    }
    pthread_mutex_lock(&t->mu);
    /* The metadata also goes to the process's labels, which the viewers show beside its name. */
    json_t *root = json_object(), *labels = json_array();
    const char *key;
    json_t *v;
    json_object_foreach(t->meta, key, v)
    {
        char line[512];
        if (json_is_string(v))
            snprintf(line, sizeof line, "%s: %s", key, json_string_value(v));
        else
            snprintf(line, sizeof line, "%s: %.17g", key, json_number_value(v));
        json_array_append_new(labels, json_string(line));
    }
    json_t *events = json_deep_copy(t->tracks);
    bool whole = root && labels && events;
    for (size_t i = 0; whole && i < t->n_ev; i++)
        whole = json_array_append_new(events, event_json(&t->ev[i])) == 0;
    if (!whole) {
        pthread_mutex_unlock(&t->mu);
        json_decref(root), json_decref(labels), json_decref(events);
        err_set(&e, ENGINE_ERR_OUT_OF_MEMORY, "%s: out of memory for the trace's %zu events", path, t->n_ev);
        err_copy_out(&e, err, err_size);
        return ENGINE_ERR_OUT_OF_MEMORY;
    }
    if (labels && json_array_size(labels) > 0) {
        /* chrome://tracing takes labels as one comma-separated string. */
        size_t len = 1, i;
        json_array_foreach(labels, i, v) len += strlen(json_string_value(v)) + 2;
        char *joined = calloc(1, len);
        if (joined) {
            json_array_foreach(labels, i, v)
            {
                if (i)
                    strcat(joined, ", ");
                strcat(joined, json_string_value(v));
            }
            json_array_append_new(events, json_pack("{s:s, s:s, s:i, s:i, s:i, s:{s:s}}", "name", "process_labels", "ph",
                                                    "M", "ts", 0, "pid", TRACE_PID, "tid", 0, "args", "labels", joined));
            free(joined);
        }
    }
    json_decref(labels);
    json_object_set_new(root, "traceEvents", events);
    json_object_set_new(root, "displayTimeUnit", json_string("ms"));
    json_object_set(root, "metadata", t->meta);
    pthread_mutex_unlock(&t->mu);

    engine_status st = ENGINE_OK;
    FILE *f = fopen(path, "w");
    if (!f) {
        st = err_set(&e, ENGINE_ERR_IO, "%s: cannot write the trace: %s", path, strerror(errno));
    } else {
        const int bad = json_dumpf(root, f, JSON_COMPACT | JSON_REAL_PRECISION(12));
        const int werr = ferror(f);
        const int cerr = fclose(f);
        if (bad || werr || cerr)
            st = err_set(&e, ENGINE_ERR_IO, "%s: cannot write the trace: %s", path,
                         errno ? strerror(errno) : "write error");
    }
    pthread_mutex_lock(&t->mu);
    json_decref(root);
    pthread_mutex_unlock(&t->mu);
    err_copy_out(&e, err, err_size);
    return st;
}
