/*
 * test_sampler.c: the sampler's filters and its randomness, through the
 * public API: greedy is argmax, seeds reproduce, sampled frequencies follow
 * the filtered softmax, and each filter removes what it should.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "engine/model.h"
#include "test_util.h"

#define V 8
static const float LOGITS[V] = {1.0f, 3.0f, 2.5f, -1.0f, 0.5f, 2.9f, -4.0f, 0.0f};

static engine_sampler *make(float temp, int top_k, float top_p, float min_p, float rep, uint64_t seed)
{
    engine_sampler_params p = engine_sampler_default_params();
    p.temperature = temp;
    p.top_k = top_k;
    p.top_p = top_p;
    p.min_p = min_p;
    p.repeat_penalty = rep;
    p.seed = seed;
    engine_sampler *s = NULL;
    CHECK(engine_sampler_create(&p, &s) == ENGINE_OK);
    return s;
}

/* Frequencies of n draws. */
static void draw(engine_sampler *s, int n, double *freq)
{
    int count[V] = {0};
    for (int i = 0; i < n; i++) {
        int32_t id = engine_sampler_sample(s, LOGITS, V, NULL, 0);
        CHECK(id >= 0 && id < V);
        if (id >= 0 && id < V)
            count[id]++;
    }
    for (int i = 0; i < V; i++)
        freq[i] = (double)count[i] / n;
}

static void softmax(const float *l, const int *keep, double temp, double *p)
{
    double mx = -1e300, sum = 0;
    for (int i = 0; i < V; i++)
        if (keep[i])
            mx = fmax(mx, l[i] / temp);
    for (int i = 0; i < V; i++)
        sum += p[i] = keep[i] ? exp(l[i] / temp - mx) : 0.0;
    for (int i = 0; i < V; i++)
        p[i] /= sum;
}

static void expect_freq(const char *what, const double *freq, const double *p, int n)
{
    for (int i = 0; i < V; i++) {
        double sd = sqrt(p[i] * (1 - p[i]) / n) + 1e-12;
        CHECK_MSG(fabs(freq[i] - p[i]) < 5 * sd + 1e-9, "%s: token %d frequency %.4f, expected %.4f", what, i, freq[i],
                  p[i]);
    }
}

int main(void)
{
    const int N = 200000;
    double freq[V], p[V];

    /* Greedy: argmax, whatever the seed. */
    engine_sampler *s = make(0.0f, 0, 1.0f, 0.0f, 1.0f, 1);
    CHECK(engine_sampler_sample(s, LOGITS, V, NULL, 0) == 1);
    engine_sampler_free(s);

    /* NaN logits (found by fuzz_model: weights holding NaN). A NaN first
     * made the best logit NaN, left no candidate, and the draw read the one
     * before the buffer; now NaN is never drawn, and all-NaN gives -1. */
    s = make(0.8f, 0, 0.9f, 0.05f, 1.0f, 3);
    float nan_first[V];
    memcpy(nan_first, LOGITS, sizeof nan_first);
    nan_first[0] = NAN;
    nan_first[6] = NAN;
    for (int i = 0; i < 1000; i++) {
        const int32_t id = engine_sampler_sample(s, nan_first, V, NULL, 0);
        CHECK_MSG(id >= 0 && id < V && id != 0 && id != 6, "drew %d", (int)id);
    }
    float all_nan[V];
    for (int i = 0; i < V; i++)
        all_nan[i] = NAN;
    CHECK(engine_sampler_sample(s, all_nan, V, NULL, 0) == -1);
    engine_sampler_free(s);

    /* Temperature 1: the softmax. */
    s = make(1.0f, 0, 1.0f, 0.0f, 1.0f, 42);
    draw(s, N, freq);
    int all[V] = {1, 1, 1, 1, 1, 1, 1, 1};
    softmax(LOGITS, all, 1.0, p);
    expect_freq("temperature 1", freq, p, N);
    engine_sampler_free(s);

    /* Temperature 0.5 sharpens. */
    s = make(0.5f, 0, 1.0f, 0.0f, 1.0f, 43);
    draw(s, N, freq);
    softmax(LOGITS, all, 0.5, p);
    expect_freq("temperature 0.5", freq, p, N);
    engine_sampler_free(s);

    /* top-k 3: only ids 1, 5, 2, renormalised. */
    s = make(1.0f, 3, 1.0f, 0.0f, 1.0f, 44);
    draw(s, N, freq);
    int k3[V] = {0, 1, 1, 0, 0, 1, 0, 0};
    softmax(LOGITS, k3, 1.0, p);
    expect_freq("top-k 3", freq, p, N);
    engine_sampler_free(s);

    /* top-p: the smallest prefix (by probability) whose mass reaches p. */
    softmax(LOGITS, all, 1.0, p);
    double mass3 = p[1] + p[5] + p[2];
    s = make(1.0f, 0, (float)(mass3 - 0.01), 0.0f, 1.0f, 45);
    draw(s, N, freq);
    softmax(LOGITS, k3, 1.0, p);
    expect_freq("top-p", freq, p, N);
    engine_sampler_free(s);

    /* min-p 0.5: keep p_i >= 0.5 p_max, i.e. logit >= 3 + ln 0.5 = 2.307: ids 1, 5, 2. */
    s = make(1.0f, 0, 1.0f, 0.5f, 1.0f, 46);
    draw(s, N, freq);
    expect_freq("min-p", freq, p, N);
    engine_sampler_free(s);

    /* Same seed, same sequence; another seed, another one. */
    int32_t a[64], b[64], c[64];
    engine_sampler *s1 = make(1.0f, 0, 1.0f, 0.0f, 1.0f, 7), *s2 = make(1.0f, 0, 1.0f, 0.0f, 1.0f, 7);
    engine_sampler *s3 = make(1.0f, 0, 1.0f, 0.0f, 1.0f, 8);
    for (int i = 0; i < 64; i++) {
        a[i] = engine_sampler_sample(s1, LOGITS, V, NULL, 0);
        b[i] = engine_sampler_sample(s2, LOGITS, V, NULL, 0);
        c[i] = engine_sampler_sample(s3, LOGITS, V, NULL, 0);
    }
    CHECK(memcmp(a, b, sizeof a) == 0);
    CHECK(memcmp(a, c, sizeof a) != 0);
    engine_sampler_free(s1), engine_sampler_free(s2), engine_sampler_free(s3);

    /* From a candidate list (what the GPU brings back: logits / temperature
     * within 50 nats of the best, in any order) the draws are those of the
     * full logits, same seed, same filters. */
    {
        enum { NV = 3000 };
        static float big[NV], scaled[NV];
        static int32_t ids[NV];
        for (int i = 0; i < NV; i++)
            big[i] = (float)(((i * 7919) % 1000) * 0.04 - 20.0);
        const float temp = 0.7f;
        float mx = big[0];
        for (int i = 1; i < NV; i++)
            mx = big[i] > mx ? big[i] : mx;
        int n = 0;
        for (int i = NV - 1; i >= 0; i--) /* reversed: order must not matter */
            if (big[i] / temp >= mx / temp - 50.0f) {
                ids[n] = i;
                scaled[n++] = big[i] / temp;
            }
        CHECK(n > 100 && n < NV);
        engine_sampler *f = make(temp, 40, 0.9f, 0.01f, 1.0f, 99), *g = make(temp, 40, 0.9f, 0.01f, 1.0f, 99);
        int same = 0;
        for (int i = 0; i < 500; i++)
            same += engine_sampler_sample(f, big, NV, NULL, 0) == sampler_sample_candidates(g, ids, scaled, n);
        CHECK_MSG(same == 500, "candidate draws differ from full-logit draws at %d of 500", 500 - same);
        engine_sampler_free(f), engine_sampler_free(g);
    }

    /* Repetition penalty: a positive logit is divided, a negative multiplied, once per distinct token. */
    s = make(0.0f, 0, 1.0f, 0.0f, 2.0f, 1);
    int32_t hist[] = {1, 1, 1, 5};
    /* 3/2 = 1.5 and 2.9/2 = 1.45 now lose to 2.5 (id 2). */
    CHECK(engine_sampler_sample(s, LOGITS, V, hist, 4) == 2);
    int32_t hist2[] = {1};
    /* 1.5 < 2.9: id 5 wins. */
    CHECK(engine_sampler_sample(s, LOGITS, V, hist2, 1) == 5);
    engine_sampler_free(s);
    {
        /* Only negative logits: penalising the best (-1 -> -2) hands the win to the next. */
        float neg[3] = {-1.0f, -1.5f, -3.0f};
        s = make(0.0f, 0, 1.0f, 0.0f, 2.0f, 1);
        int32_t h[] = {0};
        CHECK(engine_sampler_sample(s, neg, 3, h, 1) == 1);
        engine_sampler_free(s);
    }

    /* Bad parameters and arguments are refused. */
    engine_sampler_params bad = engine_sampler_default_params();
    bad.top_p = 0.0f;
    CHECK(engine_sampler_create(&bad, &s) == ENGINE_ERR_INVALID_ARG);
    bad = engine_sampler_default_params();
    bad.temperature = -1.0f;
    CHECK(engine_sampler_create(&bad, &s) == ENGINE_ERR_INVALID_ARG);
    s = make(0.0f, 0, 1.0f, 0.0f, 1.0f, 1);
    CHECK(engine_sampler_sample(s, NULL, V, NULL, 0) == -1);
    CHECK(engine_sampler_sample(s, LOGITS, 0, NULL, 0) == -1);
    engine_sampler_free(s);
    engine_sampler_free(NULL);
    return test_finish("test_sampler");
}
