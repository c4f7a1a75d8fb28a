/*
 * tok_bpe.c: the BPE model on one pre-tokenized word: characters to ids
 * (continuing-subword prefix, end-of-word suffix, byte fallback, unknown
 * tokens fused or not), then merges applied lowest rank first, leftmost
 * first among equals, through a binary heap over a linked list of
 * symbols, as tokenizers' Word::merge_all does. ignore_merges short-cuts
 * a word that is itself in the vocabulary.
 */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

typedef struct bpe_sym {
    int32_t id;
    int32_t prev, next; /* -1 at the ends */
    bool alive;
} bpe_sym;

typedef struct bpe_cand {
    int32_t rank, pos, id;
} bpe_cand;

struct tok_bpe_scratch {
    bpe_sym *sym;
    size_t n_sym, cap_sym;
    bpe_cand *heap;
    size_t n_heap, cap_heap;
    tok_buf tmp;
};

tok_bpe_scratch *tok_bpe_scratch_new(void)
{
    return calloc(1, sizeof(tok_bpe_scratch));
}

void tok_bpe_scratch_free(tok_bpe_scratch *s)
{
    if (!s)
        return;
    free(s->sym);
    free(s->heap);
    free(s->tmp.p);
    free(s);
}

static bool sym_add(tok_bpe_scratch *s, int32_t id)
{
    if (s->n_sym == s->cap_sym) {
        size_t c = s->cap_sym ? s->cap_sym * 2 : 64;
        if (c > INT32_MAX)
            return false;
        bpe_sym *v = realloc(s->sym, c * sizeof *v);
        if (!v)
            return false;
        s->sym = v;
        s->cap_sym = c;
    }
    int32_t i = (int32_t)s->n_sym++;
    s->sym[i] = (bpe_sym){id, i - 1, -1, true};
    if (i > 0)
        s->sym[i - 1].next = i;
    return true;
}

static bool cand_less(bpe_cand a, bpe_cand b)
{
    return a.rank != b.rank ? a.rank < b.rank : a.pos < b.pos;
}

static bool heap_push(tok_bpe_scratch *s, bpe_cand c)
{
    if (s->n_heap == s->cap_heap) {
        size_t cap = s->cap_heap ? s->cap_heap * 2 : 64;
        bpe_cand *v = realloc(s->heap, cap * sizeof *v);
        if (!v)
            return false;
        s->heap = v;
        s->cap_heap = cap;
    }
    size_t i = s->n_heap++;
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (!cand_less(c, s->heap[up]))
            break;
        s->heap[i] = s->heap[up];
        i = up;
    }
    s->heap[i] = c;
    return true;
}

static bpe_cand heap_pop(tok_bpe_scratch *s)
{
    bpe_cand top = s->heap[0];
    bpe_cand last = s->heap[--s->n_heap];
    size_t i = 0, n = s->n_heap;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        bpe_cand best = last;
        if (l < n && cand_less(s->heap[l], best)) {
            m = l;
            best = s->heap[l];
        }
        if (r < n && cand_less(s->heap[r], best))
            m = r;
        if (m == i)
            break;
        s->heap[i] = s->heap[m];
        i = m;
    }
    if (n > 0)
        s->heap[i] = last;
    return top;
}

static bool push_pair(const tok_tokenizer *t, tok_bpe_scratch *s, int32_t pos)
{
    int32_t nx = s->sym[pos].next;
    if (nx < 0)
        return true;
    const tok_merge *m = tok_mergemap_get(&t->merges, s->sym[pos].id, s->sym[nx].id);
    if (!m)
        return true;
    return heap_push(s, (bpe_cand){m->rank, pos, m->id});
}

static int32_t vocab_get(const tok_tokenizer *t, const char *s, size_t n)
{
    return tok_strmap_get(&t->vocab, (const char *const *)t->mstr, t->mlen, s, n);
}

/* Characters to initial symbols, with tokenizers' unknown-token rules. */
static bool initial_symbols(const tok_tokenizer *t, const char *w, size_t n, tok_bpe_scratch *s)
{
    int32_t unk = -1; /* a pending (possibly fused) unknown token */
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        bool bad, trunc;
        size_t k = tok_utf8_next((const unsigned char *)w + i, n - i, &cp, &bad, &trunc);
        bool first = i == 0, last = i + k == n;
        const char *sym = w + i;
        size_t sl = k;
        if ((!first && t->cont_prefix) || (last && t->eow_suffix)) {
            s->tmp.n = 0;
            if (!first && t->cont_prefix && !tok_buf_put(&s->tmp, t->cont_prefix, t->cont_prefix_len))
                return false;
            if (!tok_buf_put(&s->tmp, w + i, k))
                return false;
            if (last && t->eow_suffix && !tok_buf_put(&s->tmp, t->eow_suffix, t->eow_suffix_len))
                return false;
            sym = s->tmp.p;
            sl = s->tmp.n;
        }
        i += k;
        int32_t id = vocab_get(t, sym, sl);
        if (id >= 0) {
            if (unk >= 0 && !sym_add(s, unk))
                return false;
            unk = -1;
            if (!sym_add(s, id))
                return false;
            continue;
        }
        if (t->byte_fallback) {
            bool all = true;
            for (size_t j = 0; j < sl && all; j++)
                all = t->byte_id[(unsigned char)sym[j]] >= 0;
            if (all) {
                /* As in tokenizers, a pending unknown is not flushed here:
                 * it lands after these bytes. */
                for (size_t j = 0; j < sl; j++)
                    if (!sym_add(s, t->byte_id[(unsigned char)sym[j]]))
                        return false;
                continue;
            }
        }
        if (t->unk_id < 0)
            continue; /* no unknown token: the character is dropped */
        if (unk >= 0 && !t->fuse_unk && !sym_add(s, unk))
            return false;
        unk = t->unk_id;
    }
    return unk < 0 || sym_add(s, unk);
}

bool tok_bpe_word(const tok_tokenizer *t, const char *w, size_t n, tok_bpe_scratch *s, tok_ids *out)
{
    if (n == 0)
        return true;
    if (t->ignore_merges) {
        int32_t id = vocab_get(t, w, n);
        if (id >= 0)
            return tok_ids_push(out, id);
    }
    s->n_sym = 0;
    s->n_heap = 0;
    if (!initial_symbols(t, w, n, s))
        return false;
    if (s->n_sym == 0)
        return true;
    for (int32_t i = 0; i + 1 < (int32_t)s->n_sym; i++)
        if (!push_pair(t, s, i))
            return false;
    while (s->n_heap > 0) {
        bpe_cand c = heap_pop(s);
        bpe_sym *a = &s->sym[c.pos];
        if (!a->alive || a->next < 0)
            continue;
        int32_t nx = a->next;
        /* Entries go stale when a neighbour merged first; the pair at pos
         * must still produce the same token. */
        const tok_merge *m = tok_mergemap_get(&t->merges, a->id, s->sym[nx].id);
        if (!m || m->id != c.id)
            continue;
        a->id = c.id;
        a->next = s->sym[nx].next;
        s->sym[nx].alive = false;
        if (a->next >= 0)
            s->sym[a->next].prev = c.pos;
        if (a->prev >= 0 && !push_pair(t, s, a->prev))
            return false;
        if (!push_pair(t, s, c.pos))
            return false;
    }
    for (int32_t i = 0; i >= 0; i = s->sym[i].next)
        if (!tok_ids_push(out, s->sym[i].id))
            return false;
    return true;
}
