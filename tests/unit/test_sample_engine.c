/* test_sample_engine.c — generation through the engine API
 * (engine_sampler_*, engine_sample): each sampled token's log-prob equals
 * engine_forward_backward's for the same sequence; a call that joins a
 * running batch gets the tokens it gets alone; a cancelled call ends at
 * the next step with its blocks freed while the others go on; a call the
 * cache could never hold is refused at add (-E2BIG) with nothing joined;
 * a batch changes no training state; a value model cannot sample.
 * Against independent references: tests/integration/test_sample.py
 * (statistics) and tests/verl/test_sample_transformers.py. */
#include <math.h>
#include <stdlib.h>

#include "test_helpers.h"

#define MAXC 64      /* completions a test keeps */
#define NEW 12

struct got {
	int n, ended, rc;
	/* The call's params, poisoned and freed at its end: the engine may
	 * not read them after done (ASan catches it). */
	struct engine_sample_params *own;
	int32_t prompt[MAXC], sample[MAXC], len[MAXC];
	int32_t tokens[MAXC][NEW];
	float logp[MAXC][NEW];
};

static int keep(void *ctx, const struct engine_completion *c, struct eng_error *err)
{
	struct got *g = ctx;

	(void)err;
	ck_assert_int_lt(g->n, MAXC);
	ck_assert_int_le(c->num_tokens, NEW);
	g->prompt[g->n] = c->prompt_index;
	g->sample[g->n] = c->sample_index;
	g->len[g->n] = c->num_tokens;
	memcpy(g->tokens[g->n], c->tokens, sizeof(int32_t) * c->num_tokens);
	memcpy(g->logp[g->n], c->logprobs, sizeof(float) * c->num_tokens);
	g->n++;
	return 0;
}

static void ended(void *ctx, int rc, const struct eng_error *err)
{
	struct got *g = ctx;

	(void)err;
	g->ended++;
	g->rc = rc;
	if (g->own) {
		memset(g->own, 0xab, sizeof(*g->own));
		free(g->own);
		g->own = NULL;
	}
}

/* A heap copy of p owned by its got (freed at the call's end). */
static struct engine_sample_params *owned(struct engine_sample_params p, struct got *g)
{
	g->own = malloc(sizeof(p));
	ck_assert_ptr_nonnull(g->own);
	*g->own = p;
	return g->own;
}

static bool cancel_flag;

static bool cancelled(void *ctx)
{
	(void)ctx;
	return cancel_flag;
}

static const int32_t LENS[3] = {5, 17, 1};

static struct engine_sample_params params(const int32_t *ids, struct got *g, int samples,
					  uint64_t seed)
{
	return (struct engine_sample_params){
		.input_ids = ids, .n = 23, .seq_lens = LENS, .num_prompts = 3,
		.num_samples = samples, .max_tokens = NEW, .temperature = 0.8f, .top_p = 1.0f,
		.seed = seed, .emit = keep, .done = ended, .emit_ctx = g,
	};
}

/* The completion (prompt, sample) of g, or -1. */
static int find(const struct got *g, int prompt, int sample)
{
	for (int i = 0; i < g->n; i++)
		if (g->prompt[i] == prompt && g->sample[i] == sample)
			return i;
	return -1;
}

START_TEST(logprobs_equal_forward_backward)
{
	struct engine *e = make_engine(TINY_QWEN2, "language_model", 5, 1e-3);
	struct eng_error err = {0};
	struct got g = {0};
	int32_t ids[23];
	struct engine_sample_params p;

	tiny_batch(ids, 23, 7);
	p = params(ids, &g, 2, 9);
	ck_assert_msg(engine_sample(e, &p, &err) == 0, "%s", err.msg);
	ck_assert_int_eq(g.n, 6);
	for (int i = 0; i < g.n; i++) {
		int32_t seq[17 + NEW], len = LENS[g.prompt[i]] + g.len[i], off = 0;
		float lp[17 + NEW];
		struct engine_batch bt = {.n = len, .input_ids = seq, .num_seqs = 1,
					  .seq_lens = &len, .temperature = 0.8f,
					  .forward_only = true};
		struct engine_fb_result r = {.log_probs = lp};

		for (int k = 0; k < g.prompt[i]; k++)
			off += LENS[k];
		memcpy(seq, ids + off, sizeof(int32_t) * LENS[g.prompt[i]]);
		memcpy(seq + LENS[g.prompt[i]], g.tokens[i], sizeof(int32_t) * g.len[i]);
		ck_assert_int_eq(engine_forward_backward(e, &bt, &r, &err), 0);
		for (int t = 0; t < g.len[i]; t++)
			ck_assert_msg(fabsf(lp[LENS[g.prompt[i]] + t] - g.logp[i][t]) <= 1e-5f,
				      "prompt %d token %d: %g vs %g", g.prompt[i], t,
				      lp[LENS[g.prompt[i]] + t], g.logp[i][t]);
	}
	engine_destroy(e);
}
END_TEST

START_TEST(join_cancel_refuse)
{
	struct engine *e = make_engine(TINY_QWEN2, "language_model", 5, 1e-3);
	struct eng_error err = {0};
	struct got alone = {0}, a = {0}, b = {0}, c = {0}, big = {0}, one = {0};
	struct engine_sample_params pa, *pb, *pc, pbig;
	struct engine_sampler *s;
	uint64_t before = state_digest(e, false);
	int32_t ids[23];
	int steps = 0;

	tiny_batch(ids, 23, 8);
	pa = params(ids, &alone, 2, 4);
	ck_assert_int_eq(engine_sample(e, &pa, &err), 0);

	ck_assert_msg(engine_sampler_open(e, &s, &err) == 0, "%s", err.msg);
	ck_assert_int_eq(engine_sampler_add(s, owned(params(ids, &a, 1, 11), &a), &err), 0);
	ck_assert_int_eq(engine_sampler_step(s, &err), 0);
	ck_assert_int_eq(engine_sampler_step(s, &err), 0);
	/* b joins two steps in; c joins and is cancelled at once */
	pb = owned(params(ids, &b, 2, 4), &b);
	pc = owned(params(ids, &c, 3, 1), &c);
	pc->cancelled = cancelled;
	cancel_flag = true;
	ck_assert_int_eq(engine_sampler_add(s, pb, &err), 0);
	ck_assert_int_eq(engine_sampler_add(s, pc, &err), 0);
	/* one that ends in its prefill (max_tokens 1) */
	{
		struct engine_sample_params *p1 = owned(params(ids, &one, 2, 5), &one);

		p1->max_tokens = 1;
		ck_assert_int_eq(engine_sampler_add(s, p1, &err), 0);
	}
	/* a call that could never fit: refused, nothing joined */
	pbig = params(ids, &big, 60000, 1);
	pbig.max_tokens = 400;
	ck_assert_int_eq(engine_sampler_add(s, &pbig, &err), -E2BIG);
	ck_assert_ptr_nonnull(strstr(err.msg, "kv_cache_bytes"));
	ck_assert_int_eq(engine_sampler_calls(s), 4);
	while (engine_sampler_calls(s) > 0 && steps++ < 100)
		ck_assert_int_eq(engine_sampler_step(s, &err), 0);
	ck_assert_int_eq(engine_sampler_calls(s), 0);
	engine_sampler_close(s);
	cancel_flag = false;

	ck_assert_int_eq(one.ended, 1);
	ck_assert_int_eq(one.rc, 0);
	ck_assert_int_eq(one.n, 6);
	ck_assert_int_eq(c.ended, 1);
	ck_assert_int_eq(c.rc, -ECANCELED);
	ck_assert_int_eq(big.ended, 0);
	ck_assert_int_eq(a.ended, 1);
	ck_assert_int_eq(a.rc, 0);
	ck_assert_int_eq(a.n, 3);
	ck_assert_int_eq(b.ended, 1);
	ck_assert_int_eq(b.rc, 0);
	ck_assert_int_eq(b.n, alone.n);
	for (int i = 0; i < alone.n; i++) {
		int j = find(&b, alone.prompt[i], alone.sample[i]);

		ck_assert_int_ge(j, 0);
		ck_assert_int_eq(b.len[j], alone.len[i]);
		ck_assert_mem_eq(b.tokens[j], alone.tokens[i], sizeof(int32_t) * alone.len[i]);
	}
	ck_assert_uint_eq(state_digest(e, false), before);
	engine_destroy(e);
}
END_TEST

START_TEST(value_model_refused)
{
	struct engine *e = make_engine(TINY_QWEN2, "value_model", 5, 1e-3);
	struct eng_error err = {0};
	struct engine_sampler *s = NULL;

	ck_assert_int_eq(engine_sampler_open(e, &s, &err), -EALREADY);
	ck_assert_ptr_null(s);
	engine_destroy(e);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("sample_engine");
	TCase *tc = tcase_create("core");

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, logprobs_equal_forward_backward);
	tcase_add_test(tc, join_cancel_refuse);
	tcase_add_test(tc, value_model_refused);
	suite_add_tcase(s, tc);
	return check_run(s);
}
