/* bench_peak.h — the fp32 FMA peak of these cores, measured now: the limit
 * the training benchmarks are held to (docs/PERF.md); and the bf16
 * dot-product peak (AVX512_BF16's vdpbf16ps), the most any bf16 product can
 * gain over fp32 here. Header-only; the including program is built with
 * OpenMP. */
#ifndef ENGINED_BENCH_PEAK_H
#define ENGINED_BENCH_PEAK_H

#include <immintrin.h>
#include <stdio.h>

#include "bench_util.h"

typedef float bench_v16 __attribute__((vector_size(64)));

#define BENCH_PEAK_ITERS 20000000L

/* `threads` threads each running BENCH_PEAK_ITERS x 12 independent vector
 * FMAs (GCC vector extensions, so the widest registers -march allows, as
 * the kernels use); returns a value that depends on every FMA. */
static inline float bench_fma_run(int threads)
{
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
		for (long i = 0; i < BENCH_PEAK_ITERS; i++)
			for (int j = 0; j < 12; j++)
				a[j] = a[j] * b + c;
		for (int j = 1; j < 12; j++)
			a[0] += a[j];
		for (int j = 0; j < 16; j++)
			sink += a[0][j];
	}
	return sink;
}

/* One thread's part of the same on vdpbf16ps (16 fp32 lanes, each += two
 * bf16 products); the OpenMP region is outside it, in a function built
 * without the target attribute, so that the outlined region needs no
 * AVX-512 ABI (clang refuses it when -march lacks AVX-512). */
__attribute__((target("avx512f,avx512bf16")))
static float bench_dpbf16_chains(void)
{
	__m512 acc[12];
	__m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80);   /* 1.0 */
	__m512bh y = (__m512bh)_mm512_set1_epi16(0x3380);   /* 2^-24 */

	for (int j = 0; j < 12; j++)
		acc[j] = _mm512_set1_ps((float)j);
	for (long i = 0; i < BENCH_PEAK_ITERS; i++)
		for (int j = 0; j < 12; j++)
			acc[j] = _mm512_dpbf16_ps(acc[j], x, y);
	for (int j = 1; j < 12; j++)
		acc[0] = _mm512_add_ps(acc[0], acc[j]);
	return _mm512_reduce_add_ps(acc[0]);
}

static inline float bench_dpbf16_run(int threads)
{
	float sink = 0.0f;

#pragma omp parallel num_threads(threads) reduction(+:sink)
	sink += bench_dpbf16_chains();
	return sink;
}

/* GFLOP/s of run (flops_per_iter FLOPs per iteration and thread), best of
 * 5 runs of ~30 ms (one slow run is the machine, not the cores). */
static inline double bench_best_gflops(float (*run)(int threads), int threads,
				       double flops_per_iter)
{
	double best = 0.0;

	for (int rep = 0; rep < 5; rep++) {
		double t0 = now_s(), g;

		if (run(threads) == 12345.0f)
			printf(" ");
		g = flops_per_iter * BENCH_PEAK_ITERS * threads / (now_s() - t0) * 1e-9;
		if (g > best)
			best = g;
	}
	return best;
}

/* The fp32 FMA peak: 12 FMAs of 16 lanes, 2 FLOPs each, per iteration. */
static inline double bench_fma_peak(int threads)
{
	return bench_best_gflops(bench_fma_run, threads, 2.0 * 16 * 12);
}

/* The bf16 dot-product peak (64 FLOPs an instruction); 0 when the CPU
 * lacks AVX512_BF16. */
static inline double bench_bf16_peak(int threads)
{
	__builtin_cpu_init();
	return __builtin_cpu_supports("avx512bf16") ?
	       bench_best_gflops(bench_dpbf16_run, threads, 64.0 * 12) : 0.0;
}

#endif
