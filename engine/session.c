/*
 * session.c: a context of tokens over one model. All host memory a session
 * needs (KV cache, activations, RoPE tables, kernel scratch) is one block
 * sized here from the context length; evaluation allocates nothing.
 */
#define _POSIX_C_SOURCE 200809L /* mmap, clock_gettime, PATH_MAX under -std=c11 */

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "plan.h"
#include "trace.h"
#ifdef ENGINE_HAVE_CUDA
#include "cuda/backend.h"
#endif

#define BATCH_MAX 64       /* default tokens per CPU forward pass while reading a prompt */
#define ALIGN 64

engine_session_params engine_session_default_params(void)
{
    engine_session_params p;
    memset(&p, 0, sizeof p);
    return p;
}

/* The engine's KV types are the kernels' (kernels.h says so; this keeps it true). */
_Static_assert((int)K_KV_F32 == (int)ENGINE_KV_F32 && (int)K_KV_F16 == (int)ENGINE_KV_F16 &&
                   (int)K_KV_BF16 == (int)ENGINE_KV_BF16 && (int)K_KV_INT8 == (int)ENGINE_KV_INT8 &&
                   (int)K_KV_FP8 == (int)ENGINE_KV_FP8,
               "k_kv_type and engine_kv_type differ");

static size_t layout(engine_session *s, char *base)
{
    const cfg_model *c = &s->model->cfg;
    const size_t nb = (size_t)s->n_batch, ctx = (size_t)s->n_ctx;
    const size_t qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
    const size_t half = (size_t)c->head_dim / 2;
    uint64_t off = 0;
    s->logits = carve(base, &off, (size_t)c->vocab_size * sizeof(float), ALIGN);
    s->tokens = carve(base, &off, ctx * sizeof(int32_t), ALIGN);
    s->expert_picks = c->n_experts > 0
                          ? carve(base, &off, (size_t)c->n_layers * c->n_experts * sizeof(uint32_t), ALIGN)
                          : NULL;
    if (s->model->device != ENGINE_DEVICE_CPU)
        return off; /* the rest lives on the device */
    /* K, V, then (INT8, FP8) K's scales and V's: the CUDA session's order.
     * Each has every layer's rows, n_ctx or a window layer's ring. */
    const k_kv_type kt = (k_kv_type)s->kv_type;
    const uint64_t rows = model_kv_row0(c, c->n_layers, s->n_ctx, s->kv_ring);
    const uint64_t one = rows * kvd * k_kv_elem_size(kt);
    const uint64_t scales = k_kv_has_scales(kt) ? rows * c->n_kv_heads * sizeof(float) : 0;
    s->k_cache = carve(base, &off, one, ALIGN);
    s->v_cache = carve(base, &off, one, ALIGN);
    s->k_scales = scales ? carve(base, &off, scales, ALIGN) : NULL;
    s->v_scales = scales ? carve(base, &off, scales, ALIGN) : NULL;
    s->kv_bytes = 2 * (one + scales);
    /* fp32 k and v go straight into an fp32 cache; other types, and rings
     * (where a pass's rows may wrap), are stored from these once the pass
     * has normed and rotated them. */
    const bool staged = kt != K_KV_F32 || s->kv_ring > 0;
    s->k_new = staged ? carve(base, &off, nb * kvd * sizeof(float), ALIGN) : NULL;
    s->v_new = staged ? carve(base, &off, nb * kvd * sizeof(float), ALIGN) : NULL;
    s->x = carve(base, &off, nb * c->dim * sizeof(float), ALIGN);
    s->xb = carve(base, &off, nb * c->dim * sizeof(float), ALIGN);
    s->q = carve(base, &off, nb * qd * sizeof(float), ALIGN);
    s->att = carve(base, &off, nb * qd * sizeof(float), ALIGN);
    /* A shared expert may be wider than the dense MLP (model_ffn_max). */
    const size_t ffn = (size_t)model_ffn_max(c);
    s->hb = carve(base, &off, nb * ffn * sizeof(float), ALIGN);
    s->hb2 = carve(base, &off, nb * ffn * sizeof(float), ALIGN);
    if (c->n_experts > 0) {
        const size_t E = (size_t)c->n_experts, slots = nb * (size_t)c->n_experts_used;
        s->moe_logits = carve(base, &off, nb * E * sizeof(float), ALIGN);
        s->moe_w = carve(base, &off, slots * sizeof(float), ALIGN);
        s->moe_tok = carve(base, &off, slots * sizeof(int), ALIGN);
        s->moe_slot = carve(base, &off, slots * sizeof(int), ALIGN);
        s->moe_first = carve(base, &off, 2 * (E + 1) * sizeof(int), ALIGN);
        s->moe_x = carve(base, &off, slots * c->dim * sizeof(float), ALIGN);
        s->moe_h = carve(base, &off, slots * c->moe_ffn_dim * sizeof(float), ALIGN);
        s->moe_h2 = carve(base, &off, slots * c->moe_ffn_dim * sizeof(float), ALIGN);
        s->moe_gate = carve(base, &off, nb * sizeof(float), ALIGN);
    }
    s->rope_cos = carve(base, &off, ctx * half * sizeof(float), ALIGN);
    s->rope_sin = carve(base, &off, ctx * half * sizeof(float), ALIGN);
    const bool local = c->rope_local_theta > 0.0;
    s->rope_cos_local = local ? carve(base, &off, ctx * half * sizeof(float), ALIGN) : NULL;
    s->rope_sin_local = local ? carve(base, &off, ctx * half * sizeof(float), ALIGN) : NULL;
    s->pos = carve(base, &off, nb * sizeof(int), ALIGN);
    s->kc.scratch = carve(base, &off, (size_t)s->kc.n_threads * s->kc.scratch_per_thread * sizeof(float), ALIGN);
    return off;
}

engine_status engine_session_create(engine_model *m, const engine_session_params *params, engine_session **out,
                                    char *err, size_t err_size)
{
    err_buf e;
    err_clear(&e);
    if (out)
        *out = NULL;
    if (!m || !out) {
        err_set(&e, ENGINE_ERR_INVALID_ARG, "engine_session_create: model and out must not be NULL");
        err_copy_out(&e, err, err_size);
        return ENGINE_ERR_INVALID_ARG;
    }
    engine_session_params p = params ? *params : engine_session_default_params();
    const cfg_model *c = &m->cfg;
    int n_ctx = p.n_ctx > 0 ? p.n_ctx
                : p.n_ctx == ENGINE_CTX_MAX ? c->max_position
                : (c->max_position < 4096 ? c->max_position : 4096);
    if ((p.n_ctx < 0 && p.n_ctx != ENGINE_CTX_MAX) || n_ctx <= 0) {
        err_set(&e, ENGINE_ERR_INVALID_ARG, "context length %d is not positive (nor ENGINE_CTX_MAX)", p.n_ctx);
        err_copy_out(&e, err, err_size);
        return ENGINE_ERR_INVALID_ARG;
    }
    if (!engine_kv_type_name(p.kv_type)) {
        err_set(&e, ENGINE_ERR_INVALID_ARG, "KV cache type %d is not an engine_kv_type", (int)p.kv_type);
        err_copy_out(&e, err, err_size);
        return ENGINE_ERR_INVALID_ARG;
    }
    if (p.n_batch < 0) {
        err_set(&e, ENGINE_ERR_INVALID_ARG, "batch size %d is negative (0 = the default)", p.n_batch);
        err_copy_out(&e, err, err_size);
        return ENGINE_ERR_INVALID_ARG;
    }
    engine_session *s = calloc(1, sizeof *s);
    if (!s) {
        err_set(&e, ENGINE_ERR_OUT_OF_MEMORY, "out of memory for a session");
        err_copy_out(&e, err, err_size);
        return ENGINE_ERR_OUT_OF_MEMORY;
    }
    s->model = m;
    s->n_ctx = n_ctx;
    /* The session's type, else the model's; on the CPU AUTO is fp32 (CUDA
     * resolves it in cuda_session_create, where the placement is known). */
    s->kv_type = p.kv_type != ENGINE_KV_AUTO ? p.kv_type : m->kv_type;
    if (m->device == ENGINE_DEVICE_CPU && s->kv_type == ENGINE_KV_AUTO)
        s->kv_type = ENGINE_KV_F32;
    const int batch = p.n_batch > 0 ? p.n_batch : m->device == ENGINE_DEVICE_CPU ? BATCH_MAX : PLAN_CUDA_BATCH;
    s->n_batch = n_ctx < batch ? n_ctx : batch;
    s->kv_ring = model_kv_ring(c, n_ctx, s->n_batch);
    s->kc.n_threads = m->n_threads;
    int max_cols = c->dim;
    if (c->n_heads * c->head_dim > max_cols)
        max_cols = c->n_heads * c->head_dim;
    if (model_ffn_max(c) > max_cols)
        max_cols = model_ffn_max(c);
    size_t per_thread = k_matmul_scratch_floats(max_cols);
    s->kc.scratch_per_thread = per_thread > (size_t)n_ctx ? per_thread : (size_t)n_ctx;

    size_t bytes = layout(s, NULL);
    s->block = aligned_alloc(ALIGN, (bytes + ALIGN - 1) & ~(size_t)(ALIGN - 1));
    if (!s->block) {
        err_set(&e, ENGINE_ERR_OUT_OF_MEMORY, "out of memory: a session of %d tokens needs %.1f MiB", n_ctx,
                bytes / 1048576.0);
        err_copy_out(&e, err, err_size);
        free(s);
        return ENGINE_ERR_OUT_OF_MEMORY;
    }
    s->block_bytes = bytes;
    layout(s, s->block);
    if (s->expert_picks)
        memset(s->expert_picks, 0, (size_t)c->n_layers * c->n_experts * sizeof(uint32_t));
    if (m->device == ENGINE_DEVICE_CPU) {
        rope_tables(c, n_ctx, s->rope_cos, s->rope_sin);
        if (s->rope_cos_local)
            rope_tables_ex(c, n_ctx, true, false, s->rope_cos_local, s->rope_sin_local);
    }
#ifdef ENGINE_HAVE_CUDA
    if (m->device == ENGINE_DEVICE_CUDA) {
        engine_status st = cuda_session_create(s, &s->cuda, &e);
        if (st) {
            err_copy_out(&e, err, err_size);
            engine_session_free(s);
            return st;
        }
        engine_memory_report r;
        engine_session_memory(s, &r);
        bytes = r.device_total;
        s->kv_bytes = r.kv_cache;
    }
#endif
    model_log(m, ENGINE_LOG_INFO, "session: %d tokens of context, %.1f MiB on the %s (KV cache %s, %.1f MiB)",
              n_ctx, bytes / 1048576.0, m->device == ENGINE_DEVICE_CUDA ? "GPU" : "CPU",
              engine_kv_type_name(s->kv_type) ? engine_kv_type_name(s->kv_type) : "?", s->kv_bytes / 1048576.0);
    engine_status st0;
    if (m->trace && (st0 = engine_session_set_trace(s, m->trace))) {
        err_set(&e, st0, "out of memory for the session's trace");
        err_copy_out(&e, err, err_size);
        engine_session_free(s);
        return st0;
    }
    *out = s;
    return ENGINE_OK;
}

engine_status engine_session_set_trace(engine_session *s, engine_trace *t)
{
    if (!s)
        return ENGINE_ERR_INVALID_ARG;
    if (t && !s->trace_t) {
        s->trace_t = malloc(((size_t)s->model->cfg.n_layers + 3) * sizeof *s->trace_t);
        if (!s->trace_t)
            return ENGINE_ERR_OUT_OF_MEMORY;
    }
    if (t && t != s->trace) {
        /* Tracks of their own, so that sessions running at once do not overlap on one. */
        s->trace_tid = trace_track(t, s->cuda ? "session %d (host)" : "session %d (CPU)");
        if (s->cuda) {
            s->trace_gpu_tid = trace_track(t, "GPU compute (track %d)");
            s->trace_copy_tid = trace_track(t, "GPU copy engine (track %d)");
        }
        const char *series[] = {"filled", "capacity"};
        const double v[] = {s->n_past, s->n_ctx};
        trace_counter(t, "KV cache positions", trace_now(t), series, v, 2);
#ifdef ENGINE_HAVE_CUDA
        engine_offload_report r;
        if (s->cuda && engine_session_offload(s, 0, &r) == ENGINE_OK) {
            const char *pin[] = {"bytes"};
            const double pv[] = {(double)r.host_pinned};
            trace_counter(t, "host memory pinned", trace_now(t), pin, pv, 1);
        }
#endif
    }
    s->trace = t;
    return ENGINE_OK;
}

/* After a pass: the session's counters (trace.h; nothing without a trace). */
static void trace_counters(engine_session *s)
{
    const double now = trace_now(s->trace);
    const char *series[] = {"filled", "capacity"};
    const double v[] = {s->n_past, s->n_ctx};
    trace_counter(s->trace, "KV cache positions", now, series, v, 2);
#ifdef ENGINE_HAVE_CUDA
    if (s->cuda) {
        engine_memory_report r;
        engine_session_memory(s, &r);
        const char *dev[] = {"mapped", "in use", "budget"};
        const double dv[] = {(double)r.device_mapped, (double)r.device_total, (double)r.device_budget};
        trace_counter(s->trace, "device memory", now, dev, dv, 3);
    }
#endif
}

/* A pass of n tokens from pos0 that ran over [t0, now): its span, and on the CPU its layers'.
 * prompt: part of a call that evaluates several tokens (else a decode step). */
static void trace_pass(engine_session *s, int n, int pos0, double t0, bool prompt)
{
    const double t1 = trace_now(s->trace);
    trace_span_args(s->trace, s->trace_tid, prompt ? "prompt pass" : "decode step", -1, "step", t0, t1 - t0, "tokens",
                    n, "pos", pos0);
    if (!s->cuda) {
        const int L = s->model->cfg.n_layers;
        const double *b = s->trace_t;
        trace_span(s->trace, s->trace_tid, "embed", "layer", b[0], b[1] - b[0]);
        for (int l = 0; l < L; l++)
            trace_span_args(s->trace, s->trace_tid, "layer", l, "layer", b[1 + l], b[2 + l] - b[1 + l], NULL, 0, NULL,
                            0);
        trace_span(s->trace, s->trace_tid, "head", "layer", b[1 + L], b[2 + L] - b[1 + L]);
    }
    trace_counters(s);
}

void engine_session_free(engine_session *s)
{
    if (!s)
        return;
#ifdef ENGINE_HAVE_CUDA
    cuda_session_free(s->cuda);
#endif
    free(s->trace_t);
    free(s->block);
    free(s);
}

void engine_session_reset(engine_session *s)
{
    if (s) {
        s->n_past = s->kv_end = 0;
        s->have_logits = s->device_logits = false;
    }
}

int engine_session_n_past(const engine_session *s)
{
    return s ? s->n_past : 0;
}

int engine_session_n_ctx(const engine_session *s)
{
    return s ? s->n_ctx : 0;
}

const char *engine_session_last_error(const engine_session *s)
{
    return s ? s->err.msg : "";
}

bool session_kv_holds(const engine_session *s, int k)
{
    if (s->kv_ring <= 0 || k <= 0)
        return true;
    const int first = k - s->model->cfg.sliding_window + 1; /* the oldest position the next pass reads */
    return (int64_t)(first > 0 ? first : 0) + s->kv_ring >= s->kv_end;
}

/* n more ids fit the context and each is in the vocabulary; else the error in s->err. */
static engine_status check_ids(engine_session *s, const int32_t *ids, size_t n)
{
    if ((size_t)s->n_past + n > (size_t)s->n_ctx)
        return err_set(&s->err, ENGINE_ERR_CONTEXT_FULL,
                       "%zu tokens do not fit: %d of the context's %d are used (raise the context length)", n,
                       s->n_past, s->n_ctx);
    const int vocab = s->model->cfg.vocab_size;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab)
            return err_set(&s->err, ENGINE_ERR_INVALID_ARG, "token id %d at index %zu is outside the vocabulary [0, %d)",
                           (int)ids[i], i, vocab);
    return ENGINE_OK;
}

engine_status engine_session_eval(engine_session *s, const int32_t *ids, size_t n, const float **logits)
{
    const float *dummy;
    return session_eval(s, ids, n, logits ? logits : &dummy, NULL);
}

engine_status session_eval(engine_session *s, const int32_t *ids, size_t n, const float **logits, int32_t *argmax)
{
    if (!s)
        return ENGINE_ERR_INVALID_ARG;
    err_clear(&s->err);
    if (logits)
        *logits = NULL;
    if (argmax)
        *argmax = -1;
    if (n == 0)
        return ENGINE_OK;
    if (!ids)
        return err_set(&s->err, ENGINE_ERR_INVALID_ARG, "engine_session_eval: ids is NULL");
    engine_status st0 = check_ids(s, ids, n);
    if (st0)
        return st0;
    /* The CPU pass reads the weights straight from the file mapping: a file
     * truncated since it was loaded is refused here, and one truncated
     * during the pass (its reads gave zeros, see st_guard.h) right after. */
    const bool reads_mapping = !s->cuda;
    engine_status st;
    if (reads_mapping && (st = st_check(s->model->weights, &s->err))) {
        s->have_logits = false;
        return st;
    }
    for (size_t done = 0; done < n;) {
        int chunk = (int)(n - done < (size_t)s->n_batch ? n - done : (size_t)s->n_batch);
        memcpy(s->tokens + s->n_past, ids + done, (size_t)chunk * sizeof *ids);
        const bool last = done + (size_t)chunk == n;
        const int pos0 = s->n_past;
        const double t0 = trace_now(s->trace);
#ifdef ENGINE_HAVE_CUDA
        if (s->cuda) {
            st = cuda_forward(s, ids + done, chunk, last && logits, last ? argmax : NULL, &s->err);
            if (st) {
                s->have_logits = s->device_logits = false;
                return st;
            }
        } else
#endif
            forward_cpu(s, ids + done, chunk, last, NULL);
        if (s->trace)
            trace_pass(s, chunk, pos0, t0, n > 1);
        done += (size_t)chunk;
    }
    if (reads_mapping && (st = st_check(s->model->weights, &s->err))) {
        s->have_logits = false;
        return st;
    }
    /* On the GPU the host logits are current only when they were asked for. */
    s->have_logits = !s->cuda || logits;
    s->device_logits = s->cuda != NULL;
    if (logits)
        *logits = s->logits;
    return ENGINE_OK;
}

/* log of the sum of exp(l[0..n)), in double. */
static double log_sum_exp(const float *l, int n)
{
    double mx = -INFINITY, sum = 0.0;
    for (int i = 0; i < n; i++)
        mx = l[i] > mx ? l[i] : mx;
    for (int i = 0; i < n; i++)
        sum += exp((double)l[i] - mx);
    return mx + log(sum);
}

/* Position i's prediction from its logits row. */
static void score_row(const float *row, int vocab, size_t i, int32_t id, size_t first, double *logprob,
                      engine_score_fn fn, void *user)
{
    const double lse = log_sum_exp(row, vocab);
    if (logprob)
        logprob[i - first] = (double)row[id] - lse;
    if (fn)
        fn(i, row, vocab, lse, user);
}

#ifdef ENGINE_HAVE_CUDA
/*
 * Scoring on the GPU. Each pass of up to n_batch ids leaves its rows' hidden
 * states on the device; the head and the log-sum-exp of the scored rows run
 * there (cuda_score_rows), and only two figures per row come back unless fn
 * wants the rows. The pass's last row comes back as its logits anyway. With
 * a streamed head the rows are scored one token at a time.
 */
static engine_status score_cuda(engine_session *s, const int32_t *ids, size_t n, size_t first, double *logprob,
                                engine_score_fn fn, void *user)
{
    const int vocab = s->model->cfg.vocab_size, per = cuda_score_rows_max(s);
    const float *l = NULL;
    engine_status st;
    if (per == 0) {
        if ((st = session_eval(s, ids, first, &l, NULL)))
            return st;
        for (size_t i = first; i < n; i++) {
            score_row(l, vocab, i, ids[i], first, logprob, fn, user);
            if ((st = session_eval(s, &ids[i], 1, &l, NULL)))
                return st;
        }
        return ENGINE_OK;
    }
    float *figs = malloc(2 * (size_t)per * sizeof *figs), *rows = fn ? malloc((size_t)per * vocab * sizeof *rows) : NULL;
    if (!figs || (fn && !rows)) {
        free(figs), free(rows);
        return err_set(&s->err, ENGINE_ERR_OUT_OF_MEMORY, "out of memory for %d rows of %d logits", per, vocab);
    }
    st = ENGINE_OK;
    for (size_t done = 0; done < n && !st;) {
        const size_t chunk = n - done < (size_t)s->n_batch ? n - done : (size_t)s->n_batch;
        if ((st = session_eval(s, ids + done, chunk, &l, NULL)))
            break;
        /* Row j predicts ids[done + j + 1]: scored for j in [lo, hi); the last row (chunk - 1) is l. */
        const size_t lo = first > done + 1 ? first - done - 1 : 0;
        const size_t hi = n - done - 1 < chunk ? n - done - 1 : chunk;
        const size_t dev_hi = hi < chunk - 1 ? hi : chunk - 1;
        for (size_t a = lo; a < dev_hi && !st; a += (size_t)per) {
            const size_t b = dev_hi - a < (size_t)per ? dev_hi : a + (size_t)per;
            if ((st = cuda_score_rows(s, (int)a, (int)b, ids + done + a + 1, figs, rows, &s->err)))
                break;
            for (size_t j = a; j < b; j++) {
                const size_t i = done + j + 1;
                const double lse = figs[2 * (j - a)];
                if (logprob)
                    logprob[i - first] = (double)figs[2 * (j - a) + 1] - lse;
                if (fn)
                    fn(i, rows + (j - a) * (size_t)vocab, vocab, lse, user);
            }
        }
        if (!st && hi == chunk && lo < chunk)
            score_row(l, vocab, done + chunk, ids[done + chunk], first, logprob, fn, user);
        done += chunk;
    }
    free(figs), free(rows);
    return st;
}
#endif

engine_status engine_session_score(engine_session *s, const int32_t *ids, size_t n, size_t first, double *logprob,
                                   engine_score_fn fn, void *user)
{
    if (!s)
        return ENGINE_ERR_INVALID_ARG;
    err_clear(&s->err);
    if (!ids || n == 0 || first < 1 || first > n || (!logprob && !fn))
        return err_set(&s->err, ENGINE_ERR_INVALID_ARG,
                       "engine_session_score: needs ids, 1 <= first <= n (first %zu, n %zu) and logprob or fn", first,
                       n);
    engine_status st0 = check_ids(s, ids, n);
    if (st0)
        return st0;
    const int vocab = s->model->cfg.vocab_size;
    engine_status st;
#ifdef ENGINE_HAVE_CUDA
    if (s->cuda)
        return score_cuda(s, ids, n, first, logprob, fn, user);
#endif
    float *rows = malloc((size_t)s->n_batch * vocab * sizeof *rows);
    if (!rows)
        return err_set(&s->err, ENGINE_ERR_OUT_OF_MEMORY, "out of memory for %d rows of %d logits", s->n_batch, vocab);
    if ((st = st_check(s->model->weights, &s->err))) {
        s->have_logits = false;
        free(rows);
        return st;
    }
    for (size_t done = 0; done < n;) {
        const int chunk = (int)(n - done < (size_t)s->n_batch ? n - done : (size_t)s->n_batch);
        const bool last = done + (size_t)chunk == n;
        /* Row j predicts ids[done + j + 1]; rows are needed where that index is scored. */
        const bool need = done + (size_t)chunk >= first;
        memcpy(s->tokens + s->n_past, ids + done, (size_t)chunk * sizeof *ids);
        const int pos0 = s->n_past;
        const double t0 = trace_now(s->trace);
        forward_cpu(s, ids + done, chunk, last, need || last ? rows : NULL);
        if (s->trace)
            trace_pass(s, chunk, pos0, t0, true);
        for (int j = 0; need && j < chunk; j++) {
            const size_t i = done + (size_t)j + 1;
            if (i >= first && i < n)
                score_row(rows + (size_t)j * vocab, vocab, i, ids[i], first, logprob, fn, user);
        }
        done += (size_t)chunk;
    }
    free(rows);
    if ((st = st_check(s->model->weights, &s->err))) {
        s->have_logits = false;
        return st;
    }
    s->have_logits = true;
    s->device_logits = false;
    return ENGINE_OK;
}

engine_status engine_session_memory(const engine_session *s, engine_memory_report *r)
{
    if (!s || !r)
        return ENGINE_ERR_INVALID_ARG;
    memset(r, 0, sizeof *r);
    /* Weights quantized while loading live in model memory, not the mapping. */
    r->weights_mapped = s->model->weight_bytes - s->model->owned_bytes;
    r->weights_owned = s->model->owned_bytes;
    r->kv_cache = s->kv_bytes;
    r->activations = s->block_bytes - s->kv_bytes;
    r->host_total = s->block_bytes + s->model->owned_bytes;
#ifdef ENGINE_HAVE_CUDA
    if (s->cuda)
        cuda_memory(s, r);
#endif
    return ENGINE_OK;
}

engine_status engine_session_expert_picks(engine_session *s, int layer, uint32_t *counts, int n)
{
    if (!s || !counts)
        return ENGINE_ERR_INVALID_ARG;
    const cfg_model *c = &s->model->cfg;
    if (layer < 0 || layer >= c->n_layers || !s->model->layers[layer].experts || n < c->n_experts)
        return err_set(&s->err, ENGINE_ERR_INVALID_ARG,
                       "engine_session_expert_picks: layer %d is not an expert layer of %d, or %d counts are fewer "
                       "than its %d experts",
                       layer, c->n_layers, n, c->n_experts);
    memcpy(counts, s->expert_picks + (size_t)layer * c->n_experts, (size_t)c->n_experts * sizeof *counts);
#ifdef ENGINE_HAVE_CUDA
    if (s->cuda)
        return cuda_expert_picks(s, layer, counts, &s->err);
#endif
    return ENGINE_OK;
}

engine_status engine_session_offload(engine_session *s, int n_decode, engine_offload_report *r)
{
    if (!s || !r)
        return ENGINE_ERR_INVALID_ARG;
    memset(r, 0, sizeof *r);
    r->n_layers = s->model->cfg.n_layers;
#ifdef ENGINE_HAVE_CUDA
    if (s->cuda)
        return cuda_offload_report(s, n_decode, r, &s->err);
#else
    (void)n_decode;
#endif
    return ENGINE_OK;
}
