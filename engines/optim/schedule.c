/* schedule.c — learning-rate multipliers (see schedule.h).
 *
 * Formulas follow verl's verl/utils/torch_functional.py as of
 * verl-project/verl commit 0db13434d04637f539356a9c43209387ed3894a4:
 *
 *   constant  get_constant_schedule_with_warmup:
 *               step < W ? step / max(1, W) : 1
 *   cosine    get_cosine_schedule_with_warmup(min_lr_ratio, num_cycles),
 *             with init_lr_ratio left at its default (None -> 0):
 *               step < W ? step / max(1, W)
 *                        : max(m, cos(pi * c * 2 * p) * (1 - m) / 2 + (1 + m) / 2)
 *               p = (step - W) / max(1, T - W)
 *             Like verl (a LambdaLR that never clamps p), steps past T keep
 *             following the cosine, so with c = 0.5 the factor rises again
 *             after T. Callers that stop at T never see this.
 *   linear    verl's FSDP config only knows "constant" and "cosine"; its
 *             Megatron and Automodel paths take "linear" from Megatron's
 *             OptimizerParamScheduler (lr_decay_style "linear",
 *             lr_warmup_init 0, min_lr = m * lr):
 *               step < W ? step / max(1, W)
 *                        : m + (1 - m) * (1 - min(1, (step - W) / max(1, T - W)))
 *             With m = 0 this is transformers' get_linear_schedule_with_warmup,
 *             max(0, (T - step) / max(1, T - W)).
 *
 * W = warmup_steps, T = total_steps, m = min_lr_ratio, c = num_cycles.
 * Step 0 is the first optimizer step (LambdaLR evaluates the lambda at 0 when
 * it is built), so with warmup the first step runs at lr 0, as in verl.
 */
#include "schedule.h"

#include <math.h>

static double warmup_factor(int64_t step, int64_t warmup)
{
	return (double)step / (double)(warmup > 1 ? warmup : 1);
}

/* (step - W) / max(1, T - W): the fraction of the decay phase done. */
static double decay_progress(const struct engine_sched_config *s, int64_t step)
{
	int64_t span = s->total_steps - s->warmup_steps;

	return (double)(step - s->warmup_steps) / (double)(span > 1 ? span : 1);
}

double lr_schedule_factor(const struct engine_sched_config *s, int64_t step)
{
	double m = s->min_lr_ratio, p, x, v;

	/* The scheduler never counts below zero; clamp rather than
	 * extrapolate the warmup ramp into negative lr. */
	if (step < 0)
		step = 0;
	if (step < s->warmup_steps)
		return warmup_factor(step, s->warmup_steps);

	switch (s->type) {
	case LR_SCHEDULE_COSINE:
		p = decay_progress(s, step);
		x = cos(M_PI * s->num_cycles * 2.0 * p);
		v = x * ((1.0 - m) * 0.5) + (1.0 + m) * 0.5;
		return v > m ? v : m;
	case LR_SCHEDULE_LINEAR:
		p = decay_progress(s, step);
		if (p > 1.0)
			p = 1.0;
		return m + (1.0 - m) * (1.0 - p);
	case LR_SCHEDULE_CONSTANT:
	default:
		return 1.0;
	}
}

int lr_schedule_validate(const struct engine_sched_config *s, struct eng_error *err)
{
	if (!s)
		return eng_fail(err, -EINVAL, "lr_scheduler: missing");
	if (s->type != LR_SCHEDULE_CONSTANT && s->type != LR_SCHEDULE_LINEAR &&
	    s->type != LR_SCHEDULE_COSINE)
		return eng_fail(err, -EINVAL,
				"lr_scheduler.type: unknown schedule %d (constant, linear, cosine)",
				(int)s->type);
	if (s->warmup_steps < 0)
		return eng_fail(err, -EINVAL,
				"lr_scheduler.warmup_steps: %lld must be >= 0",
				(long long)s->warmup_steps);
	if (s->total_steps < 0)
		return eng_fail(err, -EINVAL,
				"lr_scheduler.total_steps: %lld must be >= 0",
				(long long)s->total_steps);
	if (s->type != LR_SCHEDULE_CONSTANT && s->total_steps <= 0)
		return eng_fail(err, -EINVAL,
				"lr_scheduler.total_steps: %lld must be > 0 for a %s schedule",
				(long long)s->total_steps,
				s->type == LR_SCHEDULE_COSINE ? "cosine" : "linear");
	/* Written as a negated range test so that NaN fails too. */
	if (!(s->min_lr_ratio >= 0.0 && s->min_lr_ratio <= 1.0))
		return eng_fail(err, -EINVAL,
				"lr_scheduler.min_lr_ratio: %g must be in [0, 1]",
				s->min_lr_ratio);
	if (!(s->num_cycles >= 0.0 && isfinite(s->num_cycles)))
		return eng_fail(err, -EINVAL,
				"lr_scheduler.num_cycles: %g must be finite and >= 0",
				s->num_cycles);
	return 0;
}
