/*
 * fuzz_safetensors: arbitrary bytes as a .safetensors file. st_open must
 * either refuse them with a message naming the file, or return views that
 * lie inside the mapping: every tensor's bytes are read, every name looked
 * up, so a view past the end faults here rather than in a kernel.
 */
#include "fuzz_util.h"

#include <string.h>

#include "loaders/safetensors.h"

static fuzz_file input;
static volatile unsigned sink; /* keeps the reads of tensor bytes */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_file_write(&input, data, size);
    st_set *s = NULL;
    err_buf e;
    err_clear(&e);
    engine_status st = st_open(path, &s, &e);
    if (st != ENGINE_OK) {
        FUZZ_ASSERT(s == NULL);
        FUZZ_ASSERT(strncmp(e.msg, path, strlen(path)) == 0); /* names the file */
        return 0;
    }
    uint64_t total = 0;
    unsigned sum = 0;
    for (size_t i = 0; i < st_count(s); i++) {
        const st_tensor *t = st_at(s, i);
        FUZZ_ASSERT(st_find(s, t->name) == t);
        FUZZ_ASSERT(t->nbytes == t->n_elements * st_dtype_size(t->dtype));
        const uint8_t *p = t->data;
        for (uint64_t k = 0; k < t->nbytes; k++)
            sum += p[k];
        total += t->nbytes;
    }
    FUZZ_ASSERT(total == st_total_bytes(s));
    FUZZ_ASSERT(size >= 8 && total <= size - 8); /* disjoint ranges after the header */
    st_metadata(s, "format");
    st_close(s);
    sink = sum;
    return 0;
}
