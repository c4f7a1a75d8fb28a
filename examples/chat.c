/*
 * chat.c: a multi-turn chat with an instruct model through libengine's
 * chat template API, a user turn per line of stdin.
 *
 *   chat MODEL ["JINJA TEMPLATE TEXT"]   (default: the model's own template)
 *
 * Each turn renders the whole conversation with the model's template and
 * evaluates only what the session's KV cache does not hold yet.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

#define MAX_TURNS 64

static int print_token(int32_t id, const char *text, size_t len, void *user)
{
    (void)id;
    char *reply = user; /* the reply so far, kept for the next turn's render */
    size_t have = strlen(reply), room = 4095 - have;
    strncat(reply, text, len < room ? len : room);
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL [\"JINJA TEMPLATE TEXT\"]\n", argv[0]);
        return 2;
    }
    char err[512], line[1024], *text = NULL;
    engine_model *model = NULL;
    engine_session *s = NULL;
    if (engine_model_load(argv[1], NULL, &model, err, sizeof err) != ENGINE_OK ||
        engine_session_create(model, NULL, &s, err, sizeof err) != ENGINE_OK) {
        fprintf(stderr, "%s\n", err);
        engine_model_free(model);
        return 1;
    }
    const engine_tokenizer *tok = engine_model_tokenizer(model);
    engine_chat_params cp = engine_chat_default_params();
    cp.template_source = argc > 2 ? argv[2] : NULL; /* an inline template, for the tests */
    engine_chat_message msgs[2 * MAX_TURNS];
    static char turns[2 * MAX_TURNS][4096];
    size_t n_msgs = 0, n_ids = 0, len = 0, reused = 0;
    int32_t *ids = NULL;
    int rc = 0;
    while (n_msgs + 2 <= 2 * MAX_TURNS && fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\n")] = '\0';
        snprintf(turns[n_msgs], sizeof turns[n_msgs], "%s", line);
        msgs[n_msgs] = (engine_chat_message){"user", turns[n_msgs]};
        n_msgs++;
        /* Render (asking the size first), then tokenize the same way. */
        engine_status st = engine_chat_render(tok, msgs, n_msgs, &cp, NULL, 0, &len);
        if (st == ENGINE_ERR_BUFFER_TOO_SMALL && (text = realloc(text, len + 1)) != NULL)
            st = engine_chat_render(tok, msgs, n_msgs, &cp, text, len + 1, &len);
        if (st == ENGINE_OK) {
            st = engine_chat_tokenize(tok, text, len, NULL, 0, &n_ids);
            if (st == ENGINE_ERR_BUFFER_TOO_SMALL && (ids = realloc(ids, n_ids * sizeof *ids)) != NULL)
                st = engine_chat_tokenize(tok, text, len, ids, n_ids, &n_ids);
        }
        if (st != ENGINE_OK) {
            fprintf(stderr, "%s\n", engine_tokenizer_last_error(tok));
            rc = 1;
            break;
        }
        /* Keep what the cache shares with this prompt; evaluate the rest. */
        engine_session_reuse(s, ids, n_ids, &reused);
        char *reply = turns[n_msgs];
        reply[0] = '\0';
        engine_generate_params gp = engine_generate_default_params();
        gp.on_token = print_token;
        gp.user = reply;
        if (engine_generate(s, ids + reused, n_ids - reused, &gp, NULL, 0, NULL, NULL) != ENGINE_OK) {
            fprintf(stderr, "\n%s\n", engine_session_last_error(s));
            rc = 1;
            break;
        }
        printf("\n[%zu tokens reused]\n", reused);
        msgs[n_msgs] = (engine_chat_message){"assistant", reply};
        n_msgs++;
    }
    free(ids);
    free(text);
    engine_session_free(s);
    engine_model_free(model);
    return rc;
}
