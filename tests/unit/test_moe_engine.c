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
 *   - a mixtral's checkpoint reloads bit for bit into a fresh engine;
 *   - routing replay: a call records its routing (the experts layers',
 *     ids in range and distinct per row); replaying it, given over the
 *     experts layers or over every decoder layer with junk in the dense
 *     one's rows, in micro-batches, gives the log-probs and gradients of
 *     the free call bit for bit; other experts change them; a bad replay
 *     is -EINVAL naming routed_experts;
 *   - a qwen2_moe (its shared expert) and an olmoe (q/k norms over whole
 *     projections, a padding id) train: finite, every tensor reached but
 *     the padding id's embedding row.
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

#define LM 2   /* qwen3_moe's experts layers: 0 and 2 */
#define K 3

/* A call of qwen3_moe with routing (routed: [N, layers, K] or NULL;
 * record: [N, LM, K] or NULL) in micro-batches of `budget` tokens. */
static int routed_fb(struct engine *e, const int32_t *ids, const float *g, bool fwd_only,
		     const int32_t *routed, int64_t layers, int32_t *record, float *lp,
		     int64_t budget, struct eng_error *err)
{
	struct given_grads gg = {.g_logp = g};
	struct engine_batch b = {.n = N, .input_ids = ids, .num_seqs = 3, .seq_lens = LENS,
				 .temperature = 1.0f, .forward_only = fwd_only,
				 .max_tokens_per_micro_batch = budget, .loss_fn = given_loss,
				 .loss_ctx = &gg, .routed_experts = routed,
				 .routed_layers = layers, .routed_k = K};
	struct engine_fb_result r = {.log_probs = lp, .want_routed_experts = record != NULL};
	int rc = engine_forward_backward(e, &b, &r, err);

	if (rc == 0 && record) {
		ck_assert_ptr_nonnull(r.routed_experts);
		ck_assert(r.routed_layers == LM && r.routed_k == K);
		memcpy(record, r.routed_experts, sizeof(int32_t) * N * LM * K);
	}
	free(r.routed_experts);
	return rc;
}

START_TEST(routing_replay)
{
	struct engine *free_e = make_engine(qwen3_moe, "language_model", 9, 1e-2);
	struct engine *rep = make_engine(qwen3_moe, "language_model", 9, 1e-2);
	struct engine *other = make_engine(qwen3_moe, "language_model", 9, 1e-2);
	struct eng_error err = {0};
	static int32_t rec[N * LM * K], full[N * 3 * K], bad[N * LM * K];
	int32_t ids[N];
	float g[N], lp0[N], lp1[N];

	batch(ids, g, 30);
	ck_assert_int_eq(routed_fb(free_e, ids, g, true, NULL, 0, rec, lp0, N, &err), 0);
	for (int t = 0; t < N; t++)
		for (int l = 0; l < LM; l++)
			for (int j = 0; j < K; j++) {
				int32_t x = rec[(t * LM + l) * K + j];

				ck_assert(x >= 0 && x < 6);
				for (int i = 0; i < j; i++)
					ck_assert(rec[(t * LM + l) * K + i] != x);
			}
	/* replayed: the free call's log-probs, over LM or all 3 layers (the
	 * same micro-batches as the free call: another split regroups the
	 * products' rows, which changes their last bits on some ISAs) */
	for (int t = 0; t < N; t++)
		for (int j = 0; j < K; j++) {
			full[(t * 3 + 0) * K + j] = rec[(t * LM + 0) * K + j];
			full[(t * 3 + 1) * K + j] = -9;   /* the dense layer's: unread */
			full[(t * 3 + 2) * K + j] = rec[(t * LM + 1) * K + j];
		}
	ck_assert_int_eq(routed_fb(rep, ids, g, true, full, 3, NULL, lp1, N, &err), 0);
	ck_assert(!memcmp(lp0, lp1, sizeof(lp0)));
	ck_assert_int_eq(routed_fb(free_e, ids, g, true, NULL, 0, rec, lp0, 16, &err), 0);
	ck_assert_int_eq(routed_fb(rep, ids, g, true, rec, LM, NULL, lp1, 16, &err), 0);
	ck_assert(!memcmp(lp0, lp1, sizeof(lp0)));
	/* training: the same gradients bit for bit */
	ck_assert_int_eq(routed_fb(free_e, ids, g, false, NULL, 0, NULL, lp0, N, &err), 0);
	ck_assert_int_eq(routed_fb(rep, ids, g, false, full, 3, NULL, lp1, N, &err), 0);
	ck_assert_uint_eq(state_digest(free_e, true), state_digest(rep, true));
	/* other experts: other log-probs */
	for (int i = 0; i < N * LM * K; i++)
		bad[i] = (rec[i] + 1) % 6;
	ck_assert_int_eq(routed_fb(other, ids, g, true, bad, LM, NULL, lp1, N, &err), 0);
	ck_assert(memcmp(lp0, lp1, sizeof(lp0)));
	/* refused, naming the field; the engine goes on */
	bad[7 * LM * K + K + 1] = 6;
	ck_assert_int_eq(routed_fb(other, ids, g, true, bad, LM, NULL, lp1, N, &err), -EINVAL);
	ck_assert_msg(strstr(err.msg, "routed_experts[7][1][1]: expert 6 outside"), "%s", err.msg);
	bad[7 * LM * K + K + 1] = bad[7 * LM * K + K];
	eng_error_clear(&err);
	ck_assert_int_eq(routed_fb(other, ids, g, true, bad, LM, NULL, lp1, N, &err), -EINVAL);
	ck_assert_msg(strstr(err.msg, "routed_experts[7][1]: expert"), "%s", err.msg);
	eng_error_clear(&err);
	ck_assert_int_eq(routed_fb(other, ids, g, true, rec, 1, NULL, lp1, N, &err), -EINVAL);
	ck_assert_msg(strstr(err.msg, "1 layers; the model has 2 experts layers"), "%s", err.msg);
	ck_assert_int_eq(routed_fb(other, ids, g, false, rec, LM, NULL, lp1, N, &err), 0);
	engine_destroy(free_e);
	engine_destroy(rep);
	engine_destroy(other);
}
END_TEST

static const char qwen2_moe[] =
	"{\"model_type\": \"qwen2_moe\", \"vocab_size\": 97, \"hidden_size\": 32,"
	" \"intermediate_size\": 40, \"moe_intermediate_size\": 16,"
	" \"shared_expert_intermediate_size\": 24, \"num_hidden_layers\": 2,"
	" \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"num_experts\": 6,"
	" \"num_experts_per_tok\": 2, \"mlp_only_layers\": [0], \"rms_norm_eps\": 1e-6,"
	" \"use_sliding_window\": false, \"max_position_embeddings\": 512}";
static const char olmoe[] =
	"{\"model_type\": \"olmoe\", \"vocab_size\": 97, \"hidden_size\": 32,"
	" \"intermediate_size\": 16, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
	" \"num_key_value_heads\": 2, \"num_experts\": 6, \"num_experts_per_tok\": 2,"
	" \"pad_token_id\": 5, \"rms_norm_eps\": 1e-5, \"max_position_embeddings\": 512}";

START_TEST(shared_expert_and_whole_qk_norm_train)
{
	for (int f = 0; f < 2; f++) {
		struct engine *e = make_engine(f ? olmoe : qwen2_moe, "language_model", 4, 1e-2);
		struct engine_param_view v;
		struct eng_error err = {0};
		int32_t ids[N];
		float g[N], lp[N];

		batch(ids, g, 40);
		ids[3] = 5;   /* the padding id among the tokens */
		ck_assert_int_eq(tiny_fb(e, ids, N, LENS, 3, g, NULL, 16, false, lp, NULL, &err), 0);
		for (int i = 0; i < N; i++)
			ck_assert(isfinite(lp[i]) && lp[i] <= 0.0f);
		for (int64_t i = 0; i < engine_num_params(e); i++) {
			double m = 0, pad = 0;

			ck_assert_int_eq(engine_grad(e, i, &v, NULL), 0);
			for (int64_t j = 0; j < v.numel; j++)
				m = fmax(m, fabs(v.host_data[j]));
			if (!strcmp(v.name, "model.embed_tokens.weight"))
				for (int64_t j = 5 * 32; j < 6 * 32; j++)
					pad = fmax(pad, fabs(v.host_data[j]));
			ck_assert_msg(m > 0 || strstr(v.name, ".experts."), "%s: no gradient", v.name);
			ck_assert_msg(f == 0 || pad == 0, "the padding id's row: %g", pad);
			if (f == 0 && strstr(v.name, "shared_expert_gate"))
				ck_assert_int_eq(v.numel, 32);
			if (f == 1 && strstr(v.name, "q_norm"))
				ck_assert_int_eq(v.numel, 32);   /* the whole projection */
		}
		engine_destroy(e);
	}
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
	tcase_add_test(tc, routing_replay);
	tcase_add_test(tc, shared_expert_and_whole_qk_norm_train);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
