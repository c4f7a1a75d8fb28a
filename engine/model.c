/*
 * model.c: engine_model_load and friends. Resolves what the user named (a
 * .safetensors file, a folder, or a sharded index) to the files of a
 * checkpoint, reads the config, picks the architecture's feature row, maps
 * and binds the weights, and loads the tokenizer when there is one.
 */
#define _POSIX_C_SOURCE 200809L /* mmap, clock_gettime, PATH_MAX under -std=c11 */

#include <limits.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "../quant/quant.h"
#include "chat.h"
#include "model.h"
#include "trace.h"
#ifdef ENGINE_HAVE_CUDA
#include "cuda/backend.h"
#endif

double model_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void model_log(const engine_model *m, engine_log_level level, const char *fmt, ...)
{
    if (!m || !m->log)
        return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    m->log(level, line, m->log_user);
}

engine_model_params engine_model_default_params(void)
{
    engine_model_params p;
    memset(&p, 0, sizeof p);
    p.device = ENGINE_DEVICE_AUTO;
    p.host_layers = -1;
    return p;
}

static bool is_file(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

engine_status model_resolve_paths(const char *path, char *dir, char *weights, err_buf *e)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return err_set(e, ENGINE_ERR_IO, "%s: no such file or folder", path);
    if (S_ISDIR(st.st_mode)) {
        snprintf(dir, PATH_MAX, "%s", path);
        snprintf(weights, PATH_MAX, "%s/model.safetensors.index.json", path);
        if (is_file(weights))
            return ENGINE_OK;
        snprintf(weights, PATH_MAX, "%s/model.safetensors", path);
        if (is_file(weights))
            return ENGINE_OK;
        return err_set(e, ENGINE_ERR_IO, "%s: folder holds neither model.safetensors nor model.safetensors.index.json",
                       path);
    }
    if (!ends_with(path, ".safetensors") && !ends_with(path, ".json"))
        return err_set(e, ENGINE_ERR_FORMAT, "%s: expected a .safetensors file, an index .json or a folder", path);
    snprintf(weights, PATH_MAX, "%s", path);
    snprintf(dir, PATH_MAX, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = '\0';
    else
        snprintf(dir, PATH_MAX, ".");
    return ENGINE_OK;
}

static void add_eos(engine_model *m, int32_t id)
{
    if (id < 0)
        return;
    for (int i = 0; i < m->n_eos; i++)
        if (m->eos[i] == id)
            return;
    if (m->n_eos < MODEL_MAX_EOS)
        m->eos[m->n_eos++] = id;
}

static const char *dtype_label(k_dtype t)
{
    switch (t) {
    case K_F16: return "f16";
    case K_BF16: return "bf16";
    case K_I8: return "int8";
    case K_NF4: return "nf4";
    case K_FP4: return "fp4";
    default: return "f32";
    }
}

static const char *dominant_dtype(const engine_model *m)
{
    /* The layers decide: embeddings may be kept wider, and stay dense when
     * the layers are quantized. */
    if (m->cfg.n_layers > 0 && (m->layers[0].wq.dtype != K_F32 || m->tok_emb.dtype == K_F32))
        return dtype_label(m->layers[0].wq.dtype);
    return dtype_label(m->tok_emb.dtype);
}

/* Room in m->owned for every matrix a model may quantize while loading: 7
 * a layer (an expert layer: 3 an expert and 3 for a shared expert more)
 * and the head. */
static engine_status owned_reserve(engine_model *m, const char *path, err_buf *e)
{
    if (m->owned)
        return ENGINE_OK;
    m->owned = calloc((size_t)m->cfg.n_layers * (7 + 3 * ((size_t)m->cfg.n_experts + 1)) + 1, sizeof *m->owned);
    return m->owned ? ENGINE_OK : err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
}

/* *w quantized into memory the model owns; `shared`: *w's bytes stay in use elsewhere (the tied table). */
static engine_status own_quantized(engine_model *m, k_weight *w, const q_spec *spec, bool shared, const char *name,
                                   err_buf *e)
{
    q_weight *qw = &m->owned[m->n_owned];
    engine_status st = q_quantize_weight(w, spec, m->n_threads, qw, name, e);
    if (st)
        return st;
    m->n_owned++;
    m->weight_bytes = m->weight_bytes - (shared ? 0 : k_weight_bytes(w)) + k_weight_bytes(&qw->w);
    m->owned_bytes += qw->bytes;
    *w = qw->w;
    return ENGINE_OK;
}

/*
 * Quantize the decoder layers' dense linear weights into memory the model
 * owns (embeddings, norms, biases and lm_head stay as stored, as
 * tools/quantize leaves them by default). Already quantized tensors stay.
 */
static engine_status quantize_on_load(engine_model *m, engine_quant q, const char *path, err_buf *e)
{
    q_spec spec;
    if (!quant_spec_of(q, &spec))
        return err_set(e, ENGINE_ERR_INVALID_ARG, "%s: unknown quantization %d", path, (int)q);
    engine_status st = owned_reserve(m, path, e);
    const int before = m->n_owned;
    for (int l = 0; !st && l < m->cfg.n_layers; l++) {
        layer_weights *L = &m->layers[l];
        /* An expert layer's experts are linear weights like the rest (its
         * router and the shared expert's gate stay as stored, as bitsandbytes
         * leaves them: a rounded router would change which experts run). */
        k_weight *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down,
                          &L->shared.w_gate, &L->shared.w_up, &L->shared.w_down};
        const int n_dense = (int)(sizeof ws / sizeof ws[0]), n_exp = L->experts ? 3 * m->cfg.n_experts : 0;
        for (int i = 0; !st && i < n_dense + n_exp; i++) {
            const int j = i - n_dense;
            k_weight *w = i < n_dense ? ws[i]
                          : j % 3 == 0 ? &L->experts[j / 3].w_gate
                          : j % 3 == 1 ? &L->experts[j / 3].w_up
                                       : &L->experts[j / 3].w_down;
            if (!w->data || k_dtype_is_quant(w->dtype))
                continue;
            char name[96];
            if (i < n_dense)
                snprintf(name, sizeof name, "%s: layer %d matrix %d", path, l, i);
            else
                snprintf(name, sizeof name, "%s: layer %d expert %d matrix %d", path, l, (i - n_dense) / 3,
                         (i - n_dense) % 3);
            st = own_quantized(m, w, &spec, false, name, e);
            m->n_quantized += !st;
        }
    }
    if (!st)
        model_log(m, ENGINE_LOG_INFO, "%s: %d matrices quantized to %s while loading (%.1f MiB)", path,
                  m->n_owned - before, q_spec_name(&spec), m->owned_bytes / 1048576.0);
    return st;
}

/*
 * The output head quantized while loading (engine_model_params.quant_head).
 * A tied head becomes a quantized copy: the embedding table stays as
 * stored for the lookups.
 */
static engine_status quantize_head(engine_model *m, engine_quant q, const char *path, err_buf *e)
{
    q_spec spec;
    if (!quant_spec_of(q, &spec))
        return err_set(e, ENGINE_ERR_INVALID_ARG, "%s: unknown quantization %d for the output head", path, (int)q);
    if (k_dtype_is_quant(m->lm_head.dtype))
        return ENGINE_OK; /* stored quantized already */
    engine_status st = owned_reserve(m, path, e);
    const bool tied = m->lm_head.data == m->tok_emb.data;
    char name[PATH_MAX + 32];
    snprintf(name, sizeof name, "%s: the output head", path);
    if (!st)
        st = own_quantized(m, &m->lm_head, &spec, tied, name, e);
    if (!st)
        model_log(m, ENGINE_LOG_INFO, "%s: the output head quantized to %s while loading (%s%d x %d)", path,
                  q_spec_name(&spec), tied ? "a copy of the tied embedding table, " : "", m->cfg.vocab_size,
                  m->cfg.dim);
    return st;
}

/* A load step as a span on the model's track: `stmt` runs either way. */
#define LOAD_SPAN(m, name, stmt)                                                                   \
    do {                                                                                           \
        const double t0_ = trace_now((m)->trace);                                                  \
        stmt;                                                                                      \
        if ((m)->trace)                                                                            \
            trace_span((m)->trace, (m)->trace_tid, name, "load", t0_, trace_now((m)->trace) - t0_);       \
    } while (0)

static engine_status load(engine_model *m, const char *path, err_buf *e)
{
    char dir[PATH_MAX], weights[PATH_MAX], file[PATH_MAX + 32];
    engine_status st = model_resolve_paths(path, dir, weights, e);
    if (st)
        return st;

    snprintf(file, sizeof file, "%s/config.json", dir);
    if (!is_file(file))
        return err_set(e, ENGINE_ERR_IO, "%s: no config.json beside the weights (looked for %s)", path, file);
    LOAD_SPAN(m, "config", st = cfg_load_model(file, &m->cfg, e));
    if (st)
        return st;
    m->arch = arch_find(m->cfg.architecture);
    if (!m->arch)
        return err_set(e, ENGINE_ERR_UNSUPPORTED, "%s: architecture '%s' is not supported (supported: %s)", file,
                       m->cfg.architecture, arch_supported_list());
    if ((st = model_apply_arch(m, file, e)))
        return st;
    snprintf(file, sizeof file, "%s/generation_config.json", dir);
    if ((st = cfg_load_generation(file, &m->gen, e)))
        return st;

    /* st_open validates each file's header and the tensors' extents. */
    LOAD_SPAN(m, "map and validate", st = st_open(weights, &m->weights, e));
    if (st)
        return st;
    m->layers = calloc((size_t)m->cfg.n_layers, sizeof *m->layers);
    if (!m->layers)
        return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "%s: out of memory for %d layers", path, m->cfg.n_layers);
    LOAD_SPAN(m, "bind weights", st = model_bind_weights(m, e));
    if (st)
        return st;
    m->weight_dtype = dominant_dtype(m);

    snprintf(file, sizeof file, "%s/tokenizer.json", dir);
    if (is_file(file)) {
        char tcfg[PATH_MAX + 32];
        snprintf(tcfg, sizeof tcfg, "%s/tokenizer_config.json", dir);
        m->tokenizer = calloc(1, sizeof *m->tokenizer);
        if (!m->tokenizer)
            return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "%s: out of memory", file);
        LOAD_SPAN(m, "tokenizer", st = tok_load(file, is_file(tcfg) ? tcfg : NULL, &m->tokenizer->tok, e));
        if (st)
            return st;
        if ((st = chat_source_load(dir, is_file(tcfg) ? tcfg : NULL, &m->tokenizer->chat, e)))
            return st;
    }

    for (int i = 0; i < m->cfg.n_eos; i++)
        add_eos(m, m->cfg.eos_ids[i]);
    for (int i = 0; i < m->gen.n_eos; i++)
        add_eos(m, m->gen.eos_ids[i]);
    if (m->tokenizer) {
        add_eos(m, tok_eos(m->tokenizer->tok));
        /* An instruct model ends its turn with the template's end-of-turn
         * token, which its configs do not always list (chat.h). */
        int32_t eot[MODEL_MAX_EOS];
        const int n_eot = chat_end_of_turn_ids(m->tokenizer->chat, m->tokenizer->tok, eot, MODEL_MAX_EOS);
        for (int i = 0; i < n_eot && i < MODEL_MAX_EOS; i++)
            add_eos(m, eot[i]);
    }
    return ENGINE_OK;
}

/* The load's span and the metadata the trace carries: model, device, plan, budget. */
/*
 * What keeps the CUDA backend from running the model: NULL when nothing
 * does; else what follows the architecture's name in the message ("" where
 * the whole architecture is missing, arch.c's cuda column).
 */
static const char *cuda_gap(const engine_model *m)
{
    const cfg_model *c = &m->cfg;
    if (!m->arch->cuda)
        return "";
    /* The decode pass keeps a scaled block output after the ffn_dim values
     * the down projection reads (cuda/state.h); every real model has room. */
    if (model_block_out_scaled(m) && c->ffn_dim < c->dim)
        return " with intermediate_size below hidden_size";
    return NULL;
}

static void trace_model(engine_model *m, const char *path, double t0)
{
    char args[640], a[64];
    trace_span_args(m->trace, m->trace_tid, "load", -1, "load", t0, trace_now(m->trace) - t0, "layers", m->cfg.n_layers,
                    "weight_bytes", (double)m->weight_bytes);
    snprintf(args, sizeof args, "%s (%s, %d layers, %s)", path, m->cfg.architecture, m->cfg.n_layers, m->weight_dtype);
    trace_meta(m->trace, "model", args);
    trace_meta(m->trace, "device", m->device == ENGINE_DEVICE_CUDA ? "cuda" : "cpu");
    const engine_plan *plan = engine_model_plan(m);
    if (plan) {
        trace_meta(m->trace, "plan", engine_plan_summary(plan));
        const uint64_t budget = engine_plan_get_totals(plan)->budget;
        trace_meta(m->trace, "budget", engine_format_bytes(budget, a, sizeof a));
        trace_meta_num(m->trace, "budget_bytes", (double)budget);
    } else {
        snprintf(args, sizeof args, "all %d layers on the CPU, read from the file mapping", m->cfg.n_layers);
        trace_meta(m->trace, "plan", args);
        trace_meta(m->trace, "budget", "none (CPU)");
    }
}

engine_status engine_model_load(const char *path, const engine_model_params *params, engine_model **out, char *err,
                                size_t err_size)
{
    err_buf e;
    err_clear(&e);
    if (out)
        *out = NULL;
    if (!path || !out) {
        err_set(&e, ENGINE_ERR_INVALID_ARG, "engine_model_load: path and out must not be NULL");
        err_copy_out(&e, err, err_size);
        return ENGINE_ERR_INVALID_ARG;
    }
    engine_model_params p = params ? *params : engine_model_default_params();
    if (!engine_kv_type_name(p.kv_type) || (p.n_ctx < 0 && p.n_ctx != ENGINE_CTX_MAX)) {
        err_set(&e, ENGINE_ERR_INVALID_ARG, "%s: %s %d is not valid", path,
                engine_kv_type_name(p.kv_type) ? "context length" : "KV cache type",
                engine_kv_type_name(p.kv_type) ? p.n_ctx : (int)p.kv_type);
        err_copy_out(&e, err, err_size);
        return ENGINE_ERR_INVALID_ARG;
    }
    char why[256] = "this build of libengine has no CUDA backend";
    bool have_gpu = false;
#ifdef ENGINE_HAVE_CUDA
    if (p.device != ENGINE_DEVICE_CPU)
        have_gpu = cuda_available(why, sizeof why);
#endif
    if (p.device == ENGINE_DEVICE_CUDA && !have_gpu) {
        err_set(&e, ENGINE_ERR_UNSUPPORTED, "%s: cannot run on CUDA: %s (use --device cpu)", path, why);
        err_copy_out(&e, err, err_size);
        return ENGINE_ERR_UNSUPPORTED;
    }
    engine_model *m = calloc(1, sizeof *m);
    if (!m) {
        err_set(&e, ENGINE_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
        err_copy_out(&e, err, err_size);
        return ENGINE_ERR_OUT_OF_MEMORY;
    }
    m->log = p.log;
    m->log_user = p.log_user;
    m->n_threads = p.n_threads > 0 ? p.n_threads : omp_get_num_procs();
    m->plan_ctx = p.n_ctx > 0 || p.n_ctx == ENGINE_CTX_MAX ? p.n_ctx : 0;
    m->kv_type = p.kv_type;
    m->min_streamed = p.min_layers_streamed > 0 ? p.min_layers_streamed : 0;
    m->host_layers = p.host_layers;
    m->moe_cpu = p.moe_cpu > 0 ? p.moe_cpu : 0;
    m->moe_host = p.moe_host; /* checked by the plan (CUDA only) */
    m->expert_cache = p.expert_cache;
    m->hbm_gbps = p.hbm_gbps;
    m->pcie_gbps = p.pcie_gbps;
    m->device = have_gpu ? ENGINE_DEVICE_CUDA : ENGINE_DEVICE_CPU;
    m->trace = p.trace;
    m->trace_tid = trace_track(m->trace, "load");
    const double load_t0 = trace_now(m->trace);
    engine_status st = load(m, path, &e);
    /* An architecture, or a feature of one, the CUDA backend does not run
     * yet: --device cuda fails, auto runs it on the CPU (README, "Supported
     * architectures"). */
    if (!st && m->device == ENGINE_DEVICE_CUDA && cuda_gap(m)) {
        if (p.device == ENGINE_DEVICE_CUDA)
            st = err_set(&e, ENGINE_ERR_UNSUPPORTED, "%s: %s (%s)%s is not yet supported on CUDA; use --device cpu",
                         path, m->arch->label, m->arch->name, cuda_gap(m));
        else
            m->device = ENGINE_DEVICE_CPU;
    }
    if (!st && p.quant != ENGINE_QUANT_NONE) {
        LOAD_SPAN(m, "quantize on load", st = quantize_on_load(m, p.quant, path, &e));
        m->weight_dtype = dominant_dtype(m);
    }
    if (!st && p.quant_head != ENGINE_QUANT_NONE)
        LOAD_SPAN(m, "quantize head", st = quantize_head(m, p.quant_head, path, &e));
#ifdef ENGINE_HAVE_CUDA
    if (!st && m->device == ENGINE_DEVICE_CUDA) {
        LOAD_SPAN(m, "place and upload", st = cuda_model_create(m, p.vram_budget, &m->cuda, &e));
        if (st && e.msg[0] && !strstr(e.msg, path)) {
            char msg[ERR_MSG_MAX];
            snprintf(msg, sizeof msg, "%s", e.msg);
            err_set(&e, st, "%s: %s", path, msg);
        }
        /* The upload read every weight from the mapping. */
        if (!st)
            LOAD_SPAN(m, "check mapping", st = st_check(m->weights, &e));
    }
#endif
    if (st) {
        err_copy_out(&e, err, err_size);
        engine_model_free(m);
        return st;
    }
#ifdef ENGINE_HAVE_CUDA
    /* A CPU-only build runs on the CPU by choice; a CUDA build says why it does. */
    if (p.device == ENGINE_DEVICE_AUTO && !have_gpu)
        model_log(m, ENGINE_LOG_WARN, "no usable GPU (%s): running on the CPU", why);
    else if (p.device == ENGINE_DEVICE_AUTO && m->device == ENGINE_DEVICE_CPU)
        model_log(m, ENGINE_LOG_WARN, "%s%s is not yet supported on CUDA: running on the CPU", m->arch->label,
                  cuda_gap(m) ? cuda_gap(m) : "");
#endif
    if (m->trace)
        trace_model(m, path, load_t0);
    model_log(m, ENGINE_LOG_INFO, "%s: %s, %d layers, dim %d, %llu parameters (%s), on the %s", path,
              m->cfg.architecture, m->cfg.n_layers, m->cfg.dim, (unsigned long long)m->n_params, m->weight_dtype,
              m->device == ENGINE_DEVICE_CUDA ? "GPU" : "CPU");
    *out = m;
    return ENGINE_OK;
}

void engine_model_free(engine_model *m)
{
    if (!m)
        return;
    if (m->tokenizer) {
        tok_free(m->tokenizer->tok);
        chat_source_free(m->tokenizer->chat);
        free(m->tokenizer);
    }
#ifdef ENGINE_HAVE_CUDA
    cuda_model_free(m->cuda);
#endif
    for (int i = 0; i < m->n_owned; i++)
        q_weight_free(&m->owned[i]);
    free(m->owned);
    free(m->experts);
    free(m->layers);
    st_close(m->weights);
    free(m);
}

const engine_plan *engine_model_plan(const engine_model *m)
{
#ifdef ENGINE_HAVE_CUDA
    return m && m->cuda ? cuda_model_plan(m->cuda) : NULL;
#else
    (void)m;
    return NULL;
#endif
}

engine_status engine_device_reserve(uint64_t *bytes)
{
    if (!bytes)
        return ENGINE_ERR_INVALID_ARG;
    *bytes = 0;
#ifdef ENGINE_HAVE_CUDA
    char why[256];
    if (!cuda_available(why, sizeof why))
        return ENGINE_ERR_UNSUPPORTED;
    return cuda_device_reserve(bytes, NULL);
#else
    return ENGINE_ERR_UNSUPPORTED;
#endif
}

engine_status engine_host_layer_rate(const engine_model *m, double *gbps)
{
    if (!m || !gbps || m->cfg.n_layers <= 0)
        return ENGINE_ERR_INVALID_ARG;
    int layers[CPU_RATE_LAYERS], n = 0;
    for (int l = m->cfg.n_layers - 1; l >= 0 && n < CPU_RATE_LAYERS; l--)
        layers[n++] = l;
    *gbps = cpu_layer_rate(m, layers, n, model_host_threads(m)) / 1e9;
    return *gbps > 0.0 ? ENGINE_OK : ENGINE_ERR_OUT_OF_MEMORY;
}

engine_status engine_model_get_info(const engine_model *m, engine_model_info *info)
{
    if (!m || !info)
        return ENGINE_ERR_INVALID_ARG;
    memset(info, 0, sizeof *info);
    info->architecture = m->cfg.architecture;
    info->n_layers = m->cfg.n_layers;
    info->dim = m->cfg.dim;
    info->n_heads = m->cfg.n_heads;
    info->n_kv_heads = m->cfg.n_kv_heads;
    info->head_dim = m->cfg.head_dim;
    info->ffn_dim = m->cfg.ffn_dim;
    info->vocab_size = m->cfg.vocab_size;
    info->max_context = m->cfg.max_position;
    info->bos_id = m->cfg.bos_id >= 0 ? m->cfg.bos_id : (m->tokenizer ? tok_bos(m->tokenizer->tok) : -1);
    info->eos_id = m->n_eos ? m->eos[0] : -1;
    info->n_params = m->n_params;
    info->weight_bytes = m->weight_bytes;
    info->weight_dtype = m->weight_dtype;
    info->device = m->device;
    info->tied_embeddings = m->lm_head.data == m->tok_emb.data;
    info->head_dtype = dtype_label(m->lm_head.dtype);
    info->n_experts = m->cfg.n_experts;
    info->n_experts_used = m->cfg.n_experts > 0 ? m->cfg.n_experts_used : 0;
    for (int l = 0; l < m->cfg.n_layers; l++)
        for (int x = 0; m->layers[l].experts && x < m->cfg.n_experts; x++) {
            const moe_expert *ex = &m->layers[l].experts[x];
            info->expert_bytes += k_weight_bytes(&ex->w_gate) + k_weight_bytes(&ex->w_up) + k_weight_bytes(&ex->w_down);
        }
    return ENGINE_OK;
}

int engine_model_is_eos(const engine_model *m, int32_t id)
{
    if (!m)
        return 0;
    for (int i = 0; i < m->n_eos; i++)
        if (m->eos[i] == id)
            return 1;
    return 0;
}

const engine_tokenizer *engine_model_tokenizer(const engine_model *m)
{
    return m ? m->tokenizer : NULL;
}

const char *engine_model_last_error(const engine_model *m)
{
    return m ? m->err.msg : "";
}
