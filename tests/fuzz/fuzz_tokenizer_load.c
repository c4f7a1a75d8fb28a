/*
 * fuzz_tokenizer_load: arbitrary bytes as tokenizer.json. A load either
 * fails with a message naming the file, or gives a tokenizer that can
 * encode and decode: a few fixed texts go through the pipeline the file
 * described (its normalizers, regexes, added tokens and decoders), and the
 * ids they give must decode, in one piece and streamed, to the same text.
 */
#include "fuzz_tok.h"

#include <string.h>

static fuzz_file input;

static const char *const TEXTS[] = {
    "Once upon a time, there was a little girl.",
    "  leading spaces\tand tabs\n\nnew lines  ",
    "digits 1234567 and punctuation!? \"quoted\" (x) <s></s><|endoftext|>",
    "caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80 \xe2\x96\x81x",
    "\xff\xfe broken \xc3 utf-8 \xe4\xb8",
};

static void check_text(const tok_tokenizer *t, const char *text)
{
    err_buf e;
    err_clear(&e);
    int32_t *ids = NULL;
    size_t n = 0;
    if (tok_encode(t, text, strlen(text), true, &ids, &n, &e) != ENGINE_OK) {
        FUZZ_ASSERT(e.code == ENGINE_ERR_OUT_OF_MEMORY); /* the only way encoding may fail */
        return;
    }
    for (size_t i = 0; i < n; i++)
        FUZZ_ASSERT(ids[i] >= 0 && ids[i] < tok_vocab_size(t));
    for (int skip = 0; skip < 2; skip++) {
        char *whole = NULL;
        size_t len = 0;
        if (tok_decode(t, ids, n, skip, &whole, &len, &e) != ENGINE_OK)
            continue;
        FUZZ_ASSERT(strlen(whole) <= len); /* NUL-terminated, may hold NULs */
        fuzz_check_stream(t, ids, n, skip, whole, len);
        free(whole);
    }
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_file_write(&input, data, size);
    err_buf e;
    err_clear(&e);
    tok_tokenizer *t = NULL;
    if (tok_load(path, NULL, &t, &e) != ENGINE_OK) {
        FUZZ_ASSERT(t == NULL);
        FUZZ_ASSERT(strncmp(e.msg, path, strlen(path)) == 0);
        return 0;
    }
    for (size_t i = 0; i < sizeof TEXTS / sizeof TEXTS[0]; i++)
        check_text(t, TEXTS[i]);
    tok_free(t);
    return 0;
}
