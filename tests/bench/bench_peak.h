/* bench_peak.h — the fp32 FMA peak of these cores, measured now: the limit
 * the training benchmarks are held to (docs/PERF.md). Header-only; the
 * including program is built with OpenMP. */
#ifndef ENGINED_BENCH_PEAK_H
#define ENGINED_BENCH_PEAK_H

#include <stdio.h>

#include "bench_util.h"

typedef float bench_v16 __attribute__((vector_size(64)));

/* GFLOP/s of `threads` threads each running independent vector FMAs (GCC
 * vector extensions, so the widest registers -march allows, as the
 * kernels use), best of 3 runs of ~30 ms. */
static inline double bench_fma_peak(int threads)
{
	const long iters = 20000000;
	double best = 0.0;

	for (int rep = 0; rep < 3; rep++) {
		double t0 = now_s(), t, g;
		float sink = 0.0f;

#pragma omp parallel num_threads(threads) reduction(+:sink)
		{
			bench_v16 a[12], b, c;

			for (int j = 0; j < 12; j++)
				a[j] = (bench_v16){ 0 } + (float)j;
			b = (bench_v16){ 0 } + 0.999999f;
			c = (bench_v16){ 0 } + 1e-7f;
			/* 12 independent chains cover the FMA latency; without
			 * -ffast-math the compiler must issue every FMA */
			for (long i = 0; i < iters; i++)
				for (int j = 0; j < 12; j++)
					a[j] = a[j] * b + c;
			for (int j = 1; j < 12; j++)
				a[0] += a[j];
			for (int j = 0; j < 16; j++)
				sink += a[0][j];
		}
		t = now_s() - t0;
		if (sink == 12345.0f)
			printf(" ");
		g = 2.0 * 16 * 12 * iters * threads / t * 1e-9;
		if (g > best)
			best = g;
	}
	return best;
}

#endif
