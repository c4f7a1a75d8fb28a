/*
 * trace_svg: draw a trace written by --trace (here or on another machine)
 * as an SVG timeline (trace_svg.h).
 *
 *   trace_svg TRACE.json OUT.svg [--note TEXT]
 *
 * --note adds a line under the title, e.g. what the picture stands in for.
 * Errors (a file that cannot be read, is not JSON or not a trace, a picture
 * that cannot be written) are one line on stderr naming the file, exit 1.
 */
#include <stdio.h>
#include <string.h>

#include "trace_svg.h"

static const char USAGE[] = "usage: trace_svg TRACE.json OUT.svg [--note TEXT]\n";

int main(int argc, char **argv)
{
    const char *in = NULL, *out = NULL, *note = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--note") && i + 1 < argc) {
            note = argv[++i];
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(USAGE, stdout);
            return 0;
        } else if (argv[i][0] != '-' && !in) {
            in = argv[i];
        } else if (argv[i][0] != '-' && !out) {
            out = argv[i];
        } else {
            fputs(USAGE, stderr);
            return 2;
        }
    }
    if (!in || !out) {
        fputs(USAGE, stderr);
        return 2;
    }
    char err[1024];
    trace_svg_stats st;
    if (trace_svg_file(in, out, note, &st, err, sizeof err)) {
        fprintf(stderr, "trace_svg: %s\n", err);
        return 1;
    }
    if (st.n_overlaps || st.n_outside) /* a layout this writer does not handle: say so, the picture stays */
        fprintf(stderr, "trace_svg: %s: %d labels overlap, %d reach past the edge (first: %s)\n", out, st.n_overlaps,
                st.n_outside, st.first_problem);
    return 0;
}
