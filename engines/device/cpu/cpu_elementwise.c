/* cpu_elementwise.c — embedding, rotary embedding, SwiGLU, bias and axpby
 * on the CPU.
 *
 * All loops are OpenMP-parallel over independent rows or elements. The two
 * reductions over rows (embedding_bwd, bias_bwd) are parallel over column
 * chunks instead, each column summed in ascending row order: the result is
 * then the same for any thread count, and no two threads write one column.
 */
#include <math.h>
#include <string.h>

#include "err.h"
#include "cpu_device.h"
#include "cpu_math.h"

/* Columns per parallel unit of the column-chunked reductions: a multiple of
 * the 16-float vector and of a cache line. */
#define COL_CHUNK 64

/* Largest head dimension rope accepts (its cos/sin table lives on the
 * stack: 2 * ROPE_MAX_HALF floats). */
#define ROPE_MAX_HALF 512

int cpu_embedding_fwd(struct device *dev, float *out, const float *wte,
		      const int32_t *ids, int64_t T, int64_t C)
{
	int64_t t;

	if (T < 0 || C < 0)
		return -EINVAL;
	cpu_enter(dev);
#pragma omp parallel for schedule(static)
	for (t = 0; t < T; t++)
		memcpy(out + t * C, wte + (int64_t)ids[t] * C, (size_t)C * sizeof(float));
	return 0;
}

int cpu_embedding_bwd(struct device *dev, float *dwte, const float *dout,
		      const int32_t *ids, int64_t T, int64_t C, int64_t V, int64_t skip)
{
	int64_t t, c, nchunks = (C + COL_CHUNK - 1) / COL_CHUNK;

	if (T < 0 || C < 0 || V < 0)
		return -EINVAL;
	for (t = 0; t < T; t++) {
		if (ids[t] < 0 || ids[t] >= V)
			return -EINVAL;
	}
	cpu_enter(dev);
#pragma omp parallel for schedule(static)
	for (c = 0; c < nchunks; c++) {
		int64_t c0 = c * COL_CHUNK;
		int64_t cn = C - c0 < COL_CHUNK ? C - c0 : COL_CHUNK;
		int64_t tt, j;

		for (tt = 0; tt < T; tt++) {
			float *dst = dwte + (int64_t)ids[tt] * C + c0;
			const float *src = dout + tt * C + c0;

			if (ids[tt] == skip)
				continue;

#pragma omp simd
			for (j = 0; j < cn; j++)
				dst[j] += src[j];
		}
	}
	return 0;
}

int cpu_rope(struct device *dev, float *x, const int32_t *pos,
	     const float *inv_freq, int64_t T, int64_t NH, int64_t D,
	     bool inverse)
{
	int64_t half = D / 2, t;

	if (T < 0 || NH < 0 || D < 0 || D % 2 || half > ROPE_MAX_HALF)
		return -EINVAL;
	cpu_enter(dev);
#pragma omp parallel for schedule(static)
	for (t = 0; t < T; t++) {
		float cs[ROPE_MAX_HALF], sn[ROPE_MAX_HALF];
		int64_t i, h;

		/* As Hugging Face: the angle is formed in fp32, then cos/sin. */
		for (i = 0; i < half; i++) {
			float ang = (float)pos[t] * inv_freq[i];

			cs[i] = cosf(ang);
			sn[i] = inverse ? -sinf(ang) : sinf(ang);
		}
		for (h = 0; h < NH; h++) {
			float *x1 = x + (t * NH + h) * D, *x2 = x1 + half;

			/* [x1, x2] -> [x1 c - x2 s, x2 c + x1 s] */
#pragma omp simd
			for (i = 0; i < half; i++) {
				float a = x1[i], b = x2[i];

				x1[i] = a * cs[i] - b * sn[i];
				x2[i] = b * cs[i] + a * sn[i];
			}
		}
	}
	return 0;
}

static inline float sigmoidf(float g)
{
	return 1.0f / (1.0f + cpu_expf(-g));
}

int cpu_swiglu_fwd(struct device *dev, float *out, const float *gate,
		   const float *up, int64_t n)
{
	int64_t i;

	if (n < 0)
		return -EINVAL;
	cpu_enter(dev);
#pragma omp parallel for simd schedule(static)
	for (i = 0; i < n; i++) {
		float g = gate[i];

		out[i] = g * sigmoidf(g) * up[i];
	}
	return 0;
}

/* d/dg silu(g) = s (1 + g (1 - s)) with s = sigmoid(g). */
int cpu_swiglu_bwd(struct device *dev, float *dgate, float *dup,
		   const float *dout, const float *gate, const float *up,
		   int64_t n)
{
	int64_t i;

	if (n < 0)
		return -EINVAL;
	cpu_enter(dev);
#pragma omp parallel for simd schedule(static)
	for (i = 0; i < n; i++) {
		float g = gate[i], d = dout[i], s = sigmoidf(g);

		dgate[i] = d * up[i] * s * (1.0f + g * (1.0f - s));
		dup[i] = d * g * s;
	}
	return 0;
}

int cpu_bias_add(struct device *dev, float *x, const float *bias,
		 int64_t R, int64_t N)
{
	int64_t r;

	if (R < 0 || N < 0)
		return -EINVAL;
	cpu_enter(dev);
#pragma omp parallel for schedule(static)
	for (r = 0; r < R; r++) {
		float *row = x + r * N;
		int64_t j;

#pragma omp simd
		for (j = 0; j < N; j++)
			row[j] += bias[j];
	}
	return 0;
}

int cpu_bias_bwd(struct device *dev, float *dbias, const float *dout,
		 int64_t R, int64_t N)
{
	int64_t c, nchunks = (N + COL_CHUNK - 1) / COL_CHUNK;

	if (R < 0 || N < 0)
		return -EINVAL;
	cpu_enter(dev);
#pragma omp parallel for schedule(static)
	for (c = 0; c < nchunks; c++) {
		int64_t c0 = c * COL_CHUNK;
		int64_t cn = N - c0 < COL_CHUNK ? N - c0 : COL_CHUNK;
		float acc[COL_CHUNK];
		int64_t r, j;

		for (j = 0; j < cn; j++)
			acc[j] = 0.0f;
		for (r = 0; r < R; r++) {
			const float *src = dout + r * N + c0;

#pragma omp simd
			for (j = 0; j < cn; j++)
				acc[j] += src[j];
		}
		for (j = 0; j < cn; j++)
			dbias[c0 + j] += acc[j];
	}
	return 0;
}

int cpu_axpby(struct device *dev, float *y, float a, const float *x,
	      float b, int64_t n)
{
	int64_t i;

	if (n < 0)
		return -EINVAL;
	cpu_enter(dev);
	if (b == 0.0f) {
#pragma omp parallel for simd schedule(static)
		for (i = 0; i < n; i++)
			y[i] = a * x[i];
	} else {
#pragma omp parallel for simd schedule(static)
		for (i = 0; i < n; i++)
			y[i] = a * x[i] + b * y[i];
	}
	return 0;
}
