/*
 * arena.h: every byte of device memory the engine uses.
 *
 * One virtual address range is reserved up front; physical memory is
 * created and mapped only when a region is allocated, in one piece rounded
 * up to the allocation granularity, and released when the region is freed.
 * The mapped total never passes the budget. Regions are few and large (a
 * model's weights, a session's KV cache and activations, a workspace), so
 * the physical memory cannot fragment: each region is its own allocation,
 * and a freed region's address range is reused first-fit.
 *
 * Where the driver lacks virtual memory management, the arena makes one
 * plain allocation of the whole budget and carves regions from it.
 */
#ifndef ENGINE_ARENA_H
#define ENGINE_ARENA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../error.h"

typedef enum arena_tag {
    ARENA_WEIGHTS = 0,
    ARENA_KV_CACHE,
    ARENA_ACTIVATIONS,
    ARENA_WORKSPACE,
    ARENA_N_TAGS
} arena_tag;

typedef struct arena arena;

typedef struct arena_stats {
    uint64_t budget;      /* the most that may ever be mapped              */
    uint64_t reserved;    /* virtual address space reserved                */
    uint64_t mapped;      /* physical memory mapped now                    */
    uint64_t in_use;      /* bytes of live regions as requested            */
    uint64_t peak_mapped; /* highest `mapped` seen                         */
    uint64_t by_tag[ARENA_N_TAGS]; /* in_use split by what the regions hold */
    uint64_t granularity;
    int n_regions;
    bool vmm;             /* false: one plain allocation (fallback)        */
} arena_stats;

/*
 * Reserve an arena of `budget` bytes (rounded down to the granularity) on
 * the current device. force_plain skips virtual memory management (tests).
 */
engine_status arena_create(uint64_t budget, bool force_plain, arena **out, err_buf *e);

/* Unmaps and releases everything; NULL is a no-op. */
void arena_destroy(arena *a);

/*
 * A region of `bytes` (256-byte aligned) tagged for the report; `what`
 * names it in errors ("weights", "KV cache", ...). Thread-safe.
 */
engine_status arena_alloc(arena *a, uint64_t bytes, arena_tag tag, const char *what, void **ptr, err_buf *e);

/* Release a region from arena_alloc; NULL is a no-op. Thread-safe. */
void arena_free(arena *a, void *ptr);

void arena_get_stats(arena *a, arena_stats *s);

const char *arena_tag_name(arena_tag t);

#endif
