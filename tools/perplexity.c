/*
 * perplexity: how well a model predicts a text, and how far a quantized
 * model's next-token distributions stray from the unquantized model's.
 * A thin client of engine.h (engine_session_score).
 *
 * The text's ids are cut into windows of --ctx tokens, one every --stride
 * tokens (default: --ctx, so windows do not overlap); each window is scored
 * from its position --score-from on (default ctx/2 as llama-perplexity
 * does, or ctx - stride when sliding). --save-logits writes the scored
 * positions' log-probabilities (docs/FORMATS.md, "Perplexity logits");
 * --kl-base compares this run against such a file.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../tools/cli_util.h"
#include "../tools/trace_out.h"
#include "engine.h"

#define FULL_VOCAB_MAX 4096 /* vocabularies up to this are saved whole */
#define TOP_K 32
#define HEADER_BYTES 64
static const char MAGIC[8] = {'E', 'N', 'G', 'P', 'P', 'L', 'L', 'P'};
#define FORMAT_VERSION 1u

static const char *USAGE =
    "usage: perplexity MODEL (--file TEXT | --ids 1,2,3) [options]\n"
    "  --ctx N|max           tokens per window (default 512; max: the model's maximum)\n"
    "  --score-from K        score each window from position K on (default ctx/2; with --stride,\n"
    "                        ctx - stride)\n"
    "  --stride S            start a window every S tokens (default ctx: no overlap)\n"
    "  --json                print the figures as one JSON object\n"
    "  --save-logits FILE    write the scored positions' log-probabilities (docs/FORMATS.md)\n"
    "  --kl-base FILE        compare against a --save-logits file of the same text and windows\n"
    "  --trace FILE.json     record the load and each window's passes (with their layers) as a\n"
    "                        Chrome trace-event file for ui.perfetto.dev (see infer --help)\n"
    "  --trace-svg FILE.svg  draw that trace as an SVG timeline (see infer --help)\n"
    "  --device cpu|cuda|auto, --quant TYPE, --quant-head TYPE, --vram SIZE, --threads N,\n"
    "  --kv auto|f32|f16|bf16|int8|fp8, --batch N: as for infer\n";

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("perplexity: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* FNV-1a, 64 bits. */
static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}
#define FNV_SEED 0xcbf29ce484222325ull

static void put32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}
static void put64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}
static uint64_t get64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}
static float getf(const unsigned char *p)
{
    uint32_t u = get32(p);
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static double getd(const unsigned char *p)
{
    uint64_t u = get64(p);
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}
static void putf(unsigned char *p, float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    put32(p, u);
}
static void putd(unsigned char *p, double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    put64(p, u);
}

/* What identifies a run: a base file must match it field for field. */
typedef struct run_id {
    uint32_t vocab, ctx, score_from, stride, top_k;
    uint64_t ids_hash, n_ids, count;
} run_id;

static size_t record_bytes(const run_id *r)
{
    /* target id, its log-prob (f64), then the row (f64 each) or top-k (id, f32) pairs and the rest's log mass */
    return r->top_k ? 4 + 8 + (size_t)r->top_k * 8 + 8 : 4 + 8 + (size_t)r->vocab * 8;
}

typedef struct state {
    const int32_t *ids; /* the window's ids */
    size_t rec;         /* records done so far                    */
    run_id id;
    double *lp;         /* [vocab] scratch: this row's log-probs  */
    FILE *save;         /* --save-logits                          */
    uint64_t save_hash;
    unsigned char *rec_buf;
    const unsigned char *base; /* --kl-base records                */
    double *kl;                /* [count] per position             */
    double base_nll;           /* sum of the base's -log p(target) */
    size_t agree;
    int io_error;
} state;

static int argmax_d(const double *v, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b])
            b = i;
    return b;
}

/* Indices of the k largest of v[0..n), largest first (k small: insertion). */
static void top_k(const double *v, int n, int k, int *out)
{
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (m == k && v[i] <= v[out[k - 1]])
            continue;
        int j = m < k ? m++ : k - 1;
        while (j > 0 && v[out[j - 1]] < v[i]) {
            out[j] = out[j - 1];
            j--;
        }
        out[j] = i;
    }
}

/* log(1 - exp(-x))-safe: the log of the probability mass outside a set whose mass is s. */
static double log_rest(double s)
{
    return s < 1.0 ? log1p(-s) : -INFINITY;
}

static void on_row(size_t i, const float *logits, int n_vocab, double lse, void *user)
{
    state *st = user;
    for (int v = 0; v < n_vocab; v++)
        st->lp[v] = (double)logits[v] - lse;
    const int32_t target = st->ids[i];
    const size_t rb = record_bytes(&st->id);
    if (st->save) {
        unsigned char *p = st->rec_buf;
        put32(p, (uint32_t)target);
        putd(p + 4, st->lp[target]);
        if (st->id.top_k) {
            int idx[TOP_K];
            top_k(st->lp, n_vocab, TOP_K, idx);
            double mass = 0.0;
            for (int k = 0; k < TOP_K; k++) {
                put32(p + 12 + 8 * k, (uint32_t)idx[k]);
                putf(p + 16 + 8 * k, (float)st->lp[idx[k]]);
                mass += exp(st->lp[idx[k]]);
            }
            putd(p + 12 + 8 * TOP_K, log_rest(mass));
        } else {
            for (int v = 0; v < n_vocab; v++)
                putd(p + 12 + 8 * (size_t)v, st->lp[v]);
        }
        st->save_hash = fnv(st->save_hash, p, rb);
        if (fwrite(p, 1, rb, st->save) != rb)
            st->io_error = 1;
    }
    if (st->base && st->rec < st->id.count) {
        const unsigned char *p = st->base + st->rec * rb;
        st->base_nll -= getd(p + 4);
        double kl = 0.0;
        int base_top;
        if (st->id.top_k) {
            /* KL over the base's top k and the rest taken as one outcome (llama.cpp's approximation). */
            double mass_q = 0.0;
            for (int k = 0; k < TOP_K; k++) {
                const int v = (int)get32(p + 12 + 8 * k);
                const double lpb = getf(p + 16 + 8 * k);
                kl += exp(lpb) * (lpb - st->lp[v]);
                mass_q += exp(st->lp[v]);
            }
            const double rest_p = getd(p + 12 + 8 * TOP_K), rest_q = log_rest(mass_q);
            if (isfinite(rest_p))
                kl += exp(rest_p) * (rest_p - (isfinite(rest_q) ? rest_q : -700.0));
            base_top = (int)get32(p + 12);
        } else {
            double best = -INFINITY;
            base_top = 0;
            for (int v = 0; v < n_vocab; v++) {
                const double lpb = getd(p + 12 + 8 * (size_t)v);
                kl += exp(lpb) * (lpb - st->lp[v]);
                if (lpb > best) {
                    best = lpb;
                    base_top = v;
                }
            }
        }
        st->kl[st->rec] = kl;
        st->agree += base_top == argmax_d(st->lp, n_vocab);
    }
    st->rec++;
}

static void header(const run_id *r, unsigned char *h)
{
    memset(h, 0, HEADER_BYTES);
    memcpy(h, MAGIC, 8);
    put32(h + 8, FORMAT_VERSION);
    put32(h + 12, r->vocab);
    put64(h + 16, r->ids_hash);
    put64(h + 24, r->n_ids);
    put32(h + 32, r->ctx);
    put32(h + 36, r->score_from);
    put32(h + 40, r->stride);
    put32(h + 44, r->top_k);
    put64(h + 48, r->count);
}

/* Reads and checks a base file against this run; its records in *records (malloc'd). One line on failure. */
static int load_base(const char *path, const run_id *want, unsigned char **records)
{
    size_t len = 0;
    unsigned char *b = (unsigned char *)cli_read_file(path, &len);
    if (!b)
        return fail("%s: %s", path, strerror(errno));
    const size_t rb = record_bytes(want);
    int bad = 1;
    if (len < HEADER_BYTES || memcmp(b, MAGIC, 8))
        fail("%s: not a perplexity logits file", path);
    else if (get32(b + 8) != FORMAT_VERSION)
        fail("%s: format version %u, this build reads %u", path, get32(b + 8), FORMAT_VERSION);
    else if (get32(b + 12) != want->vocab)
        fail("%s: saved from a model with %u tokens in its vocabulary, this one has %u", path, get32(b + 12),
             want->vocab);
    else if (get64(b + 16) != want->ids_hash || get64(b + 24) != want->n_ids)
        fail("%s: saved from another text or tokenizer (%llu ids, hash %016llx; here %llu, %016llx)", path,
             (unsigned long long)get64(b + 24), (unsigned long long)get64(b + 16), (unsigned long long)want->n_ids,
             (unsigned long long)want->ids_hash);
    else if (get32(b + 32) != want->ctx || get32(b + 36) != want->score_from || get32(b + 40) != want->stride)
        fail("%s: saved with --ctx %u --score-from %u --stride %u; give the same", path, get32(b + 32),
             get32(b + 36), get32(b + 40));
    else if (get32(b + 44) != want->top_k || get64(b + 48) != want->count)
        fail("%s: inconsistent header (top-k %u, %llu records; expected %u, %llu)", path, get32(b + 44),
             (unsigned long long)get64(b + 48), want->top_k, (unsigned long long)want->count);
    else if (len != HEADER_BYTES + want->count * rb + 8)
        fail("%s: %zu bytes, expected %llu (truncated or corrupted)", path, len,
             (unsigned long long)(HEADER_BYTES + want->count * rb + 8));
    else if (fnv(FNV_SEED, b + HEADER_BYTES, want->count * rb) != get64(b + HEADER_BYTES + want->count * rb))
        fail("%s: checksum mismatch (corrupted)", path);
    else
        bad = 0;
    if (bad) {
        free(b);
        return 1;
    }
    *records = b;
    return 0;
}

static int cmp_d(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of sorted v[0..n). */
static double pct(const double *v, size_t n, double q)
{
    size_t k = (size_t)ceil(q * (double)n);
    return v[k ? k - 1 : 0];
}

/* Stride and first scored position from their defaults for windows of ctx tokens; nonzero, said, when they clash. */
static int window_defaults(long ctx, long *stride, long *score_from)
{
    if (!*stride)
        *stride = ctx;
    if (*score_from < 0)
        *score_from = *stride < ctx ? ctx - *stride : ctx / 2;
    if (*score_from >= ctx)
        return fail("--score-from %ld must be below --ctx %ld", *score_from, ctx);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fputs(USAGE, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *model_path = argv[1], *file = NULL, *ids_arg = NULL, *save_path = NULL, *base_path = NULL;
    long ctx = 512, score_from = -1, stride = 0;
    int json = 0, ctx_max = 0, kv_t;
    engine_model_params mp = engine_model_default_params();
    engine_session_params sp = engine_session_default_params();
    trace_out trace = {NULL, NULL};
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long l;
        if (!strcmp(a, "--json")) {
            json = 1;
            continue;
        }
        if (!v)
            return fail("%s needs a value (see --help)", a);
        i++;
        if (!strcmp(a, "--file"))
            file = v;
        else if (!strcmp(a, "--ids"))
            ids_arg = v;
        else if (!strcmp(a, "--save-logits"))
            save_path = v;
        else if (!strcmp(a, "--kl-base"))
            base_path = v;
        else if (!strcmp(a, "--trace"))
            trace.path = v;
        else if (!strcmp(a, "--trace-svg"))
            trace.svg_path = v;
        else if (!strcmp(a, "--ctx") && !strcmp(v, "max"))
            ctx_max = 1;
        else if (!strcmp(a, "--ctx") && !cli_parse_long(v, 2, 1 << 20, &ctx))
            ctx_max = 0;
        else if (!strcmp(a, "--kv") && (kv_t = engine_kv_type_parse(v)) >= 0)
            mp.kv_type = sp.kv_type = (engine_kv_type)kv_t;
        else if (!strcmp(a, "--kv"))
            return fail("bad value '%s' for --kv (auto, f32, f16, bf16, int8 or fp8)", v);
        else if (!strcmp(a, "--batch") && !cli_parse_long(v, 1, 1 << 24, &l))
            sp.n_batch = (int)l;
        else if (!strcmp(a, "--score-from") && !cli_parse_long(v, 1, 1 << 20, &score_from))
            ;
        else if (!strcmp(a, "--stride") && !cli_parse_long(v, 1, 1 << 20, &stride))
            ;
        else if (!strcmp(a, "--threads") && !cli_parse_long(v, 1, 4096, &l))
            mp.n_threads = (int)l;
        else if (!strcmp(a, "--quant") && !cli_parse_quant(v, &mp.quant))
            ;
        else if (!strcmp(a, "--quant-head") && !cli_parse_quant(v, &mp.quant_head))
            ;
        else if (!strcmp(a, "--vram") && !cli_parse_size(v, &mp.vram_budget))
            ;
        else if (!strcmp(a, "--device") && (!strcmp(v, "cpu") || !strcmp(v, "cuda") || !strcmp(v, "auto")))
            mp.device = v[0] == 'c' ? (v[1] == 'p' ? ENGINE_DEVICE_CPU : ENGINE_DEVICE_CUDA) : ENGINE_DEVICE_AUTO;
        else
            return fail("bad option or value: %s %s (see --help)", a, v);
    }
    if (!file == !ids_arg)
        return fail("give the text to score with --file TEXT, or ids with --ids LIST (one of them)");
    if (!ctx_max && window_defaults(ctx, &stride, &score_from))
        return 1;

    char err[512] = "";
    engine_model *model = NULL;
    mp.n_ctx = ctx_max ? ENGINE_CTX_MAX : (int)ctx; /* a GPU placement leaves room for a window */
    if (trace_out_open(&trace, "perplexity"))
        return 1;
    mp.trace = trace.trace;
    if (engine_model_load(model_path, &mp, &model, err, sizeof err) != ENGINE_OK) {
        fail("%s", err);
        trace_out_close(&trace, "perplexity");
        return 1;
    }
    int rc = 1;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    char *text = NULL;
    engine_session *s = NULL;
    double *logprob = NULL;
    state st;
    memset(&st, 0, sizeof st);
    unsigned char *base_file = NULL;

    engine_model_info info;
    engine_model_get_info(model, &info);
    const int vocab = info.vocab_size;
    if (ctx_max) { /* --ctx max: known now that the config is read */
        ctx = info.max_context;
        if (window_defaults(ctx, &stride, &score_from))
            goto done;
    }
    if (file) {
        size_t len = 0;
        if (!(text = cli_read_file(file, &len))) {
            fail("%s: %s", file, strerror(errno));
            goto done;
        }
        if (len == 0) {
            fail("%s: the file is empty", file);
            goto done;
        }
        if (cli_tokenize(engine_model_tokenizer(model), text, len, 1, &ids, &n_ids) != ENGINE_OK) {
            fail("%s: tokenizing failed: %s", file, engine_tokenizer_last_error(engine_model_tokenizer(model)));
            goto done;
        }
    } else {
        long n = cli_parse_ids(ids_arg, &ids);
        if (n <= 0) {
            fail("--ids: a comma-separated list of token ids is expected");
            goto done;
        }
        n_ids = (size_t)n;
        for (size_t i = 0; i < n_ids; i++)
            if (ids[i] < 0 || ids[i] >= vocab) {
                fail("--ids: id %d is outside the vocabulary [0, %d)", (int)ids[i], vocab);
                goto done;
            }
    }
    if (n_ids < (size_t)ctx) {
        fail("%s has %zu tokens, fewer than one window of --ctx %ld", file ? file : "--ids", n_ids, ctx);
        goto done;
    }
    const size_t n_windows = (n_ids - (size_t)ctx) / (size_t)stride + 1;
    const size_t per_window = (size_t)(ctx - score_from);
    st.id = (run_id){(uint32_t)vocab, (uint32_t)ctx, (uint32_t)score_from, (uint32_t)stride,
                     vocab <= FULL_VOCAB_MAX ? 0u : TOP_K, 0, n_ids,
                     n_windows * per_window};
    /* The hash must not depend on the host's byte order: hash the ids as little-endian bytes. */
    {
        uint64_t h = FNV_SEED;
        for (size_t i = 0; i < n_ids; i++) {
            unsigned char b[4];
            put32(b, (uint32_t)ids[i]);
            h = fnv(h, b, 4);
        }
        st.id.ids_hash = h;
    }
    if (base_path) {
        if (load_base(base_path, &st.id, &base_file))
            goto done;
        st.base = base_file + HEADER_BYTES;
        if (!(st.kl = malloc(st.id.count * sizeof *st.kl))) {
            fail("out of memory");
            goto done;
        }
    }
    unsigned char hdr[HEADER_BYTES];
    if (save_path) {
        if (!(st.save = fopen(save_path, "wb"))) {
            fail("%s: %s", save_path, strerror(errno));
            goto done;
        }
        header(&st.id, hdr);
        if (fwrite(hdr, 1, HEADER_BYTES, st.save) != HEADER_BYTES)
            st.io_error = 1;
        st.save_hash = FNV_SEED;
        if (!(st.rec_buf = malloc(record_bytes(&st.id)))) {
            fail("out of memory");
            goto done;
        }
    }
    st.lp = malloc((size_t)vocab * sizeof *st.lp);
    logprob = malloc(per_window * sizeof *logprob);
    sp.n_ctx = (int)ctx;
    if (!st.lp || !logprob || engine_session_create(model, &sp, &s, err, sizeof err) != ENGINE_OK) {
        fail("%s", st.lp && logprob ? err : "out of memory");
        goto done;
    }

    /* Mean NLL and its standard error (llama-perplexity's: over the scored tokens). */
    double sum = 0.0, sum2 = 0.0;
    size_t count = 0;
    const double t0 = now();
    for (size_t w = 0; w < n_windows; w++) {
        const int32_t *win = ids + w * (size_t)stride;
        engine_session_reset(s);
        st.ids = win;
        engine_status es = engine_session_score(s, win, (size_t)ctx, (size_t)score_from, logprob,
                                                st.save || st.base ? on_row : NULL, &st);
        if (es != ENGINE_OK) {
            fail("scoring window %zu: %s", w, engine_session_last_error(s));
            goto done;
        }
        for (size_t i = 0; i < per_window; i++) {
            sum -= logprob[i];
            sum2 += logprob[i] * logprob[i];
        }
        count += per_window;
        const double mean = sum / (double)count;
        fprintf(stderr, "\rperplexity: window %zu/%zu  ppl %.4f", w + 1, n_windows, exp(mean));
    }
    fputc('\n', stderr);
    const double seconds = now() - t0;
    if (st.save) {
        unsigned char tail[8];
        put64(tail, st.save_hash);
        if (fwrite(tail, 1, 8, st.save) != 8)
            st.io_error = 1;
        const int closed = fclose(st.save);
        st.save = NULL;
        if (st.io_error || closed) {
            fail("%s: write failed", save_path);
            goto done;
        }
    }
    const double mean = sum / (double)count;
    const double var = count > 1 ? (sum2 / (double)count - mean * mean) * (double)count / (double)(count - 1) : 0.0;
    const double se_mean = sqrt(var > 0 ? var / (double)count : 0.0);
    const double ppl = exp(mean), ppl_se = ppl * se_mean;
    const double tps = seconds > 0 ? (double)count / seconds : 0.0;

    double kl_mean = 0, kl_se = 0, kl_med = 0, kl_99 = 0, kl_999 = 0, kl_max = 0, top1 = 0, ratio = 0;
    if (st.base) {
        const size_t n = st.id.count;
        double ks = 0, ks2 = 0;
        for (size_t i = 0; i < n; i++) {
            ks += st.kl[i];
            ks2 += st.kl[i] * st.kl[i];
        }
        kl_mean = ks / (double)n;
        const double kv = n > 1 ? (ks2 / (double)n - kl_mean * kl_mean) * (double)n / (double)(n - 1) : 0.0;
        kl_se = sqrt(kv > 0 ? kv / (double)n : 0.0);
        qsort(st.kl, n, sizeof *st.kl, cmp_d);
        kl_med = n % 2 ? st.kl[n / 2] : 0.5 * (st.kl[n / 2 - 1] + st.kl[n / 2]);
        kl_99 = pct(st.kl, n, 0.99);
        kl_999 = pct(st.kl, n, 0.999);
        kl_max = st.kl[n - 1];
        top1 = (double)st.agree / (double)n;
        ratio = ppl / exp(st.base_nll / (double)n);
    }
    if (json) {
        printf("{\"model\": ");
        cli_json_string(stdout, model_path, strlen(model_path));
        printf(", \"ctx\": %ld, \"score_from\": %ld, \"stride\": %ld, \"windows\": %zu, \"tokens\": %zu, "
               "\"ppl\": %.10g, \"ppl_se\": %.10g, \"mean_nll\": %.12g, \"seconds\": %.6g, \"tokens_per_second\": %.6g",
               ctx, score_from, stride, n_windows, count, ppl, ppl_se, mean, seconds, tps);
        if (st.base)
            printf(", \"kl_mean\": %.10g, \"kl_se\": %.10g, \"kl_median\": %.10g, \"kl_p99\": %.10g, "
                   "\"kl_p999\": %.10g, \"kl_max\": %.10g, \"top1\": %.10g, \"ppl_ratio\": %.10g",
                   kl_mean, kl_se, kl_med, kl_99, kl_999, kl_max, top1, ratio);
        printf("}\n");
    } else {
        printf("perplexity: %.4f +/- %.4f over %zu tokens (%zu windows of %ld, scored from %ld), %.1f tokens/s\n", ppl,
               ppl_se, count, n_windows, ctx, score_from, tps);
        if (st.base) {
            printf("KL divergence: mean %.6f +/- %.6f, median %.6f, p99 %.6f, p99.9 %.6f, max %.6f\n", kl_mean, kl_se,
                   kl_med, kl_99, kl_999, kl_max);
            printf("top-1 agreement: %.4f; perplexity ratio %.5f\n", top1, ratio);
        }
    }
    rc = 0;
done:
    if (st.save) {
        fclose(st.save);
        if (save_path)
            remove(save_path); /* a partial file is never left behind */
    }
    free(st.rec_buf);
    free(st.lp);
    free(st.kl);
    free(base_file);
    free(logprob);
    free(ids);
    free(text);
    engine_session_free(s);
    engine_model_free(model);
    if (trace_out_close(&trace, "perplexity") && rc == 0)
        rc = 1;
    return rc;
}
