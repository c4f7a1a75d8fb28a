/*
 * safetensors.c: opening a safetensors checkpoint (one file, or the shards a
 * model.safetensors.index.json lists), validating every header in full before
 * any tensor byte is touched, and name lookup over the result.
 *
 * Each file is mapped whole; its tensor names and metadata are copied into
 * one block per file so that the JSON can be freed straight after parsing.
 * The file stays open while mapped, so that st_check() can see it shrink,
 * and the mapping is guarded against SIGBUS (st_guard.c).
 */
#define _POSIX_C_SOURCE 200809L

#include "safetensors.h"
#include "json_kind.h"
#include "st_guard.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* The reference implementation refuses headers above 100 MB; a larger one is
 * an attack or garbage, never a checkpoint. */
#define ST_MAX_HEADER 100000000ull
/* An index lists names only; even a 400B model's is a few hundred KB. */
#define ST_MAX_INDEX (64ull << 20)

typedef struct st_meta {
    const char *key, *value; /* into the file's string block */
} st_meta;

typedef struct st_file {
    char *path;
    void *map; /* the whole file, PROT_READ; NULL until mapped */
    size_t map_len;
    int fd;           /* open while mapped */
    int guard;        /* st_guard slot + 1; 0 = unguarded */
    atomic_int faulted; /* a read past a shrunken end became zeros */
    char *strings; /* this file's tensor names and metadata, NUL-terminated */
    st_meta *meta;
    size_t n_meta;
} st_file;

struct st_set {
    st_file *files;
    int n_files;
    st_tensor *tensors; /* shard by shard, each in data-offset order */
    size_t n_tensors;
    size_t *slots; /* open addressing: tensor index + 1, 0 = empty */
    size_t n_slots; /* a power of two, at least twice n_tensors */
    uint64_t total_bytes;
};

/* A tensor while its file is validated: the range is checked against the
 * others before data pointers are formed. */
typedef struct st_entry {
    st_tensor t;
    uint64_t begin, end;
} st_entry;

static const struct {
    const char *name;
    size_t size;
} st_dtypes[ST_DTYPE_COUNT] = {
    [ST_F32] = {"F32", 4},   [ST_F16] = {"F16", 2},   [ST_BF16] = {"BF16", 2},
    [ST_F64] = {"F64", 8},   [ST_I8] = {"I8", 1},     [ST_U8] = {"U8", 1},
    [ST_I16] = {"I16", 2},   [ST_I32] = {"I32", 4},   [ST_I64] = {"I64", 8},
    [ST_BOOL] = {"BOOL", 1}, [ST_F8_E4M3] = {"F8_E4M3", 1}, [ST_F8_E5M2] = {"F8_E5M2", 1},
};

size_t st_dtype_size(st_dtype t)
{
    return (unsigned)t < ST_DTYPE_COUNT ? st_dtypes[t].size : 0;
}

const char *st_dtype_name(st_dtype t)
{
    return (unsigned)t < ST_DTYPE_COUNT ? st_dtypes[t].name : "?";
}

static int st_dtype_parse(const char *s)
{
    for (int i = 0; i < ST_DTYPE_COUNT; i++)
        if (strcmp(s, st_dtypes[i].name) == 0)
            return i;
    return -1;
}

/* strerror() may share a buffer between threads; the XSI strerror_r does not. */
static const char *st_strerror(int err, char *buf, size_t n)
{
    if (strerror_r(err, buf, n) != 0)
        snprintf(buf, n, "error %d", err);
    return buf;
}

/* ------------------------------------------------------------ name lookup */

static uint64_t st_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static const st_tensor *st_lookup(const st_set *s, const char *name)
{
    if (!s->n_slots)
        return NULL;
    const size_t mask = s->n_slots - 1;
    for (size_t i = st_hash(name) & mask;; i = (i + 1) & mask) {
        size_t v = s->slots[i];
        if (!v)
            return NULL;
        if (strcmp(s->tensors[v - 1].name, name) == 0)
            return &s->tensors[v - 1];
    }
}

/* Index every tensor by name; a name held by two shards is an error. */
static engine_status st_build_index(st_set *s, err_buf *e)
{
    size_t n = 16;
    while (n < 2 * s->n_tensors)
        n *= 2;
    s->slots = calloc(n, sizeof *s->slots);
    if (!s->slots)
        return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "%s: out of memory for the tensor index", s->files[0].path);
    s->n_slots = n;
    for (size_t t = 0; t < s->n_tensors; t++) {
        const st_tensor *cur = &s->tensors[t];
        size_t i = st_hash(cur->name) & (n - 1);
        for (; s->slots[i]; i = (i + 1) & (n - 1)) {
            const st_tensor *old = &s->tensors[s->slots[i] - 1];
            if (strcmp(old->name, cur->name) == 0)
                return err_set(e, ENGINE_ERR_FORMAT, "%s: tensor '%s' is also in %s", s->files[cur->shard].path,
                               cur->name, s->files[old->shard].path);
        }
        s->slots[i] = t + 1;
    }
    return ENGINE_OK;
}

/* ------------------------------------------------------------ one file */

static engine_status st_map(st_file *f, err_buf *e)
{
    char eb[128];
    int fd = open(f->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return err_set(e, ENGINE_ERR_IO, "%s: cannot open: %s", f->path, st_strerror(errno, eb, sizeof eb));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int err = errno;
        close(fd);
        return err_set(e, ENGINE_ERR_IO, "%s: cannot stat: %s", f->path, st_strerror(err, eb, sizeof eb));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return err_set(e, ENGINE_ERR_IO, "%s: not a regular file", f->path);
    }
    if (sb.st_size < 8) {
        close(fd);
        return err_set(e, ENGINE_ERR_FORMAT, "%s: file is %lld bytes, too short for the 8-byte header length",
                       f->path, (long long)sb.st_size);
    }
    if ((uint64_t)sb.st_size > SIZE_MAX) {
        close(fd);
        return err_set(e, ENGINE_ERR_UNSUPPORTED, "%s: file of %lld bytes cannot be mapped on this system", f->path,
                       (long long)sb.st_size);
    }
    void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        int err = errno;
        close(fd);
        return err_set(e, ENGINE_ERR_IO, "%s: cannot map: %s", f->path, st_strerror(err, eb, sizeof eb));
    }
    f->map = p;
    f->map_len = (size_t)sb.st_size;
    f->fd = fd; /* kept: st_check() compares its size with the mapping's */
    f->guard = st_guard_add(p, f->map_len, &f->faulted) + 1;
    /* Every byte will be read front to back on the first pass: start the
     * read-ahead now rather than fault page by page. Advice only. */
    posix_madvise(p, f->map_len, POSIX_MADV_WILLNEED);
    return ENGINE_OK;
}

static char *st_copy_string(char **dst, const char *src)
{
    char *out = *dst;
    size_t n = strlen(src) + 1;
    memcpy(out, src, n);
    *dst += n;
    return out;
}

/* Validate one header entry; fills out->t (name and data set by the caller). */
static engine_status st_parse_entry(const char *path, const char *name, const json_t *v, uint64_t data_len,
                                    st_entry *out, err_buf *e)
{
    if (!json_is_object(v))
        return err_set(e, ENGINE_ERR_FORMAT, "%s: tensor '%s' is %s, not an object", path, name, json_kind(v));

    const json_t *dt = json_object_get(v, "dtype");
    if (!json_is_string(dt))
        return err_set(e, ENGINE_ERR_FORMAT, "%s: tensor '%s' has no 'dtype' string", path, name);
    int dtype = st_dtype_parse(json_string_value(dt));
    if (dtype < 0)
        return err_set(e, ENGINE_ERR_FORMAT, "%s: tensor '%s' dtype '%s' is unknown", path, name,
                       json_string_value(dt));
    out->t.dtype = (st_dtype)dtype;

    const json_t *shape = json_object_get(v, "shape");
    if (!json_is_array(shape))
        return err_set(e, ENGINE_ERR_FORMAT, "%s: tensor '%s' has no 'shape' array", path, name);
    size_t nd = json_array_size(shape);
    if (nd > ST_MAX_DIMS)
        return err_set(e, ENGINE_ERR_UNSUPPORTED, "%s: tensor '%s' has %zu dimensions; at most %d are supported",
                       path, name, nd, ST_MAX_DIMS);
    bool has_zero = false;
    for (size_t i = 0; i < nd; i++) {
        const json_t *d = json_array_get(shape, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return err_set(e, ENGINE_ERR_FORMAT, "%s: tensor '%s' shape[%zu] is not a non-negative integer", path,
                           name, i);
        out->t.shape[i] = (int64_t)json_integer_value(d);
        has_zero |= out->t.shape[i] == 0;
    }
    out->t.n_dims = (int)nd;
    /* A zero dimension makes the product 0 however large the others are. */
    const uint64_t es = st_dtypes[dtype].size;
    uint64_t n = has_zero ? 0 : 1;
    for (size_t i = 0; i < nd && n; i++) {
        const uint64_t x = (uint64_t)out->t.shape[i];
        if (n > UINT64_MAX / x || n * x > UINT64_MAX / es)
            return err_set(e, ENGINE_ERR_FORMAT, "%s: tensor '%s' shape has more bytes than 64 bits can count",
                           path, name);
        n *= x;
    }
    out->t.n_elements = n;
    out->t.nbytes = n * es;

    const json_t *off = json_object_get(v, "data_offsets");
    const json_t *b = json_array_get(off, 0), *en = json_array_get(off, 1);
    if (!json_is_array(off) || json_array_size(off) != 2 || !json_is_integer(b) || !json_is_integer(en) ||
        json_integer_value(b) < 0 || json_integer_value(en) < 0)
        return err_set(e, ENGINE_ERR_FORMAT, "%s: tensor '%s' 'data_offsets' is not two non-negative integers", path,
                       name);
    out->begin = (uint64_t)json_integer_value(b);
    out->end = (uint64_t)json_integer_value(en);
    if (out->begin > out->end)
        return err_set(e, ENGINE_ERR_FORMAT, "%s: tensor '%s' data_offsets [%llu, %llu] begin after end", path, name,
                       (unsigned long long)out->begin, (unsigned long long)out->end);
    if (out->end > data_len)
        return err_set(e, ENGINE_ERR_FORMAT,
                       "%s: tensor '%s' data_offsets end %llu is beyond the data area (%llu bytes)", path, name,
                       (unsigned long long)out->end, (unsigned long long)data_len);
    if (out->end - out->begin != out->t.nbytes)
        return err_set(e, ENGINE_ERR_FORMAT,
                       "%s: tensor '%s' has %llu bytes of data but %llu %s elements need %llu", path, name,
                       (unsigned long long)(out->end - out->begin), (unsigned long long)n, st_dtypes[dtype].name,
                       (unsigned long long)out->t.nbytes);
    return ENGINE_OK;
}

static int st_entry_cmp(const void *pa, const void *pb)
{
    const st_entry *a = pa, *b = pb;
    if (a->begin != b->begin)
        return a->begin < b->begin ? -1 : 1;
    return (a->end > b->end) - (a->end < b->end);
}

/* Copy "__metadata__" (string to string) into f. */
static engine_status st_parse_metadata(st_file *f, const json_t *meta, char **strings, err_buf *e)
{
    f->meta = calloc(json_object_size(meta) ? json_object_size(meta) : 1, sizeof *f->meta);
    if (!f->meta)
        return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "%s: out of memory", f->path);
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)meta, key, v)
    {
        f->meta[f->n_meta].key = st_copy_string(strings, key);
        f->meta[f->n_meta].value = st_copy_string(strings, json_string_value(v));
        f->n_meta++;
    }
    return ENGINE_OK;
}

/* Every check on a parsed header; appends the file's tensors to s on success. */
static engine_status st_parse_header(st_set *s, int shard, const json_t *root, const uint8_t *data,
                                     uint64_t data_len, err_buf *e)
{
    st_file *f = &s->files[shard];
    if (!json_is_object(root))
        return err_set(e, ENGINE_ERR_FORMAT, "%s: header is %s, not a JSON object", f->path, json_kind(root));

    /* First pass: sizes, so that names land in one block per file. */
    const json_t *meta = NULL;
    size_t n_tensors = 0, n_bytes = 0;
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)root, key, v)
    {
        if (strcmp(key, "__metadata__") == 0) {
            if (!json_is_object(v))
                return err_set(e, ENGINE_ERR_FORMAT, "%s: '__metadata__' is %s, not an object", f->path,
                               json_kind(v));
            const char *mk;
            json_t *mv;
            json_object_foreach(v, mk, mv)
            {
                if (!json_is_string(mv))
                    return err_set(e, ENGINE_ERR_FORMAT, "%s: '__metadata__' value '%s' is %s, not a string",
                                   f->path, mk, json_kind(mv));
                n_bytes += strlen(mk) + strlen(json_string_value(mv)) + 2;
            }
            meta = v;
            continue;
        }
        n_tensors++;
        n_bytes += strlen(key) + 1;
    }

    f->strings = malloc(n_bytes ? n_bytes : 1);
    st_entry *ent = calloc(n_tensors ? n_tensors : 1, sizeof *ent);
    if (!f->strings || !ent) {
        free(ent);
        return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "%s: out of memory for %zu tensors", f->path, n_tensors);
    }
    char *sp = f->strings;
    engine_status st = ENGINE_OK;
    size_t k = 0;
    json_object_foreach((json_t *)root, key, v)
    {
        if (strcmp(key, "__metadata__") == 0)
            continue;
        if ((st = st_parse_entry(f->path, key, v, data_len, &ent[k], e)))
            goto done;
        ent[k].t.name = st_copy_string(&sp, key);
        ent[k].t.shard = shard;
        k++;
    }
    if (meta && (st = st_parse_metadata(f, meta, &sp, e)))
        goto done;

    /* Sorted by start, two non-empty ranges overlap iff one starts before
     * the furthest end so far; empty ranges cover no byte and cannot. */
    qsort(ent, n_tensors, sizeof *ent, st_entry_cmp);
    const st_entry *last = NULL;
    for (size_t i = 0; i < n_tensors; i++) {
        if (ent[i].begin == ent[i].end)
            continue;
        if (last && ent[i].begin < last->end) {
            st = err_set(e, ENGINE_ERR_FORMAT, "%s: tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap",
                         f->path, last->t.name, (unsigned long long)last->begin, (unsigned long long)last->end,
                         ent[i].t.name, (unsigned long long)ent[i].begin, (unsigned long long)ent[i].end);
            goto done;
        }
        if (!last || ent[i].end > last->end)
            last = &ent[i];
    }

    st_tensor *grown = realloc(s->tensors, (s->n_tensors + n_tensors + 1) * sizeof *grown);
    if (!grown) {
        st = err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "%s: out of memory for %zu tensors", f->path, n_tensors);
        goto done;
    }
    s->tensors = grown;
    for (size_t i = 0; i < n_tensors; i++) {
        st_tensor *t = &s->tensors[s->n_tensors++];
        *t = ent[i].t;
        t->data = data + ent[i].begin;
        s->total_bytes += t->nbytes;
    }
done:
    free(ent);
    return st;
}

static engine_status st_load_file(st_set *s, int shard, err_buf *e)
{
    st_file *f = &s->files[shard];
    engine_status st = st_map(f, e);
    if (st)
        return st;
    const uint8_t *b = f->map;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | b[i];
    const uint64_t avail = f->map_len - 8;
    if (n > avail)
        return err_set(e, ENGINE_ERR_FORMAT, "%s: header length %llu exceeds file size %zu", f->path,
                       (unsigned long long)n, f->map_len);
    if (n > ST_MAX_HEADER)
        return err_set(e, ENGINE_ERR_FORMAT, "%s: header length %llu exceeds the limit of %llu bytes", f->path,
                       (unsigned long long)n, ST_MAX_HEADER);

    json_error_t je;
    json_t *root = json_loadb((const char *)b + 8, (size_t)n, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return err_set(e, ENGINE_ERR_FORMAT, "%s: invalid JSON header (line %d, column %d): %s", f->path, je.line,
                       je.column, je.text);
    st = st_parse_header(s, shard, root, b + 8 + n, avail - n, e);
    json_decref(root);
    return st;
}

/* ------------------------------------------------------------ sharded */

static bool st_ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static engine_status st_read_index(const char *path, json_t **out, err_buf *e)
{
    char eb[128];
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return err_set(e, ENGINE_ERR_IO, "%s: cannot open: %s", path, st_strerror(errno, eb, sizeof eb));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int err = errno;
        close(fd);
        return err_set(e, ENGINE_ERR_IO, "%s: cannot stat: %s", path, st_strerror(err, eb, sizeof eb));
    }
    if (!S_ISREG(sb.st_mode) || (uint64_t)sb.st_size > ST_MAX_INDEX) {
        close(fd);
        if (!S_ISREG(sb.st_mode))
            return err_set(e, ENGINE_ERR_IO, "%s: not a regular file", path);
        return err_set(e, ENGINE_ERR_FORMAT, "%s: index of %lld bytes is implausibly large", path,
                       (long long)sb.st_size);
    }
    size_t len = (size_t)sb.st_size, got = 0;
    char *buf = malloc(len ? len : 1);
    if (!buf) {
        close(fd);
        return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    }
    while (got < len) {
        ssize_t r = read(fd, buf + got, len - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            int err = r < 0 ? errno : EIO;
            free(buf);
            close(fd);
            return err_set(e, ENGINE_ERR_IO, "%s: cannot read: %s", path, st_strerror(err, eb, sizeof eb));
        }
        got += (size_t)r;
    }
    close(fd);
    json_error_t je;
    *out = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
    free(buf);
    if (!*out)
        return err_set(e, ENGINE_ERR_FORMAT, "%s: invalid JSON (line %d, column %d): %s", path, je.line, je.column,
                       je.text);
    return ENGINE_OK;
}

static int st_strptr_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Shard i of names (sorted), or -1. */
static int st_shard_of(const char **names, int n, const char *name)
{
    const char **p = bsearch(&name, names, (size_t)n, sizeof *names, st_strptr_cmp);
    return p ? (int)(p - names) : -1;
}

static engine_status st_open_index(st_set *s, const char *path, err_buf *e)
{
    json_t *root;
    engine_status st = st_read_index(path, &root, e);
    if (st)
        return st;
    const char **names = NULL;
    const json_t *map = json_object_get(root, "weight_map");
    if (!json_is_object(root) || !json_is_object(map)) {
        st = err_set(e, ENGINE_ERR_FORMAT, "%s: no 'weight_map' object", path);
        goto done;
    }
    size_t n_entries = json_object_size(map);
    if (n_entries == 0) {
        st = err_set(e, ENGINE_ERR_FORMAT, "%s: 'weight_map' is empty", path);
        goto done;
    }
    names = malloc(n_entries * sizeof *names);
    if (!names) {
        st = err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
        goto done;
    }
    size_t n = 0;
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)map, key, v)
    {
        if (!json_is_string(v) || json_string_length(v) == 0) {
            st = err_set(e, ENGINE_ERR_FORMAT, "%s: weight_map entry '%s' is not a file name", path, key);
            goto done;
        }
        names[n++] = json_string_value(v);
    }
    /* Sorting gives shards a stable order (00001 first) and makes them unique. */
    qsort(names, n, sizeof *names, st_strptr_cmp);
    size_t n_shards = 0;
    for (size_t i = 0; i < n; i++)
        if (i == 0 || strcmp(names[i], names[n_shards - 1]) != 0)
            names[n_shards++] = names[i];

    s->files = calloc(n_shards, sizeof *s->files);
    if (!s->files) {
        st = err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
        goto done;
    }
    const char *slash = strrchr(path, '/');
    const size_t dir_len = slash ? (size_t)(slash - path) + 1 : 0;
    for (size_t i = 0; i < n_shards; i++) {
        st_file *f = &s->files[i];
        size_t len = dir_len + strlen(names[i]) + 1;
        f->path = malloc(len);
        if (!f->path) {
            st = err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
            goto done;
        }
        memcpy(f->path, path, dir_len);
        memcpy(f->path + dir_len, names[i], len - dir_len);
        s->n_files++;
        if ((st = st_load_file(s, (int)i, e))) {
            /* A missing shard is found through the index: say which one. */
            if (st == ENGINE_ERR_IO && e) {
                size_t used = strlen(e->msg);
                snprintf(e->msg + used, sizeof e->msg - used, " (a shard named by %s)", path + dir_len);
            }
            goto done;
        }
    }
    if ((st = st_build_index(s, e)))
        goto done;

    json_object_foreach((json_t *)map, key, v)
    {
        int want = st_shard_of(names, (int)n_shards, json_string_value(v));
        const st_tensor *t = st_lookup(s, key);
        if (!t || t->shard != want) {
            st = err_set(e, ENGINE_ERR_FORMAT, "%s: weight_map puts tensor '%s' in %s, which does not hold it", path,
                         key, json_string_value(v));
            goto done;
        }
    }
done:
    free(names);
    json_decref(root);
    return st;
}

/* ------------------------------------------------------------ public */

engine_status st_open(const char *path, st_set **out, err_buf *e)
{
    if (!out)
        return err_set(e, ENGINE_ERR_INVALID_ARG, "st_open: out is NULL");
    *out = NULL;
    if (!path)
        return err_set(e, ENGINE_ERR_INVALID_ARG, "st_open: path is NULL");
    st_set *s = calloc(1, sizeof *s);
    if (!s)
        return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    engine_status st;
    if (st_ends_with(path, ".index.json")) {
        st = st_open_index(s, path, e);
    } else {
        s->files = calloc(1, sizeof *s->files);
        if (s->files)
            s->files[0].path = strdup(path);
        if (!s->files || !s->files[0].path) {
            st = err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
        } else {
            s->n_files = 1;
            st = st_load_file(s, 0, e);
            if (!st)
                st = st_build_index(s, e);
        }
    }
    if (st) {
        st_close(s);
        return st;
    }
    *out = s;
    return ENGINE_OK;
}

void st_close(st_set *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->n_files; i++) {
        st_file *f = &s->files[i];
        if (f->map) {
            st_guard_remove(f->guard - 1);
            munmap(f->map, f->map_len);
            close(f->fd);
        }
        free(f->path);
        free(f->strings);
        free(f->meta);
    }
    free(s->files);
    free(s->tensors);
    free(s->slots);
    free(s);
}

size_t st_count(const st_set *s)
{
    return s ? s->n_tensors : 0;
}

const st_tensor *st_at(const st_set *s, size_t i)
{
    return s && i < s->n_tensors ? &s->tensors[i] : NULL;
}

const st_tensor *st_find(const st_set *s, const char *name)
{
    return s && name ? st_lookup(s, name) : NULL;
}

const char *st_metadata(const st_set *s, const char *key)
{
    if (!s || !key)
        return NULL;
    for (int i = 0; i < s->n_files; i++)
        for (size_t j = 0; j < s->files[i].n_meta; j++)
            if (strcmp(s->files[i].meta[j].key, key) == 0)
                return s->files[i].meta[j].value;
    return NULL;
}

int st_n_files(const st_set *s)
{
    return s ? s->n_files : 0;
}

const char *st_file_path(const st_set *s, int shard)
{
    return s && shard >= 0 && shard < s->n_files ? s->files[shard].path : NULL;
}

const void *st_file_map(const st_set *s, int shard, size_t *len)
{
    if (!s || shard < 0 || shard >= s->n_files) {
        *len = 0;
        return NULL;
    }
    *len = s->files[shard].map_len;
    return s->files[shard].map;
}

uint64_t st_total_bytes(const st_set *s)
{
    return s ? s->total_bytes : 0;
}

engine_status st_check(const st_set *s, err_buf *e)
{
    if (!s)
        return ENGINE_OK;
    for (int i = 0; i < s->n_files; i++) {
        const st_file *f = &s->files[i];
        if (!f->map)
            continue;
        if (atomic_load((atomic_int *)&f->faulted))
            return err_set(e, ENGINE_ERR_IO,
                           "%s: the file was truncated while in use (the reads past its end gave zeros); reload the "
                           "model", f->path);
        struct stat sb;
        if (fstat(f->fd, &sb) == 0 && (uint64_t)sb.st_size < f->map_len)
            return err_set(e, ENGINE_ERR_IO, "%s: truncated to %lld bytes after it was loaded (it had %zu); reload "
                           "the model", f->path, (long long)sb.st_size, f->map_len);
    }
    return ENGINE_OK;
}
