/*
 * methods.c: the Python str, dict and list methods that chat templates
 * call, each as Python defines it (str.split without a separator drops empty
 * parts, dict.get defaults to None, ...). list.append and the other
 * mutators fail, as in transformers' immutable sandbox.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "jinja/jj.h"

static int eqs(const char *a, const char *b) { return !strcmp(a, b); }

static jj_val *kwarg(const char **kw, jj_val **kwv, int nkw, const char *name)
{
    for (int i = 0; i < nkw; i++)
        if (eqs(kw[i], name))
            return kwv[i];
    return NULL;
}

/* Argument i, by position or by keyword; NULL when not given. */
static jj_val *arg(jj_val **args, int nargs, const char **kw, jj_val **kwv, int nkw, int i, const char *name)
{
    if (i < nargs)
        return args[i];
    return kwarg(kw, kwv, nkw, name);
}

static jj_val *need_str(jj_ctx *c, jj_val *v, const char *what)
{
    if (v->t != JV_STR)
        jj_fail(c, "%s: expected a string, got %s", what, jj_type_name(v));
    return v;
}

static int is_ws(unsigned char ch) { return ch == ' ' || (ch >= 9 && ch <= 13) || (ch >= 0x1c && ch <= 0x1f); }

static int in_set(const jj_val *chars, const char *p, size_t n)
{
    for (size_t i = 0; i + n <= chars->u.s.n; i++)
        if (!memcmp(chars->u.s.p + i, p, n))
            return 1;
    return 0;
}

static size_t cp_len(const char *p, size_t rest)
{
    size_t k = 1;
    while (k < rest && ((unsigned char)p[k] & 0xC0) == 0x80)
        k++;
    return k;
}

/* Python's str.strip family: which 1 = left, 2 = right, 3 = both. */
jj_val *jj_strip(jj_ctx *c, jj_val *s, jj_val *chars, int which)
{
    const char *p = s->u.s.p;
    size_t a = 0, b = s->u.s.n;
    if (chars && chars->t == JV_NONE)
        chars = NULL;
    if (chars)
        need_str(c, chars, "strip");
    if (which & 1)
        while (a < b) {
            size_t k = cp_len(p + a, b - a);
            if (chars ? !in_set(chars, p + a, k) : !(k == 1 && is_ws((unsigned char)p[a])))
                break;
            a += k;
        }
    if (which & 2)
        while (b > a) {
            size_t k = 1;
            while (k < b - a && ((unsigned char)p[b - k] & 0xC0) == 0x80)
                k++;
            if (chars ? !in_set(chars, p + b - k, k) : !(k == 1 && is_ws((unsigned char)p[b - 1])))
                break;
            b -= k;
        }
    return jj_str(c, p + a, b - a);
}

/* Case mapping by code point through utf8proc; mode 0 lower, 1 upper,
 * 2 capitalize (first upper, rest lower), 3 title (each word's first upper). */
jj_val *jj_recase(jj_ctx *c, jj_val *s, int mode)
{
    jj_buf b = {0};
    const utf8proc_uint8_t *p = (const utf8proc_uint8_t *)s->u.s.p;
    utf8proc_ssize_t n = (utf8proc_ssize_t)s->u.s.n, i = 0;
    int prev_cased = 0, first = 1;
    while (i < n) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate(p + i, n - i, &cp);
        if (k <= 0) { /* invalid byte: copied as it is */
            jj_buf_add(c, &b, (const char *)p + i, 1);
            i++;
            continue;
        }
        int up = mode == 1 || (mode == 2 && first) || (mode == 3 && !prev_cased);
        utf8proc_int32_t m = up ? utf8proc_toupper(cp) : utf8proc_tolower(cp);
        utf8proc_uint8_t enc[4];
        utf8proc_ssize_t e = utf8proc_encode_char(m, enc);
        jj_buf_add(c, &b, (const char *)enc, (size_t)e);
        utf8proc_category_t cat = utf8proc_category(cp);
        prev_cased = cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
        first = 0;
        i += k;
    }
    return jj_str(c, b.p ? b.p : "", b.n);
}

jj_val *jj_replace(jj_ctx *c, jj_val *s, jj_val *old, jj_val *new_, long long count)
{
    need_str(c, old, "replace");
    new_ = jj_to_str(c, new_);
    jj_buf b = {0};
    size_t i = 0;
    if (!old->u.s.n) { /* Python inserts new_ between every character */
        jj_val *l = jj_iter_list(c, s);
        for (size_t k = 0; k < l->u.l.n; k++) {
            if (count < 0 || (long long)k < count)
                jj_buf_add(c, &b, new_->u.s.p, new_->u.s.n);
            jj_buf_add(c, &b, l->u.l.v[k]->u.s.p, l->u.l.v[k]->u.s.n);
        }
        if (count < 0 || (long long)l->u.l.n < count)
            jj_buf_add(c, &b, new_->u.s.p, new_->u.s.n);
        return jj_str(c, b.p ? b.p : "", b.n);
    }
    while (i < s->u.s.n) {
        if (count != 0 && i + old->u.s.n <= s->u.s.n && !memcmp(s->u.s.p + i, old->u.s.p, old->u.s.n)) {
            jj_buf_add(c, &b, new_->u.s.p, new_->u.s.n);
            i += old->u.s.n;
            if (count > 0)
                count--;
        } else {
            jj_buf_add(c, &b, s->u.s.p + i, 1);
            i++;
        }
    }
    return jj_str(c, b.p ? b.p : "", b.n);
}

static jj_val *split(jj_ctx *c, jj_val *s, jj_val *sep, long long maxsplit)
{
    jj_val *l = jj_list(c, JV_LIST);
    const char *p = s->u.s.p;
    size_t n = s->u.s.n, i = 0;
    if (!sep || sep->t == JV_NONE) {
        for (;;) {
            while (i < n && is_ws((unsigned char)p[i]))
                i++;
            if (i >= n)
                break;
            size_t j = i;
            if (maxsplit >= 0 && (long long)l->u.l.n >= maxsplit) {
                size_t e = n;
                while (e > i && is_ws((unsigned char)p[e - 1]))
                    e--;
                jj_list_push(c, l, jj_str(c, p + i, e - i));
                break;
            }
            while (j < n && !is_ws((unsigned char)p[j]))
                j++;
            jj_list_push(c, l, jj_str(c, p + i, j - i));
            i = j;
        }
        return l;
    }
    need_str(c, sep, "split");
    if (!sep->u.s.n)
        jj_fail(c, "empty separator");
    size_t start = 0;
    while (i + sep->u.s.n <= n) {
        if ((maxsplit < 0 || (long long)l->u.l.n < maxsplit) && !memcmp(p + i, sep->u.s.p, sep->u.s.n)) {
            jj_list_push(c, l, jj_str(c, p + start, i - start));
            i += sep->u.s.n;
            start = i;
        } else {
            i++;
        }
    }
    jj_list_push(c, l, jj_str(c, p + start, n - start));
    return l;
}

static int affix(jj_ctx *c, jj_val *s, jj_val *x, int end)
{
    if (x->t == JV_TUPLE || x->t == JV_LIST) {
        for (size_t i = 0; i < x->u.l.n; i++)
            if (affix(c, s, x->u.l.v[i], end))
                return 1;
        return 0;
    }
    need_str(c, x, end ? "endswith" : "startswith");
    if (x->u.s.n > s->u.s.n)
        return 0;
    return !memcmp(s->u.s.p + (end ? s->u.s.n - x->u.s.n : 0), x->u.s.p, x->u.s.n);
}

static const char *const STR_METHODS[] = {"strip", "lstrip", "rstrip", "split", "startswith", "endswith", "upper",
                                          "lower", "replace", "title", "capitalize", "find", "count", "join", NULL};
static const char *const DICT_METHODS[] = {"get", "items", "keys", "values", "pop", "update", "copy", "setdefault",
                                           "clear", "popitem", NULL};
static const char *const LIST_METHODS[] = {"append", "extend", "insert", "pop", "remove", "index", "count", "sort",
                                           "reverse", "clear", "copy", NULL};

int jj_has_method(const jj_val *self, const char *name, size_t n)
{
    const char *const *m = self->t == JV_STR ? STR_METHODS : self->t == JV_DICT ? DICT_METHODS
                         : self->t == JV_LIST ? LIST_METHODS : NULL;
    for (; m && *m; m++)
        if (strlen(*m) == n && !memcmp(*m, name, n))
            return 1;
    return 0;
}

long long jj_int_arg(jj_ctx *c, jj_val *v, long long dflt)
{
    if (!v || v->t == JV_NONE)
        return dflt;
    if (v->t == JV_INT)
        return v->u.i;
    if (v->t == JV_BOOL)
        return v->u.b;
    jj_fail(c, "expected an integer argument, got %s", jj_type_name(v));
}

jj_val *jj_method(jj_ctx *c, jj_val *self, const char *name, jj_val **args, int nargs, const char **kw,
                  jj_val **kwv, int nkw)
{
    jj_step(c);
#define A(i, nm) arg(args, nargs, kw, kwv, nkw, i, nm)
    if (self->t == JV_STR) {
        if (eqs(name, "strip")) return jj_strip(c, self, A(0, "chars"), 3);
        if (eqs(name, "lstrip")) return jj_strip(c, self, A(0, "chars"), 1);
        if (eqs(name, "rstrip")) return jj_strip(c, self, A(0, "chars"), 2);
        if (eqs(name, "split")) return split(c, self, A(0, "sep"), jj_int_arg(c, A(1, "maxsplit"), -1));
        if (eqs(name, "startswith") || eqs(name, "endswith")) {
            if (!A(0, "prefix"))
                jj_fail(c, "%s() takes at least 1 argument", name);
            return jj_bool(affix(c, self, A(0, "prefix"), name[0] == 'e'));
        }
        if (eqs(name, "upper")) return jj_recase(c, self, 1);
        if (eqs(name, "lower")) return jj_recase(c, self, 0);
        if (eqs(name, "capitalize")) return jj_recase(c, self, 2);
        if (eqs(name, "title")) return jj_recase(c, self, 3);
        if (eqs(name, "replace")) {
            if (nargs < 2)
                jj_fail(c, "replace() takes at least 2 arguments");
            return jj_replace(c, self, args[0], args[1], jj_int_arg(c, A(2, "count"), -1));
        }
        if (eqs(name, "find") || eqs(name, "count")) {
            jj_val *x = need_str(c, A(0, "sub") ? A(0, "sub") : &jj_none_v, name);
            long long hits = 0;
            for (size_t i = 0; i + x->u.s.n <= self->u.s.n; i++)
                if (!memcmp(self->u.s.p + i, x->u.s.p, x->u.s.n)) {
                    if (name[0] == 'f')
                        return jj_int(c, (long long)jj_utf8_len(self->u.s.p, i));
                    hits++;
                    if (x->u.s.n)
                        i += x->u.s.n - 1;
                }
            return jj_int(c, name[0] == 'f' ? -1 : hits);
        }
        if (eqs(name, "join")) {
            jj_val *l = jj_iter_list(c, A(0, "iterable") ? A(0, "iterable") : &jj_none_v);
            jj_buf b = {0};
            for (size_t i = 0; i < l->u.l.n; i++) {
                if (i)
                    jj_buf_add(c, &b, self->u.s.p, self->u.s.n);
                need_str(c, l->u.l.v[i], "join");
                jj_buf_add(c, &b, l->u.l.v[i]->u.s.p, l->u.l.v[i]->u.s.n);
            }
            return jj_str(c, b.p ? b.p : "", b.n);
        }
    } else if (self->t == JV_DICT) {
        if (eqs(name, "get")) {
            jj_val *k = A(0, "key");
            if (!k)
                jj_fail(c, "get expected at least 1 argument");
            jj_val *v = k->t == JV_STR ? jj_dict_get(self, k->u.s.p, k->u.s.n) : NULL;
            return v ? v : A(1, "default") ? A(1, "default") : &jj_none_v;
        }
        if (eqs(name, "items") || eqs(name, "keys") || eqs(name, "values")) {
            jj_val *l = jj_list(c, JV_LIST);
            for (size_t i = 0; i < self->u.d.n; i++) {
                jj_val *x = self->u.d.v[i];
                if (name[0] == 'k')
                    x = self->u.d.k[i];
                else if (name[0] == 'i') {
                    x = jj_list(c, JV_TUPLE);
                    jj_list_push(c, x, self->u.d.k[i]);
                    jj_list_push(c, x, self->u.d.v[i]);
                }
                jj_list_push(c, l, x);
            }
            return l;
        }
        if (eqs(name, "copy")) {
            jj_val *d = jj_dict(c, JV_DICT);
            for (size_t i = 0; i < self->u.d.n; i++)
                jj_dict_set(c, d, self->u.d.k[i], self->u.d.v[i]);
            return d;
        }
    } else if (self->t == JV_LIST) {
        if (eqs(name, "index") || eqs(name, "count")) {
            jj_val *x = A(0, "value") ? A(0, "value") : &jj_none_v;
            long long hits = 0;
            for (size_t i = 0; i < self->u.l.n; i++)
                if (jj_eq(self->u.l.v[i], x)) {
                    if (name[0] == 'i')
                        return jj_int(c, (long long)i);
                    hits++;
                }
            if (name[0] == 'i')
                jj_fail(c, "value is not in list");
            return jj_int(c, hits);
        }
        if (eqs(name, "copy")) {
            jj_val *l = jj_list(c, JV_LIST);
            for (size_t i = 0; i < self->u.l.n; i++)
                jj_list_push(c, l, self->u.l.v[i]);
            return l;
        }
    }
#undef A
    /* the mutators: the sandbox is immutable */
    jj_fail(c, "access to attribute '%s' of '%s' object is unsafe", name, jj_type_name(self));
}
