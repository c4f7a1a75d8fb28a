/*
 * tok_encode.c: text to ids. Owns the added-token matcher (leftmost-longest
 * over the raw text, then over each normalized stretch, with lstrip /
 * rstrip / single_word as tokenizers' AddedVocabulary applies them) and
 * the encode driver: lossy UTF-8 cleaning, normalizer, pre-tokenizers,
 * BPE per word, BOS/EOS.
 */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

/* ---- matcher construction ---- */

static int entry_cmp(const void *pa, const void *pb)
{
    const tok_match_entry *a = pa, *b = pb;
    unsigned ca = (unsigned char)a->s[0], cb = (unsigned char)b->s[0];
    if (ca != cb)
        return ca < cb ? -1 : 1;
    if (a->n != b->n)
        return a->n > b->n ? -1 : 1; /* longest first within a bucket */
    return a->added < b->added ? -1 : a->added > b->added;
}

static void matcher_free(tok_matcher *m)
{
    for (size_t i = 0; i < m->n; i++)
        free(m->v[i].s);
    free(m->v);
    m->v = NULL;
    m->n = 0;
}

static engine_status matcher_build(tok_tokenizer *t, tok_matcher *m, bool normalized, err_buf *e)
{
    m->v = calloc(t->n_added ? t->n_added : 1, sizeof *m->v);
    if (!m->v)
        return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "tokenizer: out of memory building added-token matcher");
    tok_buf nb = {0};
    for (size_t i = 0; i < t->n_added; i++) {
        const tok_added *a = &t->added[i];
        if (a->normalized != normalized || a->len == 0)
            continue;
        const char *s = a->content;
        size_t n = a->len;
        if (normalized) {
            /* tokenizers matches these against normalized text, so it
             * normalizes the token's content the same way. */
            if (!tok_normalize(t, a->content, a->len, &nb)) {
                free(nb.p);
                return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "tokenizer: out of memory normalizing added token");
            }
            s = nb.p;
            n = nb.n;
            if (n == 0)
                continue;
        }
        char *c = malloc(n);
        if (!c) {
            free(nb.p);
            return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "tokenizer: out of memory building added-token matcher");
        }
        memcpy(c, s, n);
        m->v[m->n++] = (tok_match_entry){c, n, (int32_t)i};
    }
    free(nb.p);
    if (m->n > 1)
        qsort(m->v, m->n, sizeof *m->v, entry_cmp);
    size_t k = 0;
    for (unsigned b = 0; b < 257; b++) {
        while (k < m->n && (unsigned char)m->v[k].s[0] < b)
            k++;
        m->first[b] = (uint32_t)k;
    }
    return ENGINE_OK;
}

engine_status tok_build_matchers(tok_tokenizer *t, err_buf *e)
{
    engine_status st = matcher_build(t, &t->match_raw, false, e);
    if (st == ENGINE_OK)
        st = matcher_build(t, &t->match_norm, true, e);
    return st;
}

void tok_free_matchers(tok_tokenizer *t)
{
    matcher_free(&t->match_raw);
    matcher_free(&t->match_norm);
}

/* ---- matching ---- */

typedef struct seg {
    size_t start, end;
    int32_t id; /* -1: plain text */
} seg;

typedef struct segs {
    seg *v;
    size_t n, cap;
} segs;

static bool seg_add(segs *s, size_t a, size_t b, int32_t id)
{
    if (s->n == s->cap) {
        size_t c = s->cap ? s->cap * 2 : 16;
        seg *v = realloc(s->v, c * sizeof *v);
        if (!v)
            return false;
        s->v = v;
        s->cap = c;
    }
    s->v[s->n++] = (seg){a, b, id};
    return true;
}

static uint32_t cp_before(const char *s, size_t i)
{
    size_t j = i - 1;
    while (j > 0 && ((unsigned char)s[j] & 0xC0) == 0x80 && i - j < 4)
        j--;
    uint32_t cp;
    bool bad, trunc;
    tok_utf8_next((const unsigned char *)s + j, i - j, &cp, &bad, &trunc);
    return cp;
}

static uint32_t cp_at(const char *s, size_t n, size_t i, size_t *len)
{
    uint32_t cp;
    bool bad, trunc;
    *len = tok_utf8_next((const unsigned char *)s + i, n - i, &cp, &bad, &trunc);
    return cp;
}

/* Leftmost match at or after pos, longest at that position; -1 if none. */
static const tok_match_entry *match_next(const tok_matcher *m, const char *s, size_t n, size_t pos,
                                         size_t *at)
{
    for (size_t p = pos; p < n; p++) {
        unsigned b = (unsigned char)s[p];
        for (uint32_t k = m->first[b]; k < m->first[b + 1]; k++) {
            const tok_match_entry *en = &m->v[k];
            if (en->n <= n - p && memcmp(s + p, en->s, en->n) == 0) {
                *at = p;
                return en;
            }
        }
    }
    return NULL;
}

static bool find_added(const tok_tokenizer *t, const tok_matcher *m, const char *s, size_t n, segs *out)
{
    out->n = 0;
    size_t done = 0, pos = 0;
    while (m->n > 0 && pos < n) {
        size_t ms;
        const tok_match_entry *en = match_next(m, s, n, pos, &ms);
        if (!en)
            break;
        size_t me = ms + en->n;
        pos = me;
        const tok_added *a = &t->added[en->added];
        if (a->single_word) {
            size_t k;
            bool left_ok = ms == 0 || !tok_cp_is_word(cp_before(s, ms));
            bool right_ok = me == n || !tok_cp_is_word(cp_at(s, n, me, &k));
            if (!left_ok || !right_ok)
                continue;
        }
        size_t a0 = ms, a1 = me;
        if (a->lstrip) {
            while (a0 > done) {
                uint32_t cp = cp_before(s, a0);
                if (!tok_cp_is_space(cp))
                    break;
                a0 -= tok_utf8_len(cp);
            }
        }
        if (a->rstrip) {
            while (a1 < n) {
                size_t k;
                if (!tok_cp_is_space(cp_at(s, n, a1, &k)))
                    break;
                a1 += k;
            }
        }
        if (a0 < done) /* only an rstrip reaching into this match gets here */
            a0 = done;
        if (a0 > done && !seg_add(out, done, a0, -1))
            return false;
        if (!seg_add(out, a0, a1, a->id))
            return false;
        done = a1;
        if (pos < done)
            pos = done;
    }
    if (done < n && !seg_add(out, done, n, -1))
        return false;
    return true;
}

/* ---- encode ---- */

typedef struct enc_ctx {
    tok_buf clean, norm;
    segs s1, s2;
    tok_strs words, scratch;
    tok_spans spans;
    tok_bpe_scratch *bpe;
    tok_ids out;
} enc_ctx;

static void ctx_free(enc_ctx *c)
{
    free(c->clean.p);
    free(c->norm.p);
    free(c->s1.v);
    free(c->s2.v);
    tok_strs_free(&c->words);
    tok_strs_free(&c->scratch);
    tok_spans_free(&c->spans);
    tok_bpe_scratch_free(c->bpe);
}

static bool encode_text(const tok_tokenizer *t, enc_ctx *c, size_t start, size_t end)
{
    if (!tok_normalize(t, c->clean.p + start, end - start, &c->norm))
        return false;
    const char *ns = c->norm.p ? c->norm.p : "";
    if (!find_added(t, &t->match_norm, ns, c->norm.n, &c->s2))
        return false;
    for (size_t j = 0; j < c->s2.n; j++) {
        seg g = c->s2.v[j];
        if (g.id >= 0) {
            if (!tok_ids_push(&c->out, g.id))
                return false;
            continue;
        }
        bool origin = start == 0 && g.start == 0;
        if (!tok_pretokenize(t, ns + g.start, g.end - g.start, origin, &c->words, &c->scratch, &c->spans))
            return false;
        for (size_t w = 0; w < c->words.n; w++)
            if (!tok_bpe_word(t, c->words.text.p + c->words.off[w], c->words.len[w], c->bpe, &c->out))
                return false;
    }
    return true;
}

engine_status tok_encode(const tok_tokenizer *t, const char *text, size_t len, bool add_special, int32_t **ids,
                         size_t *n_ids, err_buf *e)
{
    if (!t || (!text && len > 0) || !ids || !n_ids)
        return err_set(e, ENGINE_ERR_INVALID_ARG, "tok_encode: NULL argument");
    *ids = NULL;
    *n_ids = 0;
    enc_ctx c = {0};
    c.bpe = tok_bpe_scratch_new();
    bool ok = c.bpe != NULL && tok_utf8_lossy(&c.clean, text ? text : "", len, NULL);
    if (ok && add_special)
        ok = tok_ids_put(&c.out, t->prefix, t->n_prefix);
    if (ok)
        ok = find_added(t, &t->match_raw, c.clean.p, c.clean.n, &c.s1);
    for (size_t i = 0; ok && i < c.s1.n; i++) {
        seg g = c.s1.v[i];
        if (g.id >= 0)
            ok = tok_ids_push(&c.out, g.id);
        else
            ok = encode_text(t, &c, g.start, g.end);
    }
    if (ok && add_special)
        ok = tok_ids_put(&c.out, t->suffix, t->n_suffix);
    /* An empty result still gets a buffer, so callers may always free(). */
    if (ok && c.out.p == NULL)
        ok = (c.out.p = malloc(sizeof(int32_t))) != NULL;
    ctx_free(&c);
    if (!ok) {
        free(c.out.p);
        return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "tok_encode: out of memory (%zu bytes of input)", len);
    }
    *ids = c.out.p;
    *n_ids = c.out.n;
    return ENGINE_OK;
}
