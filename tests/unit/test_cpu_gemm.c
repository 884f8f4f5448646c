/* test_cpu_gemm.c — the device table, CPU device memory, and the CPU gemm
 * (fp32 and bf16) against a naive double-precision product; the grouped
 * product (the experts' projections) against a gemm per group, bit for
 * bit, and the double product. */
#include <check.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "device/device.h"
#include "cpu_test_util.h"

START_TEST(device_table)
{
	const struct device_ops *ops = device_find("cpu");
	struct device *dev = NULL;

	ck_assert_ptr_eq(ops, &cpu_device_ops);
	ck_assert_str_eq(ops->name, "cpu");
	ck_assert_ptr_null(device_find("tpu"));
	ck_assert_ptr_null(device_find(NULL));
	ck_assert_ptr_nonnull(strstr(device_names(), "cpu"));
	ck_assert_int_eq(ops->open(&dev, 1, (enum matmul_precision)7), -EINVAL);
	ck_assert_ptr_null(dev);
	unsetenv("ENGINED_CPU_DISCRETE");
	ck_assert_int_eq(ops->open(&dev, 1, MATMUL_FP32), 0);
	ck_assert(dev->host_memory);
	ops->close(dev);
	setenv("ENGINED_CPU_DISCRETE", "1", 1);
	ck_assert_int_eq(ops->open(&dev, 1, MATMUL_FP32), 0);
	ck_assert(!dev->host_memory);
	ops->close(dev);
	unsetenv("ENGINED_CPU_DISCRETE");
	ops->close(NULL);
}
END_TEST

START_TEST(memory_accounting)
{
	struct device *dev = tu_open(2, MATMUL_FP32);
	const struct device_ops *o = dev->ops;
	char host[1000], back[1000];
	char *a, *b, *c;
	int i;

	ck_assert_ptr_eq(dev->ops, &cpu_device_ops);
	ck_assert_ptr_nonnull(dev->k->gemm);
	ck_assert_uint_eq(o->mem_in_use(dev), 0);
	a = o->alloc(dev, 1000);
	b = o->alloc(dev, 24);
	c = o->alloc(dev, 0);
	ck_assert_ptr_nonnull(a);
	ck_assert_ptr_nonnull(b);
	ck_assert_ptr_nonnull(c);
	ck_assert_uint_eq((uintptr_t)a % 64, 0);
	ck_assert_uint_eq((uintptr_t)b % 64, 0);
	ck_assert_uint_eq(o->mem_in_use(dev), 1024);
	for (i = 0; i < 1000; i++)
		host[i] = (char)(i * 7);
	ck_assert_int_eq(o->copy_h2d(dev, a, host, 1000), 0);
	ck_assert_int_eq(o->memset0(dev, b, 24), 0);
	ck_assert_int_eq(o->copy_d2d(dev, b, a + 10, 20), 0);
	ck_assert_int_eq(o->copy_d2h(dev, back, a, 1000), 0);
	ck_assert_mem_eq(back, host, 1000);
	ck_assert_mem_eq(b, host + 10, 20);
	ck_assert_int_eq(b[20] | b[21] | b[22] | b[23], 0);
	ck_assert_int_eq(o->sync(dev), 0);
	o->free(dev, a);
	ck_assert_uint_eq(o->mem_in_use(dev), 24);
	o->free(dev, b);
	o->free(dev, c);
	o->free(dev, NULL);
	ck_assert_uint_eq(o->mem_in_use(dev), 0);
	ck_assert_ptr_null(o->alloc(dev, SIZE_MAX - 16));
	ck_assert_uint_eq(o->mem_in_use(dev), 0);
	tu_close(dev);
}
END_TEST

/* Independent bf16 rounding for the reference: the nearer of the two bf16
 * neighbours by distance in double, ties to the even one. */
static double ref_bf16(float x)
{
	uint32_t u, lo_b, hi_b;
	float lo, hi;
	double dl, dh;

	memcpy(&u, &x, 4);
	lo_b = u & 0xffff0000u;
	hi_b = lo_b + 0x10000u;
	memcpy(&lo, &lo_b, 4);
	memcpy(&hi, &hi_b, 4);
	dl = fabs((double)x - lo);
	dh = fabs((double)hi - x);
	if (dl < dh)
		return lo;
	if (dh < dl)
		return hi;
	return (lo_b >> 16) & 1 ? hi : lo;
}

/* C = op(A) op(B) + beta C in double; A, B possibly rounded to bf16 first.
 * Also returns in absC[M*N] the sums of |a||b| (error scale). */
static void ref_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K,
		     const float *A, int64_t lda, const float *B, int64_t ldb,
		     float beta, const float *C0, int64_t ldc, bool bf16,
		     double *out, double *absC)
{
	int64_t i, j, k;

	for (i = 0; i < M; i++) {
		for (j = 0; j < N; j++) {
			double s = 0.0, sa = 0.0;

			for (k = 0; k < K; k++) {
				float a = ta ? A[k * lda + i] : A[i * lda + k];
				float b = tb ? B[j * ldb + k] : B[k * ldb + j];
				double da = bf16 ? ref_bf16(a) : a;
				double db = bf16 ? ref_bf16(b) : b;

				s += da * db;
				sa += fabs(da * db);
			}
			if (beta != 0.0f) {
				s += beta * (double)C0[i * ldc + j];
				sa += fabs(beta * (double)C0[i * ldc + j]);
			}
			out[i * N + j] = s;
			absC[i * N + j] = sa;
		}
	}
}

/* Run one gemm case on `dev` and return the worst error in units of the
 * tolerance: |C - ref| <= tol * (sum |a b| + |beta c|) + 1e-30.
 * Columns N..ldc-1 of C must be left untouched. */
static double gemm_case(struct device *dev, bool ta, bool tb, int64_t M,
			int64_t N, int64_t K, int64_t pad, float beta,
			bool ref_bf16_inputs, double tol)
{
	int64_t lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
	int64_t arows = ta ? K : M, brows = tb ? N : K;
	float *A = tu_falloc(dev, arows * lda), *B = tu_falloc(dev, brows * ldb);
	float *C = tu_falloc(dev, M * ldc), *C0 = malloc(sizeof(float) * M * ldc);
	double *want = malloc(sizeof(double) * M * N), *scale = malloc(sizeof(double) * M * N);
	double worst = 0.0;
	int64_t i, j;

	ck_assert_ptr_nonnull(C0);
	ck_assert_ptr_nonnull(want);
	ck_assert_ptr_nonnull(scale);
	tu_fill(A, arows * lda, -1.0f, 1.0f);
	tu_fill(B, brows * ldb, -1.0f, 1.0f);
	if (beta == 0.0f) {
		for (i = 0; i < M * ldc; i++)
			C[i] = NAN;       /* beta = 0 must overwrite, not multiply */
	} else {
		tu_fill(C, M * ldc, -1.0f, 1.0f);
	}
	memcpy(C0, C, sizeof(float) * M * ldc);
	ref_gemm(ta, tb, M, N, K, A, lda, B, ldb, beta, C0, ldc, ref_bf16_inputs,
		 want, scale);
	ck_assert_int_eq(dev->k->gemm(dev, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc), 0);
	for (i = 0; i < M; i++) {
		for (j = 0; j < N; j++) {
			double e = fabs(C[i * ldc + j] - want[i * N + j]) /
				   (tol * scale[i * N + j] + 1e-30);

			if (!(e <= worst))
				worst = e;
		}
		for (j = N; j < ldc; j++)
			ck_assert_mem_eq(&C[i * ldc + j], &C0[i * ldc + j], sizeof(float));
	}
	dev->ops->free(dev, A);
	dev->ops->free(dev, B);
	dev->ops->free(dev, C);
	free(C0);
	free(want);
	free(scale);
	return worst;
}

/* fp32: every transpose combination, leading dimensions above the minimum,
 * beta 0 and 1. Tolerance 1e-5 of sum |a b| (fp32 accumulation over K = 53
 * gives ~1e-7 relative; the bound leaves room for blocked summation). */
START_TEST(gemm_fp32_all_transposes)
{
	struct device *dev = tu_open(2, MATMUL_FP32);
	int ta, tb, bi;

	tu_seed(1);
	for (ta = 0; ta < 2; ta++)
		for (tb = 0; tb < 2; tb++)
			for (bi = 0; bi < 2; bi++) {
				double e = gemm_case(dev, ta, tb, 37, 29, 53, 3,
						     (float)bi, false, 1e-5);

				ck_assert_msg(e <= 1.0, "ta=%d tb=%d beta=%d err %g",
					      ta, tb, bi, e);
			}
	tu_close(dev);
}
END_TEST

/* bf16: the product of the bf16-rounded inputs accumulated in fp32 must
 * match the double product of independently rounded inputs to 1e-5 (the
 * same bound as fp32), and must differ from the unrounded product by more
 * than fp32 rounding could (proof that the inputs were rounded): the
 * unrounded reference is off by up to ~2^-8 relative per term. */
START_TEST(gemm_bf16)
{
	struct device *dev = tu_open(2, MATMUL_BF16);
	int ta, tb, bi;
	double e_unrounded;

	tu_seed(2);
	ck_assert_int_eq(dev->prec, MATMUL_BF16);
	for (ta = 0; ta < 2; ta++)
		for (tb = 0; tb < 2; tb++)
			for (bi = 0; bi < 2; bi++) {
				double e = gemm_case(dev, ta, tb, 33, 40, 64, 5,
						     (float)bi, true, 1e-5);

				ck_assert_msg(e <= 1.0, "ta=%d tb=%d beta=%d err %g",
					      ta, tb, bi, e);
			}
	tu_seed(2);
	e_unrounded = gemm_case(dev, false, true, 33, 40, 64, 5, 0.0f, false, 1e-5);
	ck_assert_msg(e_unrounded > 10.0, "bf16 path looks unrounded (%g)", e_unrounded);
	/* but within bf16 rounding of the exact product: 2 * 2^-9 per term */
	tu_seed(2);
	e_unrounded = gemm_case(dev, false, true, 33, 40, 64, 5, 0.0f, false, 4e-3);
	ck_assert_msg(e_unrounded <= 1.0, "bf16 error %g beyond rounding", e_unrounded);
	tu_close(dev);
}
END_TEST

/* Whether oneDNN 2.6 has a bf16 matmul here, by the CPU's own flags and
 * ONEDNN_MAX_CPU_ISA (not by asking oneDNN): it needs avx512_core
 * (AVX-512 F, BW, VL, DQ) and no cap below it. */
static bool expect_native_bf16(void)
{
	const char *cap = getenv("ONEDNN_MAX_CPU_ISA");

	__builtin_cpu_init();
	if (cap && (!strcasecmp(cap, "AVX2") || !strcasecmp(cap, "AVX") ||
		    !strcasecmp(cap, "SSE41") || !strcasecmp(cap, "AVX2_VNNI")))
		return false;
	return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
	       __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

/* Each device says how its products run: fp32 names oneDNN's ISA; bf16
 * runs oneDNN's bf16 matmul where it has one and says "emulated" (fp32
 * products of rounded operands) where it has none (AVX2; the products
 * themselves are checked by gemm_bf16 on either path). */
START_TEST(matmul_path_reported)
{
	struct device *d32 = tu_open(2, MATMUL_FP32), *d16 = tu_open(2, MATMUL_BF16);
	const char *cap = getenv("ONEDNN_MAX_CPU_ISA");

	ck_assert_msg(strncmp(d32->matmul, "fp32 (oneDNN ", 13) == 0, "%s", d32->matmul);
	ck_assert_msg(strncmp(d16->matmul, "bf16 operands, fp32 accumulation (", 34) == 0,
		      "%s", d16->matmul);
	ck_assert_msg((strstr(d16->matmul, "emulated") == NULL) == expect_native_bf16(),
		      "%s", d16->matmul);
	if (cap && !strcasecmp(cap, "AVX2")) {
		ck_assert_str_eq(d32->matmul, "fp32 (oneDNN avx2)");
		ck_assert_ptr_nonnull(strstr(d16->matmul, "oneDNN avx2 has no bf16 matmul"));
	}
	tu_close(d32);
	tu_close(d16);
}
END_TEST

/* A Qwen2.5-0.5B-shaped linear layer (x[64,896] W[4864,896]^T), which
 * takes oneDNN's blocked path: checked on sampled entries. */
START_TEST(gemm_large_shape)
{
	struct device *dev = tu_open(2, MATMUL_FP32);
	const int64_t M = 64, N = 4864, K = 896;
	float *x = tu_falloc(dev, M * K), *w = tu_falloc(dev, N * K);
	float *y = tu_falloc(dev, M * N);
	int s;

	tu_seed(3);
	tu_fill(x, M * K, -1.0f, 1.0f);
	tu_fill(w, N * K, -0.1f, 0.1f);
	ck_assert_int_eq(dev->k->gemm(dev, false, true, M, N, K, x, K, w, K, 0.0f, y, N), 0);
	for (s = 0; s < 300; s++) {
		int64_t i = (int64_t)(tu_u64() % M), j = (int64_t)(tu_u64() % N), k;
		double want = 0.0, scale = 0.0;

		for (k = 0; k < K; k++) {
			want += (double)x[i * K + k] * w[j * K + k];
			scale += fabs((double)x[i * K + k] * w[j * K + k]);
		}
		ck_assert_msg(fabs(y[i * N + j] - want) <= 1e-5 * scale,
			      "y[%ld,%ld] = %g, want %g", (long)i, (long)j, y[i * N + j], want);
	}
	dev->ops->free(dev, x);
	dev->ops->free(dev, w);
	dev->ops->free(dev, y);
	tu_close(dev);
}
END_TEST

/* More distinct shapes than the primitive cache holds (64): evicted and
 * rebuilt primitives still give correct products. */
START_TEST(gemm_cache_eviction)
{
	struct device *dev = tu_open(2, MATMUL_FP32);
	int m, round;

	tu_seed(4);
	for (round = 0; round < 2; round++)
		for (m = 1; m <= 70; m += 1 + round * 5) {
			double e = gemm_case(dev, false, true, m, 7, 5, 0, 0.0f, false, 1e-5);

			ck_assert_msg(e <= 1.0, "m=%d err %g", m, e);
		}
	tu_close(dev);
}
END_TEST

START_TEST(gemm_edge_cases)
{
	struct device *dev = tu_open(2, MATMUL_FP32);
	float A[6] = { 1, 2, 3, 4, 5, 6 }, B[6] = { 1, 0, 0, 1, 1, 1 };
	float C[4] = { NAN, NAN, NAN, NAN }, D[4] = { 1, 2, 3, 4 };

	/* K = 0: C = beta C */
	ck_assert_int_eq(dev->k->gemm(dev, false, false, 2, 2, 0, A, 1, B, 2, 0.0f, C, 2), 0);
	ck_assert(C[0] == 0.0f && C[1] == 0.0f && C[2] == 0.0f && C[3] == 0.0f);
	ck_assert_int_eq(dev->k->gemm(dev, false, false, 2, 2, 0, A, 1, B, 2, 1.0f, D, 2), 0);
	ck_assert(D[0] == 1.0f && D[3] == 4.0f);
	/* M = 0 and N = 0 do nothing */
	ck_assert_int_eq(dev->k->gemm(dev, false, false, 0, 2, 3, A, 3, B, 2, 0.0f, C, 2), 0);
	ck_assert_int_eq(dev->k->gemm(dev, false, false, 2, 0, 3, A, 3, B, 2, 0.0f, C, 2), 0);
	/* [[1,2,3],[4,5,6]] @ [[1,0],[0,1],[1,1]] = [[4,5],[10,11]] */
	ck_assert_int_eq(dev->k->gemm(dev, false, false, 2, 2, 3, A, 3, B, 2, 0.0f, C, 2), 0);
	ck_assert(C[0] == 4.0f && C[1] == 5.0f && C[2] == 10.0f && C[3] == 11.0f);
	/* leading dimensions below the minimum */
	ck_assert_int_eq(dev->k->gemm(dev, false, false, 2, 2, 3, A, 2, B, 2, 0.0f, C, 2), -EINVAL);
	ck_assert_int_eq(dev->k->gemm(dev, false, true, 2, 2, 3, A, 3, B, 2, 0.0f, C, 2), -EINVAL);
	ck_assert_int_eq(dev->k->gemm(dev, true, false, 2, 2, 3, A, 1, B, 2, 0.0f, C, 2), -EINVAL);
	ck_assert_int_eq(dev->k->gemm(dev, false, false, 2, 2, 3, A, 3, B, 2, 0.0f, C, 1), -EINVAL);
	ck_assert_int_eq(dev->k->gemm(dev, false, false, -1, 2, 3, A, 3, B, 2, 0.0f, C, 2), -EINVAL);
	tu_close(dev);
}
END_TEST

/* An accumulating product (beta 1 and 0.5) is the beta-0 product plus
 * beta C, bit for bit, on every path and ISA: the primitive's row blocks
 * (M x N over 1M floats: two blocks, the second shorter, on AVX-512; one
 * block below it), bf16 (native or emulated) and fp32, both transposes of
 * A; dnnl_sgemm. beta 0.5 scales exactly, so a fused multiply-add and a
 * multiply then add agree. */
START_TEST(gemm_accumulate_is_product_plus_c)
{
	static const struct { bool ta, tb, bf16; } cases[] = {
		{ false, true, false }, { false, true, true }, { true, false, true },
		{ false, false, true }, { true, false, false },
	};
	const int64_t M = 1200, N = 1000, K = 40;
	size_t c;

	for (c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		const bool ta = cases[c].ta, tb = cases[c].tb;
		const int64_t lda = ta ? M : K, ldb = tb ? K : N;
		struct device *dev = tu_open(2, cases[c].bf16 ? MATMUL_BF16 : MATMUL_FP32);
		float *A = tu_falloc(dev, M * K), *B = tu_falloc(dev, N * K);
		float *C = tu_falloc(dev, M * N), *P = tu_falloc(dev, M * N);
		float *C0 = malloc(sizeof(float) * M * N);
		const float betas[] = { 1.0f, 0.5f };

		ck_assert_ptr_nonnull(C0);
		tu_seed(11);
		tu_fill(A, M * K, -1.0f, 1.0f);
		tu_fill(B, N * K, -1.0f, 1.0f);
		tu_fill(C0, M * N, -4.0f, 4.0f);
		ck_assert_int_eq(dev->k->gemm(dev, ta, tb, M, N, K, A, lda, B, ldb, 0.0f, P, N), 0);
		for (int b = 0; b < 2; b++) {
			memcpy(C, C0, sizeof(float) * M * N);
			ck_assert_int_eq(dev->k->gemm(dev, ta, tb, M, N, K, A, lda, B, ldb,
						      betas[b], C, N), 0);
			for (int64_t i = 0; i < M * N; i++) {
				float want = P[i] + betas[b] * C0[i];

				if (memcmp(&want, &C[i], sizeof(float)))
					ck_abort_msg("case %zu beta %g: C[%ld] = %a, want %a",
						     c, betas[b], (long)i, C[i], want);
			}
		}
		dev->ops->free(dev, A);
		dev->ops->free(dev, B);
		dev->ops->free(dev, C);
		dev->ops->free(dev, P);
		free(C0);
		tu_close(dev);
	}
}
END_TEST

/* One row times a weight stored [N, K] (x W^T at M = 1: decoding's
 * products, cpu_gemm.c's gemv_rows): within the fp32 tolerance of the
 * double product, C = P + beta C bit for bit, and the same bits on 1 and
 * 2 threads. */
START_TEST(gemv_one_row)
{
	const int64_t N = 1000, K = 896;
	struct device *d1 = tu_open(1, MATMUL_FP32), *d2 = tu_open(2, MATMUL_FP32);
	float *A = tu_falloc(d2, K), *B = tu_falloc(d2, N * K), *P = tu_falloc(d2, N);
	float *P1 = tu_falloc(d1, N), *C = tu_falloc(d2, N), *C0 = malloc(sizeof(float) * N);
	double e;

	ck_assert_ptr_nonnull(C0);
	tu_seed(21);
	e = gemm_case(d2, false, true, 1, N, K, 5, 0.0f, false, 1e-5);
	ck_assert_msg(e <= 1.0, "beta 0 err %g", e);
	e = gemm_case(d2, false, true, 1, N, K, 5, 1.0f, false, 1e-5);
	ck_assert_msg(e <= 1.0, "beta 1 err %g", e);
	tu_fill(A, K, -1.0f, 1.0f);
	tu_fill(B, N * K, -1.0f, 1.0f);
	tu_fill(C0, N, -4.0f, 4.0f);
	ck_assert_int_eq(d2->k->gemm(d2, false, true, 1, N, K, A, K, B, K, 0.0f, P, N), 0);
	ck_assert_int_eq(d1->k->gemm(d1, false, true, 1, N, K, A, K, B, K, 0.0f, P1, N), 0);
	ck_assert_mem_eq(P, P1, sizeof(float) * N);
	memcpy(C, C0, sizeof(float) * N);
	ck_assert_int_eq(d2->k->gemm(d2, false, true, 1, N, K, A, K, B, K, 0.5f, C, N), 0);
	for (int64_t i = 0; i < N; i++) {
		float want = P[i] + 0.5f * C0[i];

		ck_assert_msg(!memcmp(&want, &C[i], sizeof(float)), "C[%ld] = %a, want %a",
			      (long)i, C[i], want);
	}
	d2->ops->free(d2, A);
	d2->ops->free(d2, B);
	d2->ops->free(d2, P);
	d2->ops->free(d2, C);
	d1->ops->free(d1, P1);
	free(C0);
	tu_close(d1);
	tu_close(d2);
}
END_TEST

/* The same product of the same values at other addresses (misaligned by
 * 1 and 5 floats) gives the same bits: results must not depend on where a
 * tensor was allocated (checkpoint resume reproduces runs bit for bit).
 * One case per oneDNN entry point and precision: x W^T in fp32 and bf16
 * (the matmul primitive), dy W and the accumulating dy^T x in fp32
 * (dnnl_sgemm). */
START_TEST(gemm_address_independent)
{
	static const struct { bool ta, tb, bf16; float beta; } cases[] = {
		{ false, true, false, 0.0f }, { false, true, true, 0.0f },
		{ false, false, false, 0.0f }, { true, false, false, 1.0f },
	};
	const int64_t M = 50, N = 70, K = 300;
	size_t c;
	int off;

	for (c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		const bool ta = cases[c].ta, tb = cases[c].tb;
		const float beta = cases[c].beta;
		const int64_t lda = ta ? M : K, ldb = tb ? K : N;
		struct device *dev = tu_open(2, cases[c].bf16 ? MATMUL_BF16 : MATMUL_FP32);
		float *A = tu_falloc(dev, M * K + 8), *B = tu_falloc(dev, N * K + 8);
		float *C = tu_falloc(dev, M * N + 8), *ref = malloc(sizeof(float) * M * N);
		float *C0 = malloc(sizeof(float) * M * N);

		ck_assert_ptr_nonnull(ref);
		ck_assert_ptr_nonnull(C0);
		tu_seed(5);
		tu_fill(A, M * K, -1.0f, 1.0f);
		tu_fill(B, N * K, -1.0f, 1.0f);
		tu_fill(C0, M * N, -1.0f, 1.0f);
		memcpy(C, C0, sizeof(float) * M * N);
		ck_assert_int_eq(dev->k->gemm(dev, ta, tb, M, N, K, A, lda, B, ldb,
					      beta, C, N), 0);
		memcpy(ref, C, sizeof(float) * M * N);
		ck_assert(memcmp(ref, C0, sizeof(float) * M * N) != 0);
		for (off = 1; off <= 5; off += 4) {
			memmove(A + off, A + off - (off == 1 ? 1 : 4), sizeof(float) * M * K);
			memmove(B + off, B + off - (off == 1 ? 1 : 4), sizeof(float) * N * K);
			memcpy(C + off, C0, sizeof(float) * M * N);
			ck_assert_int_eq(dev->k->gemm(dev, ta, tb, M, N, K, A + off, lda,
						      B + off, ldb, beta, C + off, N), 0);
			ck_assert_mem_eq(C + off, ref, sizeof(float) * M * N);
		}
		dev->ops->free(dev, A);
		dev->ops->free(dev, B);
		dev->ops->free(dev, C);
		free(ref);
		free(C0);
		tu_close(dev);
	}
}
END_TEST

/* Three experts' rows and weights as llama.c's experts_lin and
 * experts_bwd_w pass them (one empty group), with both betas. */
START_TEST(gemm_grouped_is_each_groups_gemm)
{
	struct device *dev = tu_open(2, MATMUL_FP32);
	const int64_t I = 24, C = 40, rows[3] = {7, 0, 13}, R = 20;
	float *x = tu_falloc(dev, R * C), *w = tu_falloc(dev, 3 * I * C);
	float *y = tu_falloc(dev, R * I), *want = tu_falloc(dev, R * I);
	float *dw = tu_falloc(dev, 3 * I * C), *dwant = tu_falloc(dev, 3 * I * C);
	struct gemm_group gr[3];
	double *ref = malloc(sizeof(double) * 13 * I), *abs_ = malloc(sizeof(double) * 13 * I);

	tu_seed(51);
	tu_fill(x, R * C, -1.0f, 1.0f);
	tu_fill(w, 3 * I * C, -1.0f, 1.0f);
	for (int beta = 0; beta < 2; beta++) {
		int64_t r0 = 0;

		tu_fill(y, R * I, -1.0f, 1.0f);
		memcpy(want, y, sizeof(float) * R * I);
		for (int g = 0; g < 3; g++) {
			gr[g] = (struct gemm_group){.M = rows[g], .N = I, .K = C, .A = x + r0 * C,
						    .B = w + g * I * C, .C = y + r0 * I};
			ck_assert_int_eq(dev->k->gemm(dev, false, true, rows[g], I, C, x + r0 * C, C,
						      w + g * I * C, C, (float)beta, want + r0 * I,
						      I), 0);
			r0 += rows[g];
		}
		ck_assert_int_eq(dev->k->gemm_grouped(dev, false, true, 3, gr, C, C, (float)beta,
						      I), 0);
		ck_assert(!memcmp(y, want, sizeof(float) * R * I));
		/* the last group against the double product (beta 0) */
		if (!beta) {
			ref_gemm(false, true, 13, I, C, x + 7 * C, C, w + 2 * I * C, C, 0.0f, NULL, I,
				 false, ref, abs_);
			for (int64_t i = 0; i < 13 * I; i++)
				ck_assert(fabs(y[7 * I + i] - ref[i]) <= 1e-5 * abs_[i] + 1e-30);
		}
		/* weight gradients: dW_g (+)= dy[rows]^T x[rows] */
		tu_fill(dw, 3 * I * C, -1.0f, 1.0f);
		memcpy(dwant, dw, sizeof(float) * 3 * I * C);
		r0 = 0;
		for (int g = 0; g < 3; g++) {
			gr[g] = (struct gemm_group){.M = I, .N = C, .K = rows[g], .A = y + r0 * I,
						    .B = x + r0 * C, .C = dw + g * I * C};
			ck_assert_int_eq(dev->k->gemm(dev, true, false, I, C, rows[g], y + r0 * I, I,
						      x + r0 * C, C, (float)beta,
						      dwant + g * I * C, C), 0);
			r0 += rows[g];
		}
		ck_assert_int_eq(dev->k->gemm_grouped(dev, true, false, 3, gr, I, C, (float)beta,
						      C), 0);
		ck_assert(!memcmp(dw, dwant, sizeof(float) * 3 * I * C));
	}
	ck_assert_int_eq(dev->k->gemm_grouped(dev, false, true, -1, gr, C, C, 0.0f, I), -EINVAL);
	gr[0].M = -1;
	ck_assert_int_eq(dev->k->gemm_grouped(dev, false, true, 1, gr, C, C, 0.0f, I), -EINVAL);
	free(ref);
	free(abs_);
	dev->ops->free(dev, x);
	dev->ops->free(dev, w);
	dev->ops->free(dev, y);
	dev->ops->free(dev, want);
	dev->ops->free(dev, dw);
	dev->ops->free(dev, dwant);
	tu_close(dev);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("cpu_gemm");
	TCase *tc = tcase_create("core");
	int failed = 0;

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, device_table);
	tcase_add_test(tc, memory_accounting);
	tcase_add_test(tc, gemm_fp32_all_transposes);
	tcase_add_test(tc, gemm_accumulate_is_product_plus_c);
	tcase_add_test(tc, gemv_one_row);
	tcase_add_test(tc, gemm_bf16);
	tcase_add_test(tc, matmul_path_reported);
	tcase_add_test(tc, gemm_large_shape);
	tcase_add_test(tc, gemm_cache_eviction);
	tcase_add_test(tc, gemm_edge_cases);
	tcase_add_test(tc, gemm_address_independent);
	tcase_add_test(tc, gemm_grouped_is_each_groups_gemm);
	suite_add_tcase(s, tc);
	tu_run(s, &failed);
	return failed ? 1 : 0;
}
