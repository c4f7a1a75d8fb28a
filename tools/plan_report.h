/*
 * plan_report.h: the offload plan as infer prints it (--dry-run, --report):
 * one row per part (embeddings, each layer, output head), the totals
 * against the budget and the speed bounds, as text or as one JSON object.
 * Only include/engine.h is used.
 */
#ifndef ENGINE_PLAN_REPORT_H
#define ENGINE_PLAN_REPORT_H

#include <stdio.h>
#include <string.h>

#include "cli_util.h"
#include "engine.h"

static inline const char *report_part(const engine_plan_entry *r, char *buf, size_t n)
{
    if (r->part == ENGINE_PLAN_LAYER)
        snprintf(buf, n, "layer %d", r->layer);
    else
        snprintf(buf, n, "%s", r->part == ENGINE_PLAN_EMBEDDINGS ? "embeddings" : "output");
    return buf;
}

static inline const char *report_place(engine_placement p)
{
    return p == ENGINE_PLACE_STREAMED ? "streamed" : p == ENGINE_PLACE_HOST ? "host" : "resident";
}

/* Where a bandwidth came from, in words (gpu: the table's card). */
static inline const char *report_source(engine_figure_source s, const char *gpu, char *buf, size_t n)
{
    switch (s) {
    case ENGINE_FIGURE_MEASURED: snprintf(buf, n, "measured on this device"); break;
    case ENGINE_FIGURE_TABLE: snprintf(buf, n, "from the table: %s", gpu && *gpu ? gpu : "?"); break;
    case ENGINE_FIGURE_GIVEN: snprintf(buf, n, "given on the command line"); break;
    default: snprintf(buf, n, "the built-in default, an H100's"); break;
    }
    return buf;
}

/* The same as one word, for JSON. */
static inline const char *report_source_key(engine_figure_source s)
{
    return s == ENGINE_FIGURE_MEASURED ? "measured" : s == ENGINE_FIGURE_TABLE ? "table"
                                                   : s == ENGINE_FIGURE_GIVEN ? "given" : "default";
}

/*
 * An expert layer's routed experts a decoded token reads, on the device
 * and on the CPU: k of them (n_used), the share of the resident ones on
 * the device, the rest on the CPU where the layer is resident; all with
 * the layer otherwise (a streamed one on the device once copied, a hosted
 * one on the CPU). As the planner counts them (engine/plan.c).
 */
static inline void report_expert_reads(const engine_plan_entry *r, int n_used, uint64_t *dev, uint64_t *cpu)
{
    *dev = *cpu = 0;
    if (r->n_experts <= 0)
        return;
    const uint64_t picked = r->expert_bytes * (uint64_t)n_used, E = (uint64_t)r->n_experts;
    if (r->placement == ENGINE_PLACE_HOST)
        *cpu = picked;
    else if (r->placement == ENGINE_PLACE_STREAMED)
        *dev = picked;
    else {
        *cpu = picked * (E - (uint64_t)r->experts_resident) / E;
        *dev = picked - *cpu;
    }
}

/* The longest context the budget holds with each KV type (bf16 has f16's bytes, fp8 int8's). */
static inline void report_longest_ctx(FILE *f, const engine_plan_totals *t)
{
    const int *by = t->max_ctx_by_kv;
    fprintf(f, "  longest context in this budget: %d tokens with f32 KV, %d with f16 or bf16, %d with int8 or fp8\n",
            by[ENGINE_KV_F32], by[ENGINE_KV_F16], by[ENGINE_KV_INT8]);
}

static inline void plan_print_text(FILE *f, const engine_plan *plan, const char *model)
{
    const engine_plan_totals *t = engine_plan_get_totals(plan);
    char a[32], b[32], c[32], d[32];
    fprintf(f, "plan for %s%s%s%s: %d layers, context %d tokens, budget %s\n", model, t->gpu_name[0] ? " (GPU: " : "",
            t->gpu_name, t->gpu_name[0] ? ")" : "", t->n_layers, t->n_ctx, engine_format_bytes(t->budget, a, sizeof a));
    /* An MoE model's rows add its experts: on the device / in host memory, and what a token's picks read of
     * them on the device / in host memory (on the CPU, or read by the GPU over PCIe: experts_host_gpu). */
    const int moe = t->n_expert_layers > 0;
    fprintf(f, "  %-12s %-10s %12s  %-9s %12s %14s", "part", "format", "weights", "placement", "KV cache",
            "moved/token");
    fprintf(f, moe ? "  %16s  %23s\n" : "\n", "experts dev/host", "top-k read: device/host");
    for (size_t i = 0; i < engine_plan_n_entries(plan); i++) {
        const engine_plan_entry *r = engine_plan_entry_at(plan, i);
        fprintf(f, "  %-12s %-10s %12s  %-9s %12s %14s", report_part(r, a, sizeof a), r->format,
                engine_format_bytes(r->weight_bytes, b, sizeof b), report_place(r->placement),
                r->part == ENGINE_PLAN_LAYER ? engine_format_bytes(r->kv_bytes, c, sizeof c) : "-",
                engine_format_bytes(r->bytes_per_token, d, sizeof d));
        if (!moe || r->n_experts <= 0) {
            fprintf(f, moe ? "  %16s  %23s\n" : "\n", "-", "-");
            continue;
        }
        char counts[32], reads[64];
        uint64_t dev, cpu;
        report_expert_reads(r, t->n_experts_used, &dev, &cpu);
        snprintf(counts, sizeof counts, "%d/%d", r->experts_resident, r->n_experts - r->experts_resident);
        snprintf(reads, sizeof reads, "%s/%s", engine_format_bytes(dev, b, sizeof b),
                 engine_format_bytes(cpu, c, sizeof c));
        fprintf(f, "  %16s  %23s\n", counts, reads);
    }
    fprintf(f, "  weights resident   %12s\n", engine_format_bytes(t->weights_resident, a, sizeof a));
    fprintf(f, "  stream buffers     %12s  (streamed weights in host memory: %s)\n",
            engine_format_bytes(t->stream_buffers, a, sizeof a), engine_format_bytes(t->weights_streamed, b, sizeof b));
    const uint64_t kv_row = t->n_layers > 0 ? t->kv_bytes_per_token / (uint64_t)t->n_layers : 0;
    if (t->kv_ring_rows > 0) { /* the window layers' rings, then the layers that keep every position */
        const int full = t->n_layers - t->kv_window_layers;
        fprintf(f, "  KV cache           %12s  (%s%s: a token takes %s, %s a layer; %d window layer%s a ring of %d "
                   "positions, %s each",
                engine_format_bytes(t->kv_cache, a, sizeof a), engine_kv_type_name(t->kv_type),
                t->kv_auto ? ", chosen by --kv auto" : "", engine_format_bytes(t->kv_bytes_per_token, b, sizeof b),
                engine_format_bytes(kv_row, c, sizeof c), t->kv_window_layers, t->kv_window_layers == 1 ? "," : "s,",
                t->kv_ring_rows, engine_format_bytes((uint64_t)t->kv_ring_rows * kv_row, d, sizeof d));
        if (full > 0)
            fprintf(f, "; %d layer%s of all %d, %s each", full, full == 1 ? "" : "s", t->n_ctx,
                    engine_format_bytes((uint64_t)t->n_ctx * kv_row, d, sizeof d));
        fprintf(f, ")\n");
    } else {
        fprintf(f, "  KV cache           %12s  (%s%s: %s a layer; a token takes %s, %s a layer)\n",
                engine_format_bytes(t->kv_cache, a, sizeof a), engine_kv_type_name(t->kv_type),
                t->kv_auto ? ", chosen by --kv auto" : "",
                engine_format_bytes(t->n_layers > 0 ? t->kv_cache / (uint64_t)t->n_layers : 0, b, sizeof b),
                engine_format_bytes(t->kv_bytes_per_token, c, sizeof c), engine_format_bytes(kv_row, d, sizeof d));
    }
    fprintf(f, "  activations        %12s  (buffers, scratch, cuBLASLt workspace)\n",
            engine_format_bytes(t->activations, a, sizeof a));
    if (t->expert_cache > 0)
        fprintf(f, "  expert cache       %12s  (the most picked of the experts in host memory)\n",
                engine_format_bytes(t->expert_cache, a, sizeof a));
    fprintf(f, "  CUDA context       %12s\n", engine_format_bytes(t->cuda_context, a, sizeof a));
    fprintf(f, "  total              %12s  of %s (2 MiB allocation units), %s free\n",
            engine_format_bytes(t->device_total, a, sizeof a), engine_format_bytes(t->budget, b, sizeof b),
            engine_format_bytes(t->free_bytes, c, sizeof c));
    fprintf(f, "  minimum %s (%s), all resident %s\n", engine_format_bytes(t->minimum, a, sizeof a),
            moe ? "everything streamed, or every expert in host memory where that takes less" : "everything streamed",
            engine_format_bytes(t->all_resident, b, sizeof b));
    if (t->n_layers_host > 0)
        fprintf(f, "  host: %d layers (%s a token) computed by the CPU for decode at %.1f GB/s while the others "
                   "stream; prompts stream them too\n",
                t->n_layers_host, engine_format_bytes(t->host_per_token, a, sizeof a), t->host_gbps);
    if (moe) {
        uint64_t dev = 0, cpu = 0;
        for (size_t i = 0; i < engine_plan_n_entries(plan); i++) {
            uint64_t dv, cv;
            report_expert_reads(engine_plan_entry_at(plan, i), t->n_experts_used, &dv, &cv);
            dev += dv, cpu += cv;
        }
        char on_host[128] = "";
        if (cpu > 0 && t->experts_host_gpu)
            snprintf(on_host, sizeof on_host, ", %s in host memory, read by the GPU over PCIe at %.1f GB/s",
                     engine_format_bytes(cpu, b, sizeof b), t->pcie_gbps);
        else if (cpu > 0 && t->host_gbps > 0)
            snprintf(on_host, sizeof on_host, ", %s on the CPU at %.1f GB/s", engine_format_bytes(cpu, b, sizeof b),
                     t->host_gbps);
        else if (cpu > 0)
            snprintf(on_host, sizeof on_host, ", %s on the CPU (priced at the PCIe rate, the CPU's own not measured)",
                     engine_format_bytes(cpu, b, sizeof b));
        fprintf(f, "  experts: %d layer%s of %d, %d run a token: %d on the device, %d in host memory (%s "
                   "a token's picks there for decode, prompts stream them; a streamed layer moves all its own); a "
                   "token's picks read %s on the device%s\n",
                t->n_expert_layers, t->n_expert_layers == 1 ? "" : "s", t->n_experts, t->n_experts_used,
                t->n_experts_resident, t->n_experts_host,
                t->experts_host_gpu ? "the GPU reads over PCIe" : "the CPU runs", engine_format_bytes(dev, a, sizeof a),
                on_host);
    }
    char on_cpu[64] = "";
    if (t->host_per_token > 0)
        snprintf(on_cpu, sizeof on_cpu, ", %s read by the CPU", engine_format_bytes(t->host_per_token, c, sizeof c));
    fprintf(f, "  per token: %s streamed, %s read on the device%s; decode bound %.1f tok/s at %.1f GB/s PCIe, "
               "%.0f GB/s device memory (all resident: %.1f tok/s)\n",
            engine_format_bytes(t->streamed_per_token, a, sizeof a),
            engine_format_bytes(t->read_per_token, b, sizeof b), on_cpu,
            t->tokens_per_second, t->pcie_gbps, t->hbm_gbps, t->resident_tokens_per_second);
    if (t->fits)
        fprintf(f, "  at full context (%d tokens): %s of weights and the whole %s KV cache read per token, decode "
                   "bound %.1f tok/s\n",
                t->n_ctx, engine_format_bytes(t->read_per_token, a, sizeof a),
                engine_format_bytes(t->kv_cache, b, sizeof b), t->full_ctx_tokens_per_second);
    report_longest_ctx(f, t);
    char sa[96], sb[96];
    fprintf(f, "  bandwidths: device memory %.1f GB/s (%s), host to device %.1f GB/s (%s)\n", t->hbm_gbps,
            report_source(t->hbm_source, t->gpu_name, sa, sizeof sa), t->pcie_gbps,
            report_source(t->pcie_source, t->gpu_name, sb, sizeof sb));
    if (t->n_layers_host > 0 && t->shared_gbps > 0)
        fprintf(f, "  host memory: copies and the CPU read it at %.1f GB/s together; the bound counts it\n",
                t->shared_gbps);
    else if (t->n_layers_host > 0)
        fprintf(f, "  host memory: copies and the CPU share it; not measured, so the bound leaves it out and is "
                   "high\n");
    for (size_t i = 0; i < engine_plan_n_options(plan); i++) {
        const engine_plan_option *o = engine_plan_option_at(plan, i);
        fprintf(f, "  --quant %-9s weights %10s, all resident %10s%s, minimum %10s%s", o->name,
                engine_format_bytes(o->weight_bytes, a, sizeof a), engine_format_bytes(o->all_resident, b, sizeof b),
                o->fits_resident ? " (fits)" : "", engine_format_bytes(o->minimum, c, sizeof c),
                o->fits ? "" : " (over the budget)");
        if (o->fits)
            fprintf(f, ", decode bound %.1f tok/s", o->tokens_per_second);
        fputc('\n', f);
    }
    fprintf(f, "%s\n", engine_plan_summary(plan));
}

static inline void plan_print_json(FILE *f, const engine_plan *plan, const char *model)
{
    const engine_plan_totals *t = engine_plan_get_totals(plan);
    fprintf(f, "{\"model\":");
    cli_json_string(f, model, strlen(model));
    fprintf(f, ",\"fits\":%s,\"budget\":%llu,\"n_ctx\":%d,\"n_layers\":%d,\"n_layers_streamed\":%d,"
               "\"n_layers_host\":%d,\"entries\":[",
            t->fits ? "true" : "false", (unsigned long long)t->budget, t->n_ctx, t->n_layers, t->n_layers_streamed,
            t->n_layers_host);
    for (size_t i = 0; i < engine_plan_n_entries(plan); i++) {
        const engine_plan_entry *r = engine_plan_entry_at(plan, i);
        static const char *const PARTS[] = {"embeddings", "layer", "output"};
        fprintf(f,
                "%s{\"part\":\"%s\",\"layer\":%d,\"format\":\"%s\",\"weight_bytes\":%llu,\"placement\":\"%s\","
                "\"kv_bytes\":%llu,\"bytes_per_token\":%llu,\"n_experts\":%d,\"experts_resident\":%d,"
                "\"expert_bytes\":%llu}",
                i ? "," : "", PARTS[r->part], r->layer, r->format, (unsigned long long)r->weight_bytes,
                report_place(r->placement), (unsigned long long)r->kv_bytes, (unsigned long long)r->bytes_per_token,
                r->n_experts, r->experts_resident, (unsigned long long)r->expert_bytes);
    }
    fprintf(f,
            "],\"totals\":{\"weights_resident\":%llu,\"weights_streamed\":%llu,\"stream_buffers\":%llu,"
            "\"kv_cache\":%llu,\"activations\":%llu,\"cuda_context\":%llu,\"device_total\":%llu,\"free\":%llu,"
            "\"minimum\":%llu,\"all_resident\":%llu,\"read_per_token\":%llu,\"streamed_per_token\":%llu,"
            "\"tokens_per_second\":%.3f,\"resident_tokens_per_second\":%.3f,\"max_ctx_that_fits\":%d,"
            "\"hbm_gbps\":%.2f,\"pcie_gbps\":%.2f,\"host_gbps\":%.2f,\"host_per_token\":%llu,\"hbm_source\":\"%s\","
            "\"pcie_source\":\"%s\",\"shared_gbps\":%.2f,\"kv_type\":\"%s\",\"kv_auto\":%s,"
            "\"kv_bytes_per_token\":%llu,\"full_ctx_tokens_per_second\":%.3f,\"n_batch\":%d,"
            "\"kv_window_layers\":%d,\"kv_ring_rows\":%d,\"n_expert_layers\":%d,\"n_experts\":%d,"
            "\"n_experts_used\":%d,\"n_experts_resident\":%d,\"n_experts_host\":%d,\"experts_host_gpu\":%s,\"expert_cache\":%llu,"
            "\"max_ctx_by_kv\":{\"f32\":%d,\"f16\":%d,\"bf16\":%d,\"int8\":%d,\"fp8\":%d},\"gpu\":",
            (unsigned long long)t->weights_resident, (unsigned long long)t->weights_streamed,
            (unsigned long long)t->stream_buffers, (unsigned long long)t->kv_cache,
            (unsigned long long)t->activations, (unsigned long long)t->cuda_context,
            (unsigned long long)t->device_total, (unsigned long long)t->free_bytes, (unsigned long long)t->minimum,
            (unsigned long long)t->all_resident, (unsigned long long)t->read_per_token,
            (unsigned long long)t->streamed_per_token, t->tokens_per_second, t->resident_tokens_per_second,
            t->max_ctx_that_fits, t->hbm_gbps, t->pcie_gbps, t->host_gbps, (unsigned long long)t->host_per_token,
            report_source_key(t->hbm_source), report_source_key(t->pcie_source), t->shared_gbps,
            engine_kv_type_name(t->kv_type), t->kv_auto ? "true" : "false", (unsigned long long)t->kv_bytes_per_token,
            t->full_ctx_tokens_per_second, t->n_batch, t->kv_window_layers, t->kv_ring_rows, t->n_expert_layers,
            t->n_experts, t->n_experts_used, t->n_experts_resident, t->n_experts_host,
            t->experts_host_gpu ? "true" : "false", (unsigned long long)t->expert_cache, t->max_ctx_by_kv[ENGINE_KV_F32],
            t->max_ctx_by_kv[ENGINE_KV_F16], t->max_ctx_by_kv[ENGINE_KV_BF16], t->max_ctx_by_kv[ENGINE_KV_INT8],
            t->max_ctx_by_kv[ENGINE_KV_FP8]);
    cli_json_string(f, t->gpu_name, strlen(t->gpu_name));
    fprintf(f, "},\"options\":[");
    for (size_t i = 0; i < engine_plan_n_options(plan); i++) {
        const engine_plan_option *o = engine_plan_option_at(plan, i);
        fprintf(f,
                "%s{\"quant\":\"%s\",\"weight_bytes\":%llu,\"minimum\":%llu,\"all_resident\":%llu,\"fits\":%s,"
                "\"fits_resident\":%s,\"tokens_per_second\":%.3f}",
                i ? "," : "", o->name, (unsigned long long)o->weight_bytes, (unsigned long long)o->minimum,
                (unsigned long long)o->all_resident, o->fits ? "true" : "false", o->fits_resident ? "true" : "false",
                o->tokens_per_second);
    }
    const char *s = engine_plan_summary(plan);
    fprintf(f, "],\"summary\":");
    cli_json_string(f, s, strlen(s));
    fprintf(f, "}\n");
}

/* One pass kind's measured figures, on one line. */
static inline void offload_print_times(FILE *f, const char *name, const engine_offload_times *t, double pcie_gbps)
{
    if (t->passes == 0) {
        fprintf(f, "  %-8s not measured\n", name);
        return;
    }
    const double per = t->tokens > 0 ? 1.0 / t->passes : 0.0;
    const double gbps = t->copy_seconds > 0 ? t->bytes_copied / t->copy_seconds / 1e9 : 0.0;
    const double bound = t->bytes_copied > 0 ? pcie_gbps * 1e9 * t->passes / t->bytes_copied : 0.0;
    fprintf(f, "  %-8s %d pass%s, %d tokens: %.1f ms a pass; copies %.1f ms (%.1f GB/s), compute %.1f ms, "
               "overlap %.1f ms (%.0f%% of the copy time hidden behind compute)",
            name, t->passes, t->passes == 1 ? "" : "es", t->tokens, t->wall_seconds * per * 1e3,
            t->copy_seconds * per * 1e3, gbps, t->compute_seconds * per * 1e3, t->overlap_seconds * per * 1e3,
            t->copy_seconds > 0 ? 100.0 * t->overlap_seconds / t->copy_seconds : 0.0);
    if (t->host_seconds > 0)
        fprintf(f, "; the CPU's layers %.1f ms", t->host_seconds * per * 1e3);
    if (bound > 0 && t->wall_seconds > 0)
        fprintf(f, "; %.1f passes/s, %.0f%% of the %.1f passes/s its streamed bytes allow at %.1f GB/s",
                t->passes / t->wall_seconds, 100.0 * (t->passes / t->wall_seconds) / bound, bound, pcie_gbps);
    fputc('\n', f);
}

/* engine_session_offload's report as text (after generating). */
static inline void offload_print_text(FILE *f, const engine_offload_report *r, double pcie_gbps)
{
    char a[32], b[32], c[32], d[32];
    char hosted[64] = "";
    if (r->n_layers_host > 0)
        snprintf(hosted, sizeof hosted, " (%d of them computed by the CPU for decode)", r->n_layers_host);
    fprintf(f, "offload measured: %d of %d layers streamed%s%s, %s a token, stream buffers %s, host memory pinned %s, "
               "CUDA context reserve %s\n",
            r->n_layers_streamed, r->n_layers, hosted, r->embeddings_on_host ? " (embeddings on the host)" : "",
            engine_format_bytes(r->bytes_per_token, a, sizeof a), engine_format_bytes(r->stream_buffers, b, sizeof b),
            engine_format_bytes(r->host_pinned, c, sizeof c), engine_format_bytes(r->device_reserve, d, sizeof d));
    if (r->expert_cache_slots > 0) {
        const uint64_t all = r->expert_cache_hits + r->expert_cache_misses;
        fprintf(f, "expert cache: %d experts in %s, %llu of %llu picks of experts in host memory found theirs there "
                   "(%.1f%%)\n",
                r->expert_cache_slots, engine_format_bytes(r->expert_cache_bytes, a, sizeof a),
                (unsigned long long)r->expert_cache_hits, (unsigned long long)all,
                all ? 100.0 * (double)r->expert_cache_hits / (double)all : 0.0);
    }
    if (r->n_layers_streamed == 0)
        return;
    offload_print_times(f, "prefill", &r->prefill, pcie_gbps);
    offload_print_times(f, "decode", &r->decode, pcie_gbps);
}

static inline void offload_json_times(FILE *f, const char *name, const engine_offload_times *t)
{
    fprintf(f,
            "\"%s\":{\"passes\":%d,\"tokens\":%d,\"wall_seconds\":%.6f,\"copy_seconds\":%.6f,"
            "\"compute_seconds\":%.6f,\"overlap_seconds\":%.6f,\"bytes_copied\":%llu,\"host_seconds\":%.6f}",
            name, t->passes, t->tokens, t->wall_seconds, t->copy_seconds, t->compute_seconds, t->overlap_seconds,
            (unsigned long long)t->bytes_copied, t->host_seconds);
}

/* The same as one JSON object (no newline). */
static inline void offload_print_json(FILE *f, const engine_offload_report *r)
{
    fprintf(f,
            "{\"n_layers\":%d,\"n_layers_streamed\":%d,\"n_layers_host\":%d,\"embeddings_on_host\":%s,"
            "\"bytes_per_token\":%llu,\"stream_buffers\":%llu,\"host_pinned\":%llu,\"device_reserve\":%llu,",
            r->n_layers, r->n_layers_streamed, r->n_layers_host, r->embeddings_on_host ? "true" : "false",
            (unsigned long long)r->bytes_per_token, (unsigned long long)r->stream_buffers,
            (unsigned long long)r->host_pinned, (unsigned long long)r->device_reserve);
    offload_json_times(f, "prefill", &r->prefill);
    fputc(',', f);
    offload_json_times(f, "decode", &r->decode);
    fprintf(f, ",\"expert_cache\":{\"slots\":%d,\"bytes\":%llu,\"hits\":%llu,\"misses\":%llu}}",
            r->expert_cache_slots, (unsigned long long)r->expert_cache_bytes, (unsigned long long)r->expert_cache_hits,
            (unsigned long long)r->expert_cache_misses);
}

#endif
