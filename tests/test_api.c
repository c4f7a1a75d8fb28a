/*
 * test_api.c: the public contract of include/engine.h beyond the model
 * math: status names, version, NULL handling, error messages, buffer sizes,
 * the token callback (streamed text, stopping), and the log callback.
 */
#define _POSIX_C_SOURCE 200809L /* mmap, clock_gettime, PATH_MAX under -std=c11 */

#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "test_util.h"

typedef struct {
    char text[8192];
    size_t len;
    int calls;
    int stop_after;
} stream_state;

static int on_token(int32_t id, const char *text, size_t len, void *user)
{
    stream_state *s = user;
    if (s->len + len < sizeof s->text) {
        memcpy(s->text + s->len, text, len);
        s->len += len;
        s->text[s->len] = '\0';
    }
    if (id >= 0)
        s->calls++;
    return s->stop_after > 0 && s->calls >= s->stop_after;
}

static int log_lines;
static void on_log(engine_log_level level, const char *msg, void *user)
{
    (void)level;
    (void)user;
    CHECK(msg && strchr(msg, '\n') == NULL);
    log_lines++;
}

int main(void)
{
    /* Status names are distinct and non-empty. */
    const engine_status all[] = {ENGINE_OK,          ENGINE_ERR_INVALID_ARG, ENGINE_ERR_OUT_OF_MEMORY,
                                 ENGINE_ERR_OVER_BUDGET, ENGINE_ERR_IO,      ENGINE_ERR_FORMAT,
                                 ENGINE_ERR_UNSUPPORTED, ENGINE_ERR_CUDA,    ENGINE_ERR_CONTEXT_FULL,
                                 ENGINE_ERR_BUFFER_TOO_SMALL};
    const size_t n_all = sizeof all / sizeof all[0];
    for (size_t i = 0; i < n_all; i++) {
        CHECK(engine_status_str(all[i]) && *engine_status_str(all[i]));
        for (size_t j = 0; j < i; j++)
            CHECK(strcmp(engine_status_str(all[i]), engine_status_str(all[j])) != 0);
    }
    CHECK(engine_version_number() == ENGINE_VERSION_NUMBER);
    CHECK(engine_version_string() && strchr(engine_version_string(), '.'));

    /* NULL handles are no-ops or clean errors. */
    engine_model_free(NULL);
    engine_session_free(NULL);
    engine_tokenizer_free(NULL);
    engine_sampler_free(NULL);
    char err[512] = "";
    engine_model *m = (engine_model *)&err; /* must be reset to NULL on failure */
    CHECK(engine_model_load(NULL, NULL, &m, err, sizeof err) == ENGINE_ERR_INVALID_ARG && m == NULL && err[0]);
    CHECK(engine_model_load("/nonexistent/model", NULL, &m, err, sizeof err) == ENGINE_ERR_IO);
    CHECK(strstr(err, "/nonexistent/model") != NULL);
    CHECK(engine_model_load("/nonexistent/model", NULL, &m, NULL, 0) == ENGINE_ERR_IO); /* no buffer: fine */
    CHECK(engine_session_eval(NULL, NULL, 0, NULL) == ENGINE_ERR_INVALID_ARG);
    CHECK(engine_generate(NULL, NULL, 0, NULL, NULL, 0, NULL, NULL) == ENGINE_ERR_INVALID_ARG);

    char path[1024];
    engine_model_params mp = engine_model_default_params();
    mp.n_threads = 2;
    mp.log = on_log;
    CHECK(engine_model_load(test_src_path(path, sizeof path, "models/stories260K/model.safetensors"), &mp, &m, err,
                            sizeof err) == ENGINE_OK);
    if (!m)
        return test_finish("test_api");
    CHECK(log_lines > 0);
    const engine_tokenizer *tok = engine_model_tokenizer(m);
    CHECK(tok && engine_tokenizer_vocab_size(tok) == 512);
    CHECK(engine_tokenizer_bos(tok) == 1 && engine_tokenizer_eos(tok) == 2);
    CHECK(engine_model_is_eos(m, 2) && !engine_model_is_eos(m, 1));

    /* Buffers: too small reports the size needed and writes nothing past cap. */
    int32_t ids[8] = {-7, -7, -7, -7, -7, -7, -7, -7};
    size_t n = 0;
    CHECK(engine_tokenize(tok, "Once upon a time", 16, 1, ids, 2, &n) == ENGINE_ERR_BUFFER_TOO_SMALL && n == 5);
    CHECK(ids[0] == 1 && ids[2] == -7);
    CHECK(engine_tokenize(tok, "Once upon a time", 16, 1, ids, 8, &n) == ENGINE_OK && n == 5);
    char text[64];
    size_t len = 0;
    CHECK(engine_detokenize(tok, ids, n, 1, text, 4, &len) == ENGINE_ERR_BUFFER_TOO_SMALL && len == 16);
    CHECK(strlen(text) == 3); /* truncated, NUL-terminated */
    CHECK(engine_detokenize(tok, ids, n, 1, text, sizeof text, &len) == ENGINE_OK && strcmp(text, "Once upon a time") == 0);
    int32_t bad = 100000;
    CHECK(engine_detokenize(tok, &bad, 1, 0, text, sizeof text, &len) != ENGINE_OK);
    CHECK(engine_tokenizer_last_error(tok)[0] != '\0');

    /* Streamed text equals the decode of prompt + generated ids, minus the prompt's text. */
    engine_session *s = NULL;
    engine_session_params sp = engine_session_default_params();
    sp.n_ctx = 128;
    CHECK(engine_session_create(m, &sp, &s, err, sizeof err) == ENGINE_OK);
    stream_state st;
    memset(&st, 0, sizeof st);
    engine_generate_params gp = engine_generate_default_params();
    gp.n_predict = 40;
    gp.on_token = on_token;
    gp.user = &st;
    int32_t gen[64], all_ids[128];
    size_t ng = 0;
    engine_generate_stats stats;
    CHECK(engine_generate(s, ids, n, &gp, gen, 64, &ng, &stats) == ENGINE_OK && ng == 40);
    CHECK(st.calls == 40);
    memcpy(all_ids, ids, n * sizeof *ids);
    memcpy(all_ids + n, gen, ng * sizeof *gen);
    char full[8192];
    CHECK(engine_detokenize(tok, all_ids, n + ng, 1, full, sizeof full, &len) == ENGINE_OK);
    CHECK_MSG(strncmp(full, "Once upon a time", 16) == 0 && strcmp(full + 16, st.text) == 0,
              "streamed '%s' vs decoded '%s'", st.text, full);
    /* The context holds the prompt and all generated tokens but the last. */
    CHECK(engine_session_n_past(s) == (int)(n + ng - 1));

    /* The callback stops generation. */
    engine_session_reset(s);
    memset(&st, 0, sizeof st);
    st.stop_after = 3;
    CHECK(engine_generate(s, ids, n, &gp, gen, 64, &ng, &stats) == ENGINE_OK);
    CHECK(ng == 3 && stats.stop == ENGINE_STOP_CALLBACK);

    /* Generation ends cleanly when the context fills. */
    engine_session_free(s);
    sp.n_ctx = 10;
    CHECK(engine_session_create(m, &sp, &s, err, sizeof err) == ENGINE_OK);
    gp.on_token = NULL;
    CHECK(engine_generate(s, ids, n, &gp, gen, 64, &ng, &stats) == ENGINE_OK);
    CHECK(stats.stop == ENGINE_STOP_CONTEXT && ng == 6 && engine_session_n_past(s) == 10);
    /* Bad sampling parameters are an error with a message. */
    gp.sampling.top_p = 2.0f;
    engine_session_reset(s);
    CHECK(engine_generate(s, ids, n, &gp, gen, 64, &ng, &stats) == ENGINE_ERR_INVALID_ARG);
    CHECK(strstr(engine_session_last_error(s), "top_p") != NULL);
    engine_session_free(s);

    /* A stand-alone tokenizer from a folder or a file. */
    engine_tokenizer *t2 = NULL;
    CHECK(engine_tokenizer_load(test_src_path(path, sizeof path, "models/stories260K"), &t2, err, sizeof err) ==
          ENGINE_OK);
    CHECK(t2 && engine_tokenizer_vocab_size(t2) == 512);
    engine_tokenizer_free(t2);
    CHECK(engine_tokenizer_load("/nonexistent/tokenizer.json", &t2, err, sizeof err) == ENGINE_ERR_IO && !t2);

    engine_model_free(m);
    return test_finish("test_api");
}
