/*
 * fault_disk_full.c: a test-only preload library that makes the disk fill
 * up. With ENGINE_FAULT_DISK_BYTES=N in the environment, pwrite() accepts
 * N bytes in all, then writes what still fits and fails with ENOSPC, as a
 * full file system does. tools/quantize writes its shards with pwrite, so
 * test_quantize_cli.sh runs it under LD_PRELOAD to check that a full disk
 * gives one clean error and leaves nothing that looks complete.
 */
#define _GNU_SOURCE /* RTLD_NEXT */

#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <sys/types.h>
#include <unistd.h>

typedef ssize_t (*pwrite_fn)(int, const void *, size_t, off_t);

static long long room = -1; /* bytes the disk still takes; -1 until read from the environment */

static ssize_t limited(pwrite_fn real, int fd, const void *buf, size_t n, off_t off)
{
    if (room < 0) {
        const char *v = getenv("ENGINE_FAULT_DISK_BYTES");
        room = v && *v ? atoll(v) : (long long)1 << 62;
    }
    if (room == 0 && n > 0) {
        errno = ENOSPC;
        return -1;
    }
    if ((long long)n > room)
        n = (size_t)room;
    const ssize_t w = real(fd, buf, n, off);
    if (w > 0)
        room -= w;
    return w;
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off)
{
    static pwrite_fn real;
    if (!real)
        *(void **)&real = dlsym(RTLD_NEXT, "pwrite");
    return limited(real, fd, buf, n, off);
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off_t off)
{
    static pwrite_fn real;
    if (!real)
        *(void **)&real = dlsym(RTLD_NEXT, "pwrite64");
    return limited(real, fd, buf, n, off);
}
