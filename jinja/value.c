/*
 * value.c: the arena, values and their conversions: from JSON, to Python's
 * str() and repr() (what "{{ x }}" prints), and json.dumps as transformers'
 * tojson calls it. Dicts keep insertion order, as Python's do.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja/jj.h"

struct jj_block {
    jj_block *next;
    size_t used, size;
    _Alignas(16) unsigned char data[];
};

static _Noreturn void arena_fail(jj_arena *a)
{
    if (a->err && a->err_size)
        snprintf(a->err, a->err_size, "%s", a->oom ? a->oom : "out of memory");
    longjmp(*a->fail, 1);
}

void *jj_alloc(jj_arena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (n == 0)
        n = 16;
    jj_block *b = a->head;
    if (!b || b->size - b->used < n) {
        if (a->cap && (n > a->cap || a->used > a->cap - n))
            arena_fail(a);
        size_t size = n > 60000 ? n : 65536 - sizeof *b;
        b = malloc(sizeof *b + size);
        if (!b)
            arena_fail(a);
        b->size = size;
        b->used = 0;
        b->next = a->head;
        a->head = b;
        a->used += size;
    }
    void *p = b->data + b->used;
    b->used += n;
    memset(p, 0, n);
    return p;
}

void *jj_grow(jj_arena *a, void *p, size_t old, size_t n)
{
    void *q = jj_alloc(a, n);
    if (old)
        memcpy(q, p, old < n ? old : n);
    return q;
}

char *jj_strndup(jj_arena *a, const char *s, size_t n)
{
    char *d = jj_alloc(a, n + 1);
    if (n)
        memcpy(d, s, n);
    return d;
}

void jj_arena_free(jj_arena *a)
{
    jj_block *b = a->head;
    while (b) {
        jj_block *nx = b->next;
        free(b);
        b = nx;
    }
    a->head = NULL;
    a->used = 0;
}

/* Constants: never written after initialisation. */
jj_val jj_undef_v = {.t = JV_UNDEF}, jj_none_v = {.t = JV_NONE}, jj_true_v = {.t = JV_BOOL, .u.b = 1},
       jj_false_v = {.t = JV_BOOL, .u.b = 0};

jj_val *jj_undef(jj_ctx *c, const char *name)
{
    jj_val *v = jj_alloc(c->a, sizeof *v);
    v->t = JV_UNDEF;
    v->uname = name;
    return v;
}
jj_val *jj_bool(int b) { return b ? &jj_true_v : &jj_false_v; }
jj_val *jj_int(jj_ctx *c, long long i)
{
    jj_val *v = jj_alloc(c->a, sizeof *v);
    v->t = JV_INT;
    v->u.i = i;
    return v;
}
jj_val *jj_float(jj_ctx *c, double f)
{
    jj_val *v = jj_alloc(c->a, sizeof *v);
    v->t = JV_FLOAT;
    v->u.f = f;
    return v;
}
jj_val *jj_str(jj_ctx *c, const char *p, size_t n)
{
    if (n > c->max_output * 4 + 4096)
        jj_fail(c, "string longer than the output limit");
    jj_val *v = jj_alloc(c->a, sizeof *v);
    v->t = JV_STR;
    v->u.s.p = jj_strndup(c->a, p, n);
    v->u.s.n = n;
    return v;
}
jj_val *jj_strz(jj_ctx *c, const char *p) { return jj_str(c, p, strlen(p)); }
jj_val *jj_list(jj_ctx *c, int t)
{
    jj_val *v = jj_alloc(c->a, sizeof *v);
    v->t = t;
    return v;
}
void jj_list_push(jj_ctx *c, jj_val *l, jj_val *x)
{
    if (l->u.l.n == l->u.l.cap) {
        size_t cap = l->u.l.cap ? l->u.l.cap * 2 : 4;
        l->u.l.v = jj_grow(c->a, l->u.l.v, l->u.l.cap * sizeof(jj_val *), cap * sizeof(jj_val *));
        l->u.l.cap = cap;
    }
    l->u.l.v[l->u.l.n++] = x;
}
jj_val *jj_dict(jj_ctx *c, int t) { return jj_list(c, t); }

jj_val *jj_dict_get(const jj_val *d, const char *k, size_t n)
{
    for (size_t i = 0; i < d->u.d.n; i++) {
        const jj_val *key = d->u.d.k[i];
        if (key->t == JV_STR && key->u.s.n == n && !memcmp(key->u.s.p, k, n))
            return d->u.d.v[i];
    }
    return NULL;
}

void jj_dict_set(jj_ctx *c, jj_val *d, jj_val *k, jj_val *v)
{
    for (size_t i = 0; i < d->u.d.n; i++)
        if (jj_eq(d->u.d.k[i], k)) {
            d->u.d.v[i] = v;
            return;
        }
    if (d->u.d.n == d->u.d.cap) {
        size_t cap = d->u.d.cap ? d->u.d.cap * 2 : 4;
        d->u.d.k = jj_grow(c->a, d->u.d.k, d->u.d.cap * sizeof(jj_val *), cap * sizeof(jj_val *));
        d->u.d.v = jj_grow(c->a, d->u.d.v, d->u.d.cap * sizeof(jj_val *), cap * sizeof(jj_val *));
        d->u.d.cap = cap;
    }
    d->u.d.k[d->u.d.n] = k;
    d->u.d.v[d->u.d.n++] = v;
}

jj_val *jj_from_json(jj_ctx *c, const json_t *j)
{
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        jj_val *d = jj_dict(c, JV_DICT);
        const char *k;
        json_t *v;
        /* json_object_foreach is not const-clean; the object is only read. */
        json_object_foreach((json_t *)j, k, v) jj_dict_set(c, d, jj_strz(c, k), jj_from_json(c, v));
        return d;
    }
    case JSON_ARRAY: {
        jj_val *l = jj_list(c, JV_LIST);
        for (size_t i = 0; i < json_array_size(j); i++)
            jj_list_push(c, l, jj_from_json(c, json_array_get(j, i)));
        return l;
    }
    case JSON_STRING: return jj_str(c, json_string_value(j), json_string_length(j));
    case JSON_INTEGER: return jj_int(c, (long long)json_integer_value(j));
    case JSON_REAL: return jj_float(c, json_real_value(j));
    case JSON_TRUE: return &jj_true_v;
    case JSON_FALSE: return &jj_false_v;
    default: return &jj_none_v;
    }
}

int jj_truthy(const jj_val *v)
{
    switch (v->t) {
    case JV_UNDEF: case JV_NONE: return 0;
    case JV_BOOL: return v->u.b;
    case JV_INT: return v->u.i != 0;
    case JV_FLOAT: return v->u.f != 0;
    case JV_STR: return v->u.s.n != 0;
    case JV_LIST: case JV_TUPLE: return v->u.l.n != 0;
    case JV_DICT: return v->u.d.n != 0;
    default: return 1;
    }
}

static int is_num(const jj_val *v) { return v->t == JV_INT || v->t == JV_FLOAT || v->t == JV_BOOL; }
static double num(const jj_val *v) { return v->t == JV_FLOAT ? v->u.f : v->t == JV_INT ? (double)v->u.i : v->u.b; }

/* Python's ==: numbers across int/float/bool, sequences and dicts by content. */
int jj_eq(const jj_val *a, const jj_val *b)
{
    if (is_num(a) && is_num(b)) {
        if (a->t != JV_FLOAT && b->t != JV_FLOAT)
            return (a->t == JV_INT ? a->u.i : a->u.b) == (b->t == JV_INT ? b->u.i : b->u.b);
        return num(a) == num(b);
    }
    if ((a->t == JV_LIST || a->t == JV_TUPLE) && a->t == b->t) {
        if (a->u.l.n != b->u.l.n)
            return 0;
        for (size_t i = 0; i < a->u.l.n; i++)
            if (!jj_eq(a->u.l.v[i], b->u.l.v[i]))
                return 0;
        return 1;
    }
    if (a->t != b->t)
        return 0;
    switch (a->t) {
    case JV_UNDEF: case JV_NONE: return 1;
    case JV_STR: return a->u.s.n == b->u.s.n && !memcmp(a->u.s.p, b->u.s.p, a->u.s.n);
    case JV_DICT:
        if (a->u.d.n != b->u.d.n)
            return 0;
        for (size_t i = 0; i < a->u.d.n; i++) {
            const jj_val *k = a->u.d.k[i];
            const jj_val *o = k->t == JV_STR ? jj_dict_get(b, k->u.s.p, k->u.s.n) : NULL;
            if (!o || !jj_eq(a->u.d.v[i], o))
                return 0;
        }
        return 1;
    default: return a == b;
    }
}

size_t jj_utf8_len(const char *p, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += ((unsigned char)p[i] & 0xC0) != 0x80;
    return k;
}

void jj_buf_add(jj_ctx *c, jj_buf *b, const char *p, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        if (cap > c->max_output * 4 + 65536 && b->n + n + 1 <= c->max_output * 4 + 65536)
            cap = c->max_output * 4 + 65536;
        if (b->n + n > c->max_output * 4 + 4096)
            jj_fail(c, "output limit exceeded");
        b->p = jj_grow(c->a, b->p, b->n, cap);
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = 0;
}
void jj_buf_addz(jj_ctx *c, jj_buf *b, const char *p) { jj_buf_add(c, b, p, strlen(p)); }

void jj_fmt_float(char *dst, size_t size, double f)
{
    if (isnan(f)) {
        snprintf(dst, size, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(dst, size, f < 0 ? "-inf" : "inf");
        return;
    }
    /* The shortest digits that read back as f, laid out as Python's repr:
     * positional for exponents -4..15, else d.ddde+XX. */
    char tmp[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f)
            break;
    }
    char digits[24];
    int nd = 0, neg = tmp[0] == '-';
    const char *p = tmp + neg;
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9')
            digits[nd++] = *p;
    int exp = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    char out[64];
    int o = 0;
    if (neg)
        out[o++] = '-';
    if (exp >= -4 && exp < 16) {
        if (exp >= 0) {
            for (int i = 0; i <= exp; i++)
                out[o++] = i < nd ? digits[i] : '0';
            out[o++] = '.';
            if (nd > exp + 1)
                for (int i = exp + 1; i < nd; i++)
                    out[o++] = digits[i];
            else
                out[o++] = '0';
        } else {
            out[o++] = '0';
            out[o++] = '.';
            for (int i = 0; i < -exp - 1; i++)
                out[o++] = '0';
            for (int i = 0; i < nd; i++)
                out[o++] = digits[i];
        }
        out[o] = 0;
    } else {
        out[o++] = digits[0];
        if (nd > 1) {
            out[o++] = '.';
            for (int i = 1; i < nd; i++)
                out[o++] = digits[i];
        }
        snprintf(out + o, sizeof out - (size_t)o, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    }
    snprintf(dst, size, "%s", out);
}

const char *jj_type_name(const jj_val *v)
{
    static const char *names[] = {"Undefined", "NoneType", "bool", "int", "float", "str", "list", "tuple",
                                  "dict", "Namespace", "Macro", "function", "method"};
    return names[v->t];
}

static void repr_str(jj_ctx *c, jj_buf *b, const char *p, size_t n)
{
    int has_sq = memchr(p, '\'', n) != NULL, has_dq = memchr(p, '"', n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    jj_buf_add(c, b, &q, 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)p[i];
        char esc[8];
        if (ch == '\\' || ch == (unsigned char)q) {
            esc[0] = '\\';
            esc[1] = (char)ch;
            jj_buf_add(c, b, esc, 2);
        } else if (ch == '\n') {
            jj_buf_addz(c, b, "\\n");
        } else if (ch == '\r') {
            jj_buf_addz(c, b, "\\r");
        } else if (ch == '\t') {
            jj_buf_addz(c, b, "\\t");
        } else if (ch < 0x20 || ch == 0x7f) {
            snprintf(esc, sizeof esc, "\\x%02x", ch);
            jj_buf_addz(c, b, esc);
        } else {
            jj_buf_add(c, b, (const char *)&p[i], 1);
        }
    }
    jj_buf_add(c, b, &q, 1);
}

static void seq_out(jj_ctx *c, jj_buf *b, const jj_val *v)
{
    for (size_t i = 0; i < v->u.l.n; i++) {
        if (i)
            jj_buf_addz(c, b, ", ");
        jj_repr(c, b, v->u.l.v[i]);
    }
}

void jj_repr(jj_ctx *c, jj_buf *b, const jj_val *v)
{
    if (++c->depth > c->max_depth * 16)
        jj_fail(c, "value nested too deep");
    switch (v->t) {
    case JV_STR: repr_str(c, b, v->u.s.p, v->u.s.n); break;
    case JV_LIST:
        jj_buf_addz(c, b, "[");
        seq_out(c, b, v);
        jj_buf_addz(c, b, "]");
        break;
    case JV_TUPLE:
        jj_buf_addz(c, b, "(");
        seq_out(c, b, v);
        jj_buf_addz(c, b, v->u.l.n == 1 ? ",)" : ")");
        break;
    case JV_DICT:
        jj_buf_addz(c, b, "{");
        for (size_t i = 0; i < v->u.d.n; i++) {
            if (i)
                jj_buf_addz(c, b, ", ");
            jj_repr(c, b, v->u.d.k[i]);
            jj_buf_addz(c, b, ": ");
            jj_repr(c, b, v->u.d.v[i]);
        }
        jj_buf_addz(c, b, "}");
        break;
    default: jj_str_of(c, b, v);
    }
    c->depth--;
}

void jj_str_of(jj_ctx *c, jj_buf *b, const jj_val *v)
{
    char tmp[64];
    switch (v->t) {
    case JV_UNDEF: break;
    case JV_NONE: jj_buf_addz(c, b, "None"); break;
    case JV_BOOL: jj_buf_addz(c, b, v->u.b ? "True" : "False"); break;
    case JV_INT:
        snprintf(tmp, sizeof tmp, "%lld", v->u.i);
        jj_buf_addz(c, b, tmp);
        break;
    case JV_FLOAT:
        jj_fmt_float(tmp, sizeof tmp, v->u.f);
        jj_buf_addz(c, b, tmp);
        break;
    case JV_STR: jj_buf_add(c, b, v->u.s.p, v->u.s.n); break;
    case JV_LIST: case JV_TUPLE: case JV_DICT: jj_repr(c, b, v); break;
    case JV_NS: jj_buf_addz(c, b, "<Namespace>"); break;
    default:
        snprintf(tmp, sizeof tmp, "<%s>", jj_type_name(v));
        jj_buf_addz(c, b, tmp);
    }
}

jj_val *jj_to_str(jj_ctx *c, const jj_val *v)
{
    if (v->t == JV_STR)
        return (jj_val *)v;
    jj_buf b = {0};
    jj_str_of(c, &b, v);
    jj_val *r = jj_alloc(c->a, sizeof *r);
    r->t = JV_STR;
    r->u.s.p = b.p ? b.p : "";
    r->u.s.n = b.n;
    return r;
}

static void json_str(jj_ctx *c, jj_buf *b, const char *p, size_t n, int ascii)
{
    jj_buf_addz(c, b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)p[i];
        char esc[16];
        switch (ch) {
        case '"': jj_buf_addz(c, b, "\\\""); continue;
        case '\\': jj_buf_addz(c, b, "\\\\"); continue;
        case '\n': jj_buf_addz(c, b, "\\n"); continue;
        case '\r': jj_buf_addz(c, b, "\\r"); continue;
        case '\t': jj_buf_addz(c, b, "\\t"); continue;
        case '\b': jj_buf_addz(c, b, "\\b"); continue;
        case '\f': jj_buf_addz(c, b, "\\f"); continue;
        default: break;
        }
        if (ch < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", ch);
            jj_buf_addz(c, b, esc);
        } else if (ch >= 0x80 && ascii) {
            /* decode one UTF-8 sequence; invalid bytes pass as U+FFFD */
            unsigned long cp = 0xFFFD;
            size_t len = ch >= 0xF0 ? 4 : ch >= 0xE0 ? 3 : ch >= 0xC0 ? 2 : 1;
            if (len > 1 && i + len <= n) {
                cp = ch & (0x3F >> (len - 1));
                for (size_t k = 1; k < len; k++)
                    cp = (cp << 6) | ((unsigned char)p[i + k] & 0x3F);
                i += len - 1;
            }
            if (cp >= 0x10000) {
                cp -= 0x10000;
                snprintf(esc, sizeof esc, "\\u%04lx\\u%04lx", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
            } else {
                snprintf(esc, sizeof esc, "\\u%04lx", cp);
            }
            jj_buf_addz(c, b, esc);
        } else {
            jj_buf_add(c, b, (const char *)&p[i], 1);
        }
    }
    jj_buf_addz(c, b, "\"");
}

static void newline_indent(jj_ctx *c, jj_buf *b, int indent, int level)
{
    jj_buf_addz(c, b, "\n");
    for (long i = 0; i < (long)indent * level; i++)
        jj_buf_add(c, b, " ", 1);
}

static int key_cmp(const void *x, const void *y)
{
    const jj_val *a = **(jj_val *const *const *)x, *b = **(jj_val *const *const *)y;
    size_t n = a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n;
    int r = memcmp(a->u.s.p, b->u.s.p, n);
    return r ? r : (a->u.s.n > b->u.s.n) - (a->u.s.n < b->u.s.n);
}

void jj_tojson(jj_ctx *c, jj_buf *b, const jj_val *v, int ascii, int indent, const char *item_sep,
               const char *key_sep, int sort_keys, int level)
{
    char tmp[64];
    if (++c->depth > c->max_depth * 16)
        jj_fail(c, "tojson: value nested too deep");
    switch (v->t) {
    case JV_NONE: jj_buf_addz(c, b, "null"); break;
    case JV_BOOL: jj_buf_addz(c, b, v->u.b ? "true" : "false"); break;
    case JV_INT: jj_str_of(c, b, v); break;
    case JV_FLOAT:
        if (isnan(v->u.f))
            jj_buf_addz(c, b, "NaN");
        else if (isinf(v->u.f))
            jj_buf_addz(c, b, v->u.f < 0 ? "-Infinity" : "Infinity");
        else {
            jj_fmt_float(tmp, sizeof tmp, v->u.f);
            jj_buf_addz(c, b, tmp);
        }
        break;
    case JV_STR: json_str(c, b, v->u.s.p, v->u.s.n, ascii); break;
    case JV_LIST:
    case JV_TUPLE:
        if (!v->u.l.n) {
            jj_buf_addz(c, b, "[]");
            break;
        }
        jj_buf_addz(c, b, "[");
        for (size_t i = 0; i < v->u.l.n; i++) {
            if (i)
                jj_buf_addz(c, b, item_sep);
            if (indent >= 0)
                newline_indent(c, b, indent, level + 1);
            jj_tojson(c, b, v->u.l.v[i], ascii, indent, item_sep, key_sep, sort_keys, level + 1);
        }
        if (indent >= 0)
            newline_indent(c, b, indent, level);
        jj_buf_addz(c, b, "]");
        break;
    case JV_DICT: {
        if (!v->u.d.n) {
            jj_buf_addz(c, b, "{}");
            break;
        }
        jj_val ***order = jj_alloc(c->a, v->u.d.n * sizeof *order);
        for (size_t i = 0; i < v->u.d.n; i++)
            order[i] = &v->u.d.k[i];
        if (sort_keys)
            qsort(order, v->u.d.n, sizeof *order, key_cmp);
        jj_buf_addz(c, b, "{");
        for (size_t i = 0; i < v->u.d.n; i++) {
            size_t k = (size_t)(order[i] - v->u.d.k);
            if (i)
                jj_buf_addz(c, b, item_sep);
            if (indent >= 0)
                newline_indent(c, b, indent, level + 1);
            jj_tojson(c, b, v->u.d.k[k], ascii, indent, item_sep, key_sep, sort_keys, level + 1);
            jj_buf_addz(c, b, key_sep);
            jj_tojson(c, b, v->u.d.v[k], ascii, indent, item_sep, key_sep, sort_keys, level + 1);
        }
        if (indent >= 0)
            newline_indent(c, b, indent, level);
        jj_buf_addz(c, b, "}");
        break;
    }
    default: jj_fail(c, "tojson: Object of type %s is not JSON serializable", jj_type_name(v));
    }
    c->depth--;
}
