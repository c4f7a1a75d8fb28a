/*
 * bind_quant.c: binding quantized tensors (docs/FORMATS.md) to k_weight
 * views: INT8 (`W` I8 + `W.scales`) and the bitsandbytes 4-bit layout
 * (`W` packed U8, `W.absmax`, `W.quant_map`, optional nested absmax, and
 * the `W.quant_state.bitsandbytes__nf4|fp4` JSON), which is both what our
 * tools/quantize writes and what transformers saves. Nothing is copied:
 * every pointer is into the mapping. Each problem is reported as one line
 * naming the file and tensor.
 */
#include <math.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "../quant/quant.h"
#include "model.h"

/* Find name + suffix; NULL when absent. */
static const st_tensor *find_part(const engine_model *m, const char *name, const char *suffix)
{
    char full[256];
    if ((size_t)snprintf(full, sizeof full, "%s%s", name, suffix) >= sizeof full)
        return NULL;
    return st_find(m->weights, full);
}

/* A part that must exist with this dtype and element count, aligned for its loads. */
static engine_status need_part(const engine_model *m, const st_tensor **out, const char *name, const char *suffix,
                               st_dtype dtype, uint64_t n_elements, err_buf *e)
{
    const st_tensor *t = find_part(m, name, suffix);
    *out = t;
    const char *file = st_file_path(m->weights, t ? t->shard : 0);
    if (!t)
        return err_set(e, ENGINE_ERR_FORMAT, "%s: quantized tensor '%s' lacks '%s%s'", file, name, name, suffix);
    if (t->dtype != dtype)
        return err_set(e, ENGINE_ERR_FORMAT, "%s: tensor '%s%s' has dtype %s, expected %s", file, name, suffix,
                       st_dtype_name(t->dtype), st_dtype_name(dtype));
    if (t->n_elements != n_elements)
        return err_set(e, ENGINE_ERR_FORMAT, "%s: tensor '%s%s' has %llu elements, expected %llu", file, name,
                       suffix, (unsigned long long)t->n_elements, (unsigned long long)n_elements);
    if ((uintptr_t)t->data % st_dtype_size(dtype) != 0)
        return err_set(e, ENGINE_ERR_UNSUPPORTED, "%s: tensor '%s%s' data is not aligned in the file", file, name,
                       suffix);
    return ENGINE_OK;
}

/*
 * Scales must be finite and non-negative (absmax and INT8 scales are
 * magnitudes) and code tables finite within [-1, 1]: a corrupted file is
 * refused at load, naming the value, instead of producing NaN logits later.
 * `kind` 0: a scale, 1: a code table entry.
 */
static engine_status check_values(const engine_model *m, const st_tensor *t, const char *name, const char *suffix,
                                  int kind, err_buf *e)
{
    const float *v = t->data;
    for (uint64_t i = 0; i < t->n_elements; i++) {
        const float x = v[i];
        const bool ok = kind == 0 ? (x >= 0.0f && x <= 3.4e38f) : (x >= -1.0f && x <= 1.0f);
        if (!ok) /* NaN fails both comparisons */
            return err_set(e, ENGINE_ERR_FORMAT, "%s: '%s%s' element %llu is %g, not a %s",
                           st_file_path(m->weights, t->shard), name, suffix, (unsigned long long)i, (double)x,
                           kind == 0 ? "finite non-negative scale" : "code value in [-1, 1]");
    }
    return ENGINE_OK;
}

static engine_status bind_int8(engine_model *m, k_weight *w, const st_tensor *t, const char *name, int rows, int cols,
                               err_buf *e)
{
    const char *file = st_file_path(m->weights, t->shard);
    if (t->n_dims != 2 || t->shape[0] != rows || t->shape[1] != cols)
        return err_set(e, ENGINE_ERR_FORMAT, "%s: int8 tensor '%s' is not [%d, %d] as config.json implies", file, name,
                       rows, cols);
    const st_tensor *s = find_part(m, name, ".scales");
    if (!s)
        return err_set(e, ENGINE_ERR_FORMAT, "%s: int8 tensor '%s' has no '%s.scales'", file, name, name);
    const int64_t g128 = (cols + Q_INT8_GROUP - 1) / Q_INT8_GROUP;
    if (s->dtype != ST_F32 || s->n_dims != 2 || s->shape[0] != rows || (s->shape[1] != 1 && s->shape[1] != g128))
        return err_set(e, ENGINE_ERR_FORMAT, "%s: '%s.scales' must be F32 [%d, 1] or [%d, %lld]",
                       st_file_path(m->weights, s->shard), name, rows, rows, (long long)g128);
    if ((uintptr_t)s->data % 4 != 0)
        return err_set(e, ENGINE_ERR_UNSUPPORTED, "%s: '%s.scales' data is not aligned in the file",
                       st_file_path(m->weights, s->shard), name);
    engine_status st = check_values(m, s, name, ".scales", 0, e);
    if (st)
        return st;
    w->data = t->data;
    w->dtype = K_I8;
    w->rows = rows;
    w->cols = cols;
    w->scales = s->data;
    w->group = s->shape[1] == 1 ? cols : Q_INT8_GROUP;
    m->weight_bytes += t->nbytes + s->nbytes;
    return ENGINE_OK;
}

/* The quant_state JSON: quant type, blocksize, shape, nested settings. */
static engine_status parse_state(const engine_model *m, const st_tensor *qs, const char *name, int rows, int cols,
                                 int *block, int *nested_block, double *offset, err_buf *e)
{
    const char *file = st_file_path(m->weights, qs->shard);
    json_error_t je;
    json_t *root = json_loadb(qs->data, (size_t)qs->nbytes, 0, &je);
    if (!json_is_object(root)) {
        json_decref(root);
        return err_set(e, ENGINE_ERR_FORMAT, "%s: '%s' is not a JSON object: %s", file, qs->name, je.text);
    }
    json_t *bs = json_object_get(root, "blocksize"), *shape = json_object_get(root, "shape");
    json_t *nb = json_object_get(root, "nested_blocksize"), *off = json_object_get(root, "nested_offset");
    engine_status st = ENGINE_OK;
    if (!json_is_integer(bs) || json_integer_value(bs) < 2 || json_integer_value(bs) > K_QBLOCK_MAX ||
        json_integer_value(bs) % 2)
        st = err_set(e, ENGINE_ERR_FORMAT, "%s: '%s': blocksize must be an even integer in 2..%d", file, qs->name,
                     K_QBLOCK_MAX);
    else if (json_array_size(shape) != 2 || json_integer_value(json_array_get(shape, 0)) != rows ||
             json_integer_value(json_array_get(shape, 1)) != cols)
        st = err_set(e, ENGINE_ERR_FORMAT, "%s: '%s': shape is not [%d, %d] as config.json implies for '%s'", file,
                     qs->name, rows, cols, name);
    else if (nb && (!json_is_integer(nb) || json_integer_value(nb) < 1 || !json_is_number(off)))
        st = err_set(e, ENGINE_ERR_FORMAT, "%s: '%s': nested_blocksize and nested_offset are malformed", file,
                     qs->name);
    if (!st) {
        *block = (int)json_integer_value(bs);
        *nested_block = nb ? (int)json_integer_value(nb) : 0;
        *offset = nb ? json_number_value(off) : 0.0;
    }
    json_decref(root);
    return st;
}

bool has_bnb_state(const engine_model *m, const char *name)
{
    return find_part(m, name, ".quant_state.bitsandbytes__nf4") || find_part(m, name, ".quant_state.bitsandbytes__fp4");
}

static engine_status bind_4bit(engine_model *m, k_weight *w, const st_tensor *t, const char *name, int rows, int cols,
                               err_buf *e)
{
    const char *file = st_file_path(m->weights, t->shard);
    /* bitsandbytes can pack the nibbles into wider storage (quant_storage,
     * for FSDP); the bytes are the same but this reader takes U8 only. */
    if (t->dtype != ST_U8)
        return err_set(e, ENGINE_ERR_UNSUPPORTED,
                       "%s: 4-bit tensor '%s' is packed in %s (bnb_4bit_quant_storage); only uint8 is supported", file,
                       name, st_dtype_name(t->dtype));
    const st_tensor *qs = find_part(m, name, ".quant_state.bitsandbytes__nf4");
    k_dtype type = K_NF4;
    if (!qs) {
        qs = find_part(m, name, ".quant_state.bitsandbytes__fp4");
        type = K_FP4;
    }
    if (!qs)
        return err_set(e, ENGINE_ERR_UNSUPPORTED,
                       "%s: tensor '%s' is U8 but has no '%s.quant_state.bitsandbytes__nf4' or '__fp4' entry", file,
                       name, name);
    if (qs->dtype != ST_U8)
        return err_set(e, ENGINE_ERR_FORMAT, "%s: '%s' must be U8 JSON bytes", st_file_path(m->weights, qs->shard),
                       qs->name);
    int block = 0, nested_block = 0;
    double offset = 0.0;
    engine_status st = parse_state(m, qs, name, rows, cols, &block, &nested_block, &offset, e);
    if (st)
        return st;
    const uint64_t n = (uint64_t)rows * cols, nb = (n + block - 1) / block;
    if (t->n_elements != (n + 1) / 2 || !(t->n_dims == 1 || (t->n_dims == 2 && t->shape[1] == 1)))
        return err_set(e, ENGINE_ERR_FORMAT, "%s: packed tensor '%s' must be U8 [%llu, 1] for [%d, %d]", file, name,
                       (unsigned long long)((n + 1) / 2), rows, cols);
    const st_tensor *qmap, *absmax, *nabs = NULL, *nmap = NULL;
    if ((st = need_part(m, &qmap, name, ".quant_map", ST_F32, 16, e)))
        return st;
    if ((st = need_part(m, &absmax, name, ".absmax", nested_block ? ST_U8 : ST_F32, nb, e)))
        return st;
    if (nested_block) {
        if ((st = need_part(m, &nabs, name, ".nested_absmax", ST_F32, (nb + nested_block - 1) / nested_block, e)))
            return st;
        if ((st = need_part(m, &nmap, name, ".nested_quant_map", ST_F32, 256, e)))
            return st;
    }
    if ((st = check_values(m, qmap, name, ".quant_map", 1, e)) ||
        (!nested_block && (st = check_values(m, absmax, name, ".absmax", 0, e))) ||
        (nested_block && ((st = check_values(m, nabs, name, ".nested_absmax", 0, e)) ||
                          (st = check_values(m, nmap, name, ".nested_quant_map", 1, e)))))
        return st;
    if (!isfinite(offset))
        return err_set(e, ENGINE_ERR_FORMAT, "%s: '%s' has a nested offset that is not finite", file, name);
    w->data = t->data;
    w->dtype = type;
    w->rows = rows;
    w->cols = cols;
    w->code = qmap->data;
    w->block = block;
    m->weight_bytes += t->nbytes + qmap->nbytes + absmax->nbytes;
    if (nested_block) {
        w->absmax_q = absmax->data;
        w->absmax_scale = nabs->data;
        w->absmax_code = nmap->data;
        w->absmax_block = nested_block;
        w->absmax_offset = (float)offset;
        m->weight_bytes += nabs->nbytes + nmap->nbytes;
    } else {
        w->absmax = absmax->data;
    }
    return ENGINE_OK;
}

engine_status bind_quantized(engine_model *m, k_weight *w, const st_tensor *t, const char *name, int rows, int cols,
                             err_buf *e)
{
    const char *file = st_file_path(m->weights, t->shard);
    if (cols == 0)
        return err_set(e, ENGINE_ERR_UNSUPPORTED, "%s: tensor '%s' is quantized (%s); vectors must stay F32/F16/BF16",
                       file, name, st_dtype_name(t->dtype));
    engine_status st = t->dtype == ST_I8 ? bind_int8(m, w, t, name, rows, cols, e)
                                         : bind_4bit(m, w, t, name, rows, cols, e);
    if (!st) {
        m->n_params += (uint64_t)rows * cols;
        m->n_quantized++;
    }
    return st;
}
