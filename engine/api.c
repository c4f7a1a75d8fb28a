/*
 * api.c: the small public calls that belong to no larger module: version,
 * status names, and the tokenizer and streaming-decoder handles wrapped
 * around loaders/tokenizer.
 */
#define _POSIX_C_SOURCE 200809L /* mmap, clock_gettime, PATH_MAX under -std=c11 */

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "chat.h"
#include "model.h"

unsigned engine_version_number(void)
{
    return ENGINE_VERSION_NUMBER;
}

#define STR2(x) #x
#define STR(x) STR2(x)
const char *engine_version_string(void)
{
    return STR(ENGINE_VERSION_MAJOR) "." STR(ENGINE_VERSION_MINOR) "." STR(ENGINE_VERSION_PATCH);
}

const char *engine_format_bytes(uint64_t b, char *buf, size_t n)
{
    if (!buf || n == 0)
        return buf;
    if (b >= (uint64_t)1 << 30)
        snprintf(buf, n, "%.2f GiB", b / 1073741824.0);
    else if (b >= (uint64_t)1 << 20)
        snprintf(buf, n, "%.1f MiB", b / 1048576.0);
    else if (b >= 1024)
        snprintf(buf, n, "%.1f KiB", b / 1024.0);
    else
        snprintf(buf, n, "%llu B", (unsigned long long)b);
    return buf;
}

const char *engine_status_str(engine_status s)
{
    switch (s) {
    case ENGINE_OK: return "ok";
    case ENGINE_ERR_INVALID_ARG: return "invalid argument";
    case ENGINE_ERR_OUT_OF_MEMORY: return "out of memory";
    case ENGINE_ERR_OVER_BUDGET: return "over the memory budget";
    case ENGINE_ERR_IO: return "I/O error";
    case ENGINE_ERR_FORMAT: return "bad format";
    case ENGINE_ERR_UNSUPPORTED: return "unsupported";
    case ENGINE_ERR_CUDA: return "CUDA error";
    case ENGINE_ERR_CONTEXT_FULL: return "context full";
    case ENGINE_ERR_BUFFER_TOO_SMALL: return "buffer too small";
    }
    return "unknown status";
}

static const char *const kv_names[] = {"auto", "f32", "f16", "bf16", "int8", "fp8"};

const char *engine_kv_type_name(engine_kv_type t)
{
    return (unsigned)t < sizeof kv_names / sizeof kv_names[0] ? kv_names[t] : NULL;
}

int engine_kv_type_parse(const char *name)
{
    for (int i = 0; name && i < (int)(sizeof kv_names / sizeof kv_names[0]); i++)
        if (strcmp(name, kv_names[i]) == 0)
            return i;
    return -1;
}

engine_status engine_tokenizer_load(const char *path, engine_tokenizer **out, char *err, size_t err_size)
{
    err_buf e;
    err_clear(&e);
    if (out)
        *out = NULL;
    if (!path || !out) {
        err_set(&e, ENGINE_ERR_INVALID_ARG, "engine_tokenizer_load: path and out must not be NULL");
        err_copy_out(&e, err, err_size);
        return ENGINE_ERR_INVALID_ARG;
    }
    char json[PATH_MAX + 32], dir[PATH_MAX], cfg[PATH_MAX + 32];
    struct stat st;
    if (stat(path, &st) != 0) {
        err_set(&e, ENGINE_ERR_IO, "%s: no such file or folder", path);
        err_copy_out(&e, err, err_size);
        return ENGINE_ERR_IO;
    }
    if (S_ISDIR(st.st_mode)) {
        snprintf(dir, sizeof dir, "%s", path);
        snprintf(json, sizeof json, "%s/tokenizer.json", path);
    } else {
        snprintf(json, sizeof json, "%s", path);
        snprintf(dir, sizeof dir, "%s", path);
        char *slash = strrchr(dir, '/');
        if (slash)
            *slash = '\0';
        else
            snprintf(dir, sizeof dir, ".");
        /* A tokenizer_config.json stands for the tokenizer beside it. */
        const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
        if (!strcmp(base, "tokenizer_config.json"))
            snprintf(json, sizeof json, "%s/tokenizer.json", dir);
    }
    snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", dir);
    engine_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        err_set(&e, ENGINE_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
        err_copy_out(&e, err, err_size);
        return ENGINE_ERR_OUT_OF_MEMORY;
    }
    const int have_cfg = stat(cfg, &st) == 0;
    engine_status s = tok_load(json, have_cfg ? cfg : NULL, &t->tok, &e);
    if (!s)
        s = chat_source_load(dir, have_cfg ? cfg : NULL, &t->chat, &e);
    if (s) {
        err_copy_out(&e, err, err_size);
        tok_free(t->tok);
        free(t);
        return s;
    }
    *out = t;
    return ENGINE_OK;
}

void engine_tokenizer_free(engine_tokenizer *t)
{
    if (!t)
        return;
    tok_free(t->tok);
    chat_source_free(t->chat);
    free(t);
}

/* The handles are const in the API (a model's tokenizer is shared), but the
 * error slot is per handle by design; it is the one field written. */
static err_buf *tok_err(const engine_tokenizer *t)
{
    return (err_buf *)&t->err;
}

engine_status engine_tokenize(const engine_tokenizer *t, const char *text, size_t len, int add_special, int32_t *ids,
                              size_t cap, size_t *n_ids)
{
    if (n_ids)
        *n_ids = 0;
    if (!t || (!text && len) || (!ids && cap))
        return ENGINE_ERR_INVALID_ARG;
    int32_t *all = NULL;
    size_t n = 0;
    engine_status s = tok_encode(t->tok, text ? text : "", len, add_special != 0, &all, &n, tok_err(t));
    if (s)
        return s;
    if (n_ids)
        *n_ids = n;
    size_t k = n < cap ? n : cap;
    if (k)
        memcpy(ids, all, k * sizeof *ids);
    free(all);
    if (n > cap)
        return err_set(tok_err(t), ENGINE_ERR_BUFFER_TOO_SMALL, "%zu ids do not fit in a buffer of %zu", n, cap);
    return ENGINE_OK;
}

engine_status engine_detokenize(const engine_tokenizer *t, const int32_t *ids, size_t n, int skip_special, char *buf,
                                size_t cap, size_t *len)
{
    if (len)
        *len = 0;
    if (!t || (!ids && n) || (!buf && cap))
        return ENGINE_ERR_INVALID_ARG;
    char *text = NULL;
    size_t tl = 0;
    engine_status s = tok_decode(t->tok, ids, n, skip_special != 0, &text, &tl, tok_err(t));
    if (s)
        return s;
    if (len)
        *len = tl;
    if (cap) {
        size_t k = tl < cap - 1 ? tl : cap - 1;
        memcpy(buf, text, k);
        buf[k] = '\0';
    }
    free(text);
    if (tl + 1 > cap)
        return err_set(tok_err(t), ENGINE_ERR_BUFFER_TOO_SMALL, "%zu bytes of text do not fit in a buffer of %zu",
                       tl + 1, cap);
    return ENGINE_OK;
}

int engine_tokenizer_vocab_size(const engine_tokenizer *t)
{
    return t ? tok_vocab_size(t->tok) : 0;
}

int32_t engine_tokenizer_bos(const engine_tokenizer *t)
{
    return t ? tok_bos(t->tok) : -1;
}

int32_t engine_tokenizer_eos(const engine_tokenizer *t)
{
    return t ? tok_eos(t->tok) : -1;
}

const char *engine_tokenizer_last_error(const engine_tokenizer *t)
{
    return t ? t->err.msg : "";
}

struct engine_detokenizer {
    tok_stream *stream;
};

engine_status engine_detokenizer_create(const engine_tokenizer *t, int skip_special, engine_detokenizer **out)
{
    if (!out)
        return ENGINE_ERR_INVALID_ARG;
    *out = NULL;
    if (!t)
        return ENGINE_ERR_INVALID_ARG;
    engine_detokenizer *d = calloc(1, sizeof *d);
    if (!d || !(d->stream = tok_stream_new(t->tok, skip_special != 0))) {
        free(d);
        return ENGINE_ERR_OUT_OF_MEMORY;
    }
    *out = d;
    return ENGINE_OK;
}

void engine_detokenizer_free(engine_detokenizer *d)
{
    if (!d)
        return;
    tok_stream_free(d->stream);
    free(d);
}

engine_status engine_detokenizer_push(engine_detokenizer *d, int32_t id, const char **text, size_t *len)
{
    return d ? tok_stream_push(d->stream, id, text, len) : ENGINE_ERR_INVALID_ARG;
}

engine_status engine_detokenizer_flush(engine_detokenizer *d, const char **text, size_t *len)
{
    return d ? tok_stream_flush(d->stream, text, len) : ENGINE_ERR_INVALID_ARG;
}
