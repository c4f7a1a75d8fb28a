/*
 * forward_moe.c: the MLP of a mixture-of-experts layer on the CPU (Mixtral,
 * Qwen2-MoE, Qwen3-MoE, OLMoE), as transformers computes it: router logits,
 * a softmax over all experts (in fp32, as transformers casts them), the top
 * n_experts_used kept, renormalised where the architecture or
 * norm_topk_prob says, and the kept experts' SwiGLU outputs summed with
 * those weights; Qwen2-MoE adds a shared expert scaled by a sigmoid gate.
 *
 * The pass's (token, choice) pairs are grouped by expert first, so each
 * expert's weights are read once for all the tokens that picked it (a
 * prompt pass reads every picked expert once, not once per token). The
 * experts then run one after another with OpenMP over their rows, or, when
 * there are at least as many picked experts as threads (or each is too
 * small to split), side by side, one thread each.
 */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "model.h"

/*
 * Route token row `logits` [E]: the top k experts into ids[k] (highest
 * probability first; a tie keeps the lower index, as no margin-respecting
 * router meets) and their weights into w[k].
 */
static void route(const float *logits, int E, int k, bool renorm, int *ids, float *w)
{
    float mx = logits[0];
    for (int e = 1; e < E; e++)
        mx = logits[e] > mx ? logits[e] : mx;
    double sum = 0.0;
    for (int e = 0; e < E; e++)
        sum += exp((double)logits[e] - mx);
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            bool taken = false;
            for (int i = 0; i < j && !taken; i++)
                taken = ids[i] == e;
            if (!taken && (best < 0 || logits[e] > logits[best]))
                best = e;
        }
        ids[j] = best;
        /* transformers' probabilities are fp32 (router_logits.float()). */
        w[j] = (float)(exp((double)logits[best] - mx) / sum);
    }
    if (renorm) {
        float s = 0.0f;
        for (int j = 0; j < k; j++)
            s += w[j];
        for (int j = 0; j < k; j++)
            w[j] /= s;
    }
}

/* One expert's SwiGLU (or GeGLU) over its cnt slots' rows of x, the result
 * back into those rows of x. */
static void run_expert(const k_ctx *kc, const cfg_model *c, const moe_expert *ex, int cnt, float *x, float *h,
                       float *h2)
{
    k_matmul(kc, h, x, cnt, &ex->w_gate, NULL);
    k_matmul(kc, h2, x, cnt, &ex->w_up, NULL);
    if (c->act == CFG_ACT_GELU_TANH)
        k_geglu(kc, h, h2, (size_t)cnt * c->moe_ffn_dim);
    else
        k_swiglu(kc, h, h2, (size_t)cnt * c->moe_ffn_dim);
    k_matmul(kc, x, h, cnt, &ex->w_down, NULL);
}

void cpu_moe(const engine_session *s, int l, int n, const float *in, float *out)
{
    const engine_model *m = s->model;
    const cfg_model *c = &m->cfg;
    const layer_weights *L = &m->layers[l];
    const k_ctx *kc = &s->kc;
    const int E = c->n_experts, k = c->n_experts_used, dim = c->dim, F = c->moe_ffn_dim;
    const bool renorm = m->arch->moe_renorm || c->norm_topk_prob;
    int *first = s->moe_first;

    /* Route every token; count each expert's slots. */
    k_matmul(kc, s->moe_logits, in, n, &L->router, NULL);
    memset(first, 0, (size_t)(E + 1) * sizeof *first);
    uint32_t *picks = s->expert_picks ? s->expert_picks + (size_t)l * E : NULL;
    for (int t = 0; t < n; t++) {
        route(s->moe_logits + (size_t)t * E, E, k, renorm, s->moe_slot + (size_t)t * k, s->moe_w + (size_t)t * k);
        for (int j = 0; j < k; j++) {
            first[s->moe_slot[(size_t)t * k + j] + 1]++;
            if (picks)
                picks[s->moe_slot[(size_t)t * k + j]]++;
        }
    }
    for (int e = 0; e < E; e++)
        first[e + 1] += first[e];
    /* Slots in token order within each expert; moe_slot turns from the
     * expert chosen into the slot holding that choice, moe_w follows. The
     * weights are read back through moe_slot, so they stay per choice. */
    int active = 0, most = 0;
    {
        int *fill = first + E + 1;
        for (int e = 0; e < E; e++) {
            fill[e] = first[e];
            const int cnt = first[e + 1] - first[e];
            active += cnt > 0;
            most = cnt > most ? cnt : most;
        }
        for (int t = 0; t < n; t++)
            for (int j = 0; j < k; j++) {
                int *sl = &s->moe_slot[(size_t)t * k + j];
                const int slot = fill[*sl]++;
                s->moe_tok[slot] = t;
                *sl = slot;
            }
    }
    for (int slot = 0; slot < n * k; slot++)
        memcpy(s->moe_x + (size_t)slot * dim, in + (size_t)s->moe_tok[slot] * dim, (size_t)dim * sizeof(float));

    /* The shared expert reads `in` too, so it runs before out is written. */
    if (L->shared.w_gate.data) {
        const int SF = c->shared_ffn_dim;
        k_matmul(kc, s->moe_gate, in, n, &L->shared_gate, NULL);
        k_matmul(kc, s->hb, in, n, &L->shared.w_gate, NULL);
        k_matmul(kc, s->hb2, in, n, &L->shared.w_up, NULL);
        if (c->act == CFG_ACT_GELU_TANH)
            k_geglu(kc, s->hb, s->hb2, (size_t)n * SF);
        else
            k_swiglu(kc, s->hb, s->hb2, (size_t)n * SF);
        k_matmul(kc, out, s->hb, n, &L->shared.w_down, NULL);
        for (int t = 0; t < n; t++) {
            const float g = 1.0f / (1.0f + expf(-s->moe_gate[t]));
            for (int i = 0; i < dim; i++)
                out[(size_t)t * dim + i] *= g;
        }
    } else {
        memset(out, 0, (size_t)n * dim * sizeof *out);
    }

    /* The picked experts, each over its slots. A product below
     * K_PARALLEL_MIN_WORK runs on one thread anyway (k_matmul), so small
     * experts go side by side too. */
    const bool side_by_side =
        kc->n_threads > 1 && (active >= kc->n_threads || (double)most * F * dim < K_PARALLEL_MIN_WORK);
    if (side_by_side) {
#pragma omp parallel for num_threads(kc->n_threads) schedule(dynamic, 1)
        for (int e = 0; e < E; e++) {
            const int cnt = first[e + 1] - first[e];
            if (cnt == 0)
                continue;
            const int tid = omp_get_thread_num();
            const k_ctx one = {1, kc->scratch ? kc->scratch + (size_t)tid * kc->scratch_per_thread : NULL,
                               kc->scratch_per_thread};
            run_expert(&one, c, &L->experts[e], cnt, s->moe_x + (size_t)first[e] * dim,
                       s->moe_h + (size_t)first[e] * F, s->moe_h2 + (size_t)first[e] * F);
        }
    } else {
        for (int e = 0; e < E; e++) {
            const int cnt = first[e + 1] - first[e];
            if (cnt > 0)
                run_expert(kc, c, &L->experts[e], cnt, s->moe_x + (size_t)first[e] * dim,
                           s->moe_h + (size_t)first[e] * F, s->moe_h2 + (size_t)first[e] * F);
        }
    }

    /* Each token's choices, weighted, in the order it chose them: the sum
     * does not depend on how the experts were scheduled. */
    for (int t = 0; t < n; t++)
        for (int j = 0; j < k; j++) {
            const int slot = s->moe_slot[(size_t)t * k + j];
            const float w = s->moe_w[(size_t)t * k + j];
            const float *y = s->moe_x + (size_t)slot * dim;
            float *o = out + (size_t)t * dim;
            for (int i = 0; i < dim; i++)
                o[i] += w * y[i];
        }
}

/* One token's MLP input: x through layer l's norm into xb where it has one, else x itself. */
static const float *mlp_input(const engine_model *m, const k_ctx *kc, int l, const float *x, float *xb)
{
    const layer_weights *L = &m->layers[l];
    if (!L->ffn_norm.data)
        return x;
    k_rmsnorm_ex(kc, xb, x, 1, m->cfg.dim, &L->ffn_norm, (float)m->cfg.rms_eps, m->arch->norm_offset ? 1.0f : 0.0f);
    return xb;
}

size_t cpu_moe_token_floats(const cfg_model *c)
{
    const size_t dim = (size_t)c->dim, E = (size_t)c->n_experts, k = (size_t)c->n_experts_used;
    const size_t h = c->moe_ffn_dim > c->shared_ffn_dim ? (size_t)c->moe_ffn_dim : (size_t)c->shared_ffn_dim;
    return 3 * dim + E + 1 + 3 * k + 2 * h + 2 * k * (size_t)c->moe_ffn_dim + k * dim;
}

#define EXPERT_ROWS 16 /* rows of one expert's product a work item */

/*
 * One token's choices j whose expert is in [from, E): expert ids[j]'s
 * output for input `in`, unweighted, into ys[j * dim, (j + 1) * dim); the
 * other rows are left alone. One parallel region for all of them: the
 * gate/up rows of every such choice are split among the threads in items
 * of EXPERT_ROWS rows (each item's gated product computed there), then,
 * after the region's barrier, the down rows likewise. A token's few
 * experts are small products; one region instead of one per product per
 * expert keeps every thread busy and pays the fork and join once.
 * g, u: n_experts_used * moe_ffn_dim floats each; list: n_experts_used ints.
 */
static void host_choices(const engine_model *m, const k_ctx *kc, int l, const float *in, const int32_t *ids,
                         int from, float *ys, float *g, float *u, int *list)
{
    const cfg_model *c = &m->cfg;
    const moe_expert *experts = m->layers[l].experts;
    const int E = c->n_experts, k = c->n_experts_used, dim = c->dim, F = c->moe_ffn_dim;
    const bool gelu = c->act == CFG_ACT_GELU_TANH;
    int nh = 0;
    for (int j = 0; j < k; j++)
        if (ids[j] >= from && ids[j] < E)
            list[nh++] = j;
    if (nh == 0)
        return;
    const int gu_items = (F + EXPERT_ROWS - 1) / EXPERT_ROWS, d_items = (dim + EXPERT_ROWS - 1) / EXPERT_ROWS;
    const k_ctx one = {1, NULL, 0};
#pragma omp parallel num_threads(kc->n_threads) if (kc->n_threads > 1)
    {
#pragma omp for schedule(static)
        for (int it = 0; it < nh * gu_items; it++) {
            const int j = list[it / gu_items], r0 = it % gu_items * EXPERT_ROWS;
            const int r1 = r0 + EXPERT_ROWS < F ? r0 + EXPERT_ROWS : F;
            const moe_expert *ex = &experts[ids[j]];
            float *gj = g + (size_t)j * F + r0, *uj = u + (size_t)j * F + r0;
            k_matvec_rows(&ex->w_gate, r0, r1, in, gj);
            k_matvec_rows(&ex->w_up, r0, r1, in, uj);
            if (gelu)
                k_geglu(&one, gj, uj, (size_t)(r1 - r0));
            else
                k_swiglu(&one, gj, uj, (size_t)(r1 - r0));
        }
#pragma omp for schedule(static)
        for (int it = 0; it < nh * d_items; it++) {
            const int j = list[it / d_items], r0 = it % d_items * EXPERT_ROWS;
            const int r1 = r0 + EXPERT_ROWS < dim ? r0 + EXPERT_ROWS : dim;
            k_matvec_rows(&experts[ids[j]].w_down, r0, r1, g + (size_t)j * F, ys + (size_t)j * dim + r0);
        }
    }
}

/*
 * One token's expert MLP without a session (a hosted layer, cuda/host_layers.c):
 * cpu_moe's routing, shared expert and weighted sum for n = 1, its experts
 * by host_choices(), then joined to the residual stream as forward_cpu.c's
 * residual_add does; each choice's output is added in choice order.
 */
void cpu_moe_token(const engine_model *m, const k_ctx *kc, int l, float *x, float *scratch, uint32_t *picks)
{
    const cfg_model *c = &m->cfg;
    const layer_weights *L = &m->layers[l];
    const int E = c->n_experts, k = c->n_experts_used, dim = c->dim, F = c->moe_ffn_dim;
    const int hmax = c->moe_ffn_dim > c->shared_ffn_dim ? c->moe_ffn_dim : c->shared_ffn_dim;
    const float eps = (float)c->rms_eps, offset = m->arch->norm_offset ? 1.0f : 0.0f;
    float *xb = scratch, *out = xb + dim, *logits = out + dim, *gate = logits + E, *w = gate + 1;
    int *ids = (int *)(w + k), *list = ids + k; /* ints in floats' room */
    float *h = w + 3 * k, *h2 = h + hmax, *g = h2 + hmax, *u = g + (size_t)k * F, *ys = u + (size_t)k * F;
    const float *in = mlp_input(m, kc, l, x, xb);
    k_matmul(kc, logits, in, 1, &L->router, NULL);
    route(logits, E, k, m->arch->moe_renorm || c->norm_topk_prob, ids, w);
    for (int j = 0; picks && j < k; j++)
        picks[ids[j]]++;
    if (L->shared.w_gate.data) {
        const int SF = c->shared_ffn_dim;
        k_matmul(kc, gate, in, 1, &L->shared_gate, NULL);
        k_matmul(kc, h, in, 1, &L->shared.w_gate, NULL);
        k_matmul(kc, h2, in, 1, &L->shared.w_up, NULL);
        if (c->act == CFG_ACT_GELU_TANH)
            k_geglu(kc, h, h2, (size_t)SF);
        else
            k_swiglu(kc, h, h2, (size_t)SF);
        k_matmul(kc, out, h, 1, &L->shared.w_down, NULL);
        const float gs = 1.0f / (1.0f + expf(-gate[0]));
        for (int i = 0; i < dim; i++)
            out[i] *= gs;
    } else {
        memset(out, 0, (size_t)dim * sizeof *out);
    }
    host_choices(m, kc, l, in, (const int32_t *)ids, 0, ys, g, u, list);
    for (int j = 0; j < k; j++)
        for (int i = 0; i < dim; i++)
            out[i] += w[j] * ys[(size_t)j * dim + i];
    if (L->ffn_post_norm.data)
        k_rmsnorm_ex(kc, out, out, 1, dim, &L->ffn_post_norm, eps, offset);
    if (c->residual_multiplier != 1.0)
        k_scale(kc, out, (float)c->residual_multiplier, (size_t)dim);
    k_add(kc, x, out, (size_t)dim);
}

/*
 * The routed experts of one token that live in host memory (a layer whose
 * first `from` experts are on the GPU, cuda/host_layers.c): x [dim] is the
 * layer's MLP input before its norm; each choice j with ids[j] >= from
 * gets its expert's output, unweighted, in out[j * dim, (j + 1) * dim);
 * the other rows are left alone. scratch: cpu_moe_token_floats() floats.
 */
void cpu_moe_host_experts(const engine_model *m, const k_ctx *kc, int l, const float *x, const int32_t *ids,
                          int from, float *out, float *scratch)
{
    const cfg_model *c = &m->cfg;
    const int k = c->n_experts_used, dim = c->dim, F = c->moe_ffn_dim;
    float *xb = scratch, *g = xb + dim, *u = g + (size_t)k * F;
    int *list = (int *)(u + (size_t)k * F);
    const float *in = mlp_input(m, kc, l, x, xb);
    host_choices(m, kc, l, in, ids, from, out, g, u, list);
}
