/*
 * jinja.h: a sandboxed Jinja2 subset for Hugging Face chat templates.
 * It renders what transformers' render_jinja_template renders (trim_blocks,
 * lstrip_blocks, loop controls, tojson without ASCII escaping,
 * raise_exception, strftime_now) and nothing beyond it: no file access, no
 * Python objects, bounded time, depth and output.
 */
#ifndef JINJA_H
#define JINJA_H

#include <stddef.h>
#include <time.h>

#include <jansson.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct jinja_limits {
    size_t max_output; /* bytes of output; 0 = 1 MiB */
    int max_depth;     /* nesting of calls/includes/expressions; 0 = 64 */
    long max_steps;    /* loop iterations + calls + output writes; 0 = 10,000,000 */
    time_t now;        /* strftime_now's time; 0 = the current time */
} jinja_limits;

typedef struct jinja_template jinja_template;

/* Parses src[len]. NULL on a syntax error, with "line L, column C: message" in err. */
jinja_template *jinja_parse(const char *src, size_t len, char *err, size_t err_size);
void jinja_free(jinja_template *t); /* NULL is a no-op */
/* Renders t with the variables of ctx (a JSON object: messages, add_generation_prompt, bos_token, eos_token,
 * tools, and any others). 0 with *out malloc'd (NUL-terminated, *out_len bytes, the caller frees), or -1 with
 * one line in err: "line L: raise_exception: MSG", an undefined value used where Jinja fails, a limit exceeded.
 * lim may be NULL (all defaults). Macro calls nest at most max_depth deep; blocks and expressions at most
 * 16 * max_depth deep in all. */
int jinja_render(const jinja_template *t, const json_t *ctx, const jinja_limits *lim, char **out, size_t *out_len,
                 char *err, size_t err_size);

#ifdef __cplusplus
}
#endif

#endif
