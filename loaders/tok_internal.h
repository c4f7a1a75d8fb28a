/*
 * tok_internal.h: the tokenizer's private data structures, shared by the
 * tok_*.c files: the loaded tokenizer (vocabulary, merges, added tokens,
 * normalizer / pre-tokenizer / decoder chains), growable buffers, the two
 * hash tables and the UTF-8 helpers. Nothing here is mutable after
 * tok_load() returns: encode and decode keep their scratch in locals, so
 * one tok_tokenizer serves many threads.
 */
#ifndef ENGINE_TOK_INTERNAL_H
#define ENGINE_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer.h"

/* ---- growable buffers (tok_util.c) ---- */

typedef struct tok_buf {
    char *p;
    size_t n, cap;
} tok_buf;

typedef struct tok_ids {
    int32_t *p;
    size_t n, cap;
} tok_ids;

/* Each returns false on allocation failure, leaving the buffer as it was. */
bool tok_buf_reserve(tok_buf *b, size_t extra);
bool tok_buf_put(tok_buf *b, const void *s, size_t n);
bool tok_buf_putc(tok_buf *b, char c);
bool tok_buf_put_cp(tok_buf *b, uint32_t cp); /* UTF-8 encoding of cp */
bool tok_ids_push(tok_ids *v, int32_t id);
bool tok_ids_put(tok_ids *v, const int32_t *ids, size_t n);

/* A list of strings stored back to back in one buffer: the unit that
 * pre-tokenizers split and decoders transform. */
typedef struct tok_strs {
    tok_buf text;
    size_t *off, *len; /* [n] */
    uint8_t *flag;     /* [n] per-string bit (pre-tokenizers: starts the original text) */
    size_t n, cap;
} tok_strs;

bool tok_strs_add(tok_strs *l, size_t off, size_t len, uint8_t flag); /* a range already in text */
bool tok_strs_add_copy(tok_strs *l, const char *s, size_t len, uint8_t flag);
void tok_strs_clear(tok_strs *l);
void tok_strs_free(tok_strs *l);

/* ---- UTF-8 (tok_util.c) ---- */

/*
 * Decode one code point of s[0..n) (n > 0). Returns the number of bytes it
 * takes; *cp is U+FFFD for an ill-formed sequence, whose length is then
 * that of the maximal valid prefix (at least 1), the rule Rust's
 * String::from_utf8_lossy follows, and *bad is set. *truncated is set when
 * the sequence is a valid prefix cut off by the end of the input.
 */
size_t tok_utf8_next(const unsigned char *s, size_t n, uint32_t *cp, bool *bad, bool *truncated);
/* Lossy conversion appended to out; *open_tail (may be NULL) is set when the
 * input ends inside a character that more bytes could complete. */
bool tok_utf8_lossy(tok_buf *out, const char *s, size_t n, bool *open_tail);
bool tok_utf8_valid(const char *s, size_t n);
size_t tok_utf8_len(uint32_t cp);
size_t tok_cp_encode(uint32_t cp, char u[4]); /* bytes written */

bool tok_cp_is_space(uint32_t cp);   /* Unicode White_Space (Rust char::is_whitespace) */
bool tok_cp_is_word(uint32_t cp);    /* Rust regex \w */
bool tok_cp_is_numeric(uint32_t cp); /* Rust char::is_numeric: N* */
bool tok_cp_is_punct(uint32_t cp);   /* ASCII punctuation or P* */

/* GPT-2 byte <-> printable code point tables, built once per tokenizer. */
typedef struct tok_bytemap {
    uint32_t to_cp[256];
    int16_t to_byte[324]; /* -1 where the code point is no byte's image */
} tok_bytemap;
void tok_bytemap_init(tok_bytemap *m);

/* ---- hash tables (tok_util.c) ---- */

uint64_t tok_hash_bytes(const char *s, size_t n);

/* String -> id over strings owned elsewhere (str[id], len[id]). */
typedef struct tok_strmap_slot {
    int32_t id;   /* -1 empty */
    uint32_t tag; /* high hash bits: most misses never touch the strings */
} tok_strmap_slot;

typedef struct tok_strmap {
    tok_strmap_slot *slot; /* [mask+1] */
    size_t mask;
} tok_strmap;

bool tok_strmap_init(tok_strmap *m, size_t n_keys);
void tok_strmap_free(tok_strmap *m);
/* Inserts id unless its string is present already; returns the id now mapped. */
int32_t tok_strmap_insert(tok_strmap *m, const char *const *str, const uint32_t *len, int32_t id);
int32_t tok_strmap_get(const tok_strmap *m, const char *const *str, const uint32_t *len, const char *s,
                       size_t n);

/* (left id, right id) -> (rank, merged id). */
typedef struct tok_merge {
    uint64_t key; /* UINT64_MAX empty */
    int32_t rank, id;
} tok_merge;

typedef struct tok_mergemap {
    tok_merge *slot;
    size_t mask, count;
} tok_mergemap;

bool tok_mergemap_init(tok_mergemap *m, size_t n_keys);
void tok_mergemap_free(tok_mergemap *m);
/* Inserts or replaces; grows the table as needed; false when out of memory. */
bool tok_mergemap_put(tok_mergemap *m, int32_t a, int32_t b, int32_t rank, int32_t id);
const tok_merge *tok_mergemap_get(const tok_mergemap *m, int32_t a, int32_t b);

/* ---- patterns: what Split, Replace and friends search for (tok_normalize.c) ---- */

enum tok_pat_kind { TOK_PAT_STRING, TOK_PAT_REGEX, TOK_PAT_SPACE, TOK_PAT_NUMERIC, TOK_PAT_PUNCT };

typedef struct tok_pattern {
    enum tok_pat_kind kind;
    char *str; /* TOK_PAT_STRING */
    size_t len;
    pcre2_code *re; /* TOK_PAT_REGEX, JIT-compiled when the platform allows */
} tok_pattern;

/* One stretch of a searched string, matched by the pattern or not. */
typedef struct tok_span {
    size_t start, end;
    bool match;
} tok_span;

typedef struct tok_spans {
    tok_span *v;
    size_t n, cap;
} tok_spans;

engine_status tok_pattern_compile_regex(tok_pattern *p, const char *re, size_t len, const char *path,
                                        err_buf *e);
void tok_pattern_free(tok_pattern *p);
/* Spans covering s[0..n) in order, as tokenizers' Pattern::find_matches
 * gives them. Returns false on allocation failure. */
bool tok_pattern_find(const tok_pattern *p, const char *s, size_t n, tok_spans *out);
void tok_spans_free(tok_spans *s);

/* ---- normalizers (tok_normalize.c) ---- */

enum tok_norm_kind {
    TOK_NORM_NFC,
    TOK_NORM_NFD,
    TOK_NORM_NFKC,
    TOK_NORM_NFKD,
    TOK_NORM_LOWERCASE,
    TOK_NORM_STRIP,
    TOK_NORM_REPLACE,
    TOK_NORM_PREPEND,
    TOK_NORM_APPEND
};

typedef struct tok_norm {
    enum tok_norm_kind kind;
    bool left, right;  /* Strip */
    tok_pattern pat;   /* Replace */
    char *content;     /* Replace / Prepend / Append */
    size_t content_len;
} tok_norm;

/* Runs the whole chain on s[0..n) (valid UTF-8), result in out (reset first). */
bool tok_normalize(const tok_tokenizer *t, const char *s, size_t n, tok_buf *out);

/* ---- pre-tokenizers (tok_pretok.c) ---- */

enum tok_pre_kind {
    TOK_PRE_BYTELEVEL,
    TOK_PRE_SPLIT,
    TOK_PRE_METASPACE,
    TOK_PRE_DIGITS,
    TOK_PRE_WHITESPACE,
    TOK_PRE_WHITESPACE_SPLIT,
    TOK_PRE_PUNCTUATION
};

enum tok_split_behavior { TOK_REMOVED, TOK_ISOLATED, TOK_MERGED_PREV, TOK_MERGED_NEXT, TOK_CONTIGUOUS };

enum tok_prepend_scheme { TOK_PREPEND_ALWAYS, TOK_PREPEND_FIRST, TOK_PREPEND_NEVER };

typedef struct tok_pretok {
    enum tok_pre_kind kind;
    tok_pattern pat; /* Split, ByteLevel (use_regex), Whitespace, Digits, Punctuation */
    bool has_pat;
    enum tok_split_behavior behavior;
    bool invert;
    bool add_prefix_space; /* ByteLevel */
    uint32_t replacement;  /* Metaspace */
    enum tok_prepend_scheme prepend;
    bool split;
} tok_pretok;

/* Pre-tokenizes one normalized piece (at_origin: it begins the original
 * text) into words; out is cleared first. */
bool tok_pretokenize(const tok_tokenizer *t, const char *s, size_t n, bool at_origin, tok_strs *out,
                     tok_strs *scratch, tok_spans *spans);

/* ---- decoders (tok_decode.c) ---- */

enum tok_dec_kind {
    TOK_DEC_BYTELEVEL,
    TOK_DEC_REPLACE,
    TOK_DEC_BYTEFALLBACK,
    TOK_DEC_FUSE,
    TOK_DEC_STRIP,
    TOK_DEC_METASPACE
};

typedef struct tok_dec {
    enum tok_dec_kind kind;
    tok_pattern pat; /* Replace */
    char *content;   /* Replace */
    size_t content_len;
    uint32_t ch;       /* Strip content, Metaspace replacement */
    size_t start, stop; /* Strip */
    bool prepend;       /* Metaspace: prepend_scheme is not never */
} tok_dec;

/* ---- added tokens (matchers built and run in tok_encode.c) ---- */

typedef struct tok_added {
    char *content;
    size_t len;
    int32_t id;
    bool special, lstrip, rstrip, single_word, normalized;
} tok_added;

/* Leftmost-longest matcher over a set of literal strings. */
typedef struct tok_match_entry {
    char *s; /* owned copy (the normalized form for normalized tokens) */
    size_t n;
    int32_t added; /* index in tok_tokenizer.added */
} tok_match_entry;

typedef struct tok_matcher {
    tok_match_entry *v; /* sorted by first byte, then longest first */
    size_t n;
    uint32_t first[257]; /* v[first[b]..first[b+1]) start with byte b */
} tok_matcher;

/* ---- the tokenizer ---- */

struct tok_tokenizer {
    /* model vocabulary: mstr[id] (NUL-terminated, in arena) or NULL */
    int32_t n_ids; /* largest id + 1 over model and added tokens */
    char **mstr;
    uint32_t *mlen;
    char *arena;
    tok_strmap vocab;
    int32_t *added_of; /* [n_ids] index into added[] or -1 */

    tok_mergemap merges;
    int32_t unk_id; /* -1: unknown characters are dropped */
    bool fuse_unk, byte_fallback, ignore_merges;
    char *cont_prefix, *eow_suffix; /* NULL when absent or empty */
    size_t cont_prefix_len, eow_suffix_len;
    int32_t byte_id[256]; /* "<0xNN>" pieces for byte_fallback, -1 absent */

    tok_added *added;
    size_t n_added;
    tok_matcher match_raw, match_norm;

    tok_norm *norms;
    size_t n_norms;
    tok_pretok *pretoks;
    size_t n_pretoks;
    tok_dec *decs;
    size_t n_decs;
    bool no_decoder;  /* tokens are joined with spaces, as tokenizers does */
    bool streamable;  /* decoder chain can be cut between tokens (tok_decode.c) */

    tok_bytemap bytemap;

    int32_t bos, eos;
    bool add_bos, add_eos;
    int32_t *prefix, *suffix; /* ids add_special puts around the text */
    size_t n_prefix, n_suffix;
};

/* Loading steps tok_load() runs: tok_config.c parses the pipeline parts of
 * tokenizer.json and tokenizer_config.json, tok_encode.c builds the matchers. */
engine_status tok_parse_normalizer(tok_tokenizer *t, json_t *j, const char *path, err_buf *e);
engine_status tok_parse_pretokenizer(tok_tokenizer *t, json_t *j, const char *path, err_buf *e);
engine_status tok_parse_decoder(tok_tokenizer *t, json_t *j, const char *path, err_buf *e);
engine_status tok_parse_post_processor(tok_tokenizer *t, json_t *j, const char *path, err_buf *e);
engine_status tok_parse_config(tok_tokenizer *t, const char *config_path, err_buf *e);
engine_status tok_build_matchers(tok_tokenizer *t, err_buf *e);
void tok_free_matchers(tok_tokenizer *t);
void tok_free_pipeline(tok_tokenizer *t);

/* Model piece or added content of id; NULL for a hole. */
static inline const char *tok_str_of(const tok_tokenizer *t, int32_t id, size_t *len)
{
    if (id < 0 || id >= t->n_ids)
        return NULL;
    int32_t a = t->added_of[id];
    if (a >= 0) {
        *len = t->added[a].len;
        return t->added[a].content;
    }
    *len = t->mlen[id];
    return t->mstr[id];
}

/* tok_bpe.c: one word through the BPE model, ids appended to out. */
typedef struct tok_bpe_scratch tok_bpe_scratch;
tok_bpe_scratch *tok_bpe_scratch_new(void);
void tok_bpe_scratch_free(tok_bpe_scratch *s);
bool tok_bpe_word(const tok_tokenizer *t, const char *w, size_t n, tok_bpe_scratch *s, tok_ids *out);

/* tok_decode.c: decode already-filtered ids through the decoder chain.
 * at_start: these ids open the text; at_end: they close it. */
bool tok_decode_ids(const tok_tokenizer *t, const int32_t *ids, size_t n, bool at_start, bool at_end,
                    tok_buf *out, bool *open_tail);

#endif
