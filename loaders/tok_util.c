/*
 * tok_util.c: the tokenizer's small building blocks: growable buffers,
 * string lists, UTF-8 decoding with Rust's lossy rules, the Unicode
 * character classes tokenizers relies on, the GPT-2 byte table, and the
 * two open-addressing hash tables (vocabulary and merges).
 */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tok_internal.h"

/* ---- buffers ---- */

static bool grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return true;
    size_t c = *cap ? *cap : 16;
    while (c < need) {
        if (c > SIZE_MAX / 2 / elem)
            return false;
        c *= 2;
    }
    void *q = realloc(*p, c * elem);
    if (!q)
        return false;
    *p = q;
    *cap = c;
    return true;
}

bool tok_buf_reserve(tok_buf *b, size_t extra)
{
    /* One spare byte so callers can NUL-terminate without another check. */
    if (extra > SIZE_MAX - b->n - 1)
        return false;
    void *p = b->p;
    bool ok = grow(&p, &b->cap, b->n + extra + 1, 1);
    b->p = p;
    return ok;
}

bool tok_buf_put(tok_buf *b, const void *s, size_t n)
{
    if (!tok_buf_reserve(b, n))
        return false;
    if (n)
        memcpy(b->p + b->n, s, n);
    b->n += n;
    return true;
}

bool tok_buf_putc(tok_buf *b, char c)
{
    return tok_buf_put(b, &c, 1);
}

size_t tok_cp_encode(uint32_t cp, char u[4])
{
    if (cp < 0x80) {
        u[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        u[0] = (char)(0xC0 | (cp >> 6));
        u[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        u[0] = (char)(0xE0 | (cp >> 12));
        u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    u[0] = (char)(0xF0 | (cp >> 18));
    u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    u[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    u[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

bool tok_buf_put_cp(tok_buf *b, uint32_t cp)
{
    char u[4];
    return tok_buf_put(b, u, tok_cp_encode(cp, u));
}

bool tok_ids_push(tok_ids *v, int32_t id)
{
    return tok_ids_put(v, &id, 1);
}

bool tok_ids_put(tok_ids *v, const int32_t *ids, size_t n)
{
    if (n > SIZE_MAX / sizeof(int32_t) - v->n)
        return false;
    void *p = v->p;
    if (!grow(&p, &v->cap, v->n + n, sizeof(int32_t)))
        return false;
    v->p = p;
    if (n)
        memcpy(v->p + v->n, ids, n * sizeof(int32_t));
    v->n += n;
    return true;
}

bool tok_strs_add(tok_strs *l, size_t off, size_t len, uint8_t flag)
{
    if (l->n == l->cap) {
        size_t c = l->cap ? l->cap * 2 : 16;
        size_t *o = realloc(l->off, c * sizeof *o);
        if (!o)
            return false;
        l->off = o;
        size_t *n = realloc(l->len, c * sizeof *n);
        if (!n)
            return false;
        l->len = n;
        uint8_t *f = realloc(l->flag, c);
        if (!f)
            return false;
        l->flag = f;
        l->cap = c;
    }
    l->off[l->n] = off;
    l->len[l->n] = len;
    l->flag[l->n] = flag;
    l->n++;
    return true;
}

bool tok_strs_add_copy(tok_strs *l, const char *s, size_t len, uint8_t flag)
{
    size_t off = l->text.n;
    return tok_buf_put(&l->text, s, len) && tok_strs_add(l, off, len, flag);
}

void tok_strs_clear(tok_strs *l)
{
    l->text.n = 0;
    l->n = 0;
}

void tok_strs_free(tok_strs *l)
{
    free(l->text.p);
    free(l->off);
    free(l->len);
    free(l->flag);
    memset(l, 0, sizeof *l);
}

/* ---- UTF-8 ---- */

size_t tok_utf8_next(const unsigned char *s, size_t n, uint32_t *cp, bool *bad, bool *truncated)
{
    unsigned c = s[0];
    *bad = false;
    *truncated = false;
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    size_t need;
    uint32_t v;
    unsigned lo = 0x80, hi = 0xBF; /* range allowed for the first continuation byte */
    if (c >= 0xC2 && c <= 0xDF) {
        need = 1;
        v = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        v = c & 0x0F;
        if (c == 0xE0)
            lo = 0xA0; /* no overlong forms */
        else if (c == 0xED)
            hi = 0x9F; /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        v = c & 0x07;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F; /* nothing past U+10FFFF */
    } else {
        *cp = 0xFFFD;
        *bad = true;
        return 1;
    }
    for (size_t i = 1; i <= need; i++) {
        if (i >= n) {
            *cp = 0xFFFD;
            *bad = true;
            *truncated = true;
            return i;
        }
        unsigned b = s[i];
        if (b < lo || b > hi) {
            *cp = 0xFFFD;
            *bad = true;
            return i;
        }
        lo = 0x80;
        hi = 0xBF;
        v = (v << 6) | (b & 0x3F);
    }
    *cp = v;
    return need + 1;
}

bool tok_utf8_lossy(tok_buf *out, const char *s, size_t n, bool *open_tail)
{
    const unsigned char *u = (const unsigned char *)s;
    if (open_tail)
        *open_tail = false;
    if (!tok_buf_reserve(out, n))
        return false;
    size_t i = 0;
    while (i < n) {
        /* Copy valid runs whole: the common case costs one pass. */
        size_t j = i;
        uint32_t cp;
        bool bad = false, trunc = false;
        size_t k = 0;
        while (j < n) {
            k = tok_utf8_next(u + j, n - j, &cp, &bad, &trunc);
            if (bad)
                break;
            j += k;
        }
        if (!tok_buf_put(out, s + i, j - i))
            return false;
        if (j >= n)
            break;
        if (!tok_buf_put_cp(out, 0xFFFD))
            return false;
        if (trunc && open_tail)
            *open_tail = true;
        i = j + k;
    }
    return true;
}

bool tok_utf8_valid(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        bool bad, trunc;
        i += tok_utf8_next(u + i, n - i, &cp, &bad, &trunc);
        if (bad)
            return false;
    }
    return true;
}

size_t tok_utf8_len(uint32_t cp)
{
    return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
}

bool tok_cp_is_space(uint32_t c)
{
    return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

bool tok_cp_is_word(uint32_t c)
{
    if (c < 0x80)
        return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (c == 0x200C || c == 0x200D)
        return true; /* Join_Control */
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
        return true;
    default:
        return false;
    }
}

bool tok_cp_is_numeric(uint32_t c)
{
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

bool tok_cp_is_punct(uint32_t c)
{
    if (c < 0x80)
        return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126);
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO;
}

void tok_bytemap_init(tok_bytemap *m)
{
    /* GPT-2 keeps the printable Latin-1 bytes as themselves and moves the
     * rest, in byte order, to U+0100 onwards, so every byte is a visible
     * character and no piece contains a space or a control code. */
    for (size_t i = 0; i < 324; i++)
        m->to_byte[i] = -1;
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; b++) {
        bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        m->to_cp[b] = keep ? b : next++;
        m->to_byte[m->to_cp[b]] = (int16_t)b;
    }
}

/* ---- hash tables ---- */

uint64_t tok_hash_bytes(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 0x100000001b3ull;
    }
    return h ^ (h >> 29);
}

static size_t pow2_for(size_t n_keys)
{
    size_t c = 16;
    while (c < n_keys * 2)
        c *= 2;
    return c;
}

bool tok_strmap_init(tok_strmap *m, size_t n_keys)
{
    size_t c = pow2_for(n_keys);
    m->slot = malloc(c * sizeof *m->slot);
    if (!m->slot)
        return false;
    for (size_t i = 0; i < c; i++)
        m->slot[i] = (tok_strmap_slot){-1, 0};
    m->mask = c - 1;
    return true;
}

void tok_strmap_free(tok_strmap *m)
{
    free(m->slot);
    m->slot = NULL;
}

int32_t tok_strmap_insert(tok_strmap *m, const char *const *str, const uint32_t *len, int32_t id)
{
    uint64_t h = tok_hash_bytes(str[id], len[id]);
    uint32_t tag = (uint32_t)(h >> 32);
    for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
        tok_strmap_slot s = m->slot[i];
        if (s.id < 0) {
            m->slot[i] = (tok_strmap_slot){id, tag};
            return id;
        }
        if (s.tag == tag && len[s.id] == len[id] && memcmp(str[s.id], str[id], len[id]) == 0)
            return s.id;
    }
}

int32_t tok_strmap_get(const tok_strmap *m, const char *const *str, const uint32_t *len, const char *s,
                       size_t n)
{
    if (!m->slot)
        return -1;
    uint64_t h = tok_hash_bytes(s, n);
    uint32_t tag = (uint32_t)(h >> 32);
    for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
        tok_strmap_slot k = m->slot[i];
        if (k.id < 0)
            return -1;
        if (k.tag == tag && len[k.id] == n && memcmp(str[k.id], s, n) == 0)
            return k.id;
    }
}

static size_t merge_hash(uint64_t key, size_t mask)
{
    /* splitmix64's finalizer: both ids reach the low bits the mask keeps. */
    key ^= key >> 30;
    key *= 0xbf58476d1ce4e5b9ull;
    key ^= key >> 27;
    key *= 0x94d049bb133111ebull;
    key ^= key >> 31;
    return (size_t)key & mask;
}

bool tok_mergemap_init(tok_mergemap *m, size_t n_keys)
{
    size_t c = pow2_for(n_keys);
    m->slot = malloc(c * sizeof *m->slot);
    if (!m->slot)
        return false;
    for (size_t i = 0; i < c; i++)
        m->slot[i].key = UINT64_MAX;
    m->mask = c - 1;
    m->count = 0;
    return true;
}

void tok_mergemap_free(tok_mergemap *m)
{
    free(m->slot);
    m->slot = NULL;
}

static tok_merge *merge_slot(tok_mergemap *m, uint64_t key)
{
    size_t i = merge_hash(key, m->mask);
    while (m->slot[i].key != UINT64_MAX && m->slot[i].key != key)
        i = (i + 1) & m->mask;
    return &m->slot[i];
}

bool tok_mergemap_put(tok_mergemap *m, int32_t a, int32_t b, int32_t rank, int32_t id)
{
    if ((m->count + 1) * 2 > m->mask + 1) {
        /* Keep the load at most one half so probes stay short. */
        tok_mergemap g;
        if (!tok_mergemap_init(&g, m->mask + 1))
            return false;
        for (size_t i = 0; i <= m->mask; i++)
            if (m->slot[i].key != UINT64_MAX)
                *merge_slot(&g, m->slot[i].key) = m->slot[i];
        g.count = m->count;
        free(m->slot);
        *m = g;
    }
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    tok_merge *s = merge_slot(m, key);
    if (s->key == UINT64_MAX)
        m->count++;
    *s = (tok_merge){key, rank, id};
    return true;
}

const tok_merge *tok_mergemap_get(const tok_mergemap *m, int32_t a, int32_t b)
{
    if (!m->slot)
        return NULL;
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t i = merge_hash(key, m->mask);
    for (;; i = (i + 1) & m->mask) {
        if (m->slot[i].key == key)
            return &m->slot[i];
        if (m->slot[i].key == UINT64_MAX)
            return NULL;
    }
}
