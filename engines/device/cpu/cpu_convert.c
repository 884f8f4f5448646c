/* cpu_convert.c — fp32 to bf16 / IEEE half on the CPU device, round to
 * nearest even: OpenMP chunks over the threads, each a simd loop over the
 * one definition of the rounding rules (engines/io/round.h, shared with the
 * safetensors code), which is branch-free so that these loops vectorize.
 */
#include "err.h"
#include "io/round.h"
#include "cpu_device.h"

/* Elements per parallel chunk: large enough to amortize the scheduling,
 * small enough to keep both threads busy on a few MiB. */
#define CONVERT_CHUNK 16384

void cpu_round_bf16(uint16_t *out, const float *x, int64_t n)
{
	int64_t i;

#pragma omp simd
	for (i = 0; i < n; i++)
		out[i] = fp_bf16_round(x[i]);
}

static void round_f16(uint16_t *out, const float *x, int64_t n)
{
	int64_t i;

#pragma omp simd
	for (i = 0; i < n; i++)
		out[i] = fp_f16_round(x[i]);
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
