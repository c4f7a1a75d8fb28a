/*
 * test_chat.c: the chat part of include/engine.h: rendering a conversation
 * with a tokenizer's own template (as Jinja2 renders it: tests/data/chat/),
 * from structs and from JSON, the buffer contract, template selection from
 * a named list, errors and their messages, BOS handling of chat prompts,
 * the end-of-turn stop, and a session reusing its cache across turns.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "test_util.h"

static engine_tokenizer *load_tok(const char *rel)
{
    char p[4096], err[512];
    engine_tokenizer *t = NULL;
    engine_status st = engine_tokenizer_load(test_data_path(p, sizeof p, rel), &t, err, sizeof err);
    CHECK_MSG(st == ENGINE_OK, "%s: %s", rel, err);
    return t;
}

/* Renders through the JSON entry point into a fresh buffer (NULL on error). */
static char *render_json(const engine_tokenizer *tok, const char *json, const engine_chat_params *p, size_t *len)
{
    size_t need = 0;
    engine_status st = engine_chat_render_json(tok, json, strlen(json), p, NULL, 0, &need);
    if (st != ENGINE_ERR_BUFFER_TOO_SMALL)
        return NULL;
    char *buf = malloc(need + 1);
    if (buf && engine_chat_render_json(tok, json, strlen(json), p, buf, need + 1, len) == ENGINE_OK)
        return buf;
    free(buf);
    return NULL;
}

static void check_qwen3(void)
{
    engine_tokenizer *tok = load_tok("tokenizers/qwen3");
    if (!tok)
        return;
    char p[4096];
    size_t want_len = 0, conv_len = 0, len = 0;
    char *want = test_read_file(test_src_path(p, sizeof p, "tests/data/chat/qwen3.txt"), &want_len);
    char *conv = test_read_file(test_src_path(p, sizeof p, "tests/data/chat/conversation.json"), &conv_len);
    CHECK(engine_tokenizer_has_chat_template(tok) == 1);
    char *got = render_json(tok, conv, NULL, &len);
    CHECK_MSG(got && len == want_len && memcmp(got, want, len) == 0, "qwen3 render: %s",
              got ? got : engine_tokenizer_last_error(tok));
    free(got);

    /* The same conversation from structs. */
    const engine_chat_message msgs[] = {{"system", "You answer in one word."},
                                        {"user", "Capital of France?"},
                                        {"assistant", "Paris."},
                                        {"user", "And of Italy? \xc3\xa9t\xc3\xa9 \"quoted\""}};
    char small[8];
    CHECK(engine_chat_render(tok, msgs, 4, NULL, small, sizeof small, &len) == ENGINE_ERR_BUFFER_TOO_SMALL);
    CHECK(len == want_len && small[0] == '\0');
    char *buf = malloc(len + 1);
    CHECK(buf && engine_chat_render(tok, msgs, 4, NULL, buf, len + 1, &len) == ENGINE_OK);
    CHECK(buf && len == want_len && memcmp(buf, want, len) == 0 && buf[len] == '\0');

    /* Chat tokenization: specials matched, no BOS (qwen3 has none), no EOS. */
    int32_t ids[256];
    size_t n = 0;
    CHECK(engine_chat_tokenize(tok, buf, len, ids, 256, &n) == ENGINE_OK);
    CHECK(n > 10 && ids[0] == 151644 && ids[n - 1] != 151645);
    size_t n2 = 0;
    CHECK(engine_chat_tokenize(tok, buf, len, ids, 3, &n2) == ENGINE_ERR_BUFFER_TOO_SMALL && n2 == n);
    free(buf);

    /* A template given as text, with the config's token strings and a variable. */
    engine_chat_params cp = engine_chat_default_params();
    cp.template_source = "{{ eos_token }}|{{ pad_token }}|{{ who }}|{{ messages | length }}|{{ add_generation_prompt }}";
    cp.variables_json = "{\"who\": \"me\"}";
    cp.add_generation_prompt = 0;
    char out[128];
    CHECK(engine_chat_render(tok, msgs, 2, &cp, out, sizeof out, &len) == ENGINE_OK);
    CHECK_MSG(!strcmp(out, "<|im_end|>|<|endoftext|>|me|2|False"), "got '%s'", out);

    /* Errors: one line naming the place. */
    cp.template_source = "{% for x in %}";
    cp.template_name = "mine.jinja";
    CHECK(engine_chat_render(tok, msgs, 2, &cp, out, sizeof out, &len) == ENGINE_ERR_FORMAT);
    CHECK_MSG(strstr(engine_tokenizer_last_error(tok), "mine.jinja: line 1, column"), "%s",
              engine_tokenizer_last_error(tok));
    cp.template_source = "{{ raise_exception('roles must alternate') }}";
    CHECK(engine_chat_render(tok, msgs, 2, &cp, out, sizeof out, &len) == ENGINE_ERR_FORMAT);
    CHECK(strstr(engine_tokenizer_last_error(tok), "roles must alternate"));
    cp.variables_json = "[1]";
    CHECK(engine_chat_render(tok, msgs, 2, &cp, out, sizeof out, &len) == ENGINE_ERR_INVALID_ARG);
    const engine_chat_message bad[] = {{"user", NULL}};
    CHECK(engine_chat_render(tok, bad, 1, NULL, out, sizeof out, &len) == ENGINE_ERR_INVALID_ARG);
    engine_chat_params named = engine_chat_default_params();
    named.messages_name = "m.json";
    const char *no_content = "{\"messages\": [{\"role\": \"user\"}]}";
    CHECK(engine_chat_render_json(tok, no_content, strlen(no_content), &named, out, sizeof out, &len) ==
          ENGINE_ERR_FORMAT);
    CHECK(!strcmp(engine_tokenizer_last_error(tok), "m.json: messages[0] has no \"content\""));
    CHECK(engine_chat_render_json(tok, "{\"messages\": [", 14, &named, out, sizeof out, &len) == ENGINE_ERR_FORMAT);
    CHECK(!strncmp(engine_tokenizer_last_error(tok), "m.json: line 1, column", 22));
    CHECK(engine_chat_render(NULL, msgs, 1, NULL, out, sizeof out, &len) == ENGINE_ERR_INVALID_ARG);
    free(want);
    free(conv);
    engine_tokenizer_free(tok);
}

/* A named list of templates, and a folder without any. */
static void check_sources(void)
{
    char dir[] = "/tmp/test_chat_XXXXXX", path[4200], src[4096];
    if (!mkdtemp(dir)) {
        CHECK(0);
        return;
    }
    size_t n = 0;
    char *tj = test_read_file(test_data_path(src, sizeof src, "tokenizers/qwen3/tokenizer.json"), &n);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    FILE *f = fopen(path, "wb");
    CHECK(f && tj && fwrite(tj, 1, n, f) == n);
    if (f)
        fclose(f);
    free(tj);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    f = fopen(path, "wb");
    CHECK(f != NULL);
    if (f) {
        fputs("{\"eos_token\": {\"content\": \"<|im_end|>\"}, \"chat_template\": [{\"name\": \"default\", \"template\": "
              "\"D{{ eos_token }}\"}, {\"name\": \"tool_use\", \"template\": \"T{{ tools | length }}\"}]}",
              f);
        fclose(f);
    }
    engine_tokenizer *tok = NULL;
    char err[512], out[64];
    size_t len = 0;
    const engine_chat_message m[] = {{"user", "hi"}};
    CHECK_MSG(engine_tokenizer_load(path, &tok, err, sizeof err) == ENGINE_OK, "%s", err); /* the config's path */
    if (tok) {
        CHECK(engine_chat_render(tok, m, 1, NULL, out, sizeof out, &len) == ENGINE_OK && !strcmp(out, "D<|im_end|>"));
        engine_chat_params p = engine_chat_default_params();
        p.variables_json = "{\"tools\": [1, 2]}";
        CHECK(engine_chat_render(tok, m, 1, &p, out, sizeof out, &len) == ENGINE_OK && !strcmp(out, "T2"));
        engine_tokenizer_free(tok);
    }
    f = fopen(path, "wb");
    if (f) {
        fputs("{\"eos_token\": \"<|im_end|>\"}", f);
        fclose(f);
    }
    tok = NULL;
    CHECK(engine_tokenizer_load(dir, &tok, err, sizeof err) == ENGINE_OK);
    if (tok) {
        CHECK(engine_tokenizer_has_chat_template(tok) == 0);
        CHECK(engine_chat_render(tok, m, 1, NULL, out, sizeof out, &len) == ENGINE_ERR_UNSUPPORTED);
        CHECK_MSG(strstr(engine_tokenizer_last_error(tok), "has no chat_template"), "%s",
                  engine_tokenizer_last_error(tok));
        engine_tokenizer_free(tok);
    }
    /* chat_template.jinja beside the config. */
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    f = fopen(path, "wb");
    if (f) {
        fputs("J{{ messages[0].content }}", f);
        fclose(f);
    }
    tok = NULL;
    CHECK(engine_tokenizer_load(dir, &tok, err, sizeof err) == ENGINE_OK);
    if (tok) {
        CHECK(engine_chat_render(tok, m, 1, NULL, out, sizeof out, &len) == ENGINE_OK && !strcmp(out, "Jhi"));
        engine_tokenizer_free(tok);
    }
    const char *names[] = {"chat_template.jinja", "tokenizer_config.json", "tokenizer.json"};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        remove(path);
    }
    remove(dir);
}

/* A session keeps the prefix a new prompt shares with its cache. */
static void check_reuse(void)
{
    char p[4096], err[512];
    engine_model_params mp = engine_model_default_params();
    mp.device = ENGINE_DEVICE_CPU;
    engine_model *model = NULL;
    engine_session *s = NULL;
    if (engine_model_load(test_src_path(p, sizeof p, "models/stories260K"), &mp, &model, err, sizeof err) ||
        engine_session_create(model, NULL, &s, err, sizeof err)) {
        CHECK_MSG(0, "%s", err);
        engine_model_free(model);
        return;
    }
    const engine_tokenizer *tok = engine_model_tokenizer(model);
    /* BOS added by the config once, whether or not the text starts with it. */
    int32_t a[64], b[64];
    size_t na = 0, nb = 0, k = 9;
    CHECK(engine_chat_tokenize(tok, "Once upon", 9, a, 64, &na) == ENGINE_OK && a[0] == 1 && a[1] != 1);
    CHECK(engine_chat_tokenize(tok, "<s>Once upon", 12, b, 64, &nb) == ENGINE_OK && nb == na && b[0] == 1 && b[1] != 1);
    CHECK(engine_session_reuse(s, a, na, &k) == ENGINE_OK && k == 0);
    CHECK(engine_session_eval(s, a, na, NULL) == ENGINE_OK);
    CHECK(engine_chat_tokenize(tok, "Once upon a time", 16, b, 64, &nb) == ENGINE_OK && nb > na);
    CHECK(engine_session_reuse(s, b, nb, &k) == ENGINE_OK && k == na && engine_session_n_past(s) == (int)na);
    CHECK(engine_session_reuse(s, a, na, &k) == ENGINE_OK && k == na - 1 && engine_session_n_past(s) == (int)na - 1);
    b[1] = a[1] + 1;
    CHECK(engine_session_reuse(s, b, nb, &k) == ENGINE_OK && k == 1 && engine_session_n_past(s) == 1);
    CHECK(engine_session_reuse(NULL, b, nb, &k) == ENGINE_ERR_INVALID_ARG);
    engine_session_free(s);
    engine_model_free(model);
}

/* path/name gets text (a file of the test's temporary model folder). */
static void put_file(const char *dir, const char *name, const char *text, size_t len)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    CHECK_MSG(f && fwrite(text, 1, len, f) == len, "writing %s", p);
    if (f)
        fclose(f);
}

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long n = -1;
    if (f && fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (buf = malloc((size_t)n + 1)) && fread(buf, 1, (size_t)n, f) == (size_t)n) {
        buf[n] = 0;
        *len = (size_t)n;
    } else {
        free(buf);
        buf = NULL;
    }
    if (f)
        fclose(f);
    CHECK_MSG(buf, "reading %s", path);
    return buf;
}

/*
 * The end-of-turn stop: a model whose tokenizer has <|im_end|> as an added
 * special token (id 7 here) stops at it when its chat template writes it,
 * though no config lists it; with a template that does not write it, or
 * with no template, the token is an ordinary one. The model is llama_f32's
 * (its configs list only </s>, id 2), copied with its tokenizer edited.
 */
static void check_end_of_turn(void)
{
    char src[4096], dir[] = "/tmp/test_chat_XXXXXX", err[512];
    CHECK(mkdtemp(dir) != NULL);
    static const char *const copied[] = {"config.json", "generation_config.json", "model.safetensors"};
    for (size_t i = 0; i < sizeof copied / sizeof *copied; i++) {
        char rel[256];
        size_t n = 0;
        snprintf(rel, sizeof rel, "models/llama_f32/%s", copied[i]);
        char *b = slurp(test_data_path(src, sizeof src, rel), &n);
        if (b)
            put_file(dir, copied[i], b, n);
        free(b);
    }
    size_t n = 0;
    char *tj = slurp(test_data_path(src, sizeof src, "models/llama_f32/tokenizer.json"), &n);
    const char *at = tj ? strstr(tj, "\"added_tokens\": [") : NULL;
    CHECK(at != NULL);
    if (!at) {
        free(tj);
        return;
    }
    at += strlen("\"added_tokens\": [");
    static const char add[] = "{\"id\": 7, \"content\": \"<|im_end|>\", \"single_word\": false, \"lstrip\": false, "
                              "\"rstrip\": false, \"normalized\": false, \"special\": true},";
    char *edited = malloc(n + sizeof add);
    size_t head = (size_t)(at - tj);
    memcpy(edited, tj, head);
    memcpy(edited + head, add, sizeof add - 1);
    memcpy(edited + head + sizeof add - 1, at, n - head);
    put_file(dir, "tokenizer.json", edited, n + sizeof add - 1);
    free(tj), free(edited);
    static const char *const configs[] = {
        "{\"chat_template\": \"{% for m in messages %}{{ m.content }}<|im_end|>{% endfor %}\"}", /* writes it */
        "{\"chat_template\": \"{% for m in messages %}{{ m.content }}</s>{% endfor %}\"}",        /* does not */
        "{}",                                                                                 /* no template */
    };
    for (int c = 0; c < 3; c++) {
        put_file(dir, "tokenizer_config.json", configs[c], strlen(configs[c]));
        engine_model_params mp = engine_model_default_params();
        mp.device = ENGINE_DEVICE_CPU;
        engine_model *m = NULL;
        CHECK_MSG(engine_model_load(dir, &mp, &m, err, sizeof err) == ENGINE_OK, "%s", err);
        if (!m)
            continue;
        CHECK_MSG(engine_model_is_eos(m, 7) == (c == 0), "config %d: id 7 is%s an end of sequence", c,
                  engine_model_is_eos(m, 7) ? "" : " not");
        CHECK(engine_model_is_eos(m, 2) && !engine_model_is_eos(m, 8));
        engine_model_free(m);
    }
    static const char *const names[] = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                                        "tokenizer_config.json"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        remove(p);
    }
    rmdir(dir);
}

int main(void)
{
    check_qwen3();
    check_sources();
    check_reuse();
    check_end_of_turn();
    return test_finish("test_chat");
}
