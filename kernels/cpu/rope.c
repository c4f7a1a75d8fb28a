/* rope.c: rotary position embedding, rotate-half layout (transformers'
 * Llama/Qwen/Mistral convention: element i pairs with i + head_dim/2). */
#include "../kernels.h"

void k_rope(const k_ctx *c, float *x, int n, int n_heads, int head_dim, const int *pos,
            const float *cos_table, const float *sin_table)
{
    k_rope_ex(c, x, n, n_heads, head_dim, head_dim, pos, cos_table, sin_table);
}

void k_rope_ex(const k_ctx *c, float *x, int n, int n_heads, int head_dim, int rot_dim, const int *pos,
               const float *cos_table, const float *sin_table)
{
    const int half = rot_dim / 2;
#pragma omp parallel for num_threads(c->n_threads) schedule(static) if ((size_t)n * n_heads * head_dim >= K_PARALLEL_MIN_WORK)
    for (int t = 0; t < n; t++) {
        const float *cs = cos_table + (size_t)pos[t] * half;
        const float *sn = sin_table + (size_t)pos[t] * half;
        for (int h = 0; h < n_heads; h++) {
            float *v = x + ((size_t)t * n_heads + h) * head_dim;
            for (int i = 0; i < half; i++) {
                float a = v[i], b = v[i + half];
                v[i] = a * cs[i] - b * sn[i];
                v[i + half] = b * cs[i] + a * sn[i];
            }
        }
    }
}
