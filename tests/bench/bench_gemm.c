/* bench_gemm.c — GFLOP/s of the CPU device's gemm (fp32 and bf16) on the
 * Qwen2.5-0.5B shapes of one 256-token micro-batch, against the fp32 FMA
 * peak of the same cores measured in the same run.
 *
 * Usage: bench_gemm [threads (default 2)] [tokens (default 256)]
 *
 * The peak is bench_peak.h's loop of independent vector FMAs. Each shape is timed as the median of 3 runs after one warm-up
 * (which also builds the cached oneDNN primitive). The "sgemm" column is
 * oneDNN's dnnl_sgemm on the same fp32 operands, the alternative the
 * device's matmul-primitive path was chosen over. The machines are shared
 * and noisy: compare ratios from one run, not times between runs.
 *
 * The calls are the engine's (engines/model/llama.c): a weight operand (B
 * of the forward x W^T and the input gradient dy W) lies in the device's
 * parameter region, so in bf16 it is rounded once (param_bf16) and not per
 * call, while activations are rounded per call; weight gradients
 * accumulate (beta 1: dW += dy^T x); the LM head runs in its logits tiles
 * (2M floats: T rows x 8192 vocabulary columns at T = 256), the last
 * tile of the vocabulary narrower.
 */
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "device/device.h"
#include "bench_util.h"
#include "bench_peak.h"

#define REPS 3


struct shape {
	const char *name;
	bool ta, tb;
	int64_t M, N, K;
	bool weight_b;   /* B is a parameter (rounded to bf16 once) */
	float beta;      /* 1: a weight gradient accumulates */
	int reps;        /* calls per timing: the LM head's tiles */
};

/* Median seconds of one gemm (device kernel, or dnnl_sgemm when dev is
 * NULL), or a negative value on failure. */
static double time_gemm(struct device *dev, const struct shape *s, const float *A,
			const float *B, float *C)
{
	int64_t lda = s->ta ? s->M : s->K, ldb = s->tb ? s->K : s->N;
	double t[REPS + 1];
	int r;

	for (r = 0; r <= REPS; r++) {
		double t0 = now_s();
		int rc;

		rc = 0;
		for (int k = 0; k < s->reps && rc == 0; k++) {
			if (dev)
				rc = dev->k->gemm(dev, s->ta, s->tb, s->M, s->N, s->K, A, lda,
						  B, ldb, s->beta, C, s->N);
			else
				rc = dnnl_sgemm(s->ta ? 'T' : 'N', s->tb ? 'T' : 'N', s->M,
						s->N, s->K, 1.0f, A, lda, B, ldb, s->beta, C,
						s->N) == dnnl_success ? 0 : -1;
		}
		if (rc)
			return -1.0;
		t[r] = now_s() - t0;
	}
	qsort(t + 1, REPS, sizeof(double), cmp_double);   /* drop the warm-up */
	return t[1 + REPS / 2];
}

int main(int argc, char **argv)
{
	const int threads = argc > 1 ? atoi(argv[1]) : 2;
	const int64_t T = argc > 2 ? atoll(argv[2]) : 256;
	const int64_t C = 896, F = 4864, QKV = 896 + 2 * 128, V = 151936;
	/* The LM head's logits tile (llama.c lm_rows / lm_cols, 2M floats):
	 * T rows (up to 1024) x Vt columns, V / Vt tiles of it (rounded up to
	 * whole tiles: an upper bound on the time of the narrower last one). */
	const int64_t lm_rows = T < 1024 ? T : 1024, lm_fit = (2 << 20) / lm_rows;
	const int64_t Vt = lm_fit < V ? lm_fit : V;
	const int nt = (int)((V + Vt - 1) / Vt);
	/* y = x W^T (forward), dx = dy W, dW += dy^T x (backward) */
	const struct shape shapes[] = {
		{ "qkv fwd   x W^T", false, true, T, QKV, C, true, 0.0f, 1 },
		{ "o fwd     x W^T", false, true, T, C, C, true, 0.0f, 1 },
		{ "gate/up   x W^T", false, true, T, F, C, true, 0.0f, 1 },
		{ "down fwd  x W^T", false, true, T, C, F, true, 0.0f, 1 },
		{ "down dx   dy W ", false, false, T, F, C, true, 0.0f, 1 },
		{ "up dx     dy W ", false, false, T, C, F, true, 0.0f, 1 },
		{ "up dW     dy^T x", true, false, F, C, T, false, 1.0f, 1 },
		{ "down dW   dy^T x", true, false, C, F, T, false, 1.0f, 1 },
		{ "lm_head   x W^T", false, true, T, Vt, C, true, 0.0f, nt },
		{ "lm dx     dy W ", false, false, T, C, Vt, true, 1.0f, nt },
		{ "lm dW     dy^T x", true, false, Vt, C, T, false, 1.0f, nt },
	};
	const size_t nshapes = sizeof(shapes) / sizeof(shapes[0]);
	struct device *dev32 = NULL, *dev16 = NULL;
	double peak, peak16, flops_all = 0, t32_all = 0, t16_all = 0, tsg_all = 0;
	size_t i, maxa = 0, maxb = 0, maxc = 0;
	float *A, *B, *Cm;

	if (threads <= 0 || T <= 0) {
		fprintf(stderr, "usage: bench_gemm [threads] [tokens]\n");
		return 2;
	}
	if (cpu_device_ops.open(&dev32, threads, MATMUL_FP32) ||
	    cpu_device_ops.open(&dev16, threads, MATMUL_BF16)) {
		fprintf(stderr, "bench_gemm: cannot open the CPU device\n");
		return 1;
	}
	for (i = 0; i < nshapes; i++) {
		size_t a = (size_t)(shapes[i].M * shapes[i].K);
		size_t b = (size_t)(shapes[i].K * shapes[i].N);
		size_t c = (size_t)(shapes[i].M * shapes[i].N);

		maxa = a > maxa ? a : maxa;
		maxb = b > maxb ? b : maxb;
		maxc = c > maxc ? c : maxc;
	}
	A = dev32->ops->alloc(dev32, maxa * sizeof(float));
	B = dev32->ops->alloc(dev32, maxb * sizeof(float));
	Cm = dev32->ops->alloc(dev32, maxc * sizeof(float));
	if (!A || !B || !Cm) {
		fprintf(stderr, "bench_gemm: out of memory\n");
		return 1;
	}
	for (i = 0; i < maxa; i++)
		A[i] = (float)(i % 97) * 0.01f - 0.5f;
	for (i = 0; i < maxb; i++)
		B[i] = (float)(i % 89) * 0.01f - 0.45f;
	memset(Cm, 0, maxc * sizeof(float));

	omp_set_num_threads(threads);
	peak = bench_fma_peak(threads);
	printf("threads %d, tokens %ld; fp32 FMA peak measured now: %.1f GFLOP/s (%s)\n",
	       threads, (long)T, peak, bench_fma_name());
	peak16 = bench_bf16_peak(threads);
	printf("bf16 dot-product peak (vdpbf16ps) measured now: %.1f GFLOP/s = %.2fx the fp32"
	       " peak%s\n", peak16, peak16 / peak, peak16 > 0 ? "" : " (no AVX512_BF16)");
	printf("products: fp32 %s; bf16 %s\n", dev32->matmul, dev16->matmul);
	printf("LM head in %d tiles of %ld vocabulary columns\n", nt, (long)Vt);
	printf("%-18s %6s %6s %7s   %8s %8s %8s   %6s %6s\n", "shape", "M", "N", "K",
	       "fp32", "bf16", "sgemm", "fp32/pk", "bf16/pk");
	for (i = 0; i < nshapes; i++) {
		const struct shape *s = &shapes[i];
		double fl = 2.0 * s->M * s->N * s->K * s->reps;
		double t32, t16;

		/* Weights in the parameter region (their bf16 copy made once,
		 * by the warm-up run), activations outside it. */
		dev16->param_base = s->weight_b ? B : NULL;
		dev16->param_bytes = s->weight_b ? maxb * sizeof(float) : 0;
		dev16->param_version = 1;
		t32 = time_gemm(dev32, s, A, B, Cm);
		t16 = time_gemm(dev16, s, A, B, Cm);
		double tsg;

		omp_set_num_threads(threads);
		tsg = time_gemm(NULL, s, A, B, Cm);
		if (t32 < 0 || t16 < 0 || tsg < 0) {
			fprintf(stderr, "bench_gemm: gemm failed on %s\n", s->name);
			return 1;
		}
		flops_all += fl;
		t32_all += t32;
		t16_all += t16;
		tsg_all += tsg;
		printf("%-18s %6ld %6ld %7ld   %8.1f %8.1f %8.1f   %6.2f %6.2f\n", s->name,
		       (long)s->M, (long)s->N, (long)s->K, fl / t32 * 1e-9, fl / t16 * 1e-9,
		       fl / tsg * 1e-9, fl / t32 * 1e-9 / peak, fl / t16 * 1e-9 / peak);
	}
	printf("%-18s %6s %6s %7s   %8.1f %8.1f %8.1f   %6.2f %6.2f\n", "all (time-weighted)",
	       "", "", "", flops_all / t32_all * 1e-9, flops_all / t16_all * 1e-9,
	       flops_all / tsg_all * 1e-9, flops_all / t32_all * 1e-9 / peak,
	       flops_all / t16_all * 1e-9 / peak);
	dev32->ops->free(dev32, A);
	dev32->ops->free(dev32, B);
	dev32->ops->free(dev32, Cm);
	cpu_device_ops.close(dev32);
	cpu_device_ops.close(dev16);
	return 0;
}
