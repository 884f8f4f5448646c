/* engine_check.c — the one validation of engine inputs (see engine.h):
 * every rule on an init config and on a batch is written here once, with
 * one message naming the field. The daemon calls these on its poller
 * threads for early errors; the engine_*() wrappers call them again before
 * an engine sees the input. Rules that need the engine's state (token ids
 * inside the vocabulary, a sequence that fits a micro-batch) live with
 * that state. */
#include "engine.h"

#include <math.h>
#include <string.h>

#include "dist/dist.h"
#include "loss/loss.h"
#include "model/config.h"
#include "optim/schedule.h"

static bool finite_at_least(double x, double lo)
{
	return isfinite(x) && x >= lo;
}

int engine_optim_config_check(const struct engine_optim_config *o, struct eng_error *err)
{
	if (!finite_at_least(o->lr, 0))
		return eng_fail(err, -EINVAL, "optimizer.lr: must be a finite number >= 0");
	if (!(o->beta1 >= 0 && o->beta1 < 1))
		return eng_fail(err, -EINVAL, "optimizer.beta1: must be in [0, 1)");
	if (!(o->beta2 >= 0 && o->beta2 < 1))
		return eng_fail(err, -EINVAL, "optimizer.beta2: must be in [0, 1)");
	if (!(o->eps > 0) || !isfinite(o->eps))
		return eng_fail(err, -EINVAL, "optimizer.eps: must be a finite number > 0");
	if (!finite_at_least(o->weight_decay, 0))
		return eng_fail(err, -EINVAL, "optimizer.weight_decay: must be a finite number >= 0");
	if (!isfinite(o->clip_grad))
		return eng_fail(err, -EINVAL,
				"optimizer.clip_grad: must be a finite number (<= 0: no clipping)");
	return 0;
}

void engine_step_params_apply(const struct engine_step_params *p,
			      struct engine_optim_config *o)
{
	if (!p)
		return;
	o->beta1 = p->has_beta1 ? p->beta1 : o->beta1;
	o->beta2 = p->has_beta2 ? p->beta2 : o->beta2;
	o->eps = p->has_eps ? p->eps : o->eps;
	o->weight_decay = p->has_weight_decay ? p->weight_decay : o->weight_decay;
	o->clip_grad = p->has_clip_grad ? p->clip_grad : o->clip_grad;
}

int engine_step_params_check(const struct engine_step_params *p, struct eng_error *err)
{
	struct engine_init_config d;

	if (!p)
		return 0;
	engine_init_config_defaults(&d);
	engine_step_params_apply(p, &d.optim);
	if (p->has_lr)
		d.optim.lr = p->lr;
	return engine_optim_config_check(&d.optim, err);
}

int engine_step_call_prepare(const struct engine_step_params *p, struct engine_step_call *ret,
			     struct eng_error *err)
{
	int rc = engine_step_params_check(p, err);

	if (rc)
		return rc;
	memset(ret, 0, sizeof(*ret));
	if (p)
		ret->params = *p;
	return 0;
}

int engine_init_config_check(const struct engine_init_config *cfg, struct eng_error *err)
{
	struct model_config mc;
	struct eng_error perr;
	int rc;

	if (!cfg->model_type || (strcmp(cfg->model_type, "language_model") &&
				 strcmp(cfg->model_type, "value_model")))
		return eng_fail(err, -EINVAL,
				"model_type: unknown '%s' (language_model, value_model)",
				cfg->model_type ? cfg->model_type : "");
	if (!cfg->hf_config_json == !cfg->model_path)
		return eng_fail(err, -EINVAL,
				"model: exactly one of hf_config_json and model_path is required");
	rc = engine_optim_config_check(&cfg->optim, err);
	if (rc)
		return rc;
	rc = lr_schedule_validate(&cfg->sched, err);
	if (rc)
		return rc;
	if (cfg->max_tokens_per_micro_batch < 1 ||
	    cfg->max_tokens_per_micro_batch > ENGINE_MAX_TOKENS)
		return eng_fail(err, -EINVAL, "max_tokens_per_micro_batch: %lld, must be in [1, %lld]",
				(long long)cfg->max_tokens_per_micro_batch,
				(long long)ENGINE_MAX_TOKENS);
	if (cfg->lm_tile_floats < 0 || cfg->lm_tile_floats > ENGINE_MAX_LM_TILE_FLOATS)
		return eng_fail(err, -EINVAL, "lm_tile_floats: %lld, must be in [0, %lld]",
				(long long)cfg->lm_tile_floats,
				(long long)ENGINE_MAX_LM_TILE_FLOATS);
	if (cfg->lm_cache_floats < -1 || cfg->lm_cache_floats > ENGINE_MAX_LM_CACHE_FLOATS)
		return eng_fail(err, -EINVAL, "lm_cache_floats: %lld, must be -1 (never) or in "
				"[0, %lld]", (long long)cfg->lm_cache_floats,
				(long long)ENGINE_MAX_LM_CACHE_FLOATS);
	if (cfg->kv_cache_bytes < 0 || cfg->kv_cache_bytes > ENGINE_MAX_KV_CACHE_BYTES)
		return eng_fail(err, -EINVAL, "kv_cache_bytes: %lld, must be in [0, %lld] (0: %lld)",
				(long long)cfg->kv_cache_bytes, (long long)ENGINE_MAX_KV_CACHE_BYTES,
				(long long)ENGINE_KV_CACHE_DEFAULT);
	rc = dist_world_size_check("dist.world_size", cfg->dist.world_size, 0, err);
	if (rc)
		return rc;
	if (cfg->dist.world_size > 1) {
		rc = dist_config_check(&cfg->dist, err);
		if (rc == 0)
			rc = dist_backend_check("dist", cfg->device, NULL, err);
		if (rc)
			return rc;
	} else if (cfg->dist.rank != 0) {
		return eng_fail(err, -EINVAL, "dist.rank: %d, must be 0 for a single process",
				cfg->dist.rank);
	} else {
		rc = dist_group_id_check(&cfg->dist.id, false, err);
		if (rc == 0 && cfg->dist.zero_stage)
			rc = dist_zero_stage_check(cfg->dist.zero_stage, err);
		if (rc)
			return rc;
	}
	if (cfg->hf_config_json) {
		/* A model directory's config.json is read (and checked by the
		 * same parser) when the engine loads it. */
		eng_error_clear(&perr);
		rc = model_config_parse(cfg->hf_config_json, &mc, &perr);
		if (!rc)
			rc = model_config_set_head(&mc, !strcmp(cfg->model_type, "value_model"),
						   &perr);
		if (rc)
			return eng_fail(err, rc, "hf_config_json: %s", perr.msg);
	}
	return 0;
}

/* Packed sequences (input_ids, seq_lens) and a micro-batch budget: the
 * rules ForwardBackward and Sample share. */
static int packed_check(const int32_t *ids, int64_t n, const int32_t *seq_lens,
			int32_t num, int64_t budget, struct eng_error *err)
{
	int rc;

	if (n < 1 || !ids)
		return eng_fail(err, -EINVAL, "input_ids: required (INT32 [N], N >= 1)");
	if (n > ENGINE_MAX_TOKENS)
		return eng_fail(err, -EINVAL, "input_ids: %lld tokens, at most %lld in one call",
				(long long)n, (long long)ENGINE_MAX_TOKENS);
	if (num < 1 || !seq_lens)
		return eng_fail(err, -EINVAL, "seq_lens: required (sum = %lld)", (long long)n);
	rc = loss_seq_lens_check(seq_lens, num, n, err);
	if (rc)
		return rc;
	if (budget < 0 || budget > ENGINE_MAX_TOKENS)
		return eng_fail(err, -EINVAL,
				"max_tokens_per_micro_batch: %lld, must be in [0, %lld] (0: the engine's default)",
				(long long)budget, (long long)ENGINE_MAX_TOKENS);
	return 0;
}

int engine_batch_check(const struct engine_batch *b, struct eng_error *err)
{
	int rc = packed_check(b->input_ids, b->n, b->seq_lens, b->num_seqs,
			      b->max_tokens_per_micro_batch, err);

	if (rc)
		return rc;
	if (!isfinite(b->temperature) || b->temperature < 0.0f)
		return eng_fail(err, -EINVAL, "temperature: must be finite and > 0 (0 = 1)");
	if (!b->forward_only && !b->loss_fn)
		return eng_fail(err, -EINVAL, "loss.name: a loss is required unless forward_only");
	if (b->forward_only && b->reduce_gradients)
		return eng_fail(err, -EINVAL, "reduce_gradients: a forward_only call has no "
				"gradients to reduce");
	if (b->routed_experts && (b->routed_layers < 1 || b->routed_layers > ENGINE_MAX_LAYERS ||
				  b->routed_k < 1 || b->routed_k > ENGINE_MAX_EXPERTS_PER_TOK))
		return eng_fail(err, -EINVAL, "routed_experts: shape [%lld, %lld, %lld]; the "
				"layers must be in [1, %d], the experts per token in [1, %d]",
				(long long)b->n, (long long)b->routed_layers,
				(long long)b->routed_k, ENGINE_MAX_LAYERS,
				ENGINE_MAX_EXPERTS_PER_TOK);
	return 0;
}

int engine_sample_params_check(const struct engine_sample_params *p, struct eng_error *err)
{
	int rc = packed_check(p->input_ids, p->n, p->seq_lens, p->num_prompts,
			      p->max_tokens_per_micro_batch, err);

	if (rc)
		return rc;
	if (p->num_samples < 1 || p->num_samples > ENGINE_SAMPLE_MAX_SAMPLES)
		return eng_fail(err, -EINVAL, "num_samples: %d, must be in [1, %d] (0 = 1)",
				p->num_samples, ENGINE_SAMPLE_MAX_SAMPLES);
	if (p->max_tokens < 1 || p->max_tokens > ENGINE_SAMPLE_MAX_NEW_TOKENS)
		return eng_fail(err, -EINVAL, "max_tokens: %d, must be in [1, %d]", p->max_tokens,
				ENGINE_SAMPLE_MAX_NEW_TOKENS);
	if (!isfinite(p->temperature) || p->temperature < 0.0f)
		return eng_fail(err, -EINVAL, "temperature: must be finite and >= 0 (0: greedy)");
	if (p->temperature > 0.0f && !isfinite(1.0f / p->temperature))
		return eng_fail(err, -EINVAL, "temperature: %g is too small (1/t overflows)",
				p->temperature);
	if (p->top_k < 0)
		return eng_fail(err, -EINVAL, "top_k: %d, must be >= 0 (0: off)", p->top_k);
	if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
		return eng_fail(err, -EINVAL, "top_p: %g, must be in (0, 1] (unset: 1)", p->top_p);
	if (p->top_logprobs < 0 || p->top_logprobs > ENGINE_SAMPLE_MAX_TOP_LOGPROBS)
		return eng_fail(err, -EINVAL, "top_logprobs: %d, must be in [0, %d]",
				p->top_logprobs, ENGINE_SAMPLE_MAX_TOP_LOGPROBS);
	if (p->num_stop_ids < 0 || p->num_stop_ids > ENGINE_SAMPLE_MAX_STOPS)
		return eng_fail(err, -EINVAL, "stop_token_ids: %d, at most %d", p->num_stop_ids,
				ENGINE_SAMPLE_MAX_STOPS);
	if (p->num_stop_seqs < 0 || p->num_stop_seqs > ENGINE_SAMPLE_MAX_STOPS)
		return eng_fail(err, -EINVAL, "stop_sequences: %d, at most %d", p->num_stop_seqs,
				ENGINE_SAMPLE_MAX_STOPS);
	for (int32_t i = 0; i < p->num_stop_seqs; i++) {
		int32_t len = p->stop_seq_off[i + 1] - p->stop_seq_off[i];

		if (len < 1 || len > ENGINE_SAMPLE_MAX_STOP_LEN)
			return eng_fail(err, -EINVAL,
					"stop_sequences[%d]: %d tokens, must be 1 to %d", i, len,
					ENGINE_SAMPLE_MAX_STOP_LEN);
	}
	if (!p->emit)
		return eng_fail(err, -EINVAL, "sample: no emit callback");
	return 0;
}
