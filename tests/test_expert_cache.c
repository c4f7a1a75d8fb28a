/*
 * test_expert_cache.c: the device expert cache's policy (engine/expert_cache.c)
 * under routers made on purpose: a biased one (each layer sends 80% of its
 * picks to 8 hot experts, in host memory), the same with the hot experts
 * changed halfway, and a uniform one. 4 layers of 64 experts, 8 picks a
 * token each, experts 0-15 of each layer on the device (not candidates),
 * 32 slots; intervals of 16 tokens, at most 8 swaps an interval.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/expert_cache.h"
#include "test_util.h"

#define LAYERS 4
#define EXPERTS 64
#define K 8
#define RESIDENT 16
#define SLOTS 32
#define IDS (LAYERS * EXPERTS)
#define TOKENS 16
#define MAX_SWAPS 8

static uint64_t rng = 88172645463325252ull;
static double uniform(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

/* One token's k distinct picks in layer l: each from the hot set with probability bias, else uniform. */
static void pick(int l, double bias, const int hot[LAYERS][K], uint32_t *counts)
{
    int got[K], n = 0;
    while (n < K) {
        const int e = uniform() < bias ? hot[l][(int)(uniform() * K)] : (int)(uniform() * EXPERTS);
        bool dup = false;
        for (int i = 0; i < n; i++)
            dup = dup || got[i] == e;
        if (!dup)
            got[n++] = e;
    }
    for (int i = 0; i < K; i++)
        counts[l * EXPERTS + got[i]]++;
}

typedef struct run_stats {
    double hit_rate; /* over the intervals measured */
    double swaps;    /* a measured interval, on average */
} run_stats;

/* intervals of the router (bias, hot), those from `from` on measured; checks every swap's bookkeeping. */
static run_stats run(expert_cache *c, int intervals, int from, double bias, const int hot[LAYERS][K],
                     const bool *cand, uint64_t *cand_picks)
{
    uint64_t h0 = 0, m0 = 0, h1, m1;
    int swaps = 0;
    for (int it = 0; it < intervals; it++) {
        uint32_t counts[IDS] = {0};
        for (int t = 0; t < TOKENS; t++)
            for (int l = 0; l < LAYERS; l++)
                pick(l, bias, hot, counts);
        for (int i = 0; i < IDS; i++)
            *cand_picks += cand[i] ? counts[i] : 0;
        if (it == from)
            expert_cache_stats(c, &h0, &m0);
        int in[MAX_SWAPS], slot[MAX_SWAPS], out[MAX_SWAPS];
        const int n = expert_cache_update(c, counts, MAX_SWAPS, in, slot, out);
        CHECK(n >= 0 && n <= MAX_SWAPS);
        for (int i = 0; i < n; i++) {
            CHECK_MSG(in[i] >= 0 && in[i] < IDS && cand[in[i]] && slot[i] >= 0 && slot[i] < SLOTS,
                      "swap %d: id %d into slot %d", i, in[i], slot[i]);
            CHECK(expert_cache_slot(c, in[i]) == slot[i]);
            CHECK(out[i] < 0 || (out[i] != in[i] && expert_cache_slot(c, out[i]) != slot[i]));
        }
        if (it >= from)
            swaps += n;
    }
    expert_cache_stats(c, &h1, &m1);
    const uint64_t h = h1 - h0, m = m1 - m0;
    return (run_stats){h + m ? (double)h / (double)(h + m) : 0.0, (double)swaps / (intervals - from)};
}

int main(void)
{
    bool cand[IDS];
    for (int i = 0; i < IDS; i++)
        cand[i] = i % EXPERTS >= RESIDENT;
    CHECK(expert_cache_create(IDS, 0, cand) == NULL && expert_cache_create(0, SLOTS, cand) == NULL);
    int hot[LAYERS][K], hot2[LAYERS][K];
    for (int l = 0; l < LAYERS; l++)
        for (int j = 0; j < K; j++) {
            hot[l][j] = RESIDENT + 3 * j + l;  /* all in host memory */
            hot2[l][j] = RESIDENT + 40 + j;    /* another 8, also in host memory */
        }

    /* Biased: the hot experts' share of the candidates' picks is about 6.4 of 7.6 a token (0.84); the cache
     * holds all 32 of them after a few intervals and then stops swapping. */
    expert_cache *c = expert_cache_create(IDS, SLOTS, cand);
    CHECK(c != NULL);
    uint64_t picks = 0;
    run_stats b = run(c, 40, 8, 0.8, hot, cand, &picks);
    uint64_t h, m;
    expert_cache_stats(c, &h, &m);
    CHECK_MSG(h + m == picks, "%llu hits + %llu misses, %llu candidate picks", (unsigned long long)h,
              (unsigned long long)m, (unsigned long long)picks);
    printf("test_expert_cache: biased router: hit rate %.3f, %.2f swaps an interval\n", b.hit_rate, b.swaps);
    CHECK_MSG(b.hit_rate > 0.75, "biased router: hit rate %.3f", b.hit_rate);
    CHECK_MSG(b.swaps < 1.0, "biased router: %.2f swaps an interval once warm", b.swaps);
    for (int l = 0; l < LAYERS; l++)
        for (int j = 0; j < K; j++)
            CHECK_MSG(expert_cache_slot(c, l * EXPERTS + hot[l][j]) >= 0, "hot expert %d of layer %d not cached",
                      hot[l][j], l);

    /* The hot experts change: within a few intervals the new ones are in (recency). */
    run_stats s = run(c, 30, 10, 0.8, hot2, cand, &picks);
    printf("test_expert_cache: after the hot set changed: hit rate %.3f\n", s.hit_rate);
    CHECK_MSG(s.hit_rate > 0.75, "shifted router: hit rate %.3f", s.hit_rate);
    expert_cache_free(c);

    /* Uniform: no expert is hotter; the cache does no better than its share of the candidates (32 of 192). */
    c = expert_cache_create(IDS, SLOTS, cand);
    run_stats u = run(c, 40, 8, 0.0, hot, cand, &picks);
    printf("test_expert_cache: uniform router: hit rate %.3f, %.2f swaps an interval\n", u.hit_rate, u.swaps);
    CHECK_MSG(u.hit_rate < 0.3, "uniform router: hit rate %.3f", u.hit_rate);
    /* Nor does it trade experts of equal standing back and forth: each swap copies an expert. */
    CHECK_MSG(u.swaps < 1.0, "uniform router: %.2f swaps an interval", u.swaps);
    expert_cache_free(c);
    return test_finish("test_expert_cache");
}
