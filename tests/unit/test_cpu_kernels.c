/* test_cpu_kernels.c — CPU embedding, RMSNorm, RoPE, SwiGLU, bias, axpby
 * and fused log-prob/entropy kernels. Each forward is checked against a
 * naive double-precision loop written here; each backward against the
 * naive analytic gradient and against central finite differences (step
 * 1e-4, in double) of the scalar sum(dout * f(x)) computed by the naive
 * forward. Tolerances are stated per check; fp32 kernels vs double
 * references are held to about 1e-5 relative. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "device/device.h"
#include "cpu_test_util.h"

#define FD_H 1e-4

static double *dalloc(int64_t n)
{
	double *d = calloc((size_t)(n > 0 ? n : 1), sizeof(double));

	ck_assert_ptr_nonnull(d);
	return d;
}

static double *to_double(const float *x, int64_t n)
{
	double *d = dalloc(n);
	int64_t i;

	for (i = 0; i < n; i++)
		d[i] = x[i];
	return d;
}

/* ---- embedding ---------------------------------------------------------- */

START_TEST(embedding)
{
	struct device *dev = tu_open(2, MATMUL_FP32);
	const int64_t T = 7, C = 70, V = 5;
	int32_t ids[7] = { 3, 0, 3, 4, 1, 3, 0 }, bad[2] = { 1, 5 };
	float *wte = tu_falloc(dev, V * C), *out = tu_falloc(dev, T * C);
	float *dout = tu_falloc(dev, T * C), *dwte = tu_falloc(dev, V * C);
	double *want = dalloc(V * C), *init;
	int64_t t, c, v;

	tu_seed(20);
	tu_fill(wte, V * C, -1.0f, 1.0f);
	tu_fill(dout, T * C, -1.0f, 1.0f);
	tu_fill(dwte, V * C, -1.0f, 1.0f);   /* accumulated into */
	init = to_double(dwte, V * C);
	ck_assert_int_eq(dev->k->embedding_fwd(dev, out, wte, ids, T, C), 0);
	for (t = 0; t < T; t++)
		ck_assert_mem_eq(out + t * C, wte + ids[t] * C, sizeof(float) * C);

	/* dwte[v] += sum over t with ids[t] == v of dout[t]; row 2 unused */
	for (v = 0; v < V * C; v++)
		want[v] = dwte[v];
	for (t = 0; t < T; t++)
		for (c = 0; c < C; c++)
			want[ids[t] * C + c] += dout[t * C + c];
	ck_assert_int_eq(dev->k->embedding_bwd(dev, dwte, dout, ids, T, C, V, -1), 0);
	ck_assert_msg(tu_err_f(dwte, want, V * C, 1e-6, 1e-6) <= 1.0, "dwte");
	/* finite differences of sum(dout * wte[ids]) (double) at one entry
	 * per row: the change of dwte must equal them */
	for (v = 0; v < V; v++) {
		double fd = 0.0, xp, xm;

		c = v * 13 % C;
		xp = (double)wte[v * C + c] + FD_H;
		xm = (double)wte[v * C + c] - FD_H;
		for (t = 0; t < T; t++)
			if (ids[t] == v)
				fd += dout[t * C + c] * (xp - xm) / (2 * FD_H);
		ck_assert_msg(fabs((dwte[v * C + c] - init[v * C + c]) - fd) < 1e-5,
			      "fd v=%ld", (long)v);
	}
	/* a padding id's row takes nothing (transformers' padding_idx) */
	for (v = 0; v < V * C; v++)
		want[v] = dwte[v];
	for (t = 0; t < T; t++)
		for (c = 0; c < C && ids[t] != 3; c++)
			want[ids[t] * C + c] += dout[t * C + c];
	ck_assert_int_eq(dev->k->embedding_bwd(dev, dwte, dout, ids, T, C, V, 3), 0);
	ck_assert_msg(tu_err_f(dwte, want, V * C, 1e-6, 1e-6) <= 1.0, "dwte, padding id 3");
	ck_assert_int_eq(dev->k->embedding_bwd(dev, dwte, dout, bad, 2, C, V, -1), -EINVAL);
	free(want);
	free(init);
	dev->ops->free(dev, wte);
	dev->ops->free(dev, out);
	dev->ops->free(dev, dout);
	dev->ops->free(dev, dwte);
	tu_close(dev);
}
END_TEST

/* ---- rmsnorm ------------------------------------------------------------ */

static double ref_rms_obj(const double *x, const double *w, const float *dout,
			  int64_t R, int64_t C, double eps, double *y, double *rstd)
{
	double obj = 0.0;
	int64_t r, j;

	for (r = 0; r < R; r++) {
		double ss = 0.0, rs;

		for (j = 0; j < C; j++)
			ss += x[r * C + j] * x[r * C + j];
		rs = 1.0 / sqrt(ss / C + eps);
		if (rstd)
			rstd[r] = rs;
		for (j = 0; j < C; j++) {
			double o = x[r * C + j] * rs * w[j];

			if (y)
				y[r * C + j] = o;
			if (dout)
				obj += dout[r * C + j] * o;
		}
	}
	return obj;
}

/* fwd: out, rstd within 1e-5 relative (+1e-6); out aliasing x gives the
 * same bits. bwd (beta_dx 0 over NaN, and 1): dx, dw within 1e-5 of the
 * largest gradient, vs analytic and vs FD. */
START_TEST(rmsnorm)
{
	struct device *dev = tu_open(2, MATMUL_FP32);
	const int64_t R = 5, C = 37;
	const float eps = 1e-5f;
	float *x = tu_falloc(dev, R * C), *w = tu_falloc(dev, C), *out = tu_falloc(dev, R * C);
	float *rstd = tu_falloc(dev, R), *alias = tu_falloc(dev, R * C), *rstd2 = tu_falloc(dev, R);
	float *dout = tu_falloc(dev, R * C), *dx = tu_falloc(dev, R * C), *dw = tu_falloc(dev, C);
	float *dx0 = tu_falloc(dev, R * C), *dw0 = tu_falloc(dev, C);
	double *xd, *wd, *y = dalloc(R * C), *rs = dalloc(R), *gx = dalloc(R * C), *gw = dalloc(C);
	double *want = dalloc(R * C), gmax;
	int64_t r, j, i;
	int beta;

	tu_seed(21);
	tu_fill(x, R * C, -2.0f, 2.0f);
	tu_fill(w, C, 0.5f, 1.5f);
	tu_fill(dout, R * C, -1.0f, 1.0f);
	xd = to_double(x, R * C);
	wd = to_double(w, C);
	ref_rms_obj(xd, wd, NULL, R, C, eps, y, rs);
	ck_assert_int_eq(dev->k->rmsnorm_fwd(dev, out, rstd, x, w, R, C, eps), 0);
	ck_assert_msg(tu_err_f(out, y, R * C, 1e-6, 1e-5) <= 1.0, "out");
	ck_assert_msg(tu_err_f(rstd, rs, R, 1e-6, 1e-5) <= 1.0, "rstd");
	memcpy(alias, x, sizeof(float) * R * C);
	ck_assert_int_eq(dev->k->rmsnorm_fwd(dev, alias, rstd2, alias, w, R, C, eps), 0);
	ck_assert_mem_eq(alias, out, sizeof(float) * R * C);

	/* analytic: dx_j = r w_j g_j - r^3/C x_j sum_i g_i w_i x_i */
	for (r = 0; r < R; r++) {
		double dot = 0.0, rr = rs[r];

		for (j = 0; j < C; j++)
			dot += dout[r * C + j] * wd[j] * xd[r * C + j];
		for (j = 0; j < C; j++) {
			gx[r * C + j] = rr * wd[j] * dout[r * C + j] -
					rr * rr * rr / C * xd[r * C + j] * dot;
			gw[j] += dout[r * C + j] * xd[r * C + j] * rr;
		}
	}
	/* the analytic gradient against FD of the double forward */
	for (i = 0; i < R * C; i += 7) {
		double keep = xd[i], fp, fm;

		xd[i] = keep + FD_H;
		fp = ref_rms_obj(xd, wd, dout, R, C, eps, NULL, NULL);
		xd[i] = keep - FD_H;
		fm = ref_rms_obj(xd, wd, dout, R, C, eps, NULL, NULL);
		xd[i] = keep;
		ck_assert_msg(fabs((fp - fm) / (2 * FD_H) - gx[i]) < 1e-6, "fd dx[%ld]", (long)i);
	}
	for (j = 0; j < C; j += 5) {
		double keep = wd[j], fp, fm;

		wd[j] = keep + FD_H;
		fp = ref_rms_obj(xd, wd, dout, R, C, eps, NULL, NULL);
		wd[j] = keep - FD_H;
		fm = ref_rms_obj(xd, wd, dout, R, C, eps, NULL, NULL);
		wd[j] = keep;
		ck_assert_msg(fabs((fp - fm) / (2 * FD_H) - gw[j]) < 1e-6, "fd dw[%ld]", (long)j);
	}
	for (beta = 0; beta < 2; beta++) {
		if (beta == 0)
			for (i = 0; i < R * C; i++)
				dx[i] = NAN;
		else
			tu_fill(dx, R * C, -1.0f, 1.0f);
		tu_fill(dw, C, -1.0f, 1.0f);
		memcpy(dx0, dx, sizeof(float) * R * C);
		memcpy(dw0, dw, sizeof(float) * C);
		ck_assert_int_eq(dev->k->rmsnorm_bwd(dev, dx, dw, dout, x, w, rstd, R, C,
						     (float)beta), 0);
		for (i = 0; i < R * C; i++)
			want[i] = gx[i] + (beta ? dx0[i] : 0.0);
		gmax = tu_maxabs(want, R * C);
		ck_assert_msg(tu_err_f(dx, want, R * C, 1e-5 * gmax, 0.0) <= 1.0, "dx beta %d", beta);
		for (j = 0; j < C; j++)
			want[j] = gw[j] + dw0[j];
		gmax = tu_maxabs(want, C);
		ck_assert_msg(tu_err_f(dw, want, C, 1e-5 * gmax, 0.0) <= 1.0, "dw beta %d", beta);
	}
	free(xd);
	free(wd);
	free(y);
	free(rs);
	free(gx);
	free(gw);
	free(want);
	dev->ops->free(dev, x);
	dev->ops->free(dev, w);
	dev->ops->free(dev, out);
	dev->ops->free(dev, rstd);
	dev->ops->free(dev, alias);
	dev->ops->free(dev, rstd2);
	dev->ops->free(dev, dout);
	dev->ops->free(dev, dx);
	dev->ops->free(dev, dw);
	dev->ops->free(dev, dx0);
	dev->ops->free(dev, dw0);
	tu_close(dev);
}
END_TEST

/* ---- rope --------------------------------------------------------------- */

/* HF rotate_half in double, with the angle formed in fp32 as HF does. */
static void ref_rope(double *y, const double *x, const int32_t *pos,
		     const float *inv_freq, int64_t T, int64_t NH, int64_t D)
{
	int64_t t, h, i, half = D / 2;

	for (t = 0; t < T; t++)
		for (h = 0; h < NH; h++)
			for (i = 0; i < half; i++) {
				double ang = (float)pos[t] * inv_freq[i];
				const double *a = x + (t * NH + h) * D;
				double *o = y + (t * NH + h) * D;

				o[i] = a[i] * cos(ang) - a[i + half] * sin(ang);
				o[i + half] = a[i + half] * cos(ang) + a[i] * sin(ang);
			}
}

/* forward within 2e-6 absolute of the double reference (|x| < 1; cosf and
 * sinf of the same fp32 angle); inverse(forward(x)) = x within 2e-6;
 * inverse is the backward: FD of sum(dout * rope(x)) within 1e-5. */
START_TEST(rope)
{
	struct device *dev = tu_open(2, MATMUL_FP32);
	const int64_t T = 6, NH = 3, D = 8, n = 6 * 3 * 8;
	int32_t pos[6] = { 0, 1, 5, 100, 7, 2048 };
	float inv_freq[4], *x = tu_falloc(dev, n), *y = tu_falloc(dev, n);
	float *g = tu_falloc(dev, n);
	double *xd, *want = dalloc(n), *tmp = dalloc(n);
	int64_t i, j;

	for (i = 0; i < D / 2; i++)
		inv_freq[i] = (float)(1.0 / pow(10000.0, 2.0 * i / D));
	tu_seed(22);
	tu_fill(x, n, -1.0f, 1.0f);
	memcpy(y, x, sizeof(float) * n);
	xd = to_double(x, n);
	ref_rope(want, xd, pos, inv_freq, T, NH, D);
	ck_assert_int_eq(dev->k->rope(dev, y, pos, inv_freq, T, NH, D, false), 0);
	ck_assert_msg(tu_err_f(y, want, n, 2e-6, 0.0) <= 1.0, "rope fwd");
	ck_assert(fabs(y[0] - x[0]) == 0.0);              /* position 0: identity */
	ck_assert_int_eq(dev->k->rope(dev, y, pos, inv_freq, T, NH, D, true), 0);
	ck_assert_msg(tu_err_f(y, xd, n, 2e-6, 0.0) <= 1.0, "round trip");

	/* backward: g = rope_inverse(dout) vs FD of the double forward */
	tu_fill(g, n, -1.0f, 1.0f);
	memcpy(y, g, sizeof(float) * n);       /* y keeps dout */
	ck_assert_int_eq(dev->k->rope(dev, g, pos, inv_freq, T, NH, D, true), 0);
	for (i = 0; i < n; i += 3) {
		double keep = xd[i], fp = 0.0, fm = 0.0;

		xd[i] = keep + FD_H;
		ref_rope(tmp, xd, pos, inv_freq, T, NH, D);
		for (j = 0; j < n; j++)
			fp += y[j] * tmp[j];
		xd[i] = keep - FD_H;
		ref_rope(tmp, xd, pos, inv_freq, T, NH, D);
		for (j = 0; j < n; j++)
			fm += y[j] * tmp[j];
		xd[i] = keep;
		ck_assert_msg(fabs((fp - fm) / (2 * FD_H) - g[i]) < 1e-5, "rope bwd [%ld]", (long)i);
	}
	ck_assert_int_eq(dev->k->rope(dev, y, pos, inv_freq, T, NH, 7, false), -EINVAL);
	free(xd);
	free(want);
	free(tmp);
	dev->ops->free(dev, x);
	dev->ops->free(dev, y);
	dev->ops->free(dev, g);
	tu_close(dev);
}
END_TEST

/* ---- swiglu ------------------------------------------------------------- */

static double ref_silu(double g)
{
	return g / (1.0 + exp(-g));
}

/* fwd within 1e-5 relative (+1e-6); dgate, dup vs analytic within 1e-5
 * relative (+1e-6) and vs FD within 1e-5 absolute. Saturated gates
 * (+-100) stay finite. */
START_TEST(swiglu)
{
	struct device *dev = tu_open(2, MATMUL_FP32);
	const int64_t n = 1000;
	float *gate = tu_falloc(dev, n), *up = tu_falloc(dev, n), *out = tu_falloc(dev, n);
	float *dout = tu_falloc(dev, n), *dg = tu_falloc(dev, n), *du = tu_falloc(dev, n);
	double *want = dalloc(n), *wg = dalloc(n), *wu = dalloc(n);
	int64_t i;

	tu_seed(23);
	tu_fill(gate, n, -8.0f, 8.0f);
	tu_fill(up, n, -2.0f, 2.0f);
	tu_fill(dout, n, -1.0f, 1.0f);
	gate[0] = -100.0f;
	gate[1] = 100.0f;
	gate[2] = 0.0f;
	for (i = 0; i < n; i++) {
		double g = gate[i], s = 1.0 / (1.0 + exp(-g));

		want[i] = ref_silu(g) * up[i];
		wg[i] = dout[i] * up[i] * s * (1.0 + g * (1.0 - s));
		wu[i] = dout[i] * ref_silu(g);
		/* FD of the double forward checks the analytic form */
		ck_assert(fabs((ref_silu(g + FD_H) - ref_silu(g - FD_H)) / (2 * FD_H) *
			       dout[i] * up[i] - wg[i]) < 1e-6);
		ck_assert(fabs(((ref_silu(g) * (up[i] + FD_H)) - ref_silu(g) * (up[i] - FD_H)) /
			       (2 * FD_H) * dout[i] - wu[i]) < 1e-6);
	}
	ck_assert_int_eq(dev->k->swiglu_fwd(dev, out, gate, up, n), 0);
	ck_assert_msg(tu_err_f(out, want, n, 1e-6, 1e-5) <= 1.0, "swiglu fwd");
	ck_assert(fabs(out[0]) < 1e-30f && out[1] == 100.0f * up[1] && out[2] == 0.0f);
	ck_assert_int_eq(dev->k->swiglu_bwd(dev, dg, du, dout, gate, up, n), 0);
	ck_assert_msg(tu_err_f(dg, wg, n, 1e-6, 1e-5) <= 1.0, "dgate");
	ck_assert_msg(tu_err_f(du, wu, n, 1e-6, 1e-5) <= 1.0, "dup");
	ck_assert(isfinite(dg[0]) && isfinite(dg[1]));
	free(want);
	free(wg);
	free(wu);
	dev->ops->free(dev, gate);
	dev->ops->free(dev, up);
	dev->ops->free(dev, out);
	dev->ops->free(dev, dout);
	dev->ops->free(dev, dg);
	dev->ops->free(dev, du);
	tu_close(dev);
}
END_TEST

/* ---- bias, axpby -------------------------------------------------------- */

/* bias_add exact; bias_bwd (column sums of 33 rows, accumulated) within
 * 1e-5 relative (+1e-6) of double sums, and FD of sum(dout * (x + b)) is
 * the column sum. axpby: b = 0 overwrites NaN; b != 0 within 1e-6. */
START_TEST(bias_and_axpby)
{
	struct device *dev = tu_open(2, MATMUL_FP32);
	const int64_t R = 33, N = 70;
	float *x = tu_falloc(dev, R * N), *x0 = tu_falloc(dev, R * N), *b = tu_falloc(dev, N);
	float *db = tu_falloc(dev, N), *y = tu_falloc(dev, R * N);
	double *want = dalloc(R * N);
	int64_t r, j;

	tu_seed(24);
	tu_fill(x, R * N, -1.0f, 1.0f);
	tu_fill(b, N, -1.0f, 1.0f);
	tu_fill(db, N, -1.0f, 1.0f);
	memcpy(x0, x, sizeof(float) * R * N);
	ck_assert_int_eq(dev->k->bias_add(dev, x, b, R, N), 0);
	for (r = 0; r < R; r++)
		for (j = 0; j < N; j++)
			ck_assert(x[r * N + j] == x0[r * N + j] + b[j]);
	for (j = 0; j < N; j++) {
		double fp = 0.0, fm = 0.0;

		want[j] = db[j];
		for (r = 0; r < R; r++) {
			want[j] += x0[r * N + j];
			fp += x0[r * N + j] * (b[j] + FD_H);
			fm += x0[r * N + j] * (b[j] - FD_H);
		}
		ck_assert(fabs((fp - fm) / (2 * FD_H) - (want[j] - db[j])) < 1e-6);
	}
	ck_assert_int_eq(dev->k->bias_bwd(dev, db, x0, R, N), 0);   /* dout = x0 */
	ck_assert_msg(tu_err_f(db, want, N, 1e-6, 1e-5) <= 1.0, "dbias");

	for (j = 0; j < R * N; j++)
		y[j] = NAN;
	ck_assert_int_eq(dev->k->axpby(dev, y, 0.5f, x0, 0.0f, R * N), 0);
	for (j = 0; j < R * N; j++)
		ck_assert(y[j] == 0.5f * x0[j]);
	ck_assert_int_eq(dev->k->axpby(dev, y, -2.0f, x, 3.0f, R * N), 0);
	for (j = 0; j < R * N; j++)
		want[j] = -2.0 * x[j] + 3.0 * (0.5 * x0[j]);
	ck_assert_msg(tu_err_f(y, want, R * N, 1e-6, 1e-6) <= 1.0, "axpby");
	free(want);
	dev->ops->free(dev, x);
	dev->ops->free(dev, x0);
	dev->ops->free(dev, b);
	dev->ops->free(dev, db);
	dev->ops->free(dev, y);
	tu_close(dev);
}
END_TEST

/* ---- logprob ------------------------------------------------------------ */

/* Naive per-row log-prob and entropy in double. */
static void ref_logprob_row(const double *l, int64_t V, double inv_temp,
			    int32_t target, double *logp, double *ent)
{
	double mx = -INFINITY, s = 0.0, pz = 0.0, lse;
	int64_t j;

	for (j = 0; j < V; j++)
		mx = fmax(mx, l[j] * inv_temp);
	for (j = 0; j < V; j++)
		s += exp(l[j] * inv_temp - mx);
	lse = mx + log(s);
	for (j = 0; j < V; j++)
		pz += exp(l[j] * inv_temp - lse) * l[j] * inv_temp;
	*logp = target >= 0 ? l[target] * inv_temp - lse : 0.0;
	*ent = lse - pz;
}

static double ref_logprob_obj(const double *l, int64_t R, int64_t V,
			      double inv_temp, const int32_t *target,
			      const float *dlogp, const float *dent)
{
	double obj = 0.0, lp, en;
	int64_t r;

	for (r = 0; r < R; r++) {
		ref_logprob_row(l + r * V, V, inv_temp, target[r], &lp, &en);
		obj += dlogp[r] * lp + dent[r] * en;
	}
	return obj;
}

/* Temperature 0.7, rows without target: logp, ent within 1e-5 absolute
 * (+1e-5 relative); dlogits vs analytic within 1e-5 of the largest and vs
 * FD within 2e-5 of it. */
START_TEST(logprob)
{
	struct device *dev = tu_open(2, MATMUL_FP32);
	const int64_t R = 6, V = 1000;
	const float inv_temp = 1.0f / 0.7f;
	int32_t target[6] = { 5, -1, 999, 0, -1, 17 }, bad[6] = { 5, -1, 1000, 0, -1, 17 };
	float *l = tu_falloc(dev, R * V), *logp = tu_falloc(dev, R), *ent = tu_falloc(dev, R);
	float *dlogp = tu_falloc(dev, R), *dent = tu_falloc(dev, R), *logp2 = tu_falloc(dev, R);
	double *ld, *wlp = dalloc(R), *wen = dalloc(R), *grad = dalloc(R * V), gmax;
	int64_t r, j;

	tu_seed(25);
	tu_fill(l, R * V, -10.0f, 10.0f);
	tu_fill(dlogp, R, -1.0f, 1.0f);
	tu_fill(dent, R, -1.0f, 1.0f);
	ld = to_double(l, R * V);
	for (r = 0; r < R; r++)
		ref_logprob_row(ld + r * V, V, inv_temp, target[r], &wlp[r], &wen[r]);
	ck_assert_int_eq(dev->k->logprob_fwd(dev, logp, ent, l, target, R, V, inv_temp), 0);
	ck_assert_msg(tu_err_f(logp, wlp, R, 1e-5, 1e-5) <= 1.0, "logp");
	ck_assert_msg(tu_err_f(ent, wen, R, 1e-5, 1e-5) <= 1.0, "entropy");
	ck_assert(logp[1] == 0.0f && logp[4] == 0.0f && ent[1] > 0.0f);
	ck_assert_int_eq(dev->k->logprob_fwd(dev, logp2, NULL, l, target, R, V, inv_temp), 0);
	ck_assert_mem_eq(logp2, logp, sizeof(float) * R);
	ck_assert_int_eq(dev->k->logprob_fwd(dev, logp, ent, l, bad, R, V, inv_temp), -EINVAL);

	/* analytic: inv_temp (a (onehot - p) - b p (z - sum p z)) */
	for (r = 0; r < R; r++) {
		const double *row = ld + r * V;
		double lse = wlp[r], zbar, a = target[r] >= 0 ? dlogp[r] : 0.0;
		double mx = -INFINITY, s = 0.0;

		for (j = 0; j < V; j++)
			mx = fmax(mx, row[j] * inv_temp);
		for (j = 0; j < V; j++)
			s += exp(row[j] * inv_temp - mx);
		lse = mx + log(s);
		zbar = lse - wen[r];
		for (j = 0; j < V; j++) {
			double z = row[j] * inv_temp, p = exp(z - lse);

			grad[r * V + j] = inv_temp * (a * ((j == target[r]) - p) -
						      dent[r] * p * (z - zbar));
		}
	}
	gmax = tu_maxabs(grad, R * V);
	for (j = 0; j < 40; j++) {
		int64_t i = (int64_t)(tu_u64() % (uint64_t)(R * V));
		double keep = ld[i], fp, fm;

		if (j < 6)
			i = j * V + (target[j] >= 0 ? target[j] : 3);   /* the target entries */
		keep = ld[i];
		ld[i] = keep + FD_H;
		fp = ref_logprob_obj(ld, R, V, inv_temp, target, dlogp, dent);
		ld[i] = keep - FD_H;
		fm = ref_logprob_obj(ld, R, V, inv_temp, target, dlogp, dent);
		ld[i] = keep;
		ck_assert_msg(fabs((fp - fm) / (2 * FD_H) - grad[i]) < 1e-6 * gmax + 1e-9,
			      "fd analytic [%ld]", (long)i);
	}
	ck_assert_int_eq(dev->k->logprob_bwd(dev, l, target, dlogp, dent, R, V, inv_temp), 0);
	ck_assert_msg(tu_err_f(l, grad, R * V, 1e-5 * gmax, 0.0) <= 1.0, "dlogits");
	free(ld);
	free(wlp);
	free(wen);
	free(grad);
	dev->ops->free(dev, l);
	dev->ops->free(dev, logp);
	dev->ops->free(dev, ent);
	dev->ops->free(dev, dlogp);
	dev->ops->free(dev, dent);
	dev->ops->free(dev, logp2);
	tu_close(dev);
}
END_TEST

/* A Qwen-sized vocabulary (151936): one peaked row, one flat row. logp and
 * entropy within 1e-5 absolute; the gradient row sums to ~0 (softmax
 * gradient with dent = 0: sum_j (onehot - p) = 0) within 1e-5. */
START_TEST(logprob_large_vocab)
{
	struct device *dev = tu_open(2, MATMUL_FP32);
	const int64_t R = 2, V = 151936;
	int32_t target[2] = { 151935, 77 };
	float *l = tu_falloc(dev, R * V), *logp = tu_falloc(dev, R), *ent = tu_falloc(dev, R);
	float dlogp[2] = { 1.0f, -0.5f };
	double *ld, lp, en, sum;
	int64_t r, j;

	tu_seed(26);
	tu_fill(l, R * V, -5.0f, 5.0f);
	l[1234] = 30.0f;                           /* peaked row 0 */
	for (j = 0; j < V; j++)
		l[V + j] = l[V + j] * 1e-3f;           /* nearly flat row 1 */
	ld = to_double(l, R * V);
	ck_assert_int_eq(dev->k->logprob_fwd(dev, logp, ent, l, target, R, V, 1.0f), 0);
	for (r = 0; r < R; r++) {
		ref_logprob_row(ld + r * V, V, 1.0, target[r], &lp, &en);
		ck_assert_msg(fabs(logp[r] - lp) < 1e-5 + 1e-6 * fabs(lp), "logp[%ld] %g vs %g",
			      (long)r, logp[r], lp);
		ck_assert_msg(fabs(ent[r] - en) < 1e-5, "ent[%ld] %g vs %g", (long)r, ent[r], en);
	}
	ck_assert(fabs(ent[1] - log((double)V)) < 1e-3);
	ck_assert_int_eq(dev->k->logprob_bwd(dev, l, target, dlogp, NULL, R, V, 1.0f), 0);
	for (r = 0; r < R; r++) {
		sum = 0.0;
		for (j = 0; j < V; j++)
			sum += l[r * V + j];
		ck_assert_msg(fabs(sum) < 1e-5, "row %ld sums to %g", (long)r, sum);
	}
	ck_assert(l[1234] < -0.9f && l[151935] > 0.0f);
	free(ld);
	dev->ops->free(dev, l);
	dev->ops->free(dev, logp);
	dev->ops->free(dev, ent);
	tu_close(dev);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("cpu_kernels");
	TCase *tc = tcase_create("core");
	int failed = 0;

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, embedding);
	tcase_add_test(tc, rmsnorm);
	tcase_add_test(tc, rope);
	tcase_add_test(tc, swiglu);
	tcase_add_test(tc, bias_and_axpby);
	tcase_add_test(tc, logprob);
	tcase_add_test(tc, logprob_large_vocab);
	suite_add_tcase(s, tc);
	tu_run(s, &failed);
	return failed ? 1 : 0;
}
