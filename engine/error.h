/*
 * error.h: the one-line error message every internal layer fills in.
 * An error carries the status it returns and a message that names the file
 * (or object) and the problem, e.g. "model.safetensors: header length 9000
 * exceeds file size 512". The public API copies it to the caller.
 */
#ifndef ENGINE_ERROR_H
#define ENGINE_ERROR_H

#include "engine.h"

#define ERR_MSG_MAX 512

typedef struct err_buf {
    engine_status code;
    char msg[ERR_MSG_MAX];
} err_buf;

/* Record code and a printf-style message in e (may be NULL); returns code. */
engine_status err_set(err_buf *e, engine_status code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Clear e (may be NULL). */
void err_clear(err_buf *e);

/* Copy e's message into a caller buffer (either may be NULL/0). */
void err_copy_out(const err_buf *e, char *dst, size_t dst_size);

#endif
