/*
 * simple.c: the smallest complete libengine program. Loads a model, streams
 * a continuation of the prompt to stdout as it is generated, then prints
 * what the session's memory holds.
 *
 *   simple MODEL [PROMPT] [N]      e.g. simple models/stories260K "Once upon a time" 40
 *
 * Greedy decoding, so the output is the same on every run.
 */
#include <engine.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Called once per generated token with the text it completes. */
static int print_token(int32_t id, const char *text, size_t len, void *user)
{
    (void)id;
    (void)user;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0; /* nonzero would stop the generation here */
}

/* The library prints nothing itself; warnings reach us through this. */
static void print_log(engine_log_level level, const char *msg, void *user)
{
    (void)user;
    if (level <= ENGINE_LOG_WARN)
        fprintf(stderr, "engine: %s\n", msg);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL [PROMPT] [N]\n", argv[0]);
        return 2;
    }
    const char *prompt = argc > 2 ? argv[2] : "Once upon a time";
    const int n_predict = argc > 3 ? atoi(argv[3]) : 40;

    char err[512];
    engine_model_params mp = engine_model_default_params(); /* defaults, then edit */
    mp.log = print_log;
    engine_model *model = NULL;
    engine_status st = engine_model_load(argv[1], &mp, &model, err, sizeof err);
    if (st != ENGINE_OK) {
        fprintf(stderr, "load: %s (%s)\n", err, engine_status_str(st));
        return 1;
    }
    /* Owned by the model: never freed by us. */
    const engine_tokenizer *tok = engine_model_tokenizer(model);
    if (!tok) {
        fprintf(stderr, "%s has no tokenizer.json\n", argv[1]);
        engine_model_free(model);
        return 1;
    }

    /* Ask for the size first, then tokenize into a buffer of that size. */
    size_t n_ids = 0;
    st = engine_tokenize(tok, prompt, strlen(prompt), 1, NULL, 0, &n_ids);
    int32_t *ids = malloc((n_ids ? n_ids : 1) * sizeof *ids);
    if (ids && (st == ENGINE_OK || st == ENGINE_ERR_BUFFER_TOO_SMALL))
        st = engine_tokenize(tok, prompt, strlen(prompt), 1, ids, n_ids, &n_ids);
    if (!ids || st != ENGINE_OK) {
        fprintf(stderr, "tokenize: %s\n", ids ? engine_tokenizer_last_error(tok) : "out of memory");
        free(ids);
        engine_model_free(model);
        return 1;
    }

    engine_session_params sp = engine_session_default_params();
    sp.n_ctx = 256; /* the KV cache is sized for this many tokens, once */
    engine_session *session = NULL;
    st = engine_session_create(model, &sp, &session, err, sizeof err);
    if (st != ENGINE_OK) {
        fprintf(stderr, "session: %s\n", err);
        free(ids);
        engine_model_free(model);
        return 1;
    }

    engine_generate_params gp = engine_generate_default_params();
    gp.n_predict = n_predict;
    gp.on_token = print_token;
    engine_generate_stats stats;
    fputs(prompt, stdout);
    st = engine_generate(session, ids, n_ids, &gp, NULL, 0, NULL, &stats);
    fputc('\n', stdout);
    int rc = 0;
    if (st != ENGINE_OK) {
        fprintf(stderr, "generate: %s\n", engine_session_last_error(session));
        rc = 1;
    } else {
        fprintf(stderr, "%zu prompt tokens, %zu generated in %.3f s\n", stats.n_prompt, stats.n_generated,
                stats.prompt_seconds + stats.gen_seconds);
        engine_memory_report mem;
        engine_session_memory(session, &mem);
        printf("memory: weights %llu B mapped, KV cache %llu B, activations %llu B, host total %llu B\n",
               (unsigned long long)mem.weights_mapped, (unsigned long long)mem.kv_cache,
               (unsigned long long)mem.activations, (unsigned long long)mem.host_total);
        if (mem.device_budget) /* on a GPU */
            printf("device: %llu B in use, peak mapped %llu B of a %llu B budget\n",
                   (unsigned long long)mem.device_total, (unsigned long long)mem.device_peak,
                   (unsigned long long)mem.device_budget);
    }

    /* Sessions first, then their model. */
    engine_session_free(session);
    engine_model_free(model);
    free(ids);
    return rc;
}
