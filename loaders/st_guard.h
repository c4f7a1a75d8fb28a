/*
 * st_guard.h: surviving a mapped file that shrinks under the engine.
 *
 * Reading a page of a MAP_SHARED mapping that now lies past the end of its
 * file raises SIGBUS, which by default kills the process. safetensors.c
 * registers each mapping here; a SIGBUS inside a registered mapping then
 * replaces the whole mapping with zero pages (the faulting read resumes and
 * reads zeros, in whichever thread it happened, OpenMP workers included)
 * and sets the mapping's flag, which st_check() turns into an error once
 * the computation returns. A SIGBUS anywhere else goes to the handler that
 * was installed before this one (or the default action), as if this one
 * did not exist. See docs/DESIGN.md for why this design.
 */
#ifndef ENGINE_ST_GUARD_H
#define ENGINE_ST_GUARD_H

#include <stdatomic.h>
#include <stddef.h>

/*
 * Guard [base, base + len). *faulted becomes 1 when a read past the file's
 * end was turned into zeros; it must stay valid until st_guard_remove().
 * Returns a slot for st_guard_remove(), or -1 when the mapping could not be
 * guarded (table full, or the handler could not be installed): it then
 * works as before, only without the protection.
 */
int st_guard_add(void *base, size_t len, atomic_int *faulted);
/* Forget a slot (-1 is a no-op); call before unmapping. */
void st_guard_remove(int slot);

#endif
