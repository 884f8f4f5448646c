/* convert.c — conversions between fp32 and the 16-bit storage formats of
 * safetensors files (bf16, IEEE binary16), see safetensors.h.
 *
 * Integer arithmetic (plus one exact fp32 scaling for f16 subnormals), so
 * the result does not depend on the rounding mode, -march or compiler
 * flags. Rounding is to nearest,
 * ties to even, in the normal and subnormal ranges; NaN stays NaN with the
 * quiet bit set (sign and top payload bits kept). The kernels are written
 * branch-free (every path computed, then selected) so that the bulk loops
 * vectorize; the scalar functions are the same kernels.
 */
#include "safetensors.h"

#include <string.h>

static inline uint32_t f32_bits(float x)
{
	uint32_t u;

	memcpy(&u, &x, sizeof(u));
	return u;
}

static inline float f32_from_bits(uint32_t u)
{
	float x;

	memcpy(&x, &u, sizeof(x));
	return x;
}

/* All ones when c, else zero; and c ? x : y through it. */
static inline uint32_t mask(int c)
{
	return (uint32_t)0 - (uint32_t)(c != 0);
}

static inline uint32_t blend(int c, uint32_t x, uint32_t y)
{
	return (x & mask(c)) | (y & ~mask(c));
}

static inline uint16_t bf16_kernel(uint32_t f)
{
	/* Round to nearest even on the 16 dropped bits; a carry into the
	 * exponent is the correct result (up to inf for the largest values).
	 * NaN: force the quiet bit, so that a payload in the low 16 bits only
	 * does not turn into inf (and rounding cannot carry into the sign). */
	uint32_t r = (f + 0x7fffu + ((f >> 16) & 1u)) >> 16;
	uint32_t nan = (f >> 16) | 0x0040u;

	return (uint16_t)((f & 0x7fffffffu) > 0x7f800000u ? nan : r);
}

static inline uint16_t f16_kernel(uint32_t f)
{
	uint32_t sign = (f >> 16) & 0x8000u;
	uint32_t a = f & 0x7fffffffu;
	uint32_t nan = 0x7e00u | ((a >> 13) & 0x1ffu);
	uint32_t norm, m, q, rem, half, r, shift;

	/* Normal binary16 (|x| >= 2^-14): rebias the exponent (127 - 15 =
	 * 112) and round the 13 dropped mantissa bits; a carry into the
	 * exponent is correct, and [65520, 65536) carries into inf. */
	norm = a - 0x38000000u;
	norm = (norm + 0x0fffu + ((norm >> 13) & 1u)) >> 13;
	/* Subnormal binary16: q = round(|x| / 2^-24). |x| = m * 2^(e - 150)
	 * with a 24-bit significand m, so q = m >> (126 - e), rounded. The
	 * shift is clamped so that lanes taking another path stay defined. */
	m = (a & 0x7fffffu) | 0x800000u;
	shift = 126u - (a >> 23);            /* wraps for e > 126: clamped */
	shift = shift > 14u ? shift : 14u;
	shift = shift < 25u ? shift : 25u;
	q = m >> shift;
	rem = m & ((1u << shift) - 1u);
	half = 1u << (shift - 1u);
	/* Up when rem > half, or rem == half and q is odd (may reach 0x400,
	 * the smallest normal, which is the right encoding). */
	q += (uint32_t)(rem + (q & 1u) > half);

	/* Select with masks (compilers vectorize these, not nested ?:). */
	r = q & mask(a >= 0x33000000u);          /* < 2^-25 (2^-25 ties to 0) */
	r = blend(a >= 0x38800000u, norm, r);
	r = blend(a >= 0x47800000u, 0x7c00u, r); /* >= 65536 and inf */
	r = blend(a > 0x7f800000u, nan, r);
	return (uint16_t)(sign | r);
}

static inline uint32_t f16_widen(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t e = (h >> 10) & 0x1fu;
	uint32_t m = h & 0x3ffu;
	uint32_t normal = ((e + 112) << 23) | (m << 13);
	uint32_t special = 0x7f800000u | (m << 13);   /* inf / NaN, payload kept */
	/* Subnormal m * 2^-24 is exact in fp32: convert m and scale. */
	uint32_t sub = f32_bits((float)m * 0x1p-24f);

	return sign | blend(e == 0x1f, special, blend(e == 0, sub, normal));
}

uint16_t f32_to_bf16(float x)
{
	return bf16_kernel(f32_bits(x));
}

float bf16_to_f32(uint16_t h)
{
	return f32_from_bits((uint32_t)h << 16);
}

uint16_t f32_to_f16(float x)
{
	return f16_kernel(f32_bits(x));
}

float f16_to_f32(uint16_t h)
{
	return f32_from_bits(f16_widen(h));
}

void f32_to_bf16_n(const float *restrict src, uint16_t *restrict dst, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		dst[i] = bf16_kernel(f32_bits(src[i]));
}

void bf16_to_f32_n(const uint16_t *restrict src, float *restrict dst, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		dst[i] = f32_from_bits((uint32_t)src[i] << 16);
}

void f32_to_f16_n(const float *restrict src, uint16_t *restrict dst, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		dst[i] = f16_kernel(f32_bits(src[i]));
}

void f16_to_f32_n(const uint16_t *restrict src, float *restrict dst, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		dst[i] = f32_from_bits(f16_widen(src[i]));
}
