/* loss_engine.c — micro-batch adapter between the engine and the loss
 * library (see loss_engine.h). */
#include "loss_engine.h"

#include <stdlib.h>
#include <string.h>

enum { GATHER_ARRAYS = LOSS_IN_REQUEST_COUNT };

void loss_engine_ctx_destroy(struct loss_engine_ctx *ctx)
{
	if (!ctx)
		return;
	free(ctx->gather);
	memset(ctx, 0, sizeof(*ctx));
}

int loss_engine_ctx_init(struct loss_engine_ctx *ctx, const struct loss_spec *spec,
			 const struct loss_request *req, struct eng_error *err)
{
	const float *mask = req->in[LOSS_IN_LOSS_MASK];
	int64_t t = 0, tokens = 0, seqs = 0, horizon = 0;
	size_t bytes;
	int rc;

	memset(ctx, 0, sizeof(*ctx));
	rc = loss_mask_check(mask, req->n, err);
	if (rc)
		return rc;
	/* loss_compute's rules and token counts, so that the call's counts and
	 * its micro-batches' agree. */
	for (int32_t i = 0; i < req->num_seqs; i++) {
		int64_t cnt = 0;

		for (int32_t j = 0; j < req->seq_lens[i]; j++, t++)
			cnt += loss_token_counts(mask, t, j);
		tokens += cnt;
		seqs += cnt > 0;
		if (req->seq_lens[i] > horizon)
			horizon = req->seq_lens[i];
	}

	bytes = (size_t)(req->n > 0 ? req->n : 1) * GATHER_ARRAYS * sizeof(float);
	ctx->gather = malloc(bytes);
	if (!ctx->gather)
		return eng_fail(err, -ENOMEM, "loss: out of memory for %lld tokens",
				(long long)req->n);
	ctx->spec = spec;
	ctx->req = *req;
	ctx->rng_seed = spec->seed;
	ctx->call_tokens = (double)tokens;
	ctx->call_seqs = (double)seqs;
	ctx->call_horizon = (double)horizon;
	return 0;
}

/* One seed per micro-batch from the call's seed (the splitmix64 finalizer
 * of micro-batch k): depends only on the call seed and the micro-batch's
 * position in the plan, so a replayed call draws the same tokens. */
static uint64_t mix_seed(uint64_t seed, uint64_t k)
{
	uint64_t z = seed + (k + 1) * 0x9e3779b97f4a7c15ull;

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Gather src[token_index[i]] into slot `k` of the scratch; NULL stays NULL. */
static const float *gather(struct loss_engine_ctx *ctx, int k, const float *src,
			   const struct engine_loss_io *io)
{
	float *dst;

	if (!src)
		return NULL;
	dst = ctx->gather + (size_t)k * (size_t)(ctx->req.n > 0 ? ctx->req.n : 1);
	for (int64_t i = 0; i < io->n; i++)
		dst[i] = src[io->token_index[i]];
	return dst;
}

static int check_io(const struct loss_engine_ctx *ctx, const struct engine_loss_io *io,
		    struct eng_error *err)
{
	int64_t sum = 0;

	if (io->n < 0 || io->n > ctx->req.n || io->num_seqs < 0 ||
	    (io->n > 0 && !io->token_index) ||
	    (io->num_seqs > 0 && (!io->seq_lens || !io->seq_index)))
		return eng_fail(err, -EINVAL, "loss: micro-batch of %lld tokens does not "
				"fit the request of %lld", (long long)io->n,
				(long long)ctx->req.n);
	for (int32_t j = 0; j < io->num_seqs; j++) {
		int32_t si = io->seq_index[j];

		if (si < 0 || si >= ctx->req.num_seqs || io->seq_lens[j] != ctx->req.seq_lens[si])
			return eng_fail(err, -EINVAL, "loss: micro-batch sequence %d "
					"(request sequence %d) does not match seq_lens",
					(int)j, (int)si);
		sum += io->seq_lens[j];
	}
	if (sum != io->n)
		return eng_fail(err, -EINVAL, "loss: micro-batch seq_lens sum %lld != %lld",
				(long long)sum, (long long)io->n);
	for (int64_t i = 0; i < io->n; i++)
		if (io->token_index[i] < 0 || io->token_index[i] >= ctx->req.n)
			return eng_fail(err, -EINVAL, "loss: token_index[%lld] = %lld out of "
					"range", (long long)i, (long long)io->token_index[i]);
	return 0;
}

int loss_engine_fn(void *vctx, struct engine_loss_io *io, struct eng_error *err)
{
	struct loss_engine_ctx *ctx = vctx;
	const struct loss_request *q = &ctx->req;
	struct loss_batch b = {0};
	struct loss_result res = {0};
	int r;

	r = check_io(ctx, io, err);
	if (r)
		return r;
	b.n = io->n;
	b.num_seqs = io->num_seqs;
	b.seq_lens = io->seq_lens;
	b.log_probs = io->log_probs;
	b.entropy = io->entropy;
	b.values = io->values;
	for (int k = 0; k < LOSS_IN_REQUEST_COUNT; k++)
		b.in[k] = gather(ctx, k, q->in[k], io);
	b.norm_tokens = ctx->call_tokens;
	b.norm_seqs = ctx->call_seqs;
	b.norm_horizon = ctx->call_horizon;
	b.rng_seed = mix_seed(ctx->rng_seed, (uint64_t)ctx->num_micro_batches);
	b.grad_scale = io->grad_scale;
	if (!io->forward_only) {
		res.d_log_probs = io->d_log_probs;
		res.d_entropy = io->d_entropy;
		res.d_values = io->d_values;
	}
	r = loss_compute_checked(ctx->spec, &b, &res, err);
	if (r)
		return r;

	ctx->num_micro_batches++;
	ctx->loss += res.loss;
	for (int k = 0; k < LOSS_M_COUNT; k++) {
		const struct loss_metric *m = &res.metrics[k];

		if (!m->present)
			continue;
		ctx->mpresent[k] = true;
		if (loss_metric_is_mean((enum loss_metric_id)k)) {
			ctx->msum[k] += m->value * m->weight;
			ctx->mweight[k] += m->weight;
		} else {
			ctx->msum[k] += m->value;
		}
	}
	return 0;
}

void loss_engine_ctx_result(const struct loss_engine_ctx *ctx, double *ret_loss,
			    struct loss_metric *ret_metrics)
{
	for (int k = 0; k < LOSS_M_COUNT; k++) {
		struct loss_metric *m = &ret_metrics[k];

		m->present = ctx->mpresent[k];
		if (loss_metric_is_mean((enum loss_metric_id)k)) {
			m->weight = ctx->mweight[k];
			m->value = m->weight > 0 ? ctx->msum[k] / m->weight : 0.0;
		} else {
			m->weight = 1.0;
			m->value = ctx->msum[k];
		}
	}
	/* loss and the counts are always part of the reply, even for a call
	 * that ran no micro-batch. */
	ret_metrics[LOSS_M_LOSS].present = true;
	ret_metrics[LOSS_M_LOSS].value = ctx->loss;
	ret_metrics[LOSS_M_NUM_TOKENS].present = true;
	ret_metrics[LOSS_M_NUM_TOKENS].value = ctx->call_tokens;
	ret_metrics[LOSS_M_NUM_SEQUENCES].present = true;
	ret_metrics[LOSS_M_NUM_SEQUENCES].value = (double)ctx->req.num_seqs;
	*ret_loss = ctx->loss;
}
