/* enginectl_demo.c — `enginectl demo`: a short controller against a running
 * engined. It initializes a preset (tiny by default), runs SFT on a
 * synthetic counting task until the loss falls, samples greedy
 * completions from the trained weights (Sample), takes forward-only
 * log-probs, runs PPO steps on made-up advantages, then checks the weight
 * stream against the model.safetensors of a checkpoint it saves and
 * against itself after reloading that checkpoint. Exit status 0 when the
 * loss fell, at least half the sampled tokens follow the task's rule and
 * the weights matched. client/run_demo.sh starts a daemon
 * and runs it. */
#include "enginectl_demo.h"

#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"
#include "pb_has.h"

enum { NSEQ = 8, LEN = 32, N = NSEQ * LEN };

const struct ctl_opt ctl_demo_opts[] = {
	{ "preset", required_argument, 'p', "NAME", "the preset to initialize (default tiny)" },
	{ "sft-steps", required_argument, 's', "N", "SFT steps, 0 to 1000000 (default 40)" },
	{ "ppo-steps", required_argument, 'P', "N", "PPO steps, 0 to 1000000 (default 4)" },
	{ "checkpoint-root", required_argument, 'c', "DIR",
	  "the daemon's checkpoints (default ./var/checkpoints)" },
	{ NULL, 0, 0, NULL, NULL },
};

struct weights_copy {
	size_t n;
	char **names;
	uint8_t **data;
	size_t *len;
};

struct demo {
	struct ec_client *c;
	const char *preset, *ckpt_root;
	int sft_steps, ppo_steps;
	unsigned seed;                  /* of the batches: SFT's, then PPO's */
	int32_t ids[N], seq_lens[NSEQ]; /* the current batch */
	int64_t n;                      /* N, the shape of its tensors */
	double first, last;             /* SFT loss at the first and last step */
	struct weights_copy w1;         /* streamed after PPO */
	char ckpt_rel[64];              /* the checkpoint saved, under the root */
	int mismatches;                 /* tensors that differed, all checks */
	int follow, sampled;            /* greedy tokens that follow the rule, of all */
};

/* A synthetic next-token task: each sequence counts up by a fixed stride
 * from a random start, modulo 64. `corrupt` replaces the second half with
 * random tokens (a "bad" sample for the PPO part). */
static void make_batch(int32_t *ids, int32_t *seq_lens, int nseq, int len,
		       unsigned *seed, const bool *corrupt)
{
	for (int s = 0; s < nseq; s++) {
		int32_t start = (int32_t)(rand_r(seed) % 64);

		seq_lens[s] = len;
		for (int t = 0; t < len; t++) {
			int32_t v = (start + 3 * t) % 64;

			if (corrupt && corrupt[s] && t >= len / 2)
				v = (int32_t)(rand_r(seed) % 64);
			ids[s * len + t] = v;
		}
	}
}

static Engined__V1__LossSpec__OptionsEntry opt_entry(const char *k, const char *v)
{
	Engined__V1__LossSpec__OptionsEntry e = ENGINED__V1__LOSS_SPEC__OPTIONS_ENTRY__INIT;

	e.key = (char *)k;
	e.value = (char *)v;
	return e;
}

static double metric(const Engined__V1__ForwardBackwardResponse *r, const char *k)
{
	for (size_t i = 0; i < r->n_metrics; i++)
		if (!strcmp(r->metrics[i]->key, k))
			return r->metrics[i]->value;
	return NAN;
}

static int pull_all(struct ec_client *c, struct weights_copy *wc, struct ec_status *st)
{
	Engined__V1__GetPerTensorParamRequest req = ENGINED__V1__GET_PER_TENSOR_PARAM_REQUEST__INIT;
	struct ec_weights *w = NULL;
	struct ec_tensor t;
	size_t cap = 0;
	int done = 0, r;

	memset(wc, 0, sizeof(*wc));
	req.dtype = ENGINED__V1__DTYPE__FLOAT32;
	r = ec_weights_open(c, &req, &w, st);
	if (r)
		return r;
	while (!(r = ec_weights_next(w, &t, &done, st)) && !done) {
		if (wc->n == cap) {
			cap = cap ? cap * 2 : 64;
			wc->names = realloc(wc->names, cap * sizeof(char *));
			wc->data = realloc(wc->data, cap * sizeof(uint8_t *));
			wc->len = realloc(wc->len, cap * sizeof(size_t));
			if (!wc->names || !wc->data || !wc->len) {
				ec_weights_close(w);
				return EC_RESOURCE_EXHAUSTED;
			}
		}
		wc->names[wc->n] = strdup(t.name);
		wc->data[wc->n] = malloc(t.nbytes ? t.nbytes : 1);
		memcpy(wc->data[wc->n], t.data, t.nbytes);
		wc->len[wc->n] = t.nbytes;
		wc->n++;
	}
	ec_weights_close(w);
	return r;
}

static void weights_free(struct weights_copy *wc)
{
	for (size_t i = 0; i < wc->n; i++) {
		free(wc->names[i]);
		free(wc->data[i]);
	}
	free(wc->names);
	free(wc->data);
	free(wc->len);
}

static double mean_f32(const float *v, int n)
{
	double m = 0;

	for (int i = 0; i < n; i++)
		m += v[i];
	return n ? m / n : 0;
}

/* --- the steps, in order; each returns 0 or the exit status -------------- */

static void demo_parse(struct demo *d, int argc, char **argv)
{
	int o;

	d->preset = "tiny";
	d->ckpt_root = "./var/checkpoints";
	d->sft_steps = 40;
	d->ppo_steps = 4;
	while ((o = ctl_getopt(argc, argv)) != -1) {
		switch (o) {
		case 'p': d->preset = optarg; break;
		case 's': d->sft_steps = (int)ctl_int_arg("sft-steps", optarg, 0, 1000000); break;
		case 'P': d->ppo_steps = (int)ctl_int_arg("ppo-steps", optarg, 0, 1000000); break;
		case 'c': d->ckpt_root = optarg; break;
		}
	}
	ctl_positionals(argc, argv, 0, 0, NULL);
}

static int demo_init(struct demo *d)
{
	Engined__V1__InitializeRequest ireq = ENGINED__V1__INITIALIZE_REQUEST__INIT;
	Engined__V1__OptimizerConfig opt = ENGINED__V1__OPTIMIZER_CONFIG__INIT;
	Engined__V1__InitializeResponse *iresp = NULL;
	struct ec_status st;
	int serving = 0;
	double t0;

	d->c = ctl_connect();
	if (ec_health_check(d->c, "", &serving, &st))
		return ctl_fail("Health", &st);
	printf("== engined at %s: %s\n", ctl_addr, serving == 1 ? "SERVING" : "NOT_SERVING");

	ireq.preset = (char *)d->preset;
	ireq.replace = true;  /* the demo trains an engine of its own */
	ireq.seed = 42;
	PB_SET(&opt, lr, 3e-3);
	PB_SET(&opt, weight_decay, 1e-4);
	ireq.optimizer = &opt;
	t0 = ctl_now();
	if (ec_initialize(d->c, &ireq, &iresp, &st))
		return ctl_fail("Initialize", &st);
	printf("== Initialize preset %s: %s, %lld parameters (%.2f s)\n", d->preset,
	       iresp->engine_key, (long long)iresp->num_parameters, ctl_now() - t0);
	ec_free(iresp);
	return 0;
}

/* SFT on the counting task. */
static int demo_sft(struct demo *d)
{
	Engined__V1__ForwardBackwardRequest fb = ENGINED__V1__FORWARD_BACKWARD_REQUEST__INIT;
	Engined__V1__LossSpec loss = ENGINED__V1__LOSS_SPEC__INIT;
	Engined__V1__ForwardBackwardResponse *fr = NULL;
	Engined__V1__OptimizerStepResponse *sr = NULL;
	Engined__V1__LrSchedulerStepResponse *lr = NULL;
	Engined__V1__Tensor t_ids;
	struct ec_status st;
	double t0;

	printf("== SFT: %d steps of %d sequences x %d tokens (next token = +3 mod 64)\n",
	       d->sft_steps, NSEQ, LEN);
	loss.name = "sft";
	fb.loss = &loss;
	fb.n_seq_lens = NSEQ;
	fb.seq_lens = d->seq_lens;
	for (int step = 1; step <= d->sft_steps; step++) {
		make_batch(d->ids, d->seq_lens, NSEQ, LEN, &d->seed, NULL);
		ec_tensor_1d(&t_ids, ENGINED__V1__DTYPE__INT32, &d->n, d->ids, sizeof(d->ids));
		fb.input_ids = &t_ids;
		t0 = ctl_now();
		if (ec_forward_backward(d->c, &fb, &fr, &st))
			return ctl_fail("ForwardBackward", &st);
		if (ec_optimizer_step(d->c, &sr, &st))
			return ctl_fail("OptimizerStep", &st);
		if (ec_lr_scheduler_step(d->c, &lr, &st))
			return ctl_fail("LrSchedulerStep", &st);
		if (step == 1)
			d->first = fr->loss;
		d->last = fr->loss;
		if (step == 1 || step % 5 == 0 || step == d->sft_steps)
			printf("  step %3d  loss %7.4f  grad_norm %7.4f  lr %.2e  %5.0f ms\n", step,
			       fr->loss, sr->grad_norm, sr->lr, (ctl_now() - t0) * 1e3);
		ec_free(fr);
		ec_free(sr);
		ec_free(lr);
	}
	printf("  loss %.4f -> %.4f %s\n", d->first, d->last,
	       d->last < 0.5 * d->first ? "(learned)" : "(did not fall by half)");
	return 0;
}

/* Greedy completions of two one-token prompts from the weights SFT made
 * (Sample): how many new tokens follow the +3 rule. */
static int demo_sample(struct demo *d)
{
	Engined__V1__SampleRequest req = ENGINED__V1__SAMPLE_REQUEST__INIT;
	Engined__V1__SampleResponse *resp = NULL;
	int32_t prompts[2] = { 5, 40 }, lens[2] = { 1, 1 };
	int64_t n = 2;
	Engined__V1__Tensor t_ids;
	struct ec_sample *smp = NULL;
	struct ec_status st;
	int done = 0, follow = 0, total = 0;

	ec_tensor_1d(&t_ids, ENGINED__V1__DTYPE__INT32, &n, prompts, sizeof(prompts));
	req.input_ids = &t_ids;
	req.n_seq_lens = 2;
	req.seq_lens = lens;
	req.max_tokens = 8;
	req._temperature_case = ENGINED__V1__SAMPLE_REQUEST___TEMPERATURE_TEMPERATURE;
	req.temperature = 0.0f;         /* greedy */
	if (ec_sample_open(d->c, &req, &smp, &st))
		return ctl_fail("Sample", &st);
	printf("== Sample, greedy, 8 new tokens of prompts 5 and 40:\n");
	while (!ec_sample_next(smp, &resp, &done, &st) && !done) {
		for (size_t i = 0; i < resp->n_completions; i++) {
			const Engined__V1__Completion *c = resp->completions[i];
			int32_t prev = prompts[c->prompt_index];

			printf("  %d ->", prev);
			for (size_t t = 0; t < c->n_token_ids; t++) {
				printf(" %d", c->token_ids[t]);
				follow += c->token_ids[t] == (prev + 3) % 64;
				prev = c->token_ids[t];
				total++;
			}
			printf("\n");
		}
		ec_free(resp);
	}
	ec_sample_close(smp);
	if (!done)
		return ctl_fail("Sample", &st);
	printf("  %d of %d new tokens follow the rule\n", follow, total);
	d->follow = follow;
	d->sampled = total;
	return 0;
}

/* Log-probs of the current batch at temperature 0.7, no loss. */
static int demo_old_log_probs(struct demo *d, Engined__V1__ForwardBackwardResponse **old)
{
	Engined__V1__ForwardBackwardRequest fb = ENGINED__V1__FORWARD_BACKWARD_REQUEST__INIT;
	Engined__V1__Tensor t_ids;
	struct ec_status st;

	ec_tensor_1d(&t_ids, ENGINED__V1__DTYPE__INT32, &d->n, d->ids, sizeof(d->ids));
	fb.input_ids = &t_ids;
	fb.n_seq_lens = NSEQ;
	fb.seq_lens = d->seq_lens;
	fb.forward_only = true;
	fb.return_log_probs = true;
	PB_SET(&fb, temperature, 0.7f);
	if (ec_forward_backward(d->c, &fb, old, &st))
		return ctl_fail("ForwardBackward(forward_only)", &st);
	printf("== forward-only log-probs at temperature 0.7: mean %.4f over %d tokens\n",
	       mean_f32((const float *)(*old)->log_probs->data.data, N), N);
	return 0;
}

/* PPO steps on the current batch against the old log-probs, at the same
 * temperature (0.7). */
static int demo_ppo(struct demo *d, const Engined__V1__ForwardBackwardResponse *old,
		    const float *adv)
{
	Engined__V1__ForwardBackwardRequest fb = ENGINED__V1__FORWARD_BACKWARD_REQUEST__INIT;
	Engined__V1__LossSpec loss = ENGINED__V1__LOSS_SPEC__INIT;
	Engined__V1__LossSpec__OptionsEntry oe[3], *oep[3];
	Engined__V1__ForwardBackwardResponse *fr = NULL;
	Engined__V1__OptimizerStepResponse *sr = NULL;
	Engined__V1__Tensor t_ids, t_adv, t_old;
	struct ec_status st;

	ec_tensor_1d(&t_ids, ENGINED__V1__DTYPE__INT32, &d->n, d->ids, sizeof(d->ids));
	ec_tensor_1d(&t_old, ENGINED__V1__DTYPE__FLOAT32, &d->n, old->log_probs->data.data,
		     old->log_probs->data.len);
	ec_tensor_1d(&t_adv, ENGINED__V1__DTYPE__FLOAT32, &d->n, adv, N * sizeof(*adv));
	oe[0] = opt_entry("policy_loss", "vanilla");
	oe[1] = opt_entry("clip_ratio", "0.2");
	oe[2] = opt_entry("loss_agg_mode", "token-mean");
	for (int i = 0; i < 3; i++)
		oep[i] = &oe[i];
	loss.name = "ppo";
	loss.n_options = 3;
	loss.options = oep;
	fb.input_ids = &t_ids;
	fb.n_seq_lens = NSEQ;
	fb.seq_lens = d->seq_lens;
	fb.loss = &loss;
	PB_SET(&fb, temperature, 0.7f);
	fb.old_log_probs = &t_old;
	fb.advantages = &t_adv;
	printf("== PPO: %d steps (+1 advantage for clean sequences, -1 for corrupted)\n",
	       d->ppo_steps);
	for (int step = 1; step <= d->ppo_steps; step++) {
		if (ec_forward_backward(d->c, &fb, &fr, &st))
			return ctl_fail("ForwardBackward(ppo)", &st);
		if (ec_optimizer_step(d->c, &sr, &st))
			return ctl_fail("OptimizerStep", &st);
		printf("  step %d  loss %8.4f  pg_clipfrac %.3f  ppo_kl %8.5f  grad_norm %.4f\n",
		       step, fr->loss, metric(fr, "pg_clipfrac"), metric(fr, "ppo_kl"),
		       sr->grad_norm);
		ec_free(fr);
		ec_free(sr);
	}
	return 0;
}

/* RL: old log-probs at temperature 0.7, then PPO on made-up advantages:
 * +1 for clean sequences, -1 for corrupted ones. */
static int demo_rl(struct demo *d)
{
	Engined__V1__ForwardBackwardResponse *old = NULL;
	bool corrupt[NSEQ];
	float adv[N];
	int r;

	for (int s = 0; s < NSEQ; s++)
		corrupt[s] = s % 2;
	make_batch(d->ids, d->seq_lens, NSEQ, LEN, &d->seed, corrupt);
	for (int s = 0; s < NSEQ; s++)
		for (int t = 0; t < LEN; t++)
			adv[s * LEN + t] = corrupt[s] ? -1.0f : 1.0f;
	r = demo_old_log_probs(d, &old);
	if (r)
		return r;
	r = demo_ppo(d, old, adv);
	if (r)
		return r;
	ec_free(old);
	return 0;
}

/* The streamed weights (d->w1) against the saved checkpoint's
 * model.safetensors, read from the checkpoint root directly. */
static void demo_check_file(struct demo *d)
{
	struct st_reader *sf = NULL;
	char file[4200];
	int checked = 0, mismatches = 0, r;

	snprintf(file, sizeof(file), "%s/%s/model.safetensors", d->ckpt_root, d->ckpt_rel);
	r = st_reader_open(file, &sf, NULL);
	if (r < 0) {
		printf("   (cannot read %s: %s; weight check skipped)\n", file, strerror(-r));
		return;
	}
	for (size_t i = 0; i < d->w1.n; i++) {
		const struct st_tensor_info *ti = st_reader_find(sf, d->w1.names[i]);
		float *data = malloc(d->w1.len[i] ? d->w1.len[i] : 1);

		/* An F32 tensor is read as its bytes (no conversion). */
		if (!ti || ti->dtype != ST_F32 || ti->nbytes != d->w1.len[i] || !data ||
		    st_reader_read_f32(sf, d->w1.names[i], data, (int64_t)(d->w1.len[i] / 4),
				       NULL) < 0 ||
		    memcmp(data, d->w1.data[i], d->w1.len[i]))
			mismatches++;
		checked++;
		free(data);
	}
	st_reader_close(sf);
	printf("   streamed weights vs %s: %d/%d tensors identical\n", file,
	       checked - mismatches, checked);
	d->mismatches += mismatches;
}

/* Weights: stream, save a checkpoint, compare with its model.safetensors. */
static int demo_save(struct demo *d)
{
	Engined__V1__SaveCheckpointRequest sreq = ENGINED__V1__SAVE_CHECKPOINT_REQUEST__INIT;
	Engined__V1__SaveCheckpointResponse *sresp = NULL;
	struct ec_status st;
	double t0 = ctl_now();

	if (pull_all(d->c, &d->w1, &st))
		return ctl_fail("GetPerTensorParam", &st);
	printf("== streamed %zu tensors (FLOAT32) in %.3f s\n", d->w1.n, ctl_now() - t0);
	snprintf(d->ckpt_rel, sizeof(d->ckpt_rel), "demo/step_%d", d->sft_steps + d->ppo_steps);
	sreq.path = d->ckpt_rel;
	sreq.global_step = d->sft_steps + d->ppo_steps;
	sreq.max_to_keep = 2;
	if (ec_save_checkpoint(d->c, &sreq, &sresp, &st))
		return ctl_fail("SaveCheckpoint", &st);
	printf("== saved checkpoint %s (%.1f MiB)\n", sresp->path,
	       (double)sresp->bytes / 1048576.0);
	ec_free(sresp);
	demo_check_file(d);
	return 0;
}

/* Reload the checkpoint and stream again: bit-identical to d->w1. */
static int demo_reload(struct demo *d)
{
	Engined__V1__LoadCheckpointRequest lreq = ENGINED__V1__LOAD_CHECKPOINT_REQUEST__INIT;
	Engined__V1__LoadCheckpointResponse *lresp = NULL;
	struct weights_copy w2;
	struct ec_status st;

	lreq.path = d->ckpt_rel;
	if (ec_load_checkpoint(d->c, &lreq, &lresp, &st))
		return ctl_fail("LoadCheckpoint", &st);
	printf("== reloaded %s at global step %lld\n", d->ckpt_rel,
	       (long long)lresp->global_step);
	ec_free(lresp);
	if (pull_all(d->c, &w2, &st))
		return ctl_fail("GetPerTensorParam", &st);
	for (size_t i = 0; i < d->w1.n && i < w2.n; i++)
		if (d->w1.len[i] != w2.len[i] || memcmp(d->w1.data[i], w2.data[i], d->w1.len[i]))
			d->mismatches++;
	if (d->w1.n != w2.n)
		d->mismatches++;
	printf("   weights after reload %s\n", d->mismatches ? "DIFFER" : "are bit-identical");
	weights_free(&d->w1);
	weights_free(&w2);
	return 0;
}

int ctl_demo(int argc, char **argv)
{
	struct demo d = { .seed = 1234, .n = N };
	int r;

	demo_parse(&d, argc, argv);
	r = demo_init(&d);
	if (!r)
		r = demo_sft(&d);
	if (!r)
		r = demo_sample(&d);
	if (!r)
		r = demo_rl(&d);
	if (!r)
		r = demo_save(&d);
	if (!r)
		r = demo_reload(&d);
	if (r)
		return r;
	ec_close(d.c);
	if (d.mismatches || !(d.last < d.first) || 2 * d.follow < d.sampled) {
		printf("== demo FAILED\n");
		return 1;
	}
	printf("== demo OK\n");
	return 0;
}
