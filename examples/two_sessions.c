/*
 * two_sessions.c: one loaded model, two sessions generating at the same
 * time from two threads.
 *
 * The model (weights, tokenizer) is loaded once and only read afterwards,
 * so any number of threads may use it. Each session owns its KV cache and
 * buffers and must be used by one thread at a time; so must a sampler.
 * Here each thread has its own session and samples with its own seed.
 *
 * To show the sessions do not disturb each other, each generation is then
 * repeated alone on the same session (reset first): the ids must match.
 * The exit status is nonzero if they do not.
 *
 *   two_sessions MODEL
 */
#define _POSIX_C_SOURCE 200809L
#include <engine.h>

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define N_PREDICT 48

typedef struct job {
    engine_session *session; /* this job's alone */
    const engine_tokenizer *tok; /* the model's, shared */
    const char *prompt;
    uint64_t seed;
    int32_t ids[N_PREDICT];  /* generated ids */
    size_t n_ids;
    char text[4096];         /* the streamed text */
    size_t len;
    engine_status status;
} job;

static int collect(int32_t id, const char *text, size_t len, void *user)
{
    (void)id;
    job *j = user;
    if (j->len + len < sizeof j->text) {
        memcpy(j->text + j->len, text, len);
        j->len += len;
        j->text[j->len] = '\0';
    }
    return 0;
}

static void *run(void *arg)
{
    job *j = arg;
    int32_t prompt[64];
    size_t n_prompt = 0;
    j->len = 0;
    j->text[0] = '\0';
    j->status = engine_tokenize(j->tok, j->prompt, strlen(j->prompt), 1, prompt, 64, &n_prompt);
    if (j->status != ENGINE_OK)
        return NULL;
    engine_generate_params gp = engine_generate_default_params();
    gp.n_predict = N_PREDICT;
    gp.sampling.temperature = 0.8f;
    gp.sampling.top_p = 0.95f;
    gp.sampling.seed = j->seed;
    gp.on_token = collect;
    gp.user = j;
    j->status = engine_generate(j->session, prompt, n_prompt, &gp, j->ids, N_PREDICT, &j->n_ids, NULL);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s MODEL\n", argv[0]);
        return 2;
    }
    char err[512];
    engine_model_params mp = engine_model_default_params();
    /* The CPU thread count is the model's: with two sessions running at
     * once, one thread each keeps them from competing for cores. */
    mp.n_threads = 1;
    engine_model *model = NULL;
    if (engine_model_load(argv[1], &mp, &model, err, sizeof err) != ENGINE_OK) {
        fprintf(stderr, "load: %s\n", err);
        return 1;
    }
    engine_session_params sp = engine_session_default_params();
    sp.n_ctx = 128;
    job jobs[2] = {
        {.prompt = "Once upon a time", .seed = 1},
        {.prompt = "The little dog", .seed = 2},
    };
    int rc = 0;
    for (int i = 0; i < 2; i++) {
        jobs[i].tok = engine_model_tokenizer(model);
        if (engine_session_create(model, &sp, &jobs[i].session, err, sizeof err) != ENGINE_OK) {
            fprintf(stderr, "session %d: %s\n", i, err);
            rc = 1;
        }
    }
    if (rc || !jobs[0].tok) {
        fprintf(stderr, "%s\n", jobs[0].tok ? "cannot create the sessions" : "the model has no tokenizer");
        goto done;
    }

    /* Both at once. */
    pthread_t threads[2];
    for (int i = 0; i < 2; i++)
        if (pthread_create(&threads[i], NULL, run, &jobs[i]) != 0) {
            fprintf(stderr, "cannot start a thread\n");
            for (int k = 0; k < i; k++)
                pthread_join(threads[k], NULL);
            rc = 1;
            goto done;
        }
    for (int i = 0; i < 2; i++)
        pthread_join(threads[i], NULL);

    for (int i = 0; i < 2; i++) {
        if (jobs[i].status != ENGINE_OK) {
            fprintf(stderr, "session %d: %s\n", i, engine_session_last_error(jobs[i].session));
            rc = 1;
            continue;
        }
        printf("session %d: %s%s\n", i, jobs[i].prompt, jobs[i].text);

        /* The same again, alone: the same seed must give the same ids. */
        job again = jobs[i];
        engine_session_reset(again.session);
        run(&again);
        if (again.status != ENGINE_OK || again.n_ids != jobs[i].n_ids ||
            memcmp(again.ids, jobs[i].ids, jobs[i].n_ids * sizeof *jobs[i].ids) != 0) {
            fprintf(stderr, "session %d: alone it generated something else: %s%s\n", i, again.prompt, again.text);
            rc = 1;
        }
    }
    if (!rc && jobs[0].n_ids == jobs[1].n_ids &&
        memcmp(jobs[0].ids, jobs[1].ids, jobs[0].n_ids * sizeof *jobs[0].ids) == 0) {
        fprintf(stderr, "the two sessions generated the same ids from different prompts and seeds\n");
        rc = 1;
    }

done:
    for (int i = 0; i < 2; i++)
        engine_session_free(jobs[i].session);
    engine_model_free(model);
    return rc;
}
