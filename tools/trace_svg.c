/*
 * trace_svg.c: a trace-event file drawn as an SVG timeline (trace_svg.h).
 *
 * The events are read into spans, tracks and counters and a step to zoom
 * into is chosen (trace_read.c), and the picture is drawn top to bottom
 * into a memory stream, its height known only at the end (trace_svg_write).
 * Labels go through one function that estimates each one's box from its
 * length and counts overlaps, as plan_svg.c does, so that tests can hold
 * every layout to "no label covers another".
 */
#define _POSIX_C_SOURCE 200809L /* open_memstream */

#include "trace_svg.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine.h"
#include "svg_labels.h"
#include "trace_read.h"

#define WIDTH 1000.0
#define LEFT 20.0
#define NAME_W 170.0          /* the track names' column                         */
#define PLOT_X0 (LEFT + NAME_W + 8.0)
#define PLOT_X1 875.0         /* the time axis; right of it, each track's busy time */
#define RIGHT (WIDTH - 20.0)
#define LEVEL_H 17.0          /* one level of nesting on a track                 */
#define CHART_H 34.0          /* a counter's step chart                          */
/* A character's advance in ems, for the layout check (plan_svg.c says why these). */
#define CHAR_EM 0.62
#define BOLD_EM 0.68

static const char *const FONTS = "DejaVu Sans, Verdana, Helvetica, Arial, sans-serif";

/* ------------------------------------------------------------ drawing */

typedef struct svg {
    FILE *f;
    svg_labels lab; /* the labels' boxes, checked as they are drawn */
    int zoom_event; /* the zoomed step's index in traceEvents, or -1 */
} svg;

enum { A_START, A_MIDDLE, A_END };

/* Text made safe for XML into out; returns the visible characters. Every string drawn passes here, so this is
 * where a name cut short by a buffer (or any byte that is not UTF-8) is dropped: the output stays valid UTF-8,
 * whole characters only. Control characters go too (XML 1.0 forbids them). */
static int escape(const char *s, char *out, size_t n)
{
    size_t len = 0;
    int chars = 0;
    const unsigned char *p = (const unsigned char *)s;
    while (*p && len + 8 < n) {
        const unsigned char c = *p;
        const int want = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
        int have = want > 0;
        for (int k = 1; k < want && have; k++)
            have = (p[k] & 0xC0) == 0x80;
        if (!have) { /* a stray continuation byte, an invalid lead, or a character cut short */
            p++;
            continue;
        }
        const char *r = c == '&' ? "&amp;" : c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '"' ? "&quot;" : NULL;
        if (r) {
            memcpy(out + len, r, strlen(r));
            len += strlen(r);
        } else if (c >= 0x20 || c == '\t') {
            memcpy(out + len, p, (size_t)want);
            len += (size_t)want;
        } else {
            p++;
            continue;
        }
        chars++;
        p += want;
    }
    out[len] = 0;
    return chars;
}

static double text_w(double size, int bold, int chars)
{
    return chars * size * (bold ? BOLD_EM : CHAR_EM);
}

static double text_w_of(double size, int bold, const char *s)
{
    int chars = 0;
    for (; *s; s++)
        chars += ((unsigned char)*s & 0xC0) != 0x80;
    return text_w(size, bold, chars);
}

/* Cut s (cap bytes), whole characters at a time, until it and a closing "..." fit in w px. */
static void shorten_to(char *s, size_t cap, double size, int bold, double w)
{
    size_t n = strlen(s);
    if (text_w_of(size, bold, s) <= w)
        return;
    while (n > 0) {
        do /* one character back */
            n--;
        while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80);
        s[n] = 0;
        if (n + 4 <= cap && text_w_of(size, bold, s) + text_w(size, bold, 3) <= w)
            break;
    }
    if (n + 4 <= cap)
        strcat(s, "...");
}

/* A text element at baseline y; attrs (NULL: none) go on a <tspan> around the text, which carries data. */
static void text_at(svg *s, double x, double y, double size, int bold, const char *fill, int anchor,
                    const char *attrs, const char *fmt, ...)
{
    char raw[1024], esc[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    const int chars = escape(raw, esc, sizeof esc);
    const double w = text_w(size, bold, chars);
    const double x0 = anchor == A_START ? x : anchor == A_END ? x - w : x - w / 2;
    svg_labels_note(&s->lab, (svg_box){x0, y - 0.8 * size, x0 + w, y + 0.25 * size}, raw);
    fprintf(s->f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"%g\"%s%s%s%s%s>", x, y, size,
            bold ? " font-weight=\"bold\"" : "",
            anchor == A_MIDDLE ? " text-anchor=\"middle\"" : anchor == A_END ? " text-anchor=\"end\"" : "",
            fill ? " fill=\"" : "", fill ? fill : "", fill ? "\"" : "");
    if (attrs)
        fprintf(s->f, "<tspan %s>%s</tspan></text>\n", attrs, esc);
    else
        fprintf(s->f, "%s</text>\n", esc);
}

/* Words wrapped to [x, RIGHT]; returns the baseline after the last line. */
static double wrapped(svg *s, double x, double y, double size, int bold, const char *fill, const char *text)
{
    const int per_line = (int)((RIGHT - x) / (size * (bold ? BOLD_EM : CHAR_EM)));
    const char *p = text;
    while (*p) {
        int n = (int)strlen(p);
        if (n > per_line) {
            n = per_line;
            while (n > 0 && p[n] != ' ')
                n--;
            if (n == 0) /* no space: cut at a character's start */
                for (n = per_line; n > 1 && ((unsigned char)p[n] & 0xC0) == 0x80; n--)
                    ;
        }
        text_at(s, x, y, size, bold, fill, A_START, NULL, "%.*s", n, p);
        y += size + 5;
        p += n;
        while (*p == ' ')
            p++;
    }
    return y;
}

#define C_TEXT "#222222"
#define C_GREY "#666666"
static const char *cat_fill(const char *cat)
{
    return !strcmp(cat, "step") ? "#9a9a9a"
           : !strcmp(cat, "layer") ? "#4c72b0"
           : !strcmp(cat, "copy") ? "#dd8452"
           : !strcmp(cat, "host") ? "#55a868"
           : !strcmp(cat, "load") ? "#8172b3"
           : !strcmp(cat, "wait") ? "#c8c8c8"
                                  : "#ccb974";
}

/* A time in microseconds as words: 850 us, 12.3 ms, 4.21 s. */
static const char *fmt_time(double us, char *buf, size_t n)
{
    if (us >= 1e6)
        snprintf(buf, n, "%.3g s", us * 1e-6);
    else if (us >= 1e3)
        snprintf(buf, n, "%.3g ms", us * 1e-3);
    else
        snprintf(buf, n, "%.3g \u00b5s", us);
    return buf;
}

/* A time axis over [t0, t1) microseconds on [PLOT_X0, PLOT_X1] at baseline y: ticks at 1, 2 or 5 times a power of
 * ten, labelled from t0 (label_origin 0) or in the run's time. */
static void axis(svg *s, double y, double t0, double t1, double bottom)
{
    /* At least a microsecond: a shorter window would ask for ticks finer than the labels can show. */
    const double span_us = t1 - t0 > 1.0 ? t1 - t0 : 1.0, raw = span_us / 8;
    const double mag = pow(10.0, floor(log10(raw)));
    const double step = raw <= mag ? mag : raw <= 2 * mag ? 2 * mag : raw <= 5 * mag ? 5 * mag : 10 * mag;
    const double unit = span_us >= 2e6 ? 1e6 : span_us >= 2e3 ? 1e3 : 1.0;
    const char *uname = unit == 1e6 ? "s" : unit == 1e3 ? "ms" : "\u00b5s";
    const int dec = step / unit >= 1 ? 0 : (int)ceil(-log10(step / unit) - 1e-9);
    fprintf(s->f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#999\"/>\n", PLOT_X0, y + 4, PLOT_X1,
            y + 4);
    for (int i = 0; i <= 12 && i * step <= span_us * (1 + 1e-9); i++) {
        const double t = i * step;
        const double x = PLOT_X0 + (PLOT_X1 - PLOT_X0) * t / span_us;
        fprintf(s->f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>\n", x, y + 4, x,
                bottom);
        /* The last label ends at the axis' end when it would reach past it. */
        char lab[32];
        snprintf(lab, sizeof lab, "%.*f %s", dec, t / unit, uname);
        const double w = text_w_of(10, 0, lab);
        const int anchor = x + w / 2 > PLOT_X1 + 30 ? A_END : A_MIDDLE;
        text_at(s, x, y, 10, 0, C_GREY, anchor, NULL, "%s", lab);
    }
}

/* A span's label in a box w px wide: its name, or the number it ends with, or nothing. */
static const char *fit_label(const span *sp, double w, char *buf, size_t n)
{
    if (text_w_of(10, 0, sp->name) + 6 <= w)
        return snprintf(buf, n, "%s", sp->name), buf;
    const char *p = sp->name + strlen(sp->name);
    while (p > sp->name && p[-1] >= '0' && p[-1] <= '9')
        p--;
    if (*p && text_w_of(10, 0, p) + 4 <= w)
        return snprintf(buf, n, "%s", p), buf;
    return NULL;
}

/* The event's exact values as attributes. */
static void span_attrs(const span *sp, char *buf, size_t n)
{
    char name[256];
    escape(sp->name, name, sizeof name);
    snprintf(buf, n, "data-tid=\"%d\" data-name=\"%s\" data-ts=\"%.17g\" data-dur=\"%.17g\"", sp->tid, name, sp->ts,
             sp->dur);
}

/* Track names, clipped to their column: the engine's " (track N)" suffix goes (the viewers need it to tell
 * two sessions' GPU tracks apart; the picture, which draws them in order, hardly ever does). */
static void track_name(svg *s, const track *t, double y)
{
    char name[128];
    snprintf(name, sizeof name, "%s", t->name ? t->name : "");
    if (!t->name)
        snprintf(name, sizeof name, "track %d", t->tid);
    char *suffix = strstr(name, " (track ");
    if (suffix && suffix != name)
        *suffix = 0;
    shorten_to(name, sizeof name, 11, 0, NAME_W);
    text_at(s, LEFT, y, 11, 0, NULL, A_START, NULL, "%s", name);
}

/* One box, from px x0 to x1 at level lv of the row at y; attrs: the event's values (NULL: none). */
static void span_box(svg *s, const span *sp, double x0, double x1, double y, int lv, const char *cls,
                     const char *attrs, int label)
{
    const double w = x1 - x0 > 0.6 ? x1 - x0 : 0.6;
    fprintf(s->f, "<rect%s%s%s x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\"%s%s%s/>\n",
            cls ? " class=\"" : "", cls ? cls : "", cls ? "\"" : "", x0, y + lv * LEVEL_H + 1, w, LEVEL_H - 2,
            cat_fill(sp->cat), label ? " stroke=\"#ffffff\" stroke-width=\"0.6\"" : "", attrs ? " " : "",
            attrs ? attrs : "");
    char buf[128];
    const char *l = label ? fit_label(sp, w, buf, sizeof buf) : NULL;
    if (l)
        text_at(s, x0 + w / 2, y + lv * LEVEL_H + 12.5, 10, 0, "#ffffff", A_MIDDLE, NULL, "%s", l);
}

/*
 * The tracks' rows over [t0, t1) from y. zoomed: only tracks with spans there, every span a box of its own
 * carrying its values and labelled where the label fits, each track's busy time at the right; else every
 * track, boxes under a pixel merged into their neighbours of the same colour, and only steps carrying their
 * values (and labelled, where they fit). Returns the y after the rows.
 */
static double draw_rows(svg *s, const trace_data *d, double y, double t0, double t1, int zoomed)
{
    const double scale = (PLOT_X1 - PLOT_X0) / (t1 > t0 ? t1 - t0 : 1.0);
    char attrs[512], tb[32];
    for (int k = 0; k < d->n_tr; k++) {
        int first, end = trace_track_spans(d, k, &first), levels = 0;
        for (int i = first; i < end; i++)
            if (trace_overlaps(&d->sp[i], t0, t1) || (!zoomed && d->sp[i].dur == 0))
                levels = d->sp[i].level + 1 > levels ? d->sp[i].level + 1 : levels;
        if (zoomed && levels == 0)
            continue;
        const double h = (levels ? levels : 1) * LEVEL_H;
        fprintf(s->f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#f6f6f6\"/>\n", PLOT_X0, y,
                PLOT_X1 - PLOT_X0, h);
        track_name(s, &d->tr[k], y + 12);
        if (!levels)
            text_at(s, PLOT_X0 + 6, y + 12, 10, 0, C_GREY, A_START, NULL, "no spans");
        for (int lv = 0; lv < levels; lv++) {
            double m0 = -1, m1 = -1; /* the merged box waiting to be drawn */
            const span *msp = NULL;
            for (int i = first; i <= end; i++) {
                const span *sp = i < end ? &d->sp[i] : NULL;
                if (sp && (sp->level != lv || !(trace_overlaps(sp, t0, t1) || (sp->dur == 0 && sp->ts >= t0 && sp->ts <= t1))))
                    continue;
                double x0 = 0, x1 = 0;
                int own = 0;
                if (sp) {
                    x0 = PLOT_X0 + ((sp->ts > t0 ? sp->ts : t0) - t0) * scale;
                    x1 = PLOT_X0 + ((sp->ts + sp->dur < t1 ? sp->ts + sp->dur : t1) - t0) * scale;
                    own = zoomed || !strcmp(sp->cat, "step") || x1 - x0 >= 3;
                    if (!own && msp && !strcmp(msp->cat, sp->cat) && x0 <= m1 + 0.75) {
                        m1 = x1 > m1 ? x1 : m1;
                        continue;
                    }
                }
                if (msp) /* flush the merged box */
                    span_box(s, msp, m0, m1, y, lv, NULL, NULL, 0);
                msp = NULL;
                if (!sp)
                    break;
                if (own) {
                    const int step = !strcmp(sp->cat, "step");
                    if (zoomed || step)
                        span_attrs(sp, attrs, sizeof attrs);
                    span_box(s, sp, x0, x1, y, lv, zoomed ? "span" : step ? "step" : NULL,
                             zoomed || step ? attrs : NULL, 1);
                } else {
                    msp = sp, m0 = x0, m1 = x1;
                }
            }
        }
        if (zoomed)
            text_at(s, RIGHT, y + 12, 10, 0, C_GREY, A_END, NULL, "%s", fmt_time(trace_busy(d, k, t0, t1), tb, sizeof tb));
        y += h + 5;
    }
    return y;
}

static int is_bytes(const counter *c, int si)
{
    return strstr(c->name, "memory") || strstr(c->name, "bytes") || !strcmp(c->series[si], "bytes");
}

static const char *fmt_value(const counter *c, int si, double v, char *buf, size_t n)
{
    if (is_bytes(c, si) && v >= 0 && v < 1.8e19) /* what a uint64_t holds */
        return engine_format_bytes((uint64_t)v, buf, n);
    snprintf(buf, n, "%.6g", v);
    return buf;
}

/* Each counter a step chart over [t0, t1), its series' largest values under it. */
static double draw_counters(svg *s, const trace_data *d, double y, double t0, double t1)
{
    static const char *const palette[] = {"#4c72b0", "#dd8452", "#55a868", "#c44e52"};
    const double scale = (PLOT_X1 - PLOT_X0) / (t1 > t0 ? t1 - t0 : 1.0);
    for (int k = 0; k < d->n_ct; k++) {
        const counter *c = &d->ct[k];
        double top = 0;
        for (int i = 0; i < c->n; i++)
            for (int si = 0; si < c->n_series; si++)
                top = c->v[(size_t)i * MAX_SERIES + si] > top ? c->v[(size_t)i * MAX_SERIES + si] : top;
        top = top > 0 ? top : 1;
        fprintf(s->f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#f6f6f6\"/>\n", PLOT_X0, y,
                PLOT_X1 - PLOT_X0, CHART_H);
        track_name(s, &(track){.name = c->name}, y + 12);
        for (int si = 0; si < c->n_series; si++) {
            const int limit = !strcmp(c->series[si], "capacity") || !strcmp(c->series[si], "budget");
            fprintf(s->f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\"%s points=\"",
                    limit ? "#888888" : palette[si % 4], limit ? " stroke-dasharray=\"5 3\"" : "");
            double prev = -1;
            for (int i = 0; i < c->n; i++) {
                const double x = PLOT_X0 + (c->ts[i] - t0) * scale;
                double frac = c->v[(size_t)i * MAX_SERIES + si] / top; /* below zero: drawn at zero */
                frac = frac > 0 ? (frac < 1 ? frac : 1) : 0;
                const double v = y + CHART_H - 2 - (CHART_H - 4) * frac;
                if (prev >= 0)
                    fprintf(s->f, " %.2f,%.2f", x, prev);
                fprintf(s->f, " %.2f,%.2f", x, v);
                prev = v;
            }
            fprintf(s->f, " %.2f,%.2f\"/>\n", PLOT_X1, prev);
        }
        /* The key: each series' largest value, with its exact value for the tests. */
        double x = PLOT_X0, ky = y + CHART_H + 14;
        for (int si = 0; si < c->n_series; si++) {
            double most = -INFINITY;
            for (int i = 0; i < c->n; i++)
                most = c->v[(size_t)i * MAX_SERIES + si] > most ? c->v[(size_t)i * MAX_SERIES + si] : most;
            char v[32], name[128], series[128], attrs[512], lab[200];
            escape(c->name, name, sizeof name);
            escape(c->series[si], series, sizeof series);
            snprintf(attrs, sizeof attrs, "data-counter=\"%s\" data-series=\"%s\" data-max=\"%.17g\"", name,
                     series, most);
            snprintf(lab, sizeof lab, "%.120s: up to %s", c->series[si], fmt_value(c, si, most, v, sizeof v));
            const int limit = !strcmp(c->series[si], "capacity") || !strcmp(c->series[si], "budget");
            if (x > PLOT_X0 && x + 18 + text_w_of(10, 0, lab) > RIGHT) /* on a line of its own */
                x = PLOT_X0, ky += 15;
            shorten_to(lab, sizeof lab, 10, 0, RIGHT - x - 18);
            fprintf(s->f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\"%s/>\n",
                    x, ky - 4, x + 14, ky - 4, limit ? "#888888" : palette[si % 4],
                    limit ? " stroke-dasharray=\"4 2\"" : "");
            text_at(s, x + 18, ky, 10, 0, NULL, A_START, attrs, "%s", lab);
            x += 18 + text_w_of(10, 0, lab) + 18;
        }
        y = ky + 11;
    }
    return y;
}

/* The colours' key, for the categories the trace has. */
static double draw_key(svg *s, const trace_data *d, double y)
{
    static const struct {
        const char *cat, *words;
    } keys[] = {
        {"step", "prompt pass or decode step (the host's view, or the GPU's)"},
        {"layer", "layer, embed, head (CPU, or the GPU's compute)"},
        {"copy", "streamed layer copied to the GPU"},
        {"host", "layer half the CPU computes while the GPU streams"},
        {"wait", "the GPU waiting for a layer's copy"},
        {"load", "loading"},
    };
    double x = LEFT;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        int have = 0;
        for (int j = 0; j < d->n_sp && !have; j++)
            have = !strcmp(d->sp[j].cat, keys[i].cat);
        if (!have)
            continue;
        const double w = 16 + text_w_of(11, 0, keys[i].words);
        if (x > LEFT && x + w > RIGHT)
            x = LEFT, y += 18;
        fprintf(s->f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"11\" height=\"11\" fill=\"%s\"/>\n", x, y - 9,
                cat_fill(keys[i].cat));
        text_at(s, x + 16, y, 11, 0, NULL, A_START, NULL, "%s", keys[i].words);
        x += w + 20;
    }
    return y + 26;
}

/* A metadata entry as text ("" when missing). */
static const char *meta_str(const trace_data *d, const char *key, char *buf, size_t n)
{
    const json_t *v = d->meta ? json_object_get(d->meta, key) : NULL;
    if (json_is_string(v))
        snprintf(buf, n, "%s", json_string_value(v));
    else if (json_is_number(v))
        snprintf(buf, n, "%.17g", json_number_value(v));
    else
        buf[0] = 0;
    return buf;
}

static double draw_caption(svg *s, const trace_data *d, double y, const char *source, const char *note)
{
    char model[512], buf[1024], tb[32];
    meta_str(d, "model", model, sizeof model);
    /* The title: the model's folder name; what the engine says of it, under it. */
    char *rest = strstr(model, " (");
    if (rest)
        *rest++ = 0;
    const char *base = strrchr(model, '/') && strrchr(model, '/')[1] ? strrchr(model, '/') + 1 : model;
    char whole[400];
    meta_str(d, "device", buf, sizeof buf);
    snprintf(whole, sizeof whole, "Trace of %.90s, %s on %.200s", base[0] ? base : "a run",
             fmt_time(d->t_end, tb, sizeof tb), buf[0] ? buf : "?");
    shorten_to(whole, sizeof whole, 18, 1, RIGHT - LEFT);
    text_at(s, LEFT, y, 18, 1, NULL, A_START, NULL, "%s", whole);
    y += 21;
    if (note && note[0])
        y = wrapped(s, LEFT, y, 12, 1, "#c03030", note) + 1;
    const char *keys[] = {"plan", "budget"};
    char line[1400];
    if (rest) {
        snprintf(line, sizeof line, "model: %s %s", model, rest);
        y = wrapped(s, LEFT, y, 12, 0, NULL, line);
    }
    for (size_t i = 0; i < 2; i++)
        if (meta_str(d, keys[i], buf, sizeof buf)[0]) {
            snprintf(line, sizeof line, "%s: %s", keys[i], buf);
            y = wrapped(s, LEFT, y, 12, 0, NULL, line);
        }
    int samples = 0;
    for (int i = 0; i < d->n_ct; i++)
        samples += d->ct[i].n;
    snprintf(line, sizeof line, "%d spans on %d tracks, %d counter samples%s%s; open the JSON in ui.perfetto.dev to "
             "explore it", d->n_sp, d->n_tr, samples, source ? " from " : "", source ? source : "");
    y = wrapped(s, LEFT, y, 11, 0, C_GREY, line);
    return y + 8;
}

int trace_svg_write(FILE *f, const json_t *root, const char *source, const char *note, trace_svg_stats *stats,
                    char *err, size_t err_size)
{
    trace_data d = {0};
    if (trace_read(root, &d, err, err_size)) {
        trace_data_free(&d);
        return -2;
    }
    zoom z = {0};
    const int have_zoom = trace_pick_zoom(&d, &z);
    char *body = NULL;
    size_t body_len = 0;
    svg s = {.f = open_memstream(&body, &body_len), .lab = {.width = WIDTH}};
    if (!s.f || have_zoom < 0) {
        if (s.f)
            fclose(s.f);
        free(body);
        trace_data_free(&d);
        snprintf(err, err_size, "out of memory");
        return -1;
    }
    s.zoom_event = have_zoom > 0 && z.step ? z.step->event : -1;
    char tb[32], tb2[32], line[512];
    double y = 30;
    y = draw_caption(&s, &d, y, source, note);
    y = draw_key(&s, &d, y);

    text_at(&s, LEFT, y, 14, 1, NULL, A_START, NULL, "The whole run%s", have_zoom > 0 ? " (the zoomed step in yellow)" : "");
    y += 22;
    const double rows0 = y + 6;
    axis(&s, y, 0, d.t_end, y + 6);
    y = draw_rows(&s, &d, rows0, 0, d.t_end, 0);
    if (have_zoom > 0) {
        const double sc = (PLOT_X1 - PLOT_X0) / (d.t_end > 0 ? d.t_end : 1.0);
        const double x0 = PLOT_X0 + z.t0 * sc, w = (z.t1 - z.t0) * sc;
        fprintf(s.f, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"#ffd000\" fill-opacity=\"0.35\" "
                "stroke=\"#d4a000\" stroke-width=\"1\"/>\n", w < 3 ? x0 + w / 2 - 1.5 : x0, rows0 - 3, w < 3 ? 3 : w,
                y - rows0 + 1);
    }
    y += 6;
    y = draw_counters(&s, &d, y, 0, d.t_end);

    if (have_zoom > 0) {
        y += 10;
        text_at(&s, LEFT, y, 14, 1, NULL, A_START, NULL, "One %s, zoomed: %s",
                z.step ? z.step->name : "pass the GPU timed", fmt_time(z.t1 - z.t0, tb, sizeof tb));
        y += 18;
        snprintf(line, sizeof line, "%s %d of the run's %d %s, at %s: the median by wall time of those after the "
                 "first %d. Each track's busy time in the window is on its right.",
                 z.step ? z.step->name : "pass", z.index, z.count, z.what, fmt_time(z.t0, tb2, sizeof tb2), z.skipped);
        y = wrapped(&s, LEFT, y, 11, 0, C_GREY, line) + 8;
        const double rows1 = y + 6;
        axis(&s, y, z.t0, z.t1, y + 6);
        y = draw_rows(&s, &d, rows1, z.t0, z.t1, 1);
        int gpu = -1, copy = -1;
        for (int k = 0; k < d.n_tr; k++) {
            gpu = gpu < 0 && d.tr[k].kind == K_GPU && trace_busy(&d, k, z.t0, z.t1) > 0 ? k : gpu;
            copy = copy < 0 && d.tr[k].kind == K_COPY && trace_busy(&d, k, z.t0, z.t1) > 0 ? k : copy;
        }
        if (gpu >= 0 && copy >= 0) {
            const double c = trace_busy(&d, copy, z.t0, z.t1), both = trace_together(&d, gpu, copy, z.t0, z.t1);
            char tb3[32];
            snprintf(line, sizeof line, "copies %s, GPU compute %s, both at once %s: %.0f%% of the copy time hidden "
                     "behind compute",
                     fmt_time(c, tb, sizeof tb), fmt_time(trace_busy(&d, gpu, z.t0, z.t1), tb2, sizeof tb2),
                     fmt_time(both, tb3, sizeof tb3), c > 0 ? 100.0 * both / c : 0.0);
            y = wrapped(&s, LEFT, y + 12, 12, 0, NULL, line);
        }
    }
    const double height = y + 10;
    int rc = fclose(s.f) == 0 && !s.lab.oom ? 0 : -1;
    if (rc)
        snprintf(err, err_size, "out of memory");
    if (rc == 0) {
        fprintf(f,
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%.0f\" height=\"%.0f\" "
                "viewBox=\"0 0 %.0f %.0f\" font-family=\"%s\" fill=\"%s\">\n"
                "<title>Trace timeline</title>\n"
                "<rect x=\"0\" y=\"0\" width=\"%.0f\" height=\"%.0f\" fill=\"#ffffff\"/>\n",
                WIDTH, height, WIDTH, height, FONTS, C_TEXT, WIDTH, height);
        fwrite(body, 1, body_len, f);
        fputs("</svg>\n", f);
        if (ferror(f) || fflush(f)) {
            rc = -1;
            snprintf(err, err_size, "%s", strerror(errno));
        }
    }
    free(body);
    if (stats) {
        *stats = (trace_svg_stats){.n_labels = s.lab.n_labels, .n_overlaps = s.lab.n_overlaps,
                                   .n_outside = s.lab.n_outside, .zoom_event = s.zoom_event, .width = WIDTH,
                                   .height = height, .n_spans = d.n_sp, .n_tracks = d.n_tr, .n_counters = d.n_ct};
        snprintf(stats->first_problem, sizeof stats->first_problem, "%s", s.lab.first_problem);
    }
    svg_labels_free(&s.lab);
    trace_data_free(&d);
    return rc;
}

int trace_svg_file(const char *json_path, const char *svg_path, const char *note, trace_svg_stats *stats,
                   char *err, size_t err_size)
{
    json_error_t je;
    json_t *root = json_load_file(json_path, JSON_DECODE_ANY, &je);
    if (!root) {
        if (je.line < 1)
            snprintf(err, err_size, "%s: cannot read the trace: %s", json_path, je.text);
        else
            snprintf(err, err_size, "%s: not JSON: %s (line %d, column %d)", json_path, je.text, je.line, je.column);
        return -1;
    }
    char why[400];
    FILE *f = fopen(svg_path, "w");
    if (!f) {
        snprintf(err, err_size, "%s: cannot write the SVG: %s", svg_path, strerror(errno));
        json_decref(root);
        return -1;
    }
    const char *base = strrchr(json_path, '/') ? strrchr(json_path, '/') + 1 : json_path;
    int rc = trace_svg_write(f, root, base, note, stats, why, sizeof why);
    const int bad_close = fclose(f) != 0;
    json_decref(root);
    if (rc == 0 && bad_close)
        snprintf(err, err_size, "%s: cannot write the SVG: %s", svg_path, strerror(errno)), rc = -1;
    else if (rc)
        snprintf(err, err_size, "%s: %s", rc == -2 ? json_path : svg_path, why);
    struct stat sb;
    if (rc && stat(svg_path, &sb) == 0 && S_ISREG(sb.st_mode))
        remove(svg_path); /* no half picture */
    return rc ? -1 : 0;
}
