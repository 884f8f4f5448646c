/* test_sampler.c — the host token sampler (engines/model/sampler.c).
 *
 * Expectations are computed by hand or in double in the test itself from
 * the definitions in sampler.h; the draws use fixed u values, so every
 * count below is exact for the stated walk order.
 */
#include "check_run.h"
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/sampler.h"

/* log softmax(z * inv)[k] over z[V], in double as sampler.h defines it. */
static double ref_logp(const float *z, int V, float inv, int k)
{
	double m = -INFINITY, s = 0;
	int i;

	for (i = 0; i < V; i++)
		m = fmax(m, (double)z[i] * inv);
	for (i = 0; i < V; i++)
		s += exp((double)z[i] * inv - m);
	return (double)z[k] * inv - m - log(s);
}

/* z = log([0.1, 0.2, 0.3, 0.4]) */
static void four(float *z)
{
	static const double p[4] = { 0.1, 0.2, 0.3, 0.4 };

	for (int i = 0; i < 4; i++)
		z[i] = (float)log(p[i]);
}

static int32_t pick(const struct sampler_params *p, const float *z, int64_t V, double u,
		    struct sampler_work *w, float *logp)
{
	int32_t tok = -1, ids[20];
	float lp, lps[20];

	sampler_pick(p, z, V, u, w, &tok, logp ? logp : &lp, ids, lps);
	return tok;
}

/* counts[t] of the tokens drawn for u = (i + 0.5) / 1000, i in [0, 1000):
 * the midpoints, so no u falls on a boundary of the hand-computed ones. */
static void sweep(const struct sampler_params *p, const float *z, int V,
		  struct sampler_work *w, int *counts)
{
	memset(counts, 0, sizeof(int) * V);
	for (int i = 0; i < 1000; i++) {
		int32_t t = pick(p, z, V, (i + 0.5) / 1000, w, NULL);

		ck_assert(t >= 0 && t < V);
		counts[t]++;
	}
}

static void expect_counts(const int *counts, int c0, int c1, int c2, int c3)
{
	ck_assert_int_eq(counts[0], c0);
	ck_assert_int_eq(counts[1], c1);
	ck_assert_int_eq(counts[2], c2);
	ck_assert_int_eq(counts[3], c3);
}

START_TEST(greedy)
{
	const float z[5] = { 0.5f, 2.0f, -1.0f, 2.0f, 1.5f };
	const float z1[3] = { -3.0f, -1.0f, -2.0f };
	struct sampler_params p = { .temperature = 0, .top_p = 1 };
	struct sampler_work *w = sampler_work_new(5);
	float lp;

	ck_assert_ptr_nonnull(w);
	/* tie between 1 and 3: the lower id; u does not matter */
	ck_assert_int_eq(pick(&p, z, 5, 0.0, w, &lp), 1);
	ck_assert_int_eq(pick(&p, z, 5, 0.999, w, &lp), 1);
	ck_assert_double_eq_tol(lp, ref_logp(z, 5, 1.0f, 1), 1e-6);
	/* by hand: 2 - log(e^.5 + 2 e^2 + e^-1 + e^1.5) */
	ck_assert_double_eq_tol(lp, 2.0 - log(exp(0.5) + 2 * exp(2.0) + exp(-1.0) + exp(1.5)),
				1e-6);
	/* top_k / top_p do not change a greedy pick */
	p.top_k = 1;
	p.top_p = 0.1f;
	ck_assert_int_eq(pick(&p, z, 5, 0.5, w, &lp), 1);
	p = (struct sampler_params){ .temperature = 0, .top_p = 1 };
	ck_assert_int_eq(pick(&p, z1, 3, 0.5, w, &lp), 1);
	{
		int32_t t = -1;

		/* no top log-probs asked: the buffers may be NULL */
		sampler_pick(&p, z1, 3, 0.5, w, &t, &lp, NULL, NULL);
		ck_assert_int_eq(t, 1);
	}
	ck_assert_double_eq_tol(lp, -1.0 - log(exp(-3.0) + exp(-1.0) + exp(-2.0)), 1e-6);
	sampler_work_free(w);
	sampler_work_free(NULL);
}
END_TEST

START_TEST(temperature_logp)
{
	const float z[4] = { 1.0f, -0.5f, 2.25f, 0.75f };
	struct sampler_params p = { .temperature = 0.7f, .top_p = 1 };
	struct sampler_work *w = sampler_work_new(4);
	const float inv = 1.0f / 0.7f;
	double zz[4], m, s = 0;
	float lp;
	int32_t t;
	int i;

	ck_assert_ptr_nonnull(w);
	/* by hand: zz = z * (float)(1 / 0.7f), max at token 2 */
	for (i = 0; i < 4; i++)
		zz[i] = (double)z[i] * (double)inv;
	m = zz[2];
	for (i = 0; i < 4; i++)
		s += exp(zz[i] - m);
	for (i = 0; i < 20; i++) {
		t = pick(&p, z, 4, i / 20.0, w, &lp);
		ck_assert_double_eq_tol(lp, zz[t] - m - log(s), 1e-6);
		ck_assert_double_eq_tol(lp, ref_logp(z, 4, inv, t), 1e-6);
	}
	/* the float inverse, not a division in double: they differ here */
	ck_assert((double)inv != 1.0 / 0.7f);
	sampler_work_free(w);
}
END_TEST

START_TEST(walk_in_id_order)
{
	struct sampler_params p = { .temperature = 1, .top_p = 1 };
	struct sampler_work *w = sampler_work_new(4);
	int counts[4];
	float z[4];

	ck_assert_ptr_nonnull(w);
	four(z);
	/* no cut: cumulative boundaries 0.1, 0.3, 0.6, 1 in id order */
	ck_assert_int_eq(pick(&p, z, 4, 0.0, w, NULL), 0);
	ck_assert_int_eq(pick(&p, z, 4, 0.05, w, NULL), 0);
	ck_assert_int_eq(pick(&p, z, 4, 0.25, w, NULL), 1);
	ck_assert_int_eq(pick(&p, z, 4, 0.55, w, NULL), 2);
	ck_assert_int_eq(pick(&p, z, 4, 0.65, w, NULL), 3);
	ck_assert_int_eq(pick(&p, z, 4, 0.95, w, NULL), 3);
	ck_assert_int_eq(pick(&p, z, 4, 0.9999999, w, NULL), 3);
	sweep(&p, z, 4, w, counts);
	expect_counts(counts, 100, 200, 300, 400);
	/* top_k >= V is no cut either */
	p.top_k = 4;
	ck_assert_int_eq(pick(&p, z, 4, 0.05, w, NULL), 0);
	sampler_work_free(w);
}
END_TEST

START_TEST(top_k)
{
	struct sampler_params p = { .temperature = 1, .top_k = 2, .top_p = 1 };
	struct sampler_work *w = sampler_work_new(4);
	int counts[4];
	float z[4], lp;

	ck_assert_ptr_nonnull(w);
	four(z);
	/* kept {3, 2}, walked best first: 3 while u < 0.4 / 0.7 = 0.5714.. */
	ck_assert_int_eq(pick(&p, z, 4, 0.0, w, NULL), 3);
	ck_assert_int_eq(pick(&p, z, 4, 0.57, w, NULL), 3);
	ck_assert_int_eq(pick(&p, z, 4, 0.58, w, NULL), 2);
	ck_assert_int_eq(pick(&p, z, 4, 0.9999999, w, NULL), 2);
	sweep(&p, z, 4, w, counts);
	ck_assert_int_eq(counts[0], 0);
	ck_assert_int_eq(counts[1], 0);
	ck_assert_int_eq(counts[3], 571);     /* i + 0.5 < 571.4 */
	ck_assert_int_eq(counts[2], 429);
	/* the reported logp is the un-cut one: log 0.3, not log(0.3 / 0.7) */
	ck_assert_int_eq(pick(&p, z, 4, 0.9, w, &lp), 2);
	ck_assert_double_eq_tol(lp, log(0.3), 1e-6);
	p.top_k = 1;
	sweep(&p, z, 4, w, counts);
	ck_assert_int_eq(counts[3], 1000);
	ck_assert_int_eq(pick(&p, z, 4, 0.9, w, &lp), 3);
	ck_assert_double_eq_tol(lp, log(0.4), 1e-6);
	sampler_work_free(w);
}
END_TEST

START_TEST(top_k_ties)
{
	/* top_k = 2 of {1, 3, 4} tied: the lower ids 1 and 3 */
	const float z[5] = { 0.0f, 1.0f, -2.0f, 1.0f, 1.0f };
	struct sampler_params p = { .temperature = 1, .top_k = 2, .top_p = 1 };
	struct sampler_work *w = sampler_work_new(5);
	int counts[5];

	ck_assert_ptr_nonnull(w);
	sweep(&p, z, 5, w, counts);
	ck_assert_int_eq(counts[1], 500);
	ck_assert_int_eq(counts[3], 500);
	ck_assert_int_eq(pick(&p, z, 5, 0.49, w, NULL), 1);   /* 1 walked first */
	sampler_work_free(w);
}
END_TEST

START_TEST(top_p)
{
	struct sampler_params p = { .temperature = 1, .top_p = 0.45f };
	struct sampler_work *w = sampler_work_new(4);
	int counts[4];
	float z[4], lp;

	ck_assert_ptr_nonnull(w);
	four(z);
	/* best first [3 (0.4), 2 (0.3), ..]: 0.4 < 0.45 <= 0.7: {3, 2} */
	sweep(&p, z, 4, w, counts);
	ck_assert_int_eq(counts[3], 571);
	ck_assert_int_eq(counts[2], 429);
	ck_assert_int_eq(pick(&p, z, 4, 0.9, w, &lp), 2);
	ck_assert_double_eq_tol(lp, log(0.3), 1e-6);
	/* 0.5: the same two */
	p.top_p = 0.5f;
	sweep(&p, z, 4, w, counts);
	ck_assert_int_eq(counts[3] + counts[2], 1000);
	ck_assert_int_eq(counts[2], 429);
	/* 0.35: 0.4 reaches it, {3} */
	p.top_p = 0.35f;
	sweep(&p, z, 4, w, counts);
	ck_assert_int_eq(counts[3], 1000);
	ck_assert_int_eq(pick(&p, z, 4, 0.9, w, &lp), 3);
	ck_assert_double_eq_tol(lp, log(0.4), 1e-6);
	/* 0.8: 0.4 + 0.3 + 0.2 = 0.9 >= 0.8, {3, 2, 1}; walk 3, 2, 1 */
	p.top_p = 0.8f;
	sweep(&p, z, 4, w, counts);
	ck_assert_int_eq(counts[0], 0);
	ck_assert_int_eq(counts[3], 444);   /* u < 4 / 9 */
	ck_assert_int_eq(counts[2], 334);   /* u < 7 / 9 */
	ck_assert_int_eq(counts[1], 222);
	/* 1: no cut, back to the id-order walk */
	p.top_p = 1.0f;
	ck_assert_int_eq(pick(&p, z, 4, 0.05, w, NULL), 0);
	sampler_work_free(w);
}
END_TEST

START_TEST(top_k_then_top_p)
{
	struct sampler_params p = { .temperature = 1, .top_k = 2, .top_p = 0.5f };
	struct sampler_work *w = sampler_work_new(4);
	int counts[4];
	float z[4], lp;

	ck_assert_ptr_nonnull(w);
	four(z);
	/* top_p 0.5 alone keeps {3, 2} (0.4 < 0.5); after top_k = 2 the
	 * renormalized 3 has 0.4 / 0.7 = 0.571 >= 0.5: {3} alone */
	sweep(&p, z, 4, w, counts);
	ck_assert_int_eq(counts[3], 1000);
	ck_assert_int_eq(pick(&p, z, 4, 0.99, w, &lp), 3);
	ck_assert_double_eq_tol(lp, log(0.4), 1e-6);
	/* top_k = 3 renormalizes to [4/9, 3/9, 2/9]: 0.444 < 0.5 <= 0.778 */
	p.top_k = 3;
	sweep(&p, z, 4, w, counts);
	ck_assert_int_eq(counts[3], 571);
	ck_assert_int_eq(counts[2], 429);
	sampler_work_free(w);
}
END_TEST

START_TEST(top_logprobs)
{
	const float z[6] = { 1.0f, 3.0f, 3.0f, 2.0f, 3.0f, 0.0f };
	struct sampler_params p = { .temperature = 0, .top_p = 1, .top_logprobs = 4 };
	struct sampler_work *w = sampler_work_new(6);
	int32_t ids[7], tok, want[4] = { 1, 2, 4, 3 };
	float lps[7], lp;
	int i;

	ck_assert_ptr_nonnull(w);
	for (i = 0; i < 7; i++) {
		ids[i] = -7;
		lps[i] = 7.0f;
	}
	sampler_pick(&p, z, 6, 0.5, w, &tok, &lp, ids, lps);
	ck_assert_int_eq(tok, 1);
	for (i = 0; i < 4; i++) {
		ck_assert_int_eq(ids[i], want[i]);
		ck_assert_double_eq_tol(lps[i], ref_logp(z, 6, 1.0f, want[i]), 1e-6);
	}
	ck_assert_int_eq(ids[4], -7);         /* nothing past top_logprobs */
	ck_assert_float_eq(lps[4], 7.0f);
	ck_assert_float_eq(lp, lps[0]);

	/* temperature 0.5, with a cut: values stay the un-cut log softmax */
	p = (struct sampler_params){ .temperature = 0.5f, .top_k = 2, .top_p = 0.9f,
				     .top_logprobs = 6 };
	sampler_pick(&p, z, 6, 0.0, w, &tok, &lp, ids, lps);
	{
		int32_t all[6] = { 1, 2, 4, 3, 0, 5 };

		for (i = 0; i < 6; i++) {
			ck_assert_int_eq(ids[i], all[i]);
			ck_assert_double_eq_tol(lps[i], ref_logp(z, 6, 2.0f, all[i]), 1e-6);
		}
	}
	ck_assert_int_eq(tok, 1);
	ck_assert_double_eq_tol(lp, ref_logp(z, 6, 2.0f, 1), 1e-6);
	/* more than V asked: V written, the rest untouched */
	p.top_logprobs = 7;
	ids[6] = -7;
	sampler_pick(&p, z, 6, 0.0, w, &tok, &lp, ids, lps);
	ck_assert_int_eq(ids[5], 5);
	ck_assert_int_eq(ids[6], -7);
	sampler_work_free(w);
}
END_TEST

START_TEST(stream_seed)
{
	uint64_t a = sampler_stream_seed(42, 3, 5);
	uint64_t v[6];
	int i, j;

	ck_assert_uint_eq(a, sampler_stream_seed(42, 3, 5));
	v[0] = a;
	v[1] = sampler_stream_seed(42, 5, 3);      /* prompt and sample swapped */
	v[2] = sampler_stream_seed(43, 3, 5);
	v[3] = sampler_stream_seed(42, 3, 6);
	v[4] = sampler_stream_seed(42, 4, 5);
	v[5] = sampler_stream_seed(0, 0, 0);
	for (i = 0; i < 6; i++)
		for (j = i + 1; j < 6; j++)
			ck_assert_uint_ne(v[i], v[j]);
	ck_assert_uint_ne(sampler_stream_seed(0, 0, 1), sampler_stream_seed(0, 1, 0));
	ck_assert_uint_ne(sampler_stream_seed(0, -1, 0), sampler_stream_seed(0, 0, -1));
	/* neighbouring samples differ in about half their bits */
	for (i = 0; i < 64; i++) {
		int bits = __builtin_popcountll(sampler_stream_seed(7, 1, i) ^
						sampler_stream_seed(7, 1, i + 1));

		ck_assert(bits > 10 && bits < 54);
	}
}
END_TEST

/* ord[V] = the token ids best first: z descending, ids ascending. */
static void best_first(const float *z, int V, int32_t *ord)
{
	int i, j;

	for (i = 0; i < V; i++)
		ord[i] = i;
	for (i = 1; i < V; i++)
		for (j = i; j > 0 && z[ord[j]] > z[ord[j - 1]]; j--) {
			int32_t x = ord[j];

			ord[j] = ord[j - 1];
			ord[j - 1] = x;
		}
}

START_TEST(top_k_heap)
{
	enum { V = 1000 };
	static const int ks[] = { 1, 2, 3, 7, 50, 500, 999 };
	struct sampler_params p = { .temperature = 1, .top_p = 1 };
	struct sampler_work *w = sampler_work_new(V);
	int32_t order[V];
	float z[V];
	uint32_t x = 99;
	int i, k;

	ck_assert_ptr_nonnull(w);
	for (i = 0; i < V; i++) {
		x = x * 1664525u + 1013904223u;
		z[i] = (float)((x >> 8) % 64) / 8.0f - 4.0f;   /* many ties */
	}
	best_first(z, V, order);
	/* u = 0 gives the best, u just under 1 the k-th best (the last kept) */
	for (i = 0; i < (int)(sizeof(ks) / sizeof(ks[0])); i++) {
		k = ks[i];
		p.top_k = k;
		ck_assert_int_eq(pick(&p, z, V, 0.0, w, NULL), order[0]);
		ck_assert_int_eq(pick(&p, z, V, 1.0 - 1e-10, w, NULL), order[k - 1]);
	}
	sampler_work_free(w);
}
END_TEST

/* top_p alone by the definition, over every token in the order ord[V]. */
static int32_t ref_top_p(const float *z, const int32_t *ord, int V, float t,
			 float top_p, double u)
{
	const float inv = 1.0f / t;
	double m = -INFINITY, s = 0, cum = 0, kept;
	int i, n;

	for (i = 0; i < V; i++)
		m = fmax(m, (double)z[i] * inv);
	for (i = 0; i < V; i++)
		s += exp((double)z[i] * inv - m);
	for (n = 0; n < V && cum < (double)top_p * s; n++)
		cum += exp((double)z[ord[n]] * inv - m);
	kept = cum;
	cum = 0;
	for (i = 0; i < n; i++) {
		cum += exp((double)z[ord[i]] * inv - m);
		if (cum > u * kept)
			return ord[i];
	}
	return ord[n - 1];
}

START_TEST(top_p_matches_definition)
{
	enum { V = 3000 };
	static const float tops[] = { 0.05f, 0.3f, 0.9f, 0.99f, 0.99999994f };
	struct sampler_params p = { .temperature = 0.9f };
	struct sampler_work *w = sampler_work_new(V);
	float z[V];
	int32_t ord[V];
	uint32_t x = 5;
	int i, k, diff = 0;

	ck_assert_ptr_nonnull(w);
	for (i = 0; i < V; i++) {     /* a peaked head over a long flat tail */
		x = x * 1664525u + 1013904223u;
		z[i] = (float)((x >> 8) % 4096) / 256.0f;
		z[i] = z[i] * z[i] / 16.0f;
	}
	best_first(z, V, ord);
	for (k = 0; k < (int)(sizeof(tops) / sizeof(tops[0])); k++) {
		p.top_p = tops[k];
		for (i = 0; i < 200; i++) {
			double u = (i + 0.5) / 200;

			diff += pick(&p, z, V, u, w, NULL) != ref_top_p(z, ord, V, 0.9f, tops[k], u);
		}
	}
	ck_assert_int_eq(diff, 0);
	sampler_work_free(w);
}
END_TEST

static int cmp_desc(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;

	return (x < y) - (x > y);
}

START_TEST(large_vocab)
{
	enum { V = 151936 };
	float *z = malloc(sizeof(float) * V), *s = malloc(sizeof(float) * V), lp;
	struct sampler_params p = { .temperature = 0.8f, .top_k = 50, .top_p = 1 };
	struct sampler_work *w = sampler_work_new(V);
	uint32_t x = 12345;
	int32_t t, t2, ids[20];
	float lps[20];
	int i;

	ck_assert_ptr_nonnull(z);
	ck_assert_ptr_nonnull(s);
	ck_assert_ptr_nonnull(w);
	for (i = 0; i < V; i++) {
		x = x * 1664525u + 1013904223u;
		z[i] = 8.0f * ((float)(x >> 8) / 16777216.0f) - 4.0f;
	}
	memcpy(s, z, sizeof(float) * V);
	qsort(s, V, sizeof(float), cmp_desc);
	for (i = 0; i < 40; i++) {
		double u = (i + 0.5) / 40;

		t = pick(&p, z, V, u, w, &lp);
		ck_assert(t >= 0 && t < V);
		ck_assert(z[t] >= s[49]);
		ck_assert_int_eq(pick(&p, z, V, u, w, NULL), t);
		ck_assert_double_eq_tol(lp, ref_logp(z, V, 1.0f / 0.8f, t), 1e-5);
	}
	/* top_p alone and with top_k, and no cut: reproducible and in range */
	p.top_p = 0.9f;
	p.top_logprobs = 20;
	sampler_pick(&p, z, V, 0.3, w, &t, &lp, ids, lps);
	ck_assert(z[t] >= s[49]);
	for (i = 0; i < 20; i++)
		ck_assert_float_eq(z[ids[i]], s[i]);
	p.top_k = 0;
	t = pick(&p, z, V, 0.3, w, NULL);
	ck_assert_int_eq(pick(&p, z, V, 0.3, w, NULL), t);
	p.top_p = 1;
	t = pick(&p, z, V, 0.3, w, NULL);
	t2 = pick(&p, z, V, 0.3, w, NULL);
	ck_assert_int_eq(t, t2);
	free(z);
	free(s);
	sampler_work_free(w);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("sampler");
	TCase *tc = tcase_create("core");

	/* Check's default is 4 s a test: large_vocab's V = 151936 passes take
	 * longer under the sanitizers. */
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, greedy);
	tcase_add_test(tc, temperature_logp);
	tcase_add_test(tc, walk_in_id_order);
	tcase_add_test(tc, top_k);
	tcase_add_test(tc, top_k_ties);
	tcase_add_test(tc, top_k_heap);
	tcase_add_test(tc, top_p);
	tcase_add_test(tc, top_k_then_top_p);
	tcase_add_test(tc, top_p_matches_definition);
	tcase_add_test(tc, top_logprobs);
	tcase_add_test(tc, stream_seed);
	tcase_add_test(tc, large_vocab);
	suite_add_tcase(s, tc);
	return check_run(s);
}
