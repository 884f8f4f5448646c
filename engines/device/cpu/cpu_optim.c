/* cpu_optim.c — AdamW step, sum of squares and finiteness check on the CPU.
 *
 * adamw mirrors torch.optim.AdamW's single-tensor path (torch 1.13):
 *   p.mul_(1 - lr*wd); m.mul_(b1).add_(g, alpha=1-b1);
 *   v.mul_(b2).addcmul_(g, g, value=1-b2);
 *   denom = (v.sqrt() / sqrt(bc2)).add_(eps); p.addcdiv_(m, denom, value=-lr/bc1)
 * and then zeroes the gradient it read (optimizer.zero_grad(), fused).
 * When it updates the whole parameter region and bf16 products keep a copy
 * of it (MATMUL_BF16), each chunk is rounded into that copy while it is in
 * cache, so the next forward does not sweep the region again.
 * The hyper-parameters arrive as doubles (torch's Python floats); scalars
 * such as 1 - beta2 and lr / bc1 are formed in double and rounded to float
 * once, as torch does. Per-element arithmetic is fp32 in torch's order (the
 * compiler may fuse a multiply and add into one FMA, so a result can differ
 * from torch in the last bit).
 *
 * sumsq sums fixed blocks of SUMSQ_BLOCK elements in double, then the block
 * sums in block order: the result depends only on the data.
 */
#include <math.h>
#include <string.h>

#include "err.h"
#include "cpu_device.h"

#define SUMSQ_BLOCK 16384
#define ADAMW_CHUNK 8192   /* 4 arrays x 32 KiB: a chunk stays in L2 */

int cpu_adamw(struct device *dev, float *p, float *grad, float *m,
	      float *v, int64_t n, double lr, double beta1, double beta2,
	      double eps, double weight_decay, int64_t step, float grad_scale)
{
	double bc1, bc2;
	float decay, b1, omb1, b2, omb2, bc2_sqrt, neg_step, eps_f;
	uint16_t *p16;
	int64_t c, nchunks;

	if (n < 0 || step < 1)
		return -EINVAL;
	bc1 = 1.0 - pow(beta1, (double)step);
	bc2 = 1.0 - pow(beta2, (double)step);
	decay = (float)(1.0 - lr * weight_decay);
	b1 = (float)beta1;
	omb1 = (float)(1.0 - beta1);
	b2 = (float)beta2;
	omb2 = (float)(1.0 - beta2);
	bc2_sqrt = (float)sqrt(bc2);
	neg_step = (float)(-lr / bc1);
	eps_f = (float)eps;
	p16 = cpu_param_bf16_whole(dev, p, n);
	nchunks = (n + ADAMW_CHUNK - 1) / ADAMW_CHUNK;
	cpu_enter(dev);
#pragma omp parallel for schedule(static)
	for (c = 0; c < nchunks; c++) {
		int64_t lo = c * ADAMW_CHUNK, hi = n - lo < ADAMW_CHUNK ? n : lo + ADAMW_CHUNK;
		int64_t i;

#pragma omp simd
		for (i = lo; i < hi; i++) {
			float g = grad[i] * grad_scale;
			float pi = p[i] * decay;
			float mi = m[i] * b1 + omb1 * g;
			float vi = v[i] * b2 + omb2 * g * g;
			float denom = sqrtf(vi) / bc2_sqrt + eps_f;

			m[i] = mi;
			v[i] = vi;
			p[i] = pi + neg_step * (mi / denom);
			grad[i] = 0.0f;
		}
		if (p16)
			cpu_round_bf16(p16 + lo, p + lo, hi - lo);
	}
	if (p16)
		cpu_param_bf16_refreshed(dev);
	return 0;
}

int cpu_sumsq(struct device *dev, double *ret, const float *x, int64_t n)
{
	int64_t nblocks = (n + SUMSQ_BLOCK - 1) / SUMSQ_BLOCK, b;
	double *part, total = 0.0;

	if (n < 0)
		return -EINVAL;
	if (n == 0) {
		*ret = 0.0;
		return 0;
	}
	part = cpu_scratch(dev, CPU_SCRATCH_ROWS, (size_t)nblocks * sizeof(double));
	if (!part)
		return -ENOMEM;
	cpu_enter(dev);
#pragma omp parallel for schedule(static)
	for (b = 0; b < nblocks; b++) {
		int64_t lo = b * SUMSQ_BLOCK;
		int64_t hi = n - lo < SUMSQ_BLOCK ? n : lo + SUMSQ_BLOCK;
		double s = 0.0;
		int64_t i;

#pragma omp simd reduction(+:s)
		for (i = lo; i < hi; i++)
			s += (double)x[i] * (double)x[i];
		part[b] = s;
	}
	for (b = 0; b < nblocks; b++)
		total += part[b];
	*ret = total;
	return 0;
}

int cpu_all_finite(struct device *dev, bool *ret, const float *x, int64_t n)
{
	uint32_t bad = 0;
	int64_t i;

	if (n < 0)
		return -EINVAL;
	cpu_enter(dev);
	/* Exponent all ones = inf or NaN; integer test, so -ffast-math could
	 * not fold it away. */
#pragma omp parallel for simd reduction(|:bad) schedule(static)
	for (i = 0; i < n; i++) {
		uint32_t u;

		memcpy(&u, &x[i], sizeof(u));
		bad |= (u & 0x7f800000u) == 0x7f800000u;
	}
	*ret = bad == 0;
	return 0;
}
