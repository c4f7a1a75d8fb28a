/*
 * expert_cache.c: the device expert cache's policy (expert_cache.h).
 */
#include "expert_cache.h"

#include <stdlib.h>
#include <string.h>

/* A newcomer must score above margin x the resident's + floor to take its slot: each swap copies an
 * expert, and under a uniform router (test_expert_cache) a smaller margin traded experts of equal standing
 * 3.5 times an interval of 16 tokens (1.25 and 0.5: 8 times, the most allowed), this one 0.6 times. */
#define SWAP_MARGIN 3.0
#define SWAP_FLOOR 4.0

struct expert_cache {
    int n_ids, n_slots;
    bool *candidate;
    double *score;  /* [n_ids] picks, each older interval's worth half the next's */
    int *slot_of;   /* [n_ids] its slot, or -1 */
    int *held;      /* [n_slots] the id in each slot, or -1 */
    uint64_t hits, misses;
};

expert_cache *expert_cache_create(int n_ids, int n_slots, const bool *candidate)
{
    if (n_ids <= 0 || n_slots <= 0 || !candidate)
        return NULL;
    expert_cache *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->n_ids = n_ids;
    c->n_slots = n_slots;
    c->candidate = malloc((size_t)n_ids * sizeof *c->candidate);
    c->score = calloc((size_t)n_ids, sizeof *c->score);
    c->slot_of = malloc((size_t)n_ids * sizeof *c->slot_of);
    c->held = malloc((size_t)n_slots * sizeof *c->held);
    if (!c->candidate || !c->score || !c->slot_of || !c->held) {
        expert_cache_free(c);
        return NULL;
    }
    memcpy(c->candidate, candidate, (size_t)n_ids * sizeof *c->candidate);
    for (int i = 0; i < n_ids; i++)
        c->slot_of[i] = -1;
    for (int s = 0; s < n_slots; s++)
        c->held[s] = -1;
    return c;
}

void expert_cache_free(expert_cache *c)
{
    if (!c)
        return;
    free(c->candidate);
    free(c->score);
    free(c->slot_of);
    free(c->held);
    free(c);
}

int expert_cache_update(expert_cache *c, const uint32_t *picks, int max_swaps, int *in, int *slot, int *out)
{
    for (int i = 0; i < c->n_ids; i++) {
        if (!c->candidate[i])
            continue;
        if (c->slot_of[i] >= 0)
            c->hits += picks[i];
        else
            c->misses += picks[i];
        c->score[i] = c->score[i] * 0.5 + picks[i];
    }
    int n = 0;
    while (n < max_swaps) {
        int best = -1;
        for (int i = 0; i < c->n_ids; i++)
            if (c->candidate[i] && c->slot_of[i] < 0 && c->score[i] > 0 &&
                (best < 0 || c->score[i] > c->score[best]))
                best = i;
        if (best < 0)
            break;
        /* An empty slot first, else the resident with the lowest score. */
        int victim = -1;
        for (int s = 0; s < c->n_slots && victim < 0; s++)
            if (c->held[s] < 0)
                victim = s;
        if (victim < 0) {
            victim = 0;
            for (int s = 1; s < c->n_slots; s++)
                if (c->score[c->held[s]] < c->score[c->held[victim]])
                    victim = s;
            if (!(c->score[best] > c->score[c->held[victim]] * SWAP_MARGIN + SWAP_FLOOR))
                break;
        }
        const int old = c->held[victim];
        if (old >= 0)
            c->slot_of[old] = -1;
        c->held[victim] = best;
        c->slot_of[best] = victim;
        in[n] = best, slot[n] = victim, out[n] = old;
        n++;
    }
    return n;
}

int expert_cache_slot(const expert_cache *c, int id)
{
    return c && id >= 0 && id < c->n_ids ? c->slot_of[id] : -1;
}

void expert_cache_stats(const expert_cache *c, uint64_t *hits, uint64_t *misses)
{
    *hits = c ? c->hits : 0;
    *misses = c ? c->misses : 0;
}
