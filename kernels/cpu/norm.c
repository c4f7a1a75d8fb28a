/* norm.c: RMSNorm over rows (model norms, and per-head q/k norms where a
 * "row" is one head). Sums in double: the reference computes in float64. */
#include <math.h>

#include "../kernels.h"

void k_rmsnorm(const k_ctx *c, float *y, const float *x, int n, int dim, const k_weight *weight, float eps)
{
    k_rmsnorm_ex(c, y, x, n, dim, weight, eps, 0.0f);
}

void k_rmsnorm_ex(const k_ctx *c, float *y, const float *x, int n, int dim, const k_weight *weight, float eps,
                  float offset)
{
#pragma omp parallel for num_threads(c->n_threads) schedule(static) if ((size_t)n * dim >= K_PARALLEL_MIN_WORK)
    for (int t = 0; t < n; t++) {
        const float *xr = x + (size_t)t * dim;
        float *yr = y + (size_t)t * dim;
        double ss = 0.0;
        for (int i = 0; i < dim; i++)
            ss += (double)xr[i] * xr[i];
        float inv = (float)(1.0 / sqrt(ss / dim + eps));
        for (int i = 0; i < dim; i++)
            yr[i] = xr[i] * inv * (offset + k_weight_get(weight, (size_t)i));
    }
}
