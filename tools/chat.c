/*
 * chat.c: the tools' chat commands (chat.h): messages files rendered with
 * the model's chat template, and infer --chat, a conversation that keeps
 * its KV cache from turn to turn. A thin client of include/engine.h.
 */
#define _POSIX_C_SOURCE 200809L /* sigaction, PATH_MAX under -std=c11 */

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chat.h"
#include "cli_util.h"

/* The template text of template_path (NULL: none) into *src; 0, or 1 after printing why. */
static int read_template(const char *prog, const char *template_path, char **src)
{
    size_t n;
    *src = NULL;
    if (!template_path)
        return 0;
    if (!(*src = cli_read_file(template_path, &n))) {
        fprintf(stderr, "%s: %s: cannot read: %s\n", prog, template_path, strerror(errno));
        return 1;
    }
    return 0;
}

static void render_error(const char *prog, const engine_tokenizer *tok, engine_status st)
{
    fprintf(stderr, "%s: %s%s\n", prog, engine_tokenizer_last_error(tok),
            st == ENGINE_ERR_UNSUPPORTED ? " (give one with --chat-template FILE)" : "");
}

/* Render with params into a malloc'd buffer sized by asking first. */
static char *render(const char *prog, const engine_tokenizer *tok, const char *json, size_t json_len,
                    const engine_chat_message *msgs, size_t n_msgs, const engine_chat_params *p, size_t *len)
{
    size_t need = 0;
    engine_status st = json ? engine_chat_render_json(tok, json, json_len, p, NULL, 0, &need)
                            : engine_chat_render(tok, msgs, n_msgs, p, NULL, 0, &need);
    if (st != ENGINE_OK && st != ENGINE_ERR_BUFFER_TOO_SMALL) {
        render_error(prog, tok, st);
        return NULL;
    }
    char *buf = malloc(need + 1);
    if (!buf) {
        fprintf(stderr, "%s: out of memory\n", prog);
        return NULL;
    }
    st = json ? engine_chat_render_json(tok, json, json_len, p, buf, need + 1, len)
              : engine_chat_render(tok, msgs, n_msgs, p, buf, need + 1, len);
    if (st != ENGINE_OK) {
        render_error(prog, tok, st);
        free(buf);
        return NULL;
    }
    return buf;
}

char *chat_render_file(const char *prog, const engine_tokenizer *tok, const char *path, const char *template_path,
                       int add_generation_prompt, size_t *len)
{
    size_t json_len = 0;
    char *json = cli_read_file(path, &json_len), *tpl = NULL, *out = NULL;
    if (!json) {
        fprintf(stderr, "%s: %s: cannot read: %s\n", prog, path, strerror(errno));
        return NULL;
    }
    if (read_template(prog, template_path, &tpl) == 0) {
        engine_chat_params p = engine_chat_default_params();
        p.add_generation_prompt = add_generation_prompt;
        p.template_source = tpl;
        p.template_name = template_path;
        p.messages_name = path;
        out = render(prog, tok, json, json_len, NULL, 0, &p, len);
    }
    free(tpl);
    free(json);
    return out;
}

/* text as a chat prompt into a malloc'd array. */
static int prompt_ids(const char *prog, const engine_tokenizer *tok, const char *text, size_t len, int32_t **ids,
                      size_t *n)
{
    size_t cap = len + 8;
    *ids = NULL;
    for (int attempt = 0; attempt < 2; attempt++) {
        int32_t *g = realloc(*ids, cap * sizeof *g);
        if (!g)
            break;
        *ids = g;
        engine_status st = engine_chat_tokenize(tok, text, len, g, cap, n);
        if (st == ENGINE_OK)
            return 0;
        if (st != ENGINE_ERR_BUFFER_TOO_SMALL) {
            fprintf(stderr, "%s: tokenize: %s\n", prog, engine_tokenizer_last_error(tok));
            free(*ids);
            *ids = NULL;
            return 1;
        }
        cap = *n;
    }
    fprintf(stderr, "%s: out of memory\n", prog);
    free(*ids);
    *ids = NULL;
    return 1;
}

int chat_prompt_ids(const char *prog, const engine_tokenizer *tok, const char *path, const char *template_path,
                    int add_generation_prompt, int32_t **ids, size_t *n_ids)
{
    size_t len = 0;
    char *text = chat_render_file(prog, tok, path, template_path, add_generation_prompt, &len);
    *ids = NULL;
    *n_ids = 0;
    if (!text)
        return 1;
    const int rc = prompt_ids(prog, tok, text, len, ids, n_ids);
    free(text);
    return rc;
}

/* ------------------------------------------------------------ infer --chat */

static volatile sig_atomic_t chat_interrupted;

static void on_sigint(int sig)
{
    (void)sig;
    chat_interrupted = 1;
}

typedef struct conversation {
    engine_chat_message *m; /* role and content strings malloc'd */
    size_t n, cap;
} conversation;

static int conv_add(conversation *c, const char *role, const char *content, size_t len)
{
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 16;
        engine_chat_message *g = realloc(c->m, cap * sizeof *g);
        if (!g)
            return 1;
        c->m = g;
        c->cap = cap;
    }
    char *r = malloc(strlen(role) + 1), *t = malloc(len + 1);
    if (!r || !t) {
        free(r);
        free(t);
        return 1;
    }
    memcpy(r, role, strlen(role) + 1);
    memcpy(t, content, len);
    t[len] = '\0';
    c->m[c->n++] = (engine_chat_message){r, t};
    return 0;
}

static void conv_truncate(conversation *c, size_t n)
{
    while (c->n > n) {
        c->n--;
        free((char *)c->m[c->n].role);
        free((char *)c->m[c->n].content);
    }
}

typedef struct reply {
    char *text;
    size_t len, cap;
    int oom;
} reply;

static int on_reply_token(int32_t id, const char *text, size_t len, void *user)
{
    (void)id;
    reply *r = user;
    if (len) {
        fwrite(text, 1, len, stdout);
        fflush(stdout);
        if (r->len + len + 1 > r->cap) {
            size_t cap = r->cap * 2 + len + 256;
            char *g = realloc(r->text, cap);
            if (!g) {
                r->oom = 1;
                return 1;
            }
            r->text = g;
            r->cap = cap;
        }
        memcpy(r->text + r->len, text, len);
        r->len += len;
    }
    return chat_interrupted ? 1 : 0;
}

static const char *stop_word(engine_stop_reason r)
{
    switch (r) {
    case ENGINE_STOP_EOS: return "end of turn";
    case ENGINE_STOP_LENGTH: return "length, raise -n";
    case ENGINE_STOP_CALLBACK: return "interrupted";
    case ENGINE_STOP_CONTEXT: return "context full";
    }
    return "?";
}

/* One turn: the conversation rendered and tokenized, the cache reused, the reply generated. */
static int chat_turn(engine_session *s, const engine_tokenizer *tok, conversation *c, const engine_chat_params *p,
                     const engine_generate_params *gp, int max_ctx)
{
    size_t len = 0, n = 0, reused = 0;
    char *text = render("infer", tok, NULL, 0, c->m, c->n, p, &len);
    int32_t *ids = NULL;
    if (!text || prompt_ids("infer", tok, text, len, &ids, &n)) {
        free(text);
        return 1;
    }
    free(text);
    const int n_ctx = engine_session_n_ctx(s);
    if (n + 1 > (size_t)n_ctx) {
        size_t want = n + (size_t)gp->n_predict;
        fprintf(stderr, "infer: the conversation is %zu tokens and the context holds %d: /reset to start over, "
                        "or run with --ctx %zu%s\n", n, n_ctx, want,
                want > (size_t)max_ctx ? " (beyond the model's maximum)" : "");
        free(ids);
        conv_truncate(c, c->n - 1);
        return 0;
    }
    engine_session_reuse(s, ids, n, &reused);
    reply r = {0};
    engine_generate_params g = *gp;
    g.on_token = on_reply_token;
    g.user = &r;
    engine_generate_stats stats;
    chat_interrupted = 0;
    engine_status st = engine_generate(s, ids + reused, n - reused, &g, NULL, 0, NULL, &stats);
    free(ids);
    fputc('\n', stdout);
    fflush(stdout);
    if (st != ENGINE_OK || r.oom) {
        fprintf(stderr, "infer: generate: %s\n", r.oom ? "out of memory" : engine_session_last_error(s));
        free(r.text);
        return 1;
    }
    const double gps = stats.gen_seconds > 0 && stats.n_generated > 1 ? (stats.n_generated - 1) / stats.gen_seconds
                                                                        : 0.0;
    fprintf(stderr, "[prompt %zu tokens: %zu reused from the cache, %zu evaluated | reply %zu tokens at %.1f tok/s "
                    "(stop: %s)]\n", n, reused, n - reused, stats.n_generated, gps, stop_word(stats.stop));
    if (stats.stop == ENGINE_STOP_CONTEXT)
        fprintf(stderr, "infer: the context (%d tokens) is full: /reset to start over, or run with --ctx %d\n", n_ctx,
                n_ctx + gp->n_predict);
    const int rc = conv_add(c, "assistant", r.text ? r.text : "", r.len);
    free(r.text);
    chat_interrupted = 0;
    return rc;
}

int chat_interactive(engine_model *model, engine_session *s, const engine_generate_params *gp, const char *system,
                     const char *template_path)
{
    const engine_tokenizer *tok = engine_model_tokenizer(model);
    if (!tok) {
        fprintf(stderr, "infer: the model has no tokenizer.json: --chat needs one\n");
        return 1;
    }
    engine_model_info info;
    engine_model_get_info(model, &info);
    engine_chat_params p = engine_chat_default_params();
    char *tpl = NULL;
    if (read_template("infer", template_path, &tpl))
        return 1;
    p.template_source = tpl;
    p.template_name = template_path;
    if (!tpl && !engine_tokenizer_has_chat_template(tok)) { /* say so before the first turn */
        engine_status st = engine_chat_render(tok, NULL, 0, &p, NULL, 0, NULL);
        render_error("infer", tok, st);
        return 1;
    }
    /* No SA_RESTART: Ctrl-C at the prompt interrupts the read, which then starts again. */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    conversation c = {0};
    int rc = 0;
    const size_t first = system ? 1 : 0;
    if (system && conv_add(&c, "system", system, strlen(system)))
        rc = 1;
    const int tty = isatty(STDIN_FILENO);
    char line[65536];
    while (rc == 0) {
        if (tty) {
            fputs("> ", stdout);
            fflush(stdout);
        }
        if (!fgets(line, sizeof line, stdin)) {
            if (ferror(stdin) && errno == EINTR) {
                clearerr(stdin);
                chat_interrupted = 0;
                fputc('\n', stdout);
                continue;
            }
            break;
        }
        size_t len = strlen(line);
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = '\0';
        if (!strcmp(line, "/exit"))
            break;
        if (!strcmp(line, "/reset")) {
            conv_truncate(&c, first);
            engine_session_reset(s);
            fprintf(stderr, "[conversation reset]\n");
            continue;
        }
        if (len == 0)
            continue;
        if (conv_add(&c, "user", line, len)) {
            fprintf(stderr, "infer: out of memory\n");
            rc = 1;
            break;
        }
        rc = chat_turn(s, tok, &c, &p, gp, info.max_context);
    }
    conv_truncate(&c, 0);
    free(c.m);
    free(tpl);
    return rc;
}
