/*
 * lex.c: template source to tokens. Text between tags comes out with
 * Jinja2's whitespace control already applied (the "-" and "+" tag
 * modifiers, trim_blocks, lstrip_blocks, the dropped final newline), so the
 * parser never sees whitespace rules; comments produce no token at all.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja/jj.h"

typedef struct lexer {
    jj_arena *a;
    const char *src;
    size_t len;
    size_t lpos; /* position that line/col below describe */
    int line, col;
    jj_toks *out;
    char *err;
    size_t err_size;
} lexer;

static void where(lexer *L, size_t pos, int *line, int *col)
{
    /* Positions only move forward, except for error reports inside a tag. */
    if (pos < L->lpos) {
        L->lpos = 0;
        L->line = 1;
        L->col = 1;
    }
    for (; L->lpos < pos; L->lpos++) {
        if (L->src[L->lpos] == '\n') {
            L->line++;
            L->col = 1;
        } else if (((unsigned char)L->src[L->lpos] & 0xC0) != 0x80) {
            L->col++;
        }
    }
    *line = L->line;
    *col = L->col;
}

static int lex_error(lexer *L, size_t pos, const char *msg)
{
    int line, col;
    where(L, pos, &line, &col);
    snprintf(L->err, L->err_size, "line %d, column %d: %s", line, col, msg);
    return -1;
}

static jj_tok *push(lexer *L, int t, size_t pos)
{
    jj_toks *o = L->out;
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 256;
        o->v = jj_grow(L->a, o->v, o->cap * sizeof *o->v, cap * sizeof *o->v);
        o->cap = cap;
    }
    jj_tok *k = &o->v[o->n++];
    memset(k, 0, sizeof *k);
    k->t = t;
    where(L, pos, &k->line, &k->col);
    return k;
}

static int is_space(char ch)
{
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\v' || ch == '\f';
}

static int hexval(char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

static size_t put_utf8(char *d, unsigned long cp)
{
    if (cp < 0x80) {
        d[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        d[0] = (char)(0xC0 | (cp >> 6));
        d[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        d[0] = (char)(0xE0 | (cp >> 12));
        d[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        d[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    d[0] = (char)(0xF0 | (cp >> 18));
    d[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    d[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    d[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* A string literal at src[*pos] (the quote). Escapes decode as Python's
 * "unicode-escape" does, which is what Jinja2 applies; an unknown escape
 * keeps its backslash. */
static int lex_string(lexer *L, size_t *pos)
{
    size_t p = *pos, start = p;
    char q = L->src[p++];
    char *d = jj_alloc(L->a, L->len - p + 1);
    size_t n = 0;
    for (;;) {
        if (p >= L->len)
            return lex_error(L, start, "unterminated string");
        char ch = L->src[p];
        if (ch == q) {
            p++;
            break;
        }
        if (ch != '\\') {
            d[n++] = ch;
            p++;
            continue;
        }
        if (p + 1 >= L->len)
            return lex_error(L, start, "unterminated string");
        char e = L->src[p + 1];
        p += 2;
        int digits = 0;
        switch (e) {
        case 'n': d[n++] = '\n'; break;
        case 't': d[n++] = '\t'; break;
        case 'r': d[n++] = '\r'; break;
        case 'a': d[n++] = '\a'; break;
        case 'b': d[n++] = '\b'; break;
        case 'f': d[n++] = '\f'; break;
        case 'v': d[n++] = '\v'; break;
        case '\\': d[n++] = '\\'; break;
        case '\'': d[n++] = '\''; break;
        case '"': d[n++] = '"'; break;
        case '\n': break; /* line continuation */
        case 'x': digits = 2; break;
        case 'u': digits = 4; break;
        case 'U': digits = 8; break;
        default:
            if (e >= '0' && e <= '7') {
                unsigned long v = (unsigned long)(e - '0');
                for (int k = 0; k < 2 && p < L->len && L->src[p] >= '0' && L->src[p] <= '7'; k++)
                    v = v * 8 + (unsigned long)(L->src[p++] - '0');
                n += put_utf8(d + n, v);
            } else {
                d[n++] = '\\';
                d[n++] = e;
            }
        }
        if (digits) {
            unsigned long v = 0;
            for (int k = 0; k < digits; k++) {
                int h = p < L->len ? hexval(L->src[p]) : -1;
                if (h < 0)
                    return lex_error(L, start, "truncated escape in string");
                v = v * 16 + (unsigned long)h;
                p++;
            }
            if (v > 0x10FFFF)
                return lex_error(L, start, "escape out of range in string");
            n += put_utf8(d + n, v); /* at most 4 bytes from at least 4 source bytes */
        }
    }
    jj_tok *k = push(L, T_STR, start);
    k->s = d;
    k->n = n;
    *pos = p;
    return 0;
}

static int lex_number(lexer *L, size_t *pos)
{
    size_t p = *pos, start = p;
    char buf[128];
    size_t n = 0;
    int is_float = 0;
    const char *s = L->src;
#define DIGITS()                                                                                                      \
    while (p < L->len && ((s[p] >= '0' && s[p] <= '9') || (s[p] == '_' && p + 1 < L->len && s[p + 1] >= '0' &&        \
                                                            s[p + 1] <= '9'))) {                                       \
        if (s[p] != '_' && n < sizeof buf - 1)                                                                        \
            buf[n++] = s[p];                                                                                           \
        p++;                                                                                                           \
    }
    DIGITS();
    if (p + 1 < L->len && s[p] == '.' && s[p + 1] >= '0' && s[p + 1] <= '9') {
        is_float = 1;
        buf[n++] = s[p++];
        DIGITS();
    }
    if (p < L->len && (s[p] == 'e' || s[p] == 'E')) {
        size_t q = p + 1;
        if (q < L->len && (s[q] == '+' || s[q] == '-'))
            q++;
        if (q < L->len && s[q] >= '0' && s[q] <= '9') {
            is_float = 1;
            while (p < q && n < sizeof buf - 1)
                buf[n++] = s[p++];
            DIGITS();
        }
    }
#undef DIGITS
    if (n >= sizeof buf - 1)
        return lex_error(L, start, "number too long");
    buf[n] = 0;
    jj_tok *k = push(L, is_float ? T_FLOAT : T_INT, start);
    if (is_float) {
        k->f = strtod(buf, NULL);
    } else {
        char *end;
        k->i = strtoll(buf, &end, 10);
        if (n > 18 && (k->i == LLONG_MAX))
            return lex_error(L, start, "integer too large");
    }
    *pos = p;
    return 0;
}

/* The inside of a {{ }} or {% %} tag from *pos; stops after its end and
 * returns the end's strip sign ('-', '+' or 0). */
static int lex_tag(lexer *L, size_t *pos, int block, int *sign)
{
    static const char *ops2[] = {"//", "**", "==", "!=", "<=", ">="};
    size_t p = *pos, tag_start = p;
    int depth = 0;
    const char *s = L->src;
    for (;;) {
        while (p < L->len && is_space(s[p]))
            p++;
        if (p >= L->len)
            return lex_error(L, tag_start, block ? "missing end of block tag" : "missing end of print tag");
        char c0 = s[p], end0 = block ? '%' : '}';
        if (depth == 0) {
            size_t q = p;
            int sg = 0;
            if ((s[q] == '-' || (block && s[q] == '+')) && q + 2 < L->len + 0 && s[q + 1] == end0 && s[q + 2] == '}')
                sg = s[q++];
            if (q + 1 < L->len && s[q] == end0 && s[q + 1] == '}') {
                push(L, block ? T_BEND : T_VEND, p);
                *pos = q + 2;
                *sign = sg;
                return 0;
            }
        }
        if ((c0 >= 'a' && c0 <= 'z') || (c0 >= 'A' && c0 <= 'Z') || c0 == '_') {
            size_t q = p;
            while (q < L->len && ((s[q] >= 'a' && s[q] <= 'z') || (s[q] >= 'A' && s[q] <= 'Z') ||
                                  (s[q] >= '0' && s[q] <= '9') || s[q] == '_'))
                q++;
            jj_tok *k = push(L, T_NAME, p);
            k->s = s + p;
            k->n = q - p;
            p = q;
        } else if (c0 >= '0' && c0 <= '9') {
            if (lex_number(L, &p))
                return -1;
        } else if (c0 == '\'' || c0 == '"') {
            if (lex_string(L, &p))
                return -1;
        } else {
            size_t n = 0;
            for (size_t k = 0; k < sizeof ops2 / sizeof *ops2; k++)
                if (p + 1 < L->len && s[p] == ops2[k][0] && s[p + 1] == ops2[k][1])
                    n = 2;
            if (!n) {
                if (!strchr("+-*/%~<>=()[]{},.:|", c0) || c0 == 0)
                    return lex_error(L, p, "unexpected character");
                n = 1;
                if (c0 == '(' || c0 == '[' || c0 == '{')
                    depth++;
                else if ((c0 == ')' || c0 == ']' || c0 == '}') && depth > 0)
                    depth--;
            }
            jj_tok *k = push(L, T_OP, p);
            k->s = s + p;
            k->n = n;
            p += n;
        }
    }
}

static void emit_text(lexer *L, size_t pos, const char *p, size_t n)
{
    if (!n)
        return;
    jj_tok *k = push(L, T_TEXT, pos);
    k->s = p;
    k->n = n;
}

int jj_lex(jj_arena *a, const char *src, size_t len, jj_toks *out, char *err, size_t err_size)
{
    lexer L = {a, src, len, 0, 1, 1, out, err, err_size};
    /* keep_trailing_newline is off: one final newline is not output. */
    if (len && src[len - 1] == '\n')
        L.len = --len;
    size_t pos = 0;
    for (;;) {
        size_t start = pos;
        while (start + 1 < len && !(src[start] == '{' && (src[start + 1] == '{' || src[start + 1] == '%' ||
                                                          src[start + 1] == '#')))
            start++;
        if (start + 1 >= len) {
            emit_text(&L, pos, src + pos, len - pos);
            break;
        }
        char kind = src[start + 1];
        char sign = start + 2 < len && (src[start + 2] == '-' || src[start + 2] == '+') ? src[start + 2] : 0;
        if (kind == '{' && sign == '+')
            sign = 0; /* "+" means nothing after "{{" */
        size_t tn = start - pos;
        if (sign == '-') {
            while (tn && is_space(src[pos + tn - 1]))
                tn--;
        } else if (kind != '{' && sign != '+') {
            /* lstrip_blocks: blanks from the start of the line up to a block or comment tag go. */
            size_t l = tn;
            while (l && src[pos + l - 1] != '\n')
                l--;
            int line_start = l > 0 || pos == 0 || src[pos - 1] == '\n';
            size_t k = l;
            while (k < tn && src[pos + k] != '\n' && is_space(src[pos + k]))
                k++;
            if (line_start && k == tn)
                tn = l;
        }
        emit_text(&L, pos, src + pos, tn);
        size_t p = start + 2 + (sign ? 1 : 0);
        int end_sign = 0;
        if (kind == '#') {
            size_t q = p;
            while (q + 1 < len && !(src[q] == '#' && src[q + 1] == '}'))
                q++;
            if (q + 1 >= len)
                return lex_error(&L, start, "missing end of comment tag");
            if (q > p && (src[q - 1] == '-' || src[q - 1] == '+'))
                end_sign = src[q - 1];
            p = q + 2;
        } else {
            push(&L, kind == '%' ? T_BBEGIN : T_VBEGIN, start);
            if (lex_tag(&L, &p, kind == '%', &end_sign))
                return -1;
        }
        if (end_sign == '-') {
            while (p < len && is_space(src[p]))
                p++;
        } else if (kind != '{' && end_sign != '+' && p < len && src[p] == '\n') {
            p++; /* trim_blocks */
        }
        pos = p;
    }
    push(&L, T_EOF, len);
    return 0;
}
