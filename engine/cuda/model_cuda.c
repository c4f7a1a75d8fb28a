/*
 * model_cuda.c: a model's weights on the device. The arena is reserved
 * from the budget, one region is sized for every weight (laid out once,
 * 256-byte aligned), and the tensors are streamed from the file mapping
 * through two pinned staging buffers: threads copy (or convert) one buffer
 * while the other crosses PCIe.
 */
#define _POSIX_C_SOURCE 200809L

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../kernels/cpu/dtype.h"
#include "../../quant/quant.h"
#include "state.h"

#define ALIGN 256
#define STAGE_BYTES ((size_t)64 << 20)
#define BUDGET_MARGIN ((uint64_t)512 << 20) /* left to the driver and cuBLASLt when no budget is given */

bool cuda_available(char *why, size_t why_size)
{
    int n = 0;
    cudaError_t ce = cudaGetDeviceCount(&n);
    if (ce != cudaSuccess || n == 0) {
        snprintf(why, why_size, "%s", ce != cudaSuccess ? cudaGetErrorString(ce) : "no CUDA device");
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

/* Element i of src as dst type `to`, written at out[i]. */
static void convert(void *out, k_dtype to, const k_weight *src, size_t first, size_t n, int n_threads)
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
        return;
    }
#pragma omp parallel for num_threads(n_threads) schedule(static)
    for (size_t i = 0; i < n; i++) {
        float v = k_weight_get(src, first + i);
        if (to == K_F32)
            ((float *)out)[i] = v;
        else if (to == K_F16)
            ((uint16_t *)out)[i] = f32_to_f16(v);
        else
            ((uint16_t *)out)[i] = f32_to_bf16(v);
    }
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
            convert(u->stage[b], to, src, done, n, u->n_threads);
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

/*
 * Place (and with up, upload) the parts stacked by rows into one matrix:
 * dense in wt, or quantized as they are. Quantized parts must share a type,
 * a group and a code table, and 4-bit parts must each hold whole blocks.
 */
static engine_status put_mat(cuda_mat *dst, const k_weight *const *parts, int np, k_dtype wt, char *base,
                             uint64_t *off, uploader *up, uint64_t *deq_elems, const char *what, err_buf *e)
{
    const k_weight *p0 = parts[0];
    memset(dst, 0, sizeof *dst);
    uint64_t elems = 0, data = 0, scales = 0;
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
        char *at = carve(base, off, elems * k_dtype_size(wt), ALIGN);
        dst->w = at;
        for (int i = 0; up && !st && i < np; i++) {
            st = up_tensor(up, at, wt, parts[i], e);
            at += q_elems(parts[i]) * k_dtype_size(wt);
        }
        return st;
    }
    dst->t = p0->dtype;
    dst->group = p0->dtype == K_I8 ? p0->group : p0->block;
    char *w = carve(base, off, data, ALIGN), *sc = carve(base, off, scales * sizeof(float), ALIGN);
    dst->w = w;
    dst->scales = (float *)sc;
    if (p0->dtype != K_I8)
        dst->code = carve(base, off, 16 * sizeof(float), ALIGN);
    if (elems > *deq_elems)
        *deq_elems = elems;
    for (int i = 0; up && !st && i < np; i++) {
        const k_weight *p = parts[i];
        st = up_bytes(up, w, p->data, q_data_bytes(p), e);
        if (!st && p->dtype == K_I8) {
            st = up_bytes(up, sc, p->scales, q_scale_count(p) * sizeof(float), e);
        } else if (!st) {
            float *am = q_absmax_f32(p); /* copied into the staging buffers before up_bytes returns */
            st = am ? up_bytes(up, sc, am, q_scale_count(p) * sizeof(float), e)
                    : err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "out of memory");
            free(am);
            if (!st && i == 0)
                st = up_bytes(up, dst->code, p->code, 16 * sizeof(float), e);
        }
        w += q_data_bytes(p);
        sc += q_scale_count(p) * sizeof(float);
    }
    return st;
}

/* ---- layout ---- */

/* Lay out (and with up != NULL, upload) every weight; returns the bytes needed. */
static engine_status place(cuda_model *cm, const engine_model *m, char *base, uploader *up, uint64_t *bytes,
                           err_buf *e)
{
    const cfg_model *c = &m->cfg;
    const k_dtype wt = cm->wt;
    const int qd = c->n_heads * c->head_dim, kvd = c->n_kv_heads * c->head_dim;
    uint64_t off = 0;
    engine_status st = ENGINE_OK;
/* Place a matrix or vector and upload it (vectors as fp32). */
#define PUT(dst, w, type)                                                                      \
    do {                                                                                       \
        void *p_ = carve(base, &off, (uint64_t)(w)->rows * (w)->cols * k_dtype_size(type), ALIGN);   \
        dst = p_;                                                                              \
        if (up && !st)                                                                         \
            st = up_tensor(up, p_, type, w, e);                                                \
    } while (0)
/* Several tensors stacked by rows into one; a part without data is zeros (biases). */
#define PUT_STACK(dst, type, ...)                                                              \
    do {                                                                                       \
        const k_weight *parts_[] = {__VA_ARGS__};                                              \
        const int np_ = (int)(sizeof parts_ / sizeof parts_[0]);                               \
        bool any_ = false;                                                                     \
        uint64_t n_ = 0;                                                                       \
        for (int i_ = 0; i_ < np_; i_++) {                                                     \
            any_ = any_ || parts_[i_]->data;                                                   \
            n_ += (uint64_t)parts_[i_]->rows * parts_[i_]->cols;                               \
        }                                                                                      \
        dst = NULL;                                                                            \
        if (any_) {                                                                            \
            char *p_ = carve(base, &off, n_ * k_dtype_size(type), ALIGN);                             \
            dst = (void *)p_;                                                                  \
            for (int i_ = 0; up && !st && i_ < np_; i_++) {                                    \
                const size_t b_ = (size_t)parts_[i_]->rows * parts_[i_]->cols * k_dtype_size(type); \
                if (parts_[i_]->data)                                                          \
                    st = up_tensor(up, p_, type, parts_[i_], e);                               \
                else if (cudaMemsetAsync(p_, 0, b_, up->stream) != cudaSuccess)                \
                    st = err_set(e, ENGINE_ERR_CUDA, "weight upload: memset failed");         \
                p_ += b_;                                                                      \
            }                                                                                  \
        }                                                                                      \
    } while (0)

#define PUT_MAT(dst, what, ...)                                                                    \
    do {                                                                                           \
        const k_weight *parts_[] = {__VA_ARGS__};                                                  \
        if (!st)                                                                                   \
            st = put_mat(&(dst), parts_, (int)(sizeof parts_ / sizeof parts_[0]), wt, base, &off, up, \
                         &cm->deq_elems, what, e);                                                 \
    } while (0)
    cm->deq_elems = 0;
    PUT(cm->tok_emb, &m->tok_emb, wt);
    if (m->lm_head.data == m->tok_emb.data)
        cm->lm_head = (cuda_mat){.w = cm->tok_emb, .t = wt};
    else
        PUT_MAT(cm->lm_head, "the output head", &m->lm_head);
    PUT(cm->out_norm, &m->out_norm, K_F32);
    for (int l = 0; l < c->n_layers; l++) {
        const layer_weights *L = &m->layers[l];
        cuda_layer *D = &cm->layers[l];
        /* Biases absent from a stacked set are zero-filled rows of the right size. */
        k_weight zq = {NULL, K_F32, 1, qd}, zkv = {NULL, K_F32, 1, kvd}, zf = {NULL, K_F32, 1, c->ffn_dim};
        PUT_MAT(D->wqkv, "q/k/v", &L->wq, &L->wk, &L->wv);
        PUT_MAT(D->wo, "the attention output", &L->wo);
        PUT_MAT(D->w_gu, "gate/up", &L->w_gate, &L->w_up);
        PUT_MAT(D->w_down, "the down projection", &L->w_down);
        PUT(D->attn_norm, &L->attn_norm, K_F32);
        PUT(D->ffn_norm, &L->ffn_norm, K_F32);
        D->q_norm = D->k_norm = NULL;
        if (L->q_norm.data) {
            PUT(D->q_norm, &L->q_norm, K_F32);
            PUT(D->k_norm, &L->k_norm, K_F32);
        }
        PUT_STACK(D->b_qkv, K_F32, L->bq.data ? &L->bq : &zq, L->bk.data ? &L->bk : &zkv,
                  L->bv.data ? &L->bv : &zkv);
        D->b_o = NULL;
        if (L->bo.data)
            PUT(D->b_o, &L->bo, K_F32);
        PUT_STACK(D->b_gu, K_F32, L->b_gate.data ? &L->b_gate : &zf, L->b_up.data ? &L->b_up : &zf);
        D->b_down = NULL;
        if (L->b_down.data)
            PUT(D->b_down, &L->b_down, K_F32);
    }
#undef PUT
#undef PUT_STACK
#undef PUT_MAT
    *bytes = off;
    return st;
}

static double seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

engine_status cuda_model_create(engine_model *m, uint64_t budget, cuda_model **out, err_buf *e)
{
    *out = NULL;
    cuda_model *cm = calloc(1, sizeof *cm);
    if (!cm)
        return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "out of memory");
    cm->layers = calloc((size_t)m->cfg.n_layers, sizeof *cm->layers);
    if (!cm->layers) {
        free(cm);
        return err_set(e, ENGINE_ERR_OUT_OF_MEMORY, "out of memory");
    }
    engine_status st = ENGINE_OK;
    cudaError_t ce = cudaGetDevice(&cm->device);
    if (ce == cudaSuccess)
        ce = cudaFree(NULL); /* creates the context now, so free memory below is net of it */
    if (ce == cudaSuccess)
        ce = cudaDeviceGetAttribute(&cm->n_sms, cudaDevAttrMultiProcessorCount, cm->device);
    size_t free_b = 0, total_b = 0;
    if (ce == cudaSuccess)
        ce = cudaMemGetInfo(&free_b, &total_b);
    if (ce != cudaSuccess) {
        cuda_model_free(cm);
        return err_set(e, ENGINE_ERR_CUDA, "CUDA device: %s", cudaGetErrorString(ce));
    }
    if (budget == 0)
        budget = free_b > BUDGET_MARGIN ? free_b - BUDGET_MARGIN : 0;
    else if (budget > free_b)
        model_log(m, ENGINE_LOG_WARN, "the budget of %.2f GiB is above the %.2f GiB the device has free",
                  budget / 1073741824.0, free_b / 1073741824.0);
    st = arena_create(budget, getenv("ENGINE_ARENA_PLAIN") != NULL, &cm->arena, e);
    if (st) {
        cuda_model_free(cm);
        return st;
    }
    cm->wt = m->tok_emb.dtype; /* the dense type; quantized matrices keep their own */
    uint64_t bytes = 0;
    st = place(cm, m, NULL, NULL, &bytes, e);
    if (!st)
        st = arena_alloc(cm->arena, bytes, ARENA_WEIGHTS, "the weights", &cm->weights, e);
    if (st) {
        cuda_model_free(cm);
        return st;
    }
    cm->weight_bytes = bytes;
    const double t0 = seconds();
    uploader up;
    st = up_open(&up, m->n_threads, e);
    if (!st)
        st = place(cm, m, cm->weights, &up, &bytes, e);
    up_close(&up);
    if (!st && (ce = cudaGetLastError()) != cudaSuccess)
        st = err_set(e, ENGINE_ERR_CUDA, "weight upload: %s", cudaGetErrorString(ce));
    if (st) {
        cuda_model_free(cm);
        return st;
    }
    cm->upload_seconds = seconds() - t0;
    arena_stats as;
    arena_get_stats(cm->arena, &as);
    model_log(m, ENGINE_LOG_INFO, "CUDA: %.2f GiB of weights uploaded in %.2f s (%.1f GB/s); budget %.2f GiB%s",
              bytes / 1073741824.0, cm->upload_seconds, bytes / 1e9 / (cm->upload_seconds + 1e-9),
              as.budget / 1073741824.0, as.vmm ? "" : " (one plain allocation: no virtual memory management)");
    *out = cm;
    return ENGINE_OK;
}

void cuda_model_free(cuda_model *cm)
{
    if (!cm)
        return;
    if (cm->arena) {
        arena_free(cm->arena, cm->weights);
        arena_destroy(cm->arena);
    }
    free(cm->layers);
    free(cm);
}
