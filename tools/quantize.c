/*
 * quantize: write a quantized copy of a Hugging Face checkpoint.
 *
 *   quantize IN OUT --type int8|int8-g128|nf4|fp4 [--double-quant] [--quant-head TYPE] [--skip PATTERN]...
 *
 * Progress and per-tensor error statistics go to stderr, the summary (size
 * before and after) to stdout. A thin client of include/engine.h
 * (engine_quantize does the work).
 */
#define _POSIX_C_SOURCE 200809L

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"
#include "engine.h"

static const char USAGE[] =
    "usage: quantize IN OUT --type TYPE [options]\n"
    "  IN                    a checkpoint infer can load: .safetensors file, folder, or index .json\n"
    "  OUT                   the folder to create (must not exist); written as OUT.tmp-XXXXXX and\n"
    "                        renamed when complete\n"
    "  --type TYPE           int8 (one scale per row), int8-g128 (per 128 columns), nf4, fp4\n"
    "                        (bitsandbytes 4-bit, the layout transformers saves; docs/FORMATS.md)\n"
    "  --double-quant        nf4/fp4: store the block absmax in 8 bits (bitsandbytes' nested quantization)\n"
    "  --skip PATTERN        keep tensors whose name matches this glob as stored (repeatable),\n"
    "                        e.g. --skip 'model.layers.0.*'; embeddings and norms are always kept\n"
    "  --quant-head TYPE     the output head too, in TYPE (int8, int8-g128, nf4, nf4-dq, fp4; default:\n"
    "                        kept as stored); a tied model gets a quantized lm_head beside its table\n"
    "  --shard-size SIZE     start a new shard past SIZE bytes, e.g. 4G, 500M (default 4G)\n"
    "  --threads N           CPU threads (default: all cores)\n"
    "  -q, --quiet           no per-tensor lines\n"
    "  -h, --help\n";

typedef struct progress {
    int quiet;
} progress;

static void on_tensor(const engine_quantize_tensor *t, void *user)
{
    const progress *p = user;
    if (p->quiet)
        return;
    if (t->quantized)
        fprintf(stderr, "[%4zu/%zu] %-48s %9.2f -> %8.2f KiB  rel rms err %.4f  max err %.3g\n", t->index + 1,
                t->count, t->name, t->bytes_in / 1024.0, t->bytes_out / 1024.0, t->rms > 0 ? t->rms_err / t->rms : 0.0,
                t->max_err);
    else
        fprintf(stderr, "[%4zu/%zu] %-48s %9.2f KiB  kept\n", t->index + 1, t->count, t->name, t->bytes_in / 1024.0);
}

static int bad_arg(const char *opt, const char *val)
{
    fprintf(stderr, "quantize: bad value '%s' for %s (see quantize --help)\n", val ? val : "", opt);
    return 2;
}

/* The tool, with room for argc skip patterns; every return leaves skip to main. */
static int run(int argc, char **argv, const char **skip)
{
    const char *in = NULL, *out = NULL, *type = NULL;
    int double_quant = 0;
    const char *head_arg = NULL;
    progress prog = {0};
    engine_quantize_params qp = engine_quantize_default_params();
    size_t n_skip = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int needs = !strcmp(a, "--type") || !strcmp(a, "--skip") || !strcmp(a, "--shard-size") || !strcmp(a, "--quant-head") ||
                    !strcmp(a, "--threads");
        if (needs && !v) {
            fprintf(stderr, "quantize: %s needs a value (see quantize --help)\n", a);
            return 2;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(USAGE, stdout);
            return 0;
        } else if (!strcmp(a, "--type")) {
            type = argv[++i];
        } else if (!strcmp(a, "--double-quant")) {
            double_quant = 1;
        } else if (!strcmp(a, "--quant-head")) {
            if (cli_parse_quant(v, &qp.head_type))
                return bad_arg(a, v);
            head_arg = v;
            i++;
        } else if (!strcmp(a, "--skip")) {
            skip[n_skip++] = argv[++i];
        } else if (!strcmp(a, "--shard-size")) {
            if (cli_parse_size(v, &qp.max_shard_bytes) || qp.max_shard_bytes == 0)
                return bad_arg(a, v);
            i++;
        } else if (!strcmp(a, "--threads")) {
            long n;
            if (cli_parse_long(v, 1, 4096, &n))
                return bad_arg(a, v);
            qp.n_threads = (int)n;
            i++;
        } else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
            prog.quiet = 1;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "quantize: unknown option %s (see quantize --help)\n", a);
            return 2;
        } else if (!in) {
            in = a;
        } else if (!out) {
            out = a;
        } else {
            fprintf(stderr, "quantize: unexpected argument '%s' (see quantize --help)\n", a);
            return 2;
        }
    }
    if (!in || !out || !type) {
        fprintf(stderr, "quantize: %s is required (see quantize --help)\n", !in ? "IN" : !out ? "OUT" : "--type");
        return 2;
    }
    if (!strcmp(type, "int8") || !strcmp(type, "int8-g128")) {
        if (double_quant) {
            fprintf(stderr, "quantize: --double-quant applies to nf4 and fp4 only\n");
            return 2;
        }
        qp.type = type[4] ? ENGINE_QUANT_INT8_G128 : ENGINE_QUANT_INT8;
    } else if (!strcmp(type, "nf4")) {
        qp.type = double_quant ? ENGINE_QUANT_NF4_DQ : ENGINE_QUANT_NF4;
    } else if (!strcmp(type, "fp4") && !double_quant) {
        qp.type = ENGINE_QUANT_FP4;
    } else if (!strcmp(type, "fp4")) {
        fprintf(stderr, "quantize: --double-quant with fp4 is not supported; use nf4\n");
        return 2;
    } else {
        return bad_arg("--type", type);
    }
    qp.skip = skip;
    qp.n_skip = n_skip;
    qp.on_tensor = on_tensor;
    qp.user = &prog;

    char err[512] = "";
    engine_quantize_stats stats;
    engine_status st = engine_quantize(in, out, &qp, &stats, err, sizeof err);
    if (st != ENGINE_OK) {
        fprintf(stderr, "quantize: %s\n", err);
        return 1;
    }
    char head[64] = "";
    if (qp.head_type != ENGINE_QUANT_NONE)
        snprintf(head, sizeof head, ", the head %s", head_arg);
    printf("quantize: %s -> %s: %zu of %zu tensors quantized (%s%s), %.2f MiB -> %.2f MiB (%.1f%%), %d shard%s\n",
           in, out, stats.n_quantized, stats.n_tensors, double_quant ? "nf4, double-quant" : type, head,
           stats.bytes_in / 1048576.0, stats.bytes_out / 1048576.0,
           stats.bytes_in ? 100.0 * stats.bytes_out / stats.bytes_in : 0.0, stats.n_shards,
           stats.n_shards == 1 ? "" : "s");
    return 0;
}

int main(int argc, char **argv)
{
    /* Past a file-size limit (ulimit -f) a write should fail with EFBIG, so
     * the library can report it and remove its temporary folder, rather
     * than the process dying of SIGXFSZ in the middle of a shard. */
    signal(SIGXFSZ, SIG_IGN);
    const char **skip = calloc((size_t)argc, sizeof *skip);
    if (!skip) {
        fprintf(stderr, "quantize: out of memory\n");
        return 1;
    }
    const int rc = run(argc, argv, skip);
    free(skip);
    return rc;
}
