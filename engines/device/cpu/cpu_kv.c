/* cpu_kv.c — the paged key/value cache's kernels on the CPU (device.h:
 * kv_write, attention_paged): decoding and chunked prefill attend over a
 * sequence's cached positions, one (token, head) per work item.
 *
 * A work item gathers its scores s_j = scale q . k_j for j = 0 .. pos from
 * the sequence's blocks into per-thread scratch, then does what a row of
 * attention_fwd does: max, e_j = exp(s_j - max), their sum, out = sum_j
 * e_j v_j, times 1 / sum. The dot products and the weighted sum are plain
 * vector loops, not attention_fwd's oneDNN panels, so the roundings differ
 * from the full forward's (fp32 accuracy; docs/SAMPLING.md says how close).
 */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "err.h"
#include "cpu_device.h"
#include "cpu_math.h"

int cpu_kv_write(struct device *dev, float *kcache, float *vcache, const float *k,
		 const float *v, const int32_t *slots, int64_t T, int64_t KV, int64_t D)
{
	int64_t row = KV * D, t;

	if (T < 0 || KV < 0 || D < 0)
		return -EINVAL;
	for (t = 0; t < T; t++)
		if (slots[t] < 0)
			return -EINVAL;
	cpu_enter(dev);
#pragma omp parallel for schedule(static)
	for (t = 0; t < T; t++) {
		memcpy(kcache + (int64_t)slots[t] * row, k + t * row, (size_t)row * sizeof(float));
		memcpy(vcache + (int64_t)slots[t] * row, v + t * row, (size_t)row * sizeof(float));
	}
	return 0;
}

struct paged {
	const float *q, *kc, *vc;
	const int32_t *tables, *table_off, *pos;
	float *out, *ws;
	int64_t H, KV, D, G, block, ws_floats;
	float scale;
};

static void paged_item(const struct paged *p, int64_t it)
{
	const int64_t t = it / p->H, h = it % p->H, kvh = h / p->G, D = p->D;
	const int64_t n = (int64_t)p->pos[t] + 1, row = p->KV * D;
	const int32_t *table = p->tables + p->table_off[t];
	const float *q = p->q + (t * p->H + h) * D;
	float *s = p->ws + (int64_t)omp_get_thread_num() * p->ws_floats;
	float *o = p->out + (t * p->H + h) * D;
	float mx = -INFINITY, sum, inv;
	int64_t j, d;

	/* Scores a block (16 positions, contiguous rows) at a time; each dot
	 * product one FMA chain in d order, as oneDNN's panel products in
	 * attention_fwd form them, vectorized across the block's keys. */
	for (j = 0; j < n; j += p->block) {
		const int64_t nb = n - j < p->block ? n - j : p->block;
		const float *kb = p->kc + (int64_t)table[j / p->block] * p->block * row + kvh * D;
		float *sj = s + j;

		for (int64_t i = 0; i < nb; i++)
			sj[i] = 0.0f;
		for (d = 0; d < D; d++) {
			const float qd = q[d];

#pragma omp simd
			for (int64_t i = 0; i < nb; i++)
				sj[i] = fmaf(qd, kb[i * row + d], sj[i]);
		}
		for (int64_t i = 0; i < nb; i++) {
			sj[i] *= p->scale;
			mx = sj[i] > mx ? sj[i] : mx;
		}
	}
	sum = cpu_exp_shift_sum(s, n, mx);
	memset(o, 0, (size_t)D * sizeof(float));
	for (j = 0; j < n; j++) {
		const float *vj = p->vc + ((int64_t)table[j / p->block] * p->block +
					   j % p->block) * row + kvh * D;
		const float e = s[j];

#pragma omp simd
		for (d = 0; d < D; d++)
			o[d] = fmaf(e, vj[d], o[d]);
	}
	inv = 1.0f / sum;
#pragma omp simd
	for (d = 0; d < D; d++)
		o[d] *= inv;
}

int cpu_attention_paged(struct device *dev, float *out, const float *q, const float *kcache,
			const float *vcache, const int32_t *tables, const int32_t *table_off,
			const int32_t *pos, int64_t T, int64_t H, int64_t KV, int64_t D,
			int64_t block, float scale)
{
	struct paged p = {
		.q = q, .kc = kcache, .vc = vcache, .tables = tables, .table_off = table_off,
		.pos = pos, .out = out, .H = H, .KV = KV, .D = D,
		.block = block, .scale = scale,
	};
	int64_t longest = 0, it;

	if (T < 0 || H <= 0 || KV <= 0 || D <= 0 || H % KV || block <= 0)
		return -EINVAL;
	for (int64_t t = 0; t < T; t++) {
		if (pos[t] < 0 || table_off[t] < 0)
			return -EINVAL;
		longest = pos[t] + 1 > longest ? pos[t] + 1 : longest;
	}
	if (T == 0)
		return 0;
	cpu_enter(dev);
	p.G = H / KV;
	p.ws_floats = (longest + 15) & ~(int64_t)15;
	p.ws = cpu_scratch(dev, CPU_SCRATCH_TILES,
			   (size_t)(omp_get_max_threads() * p.ws_floats) * sizeof(float));
	if (!p.ws)
		return -ENOMEM;
#pragma omp parallel for schedule(dynamic, 4)
	for (it = 0; it < T * H; it++)
		paged_item(&p, it);
	return 0;
}
