/*
 * trace_out.h: --trace FILE.json and --trace-svg FILE.svg for the tools.
 * The files are opened (and created) before any work, so that a path that
 * cannot be written fails at once with one line naming it; the trace is
 * written when the tool ends, whatever was recorded by then (a failed run's
 * too), and the picture is drawn from the file just written (trace_svg.h),
 * so that it shows exactly what the JSON holds. --trace-svg alone keeps the
 * JSON in a temporary file, removed after drawing.
 */
#ifndef TOOLS_TRACE_OUT_H
#define TOOLS_TRACE_OUT_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "trace_svg.h"

typedef struct trace_out {
    const char *path;     /* NULL: no --trace (and no --trace-svg)     */
    engine_trace *trace;
    const char *svg_path; /* NULL: no --trace-svg                       */
    char tmp[4096];       /* --trace-svg alone: the JSON's temporary file */
} trace_out;

/* Check that o's paths can be written and make the trace; 0, or 1 after a message. */
static inline int trace_out_open(trace_out *o, const char *tool)
{
    if (o->svg_path) {
        FILE *f = fopen(o->svg_path, "w");
        if (!f) {
            fprintf(stderr, "%s: %s: cannot write the SVG: %s\n", tool, o->svg_path, strerror(errno));
            return 1;
        }
        fclose(f);
    }
    if (o->svg_path && !o->path) {
        const char *dir = getenv("TMPDIR") && getenv("TMPDIR")[0] ? getenv("TMPDIR") : "/tmp";
        snprintf(o->tmp, sizeof o->tmp, "%s/engine-trace-XXXXXX", dir);
        const int fd = mkstemp(o->tmp);
        if (fd < 0) {
            fprintf(stderr, "%s: %s: cannot make a temporary file for the trace: %s\n", tool, o->tmp,
                    strerror(errno));
            o->tmp[0] = 0;
            return 1;
        }
        close(fd);
        o->path = o->tmp;
    }
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
    if (!o->trace) {
        if (o->tmp[0])
            remove(o->tmp);
        return 0;
    }
    char err[1024];
    int bad = engine_trace_save(o->trace, o->path, err, sizeof err) != ENGINE_OK;
    if (bad)
        fprintf(stderr, "%s: %s\n", tool, err);
    engine_trace_free(o->trace);
    o->trace = NULL;
    if (!bad && o->svg_path && trace_svg_file(o->path, o->svg_path, NULL, NULL, err, sizeof err)) {
        fprintf(stderr, "%s: %s\n", tool, err);
        bad = 1;
    }
    if (o->tmp[0])
        remove(o->tmp);
    return bad;
}

#endif
