/* test_engine_ckpt.c — engine checkpoints: bit-identical resume, contents
 * flags, corruption and shape errors, and a child process killed during
 * SaveCheckpoint leaving the previous checkpoint and `latest` loadable. */
#include <jansson.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test_helpers.h"

static char root[256];

static void setup(void)
{
	snprintf(root, sizeof(root), "/tmp/engined-ckpt-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(root));
}

static void teardown(void)
{
	char cmd[300];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	ck_assert_int_eq(system(cmd), 0);
}

/* One training step on a batch drawn from `step`. */
static void train_step(struct engine *e, int step)
{
	int32_t lens[3] = {7, 4, 9}, ids[20];
	float gl[20], ge[20];
	struct given_grads gg = {.g_logp = gl, .g_ent = ge};
	struct engine_batch b = {.n = 20, .input_ids = ids, .num_seqs = 3, .seq_lens = lens,
				 .temperature = 1.0f, .loss_fn = given_loss, .loss_ctx = &gg,
				 .max_tokens_per_micro_batch = 12};
	struct engine_fb_result r = {0};
	struct engine_step_result sr;
	struct eng_error err = {0};
	uint32_t s = 1000u + (uint32_t)step;
	double lr;

	for (int i = 0; i < 20; i++) {
		s = s * 1664525u + 1013904223u;
		ids[i] = (int32_t)((s >> 8) % 97);
		gl[i] = (float)((s >> 4) & 0xff) / 256.0f - 0.5f;
		ge[i] = (float)((s >> 12) & 0xff) / 512.0f - 0.25f;
	}
	ck_assert_int_eq(engine_forward_backward(e, &b, &r, &err), 0);
	ck_assert_int_eq(engine_optimizer_step(e, &sr, &err), 0);
	ck_assert_int_eq(engine_lr_scheduler_step(e, &lr, &err), 0);
}

static struct engine *make_sched_engine(uint64_t seed)
{
	struct engine_init_config cfg;
	struct eng_error err = {0};
	struct engine *e;

	engine_init_config_defaults(&cfg);
	cfg.hf_config_json = TINY_QWEN2;
	cfg.seed = seed;
	cfg.optim.lr = 1e-2;
	cfg.optim.clip_grad = 0.5;
	cfg.sched.type = LR_SCHEDULE_COSINE;
	cfg.sched.warmup_steps = 2;
	cfg.sched.total_steps = 8;
	ck_assert_int_eq(engine_create(&cfg, &e, &err), 0);
	return e;
}

START_TEST(resume_is_bit_identical)
{
	struct engine *a = make_sched_engine(1), *b = make_sched_engine(2);
	struct eng_error err = {0};
	struct engine_status sa, sb;
	char dir[300];
	size_t bytes = 0;
	int64_t gstep = -1;
	uint64_t want;

	for (int s = 0; s < 3; s++)
		train_step(a, s);
	snprintf(dir, sizeof(dir), "%s/step3", root);
	ck_assert_int_eq(engine_save_checkpoint(a, dir, 3, 0, CKPT_ALL, &bytes, &err), 0);
	ck_assert(bytes > 0);
	for (int s = 3; s < 6; s++)
		train_step(a, s);
	want = state_digest(a, false);
	engine_status(a, &sa);

	/* b started from another seed: loading must replace everything */
	ck_assert_int_eq(engine_load_checkpoint(b, dir, CKPT_ALL, &gstep, &err), 0);
	ck_assert_int_eq(gstep, 3);
	for (int s = 3; s < 6; s++)
		train_step(b, s);
	ck_assert_uint_eq(state_digest(b, false), want);
	engine_status(b, &sb);
	ck_assert_int_eq(sb.step, sa.step);
	ck_assert_int_eq(sb.sched_step, sa.sched_step);
	ck_assert(sb.lr == sa.lr);

	/* `latest` names step3: loading the root resolves it */
	ck_assert_int_eq(engine_load_checkpoint(b, root, CKPT_ALL, &gstep, &err), 0);
	ck_assert_int_eq(gstep, 3);
	engine_destroy(a);
	engine_destroy(b);
}
END_TEST

START_TEST(contents_and_errors)
{
	struct engine *a = make_sched_engine(1), *b;
	struct eng_error err = {0};
	char dir[300], path[400];
	int64_t gstep;
	uint64_t pa;
	FILE *f;

	train_step(a, 0);
	snprintf(dir, sizeof(dir), "%s/model-only", root);
	ck_assert_int_eq(engine_save_checkpoint(a, dir, 1, 0, CKPT_MODEL, NULL, &err), 0);
	pa = state_digest(a, false);
	b = make_sched_engine(9);
	ck_assert_int_eq(engine_load_checkpoint(b, dir, CKPT_MODEL, &gstep, &err), 0);
	ck_assert_uint_eq(state_digest(b, false), pa);
	ck_assert_int_eq(engine_load_checkpoint(b, dir, CKPT_OPTIMIZER, &gstep, &err), -EINVAL);
	ck_assert_msg(strstr(err.msg, "contents"), "%s", err.msg);

	/* flip one byte of model.safetensors: DATA_LOSS naming the file */
	eng_error_clear(&err);
	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	f = fopen(path, "r+b");
	ck_assert_ptr_nonnull(f);
	fseek(f, -5, SEEK_END);
	fputc(0x5a, f);
	fclose(f);
	train_step(b, 1);
	pa = state_digest(b, false);
	ck_assert_int_eq(engine_load_checkpoint(b, dir, CKPT_MODEL, &gstep, &err), -EBADMSG);
	ck_assert_msg(strstr(err.msg, "model.safetensors"), "%s", err.msg);
	ck_assert_uint_eq(state_digest(b, false), pa);

	/* a checkpoint of another shape is refused before anything changes */
	{
		static const char *other =
			"{\"model_type\": \"llama\", \"vocab_size\": 97, \"hidden_size\": 16,"
			" \"intermediate_size\": 24, \"num_hidden_layers\": 2,"
			" \"num_attention_heads\": 4, \"num_key_value_heads\": 2}";
		struct engine *c = make_engine(other, "language_model", 1, 1e-3);

		snprintf(dir, sizeof(dir), "%s/other", root);
		ck_assert_int_eq(engine_save_checkpoint(c, dir, 1, 0, CKPT_ALL, NULL, &err), 0);
		eng_error_clear(&err);
		ck_assert_int_ne(engine_load_checkpoint(b, dir, CKPT_ALL, &gstep, &err), 0);
		ck_assert_uint_eq(state_digest(b, false), pa);
		engine_destroy(c);
	}
	eng_error_clear(&err);
	snprintf(dir, sizeof(dir), "%s/does-not-exist", root);
	ck_assert_int_eq(engine_load_checkpoint(b, dir, CKPT_ALL, &gstep, &err), -ENOENT);
	engine_destroy(a);
	engine_destroy(b);
}
END_TEST

/* engine_state.json's steps are integers >= 0, the restored counters at
 * most 2^53; anything else is DATA_LOSS before the engine changes (a
 * negative global_step, a counter near int64's end or a string were taken
 * as they were, or as 0: tests/fuzz/fuzz_ckpt_state's seeds loaded). */
START_TEST(state_steps_checked)
{
	static const struct { const char *key, *json; } bad[] = {
		{ "global_step", "-3" },
		{ "optimizer_step", "4611686018427387904" },   /* 2^62 */
		{ "lr_scheduler_step", "\"x\"" },
		{ "optimizer_step", NULL },                      /* missing */
		{ "global_step", "1.5" },
	};
	struct engine *a = make_sched_engine(1), *b = make_sched_engine(2);
	struct eng_error err = {0};
	char dir[300], path[400];
	json_t *orig, *edited;
	int64_t gstep = -1;
	uint64_t pb;

	train_step(a, 0);
	snprintf(dir, sizeof(dir), "%s/steps", root);
	ck_assert_int_eq(engine_save_checkpoint(a, dir, 4, 0, CKPT_ALL, NULL, &err), 0);
	snprintf(path, sizeof(path), "%s/engine_state.json", dir);
	orig = json_load_file(path, 0, NULL);
	ck_assert_ptr_nonnull(orig);
	pb = state_digest(b, false);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		edited = json_deep_copy(orig);
		if (bad[i].json)
			json_object_set_new(edited, bad[i].key,
					    json_loads(bad[i].json, JSON_DECODE_ANY, NULL));
		else
			json_object_del(edited, bad[i].key);
		ck_assert_int_eq(json_dump_file(edited, path, 0), 0);
		json_decref(edited);
		eng_error_clear(&err);
		ck_assert_int_eq(engine_load_checkpoint(b, dir, CKPT_ALL, &gstep, &err), -EBADMSG);
		ck_assert_msg(strstr(err.msg, bad[i].key), "case %zu: %s", i, err.msg);
		ck_assert_uint_eq(state_digest(b, false), pb);
	}
	ck_assert_int_eq(json_dump_file(orig, path, 0), 0);
	ck_assert_int_eq(engine_load_checkpoint(b, dir, CKPT_ALL, &gstep, &err), 0);
	ck_assert_int_eq(gstep, 4);
	ck_assert_uint_eq(state_digest(b, false), state_digest(a, false));
	json_decref(orig);
	engine_destroy(a);
	engine_destroy(b);
}
END_TEST

/* A bigger model so that a save takes long enough to be interrupted. */
static const char *const MEDIUM =
	"{\"model_type\": \"llama\", \"vocab_size\": 4096, \"hidden_size\": 256,"
	" \"intermediate_size\": 512, \"num_hidden_layers\": 4,"
	" \"num_attention_heads\": 4, \"num_key_value_heads\": 4}";

START_TEST(killed_during_save)
{
	struct engine *a = make_engine(MEDIUM, "language_model", 1, 1e-3);
	struct eng_error err = {0};
	char dir[300];
	uint64_t p_old;
	int64_t gstep;

	snprintf(dir, sizeof(dir), "%s/good", root);
	ck_assert_int_eq(engine_save_checkpoint(a, dir, 1, 0, CKPT_ALL, NULL, &err), 0);
	p_old = state_digest(a, false);

	for (int round = 0; round < 6; round++) {
		pid_t pid = fork();
		int status;

		ck_assert_int_ge(pid, 0);
		if (pid == 0) {
			struct engine *c = make_engine(MEDIUM, "language_model", 100 + round, 1e-3);
			char d[300];

			/* overwrite "good" and write new ones, forever */
			for (int i = 0;; i++) {
				snprintf(d, sizeof(d), "%s/%s", root, i % 2 ? "good" : "new");
				engine_save_checkpoint(c, d, 2 + i, 0, CKPT_ALL, NULL, NULL);
			}
		}
		usleep(20000 + round * 37000);
		kill(pid, SIGKILL);
		waitpid(pid, &status, 0);
		ck_assert(WIFSIGNALED(status));

		/* `latest` resolves to a complete checkpoint, and "good" is
		 * either the original or a complete overwrite: both load. */
		eng_error_clear(&err);
		ck_assert_msg(engine_load_checkpoint(a, root, CKPT_ALL, &gstep, &err) == 0,
			      "round %d latest: %s", round, err.msg);
		eng_error_clear(&err);
		ck_assert_msg(engine_load_checkpoint(a, dir, CKPT_ALL, &gstep, &err) == 0,
			      "round %d good: %s", round, err.msg);
		if (gstep == 1)
			ck_assert_uint_eq(state_digest(a, false), p_old);
	}
	engine_destroy(a);
}
END_TEST

/* A checkpoint directory is a Hugging Face model directory: a value model
 * (critic) initialized from an actor's checkpoint takes the backbone and
 * draws score.* from its seed. */
START_TEST(critic_from_actor_directory)
{
	struct engine *a = make_engine(TINY_QWEN2, "language_model", 21, 1e-3);
	struct engine_init_config cfg;
	struct engine_param_view va, vc;
	struct eng_error err = {0};
	struct engine *c;
	char dir[300];
	int64_t i;

	snprintf(dir, sizeof(dir), "%s/actor", root);
	ck_assert_int_eq(engine_save_checkpoint(a, dir, 1, 0, CKPT_MODEL, NULL, &err), 0);
	engine_init_config_defaults(&cfg);
	cfg.model_type = "value_model";
	cfg.model_path = dir;
	cfg.seed = 5;
	ck_assert_msg(engine_create(&cfg, &c, &err) == 0, "%s", err.msg);
	/* same backbone tensors, in the same order, minus lm_head */
	for (i = 0; i < engine_num_params(a); i++) {
		ck_assert_int_eq(engine_param(a, i, &va, NULL), 0);
		if (!strcmp(va.name, "lm_head.weight"))
			continue;
		ck_assert_int_eq(engine_param(c, i, &vc, NULL), 0);
		ck_assert_str_eq(vc.name, va.name);
		ck_assert_mem_eq(vc.host_data, va.host_data, va.numel * sizeof(float));
	}
	ck_assert_int_eq(engine_param(c, engine_num_params(c) - 2, &vc, NULL), 0);
	ck_assert_str_eq(vc.name, "score.weight");
	ck_assert(vc.host_data[0] != 0.0f && vc.host_data[0] == vc.host_data[0]);
	ck_assert_int_eq(engine_param(c, engine_num_params(c) - 1, &vc, NULL), 0);
	ck_assert_str_eq(vc.name, "score.bias");
	ck_assert(vc.host_data[0] == 0.0f);

	/* a language model needs every tensor: the critic's directory has no
	 * lm_head.weight, so loading it as an actor is refused by name */
	snprintf(dir, sizeof(dir), "%s/critic", root);
	ck_assert_int_eq(engine_save_checkpoint(c, dir, 1, 0, CKPT_MODEL, NULL, &err), 0);
	engine_destroy(c);
	cfg.model_type = "language_model";
	cfg.model_path = dir;
	c = NULL;
	ck_assert_int_eq(engine_create(&cfg, &c, &err), -EINVAL);
	ck_assert_msg(strstr(err.msg, "lm_head.weight"), "%s", err.msg);
	ck_assert_ptr_null(c);
	engine_destroy(a);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("engine_ckpt");
	TCase *tc = tcase_create("core");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, resume_is_bit_identical);
	tcase_add_test(tc, contents_and_errors);
	tcase_add_test(tc, state_steps_checked);
	tcase_add_test(tc, killed_during_save);
	tcase_add_test(tc, critic_from_actor_directory);
	suite_add_tcase(s, tc);
	return check_run(s);
}
