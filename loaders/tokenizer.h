/*
 * tokenizer.h: Hugging Face tokenizer.json (BPE models) with the semantics
 * of the `tokenizers` library.
 *
 * Two families are covered by the same machinery, configured from the file:
 *  - byte-level BPE (GPT-2, Llama 3, Qwen): optional NFC normalizer,
 *    Split/ByteLevel pre-tokenizers with their regexes (PCRE2, UTF + UCP),
 *    bytes mapped to printable code points, merges by rank, ignore_merges;
 *  - SentencePiece-style BPE (Llama 2, TinyLlama, Mistral): Prepend/Replace/
 *    Strip normalizers, merges by rank, byte fallback to <0xNN> pieces.
 * Added tokens (special or not) are matched inside the text before the
 * normalizer runs, honouring lstrip/rstrip/single_word/normalized.
 * Decoding follows the decoder chain (ByteLevel, or Replace/ByteFallback/
 * Fuse/Strip); streaming decode never emits half a UTF-8 character.
 */
#ifndef ENGINE_TOKENIZER_H
#define ENGINE_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../engine/error.h"

typedef struct tok_tokenizer tok_tokenizer;

/*
 * Load tokenizer.json at json_path; config_path (may be NULL or a missing
 * file) is tokenizer_config.json, supplying bos/eos tokens and
 * add_bos_token/add_eos_token. Without it, add_bos/add_eos follow the
 * post_processor (TemplateProcessing) of tokenizer.json.
 */
engine_status tok_load(const char *json_path, const char *config_path, tok_tokenizer **out, err_buf *e);
void tok_free(tok_tokenizer *t); /* NULL is a no-op */

int tok_vocab_size(const tok_tokenizer *t);   /* largest id + 1 (added tokens included) */
int32_t tok_bos(const tok_tokenizer *t);      /* -1 when none */
int32_t tok_eos(const tok_tokenizer *t);      /* -1 when none */
bool tok_add_bos(const tok_tokenizer *t);
bool tok_add_eos(const tok_tokenizer *t);
bool tok_is_special(const tok_tokenizer *t, int32_t id);
/* The vocabulary string of id as stored in the file (e.g. "Ġthe", "▁the", "<0x0A>"), or NULL. */
const char *tok_piece(const tok_tokenizer *t, int32_t id);

/*
 * Encode len bytes of UTF-8 (invalid sequences are read as U+FFFD).
 * add_special: add BOS/EOS as the tokenizer's config says. *ids is
 * malloc'd (free() it), *n_ids its length. Never fails on any byte input
 * except for lack of memory.
 */
engine_status tok_encode(const tok_tokenizer *t, const char *text, size_t len, bool add_special,
                         int32_t **ids, size_t *n_ids, err_buf *e);

/*
 * Decode ids to UTF-8 (*text malloc'd and NUL-terminated, *len without the
 * NUL), as tokenizers' decode(ids, skip_special_tokens) does. Ids outside
 * the vocabulary give ENGINE_ERR_INVALID_ARG.
 */
engine_status tok_decode(const tok_tokenizer *t, const int32_t *ids, size_t n, bool skip_special,
                         char **text, size_t *len, err_buf *e);

/*
 * Streaming decode: push ids one at a time; each push yields the text that
 * became complete (borrowed, valid until the next call on the stream).
 * The concatenation of all pushes plus the final flush equals
 * tok_decode() of all the ids pushed.
 */
typedef struct tok_stream tok_stream;
tok_stream *tok_stream_new(const tok_tokenizer *t, bool skip_special); /* NULL on OOM */
engine_status tok_stream_push(tok_stream *s, int32_t id, const char **text, size_t *len);
engine_status tok_stream_flush(tok_stream *s, const char **text, size_t *len);
void tok_stream_free(tok_stream *s);

#endif
