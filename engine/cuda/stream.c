/*
 * stream.c: streamed layers (see stream.h). The model side pins the file
 * mappings and keeps each streamed layer's copy list; the session side
 * owns the slots, the copy stream, the events that order it against the
 * compute stream, and the timing of the passes it is asked to measure.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdlib.h>
#include <string.h>

#include "../trace.h"
#include "expert_cache_cuda.h"
#include "host_layers.h"
#include "stream.h"
#include "trace_stamps.h"

#define ALIGN 256

struct stream_session {
    const stream_model *sm;
    char *slots;              /* arena region: n_slots x stride            */
    uint64_t stride;
    cudaStream_t copy;
    cudaEvent_t fork, join;
    cudaEvent_t *copied;      /* [n] streamed layer i is in its slot       */
    cudaEvent_t *freed;       /* [n] layer i's compute is done with its slot */
    /* The copies of a pass kind (0: prompt, every streamed layer; 1: decode,
     * the hosted ones left out), as streamed indices; at[kind][i] is i's
     * position there or -1. kind: whose slot pointers cs->layers holds. */
    int *order[2], n_order[2], *at[2];
    int kind, timed_kind;   /* the kind of the pass now, of the timed pass pending */
    /* Timing of one pass: copies [cb, ce] per streamed layer, compute [lb, le] per layer, [t0, t1] in all. */
    bool timing, profile;
    cudaEvent_t t0, t1, *cb, *ce, *lb, *le;
    int n_layers;
    bool pending;             /* a timed pass not yet collected            */
    int pending_tokens;
    /* The timed pass's trace (trace.h; NULL: none), its tracks, and the host
     * time its t0 was enqueued at, in the trace's microseconds: the device
     * runs it a little later, so its spans are placed from there. */
    engine_trace *trace;
    int gpu_tid, copy_tid;
    double t0_us;
    stream_times prefill;
};

/* ------------------------------------------------------------ model side */

bool stream_pinned(const stream_model *sm, const void *p, uint64_t bytes)
{
    const char *c = p;
    for (int i = 0; sm && c && i < sm->n_reg; i++) {
        const char *lo = sm->reg[i].p;
        if (c >= lo && bytes <= sm->reg[i].len && c - lo <= (ptrdiff_t)(sm->reg[i].len - bytes))
            return true;
    }
    return false;
}

bool stream_add_copy(stream_model *sm, int i, uint64_t dst, const void *src, uint64_t bytes)
{
    sm->bytes[i] += bytes;
    if (sm->n_copies > sm->first[i]) { /* merge with layer i's last copy when both sides continue it */
        stream_copy *last = &sm->copies[sm->n_copies - 1];
        if (last->dst + last->bytes == dst && (const char *)last->src + last->bytes == (const char *)src) {
            last->bytes += bytes;
            return true;
        }
    }
    if (sm->n_copies == sm->cap_copies) {
        const int cap = sm->cap_copies ? 2 * sm->cap_copies : 64;
        stream_copy *g = realloc(sm->copies, (size_t)cap * sizeof *g);
        if (!g)
            return false;
        sm->copies = g;
        sm->cap_copies = cap;
    }
    sm->copies[sm->n_copies++] = (stream_copy){dst, src, bytes};
    sm->first[i + 1] = sm->n_copies; /* layers are laid out in order */
    return true;
}

engine_status stream_model_open(cuda_model *cm, const engine_model *m, const engine_plan *plan, err_buf *e)
{
    const int L = m->cfg.n_layers;
    /* Units: the layers in host memory, and the split expert layers' host experts. */
    int n = 0;
    for (int l = 0; l < L; l++) {
        const engine_plan_entry *pe = engine_plan_entry_at(plan, 1 + (size_t)l);
        n += pe->placement != ENGINE_PLACE_RESIDENT || pe->experts_resident < pe->n_experts;
    }
    const bool emb_host = engine_plan_entry_at(plan, 0)->placement == ENGINE_PLACE_STREAMED;
    const bool head = engine_plan_entry_at(plan, (size_t)L + 1)->placement == ENGINE_PLACE_STREAMED;
    cm->sm = NULL;
    if (n == 0 && !emb_host && !head)
        return ENGINE_OK;
    stream_model *sm = calloc(1, sizeof *sm);
    if (!sm)
        return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "out of memory");
    cm->sm = sm;
    sm->n = n;
    /* The slots hold the largest streamed layer; a streamed head goes through them in row blocks
     * (the planner streams the head only once every layer streams). */
    for (int l = 0; l < L; l++) {
        const engine_plan_entry *pe = engine_plan_entry_at(plan, 1 + (size_t)l);
        uint64_t b = 0;
        if (pe->placement != ENGINE_PLACE_RESIDENT)
            b = cuda_layer_mats(cm, m, l, NULL, NULL);
        else if (pe->experts_resident < pe->n_experts)
            b = cuda_expert_range_bytes(cm, m, l, pe->experts_resident, pe->n_experts);
        if (b > sm->slot_bytes)
            sm->slot_bytes = b;
    }
    if (head) {
        const uint64_t row = (uint64_t)m->cfg.dim * k_dtype_size(cm->wt), vocab = (uint64_t)m->cfg.vocab_size;
        if (sm->slot_bytes < row)
            sm->slot_bytes = row * vocab;
        const uint64_t rows = sm->slot_bytes / row < vocab ? sm->slot_bytes / row : vocab;
        sm->head_rows = (int)rows;
        sm->head_total = m->cfg.vocab_size;
        sm->head_blocks = (int)((vocab + rows - 1) / rows);
    }
    sm->n_units = n + sm->head_blocks;
    sm->n_slots = sm->n_units > 0 ? 2 : 0; /* as the planner counts them */
    sm->emb_host = emb_host;
    const size_t units = (size_t)sm->n_units;
    sm->index = malloc((size_t)L * sizeof *sm->index);
    sm->layer_of = malloc((units + 1) * sizeof *sm->layer_of);
    sm->hosted = calloc(units + 1, sizeof *sm->hosted);
    sm->split = calloc(units + 1, sizeof *sm->split);
    sm->ex_from = malloc((size_t)L * sizeof *sm->ex_from);
    sm->bytes = calloc(units + 1, sizeof *sm->bytes);
    sm->first = calloc(units + 2, sizeof *sm->first);
    sm->reg = calloc((size_t)st_n_files(m->weights) + 1, sizeof *sm->reg);
    if (!sm->index || !sm->layer_of || !sm->hosted || !sm->split || !sm->ex_from || !sm->bytes || !sm->first ||
        !sm->reg)
        return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "out of memory");
    for (int l = 0, i = 0; l < L; l++) {
        const engine_plan_entry *pe = engine_plan_entry_at(plan, 1 + (size_t)l);
        const engine_placement pl = pe->placement;
        const bool split = pl == ENGINE_PLACE_RESIDENT && pe->experts_resident < pe->n_experts;
        sm->ex_from[l] = split ? pe->experts_resident : m->cfg.n_experts;
        sm->index[l] = pl != ENGINE_PLACE_RESIDENT || split ? i : -1;
        if (sm->index[l] < 0)
            continue;
        sm->split[i] = split;
        sm->n_split += split;
        sm->hosted[i] = pl == ENGINE_PLACE_HOST || split; /* decode leaves both to the CPU */
        sm->n_hosted += pl == ENGINE_PLACE_HOST;
        sm->layer_of[i++] = l;
    }
    for (int i = n; i < sm->n_units; i++)
        sm->layer_of[i] = -1;
    /* Pin the mappings so the copy engine reads the file's pages directly
     * (53.9 GB/s on an H100, HARDWARE.md). Where that fails (no read-only
     * registration on this driver), the tensors go through the host image. */
    int ro = 0;
    cudaDeviceGetAttribute(&ro, cudaDevAttrHostRegisterReadOnlySupported, cm->device);
    for (int f = 0; ro && f < st_n_files(m->weights); f++) {
        size_t len = 0;
        const void *p = st_file_map(m->weights, f, &len);
        if (!p || !len)
            continue;
        cudaError_t ce = cudaHostRegister((void *)p, len,
                                          cudaHostRegisterPortable | cudaHostRegisterMapped | cudaHostRegisterReadOnly);
        if (ce != cudaSuccess) {
            cudaGetLastError();
            model_log(m, ENGINE_LOG_WARN, "CUDA: %s could not be pinned (%s): its streamed tensors are copied",
                      st_file_path(m->weights, f), cudaGetErrorString(ce));
            continue;
        }
        sm->reg[sm->n_reg++] = (stream_range){p, len};
        sm->pinned += len;
    }
    return ENGINE_OK;
}

engine_status stream_emb_pointer(stream_model *sm, const k_weight *emb, void **dev, err_buf *e)
{
    const uint64_t bytes = (uint64_t)emb->rows * emb->cols * k_dtype_size(emb->dtype);
    const void *host = emb->data;
    cudaError_t ce = cudaSuccess;
    if (!stream_pinned(sm, host, bytes)) {
        ce = cudaHostAlloc(&sm->emb_copy, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
        if (ce == cudaSuccess) {
            memcpy(sm->emb_copy, host, bytes);
            sm->pinned += bytes;
            host = sm->emb_copy;
        }
    }
    if (ce == cudaSuccess)
        ce = cudaHostGetDevicePointer(dev, (void *)host, 0);
    return ce == cudaSuccess ? ENGINE_OK
                             : err_set(e, ENGINE_ERR_CUDA, "embeddings in host memory: %s", cudaGetErrorString(ce));
}

engine_status stream_expert_image(stream_model *sm, int n_threads, err_buf *e)
{
    sm->ex_image_at = calloc((size_t)sm->n_units + 1, sizeof *sm->ex_image_at);
    if (!sm->ex_image_at)
        return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "out of memory");
    uint64_t total = 0;
    for (int i = 0; i < sm->n_units; i++) {
        if (!sm->split[i])
            continue;
        uint64_t end = 0;
        for (int k = sm->first[i]; k < sm->first[i + 1]; k++)
            if (sm->copies[k].dst + sm->copies[k].bytes > end)
                end = sm->copies[k].dst + sm->copies[k].bytes;
        sm->ex_image_at[i] = total;
        total += (end + 255) & ~(uint64_t)255;
    }
    if (total == 0)
        return ENGINE_OK;
    const cudaError_t ce = cudaHostAlloc((void **)&sm->ex_image, total, cudaHostAllocMapped | cudaHostAllocPortable);
    if (ce != cudaSuccess) {
        sm->ex_image = NULL;
        return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "pinning %.1f MiB of host memory for host experts: %s",
                       total / 1048576.0, cudaGetErrorString(ce));
    }
    sm->ex_image_bytes = total;
    sm->pinned += total;
    /* Copies of several MiB each (an expert's matrices): one thread a copy. */
#pragma omp parallel for num_threads(n_threads > 0 ? n_threads : 1) schedule(dynamic, 1)
    for (int k = 0; k < sm->n_copies; k++) {
        int i = 0;
        while (sm->first[i + 1] <= k)
            i++;
        if (sm->split[i])
            memcpy(sm->ex_image + sm->ex_image_at[i] + sm->copies[k].dst, sm->copies[k].src, sm->copies[k].bytes);
    }
    return ENGINE_OK;
}

void stream_model_free(stream_model *sm)
{
    if (!sm)
        return;
    for (int i = 0; i < sm->n_reg; i++)
        cudaHostUnregister((void *)sm->reg[i].p);
    if (sm->image)
        cudaFreeHost(sm->image);
    if (sm->emb_copy)
        cudaFreeHost(sm->emb_copy);
    if (sm->ex_image)
        cudaFreeHost(sm->ex_image);
    free(sm->ex_image_at);
    free(sm->index);
    free(sm->layer_of);
    free(sm->hosted);
    free(sm->split);
    free(sm->ex_from);
    free(sm->bytes);
    free(sm->first);
    free(sm->copies);
    free(sm->reg);
    free(sm);
}

/* ---------------------------------------------------------- session side */

static void set_kind(cuda_session *cs, const engine_session *s, int kind);

static cudaError_t make_events(cudaEvent_t **out, int n, unsigned flags)
{
    *out = calloc((size_t)n + 1, sizeof **out);
    if (!*out)
        return cudaErrorMemoryAllocation;
    cudaError_t ce = cudaSuccess;
    for (int i = 0; i < n && ce == cudaSuccess; i++)
        ce = cudaEventCreateWithFlags(&(*out)[i], flags);
    return ce;
}

static void free_events(cudaEvent_t *ev, int n)
{
    for (int i = 0; ev && i < n; i++)
        if (ev[i])
            cudaEventDestroy(ev[i]);
    free(ev);
}

engine_status stream_session_create(cuda_session *cs, const engine_session *s, err_buf *e)
{
    const cuda_model *cm = cs->cm;
    const int L = s->model->cfg.n_layers;
    cs->layers = malloc((size_t)L * sizeof *cs->layers);
    if (!cs->layers)
        return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "out of memory");
    memcpy(cs->layers, cm->layers, (size_t)L * sizeof *cs->layers);
    const stream_model *sm = cm->sm;
    if (!sm || sm->n_units == 0)
        return ENGINE_OK;
    stream_session *ss = calloc(1, sizeof *ss);
    if (!ss)
        return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "out of memory");
    cs->ss = ss;
    ss->sm = sm;
    ss->n_layers = L;
    ss->stride = (sm->slot_bytes + ALIGN - 1) / ALIGN * ALIGN;
    engine_status st = arena_alloc(cm->arena, ss->stride * (uint64_t)sm->n_slots, ARENA_WEIGHTS,
                                   "the stream buffers", (void **)&ss->slots, e);
    if (st)
        return st;
    for (int k = 0; k < 2; k++) {
        ss->order[k] = malloc((size_t)sm->n_units * sizeof *ss->order[k]);
        ss->at[k] = malloc((size_t)sm->n_units * sizeof *ss->at[k]);
        if (!ss->order[k] || !ss->at[k])
            return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "out of memory");
        for (int i = 0; i < sm->n_units; i++) {
            ss->at[k][i] = k == 1 && sm->hosted[i] ? -1 : ss->n_order[k];
            if (ss->at[k][i] >= 0)
                ss->order[k][ss->n_order[k]++] = i;
        }
    }
    ss->kind = -1;
    set_kind(cs, s, 0);
    const unsigned sync = cudaEventDisableTiming;
    cudaError_t ce = cudaStreamCreateWithFlags(&ss->copy, cudaStreamNonBlocking);
    if (ce == cudaSuccess)
        ce = cudaEventCreateWithFlags(&ss->fork, sync);
    if (ce == cudaSuccess)
        ce = cudaEventCreateWithFlags(&ss->join, sync);
    if (ce == cudaSuccess)
        ce = cudaEventCreate(&ss->t0);
    if (ce == cudaSuccess)
        ce = cudaEventCreate(&ss->t1);
    if (ce == cudaSuccess)
        ce = make_events(&ss->copied, sm->n_units, sync);
    if (ce == cudaSuccess)
        ce = make_events(&ss->freed, sm->n_units, sync);
    if (ce == cudaSuccess)
        ce = make_events(&ss->cb, sm->n_units, cudaEventDefault);
    if (ce == cudaSuccess)
        ce = make_events(&ss->ce, sm->n_units, cudaEventDefault);
    if (ce == cudaSuccess)
        ce = make_events(&ss->lb, L, cudaEventDefault);
    if (ce == cudaSuccess)
        ce = make_events(&ss->le, L, cudaEventDefault);
    if (ce != cudaSuccess)
        return err_set(e, ENGINE_ERR_CUDA, "stream setup: %s", cudaGetErrorString(ce));
    return ENGINE_OK;
}

void stream_session_free(cuda_session *cs)
{
    stream_session *ss = cs->ss;
    free(cs->layers);
    cs->layers = NULL;
    if (!ss)
        return;
    const int n = ss->sm->n_units;
    if (ss->copy) {
        cudaStreamSynchronize(ss->copy);
        cudaStreamDestroy(ss->copy);
    }
    cudaEvent_t one[] = {ss->fork, ss->join, ss->t0, ss->t1};
    for (size_t i = 0; i < sizeof one / sizeof one[0]; i++)
        if (one[i])
            cudaEventDestroy(one[i]);
    free_events(ss->copied, n);
    free_events(ss->freed, n);
    free_events(ss->cb, n);
    free_events(ss->ce, n);
    free_events(ss->lb, ss->n_layers);
    free_events(ss->le, ss->n_layers);
    for (int k = 0; k < 2; k++) {
        free(ss->order[k]);
        free(ss->at[k]);
    }
    arena_free(cs->cm->arena, ss->slots);
    free(ss);
    cs->ss = NULL;
}

uint64_t stream_session_bytes(const cuda_session *cs)
{
    return cs->ss ? cs->ss->stride * (uint64_t)cs->ss->sm->n_slots : 0;
}

static int failed(cuda_session *cs, cudaError_t ce)
{
    return launch_fail(&cs->lc, "streaming: %s", cudaGetErrorString(ce));
}

/* Point the streamed layers' matrices at their slots for a pass of this kind. */
static void set_kind(cuda_session *cs, const engine_session *s, int kind)
{
    stream_session *ss = cs->ss;
    if (ss->kind == kind)
        return;
    ss->kind = kind;
    for (int j = 0; j < ss->n_order[kind]; j++) {
        const int i = ss->order[kind][j], l = ss->sm->layer_of[i];
        char *slot = ss->slots + (uint64_t)(j % ss->sm->n_slots) * ss->stride;
        if (l >= 0 && ss->sm->split[i]) /* the layer stays; its host experts come to the slot */
            cs->layers[l].ex_slot = slot;
        else if (l >= 0) /* head blocks find their slot as they run (stream_head_block) */
            cuda_layer_mats(cs->cm, s->model, l, slot, &cs->layers[l]);
    }
}

/* The kind of a decode pass: hosted layers and split experts are copied in prompt passes only. */
static int decode_kind(const stream_session *ss)
{
    return ss->sm->n_hosted + ss->sm->n_split > 0;
}

int stream_decode_copies(const cuda_session *cs)
{
    return cs->ss ? cs->ss->n_order[decode_kind(cs->ss)] : 0;
}

/* While a stamped decode graph is captured, the copy engine's clock at slot (forward_cuda.c's
 * stamps): a one-thread kernel on the copy stream, before the copies' event, so that it runs before
 * the unit is used, while the position it reads is the step's. */
static int copy_stamp(cuda_session *cs, int slot)
{
    if (!cs->stamping)
        return 0;
    launch_ctx lc = cs->lc;
    lc.stream = cs->ss->copy;
    lc.fast[K_OP_PDL] = false;
    if (launch_stamp(&lc, cs->d_stamps, cs->step + STEP_POS, 0, slot, cs->stamp_per) == 0)
        return 0;
    memcpy(cs->lc.err, lc.err, sizeof lc.err);
    return -1;
}

/* Queue the copies of the pass's j-th unit (a layer or a head block) into its slot, once the unit
 * before it there is done. */
static int copy_unit(cuda_session *cs, int j)
{
    stream_session *ss = cs->ss;
    const stream_model *sm = ss->sm;
    const int *order = ss->order[ss->kind], i = order[j], L = ss->n_layers;
    char *slot = ss->slots + (uint64_t)(j % sm->n_slots) * ss->stride;
    cudaError_t ce = j >= sm->n_slots ? cudaStreamWaitEvent(ss->copy, ss->freed[order[j - sm->n_slots]], 0)
                                      : cudaSuccess;
    if (ce == cudaSuccess && ss->timing)
        ce = cudaEventRecord(ss->cb[i], ss->copy);
    if (ce == cudaSuccess && copy_stamp(cs, STAMP_COPY(L, j)))
        return -1;
    for (int k = sm->first[i]; k < sm->first[i + 1] && ce == cudaSuccess; k++)
        ce = cudaMemcpyAsync(slot + sm->copies[k].dst, sm->copies[k].src, sm->copies[k].bytes,
                             cudaMemcpyHostToDevice, ss->copy);
    if (ce == cudaSuccess && ss->timing)
        ce = cudaEventRecord(ss->ce[i], ss->copy);
    if (ce == cudaSuccess && copy_stamp(cs, STAMP_COPY(L, j) + 1))
        return -1;
    if (ce == cudaSuccess)
        ce = cudaEventRecord(ss->copied[i], ss->copy);
    return ce == cudaSuccess ? 0 : failed(cs, ce);
}

bool stream_waits(const cuda_session *cs, int l)
{
    const stream_session *ss = cs->ss;
    return ss && ss->sm->index[l] >= 0 && ss->at[decode_kind(ss)][ss->sm->index[l]] >= 0;
}

bool stream_hosted(const cuda_session *cs, int l)
{
    const stream_session *ss = cs->ss;
    return ss && ss->kind == 1 && ss->sm->index[l] >= 0 && ss->at[1][ss->sm->index[l]] < 0 &&
           !ss->sm->split[ss->sm->index[l]];
}

int stream_begin(cuda_session *cs, const engine_session *s, int tokens, bool timing, bool decode)
{
    stream_session *ss = cs->ss;
    if (!ss)
        return 0;
    ss->timing = timing || ss->profile;
    /* The last timed pass was a prompt's: account it before its events are
     * reused. An untimed pass (a graph being captured: no synchronizing
     * there) records none of them and leaves it pending. */
    if (ss->timing) {
        if (ss->pending)
            stream_collect(cs, ss->pending_tokens, &ss->prefill);
        ss->pending_tokens = tokens;
    }
    set_kind(cs, s, decode ? decode_kind(ss) : 0);
    if (ss->timing) {
        ss->timed_kind = ss->kind;
        ss->trace = s->trace;
        ss->gpu_tid = s->trace_gpu_tid;
        ss->copy_tid = s->trace_copy_tid;
        ss->t0_us = trace_now(s->trace);
    }
    cudaError_t ce = ss->timing ? cudaEventRecord(ss->t0, cs->lc.stream) : cudaSuccess;
    if (ce == cudaSuccess)
        ce = cudaEventRecord(ss->fork, cs->lc.stream);
    if (ce == cudaSuccess)
        ce = cudaStreamWaitEvent(ss->copy, ss->fork, 0);
    if (ce != cudaSuccess)
        return failed(cs, ce);
    for (int j = 0; j < ss->n_order[ss->kind] && j < ss->sm->n_slots; j++)
        if (copy_unit(cs, j))
            return -1;
    return 0;
}

/* The compute stream waits for unit i's copy, when this pass copies it. */
static int wait_unit(cuda_session *cs, int i)
{
    stream_session *ss = cs->ss;
    const cudaError_t ce = i >= 0 && ss->at[ss->kind][i] >= 0 ? cudaStreamWaitEvent(cs->lc.stream, ss->copied[i], 0)
                                                               : cudaSuccess;
    return ce == cudaSuccess ? 0 : failed(cs, ce);
}

/* Unit i is done with its slot: the copy two positions on may start. */
static int free_unit(cuda_session *cs, int i)
{
    stream_session *ss = cs->ss;
    const int j = i >= 0 ? ss->at[ss->kind][i] : -1;
    if (j < 0)
        return 0;
    const cudaError_t ce = cudaEventRecord(ss->freed[i], cs->lc.stream);
    if (ce != cudaSuccess)
        return failed(cs, ce);
    return j + ss->sm->n_slots < ss->n_order[ss->kind] ? copy_unit(cs, j + ss->sm->n_slots) : 0;
}

int stream_head_blocks(const cuda_session *cs)
{
    return cs->ss ? cs->ss->sm->head_blocks : 0;
}

int stream_head_block(cuda_session *cs, int b, void **w, int *r0, int *rows)
{
    stream_session *ss = cs->ss;
    const stream_model *sm = ss->sm;
    const int u = sm->n + b, j = ss->at[ss->kind][u];
    *w = ss->slots + (uint64_t)(j % sm->n_slots) * ss->stride;
    *r0 = b * sm->head_rows;
    *rows = sm->head_total - *r0 < sm->head_rows ? sm->head_total - *r0 : sm->head_rows;
    return wait_unit(cs, u);
}

int stream_head_done(cuda_session *cs, int b)
{
    return free_unit(cs, cs->ss->sm->n + b);
}

int stream_before_layer(cuda_session *cs, int l)
{
    stream_session *ss = cs->ss;
    if (!ss)
        return 0;
    if (wait_unit(cs, ss->sm->index[l]))
        return -1;
    const cudaError_t ce = ss->timing ? cudaEventRecord(ss->lb[l], cs->lc.stream) : cudaSuccess;
    return ce == cudaSuccess ? 0 : failed(cs, ce);
}

int stream_after_layer(cuda_session *cs, int l)
{
    stream_session *ss = cs->ss;
    if (!ss)
        return 0;
    const cudaError_t ce = ss->timing ? cudaEventRecord(ss->le[l], cs->lc.stream) : cudaSuccess;
    if (ce != cudaSuccess)
        return failed(cs, ce);
    return free_unit(cs, ss->sm->index[l]);
}

int stream_end(cuda_session *cs)
{
    stream_session *ss = cs->ss;
    if (!ss)
        return 0;
    cudaError_t ce = cudaEventRecord(ss->join, ss->copy);
    if (ce == cudaSuccess)
        ce = cudaStreamWaitEvent(cs->lc.stream, ss->join, 0);
    if (ce == cudaSuccess && ss->timing)
        ce = cudaEventRecord(ss->t1, cs->lc.stream);
    if (ss->timing)
        ss->pending = ce == cudaSuccess;
    return ce == cudaSuccess ? 0 : failed(cs, ce);
}

/* Unit u's copy as a span on the copy engine's track. */
static void trace_copy(engine_trace *t, int tid, const stream_model *sm, int u, double ts, double dur)
{
    const int layer = sm->layer_of[u];
    trace_span_args(t, tid, layer < 0 ? "copy head block" : sm->split[u] ? "copy experts of layer" : "copy layer",
                    layer >= 0 ? layer : u - sm->n, "copy", ts, dur, "bytes", (double)sm->bytes[u], NULL, 0);
}

void stream_trace_stamped(const cuda_session *cs, engine_trace *t, int tid, const volatile uint64_t *g, double shift)
{
    const stream_session *ss = cs->ss;
    if (!ss)
        return;
    const int kind = decode_kind(ss);
    for (int j = 0; j < ss->n_order[kind]; j++)
        trace_copy(t, tid, ss->sm, ss->order[kind][j], (double)g[2 * j] * 1e-3 + shift,
                   (double)(g[2 * j + 1] - g[2 * j]) * 1e-3);
}

/* Seconds from t0 to ev. */
static double since(const stream_session *ss, cudaEvent_t ev)
{
    float ms = 0.0f;
    return cudaEventElapsedTime(&ms, ss->t0, ev) == cudaSuccess ? ms * 1e-3 : 0.0;
}

void stream_collect(cuda_session *cs, int tokens, stream_times *t)
{
    stream_session *ss = cs->ss;
    if (!ss || !ss->pending)
        return;
    ss->pending = false;
    if (cudaEventSynchronize(ss->t1) != cudaSuccess) {
        cudaGetLastError();
        return;
    }
    const stream_model *sm = ss->sm;
    const int L = ss->n_layers;
    double *cb = malloc((2 * (size_t)sm->n_units + 2 * (size_t)L + 1) * sizeof *cb);
    if (!cb)
        return;
    double *cend = cb + sm->n_units, *lb = cend + sm->n_units, *le = lb + L;
    double copy = 0, compute = 0, overlap = 0;
    const int n = ss->n_order[ss->timed_kind], *order = ss->order[ss->timed_kind];
    for (int j = 0; j < n; j++) {
        cb[j] = since(ss, ss->cb[order[j]]);
        cend[j] = since(ss, ss->ce[order[j]]);
        copy += cend[j] - cb[j];
    }
    for (int l = 0; l < L; l++) {
        lb[l] = since(ss, ss->lb[l]);
        le[l] = l + 1 < L ? since(ss, ss->le[l]) : since(ss, ss->t1); /* the last layer's span takes the head */
        compute += le[l] - lb[l];
        for (int j = 0; j < n; j++) {
            const double a = cb[j] > lb[l] ? cb[j] : lb[l], b = cend[j] < le[l] ? cend[j] : le[l];
            if (b > a)
                overlap += b - a;
        }
    }
    if (ss->trace) {
        /* The same events as spans: each layer on the compute track, each copy on the copy engine's. */
        for (int l = 0; l < L; l++)
            trace_span_args(ss->trace, ss->gpu_tid, "layer", l, "layer", ss->t0_us + lb[l] * 1e6,
                            (le[l] - lb[l]) * 1e6, NULL, 0, NULL, 0);
        for (int j = 0; j < n; j++)
            trace_copy(ss->trace, ss->copy_tid, sm, order[j], ss->t0_us + cb[j] * 1e6, (cend[j] - cb[j]) * 1e6);
    }
    free(cb);
    t->passes++;
    t->tokens += tokens;
    t->wall += since(ss, ss->t1);
    t->copy += copy;
    t->compute += compute;
    t->overlap += overlap;
    for (int j = 0; j < n; j++)
        t->bytes += sm->bytes[order[j]];
}

/* ----------------------------------------------------------------- report */

static engine_offload_times as_public(const stream_times *t)
{
    return (engine_offload_times){t->passes, t->tokens, t->wall, t->copy, t->compute, t->overlap, t->bytes, t->host};
}

engine_status cuda_offload_report(engine_session *s, int n_decode, engine_offload_report *r, err_buf *e)
{
    cuda_session *cs = s->cuda;
    const cuda_model *cm = cs->cm;
    const stream_model *sm = cm->sm;
    memset(r, 0, sizeof *r);
    r->n_layers = s->model->cfg.n_layers;
    r->device_reserve = cm->reserve;
    uint64_t slot_bytes = 0;
    expert_cache_numbers(cm, &r->expert_cache_slots, &slot_bytes, &r->expert_cache_hits, &r->expert_cache_misses);
    r->expert_cache_bytes = (uint64_t)r->expert_cache_slots * slot_bytes;
    if (!sm)
        return ENGINE_OK;
    r->n_layers_streamed = sm->n - sm->n_split; /* units that are whole layers */
    r->n_layers_host = sm->n_hosted;
    r->embeddings_on_host = sm->emb_host;
    r->host_pinned = sm->pinned;
    for (int i = 0; i < sm->n_units; i++)
        r->bytes_per_token += sm->hosted[i] ? 0 : sm->bytes[i]; /* what a decoded token copies */
    if (sm->emb_host)
        r->bytes_per_token += (uint64_t)s->model->cfg.dim * k_dtype_size(cm->wt);
    r->stream_buffers = stream_session_bytes(cs);
    stream_session *ss = cs->ss;
    if (!ss)
        return ENGINE_OK;
    stream_collect(cs, ss->pending_tokens, &ss->prefill);
    r->prefill = as_public(&ss->prefill);
    if (n_decode <= 0 || s->n_past == 0)
        return ENGINE_OK;
    /* Evaluate the last token again at its position, one step at a time and
     * timed: the cache row and the logits it leaves are those the engine
     * recovers dropped logits with (forward_cuda.c, refresh_logits). */
    cuda_greedy_drop(s);
    stream_times dt = {0};
    ss->profile = true;
    host_layers_take_seconds(cs->host); /* what earlier steps spent */
    engine_status st = ENGINE_OK;
    for (int k = 0; k < (n_decode < 16 ? n_decode : 16) && !st; k++) {
        cs->h_step[STEP_TOKEN] = s->tokens[s->n_past - 1];
        cs->h_step[STEP_POS] = s->n_past - 1;
        cudaError_t ce = cudaMemcpyAsync(cs->step, cs->h_step, 2 * sizeof(int32_t), cudaMemcpyHostToDevice,
                                         cs->lc.stream);
        if (ce == cudaSuccess && cuda_decode_eager(cs, s) != 0)
            st = cuda_launch_error(cs, e);
        else if (ce == cudaSuccess)
            ce = cudaStreamSynchronize(cs->lc.stream);
        if (!st && ce != cudaSuccess)
            st = err_set(e, ENGINE_ERR_CUDA, "CUDA: %s", cudaGetErrorString(ce));
        if (!st) {
            stream_collect(cs, 1, &dt);
            dt.host += host_layers_take_seconds(cs->host);
        }
    }
    ss->profile = false;
    if (st)
        return st;
    cs->logits_stale = false;
    r->decode = as_public(&dt);
    return ENGINE_OK;
}
