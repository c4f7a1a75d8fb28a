/* error.c: formatting of internal one-line error messages. */
#include "error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

engine_status err_set(err_buf *e, engine_status code, const char *fmt, ...)
{
    if (!e)
        return code;
    e->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    /* Messages are one line: fold any newline a file name or token brought in. */
    for (char *p = e->msg; *p; p++)
        if (*p == '\n' || *p == '\r')
            *p = ' ';
    return code;
}

void err_clear(err_buf *e)
{
    if (!e)
        return;
    e->code = ENGINE_OK;
    e->msg[0] = '\0';
}

void err_copy_out(const err_buf *e, char *dst, size_t dst_size)
{
    if (!dst || dst_size == 0)
        return;
    snprintf(dst, dst_size, "%s", e ? e->msg : "");
}
