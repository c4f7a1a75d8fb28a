/*
 * fuzz_tok_config: arbitrary bytes as tokenizer_config.json beside the
 * stories260K tokenizer.json. The load either fails naming the config, or
 * gives BOS/EOS inside the vocabulary (or none), and encoding with special
 * tokens gives the prefix and suffix ids (inside the vocabulary) around the
 * plain encoding. (A config whose bos_token is not in the vocabulary leaves
 * BOS unknown while the template still adds its own first token: that is
 * the loader's reading of such a mismatch, not checked here.)
 */
#include "fuzz_util.h"

#include <string.h>

#include "loaders/tok_internal.h" /* prefix and suffix ids */

#ifndef FUZZ_SOURCE_DIR
#define FUZZ_SOURCE_DIR "."
#endif

static fuzz_file input;
static char json_path[1024];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    snprintf(json_path, sizeof json_path, "%s/models/stories260K/tokenizer.json", FUZZ_SOURCE_DIR);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_file_write(&input, data, size);
    tok_tokenizer *t = NULL;
    err_buf e;
    err_clear(&e);
    if (tok_load(json_path, path, &t, &e) != ENGINE_OK) {
        FUZZ_ASSERT(t == NULL && strncmp(e.msg, path, strlen(path)) == 0);
        return 0;
    }
    const int32_t bos = tok_bos(t), eos = tok_eos(t), n = tok_vocab_size(t);
    FUZZ_ASSERT(bos >= -1 && bos < n && eos >= -1 && eos < n);
    FUZZ_ASSERT(tok_add_bos(t) == (t->n_prefix > 0) && tok_add_eos(t) == (t->n_suffix > 0));
    int32_t *ids = NULL, *plain = NULL;
    size_t n_ids = 0, n_plain = 0;
    FUZZ_ASSERT(tok_encode(t, "Once upon a time", 16, true, &ids, &n_ids, &e) == ENGINE_OK);
    FUZZ_ASSERT(tok_encode(t, "Once upon a time", 16, false, &plain, &n_plain, &e) == ENGINE_OK);
    FUZZ_ASSERT(n_ids == t->n_prefix + n_plain + t->n_suffix);
    for (size_t i = 0; i < n_ids; i++)
        FUZZ_ASSERT(ids[i] >= 0 && ids[i] < n);
    /* (memcmp of a NULL pointer is undefined even for 0 bytes) */
    FUZZ_ASSERT(!t->n_prefix || memcmp(ids, t->prefix, t->n_prefix * sizeof *ids) == 0);
    FUZZ_ASSERT(!n_plain || memcmp(ids + t->n_prefix, plain, n_plain * sizeof *plain) == 0);
    FUZZ_ASSERT(!t->n_suffix || memcmp(ids + t->n_prefix + n_plain, t->suffix, t->n_suffix * sizeof *ids) == 0);
    free(ids);
    free(plain);
    tok_free(t);
    return 0;
}
