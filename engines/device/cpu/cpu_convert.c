/* cpu_convert.c — fp32 to bf16 / IEEE half, round to nearest even.
 *
 * Done with bit arithmetic rather than the CPU's conversion instructions:
 * vcvtneps2bf16 flushes subnormal inputs to zero, and the result must not
 * depend on -march. (The f16 subnormal path uses one fp32 add, exact under
 * the default round-to-nearest mode.) Both converters are branch-free so
 * the compiler vectorizes them.
 *
 * bf16: the upper 16 bits, rounded to nearest even; a finite value that
 *   rounds past the largest bf16 becomes inf; NaN stays NaN (sign and the
 *   top payload bits kept, quiet bit set).
 * f16: IEEE binary16, round to nearest even in the normal and subnormal
 *   ranges; |x| >= 65520 (after rounding, past 65504) becomes inf; |x| <=
 *   2^-25 becomes (signed) zero; NaN stays NaN (quiet, top payload bits kept).
 */
#include <string.h>

#include "err.h"
#include "cpu_device.h"

/* Elements per parallel chunk: large enough to amortize the scheduling,
 * small enough to keep both threads busy on a few MiB. */
#define CONVERT_CHUNK 16384

static inline uint16_t bf16_round(float f)
{
	uint32_t u, r, nan;

	memcpy(&u, &f, sizeof(u));
	r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
	nan = (u >> 16) | 0x40u;
	return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : r);
}

static inline uint16_t f16_round(float f)
{
	uint32_t u, a, sign, norm, sub, tb, nan, o;
	float af, t;

	memcpy(&u, &f, sizeof(u));
	sign = (u >> 16) & 0x8000u;
	a = u & 0x7fffffffu;
	/* Normal half range [2^-14, 65520): rebias the exponent by -112
	 * (0xc8000000 = -(112 << 23) mod 2^32) and round the 13 dropped
	 * mantissa bits to nearest even. */
	norm = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13;
	/* Subnormal half (|x| < 2^-14): the result is |x| / 2^-24 rounded to
	 * an integer. |x| * 2^24 is exact and below 1024; adding 2^23 rounds
	 * it to nearest even (the float ulp at 2^23 is 1) and leaves the
	 * integer in the low mantissa bits. A carry into 0x400 is the
	 * smallest normal, encoded correctly. (Integer shifts by a variable
	 * amount would keep GCC from vectorizing the loop.) */
	memcpy(&af, &a, sizeof(af));
	t = af * 16777216.0f + 8388608.0f;
	memcpy(&tb, &t, sizeof(tb));
	sub = tb - 0x4b000000u;
	nan = 0x7e00u | ((a >> 13) & 0x3ffu);
	o = a < 0x38800000u ? sub : norm;
	o = a >= 0x47800000u ? (a > 0x7f800000u ? nan : 0x7c00u) : o;
	return (uint16_t)(o | sign);
}

void cpu_round_bf16(uint16_t *out, const float *x, int64_t n)
{
	int64_t i;

#pragma omp simd
	for (i = 0; i < n; i++)
		out[i] = bf16_round(x[i]);
}

static void round_f16(uint16_t *out, const float *x, int64_t n)
{
	int64_t i;

#pragma omp simd
	for (i = 0; i < n; i++)
		out[i] = f16_round(x[i]);
}

int cpu_to_bf16(struct device *dev, uint16_t *out, const float *x, int64_t n)
{
	int64_t c, nchunks = (n + CONVERT_CHUNK - 1) / CONVERT_CHUNK;

	if (n < 0)
		return -EINVAL;
	cpu_enter(dev);
#pragma omp parallel for schedule(static)
	for (c = 0; c < nchunks; c++) {
		int64_t lo = c * CONVERT_CHUNK;
		int64_t len = n - lo < CONVERT_CHUNK ? n - lo : CONVERT_CHUNK;

		cpu_round_bf16(out + lo, x + lo, len);
	}
	return 0;
}

int cpu_to_f16(struct device *dev, uint16_t *out, const float *x, int64_t n)
{
	int64_t c, nchunks = (n + CONVERT_CHUNK - 1) / CONVERT_CHUNK;

	if (n < 0)
		return -EINVAL;
	cpu_enter(dev);
#pragma omp parallel for schedule(static)
	for (c = 0; c < nchunks; c++) {
		int64_t lo = c * CONVERT_CHUNK;
		int64_t len = n - lo < CONVERT_CHUNK ? n - lo : CONVERT_CHUNK;

		round_f16(out + lo, x + lo, len);
	}
	return 0;
}
