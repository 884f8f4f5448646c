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
	if (z == -INFINITY)
		return;   /* exp(-inf) = 0: no term (and no -inf - -inf) */
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

/* Row statistics of l[V] (block-wide, NT threads): max M, S and Z
 * relative to M, in double; valid in every thread on return. */
template <int NT>
__device__ void row_stats(const float *l, int64_t V, float inv_temp, bool want_z,
			  float *ret_m, double *ret_s, double *ret_z)
{
	__shared__ float sm_m[NT];
	__shared__ double sm_s[NT], sm_z[NT];
	struct lp_state st = { -INFINITY, 0.0f, 0.0f };
	int t = threadIdx.x;

	for (int64_t j = t; j < V; j += NT)
		lp_add(&st, l[j] * inv_temp, want_z);
	sm_m[t] = st.m;
	sm_s[t] = st.s;
	sm_z[t] = st.z;
	__syncthreads();
	/* fixed tree: thread t merges t + half into t */
	for (int half = NT / 2; half > 0; half >>= 1) {
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

	row_stats<LP_THREADS>(l, V, inv_temp, ent != NULL, &M, &S, &Z);
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

	row_stats<LP_THREADS>(l, V, inv_temp, b != 0.0f, &M, &S, &Z);
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

/* ---- vocabulary chunks (online softmax across chunks) --------------------
 *
 * The LM head's tiles: logits[R, Vc] are columns [v0, v0 + Vc) of R rows.
 * chunk_fwd computes each row's chunk statistics as above (one block per
 * row, CHUNK_THREADS threads) and merges them into stats[r] in double,
 * rebasing both parts on the larger max (the CPU device's formulas):
 *   Z = e1 (Z1 + (m1 - M) S1) + e2 (Z2 + (m2 - M) S2),  S = e1 S1 + e2 S2.
 * finish turns the statistics into logp, entropy, lse and ez = sum p z;
 * chunk_bwd is elementwise given lse and ez. Rows merge chunks in the
 * order the caller gives them: deterministic.
 */
#define CHUNK_THREADS 256

__global__ void chunk_fwd_kernel(struct logprob_stats *stats, const float *logits,
				 const int32_t *target, int64_t v0, int64_t Vc, float inv_temp,
				 bool first)
{
	int64_t r = blockIdx.x;
	const float *l = logits + r * Vc;
	struct logprob_stats *st = &stats[r];
	int64_t t = target[r];
	float cm;
	double cs, cz;

	row_stats<CHUNK_THREADS>(l, Vc, inv_temp, true, &cm, &cs, &cz);
	if (threadIdx.x != 0)
		return;
	if (first) {
		st->max = cm;
		st->sum = cs;
		st->zsum = cz;
		st->zt = 0.0;
	} else {
		double M = st->max > (double)cm ? st->max : (double)cm;
		double e1 = exp(st->max - M), e2 = exp((double)cm - M);

		st->zsum = e1 * (st->zsum + (st->max - M) * st->sum) +
			   e2 * (cz + ((double)cm - M) * cs);
		st->sum = e1 * st->sum + e2 * cs;
		st->max = M;
	}
	if (t >= v0 && t < v0 + Vc)
		st->zt = (double)(l[t - v0] * inv_temp);
}

__global__ void chunk_finish_kernel(float *logp, float *ent, float *lse, float *ez,
				    const struct logprob_stats *stats, const int32_t *target,
				    int64_t R)
{
	for (int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r < R;
	     r += (int64_t)gridDim.x * blockDim.x) {
		const struct logprob_stats *st = &stats[r];
		double log_s = log(st->sum), L = st->max + log_s;

		logp[r] = target[r] >= 0 ? (float)(st->zt - L) : 0.0f;
		if (ent)
			ent[r] = (float)(log_s - st->zsum / st->sum);
		lse[r] = (float)L;
		ez[r] = (float)(st->max + st->zsum / st->sum);
	}
}

/* dl_j = inv_temp (a (onehot_j - p_j) - b p_j (z_j - ez)), p = exp(z - lse);
 * rows over blockIdx.y (grid-stride), columns over x. */
__global__ void chunk_bwd_kernel(float *logits, const int32_t *target, const float *lse,
				 const float *ez, const float *dlogp, const float *dent,
				 int64_t R, int64_t v0, int64_t Vc, float inv_temp)
{
	for (int64_t r = blockIdx.y; r < R; r += gridDim.y) {
		float *l = logits + r * Vc;
		int64_t t = target[r];
		float a = (dlogp && t >= 0) ? dlogp[r] : 0.0f;
		float b = dent ? dent[r] : 0.0f;
		float L = lse[r], E = ez[r];

		for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < Vc;
		     j += (int64_t)gridDim.x * blockDim.x) {
			float z = l[j] * inv_temp;
			float p = expf(z - L);
			float d = -inv_temp * p * (a + b * (z - E));

			l[j] = j == t - v0 ? d + inv_temp * a : d;
		}
	}
}

static int check_chunk(int64_t R, int64_t v0, int64_t Vc, float inv_temp)
{
	if (R < 0 || v0 < 0 || Vc <= 0 || !(inv_temp > 0.0f) || R > INT32_MAX)
		return -EINVAL;
	return 0;
}

extern "C" int cuda_logprob_chunk_fwd(struct device *dev, struct logprob_stats *stats,
				      const float *logits, const int32_t *target,
				      int64_t R, int64_t v0, int64_t Vc, float inv_temp,
				      bool first)
{
	int r = cuda_alive(dev);

	if (r)
		return r;
	r = check_chunk(R, v0, Vc, inv_temp);
	if (r || R == 0)
		return r;
	chunk_fwd_kernel<<<(unsigned int)R, CHUNK_THREADS, 0, cuda_stream(dev)>>>(
		stats, logits, target, v0, Vc, inv_temp, first);
	return cuda_launched(dev);
}

extern "C" int cuda_logprob_chunk_finish(struct device *dev, float *logp, float *ent,
					 float *lse, float *ez,
					 const struct logprob_stats *stats,
					 const int32_t *target, int64_t R)
{
	int r = cuda_alive(dev);

	if (r)
		return r;
	if (R < 0)
		return -EINVAL;
	if (R == 0)
		return 0;
	chunk_finish_kernel<<<ew_blocks(dev, R), EW_THREADS, 0, cuda_stream(dev)>>>(
		logp, ent, lse, ez, stats, target, R);
	return cuda_launched(dev);
}

extern "C" int cuda_logprob_chunk_bwd(struct device *dev, float *logits,
				      const int32_t *target, const float *lse,
				      const float *ez, const float *dlogp, const float *dent,
				      int64_t R, int64_t v0, int64_t Vc, float inv_temp)
{
	dim3 grid((unsigned int)((Vc + EW_THREADS - 1) / EW_THREADS),
		  (unsigned int)(R < 65535 ? R : 65535));
	int r = cuda_alive(dev);

	if (r)
		return r;
	r = check_chunk(R, v0, Vc, inv_temp);
	if (r || R == 0)
		return r;
	if (grid.x > 64)
		grid.x = 64;
	chunk_bwd_kernel<<<grid, EW_THREADS, 0, cuda_stream(dev)>>>(
		logits, target, lse, ez, dlogp, dent, R, v0, Vc, inv_temp);
	return cuda_launched(dev);
}
