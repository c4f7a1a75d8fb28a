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

    /* Byte counts as text, at each unit's boundary; a short buffer truncates, no buffer is refused. */
    char b[32];
    CHECK(!strcmp(engine_format_bytes(0, b, sizeof b), "0 B"));
    CHECK(!strcmp(engine_format_bytes(1023, b, sizeof b), "1023 B"));
    CHECK(!strcmp(engine_format_bytes(1024, b, sizeof b), "1.0 KiB"));
    CHECK(!strcmp(engine_format_bytes(3 * 1048576 / 2, b, sizeof b), "1.5 MiB"));
    CHECK(!strcmp(engine_format_bytes((uint64_t)5 << 30, b, sizeof b), "5.00 GiB"));
    CHECK(!strcmp(engine_format_bytes(UINT64_MAX, b, sizeof b), "17179869184.00 GiB"));
    CHECK(!strcmp(engine_format_bytes((uint64_t)5 << 30, b, 4), "5.0"));
    CHECK(engine_format_bytes(1, NULL, 0) == NULL);

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

    /* The streaming decoder: pushes plus flush equal the whole decode, and
     * after the prompt's ids it yields what engine_generate streamed. */
    engine_detokenizer *dt = (engine_detokenizer *)&err;
    CHECK(engine_detokenizer_create(NULL, 1, &dt) == ENGINE_ERR_INVALID_ARG && dt == NULL);
    engine_detokenizer_free(NULL);
    CHECK(engine_detokenizer_create(tok, 1, &dt) == ENGINE_OK && dt);
    char streamed[8192] = "", cont[8192] = "";
    size_t sl = 0, cl = 0;
    for (size_t i = 0; dt && i < n + ng; i++) {
        const char *piece = NULL;
        size_t pl = 0;
        CHECK(engine_detokenizer_push(dt, all_ids[i], &piece, &pl) == ENGINE_OK && piece);
        if (piece && sl + pl < sizeof streamed) {
            memcpy(streamed + sl, piece, pl);
            sl += pl;
            if (i >= n) {
                memcpy(cont + cl, piece, pl);
                cl += pl;
            }
        }
    }
    const char *rest = NULL;
    size_t rl = 0;
    CHECK(dt && engine_detokenizer_flush(dt, &rest, &rl) == ENGINE_OK);
    if (rest && sl + rl < sizeof streamed) {
        memcpy(streamed + sl, rest, rl);
        memcpy(cont + cl, rest, rl);
        sl += rl;
        cl += rl;
    }
    streamed[sl] = cont[cl] = '\0';
    CHECK_MSG(strcmp(streamed, full) == 0, "pushed '%s' vs decoded '%s'", streamed, full);
    CHECK_MSG(strcmp(cont, st.text) == 0, "continuation '%s' vs generated '%s'", cont, st.text);
    const char *piece = NULL;
    size_t pl = 1;
    CHECK(engine_detokenizer_push(dt, 100000, &piece, &pl) == ENGINE_ERR_INVALID_ARG);
    CHECK(engine_detokenizer_push(NULL, 1, &piece, &pl) == ENGINE_ERR_INVALID_ARG);
    engine_detokenizer_free(dt);

    /* A character split over byte tokens comes out whole when the byte run
     * ends (a later byte could still change it, as in tokenizers); cut
     * short, the flush gives U+FFFD. */
    const int32_t euro[] = {3 + 0xe2, 3 + 0x82, 3 + 0xac}; /* byte-fallback tokens <0xE2><0x82><0xAC> */
    const size_t ne = 3;
    CHECK(engine_detokenize(tok, euro, ne, 1, text, sizeof text, &len) == ENGINE_OK && strcmp(text, "\xe2\x82\xac") == 0);
    CHECK(engine_detokenizer_create(tok, 1, &dt) == ENGINE_OK);
    for (size_t i = 0; dt && i < ne; i++) {
        CHECK(engine_detokenizer_push(dt, euro[i], &piece, &pl) == ENGINE_OK);
        CHECK_MSG(pl == 0, "byte %zu gave %zu bytes", i, pl);
    }
    CHECK(dt && engine_detokenizer_push(dt, ids[1], &piece, &pl) == ENGINE_OK); /* "Once" */
    CHECK_MSG(pl > 3 && memcmp(piece, "\xe2\x82\xac", 3) == 0, "after the run: '%.*s'", (int)pl, piece);
    CHECK(dt && engine_detokenizer_push(dt, euro[0], &piece, &pl) == ENGINE_OK && pl == 0);
    CHECK(dt && engine_detokenizer_flush(dt, &piece, &pl) == ENGINE_OK && pl == 3 && memcmp(piece, "\xef\xbf\xbd", 3) == 0);
    engine_detokenizer_free(dt);

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
