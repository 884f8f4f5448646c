/* round.h — the one definition of the rounding rules between fp32 and the
 * 16-bit formats (bf16, IEEE binary16). static inline and branch-free
 * (every path computed, then selected), so that the bulk loops calling
 * them vectorize: engines/io/convert.c (safetensors, weight streaming) and
 * the CPU device's kernels (engines/device/cpu/cpu_convert.c) both use
 * these and nothing else.
 *
 * Bit arithmetic rather than the CPU's conversion instructions
 * (vcvtneps2bf16 flushes subnormal inputs to zero), so the result does not
 * depend on -march or compiler flags.
 *
 * fp32 -> bf16: the upper 16 bits, rounded to nearest even; a finite value
 *   that rounds past the largest bf16 becomes inf; NaN stays NaN (sign and
 *   top payload bits kept, quiet bit set).
 * fp32 -> f16: round to nearest even in the normal and subnormal ranges;
 *   |x| >= 65520 (past 65504 after rounding) becomes inf; |x| <= 2^-25
 *   becomes (signed) zero; NaN stays NaN (quiet, top payload bits kept).
 *   The subnormal path rounds with one fp32 add, so it assumes the default
 *   round-to-nearest mode (nothing in engined changes it). An integer
 *   shift by a variable amount would avoid that, but its loop is 2.3x
 *   slower (all 2^32 inputs, -march=native with AVX-512).
 * bf16 / f16 -> fp32: exact (f16 subnormals through one exact fp32
 *   scaling); inf and NaN payloads kept.
 */
#ifndef ENGINED_IO_ROUND_H
#define ENGINED_IO_ROUND_H

#include <stdint.h>
#include <string.h>

static inline uint32_t fp_f32_bits(float x)
{
	uint32_t u;

	memcpy(&u, &x, sizeof(u));
	return u;
}

static inline float fp_f32_from_bits(uint32_t u)
{
	float x;

	memcpy(&x, &u, sizeof(x));
	return x;
}

static inline uint16_t fp_bf16_round(float x)
{
	uint32_t u = fp_f32_bits(x);
	/* Round to nearest even on the 16 dropped bits; a carry into the
	 * exponent is the correct result (up to inf for the largest values).
	 * NaN: force the quiet bit, so that a payload in the low 16 bits only
	 * does not turn into inf (and rounding cannot carry into the sign). */
	uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
	uint32_t nan = (u >> 16) | 0x40u;

	return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : r);
}

static inline uint16_t fp_f16_round(float x)
{
	uint32_t u = fp_f32_bits(x);
	uint32_t sign = (u >> 16) & 0x8000u;
	uint32_t a = u & 0x7fffffffu;
	uint32_t norm, sub, nan, o;
	float t;

	/* Normal half range [2^-14, 65520): rebias the exponent by -112
	 * (0xc8000000 = -(112 << 23) mod 2^32) and round the 13 dropped
	 * mantissa bits to nearest even; a carry into the exponent is
	 * correct, and [65520, 65536) carries into inf. */
	norm = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13;
	/* Subnormal half (|x| < 2^-14): the result is |x| / 2^-24 rounded to
	 * an integer. |x| * 2^24 is exact and below 1024; adding 2^23 rounds
	 * it to nearest even (the float ulp at 2^23 is 1) and leaves the
	 * integer in the low mantissa bits. A carry into 0x400 is the
	 * smallest normal, encoded correctly. */
	t = fp_f32_from_bits(a) * 16777216.0f + 8388608.0f;
	sub = fp_f32_bits(t) - 0x4b000000u;
	nan = 0x7e00u | ((a >> 13) & 0x3ffu);
	o = a < 0x38800000u ? sub : norm;
	o = a >= 0x47800000u ? (a > 0x7f800000u ? nan : 0x7c00u) : o;
	return (uint16_t)(o | sign);
}

static inline float fp_bf16_widen(uint16_t h)
{
	return fp_f32_from_bits((uint32_t)h << 16);
}

static inline float fp_f16_widen(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t e = (h >> 10) & 0x1fu;
	uint32_t m = h & 0x3ffu;
	uint32_t normal = ((e + 112) << 23) | (m << 13);
	uint32_t special = 0x7f800000u | (m << 13);   /* inf / NaN, payload kept */
	/* Subnormal m * 2^-24 is exact in fp32: convert m and scale. */
	uint32_t sub = fp_f32_bits((float)m * 0x1p-24f);
	/* Selected with masks (all ones when the condition holds). */
	uint32_t is_sub = (uint32_t)0 - (uint32_t)(e == 0);
	uint32_t is_special = (uint32_t)0 - (uint32_t)(e == 0x1f);
	uint32_t r = (sub & is_sub) | (normal & ~is_sub);

	r = (special & is_special) | (r & ~is_special);
	return fp_f32_from_bits(sign | r);
}

#endif
