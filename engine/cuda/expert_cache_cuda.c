/*
 * expert_cache_cuda.c: the expert cache's slots and updates on the device
 * (expert_cache_cuda.h); the policy is engine/expert_cache.c.
 */
#include "expert_cache_cuda.h"

#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "../expert_cache.h"
#include "arena.h"
#include "stream.h"

#define CACHE_INTERVAL 16 /* decode steps between updates (ENGINE_EXPERT_CACHE_INTERVAL: tests) */
#define MAX_SWAPS 8       /* experts brought in an update, at most (each a copy)   */
#define SLOT_ALIGN 256    /* an expert's arrays keep their alignment in a slot     */

typedef struct expert_slots {
    char *base;          /* arena region of n_slots slots                          */
    uint64_t slot_bytes;
    int n_slots;
    expert_cache *policy;
    char *image_dev;     /* the device's address of the host experts' image        */
    uint64_t *start;     /* [n_layers * E] a cacheable expert's offset in its layer's part of the image */
    uint64_t *span;      /* [n_layers] one expert's bytes there (0: the layer is not cached) */
} expert_slots;

typedef struct expert_cache_feed {
    int steps, interval;
    bool pending;        /* h_picks is being copied back (ev)                      */
    cudaEvent_t ev;
    uint32_t *h_picks;   /* pinned [n_layers * E]: the device's counts at the last update */
    uint32_t *prev;      /* [n_layers * E] the counts the update before             */
    uint32_t *delta;     /* [n_layers * E]                                          */
    gemv_expert *stage;  /* pinned [4 * MAX_SWAPS] table entries on their way       */
} expert_cache_feed;

/* Where expert x of split layer l starts in its unit (the layout of experts from_ on, from 0). */
static uint64_t expert_start(const gemv_expert *offs, int x, int from_)
{
    if (x == from_)
        return 0; /* the unit begins with it */
    uint64_t s = UINT64_MAX;
    for (int d = 0; d < 2; d++) {
        const uint64_t f[] = {offs[2 * x + d].w,    offs[2 * x + d].scales, offs[2 * x + d].code,
                              offs[2 * x + d].am_q, offs[2 * x + d].am_s2,  offs[2 * x + d].am_code};
        for (int a = 0; a < 6; a++)
            if (f[a] && f[a] < s)
                s = f[a];
    }
    return s;
}

engine_status expert_slots_open(cuda_model *cm, const engine_model *m, err_buf *e)
{
    const stream_model *sm = cm->sm;
    const int L = m->cfg.n_layers, E = m->cfg.n_experts;
    cm->xc = NULL;
    if (m->expert_cache == 0 || !sm || !sm->ex_image || E <= 0)
        return ENGINE_OK;
    expert_slots *xs = calloc(1, sizeof *xs);
    bool *cand = calloc((size_t)L * E, sizeof *cand);
    if (xs) {
        xs->start = malloc((size_t)L * E * sizeof *xs->start);
        xs->span = calloc((size_t)L, sizeof *xs->span);
    }
    if (!xs || !cand || !xs->start || !xs->span) {
        free(cand);
        if (xs)
            free(xs->start), free(xs->span), free(xs);
        return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "out of memory");
    }
    cm->xc = xs;
    if (cudaHostGetDevicePointer((void **)&xs->image_dev, sm->ex_image, 0) != cudaSuccess)
        return err_set(e, ENGINE_ERR_CUDA, "CUDA: host experts' memory has no device address");
    /* Each split layer's host experts, one stride apart from 0 and SLOT_ALIGN-aligned (one format), else
     * the layer is left out. */
    int layers = 0;
    for (int l = 0; l < L; l++) {
        const cuda_layer *D = &cm->layers[l];
        const int si = sm->index[l], r = D->ex_resident;
        if (si < 0 || !sm->split[si] || !D->ex_host_gpu || r >= E)
            continue;
        const gemv_expert *offs = cm->ex_offs + (size_t)l * 2 * E;
        uint64_t top = 0;
        for (int k = sm->first[si]; k < sm->first[si + 1]; k++)
            if (sm->copies[k].dst + sm->copies[k].bytes > top)
                top = sm->copies[k].dst + sm->copies[k].bytes;
        const uint64_t stride = E - r >= 2 ? expert_start(offs, r + 1, r) : top;
        bool ok = stride > 0 && stride % SLOT_ALIGN == 0;
        for (int x = r; ok && x < E; x++) {
            xs->start[(size_t)l * E + x] = expert_start(offs, x, r);
            ok = xs->start[(size_t)l * E + x] == (uint64_t)(x - r) * stride;
        }
        ok = ok && top <= (uint64_t)(E - r) * stride && top > (uint64_t)(E - r - 1) * stride;
        if (!ok) {
            model_log(m, ENGINE_LOG_WARN, "CUDA: the experts of layer %d are not evenly laid out: not cached", l);
            continue;
        }
        xs->span[l] = stride;
        xs->slot_bytes = stride > xs->slot_bytes ? stride : xs->slot_bytes;
        for (int x = r; x < E; x++)
            cand[(size_t)l * E + x] = true;
        layers++;
    }
    xs->n_slots = xs->slot_bytes ? (int)(m->expert_cache / xs->slot_bytes) : 0;
    if (layers == 0 || xs->n_slots == 0) {
        model_log(m, ENGINE_LOG_INFO, "CUDA: no expert cache (%d layers to cache, %.1f MiB an expert, %.1f MiB given)",
                  layers, xs->slot_bytes / 1048576.0, m->expert_cache / 1048576.0);
        free(cand);
        expert_slots_free(cm);
        return ENGINE_OK;
    }
    xs->policy = expert_cache_create(L * E, xs->n_slots, cand);
    free(cand);
    if (!xs->policy)
        return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "out of memory");
    engine_status st = arena_alloc(cm->arena, (uint64_t)xs->n_slots * xs->slot_bytes, ARENA_WEIGHTS,
                                   "the expert cache", (void **)&xs->base, e);
    if (!st)
        model_log(m, ENGINE_LOG_INFO, "CUDA: expert cache of %d slots (%.1f MiB each) for %d layers' host experts",
                  xs->n_slots, xs->slot_bytes / 1048576.0, layers);
    return st;
}

void expert_slots_free(cuda_model *cm)
{
    expert_slots *xs = cm->xc;
    if (!xs)
        return;
    if (xs->base)
        arena_free(cm->arena, xs->base);
    expert_cache_free(xs->policy);
    free(xs->start);
    free(xs->span);
    free(xs);
    cm->xc = NULL;
}

engine_status expert_feed_open(cuda_session *cs, const engine_session *s, err_buf *e)
{
    cs->xf = NULL;
    if (!cs->cm->xc || !cs->moe_picks)
        return ENGINE_OK;
    const size_t n = (size_t)s->model->cfg.n_layers * s->model->cfg.n_experts;
    expert_cache_feed *f = calloc(1, sizeof *f);
    if (!f)
        return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "out of memory");
    cs->xf = f;
    const char *iv = getenv("ENGINE_EXPERT_CACHE_INTERVAL");
    f->interval = iv && atoi(iv) > 0 ? atoi(iv) : CACHE_INTERVAL;
    f->prev = calloc(n, sizeof *f->prev);
    f->delta = malloc(n * sizeof *f->delta);
    cudaError_t ce = cudaEventCreateWithFlags(&f->ev, cudaEventDisableTiming);
    if (ce == cudaSuccess)
        ce = cudaMallocHost((void **)&f->h_picks, n * sizeof *f->h_picks);
    if (ce == cudaSuccess)
        ce = cudaMallocHost((void **)&f->stage, 4 * MAX_SWAPS * sizeof *f->stage);
    if (ce != cudaSuccess)
        return err_set(e, ENGINE_ERR_CUDA, "CUDA: the expert cache's buffers: %s", cudaGetErrorString(ce));
    return f->prev && f->delta ? ENGINE_OK : err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "out of memory");
}

void expert_feed_free(cuda_session *cs)
{
    expert_cache_feed *f = cs->xf;
    if (!f)
        return;
    if (f->ev)
        cudaEventDestroy(f->ev);
    if (f->h_picks)
        cudaFreeHost(f->h_picks);
    if (f->stage)
        cudaFreeHost(f->stage);
    free(f->prev);
    free(f->delta);
    free(f);
    cs->xf = NULL;
}

/* Queue expert id's two table entries pointed at its bytes from address at (a slot, or the image). */
static cudaError_t point(cuda_session *cs, int E, int id, const char *at, gemv_expert *stage)
{
    const cuda_model *cm = cs->cm;
    const expert_slots *xs = cm->xc;
    const int l = id / E, x = id % E;
    const cuda_layer *D = &cm->layers[l];
    const uint64_t delta =
        (uint64_t)(uintptr_t)at - xs->start[id] - (uint64_t)(uintptr_t)D->ex_base; /* modulo 2^64 */
    cudaError_t ce = cudaSuccess;
    for (int d = 0; d < 2 && ce == cudaSuccess; d++) {
        gemv_expert g = cm->ex_offs[(size_t)l * 2 * E + 2 * (size_t)x + d];
        g.w += delta, g.scales += delta, g.code += delta;
        g.am_q += delta, g.am_s2 += delta, g.am_code += delta;
        stage[d] = g;
        ce = cudaMemcpyAsync((void *)(D->ex_table + (size_t)d * E + x), &stage[d], sizeof g, cudaMemcpyHostToDevice,
                             cs->lc.stream);
    }
    return ce;
}

int expert_cache_tick(cuda_session *cs, const engine_session *s)
{
    expert_slots *xs = cs->cm->xc;
    expert_cache_feed *f = cs->xf;
    if (!xs || !f || ++f->steps < f->interval)
        return 0;
    f->steps = 0;
    const int E = s->model->cfg.n_experts, n = s->model->cfg.n_layers * E;
    const stream_model *sm = cs->cm->sm;
    cudaStream_t st = cs->lc.stream;
    cudaError_t ce = cudaSuccess;
    if (f->pending) {
        /* The counts copied back at the last update (long since there: CACHE_INTERVAL steps have run). */
        ce = cudaEventSynchronize(f->ev);
        for (int i = 0; ce == cudaSuccess && i < n; i++) {
            f->delta[i] = f->h_picks[i] - f->prev[i];
            f->prev[i] = f->h_picks[i];
        }
        int in[MAX_SWAPS], slot[MAX_SWAPS], out[MAX_SWAPS];
        const int k = ce == cudaSuccess ? expert_cache_update(xs->policy, f->delta, MAX_SWAPS, in, slot, out) : 0;
        for (int j = 0; j < k && ce == cudaSuccess; j++) {
            const int l = in[j] / E;
            char *dst = xs->base + (uint64_t)slot[j] * xs->slot_bytes;
            const char *src = sm->ex_image + sm->ex_image_at[sm->index[l]] + xs->start[in[j]];
            ce = cudaMemcpyAsync(dst, src, xs->span[l], cudaMemcpyHostToDevice, st);
            if (ce == cudaSuccess)
                ce = point(cs, E, in[j], dst, f->stage + 4 * j);
            if (ce == cudaSuccess && out[j] >= 0) {
                const int lo = out[j] / E;
                const char *home = xs->image_dev + sm->ex_image_at[sm->index[lo]] + xs->start[out[j]];
                ce = point(cs, E, out[j], home, f->stage + 4 * j + 2);
            }
        }
    }
    if (ce == cudaSuccess)
        ce = cudaMemcpyAsync(f->h_picks, cs->moe_picks, (size_t)n * sizeof *f->h_picks, cudaMemcpyDeviceToHost, st);
    if (ce == cudaSuccess)
        ce = cudaEventRecord(f->ev, st);
    f->pending = ce == cudaSuccess;
    return ce == cudaSuccess ? 0 : launch_fail(&cs->lc, "expert cache: %s", cudaGetErrorString(ce));
}

void expert_cache_numbers(const cuda_model *cm, int *slots, uint64_t *slot_bytes, uint64_t *hits, uint64_t *misses)
{
    const expert_slots *xs = cm->xc;
    *slots = xs ? xs->n_slots : 0;
    *slot_bytes = xs ? xs->slot_bytes : 0;
    expert_cache_stats(xs ? xs->policy : NULL, hits, misses);
}
