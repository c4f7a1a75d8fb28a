/*
 * test_endurance.c: the engine used for a long time, through libengine only.
 *
 *  1. ENGINE_ENDURANCE_CYCLES (default 1000) cycles of model load, session
 *     create, a prompt and a few generated tokens, session and model free:
 *     open files, mappings and resident memory must not grow (and under
 *     LeakSanitizer nothing may leak).
 *  2. One generation of ENGINE_ENDURANCE_TOKENS (default 10,000) tokens in
 *     a context of that size, run until the context is full: resident
 *     memory may grow only by the session's preallocated block (its KV
 *     pages are touched as positions fill), never beyond.
 *  3. ENGINE_ENDURANCE_FILLS (default 20) generations filling the model's
 *     whole context (512), alternately in a fresh session and a reset one:
 *     resident memory stays where the first fills left it.
 */
#define _POSIX_C_SOURCE 200809L

#include <dirent.h>

#include "engine.h"
#include "test_util.h"

#define MIB (1024.0 * 1024.0)

/* AddressSanitizer keeps freed blocks in quarantine (up to 256 MiB), so
 * resident memory there measures allocation churn, not leaks; LeakSanitizer
 * checks leaks instead, and the RSS bounds apply to the plain build. */
#if defined(__SANITIZE_ADDRESS__)
#define RSS_MEANINGFUL 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RSS_MEANINGFUL 0
#endif
#endif
#ifndef RSS_MEANINGFUL
#define RSS_MEANINGFUL 1
#endif

static long env_long(const char *name, long def)
{
    const char *v = getenv(name);
    return v && *v ? strtol(v, NULL, 10) : def;
}

/* Resident set size from /proc/self/status, in bytes; -1 if unknown. */
static long long rss_bytes(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %lld kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb < 0 ? -1 : kb * 1024;
}

/* Entries of a /proc/self folder or lines of a /proc/self file. */
static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    while (d && readdir(d))
        n++;
    if (d)
        closedir(d);
    return n;
}

static int count_maps(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    int n = 0, c;
    while (f && (c = fgetc(f)) != EOF)
        n += c == '\n';
    if (f)
        fclose(f);
    return n;
}

static const char *model_path(void)
{
    static char path[1024];
    return test_src_path(path, sizeof path, "models/stories260K");
}

static engine_model *load(int threads)
{
    engine_model_params mp = engine_model_default_params();
    mp.device = ENGINE_DEVICE_CPU;
    mp.n_threads = threads;
    engine_model *m = NULL;
    char err[512];
    if (engine_model_load(model_path(), &mp, &m, err, sizeof err) != ENGINE_OK)
        CHECK_MSG(0, "%s", err);
    return m;
}

static const int32_t PROMPT[] = {1, 403, 407, 261, 378}; /* <s> Once upon a time */

static void create_free_cycles(long cycles)
{
    const int fds0 = count_fds();
    int maps0 = 0;
    long long rss0 = 0;
    const long warm = cycles / 10 > 0 ? cycles / 10 : 1; /* allocator pools settle first */
    for (long i = 0; i < cycles && !test_failures; i++) {
        if (i == warm) {
            maps0 = count_maps();
            rss0 = rss_bytes();
        }
        engine_model *m = load(2);
        engine_session *s = NULL;
        engine_session_params sp = engine_session_default_params();
        sp.n_ctx = 64;
        char err[512];
        if (!m || engine_session_create(m, &sp, &s, err, sizeof err) != ENGINE_OK) {
            CHECK_MSG(0, "cycle %ld: %s", i, m ? err : "load failed");
            engine_model_free(m);
            break;
        }
        engine_generate_params gp = engine_generate_default_params();
        gp.n_predict = 4;
        size_t n = 0;
        int32_t out[4];
        CHECK(engine_generate(s, PROMPT, 5, &gp, out, 4, &n, NULL) == ENGINE_OK && n == 4);
        engine_session_free(s);
        engine_model_free(m);
    }
    const int fds = count_fds(), maps = count_maps();
    const long long rss = rss_bytes();
    printf("%ld create/free cycles: fds %d -> %d, mappings %d -> %d, RSS %.1f -> %.1f MiB\n", cycles, fds0, fds,
           maps0, maps, rss0 / MIB, rss / MIB);
    CHECK_MSG(fds == fds0, "open files went from %d to %d", fds0, fds);
    if (cycles > warm && RSS_MEANINGFUL) {
        CHECK_MSG(maps <= maps0 + 2, "mappings went from %d to %d", maps0, maps);
        CHECK_MSG(rss - rss0 < 2 * 1024 * 1024, "RSS grew by %.2f MiB", (rss - rss0) / MIB);
    }
}

typedef struct rss_watch {
    long long lo, hi; /* over the samples */
    size_t n_tokens;
} rss_watch;

static int watch_token(int32_t id, const char *text, size_t len, void *user)
{
    rss_watch *w = user;
    if (id >= 0 && ++w->n_tokens % 500 == 0) {
        const long long r = rss_bytes();
        w->lo = w->lo && w->lo < r ? w->lo : r;
        w->hi = w->hi > r ? w->hi : r;
    }
    return 0;
}

static void long_generation(engine_model *m, int n_tokens)
{
    engine_session *s = NULL;
    engine_session_params sp = engine_session_default_params();
    sp.n_ctx = n_tokens;
    char err[512];
    if (engine_session_create(m, &sp, &s, err, sizeof err) != ENGINE_OK) {
        CHECK_MSG(0, "%s", err);
        return;
    }
    engine_memory_report mem;
    engine_session_memory(s, &mem);
    const long long before = rss_bytes();
    rss_watch w = {0, 0, 0};
    engine_generate_params gp = engine_generate_default_params();
    gp.n_predict = n_tokens + 1; /* the context, not the count, ends it */
    gp.on_token = watch_token;
    gp.user = &w;
    engine_generate_stats stats;
    size_t n = 0;
    CHECK(engine_generate(s, PROMPT, 1, &gp, NULL, 0, &n, &stats) == ENGINE_OK);
    /* The context holds the prompt and every generated token but the last. */
    CHECK_MSG(stats.stop == ENGINE_STOP_CONTEXT && n == (size_t)n_tokens && engine_session_n_past(s) == n_tokens,
              "stop %d after %zu tokens, %d in context", (int)stats.stop, n, engine_session_n_past(s));
    const long long after = rss_bytes();
    printf("%d tokens at full context in %.1f s: RSS %.1f MiB before, %.1f..%.1f during, %.1f after; session block "
           "%.1f MiB\n", n_tokens, stats.gen_seconds, before / MIB, w.lo / MIB, w.hi / MIB, after / MIB,
           mem.host_total / MIB);
    /* Growth is the preallocated block being touched, nothing more. */
    const long long slack = 4 * 1024 * 1024;
    const long long grew = (w.hi > after ? w.hi : after) - before;
    CHECK_MSG(!RSS_MEANINGFUL || grew <= (long long)mem.host_total + slack,
              "RSS grew by %.1f MiB, more than the session's %.1f MiB block", grew / MIB,
              mem.host_total / MIB);
    engine_session_free(s);
}

static void repeated_fills(engine_model *m, int fills)
{
    engine_model_info info;
    engine_model_get_info(m, &info);
    engine_session *s = NULL;
    long long first = 0, last = 0;
    size_t total = 0;
    char err[512];
    for (int i = 0; i < fills && !test_failures; i++) {
        if (i % 2 == 0) { /* a fresh session, else the previous one reset */
            engine_session_free(s);
            s = NULL;
            engine_session_params sp = engine_session_default_params();
            sp.n_ctx = info.max_context;
            if (engine_session_create(m, &sp, &s, err, sizeof err) != ENGINE_OK) {
                CHECK_MSG(0, "%s", err);
                break;
            }
        } else {
            engine_session_reset(s);
        }
        engine_generate_params gp = engine_generate_default_params();
        gp.n_predict = info.max_context + 1;
        engine_generate_stats stats;
        size_t n = 0;
        CHECK(engine_generate(s, PROMPT, 5, &gp, NULL, 0, &n, &stats) == ENGINE_OK);
        CHECK(stats.stop == ENGINE_STOP_CONTEXT && engine_session_n_past(s) == info.max_context);
        total += n;
        if (i == 1)
            first = rss_bytes();
        last = rss_bytes();
    }
    engine_session_free(s);
    printf("%d fills of %d tokens (%zu generated): RSS %.1f -> %.1f MiB\n", fills, info.max_context, total,
           first / MIB, last / MIB);
    CHECK_MSG(!RSS_MEANINGFUL || last - first < 1024 * 1024, "RSS grew by %.2f MiB over the fills", (last - first) / MIB);
}

int main(void)
{
    create_free_cycles(env_long("ENGINE_ENDURANCE_CYCLES", 1000));
    /* One thread: a model this small gains nothing from more, and a busy
     * machine makes OpenMP barriers slow. */
    engine_model *m = load(1);
    if (m) {
        long_generation(m, (int)env_long("ENGINE_ENDURANCE_TOKENS", 10000));
        repeated_fills(m, (int)env_long("ENGINE_ENDURANCE_FILLS", 20));
    }
    engine_model_free(m);
    return test_finish("test_endurance");
}
