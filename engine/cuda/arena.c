/*
 * arena.c: the device arena (see arena.h). The driver's virtual memory calls
 * are looked up through the runtime (cudaGetDriverEntryPointByVersion), so
 * libengine never links libcuda and still loads on machines without a
 * driver.
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include "arena.h"

#define ARENA_MAX_REGIONS 256
#define ARENA_ALIGN 256

typedef struct region {
    uint64_t offset;     /* from the base of the reservation              */
    uint64_t bytes;      /* as requested                                  */
    uint64_t span;       /* address range taken: bytes rounded up to gran */
    CUmemGenericAllocationHandle handle; /* VMM only                      */
    arena_tag tag;
} region;

typedef struct driver_api {
    PFN_cuMemAddressReserve_v10020 reserve;
    PFN_cuMemAddressFree_v10020 address_free;
    PFN_cuMemCreate_v10020 create;
    PFN_cuMemRelease_v10020 release;
    PFN_cuMemMap_v10020 map;
    PFN_cuMemUnmap_v10020 unmap;
    PFN_cuMemSetAccess_v10020 set_access;
    PFN_cuMemGetAllocationGranularity_v10020 granularity;
    PFN_cuGetErrorString_v6000 error_string;
    PFN_cuDeviceGetAttribute_v2000 attribute;
} driver_api;

struct arena {
    pthread_mutex_t lock;
    driver_api drv;
    bool vmm;
    int device;
    CUdeviceptr base;
    uint64_t reserved;
    uint64_t budget;
    uint64_t gran;
    uint64_t mapped, in_use, peak_mapped;
    uint64_t by_tag[ARENA_N_TAGS];
    region regions[ARENA_MAX_REGIONS]; /* sorted by offset */
    int n_regions;
};

static const char *const TAG_NAMES[ARENA_N_TAGS] = {"weights", "KV cache", "activations", "workspace"};

const char *arena_tag_name(arena_tag t)
{
    return t < ARENA_N_TAGS ? TAG_NAMES[t] : "?";
}

static uint64_t round_up(uint64_t x, uint64_t to)
{
    return (x + to - 1) / to * to;
}

static const char *drv_error(const arena *a, CUresult r)
{
    const char *s = NULL;
    if (a->drv.error_string)
        a->drv.error_string(r, &s);
    return s ? s : "unknown driver error";
}

static bool load_driver(driver_api *d)
{
    struct {
        const char *name;
        void **fn;
    } table[] = {
        {"cuMemAddressReserve", (void **)&d->reserve}, {"cuMemAddressFree", (void **)&d->address_free},
        {"cuMemCreate", (void **)&d->create},          {"cuMemRelease", (void **)&d->release},
        {"cuMemMap", (void **)&d->map},                {"cuMemUnmap", (void **)&d->unmap},
        {"cuMemSetAccess", (void **)&d->set_access},   {"cuMemGetAllocationGranularity", (void **)&d->granularity},
        {"cuGetErrorString", (void **)&d->error_string}, {"cuDeviceGetAttribute", (void **)&d->attribute},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        enum cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion(table[i].name, table[i].fn, 12000, cudaEnableDefault, &q) !=
                cudaSuccess ||
            q != cudaDriverEntryPointSuccess || !*table[i].fn)
            return false;
    }
    return true;
}

static CUmemAllocationProp alloc_prop(int device)
{
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = device;
    return p;
}

engine_status arena_create(uint64_t budget, bool force_plain, arena **out, err_buf *e)
{
    *out = NULL;
    arena *a = calloc(1, sizeof *a);
    if (!a)
        return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "out of memory for the device arena");
    pthread_mutex_init(&a->lock, NULL);
    cudaError_t ce = cudaGetDevice(&a->device);
    if (ce != cudaSuccess) {
        arena_destroy(a);
        return err_set(e, ENGINE_ERR_CUDA, "device arena: %s", cudaGetErrorString(ce));
    }
    int vmm_supported = 0;
    a->vmm = !force_plain && load_driver(&a->drv) &&
             a->drv.attribute(&vmm_supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, a->device) ==
                 CUDA_SUCCESS &&
             vmm_supported;
    a->gran = ARENA_ALIGN;
    if (a->vmm) {
        CUmemAllocationProp p = alloc_prop(a->device);
        size_t g = 0;
        if (a->drv.granularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) != CUDA_SUCCESS || g == 0)
            a->vmm = false;
        else
            a->gran = g;
    }
    a->budget = budget / a->gran * a->gran;
    if (a->budget == 0) {
        arena_destroy(a);
        return err_set(e, ENGINE_ERR_OVER_BUDGET, "device budget of %llu bytes is below one allocation unit",
                       (unsigned long long)budget);
    }
    if (a->vmm) {
        /* Twice the budget in addresses (they cost nothing) so that the hole a
         * freed region leaves can hardly ever stop a request that fits the
         * budget; physical memory stays capped at the budget. */
        a->reserved = 2 * a->budget;
        CUresult r = a->drv.reserve(&a->base, a->reserved, 0, 0, 0);
        if (r != CUDA_SUCCESS) {
            err_set(e, ENGINE_ERR_CUDA, "device arena: reserving %.1f GiB of addresses: %s",
                    a->reserved / 1073741824.0, drv_error(a, r));
            arena_destroy(a);
            return e ? e->code : ENGINE_ERR_CUDA;
        }
    } else {
        void *p = NULL;
        ce = cudaMalloc(&p, a->budget); /* the fallback's one plain allocation */
        if (ce != cudaSuccess) {
            cudaGetLastError();
            arena_destroy(a);
            return err_set(e, ENGINE_ERR_OVER_BUDGET, "device arena: cannot allocate the %.1f MiB budget: %s",
                           budget / 1048576.0, cudaGetErrorString(ce));
        }
        a->base = (CUdeviceptr)(uintptr_t)p;
        a->reserved = a->budget;
        a->mapped = a->peak_mapped = a->budget;
    }
    *out = a;
    return ENGINE_OK;
}

void arena_destroy(arena *a)
{
    if (!a)
        return;
    while (a->n_regions > 0)
        arena_free(a, (void *)(uintptr_t)(a->base + a->regions[a->n_regions - 1].offset));
    if (a->base) {
        if (a->vmm)
            a->drv.address_free(a->base, a->reserved);
        else
            cudaFree((void *)(uintptr_t)a->base);
    }
    pthread_mutex_destroy(&a->lock);
    free(a);
}

/* Lowest offset where `span` bytes fit between live regions, or UINT64_MAX; sets *index. */
static uint64_t first_fit(const arena *a, uint64_t span, int *index)
{
    uint64_t at = 0;
    for (int i = 0; i < a->n_regions; i++) {
        if (a->regions[i].offset - at >= span) {
            *index = i;
            return at;
        }
        at = a->regions[i].offset + a->regions[i].span;
    }
    *index = a->n_regions;
    return a->reserved - at >= span ? at : UINT64_MAX;
}

static engine_status over_budget(arena *a, uint64_t bytes, const char *what, err_buf *e, const char *why)
{
    return err_set(e, ENGINE_ERR_OVER_BUDGET,
                   "device budget exceeded: %.1f MiB asked for %s, %.1f of the %.1f MiB budget in use "
                   "(weights %.1f, KV cache %.1f, activations %.1f, workspace %.1f MiB)%s",
                   bytes / 1048576.0, what, a->in_use / 1048576.0, a->budget / 1048576.0,
                   a->by_tag[ARENA_WEIGHTS] / 1048576.0, a->by_tag[ARENA_KV_CACHE] / 1048576.0,
                   a->by_tag[ARENA_ACTIVATIONS] / 1048576.0, a->by_tag[ARENA_WORKSPACE] / 1048576.0, why);
}

engine_status arena_alloc(arena *a, uint64_t bytes, arena_tag tag, const char *what, void **ptr, err_buf *e)
{
    *ptr = NULL;
    if (bytes == 0)
        bytes = 1;
    pthread_mutex_lock(&a->lock);
    engine_status st = ENGINE_OK;
    const uint64_t span = round_up(bytes, a->vmm ? a->gran : ARENA_ALIGN);
    int idx = 0;
    uint64_t off = UINT64_MAX;
    if (a->n_regions == ARENA_MAX_REGIONS)
        st = err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "device arena: more than %d live regions", ARENA_MAX_REGIONS);
    else if (a->vmm && a->mapped + span > a->budget)
        st = over_budget(a, bytes, what, e, "");
    else if ((off = first_fit(a, span, &idx)) == UINT64_MAX)
        st = over_budget(a, bytes, what, e, a->vmm ? "; no free address range is large enough" : "");
    region r = {.offset = off, .bytes = bytes, .span = span, .tag = tag};
    if (st == ENGINE_OK && a->vmm) {
        /* One physical allocation per region, mapped in one call: growth
         * costs one create+map however large the region (38 us per 2 MiB
         * chunk, but 0.15 ms for a whole GiB on an H100). */
        CUmemAllocationProp p = alloc_prop(a->device);
        CUresult cr = a->drv.create(&r.handle, span, &p, 0);
        if (cr != CUDA_SUCCESS) {
            st = err_set(e, ENGINE_ERR_OVER_BUDGET, "device arena: %s (%.1f MiB) could not be created: %s", what,
                         bytes / 1048576.0, drv_error(a, cr));
        } else {
            CUmemAccessDesc acc;
            memset(&acc, 0, sizeof acc);
            acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            acc.location.id = a->device;
            acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
            cr = a->drv.map(a->base + off, span, 0, r.handle, 0);
            if (cr == CUDA_SUCCESS) {
                cr = a->drv.set_access(a->base + off, span, &acc, 1);
                if (cr != CUDA_SUCCESS)
                    a->drv.unmap(a->base + off, span);
            }
            if (cr != CUDA_SUCCESS) {
                a->drv.release(r.handle);
                st = err_set(e, ENGINE_ERR_CUDA, "device arena: mapping %s (%.1f MiB): %s", what, bytes / 1048576.0,
                             drv_error(a, cr));
            }
        }
    }
    if (st == ENGINE_OK) {
        memmove(&a->regions[idx + 1], &a->regions[idx], (size_t)(a->n_regions - idx) * sizeof(region));
        a->regions[idx] = r;
        a->n_regions++;
        if (a->vmm)
            a->mapped += span;
        if (a->mapped > a->peak_mapped)
            a->peak_mapped = a->mapped;
        a->in_use += bytes;
        a->by_tag[tag] += bytes;
        *ptr = (void *)(uintptr_t)(a->base + off);
    }
    pthread_mutex_unlock(&a->lock);
    return st;
}

void arena_free(arena *a, void *ptr)
{
    if (!a || !ptr)
        return;
    pthread_mutex_lock(&a->lock);
    const uint64_t off = (uint64_t)((CUdeviceptr)(uintptr_t)ptr - a->base);
    for (int i = 0; i < a->n_regions; i++) {
        region *r = &a->regions[i];
        if (r->offset != off)
            continue;
        if (a->vmm) {
            /* Work queued on the region must finish before its memory goes. */
            cudaDeviceSynchronize();
            a->drv.unmap(a->base + off, r->span);
            a->drv.release(r->handle);
            a->mapped -= r->span;
        }
        a->in_use -= r->bytes;
        a->by_tag[r->tag] -= r->bytes;
        memmove(r, r + 1, (size_t)(a->n_regions - i - 1) * sizeof(region));
        a->n_regions--;
        break;
    }
    pthread_mutex_unlock(&a->lock);
}

void arena_get_stats(arena *a, arena_stats *s)
{
    pthread_mutex_lock(&a->lock);
    memset(s, 0, sizeof *s);
    s->budget = a->budget;
    s->reserved = a->reserved;
    s->mapped = a->mapped;
    s->in_use = a->in_use;
    s->peak_mapped = a->peak_mapped;
    memcpy(s->by_tag, a->by_tag, sizeof s->by_tag);
    s->granularity = a->gran;
    s->n_regions = a->n_regions;
    s->vmm = a->vmm;
    pthread_mutex_unlock(&a->lock);
}
