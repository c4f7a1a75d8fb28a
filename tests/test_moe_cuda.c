/*
 * test_moe_cuda.c: the mixture-of-experts kernels (kernels/cuda/moe.cu)
 * and the experts' decode product (gemv_args.experts) on fresh random
 * inputs, outputs poisoned first:
 * - routing against a CPU reference written from forward_moe.c's
 *   contract (softmax in double, top-k with the lower index on a tie,
 *   renormalised in choice order): the same ids, weights within 1e-6;
 *   a row stride past E and a NaN logit included;
 * - grouping: every slot in its expert's group, groups at multiples of
 *   the padding, tokens in order within a group, padding rows marked;
 *   then gathering the rows and the weighted sum (with and without a
 *   shared expert and its gate), against the CPU's order of sums;
 * - the experts' product, one launch over k chosen experts, against one
 *   launch_gemv per expert on the same matrix: bit for bit, for dense
 *   f32/f16/bf16 and int8 and nf4 experts, plain and gated, with a shared
 *   input and with an input a choice.
 * Skips (77) without a GPU.
 */
#define _POSIX_C_SOURCE 200809L

#include "cuda_test_util.h"
#include "quant/quant.h"

/* forward_moe.c's route(), as its contract reads. */
static void ref_route(const float *logits, int E, int k, bool renorm, int *ids, float *w)
{
    float mx = -INFINITY;
    for (int e = 0; e < E; e++)
        if (logits[e] == logits[e])
            mx = logits[e] > mx ? logits[e] : mx;
    double sum = 0.0;
    for (int e = 0; e < E; e++)
        sum += logits[e] == logits[e] ? exp((double)logits[e] - mx) : 0.0;
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            bool taken = false;
            for (int i = 0; i < j && !taken; i++)
                taken = ids[i] == e;
            const float v = logits[e] == logits[e] ? logits[e] : -INFINITY;
            const float b = best >= 0 && logits[best] == logits[best] ? logits[best] : -INFINITY;
            if (!taken && (best < 0 || v > b))
                best = e;
        }
        ids[j] = best;
        w[j] = logits[best] == logits[best] ? (float)(exp((double)logits[best] - mx) / sum) : 0.0f;
    }
    if (renorm) {
        float s = 0.0f;
        for (int j = 0; j < k; j++)
            s += w[j];
        for (int j = 0; j < k; j++)
            w[j] /= s;
    }
}

static void check_route(launch_ctx *lc, int n, int E, int k, int ld, bool renorm)
{
    float *logits = malloc((size_t)n * ld * sizeof *logits), *w = malloc((size_t)n * k * sizeof *w);
    int *ids = malloc((size_t)n * k * sizeof *ids);
    fill(logits, (size_t)n * ld, 4.0);
    logits[(size_t)(n / 2) * ld + E / 3] = NAN; /* counts as -inf */
    float *dl = dev_copy(logits, (size_t)n * ld), *dw = dev_alloc((size_t)n * k * sizeof(float));
    int32_t *di = dev_alloc((size_t)n * k * sizeof(int32_t));
    uint32_t *dp = dev_alloc((size_t)E * sizeof(uint32_t));
    CHECK(cudaMemset(dp, 0, (size_t)E * sizeof(uint32_t)) == cudaSuccess);
    CHECK_MSG(launch_moe_route(lc, dl, ld, n, E, k, renorm, di, dw, dp) == 0, "moe_route: %s", lc->err);
    int32_t *gi = malloc((size_t)n * k * sizeof *gi);
    float *gw = host_f32(dw, K_F32, (size_t)n * k);
    CHECK(cudaMemcpy(gi, di, (size_t)n * k * sizeof *gi, cudaMemcpyDeviceToHost) == cudaSuccess);
    int bad_ids = 0;
    double worst = 0.0;
    for (int t = 0; t < n; t++) {
        ref_route(logits + (size_t)t * ld, E, k, renorm, ids + (size_t)t * k, w + (size_t)t * k);
        for (int j = 0; j < k; j++) {
            const size_t i = (size_t)t * k + j;
            bad_ids += gi[i] != ids[i];
            worst = fmax(worst, fabs((double)gw[i] - w[i]) / fmax(fabs((double)w[i]), 1e-30));
        }
    }
    CHECK_MSG(bad_ids == 0 && worst < 1e-6, "moe_route n %d E %d k %d ld %d renorm %d: %d ids differ, weights by %.2e",
              n, E, k, ld, renorm, bad_ids, worst);
    /* The pick counts: each expert's count is how many of the reference's choices name it. */
    uint32_t *gp = malloc((size_t)E * sizeof *gp);
    CHECK(cudaMemcpy(gp, dp, (size_t)E * sizeof *gp, cudaMemcpyDeviceToHost) == cudaSuccess);
    int bad_picks = 0;
    for (int e = 0; e < E; e++) {
        uint32_t want = 0;
        for (int i = 0; i < n * k; i++)
            want += ids[i] == e;
        bad_picks += gp[e] != want;
    }
    CHECK_MSG(bad_picks == 0, "moe_route n %d E %d k %d: %d experts' pick counts differ", n, E, k, bad_picks);
    free(logits), free(w), free(ids), free(gi), free(gw), free(gp);
    cudaFree(dl), cudaFree(dw), cudaFree(di), cudaFree(dp);
}

/* Grouping, gathering and the weighted sum for n tokens, k of E experts each, groups padded to pad rows. */
static void check_group_combine(launch_ctx *lc, int n, int E, int k, int pad, int dim, bool shared)
{
    const int slots = n * k, cap = slots + E * (pad - 1);
    int32_t *ids = malloc((size_t)slots * sizeof *ids);
    for (int t = 0; t < n; t++) /* k distinct experts a token */
        for (int j = 0; j < k; j++) {
            int e;
            bool again;
            do {
                e = (int)((urand() + 1.0) * 0.5 * E) % E;
                again = false;
                for (int i = 0; i < j; i++)
                    again = again || ids[t * k + i] == e;
            } while (again);
            ids[t * k + j] = e;
        }
    int32_t *d_ids = dev_from(ids, (size_t)slots * sizeof *ids), *d_first = dev_alloc((2 * (size_t)E + 1) * 4);
    int32_t *d_slot = dev_alloc((size_t)slots * 4), *d_tok = dev_alloc((size_t)cap * 4);
    CHECK_MSG(launch_moe_group(lc, d_ids, n, k, E, pad, cap, d_first, d_slot, d_tok) == 0, "moe_group: %s", lc->err);
    int32_t *first = malloc((2 * (size_t)E + 1) * 4), *slot = malloc((size_t)slots * 4), *tok = malloc((size_t)cap * 4);
    cudaMemcpy(first, d_first, (2 * (size_t)E + 1) * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(slot, d_slot, (size_t)slots * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(tok, d_tok, (size_t)cap * 4, cudaMemcpyDeviceToHost);
    int bad = 0, at = 0;
    for (int e = 0; e < E; e++) {
        int cnt = 0;
        for (int s = 0; s < slots; s++)
            cnt += ids[s] == e;
        bad += first[e] != at || first[E + 1 + e] != cnt;
        for (int r = at; r < at + cnt; r++) /* tokens in order, then padding */
            bad += tok[r] < 0 || (r > at && tok[r] <= tok[r - 1]);
        for (int r = at + cnt; r < at + (cnt + pad - 1) / pad * pad; r++)
            bad += tok[r] != -1;
        at += (cnt + pad - 1) / pad * pad;
    }
    bad += first[E] != at;
    for (int s = 0; s < slots; s++) {
        const int r = slot[s], e = ids[s];
        bad += r < first[e] || r >= first[e] + first[E + 1 + e] || tok[r] != s / k;
    }
    CHECK_MSG(bad == 0, "moe_group n %d E %d k %d pad %d: %d mismatches", n, E, k, pad, bad);

    /* Gather the tokens' rows, then sum the rows' outputs back. */
    float *in = malloc((size_t)n * dim * sizeof *in), *ys = malloc((size_t)cap * dim * sizeof *ys);
    float *w = malloc((size_t)slots * sizeof *w), *sh = malloc((size_t)n * dim * sizeof *sh);
    float *gate = malloc((size_t)n * 3 * sizeof *gate), *x = malloc((size_t)n * dim * sizeof *x);
    fill(in, (size_t)n * dim, 1.0), fill(ys, (size_t)cap * dim, 1.0), fill(w, (size_t)slots, 1.0);
    fill(sh, (size_t)n * dim, 1.0), fill(gate, (size_t)n * 3, 2.0), fill(x, (size_t)n * dim, 1.0);
    float *d_in = dev_copy(in, (size_t)n * dim), *d_g = dev_alloc((size_t)cap * dim * sizeof(float));
    CHECK_MSG(launch_moe_gather(lc, d_g, d_in, K_F32, d_tok, cap, dim) == 0, "moe_gather: %s", lc->err);
    float *g = host_f32(d_g, K_F32, (size_t)cap * dim);
    bad = 0;
    for (int r = 0; r < cap; r++)
        for (int i = 0; i < dim; i++)
            bad += g[(size_t)r * dim + i] != (tok[r] >= 0 ? in[(size_t)tok[r] * dim + i] : 0.0f);
    CHECK_MSG(bad == 0, "moe_gather %d rows of %d: %d elements differ", cap, dim, bad);
    float *d_ys = dev_copy(ys, (size_t)cap * dim), *d_w = dev_copy(w, (size_t)slots);
    float *d_sh = dev_copy(sh, (size_t)n * dim), *d_gate = dev_copy(gate, (size_t)n * 3);
    float *d_x = dev_copy(x, (size_t)n * dim);
    CHECK_MSG(launch_moe_combine(lc, d_x, NULL, d_ys, d_slot, d_w, n, k, dim, shared ? d_sh : NULL, d_gate + 2, 3) ==
                  0,
              "moe_combine: %s", lc->err);
    float *gx = host_f32(d_x, K_F32, (size_t)n * dim);
    bad = 0;
    for (int t = 0; t < n; t++) {
        const float gt = 1.0f / (1.0f + expf(-gate[t * 3 + 2]));
        for (int i = 0; i < dim; i++) {
            volatile float o = shared ? sh[(size_t)t * dim + i] * gt : 0.0f; /* each step rounded, as the CPU */
            for (int j = 0; j < k; j++) {
                volatile float p = w[t * k + j] * ys[(size_t)slot[t * k + j] * dim + i];
                o = o + p;
            }
            const float want = x[(size_t)t * dim + i] + o;
            bad += fabsf(gx[(size_t)t * dim + i] - want) > 1e-6f * (1.0f + fabsf(want));
        }
    }
    CHECK_MSG(bad == 0, "moe_combine n %d k %d dim %d shared %d: %d elements differ", n, k, dim, shared, bad);
    free(ids), free(first), free(slot), free(tok), free(in), free(ys), free(w), free(sh), free(gate), free(x);
    free(g), free(gx);
    cudaFree(d_ids), cudaFree(d_first), cudaFree(d_slot), cudaFree(d_tok), cudaFree(d_in), cudaFree(d_g);
    cudaFree(d_ys), cudaFree(d_w), cudaFree(d_sh), cudaFree(d_gate), cudaFree(d_x);
}

/* Bytes at *off rounded up to 256, as the engine lays out arrays. */
static uint64_t take(uint64_t *off, uint64_t bytes)
{
    const uint64_t at = (*off + 255) & ~(uint64_t)255;
    *off = at + bytes;
    return at;
}

/*
 * E experts of [rows, cols] in type t (K_I8, K_NF4: quantized from random
 * dense ones) laid out in one device buffer with their offsets; k of them
 * chosen; the batched product against a product per chosen expert.
 */
static void check_experts(launch_ctx *lc, k_dtype t, int E, int k, int rows, int cols, bool glu, bool own_x)
{
    const size_t nw = (size_t)rows * cols;
    const bool quant = k_dtype_is_quant(t);
    gemv_expert *tab = calloc((size_t)E, sizeof *tab);
    void **hdata = calloc((size_t)E, sizeof *hdata);
    q_weight *qw = calloc((size_t)E, sizeof *qw);
    uint64_t off = 0;
    size_t data_bytes = 0, n_scales = 0;
    int group = 0;
    float *vals = malloc(nw * sizeof *vals);
    for (int e = 0; e < E; e++) { /* the host images, then their places */
        if (!quant) {
            hdata[e] = make_weight(t, nw, vals, 1.0);
            data_bytes = nw * k_dtype_size(t);
        } else {
            fill(vals, nw, 1.0);
            const k_weight src = {vals, K_F32, rows, cols};
            const q_spec spec = {.type = t, .group = 0, .double_quant = false};
            err_buf er = {0};
            CHECK_MSG(q_quantize_weight(&src, &spec, 1, &qw[e], "test", &er) == ENGINE_OK, "%s", er.msg);
            const k_weight *w = &qw[e].w;
            group = t == K_I8 ? w->group : w->block;
            data_bytes = t == K_I8 ? nw : (nw + 1) / 2;
            n_scales = t == K_I8 ? (size_t)rows * q_int8_n_groups(cols, w->group) : (nw + w->block - 1) / w->block;
        }
        tab[e].w = take(&off, data_bytes);
        if (quant)
            tab[e].scales = take(&off, n_scales * sizeof(float));
        if (t == K_NF4)
            tab[e].code = take(&off, 16 * sizeof(float));
    }
    char *base = dev_alloc(off);
    for (int e = 0; e < E; e++) {
        const k_weight *w = quant ? &qw[e].w : NULL;
        cudaMemcpy(base + tab[e].w, quant ? w->data : hdata[e], data_bytes, cudaMemcpyHostToDevice);
        if (quant)
            cudaMemcpy(base + tab[e].scales, t == K_I8 ? w->scales : w->absmax, n_scales * sizeof(float),
                       cudaMemcpyHostToDevice);
        if (t == K_NF4)
            cudaMemcpy(base + tab[e].code, w->code, 16 * sizeof(float), cudaMemcpyHostToDevice);
    }
    gemv_expert *d_tab = dev_from(tab, (size_t)E * sizeof *tab);
    int32_t *chosen = malloc((size_t)k * sizeof *chosen);
    for (int j = 0; j < k; j++) /* distinct, in no order */
        chosen[j] = (int32_t)((j * 7 + 3) % E);
    int32_t *d_ids = dev_from(chosen, (size_t)k * sizeof *chosen);
    const int outs = glu ? rows / 2 : rows;
    float *x = malloc((size_t)k * cols * sizeof *x), *norm = malloc((size_t)cols * sizeof *norm);
    fill(x, (size_t)k * cols, 2.0), fill(norm, (size_t)cols, 1.0);
    float *dx = dev_copy(x, (size_t)k * cols), *dn = dev_copy(norm, (size_t)cols);
    float *dy = dev_alloc((size_t)k * outs * sizeof(float)), *dy1 = dev_alloc((size_t)outs * sizeof(float));
    gemv_args a = {.y = dy, .rows = rows, .cols = cols, .in = own_x ? GEMV_IN_F32 : GEMV_IN_RMSNORM, .x = dx,
                   .norm = dn, .eps = 1e-5f, .glu_out = glu, .wt = t, .group = group,
                   .w = base + tab[0].w, .scales = quant ? (const float *)(base + tab[0].scales) : NULL,
                   .code = t == K_NF4 ? (const float *)(base + tab[0].code) : NULL, .experts = d_tab,
                   .expert_base = base, .expert_ids = d_ids, .n_choices = k, .x_stride = own_x ? cols : 0,
                   .y_stride = outs};
    CHECK_MSG(launch_gemv(lc, &a) == 0, "gemv experts: %s", lc->err);
    float *got = host_f32(dy, K_F32, (size_t)k * outs);
    int bad = 0;
    for (int j = 0; j < k; j++) {
        const gemv_expert *o = &tab[chosen[j]];
        gemv_args one = a;
        one.experts = NULL, one.expert_base = NULL, one.expert_ids = NULL, one.n_choices = 0;
        one.x_stride = one.y_stride = 0;
        one.y = dy1;
        one.x = dx + (own_x ? (size_t)j * cols : 0);
        one.w = base + o->w;
        one.scales = quant ? (const float *)(base + o->scales) : NULL;
        one.code = t == K_NF4 ? (const float *)(base + o->code) : NULL;
        CHECK_MSG(launch_gemv(lc, &one) == 0, "gemv: %s", lc->err);
        float *ref = host_f32(dy1, K_F32, (size_t)outs);
        for (int i = 0; i < outs; i++)
            bad += memcmp(&ref[i], &got[(size_t)j * outs + i], sizeof(float)) != 0;
        free(ref);
    }
    CHECK_MSG(bad == 0, "gemv experts %s E %d k %d %dx%d glu %d own x %d: %d outputs differ from one product an "
              "expert", dtype_name(t), E, k, rows, cols, glu, own_x, bad);
    for (int e = 0; e < E; e++) {
        free(hdata[e]);
        if (quant)
            q_weight_free(&qw[e]);
    }
    free(tab), free(hdata), free(qw), free(vals), free(chosen), free(x), free(norm), free(got);
    cudaFree(base), cudaFree(d_tab), cudaFree(d_ids), cudaFree(dx), cudaFree(dn), cudaFree(dy), cudaFree(dy1);
}

int main(void)
{
    test_rng_state = 0x6a09e667f3bcc908ull;
    launch_ctx lc;
    const int skip = cuda_test_setup("test_moe_cuda", &lc);
    if (skip)
        return skip;
    static const int routes[][3] = {{1, 8, 2}, {37, 8, 2}, {5, 60, 4}, {64, 128, 8}, {3, 16, 16}, {9, 1024, 8}};
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
        for (int renorm = 0; renorm < 2; renorm++) {
            check_route(&lc, routes[i][0], routes[i][1], routes[i][2], routes[i][1], renorm);
            check_route(&lc, routes[i][0], routes[i][1], routes[i][2], routes[i][1] + 1, renorm); /* a shared gate after */
        }
    check_group_combine(&lc, 1, 8, 2, 1, 64, false);
    check_group_combine(&lc, 12, 8, 2, 8, 64, true);
    check_group_combine(&lc, 512, 128, 8, 1, 96, false);
    check_group_combine(&lc, 300, 60, 4, 4, 33, true);
    static const k_dtype types[] = {K_F32, K_F16, K_BF16, K_I8, K_NF4};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        check_experts(&lc, types[i], 8, 2, 96, 64, true, false);  /* gate/up: the token's input, gated */
        check_experts(&lc, types[i], 8, 2, 64, 48, false, true);  /* down: each choice's hidden state */
        check_experts(&lc, types[i], 16, 4, 48, 24, false, true); /* rows not whole 16-byte chunks */
        check_experts(&lc, types[i], 128, 8, 1536, 2048, true, false);
        check_experts(&lc, types[i], 128, 8, 2048, 768, false, true);
    }
    /* Bad arguments fail with a message and launch nothing. */
    CHECK(launch_moe_route(&lc, NULL, 8, 1, 8, 2, false, NULL, NULL, NULL) == -1 && strstr(lc.err, "moe_route"));
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    cudaStreamDestroy(lc.stream);
    return test_finish("test_moe_cuda");
}
