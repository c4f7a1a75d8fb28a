/*
 * test_tokenizer.c: the tokenizer against Hugging Face tokenizers'
 * reference output (tests/data/reference/tokenizer_reference.json: five
 * tokenizers x 55 texts: encode ids, decode text), streaming decode equal
 * to whole decode on every case and on random id runs, BOS/EOS handling,
 * added-token options on a small hand-written tokenizer, hostile input
 * (invalid UTF-8, random bytes), and the load errors.
 */
#define _POSIX_C_SOURCE 200809L

#include <jansson.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include "loaders/tokenizer.h"
#include "tests/test_util.h"

static char tmpdir[512];
static char written[64][600]; /* files write_tmp() made, removed at exit */
static int n_written;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Small deterministic generator so failures replay. */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}

typedef struct named_tok {
    const char *name;
    tok_tokenizer *t;
} named_tok;

static named_tok toks[] = {{"stories260K", NULL}, {"llama2", NULL}, {"llama3", NULL}, {"qwen3", NULL}, {"gpt2", NULL}};
enum { N_TOKS = sizeof toks / sizeof toks[0] };

static tok_tokenizer *get_tok(const char *name)
{
    for (int i = 0; i < N_TOKS; i++)
        if (strcmp(toks[i].name, name) == 0)
            return toks[i].t;
    return NULL;
}

static void load_all(void)
{
    for (int i = 0; i < N_TOKS; i++) {
        char jp[1024], cp[1024], rel[256];
        if (strcmp(toks[i].name, "stories260K") == 0) {
            test_src_path(jp, sizeof jp, "models/stories260K/tokenizer.json");
            test_src_path(cp, sizeof cp, "models/stories260K/tokenizer_config.json");
        } else {
            snprintf(rel, sizeof rel, "tokenizers/%s/tokenizer.json", toks[i].name);
            test_data_path(jp, sizeof jp, rel);
            snprintf(rel, sizeof rel, "tokenizers/%s/tokenizer_config.json", toks[i].name);
            test_data_path(cp, sizeof cp, rel);
        }
        err_buf e;
        err_clear(&e);
        double t0 = now_s();
        engine_status st = tok_load(jp, cp, &toks[i].t, &e);
        double dt = now_s() - t0;
        CHECK_MSG(st == ENGINE_OK, "%s: %s", toks[i].name, e.msg);
        if (st == ENGINE_OK)
            printf("load %-12s %7.3f s  (%d ids)\n", toks[i].name, dt, tok_vocab_size(toks[i].t));
    }
}

/* Decode by streaming one id at a time; returns the concatenation (malloc'd). */
static char *stream_decode(const tok_tokenizer *t, const int32_t *ids, size_t n, bool skip, size_t *len)
{
    tok_stream *s = tok_stream_new(t, skip);
    CHECK(s != NULL);
    if (!s)
        return NULL;
    size_t cap = 64, k = 0;
    char *acc = malloc(cap);
    for (size_t i = 0; i <= n; i++) {
        const char *piece;
        size_t pl;
        engine_status st = i < n ? tok_stream_push(s, ids[i], &piece, &pl) : tok_stream_flush(s, &piece, &pl);
        CHECK(st == ENGINE_OK);
        if (st != ENGINE_OK)
            continue;
        CHECK(piece != NULL && piece[pl] == '\0');
        while (k + pl + 1 > cap)
            acc = realloc(acc, cap *= 2);
        memcpy(acc + k, piece, pl);
        k += pl;
    }
    acc[k] = '\0';
    tok_stream_free(s);
    *len = k;
    return acc;
}

/* Streaming equals whole decode, with and without skip_special. */
static bool check_stream(const tok_tokenizer *t, const int32_t *ids, size_t n, const char *what)
{
    bool ok = true;
    for (int skip = 0; skip < 2; skip++) {
        char *whole;
        size_t wl, sl;
        err_buf e;
        err_clear(&e);
        engine_status st = tok_decode(t, ids, n, skip, &whole, &wl, &e);
        CHECK_MSG(st == ENGINE_OK, "%s: %s", what, e.msg);
        if (st != ENGINE_OK)
            return false;
        char *streamed = stream_decode(t, ids, n, skip, &sl);
        bool same = streamed && sl == wl && memcmp(streamed, whole, wl) == 0;
        CHECK_MSG(same, "%s (skip_special=%d): stream \"%s\" != decode \"%s\"", what, skip,
                  streamed ? streamed : "(null)", whole);
        ok = ok && same;
        free(whole);
        free(streamed);
    }
    return ok;
}

static void print_ids(const char *label, const int32_t *ids, size_t n)
{
    fprintf(stderr, "  %s:", label);
    for (size_t i = 0; i < n && i < 64; i++)
        fprintf(stderr, " %d", (int)ids[i]);
    fprintf(stderr, n > 64 ? " ...\n" : "\n");
}

/* One reference case: encode(text) == ids, decode(ids) == decoded, and the
 * stream of ids concatenates to the same text. Adds 1 to each count that passed. */
static void check_case(const tok_tokenizer *t, const char *name, size_t ci, json_t *text, json_t *jids,
                       const char *decoded, size_t *n_enc, size_t *n_dec, size_t *n_stream)
{
    size_t n_ref = json_array_size(jids);
    int32_t *ref_ids = malloc((n_ref + 1) * sizeof *ref_ids);
    for (size_t k = 0; k < n_ref; k++)
        ref_ids[k] = (int32_t)json_integer_value(json_array_get(jids, k));

    int32_t *ids = NULL;
    size_t n = 0;
    err_buf e;
    err_clear(&e);
    engine_status st = tok_encode(t, json_string_value(text), json_string_length(text), false, &ids, &n, &e);
    bool enc_ok = st == ENGINE_OK && n == n_ref && memcmp(ids, ref_ids, n * sizeof *ids) == 0;
    CHECK_MSG(enc_ok, "%s case %zu encode %.60s", name, ci, json_string_value(text));
    if (!enc_ok && st == ENGINE_OK) {
        print_ids("want", ref_ids, n_ref);
        print_ids("got ", ids, n);
    }
    *n_enc += enc_ok;
    free(ids);

    char *out = NULL;
    size_t ol = 0;
    st = tok_decode(t, ref_ids, n_ref, false, &out, &ol, &e);
    bool dec_ok = st == ENGINE_OK && decoded && ol == strlen(decoded) && memcmp(out, decoded, ol) == 0;
    CHECK_MSG(dec_ok, "%s case %zu decode: want \"%s\" got \"%s\"", name, ci, decoded, out ? out : e.msg);
    *n_dec += dec_ok;
    free(out);

    char what[96];
    snprintf(what, sizeof what, "%s case %zu stream", name, ci);
    *n_stream += check_stream(t, ref_ids, n_ref, what);
    free(ref_ids);
}

/*
 * Every case of every tokenizer in a reference file. Cases sit under
 * cases_key[name] (or at the top level when cases_key is NULL); each holds
 * "ids" and "decoded", and its text either in "text" or, when the file has
 * a shared "texts" list, at the same index there.
 */
static void run_reference(const char *file, const char *cases_key, size_t want_cases, const char *label)
{
    char path[1024];
    json_error_t je;
    json_t *ref = json_load_file(test_data_path(path, sizeof path, file), 0, &je);
    CHECK_MSG(ref != NULL, "%s: %s", path, je.text);
    if (!ref)
        return;
    json_t *texts = json_object_get(ref, "texts");
    json_t *all = cases_key ? json_object_get(ref, cases_key) : ref;
    for (int ti = 0; ti < N_TOKS; ti++) {
        tok_tokenizer *t = toks[ti].t;
        json_t *cases = json_object_get(all, toks[ti].name);
        size_t n_cases = json_array_size(cases), n_enc = 0, n_dec = 0, n_stream = 0, ci;
        CHECK_MSG(n_cases == want_cases, "%s: %zu %s cases, want %zu", toks[ti].name, n_cases, label, want_cases);
        if (!t || n_cases != want_cases)
            continue;
        json_t *c;
        json_array_foreach(cases, ci, c)
        {
            json_t *text = texts ? json_array_get(texts, ci) : json_object_get(c, "text");
            check_case(t, toks[ti].name, ci, text, json_object_get(c, "ids"),
                       json_string_value(json_object_get(c, "decoded")), &n_enc, &n_dec, &n_stream);
        }
        printf("%-12s %s: encode %zu/%zu  decode %zu/%zu  stream %zu/%zu\n", toks[ti].name, label, n_enc, n_cases,
               n_dec, n_cases, n_stream, n_cases);
    }
    json_decref(ref);
}

static int32_t *encode(const tok_tokenizer *t, const char *s, size_t len, bool special, size_t *n)
{
    int32_t *ids = NULL;
    err_buf e;
    err_clear(&e);
    engine_status st = tok_encode(t, s, len, special, &ids, n, &e);
    CHECK_MSG(st == ENGINE_OK, "encode: %s", e.msg);
    return st == ENGINE_OK ? ids : NULL;
}

static bool same_ids(const int32_t *a, size_t na, const int32_t *b, size_t nb)
{
    return a && b && na == nb && memcmp(a, b, na * sizeof *a) == 0;
}

static void test_special(void)
{
    static const char *sp_names[] = {"stories260K", "llama2"};
    for (int i = 0; i < 2; i++) {
        tok_tokenizer *t = get_tok(sp_names[i]);
        if (!t)
            continue;
        CHECK(tok_bos(t) == 1 && tok_eos(t) == 2 && tok_add_bos(t) && !tok_add_eos(t));
        size_t n1, n2;
        int32_t *plain = encode(t, "Hello world", 11, false, &n1);
        int32_t *with = encode(t, "Hello world", 11, true, &n2);
        CHECK_MSG(with && plain && n2 == n1 + 1 && with[0] == 1 && memcmp(with + 1, plain, n1 * sizeof *plain) == 0,
                  "%s: add_special must put BOS (1) first", sp_names[i]);
        free(plain);
        free(with);
        size_t n0;
        int32_t *empty = encode(t, "", 0, true, &n0);
        CHECK(empty && n0 == 1 && empty[0] == 1);
        free(empty);
        CHECK(tok_is_special(t, 1) && !tok_is_special(t, 100));
        CHECK(tok_piece(t, 1) && strcmp(tok_piece(t, 1), "<s>") == 0);
    }
    tok_tokenizer *l2 = get_tok("llama2");
    if (l2) {
        CHECK(tok_piece(l2, 13) && strcmp(tok_piece(l2, 13), "<0x0A>") == 0);
        int32_t ids[] = {1, 15043, 2};
        char *s = NULL;
        size_t n;
        CHECK(tok_decode(l2, ids, 3, true, &s, &n, NULL) == ENGINE_OK && strcmp(s, "Hello") == 0);
        free(s);
        CHECK(tok_decode(l2, ids, 3, false, &s, &n, NULL) == ENGINE_OK && strcmp(s, "<s> Hello</s>") == 0);
        free(s);
    }
    tok_tokenizer *l3 = get_tok("llama3");
    if (l3) {
        /* No add_bos_token in its config and a ByteLevel post-processor: nothing is added. */
        CHECK(tok_bos(l3) == 128000 && tok_eos(l3) == 128001 && !tok_add_bos(l3) && !tok_add_eos(l3));
        CHECK(tok_vocab_size(l3) == 128256);
        CHECK(tok_piece(l3, 128000) && strcmp(tok_piece(l3, 128000), "<|begin_of_text|>") == 0);
        const char *txt = "<|begin_of_text|>Hello<|eot_id|>";
        size_t n, nh;
        int32_t *ids = encode(l3, txt, strlen(txt), false, &n);
        int32_t *hello = encode(l3, "Hello", 5, false, &nh);
        CHECK(ids && hello && n == nh + 2 && ids[0] == 128000 && ids[n - 1] == 128009 &&
              memcmp(ids + 1, hello, nh * sizeof *ids) == 0);
        char *s = NULL;
        size_t sl;
        CHECK(tok_decode(l3, ids, n, true, &s, &sl, NULL) == ENGINE_OK && strcmp(s, "Hello") == 0);
        free(s);
        CHECK(tok_decode(l3, ids, n, false, &s, &sl, NULL) == ENGINE_OK && strcmp(s, txt) == 0);
        free(s);
        free(ids);
        free(hello);
    }
    tok_tokenizer *q = get_tok("qwen3");
    if (q) {
        CHECK(tok_bos(q) == -1 && !tok_add_bos(q) && tok_eos(q) == 151645);
        /* <think> is an added token that is not special: kept by skip_special. */
        CHECK(!tok_is_special(q, 151667) && tok_is_special(q, 151643));
        size_t n;
        int32_t *ids = encode(q, "a<think>b</think>", 17, false, &n);
        CHECK(ids && n == 4 && ids[1] == 151667 && ids[3] == 151668);
        char *s = NULL;
        size_t sl;
        CHECK(ids && tok_decode(q, ids, n, true, &s, &sl, NULL) == ENGINE_OK && strcmp(s, "a<think>b</think>") == 0);
        free(s);
        free(ids);
    }
    tok_tokenizer *g = get_tok("gpt2");
    if (g) {
        CHECK(tok_bos(g) == 50256 && tok_eos(g) == 50256 && !tok_add_bos(g));
        CHECK(tok_piece(g, 262) && strcmp(tok_piece(g, 262), "\xC4\xA0the") == 0);
        int32_t bad[] = {5, 50257};
        char *s = NULL;
        size_t sl;
        err_buf e;
        err_clear(&e);
        CHECK(tok_decode(g, bad, 2, false, &s, &sl, &e) == ENGINE_ERR_INVALID_ARG && strstr(e.msg, "50257"));
        CHECK(tok_decode(g, bad + 1, 1, false, &s, &sl, NULL) == ENGINE_ERR_INVALID_ARG);
        tok_stream *st = tok_stream_new(g, false);
        const char *p;
        CHECK(st && tok_stream_push(st, -1, &p, &sl) == ENGINE_ERR_INVALID_ARG);
        tok_stream_free(st);
    }
}

/* Invalid UTF-8 reads as U+FFFD; random bytes never break the encoder. */
static void test_hostile_input(void)
{
    static const char bad[] = "ab\xff"
                              "c\xe2\x82"
                              " \xc0\xaf\xed\xa0\x80 \xf4\x90\x80\x80z\xe2";
    static const char fixed[] = "ab\xef\xbf\xbd"
                                "c\xef\xbf\xbd"
                                " \xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd \xef\xbf\xbd\xef\xbf\xbd"
                                "\xef\xbf\xbd\xef\xbf\xbdz\xef\xbf\xbd";
    for (int i = 0; i < N_TOKS; i++) {
        tok_tokenizer *t = toks[i].t;
        if (!t)
            continue;
        size_t n1, n2;
        int32_t *a = encode(t, bad, sizeof bad - 1, false, &n1);
        int32_t *b = encode(t, fixed, sizeof fixed - 1, false, &n2);
        CHECK_MSG(same_ids(a, n1, b, n2), "%s: invalid UTF-8 must encode as U+FFFD", toks[i].name);
        free(a);
        free(b);
        /* Embedded NUL is text like any other. */
        int32_t *z = encode(t, "a\0b", 3, false, &n1);
        CHECK(z && n1 >= 2);
        free(z);

        for (int r = 0; r < 300; r++) {
            size_t len = rnd() % 64;
            char buf[64];
            for (size_t k = 0; k < len; k++) {
                uint32_t x = rnd();
                /* Bias towards the bytes that stress the decoders and matchers. */
                static const char pool[] = " \n\t<|>'sS0123\xc3\xa9\xe2\x96\x81\xf0\x9f\x98\x80\x80\xbf\xff";
                buf[k] = (x & 1) ? (char)(x >> 8) : pool[(x >> 8) % (sizeof pool - 1)];
            }
            size_t n;
            int32_t *ids = encode(t, buf, len, true, &n);
            if (!ids)
                continue;
            for (size_t k = 0; k < n; k++)
                CHECK(ids[k] >= 0 && ids[k] < tok_vocab_size(t));
            char what[64];
            snprintf(what, sizeof what, "%s random bytes %d", toks[i].name, r);
            check_stream(t, ids, n, what);
            free(ids);
        }
    }
}

/* Byte-level tokenizers without a normalizer round-trip any valid UTF-8. */
static void test_roundtrip(void)
{
    static const char *names[] = {"gpt2", "llama3"};
    static const char *pieces[] = {"Hello", " world", "  ", "\n", "\t", "é", "日本", "🦙", "'s", "'LL", "123456",
                                   "<|eot_id|>", "<|begin", "\xc2\xa0", "\xe2\x80\x83", "x", "!!", "\r\n", "ſ"};
    for (int i = 0; i < 2; i++) {
        tok_tokenizer *t = get_tok(names[i]);
        if (!t)
            continue;
        for (int r = 0; r < 200; r++) {
            char buf[512];
            size_t len = 0;
            int k = 1 + (int)(rnd() % 12);
            for (int j = 0; j < k; j++) {
                const char *p = pieces[rnd() % (sizeof pieces / sizeof pieces[0])];
                memcpy(buf + len, p, strlen(p));
                len += strlen(p);
            }
            size_t n, ol;
            int32_t *ids = encode(t, buf, len, false, &n);
            char *out = NULL;
            CHECK(ids && tok_decode(t, ids, n, false, &out, &ol, NULL) == ENGINE_OK);
            CHECK_MSG(out && ol == len && memcmp(out, buf, len) == 0, "%s round trip of \"%.*s\"", names[i], (int)len,
                      buf);
            free(ids);
            free(out);
        }
    }
}

/* Random id runs heavy in byte pieces: the cases where streaming must hold text back. */
static void test_stream_random(void)
{
    for (int i = 0; i < N_TOKS; i++) {
        tok_tokenizer *t = toks[i].t;
        if (!t)
            continue;
        int vs = tok_vocab_size(t);
        for (int r = 0; r < 300; r++) {
            int32_t ids[24];
            size_t n = rnd() % 24;
            for (size_t k = 0; k < n; k++) {
                uint32_t x = rnd() % 4;
                if (strcmp(toks[i].name, "llama2") == 0 || strcmp(toks[i].name, "stories260K") == 0)
                    ids[k] = x < 2 ? (int32_t)(3 + rnd() % 256) : (int32_t)(rnd() % (uint32_t)vs); /* <0xNN> */
                else
                    ids[k] = x < 2 ? (int32_t)(rnd() % 256) : (int32_t)(rnd() % (uint32_t)vs); /* single bytes */
                if (!tok_piece(t, ids[k]))
                    ids[k] = 0;
            }
            char what[64];
            snprintf(what, sizeof what, "%s random ids %d", toks[i].name, r);
            check_stream(t, ids, n, what);
        }
    }
    /* A multi-byte character split over byte tokens comes out whole, at its last byte. */
    tok_tokenizer *l2 = get_tok("llama2");
    if (l2) {
        int32_t ids[] = {15043, 3 + 0xE2, 3 + 0x82, 3 + 0xAC, 3186};
        tok_stream *s = tok_stream_new(l2, false);
        const char *p;
        size_t pl;
        const char *want[] = {"Hello", "", "", NULL, NULL};
        for (int k = 0; k < 3; k++) {
            CHECK(tok_stream_push(s, ids[k], &p, &pl) == ENGINE_OK);
            CHECK_MSG(strcmp(p, want[k]) == 0, "push %d gave \"%s\"", k, p);
        }
        /* A byte run is settled only when a non-byte token follows it. */
        CHECK(tok_stream_push(s, ids[3], &p, &pl) == ENGINE_OK && pl == 0);
        CHECK(tok_stream_push(s, ids[4], &p, &pl) == ENGINE_OK && strcmp(p, "\xe2\x82\xac world") == 0);
        CHECK(tok_stream_flush(s, &p, &pl) == ENGINE_OK && pl == 0);
        tok_stream_free(s);
    }
    tok_tokenizer *g = get_tok("gpt2");
    if (g) {
        /* "€!" encodes to pieces that split the euro sign's three bytes. */
        size_t n;
        int32_t *ids = encode(g, "\xe2\x82\xac!", 4, false, &n);
        tok_stream *s = tok_stream_new(g, false);
        const char *p;
        size_t pl, total = 0;
        for (size_t k = 0; ids && k < n; k++) {
            CHECK(tok_stream_push(s, ids[k], &p, &pl) == ENGINE_OK);
            CHECK(pl == 0 || (unsigned char)p[0] != 0xEF); /* never a U+FFFD for half a character */
            total += pl;
        }
        CHECK(tok_stream_flush(s, &p, &pl) == ENGINE_OK);
        CHECK(total + pl == 4);
        tok_stream_free(s);
        free(ids);
    }
}

/* ---- small hand-written tokenizers ---- */

static const char *write_tmp(const char *name, const char *content)
{
    static char path[600];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    if (n_written < 64)
        snprintf(written[n_written++], sizeof written[0], "%s", path);
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (f) {
        fputs(content, f);
        fclose(f);
    }
    return path;
}

static void expect_load_error(const char *name, const char *content, engine_status want, const char *needle)
{
    const char *path = write_tmp(name, content);
    tok_tokenizer *t = (tok_tokenizer *)(uintptr_t)1;
    err_buf e;
    err_clear(&e);
    engine_status st = tok_load(path, NULL, &t, &e);
    CHECK_MSG(st == want, "%s: status %d, want %d (%s)", name, (int)st, (int)want, e.msg);
    CHECK_MSG(t == NULL, "%s: output not cleared", name);
    CHECK_MSG(strstr(e.msg, name) != NULL, "%s: message does not name the file: %s", name, e.msg);
    CHECK_MSG(!needle || strstr(e.msg, needle) != NULL, "%s: message lacks \"%s\": %s", name, needle, e.msg);
    if (st == ENGINE_OK)
        tok_free(t);
}

#define MINI_VOCAB "{\"a\":0,\"b\":1,\"c\":2,\"ab\":3,\"abc\":4,\" \":5,\"<unk>\":6}"
#define MINI_MERGES "[\"a b\",[\"ab\",\"c\"]]"

static void test_load_errors(void)
{
    err_buf e;
    err_clear(&e);
    tok_tokenizer *t = NULL;
    CHECK(tok_load("/nonexistent/dir/tokenizer.json", NULL, &t, &e) == ENGINE_ERR_IO && t == NULL);
    CHECK(strstr(e.msg, "/nonexistent/dir/tokenizer.json") != NULL);
    expect_load_error("bad_json.json", "{\"model\": {\"type\": \"BPE\",", ENGINE_ERR_FORMAT, "JSON");
    expect_load_error("not_object.json", "[1, 2]", ENGINE_ERR_FORMAT, NULL);
    expect_load_error("no_model.json", "{\"version\": \"1.0\"}", ENGINE_ERR_FORMAT, "model");
    expect_load_error("wordpiece.json",
                      "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0}, \"unk_token\": \"a\"}}",
                      ENGINE_ERR_UNSUPPORTED, "WordPiece");
    expect_load_error("unigram.json", "{\"model\": {\"type\": \"Unigram\", \"vocab\": [[\"a\", 0.0]]}}",
                      ENGINE_ERR_UNSUPPORTED, "Unigram");
    expect_load_error("id_range.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 99999999}, \"merges\": []}}",
                      ENGINE_ERR_FORMAT, "range");
    expect_load_error("neg_id.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1}, \"merges\": []}}",
                      ENGINE_ERR_FORMAT, "range");
    expect_load_error("merge_unknown.json",
                      "{\"model\": {\"type\": \"BPE\", \"vocab\": " MINI_VOCAB ", \"merges\": [\"a z\"]}}",
                      ENGINE_ERR_FORMAT, "\"z\"");
    expect_load_error("merge_result.json",
                      "{\"model\": {\"type\": \"BPE\", \"vocab\": " MINI_VOCAB ", \"merges\": [\"b c\"]}}",
                      ENGINE_ERR_FORMAT, "bc");
    expect_load_error("merge_shape.json",
                      "{\"model\": {\"type\": \"BPE\", \"vocab\": " MINI_VOCAB ", \"merges\": [\"a b c\"]}}",
                      ENGINE_ERR_FORMAT, NULL);
    expect_load_error("norm_type.json",
                      "{\"normalizer\": {\"type\": \"Precompiled\"}, \"model\": {\"type\": \"BPE\", \"vocab\": " MINI_VOCAB
                      ", \"merges\": []}}",
                      ENGINE_ERR_UNSUPPORTED, "Precompiled");
    expect_load_error("pre_type.json",
                      "{\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"BertPreTokenizer\"}]},"
                      " \"model\": {\"type\": \"BPE\", \"vocab\": " MINI_VOCAB ", \"merges\": []}}",
                      ENGINE_ERR_UNSUPPORTED, "BertPreTokenizer");
    expect_load_error("dec_type.json",
                      "{\"decoder\": {\"type\": \"WordPiece\"}, \"model\": {\"type\": \"BPE\", \"vocab\": " MINI_VOCAB
                      ", \"merges\": []}}",
                      ENGINE_ERR_UNSUPPORTED, "WordPiece");
    expect_load_error("bad_regex.json",
                      "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(a\"}, \"behavior\": "
                      "\"Isolated\", \"invert\": false}, \"model\": {\"type\": \"BPE\", \"vocab\": " MINI_VOCAB
                      ", \"merges\": []}}",
                      ENGINE_ERR_UNSUPPORTED, "regex");
    expect_load_error("added_range.json",
                      "{\"added_tokens\": [{\"id\": -3, \"content\": \"x\"}], \"model\": {\"type\": \"BPE\", \"vocab\": " MINI_VOCAB
                      ", \"merges\": []}}",
                      ENGINE_ERR_FORMAT, "added_tokens");
    /* Malformed vocab and merges entries. */
    expect_load_error("vocab_real.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 1.5}, \"merges\": []}}",
                      ENGINE_ERR_FORMAT, "vocab id");
    expect_load_error("vocab_escape.json",
                      "{\"model\": {\"type\": \"BPE\",\n \"vocab\": {\"a\": 0,\n \"b\\q\": 1}, \"merges\": []}}",
                      ENGINE_ERR_FORMAT, "invalid JSON at line 3");
    expect_load_error("vocab_surrogate.json",
                      "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"\\ud83d\": 0}, \"merges\": []}}",
                      ENGINE_ERR_FORMAT, "invalid JSON");
    expect_load_error("vocab_utf8.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"\xff\": 0}, \"merges\": []}}",
                      ENGINE_ERR_FORMAT, NULL);
    expect_load_error("merges_num.json",
                      "{\"model\": {\"type\": \"BPE\", \"vocab\": " MINI_VOCAB ", \"merges\": [\"a b\", 7]}}",
                      ENGINE_ERR_FORMAT, "merges[1]");
    expect_load_error("merges_open.json",
                      "{\"model\": {\"type\": \"BPE\", \"vocab\": " MINI_VOCAB ", \"merges\": [[\"a\", \"b\"]}}",
                      ENGINE_ERR_FORMAT, NULL);
    /* A bad tokenizer_config.json is an error too, a missing one is not. */
    const char *good = write_tmp("mini_ok.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": " MINI_VOCAB
                                                 ", \"merges\": " MINI_MERGES "}}");
    char gp[600];
    snprintf(gp, sizeof gp, "%s", good);
    const char *badcfg = write_tmp("bad_config.json", "{\"add_bos_token\": ");
    err_clear(&e);
    CHECK(tok_load(gp, badcfg, &t, &e) == ENGINE_ERR_FORMAT && strstr(e.msg, "bad_config.json"));
    CHECK(tok_load(gp, "/nonexistent/tokenizer_config.json", &t, &e) == ENGINE_OK);
    tok_free(t);
    tok_free(NULL);
}

static void expect_ids(const tok_tokenizer *t, const char *text, const int32_t *want, size_t n_want)
{
    size_t n;
    int32_t *ids = encode(t, text, strlen(text), false, &n);
    bool ok = same_ids(ids, n, want, n_want);
    CHECK_MSG(ok, "encode \"%s\"", text);
    if (!ok && ids) {
        print_ids("want", want, n_want);
        print_ids("got ", ids, n);
    }
    free(ids);
}

/* Added tokens with lstrip / rstrip / single_word / normalized on a toy BPE. */
static void test_added_tokens(void)
{
    const char *json =
        "{\"added_tokens\": ["
        "{\"id\": 10, \"content\": \"<m>\", \"special\": true, \"lstrip\": true, \"rstrip\": false, \"single_word\": false, \"normalized\": false},"
        "{\"id\": 11, \"content\": \"<m><n>\", \"special\": true, \"lstrip\": false, \"rstrip\": false, \"single_word\": false, \"normalized\": false},"
        "{\"id\": 12, \"content\": \"cab\", \"special\": false, \"lstrip\": false, \"rstrip\": false, \"single_word\": true, \"normalized\": true},"
        "{\"id\": 13, \"content\": \"[r]\", \"special\": false, \"lstrip\": false, \"rstrip\": true, \"single_word\": false, \"normalized\": false},"
        "{\"id\": 14, \"content\": \"ABC\", \"special\": false, \"lstrip\": false, \"rstrip\": false, \"single_word\": false, \"normalized\": true}],"
        " \"normalizer\": {\"type\": \"Lowercase\"},"
        " \"decoder\": null,"
        " \"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"fuse_unk\": true, \"vocab\": " MINI_VOCAB
        ", \"merges\": " MINI_MERGES "}}";
    char path[600];
    snprintf(path, sizeof path, "%s", write_tmp("added.json", json));
    tok_tokenizer *t = NULL;
    err_buf e;
    err_clear(&e);
    CHECK_MSG(tok_load(path, NULL, &t, &e) == ENGINE_OK, "%s", e.msg);
    if (!t)
        return;
    CHECK(tok_vocab_size(t) == 15 && tok_bos(t) == -1 && !tok_add_bos(t));
    /* No pre-tokenizer: each stretch between added tokens is one BPE word,
     * so spaces (id 5) show wherever the options leave them. */
    expect_ids(t, "ab c", (int32_t[]){3, 5, 2}, 3);
    /* Longest match wins: "<m><n>" over "<m>". */
    expect_ids(t, "ab<m><n>c", (int32_t[]){3, 11, 2}, 3);
    /* lstrip: the spaces before "<m>" belong to it. */
    expect_ids(t, "ab  <m>c", (int32_t[]){3, 10, 2}, 3);
    /* rstrip: the spaces after "[r]" belong to it. */
    expect_ids(t, "a[r]   b", (int32_t[]){0, 13, 1}, 3);
    expect_ids(t, "a  [r]b", (int32_t[]){0, 5, 5, 13, 1}, 5);
    /* single_word: "cab" only as a word of its own, matched after lowercasing. */
    expect_ids(t, "CAB a", (int32_t[]){12, 5, 0}, 3);
    expect_ids(t, "xcab", (int32_t[]){6, 2, 3}, 3);  /* unknown "x", then c, ab */
    expect_ids(t, "cabx", (int32_t[]){2, 3, 6}, 3);
    expect_ids(t, "(cab)", (int32_t[]){6, 12, 6}, 3); /* punctuation is no word */
    /* normalized token content is lowercased too, so "abc" in any case finds it. */
    expect_ids(t, "aBc", (int32_t[]){14}, 1);
    /* Unknown characters fuse into one <unk>. */
    expect_ids(t, "xyz abc", (int32_t[]){6, 5, 14}, 3);
    /* No decoder: tokens joined by spaces, as tokenizers does. */
    char *s = NULL;
    size_t sl;
    CHECK(tok_decode(t, (int32_t[]){3, 2, 10}, 3, false, &s, &sl, NULL) == ENGINE_OK && strcmp(s, "ab c <m>") == 0);
    free(s);
    CHECK(tok_decode(t, (int32_t[]){3, 2, 10}, 3, true, &s, &sl, NULL) == ENGINE_OK && strcmp(s, "ab c") == 0);
    free(s);
    check_stream(t, (int32_t[]){10, 3, 2, 10, 12}, 5, "no-decoder stream");
    tok_free(t);

    /* Split behaviours and Metaspace on another toy. */
    const char *json2 =
        "{\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": ["
        "{\"type\": \"Digits\", \"individual_digits\": true},"
        "{\"type\": \"Metaspace\", \"replacement\": \"_\", \"prepend_scheme\": \"first\", \"split\": true}]},"
        " \"decoder\": {\"type\": \"Metaspace\", \"replacement\": \"_\", \"prepend_scheme\": \"first\"},"
        " \"model\": {\"type\": \"BPE\", \"byte_fallback\": false, \"vocab\": {\"_\":0,\"a\":1,\"_a\":2,\"1\":3,\"2\":4},"
        " \"merges\": [[\"_\", \"a\"]]}}";
    snprintf(path, sizeof path, "%s", write_tmp("meta.json", json2));
    CHECK_MSG(tok_load(path, NULL, &t, &e) == ENGINE_OK, "%s", e.msg);
    if (!t)
        return;
    /* "a a12": prepend "_" (first piece only), split before each "_", digits isolated. */
    expect_ids(t, "a a12", (int32_t[]){2, 2, 3, 4}, 4);
    CHECK(tok_decode(t, (int32_t[]){2, 2, 3}, 3, false, &s, &sl, NULL) == ENGINE_OK && strcmp(s, "a a1") == 0);
    free(s);
    check_stream(t, (int32_t[]){2, 2, 3, 0, 1}, 5, "metaspace stream");
    tok_free(t);
}

/* Escapes in vocab keys, merges before vocab, both merge spellings. */
static void test_json_reader(void)
{
    const char *json = "{\"model\": {\"merges\": [[\"\\u00e9\", \"x\"], \"x \\ud83d\\ude00\"], \"type\": \"BPE\","
                       " \"vocab\": {\"\\u00e9\": 0, \"\\ud83d\\ude00\": 1, \"a\\nb\\\"\\\\\": 2, \"x\": 3,"
                       " \"\\u00e9x\": 4, \"x\\ud83d\\ude00\": 5}}, \"decoder\": {\"type\": \"Fuse\"}}";
    char path[600];
    snprintf(path, sizeof path, "%s", write_tmp("escapes.json", json));
    tok_tokenizer *t = NULL;
    err_buf e;
    err_clear(&e);
    CHECK_MSG(tok_load(path, NULL, &t, &e) == ENGINE_OK, "%s", e.msg);
    if (!t)
        return;
    CHECK(tok_piece(t, 1) && strcmp(tok_piece(t, 1), "\xf0\x9f\x98\x80") == 0);
    CHECK(tok_piece(t, 2) && strcmp(tok_piece(t, 2), "a\nb\"\\") == 0);
    expect_ids(t, "\xc3\xa9x\xf0\x9f\x98\x80", (int32_t[]){4, 1}, 2);
    expect_ids(t, "x\xf0\x9f\x98\x80\xc3\xa9", (int32_t[]){5, 0}, 2);
    tok_free(t);
}

int main(void)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/test_tokenizer_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    load_all();
    /* 55 hand-picked texts per tokenizer. */
    run_reference("reference/tokenizer_reference.json", NULL, 55, "reference");
    /* 300 seeded random texts nobody picked (tests/fixtures/make_tokenizer_cases.py). */
    run_reference("reference/tokenizer_generated.json", "tokenizers", 300, "generated");
    test_special();
    test_hostile_input();
    test_roundtrip();
    test_stream_random();
    test_load_errors();
    test_added_tokens();
    test_json_reader();
    for (int i = 0; i < N_TOKS; i++)
        tok_free(toks[i].t);
    for (int i = 0; i < n_written; i++)
        unlink(written[i]);
    rmdir(tmpdir);
    return test_finish("test_tokenizer");
}
