/*
 * session_cuda.c: a session's device memory, planned once: three arena
 * regions, the KV cache, the activations (every buffer, the RoPE tables,
 * the attention scratch) and the cuBLASLt workspace. Nothing is allocated
 * per token, which is also what lets one decode step be captured as a CUDA
 * graph and replayed.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdlib.h>
#include <string.h>

#include "expert_cache_cuda.h"
#include "host_layers.h"
#include "state.h"
#include "stream.h"

#define WORKSPACE_BYTES PLAN_WORKSPACE /* cuBLASLt's recommendation for Hopper */

/* Lay out the activation region; base NULL only sizes. */
static uint64_t layout(cuda_session *cs, const engine_session *s, char *base)
{
    plan_session_bufs b;
    const uint64_t bytes = plan_session_layout(&s->model->cfg, cs->cm->wt, s->n_batch, s->n_ctx, cs->cm->deq_elems,
                                               launch_argmax_scratch(), base, &b);
    cs->x = b.x;
    cs->act = b.act;
    cs->qkv = b.qkv;
    cs->q = b.q;
    cs->att = b.att;
    cs->gu = b.gu;
    cs->logits = b.logits;
    cs->rope_cos = b.rope_cos;
    cs->rope_sin = b.rope_sin;
    cs->rope_cos_local = b.rope_cos_local;
    cs->rope_sin_local = b.rope_sin_local;
    cs->argmax_scratch = b.argmax_scratch;
    cs->deq = b.deq;
    cs->ids = b.ids;
    cs->cand_ids = b.cand_ids;
    cs->cand_vals = b.cand_vals;
    cs->step = b.step;
    cs->in_max = b.in_max;
    cs->attn_part = b.attn_part;
    cs->attn_count = b.attn_count;
    cs->moe_logits = b.moe_logits;
    cs->moe_ids = b.moe_ids;
    cs->moe_w = b.moe_w;
    cs->moe_slot = b.moe_slot;
    cs->moe_tok = b.moe_tok;
    cs->moe_first = b.moe_first;
    cs->moe_act = b.moe_act;
    cs->moe_gu = b.moe_gu;
    cs->moe_h = b.moe_h;
    cs->moe_out = b.moe_out;
    cs->moe_sh = b.moe_sh;
    cs->moe_picks = b.moe_picks;
    cs->moe_pad = s->model->cfg.n_experts > 0 ? plan_moe_pad(&s->model->cfg, cs->cm->wt) : 0;
    /* The fused 4-bit product never runs beside the decoding into deq (both are prefill's, on one stream), so
     * its split tiles' partial sums use deq's bytes. */
    cs->q4_work.part = b.deq;
    cs->q4_work.part_bytes = cs->cm->deq_elems * k_dtype_size(cs->cm->wt);
    cs->q4_work.count = b.q4_count;
    cs->q4_work.n_count = PLAN_Q4_COUNTS;
    return bytes;
}

engine_status cuda_launch_error(cuda_session *cs, err_buf *e)
{
    return err_set(e, ENGINE_ERR_CUDA, "CUDA: %s", cs->lc.err);
}

engine_status cuda_session_create(engine_session *s, cuda_session **out, err_buf *e)
{
    *out = NULL;
    const engine_model *m = s->model;
    const cfg_model *c = &m->cfg;
    cuda_session *cs = calloc(1, sizeof *cs);
    if (!cs)
        return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "out of memory");
    cs->cm = m->cuda;
    cs->unfolded = model_block_out_scaled(m);
    cs->lc.n_sms = cs->cm->n_sms;
    cs->lc.cc = cs->cm->paths.cc;
    cs->lc.smem_max = cs->cm->paths.smem_max;
    memcpy(cs->lc.fast, cs->cm->paths.fast, sizeof cs->lc.fast);
    cs->lc.workspace_bytes = WORKSPACE_BYTES;
    /* Decode attention splits each kv head's keys among blocks (a cluster
     * on Hopper): enough that the kv heads' clusters cover the multiprocessors
     * (a block streams its keys at about one multiprocessor's share of the
     * memory bandwidth), at most 16 and at most one per 16 positions. */
    int splits = 1;
    while (splits < 16 && c->n_kv_heads * splits * 2 <= cs->lc.n_sms && splits * 2 * 16 <= s->n_ctx)
        splits *= 2;
    cs->n_splits = splits;

    engine_status st = ENGINE_OK;
    const uint64_t kvd = (uint64_t)c->n_kv_heads * c->head_dim;
    /* The cache's type: as asked, else as the placement planned it (its
     * default, plan_kv_default: fp16, which holds K and V with 8x less
     * rounding than bf16 in the same bytes, or fp32 for fp32 models; or the
     * smaller type it chose to fit the budget). */
    engine_kv_type kt = s->kv_type;
    if (kt == ENGINE_KV_AUTO)
        kt = cs->cm->plan ? engine_plan_get_totals(cs->cm->plan)->kv_type : plan_kv_default(cs->cm->wt);
    if (kt == ENGINE_KV_AUTO)
        kt = plan_kv_default(cs->cm->wt);
    s->kv_type = kt;
    cs->kvt = (k_kv_type)kt;
    /* The streaming kernels' blocks are independent: as many as fill the multiprocessors, per kernel. */
    cs->n_splits_long = attention_decode_stream_splits(&cs->lc, cs->kvt, c->n_heads, c->n_kv_heads, c->head_dim);
    cs->stream_from = attention_decode_stream_from(&cs->lc, cs->kvt, c->n_heads, c->n_kv_heads, c->head_dim);
    if (k_kv_has_scales(cs->kvt) && c->head_dim % 16) {
        cuda_session_free(cs);
        return err_set(e, ENGINE_ERR_UNSUPPORTED, "an %s KV cache needs head_dim a multiple of 16 on CUDA (it is %d)",
                       engine_kv_type_name(kt), c->head_dim);
    }
    /* K, then V, then (int8, fp8) K's scales and V's, as plan_kv_bytes counts them: each with every layer's
     * rows, n_ctx or a window layer's ring (s->kv_ring, engine_session_create). */
    const uint64_t rows = model_kv_row0(c, c->n_layers, s->n_ctx, s->kv_ring);
    const uint64_t one = rows * kvd * k_kv_elem_size(cs->kvt);
    const uint64_t scales = k_kv_has_scales(cs->kvt) ? rows * c->n_kv_heads * 4 : 0;
    cs->kv_bytes = 2 * (one + scales);
    cs->act_bytes = layout(cs, s, NULL);
    st = arena_alloc(cs->cm->arena, cs->kv_bytes, ARENA_KV_CACHE, "the KV cache", &cs->kv, e);
    if (!st)
        st = arena_alloc(cs->cm->arena, cs->act_bytes, ARENA_ACTIVATIONS, "the activation buffers", &cs->act_region,
                         e);
    if (!st)
        st = arena_alloc(cs->cm->arena, WORKSPACE_BYTES, ARENA_WORKSPACE, "the cuBLASLt workspace", &cs->lc.workspace,
                         e);
    if (st) {
        cuda_session_free(cs);
        return st;
    }
    cs->k_cache = cs->kv;
    cs->v_cache = (char *)cs->kv + one;
    cs->k_scale = scales ? (float *)((char *)cs->kv + 2 * one) : NULL;
    cs->v_scale = scales ? (float *)((char *)cs->kv + 2 * one + scales) : NULL;
    layout(cs, s, cs->act_region);
    st = stream_session_create(cs, s, e);
    if (!st)
        st = expert_feed_open(cs, s, e);
    if (!st && cs->cm->sm && cs->cm->sm->n_hosted + cs->cm->sm->n_split > 0)
        st = host_layers_create(s, &cs->host, e);
    if (st) {
        cuda_session_free(cs);
        return st;
    }

    cudaError_t ce = cudaStreamCreateWithFlags(&cs->lc.stream, cudaStreamNonBlocking);
    if (ce == cudaSuccess) /* on the session's stream: it does not wait for the legacy stream */
        ce = cudaMemsetAsync(cs->q4_work.count, 0, PLAN_Q4_COUNTS * sizeof(uint32_t), cs->lc.stream);
    if (ce == cudaSuccess)
        ce = cudaMemsetAsync(cs->attn_count, 0, (size_t)c->n_kv_heads * sizeof(uint32_t), cs->lc.stream);
    if (ce == cudaSuccess && cs->moe_picks)
        ce = cudaMemsetAsync(cs->moe_picks, 0, (size_t)c->n_layers * c->n_experts * sizeof(uint32_t), cs->lc.stream);
    /* With hosted layers the CPU is busy during a step: the thread waiting for it sleeps rather than spins. */
    const unsigned done_flags = cudaEventDisableTiming | (cs->host ? cudaEventBlockingSync : 0);
    for (int i = 0; i < 2 && ce == cudaSuccess; i++)
        ce = cudaEventCreateWithFlags(&cs->step_done[i], done_flags);
    if (ce == cudaSuccess)
        ce = cudaMallocHost((void **)&cs->h_ids, (size_t)s->n_batch * sizeof(int32_t));
    if (ce == cudaSuccess)
        ce = cudaMallocHost((void **)&cs->h_step, STEP_INTS * sizeof(int32_t));
    if (ce == cudaSuccess)
        ce = cudaHostGetDevicePointer((void **)&cs->ring, cs->h_step + STEP_RING, 0);
    if (ce == cudaSuccess) /* the argmax's block count starts at zero */
        ce = cudaMemsetAsync(cs->argmax_scratch, 0, launch_argmax_scratch(), cs->lc.stream);
    if (ce == cudaSuccess)
        ce = cudaMallocHost((void **)&cs->h_cand_ids, CAND_MAX * sizeof(int32_t));
    if (ce == cudaSuccess)
        ce = cudaMallocHost((void **)&cs->h_cand_vals, CAND_MAX * sizeof(float));
    if (ce == cudaSuccess && c->n_experts > 0)
        ce = cudaMallocHost((void **)&cs->h_moe_first, (2 * (size_t)c->n_experts + 1) * sizeof(int32_t));
    if (ce != cudaSuccess) {
        cuda_session_free(cs);
        return err_set(e, ENGINE_ERR_CUDA, "CUDA session: %s", cudaGetErrorString(ce));
    }
    if (launch_gemm_create(&cs->lc) != 0) {
        st = cuda_launch_error(cs, e);
        cuda_session_free(cs);
        return st;
    }
    /* RoPE tables are computed on the host exactly as the CPU backend does: [n_ctx, rot/2] for the rotated
     * dims (Phi-3's partial rotary rotates fewer than head_dim), and Gemma 3's sliding layers' own. */
    const size_t rot = (size_t)(c->rotary_dim > 0 ? c->rotary_dim : c->head_dim), tab = (size_t)s->n_ctx * (rot / 2);
    float *host = malloc(2 * tab * sizeof(float));
    if (!host) {
        cuda_session_free(cs);
        return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "out of memory");
    }
    for (int local = 0; local < 2 && ce == cudaSuccess; local++) {
        float *dc = local ? cs->rope_cos_local : cs->rope_cos, *ds = local ? cs->rope_sin_local : cs->rope_sin;
        if (!dc)
            continue;
        rope_tables_ex(c, s->n_ctx, local, false, host, host + tab);
        ce = cudaMemcpy(dc, host, tab * sizeof(float), cudaMemcpyHostToDevice);
        if (ce == cudaSuccess)
            ce = cudaMemcpy(ds, host + tab, tab * sizeof(float), cudaMemcpyHostToDevice);
    }
    free(host);
    if (ce != cudaSuccess) {
        cuda_session_free(cs);
        return err_set(e, ENGINE_ERR_CUDA, "CUDA session: %s", cudaGetErrorString(ce));
    }
    *out = cs;
    return ENGINE_OK;
}

void cuda_drop_graphs(cuda_session *cs)
{
    for (int i = 0; i < 2; i++) {
        if (cs->graph[i])
            cudaGraphExecDestroy(cs->graph[i]);
        if (cs->graph_fb[i])
            cudaGraphExecDestroy(cs->graph_fb[i]);
        cs->graph[i] = cs->graph_fb[i] = NULL;
    }
}

void cuda_session_free(cuda_session *cs)
{
    if (!cs)
        return;
    if (cs->lc.stream)
        cudaStreamSynchronize(cs->lc.stream);
    cuda_drop_graphs(cs);
    for (int i = 0; i < 2; i++)
        if (cs->step_done[i])
            cudaEventDestroy(cs->step_done[i]);
    stream_session_free(cs);
    expert_feed_free(cs);
    host_layers_free(cs->host);
    launch_gemm_destroy(&cs->lc);
    if (cs->lc.stream)
        cudaStreamDestroy(cs->lc.stream);
    if (cs->h_ids)
        cudaFreeHost(cs->h_ids);
    if (cs->h_step)
        cudaFreeHost(cs->h_step);
    if (cs->h_stamps)
        cudaFreeHost(cs->h_stamps);
    if (cs->h_cand_ids)
        cudaFreeHost(cs->h_cand_ids);
    if (cs->h_cand_vals)
        cudaFreeHost(cs->h_cand_vals);
    if (cs->h_moe_first)
        cudaFreeHost(cs->h_moe_first);
    arena_free(cs->cm->arena, cs->lc.workspace);
    arena_free(cs->cm->arena, cs->act_region);
    arena_free(cs->cm->arena, cs->kv);
    free(cs);
}

void cuda_memory(const engine_session *s, engine_memory_report *r)
{
    arena_stats as;
    arena_get_stats(s->model->cuda->arena, &as);
    r->kv_cache = s->cuda->kv_bytes;
    r->activations = s->cuda->act_bytes + WORKSPACE_BYTES; /* buffers and the cuBLASLt workspace */
    r->weights_owned = s->model->cuda->weight_bytes + stream_session_bytes(s->cuda); /* resident, and the slots */
    r->device_total = as.in_use;
    r->device_reserved = as.reserved;
    r->device_mapped = as.mapped;
    r->device_peak = as.peak_mapped;
    r->device_budget = as.budget;
}
