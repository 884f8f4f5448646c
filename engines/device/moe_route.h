/* moe_route.h — one token's routing of a mixture of experts, the rule both
 * devices run (cpu_moe.c per OpenMP iteration, cuda_moe.cu per thread), so
 * that the choice, its order and its gradient are written once: device.h's
 * moe_route_fwd and moe_route_bwd for one row.
 *
 * The softmax uses expf (libm's on the CPU, CUDA's within 2 ulp): a row has
 * only E terms, and the choice must be transformers'. The k best are kept
 * highest first by insertion; a tie keeps the lower index ahead.
 */
#ifndef ENGINED_DEVICE_MOE_ROUTE_H
#define ENGINED_DEVICE_MOE_ROUTE_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#ifdef __CUDACC__
#define MOE_HD __host__ __device__
#else
#define MOE_HD
#endif

/* The routing kernels' shapes (both devices): T >= 0 tokens, k of E
 * experts, 1 <= k <= E, and k <= max_k (a device's own bound). */
static inline bool moe_route_shape_ok(int64_t T, int64_t E, int64_t k, int64_t max_k)
{
	return T >= 0 && E >= 1 && k >= 1 && k <= E && k <= max_k;
}

/* p[E]: the logits in, the probabilities out; ix[k], w[k] the choice
 * (forced: ix[k] is given). */
static inline MOE_HD void moe_route_row_fwd(float *p, int32_t *ix, float *w, int64_t E,
					    int64_t k, bool norm, bool forced)
{
	float mx = p[0], sum = 0.0f, top = 0.0f;

	for (int64_t e = 1; e < E; e++)
		mx = p[e] > mx ? p[e] : mx;
	for (int64_t e = 0; e < E; e++) {
		p[e] = expf(p[e] - mx);
		sum += p[e];
	}
	for (int64_t e = 0; e < E; e++)
		p[e] /= sum;
	for (int64_t e = 0, n = 0; e < E && !forced; e++) {
		int64_t j;

		if (n == k && !(p[e] > p[ix[k - 1]]))
			continue;       /* no better than the last kept */
		j = n < k ? n++ : k - 1;   /* full: the last one goes */
		while (j > 0 && p[e] > p[ix[j - 1]]) {
			ix[j] = ix[j - 1];
			j--;
		}
		ix[j] = (int32_t)e;
	}
	for (int64_t j = 0; j < k; j++)
		top += p[ix[j]];
	for (int64_t j = 0; j < k; j++)
		w[j] = norm ? p[ix[j]] / top : p[ix[j]];
}

/* z[E] = the logits' gradient from d[k] (the weights') and aux[E] (the
 * probabilities' own, every expert's: the router's auxiliary loss; NULL:
 * none). With s the sum of the chosen probabilities: normalised w_j = p_j
 * / s gives dp_j = (d_j - sum_i d_i w_i) / s, else dp_j = d_j; dp_e +=
 * aux_e; the softmax then z_e = p_e (dp_e - sum_e' dp_e' p_e'). */
static inline MOE_HD void moe_route_row_bwd(float *z, const float *d, const float *p,
					    const int32_t *ix, const float *w, const float *aux,
					    int64_t E, int64_t k, bool norm)
{
	float s = 0.0f, g = 0.0f, dot = 0.0f;

	for (int64_t j = 0; j < k; j++) {
		s += p[ix[j]];
		g += d[j] * w[j];
	}
	for (int64_t e = 0; e < E; e++)
		z[e] = aux ? aux[e] : 0.0f;
	for (int64_t j = 0; j < k; j++)
		z[ix[j]] += norm ? (d[j] - g) / s : d[j];
	for (int64_t e = 0; e < E; e++)
		dot += z[e] * p[e];
	for (int64_t e = 0; e < E; e++)
		z[e] = p[e] * (z[e] - dot);
}

/* One row of a combine's backward (moe_combine_bwd's per choice, the
 * shared expert's gate per token: device.h): dy[C] = a d[C], and d . y
 * summed in index order, the rule both devices run. */
static inline MOE_HD float moe_scale_dot(float *dy, const float *d, const float *y, float a,
					 int64_t C)
{
	float s = 0.0f;

	for (int64_t c = 0; c < C; c++) {
		dy[c] = a * d[c];
		s += d[c] * y[c];
	}
	return s;
}

/* sigmoid(z) as torch computes it in fp32. */
static inline MOE_HD float moe_sigmoid(float z)
{
	return 1.0f / (1.0f + expf(-z));
}

#endif
