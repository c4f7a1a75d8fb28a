/*
 * fuzz_st_index: arbitrary bytes as a model.safetensors.index.json beside
 * three fixed shards (a.safetensors: x, y; b.safetensors: z; c.safetensors:
 * no tensors). st_open() must refuse the index with a message naming a
 * file, or give a set in which every tensor is found by name, lies in the
 * shard the index names, and can be read.
 */
#include "fuzz_util.h"

#include <string.h>

#include "loaders/safetensors.h"

static char dir[64], index_path[128];
static volatile unsigned sink;

static void write_shard(const char *name, const char *header, size_t data_len)
{
    char path[160];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    const size_t hl = strlen(header);
    for (int i = 0; f && i < 8; i++)
        fputc((int)((hl >> (8 * i)) & 255), f);
    if (!f || fwrite(header, 1, hl, f) != hl) {
        perror(path);
        abort();
    }
    for (size_t i = 0; i < data_len; i++)
        fputc((int)i, f);
    fclose(f);
}

static void remove_dir(void)
{
    static const char *const names[] = {"a.safetensors", "b.safetensors", "c.safetensors",
                                        "model.safetensors.index.json"};
    for (size_t i = 0; i < 4; i++) {
        char path[160];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        unlink(path);
    }
    rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    snprintf(dir, sizeof dir, "%s/fuzz_index_XXXXXX", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        exit(1);
    }
    atexit(remove_dir);
    write_shard("a.safetensors",
                "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                "\"y\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[8,16]}}",
                16);
    write_shard("b.safetensors", "{\"z\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}", 3);
    write_shard("c.safetensors", "{\"__metadata__\":{\"format\":\"pt\"}}", 0);
    snprintf(index_path, sizeof index_path, "%s/model.safetensors.index.json", dir);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    FILE *f = fopen(index_path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0)
        abort();
    st_set *s = NULL;
    err_buf e;
    err_clear(&e);
    if (st_open(index_path, &s, &e) != ENGINE_OK) {
        FUZZ_ASSERT(s == NULL && strstr(e.msg, dir) != NULL);
        return 0;
    }
    unsigned sum = 0;
    for (size_t i = 0; i < st_count(s); i++) {
        const st_tensor *t = st_at(s, i);
        FUZZ_ASSERT(st_find(s, t->name) == t);
        FUZZ_ASSERT(t->shard >= 0 && t->shard < st_n_files(s));
        const char *shard = st_file_path(s, t->shard);
        FUZZ_ASSERT(shard && strncmp(shard, dir, strlen(dir)) == 0);
        const unsigned char *p = t->data;
        for (uint64_t k = 0; k < t->nbytes; k++)
            sum += p[k];
    }
    FUZZ_ASSERT(st_check(s, &e) == ENGINE_OK);
    sink = sum;
    st_close(s);
    return 0;
}
