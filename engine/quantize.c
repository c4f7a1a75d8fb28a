/*
 * quantize.c: engine_quantize, a quantized copy of a checkpoint in the
 * layout docs/FORMATS.md specifies.
 *
 * The whole output is planned before a byte is written: which tensors are
 * quantized, every output tensor's dtype, shape and size, the shard each
 * lands in and its offset. Headers are then written first and each source
 * tensor is quantized on its own and its parts written at their planned
 * offsets (pwrite), so memory holds one tensor at a time however large the
 * model. Within a shard, 4-byte types come first, then 2-byte, then 1-byte:
 * every tensor is then aligned for its element type with no holes between
 * tensors (the safetensors library rejects holes).
 */
#define _POSIX_C_SOURCE 200809L /* pwrite, mkdtemp, fnmatch */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../quant/quant.h"
#include "model.h"

#define DEFAULT_SHARD ((uint64_t)4 << 30)
#define NAME_MAX_LEN 256

typedef enum part_kind { P_COPY, P_DATA, P_SCALES, P_ABSMAX, P_QMAP, P_NABS, P_NMAP, P_STATE } part_kind;

typedef struct out_part {
    char name[NAME_MAX_LEN];
    st_dtype dtype;
    int n_dims;
    int64_t shape[ST_MAX_DIMS];
    uint64_t nbytes;
    part_kind kind;
    size_t src;      /* source tensor index (st_at)             */
    int row0, rows;  /* quantized: the source rows it holds (a fused tensor's part) */
    int shard;
    uint64_t offset; /* within the shard's data area            */
} out_part;

typedef struct plan {
    const st_set *in;
    q_spec spec;          /* the layers' format                      */
    q_spec head_spec;     /* the output head's, when head_type asks  */
    size_t n_src;
    const q_spec **quant; /* [n_src] the format of this source, or NULL: copied */
    size_t tied_src;      /* the embedding table that also gives a quantized lm_head, or n_src */
    out_part *parts;
    size_t n_parts, cap_parts;
    int n_shards;
    uint64_t *shard_bytes; /* [n_shards] data bytes */
    const char *tmp;       /* the temporary output folder */
    const char *dir;       /* the checkpoint's folder (config.json) */
    int qkv_rows[3];       /* a fused qkv_proj's q, k and v rows (config.json), once read; 0: not yet */
} plan;

engine_quantize_params engine_quantize_default_params(void)
{
    engine_quantize_params p;
    memset(&p, 0, sizeof p);
    p.type = ENGINE_QUANT_NF4;
    return p;
}

/* The format an engine_quant names; false for NONE and unknown values. */
bool quant_spec_of(engine_quant q, q_spec *s)
{
    memset(s, 0, sizeof *s);
    switch (q) {
    case ENGINE_QUANT_INT8: s->type = K_I8; return true;
    case ENGINE_QUANT_INT8_G128: s->type = K_I8, s->group = Q_INT8_GROUP; return true;
    case ENGINE_QUANT_NF4: s->type = K_NF4; return true;
    case ENGINE_QUANT_NF4_DQ: s->type = K_NF4, s->double_quant = true; return true;
    case ENGINE_QUANT_FP4: s->type = K_FP4; return true;
    default: return false;
    }
}

static const char *torch_dtype(st_dtype t)
{
    return t == ST_BF16 ? "bfloat16" : t == ST_F16 ? "float16" : "float32";
}

/* The bitsandbytes quant_state JSON. The offset is printed at a fixed width
 * (%.9e of a finite non-negative mean: 15 characters) so the planned size
 * holds before the offset is known. */
static int state_json(char *buf, size_t cap, const q_spec *s, st_dtype src, int rows, int cols, float offset)
{
    char nested[128] = "";
    if (s->double_quant)
        snprintf(nested, sizeof nested,
                 ", \"nested_blocksize\": %d, \"nested_dtype\": \"float32\", \"nested_offset\": %.9e", Q_NESTED_BLOCK,
                 (double)offset);
    return snprintf(buf, cap, "{\"quant_type\": \"%s\", \"blocksize\": %d, \"dtype\": \"%s\", \"shape\": [%d, %d]%s}",
                    s->type == K_FP4 ? "fp4" : "nf4", Q_NF4_BLOCK, torch_dtype(src), rows, cols, nested);
}

static engine_status add_part(plan *p, const char *base, const char *suffix, st_dtype dt, int n_dims, int64_t d0,
                              int64_t d1, part_kind kind, size_t src, err_buf *e)
{
    if (p->n_parts == p->cap_parts) {
        size_t cap = p->cap_parts ? 2 * p->cap_parts : 256;
        out_part *g = realloc(p->parts, cap * sizeof *g);
        if (!g)
            return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "quantize: out of memory planning the output");
        p->parts = g;
        p->cap_parts = cap;
    }
    out_part *o = &p->parts[p->n_parts++];
    memset(o, 0, sizeof *o);
    if ((size_t)snprintf(o->name, sizeof o->name, "%s%s", base, suffix) >= sizeof o->name)
        return err_set(e, ENGINE_ERR_UNSUPPORTED, "quantize: tensor name '%s%s' is too long", base, suffix);
    o->dtype = dt;
    o->n_dims = n_dims;
    o->shape[0] = d0;
    o->shape[1] = d1;
    o->nbytes = (uint64_t)(n_dims == 2 ? d0 * d1 : d0) * st_dtype_size(dt);
    o->kind = kind;
    o->src = src;
    return ENGINE_OK;
}

/* Whether name ends with suffix; *stem gets the length before it. */
static bool ends_with(const char *name, const char *suffix, size_t *stem)
{
    const size_t n = strlen(name), k = strlen(suffix);
    *stem = n >= k ? n - k : 0;
    return n >= k && strcmp(name + n - k, suffix) == 0;
}

/* Experts stacked as transformers 5 holds them: experts.gate_up_proj
 * [E, 2 * ffn, dim] and experts.down_proj [E, dim, ffn]. */
static bool stacked_experts(const st_tensor *t)
{
    size_t stem;
    return t->n_dims == 3 && t->shape[0] > 0 &&
           (ends_with(t->name, "experts.gate_up_proj", &stem) || ends_with(t->name, "experts.down_proj", &stem));
}

/* A matrix in a floating type (stacked experts: their rows one after another): what can be quantized. */
static bool dense_matrix(const st_tensor *t)
{
    if (!t || (t->dtype != ST_F32 && t->dtype != ST_F16 && t->dtype != ST_BF16))
        return false;
    if (t->n_dims == 3)
        return stacked_experts(t) && t->shape[0] * t->shape[1] <= INT32_MAX && t->shape[2] <= INT32_MAX;
    return t->n_dims == 2 && t->shape[0] <= INT32_MAX && t->shape[1] <= INT32_MAX;
}

/* Columns of a quantizable matrix: its last dimension. */
static int64_t mat_cols(const st_tensor *t)
{
    return t->shape[t->n_dims - 1];
}

/* The linear weights: *_proj.weight, Mixtral's experts.N.w1/w2/w3.weight and
 * stacked experts. Routers (mlp.gate.weight, shared_expert_gate.weight) are
 * not: as bitsandbytes leaves them, a rounded router would change which
 * experts run. */
static bool wants_quant(const st_tensor *t, const engine_quantize_params *qp)
{
    size_t stem;
    if (!dense_matrix(t))
        return false;
    const bool w123 = strstr(t->name, ".experts.") &&
                      (ends_with(t->name, ".w1.weight", &stem) || ends_with(t->name, ".w2.weight", &stem) ||
                       ends_with(t->name, ".w3.weight", &stem));
    if (!ends_with(t->name, "_proj.weight", &stem) && !w123 && !stacked_experts(t))
        return false;
    for (size_t i = 0; i < qp->n_skip; i++)
        if (qp->skip[i] && fnmatch(qp->skip[i], t->name, 0) == 0)
            return false;
    return true;
}

/* The output tensors of rows [row0, row0 + nrows) of source i quantized as
 * q, named after base. */
static engine_status plan_quantized_parts(plan *p, size_t i, const char *base, const q_spec *q, int nrows, err_buf *e);

static engine_status plan_quantized(plan *p, size_t i, const char *base, const q_spec *q, int row0, int nrows,
                                    err_buf *e)
{
    const size_t first = p->n_parts;
    engine_status st = plan_quantized_parts(p, i, base, q, nrows, e);
    for (size_t k = first; k < p->n_parts; k++)
        p->parts[k].row0 = row0, p->parts[k].rows = nrows;
    return st;
}

static engine_status plan_quantized_parts(plan *p, size_t i, const char *base, const q_spec *q, int nrows, err_buf *e)
{
    const st_tensor *t = st_at(p->in, i);
    engine_status st;
    const int64_t rows = nrows, cols = mat_cols(t), n = rows * cols;
    if (q->type == K_I8) {
        if ((st = add_part(p, base, "", ST_I8, 2, rows, cols, P_DATA, i, e)))
            return st;
        return add_part(p, base, ".scales", ST_F32, 2, rows, (int64_t)q_int8_n_groups((int)cols, q->group), P_SCALES,
                        i, e);
    }
    const int64_t nb = (n + Q_NF4_BLOCK - 1) / Q_NF4_BLOCK, nn = (nb + Q_NESTED_BLOCK - 1) / Q_NESTED_BLOCK;
    char js[512];
    const int jlen = state_json(js, sizeof js, q, t->dtype, (int)rows, (int)cols, 0.0f);
    if ((st = add_part(p, base, "", ST_U8, 2, (n + 1) / 2, 1, P_DATA, i, e)) ||
        (st = add_part(p, base, ".absmax", q->double_quant ? ST_U8 : ST_F32, 1, nb, 0, P_ABSMAX, i, e)) ||
        (st = add_part(p, base, ".quant_map", ST_F32, 1, 16, 0, P_QMAP, i, e)))
        return st;
    if (q->double_quant && ((st = add_part(p, base, ".nested_absmax", ST_F32, 1, nn, 0, P_NABS, i, e)) ||
                            (st = add_part(p, base, ".nested_quant_map", ST_F32, 1, 256, 0, P_NMAP, i, e))))
        return st;
    return add_part(p, base, q->type == K_FP4 ? ".quant_state.bitsandbytes__fp4" : ".quant_state.bitsandbytes__nf4",
                    ST_U8, 1, jlen, 0, P_STATE, i, e);
}

/*
 * Stacked experts are quantized as their per-expert parts, written under
 * the per-expert names (experts.N.gate_proj/up_proj/down_proj.weight),
 * which the loader reads as it reads a per-expert checkpoint: each expert
 * its own 4-bit blocks and statistics, the same bits as quantizing the
 * experts while loading.
 */
static engine_status plan_stacked(plan *p, size_t i, bool *done, err_buf *e)
{
    const st_tensor *t = st_at(p->in, i);
    size_t stem;
    *done = stacked_experts(t);
    if (!*done)
        return ENGINE_OK;
    const bool gu = ends_with(t->name, "experts.gate_up_proj", &stem);
    if (!gu)
        ends_with(t->name, "experts.down_proj", &stem);
    const int E = (int)t->shape[0], R = (int)t->shape[1];
    if (gu && R % 2 != 0)
        return err_set(e, ENGINE_ERR_FORMAT, "%s: tensor '%s' has an odd number of rows (%d) for gate and up",
                       st_file_path(p->in, t->shard), t->name, R);
    for (int x = 0; x < E; x++)
        for (int part = 0; part < (gu ? 2 : 1); part++) {
            char name[NAME_MAX_LEN];
            const int n = snprintf(name, sizeof name, "%.*sexperts.%d.%s", (int)stem, t->name, x,
                                   !gu ? "down_proj.weight" : part ? "up_proj.weight" : "gate_proj.weight");
            if (n < 0 || (size_t)n >= sizeof name)
                return err_set(e, ENGINE_ERR_UNSUPPORTED, "quantize: tensor name '%s' is too long", t->name);
            const int rows = gu ? R / 2 : R;
            engine_status st = plan_quantized(p, i, name, p->quant[i], x * R + part * rows, rows, e);
            if (st)
                return st;
        }
    return ENGINE_OK;
}

/*
 * A fused tensor (Phi-3's self_attn.qkv_proj, mlp.gate_up_proj) is
 * quantized as its parts, each its own tensor under the unfused name
 * (q_proj, k_proj, v_proj; gate_proj, up_proj), as quantizing while loading
 * does: a 4-bit block or double-quantization's absmax never straddles two
 * parts. The q/k/v rows come from config.json.
 */
static engine_status plan_fused(plan *p, size_t i, bool *done, err_buf *e)
{
    const st_tensor *t = st_at(p->in, i);
    size_t stem;
    const char *names[3];
    int rows[3], n = 0;
    if (ends_with(t->name, "self_attn.qkv_proj.weight", &stem)) {
        if (!p->qkv_rows[0]) {
            char file[PATH_MAX + 32];
            cfg_model c;
            snprintf(file, sizeof file, "%s/config.json", p->dir);
            engine_status st = cfg_load_model(file, &c, e);
            if (st)
                return st;
            p->qkv_rows[0] = c.n_heads * c.head_dim;
            p->qkv_rows[1] = p->qkv_rows[2] = c.n_kv_heads * c.head_dim;
        }
        if (t->shape[0] != (int64_t)p->qkv_rows[0] + 2 * p->qkv_rows[1])
            return err_set(e, ENGINE_ERR_FORMAT, "%s: tensor '%s' has %lld rows; config.json's heads give %d",
                           st_file_path(p->in, t->shard), t->name, (long long)t->shape[0],
                           p->qkv_rows[0] + 2 * p->qkv_rows[1]);
        names[0] = "self_attn.q_proj.weight", names[1] = "self_attn.k_proj.weight", names[2] = "self_attn.v_proj.weight";
        memcpy(rows, p->qkv_rows, sizeof rows);
        n = 3;
    } else if (ends_with(t->name, "mlp.gate_up_proj.weight", &stem) && t->shape[0] % 2 == 0) {
        names[0] = "mlp.gate_proj.weight", names[1] = "mlp.up_proj.weight";
        rows[0] = rows[1] = (int)(t->shape[0] / 2);
        n = 2;
    }
    *done = n > 0;
    for (int k = 0, row0 = 0; k < n; row0 += rows[k], k++) {
        char name[NAME_MAX_LEN];
        if (stem + strlen(names[k]) >= sizeof name)
            return err_set(e, ENGINE_ERR_UNSUPPORTED, "quantize: tensor name '%s' is too long", t->name);
        snprintf(name, sizeof name, "%.*s%s", (int)stem, t->name, names[k]);
        engine_status st = plan_quantized(p, i, name, p->quant[i], row0, rows[k], e);
        if (st)
            return st;
    }
    return ENGINE_OK;
}

/* Every output tensor of source i: as stored, quantized (a fused tensor as
 * its parts), or (the tied table) as stored and quantized again as lm_head. */
static engine_status plan_source(plan *p, size_t i, err_buf *e)
{
    const st_tensor *t = st_at(p->in, i);
    if (p->quant[i] && i != p->tied_src) {
        bool fused = false;
        engine_status st = plan_fused(p, i, &fused, e);
        if (!st && !fused)
            st = plan_stacked(p, i, &fused, e);
        if (st || fused)
            return st;
        return plan_quantized(p, i, t->name, p->quant[i], 0, (int)t->shape[0], e);
    }
    engine_status st = add_part(p, t->name, "", t->dtype, 1, 0, 0, P_COPY, i, e);
    if (st)
        return st;
    out_part *o = &p->parts[p->n_parts - 1];
    o->n_dims = t->n_dims;
    memcpy(o->shape, t->shape, sizeof o->shape);
    o->nbytes = t->nbytes;
    return i == p->tied_src ? plan_quantized(p, i, "lm_head.weight", p->quant[i], 0, (int)t->shape[0], e)
                            : ENGINE_OK;
}

/* Shards by source tensor (a tensor's parts stay together), then offsets by
 * element size so that every tensor is aligned without holes. */
static engine_status assign_shards(plan *p, uint64_t max_bytes, err_buf *e)
{
    uint64_t cur = 0;
    int shard = 0;
    for (size_t k = 0; k < p->n_parts;) {
        size_t end = k;
        uint64_t group = 0;
        while (end < p->n_parts && p->parts[end].src == p->parts[k].src)
            group += p->parts[end++].nbytes;
        if (cur > 0 && cur + group > max_bytes) {
            shard++;
            cur = 0;
        }
        for (; k < end; k++)
            p->parts[k].shard = shard;
        cur += group;
    }
    p->n_shards = shard + 1;
    p->shard_bytes = calloc((size_t)p->n_shards, sizeof *p->shard_bytes);
    if (!p->shard_bytes)
        return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "quantize: out of memory");
    for (int s = 0; s < p->n_shards; s++)
        for (size_t width = 4; width >= 1; width /= 2)
            for (size_t k = 0; k < p->n_parts; k++) {
                out_part *o = &p->parts[k];
                size_t es = st_dtype_size(o->dtype);
                size_t cls = es >= 4 ? 4 : es;
                if (o->shard != s || cls != width)
                    continue;
                o->offset = p->shard_bytes[s];
                p->shard_bytes[s] += o->nbytes;
            }
    return ENGINE_OK;
}

static void shard_name(char *buf, size_t cap, int s, int n)
{
    if (n == 1)
        snprintf(buf, cap, "model.safetensors");
    else
        snprintf(buf, cap, "model-%05d-of-%05d.safetensors", s + 1, n);
}

/* The safetensors header of shard s, padded with spaces to a multiple of 8. */
static char *shard_header(const plan *p, int s, size_t *len)
{
    json_t *root = json_object(), *meta = json_object();
    json_object_set_new(meta, "format", json_string("pt"));
    json_object_set_new(meta, "quantization", json_string(q_spec_name(&p->spec)));
    json_object_set_new(root, "__metadata__", meta);
    for (size_t k = 0; k < p->n_parts; k++) {
        const out_part *o = &p->parts[k];
        if (o->shard != s)
            continue;
        json_t *shape = json_array();
        for (int d = 0; d < o->n_dims; d++)
            json_array_append_new(shape, json_integer(o->shape[d]));
        json_t *t = json_object();
        json_object_set_new(t, "dtype", json_string(st_dtype_name(o->dtype)));
        json_object_set_new(t, "shape", shape);
        json_object_set_new(t, "data_offsets",
                            json_pack("[II]", (json_int_t)o->offset, (json_int_t)(o->offset + o->nbytes)));
        json_object_set_new(root, o->name, t);
    }
    char *text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!text)
        return NULL;
    size_t n = strlen(text), padded = (n + 7) & ~(size_t)7;
    char *out = realloc(text, padded + 1);
    if (!out) {
        free(text);
        return NULL;
    }
    memset(out + n, ' ', padded - n);
    out[padded] = '\0';
    *len = padded;
    return out;
}

static bool write_at(int fd, const void *buf, uint64_t n, uint64_t off)
{
    const char *b = buf;
    while (n > 0) {
        ssize_t w = pwrite(fd, b, n > (1u << 30) ? (1u << 30) : (size_t)n, (off_t)off);
        if (w <= 0)
            return false;
        b += w;
        n -= (uint64_t)w;
        off += (uint64_t)w;
    }
    return true;
}

/* Remove the temporary folder this run created, and what it holds. */
static void remove_tree(const char *path)
{
    DIR *d = opendir(path);
    if (d) {
        struct dirent *de;
        char f[PATH_MAX + 300];
        while ((de = readdir(d)) != NULL) {
            if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
                continue;
            snprintf(f, sizeof f, "%s/%s", path, de->d_name);
            unlink(f);
        }
        closedir(d);
    }
    rmdir(path);
}

static engine_status copy_file(const char *from, const char *to, err_buf *e)
{
    FILE *a = fopen(from, "rb");
    if (!a)
        return ENGINE_OK; /* optional files: copied when present */
    FILE *b = fopen(to, "wb");
    engine_status st = ENGINE_OK;
    char buf[65536];
    size_t n;
    if (!b)
        st = err_set(e, ENGINE_ERR_IO, "%s: cannot create", to);
    while (!st && (n = fread(buf, 1, sizeof buf, a)) > 0)
        if (fwrite(buf, 1, n, b) != n)
            st = err_set(e, ENGINE_ERR_IO, "%s: write failed", to);
    if (!st && ferror(a))
        st = err_set(e, ENGINE_ERR_IO, "%s: read failed", from);
    fclose(a);
    if (b && fclose(b) != 0 && !st)
        st = err_set(e, ENGINE_ERR_IO, "%s: write failed", to);
    return st;
}

/* Quantize source i and write its parts at their planned offsets. */
static engine_status write_source(const plan *p, size_t i, size_t first, const int *fds, const uint64_t *data_start,
                                  int n_threads, engine_quantize_tensor *info, err_buf *e)
{
    const st_tensor *t = st_at(p->in, i);
    char what[PATH_MAX + NAME_MAX_LEN + 16]; /* names the file and tensor in errors */
    snprintf(what, sizeof what, "%s: tensor '%s'", st_file_path(p->in, t->shard), t->name);
    q_weight qw;
    memset(&qw, 0, sizeof qw);
    info->name = i == p->tied_src ? "lm_head.weight (quantized from the tied model.embed_tokens.weight, kept too)"
                                  : t->name;
    const q_spec *q = p->quant[i];
    info->quantized = q != NULL;
    info->bytes_in = t->nbytes;
    const k_dtype kd = t->dtype == ST_F16 ? K_F16 : t->dtype == ST_BF16 ? K_BF16 : K_F32;
    k_weight src = {0};
    engine_status st = ENGINE_OK;
    double ref2 = 0.0, err2 = 0.0, n_el = 0.0; /* the pieces' errors together */
    int piece = -1;
    char js[512];
    for (size_t k = first; k < p->n_parts && p->parts[k].src == i && !st; k++) {
        const out_part *o = &p->parts[k];
        const void *bytes = NULL;
        /* A quantized tensor's parts come together, a fused tensor's pieces
         * one after another: quantize each piece as its first part comes. */
        if (o->kind != P_COPY && o->row0 != piece) {
            q_weight_free(&qw);
            memset(&qw, 0, sizeof qw);
            piece = o->row0;
            const int cols = (int)mat_cols(t);
            src = (k_weight){(const char *)t->data + (size_t)o->row0 * cols * k_dtype_size(kd), kd, o->rows, cols};
            if ((st = q_quantize_weight(&src, q, n_threads, &qw, what, e)))
                break;
            q_error qe;
            q_measure_error(&src, &qw.w, n_threads, &qe);
            const double ne = (double)o->rows * cols;
            ref2 += qe.rms_ref * qe.rms_ref * ne, err2 += qe.rms_err * qe.rms_err * ne, n_el += ne;
            info->rms = sqrt(ref2 / n_el);
            info->rms_err = sqrt(err2 / n_el);
            info->max_err = fmax(info->max_err, qe.max_err);
        }
        switch (o->kind) {
        case P_COPY: bytes = t->data; break;
        case P_DATA: bytes = qw.w.data; break;
        case P_SCALES: bytes = qw.w.scales; break;
        case P_ABSMAX: bytes = qw.w.absmax_q ? (const void *)qw.w.absmax_q : (const void *)qw.w.absmax; break;
        case P_QMAP: bytes = qw.w.code; break;
        case P_NABS: bytes = qw.w.absmax_scale; break;
        case P_NMAP: bytes = qw.w.absmax_code; break;
        case P_STATE: {
            const int n = state_json(js, sizeof js, q, t->dtype, src.rows, src.cols, qw.w.absmax_offset);
            if (!isfinite(qw.w.absmax_offset) || n < 0 || (uint64_t)n != o->nbytes)
                st = err_set(e, ENGINE_ERR_FORMAT, "%s: non-finite absmax offset; cannot quantize it", what);
            bytes = js;
            break;
        }
        }
        if (!st && !write_at(fds[o->shard], bytes, o->nbytes, data_start[o->shard] + o->offset)) {
            char file[64];
            shard_name(file, sizeof file, o->shard, p->n_shards);
            st = err_set(e, ENGINE_ERR_IO, "%s/%s: writing '%s' failed: %s", p->tmp, file, o->name, strerror(errno));
        }
        info->bytes_out += o->nbytes;
    }
    q_weight_free(&qw);
    return st;
}

/* The index of a sharded output: every tensor name to its file. */
static engine_status write_index(const plan *p, const char *tmp, err_buf *e)
{
    json_t *root = json_object(), *meta = json_object(), *map = json_object();
    uint64_t total = 0;
    char name[64];
    for (size_t k = 0; k < p->n_parts; k++) {
        shard_name(name, sizeof name, p->parts[k].shard, p->n_shards);
        json_object_set_new(map, p->parts[k].name, json_string(name));
        total += p->parts[k].nbytes;
    }
    json_object_set_new(meta, "total_size", json_integer((json_int_t)total));
    json_object_set_new(meta, "quantization", json_string(q_spec_name(&p->spec)));
    json_object_set_new(root, "metadata", meta);
    json_object_set_new(root, "weight_map", map);
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", tmp);
    int rc = json_dump_file(root, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(root);
    return rc ? err_set(e, ENGINE_ERR_IO, "%s: cannot write", path) : ENGINE_OK;
}

static engine_status quantize_run(plan *p, st_set *set, const char *dir, const char *out, char *tmp,
                                  const engine_quantize_params *qp, engine_quantize_stats *stats, err_buf *e)
{
    engine_status st;
    const int n_threads = qp->n_threads > 0 ? qp->n_threads : omp_get_num_procs();
    p->in = set;
    p->dir = dir;
    p->n_src = st_count(set);
    p->quant = calloc(p->n_src ? p->n_src : 1, sizeof *p->quant);
    if (!p->quant)
        return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "quantize: out of memory");
    /* The head: lm_head.weight, or a tied model's table, quantized into a
     * new lm_head.weight beside it (the loader prefers a stored lm_head). */
    p->tied_src = p->n_src;
    const st_tensor *head = st_find(set, "lm_head.weight");
    const st_tensor *src_head = head ? head : st_find(set, "model.embed_tokens.weight");
    for (size_t i = 0; i < p->n_src; i++) {
        const st_tensor *t = st_at(set, i);
        if (wants_quant(t, qp))
            p->quant[i] = &p->spec;
        else if (qp->head_type != ENGINE_QUANT_NONE && t == src_head && dense_matrix(t)) {
            p->quant[i] = &p->head_spec;
            if (!head)
                p->tied_src = i;
        }
        if ((st = plan_source(p, i, e)))
            return st;
    }
    if ((st = assign_shards(p, qp->max_shard_bytes ? qp->max_shard_bytes : DEFAULT_SHARD, e)))
        return st;

    if ((size_t)snprintf(tmp, PATH_MAX, "%s.tmp-XXXXXX", out) >= PATH_MAX || !mkdtemp(tmp)) {
        const int saved = errno;
        tmp[0] = '\0';
        return err_set(e, ENGINE_ERR_IO, "%s: cannot create a temporary folder beside it: %s", out, strerror(saved));
    }
    p->tmp = tmp;
    int *fds = calloc((size_t)p->n_shards, sizeof *fds);
    uint64_t *data_start = calloc((size_t)p->n_shards, sizeof *data_start);
    if (!fds || !data_start) {
        free(fds);
        free(data_start);
        return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "quantize: out of memory");
    }
    for (int s = 0; s < p->n_shards; s++)
        fds[s] = -1;
    st = ENGINE_OK;
    for (int s = 0; s < p->n_shards && !st; s++) {
        char name[64], path[PATH_MAX + 80];
        shard_name(name, sizeof name, s, p->n_shards);
        snprintf(path, sizeof path, "%s/%s", tmp, name);
        size_t hlen = 0;
        char *hdr = shard_header(p, s, &hlen);
        fds[s] = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
        uint8_t len8[8];
        for (int b = 0; b < 8; b++)
            len8[b] = (uint8_t)((uint64_t)hlen >> (8 * b));
        data_start[s] = 8 + hlen;
        if (!hdr)
            st = err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "%s: out of memory for the header", path);
        else if (fds[s] < 0 || !write_at(fds[s], len8, 8, 0) || !write_at(fds[s], hdr, hlen, 8) ||
                 ftruncate(fds[s], (off_t)(data_start[s] + p->shard_bytes[s])) != 0)
            st = err_set(e, ENGINE_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
        free(hdr);
    }
    uint64_t in_bytes = 0, out_bytes = 0;
    size_t n_quant = 0;
    for (size_t i = 0, k = 0; i < p->n_src && !st; i++) {
        while (k < p->n_parts && p->parts[k].src < i)
            k++;
        engine_quantize_tensor info;
        memset(&info, 0, sizeof info);
        info.index = i;
        info.count = p->n_src;
        st = write_source(p, i, k, fds, data_start, n_threads, &info, e);
        in_bytes += info.bytes_in;
        out_bytes += info.bytes_out;
        n_quant += p->quant[i] != NULL;
        if (!st && qp->on_tensor)
            qp->on_tensor(&info, qp->user);
    }
    for (int s = 0; s < p->n_shards; s++)
        if (fds[s] >= 0 && close(fds[s]) != 0 && !st)
            st = err_set(e, ENGINE_ERR_IO, "%s: closing a shard failed: %s", tmp, strerror(errno));
    free(fds);
    free(data_start);
    if (!st && p->n_shards > 1)
        st = write_index(p, tmp, e);
    static const char *const EXTRA[] = {"config.json",   "generation_config.json",  "tokenizer.json",
                                        "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                                        "chat_template.jinja"};
    for (size_t f = 0; f < sizeof EXTRA / sizeof EXTRA[0] && !st; f++) {
        char from[PATH_MAX + 64], to[PATH_MAX + 64];
        snprintf(from, sizeof from, "%s/%s", dir, EXTRA[f]);
        snprintf(to, sizeof to, "%s/%s", tmp, EXTRA[f]);
        st = copy_file(from, to, e);
    }
    /* mkdtemp made the folder private; the result should read like any checkpoint. */
    if (!st && chmod(tmp, 0755) != 0)
        st = err_set(e, ENGINE_ERR_IO, "%s: chmod failed: %s", tmp, strerror(errno));
    if (!st && rename(tmp, out) != 0)
        st = err_set(e, ENGINE_ERR_IO, "%s: cannot rename %s to it: %s", out, tmp, strerror(errno));
    if (!st && stats) {
        stats->bytes_in = in_bytes;
        stats->bytes_out = out_bytes;
        stats->n_tensors = p->n_src;
        stats->n_quantized = n_quant;
        stats->n_shards = p->n_shards;
    }
    return st;
}

engine_status engine_quantize(const char *in, const char *out, const engine_quantize_params *params,
                              engine_quantize_stats *stats, char *err, size_t err_size)
{
    err_buf e;
    err_clear(&e);
    engine_quantize_params qp = params ? *params : engine_quantize_default_params();
    if (stats)
        memset(stats, 0, sizeof *stats);
    plan p;
    memset(&p, 0, sizeof p);
    st_set *set = NULL;
    char dir[PATH_MAX], weights[PATH_MAX], tmp[PATH_MAX];
    tmp[0] = '\0';
    engine_status st = ENGINE_OK;
    struct stat sb;
    if (!in || !out) {
        st = err_set(&e, ENGINE_ERR_INVALID_ARG, "engine_quantize: in and out must not be NULL");
    } else if (!quant_spec_of(qp.type, &p.spec)) {
        st = err_set(&e, ENGINE_ERR_INVALID_ARG, "engine_quantize: unknown quantization type %d", (int)qp.type);
    } else if (qp.head_type != ENGINE_QUANT_NONE && !quant_spec_of(qp.head_type, &p.head_spec)) {
        st = err_set(&e, ENGINE_ERR_INVALID_ARG, "engine_quantize: unknown quantization type %d for the output head",
                     (int)qp.head_type);
    } else if (stat(out, &sb) == 0) {
        st = err_set(&e, ENGINE_ERR_IO, "%s: already exists; give a new folder name", out);
    } else if (!(st = model_resolve_paths(in, dir, weights, &e)) && !(st = st_open(weights, &set, &e))) {
        st = quantize_run(&p, set, dir, out, tmp, &qp, stats, &e);
    }
    if (st && tmp[0])
        remove_tree(tmp);
    free(p.quant);
    free(p.parts);
    free(p.shard_bytes);
    st_close(set);
    err_copy_out(&e, err, err_size);
    return st;
}
