/* test_planner.c — micro-batch planning: properties over random batches,
 * plans checked against a naive Karmarkar–Karp written here, and fixed cases
 * checked against a Python rendering of verl's karmarkar_karp.
 *
 * The naive reference keeps all k sets of every state (item lists as
 * arrays), picks the two states to merge by linear scan, and sorts sets by
 * insertion with the full (sum, count, item list) key. verl's orders are
 * strict total orders on the states that coexist (distinct sets never share
 * an item), so the pop order, and hence the partition, does not depend on
 * the heap's layout and the scan reproduces it.
 */
#include "check_run.h"
#include <check.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "batch/planner.h"

/* --- naive reference ---------------------------------------------------- */

struct ref_set {
	int64_t sum;
	int n;
	int items[64];      /* request indices in verl's Set.items order */
};

struct ref_state {
	bool live;
	struct ref_set sets[64];  /* [k], largest first */
};

#define REF_MAX 64

static int ref_set_cmp(const struct ref_set *a, const struct ref_set *b)
{
	int i;

	if (a->sum != b->sum)
		return a->sum < b->sum ? -1 : 1;
	if (a->n != b->n)
		return a->n < b->n ? -1 : 1;
	for (i = 0; i < a->n; i++)
		if (a->items[i] != b->items[i])
			return a->items[i] < b->items[i] ? -1 : 1;
	return 0;
}

static void ref_sort_desc(struct ref_set *s, int k)
{
	int i, j;

	for (i = 1; i < k; i++) {
		struct ref_set t = s[i];

		for (j = i; j > 0 && ref_set_cmp(&s[j - 1], &t) < 0; j--)
			s[j] = s[j - 1];
		s[j] = t;
	}
}

static int64_t ref_spread(const struct ref_state *s, int k)
{
	return s->sets[0].sum - s->sets[k - 1].sum;
}

/* "a pops before b" */
static bool ref_before(const struct ref_state *a, const struct ref_state *b, int k)
{
	if (ref_spread(a, k) != ref_spread(b, k))
		return ref_spread(a, k) > ref_spread(b, k);
	return ref_set_cmp(&a->sets[0], &b->sets[0]) > 0;
}

static struct ref_state ref_states[REF_MAX];

/* Partition lens[n] into k sets; part[i] = set of sequence i; returns the
 * largest set sum. */
static int64_t ref_kk(const int32_t *lens, int n, int k, int *part)
{
	int i, j, live = n;

	ck_assert(n <= REF_MAX && k <= REF_MAX);
	memset(ref_states, 0, sizeof(ref_states));
	for (i = 0; i < n; i++) {
		ref_states[i].live = true;
		ref_states[i].sets[0].sum = lens[i];
		ref_states[i].sets[0].n = 1;
		ref_states[i].sets[0].items[0] = i;
	}
	while (live > 1) {
		int a = -1, b = -1;

		for (i = 0; i < n; i++) {
			if (!ref_states[i].live)
				continue;
			if (a < 0 || ref_before(&ref_states[i], &ref_states[a], k)) {
				b = a;
				a = i;
			} else if (b < 0 || ref_before(&ref_states[i], &ref_states[b], k)) {
				b = i;
			}
		}
		for (i = 0; i < k; i++) {
			struct ref_set *d = &ref_states[a].sets[i];
			const struct ref_set *s = &ref_states[b].sets[k - 1 - i];

			for (j = 0; j < s->n; j++)
				d->items[d->n++] = s->items[j];
			d->sum += s->sum;
		}
		ref_sort_desc(ref_states[a].sets, k);
		ref_states[b].live = false;
		live--;
	}
	for (i = 0; i < n && !ref_states[i].live; i++)
		;
	for (j = 0; j < k; j++) {
		const struct ref_set *s = &ref_states[i].sets[j];
		int t;

		for (t = 0; t < s->n; t++)
			part[s->items[t]] = j;
	}
	return ref_states[i].sets[0].sum;
}

/* --- helpers ------------------------------------------------------------ */

static uint64_t rng_state;

static uint32_t rnd(uint32_t n)
{
	/* splitmix64 */
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	z ^= z >> 31;
	return (uint32_t)(z % n);
}

/* Check every structural property of a plan; returns the largest length. */
static int32_t check_plan(const int32_t *lens, int32_t n, int64_t budget,
			  const struct mb_plan *p)
{
	int32_t m, i, maxlen = 0;
	int64_t off = 0, mn = INT64_MAX, mx = 0;
	int *seen = calloc((size_t)n, sizeof(int));

	ck_assert_ptr_nonnull(seen);
	ck_assert_int_ge(p->num_micro_batches, 1);
	ck_assert_int_le(p->num_micro_batches, n);
	ck_assert_int_eq(p->mb_start[0], 0);
	ck_assert_int_eq(p->mb_start[p->num_micro_batches], n);
	for (m = 0; m < p->num_micro_batches; m++) {
		int64_t tok = 0;

		/* non-empty, ordered by first sequence */
		ck_assert_int_lt(p->mb_start[m], p->mb_start[m + 1]);
		if (m > 0)
			ck_assert_int_lt(p->seq_order[p->mb_start[m - 1]],
					 p->seq_order[p->mb_start[m]]);
		for (i = p->mb_start[m]; i < p->mb_start[m + 1]; i++) {
			int32_t s = p->seq_order[i];

			ck_assert_int_ge(s, 0);
			ck_assert_int_lt(s, n);
			seen[s]++;
			tok += lens[s];
			/* request order inside the micro-batch */
			if (i > p->mb_start[m])
				ck_assert_int_lt(p->seq_order[i - 1], s);
		}
		ck_assert_int_eq(tok, p->mb_tokens[m]);
		ck_assert_int_le(tok, budget);
		if (tok < mn)
			mn = tok;
		if (tok > mx)
			mx = tok;
	}
	for (i = 0; i < n; i++) {
		ck_assert_int_eq(seen[i], 1);
		ck_assert_int_eq(p->seq_offset[i], off);
		off += lens[i];
		if (lens[i] > maxlen)
			maxlen = lens[i];
	}
	/* differencing never leaves a spread wider than the longest sequence */
	ck_assert_int_le(mx - mn, maxlen);
	free(seen);
	return maxlen;
}

/* The plan's micro-batch of each sequence, numbered by first sequence. */
static void plan_parts(const struct mb_plan *p, int *part)
{
	int32_t m, i;

	for (m = 0; m < p->num_micro_batches; m++)
		for (i = p->mb_start[m]; i < p->mb_start[m + 1]; i++)
			part[p->seq_order[i]] = m;
}

/* Renumber a partition by first sequence so that two can be compared. */
static void canon(int *part, int n)
{
	int map[REF_MAX], next = 0, i;

	for (i = 0; i < REF_MAX; i++)
		map[i] = -1;
	for (i = 0; i < n; i++) {
		if (map[part[i]] < 0)
			map[part[i]] = next++;
		part[i] = map[part[i]];
	}
}

/* --- tests -------------------------------------------------------------- */

START_TEST(random_against_reference)
{
	int iter;

	rng_state = 0x5eed;
	for (iter = 0; iter < 400; iter++) {
		int32_t n = 1 + (int32_t)rnd(48), lens[REF_MAX], i, k;
		int64_t budget = 1 + rnd(iter % 2 ? 64 : 2000), total = 0, klo;
		int got[REF_MAX], want[REF_MAX];
		struct mb_plan p = { 0 }, q = { 0 };
		struct eng_error err = { 0 };

		for (i = 0; i < n; i++) {
			/* mixes of short and long sequences, some at the budget */
			uint32_t r = rnd(10);

			lens[i] = r == 0 ? (int32_t)budget :
				  1 + (int32_t)rnd(r < 5 ? (uint32_t)(budget / 8 + 1)
							 : (uint32_t)budget);
			total += lens[i];
		}
		ck_assert_int_eq(mb_plan_make(lens, n, budget, &p, &err), 0);
		check_plan(lens, n, budget, &p);
		k = p.num_micro_batches;

		/* minimal: no smaller k from the token bound up fits with KK */
		klo = (total + budget - 1) / budget;
		ck_assert_int_ge(k, klo);
		for (i = (int32_t)klo; i < k; i++)
			ck_assert_int_gt(ref_kk(lens, n, i, got), budget);

		/* the same partition as the reference at k */
		ck_assert_int_le(ref_kk(lens, n, k, want), budget);
		plan_parts(&p, got);
		canon(got, n);
		canon(want, n);
		for (i = 0; i < n; i++)
			ck_assert_msg(got[i] == want[i], "iter %d seq %d: mb %d want %d",
				      iter, i, got[i], want[i]);

		/* deterministic */
		ck_assert_int_eq(mb_plan_make(lens, n, budget, &q, NULL), 0);
		ck_assert_int_eq(q.num_micro_batches, k);
		ck_assert_mem_eq(q.mb_start, p.mb_start, sizeof(int32_t) * (size_t)(k + 1));
		ck_assert_mem_eq(q.seq_order, p.seq_order, sizeof(int32_t) * (size_t)n);
		mb_plan_free(&p);
		mb_plan_free(&q);
		mb_plan_free(&q);   /* freed plans are accepted */
	}
}
END_TEST

/* Expected plans printed by /usr/bin/python3 running a Python rendering of
 * verl's karmarkar_karp (heapq, Set/State orders as in seqlen_balancing.py)
 * with k raised from max(ceil(total/budget), #len > budget/2) until the
 * largest set fits, micro-batches sorted by first index. Each row lists the
 * micro-batches' sequences, -1 ending a micro-batch. */
struct fixed_case {
	int32_t n;
	int32_t lens[40];
	int64_t budget;
	int32_t want[48];
};

static const struct fixed_case fixed[] = {
	{ 3, { 100, 1, 1 }, 101, { 0, -1, 1, 2, -1 } },
	{ 6, { 5, 5, 5, 5, 5, 5 }, 10, { 0, 5, -1, 1, 4, -1, 2, 3, -1 } },
	{ 10, { 7, 3, 9, 1, 4, 4, 8, 2, 6, 5 }, 16,
	  { 0, 5, 7, -1, 1, 2, -1, 3, 8, 9, -1, 4, 6, -1 } },
	{ 12, { 300, 120, 450, 80, 80, 220, 510, 33, 97, 260, 410, 150 }, 1024,
	  { 0, 4, 6, -1, 1, 2, 5, 7, 8, -1, 3, 9, 10, 11, -1 } },
	{ 12, { 10, 10, 10, 10, 3, 3, 3, 3, 3, 3, 3, 3 }, 20,
	  { 0, 7, 11, -1, 1, 6, 10, -1, 2, 5, 9, -1, 3, 4, 8, -1 } },
	/* random.Random(1234), 40 x randint(1, 500) */
	{ 40, { 495, 399, 226, 60, 4, 47, 467, 483, 481, 414, 299, 18, 344, 355,
		43, 51, 393, 182, 122, 9, 16, 404, 9, 178, 332, 320, 248, 316,
		238, 77, 47, 94, 366, 59, 433, 8, 258, 250, 451, 495 }, 1500,
	  { 0, 2, 20, 32, 37, -1, 1, 11, 18, 27, 35, 39, -1,
	    3, 14, 21, 25, 31, 34, -1, 4, 16, 17, 22, 33, 36, 38, -1,
	    5, 7, 9, 24, 29, -1, 6, 10, 13, 15, 19, 23, -1, 8, 12, 26, 28, 30, -1 } },
};

START_TEST(matches_python_verl)
{
	const struct fixed_case *c = &fixed[_i];
	struct mb_plan p = { 0 };
	int32_t m = 0, pos = 0, j = 0;

	ck_assert_int_eq(mb_plan_make(c->lens, c->n, c->budget, &p, NULL), 0);
	check_plan(c->lens, c->n, c->budget, &p);
	while (pos < c->n) {
		ck_assert_int_lt(m, p.num_micro_batches);
		ck_assert_int_eq(p.mb_start[m], pos);
		for (; c->want[j] >= 0; j++)
			ck_assert_int_eq(p.seq_order[pos++], c->want[j]);
		ck_assert_int_eq(p.mb_start[m + 1], pos);
		j++;
		m++;
	}
	ck_assert_int_eq(p.num_micro_batches, m);
	mb_plan_free(&p);
}
END_TEST

START_TEST(hand_cases)
{
	struct mb_plan p = { 0 };
	int32_t one[1] = { 7 }, eq[8] = { 4, 4, 4, 4, 4, 4, 4, 4 };
	int32_t full[3] = { 3, 10, 2 };

	/* one sequence: one micro-batch holding it */
	ck_assert_int_eq(mb_plan_make(one, 1, 7, &p, NULL), 0);
	ck_assert_int_eq(p.num_micro_batches, 1);
	ck_assert_int_eq(p.mb_tokens[0], 7);
	ck_assert_int_eq(p.seq_offset[0], 0);
	mb_plan_free(&p);

	/* all equal, 8 x 4 in budget 12: ceil(32/12) = 3 bins but KK's
	 * 3/3/2 split needs 12 -> fits, 4+4+4 = 12 */
	ck_assert_int_eq(mb_plan_make(eq, 8, 12, &p, NULL), 0);
	ck_assert_int_eq(p.num_micro_batches, 3);
	check_plan(eq, 8, 12, &p);
	mb_plan_free(&p);
	/* budget 16: two micro-batches of four */
	ck_assert_int_eq(mb_plan_make(eq, 8, 16, &p, NULL), 0);
	ck_assert_int_eq(p.num_micro_batches, 2);
	ck_assert_int_eq(p.mb_tokens[0], 16);
	ck_assert_int_eq(p.mb_tokens[1], 16);
	mb_plan_free(&p);

	/* one sequence exactly the budget: alone; the other two share */
	ck_assert_int_eq(mb_plan_make(full, 3, 10, &p, NULL), 0);
	ck_assert_int_eq(p.num_micro_batches, 2);
	ck_assert_int_eq(p.mb_start[1], 2);
	ck_assert_int_eq(p.seq_order[0], 0);
	ck_assert_int_eq(p.seq_order[1], 2);
	ck_assert_int_eq(p.seq_order[2], 1);
	ck_assert_int_eq(p.mb_tokens[0], 5);
	ck_assert_int_eq(p.mb_tokens[1], 10);
	ck_assert_int_eq(p.seq_offset[0], 0);
	ck_assert_int_eq(p.seq_offset[1], 3);
	ck_assert_int_eq(p.seq_offset[2], 13);
	mb_plan_free(&p);
	mb_plan_free(NULL);
}
END_TEST

static void expect_einval(const int32_t *lens, int32_t n, int64_t budget,
			  const char *field)
{
	struct mb_plan p = { .num_micro_batches = 99 };
	struct eng_error err = { 0 };

	ck_assert_int_eq(mb_plan_make(lens, n, budget, &p, &err), -EINVAL);
	ck_assert_int_eq(err.code, -EINVAL);
	ck_assert_msg(strstr(err.msg, field), "message '%s' lacks '%s'", err.msg, field);
	/* ret untouched on failure */
	ck_assert_int_eq(p.num_micro_batches, 99);
	ck_assert_ptr_null(p.mb_start);
}

START_TEST(errors)
{
	int32_t lens[4] = { 100, 4096, 9000, 5 };
	int32_t huge[2] = { 5, 15 };
	struct mb_plan p;
	struct eng_error err = { 0 };

	expect_einval(lens, 4, 4096, "seq_lens[2]");
	ck_assert_int_eq(mb_plan_make(lens, 4, 4096, &(struct mb_plan){ 0 }, &err), -EINVAL);
	ck_assert_str_eq(err.msg,
			 "seq_lens[2]: sequence of 9000 tokens exceeds max_tokens_per_micro_batch 4096");
	expect_einval(lens, 4, 0, "max_tokens_per_micro_batch");
	expect_einval(lens, 4, -1, "max_tokens_per_micro_batch");
	/* Any budget plans without overflow (it once wrapped at INT64_MAX). */
	ck_assert_int_eq(mb_plan_make(huge, 2, INT64_MAX, &p, &err), 0);
	ck_assert_int_eq(p.num_micro_batches, 1);
	ck_assert_int_eq(p.mb_tokens[0], 20);
	mb_plan_free(&p);
}
END_TEST

/* Sizes beyond the naive reference: properties only, and time. Every
 * sequence just over a third of the budget forces k = n/2 from a token
 * bound of about n/3 (the adversarial case for the k search). */
START_TEST(large_and_adversarial)
{
	enum { N = 4096 };
	static int32_t lens[N];
	struct mb_plan p = { 0 };
	struct timespec t0, t1;
	int64_t budget = 16384, total = 0;
	int32_t i;

	rng_state = 99;
	for (i = 0; i < N; i++) {
		lens[i] = 1 + (int32_t)rnd(8192);
		total += lens[i];
	}
	clock_gettime(CLOCK_MONOTONIC, &t0);
	ck_assert_int_eq(mb_plan_make(lens, N, budget, &p, NULL), 0);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	check_plan(lens, N, budget, &p);
	/* KK balances random lengths tightly: within 1% of the token bound
	 * even though the mean load sits within 0.1% of the budget */
	ck_assert_int_le(p.num_micro_batches, (total + budget - 1) / budget * 101 / 100);
	fprintf(stderr, "random n=%d budget=%lld: %d micro-batches (bound %lld) in %.1f ms\n",
		N, (long long)budget, p.num_micro_batches,
		(long long)((total + budget - 1) / budget),
		(t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6);
	mb_plan_free(&p);

	for (i = 0; i < 1000; i++)
		lens[i] = (int32_t)(budget / 3 + 1);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	ck_assert_int_eq(mb_plan_make(lens, 1000, budget, &p, NULL), 0);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	check_plan(lens, 1000, budget, &p);
	ck_assert_int_eq(p.num_micro_batches, 500);
	fprintf(stderr, "adversarial n=1000 (len budget/3+1): %d micro-batches in %.1f ms\n",
		p.num_micro_batches,
		(t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6);
	mb_plan_free(&p);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("planner");
	TCase *tc = tcase_create("core");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, random_against_reference);
	tcase_add_loop_test(tc, matches_python_verl, 0,
			    (int)(sizeof(fixed) / sizeof(fixed[0])));
	tcase_add_test(tc, hand_cases);
	tcase_add_test(tc, errors);
	tcase_add_test(tc, large_and_adversarial);
	suite_add_tcase(s, tc);
	return check_run(s);
}
