/*
 * test_plan_moe.c: the offload planner placing mixture-of-experts layers an
 * expert at a time (issue 37, item 3), on Mixtral 8x7B's and
 * Qwen3-30B-A3B's shapes: every expert resident where it fits; then, as
 * the budget shrinks, experts leave for host memory spread evenly over the
 * expert layers, never over the budget, fewer resident and a lower bound
 * at every step, down to the refusal; the bytes a token reads on the
 * device and on the CPU for the model's top-k, the stream slots a
 * layer's host experts need, moe_cpu, the quantized alternatives, and a
 * dense model's plan as it was before experts were placed one by one.
 * Split from test_plan.c, which holds the dense placement tests and the
 * MoE fixtures' layer sizes. No device is touched.
 */
#include <math.h>

#include "test_plan_synth.h"
#include "test_util.h"

static engine_plan *plan_moe(const engine_model *m, uint64_t budget, engine_quant q, int moe_cpu, double host_gbps,
                             engine_status *st)
{
    engine_plan_params p = placement_params(m);
    p.vram_budget = budget;
    p.n_ctx = 4096;
    p.quant = q;
    p.moe_cpu = moe_cpu;
    p.host_gbps = host_gbps;
    engine_plan *plan = NULL;
    char err[1024];
    *st = engine_plan_create(m, &p, &plan, err, sizeof err);
    return plan;
}

static const engine_plan_entry *layer_row(const engine_plan *p, int l)
{
    return engine_plan_entry_at(p, 1 + (size_t)l);
}

/* What every plan of an MoE shape must satisfy, whatever the budget. */
static void check_invariants(const engine_plan *p, const moe_shape *s, engine_quant q, int moe_cpu, const char *what)
{
    const engine_plan_totals *t = engine_plan_get_totals(p);
    const int L = s->base.n_layers, E = s->n_experts, k = s->n_used;
    const uint64_t eb = expert_dev_bytes(s, q);
    CHECK(t->n_expert_layers == L && t->n_experts == E && t->n_experts_used == k);
    int sum = 0, lo = E, hi = 0, prev = E, mcpu = moe_cpu < L ? moe_cpu : L;
    uint64_t cpu = 0, slot = 0, host_bytes = 0;
    for (int l = 0; l < L; l++) {
        const engine_plan_entry *r = layer_row(p, l);
        CHECK_MSG(r->n_experts == E && r->expert_bytes == eb, "%s layer %d: %d experts of %llu bytes, want %llu", what,
                  l, r->n_experts, (unsigned long long)r->expert_bytes, (unsigned long long)eb);
        CHECK(r->experts_resident >= 0 && r->experts_resident <= E);
        sum += r->experts_resident;
        if (r->placement != ENGINE_PLACE_RESIDENT) {
            CHECK_MSG(r->experts_resident == 0, "%s: streamed layer %d keeps %d experts", what, l, r->experts_resident);
            continue;
        }
        if (l < mcpu) {
            CHECK_MSG(r->experts_resident == 0, "%s: moe_cpu layer %d keeps %d experts", what, l, r->experts_resident);
        } else { /* an even spread, the earlier layers taking the remainder */
            lo = r->experts_resident < lo ? r->experts_resident : lo;
            hi = r->experts_resident > hi ? r->experts_resident : hi;
            CHECK_MSG(r->experts_resident <= prev, "%s: layer %d keeps %d experts, an earlier one %d", what, l,
                      r->experts_resident, prev);
            prev = r->experts_resident;
        }
        const uint64_t off = (uint64_t)(E - r->experts_resident) * eb;
        cpu += eb * (uint64_t)k * (uint64_t)(E - r->experts_resident) / (uint64_t)E;
        host_bytes += off;
        slot = off > slot ? off : slot;
    }
    CHECK_MSG(hi - lo <= 1 || hi < lo, "%s: experts resident a layer from %d to %d", what, lo, hi);
    CHECK(t->n_experts_resident == sum && t->n_experts_resident + t->n_experts_host == L * E);
    if (t->fits)
        CHECK_MSG(t->device_total <= t->budget, "%s: %llu over a budget of %llu", what,
                  (unsigned long long)t->device_total, (unsigned long long)t->budget);
    /* With no layer streamed, the host experts' share of each token's picks is read on the CPU, or by the GPU
     * over PCIe (with an embedding row where the table is on the host), the device the rest, and the slots
     * hold the most any layer keeps in host memory (what a prompt streams of it). */
    if (t->fits && t->n_layers_streamed == 0) {
        const uint64_t emb_row = engine_plan_entry_at(p, 0)->bytes_per_token;
        const uint64_t read = t->experts_host_gpu ? t->streamed_per_token - emb_row : t->host_per_token;
        CHECK_MSG(read == cpu && (t->experts_host_gpu ? t->host_per_token == 0 : t->streamed_per_token == emb_row),
                  "%s: host experts read %llu a token (%s), want %llu", what, (unsigned long long)read,
                  t->experts_host_gpu ? "GPU" : "CPU", (unsigned long long)cpu);
        CHECK_MSG(t->stream_buffers == (t->n_experts_host > 0 ? 2 * slot : 0), "%s: buffers %llu, want 2 x %llu",
                  what, (unsigned long long)t->stream_buffers, (unsigned long long)slot);
        const uint64_t emb = engine_plan_entry_at(p, 0)->placement == ENGINE_PLACE_STREAMED
                                 ? engine_plan_entry_at(p, 0)->weight_bytes
                                 : 0;
        CHECK_MSG(t->weights_streamed == host_bytes + emb, "%s: %llu bytes in host memory, want %llu", what,
                  (unsigned long long)t->weights_streamed, (unsigned long long)(host_bytes + emb));
    }
}

/*
 * The budget shrinks from every weight resident to the refusal: each step
 * keeps no more experts resident than the one before, decodes no faster,
 * and stays within its budget.
 */
static void test_sweep(const moe_shape *s, engine_quant q, uint64_t step, const char *name)
{
    engine_model *m = synth_moe(s);
    engine_status st;
    engine_plan *p = plan_moe(m, 1024 * GiB, q, 0, 77.0, &st);
    CHECK_MSG(st == ENGINE_OK && p, "%s: all resident", name);
    if (!p) {
        synth_free(m);
        return;
    }
    const engine_plan_totals *t = engine_plan_get_totals(p);
    const int all = s->base.n_layers * s->n_experts;
    CHECK(t->n_experts_resident == all && t->n_experts_host == 0 && t->stream_buffers == 0);
    CHECK(!strncmp(engine_plan_summary(p), "all resident", 12));
    const uint64_t top = t->all_resident;
    const double resident_tps = t->tokens_per_second;
    const uint64_t read_all = t->read_per_token;
    check_invariants(p, s, q, 0, name);
    engine_plan_free(p);

    int prev_x = all, split_plans = 0, steps = 0;
    double prev_tps = resident_tps;
    bool refused = false;
    for (uint64_t b = top; !refused && b > step; b -= step, steps++) {
        char what[96];
        snprintf(what, sizeof what, "%s at %llu MiB", name, (unsigned long long)(b / MiB));
        p = plan_moe(m, b, q, 0, 77.0, &st);
        if (!p) {
            CHECK_MSG(0, "%s: no plan", what);
            break;
        }
        t = engine_plan_get_totals(p);
        refused = !t->fits;
        if (refused) {
            CHECK_MSG(st == ENGINE_ERR_OVER_BUDGET && t->minimum > b, "%s: refused with a minimum of %llu", what,
                      (unsigned long long)t->minimum);
            CHECK(strstr(engine_plan_summary(p), "needs at least") != NULL);
        } else {
            CHECK(st == ENGINE_OK);
            check_invariants(p, s, q, 0, what);
            CHECK_MSG(t->n_experts_resident <= prev_x, "%s: %d experts resident after %d", what,
                      t->n_experts_resident, prev_x);
            CHECK_MSG(t->tokens_per_second <= prev_tps * (1 + 1e-12), "%s: %.4f tok/s after %.4f", what,
                      t->tokens_per_second, prev_tps);
            if (t->n_layers_streamed == 0 && t->n_experts_host > 0) {
                split_plans++;
                /* A token's picks: the device reads the resident experts' share, the CPU the rest. */
                CHECK_MSG(t->read_per_token + t->host_per_token == read_all, "%s: %llu + %llu read, want %llu", what,
                          (unsigned long long)t->read_per_token, (unsigned long long)t->host_per_token,
                          (unsigned long long)read_all);
                const double want = 1.0 / (t->read_per_token / 3000e9 + t->host_per_token / 77e9);
                CHECK_MSG(fabs(t->tokens_per_second - want) < 1e-9 * want, "%s: bound %.6f, want %.6f", what,
                          t->tokens_per_second, want);
                CHECK_MSG(strstr(engine_plan_summary(p), "experts resident") != NULL, "%s: %s", what,
                          engine_plan_summary(p));
            }
            prev_x = t->n_experts_resident;
            prev_tps = t->tokens_per_second;
        }
        engine_plan_free(p);
    }
    CHECK_MSG(refused, "%s: never refused in %d steps", name, steps);
    CHECK_MSG(split_plans >= 5, "%s: only %d plans with experts split between the device and the host", name,
              split_plans);
    synth_free(m);
}

/* Qwen3-30B-A3B in nf4-dq on an 8 GiB card, the target: sizes written out, most experts on the host. */
static void test_qwen3_8g(void)
{
    const moe_shape *s = &QWEN3_30B_A3B;
    engine_model *m = synth_moe(s);
    engine_status st;
    engine_plan *p = plan_moe(m, 8 * GiB, ENGINE_QUANT_NF4_DQ, 0, 0.0, &st);
    CHECK_MSG(st == ENGINE_OK && p, "qwen3 at 8 GiB");
    if (p) {
        const engine_plan_totals *t = engine_plan_get_totals(p);
        const uint64_t eb = expert_dev_bytes(s, ENGINE_QUANT_NF4_DQ);
        /* nf4-dq: gate/up 1536x2048 and down 2048x768, each 4-bit data, a byte of absmax a block of 64, a scale
         * and offset a nested block of 256, the 16- and 256-entry fp32 tables (each part padded to 256 bytes) */
        CHECK_MSG(eb == (1572864 + 49152 + 1536 + 256 + 1024) + (786432 + 24576 + 768 + 256 + 1024),
                  "expert %llu", (unsigned long long)eb);
        CHECK(t->fits && t->n_layers_streamed == 0 && t->n_experts_host > 0 && t->n_experts_resident > 0);
        check_invariants(p, s, ENGINE_QUANT_NF4_DQ, 0, "qwen3 8G");
        /* No CPU rate given: the GPU reads the host experts' picks over PCIe (AUTO), at the PCIe rate. */
        CHECK(t->experts_host_gpu && t->host_per_token == 0);
        double want = 1.0 / (t->read_per_token / 3000e9 + t->streamed_per_token / 54.7e9);
        CHECK_MSG(fabs(t->tokens_per_second - want) < 1e-9 * want, "bound %.6f, want %.6f", t->tokens_per_second,
                  want);
        CHECK_MSG(strstr(engine_plan_summary(p), "the GPU reads a token's picks among them over PCIe") != NULL, "%s",
                  engine_plan_summary(p));
        const engine_plan_totals gpu = *t;
        engine_plan_free(p);
        /* The CPU running them instead: the same placement, their bytes on the CPU, priced at the PCIe rate while
         * its own is not measured; and with a CPU faster than PCIe, AUTO picks the CPU. */
        engine_plan_params pp = placement_params(m);
        pp.vram_budget = 8 * GiB, pp.n_ctx = 4096, pp.quant = ENGINE_QUANT_NF4_DQ, pp.moe_host = ENGINE_MOE_HOST_CPU;
        char err[512];
        p = NULL;
        CHECK_MSG(engine_plan_create(m, &pp, &p, err, sizeof err) == ENGINE_OK && p, "%s", err);
        if (!p)
            return;
        t = engine_plan_get_totals(p);
        check_invariants(p, s, ENGINE_QUANT_NF4_DQ, 0, "qwen3 8G, CPU");
        CHECK(!t->experts_host_gpu && t->n_experts_host == gpu.n_experts_host);
        CHECK(t->host_per_token + engine_plan_entry_at(p, 0)->bytes_per_token == gpu.streamed_per_token);
        want = 1.0 / (t->read_per_token / 3000e9 + t->host_per_token / 54.7e9);
        CHECK_MSG(fabs(t->tokens_per_second - want) < 1e-9 * want, "bound %.6f, want %.6f", t->tokens_per_second,
                  want);
        CHECK_MSG(strstr(engine_plan_summary(p), "the CPU runs a token's picks among them for decode") != NULL &&
                      strstr(engine_plan_summary(p), "at the PCIe rate") != NULL,
                  "%s", engine_plan_summary(p));
        engine_plan_free(p);
        pp.moe_host = ENGINE_MOE_HOST_AUTO, pp.host_gbps = 80.0;
        p = NULL;
        CHECK_MSG(engine_plan_create(m, &pp, &p, err, sizeof err) == ENGINE_OK && p, "%s", err);
        if (!p)
            return;
        CHECK(!engine_plan_get_totals(p)->experts_host_gpu);
        /* An expert cache is taken from the budget before the experts are placed. */
        engine_plan_free(p);
        pp.moe_host = ENGINE_MOE_HOST_AUTO, pp.host_gbps = 0.0, pp.expert_cache = 1 * GiB;
        p = NULL;
        CHECK_MSG(engine_plan_create(m, &pp, &p, err, sizeof err) == ENGINE_OK && p, "%s", err);
        if (!p)
            return;
        t = engine_plan_get_totals(p);
        check_invariants(p, s, ENGINE_QUANT_NF4_DQ, 0, "qwen3 8G, 1 GiB cache");
        CHECK_MSG(t->expert_cache == 1 * GiB && t->device_total <= t->budget &&
                      t->n_experts_resident < gpu.n_experts_resident &&
                      (gpu.n_experts_resident - t->n_experts_resident) * expert_dev_bytes(s, ENGINE_QUANT_NF4_DQ) >=
                          1 * GiB - 2 * 1048576 * (uint64_t)s->base.n_layers,
                  "1 GiB cache: %d experts resident, %d without", t->n_experts_resident, gpu.n_experts_resident);
        pp.expert_cache = 0;
        pp.moe_host = 3;
        engine_plan *bad = NULL;
        CHECK(engine_plan_create(m, &pp, &bad, err, sizeof err) == ENGINE_ERR_INVALID_ARG && !bad &&
              strstr(err, "moe_host") != NULL);
        /* The embeddings leave before any expert does. */
        CHECK(engine_plan_entry_at(p, 0)->placement == ENGINE_PLACE_STREAMED);
        engine_plan_free(p);
    }
    synth_free(m);
}

/*
 * moe_cpu = N: the first N expert layers keep no expert resident; the
 * rest share what fits as before. It moves nothing else: the all-resident
 * figure, the attention's placement, the spread over the other layers.
 */
static void test_moe_cpu(void)
{
    const moe_shape *s = &MIXTRAL_8X7B;
    const engine_quant q = ENGINE_QUANT_NF4;
    engine_model *m = synth_moe(s);
    engine_status st;
    const int L = s->base.n_layers, E = s->n_experts;
    const uint64_t budgets[] = {1024 * GiB, 24 * GiB, 16 * GiB, 8 * GiB};
    for (size_t b = 0; b < sizeof budgets / sizeof budgets[0]; b++) {
        engine_plan *p0 = plan_moe(m, budgets[b], q, 0, 30.0, &st);
        const int ns[] = {1, 5, L - 1, L, L + 7};
        for (size_t i = 0; p0 && i < sizeof ns / sizeof ns[0]; i++) {
            char what[96];
            snprintf(what, sizeof what, "mixtral %llu GiB, moe_cpu %d", (unsigned long long)(budgets[b] / GiB), ns[i]);
            engine_plan *p = plan_moe(m, budgets[b], q, ns[i], 30.0, &st);
            if (!p) {
                CHECK_MSG(0, "%s: no plan", what);
                continue;
            }
            const engine_plan_totals *t = engine_plan_get_totals(p), *t0 = engine_plan_get_totals(p0);
            CHECK_MSG(st == ENGINE_OK && t->fits, "%s: %s", what, engine_plan_summary(p));
            check_invariants(p, s, q, ns[i], what);
            const int forced = ns[i] < L ? ns[i] : L;
            CHECK_MSG(t->n_experts_host >= forced * E, "%s: %d experts on the host", what, t->n_experts_host);
            CHECK(t->all_resident == t0->all_resident && t->resident_tokens_per_second == t0->resident_tokens_per_second);
            CHECK_MSG(t->n_layers_streamed == t0->n_layers_streamed, "%s: %d layers streamed, %d without", what,
                      t->n_layers_streamed, t0->n_layers_streamed);
            CHECK(t->tokens_per_second <= t0->tokens_per_second * (1 + 1e-12));
            if (budgets[b] == 1024 * GiB) /* room for all: every other layer keeps every expert */
                for (int l = forced; l < L; l++)
                    CHECK(layer_row(p, l)->experts_resident == E);
            if (ns[i] >= L)
                CHECK(t->n_experts_resident == 0 && !strncmp(engine_plan_summary(p), "keeps 0 of", 10));
            engine_plan_free(p);
        }
        engine_plan_free(p0);
    }
    /* Negative is refused. */
    engine_plan_params pp = placement_params(m);
    pp.vram_budget = 16 * GiB, pp.moe_cpu = -1;
    engine_plan *p = NULL;
    char err[256] = "";
    CHECK(engine_plan_create(m, &pp, &p, err, sizeof err) == ENGINE_ERR_INVALID_ARG && !p && strstr(err, "moe_cpu"));
    synth_free(m);
}

/* The quantized alternatives are planned by the same rules: each option's figures are its own plan's. */
static void test_options(void)
{
    const moe_shape *s = &QWEN3_30B_A3B;
    engine_model *m = synth_moe(s);
    engine_status st;
    const uint64_t budgets[] = {40 * GiB, 12 * GiB, 6 * GiB, 3 * GiB};
    for (size_t b = 0; b < sizeof budgets / sizeof budgets[0]; b++) {
        engine_plan *p = plan_moe(m, budgets[b], ENGINE_QUANT_NONE, 0, 50.0, &st);
        for (size_t i = 0; p && i < engine_plan_n_options(p); i++) {
            const engine_plan_option *o = engine_plan_option_at(p, i);
            engine_status sq;
            engine_plan *pq = plan_moe(m, budgets[b], o->quant, 0, 50.0, &sq);
            if (!pq)
                continue;
            const engine_plan_totals *tq = engine_plan_get_totals(pq);
            CHECK_MSG(o->fits == tq->fits && o->minimum == tq->minimum && o->all_resident == tq->all_resident &&
                          fabs(o->tokens_per_second - tq->tokens_per_second) <= 1e-9 * tq->tokens_per_second,
                      "%s at %llu GiB: option %d %.3f tok/s min %llu, its plan %d %.3f tok/s min %llu", o->name,
                      (unsigned long long)(budgets[b] / GiB), o->fits, o->tokens_per_second,
                      (unsigned long long)o->minimum, tq->fits, tq->tokens_per_second,
                      (unsigned long long)tq->minimum);
            engine_plan_free(pq);
        }
        engine_plan_free(p);
    }
    synth_free(m);
}

/*
 * A dense model's plan is what it was before experts were placed one by
 * one: the 8B at 8 GiB and a 2048-token context, figures recorded from
 * the planner before that change (kv AUTO: int8; 19 layers streamed; with
 * the H100 machine's host figures 11 of them hosted).
 */
static void test_dense_unchanged(void)
{
    engine_model *m = synth(&LLAMA_8B);
    engine_plan_params pp = engine_plan_default_params();
    pp.vram_budget = 8 * GiB, pp.n_ctx = 2048;
    for (int hosted = 0; hosted < 2; hosted++) {
        if (hosted)
            pp.host_layers = -1, pp.host_gbps = 77, pp.shared_gbps = 100;
        engine_plan *p = NULL;
        CHECK(engine_plan_create(m, &pp, &p, NULL, 0) == ENGINE_OK && p);
        if (!p)
            continue;
        const engine_plan_totals *t = engine_plan_get_totals(p);
        CHECK(t->n_layers_streamed == 19 && t->n_layers_host == (hosted ? 11 : 0) && t->kv_type == ENGINE_KV_INT8);
        CHECK(t->weights_resident == 6722437120ull && t->weights_streamed == 9338617856ull);
        CHECK(t->stream_buffers == 872415232ull && t->device_total == 8411676672ull);
        CHECK(t->minimum == 1690304512ull && t->all_resident == 16877879296ull);
        CHECK(t->streamed_per_token == (hosted ? 3489669120ull : 8287952896ull));
        CHECK(t->host_per_token == (hosted ? 4798283776ull : 0));
        const double want = hosted ? 10.7311179 : 6.50375545;
        CHECK_MSG(fabs(t->tokens_per_second - want) < 1e-7 * want, "%.9g tok/s, was %.9g", t->tokens_per_second, want);
        CHECK(t->n_expert_layers == 0 && t->n_experts_resident == 0 && t->n_experts_host == 0);
        for (size_t i = 0; i < engine_plan_n_entries(p); i++) {
            const engine_plan_entry *r = engine_plan_entry_at(p, i);
            CHECK(r->n_experts == 0 && r->experts_resident == 0 && r->expert_bytes == 0);
        }
        engine_plan_free(p);
    }
    synth_free(m);
}

int main(void)
{
    test_dense_unchanged();
    test_qwen3_8g();
    test_moe_cpu();
    test_options();
    test_sweep(&MIXTRAL_8X7B, ENGINE_QUANT_NF4, 512 * MiB, "mixtral nf4");
    test_sweep(&QWEN3_30B_A3B, ENGINE_QUANT_NF4_DQ, 128 * MiB, "qwen3-30b-a3b nf4-dq");
    test_sweep(&QWEN3_30B_A3B, ENGINE_QUANT_NONE, 512 * MiB, "qwen3-30b-a3b bf16");
    return test_finish("test_plan_moe");
}
