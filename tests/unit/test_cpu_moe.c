/* test_cpu_moe.c — the CPU device's mixture-of-experts kernels (device.h,
 * cpu_moe.c): the router's softmax and top-k against a naive double loop,
 * its backward against central finite differences (step 1e-6, in double)
 * of sum(dw * w(z)) (+ sum(aux * p(z)), the auxiliary loss's share) with
 * the choices held (the logits are drawn far enough
 * apart that no step changes them); the gather exact; the combine and its
 * backward against double loops, the combine's terms in ascending row
 * order (transformers' order: by expert); a forced (replayed) routing
 * keeps its ids and weighs them by the live probabilities; the shared
 * expert's sigmoid gate against a double loop and finite differences. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "device/device.h"
#include "cpu_test_util.h"

#define T 37
#define E 8
#define K 3
#define C 24

/* The router's weights of one row in double: softmax, the k largest
 * (strictly: ties never occur here), renormalised when norm. */
static void ref_route(const double *z, bool norm, int32_t *idx, double *w, double *p)
{
	double mx = z[0], s = 0.0, top = 0.0;

	for (int e = 1; e < E; e++)
		mx = z[e] > mx ? z[e] : mx;
	for (int e = 0; e < E; e++)
		s += (p[e] = exp(z[e] - mx));
	for (int e = 0; e < E; e++)
		p[e] /= s;
	for (int j = 0; j < K; j++) {
		int best = -1;

		for (int e = 0; e < E; e++) {
			bool taken = false;

			for (int i = 0; i < j; i++)
				taken |= idx[i] == e;
			if (!taken && (best < 0 || p[e] > p[best]))
				best = e;
		}
		idx[j] = best;
		top += p[best];
	}
	for (int j = 0; j < K; j++)
		w[j] = norm ? p[idx[j]] / top : p[idx[j]];
}

/* Logits whose sorted values are at least 0.05 apart: a permutation of
 * E levels plus a little noise, so that top-k is unambiguous. */
static void draw_logits(float *z)
{
	for (int t = 0; t < T; t++) {
		int perm[E];

		for (int e = 0; e < E; e++)
			perm[e] = e;
		for (int e = E - 1; e > 0; e--) {
			int r = (int)(tu_u64() % (uint64_t)(e + 1)), x = perm[e];

			perm[e] = perm[r];
			perm[r] = x;
		}
		for (int e = 0; e < E; e++)
			z[t * E + e] = 0.3f * (float)perm[e] - 1.0f + 0.01f * (float)(tu_u64() % 5);
	}
}

START_TEST(route)
{
	struct device *dev = tu_open(2, MATMUL_FP32);
	float *probs = tu_falloc(dev, T * E), *w = tu_falloc(dev, T * K);
	float *dw = tu_falloc(dev, T * K), *dz = tu_falloc(dev, T * E), *z = tu_falloc(dev, T * E);
	float *aux = tu_falloc(dev, E);
	int32_t *idx = dev->ops->alloc(dev, T * K * sizeof(int32_t));

	tu_seed(31);
	for (int norm = 0; norm < 2; norm++) {
		draw_logits(z);
		memcpy(probs, z, T * E * sizeof(float));
		tu_fill(dw, T * K, -1.0f, 1.0f);
		ck_assert_int_eq(dev->k->moe_route_fwd(dev, probs, idx, w, T, E, K, norm, false),
				 0);
		tu_fill(aux, E, -0.5f, 0.5f);
		ck_assert_int_eq(dev->k->moe_route_bwd(dev, dz, dw, probs, idx, w, norm ? aux : NULL,
						       T, E, K, norm), 0);
		for (int t = 0; t < T; t++) {
			double zd[E], p[E], wr[K], wp[K], wm[K], scale = 0.0;
			int32_t ir[K], ip[K];

			for (int e = 0; e < E; e++)
				zd[e] = z[t * E + e];
			ref_route(zd, norm, ir, wr, p);
			for (int e = 0; e < E; e++)
				ck_assert(fabs(probs[t * E + e] - p[e]) <= 1e-6);
			for (int j = 0; j < K; j++) {
				ck_assert_int_eq(idx[t * K + j], ir[j]);
				ck_assert(fabs(w[t * K + j] - wr[j]) <= 1e-6);
			}
			for (int e = 0; e < E; e++)
				scale = fmax(scale, fabs(dz[t * E + e]));
			for (int e = 0; e < E; e++) {
				double fd = 0.0;

				zd[e] += 1e-6;
				ref_route(zd, norm, ip, wp, p);
				zd[e] -= 2e-6;
				ref_route(zd, norm, ip, wm, p);
				zd[e] += 1e-6;
				for (int j = 0; j < K; j++)
					fd += dw[t * K + j] * (wp[j] - wm[j]) / 2e-6;
				/* with aux: sum_e aux_e p_e(z) too */
				if (norm) {
					double pp[E], pm[E];

					zd[e] += 1e-6;
					ref_route(zd, norm, ip, wp, pp);
					zd[e] -= 2e-6;
					ref_route(zd, norm, ip, wm, pm);
					zd[e] += 1e-6;
					for (int q = 0; q < E; q++)
						fd += aux[q] * (pp[q] - pm[q]) / 2e-6;
				}
				ck_assert_msg(fabs(dz[t * E + e] - fd) <= 1e-5 * scale + 1e-7,
					      "norm %d t %d e %d: dz %g, finite differences %g",
					      norm, t, e, dz[t * E + e], fd);
			}
		}
	}
	dev->ops->free(dev, idx);
	dev->ops->free(dev, aux);
	dev->ops->free(dev, probs);
	dev->ops->free(dev, w);
	dev->ops->free(dev, dw);
	dev->ops->free(dev, dz);
	dev->ops->free(dev, z);
	tu_close(dev);
}
END_TEST

/* A forced choice (routing replay): the k least likely experts, in a
 * row-dependent order, kept as given and weighed by their probabilities. */
START_TEST(route_forced)
{
	struct device *dev = tu_open(2, MATMUL_FP32);
	float *probs = tu_falloc(dev, T * E), *w = tu_falloc(dev, T * K), *z = tu_falloc(dev, T * E);
	int32_t *idx = dev->ops->alloc(dev, T * K * sizeof(int32_t)), forced[T * K];

	tu_seed(37);
	for (int norm = 0; norm < 2; norm++) {
		draw_logits(z);
		memcpy(probs, z, T * E * sizeof(float));
		for (int t = 0; t < T; t++)
			for (int j = 0; j < K; j++)
				forced[t * K + j] = idx[t * K + j] = (int32_t)((t + j * 3) % E);
		ck_assert_int_eq(dev->k->moe_route_fwd(dev, probs, idx, w, T, E, K, norm, true),
				 0);
		for (int t = 0; t < T; t++) {
			double zd[E], p[E], wr[K], top = 0.0;
			int32_t ir[K];

			for (int e = 0; e < E; e++)
				zd[e] = z[t * E + e];
			ref_route(zd, norm, ir, wr, p);
			for (int j = 0; j < K; j++)
				top += p[forced[t * K + j]];
			for (int j = 0; j < K; j++) {
				double want = norm ? p[forced[t * K + j]] / top : p[forced[t * K + j]];

				ck_assert_int_eq(idx[t * K + j], forced[t * K + j]);
				ck_assert(fabs(w[t * K + j] - want) <= 1e-6);
			}
		}
	}
	dev->ops->free(dev, idx);
	dev->ops->free(dev, probs);
	dev->ops->free(dev, w);
	dev->ops->free(dev, z);
	tu_close(dev);
}
END_TEST

/* out += sigmoid(z) y per row; dy = s dout, dz = d/dz sum(dout . s y). */
START_TEST(sigmoid_gate)
{
	struct device *dev = tu_open(2, MATMUL_FP32);
	float *out = tu_falloc(dev, T * C), *base = tu_falloc(dev, T * C), *y = tu_falloc(dev, T * C);
	float *z = tu_falloc(dev, T), *dout = tu_falloc(dev, T * C), *dy = tu_falloc(dev, T * C);
	float *dz = tu_falloc(dev, T);

	tu_seed(41);
	tu_fill(base, T * C, -1.0f, 1.0f);
	tu_fill(y, T * C, -1.0f, 1.0f);
	tu_fill(z, T, -3.0f, 3.0f);
	tu_fill(dout, T * C, -1.0f, 1.0f);
	memcpy(out, base, T * C * sizeof(float));
	ck_assert_int_eq(dev->k->sigmoid_gate_fwd(dev, out, z, y, T, C), 0);
	ck_assert_int_eq(dev->k->sigmoid_gate_bwd(dev, dy, dz, dout, z, y, T, C), 0);
	for (int t = 0; t < T; t++) {
		double s = 1.0 / (1.0 + exp(-(double)z[t])), fd = 0.0;

		for (int c = 0; c < C; c++) {
			double sp = 1.0 / (1.0 + exp(-((double)z[t] + 1e-6)));
			double sm = 1.0 / (1.0 + exp(-((double)z[t] - 1e-6)));

			ck_assert(fabs(out[t * C + c] - (base[t * C + c] + s * y[t * C + c])) <= 1e-6);
			ck_assert(fabs(dy[t * C + c] - s * dout[t * C + c]) <= 1e-6);
			fd += dout[t * C + c] * y[t * C + c] * (sp - sm) / 2e-6;
		}
		ck_assert_msg(fabs(dz[t] - fd) <= 1e-5, "t %d: dz %g, finite differences %g", t,
			      dz[t], fd);
	}
	ck_assert_int_eq(dev->k->sigmoid_gate_fwd(dev, out, z, y, -1, C), -EINVAL);
	dev->ops->free(dev, out);
	dev->ops->free(dev, base);
	dev->ops->free(dev, y);
	dev->ops->free(dev, z);
	dev->ops->free(dev, dout);
	dev->ops->free(dev, dy);
	dev->ops->free(dev, dz);
	tu_close(dev);
}
END_TEST

START_TEST(gather_and_combine)
{
	struct device *dev = tu_open(2, MATMUL_FP32);
	const int64_t R = T * K;
	float *x = tu_falloc(dev, T * C), *xg = tu_falloc(dev, R * C), *y = tu_falloc(dev, R * C);
	float *w = tu_falloc(dev, T * K), *out = tu_falloc(dev, T * C), *dout = tu_falloc(dev, T * C);
	float *dy = tu_falloc(dev, R * C), *dw = tu_falloc(dev, T * K);
	int32_t *pos = dev->ops->alloc(dev, R * sizeof(int32_t));
	int32_t *tok = dev->ops->alloc(dev, R * sizeof(int32_t));

	tu_seed(37);
	tu_fill(x, T * C, -1.0f, 1.0f);
	tu_fill(y, R * C, -1.0f, 1.0f);
	tu_fill(w, T * K, 0.0f, 1.0f);
	tu_fill(dout, T * C, -1.0f, 1.0f);
	/* each token's k rows, scattered: row r of choice (t, j) */
	for (int64_t i = 0; i < R; i++)
		pos[i] = (int32_t)((i * 7 + 3) % R);
	for (int64_t i = 0; i < R; i++)
		tok[pos[i]] = (int32_t)(i / K);
	ck_assert_int_eq(dev->k->rows_gather(dev, xg, x, tok, R, C), 0);
	for (int64_t r = 0; r < R; r++)
		ck_assert(!memcmp(xg + r * C, x + tok[r] * C, C * sizeof(float)));
	for (int weighted = 0; weighted < 2; weighted++) {
		const float *wt = weighted ? w : NULL;

		ck_assert_int_eq(dev->k->moe_combine(dev, out, y, pos, wt, T, K, C), 0);
		for (int t = 0; t < T; t++)
			for (int c = 0; c < C; c++) {
				double want = 0.0;

				for (int j = 0; j < K; j++)
					want += (wt ? wt[t * K + j] : 1.0) *
						y[(int64_t)pos[t * K + j] * C + c];
				ck_assert(fabs(out[t * C + c] - want) <= 1e-6);
			}
	}
	ck_assert_int_eq(dev->k->moe_combine_bwd(dev, dy, dw, dout, y, pos, w, T, K, C), 0);
	for (int t = 0; t < T; t++)
		for (int j = 0; j < K; j++) {
			int64_t r = pos[t * K + j];
			double dot = 0.0;

			for (int c = 0; c < C; c++) {
				ck_assert(dy[r * C + c] == w[t * K + j] * dout[t * C + c]);
				dot += (double)dout[t * C + c] * y[r * C + c];
			}
			ck_assert(fabs(dw[t * K + j] - dot) <= 1e-5);
		}
	/* bad shapes are refused */
	ck_assert_int_eq(dev->k->moe_route_fwd(dev, y, pos, w, T, E, E + 1, false, false),
			 -EINVAL);
	ck_assert_int_eq(dev->k->moe_combine(dev, out, y, pos, w, -1, K, C), -EINVAL);
	dev->ops->free(dev, pos);
	dev->ops->free(dev, tok);
	dev->ops->free(dev, x);
	dev->ops->free(dev, xg);
	dev->ops->free(dev, y);
	dev->ops->free(dev, w);
	dev->ops->free(dev, out);
	dev->ops->free(dev, dout);
	dev->ops->free(dev, dy);
	dev->ops->free(dev, dw);
	tu_close(dev);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("cpu_moe");
	TCase *tc = tcase_create("core");
	int failed = 0;

	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, route);
	tcase_add_test(tc, route_forced);
	tcase_add_test(tc, sigmoid_gate);
	tcase_add_test(tc, gather_and_combine);
	suite_add_tcase(s, tc);
	tu_run(s, &failed);
	return failed ? 1 : 0;
}
