/* cpu_optim.c — AdamW step, sum of squares and finiteness check on the CPU.
 *
 * adamw mirrors torch.optim.AdamW's single-tensor path (torch 1.13):
 *   p.mul_(1 - lr*wd); m.mul_(b1).add_(g, alpha=1-b1);
 *   v.mul_(b2).addcmul_(g, g, value=1-b2);
 *   denom = (v.sqrt() / sqrt(bc2)).add_(eps); p.addcdiv_(m, denom, value=-lr/bc1)
 * and then zeroes the gradient it read (optimizer.zero_grad(), fused).
 * When it updates the whole parameter region and bf16 products keep a copy
 * of it (MATMUL_BF16), each new value is also rounded into that copy in the
 * same loop, so the next forward does not sweep the region again. In the
 * same loop, not in a second pass over the chunk: that pass was compute
 * (about one vector instruction per element) that could not overlap the
 * loop's memory stalls, and made the step 1.3-1.6x the fp32 one on Zen 4
 * (docs/PERF.md); in the loop it hides behind them.
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
#include "io/round.h"
#include "cpu_device.h"

#define SUMSQ_BLOCK 16384
#define ADAMW_CHUNK 8192   /* 4 arrays x 32 KiB: a chunk stays in L2 */

/* The step's scalars, rounded to fp32 once (as torch does). */
struct adamw_coef {
	float decay, b1, omb1, b2, omb2, bc2_sqrt, neg_step, eps;
};

/* One element's update (fp32, torch's order); returns the new p[i]. */
static inline float adamw_elem(const struct adamw_coef *k, float *p, float *grad, float *m,
			       float *v, float grad_scale, int64_t i)
{
	float g = grad[i] * grad_scale;
	float pi = p[i] * k->decay;
	float mi = m[i] * k->b1 + k->omb1 * g;
	float vi = v[i] * k->b2 + k->omb2 * g * g;
	float denom = sqrtf(vi) / k->bc2_sqrt + k->eps;

	m[i] = mi;
	v[i] = vi;
	p[i] = pi + k->neg_step * (mi / denom);
	grad[i] = 0.0f;
	return p[i];
}

/* AdamW over [lo, hi), and the bf16 copy's elements when p16. */
static void adamw_chunk(const struct adamw_coef *k, float *restrict p, float *restrict grad,
			float *restrict m, float *restrict v, uint16_t *restrict p16,
			float grad_scale, int64_t lo, int64_t hi)
{
	int64_t i;

	if (p16) {
#pragma omp simd
		for (i = lo; i < hi; i++)
			p16[i] = fp_bf16_round(adamw_elem(k, p, grad, m, v, grad_scale, i));
		return;
	}
#pragma omp simd
	for (i = lo; i < hi; i++)
		adamw_elem(k, p, grad, m, v, grad_scale, i);
}

int cpu_adamw(struct device *dev, float *p, float *grad, float *m,
	      float *v, int64_t n, double lr, double beta1, double beta2,
	      double eps, double weight_decay, int64_t step, float grad_scale)
{
	struct adamw_coef k;
	double bc1, bc2;
	uint16_t *p16;
	int64_t c, nchunks;

	if (n < 0 || step < 1)
		return -EINVAL;
	bc1 = 1.0 - pow(beta1, (double)step);
	bc2 = 1.0 - pow(beta2, (double)step);
	k.decay = (float)(1.0 - lr * weight_decay);
	k.b1 = (float)beta1;
	k.omb1 = (float)(1.0 - beta1);
	k.b2 = (float)beta2;
	k.omb2 = (float)(1.0 - beta2);
	k.bc2_sqrt = (float)sqrt(bc2);
	k.neg_step = (float)(-lr / bc1);
	k.eps = (float)eps;
	p16 = cpu_param_bf16_whole(dev, p, n);
	nchunks = (n + ADAMW_CHUNK - 1) / ADAMW_CHUNK;
	cpu_enter(dev);
#pragma omp parallel for schedule(static)
	for (c = 0; c < nchunks; c++) {
		int64_t lo = c * ADAMW_CHUNK, hi = n - lo < ADAMW_CHUNK ? n : lo + ADAMW_CHUNK;

		adamw_chunk(&k, p, grad, m, v, p16, grad_scale, lo, hi);
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
