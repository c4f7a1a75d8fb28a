/*
 * fuzz_tok.h: the tokenizer fuzz targets' shared property: the ids that
 * decoded in one piece to whole[len] decode, streamed one id at a time, to
 * pieces that add up to the same bytes.
 */
#ifndef ENGINE_FUZZ_TOK_H
#define ENGINE_FUZZ_TOK_H

#include "fuzz_util.h"

#include <string.h>

#include "loaders/tokenizer.h"

static inline void fuzz_check_stream(const tok_tokenizer *t, const int32_t *ids, size_t n, bool skip,
                                     const char *whole, size_t len)
{
    tok_stream *s = tok_stream_new(t, skip);
    FUZZ_ASSERT(s);
    size_t at = 0;
    const char *piece;
    size_t plen;
    for (size_t i = 0; i < n; i++) {
        FUZZ_ASSERT(tok_stream_push(s, ids[i], &piece, &plen) == ENGINE_OK);
        FUZZ_ASSERT(at + plen <= len && memcmp(whole + at, piece, plen) == 0);
        at += plen;
    }
    FUZZ_ASSERT(tok_stream_flush(s, &piece, &plen) == ENGINE_OK);
    FUZZ_ASSERT(at + plen == len && memcmp(whole + at, piece, plen) == 0);
    tok_stream_free(s);
}

#endif
