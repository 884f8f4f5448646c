/* engined_demo.c — a short end-to-end run of the engine library without
 * the daemon: a tiny Llama learns to continue counting sequences
 * (t, t+1, t+2, ... mod V) with the engine's `sft` loss (token-mean
 * cross-entropy, stated as data in the engine's own request), then saves a
 * checkpoint, reloads it into a fresh engine and checks that both give the
 * same log-probabilities.
 *
 *   engined-demo [--steps N] [--checkpoint-root DIR]
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine.h"

#define VOCAB 64
#define SEQS 8
#define LEN 24

static const char *const DEMO_CONFIG =
	"{\"model_type\": \"llama\", \"vocab_size\": 64, \"hidden_size\": 64,"
	" \"intermediate_size\": 128, \"num_hidden_layers\": 2,"
	" \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
	" \"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0,"
	" \"tie_word_embeddings\": true}";

static void make_batch(int32_t *ids, int32_t *lens, unsigned *seed)
{
	for (int s = 0; s < SEQS; s++) {
		int start;

		*seed = *seed * 1103515245u + 12345u;
		start = (int)((*seed >> 8) % VOCAB);
		lens[s] = LEN;
		for (int i = 0; i < LEN; i++)
			ids[s * LEN + i] = (start + i) % VOCAB;
	}
}

static int mkdir_p(const char *path)
{
	char buf[1024];

	snprintf(buf, sizeof(buf), "%s", path);
	for (char *p = buf + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdir(buf, 0755) && errno != EEXIST)
			return -1;
		*p = '/';
	}
	return mkdir(buf, 0755) && errno != EEXIST ? -1 : 0;
}

int main(int argc, char **argv)
{
	const char *root = "./var/checkpoints";
	int steps = 60;
	static const char *const opt_keys[] = { "loss_agg_mode" };
	static const char *const opt_values[] = { "token-mean" };
	struct engine_init_config cfg;
	struct eng_error err = {0};
	struct engine *e, *f;
	int32_t ids[SEQS * LEN], lens[SEQS];
	float lp_a[SEQS * LEN], lp_b[SEQS * LEN];
	unsigned seed = 1;
	char dir[1100];
	double first = 0, last = 0;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--steps") && i + 1 < argc)
			steps = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--checkpoint-root") && i + 1 < argc)
			root = argv[++i];
		else {
			fprintf(stderr, "usage: %s [--steps N] [--checkpoint-root DIR]\n", argv[0]);
			return 2;
		}
	}
	engine_init_config_defaults(&cfg);
	cfg.hf_config_json = DEMO_CONFIG;
	cfg.seed = 7;
	cfg.optim.lr = 3e-3;
	cfg.optim.weight_decay = 0.0;
	cfg.sched.type = LR_SCHEDULE_COSINE;
	cfg.sched.warmup_steps = 5;
	cfg.sched.total_steps = steps;
	cfg.max_tokens_per_micro_batch = 96;
	if (engine_create(&cfg, &e, &err)) {
		fprintf(stderr, "engine: %s\n", err.msg);
		return 1;
	}
	{
		struct engine_status st;

		engine_status(e, &st);
		printf("engine %s, %lld parameters\n", st.key, (long long)st.num_parameters);
	}
	if (engine_set_mode(e, ENGINE_MODE_TRAIN, false, &err))
		goto fail;
	for (int s = 0; s < steps; s++) {
		struct engine_fb_request req = {
			.batch = {.n = SEQS * LEN, .input_ids = ids, .num_seqs = SEQS,
				  .seq_lens = lens, .temperature = 1.0f},
			.loss = "sft", .num_options = 1,
			.option_keys = opt_keys, .option_values = opt_values,
		};
		struct engine_fb_call *call;
		struct engine_fb_result r = {0};
		struct engine_fb_loss fl;
		struct engine_step_result sr;
		double lr, loss;
		int rc;

		make_batch(ids, lens, &seed);
		if (engine_fb_call_prepare(&req, false, &call, &err))
			goto fail;
		rc = engine_fb_call_run(e, call, &r, &fl, &err);
		engine_fb_call_free(call);
		if (rc)
			goto fail;
		loss = fl.loss;
		if (engine_optimizer_step(e, &sr, &err) || engine_lr_scheduler_step(e, &lr, &err))
			goto fail;
		if (s == 0)
			first = loss;
		last = loss;
		if (s % 10 == 0 || s == steps - 1)
			printf("step %3d  loss %.4f  grad_norm %.4f  lr %.2e  micro_batches %d\n",
			       s, loss, sr.grad_norm, sr.lr, r.num_micro_batches);
	}
	if (engine_set_mode(e, ENGINE_MODE_IDLE, false, &err))
		goto fail;

	snprintf(dir, sizeof(dir), "%s/demo", root);
	if (mkdir_p(root)) {
		fprintf(stderr, "cannot create %s: %s\n", root, strerror(errno));
		return 1;
	}
	if (engine_save_checkpoint(e, dir, steps, 2, CKPT_ALL, NULL, &err))
		goto fail;
	cfg.seed = 99;
	if (engine_create(&cfg, &f, &err) || engine_load_checkpoint(f, dir, CKPT_ALL, NULL, &err))
		goto fail;
	{
		struct engine_batch b = {.n = SEQS * LEN, .input_ids = ids, .num_seqs = SEQS,
					 .seq_lens = lens, .forward_only = true};
		struct engine_fb_result ra = {.log_probs = lp_a}, rb = {.log_probs = lp_b};

		if (engine_forward_backward(e, &b, &ra, &err) ||
		    engine_forward_backward(f, &b, &rb, &err))
			goto fail;
		if (memcmp(lp_a, lp_b, sizeof(lp_a))) {
			fprintf(stderr, "reloaded checkpoint gives different log-probs\n");
			return 1;
		}
	}
	printf("loss %.4f -> %.4f; checkpoint %s reloaded, log-probs identical\n",
	       first, last, dir);
	engine_destroy(e);
	engine_destroy(f);
	return last < first * 0.5 ? 0 : 1;
fail:
	fprintf(stderr, "error (%s): %s\n", eng_strerror(err.code), err.msg);
	return 1;
}
