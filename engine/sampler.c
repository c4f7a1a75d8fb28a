/*
 * sampler.c: choosing the next token from logits. The order of the steps
 * is transformers' generate(): repetition penalty, temperature, top-k,
 * top-p, min-p, then a draw from the remaining distribution. Temperature 0
 * is greedy (after the penalty). The random stream is xoshiro256**,
 * seeded through splitmix64, so a seed fixes the output.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

typedef struct cand {
    float logit;
    int32_t id;
} cand;

struct engine_sampler {
    engine_sampler_params p;
    uint64_t rng[4];
    cand *cands;          /* [cand_cap] candidates for the filters */
    int cand_cap;
    float *logits;        /* [cap] working copy of the logits      */
    unsigned char *seen;  /* [cap] tokens already penalised        */
    int cap;
};

engine_sampler_params engine_sampler_default_params(void)
{
    engine_sampler_params p;
    memset(&p, 0, sizeof p);
    p.temperature = 0.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.repeat_penalty = 1.0f;
    p.repeat_last_n = 64;
    p.seed = 0;
    return p;
}

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static uint64_t next_u64(uint64_t s[4])
{
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

/* Uniform in [0, 1) with 53 random bits. */
static double next_unit(uint64_t s[4])
{
    return (double)(next_u64(s) >> 11) * (1.0 / 9007199254740992.0);
}

engine_status engine_sampler_create(const engine_sampler_params *params, engine_sampler **out)
{
    if (!out)
        return ENGINE_ERR_INVALID_ARG;
    *out = NULL;
    engine_sampler_params p = params ? *params : engine_sampler_default_params();
    if (!(p.temperature >= 0.0f) || p.top_k < 0 || !(p.top_p > 0.0f && p.top_p <= 1.0f) ||
        !(p.min_p >= 0.0f && p.min_p <= 1.0f) || !(p.repeat_penalty > 0.0f) || p.repeat_last_n < -1)
        return ENGINE_ERR_INVALID_ARG;
    engine_sampler *s = calloc(1, sizeof *s);
    if (!s)
        return ENGINE_ERR_OUT_OF_MEMORY;
    s->p = p;
    uint64_t seed = p.seed;
    for (int i = 0; i < 4; i++)
        s->rng[i] = splitmix64(&seed);
    *out = s;
    return ENGINE_OK;
}

void engine_sampler_free(engine_sampler *s)
{
    if (!s)
        return;
    free(s->cands);
    free(s->logits);
    free(s->seen);
    free(s);
}

static int32_t finish(engine_sampler *s, cand *c, int n);

static int by_logit_desc(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->logit != y->logit)
        return x->logit < y->logit ? 1 : -1;
    return x->id < y->id ? -1 : x->id > y->id; /* ties: lower id first, as argmax */
}

int32_t engine_sampler_sample(engine_sampler *s, const float *logits, int n_vocab, const int32_t *history,
                              size_t n_history)
{
    if (!s || !logits || n_vocab <= 0 || (n_history && !history))
        return -1;
    /* The working buffers grow to the vocabulary once, on first use. */
    if (n_vocab > s->cand_cap) {
        cand *c = realloc(s->cands, (size_t)n_vocab * sizeof *c);
        if (!c)
            return -1;
        s->cands = c;
        s->cand_cap = n_vocab;
    }
    if (n_vocab > s->cap) {
        float *l = realloc(s->logits, (size_t)n_vocab * sizeof *l);
        if (!l)
            return -1;
        s->logits = l;
        unsigned char *m = realloc(s->seen, (size_t)n_vocab);
        if (!m)
            return -1;
        s->seen = m;
        s->cap = n_vocab;
    }
    float *lg = s->logits;
    memcpy(lg, logits, (size_t)n_vocab * sizeof *lg);

    if (s->p.repeat_penalty != 1.0f && n_history) {
        size_t from = 0;
        if (s->p.repeat_last_n >= 0 && n_history > (size_t)s->p.repeat_last_n)
            from = n_history - (size_t)s->p.repeat_last_n;
        /* Each distinct token is penalised once, however often it occurred. */
        for (size_t i = from; i < n_history; i++)
            if (history[i] >= 0 && history[i] < n_vocab)
                s->seen[history[i]] = 0;
        for (size_t i = from; i < n_history; i++) {
            int32_t id = history[i];
            if (id < 0 || id >= n_vocab || s->seen[id])
                continue;
            s->seen[id] = 1;
            lg[id] = lg[id] > 0.0f ? lg[id] / s->p.repeat_penalty : lg[id] * s->p.repeat_penalty;
        }
    }

    if (s->p.temperature <= 0.0f) {
        int32_t best = 0;
        for (int i = 1; i < n_vocab; i++)
            if (lg[i] > lg[best])
                best = i;
        return best;
    }

    /* Tokens more than 50 nats below the best have probability below
     * 2e-22 of it: no filter can keep them and no draw can reach them, so
     * only the rest is sorted (a few hundred of a 128K vocabulary, typically).
     * NaN logits are no candidates (one at index 0 used to make the best NaN
     * and leave none at all); with nothing but NaN there is nothing to draw. */
    float best = -INFINITY;
    for (int i = 0; i < n_vocab; i++)
        if (lg[i] > best)
            best = lg[i];
    const float floor = best / s->p.temperature - 50.0f;
    int n = 0;
    cand *c = s->cands;
    for (int i = 0; i < n_vocab; i++) {
        float l = lg[i] / s->p.temperature;
        if (l >= floor) {
            c[n].logit = l;
            c[n].id = i;
            n++;
        }
    }
    return n > 0 ? finish(s, c, n) : -1;
}

float sampler_temperature(const engine_sampler *s)
{
    return s->p.temperature;
}

int32_t sampler_sample_candidates(engine_sampler *s, const int32_t *ids, const float *scaled, int n)
{
    if (!s || n <= 0)
        return -1;
    if (n > s->cand_cap) {
        cand *c = realloc(s->cands, (size_t)n * sizeof *c);
        if (!c)
            return -1;
        s->cands = c;
        s->cand_cap = n;
    }
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (isnan(scaled[i]))
            continue; /* as above: never a candidate, and qsort needs an order */
        s->cands[k].id = ids[i];
        s->cands[k].logit = scaled[i];
        k++;
    }
    return k > 0 ? finish(s, s->cands, k) : -1;
}

/* From the candidates (logit / temperature, any order): the filters and the draw. */
static int32_t finish(engine_sampler *s, cand *c, int n)
{
    qsort(c, (size_t)n, sizeof *c, by_logit_desc);
    if (s->p.top_k > 0 && s->p.top_k < n)
        n = s->p.top_k;

    /* Softmax over the survivors, in double for stable sums. */
    const double mx = c[0].logit;
    double sum = 0.0;
    for (int i = 0; i < n; i++)
        sum += exp((double)c[i].logit - mx);
    if (s->p.top_p < 1.0f) {
        double cum = 0.0;
        int keep = n;
        for (int i = 0; i < n; i++) {
            cum += exp((double)c[i].logit - mx) / sum;
            if (cum >= s->p.top_p) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
    }
    if (s->p.min_p > 0.0f) {
        /* The largest probability is exp(0)/sum; keep p_i >= min_p * p_max. */
        const double floor_logit = mx + log((double)s->p.min_p);
        int keep = 1;
        while (keep < n && (double)c[keep].logit >= floor_logit)
            keep++;
        n = keep;
    }
    sum = 0.0;
    for (int i = 0; i < n; i++)
        sum += exp((double)c[i].logit - mx);
    double r = next_unit(s->rng) * sum;
    for (int i = 0; i < n; i++) {
        r -= exp((double)c[i].logit - mx);
        if (r < 0.0)
            return c[i].id;
    }
    return c[n - 1].id;
}
