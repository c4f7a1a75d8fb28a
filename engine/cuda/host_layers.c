/*
 * host_layers.c: the CPU side of hosted layers in a decode step (see
 * host_layers.h): pinned vectors the step's copies read and write, and the
 * host nodes that run the two halves of forward_cpu.c's layer.
 *
 * With a trace attached to the session, each half is a span on a track of
 * its own ("CPU, hosted layers"), timed on the host by the trace's clock
 * (trace_now): unlike the device's work, which the streaming code places from
 * CUDA events, the host nodes run on a CPU thread and can read the clock
 * themselves, in every decode step (the graph's included).
 */
#define _POSIX_C_SOURCE 200809L

#include <stdlib.h>

#include "../trace.h"
#include "host_layers.h"

typedef struct host_job {
    host_layers *h;
    int layer;
    int from; /* a split expert layer's: its first expert not on the device */
} host_job;

struct host_layers {
    const engine_model *m;
    const engine_session *s; /* read by the host nodes for its trace: a step's calls hold the session */
    k_ctx kc;
    float *x;      /* [dim] pinned and mapped: the residual while hosted layers run */
    float *qkv;    /* [(nh + 2*nkv) * hd] pinned and mapped               */
    float *att;    /* [nh * hd] pinned and mapped                         */
    float *dx, *dqkv, *datt; /* the same as the device addresses them     */
    float *xb;     /* [max(dim, nh * hd)]                                 */
    float *hb;     /* [ffn]                                               */
    float *hb2;    /* [ffn]                                               */
    float *moe;    /* cpu_moe_token's scratch (expert layers); else NULL  */
    /* Split expert layers (some experts on the device, the rest here): */
    float *ex_out; /* [k * dim] pinned and mapped: the host's choices' outputs */
    int32_t *ex_ids; /* [k] pinned and mapped: the choices                */
    float *dex_out;
    int32_t *dex_ids;
    host_job *jobs;/* [n_layers]                                          */
    host_job *ex_jobs; /* [n_layers]                                      */
    double seconds;/* written by the host nodes, read after a sync        */
    /* The trace the CPU track was made in and its id: made by the first host
     * node that finds the session traced, so that an untraced session has no
     * empty track, and again if the session moves to another trace. Only the
     * host nodes touch these, one at a time (they run in stream order). */
    engine_trace *trace;
    int trace_tid;
};

engine_status host_layers_create(const engine_session *s, host_layers **out, err_buf *e)
{
    const engine_model *m = s->model;
    const cfg_model *c = &m->cfg;
    const size_t qd = (size_t)c->n_heads * c->head_dim, qkvd = qd + 2 * (size_t)c->n_kv_heads * c->head_dim;
    const size_t widest = qd > (size_t)c->dim ? qd : (size_t)c->dim;
    /* Expert layers multiply by the experts' and the shared expert's widths too. */
    const size_t ffn = (size_t)model_ffn_max(c), cols = widest > ffn ? widest : ffn;
    *out = NULL;
    host_layers *h = calloc(1, sizeof *h);
    if (!h)
        return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "out of memory");
    h->m = m;
    h->s = s;
    h->kc.n_threads = model_host_threads(m);
    h->kc.scratch_per_thread = k_matmul_scratch_floats((int)cols);
    h->kc.scratch = malloc((size_t)h->kc.n_threads * h->kc.scratch_per_thread * sizeof(float));
    h->xb = malloc((widest + 2 * (size_t)c->ffn_dim) * sizeof(float));
    h->jobs = malloc((size_t)c->n_layers * sizeof *h->jobs);
    h->ex_jobs = malloc((size_t)c->n_layers * sizeof *h->ex_jobs);
    h->moe = c->n_experts > 0 ? malloc(cpu_moe_token_floats(c) * sizeof(float)) : NULL;
    const size_t ex = c->n_experts > 0 ? (size_t)c->n_experts_used * ((size_t)c->dim + 1) : 0;
    cudaError_t ce = cudaHostAlloc((void **)&h->x, ((size_t)c->dim + qkvd + qd + ex) * sizeof(float),
                                   cudaHostAllocPortable | cudaHostAllocMapped);
    if (ce != cudaSuccess)
        h->x = NULL;
    else
        ce = cudaHostGetDevicePointer((void **)&h->dx, h->x, 0);
    if (!h->kc.scratch || !h->xb || !h->jobs || !h->ex_jobs || !h->x || (c->n_experts > 0 && !h->moe)) {
        host_layers_free(h);
        return ce != cudaSuccess ? err_set(e, ENGINE_ERR_CUDA, "pinned buffers for hosted layers: %s",
                                           cudaGetErrorString(ce))
                                 : err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "out of memory");
    }
    h->qkv = h->x + c->dim;
    h->att = h->qkv + qkvd;
    h->dqkv = h->dx + c->dim;
    h->datt = h->dqkv + qkvd;
    h->hb = h->xb + widest;
    h->hb2 = h->hb + c->ffn_dim;
    if (ex) {
        h->ex_out = h->att + qd;
        h->ex_ids = (int32_t *)(h->ex_out + (size_t)c->n_experts_used * c->dim);
        h->dex_out = h->datt + qd;
        h->dex_ids = (int32_t *)(h->dex_out + (size_t)c->n_experts_used * c->dim);
    }
    for (int l = 0; l < c->n_layers; l++) {
        h->jobs[l] = (host_job){h, l, 0};
        h->ex_jobs[l] = (host_job){h, l, 0};
    }
    *out = h;
    return ENGINE_OK;
}

void host_layers_free(host_layers *h)
{
    if (!h)
        return;
    if (h->x)
        cudaFreeHost(h->x);
    free(h->kc.scratch);
    free(h->xb);
    free(h->jobs);
    free(h->ex_jobs);
    free(h->moe);
    free(h);
}

/* The trace a host node records into (NULL: none), its CPU track made on first use. */
static engine_trace *node_trace(host_layers *h)
{
    engine_trace *t = h->s->trace;
    if (!t)
        h->trace = NULL; /* detached: a trace attached later, even at the same address, gets a new track */
    else if (t != h->trace) {
        h->trace_tid = trace_track(t, "CPU, hosted layers (track %d)");
        h->trace = t;
    }
    return t;
}

/* A host node's end: its CPU seconds counted, its span on the hosted-layers track (from us0). */
static void host_done(host_layers *h, engine_trace *t, const char *name, int layer, double t0, double us0)
{
    h->seconds += model_seconds() - t0;
    if (t)
        trace_span_args(t, h->trace_tid, name, layer, "host", us0, trace_now(t) - us0, NULL, 0, NULL, 0);
}

/* Host nodes: each runs one half of the layer on the pinned vectors. */
static void CUDART_CB run_before(void *p)
{
    const host_job *j = p;
    host_layers *h = j->h;
    const cfg_model *c = &h->m->cfg;
    const size_t qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
    engine_trace *t = node_trace(h);
    const double t0 = model_seconds(), us0 = trace_now(t);
    cpu_layer_qkv(h->m, &h->kc, j->layer, 1, h->x, h->xb, h->qkv, h->qkv + qd, h->qkv + qd + kvd, false);
    host_done(h, t, "q/k/v of layer", j->layer, t0, us0);
}

static void CUDART_CB run_after(void *p)
{
    const host_job *j = p;
    host_layers *h = j->h;
    engine_trace *t = node_trace(h);
    const double t0 = model_seconds(), us0 = trace_now(t);
    cpu_layer_out(h->m, &h->kc, j->layer, 1, h->x, h->att, h->xb, h->hb, h->hb2);
    if (h->m->layers[j->layer].experts) /* cpu_layer_out leaves an expert layer's MLP out */
        cpu_moe_token(h->m, &h->kc, j->layer, h->x, h->moe,
                      h->s->expert_picks ? h->s->expert_picks + (size_t)j->layer * h->m->cfg.n_experts : NULL);
    host_done(h, t, "o + ffn of layer", j->layer, t0, us0);
}

static void CUDART_CB run_experts(void *p)
{
    const host_job *j = p;
    host_layers *h = j->h;
    engine_trace *t = node_trace(h);
    const double t0 = model_seconds(), us0 = trace_now(t);
    cpu_moe_host_experts(h->m, &h->kc, j->layer, h->x, h->ex_ids, j->from, h->ex_out, h->moe);
    host_done(h, t, "experts of layer", j->layer, t0, us0);
}

static int host_node(launch_ctx *lc, cudaHostFn_t fn, host_job *j)
{
    const cudaError_t ce = cudaLaunchHostFunc(lc->stream, fn, j);
    return ce == cudaSuccess ? 0 : launch_fail(lc, "hosted layer: %s", cudaGetErrorString(ce));
}

/* The vectors cross by kernels on mapped memory: a copy would queue behind a streamed layer's upload. */
int host_layer_before(host_layers *h, launch_ctx *lc, int l, const float *x, float *qkv, bool fetch_x)
{
    const cfg_model *c = &h->m->cfg;
    const int qkvd = (c->n_heads + 2 * c->n_kv_heads) * c->head_dim;
    if (fetch_x && launch_copy_f32(lc, h->dx, x, c->dim))
        return -1;
    if (host_node(lc, run_before, &h->jobs[l]))
        return -1;
    return launch_copy_f32(lc, qkv, h->dqkv, qkvd);
}

int host_layer_after(host_layers *h, launch_ctx *lc, int l, const float *att, float *x, bool put_x)
{
    const cfg_model *c = &h->m->cfg;
    if (launch_copy_f32(lc, h->datt, att, c->n_heads * c->head_dim))
        return -1;
    if (host_node(lc, run_after, &h->jobs[l]))
        return -1;
    return put_x ? launch_copy_f32(lc, x, h->dx, c->dim) : 0;
}

int host_experts(host_layers *h, launch_ctx *lc, int l, int from, const float *x, const int32_t *ids, float *ys)
{
    const cfg_model *c = &h->m->cfg;
    h->ex_jobs[l].from = from;
    if (launch_moe_to_host(lc, h->dx, h->dex_ids, x, ids, c->n_experts_used, c->dim))
        return -1;
    if (host_node(lc, run_experts, &h->ex_jobs[l]))
        return -1;
    return launch_moe_from_host(lc, ys, h->dex_out, ids, c->n_experts_used, from, c->dim);
}

double host_layers_take_seconds(host_layers *h)
{
    if (!h)
        return 0.0;
    const double s = h->seconds;
    h->seconds = 0.0;
    return s;
}
