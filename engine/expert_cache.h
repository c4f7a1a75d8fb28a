/*
 * expert_cache.h: which routed experts from host memory to keep in a few
 * device slots, by how often and how lately the router picked them.
 *
 * Decode reads a token's picks among the experts in host memory over
 * PCIe (or the CPU runs them); a real model's router favours some experts
 * far more than others, so a cache of the most picked ones in device
 * memory saves most of those reads. This is the policy alone, with no
 * device in it: the CUDA backend feeds it each interval's pick counts
 * (the routing kernel's, engine_session_expert_picks) and carries out the
 * swaps it returns (an expert's bytes copied into a slot, its two table
 * entries pointed there, the evicted one's pointed back).
 *
 * An expert's score is its picks with older intervals' weighed down by
 * half each interval (frequency and recency in one number). After each
 * interval the best-scored experts not in the cache replace the
 * worst-scored ones in it, at most max_swaps of them, and only where the
 * newcomer's score beats the resident's by a margin (so that two experts
 * of about equal standing do not trade places every interval). Hits and
 * misses are counted against the set the cache held during the interval.
 */
#ifndef ENGINE_EXPERT_CACHE_H
#define ENGINE_EXPERT_CACHE_H

#include <stdbool.h>
#include <stdint.h>

typedef struct expert_cache expert_cache;

/*
 * A cache of n_slots experts among n_ids (an id is layer * n_experts +
 * expert); candidate[id] says which may be cached (the experts in host
 * memory; the others' picks count neither as hits nor as misses). NULL
 * when out of memory or given nothing to cache.
 */
expert_cache *expert_cache_create(int n_ids, int n_slots, const bool *candidate);
void expert_cache_free(expert_cache *c);

/*
 * One interval's picks (picks[id] since the last call): counts them as hits
 * or misses, updates the scores, and plans at most max_swaps swaps into
 * in[i] (the id brought in), slot[i] (the slot it takes) and out[i] (the
 * id it evicts, -1 for a slot that was empty). Returns the number of
 * swaps; the cache holds the new set from then on.
 */
int expert_cache_update(expert_cache *c, const uint32_t *picks, int max_swaps, int *in, int *slot, int *out);

/* The slot holding id, or -1. */
int expert_cache_slot(const expert_cache *c, int id);

/* Picks of candidates since creation that found their expert cached, and that did not. */
void expert_cache_stats(const expert_cache *c, uint64_t *hits, uint64_t *misses);

#endif
