/*
 * test_chat_templates: the 29 real chat templates in tests/data/chat_templates, each
 * rendered for its cases and compared byte for byte with what transformers
 * rendered (or required to fail where transformers raised).
 */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "jinja/jinja.h"
#include "tests/test_util.h"

static int cmp_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* bos_token / eos_token: a string, or an object with "content". */
static json_t *token_of(json_t *cfg, const char *key)
{
    json_t *v = json_object_get(cfg, key);
    if (json_is_object(v))
        v = json_object_get(v, "content");
    return json_is_string(v) ? json_incref(v) : json_string("");
}

/* The template: a string, or a list of {name, template} ("tool_use" when the case has tools). */
static const char *template_of(json_t *cfg, int tools)
{
    json_t *t = json_object_get(cfg, "chat_template");
    if (json_is_string(t))
        return json_string_value(t);
    const char *dflt = NULL, *tool = NULL;
    size_t i;
    json_t *e;
    json_array_foreach(t, i, e) {
        const char *nm = json_string_value(json_object_get(e, "name"));
        const char *tx = json_string_value(json_object_get(e, "template"));
        if (nm && !strcmp(nm, "default"))
            dflt = tx;
        if (nm && !strcmp(nm, "tool_use"))
            tool = tx;
    }
    return tools && tool ? tool : dflt;
}

static void run_folder(const char *dir, const char *name)
{
    char path[2400];
    json_error_t je;
    snprintf(path, sizeof path, "%s/%s/tokenizer_config.json", dir, name);
    json_t *cfg = json_load_file(path, 0, &je);
    snprintf(path, sizeof path, "%s/%s/cases.json", dir, name);
    json_t *cases = json_load_file(path, 0, &je);
    CHECK_MSG(cfg && json_is_array(cases), "%s: cannot read its files", name);
    if (!cfg || !json_is_array(cases)) {
        json_decref(cfg);
        json_decref(cases);
        return;
    }
    int passed = 0, total = 0;
    size_t i;
    json_t *cs;
    json_array_foreach(cases, i, cs) {
        json_t *vars = json_object_get(cs, "variables");
        int tools = json_object_get(vars, "tools") != NULL;
        const char *src = template_of(cfg, tools);
        total++;
        char err[512];
        jinja_template *t = src ? jinja_parse(src, strlen(src), err, sizeof err) : NULL;
        CHECK_MSG(t, "%s: parse: %s", name, src ? err : "no template");
        if (!t)
            continue;
        json_t *ctx = json_object();
        json_object_set(ctx, "messages", json_object_get(cs, "messages"));
        json_object_set(ctx, "add_generation_prompt", json_object_get(cs, "add_generation_prompt"));
        json_object_set_new(ctx, "bos_token", token_of(cfg, "bos_token"));
        json_object_set_new(ctx, "eos_token", token_of(cfg, "eos_token"));
        json_object_update(ctx, vars);
        jinja_limits lim = {0};
        lim.now = 1721952000; /* 26 Jul 2024, as the cases' date_string */
        char *out = NULL;
        size_t n = 0;
        int rc = jinja_render(t, ctx, &lim, &out, &n, err, sizeof err);
        json_t *expected = json_object_get(cs, "expected");
        if (!expected) {
            CHECK_MSG(rc != 0, "%s case %zu: rendered, but transformers raised %s", name, i,
                      json_string_value(json_object_get(cs, "error")));
            passed += rc != 0;
        } else if (rc != 0) {
            CHECK_MSG(0, "%s case %zu: %s", name, i, err);
        } else {
            const char *want = json_string_value(expected);
            size_t wn = json_string_length(expected);
            int same = n == wn && !memcmp(out, want, n);
            if (!same) {
                size_t k = 0;
                while (k < n && k < wn && out[k] == want[k])
                    k++;
                CHECK_MSG(0, "%s case %zu: differs at byte %zu:\n--- got:\n%.*s\n--- want:\n%.*s", name, i, k,
                          (int)(n - k > 200 ? 200 : n - k), out + k, (int)(wn - k > 200 ? 200 : wn - k), want + k);
            }
            passed += same;
        }
        free(out);
        json_decref(ctx);
        jinja_free(t);
    }
    printf("%-66s %d/%d\n", name, passed, total);
    json_decref(cfg);
    json_decref(cases);
}

int main(void)
{
    char dir[1024];
    test_data_path(dir, sizeof dir, "chat_templates");
    DIR *d = opendir(dir);
    CHECK_MSG(d, "cannot open %s", dir);
    if (!d)
        return test_finish("test_chat_templates");
    char *names[256];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 256)
        if (e->d_name[0] != '.' && !strstr(e->d_name, ".md"))
        {
            size_t len = strlen(e->d_name) + 1;
            names[n] = malloc(len);
            memcpy(names[n++], e->d_name, len);
        }
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, cmp_names);
    CHECK_MSG(n == 29, "expected 29 template folders, found %d", n);
    for (int i = 0; i < n; i++) {
        run_folder(dir, names[i]);
        free(names[i]);
    }
    return test_finish("test_chat_templates");
}
