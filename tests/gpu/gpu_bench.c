/* gpu_bench.c — training-step benchmark of the CUDA engine on the
 * Qwen2.5-0.5B and Qwen2.5-1.5B shapes, bf16 matmuls (fp32 master weights
 * and AdamW moments). Exits 77 without a GPU.
 *
 * Usage: gpu_bench [--model 0.5b|1.5b|both] [--seq S] [--tokens T]
 *                  [--steps N] [--layers L] [--vocab V]
 * Defaults: both models, sequences of 1024 tokens packed into micro-batches
 * of 16384 tokens, 5 timed steps after one warm-up. --layers / --vocab
 * shrink the model (smoke tests, dry runs on the CPU device).
 *
 * Shapes (random init, tied embeddings, qwen2 with q/k/v bias):
 *   0.5B: hidden 896, intermediate 4864, 24 layers, 14 / 2 heads (D 64)
 *   1.5B: hidden 1536, intermediate 8960, 28 layers, 12 / 2 heads (D 128)
 *   vocab 151936.
 * A step is forward_backward (mean SFT loss) + optimizer_step, in TRAIN
 * mode; the median step time is reported, and a forward-only log-prob pass
 * (EVAL) likewise.
 *
 * FLOPs, as tests/bench/bench_train.c counts them (model FLOPs):
 *   N_mm = parameters used in matmuls (tied embedding counted once, as the
 *          LM head); attn_fwd = 4 L H D sum_seq T(T+1)/2;
 *   step = 6 N_mm tokens + 3 attn_fwd;  forward = 2 N_mm tokens + attn_fwd.
 * MFU = step FLOPs / time / 989e12 (the H200's dense bf16 peak, the H100
 * SXM's: docs/PERF.md's goals are >= 50% for 0.5B and >= 57% for 1.5B).
 * Prints one human line per model and one JSON line per model (last).
 */
#include <getopt.h>

#include "gpu_test.h"

#define PEAK_FLOPS 989e12

struct shape {
	const char *name;
	int64_t hidden, inter, layers, heads, kv;
};

static const struct shape SHAPES[] = {
	{ "qwen2.5-0.5b", 896, 4864, 24, 14, 2 },
	{ "qwen2.5-1.5b", 1536, 8960, 28, 12, 2 },
};

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void set_mode(struct engine *e, enum engine_mode m)
{
	struct eng_error err = {0};

	if (engine_set_mode(e, m, false, &err)) {
		printf("FAIL: set_mode: %s\n", err.msg);
		exit(1);
	}
}

static void bench(const struct shape *s, int64_t seq, int64_t tokens, int steps,
		  int64_t layers, int64_t vocab)
{
	char json[1024];
	struct engine_init_config cfg;
	struct eng_error err = {0};
	struct engine *e = NULL;
	struct engine_status st;
	struct gt_batch b;
	int32_t lens[64];
	int32_t nseq = 0;
	int64_t L = layers > 0 ? layers : s->layers, D = s->hidden / s->heads, n_mm;
	double *t_step = gt_xmalloc(steps * sizeof(double));
	double *t_fwd = gt_xmalloc(steps * sizeof(double));
	double attn = 0, f_step, f_fwd, ms, mf, t0;

	snprintf(json, sizeof(json),
		 "{\"model_type\": \"qwen2\", \"vocab_size\": %lld, \"hidden_size\": %lld,"
		 " \"intermediate_size\": %lld, \"num_hidden_layers\": %lld,"
		 " \"num_attention_heads\": %lld, \"num_key_value_heads\": %lld,"
		 " \"rms_norm_eps\": 1e-6, \"rope_theta\": 1000000.0,"
		 " \"tie_word_embeddings\": true, \"max_position_embeddings\": 32768}",
		 (long long)vocab, (long long)s->hidden, (long long)s->inter, (long long)L,
		 (long long)s->heads, (long long)s->kv);
	for (int64_t left = tokens; left > 0 && nseq < 64; left -= seq)
		lens[nseq++] = (int32_t)(left < seq ? left : seq);
	gt_make_batch(&b, lens, nseq, vocab, 77);
	for (int32_t q = 0; q < nseq; q++)
		attn += 4.0 * L * s->heads * D * ((double)lens[q] * (lens[q] + 1) / 2);

	engine_init_config_defaults(&cfg);
	cfg.hf_config_json = json;
	cfg.device = gt_dev_name();
	cfg.seed = 1;
	cfg.optim.lr = 1e-5;
	cfg.bf16_matmul = true;
	cfg.max_tokens_per_micro_batch = b.n;
	t0 = gt_now();
	if (engine_create(&cfg, &e, &err)) {
		printf("FAIL: %s: engine_create: %s\n", s->name, err.msg);
		exit(1);
	}
	engine_status(e, &st);
	n_mm = st.num_parameters;   /* tied: the embedding is the LM head */
	f_step = 6.0 * n_mm * b.n + 3 * attn;
	f_fwd = 2.0 * n_mm * b.n + attn;
	printf("%s: %lld parameters, %d sequences x %lld = %lld tokens per step "
	       "(initialized in %.1f s)\n", s->name, (long long)n_mm, nseq, (long long)seq,
	       (long long)b.n, gt_now() - t0);
	fflush(stdout);

	set_mode(e, ENGINE_MODE_TRAIN);
	for (int i = -1; i < steps; i++) {
		double t = gt_now();

		gt_fb(e, &b, false, NULL);
		gt_step(e);   /* ends with a copy to the host: the GPU is idle */
		if (i >= 0)
			t_step[i] = gt_now() - t;
	}
	engine_status(e, &st);
	set_mode(e, ENGINE_MODE_EVAL);
	for (int i = -1; i < steps; i++) {
		double t = gt_now();

		gt_fb(e, &b, true, NULL);   /* log-probs copied back: synchronous */
		if (i >= 0)
			t_fwd[i] = gt_now() - t;
	}
	set_mode(e, ENGINE_MODE_IDLE);
	ms = median(t_step, steps);
	mf = median(t_fwd, steps);
	printf("%s: step %.1f ms, %.0f tokens/s, %.1f TFLOP/s, MFU %.1f%% | forward-only "
	       "%.1f ms, %.0f tokens/s, MFU %.1f%% | device memory %.1f GiB\n", s->name,
	       ms * 1e3, b.n / ms, f_step / ms / 1e12, 100 * f_step / ms / PEAK_FLOPS, mf * 1e3,
	       b.n / mf, 100 * f_fwd / mf / PEAK_FLOPS, st.device_memory / 1073741824.0);
	printf("{\"model\": \"%s\", \"tokens\": %lld, \"seq\": %lld, \"step_ms\": %.3f, "
	       "\"tokens_per_s\": %.1f, \"mfu\": %.4f, \"fwd_ms\": %.3f, \"fwd_mfu\": %.4f, "
	       "\"device_gib\": %.2f}\n", s->name, (long long)b.n, (long long)seq, ms * 1e3,
	       b.n / ms, f_step / ms / PEAK_FLOPS, mf * 1e3, f_fwd / mf / PEAK_FLOPS,
	       st.device_memory / 1073741824.0);
	fflush(stdout);
	engine_destroy(e);
	free(b.ids);
	free(t_step);
	free(t_fwd);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "model", required_argument, NULL, 'm' },
		{ "seq", required_argument, NULL, 's' },
		{ "tokens", required_argument, NULL, 't' },
		{ "steps", required_argument, NULL, 'n' },
		{ "layers", required_argument, NULL, 'l' },
		{ "vocab", required_argument, NULL, 'v' },
		{ NULL, 0, NULL, 0 },
	};
	const char *model = "both";
	int64_t seq = 1024, tokens = 16384, layers = 0, vocab = 151936;
	int steps = 5, c;

	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'm': model = optarg; break;
		case 's': seq = atoll(optarg); break;
		case 't': tokens = atoll(optarg); break;
		case 'n': steps = atoi(optarg); break;
		case 'l': layers = atoll(optarg); break;
		case 'v': vocab = atoll(optarg); break;
		default:
			fprintf(stderr, "usage: %s [--model 0.5b|1.5b|both] [--seq S] [--tokens T] "
				"[--steps N] [--layers L] [--vocab V]\n", argv[0]);
			return 2;
		}
	}
	if (seq <= 0 || tokens <= 0 || steps <= 0 || tokens / seq >= 64) {
		fprintf(stderr, "gpu_bench: need seq, tokens, steps > 0 and tokens / seq < 64\n");
		return 2;
	}
	gt_require_gpu("gpu_bench");
	if (!strcmp(model, "0.5b") || !strcmp(model, "both"))
		bench(&SHAPES[0], seq, tokens, steps, layers, vocab);
	if (!strcmp(model, "1.5b") || !strcmp(model, "both"))
		bench(&SHAPES[1], seq, tokens, steps, layers, vocab);
	return gt_finish("gpu_bench");
}
