/*
 * config.c: Hugging Face config.json and generation_config.json into
 * cfg_model / cfg_generation. Defaults follow what transformers derives when
 * a field is absent; every field is type-checked, and the derived shape is
 * checked for consistency before anything downstream sizes buffers from it.
 */
#define _POSIX_C_SOURCE 200809L

#include "config.h"
#include "json_kind.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* A config is a few KB; anything this large is not one. */
#define CFG_MAX_FILE (16L << 20)

/* Where a value came from, for messages: "<path>: '<prefix><key>' ...". */
typedef struct cfg_ctx {
    const char *path;
    const char *prefix; /* "" or "rope_scaling." */
    err_buf *e;
} cfg_ctx;

/* obj[key], with JSON null read as absent (transformers writes null for "unset"). */
static const json_t *cfg_get(const json_t *obj, const char *key)
{
    const json_t *v = json_object_get(obj, key);
    return json_is_null(v) ? NULL : v;
}

static engine_status cfg_type_error(const cfg_ctx *c, const char *key, const char *want, const json_t *v)
{
    return err_set(c->e, ENGINE_ERR_FORMAT, "%s: '%s%s' must be %s, not %s", c->path, c->prefix, key, want,
                   json_kind(v));
}

/* An integer-valued JSON number as long long; integral reals (8192.0) pass. */
static bool cfg_as_integer(const json_t *v, long long *out)
{
    if (json_is_integer(v)) {
        *out = (long long)json_integer_value(v);
        return true;
    }
    if (json_is_real(v)) {
        double d = json_real_value(v);
        if (d == floor(d) && fabs(d) < 9.0e15) {
            *out = (long long)d;
            return true;
        }
    }
    return false;
}

/*
 * *out = obj[key] when it is an integer in [lo, INT_MAX]; absent: def, or an
 * error when required.
 */
static engine_status cfg_int(const cfg_ctx *c, const json_t *obj, const char *key, bool required, int def, int lo,
                             int *out)
{
    const json_t *v = cfg_get(obj, key);
    if (!v) {
        if (required)
            return err_set(c->e, ENGINE_ERR_FORMAT, "%s: no '%s%s'", c->path, c->prefix, key);
        *out = def;
        return ENGINE_OK;
    }
    long long x;
    if (!cfg_as_integer(v, &x))
        return cfg_type_error(c, key, "an integer", v);
    if (x > INT_MAX)
        return err_set(c->e, ENGINE_ERR_FORMAT, "%s: '%s%s' is %lld; it must fit in 32 bits", c->path, c->prefix,
                       key, x);
    if (x < lo) {
        if (lo == 1)
            return err_set(c->e, ENGINE_ERR_FORMAT, "%s: '%s%s' is %lld; it must be positive", c->path, c->prefix,
                           key, x);
        return err_set(c->e, ENGINE_ERR_FORMAT, "%s: '%s%s' is %lld; it must be at least %d", c->path, c->prefix,
                       key, x, lo);
    }
    *out = (int)x;
    return ENGINE_OK;
}

/* *out = obj[key] as a number > 0 (or >= 0 when !strict); absent: def, or an error when required. */
static engine_status cfg_num(const cfg_ctx *c, const json_t *obj, const char *key, bool required, double def,
                             bool strict, double *out)
{
    const json_t *v = cfg_get(obj, key);
    if (!v) {
        if (required)
            return err_set(c->e, ENGINE_ERR_FORMAT, "%s: no '%s%s'", c->path, c->prefix, key);
        *out = def;
        return ENGINE_OK;
    }
    if (!json_is_number(v))
        return cfg_type_error(c, key, "a number", v);
    double x = json_number_value(v);
    if (strict ? !(x > 0) : !(x >= 0))
        return err_set(c->e, ENGINE_ERR_FORMAT, "%s: '%s%s' is %g; it must be %s", c->path, c->prefix, key, x,
                       strict ? "positive" : "non-negative");
    *out = x;
    return ENGINE_OK;
}

static engine_status cfg_bool(const cfg_ctx *c, const json_t *obj, const char *key, bool def, bool *out)
{
    const json_t *v = cfg_get(obj, key);
    if (!v) {
        *out = def;
        return ENGINE_OK;
    }
    if (!json_is_boolean(v))
        return cfg_type_error(c, key, "true or false", v);
    *out = json_is_true(v);
    return ENGINE_OK;
}

/* A string field into buf; absent: def. Too long is an error, not a silent cut. */
static engine_status cfg_str(const cfg_ctx *c, const json_t *obj, const char *key, const char *def, char *buf,
                             size_t size)
{
    const json_t *v = cfg_get(obj, key);
    const char *s = def;
    if (v) {
        if (!json_is_string(v))
            return cfg_type_error(c, key, "a string", v);
        s = json_string_value(v);
    }
    size_t n = strlen(s);
    if (n >= size)
        return err_set(c->e, ENGINE_ERR_FORMAT, "%s: '%s%s' is %zu bytes long; at most %zu are supported", c->path,
                       c->prefix, key, n, size - 1);
    memcpy(buf, s, n + 1);
    return ENGINE_OK;
}

/* A token id or a list of them (Llama 3.1 ends on any of three). */
static engine_status cfg_ids(const cfg_ctx *c, const json_t *obj, const char *key, int *ids, int *n_ids)
{
    const json_t *v = cfg_get(obj, key);
    *n_ids = 0;
    if (!v)
        return ENGINE_OK;
    size_t n = json_is_array(v) ? json_array_size(v) : 1;
    if (n > CFG_MAX_EOS)
        return err_set(c->e, ENGINE_ERR_UNSUPPORTED, "%s: '%s%s' lists %zu ids; at most %d are supported", c->path,
                       c->prefix, key, n, CFG_MAX_EOS);
    for (size_t i = 0; i < n; i++) {
        const json_t *x = json_is_array(v) ? json_array_get(v, i) : v;
        long long id;
        if (!cfg_as_integer(x, &id) || id < 0 || id > INT_MAX)
            return err_set(c->e, ENGINE_ERR_FORMAT, "%s: '%s%s' must be a token id or a list of them", c->path,
                           c->prefix, key);
        ids[i] = (int)id;
    }
    *n_ids = (int)n;
    return ENGINE_OK;
}

/* Whole file to a JSON object. A missing file is ENGINE_ERR_IO with errno kept in *err_no. */
static engine_status cfg_load_json(const char *path, json_t **out, int *err_no, err_buf *e)
{
    *out = NULL;
    *err_no = 0;
    char eb[128];
    FILE *f = fopen(path, "rb");
    if (!f) {
        *err_no = errno;
        if (strerror_r(*err_no, eb, sizeof eb) != 0)
            snprintf(eb, sizeof eb, "error %d", *err_no);
        return err_set(e, ENGINE_ERR_IO, "%s: cannot open: %s", path, eb);
    }
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fclose(f);
        return err_set(e, ENGINE_ERR_IO, "%s: not a regular file", path);
    }
    if (sb.st_size > CFG_MAX_FILE) {
        fclose(f);
        return err_set(e, ENGINE_ERR_FORMAT, "%s: %lld bytes is too large for a config file", path,
                       (long long)sb.st_size);
    }
    const size_t size = (size_t)sb.st_size;
    char *buf = malloc(size + 1);
    size_t n = buf ? fread(buf, 1, size, f) : 0;
    bool bad_read = buf && (n != size || ferror(f));
    fclose(f);
    if (!buf)
        return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    if (bad_read) {
        free(buf);
        return err_set(e, ENGINE_ERR_IO, "%s: read error", path);
    }
    json_error_t je;
    json_t *root = json_loadb(buf, n, JSON_REJECT_DUPLICATES, &je);
    free(buf);
    if (!root)
        return err_set(e, ENGINE_ERR_FORMAT, "%s: invalid JSON at line %d, column %d: %s", path, je.line, je.column,
                       je.text);
    if (!json_is_object(root)) {
        engine_status st = err_set(e, ENGINE_ERR_FORMAT, "%s: top level is %s, not an object", path, json_kind(root));
        json_decref(root);
        return st;
    }
    *out = root;
    return ENGINE_OK;
}


/*
 * Which layers the sliding window covers. Mistral: all. Qwen2/Qwen3 (they
 * carry use_sliding_window): layers from max_window_layers on, as their
 * transformers configs derive layer_types. transformers 5 writes
 * layer_types itself: full layers followed by sliding ones set
 * sliding_from_layer; any other mix (Gemma's alternation, 5 local to 1
 * global) sets a bit per sliding layer, with sliding_from_layer n_layers.
 */
static engine_status cfg_window_layers(const cfg_ctx *c, const json_t *root, cfg_model *m)
{
    engine_status st;
    m->sliding_from_layer = 0;
    memset(m->sliding_layers, 0, sizeof m->sliding_layers);
    if ((st = cfg_int(c, root, "sliding_window_pattern", false, 0, 1, &m->sliding_window_pattern)))
        return st;
    if (m->sliding_window > 0 && cfg_get(root, "use_sliding_window")) {
        if ((st = cfg_int(c, root, "max_window_layers", false, 28, 0, &m->sliding_from_layer)))
            return st;
        if (m->sliding_from_layer > m->n_layers)
            m->sliding_from_layer = m->n_layers;
    }
    const json_t *types = cfg_get(root, "layer_types");
    m->layer_types_given = types != NULL;
    if (!types)
        return ENGINE_OK;
    if (!json_is_array(types) || json_array_size(types) != (size_t)m->n_layers)
        return err_set(c->e, ENGINE_ERR_FORMAT, "%s: 'layer_types' is not a list of %d layer types", c->path,
                       m->n_layers);
    int first_sliding = m->n_layers;
    bool prefix = true; /* full layers, then only sliding ones */
    for (int l = 0; l < m->n_layers; l++) {
        const char *t = json_string_value(json_array_get(types, (size_t)l));
        bool sliding = t && strcmp(t, "sliding_attention") == 0;
        if (!t || (!sliding && strcmp(t, "full_attention") != 0))
            return err_set(c->e, ENGINE_ERR_UNSUPPORTED, "%s: layer_types[%d] is %s%s%s; supported: full_attention, "
                           "sliding_attention", c->path, l, t ? "'" : "", t ? t : "not a string", t ? "'" : "");
        if (sliding && first_sliding == m->n_layers)
            first_sliding = l;
        if (!sliding && first_sliding < l)
            prefix = false;
    }
    if (first_sliding == m->n_layers || m->sliding_window == 0) {
        m->sliding_window = 0, m->sliding_from_layer = 0;
    } else if (prefix) {
        m->sliding_from_layer = first_sliding;
    } else {
        if (m->n_layers > CFG_MAX_LAYERS)
            return err_set(c->e, ENGINE_ERR_UNSUPPORTED, "%s: layer_types mixes full and sliding layers over %d "
                           "layers; at most %d supported", c->path, m->n_layers, CFG_MAX_LAYERS);
        m->sliding_from_layer = m->n_layers;
        for (int l = 0; l < m->n_layers; l++)
            if (strcmp(json_string_value(json_array_get(types, (size_t)l)), "sliding_attention") == 0)
                m->sliding_layers[l / 64] |= 1ull << (l % 64);
    }
    return ENGINE_OK;
}

/*
 * A soft-capping value: the number, 0 for null (transformers' "none"), -1
 * when absent (the architecture's default applies, model.c).
 */
static engine_status cfg_softcap(const cfg_ctx *c, const json_t *root, const char *key, double *out)
{
    const json_t *v = json_object_get(root, key);
    if (!v) {
        *out = -1.0;
        return ENGINE_OK;
    }
    if (json_is_null(v)) {
        *out = 0.0;
        return ENGINE_OK;
    }
    return cfg_num(c, root, key, true, 0.0, true, out);
}

/* ------------------------------------------------------------ config.json */

/* A list of n numbers (longrope's factors) into out[n]; they must be positive. */
static engine_status cfg_factors(const cfg_ctx *c, const json_t *r, const char *key, int n, float *out)
{
    const json_t *v = cfg_get(r, key);
    if (!v)
        return err_set(c->e, ENGINE_ERR_FORMAT, "%s: no '%s%s'", c->path, c->prefix, key);
    if (!json_is_array(v) || json_array_size(v) != (size_t)n)
        return err_set(c->e, ENGINE_ERR_FORMAT, "%s: '%s%s' must be a list of %d numbers (rotary_dim / 2)", c->path,
                       c->prefix, key, n);
    for (int i = 0; i < n; i++) {
        const json_t *x = json_array_get(v, (size_t)i);
        if (!json_is_number(x) || !(json_number_value(x) > 0))
            return err_set(c->e, ENGINE_ERR_FORMAT, "%s: '%s%s'[%d] must be a positive number", c->path, c->prefix,
                           key, i);
        out[i] = (float)json_number_value(x); /* transformers holds them as float32 */
    }
    return ENGINE_OK;
}

/*
 * rotary_dim from partial_rotary_factor (top level, or inside the RoPE
 * object r when r != NULL): transformers rotates int(head_dim * factor)
 * leading elements of each head.
 */
static engine_status cfg_rotary(const cfg_ctx *c, const json_t *root, const json_t *r, const cfg_ctx *rc, cfg_model *m)
{
    engine_status st;
    double prf = 1.0;
    if ((st = cfg_num(c, root, "partial_rotary_factor", false, 1.0, true, &prf)) ||
        (r && (st = cfg_num(rc, r, "partial_rotary_factor", false, prf, true, &prf))))
        return st;
    m->rotary_dim = (int)(m->head_dim * prf);
    if (prf > 1.0 || m->rotary_dim < 2 || m->rotary_dim % 2 != 0)
        return err_set(c->e, ENGINE_ERR_UNSUPPORTED,
                       "%s: partial_rotary_factor %g gives %d rotated elements of head_dim %d; it must be even, "
                       "at least 2 and at most head_dim", c->path, prf, m->rotary_dim, m->head_dim);
    return ENGINE_OK;
}

/*
 * One RoPE parameter object r (found at `where`) into the global fields, or
 * with local into the local layers' (Gemma 3's sliding_attention entry,
 * which may only be default or linear). orig_top: a top-level
 * original_max_position_embeddings (0: none), which transformers prefers to
 * the one inside (Phi-3 keeps it outside).
 */
static engine_status cfg_rope_entry(const cfg_ctx *c, const json_t *root, const json_t *r, const char *where,
                                    bool local, int orig_top, cfg_model *m)
{
    engine_status st;
    if (!json_is_object(r))
        return cfg_type_error(c, where, "an object", r);
    char prefix[64];
    snprintf(prefix, sizeof prefix, "%s.", where);
    const cfg_ctx rc = {c->path, prefix, c->e};
    const json_t *type = cfg_get(r, "rope_type");
    const char *type_key = "rope_type";
    if (!type) {
        type = cfg_get(r, "type"); /* the name before transformers 4.45 */
        type_key = "type";
    }
    if (type && !json_is_string(type))
        return cfg_type_error(&rc, type_key, "a string", type);
    if (!type && cfg_get(r, "factor"))
        return err_set(c->e, ENGINE_ERR_FORMAT, "%s: '%s' has a factor but no 'rope_type'", c->path, where);
    const char *name = type ? json_string_value(type) : "default";
    if (local) {
        const double def = m->rope_local_theta > 0 ? m->rope_local_theta : 10000.0; /* Gemma 3's local default */
        if ((st = cfg_num(&rc, r, "rope_theta", false, def, true, &m->rope_local_theta)))
            return st;
        m->rope_local_type = CFG_ROPE_DEFAULT;
        m->rope_local_factor = 1.0;
        if (strcmp(name, "default") == 0)
            return ENGINE_OK;
        if (strcmp(name, "linear") == 0) {
            m->rope_local_type = CFG_ROPE_LINEAR;
            return cfg_num(&rc, r, "factor", true, 1.0, true, &m->rope_local_factor);
        }
        return err_set(c->e, ENGINE_ERR_UNSUPPORTED,
                       "%s: rope type '%s' (%s.%s) is not supported for sliding layers (supported: default, linear)",
                       c->path, name, where, type_key);
    }
    if ((st = cfg_num(&rc, r, "rope_theta", false, m->rope_theta, true, &m->rope_theta)))
        return st;
    if ((st = cfg_rotary(c, root, r, &rc, m)))
        return st;

    if (strcmp(name, "default") == 0)
        return ENGINE_OK;
    if (strcmp(name, "linear") == 0) {
        m->rope_type = CFG_ROPE_LINEAR;
        return cfg_num(&rc, r, "factor", true, 1.0, true, &m->rope_factor);
    }
    if (strcmp(name, "llama3") == 0) {
        m->rope_type = CFG_ROPE_LLAMA3;
        if ((st = cfg_num(&rc, r, "factor", true, 1.0, true, &m->rope_factor)) ||
            (st = cfg_num(&rc, r, "low_freq_factor", true, 1.0, true, &m->rope_low_freq_factor)) ||
            (st = cfg_num(&rc, r, "high_freq_factor", true, 4.0, true, &m->rope_high_freq_factor)) ||
            (st = cfg_int(&rc, r, "original_max_position_embeddings", true, 0, 1, &m->rope_original_max_position)))
            return st;
        /* The smoothing ramp divides by their difference. */
        if (!(m->rope_high_freq_factor > m->rope_low_freq_factor))
            return err_set(c->e, ENGINE_ERR_FORMAT, "%s: %s.high_freq_factor %g must exceed low_freq_factor %g",
                           c->path, where, m->rope_high_freq_factor, m->rope_low_freq_factor);
        return ENGINE_OK;
    }
    /* Phi-3's configs name it "su" before 4.45; transformers reads that as longrope. */
    if (strcmp(name, "longrope") == 0 || strcmp(name, "su") == 0) {
        m->rope_type = CFG_ROPE_LONGROPE;
        const int n = m->rotary_dim / 2;
        if (n > CFG_MAX_ROPE_FACTORS)
            return err_set(c->e, ENGINE_ERR_UNSUPPORTED, "%s: longrope over %d rotated elements; at most %d supported",
                           c->path, m->rotary_dim, 2 * CFG_MAX_ROPE_FACTORS);
        double factor = 0.0, af = 0.0;
        if ((st = cfg_factors(&rc, r, "short_factor", n, m->rope_short_factor)) ||
            (st = cfg_factors(&rc, r, "long_factor", n, m->rope_long_factor)) ||
            (st = cfg_num(&rc, r, "factor", false, 0.0, true, &factor)) ||
            (st = cfg_num(&rc, r, "attention_factor", false, 0.0, true, &af)) ||
            (st = cfg_int(&rc, r, "original_max_position_embeddings", false, m->max_position, 1,
                          &m->rope_original_max_position)))
            return st;
        if (orig_top > 0)
            m->rope_original_max_position = orig_top;
        /* transformers' default: the context's growth over the original
         * one sets the factor, and the paper's attention factor from it. */
        if (factor == 0.0)
            factor = (double)m->max_position / m->rope_original_max_position;
        m->rope_factor = factor;
        if (af == 0.0)
            af = factor <= 1.0 ? 1.0 : sqrt(1.0 + log(factor) / log((double)m->rope_original_max_position));
        m->rope_attention_factor = af;
        return ENGINE_OK;
    }
    return err_set(c->e, ENGINE_ERR_UNSUPPORTED,
                   "%s: rope type '%s' (%s.%s) is not supported (supported: default, linear, llama3, longrope)",
                   c->path, name, where, type_key);
}

static engine_status cfg_rope(const cfg_ctx *c, const json_t *root, cfg_model *m)
{
    engine_status st;
    int orig_top = 0;
    if ((st = cfg_num(c, root, "rope_theta", false, 10000.0, true, &m->rope_theta)) ||
        (st = cfg_num(c, root, "rope_local_base_freq", false, 0.0, true, &m->rope_local_theta)) ||
        (st = cfg_int(c, root, "original_max_position_embeddings", false, 0, 1, &orig_top)))
        return st;
    m->rope_type = CFG_ROPE_DEFAULT;
    m->rope_factor = 1.0;
    m->rope_low_freq_factor = 0;
    m->rope_high_freq_factor = 0;
    m->rope_original_max_position = 0;
    m->rope_attention_factor = 1.0;
    m->rope_local_type = CFG_ROPE_DEFAULT;
    m->rope_local_factor = 1.0;
    m->rotary_dim = m->head_dim;

    /* transformers >= 5 writes rope_parameters (theta inside); older versions rope_scaling. */
    const char *where = "rope_parameters";
    const json_t *r = cfg_get(root, where);
    if (!r) {
        where = "rope_scaling";
        r = cfg_get(root, where);
    }
    if (!r)
        return cfg_rotary(c, root, NULL, c, m);
    if (!json_is_object(r))
        return cfg_type_error(c, where, "an object", r);
    /* Per-layer-type parameters ({"full_attention": {...},
     * "sliding_attention": {...}}, Gemma 3) hold objects and no type or
     * theta of their own. */
    bool nested = false;
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)r, k, v)
    {
        nested |= json_is_object(v);
    }
    if (!nested || cfg_get(r, "rope_type") || cfg_get(r, "type") || cfg_get(r, "rope_theta"))
        return cfg_rope_entry(c, root, r, where, false, orig_top, m);
    json_object_foreach((json_t *)r, k, v)
    {
        char at[64];
        snprintf(at, sizeof at, "%s.%.30s", where, k);
        const bool local = strcmp(k, "sliding_attention") == 0;
        if (!local && strcmp(k, "full_attention") != 0)
            return err_set(c->e, ENGINE_ERR_UNSUPPORTED,
                           "%s: per-layer-type '%s' entry '%s' is not supported (supported: full_attention, "
                           "sliding_attention)", c->path, where, k);
        if (json_is_null(v))
            continue;
        if ((st = cfg_rope_entry(c, root, v, at, local, orig_top, m)))
            return st;
    }
    return ENGINE_OK;
}

/*
 * The experts' keys. Checkpoints name the expert count either way
 * (num_local_experts: Mixtral, and Qwen3-MoE as transformers 5 saves it;
 * num_experts: Qwen2/3-MoE, OLMoE); whether the architecture uses them is
 * model_apply_arch's to settle.
 */
static engine_status cfg_moe(const cfg_ctx *c, const json_t *root, cfg_model *m)
{
    engine_status st;
    const char *count = cfg_get(root, "num_local_experts") ? "num_local_experts" : "num_experts";
    if ((st = cfg_int(c, root, count, false, 0, 0, &m->n_experts)) ||
        (st = cfg_int(c, root, "num_experts_per_tok", false, 0, 1, &m->n_experts_used)) ||
        (st = cfg_int(c, root, "moe_intermediate_size", false, 0, 1, &m->moe_ffn_dim)) ||
        (st = cfg_int(c, root, "shared_expert_intermediate_size", false, 0, 0, &m->shared_ffn_dim)) ||
        (st = cfg_bool(c, root, "norm_topk_prob", false, &m->norm_topk_prob)) ||
        (st = cfg_int(c, root, "decoder_sparse_step", false, 1, 1, &m->decoder_sparse_step)))
        return st;
    if (m->n_experts > 0 && m->n_experts_used > m->n_experts)
        return err_set(c->e, ENGINE_ERR_FORMAT, "%s: 'num_experts_per_tok' is %d; it must be at most %s (%d)",
                       c->path, m->n_experts_used, count, m->n_experts);
    m->clip_qkv_given = cfg_get(root, "clip_qkv") != NULL;
    memset(m->mlp_only_layers, 0, sizeof m->mlp_only_layers);
    const json_t *only = cfg_get(root, "mlp_only_layers");
    if (!only)
        return ENGINE_OK;
    if (!json_is_array(only))
        return cfg_type_error(c, "mlp_only_layers", "a list of layer indices", only);
    for (size_t i = 0; i < json_array_size(only); i++) {
        long long l;
        if (!cfg_as_integer(json_array_get(only, i), &l) || l < 0 || l >= m->n_layers)
            return err_set(c->e, ENGINE_ERR_FORMAT, "%s: 'mlp_only_layers'[%zu] is not a layer index below %d",
                           c->path, i, m->n_layers);
        if (l >= CFG_MAX_LAYERS)
            return err_set(c->e, ENGINE_ERR_UNSUPPORTED, "%s: 'mlp_only_layers' names layer %lld; at most %d layers "
                           "supported", c->path, l, CFG_MAX_LAYERS);
        m->mlp_only_layers[l / 64] |= 1ull << (l % 64);
    }
    return ENGINE_OK;
}

static engine_status cfg_parse_model(const cfg_ctx *c, const json_t *root, cfg_model *m)
{
    engine_status st;
    const json_t *arch = cfg_get(root, "architectures");
    if (!arch || (json_is_array(arch) && json_array_size(arch) == 0))
        return err_set(c->e, ENGINE_ERR_FORMAT, "%s: no 'architectures'", c->path);
    if (!json_is_array(arch) || !json_is_string(json_array_get(arch, 0)))
        return err_set(c->e, ENGINE_ERR_FORMAT, "%s: 'architectures' must be a list of strings", c->path);
    const char *a = json_string_value(json_array_get(arch, 0));
    if (strlen(a) >= sizeof m->architecture)
        return err_set(c->e, ENGINE_ERR_FORMAT, "%s: architecture name of %zu bytes is too long", c->path, strlen(a));
    memcpy(m->architecture, a, strlen(a) + 1);

    /* transformers 5 renamed torch_dtype to dtype. */
    const char *dtype_key = cfg_get(root, "dtype") ? "dtype" : "torch_dtype";
    if ((st = cfg_str(c, root, "model_type", "", m->model_type, sizeof m->model_type)) ||
        (st = cfg_str(c, root, cfg_get(root, "hidden_activation") ? "hidden_activation" : "hidden_act", "silu",
                      m->hidden_act, sizeof m->hidden_act)) ||
        (st = cfg_str(c, root, dtype_key, "", m->torch_dtype, sizeof m->torch_dtype)))
        return st;
    if (strcmp(m->hidden_act, "silu") == 0)
        m->act = CFG_ACT_SILU;
    else if (strcmp(m->hidden_act, "gelu_pytorch_tanh") == 0)
        m->act = CFG_ACT_GELU_TANH;
    else
        return err_set(c->e, ENGINE_ERR_UNSUPPORTED, "%s: activation '%s' (%s) is not supported (supported: silu, "
                       "gelu_pytorch_tanh)", c->path, m->hidden_act,
                       cfg_get(root, "hidden_activation") ? "hidden_activation" : "hidden_act");

    if ((st = cfg_int(c, root, "hidden_size", true, 0, 1, &m->dim)) ||
        (st = cfg_int(c, root, "num_hidden_layers", true, 0, 1, &m->n_layers)) ||
        (st = cfg_int(c, root, "num_attention_heads", true, 0, 1, &m->n_heads)) ||
        (st = cfg_int(c, root, "intermediate_size", true, 0, 1, &m->ffn_dim)) ||
        (st = cfg_int(c, root, "vocab_size", true, 0, 1, &m->vocab_size)) ||
        (st = cfg_int(c, root, "num_key_value_heads", false, m->n_heads, 1, &m->n_kv_heads)) ||
        (st = cfg_int(c, root, "head_dim", false, 0, 1, &m->head_dim)) ||
        (st = cfg_int(c, root, "max_position_embeddings", false, 2048, 1, &m->max_position)))
        return st;
    /* An explicit head_dim (Qwen3: 128 with hidden 1024 and 16 heads) need
     * not divide the width; the derived one must. */
    if (m->head_dim == 0) {
        if (m->dim % m->n_heads != 0)
            return err_set(c->e, ENGINE_ERR_FORMAT, "%s: hidden_size %d is not divisible by num_attention_heads %d",
                           c->path, m->dim, m->n_heads);
        m->head_dim = m->dim / m->n_heads;
    }
    if (m->n_heads % m->n_kv_heads != 0)
        return err_set(c->e, ENGINE_ERR_FORMAT,
                       "%s: num_attention_heads %d is not divisible by num_key_value_heads %d", c->path, m->n_heads,
                       m->n_kv_heads);
    /* RoPE rotates the two halves of each head (transformers fails on an
     * odd head_dim); and the engine forms n_heads * head_dim in int (the
     * kv product is no larger, kv heads dividing heads). */
    if (m->head_dim % 2 != 0)
        return err_set(c->e, ENGINE_ERR_FORMAT, "%s: head_dim %d is odd; rotary embeddings need an even one",
                       c->path, m->head_dim);
    if ((long long)m->n_heads * m->head_dim > INT_MAX)
        return err_set(c->e, ENGINE_ERR_FORMAT, "%s: num_attention_heads %d x head_dim %d does not fit in 32 bits",
                       c->path, m->n_heads, m->head_dim);

    if ((st = cfg_num(c, root, "embedding_multiplier", false, 1.0, true, &m->embedding_multiplier)) ||
        (st = cfg_num(c, root, "residual_multiplier", false, 1.0, true, &m->residual_multiplier)) ||
        (st = cfg_num(c, root, "attention_multiplier", false, 0.0, true, &m->attention_multiplier)) ||
        (st = cfg_num(c, root, "logits_scaling", false, 1.0, true, &m->logits_scaling)))
        return st;
    if ((st = cfg_num(c, root, "query_pre_attn_scalar", false, 0.0, true, &m->query_pre_attn_scalar)) ||
        (st = cfg_softcap(c, root, "attn_logit_softcapping", &m->attn_softcap)) ||
        (st = cfg_softcap(c, root, "final_logit_softcapping", &m->final_softcap)))
        return st;
    if ((st = cfg_num(c, root, "rms_norm_eps", false, 1e-6, true, &m->rms_eps)) ||
        (st = cfg_bool(c, root, "tie_word_embeddings", false, &m->tie_embeddings)) ||
        (st = cfg_bool(c, root, "attention_bias", false, &m->attention_bias)) ||
        (st = cfg_bool(c, root, "mlp_bias", false, &m->mlp_bias)))
        return st;

    /* Qwen2 keeps a sliding_window value but switches it off with use_sliding_window. */
    bool use_window;
    if ((st = cfg_int(c, root, "sliding_window", false, 0, 0, &m->sliding_window)) ||
        (st = cfg_bool(c, root, "use_sliding_window", true, &use_window)))
        return st;
    if (!use_window)
        m->sliding_window = 0;
    if ((st = cfg_window_layers(c, root, m)))
        return st;

    if ((st = cfg_rope(c, root, m)) || (st = cfg_moe(c, root, m)))
        return st;
    if ((st = cfg_int(c, root, "bos_token_id", false, -1, 0, &m->bos_id)) ||
        (st = cfg_ids(c, root, "eos_token_id", m->eos_ids, &m->n_eos)))
        return st;
    return ENGINE_OK;
}

engine_status cfg_load_model(const char *path, cfg_model *out, err_buf *e)
{
    if (!path || !out)
        return err_set(e, ENGINE_ERR_INVALID_ARG, "cfg_load_model: NULL argument");
    json_t *root;
    int err_no;
    engine_status st = cfg_load_json(path, &root, &err_no, e);
    if (st)
        return st;
    /* Parsed aside so that *out is only written on success. */
    cfg_model m;
    memset(&m, 0, sizeof m);
    const cfg_ctx c = {path, "", e};
    st = cfg_parse_model(&c, root, &m);
    json_decref(root);
    if (!st)
        *out = m;
    return st;
}

/* ------------------------------------------------------ generation_config */

static engine_status cfg_parse_generation(const cfg_ctx *c, const json_t *root, cfg_generation *g)
{
    engine_status st;
    if (cfg_get(root, "temperature")) {
        if ((st = cfg_num(c, root, "temperature", false, 1.0, false, &g->temperature)))
            return st;
        g->has_temperature = true;
    }
    if (cfg_get(root, "top_k")) {
        if ((st = cfg_int(c, root, "top_k", false, 0, 0, &g->top_k)))
            return st;
        g->has_top_k = true;
    }
    if (cfg_get(root, "top_p")) {
        if ((st = cfg_num(c, root, "top_p", false, 1.0, false, &g->top_p)))
            return st;
        if (g->top_p > 1.0)
            return err_set(c->e, ENGINE_ERR_FORMAT, "%s: 'top_p' is %g; it must be at most 1", c->path, g->top_p);
        g->has_top_p = true;
    }
    if (cfg_get(root, "repetition_penalty")) {
        if ((st = cfg_num(c, root, "repetition_penalty", false, 1.0, true, &g->repetition_penalty)))
            return st;
        g->has_repetition_penalty = true;
    }
    if ((st = cfg_bool(c, root, "do_sample", false, &g->do_sample)) ||
        (st = cfg_int(c, root, "bos_token_id", false, -1, 0, &g->bos_id)) ||
        (st = cfg_ids(c, root, "eos_token_id", g->eos_ids, &g->n_eos)))
        return st;
    return ENGINE_OK;
}

engine_status cfg_load_generation(const char *path, cfg_generation *out, err_buf *e)
{
    if (!path || !out)
        return err_set(e, ENGINE_ERR_INVALID_ARG, "cfg_load_generation: NULL argument");
    cfg_generation g;
    memset(&g, 0, sizeof g);
    g.bos_id = -1;
    *out = g;
    json_t *root;
    int err_no;
    engine_status st = cfg_load_json(path, &root, &err_no, e);
    if (st == ENGINE_ERR_IO && err_no == ENOENT) {
        err_clear(e); /* optional file: its absence is not an error */
        return ENGINE_OK;
    }
    if (st)
        return st;
    const cfg_ctx c = {path, "", e};
    st = cfg_parse_generation(&c, root, &g);
    json_decref(root);
    if (!st)
        *out = g;
    return st;
}
