/*
 * test_util.h: the few helpers every test executable shares: CHECK macros
 * that count failures instead of stopping, and paths to the test data.
 */
#ifndef ENGINE_TEST_UTIL_H
#define ENGINE_TEST_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int test_failures;

#define CHECK(cond)                                                                 \
    do {                                                                            \
        if (!(cond)) {                                                              \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            test_failures++;                                                        \
        }                                                                           \
    } while (0)

#define CHECK_MSG(cond, ...)                                                \
    do {                                                                    \
        if (!(cond)) {                                                      \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                   \
            fputc('\n', stderr);                                            \
            test_failures++;                                                \
        }                                                                   \
    } while (0)

/* Index of the largest of l[n], the lowest among equals (as greedy decoding picks). */
static inline int32_t argmax(const float *l, int n)
{
    int32_t b = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[b])
            b = i;
    return b;
}

/* Exit status for main(): prints a summary line. */
static inline int test_finish(const char *name)
{
    if (test_failures)
        fprintf(stderr, "%s: %d check(s) failed\n", name, test_failures);
    else
        printf("%s: all checks passed\n", name);
    return test_failures ? 1 : 0;
}

/* Path under the repository root (ENGINE_SOURCE_DIR), in a static buffer per call site. */
static inline const char *test_src_path(char *buf, size_t n, const char *rel)
{
    const char *root = getenv("ENGINE_SOURCE_DIR");
    snprintf(buf, n, "%s/%s", root ? root : ".", rel);
    return buf;
}

/* Path under the unpacked test data (ENGINE_TEST_DATA, i.e. build/tests/data). */
static inline const char *test_data_path(char *buf, size_t n, const char *rel)
{
    const char *root = getenv("ENGINE_TEST_DATA");
    snprintf(buf, n, "%s/%s", root ? root : "tests/data", rel);
    return buf;
}

/* Whole file into a malloc'd NUL-terminated buffer; NULL on failure. */
static inline char *test_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = '\0';
        if (len)
            *len = (size_t)n;
    }
    return buf;
}

#endif
