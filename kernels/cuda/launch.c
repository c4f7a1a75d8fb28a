/*
 * launch.c: error reporting shared by the CUDA launchers: a failure leaves
 * one line in the context and returns -1, so the engine can name the op.
 */
#include <stdarg.h>
#include <stdio.h>

#include "../kernels_cuda.h"

int launch_fail(launch_ctx *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
    return -1;
}

int launch_check(launch_ctx *c, const char *op)
{
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return launch_fail(c, "%s: %s", op, cudaGetErrorString(e));
    return 0;
}
