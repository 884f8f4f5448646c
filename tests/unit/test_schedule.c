/* test_schedule.c — LR schedules against verl's formulas run in torch.
 *
 * The expected factors were produced with /usr/bin/python3 (torch 1.13):
 * verl's lr lambdas (verl/utils/torch_functional.py, verl-project/verl
 * 0db1343) written out in Python, wrapped in torch.optim.lr_scheduler.LambdaLR
 * over SGD(lr=1), and param_groups[0]['lr'] read before each scheduler.step():
 *
 *   cosine:   s < W: s / max(1, W)
 *             p = (s - W) / max(1, T - W)
 *             max(m, cos(pi * c * 2 * p) * (1 - m) / 2 + (1 + m) / 2)
 *   constant: s < W: s / max(1.0, W), else 1
 *   linear:   Megatron OptimizerParamScheduler "linear" (min_lr = m * lr):
 *             s < W: s / max(1, W); s > T: m;
 *             m + (1 - (s - W) / max(1, T - W)) * (1 - m)
 *
 * The printed values are pasted below with the steps they belong to.
 */
#include "check_run.h"
#include <check.h>
#include <math.h>
#include <string.h>

#include "optim/schedule.h"

struct sched_case {
	const char *name;
	struct engine_sched_config cfg;
	int n;
	int64_t steps[8];
	double want[8];
};

static const struct sched_case cases[] = {
	{ "constant W=10", { LR_SCHEDULE_CONSTANT, 10, 0, 0.0, 0.5 }, 7,
	  { 0, 5, 9, 10, 50, 100, 150 },
	  { 0.0, 0.5, 0.9, 1.0, 1.0, 1.0, 1.0 } },
	{ "constant W=0", { LR_SCHEDULE_CONSTANT, 0, 0, 0.0, 0.5 }, 3,
	  { 0, 1, 100 },
	  { 1.0, 1.0, 1.0 } },
	{ "cosine W=10 T=100", { LR_SCHEDULE_COSINE, 10, 100, 0.0, 0.5 }, 7,
	  { 0, 5, 9, 10, 55, 100, 150 },
	  { 0.0, 0.5, 0.9, 1.0, 0.5, 0.0, 0.586824088833465 } },
	{ "cosine W=10 T=100 m=0.1", { LR_SCHEDULE_COSINE, 10, 100, 0.1, 0.5 }, 7,
	  { 0, 5, 10, 40, 55, 100, 150 },
	  { 0.0, 0.5, 1.0, 0.7750000000000001, 0.55, 0.10000000000000003,
	    0.6281416799501185 } },
	{ "cosine W=0 T=100 m=0.2 c=1", { LR_SCHEDULE_COSINE, 0, 100, 0.2, 1.0 }, 6,
	  { 0, 25, 50, 75, 100, 125 },
	  { 1.0, 0.6, 0.2, 0.5999999999999999, 1.0, 0.6000000000000001 } },
	{ "cosine W=10 T=10", { LR_SCHEDULE_COSINE, 10, 10, 0.0, 0.5 }, 4,
	  { 9, 10, 11, 12 },
	  { 0.9, 1.0, 0.0, 1.0 } },
	{ "linear W=10 T=100", { LR_SCHEDULE_LINEAR, 10, 100, 0.0, 0.5 }, 7,
	  { 0, 5, 10, 55, 99, 100, 150 },
	  { 0.0, 0.5, 1.0, 0.5, 0.011111111111111072, 0.0, 0.0 } },
	{ "linear W=10 T=100 m=0.1", { LR_SCHEDULE_LINEAR, 10, 100, 0.1, 0.5 }, 6,
	  { 0, 5, 10, 55, 100, 150 },
	  { 0.0, 0.5, 1.0, 0.55, 0.1, 0.1 } },
	{ "linear W=0 T=8 m=0.25", { LR_SCHEDULE_LINEAR, 0, 8, 0.25, 0.5 }, 5,
	  { 0, 1, 3, 8, 9 },
	  { 1.0, 0.90625, 0.71875, 0.25, 0.25 } },
};

START_TEST(factors_match_torch)
{
	const struct sched_case *c = &cases[_i];
	struct eng_error err = { 0 };
	int j;

	ck_assert_int_eq(lr_schedule_validate(&c->cfg, &err), 0);
	for (j = 0; j < c->n; j++) {
		double got = lr_schedule_factor(&c->cfg, c->steps[j]);

		ck_assert_msg(fabs(got - c->want[j]) <= 1e-12,
			      "%s step %lld: got %.17g want %.17g", c->name,
			      (long long)c->steps[j], got, c->want[j]);
	}
}
END_TEST

/* Hand-derived properties that hold for every step, not only the sampled ones. */
START_TEST(shapes)
{
	struct engine_sched_config cos = { LR_SCHEDULE_COSINE, 7, 57, 0.1, 0.5 };
	struct engine_sched_config lin = { LR_SCHEDULE_LINEAR, 7, 57, 0.1, 0.5 };
	int64_t s;

	for (s = 0; s < 7; s++) {
		ck_assert_double_eq(lr_schedule_factor(&cos, s), s / 7.0);
		ck_assert_double_eq(lr_schedule_factor(&lin, s), s / 7.0);
	}
	for (s = 7; s < 57; s++) {
		double fc = lr_schedule_factor(&cos, s), fl = lr_schedule_factor(&lin, s);

		/* decreasing to the floor, never below it */
		ck_assert(fc >= lr_schedule_factor(&cos, s + 1));
		ck_assert(fl > lr_schedule_factor(&lin, s + 1));
		ck_assert(fc >= 0.1 && fc <= 1.0);
		/* linear: exactly 1 - 0.9 * (s - 7) / 50 */
		ck_assert_double_eq_tol(fl, 1.0 - 0.9 * (s - 7) / 50.0, 1e-15);
	}
	ck_assert_double_eq_tol(lr_schedule_factor(&cos, 57), 0.1, 1e-15);
	ck_assert_double_eq_tol(lr_schedule_factor(&lin, 57), 0.1, 1e-15);
	for (s = 57; s < 200; s++)
		ck_assert_double_eq_tol(lr_schedule_factor(&lin, s), 0.1, 1e-15);
	/* cosine with num_cycles 0: no decay at all */
	cos.num_cycles = 0.0;
	ck_assert_double_eq(lr_schedule_factor(&cos, 30), 1.0);
	/* negative steps clamp to step 0 */
	ck_assert_double_eq(lr_schedule_factor(&lin, -3), 0.0);
}
END_TEST

static void expect_invalid(struct engine_sched_config c, const char *field)
{
	struct eng_error err = { 0 };

	ck_assert_int_eq(lr_schedule_validate(&c, &err), -EINVAL);
	ck_assert_int_eq(err.code, -EINVAL);
	ck_assert_msg(strstr(err.msg, field), "message '%s' lacks '%s'", err.msg, field);
}

START_TEST(validation)
{
	struct engine_sched_config ok = { LR_SCHEDULE_COSINE, 10, 100, 0.0, 0.5 };
	struct engine_sched_config c;
	struct eng_error err = { 0 };

	ck_assert_int_eq(lr_schedule_validate(&ok, &err), 0);
	ck_assert_int_eq(err.code, 0);

	c = ok; c.warmup_steps = -1;
	expect_invalid(c, "lr_scheduler.warmup_steps");
	c = ok; c.total_steps = 0;
	expect_invalid(c, "lr_scheduler.total_steps");
	c = ok; c.type = LR_SCHEDULE_LINEAR; c.total_steps = 0;
	expect_invalid(c, "lr_scheduler.total_steps");
	c = ok; c.type = LR_SCHEDULE_CONSTANT; c.total_steps = -5;
	expect_invalid(c, "lr_scheduler.total_steps");
	c = ok; c.min_lr_ratio = -0.01;
	expect_invalid(c, "lr_scheduler.min_lr_ratio");
	c = ok; c.min_lr_ratio = 1.5;
	expect_invalid(c, "lr_scheduler.min_lr_ratio");
	c = ok; c.min_lr_ratio = NAN;
	expect_invalid(c, "lr_scheduler.min_lr_ratio");
	c = ok; c.num_cycles = -0.5;
	expect_invalid(c, "lr_scheduler.num_cycles");
	c = ok; c.num_cycles = INFINITY;
	expect_invalid(c, "lr_scheduler.num_cycles");
	c = ok; c.type = (enum lr_schedule_type)7;
	expect_invalid(c, "lr_scheduler.type");

	/* a constant schedule needs no total; boundaries of the ranges are valid */
	c = ok; c.type = LR_SCHEDULE_CONSTANT; c.total_steps = 0;
	ck_assert_int_eq(lr_schedule_validate(&c, NULL), 0);
	c = ok; c.min_lr_ratio = 1.0; c.num_cycles = 0.0; c.warmup_steps = 0;
	ck_assert_int_eq(lr_schedule_validate(&c, NULL), 0);
	/* warmup longer than the run is allowed, as in verl */
	c = ok; c.warmup_steps = 200;
	ck_assert_int_eq(lr_schedule_validate(&c, NULL), 0);
	ck_assert_double_eq(lr_schedule_factor(&c, 100), 0.5);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("schedule");
	TCase *tc = tcase_create("core");

	tcase_add_loop_test(tc, factors_match_torch, 0,
			    (int)(sizeof(cases) / sizeof(cases[0])));
	tcase_add_test(tc, shapes);
	tcase_add_test(tc, validation);
	suite_add_tcase(s, tc);
	return check_run(s);
}
