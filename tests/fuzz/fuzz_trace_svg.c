/*
 * fuzz_trace_svg: arbitrary bytes as a trace for build/trace_svg and
 * --trace-svg (tools/trace_read.c, tools/trace_svg.c), a file that may
 * come from another machine. Bytes that jansson parses are either refused
 * with a message (not a trace, no spans) or drawn as a whole picture: the
 * XML declaration first, </svg> last, valid UTF-8 throughout (names cut by
 * a buffer must not leave half a character), every coordinate and size a
 * finite number, every label inside the picture.
 */
#include "fuzz_util.h"

#include <jansson.h>
#include <math.h>
#include <string.h>

#include "tools/trace_svg.h"

static int valid_utf8(const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n;) {
        const unsigned char c = p[i];
        const size_t want = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
        if (!want || i + want > n)
            return 0;
        for (size_t k = 1; k < want; k++)
            if ((p[i + k] & 0xC0) != 0x80)
                return 0;
        i += want;
    }
    return 1;
}

/* Every coordinate and size the picture gives is a finite number: each tag's attributes read in order (a
 * name in a data- value may look like one), the geometric ones parsed as numbers or lists of them. */
static int finite_geometry(const char *svg)
{
    static const char *const geo[] = {"x", "y", "x1", "y1", "x2", "y2", "width", "height", "points"};
    for (const char *p = svg; (p = strchr(p, '<'));) {
        p += strcspn(p, " >"); /* the tag's name */
        for (;;) {
            p += strspn(p, " ");
            const size_t n = strcspn(p, "=> /?");
            if (p[n] != '=' || p[n + 1] != '"')
                break;
            const char *v = p + n + 2, *end = strchr(v, '"');
            if (!end)
                return 0;
            int is_geo = 0;
            for (size_t g = 0; g < sizeof geo / sizeof geo[0]; g++)
                is_geo |= strlen(geo[g]) == n && !strncmp(p, geo[g], n);
            while (is_geo && v < end) { /* one number, or "x,y" pairs */
                char *e;
                const double d = strtod(v, &e);
                if (e == v || e > end || !isfinite(d))
                    return 0;
                v = e + strspn(e, ", ");
            }
            p = end + 1;
        }
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_error_t je;
    json_t *root = json_loadb((const char *)data, size, JSON_DECODE_ANY, &je);
    if (!root)
        return 0;
    char *svg = NULL, err[512] = "";
    size_t len = 0;
    FILE *f = open_memstream(&svg, &len);
    FUZZ_ASSERT(f != NULL);
    trace_svg_stats st;
    const int rc = trace_svg_write(f, root, "fuzz.json", "a note", &st, err, sizeof err);
    FUZZ_ASSERT(fclose(f) == 0);
    if (rc != 0) {
        FUZZ_ASSERT((rc == -2 || rc == -1) && err[0] && memchr(err, '\n', strlen(err)) == NULL);
    } else {
        FUZZ_ASSERT(len > 100 && !strncmp(svg, "<?xml", 5) && !strcmp(svg + len - 7, "</svg>\n"));
        FUZZ_ASSERT(strlen(svg) == len && valid_utf8((const unsigned char *)svg, len));
        FUZZ_ASSERT(finite_geometry(svg));
        FUZZ_ASSERT(st.n_outside == 0 && st.height > 0);
    }
    free(svg);
    json_decref(root);
    return 0;
}
