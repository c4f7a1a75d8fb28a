/*
 * eval.c: runs the syntax tree. Scopes chain as Jinja2's do for the
 * constructs chat templates use: a for loop's body and a macro call get
 * their own scope (a "set" there does not leak out, hence namespace()),
 * "if" does not. Errors leave through jj_fail's longjmp; every value lives
 * in the render's arena, freed as one.
 */
#define _POSIX_C_SOURCE 200809L /* localtime_r */
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja/jj.h"

_Noreturn void jj_fail(jj_ctx *c, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    for (char *p = msg; *p; p++)
        if (*p == '\n' || *p == '\r')
            *p = ' '; /* the message is one line, whatever raise_exception was given */
    if (c->err && c->err_size)
        snprintf(c->err, c->err_size, "line %d: %s", c->line, msg);
    longjmp(c->jb, 1);
}

void jj_step(jj_ctx *c)
{
    if (++c->steps > c->max_steps)
        jj_fail(c, "step limit exceeded (%ld)", c->max_steps);
}

static void enter(jj_ctx *c)
{
    if (++c->depth > c->max_depth * 16)
        jj_fail(c, "nesting too deep");
}

/* ---- scopes ---- */
jj_scope *jj_scope_new(jj_ctx *c, jj_scope *parent)
{
    jj_scope *s = jj_alloc(c->a, sizeof *s);
    s->parent = parent;
    return s;
}

void jj_scope_set(jj_ctx *c, jj_scope *s, const char *k, jj_val *v)
{
    for (size_t i = 0; i < s->n; i++)
        if (!strcmp(s->k[i], k)) {
            s->v[i] = v;
            return;
        }
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 8;
        s->k = jj_grow(c->a, s->k, s->cap * sizeof *s->k, cap * sizeof *s->k);
        s->v = jj_grow(c->a, s->v, s->cap * sizeof *s->v, cap * sizeof *s->v);
        s->cap = cap;
    }
    s->k[s->n] = k;
    s->v[s->n++] = v;
}

static const char *const GLOBALS[] = {"raise_exception", "strftime_now", "namespace", "range", "dict", NULL};

jj_val *jj_lookup(jj_ctx *c, jj_scope *s, const char *k)
{
    for (; s; s = s->parent)
        for (size_t i = s->n; i-- > 0;)
            if (!strcmp(s->k[i], k))
                return s->v[i];
    for (const char *const *g = GLOBALS; *g; g++)
        if (!strcmp(*g, k)) {
            jj_val *f = jj_alloc(c->a, sizeof *f);
            f->t = JV_FUNC;
            f->u.fn.name = *g;
            return f;
        }
    return jj_undef(c, k);
}

static _Noreturn void undefined_error(jj_ctx *c, const jj_val *v)
{
    if (v->uname)
        jj_fail(c, "'%s' is undefined", v->uname);
    jj_fail(c, "an undefined value was used");
}

/* ---- attribute and item access (jinja2's environment.getattr / getitem) ---- */
static jj_val *method(jj_ctx *c, jj_val *self, const char *name, size_t n)
{
    jj_val *m = jj_alloc(c->a, sizeof *m);
    m->t = JV_METHOD;
    m->u.fn.name = jj_strndup(c->a, name, n);
    m->u.fn.self = self;
    return m;
}

jj_val *jj_getattr(jj_ctx *c, jj_val *obj, const char *name, size_t n)
{
    if (obj->t == JV_UNDEF)
        undefined_error(c, obj);
    if (jj_has_method(obj, name, n))
        return method(c, obj, name, n);
    if (obj->t == JV_DICT || obj->t == JV_NS) {
        jj_val *v = jj_dict_get(obj, name, n);
        if (v)
            return v;
    }
    return jj_undef(c, jj_strndup(c->a, name, n));
}

static long long norm_index(long long i, size_t n) { return i < 0 ? i + (long long)n : i; }

/* Byte offset of code point k in s (k <= number of code points). */
static size_t cp_offset(const jj_val *s, size_t k)
{
    size_t i = 0;
    for (; i < s->u.s.n; i++)
        if (((unsigned char)s->u.s.p[i] & 0xC0) != 0x80) {
            if (k == 0)
                return i;
            k--;
        }
    return i;
}

jj_val *jj_getitem(jj_ctx *c, jj_val *obj, jj_val *key)
{
    if (obj->t == JV_UNDEF)
        undefined_error(c, obj);
    if ((obj->t == JV_DICT || obj->t == JV_NS) && key->t == JV_STR) {
        jj_val *v = jj_dict_get(obj, key->u.s.p, key->u.s.n);
        if (v)
            return v;
    }
    if ((key->t == JV_INT || key->t == JV_BOOL) && obj->t != JV_DICT) {
        long long i = key->t == JV_INT ? key->u.i : key->u.b;
        if (obj->t == JV_LIST || obj->t == JV_TUPLE) {
            i = norm_index(i, obj->u.l.n);
            if (i >= 0 && (size_t)i < obj->u.l.n)
                return obj->u.l.v[i];
        } else if (obj->t == JV_STR) {
            size_t len = jj_utf8_len(obj->u.s.p, obj->u.s.n);
            i = norm_index(i, len);
            if (i >= 0 && (size_t)i < len) {
                size_t a = cp_offset(obj, (size_t)i), b = cp_offset(obj, (size_t)i + 1);
                return jj_str(c, obj->u.s.p + a, b - a);
            }
        }
    }
    if (key->t == JV_STR && jj_has_method(obj, key->u.s.p, key->u.s.n))
        return method(c, obj, key->u.s.p, key->u.s.n);
    return jj_undef(c, key->t == JV_STR ? jj_strndup(c->a, key->u.s.p, key->u.s.n) : NULL);
}

/* Python's slice semantics on lists, tuples and strings (by code point). */
static jj_val *slice(jj_ctx *c, jj_val *obj, jj_val *lo, jj_val *hi, jj_val *st)
{
    if (obj->t == JV_UNDEF)
        undefined_error(c, obj);
    size_t n;
    if (obj->t == JV_LIST || obj->t == JV_TUPLE)
        n = obj->u.l.n;
    else if (obj->t == JV_STR)
        n = jj_utf8_len(obj->u.s.p, obj->u.s.n);
    else
        jj_fail(c, "'%s' object is not subscriptable", jj_type_name(obj));
    long long step = jj_int_arg(c, st, 1), len = (long long)n;
    if (step == 0)
        jj_fail(c, "slice step cannot be zero");
    long long a, b;
    if (step > 0) {
        a = jj_int_arg(c, lo, 0);
        b = jj_int_arg(c, hi, len);
        if (a < 0) a = a + len < 0 ? 0 : a + len;
        if (b < 0) b = b + len < 0 ? 0 : b + len;
        if (a > len) a = len;
        if (b > len) b = len;
    } else {
        a = jj_int_arg(c, lo, len - 1);
        b = jj_int_arg(c, hi, -len - 1);
        if (a < 0) a = a + len < 0 ? -1 : a + len;
        if (b < 0) b = b + len < 0 ? -1 : b + len;
        if (a >= len) a = len - 1;
        if (b >= len) b = len - 1;
    }
    if (obj->t == JV_STR) {
        jj_buf out = {0};
        for (long long i = a; step > 0 ? i < b : i > b; i += step) {
            size_t x = cp_offset(obj, (size_t)i), y = cp_offset(obj, (size_t)i + 1);
            jj_buf_add(c, &out, obj->u.s.p + x, y - x);
        }
        return jj_str(c, out.p ? out.p : "", out.n);
    }
    jj_val *r = jj_list(c, obj->t);
    for (long long i = a; step > 0 ? i < b : i > b; i += step)
        jj_list_push(c, r, obj->u.l.v[i]);
    return r;
}

jj_val *jj_iter_list(jj_ctx *c, jj_val *v)
{
    switch (v->t) {
    case JV_LIST: case JV_TUPLE: return v;
    case JV_UNDEF: return jj_list(c, JV_LIST); /* Undefined iterates as empty */
    case JV_DICT: {
        jj_val *l = jj_list(c, JV_LIST);
        for (size_t i = 0; i < v->u.d.n; i++)
            jj_list_push(c, l, v->u.d.k[i]);
        return l;
    }
    case JV_STR: {
        jj_val *l = jj_list(c, JV_LIST);
        for (size_t i = 0; i < v->u.s.n;) {
            size_t j = i + 1;
            while (j < v->u.s.n && ((unsigned char)v->u.s.p[j] & 0xC0) == 0x80)
                j++;
            jj_list_push(c, l, jj_str(c, v->u.s.p + i, j - i));
            i = j;
        }
        return l;
    }
    default: jj_fail(c, "'%s' object is not iterable", jj_type_name(v));
    }
}

/* ---- operators ---- */
static int is_num(const jj_val *v) { return v->t == JV_INT || v->t == JV_FLOAT || v->t == JV_BOOL; }
static int is_int(const jj_val *v) { return v->t == JV_INT || v->t == JV_BOOL; }
static long long ival(const jj_val *v) { return v->t == JV_INT ? v->u.i : v->u.b; }
static double fval(const jj_val *v) { return v->t == JV_FLOAT ? v->u.f : (double)ival(v); }

static const char *OPS[] = {"", "+", "-", "*", "/", "//", "%", "**", "~", "==", "!=", "<", "<=", ">", ">=", "in",
                            "not in"};

static _Noreturn void bad_operands(jj_ctx *c, int op, const jj_val *a, const jj_val *b)
{
    if (a->t == JV_UNDEF)
        undefined_error(c, a);
    if (b->t == JV_UNDEF)
        undefined_error(c, b);
    jj_fail(c, "unsupported operand type(s) for %s: '%s' and '%s'", OPS[op], jj_type_name(a), jj_type_name(b));
}

static jj_val *repeat(jj_ctx *c, jj_val *seq, long long k)
{
    if (k < 0)
        k = 0;
    size_t unit = seq->t == JV_STR ? seq->u.s.n : seq->u.l.n;
    if (unit && (unsigned long long)k > (c->max_output * 4 + 4096) / unit)
        jj_fail(c, "repetition exceeds the output limit");
    if (seq->t == JV_STR) {
        jj_buf b = {0};
        for (long long i = 0; i < k; i++)
            jj_buf_add(c, &b, seq->u.s.p, seq->u.s.n);
        return jj_str(c, b.p ? b.p : "", b.n);
    }
    jj_val *r = jj_list(c, seq->t);
    for (long long i = 0; i < k; i++)
        for (size_t j = 0; j < seq->u.l.n; j++)
            jj_list_push(c, r, seq->u.l.v[j]);
    return r;
}

static int compare(jj_ctx *c, int op, jj_val *a, jj_val *b)
{
    int r;
    if (is_num(a) && is_num(b)) {
        if (is_int(a) && is_int(b))
            r = (ival(a) > ival(b)) - (ival(a) < ival(b));
        else {
            double x = fval(a), y = fval(b);
            if (isnan(x) || isnan(y))
                return 0;
            r = (x > y) - (x < y);
        }
    } else if (a->t == JV_STR && b->t == JV_STR) {
        size_t n = a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n;
        r = memcmp(a->u.s.p, b->u.s.p, n);
        if (!r)
            r = (a->u.s.n > b->u.s.n) - (a->u.s.n < b->u.s.n);
    } else if ((a->t == JV_LIST || a->t == JV_TUPLE) && a->t == b->t) {
        size_t i = 0;
        while (i < a->u.l.n && i < b->u.l.n && jj_eq(a->u.l.v[i], b->u.l.v[i]))
            i++;
        if (i < a->u.l.n && i < b->u.l.n)
            return compare(c, op, a->u.l.v[i], b->u.l.v[i]);
        r = (a->u.l.n > b->u.l.n) - (a->u.l.n < b->u.l.n);
    } else {
        if (a->t == JV_UNDEF)
            undefined_error(c, a);
        if (b->t == JV_UNDEF)
            undefined_error(c, b);
        jj_fail(c, "'%s' not supported between instances of '%s' and '%s'", OPS[op], jj_type_name(a),
                jj_type_name(b));
    }
    switch (op) {
    case OP_LT: return r < 0;
    case OP_LE: return r <= 0;
    case OP_GT: return r > 0;
    default: return r >= 0;
    }
}

static int contains(jj_ctx *c, jj_val *item, jj_val *seq)
{
    switch (seq->t) {
    case JV_STR:
        if (item->t != JV_STR) {
            if (item->t == JV_UNDEF)
                undefined_error(c, item);
            jj_fail(c, "'in <string>' requires string as left operand, not %s", jj_type_name(item));
        }
        if (!item->u.s.n)
            return 1;
        for (size_t i = 0; i + item->u.s.n <= seq->u.s.n; i++)
            if (!memcmp(seq->u.s.p + i, item->u.s.p, item->u.s.n))
                return 1;
        return 0;
    case JV_LIST: case JV_TUPLE:
        for (size_t i = 0; i < seq->u.l.n; i++)
            if (jj_eq(seq->u.l.v[i], item))
                return 1;
        return 0;
    case JV_DICT:
        for (size_t i = 0; i < seq->u.d.n; i++)
            if (jj_eq(seq->u.d.k[i], item))
                return 1;
        return 0;
    case JV_UNDEF: return 0;
    default: jj_fail(c, "argument of type '%s' is not iterable", jj_type_name(seq));
    }
}

static jj_val *binop(jj_ctx *c, int op, jj_val *a, jj_val *b)
{
    long long r;
    switch (op) {
    case OP_CAT: {
        jj_buf buf = {0};
        jj_str_of(c, &buf, a);
        jj_str_of(c, &buf, b);
        return jj_str(c, buf.p ? buf.p : "", buf.n);
    }
    case OP_EQ: return jj_bool(jj_eq(a, b));
    case OP_NE: return jj_bool(!jj_eq(a, b));
    case OP_LT: case OP_LE: case OP_GT: case OP_GE: return jj_bool(compare(c, op, a, b));
    case OP_IN: return jj_bool(contains(c, a, b));
    case OP_NOTIN: return jj_bool(!contains(c, a, b));
    default: break;
    }
    if (is_num(a) && is_num(b)) {
        int ints = is_int(a) && is_int(b);
        long long x = ival(a), y = ival(b);
        double fx = fval(a), fy = fval(b);
        switch (op) {
        case OP_ADD:
            if (!ints) return jj_float(c, fx + fy);
            if (__builtin_add_overflow(x, y, &r)) break;
            return jj_int(c, r);
        case OP_SUB:
            if (!ints) return jj_float(c, fx - fy);
            if (__builtin_sub_overflow(x, y, &r)) break;
            return jj_int(c, r);
        case OP_MUL:
            if (!ints) return jj_float(c, fx * fy);
            if (__builtin_mul_overflow(x, y, &r)) break;
            return jj_int(c, r);
        case OP_DIV:
            if (fy == 0) jj_fail(c, "division by zero");
            return jj_float(c, fx / fy);
        case OP_FDIV:
        case OP_MOD:
            if (ints ? y == 0 : fy == 0) jj_fail(c, "division by zero");
            if (ints) {
                if (x == LLONG_MIN && y == -1) break;
                long long q = x / y, m = x % y;
                if (m && ((m < 0) != (y < 0))) {
                    q--;
                    m += y;
                }
                return jj_int(c, op == OP_FDIV ? q : m);
            } else {
                double m = fmod(fx, fy);
                if (m && ((m < 0) != (fy < 0)))
                    m += fy;
                return jj_float(c, op == OP_FDIV ? floor(fx / fy) : m);
            }
        case OP_POW:
            if (ints && y >= 0) {
                long long acc = 1;
                for (long long i = 0; i < y; i++)
                    if (__builtin_mul_overflow(acc, x, &acc))
                        jj_fail(c, "integer too large");
                    else if (acc == 0 || acc == 1)
                        break;
                return jj_int(c, acc);
            }
            return jj_float(c, pow(fx, fy));
        }
        jj_fail(c, "integer too large");
    }
    if (op == OP_ADD && a->t == JV_STR && b->t == JV_STR) {
        jj_buf buf = {0};
        jj_buf_add(c, &buf, a->u.s.p, a->u.s.n);
        jj_buf_add(c, &buf, b->u.s.p, b->u.s.n);
        return jj_str(c, buf.p ? buf.p : "", buf.n);
    }
    if (op == OP_ADD && (a->t == JV_LIST || a->t == JV_TUPLE) && a->t == b->t) {
        jj_val *l = jj_list(c, a->t);
        for (size_t i = 0; i < a->u.l.n; i++)
            jj_list_push(c, l, a->u.l.v[i]);
        for (size_t i = 0; i < b->u.l.n; i++)
            jj_list_push(c, l, b->u.l.v[i]);
        return l;
    }
    if (op == OP_MUL && is_int(b) && (a->t == JV_STR || a->t == JV_LIST || a->t == JV_TUPLE))
        return repeat(c, a, ival(b));
    if (op == OP_MUL && is_int(a) && (b->t == JV_STR || b->t == JV_LIST || b->t == JV_TUPLE))
        return repeat(c, b, ival(a));
    bad_operands(c, op, a, b);
}

/* ---- calls ---- */

static jj_val *call_macro(jj_ctx *c, jj_val *m, jj_val **args, int nargs, const char **kw, jj_val **kwv, int nkw)
{
    const jj_node *def = m->u.m.def;
    if (++c->calls > c->max_depth)
        jj_fail(c, "macro calls nested too deep");
    jj_step(c);
    if (nargs > def->nnames)
        jj_fail(c, "macro '%s' takes not more than %d argument(s)", def->s, def->nnames);
    jj_scope *s = jj_scope_new(c, m->u.m.scope);
    for (int i = 0; i < def->nnames; i++) {
        jj_val *v = i < nargs ? args[i] : NULL;
        for (int k = 0; k < nkw; k++)
            if (!strcmp(kw[k], def->names[i])) {
                if (v)
                    jj_fail(c, "macro '%s' got multiple values for argument '%s'", def->s, kw[k]);
                v = kwv[k];
            }
        if (!v)
            v = def->list2[i] ? jj_eval(c, s, def->list2[i]) : jj_undef(c, def->names[i]);
        jj_scope_set(c, s, def->names[i], v);
    }
    for (int k = 0; k < nkw; k++) {
        int found = 0;
        for (int i = 0; i < def->nnames; i++)
            found |= !strcmp(kw[k], def->names[i]);
        if (!found)
            jj_fail(c, "macro '%s' takes no keyword argument '%s'", def->s, kw[k]);
    }
    jj_buf out = {0};
    int ctl = 0, line = c->line;
    jj_exec_body(c, s, def->list, def->n, &out, &ctl);
    c->line = line;
    c->calls--;
    return jj_str(c, out.p ? out.p : "", out.n);
}

static jj_val *call_global(jj_ctx *c, const char *name, jj_val **args, int nargs, const char **kw, jj_val **kwv,
                           int nkw)
{
    if (!strcmp(name, "raise_exception")) {
        jj_val *m = jj_to_str(c, nargs ? args[0] : &jj_none_v);
        jj_fail(c, "raise_exception: %.*s", (int)(m->u.s.n > 400 ? 400 : m->u.s.n), m->u.s.p);
    }
    if (!strcmp(name, "strftime_now")) {
        if (nargs < 1 || args[0]->t != JV_STR)
            jj_fail(c, "strftime_now() needs a format string");
        char fmt[256], out[512];
        snprintf(fmt, sizeof fmt, "%.*s", (int)(args[0]->u.s.n > 255 ? 255 : args[0]->u.s.n), args[0]->u.s.p);
        struct tm tm;
        time_t now = c->now;
        if (!localtime_r(&now, &tm))
            jj_fail(c, "strftime_now: bad time");
        size_t n = fmt[0] ? strftime(out, sizeof out, fmt, &tm) : 0;
        return jj_str(c, out, n);
    }
    if (!strcmp(name, "namespace") || !strcmp(name, "dict")) {
        jj_val *d = jj_dict(c, name[0] == 'n' ? JV_NS : JV_DICT);
        for (int i = 0; i < nargs; i++) {
            if (args[i]->t != JV_DICT)
                jj_fail(c, "%s() takes keyword arguments or a dict", name);
            for (size_t k = 0; k < args[i]->u.d.n; k++)
                jj_dict_set(c, d, args[i]->u.d.k[k], args[i]->u.d.v[k]);
        }
        for (int k = 0; k < nkw; k++)
            jj_dict_set(c, d, jj_strz(c, kw[k]), kwv[k]);
        return d;
    }
    /* range */
    long long a = 0, b = 0, st = 1;
    for (int i = 0; i < nargs; i++)
        if (args[i]->t != JV_INT)
            jj_fail(c, "range() takes integers");
    if (nargs == 1)
        b = args[0]->u.i;
    else if (nargs >= 2) {
        a = args[0]->u.i;
        b = args[1]->u.i;
        if (nargs >= 3)
            st = args[2]->u.i;
    } else
        jj_fail(c, "range expected at least 1 argument");
    if (st == 0)
        jj_fail(c, "range() arg 3 must not be zero");
    jj_val *l = jj_list(c, JV_LIST);
    for (long long i = a; st > 0 ? i < b : i > b; i += st) {
        jj_step(c);
        jj_list_push(c, l, jj_int(c, i));
        if ((st > 0 && i > LLONG_MAX - st) || (st < 0 && i < LLONG_MIN - st))
            break;
    }
    return l;
}

jj_val *jj_call_value(jj_ctx *c, jj_val *f, jj_val **args, int nargs, const char **kw, jj_val **kwv, int nkw)
{
    switch (f->t) {
    case JV_MACRO: return call_macro(c, f, args, nargs, kw, kwv, nkw);
    case JV_FUNC: return call_global(c, f->u.fn.name, args, nargs, kw, kwv, nkw);
    case JV_METHOD: return jj_method(c, f->u.fn.self, f->u.fn.name, args, nargs, kw, kwv, nkw);
    case JV_UNDEF: undefined_error(c, f);
    default: jj_fail(c, "'%s' object is not callable", jj_type_name(f));
    }
}

/* Evaluated arguments of a call, filter or test node. */
typedef struct argv_ { jj_val **v, **kwv; int n, nkw; } argv_;
static argv_ eval_args(jj_ctx *c, jj_scope *s, const jj_node *n)
{
    argv_ a = {0};
    a.n = n->n;
    a.nkw = n->n2;
    a.v = jj_alloc(c->a, sizeof *a.v * (size_t)(n->n + 1));
    a.kwv = jj_alloc(c->a, sizeof *a.kwv * (size_t)(n->n2 + 1));
    for (int i = 0; i < n->n; i++)
        a.v[i] = jj_eval(c, s, n->list[i]);
    for (int i = 0; i < n->n2; i++)
        a.kwv[i] = jj_eval(c, s, n->list2[i]);
    return a;
}

jj_val *jj_eval(jj_ctx *c, jj_scope *s, const jj_node *n)
{
    jj_val *r = NULL, *x;
    enter(c);
    c->line = n->line;
    switch (n->kind) {
    case N_LIT: r = n->lit; break;
    case N_NAME: r = jj_lookup(c, s, n->s); break;
    case N_ATTR: r = jj_getattr(c, jj_eval(c, s, n->a), n->s, n->slen); break;
    case N_ITEM:
        x = jj_eval(c, s, n->a);
        r = jj_getitem(c, x, jj_eval(c, s, n->b));
        break;
    case N_SLICE: {
        x = jj_eval(c, s, n->a);
        jj_val *lo = n->b ? jj_eval(c, s, n->b) : NULL, *hi = n->c ? jj_eval(c, s, n->c) : NULL;
        r = slice(c, x, lo, hi, n->d ? jj_eval(c, s, n->d) : NULL);
        break;
    }
    case N_CALL: {
        x = jj_eval(c, s, n->a);
        argv_ a = eval_args(c, s, n);
        c->line = n->line;
        r = jj_call_value(c, x, a.v, a.n, n->names, a.kwv, a.nkw);
        break;
    }
    case N_FILTER: {
        x = jj_eval(c, s, n->a);
        argv_ a = eval_args(c, s, n);
        c->line = n->line;
        r = jj_filter(c, n->s, x, a.v, a.n, n->names, a.kwv, a.nkw);
        break;
    }
    case N_TEST: {
        x = jj_eval(c, s, n->a);
        argv_ a = eval_args(c, s, n);
        c->line = n->line;
        r = jj_bool(jj_test(c, n->s, x, a.v, a.n) ^ n->op);
        break;
    }
    case N_BIN:
        x = jj_eval(c, s, n->a);
        r = binop(c, n->op, x, jj_eval(c, s, n->b));
        break;
    case N_AND:
        x = jj_eval(c, s, n->a);
        r = jj_truthy(x) ? jj_eval(c, s, n->b) : x;
        break;
    case N_OR:
        x = jj_eval(c, s, n->a);
        r = jj_truthy(x) ? x : jj_eval(c, s, n->b);
        break;
    case N_NOT: r = jj_bool(!jj_truthy(jj_eval(c, s, n->a))); break;
    case N_NEG:
    case N_POS:
        x = jj_eval(c, s, n->a);
        if (!is_num(x)) {
            if (x->t == JV_UNDEF)
                undefined_error(c, x);
            jj_fail(c, "bad operand type for unary %s: '%s'", n->kind == N_NEG ? "-" : "+", jj_type_name(x));
        }
        if (n->kind == N_POS)
            r = x->t == JV_BOOL ? jj_int(c, x->u.b) : x;
        else if (x->t == JV_FLOAT)
            r = jj_float(c, -x->u.f);
        else if (ival(x) == LLONG_MIN)
            jj_fail(c, "integer too large");
        else
            r = jj_int(c, -ival(x));
        break;
    case N_COND:
        if (jj_truthy(jj_eval(c, s, n->b)))
            r = jj_eval(c, s, n->a);
        else
            r = n->c ? jj_eval(c, s, n->c) : jj_undef(c, NULL);
        break;
    case N_LIST:
    case N_TUPLE:
        r = jj_list(c, n->kind == N_LIST ? JV_LIST : JV_TUPLE);
        for (int i = 0; i < n->n; i++)
            jj_list_push(c, r, jj_eval(c, s, n->list[i]));
        break;
    case N_DICT:
        r = jj_dict(c, JV_DICT);
        for (int i = 0; i < n->n; i++) {
            jj_val *k = jj_eval(c, s, n->list[i]);
            if (k->t != JV_STR)
                jj_fail(c, "only string keys are supported in dict literals");
            jj_dict_set(c, r, k, jj_eval(c, s, n->list2[i]));
        }
        break;
    default: jj_fail(c, "not an expression");
    }
    c->depth--;
    return r;
}
