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
	/* The engine's factor on a loss's gradients (1/W in a group). */
	double gs = io->grad_scale > 0 ? io->grad_scale : 1.0;

	g->calls++;
	if (g->calls == g->fail_call)
		return eng_fail(err, -EINVAL, "test loss: call %d refused", g->calls);
	for (int64_t i = 0; i < io->n; i++) {
		int64_t t = io->token_index[i];

		io->d_log_probs[i] = g->g_logp ? (float)(g->g_logp[t] * gs) : 0.0f;
		io->d_entropy[i] = g->g_ent ? (float)(g->g_ent[t] * gs) : 0.0f;
		if (io->d_values)
			io->d_values[i] = g->g_val ? (float)(g->g_val[t] * gs) : 0.0f;
	}
	return 0;
}

/* Vocabulary of TINY_QWEN2. */
#define TINY_V 97

/* n token ids in [0, TINY_V) from a seed. */
static inline void tiny_batch(int32_t *ids, int64_t n, uint32_t seed)
{
	for (int64_t i = 0; i < n; i++) {
		seed = seed * 1664525u + 1013904223u;
		ids[i] = (int32_t)((seed >> 8) % TINY_V);
	}
}

/* x[n] uniform in [-scale/2, scale/2) from a seed. */
static inline void tiny_fill(float *x, int64_t n, uint32_t seed, float scale)
{
	for (int64_t i = 0; i < n; i++) {
		seed = seed * 1664525u + 1013904223u;
		x[i] = scale * ((float)((seed >> 8) & 0xffff) / 65536.0f - 0.5f);
	}
}

/* One forward_backward of e at temperature 0.7 with the given upstream
 * gradients; returns rc. */
static inline int tiny_fb(struct engine *e, const int32_t *ids, int64_t n,
			  const int32_t *lens, int32_t ns, const float *g_logp,
			  const float *g_ent, int64_t budget, bool fwd_only, float *logp,
			  float *ent, struct eng_error *err)
{
	struct given_grads gg = {.g_logp = g_logp, .g_ent = g_ent};
	struct engine_batch b = {
		.n = n, .input_ids = ids, .num_seqs = ns, .seq_lens = lens,
		.temperature = 0.7f, .forward_only = fwd_only,
		.max_tokens_per_micro_batch = budget, .loss_fn = given_loss, .loss_ctx = &gg,
	};
	struct engine_fb_result r = {.log_probs = logp, .entropy = ent};

	return engine_forward_backward(e, &b, &r, err);
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
