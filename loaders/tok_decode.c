/*
 * tok_decode.c: ids to text. Runs the decoder chain the way tokenizers'
 * decode_chain does (a list of strings through ByteLevel, Replace,
 * ByteFallback, Fuse, Strip, Metaspace, then concatenated), and the
 * streaming decoder built on it.
 *
 * Streaming cuts the id sequence where the chain is provably local: after
 * a token that does not leave a ByteFallback run open and does not end
 * the ByteLevel bytes inside a character. Text decoded up to such a cut
 * never changes, so it is emitted; what follows is decoded as a
 * continuation (at_start false). Chains whose whole-text decoders would
 * see across a cut (e.g. a Replace after Fuse) are decoded at flush only.
 */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

static bool is_byte_token(const char *s, size_t n, uint8_t *byte)
{
    /* "<0xNN>"; the two digits are read as Rust's u8::from_str_radix(_, 16)
     * reads them, which also takes a leading '+'. */
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>')
        return false;
    unsigned v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        unsigned d;
        if (c >= '0' && c <= '9')
            d = (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            d = (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            d = (unsigned)(c - 'A' + 10);
        else if (c == '+' && i == 3)
            continue;
        else
            return false;
        v = v * 16 + d;
    }
    *byte = (uint8_t)v;
    return true;
}

static const char *item(const tok_strs *l, size_t i)
{
    /* An empty list has no buffer yet: point at "" rather than NULL + 0. */
    return l->text.p ? l->text.p + l->off[i] : "";
}

static bool dec_replace(const tok_dec *d, const tok_strs *in, tok_strs *out, tok_spans *sp)
{
    for (size_t i = 0; i < in->n; i++) {
        const char *s = item(in, i);
        size_t n = in->len[i], start = out->text.n;
        if (!tok_pattern_find(&d->pat, s, n, sp))
            return false;
        for (size_t k = 0; k < sp->n; k++) {
            bool ok = sp->v[k].match ? tok_buf_put(&out->text, d->content, d->content_len)
                                     : tok_buf_put(&out->text, s + sp->v[k].start, sp->v[k].end - sp->v[k].start);
            if (!ok)
                return false;
        }
        if (!tok_strs_add(out, start, out->text.n - start, 0))
            return false;
    }
    return true;
}

static bool flush_run(const tok_buf *run, tok_strs *out)
{
    if (run->n == 0)
        return true;
    if (tok_utf8_valid(run->p, run->n))
        return tok_strs_add_copy(out, run->p, run->n, 0);
    /* One U+FFFD per byte token when the run as a whole is not UTF-8. */
    for (size_t k = 0; k < run->n; k++)
        if (!tok_strs_add_copy(out, "\xEF\xBF\xBD", 3, 0))
            return false;
    return true;
}

static bool dec_byte_fallback(const tok_strs *in, tok_strs *out, bool *open_tail)
{
    tok_buf run = {0};
    bool ok = true;
    for (size_t i = 0; ok && i < in->n; i++) {
        uint8_t b;
        if (is_byte_token(item(in, i), in->len[i], &b)) {
            ok = tok_buf_putc(&run, (char)b);
            if (i + 1 == in->n)
                *open_tail = true; /* a later byte token could change this run */
            continue;
        }
        ok = flush_run(&run, out) && tok_strs_add_copy(out, item(in, i), in->len[i], 0);
        run.n = 0;
    }
    ok = ok && flush_run(&run, out);
    free(run.p);
    return ok;
}

static bool dec_fuse(const tok_strs *in, tok_strs *out)
{
    size_t start = out->text.n;
    for (size_t i = 0; i < in->n; i++)
        if (!tok_buf_put(&out->text, item(in, i), in->len[i]))
            return false;
    return tok_strs_add(out, start, out->text.n - start, 0);
}

static bool dec_strip(const tok_dec *d, const tok_strs *in, tok_strs *out, bool whole, bool at_start,
                      bool at_end)
{
    char c[4];
    size_t cl = tok_cp_encode(d->ch, c);
    size_t n_start = whole && !at_start ? 0 : d->start;
    size_t n_stop = whole && !at_end ? 0 : d->stop;
    for (size_t i = 0; i < in->n; i++) {
        const char *s = item(in, i);
        size_t a = 0, b = in->len[i];
        for (size_t k = 0; k < n_start && b - a >= cl && memcmp(s + a, c, cl) == 0; k++)
            a += cl;
        for (size_t k = 0; k < n_stop && b - a >= cl && memcmp(s + b - cl, c, cl) == 0; k++)
            b -= cl;
        if (!tok_strs_add_copy(out, s + a, b - a, 0))
            return false;
    }
    return true;
}

static bool dec_metaspace(const tok_dec *d, const tok_strs *in, tok_strs *out, bool at_start)
{
    char c[4];
    size_t cl = tok_cp_encode(d->ch, c);
    for (size_t i = 0; i < in->n; i++) {
        const char *s = item(in, i);
        size_t n = in->len[i], start = out->text.n;
        bool drop = i == 0 && at_start && d->prepend;
        for (size_t k = 0; k < n;) {
            if (n - k >= cl && memcmp(s + k, c, cl) == 0) {
                if (!drop && !tok_buf_putc(&out->text, ' '))
                    return false;
                k += cl;
            } else {
                if (!tok_buf_putc(&out->text, s[k]))
                    return false;
                k++;
            }
        }
        if (!tok_strs_add(out, start, out->text.n - start, 0))
            return false;
    }
    return true;
}

static bool dec_byte_level(const tok_tokenizer *t, const tok_strs *in, tok_strs *out, bool *open_tail)
{
    tok_buf bytes = {0};
    bool ok = true;
    for (size_t i = 0; ok && i < in->n; i++) {
        const char *s = item(in, i);
        size_t n = in->len[i], mark = bytes.n;
        bool mapped = true;
        for (size_t k = 0; ok && k < n;) {
            uint32_t cp;
            bool bad, trunc;
            k += tok_utf8_next((const unsigned char *)s + k, n - k, &cp, &bad, &trunc);
            int b = cp < 324 ? t->bytemap.to_byte[cp] : -1;
            if (bad || b < 0) {
                mapped = false;
                break;
            }
            ok = tok_buf_putc(&bytes, (char)b);
        }
        if (ok && !mapped) { /* a token outside the byte alphabet passes through as its UTF-8 */
            bytes.n = mark;
            ok = tok_buf_put(&bytes, s, n);
        }
    }
    size_t start = out->text.n;
    bool tail = false;
    ok = ok && tok_utf8_lossy(&out->text, bytes.p ? bytes.p : "", bytes.n, &tail) &&
         tok_strs_add(out, start, out->text.n - start, 0);
    if (tail)
        *open_tail = true;
    free(bytes.p);
    return ok;
}

bool tok_decode_ids(const tok_tokenizer *t, const int32_t *ids, size_t n, bool at_start, bool at_end, tok_buf *out,
                    bool *open_tail)
{
    out->n = 0;
    *open_tail = false;
    tok_strs a = {0}, b = {0};
    tok_spans sp = {0};
    bool ok = true;
    for (size_t i = 0; ok && i < n; i++) {
        size_t len = 0;
        const char *s = tok_str_of(t, ids[i], &len);
        ok = tok_strs_add_copy(&a, s ? s : "", s ? len : 0, 0);
    }
    bool whole = false;
    for (size_t k = 0; ok && k < t->n_decs; k++) {
        const tok_dec *d = &t->decs[k];
        tok_strs_clear(&b);
        switch (d->kind) {
        case TOK_DEC_REPLACE:
            ok = dec_replace(d, &a, &b, &sp);
            break;
        case TOK_DEC_BYTEFALLBACK:
            ok = dec_byte_fallback(&a, &b, open_tail);
            break;
        case TOK_DEC_FUSE:
            ok = dec_fuse(&a, &b);
            whole = true;
            break;
        case TOK_DEC_STRIP:
            ok = dec_strip(d, &a, &b, whole, at_start, at_end);
            break;
        case TOK_DEC_METASPACE:
            ok = dec_metaspace(d, &a, &b, at_start);
            break;
        case TOK_DEC_BYTELEVEL:
            ok = dec_byte_level(t, &a, &b, open_tail);
            whole = true;
            break;
        }
        tok_strs x = a;
        a = b;
        b = x;
    }
    for (size_t i = 0; ok && i < a.n; i++) {
        /* No decoder: tokenizers joins the tokens with spaces. */
        if (t->no_decoder && !(i == 0 && at_start))
            ok = tok_buf_putc(out, ' ');
        ok = ok && tok_buf_put(out, item(&a, i), a.len[i]);
    }
    ok = ok && tok_buf_reserve(out, 0);
    if (ok)
        out->p[out->n] = '\0';
    tok_strs_free(&a);
    tok_strs_free(&b);
    tok_spans_free(&sp);
    return ok;
}

static engine_status check_id(const tok_tokenizer *t, int32_t id, err_buf *e)
{
    size_t len;
    if (id < 0 || id >= t->n_ids || !tok_str_of(t, id, &len))
        return err_set(e, ENGINE_ERR_INVALID_ARG, "tok_decode: id %d is not in the vocabulary (size %d)", (int)id,
                       (int)t->n_ids);
    return ENGINE_OK;
}

static bool skipped(const tok_tokenizer *t, int32_t id, bool skip_special)
{
    return skip_special && tok_is_special(t, id);
}

engine_status tok_decode(const tok_tokenizer *t, const int32_t *ids, size_t n, bool skip_special, char **text,
                         size_t *len, err_buf *e)
{
    if (!t || (!ids && n > 0) || !text || !len)
        return err_set(e, ENGINE_ERR_INVALID_ARG, "tok_decode: NULL argument");
    *text = NULL;
    *len = 0;
    tok_ids keep = {0};
    for (size_t i = 0; i < n; i++) {
        engine_status st = check_id(t, ids[i], e);
        if (st != ENGINE_OK) {
            free(keep.p);
            return st;
        }
        if (!skipped(t, ids[i], skip_special) && !tok_ids_push(&keep, ids[i])) {
            free(keep.p);
            return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "tok_decode: out of memory");
        }
    }
    tok_buf out = {0};
    bool open;
    bool ok = tok_decode_ids(t, keep.p, keep.n, true, true, &out, &open);
    free(keep.p);
    if (!ok) {
        free(out.p);
        return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "tok_decode: out of memory");
    }
    *text = out.p;
    *len = out.n;
    return ENGINE_OK;
}

/* ---- streaming ---- */

struct tok_stream {
    const tok_tokenizer *t;
    bool skip_special;
    bool started; /* text before the current window has been cut off and emitted */
    tok_ids win;  /* ids since the last cut */
    tok_buf out;  /* what the last call returned */
};

tok_stream *tok_stream_new(const tok_tokenizer *t, bool skip_special)
{
    if (!t)
        return NULL;
    tok_stream *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->t = t;
    s->skip_special = skip_special;
    if (!tok_buf_reserve(&s->out, 0)) {
        free(s);
        return NULL;
    }
    s->out.p[0] = '\0';
    return s;
}

void tok_stream_free(tok_stream *s)
{
    if (!s)
        return;
    free(s->win.p);
    free(s->out.p);
    free(s);
}

static void nothing(tok_stream *s, const char **text, size_t *len)
{
    s->out.n = 0;
    s->out.p[0] = '\0';
    *text = s->out.p;
    *len = 0;
}

engine_status tok_stream_push(tok_stream *s, int32_t id, const char **text, size_t *len)
{
    if (!s || !text || !len)
        return ENGINE_ERR_INVALID_ARG;
    nothing(s, text, len);
    if (check_id(s->t, id, NULL) != ENGINE_OK)
        return ENGINE_ERR_INVALID_ARG;
    if (skipped(s->t, id, s->skip_special))
        return ENGINE_OK;
    if (!tok_ids_push(&s->win, id))
        return ENGINE_ERR_OUT_OF_MEMORY;
    if (!s->t->streamable)
        return ENGINE_OK;
    bool open;
    if (!tok_decode_ids(s->t, s->win.p, s->win.n, !s->started, false, &s->out, &open))
        return ENGINE_ERR_OUT_OF_MEMORY;
    /* Until some text has come out, a Strip at the start of the text may
     * still reach into what follows, so the first cut waits for text. */
    if (open || (!s->started && s->out.n == 0)) {
        nothing(s, text, len);
        return ENGINE_OK;
    }
    s->started = true;
    s->win.n = 0;
    *text = s->out.p;
    *len = s->out.n;
    return ENGINE_OK;
}

engine_status tok_stream_flush(tok_stream *s, const char **text, size_t *len)
{
    if (!s || !text || !len)
        return ENGINE_ERR_INVALID_ARG;
    nothing(s, text, len);
    if (s->win.n == 0)
        return ENGINE_OK;
    bool open;
    if (!tok_decode_ids(s->t, s->win.p, s->win.n, !s->started, true, &s->out, &open))
        return ENGINE_ERR_OUT_OF_MEMORY;
    s->started = s->started || s->out.n > 0;
    s->win.n = 0;
    *text = s->out.p;
    *len = s->out.n;
    return ENGINE_OK;
}
