/* bench_moe.c — a mixture-of-experts training step against the dense step
 * of the same active FLOPs, in one run (docs/PERF.md, issue 31).
 *
 * Dense: the `small` preset's shape (llama: hidden 512, intermediate 1408,
 * 8 layers, 8 heads / 4 kv heads, vocabulary 8192, tied). Experts: the same
 * with every MLP a mixtral router over E experts (default 16) of
 * intermediate 1408 / k (default top-2), so that a token's active MLP
 * parameters, and the model FLOPs per token, are the dense model's (plus
 * the router's E x 512 a layer, counted). The steps alternate between the
 * two (one warm-up each), the medians are compared as FLOP rates: active
 * FLOPs (6 N_active tokens + 3 x attention) over the step time. The goal
 * (issue 31): the experts' rate >= 0.7x the dense one.
 *
 * Usage: bench_moe [--steps N] [--tokens T] [--experts E] [--top-k K]
 *                  [--threads J]
 * Last line: JSON.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_engine.h"

#define HIDDEN 512
#define INTER 1408
#define LAYERS 8
#define VOCAB 8192
#define HEADS 8

struct opts {
	int steps, threads;
	int64_t tokens, experts, k;
};

static int parse(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {
		{ "steps", required_argument, NULL, 's' },
		{ "tokens", required_argument, NULL, 't' },
		{ "experts", required_argument, NULL, 'e' },
		{ "top-k", required_argument, NULL, 'k' },
		{ "threads", required_argument, NULL, 'j' },
		{ NULL, 0, NULL, 0 },
	};
	int c;

	*o = (struct opts){ .steps = 5, .threads = 2, .tokens = 2048, .experts = 16, .k = 2 };
	while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (c) {
		case 's': o->steps = atoi(optarg); break;
		case 't': o->tokens = atoll(optarg); break;
		case 'e': o->experts = atoll(optarg); break;
		case 'k': o->k = atoll(optarg); break;
		case 'j': o->threads = atoi(optarg); break;
		default: return -1;
		}
	}
	return o->steps < 1 || o->tokens < 2 || o->experts < 1 || o->k < 1 ||
	       o->k > o->experts || INTER % o->k ? -1 : 0;
}

int main(int argc, char **argv)
{
	static const char common[] =
		"\"vocab_size\": %d, \"hidden_size\": %d, \"num_hidden_layers\": %d,"
		" \"num_attention_heads\": %d, \"num_key_value_heads\": 4,"
		" \"max_position_embeddings\": 65536, \"rms_norm_eps\": 1e-06,"
		" \"rope_theta\": 10000.0, \"tie_word_embeddings\": true";
	char dense[1024], moe[1024], body[512];
	struct engine *d, *m;
	double *td, *tm, med_d, med_m, attn, n_d, n_m, f_d, f_m;
	uint64_t x = 0x9e3779b97f4a7c15ull;
	struct opts o;
	int32_t *ids;

	if (parse(argc, argv, &o)) {
		fprintf(stderr, "usage: %s [--steps N] [--tokens T] [--experts E] [--top-k K "
			"dividing %d] [--threads J]\n", argv[0], INTER);
		return 2;
	}
	snprintf(body, sizeof(body), common, VOCAB, HIDDEN, LAYERS, HEADS);
	snprintf(dense, sizeof(dense), "{\"model_type\": \"llama\", \"intermediate_size\": %d, %s}",
		 INTER, body);
	snprintf(moe, sizeof(moe), "{\"model_type\": \"mixtral\", \"intermediate_size\": %lld,"
		 " \"num_local_experts\": %lld, \"num_experts_per_tok\": %lld, %s}",
		 (long long)(INTER / o.k), (long long)o.experts, (long long)o.k, body);
	ids = malloc(o.tokens * sizeof(int32_t));
	td = calloc(o.steps, sizeof(double));
	tm = calloc(o.steps, sizeof(double));
	if (!ids || !td || !tm)
		return 1;
	for (int64_t i = 0; i < o.tokens; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		ids[i] = (int32_t)(x % VOCAB);
	}
	d = bench_engine("bench_moe", dense, o.threads, o.tokens, false);
	m = bench_engine("bench_moe", moe, o.threads, o.tokens, false);
	bench_train_step("bench_moe", d, o.tokens, ids);
	bench_train_step("bench_moe", m, o.tokens, ids);
	for (int s = 0; s < o.steps; s++) {
		td[s] = bench_train_step("bench_moe", d, o.tokens, ids);
		tm[s] = bench_train_step("bench_moe", m, o.tokens, ids);
	}
	med_d = median(td, o.steps);
	med_m = median(tm, o.steps);
	/* active matmul parameters a token: attention, MLP (or k experts and
	 * the router), the tied head */
	{
		double attn_p = 2.0 * HIDDEN * HIDDEN + 2.0 * HIDDEN * (HIDDEN / 2);

		n_d = LAYERS * (attn_p + 3.0 * HIDDEN * INTER) + (double)VOCAB * HIDDEN;
		n_m = LAYERS * (attn_p + 3.0 * HIDDEN * (INTER / o.k) * o.k +
				(double)o.experts * HIDDEN) + (double)VOCAB * HIDDEN;
	}
	attn = 4.0 * LAYERS * HIDDEN * (double)o.tokens * (o.tokens + 1) / 2.0;
	f_d = (6.0 * n_d * o.tokens + 3.0 * attn) / med_d;
	f_m = (6.0 * n_m * o.tokens + 3.0 * attn) / med_m;
	printf("dense step %.3f s (%.1f GFLOP/s), %lld experts top-%lld step %.3f s "
	       "(%.1f GFLOP/s of active FLOPs): %.3fx the dense rate (goal >= 0.7)\n",
	       med_d, f_d / 1e9, (long long)o.experts, (long long)o.k, med_m, f_m / 1e9,
	       f_m / f_d);
	printf("{\"bench\": \"moe_vs_dense_step\", \"tokens\": %lld, \"experts\": %lld, "
	       "\"top_k\": %lld, \"threads\": %d, \"dense_s\": %.4f, \"moe_s\": %.4f, "
	       "\"dense_gflops\": %.2f, \"moe_gflops\": %.2f, \"rate_ratio\": %.4f}\n",
	       (long long)o.tokens, (long long)o.experts, (long long)o.k, o.threads, med_d, med_m,
	       f_d / 1e9, f_m / 1e9, f_m / f_d);
	engine_destroy(d);
	engine_destroy(m);
	free(ids);
	free(td);
	free(tm);
	return 0;
}
