/* cuda_common.cuh — helpers shared by the CUDA device's kernel files:
 * grid sizing, warp reductions in a fixed order, and the rounding functions
 * of engines/io/round.h (the CPU device's and the safetensors code's) as
 * device functions (bit arithmetic, so both devices round identically).
 *
 * Determinism: every reduction here is a fixed tree (xor-shuffle within a
 * warp, then a fixed combination of the warps); no atomics decide an order,
 * so results depend only on the inputs and the launch shape, which depends
 * only on the problem size.
 */
#ifndef ENGINED_CUDA_COMMON_CUH
#define ENGINED_CUDA_COMMON_CUH

#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "cuda_device.h"

/* Threads of the 1-D elementwise kernels. */
#define EW_THREADS 256

/* Blocks for a grid-stride loop over n elements: enough to fill the GPU,
 * never more than needed. Depends on the device only through the SM count,
 * which does not change results (each element is computed alone). */
static inline unsigned int ew_blocks(struct device *dev, int64_t n)
{
	int64_t want = (n + EW_THREADS - 1) / EW_THREADS;
	int64_t cap = (int64_t)cuda_sm_count(dev) * 16;

	if (want < 1)
		want = 1;
	return (unsigned int)(want < cap ? want : cap);
}

__device__ __forceinline__ float warp_sum(float v)
{
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

__device__ __forceinline__ double warp_sum_d(double v)
{
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

__device__ __forceinline__ float warp_max(float v)
{
	for (int o = 16; o > 0; o >>= 1)
		v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
	return v;
}

/* bf16 bits of f, round to nearest even; NaN stays NaN (quiet). */
__device__ __forceinline__ uint16_t bf16_bits(float f)
{
	uint32_t u, r, nan;

	memcpy(&u, &f, sizeof(u));
	r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
	nan = (u >> 16) | 0x40u;
	return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : r);
}

/* f rounded to bf16 and widened back to fp32. */
__device__ __forceinline__ float bf16_round(float f)
{
	uint32_t u = (uint32_t)bf16_bits(f) << 16;
	float r;

	memcpy(&r, &u, sizeof(r));
	return r;
}

/* IEEE half bits of f, round to nearest even (see engines/io/round.h). */
__device__ __forceinline__ uint16_t f16_bits(float f)
{
	uint32_t u, a, sign, norm, sub, tb, nan, o;
	float af, t;

	memcpy(&u, &f, sizeof(u));
	sign = (u >> 16) & 0x8000u;
	a = u & 0x7fffffffu;
	norm = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13;
	memcpy(&af, &a, sizeof(af));
	/* round-to-nearest add, never contracted into an FMA */
	t = __fadd_rn(__fmul_rn(af, 16777216.0f), 8388608.0f);
	memcpy(&tb, &t, sizeof(tb));
	sub = tb - 0x4b000000u;
	nan = 0x7e00u | ((a >> 13) & 0x3ffu);
	o = a < 0x38800000u ? sub : norm;
	o = a >= 0x47800000u ? (a > 0x7f800000u ? nan : 0x7c00u) : o;
	return (uint16_t)(o | sign);
}

#endif
