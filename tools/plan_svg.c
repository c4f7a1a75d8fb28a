/*
 * plan_svg.c: the offload plan drawn as one SVG picture (plan_svg.h).
 *
 * The picture is built top to bottom into a memory stream (its height is
 * known only at the end), then written out after the <svg> header. Labels
 * go through svg_label, which estimates each one's box from its length
 * and counts the pairs that overlap, so that a test can hold every layout
 * (long names, many layers, tiny parts) to "no label covers another".
 */
#define _POSIX_C_SOURCE 200809L /* open_memstream */

#include "plan_svg.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "plan_report.h"
#include "svg_labels.h"

#define WIDTH 960.0
#define LEFT 20.0
#define RIGHT (WIDTH - 20.0)
/* A character's advance in ems, for the layout check: DejaVu Sans (what sans-serif is on Debian, and among
 * the widest) averages about 0.55 on text and 0.64 on digits; Helvetica and Arial are narrower. */
#define CHAR_EM 0.62
#define BOLD_EM 0.68

static const char *const FONTS = "DejaVu Sans, Verdana, Helvetica, Arial, sans-serif";

/* Colours: a placement keeps its colour wherever it appears (the budget bar's stream buffers are the streamed
 * layers' colour, the token's PCIe bar too). */
#define C_RESIDENT "#4c72b0"
#define C_STREAMED "#dd8452"
#define C_HOST "#55a868"
#define C_KV "#8172b3"
#define C_ACT "#ccb974"
#define C_CTX "#8c8c8c"
#define C_FREE "#f2f2f2"
#define C_TEXT "#222222"
#define C_GREY "#666666"
#define C_WALL "#444444"
#define C_OVERLAP "#937860"
#define C_BAD "#c03030"

/* ------------------------------------------------------------ labels */

/* One text element's content: plain runs and <tspan>s carrying a figure's JSON path and exact value. */
typedef struct label {
    char buf[4096];
    size_t len;
    int chars; /* visible characters, for the width estimate */
} label;

static void lab_raw(label *l, const char *s)
{
    size_t n = strlen(s);
    if (l->len + n < sizeof l->buf) {
        memcpy(l->buf + l->len, s, n + 1);
        l->len += n;
    }
}

/* Visible text, escaped for XML; counts its characters (UTF-8 lead bytes). */
static void lab_text(label *l, const char *s)
{
    for (; *s; s++) {
        char one[2] = {*s, 0};
        lab_raw(l, *s == '&' ? "&amp;" : *s == '<' ? "&lt;" : *s == '>' ? "&gt;" : *s == '"' ? "&quot;" : one);
        l->chars += ((unsigned char)*s & 0xC0) != 0x80;
    }
}

static void lab_textf(label *l, const char *fmt, ...)
{
    char tmp[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    lab_text(l, tmp);
}

/* A figure: shown as `shown`, tagged with the JSON path `key` and its exact value. */
static void lab_value(label *l, const char *key, const char *value, const char *shown)
{
    lab_raw(l, "<tspan data-key=\"");
    lab_raw(l, key);
    lab_raw(l, "\" data-value=\"");
    lab_raw(l, value);
    lab_raw(l, "\">");
    lab_text(l, shown);
    lab_raw(l, "</tspan>");
}

static void lab_bytes(label *l, const char *key, uint64_t v)
{
    char value[32], shown[32];
    snprintf(value, sizeof value, "%llu", (unsigned long long)v);
    lab_value(l, key, value, engine_format_bytes(v, shown, sizeof shown));
}

/* A real figure: its value with JSON's precision (value_fmt), shown with shown_fmt. */
static void lab_real(label *l, const char *key, double v, const char *value_fmt, const char *shown_fmt)
{
    char value[48], shown[48];
    snprintf(value, sizeof value, value_fmt, v);
    snprintf(shown, sizeof shown, shown_fmt, v);
    lab_value(l, key, value, shown);
}

static void lab_int(label *l, const char *key, int v)
{
    char value[24];
    snprintf(value, sizeof value, "%d", v);
    lab_value(l, key, value, value);
}

/* ------------------------------------------------------------ the picture */

typedef struct svg {
    FILE *f;        /* the body */
    svg_labels lab; /* its labels' boxes, checked as they are drawn */
} svg;

enum { A_START, A_MIDDLE, A_END };

typedef struct style {
    double size;
    int bold;
    const char *fill; /* NULL: the picture's text colour */
} style;

static const style S_TITLE = {18, 1, NULL}, S_HEAD = {14, 1, NULL}, S_TEXT = {12, 0, NULL},
                   S_SMALL = {11, 0, NULL}, S_NOTE = {11, 0, C_GREY}, S_BIG = {16, 1, NULL},
                   S_COLHEAD = {11, 1, C_GREY};

static double text_width(const style *st, int chars)
{
    return chars * st->size * (st->bold ? BOLD_EM : CHAR_EM);
}

/* A text element at baseline y. */
static void svg_label(svg *s, double x, double y, const style *st, int anchor, const label *l)
{
    const double w = text_width(st, l->chars);
    const double x0 = anchor == A_START ? x : anchor == A_END ? x - w : x - w / 2;
    svg_labels_note(&s->lab, (svg_box){x0, y - 0.8 * st->size, x0 + w, y + 0.25 * st->size}, l->buf);
    char fill[40] = "";
    if (st->fill)
        snprintf(fill, sizeof fill, " fill=\"%s\"", st->fill);
    fprintf(s->f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"%g\"%s%s%s>%s</text>\n", x, y, st->size,
            st->bold ? " font-weight=\"bold\"" : "",
            anchor == A_MIDDLE ? " text-anchor=\"middle\"" : anchor == A_END ? " text-anchor=\"end\"" : "", fill,
            l->buf);
}

/* Plain text, printf-style. */
static void svg_textf(svg *s, double x, double y, const style *st, int anchor, const char *fmt, ...)
{
    char tmp[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    label l = {.len = 0};
    lab_text(&l, tmp);
    svg_label(s, x, y, st, anchor, &l);
}

static void svg_rect(svg *s, double x, double y, double w, double h, const char *fill, const char *extra)
{
    fprintf(s->f, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\"%s%s/>\n", x, y,
            w > 0 ? w : 0, h, fill, extra ? " " : "", extra ? extra : "");
}

/* A colour key: a swatch and its words, flowing left to right and onto a new line at the right edge. */
static void key_item(svg *s, double *x, double *y, const char *fill, const style *st, const label *l)
{
    const double w = 16 + text_width(st, l->chars);
    if (*x > LEFT && *x + w > RIGHT)
        *x = LEFT, *y += st->size + 8;
    svg_rect(s, *x, *y - 0.8 * st->size, 11, 11, fill, "stroke=\"#999\" stroke-width=\"0.5\"");
    svg_label(s, *x + 16, *y, st, A_START, l);
    *x += w + 22;
}

/* Words wrapped to the picture's width; returns the baseline after the last line. */
static double svg_wrapped(svg *s, double y, const style *st, const char *text)
{
    const int per_line = (int)((RIGHT - LEFT) / (st->size * CHAR_EM));
    const char *p = text;
    while (*p) {
        int n = (int)strlen(p);
        if (n > per_line) {
            n = per_line;
            while (n > 0 && p[n] != ' ')
                n--;
            if (n == 0)
                n = per_line;
        }
        svg_textf(s, LEFT, y, st, A_START, "%.*s", n, p);
        y += st->size + 5;
        p += n;
        while (*p == ' ')
            p++;
    }
    return y;
}

/* ------------------------------------------------------------ sections */

/* The name shown for model: its path's last component, its first 40 bytes and "..." past 48 (whole UTF-8
 * characters: a cut never falls inside one). */
static const char *model_name(const char *path, char *buf, size_t n)
{
    size_t len = strlen(path);
    while (len > 1 && path[len - 1] == '/')
        len--;
    size_t start = len;
    while (start > 0 && path[start - 1] != '/')
        start--;
    int keep = (int)(len - start);
    if (keep > 48) {
        keep = 40;
        while (keep > 0 && ((unsigned char)path[start + keep] & 0xC0) == 0x80)
            keep--;
    }
    snprintf(buf, n, "%.*s%s", keep, path + start, keep < (int)(len - start) ? "..." : "");
    return buf;
}

static double draw_title(svg *s, double y, const engine_plan_totals *t, const char *model)
{
    char name[256];
    label l = {.len = 0};
    lab_text(&l, model_name(model, name, sizeof name));
    lab_text(&l, " in ");
    lab_bytes(&l, "budget", t->budget);
    lab_text(&l, " of GPU memory");
    if (t->gpu_name[0])
        lab_textf(&l, " (an %s)", t->gpu_name);
    svg_label(s, LEFT, y, &S_TITLE, A_START, &l);
    y += 22;

    l = (label){.len = 0};
    lab_text(&l, "context ");
    lab_int(&l, "n_ctx", t->n_ctx);
    lab_text(&l, " tokens, KV cache ");
    lab_value(&l, "totals.kv_type", engine_kv_type_name(t->kv_type), engine_kv_type_name(t->kv_type));
    lab_text(&l, t->kv_auto ? " (chosen by --kv auto)" : "");
    lab_text(&l, ", prompts in passes of ");
    lab_int(&l, "totals.n_batch", t->n_batch);
    lab_text(&l, " tokens");
    svg_label(s, LEFT, y, &S_TEXT, A_START, &l);
    y += 18;

    l = (label){.len = 0};
    lab_int(&l, "n_layers", t->n_layers);
    lab_textf(&l, " layers: %d resident on the GPU, ", t->n_layers - t->n_layers_streamed);
    lab_int(&l, "n_layers_streamed", t->n_layers_streamed);
    lab_text(&l, " in host memory, streamed to it (");
    lab_int(&l, "n_layers_host", t->n_layers_host);
    lab_text(&l, " of them computed by the CPU for decode)");
    svg_label(s, LEFT, y, &S_TEXT, A_START, &l);
    if (t->n_expert_layers > 0) { /* placed an expert at a time */
        y += 18;
        l = (label){.len = 0};
        lab_text(&l, "routed experts: ");
        lab_int(&l, "totals.n_experts_resident", t->n_experts_resident);
        lab_text(&l, " on the GPU, ");
        lab_int(&l, "totals.n_experts_host", t->n_experts_host);
        lab_textf(&l, " in host memory (%s); %d a token of each layer's ",
                  t->experts_host_gpu ? "GPU reads picks over PCIe" : "the CPU runs a token's picks there",
                  t->n_experts_used);
        lab_int(&l, "totals.n_experts", t->n_experts);
        svg_label(s, LEFT, y, &S_TEXT, A_START, &l);
    }
    return y + 30;
}

/* The budget as one bar filled by its parts, then a key giving each part's bytes. */
static double draw_budget(svg *s, double y, const engine_plan_totals *t)
{
    svg_textf(s, LEFT, y, &S_HEAD, A_START, "GPU memory: the --vram budget and what fills it");
    y += 12;
    const struct {
        const char *key, *name, *fill;
        uint64_t bytes;
    } parts[] = {
        {"totals.weights_resident", "resident weights", C_RESIDENT, t->weights_resident},
        {"totals.stream_buffers", "stream buffers", C_STREAMED, t->stream_buffers},
        {"totals.kv_cache", "KV cache", C_KV, t->kv_cache},
        {"totals.activations", "activations", C_ACT, t->activations},
        {"totals.cuda_context", "CUDA context", C_CTX, t->cuda_context},
        {"totals.free", "free", C_FREE, t->free_bytes},
    };
    const int n_parts = (int)(sizeof parts / sizeof parts[0]);
    const uint64_t whole = t->device_total > t->budget ? t->device_total : t->budget;
    const double scale = whole ? (RIGHT - LEFT) / (double)whole : 0.0, h = 30;
    double x = LEFT;
    for (int i = 0; i < n_parts - 1; i++) {
        const double w = parts[i].bytes * scale;
        svg_rect(s, x, y, w, h, parts[i].fill, NULL);
        x += w;
    }
    /* The arena's rounding to 2 MiB units lies between the parts and device_total: free starts there. */
    const double used = t->device_total * scale;
    svg_rect(s, LEFT + used, y, t->budget > t->device_total ? (t->budget - t->device_total) * scale : 0, h, C_FREE,
             NULL);
    svg_rect(s, LEFT, y, (RIGHT - LEFT), h, "none", "stroke=\"#999\" stroke-width=\"1\"");
    if (t->device_total > t->budget) /* refused: the budget's end marked inside the bar */
        fprintf(s->f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\"/>\n",
                LEFT + t->budget * scale, y - 4, LEFT + t->budget * scale, y + h + 4, C_BAD);
    y += h + 20;

    const double col = (RIGHT - LEFT) / 3;
    for (int i = 0; i < n_parts; i++) {
        label l = {.len = 0};
        lab_textf(&l, "%s ", parts[i].name);
        lab_bytes(&l, parts[i].key, parts[i].bytes);
        double kx = LEFT + (i % 3) * col, ky = y + (i / 3) * 19;
        key_item(s, &kx, &ky, parts[i].fill, &S_TEXT, &l);
    }
    y += 2 * 19 + 4;

    label l = {.len = 0};
    lab_text(&l, "in use ");
    lab_bytes(&l, "totals.device_total", t->device_total);
    lab_text(&l, " of ");
    lab_bytes(&l, "budget", t->budget);
    lab_text(&l, " (2 MiB allocation units); streamed weights wait in host memory: ");
    lab_bytes(&l, "totals.weights_streamed", t->weights_streamed);
    svg_label(s, LEFT, y, &S_SMALL, A_START, &l);
    y += 17;
    l = (label){.len = 0};
    lab_text(&l, "least this model and context need (every layer streamed) ");
    lab_bytes(&l, "totals.minimum", t->minimum);
    lab_text(&l, ", every weight resident ");
    lab_bytes(&l, "totals.all_resident", t->all_resident);
    svg_label(s, LEFT, y, &S_SMALL, A_START, &l);
    if (!t->fits) {
        y += 19;
        l = (label){.len = 0};
        lab_text(&l, "does not fit: ");
        lab_bytes(&l, "totals.device_total", t->device_total);
        lab_text(&l, " over a budget of ");
        lab_bytes(&l, "budget", t->budget);
        svg_label(s, LEFT, y, &(style){12, 1, C_BAD}, A_START, &l);
    }
    return y + 34;
}

/* One bar of a time chart: a name, a bar of `ms` on the scale, and what it means. */
static void time_bar(svg *s, double y, const char *name, double ms, double ms_scale, const char *fill,
                     const char *extra, const label *value)
{
    const double x = 250, max_w = 300;
    svg_textf(s, LEFT, y + 11, &S_TEXT, A_START, "%s", name);
    const double w = ms_scale > 0 ? ms * max_w / ms_scale : 0;
    svg_rect(s, x, y, w, 15, fill, extra);
    svg_label(s, x + w + 8, y + 11, &S_SMALL, A_START, value);
}

/* What a decoded token moves, drawn as the time each link takes, and the decode bound. */
static double draw_token(svg *s, double y, const engine_plan_totals *t)
{
    svg_textf(s, LEFT, y, &S_HEAD, A_START, "Each decoded token: bytes moved, and the time they take");
    y += 14;
    const double ms_hbm = t->hbm_gbps > 0 ? t->read_per_token / (t->hbm_gbps * 1e6) : 0.0;
    const double ms_pcie = t->pcie_gbps > 0 ? t->streamed_per_token / (t->pcie_gbps * 1e6) : 0.0;
    /* The CPU's bytes: hosted layers', and the picks among experts in host memory, which the planner prices at
     * the PCIe rate when the CPU's is not known. */
    const double cpu_gbps = t->host_gbps > 0 ? t->host_gbps : t->pcie_gbps;
    const double ms_host = cpu_gbps > 0 ? t->host_per_token / (cpu_gbps * 1e6) : 0.0;
    const int on_cpu = t->host_per_token > 0;
    double scale = ms_hbm > ms_pcie ? ms_hbm : ms_pcie;
    scale = on_cpu && ms_host > scale ? ms_host : scale;

    label l = {.len = 0};
    lab_bytes(&l, "totals.read_per_token", t->read_per_token);
    lab_text(&l, " at ");
    lab_real(&l, "totals.hbm_gbps", t->hbm_gbps, "%.2f", "%.0f GB/s");
    lab_textf(&l, ": %.2f ms", ms_hbm);
    time_bar(s, y, "read from GPU memory (HBM)", ms_hbm, scale, C_RESIDENT, NULL, &l);
    y += 21;
    l = (label){.len = 0};
    lab_bytes(&l, "totals.streamed_per_token", t->streamed_per_token);
    lab_text(&l, " at ");
    lab_real(&l, "totals.pcie_gbps", t->pcie_gbps, "%.2f", "%.1f GB/s");
    lab_textf(&l, ": %.2f ms", ms_pcie);
    time_bar(s, y, t->experts_host_gpu && t->n_experts_host > 0 ? "over PCIe (copies, expert reads)" : "copied over PCIe",
             ms_pcie, scale, C_STREAMED, NULL, &l);
    y += 21;
    if (on_cpu) {
        l = (label){.len = 0};
        lab_bytes(&l, "totals.host_per_token", t->host_per_token);
        lab_text(&l, " at ");
        if (t->host_gbps > 0)
            lab_real(&l, "totals.host_gbps", t->host_gbps, "%.2f", "%.1f GB/s");
        else
            lab_textf(&l, "PCIe's rate (CPU unmeasured)");
        lab_textf(&l, ": %.2f ms", ms_host);
        time_bar(s, y, t->n_layers_host > 0 ? "read by the CPU (its layers)" : "read by the CPU (its experts)",
                 ms_host, scale, C_HOST, NULL, &l);
        y += 21;
    }
    y += 16;
    l = (label){.len = 0};
    lab_text(&l, "decode bound ");
    lab_real(&l, "totals.tokens_per_second", t->tokens_per_second, "%.3f", "%.1f tok/s");
    svg_label(s, LEFT, y, &S_BIG, A_START, &l);
    y += 17;
    /* The planner's bound (engine/plan.c): one sum without CPU layers, a simulated step with them. */
    if (!on_cpu)
        svg_textf(s, LEFT, y, &S_NOTE, A_START, "= 1 / (the GPU memory time + the PCIe time)");
    else
        svg_textf(s, LEFT, y, &S_NOTE, A_START,
                  "a step as the planner simulates it: copies, the CPU's layers and the GPU's interleave");
    y += 17;
    if (t->n_layers_host > 0 && t->shared_gbps > 0) {
        l = (label){.len = 0};
        lab_text(&l, "host memory serves the copies and the CPU together at ");
        lab_real(&l, "totals.shared_gbps", t->shared_gbps, "%.2f", "%.1f GB/s");
        svg_label(s, LEFT, y, &S_NOTE, A_START, &l);
        y += 17;
    }
    l = (label){.len = 0};
    lab_text(&l, "every weight resident: ");
    lab_real(&l, "totals.resident_tokens_per_second", t->resident_tokens_per_second, "%.3f", "%.1f tok/s");
    if (t->fits) {
        lab_textf(&l, "; with the context full (%d tokens, the whole KV cache read too): ", t->n_ctx);
        lab_real(&l, "totals.full_ctx_tokens_per_second", t->full_ctx_tokens_per_second, "%.3f", "%.1f tok/s");
    }
    svg_label(s, LEFT, y, &S_SMALL, A_START, &l);
    return y + 34;
}

static const char *place_fill(engine_placement p)
{
    return p == ENGINE_PLACE_STREAMED ? C_STREAMED : p == ENGINE_PLACE_HOST ? C_HOST : C_RESIDENT;
}

/* One row per part, its bar as long as its bytes, coloured by where it lives. */
static double draw_layers(svg *s, double y, const engine_plan *plan)
{
    svg_textf(s, LEFT, y, &S_HEAD, A_START, "Where each part lives");
    y += 22;
    double kx = LEFT;
    const struct {
        const char *fill, *words;
    } keys[] = {
        {C_RESIDENT, "resident on the GPU"},
        {C_STREAMED, "in host memory, copied to the GPU every pass"},
        {C_HOST, "in host memory, computed by the CPU for decode (copied for prompts)"},
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        label l = {.len = 0};
        lab_text(&l, keys[i].words);
        key_item(s, &kx, &y, keys[i].fill, &S_SMALL, &l);
    }
    y += 24;
    const double bar_x = 110, bar_w = 270, fmt_x = 392, bytes_x = 545, place_x = 562, kv_x = 760, pcie_x = RIGHT;
    svg_textf(s, LEFT, y, &S_COLHEAD, A_START, "part");
    svg_textf(s, bar_x, y, &S_COLHEAD, A_START, "weights");
    svg_textf(s, fmt_x, y, &S_COLHEAD, A_START, "format");
    svg_textf(s, bytes_x, y, &S_COLHEAD, A_END, "size");
    svg_textf(s, place_x, y, &S_COLHEAD, A_START, "placement");
    svg_textf(s, kv_x, y, &S_COLHEAD, A_END, "KV cache");
    svg_textf(s, pcie_x, y, &S_COLHEAD, A_END, "over PCIe a token");
    y += 6;

    uint64_t most = 1;
    for (size_t i = 0; i < engine_plan_n_entries(plan); i++) {
        const uint64_t b = engine_plan_entry_at(plan, i)->weight_bytes;
        most = b > most ? b : most;
    }
    const double row = 16;
    for (size_t i = 0; i < engine_plan_n_entries(plan); i++) {
        const engine_plan_entry *r = engine_plan_entry_at(plan, i);
        char key[64], part[32];
        if (i % 2)
            svg_rect(s, LEFT - 4, y, RIGHT - LEFT + 8, row, "#f5f5f5", NULL);
        const double base = y + 12;
        svg_textf(s, LEFT, base, &S_SMALL, A_START, "%s", report_part(r, part, sizeof part));
        /* A resident expert layer's experts in host memory: the end of its bar in the host's colour. */
        const int split = r->placement == ENGINE_PLACE_RESIDENT && r->experts_resident < r->n_experts;
        const uint64_t away = split ? (uint64_t)(r->n_experts - r->experts_resident) * r->expert_bytes : 0;
        const double w_dev = (double)(r->weight_bytes - away) * bar_w / (double)most;
        svg_rect(s, bar_x, y + 3, w_dev, row - 6, place_fill(r->placement), NULL);
        if (split)
            svg_rect(s, bar_x + w_dev, y + 3, (double)away * bar_w / (double)most, row - 6, C_HOST, NULL);
        label l = {.len = 0};
        snprintf(key, sizeof key, "entries.%zu.format", i);
        lab_value(&l, key, r->format, r->format);
        svg_label(s, fmt_x, base, &S_SMALL, A_START, &l);
        l = (label){.len = 0};
        snprintf(key, sizeof key, "entries.%zu.weight_bytes", i);
        lab_bytes(&l, key, r->weight_bytes);
        svg_label(s, bytes_x, base, &S_SMALL, A_END, &l);
        l = (label){.len = 0};
        snprintf(key, sizeof key, "entries.%zu.placement", i);
        lab_value(&l, key, report_place(r->placement),
                  r->placement == ENGINE_PLACE_HOST ? "CPU (decode)" : report_place(r->placement));
        if (split) { /* its experts on the GPU, of all */
            lab_text(&l, " ");
            snprintf(key, sizeof key, "entries.%zu.experts_resident", i);
            lab_int(&l, key, r->experts_resident);
            lab_text(&l, "/");
            snprintf(key, sizeof key, "entries.%zu.n_experts", i);
            lab_int(&l, key, r->n_experts);
        }
        svg_label(s, place_x, base, &(style){11, 0, place_fill(r->placement)}, A_START, &l);
        l = (label){.len = 0};
        if (r->part == ENGINE_PLAN_LAYER) {
            snprintf(key, sizeof key, "entries.%zu.kv_bytes", i);
            lab_bytes(&l, key, r->kv_bytes);
        } else {
            lab_text(&l, "-");
        }
        svg_label(s, kv_x, base, &S_SMALL, A_END, &l);
        l = (label){.len = 0};
        snprintf(key, sizeof key, "entries.%zu.bytes_per_token", i);
        lab_bytes(&l, key, r->bytes_per_token);
        svg_label(s, pcie_x, base, &S_SMALL, A_END, &l);
        y += row;
    }
    return y + 34;
}

/* One pass kind's measured figures: wall, copies, compute, overlap (and the CPU's layers) a pass, and the bound. */
static double draw_measured_kind(svg *s, double y, const char *name, const engine_offload_times *m,
                                 const engine_plan_totals *t, int decode)
{
    const double per = 1e3 / m->passes; /* seconds summed over the passes -> ms a pass */
    const double wall = m->wall_seconds * per, copy = m->copy_seconds * per, comp = m->compute_seconds * per;
    const double over = m->overlap_seconds * per, host = m->host_seconds * per;
    /* The bound: decode, the plan's; prompts, their copies at the planned PCIe rate. */
    const double bound = decode ? (t->tokens_per_second > 0 ? 1e3 / t->tokens_per_second : 0.0)
                         : t->pcie_gbps > 0 ? m->bytes_copied / (t->pcie_gbps * 1e6) / m->passes
                                            : 0.0;
    double scale = wall;
    const double all[] = {copy, comp, host, bound};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        scale = all[i] > scale ? all[i] : scale;

    svg_textf(s, LEFT, y, &(style){12, 1, NULL}, A_START, "%s: %d %s measured, %d token%s", name, m->passes,
              decode ? (m->passes == 1 ? "step" : "steps") : (m->passes == 1 ? "pass" : "passes"), m->tokens,
              m->tokens == 1 ? "" : "s");
    y += 8;
    label l = {.len = 0};
    lab_textf(&l, "%.1f ms a %s (%.1f a second)", wall, decode ? "step" : "pass", wall > 0 ? 1e3 / wall : 0.0);
    time_bar(s, y, "wall time", wall, scale, C_WALL, NULL, &l);
    y += 21;
    l = (label){.len = 0};
    lab_textf(&l, "%.1f ms, %.1f GB/s", copy, m->copy_seconds > 0 ? m->bytes_copied / m->copy_seconds / 1e9 : 0.0);
    time_bar(s, y, "copies (streamed layers)", copy, scale, C_STREAMED, NULL, &l);
    y += 21;
    l = (label){.len = 0};
    lab_textf(&l, "%.1f ms", comp);
    time_bar(s, y, "GPU compute", comp, scale, C_RESIDENT, NULL, &l);
    y += 21;
    l = (label){.len = 0};
    lab_textf(&l, "%.1f ms: %.0f%% of the copy time hidden", over, copy > 0 ? 100.0 * over / copy : 0.0);
    time_bar(s, y, "copies and compute at once", over, scale, C_OVERLAP, NULL, &l);
    y += 21;
    if (m->host_seconds > 0) {
        l = (label){.len = 0};
        lab_textf(&l, "%.1f ms", host);
        time_bar(s, y, "the CPU's layers", host, scale, C_HOST, NULL, &l);
        y += 21;
    }
    l = (label){.len = 0};
    if (decode)
        lab_textf(&l, "%.1f ms: the plan's decode bound, %.1f tok/s", bound, t->tokens_per_second);
    else
        lab_textf(&l, "%.1f ms: its copies at %.1f GB/s", bound, t->pcie_gbps);
    time_bar(s, y, "bound", bound, scale, "none", "stroke=\"#444\" stroke-dasharray=\"4 3\"", &l);
    return y + 36;
}

static double draw_measured(svg *s, double y, const engine_offload_report *off, const engine_plan_totals *t)
{
    svg_textf(s, LEFT, y, &S_HEAD, A_START, "Measured in this run, a pass at a time");
    y += 18;
    svg_textf(s, LEFT, y, &S_NOTE, A_START,
              "%d of %d layers streamed%s; copies and compute from CUDA events on their streams", off->n_layers_streamed,
              off->n_layers, off->n_layers_host > 0 ? ", some computed by the CPU for decode" : "");
    y += 24;
    if (off->prefill.passes > 0)
        y = draw_measured_kind(s, y, "prefill", &off->prefill, t, 0);
    if (off->decode.passes > 0)
        y = draw_measured_kind(s, y, "decode", &off->decode, t, 1);
    return y;
}

static double draw_footer(svg *s, double y, const engine_plan *plan, const engine_plan_totals *t)
{
    char a[96], b[96];
    svg_textf(s, LEFT, y, &S_NOTE, A_START, "GPU memory at %.1f GB/s (%s); host to GPU at %.1f GB/s (%s)", t->hbm_gbps,
              report_source(t->hbm_source, t->gpu_name, a, sizeof a), t->pcie_gbps,
              report_source(t->pcie_source, t->gpu_name, b, sizeof b));
    y += 17;
    return svg_wrapped(s, y, &S_NOTE, engine_plan_summary(plan));
}

int plan_svg_write(FILE *f, const engine_plan *plan, const char *model, const engine_offload_report *off,
                   plan_svg_stats *stats)
{
    char *body = NULL;
    size_t body_len = 0;
    svg s = {.f = open_memstream(&body, &body_len), .lab = {.width = WIDTH}};
    if (!s.f)
        return -1;
    const engine_plan_totals *t = engine_plan_get_totals(plan);
    double y = 32;
    y = draw_title(&s, y, t, model);
    y = draw_budget(&s, y, t);
    y = draw_token(&s, y, t);
    y = draw_layers(&s, y, plan);
    if (off && off->n_layers_streamed > 0 && (off->prefill.passes > 0 || off->decode.passes > 0))
        y = draw_measured(&s, y, off, t);
    y = draw_footer(&s, y, plan, t);
    const double height = y + 8;
    int rc = fclose(s.f) == 0 && !s.lab.oom ? 0 : -1;
    if (rc == 0) {
        char name[256], budget[32];
        label title = {.len = 0};
        lab_textf(&title, "Offload plan: %s in %s of GPU memory", model_name(model, name, sizeof name),
                  engine_format_bytes(t->budget, budget, sizeof budget));
        label desc = {.len = 0};
        lab_text(&desc, engine_plan_summary(plan));
        fprintf(f,
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%.0f\" height=\"%.0f\" "
                "viewBox=\"0 0 %.0f %.0f\" font-family=\"%s\" fill=\"%s\">\n"
                "<title>%s</title>\n<desc>%s</desc>\n"
                "<rect x=\"0\" y=\"0\" width=\"%.0f\" height=\"%.0f\" fill=\"#ffffff\"/>\n",
                WIDTH, height, WIDTH, height, FONTS, C_TEXT, title.buf, desc.buf, WIDTH, height);
        fwrite(body, 1, body_len, f);
        fputs("</svg>\n", f);
        rc = ferror(f) || fflush(f) ? -1 : 0;
    }
    free(body);
    if (stats) {
        *stats = (plan_svg_stats){.n_labels = s.lab.n_labels, .n_overlaps = s.lab.n_overlaps,
                                  .n_outside = s.lab.n_outside, .width = WIDTH, .height = height};
        snprintf(stats->first_problem, sizeof stats->first_problem, "%s", s.lab.first_problem);
    }
    svg_labels_free(&s.lab);
    return rc;
}
