/*
 * chat.c: chat templates: finding a tokenizer's template and token strings
 * (chat.h), rendering a conversation with them through the Jinja
 * interpreter (jinja/), tokenizing the rendered prompt, and letting a
 * session keep the part of its cache a new prompt shares with it.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../jinja/jinja.h"
#include "chat.h"
#include "model.h"

/* ------------------------------------------------------- the source */

static char *dup_str(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

static char *read_text(const char *path, err_buf *e, engine_status *st)
{
    *st = ENGINE_OK;
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errno != ENOENT)
            *st = err_set(e, ENGINE_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    size_t n = 0, cap = 4096;
    char *buf = malloc(cap);
    for (size_t got; buf && (got = fread(buf + n, 1, cap - n - 1, f)) > 0;) {
        n += got;
        if (cap - n < 2) {
            char *g = realloc(buf, cap * 2);
            if (!g) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = g;
            cap *= 2;
        }
    }
    const int bad = ferror(f);
    fclose(f);
    if (!buf) {
        *st = err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
        return NULL;
    }
    if (bad) {
        free(buf);
        *st = err_set(e, ENGINE_ERR_IO, "%s: read error", path);
        return NULL;
    }
    buf[n] = '\0';
    return buf;
}

void chat_source_free(chat_source *c)
{
    if (!c)
        return;
    free(c->dflt);
    free(c->tool_use);
    free(c->origin);
    free(c->missing);
    json_decref(c->tokens);
    free(c);
}

/* The config's special-token strings: every "*_token" key holding a string
 * or an object with a "content" string (AddedToken as saved). */
static int collect_tokens(json_t *cfg, json_t *tokens)
{
    const char *key;
    json_t *v;
    json_object_foreach(cfg, key, v)
    {
        size_t n = strlen(key);
        if (n < 6 || strcmp(key + n - 6, "_token") != 0)
            continue;
        if (json_is_object(v))
            v = json_object_get(v, "content");
        if (json_is_string(v) && json_object_set(tokens, key, v))
            return -1;
    }
    return 0;
}

/* chat_template as a list of {"name", "template"}. */
static engine_status named_templates(chat_source *c, json_t *list, const char *cfg_path, err_buf *e)
{
    size_t i;
    json_t *x;
    json_array_foreach(list, i, x)
    {
        const char *name = json_string_value(json_object_get(x, "name"));
        const char *text = json_string_value(json_object_get(x, "template"));
        if (!name || !text)
            return err_set(e, ENGINE_ERR_FORMAT, "%s: chat_template[%zu] is not a {\"name\", \"template\"} object",
                           cfg_path, i);
        char **dst = !strcmp(name, "default") ? &c->dflt : !strcmp(name, "tool_use") ? &c->tool_use : NULL;
        if (dst && !*dst && !(*dst = dup_str(text)))
            return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "%s: out of memory", cfg_path);
    }
    return ENGINE_OK;
}

engine_status chat_source_load(const char *dir, const char *config_path, chat_source **out, err_buf *e)
{
    *out = NULL;
    chat_source *c = calloc(1, sizeof *c);
    char origin[4200];
    json_t *cfg = NULL;
    engine_status st = ENGINE_OK;
    if (!c || !(c->tokens = json_object()))
        goto oom;
    if (config_path) {
        json_error_t je;
        cfg = json_load_file(config_path, JSON_DECODE_INT_AS_REAL, &je);
        /* tok_parse_config has reported a malformed file already. */
        if (json_is_object(cfg)) {
            if (collect_tokens(cfg, c->tokens))
                goto oom;
            json_t *ct = json_object_get(cfg, "chat_template");
            snprintf(origin, sizeof origin, "%s (chat_template)", config_path);
            if (json_is_string(ct)) {
                if (!(c->dflt = dup_str(json_string_value(ct))))
                    goto oom;
            } else if (json_is_array(ct) && (st = named_templates(c, ct, config_path, e)) != ENGINE_OK) {
                goto fail;
            }
        }
    }
    if (!c->dflt && !c->tool_use) {
        snprintf(origin, sizeof origin, "%s/chat_template.jinja", dir);
        c->dflt = read_text(origin, e, &st);
        if (st != ENGINE_OK)
            goto fail;
    }
    if (!c->dflt && !c->tool_use) {
        char why[4400];
        if (config_path)
            snprintf(why, sizeof why, "%s has no chat_template and there is no %s/chat_template.jinja", config_path,
                     dir);
        else
            snprintf(why, sizeof why, "%s has no tokenizer_config.json with a chat_template, nor chat_template.jinja",
                     dir);
        if (!(c->missing = dup_str(why)))
            goto oom;
    } else if (!(c->origin = dup_str(origin))) {
        goto oom;
    }
    json_decref(cfg);
    *out = c;
    return ENGINE_OK;
oom:
    st = err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "%s: out of memory", config_path ? config_path : dir);
fail:
    json_decref(cfg);
    chat_source_free(c);
    return st;
}

/* End-of-turn markers by name, as the chat formats of the major model
 * families spell them (llama.cpp's end-of-generation list). */
static const char *const eot_names[] = {
    "<|im_end|>",    "<|eot_id|>",      "<|eom_id|>",            "<|end|>",    "<end_of_turn>",
    "<|endoftext|>", "<|end_of_text|>", "<|END_OF_TURN_TOKEN|>", "<|return|>", "<EOT>",
    "<end_of_utterance>",
    "<\xef\xbd\x9c\x65nd\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>", /* DeepSeek's <｜end▁of▁sentence｜> */
};

int chat_end_of_turn_ids(const chat_source *c, const tok_tokenizer *tok, int32_t *ids, int cap)
{
    int n = 0;
    if (!c || !tok)
        return 0;
    for (size_t i = 0; i < sizeof eot_names / sizeof *eot_names; i++) {
        const char *s = eot_names[i];
        if (!(c->dflt && strstr(c->dflt, s)) && !(c->tool_use && strstr(c->tool_use, s)))
            continue;
        int32_t *enc = NULL;
        size_t k = 0;
        if (tok_encode(tok, s, strlen(s), false, &enc, &k, NULL) == ENGINE_OK && k == 1 &&
            tok_is_special(tok, enc[0])) {
            if (n < cap)
                ids[n] = enc[0];
            n++;
        }
        free(enc);
    }
    return n;
}

/* ------------------------------------------------------------ rendering */

engine_chat_params engine_chat_default_params(void)
{
    engine_chat_params p;
    memset(&p, 0, sizeof p);
    p.add_generation_prompt = 1;
    return p;
}

/* Each message an object with a string role and a content (which a message
 * carrying tool_calls may leave out). */
static engine_status check_messages(json_t *msgs, const char *name, err_buf *e)
{
    if (!json_is_array(msgs))
        return err_set(e, ENGINE_ERR_FORMAT, "%s: \"messages\" must be a list of {\"role\", \"content\"} objects",
                       name);
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m)
    {
        if (!json_is_object(m))
            return err_set(e, ENGINE_ERR_FORMAT, "%s: messages[%zu] is not an object", name, i);
        if (!json_is_string(json_object_get(m, "role")))
            return err_set(e, ENGINE_ERR_FORMAT, "%s: messages[%zu] has no \"role\" string", name, i);
        if (!json_object_get(m, "content") && !json_object_get(m, "tool_calls"))
            return err_set(e, ENGINE_ERR_FORMAT, "%s: messages[%zu] has no \"content\"", name, i);
    }
    return ENGINE_OK;
}

static engine_status copy_out(err_buf *e, const char *text, size_t n, char *buf, size_t cap, size_t *len)
{
    if (len)
        *len = n;
    if (!buf || n + 1 > cap) {
        if (buf && cap)
            buf[0] = '\0';
        return err_set(e, ENGINE_ERR_BUFFER_TOO_SMALL, "the rendered prompt of %zu bytes does not fit in a buffer of %zu",
                       n, cap);
    }
    memcpy(buf, text, n);
    buf[n] = '\0';
    return ENGINE_OK;
}

/*
 * Render msgs (taken over) with variables from p->variables_json and then
 * file_vars (borrowed, may be NULL) into buf.
 */
static engine_status render(const engine_tokenizer *tok, err_buf *e, json_t *msgs, json_t *file_vars,
                            const engine_chat_params *p, char *buf, size_t cap, size_t *len)
{
    const chat_source *c = tok->chat;
    json_t *ctx = json_object(), *vars = NULL;
    jinja_template *t = NULL;
    char *out = NULL, msg[512];
    size_t out_len = 0;
    engine_status st = ENGINE_OK;
    if (!ctx || (c && json_object_update(ctx, c->tokens))) {
        st = err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "chat: out of memory");
        goto done;
    }
    if (p->variables_json) {
        json_error_t je;
        vars = json_loads(p->variables_json, 0, &je);
        if (!json_is_object(vars)) {
            st = err_set(e, ENGINE_ERR_INVALID_ARG, "variables_json: line %d, column %d: %s", je.line, je.column,
                         vars ? "not a JSON object" : je.text);
            goto done;
        }
        json_object_update(ctx, vars);
    }
    if (file_vars)
        json_object_update(ctx, file_vars);
    json_t *tools = json_object_get(ctx, "tools");
    const char *src, *origin;
    if (p->template_source) {
        src = p->template_source;
        origin = p->template_name ? p->template_name : "template";
    } else if (!c || (!c->dflt && !c->tool_use)) {
        st = err_set(e, ENGINE_ERR_UNSUPPORTED, "%s", c && c->missing ? c->missing : "the tokenizer has no chat template");
        goto done;
    } else {
        src = tools && !json_is_null(tools) && c->tool_use ? c->tool_use : c->dflt;
        origin = c->origin;
        if (!src) {
            st = err_set(e, ENGINE_ERR_UNSUPPORTED,
                         "%s: no \"default\" template (its \"tool_use\" one needs tools in the variables)", origin);
            goto done;
        }
    }
    json_object_set(ctx, "messages", msgs);
    json_object_set_new(ctx, "add_generation_prompt", json_boolean(p->add_generation_prompt));
    if (!(t = jinja_parse(src, strlen(src), msg, sizeof msg))) {
        st = err_set(e, ENGINE_ERR_FORMAT, "%s: %s", origin, msg);
        goto done;
    }
    if (jinja_render(t, ctx, NULL, &out, &out_len, msg, sizeof msg) != 0) {
        st = err_set(e, ENGINE_ERR_FORMAT, "%s: %s", origin, msg);
        goto done;
    }
    st = copy_out(e, out, out_len, buf, cap, len);
done:
    free(out);
    jinja_free(t);
    json_decref(vars);
    json_decref(ctx);
    json_decref(msgs);
    return st;
}

/* The handles are const in the API; the error slot is the one field written. */
static err_buf *tok_err(const engine_tokenizer *t)
{
    return (err_buf *)&t->err;
}

engine_status engine_chat_render(const engine_tokenizer *tok, const engine_chat_message *msgs, size_t n,
                                 const engine_chat_params *params, char *buf, size_t cap, size_t *len)
{
    if (len)
        *len = 0;
    if (!tok)
        return ENGINE_ERR_INVALID_ARG;
    err_buf *e = tok_err(tok);
    err_clear(e);
    if (!msgs && n)
        return err_set(e, ENGINE_ERR_INVALID_ARG, "engine_chat_render: msgs is NULL");
    const engine_chat_params p = params ? *params : engine_chat_default_params();
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < n; i++) {
        if (!msgs[i].role || !msgs[i].content) {
            json_decref(arr);
            return err_set(e, ENGINE_ERR_INVALID_ARG, "messages[%zu]: role and content must not be NULL", i);
        }
        json_t *m = json_pack("{s:s, s:s}", "role", msgs[i].role, "content", msgs[i].content);
        if (!m || json_array_append_new(arr, m)) {
            json_decref(arr);
            arr = NULL;
        }
    }
    if (!arr)
        return err_set(e, ENGINE_ERR_INVALID_ARG, "messages: out of memory, or text that is not UTF-8");
    return render(tok, e, arr, NULL, &p, buf, cap, len);
}

engine_status engine_chat_render_json(const engine_tokenizer *tok, const char *json, size_t json_len,
                                      const engine_chat_params *params, char *buf, size_t cap, size_t *len)
{
    if (len)
        *len = 0;
    if (!tok)
        return ENGINE_ERR_INVALID_ARG;
    err_buf *e = tok_err(tok);
    err_clear(e);
    const engine_chat_params p = params ? *params : engine_chat_default_params();
    const char *name = p.messages_name ? p.messages_name : "messages";
    if (!json)
        return err_set(e, ENGINE_ERR_INVALID_ARG, "%s: no JSON given", name);
    json_error_t je;
    json_t *root = json_loadb(json, json_len, 0, &je);
    if (!root)
        return err_set(e, ENGINE_ERR_FORMAT, "%s: line %d, column %d: %s", name, je.line, je.column, je.text);
    json_t *msgs = json_is_array(root) ? root : json_object_get(root, "messages");
    json_t *vars = json_is_object(root) ? json_object_get(root, "variables") : NULL;
    engine_status st = ENGINE_OK;
    if (!json_is_array(root) && !json_is_object(root))
        st = err_set(e, ENGINE_ERR_FORMAT, "%s: not a JSON object with \"messages\"", name);
    else if (!msgs)
        st = err_set(e, ENGINE_ERR_FORMAT, "%s: no \"messages\" list", name);
    else if (vars && !json_is_object(vars))
        st = err_set(e, ENGINE_ERR_FORMAT, "%s: \"variables\" must be an object", name);
    else
        st = check_messages(msgs, name, e);
    if (st == ENGINE_OK)
        st = render(tok, e, json_incref(msgs), vars, &p, buf, cap, len);
    json_decref(root);
    return st;
}

engine_status engine_chat_tokenize(const engine_tokenizer *tok, const char *text, size_t len, int32_t *ids, size_t cap,
                                   size_t *n_ids)
{
    if (n_ids)
        *n_ids = 0;
    if (!tok || (!text && len) || (!ids && cap))
        return ENGINE_ERR_INVALID_ARG;
    err_buf *e = tok_err(tok);
    err_clear(e);
    int32_t *all = NULL;
    size_t n = 0;
    engine_status st = tok_encode(tok->tok, text ? text : "", len, false, &all, &n, e);
    if (st != ENGINE_OK)
        return st;
    /* BOS as the config says, unless the template wrote it already. */
    const int32_t bos = tok_bos(tok->tok);
    const size_t lead = tok_add_bos(tok->tok) && bos >= 0 && (n == 0 || all[0] != bos);
    if (n_ids)
        *n_ids = n + lead;
    if (n + lead > cap) {
        free(all);
        return err_set(e, ENGINE_ERR_BUFFER_TOO_SMALL, "%zu ids do not fit in a buffer of %zu", n + lead, cap);
    }
    if (lead)
        ids[0] = bos;
    if (n)
        memcpy(ids + lead, all, n * sizeof *ids);
    free(all);
    return ENGINE_OK;
}

int engine_tokenizer_has_chat_template(const engine_tokenizer *tok)
{
    return tok && tok->chat && (tok->chat->dflt || tok->chat->tool_use);
}

/* ------------------------------------------------------ reusing a cache */

engine_status engine_session_reuse(engine_session *s, const int32_t *ids, size_t n, size_t *n_reused)
{
    if (n_reused)
        *n_reused = 0;
    if (!s || (!ids && n))
        return ENGINE_ERR_INVALID_ARG;
    size_t k = 0;
    const size_t past = (size_t)s->n_past;
    while (k < past && k < n && s->tokens[k] == ids[k])
        k++;
    /* Leave the last id to evaluate: generation starts from its logits. */
    if (k == n && k > 0)
        k--;
    /* A sliding window's ring may no longer hold the positions before k
     * that the next pass reads: then nothing can be kept. */
    if (k < past && !session_kv_holds(s, (int)k))
        k = 0;
    if (k < past) {
        s->n_past = (int)k;
        if (k == 0)
            s->kv_end = 0;
        s->have_logits = s->device_logits = false;
    }
    if (n_reused)
        *n_reused = k;
    return ENGINE_OK;
}
