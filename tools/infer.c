/*
 * infer: generate text from a Hugging Face checkpoint.
 *
 *   infer MODEL [--prompt TEXT | --prompt-ids 1,2,3 | --file F] [-n N] ...
 *
 * Streams the text as it is generated, then prints a one-line summary on
 * stderr; with --json, prints one JSON object as the last line of stdout
 * instead. A thin client of include/engine.h.
 */
#define _POSIX_C_SOURCE 200809L /* mmap, clock_gettime, PATH_MAX under -std=c11 */

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "chat.h"
#include "cli_util.h"
#include "engine.h"
#include "plan_report.h"
#include "plan_svg.h"
#include "trace_out.h"

static const char USAGE[] =
    "usage: infer MODEL [options]\n"
    "  MODEL                 a .safetensors file (config.json and tokenizer beside it),\n"
    "                        a folder, or a model.safetensors.index.json\n"
    "prompt (one of):\n"
    "  --prompt TEXT         text, tokenized with the model's tokenizer (BOS as its config says)\n"
    "  --prompt-ids 1,2,3    token ids, used as given\n"
    "  --file F              text read from file F ('-' for stdin)\n"
    "                        (no prompt: generation starts from BOS)\n"
    "  --messages FILE.json  a conversation ({\"messages\": [{\"role\", \"content\"}...], \"variables\": {}})\n"
    "                        laid out by the model's chat template; prints the reply\n"
    "  --chat                chat on stdin/stdout, a turn a line (/reset, /exit); --system TEXT\n"
    "  --chat-template FILE  a Jinja chat template instead of the model's\n"
    "generation:\n"
    "  -n, --n-predict N     most tokens to generate (default 128); stops earlier at EOS\n"
    "  --temp T              temperature; 0 = greedy (default 0)\n"
    "  --top-k K             keep the K most likely tokens (default 0 = off)\n"
    "  --top-p P             nucleus sampling (default 1 = off)\n"
    "  --min-p P             drop tokens below P x the top probability (default 0 = off)\n"
    "  --repeat-penalty R    penalise the last --repeat-last-n tokens (default 1 = off)\n"
    "  --repeat-last-n N     window of the penalty (default 64, -1 = whole context)\n"
    "  --seed S              random seed (default: from the clock, printed in the summary)\n"
    "runtime:\n"
    "  --ctx N|max           context length in tokens (default min(model maximum, 4096));\n"
    "                        max: the model's maximum (max_position_embeddings)\n"
    "  --kv TYPE             KV cache type: auto (default), f32, f16, bf16, int8, fp8; auto keeps\n"
    "                        f16 (f32 for f32 models) where everything fits --vram, else int8 or\n"
    "                        streamed weights, whichever decodes faster with the context full\n"
    "  --batch N             most prompt tokens a pass (default CPU 64, CUDA 512): activation\n"
    "                        memory is sized for N, not for the prompt\n"
    "  --threads N           CPU threads (default: all cores)\n"
    "  --device cpu|cuda|auto  where to run (default auto: the GPU when there is one)\n"
    "  --quant TYPE          quantize the layers' weights while loading (no file written):\n"
    "                        int8, int8-g128, nf4, nf4-dq (double-quantized absmax), fp4\n"
    "  --quant-head TYPE     quantize the output head while loading (same types; default: as stored).\n"
    "                        int8 halves the bytes a token reads there (little accuracy lost);\n"
    "                        nf4/nf4-dq quarter them at a visible accuracy cost (README);\n"
    "                        a tied head gets a copy\n"
    "  --vram SIZE           most device memory to use, e.g. 8G, 7.5G, 800M\n"
    "                        (default: the device's free memory less 512 MiB)\n"
    "  --stream-layers N     stream at least N layers from host memory even where they would\n"
    "                        fit (measurements; default 0: what the budget needs; more than\n"
    "                        the model has: the output head and the embeddings too)\n"
    "  --host-layers N       of the streamed layers, let the CPU compute N for each decoded\n"
    "                        token instead of copying them (0: none; default: as many as\n"
    "                        this CPU's measured speed makes fastest)\n"
    "  --moe-cpu N           keep every routed expert of the first N mixture-of-experts layers\n"
    "                        in host memory (decode runs a token's picks among them as\n"
    "                        --moe-host says, prompts stream them), as llama.cpp's\n"
    "                        --n-cpu-moe; default 0: the plan\n"
    "                        keeps as many experts on the GPU as --vram holds, the rest on\n"
    "                        the host; more than the model's expert layers: all of them\n"
    "  --expert-cache SIZE   of --vram, keep SIZE for a cache of the experts the GPU reads from\n"
    "                        host memory, the most and most lately picked (default 0: none)\n"
    "  --moe-host WHO        who runs a token's picks among the experts in host memory for\n"
    "                        decode: gpu (read over PCIe where they lie), cpu, or auto\n"
    "                        (default: the faster at this machine's measured rates)\n"
    "  --dry-run             print where each layer would live under --vram (resident on the\n"
    "                        GPU, streamed from host memory, or computed by the CPU; of an\n"
    "                        expert layer, how many experts on each) and exit;\n"
    "                        needs no GPU (priced with this GPU's bandwidths, measured, when\n"
    "                        there is one)\n"
    "  --gpu NAME            with --dry-run: plan for a known card instead (its memory less\n"
    "                        512 MiB as the default --vram, its bandwidths for the bound);\n"
    "                        e.g. 4090, \"rtx 3060\", t4; --gpu list prints the table\n"
    "  --gpu-bandwidth GBPS  device memory bandwidth to plan with, GB/s (default: measured,\n"
    "                        or the --gpu card's)\n"
    "  --pcie-bandwidth GBPS host-to-device rate to plan with, GB/s (same defaults)\n"
    "  --report              print that plan on stderr before generating, and after it the\n"
    "                        measured copy and compute time of streamed layers and their overlap\n"
    "  --svg FILE.svg        with --dry-run or --report: draw the plan as an SVG picture (the\n"
    "                        budget's parts, the bytes a token moves and the decode bound, each\n"
    "                        layer's placement; after a run that streamed, what it measured)\n"
    "  --trace FILE.json     record where time goes as a Chrome trace-event file for\n"
    "                        ui.perfetto.dev or chrome://tracing: load steps, each prompt pass\n"
    "                        and decode step, the layers inside (CPU; on a GPU, where the\n"
    "                        passes are timed), KV cache and memory counters\n"
    "  --trace-svg FILE.svg  draw that trace as an SVG timeline: every track, the counters,\n"
    "                        one decode step zoomed (with or without --trace; build/trace_svg\n"
    "                        draws a trace written elsewhere)\n"
    "output:\n"
    "  --json                print one JSON object (ids, text, timings; with --dry-run the plan)\n"
    "  -v, --verbose         log what the engine does on stderr\n"
    "  --version, -h/--help\n";

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig)
{
    (void)sig;
    interrupted = 1;
}

typedef struct out_text {
    char *buf;
    size_t len, cap;
    int stream; /* print to stdout as it comes */
} out_text;

static int on_token(int32_t id, const char *text, size_t len, void *user)
{
    (void)id;
    out_text *o = user;
    if (len) {
        if (o->stream) {
            fwrite(text, 1, len, stdout);
            fflush(stdout);
        }
        if (o->len + len + 1 > o->cap) {
            size_t cap = (o->cap ? o->cap * 2 : 1024) + len;
            char *g = realloc(o->buf, cap);
            if (!g)
                return 1;
            o->buf = g;
            o->cap = cap;
        }
        memcpy(o->buf + o->len, text, len);
        o->len += len;
        o->buf[o->len] = '\0';
    }
    return interrupted ? 1 : 0;
}

static void log_to_stderr(engine_log_level level, const char *msg, void *user)
{
    /* Warnings and errors always; the rest with --verbose. */
    if (level > ENGINE_LOG_WARN && !*(const int *)user)
        return;
    static const char *names[] = {"error", "warn", "info", "debug"};
    fprintf(stderr, "infer: %s: %s\n", names[level <= ENGINE_LOG_DEBUG ? level : ENGINE_LOG_DEBUG], msg);
}

static int fail(const char *what, const char *msg)
{
    fprintf(stderr, "infer: %s%s%s\n", what ? what : "", what && msg ? ": " : "", msg ? msg : "");
    return 1;
}

static int bad_arg(const char *opt, const char *val)
{
    fprintf(stderr, "infer: bad value '%s' for %s (see infer --help)\n", val ? val : "", opt);
    return 2;
}

/*
 * The bandwidths a plan is priced with: gpu's (a table row) when given,
 * else this machine's device measured (unless told to stay on the CPU),
 * else the defaults; then what the command line gave.
 */
static void plan_bandwidths(engine_plan_params *pp, const engine_model_params *mp, const engine_gpu_info *gpu)
{
    double dev = 0.0, h2d = 0.0;
    if (gpu) {
        pp->hbm_gbps = gpu->hbm_gbps, pp->pcie_gbps = gpu->pcie_gbps;
        pp->hbm_source = pp->pcie_source = ENGINE_FIGURE_TABLE;
        pp->gpu_name = gpu->name;
    } else if (mp->device != ENGINE_DEVICE_CPU && !(mp->hbm_gbps > 0 && mp->pcie_gbps > 0) &&
               engine_device_bandwidths(mp->vram_budget, &dev, &h2d) == ENGINE_OK) {
        pp->hbm_gbps = dev, pp->pcie_gbps = h2d;
        pp->hbm_source = pp->pcie_source = ENGINE_FIGURE_MEASURED;
    }
    if (mp->hbm_gbps > 0)
        pp->hbm_gbps = mp->hbm_gbps, pp->hbm_source = ENGINE_FIGURE_GIVEN;
    if (mp->pcie_gbps > 0)
        pp->pcie_gbps = mp->pcie_gbps, pp->pcie_source = ENGINE_FIGURE_GIVEN;
}

/* --svg FILE: opened before any work, so that a path that cannot be written fails at once. */
typedef struct svg_out {
    const char *path;
    FILE *f; /* NULL: no --svg, or drawn and closed */
} svg_out;

/* Draw plan (and what a run measured, off) into o's file and close it; 1 with one line on stderr when that fails. */
static int svg_draw(svg_out *o, const engine_plan *plan, const char *model, const engine_offload_report *off)
{
    if (!o || !o->f)
        return 0;
    errno = 0;
    int bad = plan_svg_write(o->f, plan, model, off, NULL) != 0;
    const int err = errno;
    bad |= fclose(o->f) != 0;
    o->f = NULL;
    if (bad)
        fprintf(stderr, "infer: %s: cannot write the SVG: %s\n", o->path, strerror(err ? err : errno ? errno : EIO));
    return bad;
}

/* Nothing drawn (the run stopped first): leave no empty file behind (a regular file only: never /dev/null). */
static void svg_discard(svg_out *o)
{
    if (o->f) {
        struct stat st;
        const int regular = fstat(fileno(o->f), &st) == 0 && S_ISREG(st.st_mode);
        fclose(o->f);
        if (regular)
            remove(o->path);
        o->f = NULL;
    }
}

/*
 * Plan path under budget mp->vram_budget for sp's context (0: the default, ENGINE_CTX_MAX: the model's
 * maximum), KV type (the model's when the session's is AUTO) and batch
 * on a copy of the model that is only mapped (no model on the device,
 * nothing quantized: the planner sizes --quant itself), priced for gpu (a
 * table row) or this machine's device (plan_bandwidths), and print it to
 * out as text or JSON (out NULL: only check it), and draw it into svg's
 * file (NULL: none), a refused plan too. A refusal prints one line on
 * stderr (and the JSON, which says fits: false). Returns 0 when the plan
 * fits and is drawn, 1 otherwise.
 */
static int print_plan(const char *path, const engine_model_params *mp, const engine_session_params *sp, FILE *out,
                      int json, const engine_gpu_info *gpu, svg_out *svg)
{
    engine_model_params lp = *mp;
    lp.device = ENGINE_DEVICE_CPU;
    lp.quant = ENGINE_QUANT_NONE;
    lp.vram_budget = 0;
    char err[512] = "";
    engine_model *m = NULL;
    if (engine_model_load(path, &lp, &m, err, sizeof err) != ENGINE_OK)
        return fail(NULL, err);
    engine_plan_params pp = engine_plan_default_params();
    pp.vram_budget = mp->vram_budget;
    pp.n_ctx = sp->n_ctx;
    pp.kv_type = sp->kv_type != ENGINE_KV_AUTO ? sp->kv_type : mp->kv_type;
    pp.n_batch = sp->n_batch;
    pp.quant = mp->quant;
    pp.min_layers_streamed = mp->min_layers_streamed;
    pp.moe_cpu = mp->moe_cpu;
    pp.moe_host = mp->moe_host;
    pp.expert_cache = mp->expert_cache;
    plan_bandwidths(&pp, mp, gpu);
    engine_plan *plan = NULL;
    engine_status st = engine_plan_create(m, &pp, &plan, err, sizeof err);
    double gbps = 0.0;
    /* Streamed layers, or experts the CPU runs: plan again with this CPU's measured speed at computing a
     * layer (and, on this machine's device, the rate host memory serves copies and the CPU together). */
    const engine_plan_totals *t0 = plan ? engine_plan_get_totals(plan) : NULL;
    if (st == ENGINE_OK && ((t0->n_layers_streamed > 0 && mp->host_layers != 0) || t0->n_experts_host > 0) &&
        engine_host_layer_rate(m, &gbps) == ENGINE_OK) {
        pp.host_gbps = gbps;
        pp.host_layers = mp->host_layers;
        if (pp.pcie_source == ENGINE_FIGURE_MEASURED && engine_host_shared_rate(m, mp->vram_budget, &gbps) == ENGINE_OK)
            pp.shared_gbps = gbps;
        engine_plan_free(plan);
        plan = NULL;
        st = engine_plan_create(m, &pp, &plan, err, sizeof err);
    }
    if (plan && json && out)
        plan_print_json(out, plan, path);
    else if (plan && st == ENGINE_OK && out)
        plan_print_text(out, plan, path);
    int bad = plan ? svg_draw(svg, plan, path, NULL) : 0;
    if (st != ENGINE_OK && !bad)
        fprintf(stderr, "infer: %s: %s%s%s\n", path, err, gpu ? " on the " : "", gpu ? gpu->name : "");
    engine_plan_free(plan);
    engine_model_free(m);
    return st == ENGINE_OK && !bad ? 0 : 1;
}

/* --gpu list: the table, as text or a JSON array. */
static int print_gpus(int json)
{
    engine_gpu_info g;
    if (json)
        fputc('[', stdout);
    else
        printf("%-16s %6s %16s %12s %14s %5s  %s\n", "GPU", "memory", "GB/s (planned)", "PCIe", "to GPU GB/s", "cc",
               "source");
    for (size_t i = 0; i < engine_gpu_count() && engine_gpu_at(i, &g) == ENGINE_OK; i++) {
        if (json) {
            printf("%s{\"name\":", i ? "," : "");
            cli_json_string(stdout, g.name, strlen(g.name));
            printf(",\"vram_gib\":%g,\"mem_gbps\":%g,\"hbm_gbps\":%.2f,\"pcie_gen\":%d,\"pcie_lanes\":%d,"
                   "\"pcie_gbps\":%.2f,\"cc\":\"%d.%d\",\"source\":",
                   g.vram_gib, g.mem_gbps, g.hbm_gbps, g.pcie_gen, g.pcie_lanes, g.pcie_gbps, g.cc_major, g.cc_minor);
            cli_json_string(stdout, g.source, strlen(g.source));
            fputc('}', stdout);
        } else {
            char link[16];
            snprintf(link, sizeof link, "%d.0 x%d", g.pcie_gen, g.pcie_lanes);
            printf("%-16s %3g GiB %7.0f (%6.0f) %12s %14.1f %2d.%d  %s\n", g.name, g.vram_gib, g.mem_gbps, g.hbm_gbps,
                   link, g.pcie_gbps, g.cc_major, g.cc_minor, g.source);
        }
    }
    if (json)
        printf("]\n");
    else
        printf("planned: memory at %.0f%% of the datasheet figure, the PCIe link at %.0f%% of its rate after "
               "encoding (docs/API.md)\n", 100 * ENGINE_GPU_MEM_EFFICIENCY, 100 * ENGINE_GPU_PCIE_EFFICIENCY);
    return 0;
}

static const char *stop_name(engine_stop_reason r)
{
    switch (r) {
    case ENGINE_STOP_EOS: return "eos";
    case ENGINE_STOP_CALLBACK: return "interrupted";
    case ENGINE_STOP_CONTEXT: return "context full";
    default: return "length";
    }
}

/*
 * --report once loaded: on a GPU, the plan the model was placed by (with
 * the CUDA context's share as measured; --svg draws it after the run); on
 * the CPU, the plan for --vram, drawn now into svg's file. Returns 1 when
 * drawing failed.
 */
static int report_loaded(const engine_model *model, const char *path, const engine_model_params *mp,
                         const engine_session_params *sp, svg_out *svg)
{
    const engine_plan *plan = engine_model_plan(model);
    if (plan)
        plan_print_text(stderr, plan, path);
    else if (mp->vram_budget)
        return print_plan(path, mp, sp, stderr, 0, NULL, svg);
    else
        fprintf(stderr, "infer: --report: running on the CPU; give --vram SIZE to plan for a GPU\n");
    return 0;
}

static int by_count_desc(const void *a, const void *b)
{
    const uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/*
 * --report on an expert model: how the router spread the session's tokens
 * over each layer's experts (engine_session_expert_picks): the picks, the
 * experts picked at least once, the share of the most picked tenth, and on
 * a GPU the share that went to the experts the plan keeps on the device.
 */
static void print_expert_picks(FILE *f, engine_session *s, const engine_model_info *info, const engine_plan *plan)
{
    const int E = info->n_experts, top = E / 10 > 0 ? E / 10 : 1;
    uint32_t *c = malloc((size_t)E * sizeof *c);
    if (!c)
        return;
    fprintf(f, "expert picks (%d of %d experts a token): layer, picks, experts picked, the top %d's share%s\n",
            info->n_experts_used, E, top, plan ? ", on the device (experts resident)" : "");
    for (int l = 0; l < info->n_layers; l++) {
        if (engine_session_expert_picks(s, l, c, E) != ENGINE_OK)
            continue;
        const engine_plan_entry *pe = plan ? engine_plan_entry_at(plan, 1 + (size_t)l) : NULL;
        const int res = pe && pe->placement == ENGINE_PLACE_RESIDENT ? pe->experts_resident : 0;
        uint64_t all = 0, dev = 0, most = 0;
        int used = 0;
        for (int e = 0; e < E; e++) {
            all += c[e], used += c[e] > 0;
            dev += e < res ? c[e] : 0;
        }
        qsort(c, (size_t)E, sizeof *c, by_count_desc);
        for (int e = 0; e < top; e++)
            most += c[e];
        fprintf(f, "  layer %-3d %8llu  %4d  %5.1f%%", l, (unsigned long long)all, used,
                all ? 100.0 * (double)most / (double)all : 0.0);
        if (pe)
            fprintf(f, "  %5.1f%% (%d)", all ? 100.0 * (double)dev / (double)all : 0.0, res);
        fputc('\n', f);
    }
    free(c);
}

/* The numeric options: name, range, and the field each sets. */
typedef enum opt_field {
    OPT_N_PREDICT, OPT_TEMP, OPT_TOP_K, OPT_TOP_P, OPT_MIN_P, OPT_REPEAT_PENALTY, OPT_REPEAT_LAST_N, OPT_SEED,
    OPT_CTX, OPT_THREADS, OPT_STREAM_LAYERS, OPT_HOST_LAYERS, OPT_BATCH, OPT_MOE_CPU
} opt_field;

typedef struct number_option {
    const char *name, *alias;
    opt_field field;
    char kind; /* 'i' integer, 'f' real, 'u' unsigned 64-bit */
    double lo, hi;
} number_option;

static const number_option NUMBER_OPTIONS[] = {
    {"--n-predict", "-n", OPT_N_PREDICT, 'i', 0, 1 << 30},
    {"--temp", NULL, OPT_TEMP, 'f', 0.0, 1e6},
    {"--top-k", NULL, OPT_TOP_K, 'i', 0, 1 << 30},
    {"--top-p", NULL, OPT_TOP_P, 'f', 1e-9, 1.0},
    {"--min-p", NULL, OPT_MIN_P, 'f', 0.0, 1.0},
    {"--repeat-penalty", NULL, OPT_REPEAT_PENALTY, 'f', 1e-6, 1e6},
    {"--repeat-last-n", NULL, OPT_REPEAT_LAST_N, 'i', -1, 1 << 30},
    {"--seed", NULL, OPT_SEED, 'u', 0, 0},
    {"--ctx", NULL, OPT_CTX, 'i', 1, 1 << 24},
    {"--threads", NULL, OPT_THREADS, 'i', 1, 4096},
    {"--stream-layers", NULL, OPT_STREAM_LAYERS, 'i', 0, 1 << 20},
    {"--host-layers", NULL, OPT_HOST_LAYERS, 'i', 0, 1 << 20},
    {"--batch", NULL, OPT_BATCH, 'i', 1, 1 << 24},
    {"--moe-cpu", NULL, OPT_MOE_CPU, 'i', 0, 1 << 20},
};

static const number_option *find_number_option(const char *a)
{
    for (size_t k = 0; k < sizeof NUMBER_OPTIONS / sizeof NUMBER_OPTIONS[0]; k++)
        if (!strcmp(a, NUMBER_OPTIONS[k].name) || (NUMBER_OPTIONS[k].alias && !strcmp(a, NUMBER_OPTIONS[k].alias)))
            return &NUMBER_OPTIONS[k];
    return NULL;
}

/* Parse v for opt into its field; nonzero when v is malformed or out of range. */
static int parse_number_option(const number_option *opt, const char *v, engine_model_params *mp,
                               engine_session_params *sp, engine_generate_params *gp)
{
    long l = 0;
    double d = 0.0;
    uint64_t u = 0;
    if (opt->kind == 'i' ? cli_parse_long(v, (long)opt->lo, (long)opt->hi, &l)
        : opt->kind == 'f' ? cli_parse_float(v, opt->lo, opt->hi, &d)
                           : cli_parse_u64(v, &u))
        return -1;
    switch (opt->field) {
    case OPT_N_PREDICT: gp->n_predict = (int)l; break;
    case OPT_TEMP: gp->sampling.temperature = (float)d; break;
    case OPT_TOP_K: gp->sampling.top_k = (int)l; break;
    case OPT_TOP_P: gp->sampling.top_p = (float)d; break;
    case OPT_MIN_P: gp->sampling.min_p = (float)d; break;
    case OPT_REPEAT_PENALTY: gp->sampling.repeat_penalty = (float)d; break;
    case OPT_REPEAT_LAST_N: gp->sampling.repeat_last_n = (int)l; break;
    case OPT_SEED: gp->sampling.seed = u; break;
    case OPT_CTX: sp->n_ctx = (int)l; break;
    case OPT_THREADS: mp->n_threads = (int)l; break;
    case OPT_STREAM_LAYERS: mp->min_layers_streamed = (int)l; break;
    case OPT_HOST_LAYERS: mp->host_layers = (int)l; break;
    case OPT_BATCH: sp->n_batch = (int)l; break;
    case OPT_MOE_CPU: mp->moe_cpu = (int)l; break;
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *model_path = NULL, *prompt = NULL, *prompt_ids_arg = NULL, *prompt_file = NULL;
    engine_model_params mp = engine_model_default_params();
    engine_session_params sp = engine_session_default_params();
    engine_generate_params gp = engine_generate_default_params();
    int json = 0, verbose = 0, seed_given = 0, dry_run = 0, report = 0;
    svg_out svg = {NULL, NULL};
    trace_out trace = {NULL, NULL};
    const char *gpu_arg = NULL, *messages = NULL, *system = NULL, *chat_template = NULL;
    int chat = 0;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        const number_option *opt;
#define NEED_VALUE()                                                            \
    do {                                                                        \
        if (!v) {                                                               \
            fprintf(stderr, "infer: %s needs a value (see infer --help)\n", a); \
            return 2;                                                           \
        }                                                                       \
        i++;                                                                    \
    } while (0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(USAGE, stdout);
            return 0;
        } else if (!strcmp(a, "--version")) {
            printf("infer (libengine %s)\n", engine_version_string());
            return 0;
        } else if (!strcmp(a, "--prompt")) {
            NEED_VALUE();
            prompt = v;
        } else if (!strcmp(a, "--prompt-ids")) {
            NEED_VALUE();
            prompt_ids_arg = v;
        } else if (!strcmp(a, "--file")) {
            NEED_VALUE();
            prompt_file = v;
        } else if (!strcmp(a, "--messages") || !strcmp(a, "--system") || !strcmp(a, "--chat-template")) {
            NEED_VALUE();
            *(a[2] == 'm' ? &messages : a[3] == 'y' ? &system : &chat_template) = v;
        } else if (!strcmp(a, "--chat")) {
            chat = 1;
        } else if (!strcmp(a, "--ctx") && v && !strcmp(v, "max")) {
            i++;
            sp.n_ctx = ENGINE_CTX_MAX;
        } else if (!strcmp(a, "--moe-host")) {
            NEED_VALUE();
            const int h = !strcmp(v, "auto") ? ENGINE_MOE_HOST_AUTO
                          : !strcmp(v, "cpu") ? ENGINE_MOE_HOST_CPU
                          : !strcmp(v, "gpu") ? ENGINE_MOE_HOST_GPU
                                              : -1;
            if (h < 0) {
                fprintf(stderr, "infer: bad value '%s' for --moe-host (auto, cpu or gpu)\n", v);
                return 2;
            }
            mp.moe_host = h;
        } else if (!strcmp(a, "--kv")) {
            NEED_VALUE();
            const int t = engine_kv_type_parse(v);
            if (t < 0) {
                fprintf(stderr, "infer: bad value '%s' for --kv (auto, f32, f16, bf16, int8 or fp8)\n", v);
                return 2;
            }
            mp.kv_type = sp.kv_type = (engine_kv_type)t;
        } else if ((opt = find_number_option(a)) != NULL) {
            NEED_VALUE();
            if (parse_number_option(opt, v, &mp, &sp, &gp))
                return bad_arg(a, v);
            seed_given |= opt->field == OPT_SEED;
        } else if (!strcmp(a, "--device")) {
            NEED_VALUE();
            if (!strcmp(v, "cpu"))
                mp.device = ENGINE_DEVICE_CPU;
            else if (!strcmp(v, "cuda"))
                mp.device = ENGINE_DEVICE_CUDA;
            else if (!strcmp(v, "auto"))
                mp.device = ENGINE_DEVICE_AUTO;
            else
                return bad_arg(a, v);
        } else if (!strcmp(a, "--quant")) {
            NEED_VALUE();
            if (cli_parse_quant(v, &mp.quant))
                return bad_arg(a, v);
        } else if (!strcmp(a, "--quant-head")) {
            NEED_VALUE();
            if (cli_parse_quant(v, &mp.quant_head))
                return bad_arg(a, v);
        } else if (!strcmp(a, "--vram")) {
            NEED_VALUE();
            if (cli_parse_size(v, &mp.vram_budget))
                return bad_arg(a, v);
        } else if (!strcmp(a, "--expert-cache")) {
            NEED_VALUE();
            if (cli_parse_size(v, &mp.expert_cache))
                return bad_arg(a, v);
        } else if (!strcmp(a, "--gpu")) {
            NEED_VALUE();
            gpu_arg = v;
        } else if (!strcmp(a, "--gpu-bandwidth") || !strcmp(a, "--pcie-bandwidth")) {
            NEED_VALUE();
            if (cli_parse_gbps(v, a[2] == 'g' ? &mp.hbm_gbps : &mp.pcie_gbps))
                return bad_arg(a, v);
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--dry-run")) {
            dry_run = 1;
        } else if (!strcmp(a, "--report")) {
            report = 1;
        } else if (!strcmp(a, "--svg")) {
            NEED_VALUE();
            svg.path = v;
        } else if (!strcmp(a, "--trace")) {
            NEED_VALUE();
            trace.path = v;
        } else if (!strcmp(a, "--trace-svg")) {
            NEED_VALUE();
            trace.svg_path = v;
        } else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
            verbose = 1;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "infer: unknown option %s (see infer --help)\n", a);
            return 2;
        } else if (!model_path) {
            model_path = a;
        } else {
            fprintf(stderr, "infer: unexpected argument '%s' (see infer --help)\n", a);
            return 2;
        }
#undef NEED_VALUE
    }
    if (gpu_arg && !strcmp(gpu_arg, "list"))
        return print_gpus(json);
    if (!model_path) {
        fputs(USAGE, stderr);
        return 2;
    }
    if (!!prompt + !!prompt_ids_arg + !!prompt_file + !!messages + chat > 1) {
        fprintf(stderr, "infer: give only one of --prompt, --prompt-ids, --file, --messages, --chat\n");
        return 2;
    }
    if (!seed_given)
        gp.sampling.seed = (uint64_t)time(NULL);
    mp.log = log_to_stderr;
    mp.log_user = &verbose;
    mp.n_ctx = sp.n_ctx; /* the device placement leaves room for this context */
    engine_gpu_info gpu;
    if (gpu_arg) {
        char msg[512];
        if (!dry_run) {
            fprintf(stderr, "infer: --gpu plans for a card this machine need not have: use it with --dry-run "
                            "(a run measures its own GPU)\n");
            return 2;
        }
        if (engine_gpu_find(gpu_arg, &gpu, msg, sizeof msg) != ENGINE_OK) {
            fprintf(stderr, "infer: --gpu: %s\n", msg);
            return 2;
        }
        /* The card's memory less the margin infer leaves free when no --vram is given. */
        const uint64_t vram = (uint64_t)(gpu.vram_gib * 1073741824.0), margin = (uint64_t)512 << 20;
        if (!mp.vram_budget && vram > margin) {
            mp.vram_budget = vram - margin;
            if (!json)
                printf("budget: the %s's %g GiB less the 512 MiB infer leaves free without --vram\n", gpu.name,
                       gpu.vram_gib);
        }
    }
    if (dry_run && !mp.vram_budget) {
        fprintf(stderr, "infer: --dry-run needs --vram SIZE (or --gpu NAME), the device memory to plan for\n");
        return 2;
    }
    if (svg.path && !dry_run && !report) {
        fprintf(stderr, "infer: --svg draws the plan: use it with --dry-run or --report\n");
        return 2;
    }
    if (svg.path && !(svg.f = fopen(svg.path, "w"))) {
        fprintf(stderr, "infer: %s: cannot write the SVG: %s\n", svg.path, strerror(errno));
        return 1;
    }
    if ((trace.path || trace.svg_path) && dry_run) {
        fprintf(stderr, "infer: --trace and --trace-svg record a run: they do nothing with --dry-run\n");
        svg_discard(&svg);
        return 2;
    }
    if (dry_run) {
        const int prc = print_plan(model_path, &mp, &sp, stdout, json, gpu_arg ? &gpu : NULL, &svg);
        svg_discard(&svg);
        return prc;
    }
    /* With a budget a refusal stops before anything is loaded on the device. */
    if (report && mp.vram_budget && print_plan(model_path, &mp, &sp, NULL, 0, NULL, NULL)) {
        svg_discard(&svg);
        return 1;
    }

    char err[512] = "";
    engine_model *model = NULL;
    engine_session *sess = NULL;
    int32_t *prompt_ids = NULL, *gen_ids = NULL;
    char *file_text = NULL;
    out_text out = {NULL, 0, 0, !json};
    int rc = 1;

    if (trace_out_open(&trace, "infer"))
        goto done;
    mp.trace = trace.trace;
    if (engine_model_load(model_path, &mp, &model, err, sizeof err) != ENGINE_OK) {
        rc = fail(NULL, err);
        goto done;
    }
    engine_model_info info;
    engine_model_get_info(model, &info);
    if (sp.n_ctx == ENGINE_CTX_MAX) /* --ctx max: known now that the config is read */
        sp.n_ctx = info.max_context;
    const engine_tokenizer *tok = engine_model_tokenizer(model);

    size_t n_prompt = 0;
    if ((messages || chat) && !tok) {
        fprintf(stderr, "infer: %s: the model has no tokenizer.json, which a chat template needs\n", model_path);
        goto done;
    }
    if (chat) {
        if (engine_session_create(model, &sp, &sess, err, sizeof err) != ENGINE_OK)
            rc = fail(NULL, err);
        else
            rc = chat_interactive(model, sess, &gp, system, chat_template);
        goto done;
    }
    if (messages) {
        if (chat_prompt_ids("infer", tok, messages, chat_template, 1, &prompt_ids, &n_prompt))
            goto done;
    } else if (prompt_ids_arg) {
        long n = cli_parse_ids(prompt_ids_arg, &prompt_ids);
        if (n < 0) {
            rc = bad_arg("--prompt-ids", prompt_ids_arg);
            goto done;
        }
        n_prompt = (size_t)n;
    } else {
        size_t len = 0;
        const char *text = prompt;
        if (prompt_file) {
            file_text = cli_read_file(prompt_file, &len);
            if (!file_text) {
                fprintf(stderr, "infer: %s: cannot read: %s\n", prompt_file, strerror(errno));
                goto done;
            }
            text = file_text;
        } else if (text) {
            len = strlen(text);
        }
        if (text) {
            if (!tok) {
                fprintf(stderr, "infer: %s: the model has no tokenizer.json; give --prompt-ids instead\n", model_path);
                goto done;
            }
            engine_status st = cli_tokenize(tok, text, len, 1, &prompt_ids, &n_prompt);
            if (st != ENGINE_OK) {
                rc = fail("tokenize", st == ENGINE_ERR_OUT_OF_MEMORY ? "out of memory" : engine_tokenizer_last_error(tok));
                goto done;
            }
        } else if (info.bos_id >= 0) {
            prompt_ids = malloc(sizeof *prompt_ids);
            if (!prompt_ids)
                goto done;
            prompt_ids[0] = info.bos_id;
            n_prompt = 1;
        } else {
            fprintf(stderr, "infer: %s has no BOS token; give a prompt\n", model_path);
            rc = 2;
            goto done;
        }
    }
    if (n_prompt == 0) {
        fprintf(stderr, "infer: the prompt is empty after tokenization\n");
        rc = 2;
        goto done;
    }
    for (size_t i = 0; i < n_prompt; i++)
        if (prompt_ids[i] >= info.vocab_size) {
            fprintf(stderr, "infer: prompt id %d is outside the vocabulary (size %d)\n", (int)prompt_ids[i],
                    info.vocab_size);
            rc = 2;
            goto done;
        }

    if (engine_session_create(model, &sp, &sess, err, sizeof err) != ENGINE_OK) {
        rc = fail(NULL, err);
        goto done;
    }
    if (svg.f && !engine_model_plan(model) && !mp.vram_budget) {
        fprintf(stderr, "infer: --svg %s: no plan to draw: the model runs on the CPU (give --vram SIZE to draw the "
                        "plan for a GPU)\n", svg.path);
        goto done;
    }
    if (report && report_loaded(model, model_path, &mp, &sp, &svg))
        goto done;
    if (n_prompt > (size_t)engine_session_n_ctx(sess)) {
        fprintf(stderr, "infer: the prompt has %zu tokens but the context holds %d (raise --ctx)\n", n_prompt,
                engine_session_n_ctx(sess));
        rc = 2;
        goto done;
    }
    gen_ids = malloc(((size_t)gp.n_predict + 1) * sizeof *gen_ids);
    if (!gen_ids)
        goto done;

    /* Show the prompt as the model sees it, then the continuation. */
    if (!json && tok && !messages) {
        size_t need = 0;
        engine_detokenize(tok, prompt_ids, n_prompt, 1, NULL, 0, &need);
        char *ptext = malloc(need + 1);
        if (ptext && engine_detokenize(tok, prompt_ids, n_prompt, 1, ptext, need + 1, &need) == ENGINE_OK) {
            fwrite(ptext, 1, need, stdout);
            fflush(stdout);
        }
        free(ptext);
    }

    /* sigaction, not signal(): under -std=c11 glibc's signal() has System V
     * semantics and resets the handler on delivery, so a second SIGINT (a
     * second Ctrl-C, or one sent to the process group as well as to infer)
     * killed infer before its summary. Kept until exit for the same reason. */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    gp.on_token = on_token;
    gp.user = &out;
    size_t n_gen = 0;
    engine_generate_stats stats;
    engine_status st = engine_generate(sess, prompt_ids, n_prompt, &gp, gen_ids, (size_t)gp.n_predict + 1, &n_gen,
                                       &stats);
    if (st != ENGINE_OK) {
        if (!json)
            fputc('\n', stdout);
        rc = fail("generate", engine_session_last_error(sess));
        goto done;
    }

    engine_memory_report mem;
    engine_session_memory(sess, &mem);
    const int on_gpu = info.device == ENGINE_DEVICE_CUDA;
    /* After generating: what streaming measured (three decode steps timed one by one). */
    engine_offload_report off;
    const int have_off = report && on_gpu && engine_session_offload(sess, 3, &off) == ENGINE_OK;
    /* --report --svg on a GPU: the plan the model was placed by and, where it streamed, what the run measured. */
    if (svg.f && engine_model_plan(model) &&
        svg_draw(&svg, engine_model_plan(model), model_path, have_off ? &off : NULL))
        goto done;
    if (have_off && !json) {
        const engine_plan *plan = engine_model_plan(model);
        offload_print_text(stderr, &off, plan ? engine_plan_get_totals(plan)->pcie_gbps : ENGINE_PLAN_PCIE_GBPS);
    }
    const double pps = stats.prompt_seconds > 0 ? stats.n_prompt / stats.prompt_seconds : 0.0;
    const double gps = stats.gen_seconds > 0 && stats.n_generated > 1 ? (stats.n_generated - 1) / stats.gen_seconds
                                                                        : 0.0;
    if (json) {
        printf("{\"model\":");
        cli_json_string(stdout, model_path, strlen(model_path));
        printf(",\"prompt_ids\":");
        cli_json_ids(stdout, prompt_ids, n_prompt);
        printf(",\"generated_ids\":");
        cli_json_ids(stdout, gen_ids, n_gen);
        printf(",\"text\":");
        cli_json_string(stdout, out.buf ? out.buf : "", out.len);
        printf(",\"stop\":\"%s\",\"seed\":%llu", stop_name(stats.stop), (unsigned long long)gp.sampling.seed);
        printf(",\"timings\":{\"prompt_seconds\":%.6f,\"prompt_tokens_per_second\":%.3f,"
               "\"generate_seconds\":%.6f,\"generated_tokens_per_second\":%.3f}",
               stats.prompt_seconds, pps, stats.gen_seconds, gps);
        printf(",\"device\":\"%s\"", on_gpu ? "cuda" : "cpu");
        if (have_off) {
            printf(",\"offload\":");
            offload_print_json(stdout, &off);
        }
        printf(",\"memory\":{\"weights_mapped\":%llu,\"kv_cache\":%llu,\"activations\":%llu,\"host_total\":%llu,"
               "\"device_in_use\":%llu,\"device_mapped\":%llu,\"device_peak\":%llu,\"device_budget\":%llu}}\n",
               (unsigned long long)mem.weights_mapped, (unsigned long long)mem.kv_cache,
               (unsigned long long)mem.activations, (unsigned long long)mem.host_total,
               (unsigned long long)mem.device_total, (unsigned long long)mem.device_mapped,
               (unsigned long long)mem.device_peak, (unsigned long long)mem.device_budget);
    } else {
        fputc('\n', stdout);
        fflush(stdout);
        if (report && info.n_experts > 0)
            print_expert_picks(stderr, sess, &info, engine_model_plan(model));
        fprintf(stderr, "infer: prompt %zu tokens at %.1f tok/s | generated %zu tokens at %.1f tok/s (stop: %s) | ",
                stats.n_prompt, pps, stats.n_generated, gps, stop_name(stats.stop));
        if (on_gpu)
            fprintf(stderr,
                    "GPU memory: %.1f MiB in use (weights %.1f, KV cache %.1f, activations %.1f), peak mapped %.1f "
                    "of %.1f MiB budget | seed %llu\n",
                    mem.device_total / 1048576.0, mem.weights_owned / 1048576.0, mem.kv_cache / 1048576.0,
                    mem.activations / 1048576.0, mem.device_peak / 1048576.0, mem.device_budget / 1048576.0,
                    (unsigned long long)gp.sampling.seed);
        else
            fprintf(stderr,
                    "memory: weights %.1f MiB mapped + %.1f MiB quantized on load (%s), KV cache %.1f MiB, "
                    "activations %.1f MiB | seed %llu\n",
                    mem.weights_mapped / 1048576.0, mem.weights_owned / 1048576.0, info.weight_dtype,
                    mem.kv_cache / 1048576.0, mem.activations / 1048576.0, (unsigned long long)gp.sampling.seed);
    }
    rc = interrupted ? 130 : 0;

done:
    svg_discard(&svg);
    free(out.buf);
    free(gen_ids);
    free(prompt_ids);
    free(file_text);
    engine_session_free(sess);
    engine_model_free(model);
    if (trace_out_close(&trace, "infer") && rc == 0)
        rc = 1;
    return rc;
}
