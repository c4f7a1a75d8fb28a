/*
 * bench.c: prefill and decode speed of one model through libengine, warmed
 * up and repeated, with the figures its bounds need.
 *
 *   bench MODEL [--device cpu|cuda] [--prompt N] [--gen N] [--reps N] [--threads N] [--ctx N] [--vram SIZE] [--quant TYPE] [--quant-head TYPE] [--stream-layers N] [--host-layers N] [--moe-cpu N] [--moe-host auto|cpu|gpu] [--expert-cache SIZE] [--kv TYPE] [--trace FILE.json] [--trace-svg FILE.svg]
 *
 * Each repetition evaluates an N-token prompt of fixed pseudo-random ids in
 * one call (prefill), then generates --gen tokens greedily (decode), so
 * decode reads a KV cache N to N + gen deep (--prompt 1 --gen 128 is
 * llama-bench's tg128 shape, 128 tokens from an empty cache); --ctx N
 * sizes the session for N positions (default and least: prompt + gen); the
 * first repetition warms up (graph capture, cuBLASLt plans) and is not
 * counted. Prints a table row per repetition and one JSON line with the
 * medians, the bytes each decoded token reads (weights less the embedding
 * table, of which one row is read; plus the KV cache at the mean position)
 * and the device memory report. --trace FILE.json records the load and every
 * repetition's passes (warm-up included) as a Chrome trace-event file
 * (infer --help); it makes each pass a little slower (docs/API.md, Trace).
 * --trace-svg FILE.svg draws that trace as an SVG timeline (tools/trace_svg.h).
 */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tools/cli_util.h"
#include "../tools/plan_report.h"
#include "../tools/trace_out.h"
#include "engine.h"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void log_cb(engine_log_level level, const char *msg, void *user)
{
    (void)user;
    if (level <= ENGINE_LOG_INFO)
        fprintf(stderr, "bench: %s\n", msg);
}

int main(int argc, char **argv)
{
    const char *path = NULL;
    int n_prompt = 512, n_gen = 128, reps = 3, show_ids = 0, n_ctx = 0;
    engine_model_params mp = engine_model_default_params();
    mp.log = log_cb;
    trace_out trace = {NULL, NULL};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long l = 0;
        if (!strcmp(a, "--device") && v) {
            mp.device = !strcmp(v, "cpu") ? ENGINE_DEVICE_CPU : !strcmp(v, "cuda") ? ENGINE_DEVICE_CUDA
                                                                                   : ENGINE_DEVICE_AUTO;
            i++;
        } else if (!strcmp(a, "--prompt") && v && !cli_parse_long(v, 1, 1 << 20, &l)) {
            n_prompt = (int)l;
            i++;
        } else if (!strcmp(a, "--gen") && v && !cli_parse_long(v, 2, 1 << 20, &l)) {
            n_gen = (int)l;
            i++;
        } else if (!strcmp(a, "--ctx") && v && !cli_parse_long(v, 1, 1 << 22, &l)) {
            n_ctx = (int)l;
            i++;
        } else if (!strcmp(a, "--threads") && v && !cli_parse_long(v, 1, 4096, &l)) {
            mp.n_threads = (int)l; /* the CPU's threads (on CUDA, hosted work takes one fewer) */
            i++;
        } else if (!strcmp(a, "--reps") && v && !cli_parse_long(v, 1, 1000, &l)) {
            reps = (int)l;
            i++;
        } else if (!strcmp(a, "--expert-cache") && v && !cli_parse_size(v, &mp.expert_cache)) {
            i++;
        } else if (!strcmp(a, "--vram") && v && !cli_parse_size(v, &mp.vram_budget)) {
            i++;
        } else if (!strcmp(a, "--quant") && v && !cli_parse_quant(v, &mp.quant)) {
            i++;
        } else if (!strcmp(a, "--quant-head") && v && !cli_parse_quant(v, &mp.quant_head)) {
            i++;
        } else if (!strcmp(a, "--stream-layers") && v && !cli_parse_long(v, 0, 1 << 20, &l)) {
            mp.min_layers_streamed = (int)l;
            i++;
        } else if (!strcmp(a, "--host-layers") && v && !cli_parse_long(v, 0, 1 << 20, &l)) {
            mp.host_layers = (int)l;
            i++;
        } else if (!strcmp(a, "--moe-cpu") && v && !cli_parse_long(v, 0, 1 << 20, &l)) {
            mp.moe_cpu = (int)l;
            i++;
        } else if (!strcmp(a, "--moe-host") && v && (!strcmp(v, "auto") || !strcmp(v, "cpu") || !strcmp(v, "gpu"))) {
            mp.moe_host = !strcmp(v, "cpu") ? ENGINE_MOE_HOST_CPU : !strcmp(v, "gpu") ? ENGINE_MOE_HOST_GPU
                                                                                      : ENGINE_MOE_HOST_AUTO;
            i++;
        } else if (!strcmp(a, "--kv") && v && engine_kv_type_parse(v) >= 0) {
            mp.kv_type = (engine_kv_type)engine_kv_type_parse(v);
            i++;
        } else if (!strcmp(a, "--trace") && v) {
            trace.path = v;
            i++;
        } else if (!strcmp(a, "--trace-svg") && v) {
            trace.svg_path = v;
            i++;
        } else if (!strcmp(a, "--ids")) {
            show_ids = 1;
        } else if (a[0] != '-' && !path) {
            path = a;
        } else {
            fprintf(stderr, "usage: bench MODEL [--device cpu|cuda] [--prompt N] [--gen N] [--reps N] [--threads N] [--ctx N] [--vram SIZE] [--quant TYPE] [--quant-head TYPE] [--stream-layers N] [--host-layers N] [--moe-cpu N] [--moe-host auto|cpu|gpu] [--expert-cache SIZE] [--kv TYPE] [--ids] [--trace FILE.json] [--trace-svg FILE.svg]\n");
            return 2;
        }
    }
    if (!path) {
        fprintf(stderr, "usage: bench MODEL [--device cpu|cuda] [--prompt N] [--gen N] [--reps N] [--threads N] [--ctx N] [--vram SIZE] [--quant TYPE] [--quant-head TYPE] [--stream-layers N] [--host-layers N] [--moe-cpu N] [--moe-host auto|cpu|gpu] [--expert-cache SIZE] [--kv TYPE] [--ids] [--trace FILE.json] [--trace-svg FILE.svg]\n");
        return 2;
    }
    char err[512] = "";
    engine_model *m = NULL;
    if (n_ctx < n_prompt + n_gen)
        n_ctx = n_prompt + n_gen;
    mp.n_ctx = n_ctx; /* the device placement leaves room for this context */
    if (trace_out_open(&trace, "bench"))
        return 1;
    mp.trace = trace.trace;
    if (engine_model_load(path, &mp, &m, err, sizeof err) != ENGINE_OK) {
        fprintf(stderr, "bench: %s\n", err);
        trace_out_close(&trace, "bench");
        return 1;
    }
    engine_model_info info;
    engine_model_get_info(m, &info);
    engine_session_params sp = engine_session_default_params();
    sp.n_ctx = n_ctx;
    engine_session *s = NULL;
    if (engine_session_create(m, &sp, &s, err, sizeof err) != ENGINE_OK) {
        fprintf(stderr, "bench: %s\n", err);
        engine_model_free(m);
        trace_out_close(&trace, "bench");
        return 1;
    }
    int32_t *prompt = malloc((size_t)n_prompt * sizeof *prompt), *out = malloc((size_t)n_gen * sizeof *out);
    uint64_t r = 12345;
    for (int i = 0; i < n_prompt; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        prompt[i] = (int32_t)((r >> 33) % (uint64_t)info.vocab_size);
    }
    double *pre = calloc((size_t)reps, sizeof *pre), *dec = calloc((size_t)reps, sizeof *dec);
    engine_generate_params gp = engine_generate_default_params();
    gp.n_predict = n_gen;
    int rc = 0;
    printf("%-4s %14s %14s\n", "rep", "prefill tok/s", "decode tok/s");
    for (int rep = -1; rep < reps; rep++) {
        engine_session_reset(s);
        engine_generate_stats st;
        size_t n = 0;
        if (engine_generate(s, prompt, (size_t)n_prompt, &gp, out, (size_t)n_gen, &n, &st) != ENGINE_OK) {
            fprintf(stderr, "bench: %s\n", engine_session_last_error(s));
            rc = 1;
            break;
        }
        if (st.n_generated < 2) {
            fprintf(stderr, "bench: generation stopped after %zu tokens\n", st.n_generated);
            rc = 1;
            break;
        }
        if (show_ids && rep == reps - 1) { /* the greedy ids, to compare two builds or paths */
            printf("ids:");
            for (size_t k = 0; k < n; k++)
                printf(" %d", (int)out[k]);
            printf("\n");
        }
        if (rep < 0)
            continue; /* warm-up */
        pre[rep] = st.n_prompt / st.prompt_seconds;
        dec[rep] = (st.n_generated - 1) / st.gen_seconds;
        printf("%-4d %14.1f %14.1f\n", rep, pre[rep], dec[rep]);
    }
    if (rc == 0) {
        engine_memory_report mem;
        engine_session_memory(s, &mem);
        const int on_gpu = info.device == ENGINE_DEVICE_CUDA;
        const double esize = !strcmp(info.weight_dtype, "f32") ? 4.0 : 2.0;
        const double emb = (double)info.vocab_size * info.dim * esize;
        const double weights = on_gpu ? (double)mem.weights_owned : (double)info.weight_bytes;
        /* The cache's bytes a position (K and V of every layer, with int8/fp8's scales) at the mean depth. */
        const double mean_pos = n_prompt + (n_gen - 1) / 2.0;
        const double kv_read = (double)mem.kv_cache / (n_prompt + n_gen) * mean_pos;
        double per_token = weights - (info.tied_embeddings ? 0.0 : emb) + kv_read;
        if (info.n_experts > 0) /* on the CPU: a token's top-k of each layer's experts */
            per_token -= (double)info.expert_bytes * (info.n_experts - info.n_experts_used) / info.n_experts;
        /* An expert model's token reads its top-k experts, not all of them: the plan's figures
         * (the device's bytes, and the host experts' the CPU reads or the GPU over PCIe). */
        const engine_plan *pl = on_gpu ? engine_model_plan(m) : NULL;
        const engine_plan_totals *pt = pl ? engine_plan_get_totals(pl) : NULL;
        if (pt && pt->n_expert_layers > 0)
            per_token = (double)pt->read_per_token + (double)pt->host_per_token + (double)pt->streamed_per_token + kv_read;
        const double p = median(pre, reps), d = median(dec, reps);
        printf("{\"model\":\"%s\",\"device\":\"%s\",\"dtype\":\"%s\",\"head\":\"%s\",\"params\":%llu,\"prompt\":%d,\"gen\":%d,"
               "\"reps\":%d,\"prefill_tok_s\":%.1f,\"decode_tok_s\":%.1f,\"bytes_per_token\":%.0f,"
               "\"achieved_gb_s\":%.1f,\"device_in_use\":%llu,\"device_peak_mapped\":%llu,\"device_budget\":%llu,"
               "\"weights_device\":%llu,\"kv_cache\":%llu,\"activations\":%llu}\n",
               path, on_gpu ? "cuda" : "cpu", info.weight_dtype, info.head_dtype, (unsigned long long)info.n_params, n_prompt, n_gen,
               reps, p, d, per_token, per_token * d / 1e9, (unsigned long long)mem.device_total,
               (unsigned long long)mem.device_peak, (unsigned long long)mem.device_budget,
               (unsigned long long)mem.weights_owned, (unsigned long long)mem.kv_cache,
               (unsigned long long)mem.activations);
        /* An expert model: decode against the plan's bound (its weights at the rates it prices them with). */
        if (pt && pt->n_expert_layers > 0 && pt->tokens_per_second > 0) {
            /* With an expert cache: its picks since load (every repetition's prompts and decode). */
            engine_offload_report oc;
            if (engine_session_offload(s, 0, &oc) != ENGINE_OK)
                memset(&oc, 0, sizeof oc);
            const uint64_t looked = oc.expert_cache_hits + oc.expert_cache_misses;
            printf("{\"experts_resident\":%d,\"experts_host\":%d,\"experts_host_gpu\":%s,\"plan_bound_tok_s\":%.2f,"
                   "\"decode_ratio\":%.3f,\"expert_cache_slots\":%d,\"expert_cache_hits\":%llu,"
                   "\"expert_cache_misses\":%llu,\"expert_cache_hit_rate\":%.3f}\n",
                   pt->n_experts_resident, pt->n_experts_host, pt->experts_host_gpu ? "true" : "false",
                   pt->tokens_per_second, d / pt->tokens_per_second, oc.expert_cache_slots,
                   (unsigned long long)oc.expert_cache_hits, (unsigned long long)oc.expert_cache_misses,
                   looked ? (double)oc.expert_cache_hits / (double)looked : 0.0);
        }
        /* Streamed layers: the measured copy/compute overlap, and decode against the PCIe bound of its bytes. */
        engine_offload_report off;
        if (on_gpu && engine_session_offload(s, 3, &off) == ENGINE_OK && off.n_layers_streamed > 0) {
            const engine_plan_totals *t = engine_plan_get_totals(engine_model_plan(m));
            offload_print_text(stdout, &off, t->pcie_gbps);
            const double bound = 1.0 / (t->read_per_token / (t->hbm_gbps * 1e9) +
                                        off.bytes_per_token / (t->pcie_gbps * 1e9));
            const int passes = (n_prompt + 511) / 512; /* PLAN_CUDA_BATCH tokens a pass, each streams every layer */
            /* A prompt streams the hosted layers too. */
            const double pre_bytes = (double)off.bytes_per_token + (double)t->host_per_token;
            const double pre_bound = n_prompt / (passes * pre_bytes / (t->pcie_gbps * 1e9));
            printf("{\"streamed_layers\":%d,\"host_layers\":%d,\"streamed_bytes_per_token\":%llu,"
                   "\"decode_bound_tok_s\":%.2f,\"decode_ratio\":%.3f,\"plan_bound_tok_s\":%.2f,"
                   "\"prefill_pcie_bound_tok_s\":%.1f,\"prefill_ratio\":%.3f,\"offload\":",
                   off.n_layers_streamed, off.n_layers_host, (unsigned long long)off.bytes_per_token, bound,
                   d / bound, t->tokens_per_second, pre_bound, p / pre_bound);
            offload_print_json(stdout, &off);
            printf("}\n");
        }
    }
    free(pre);
    free(dec);
    free(prompt);
    free(out);
    engine_session_free(s);
    engine_model_free(m);
    if (trace_out_close(&trace, "bench") && rc == 0)
        rc = 1;
    return rc;
}
