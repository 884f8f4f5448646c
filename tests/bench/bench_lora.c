/* bench_lora.c — LoRA against full fine-tuning on the Qwen2.5-0.5B shape,
 * in one run (docs/PERF.md, issue 27):
 *
 *  1. step time: a training step (forward_backward + optimizer_step, one
 *     sequence of T tokens, mean SFT gradients) of a rank-R all-linear
 *     adapter over a frozen base, against the full fine-tuning step of the
 *     same model; printed with the ratio of model FLOPs the two need (full:
 *     6 N tokens; LoRA: 4 N tokens for the base's forward and input
 *     gradients, plus 6 N_lora tokens for the adapter; attention 3x the
 *     forward's in both), so that "LoRA / full time" reads against "LoRA /
 *     full work";
 *  2. memory: the device memory one more adapter takes (engine_status,
 *     after it has trained once, so that its buffers exist) against its
 *     arithmetic, 16 bytes a parameter (weights, gradients, two moments)
 *     plus its scratch (2 R floats a token) and micro-batch buffers; and
 *     the frozen base's parameter memory against the full model's state;
 *  3. weight sync: the bytes and time of copying out the adapter alone
 *     (its view, bf16: what a rollout that holds the base needs) against
 *     the merged model (the full sync), each tensor through
 *     engine_param_copy as GetPerTensorParam reads it.
 *
 * Usage: bench_lora [--steps N] [--tokens T] [--rank R] [--threads K]
 *                   [--layers L] [--vocab V]
 * Medians of N timed steps after one warm-up. Last line: JSON.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_engine.h"

struct opts {
	int steps, threads, layers;
	int64_t tokens, rank, vocab;
};

static struct engine *adapter(struct engine *base, const char *name, int64_t rank)
{
	struct engine_adapter_config c = {.name = name, .rank = rank, .alpha = 2.0 * rank,
					  .targets = ENGINE_LORA_ALL_LINEAR, .seed = 7};
	struct eng_error err = {0};
	struct engine *a = NULL;

	if (engine_adapter_create(base, &c, &a, &err)) {
		fprintf(stderr, "bench_lora: %s\n", err.msg);
		exit(1);
	}
	return a;
}

/* Median seconds of a training step of e over N timed steps. */
static double step_time(struct engine *e, const struct opts *o, const int32_t *ids)
{
	struct eng_error err = {0};
	double *t = calloc(o->steps, sizeof(double)), med;

	if (!t || engine_set_mode(e, ENGINE_MODE_TRAIN, false, &err)) {
		fprintf(stderr, "bench_lora: step: %s\n", t ? err.msg : "out of memory");
		exit(1);
	}
	for (int s = -1; s < o->steps; s++) {
		double dt = bench_train_step("bench_lora", e, o->tokens, ids);

		if (s >= 0)
			t[s] = dt;
	}
	med = median(t, o->steps);
	free(t);
	return med;
}

/* Bytes and seconds to copy out every tensor of e's current view in bf16. */
static double copy_out(struct engine *e, int64_t *ret_bytes)
{
	struct engine_param_view v;
	struct eng_error err = {0};
	int64_t bytes = 0, cap = 0;
	uint16_t *buf = NULL;
	double t0 = now_s();

	for (int64_t i = 0; i < engine_num_params(e); i++) {
		if (engine_param_info(e, i, &v, &err))
			goto fail;
		if (v.numel > cap) {
			cap = v.numel;
			buf = realloc(buf, cap * sizeof(uint16_t));
		}
		if (engine_param_copy(e, i, ENGINE_DTYPE_BF16, 0, v.numel, buf, &err))
			goto fail;
		bytes += v.numel * 2;
	}
	free(buf);
	*ret_bytes = bytes;
	return now_s() - t0;
fail:
	fprintf(stderr, "bench_lora: copy: %s\n", err.msg);
	exit(1);
}

static int parse(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {
		{"steps", required_argument, NULL, 's'}, {"tokens", required_argument, NULL, 't'},
		{"rank", required_argument, NULL, 'r'}, {"threads", required_argument, NULL, 'j'},
		{"layers", required_argument, NULL, 'l'}, {"vocab", required_argument, NULL, 'v'},
		{NULL, 0, NULL, 0},
	};
	int c;

	*o = (struct opts){.steps = 3, .threads = 2, .layers = 24, .tokens = 512, .rank = 16,
			   .vocab = 151936};
	while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (c) {
		case 's': o->steps = atoi(optarg); break;
		case 't': o->tokens = atoll(optarg); break;
		case 'r': o->rank = atoll(optarg); break;
		case 'j': o->threads = atoi(optarg); break;
		case 'l': o->layers = atoi(optarg); break;
		case 'v': o->vocab = atoll(optarg); break;
		default: return -1;
		}
	}
	return optind == argc && o->steps >= 1 && o->tokens >= 2 && o->tokens <= (1 << 20) &&
	       o->rank >= 1 && o->layers >= 1 && o->vocab >= 2 ? 0 : -1;
}

int main(int argc, char **argv)
{
	static const char fmt[] =
		"{\"model_type\": \"qwen2\", \"vocab_size\": %lld, \"hidden_size\": 896,"
		" \"intermediate_size\": 4864, \"num_hidden_layers\": %d,"
		" \"num_attention_heads\": 14, \"num_key_value_heads\": 2,"
		" \"max_position_embeddings\": 32768, \"rms_norm_eps\": 1e-06,"
		" \"rope_theta\": 1000000.0, \"tie_word_embeddings\": true}";
	struct engine_status sf, sb, s1, s2, sa;
	struct engine *full, *base, *a, *b;
	struct eng_error err = {0};
	int64_t n_mm, n_all, n_lora, bytes_a, bytes_m;
	double t_full, t_lora, attn, w_full, w_lora, mem_extra, mem_arith, c_a, c_m;
	uint64_t x = 0x9e3779b97f4a7c15ull;
	struct opts o;
	char hf[1024];
	int32_t *ids;

	if (parse(argc, argv, &o)) {
		fprintf(stderr, "usage: %s [--steps N] [--tokens T] [--rank R] [--threads K] "
			"[--layers L] [--vocab V]\n", argv[0]);
		return 2;
	}
	snprintf(hf, sizeof(hf), fmt, (long long)o.vocab, o.layers);
	ids = malloc(o.tokens * sizeof(int32_t));
	for (int64_t i = 0; i < o.tokens; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		ids[i] = (int32_t)(x % (uint64_t)o.vocab);
	}

	full = bench_engine("bench_lora", hf, o.threads, o.tokens, false);
	engine_status(full, &sf);
	n_all = sf.num_parameters;
	t_full = step_time(full, &o, ids);
	engine_status(full, &sf);
	engine_destroy(full);

	base = bench_engine("bench_lora", hf, o.threads, o.tokens, true);
	engine_status(base, &sb);
	a = adapter(base, "a", o.rank);
	t_lora = step_time(a, &o, ids);
	engine_status(a, &sa);
	n_lora = sa.num_parameters;
	engine_status(a, &s1);
	b = adapter(base, "b", o.rank);
	(void)step_time(b, &(struct opts){.steps = 1, .tokens = o.tokens}, ids);
	engine_status(b, &s2);
	mem_extra = (double)s2.device_memory - (double)s1.device_memory;
	/* weights, gradients, two moments; scratch 2 R floats a token; the
	 * micro-batch buffers (ids, pos, targets: 3 int32, rows and their
	 * gradients: 6 floats a token) */
	mem_arith = 16.0 * n_lora + 4.0 * (2 * o.rank + 9) * o.tokens;

	if (engine_adapter_set_view(a, ENGINE_ADAPTER_VIEW_ADAPTER, &err))
		return fprintf(stderr, "bench_lora: %s\n", err.msg), 1;
	c_a = copy_out(a, &bytes_a);
	if (engine_adapter_set_view(a, ENGINE_ADAPTER_VIEW_MERGED, &err))
		return fprintf(stderr, "bench_lora: %s\n", err.msg), 1;
	c_m = copy_out(a, &bytes_m);

	/* model FLOPs: matmul parameters (tied embedding counted once, as the
	 * head), attention 4 L H D T(T+1)/2 forward */
	n_mm = n_all;
	attn = 4.0 * o.layers * 14 * 64 * (double)o.tokens * (o.tokens + 1) / 2;
	w_full = 6.0 * n_mm * o.tokens + 3 * attn;
	w_lora = 4.0 * n_mm * o.tokens + 6.0 * n_lora * o.tokens + 3 * attn;

	printf("shape: 0.5B (%d layers, vocab %lld), %lld tokens, rank %lld all-linear, "
	       "%d threads\n", o.layers, (long long)o.vocab, (long long)o.tokens,
	       (long long)o.rank, o.threads);
	printf("step: full %.3f s, LoRA %.3f s: LoRA / full %.3f (model FLOPs %.3f)\n", t_full,
	       t_lora, t_lora / t_full, w_lora / w_full);
	printf("adapter: %lld parameters (%.3f%% of %lld); one more adapter takes %.2f MiB of "
	       "memory, its arithmetic %.2f MiB: %.3fx\n", (long long)n_lora,
	       100.0 * n_lora / n_all, (long long)n_all, mem_extra / (1 << 20),
	       mem_arith / (1 << 20), mem_extra / mem_arith);
	printf("state: frozen base %.1f MiB (parameters only) vs full model %.1f MiB after a "
	       "step: %.3fx\n", sb.device_memory / 1048576.0, sf.device_memory / 1048576.0,
	       (double)sb.device_memory / sf.device_memory);
	printf("sync (bf16 copy-out): adapter %.2f MiB in %.4f s, merged model %.1f MiB in %.3f "
	       "s: bytes %.4f, time %.4f\n", bytes_a / 1048576.0, c_a, bytes_m / 1048576.0, c_m,
	       (double)bytes_a / bytes_m, c_a / c_m);
	printf("{\"bench\": \"lora\", \"tokens\": %lld, \"rank\": %lld, \"layers\": %d, "
	       "\"full_step_s\": %.4f, \"lora_step_s\": %.4f, \"time_ratio\": %.4f, "
	       "\"flop_ratio\": %.4f, \"adapter_params\": %lld, \"extra_adapter_bytes\": %.0f, "
	       "\"extra_adapter_arith_bytes\": %.0f, \"frozen_base_bytes\": %zu, "
	       "\"full_bytes\": %zu, \"sync_adapter_bytes\": %lld, \"sync_merged_bytes\": %lld, "
	       "\"sync_adapter_s\": %.5f, \"sync_merged_s\": %.5f}\n",
	       (long long)o.tokens, (long long)o.rank, o.layers, t_full, t_lora, t_lora / t_full,
	       w_lora / w_full, (long long)n_lora, mem_extra, mem_arith, sb.device_memory,
	       sf.device_memory, (long long)bytes_a, (long long)bytes_m, c_a, c_m);
	engine_destroy(a);
	engine_destroy(b);
	engine_destroy(base);
	free(ids);
	return 0;
}
