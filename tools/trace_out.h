/*
 * trace_out.h: --trace FILE.json for the tools. The file is opened (and
 * created) before any work, so that a path that cannot be written fails at
 * once with one line naming it; the trace is written there when the tool
 * ends, whatever was recorded by then (a failed run's too).
 */
#ifndef TOOLS_TRACE_OUT_H
#define TOOLS_TRACE_OUT_H

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "engine.h"

typedef struct trace_out {
    const char *path;   /* NULL: no --trace */
    engine_trace *trace;
} trace_out;

/* Check that o->path can be written and make the trace; 0, or 1 after a message. */
static inline int trace_out_open(trace_out *o, const char *tool)
{
    if (!o->path)
        return 0;
    FILE *f = fopen(o->path, "w");
    if (!f) {
        fprintf(stderr, "%s: %s: cannot write the trace: %s\n", tool, o->path, strerror(errno));
        return 1;
    }
    fclose(f);
    if (engine_trace_create(&o->trace) != ENGINE_OK) {
        fprintf(stderr, "%s: %s: out of memory for the trace\n", tool, o->path);
        return 1;
    }
    return 0;
}

/* Write the trace and free it; 0, or 1 after a message. Call after the models and sessions are freed. */
static inline int trace_out_close(trace_out *o, const char *tool)
{
    if (!o->trace)
        return 0;
    char err[512];
    const int bad = engine_trace_save(o->trace, o->path, err, sizeof err) != ENGINE_OK;
    if (bad)
        fprintf(stderr, "%s: %s\n", tool, err);
    engine_trace_free(o->trace);
    o->trace = NULL;
    return bad;
}

#endif
