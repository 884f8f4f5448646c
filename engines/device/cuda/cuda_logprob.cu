/* cuda_logprob.cu — fused logits -> log-prob / entropy and their backward
 * on the GPU, one block per row of V logits (V up to 151936 and beyond).
 *
 * Per row at temperature (z = logits * inv_temp), in one pass over the row:
 * each thread keeps an online (max m, S = sum exp(z - m), Z = sum exp(z - m)
 * (z - m)) over its strided elements in fp32; the threads' states are then
 * merged by a fixed tree in double, rescaling to the common max:
 *   S = sum_i a_i S_i,  Z = sum_i a_i (Z_i + S_i (m_i - M)),  a_i = exp(m_i - M).
 * Then, as on the CPU (cpu_logprob.c):
 *   logp = (z[target] - M) - log S,   ent = log S - Z / S.
 * The backward recomputes the row's state the same way and overwrites the
 * row with
 *   dl_j = inv_temp (a (onehot_j - p_j) - b p_j (zs_j - Z/S)),  zs = z - M.
 * Fixed trees and launch shapes: bit-identical run after run.
 *
 * Refinements of device.h (as the CPU device): `ent` may be NULL (entropy
 * skipped), `dlogp` and `dent` may be NULL (zeros); inv_temp must be > 0.
 * Unlike the CPU device, a target >= V cannot be rejected before the launch
 * (the targets are in device memory): its row gets logp = NaN in the
 * forward and no target term in the backward.
 */
#include <math.h>

#include "cuda_common.cuh"

#define LP_THREADS 1024

struct lp_state {
	float m;          /* running max of z (-inf: empty) */
	float s;          /* sum exp(z - m) */
	float z;          /* sum exp(z - m) (z - m) */
};

__device__ __forceinline__ void lp_add(struct lp_state *st, float z, bool want_z)
{
	if (z > st->m) {
		/* rescale to the new max; an empty state (m = -inf) has s = 0 */
		float sc = st->s > 0.0f ? expf(st->m - z) : 0.0f;

		if (want_z)
			st->z = st->s > 0.0f ? sc * (st->z + st->s * (st->m - z)) : 0.0f;
		st->s = st->s * sc + 1.0f;
		st->m = z;
	} else {
		float d = z - st->m, e = expf(d);

		st->s += e;
		if (want_z)
			st->z += e * d;
	}
}

/* Row statistics of l[V] (block-wide): max M, S and Z relative to M, in
 * double; valid in every thread on return. */
__device__ void row_stats(const float *l, int64_t V, float inv_temp, bool want_z,
			  float *ret_m, double *ret_s, double *ret_z)
{
	__shared__ float sm_m[LP_THREADS];
	__shared__ double sm_s[LP_THREADS], sm_z[LP_THREADS];
	struct lp_state st = { -INFINITY, 0.0f, 0.0f };
	int t = threadIdx.x;

	for (int64_t j = t; j < V; j += LP_THREADS)
		lp_add(&st, l[j] * inv_temp, want_z);
	sm_m[t] = st.m;
	sm_s[t] = st.s;
	sm_z[t] = st.z;
	__syncthreads();
	/* fixed tree: thread t merges t + half into t */
	for (int half = LP_THREADS / 2; half > 0; half >>= 1) {
		if (t < half) {
			float m1 = sm_m[t], m2 = sm_m[t + half];
			double s1 = sm_s[t], s2 = sm_s[t + half];
			double z1 = sm_z[t], z2 = sm_z[t + half];
			float M = fmaxf(m1, m2);

			if (s1 != s1 || s2 != s2) {
				/* a NaN logit makes the row NaN, as on the CPU */
				sm_s[t] = NAN;
				sm_z[t] = NAN;
			} else if (s2 > 0.0 && s1 > 0.0) {
				double a1 = exp((double)m1 - M), a2 = exp((double)m2 - M);

				sm_s[t] = a1 * s1 + a2 * s2;
				sm_z[t] = a1 * (z1 + s1 * ((double)m1 - M)) +
					  a2 * (z2 + s2 * ((double)m2 - M));
				sm_m[t] = M;
			} else if (s2 > 0.0) {
				/* only the second has elements */
				sm_m[t] = m2;
				sm_s[t] = s2;
				sm_z[t] = z2;
			}
		}
		__syncthreads();
	}
	*ret_m = sm_m[0];
	*ret_s = sm_s[0];
	*ret_z = sm_z[0];
}

__global__ void logprob_fwd_kernel(float *logp, float *ent, const float *logits,
				   const int32_t *target, int64_t V, float inv_temp)
{
	int64_t r = blockIdx.x;
	const float *l = logits + r * V;
	float M;
	double S, Z, log_s;

	row_stats(l, V, inv_temp, ent != NULL, &M, &S, &Z);
	if (threadIdx.x != 0)
		return;
	log_s = log(S);
	if (target[r] >= V)
		logp[r] = NAN;
	else if (target[r] >= 0)
		logp[r] = (float)((double)(l[target[r]] * inv_temp - M) - log_s);
	else
		logp[r] = 0.0f;
	if (ent)
		ent[r] = (float)(log_s - Z / S);
}

__global__ void logprob_bwd_kernel(float *logits, const int32_t *target, const float *dlogp,
				   const float *dent, int64_t V, float inv_temp)
{
	int64_t r = blockIdx.x;
	float *l = logits + r * V;
	int32_t tg = target[r];
	float a = (dlogp && tg >= 0 && tg < V) ? dlogp[r] : 0.0f;
	float b = dent ? dent[r] : 0.0f;
	float M, inv_s, zbar;
	double S, Z;

	row_stats(l, V, inv_temp, b != 0.0f, &M, &S, &Z);
	inv_s = (float)(1.0 / S);
	zbar = (float)(Z / S);
	for (int64_t j = threadIdx.x; j < V; j += LP_THREADS) {
		float zs = l[j] * inv_temp - M;
		float p = expf(zs) * inv_s;

		l[j] = -inv_temp * p * (a + b * (zs - zbar));
	}
	__syncthreads();
	if (threadIdx.x == 0 && tg >= 0 && tg < V)
		l[tg] += inv_temp * a;
}

static int check(int64_t R, int64_t V, float inv_temp)
{
	if (R < 0 || V <= 0 || !(inv_temp > 0.0f) || R > INT32_MAX)
		return -EINVAL;
	return 0;
}

extern "C" int cuda_logprob_fwd(struct device *dev, float *logp, float *ent,
				const float *logits, const int32_t *target,
				int64_t R, int64_t V, float inv_temp)
{
	int r = cuda_alive(dev);

	if (r)
		return r;
	r = check(R, V, inv_temp);
	if (r || R == 0)
		return r;
	logprob_fwd_kernel<<<(unsigned int)R, LP_THREADS, 0, cuda_stream(dev)>>>(
		logp, ent, logits, target, V, inv_temp);
	return cuda_launched(dev);
}

extern "C" int cuda_logprob_bwd(struct device *dev, float *logits, const int32_t *target,
				const float *dlogp, const float *dent,
				int64_t R, int64_t V, float inv_temp)
{
	int r = cuda_alive(dev);

	if (r)
		return r;
	r = check(R, V, inv_temp);
	if (r || R == 0)
		return r;
	logprob_bwd_kernel<<<(unsigned int)R, LP_THREADS, 0, cuda_stream(dev)>>>(
		logits, target, dlogp, dent, V, inv_temp);
	return cuda_launched(dev);
}
