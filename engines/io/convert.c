/* convert.c — conversions between fp32 and the 16-bit storage formats of
 * safetensors files (bf16, IEEE binary16), see safetensors.h. The rounding
 * rules are round.h's (shared with the CPU device); here are the scalar
 * entry points and the bulk loops, which the compiler vectorizes.
 */
#include "io/safetensors.h"
#include "round.h"

uint16_t f32_to_bf16(float x)
{
	return fp_bf16_round(x);
}

float bf16_to_f32(uint16_t h)
{
	return fp_bf16_widen(h);
}

uint16_t f32_to_f16(float x)
{
	return fp_f16_round(x);
}

float f16_to_f32(uint16_t h)
{
	return fp_f16_widen(h);
}

void f32_to_bf16_n(const float *restrict src, uint16_t *restrict dst, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		dst[i] = fp_bf16_round(src[i]);
}

void bf16_to_f32_n(const uint16_t *restrict src, float *restrict dst, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		dst[i] = fp_bf16_widen(src[i]);
}

void f32_to_f16_n(const float *restrict src, uint16_t *restrict dst, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		dst[i] = fp_f16_round(src[i]);
}

void f16_to_f32_n(const uint16_t *restrict src, float *restrict dst, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		dst[i] = fp_f16_widen(src[i]);
}
