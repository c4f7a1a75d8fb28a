/* elementwise.c: the small per-element ops (SwiGLU, GeGLU, soft-capping,
 * residual add, scaling)
 * and the embedding lookup. */
#include <math.h>

#include "../kernels.h"

void k_swiglu(const k_ctx *c, float *gate, const float *up, size_t n)
{
#pragma omp parallel for num_threads(c->n_threads) schedule(static) if (n >= K_PARALLEL_MIN_WORK)
    for (size_t i = 0; i < n; i++) {
        float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

void k_geglu(const k_ctx *c, float *gate, const float *up, size_t n)
{
    /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as torch's gelu(approximate="tanh") */
    const float k0 = 0.7978845608028654f, k1 = 0.044715f;
#pragma omp parallel for simd num_threads(c->n_threads) schedule(static) if (n >= K_PARALLEL_MIN_WORK)
    for (size_t i = 0; i < n; i++) {
        const float x = gate[i];
        gate[i] = 0.5f * x * (1.0f + tanhf(k0 * (x + k1 * x * x * x))) * up[i];
    }
}

void k_softcap(const k_ctx *c, float *y, float cap, size_t n)
{
#pragma omp parallel for simd num_threads(c->n_threads) schedule(static) if (n >= K_PARALLEL_MIN_WORK)
    for (size_t i = 0; i < n; i++)
        y[i] = cap * tanhf(y[i] / cap);
}

void k_add(const k_ctx *c, float *y, const float *x, size_t n)
{
#pragma omp parallel for simd num_threads(c->n_threads) schedule(static) if (n >= K_PARALLEL_MIN_WORK)
    for (size_t i = 0; i < n; i++)
        y[i] += x[i];
}

void k_scale(const k_ctx *c, float *y, float a, size_t n)
{
#pragma omp parallel for simd num_threads(c->n_threads) schedule(static) if (n >= K_PARALLEL_MIN_WORK)
    for (size_t i = 0; i < n; i++)
        y[i] *= a;
}

void k_embed(const k_ctx *c, float *y, const k_weight *emb, const int32_t *ids, int n)
{
    const int dim = emb->cols;
    for (int t = 0; t < n; t++) {
        size_t base = (size_t)ids[t] * dim;
        for (int i = 0; i < dim; i++)
            y[(size_t)t * dim + i] = k_weight_get(emb, base + i);
    }
}
