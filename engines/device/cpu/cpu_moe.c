/* cpu_moe.c — a mixture of experts' routing (one token's: moe_route.h),
 * and the gather and combine of the rows grouped by expert, on the CPU
 * (semantics: device.h).
 *
 * Every loop is OpenMP-parallel over tokens or grouped rows, each of which
 * one thread computes alone in a fixed order, so the results are the same
 * for any thread count.
 */
#include <string.h>

#include "err.h"
#include "cpu_device.h"
#include "device/moe_route.h"

int cpu_moe_route_fwd(struct device *dev, float *probs, int32_t *idx, float *w, int64_t T,
		      int64_t E, int64_t k, bool norm, bool forced)
{
	int64_t t;

	if (!moe_route_shape_ok(T, E, k, E))
		return -EINVAL;
	cpu_enter(dev);
#pragma omp parallel for schedule(static)
	for (t = 0; t < T; t++)
		moe_route_row_fwd(probs + t * E, idx + t * k, w + t * k, E, k, norm, forced);
	return 0;
}

int cpu_moe_route_bwd(struct device *dev, float *dz, const float *dw, const float *probs,
		      const int32_t *idx, const float *w, const float *aux, int64_t T, int64_t E,
		      int64_t k, bool norm)
{
	int64_t t;

	if (!moe_route_shape_ok(T, E, k, E))
		return -EINVAL;
	cpu_enter(dev);
#pragma omp parallel for schedule(static)
	for (t = 0; t < T; t++)
		moe_route_row_bwd(dz + t * E, dw + t * k, probs + t * E, idx + t * k, w + t * k, aux,
				  E, k, norm);
	return 0;
}

int cpu_rows_gather(struct device *dev, float *dst, const float *src, const int32_t *rows,
		    int64_t R, int64_t C)
{
	int64_t r;

	if (R < 0 || C < 0)
		return -EINVAL;
	cpu_enter(dev);
#pragma omp parallel for schedule(static)
	for (r = 0; r < R; r++)
		memcpy(dst + r * C, src + (int64_t)rows[r] * C, (size_t)C * sizeof(*dst));
	return 0;
}

/* The k choices of token t in ascending pos: their indices into order[]. */
static void by_pos(const int32_t *pos, int64_t k, int64_t *order)
{
	for (int64_t j = 0; j < k; j++) {
		int64_t i = j;

		while (i > 0 && pos[order[i - 1]] > pos[j]) {
			order[i] = order[i - 1];
			i--;
		}
		order[i] = j;
	}
}

int cpu_moe_combine(struct device *dev, float *out, const float *y, const int32_t *pos,
		    const float *w, int64_t T, int64_t k, int64_t C)
{
	int64_t t;

	if (T < 0 || k < 1 || k > 1024 || C < 0)
		return -EINVAL;
	cpu_enter(dev);
#pragma omp parallel for schedule(static)
	for (t = 0; t < T; t++) {
		int64_t order[1024];
		float *o = out + t * C;

		by_pos(pos + t * k, k, order);
		memset(o, 0, (size_t)C * sizeof(*o));
		for (int64_t i = 0; i < k; i++) {
			int64_t j = order[i];
			const float *yr = y + (int64_t)pos[t * k + j] * C;
			float a = w ? w[t * k + j] : 1.0f;

			for (int64_t c = 0; c < C; c++)
				o[c] += a * yr[c];
		}
	}
	return 0;
}

int cpu_moe_combine_bwd(struct device *dev, float *dy, float *dw, const float *dout,
			const float *y, const int32_t *pos, const float *w, int64_t T,
			int64_t k, int64_t C)
{
	int64_t t;

	if (T < 0 || k < 1 || C < 0)
		return -EINVAL;
	cpu_enter(dev);
#pragma omp parallel for schedule(static)
	for (t = 0; t < T; t++)
		for (int64_t j = 0; j < k; j++) {
			int64_t r = pos[t * k + j];

			dw[t * k + j] = moe_scale_dot(dy + r * C, dout + t * C, y + r * C,
						      w[t * k + j], C);
		}
	return 0;
}

int cpu_sigmoid_gate_fwd(struct device *dev, float *out, const float *z, const float *y,
			 int64_t T, int64_t C)
{
	int64_t t;

	if (T < 0 || C < 0)
		return -EINVAL;
	cpu_enter(dev);
#pragma omp parallel for schedule(static)
	for (t = 0; t < T; t++) {
		float s = moe_sigmoid(z[t]);

		for (int64_t c = 0; c < C; c++)
			out[t * C + c] += s * y[t * C + c];
	}
	return 0;
}

int cpu_sigmoid_gate_bwd(struct device *dev, float *dy, float *dz, const float *dout,
			 const float *z, const float *y, int64_t T, int64_t C)
{
	int64_t t;

	if (T < 0 || C < 0)
		return -EINVAL;
	cpu_enter(dev);
#pragma omp parallel for schedule(static)
	for (t = 0; t < T; t++) {
		float s = moe_sigmoid(z[t]);

		dz[t] = s * (1.0f - s) * moe_scale_dot(dy + t * C, dout + t * C, y + t * C, s, C);
	}
	return 0;
}
