/* test_engine_ckpt.c — engine checkpoints: bit-identical resume, contents
 * flags, corruption and shape errors, a child process killed during
 * SaveCheckpoint leaving the previous checkpoint and `latest` loadable, a
 * critic's checkpoint (its config.json's class) reloaded as a critic, and
 * engine_state.json's seal and schema: every single-bit flip of the file,
 * each key removed, renamed, retyped or out of range, unknown keys, a step
 * edited; each refused load leaves the engine bit for bit as it was. */
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

/* root/sub/config.json names class `arch` and, for a value model
 * (token_cls), transformers' one label: id2label {"0": "LABEL_0"},
 * label2id {"LABEL_0": 0}; a language model's has neither. */
static void check_class(const char *dir, const char *sub, const char *arch, bool token_cls)
{
	char path[400];
	json_t *o, *ids, *labels;

	snprintf(path, sizeof(path), "%s/%s/config.json", dir, sub);
	o = json_load_file(path, 0, NULL);
	ck_assert_ptr_nonnull(o);
	ck_assert_int_eq(json_array_size(json_object_get(o, "architectures")), 1);
	ck_assert_str_eq(json_string_value(json_array_get(json_object_get(o, "architectures"), 0)),
			 arch);
	ids = json_object_get(o, "id2label");
	labels = json_object_get(o, "label2id");
	if (token_cls) {
		ck_assert_int_eq(json_object_size(ids), 1);
		ck_assert_str_eq(json_string_value(json_object_get(ids, "0")), "LABEL_0");
		ck_assert_int_eq(json_object_size(labels), 1);
		ck_assert(json_is_integer(json_object_get(labels, "LABEL_0")));
		ck_assert_int_eq(json_integer_value(json_object_get(labels, "LABEL_0")), 0);
	} else {
		ck_assert_ptr_null(ids);
		ck_assert_ptr_null(labels);
	}
	json_decref(o);
}

/* A checkpoint directory is a Hugging Face model directory: a value model
 * (critic) initialized from an actor's checkpoint takes the backbone and
 * draws score.* from its seed. */
START_TEST(critic_from_actor_directory)
{
	struct engine *a = make_engine(TINY_QWEN2, "language_model", 21, 1e-3);
	struct engine_init_config cfg;
	struct engine_param_view va, vc;
	struct eng_error err = {0};
	struct engine *c, *back;
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

	/* The critic's directory names its class, as transformers does for
	 * one label (the actor's stays Qwen2ForCausalLM); it reloads as a
	 * value model with every parameter as saved (score.* too: another
	 * seed would draw others) ... */
	snprintf(dir, sizeof(dir), "%s/critic", root);
	ck_assert_int_eq(engine_save_checkpoint(c, dir, 1, 0, CKPT_MODEL, NULL, &err), 0);
	check_class(root, "actor", "Qwen2ForCausalLM", false);
	check_class(root, "critic", "Qwen2ForTokenClassification", true);
	cfg.seed = 99;
	ck_assert_msg(engine_create(&cfg, &back, &err) == 0, "%s", err.msg);
	ck_assert_int_eq(engine_num_params(back), engine_num_params(c));
	for (i = 0; i < engine_num_params(c); i++) {
		ck_assert_int_eq(engine_param(c, i, &vc, NULL), 0);
		ck_assert_int_eq(engine_param(back, i, &va, NULL), 0);
		ck_assert_str_eq(va.name, vc.name);
		ck_assert_mem_eq(va.host_data, vc.host_data, vc.numel * sizeof(float));
	}
	engine_destroy(back);
	engine_destroy(c);
	/* ... and a language model refuses it by that class (it has no
	 * lm_head.weight). */
	cfg.model_type = "language_model";
	cfg.model_path = dir;
	c = NULL;
	ck_assert_int_eq(engine_create(&cfg, &c, &err), -EINVAL);
	ck_assert_msg(strstr(err.msg, "architectures[0]: Qwen2ForTokenClassification is a value "
			     "model's class (a score head, no lm_head)"), "%s", err.msg);
	ck_assert_ptr_null(c);
	engine_destroy(a);
}
END_TEST

/* --- engine_state.json ---------------------------------------------------- */

/* What a refused load must leave alone: parameters and gradients bit for
 * bit, the steps and the lr. */
struct snap {
	float *params, *grads;
	size_t n;
	int64_t step, sched_step;
	double lr;
};

static void take(struct engine *e, struct snap *s)
{
	struct engine_param_view v;
	struct engine_status st;
	size_t off = 0;

	s->n = 0;
	for (int64_t i = 0; i < engine_num_params(e); i++) {
		ck_assert_int_eq(engine_param(e, i, &v, NULL), 0);
		s->n += (size_t)v.numel;
	}
	s->params = malloc(s->n * sizeof(float));
	s->grads = malloc(s->n * sizeof(float));
	ck_assert(s->params && s->grads);
	for (int64_t i = 0; i < engine_num_params(e); i++) {
		ck_assert_int_eq(engine_param(e, i, &v, NULL), 0);
		memcpy(s->params + off, v.host_data, v.numel * sizeof(float));
		ck_assert_int_eq(engine_grad(e, i, &v, NULL), 0);
		memcpy(s->grads + off, v.host_data, v.numel * sizeof(float));
		off += (size_t)v.numel;
	}
	engine_status(e, &st);
	s->step = st.step;
	s->sched_step = st.sched_step;
	s->lr = st.lr;
}

static void drop_snap(struct snap *s)
{
	free(s->params);
	free(s->grads);
}

static bool same(struct engine *e, const struct snap *want)
{
	struct snap now;
	bool eq;

	take(e, &now);
	eq = now.n == want->n && !memcmp(now.params, want->params, now.n * sizeof(float)) &&
	     !memcmp(now.grads, want->grads, now.n * sizeof(float)) &&
	     now.step == want->step && now.sched_step == want->sched_step &&
	     memcmp(&now.lr, &want->lr, sizeof(double)) == 0;
	drop_snap(&now);
	return eq;
}

static char *slurp(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	char *buf;
	long len;

	ck_assert_ptr_nonnull(f);
	fseek(f, 0, SEEK_END);
	len = ftell(f);
	fseek(f, 0, SEEK_SET);
	buf = malloc((size_t)len + 1);
	ck_assert_int_eq(fread(buf, 1, (size_t)len, f), (size_t)len);
	buf[len] = '\0';
	fclose(f);
	*n = (size_t)len;
	return buf;
}

static void spill(const char *path, const char *buf, size_t n)
{
	FILE *f = fopen(path, "wb");

	ck_assert_ptr_nonnull(f);
	ck_assert_int_eq(fwrite(buf, 1, n, f), n);
	ck_assert_int_eq(fclose(f), 0);
}

/* Two engines: `a` trained one step and saved to <root>/<name> (want_a: its
 * state then); `b` trained otherwise and saved to <root>/b-own (want_b). */
static void two_engines(const char *name, struct engine **a, struct engine **b,
			struct snap *want_a, struct snap *want_b)
{
	struct eng_error err = {0};
	char dir[300];

	*a = make_sched_engine(1);
	train_step(*a, 0);
	snprintf(dir, sizeof(dir), "%s/%s", root, name);
	ck_assert_int_eq(engine_save_checkpoint(*a, dir, 1, 0, CKPT_ALL, NULL, &err), 0);
	take(*a, want_a);
	*b = make_sched_engine(2);
	train_step(*b, 7);
	train_step(*b, 8);
	snprintf(dir, sizeof(dir), "%s/b-own", root);
	ck_assert_int_eq(engine_save_checkpoint(*b, dir, 2, 0, CKPT_ALL, NULL, &err), 0);
	take(*b, want_b);
}

/* Every single-bit flip of every byte of engine_state.json is refused with
 * DATA_LOSS naming the file, unless the flipped file parses to the same
 * JSON value (the seal covers values, not layout: e.g. "1e-08" -> "1E-08"),
 * in which case it loads as the original. */
START_TEST(state_byte_flips)
{
	struct engine *a, *b;
	struct snap want_a, want_b;
	struct eng_error err;
	char path[400], own[300], dir[300], *orig, *buf;
	json_t *ref;
	size_t n;
	int refused = 0, noop = 0;
	int64_t gstep;

	two_engines("flip", &a, &b, &want_a, &want_b);
	snprintf(dir, sizeof(dir), "%s/flip", root);
	snprintf(own, sizeof(own), "%s/b-own", root);
	snprintf(path, sizeof(path), "%s/engine_state.json", dir);
	orig = slurp(path, &n);
	buf = malloc(n);
	ref = json_loadb(orig, n, JSON_REJECT_DUPLICATES, NULL);
	ck_assert_ptr_nonnull(ref);
	for (size_t i = 0; i < n; i++) {
		for (int bit = 0; bit < 8; bit++) {
			json_t *m;
			bool equal;
			int rc;

			memcpy(buf, orig, n);
			buf[i] ^= (char)(1 << bit);
			spill(path, buf, n);
			m = json_loadb(buf, n, JSON_REJECT_DUPLICATES, NULL);
			equal = m && json_equal(m, ref);
			json_decref(m);
			eng_error_clear(&err);
			rc = engine_load_checkpoint(b, dir, CKPT_ALL, &gstep, &err);
			if (!equal) {
				ck_assert_msg(rc == -EBADMSG &&
					      strstr(err.msg, "engine_state.json"),
					      "byte %zu bit %d ('%c'): rc %s: %s", i, bit, orig[i],
					      eng_strerror(rc), err.msg);
				ck_assert_msg(same(b, &want_b),
					      "byte %zu bit %d changed the engine", i, bit);
				refused++;
				continue;
			}
			ck_assert_msg(rc == 0, "byte %zu bit %d: a no-op refused: %s", i, bit,
				      err.msg);
			ck_assert_int_eq(gstep, 1);
			ck_assert(same(b, &want_a));
			ck_assert_int_eq(engine_load_checkpoint(b, own, CKPT_ALL, &gstep, &err), 0);
			ck_assert(same(b, &want_b));
			printf("no-op flip at byte %zu: '%c' -> '%c' in \"%.12s\"\n", i, orig[i],
			       buf[i], orig + (i > 6 ? i - 6 : 0));
			noop++;
		}
	}
	printf("engine_state.json: %zu bytes, %zu single-bit flips: %d refused (DATA_LOSS), "
	       "%d the same JSON value (loaded)\n", n, 8 * n, refused, noop);
	ck_assert_int_eq(refused + noop, (int)(8 * n));
	spill(path, orig, n);
	ck_assert_int_eq(engine_load_checkpoint(b, dir, CKPT_ALL, &gstep, &err), 0);
	ck_assert(same(b, &want_a));
	train_step(b, 3);   /* still usable */
	json_decref(ref);
	free(buf);
	free(orig);
	drop_snap(&want_a);
	drop_snap(&want_b);
	engine_destroy(a);
	engine_destroy(b);
}
END_TEST

/* The seal, computed here as checkpoint.h documents it: XXH64 (seed 0) of
 * jansson's JSON_COMPACT | JSON_SORT_KEYS text of the object without
 * state_xxh64, as 16 lowercase hex digits. */
static void reseal(json_t *s)
{
	json_t *c = json_deep_copy(s);
	char hex[17], *text;

	json_object_del(c, "state_xxh64");
	text = json_dumps(c, JSON_COMPACT | JSON_SORT_KEYS);
	snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)XXH64(text, strlen(text), 0));
	json_object_set_new(s, "state_xxh64", json_string(hex));
	free(text);
	json_decref(c);
}

struct state_case {
	struct engine *b;
	const struct snap *want_b;
	const char *dir, *path;
	int cases;
};

/* Write `s` (resealed when `seal`), load it into b: rc `want`, the message
 * naming engine_state.json and `key`, b unchanged. Consumes s. */
static void expect_state(struct state_case *c, json_t *s, bool seal, int want, const char *key)
{
	struct eng_error err = {0};
	char *text;
	int64_t gstep;
	int rc;

	if (seal)
		reseal(s);
	text = json_dumps(s, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
	spill(c->path, text, strlen(text));
	free(text);
	json_decref(s);
	rc = engine_load_checkpoint(c->b, c->dir, CKPT_ALL, &gstep, &err);
	ck_assert_msg(rc == want, "%s (%s): rc %s, want %s: %s", key, seal ? "sealed" : "as is",
		      eng_strerror(rc), eng_strerror(want), err.msg);
	ck_assert_msg(strstr(err.msg, "engine_state.json") && strstr(err.msg, key),
		      "%s: message '%s'", key, err.msg);
	ck_assert_msg(same(c->b, c->want_b), "%s: the refused load changed the engine", key);
	c->cases++;
}

/* Copy of ref with member `key` of ref (or of its sub-object `sub`) removed,
 * or renamed to key + "_x" when `rename`. */
static json_t *without(json_t *ref, const char *sub, const char *key, bool rename)
{
	json_t *s = json_deep_copy(ref), *o = sub ? json_object_get(s, sub) : s;
	char name[128];

	if (rename) {
		snprintf(name, sizeof(name), "%s_x", key);
		json_object_set(o, name, json_object_get(o, key));
	}
	json_object_del(o, key);
	return s;
}

static json_t *with(json_t *ref, const char *sub, const char *key, json_t *v)
{
	json_t *s = json_deep_copy(ref), *o = sub ? json_object_get(s, sub) : s;

	json_object_set_new(o, key, v);
	return s;
}

START_TEST(state_schema)
{
	struct engine *a, *b;
	struct snap want_a, want_b;
	struct eng_error err = {0};
	char path[400], dir[300], name[160], *orig, *edit, *at;
	const char *subs[] = {NULL, "optimizer", "lr_scheduler"}, *key;
	struct state_case c;
	struct engine_status st;
	json_t *ref, *s, *v, *rng;
	int64_t gstep;
	size_t n;

	two_engines("schema", &a, &b, &want_a, &want_b);
	snprintf(dir, sizeof(dir), "%s/schema", root);
	snprintf(path, sizeof(path), "%s/engine_state.json", dir);
	c = (struct state_case){b, &want_b, dir, path, 0};
	orig = slurp(path, &n);
	ref = json_loadb(orig, n, JSON_REJECT_DUPLICATES, NULL);
	ck_assert_ptr_nonnull(ref);
	ck_assert_int_eq(json_integer_value(json_object_get(ref, "format_version")), 2);

	/* Each key of the file and of its objects: removed or renamed, as is
	 * (the seal no longer matches) and resealed (the schema). */
	for (int k = 0; k < 3; k++) {
		json_t *o = subs[k] ? json_object_get(ref, subs[k]) : ref;

		json_object_foreach(o, key, v) {
			bool seal_key = !strcmp(key, "state_xxh64");

			snprintf(name, sizeof(name), "%s%s%s", subs[k] ? subs[k] : "",
				 subs[k] ? "." : "", key);
			expect_state(&c, without(ref, subs[k], key, false), false, -EBADMSG,
				     seal_key ? key : "state_xxh64");
			expect_state(&c, without(ref, subs[k], key, true), false, -EBADMSG,
				     seal_key ? key : "state_xxh64");
			if (seal_key)
				continue;
			expect_state(&c, without(ref, subs[k], key, false), true, -EBADMSG, name);
			expect_state(&c, without(ref, subs[k], key, true), true, -EBADMSG, name);
		}
	}
	/* A files entry's members. */
	s = json_deep_copy(ref);
	json_object_del(json_object_get(json_object_get(s, "files"), "config.json"), "bytes");
	expect_state(&c, s, true, -EBADMSG, "files.config.json.bytes");
	s = json_deep_copy(ref);
	json_object_set_new(json_object_get(json_object_get(s, "files"), "config.json"), "mode",
			    json_integer(420));
	expect_state(&c, s, true, -EBADMSG, "unknown key 'mode'");
	/* Unknown keys. */
	expect_state(&c, with(ref, NULL, "surprise", json_true()), false, -EBADMSG, "state_xxh64");
	expect_state(&c, with(ref, NULL, "surprise", json_true()), true, -EBADMSG,
		     "unknown key 'surprise'");
	expect_state(&c, with(ref, "optimizer", "momentum", json_real(0.9)), true, -EBADMSG,
		     "unknown key 'optimizer.momentum'");
	/* Types and ranges. */
	expect_state(&c, with(ref, NULL, "global_step", json_string("1")), true, -EBADMSG,
		     "global_step: must be an integer");
	expect_state(&c, with(ref, "optimizer", "lr", json_integer(1)), true, -EBADMSG,
		     "optimizer.lr: must be a real number");
	expect_state(&c, with(ref, NULL, "optimizer_step", json_integer(-1)), true, -EBADMSG,
		     "optimizer_step");
	/* The counters are counted on: at most 2^53; global_step is only
	 * handed back (any int64 >= 0). */
	expect_state(&c, with(ref, NULL, "optimizer_step", json_integer(INT64_C(1) << 62)), true,
		     -EBADMSG, "optimizer_step: 4611686018427387904, must be in [0, 9007199254740992]");
	expect_state(&c, with(ref, NULL, "lr_scheduler_step", json_integer((INT64_C(1) << 53) + 1)),
		     true, -EBADMSG, "lr_scheduler_step");
	expect_state(&c, with(ref, NULL, "global_step", json_integer(-3)), true, -EBADMSG,
		     "global_step: -3, must be in [0, 9223372036854775807]");
	expect_state(&c, with(ref, "optimizer", "beta1", json_real(1.5)), true, -EBADMSG,
		     "optimizer.beta1");
	expect_state(&c, with(ref, "optimizer", "eps", json_real(0.0)), true, -EBADMSG,
		     "optimizer.eps");
	expect_state(&c, with(ref, "optimizer", "type", json_string("sgd")), true, -EBADMSG,
		     "optimizer.type");
	expect_state(&c, with(ref, "lr_scheduler", "type", json_integer(7)), true, -EBADMSG,
		     "lr_scheduler.type");
	expect_state(&c, with(ref, "lr_scheduler", "type", json_integer(INT64_C(1) << 32)), true,
		     -EBADMSG, "lr_scheduler.type");
	expect_state(&c, with(ref, "lr_scheduler", "min_lr_ratio", json_real(2.0)), true,
		     -EBADMSG, "lr_scheduler.min_lr_ratio");
	rng = json_pack("[s,s,s,s]", "0000000000000000", "0000000000000000", "0000000000000000",
			"0000000000000000");
	expect_state(&c, with(ref, NULL, "rng_state", rng), true, -EBADMSG, "rng_state: all zero");
	s = json_deep_copy(ref);
	json_array_set_new(json_object_get(s, "rng_state"), 2, json_string("ABCDEF0123456789"));
	expect_state(&c, s, true, -EBADMSG, "rng_state[2]");
	s = json_deep_copy(ref);
	json_array_remove(json_object_get(s, "rng_state"), 3);
	expect_state(&c, s, true, -EBADMSG, "rng_state");
	expect_state(&c, with(ref, NULL, "contents", json_pack("[s,s,s,s]", "model", "optimizer",
							       "extra", "model")),
		     true, -EBADMSG, "'model' listed twice");
	expect_state(&c, with(ref, NULL, "contents", json_pack("[s,s]", "model", "extra")), true,
		     -EBADMSG, "optimizer.safetensors");
	expect_state(&c, with(ref, NULL, "contents", json_pack("[s,s,s]", "model", "optimizer",
							       "weights")),
		     true, -EBADMSG, "contents[2]");
	/* A group's optimizer: every shard of its world size listed, and no
	 * shard of another (the file itself there, intact: a link). */
	{
		char src[420], dst[420];

		snprintf(src, sizeof(src), "%s/optimizer.safetensors", dir);
		snprintf(dst, sizeof(dst), "%s/optimizer-00000-of-00002.safetensors", dir);
		ck_assert_int_eq(link(src, dst), 0);
	}
	s = with(ref, NULL, "world_size", json_integer(2));
	v = json_object_get(s, "files");
	json_object_set(v, "optimizer-00000-of-00002.safetensors",
			json_object_get(v, "optimizer.safetensors"));
	json_object_del(v, "optimizer.safetensors");
	expect_state(&c, s, true, -EBADMSG, "optimizer-00001-of-00002.safetensors is not listed");
	s = json_deep_copy(ref);
	v = json_object_get(s, "files");
	json_object_set(v, "optimizer-00000-of-00002.safetensors",
			json_object_get(v, "optimizer.safetensors"));
	expect_state(&c, s, true, -EBADMSG, "'optimizer-00000-of-00002.safetensors' is not a file");
	expect_state(&c, with(ref, NULL, "format_version", json_string("2")), true, -EBADMSG,
		     "format_version");
	expect_state(&c, with(ref, NULL, "state_xxh64", json_string("0123")), false, -EBADMSG,
		     "state_xxh64");
	/* Intact, but not for this engine: INVALID_ARGUMENT. */
	expect_state(&c, with(ref, NULL, "engine_key", json_string("value_model/native/cpu")),
		     true, -EINVAL, "of engine value_model/native/cpu");
	v = json_integer(json_integer_value(json_object_get(ref, "num_parameters")) + 1);
	expect_state(&c, with(ref, NULL, "num_parameters", v), true, -EINVAL, "parameters");
	/* Any world size loads (the file holds every moment; test_engine_dist
	 * loads a group's checkpoint into one engine and into groups). */
	expect_state(&c, with(ref, NULL, "world_size", json_integer(0)), true, -EBADMSG,
		     "world_size");
	expect_state(&c, with(ref, NULL, "format_version", json_integer(3)), true, -EINVAL,
		     "format_version 3");
	/* A format_version 1 file (no seal) is refused saying so. */
	s = without(ref, NULL, "state_xxh64", false);
	json_object_set_new(s, "format_version", json_integer(1));
	expect_state(&c, s, false, -EINVAL, "format_version 1");

	/* optimizer_step 1 -> 9 by an edit of the text: the seal refuses it.
	 * (An edit that also rewrites the seal is an intact state by every
	 * rule: the seal guards against damage, the root's permissions
	 * against edits.) */
	ck_assert_ptr_nonnull((at = strstr(orig, "\"optimizer_step\": 1,")));
	edit = strdup(orig);
	edit[at - orig + strlen("\"optimizer_step\": ")] = '9';
	spill(path, edit, n);
	eng_error_clear(&err);
	ck_assert_int_eq(engine_load_checkpoint(b, dir, CKPT_ALL, &gstep, &err), -EBADMSG);
	ck_assert_ptr_nonnull(strstr(err.msg, "engine_state.json"));
	ck_assert_ptr_nonnull(strstr(err.msg, "state_xxh64"));
	ck_assert(same(b, &want_b));
	free(edit);
	s = with(ref, NULL, "optimizer_step", json_integer(9));
	reseal(s);
	edit = json_dumps(s, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
	spill(path, edit, strlen(edit));
	free(edit);
	json_decref(s);
	ck_assert_int_eq(engine_load_checkpoint(b, dir, CKPT_ALL, &gstep, &err), 0);
	engine_status(b, &st);
	ck_assert_int_eq(st.step, 9);

	/* The original loads; the engine is a's at the save and trains on. */
	spill(path, orig, n);
	ck_assert_msg(engine_load_checkpoint(b, dir, CKPT_ALL, &gstep, &err) == 0, "%s", err.msg);
	ck_assert(same(b, &want_a));
	train_step(b, 4);
	printf("engine_state.json: %d refused edits checked\n", c.cases);
	ck_assert_int_gt(c.cases, 80);
	json_decref(ref);
	free(orig);
	drop_snap(&want_a);
	drop_snap(&want_b);
	engine_destroy(a);
	engine_destroy(b);
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
	tcase_add_test(tc, killed_during_save);
	tcase_add_test(tc, critic_from_actor_directory);
	tcase_add_test(tc, state_byte_flips);
	tcase_add_test(tc, state_schema);
	suite_add_tcase(s, tc);
	return check_run(s);
}
