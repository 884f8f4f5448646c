/* cuda_gemm_grouped.c — a mixture of experts' projection over every
 * expert's rows in one launch: cuBLAS's cublasGemmGroupedBatchedEx (CUDA
 * 12.5+), every group one product of the call's transposes and leading
 * dimensions (device.h's gemm_grouped).
 *
 * libcublas is opened with dlopen() as cuda_gemm.c opens cuBLASLt, once per
 * process; without it, and with MATMUL_BF16 (whose operands cuda_gemm
 * rounds into bf16 copies, the weights cached), the groups run one
 * cuda_gemm each. Row-major products go to cuBLAS's column-major as
 * cuda_gemm's do: C^T = op(B)^T op(A)^T, cuBLAS's A being our B.
 * CUBLAS_COMPUTE_32F: true fp32 FMA, never TF32. The pointer arrays go to
 * the device in one copy (CUDA_SCRATCH_GROUPS), ordered on the stream
 * before the product.
 */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>

#include <cublas_v2.h>

#include "err.h"
#include "cuda_internal.h"

struct blas_api {
	__typeof__(cublasCreate_v2) *create;
	__typeof__(cublasDestroy_v2) *destroy;
	__typeof__(cublasSetStream_v2) *set_stream;
	__typeof__(cublasGemmGroupedBatchedEx) *grouped;
};

static struct blas_api blas;
static bool blas_ok;
static pthread_once_t blas_once = PTHREAD_ONCE_INIT;

static void blas_load(void)
{
	void *h = cuda_blas_dlopen("libcublas");

	if (!h)
		return;
	/* The handle is kept for the life of the process. */
	blas.create = (__typeof__(blas.create))dlsym(h, "cublasCreate_v2");
	blas.destroy = (__typeof__(blas.destroy))dlsym(h, "cublasDestroy_v2");
	blas.set_stream = (__typeof__(blas.set_stream))dlsym(h, "cublasSetStream_v2");
	blas.grouped = (__typeof__(blas.grouped))dlsym(h, "cublasGemmGroupedBatchedEx");
	blas_ok = blas.create && blas.destroy && blas.set_stream && blas.grouped;
}

void cuda_blas_init(struct cuda_device *cd)
{
	cublasHandle_t h;

	(void)pthread_once(&blas_once, blas_load);
	if (!blas_ok || blas.create(&h) != CUBLAS_STATUS_SUCCESS)
		return;   /* the groups run one by one */
	if (blas.set_stream(h, cd->stream) != CUBLAS_STATUS_SUCCESS) {
		blas.destroy(h);
		return;
	}
	cd->blas = h;
}

void cuda_blas_fini(struct cuda_device *cd)
{
	if (cd->blas)
		blas.destroy((cublasHandle_t)cd->blas);
	cd->blas = NULL;
}

static int one_by_one(struct device *dev, bool ta, bool tb, int64_t G,
		      const struct gemm_group *gr, int64_t lda, int64_t ldb, float beta,
		      int64_t ldc)
{
	int r = 0;

	for (int64_t g = 0; g < G && !r; g++)
		r = cuda_gemm(dev, ta, tb, gr[g].M, gr[g].N, gr[g].K, gr[g].A, lda, gr[g].B, ldb,
			      beta, gr[g].C, ldc);
	return r;
}

/* The host side of one call: cuBLAS's per-group arrays. */
struct grouped_args {
	cublasOperation_t *ta, *tb;
	int *m, *n, *k, *lda, *ldb, *ldc, *size;
	float *alpha, *beta;
	const void **ptr;   /* [3 G]: cuBLAS's A (our B), B (our A), C */
};

static void args_free(struct grouped_args *a)
{
	free(a->ta);
	free(a->tb);
	free(a->m);
	free(a->n);
	free(a->k);
	free(a->lda);
	free(a->ldb);
	free(a->ldc);
	free(a->size);
	free(a->alpha);
	free(a->beta);
	free(a->ptr);
}

static int args_alloc(struct grouped_args *a, int64_t G)
{
	size_t n = (size_t)G;

	a->ta = malloc(n * sizeof(*a->ta));
	a->tb = malloc(n * sizeof(*a->tb));
	a->m = malloc(n * sizeof(int));
	a->n = malloc(n * sizeof(int));
	a->k = malloc(n * sizeof(int));
	a->lda = malloc(n * sizeof(int));
	a->ldb = malloc(n * sizeof(int));
	a->ldc = malloc(n * sizeof(int));
	a->size = malloc(n * sizeof(int));
	a->alpha = malloc(n * sizeof(float));
	a->beta = malloc(n * sizeof(float));
	a->ptr = malloc(3 * n * sizeof(*a->ptr));
	return a->ta && a->tb && a->m && a->n && a->k && a->lda && a->ldb && a->ldc &&
	       a->size && a->alpha && a->beta && a->ptr ? 0 : -ENOMEM;
}

/* Group g's arguments checked as cuda_gemm checks a product's: 1 to take
 * it, 0 when it is empty, -EINVAL. */
static int group_ok(const struct gemm_group *x, bool ta, bool tb, int64_t lda, int64_t ldb,
		    int64_t ldc)
{
	if (x->M < 0 || x->N < 0 || x->K < 0 || lda < (ta ? x->M : x->K) ||
	    ldb < (tb ? x->K : x->N) || ldc < x->N || lda < 1 || ldb < 1 || ldc < 1)
		return -EINVAL;
	if (x->M == 0 || x->N == 0)
		return 0;
	if (!x->C || (x->K > 0 && (!x->A || !x->B)) || x->M > INT_MAX || x->N > INT_MAX ||
	    x->K > INT_MAX || lda > INT_MAX || ldb > INT_MAX || ldc > INT_MAX)
		return -EINVAL;
	return 1;
}

int cuda_gemm_grouped(struct device *dev, bool trans_a, bool trans_b, int64_t G,
		      const struct gemm_group *groups, int64_t lda, int64_t ldb, float beta,
		      int64_t ldc)
{
	struct cuda_device *cd = cuda_dev(dev);
	struct grouped_args a = {0};
	int64_t n = 0;
	void **dptr;
	cublasStatus_t st;
	int r = cuda_alive(dev);

	if (r)
		return r;
	if (G < 0 || G > INT_MAX)
		return -EINVAL;
	if (dev->prec != MATMUL_FP32 || !cd->blas || G < 2)
		return one_by_one(dev, trans_a, trans_b, G, groups, lda, ldb, beta, ldc);
	r = args_alloc(&a, G);
	for (int64_t g = 0; g < G && !r; g++) {
		const struct gemm_group *x = &groups[g];
		int ok = group_ok(x, trans_a, trans_b, lda, ldb, ldc);

		if (ok < 0)
			r = ok;
		else if (ok && x->K == 0)
			r = cuda_scale_rows(dev, x->C, x->M, x->N, ldc, beta);
		if (ok <= 0 || x->K == 0)
			continue;
		a.ta[n] = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
		a.tb[n] = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
		a.m[n] = (int)x->N;
		a.n[n] = (int)x->M;
		a.k[n] = (int)x->K;
		a.lda[n] = (int)ldb;
		a.ldb[n] = (int)lda;
		a.ldc[n] = (int)ldc;
		a.size[n] = 1;
		a.alpha[n] = 1.0f;
		a.beta[n] = beta;
		a.ptr[n] = x->B;
		a.ptr[G + n] = x->A;
		a.ptr[2 * G + n] = x->C;
		n++;
	}
	if (r || n == 0) {
		args_free(&a);
		return r;
	}
	dptr = cuda_scratch(dev, CUDA_SCRATCH_GROUPS, 3 * (size_t)G * sizeof(void *));
	if (!dptr || cudaMemcpyAsync(dptr, a.ptr, 3 * (size_t)G * sizeof(void *),
				     cudaMemcpyHostToDevice, cd->stream) != cudaSuccess) {
		args_free(&a);
		return dptr ? cuda_launched(dev) : -ENOMEM;
	}
	st = blas.grouped((cublasHandle_t)cd->blas, a.ta, a.tb, a.m, a.n, a.k, a.alpha,
			  (const void *const *)dptr, CUDA_R_32F, a.lda,
			  (const void *const *)(dptr + G), CUDA_R_32F, a.ldb, a.beta,
			  dptr + 2 * G, CUDA_R_32F, a.ldc, (int)n, a.size, CUBLAS_COMPUTE_32F);
	args_free(&a);
	switch (st) {
	case CUBLAS_STATUS_SUCCESS:
		return cuda_launched(dev);
	case CUBLAS_STATUS_ALLOC_FAILED:
		return -ENOMEM;
	case CUBLAS_STATUS_NOT_SUPPORTED:   /* an older libcublas: one by one */
		return one_by_one(dev, trans_a, trans_b, G, groups, lda, ldb, beta, ldc);
	default:
		r = cuda_launched(dev);
		return r ? r : -EIO;
	}
}
