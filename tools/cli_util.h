/*
 * cli_util.h: what the command-line tools share: strict number parsing,
 * size suffixes, id lists, reading a whole file, JSON string output.
 * Header-only so each tool stays one translation unit.
 */
#ifndef ENGINE_CLI_UTIL_H
#define ENGINE_CLI_UTIL_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

/* Whole string must be an integer in [lo, hi]. */
static inline int cli_parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

static inline int cli_parse_u64(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    if (*s == '-')
        return -1;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end)
        return -1;
    *out = v;
    return 0;
}

/* "8G", "7.5G", "800M", "64K" or plain bytes (binary units) -> bytes; 0 and junk are errors. */
static inline int cli_parse_size(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !(v > 0.0))
        return -1;
    double unit = 1.0;
    switch (*end) {
    case 'k': case 'K': unit = 1024.0; end++; break;
    case 'm': case 'M': unit = 1048576.0; end++; break;
    case 'g': case 'G': unit = 1073741824.0; end++; break;
    case 't': case 'T': unit = 1099511627776.0; end++; break;
    }
    if (*end == 'i' && unit > 1.0)
        end++;
    if ((*end == 'b' || *end == 'B') && unit > 1.0)
        end++;
    if (*end || v * unit > 1.8e19 || v * unit < 1.0)
        return -1;
    *out = (uint64_t)(v * unit);
    return 0;
}

static inline int cli_parse_float(const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi))
        return -1;
    *out = v;
    return 0;
}

/* A bandwidth in GB/s: a number above 0 and at most 100,000 (junk, 0, negatives, inf and nan are errors). */
static inline int cli_parse_gbps(const char *s, double *out)
{
    return cli_parse_float(s, 1e-6, 1e5, out);
}

/* "1,2,3" -> malloc'd ids; returns count, or -1 on a malformed list. */
static inline long cli_parse_ids(const char *s, int32_t **out)
{
    size_t cap = 16, n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids)
        return -1;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < 0 || v > INT32_MAX || (*end && *end != ',')) {
            free(ids);
            return -1;
        }
        if (n == cap) {
            int32_t *g = realloc(ids, (cap *= 2) * sizeof *ids);
            if (!g) {
                free(ids);
                return -1;
            }
            ids = g;
        }
        ids[n++] = (int32_t)v;
        p = *end ? end + 1 : end;
        if (*end == ',' && !*p) { /* trailing comma */
            free(ids);
            return -1;
        }
    }
    *out = ids;
    return (long)n;
}

/* Whole file (or stdin for "-") into a malloc'd buffer; NULL on failure with errno set. */
static inline char *cli_read_file(const char *path, size_t *len)
{
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n + 1 >= cap) {
            char *g = realloc(buf, cap *= 2);
            if (!g) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = g;
        }
        size_t k = fread(buf + n, 1, cap - n - 1, f);
        n += k;
        if (k == 0)
            break;
    }
    int bad = ferror(f);
    if (f != stdin)
        fclose(f);
    if (!buf || bad) {
        free(buf);
        if (bad)
            errno = EIO;
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

/* Write s[0..n) as a JSON string literal (UTF-8 passed through, controls escaped). */
static inline void cli_json_string(FILE *f, const char *s, size_t n)
{
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        switch (c) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\r': fputs("\\r", f); break;
        case '\t': fputs("\\t", f); break;
        default:
            if (c < 0x20)
                fprintf(f, "\\u%04x", c);
            else
                fputc(c, f);
        }
    }
    fputc('"', f);
}

static inline void cli_json_ids(FILE *f, const int32_t *ids, size_t n)
{
    fputc('[', f);
    for (size_t i = 0; i < n; i++)
        fprintf(f, "%s%d", i ? "," : "", (int)ids[i]);
    fputc(']', f);
}

/* Tokenize into a malloc'd array sized to fit (retrying once if the first guess was short). */
static inline engine_status cli_tokenize(const engine_tokenizer *tok, const char *text, size_t len, int special,
                                         int32_t **ids, size_t *n)
{
    size_t cap = len + 8;
    *ids = NULL;
    for (int attempt = 0; attempt < 2; attempt++) {
        int32_t *buf = realloc(*ids, cap * sizeof *buf);
        if (!buf)
            return ENGINE_ERR_OUT_OF_MEMORY;
        *ids = buf;
        engine_status st = engine_tokenize(tok, text, len, special, buf, cap, n);
        if (st != ENGINE_ERR_BUFFER_TOO_SMALL)
            return st;
        cap = *n;
    }
    return ENGINE_ERR_BUFFER_TOO_SMALL;
}

/* "int8", "int8-g128", "nf4", "nf4-dq", "fp4" or "none" -> the quantization; 0, or -1 for junk. */
static inline int cli_parse_quant(const char *s, engine_quant *out)
{
    static const struct {
        const char *name;
        engine_quant q;
    } QUANTS[] = {{"int8", ENGINE_QUANT_INT8}, {"int8-g128", ENGINE_QUANT_INT8_G128}, {"nf4", ENGINE_QUANT_NF4},
                  {"nf4-dq", ENGINE_QUANT_NF4_DQ}, {"fp4", ENGINE_QUANT_FP4}, {"none", ENGINE_QUANT_NONE}};
    for (size_t k = 0; k < sizeof QUANTS / sizeof QUANTS[0]; k++)
        if (!strcmp(s, QUANTS[k].name)) {
            *out = QUANTS[k].q;
            return 0;
        }
    return -1;
}

#endif
