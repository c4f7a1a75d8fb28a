/*
 * model_cuda.c: a model's weights on the device. The budget less the CUDA
 * context's share is the arena; the offload plan decides what is resident.
 * One region is sized for every resident weight (laid out once, 256-byte
 * aligned) and the tensors are uploaded from the file mapping through two
 * pinned staging buffers: threads copy (or convert) one buffer while the
 * other crosses PCIe. The streamed layers' matrices are laid out the same
 * way at offsets in a slot, and recorded as copies for stream.c.
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/cpu/dtype.h"
#include "../../quant/quant.h"
#include "../trace.h"
#include "measure.h"
#include "state.h"
#include "expert_cache_cuda.h"
#include "stream.h"

#define ALIGN 256
#define STAGE_BYTES ((size_t)64 << 20)
#define BUDGET_MARGIN ((uint64_t)512 << 20) /* left to the driver and cuBLASLt when no budget is given */
/* Device memory the runtime takes after the context exists, outside the
 * arena (measured on an H100: see docs/DESIGN.md, "The budget"). */
#define RUNTIME_RESERVE ((uint64_t)128 << 20)

bool cuda_available(char *why, size_t why_size)
{
    int n = 0, dev = 0;
    cudaError_t ce = cudaGetDeviceCount(&n);
    if (ce != cudaSuccess || n == 0) {
        snprintf(why, why_size, "%s", ce != cudaSuccess ? cudaGetErrorString(ce) : "no CUDA device");
        cudaGetLastError();
        return false;
    }
    /* A device below 7.5, or one this build has no code for, is no device: said here, not in a launch. */
    cuda_caps caps;
    if (cudaGetDevice(&dev) != cudaSuccess || launch_caps(dev, &caps, why, why_size) != 0) {
        cudaGetLastError();
        return false;
    }
    return true;
}

/* ---- staging uploads ---- */

typedef struct uploader {
    void *stage[2];          /* pinned host buffers */
    cudaEvent_t done[2];     /* the copy out of stage[i] finished */
    cudaStream_t stream;
    int next;
    int n_threads;
} uploader;

static engine_status up_open(uploader *u, int n_threads, err_buf *e)
{
    memset(u, 0, sizeof *u);
    u->n_threads = n_threads;
    cudaError_t ce = cudaStreamCreateWithFlags(&u->stream, cudaStreamNonBlocking);
    for (int i = 0; i < 2 && ce == cudaSuccess; i++) {
        ce = cudaMallocHost(&u->stage[i], STAGE_BYTES);
        if (ce == cudaSuccess)
            ce = cudaEventCreateWithFlags(&u->done[i], cudaEventDisableTiming);
    }
    if (ce != cudaSuccess)
        return err_set(e, ENGINE_ERR_CUDA, "weight upload: %s", cudaGetErrorString(ce));
    return ENGINE_OK;
}

static void up_close(uploader *u)
{
    if (u->stream)
        cudaStreamSynchronize(u->stream);
    for (int i = 0; i < 2; i++) {
        if (u->stage[i])
            cudaFreeHost(u->stage[i]);
        if (u->done[i])
            cudaEventDestroy(u->done[i]);
    }
    if (u->stream)
        cudaStreamDestroy(u->stream);
}

/*
 * Element i of src as dst type `to`, written at out[i]. Returns how many
 * finite values became infinite (a bf16 or fp32 value beyond fp16's range).
 */
static size_t convert(void *out, k_dtype to, const k_weight *src, size_t first, size_t n, int n_threads)
{
    const size_t in_size = k_dtype_size(src->dtype);
    if (src->dtype == to) {
        const char *from = (const char *)src->data + first * in_size;
        /* Several threads: one cannot keep up with PCIe reading a mapping. */
#pragma omp parallel for num_threads(n_threads) schedule(static)
        for (int part = 0; part < 16; part++) {
            size_t bytes = n * in_size, lo = bytes * part / 16, hi = bytes * (part + 1) / 16;
            memcpy((char *)out + lo, from + lo, hi - lo);
        }
        return 0;
    }
    size_t overflow = 0;
#pragma omp parallel for num_threads(n_threads) schedule(static) reduction(+ : overflow)
    for (size_t i = 0; i < n; i++) {
        float v = k_weight_get(src, first + i);
        if (to == K_F32) {
            ((float *)out)[i] = v;
        } else if (to == K_F16) {
            const uint16_t h = f32_to_f16(v);
            ((uint16_t *)out)[i] = h;
            overflow += (h & 0x7fffu) == 0x7c00u && isfinite(v);
        } else {
            ((uint16_t *)out)[i] = f32_to_bf16(v);
        }
    }
    return overflow;
}

static const char *dense_name(k_dtype t) { return t == K_F32 ? "f32" : t == K_F16 ? "f16" : "bf16"; }

/* The error for a tensor that does not fit the type it is converted to. */
static engine_status range_error(const k_weight *src, k_dtype to, size_t overflow, err_buf *e)
{
    return err_set(e, ENGINE_ERR_UNSUPPORTED,
                   "a %s tensor [%d, %d] has %zu values beyond %s's range: this GPU multiplies %s weights as %s "
                   "(no bf16 products before compute capability 8.0); run this model with --device cpu",
                   dense_name(src->dtype), src->rows, src->cols, overflow, dense_name(to), dense_name(src->dtype),
                   dense_name(to));
}

/* Copy all of src, as type `to`, to device memory dst. */
static engine_status up_tensor(uploader *u, void *dst, k_dtype to, const k_weight *src, err_buf *e)
{
    const size_t total = (size_t)src->rows * src->cols, esz = k_dtype_size(to);
    const size_t per = STAGE_BYTES / esz;
    for (size_t done = 0; done < total; done += per) {
        const size_t n = total - done < per ? total - done : per;
        const int b = u->next;
        u->next ^= 1;
        cudaError_t ce = cudaEventSynchronize(u->done[b]);
        if (ce == cudaSuccess) {
            const size_t overflow = convert(u->stage[b], to, src, done, n, u->n_threads);
            if (overflow)
                return range_error(src, to, overflow, e);
            ce = cudaMemcpyAsync((char *)dst + done * esz, u->stage[b], n * esz, cudaMemcpyHostToDevice, u->stream);
        }
        if (ce == cudaSuccess)
            ce = cudaEventRecord(u->done[b], u->stream);
        if (ce != cudaSuccess)
            return err_set(e, ENGINE_ERR_CUDA, "weight upload: %s", cudaGetErrorString(ce));
    }
    return ENGINE_OK;
}

/* Copy `bytes` of host memory to dst through the staging buffers. */
static engine_status up_bytes(uploader *u, void *dst, const void *src, size_t bytes, err_buf *e)
{
    k_weight raw = {src, K_I8, 1, 0};
    for (size_t done = 0; done < bytes; done += STAGE_BYTES) {
        const size_t n = bytes - done < STAGE_BYTES ? bytes - done : STAGE_BYTES;
        raw.data = (const char *)src + done;
        raw.cols = (int)n;
        engine_status st = up_tensor(u, (char *)dst + done, K_I8, &raw, e);
        if (st)
            return st;
    }
    return ENGINE_OK;
}

/* Elements, and bytes of the data, scale and absmax arrays, of a quantized weight. */
static uint64_t q_elems(const k_weight *w) { return (uint64_t)w->rows * w->cols; }
static uint64_t q_data_bytes(const k_weight *w)
{
    return w->dtype == K_I8 ? q_elems(w) : (q_elems(w) + 1) / 2;
}
static uint64_t q_scale_count(const k_weight *w)
{
    return w->dtype == K_I8 ? (uint64_t)w->rows * q_int8_n_groups(w->cols, w->group)
                            : (q_elems(w) + w->block - 1) / w->block;
}

/* A 4-bit weight's absmax as fp32 (decoded when nested): malloc'd, or NULL. */
static float *q_absmax_f32(const k_weight *w)
{
    const size_t nb = q_scale_count(w);
    float *out = malloc(nb * sizeof *out);
    if (!out)
        return NULL;
    if (w->absmax_q)
        q_8bit_dequantize(w->absmax_code, w->absmax_q, w->absmax_scale, nb, w->absmax_block, w->absmax_offset, out);
    else
        memcpy(out, w->absmax, nb * sizeof *out);
    return out;
}

/* ---- where laid-out bytes go ---- */

/*
 * A streamed layer's bytes are not uploaded but recorded as copies into
 * its slot: from the pinned mapping where the file holds the device bytes,
 * else converted into the pinned host image. A first pass (fill false)
 * only sizes the image; the second fills it and records the copies.
 */
typedef struct recorder {
    stream_model *sm;
    int layer;        /* position among the streamed of the layer laid out */
    bool fill;
    uint64_t img_off; /* bytes of the image used so far */
    int n_threads;
} recorder;

/* Uploaded (up), recorded for a streamed layer (rec), or only sized (neither). */
typedef struct sink {
    uploader *up;
    recorder *rec;
} sink;

/* n bytes at the running offset *off (ALIGN-aligned); *at gets the offset. */
static char *carve_at(char *base, uint64_t *off, uint64_t n, uint64_t *at)
{
    *at = (*off + ALIGN - 1) & ~(uint64_t)(ALIGN - 1);
    *off = *at + n;
    return base ? base + *at : NULL;
}

/* All of src as type `to` at offset `at` from base. */
static engine_status sink_tensor(sink *k, char *base, uint64_t at, k_dtype to, const k_weight *src, err_buf *e)
{
    if (k->up)
        return up_tensor(k->up, base + at, to, src, e);
    recorder *r = k->rec;
    if (!r)
        return ENGINE_OK;
    const uint64_t n = (uint64_t)src->rows * src->cols, bytes = n * k_dtype_size(to);
    const void *from = src->data;
    if (src->dtype != to || !stream_pinned(r->sm, src->data, bytes)) {
        const uint64_t img = r->img_off;
        r->img_off = (img + bytes + ALIGN - 1) & ~(uint64_t)(ALIGN - 1);
        if (!r->fill)
            return ENGINE_OK;
        const size_t overflow = convert(r->sm->image + img, to, src, 0, n, r->n_threads);
        if (overflow)
            return range_error(src, to, overflow, e);
        from = r->sm->image + img;
    }
    if (r->fill && !stream_add_copy(r->sm, r->layer, at, from, bytes))
        return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "out of memory");
    return ENGINE_OK;
}

/* `bytes` of raw host memory at offset `at` from base. */
static engine_status sink_bytes(sink *k, char *base, uint64_t at, const void *src, uint64_t bytes, err_buf *e)
{
    if (k->up)
        return up_bytes(k->up, base + at, src, bytes, e);
    engine_status st = ENGINE_OK;
    for (uint64_t done = 0; !st && done < bytes; done += (uint64_t)1 << 30) {
        const uint64_t n = bytes - done < ((uint64_t)1 << 30) ? bytes - done : (uint64_t)1 << 30;
        const k_weight raw = {(const char *)src + done, K_I8, 1, (int)n};
        st = sink_tensor(k, base, at + done, K_I8, &raw, e);
    }
    return st;
}

/* A 4-bit weight's absmax as fp32 (decoded when nested) at offset `at`. */
static engine_status sink_absmax(sink *k, char *base, uint64_t at, const k_weight *p, err_buf *e)
{
    const uint64_t bytes = q_scale_count(p) * sizeof(float);
    if (!p->absmax_q)
        return sink_bytes(k, base, at, p->absmax, bytes, e);
    if (!k->up && (!k->rec || !k->rec->fill)) /* sized like any unpinned source */
        return sink_bytes(k, base, at, NULL, bytes, e);
    float *am = q_absmax_f32(p); /* copied (staged or into the image) before sink_bytes returns */
    engine_status st = am ? sink_bytes(k, base, at, am, bytes, e)
                          : err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "out of memory");
    free(am);
    return st;
}

/*
 * The rest of put_mat for 4-bit parts whose nested absmax stays 8-bit
 * (q_nested_stackable), after the data at w_at: the codes [blocks], each
 * nested block's scale and offset side by side [groups][2] (the offset is
 * a part's, repeated), the 16-entry and the 256-entry code tables.
 */
static engine_status put_nested(cuda_mat *dst, const k_weight *const *parts, int np, char *base, uint64_t *off,
                                uint64_t w_at, uint64_t blocks, uint64_t elems, sink *k, uint64_t *deq_elems,
                                err_buf *e)
{
    const k_weight *p0 = parts[0];
    const uint64_t nb = (uint64_t)p0->absmax_block, groups = (blocks + nb - 1) / nb;
    uint64_t q_at, s2_at, code_at, amc_at;
    dst->am_q = (uint8_t *)carve_at(base, off, blocks, &q_at);
    dst->am_s2 = (float *)carve_at(base, off, groups * 2 * sizeof(float), &s2_at);
    dst->code = (float *)carve_at(base, off, 16 * sizeof(float), &code_at);
    dst->am_code = (float *)carve_at(base, off, 256 * sizeof(float), &amc_at);
    dst->am_shift = __builtin_ctz((unsigned)nb);
    if (deq_elems && elems > *deq_elems)
        *deq_elems = elems;
    const bool sizing = !k->up && (!k->rec || !k->rec->fill); /* sized like any unpinned source */
    engine_status st = ENGINE_OK;
    for (int i = 0; !st && i < np; i++) {
        const k_weight *p = parts[i];
        const uint64_t pb = q_scale_count(p), pg = (pb + nb - 1) / nb;
        float *s2 = sizing ? NULL : malloc(pg * 2 * sizeof *s2);
        if (!sizing && !s2)
            return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "out of memory");
        for (uint64_t j = 0; s2 && j < pg; j++) {
            s2[2 * j] = p->absmax_scale[j];
            s2[2 * j + 1] = p->absmax_offset;
        }
        st = sink_bytes(k, base, w_at, p->data, q_data_bytes(p), e);
        if (!st)
            st = sink_bytes(k, base, q_at, p->absmax_q, pb, e);
        if (!st)
            st = sink_bytes(k, base, s2_at, s2, pg * 2 * sizeof *s2, e); /* copied before it returns */
        free(s2);
        w_at += q_data_bytes(p);
        q_at += pb;
        s2_at += pg * 2 * sizeof(float);
    }
    if (!st)
        st = sink_bytes(k, base, code_at, p0->code, 16 * sizeof(float), e);
    if (!st)
        st = sink_bytes(k, base, amc_at, p0->absmax_code, 256 * sizeof(float), e);
    return st;
}

/*
 * Place (and through the sink, upload or record) the parts stacked by rows
 * into one matrix: dense in wt, or quantized as they are. Quantized parts
 * must share a type, a group and a code table, and 4-bit parts must each
 * hold whole blocks.
 */
static engine_status put_mat(cuda_mat *dst, const k_weight *const *parts, int np, k_dtype wt, char *base,
                             uint64_t *off, sink *k, uint64_t *deq_elems, const char *what, err_buf *e)
{
    const k_weight *p0 = parts[0];
    memset(dst, 0, sizeof *dst);
    uint64_t elems = 0, data = 0, scales = 0, at;
    for (int i = 0; i < np; i++) {
        const k_weight *p = parts[i];
        const bool same = p->dtype == p0->dtype && (!k_dtype_is_quant(p->dtype) ||
                                                    (p->dtype == K_I8 ? p->group == p0->group && p->cols == p0->cols
                                                                      : p->block == p0->block &&
                                                                            !memcmp(p->code, p0->code, 16 * sizeof(float))));
        if (!same)
            return err_set(e, ENGINE_ERR_UNSUPPORTED,
                           "CUDA: the stacked parts of %s differ in type or quantization (quantize them alike)", what);
        if (k_dtype_is_quant(p->dtype) && p->dtype != K_I8 && np > 1 && q_elems(p) % (uint64_t)p->block != 0)
            return err_set(e, ENGINE_ERR_UNSUPPORTED, "CUDA: %s: a 4-bit block spans two stacked matrices", what);
        elems += q_elems(p);
        if (k_dtype_is_quant(p->dtype)) {
            data += q_data_bytes(p);
            scales += q_scale_count(p);
        }
    }
    engine_status st = ENGINE_OK;
    if (!k_dtype_is_quant(p0->dtype)) {
        dst->t = wt;
        dst->w = carve_at(base, off, elems * k_dtype_size(wt), &at);
        for (int i = 0; !st && i < np; i++) {
            st = sink_tensor(k, base, at, wt, parts[i], e);
            at += q_elems(parts[i]) * k_dtype_size(wt);
        }
        return st;
    }
    dst->t = p0->dtype;
    dst->group = p0->dtype == K_I8 ? p0->group : p0->block;
    uint64_t w_at, sc_at, code_at = 0;
    dst->w = carve_at(base, off, data, &w_at);
    if (p0->dtype != K_I8 && q_nested_stackable(parts, np))
        return put_nested(dst, parts, np, base, off, w_at, scales, elems, k, deq_elems, e);
    dst->scales = (float *)carve_at(base, off, scales * sizeof(float), &sc_at);
    if (p0->dtype != K_I8)
        dst->code = (float *)carve_at(base, off, 16 * sizeof(float), &code_at);
    if (deq_elems && elems > *deq_elems)
        *deq_elems = elems;
    for (int i = 0; !st && i < np; i++) {
        const k_weight *p = parts[i];
        st = sink_bytes(k, base, w_at, p->data, q_data_bytes(p), e);
        if (!st && p->dtype == K_I8)
            st = sink_bytes(k, base, sc_at, p->scales, q_scale_count(p) * sizeof(float), e);
        else if (!st)
            st = sink_absmax(k, base, sc_at, p, e);
        if (!st && p->dtype != K_I8 && i == 0)
            st = sink_bytes(k, base, code_at, p->code, 16 * sizeof(float), e);
        w_at += q_data_bytes(p);
        sc_at += q_scale_count(p) * sizeof(float);
    }
    return st;
}

/* ---- layout ---- */

/*
 * A norm's weights w [n] as fp32 at a fresh carve (*dst NULL where the
 * model has none): 1 + w where the architecture's norms scale by that
 * (Gemma), added in fp32 as transformers does, so that every CUDA norm
 * multiplies by what it reads.
 */
static engine_status put_norm(float **dst, const k_weight *w, bool offset, char *base, uint64_t *off, uploader *up,
                              err_buf *e)
{
    const size_t n = (size_t)w->rows * w->cols;
    uint64_t at;
    float *d = (float *)carve_at(base, off, n * sizeof(float), &at);
    *dst = w->data ? d : NULL;
    if (!up || !w->data)
        return ENGINE_OK;
    if (!offset)
        return up_tensor(up, base + at, K_F32, w, e);
    float *h = malloc(n * sizeof *h);
    if (!h)
        return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "out of memory");
    for (size_t i = 0; i < n; i++)
        h[i] = 1.0f + k_weight_get(w, i);
    const k_weight hw = {.data = h, .dtype = K_F32, .rows = 1, .cols = (int)n};
    engine_status st = up_tensor(up, base + at, K_F32, &hw, e); /* read into the staging buffer before it returns */
    free(h);
    return st;
}

/* Byte offsets of a placed matrix's arrays from base (0 for those it lacks). */
static gemv_expert mat_offsets(const cuda_mat *d, const char *base)
{
#define OFF(p) ((p) ? (uint64_t)((const char *)(p) - base) : 0)
    return (gemv_expert){OFF(d->w), OFF(d->scales), OFF(d->code), OFF(d->am_q), OFF(d->am_s2), OFF(d->am_code)};
#undef OFF
}

/* Whether two placed matrices have one format: the experts' product reads every expert as expert 0's. */
static bool same_format(const cuda_mat *a, const cuda_mat *b)
{
    return a->t == b->t && a->group == b->group && a->am_shift == b->am_shift && !a->scales == !b->scales &&
           !a->code == !b->code && !a->am_q == !b->am_q && !a->am_s2 == !b->am_s2 && !a->am_code == !b->am_code;
}

/*
 * Experts [x0, x1) of layer l, each gate/up then down. With base set, offs
 * (may be NULL) gets their offsets from base, and they must share a
 * format: the first one's, where set_fmt, sets D's (ex_gu, ex_down).
 */
static engine_status put_expert_range(cuda_model *cm, const engine_model *m, int l, cuda_layer *D, char *base,
                                      uint64_t *off, sink *k, gemv_expert *offs, int x0, int x1, bool set_fmt,
                                      err_buf *e)
{
    const layer_weights *L = &m->layers[l];
    const k_dtype wt = cm->wt;
    engine_status st = ENGINE_OK;
    for (int x = x0; !st && x < x1; x++) {
        const moe_expert *ex = &L->experts[x];
        const k_weight *gu[] = {&ex->w_gate, &ex->w_up}, *down[] = {&ex->w_down};
        cuda_mat g, d;
        st = put_mat(&g, gu, 2, wt, base, off, k, &cm->deq_elems, "an expert's gate/up", e);
        if (!st)
            st = put_mat(&d, down, 1, wt, base, off, k, &cm->deq_elems, "an expert's down projection", e);
        if (st)
            break;
        if (x == x0 && set_fmt) {
            D->ex_gu = g;
            D->ex_down = d;
        } else if (base && (!same_format(&g, &D->ex_gu) || !same_format(&d, &D->ex_down))) {
            return err_set(e, ENGINE_ERR_UNSUPPORTED,
                           "CUDA: the experts of layer %d differ in type or quantization (quantize them alike)", l);
        }
        if (base && offs) {
            offs[2 * x] = mat_offsets(&g, base);
            offs[2 * x + 1] = mat_offsets(&d, base);
        }
    }
    return st;
}

/*
 * An expert layer's MLP matrices, in plan_weights_of's order: the router
 * (the shared expert's gate stacked as its last row), each expert's
 * gate/up and down, the shared expert's; of the experts only the first
 * n_res (a split layer keeps the rest in host memory: split_slot()).
 * With base set, offs (may be NULL) gets each expert's offsets from base.
 */
static engine_status put_experts(cuda_model *cm, const engine_model *m, int l, cuda_layer *D, char *base,
                                 uint64_t *off, sink *k, gemv_expert *offs, int n_res, err_buf *e)
{
    const layer_weights *L = &m->layers[l];
    const k_dtype wt = cm->wt;
    const k_weight *router[] = {&L->router, &L->shared_gate};
    engine_status st = put_mat(&D->router, router, L->shared_gate.data ? 2 : 1, wt, base, off, k, &cm->deq_elems,
                               "the router", e);
    if (!st)
        st = put_expert_range(cm, m, l, D, base, off, k, offs, 0, n_res, true, e);
    if (st)
        return st;
    memset(&D->sh_gu, 0, sizeof D->sh_gu);
    memset(&D->sh_down, 0, sizeof D->sh_down);
    if (!st && L->shared.w_gate.data) {
        const k_weight *gu[] = {&L->shared.w_gate, &L->shared.w_up}, *down[] = {&L->shared.w_down};
        st = put_mat(&D->sh_gu, gu, 2, wt, base, off, k, &cm->deq_elems, "the shared expert's gate/up", e);
        if (!st)
            st = put_mat(&D->sh_down, down, 1, wt, base, off, k, &cm->deq_elems,
                         "the shared expert's down projection", e);
    }
    D->ex_base = base;
    return st;
}

/* Layer l's matrices at base from offset *off (an expert layer's first n_res experts: offs as put_experts). */
static engine_status put_layer_mats(cuda_model *cm, const engine_model *m, int l, cuda_layer *D, char *base,
                                    uint64_t *off, sink *k, gemv_expert *offs, int n_res, err_buf *e)
{
    const layer_weights *L = &m->layers[l];
    const k_dtype wt = cm->wt;
    const k_weight *qkv[] = {&L->wq, &L->wk, &L->wv}, *o[] = {&L->wo}, *gu[] = {&L->w_gate, &L->w_up},
                   *down[] = {&L->w_down};
    D->moe = L->experts != NULL;
    engine_status st = put_mat(&D->wqkv, qkv, 3, wt, base, off, k, &cm->deq_elems, "q/k/v", e);
    if (!st)
        st = put_mat(&D->wo, o, 1, wt, base, off, k, &cm->deq_elems, "the attention output", e);
    if (D->moe) {
        memset(&D->w_gu, 0, sizeof D->w_gu);
        memset(&D->w_down, 0, sizeof D->w_down);
        if (!st)
            st = put_experts(cm, m, l, D, base, off, k, offs, n_res, e);
    } else {
        if (!st)
            st = put_mat(&D->w_gu, gu, 2, wt, base, off, k, &cm->deq_elems, "gate/up", e);
        if (!st)
            st = put_mat(&D->w_down, down, 1, wt, base, off, k, &cm->deq_elems, "the down projection", e);
    }
    *off = (*off + ALIGN - 1) & ~(uint64_t)(ALIGN - 1);
    return st;
}

uint64_t cuda_layer_mats(const cuda_model *cm, const engine_model *m, int l, char *base, cuda_layer *D)
{
    cuda_model scratch = *cm; /* put_mat only raises deq_elems, already at its maximum */
    sink none = {NULL, NULL};
    uint64_t off = 0;
    cuda_layer unused;
    put_layer_mats(&scratch, m, l, D ? D : &unused, base, &off, &none, NULL, m->cfg.n_experts, NULL);
    return off;
}

uint64_t cuda_expert_range_bytes(const cuda_model *cm, const engine_model *m, int l, int x0, int x1)
{
    cuda_model scratch = *cm;
    sink none = {NULL, NULL};
    uint64_t off = 0;
    cuda_layer unused;
    put_expert_range(&scratch, m, l, &unused, NULL, &off, &none, NULL, x0, x1, true, NULL);
    return (off + ALIGN - 1) & ~(uint64_t)(ALIGN - 1);
}

/*
 * A streamed expert layer's experts' offsets from its slot's start: the
 * layout again, from 0, at a stand-in base (nothing is written through it:
 * the sink is empty), since only differences of addresses are kept.
 */
static engine_status slot_offsets(cuda_model *cm, const engine_model *m, int l, gemv_expert *offs, err_buf *e)
{
    static char stand_in[ALIGN] __attribute__((aligned(ALIGN)));
    sink none = {NULL, NULL};
    uint64_t off = 0;
    cuda_layer tmp;
    return put_layer_mats(cm, m, l, &tmp, stand_in, &off, &none, offs, m->cfg.n_experts, e);
}

/*
 * A split expert layer's experts [from, E), which live in host memory: their
 * copies recorded for stream unit si (prompts copy them into a slot), and
 * their offsets from the slot's start into offs, laid out again at a
 * stand-in base as slot_offsets() does, which checks them against the
 * resident experts' format, or with no expert on the device (from 0)
 * gives D theirs.
 */
static engine_status split_slot(cuda_model *cm, const engine_model *m, int l, cuda_layer *D, int from, recorder *rec,
                                int si, gemv_expert *offs, bool offsets, err_buf *e)
{
    static char stand_in[ALIGN] __attribute__((aligned(ALIGN)));
    const int E = m->cfg.n_experts;
    sink to_slot = {NULL, rec}, none = {NULL, NULL};
    uint64_t soff = 0, off = 0;
    if (rec)
        rec->layer = si;
    /* Recorded at offsets from 0 (no base: formats neither set nor compared, a pointer there may be NULL). */
    engine_status st = put_expert_range(cm, m, l, D, NULL, &soff, &to_slot, NULL, from, E, false, e);
    /* At the stand-in base every array is a real pointer: compared with the resident experts' format. */
    if (!st && offsets)
        st = put_expert_range(cm, m, l, D, stand_in, &off, &none, offs, from, E, from == 0, e);
    return st;
}


/*
 * The split layers' host experts in pinned mapped host memory, laid out as
 * in their slot (stream_expert_image), and each split layer's device table
 * pointing its host experts there: decode's products read them over PCIe
 * like resident ones, and the CPU runs none. A table entry is an offset
 * from the layer's base, so a host expert's is its slot offset plus the
 * distance from that base to the layer's part of the image (modulo 2^64,
 * as the product adds it).
 */
static engine_status expert_image(cuda_model *cm, const engine_model *m, err_buf *e)
{
    stream_model *sm = cm->sm;
    engine_status st = stream_expert_image(sm, m->n_threads, e);
    char *dev = NULL;
    if (!st && cudaHostGetDevicePointer((void **)&dev, sm->ex_image, 0) != cudaSuccess)
        st = err_set(e, ENGINE_ERR_CUDA, "CUDA: host experts' memory has no device address");
    const int E = m->cfg.n_experts;
    const size_t tb = 2 * (size_t)E * sizeof(gemv_expert);
    gemv_expert *t = st ? NULL : malloc(tb);
    if (!st && !t)
        st = err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "out of memory");
    for (int l = 0; !st && l < m->cfg.n_layers; l++) {
        cuda_layer *D = &cm->layers[l];
        const int si = sm->index[l];
        if (si < 0 || !sm->split[si])
            continue;
        const gemv_expert *offs = cm->ex_offs + (size_t)l * 2 * E;
        const uint64_t delta = (uint64_t)(uintptr_t)(dev + sm->ex_image_at[si]) - (uint64_t)(uintptr_t)D->ex_base;
        for (int x = 0; x < E; x++)
            for (int d = 0; d < 2; d++) {
                gemv_expert g = offs[2 * x + d];
                if (x >= D->ex_resident) {
                    g.w += delta, g.scales += delta, g.code += delta;
                    g.am_q += delta, g.am_s2 += delta, g.am_code += delta;
                }
                t[(size_t)d * E + x] = g;
            }
        if (cudaMemcpy((void *)D->ex_table, t, tb, cudaMemcpyHostToDevice) != cudaSuccess)
            st = err_set(e, ENGINE_ERR_CUDA, "CUDA: the host experts' table: %s", cudaGetErrorString(cudaGetLastError()));
        D->ex_host_gpu = true;
    }
    free(t);
    return st;
}

/*
 * Lay out every resident weight at base (and with up, upload it); with rec,
 * record the streamed layers' copies. Every part (embeddings, head, a
 * layer's matrices, its norms and biases) ends ALIGN-padded, as
 * plan_weights_of() counts them. Returns the resident bytes.
 */
static engine_status place(cuda_model *cm, const engine_model *m, char *base, uploader *up, recorder *rec,
                           uint64_t *bytes, err_buf *e)
{
    const cfg_model *c = &m->cfg;
    const k_dtype wt = cm->wt;
    const int qd = c->n_heads * c->head_dim, kvd = c->n_kv_heads * c->head_dim;
    const stream_model *sm = cm->sm;
    sink res = {up, NULL};
    uint64_t off = 0, at;
    engine_status st = ENGINE_OK;
#define PAD() (off = (off + ALIGN - 1) & ~(uint64_t)(ALIGN - 1))
/* Place a matrix or vector and upload it (vectors as fp32). */
#define PUT(dst, w, type)                                                                        \
    do {                                                                                         \
        dst = (void *)carve_at(base, &off, (uint64_t)(w)->rows * (w)->cols * k_dtype_size(type), &at); \
        if (!st)                                                                                 \
            st = sink_tensor(&res, base, at, type, w, e);                                        \
    } while (0)
/* Several tensors stacked by rows into one; a part without data is zeros (biases). */
#define PUT_STACK(dst, type, ...)                                                                \
    do {                                                                                         \
        const k_weight *parts_[] = {__VA_ARGS__};                                                \
        const int np_ = (int)(sizeof parts_ / sizeof parts_[0]);                                 \
        bool any_ = false;                                                                       \
        uint64_t n_ = 0;                                                                         \
        for (int i_ = 0; i_ < np_; i_++) {                                                       \
            any_ = any_ || parts_[i_]->data;                                                     \
            n_ += (uint64_t)parts_[i_]->rows * parts_[i_]->cols;                                 \
        }                                                                                        \
        dst = NULL;                                                                              \
        if (any_) {                                                                              \
            dst = (void *)carve_at(base, &off, n_ * k_dtype_size(type), &at);                    \
            for (int i_ = 0; up && !st && i_ < np_; i_++) {                                      \
                const size_t b_ = (size_t)parts_[i_]->rows * parts_[i_]->cols * k_dtype_size(type); \
                if (parts_[i_]->data)                                                            \
                    st = up_tensor(up, base + at, type, parts_[i_], e);                          \
                else if (cudaMemsetAsync(base + at, 0, b_, up->stream) != cudaSuccess)          \
                    st = err_set(e, ENGINE_ERR_CUDA, "weight upload: memset failed");           \
                at += b_;                                                                        \
            }                                                                                    \
        }                                                                                        \
    } while (0)

    cm->deq_elems = 0;
    cm->emb_t = wt;
    if (sm && sm->emb_host) {
        cm->tok_emb = NULL; /* read from host memory as stored: stream_emb_pointer() */
        cm->emb_t = m->tok_emb.dtype;
    } else {
        PUT(cm->tok_emb, &m->tok_emb, wt);
    }
    PAD();
    if (sm && sm->head_blocks > 0) {
        cm->lm_head = (cuda_mat){.w = NULL, .t = wt}; /* streamed: its row blocks are recorded below */
    } else if (m->lm_head.data == m->tok_emb.data) {
        cm->lm_head = (cuda_mat){.w = cm->tok_emb, .t = wt};
    } else if (!st) {
        const k_weight *head[] = {&m->lm_head};
        st = put_mat(&cm->lm_head, head, 1, wt, base, &off, &res, NULL, "the output head", e); /* never decoded: as plan.c */
    }
    const bool offset = m->arch->norm_offset;
    if (!st)
        st = put_norm(&cm->out_norm, &m->out_norm, offset, base, &off, up, e);
    PAD();
    for (int l = 0; l < c->n_layers && !st; l++) {
        const layer_weights *L = &m->layers[l];
        cuda_layer *D = &cm->layers[l];
        const int si = sm ? sm->index[l] : -1;
        gemv_expert *offs = L->experts ? cm->ex_offs + (size_t)l * 2 * c->n_experts : NULL;
        /* A split expert layer (stream_model.split): resident but for its experts from `from` on. */
        const bool split = si >= 0 && sm->split[si];
        const int from = split ? sm->ex_from[l] : c->n_experts;
        D->ex_resident = L->experts ? from : 0;
        D->ex_slot = NULL;
        D->ex_host_gpu = false;
        if (si >= 0 && !split) {
            /* Its matrices go to a slot at offsets from 0 (sized by stream_model_open): recorded, not uploaded. */
            sink to_slot = {NULL, rec};
            uint64_t soff = 0;
            if (rec)
                rec->layer = si;
            st = put_layer_mats(cm, m, l, D, NULL, &soff, &to_slot, NULL, c->n_experts, e);
            if (!st && offs && base)
                st = slot_offsets(cm, m, l, offs, e);
        } else {
            st = put_layer_mats(cm, m, l, D, base, &off, &res, offs, from, e);
            if (!st && split)
                st = split_slot(cm, m, l, D, from, rec, si, offs, offs && base, e);
        }
        /* Biases absent from a stacked set are zero-filled rows of the right size. */
        k_weight zq = {NULL, K_F32, 1, qd}, zkv = {NULL, K_F32, 1, kvd}, zf = {NULL, K_F32, 1, c->ffn_dim};
        /* In plan_weights_of's order; a norm the model lacks takes no bytes. */
        const k_weight *norms[] = {&L->attn_norm, &L->ffn_norm, &L->attn_post_norm, &L->ffn_post_norm, &L->q_norm,
                                   &L->k_norm};
        float **dnorms[] = {&D->attn_norm, &D->ffn_norm, &D->attn_post_norm, &D->ffn_post_norm, &D->q_norm,
                            &D->k_norm};
        for (size_t i = 0; i < sizeof norms / sizeof norms[0] && !st; i++)
            st = put_norm(dnorms[i], norms[i], offset, base, &off, up, e);
        PUT_STACK(D->b_qkv, K_F32, L->bq.data ? &L->bq : &zq, L->bk.data ? &L->bk : &zkv,
                  L->bv.data ? &L->bv : &zkv);
        D->b_o = NULL;
        if (L->bo.data)
            PUT(D->b_o, &L->bo, K_F32);
        PUT_STACK(D->b_gu, K_F32, L->b_gate.data ? &L->b_gate : &zf, L->b_up.data ? &L->b_up : &zf);
        D->b_down = NULL;
        if (L->b_down.data)
            PUT(D->b_down, &L->b_down, K_F32);
        /* The experts' offsets, read by the decode product: resident wherever the matrices are. */
        D->ex_off = offs;
        D->ex_table = NULL;
        if (offs) {
            const uint64_t tb = 2 * (uint64_t)c->n_experts * sizeof(gemv_expert);
            D->ex_table = (const gemv_expert *)carve_at(base, &off, tb, &at);
            /* On the device one table a matrix, as the decode product indexes it by expert: every
             * expert's gate/up, then every expert's down; the experts a split layer keeps in host
             * memory marked absent, so that the product skips them. */
            gemv_expert *t = st ? NULL : malloc(tb);
            if (!st && !t)
                st = err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "out of memory");
            for (int x = 0; t && x < c->n_experts; x++) {
                const bool here = x < from;
                t[x] = here ? offs[2 * x] : (gemv_expert){.w = GEMV_EXPERT_ABSENT};
                t[c->n_experts + x] = here ? offs[2 * x + 1] : (gemv_expert){.w = GEMV_EXPERT_ABSENT};
            }
            if (t)
                st = sink_bytes(&res, base, at, t, tb, e); /* copied before it returns */
            free(t);
        }
        PAD();
    }
    /* A streamed head: row blocks of a slot's size, each recorded as a unit after the layers. */
    for (int b = 0; sm && b < sm->head_blocks && !st; b++) {
        const int r0 = b * sm->head_rows;
        const int nr = c->vocab_size - r0 < sm->head_rows ? c->vocab_size - r0 : sm->head_rows;
        k_weight part = m->lm_head;
        part.data = (const char *)m->lm_head.data + (size_t)r0 * c->dim * k_dtype_size(m->lm_head.dtype);
        part.rows = nr;
        sink to_slot = {NULL, rec};
        if (rec)
            rec->layer = sm->n + b;
        st = sink_tensor(&to_slot, NULL, 0, wt, &part, e);
    }
#undef PUT
#undef PUT_STACK
#undef PAD
    *bytes = off;
    return st;
}

/*
 * Device bytes a budget must leave to the CUDA context and the runtime:
 * what is in use once the context exists (the context itself, and
 * anything else on the device), rounded up to the arena's unit, plus what
 * the runtime allocates later outside the arena (kernel modules loaded on
 * first launch, the cuBLASLt handle, graphs).
 */
static engine_status measure_reserve(uint64_t *reserve, size_t *free_out, err_buf *e)
{
    size_t free_b = 0, total_b = 0;
    cudaError_t ce = cudaFree(NULL); /* creates the context now, so free memory below is net of it */
    if (ce == cudaSuccess)
        ce = cudaMemGetInfo(&free_b, &total_b);
    if (ce != cudaSuccess)
        return err_set(e, ENGINE_ERR_CUDA, "CUDA device: %s", cudaGetErrorString(ce));
    const uint64_t used = (uint64_t)(total_b - free_b), g = PLAN_GRANULARITY;
    *reserve = (used + g - 1) / g * g + RUNTIME_RESERVE;
    if (free_out)
        *free_out = free_b;
    return ENGINE_OK;
}

engine_status cuda_device_reserve(uint64_t *bytes, err_buf *e)
{
    return measure_reserve(bytes, NULL, e);
}

const engine_plan *cuda_model_plan(const cuda_model *cm)
{
    return cm ? cm->plan : NULL;
}

/* Plan the placement for the arena's budget; refuse what the plan refuses or this backend cannot do. */
static engine_status plan_placement(cuda_model *cm, engine_model *m, uint64_t plan_budget, err_buf *e)
{
    engine_plan_params pp = engine_plan_default_params();
    pp.vram_budget = plan_budget;
    pp.n_ctx = m->plan_ctx;
    pp.kv_type = m->kv_type;
    pp.cuda_context_bytes = cm->reserve;
    pp.min_layers_streamed = m->min_streamed;
    pp.moe_cpu = m->moe_cpu;
    pp.moe_host = m->moe_host;
    pp.expert_cache = m->expert_cache;
    cuda_plan_bandwidths(&pp, m, plan_budget - cm->reserve); /* this device's, measured (measure.c) */
    char msg[ERR_MSG_MAX] = "";
    engine_status st = engine_plan_create(m, &pp, &cm->plan, msg, sizeof msg);
    if (st)
        return err_set(e, st, "%s", msg);
    /* Streamed layers: plan again knowing how fast this CPU would compute one. */
    const int streamed = engine_plan_get_totals(cm->plan)->n_layers_streamed;
    /* Likewise where experts stay in host memory: the CPU runs a token's picks among them. */
    const bool host_experts = engine_plan_get_totals(cm->plan)->n_experts_host > 0;
    if (((streamed > 0 && m->host_layers != 0) || host_experts) &&
        engine_host_layer_rate(m, &pp.host_gbps) == ENGINE_OK) {
        pp.host_layers = m->host_layers;
        cuda_plan_shared(&pp, m, plan_budget - cm->reserve); /* copies and CPU share host memory */
        engine_plan_free(cm->plan);
        cm->plan = NULL;
        st = engine_plan_create(m, &pp, &cm->plan, msg, sizeof msg);
        if (st)
            return err_set(e, st, "%s", msg);
        model_log(m, ENGINE_LOG_INFO, "CUDA: this CPU computes a layer at %.1f GB/s with %d threads: %d of the %d "
                  "streamed layers are computed on it for decode", pp.host_gbps, model_host_threads(m),
                  engine_plan_get_totals(cm->plan)->n_layers_host, streamed);
    }
    const size_t n = engine_plan_n_entries(cm->plan);
    if (engine_plan_entry_at(cm->plan, n - 1)->placement == ENGINE_PLACE_STREAMED &&
        k_dtype_is_quant(m->lm_head.dtype))
        return err_set(e, ENGINE_ERR_UNSUPPORTED,
                       "%s; streaming a quantized output head is not implemented on CUDA (a larger budget or a "
                       "shorter --ctx keeps it resident)", engine_plan_summary(cm->plan));
    return ENGINE_OK;
}

/* The device, the capability acted on and each op's path, once per model (info). */
static void log_paths(const engine_model *m, const cuda_model *cm)
{
    const cuda_caps *k = &cm->caps;
    char cap[64] = "";
    if (k->cap_cc)
        snprintf(cap, sizeof cap, ", ENGINE_CUDA_CC=%d", k->cap_cc);
    model_log(m, ENGINE_LOG_INFO, "CUDA: %s, compute capability %d.%d, code for %d.%d%s: paths for %d.%d", k->name,
              k->device_cc / 10, k->device_cc % 10, k->code_cc / 10, k->code_cc % 10, cap, k->cc / 10, k->cc % 10);
    for (int op = 0; op < K_OP_COUNT; op++)
        model_log(m, ENGINE_LOG_INFO, "CUDA:   %s: %s", launch_path_op((k_op)op), launch_path_name(&cm->paths, (k_op)op));
}

engine_status cuda_model_create(engine_model *m, uint64_t budget, cuda_model **out, err_buf *e)
{
    *out = NULL;
    cuda_model *cm = calloc(1, sizeof *cm);
    if (!cm)
        return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "out of memory");
    cm->layers = calloc((size_t)m->cfg.n_layers, sizeof *cm->layers);
    if (m->cfg.n_experts > 0)
        cm->ex_offs = calloc((size_t)m->cfg.n_layers * 2 * (size_t)m->cfg.n_experts, sizeof *cm->ex_offs);
    if (!cm->layers || (m->cfg.n_experts > 0 && !cm->ex_offs)) {
        free(cm->layers);
        free(cm->ex_offs);
        free(cm);
        return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "out of memory");
    }
    size_t free_b = 0;
    char why[256] = "";
    cudaError_t ce = cudaGetDevice(&cm->device);
    if (ce == cudaSuccess)
        ce = cudaDeviceGetAttribute(&cm->n_sms, cudaDevAttrMultiProcessorCount, cm->device);
    engine_status st = ce == cudaSuccess ? ENGINE_OK
                                         : err_set(e, ENGINE_ERR_CUDA, "CUDA device: %s", cudaGetErrorString(ce));
    if (!st && launch_caps(cm->device, &cm->caps, why, sizeof why) != 0)
        st = err_set(e, ENGINE_ERR_UNSUPPORTED, "CUDA device: %s", why);
    if (!st)
        launch_paths(&cm->paths, &cm->caps);
    if (!st)
        st = measure_reserve(&cm->reserve, &free_b, e);
    if (st) {
        cuda_model_free(cm);
        return st;
    }
    log_paths(m, cm);
    /* The budget covers everything on the device: the arena gets what the context leaves. */
    uint64_t arena_budget;
    if (budget == 0) {
        arena_budget = free_b > BUDGET_MARGIN ? free_b - BUDGET_MARGIN : 0;
        budget = arena_budget + cm->reserve;
    } else if (budget <= cm->reserve) {
        const uint64_t reserve = cm->reserve;
        cuda_model_free(cm);
        return err_set(e, ENGINE_ERR_OVER_BUDGET,
                       "the budget of %.1f MiB is below the %.1f MiB the CUDA context and runtime take on this device",
                       budget / 1048576.0, reserve / 1048576.0);
    } else {
        arena_budget = budget - cm->reserve;
        if (arena_budget > free_b)
            model_log(m, ENGINE_LOG_WARN, "the budget of %.2f GiB is above the %.2f GiB the device has free",
                      budget / 1073741824.0, (free_b + cm->reserve) / 1073741824.0);
    }
    /* The dense type; quantized matrices keep their own. Without bf16
     * products (before 8.0), bf16 weights become fp16 as they are uploaded:
     * the same bytes, 3 more mantissa bits, a range to 65504 that each
     * converted tensor is checked against (convert()). */
    cm->wt = m->tok_emb.dtype;
    if (cm->wt == K_BF16 && !cuda_takes_fast(cm, K_OP_BF16))
        cm->wt = K_F16;
    st = plan_placement(cm, m, budget, e);
    if (!st)
        st = arena_create(arena_budget, getenv("ENGINE_ARENA_PLAIN") != NULL, &cm->arena, e);
    const double pin_t0 = trace_now(m->trace);
    if (!st)
        st = stream_model_open(cm, m, cm->plan, e);
    if (m->trace && cm->sm)
        trace_span(m->trace, m->trace_tid, "pin mappings", "load", pin_t0, trace_now(m->trace) - pin_t0);
    /* Size the resident region and the streamed layers' host image, then fill both. */
    recorder rec = {cm->sm, 0, false, 0, m->n_threads};
    uint64_t bytes = 0;
    if (!st)
        st = place(cm, m, NULL, NULL, cm->sm ? &rec : NULL, &bytes, e);
    if (!st && cm->sm && rec.img_off > 0) {
        ce = cudaHostAlloc((void **)&cm->sm->image, rec.img_off, cudaHostAllocPortable);
        if (ce != cudaSuccess)
            st = err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "pinning %.1f MiB of host memory for streamed layers: %s",
                         rec.img_off / 1048576.0, cudaGetErrorString(ce));
        cm->sm->image_bytes = rec.img_off;
        cm->sm->pinned += rec.img_off;
    }
    if (!st)
        st = arena_alloc(cm->arena, bytes, ARENA_WEIGHTS, "the weights", &cm->weights, e);
    if (st) {
        cuda_model_free(cm);
        return st;
    }
    cm->weight_bytes = bytes;
    const double t0 = model_seconds(), up_t0 = trace_now(m->trace);
    uploader up;
    rec.fill = true;
    rec.img_off = 0;
    st = up_open(&up, m->n_threads, e);
    if (!st)
        st = place(cm, m, cm->weights, &up, cm->sm ? &rec : NULL, &bytes, e);
    up_close(&up);
    if (m->trace)
        trace_span(m->trace, m->trace_tid, "upload", "load", up_t0, trace_now(m->trace) - up_t0);
    if (!st && cm->sm && cm->sm->emb_host)
        st = stream_emb_pointer(cm->sm, &m->tok_emb, &cm->tok_emb, e);
    if (!st && cm->sm && cm->sm->n_split > 0 && engine_plan_get_totals(cm->plan)->experts_host_gpu)
        st = expert_image(cm, m, e);
    if (!st)
        st = expert_slots_open(cm, m, e);
    if (!st && (ce = cudaGetLastError()) != cudaSuccess)
        st = err_set(e, ENGINE_ERR_CUDA, "weight upload: %s", cudaGetErrorString(ce));
    if (st) {
        cuda_model_free(cm);
        return st;
    }
    cm->upload_seconds = model_seconds() - t0;
    arena_stats as;
    arena_get_stats(cm->arena, &as);
    model_log(m, ENGINE_LOG_INFO, "CUDA: %.2f GiB of weights uploaded in %.2f s (%.1f GB/s); budget %.2f GiB%s",
              bytes / 1073741824.0, cm->upload_seconds, bytes / 1e9 / (cm->upload_seconds + 1e-9),
              as.budget / 1073741824.0, as.vmm ? "" : " (one plain allocation: no virtual memory management)");
    model_log(m, ENGINE_LOG_INFO, "CUDA: %s", engine_plan_summary(cm->plan));
    if (cm->sm)
        model_log(m, ENGINE_LOG_INFO, "CUDA: %d layers streamed, %d with experts in host memory, %.2f GiB of host "
                  "memory pinned (%.2f GiB of it converted copies), %.2f GiB reserved for the CUDA context",
                  cm->sm->n - cm->sm->n_split, cm->sm->n_split, cm->sm->pinned / 1073741824.0, cm->sm->image_bytes / 1073741824.0,
                  cm->reserve / 1073741824.0);
    *out = cm;
    return ENGINE_OK;
}

void cuda_model_free(cuda_model *cm)
{
    if (!cm)
        return;
    expert_slots_free(cm);
    if (cm->arena) {
        arena_free(cm->arena, cm->weights);
        arena_destroy(cm->arena);
    }
    stream_model_free(cm->sm);
    engine_plan_free(cm->plan);
    free(cm->layers);
    free(cm->ex_offs);
    free(cm);
}
