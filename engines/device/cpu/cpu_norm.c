/* cpu_norm.c — RMSNorm forward and backward on the CPU.
 *
 * With y = x * r * w and r = (mean(x^2) + eps)^-1/2, for one row of C:
 *   dx_j = r w_j g_j - (r^3 / C) x_j sum_i g_i w_i x_i
 *   dw_j += sum over rows of g_j x_j r
 * Row sums are fp32 vector reductions in a fixed lane order. dw is summed
 * per column in ascending row order (column-chunked parallel loop), so it
 * does not depend on the thread count.
 */
#include <math.h>

#include "err.h"
#include "cpu_device.h"

#define COL_CHUNK 64

int cpu_rmsnorm_fwd(struct device *dev, float *out, float *rstd,
		    const float *x, const float *w, int64_t R, int64_t C,
		    float eps)
{
	int64_t r;

	if (R < 0 || C <= 0)
		return -EINVAL;
	cpu_enter(dev);
#pragma omp parallel for schedule(static)
	for (r = 0; r < R; r++) {
		const float *xr = x + r * C;
		float *o = out + r * C;
		float ss = 0.0f, rs;
		int64_t j;

#pragma omp simd reduction(+:ss)
		for (j = 0; j < C; j++)
			ss += xr[j] * xr[j];
		rs = 1.0f / sqrtf(ss / (float)C + eps);
		rstd[r] = rs;
		/* out may alias x: x is read once per element before the write. */
#pragma omp simd
		for (j = 0; j < C; j++)
			o[j] = xr[j] * rs * w[j];
	}
	return 0;
}

int cpu_rmsnorm_bwd(struct device *dev, float *dx, float *dw,
		    const float *dout, const float *x, const float *w,
		    const float *rstd, int64_t R, int64_t C, float beta_dx)
{
	int64_t r, c, nchunks = (C + COL_CHUNK - 1) / COL_CHUNK;

	if (R < 0 || C <= 0)
		return -EINVAL;
	cpu_enter(dev);
#pragma omp parallel for schedule(static)
	for (r = 0; r < R; r++) {
		const float *g = dout + r * C, *xr = x + r * C;
		float *d = dx + r * C;
		float rs = rstd[r], dot = 0.0f, coef;
		int64_t j;

#pragma omp simd reduction(+:dot)
		for (j = 0; j < C; j++)
			dot += g[j] * w[j] * xr[j];
		coef = rs * rs * rs * dot / (float)C;
		if (beta_dx == 0.0f) {
#pragma omp simd
			for (j = 0; j < C; j++)
				d[j] = rs * w[j] * g[j] - coef * xr[j];
		} else {
#pragma omp simd
			for (j = 0; j < C; j++)
				d[j] = beta_dx * d[j] + (rs * w[j] * g[j] - coef * xr[j]);
		}
	}
	if (!dw)
		return 0;
#pragma omp parallel for schedule(static)
	for (c = 0; c < nchunks; c++) {
		int64_t c0 = c * COL_CHUNK;
		int64_t cn = C - c0 < COL_CHUNK ? C - c0 : COL_CHUNK;
		float acc[COL_CHUNK];
		int64_t rr, j;

		for (j = 0; j < cn; j++)
			acc[j] = 0.0f;
		for (rr = 0; rr < R; rr++) {
			const float *g = dout + rr * C + c0, *xr = x + rr * C + c0;
			float rs = rstd[rr];

#pragma omp simd
			for (j = 0; j < cn; j++)
				acc[j] += g[j] * xr[j] * rs;
		}
		for (j = 0; j < cn; j++)
			dw[c0 + j] += acc[j];
	}
	return 0;
}
