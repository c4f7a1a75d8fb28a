/*
 * safetensors.h: read-only, zero-copy views of safetensors checkpoints.
 *
 * A checkpoint is one .safetensors file or several shards listed by a
 * model.safetensors.index.json. Each file is mapped with mmap(PROT_READ,
 * MAP_SHARED); every header is validated before any tensor byte is touched:
 * header length within the file, valid JSON, known dtype, shape x dtype size
 * equal to the offset range, ranges inside the data area and not overlapping.
 * Tensor data pointers point into the mapping and stay valid until st_close().
 *
 * A file truncated while mapped would kill the process with SIGBUS on the
 * next read past its new end. Instead (st_guard.h) such a read gives zeros
 * and st_check() reports the file: callers check before and after each
 * computation that reads the mapping.
 */
#ifndef ENGINE_SAFETENSORS_H
#define ENGINE_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "../engine/error.h"

#define ST_MAX_DIMS 8

typedef enum st_dtype {
    ST_F32 = 0,
    ST_F16,
    ST_BF16,
    ST_F64,
    ST_I8,
    ST_U8,
    ST_I16,
    ST_I32,
    ST_I64,
    ST_BOOL,
    ST_F8_E4M3,
    ST_F8_E5M2,
    ST_DTYPE_COUNT
} st_dtype;

typedef struct st_tensor {
    const char *name;        /* NUL-terminated, owned by the st_set        */
    st_dtype dtype;
    int n_dims;
    int64_t shape[ST_MAX_DIMS]; /* outermost first, as in the file        */
    uint64_t n_elements;
    const void *data;        /* into the mapping; nbytes long              */
    uint64_t nbytes;
    int shard;               /* index of the file holding it               */
} st_tensor;

typedef struct st_set st_set;

/* Bytes per element of a dtype; 0 for an invalid value. */
size_t st_dtype_size(st_dtype t);
/* "F32", "BF16", ... as written in safetensors headers. */
const char *st_dtype_name(st_dtype t);

/*
 * Open a single .safetensors file, or a model.safetensors.index.json (every
 * shard it names, resolved relative to the index's folder). On failure
 * returns a status and fills e with "<file>: <problem>"; *out is NULL.
 */
engine_status st_open(const char *path, st_set **out, err_buf *e);
void st_close(st_set *s); /* NULL is a no-op */

size_t st_count(const st_set *s);
const st_tensor *st_at(const st_set *s, size_t i);
/* Tensor by exact name, or NULL. O(1) average. */
const st_tensor *st_find(const st_set *s, const char *name);
/* A string value from a file's "__metadata__" (first shard that has it), or NULL. */
const char *st_metadata(const st_set *s, const char *key);
/* Number of files mapped, path of one, and total bytes of tensor data. */
int st_n_files(const st_set *s);
const char *st_file_path(const st_set *s, int shard);
uint64_t st_total_bytes(const st_set *s);
/* The whole read-only mapping of one file and its length (for pinning it); NULL when out of range. */
const void *st_file_map(const st_set *s, int shard, size_t *len);
/*
 * ENGINE_ERR_IO, naming the file, when a mapped file is now shorter than
 * when it was mapped or a read past its end was turned into zeros; then
 * the views hold garbage and the set must be closed. One fstat per file.
 */
engine_status st_check(const st_set *s, err_buf *e);

#endif
