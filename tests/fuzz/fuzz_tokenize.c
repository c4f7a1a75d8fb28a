/*
 * fuzz_tokenize: arbitrary bytes through real tokenizers (GPT-2, Llama 2,
 * Llama 3, Qwen 3 from tests/data/tokenizers). The first byte picks the
 * tokenizer and the flags; the rest is read twice: as text to encode, and
 * as little-endian 32-bit ids to decode.
 *
 * Properties: encoding never fails and gives ids inside the vocabulary; the
 * public API's buffer contract (BUFFER_TOO_SMALL, the size needed, nothing
 * written past cap) holds; streamed decoding equals whole decoding; ids
 * outside the vocabulary are refused, not read; and for the byte-level
 * tokenizers without a normalizer (GPT-2, Llama 3), decode(encode(text))
 * gives back any valid UTF-8 text exactly.
 */
#include "fuzz_tok.h"

#include <string.h>

#include "engine/model.h" /* struct engine_tokenizer: the public handle's tok_tokenizer */
#include "loaders/tok_internal.h" /* tok_utf8_valid */

#ifndef FUZZ_TOKENIZER_DIR
#define FUZZ_TOKENIZER_DIR "tests/data/tokenizers"
#endif

static const struct {
    const char *name;
    bool roundtrip; /* byte-level, no normalizer: decode(encode(x)) == x */
} TOKENIZERS[] = {{"gpt2", true}, {"llama2", false}, {"llama3", true}, {"qwen3", false}};
#define N_TOK (sizeof TOKENIZERS / sizeof TOKENIZERS[0])

static engine_tokenizer *loaded[N_TOK];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    const char *dir = getenv("FUZZ_TOKENIZER_DIR");
    if (!dir)
        dir = FUZZ_TOKENIZER_DIR;
    for (size_t i = 0; i < N_TOK; i++) {
        char path[1024], err[512];
        snprintf(path, sizeof path, "%s/%s", dir, TOKENIZERS[i].name);
        if (engine_tokenizer_load(path, &loaded[i], err, sizeof err) != ENGINE_OK) {
            fprintf(stderr, "fuzz_tokenize: %s (set FUZZ_TOKENIZER_DIR)\n", err);
            exit(1);
        }
    }
    return 0;
}

/* Whole decode of ids, then the same ids streamed: the pieces must add up. */
static void check_decode(const tok_tokenizer *t, const int32_t *ids, size_t n, bool skip)
{
    char *whole = NULL;
    size_t len = 0;
    err_buf e;
    err_clear(&e);
    engine_status st = tok_decode(t, ids, n, skip, &whole, &len, &e);
    bool all_valid = true;
    for (size_t i = 0; i < n; i++)
        all_valid &= ids[i] >= 0 && ids[i] < tok_vocab_size(t) && tok_piece(t, ids[i]) != NULL;
    FUZZ_ASSERT(all_valid ? st == ENGINE_OK : st == ENGINE_ERR_INVALID_ARG);
    if (st != ENGINE_OK)
        return;
    fuzz_check_stream(t, ids, n, skip, whole, len);
    free(whole);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const size_t which = data[0] % N_TOK;
    const bool add_special = data[0] & 0x10, skip = data[0] & 0x20;
    const engine_tokenizer *et = loaded[which];
    const tok_tokenizer *t = et->tok;
    const char *text = (const char *)data + 1;
    const size_t len = size - 1;

    /* Through the public API with a buffer too small by a random amount. */
    size_t need = 0;
    engine_status st = engine_tokenize(et, text, len, add_special, NULL, 0, &need);
    FUZZ_ASSERT(st == ENGINE_OK ? need == 0 : st == ENGINE_ERR_BUFFER_TOO_SMALL);
    int32_t *ids = malloc((need + 1) * sizeof *ids);
    FUZZ_ASSERT(ids);
    size_t n = 0;
    if (need > 0) {
        const size_t cap = need - 1;
        ids[cap] = -7;
        FUZZ_ASSERT(engine_tokenize(et, text, len, add_special, ids, cap, &n) == ENGINE_ERR_BUFFER_TOO_SMALL);
        FUZZ_ASSERT(n == need && ids[cap] == -7);
    }
    FUZZ_ASSERT(engine_tokenize(et, text, len, add_special, ids, need, &n) == ENGINE_OK && n == need);
    for (size_t i = 0; i < n; i++)
        FUZZ_ASSERT(ids[i] >= 0 && ids[i] < tok_vocab_size(t));

    check_decode(t, ids, n, skip);
    if (TOKENIZERS[which].roundtrip && !add_special && tok_utf8_valid(text, len)) {
        char *back = NULL;
        size_t blen = 0;
        err_buf e;
        FUZZ_ASSERT(tok_decode(t, ids, n, false, &back, &blen, &e) == ENGINE_OK);
        FUZZ_ASSERT(blen == len && memcmp(back, text, len) == 0);
        free(back);
    }

    /* The public decode's buffer contract. */
    size_t tlen = 0;
    st = engine_detokenize(et, ids, n, skip, NULL, 0, &tlen);
    FUZZ_ASSERT(st == ENGINE_OK || st == ENGINE_ERR_BUFFER_TOO_SMALL);
    char *buf = malloc(tlen + 1);
    FUZZ_ASSERT(buf);
    FUZZ_ASSERT(engine_detokenize(et, ids, n, skip, buf, tlen + 1, &tlen) == ENGINE_OK && buf[tlen] == '\0');
    free(buf);
    free(ids);

    /* The same bytes as ids: most are far outside the vocabulary; folding
     * some into it makes valid sequences of arbitrary tokens too. */
    size_t n_raw = len / 4;
    int32_t *raw = malloc((n_raw + 1) * sizeof *raw);
    FUZZ_ASSERT(raw);
    for (size_t i = 0; i < n_raw; i++) {
        uint32_t v;
        memcpy(&v, text + 4 * i, 4);
        raw[i] = (int32_t)v;
    }
    check_decode(t, raw, n_raw, skip);
    const int32_t vocab = tok_vocab_size(t);
    for (size_t i = 0; i < n_raw; i++)
        raw[i] = (int32_t)((uint32_t)raw[i] % (uint32_t)vocab);
    check_decode(t, raw, n_raw, skip);
    free(raw);
    return 0;
}
