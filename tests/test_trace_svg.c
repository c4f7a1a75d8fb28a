/*
 * test_trace_svg.c: the trace's timeline (tools/trace_svg.c, --trace-svg,
 * build/trace_svg) on synthetic traces shaped as the engine writes them, so
 * that what only a GPU run records (the device's compute and copy engine,
 * the CPU's hosted layers, device memory) is drawn and checked here without
 * one:
 *  - a streamed decode with hosted layers, whose steps the GPU timed: the
 *    zoomed step is the median by wall time of those after the first three,
 *    every step of the run is a box carrying its exact values, the zoomed
 *    step's spans on all four tracks are boxes of their own, and the copy /
 *    compute overlap line is there;
 *  - decode steps the GPU did not time and three passes it timed alone (as
 *    --report's profiled steps are recorded): those passes are zoomed;
 *  - decode steps through the graph with their "GPU decode step" spans (the
 *    graph's stamps): the median of those is zoomed;
 *  - many sessions, long track and model names, one span of no length: no
 *    label's estimated box overlaps another or leaves the picture, in any;
 *  - bad input (not an object, no traceEvents, a span without dur, no
 *    spans, unreadable or invalid files): an error naming the file, and no
 *    picture left behind.
 *
 *   test_trace_svg [DIR]   DIR: keep the pictures there (test_trace_svg_cli.sh
 *                          runs xmllint on them); default: a temporary folder
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */

#include <sys/stat.h>
#include <unistd.h>

#include "test_util.h"
#include "tools/trace_svg.h"

static char dir[4096];

/* ------------------------------------------------------------ synthetic traces */

typedef struct gen {
    json_t *ev;
} gen;

static void track(gen *g, int tid, const char *name)
{
    json_array_append_new(g->ev, json_pack("{s:s, s:s, s:i, s:i, s:i, s:{s:s}}", "name", "thread_name", "ph", "M",
                                           "ts", 0, "pid", 1, "tid", tid, "args", "name", name));
    json_array_append_new(g->ev, json_pack("{s:s, s:s, s:i, s:i, s:i, s:{s:i}}", "name", "thread_sort_index", "ph",
                                           "M", "ts", 0, "pid", 1, "tid", tid, "args", "sort_index", tid));
}

/* A span; returns its index in traceEvents. */
static int span(gen *g, int tid, const char *name, const char *cat, double ts, double dur)
{
    json_array_append_new(g->ev, json_pack("{s:s, s:s, s:f, s:f, s:i, s:i, s:s}", "name", name, "ph", "X", "ts", ts,
                                           "dur", dur, "pid", 1, "tid", tid, "cat", cat));
    return (int)json_array_size(g->ev) - 1;
}

static int spanf(gen *g, int tid, const char *cat, double ts, double dur, const char *fmt, int i)
{
    char name[64];
    snprintf(name, sizeof name, fmt, i);
    return span(g, tid, name, cat, ts, dur);
}

static void counter2(gen *g, const char *name, double ts, const char *k0, double v0, const char *k1, double v1)
{
    json_array_append_new(g->ev, json_pack("{s:s, s:s, s:f, s:i, s:i, s:{s:f, s:f}}", "name", name, "ph", "C", "ts",
                                           ts, "pid", 1, "tid", 0, "args", k0, v0, k1, v1));
}

static json_t *finish(gen *g, const char *model, const char *device)
{
    return json_pack("{s:o, s:s, s:{s:s, s:s, s:s, s:s, s:f}}", "traceEvents", g->ev, "displayTimeUnit", "ms",
                     "metadata", "model", model, "device", device, "plan",
                     "13 of 32 layers resident on the GPU, 19 streamed from pinned host memory (5 of them computed "
                     "by the CPU for decode), the output head resident; KV cache f16, 4096 tokens",
                     "budget", "8 GiB", "budget_bytes", 8589934592.0);
}

/* Llama-3.1-8B at 8 GiB as the GPU streams it: layers 0-12 resident, 13-31 streamed, five of those hosted in
 * decode. One decode step from t (microseconds), its durations scaled by slow; with gpu, the device's spans too;
 * with gpu_step (the graph's stamps), a "GPU decode step" span holding them, its index there. Returns the step's
 * end. */
static double decode_step(gen *g, double t, double slow, int gpu, int host_span, int *step_event, int *gpu_step)
{
    const int hosted[] = {15, 19, 23, 27, 31};
    double copy_t = t + 20, gpu_t = t + 30, copy_done[32] = {0};
    for (int l = 13; l < 32; l++) {
        int h = 0;
        for (int k = 0; k < 5; k++)
            h |= hosted[k] == l;
        if (h)
            continue;
        const double c = 4100 * slow;
        if (gpu)
            spanf(g, 4, "copy", copy_t, c, "copy layer %d", l);
        copy_done[l] = copy_t + c;
        copy_t += c;
    }
    for (int l = 0; l < 32; l++) {
        int h = 0;
        for (int k = 0; k < 5; k++)
            h |= hosted[k] == l;
        const double start = copy_done[l] > gpu_t ? copy_done[l] : gpu_t;
        double dur = 140 * slow;
        if (h) { /* the CPU's halves around the GPU's attention */
            spanf(g, 5, "host", start + 5, 2900 * slow, "q/k/v of layer %d", l);
            spanf(g, 5, "host", start + 2960 * slow, 6100 * slow, "o + ffn of layer %d", l);
            dur = 9100 * slow;
        }
        if (gpu && gpu_step) { /* stamped: from the layer before's end, holding its wait for its copy */
            spanf(g, 3, "layer", gpu_t, start + dur - gpu_t, "layer %d", l);
            if (copy_done[l] > 0)
                spanf(g, 3, "wait", gpu_t, start - gpu_t, "copy wait of layer %d", l);
        } else if (gpu) {
            spanf(g, 3, "layer", start, dur, "layer %d", l);
        }
        gpu_t = start + dur;
    }
    const double end = gpu_t + 40;
    if (gpu_step)
        *gpu_step = span(g, 3, "GPU decode step", "step", t + 20, gpu_t - (t + 20));
    if (host_span) {
        *step_event = span(g, 2, "decode step", "step", t, end - t);
    }
    return end;
}

/* The load, a prompt pass, n decode steps; gpu_steps: the GPU timed the decode steps (stamped: in the graph, each
 * with its "GPU decode step", whose indices go to gpu_events); profiled: passes the GPU timed alone after them (no
 * host span). slow[i]: step i's scale. Returns the run's end. */
static json_t *gpu_trace(int n, const double *slow, int gpu_steps, int profiled, int *events, int *prof_start,
                         int *gpu_events)
{
    gen g = {json_array()};
    track(&g, 1, "load");
    track(&g, 2, "session 2 (host)");
    track(&g, 3, "GPU compute (track 3)");
    track(&g, 4, "GPU copy engine (track 4)");
    track(&g, 5, "CPU, hosted layers (track 5)");
    span(&g, 1, "load", "load", 10, 9.1e6);
    span(&g, 1, "config", "load", 20, 400);
    span(&g, 1, "map and validate", "load", 500, 1.2e6);
    span(&g, 1, "pin mappings", "load", 1.3e6, 3.1e6);
    span(&g, 1, "upload", "load", 4.5e6, 4.5e6);
    double t = 9.2e6;
    counter2(&g, "device memory", t, "mapped", 7.1e9, "budget", 8589934592.0);
    /* The prompt pass streams every layer, hosted ones included. */
    span(&g, 2, "prompt pass", "step", t, 95000);
    for (int l = 13; l < 32; l++)
        spanf(&g, 4, "copy", t + 30 + (l - 13) * 4100.0, 4100, "copy layer %d", l);
    /* Untimed steps: the prompt's last layer as the device's clock places it, 50 us into the first step (its
     * spans are placed from the host time the pass was enqueued): that step is still no GPU-timed one. */
    for (int l = 0; l < 32; l++)
        spanf(&g, 3, "layer", l < 13 ? t + 40 + l * 300.0 : t + 4200 + (l - 13) * 4100.0,
              l < 13 ? 300 : l == 31 && !gpu_steps ? 95150 - 78000 : 4000, "layer %d", l);
    t += 95100;
    counter2(&g, "KV cache positions", t, "filled", 512, "capacity", 4096);
    for (int i = 0; i < n; i++) {
        t = decode_step(&g, t, slow[i], gpu_steps, 1, &events[i], gpu_events ? &gpu_events[i] : NULL) + 200;
        counter2(&g, "KV cache positions", t, "filled", 513 + i, "capacity", 4096);
        counter2(&g, "device memory", t, "mapped", 7.6e9, "budget", 8589934592.0);
    }
    *prof_start = (int)json_array_size(g.ev);
    for (int i = 0; i < profiled; i++)
        t = decode_step(&g, t + 500, 1.0 + 0.01 * i, 1, 0, NULL, NULL) + 100;
    return finish(&g, "/data/models/Llama-3.1-8B (LlamaForCausalLM, 32 layers, bf16)", "cuda (NVIDIA H100 80GB HBM3)");
}

/* ------------------------------------------------------------ drawing them */

/* Draw root into DIR/name; the file's text (NULL on failure), stats in *st. */
static char *draw(const char *name, json_t *root, const char *note, trace_svg_stats *st)
{
    char path[4200], err[512] = "";
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w+");
    CHECK_MSG(f != NULL, "%s", path);
    if (!f)
        return NULL;
    const int rc = trace_svg_write(f, root, "synthetic.json", note, st, err, sizeof err);
    CHECK_MSG(rc == 0, "%s: trace_svg_write failed: %s", name, err);
    long n = ftell(f);
    char *text = n > 0 ? malloc((size_t)n + 1) : NULL;
    rewind(f);
    if (text && fread(text, 1, (size_t)n, f) == (size_t)n)
        text[n] = '\0';
    else
        free(text), text = NULL;
    fclose(f);
    CHECK_MSG(st->n_overlaps == 0 && st->n_outside == 0, "%s: %d labels overlap, %d reach outside; first: %s", name,
              st->n_overlaps, st->n_outside, st->first_problem);
    CHECK(st->n_labels > 10 && st->width > 0 && st->height > 200);
    return text;
}

static int count(const char *text, const char *what)
{
    int n = 0;
    for (const char *p = text; p && (p = strstr(p, what)); p += strlen(what))
        n++;
    return n;
}

/* The step's exact values as the picture tags them. */
static int has_span(const char *text, const json_t *root, int event, const char *cls)
{
    const json_t *e = json_array_get(json_object_get(root, "traceEvents"), (size_t)event);
    char want[512];
    snprintf(want, sizeof want, "class=\"%s\" x=", cls);
    char vals[400];
    snprintf(vals, sizeof vals, "data-tid=\"%d\" data-name=\"%s\" data-ts=\"%.17g\" data-dur=\"%.17g\"",
             (int)json_integer_value(json_object_get(e, "tid")), json_string_value(json_object_get(e, "name")),
             json_number_value(json_object_get(e, "ts")), json_number_value(json_object_get(e, "dur")));
    for (const char *p = text; p && (p = strstr(p, want)); p++) {
        const char *end = strchr(p, '>');
        const char *v = strstr(p, vals);
        if (v && end && v < end)
            return 1;
    }
    return 0;
}

static void test_timed_steps(void)
{
    enum { N = 20 };
    double slow[N];
    /* The first three slow (warm-up), then a spread whose median is known: step 3 + k has scale 1 + k/100 in a
     * shuffled order, so the median of the 17 after the first three is scale 1.08. */
    const int order[N - 3] = {5, 12, 0, 16, 9, 3, 14, 7, 1, 11, 8, 15, 2, 6, 13, 4, 10};
    slow[0] = 3, slow[1] = 2, slow[2] = 1.5;
    for (int i = 3; i < N; i++)
        slow[i] = 1 + order[i - 3] / 100.0;
    int ev[N], prof;
    json_t *root = gpu_trace(N, slow, 1, 0, ev, &prof, NULL);
    trace_svg_stats st;
    char *text = draw("gpu-timed.svg", root, "Synthetic: the shape of a streamed 8B decode", &st);
    int want = -1;
    for (int i = 3; i < N; i++)
        if (order[i - 3] == 8)
            want = ev[i];
    CHECK_MSG(st.zoom_event == want, "zoomed event %d, want %d (the median step after the first three)",
              st.zoom_event, want);
    for (int i = 0; i < N; i++)
        CHECK_MSG(has_span(text, root, ev[i], "step"), "decode step %d is not a box with its values", i);
    CHECK(count(text, "class=\"step\"") == N + 1); /* and the prompt pass */
    /* The zoomed step: its spans on the host, the GPU's compute, the copy engine and the CPU. */
    CHECK(has_span(text, root, want, "span"));
    CHECK(count(text, "class=\"span\"") == 1 + 32 + 14 + 10);
    CHECK(count(text, "data-name=\"q/k/v of layer 15\"") == 1 && count(text, "data-name=\"copy layer 13\"") == 1);
    CHECK(strstr(text, "of the copy time hidden behind compute") != NULL);
    CHECK(strstr(text, "data-counter=\"KV cache positions\" data-series=\"filled\" data-max=\"532\"") != NULL);
    CHECK(strstr(text, "data-counter=\"device memory\" data-series=\"budget\" data-max=\"8589934592\"") != NULL);
    CHECK(strstr(text, "Synthetic: the shape") && strstr(text, "Llama-3.1-8B") && strstr(text, "8 GiB"));
    CHECK(st.n_tracks == 5 && st.n_counters == 2);
    CHECK(!strstr(text, "<script") && strstr(text, "sans-serif\""));
    free(text);
    json_decref(root);
}

static void test_profiled_passes(void)
{
    enum { N = 12 };
    double slow[N];
    for (int i = 0; i < N; i++)
        slow[i] = 1;
    int ev[N], prof;
    json_t *root = gpu_trace(N, slow, 0, 3, ev, &prof, NULL);
    trace_svg_stats st;
    char *text = draw("gpu-profiled.svg", root, NULL, &st);
    CHECK_MSG(st.zoom_event == -1, "zoomed event %d: want a pass the GPU timed alone", st.zoom_event);
    CHECK(strstr(text, "One pass the GPU timed, zoomed") != NULL);
    CHECK(strstr(text, "pass 2 of the run's 3 passes timed on the GPU with no host span") != NULL);
    CHECK(count(text, "class=\"step\"") == N + 1);
    CHECK(count(text, "data-name=\"layer 31\"") == 1);
    free(text);
    json_decref(root);
}

/* Decode steps through the graph, stamped on the device: the zoom is the median "GPU decode step" after the first
 * three, not a host step, with the device's, the copy engine's and the CPU's spans in it; slow host steps (a host
 * that lags) do not move it. */
static void test_stamped_steps(void)
{
    enum { N = 12 };
    double slow[N];
    const int order[N - 3] = {4, 0, 7, 2, 8, 1, 6, 3, 5}; /* the median of the nine: scale 1.04 */
    slow[0] = slow[1] = slow[2] = 2;
    for (int i = 3; i < N; i++)
        slow[i] = 1 + order[i - 3] / 100.0;
    int ev[N], gev[N], prof;
    json_t *root = gpu_trace(N, slow, 1, 0, ev, &prof, gev);
    trace_svg_stats st;
    char *text = draw("gpu-stamped.svg", root, NULL, &st);
    int want = -1;
    for (int i = 3; i < N; i++)
        if (order[i - 3] == 4)
            want = gev[i];
    CHECK_MSG(st.zoom_event == want, "zoomed event %d, want %d (the median GPU decode step after the first three)",
              st.zoom_event, want);
    CHECK(strstr(text, "One GPU decode step, zoomed") != NULL);
    CHECK(strstr(text, "decode steps on the GPU (its graph's stamps)") != NULL);
    CHECK(has_span(text, root, want, "span"));
    CHECK(count(text, "data-name=\"copy layer 13\"") == 1 && count(text, "data-name=\"q/k/v of layer 15\"") == 1);
    CHECK(count(text, "class=\"step\"") == 2 * N + 1); /* the host's and the device's, and the prompt pass */
    /* The GPU's compute is its layers less their waits for copies: 27 layers of 140 us and 5 hosted of 9100 us,
     * at the zoomed step's scale 1.04; the copies 14 of 4100 us. */
    CHECK(count(text, "data-name=\"copy wait of layer 14\"") == 1);
    CHECK_MSG(strstr(text, "copies 59.7 ms, GPU compute 51.3 ms") != NULL, "%s",
              strstr(text, "copies ") ? strstr(text, "copies ") : "no copies line");
    free(text);
    json_decref(root);
}

/* Many sessions with long names, a long model name, a span of no length, a track with no spans. */
static void test_crowded(void)
{
    gen g = {json_array()};
    track(&g, 1, "load");
    span(&g, 1, "load", "load", 0, 0);
    for (int s = 0; s < 4; s++) {
        char name[96];
        snprintf(name, sizeof name, "session %d (CPU) with a name far too long for its column", s + 2);
        track(&g, s + 2, name);
        for (int i = 0; i < 40; i++) {
            const double t = 100 + s * 7 + i * 1000.0;
            span(&g, s + 2, i ? "decode step" : "prompt pass", "step", t, 900);
            span(&g, s + 2, "embed", "layer", t, 10);
            for (int l = 0; l < 60; l++)
                spanf(&g, s + 2, "layer", t + 10 + l * 14.5, 14.5, "layer %d", l);
            span(&g, s + 2, "head", "layer", t + 880, 20);
        }
    }
    track(&g, 9, "GPU copy engine (track 9)");
    json_t *root = json_pack("{s:o, s:{s:s, s:s}}", "traceEvents", g.ev, "metadata", "model",
                             "/models/an-extraordinarily-long-model-name-that-goes-on-and-on-and-on-1234567890 "
                             "(LlamaForCausalLM, 60 layers, f32)", "device", "cpu");
    trace_svg_stats st;
    char *text = draw("crowded.svg", root, NULL, &st);
    CHECK(st.n_tracks == 6 && st.zoom_event >= 0);
    CHECK(strstr(text, "no spans") != NULL);
    free(text);
    /* The bare array form reads as well. */
    json_t *arr = json_deep_copy(json_object_get(root, "traceEvents"));
    text = draw("array.svg", arr, NULL, &st);
    CHECK(st.n_spans == 1 + 4 * 40 * 63);
    free(text);
    json_decref(arr);
    json_decref(root);
}

/* One bad trace: trace_svg_write fails with a message holding want. */
static void bad(const char *name, const char *json, const char *want)
{
    json_error_t je;
    json_t *root = json_loads(json, JSON_DECODE_ANY, &je);
    CHECK_MSG(root != NULL, "%s: %s", name, je.text);
    char err[512] = "";
    FILE *f = tmpfile();
    const int rc = root && f ? trace_svg_write(f, root, NULL, NULL, NULL, err, sizeof err) : 0;
    CHECK_MSG(rc == -2 && strstr(err, want), "%s: rc %d, message '%s', want '%s'", name, rc, err, want);
    if (f)
        fclose(f);
    json_decref(root);
}

static void test_bad_input(void)
{
    bad("a number", "42", "no traceEvents array");
    bad("no events", "{\"events\": []}", "no traceEvents array");
    bad("no spans", "{\"traceEvents\": [{\"name\": \"c\", \"ph\": \"C\", \"ts\": 1, \"pid\": 1, \"tid\": 0, "
        "\"args\": {\"v\": 1}}]}", "no spans");
    bad("span without dur", "{\"traceEvents\": [{\"name\": \"a\", \"ph\": \"X\", \"ts\": 1, \"pid\": 1, \"tid\": 1}]}",
        "event 0 (a) lacks");
    bad("event not an object", "{\"traceEvents\": [1]}", "event 0 lacks a name");
    /* The file-level errors name the file at fault and leave no picture. */
    char in[4200], out[4200], err[1024];
    snprintf(out, sizeof out, "%s/bad.svg", dir);
    snprintf(in, sizeof in, "%s/no-such.json", dir);
    CHECK(trace_svg_file(in, out, NULL, NULL, err, sizeof err) == -1 && strstr(err, in));
    snprintf(in, sizeof in, "%s/broken.json", dir);
    FILE *f = fopen(in, "w");
    if (f)
        fputs("{\"traceEvents\": [", f), fclose(f);
    CHECK_MSG(trace_svg_file(in, out, NULL, NULL, err, sizeof err) == -1 && strstr(err, in) && strstr(err, "not JSON"),
              "%s", err);
    f = fopen(in, "w");
    if (f)
        fputs("{\"traceEvents\": []}", f), fclose(f);
    CHECK_MSG(trace_svg_file(in, out, NULL, NULL, err, sizeof err) == -1 && strstr(err, in) && strstr(err, "no spans"),
              "%s", err);
    struct stat sb;
    CHECK_MSG(stat(out, &sb) != 0, "a failed picture was left at %s", out);
    f = fopen(in, "w");
    if (f)
        fputs("{\"traceEvents\": [{\"name\": \"a\", \"ph\": \"X\", \"ts\": 1, \"dur\": 2, \"pid\": 1, \"tid\": 1}]}", f),
            fclose(f);
    snprintf(out, sizeof out, "%s/no/such/dir/x.svg", dir);
    CHECK_MSG(trace_svg_file(in, out, NULL, NULL, err, sizeof err) == -1 && strstr(err, out), "%s", err);
    remove(in);
}

int main(int argc, char **argv)
{
    if (argc > 1) {
        snprintf(dir, sizeof dir, "%s", argv[1]);
    } else {
        snprintf(dir, sizeof dir, "/tmp/test_trace_svg.XXXXXX");
        CHECK(mkdtemp(dir) != NULL);
    }
    test_timed_steps();
    test_profiled_passes();
    test_stamped_steps();
    test_crowded();
    test_bad_input();
    if (argc <= 1) {
        const char *names[] = {"gpu-timed.svg", "gpu-profiled.svg", "gpu-stamped.svg", "crowded.svg", "array.svg"};
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
            char p[4200];
            snprintf(p, sizeof p, "%s/%s", dir, names[i]);
            remove(p);
        }
        rmdir(dir);
    }
    return test_finish("test_trace_svg");
}
