/*
 * test_arena.c: the device arena never maps more than its budget, maps each
 * region within one granularity of what was asked, gives memory back on
 * free, reuses freed address ranges, and refuses what does not fit with a
 * message that says how much was asked and what holds the rest. The same
 * through the public API: a model or session over the budget fails cleanly
 * and the measured device memory never passes the budget; the budget
 * exhausted while a session runs is a clean refusal that leaves the
 * running session intact; 1,000 model/session cycles do not grow the
 * device memory held. Skips (77) without a GPU.
 */
#define _POSIX_C_SOURCE 200809L

#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "engine/cuda/arena.h"
#include "test_util.h"

#define MiB (1024ull * 1024ull)

static uint64_t device_used(void)
{
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    return (uint64_t)(total_b - free_b);
}

/* Write a pattern through the region and read it back: the mapping is real. */
static int round_trip(void *dev, size_t bytes)
{
    if (cudaMemset(dev, 0x5a, bytes) != cudaSuccess)
        return 0;
    unsigned char probe[4096];
    size_t n = bytes < sizeof probe ? bytes : sizeof probe;
    if (cudaMemcpy(probe, (char *)dev + bytes - n, n, cudaMemcpyDeviceToHost) != cudaSuccess)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (probe[i] != 0x5a)
            return 0;
    return 1;
}

static void check_invariants(arena *a, const char *when)
{
    arena_stats s;
    arena_get_stats(a, &s);
    CHECK_MSG(s.mapped <= s.budget, "%s: mapped %llu > budget %llu", when, (unsigned long long)s.mapped,
              (unsigned long long)s.budget);
    CHECK_MSG(s.peak_mapped <= s.budget, "%s: peak %llu > budget", when, (unsigned long long)s.peak_mapped);
    if (s.vmm)
        CHECK_MSG(s.mapped - s.in_use <= (uint64_t)s.n_regions * s.granularity,
                  "%s: %llu bytes mapped beyond use over %d regions", when,
                  (unsigned long long)(s.mapped - s.in_use), s.n_regions);
    uint64_t sum = 0;
    for (int t = 0; t < ARENA_N_TAGS; t++)
        sum += s.by_tag[t];
    CHECK_MSG(sum == s.in_use, "%s: tags add to %llu, in use %llu", when, (unsigned long long)sum,
              (unsigned long long)s.in_use);
}

static void test_arena_unit(bool plain)
{
    const char *mode = plain ? "plain" : "vmm";
    err_buf e;
    arena *a = NULL;
    const uint64_t before = device_used();
    CHECK_MSG(arena_create(64 * MiB, plain, &a, &e) == ENGINE_OK, "%s: %s", mode, e.msg);
    if (!a)
        return;
    arena_stats s;
    arena_get_stats(a, &s);
    CHECK(s.vmm == !plain);
    CHECK_MSG(s.budget == 64 * MiB, "%s: budget %llu", mode, (unsigned long long)s.budget);
    if (!plain)
        CHECK_MSG(s.mapped == 0 && device_used() - before < 4 * MiB, "%s: memory taken before any region", mode);

    void *r1 = NULL, *r2 = NULL, *r3 = NULL, *r4 = NULL;
    CHECK(arena_alloc(a, 10 * MiB + 12345, ARENA_WEIGHTS, "weights", &r1, &e) == ENGINE_OK);
    CHECK(arena_alloc(a, 3 * MiB, ARENA_KV_CACHE, "KV cache", &r2, &e) == ENGINE_OK);
    CHECK(arena_alloc(a, 100, ARENA_ACTIVATIONS, "activations", &r3, &e) == ENGINE_OK);
    CHECK(r1 && r2 && r3 && (uintptr_t)r1 % 256 == 0 && (uintptr_t)r2 % 256 == 0 && (uintptr_t)r3 % 256 == 0);
    CHECK(r1 && round_trip(r1, 10 * MiB + 12345));
    CHECK(r2 && round_trip(r2, 3 * MiB));
    CHECK(r3 && round_trip(r3, 100));
    check_invariants(a, mode);
    arena_get_stats(a, &s);
    CHECK(s.in_use == 10 * MiB + 12345 + 3 * MiB + 100);
    CHECK(s.by_tag[ARENA_WEIGHTS] == 10 * MiB + 12345 && s.by_tag[ARENA_KV_CACHE] == 3 * MiB);

    /* Over the budget: refused, with the request and the holders named. */
    CHECK(arena_alloc(a, 60 * MiB, ARENA_ACTIVATIONS, "a big buffer", &r4, &e) == ENGINE_ERR_OVER_BUDGET);
    CHECK(r4 == NULL);
    CHECK_MSG(strstr(e.msg, "60.0 MiB asked for a big buffer") && strstr(e.msg, "weights 10.0"), "%s", e.msg);
    check_invariants(a, mode);

    /* Freed memory goes back to the device and its range is reused first. */
    arena_free(a, r1);
    arena_get_stats(a, &s);
    CHECK(s.in_use == 3 * MiB + 100 && s.by_tag[ARENA_WEIGHTS] == 0);
    if (!plain)
        CHECK(s.mapped == (3 * MiB + s.granularity - 1) / s.granularity * s.granularity + s.granularity);
    void *again = NULL;
    CHECK(arena_alloc(a, 8 * MiB, ARENA_WEIGHTS, "weights", &again, &e) == ENGINE_OK);
    CHECK_MSG(again == r1, "%s: a freed range was not reused first-fit", mode);
    arena_get_stats(a, &s);
    void *r5 = NULL;
    if (!plain) {
        /* Up to exactly the budget, then one byte more. */
        CHECK_MSG(arena_alloc(a, s.budget - s.mapped, ARENA_ACTIVATIONS, "the rest", &r4, &e) == ENGINE_OK, "%s: %s",
                  mode, e.msg);
        check_invariants(a, mode);
        CHECK(arena_alloc(a, 1, ARENA_ACTIVATIONS, "one more", &r5, &e) == ENGINE_ERR_OVER_BUDGET && !r5);
    } else {
        /* The fallback carves one allocation, so a freed hole can be too small
         * for a request that fits the total: only over-total is promised. */
        CHECK(arena_alloc(a, s.budget - s.in_use + 1, ARENA_ACTIVATIONS, "too much", &r5, &e) ==
              ENGINE_ERR_OVER_BUDGET && !r5);
    }
    arena_free(a, r4);
    arena_free(a, again);
    arena_free(a, r2);
    arena_free(a, r3);
    arena_free(a, NULL);
    arena_get_stats(a, &s);
    CHECK(s.in_use == 0 && s.n_regions == 0 && (plain || s.mapped == 0));
    CHECK(s.peak_mapped <= s.budget);
    arena_destroy(a);
    arena_destroy(NULL);
    CHECK_MSG(device_used() <= before + 2 * MiB, "%s: device memory not returned after destroy", mode);
}

/* What a vram_budget must hold besides the arena (the CUDA context's share), measured now. */
static uint64_t reserve_now(void)
{
    uint64_t r = 0;
    CHECK(engine_device_reserve(&r) == ENGINE_OK && r > 0);
    return r;
}

/* Through the public API, on stories260K and a budget far below what it needs. */
static void test_engine_budget(void)
{
    char path[1024], err[512] = "";
    test_src_path(path, sizeof path, "models/stories260K");
    engine_model_params mp = engine_model_default_params();
    mp.device = ENGINE_DEVICE_CUDA;
    mp.vram_budget = 1 * MiB; /* below one granularity: refused at once */
    engine_model *m = NULL;
    CHECK(engine_model_load(path, &mp, &m, err, sizeof err) == ENGINE_ERR_OVER_BUDGET && m == NULL);
    CHECK_MSG(strstr(err, "stories260K") != NULL, "error does not name the model: %s", err);

    /* 40 MiB beyond the CUDA context's share: the weights (about 1 MiB) fit;
     * a session with a 32 MiB cuBLASLt workspace and a long context does
     * not, a short one does. */
    mp.vram_budget = reserve_now() + 40 * MiB;
    const uint64_t before = device_used();
    CHECK_MSG(engine_model_load(path, &mp, &m, err, sizeof err) == ENGINE_OK, "%s", err);
    if (!m)
        return;
    engine_session_params sp = engine_session_default_params();
    sp.n_ctx = 512 * 1024; /* KV cache of 2 x 5 x 512K x 32 x 4 bytes = 640 MiB */
    engine_session *s = NULL;
    CHECK(engine_session_create(m, &sp, &s, err, sizeof err) == ENGINE_ERR_OVER_BUDGET && s == NULL);
    CHECK_MSG(strstr(err, "asked for the KV cache") && strstr(err, "budget"), "%s", err);
    sp.n_ctx = 256;
    CHECK_MSG(engine_session_create(m, &sp, &s, err, sizeof err) == ENGINE_OK, "%s", err);
    if (s) {
        engine_generate_params gp = engine_generate_default_params();
        gp.n_predict = 50;
        int32_t prompt[2] = {1, 403}, out[64];
        size_t n = 0;
        CHECK(engine_generate(s, prompt, 2, &gp, out, 64, &n, NULL) == ENGINE_OK && n == 50);
        engine_memory_report r;
        CHECK(engine_session_memory(s, &r) == ENGINE_OK);
        CHECK(r.device_budget == 40 * MiB);
        CHECK_MSG(r.device_peak <= r.device_budget && r.device_mapped <= r.device_budget,
                  "peak %llu mapped %llu budget %llu", (unsigned long long)r.device_peak,
                  (unsigned long long)r.device_mapped, (unsigned long long)r.device_budget);
        CHECK(r.device_total <= r.device_mapped && r.device_total >= r.kv_cache + r.activations);
        /* Measured from outside: the engine's share of the device (context
         * overhead aside, which is there before the model) is within budget. */
        uint64_t used = device_used() - before;
        CHECK_MSG(used <= 40 * MiB + 16 * MiB, "device memory grew by %llu MiB for a 40 MiB budget",
                  (unsigned long long)(used / MiB));
        engine_session_free(s);
    }
    engine_model_free(m);
}

static engine_model *load_budget(uint64_t budget)
{
    char path[1024], err[512] = "";
    test_src_path(path, sizeof path, "models/stories260K");
    engine_model_params mp = engine_model_default_params();
    mp.device = ENGINE_DEVICE_CUDA;
    mp.vram_budget = reserve_now() + budget; /* budget: the arena's */
    engine_model *m = NULL;
    CHECK_MSG(engine_model_load(path, &mp, &m, err, sizeof err) == ENGINE_OK, "%s", err);
    return m;
}

static engine_session *new_session(engine_model *m, int n_ctx, engine_status want, char *err, size_t err_size)
{
    engine_session_params sp = engine_session_default_params();
    sp.n_ctx = n_ctx;
    engine_session *s = NULL;
    err[0] = '\0';
    const engine_status st = engine_session_create(m, &sp, &s, err, err_size);
    CHECK_MSG(st == want, "session of %d positions: status %d (%s), want %d", n_ctx, (int)st, err, (int)want);
    return s;
}

static size_t greedy(engine_session *s, int32_t *out)
{
    engine_generate_params gp = engine_generate_default_params();
    gp.n_predict = 40;
    gp.sampling.temperature = 0.0f;
    int32_t prompt[2] = {1, 403};
    size_t n = 0;
    CHECK_MSG(engine_generate(s, prompt, 2, &gp, out, 64, &n, NULL) == ENGINE_OK, "%s", engine_session_last_error(s));
    return n;
}

/*
 * The budget exhausted while a session runs: more sessions are asked for
 * until one is refused (a clean error naming what holds the memory), the
 * running session goes on with the same output, and once the others are
 * freed the memory is there again.
 */
static void test_exhausted_mid_run(void)
{
    engine_model *m = load_budget(112 * MiB); /* the weights and about three sessions */
    if (!m)
        return;
    char err[512];
    engine_session *first = new_session(m, 256, ENGINE_OK, err, sizeof err);
    int32_t want[64], got[64];
    const size_t n_want = first ? greedy(first, want) : 0;
    engine_session *more[16] = {NULL};
    int n_more = 0;
    engine_status st = ENGINE_OK;
    while (n_more < 16) {
        engine_session_params sp = engine_session_default_params();
        sp.n_ctx = 256;
        err[0] = '\0';
        st = engine_session_create(m, &sp, &more[n_more], err, sizeof err);
        if (st != ENGINE_OK)
            break;
        n_more++;
    }
    CHECK_MSG(st == ENGINE_ERR_OVER_BUDGET && strstr(err, "budget") && strstr(err, "in use"),
              "after %d more sessions: status %d, %s", n_more, (int)st, err);
    CHECK_MSG(!strchr(err, '\n'), "the error is one line: %s", err);
    char refusal[512];
    snprintf(refusal, sizeof refusal, "%s", err);
    if (first) {
        engine_session_reset(first);
        const size_t n_got = greedy(first, got);
        CHECK_MSG(n_got == n_want && !memcmp(got, want, n_want * sizeof *want),
                  "the running session's output changed once the budget ran out");
    }
    for (int i = 0; i < n_more; i++)
        engine_session_free(more[i]);
    engine_session *again = new_session(m, 256, ENGINE_OK, err, sizeof err);
    if (again) {
        const size_t n_got = greedy(again, got);
        CHECK_MSG(n_got == n_want && !memcmp(got, want, n_want * sizeof *want), "a new session after the refusal");
    }
    printf("test_arena: budget exhausted after %d more sessions: refused cleanly (%s)\n", n_more, refusal);
    engine_session_free(again);
    engine_session_free(first);
    engine_model_free(m);
}

/*
 * ENGINE_GPU_CYCLES (default 1000) cycles of model load, session, a short
 * generation and free: the device memory the process holds does not grow.
 */
static void test_cycles(void)
{
    const char *v = getenv("ENGINE_GPU_CYCLES");
    const long cycles = v && *v ? strtol(v, NULL, 10) : 1000;
    const long warm = cycles / 10 > 0 ? cycles / 10 : 1;
    uint64_t base = 0, high = 0;
    for (long i = 0; i < cycles && !test_failures; i++) {
        if (i == warm)
            base = high = device_used();
        engine_model *m = load_budget(64 * MiB);
        char err[512];
        engine_session *s = m ? new_session(m, 128, ENGINE_OK, err, sizeof err) : NULL;
        int32_t out[64];
        if (s)
            greedy(s, out);
        engine_session_free(s);
        engine_model_free(m);
        if (i >= warm) {
            const uint64_t u = device_used();
            high = u > high ? u : high;
        }
    }
    printf("test_arena: %ld model/session cycles on the device: used %.1f MiB after warm-up, at most %.1f MiB\n",
           cycles, base / (double)MiB, high / (double)MiB);
    CHECK_MSG(high <= base + 2 * MiB, "device memory grew by %.1f MiB over %ld cycles", (high - base) / (double)MiB,
              cycles);
}

int main(void)
{
    int n = 0;
    cudaError_t ce = cudaGetDeviceCount(&n);
    if (ce != cudaSuccess || n == 0) {
        printf("test_arena: SKIP: no CUDA device (%s)\n", ce != cudaSuccess ? cudaGetErrorString(ce) : "none found");
        return 77;
    }
    cudaFree(NULL);
    test_arena_unit(false);
    test_arena_unit(true);
    test_engine_budget();
    test_exhausted_mid_run();
    test_cycles();
    return test_finish("test_arena");
}
