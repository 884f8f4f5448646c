/* cpu_logprob.c — fused logits -> log-prob / entropy and their backward.
 *
 * Per row of V logits at temperature (z = logits * inv_temp), with
 * zs = z - max(z) (stable: every exp argument is <= 0):
 *   S = sum exp(zs), lse = max + log S, p = exp(zs) / S
 *   logp = z[target] - lse
 *   ent = lse - sum p z = log S - sum exp(zs) zs / S
 * The sums are taken over blocks of SUM_BLOCK elements in fp32 vector lanes
 * and the block sums added in double, in a fixed order. Rows are
 * independent and the loop is parallel over rows.
 *
 * Refinements of device.h: `ent` may be NULL in the forward (the entropy
 * sum is then skipped); `dlogp` and `dent` may be NULL in the backward
 * (read as zeros). target[r] >= V is rejected with -EINVAL before any
 * output is written; inv_temp must be > 0.
 */
#include <math.h>

#include "err.h"
#include "cpu_device.h"
#include "cpu_math.h"

#define SUM_BLOCK 2048

struct row_stats {
	float max;       /* max of z */
	double sum;      /* S = sum exp(z - max) */
	double zsum;     /* sum exp(z - max) (z - max), when asked */
};

static void row_stats(struct row_stats *st, const float *l, int64_t V,
		      float inv_temp, bool want_z)
{
	float mx = -INFINITY;
	double sum = 0.0, zsum = 0.0;
	int64_t j, b;

#pragma omp simd reduction(max:mx)
	for (j = 0; j < V; j++) {
		float z = l[j] * inv_temp;

		/* not fmaxf: glibc's is an out-of-line call GCC won't vectorize */
		mx = z > mx ? z : mx;
	}
	for (b = 0; b < V; b += SUM_BLOCK) {
		int64_t e = V - b < SUM_BLOCK ? V : b + SUM_BLOCK;
		float s = 0.0f, zs = 0.0f;

		if (want_z) {
#pragma omp simd reduction(+:s, zs)
			for (j = b; j < e; j++) {
				float d = l[j] * inv_temp - mx;
				float ex = cpu_expf(d);

				s += ex;
				zs += ex * d;
			}
		} else {
#pragma omp simd reduction(+:s)
			for (j = b; j < e; j++)
				s += cpu_expf(l[j] * inv_temp - mx);
		}
		sum += s;
		zsum += zs;
	}
	st->max = mx;
	st->sum = sum;
	st->zsum = zsum;
}

static int check_args(const int32_t *target, int64_t R, int64_t V, float inv_temp)
{
	int64_t r;

	if (R < 0 || V <= 0 || !(inv_temp > 0.0f))
		return -EINVAL;
	for (r = 0; r < R; r++) {
		if (target[r] >= V)
			return -EINVAL;
	}
	return 0;
}

int cpu_logprob_fwd(struct device *dev, float *logp, float *ent,
		    const float *logits, const int32_t *target,
		    int64_t R, int64_t V, float inv_temp)
{
	int64_t r;
	int err;

	err = check_args(target, R, V, inv_temp);
	if (err < 0)
		return err;
	cpu_enter(dev);
#pragma omp parallel for schedule(dynamic, 1)
	for (r = 0; r < R; r++) {
		const float *l = logits + r * V;
		struct row_stats st;
		double log_s;

		row_stats(&st, l, V, inv_temp, ent != NULL);
		log_s = log(st.sum);
		if (target[r] >= 0)
			logp[r] = (float)((double)(l[target[r]] * inv_temp - st.max) - log_s);
		else
			logp[r] = 0.0f;
		if (ent)
			ent[r] = (float)(log_s - st.zsum / st.sum);
	}
	return 0;
}

int cpu_logprob_bwd(struct device *dev, float *logits, const int32_t *target,
		    const float *dlogp, const float *dent,
		    int64_t R, int64_t V, float inv_temp)
{
	int64_t r;
	int err;

	err = check_args(target, R, V, inv_temp);
	if (err < 0)
		return err;
	cpu_enter(dev);
#pragma omp parallel for schedule(dynamic, 1)
	for (r = 0; r < R; r++) {
		float *l = logits + r * V;
		float a = (dlogp && target[r] >= 0) ? dlogp[r] : 0.0f;
		float b = dent ? dent[r] : 0.0f;
		struct row_stats st;
		float inv_s, zbar, mx;
		int64_t j;

		row_stats(&st, l, V, inv_temp, b != 0.0f);
		inv_s = (float)(1.0 / st.sum);
		zbar = (float)(st.zsum / st.sum);   /* sum p (z - max) */
		mx = st.max;
		/* dl_j = inv_temp (a (onehot_j - p_j) - b p_j (zs_j - zbar)) */
#pragma omp simd
		for (j = 0; j < V; j++) {
			float zs = l[j] * inv_temp - mx;
			float p = cpu_expf(zs) * inv_s;

			l[j] = -inv_temp * p * (a + b * (zs - zbar));
		}
		if (target[r] >= 0)
			l[target[r]] += inv_temp * a;
	}
	return 0;
}

/* --- vocabulary chunks (online softmax) --------------------------------- */

static int check_chunk(const int32_t *target, int64_t R, int64_t v0, int64_t Vc,
		       float inv_temp)
{
	if (R < 0 || v0 < 0 || Vc <= 0 || !(inv_temp > 0.0f))
		return -EINVAL;
	(void)target;
	return 0;
}

int cpu_logprob_chunk_fwd(struct device *dev, struct logprob_stats *stats,
			  const float *logits, const int32_t *target,
			  int64_t R, int64_t v0, int64_t Vc, float inv_temp, bool first)
{
	int64_t r;
	int err;

	err = check_chunk(target, R, v0, Vc, inv_temp);
	if (err < 0)
		return err;
	cpu_enter(dev);
#pragma omp parallel for schedule(dynamic, 1)
	for (r = 0; r < R; r++) {
		const float *l = logits + r * Vc;
		struct logprob_stats *st = &stats[r];
		struct row_stats c;
		int64_t t = target[r];

		row_stats(&c, l, Vc, inv_temp, true);
		if (first) {
			st->max = c.max;
			st->sum = c.sum;
			st->zsum = c.zsum;
			st->zt = 0.0;
		} else {
			/* merge: rebase both parts on the larger max M */
			double M = st->max > c.max ? st->max : c.max;
			double e1 = exp(st->max - M), e2 = exp((double)c.max - M);

			st->zsum = e1 * (st->zsum + (st->max - M) * st->sum) +
				   e2 * (c.zsum + ((double)c.max - M) * c.sum);
			st->sum = e1 * st->sum + e2 * c.sum;
			st->max = M;
		}
		if (t >= v0 && t < v0 + Vc)
			st->zt = (double)(l[t - v0] * inv_temp);
	}
	return 0;
}

int cpu_logprob_chunk_finish(struct device *dev, float *logp, float *ent, float *lse,
			     float *ez, const struct logprob_stats *stats,
			     const int32_t *target, int64_t R)
{
	int64_t r;

	if (R < 0)
		return -EINVAL;
	cpu_enter(dev);
#pragma omp parallel for schedule(static)
	for (r = 0; r < R; r++) {
		const struct logprob_stats *st = &stats[r];
		double log_s = log(st->sum), l = st->max + log_s;

		logp[r] = target[r] >= 0 ? (float)(st->zt - l) : 0.0f;
		if (ent)
			ent[r] = (float)(log_s - st->zsum / st->sum);
		lse[r] = (float)l;
		ez[r] = (float)(st->max + st->zsum / st->sum);
	}
	return 0;
}

int cpu_logprob_chunk_bwd(struct device *dev, float *logits, const int32_t *target,
			  const float *lse, const float *ez, const float *dlogp,
			  const float *dent, int64_t R, int64_t v0, int64_t Vc,
			  float inv_temp)
{
	int64_t r;
	int err;

	err = check_chunk(target, R, v0, Vc, inv_temp);
	if (err < 0)
		return err;
	cpu_enter(dev);
#pragma omp parallel for schedule(dynamic, 1)
	for (r = 0; r < R; r++) {
		float *l = logits + r * Vc;
		float a = (dlogp && target[r] >= 0) ? dlogp[r] : 0.0f;
		float b = dent ? dent[r] : 0.0f;
		float L = lse[r], E = ez[r];
		int64_t t = target[r], j;

		/* dl_j = inv_temp (a (onehot_j - p_j) - b p_j (z_j - ez)) */
#pragma omp simd
		for (j = 0; j < Vc; j++) {
			float z = l[j] * inv_temp;
			float p = cpu_expf(z - L);

			l[j] = -inv_temp * p * (a + b * (z - E));
		}
		if (t >= v0 && t < v0 + Vc)
			l[t - v0] += inv_temp * a;
	}
	return 0;
}
