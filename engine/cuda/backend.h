/*
 * backend.h: what the rest of the engine sees of the CUDA backend. A model
 * on CUDA owns a device arena holding its weights (uploaded once from the
 * mapping); a session owns its KV cache, activation buffers, stream,
 * cuBLASLt handle and the CUDA graph of one decode step.
 *
 * Compiled only with ENGINE_HAVE_CUDA.
 */
#ifndef ENGINE_CUDA_BACKEND_H
#define ENGINE_CUDA_BACKEND_H

#include <stdbool.h>

#include "../model.h"

typedef struct cuda_model cuda_model;
typedef struct cuda_session cuda_session;

/* True when a usable device is present; otherwise why not, in `why`. */
bool cuda_available(char *why, size_t why_size);

/* Reserve the arena (budget 0: free memory minus a margin) and upload m's weights. */
engine_status cuda_model_create(engine_model *m, uint64_t budget, cuda_model **out, err_buf *e);
void cuda_model_free(cuda_model *cm);

/* Device buffers for s (s->n_ctx, s->n_batch set); captures the decode graph lazily. */
engine_status cuda_session_create(engine_session *s, cuda_session **out, err_buf *e);
void cuda_session_free(cuda_session *cs);

/*
 * Evaluate n tokens (n <= s->n_batch) at s->n_past and advance it. With
 * want_logits the last token's logits are copied to s->logits; with argmax
 * non-NULL the greedy choice is made on the device and stored there (no
 * logits leave the device unless asked for).
 */
engine_status cuda_forward(engine_session *s, const int32_t *ids, int n, bool want_logits, int32_t *argmax,
                           err_buf *e);

/*
 * Greedy decoding with the device feeding each argmax back as the next
 * step's input, so step k+1 is queued before the host reads token k:
 * cuda_greedy_queue() queues one step at s->n_past plus those queued, of
 * token id (id >= 0, nothing queued) or of the queued step's argmax
 * (id < 0, one queued). cuda_greedy_take() waits for the oldest, accounts
 * it (s->tokens, s->n_past) and gives its argmax. cuda_greedy_drop() waits
 * for and discards what is queued (the KV rows it wrote are past n_past;
 * the device logits are evaluated again when next needed).
 */
engine_status cuda_greedy_queue(engine_session *s, int32_t id, err_buf *e);
engine_status cuda_greedy_take(engine_session *s, int32_t *next, err_buf *e);
void cuda_greedy_drop(engine_session *s);

/*
 * After cuda_forward: the sampling candidates of the last logits at this
 * temperature (see launch_sample_candidates), in pinned host buffers valid
 * until the next call. Returns how many, more than CAND_MAX (4096) when the
 * list did not fit (then use cuda_copy_logits), or -1 with e set.
 */
int cuda_sample_candidates(engine_session *s, float temperature, const int32_t **ids, const float **vals, err_buf *e);

/*
 * Scoring (engine_session_score), after a batch pass (cuda_forward, n > 1)
 * that left its rows' hidden states on the device: rows [r0, r1) of that
 * pass through the head, with lse_logit[2j] = the log-sum-exp of row r0 + j
 * and lse_logit[2j + 1] its logit of targets[j] (host ids), and where
 * rows_out is not NULL the rows themselves ([r1 - r0, vocab] floats).
 * cuda_score_rows_max() is how many rows one round holds, 0 when this is
 * not possible (a streamed head): then score one token at a time.
 */
int cuda_score_rows_max(const engine_session *s);
engine_status cuda_score_rows(engine_session *s, int r0, int r1, const int32_t *targets, float *lse_logit,
                              float *rows_out, err_buf *e);

/* Copy the last logits to s->logits. */
engine_status cuda_copy_logits(engine_session *s, err_buf *e);

/* Device figures for the memory report. */
void cuda_memory(const engine_session *s, engine_memory_report *r);

/* engine_model_plan, engine_device_reserve, engine_session_offload on CUDA. */
const engine_plan *cuda_model_plan(const cuda_model *cm);
engine_status cuda_device_reserve(uint64_t *bytes, err_buf *e);
engine_status cuda_offload_report(engine_session *s, int n_decode, engine_offload_report *r, err_buf *e);
/* Adds the device's pick counts of layer l's experts (its routing kernel's) to counts[n_experts]. */
engine_status cuda_expert_picks(engine_session *s, int l, uint32_t *counts, err_buf *e);

#endif
