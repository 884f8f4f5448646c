/* cpu_attention.c — causal grouped-query attention over packed sequences
 * on the CPU, in blocks of query (or key) rows against one sequence.
 *
 * A work item is a block of BLK query positions of one sequence and one
 * head (the blocks start at multiples of BLK inside each sequence). It forms
 * the row panel of its scores against the keys of the same sequence up to
 * the diagonal, S [BLK, <= len], in per-thread scratch: memory is O(T) per
 * thread (BLK x the longest sequence), never a T x T matrix, and no score
 * between two sequences is ever formed (no cross-sequence leakage).
 *
 * The panel products go through oneDNN's dnnl_sgemm, called single-threaded
 * from inside the OpenMP loop over items (oneDNN does not nest): measured
 * on these machines it reaches ~80% of a core's FMA peak on these shapes;
 * the whole kernels ran 1.4-2.7x faster than with hand-written 64 x 64
 * tile loops. The softmax steps between them
 * are vectorized loops (cpu_expf).
 *
 * Forward, per (query block, head): S = scale q k^T, E = exp(S - row max)
 * with the causal mask (exact row max and sum: the whole row is in the
 * panel), out = (E v) / row sum; saves lse[H, T].
 *
 * Backward, deterministic without atomics, in two passes that recompute P
 * from lse, with D_i = rowsum(dout_i * out_i) computed first:
 *   pass 1, per (query block, head): dS = P (dout v^T - D_i),
 *           dq = scale dS k;
 *   pass 2, per (key block, kv head), for the H/KV heads of the group in
 *           order: P^T and dS^T against the queries at or after the block,
 *           dv += P^T dout, dk += scale dS^T q (the first head writes, the
 *           others accumulate).
 * or, when there are enough sequences to keep the threads busy, fused in
 * one pass per (sequence, kv head) that also accumulates dq (dqkv_item).
 * Every output element is written by exactly one work item, in a fixed
 * order, so results are bit-identical run after run; the OpenMP schedule
 * only decides which thread runs an item.
 */
#include <math.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "cpu_device.h"
#include "cpu_math.h"

#define BLK 64                   /* query / key positions per work item */

struct attn_blk {
	int32_t s0;                  /* first token of the sequence in [T] */
	int32_t len;                 /* its length */
	int32_t t0;                  /* first position of the block in it */
};

struct attn_ctx {
	const struct attn_blk *blks;
	int64_t nblks;
	const struct attn_blk *seqs; /* non-empty sequences, longest first */
	int64_t nseqs;
	double work, max_work;       /* sum and max over sequences of len^2 */
	int64_t T, H, KV, D, G;      /* G = H / KV */
	int64_t ldp;                 /* panel row stride (floats) */
	float scale;
	const float *q, *k, *v, *dout, *lse, *drow;
	float *o, *lse_out, *dq, *dk, *dv;
	float *ws;                   /* per-thread panels */
	int64_t ws_floats;           /* floats per thread */
	int err;                     /* first oneDNN failure, if any */
};

static inline int64_t min64(int64_t a, int64_t b)
{
	return a < b ? a : b;
}

/* Row-major C[M,N] = alpha op(A) op(B) + beta C through oneDNN. */
static int sgemm(struct attn_ctx *c, char ta, char tb, int64_t M, int64_t N,
		 int64_t K, float alpha, const float *A, int64_t lda,
		 const float *B, int64_t ldb, float beta, float *C, int64_t ldc)
{
	dnnl_status_t s;

	s = dnnl_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
	if (s == dnnl_success)
		return 0;
	/* Recorded for the caller; items are independent so the loop may
	 * finish. Any thread may write: the value only says "failed". */
#pragma omp atomic write
	c->err = s == dnnl_out_of_memory ? -ENOMEM : -EIO;
	return -1;
}

static float *thread_ws(const struct attn_ctx *c)
{
	return c->ws + (int64_t)omp_get_thread_num() * c->ws_floats;
}

/* ---- forward ------------------------------------------------------------ */

static void fwd_item(struct attn_ctx *c, int64_t it)
{
	const int64_t D = c->D, H = c->H, KV = c->KV, ldp = c->ldp;
	const struct attn_blk *b = &c->blks[it / H];
	const int64_t h = it % H, kvh = h / c->G;
	const int64_t s0 = b->s0, q0 = b->t0;
	const int64_t nq = min64(BLK, b->len - q0), kend = q0 + nq;
	const float *qp = c->q + ((s0 + q0) * H + h) * D;
	const float *kp = c->k + (s0 * KV + kvh) * D;
	const float *vp = c->v + (s0 * KV + kvh) * D;
	float *S = thread_ws(c), *inv = S + BLK * ldp;   /* inv[BLK] */
	float *op = c->o + ((s0 + q0) * H + h) * D;
	int64_t i, j, d;

	/* S[nq, kend] = scale q k^T */
	if (sgemm(c, 'N', 'T', nq, kend, D, c->scale, qp, H * D, kp, KV * D,
		  0.0f, S, ldp) < 0)
		return;
	for (i = 0; i < nq; i++) {
		float *s = S + i * ldp;
		const int64_t jmax = q0 + i + 1;      /* keys 0 .. q0 + i */
		float mx = -INFINITY, sum;

#pragma omp simd reduction(max:mx)
		for (j = 0; j < jmax; j++)
			mx = s[j] > mx ? s[j] : mx;
		sum = cpu_exp_shift_sum(s, jmax, mx);
		for (j = jmax; j < kend; j++)
			s[j] = 0.0f;
		inv[i] = 1.0f / sum;
		c->lse_out[h * c->T + s0 + q0 + i] = mx + logf(sum);
	}
	/* out[nq, D] = (exp(S - max) v) / sum: normalizing the D outputs of a
	 * row is cheaper than its kend probabilities */
	if (sgemm(c, 'N', 'N', nq, D, kend, 1.0f, S, ldp, vp, KV * D, 0.0f,
		  op, H * D) < 0)
		return;
	for (i = 0; i < nq; i++) {
#pragma omp simd
		for (d = 0; d < D; d++)
			op[i * H * D + d] *= inv[i];
	}
}

/* ---- backward pass 1: dq ------------------------------------------------ */

static void dq_item(struct attn_ctx *c, int64_t it)
{
	const int64_t D = c->D, H = c->H, KV = c->KV, T = c->T, ldp = c->ldp;
	const struct attn_blk *b = &c->blks[it / H];
	const int64_t h = it % H, kvh = h / c->G;
	const int64_t s0 = b->s0, q0 = b->t0;
	const int64_t nq = min64(BLK, b->len - q0), kend = q0 + nq;
	const float *qp = c->q + ((s0 + q0) * H + h) * D;
	const float *dop = c->dout + ((s0 + q0) * H + h) * D;
	const float *kp = c->k + (s0 * KV + kvh) * D;
	const float *vp = c->v + (s0 * KV + kvh) * D;
	float *S = thread_ws(c), *dP = S + BLK * ldp;
	int64_t i, j;

	if (sgemm(c, 'N', 'T', nq, kend, D, c->scale, qp, H * D, kp, KV * D,
		  0.0f, S, ldp) < 0)
		return;
	if (sgemm(c, 'N', 'T', nq, kend, D, 1.0f, dop, H * D, vp, KV * D,
		  0.0f, dP, ldp) < 0)
		return;
	for (i = 0; i < nq; i++) {
		const int64_t t = s0 + q0 + i, jmax = q0 + i + 1;
		const float ls = c->lse[h * T + t], di = c->drow[h * T + t];
		const float *s = S + i * ldp;
		float *ds = dP + i * ldp;

		/* dS = P (dP - D_i), 0 past the diagonal */
#pragma omp simd
		for (j = 0; j < jmax; j++)
			ds[j] = cpu_expf(s[j] - ls) * (ds[j] - di);
		for (j = jmax; j < kend; j++)
			ds[j] = 0.0f;
	}
	/* dq[nq, D] = scale dS k */
	sgemm(c, 'N', 'N', nq, D, kend, c->scale, dP, ldp, kp, KV * D, 0.0f,
	      c->dq + ((s0 + q0) * H + h) * D, H * D);
}

/* ---- backward pass 2: dk, dv -------------------------------------------- */

static void dkv_item(struct attn_ctx *c, int64_t it)
{
	const int64_t D = c->D, H = c->H, KV = c->KV, T = c->T, ldp = c->ldp;
	const struct attn_blk *b = &c->blks[it / KV];
	const int64_t kvh = it % KV;
	const int64_t s0 = b->s0, k0 = b->t0;
	const int64_t nk = min64(BLK, b->len - k0), nqr = b->len - k0;
	const float *kp = c->k + ((s0 + k0) * KV + kvh) * D;
	const float *vp = c->v + ((s0 + k0) * KV + kvh) * D;
	float *dkp = c->dk + ((s0 + k0) * KV + kvh) * D;
	float *dvp = c->dv + ((s0 + k0) * KV + kvh) * D;
	float *St = thread_ws(c), *dPt = St + BLK * ldp;
	int64_t g, i, j;

	for (g = 0; g < c->G; g++) {
		const int64_t h = kvh * c->G + g;
		/* queries k0 .. len-1 of head h */
		const float *qp = c->q + ((s0 + k0) * H + h) * D;
		const float *dop = c->dout + ((s0 + k0) * H + h) * D;
		const float *ls = c->lse + h * T + s0 + k0;
		const float *di = c->drow + h * T + s0 + k0;
		const float beta = g == 0 ? 0.0f : 1.0f;

		/* St[nk, nqr] = scale k q^T, dPt = v dout^T */
		if (sgemm(c, 'N', 'T', nk, nqr, D, c->scale, kp, KV * D, qp, H * D,
			  0.0f, St, ldp) < 0)
			return;
		if (sgemm(c, 'N', 'T', nk, nqr, D, 1.0f, vp, KV * D, dop, H * D,
			  0.0f, dPt, ldp) < 0)
			return;
		for (j = 0; j < nk; j++) {
			float *p = St + j * ldp, *ds = dPt + j * ldp;

			/* query i (position k0 + i) sees key j iff i >= j */
			for (i = 0; i < j; i++) {
				p[i] = 0.0f;
				ds[i] = 0.0f;
			}
#pragma omp simd
			for (i = j; i < nqr; i++) {
				float e = cpu_expf(p[i] - ls[i]);

				p[i] = e;
				ds[i] = e * (ds[i] - di[i]);
			}
		}
		/* dv[nk, D] (+)= P^T dout, dk (+)= scale dS^T q */
		if (sgemm(c, 'N', 'N', nk, D, nqr, 1.0f, St, ldp, dop, H * D,
			  beta, dvp, KV * D) < 0)
			return;
		if (sgemm(c, 'N', 'N', nk, D, nqr, c->scale, dPt, ldp, qp, H * D,
			  beta, dkp, KV * D) < 0)
			return;
	}
}

/* ---- backward, fused: dq, dk, dv of one (sequence, kv head) ------------- */

/* The same products as the two passes, with the recomputation of pass 1
 * saved: per key block, for each head of the group, P^T and dS^T against
 * the queries at or after the block give dv and dk of the block and the
 * block's share of dq, dq[k0:] (+)= scale (dS^T)^T k_blk, summed over the
 * key blocks in order (the first block, k0 = 0, covers every query and
 * writes). The item owns dq of its sequence's group heads: no atomics. */
static void dqkv_item(struct attn_ctx *c, int64_t it)
{
	const int64_t D = c->D, H = c->H, KV = c->KV, T = c->T, ldp = c->ldp;
	const struct attn_blk *sq = &c->seqs[it / KV];
	const int64_t kvh = it % KV, s0 = sq->s0, len = sq->len;
	float *St = thread_ws(c), *dPt = St + BLK * ldp;
	int64_t k0, g, i, j;

	for (k0 = 0; k0 < len; k0 += BLK) {
		const int64_t nk = min64(BLK, len - k0), nqr = len - k0;
		const float *kp = c->k + ((s0 + k0) * KV + kvh) * D;
		const float *vp = c->v + ((s0 + k0) * KV + kvh) * D;
		float *dkp = c->dk + ((s0 + k0) * KV + kvh) * D;
		float *dvp = c->dv + ((s0 + k0) * KV + kvh) * D;

		for (g = 0; g < c->G; g++) {
			const int64_t h = kvh * c->G + g;
			const float *qp = c->q + ((s0 + k0) * H + h) * D;
			const float *dop = c->dout + ((s0 + k0) * H + h) * D;
			const float *ls = c->lse + h * T + s0 + k0;
			const float *di = c->drow + h * T + s0 + k0;
			const float beta = g == 0 ? 0.0f : 1.0f;

			if (sgemm(c, 'N', 'T', nk, nqr, D, c->scale, kp, KV * D, qp,
				  H * D, 0.0f, St, ldp) < 0)
				return;
			if (sgemm(c, 'N', 'T', nk, nqr, D, 1.0f, vp, KV * D, dop,
				  H * D, 0.0f, dPt, ldp) < 0)
				return;
			for (j = 0; j < nk; j++) {
				float *p = St + j * ldp, *ds = dPt + j * ldp;

				for (i = 0; i < j; i++) {
					p[i] = 0.0f;
					ds[i] = 0.0f;
				}
#pragma omp simd
				for (i = j; i < nqr; i++) {
					float e = cpu_expf(p[i] - ls[i]);

					p[i] = e;
					ds[i] = e * (ds[i] - di[i]);
				}
			}
			if (sgemm(c, 'N', 'N', nk, D, nqr, 1.0f, St, ldp, dop, H * D,
				  beta, dvp, KV * D) < 0)
				return;
			if (sgemm(c, 'N', 'N', nk, D, nqr, c->scale, dPt, ldp, qp,
				  H * D, beta, dkp, KV * D) < 0)
				return;
			if (sgemm(c, 'T', 'N', nqr, D, nk, c->scale, dPt, ldp, kp,
				  KV * D, k0 == 0 ? 0.0f : 1.0f,
				  c->dq + ((s0 + k0) * H + h) * D, H * D) < 0)
				return;
		}
	}
}

static int cmp_seq(const void *a, const void *b)
{
	const struct attn_blk *x = a, *y = b;

	if (x->len != y->len)
		return x->len > y->len ? -1 : 1;
	return x->s0 < y->s0 ? -1 : x->s0 > y->s0;
}

/* Check the shapes; build the block table and the per-thread panels
 * (`npanels` of BLK x the longest sequence, then BLK floats). */
static int attn_setup(struct device *dev, struct attn_ctx *c,
		      const int32_t *cu, int64_t B, int64_t T, int64_t H,
		      int64_t KV, int64_t D, float scale, int npanels)
{
	struct attn_blk *blks, *seqs;
	int64_t b, n = 0, lmax = 0, nthreads;

	if (B < 0 || T < 0 || H <= 0 || KV <= 0 || H % KV || D <= 0 ||
	    T > INT32_MAX)
		return -EINVAL;
	if (cu[0] != 0 || cu[B] != T)
		return -EINVAL;
	for (b = 0; b < B; b++) {
		int64_t len = (int64_t)cu[b + 1] - cu[b];

		if (len < 0)
			return -EINVAL;
		n += (len + BLK - 1) / BLK;
		lmax = len > lmax ? len : lmax;
	}
	memset(c, 0, sizeof(*c));
	c->T = T;
	c->H = H;
	c->KV = KV;
	c->D = D;
	c->G = H / KV;
	c->scale = scale;
	c->nblks = n;
	/* rows start on a cache line */
	c->ldp = (lmax + 15) / 16 * 16;
	if (n == 0)
		return 0;
	/* the blocks, then the non-empty sequences (at most B) */
	blks = cpu_scratch(dev, CPU_SCRATCH_INDEX, (size_t)(n + B) * sizeof(*blks));
	if (!blks)
		return -ENOMEM;
	seqs = blks + n;
	n = 0;
	for (b = 0; b < B; b++) {
		int32_t len = cu[b + 1] - cu[b], t0;

		for (t0 = 0; t0 < len; t0 += BLK) {
			blks[n].s0 = cu[b];
			blks[n].len = len;
			blks[n].t0 = t0;
			if (t0 == 0)
				seqs[c->nseqs++] = blks[n];
			n++;
		}
		c->work += (double)len * len;
		c->max_work = fmax(c->max_work, (double)len * len);
	}
	qsort(seqs, (size_t)c->nseqs, sizeof(*seqs), cmp_seq);
	c->blks = blks;
	c->seqs = seqs;
	cpu_enter(dev);
	nthreads = omp_get_max_threads();
	c->ws_floats = npanels * BLK * c->ldp + BLK;
	c->ws = cpu_scratch(dev, CPU_SCRATCH_TILES,
			    (size_t)(nthreads * c->ws_floats) * sizeof(float));
	if (!c->ws)
		return -ENOMEM;
	return 0;
}

int cpu_attention_fwd(struct device *dev, float *out, float *lse,
		      const float *q, const float *k, const float *v,
		      const int32_t *cu_seqlens, int64_t B, int64_t T,
		      int64_t H, int64_t KV, int64_t D, float scale)
{
	struct attn_ctx c;
	int64_t nitems, idx;
	int r;

	r = attn_setup(dev, &c, cu_seqlens, B, T, H, KV, D, scale, 1);
	if (r < 0 || c.nblks == 0)
		return r;
	c.q = q;
	c.k = k;
	c.v = v;
	c.o = out;
	c.lse_out = lse;
	nitems = c.nblks * H;
	/* Late blocks of a sequence cost the most: hand them out first. */
#pragma omp parallel for schedule(dynamic, 1)
	for (idx = 0; idx < nitems; idx++)
		fwd_item(&c, nitems - 1 - idx);
	return c.err;
}

/* The fused backward does 5 panel products per (query, key) pair instead
 * of 7, but has only (sequences x kv heads) items, each costing ~len^2.
 * Take it when the largest item (the longest sequence, one kv head) does
 * not stretch the schedule: largest * threads <= 1.25 * total (the two
 * passes cost ~1.4x the fused work spread evenly). The choice depends on the thread count, so the bits of dq may
 * too (device.h does not promise thread-count independence). */
static bool use_fused(struct device *dev, const struct attn_ctx *c)
{
	int mode = cpu_dev(dev)->attn_bwd_path;

	if (mode)
		return mode == 2;
	return c->max_work * omp_get_max_threads() <= 1.25 * (double)c->KV * c->work;
}

int cpu_attention_bwd(struct device *dev, float *dq, float *dk, float *dv,
		      const float *dout, const float *q, const float *k,
		      const float *v, const float *out, const float *lse,
		      const int32_t *cu_seqlens, int64_t B, int64_t T,
		      int64_t H, int64_t KV, int64_t D, float scale)
{
	struct attn_ctx c;
	float *drow;
	int64_t nitems, idx;
	int r;

	r = attn_setup(dev, &c, cu_seqlens, B, T, H, KV, D, scale, 2);
	if (r < 0 || c.nblks == 0)
		return r;
	/* D_i = rowsum(dout * out), [H, T] like lse */
	drow = cpu_scratch(dev, CPU_SCRATCH_ROWS, (size_t)(T * H) * sizeof(float));
	if (!drow)
		return -ENOMEM;
#pragma omp parallel for schedule(static)
	for (idx = 0; idx < T * H; idx++) {
		const float *a = dout + idx * D, *b = out + idx * D;
		float s = 0.0f;
		int64_t d;

#pragma omp simd reduction(+:s)
		for (d = 0; d < D; d++)
			s += a[d] * b[d];
		drow[(idx % H) * T + idx / H] = s;
	}
	c.q = q;
	c.k = k;
	c.v = v;
	c.dout = dout;
	c.lse = lse;
	c.drow = drow;
	c.dq = dq;
	c.dk = dk;
	c.dv = dv;
	if (use_fused(dev, &c)) {
		/* longest sequences first */
		nitems = c.nseqs * KV;
#pragma omp parallel for schedule(dynamic, 1)
		for (idx = 0; idx < nitems; idx++)
			dqkv_item(&c, idx);
		return c.err;
	}
	nitems = c.nblks * H;
#pragma omp parallel for schedule(dynamic, 1)
	for (idx = 0; idx < nitems; idx++)
		dq_item(&c, nitems - 1 - idx);
	if (c.err < 0)
		return c.err;
	/* Early key blocks see the most queries: they go first. */
	nitems = c.nblks * KV;
#pragma omp parallel for schedule(dynamic, 1)
	for (idx = 0; idx < nitems; idx++)
		dkv_item(&c, idx);
	return c.err;
}
