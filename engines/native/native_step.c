/* native_step.c — OptimizerStep and LrSchedulerStep of the native engine:
 * the one AdamW step with global-norm clipping, alone or in a group
 * (native_dist.c's hooks), and the schedule's step.
 */
#include "native_engine.h"

#include <math.h>
#include <string.h>

/* The step once the gradient norm is known: ret gets the norm and lr; a
 * non-finite norm skips the update and drops the gradients (1); else
 * *coef is the clip coefficient (0). */
static int step_norm(struct native *n, double norm, double lr, double clip,
		     struct engine_step_result *ret, float *coef, struct eng_error *err)
{
	int rc;

	memset(ret, 0, sizeof(*ret));
	ret->grad_norm = norm;
	ret->lr = lr;
	if (!isfinite(norm)) {
		/* verl: a non-finite norm skips the update and drops the grads. */
		ret->skipped = true;
		ret->step = n->optim_step;
		rc = native_zero_grads(n, err);
		return rc ? rc : 1;
	}
	/* torch.nn.utils.clip_grad_norm_: coef = max_norm / (norm + 1e-6),
	 * clamped to 1, computed in fp32. */
	*coef = 1.0f;
	if (clip > 0) {
		float c = (float)clip / ((float)norm + 1e-6f);

		*coef = c < 1.0f ? c : 1.0f;
	}
	return 0;
}

/* The one AdamW step, alone or in a group of W ranks (native_dist.c's
 * hooks; ZeRO-1, 2 and 3 alike): the gradients this rank updates are its slice
 * [shard_off, shard_off + shard_len) of the table (alone: all of it),
 * summed over the ranks first (each rank's are already divided by W:
 * native_grad_scale); the norm is sqrt(sum of the slices' squares); the
 * updated slices are then gathered on every rank. In a group a failure
 * before the update zeroes the gradients (they were partly reduced). */
int native_optimizer_step(struct engine *e, const struct engine_step_params *p,
			  struct engine_step_result *ret, struct eng_error *err)
{
	struct native *n = native_of(e);
	const struct kernel_table *k = n->dev->k;
	struct engine_optim_config o = n->optim;  /* this step's */
	double sumsq = 0, lr = p && p->has_lr ? p->lr : native_current_lr(n);
	float *grads = native_slice(n, FAM_GRADS), *params = native_slice(n, FAM_PARAMS);
	float coef = 1.0f;
	int rc;

	engine_step_params_apply(p, &o);
	rc = native_refuse_frozen(n, "OptimizerStep", err);
	if (rc == 0)
		rc = native_require_placed(n, true, true, err);
	if (rc == 0 && n->group.dist)
		rc = native_dist_reduce_grads(n, err);
	if (rc)
		return rc;
	rc = k->sumsq(n->dev, &sumsq, grads, n->group.shard_len);
	if (rc) {
		if (n->group.dist)
			(void)native_zero_grads(n, NULL);
		return eng_fail(err, rc, "optimizer: gradient norm failed");
	}
	if (n->group.dist && (rc = native_dist_sum_norm(n, &sumsq, err)))
		return rc;
	rc = step_norm(n, sqrt(sumsq), lr, o.clip_grad, ret, &coef, err);
	if (rc)
		return rc < 0 ? rc : 0;
	n->optim_step++;
	/* Announced before the kernel runs, so that a device may refresh its
	 * derived copies in the update's own pass when it covers the whole
	 * table (device.h, adamw); a group's slice does not, and the copy is
	 * made again from the gathered parameters. */
	if (!n->lora)
		n->dev->param_version++;
	rc = k->adamw(n->dev, params, grads,
		      n->fam[FAM_EXP_AVG].dev, n->fam[FAM_EXP_AVG_SQ].dev, n->group.shard_len,
		      lr, o.beta1, o.beta2, o.eps, o.weight_decay, n->optim_step, coef);
	if (rc) {
		n->optim_step--;
		if (n->group.dist)
			(void)native_zero_grads(n, NULL);
		return eng_fail(err, rc, "optimizer: AdamW kernel failed");
	}
	if (n->group.dist)
		rc = native_dist_gather_params(n, err);
	ret->step = n->optim_step;
	native_adapter_changed(n);
	/* The kernel zeroed the gradients as it read them. */
	n->grad_calls = n->grad_tokens = 0;
	return rc;
}

int native_lr_scheduler_step(struct engine *e, double *ret_lr, struct eng_error *err)
{
	struct native *n = native_of(e);

	n->sched_step++;
	*ret_lr = native_current_lr(n);
	return 0;
}
