/* test_engine.c — the engine object through its public API: registry,
 * outputs and their alignment, micro-batch invariance, rejected inputs
 * leaving the state unchanged, the mode context, AdamW + clipping against
 * hand-computed values, non-finite skip, schedules. Numerics of the model
 * itself are checked against torch in tests/parity. */
#include <math.h>

#include "io/safetensors.h"
#include "test_helpers.h"

#define V 97

START_TEST(registry)
{
	const struct engine_ops *ops;
	struct eng_error err = {0};

	ck_assert_int_eq(engine_registry_lookup("language_model", "native", "cpu", &ops, &err), 0);
	ck_assert_str_eq(ops->device, "cpu");
	ck_assert_int_eq(engine_registry_lookup("value_model", "native", "cpu", &ops, &err), 0);
	ck_assert_str_eq(ops->model_type, "value_model");
	ck_assert_int_eq(engine_registry_lookup("language_model", "fsdp", "tpu", &ops, &err), -ENODEV);
	ck_assert_msg(strstr(err.msg, "(language_model, fsdp, tpu)"), "%s", err.msg);
	ck_assert_msg(strstr(err.msg, "(language_model, native, cpu)"), "%s", err.msg);
	ck_assert_msg(strstr(err.msg, "(value_model, native, cpu)"), "%s", err.msg);
}
END_TEST

START_TEST(create_errors)
{
	struct engine_init_config cfg;
	struct eng_error err = {0};
	struct engine *e = (struct engine *)0x1;

	engine_init_config_defaults(&cfg);
	ck_assert_int_eq(engine_create(&cfg, &e, &err), -EINVAL);
	ck_assert_msg(strstr(err.msg, "hf_config_json"), "%s", err.msg);
	ck_assert_ptr_eq(e, (struct engine *)0x1);

	eng_error_clear(&err);
	cfg.hf_config_json = "{\"model_type\": \"gpt2\"}";
	ck_assert_int_eq(engine_create(&cfg, &e, &err), -EINVAL);
	ck_assert_msg(strstr(err.msg, "model_type"), "%s", err.msg);

	eng_error_clear(&err);
	cfg.hf_config_json = TINY_QWEN2;
	cfg.optim.beta1 = 1.5;
	ck_assert_int_eq(engine_create(&cfg, &e, &err), -EINVAL);
	ck_assert_msg(strstr(err.msg, "optimizer.beta1"), "%s", err.msg);

	eng_error_clear(&err);
	engine_init_config_defaults(&cfg);
	cfg.hf_config_json = TINY_QWEN2;
	cfg.device = "cuda";
	ck_assert_int_eq(engine_create(&cfg, &e, &err), -ENODEV);
	ck_assert_ptr_eq(e, (struct engine *)0x1);
}
END_TEST

static int polls;

/* Says "cancelled" at its third poll. */
static bool cancel_at_third(void *ctx)
{
	(void)ctx;
	return ++polls >= 3;
}

/* A cancelled build stops between tensors with -ECANCELED naming how far
 * it got, and leaves nothing behind; a model whose state cannot fit in the
 * device's free memory is refused before anything is allocated. */
START_TEST(create_cancelled_and_too_large)
{
	struct engine_init_config cfg;
	struct eng_error err = {0};
	struct engine *e = (struct engine *)0x1;

	engine_init_config_defaults(&cfg);
	cfg.hf_config_json = TINY_QWEN2;
	cfg.cancelled = cancel_at_third;
	polls = 0;
	ck_assert_int_eq(engine_create(&cfg, &e, &err), -ECANCELED);
	ck_assert_ptr_eq(e, (struct engine *)0x1);
	ck_assert_int_eq(polls, 3);
	ck_assert_msg(strstr(err.msg, "cancelled") && strstr(err.msg, "after 2 of "), "%s",
		      err.msg);

	/* 2^34 + 2^30 + ... parameters: 272 GiB of state, more than any test
	 * machine has (V*C embedding + 4*C*C attention + 3*C*F MLP + norms). */
	eng_error_clear(&err);
	engine_init_config_defaults(&cfg);
	cfg.hf_config_json = "{\"model_type\": \"llama\", \"vocab_size\": 1048576, "
			     "\"hidden_size\": 16384, \"intermediate_size\": 16, "
			     "\"num_hidden_layers\": 1, \"num_attention_heads\": 128, "
			     "\"tie_word_embeddings\": true}";
	ck_assert_int_eq(engine_create(&cfg, &e, &err), -ENOMEM);
	ck_assert_ptr_eq(e, (struct engine *)0x1);
	ck_assert_msg(strstr(err.msg, "18254446592 parameters need about 272.0 GiB") &&
		      strstr(err.msg, "GiB free"), "%s",
		      err.msg);
}
END_TEST

/* Outputs are target-aligned (0 at each sequence start) and each
 * sequence's outputs do not depend on its neighbours or its place in the
 * packed batch. */
START_TEST(outputs_aligned_and_isolated)
{
	struct engine *e = make_engine(TINY_QWEN2, "language_model", 1, 1e-3);
	int32_t lens[3] = {5, 1, 9}, lens2[3] = {9, 5, 1};
	int32_t ids[15], ids2[15];
	float lp[15], en[15], lp2[15], en2[15];
	struct eng_error err = {0};

	tiny_batch(ids, 15, 7);
	/* permuted batch: seq2, seq0, seq1 */
	memcpy(ids2, ids + 6, 9 * sizeof(int32_t));
	memcpy(ids2 + 9, ids, 5 * sizeof(int32_t));
	ids2[14] = ids[5];
	ck_assert_int_eq(tiny_fb(e, ids, 15, lens, 3, NULL, NULL, 0, true, lp, en, &err), 0);
	ck_assert_int_eq(tiny_fb(e, ids2, 15, lens2, 3, NULL, NULL, 10, true, lp2, en2, &err), 0);
	ck_assert_float_eq(lp[0], 0.0f);
	ck_assert_float_eq(lp[5], 0.0f);
	ck_assert_float_eq(lp[6], 0.0f);
	ck_assert_float_eq(en[0], 0.0f);
	for (int t = 0; t < 15; t++) {
		if (t == 0 || t == 5 || t == 6)
			continue;
		ck_assert(lp[t] < 0.0f);
		ck_assert(en[t] > 0.0f && en[t] <= logf(V) + 1e-4f);
	}
	for (int t = 0; t < 9; t++) {
		ck_assert(fabsf(lp[6 + t] - lp2[t]) < 1e-5f);
		ck_assert(fabsf(en[6 + t] - en2[t]) < 1e-5f);
	}
	for (int t = 0; t < 5; t++)
		ck_assert(fabsf(lp[t] - lp2[9 + t]) < 1e-5f);
	engine_destroy(e);
}
END_TEST

/* Gradients summed over micro-batches equal one micro-batch's. */
START_TEST(micro_batch_invariance)
{
	struct engine *a = make_engine(TINY_QWEN2, "language_model", 3, 1e-3);
	struct engine *b = make_engine(TINY_QWEN2, "language_model", 3, 1e-3);
	int32_t lens[4] = {7, 3, 11, 4}, ids[25];
	float gl[25], ge[25];
	struct engine_param_view va, vb;
	struct eng_error err = {0};
	double worst = 0;

	tiny_batch(ids, 25, 11);
	tiny_fill(gl, 25, 5, 1.0f);
	tiny_fill(ge, 25, 6, 0.5f);
	ck_assert_int_eq(tiny_fb(a, ids, 25, lens, 4, gl, ge, 0, false, NULL, NULL, &err), 0);
	ck_assert_int_eq(tiny_fb(b, ids, 25, lens, 4, gl, ge, 11, false, NULL, NULL, &err), 0);
	for (int64_t i = 0; i < engine_num_params(a); i++) {
		ck_assert_int_eq(engine_grad(a, i, &va, NULL), 0);
		ck_assert_int_eq(engine_grad(b, i, &vb, NULL), 0);
		for (int64_t j = 0; j < va.numel; j++) {
			double d = fabs(va.host_data[j] - vb.host_data[j]) /
				   (1e-3 + fabs(va.host_data[j]));
			worst = d > worst ? d : worst;
		}
	}
	ck_assert_msg(worst < 1e-4, "worst relative gradient difference %g", worst);
	ck_assert(grad_max_abs(a) > 1e-4);
	engine_destroy(a);
	engine_destroy(b);
}
END_TEST

/* One training call of e with activation recompute `mode` (engine.h). */
static void recompute_fb(struct engine *e, int mode, const int32_t *ids, const int32_t *lens,
			 const float *gl, const float *ge, float *logp)
{
	struct given_grads gg = {.g_logp = gl, .g_ent = ge};
	struct engine_batch b = {
		.n = 25, .input_ids = ids, .num_seqs = 4, .seq_lens = lens,
		.temperature = 0.7f, .max_tokens_per_micro_batch = 11,
		.activation_recompute = mode, .loss_fn = given_loss, .loss_ctx = &gg,
	};
	struct engine_fb_result r = {.log_probs = logp};
	struct eng_error err = {0};

	ck_assert_msg(engine_forward_backward(e, &b, &r, &err) == 0, "%s", err.msg);
}

/* Activation recompute (issue 30): the gradients and outputs of a call
 * are bit for bit those without it, whether the call asks for it or the
 * engine's default does; an explicit OFF overrides an engine default ON. */
START_TEST(activation_recompute_same_gradients)
{
	struct engine *plain = make_engine(TINY_QWEN2, "language_model", 3, 1e-3);
	struct engine *per_call = make_engine(TINY_QWEN2, "language_model", 3, 1e-3);
	struct engine_init_config cfg;
	struct engine *by_default = NULL;
	struct eng_error err = {0};
	int32_t lens[4] = {7, 3, 11, 4}, ids[25];
	float gl[25], ge[25], lp[3][25];
	uint64_t want;

	engine_init_config_defaults(&cfg);
	cfg.hf_config_json = TINY_QWEN2;
	cfg.model_type = "language_model";
	cfg.seed = 3;
	cfg.optim.lr = 1e-3;
	cfg.threads = 2;
	cfg.activation_recompute = true;
	ck_assert_int_eq(engine_create(&cfg, &by_default, &err), 0);
	tiny_batch(ids, 25, 11);
	tiny_fill(gl, 25, 5, 1.0f);
	tiny_fill(ge, 25, 6, 0.5f);
	recompute_fb(plain, ENGINE_RECOMPUTE_DEFAULT, ids, lens, gl, ge, lp[0]);
	recompute_fb(per_call, ENGINE_RECOMPUTE_ON, ids, lens, gl, ge, lp[1]);
	recompute_fb(by_default, ENGINE_RECOMPUTE_DEFAULT, ids, lens, gl, ge, lp[2]);
	want = state_digest(plain, true);
	ck_assert(grad_max_abs(plain) > 1e-4);
	ck_assert_uint_eq(state_digest(per_call, true), want);
	ck_assert_uint_eq(state_digest(by_default, true), want);
	ck_assert_mem_eq(lp[1], lp[0], sizeof(lp[0]));
	ck_assert_mem_eq(lp[2], lp[0], sizeof(lp[0]));
	/* A second call on top (accumulating), OFF on the recomputing engine. */
	recompute_fb(plain, ENGINE_RECOMPUTE_ON, ids, lens, ge, gl, lp[0]);
	recompute_fb(by_default, ENGINE_RECOMPUTE_OFF, ids, lens, ge, gl, lp[2]);
	ck_assert_uint_eq(state_digest(by_default, true), state_digest(plain, true));
	engine_destroy(plain);
	engine_destroy(per_call);
	engine_destroy(by_default);
}
END_TEST

/* Every bad input is refused with a message naming the field, and neither
 * parameters nor gradients nor the step change. */
START_TEST(bad_inputs_leave_state)
{
	struct engine *e = make_engine(TINY_QWEN2, "language_model", 5, 1e-3);
	int32_t lens[2] = {6, 4}, ids[10], bad_ids[10];
	float gl[10];
	struct engine_status st0, st1;
	struct eng_error err = {0};
	uint64_t p0, g0;

	tiny_batch(ids, 10, 3);
	tiny_fill(gl, 10, 9, 1.0f);
	ck_assert_int_eq(engine_set_mode(e, ENGINE_MODE_TRAIN, false, &err), 0);
	ck_assert_int_eq(tiny_fb(e, ids, 10, lens, 2, gl, NULL, 0, false, NULL, NULL, &err), 0);
	p0 = state_digest(e, false);
	g0 = state_digest(e, true);
	engine_status(e, &st0);

	int32_t short_lens[2] = {6, 3};
	ck_assert_int_eq(tiny_fb(e, ids, 10, short_lens, 2, gl, NULL, 0, false, NULL, NULL, &err), -EINVAL);
	ck_assert_msg(strstr(err.msg, "seq_lens"), "%s", err.msg);

	eng_error_clear(&err);
	memcpy(bad_ids, ids, sizeof(ids));
	bad_ids[7] = V;
	ck_assert_int_eq(tiny_fb(e, bad_ids, 10, lens, 2, gl, NULL, 0, false, NULL, NULL, &err), -EINVAL);
	ck_assert_msg(strstr(err.msg, "input_ids[7]"), "%s", err.msg);
	bad_ids[7] = -1;
	ck_assert_int_eq(tiny_fb(e, bad_ids, 10, lens, 2, gl, NULL, 0, false, NULL, NULL, &err), -EINVAL);

	eng_error_clear(&err);
	ck_assert_int_eq(tiny_fb(e, ids, 10, lens, 2, gl, NULL, 5, false, NULL, NULL, &err), -EINVAL);
	ck_assert_msg(strstr(err.msg, "seq_lens[0]"), "%s", err.msg);

	eng_error_clear(&err);
	int32_t zero_lens[3] = {6, 0, 4};
	ck_assert_int_eq(tiny_fb(e, ids, 10, zero_lens, 3, gl, NULL, 0, false, NULL, NULL, &err), -EINVAL);
	ck_assert_msg(strstr(err.msg, "seq_lens[1]"), "%s", err.msg);

	eng_error_clear(&err);
	{
		struct given_grads gg = {.g_logp = gl};
		struct engine_batch b = {
			.n = 10, .input_ids = ids, .num_seqs = 2, .seq_lens = lens,
			.loss_fn = given_loss, .loss_ctx = &gg,
		};
		struct engine_fb_result r = {0};

		/* Limits of engine_batch_check (the planner once overflowed
		 * on an INT64_MAX budget). */
		b.max_tokens_per_micro_batch = INT64_MAX;
		ck_assert_int_eq(engine_forward_backward(e, &b, &r, &err), -EINVAL);
		ck_assert_msg(strstr(err.msg, "max_tokens_per_micro_batch"), "%s", err.msg);
		eng_error_clear(&err);
		b.max_tokens_per_micro_batch = 0;
		b.n = ENGINE_MAX_TOKENS + 1;
		ck_assert_int_eq(engine_forward_backward(e, &b, &r, &err), -EINVAL);
		ck_assert_msg(strstr(err.msg, "at most"), "%s", err.msg);
		eng_error_clear(&err);
		b.n = 10;
		b.temperature = -1.0f;
		ck_assert_int_eq(engine_forward_backward(e, &b, &r, &err), -EINVAL);
		ck_assert_msg(strstr(err.msg, "temperature"), "%s", err.msg);
		eng_error_clear(&err);
		b.temperature = 1.0f;
		b.loss_fn = NULL;
		ck_assert_int_eq(engine_forward_backward(e, &b, &r, &err), -EINVAL);
		ck_assert_msg(strstr(err.msg, "loss"), "%s", err.msg);
	}

	ck_assert_uint_eq(state_digest(e, false), p0);
	ck_assert_uint_eq(state_digest(e, true), g0);
	engine_status(e, &st1);
	ck_assert_int_eq(st1.step, st0.step);
	ck_assert_int_eq(st1.mode, ENGINE_MODE_TRAIN);

	/* still usable: the same good call works and changes the grads */
	ck_assert_int_eq(tiny_fb(e, ids, 10, lens, 2, gl, NULL, 0, false, NULL, NULL, &err), 0);
	ck_assert_uint_ne(state_digest(e, true), g0);
	engine_destroy(e);
}
END_TEST

/* A prepared ForwardBackward (engine_fb_call_prepare): its rules checked
 * once, at prepare (a bad loss_mask is refused there, before any engine);
 * run once; and refused when the engine it runs on is no longer the kind
 * of model its loss was checked for (an Initialize queued in between). */
START_TEST(prepared_call_checked_once)
{
	struct engine *lm = make_engine(TINY_QWEN2, "language_model", 5, 1e-3);
	struct engine *vm = make_engine(TINY_QWEN2, "value_model", 5, 1e-3);
	int32_t lens[2] = {6, 4}, ids[10];
	float mask[10], adv[10], old[10], logp[10];
	const char *names[ENGINE_FB_INPUTS];
	struct engine_fb_request r = {0};
	struct engine_fb_result res = {.log_probs = logp};
	struct engine_fb_loss fl;
	struct engine_fb_call *c = NULL;
	struct eng_error err = {0};

	tiny_batch(ids, 10, 3);
	tiny_fill(adv, 10, 4, 1.0f);
	tiny_fill(old, 10, 5, 1.0f);
	for (int i = 0; i < 10; i++)
		mask[i] = i % 6 != 0;
	r.batch = (struct engine_batch){ .n = 10, .input_ids = ids, .num_seqs = 2,
					 .seq_lens = lens, .temperature = 1.0f };
	for (int k = 0; k < ENGINE_FB_INPUTS; k++) {
		names[k] = engine_fb_input_name(k);
		if (!strcmp(names[k], "loss_mask"))
			r.inputs[k] = mask;
		else if (!strcmp(names[k], "advantages"))
			r.inputs[k] = adv;
		else if (!strcmp(names[k], "old_log_probs"))
			r.inputs[k] = old;
	}
	r.loss = "ppo";

	mask[3] = 0.5f;
	ck_assert_int_eq(engine_fb_call_prepare(&r, false, &c, &err), -EINVAL);
	ck_assert_msg(strstr(err.msg, "loss_mask[3]"), "%s", err.msg);
	ck_assert_ptr_null(c);
	mask[3] = 1.0f;

	eng_error_clear(&err);
	ck_assert_int_eq(engine_fb_call_prepare(&r, false, &c, &err), 0);
	ck_assert_int_eq(engine_set_mode(vm, ENGINE_MODE_TRAIN, false, &err), 0);
	ck_assert_int_eq(engine_fb_call_run(vm, c, &res, &fl, &err), -EINVAL);
	ck_assert_msg(strstr(err.msg, "checked for a language model"), "%s", err.msg);
	ck_assert_int_eq(engine_set_mode(lm, ENGINE_MODE_TRAIN, false, &err), 0);
	ck_assert_int_eq(engine_fb_call_run(lm, c, &res, &fl, &err), 0);
	ck_assert(isfinite(fl.loss) && fl.loss != 0.0 && fl.num_metrics > 0);
	eng_error_clear(&err);
	ck_assert_int_eq(engine_fb_call_run(lm, c, &res, &fl, &err), -EINVAL);
	ck_assert_msg(strstr(err.msg, "runs once"), "%s", err.msg);
	engine_fb_call_free(c);
	engine_destroy(vm);
	engine_destroy(lm);
}
END_TEST

START_TEST(mode_context)
{
	struct engine_init_config cfg;
	struct eng_error err = {0};
	struct engine_status st;
	struct engine_step_result sr;
	struct engine *e;
	int32_t lens[1] = {8}, ids[8];
	float gl[8];

	engine_init_config_defaults(&cfg);
	cfg.hf_config_json = TINY_QWEN2;
	cfg.param_offload = true;
	cfg.optimizer_offload = true;
	ck_assert_int_eq(engine_create(&cfg, &e, &err), 0);
	engine_status(e, &st);
	ck_assert_int_eq(st.mode, ENGINE_MODE_IDLE);
	ck_assert(!st.placement.model && !st.placement.optimizer && !st.placement.grad);

	tiny_batch(ids, 8, 1);
	tiny_fill(gl, 8, 2, 1.0f);
	ck_assert_int_eq(engine_set_mode(e, ENGINE_MODE_TRAIN, false, &err), 0);
	engine_status(e, &st);
	ck_assert(st.placement.model && st.placement.optimizer && st.placement.grad);
	ck_assert_int_eq(tiny_fb(e, ids, 8, lens, 1, gl, NULL, 0, false, NULL, NULL, &err), 0);
	ck_assert(grad_max_abs(e) > 0);
	/* leaving TRAIN zeroes grads and offloads */
	ck_assert_int_eq(engine_set_mode(e, ENGINE_MODE_IDLE, false, &err), 0);
	ck_assert(grad_max_abs(e) == 0);
	engine_status(e, &st);
	ck_assert(!st.placement.model && !st.placement.optimizer);

	/* EVAL loads the model only and refuses training */
	ck_assert_int_eq(engine_set_mode(e, ENGINE_MODE_EVAL, false, &err), 0);
	engine_status(e, &st);
	ck_assert(st.placement.model && !st.placement.optimizer);
	ck_assert_int_eq(tiny_fb(e, ids, 8, lens, 1, gl, NULL, 0, false, NULL, NULL, &err), -EALREADY);
	eng_error_clear(&err);
	ck_assert_int_eq(engine_optimizer_step(e, &sr, &err), -EALREADY);
	eng_error_clear(&err);
	ck_assert_int_eq(tiny_fb(e, ids, 8, lens, 1, NULL, NULL, 0, true, NULL, NULL, &err), 0);

	/* disable_auto_offload: leaving keeps the placement */
	ck_assert_int_eq(engine_set_mode(e, ENGINE_MODE_IDLE, false, &err), 0);
	ck_assert_int_eq(engine_set_mode(e, ENGINE_MODE_TRAIN, true, &err), 0);
	engine_status(e, &st);
	ck_assert(!st.placement.model);   /* no auto placement on enter either */
	ck_assert_int_eq(engine_set_mode(e, ENGINE_MODE_IDLE, false, &err), 0);

	/* per-call context from IDLE keeps the grads between calls */
	ck_assert_int_eq(tiny_fb(e, ids, 8, lens, 1, gl, NULL, 0, false, NULL, NULL, &err), 0);
	engine_status(e, &st);
	ck_assert_int_eq(st.mode, ENGINE_MODE_IDLE);
	ck_assert(!st.placement.model);
	ck_assert(grad_max_abs(e) > 0);
	ck_assert_int_eq(engine_optimizer_step(e, &sr, &err), 0);
	ck_assert(!sr.skipped);
	ck_assert_int_eq(sr.step, 1);
	ck_assert(grad_max_abs(e) == 0);

	ck_assert_int_eq(engine_to(e, true, false, true, false, &err), -EINVAL);
	ck_assert_msg(strstr(err.msg, "model=false"), "%s", err.msg);
	eng_error_clear(&err);
	ck_assert_int_eq(engine_to(e, true, true, false, false, &err), 0);
	engine_status(e, &st);
	ck_assert(st.placement.model && !st.placement.optimizer);
	engine_destroy(e);
}
END_TEST

/* One AdamW step against the closed form of step 1:
 * g' = c*g (c = clip coefficient), m_hat = g', v_hat = g'^2, so
 * p1 = p0 * (1 - lr*wd) - lr * g' / (|g'| + eps). */
START_TEST(adamw_first_step_with_clipping)
{
	const double lr = 1e-2, wd = 0.1, eps = 1e-8, clip = 0.05;
	struct engine_init_config cfg;
	struct eng_error err = {0};
	struct engine_step_result sr;
	struct engine_param_view v;
	struct engine *e;
	int32_t lens[2] = {9, 7}, ids[16];
	float gl[16];
	float **p0, **g0;
	int64_t np;
	double sumsq = 0, coef, worst = 0;

	engine_init_config_defaults(&cfg);
	cfg.hf_config_json = TINY_QWEN2;
	cfg.optim.lr = lr;
	cfg.optim.weight_decay = wd;
	cfg.optim.eps = eps;
	cfg.optim.clip_grad = clip;
	cfg.seed = 42;
	ck_assert_int_eq(engine_create(&cfg, &e, &err), 0);
	tiny_batch(ids, 16, 77);
	tiny_fill(gl, 16, 78, 2.0f);
	ck_assert_int_eq(tiny_fb(e, ids, 16, lens, 2, gl, NULL, 0, false, NULL, NULL, &err), 0);

	np = engine_num_params(e);
	p0 = calloc(np, sizeof(*p0));
	g0 = calloc(np, sizeof(*g0));
	for (int64_t i = 0; i < np; i++) {
		ck_assert_int_eq(engine_param(e, i, &v, NULL), 0);
		p0[i] = malloc(v.numel * sizeof(float));
		memcpy(p0[i], v.host_data, v.numel * sizeof(float));
		ck_assert_int_eq(engine_grad(e, i, &v, NULL), 0);
		g0[i] = malloc(v.numel * sizeof(float));
		memcpy(g0[i], v.host_data, v.numel * sizeof(float));
		for (int64_t j = 0; j < v.numel; j++)
			sumsq += (double)v.host_data[j] * v.host_data[j];
	}
	ck_assert_int_eq(engine_optimizer_step(e, &sr, &err), 0);
	ck_assert(!sr.skipped);
	ck_assert_msg(fabs(sr.grad_norm - sqrt(sumsq)) < 1e-5 * sqrt(sumsq), "norm %g vs %g",
		      sr.grad_norm, sqrt(sumsq));
	ck_assert_msg(sqrt(sumsq) > clip, "clipping must be active in this test");
	ck_assert(fabs(sr.lr - lr) < 1e-12);
	coef = clip / (sqrt(sumsq) + 1e-6);
	for (int64_t i = 0; i < np; i++) {
		ck_assert_int_eq(engine_param(e, i, &v, NULL), 0);
		for (int64_t j = 0; j < v.numel; j++) {
			double g = coef * g0[i][j];
			double want = p0[i][j] * (1 - lr * wd) - lr * g / (fabs(g) + eps);
			double d = fabs(v.host_data[j] - want);

			worst = d > worst ? d : worst;
		}
		free(p0[i]);
		free(g0[i]);
	}
	free(p0);
	free(g0);
	/* fp32 arithmetic on values of size ~lr: 1e-6 absolute is generous */
	ck_assert_msg(worst < 2e-6, "worst AdamW deviation %g", worst);
	engine_destroy(e);
}
END_TEST

static int nan_loss(void *ctx, struct engine_loss_io *io, struct eng_error *err)
{
	(void)ctx;
	(void)err;
	for (int64_t i = 0; i < io->n; i++)
		io->d_log_probs[i] = (i == 2) ? NAN : 1.0f;
	return 0;
}

START_TEST(nonfinite_norm_skips)
{
	struct engine *e = make_engine(TINY_QWEN2, "language_model", 8, 1e-2);
	int32_t lens[1] = {6}, ids[6];
	struct engine_batch b = {.n = 6, .input_ids = ids, .num_seqs = 1, .seq_lens = lens,
				 .loss_fn = nan_loss};
	struct engine_fb_result r = {0};
	struct engine_step_result sr;
	struct eng_error err = {0};
	uint64_t p0 = state_digest(e, false);

	tiny_batch(ids, 6, 4);
	ck_assert_int_eq(engine_forward_backward(e, &b, &r, &err), 0);
	ck_assert_int_eq(engine_optimizer_step(e, &sr, &err), 0);
	ck_assert(sr.skipped);
	ck_assert(!isfinite(sr.grad_norm));
	ck_assert_int_eq(sr.step, 0);
	ck_assert_uint_eq(state_digest(e, false), p0);
	ck_assert(grad_max_abs(e) == 0);
	engine_destroy(e);
}
END_TEST

START_TEST(schedule_through_engine)
{
	struct engine_init_config cfg;
	struct eng_error err = {0};
	struct engine_status st;
	struct engine *e;
	double lr;

	engine_init_config_defaults(&cfg);
	cfg.hf_config_json = TINY_QWEN2;
	cfg.optim.lr = 1.0;
	cfg.sched.type = LR_SCHEDULE_COSINE;
	cfg.sched.warmup_steps = 2;
	cfg.sched.total_steps = 10;
	cfg.sched.min_lr_ratio = 0.1;
	cfg.sched.num_cycles = 0.5;
	ck_assert_int_eq(engine_create(&cfg, &e, &err), 0);
	engine_status(e, &st);
	ck_assert(fabs(st.lr - 0.0) < 1e-12);           /* warmup step 0 */
	ck_assert_int_eq(engine_lr_scheduler_step(e, &lr, &err), 0);
	ck_assert(fabs(lr - 0.5) < 1e-12);              /* 1/2 of warmup */
	ck_assert_int_eq(engine_lr_scheduler_step(e, &lr, &err), 0);
	ck_assert(fabs(lr - 1.0) < 1e-12);              /* warmup done */
	for (int i = 0; i < 4; i++)
		ck_assert_int_eq(engine_lr_scheduler_step(e, &lr, &err), 0);
	/* step 6: progress 0.5 -> 0.1 + 0.9 * 0.5 * (1 + cos(pi/2)) = 0.55 */
	ck_assert_msg(fabs(lr - 0.55) < 1e-9, "lr %g", lr);
	engine_destroy(e);
}
END_TEST

/* Converted slices equal the host conversion of the fp32 parameters. */
START_TEST(param_copy_converts)
{
	struct engine *e = make_engine(TINY_QWEN2, "language_model", 12, 1e-3);
	struct engine_param_view v;
	struct eng_error err = {0};
	uint16_t h[64];
	float f[64];

	ck_assert_int_eq(engine_param(e, 0, &v, &err), 0);
	ck_assert_str_eq(v.name, "model.embed_tokens.weight");
	ck_assert_int_eq(engine_param_copy(e, 0, ENGINE_DTYPE_BF16, 100, 64, h, &err), 0);
	for (int j = 0; j < 64; j++)
		ck_assert_uint_eq(h[j], f32_to_bf16(v.host_data[100 + j]));
	ck_assert_int_eq(engine_param_copy(e, 0, ENGINE_DTYPE_F16, 7, 64, h, &err), 0);
	for (int j = 0; j < 64; j++)
		ck_assert_uint_eq(h[j], f32_to_f16(v.host_data[7 + j]));
	ck_assert_int_eq(engine_param_copy(e, 0, ENGINE_DTYPE_F32, 0, 64, f, &err), 0);
	ck_assert_mem_eq(f, v.host_data, sizeof(f));
	ck_assert_int_eq(engine_param_copy(e, 0, ENGINE_DTYPE_F32, v.numel - 10, 64, f, &err),
			 -EINVAL);
	ck_assert_msg(strstr(err.msg, "model.embed_tokens.weight"), "%s", err.msg);
	eng_error_clear(&err);
	ck_assert_int_eq(engine_param_copy(e, 0, (enum engine_dtype)9, 0, 1, f, &err), -EINVAL);
	ck_assert_int_eq(engine_param_copy(e, engine_num_params(e), ENGINE_DTYPE_F32, 0, 1, f, &err),
			 -EINVAL);
	engine_destroy(e);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("engine");
	TCase *tc = tcase_create("core");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, registry);
	tcase_add_test(tc, create_errors);
	tcase_add_test(tc, create_cancelled_and_too_large);
	tcase_add_test(tc, outputs_aligned_and_isolated);
	tcase_add_test(tc, micro_batch_invariance);
	tcase_add_test(tc, activation_recompute_same_gradients);
	tcase_add_test(tc, bad_inputs_leave_state);
	tcase_add_test(tc, prepared_call_checked_once);
	tcase_add_test(tc, mode_context);
	tcase_add_test(tc, adamw_first_step_with_clipping);
	tcase_add_test(tc, nonfinite_norm_skips);
	tcase_add_test(tc, schedule_through_engine);
	tcase_add_test(tc, param_copy_converts);
	suite_add_tcase(s, tc);
	return check_run(s);
}
