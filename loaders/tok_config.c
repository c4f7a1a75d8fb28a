/*
 * tok_config.c: reads the pipeline parts of tokenizer.json (normalizer,
 * pre_tokenizer, decoder, post_processor; Sequences flattened) and
 * tokenizer_config.json (bos/eos and add_bos_token/add_eos_token). A type
 * this build does not implement is an ENGINE_ERR_UNSUPPORTED naming it.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

static const char *type_of(json_t *j)
{
    return json_is_object(j) ? json_string_value(json_object_get(j, "type")) : NULL;
}

static bool get_bool(json_t *o, const char *key, bool dflt)
{
    json_t *v = json_object_get(o, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static engine_status oom(err_buf *e, const char *path)
{
    return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
}

static engine_status unsupported(err_buf *e, const char *path, const char *what, const char *type)
{
    return err_set(e, ENGINE_ERR_UNSUPPORTED, "%s: %s type \"%s\" is not supported", path, what,
                   type ? type : "(missing)");
}

static char *dup_bytes(const char *s, size_t n)
{
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = '\0';
    }
    return p;
}

/* A JSON string holding exactly one character (Strip content, Metaspace replacement). */
static engine_status get_char(json_t *o, const char *key, uint32_t dflt, uint32_t *out, const char *path,
                              err_buf *e)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return ENGINE_OK;
    }
    const char *s = json_string_value(v);
    size_t n = json_string_length(v);
    bool bad, trunc;
    if (!s || n == 0 || tok_utf8_next((const unsigned char *)s, n, out, &bad, &trunc) != n || bad)
        return err_set(e, ENGINE_ERR_FORMAT, "%s: \"%s\" must be a single character", path, key);
    return ENGINE_OK;
}

/* {"String": "..."} or {"Regex": "..."}, as Split and Replace spell their patterns. */
static engine_status get_pattern(json_t *o, tok_pattern *p, const char *path, err_buf *e)
{
    json_t *pat = json_object_get(o, "pattern");
    json_t *str = json_object_get(pat, "String");
    json_t *re = json_object_get(pat, "Regex");
    if (json_is_string(str)) {
        p->kind = TOK_PAT_STRING;
        p->len = json_string_length(str);
        p->str = dup_bytes(json_string_value(str), p->len);
        return p->str ? ENGINE_OK : oom(e, path);
    }
    if (json_is_string(re))
        return tok_pattern_compile_regex(p, json_string_value(re), json_string_length(re), path, e);
    return err_set(e, ENGINE_ERR_FORMAT, "%s: pattern must be {\"String\": ...} or {\"Regex\": ...}", path);
}

static engine_status get_content(json_t *o, const char *key, char **out, size_t *len, const char *path,
                                 err_buf *e)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_string(v))
        return err_set(e, ENGINE_ERR_FORMAT, "%s: \"%s\" must be a string", path, key);
    *len = json_string_length(v);
    *out = dup_bytes(json_string_value(v), *len);
    return *out ? ENGINE_OK : oom(e, path);
}

/* Grow one of the pipeline arrays by a zeroed element. */
static void *push_elem(void **arr, size_t *n, size_t elem)
{
    void *p = realloc(*arr, (*n + 1) * elem);
    if (!p)
        return NULL;
    *arr = p;
    void *x = (char *)p + *n * elem;
    memset(x, 0, elem);
    (*n)++;
    return x;
}

/* ---- normalizer ---- */

/* A "Sequence" of `what`s listed under `key`, each parsed by fn in order. */
typedef engine_status (*parse_fn)(tok_tokenizer *t, json_t *j, const char *path, err_buf *e);
static engine_status parse_sequence(tok_tokenizer *t, json_t *j, const char *key, const char *what, parse_fn fn,
                                    const char *path, err_buf *e)
{
    json_t *list = json_object_get(j, key);
    size_t i;
    json_t *x;
    if (!json_is_array(list))
        return err_set(e, ENGINE_ERR_FORMAT, "%s: Sequence %s without \"%s\"", path, what, key);
    json_array_foreach(list, i, x)
    {
        engine_status st = fn(t, x, path, e);
        if (st != ENGINE_OK)
            return st;
    }
    return ENGINE_OK;
}

engine_status tok_parse_normalizer(tok_tokenizer *t, json_t *j, const char *path, err_buf *e)
{
    if (!j || json_is_null(j))
        return ENGINE_OK;
    const char *type = type_of(j);
    if (type && strcmp(type, "Sequence") == 0)
        return parse_sequence(t, j, "normalizers", "normalizer", tok_parse_normalizer, path, e);
    static const struct {
        const char *name;
        enum tok_norm_kind kind;
    } simple[] = {{"NFC", TOK_NORM_NFC},   {"NFD", TOK_NORM_NFD},         {"NFKC", TOK_NORM_NFKC},
                  {"NFKD", TOK_NORM_NFKD}, {"Lowercase", TOK_NORM_LOWERCASE}, {"Strip", TOK_NORM_STRIP},
                  {"Replace", TOK_NORM_REPLACE}, {"Prepend", TOK_NORM_PREPEND}, {"Append", TOK_NORM_APPEND}};
    size_t k = 0;
    while (k < sizeof simple / sizeof simple[0] && !(type && strcmp(type, simple[k].name) == 0))
        k++;
    if (k == sizeof simple / sizeof simple[0])
        return unsupported(e, path, "normalizer", type);
    tok_norm *nm = push_elem((void **)&t->norms, &t->n_norms, sizeof *nm);
    if (!nm)
        return oom(e, path);
    nm->kind = simple[k].kind;
    switch (nm->kind) {
    case TOK_NORM_STRIP:
        nm->left = get_bool(j, "strip_left", true);
        nm->right = get_bool(j, "strip_right", true);
        return ENGINE_OK;
    case TOK_NORM_REPLACE: {
        engine_status st = get_pattern(j, &nm->pat, path, e);
        return st != ENGINE_OK ? st : get_content(j, "content", &nm->content, &nm->content_len, path, e);
    }
    case TOK_NORM_PREPEND:
        return get_content(j, "prepend", &nm->content, &nm->content_len, path, e);
    case TOK_NORM_APPEND:
        return get_content(j, "append", &nm->content, &nm->content_len, path, e);
    default:
        return ENGINE_OK;
    }
}

/* ---- pre-tokenizer ---- */

/* tokenizers' ByteLevel regex (GPT-2's word split). */
static const char gpt2_regex[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static engine_status get_behavior(json_t *j, enum tok_split_behavior dflt, enum tok_split_behavior *out,
                                  const char *path, err_buf *e)
{
    const char *b = json_string_value(json_object_get(j, "behavior"));
    static const char *names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
    static const enum tok_split_behavior vals[] = {TOK_REMOVED, TOK_ISOLATED, TOK_MERGED_PREV, TOK_MERGED_NEXT,
                                                   TOK_CONTIGUOUS};
    *out = dflt;
    if (!b)
        return ENGINE_OK;
    for (size_t i = 0; i < 5; i++)
        if (strcmp(b, names[i]) == 0) {
            *out = vals[i];
            return ENGINE_OK;
        }
    return err_set(e, ENGINE_ERR_UNSUPPORTED, "%s: split behavior \"%s\" is not supported", path, b);
}

static engine_status get_prepend_scheme(json_t *j, enum tok_prepend_scheme *out, const char *path, err_buf *e)
{
    const char *s = json_string_value(json_object_get(j, "prepend_scheme"));
    if (!s) { /* files older than prepend_scheme say add_prefix_space */
        *out = get_bool(j, "add_prefix_space", true) ? TOK_PREPEND_ALWAYS : TOK_PREPEND_NEVER;
        return ENGINE_OK;
    }
    if (strcmp(s, "always") == 0)
        *out = TOK_PREPEND_ALWAYS;
    else if (strcmp(s, "first") == 0)
        *out = TOK_PREPEND_FIRST;
    else if (strcmp(s, "never") == 0)
        *out = TOK_PREPEND_NEVER;
    else
        return err_set(e, ENGINE_ERR_UNSUPPORTED, "%s: prepend_scheme \"%s\" is not supported", path, s);
    return ENGINE_OK;
}

engine_status tok_parse_pretokenizer(tok_tokenizer *t, json_t *j, const char *path, err_buf *e)
{
    if (!j || json_is_null(j))
        return ENGINE_OK;
    const char *type = type_of(j);
    if (!type)
        return unsupported(e, path, "pre_tokenizer", NULL);
    if (strcmp(type, "Sequence") == 0)
        return parse_sequence(t, j, "pretokenizers", "pre_tokenizer", tok_parse_pretokenizer, path, e);
    static const char *names[] = {"ByteLevel",  "Split",           "Metaspace",  "Digits",
                                  "Whitespace", "WhitespaceSplit", "Punctuation"};
    static const enum tok_pre_kind kinds[] = {TOK_PRE_BYTELEVEL,  TOK_PRE_SPLIT,            TOK_PRE_METASPACE,
                                              TOK_PRE_DIGITS,     TOK_PRE_WHITESPACE,       TOK_PRE_WHITESPACE_SPLIT,
                                              TOK_PRE_PUNCTUATION};
    size_t k = 0;
    while (k < 7 && strcmp(type, names[k]) != 0)
        k++;
    if (k == 7)
        return unsupported(e, path, "pre_tokenizer", type);
    tok_pretok *p = push_elem((void **)&t->pretoks, &t->n_pretoks, sizeof *p);
    if (!p)
        return oom(e, path);
    p->kind = kinds[k];
    switch (p->kind) {
    case TOK_PRE_BYTELEVEL:
        p->add_prefix_space = get_bool(j, "add_prefix_space", true);
        if (!get_bool(j, "use_regex", true))
            return ENGINE_OK;
        p->has_pat = true;
        return tok_pattern_compile_regex(&p->pat, gpt2_regex, sizeof gpt2_regex - 1, path, e);
    case TOK_PRE_SPLIT: {
        p->has_pat = true;
        p->invert = get_bool(j, "invert", false);
        engine_status st = get_pattern(j, &p->pat, path, e);
        return st != ENGINE_OK ? st : get_behavior(j, TOK_ISOLATED, &p->behavior, path, e);
    }
    case TOK_PRE_METASPACE: {
        p->split = get_bool(j, "split", true);
        engine_status st = get_char(j, "replacement", 0x2581, &p->replacement, path, e);
        return st != ENGINE_OK ? st : get_prepend_scheme(j, &p->prepend, path, e);
    }
    case TOK_PRE_DIGITS:
        p->pat.kind = TOK_PAT_NUMERIC;
        p->behavior = get_bool(j, "individual_digits", false) ? TOK_ISOLATED : TOK_CONTIGUOUS;
        return ENGINE_OK;
    case TOK_PRE_WHITESPACE: {
        /* Words and runs of other non-space characters; the rest is dropped. */
        static const char re[] = "\\w+|[^\\w\\s]+";
        p->behavior = TOK_REMOVED;
        p->invert = true;
        return tok_pattern_compile_regex(&p->pat, re, sizeof re - 1, path, e);
    }
    case TOK_PRE_WHITESPACE_SPLIT:
        p->pat.kind = TOK_PAT_SPACE;
        p->behavior = TOK_REMOVED;
        return ENGINE_OK;
    case TOK_PRE_PUNCTUATION:
        p->pat.kind = TOK_PAT_PUNCT;
        return get_behavior(j, TOK_ISOLATED, &p->behavior, path, e);
    }
    return ENGINE_OK;
}

/* ---- decoder ---- */

static engine_status parse_decoder(tok_tokenizer *t, json_t *j, const char *path, err_buf *e)
{
    const char *type = type_of(j);
    if (!type)
        return unsupported(e, path, "decoder", NULL);
    if (strcmp(type, "Sequence") == 0)
        return parse_sequence(t, j, "decoders", "decoder", parse_decoder, path, e);
    static const char *names[] = {"ByteLevel", "Replace", "ByteFallback", "Fuse", "Strip", "Metaspace"};
    static const enum tok_dec_kind kinds[] = {TOK_DEC_BYTELEVEL, TOK_DEC_REPLACE, TOK_DEC_BYTEFALLBACK,
                                              TOK_DEC_FUSE,      TOK_DEC_STRIP,   TOK_DEC_METASPACE};
    size_t k = 0;
    while (k < 6 && strcmp(type, names[k]) != 0)
        k++;
    if (k == 6)
        return unsupported(e, path, "decoder", type);
    tok_dec *d = push_elem((void **)&t->decs, &t->n_decs, sizeof *d);
    if (!d)
        return oom(e, path);
    d->kind = kinds[k];
    switch (d->kind) {
    case TOK_DEC_REPLACE: {
        engine_status st = get_pattern(j, &d->pat, path, e);
        return st != ENGINE_OK ? st : get_content(j, "content", &d->content, &d->content_len, path, e);
    }
    case TOK_DEC_STRIP: {
        json_t *a = json_object_get(j, "start"), *b = json_object_get(j, "stop");
        d->start = json_is_integer(a) && json_integer_value(a) > 0 ? (size_t)json_integer_value(a) : 0;
        d->stop = json_is_integer(b) && json_integer_value(b) > 0 ? (size_t)json_integer_value(b) : 0;
        return get_char(j, "content", ' ', &d->ch, path, e);
    }
    case TOK_DEC_METASPACE: {
        enum tok_prepend_scheme s = TOK_PREPEND_ALWAYS;
        engine_status st = get_char(j, "replacement", 0x2581, &d->ch, path, e);
        if (st == ENGINE_OK)
            st = get_prepend_scheme(j, &s, path, e);
        d->prepend = s != TOK_PREPEND_NEVER;
        return st;
    }
    default:
        return ENGINE_OK;
    }
}

engine_status tok_parse_decoder(tok_tokenizer *t, json_t *j, const char *path, err_buf *e)
{
    if (!j || json_is_null(j)) {
        t->no_decoder = true;
        t->streamable = true;
        return ENGINE_OK;
    }
    engine_status st = parse_decoder(t, j, path, e);
    if (st != ENGINE_OK)
        return st;
    /* Once Fuse or ByteLevel has joined the tokens, later decoders see the
     * whole text; only those that act at its two ends allow cutting. */
    bool whole = false;
    t->streamable = true;
    for (size_t i = 0; i < t->n_decs; i++) {
        const tok_dec *d = &t->decs[i];
        bool local = d->kind == TOK_DEC_FUSE || d->kind == TOK_DEC_BYTELEVEL ||
                     (d->kind == TOK_DEC_STRIP && d->stop == 0);
        if (whole && !local)
            t->streamable = false;
        if (d->kind == TOK_DEC_FUSE || d->kind == TOK_DEC_BYTELEVEL)
            whole = true;
    }
    return ENGINE_OK;
}

/* ---- post-processor: the ids add_special puts around the text ---- */

static int32_t lookup_token(const tok_tokenizer *t, const char *s, size_t n)
{
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].len == n && memcmp(t->added[i].content, s, n) == 0)
            return t->added[i].id;
    return tok_strmap_get(&t->vocab, (const char *const *)t->mstr, t->mlen, s, n);
}

static bool append_ids(int32_t **arr, size_t *n, const int32_t *ids, size_t k)
{
    int32_t *p = realloc(*arr, (*n + k + 1) * sizeof *p);
    if (!p)
        return false;
    memcpy(p + *n, ids, k * sizeof *p);
    *arr = p;
    *n += k;
    return true;
}

static engine_status check_special_id(const tok_tokenizer *t, json_int_t id, const char *path, err_buf *e)
{
    if (id < 0 || id >= t->n_ids)
        return err_set(e, ENGINE_ERR_FORMAT, "%s: post_processor id %lld out of range", path, (long long)id);
    return ENGINE_OK;
}

static engine_status template_single(tok_tokenizer *t, json_t *j, const char *path, err_buf *e)
{
    json_t *single = json_object_get(j, "single"), *specials = json_object_get(j, "special_tokens");
    size_t i;
    json_t *x;
    bool after = false;
    if (!json_is_array(single))
        return err_set(e, ENGINE_ERR_FORMAT, "%s: TemplateProcessing without a \"single\" template", path);
    json_array_foreach(single, i, x)
    {
        if (json_object_get(x, "Sequence")) {
            after = true;
            continue;
        }
        const char *name = json_string_value(json_object_get(json_object_get(x, "SpecialToken"), "id"));
        json_t *ids = json_object_get(json_object_get(specials, name ? name : ""), "ids");
        if (!name || !json_is_array(ids))
            return err_set(e, ENGINE_ERR_FORMAT, "%s: TemplateProcessing names an undefined special token", path);
        size_t k;
        json_t *v;
        json_array_foreach(ids, k, v)
        {
            json_int_t id = json_integer_value(v);
            engine_status st = check_special_id(t, id, path, e);
            if (st != ENGINE_OK)
                return st;
            int32_t i32 = (int32_t)id;
            if (!(after ? append_ids(&t->suffix, &t->n_suffix, &i32, 1)
                        : append_ids(&t->prefix, &t->n_prefix, &i32, 1)))
                return oom(e, path);
        }
    }
    return ENGINE_OK;
}

/* BertProcessing / RobertaProcessing: "cls": [token, id], "sep": [token, id]. */
static engine_status cls_sep(tok_tokenizer *t, json_t *j, const char *path, err_buf *e)
{
    json_t *c = json_array_get(json_object_get(j, "cls"), 1), *s = json_array_get(json_object_get(j, "sep"), 1);
    if (!json_is_integer(c) || !json_is_integer(s))
        return err_set(e, ENGINE_ERR_FORMAT, "%s: post_processor needs \"cls\" and \"sep\" as [token, id]", path);
    json_int_t cls = json_integer_value(c), sep = json_integer_value(s);
    engine_status st = check_special_id(t, cls, path, e);
    if (st == ENGINE_OK)
        st = check_special_id(t, sep, path, e);
    if (st != ENGINE_OK)
        return st;
    int32_t a = (int32_t)cls, b = (int32_t)sep;
    if (!append_ids(&t->prefix, &t->n_prefix, &a, 1) || !append_ids(&t->suffix, &t->n_suffix, &b, 1))
        return oom(e, path);
    return ENGINE_OK;
}

engine_status tok_parse_post_processor(tok_tokenizer *t, json_t *j, const char *path, err_buf *e)
{
    if (!j || json_is_null(j))
        return ENGINE_OK;
    const char *type = type_of(j);
    if (!type)
        return unsupported(e, path, "post_processor", NULL);
    if (strcmp(type, "ByteLevel") == 0)
        return ENGINE_OK; /* only adjusts offsets */
    if (strcmp(type, "TemplateProcessing") == 0)
        return template_single(t, j, path, e);
    if (strcmp(type, "BertProcessing") == 0 || strcmp(type, "RobertaProcessing") == 0)
        return cls_sep(t, j, path, e);
    if (strcmp(type, "Sequence") == 0)
        return parse_sequence(t, j, "processors", "post_processor", tok_parse_post_processor, path, e);
    return unsupported(e, path, "post_processor", type);
}

/* ---- tokenizer_config.json ---- */

/* bos_token / eos_token: a string, {"content": ...}, or null. */
static bool config_token(const tok_tokenizer *t, json_t *cfg, const char *key, int32_t *id)
{
    json_t *v = json_object_get(cfg, key);
    if (!v)
        return false;
    if (json_is_object(v))
        v = json_object_get(v, "content");
    *id = json_is_string(v) ? lookup_token(t, json_string_value(v), json_string_length(v)) : -1;
    return true;
}

engine_status tok_parse_config(tok_tokenizer *t, const char *config_path, err_buf *e)
{
    t->bos = t->n_prefix > 0 ? t->prefix[0] : -1;
    t->eos = t->n_suffix > 0 ? t->suffix[0] : -1;
    json_t *cfg = NULL;
    if (config_path) {
        FILE *f = fopen(config_path, "rb");
        if (!f && errno != ENOENT)
            return err_set(e, ENGINE_ERR_IO, "%s: cannot open: %s", config_path, strerror(errno));
        if (f) {
            json_error_t je;
            /* Integers as reals: model_max_length can exceed 64 bits. */
            cfg = json_loadf(f, JSON_DECODE_INT_AS_REAL, &je);
            fclose(f);
            if (!cfg || !json_is_object(cfg)) {
                json_decref(cfg);
                return err_set(e, ENGINE_ERR_FORMAT, "%s: invalid JSON at line %d column %d: %s", config_path,
                               je.line, je.column, cfg ? "not an object" : je.text);
            }
        }
    }
    if (cfg) {
        config_token(t, cfg, "bos_token", &t->bos);
        config_token(t, cfg, "eos_token", &t->eos);
        /* The config's flags, when present, replace what the template adds,
         * as transformers' Llama tokenizers rebuild their post-processor. */
        json_t *ab = json_object_get(cfg, "add_bos_token"), *ae = json_object_get(cfg, "add_eos_token");
        if (json_is_boolean(ab)) {
            t->n_prefix = 0;
            if (json_is_true(ab) && t->bos >= 0 && !append_ids(&t->prefix, &t->n_prefix, &t->bos, 1)) {
                json_decref(cfg);
                return oom(e, config_path);
            }
        }
        if (json_is_boolean(ae)) {
            t->n_suffix = 0;
            if (json_is_true(ae) && t->eos >= 0 && !append_ids(&t->suffix, &t->n_suffix, &t->eos, 1)) {
                json_decref(cfg);
                return oom(e, config_path);
            }
        }
        json_decref(cfg);
    }
    t->add_bos = t->n_prefix > 0;
    t->add_eos = t->n_suffix > 0;
    return ENGINE_OK;
}

void tok_free_pipeline(tok_tokenizer *t)
{
    for (size_t i = 0; i < t->n_norms; i++) {
        tok_pattern_free(&t->norms[i].pat);
        free(t->norms[i].content);
    }
    free(t->norms);
    for (size_t i = 0; i < t->n_pretoks; i++)
        tok_pattern_free(&t->pretoks[i].pat);
    free(t->pretoks);
    for (size_t i = 0; i < t->n_decs; i++) {
        tok_pattern_free(&t->decs[i].pat);
        free(t->decs[i].content);
    }
    free(t->decs);
    free(t->prefix);
    free(t->suffix);
}
