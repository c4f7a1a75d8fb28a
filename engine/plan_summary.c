/*
 * plan_summary.c: the offload plan in one line (engine_plan_summary): all
 * resident; the experts or layers in host memory and the decode bound,
 * naming the quantized format that would keep everything resident; the KV
 * cache's type and the way --kv auto did not take; or the refusal with the
 * minimum, its parts and what would fit. Words only: plan.c decides.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>

#include "plan.h"

#define H(i, v) engine_format_bytes((v), hb[i], sizeof hb[i])

/* The quantized format to suggest: the least lossy one that passes `resident` (or just fits). */
static const engine_plan_option *suggest(const engine_plan *p, bool resident)
{
    static const engine_quant ORDER[] = {ENGINE_QUANT_INT8, ENGINE_QUANT_NF4};
    for (size_t k = 0; k < sizeof ORDER / sizeof ORDER[0]; k++)
        for (size_t i = 0; i < p->n_options; i++) {
            const engine_plan_option *o = &p->options[i];
            if (o->quant == ORDER[k] && (resident ? o->fits_resident : o->fits))
                return o;
        }
    return NULL;
}

/* What streams in a state, in a few words ("5 layers", "the embeddings", "every layer and the output head"). */
static const char *moved_words(int k, bool emb_host, bool head_streamed, char *buf, size_t n)
{
    if (head_streamed)
        snprintf(buf, n, "every layer and the output head");
    else if (k > 0)
        snprintf(buf, n, "%d layer%s", k, k == 1 ? "" : "s");
    else
        snprintf(buf, n, "%s", emb_host ? "the embeddings" : "nothing");
    return buf;
}

/*
 * The KV clause of a fitting plan: its type, the bound with the cache
 * full, and for AUTO the way not taken (the type it would have had, what
 * would have streamed and that bound).
 */
static int kv_clause(const engine_plan *p, char *s, size_t n)
{
    const engine_plan_totals *t = &p->totals;
    int len = snprintf(s, n, "; %s KV cache, decode bound %.1f tok/s with all %d tokens in it",
                       engine_kv_type_name(t->kv_type), t->full_ctx_tokens_per_second, t->n_ctx);
    if (p->alt_kv == ENGINE_KV_AUTO || len < 0 || (size_t)len >= n)
        return len;
    char w[64];
    moved_words(p->alt_k, p->alt_emb_host, p->alt_head_streamed, w, sizeof w);
    if (!p->alt_fits)
        return len + snprintf(s + len, n - (size_t)len, " (chosen over %s KV, which does not fit)",
                              engine_kv_type_name(p->alt_kv));
    if (p->alt_k == 0 && !p->alt_head_streamed && p->alt_x_host > 0)
        return len + snprintf(s + len, n - (size_t)len,
                              " (chosen over %s KV, which would keep %d experts in host memory: %.1f tok/s)",
                              engine_kv_type_name(p->alt_kv), p->alt_x_host, p->alt_full_tps);
    return len + snprintf(s + len, n - (size_t)len, " (chosen over %s KV, which would stream %s: %.1f tok/s)",
                          engine_kv_type_name(p->alt_kv), w, p->alt_full_tps);
}

/* When refused: the longest context each KV type fits, for the types this model can use. */
static int ctx_clause(const engine_plan_totals *t, bool f32_model, char *s, size_t n)
{
    const int *by = t->max_ctx_by_kv;
    if (by[ENGINE_KV_AUTO] == 0)
        return snprintf(s, n, "; no context fits with any KV type");
    char f32[48] = "";
    if (f32_model || t->kv_type == ENGINE_KV_F32)
        snprintf(f32, sizeof f32, "%d tokens with f32 KV, ", by[ENGINE_KV_F32]);
    return snprintf(s, n, "; the longest context that fits: %s%d%s with f16 or bf16 KV, %d with int8 or fp8 (--kv)",
                    f32, by[ENGINE_KV_F16], f32[0] ? "" : " tokens", by[ENGINE_KV_INT8]);
}

void plan_write_summary(engine_plan *p, const plan_placed *chosen, const plan_placed *least, bool f32_model)
{
    const engine_plan_totals *t = &p->totals;
    char hb[8][32];
    char *s = p->summary;
    const size_t n = sizeof p->summary;
    if (!t->fits) {
        /* The least: everything streamed, or expert layers resident with their experts in host memory. */
        char in_flight[96];
        if (least->k == 0 && !least->head_streamed && least->x_host > 0)
            snprintf(in_flight, sizeof in_flight, "%d experts in host memory, 2 stream buffers of %s each",
                     least->x_host, H(1, least->slots / 2));
        else
            snprintf(in_flight, sizeof in_flight, "2 layers in flight %s each", H(1, least->slots / 2));
        int len = snprintf(s, n,
                           "needs at least %s of device memory (%s, %s KV cache %s at --ctx "
                           "%d, activations and scratch %s, CUDA context %s) but the budget is %s",
                           H(0, t->minimum), in_flight, engine_kv_type_name(t->kv_type), H(2, t->kv_cache),
                           t->n_ctx, H(3, t->activations), H(4, t->cuda_context), H(5, t->budget));
        const engine_plan_option *o = suggest(p, false);
        if (len > 0 && (size_t)len < n && t->max_ctx_that_fits > 0)
            len += snprintf(s + len, n - (size_t)len, "; it fits with --ctx %d", t->max_ctx_that_fits);
        if (len > 0 && (size_t)len < n && o)
            len += snprintf(s + len, n - (size_t)len, "%s--quant %s (at least %s)",
                            t->max_ctx_that_fits > 0 ? " or with " : "; it fits with ", o->name, H(6, o->minimum));
        const engine_plan_option *nf4 = NULL;
        for (size_t i = 0; i < p->n_options; i++)
            if (p->options[i].quant == ENGINE_QUANT_NF4)
                nf4 = &p->options[i];
        if (len > 0 && (size_t)len < n && !o && t->max_ctx_that_fits == 0)
            len += snprintf(s + len, n - (size_t)len, "; no shorter context or quantized format makes it fit");
        if (len > 0 && (size_t)len < n && !o && nf4)
            len += snprintf(s + len, n - (size_t)len, " (--quant nf4 needs at least %s)", H(7, nf4->minimum));
        if (len > 0 && (size_t)len < n)
            ctx_clause(t, f32_model, s + len, n - (size_t)len);
        return;
    }
    if (chosen->k == 0 && !chosen->emb_host && !chosen->head_streamed && chosen->x_host == 0) {
        const int len = snprintf(s, n, "all resident: %s of the %s budget, %s free; decode bound %.1f tok/s",
                                 H(0, t->device_total), H(1, t->budget), H(2, t->free_bytes), t->tokens_per_second);
        if (len > 0 && (size_t)len < n)
            kv_clause(p, s + len, n - (size_t)len);
        return;
    }
    char hosted[96] = "", experts[96] = "";
    if (t->n_layers_host > 0)
        snprintf(hosted, sizeof hosted, " (%d of them computed on the CPU for decode at %.1f GB/s)",
                 t->n_layers_host, t->host_gbps);
    if (t->n_experts_host > 0)
        snprintf(experts, sizeof experts, ", %d of the %d experts in host memory", t->n_experts_host,
                 t->n_experts_host + t->n_experts_resident);
    int len;
    if (chosen->k == 0 && !chosen->head_streamed && chosen->x_host > 0) { /* experts (and maybe the embeddings) */
        char cpu[64] = "priced at the PCIe rate, the CPU's own not measured";
        if (t->experts_host_gpu)
            snprintf(cpu, sizeof cpu, "at %.1f GB/s", t->pcie_gbps);
        else if (t->host_gbps > 0)
            snprintf(cpu, sizeof cpu, "at %.1f GB/s", t->host_gbps);
        len = snprintf(s, n, "keeps %d of %d experts resident, %d in host memory%s: %s a token's picks "
                             "among them%s for decode (%s a token, %s), prompts stream them; decode bound %.1f tok/s "
                             "(all resident: %.1f tok/s in %s)",
                       t->n_experts_resident, t->n_experts_resident + t->n_experts_host, t->n_experts_host,
                       chosen->emb_host ? ", embeddings on the host" : "",
                       t->experts_host_gpu ? "the GPU reads" : "the CPU runs", t->experts_host_gpu ? " over PCIe" : "",
                       H(0, t->experts_host_gpu ? t->streamed_per_token : t->host_per_token), cpu,
                       t->tokens_per_second, t->resident_tokens_per_second, H(1, t->all_resident));
    } else {
        len = snprintf(s, n, "streams %d of %d layers%s%s%s%s: %s per token over PCIe, decode bound %.1f tok/s "
                             "(all resident: %.1f tok/s in %s)",
                       t->n_layers_streamed, t->n_layers, hosted, chosen->head_streamed ? " and the output head" : "",
                       chosen->emb_host ? ", embeddings on the host" : "", experts, H(0, t->streamed_per_token),
                       t->tokens_per_second, t->resident_tokens_per_second, H(1, t->all_resident));
    }
    const engine_plan_option *o = suggest(p, true);
    if (o && len > 0 && (size_t)len < n)
        len += snprintf(s + len, n - (size_t)len,
                        "; --quant %s would keep it all resident (%s, decode bound %.1f tok/s)", o->name,
                        H(2, o->all_resident), o->tokens_per_second);
    if (len > 0 && (size_t)len < n)
        kv_clause(p, s + len, n - (size_t)len);
}
