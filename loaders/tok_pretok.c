/*
 * tok_pretok.c: pre-tokenizers, which cut a normalized stretch of text into
 * the words BPE sees: Split (with tokenizers' five delimiter behaviours and
 * invert), ByteLevel (prefix space, GPT-2 regex, bytes to printable code
 * points), Metaspace, Digits, Whitespace, WhitespaceSplit, Punctuation.
 */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

/* Turn pattern spans into the kept ranges of one piece, in place in sp:
 * match=true now marks a range to drop (Removed). */
static void apply_behavior(tok_spans *sp, enum tok_split_behavior b, bool invert)
{
    if (invert)
        for (size_t i = 0; i < sp->n; i++)
            sp->v[i].match = !sp->v[i].match;
    size_t k = 0;
    bool prev = false;
    switch (b) {
    case TOK_REMOVED:
        return;
    case TOK_ISOLATED:
        for (size_t i = 0; i < sp->n; i++)
            sp->v[i].match = false;
        return;
    case TOK_CONTIGUOUS:  /* runs of matches, and runs of non-matches, join */
    case TOK_MERGED_PREV: /* a match joins the non-match before it */
        for (size_t i = 0; i < sp->n; i++) {
            bool m = sp->v[i].match;
            bool join = k > 0 && (b == TOK_CONTIGUOUS ? m == prev : m && !prev);
            if (join)
                sp->v[k - 1].end = sp->v[i].end;
            else
                sp->v[k++] = (tok_span){sp->v[i].start, sp->v[i].end, false};
            prev = m;
        }
        sp->n = k;
        return;
    case TOK_MERGED_NEXT:
        /* A match joins the non-match right after it; a match followed by
         * another match (or by nothing) stands alone. */
        for (size_t i = 0; i < sp->n; i++) {
            tok_span s = sp->v[i];
            if (s.match && i + 1 < sp->n && !sp->v[i + 1].match)
                s.end = sp->v[++i].end;
            sp->v[k++] = (tok_span){s.start, s.end, false};
        }
        sp->n = k;
        return;
    }
}

/* Split piece s[0..n) with pattern + behaviour, appending the kept
 * non-empty ranges to out. */
static bool split_piece(const tok_pattern *pat, enum tok_split_behavior b, bool invert, const char *s, size_t n,
                        uint8_t flag, tok_strs *out, tok_spans *sp)
{
    if (!tok_pattern_find(pat, s, n, sp))
        return false;
    apply_behavior(sp, b, invert);
    for (size_t i = 0; i < sp->n; i++) {
        tok_span r = sp->v[i];
        if (r.match || r.end <= r.start)
            continue;
        if (!tok_strs_add_copy(out, s + r.start, r.end - r.start, r.start == 0 ? flag : 0))
            return false;
    }
    return true;
}

static bool byte_level(const tok_tokenizer *t, const tok_pretok *p, const char *s, size_t n, uint8_t flag,
                       tok_strs *out, tok_spans *sp)
{
    tok_buf tmp = {0};
    const char *src = s;
    size_t len = n;
    if (p->add_prefix_space && !(n > 0 && s[0] == ' ')) {
        if (!tok_buf_putc(&tmp, ' ') || !tok_buf_put(&tmp, s, n)) {
            free(tmp.p);
            return false;
        }
        src = tmp.p;
        len = tmp.n;
    }
    size_t first = out->n;
    bool ok;
    if (p->has_pat)
        ok = split_piece(&p->pat, TOK_ISOLATED, false, src, len, flag, out, sp);
    else
        ok = len == 0 || tok_strs_add_copy(out, src, len, flag);
    free(tmp.p);
    if (!ok)
        return false;
    /* Re-spell each new word with the byte table, appending the mapped
     * text and pointing the word at it. */
    for (size_t i = first; i < out->n; i++) {
        size_t off = out->off[i], wl = out->len[i];
        if (!tok_buf_reserve(&out->text, 2 * wl))
            return false;
        size_t start = out->text.n;
        for (size_t j = 0; j < wl; j++) {
            unsigned char c = (unsigned char)out->text.p[off + j];
            tok_buf_put_cp(&out->text, t->bytemap.to_cp[c]); /* capacity reserved above */
        }
        out->off[i] = start;
        out->len[i] = out->text.n - start;
    }
    return true;
}

static bool metaspace(const tok_pretok *p, const char *s, size_t n, uint8_t flag, tok_strs *out, tok_spans *sp)
{
    tok_buf rep = {0};
    char r[4];
    size_t rl = tok_cp_encode(p->replacement, r);
    bool ok = true;
    bool starts = n >= rl && memcmp(s, r, rl) == 0;
    /* A leading space counts: it becomes the replacement before the test. */
    if (!starts && n > 0 && s[0] == ' ')
        starts = true;
    bool prepend = !starts && (p->prepend == TOK_PREPEND_ALWAYS || (p->prepend == TOK_PREPEND_FIRST && flag));
    if (prepend)
        ok = tok_buf_put(&rep, r, rl);
    for (size_t i = 0; ok && i < n; i++)
        ok = s[i] == ' ' ? tok_buf_put(&rep, r, rl) : tok_buf_putc(&rep, s[i]);
    if (ok) {
        if (p->split) {
            tok_pattern pat = {.kind = TOK_PAT_STRING, .str = r, .len = rl};
            ok = split_piece(&pat, TOK_MERGED_NEXT, false, rep.p ? rep.p : "", rep.n, flag, out, sp);
        } else if (rep.n > 0) {
            ok = tok_strs_add_copy(out, rep.p, rep.n, flag);
        }
    }
    free(rep.p);
    return ok;
}

bool tok_pretokenize(const tok_tokenizer *t, const char *s, size_t n, bool at_origin, tok_strs *out,
                     tok_strs *scratch, tok_spans *spans)
{
    tok_strs_clear(out);
    if (n == 0)
        return true;
    if (!tok_strs_add_copy(out, s, n, at_origin ? 1 : 0))
        return false;
    for (size_t k = 0; k < t->n_pretoks; k++) {
        const tok_pretok *p = &t->pretoks[k];
        tok_strs_clear(scratch);
        for (size_t i = 0; i < out->n; i++) {
            const char *w = out->text.p + out->off[i];
            size_t wl = out->len[i];
            uint8_t f = out->flag[i];
            bool ok;
            switch (p->kind) {
            case TOK_PRE_BYTELEVEL:
                ok = byte_level(t, p, w, wl, f, scratch, spans);
                break;
            case TOK_PRE_METASPACE:
                ok = metaspace(p, w, wl, f, scratch, spans);
                break;
            default:
                ok = split_piece(&p->pat, p->behavior, p->invert, w, wl, f, scratch, spans);
                break;
            }
            if (!ok)
                return false;
        }
        tok_strs x = *out;
        *out = *scratch;
        *scratch = x;
    }
    return true;
}
