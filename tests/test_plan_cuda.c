/*
 * test_plan_cuda.c: the planner's device sizes against what the CUDA
 * backend really allocates, so that a change to the weight layout
 * (model_cuda.c) or to a session's buffers (session_cuda.c) that the
 * planner does not follow fails here. For every committed checkpoint, as
 * stored and quantized while loading (int8, int8-g128, nf4, nf4-dq), and
 * the bitsandbytes 4-bit checkpoints as stored: the weights
 * region, the KV cache and the activation region equal the plan's bytes
 * exactly, and the arena maps what the plan counts. The plan of the
 * quantized formats is made from the dense model loaded on the CPU (as
 * infer --dry-run --quant does) and from the quantized model itself.
 * Also the device's measured bandwidths: refused under a budget too small
 * to measure past the L2 cache, plausible otherwise, measured once per
 * process, and what a loaded model's plan is priced with. Skips (77)
 * without a GPU.
 */
#define _POSIX_C_SOURCE 200809L

#include "engine/model.h"
#include "engine/plan.h"
#include "test_util.h"

#define N_CTX 100

static engine_model *load(const char *path, engine_device dev, engine_quant q, engine_status *st)
{
    char err[512] = "";
    engine_model_params mp = engine_model_default_params();
    mp.device = dev;
    mp.quant = q;
    mp.n_threads = 2;
    mp.vram_budget = (uint64_t)2 << 30;
    engine_model *m = NULL;
    *st = engine_model_load(path, &mp, &m, err, sizeof err);
    if (*st == ENGINE_ERR_UNSUPPORTED && dev == ENGINE_DEVICE_CUDA && q == ENGINE_QUANT_NONE &&
        strstr(err, "cannot run on CUDA")) {
        printf("test_plan_cuda: SKIP: %s\n", err);
        exit(77);
    }
    if (*st && *st != ENGINE_ERR_UNSUPPORTED)
        CHECK_MSG(0, "%s: %s", path, err);
    return m;
}

/* Sum of the plan's weight rows: the whole weights region. */
static uint64_t plan_weight_total(const engine_plan *p)
{
    uint64_t s = 0;
    for (size_t i = 0; i < engine_plan_n_entries(p); i++)
        s += engine_plan_entry_at(p, i)->weight_bytes;
    return s;
}

static void check_model(const char *path, engine_quant q)
{
    engine_status st;
    engine_model *gpu = load(path, ENGINE_DEVICE_CUDA, q, &st);
    if (!gpu) {
        if (st == ENGINE_ERR_UNSUPPORTED) /* e.g. 4-bit blocks spanning stacked matrices of a tiny shape */
            printf("test_plan_cuda: %s as %s not supported on CUDA, skipped\n", path, plan_quant_name(q));
        return;
    }
    engine_model *cpu = load(path, ENGINE_DEVICE_CPU, ENGINE_QUANT_NONE, &st);
    char err[512] = "";
    engine_session_params sp = engine_session_default_params();
    sp.n_ctx = N_CTX;
    engine_session *s = NULL;
    CHECK_MSG(engine_session_create(gpu, &sp, &s, err, sizeof err) == ENGINE_OK, "%s: %s", path, err);
    engine_memory_report mem;
    if (!s || !cpu || engine_session_memory(s, &mem) != ENGINE_OK) {
        engine_session_free(s);
        engine_model_free(cpu);
        engine_model_free(gpu);
        return;
    }
    engine_plan_params pp = engine_plan_default_params();
    pp.vram_budget = (uint64_t)80 << 30;
    pp.n_ctx = N_CTX;
    engine_plan *as_loaded = NULL, *predicted = NULL;
    CHECK(engine_plan_create(gpu, &pp, &as_loaded, err, sizeof err) == ENGINE_OK);
    pp.quant = q;
    CHECK(engine_plan_create(cpu, &pp, &predicted, err, sizeof err) == ENGINE_OK);
    const char *qn = plan_quant_name(q);
    if (as_loaded && predicted) {
        const engine_plan_totals *t = engine_plan_get_totals(as_loaded);
        CHECK_MSG(plan_weight_total(as_loaded) == mem.weights_owned, "%s %s: weights planned %llu, on the device %llu",
                  path, qn, (unsigned long long)plan_weight_total(as_loaded), (unsigned long long)mem.weights_owned);
        CHECK_MSG(plan_weight_total(predicted) == mem.weights_owned, "%s %s: weights predicted %llu, on the device %llu",
                  path, qn, (unsigned long long)plan_weight_total(predicted), (unsigned long long)mem.weights_owned);
        CHECK_MSG(t->kv_cache == mem.kv_cache, "%s %s: KV planned %llu, allocated %llu", path, qn,
                  (unsigned long long)t->kv_cache, (unsigned long long)mem.kv_cache);
        plan_weights w;
        uint64_t kv, act;
        if (plan_weights_of(gpu, ENGINE_QUANT_NONE, &w, NULL) == ENGINE_OK) {
            plan_session_bytes(&gpu->cfg, gpu->tok_emb.dtype, N_CTX, w.deq_elems, &kv, &act);
            CHECK_MSG(act + PLAN_WORKSPACE == mem.activations, "%s %s: activations planned %llu, allocated %llu",
                      path, qn, (unsigned long long)(act + PLAN_WORKSPACE), (unsigned long long)mem.activations);
            CHECK(w.total == mem.weights_owned && kv == mem.kv_cache);
            free(w.layer);
        }
        /* With virtual memory management the arena maps each region in whole units, as the plan counts. */
        if (mem.device_mapped != mem.device_budget)
            CHECK_MSG(t->device_total - t->cuda_context == mem.device_mapped, "%s %s: planned %llu mapped %llu", path,
                      qn, (unsigned long long)(t->device_total - t->cuda_context),
                      (unsigned long long)mem.device_mapped);
    }
    engine_plan_free(as_loaded);
    engine_plan_free(predicted);
    engine_session_free(s);
    engine_model_free(cpu);
    engine_model_free(gpu);
}

/* engine_device_bandwidths, and a loaded model's plan priced with its figures. */
static void check_measured(void)
{
    uint64_t reserve = 0;
    if (engine_device_reserve(&reserve) != ENGINE_OK)
        return; /* no device: load() below skips */
    double dev = 0.0, h2d = 0.0, dev2 = 0.0, h2d2 = 0.0;
    /* 8 MiB of room cannot hold two buffers of 16 MiB (the least measured past an L2). */
    CHECK(engine_device_bandwidths(reserve + ((uint64_t)8 << 20), &dev, &h2d) == ENGINE_ERR_OVER_BUDGET);
    CHECK(engine_device_bandwidths((uint64_t)2 << 30, &dev, &h2d) == ENGINE_OK);
    printf("test_plan_cuda: device memory %.0f GB/s (copy, read + written), host to device %.1f GB/s\n", dev, h2d);
    CHECK_MSG(dev > 100.0 && dev < 10000.0 && h2d > 1.0 && h2d < 100.0, "%.1f and %.1f GB/s", dev, h2d);
    const double t0 = model_seconds();
    CHECK(engine_device_bandwidths(0, &dev2, &h2d2) == ENGINE_OK && dev2 == dev && h2d2 == h2d);
    CHECK_MSG(model_seconds() - t0 < 0.005, "the second call measured again (%.4f s)", model_seconds() - t0);
    char path[512];
    engine_status st;
    engine_model *m = load(test_src_path(path, sizeof path, "models/stories260K"), ENGINE_DEVICE_CUDA,
                           ENGINE_QUANT_NONE, &st);
    if (!m)
        return;
    const engine_plan_totals *t = engine_plan_get_totals(engine_model_plan(m));
    CHECK(t && t->hbm_source == ENGINE_FIGURE_MEASURED && t->pcie_source == ENGINE_FIGURE_MEASURED);
    CHECK(t && t->hbm_gbps == dev && t->pcie_gbps == h2d);
    engine_model_free(m);
    /* Given figures replace the measured ones. */
    char err[512] = "";
    engine_model_params mp = engine_model_default_params();
    mp.device = ENGINE_DEVICE_CUDA, mp.n_threads = 2, mp.vram_budget = (uint64_t)2 << 30, mp.hbm_gbps = 321.0;
    CHECK_MSG(engine_model_load(path, &mp, &m, err, sizeof err) == ENGINE_OK, "%s", err);
    t = m ? engine_plan_get_totals(engine_model_plan(m)) : NULL;
    CHECK(t && t->hbm_source == ENGINE_FIGURE_GIVEN && t->hbm_gbps == 321.0 && t->pcie_source == ENGINE_FIGURE_MEASURED);
    engine_model_free(m);
}

int main(void)
{
    check_measured();
    static const char *const MODELS[] = {
        "models/stories260K",
        "models/llama_f32",
        "models/llama_bias_f16",
        "models/llama_tied_bf16_oldconfig",
        "models/qwen2_bf16",
        "models/qwen3_f32",
        "models/mistral_sharded",
    };
    static const engine_quant QUANTS[] = {ENGINE_QUANT_NONE, ENGINE_QUANT_INT8, ENGINE_QUANT_INT8_G128,
                                          ENGINE_QUANT_NF4, ENGINE_QUANT_NF4_DQ};
    char path[512];
    for (size_t i = 0; i < sizeof MODELS / sizeof MODELS[0]; i++)
        for (size_t k = 0; k < sizeof QUANTS / sizeof QUANTS[0]; k++)
            check_model(i == 0 ? test_src_path(path, sizeof path, MODELS[i]) : test_data_path(path, sizeof path, MODELS[i]),
                        QUANTS[k]);
    /* bitsandbytes checkpoints as stored: a nested absmax (kept 8-bit where the parts line up) and fp4 */
    check_model(test_data_path(path, sizeof path, "quant/llama_bnb_nf4_dq"), ENGINE_QUANT_NONE);
    check_model(test_data_path(path, sizeof path, "quant/llama_bnb_fp4"), ENGINE_QUANT_NONE);
    return test_finish("test_plan_cuda");
}
