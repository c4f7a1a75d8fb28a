/*
 * test_safetensors.c: the safetensors loader on files this test writes
 * itself (valid ones read back exactly, sharded sets, and one file per way a
 * header can be wrong), plus the stories260K checkpoint in the repository.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "loaders/safetensors.h"
#include "tests/test_util.h"

static char tmpdir[64];
static char created[128][128];
static int n_created;

static const char *tmp_path(const char *name)
{
    /* Every path handed out is remembered so the folder can be emptied. */
    char *p = created[n_created < 128 ? n_created++ : 127];
    snprintf(p, sizeof created[0], "%s/%s", tmpdir, name);
    return p;
}

static void write_raw(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(p, 1, n, f) != n) || fclose(f) != 0) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(2);
    }
}

/* A file with an explicit header length (which may lie), header text and data. */
static void write_st_len(const char *path, uint64_t hlen, const char *header, size_t header_n, const void *data,
                         size_t data_n)
{
    size_t n = 8 + header_n + data_n;
    unsigned char *buf = malloc(n);
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)(hlen >> (8 * i));
    memcpy(buf + 8, header, header_n);
    if (data_n)
        memcpy(buf + 8 + header_n, data, data_n);
    write_raw(path, buf, n);
    free(buf);
}

/* A well-formed file: header space-padded to a multiple of 8, as writers do. */
static void write_st(const char *path, const char *header, const void *data, size_t data_n)
{
    size_t hn = strlen(header), padded = (hn + 7) / 8 * 8;
    char *h = malloc(padded);
    memcpy(h, header, hn);
    memset(h + hn, ' ', padded - hn);
    write_st_len(path, padded, h, padded, data, data_n);
    free(h);
}

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* st_open must fail with want, leave *out NULL, and name the file and the problem. */
static void expect_fail_named(const char *path, engine_status want, const char *file, const char *needle)
{
    st_set *s = (st_set *)&s; /* poison: must be reset to NULL */
    err_buf e;
    err_clear(&e);
    engine_status got = st_open(path, &s, &e);
    CHECK_MSG(got == want, "%s: status %d, want %d (%s)", base_name(path), got, want, e.msg);
    CHECK_MSG(e.code == want, "%s: err code %d", base_name(path), e.code);
    CHECK_MSG(s == NULL, "%s: out not NULL on failure", base_name(path));
    CHECK_MSG(strstr(e.msg, file) != NULL, "message '%s' does not name %s", e.msg, file);
    CHECK_MSG(strstr(e.msg, needle) != NULL, "message '%s' lacks '%s'", e.msg, needle);
    CHECK_MSG(strchr(e.msg, '\n') == NULL, "message has a newline");
    if (getenv("TEST_VERBOSE"))
        printf("  %s\n", e.msg);
    if (got == ENGINE_OK)
        st_close(s);
}

static void expect_fail(const char *path, engine_status want, const char *needle)
{
    expect_fail_named(path, want, base_name(path), needle);
}

/* A one-tensor file whose header entry is body, with data_n bytes of data. */
static void bad_entry(const char *name, const char *body, size_t data_n, engine_status want, const char *needle)
{
    char header[512];
    snprintf(header, sizeof header, "{\"w\": %s}", body);
    unsigned char data[64] = {0};
    const char *p = tmp_path(name);
    write_st(p, header, data, data_n);
    expect_fail(p, want, needle);
}

static void test_valid(void)
{
    /* Declared out of offset order on purpose: st_at must follow the data. */
    float a[6] = {1.5f, -2.25f, 3.0f, 0.0f, -0.0f, 1e-30f};
    uint16_t h[4] = {0x3C00, 0xC000, 0x7BFF, 0x0001};  /* f16: 1, -2, 65504, min subnormal */
    uint16_t bf[4] = {0x3F80, 0xBF80, 0x7F7F, 0x0080}; /* bf16: 1, -1, max, min normal */
    int8_t i8[3] = {-128, 0, 127};
    uint8_t u8[5] = {0, 1, 128, 254, 255};
    float scalar = 42.0f;
    unsigned char data[64];
    size_t off = 0;
#define PUT(x)                             \
    do {                                   \
        memcpy(data + off, x, sizeof x);   \
        off += sizeof x;                   \
    } while (0)
    PUT(h);        /* [0, 8)   */
    PUT(a);        /* [8, 32)  */
    PUT(bf);       /* [32, 40) */
    PUT(i8);       /* [40, 43) */
    PUT(u8);       /* [43, 48) */
    memcpy(data + off, &scalar, 4); /* [48, 52) */
    off += 4;
#undef PUT
    const char *header =
        "{\"__metadata__\": {\"format\": \"pt\", \"note\": \"hello\"},"
        " \"model.a\": {\"dtype\": \"F32\", \"shape\": [2, 3], \"data_offsets\": [8, 32]},"
        " \"model.u\": {\"dtype\": \"U8\", \"shape\": [5], \"data_offsets\": [43, 48]},"
        " \"model.h\": {\"dtype\": \"F16\", \"shape\": [4], \"data_offsets\": [0, 8]},"
        " \"model.empty\": {\"dtype\": \"F32\", \"shape\": [0, 4], \"data_offsets\": [32, 32]},"
        " \"model.inside\": {\"dtype\": \"BF16\", \"shape\": [3, 0], \"data_offsets\": [4, 4]},"
        " \"model.bf\": {\"dtype\": \"BF16\", \"shape\": [2, 2], \"data_offsets\": [32, 40]},"
        " \"model.i\": {\"dtype\": \"I8\", \"shape\": [3], \"data_offsets\": [40, 43]},"
        " \"model.s\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [48, 52]}}";
    const char *p = tmp_path("valid.safetensors");
    write_st(p, header, data, off);

    st_set *s = NULL;
    err_buf e;
    err_clear(&e);
    engine_status st = st_open(p, &s, &e);
    CHECK_MSG(st == ENGINE_OK && s, "open valid: %s", e.msg);
    if (!s)
        return;
    CHECK(st_count(s) == 8);
    CHECK(st_n_files(s) == 1);
    CHECK(st_file_path(s, 0) && strcmp(st_file_path(s, 0), p) == 0);
    CHECK(st_file_path(s, 1) == NULL);
    CHECK(st_total_bytes(s) == 52);

    const st_tensor *t = st_find(s, "model.a");
    CHECK(t && t->dtype == ST_F32 && t->n_dims == 2 && t->shape[0] == 2 && t->shape[1] == 3);
    CHECK(t && t->n_elements == 6 && t->nbytes == 24 && t->shard == 0);
    CHECK(t && memcmp(t->data, a, sizeof a) == 0);
    t = st_find(s, "model.h");
    CHECK(t && t->dtype == ST_F16 && t->n_elements == 4 && memcmp(t->data, h, sizeof h) == 0);
    t = st_find(s, "model.bf");
    CHECK(t && t->dtype == ST_BF16 && t->n_dims == 2 && memcmp(t->data, bf, sizeof bf) == 0);
    t = st_find(s, "model.i");
    CHECK(t && t->dtype == ST_I8 && t->nbytes == 3 && memcmp(t->data, i8, sizeof i8) == 0);
    t = st_find(s, "model.u");
    CHECK(t && t->dtype == ST_U8 && t->shape[0] == 5 && memcmp(t->data, u8, sizeof u8) == 0);
    t = st_find(s, "model.empty");
    CHECK(t && t->n_elements == 0 && t->nbytes == 0 && t->n_dims == 2 && t->shape[0] == 0 && t->shape[1] == 4);
    /* An empty range covers no byte, so it overlaps nothing even inside another. */
    t = st_find(s, "model.inside");
    CHECK(t && t->n_elements == 0 && t->nbytes == 0 && t->shape[0] == 3);
    t = st_find(s, "model.s");
    float got_scalar = 0;
    CHECK(t && t->n_dims == 0 && t->n_elements == 1 && t->nbytes == 4);
    if (t)
        memcpy(&got_scalar, t->data, 4);
    CHECK(got_scalar == 42.0f);

    CHECK(st_find(s, "model") == NULL);
    CHECK(st_find(s, "model.a ") == NULL);
    CHECK(st_find(s, "__metadata__") == NULL);
    CHECK(st_metadata(s, "format") && strcmp(st_metadata(s, "format"), "pt") == 0);
    CHECK(st_metadata(s, "note") && strcmp(st_metadata(s, "note"), "hello") == 0);
    CHECK(st_metadata(s, "absent") == NULL);

    /* File order: by data offset, whatever the header order. */
    uint64_t prev = 0;
    for (size_t i = 0; i < st_count(s); i++) {
        const st_tensor *ti = st_at(s, i);
        uint64_t begin = (uint64_t)((const unsigned char *)ti->data - (const unsigned char *)st_at(s, 0)->data);
        CHECK_MSG(begin >= prev, "st_at(%zu) '%s' out of offset order", i, ti->name);
        prev = begin;
        CHECK(st_find(s, ti->name) == ti);
    }
    CHECK(st_at(s, 0) && strcmp(st_at(s, 0)->name, "model.h") == 0);
    CHECK(st_at(s, 1) && strcmp(st_at(s, 1)->name, "model.inside") == 0);
    CHECK(st_at(s, st_count(s)) == NULL);
    CHECK(st_dtype_size(ST_BF16) == 2 && st_dtype_size(ST_F64) == 8 && st_dtype_size(ST_DTYPE_COUNT) == 0);
    CHECK(strcmp(st_dtype_name(ST_F8_E4M3), "F8_E4M3") == 0);
    st_close(s);
    st_close(NULL);
}

/* Many names: the hash table must find every one and nothing else. */
static void test_many(void)
{
    enum { N = 1000 };
    size_t cap = 64 + (size_t)N * 96;
    char *header = malloc(cap);
    size_t n = (size_t)snprintf(header, cap, "{");
    for (int i = 0; i < N; i++)
        n += (size_t)snprintf(header + n, cap - n, "%s\"model.layers.%d.w\": {\"dtype\": \"U8\", \"shape\": [1], "
                                                   "\"data_offsets\": [%d, %d]}",
                              i ? ", " : "", i, i, i + 1);
    snprintf(header + n, cap - n, "}");
    unsigned char data[N];
    for (int i = 0; i < N; i++)
        data[i] = (unsigned char)(i * 7);
    const char *p = tmp_path("many.safetensors");
    write_st(p, header, data, N);
    free(header);

    st_set *s = NULL;
    err_buf e;
    CHECK_MSG(st_open(p, &s, &e) == ENGINE_OK, "%s", e.msg);
    if (!s)
        return;
    CHECK(st_count(s) == N);
    int bad = 0;
    char name[64];
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "model.layers.%d.w", i);
        const st_tensor *t = st_find(s, name);
        if (!t || strcmp(t->name, name) != 0 || *(const unsigned char *)t->data != (unsigned char)(i * 7))
            bad++;
        snprintf(name, sizeof name, "model.layers.%d.x", i);
        if (st_find(s, name))
            bad++;
    }
    CHECK_MSG(bad == 0, "%d lookups wrong", bad);
    st_close(s);
}

static void test_sharded(void)
{
    float a[4] = {1, 2, 3, 4}, b[2] = {5, 6}, c[3] = {7, 8, 9};
    unsigned char d1[24], d2[12];
    memcpy(d1, a, 16);
    memcpy(d1 + 16, b, 8);
    memcpy(d2, c, 12);
    write_st(tmp_path("model-00001-of-00002.safetensors"),
             "{\"__metadata__\": {\"format\": \"pt\"},"
             " \"a\": {\"dtype\": \"F32\", \"shape\": [2, 2], \"data_offsets\": [0, 16]},"
             " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [16, 24]}}",
             d1, sizeof d1);
    write_st(tmp_path("model-00002-of-00002.safetensors"),
             "{\"__metadata__\": {\"format\": \"pt\", \"shard\": \"two\"},"
             " \"c\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 12]}}",
             d2, sizeof d2);
    const char *idx = tmp_path("model.safetensors.index.json");
    const char *json = "{\"metadata\": {\"total_size\": 36}, \"weight_map\": {"
                       "\"c\": \"model-00002-of-00002.safetensors\","
                       " \"a\": \"model-00001-of-00002.safetensors\","
                       " \"b\": \"model-00001-of-00002.safetensors\"}}";
    write_raw(idx, json, strlen(json));

    st_set *s = NULL;
    err_buf e;
    CHECK_MSG(st_open(idx, &s, &e) == ENGINE_OK, "sharded: %s", e.msg);
    if (!s)
        return;
    CHECK(st_n_files(s) == 2);
    CHECK(st_count(s) == 3);
    CHECK(st_total_bytes(s) == 36);
    CHECK(st_file_path(s, 0) && strstr(st_file_path(s, 0), "model-00001-of-00002.safetensors"));
    CHECK(st_file_path(s, 1) && strstr(st_file_path(s, 1), "model-00002-of-00002.safetensors"));
    CHECK(st_file_path(s, 1) && strncmp(st_file_path(s, 1), tmpdir, strlen(tmpdir)) == 0);
    const st_tensor *t = st_find(s, "a");
    CHECK(t && t->shard == 0 && memcmp(t->data, a, sizeof a) == 0);
    t = st_find(s, "b");
    CHECK(t && t->shard == 0 && memcmp(t->data, b, sizeof b) == 0);
    t = st_find(s, "c");
    CHECK(t && t->shard == 1 && t->shape[0] == 3 && memcmp(t->data, c, sizeof c) == 0);
    CHECK(st_metadata(s, "shard") && strcmp(st_metadata(s, "shard"), "two") == 0);
    CHECK(st_metadata(s, "format") != NULL);
    st_close(s);

    /* The index names a shard that does not exist. */
    const char *idx2 = tmp_path("missing.safetensors.index.json");
    json = "{\"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\", \"z\": \"model-00009-of-00009.safetensors\"}}";
    write_raw(idx2, json, strlen(json));
    expect_fail_named(idx2, ENGINE_ERR_IO, "model-00009-of-00009.safetensors", "cannot open");

    /* The index puts a tensor in a shard that does not hold it. */
    const char *idx3 = tmp_path("wrong.safetensors.index.json");
    json = "{\"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\", \"c\": \"model-00002-of-00002.safetensors\","
           " \"b\": \"model-00002-of-00002.safetensors\"}}";
    write_raw(idx3, json, strlen(json));
    st_set *s3 = NULL;
    err_buf e3;
    CHECK(st_open(idx3, &s3, &e3) == ENGINE_ERR_FORMAT && s3 == NULL);
    CHECK_MSG(strstr(e3.msg, "wrong.safetensors.index.json") && strstr(e3.msg, "'b'") &&
                  strstr(e3.msg, "model-00002-of-00002.safetensors"),
              "%s", e3.msg);

    /* The index names a tensor no shard has. */
    const char *idx4 = tmp_path("ghost.safetensors.index.json");
    json = "{\"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\", \"ghost\": \"model-00002-of-00002.safetensors\"}}";
    write_raw(idx4, json, strlen(json));
    expect_fail(idx4, ENGINE_ERR_FORMAT, "'ghost'");

    /* One name in two shards. */
    write_st(tmp_path("dup-1.safetensors"), "{\"x\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]}}",
             "A", 1);
    write_st(tmp_path("dup-2.safetensors"), "{\"x\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]}}",
             "B", 1);
    const char *idx5 = tmp_path("dup.safetensors.index.json");
    json = "{\"weight_map\": {\"x\": \"dup-1.safetensors\", \"y\": \"dup-2.safetensors\"}}";
    write_raw(idx5, json, strlen(json));
    expect_fail_named(idx5, ENGINE_ERR_FORMAT, "dup-1.safetensors", "'x'");

    /* Broken index files. */
    const char *idx6 = tmp_path("broken.safetensors.index.json");
    write_raw(idx6, "{\"weight_map\": {", 16);
    expect_fail(idx6, ENGINE_ERR_FORMAT, "invalid JSON");
    const char *idx7 = tmp_path("nomap.safetensors.index.json");
    write_raw(idx7, "{\"metadata\": {}}", 16);
    expect_fail(idx7, ENGINE_ERR_FORMAT, "weight_map");
    const char *idx8 = tmp_path("badval.safetensors.index.json");
    json = "{\"weight_map\": {\"a\": 3}}";
    write_raw(idx8, json, strlen(json));
    expect_fail(idx8, ENGINE_ERR_FORMAT, "'a'");
    /* A shard that is itself malformed: its own name in the message. */
    write_raw(tmp_path("short-1.safetensors"), "abc", 3);
    const char *idx9 = tmp_path("short.safetensors.index.json");
    json = "{\"weight_map\": {\"a\": \"short-1.safetensors\"}}";
    write_raw(idx9, json, strlen(json));
    expect_fail_named(idx9, ENGINE_ERR_FORMAT, "short-1.safetensors", "too short");
    expect_fail(tmp_path("absent.safetensors.index.json"), ENGINE_ERR_IO, "cannot open");
}

static void test_bad(void)
{
    const char *p;
    p = tmp_path("empty.safetensors");
    write_raw(p, "", 0);
    expect_fail(p, ENGINE_ERR_FORMAT, "too short");

    p = tmp_path("four.safetensors");
    write_raw(p, "\x10\0\0\0", 4);
    expect_fail(p, ENGINE_ERR_FORMAT, "too short");

    p = tmp_path("beyond.safetensors");
    write_st_len(p, 1234567, "{}      ", 8, NULL, 0);
    expect_fail(p, ENGINE_ERR_FORMAT, "header length 1234567 exceeds file size 16");

    p = tmp_path("huge.safetensors");
    write_st_len(p, (uint64_t)1 << 63, "{}      ", 8, NULL, 0);
    expect_fail(p, ENGINE_ERR_FORMAT, "header length 9223372036854775808");

    p = tmp_path("all_ones.safetensors");
    write_st_len(p, UINT64_MAX, "{}      ", 8, NULL, 0);
    expect_fail(p, ENGINE_ERR_FORMAT, "exceeds file size");

    p = tmp_path("badjson.safetensors");
    write_st(p, "{\"w\": {\"dtype\": \"F32\",", NULL, 0);
    expect_fail(p, ENGINE_ERR_FORMAT, "invalid JSON");

    p = tmp_path("zerolen.safetensors");
    write_st_len(p, 0, "", 0, "abcd", 4);
    expect_fail(p, ENGINE_ERR_FORMAT, "invalid JSON");

    p = tmp_path("array.safetensors");
    write_st(p, "[1, 2, 3]", NULL, 0);
    expect_fail(p, ENGINE_ERR_FORMAT, "not a JSON object");

    p = tmp_path("dupkey.safetensors");
    write_st(p,
             "{\"w\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]},"
             " \"w\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [1, 2]}}",
             "ab", 2);
    expect_fail(p, ENGINE_ERR_FORMAT, "duplicate");

    p = tmp_path("metanotobj.safetensors");
    write_st(p, "{\"__metadata__\": [1]}", NULL, 0);
    expect_fail(p, ENGINE_ERR_FORMAT, "__metadata__");
    p = tmp_path("metanotstr.safetensors");
    write_st(p, "{\"__metadata__\": {\"n\": 3}}", NULL, 0);
    expect_fail(p, ENGINE_ERR_FORMAT, "'n'");

    bad_entry("unknown_dtype.safetensors", "{\"dtype\": \"Q7\", \"shape\": [1], \"data_offsets\": [0, 1]}", 1,
              ENGINE_ERR_FORMAT, "tensor 'w' dtype 'Q7' is unknown");
    bad_entry("nodtype.safetensors", "{\"shape\": [1], \"data_offsets\": [0, 1]}", 1, ENGINE_ERR_FORMAT, "dtype");
    bad_entry("notobj.safetensors", "[1]", 0, ENGINE_ERR_FORMAT, "'w'");
    bad_entry("neg_shape.safetensors", "{\"dtype\": \"U8\", \"shape\": [-1], \"data_offsets\": [0, 0]}", 0,
              ENGINE_ERR_FORMAT, "shape[0]");
    bad_entry("real_shape.safetensors", "{\"dtype\": \"U8\", \"shape\": [2, 2.5], \"data_offsets\": [0, 5]}", 5,
              ENGINE_ERR_FORMAT, "shape[1]");
    bad_entry("str_shape.safetensors", "{\"dtype\": \"U8\", \"shape\": [\"4\"], \"data_offsets\": [0, 4]}", 4,
              ENGINE_ERR_FORMAT, "shape[0]");
    bad_entry("noshape.safetensors", "{\"dtype\": \"U8\", \"shape\": 4, \"data_offsets\": [0, 4]}", 4,
              ENGINE_ERR_FORMAT, "shape");
    bad_entry("rank9.safetensors",
              "{\"dtype\": \"U8\", \"shape\": [1,1,1,1,1,1,1,1,1], \"data_offsets\": [0, 1]}", 1,
              ENGINE_ERR_UNSUPPORTED, "9 dimensions");
    bad_entry("end_beyond.safetensors", "{\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]}", 12,
              ENGINE_ERR_FORMAT, "beyond the data area");
    bad_entry("begin_after_end.safetensors", "{\"dtype\": \"U8\", \"shape\": [0], \"data_offsets\": [8, 4]}", 8,
              ENGINE_ERR_FORMAT, "begin after end");
    bad_entry("neg_offset.safetensors", "{\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [-1, 0]}", 8,
              ENGINE_ERR_FORMAT, "data_offsets");
    bad_entry("one_offset.safetensors", "{\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0]}", 8,
              ENGINE_ERR_FORMAT, "data_offsets");
    bad_entry("size_mismatch.safetensors", "{\"dtype\": \"F32\", \"shape\": [2, 3], \"data_offsets\": [0, 20]}", 24,
              ENGINE_ERR_FORMAT, "has 20 bytes of data");
    bad_entry("size_dtype.safetensors", "{\"dtype\": \"BF16\", \"shape\": [4], \"data_offsets\": [0, 4]}", 8,
              ENGINE_ERR_FORMAT, "need 8");
    bad_entry("overflow.safetensors",
              "{\"dtype\": \"U8\", \"shape\": [4294967296, 4294967296], \"data_offsets\": [0, 0]}", 0,
              ENGINE_ERR_FORMAT, "64 bits");
    bad_entry("overflow_bytes.safetensors",
              "{\"dtype\": \"F32\", \"shape\": [4611686018427387904, 1], \"data_offsets\": [0, 0]}", 0,
              ENGINE_ERR_FORMAT, "64 bits");
    /* 2^65 elements wrap to 0 in unchecked arithmetic, matching the empty range. */
    bad_entry("overflow_wrap.safetensors",
              "{\"dtype\": \"U8\", \"shape\": [4294967296, 4294967296, 2], \"data_offsets\": [0, 0]}", 0,
              ENGINE_ERR_FORMAT, "64 bits");
    /* ...but a zero dimension makes any product legal and empty. */
    p = tmp_path("zero_dim.safetensors");
    write_st(p, "{\"w\": {\"dtype\": \"F64\", \"shape\": [4294967296, 0, 4294967296], \"data_offsets\": [0, 0]}}",
             NULL, 0);
    st_set *z = NULL;
    err_buf ez;
    CHECK_MSG(st_open(p, &z, &ez) == ENGINE_OK, "%s", ez.msg);
    CHECK(z && st_find(z, "w") && st_find(z, "w")->n_elements == 0 && st_find(z, "w")->shape[2] == 4294967296LL);
    st_close(z);

    p = tmp_path("overlap.safetensors");
    write_st(p,
             "{\"a\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]},"
             " \"b\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [8, 24]}}",
             "0123456789abcdef01234567", 24);
    expect_fail(p, ENGINE_ERR_FORMAT, "overlap");
    p = tmp_path("contained.safetensors");
    write_st(p,
             "{\"a\": {\"dtype\": \"U8\", \"shape\": [16], \"data_offsets\": [0, 16]},"
             " \"b\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [4, 6]},"
             " \"c\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [10, 12]}}",
             "0123456789abcdef", 16);
    expect_fail(p, ENGINE_ERR_FORMAT, "overlap");
    p = tmp_path("same_range.safetensors");
    write_st(p,
             "{\"a\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [0, 4]},"
             " \"b\": {\"dtype\": \"I8\", \"shape\": [4], \"data_offsets\": [0, 4]}}",
             "0123", 4);
    expect_fail(p, ENGINE_ERR_FORMAT, "overlap");

    expect_fail(tmp_path("does_not_exist.safetensors"), ENGINE_ERR_IO, "cannot open");
    expect_fail_named(tmpdir, ENGINE_ERR_IO, tmpdir, "not a regular file");

    st_set *s = (st_set *)&s;
    CHECK(st_open(NULL, &s, NULL) == ENGINE_ERR_INVALID_ARG && s == NULL);
    CHECK(st_open("x", NULL, NULL) == ENGINE_ERR_INVALID_ARG);
}

static void test_stories(void)
{
    char buf[1024];
    const char *p = test_src_path(buf, sizeof buf, "models/stories260K/model.safetensors");
    st_set *s = NULL;
    err_buf e;
    CHECK_MSG(st_open(p, &s, &e) == ENGINE_OK, "%s", e.msg);
    if (!s)
        return;
    CHECK(st_count(s) == 47); /* 5 layers x 9, embeddings, final norm */
    const st_tensor *t = st_find(s, "model.embed_tokens.weight");
    CHECK(t && t->dtype == ST_F32 && t->n_dims == 2 && t->shape[0] == 512 && t->shape[1] == 64);
    CHECK(t && t->nbytes == 512 * 64 * 4);
    t = st_find(s, "model.layers.4.self_attn.k_proj.weight");
    CHECK(t && t->n_dims == 2 && t->shape[0] == 32 && t->shape[1] == 64);
    t = st_find(s, "model.layers.2.mlp.down_proj.weight");
    CHECK(t && t->shape[0] == 64 && t->shape[1] == 172);
    t = st_find(s, "model.norm.weight");
    CHECK(t && t->n_dims == 1 && t->shape[0] == 64);
    CHECK(st_find(s, "lm_head.weight") == NULL); /* tied */
    CHECK(st_metadata(s, "format") && strcmp(st_metadata(s, "format"), "pt") == 0);
    CHECK(st_total_bytes(s) == 1040128);
    st_close(s);
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/test_st_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 2;
    }
    test_valid();
    test_many();
    test_sharded();
    test_bad();
    test_stories();
    for (int i = 0; i < n_created; i++)
        unlink(created[i]);
    if (rmdir(tmpdir) != 0)
        fprintf(stderr, "note: could not remove %s\n", tmpdir);
    return test_finish("test_safetensors");
}
