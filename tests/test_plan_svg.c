/*
 * test_plan_svg.c: the plan's picture (tools/plan_svg.c, infer --svg) on
 * synthetic plans and synthetic measurements, so that what only a GPU run
 * draws (the measured copy, compute and overlap a pass) is checked here
 * without one: every row and figure is there with its JSON path and exact
 * value, the measured section shows the figures a pass, no label's box
 * overlaps another or leaves the picture (8B with all three placements, an
 * 80-layer model with a long name, a refused plan, a tiny resident one,
 * Qwen3-30B-A3B's 48 expert layers with experts on the device and the host),
 * names are escaped, and a failed write is reported.
 *
 *   test_plan_svg [DIR]   DIR: keep the pictures there (test_plan_svg.sh
 *                         runs xmllint on them); default: a temporary folder
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */

#include <unistd.h>

#include "test_plan_synth.h"
#include "test_util.h"
#include "tools/plan_svg.h"

static char dir[4096];

/* Draw plan into DIR/name; return the file's text (NULL on failure), stats in *st. */
static char *draw(const char *name, const engine_plan *plan, const char *model, const engine_offload_report *off,
                  plan_svg_stats *st)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w+");
    CHECK_MSG(f != NULL, "%s", path);
    if (!f)
        return NULL;
    const int rc = plan_svg_write(f, plan, model, off, st);
    CHECK_MSG(rc == 0, "%s: plan_svg_write failed", name);
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
    CHECK(st->n_labels > 10 && st->width > 0 && st->height > 100);
    return text;
}

static int has(const char *text, const char *what)
{
    return text && strstr(text, what) != NULL;
}

/* Every row of the plan is drawn with its figures tagged by JSON path and exact value. */
static void check_rows(const char *text, const engine_plan *plan, const char *name)
{
    for (size_t i = 0; i < engine_plan_n_entries(plan); i++) {
        const engine_plan_entry *r = engine_plan_entry_at(plan, i);
        char want[160];
        snprintf(want, sizeof want, "data-key=\"entries.%zu.weight_bytes\" data-value=\"%llu\"", i,
                 (unsigned long long)r->weight_bytes);
        CHECK_MSG(has(text, want), "%s: no %s", name, want);
        snprintf(want, sizeof want, "data-key=\"entries.%zu.bytes_per_token\" data-value=\"%llu\"", i,
                 (unsigned long long)r->bytes_per_token);
        CHECK_MSG(has(text, want), "%s: no %s", name, want);
        static const char *const PLACES[] = {"resident", "streamed", "host"};
        snprintf(want, sizeof want, "data-key=\"entries.%zu.placement\" data-value=\"%s\"", i, PLACES[r->placement]);
        CHECK_MSG(has(text, want), "%s: no %s", name, want);
    }
    const engine_plan_totals *t = engine_plan_get_totals(plan);
    char want[160];
    snprintf(want, sizeof want, "data-key=\"totals.kv_cache\" data-value=\"%llu\"", (unsigned long long)t->kv_cache);
    CHECK_MSG(has(text, want), "%s: no %s", name, want);
    snprintf(want, sizeof want, "data-key=\"totals.tokens_per_second\" data-value=\"%.3f\"", t->tokens_per_second);
    CHECK_MSG(has(text, want), "%s: no %s", name, want);
    CHECK_MSG(has(text, "<?xml version=\"1.0\"") && has(text, "</svg>\n") && !has(text, "<script"), "%s", name);
    CHECK_MSG(has(text, "sans-serif\""), "%s: no sans-serif fallback", name);
}

static engine_plan *plan_8b(engine_model *m, uint64_t budget, int host_layers)
{
    engine_plan_params p = placement_params(m);
    p.vram_budget = budget, p.n_ctx = 4096;
    p.host_layers = host_layers, p.host_gbps = 20.0, p.shared_gbps = 30.0;
    engine_plan *plan = NULL;
    char err[512];
    engine_plan_create(m, &p, &plan, err, sizeof err);
    CHECK_MSG(plan != NULL, "%s", err);
    return plan;
}

/* 8B in 8 GiB with 4 layers computed by the CPU: all three placements, then what a run measured. */
static void test_8b_measured(void)
{
    engine_model *m = synth(&LLAMA_8B);
    engine_plan *plan = plan_8b(m, 8 * GiB, 4);
    if (!plan) {
        synth_free(m);
        return;
    }
    const engine_plan_totals *t = engine_plan_get_totals(plan);
    CHECK(t->n_layers_host == 4 && t->n_layers_streamed > 4);
    plan_svg_stats st;
    char *text = draw("8b-plan.svg", plan, "/models/Llama-3.1-8B/", NULL, &st);
    check_rows(text, plan, "8b-plan");
    CHECK(has(text, ">Llama-3.1-8B in <tspan data-key=\"budget\" data-value=\"8589934592\">8.00 GiB</tspan>"));
    CHECK(has(text, ">CPU (decode)</tspan>") && has(text, "read by the CPU (its layers)"));
    CHECK(has(text, "data-key=\"totals.shared_gbps\" data-value=\"30.00\">30.0 GB/s</tspan>"));
    CHECK(!has(text, "Measured in this run"));
    const double plain_height = st.height;
    free(text);

    /* Streamed nothing: nothing measured to draw. */
    engine_offload_report off = {.n_layers = 32};
    text = draw("8b-nothing-streamed.svg", plan, "Llama-3.1-8B", &off, &st);
    CHECK(!has(text, "Measured in this run") && st.height == plain_height);
    free(text);

    /* Two prompt passes of 300 tokens, three decode steps: sums over the passes, drawn a pass at a time. */
    off = (engine_offload_report){.n_layers = 32, .n_layers_streamed = t->n_layers_streamed, .n_layers_host = 4,
                                  .bytes_per_token = t->streamed_per_token};
    off.prefill = (engine_offload_times){2, 600, 0.8, 0.6, 0.5, 0.4, 2ull * 8000000000ull, 0.0};
    off.decode = (engine_offload_times){3, 3, 0.45, 0.42, 0.05, 0.04, 3ull * 7700000000ull, 0.2};
    text = draw("8b-measured.svg", plan, "Llama-3.1-8B", &off, &st);
    check_rows(text, plan, "8b-measured");
    CHECK(st.height > plain_height + 200);
    CHECK_MSG(has(text, "Measured in this run") && has(text, "prefill: 2 passes measured, 600 tokens") &&
                  has(text, "decode: 3 steps measured, 3 tokens"),
              "measured headings");
    /* prefill a pass: wall 400 ms, copies 300 ms at 16e9 / 0.6 s = 26.7 GB/s, compute 250, overlap 200 (67%) */
    CHECK(has(text, ">400.0 ms a pass (2.5 a second)<") && has(text, ">300.0 ms, 26.7 GB/s<") &&
          has(text, ">250.0 ms<") && has(text, ">200.0 ms: 67% of the copy time hidden<"));
    /* decode a step: wall 150, copies 140 at 23.1e9 / 0.42 s = 55.0 GB/s, compute 16.7, overlap 13.3 (10%), CPU 66.7 */
    CHECK(has(text, ">150.0 ms a step (6.7 a second)<") && has(text, ">140.0 ms, 55.0 GB/s<") &&
          has(text, ">16.7 ms<") && has(text, ">13.3 ms: 10% of the copy time hidden<") && has(text, ">66.7 ms<"));
    /* the bounds: the plan's for decode, the copies at the planned PCIe rate for prompts (8e9 B a pass) */
    char want[128];
    snprintf(want, sizeof want, ">%.1f ms: the plan's decode bound, %.1f tok/s<", 1e3 / t->tokens_per_second,
             t->tokens_per_second);
    CHECK_MSG(has(text, want), "no '%s'", want);
    snprintf(want, sizeof want, ">%.1f ms: its copies at %.1f GB/s<", 8e9 / (t->pcie_gbps * 1e6), t->pcie_gbps);
    CHECK_MSG(has(text, want), "no '%s'", want);
    free(text);

    /* A write that fails is reported. */
    FILE *full = fopen("/dev/full", "w");
    if (full) {
        CHECK(plan_svg_write(full, plan, "Llama-3.1-8B", &off, NULL) != 0);
        fclose(full);
    }
    engine_plan_free(plan);
    synth_free(m);
}

/* Even the minimum over the budget: the picture says so and still lays out cleanly. */
static void test_refused(void)
{
    engine_model *m = synth(&LLAMA_8B);
    engine_plan *plan = plan_8b(m, 1 * GiB, 0);
    if (plan) {
        CHECK(!engine_plan_get_totals(plan)->fits);
        plan_svg_stats st;
        char *text = draw("8b-refused.svg", plan, "Llama-3.1-8B", NULL, &st);
        check_rows(text, plan, "refused");
        CHECK(has(text, "does not fit: "));
        free(text);
    }
    engine_plan_free(plan);
    synth_free(m);
}

/* 80 layers and a long name with markup and UTF-8 in it: shortened, escaped, every row drawn, nothing overlapping. */
static void test_many_layers(void)
{
    const shape s70 = {8192, 80, 64, 8, 128, 28672, 128256, 131072, false, K_BF16};
    engine_model *m = synth(&s70);
    engine_plan *plan = plan_8b(m, 24 * GiB, 0);
    if (plan) {
        plan_svg_stats st;
        char *text = draw("80-layers.svg", plan,
                          "/m/Ll\xc3\xa4ma & <friends> \"70B\" Instruct, a name much longer than any title holds",
                          NULL, &st);
        check_rows(text, plan, "80 layers");
        CHECK(has(text, ">Ll\xc3\xa4ma &amp; &lt;friends&gt; &quot;70B&quot; Instruct, a nam... in ") &&
              !has(text, "<friends>"));
        CHECK(has(text, "data-key=\"entries.81.weight_bytes\"") && st.height > 80 * 16);
        free(text);
    }
    engine_plan_free(plan);
    synth_free(m);
}

/* A small f32 model all resident: no streamed rows, no CPU bar. */
static void test_resident(void)
{
    engine_model *m = synth(&TINY);
    engine_plan *plan = plan_8b(m, 1 * GiB, 0);
    if (plan) {
        CHECK(engine_plan_get_totals(plan)->n_layers_streamed == 0);
        plan_svg_stats st;
        char *text = draw("tiny.svg", plan, "tiny", NULL, &st);
        check_rows(text, plan, "tiny");
        CHECK(!has(text, "streamed</tspan>") && !has(text, "read by the CPU"));
        free(text);
    }
    engine_plan_free(plan);
    synth_free(m);
}

/* An MoE model with experts split between the GPU and host memory: each split row says how many are on the GPU. */
static void test_experts(void)
{
    engine_model *m = synth_moe(&QWEN3_30B_A3B);
    engine_plan_params p = placement_params(m);
    p.vram_budget = 8 * GiB, p.n_ctx = 4096, p.quant = ENGINE_QUANT_NF4_DQ, p.moe_cpu = 3;
    p.moe_host = ENGINE_MOE_HOST_CPU; /* the CPU's bar; the GPU reading them over PCIe below */
    engine_plan *plan = NULL;
    char err[512];
    CHECK_MSG(engine_plan_create(m, &p, &plan, err, sizeof err) == ENGINE_OK, "%s", err);
    if (plan) {
        const engine_plan_totals *t = engine_plan_get_totals(plan);
        CHECK(t->n_experts_host > 0 && t->n_experts_resident > 0 && t->n_layers_streamed == 0);
        plan_svg_stats st;
        char *text = draw("qwen3-moe.svg", plan, "Qwen3-30B-A3B", NULL, &st);
        check_rows(text, plan, "experts");
        char want[160];
        for (size_t i = 1; i + 1 < engine_plan_n_entries(plan); i++) {
            const engine_plan_entry *r = engine_plan_entry_at(plan, i);
            snprintf(want, sizeof want, "data-key=\"entries.%zu.experts_resident\" data-value=\"%d\">%d</tspan>", i,
                     r->experts_resident, r->experts_resident);
            CHECK_MSG(has(text, want) == (r->experts_resident < r->n_experts), "experts: row %zu, %s", i, want);
        }
        snprintf(want, sizeof want, "data-key=\"totals.n_experts_host\" data-value=\"%d\"", t->n_experts_host);
        CHECK_MSG(has(text, want), "experts: no %s", want);
        CHECK(has(text, "read by the CPU (its experts)") && has(text, " at PCIe's rate (CPU unmeasured): "));
        free(text);
    }
    engine_plan_free(plan);
    p.moe_host = ENGINE_MOE_HOST_GPU;
    plan = NULL;
    CHECK_MSG(engine_plan_create(m, &p, &plan, err, sizeof err) == ENGINE_OK, "%s", err);
    if (plan) {
        plan_svg_stats st;
        char *text = draw("qwen3-moe-gpu.svg", plan, "Qwen3-30B-A3B", NULL, &st);
        CHECK(has(text, "over PCIe (copies, expert reads)") && has(text, "GPU reads picks over PCIe") &&
              !has(text, "read by the CPU"));
        free(text);
    }
    engine_plan_free(plan);
    synth_free(m);
}

int main(int argc, char **argv)
{
    char tmp[] = "/tmp/test_plan_svg.XXXXXX";
    const int keep = argc > 1;
    if (keep)
        snprintf(dir, sizeof dir, "%s", argv[1]);
    else if (mkdtemp(tmp))
        snprintf(dir, sizeof dir, "%s", tmp);
    else
        return fprintf(stderr, "test_plan_svg: cannot make a temporary folder\n"), 1;
    test_8b_measured();
    test_refused();
    test_many_layers();
    test_resident();
    test_experts();
    if (!keep) {
        const char *names[] = {"8b-plan.svg", "8b-nothing-streamed.svg", "8b-measured.svg", "8b-refused.svg",
                               "80-layers.svg", "tiny.svg", "qwen3-moe.svg"};
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
            char path[4200];
            snprintf(path, sizeof path, "%s/%s", dir, names[i]);
            remove(path);
        }
        rmdir(dir);
    }
    return test_finish("test_plan_svg");
}
