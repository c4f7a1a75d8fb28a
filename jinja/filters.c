/*
 * filters.c: Jinja2's built-in filters and tests that chat templates use,
 * with Jinja2's argument names and defaults (unique and sort compare
 * strings case-insensitively unless told otherwise), and tojson as
 * transformers replaces it: json.dumps with ensure_ascii=False.
 */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja/jj.h"

static int eqs(const char *a, const char *b) { return !strcmp(a, b); }

typedef struct fargs {
    jj_val **args;
    int nargs;
    const char **kw;
    jj_val **kwv;
    int nkw;
} fargs;

/* Argument i of the filter (after the value), by position or keyword. */
static jj_val *A(const fargs *f, int i, const char *name)
{
    if (i < f->nargs)
        return f->args[i];
    for (int k = 0; k < f->nkw; k++)
        if (eqs(f->kw[k], name))
            return f->kwv[k];
    return NULL;
}

static _Noreturn void undefined_error(jj_ctx *c, const jj_val *v)
{
    if (v->uname)
        jj_fail(c, "'%s' is undefined", v->uname);
    jj_fail(c, "an undefined value was used");
}

static jj_val *as_str(jj_ctx *c, jj_val *v) { return jj_to_str(c, v); }

/* jinja2's make_attrgetter: "a.b.0" looks up each part as an item. */
static jj_val *attr_path(jj_ctx *c, jj_val *v, jj_val *path)
{
    if (path->t == JV_INT)
        return jj_getitem(c, v, path);
    if (path->t != JV_STR)
        jj_fail(c, "attribute must be a string");
    const char *p = path->u.s.p, *end = p + path->u.s.n;
    while (p <= end) {
        const char *q = memchr(p, '.', (size_t)(end - p));
        if (!q)
            q = end;
        jj_val *key;
        size_t n = (size_t)(q - p);
        int digits = n > 0 && n < 18;
        for (size_t i = 0; i < n && digits; i++)
            digits = p[i] >= '0' && p[i] <= '9';
        if (digits)
            key = jj_int(c, strtoll(jj_strndup(c->a, p, n), NULL, 10));
        else
            key = jj_str(c, p, n);
        v = jj_getitem(c, v, key);
        p = q + 1;
    }
    return v;
}

static jj_val *key_of(jj_ctx *c, jj_val *v, int case_sensitive)
{
    return !case_sensitive && v->t == JV_STR ? jj_recase(c, v, 0) : v;
}

static int lt(jj_ctx *c, jj_val *a, jj_val *b)
{
    jj_val *args[1] = {b};
    return jj_test(c, "lt", a, args, 1);
}

static void merge_sort(jj_ctx *c, jj_val **v, jj_val **k, size_t n, jj_val **tv, jj_val **tk, int rev)
{
    if (n < 2)
        return;
    size_t h = n / 2;
    merge_sort(c, v, k, h, tv, tk, rev);
    merge_sort(c, v + h, k + h, n - h, tv, tk, rev);
    size_t i = 0, j = h, o = 0;
    while (i < h || j < n) {
        jj_step(c);
        int take_right = i >= h || (j < n && (rev ? lt(c, k[i], k[j]) : lt(c, k[j], k[i])));
        size_t s = take_right ? j++ : i++;
        tv[o] = v[s];
        tk[o++] = k[s];
    }
    memcpy(v, tv, n * sizeof *v);
    memcpy(k, tk, n * sizeof *k);
}

static jj_val *select_like(jj_ctx *c, jj_val *v, const fargs *f, int by_attr, int keep)
{
    jj_val *l = jj_iter_list(c, v), *r = jj_list(c, JV_LIST);
    int first = by_attr ? 1 : 0;
    jj_val *attr = by_attr ? A(f, 0, "attribute") : NULL;
    if (by_attr && !attr)
        jj_fail(c, "selectattr: missing attribute");
    jj_val *test = f->nargs > first ? f->args[first] : NULL;
    if (test && test->t != JV_STR)
        jj_fail(c, "select: the test name must be a string");
    const char *tname = test ? jj_strndup(c->a, test->u.s.p, test->u.s.n) : NULL;
    int targs = f->nargs > first + 1 ? f->nargs - first - 1 : 0;
    for (size_t i = 0; i < l->u.l.n; i++) {
        jj_step(c);
        jj_val *x = by_attr ? attr_path(c, l->u.l.v[i], attr) : l->u.l.v[i];
        int ok = tname ? jj_test(c, tname, x, f->args + first + 1, targs) : jj_truthy(x);
        if (ok == keep)
            jj_list_push(c, r, l->u.l.v[i]);
    }
    return r;
}

static jj_val *do_tojson(jj_ctx *c, jj_val *v, const fargs *f)
{
    jj_val *ascii = A(f, 0, "ensure_ascii"), *ind = A(f, 1, "indent"), *seps = A(f, 2, "separators"),
           *sk = A(f, 3, "sort_keys");
    int indent = -1;
    if (ind && ind->t != JV_NONE) {
        if (ind->t != JV_INT)
            jj_fail(c, "tojson: indent must be an integer");
        indent = ind->u.i < 0 ? 0 : ind->u.i > 256 ? 256 : (int)ind->u.i;
    }
    const char *item_sep = indent >= 0 ? "," : ", ", *key_sep = ": ";
    if (seps && seps->t != JV_NONE) {
        if ((seps->t != JV_TUPLE && seps->t != JV_LIST) || seps->u.l.n != 2 || seps->u.l.v[0]->t != JV_STR ||
            seps->u.l.v[1]->t != JV_STR)
            jj_fail(c, "tojson: separators must be two strings");
        item_sep = jj_strndup(c->a, seps->u.l.v[0]->u.s.p, seps->u.l.v[0]->u.s.n);
        key_sep = jj_strndup(c->a, seps->u.l.v[1]->u.s.p, seps->u.l.v[1]->u.s.n);
    }
    jj_buf b = {0};
    jj_tojson(c, &b, v, ascii && jj_truthy(ascii), indent, item_sep, key_sep, sk && jj_truthy(sk), 0);
    return jj_str(c, b.p ? b.p : "", b.n);
}

static jj_val *do_indent(jj_ctx *c, jj_val *s, const fargs *f)
{
    jj_val *w = A(f, 0, "width"), *first = A(f, 1, "first"), *blank = A(f, 2, "blank");
    jj_val *ind;
    if (!w)
        ind = jj_strz(c, "    ");
    else if (w->t == JV_STR)
        ind = w;
    else {
        long long n = w->t == JV_INT ? w->u.i : 0;
        if (n < 0)
            n = 0;
        if (n > 1024)
            jj_fail(c, "indent: width too large");
        char *sp = jj_alloc(c->a, (size_t)n + 1);
        memset(sp, ' ', (size_t)n);
        ind = jj_str(c, sp, (size_t)n);
    }
    s = as_str(c, s);
    /* Python's splitlines on s + "\n" */
    jj_buf b = {0};
    const char *p = s->u.s.p;
    size_t n = s->u.s.n, i = 0, line = 0;
    if (first && jj_truthy(first))
        jj_buf_add(c, &b, ind->u.s.p, ind->u.s.n);
    while (i <= n) {
        size_t j = i;
        while (j < n && p[j] != '\n' && p[j] != '\r')
            j++;
        if (j == n && i == n && line > 0)
            break;
        if (line > 0) {
            jj_buf_add(c, &b, "\n", 1);
            if (j > i || (blank && jj_truthy(blank)))
                jj_buf_add(c, &b, ind->u.s.p, ind->u.s.n);
        }
        jj_buf_add(c, &b, p + i, j - i);
        line++;
        if (j < n && p[j] == '\r' && j + 1 < n && p[j + 1] == '\n')
            j++;
        i = j + 1;
        if (j >= n)
            break;
    }
    return jj_str(c, b.p ? b.p : "", b.n);
}

static jj_val *do_round(jj_ctx *c, jj_val *v, const fargs *f)
{
    long long prec = 0;
    jj_val *p = A(f, 0, "precision"), *m = A(f, 1, "method");
    if (p && p->t == JV_INT)
        prec = p->u.i < 0 ? 0 : p->u.i > 15 ? 15 : p->u.i;
    double x = v->t == JV_FLOAT ? v->u.f : v->t == JV_INT ? (double)v->u.i : v->t == JV_BOOL ? v->u.b : NAN;
    if (isnan(x) && v->t != JV_FLOAT)
        jj_fail(c, "round: expected a number");
    const char *method = m && m->t == JV_STR ? jj_strndup(c->a, m->u.s.p, m->u.s.n) : "common";
    double scale = pow(10, (double)prec);
    if (eqs(method, "floor"))
        return jj_float(c, floor(x * scale) / scale);
    if (eqs(method, "ceil"))
        return jj_float(c, ceil(x * scale) / scale);
    if (!eqs(method, "common"))
        jj_fail(c, "method must be common, ceil or floor");
    char tmp[400];
    snprintf(tmp, sizeof tmp, "%.*f", (int)prec, x); /* correctly rounded, half to even, as Python's round */
    return jj_float(c, strtod(tmp, NULL));
}

static jj_val *do_int(jj_ctx *c, jj_val *v, jj_val *dflt)
{
    switch (v->t) {
    case JV_INT: return v;
    case JV_BOOL: return jj_int(c, v->u.b);
    case JV_FLOAT:
        if (isfinite(v->u.f) && fabs(v->u.f) < 9.2e18)
            return jj_int(c, (long long)v->u.f);
        break;
    case JV_STR: {
        char *s = jj_strndup(c->a, v->u.s.p, v->u.s.n), *end;
        long long i = strtoll(s, &end, 10);
        while (*end == ' ' || *end == '\t' || *end == '\n')
            end++;
        if (end != s && !*end)
            return jj_int(c, i);
        double d = strtod(s, &end);
        while (*end == ' ' || *end == '\t' || *end == '\n')
            end++;
        if (end != s && !*end && isfinite(d) && fabs(d) < 9.2e18)
            return jj_int(c, (long long)d);
        break;
    }
    default: break;
    }
    return dflt ? dflt : jj_int(c, 0);
}

jj_val *jj_filter(jj_ctx *c, const char *name, jj_val *v, jj_val **args, int nargs, const char **kw, jj_val **kwv,
                  int nkw)
{
    fargs f = {args, nargs, kw, kwv, nkw};
    jj_step(c);
    if (eqs(name, "default") || eqs(name, "d")) {
        jj_val *b = A(&f, 1, "boolean");
        if (v->t == JV_UNDEF || (b && jj_truthy(b) && !jj_truthy(v)))
            return A(&f, 0, "default_value") ? A(&f, 0, "default_value") : jj_str(c, "", 0);
        return v;
    }
    if (eqs(name, "length") || eqs(name, "count")) {
        switch (v->t) {
        case JV_STR: return jj_int(c, (long long)jj_utf8_len(v->u.s.p, v->u.s.n));
        case JV_LIST: case JV_TUPLE: return jj_int(c, (long long)v->u.l.n);
        case JV_DICT: return jj_int(c, (long long)v->u.d.n);
        case JV_UNDEF: return jj_int(c, 0);
        default: jj_fail(c, "object of type '%s' has no len()", jj_type_name(v));
        }
    }
    if (eqs(name, "safe"))
        return v;
    if (eqs(name, "string"))
        return as_str(c, v);
    if (eqs(name, "tojson"))
        return do_tojson(c, v, &f);
    if (eqs(name, "list")) {
        jj_val *l = jj_iter_list(c, v), *r = jj_list(c, JV_LIST);
        for (size_t i = 0; i < l->u.l.n; i++)
            jj_list_push(c, r, l->u.l.v[i]);
        return r;
    }
    if (eqs(name, "items")) {
        if (v->t == JV_UNDEF)
            return jj_list(c, JV_LIST);
        if (v->t != JV_DICT)
            jj_fail(c, "items: can only get item pairs from a mapping");
        return jj_method(c, v, "items", NULL, 0, NULL, NULL, 0);
    }
    if (eqs(name, "first") || eqs(name, "last")) {
        jj_val *l = jj_iter_list(c, v);
        if (!l->u.l.n)
            return jj_undef(c, NULL);
        return l->u.l.v[name[0] == 'f' ? 0 : l->u.l.n - 1];
    }
    if (eqs(name, "reverse")) {
        jj_val *l = jj_iter_list(c, v), *r = jj_list(c, JV_LIST);
        for (size_t i = l->u.l.n; i-- > 0;)
            jj_list_push(c, r, l->u.l.v[i]);
        if (v->t != JV_STR)
            return r;
        jj_buf b = {0};
        for (size_t i = 0; i < r->u.l.n; i++)
            jj_buf_add(c, &b, r->u.l.v[i]->u.s.p, r->u.l.v[i]->u.s.n);
        return jj_str(c, b.p ? b.p : "", b.n);
    }
    if (eqs(name, "join")) {
        jj_val *l = jj_iter_list(c, v), *sep = A(&f, 0, "d"), *attr = A(&f, 1, "attribute");
        sep = sep ? as_str(c, sep) : jj_str(c, "", 0);
        jj_buf b = {0};
        for (size_t i = 0; i < l->u.l.n; i++) {
            if (i)
                jj_buf_add(c, &b, sep->u.s.p, sep->u.s.n);
            jj_str_of(c, &b, attr ? attr_path(c, l->u.l.v[i], attr) : l->u.l.v[i]);
        }
        return jj_str(c, b.p ? b.p : "", b.n);
    }
    if (eqs(name, "map")) {
        jj_val *l = jj_iter_list(c, v), *r = jj_list(c, JV_LIST);
        jj_val *attr = A(&f, 99, "attribute");
        for (size_t i = 0; i < l->u.l.n; i++) {
            jj_step(c);
            jj_val *x;
            if (attr) {
                x = attr_path(c, l->u.l.v[i], attr);
                jj_val *d = A(&f, 99, "default");
                if (x->t == JV_UNDEF && d)
                    x = d;
            } else {
                if (!nargs || args[0]->t != JV_STR)
                    jj_fail(c, "map: expected a filter name or attribute=");
                const char *fn = jj_strndup(c->a, args[0]->u.s.p, args[0]->u.s.n);
                x = jj_filter(c, fn, l->u.l.v[i], args + 1, nargs - 1, kw, kwv, nkw);
            }
            jj_list_push(c, r, x);
        }
        return r;
    }
    if (eqs(name, "select") || eqs(name, "reject"))
        return select_like(c, v, &f, 0, name[0] == 's');
    if (eqs(name, "selectattr") || eqs(name, "rejectattr"))
        return select_like(c, v, &f, 1, name[0] == 's');
    if (eqs(name, "unique")) {
        jj_val *l = jj_iter_list(c, v), *r = jj_list(c, JV_LIST), *seen = jj_list(c, JV_LIST);
        jj_val *cs = A(&f, 0, "case_sensitive"), *attr = A(&f, 1, "attribute");
        for (size_t i = 0; i < l->u.l.n; i++) {
            jj_step(c);
            jj_val *k = key_of(c, attr ? attr_path(c, l->u.l.v[i], attr) : l->u.l.v[i], cs && jj_truthy(cs));
            int dup = 0;
            for (size_t j = 0; j < seen->u.l.n && !dup; j++)
                dup = jj_eq(seen->u.l.v[j], k);
            if (!dup) {
                jj_list_push(c, seen, k);
                jj_list_push(c, r, l->u.l.v[i]);
            }
        }
        return r;
    }
    if (eqs(name, "sort")) {
        jj_val *l = jj_iter_list(c, v), *rev = A(&f, 0, "reverse"), *cs = A(&f, 1, "case_sensitive"),
               *attr = A(&f, 2, "attribute");
        size_t n = l->u.l.n;
        jj_val **vals = jj_alloc(c->a, (n + 1) * sizeof *vals), **keys = jj_alloc(c->a, (n + 1) * sizeof *keys);
        jj_val **tv = jj_alloc(c->a, (n + 1) * sizeof *tv), **tk = jj_alloc(c->a, (n + 1) * sizeof *tk);
        for (size_t i = 0; i < n; i++) {
            vals[i] = l->u.l.v[i];
            keys[i] = key_of(c, attr ? attr_path(c, vals[i], attr) : vals[i], cs && jj_truthy(cs));
        }
        merge_sort(c, vals, keys, n, tv, tk, rev && jj_truthy(rev));
        jj_val *r = jj_list(c, JV_LIST);
        for (size_t i = 0; i < n; i++)
            jj_list_push(c, r, vals[i]);
        return r;
    }
    if (eqs(name, "int"))
        return do_int(c, v, A(&f, 0, "default"));
    if (eqs(name, "float")) {
        if (v->t == JV_FLOAT)
            return v;
        if (v->t == JV_INT || v->t == JV_BOOL)
            return jj_float(c, v->t == JV_INT ? (double)v->u.i : v->u.b);
        if (v->t == JV_STR) {
            char *s = jj_strndup(c->a, v->u.s.p, v->u.s.n), *end;
            double d = strtod(s, &end);
            if (end != s && !*end)
                return jj_float(c, d);
        }
        return A(&f, 0, "default") ? A(&f, 0, "default") : jj_float(c, 0);
    }
    if (eqs(name, "abs")) {
        if (v->t == JV_INT && v->u.i != LLONG_MIN)
            return jj_int(c, v->u.i < 0 ? -v->u.i : v->u.i);
        if (v->t == JV_FLOAT)
            return jj_float(c, fabs(v->u.f));
        if (v->t == JV_BOOL)
            return jj_int(c, v->u.b);
        jj_fail(c, "bad operand type for abs(): '%s'", jj_type_name(v));
    }
    if (eqs(name, "round"))
        return do_round(c, v, &f);
    if (eqs(name, "indent"))
        return do_indent(c, v, &f);
    if (eqs(name, "upper") || eqs(name, "lower") || eqs(name, "capitalize") || eqs(name, "title") ||
        eqs(name, "trim") || eqs(name, "replace")) {
        v = as_str(c, v);
        if (eqs(name, "trim"))
            return jj_strip(c, v, A(&f, 0, "chars"), 3);
        if (eqs(name, "replace")) {
            if (nargs < 2)
                jj_fail(c, "replace: needs old and new");
            jj_val *cnt = A(&f, 2, "count");
            return jj_replace(c, v, as_str(c, args[0]), args[1], cnt && cnt->t == JV_INT ? cnt->u.i : -1);
        }
        return jj_recase(c, v, name[0] == 'l' ? 0 : name[0] == 'u' ? 1 : name[0] == 'c' ? 2 : 3);
    }
    if (eqs(name, "min") || eqs(name, "max") || eqs(name, "sum")) {
        jj_val *l = jj_iter_list(c, v);
        if (name[1] == 'u') {
            jj_val *acc = jj_int(c, 0);
            for (size_t i = 0; i < l->u.l.n; i++) {
                jj_val *pair[2] = {acc, l->u.l.v[i]};
                (void)pair;
                if (l->u.l.v[i]->t == JV_INT && acc->t == JV_INT &&
                    !__builtin_add_overflow(acc->u.i, l->u.l.v[i]->u.i, &(long long){0}))
                    acc = jj_int(c, acc->u.i + l->u.l.v[i]->u.i);
                else if ((l->u.l.v[i]->t == JV_INT || l->u.l.v[i]->t == JV_FLOAT) &&
                         (acc->t == JV_INT || acc->t == JV_FLOAT))
                    acc = jj_float(c, (acc->t == JV_INT ? (double)acc->u.i : acc->u.f) +
                                          (l->u.l.v[i]->t == JV_INT ? (double)l->u.l.v[i]->u.i : l->u.l.v[i]->u.f));
                else
                    jj_fail(c, "sum: unsupported operand");
            }
            return acc;
        }
        if (!l->u.l.n)
            return jj_undef(c, NULL);
        jj_val *best = l->u.l.v[0];
        for (size_t i = 1; i < l->u.l.n; i++)
            if (name[1] == 'i' ? lt(c, l->u.l.v[i], best) : lt(c, best, l->u.l.v[i]))
                best = l->u.l.v[i];
        return best;
    }
    jj_fail(c, "no filter named '%s'", name);
}

int jj_test(jj_ctx *c, const char *name, jj_val *v, jj_val **args, int nargs)
{
    jj_val *a0 = nargs ? args[0] : NULL;
    if (eqs(name, "defined")) return v->t != JV_UNDEF;
    if (eqs(name, "undefined")) return v->t == JV_UNDEF;
    if (eqs(name, "none")) return v->t == JV_NONE;
    if (eqs(name, "string")) return v->t == JV_STR;
    if (eqs(name, "mapping")) return v->t == JV_DICT;
    if (eqs(name, "iterable"))
        return v->t == JV_STR || v->t == JV_LIST || v->t == JV_TUPLE || v->t == JV_DICT || v->t == JV_UNDEF;
    if (eqs(name, "sequence")) return v->t == JV_STR || v->t == JV_LIST || v->t == JV_TUPLE || v->t == JV_DICT;
    if (eqs(name, "number")) return v->t == JV_INT || v->t == JV_FLOAT || v->t == JV_BOOL;
    if (eqs(name, "integer")) return v->t == JV_INT;
    if (eqs(name, "float")) return v->t == JV_FLOAT;
    if (eqs(name, "boolean")) return v->t == JV_BOOL;
    if (eqs(name, "true")) return v->t == JV_BOOL && v->u.b;
    if (eqs(name, "false")) return v->t == JV_BOOL && !v->u.b;
    if (eqs(name, "callable")) return v->t == JV_MACRO || v->t == JV_FUNC || v->t == JV_METHOD;
    if (eqs(name, "lower") || eqs(name, "upper")) {
        if (v->t != JV_STR)
            return 0;
        return jj_eq(jj_recase(c, v, name[0] == 'l' ? 0 : 1), v);
    }
    if (eqs(name, "odd") || eqs(name, "even") || eqs(name, "divisibleby")) {
        if (v->t != JV_INT && v->t != JV_BOOL)
            jj_fail(c, "test '%s' needs an integer", name);
        long long x = v->t == JV_INT ? v->u.i : v->u.b;
        if (name[0] == 'o') return x % 2 != 0;
        if (name[0] == 'e') return x % 2 == 0;
        if (!a0 || a0->t != JV_INT || a0->u.i == 0)
            jj_fail(c, "divisibleby needs a non-zero integer");
        return a0->u.i == -1 ? 1 : x % a0->u.i == 0;
    }
    if (!a0)
        jj_fail(c, "test '%s' needs an argument, or there is no such test", name);
    if (eqs(name, "equalto") || eqs(name, "eq") || eqs(name, "==")) return jj_eq(v, a0);
    if (eqs(name, "ne") || eqs(name, "!=")) return !jj_eq(v, a0);
    if (eqs(name, "sameas")) return v->t == a0->t && (v->t == JV_NONE || v->t == JV_BOOL ? jj_eq(v, a0) : v == a0);
    if (eqs(name, "in")) {
        jj_val *pair[2] = {v, a0};
        (void)pair;
        if (a0->t == JV_STR && v->t == JV_STR) {
            for (size_t i = 0; i + v->u.s.n <= a0->u.s.n; i++)
                if (!memcmp(a0->u.s.p + i, v->u.s.p, v->u.s.n))
                    return 1;
            return 0;
        }
        if (a0->t == JV_UNDEF)
            return 0;
        jj_val *l = jj_iter_list(c, a0);
        for (size_t i = 0; i < l->u.l.n; i++)
            if (jj_eq(l->u.l.v[i], v))
                return 1;
        return 0;
    }
    if (eqs(name, "lt") || eqs(name, "<") || eqs(name, "le") || eqs(name, "<=") || eqs(name, "gt") ||
        eqs(name, ">") || eqs(name, "ge") || eqs(name, ">=")) {
        int num = (v->t == JV_INT || v->t == JV_FLOAT || v->t == JV_BOOL) &&
                  (a0->t == JV_INT || a0->t == JV_FLOAT || a0->t == JV_BOOL);
        int r;
        if (num) {
            double x = v->t == JV_FLOAT ? v->u.f : v->t == JV_INT ? (double)v->u.i : v->u.b;
            double y = a0->t == JV_FLOAT ? a0->u.f : a0->t == JV_INT ? (double)a0->u.i : a0->u.b;
            if (v->t != JV_FLOAT && a0->t != JV_FLOAT) {
                long long xi = v->t == JV_INT ? v->u.i : v->u.b, yi = a0->t == JV_INT ? a0->u.i : a0->u.b;
                r = (xi > yi) - (xi < yi);
            } else {
                r = (x > y) - (x < y);
            }
        } else if (v->t == JV_STR && a0->t == JV_STR) {
            size_t n = v->u.s.n < a0->u.s.n ? v->u.s.n : a0->u.s.n;
            r = memcmp(v->u.s.p, a0->u.s.p, n);
            if (!r)
                r = (v->u.s.n > a0->u.s.n) - (v->u.s.n < a0->u.s.n);
        } else {
            if (v->t == JV_UNDEF)
                undefined_error(c, v);
            jj_fail(c, "cannot compare '%s' and '%s'", jj_type_name(v), jj_type_name(a0));
        }
        if (name[0] == 'l' || name[0] == '<')
            return name[1] == 'e' || name[1] == '=' ? r <= 0 : r < 0;
        return name[1] == 'e' || name[1] == '=' ? r >= 0 : r > 0;
    }
    jj_fail(c, "no test named '%s'", name);
}
