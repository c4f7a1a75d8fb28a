/* attention.c: causal grouped-query attention of new tokens against the KV
 * cache. One (token, head) pair per work item; scores live in the calling
 * thread's slice of the session scratch, so nothing is allocated here. */
#include <math.h>
#include <omp.h>

#include "../kernels.h"

void k_attention(const k_ctx *c, float *out, const float *q, const float *k_cache, const float *v_cache,
                 int n, int pos0, int n_heads, int n_kv_heads, int head_dim, int window)
{
    const int group = n_heads / n_kv_heads;
    const size_t kv_stride = (size_t)n_kv_heads * head_dim; /* one position */
    const float scale = 1.0f / sqrtf((float)head_dim);
    const int items = n * n_heads;

#pragma omp parallel for num_threads(c->n_threads) schedule(dynamic, 1) \
    if ((double)items * (pos0 + n) * head_dim >= K_PARALLEL_MIN_WORK)
    for (int it = 0; it < items; it++) {
        const int t = it / n_heads, h = it % n_heads, kvh = h / group;
        const int pos = pos0 + t;
        const int first = (window > 0 && pos + 1 > window) ? pos + 1 - window : 0;
        float *score = c->scratch + (size_t)omp_get_thread_num() * c->scratch_per_thread;
        const float *qv = q + ((size_t)t * n_heads + h) * head_dim;
        float mx = -INFINITY;
        for (int p = first; p <= pos; p++) {
            const float *kv = k_cache + (size_t)p * kv_stride + (size_t)kvh * head_dim;
            float s = 0.0f;
#pragma omp simd reduction(+ : s)
            for (int i = 0; i < head_dim; i++)
                s += qv[i] * kv[i];
            s *= scale;
            score[p] = s;
            if (s > mx)
                mx = s;
        }
        double sum = 0.0;
        for (int p = first; p <= pos; p++) {
            score[p] = expf(score[p] - mx);
            sum += score[p];
        }
        const float inv = (float)(1.0 / sum);
        float *o = out + ((size_t)t * n_heads + h) * head_dim;
        for (int i = 0; i < head_dim; i++)
            o[i] = 0.0f;
        for (int p = first; p <= pos; p++) {
            const float *vv = v_cache + (size_t)p * kv_stride + (size_t)kvh * head_dim;
            const float w = score[p] * inv;
#pragma omp simd
            for (int i = 0; i < head_dim; i++)
                o[i] += w * vv[i];
        }
    }
}
