/* cpu_math.h — a vectorizable exp for the CPU kernels.
 *
 * glibc's expf is only vectorized under -ffast-math; softmax-style kernels
 * (attention, log-prob, swiglu) call exp once per score, so a scalar call
 * would dominate them. cpu_expf() is branch-free (selects only) and inlines
 * into `#pragma omp simd` loops.
 *
 * Accuracy: Cephes expf (Cody-Waite range reduction, degree-5 minimax
 * polynomial), within 2 ulp of exp() for x in [-87.3, 88]; returns 0 for
 * x < -87.3 (and -inf) instead of a subnormal; x > 88 is clamped to 88
 * (exp(88) = 1.65e38, so overflow to inf never happens). NaN in gives NaN.
 */
#ifndef ENGINED_CPU_MATH_H
#define ENGINED_CPU_MATH_H

#include <stdint.h>
#include <string.h>

static inline float cpu_expf(float x)
{
	const float log2e = 1.44269504088896341f;
	const float c1 = 0.693359375f;       /* ln 2, high part (exact in float) */
	const float c2 = -2.12194440e-4f;    /* ln 2 - c1 */
	const float magic = 12582912.0f;     /* 1.5 * 2^23: rounds to an integer */
	float xc, t, n, r, p, r2, y, scale;
	int32_t e;
	uint32_t bits;

	xc = x > 88.0f ? 88.0f : x;
	xc = xc < -87.3f ? -87.3f : xc;
	t = xc * log2e + magic;
	n = t - magic;                       /* round(x / ln 2) in [-126, 127] */
	r = xc - n * c1;
	r = r - n * c2;                      /* |r| <= ln2 / 2 */
	p = 1.9875691500e-4f;
	p = p * r + 1.3981999507e-3f;
	p = p * r + 8.3334519073e-3f;
	p = p * r + 4.1665795894e-2f;
	p = p * r + 1.6666665459e-1f;
	p = p * r + 5.0000001201e-1f;
	r2 = r * r;
	y = p * r2 + r + 1.0f;
	e = (int32_t)n + 127;
	bits = (uint32_t)e << 23;
	memcpy(&scale, &bits, sizeof(scale));
	y = y * scale;
	y = x < -87.3f ? 0.0f : y;
	return x != x ? x : y;
}

/* s[j] = exp(s[j] - mx) for j < n, in place; returns their sum (a softmax
 * row's numerators and denominator, the one loop of the attention
 * kernels). */
static inline float cpu_exp_shift_sum(float *s, int64_t n, float mx)
{
	float sum = 0.0f;

#pragma omp simd reduction(+:sum)
	for (int64_t j = 0; j < n; j++) {
		float e = cpu_expf(s[j] - mx);

		s[j] = e;
		sum += e;
	}
	return sum;
}

#endif
