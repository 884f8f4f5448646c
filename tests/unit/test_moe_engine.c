/* test_moe_engine.c — a mixture-of-experts model through the engine's C
 * API (tests/verl/test_moe_transformers.py holds it against transformers;
 * this runs the same code under the sanitizers, which have no torch):
 *   - the gradients of a batch split into micro-batches are the whole
 *     batch's within 1e-6 of the largest (the experts' rows grouped anew
 *     in each micro-batch);
 *   - activation recompute gives the same gradients bit for bit;
 *   - a qwen3_moe with a dense layer among sparse ones, un-normalised
 *     top-k weights and the routers' auxiliary loss trains: every expert of
 *     the batch gets a gradient, the router too, the loss's log-probs stay
 *     finite over 3 steps; the call reports the auxiliary loss and each
 *     experts layer's load;
 *   - a mixtral's checkpoint reloads bit for bit into a fresh engine.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_helpers.h"

static const char mixtral[] =
	"{\"model_type\": \"mixtral\", \"vocab_size\": 97, \"hidden_size\": 32,"
	" \"intermediate_size\": 24, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
	" \"num_key_value_heads\": 2, \"num_local_experts\": 4, \"num_experts_per_tok\": 2,"
	" \"rms_norm_eps\": 1e-6, \"rope_theta\": 10000.0, \"max_position_embeddings\": 512}";
static const char qwen3_moe[] =
	"{\"model_type\": \"qwen3_moe\", \"vocab_size\": 97, \"hidden_size\": 32,"
	" \"intermediate_size\": 40, \"moe_intermediate_size\": 16, \"num_hidden_layers\": 3,"
	" \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 8,"
	" \"num_experts\": 6, \"num_experts_per_tok\": 3, \"norm_topk_prob\": false,"
	" \"mlp_only_layers\": [1], \"output_router_logits\": true,"
	" \"router_aux_loss_coef\": 0.01, \"rms_norm_eps\": 1e-6, \"rope_theta\": 10000.0,"
	" \"max_position_embeddings\": 512}";

#define N 40
static const int32_t LENS[3] = {15, 9, 16};

static void batch(int32_t *ids, float *g, uint32_t seed)
{
	tiny_batch(ids, N, seed);
	tiny_fill(g, N, seed + 1, 2.0f);
}

static double grad_diff(struct engine *a, struct engine *b)
{
	struct engine_param_view va, vb;
	double m = 0;

	for (int64_t i = 0; i < engine_num_params(a); i++) {
		ck_assert_int_eq(engine_grad(a, i, &va, NULL), 0);
		ck_assert_int_eq(engine_grad(b, i, &vb, NULL), 0);
		for (int64_t j = 0; j < va.numel; j++)
			m = fmax(m, fabs((double)va.host_data[j] - vb.host_data[j]));
	}
	return m;
}

START_TEST(micro_batches_and_recompute)
{
	struct engine *whole = make_engine(mixtral, "language_model", 5, 1e-3);
	struct engine *split = make_engine(mixtral, "language_model", 5, 1e-3);
	struct engine *re = make_engine(mixtral, "language_model", 5, 1e-3);
	struct eng_error err = {0};
	int32_t ids[N];
	float g[N], lp[N];
	double d, top;

	batch(ids, g, 3);
	ck_assert_int_eq(tiny_fb(whole, ids, N, LENS, 3, g, NULL, N, false, lp, NULL, &err), 0);
	ck_assert_int_eq(tiny_fb(split, ids, N, LENS, 3, g, NULL, 16, false, lp, NULL, &err), 0);
	{
		struct given_grads gg = {.g_logp = g};
		struct engine_batch b = {.n = N, .input_ids = ids, .num_seqs = 3, .seq_lens = LENS,
					 .temperature = 0.7f, .max_tokens_per_micro_batch = N,
					 .loss_fn = given_loss, .loss_ctx = &gg,
					 .activation_recompute = ENGINE_RECOMPUTE_ON};
		struct engine_fb_result r = {0};

		ck_assert_int_eq(engine_forward_backward(re, &b, &r, &err), 0);
	}
	top = grad_max_abs(whole);
	d = grad_diff(whole, split);
	ck_assert_msg(top > 0 && d <= 1e-6 * top, "micro-batches: %g of %g", d, top);
	ck_assert_uint_eq(state_digest(whole, true), state_digest(re, true));
	engine_destroy(whole);
	engine_destroy(split);
	engine_destroy(re);
}
END_TEST

START_TEST(mixed_layers_train)
{
	struct engine *e = make_engine(qwen3_moe, "language_model", 9, 1e-2);
	struct engine_param_view v;
	struct engine_step_result sr;
	struct eng_error err = {0};
	int32_t ids[N];
	float g[N], lp[N];
	int experts = 0, used = 0;

	for (int step = 0; step < 3; step++) {
		batch(ids, g, 10 + step);
		ck_assert_int_eq(tiny_fb(e, ids, N, LENS, 3, g, NULL, N, false, lp, NULL, &err), 0);
		for (int i = 0; i < N; i++)
			ck_assert(isfinite(lp[i]) && lp[i] <= 0.0f);
		if (step == 0)
			for (int64_t i = 0; i < engine_num_params(e); i++) {
				double m = 0;

				ck_assert_int_eq(engine_grad(e, i, &v, NULL), 0);
				for (int64_t j = 0; j < v.numel; j++)
					m = fmax(m, fabs(v.host_data[j]));
				if (strstr(v.name, ".gate.weight"))
					ck_assert_msg(m > 0, "%s: no gradient", v.name);
				if (strstr(v.name, ".experts.")) {
					experts++;
					used += m > 0;
				}
				/* the dense layer has its own MLP, the others none */
				ck_assert(!strstr(v.name, "layers.1.mlp.experts.") &&
					  !strstr(v.name, "layers.0.mlp.up_proj"));
			}
		ck_assert_int_eq(engine_optimizer_step(e, &sr, &err), 0);
		ck_assert(isfinite(sr.grad_norm) && sr.grad_norm > 0);
	}
	ck_assert_int_eq(experts, 2 * 6 * 3);
	/* the routers' auxiliary loss and each experts layer's load, over
	 * three micro-batches of the call */
	{
		struct given_grads gg = {.g_logp = g};
		struct engine_batch b = {.n = N, .input_ids = ids, .num_seqs = 3, .seq_lens = LENS,
					 .temperature = 1.0f, .max_tokens_per_micro_batch = 16,
					 .loss_fn = given_loss, .loss_ctx = &gg};
		double load[4] = {0};
		struct engine_fb_result r = {.expert_load = load, .expert_layers = 4};

		ck_assert_int_eq(engine_forward_backward(e, &b, &r, &err), 0);
		ck_assert_int_eq(r.expert_layers, 2);
		ck_assert(r.router_aux_coef == 0.01);
		/* E sum_e f_e P_e: k (3) for an even routing, more as the
		 * choices follow the probabilities; a load is at least 1 */
		ck_assert_msg(r.router_aux_loss >= 3.0 - 1e-5 && r.router_aux_loss < 6.0,
			      "aux %g", r.router_aux_loss);
		ck_assert(load[0] >= 1.0 && load[1] >= 1.0 && load[2] == 0.0);
	}
	ck_assert_msg(used >= experts * 2 / 3, "%d of %d expert tensors trained", used, experts);
	engine_destroy(e);
}
END_TEST

START_TEST(checkpoint_round_trip)
{
	struct engine *e = make_engine(mixtral, "language_model", 5, 1e-2);
	struct engine *f = make_engine(mixtral, "language_model", 6, 1e-2);
	struct engine_step_result sr;
	struct eng_error err = {0};
	char dir[] = "/tmp/engined-moe-ckpt-XXXXXX", cmd[64];
	int32_t ids[N];
	float g[N], lp[N];

	ck_assert_ptr_nonnull(mkdtemp(dir));
	batch(ids, g, 21);
	ck_assert_int_eq(tiny_fb(e, ids, N, LENS, 3, g, NULL, N, false, lp, NULL, &err), 0);
	ck_assert_int_eq(engine_optimizer_step(e, &sr, &err), 0);
	ck_assert_msg(engine_save_checkpoint(e, dir, 1, 0, CKPT_ALL, NULL, &err) == 0, "%s",
		      err.msg);
	ck_assert(state_digest(e, false) != state_digest(f, false));
	ck_assert_msg(engine_load_checkpoint(f, dir, CKPT_ALL, NULL, &err) == 0, "%s", err.msg);
	ck_assert_uint_eq(state_digest(e, false), state_digest(f, false));
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	ck_assert_int_eq(system(cmd), 0);
	engine_destroy(e);
	engine_destroy(f);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("moe_engine");
	TCase *tc = tcase_create("core");
	SRunner *sr;
	int failed;

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, micro_batches_and_recompute);
	tcase_add_test(tc, mixed_layers_train);
	tcase_add_test(tc, checkpoint_round_trip);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
