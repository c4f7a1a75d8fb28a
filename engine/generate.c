/*
 * generate.c: the generation loop: evaluate the prompt as one batch, then
 * sample, stream the text and evaluate one token at a time until EOS, the
 * length limit, a full context, or the caller's callback says stop.
 */
#include <string.h>

#include "model.h"
#include "trace.h"
#ifdef ENGINE_HAVE_CUDA
#include "cuda/backend.h"
#endif

engine_generate_params engine_generate_default_params(void)
{
    engine_generate_params p;
    memset(&p, 0, sizeof p);
    p.n_predict = 128;
    p.sampling = engine_sampler_default_params();
    return p;
}

/* The next token from logits left on the device (CUDA sessions only). */
static int32_t sample_on_device(engine_session *s, engine_sampler *smp, engine_status *st)
{
#ifdef ENGINE_HAVE_CUDA
    const int32_t *ids;
    const float *vals;
    const int n = cuda_sample_candidates(s, sampler_temperature(smp), &ids, &vals, &s->err);
    if (n > 0 && n <= 4096)
        return sampler_sample_candidates(smp, ids, vals, n);
    /* Too many candidates for the short list (a very flat distribution): the whole logits. */
    if (n > 0 && (*st = cuda_copy_logits(s, &s->err)) == ENGINE_OK)
        return engine_sampler_sample(smp, s->logits, s->model->cfg.vocab_size, s->tokens, (size_t)s->n_past);
    if (n <= 0 && *st == ENGINE_OK)
        *st = s->err.code ? s->err.code : ENGINE_ERR_CUDA;
#else
    (void)s;
    (void)smp;
    *st = ENGINE_ERR_UNSUPPORTED;
#endif
    return -1;
}

#ifdef ENGINE_HAVE_CUDA
/*
 * Greedy on the device, pipelined: evaluate id (unless it is already
 * queued: *queued) and, when the loop may go on (more), queue the step of
 * its argmax before waiting, so the GPU runs while the host handles id.
 */
static engine_status greedy_next(engine_session *s, int32_t id, bool more, bool *queued, int32_t *next)
{
    const double t0 = trace_now(s->trace);
    const int pos = s->n_past;
    engine_status st = *queued ? ENGINE_OK : cuda_greedy_queue(s, id, &s->err);
    *queued = false;
    if (!st && more && s->n_past + 1 < s->n_ctx && (st = cuda_greedy_queue(s, -1, &s->err)) == ENGINE_OK)
        *queued = true;
    if (!st)
        st = cuda_greedy_take(s, next, &s->err);
    if (st) {
        cuda_greedy_drop(s);
        *queued = false;
    }
    if (s->trace && !st) {
        /* The host's view of the step, as session_eval records it elsewhere: from queueing the next step to
         * taking this one's token. The steps overlap on the device (the next is queued before this one is
         * waited for), so their spans are the host's, one after another on the session's track. */
        const double t1 = trace_now(s->trace);
        trace_span_args(s->trace, s->trace_tid, "decode step", -1, "step", t0, t1 - t0, "tokens", 1, "pos", pos);
        const char *series[] = {"filled", "capacity"};
        const double v[] = {s->n_past, s->n_ctx};
        trace_counter(s->trace, "KV cache positions", t1, series, v, 2);
    }
    return st;
}
#endif

engine_status engine_generate(engine_session *s, const int32_t *prompt, size_t n_prompt,
                              const engine_generate_params *params, int32_t *out_ids, size_t cap, size_t *n_out,
                              engine_generate_stats *stats)
{
    if (n_out)
        *n_out = 0;
    if (stats)
        memset(stats, 0, sizeof *stats);
    if (!s)
        return ENGINE_ERR_INVALID_ARG;
    err_clear(&s->err);
    engine_generate_params p = params ? *params : engine_generate_default_params();
    if (p.n_predict < 0)
        return err_set(&s->err, ENGINE_ERR_INVALID_ARG, "n_predict %d is negative", p.n_predict);
#ifdef ENGINE_HAVE_CUDA
    /* A GPU session leaves the last logits on the device unless asked for them. */
    if (n_prompt == 0 && !s->have_logits && s->device_logits) {
        engine_status cst = cuda_copy_logits(s, &s->err);
        if (cst != ENGINE_OK)
            return cst;
        s->have_logits = true;
    }
#endif
    if (n_prompt == 0 && !s->have_logits)
        return err_set(&s->err, ENGINE_ERR_INVALID_ARG, "empty prompt and nothing evaluated before it");

    engine_sampler *smp = NULL;
    if (engine_sampler_create(&p.sampling, &smp) != ENGINE_OK)
        return err_set(&s->err, ENGINE_ERR_INVALID_ARG,
                       "bad sampling parameters (temperature >= 0, top_k >= 0, 0 < top_p <= 1, 0 <= min_p <= 1, "
                       "repeat_penalty > 0)");
    const engine_model *m = s->model;
    tok_stream *ts = NULL;
    if (p.on_token && m->tokenizer) {
        ts = tok_stream_new(m->tokenizer->tok, true);
        if (!ts) {
            engine_sampler_free(smp);
            return err_set(&s->err, ENGINE_ERR_OUT_OF_MEMORY, "out of memory for the text stream");
        }
        /* Feed the context first so that the generated text continues it
         * (a leading space is kept, a split character completes). */
        const char *text;
        size_t len;
        for (int i = 0; i < s->n_past; i++)
            tok_stream_push(ts, s->tokens[i], &text, &len);
        for (size_t i = 0; i < n_prompt; i++)
            tok_stream_push(ts, prompt[i], &text, &len);
    }

    engine_status st = ENGINE_OK;
    engine_generate_stats gs;
    memset(&gs, 0, sizeof gs);
    gs.n_prompt = n_prompt;
    double t0 = model_seconds();
    const float *logits = s->logits;
    /* Without a repetition penalty a GPU session keeps the logits on the
     * device: greedy takes the argmax there, sampling brings back only the
     * candidates within reach of a draw (see sample.cu). */
    const bool on_device = s->cuda && p.sampling.repeat_penalty == 1.0f && n_prompt > 0;
    const bool device_greedy = on_device && p.sampling.temperature <= 0.0f;
    int32_t next = -1;
#ifdef ENGINE_HAVE_CUDA
    bool queued = false; /* the device greedy step of the next id is queued */
#endif
    if (n_prompt)
        st = session_eval(s, prompt, n_prompt, on_device ? NULL : &logits, device_greedy ? &next : NULL);
    double t1 = model_seconds();
    gs.prompt_seconds = t1 - t0;
    gs.stop = ENGINE_STOP_LENGTH;

    for (int i = 0; st == ENGINE_OK && i < p.n_predict; i++) {
        int32_t id = device_greedy ? next
                     : on_device   ? sample_on_device(s, smp, &st)
                                   : engine_sampler_sample(smp, logits, m->cfg.vocab_size, s->tokens, (size_t)s->n_past);
        if (st != ENGINE_OK)
            break;
        if (id < 0) { /* the sampler found no logit that is a number */
            st = err_set(&s->err, ENGINE_ERR_FORMAT,
                         "every logit is NaN after %d tokens: the weights hold NaN or the activations overflowed",
                         s->n_past);
            break;
        }
        if (out_ids && gs.n_generated < cap)
            out_ids[gs.n_generated] = id;
        gs.n_generated++;
        if (p.on_token) {
            const char *text = "";
            size_t len = 0;
            if (ts)
                tok_stream_push(ts, id, &text, &len);
            if (p.on_token(id, text, len, p.user)) {
                gs.stop = ENGINE_STOP_CALLBACK;
                break;
            }
        }
        if (engine_model_is_eos(m, id)) {
            gs.stop = ENGINE_STOP_EOS;
            break;
        }
        if (i + 1 == p.n_predict)
            break;
        if (s->n_past >= s->n_ctx) {
            gs.stop = ENGINE_STOP_CONTEXT;
            break;
        }
#ifdef ENGINE_HAVE_CUDA
        if (device_greedy) {
            st = greedy_next(s, id, i + 2 < p.n_predict, &queued, &next);
            continue;
        }
#endif
        st = session_eval(s, &id, 1, on_device ? NULL : &logits, device_greedy ? &next : NULL);
    }
#ifdef ENGINE_HAVE_CUDA
    if (device_greedy) { /* a step queued for a token that was not taken: discarded */
        if (queued)
            cuda_greedy_drop(s);
        s->have_logits = false;
        s->device_logits = st == ENGINE_OK;
    }
#endif
    gs.gen_seconds = model_seconds() - t1;
    if (ts) {
        const char *text;
        size_t len;
        if (st == ENGINE_OK && gs.stop != ENGINE_STOP_CALLBACK && tok_stream_flush(ts, &text, &len) == ENGINE_OK &&
            len > 0)
            p.on_token(-1, text, len, p.user);
        tok_stream_free(ts);
    }
    engine_sampler_free(smp);
    if (n_out)
        *n_out = gs.n_generated;
    if (stats)
        *stats = gs;
    return st;
}
