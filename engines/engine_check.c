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

int engine_batch_check(const struct engine_batch *b, struct eng_error *err)
{
	int rc;

	if (b->n < 1 || !b->input_ids)
		return eng_fail(err, -EINVAL, "input_ids: required (INT32 [N], N >= 1)");
	if (b->n > ENGINE_MAX_TOKENS)
		return eng_fail(err, -EINVAL, "input_ids: %lld tokens, at most %lld in one call",
				(long long)b->n, (long long)ENGINE_MAX_TOKENS);
	if (b->num_seqs < 1 || !b->seq_lens)
		return eng_fail(err, -EINVAL, "seq_lens: required (sum = %lld)", (long long)b->n);
	rc = loss_seq_lens_check(b->seq_lens, b->num_seqs, b->n, err);
	if (rc)
		return rc;
	if (!isfinite(b->temperature) || b->temperature < 0.0f)
		return eng_fail(err, -EINVAL, "temperature: must be finite and > 0 (0 = 1)");
	if (b->max_tokens_per_micro_batch < 0 || b->max_tokens_per_micro_batch > ENGINE_MAX_TOKENS)
		return eng_fail(err, -EINVAL,
				"max_tokens_per_micro_batch: %lld, must be in [0, %lld] (0: the engine's default)",
				(long long)b->max_tokens_per_micro_batch, (long long)ENGINE_MAX_TOKENS);
	if (!b->forward_only && !b->loss_fn)
		return eng_fail(err, -EINVAL, "loss.name: a loss is required unless forward_only");
	if (b->forward_only && b->reduce_gradients)
		return eng_fail(err, -EINVAL, "reduce_gradients: a forward_only call has no "
				"gradients to reduce");
	return 0;
}
