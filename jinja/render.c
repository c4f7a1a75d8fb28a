/*
 * render.c: statements (output, if, for with its loop variable, set,
 * namespace attributes, macro definitions, break/continue) and
 * jinja_render, which sets up the limits and the arena and catches
 * jj_fail's longjmp.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja/jj.h"

static void write_out(jj_ctx *c, jj_buf *out, const char *p, size_t n)
{
    jj_step(c);
    if (out == &c->out && out->n + n > c->max_output)
        jj_fail(c, "output limit exceeded (%zu bytes)", c->max_output);
    jj_buf_add(c, out, p, n);
}

static void bind_targets(jj_ctx *c, jj_scope *s, const char **names, int n, jj_val *v)
{
    if (n == 1) {
        jj_scope_set(c, s, names[0], v);
        return;
    }
    jj_val *l = jj_iter_list(c, v);
    if (l->u.l.n != (size_t)n)
        jj_fail(c, "cannot unpack %zu values into %d names", l->u.l.n, n);
    for (int i = 0; i < n; i++)
        jj_scope_set(c, s, names[i], l->u.l.v[i]);
}

static void set_int(jj_ctx *c, jj_val *d, const char *k, long long i) { jj_dict_set(c, d, jj_strz(c, k), jj_int(c, i)); }

static void exec_for(jj_ctx *c, jj_scope *s, const jj_node *n, jj_buf *out)
{
    jj_val *seq = jj_iter_list(c, jj_eval(c, s, n->a));
    jj_val *items = seq;
    if (n->b) { /* "for x in y if cond": the loop sees only what passes */
        items = jj_list(c, JV_LIST);
        for (size_t i = 0; i < seq->u.l.n; i++) {
            jj_step(c);
            jj_scope *f = jj_scope_new(c, s);
            bind_targets(c, f, n->names, n->nnames, seq->u.l.v[i]);
            if (jj_truthy(jj_eval(c, f, n->b)))
                jj_list_push(c, items, seq->u.l.v[i]);
        }
    }
    size_t len = items->u.l.n;
    for (size_t i = 0; i < len; i++) {
        jj_step(c);
        jj_scope *f = jj_scope_new(c, s);
        jj_val *loop = jj_dict(c, JV_DICT);
        set_int(c, loop, "index", (long long)i + 1);
        set_int(c, loop, "index0", (long long)i);
        set_int(c, loop, "revindex", (long long)(len - i));
        set_int(c, loop, "revindex0", (long long)(len - i - 1));
        set_int(c, loop, "length", (long long)len);
        set_int(c, loop, "depth", 1);
        set_int(c, loop, "depth0", 0);
        jj_dict_set(c, loop, jj_strz(c, "first"), jj_bool(i == 0));
        jj_dict_set(c, loop, jj_strz(c, "last"), jj_bool(i + 1 == len));
        if (i > 0)
            jj_dict_set(c, loop, jj_strz(c, "previtem"), items->u.l.v[i - 1]);
        if (i + 1 < len)
            jj_dict_set(c, loop, jj_strz(c, "nextitem"), items->u.l.v[i + 1]);
        jj_scope_set(c, f, "loop", loop);
        bind_targets(c, f, n->names, n->nnames, items->u.l.v[i]);
        int ctl = 0;
        jj_exec_body(c, f, n->list, n->n, out, &ctl);
        if (ctl == 1)
            break;
    }
    if (!len) {
        int ctl = 0;
        jj_exec_body(c, s, n->list2, n->n2, out, &ctl);
    }
}

/* ctl: set to 1 by break, 2 by continue; the enclosing loop reads it. */
void jj_exec_body(jj_ctx *c, jj_scope *s, jj_node **body, int nb, jj_buf *out, int *ctl)
{
    if (++c->depth > c->max_depth * 16)
        jj_fail(c, "nesting too deep");
    for (int k = 0; k < nb && !*ctl; k++) {
        const jj_node *n = body[k];
        c->line = n->line;
        switch (n->kind) {
        case N_TEXT: write_out(c, out, n->s, n->slen); break;
        case N_OUT: {
            jj_val *v = jj_eval(c, s, n->a);
            if (v->t == JV_STR) {
                write_out(c, out, v->u.s.p, v->u.s.n);
            } else {
                jj_buf tmp = {0};
                jj_str_of(c, &tmp, v);
                write_out(c, out, tmp.p ? tmp.p : "", tmp.n);
            }
            break;
        }
        case N_IF:
            if (jj_truthy(jj_eval(c, s, n->a)))
                jj_exec_body(c, s, n->list, n->n, out, ctl);
            else
                jj_exec_body(c, s, n->list2, n->n2, out, ctl);
            break;
        case N_FOR: exec_for(c, s, n, out); break;
        case N_SET: bind_targets(c, s, n->names, n->nnames, jj_eval(c, s, n->a)); break;
        case N_SETATTR: {
            jj_val *ns = jj_lookup(c, s, n->s);
            if (ns->t != JV_NS)
                jj_fail(c, "cannot assign attribute on non-namespace object");
            jj_val *v = jj_eval(c, s, n->a);
            jj_dict_set(c, ns, jj_strz(c, n->names[0]), v);
            break;
        }
        case N_MACRO: {
            jj_val *m = jj_alloc(c->a, sizeof *m);
            m->t = JV_MACRO;
            m->u.m.def = n;
            m->u.m.scope = s;
            jj_scope_set(c, s, n->s, m);
            break;
        }
        case N_BREAK: *ctl = 1; break;
        case N_CONTINUE: *ctl = 2; break;
        default: jj_fail(c, "not a statement");
        }
    }
    c->depth--;
}

/* The part of a render that can longjmp back: nothing here outlives it but *c. */
static int run(jj_ctx *c, const jinja_template *t, const json_t *ctx)
{
    if (setjmp(c->jb))
        return -1;
    jj_scope *top = jj_scope_new(c, NULL);
    if (ctx && json_is_object(ctx)) {
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)ctx, k, v) jj_scope_set(c, top, jj_strndup(c->a, k, strlen(k)), jj_from_json(c, v));
    }
    int ctl = 0;
    jj_exec_body(c, top, t->body, t->n, &c->out, &ctl);
    return 0;
}

int jinja_render(const jinja_template *t, const json_t *ctx, const jinja_limits *lim, char **out, size_t *out_len,
                 char *err, size_t err_size)
{
    char dummy[1];
    if (!err || !err_size) {
        err = dummy;
        err_size = sizeof dummy;
    }
    err[0] = 0;
    if (!out) {
        snprintf(err, err_size, "line 0: no output pointer");
        return -1;
    }
    *out = NULL;
    if (out_len)
        *out_len = 0;
    if (!t) {
        snprintf(err, err_size, "line 0: no template");
        return -1;
    }
    jj_ctx *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(err, err_size, "line 0: out of memory");
        return -1;
    }
    /* The arena lives in *c, not in a local: locals changed after setjmp are indeterminate after longjmp. */
    jj_arena *arena = c->a = &c->arena;
    c->err = err;
    c->err_size = err_size;
    c->max_output = lim && lim->max_output ? lim->max_output : (size_t)1 << 20;
    c->max_depth = lim && lim->max_depth > 0 ? lim->max_depth : 64;
    if (c->max_depth > 100000)
        c->max_depth = 100000;
    c->max_steps = lim && lim->max_steps > 0 ? lim->max_steps : 10000000L;
    c->now = lim && lim->now ? lim->now : time(NULL);
    arena->fail = &c->jb;
    arena->err = err;
    arena->err_size = err_size;
    arena->oom = "line 0: out of memory (or over the render's memory cap)";
    /* Values are never freed before the end; this caps what a render holds. */
    arena->cap = ((size_t)256 << 20) + (c->max_output > ((size_t)1 << 30) ? (size_t)1 << 32 : c->max_output * 8);
    int rc = run(c, t, ctx);
    if (rc) {
        jj_arena_free(c->a);
        free(c);
        return -1;
    }
    char *r = malloc(c->out.n + 1);
    if (!r) {
        snprintf(err, err_size, "line 0: out of memory");
        jj_arena_free(c->a);
        free(c);
        return -1;
    }
    if (c->out.n)
        memcpy(r, c->out.p, c->out.n);
    r[c->out.n] = 0;
    *out = r;
    if (out_len)
        *out_len = c->out.n;
    jj_arena_free(c->a);
    free(c);
    return 0;
}
