/* bench_optim.c — the CPU device's AdamW step on the Qwen2.5-0.5B shape's
 * parameter count, against the memory's limit for the same traffic,
 * measured in the same run.
 *
 * Usage: bench_optim [threads (default 2)] [parameters (default 494032768)]
 *
 * AdamW reads and writes p, grad (zeroed), m and v: 32 bytes a parameter.
 * The limit is a loop over the same four arrays with the same reads and
 * writes and almost no arithmetic (p += g, g = 0, m *= c, v *= c), on the
 * same threads. With bf16 matmuls the engine also needs the parameters'
 * bf16 copy after each step (2 more bytes written a parameter):
 *   separate: the AdamW pass, then the sweep the next product made before
 *             (read p again, write the copy: 6 bytes a parameter);
 *   fused:    AdamW rounds each chunk into the copy while it is in cache
 *             (what cpu_adamw does since the copy is refreshed in its pass).
 * Each is the median of 5 rounds, interleaved, after one warm-up (which
 * faults every page in). Prints the times, GB/s of the traffic each needs,
 * each against the limit, and separate / fused. The machines are shared:
 * compare ratios from one run, not times between runs.
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "device/device.h"
#include "bench_util.h"

#define ROUNDS 5

enum variant { LIMIT, FP32, SEPARATE, FUSED, NVARIANTS };

struct arrays {
	struct device *dev;
	float *p, *g, *m, *v;
	int64_t n;
	int64_t step;
};

/* The same reads and writes as AdamW, almost no arithmetic. */
static void limit_pass(struct arrays *a)
{
	float *p = a->p, *g = a->g, *m = a->m, *v = a->v;
	int64_t i;

#pragma omp parallel for simd schedule(static)
	for (i = 0; i < a->n; i++) {
		p[i] += g[i];
		g[i] = 0.0f;
		m[i] *= 0.999f;
		v[i] *= 0.999f;
	}
}

static int adamw(struct arrays *a)
{
	a->step++;
	return a->dev->k->adamw(a->dev, a->p, a->g, a->m, a->v, a->n, 1e-5, 0.9, 0.999, 1e-8,
				0.01, a->step, 1.0f);
}

/* A one-column product whose weight is the region's first row: the bf16
 * device rounds the whole region into its copy when the version moved. */
static int touch_copy(struct device *dev, const float *region, int64_t k)
{
	float x[16] = {0}, y[1];

	return dev->k->gemm(dev, false, true, 1, 1, k, x, k, region, k, 0.0f, y, 1);
}

static int run(struct arrays *a, enum variant w)
{
	struct device *dev = a->dev;

	switch (w) {
	case LIMIT:
		limit_pass(a);
		return 0;
	case FP32:
		dev->param_base = NULL;   /* no copy to refresh */
		dev->param_bytes = 0;
		return adamw(a);
	case SEPARATE:
	case FUSED:
		if (w == SEPARATE) {
			/* AdamW without the copy, then the next product's sweep */
			dev->param_base = NULL;
			dev->param_bytes = 0;
			if (adamw(a))
				return -1;
			dev->param_base = a->p;
			dev->param_bytes = (size_t)a->n * sizeof(float);
			dev->param_version++;
			return touch_copy(dev, a->p, 16);
		}
		dev->param_base = a->p;
		dev->param_bytes = (size_t)a->n * sizeof(float);
		dev->param_version++;
		if (adamw(a))
			return -1;
		return touch_copy(dev, a->p, 16);   /* current: no sweep */
	default:
		return -1;
	}
}

int main(int argc, char **argv)
{
	static const char *const names[NVARIANTS] = {
		"limit (same traffic, no math)", "AdamW fp32", "AdamW + separate bf16 sweep",
		"AdamW, bf16 copy fused",
	};
	/* bytes a parameter each variant must move */
	static const double bytes[NVARIANTS] = { 32, 32, 38, 34 };
	int threads = argc > 1 ? atoi(argv[1]) : 2;
	int64_t n = argc > 2 ? atoll(argv[2]) : 494032768;
	double t[NVARIANTS][ROUNDS], med[NVARIANTS];
	struct arrays a = { .n = n };
	size_t sz = (size_t)n * sizeof(float);

	if (threads <= 0 || n < 16) {
		fprintf(stderr, "usage: bench_optim [threads] [parameters >= 16]\n");
		return 2;
	}
	if (cpu_device_ops.open(&a.dev, threads, MATMUL_BF16)) {
		fprintf(stderr, "bench_optim: cannot open the CPU device\n");
		return 1;
	}
	a.p = a.dev->ops->alloc(a.dev, sz);
	a.g = a.dev->ops->alloc(a.dev, sz);
	a.m = a.dev->ops->alloc(a.dev, sz);
	a.v = a.dev->ops->alloc(a.dev, sz);
	if (!a.p || !a.g || !a.m || !a.v) {
		fprintf(stderr, "bench_optim: out of memory for 4 x %zu bytes\n", sz);
		return 1;
	}
	omp_set_num_threads(threads);
#pragma omp parallel for schedule(static)
	for (int64_t i = 0; i < n; i++) {
		a.p[i] = (float)(i % 97) * 0.01f - 0.5f;
		a.g[i] = 0.0f;
		a.m[i] = 0.0f;
		a.v[i] = 0.0f;
	}
	for (int w = 0; w < NVARIANTS; w++)
		if (run(&a, (enum variant)w)) {   /* warm-up: every page, the copy */
			fprintf(stderr, "bench_optim: %s failed\n", names[w]);
			return 1;
		}
	for (int r = 0; r < ROUNDS; r++)
		for (int w = 0; w < NVARIANTS; w++) {
			double t0;

			omp_set_num_threads(threads);
			t0 = now_s();
			if (run(&a, (enum variant)w))
				return 1;
			t[w][r] = now_s() - t0;
		}
	printf("threads %d, %lld parameters (%.2f GB of fp32 state a array)\n", threads,
	       (long long)n, sz / 1e9);
	printf("%-32s %9s %8s %9s %10s\n", "", "median s", "B/param", "GB/s", "vs limit");
	for (int w = 0; w < NVARIANTS; w++)
		med[w] = median(t[w], ROUNDS);
	for (int w = 0; w < NVARIANTS; w++)
		printf("%-32s %9.3f %8.0f %9.2f %9.2fx\n", names[w], med[w], bytes[w],
		       bytes[w] * (double)n / med[w] / 1e9, med[LIMIT] / med[w]);
	printf("separate / fused: %.2fx (the step with bf16 matmuls)\n", med[SEPARATE] / med[FUSED]);
	printf("{\"bench\": \"optim\", \"threads\": %d, \"n\": %lld, \"limit_s\": %.4f, "
	       "\"adamw_fp32_s\": %.4f, \"separate_s\": %.4f, \"fused_s\": %.4f}\n", threads,
	       (long long)n, med[LIMIT], med[FP32], med[SEPARATE], med[FUSED]);
	a.dev->ops->free(a.dev, a.p);
	a.dev->ops->free(a.dev, a.g);
	a.dev->ops->free(a.dev, a.m);
	a.dev->ops->free(a.dev, a.v);
	a.dev->ops->close(a.dev);
	return 0;
}
