/* cuda_gemm.c — matrix products on the GPU through cuBLASLt.
 *
 * cuBLASLt is opened with dlopen() the first time a CUDA device is opened
 * (libcublasLt.so.<major of the headers>), so binaries that carry the CUDA
 * device still start on hosts without the CUDA libraries; there open()
 * fails with -ELIBACC and only the CPU device is usable.
 *
 * Row-major C[M,N] = op(A) op(B) is computed as the column-major product
 * C^T[N,M] = op(B)^T op(A)^T: a row-major matrix with row stride ld is the
 * column-major transpose with the same ld, so cuBLASLt's "A" is our B and
 * its "B" is our A, with the same transpose flags.
 *
 * Precision:
 *  - MATMUL_FP32: fp32 inputs, CUBLAS_COMPUTE_32F (true fp32 FMA, never
 *    TF32), fp32 output.
 *  - MATMUL_BF16: both operands rounded to bf16 (round to nearest even,
 *    like the CPU device) into compact copies, CUBLAS_COMPUTE_32F
 *    accumulation, fp32 output. A copy of B is cached when B lies in the
 *    parameter region the engine declares (dev->param_base/param_bytes),
 *    keyed by (pointer, rows, cols, ld) and valid while dev->param_version
 *    is unchanged: a weight is converted once per optimizer step, not once
 *    per product. Activations (outside the region) are converted per call.
 *
 * Plans: the matmul descriptor, the layouts and the algorithm chosen by
 * cuBLASLt's heuristic are cached per (precision, transposes, shape,
 * leading dimensions, beta, operand alignments) in a small LRU; the
 * heuristic is deterministic for a given key, and so is every cuBLASLt
 * algorithm (split-K reductions are sequenced), so a product's bits depend
 * only on its inputs on a given GPU and library version. Shapes cuBLASLt
 * has no algorithm for (or with a dimension below GEMM_LT_MIN) go to a
 * plain tiled kernel (cuda_gemm_simple) of the same semantics.
 *
 * beta: 0 overwrites C (C may hold NaN); 1 accumulates. C must not alias A
 * or B.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublasLt.h>

#include "err.h"
#include "device/lru.h"
#include "cuda_internal.h"

#define GEMM_PLANS 64
#define GEMM_WORKSPACE ((size_t)32 << 20)   /* cuBLASLt's advice for Hopper */
#define GEMM_LT_MIN 8                        /* smaller dims: simple kernel */

/* ---- cuBLASLt, loaded once per process ---- */

struct lt_api {
	__typeof__(cublasLtCreate) *create;
	__typeof__(cublasLtDestroy) *destroy;
	__typeof__(cublasLtMatmul) *matmul;
	__typeof__(cublasLtMatmulDescCreate) *desc_create;
	__typeof__(cublasLtMatmulDescDestroy) *desc_destroy;
	__typeof__(cublasLtMatmulDescSetAttribute) *desc_set;
	__typeof__(cublasLtMatrixLayoutCreate) *layout_create;
	__typeof__(cublasLtMatrixLayoutDestroy) *layout_destroy;
	__typeof__(cublasLtMatmulPreferenceCreate) *pref_create;
	__typeof__(cublasLtMatmulPreferenceDestroy) *pref_destroy;
	__typeof__(cublasLtMatmulPreferenceSetAttribute) *pref_set;
	__typeof__(cublasLtMatmulAlgoGetHeuristic) *heuristic;
};

static struct lt_api lt;
static int lt_status;                /* 0 loaded, -ELIBACC missing */
static pthread_once_t lt_once = PTHREAD_ONCE_INIT;

static void *sym(void *h, const char *name)
{
	void *p = dlsym(h, name);

	if (!p)
		lt_status = -ELIBACC;
	return p;
}

void *cuda_blas_dlopen(const char *lib)
{
	char name[64];
	void *h;

	snprintf(name, sizeof(name), "%s.so.%d", lib, CUBLAS_VER_MAJOR);
	h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		snprintf(name, sizeof(name), "%s.so", lib);
		h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
	}
	return h;
}

static void lt_load(void)
{
	void *h = cuda_blas_dlopen("libcublasLt");

	if (!h) {
		lt_status = -ELIBACC;
		return;
	}
	/* The handle is kept for the life of the process. */
	lt.create = sym(h, "cublasLtCreate");
	lt.destroy = sym(h, "cublasLtDestroy");
	lt.matmul = sym(h, "cublasLtMatmul");
	lt.desc_create = sym(h, "cublasLtMatmulDescCreate");
	lt.desc_destroy = sym(h, "cublasLtMatmulDescDestroy");
	lt.desc_set = sym(h, "cublasLtMatmulDescSetAttribute");
	lt.layout_create = sym(h, "cublasLtMatrixLayoutCreate");
	lt.layout_destroy = sym(h, "cublasLtMatrixLayoutDestroy");
	lt.pref_create = sym(h, "cublasLtMatmulPreferenceCreate");
	lt.pref_destroy = sym(h, "cublasLtMatmulPreferenceDestroy");
	lt.pref_set = sym(h, "cublasLtMatmulPreferenceSetAttribute");
	lt.heuristic = sym(h, "cublasLtMatmulAlgoGetHeuristic");
}

/* ---- plans ---- */

struct plan_key {
	bool bf16, ta, tb, accumulate;
	int64_t M, N, K;
	int64_t lda, ldb, ldc;        /* of the operands cuBLASLt reads */
	uint32_t align_a, align_b, align_c;
};

struct plan {
	struct lru_slot lru;          /* first (device/lru.h) */
	bool ok;                      /* false: no algorithm, use the simple kernel */
	struct plan_key key;
	cublasLtMatmulDesc_t desc;
	cublasLtMatrixLayout_t la, lb, lc;   /* cuBLASLt's A (our B), B (our A), C = D */
	cublasLtMatmulAlgo_t algo;
	size_t workspace;
};

/* bf16 copy of a parameter matrix, compact rows. */
struct bf16_entry {
	const float *src;
	int64_t rows, cols, ld;
	uint16_t *buf;                /* [rows * cols] device */
	uint64_t version;             /* param_version it was made at */
};

struct cuda_gemm_state {
	cublasLtHandle_t handle;
	void *workspace;              /* [GEMM_WORKSPACE] device */
	uint64_t clock;
	struct plan plans[GEMM_PLANS];
	struct bf16_entry *cache;     /* [n_cache] */
	size_t n_cache, cap_cache;
};

static void plan_clear(struct plan *p)
{
	if (p->desc)
		lt.desc_destroy(p->desc);
	if (p->la)
		lt.layout_destroy(p->la);
	if (p->lb)
		lt.layout_destroy(p->lb);
	if (p->lc)
		lt.layout_destroy(p->lc);
	memset(p, 0, sizeof(*p));
}

int cuda_gemm_init(struct cuda_device *cd)
{
	struct cuda_gemm_state *g;

	(void)pthread_once(&lt_once, lt_load);
	if (lt_status)
		return lt_status;
	g = calloc(1, sizeof(*g));
	if (!g)
		return -ENOMEM;
	if (lt.create(&g->handle) != CUBLAS_STATUS_SUCCESS) {
		free(g);
		return -ENODEV;
	}
	if (cudaMalloc(&g->workspace, GEMM_WORKSPACE) != cudaSuccess) {
		(void)cudaGetLastError();
		lt.destroy(g->handle);
		free(g);
		return -ENOMEM;
	}
	cd->gemm = g;
	return 0;
}

void cuda_gemm_trim(struct cuda_device *cd)
{
	struct cuda_gemm_state *g = cd->gemm;

	if (!g)
		return;
	for (size_t i = 0; i < g->n_cache; i++)
		(void)cudaFree(g->cache[i].buf);
	g->n_cache = 0;
}

void cuda_gemm_forget(struct cuda_device *cd, const void *lo, const void *hi)
{
	struct cuda_gemm_state *g = cd->gemm;
	size_t i = 0;

	if (!g)
		return;
	while (i < g->n_cache) {
		const char *s = (const char *)g->cache[i].src;

		if (s >= (const char *)lo && s < (const char *)hi) {
			(void)cudaFree(g->cache[i].buf);
			g->cache[i] = g->cache[--g->n_cache];
		} else {
			i++;
		}
	}
}

void cuda_gemm_fini(struct cuda_device *cd)
{
	struct cuda_gemm_state *g = cd->gemm;

	if (!g)
		return;
	for (int i = 0; i < GEMM_PLANS; i++)
		plan_clear(&g->plans[i]);
	cuda_gemm_trim(cd);
	free(g->cache);
	(void)cudaFree(g->workspace);
	lt.destroy(g->handle);
	free(g);
	cd->gemm = NULL;
}

static bool key_eq(const struct plan_key *x, const struct plan_key *y)
{
	return x->bf16 == y->bf16 && x->ta == y->ta && x->tb == y->tb &&
	       x->accumulate == y->accumulate && x->M == y->M && x->N == y->N &&
	       x->K == y->K && x->lda == y->lda && x->ldb == y->ldb &&
	       x->ldc == y->ldc && x->align_a == y->align_a &&
	       x->align_b == y->align_b && x->align_c == y->align_c;
}

/* Largest power of two (<= 256) dividing the address. */
static uint32_t align_of(const void *p)
{
	uintptr_t a = (uintptr_t)p;
	uint32_t al = 256;

	while (al > 1 && (a & (al - 1)))
		al >>= 1;
	return al;
}

/* Build the descriptors of `key` into the empty plan `p` and ask the
 * heuristic for an algorithm; p->ok says whether one exists. Returns
 * -ENOMEM when a descriptor cannot be made (p stays empty). */
static int plan_build(struct cuda_gemm_state *g, struct plan *p,
		      const struct plan_key *key)
{
	cudaDataType_t in_t = key->bf16 ? CUDA_R_16BF : CUDA_R_32F;
	cublasOperation_t op_a = key->tb ? CUBLAS_OP_T : CUBLAS_OP_N;   /* theirs: our B */
	cublasOperation_t op_b = key->ta ? CUBLAS_OP_T : CUBLAS_OP_N;   /* theirs: our A */
	cublasLtMatmulPreference_t pref = NULL;
	cublasLtMatmulHeuristicResult_t res;
	size_t ws = GEMM_WORKSPACE;
	int n = 0;
	bool fail;

	memset(p, 0, sizeof(*p));
	/* column-major: their A is op_a-stored [N,K] (rows N, cols K when not
	 * transposed, else stored [K,N]); their B [K,M] likewise; C [N,M]. */
	fail = lt.desc_create(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS ||
	       lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)) ||
	       lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)) ||
	       lt.layout_create(&p->la, in_t, key->tb ? key->K : key->N,
				key->tb ? key->N : key->K, key->ldb) ||
	       lt.layout_create(&p->lb, in_t, key->ta ? key->M : key->K,
				key->ta ? key->K : key->M, key->lda) ||
	       lt.layout_create(&p->lc, CUDA_R_32F, key->N, key->M, key->ldc) ||
	       lt.pref_create(&pref) ||
	       lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)) ||
	       lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &key->align_b,
			   sizeof(uint32_t)) ||
	       lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key->align_a,
			   sizeof(uint32_t)) ||
	       lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &key->align_c,
			   sizeof(uint32_t)) ||
	       lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key->align_c,
			   sizeof(uint32_t));
	if (fail) {
		if (pref)
			lt.pref_destroy(pref);
		plan_clear(p);
		return -ENOMEM;
	}
	if (lt.heuristic(g->handle, p->desc, p->la, p->lb, p->lc, p->lc, pref, 1, &res, &n) ==
		    CUBLAS_STATUS_SUCCESS &&
	    n > 0 && res.state == CUBLAS_STATUS_SUCCESS) {
		p->ok = true;
		p->algo = res.algo;
		p->workspace = res.workspaceSize;
	}
	lt.pref_destroy(pref);
	p->key = *key;
	p->lru.used = true;
	return 0;
}

static bool plan_matches(const void *plan, const void *key)
{
	return key_eq(&((const struct plan *)plan)->key, key);
}

static int plan_get(struct cuda_gemm_state *g, const struct plan_key *key,
		    struct plan **ret)
{
	struct plan *p;
	bool hit;
	int r;

	p = lru_find(g->plans, sizeof(g->plans[0]), GEMM_PLANS, &g->clock, plan_matches, key, &hit);
	if (!hit) {
		plan_clear(p);
		r = plan_build(g, p, key);
		if (r < 0)
			return r;
		p->lru.last_use = g->clock;
	}
	*ret = p;
	return 0;
}

/* The cached bf16 copy of parameter matrix src[rows, cols] (row stride ld),
 * converted again when the parameters changed; NULL when src is not in the
 * parameter region or memory is short (the caller converts into scratch). */
static const uint16_t *cached_bf16(struct cuda_device *cd, const float *src,
				   int64_t rows, int64_t cols, int64_t ld, int *ret_err)
{
	struct cuda_gemm_state *g = cd->gemm;
	const struct device *dev = &cd->base;
	const char *lo = dev->param_base, *hi;
	const char *s = (const char *)src;
	const char *e = (const char *)(src + (rows - 1) * ld + cols);
	struct bf16_entry *en = NULL;
	void *buf = NULL;

	*ret_err = 0;
	if (!lo)
		return NULL;
	hi = lo + dev->param_bytes;
	if (s < lo || e > hi)
		return NULL;
	for (size_t i = 0; i < g->n_cache; i++) {
		struct bf16_entry *c = &g->cache[i];

		if (c->src == src && c->rows == rows && c->cols == cols && c->ld == ld) {
			en = c;
			break;
		}
	}
	if (!en) {
		if (g->n_cache == g->cap_cache) {
			size_t cap = g->cap_cache ? 2 * g->cap_cache : 64;
			struct bf16_entry *a = realloc(g->cache, cap * sizeof(*a));

			if (!a)
				return NULL;
			g->cache = a;
			g->cap_cache = cap;
		}
		if (cudaMalloc(&buf, (size_t)(rows * cols) * sizeof(uint16_t)) != cudaSuccess) {
			(void)cudaGetLastError();
			return NULL;
		}
		en = &g->cache[g->n_cache++];
		en->src = src;
		en->rows = rows;
		en->cols = cols;
		en->ld = ld;
		en->buf = buf;
		en->version = dev->param_version - 1;   /* stale: convert below */
	}
	if (en->version != dev->param_version) {
		*ret_err = cuda_round_bf16_2d(&cd->base, en->buf, src, rows, cols, ld);
		if (*ret_err)
			return NULL;
		en->version = dev->param_version;
	}
	return en->buf;
}

int cuda_gemm(struct device *dev, bool trans_a, bool trans_b,
	      int64_t M, int64_t N, int64_t K,
	      const float *A, int64_t lda, const float *B, int64_t ldb,
	      float beta, float *C, int64_t ldc)
{
	struct cuda_device *cd = cuda_dev(dev);
	struct cuda_gemm_state *g = cd->gemm;
	bool bf16 = dev->prec == MATMUL_BF16;
	int64_t a_rows = trans_a ? K : M, a_cols = trans_a ? M : K;
	int64_t b_rows = trans_b ? N : K, b_cols = trans_b ? K : N;
	const void *a_data = A, *b_data = B;
	int64_t a_ld = lda, b_ld = ldb;   /* of the operands cuBLASLt reads */
	struct plan_key key;
	struct plan *p;
	float alpha = 1.0f;
	cublasStatus_t st;
	int r;

	r = cuda_alive(dev);
	if (r)
		return r;
	if (M < 0 || N < 0 || K < 0)
		return -EINVAL;
	if (lda < (trans_a ? M : K) || ldb < (trans_b ? K : N) || ldc < N ||
	    lda < 1 || ldb < 1 || ldc < 1)
		return -EINVAL;
	if (M == 0 || N == 0)
		return 0;
	if (!C || (K > 0 && (!A || !B)))
		return -EINVAL;
	if (K == 0)
		return cuda_scale_rows(dev, C, M, N, ldc, beta);
	if (M < GEMM_LT_MIN || N < GEMM_LT_MIN || K < GEMM_LT_MIN)
		return cuda_gemm_simple(dev, bf16, trans_a, trans_b, M, N, K, A, lda,
					B, ldb, beta, C, ldc);

	if (bf16) {
		uint16_t *a16 = cuda_scratch(dev, CUDA_SCRATCH_GEMM_A,
					     (size_t)(a_rows * a_cols) * sizeof(uint16_t));
		const uint16_t *b16;

		if (!a16)
			return -ENOMEM;
		r = cuda_round_bf16_2d(dev, a16, A, a_rows, a_cols, lda);
		if (r)
			return r;
		b16 = cached_bf16(cd, B, b_rows, b_cols, ldb, &r);
		if (r)
			return r;
		if (!b16) {
			uint16_t *s = cuda_scratch(dev, CUDA_SCRATCH_GEMM_B,
						   (size_t)(b_rows * b_cols) * sizeof(uint16_t));

			if (!s)
				return -ENOMEM;
			r = cuda_round_bf16_2d(dev, s, B, b_rows, b_cols, ldb);
			if (r)
				return r;
			b16 = s;
		}
		a_data = a16;
		b_data = b16;
		a_ld = a_cols;
		b_ld = b_cols;
	}

	memset(&key, 0, sizeof(key));
	key.bf16 = bf16;
	key.ta = trans_a;
	key.tb = trans_b;
	key.accumulate = beta != 0.0f;
	key.M = M;
	key.N = N;
	key.K = K;
	key.lda = a_ld;
	key.ldb = b_ld;
	key.ldc = ldc;
	key.align_a = align_of(a_data);
	key.align_b = align_of(b_data);
	key.align_c = align_of(C);
	r = plan_get(g, &key, &p);
	if (r)
		return r;
	if (!p->ok)
		return cuda_gemm_simple(dev, bf16, trans_a, trans_b, M, N, K, A, lda,
					B, ldb, beta, C, ldc);
	st = lt.matmul(g->handle, p->desc, &alpha, b_data, p->la, a_data, p->lb, &beta,
		       C, p->lc, C, p->lc, &p->algo, g->workspace, p->workspace,
		       cd->stream);
	switch (st) {
	case CUBLAS_STATUS_SUCCESS:
		return cuda_launched(dev);
	case CUBLAS_STATUS_ALLOC_FAILED:
		return -ENOMEM;
	case CUBLAS_STATUS_EXECUTION_FAILED:
		r = cuda_launched(dev);
		return r ? r : -EIO;
	default:
		return -EIO;
	}
}
