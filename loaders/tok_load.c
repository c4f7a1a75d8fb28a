/*
 * tok_load.c: tokenizer.json to a tok_tokenizer: the BPE model (vocabulary
 * into one arena plus a hash table, merges into a pair table), the added
 * tokens, then the pipeline and tokenizer_config.json (tok_config.c).
 * Also the small read-only accessors and tok_free().
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

static engine_status read_file(const char *path, char **buf, size_t *len, err_buf *e)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return err_set(e, ENGINE_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    tok_buf b = {0};
    for (;;) {
        if (!tok_buf_reserve(&b, 1 << 20)) {
            fclose(f);
            free(b.p);
            return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "%s: out of memory reading the file", path);
        }
        size_t got = fread(b.p + b.n, 1, b.cap - b.n - 1, f);
        b.n += got;
        if (got == 0)
            break;
    }
    bool failed = ferror(f) != 0;
    fclose(f);
    if (failed) {
        free(b.p);
        return err_set(e, ENGINE_ERR_IO, "%s: read error", path);
    }
    *buf = b.p;
    *len = b.n;
    return ENGINE_OK;
}

static bool get_bool(json_t *o, const char *key, bool dflt)
{
    json_t *v = json_object_get(o, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

/* An optional non-empty string option, copied; NULL when absent, null or "". */
static engine_status opt_string(json_t *o, const char *key, char **out, size_t *len, const char *path, err_buf *e)
{
    json_t *v = json_object_get(o, key);
    *out = NULL;
    *len = 0;
    if (!json_is_string(v) || json_string_length(v) == 0)
        return ENGINE_OK;
    *len = json_string_length(v);
    *out = malloc(*len + 1);
    if (!*out)
        return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    memcpy(*out, json_string_value(v), *len + 1);
    return ENGINE_OK;
}

/* Ids beyond this are refused: they would only make the id tables huge. */
static json_int_t id_limit(size_t n_vocab, size_t n_added)
{
    return (json_int_t)(2 * (n_vocab + n_added) + 1024);
}

static engine_status load_vocab(tok_tokenizer *t, json_t *vocab, json_t *added, const char *path, err_buf *e)
{
    size_t n_vocab = json_object_size(vocab), n_added = json_array_size(added);
    json_int_t limit = id_limit(n_vocab, n_added), max_id = -1;
    size_t bytes = 0, klen, i;
    const char *key;
    json_t *v;
    json_object_keylen_foreach(vocab, key, klen, v)
    {
        json_int_t id = json_integer_value(v);
        if (!json_is_integer(v) || id < 0 || id >= limit)
            return err_set(e, ENGINE_ERR_FORMAT, "%s: vocab id of \"%.60s\" is missing or out of range", path, key);
        if (id > max_id)
            max_id = id;
        bytes += klen + 1;
    }
    json_array_foreach(added, i, v)
    {
        json_t *idv = json_object_get(v, "id");
        json_int_t id = json_integer_value(idv);
        if (!json_is_integer(idv) || id < 0 || id >= limit)
            return err_set(e, ENGINE_ERR_FORMAT, "%s: added_tokens[%zu] id is missing or out of range", path, i);
        if (!json_is_string(json_object_get(v, "content")))
            return err_set(e, ENGINE_ERR_FORMAT, "%s: added_tokens[%zu] has no \"content\" string", path, i);
        if (id > max_id)
            max_id = id;
    }
    t->n_ids = (int32_t)(max_id + 1);
    size_t n = (size_t)t->n_ids + 1;
    t->mstr = calloc(n, sizeof *t->mstr);
    t->mlen = calloc(n, sizeof *t->mlen);
    t->added_of = malloc(n * sizeof *t->added_of);
    t->arena = malloc(bytes + 1);
    t->added = calloc(n_added + 1, sizeof *t->added);
    if (!t->mstr || !t->mlen || !t->added_of || !t->arena || !t->added || !tok_strmap_init(&t->vocab, n_vocab))
        return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "%s: out of memory for %zu vocab entries", path, n_vocab);
    for (size_t k = 0; k < n; k++)
        t->added_of[k] = -1;

    char *a = t->arena;
    json_object_keylen_foreach(vocab, key, klen, v)
    {
        int32_t id = (int32_t)json_integer_value(v);
        if (t->mstr[id])
            continue; /* two strings for one id: the first one keeps it */
        memcpy(a, key, klen);
        a[klen] = '\0';
        t->mstr[id] = a;
        t->mlen[id] = (uint32_t)klen;
        a += klen + 1;
        tok_strmap_insert(&t->vocab, (const char *const *)t->mstr, t->mlen, id);
    }

    json_array_foreach(added, i, v)
    {
        json_t *c = json_object_get(v, "content");
        tok_added *ad = &t->added[t->n_added];
        ad->len = json_string_length(c);
        ad->content = malloc(ad->len + 1);
        if (!ad->content)
            return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
        memcpy(ad->content, json_string_value(c), ad->len + 1);
        ad->id = (int32_t)json_integer_value(json_object_get(v, "id"));
        ad->special = get_bool(v, "special", false);
        ad->lstrip = get_bool(v, "lstrip", false);
        ad->rstrip = get_bool(v, "rstrip", false);
        ad->single_word = get_bool(v, "single_word", false);
        ad->normalized = get_bool(v, "normalized", !ad->special);
        t->added_of[ad->id] = (int32_t)t->n_added++;
    }
    return ENGINE_OK;
}

static int32_t vocab_get(const tok_tokenizer *t, const char *s, size_t n)
{
    return tok_strmap_get(&t->vocab, (const char *const *)t->mstr, t->mlen, s, n);
}

static engine_status load_merges(tok_tokenizer *t, json_t *merges, const char *path, err_buf *e)
{
    size_t n = json_array_size(merges), i;
    json_t *m;
    if (!tok_mergemap_init(&t->merges, n))
        return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "%s: out of memory for %zu merges", path, n);
    tok_buf cat = {0};
    engine_status st = ENGINE_OK;
    json_array_foreach(merges, i, m)
    {
        const char *a, *b;
        size_t al, bl;
        if (json_is_string(m)) { /* legacy "left right" */
            a = json_string_value(m);
            const char *sp = memchr(a, ' ', json_string_length(m));
            if (!sp || memchr(sp + 1, ' ', json_string_length(m) - (size_t)(sp + 1 - a))) {
                st = err_set(e, ENGINE_ERR_FORMAT, "%s: merges[%zu] is not \"left right\"", path, i);
                break;
            }
            al = (size_t)(sp - a);
            b = sp + 1;
            bl = json_string_length(m) - al - 1;
        } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
                   json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0));
            al = json_string_length(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1));
            bl = json_string_length(json_array_get(m, 1));
        } else {
            st = err_set(e, ENGINE_ERR_FORMAT, "%s: merges[%zu] is neither a string nor a pair of strings", path, i);
            break;
        }
        int32_t ia = vocab_get(t, a, al), ib = vocab_get(t, b, bl);
        if (ia < 0 || ib < 0) {
            st = err_set(e, ENGINE_ERR_FORMAT, "%s: merges[%zu] names \"%.*s\", which is not in the vocab", path, i,
                         (int)(ia < 0 ? al : bl) > 60 ? 60 : (int)(ia < 0 ? al : bl), ia < 0 ? a : b);
            break;
        }
        /* The merged token drops the right part's continuing-subword prefix. */
        if (t->cont_prefix && bl >= t->cont_prefix_len && memcmp(b, t->cont_prefix, t->cont_prefix_len) == 0) {
            b += t->cont_prefix_len;
            bl -= t->cont_prefix_len;
        }
        cat.n = 0;
        if (!tok_buf_put(&cat, a, al) || !tok_buf_put(&cat, b, bl)) {
            st = err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
            break;
        }
        int32_t id = vocab_get(t, cat.p, cat.n);
        if (id < 0) {
            st = err_set(e, ENGINE_ERR_FORMAT, "%s: merges[%zu] makes \"%.*s\", which is not in the vocab", path, i,
                         (int)(cat.n > 60 ? 60 : cat.n), cat.p);
            break;
        }
        tok_mergemap_put(&t->merges, ia, ib, (int32_t)i, id);
    }
    free(cat.p);
    return st;
}

static engine_status load_model(tok_tokenizer *t, json_t *root, const char *path, err_buf *e)
{
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model))
        return err_set(e, ENGINE_ERR_FORMAT, "%s: no \"model\" object", path);
    const char *type = json_string_value(json_object_get(model, "type"));
    if (type ? strcmp(type, "BPE") != 0 : !json_object_get(model, "merges"))
        return err_set(e, ENGINE_ERR_UNSUPPORTED, "%s: model type \"%s\" is not supported (only BPE)", path,
                       type ? type : "(missing)");
    json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
    json_t *added = json_object_get(root, "added_tokens");
    if (!json_is_object(vocab))
        return err_set(e, ENGINE_ERR_FORMAT, "%s: model has no \"vocab\" object", path);
    if (merges && !json_is_array(merges))
        return err_set(e, ENGINE_ERR_FORMAT, "%s: model \"merges\" is not an array", path);
    if (added && !json_is_array(added) && !json_is_null(added))
        return err_set(e, ENGINE_ERR_FORMAT, "%s: \"added_tokens\" is not an array", path);
    json_t *drop = json_object_get(model, "dropout");
    if (json_is_number(drop) && json_number_value(drop) > 0.0)
        return err_set(e, ENGINE_ERR_UNSUPPORTED, "%s: BPE dropout %g is not supported", path, json_number_value(drop));

    engine_status st = load_vocab(t, vocab, added, path, e);
    if (st != ENGINE_OK)
        return st;
    t->fuse_unk = get_bool(model, "fuse_unk", false);
    t->byte_fallback = get_bool(model, "byte_fallback", false);
    t->ignore_merges = get_bool(model, "ignore_merges", false);
    json_t *unk = json_object_get(model, "unk_token");
    /* An unk_token missing from the vocab acts like none: characters drop. */
    t->unk_id = json_is_string(unk) ? vocab_get(t, json_string_value(unk), json_string_length(unk)) : -1;
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->byte_id[b] = vocab_get(t, name, 6);
    }
    st = opt_string(model, "continuing_subword_prefix", &t->cont_prefix, &t->cont_prefix_len, path, e);
    if (st == ENGINE_OK)
        st = opt_string(model, "end_of_word_suffix", &t->eow_suffix, &t->eow_suffix_len, path, e);
    if (st == ENGINE_OK)
        st = load_merges(t, merges, path, e);
    return st;
}

engine_status tok_load(const char *json_path, const char *config_path, tok_tokenizer **out, err_buf *e)
{
    if (!json_path || !out)
        return err_set(e, ENGINE_ERR_INVALID_ARG, "tok_load: NULL argument");
    *out = NULL;
    char *buf = NULL;
    size_t len = 0;
    engine_status st = read_file(json_path, &buf, &len, e);
    if (st != ENGINE_OK)
        return st;
    json_error_t je;
    json_t *root = json_loadb(buf, len, JSON_ALLOW_NUL, &je);
    free(buf);
    if (!root)
        return err_set(e, ENGINE_ERR_FORMAT, "%s: invalid JSON at line %d column %d: %s", json_path, je.line,
                       je.column, je.text);
    tok_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        json_decref(root);
        return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "%s: out of memory", json_path);
    }
    tok_bytemap_init(&t->bytemap);
    if (!json_is_object(root))
        st = err_set(e, ENGINE_ERR_FORMAT, "%s: top level is not a JSON object", json_path);
    if (st == ENGINE_OK)
        st = load_model(t, root, json_path, e);
    if (st == ENGINE_OK)
        st = tok_parse_normalizer(t, json_object_get(root, "normalizer"), json_path, e);
    if (st == ENGINE_OK)
        st = tok_parse_pretokenizer(t, json_object_get(root, "pre_tokenizer"), json_path, e);
    if (st == ENGINE_OK)
        st = tok_parse_decoder(t, json_object_get(root, "decoder"), json_path, e);
    if (st == ENGINE_OK)
        st = tok_parse_post_processor(t, json_object_get(root, "post_processor"), json_path, e);
    json_decref(root);
    if (st == ENGINE_OK)
        st = tok_build_matchers(t, e);
    if (st == ENGINE_OK)
        st = tok_parse_config(t, config_path, e);
    if (st != ENGINE_OK) {
        tok_free(t);
        return st;
    }
    *out = t;
    return ENGINE_OK;
}

void tok_free(tok_tokenizer *t)
{
    if (!t)
        return;
    free(t->mstr);
    free(t->mlen);
    free(t->arena);
    free(t->added_of);
    tok_strmap_free(&t->vocab);
    tok_mergemap_free(&t->merges);
    free(t->cont_prefix);
    free(t->eow_suffix);
    for (size_t i = 0; i < t->n_added; i++)
        free(t->added[i].content);
    free(t->added);
    tok_free_matchers(t);
    tok_free_pipeline(t);
    free(t);
}

int tok_vocab_size(const tok_tokenizer *t)
{
    return t ? t->n_ids : 0;
}

int32_t tok_bos(const tok_tokenizer *t)
{
    return t ? t->bos : -1;
}

int32_t tok_eos(const tok_tokenizer *t)
{
    return t ? t->eos : -1;
}

bool tok_add_bos(const tok_tokenizer *t)
{
    return t && t->add_bos;
}

bool tok_add_eos(const tok_tokenizer *t)
{
    return t && t->add_eos;
}

bool tok_is_special(const tok_tokenizer *t, int32_t id)
{
    if (!t || id < 0 || id >= t->n_ids || t->added_of[id] < 0)
        return false;
    return t->added[t->added_of[id]].special;
}

const char *tok_piece(const tok_tokenizer *t, int32_t id)
{
    size_t len = 0;
    return t ? tok_str_of(t, id, &len) : NULL;
}
