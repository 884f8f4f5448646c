/* bench_engine.h — what the C engine benchmarks share (bench_lora.c,
 * bench_moe.c): an engine from a config.json's text, and one training step
 * of one sequence under the mean SFT loss. Header-only (static functions):
 * each bench stays one program; errors end it with the bench's name. */
#ifndef ENGINED_BENCH_ENGINE_H
#define ENGINED_BENCH_ENGINE_H

#include <stdio.h>
#include <stdlib.h>

#include "engine.h"
#include "bench_util.h"

/* dL/dlogp = -1 / tokens for every predicted token (ctx: the int64 count). */
static int bench_sft_loss(void *ctx, struct engine_loss_io *io, struct eng_error *err)
{
	(void)err;
	for (int64_t i = 0; i < io->n; i++)
		io->d_log_probs[i] = i ? -1.0f / (float)*(const int64_t *)ctx : 0.0f;
	return 0;
}

/* An engine of config `hf` (seed 1234), one micro-batch of `tokens`, in
 * TRAIN mode unless frozen (a LoRA base). */
static struct engine *bench_engine(const char *who, const char *hf, int threads, int64_t tokens,
				   bool frozen)
{
	struct engine_init_config cfg;
	struct eng_error err = {0};
	struct engine *e = NULL;

	engine_init_config_defaults(&cfg);
	cfg.hf_config_json = hf;
	cfg.seed = 1234;
	cfg.threads = threads;
	cfg.max_tokens_per_micro_batch = tokens;
	cfg.frozen_base = frozen;
	if (engine_create(&cfg, &e, &err) ||
	    (!frozen && engine_set_mode(e, ENGINE_MODE_TRAIN, false, &err))) {
		fprintf(stderr, "%s: %s\n", who, err.msg);
		exit(1);
	}
	return e;
}

/* Seconds of one training step of e (forward_backward of the sequence
 * ids[tokens], optimizer_step). */
static double bench_train_step(const char *who, struct engine *e, int64_t tokens,
			       const int32_t *ids)
{
	int32_t len = (int32_t)tokens;
	int64_t total = tokens;
	struct engine_batch b = {.n = tokens, .input_ids = ids, .num_seqs = 1, .seq_lens = &len,
				 .temperature = 1.0f, .loss_fn = bench_sft_loss,
				 .loss_ctx = &total};
	struct engine_fb_result res = {0};
	struct engine_step_result sr;
	struct eng_error err = {0};
	double t0 = now_s();

	if (engine_forward_backward(e, &b, &res, &err) || engine_optimizer_step(e, &sr, &err)) {
		fprintf(stderr, "%s: step: %s\n", who, err.msg);
		exit(1);
	}
	return now_s() - t0;
}

#endif
