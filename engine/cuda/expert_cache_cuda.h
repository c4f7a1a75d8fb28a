/*
 * expert_cache_cuda.h: the expert cache on the device: slots in the arena
 * for the routed experts decode's GPU reads from host memory over PCIe
 * (split layers with experts_host_gpu), filled by engine/expert_cache.c's
 * policy from the routing kernel's pick counts.
 *
 * Every 16 decode steps a session (ENGINE_EXPERT_CACHE_INTERVAL, for
 * tests, sets another count), before it launches a step,
 * takes the pick counts it copied back at the previous update (an event
 * says they are there; no step waits for them), hands the interval's
 * counts to the policy, and queues the swaps on its stream: the expert's
 * bytes from the pinned host image into its slot, its two table entries
 * (gate/up, down) pointed at the slot, an evicted expert's pointed back
 * into the image. The steps already queued read the old tables; the next
 * reads the new, in stream order. A model's sessions share its tables:
 * with a cache, decode one session of a model at a time.
 */
#ifndef ENGINE_CUDA_EXPERT_CACHE_H
#define ENGINE_CUDA_EXPERT_CACHE_H

#include "state.h"

/* After the weights are placed: the slots of m's expert_cache bytes, when decode's GPU reads host experts. */
engine_status expert_slots_open(cuda_model *cm, const engine_model *m, err_buf *e);
void expert_slots_free(cuda_model *cm);
/* The session's side (pinned counts and staging, an event); nothing without a cache. */
engine_status expert_feed_open(cuda_session *cs, const engine_session *s, err_buf *e);
void expert_feed_free(cuda_session *cs);
/* Before a decode step is queued (outside a graph capture): every CACHE_INTERVAL steps, an update. -1 on a CUDA error (lc.err). */
int expert_cache_tick(cuda_session *cs, const engine_session *s);
/* Slots, and the picks of cacheable experts that found theirs cached or not, since load. */
void expert_cache_numbers(const cuda_model *cm, int *slots, uint64_t *slot_bytes, uint64_t *hits, uint64_t *misses);

#endif
