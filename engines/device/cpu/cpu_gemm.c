/* cpu_gemm.c — matrix products on the CPU through oneDNN's matmul primitive.
 *
 * Which oneDNN entry point: measured on these machines (2 threads,
 * Qwen2.5-0.5B shapes, tests/bench/bench_gemm.c, its "fp32" and "sgemm"
 * columns) the matmul primitive (brgemm kernels) beats dnnl_sgemm by
 * 10-25% when B is transposed (x W^T forward), while dnnl_sgemm is
 * faster when it is not: 5-15% with neither transposed (dy W input
 * gradients) and, at 256 tokens, 7-26% for the weight gradients dy^T x,
 * which accumulate (beta 1: a sum post-op for the primitive; at 512
 * tokens the two are within 4%; AMD EPYC Zen 5, 2026-12-03). So fp32
 * products with B as stored call dnnl_sgemm and those with B transposed
 * the primitive; the primitive is also the only public oneDNN 2.6 entry
 * point taking bf16 inputs with fp32 accumulation and output. The choice
 * depends on nothing but the call, so results do not vary between runs,
 * and both give results independent of the operands' addresses (tested).
 *
 * A primitive is built per distinct (precision, transposes, M, N, K, leading
 * dimensions) and kept in a small LRU cache owned by the device, so a
 * training step that repeats the same shapes builds each one once. The
 * transposes and leading dimensions are expressed as memory strides, so no
 * operand is copied in fp32.
 *
 * Precision: with MATMUL_BF16 both operands are rounded to bf16 (round to
 * nearest even, cpu_round_bf16) in their stored layout: parameters come
 * from a copy of the engine's parameter region rounded once per
 * param_version (cpu_param_bf16.c), activations into device scratch per call,
 * then multiplied with fp32 accumulation into the fp32 C.
 *
 * Where oneDNN has no bf16 matmul for the CPU (oneDNN 2.6 needs AVX-512:
 * an AVX2-only CPU, or ONEDNN_MAX_CPU_ISA=AVX2), the same products run as
 * fp32 products of the rounded operands, widened back to fp32 in scratch
 * (the parameters from the same bf16 copy): a product of two bf16 values is
 * exact in fp32 and both paths accumulate in fp32, so the results are those
 * of a bf16 matmul up to the order of the sums over K. Which path runs is
 * decided once at open (a probe of the bf16 primitive) and reported
 * (device.matmul: the daemon's log and GetStatus).
 *
 * beta: 0 overwrites C (C may hold NaN/garbage); any other value gives
 * C = op(A) op(B) + beta * C. dnnl_sgemm applies beta itself. Through the
 * primitive, the product is formed with beta 0 in row blocks of about
 * GEMM_C_BLOCK floats (device scratch, cache-sized), each added into C
 * right after it: a oneDNN "sum" post-op did the same addition at
 * 0.78-0.93x the speed on the bf16 weight gradients and the LM head's
 * accumulating dx (bench_gemm, Zen 5, 2026-12-03). C must not alias A or B.
 *
 * The accumulate contract, on every ISA: C = P + beta * C bit for bit,
 * where P is what the same call with beta 0 writes (tested). dnnl_sgemm
 * keeps it by itself. Row blocks keep it only where oneDNN's kernel gives
 * each row the same sums whatever the number of rows it is handed: its
 * brgemm kernels (AVX-512 and up) do; on AVX2 (a gemm-based matmul) rows
 * of a short last block differ from the whole product's in the last bit
 * (measured: 854 of 176000 elements of a 1200 x 1000 x 40 product). So
 * below AVX-512 the whole product goes to scratch in one block: C there is
 * an activation ([tokens, hidden]; weight gradients take dnnl_sgemm on
 * such CPUs, bf16 included), and the cost is its one extra pass.
 */
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "device/lru.h"
#include "io/round.h"
#include "cpu_device.h"

/* Distinct shapes seen in one training step of a Llama-family model are a
 * few dozen at most (per layer kind, forward and backward, and the row
 * blocks of accumulating products). */
#define GEMM_CACHE_SIZE 64
/* Floats of one row block of an accumulating product through the
 * primitive (4 MiB). */
#define GEMM_C_BLOCK (1 << 20)

struct gemm_key {
	bool ta, tb, bf16;
	int64_t M, N, K;
	int64_t lda, ldb, ldc;       /* of the operands oneDNN reads */
};

struct gemm_entry {
	struct lru_slot lru;         /* first (device/lru.h) */
	struct gemm_key key;
	dnnl_primitive_t prim;
	dnnl_memory_t a, b, c;       /* descriptors only; handles set per call */
};

struct cpu_gemm_cache {
	dnnl_engine_t engine;
	dnnl_stream_t stream;
	uint64_t clock;
	/* oneDNN has a bf16 matmul for this CPU (probed at init); else bf16
	 * products run as fp32 products of rounded operands */
	bool bf16_native;
	/* accumulating products through the primitive may run in row blocks
	 * (brgemm kernels: see the header) */
	bool row_blocks;
	char matmul[192];            /* device.matmul */
	struct gemm_entry e[GEMM_CACHE_SIZE];
};

static int dnnl_err(dnnl_status_t s)
{
	if (s == dnnl_success)
		return 0;
	if (s == dnnl_out_of_memory)
		return -ENOMEM;
	if (s == dnnl_invalid_arguments)
		return -EINVAL;
	return -EIO;
}

/* oneDNN's name of an ISA it dispatches to. */
static const char *isa_name(dnnl_cpu_isa_t isa)
{
	switch (isa) {
	case dnnl_cpu_isa_sse41: return "sse41";
	case dnnl_cpu_isa_avx: return "avx";
	case dnnl_cpu_isa_avx2: return "avx2";
	case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
	case dnnl_cpu_isa_avx512_mic: return "avx512_mic";
	case dnnl_cpu_isa_avx512_mic_4ops: return "avx512_mic_4ops";
	case dnnl_cpu_isa_avx512_core: return "avx512_core";
	case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
	case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
	case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
	default: return "unknown ISA";
	}
}

/* Whether oneDNN builds a bf16 x bf16 -> fp32 matmul for this CPU, in each
 * of the operand layouts cpu_gemm hands it (A and B as stored or
 * transposed). */
static bool bf16_matmul_available(dnnl_engine_t engine)
{
	for (int t = 0; t < 4; t++) {
		const dnnl_dim_t n = 64;
		dnnl_dims_t dims = { n, n }, rows = { n, 1 }, cols = { 1, n };
		dnnl_memory_desc_t a_md, b_md, c_md;
		dnnl_matmul_desc_t mm;
		dnnl_primitive_desc_t pd = NULL;
		dnnl_status_t s;

		s = dnnl_memory_desc_init_by_strides(&a_md, 2, dims, dnnl_bf16, t & 1 ? cols : rows);
		if (s == dnnl_success)
			s = dnnl_memory_desc_init_by_strides(&b_md, 2, dims, dnnl_bf16,
							     t & 2 ? cols : rows);
		if (s == dnnl_success)
			s = dnnl_memory_desc_init_by_strides(&c_md, 2, dims, dnnl_f32, rows);
		if (s == dnnl_success)
			s = dnnl_matmul_desc_init(&mm, &a_md, &b_md, NULL, &c_md);
		if (s == dnnl_success)
			s = dnnl_primitive_desc_create(&pd, &mm, NULL, engine, NULL);
		if (pd)
			dnnl_primitive_desc_destroy(pd);
		if (s != dnnl_success)
			return false;
	}
	return true;
}

/* What the device reports as its products' path (device.matmul). */
static void describe_path(struct cpu_gemm_cache *g, enum matmul_precision prec)
{
	dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
	const char *name = isa_name(isa);

	g->row_blocks = (isa & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core;
	if (prec != MATMUL_BF16)
		snprintf(g->matmul, sizeof(g->matmul), "fp32 (oneDNN %s)", name);
	else if (g->bf16_native)
		snprintf(g->matmul, sizeof(g->matmul),
			 "bf16 operands, fp32 accumulation (oneDNN %s bf16 matmul)", name);
	else
		snprintf(g->matmul, sizeof(g->matmul),
			 "bf16 operands, fp32 accumulation (emulated: fp32 products of "
			 "bf16-rounded operands; oneDNN %s has no bf16 matmul)", name);
}

int cpu_gemm_init(struct cpu_device *cd)
{
	struct cpu_gemm_cache *g;
	int r;

	g = calloc(1, sizeof(*g));
	if (!g)
		return -ENOMEM;
	r = dnnl_err(dnnl_engine_create(&g->engine, dnnl_cpu, 0));
	if (r < 0) {
		free(g);
		return r;
	}
	r = dnnl_err(dnnl_stream_create(&g->stream, g->engine,
					dnnl_stream_default_flags));
	if (r < 0) {
		dnnl_engine_destroy(g->engine);
		free(g);
		return r;
	}
	g->bf16_native = cd->base.prec == MATMUL_BF16 && bf16_matmul_available(g->engine);
	describe_path(g, cd->base.prec);
	cd->base.matmul = g->matmul;
	cd->gemm = g;
	return 0;
}

static void entry_clear(struct gemm_entry *e)
{
	if (e->prim)
		dnnl_primitive_destroy(e->prim);
	if (e->a)
		dnnl_memory_destroy(e->a);
	if (e->b)
		dnnl_memory_destroy(e->b);
	if (e->c)
		dnnl_memory_destroy(e->c);
	memset(e, 0, sizeof(*e));
}

void cpu_gemm_fini(struct cpu_device *cd)
{
	struct cpu_gemm_cache *g = cd->gemm;
	int i;

	if (!g)
		return;
	for (i = 0; i < GEMM_CACHE_SIZE; i++)
		entry_clear(&g->e[i]);
	dnnl_stream_destroy(g->stream);
	dnnl_engine_destroy(g->engine);
	free(g);
	cd->gemm = NULL;
}

static bool key_eq(const struct gemm_key *x, const struct gemm_key *y)
{
	return x->ta == y->ta && x->tb == y->tb && x->bf16 == y->bf16 &&
	       x->M == y->M && x->N == y->N && x->K == y->K &&
	       x->lda == y->lda && x->ldb == y->ldb && x->ldc == y->ldc;
}

/* Build the primitive and memory objects of `key` into the empty entry `e`.
 * On failure `e` stays empty. */
static int entry_build(struct cpu_gemm_cache *g, struct gemm_entry *e,
		       const struct gemm_key *key)
{
	dnnl_data_type_t in_t = key->bf16 ? dnnl_bf16 : dnnl_f32;
	dnnl_memory_desc_t a_md, b_md, c_md;
	dnnl_matmul_desc_t mm;
	dnnl_primitive_desc_t pd = NULL;
	/* op(A) is [M,K]: stored [M,K] with row stride lda, or [K,M]. */
	dnnl_dims_t a_dims = { key->M, key->K };
	dnnl_dims_t a_str = { key->ta ? 1 : key->lda, key->ta ? key->lda : 1 };
	dnnl_dims_t b_dims = { key->K, key->N };
	dnnl_dims_t b_str = { key->tb ? 1 : key->ldb, key->tb ? key->ldb : 1 };
	dnnl_dims_t c_dims = { key->M, key->N };
	dnnl_dims_t c_str = { key->ldc, 1 };
	int r;

	r = dnnl_err(dnnl_memory_desc_init_by_strides(&a_md, 2, a_dims, in_t, a_str));
	if (!r)
		r = dnnl_err(dnnl_memory_desc_init_by_strides(&b_md, 2, b_dims, in_t, b_str));
	if (!r)
		r = dnnl_err(dnnl_memory_desc_init_by_strides(&c_md, 2, c_dims, dnnl_f32, c_str));
	if (!r)
		r = dnnl_err(dnnl_matmul_desc_init(&mm, &a_md, &b_md, NULL, &c_md));
	if (!r)
		r = dnnl_err(dnnl_primitive_desc_create(&pd, &mm, NULL, g->engine, NULL));
	if (!r)
		r = dnnl_err(dnnl_primitive_create(&e->prim, pd));
	if (!r)
		r = dnnl_err(dnnl_memory_create(&e->a, &a_md, g->engine, DNNL_MEMORY_NONE));
	if (!r)
		r = dnnl_err(dnnl_memory_create(&e->b, &b_md, g->engine, DNNL_MEMORY_NONE));
	if (!r)
		r = dnnl_err(dnnl_memory_create(&e->c, &c_md, g->engine, DNNL_MEMORY_NONE));
	if (pd)
		dnnl_primitive_desc_destroy(pd);
	if (r < 0) {
		entry_clear(e);
		return r;
	}
	e->key = *key;
	e->lru.used = true;
	return 0;
}

static bool entry_matches(const void *entry, const void *key)
{
	return key_eq(&((const struct gemm_entry *)entry)->key, key);
}

/* The cached entry for `key`, building it (evicting the least recently
 * used one) when absent. */
static int entry_get(struct cpu_gemm_cache *g, const struct gemm_key *key,
		     struct gemm_entry **ret)
{
	struct gemm_entry *e;
	bool hit;
	int r;

	e = lru_find(g->e, sizeof(g->e[0]), GEMM_CACHE_SIZE, &g->clock, entry_matches, key, &hit);
	if (!hit) {
		entry_clear(e);
		r = entry_build(g, e, key);
		if (r < 0)
			return r;
		e->lru.last_use = g->clock;
	}
	*ret = e;
	return 0;
}

/* Round a stored matrix (rows x cols, row stride ld) to a compact bf16
 * copy (row stride cols). */
static void round_matrix(uint16_t *dst, const float *src, int64_t rows,
			 int64_t cols, int64_t ld)
{
	int64_t i;

#pragma omp parallel for schedule(static)
	for (i = 0; i < rows; i++)
		cpu_round_bf16(dst + i * cols, src + i * ld, cols);
}

/* The same rounding, kept in fp32 (the emulated bf16 path's operands):
 * dst[i][j] = the bf16 value nearest src[i][j], exactly. */
static void round_matrix_f32(float *dst, const float *src, int64_t rows,
			     int64_t cols, int64_t ld)
{
	int64_t i;

#pragma omp parallel for schedule(static)
	for (i = 0; i < rows; i++) {
		float *d = dst + i * cols;
		const float *x = src + i * ld;
		int64_t j;

#pragma omp simd
		for (j = 0; j < cols; j++)
			d[j] = fp_bf16_widen(fp_bf16_round(x[j]));
	}
}

/* bf16 values (a compact part of the parameters' copy) widened to fp32. */
static void widen_matrix(float *dst, const uint16_t *src, int64_t n)
{
	int64_t i;

#pragma omp parallel for simd schedule(static)
	for (i = 0; i < n; i++)
		dst[i] = fp_bf16_widen(src[i]);
}

/* C = beta * C for the K == 0 product (no oneDNN call). */
static void scale_c(float *C, int64_t M, int64_t N, int64_t ldc, float beta)
{
	int64_t i, j;

	for (i = 0; i < M; i++) {
		float *c = C + i * ldc;

		if (beta == 0.0f)
			memset(c, 0, (size_t)N * sizeof(*c));
		else
			for (j = 0; j < N; j++)
				c[j] *= beta;
	}
}

/* C (of key's shape and ldc) = op(A) op(B) with the cached primitive. */
static int primitive_run(struct cpu_gemm_cache *g, const struct gemm_key *key,
			 const void *a_data, const void *b_data, float *C)
{
	struct gemm_entry *e;
	dnnl_exec_arg_t args[3];
	int r;

	r = entry_get(g, key, &e);
	if (r < 0)
		return r;
	/* oneDNN takes non-const handles; it only reads A and B. */
	r = dnnl_err(dnnl_memory_set_data_handle(e->a, (void *)a_data));
	if (!r)
		r = dnnl_err(dnnl_memory_set_data_handle(e->b, (void *)b_data));
	if (!r)
		r = dnnl_err(dnnl_memory_set_data_handle(e->c, C));
	if (r < 0)
		return r;
	args[0] = (dnnl_exec_arg_t){ DNNL_ARG_SRC, e->a };
	args[1] = (dnnl_exec_arg_t){ DNNL_ARG_WEIGHTS, e->b };
	args[2] = (dnnl_exec_arg_t){ DNNL_ARG_DST, e->c };
	r = dnnl_err(dnnl_primitive_execute(e->prim, g->stream, 3, args));
	if (!r)
		r = dnnl_err(dnnl_stream_wait(g->stream));
	return r;
}

/* C = op(A) op(B) + beta C through the primitive, in row blocks of op(A)
 * (whole multiples of 32 rows: a block's A starts 64-byte aligned
 * relative to the whole's, in bf16 and fp32): each block's product into
 * scratch, then added into C while it is in cache. key has the whole
 * product's shape and the operands' element type and strides. */
static int primitive_accumulate(struct device *dev, const struct gemm_key *key,
				const void *a_data, const void *b_data, float beta, float *C)
{
	struct cpu_gemm_cache *g = cpu_dev(dev)->gemm;
	const size_t esize = key->bf16 ? sizeof(uint16_t) : sizeof(float);
	/* elements between the first elements of two rows of op(A) */
	const int64_t a_step = key->ta ? 1 : key->lda, M = key->M, N = key->N;
	int64_t rows = g->row_blocks ? GEMM_C_BLOCK / N : M, r0;
	struct gemm_key bk = *key;
	float *tmp;

	rows = rows >= M ? M : (rows >= 32 ? rows / 32 * 32 : 32);
	tmp = cpu_scratch(dev, CPU_SCRATCH_GEMM_C, (size_t)(rows * N) * sizeof(float));
	if (!tmp)
		return -ENOMEM;
	bk.ldc = N;
	for (r0 = 0; r0 < M; r0 += rows) {
		const int64_t R = M - r0 < rows ? M - r0 : rows;
		const char *a_blk = (const char *)a_data + (size_t)(r0 * a_step) * esize;
		int64_t i;
		int r;

		bk.M = R;
		r = primitive_run(g, &bk, a_blk, b_data, tmp);
		if (r < 0)
			return r;
#pragma omp parallel for schedule(static)
		for (i = 0; i < R; i++) {
			float *c = C + (r0 + i) * key->ldc;
			const float *t = tmp + i * N;
			int64_t j;

			if (beta == 1.0f) {
#pragma omp simd
				for (j = 0; j < N; j++)
					c[j] += t[j];
			} else {
#pragma omp simd
				for (j = 0; j < N; j++)
					c[j] = t[j] + beta * c[j];
			}
		}
	}
	return 0;
}

/* C = op(A) op(B) + beta C for operands of key's element type and
 * strides: fp32 products with B as stored through dnnl_sgemm, the rest
 * through the primitive (see the header). */
static int gemm_run(struct device *dev, const struct gemm_key *key,
		    const void *a_data, const void *b_data, float beta, float *C)
{
	if (!key->bf16 && !key->tb)
		return dnnl_err(dnnl_sgemm(key->ta ? 'T' : 'N', 'N', key->M, key->N, key->K,
					   1.0f, a_data, key->lda, b_data, key->ldb, beta,
					   C, key->ldc));
	if (beta != 0.0f)
		return primitive_accumulate(dev, key, a_data, b_data, beta, C);
	return primitive_run(cpu_dev(dev)->gemm, key, a_data, b_data, C);
}

/* One operand of a MATMUL_BF16 product, stored as X (rows x cols, row
 * stride ld), rounded to bf16 into a compact copy: the parameters' copy
 * when X lies in it, else scratch `slot`. With `wide` (no bf16 matmul
 * here) the copy holds the same values as fp32. NULL when out of memory. */
static const void *bf16_operand(struct device *dev, enum cpu_scratch_slot slot,
				const float *X, int64_t rows, int64_t cols, int64_t ld,
				bool wide)
{
	const uint16_t *p16 = cpu_param_bf16_of(dev, X, rows, cols, ld);
	size_t n = (size_t)(rows * cols);
	void *copy;

	if (p16 && !wide)
		return p16;
	copy = cpu_scratch(dev, slot, n * (wide ? sizeof(float) : sizeof(uint16_t)));
	if (!copy)
		return NULL;
	if (p16)
		widen_matrix(copy, p16, rows * cols);
	else if (wide)
		round_matrix_f32(copy, X, rows, cols, ld);
	else
		round_matrix(copy, X, rows, cols, ld);
	return copy;
}

/* One row times a weight stored [N, K] (x W^T: a decode step's products):
 * y[n] = x . W[n] (+ beta y[n]), rows split across the threads, each dot
 * product one vectorized reduction over K. It streams W once at the
 * memory's speed, where oneDNN's matmul primitive ran the same M = 1
 * products at 15-23 GB/s of the weights (Qwen2.5-0.5B shapes, 2 threads,
 * Zen 5, 2026-12-06; docs/SAMPLING.md). Each y[n] is summed by one thread
 * in a fixed order: the results do not depend on the thread count. */
static void gemv_rows(const float *x, const float *W, int64_t ldb, int64_t N, int64_t K,
		      float beta, float *y)
{
#pragma omp parallel for schedule(static)
	for (int64_t n = 0; n < N; n++) {
		const float *w = W + n * ldb;
		float acc = 0.0f;

#pragma omp simd reduction(+:acc)
		for (int64_t k = 0; k < K; k++)
			acc += x[k] * w[k];
		y[n] = beta == 0.0f ? acc : acc + beta * y[n];
	}
}

/* The CPU's grouped product: each group one oneDNN product over all
 * threads, in group order. A group here is an expert's rows, a product of
 * [rows, C] x [C, I] that already fills the cores (tests/bench/bench_moe:
 * 0.93x the dense step's FLOP rate with 16 experts), so one call per group
 * is the grouped product on this device; the GPU's is one launch. */
int cpu_gemm_grouped(struct device *dev, bool trans_a, bool trans_b, int64_t G,
		     const struct gemm_group *groups, int64_t lda, int64_t ldb, float beta,
		     int64_t ldc)
{
	int rc = G < 0 ? -EINVAL : 0;

	for (int64_t g = 0; g < G && !rc; g++)
		rc = cpu_gemm(dev, trans_a, trans_b, groups[g].M, groups[g].N, groups[g].K,
			      groups[g].A, lda, groups[g].B, ldb, beta, groups[g].C, ldc);
	return rc;
}

int cpu_gemm(struct device *dev, bool trans_a, bool trans_b,
	     int64_t M, int64_t N, int64_t K,
	     const float *A, int64_t lda, const float *B, int64_t ldb,
	     float beta, float *C, int64_t ldc)
{
	struct gemm_key key = {
		.ta = trans_a, .tb = trans_b, .M = M, .N = N, .K = K,
		.lda = lda, .ldb = ldb, .ldc = ldc,
	};
	const void *a_data = A, *b_data = B;

	if (M < 0 || N < 0 || K < 0)
		return -EINVAL;
	if (lda < (trans_a ? M : K) || ldb < (trans_b ? K : N) || ldc < N ||
	    lda < 1 || ldb < 1 || ldc < 1)
		return -EINVAL;
	if (M == 0 || N == 0)
		return 0;
	if (!C || (K > 0 && (!A || !B)))
		return -EINVAL;
	if (K == 0) {
		scale_c(C, M, N, ldc, beta);
		return 0;
	}
	cpu_enter(dev);
	if (dev->prec == MATMUL_FP32 && M == 1 && !trans_a && trans_b) {
		gemv_rows(A, B, ldb, N, K, beta, C);
		return 0;
	}
	if (dev->prec == MATMUL_BF16) {
		/* Stored layouts: A is [M,K] or [K,M], B is [K,N] or [N,K];
		 * the copies keep the layout with compact rows. */
		const bool wide = !cpu_dev(dev)->gemm->bf16_native;
		const int64_t a_rows = trans_a ? K : M, a_cols = trans_a ? M : K;
		const int64_t b_rows = trans_b ? N : K, b_cols = trans_b ? K : N;

		a_data = bf16_operand(dev, CPU_SCRATCH_GEMM_A, A, a_rows, a_cols, lda, wide);
		b_data = bf16_operand(dev, CPU_SCRATCH_GEMM_B, B, b_rows, b_cols, ldb, wide);
		if (!a_data || !b_data)
			return -ENOMEM;
		key.bf16 = !wide;
		key.lda = a_cols;
		key.ldb = b_cols;
	}
	return gemm_run(dev, &key, a_data, b_data, beta, C);
}
