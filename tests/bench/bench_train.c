/* bench_train.c — training-step and forward-only benchmark of the native
 * CPU engine on the Qwen2.5-0.5B shape (docs/PERF.md).
 *
 * Usage: bench_train [--steps N] [--tokens T] [--seqs S] [--micro-batch-tokens M]
 *                    [--bf16] [--threads K] [--layers L] [--vocab V]
 *                    [--lm-tile F] [--recompute] [--one-step]
 *
 * Model: vocab 151936, hidden 896, intermediate 4864, 24 layers, 14 heads /
 * 2 kv heads (head_dim 64), qwen2 (q/k/v bias), tied embeddings, rope_theta
 * 1e6; random init from the engine's seeded initializer. --layers/--vocab
 * shrink it for smoke tests only. --lm-tile sets the engine's LM-head
 * logits tile (lm_tile_floats; 0 = its default), to compare tile sizes.
 *
 * Training step: engine_forward_backward on S sequences of T tokens each
 * (default 1), in micro-batches of at most M tokens (default T: one
 * sequence each; --seqs 8 --tokens 512 is a realistic RL step of 4096
 * tokens over 8 micro-batches) (loss: mean SFT, dL/dlogp = -1/(S T) for
 * every predicted token) + engine_optimizer_step
 * (AdamW, clip 1.0), in TRAIN mode. One warm-up step, then N timed steps;
 * the median is reported. Forward-only: engine_forward_backward with
 * forward_only in EVAL mode returning log-probs and entropy (verl's
 * compute_log_prob), one warm-up, N timed.
 *
 * FLOPs (model FLOPs, what the work requires, not what the engine executes):
 *   N_mm   = parameters used in matmuls: all parameters, minus the embedding
 *            when it is untied (a lookup); when tied it is counted once, as
 *            the LM head.
 *   attn_fwd = 4 * L * H * D * sum over sequences of T(T+1)/2
 *            (QK^T and PV, 2 FLOPs per multiply-add, causal: query t sees
 *            t+1 keys).
 *   training step = 6 * N_mm * tokens + 3 * attn_fwd
 *   forward only  = 2 * N_mm * tokens + attn_fwd
 * GFLOP/s = FLOPs / median time. Share of the peak: each timed step (and
 * forward pass) against the fp32 FMA peak (bench_peak.h) measured right
 * before and right after it, the higher of the two (the machines' speed
 * drifts by up to 20% within minutes, so a peak taken minutes earlier
 * misstates the share either way); the median of those shares is
 * reported. Peak RSS is getrusage's ru_maxrss of this
 * process (both phases; the training phase dominates).
 *
 * --recompute: activation recompute (ForwardBackwardRequest.
 * activation_recompute) against none in the same run, the training steps
 * alternating between them (each with its warm-up): the step time ratio
 * (recomputing / not) and each one's activation bytes (GetStatus's
 * Memory.activation_bytes, the arena the call reserved).
 *
 * --one-step: one training step and nothing else (no warm-up, no timed
 * steps, no forward-only phase), with activation recompute when
 * --recompute is given (the engine's default then): the long-sequence
 * check, e.g. --tokens 32768 --recompute --one-step is a 32k-token step of
 * the 0.5B shape, whose peak RSS shows whether it fits the host, and
 * --layers 1 / 2 without --recompute give one layer's activations at that
 * length (the difference) for the arithmetic of a whole model without it.
 * Prints the step's time, its activation bytes, the grad norm and the
 * peak RSS, and one JSON line.
 *
 * Prints a human-readable summary and one JSON line (the last line).
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "engine.h"
#include "bench_util.h"
#include "bench_peak.h"

struct opts {
	int steps;
	int64_t tokens;   /* per sequence */
	int seqs;
	int64_t mb_tokens;
	bool bf16;
	int threads;
	int layers;
	int64_t vocab;
	int64_t lm_tile;     /* the engine's lm_tile_floats (0: its default) */
	bool recompute;      /* alternate recompute on and off (above) */
	bool one_step;       /* one training step only (above) */
};

/* Mean SFT loss: dL/dlogp = -1/T at every predicted token. */
static int sft_loss(void *ctx, struct engine_loss_io *io, struct eng_error *err)
{
	const int64_t *total = ctx;
	int64_t i;
	int32_t s, off = 0;

	if (io->forward_only)
		return 0;
	for (i = 0; i < io->n; i++)
		io->d_log_probs[i] = -1.0f / (float)*total;
	/* the first token of each sequence has no prediction */
	for (s = 0; s < io->num_seqs; s++) {
		io->d_log_probs[off] = 0.0f;
		off += io->seq_lens[s];
	}
	return 0;
}

static void usage(const char *argv0)
{
	fprintf(stderr, "usage: %s [--steps N] [--tokens T] [--seqs S] [--micro-batch-tokens M] "
		"[--bf16] [--threads K] [--layers L] [--vocab V] [--lm-tile F] [--recompute] "
		"[--one-step]\n",
		argv0);
}

static int parse_opts(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {
		{ "steps", required_argument, NULL, 's' },
		{ "tokens", required_argument, NULL, 't' },
		{ "seqs", required_argument, NULL, 'S' },
		{ "micro-batch-tokens", required_argument, NULL, 'm' },
		{ "bf16", no_argument, NULL, 'b' },
		{ "threads", required_argument, NULL, 'j' },
		{ "layers", required_argument, NULL, 'l' },
		{ "vocab", required_argument, NULL, 'v' },
		{ "lm-tile", required_argument, NULL, 'T' },
		{ "recompute", no_argument, NULL, 'r' },
		{ "one-step", no_argument, NULL, 'o' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int c;

	*o = (struct opts){ .steps = 3, .tokens = 256, .seqs = 1, .threads = 2, .layers = 24,
			    .vocab = 151936 };
	while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (c) {
		case 's': o->steps = atoi(optarg); break;
		case 't': o->tokens = atoll(optarg); break;
		case 'S': o->seqs = atoi(optarg); break;
		case 'm': o->mb_tokens = atoll(optarg); break;
		case 'b': o->bf16 = true; break;
		case 'j': o->threads = atoi(optarg); break;
		case 'l': o->layers = atoi(optarg); break;
		case 'v': o->vocab = atoll(optarg); break;
		case 'T': o->lm_tile = atoll(optarg); break;
		case 'r': o->recompute = true; break;
		case 'o': o->one_step = true; break;
		default: return -1;
		}
	}
	if (optind != argc || o->steps < 1 || o->tokens < 2 || o->tokens > (1 << 24) ||
	    o->seqs < 1 || o->seqs > 4096 || o->layers < 1 || o->vocab < 2 || o->mb_tokens < 0 ||
	    o->lm_tile < 0)
		return -1;
	if (o->mb_tokens == 0)
		o->mb_tokens = o->tokens;
	return 0;
}

/* --recompute: training steps alternating without and with activation
 * recompute (a warm-up of each first); the medians, their ratio and each
 * one's activation bytes. */
static int recompute_compare(struct engine *e, struct engine_batch *b,
			     struct engine_fb_result *res, const struct opts *o, double flops,
			     struct eng_error *err)
{
	double t[2][64], med[2];
	size_t act[2] = {0, 0};
	int n = o->steps < 64 ? o->steps : 64;
	struct engine_step_result sr;
	struct engine_status st;

	for (int s = -2; s < 2 * n; s++) {
		int on = s & 1;
		double t0 = now_s();
		int rc;

		b->activation_recompute = on ? ENGINE_RECOMPUTE_ON : ENGINE_RECOMPUTE_OFF;
		rc = engine_forward_backward(e, b, res, err);
		if (!rc)
			rc = engine_optimizer_step(e, &sr, err);
		if (rc)
			return rc;
		engine_status(e, &st);
		act[on] = st.activation_bytes;
		if (s >= 0)
			t[on][s / 2] = now_s() - t0;
		fprintf(stderr, "recompute %s: %.3f s\n", on ? "on " : "off", now_s() - t0);
	}
	b->activation_recompute = ENGINE_RECOMPUTE_DEFAULT;
	med[0] = median(t[0], n);
	med[1] = median(t[1], n);
	printf("activation recompute: step %.3f s (%.1f GFLOP/s of model work) against %.3f s "
	       "without: %.3fx; activations %.1f MiB against %.1f MiB (%.3fx)\n", med[1],
	       flops / med[1] / 1e9, med[0], med[1] / med[0], act[1] / 1048576.0,
	       act[0] / 1048576.0, (double)act[1] / (double)act[0]);
	return 0;
}

/* --one-step: one training step (the engine's default says whether it
 * recomputes); its time, activation bytes, grad norm and the peak RSS. */
static int one_step(struct engine *e, struct engine_batch *b, struct engine_fb_result *res,
		    const struct opts *o, int64_t n_params, struct eng_error *err)
{
	struct engine_step_result sr;
	struct engine_status st;
	struct rusage ru;
	double t0 = now_s(), t1, t2;
	int rc = engine_set_mode(e, ENGINE_MODE_TRAIN, false, err);

	if (!rc)
		rc = engine_forward_backward(e, b, res, err);
	t1 = now_s();
	if (!rc)
		rc = engine_optimizer_step(e, &sr, err);
	t2 = now_s();
	if (rc)
		return rc;
	engine_status(e, &st);
	getrusage(RUSAGE_SELF, &ru);
	printf("one training step of %d x %lld tokens, %d layers, recompute %s: "
	       "forward_backward %.1f s, optimizer_step %.1f s, grad_norm %.6g; activations "
	       "%.1f MiB; peak RSS %.1f MiB (params+grads+Adam = %.1f MiB)\n", o->seqs,
	       (long long)o->tokens, o->layers, o->recompute ? "on" : "off", t1 - t0, t2 - t1,
	       sr.grad_norm, st.activation_bytes / 1048576.0, ru.ru_maxrss / 1024.0,
	       16.0 * (double)n_params / 1048576.0);
	printf("{\"bench\": \"engine_train_one_step\", \"tokens\": %lld, \"seqs\": %d,"
	       " \"layers\": %d, \"recompute\": %s, \"threads\": %d, \"fb_s\": %.3f,"
	       " \"opt_s\": %.3f, \"grad_norm\": %.9g, \"activation_bytes\": %zu,"
	       " \"peak_rss_mib\": %.1f, \"n_params\": %lld}\n", (long long)o->tokens, o->seqs,
	       o->layers, o->recompute ? "true" : "false", o->threads, t1 - t0, t2 - t1,
	       sr.grad_norm, st.activation_bytes, ru.ru_maxrss / 1024.0, (long long)n_params);
	return isfinite(sr.grad_norm) ? 0 : eng_fail(err, -EIO, "grad_norm %g", sr.grad_norm);
}

int main(int argc, char **argv)
{
	/* Qwen2.5-0.5B shape; layers/vocab filled in from the options. */
	static const char cfg_fmt[] =
		"{\"model_type\": \"qwen2\", \"architectures\": [\"Qwen2ForCausalLM\"],"
		" \"vocab_size\": %lld, \"hidden_size\": 896, \"intermediate_size\": 4864,"
		" \"num_hidden_layers\": %d, \"num_attention_heads\": 14,"
		" \"num_key_value_heads\": 2, \"max_position_embeddings\": 32768,"
		" \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0,"
		" \"tie_word_embeddings\": true, \"hidden_act\": \"silu\","
		" \"use_sliding_window\": false, \"initializer_range\": 0.02}";
	const int64_t H = 14, D = 64;
	struct opts o;
	struct eng_error err = { 0 };
	struct engine_init_config cfg;
	struct engine *e = NULL;
	struct engine_batch b = { 0 };
	struct engine_fb_result res = { 0 };
	struct engine_step_result sr;
	struct rusage ru;
	char hf[1024];
	int32_t *ids = NULL, *seq_lens = NULL;
	float *lp = NULL, *ent = NULL;
	double *t_train = NULL, *t_fwd = NULL, *t_fb = NULL, *t_opt = NULL;
	double *sh_train = NULL, *sh_fwd = NULL, peak0, med_sh_train, med_sh_fwd;
	double med_train, med_fwd, med_fb, med_opt, attn_fwd, n_mm;
	double f_train, f_fwd, rss_mib, state_mib;
	int64_t i, np, n_params = 0, total;
	uint64_t rng = 0x9e3779b97f4a7c15ull;
	int s, rc;

	if (parse_opts(argc, argv, &o)) {
		usage(argv[0]);
		return 2;
	}
	snprintf(hf, sizeof(hf), cfg_fmt, (long long)o.vocab, o.layers);
	engine_init_config_defaults(&cfg);
	cfg.model_type = "language_model";
	cfg.backend = "native";
	cfg.device = "cpu";
	cfg.hf_config_json = hf;
	cfg.seed = 1234;
	cfg.optim.lr = 1e-5;
	cfg.optim.clip_grad = 1.0;
	cfg.max_tokens_per_micro_batch = o.mb_tokens;
	cfg.threads = o.threads;
	cfg.bf16_matmul = o.bf16;
	cfg.lm_tile_floats = o.lm_tile;
	cfg.activation_recompute = o.one_step && o.recompute;

	total = o.tokens * o.seqs;
	ids = malloc((size_t)total * sizeof(*ids));
	seq_lens = malloc((size_t)o.seqs * sizeof(*seq_lens));
	lp = malloc((size_t)total * sizeof(*lp));
	ent = malloc((size_t)total * sizeof(*ent));
	t_train = calloc((size_t)o.steps, sizeof(*t_train));
	t_fwd = calloc((size_t)o.steps, sizeof(*t_fwd));
	t_fb = calloc((size_t)o.steps, sizeof(*t_fb));
	t_opt = calloc((size_t)o.steps, sizeof(*t_opt));
	sh_train = calloc((size_t)o.steps, sizeof(*sh_train));
	sh_fwd = calloc((size_t)o.steps, sizeof(*sh_fwd));
	if (!ids || !seq_lens || !lp || !ent || !t_train || !t_fwd || !t_fb || !t_opt ||
	    !sh_train || !sh_fwd) {
		fprintf(stderr, "bench_train: out of memory\n");
		rc = 1;
		goto out;
	}
	for (i = 0; i < o.seqs; i++)
		seq_lens[i] = (int32_t)o.tokens;
	for (i = 0; i < total; i++) {
		rng = rng * 6364136223846793005ull + 1442695040888963407ull;
		ids[i] = (int32_t)((rng >> 33) % (uint64_t)o.vocab);
	}

	rc = engine_create(&cfg, &e, &err);
	if (rc)
		goto fail;
	np = engine_num_params(e);
	for (i = 0; i < np; i++) {
		struct engine_param_view v;

		rc = engine_param(e, i, &v, &err);
		if (rc)
			goto fail;
		n_params += v.numel;
	}
	/* Tied: the embedding is the LM head and counts once. */
	n_mm = (double)n_params;
	attn_fwd = 4.0 * o.layers * H * D * o.seqs * ((double)o.tokens * (o.tokens + 1) / 2.0);
	f_train = 6.0 * n_mm * (double)total + 3.0 * attn_fwd;
	f_fwd = 2.0 * n_mm * (double)total + attn_fwd;

	b.n = total;
	b.input_ids = ids;
	b.num_seqs = o.seqs;
	b.seq_lens = seq_lens;
	b.temperature = 1.0f;
	b.loss_fn = sft_loss;
	b.loss_ctx = &b.n;
	res.log_probs = lp;
	res.entropy = ent;

	if (o.one_step) {
		rc = one_step(e, &b, &res, &o, n_params, &err);
		if (rc)
			goto fail;
		goto out;
	}
	rc = engine_set_mode(e, ENGINE_MODE_TRAIN, false, &err);
	if (rc)
		goto fail;
	for (s = -1; s < o.steps; s++) {
		double t0, t1;

		peak0 = s >= 0 ? bench_fma_peak(o.threads) : 0.0;
		t0 = now_s();
		rc = engine_forward_backward(e, &b, &res, &err);
		t1 = now_s();
		if (!rc)
			rc = engine_optimizer_step(e, &sr, &err);
		if (rc)
			goto fail;
		if (s >= 0) {
			t_train[s] = now_s() - t0;
			t_fb[s] = t1 - t0;
			t_opt[s] = now_s() - t1;
			sh_train[s] = f_train / t_train[s] / 1e9 /
				      fmax(peak0, bench_fma_peak(o.threads));
		}
		fprintf(stderr, "train step %d: %.3f s (forward_backward %.3f s in %d micro-batches, "
			"optimizer_step %.3f s), grad_norm %.4g\n", s + 1, now_s() - t0, t1 - t0,
			res.num_micro_batches, now_s() - t1, sr.grad_norm);
	}
	if (o.recompute) {
		rc = recompute_compare(e, &b, &res, &o, f_train, &err);
		if (rc)
			goto fail;
	}
	rc = engine_set_mode(e, ENGINE_MODE_EVAL, false, &err);
	if (rc)
		goto fail;
	b.forward_only = true;
	for (s = -1; s < o.steps; s++) {
		double t0;

		peak0 = s >= 0 ? bench_fma_peak(o.threads) : 0.0;
		t0 = now_s();
		rc = engine_forward_backward(e, &b, &res, &err);
		if (rc)
			goto fail;
		if (s >= 0) {
			t_fwd[s] = now_s() - t0;
			sh_fwd[s] = f_fwd / t_fwd[s] / 1e9 / fmax(peak0, bench_fma_peak(o.threads));
		}
	}
	med_train = median(t_train, o.steps);
	med_fwd = median(t_fwd, o.steps);
	med_fb = median(t_fb, o.steps);
	med_opt = median(t_opt, o.steps);
	med_sh_train = median(sh_train, o.steps);
	med_sh_fwd = median(sh_fwd, o.steps);
	getrusage(RUSAGE_SELF, &ru);
	rss_mib = (double)ru.ru_maxrss / 1024.0;
	state_mib = 16.0 * (double)n_params / (1024.0 * 1024.0);

	printf("engine %s, %lld parameters, %d x %lld tokens (micro-batches of <= %lld), "
	       "%d threads\n", o.bf16 ? "bf16 matmul" : "fp32", (long long)n_params, o.seqs,
	       (long long)o.tokens, (long long)o.mb_tokens, o.threads);
	printf("training step: median %.3f s, %.1f tokens/s, %.1f GFLOP/s\n",
	       med_train, (double)total / med_train, f_train / med_train / 1e9);
	printf("  of which forward_backward median %.3f s, optimizer_step median %.3f s\n",
	       med_fb, med_opt);
	printf("forward only : median %.3f s, %.1f tokens/s, %.1f GFLOP/s\n",
	       med_fwd, (double)total / med_fwd, f_fwd / med_fwd / 1e9);
	printf("share of the fp32 FMA peak measured around each step: training %.3f,"
	       " forward only %.3f (medians)\n", med_sh_train, med_sh_fwd);
	printf("peak RSS %.0f MiB (params+grads+Adam = %.0f MiB, ratio %.2f)\n",
	       rss_mib, state_mib, rss_mib / state_mib);
	printf("{\"bench\": \"engine_train\", \"dtype\": \"%s\", \"threads\": %d,"
	       " \"tokens\": %lld, \"seqs\": %d, \"steps\": %d, \"n_params\": %lld,"
	       " \"train_step_s_median\": %.6f, \"train_tokens_per_s\": %.3f,"
	       " \"train_gflops\": %.2f, \"train_fb_s_median\": %.6f,"
	       " \"train_opt_s_median\": %.6f, \"fwd_step_s_median\": %.6f,"
	       " \"fwd_tokens_per_s\": %.3f, \"fwd_gflops\": %.2f,"
	       " \"train_peak_share\": %.4f, \"fwd_peak_share\": %.4f,"
	       " \"peak_rss_mib\": %.1f, \"state_mib\": %.1f}\n",
	       o.bf16 ? "bf16" : "fp32", o.threads, (long long)o.tokens, o.seqs, o.steps,
	       (long long)n_params, med_train, (double)total / med_train,
	       f_train / med_train / 1e9, med_fb, med_opt, med_fwd, (double)total / med_fwd,
	       f_fwd / med_fwd / 1e9, med_sh_train, med_sh_fwd, rss_mib, state_mib);
	rc = 0;
	goto out;
fail:
	fprintf(stderr, "bench_train: %s (%s)\n", err.msg, eng_strerror(rc));
	rc = 1;
out:
	engine_destroy(e);
	free(ids);
	free(seq_lens);
	free(lp);
	free(ent);
	free(t_train);
	free(t_fwd);
	free(t_fb);
	free(t_opt);
	free(sh_train);
	free(sh_fwd);
	return rc;
}
