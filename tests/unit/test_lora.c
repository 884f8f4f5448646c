/* test_lora.c — LoRA adapters through the engine API: a frozen base
 * refuses to train and keeps no gradients or moments; a fresh adapter
 * (B = 0) scores exactly as the base; adapters train their own state only,
 * and two trained interleaved over one base end bit for bit as each
 * trained alone; bad configurations are refused with nothing changed.
 * Numerics against PEFT: tests/verl/test_lora_peft.py. */
#include <jansson.h>
#include <math.h>
#include <unistd.h>

#include "io/safetensors.h"
#include "test_helpers.h"

#define N 24

static const int32_t LENS[2] = {15, 9};

static struct engine *make_base_of(bool frozen, const char *model_type)
{
	struct engine_init_config cfg;
	struct eng_error err = {0};
	struct engine *e = NULL;

	engine_init_config_defaults(&cfg);
	cfg.model_type = model_type;
	cfg.hf_config_json = TINY_QWEN2;
	cfg.seed = 3;
	cfg.threads = 2;
	cfg.frozen_base = frozen;
	ck_assert_msg(engine_create(&cfg, &e, &err) == 0, "engine_create: %s", err.msg);
	return e;
}

static struct engine *make_base(bool frozen)
{
	return make_base_of(frozen, "language_model");
}

static struct engine *make_adapter(struct engine *base, const char *name, int64_t rank,
				   unsigned targets, uint64_t seed)
{
	struct engine_adapter_config c = {
		.name = name, .rank = rank, .alpha = 16, .targets = targets, .seed = seed,
		.has_optim = true,
		.optim = {.lr = 2e-2, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
			  .weight_decay = 0.01, .clip_grad = 1.0},
	};
	struct eng_error err = {0};
	struct engine *a = NULL;

	ck_assert_msg(engine_adapter_create(base, &c, &a, &err) == 0, "adapter: %s", err.msg);
	return a;
}

/* One training call and one step on adapter a with batch `k`'s tokens. */
static void train_step(struct engine *a, uint32_t k)
{
	int32_t ids[N];
	float g[N];
	struct engine_step_result sr;
	struct eng_error err = {0};

	tiny_batch(ids, N, 100 + k);
	tiny_fill(g, N, 200 + k, 2.0f);
	ck_assert_msg(tiny_fb(a, ids, N, LENS, 2, g, NULL, 0, false, NULL, NULL, &err) == 0,
		      "fb: %s", err.msg);
	ck_assert_msg(engine_optimizer_step(a, &sr, &err) == 0, "step: %s", err.msg);
	ck_assert(!sr.skipped && sr.grad_norm > 0);
}

START_TEST(frozen_base_refuses_training)
{
	struct engine *e = make_base(true), *t = make_base(false), *a = NULL;
	struct engine_adapter_config c = {.name = "a", .rank = 4, .alpha = 8,
					  .targets = ENGINE_LORA_ALL_LINEAR};
	struct engine_step_result sr;
	struct engine_param_view v;
	struct engine_status st;
	struct eng_error err = {0};
	int32_t ids[N];
	float lp[N], g[N];

	tiny_batch(ids, N, 1);
	tiny_fill(g, N, 2, 1.0f);
	ck_assert_int_eq(tiny_fb(e, ids, N, LENS, 2, NULL, NULL, 0, true, lp, NULL, &err), 0);
	ck_assert_int_eq(tiny_fb(e, ids, N, LENS, 2, g, NULL, 0, false, NULL, NULL, &err),
			 -EALREADY);
	ck_assert_msg(strstr(err.msg, "frozen"), "%s", err.msg);
	eng_error_clear(&err);
	ck_assert_int_eq(engine_optimizer_step(e, &sr, &err), -EALREADY);
	ck_assert_int_eq(engine_grad(e, 0, &v, NULL), -EALREADY);
	engine_status(e, &st);
	ck_assert_int_eq(st.optim_bytes, 0);
	ck_assert_int_eq(st.step, 0);
	/* only the parameters are held: 4 bytes a parameter */
	ck_assert_uint_le(st.device_memory, (size_t)st.num_parameters * 4 + (16u << 20));
	/* adapters need a frozen base */
	eng_error_clear(&err);
	ck_assert_int_eq(engine_adapter_create(t, &c, &a, &err), -EALREADY);
	ck_assert_msg(strstr(err.msg, "frozen_base"), "%s", err.msg);
	engine_destroy(t);
	engine_destroy(e);
}
END_TEST

START_TEST(fresh_adapter_scores_as_base)
{
	struct engine *e = make_base(true);
	struct engine *a = make_adapter(e, "fresh", 4, ENGINE_LORA_ALL_LINEAR, 7);
	struct engine_adapter_config info;
	struct engine_param_view v;
	struct eng_error err = {0};
	int32_t ids[N];
	float lp0[N], lp1[N];

	tiny_batch(ids, N, 5);
	ck_assert_int_eq(tiny_fb(e, ids, N, LENS, 2, NULL, NULL, 0, true, lp0, NULL, &err), 0);
	ck_assert_int_eq(tiny_fb(a, ids, N, LENS, 2, NULL, NULL, 0, true, lp1, NULL, &err), 0);
	ck_assert_mem_eq(lp0, lp1, sizeof(lp0));
	/* 2 layers x 7 modules x (A, B), PEFT's names, A ~ U(+-1/sqrt(in)) */
	ck_assert_int_eq(engine_num_params(a), 28);
	ck_assert_int_eq(engine_param(a, 0, &v, &err), 0);
	ck_assert_str_eq(v.name, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
	ck_assert_int_eq(v.shape[0], 4);
	ck_assert_int_eq(v.shape[1], 32);
	for (int64_t k = 0; k < v.numel; k++)
		ck_assert(fabsf(v.host_data[k]) <= 1.0f / sqrtf(32.0f) && v.host_data[k] != 0.0f);
	ck_assert_int_eq(engine_param(a, 27, &v, &err), 0);
	ck_assert_str_eq(v.name, "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight");
	for (int64_t k = 0; k < v.numel; k++)
		ck_assert(v.host_data[k] == 0.0f);
	ck_assert_int_eq(engine_adapter_info(a, &info), 0);
	ck_assert_int_eq(info.rank, 4);
	ck_assert_str_eq(info.name, "fresh");
	ck_assert_int_eq(engine_adapter_info(e, &info), -EINVAL);
	engine_destroy(a);
	engine_destroy(e);
}
END_TEST

/* Adapters X and Y trained interleaved over one base end as each trained
 * alone over a base of its own; the base never changes. */
START_TEST(interleaved_equals_alone)
{
	struct engine *b1 = make_base(true), *b2 = make_base(true);
	uint64_t base0 = state_digest(b1, false);
	struct engine *x1 = make_adapter(b1, "x", 4, ENGINE_LORA_ALL_LINEAR, 11);
	struct engine *y1 = make_adapter(b1, "y", 2, (1u << 0) | (1u << 2) | (1u << 6), 12);
	struct engine *x2 = make_adapter(b2, "x", 4, ENGINE_LORA_ALL_LINEAR, 11);
	struct engine_status sx, sy;
	uint64_t x_alone, y_alone;
	struct engine *y2;

	for (uint32_t k = 0; k < 3; k++)
		train_step(x2, k);
	x_alone = state_digest(x2, false);
	engine_destroy(x2);
	y2 = make_adapter(b2, "y", 2, (1u << 0) | (1u << 2) | (1u << 6), 12);
	for (uint32_t k = 0; k < 3; k++)
		train_step(y2, 10 + k);
	y_alone = state_digest(y2, false);
	for (uint32_t k = 0; k < 3; k++) {
		train_step(x1, k);
		train_step(y1, 10 + k);
	}
	ck_assert_uint_eq(state_digest(x1, false), x_alone);
	ck_assert_uint_eq(state_digest(y1, false), y_alone);
	ck_assert_uint_ne(x_alone, y_alone);
	ck_assert_uint_eq(state_digest(b1, false), base0);
	ck_assert_uint_eq(state_digest(b2, false), base0);
	engine_status(x1, &sx);
	engine_status(y1, &sy);
	ck_assert_int_eq(sx.step, 3);
	ck_assert_int_eq(sy.step, 3);
	/* y, rank 2, per layer: q_proj 2x32 + 32x2, v_proj 2x32 + 16x2,
	 * down_proj 2x48 + 32x2 */
	ck_assert_int_eq(sy.num_parameters, 2 * (128 + 96 + 160));
	engine_destroy(x1);
	engine_destroy(y1);
	engine_destroy(y2);
	engine_destroy(b1);
	engine_destroy(b2);
}
END_TEST

START_TEST(bad_configs_refused)
{
	struct engine *e = make_base(true), *a = NULL;
	struct eng_error err = {0};
	struct {
		struct engine_adapter_config c;
		const char *field;
	} bad[] = {
		{{.name = "a", .rank = 0, .alpha = 8, .targets = 1}, "rank:"},
		{{.name = "a", .rank = 33, .alpha = 8, .targets = 1}, "rank:"},
		{{.name = "a", .rank = 4, .alpha = 0, .targets = 1}, "alpha:"},
		{{.name = "a", .rank = 4, .alpha = NAN, .targets = 1}, "alpha:"},
		{{.name = "", .rank = 4, .alpha = 8, .targets = 1}, "name:"},
		{{.name = "a/b", .rank = 4, .alpha = 8, .targets = 1}, "name:"},
		{{.name = ".a", .rank = 4, .alpha = 8, .targets = 1}, "name:"},
		{{.name = "a", .rank = 4, .alpha = 8, .targets = 0}, "target_modules:"},
		{{.name = "a", .rank = 4, .alpha = 8, .targets = 1u << 9}, "target_modules:"},
	};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		eng_error_clear(&err);
		ck_assert_int_eq(engine_adapter_create(e, &bad[i].c, &a, &err), -EINVAL);
		ck_assert_msg(!strncmp(err.msg, bad[i].field, strlen(bad[i].field)), "%zu: %s", i,
			      err.msg);
		ck_assert_ptr_null(a);
	}
	ck_assert_uint_eq(engine_lora_module_bits("all-linear"), ENGINE_LORA_ALL_LINEAR);
	ck_assert_uint_eq(engine_lora_module_bits("model.layers.0.mlp.down_proj"), 1u << 6);
	ck_assert_uint_eq(engine_lora_module_bits("xdown_proj"), 0);
	ck_assert_uint_eq(engine_lora_module_bits("lm_head"), 0);
	/* still usable: an adapter of the largest rank q_proj allows */
	a = make_adapter(e, "a", 32, 1u << 0, 1);
	train_step(a, 0);
	engine_destroy(a);
	engine_destroy(e);
}
END_TEST

/* An adapter's checkpoint is a PEFT directory plus its optimizer and
 * state: a load restores the adapter bit for bit, steps included, so that
 * training goes on as if never interrupted; another rank is refused. */
START_TEST(adapter_checkpoint_round_trip)
{
	char root[] = "/tmp/engined-lora-XXXXXX", dir[64], file[128], cmd[96];
	struct engine *e = make_base(true);
	struct engine *x = make_adapter(e, "x", 4, (1u << 1) | (1u << 4), 11);
	struct engine *y = make_adapter(e, "y", 2, (1u << 1) | (1u << 4), 11);
	struct engine_status st;
	struct eng_error err = {0};
	uint64_t d2, d3;
	int64_t gstep = 0;
	json_t *cfg;

	ck_assert_ptr_nonnull(mkdtemp(root));
	snprintf(dir, sizeof(dir), "%s/x", root);
	train_step(x, 0);
	train_step(x, 1);
	d2 = state_digest(x, false);
	ck_assert_msg(engine_save_checkpoint(x, dir, 2, 0, CKPT_ALL, NULL, &err) == 0, "%s",
		      err.msg);
	train_step(x, 2);
	d3 = state_digest(x, false);
	ck_assert_msg(engine_load_checkpoint(x, dir, CKPT_ALL, &gstep, &err) == 0, "%s", err.msg);
	ck_assert_int_eq(gstep, 2);
	ck_assert_uint_eq(state_digest(x, false), d2);
	engine_status(x, &st);
	ck_assert_int_eq(st.step, 2);
	train_step(x, 2);
	ck_assert_uint_eq(state_digest(x, false), d3);
	/* PEFT's files */
	snprintf(file, sizeof(file), "%s/adapter_model.safetensors", dir);
	ck_assert_int_eq(access(file, F_OK), 0);
	snprintf(file, sizeof(file), "%s/adapter_config.json", dir);
	cfg = json_load_file(file, 0, NULL);
	ck_assert_ptr_nonnull(cfg);
	ck_assert_int_eq(json_integer_value(json_object_get(cfg, "r")), 4);
	ck_assert_str_eq(json_string_value(json_array_get(json_object_get(cfg, "target_modules"),
							  1)), "gate_proj");
	json_decref(cfg);
	/* another shape, and the base itself, are refused; y is unchanged */
	d2 = state_digest(y, false);
	eng_error_clear(&err);
	ck_assert_int_eq(engine_load_checkpoint(y, dir, CKPT_ALL, &gstep, &err), -EINVAL);
	ck_assert_uint_eq(state_digest(y, false), d2);
	eng_error_clear(&err);
	ck_assert_int_eq(engine_load_checkpoint(e, dir, CKPT_ALL, &gstep, &err), -ENOSYS);
	engine_destroy(x);
	engine_destroy(y);
	engine_destroy(e);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* The three views: the adapter's matrices, the base under verl's
 * base_layer names, the base with each targeted weight merged. */
START_TEST(adapter_views)
{
	struct engine *e = make_base(true);
	struct engine *a = make_adapter(e, "v", 4, (1u << 0) | (1u << 6), 5);
	struct engine_param_view v, bv, qa, qb;
	struct eng_error err = {0};
	float *merged;
	uint16_t half[8];
	int64_t iq = -1, idown = -1, ik = -1;

	train_step(a, 0);
	train_step(a, 1);
	ck_assert_int_eq(engine_num_params(a), 8);
	ck_assert_int_eq(engine_adapter_set_view(a, ENGINE_ADAPTER_VIEW_BASE, &err), 0);
	ck_assert_int_eq(engine_num_params(a), engine_num_params(e));
	for (int64_t i = 0; i < engine_num_params(a); i++) {
		ck_assert_int_eq(engine_param(a, i, &v, &err), 0);
		ck_assert_int_eq(engine_param(e, i, &bv, &err), 0);
		ck_assert_mem_eq(v.host_data, bv.host_data, v.numel * sizeof(float));
		if (!strcmp(v.name, "model.layers.1.self_attn.q_proj.base_layer.weight"))
			iq = i;
		if (!strcmp(v.name, "model.layers.1.self_attn.k_proj.base_layer.bias"))
			ik = i;
		if (!strcmp(v.name, "model.layers.1.mlp.down_proj.base_layer.weight"))
			idown = i;
		ck_assert(strcmp(v.name, "model.embed_tokens.weight") || i == 0);
	}
	ck_assert(iq > 0 && ik > 0 && idown > 0);
	ck_assert_int_eq(engine_grad(a, 0, &v, &err), -EINVAL);

	/* merged: q_proj of layer 1 is W + (16 / 4) B A; k_proj as it is */
	ck_assert_int_eq(engine_adapter_set_view(a, ENGINE_ADAPTER_VIEW_MERGED, &err), 0);
	ck_assert_int_eq(engine_param_info(a, ik, &v, &err), 0);
	ck_assert_str_eq(v.name, "model.layers.1.self_attn.k_proj.bias");
	ck_assert_int_eq(engine_param_info(a, iq, &v, &err), 0);
	ck_assert_str_eq(v.name, "model.layers.1.self_attn.q_proj.weight");
	ck_assert(!v.host_resident && !v.host_data);
	ck_assert_int_eq(engine_param(a, iq, &v, &err), 0);
	merged = malloc(v.numel * sizeof(float));
	memcpy(merged, v.host_data, v.numel * sizeof(float));
	ck_assert_int_eq(engine_adapter_set_view(a, ENGINE_ADAPTER_VIEW_ADAPTER, &err), 0);
	ck_assert_int_eq(engine_param(a, 4, &qa, &err), 0);   /* layer 1 q_proj A [4, 32] */
	ck_assert_str_eq(qa.name, "base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight");
	float *A = malloc(qa.numel * sizeof(float));
	memcpy(A, qa.host_data, qa.numel * sizeof(float));
	ck_assert_int_eq(engine_param(a, 5, &qb, &err), 0);   /* B [32, 4] */
	ck_assert_int_eq(engine_param(e, iq, &bv, &err), 0);
	double worst = 0;
	for (int o = 0; o < 32; o++)
		for (int i = 0; i < 32; i++) {
			double d = bv.host_data[o * 32 + i];

			for (int r = 0; r < 4; r++)
				d += 4.0 * (double)qb.host_data[o * 4 + r] * A[r * 32 + i];
			worst = fmax(worst, fabs(d - merged[o * 32 + i]));
		}
	ck_assert_msg(worst < 1e-6, "merged q_proj off by %g", worst);
	ck_assert_msg(memcmp(merged, bv.host_data, 32 * 32 * sizeof(float)), "B must be non-zero");
	/* a slice in bf16, converted from the merged values */
	ck_assert_int_eq(engine_adapter_set_view(a, ENGINE_ADAPTER_VIEW_MERGED, &err), 0);
	ck_assert_int_eq(engine_param_copy(a, iq, ENGINE_DTYPE_BF16, 100, 8, half, &err), 0);
	for (int k = 0; k < 8; k++) {
		uint16_t want;

		f32_to_bf16_n(merged + 100 + k, &want, 1);
		ck_assert_uint_eq(half[k], want);
	}
	free(A);
	free(merged);
	engine_destroy(a);
	engine_destroy(e);
}
END_TEST

/* A value model's adapter owns its score head (PEFT's modules_to_save):
 * it starts as the base's, trains with the adapter, and stands for the
 * base's in the merged view; the base's never changes. */
START_TEST(value_model_adapter_owns_its_head)
{
	struct engine *e = make_base_of(true, "value_model");
	struct engine *a = make_adapter(e, "critic", 4, ENGINE_LORA_ALL_LINEAR, 3);
	int64_t n = engine_num_params(a), bi = -1;
	struct engine_param_view v, bv;
	struct eng_error err = {0};
	int32_t ids[N];
	float val0[N], val1[N], gv[N];
	struct given_grads gg = {.g_val = gv};
	struct engine_batch b = {.n = N, .input_ids = ids, .num_seqs = 2, .seq_lens = LENS,
				 .temperature = 1.0f, .loss_fn = given_loss, .loss_ctx = &gg};
	struct engine_fb_result r0 = {.values = val0}, r1 = {.values = val1};
	struct engine_step_result sr;
	float head[33];

	tiny_batch(ids, N, 9);
	tiny_fill(gv, N, 10, 2.0f);
	ck_assert_int_eq(engine_param(a, n - 2, &v, &err), 0);
	ck_assert_str_eq(v.name, "base_model.model.score.weight");
	for (int64_t i = 0; i < engine_num_params(e); i++)
		if (!strcmp(engine_param_info(e, i, &bv, &err) ? "" : bv.name, "score.weight"))
			bi = i;
	ck_assert_int_ge(bi, 0);
	ck_assert_int_eq(engine_param(e, bi, &bv, &err), 0);
	ck_assert_mem_eq(v.host_data, bv.host_data, 32 * sizeof(float));
	b.forward_only = true;
	ck_assert_int_eq(engine_forward_backward(e, &b, &r0, &err), 0);
	ck_assert_int_eq(engine_forward_backward(a, &b, &r1, &err), 0);
	ck_assert_mem_eq(val0, val1, sizeof(val0));
	b.forward_only = false;
	ck_assert_msg(engine_forward_backward(a, &b, &r1, &err) == 0, "%s", err.msg);
	ck_assert_msg(engine_optimizer_step(a, &sr, &err) == 0, "%s", err.msg);
	ck_assert_int_eq(engine_param(a, n - 2, &v, &err), 0);
	memcpy(head, v.host_data, 32 * sizeof(float));
	ck_assert_int_eq(engine_param(a, n - 1, &v, &err), 0);
	head[32] = v.host_data[0];
	ck_assert_int_eq(engine_param(e, bi, &bv, &err), 0);
	ck_assert_msg(memcmp(head, bv.host_data, 32 * sizeof(float)), "the head must train");
	ck_assert_int_eq(engine_adapter_set_view(a, ENGINE_ADAPTER_VIEW_MERGED, &err), 0);
	ck_assert_int_eq(engine_param(a, bi, &v, &err), 0);
	ck_assert_str_eq(v.name, "score.weight");
	ck_assert_mem_eq(v.host_data, head, 32 * sizeof(float));
	ck_assert_int_eq(engine_param(a, bi + 1, &v, &err), 0);
	ck_assert_str_eq(v.name, "score.bias");
	ck_assert_float_eq(v.host_data[0], head[32]);
	engine_destroy(a);
	engine_destroy(e);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("lora");
	TCase *tc = tcase_create("core");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, frozen_base_refuses_training);
	tcase_add_test(tc, fresh_adapter_scores_as_base);
	tcase_add_test(tc, interleaved_equals_alone);
	tcase_add_test(tc, bad_configs_refused);
	tcase_add_test(tc, adapter_checkpoint_round_trip);
	tcase_add_test(tc, adapter_views);
	tcase_add_test(tc, value_model_adapter_owns_its_head);
	suite_add_tcase(s, tc);
	return check_run(s);
}
