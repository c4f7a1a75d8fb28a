/* attention.c: causal grouped-query attention of new tokens against the KV
 * cache, in any of its types, whole or a sliding window's ring (rows are
 * found from positions; keys are visited in position order either way).
 * One (token, head) pair per work item; scores
 * live in the calling thread's slice of the session scratch, and a row of a
 * non-f32 cache is decoded a chunk at a time into the stack, so nothing is
 * allocated here and the cache is never expanded. */
#include <math.h>
#include <omp.h>

#include "../kernels.h"
#include "kv.h"

/* Elements of a row decoded at a time: a typical head in one go, within a
 * small stack buffer whatever head_dim is. */
#define KV_CHUNK 128

/* Positions a work item attends to, and where its query and output rows are. */
typedef struct item {
    int first, pos;     /* positions first .. pos                  */
    int ring;           /* the cache's ring (0: position p at row p) */
    size_t kvh;         /* the kv head its query head reads        */
    const float *q;     /* [head_dim]                              */
    float *o;           /* [head_dim]                              */
    float *score;       /* this thread's scratch, indexed by position */
} item;

static inline item item_of(const k_ctx *c, float *out, const float *q, int it, int pos0, int n_heads,
                           int n_kv_heads, int head_dim, int window, int ring)
{
    const int t = it / n_heads, h = it % n_heads;
    item r;
    r.pos = pos0 + t;
    r.first = (window > 0 && r.pos + 1 > window) ? r.pos + 1 - window : 0;
    r.ring = ring;
    r.kvh = (size_t)(h / (n_heads / n_kv_heads));
    r.q = q + ((size_t)t * n_heads + h) * head_dim;
    r.o = out + ((size_t)t * n_heads + h) * head_dim;
    r.score = c->scratch + (size_t)omp_get_thread_num() * c->scratch_per_thread;
    return r;
}

/* The row after row `at` of a ring (0: no ring, rows never wrap). */
static inline int next_row(int at, int ring)
{
    return at + 1 == ring ? 0 : at + 1;
}

/* score[first..pos] = softmax of the scores whose largest is mx; returns nothing, normalises in place. */
static inline void softmax(float *score, int first, int pos, float mx)
{
    double sum = 0.0;
    for (int p = first; p <= pos; p++) {
        score[p] = expf(score[p] - mx);
        sum += score[p];
    }
    const float inv = (float)(1.0 / sum);
    for (int p = first; p <= pos; p++)
        score[p] *= inv;
}

/* The fp32 cache: rows read in place. */
/* Gemma 2's soft-capping of a scaled score (cap 0: none). */
static inline float capped(float s, float cap)
{
    return cap > 0.0f ? cap * tanhf(s / cap) : s;
}

static void attend_f32(const item *r, const float *kc, const float *vc, size_t kv_stride, int hd, float scale,
                       float cap)
{
    const float *q = r->q;
    float *o = r->o, *score = r->score;
    const int ring = r->ring, row0 = ring > 0 ? r->first % ring : r->first;
    float mx = -INFINITY;
    for (int p = r->first, at = row0; p <= r->pos; p++, at = next_row(at, ring)) {
        const float *kv = kc + (size_t)at * kv_stride + r->kvh * hd;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int i = 0; i < hd; i++)
            s += q[i] * kv[i];
        s = capped(s * scale, cap);
        score[p] = s;
        mx = s > mx ? s : mx;
    }
    softmax(score, r->first, r->pos, mx);
    for (int i = 0; i < hd; i++)
        o[i] = 0.0f;
    for (int p = r->first, at = row0; p <= r->pos; p++, at = next_row(at, ring)) {
        const float *vv = vc + (size_t)at * kv_stride + r->kvh * hd;
        const float w = score[p];
#pragma omp simd
        for (int i = 0; i < hd; i++)
            o[i] += w * vv[i];
    }
}

/* Any cache type: each row decoded into the stack a chunk at a time, its scale applied once per row. */
static void attend_any(const item *r, const k_kv *k, const k_kv *v, int n_kv_heads, int hd, float scale, float cap)
{
    const int ks = k_kv_has_scales(k->type), vs = k_kv_has_scales(v->type);
    const float *q = r->q; /* locals, not r->...: the vectorizer will not hoist a load through r */
    float *o = r->o, *score = r->score;
    float buf[KV_CHUNK];
    const int ring = r->ring, row0 = ring > 0 ? r->first % ring : r->first;
    float mx = -INFINITY;
    for (int p = r->first, at = row0; p <= r->pos; p++, at = next_row(at, ring)) {
        const size_t row = (size_t)at * n_kv_heads + r->kvh;
        float s = 0.0f;
        for (int i0 = 0; i0 < hd; i0 += KV_CHUNK) {
            const int m = hd - i0 < KV_CHUNK ? hd - i0 : KV_CHUNK;
            kv_decode(k, row * hd + i0, m, buf);
#pragma omp simd reduction(+ : s)
            for (int i = 0; i < m; i++)
                s += q[i0 + i] * buf[i];
        }
        s = capped(s * (ks ? scale * k->scales[row] : scale), cap);
        score[p] = s;
        mx = s > mx ? s : mx;
    }
    softmax(score, r->first, r->pos, mx);
    for (int i = 0; i < hd; i++)
        o[i] = 0.0f;
    for (int p = r->first, at = row0; p <= r->pos; p++, at = next_row(at, ring)) {
        const size_t row = (size_t)at * n_kv_heads + r->kvh;
        const float w = vs ? score[p] * v->scales[row] : score[p];
        for (int i0 = 0; i0 < hd; i0 += KV_CHUNK) {
            const int m = hd - i0 < KV_CHUNK ? hd - i0 : KV_CHUNK;
            kv_decode(v, row * hd + i0, m, buf);
#pragma omp simd
            for (int i = 0; i < m; i++)
                o[i0 + i] += w * buf[i];
        }
    }
}

void k_attention_kv(const k_ctx *c, float *out, const float *q, const k_kv *k, const k_kv *v, int n, int pos0,
                    int n_heads, int n_kv_heads, int head_dim, int window)
{
    k_attention_kv_ex(c, out, q, k, v, n, pos0, n_heads, n_kv_heads, head_dim, window, 1.0f / sqrtf((float)head_dim),
                      0.0f);
}

void k_attention_kv_ex(const k_ctx *c, float *out, const float *q, const k_kv *k, const k_kv *v, int n, int pos0,
                       int n_heads, int n_kv_heads, int head_dim, int window, float scale, float softcap)
{
    const int items = n * n_heads;
    const int f32 = k->type == K_KV_F32 && v->type == K_KV_F32;
#pragma omp parallel for num_threads(c->n_threads) schedule(dynamic, 1) \
    if ((double)items * (pos0 + n) * head_dim >= K_PARALLEL_MIN_WORK)
    for (int it = 0; it < items; it++) {
        const item r = item_of(c, out, q, it, pos0, n_heads, n_kv_heads, head_dim, window, k->ring);
        if (f32)
            attend_f32(&r, k->data, v->data, (size_t)n_kv_heads * head_dim, head_dim, scale, softcap);
        else
            attend_any(&r, k, v, n_kv_heads, head_dim, scale, softcap);
    }
}

void k_attention(const k_ctx *c, float *out, const float *q, const float *k_cache, const float *v_cache, int n,
                 int pos0, int n_heads, int n_kv_heads, int head_dim, int window)
{
    const k_kv k = {(void *)k_cache, NULL, K_KV_F32, 0}, v = {(void *)v_cache, NULL, K_KV_F32, 0};
    k_attention_kv(c, out, q, &k, &v, n, pos0, n_heads, n_kv_heads, head_dim, window);
}
