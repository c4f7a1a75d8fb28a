/*
 * fuzz_util.h: what the fuzz targets share. The loaders read files by path
 * (that is the interface under test, mmap included), so each input is
 * written to an anonymous in-memory file (memfd) and handed over as
 * /proc/self/fd/N: no disk traffic, nothing left behind.
 */
#ifndef ENGINE_FUZZ_UTIL_H
#define ENGINE_FUZZ_UTIL_H

#define _GNU_SOURCE /* memfd_create */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

typedef struct fuzz_file {
    int fd;
    char path[64];
} fuzz_file;

/* Creates the file on first use; aborts (this is a test harness) when the
 * system refuses, since no input could be tried then. */
static inline const char *fuzz_file_write(fuzz_file *f, const uint8_t *data, size_t size)
{
    if (f->fd <= 0) {
        f->fd = memfd_create("fuzz-input", MFD_CLOEXEC);
        if (f->fd < 0) {
            perror("memfd_create");
            abort();
        }
        snprintf(f->path, sizeof f->path, "/proc/self/fd/%d", f->fd);
    }
    if (ftruncate(f->fd, 0) != 0 || (size && pwrite(f->fd, data, size, 0) != (ssize_t)size)) {
        perror("fuzz input file");
        abort();
    }
    return f->path;
}

/* A crash that libFuzzer records, for properties the sanitizers cannot see. */
#define FUZZ_ASSERT(cond)                                                              \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            fprintf(stderr, "%s:%d: property violated: %s\n", __FILE__, __LINE__, #cond); \
            abort();                                                                   \
        }                                                                              \
    } while (0)

#endif
