/*
 * parse.c: tokens to a syntax tree, by recursive descent in Jinja2's own
 * precedence order (parser.py: condexpr, or, and, not, compare, math1,
 * concat, math2, pow, unary with filters and tests, primary with postfix).
 * Nesting is capped so a hostile template cannot exhaust the stack here or
 * later in eval.c, which recurses along the same tree.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja/jj.h"

#define JJ_MAX_NESTING 200

typedef struct parser {
    jj_arena *a;
    jj_tok *t;
    size_t i, n;
    int depth;
    jmp_buf jb;
    char *err;
    size_t err_size;
} parser;

static _Noreturn void perr(parser *P, const jj_tok *k, const char *fmt, ...)
{
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(P->err, P->err_size, "line %d, column %d: %s", k->line, k->col, msg);
    longjmp(P->jb, 1);
}

static jj_tok *cur(parser *P) { return &P->t[P->i]; }
static jj_tok *next(parser *P)
{
    jj_tok *k = &P->t[P->i];
    if (P->i + 1 < P->n)
        P->i++;
    return k;
}
static int is_op(const jj_tok *k, const char *op) { return k->t == T_OP && k->n == strlen(op) && !memcmp(k->s, op, k->n); }
static int is_name(const jj_tok *k, const char *nm)
{
    return k->t == T_NAME && k->n == strlen(nm) && !memcmp(k->s, nm, k->n);
}
static void expect_op(parser *P, const char *op)
{
    if (!is_op(cur(P), op))
        perr(P, cur(P), "expected '%s'", op);
    next(P);
}
static const char *name_of(parser *P, jj_tok *k) { return jj_strndup(P->a, k->s, k->n); }
static const char *expect_name(parser *P)
{
    if (cur(P)->t != T_NAME)
        perr(P, cur(P), "expected a name");
    return name_of(P, next(P));
}

static jj_node *node(parser *P, int kind, const jj_tok *at)
{
    jj_node *n = jj_alloc(P->a, sizeof *n);
    n->kind = kind;
    n->line = at->line;
    n->col = at->col;
    return n;
}

typedef struct nlist { jj_node **v; int n, cap; } nlist;
static void nl_push(parser *P, nlist *l, jj_node *x)
{
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 4;
        l->v = jj_grow(P->a, l->v, (size_t)l->cap * sizeof *l->v, (size_t)cap * sizeof *l->v);
        l->cap = cap;
    }
    l->v[l->n++] = x;
}
typedef struct slist { const char **v; int n, cap; } slist;
static void sl_push(parser *P, slist *l, const char *x)
{
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 4;
        l->v = jj_grow(P->a, l->v, (size_t)l->cap * sizeof *l->v, (size_t)cap * sizeof *l->v);
        l->cap = cap;
    }
    l->v[l->n++] = x;
}

static void enter(parser *P)
{
    if (++P->depth > JJ_MAX_NESTING)
        perr(P, cur(P), "nesting too deep");
}

static jj_node *p_expr(parser *P); /* condexpr */
static jj_node *p_or(parser *P);
static jj_node *p_unary(parser *P, int with_filter);
static jj_node *p_primary(parser *P);

static jj_val *lit_val(parser *P, int t)
{
    jj_val *v = jj_alloc(P->a, sizeof *v);
    v->t = t;
    return v;
}

/* Call arguments after "(": positional into args, name=value into kw. */
static void p_args(parser *P, jj_node *n)
{
    nlist args = {0}, kwv = {0};
    slist kw = {0};
    expect_op(P, "(");
    while (!is_op(cur(P), ")")) {
        if (args.n + kwv.n)
            expect_op(P, ",");
        if (is_op(cur(P), ")"))
            break;
        if (cur(P)->t == T_NAME && is_op(&P->t[P->i + 1 < P->n ? P->i + 1 : P->i], "=")) {
            sl_push(P, &kw, expect_name(P));
            next(P);
            nl_push(P, &kwv, p_expr(P));
        } else {
            if (kwv.n)
                perr(P, cur(P), "positional argument after keyword argument");
            nl_push(P, &args, p_expr(P));
        }
    }
    next(P);
    n->list = args.v;
    n->n = args.n;
    n->list2 = kwv.v;
    n->n2 = kwv.n;
    n->names = kw.v;
    n->nnames = kw.n;
}

static jj_node *p_postfix(parser *P, jj_node *x)
{
    for (;;) {
        jj_tok *k = cur(P);
        if (is_op(k, ".")) {
            next(P);
            jj_node *n = node(P, N_ATTR, k);
            n->a = x;
            if (cur(P)->t == T_NAME) {
                n->s = expect_name(P);
            } else if (cur(P)->t == T_INT) {
                n->kind = N_ITEM;
                n->b = node(P, N_LIT, cur(P));
                n->b->lit = lit_val(P, JV_INT);
                n->b->lit->u.i = next(P)->i;
            } else {
                perr(P, cur(P), "expected an attribute name");
            }
            if (n->s)
                n->slen = strlen(n->s);
            x = n;
        } else if (is_op(k, "[")) {
            next(P);
            jj_node *parts[3] = {0, 0, 0};
            int part = 0, sliced = 0;
            while (!is_op(cur(P), "]")) {
                if (is_op(cur(P), ":")) {
                    if (++part > 2)
                        perr(P, cur(P), "too many ':' in a subscript");
                    sliced = 1;
                    next(P);
                } else {
                    if (parts[part])
                        perr(P, cur(P), "expected ']'");
                    parts[part] = p_expr(P);
                }
            }
            next(P);
            if (!sliced && !parts[0])
                perr(P, k, "empty subscript");
            jj_node *n = node(P, sliced ? N_SLICE : N_ITEM, k);
            n->a = x;
            n->b = parts[0];
            n->c = parts[1];
            n->d = parts[2];
            x = n;
        } else if (is_op(k, "(")) {
            jj_node *n = node(P, N_CALL, k);
            n->a = x;
            p_args(P, n);
            x = n;
        } else {
            return x;
        }
    }
}

static const char *dotted_name(parser *P)
{
    const char *nm = expect_name(P);
    while (is_op(cur(P), ".") && P->t[P->i + 1].t == T_NAME) {
        next(P);
        const char *more = expect_name(P);
        size_t a = strlen(nm), b = strlen(more);
        char *s = jj_alloc(P->a, a + b + 2);
        memcpy(s, nm, a);
        s[a] = '.';
        memcpy(s + a + 1, more, b);
        nm = s;
    }
    return nm;
}

static jj_node *p_filters(parser *P, jj_node *x)
{
    for (;;) {
        jj_tok *k = cur(P);
        if (is_op(k, "|")) {
            next(P);
            jj_node *n = node(P, N_FILTER, k);
            n->a = x;
            n->s = dotted_name(P);
            if (is_op(cur(P), "("))
                p_args(P, n);
            x = n;
        } else if (is_name(k, "is")) {
            next(P);
            jj_node *n = node(P, N_TEST, k);
            if (is_name(cur(P), "not")) {
                next(P);
                n->op = 1;
            }
            n->a = x;
            n->s = dotted_name(P);
            jj_tok *c = cur(P);
            if (is_op(c, "(")) {
                p_args(P, n);
            } else if ((c->t == T_NAME || c->t == T_STR || c->t == T_INT || c->t == T_FLOAT || is_op(c, "[") ||
                        is_op(c, "{")) &&
                       !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
                nlist args = {0};
                nl_push(P, &args, p_postfix(P, p_primary(P)));
                n->list = args.v;
                n->n = 1;
            }
            x = n;
        } else if (is_op(k, "(")) {
            jj_node *n = node(P, N_CALL, k);
            n->a = x;
            p_args(P, n);
            x = n;
        } else {
            return x;
        }
    }
}

static jj_node *p_primary(parser *P)
{
    jj_tok *k = cur(P);
    enter(P);
    jj_node *n = NULL;
    if (k->t == T_NAME) {
        next(P);
        n = node(P, N_LIT, k);
        if (is_name(k, "true") || is_name(k, "True") || is_name(k, "false") || is_name(k, "False")) {
            n->lit = lit_val(P, JV_BOOL);
            n->lit->u.b = k->s[0] == 't' || k->s[0] == 'T';
        } else if (is_name(k, "none") || is_name(k, "None")) {
            n->lit = lit_val(P, JV_NONE);
        } else {
            n->kind = N_NAME;
            n->s = name_of(P, k);
            n->slen = k->n;
        }
    } else if (k->t == T_STR) {
        /* adjacent literals concatenate */
        size_t total = 0, j = P->i;
        while (j < P->n && P->t[j].t == T_STR)
            total += P->t[j++].n;
        char *s = jj_alloc(P->a, total + 1);
        total = 0;
        while (cur(P)->t == T_STR) {
            memcpy(s + total, cur(P)->s, cur(P)->n);
            total += next(P)->n;
        }
        n = node(P, N_LIT, k);
        n->lit = lit_val(P, JV_STR);
        n->lit->u.s.p = s;
        n->lit->u.s.n = total;
    } else if (k->t == T_INT || k->t == T_FLOAT) {
        next(P);
        n = node(P, N_LIT, k);
        n->lit = lit_val(P, k->t == T_INT ? JV_INT : JV_FLOAT);
        if (k->t == T_INT)
            n->lit->u.i = k->i;
        else
            n->lit->u.f = k->f;
    } else if (is_op(k, "(")) {
        next(P);
        nlist items = {0};
        int tuple = 0;
        while (!is_op(cur(P), ")")) {
            if (items.n) {
                expect_op(P, ",");
                tuple = 1;
                if (is_op(cur(P), ")"))
                    break;
            }
            nl_push(P, &items, p_expr(P));
        }
        next(P);
        if (items.n == 1 && !tuple) {
            n = items.v[0];
        } else {
            n = node(P, N_TUPLE, k);
            n->list = items.v;
            n->n = items.n;
        }
    } else if (is_op(k, "[")) {
        next(P);
        nlist items = {0};
        while (!is_op(cur(P), "]")) {
            if (items.n) {
                expect_op(P, ",");
                if (is_op(cur(P), "]"))
                    break;
            }
            nl_push(P, &items, p_expr(P));
        }
        next(P);
        n = node(P, N_LIST, k);
        n->list = items.v;
        n->n = items.n;
    } else if (is_op(k, "{")) {
        next(P);
        nlist keys = {0}, vals = {0};
        while (!is_op(cur(P), "}")) {
            if (keys.n) {
                expect_op(P, ",");
                if (is_op(cur(P), "}"))
                    break;
            }
            nl_push(P, &keys, p_expr(P));
            expect_op(P, ":");
            nl_push(P, &vals, p_expr(P));
        }
        next(P);
        n = node(P, N_DICT, k);
        n->list = keys.v;
        n->n = keys.n;
        n->list2 = vals.v;
        n->n2 = vals.n;
    } else {
        perr(P, k, k->t == T_EOF || k->t == T_VEND || k->t == T_BEND ? "expected an expression" : "unexpected '%.*s'",
             (int)(k->n > 40 ? 40 : k->n), k->s ? k->s : "");
    }
    P->depth--;
    return n;
}

static jj_node *p_unary(parser *P, int with_filter)
{
    jj_tok *k = cur(P);
    jj_node *n;
    enter(P);
    if (is_op(k, "-") || is_op(k, "+")) {
        next(P);
        n = node(P, is_op(k, "-") ? N_NEG : N_POS, k);
        n->a = p_unary(P, 0);
    } else {
        n = p_postfix(P, p_primary(P));
    }
    if (with_filter)
        n = p_filters(P, n);
    P->depth--;
    return n;
}

static jj_node *binary(parser *P, int op, jj_tok *at, jj_node *a, jj_node *b)
{
    jj_node *n = node(P, N_BIN, at);
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

static jj_node *p_pow(parser *P)
{
    jj_node *x = p_unary(P, 1);
    while (is_op(cur(P), "**")) {
        jj_tok *k = next(P);
        enter(P);
        x = binary(P, OP_POW, k, x, p_unary(P, 1));
    }
    return x;
}

static jj_node *p_math2(parser *P)
{
    jj_node *x = p_pow(P);
    for (;;) {
        jj_tok *k = cur(P);
        int op = is_op(k, "*") ? OP_MUL : is_op(k, "/") ? OP_DIV : is_op(k, "//") ? OP_FDIV : is_op(k, "%") ? OP_MOD : 0;
        if (!op)
            return x;
        next(P);
        enter(P);
        x = binary(P, op, k, x, p_pow(P));
    }
}

static jj_node *p_concat(parser *P)
{
    jj_node *x = p_math2(P);
    while (is_op(cur(P), "~")) {
        jj_tok *k = next(P);
        enter(P);
        x = binary(P, OP_CAT, k, x, p_math2(P));
    }
    return x;
}

static jj_node *p_math1(parser *P)
{
    jj_node *x = p_concat(P);
    for (;;) {
        jj_tok *k = cur(P);
        int op = is_op(k, "+") ? OP_ADD : is_op(k, "-") ? OP_SUB : 0;
        if (!op)
            return x;
        next(P);
        enter(P);
        x = binary(P, op, k, x, p_concat(P));
    }
}

static jj_node *p_compare(parser *P)
{
    jj_node *x = p_math1(P);
    for (;;) {
        jj_tok *k = cur(P);
        int op = is_op(k, "==") ? OP_EQ : is_op(k, "!=") ? OP_NE : is_op(k, "<") ? OP_LT : is_op(k, "<=") ? OP_LE
               : is_op(k, ">") ? OP_GT : is_op(k, ">=") ? OP_GE : is_name(k, "in") ? OP_IN : 0;
        if (!op && is_name(k, "not") && is_name(&P->t[P->i + 1], "in")) {
            next(P);
            op = OP_NOTIN;
        }
        if (!op)
            return x;
        next(P);
        enter(P);
        x = binary(P, op, k, x, p_math1(P));
    }
}

static jj_node *p_not(parser *P)
{
    jj_tok *k = cur(P);
    if (is_name(k, "not")) {
        next(P);
        enter(P);
        jj_node *n = node(P, N_NOT, k);
        n->a = p_not(P);
        P->depth--;
        return n;
    }
    return p_compare(P);
}

/* A left-associative chain of a keyword operator (and, or) over operands parsed by sub. */
static jj_node *p_keyword_chain(parser *P, const char *op, int kind, jj_node *(*sub)(parser *))
{
    jj_node *x = sub(P);
    while (is_name(cur(P), op)) {
        jj_tok *k = next(P);
        enter(P);
        jj_node *n = node(P, kind, k);
        n->a = x;
        n->b = sub(P);
        x = n;
    }
    return x;
}

static jj_node *p_and(parser *P)
{
    return p_keyword_chain(P, "and", N_AND, p_not);
}

static jj_node *p_or(parser *P)
{
    return p_keyword_chain(P, "or", N_OR, p_and);
}

static jj_node *p_expr(parser *P)
{
    int saved = P->depth;
    enter(P);
    jj_node *x = p_or(P);
    while (is_name(cur(P), "if")) {
        jj_tok *k = next(P);
        enter(P);
        jj_node *n = node(P, N_COND, k);
        n->a = x;
        n->b = p_or(P);
        if (is_name(cur(P), "else")) {
            next(P);
            n->c = p_expr(P);
        }
        x = n;
    }
    P->depth = saved; /* the binary loops above only count up */
    return x;
}

/* ---- statements ---- */

static void expect_bend(parser *P)
{
    if (cur(P)->t != T_BEND)
        perr(P, cur(P), "expected end of block tag");
    next(P);
}

/* Parses statements until a block tag whose name is one of ends (NULL-terminated);
 * leaves the token at that name. ends NULL: until the end of the template. */
static void p_body(parser *P, nlist *out, const char *const *ends);

static const char *const END_IF[] = {"elif", "else", "endif", NULL};
static const char *const END_FOR[] = {"else", "endfor", NULL};
static const char *const END_FOR2[] = {"endfor", NULL};
static const char *const END_MACRO[] = {"endmacro", NULL};

static jj_node *p_if(parser *P, jj_tok *at)
{
    jj_node *n = node(P, N_IF, at);
    n->a = p_expr(P);
    expect_bend(P);
    nlist body = {0}, els = {0};
    p_body(P, &body, END_IF);
    n->list = body.v;
    n->n = body.n;
    jj_tok *k = next(P);
    if (is_name(k, "elif")) {
        nl_push(P, &els, p_if(P, k));
        n->list2 = els.v;
        n->n2 = 1;
        return n; /* the nested if consumed endif */
    }
    if (is_name(k, "else")) {
        expect_bend(P);
        p_body(P, &els, END_IF + 2);
        next(P);
        n->list2 = els.v;
        n->n2 = els.n;
    }
    expect_bend(P);
    return n;
}

static jj_node *p_stmt(parser *P)
{
    jj_tok *k = cur(P);
    if (k->t != T_NAME)
        perr(P, k, "expected a statement name");
    next(P);
    int saved = P->depth;
    enter(P);
    jj_node *n = NULL;
    if (is_name(k, "if")) {
        n = p_if(P, k);
    } else if (is_name(k, "for")) {
        n = node(P, N_FOR, k);
        slist names = {0};
        int paren = is_op(cur(P), "(");
        if (paren)
            next(P);
        do {
            if (names.n)
                next(P);
            sl_push(P, &names, expect_name(P));
        } while (is_op(cur(P), ","));
        if (paren)
            expect_op(P, ")");
        n->names = names.v;
        n->nnames = names.n;
        if (!is_name(cur(P), "in"))
            perr(P, cur(P), "expected 'in'");
        next(P);
        n->a = p_or(P); /* "if" here filters the loop, not a ternary */
        if (is_name(cur(P), "if")) {
            next(P);
            n->b = p_expr(P);
        }
        if (is_name(cur(P), "recursive"))
            perr(P, cur(P), "recursive loops are not supported");
        expect_bend(P);
        nlist body = {0}, els = {0};
        p_body(P, &body, END_FOR);
        if (is_name(next(P), "else")) {
            expect_bend(P);
            p_body(P, &els, END_FOR2);
            next(P);
        }
        expect_bend(P);
        n->list = body.v;
        n->n = body.n;
        n->list2 = els.v;
        n->n2 = els.n;
    } else if (is_name(k, "set")) {
        const char *nm = expect_name(P);
        if (is_op(cur(P), ".")) {
            next(P);
            n = node(P, N_SETATTR, k);
            n->s = nm;
            n->names = jj_alloc(P->a, sizeof *n->names);
            n->names[0] = expect_name(P);
            n->nnames = 1;
        } else {
            n = node(P, N_SET, k);
            slist names = {0};
            sl_push(P, &names, nm);
            while (is_op(cur(P), ",")) {
                next(P);
                sl_push(P, &names, expect_name(P));
            }
            n->names = names.v;
            n->nnames = names.n;
        }
        if (!is_op(cur(P), "="))
            perr(P, cur(P), "expected '=' (block set is not supported)");
        next(P);
        n->a = p_expr(P);
        if (is_op(cur(P), ",")) { /* set a, b = x, y */
            jj_node *t = node(P, N_TUPLE, cur(P));
            nlist items = {0};
            nl_push(P, &items, n->a);
            while (is_op(cur(P), ",")) {
                next(P);
                nl_push(P, &items, p_expr(P));
            }
            t->list = items.v;
            t->n = items.n;
            n->a = t;
        }
        expect_bend(P);
    } else if (is_name(k, "macro")) {
        n = node(P, N_MACRO, k);
        n->s = expect_name(P);
        slist params = {0};
        nlist defs = {0};
        expect_op(P, "(");
        while (!is_op(cur(P), ")")) {
            if (params.n)
                expect_op(P, ",");
            sl_push(P, &params, expect_name(P));
            jj_node *d = NULL;
            if (is_op(cur(P), "=")) {
                next(P);
                d = p_expr(P);
            } else if (defs.n && defs.v[defs.n - 1]) {
                perr(P, cur(P), "non-default argument follows default argument");
            }
            nl_push(P, &defs, d);
        }
        next(P);
        expect_bend(P);
        n->names = params.v;
        n->nnames = params.n;
        n->list2 = defs.v;
        n->n2 = defs.n;
        nlist body = {0};
        p_body(P, &body, END_MACRO);
        next(P);
        if (cur(P)->t == T_NAME)
            next(P); /* {% endmacro name %} */
        expect_bend(P);
        n->list = body.v;
        n->n = body.n;
    } else if (is_name(k, "break") || is_name(k, "continue")) {
        n = node(P, is_name(k, "break") ? N_BREAK : N_CONTINUE, k);
        expect_bend(P);
    } else {
        perr(P, k, "unknown tag '%.*s'", (int)(k->n > 40 ? 40 : k->n), k->s);
    }
    P->depth = saved;
    return n;
}

static void p_body(parser *P, nlist *out, const char *const *ends)
{
    for (;;) {
        jj_tok *k = cur(P);
        if (k->t == T_EOF) {
            if (ends) {
                const char *const *last = ends;
                while (last[1])
                    last++;
                perr(P, k, "unexpected end of template, expected '%s'", *last);
            }
            return;
        } else if (k->t == T_TEXT) {
            jj_node *n = node(P, N_TEXT, k);
            n->s = k->s;
            n->slen = k->n;
            nl_push(P, out, n);
            next(P);
        } else if (k->t == T_VBEGIN) {
            next(P);
            jj_node *n = node(P, N_OUT, k);
            n->a = p_expr(P);
            if (cur(P)->t != T_VEND)
                perr(P, cur(P), "expected end of print statement");
            next(P);
            nl_push(P, out, n);
        } else if (k->t == T_BBEGIN) {
            jj_tok *nm = &P->t[P->i + 1];
            if (ends)
                for (const char *const *e = ends; *e; e++)
                    if (is_name(nm, *e)) {
                        next(P);
                        return;
                    }
            if (nm->t == T_NAME && (is_name(nm, "endif") || is_name(nm, "endfor") || is_name(nm, "endmacro") ||
                                    is_name(nm, "else") || is_name(nm, "elif")))
                perr(P, nm, "unexpected '%.*s'", (int)nm->n, nm->s);
            next(P);
            nl_push(P, out, p_stmt(P));
        } else {
            perr(P, k, "unexpected token");
        }
    }
}

/* The part of a parse that can longjmp back (through perr or the arena). */
static int parse_into(jinja_template *t, const char *src, size_t len, char *err, size_t err_size)
{
    parser P;
    memset(&P, 0, sizeof P);
    P.a = &t->arena;
    P.err = err;
    P.err_size = err_size;
    t->arena.fail = &P.jb;
    t->arena.err = err;
    t->arena.err_size = err_size;
    t->arena.oom = "line 1, column 1: out of memory";
    t->arena.cap = 64u << 20;
    if (setjmp(P.jb))
        return -1;
    jj_toks toks = {0};
    if (jj_lex(&t->arena, src, len, &toks, err, err_size))
        return -1;
    P.t = toks.v;
    P.n = toks.n;
    nlist body = {0};
    p_body(&P, &body, NULL);
    t->body = body.v;
    t->n = body.n;
    t->arena.fail = NULL;
    return 0;
}

jinja_template *jinja_parse(const char *src, size_t len, char *err, size_t err_size)
{
    char dummy[1];
    if (!err || !err_size) {
        err = dummy;
        err_size = sizeof dummy;
    }
    err[0] = 0;
    jinja_template *t = calloc(1, sizeof *t);
    if (!t) {
        snprintf(err, err_size, "line 1, column 1: out of memory");
        return NULL;
    }
    if (parse_into(t, src ? src : "", src ? len : 0, err, err_size)) {
        jj_arena_free(&t->arena);
        free(t);
        return NULL;
    }
    return t;
}

void jinja_free(jinja_template *t)
{
    if (!t)
        return;
    jj_arena_free(&t->arena);
    free(t);
}
