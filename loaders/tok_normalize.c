/*
 * tok_normalize.c: patterns (literal strings, PCRE2 regexes, character
 * classes) and the normalizers that run on each stretch of text between
 * added tokens: NFC/NFD/NFKC/NFKD (utf8proc), Lowercase, Strip, Replace,
 * Prepend, Append.
 */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tok_internal.h"

/* ---- patterns ---- */

engine_status tok_pattern_compile_regex(tok_pattern *p, const char *re, size_t len, const char *path,
                                        err_buf *e)
{
    int code;
    PCRE2_SIZE at;
    p->kind = TOK_PAT_REGEX;
    /* UCP makes \s, \w, \d and POSIX classes Unicode-aware, as Oniguruma
     * (what tokenizers uses) treats them on UTF-8 text. */
    p->re = pcre2_compile((PCRE2_SPTR)re, len, PCRE2_UTF | PCRE2_UCP, &code, &at, NULL);
    if (!p->re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(code, msg, sizeof msg);
        return err_set(e, ENGINE_ERR_UNSUPPORTED, "%s: regex \"%.80s\" not accepted by PCRE2 at offset %zu: %s",
                       path, re, (size_t)at, (const char *)msg);
    }
    /* JIT is an optimisation only; the interpreter is the fallback. */
    (void)pcre2_jit_compile(p->re, PCRE2_JIT_COMPLETE);
    return ENGINE_OK;
}

void tok_pattern_free(tok_pattern *p)
{
    free(p->str);
    p->str = NULL;
    if (p->re)
        pcre2_code_free(p->re);
    p->re = NULL;
}

void tok_spans_free(tok_spans *s)
{
    free(s->v);
    memset(s, 0, sizeof *s);
}

static bool span_add(tok_spans *s, size_t a, size_t b, bool m)
{
    if (s->n == s->cap) {
        size_t c = s->cap ? s->cap * 2 : 32;
        tok_span *v = realloc(s->v, c * sizeof *v);
        if (!v)
            return false;
        s->v = v;
        s->cap = c;
    }
    s->v[s->n++] = (tok_span){a, b, m};
    return true;
}

static size_t char_len_at(const char *s, size_t n, size_t i)
{
    uint32_t cp;
    bool bad, trunc;
    return tok_utf8_next((const unsigned char *)s + i, n - i, &cp, &bad, &trunc);
}

static bool find_regex(const tok_pattern *p, const char *s, size_t n, tok_spans *out)
{
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(p->re, NULL);
    if (!md)
        return false;
    size_t pos = 0, prev = 0;
    bool ok = true;
    while (pos <= n) {
        int rc = pcre2_match(p->re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) /* JIT stack exhausted: the interpreter copes */
            rc = pcre2_match(p->re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, NULL);
        if (rc < 0) /* no match, or a resource limit: the rest stays unmatched */
            break;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (ms < prev || me < ms || me > n)
            break; /* \K tricks; never produced by tokenizer patterns */
        if (ms > prev)
            ok = ok && span_add(out, prev, ms, false);
        ok = ok && span_add(out, ms, me, true);
        prev = me;
        if (me == ms) {
            /* An empty match: search again one character further, as Oniguruma's iterator does. */
            if (me >= n)
                break;
            pos = me + char_len_at(s, n, me);
        } else {
            pos = me;
        }
    }
    if (prev < n)
        ok = ok && span_add(out, prev, n, false);
    pcre2_match_data_free(md);
    return ok;
}

static bool find_string(const tok_pattern *p, const char *s, size_t n, tok_spans *out)
{
    size_t prev = 0;
    if (p->len > 0) {
        for (size_t i = 0; i + p->len <= n;) {
            const char *hit = memchr(s + i, p->str[0], n - i - p->len + 1);
            if (!hit)
                break;
            i = (size_t)(hit - s);
            if (memcmp(s + i, p->str, p->len) == 0) {
                if (i > prev && !span_add(out, prev, i, false))
                    return false;
                if (!span_add(out, i, i + p->len, true))
                    return false;
                i += p->len;
                prev = i;
            } else {
                i++;
            }
        }
    }
    if (prev < n || n == 0)
        return span_add(out, prev, n, false);
    return true;
}

static bool find_class(const tok_pattern *p, const char *s, size_t n, tok_spans *out)
{
    /* Every character of the class is a match of its own. */
    size_t prev = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        bool bad, trunc;
        size_t k = tok_utf8_next((const unsigned char *)s + i, n - i, &cp, &bad, &trunc);
        bool hit = p->kind == TOK_PAT_SPACE     ? tok_cp_is_space(cp)
                   : p->kind == TOK_PAT_NUMERIC ? tok_cp_is_numeric(cp)
                                                : tok_cp_is_punct(cp);
        if (hit) {
            if (i > prev && !span_add(out, prev, i, false))
                return false;
            if (!span_add(out, i, i + k, true))
                return false;
            prev = i + k;
        }
        i += k;
    }
    if (prev < n)
        return span_add(out, prev, n, false);
    return true;
}

bool tok_pattern_find(const tok_pattern *p, const char *s, size_t n, tok_spans *out)
{
    out->n = 0;
    switch (p->kind) {
    case TOK_PAT_REGEX:
        if (n == 0)
            return span_add(out, 0, 0, false);
        return find_regex(p, s, n, out);
    case TOK_PAT_STRING:
        return find_string(p, s, n, out);
    default:
        return find_class(p, s, n, out);
    }
}

/* ---- normalizers ---- */

static bool all_ascii(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80)
            return false;
    return true;
}

static bool unicode_form(const tok_norm *nm, const char *s, size_t n, tok_buf *out)
{
    /* ASCII is invariant under every normalization form; skip utf8proc. */
    if (all_ascii(s, n))
        return tok_buf_put(out, s, n);
    int opt = UTF8PROC_STABLE;
    switch (nm->kind) {
    case TOK_NORM_NFC:
        opt |= UTF8PROC_COMPOSE;
        break;
    case TOK_NORM_NFD:
        opt |= UTF8PROC_DECOMPOSE;
        break;
    case TOK_NORM_NFKC:
        opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
        break;
    default:
        opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
        break;
    }
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst, (utf8proc_option_t)opt);
    if (r < 0) {
        /* Only allocation failure is possible on valid UTF-8; keep the
         * text rather than lose it if utf8proc disagrees about validity. */
        free(dst);
        return r == UTF8PROC_ERROR_NOMEM ? false : tok_buf_put(out, s, n);
    }
    bool ok = tok_buf_put(out, dst, (size_t)r);
    free(dst);
    return ok;
}

static bool lowercase(const char *s, size_t n, tok_buf *out)
{
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        bool bad, trunc;
        i += tok_utf8_next((const unsigned char *)s + i, n - i, &cp, &bad, &trunc);
        if (cp == 0x130) { /* the one full lowercase mapping longer than a character */
            if (!tok_buf_putc(out, 'i') || !tok_buf_put_cp(out, 0x307))
                return false;
            continue;
        }
        if (!tok_buf_put_cp(out, (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp)))
            return false;
    }
    return true;
}

static bool strip(const tok_norm *nm, const char *s, size_t n, tok_buf *out)
{
    size_t a = 0, b = n;
    const unsigned char *u = (const unsigned char *)s;
    while (nm->left && a < b) {
        uint32_t cp;
        bool bad, trunc;
        size_t k = tok_utf8_next(u + a, b - a, &cp, &bad, &trunc);
        if (!tok_cp_is_space(cp))
            break;
        a += k;
    }
    while (nm->right && b > a) {
        size_t j = b - 1;
        while (j > a && (u[j] & 0xC0) == 0x80)
            j--;
        uint32_t cp;
        bool bad, trunc;
        tok_utf8_next(u + j, b - j, &cp, &bad, &trunc);
        if (!tok_cp_is_space(cp))
            break;
        b = j;
    }
    return tok_buf_put(out, s + a, b - a);
}

static bool replace(const tok_norm *nm, const char *s, size_t n, tok_buf *out)
{
    tok_spans sp = {0};
    bool ok = tok_pattern_find(&nm->pat, s, n, &sp);
    for (size_t i = 0; ok && i < sp.n; i++) {
        if (sp.v[i].match)
            ok = tok_buf_put(out, nm->content, nm->content_len);
        else
            ok = tok_buf_put(out, s + sp.v[i].start, sp.v[i].end - sp.v[i].start);
    }
    tok_spans_free(&sp);
    return ok;
}

static bool normalize_one(const tok_norm *nm, const char *s, size_t n, tok_buf *out)
{
    switch (nm->kind) {
    case TOK_NORM_NFC:
    case TOK_NORM_NFD:
    case TOK_NORM_NFKC:
    case TOK_NORM_NFKD:
        return unicode_form(nm, s, n, out);
    case TOK_NORM_LOWERCASE:
        return lowercase(s, n, out);
    case TOK_NORM_STRIP:
        return strip(nm, s, n, out);
    case TOK_NORM_REPLACE:
        return replace(nm, s, n, out);
    case TOK_NORM_PREPEND:
        /* tokenizers prepends only to non-empty text, so a stretch that
         * Strip emptied stays empty. */
        if (n == 0)
            return true;
        return tok_buf_put(out, nm->content, nm->content_len) && tok_buf_put(out, s, n);
    case TOK_NORM_APPEND:
        if (n == 0)
            return true;
        return tok_buf_put(out, s, n) && tok_buf_put(out, nm->content, nm->content_len);
    }
    return false;
}

bool tok_normalize(const tok_tokenizer *t, const char *s, size_t n, tok_buf *out)
{
    out->n = 0;
    if (t->n_norms == 0)
        return tok_buf_put(out, s, n);
    tok_buf a = {0}, b = {0};
    bool ok = tok_buf_put(&a, s, n);
    for (size_t i = 0; ok && i < t->n_norms; i++) {
        b.n = 0;
        ok = normalize_one(&t->norms[i], a.p ? a.p : "", a.n, &b);
        tok_buf x = a;
        a = b;
        b = x;
    }
    if (ok)
        ok = tok_buf_put(out, a.p ? a.p : "", a.n);
    free(a.p);
    free(b.p);
    return ok;
}
