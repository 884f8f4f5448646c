/* bench_peak.h — the fp32 FMA peak of these cores, measured now: the limit
 * the training benchmarks are held to (docs/PERF.md); and the bf16
 * dot-product peak (AVX512_BF16's vdpbf16ps), the most any bf16 product can
 * gain over fp32 here. Header-only; the including program is built with
 * OpenMP.
 *
 * The fp32 peak is that of the widest FMA the CPU has (AVX-512: 16 lanes,
 * AVX2 with FMA: 8, else SSE's 4 lanes of a multiply and an add), chosen at
 * run time whatever -march built the program, and capped as oneDNN is by
 * ONEDNN_MAX_CPU_ISA (AVX2 or below: at most 8 lanes), so that a run capped
 * to AVX2 is held to the limit of the kernels it runs. */
#ifndef ENGINED_BENCH_PEAK_H
#define ENGINED_BENCH_PEAK_H

#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "bench_util.h"

#define BENCH_PEAK_ITERS 20000000L

/* One thread's BENCH_PEAK_ITERS x 12 independent vector FMAs of `lanes`
 * fp32 lanes (GCC vector extensions in a function built for `isa`); returns
 * a value that depends on every FMA. 12 chains cover the FMA latency and
 * fit the 16 registers of AVX2; without -ffast-math the compiler must
 * issue every FMA. The OpenMP region is outside (bench_fma_run): an
 * outlined region in a target function would need the target's ABI. */
#define BENCH_FMA_CHAINS(fn, isa, lanes)                                         \
	__attribute__((target(isa))) static float fn(void)                      \
	{                                                                       \
		typedef float v __attribute__((vector_size(4 * (lanes))));        \
		v a[12], b = (v){ 0 } + 0.999999f, c = (v){ 0 } + 1e-7f;          \
		float sum = 0.0f;                                                 \
		for (int j = 0; j < 12; j++)                                      \
			a[j] = (v){ 0 } + (float)j;                               \
		for (long i = 0; i < BENCH_PEAK_ITERS; i++)                       \
			for (int j = 0; j < 12; j++)                              \
				a[j] = a[j] * b + c;                              \
		for (int j = 1; j < 12; j++)                                      \
			a[0] += a[j];                                             \
		for (int j = 0; j < (lanes); j++)                                 \
			sum += a[0][j];                                           \
		return sum;                                                       \
	}

BENCH_FMA_CHAINS(bench_fma_chains16, "avx512f,fma", 16)
BENCH_FMA_CHAINS(bench_fma_chains8, "avx2,fma", 8)
BENCH_FMA_CHAINS(bench_fma_chains4, "sse2", 4)

/* The fp32 lanes of the FMA the peak is measured on (see the header). */
static inline int bench_fma_lanes(void)
{
	const char *cap = getenv("ONEDNN_MAX_CPU_ISA");
	bool capped = cap && (!strcasecmp(cap, "AVX2") || !strcasecmp(cap, "AVX2_VNNI") ||
			      !strcasecmp(cap, "AVX") || !strcasecmp(cap, "SSE41"));

	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx512f") && !capped)
		return 16;
	if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
	    !(cap && (!strcasecmp(cap, "AVX") || !strcasecmp(cap, "SSE41"))))
		return 8;
	return 4;
}

/* What bench_fma_peak measures, for the benchmarks' first line. */
static inline const char *bench_fma_name(void)
{
	int lanes = bench_fma_lanes();

	return lanes == 16 ? "AVX-512 FMA" : lanes == 8 ? "AVX2 FMA" : "SSE multiply-add";
}

static inline float bench_fma_run(int threads)
{
	const int lanes = bench_fma_lanes();
	float sink = 0.0f;

#pragma omp parallel num_threads(threads) reduction(+:sink)
	sink += lanes == 16 ? bench_fma_chains16() :
		lanes == 8 ? bench_fma_chains8() : bench_fma_chains4();
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

/* The fp32 FMA peak: 12 FMAs of bench_fma_lanes() lanes, 2 FLOPs each,
 * per iteration. */
static inline double bench_fma_peak(int threads)
{
	return bench_best_gflops(bench_fma_run, threads, 2.0 * bench_fma_lanes() * 12);
}

/* The bf16 dot-product peak (64 FLOPs an instruction); 0 when the CPU
 * lacks AVX512_BF16 or the run is capped below AVX-512. */
static inline double bench_bf16_peak(int threads)
{
	__builtin_cpu_init();
	return __builtin_cpu_supports("avx512bf16") && bench_fma_lanes() == 16 ?
	       bench_best_gflops(bench_dpbf16_run, threads, 64.0 * 12) : 0.0;
}

#endif
