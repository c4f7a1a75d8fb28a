/* quant_cpu.h: what matmul.c needs from matmul_quant.c (the quantized
 * weight types' element access and product). */
#ifndef ENGINE_CPU_QUANT_H
#define ENGINE_CPU_QUANT_H

#include "../kernels.h"

/* Element i (row-major) of a K_I8/K_NF4/K_FP4 weight. */
float k_quant_get(const k_weight *w, size_t i);

/* y[n, w.rows] = x[n, w.cols] . w^T for a quantized w (no bias). */
void k_matmul_quant(const k_ctx *c, float *y, const float *x, int n, const k_weight *w);

#endif
