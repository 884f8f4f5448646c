/* sampler.c — the host-side token sampler (see sampler.h for the
 * definitions). Per row: one pass for the argmax, one for the exp sum (its
 * terms kept by id), then either a walk in id order (no cut), or a top_k
 * heap and a sort of the candidates (top_k / top_p) and a walk best first.
 * top_p alone sorts only the tokens that can be in the nucleus.
 */
#include "sampler.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

struct cand {
	float z;
	int32_t id;
};

struct sampler_work {
	int64_t V;
	double *e;        /* [V] exp(zz - m) by token id */
	struct cand *c;   /* [V] candidates of a cut: a heap, then best first */
};

struct sampler_work *sampler_work_new(int64_t V)
{
	struct sampler_work *w;

	if (V < 1 || V > INT32_MAX)
		return NULL;
	w = calloc(1, sizeof(*w));
	if (!w)
		return NULL;
	w->V = V;
	w->e = calloc((size_t)V, sizeof(*w->e));
	w->c = calloc((size_t)V, sizeof(*w->c));
	if (!w->e || !w->c) {
		sampler_work_free(w);
		return NULL;
	}
	return w;
}

void sampler_work_free(struct sampler_work *w)
{
	if (!w)
		return;
	free(w->e);
	free(w->c);
	free(w);
}

static uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

uint64_t sampler_stream_seed(uint64_t seed, int32_t prompt, int32_t sample)
{
	const uint64_t golden = 0x9e3779b97f4a7c15ull;
	uint64_t h = mix64(seed + golden);

	/* for a fixed h each step is a bijection of its input */
	h = mix64(h + golden + (uint32_t)prompt);
	return mix64(h + golden + (uint32_t)sample);
}

/* The best-first order: z descending, ties by lower id. */
static inline bool before(struct cand a, struct cand b)
{
	return a.z > b.z || (a.z == b.z && a.id < b.id);
}

static int cand_cmp(const void *pa, const void *pb)
{
	const struct cand *a = pa, *b = pb;

	return before(*a, *b) ? -1 : before(*b, *a);
}

/* Heap of the best seen so far, its worst at c[0]: x enters at slot j. */
static void heap_up(struct cand *c, int64_t j, struct cand x)
{
	while (j > 0 && before(c[(j - 1) / 2], x)) {
		c[j] = c[(j - 1) / 2];
		j = (j - 1) / 2;
	}
	c[j] = x;
}

/* x replaces the worst, c[0], of the full heap c[n]. */
static void heap_down(struct cand *c, int64_t n, struct cand x)
{
	int64_t j = 0, ch;

	while ((ch = 2 * j + 1) < n) {
		if (ch + 1 < n && before(c[ch], c[ch + 1]))
			ch++;
		if (!before(x, c[ch]))
			break;
		c[j] = c[ch];
		j = ch;
	}
	c[j] = x;
}

/* c[0..k) = the k best tokens of z[V], in heap order. */
static void select_top_k(const float *z, int64_t V, int64_t k, struct cand *c)
{
	for (int64_t i = 0; i < V; i++) {
		struct cand x = { z[i], (int32_t)i };

		if (i < k)
			heap_up(c, i, x);
		else if (before(x, c[0]))
			heap_down(c, k, x);
	}
}

/* Temperature > 0 with a top_k or top_p cut: the walk is best first.
 * s: the sum of e[V] (the candidates' total without top_k). */
static int32_t pick_cut(const struct sampler_params *p, const float *z, int64_t V,
			double u, double s, struct sampler_work *w)
{
	const double *e = w->e;
	struct cand *c = w->c;
	int64_t n = 0, keep, j;
	double tot = 0, cum = 0;

	if (p->top_k > 0 && p->top_k < V) {
		n = p->top_k;
		select_top_k(z, V, n, c);
		qsort(c, (size_t)n, sizeof(*c), cand_cmp);
		for (j = 0; j < n; j++)
			tot += e[c[j].id];
	} else {
		/* top_p alone. A token of weight <= (s - bar) / 2V has better
		 * tokens summing to >= (s + bar) / 2 > bar: it is never in the
		 * nucleus, so only the others are sorted (same result; the
		 * margin dwarfs the rounding of the sums). */
		const double thr = 0.5 * (s - (double)p->top_p * s) / (double)V;

		for (j = 0; j < V; j++)
			if (e[j] > thr)
				c[n++] = (struct cand){ z[j], (int32_t)j };
		qsort(c, (size_t)n, sizeof(*c), cand_cmp);
		tot = s;
	}
	keep = n;
	if (p->top_p < 1.0f) {
		const double bar = (double)p->top_p * tot;

		for (j = 0; j < n; j++) {
			cum += e[c[j].id];
			if (cum >= bar)
				break;
		}
		keep = j < n ? j + 1 : n;
		tot = cum;      /* renormalized over the kept tokens */
	}
	cum = 0;
	for (j = 0; j < keep; j++) {
		cum += e[c[j].id];
		if (cum > u * tot)
			return c[j].id;
	}
	return c[keep - 1].id;
}

/* No cut: the walk in id order over the weights of the exp sum. */
static int32_t pick_all(const double *e, int64_t V, double target)
{
	double cum = 0;

	for (int64_t i = 0; i < V; i++) {
		cum += e[i];
		if (cum > target)
			return (int32_t)i;
	}
	return (int32_t)(V - 1);
}

/* ids[n] = the n best tokens of z[V], best first (insertion; n is small). */
static void best_ids(const float *z, int64_t V, int n, int32_t *ids)
{
	int have = 0, j;

	for (int64_t i = 0; i < V; i++) {
		struct cand x = { z[i], (int32_t)i };

		if (have == n && !before(x, (struct cand){ z[ids[n - 1]], ids[n - 1] }))
			continue;
		j = have < n ? have++ : n - 1;
		for (; j > 0 && before(x, (struct cand){ z[ids[j - 1]], ids[j - 1] }); j--)
			ids[j] = ids[j - 1];
		ids[j] = x.id;
	}
}

void sampler_pick(const struct sampler_params *p, const float *z, int64_t V, double u,
		  struct sampler_work *w, int32_t *token, float *logp,
		  int32_t *top_ids, float *top_logps)
{
	const bool greedy = !(p->temperature > 0.0f);
	const float inv = greedy ? 1.0f : 1.0f / p->temperature;   /* as the forward */
	int64_t amax = 0, i;
	double m, s = 0, lse;
	int32_t tok;
	int n;

	for (i = 1; i < V; i++)
		if (z[i] > z[amax])
			amax = i;
	m = (double)z[amax] * inv;
	for (i = 0; i < V; i++) {
		w->e[i] = exp((double)z[i] * inv - m);
		s += w->e[i];
	}
	lse = m + log(s);
	if (greedy)
		tok = (int32_t)amax;
	else if ((p->top_k > 0 && p->top_k < V) || p->top_p < 1.0f)
		tok = pick_cut(p, z, V, u, s, w);
	else
		tok = pick_all(w->e, V, u * s);
	*token = tok;
	*logp = (float)((double)z[tok] * inv - lse);

	n = p->top_logprobs < V ? p->top_logprobs : (int)V;
	if (n <= 0)
		return;
	best_ids(z, V, n, top_ids);
	for (i = 0; i < n; i++)
		top_logps[i] = (float)((double)z[top_ids[i]] * inv - lse);
}
