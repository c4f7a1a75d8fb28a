/*
 * st_guard.c: the SIGBUS guard over safetensors mappings (see st_guard.h).
 *
 * This file holds the library's only process-wide state, because a signal
 * disposition is process-wide by nature: the handler is installed once, the
 * first time a file is mapped, and never removed (removing it could undo a
 * handler someone installed after it). The handler may run in any thread at
 * any moment, so the table of guarded ranges is a fixed array of slots
 * claimed and released with atomics; the handler takes no lock and calls
 * only mmap, sigaction and raise-free code.
 */
#define _GNU_SOURCE /* MAP_ANONYMOUS under -std=c11 */

#include "st_guard.h"

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

/* Mapped files at once; past this, further files go unguarded. */
#define ST_GUARD_SLOTS 256

enum { SLOT_FREE = 0, SLOT_BUSY, SLOT_LIVE };

typedef struct st_guard_slot {
    atomic_int state; /* FREE -> BUSY (being filled or emptied) -> LIVE */
    uintptr_t begin, end;
    atomic_int *faulted;
} st_guard_slot;

static st_guard_slot slots[ST_GUARD_SLOTS];
static struct sigaction previous; /* what SIGBUS did before the guard */
static pthread_once_t install_once = PTHREAD_ONCE_INIT;
static atomic_int installed;

/* Hand a fault that is not ours to whoever had SIGBUS before. */
static void chain(int sig, siginfo_t *si, void *uc)
{
    if (previous.sa_flags & SA_SIGINFO) {
        previous.sa_sigaction(sig, si, uc);
        return;
    }
    if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
        previous.sa_handler(sig);
        return;
    }
    /* The default action (a synchronous SIGBUS cannot be ignored): restore
     * it and return, so that the faulting read runs again and the kernel
     * delivers the signal as if no handler had been there. */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGBUS, &dfl, NULL);
}

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
    const uintptr_t a = (uintptr_t)si->si_addr;
    for (int i = 0; i < ST_GUARD_SLOTS; i++) {
        st_guard_slot *s = &slots[i];
        if (atomic_load_explicit(&s->state, memory_order_acquire) != SLOT_LIVE || a < s->begin || a >= s->end)
            continue;
        /* The whole mapping, not only the page: one fault per file instead
         * of one per page of a file that may be gigabytes. The data is
         * garbage from here on anyway; st_check() refuses the model. */
        void *p = mmap((void *)s->begin, s->end - s->begin, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
        if (p == MAP_FAILED)
            break;
        atomic_store(s->faulted, 1);
        return;
    }
    chain(sig, si, uc);
}

static void install(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGBUS, &sa, &previous) == 0)
        atomic_store(&installed, 1);
}

int st_guard_add(void *base, size_t len, atomic_int *faulted)
{
    pthread_once(&install_once, install);
    if (!atomic_load(&installed))
        return -1;
    for (int i = 0; i < ST_GUARD_SLOTS; i++) {
        int expect = SLOT_FREE;
        if (!atomic_compare_exchange_strong(&slots[i].state, &expect, SLOT_BUSY))
            continue;
        slots[i].begin = (uintptr_t)base;
        slots[i].end = (uintptr_t)base + len;
        slots[i].faulted = faulted;
        atomic_store_explicit(&slots[i].state, SLOT_LIVE, memory_order_release);
        return i;
    }
    return -1;
}

void st_guard_remove(int slot)
{
    if (slot >= 0 && slot < ST_GUARD_SLOTS)
        atomic_store(&slots[slot].state, SLOT_FREE);
}
