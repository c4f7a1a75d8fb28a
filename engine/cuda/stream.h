/*
 * stream.h: layers kept in host memory and streamed to the GPU when a pass
 * needs them (the offload plan's "streamed" placement).
 *
 * The model side (stream_model) knows, for each streamed layer, the list of
 * host-to-device copies that rebuild its four matrices in the device
 * layout: straight from the file mapping, pinned with cudaHostRegister,
 * where the file's bytes are the device's bytes, otherwise from a pinned
 * host copy converted once at load. Norms and biases stay resident.
 *
 * The session side (stream_session) owns the device slots the layers are
 * copied into, a copy stream and the events that order it against the
 * compute stream. The i-th layer copied in a pass uses slot i % n_slots,
 * the same in every pass of a kind, so the decode step can be captured
 * once as a CUDA graph with its copies in it:
 *
 *   copy stream:    [copy 0][copy 1]      [copy 2]      [copy 3] ...
 *   compute stream:         [layer 0]  [layer 1]  [layer 2] ...
 *                                  free 0 ─┘ (copy 2 reuses slot 0)
 *
 * Copy i + n_slots waits for the event "layer i done with its slot";
 * layer i waits for "copy i done". With two slots, layer i+1 uploads while
 * layer i computes.
 *
 * Layers the plan places on the host (ENGINE_PLACE_HOST) are streamed like
 * the others for prompts but skipped by decode, whose CPU computes them
 * (host_layers.h): each kind of pass has its own order of copies, and
 * i above is the position in that order. The slots' pointers are set for
 * a kind when a pass of that kind begins (the decode graph keeps those it
 * was captured with).
 */
#ifndef ENGINE_CUDA_STREAM_H
#define ENGINE_CUDA_STREAM_H

#include "state.h"

/* One host-to-device copy: dst is an offset into the layer's slot. */
typedef struct stream_copy {
    uint64_t dst;
    const void *src; /* pinned: a registered mapping or the host image */
    uint64_t bytes;
} stream_copy;

typedef struct stream_range {
    const void *p;
    size_t len;
} stream_range;

typedef struct stream_model {
    int n;                /* layers streamed                                    */
    int n_units;          /* what streams through the slots: the n layers, then
                             head_blocks row blocks of the output head          */
    int head_blocks;      /* 0: the head is resident                            */
    int head_rows;        /* rows of the head a block (the last may have fewer) */
    int head_total;       /* rows of the head                                   */
    int n_slots;          /* device slots a session cycles them through         */
    int *index;           /* [n_layers]: position among the streamed, or -1     */
    int *layer_of;        /* [n_units]: the layer, -1 for a head block          */
    bool *hosted;         /* [n_units]: computed on the host for decode         */
    int n_hosted;         /* of them whole layers (ENGINE_PLACE_HOST)           */
    bool *split;          /* [n_units]: a split expert layer's host experts: the
                             layer is resident, its experts from ex_from[l] on
                             are computed by the CPU in decode (hosted too) and
                             copied to a slot for prompts                       */
    int n_split;
    int *ex_from;         /* [n_layers]: a layer's first expert in host memory
                             (n_experts: none; 0 for a dense layer)             */
    uint64_t slot_bytes;  /* the largest streamed layer's matrices, padded      */
    uint64_t *bytes;      /* [n_units] bytes copied for each                    */
    stream_copy *copies;  /* every copy, unit by unit                           */
    int *first;           /* [n_units + 1] unit i's copies: copies[first[i] .. first[i+1]) */
    int n_copies, cap_copies;
    stream_range *reg;    /* file mappings pinned with cudaHostRegister          */
    int n_reg;
    char *image;          /* pinned host copies of what the mapping cannot give  */
    uint64_t image_bytes;
    void *emb_copy;       /* mapped pinned copy of the embedding table, when its file was not registered */
    bool emb_host;        /* the embedding table stays in host memory            */
    uint64_t pinned;      /* host bytes pinned in all                            */
    char *ex_image;       /* the split layers' host experts laid out as in their
                             slot, in pinned mapped memory, read by the GPU's
                             decode products over PCIe (stream_expert_image);
                             NULL: the CPU runs decode's host experts          */
    uint64_t *ex_image_at;/* [n_units] a split unit's place in ex_image        */
    uint64_t ex_image_bytes;
} stream_model;

/* ---- model side (model_cuda.c) ---- */

/*
 * Set up cm->sm for the layers the plan streams (and the embeddings, when
 * it keeps them on the host): pins the file mappings when anything is
 * streamed. Leaves cm->sm NULL when everything is resident.
 */
engine_status stream_model_open(cuda_model *cm, const engine_model *m, const engine_plan *plan, err_buf *e);
void stream_model_free(stream_model *sm);
/* True when [p, p + bytes) lies in a pinned mapping. */
bool stream_pinned(const stream_model *sm, const void *p, uint64_t bytes);
/* Append a copy to streamed layer i (adjacent copies merge); false when out of memory. */
bool stream_add_copy(stream_model *sm, int i, uint64_t dst, const void *src, uint64_t bytes);
/*
 * Lay the split units' host experts out in pinned, mapped host memory as
 * their slot holds them (their recorded copies replayed on the host, with
 * n_threads): decode's products then read them over PCIe where they are,
 * and no CPU runs them. After the weights are placed (the copies final).
 */
engine_status stream_expert_image(stream_model *sm, int n_threads, err_buf *e);
/* A device pointer to the embedding table in host memory (mapped). */
engine_status stream_emb_pointer(stream_model *sm, const k_weight *emb, void **dev, err_buf *e);

/* model_cuda.c: lay out layer l's four matrices at base (a slot) into D (may be NULL), as for
 * upload; returns their bytes, padded. */
uint64_t cuda_layer_mats(const cuda_model *cm, const engine_model *m, int l, char *base, cuda_layer *D);
/* model_cuda.c: the bytes of layer l's experts [x0, x1) as a slot holds them, padded. */
uint64_t cuda_expert_range_bytes(const cuda_model *cm, const engine_model *m, int l, int x0, int x1);

/* ---- session side ---- */

typedef struct stream_session stream_session;

typedef struct stream_times {
    int passes, tokens;
    double wall, copy, compute, overlap, host; /* seconds */
    uint64_t bytes;
} stream_times;

/* Slots, copy stream and events for cs (nothing when the model streams nothing). */
engine_status stream_session_create(cuda_session *cs, const engine_session *s, err_buf *e);
void stream_session_free(cuda_session *cs);
/* Device bytes of the session's slots. */
uint64_t stream_session_bytes(const cuda_session *cs);

/*
 * The hooks of a pass (forward_cuda.c), each 0 or -1 with cs->lc.err set:
 * begin forks the copy stream off the compute stream and starts the first
 * n_slots copies; before/after bracket layer l; end joins the copy stream
 * back. timing: record timing events as well (never while capturing).
 * decode: a one-token pass, which leaves hosted layers to the caller.
 */
int stream_begin(cuda_session *cs, const engine_session *s, int tokens, bool timing, bool decode);
int stream_before_layer(cuda_session *cs, int l);
int stream_after_layer(cuda_session *cs, int l);
int stream_end(cuda_session *cs);

/* Whether layer l is computed on the host in a decode pass. */
bool stream_hosted(const cuda_session *cs, int l);
/* Does a decode pass's layer l wait for its copy (a layer streamed, not hosted)? */
bool stream_waits(const cuda_session *cs, int l);

/*
 * A streamed output head, block by block: the rows [*r0, *r0 + *rows) of
 * block b are in the slot *w once stream_head_block() returns (it orders
 * the compute stream after their copy); stream_head_done() frees the slot
 * after the block's product. stream_head_blocks() is 0 when the head is
 * resident.
 */
int stream_head_blocks(const cuda_session *cs);
int stream_head_block(cuda_session *cs, int b, void **w, int *r0, int *rows);
int stream_head_done(cuda_session *cs, int b);

/* After a timed pass has completed: add its figures to t. */
void stream_collect(cuda_session *cs, int tokens, stream_times *t);
/* The copies a decode pass queues (0: nothing streamed); while cs->stamping, each is stamped at
 * STAMP_COPY(L, j) and the slot after (trace_stamps.h). */
int stream_decode_copies(const cuda_session *cs);
/* A stamped decode step's copies as spans on the copy engine's track (tid): the step's stamps from
 * STAMP_COPY(L, 0) at g, placed at g * 1e-3 + shift microseconds of trace time. */
void stream_trace_stamped(const cuda_session *cs, engine_trace *t, int tid, const volatile uint64_t *g, double shift);

/* The offload report of engine_session_offload (see engine.h). */
engine_status cuda_offload_report(engine_session *s, int n_decode, engine_offload_report *r, err_buf *e);

/* forward_cuda.c: one decode step launched eagerly (no graph), for the measurement. */
int cuda_decode_eager(cuda_session *cs, const engine_session *s);

#endif
