/* test_helpers.h — small helpers shared by the engine-level unit tests:
 * tiny model configs, an engine factory, a loss with given upstream
 * gradients, and a digest of an engine's parameters / gradients. Suites run
 * through check_run (check_run.h). */
#ifndef ENGINED_TEST_HELPERS_H
#define ENGINED_TEST_HELPERS_H

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "check_run.h"
#include "engine.h"

/* A tiny qwen2 (q/k/v bias, GQA 4/2, untied). */
static const char *const TINY_QWEN2 =
	"{\"model_type\": \"qwen2\", \"vocab_size\": 97, \"hidden_size\": 32,"
	" \"intermediate_size\": 48, \"num_hidden_layers\": 2,"
	" \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
	" \"rms_norm_eps\": 1e-6, \"rope_theta\": 10000.0,"
	" \"tie_word_embeddings\": false, \"max_position_embeddings\": 512}";

static inline struct engine *make_engine(const char *json, const char *model_type,
					 uint64_t seed, double lr)
{
	struct engine_init_config cfg;
	struct eng_error err = {0};
	struct engine *e = NULL;
	int rc;

	engine_init_config_defaults(&cfg);
	cfg.hf_config_json = json;
	cfg.model_type = model_type;
	cfg.seed = seed;
	cfg.optim.lr = lr;
	cfg.threads = 2;
	rc = engine_create(&cfg, &e, &err);
	ck_assert_msg(rc == 0, "engine_create: %s", err.msg);
	return e;
}

/* Loss whose upstream gradients are given per request token. */
struct given_grads {
	const float *g_logp, *g_ent, *g_val;  /* [n] request order; NULL = 0 */
	int calls;
	int fail_call;        /* > 0: that call (1-based) fails with -EINVAL */
};

static inline int given_loss(void *ctx, struct engine_loss_io *io, struct eng_error *err)
{
	struct given_grads *g = ctx;

	g->calls++;
	if (g->calls == g->fail_call)
		return eng_fail(err, -EINVAL, "test loss: call %d refused", g->calls);
	for (int64_t i = 0; i < io->n; i++) {
		int64_t t = io->token_index[i];

		io->d_log_probs[i] = g->g_logp ? g->g_logp[t] : 0.0f;
		io->d_entropy[i] = g->g_ent ? g->g_ent[t] : 0.0f;
		if (io->d_values)
			io->d_values[i] = g->g_val ? g->g_val[t] : 0.0f;
	}
	return 0;
}

/* XXH64 over all parameters (grads=false) or gradients (grads=true). */
static inline uint64_t state_digest(struct engine *e, bool grads)
{
	XXH64_state_t *s = XXH64_createState();
	struct engine_param_view v;
	uint64_t h;

	XXH64_reset(s, 0);
	for (int64_t i = 0; i < engine_num_params(e); i++) {
		int rc = grads ? engine_grad(e, i, &v, NULL) : engine_param(e, i, &v, NULL);

		ck_assert_int_eq(rc, 0);
		XXH64_update(s, v.host_data, v.numel * sizeof(float));
	}
	h = XXH64_digest(s);
	XXH64_freeState(s);
	return h;
}

/* Max |grad| over all parameters. */
static inline double grad_max_abs(struct engine *e)
{
	struct engine_param_view v;
	double m = 0;

	for (int64_t i = 0; i < engine_num_params(e); i++) {
		ck_assert_int_eq(engine_grad(e, i, &v, NULL), 0);
		for (int64_t j = 0; j < v.numel; j++)
			if (fabs(v.host_data[j]) > m || v.host_data[j] != v.host_data[j])
				m = v.host_data[j] != v.host_data[j] ? INFINITY : fabs(v.host_data[j]);
	}
	return m;
}

#endif
