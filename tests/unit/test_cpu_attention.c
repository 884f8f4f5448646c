/* test_cpu_attention.c — CPU causal GQA attention over packed sequences:
 * forward against a naive double-precision softmax attention, backward
 * against the naive analytic gradient and central finite differences,
 * sequence isolation, and run-to-run bit-identical backward; the paged
 * key/value cache's kernels (kv_write, attention_paged) against the same
 * reference and attention_fwd.
 *
 * Tolerances (inputs uniform in [-1, 1], fp32 kernel vs double reference):
 *   out, lse:        |err| <= 2e-5 + 1e-4 |want|
 *   dq, dk, dv:      |err| <= 1e-4 * max|grad of that tensor|
 *   vs finite diff.: |err| <= 2e-4 * max|grad| (FD step 1e-4 in double,
 *                    truncation error ~1e-8)
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "device/device.h"
#include "device/cpu/cpu_device.h"
#include "cpu_test_util.h"

/* Which backward the CPU device runs (cpu_device.h): 1 = two passes,
 * 2 = fused; the tests run both. */
static int bwd_path = 1;

struct cfg {
	int B;
	const int *lens;
	int64_t H, KV, D;
};

struct prob {
	struct cfg c;
	int64_t T;
	int32_t *cu;                 /* [B+1], device memory */
	float *q, *k, *v, *dout;     /* device memory */
	float scale;
};

static void prob_init(struct device *dev, struct prob *p, const struct cfg *c)
{
	int b;

	p->c = *c;
	p->T = 0;
	for (b = 0; b < c->B; b++)
		p->T += c->lens[b];
	p->cu = dev->ops->alloc(dev, sizeof(int32_t) * (c->B + 1));
	ck_assert_ptr_nonnull(p->cu);
	p->cu[0] = 0;
	for (b = 0; b < c->B; b++)
		p->cu[b + 1] = p->cu[b] + c->lens[b];
	p->q = tu_falloc(dev, p->T * c->H * c->D);
	p->k = tu_falloc(dev, p->T * c->KV * c->D);
	p->v = tu_falloc(dev, p->T * c->KV * c->D);
	p->dout = tu_falloc(dev, p->T * c->H * c->D);
	tu_fill(p->q, p->T * c->H * c->D, -1.0f, 1.0f);
	tu_fill(p->k, p->T * c->KV * c->D, -1.0f, 1.0f);
	tu_fill(p->v, p->T * c->KV * c->D, -1.0f, 1.0f);
	tu_fill(p->dout, p->T * c->H * c->D, -1.0f, 1.0f);
	p->scale = 1.0f / sqrtf((float)c->D);
}

static void prob_free(struct device *dev, struct prob *p)
{
	dev->ops->free(dev, p->cu);
	dev->ops->free(dev, p->q);
	dev->ops->free(dev, p->k);
	dev->ops->free(dev, p->v);
	dev->ops->free(dev, p->dout);
}

static double *to_double(const float *x, int64_t n)
{
	double *d = malloc(sizeof(double) * (n > 0 ? n : 1));
	int64_t i;

	ck_assert_ptr_nonnull(d);
	for (i = 0; i < n; i++)
		d[i] = x[i];
	return d;
}

/* Naive attention in double. out[T,H,D], lse[H,T] (either may be NULL);
 * returns sum(dout * out) when dout is given. */
static double ref_fwd(const struct prob *p, const double *q, const double *k,
		      const double *v, const float *dout, double *out, double *lse)
{
	const int64_t H = p->c.H, KV = p->c.KV, D = p->c.D, G = H / KV;
	double *s = malloc(sizeof(double) * (p->T + 1)), obj = 0.0;
	int b;

	ck_assert_ptr_nonnull(s);
	for (b = 0; b < p->c.B; b++) {
		int64_t s0 = p->cu[b], s1 = p->cu[b + 1], t, j, h, d;

		for (t = s0; t < s1; t++)
			for (h = 0; h < H; h++) {
				const double *qi = q + (t * H + h) * D;
				double mx = -INFINITY, sum = 0.0;

				for (j = s0; j <= t; j++) {
					const double *kj = k + (j * KV + h / G) * D;
					double dot = 0.0;

					for (d = 0; d < D; d++)
						dot += qi[d] * kj[d];
					s[j - s0] = dot * p->scale;
					mx = fmax(mx, s[j - s0]);
				}
				for (j = s0; j <= t; j++) {
					s[j - s0] = exp(s[j - s0] - mx);
					sum += s[j - s0];
				}
				if (lse)
					lse[h * p->T + t] = mx + log(sum);
				for (d = 0; d < D; d++) {
					double o = 0.0;

					for (j = s0; j <= t; j++)
						o += s[j - s0] / sum * v[(j * KV + h / G) * D + d];
					if (out)
						out[(t * H + h) * D + d] = o;
					if (dout)
						obj += dout[(t * H + h) * D + d] * o;
				}
			}
	}
	free(s);
	return obj;
}

/* Naive analytic backward in double (D_i = sum_j P_ij dP_ij, not
 * rowsum(dout * out), so it does not share the kernel's shortcut). */
static void ref_bwd(const struct prob *p, const double *q, const double *k,
		    const double *v, double *dq, double *dk, double *dv)
{
	const int64_t H = p->c.H, KV = p->c.KV, D = p->c.D, G = H / KV;
	double *P = malloc(sizeof(double) * (p->T + 1));
	double *dP = malloc(sizeof(double) * (p->T + 1));
	int b;

	ck_assert_ptr_nonnull(P);
	ck_assert_ptr_nonnull(dP);
	memset(dq, 0, sizeof(double) * p->T * H * D);
	memset(dk, 0, sizeof(double) * p->T * KV * D);
	memset(dv, 0, sizeof(double) * p->T * KV * D);
	for (b = 0; b < p->c.B; b++) {
		int64_t s0 = p->cu[b], s1 = p->cu[b + 1], t, j, h, d;

		for (t = s0; t < s1; t++)
			for (h = 0; h < H; h++) {
				const double *qi = q + (t * H + h) * D;
				const float *go = p->dout + (t * H + h) * D;
				double mx = -INFINITY, sum = 0.0, Di = 0.0;

				for (j = s0; j <= t; j++) {
					const double *kj = k + (j * KV + h / G) * D;
					const double *vj = v + (j * KV + h / G) * D;
					double dot = 0.0, dd = 0.0;

					for (d = 0; d < D; d++) {
						dot += qi[d] * kj[d];
						dd += go[d] * vj[d];
					}
					P[j - s0] = dot * p->scale;
					dP[j - s0] = dd;
					mx = fmax(mx, P[j - s0]);
				}
				for (j = s0; j <= t; j++) {
					P[j - s0] = exp(P[j - s0] - mx);
					sum += P[j - s0];
				}
				for (j = s0; j <= t; j++) {
					P[j - s0] /= sum;
					Di += P[j - s0] * dP[j - s0];
				}
				for (j = s0; j <= t; j++) {
					double pj = P[j - s0], ds = pj * (dP[j - s0] - Di);
					double *dkj = dk + (j * KV + h / G) * D;
					double *dvj = dv + (j * KV + h / G) * D;
					const double *kj = k + (j * KV + h / G) * D;

					for (d = 0; d < D; d++) {
						dq[(t * H + h) * D + d] += p->scale * ds * kj[d];
						dkj[d] += p->scale * ds * qi[d];
						dvj[d] += pj * go[d];
					}
				}
			}
	}
	free(P);
	free(dP);
}

struct grads {
	float *out, *lse, *dq, *dk, *dv;
};

static void run_device(struct device *dev, const struct prob *p, struct grads *g)
{
	const int64_t T = p->T, H = p->c.H, KV = p->c.KV, D = p->c.D;

	g->out = tu_falloc(dev, T * H * D);
	g->lse = tu_falloc(dev, H * T);
	g->dq = tu_falloc(dev, T * H * D);
	g->dk = tu_falloc(dev, T * KV * D);
	g->dv = tu_falloc(dev, T * KV * D);
	cpu_dev(dev)->attn_bwd_path = bwd_path;
	ck_assert_int_eq(dev->k->attention_fwd(dev, g->out, g->lse, p->q, p->k, p->v,
					       p->cu, p->c.B, T, H, KV, D, p->scale), 0);
	ck_assert_int_eq(dev->k->attention_bwd(dev, g->dq, g->dk, g->dv, p->dout,
					       p->q, p->k, p->v, g->out, g->lse,
					       p->cu, p->c.B, T, H, KV, D, p->scale), 0);
}

static void grads_free(struct device *dev, struct grads *g)
{
	dev->ops->free(dev, g->out);
	dev->ops->free(dev, g->lse);
	dev->ops->free(dev, g->dq);
	dev->ops->free(dev, g->dk);
	dev->ops->free(dev, g->dv);
}

/* Forward and backward of the device against the naive reference. */
static void check_against_ref(struct device *dev, const struct cfg *c)
{
	struct prob p;
	struct grads g;
	double *q, *k, *v, *out, *lse, *dq, *dk, *dv, e;
	int64_t nq, nkv;

	prob_init(dev, &p, c);
	nq = p.T * c->H * c->D;
	nkv = p.T * c->KV * c->D;
	run_device(dev, &p, &g);
	q = to_double(p.q, nq);
	k = to_double(p.k, nkv);
	v = to_double(p.v, nkv);
	out = malloc(sizeof(double) * nq);
	lse = malloc(sizeof(double) * c->H * p.T);
	dq = malloc(sizeof(double) * nq);
	dk = malloc(sizeof(double) * nkv);
	dv = malloc(sizeof(double) * nkv);
	ref_fwd(&p, q, k, v, NULL, out, lse);
	ref_bwd(&p, q, k, v, dq, dk, dv);

	e = tu_err_f(g.out, out, nq, 2e-5, 1e-4);
	ck_assert_msg(e <= 1.0, "D=%ld out err %g", (long)c->D, e);
	e = tu_err_f(g.lse, lse, c->H * p.T, 2e-5, 1e-4);
	ck_assert_msg(e <= 1.0, "D=%ld lse err %g", (long)c->D, e);
	e = tu_err_f(g.dq, dq, nq, 1e-4 * tu_maxabs(dq, nq), 0.0);
	ck_assert_msg(e <= 1.0, "path %d D=%ld dq err %g", bwd_path, (long)c->D, e);
	e = tu_err_f(g.dk, dk, nkv, 1e-4 * tu_maxabs(dk, nkv), 0.0);
	ck_assert_msg(e <= 1.0, "path %d D=%ld dk err %g", bwd_path, (long)c->D, e);
	e = tu_err_f(g.dv, dv, nkv, 1e-4 * tu_maxabs(dv, nkv), 0.0);
	ck_assert_msg(e <= 1.0, "path %d D=%ld dv err %g", bwd_path, (long)c->D, e);

	free(q);
	free(k);
	free(v);
	free(out);
	free(lse);
	free(dq);
	free(dk);
	free(dv);
	grads_free(dev, &g);
	prob_free(dev, &p);
}

/* Several packed sequences: a long one crossing the kernel's 64-position
 * blocks, one of length 1, an empty one; GQA with 2 query heads per kv
 * head; D = 16. */
static const int lens_main[] = { 70, 1, 5, 0, 20 };
static const struct cfg cfg_main = { 5, lens_main, 4, 2, 16 };

START_TEST(attention_vs_reference)
{
	struct device *dev = tu_open(2, MATMUL_FP32);
	static const int lens_b[] = { 130, 67 };
	static const int lens_c[] = { 65, 3 };
	static const struct cfg more[] = {
		{ 2, lens_b, 2, 1, 64 },    /* D = 64, three 64-position blocks */
		{ 2, lens_c, 4, 4, 48 },    /* D = 48, one kv head per head */
		{ 2, lens_c, 2, 2, 20 },    /* D = 20, not a multiple of 16 */
		{ 2, lens_c, 2, 1, 128 },   /* D = 128 */
	};
	size_t i;

	bwd_path = _i;

	tu_seed(10);
	check_against_ref(dev, &cfg_main);
	for (i = 0; i < sizeof(more) / sizeof(more[0]); i++)
		check_against_ref(dev, &more[i]);
	tu_close(dev);
}
END_TEST

/* d/dx sum(dout * out) by central differences of the double reference at
 * random entries of q, k and v. */
START_TEST(attention_finite_differences)
{
	struct device *dev = tu_open(2, MATMUL_FP32);
	struct prob p;
	struct grads g;
	const double h = 1e-4;
	int which, s;

	bwd_path = _i;

	tu_seed(11);
	prob_init(dev, &p, &cfg_main);
	run_device(dev, &p, &g);
	for (which = 0; which < 3; which++) {
		int64_t n = p.T * (which == 0 ? p.c.H : p.c.KV) * p.c.D;
		const float *src = which == 0 ? p.q : which == 1 ? p.k : p.v;
		const float *grad = which == 0 ? g.dq : which == 1 ? g.dk : g.dv;
		double *q = to_double(p.q, p.T * p.c.H * p.c.D);
		double *k = to_double(p.k, p.T * p.c.KV * p.c.D);
		double *v = to_double(p.v, p.T * p.c.KV * p.c.D);
		double *x = which == 0 ? q : which == 1 ? k : v;
		double gmax = 0.0;
		int64_t i;

		for (i = 0; i < n; i++)
			gmax = fmax(gmax, fabs(grad[i]));
		ck_assert(gmax > 0.0);
		for (s = 0; s < 40; s++) {
			double fp, fm, fd;

			i = (int64_t)(tu_u64() % (uint64_t)n);
			x[i] = (double)src[i] + h;
			fp = ref_fwd(&p, q, k, v, p.dout, NULL, NULL);
			x[i] = (double)src[i] - h;
			fm = ref_fwd(&p, q, k, v, p.dout, NULL, NULL);
			x[i] = src[i];
			fd = (fp - fm) / (2 * h);
			ck_assert_msg(fabs(fd - grad[i]) <= 2e-4 * gmax,
				      "tensor %d [%ld]: fd %g kernel %g", which,
				      (long)i, fd, (double)grad[i]);
		}
		free(q);
		free(k);
		free(v);
	}
	grads_free(dev, &g);
	prob_free(dev, &p);
	tu_close(dev);
}
END_TEST

/* Changing every input of one sequence leaves every output of the others
 * bit-identical (forward and backward), in both directions. */
START_TEST(attention_sequence_isolation)
{
	struct device *dev = tu_open(2, MATMUL_FP32);
	const int64_t H = cfg_main.H, KV = cfg_main.KV, D = cfg_main.D;
	struct prob p;
	struct grads a, b;
	int target;

	bwd_path = _i;

	tu_seed(12);
	prob_init(dev, &p, &cfg_main);
	for (target = 0; target < 2; target++) {
		int64_t lo = p.cu[target], hi = p.cu[target + 1], t, h;

		run_device(dev, &p, &a);
		tu_fill(p.q + lo * H * D, (hi - lo) * H * D, -2.0f, 2.0f);
		tu_fill(p.k + lo * KV * D, (hi - lo) * KV * D, -2.0f, 2.0f);
		tu_fill(p.v + lo * KV * D, (hi - lo) * KV * D, -2.0f, 2.0f);
		tu_fill(p.dout + lo * H * D, (hi - lo) * H * D, -2.0f, 2.0f);
		run_device(dev, &p, &b);
		for (t = 0; t < p.T; t++) {
			bool inside = t >= lo && t < hi;

			if (inside)
				continue;
			ck_assert_mem_eq(a.out + t * H * D, b.out + t * H * D, sizeof(float) * H * D);
			ck_assert_mem_eq(a.dq + t * H * D, b.dq + t * H * D, sizeof(float) * H * D);
			ck_assert_mem_eq(a.dk + t * KV * D, b.dk + t * KV * D, sizeof(float) * KV * D);
			ck_assert_mem_eq(a.dv + t * KV * D, b.dv + t * KV * D, sizeof(float) * KV * D);
			for (h = 0; h < H; h++)
				ck_assert_mem_eq(&a.lse[h * p.T + t], &b.lse[h * p.T + t], sizeof(float));
		}
		/* and the changed sequence did change */
		ck_assert(memcmp(a.out + lo * H * D, b.out + lo * H * D, sizeof(float) * H * D) != 0);
		grads_free(dev, &a);
		grads_free(dev, &b);
	}
	prob_free(dev, &p);
	tu_close(dev);
}
END_TEST

/* The backward is bit-identical run after run (no atomics, fixed order),
 * also with its inputs at other (misaligned) addresses. */
START_TEST(attention_bwd_deterministic)
{
	struct device *dev = tu_open(2, MATMUL_FP32);
	static const int lens[] = { 200, 1, 77 };
	static const struct cfg c = { 3, lens, 4, 2, 64 };
	const int64_t H = c.H, KV = c.KV, D = c.D;
	struct prob p;
	struct grads a;
	float *dq = NULL, *dk = NULL, *dv = NULL;
	int run;

	bwd_path = _i;

	tu_seed(13);
	prob_init(dev, &p, &c);
	run_device(dev, &p, &a);
	for (run = 0; run < 3; run++) {
		float *x = tu_falloc(dev, p.T * H * D), *y = tu_falloc(dev, p.T * KV * D);
		float *z = tu_falloc(dev, p.T * KV * D);

		if (run < 2) {
			ck_assert_int_eq(dev->k->attention_bwd(dev, x, y, z, p.dout, p.q, p.k,
							       p.v, a.out, a.lse, p.cu, c.B,
							       p.T, H, KV, D, p.scale), 0);
		} else {
			/* copies of every input one float past a 64-byte boundary */
			const int64_t nq = p.T * H * D, nk = p.T * KV * D;
			float *cp = tu_falloc(dev, 3 * nq + 2 * nk + H * p.T + 8);
			float *q2 = cp + 1, *d2 = q2 + nq, *o2 = d2 + nq;
			float *k2 = o2 + nq, *v2 = k2 + nk, *l2 = v2 + nk;

			memcpy(q2, p.q, sizeof(float) * nq);
			memcpy(d2, p.dout, sizeof(float) * nq);
			memcpy(o2, a.out, sizeof(float) * nq);
			memcpy(k2, p.k, sizeof(float) * nk);
			memcpy(v2, p.v, sizeof(float) * nk);
			memcpy(l2, a.lse, sizeof(float) * H * p.T);
			ck_assert_int_eq(dev->k->attention_bwd(dev, x, y, z, d2, q2, k2, v2,
							       o2, l2, p.cu, c.B, p.T,
							       H, KV, D, p.scale), 0);
			dev->ops->free(dev, cp);
		}
		ck_assert_mem_eq(x, a.dq, sizeof(float) * p.T * H * D);
		ck_assert_mem_eq(y, a.dk, sizeof(float) * p.T * KV * D);
		ck_assert_mem_eq(z, a.dv, sizeof(float) * p.T * KV * D);
		dev->ops->free(dev, dq);
		dev->ops->free(dev, dk);
		dev->ops->free(dev, dv);
		dq = x;
		dk = y;
		dv = z;
	}
	dev->ops->free(dev, dq);
	dev->ops->free(dev, dk);
	dev->ops->free(dev, dv);
	grads_free(dev, &a);
	prob_free(dev, &p);
	tu_close(dev);
}
END_TEST

/* The paged cache's kernels: every token's keys and values written into
 * blocks of 16 positions taken in a scrambled order (kv_write), then each
 * token attending over its sequence's cached positions (attention_paged),
 * against the double reference (the forward's tolerance) and against
 * attention_fwd itself (1e-6 of the output's scale: the same sums in
 * another order). */
static void check_paged(struct device *dev, const struct cfg *c)
{
	const int64_t BLK16 = 16, KV = c->KV, D = c->D, H = c->H;
	struct prob p;
	int64_t nblocks = 0, ntab = 0, t = 0;
	int32_t *tables, *toff, *slots, *pos;
	float *kc, *vc, *out, *full, *lse;
	double *q, *k, *v, *want, e;

	prob_init(dev, &p, c);
	for (int b = 0; b < c->B; b++)
		nblocks += (c->lens[b] + BLK16 - 1) / BLK16;
	tables = malloc(sizeof(int32_t) * (nblocks + 1));
	toff = malloc(sizeof(int32_t) * (p.T + 1));
	slots = malloc(sizeof(int32_t) * (p.T + 1));
	pos = malloc(sizeof(int32_t) * (p.T + 1));
	ck_assert(tables && toff && slots && pos);
	for (int64_t i = 0; i < nblocks; i++)   /* block i of the list is (7 i + 3) mod n */
		tables[i] = (int32_t)((7 * i + 3) % nblocks);
	if (nblocks % 7 == 0)
		for (int64_t i = 0; i < nblocks; i++)
			tables[i] = (int32_t)(nblocks - 1 - i);
	for (int b = 0; b < c->B; b++) {
		for (int j = 0; j < c->lens[b]; j++, t++) {
			toff[t] = (int32_t)ntab;
			pos[t] = j;
			slots[t] = tables[ntab + j / BLK16] * (int32_t)BLK16 + j % BLK16;
		}
		ntab += (c->lens[b] + BLK16 - 1) / BLK16;
	}
	kc = tu_falloc(dev, (nblocks + 1) * BLK16 * KV * D);
	vc = tu_falloc(dev, (nblocks + 1) * BLK16 * KV * D);
	out = tu_falloc(dev, p.T * H * D);
	full = tu_falloc(dev, p.T * H * D);
	lse = tu_falloc(dev, H * p.T);
	ck_assert_int_eq(dev->k->kv_write(dev, kc, vc, p.k, p.v, slots, p.T, KV, D), 0);
	ck_assert_int_eq(dev->k->attention_paged(dev, out, p.q, kc, vc, tables, toff, pos, p.T,
						 H, KV, D, BLK16, p.scale), 0);
	ck_assert_int_eq(dev->k->attention_fwd(dev, full, lse, p.q, p.k, p.v, p.cu, c->B, p.T,
					       H, KV, D, p.scale), 0);
	q = to_double(p.q, p.T * H * D);
	k = to_double(p.k, p.T * KV * D);
	v = to_double(p.v, p.T * KV * D);
	want = malloc(sizeof(double) * (p.T * H * D + 1));
	ck_assert_ptr_nonnull(want);
	ref_fwd(&p, q, k, v, NULL, want, NULL);
	e = tu_err_f(out, want, p.T * H * D, 2e-5, 1e-4);
	ck_assert_msg(e <= 1.0, "D=%ld paged out err %g", (long)D, e);
	for (int64_t i = 0; i < p.T * H * D; i++)
		want[i] = full[i];
	e = tu_err_f(out, want, p.T * H * D, 1e-6, 0.0);
	ck_assert_msg(e <= 1.0, "D=%ld paged vs attention_fwd err %g", (long)D, e);
	free(q);
	free(k);
	free(v);
	free(want);
	free(tables);
	free(toff);
	free(slots);
	free(pos);
	dev->ops->free(dev, kc);
	dev->ops->free(dev, vc);
	dev->ops->free(dev, out);
	dev->ops->free(dev, full);
	dev->ops->free(dev, lse);
	prob_free(dev, &p);
}

START_TEST(attention_paged_vs_full)
{
	struct device *dev = tu_open(2, MATMUL_FP32);
	static const int lens_b[] = { 130, 67 };
	static const int lens_c[] = { 65, 3, 16, 17 };
	static const struct cfg more[] = {
		{ 2, lens_b, 2, 1, 64 },
		{ 4, lens_c, 4, 4, 48 },
		{ 4, lens_c, 2, 2, 20 },
		{ 4, lens_c, 2, 1, 128 },
	};

	tu_seed(12);
	check_paged(dev, &cfg_main);
	for (size_t i = 0; i < sizeof(more) / sizeof(more[0]); i++)
		check_paged(dev, &more[i]);
	tu_close(dev);
}
END_TEST

START_TEST(attention_bad_arguments)
{
	struct device *dev = tu_open(2, MATMUL_FP32);
	int32_t cu_bad[3] = { 0, 5, 4 }, cu_ok[2] = { 0, 4 };
	float buf[4 * 3 * 16], lse[3 * 4];

	memset(buf, 0, sizeof(buf));
	ck_assert_int_eq(dev->k->attention_fwd(dev, buf, lse, buf, buf, buf, cu_bad, 2, 4,
					       1, 1, 16, 0.25f), -EINVAL);
	ck_assert_int_eq(dev->k->attention_fwd(dev, buf, lse, buf, buf, buf, cu_ok, 1, 5,
					       1, 1, 16, 0.25f), -EINVAL);
	ck_assert_int_eq(dev->k->attention_fwd(dev, buf, lse, buf, buf, buf, cu_ok, 1, 4,
					       3, 2, 16, 0.25f), -EINVAL);
	ck_assert_int_eq(dev->k->attention_fwd(dev, buf, lse, buf, buf, buf, cu_ok, 1, 4,
					       3, 3, 16, 0.25f), 0);
	tu_close(dev);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("cpu_attention");
	TCase *tc = tcase_create("core");
	int failed = 0;

	tcase_set_timeout(tc, 60);
	/* loop index = backward path: 0 auto, 1 two passes, 2 fused */
	tcase_add_loop_test(tc, attention_vs_reference, 0, 3);
	tcase_add_loop_test(tc, attention_finite_differences, 1, 3);
	tcase_add_loop_test(tc, attention_sequence_isolation, 1, 3);
	tcase_add_loop_test(tc, attention_bwd_deterministic, 1, 3);
	tcase_add_test(tc, attention_paged_vs_full);
	tcase_add_test(tc, attention_bad_arguments);
	suite_add_tcase(s, tc);
	tu_run(s, &failed);
	return failed ? 1 : 0;
}
