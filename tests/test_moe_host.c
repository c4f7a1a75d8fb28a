/*
 * test_moe_host.c: the one-token expert paths the CUDA backend runs on the
 * CPU (forward_moe.c), checked on the CPU so that CI covers them: a hosted
 * expert layer's MLP (cpu_moe_token) against the CPU pass's own
 * (cpu_moe over one row, plus the residual), and a split layer's host
 * experts (cpu_moe_host_experts) against each chosen expert computed
 * alone with k_matmul. Every expert fixture, dense (f32) and quantized
 * while loading (nf4 with double quantization: the 4-bit rows decoded in
 * registers), on one and two threads. Output rows a call must not write
 * are poisoned and checked untouched.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "engine/model.h"
#include "test_random.h"
#include "test_util.h"

/* Layer l's MLP input for x: its norm where it has one (as forward_moe.c's mlp_input). */
static void mlp_in(const engine_model *m, const k_ctx *kc, int l, const float *x, float *in)
{
    const layer_weights *L = &m->layers[l];
    if (!L->ffn_norm.data) {
        memcpy(in, x, (size_t)m->cfg.dim * sizeof *in);
        return;
    }
    k_rmsnorm_ex(kc, in, x, 1, m->cfg.dim, &L->ffn_norm, (float)m->cfg.rms_eps, m->arch->norm_offset ? 1.0f : 0.0f);
}

/* Expert e's SwiGLU output for in, by the batch product (an independent path). */
static void expert_ref(const engine_model *m, const k_ctx *kc, int l, int e, const float *in, float *y)
{
    const cfg_model *c = &m->cfg;
    const moe_expert *ex = &m->layers[l].experts[e];
    float *g = malloc((size_t)c->moe_ffn_dim * sizeof *g), *u = malloc((size_t)c->moe_ffn_dim * sizeof *u);
    k_matmul(kc, g, in, 1, &ex->w_gate, NULL);
    k_matmul(kc, u, in, 1, &ex->w_up, NULL);
    if (c->act == CFG_ACT_GELU_TANH)
        k_geglu(kc, g, u, (size_t)c->moe_ffn_dim);
    else
        k_swiglu(kc, g, u, (size_t)c->moe_ffn_dim);
    k_matmul(kc, y, g, 1, &ex->w_down, NULL);
    free(g), free(u);
}

static double max_rel(const float *got, const float *ref, int n)
{
    double scale = 1e-30, d = 0.0;
    for (int i = 0; i < n; i++)
        scale = fmax(scale, fabs((double)ref[i]));
    for (int i = 0; i < n; i++) {
        const double e = fabs((double)got[i] - ref[i]);
        if (!(e == e))
            return INFINITY;
        d = fmax(d, e);
    }
    return d / scale;
}

static void check_fixture(const char *name, engine_quant quant, int threads)
{
    char path[1024], err[512] = "";
    snprintf(path, sizeof path, "%s/models/%s", getenv("ENGINE_TEST_DATA") ? getenv("ENGINE_TEST_DATA") : "tests/data",
             name);
    engine_model_params mp = engine_model_default_params();
    mp.n_threads = threads;
    mp.device = ENGINE_DEVICE_CPU;
    mp.quant = quant;
    engine_model *m = NULL;
    engine_session *s = NULL;
    if (engine_model_load(path, &mp, &m, err, sizeof err) != ENGINE_OK) {
        CHECK_MSG(0, "%s: %s", path, err);
        return;
    }
    engine_session_params sp = engine_session_default_params();
    sp.n_ctx = 8;
    CHECK_MSG(engine_session_create(m, &sp, &s, err, sizeof err) == ENGINE_OK, "%s", err);
    const cfg_model *c = &m->cfg;
    const int dim = c->dim, E = c->n_experts, k = c->n_experts_used;
    const k_ctx *kc = &s->kc;
    k_ctx host = {threads, NULL, 0};
    float *x = malloc((size_t)dim * sizeof *x), *in = malloc((size_t)dim * sizeof *in);
    float *want = malloc((size_t)dim * sizeof *want), *got = malloc((size_t)dim * sizeof *got);
    float *ys = malloc((size_t)k * dim * sizeof *ys), *ref = malloc((size_t)dim * sizeof *ref);
    float *scratch = malloc(cpu_moe_token_floats(c) * sizeof *scratch);
    int32_t *ids = malloc((size_t)k * sizeof *ids);
    const char *qn = quant == ENGINE_QUANT_NONE ? "as stored" : "nf4-dq";
    int layers = 0;
    for (int l = 0; l < c->n_layers && s; l++) {
        if (!m->layers[l].experts)
            continue;
        layers++;
        fill(x, (size_t)dim, 1.0);
        /* cpu_moe_token against x + cpu_moe(norm(x)) */
        mlp_in(m, kc, l, x, in);
        cpu_moe(s, l, 1, in, want);
        for (int i = 0; i < dim; i++)
            want[i] += x[i];
        memcpy(got, x, (size_t)dim * sizeof *got);
        uint32_t *picks = calloc((size_t)E, sizeof *picks);
        cpu_moe_token(m, &host, l, got, scratch, picks);
        uint32_t total = 0, most = 0;
        for (int e2 = 0; e2 < E; e2++)
            total += picks[e2], most = picks[e2] > most ? picks[e2] : most;
        CHECK_MSG(total == (uint32_t)k && most == 1, "%s layer %d: cpu_moe_token counted %u picks (most %u), want %d",
                  name, l, total, most, k);
        free(picks);
        double e = max_rel(got, want, dim);
        CHECK_MSG(e < 1e-5, "%s (%s, %d threads) layer %d: cpu_moe_token differs from cpu_moe by %g", name, qn,
                  threads, l, e);
        /* cpu_moe_host_experts: choices from a spread of experts, those at or above `from` computed */
        for (int j = 0; j < k; j++)
            ids[j] = (int32_t)((j * 5 + l) % E);
        for (int from = 0; from <= E; from += E / 2) {
            for (size_t i = 0; i < (size_t)k * dim; i++)
                ys[i] = 12345.0f;
            cpu_moe_host_experts(m, &host, l, x, ids, from, ys, scratch);
            for (int j = 0; j < k; j++) {
                const float *yj = ys + (size_t)j * dim;
                if (ids[j] < from) {
                    int kept = 1;
                    for (int i = 0; i < dim; i++)
                        kept &= yj[i] == 12345.0f;
                    CHECK_MSG(kept, "%s layer %d: choice %d (expert %d < %d) was written", name, l, j, ids[j], from);
                    continue;
                }
                expert_ref(m, kc, l, ids[j], in, ref);
                e = max_rel(yj, ref, dim);
                CHECK_MSG(e < 1e-5, "%s (%s, %d threads) layer %d expert %d: host expert differs by %g", name, qn,
                          threads, l, ids[j], e);
            }
        }
    }
    CHECK_MSG(layers > 0, "%s: no expert layers", name);
    free(x), free(in), free(want), free(got), free(ys), free(ref), free(scratch), free(ids);
    engine_session_free(s);
    engine_model_free(m);
}

int main(void)
{
    const char *fixtures[] = {"mixtral_f32", "qwen2moe_f32", "qwen3moe_f32", "olmoe_f32"};
    for (size_t i = 0; i < sizeof fixtures / sizeof fixtures[0]; i++)
        for (int threads = 1; threads <= 2; threads++) {
            check_fixture(fixtures[i], ENGINE_QUANT_NONE, threads);
            check_fixture(fixtures[i], ENGINE_QUANT_NF4_DQ, threads);
        }
    return test_finish("test_moe_host");
}
