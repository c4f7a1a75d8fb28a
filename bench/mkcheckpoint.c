/*
 * mkcheckpoint.c: writes a random-weight Hugging Face checkpoint (Llama,
 * Gemma 2, Gemma 3 text, Phi-3, or the mixture-of-experts Mixtral, Qwen3-MoE
 * and OLMoE layouts, experts stored per expert as transformers saves them)
 * (config.json and model.safetensors, or shards and an index past the shard
 * size, named as transformers names them) so that loading and throughput can
 * be measured at real model shapes without downloading weights.
 *
 * Standalone on purpose (libc and libm only, not the engine): a benchmark
 * input must not depend on the code it measures.
 *
 *   mkcheckpoint --shape llama-3.2-1b|llama-3.1-8b|gemma-2-9b|gemma-3-4b|phi-3.5-mini|
 *                        mixtral-8x7b|qwen3-30b-a3b|olmoe-1b-7b|tiny
 *                --dtype bf16|f16|f32 [--quant nf4-dq] [--seed S] [--shard-size 5G] OUTDIR
 *
 * Weights are uniform with std 0.02 (norm weights 1.0, Gemma's 0.0: its
 * norms scale by 1 + w), drawn per tensor from a stream seeded by (seed,
 * tensor index): the same seed gives the same bytes. The shapes are the
 * published configs' (Gemma 3 4B: its text model, as Gemma3ForCausalLM);
 * Phi-3.5-mini's longrope factors are made up (48 of each, as its head needs),
 * not Microsoft's. MoE routers are random like the rest, so routing is
 * near uniform (trained routers are not).
 *
 * --quant nf4-dq writes the linear weights (*_proj and experts' w1/w2/w3)
 * already quantized, in docs/FORMATS.md's layout (bitsandbytes NF4, blocks
 * of 64, the absmax double-quantized), so a shape larger than the disk in
 * bf16 (Mixtral-8x7B: 93 GB) can be written directly: 4.5 bits a weight.
 * The values quantized are the ones the dense file would hold (same seed,
 * rounded to --dtype), quantized as tools/quantize does, so quantizing the
 * dense file gives the same tensors.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "mkcheckpoint.h"
#include "mkcheckpoint_nf4.h"

typedef struct shard_def {
    char name[64], tmp[4096], path[4096];
    uint64_t bytes;
    bool written;
} shard_def;

/* ------------------------------------------------------------ numbers */

/* splitmix64: the state advances by a constant step a draw. */
#define SPLITMIX_STEP 0x9E3779B97F4A7C15ull
static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += SPLITMIX_STEP);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16); /* nearest even; inputs are finite */
}

static uint16_t f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    const uint32_t ax = x & 0x7FFFFFFFu;
    if (ax >= 0x7F800000u)
        return sign | 0x7C00u | (ax > 0x7F800000u ? 0x200u : 0u);
    if (ax >= 0x477FF000u) /* rounds past 65504 */
        return sign | 0x7C00u;
    if (ax < 0x38800000u) /* below 2^-14: a subnormal, counted in units of 2^-24 */
        return sign | (uint16_t)lrintf(fabsf(f) * 16777216.0f);
    const uint32_t r = ax + 0x0FFFu + ((ax >> 13) & 1u) - 0x38000000u; /* nearest even, rebias 127 -> 15 */
    return sign | (uint16_t)(r >> 13);
}

/* ------------------------------------------------------------ errors */

void fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("mkcheckpoint: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: mkcheckpoint --shape llama-3.2-1b|llama-3.1-8b|gemma-2-9b|gemma-3-4b|phi-3.5-mini|\n"
               "                            mixtral-8x7b|qwen3-30b-a3b|olmoe-1b-7b|tiny\n"
               "                    --dtype bf16|f16|f32 [--quant nf4-dq] [--seed S] [--shard-size 5G] OUTDIR\n"
               "Writes OUTDIR/config.json and random weights as OUTDIR/model.safetensors, or as\n"
               "model-0000i-of-0000n.safetensors shards plus model.safetensors.index.json when\n"
               "larger than --shard-size (K/M/G/T = powers of 1000, KiB/MiB/GiB/TiB = of 1024;\n"
               "default 5G, as transformers). --quant nf4-dq writes the linear weights quantized\n"
               "(bitsandbytes NF4, double-quantized; docs/FORMATS.md), the rest in --dtype.\n");
}

/* "5G", "500MB", "2GiB", "123" -> bytes; 0 on a bad value. */
static uint64_t parse_size(const char *s)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !(v > 0))
        return 0;
    double mult = 1;
    const char *units = "KMGT";
    const char *u = *end ? strchr(units, *end) : NULL;
    if (u) {
        bool binary = end[1] == 'i';
        mult = pow(binary ? 1024.0 : 1000.0, (double)(u - units + 1));
        end += binary ? 2 : 1;
        if (binary && *end != 'B')
            return 0;
    }
    if (*end == 'B')
        end++;
    if (*end || v * mult >= 1.8e19)
        return 0;
    return (uint64_t)(v * mult);
}

/* ------------------------------------------------------------ writing */

typedef struct progress {
    uint64_t done, total;
    double t0, last;
    bool tty;
} progress;

/* "812.3 MB", "16.06 GB": small shapes should not print as 0.00 GB. */
static const char *fmt_bytes(char *buf, size_t n, uint64_t b)
{
    if (b >= 1000000000ull)
        snprintf(buf, n, "%.2f GB", b / 1e9);
    else if (b >= 1000000ull)
        snprintf(buf, n, "%.1f MB", b / 1e6);
    else
        snprintf(buf, n, "%.1f KB", b / 1e3);
    return buf;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void progress_show(progress *p, const char *file, bool final)
{
    double t = now_s();
    if (!final && (!p->tty || t - p->last < 0.25))
        return;
    p->last = t;
    double el = t - p->t0;
    char a[32], b[32];
    fprintf(stderr, "%s%s: %s / %s (%3.0f%%), %.2f GB/s   %s", p->tty ? "\r" : "", file,
            fmt_bytes(a, sizeof a, p->done), fmt_bytes(b, sizeof b, p->total),
            p->total ? 100.0 * (double)p->done / (double)p->total : 100.0, el > 0 ? p->done / 1e9 / el : 0.0,
            final ? "\n" : "");
}

static int write_all(FILE *f, const char *path, const void *p, size_t n)
{
    errno = 0;
    if (n && fwrite(p, 1, n, f) != n) {
        fail("%s: write failed: %s", path, strerror(errno ? errno : EIO));
        return -1;
    }
    return 0;
}

int text_add(text *t, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->s ? t->s + t->len : NULL, t->s ? t->cap - t->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0)
            return -1;
        if (t->s && t->len + (size_t)n < t->cap) {
            t->len += (size_t)n;
            return 0;
        }
        size_t cap = t->cap ? t->cap * 2 : 4096;
        while (cap < t->len + (size_t)n + 1)
            cap *= 2;
        char *s = realloc(t->s, cap);
        if (!s) {
            fail("out of memory");
            return -1;
        }
        t->s = s;
        t->cap = cap;
    }
}

/* Tensor `index`'s random stream. */
static uint64_t tensor_stream(uint64_t seed, int index)
{
    uint64_t state = seed ^ (0xD1B54A32D192ED03ull * (uint64_t)(index + 1));
    splitmix64(&state);
    return state;
}

/* The next n values of t from its stream (*state), as fp32. */
static void fill_values(const tensor_def *t, uint64_t *state, float *v, size_t n)
{
    /* std 0.02 from a uniform on [-a, a]: a = 0.02 * sqrt(3). */
    const float a = 0.034641016f;
    if (t->norm) {
        for (size_t i = 0; i < n; i++)
            v[i] = t->value;
        return;
    }
    for (size_t i = 0; i < n; i += 2) {
        /* Two 24-bit uniforms per 64-bit draw. */
        uint64_t r = splitmix64(state);
        v[i] = ((float)(r >> 40) * (2.0f / 16777216.0f) - 1.0f) * a;
        if (i + 1 < n)
            v[i + 1] = ((float)((r >> 8) & 0xFFFFFFu) * (2.0f / 16777216.0f) - 1.0f) * a;
    }
}

/* Fill one tensor's bytes in chunks; chunking does not change the values. */
static int write_tensor(FILE *f, const char *path, const tensor_def *t, int index, uint64_t seed, dtype_t dt,
                        float *buf, uint16_t *half, size_t buf_elems, progress *pg, const char *label)
{
    uint64_t state = tensor_stream(seed, index);
    uint64_t left = t->n;
    while (left) {
        size_t n = left < buf_elems ? (size_t)left : buf_elems;
        float *v = buf; /* f32 first, then narrowed into half */
        fill_values(t, &state, v, n);
        if (dt == DT_BF16)
            for (size_t i = 0; i < n; i++)
                half[i] = f32_to_bf16(v[i]);
        else if (dt == DT_F16)
            for (size_t i = 0; i < n; i++)
                half[i] = f32_to_f16(v[i]);
        if (write_all(f, path, dt == DT_F32 ? (const void *)v : (const void *)half, n * dtypes[dt].size))
            return -1;
        left -= n;
        pg->done += n * dtypes[dt].size;
        progress_show(pg, label, false);
    }
    return 0;
}

/* ------------------------------------------------------------ nf4-dq */

/* One quantized weight, computed when its first part is written. */
typedef struct nf4_state {
    uint8_t *packed, *absmax_q;
    float *nested, map[256], offset;
    char json[256];
} nf4_state;

static void nf4_free(nf4_state *q)
{
    free(q->packed);
    free(q->absmax_q);
    free(q->nested);
    q->packed = q->absmax_q = NULL;
    q->nested = NULL;
}

/* The quant_state JSON, the offset at a fixed width (%.9e of a finite
 * non-negative mean: 15 characters), padded with spaces to len. */
static int state_json(char *buf, size_t cap, dtype_t dt, int64_t rows, int64_t cols, float offset, size_t len)
{
    int n = snprintf(buf, cap,
                     "{\"quant_type\": \"nf4\", \"blocksize\": %d, \"dtype\": \"%s\", \"shape\": [%" PRId64 ", %" PRId64
                     "], \"nested_blocksize\": %d, \"nested_dtype\": \"float32\", \"nested_offset\": %.9e}",
                     NF4_BLOCK, dtypes[dt].torch_name, rows, cols, NESTED_BLOCK, (double)offset);
    while (n >= 0 && (size_t)n < len && (size_t)n + 1 < cap)
        buf[n++] = ' ', buf[n] = '\0';
    return n;
}

/* The matrix of t's weight as the dense file holds it (rounded to dt), quantized. */
static int nf4_compute(const tensor_def *t, uint64_t seed, dtype_t dt, nf4_state *q)
{
    nf4_free(q);
    const uint64_t n = (uint64_t)t->mrows * (uint64_t)t->mcols, nb = (n + NF4_BLOCK - 1) / NF4_BLOCK;
    const uint64_t nn = (nb + NESTED_BLOCK - 1) / NESTED_BLOCK;
    float *x = malloc(n * sizeof *x), *am = malloc(nb * sizeof *am);
    q->packed = calloc((n + 1) / 2, 1);
    q->absmax_q = malloc(nb);
    q->nested = malloc(nn * sizeof *q->nested);
    int rc = x && am && q->packed && q->absmax_q && q->nested ? 0 : -1;
    if (rc == 0) {
        /* The values the dense file would hold: the same stream, rounded to dt.
         * A draw advances the stream by one step and gives two values, so a
         * chunk starting at an even i starts at step i / 2: chunks fill in
         * parallel and give the values one pass would. */
        const uint64_t state0 = tensor_stream(seed, t->src), chunk = 4096;
        const int64_t n_chunks = (int64_t)((n + chunk - 1) / chunk);
#pragma omp parallel for schedule(static)
        for (int64_t c = 0; c < n_chunks; c++) {
            const uint64_t i0 = (uint64_t)c * chunk, len = n - i0 < chunk ? n - i0 : chunk;
            uint64_t state = state0 + (i0 / 2) * SPLITMIX_STEP;
            float *xc = x + i0;
            fill_values(t, &state, xc, (size_t)len);
            if (dt == DT_BF16)
                for (uint64_t i = 0; i < len; i++) {
                    const uint32_t u = (uint32_t)f32_to_bf16(xc[i]) << 16;
                    memcpy(&xc[i], &u, 4);
                }
            else if (dt == DT_F16)
                for (uint64_t i = 0; i < len; i++) {
                    const uint16_t h = f32_to_f16(xc[i]);
                    const int e = (h >> 10) & 31, m = h & 1023;
                    const float v = e ? ldexpf((float)(m | 1024), e - 25) : ldexpf((float)m, -24);
                    xc[i] = h & 0x8000 ? -v : v;
                }
        }
    }
    if (rc == 0)
        nf4dq_quantize(x, n, am, q->packed, q->absmax_q, q->nested, q->map, &q->offset);
    if (rc)
        fail("out of memory quantizing %s", t->name);
    free(x);
    free(am);
    return rc;
}

static int write_quant_part(FILE *f, const char *path, const tensor_def *t, uint64_t seed, dtype_t dt, nf4_state *q,
                            progress *pg, const char *label)
{
    if (t->part == P_QMAP && nf4_compute(t, seed, dt, q))
        return -1;
    const void *p = NULL;
    switch (t->part) {
    case P_QMAP: p = NF4_CODE; break;
    case P_NABS: p = q->nested; break;
    case P_NMAP: p = q->map; break;
    case P_DATA: p = q->packed; break;
    case P_ABSMAX: p = q->absmax_q; break;
    case P_STATE:
        state_json(q->json, sizeof q->json, dt, t->mrows, t->mcols, q->offset, (size_t)t->bytes);
        if (strlen(q->json) != t->bytes) {
            fail("%s: quant_state of %zu bytes, planned %" PRIu64, t->name, strlen(q->json), t->bytes);
            return -1;
        }
        p = q->json;
        break;
    default: return -1;
    }
    if (write_all(f, path, p, (size_t)t->bytes))
        return -1;
    pg->done += t->bytes;
    progress_show(pg, label, false);
    return 0;
}

static int write_shard(shard_def *sh, int shard, const tensor_def *ts, int n_t, uint64_t seed, dtype_t dt,
                       progress *pg)
{
    text h = {0};
    int rc = -1;
    FILE *f = NULL;
    bool quant = false;
    for (int i = 0; i < n_t; i++)
        quant |= ts[i].part != P_DENSE;
    if (text_add(&h, "{\"__metadata__\":{\"format\":\"pt\",\"generator\":\"mkcheckpoint\",\"seed\":\"%" PRIu64 "\"%s}",
                 seed, quant ? ",\"quantization\":\"nf4-dq\"" : ""))
        goto out;
    for (int i = 0; i < n_t; i++) {
        const tensor_def *t = &ts[i];
        char dims[48];
        if (t->cols)
            snprintf(dims, sizeof dims, "%" PRId64 ",%" PRId64, t->rows, t->cols);
        else
            snprintf(dims, sizeof dims, "%" PRId64, t->rows);
        const char *sdt = t->part == P_DENSE                                     ? dtypes[dt].st_name
                          : t->part == P_QMAP || t->part == P_NABS || t->part == P_NMAP ? "F32"
                                                                                    : "U8";
        if (t->shard == shard &&
            text_add(&h, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%s],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}",
                     t->name, sdt, dims, t->offset, t->offset + t->bytes))
            goto out;
    }
    if (text_add(&h, "}"))
        goto out;
    /* Pad with spaces so the data area starts 8-aligned, as the reference writer does. */
    while (h.len % 8)
        if (text_add(&h, " "))
            goto out;

    f = fopen(sh->tmp, "wb");
    if (!f) {
        fail("%s: cannot create: %s", sh->tmp, strerror(errno));
        goto out;
    }
    sh->written = true;
    setvbuf(f, NULL, _IONBF, 0); /* we write in large blocks ourselves */
    unsigned char len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)((uint64_t)h.len >> (8 * i));
    if (write_all(f, sh->tmp, len8, 8) || write_all(f, sh->tmp, h.s, h.len))
        goto out;

    const size_t buf_elems = (size_t)4 << 20; /* 8-16 MB per write */
    float *buf = malloc(buf_elems * sizeof *buf);
    uint16_t *half = malloc(buf_elems * sizeof *half);
    rc = buf && half ? 0 : -1;
    if (rc)
        fail("out of memory");
    nf4_state q = {0};
    for (int i = 0; i < n_t && rc == 0; i++) {
        if (ts[i].shard != shard)
            continue;
        if (ts[i].part == P_DENSE)
            rc = write_tensor(f, sh->tmp, &ts[i], ts[i].src, seed, dt, buf, half, buf_elems, pg, sh->name);
        else
            rc = write_quant_part(f, sh->tmp, &ts[i], seed, dt, &q, pg, sh->name);
    }
    nf4_free(&q);
    free(buf);
    free(half);
out:
    if (f && fclose(f) != 0 && rc == 0) {
        fail("%s: write failed on close: %s", sh->tmp, strerror(errno));
        rc = -1;
    }
    free(h.s);
    return rc;
}

/* Write text to path through a temporary name, so a reader never sees half a file. */
static int write_text_file(const char *path, const char *s)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        fail("%s: cannot create: %s", tmp, strerror(errno));
        return -1;
    }
    int rc = write_all(f, tmp, s, strlen(s));
    if (fclose(f) != 0 && rc == 0) {
        fail("%s: write failed on close: %s", tmp, strerror(errno));
        rc = -1;
    }
    if (rc == 0 && rename(tmp, path) != 0) {
        fail("%s: cannot rename to %s: %s", tmp, path, strerror(errno));
        rc = -1;
    }
    if (rc)
        unlink(tmp);
    return rc;
}

static int tensor_name_cmp(const void *a, const void *b)
{
    return strcmp(((const tensor_def *)a)->name, ((const tensor_def *)b)->name);
}

/* Each linear weight of ts[n] replaced by its six nf4-dq parts (FORMATS.md). */
static int expand_quant(tensor_def **ts, int n, dtype_t dt)
{
    int m = 0;
    for (int i = 0; i < n; i++)
        m += is_linear((*ts)[i].name) ? 6 : 1;
    tensor_def *o = calloc((size_t)m, sizeof *o);
    if (!o) {
        fail("out of memory");
        return -1;
    }
    int k = 0;
    for (int i = 0; i < n; i++) {
        const tensor_def *t = &(*ts)[i];
        if (!is_linear(t->name)) {
            o[k++] = *t;
            continue;
        }
        const uint64_t nel = (uint64_t)t->rows * (uint64_t)t->cols, nb = (nel + NF4_BLOCK - 1) / NF4_BLOCK;
        const uint64_t nn = (nb + NESTED_BLOCK - 1) / NESTED_BLOCK;
        char js[256];
        const size_t jl = (size_t)state_json(js, sizeof js, dt, t->rows, t->cols, 0.0f, 0);
        const uint64_t f32 = 16 * 4 + nn * 4 + 256 * 4, u8 = (nel + 1) / 2 + nb;
        const uint64_t pad = (8 - (f32 + u8 + jl) % 8) % 8;
        static const struct {
            part_t part;
            const char *suffix;
        } P[6] = {{P_QMAP, ".quant_map"}, {P_NABS, ".nested_absmax"}, {P_NMAP, ".nested_quant_map"},
                  {P_DATA, ""},           {P_ABSMAX, ".absmax"},      {P_STATE, ".quant_state.bitsandbytes__nf4"}};
        const uint64_t rows[6] = {16, nn, 256, (nel + 1) / 2, nb, jl + pad};
        for (int p = 0; p < 6; p++) {
            tensor_def *q = &o[k++];
            *q = *t;
            snprintf(q->name, sizeof q->name, "%s%s", t->name, P[p].suffix);
            q->part = P[p].part;
            q->mrows = t->rows, q->mcols = t->cols;
            q->rows = (int64_t)rows[p];
            q->cols = p == 3 ? 1 : 0; /* the packed codes: [n/2, 1], as bitsandbytes stores them */
            q->n = rows[p];
            q->bytes = rows[p] * (p < 3 ? 4 : 1);
            q->group = p == 0 ? f32 + u8 + jl + pad : 0;
        }
    }
    free(*ts);
    *ts = o;
    return k;
}

/* Everything after the arguments: 0 on success, 1 with a message printed. */
static int run(const shape_def *shape, dtype_t dt, bool quant, uint64_t seed, uint64_t shard_size, const char *outdir)
{
    tensor_def *ts;
    int n_t = build_tensors(shape, dt, &ts);
    if (n_t < 0)
        return 1;
    if (quant && (n_t = expand_quant(&ts, n_t, dt)) < 0)
        return 1;
    /* Shards as transformers cuts them: start a new one when the next tensor
     * would pass the limit (a tensor larger than the limit gets its own). */
    int n_shards = 1;
    uint64_t fill = 0, total = 0, params = 0;
    for (int i = 0; i < n_t; i++) {
        /* A quantized weight's parts stay together (its group). */
        const uint64_t unit = ts[i].part == P_DENSE ? ts[i].bytes : ts[i].group;
        if ((ts[i].part == P_DENSE || ts[i].part == P_QMAP) && fill > 0 && fill + unit > shard_size) {
            n_shards++;
            fill = 0;
        }
        ts[i].shard = n_shards - 1;
        ts[i].offset = fill;
        if (ts[i].part != P_DENSE && ts[i].part < P_DATA && ts[i].offset % 4) {
            fail("%s: offset %" PRIu64 " is not 4-byte aligned", ts[i].name, ts[i].offset);
            free(ts);
            return 1;
        }
        fill += ts[i].bytes;
        total += ts[i].bytes;
        params += ts[i].part == P_DENSE ? ts[i].n : ts[i].part == P_QMAP ? (uint64_t)(ts[i].mrows * ts[i].mcols) : 0;
    }
    shard_def *sh = calloc((size_t)n_shards, sizeof *sh);
    if (!sh) {
        fail("out of memory");
        free(ts);
        return 1;
    }
    for (int i = 0; i < n_shards; i++) {
        if (n_shards == 1)
            snprintf(sh[i].name, sizeof sh[i].name, "model.safetensors");
        else
            snprintf(sh[i].name, sizeof sh[i].name, "model-%05d-of-%05d.safetensors", i + 1, n_shards);
        snprintf(sh[i].path, sizeof sh[i].path, "%s/%s", outdir, sh[i].name);
        snprintf(sh[i].tmp, sizeof sh[i].tmp, "%s/.%s.tmp", outdir, sh[i].name);
    }

    struct statvfs vfs;
    if (statvfs(outdir, &vfs) == 0) {
        uint64_t free_b = (uint64_t)vfs.f_bavail * (uint64_t)vfs.f_frsize;
        /* Old files stay until the new ones are complete: this is the space the run needs. */
        const uint64_t headroom = (uint64_t)16 << 20;
        if (free_b < total + headroom) {
            char a[32], b[32];
            fail("%s: needs %s plus 16 MB of headroom, only %s free", outdir, fmt_bytes(a, sizeof a, total),
                 fmt_bytes(b, sizeof b, free_b));
            free(sh);
            free(ts);
            return 1;
        }
    }

    char tb[32];
    fprintf(stderr, "mkcheckpoint: %s %s%s seed %" PRIu64 ": %.2f M params, %s in %d file%s -> %s\n", shape->name,
            dtypes[dt].opt, quant ? " (linear weights nf4-dq)" : "", seed, params / 1e6, fmt_bytes(tb, sizeof tb, total), n_shards, n_shards > 1 ? "s" : "",
            outdir);
    progress pg = {0, total, now_s(), 0, isatty(2) != 0};
    int rc = 0;
    for (int i = 0; i < n_shards && rc == 0; i++)
        rc = write_shard(&sh[i], i, ts, n_t, seed, dt, &pg);
    if (rc == 0)
        progress_show(&pg, n_shards > 1 ? "all shards" : sh[0].name, true);
    else if (pg.tty)
        fputc('\n', stderr);
    for (int i = 0; i < n_shards && rc == 0; i++)
        if (rename(sh[i].tmp, sh[i].path) != 0) {
            fail("%s: cannot rename to %s: %s", sh[i].tmp, sh[i].path, strerror(errno));
            rc = -1;
        }
    /* Whatever a failed run left half-written goes; nothing named like the
     * result may be partial. */
    for (int i = 0; i < n_shards && rc != 0; i++)
        if (sh[i].written)
            unlink(sh[i].tmp);

    char path[4200];
    text t = {0};
    if (rc == 0) {
        /* A stale index (or single file) from an earlier run with another
         * sharding would be found first by a loader; it must not survive. */
        snprintf(path, sizeof path, "%s/%s", outdir,
                 n_shards > 1 ? "model.safetensors" : "model.safetensors.index.json");
        if (unlink(path) != 0 && errno != ENOENT) {
            fail("%s: cannot remove stale file: %s", path, strerror(errno));
            rc = -1;
        }
    }
    if (rc == 0 && n_shards > 1) {
        /* Index keys sorted, as transformers writes them. */
        tensor_def *sorted = malloc((size_t)n_t * sizeof *sorted);
        rc = sorted ? 0 : -1;
        if (sorted) {
            memcpy(sorted, ts, (size_t)n_t * sizeof *sorted);
            qsort(sorted, (size_t)n_t, sizeof *sorted, tensor_name_cmp);
            rc = text_add(&t, "{\n  \"metadata\": {\n    \"total_size\": %" PRIu64 "\n  },\n  \"weight_map\": {\n",
                          total);
            for (int i = 0; i < n_t && rc == 0; i++)
                rc = text_add(&t, "    \"%s\": \"%s\"%s\n", sorted[i].name, sh[sorted[i].shard].name,
                              i + 1 < n_t ? "," : "");
            if (rc == 0)
                rc = text_add(&t, "  }\n}\n");
            free(sorted);
        }
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", outdir);
        if (rc == 0)
            rc = write_text_file(path, t.s);
        t.len = 0;
    }
    if (rc == 0) {
        snprintf(path, sizeof path, "%s/config.json", outdir);
        rc = config_json(&t, shape, dt);
        if (rc == 0)
            rc = write_text_file(path, t.s);
    }
    free(t.s);
    free(sh);
    free(ts);
    if (rc != 0)
        return 1;
    fprintf(stderr, "mkcheckpoint: wrote %s in %.1f s\n", outdir, now_s() - pg.t0);
    return 0;
}

int main(int argc, char **argv)
{
    const shape_def *shape = NULL;
    int dt = -1;
    uint64_t seed = 0, shard_size = 5000000000ull;
    const char *outdir = NULL;
    bool quant = false;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = NULL;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        }
        if (strncmp(a, "--", 2) != 0) {
            if (outdir) {
                fail("more than one OUTDIR ('%s' and '%s')", outdir, a);
                return 2;
            }
            outdir = a;
            continue;
        }
        /* --opt value or --opt=value */
        char opt[32];
        const char *eq = strchr(a, '=');
        size_t ol = eq ? (size_t)(eq - a) : strlen(a);
        if (ol >= sizeof opt) {
            fail("unknown option '%s'", a);
            usage(stderr);
            return 2;
        }
        memcpy(opt, a, ol);
        opt[ol] = '\0';
        if (strcmp(opt, "--shape") && strcmp(opt, "--dtype") && strcmp(opt, "--seed") && strcmp(opt, "--shard-size") &&
            strcmp(opt, "--quant")) {
            fail("unknown option '%s'", opt);
            usage(stderr);
            return 2;
        }
        val = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!val || !*val) {
            fail("%s needs a value", opt);
            return 2;
        }
        if (strcmp(opt, "--shape") == 0) {
            shape = shape_find(val);
            if (!shape) {
                fail("unknown shape '%s' (llama-3.2-1b, llama-3.1-8b, gemma-2-9b, gemma-3-4b, phi-3.5-mini, "
                     "mixtral-8x7b, qwen3-30b-a3b, olmoe-1b-7b, tiny)", val);
                return 2;
            }
        } else if (strcmp(opt, "--dtype") == 0) {
            dt = -1;
            for (int k = 0; k < 3; k++)
                if (strcmp(val, dtypes[k].opt) == 0)
                    dt = k;
            if (dt < 0) {
                fail("unknown dtype '%s' (bf16, f16, f32)", val);
                return 2;
            }
        } else if (strcmp(opt, "--quant") == 0) {
            if (strcmp(val, "nf4-dq") != 0) {
                fail("unknown --quant '%s' (nf4-dq)", val);
                return 2;
            }
            quant = true;
        } else if (strcmp(opt, "--seed") == 0) {
            char *end;
            errno = 0;
            seed = strtoull(val, &end, 0);
            if (errno || *end || *val == '-') {
                fail("bad seed '%s' (an unsigned integer)", val);
                return 2;
            }
        } else {
            shard_size = parse_size(val);
            if (!shard_size) {
                fail("bad shard size '%s' (e.g. 5G, 500M, 2GiB)", val);
                return 2;
            }
        }
    }
    if (!shape || dt < 0 || !outdir) {
        fail("%s is required", !shape ? "--shape" : dt < 0 ? "--dtype" : "OUTDIR");
        usage(stderr);
        return 2;
    }
    if (strlen(outdir) > 3000) {
        fail("OUTDIR path too long");
        return 2;
    }

    struct stat sb;
    bool made_dir = false;
    if (stat(outdir, &sb) != 0) {
        if (errno != ENOENT || mkdir(outdir, 0777) != 0) {
            fail("%s: cannot create folder: %s", outdir, strerror(errno));
            return 1;
        }
        made_dir = true;
    } else if (!S_ISDIR(sb.st_mode)) {
        fail("%s: exists and is not a folder", outdir);
        return 1;
    }
    if (access(outdir, W_OK) != 0) {
        fail("%s: folder is not writable: %s", outdir, strerror(errno));
        return 1;
    }
    int rc = run(shape, (dtype_t)dt, quant, seed, shard_size, outdir);
    if (rc != 0 && made_dir)
        rmdir(outdir); /* only succeeds if nothing is left in it */
    return rc;
}

