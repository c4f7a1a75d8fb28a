/*
 * jj.h: the Jinja interpreter's internals, shared by lex.c, parse.c,
 * value.c, eval.c and filters.c. Every allocation comes from an arena (the
 * template's for the syntax tree, the render's for values), so an error can
 * leave through longjmp from any depth without leaking.
 */
#ifndef JJ_H
#define JJ_H

#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "jinja/jinja.h"

/* ---- arena ---- */
typedef struct jj_block jj_block;
typedef struct jj_arena {
    jj_block *head;
    size_t used, cap; /* bytes handed out in all; cap 0 = unbounded */
    jmp_buf *fail;    /* where running out of memory (or over cap) jumps */
    char *err;
    size_t err_size;
    const char *oom; /* the message written to err then */
} jj_arena;
void *jj_alloc(jj_arena *a, size_t n); /* zeroed; never NULL (jumps) */
void *jj_grow(jj_arena *a, void *p, size_t old, size_t n);
char *jj_strndup(jj_arena *a, const char *s, size_t n);
void jj_arena_free(jj_arena *a);

/* ---- values ---- */
enum {
    JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_TUPLE, JV_DICT, JV_NS, JV_MACRO, JV_FUNC,
    JV_METHOD
};
typedef struct jj_val jj_val;
typedef struct jj_node jj_node;
struct jj_val {
    int t;
    union {
        int b;
        long long i;
        double f;
        struct { const char *p; size_t n; } s;                      /* UTF-8, not NUL-terminated */
        struct { jj_val **v; size_t n, cap; } l;                     /* list, tuple */
        struct { jj_val **k, **v; size_t n, cap; } d;                /* dict, namespace: insertion order */
        struct { const jj_node *def; void *scope; } m;               /* macro and the scope it closes over */
        struct { const char *name; jj_val *self; } fn;               /* global function, bound method */
    } u;
    const char *uname; /* JV_UNDEF: the missing name, for messages */
};

typedef struct jj_buf { char *p; size_t n, cap; } jj_buf;

/* ---- syntax tree ---- */
enum {
    /* statements */
    N_TEXT, N_OUT, N_IF, N_FOR, N_SET, N_SETATTR, N_MACRO, N_BREAK, N_CONTINUE,
    /* expressions */
    N_LIT, N_NAME, N_ATTR, N_ITEM, N_SLICE, N_CALL, N_FILTER, N_TEST, N_BIN, N_NEG, N_POS, N_NOT, N_AND, N_OR,
    N_COND, N_LIST, N_TUPLE, N_DICT
};
struct jj_node {
    int kind, op, line, col;
    jj_node *a, *b, *c, *d;
    jj_node **list; int n;   /* body, args, items, dict keys */
    jj_node **list2; int n2; /* else body, kwarg values, dict values, macro defaults */
    const char **names; int nnames; /* loop targets, kwarg names, macro params */
    const char *s; size_t slen;     /* name, attribute, filter/test name, text */
    jj_val *lit;
};
/* binary operators (N_BIN op) */
enum { OP_ADD = 1, OP_SUB, OP_MUL, OP_DIV, OP_FDIV, OP_MOD, OP_POW, OP_CAT, OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE,
       OP_IN, OP_NOTIN };

/* ---- tokens ---- */
enum { T_EOF, T_TEXT, T_VBEGIN, T_VEND, T_BBEGIN, T_BEND, T_NAME, T_STR, T_INT, T_FLOAT, T_OP };
typedef struct jj_tok {
    int t, line, col;
    const char *s; size_t n; /* text, name, operator, decoded string */
    long long i;
    double f;
} jj_tok;
typedef struct jj_toks { jj_tok *v; size_t n, cap; } jj_toks;

struct jinja_template {
    jj_arena arena;
    jj_node **body;
    int n;
};

/* lex.c: the whole template as tokens (text with whitespace control applied). 0, or -1 with err set. */
int jj_lex(jj_arena *a, const char *src, size_t len, jj_toks *out, char *err, size_t err_size);

/* ---- rendering ---- */
typedef struct jj_scope jj_scope;
struct jj_scope {
    jj_scope *parent;
    const char **k;
    jj_val **v;
    size_t n, cap;
};
typedef struct jj_ctx {
    jj_arena arena, *a;
    jmp_buf jb;
    char *err;
    size_t err_size;
    jj_buf out;
    size_t max_output;
    int max_depth, depth, calls;
    long steps, max_steps;
    time_t now;
    int line; /* of the node being run, for messages */
} jj_ctx;

_Noreturn void jj_fail(jj_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void jj_step(jj_ctx *c);

/* value.c */
extern jj_val jj_undef_v, jj_none_v, jj_true_v, jj_false_v;
jj_val *jj_undef(jj_ctx *c, const char *name);
jj_val *jj_bool(int b);
jj_val *jj_int(jj_ctx *c, long long i);
jj_val *jj_float(jj_ctx *c, double f);
jj_val *jj_str(jj_ctx *c, const char *p, size_t n);   /* copies */
jj_val *jj_strz(jj_ctx *c, const char *p);
jj_val *jj_list(jj_ctx *c, int t);
void jj_list_push(jj_ctx *c, jj_val *l, jj_val *v);
jj_val *jj_dict(jj_ctx *c, int t);
void jj_dict_set(jj_ctx *c, jj_val *d, jj_val *k, jj_val *v);
jj_val *jj_dict_get(const jj_val *d, const char *k, size_t n); /* NULL when absent */
jj_val *jj_from_json(jj_ctx *c, const json_t *j);
int jj_truthy(const jj_val *v);
int jj_eq(const jj_val *a, const jj_val *b);
size_t jj_utf8_len(const char *p, size_t n);
void jj_buf_add(jj_ctx *c, jj_buf *b, const char *p, size_t n);
void jj_buf_addz(jj_ctx *c, jj_buf *b, const char *p);
void jj_str_of(jj_ctx *c, jj_buf *b, const jj_val *v);          /* Python str() */
void jj_repr(jj_ctx *c, jj_buf *b, const jj_val *v);            /* Python repr() */
void jj_fmt_float(char *dst, size_t size, double f);            /* Python repr of a float */
jj_val *jj_to_str(jj_ctx *c, const jj_val *v);
const char *jj_type_name(const jj_val *v);
/* v as an integer (a bool counts; NULL or none: dflt); anything else fails the render. */
long long jj_int_arg(jj_ctx *c, jj_val *v, long long dflt);
/* json.dumps(v, ensure_ascii, indent (<0: none), separators, sort_keys) */
void jj_tojson(jj_ctx *c, jj_buf *b, const jj_val *v, int ascii, int indent, const char *item_sep,
               const char *key_sep, int sort_keys, int level);

/* eval.c */
jj_scope *jj_scope_new(jj_ctx *c, jj_scope *parent);
void jj_scope_set(jj_ctx *c, jj_scope *s, const char *k, jj_val *v);
jj_val *jj_lookup(jj_ctx *c, jj_scope *s, const char *k); /* an undefined value when absent */
/* render.c: runs body[nb] into out; ctl becomes 1 on break, 2 on continue */
void jj_exec_body(jj_ctx *c, jj_scope *s, jj_node **body, int nb, jj_buf *out, int *ctl);
jj_val *jj_eval(jj_ctx *c, jj_scope *s, const jj_node *n);
jj_val *jj_call_value(jj_ctx *c, jj_val *f, jj_val **args, int nargs, const char **kw, jj_val **kwv, int nkw);
jj_val *jj_getattr(jj_ctx *c, jj_val *obj, const char *name, size_t n);
jj_val *jj_getitem(jj_ctx *c, jj_val *obj, jj_val *key);
jj_val *jj_iter_list(jj_ctx *c, jj_val *v); /* a list of what iterating v yields */

/* filters.c, methods.c */
jj_val *jj_filter(jj_ctx *c, const char *name, jj_val *v, jj_val **args, int nargs, const char **kw, jj_val **kwv,
                  int nkw);
int jj_test(jj_ctx *c, const char *name, jj_val *v, jj_val **args, int nargs);
jj_val *jj_method(jj_ctx *c, jj_val *self, const char *name, jj_val **args, int nargs, const char **kw,
                  jj_val **kwv, int nkw);
int jj_has_method(const jj_val *self, const char *name, size_t n);
jj_val *jj_strip(jj_ctx *c, jj_val *s, jj_val *chars, int which);  /* 1 left, 2 right, 3 both */
jj_val *jj_recase(jj_ctx *c, jj_val *s, int mode);                 /* 0 lower, 1 upper, 2 capitalize, 3 title */
jj_val *jj_replace(jj_ctx *c, jj_val *s, jj_val *old, jj_val *new_, long long count);

#endif
