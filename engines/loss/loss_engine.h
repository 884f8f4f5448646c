/* loss_engine.h — the loss library behind the engine's loss seam
 * (engine_loss_fn / struct engine_loss_io of engine.h).
 *
 * One context serves one ForwardBackward call. The engine calls
 * loss_engine_fn once per micro-batch; the context gathers the micro-batch's
 * tokens from the request arrays (io->token_index), runs loss_compute_checked with
 * the whole call's normalizers and writes the gradients into io->d_* in
 * micro-batch order. Because every micro-batch is normalized by the call's
 * counts (or by the spec's global_num_tokens / global_batch_size when
 * given), the micro-batch losses and gradients sum to the call's full-batch
 * objective, whatever the split; with the global normalizers, several calls
 * sum to the global batch's objective.
 *
 * Usage (engine_request.c; a test driver):
 *   struct loss_engine_ctx lc;
 *   loss_engine_ctx_init(&lc, &spec, &req, &err);       // after loss_spec_validate
 *                                                       // and engine_batch_check
 *   batch.loss_fn = loss_engine_fn; batch.loss_ctx = &lc;
 *   engine_forward_backward(e, &batch, &res, &err);
 *   loss_engine_ctx_result(&lc, &loss, metrics);        // reply: loss + present metrics
 *   loss_engine_ctx_destroy(&lc);
 *
 * Ownership: spec and the request arrays are borrowed and must outlive the
 * context; the context owns its gather buffers.
 */
#ifndef ENGINED_LOSS_ENGINE_H
#define ENGINED_LOSS_ENGINE_H

#include "engine.h"
#include "loss.h"

/* The request side of a ForwardBackward call, original order. */
struct loss_request {
	int64_t n;                    /* tokens */
	int32_t num_seqs;
	const int32_t *seq_lens;      /* [num_seqs], each >= 1, sum n */
	const float *in[LOSS_IN_REQUEST_COUNT];  /* [n] each (loss.h's table), NULL = absent */
};

struct loss_engine_ctx {
	const struct loss_spec *spec;      /* borrowed */
	struct loss_request req;           /* borrowed arrays */
	/* clip_cov's stream for this call; init sets spec->seed, the engine may
	 * overwrite it (e.g. from its own RNG state) before the first call. */
	uint64_t rng_seed;
	/* Call-level normalizers handed to every micro-batch. */
	double call_tokens;                /* masked tokens of the call */
	double call_seqs;                  /* sequences with a masked token */
	double call_horizon;               /* longest sequence */
	float *gather;                     /* [LOSS_IN_REQUEST_COUNT * n] owned scratch */
	int32_t num_micro_batches;         /* calls of loss_engine_fn so far */
	double loss;                       /* summed contributions */
	double msum[LOSS_M_COUNT];         /* sum of value (x weight for means) */
	double mweight[LOSS_M_COUNT];      /* sum of weights (means) */
	bool mpresent[LOSS_M_COUNT];
};

/* For a request whose seq_lens the caller checked (loss_seq_lens_check, by
 * engine_batch_check) and whose spec it validated against the inputs
 * present (loss_spec_validate): check loss_mask (0/1), compute the
 * call-level counts and allocate the gather buffers. The request's rules
 * are checked here once for the whole call: loss_engine_fn then computes
 * each micro-batch without checking them again (loss_compute_checked).
 * -EINVAL naming the field, -ENOMEM; ctx is zeroed (destroy-safe) on
 * failure. */
int loss_engine_ctx_init(struct loss_engine_ctx *ctx, const struct loss_spec *spec,
			 const struct loss_request *req, struct eng_error *err);

/* engine_loss_fn: ctx is a struct loss_engine_ctx. Writes io->d_log_probs,
 * io->d_entropy and io->d_values (when non-NULL and not forward_only) in
 * micro-batch order and accumulates loss and metrics. -EINVAL when io does
 * not match the request (token_index out of range, seq_lens differing). */
int loss_engine_fn(void *ctx, struct engine_loss_io *io, struct eng_error *err);

/* The call's loss and metrics (loss.h semantics: contributions summed,
 * means token-weighted). metrics[LOSS_M_COUNT] is written in full; only
 * entries with present = true belong in the reply. */
void loss_engine_ctx_result(const struct loss_engine_ctx *ctx, double *ret_loss,
			    struct loss_metric *ret_metrics);

void loss_engine_ctx_destroy(struct loss_engine_ctx *ctx);  /* accepts zeroed */

#endif
