/*
 * test_faults.c: the engine under faults it does not cause: a weights file
 * truncated after it was loaded (between calls, and in the middle of reading
 * it, in the main thread and in OpenMP workers), SIGBUS faults that are not
 * the engine's going to whoever handled them before, a prompt longer than
 * the context, and weights that make every logit NaN. Every case must end in an error status with a message,
 * never in a signal.
 */
#define _GNU_SOURCE

#include <errno.h>
#include <fcntl.h>
#include <omp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>
#include <math.h>

#include "engine.h"
#include "loaders/safetensors.h"
#include "test_util.h"

static char tmp_dir[] = "/tmp/engine_faults_XXXXXX";

static int copy_file(const char *from, const char *to)
{
    size_t n = 0;
    char *buf = test_read_file(from, &n);
    FILE *f = buf ? fopen(to, "wb") : NULL;
    int ok = f && fwrite(buf, 1, n, f) == n;
    if (f)
        ok &= fclose(f) == 0;
    free(buf);
    return ok ? 0 : -1;
}

/* A .safetensors file at path holding one U8 tensor "t" of n bytes, each 7. */
static int write_st(const char *path, size_t n)
{
    char header[128];
    int hl = snprintf(header, sizeof header, "{\"t\":{\"dtype\":\"U8\",\"shape\":[%zu],\"data_offsets\":[0,%zu]}}", n, n);
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    for (int i = 0; i < 8; i++)
        fputc((int)(((uint64_t)hl >> (8 * i)) & 255), f);
    fwrite(header, 1, (size_t)hl, f);
    for (size_t i = 0; i < n; i++)
        fputc(7, f);
    return fclose(f);
}

/* Sum of t's bytes, read the way a kernel does: straight from the mapping. */
static unsigned long sum_bytes(const st_tensor *t, int threads)
{
    const unsigned char *p = t->data;
    unsigned long sum = 0;
#pragma omp parallel for num_threads(threads) reduction(+ : sum)
    for (long i = 0; i < (long)t->nbytes; i++)
        sum += p[i];
    return sum;
}

/* A truncation between calls is refused before the next read. */
static void truncated_between_calls(void)
{
    char src[1024], dir[1200], path[1300], err[512];
    snprintf(dir, sizeof dir, "%s/model", tmp_dir);
    CHECK(mkdir(dir, 0700) == 0);
    static const char *const files[] = {"config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors"};
    for (size_t i = 0; i < 4; i++) {
        char rel[256];
        snprintf(rel, sizeof rel, "models/stories260K/%s", files[i]);
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        CHECK(copy_file(test_src_path(src, sizeof src, rel), path) == 0);
    }
    engine_model_params mp = engine_model_default_params();
    mp.device = ENGINE_DEVICE_CPU;
    mp.n_threads = 2;
    engine_model *m = NULL;
    engine_session *s = NULL;
    if (engine_model_load(dir, &mp, &m, err, sizeof err) != ENGINE_OK ||
        engine_session_create(m, NULL, &s, err, sizeof err) != ENGINE_OK) {
        CHECK_MSG(0, "%s", err);
        engine_model_free(m);
        return;
    }
    const int32_t prompt[] = {1, 403, 407, 261, 378};
    const float *logits = NULL;
    CHECK(engine_session_eval(s, prompt, 5, &logits) == ENGINE_OK && logits);

    /* Shrink the weights file under the loaded model, as a copy over it would. */
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK(truncate(path, 4096) == 0);
    const int32_t next = 260;
    CHECK(engine_session_eval(s, &next, 1, &logits) == ENGINE_ERR_IO && logits == NULL);
    const char *msg = engine_session_last_error(s);
    CHECK_MSG(strstr(msg, path) && strstr(msg, "truncated") && !strchr(msg, '\n'), "message: %s", msg);
    engine_generate_params gp = engine_generate_default_params();
    gp.n_predict = 4;
    size_t n_gen = 99;
    CHECK(engine_generate(s, prompt, 5, &gp, NULL, 0, &n_gen, NULL) == ENGINE_ERR_IO && n_gen == 0);
    engine_session_free(s);
    engine_model_free(m);
}

/* A truncation while the mapping is being read: the reads give zeros and the
 * set reports it afterwards, whichever thread was reading. */
static void truncated_while_reading(int threads)
{
    char path[256];
    snprintf(path, sizeof path, "%s/while_%d.safetensors", tmp_dir, threads);
    const size_t n = 1 << 20; /* 256 pages: the cut leaves most beyond the end */
    CHECK(write_st(path, n) == 0);
    st_set *set = NULL;
    err_buf e;
    err_clear(&e);
    CHECK_MSG(st_open(path, &set, &e) == ENGINE_OK, "%s", e.msg);
    if (!set)
        return;
    const st_tensor *t = st_find(set, "t");
    CHECK(t && sum_bytes(t, threads) == 7ul * n);
    CHECK(st_check(set, &e) == ENGINE_OK);
    CHECK(truncate(path, 8192) == 0);
    /* Reading past the new end would be SIGBUS; now it is zeros. */
    const unsigned long sum = sum_bytes(t, threads);
    CHECK_MSG(sum < 7ul * n, "sum %lu after truncation", sum);
    CHECK(st_check(set, &e) == ENGINE_ERR_IO);
    CHECK_MSG(strstr(e.msg, path) && strstr(e.msg, "truncated while in use"), "message: %s", e.msg);
    /* Even once the file has its size back, the zeros stay refused. */
    CHECK(write_st(path, n) == 0);
    CHECK(st_check(set, &e) == ENGINE_ERR_IO);
    st_close(set);
}

/* In a child: map a file outside the engine, shrink it, read past the end. */
static void foreign_sigbus(void)
{
    char path[256];
    snprintf(path, sizeof path, "%s/foreign.%d", tmp_dir, (int)getpid());
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || ftruncate(fd, 65536) != 0)
        _exit(3);
    volatile const char *p = mmap(NULL, 65536, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED || ftruncate(fd, 0) != 0)
        _exit(4);
    (void)p[40000];
    _exit(5); /* not reached: SIGBUS */
}

static void exit_42(int sig, siginfo_t *si, void *uc)
{
    (void)sig;
    (void)si;
    (void)uc;
    _exit(42);
}

static int run_child(void (*fn)(int), int arg)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        fn(arg);
        _exit(0);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid)
        return -1;
    return status;
}

/* Child: the guard installed (by opening a file) after `own_handler` or
 * not; a guarded fault is survived, then a foreign one must reach the
 * previous disposition. */
static void child_chain(int own_handler)
{
    test_failures = 0; /* the parent's count came along with fork() */
    /* The disposition before the guard: the default (set explicitly, since
     * a sanitizer runtime may have installed its own), or a handler. */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    if (own_handler) {
        sa.sa_sigaction = exit_42;
        sa.sa_flags = SA_SIGINFO;
    } else {
        sa.sa_handler = SIG_DFL;
    }
    sigaction(SIGBUS, &sa, NULL);
    truncated_while_reading(1);
    if (test_failures)
        _exit(6);
    foreign_sigbus();
}

static int count_calls(int32_t id, const char *text, size_t len, void *user)
{
    (void)text;
    (void)len;
    if (id < 0)
        ++*(int *)user; /* only a flush may pass -1, and no text is pending here */
    return 0;
}

/* Weights holding NaN (found by fuzz_model): sampling from all-NaN logits
 * read before the sampler's buffer; now generation stops with an error. */
static void nan_weights(void)
{
    char src[1024], dir[1200], path[1300], err[512];
    snprintf(dir, sizeof dir, "%s/nan", tmp_dir);
    CHECK(mkdir(dir, 0700) == 0);
    static const char *const files[] = {"config.json", "model.safetensors"};
    for (size_t i = 0; i < 2; i++) {
        char rel[256];
        snprintf(rel, sizeof rel, "models/stories260K/%s", files[i]);
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        CHECK(copy_file(test_src_path(src, sizeof src, rel), path) == 0);
    }
    /* model.norm.weight := NaN, so that every logit is NaN. */
    size_t n = 0;
    char *bytes = test_read_file(path, &n);
    uint64_t hl = 0;
    for (int i = 7; bytes && i >= 0; i--)
        hl = hl << 8 | (unsigned char)bytes[i];
    json_t *h = bytes ? json_loadb(bytes + 8, (size_t)hl, 0, NULL) : NULL;
    const json_t *off = json_object_get(json_object_get(h, "model.norm.weight"), "data_offsets");
    const uint64_t begin = (uint64_t)json_integer_value(json_array_get(off, 0));
    const uint64_t end = (uint64_t)json_integer_value(json_array_get(off, 1));
    CHECK(h && end > begin && 8 + hl + end <= n);
    const float qnan = NAN;
    for (uint64_t at = 8 + hl + begin; h && at + 4 <= 8 + hl + end; at += 4)
        memcpy(bytes + at, &qnan, 4);
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(bytes, 1, n, f) == n && fclose(f) == 0);
    json_decref(h);
    free(bytes);

    engine_model_params mp = engine_model_default_params();
    mp.device = ENGINE_DEVICE_CPU;
    engine_model *m = NULL;
    engine_session *s = NULL;
    if (engine_model_load(dir, &mp, &m, err, sizeof err) || engine_session_create(m, NULL, &s, err, sizeof err)) {
        CHECK_MSG(0, "%s", err);
        engine_model_free(m);
        return;
    }
    const int32_t prompt[] = {1, 403, 407};
    engine_generate_params gp = engine_generate_default_params();
    gp.n_predict = 8;
    gp.sampling.temperature = 0.8f;
    int minus_one = 0;
    gp.on_token = count_calls;
    gp.user = &minus_one;
    int32_t out[8];
    size_t n_gen = 99;
    CHECK(engine_generate(s, prompt, 3, &gp, out, 8, &n_gen, NULL) == ENGINE_ERR_FORMAT);
    CHECK(n_gen == 0 && minus_one == 0);
    CHECK_MSG(strstr(engine_session_last_error(s), "NaN") != NULL, "%s", engine_session_last_error(s));
    engine_session_free(s);
    engine_model_free(m);
}

static void prompt_longer_than_context(void)
{
    char path[1024], err[512];
    engine_model_params mp = engine_model_default_params();
    mp.device = ENGINE_DEVICE_CPU;
    engine_model *m = NULL;
    engine_session *s = NULL;
    engine_session_params sp = engine_session_default_params();
    sp.n_ctx = 4;
    if (engine_model_load(test_src_path(path, sizeof path, "models/stories260K"), &mp, &m, err, sizeof err) ||
        engine_session_create(m, &sp, &s, err, sizeof err)) {
        CHECK_MSG(0, "%s", err);
        engine_model_free(m);
        return;
    }
    const int32_t prompt[] = {1, 403, 407, 261, 378};
    size_t n_gen = 99;
    CHECK(engine_generate(s, prompt, 5, NULL, NULL, 0, &n_gen, NULL) == ENGINE_ERR_CONTEXT_FULL && n_gen == 0);
    CHECK(engine_session_n_past(s) == 0); /* nothing was evaluated */
    CHECK(strstr(engine_session_last_error(s), "context") != NULL);
    /* What fits still runs. */
    CHECK(engine_generate(s, prompt, 4, NULL, NULL, 0, &n_gen, NULL) == ENGINE_OK && n_gen == 1);
    engine_session_free(s);
    engine_model_free(m);
}

int main(void)
{
    if (!mkdtemp(tmp_dir)) {
        perror("mkdtemp");
        return 1;
    }
    /* First, in fresh children (before this process installs the guard):
     * without a handler of its own a foreign SIGBUS still kills; with one,
     * that handler is called. */
    int st = run_child(child_chain, 0);
    CHECK_MSG(WIFSIGNALED(st) && WTERMSIG(st) == SIGBUS, "child status %#x", st);
    st = run_child(child_chain, 1);
    CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 42, "child status %#x", st);

    truncated_while_reading(1);
    truncated_while_reading(4);
    truncated_between_calls();
    prompt_longer_than_context();
    nan_weights();

    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
    CHECK(system(cmd) == 0);
    return test_finish("test_faults");
}
