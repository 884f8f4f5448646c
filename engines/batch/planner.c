/* planner.c — micro-batch planning by Karmarkar–Karp (see planner.h).
 *
 * The partitioner reproduces verl's karmarkar_karp(seqlen_list, k,
 * equal_size=False) (verl/utils/seqlen_balancing.py, verl-project/verl
 * commit 0db13434d04637f539356a9c43209387ed3894a4) on token counts, tie for
 * tie: the same initial order, the same heap discipline as Python's heapq,
 * the same orderings of sets and states. So a plan here is the partition
 * verl would compute for the same lengths and k (verl balances a FLOP
 * estimate instead of tokens; we balance tokens because the budget is in
 * tokens).
 *
 * Largest differencing: every sequence starts as a state of k sets, one
 * holding it and k-1 empty. Repeatedly the two states with the largest
 * spread (largest set sum minus smallest) are popped and merged by pairing
 * the largest set of one with the smallest of the other; the final state's
 * sets are the micro-batches. Merging never widens the spread beyond the
 * larger of the two, so the final spread is at most the longest sequence.
 *
 * A state keeps only its non-empty sets, largest first in verl's set
 * order (sum, then count, then first index): all lengths are >= 1, so empty
 * sets are exactly the zero-sum ones and always sort last. Merging a states with a and b non-empty sets yields min(a+b, k),
 * so all k micro-batches are non-empty whenever k <= num_seqs, and the
 * states hold at most num_seqs sets in all (memory O(num_seqs), whatever k).
 *
 * Choice of k: the smallest k >= max(ceil(total / budget), number of
 * sequences longer than budget / 2) for which the largest set fits the
 * budget (no partition at all fits with fewer). The search is linear for
 * LINEAR_TRIES values of k, which covers ordinary batches, then binary
 * (assuming fitting is monotone in k, true in practice but not proven for
 * the heuristic), so adversarial batches (every sequence just over a third
 * of the budget) cost O(log n) runs instead of O(n). k = num_seqs always
 * fits since each sequence fits alone.
 */
#include "planner.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define LINEAR_TRIES 16

/* A set of sequences: a singly linked list through kk.next, in the order
 * verl's Set.items would hold them (its first item breaks ties). */
struct kk_set {
	int64_t sum;
	int32_t count;
	int32_t head, tail;   /* sequence indices, -1 = none */
};

/* The non-empty sets of a state, largest first; k - n implied empty sets
 * follow. `sets` is owned by the state. */
struct kk_state {
	int32_t n;
	struct kk_set *sets;  /* [n] */
};

struct kk {
	int32_t k;
	int32_t *next;             /* [num_seqs] list links */
	struct kk_state *heap;     /* [num_seqs] Python-heapq layout */
	int32_t heap_len;
	/* The last run that fit: its k and the set of each sequence. Kept
	 * apart because every run rewrites `next`. */
	int32_t best_k;            /* 0 = none yet */
	int32_t *best_of;          /* [num_seqs] */
	struct kk_set *tmp1, *tmp2;  /* [num_seqs] merge scratch (k <= num_seqs) */
};

/* verl Set.__lt__: by sum, then item count, then the item lists. Two
 * distinct sets never share a sequence, so the lists differ at their first
 * item and comparing the first indices decides. */
static bool set_lt(const struct kk_set *a, const struct kk_set *b)
{
	if (a->sum != b->sum)
		return a->sum < b->sum;
	if (a->count != b->count)
		return a->count < b->count;
	return a->head < b->head;
}

/* out[nx + ny] = x[nx] and y[ny], both sorted by decreasing set order. */
static void merge_desc(const struct kk_set *x, int32_t nx,
		       const struct kk_set *y, int32_t ny, struct kk_set *out)
{
	int32_t i = 0, j = 0, o = 0;

	while (i < nx && j < ny)
		out[o++] = set_lt(&x[i], &y[j]) ? y[j++] : x[i++];
	while (i < nx)
		out[o++] = x[i++];
	while (j < ny)
		out[o++] = y[j++];
}

/* Sort x[n] by decreasing set order (bottom-up merge sort; tmp[n] scratch). */
static void sort_desc(struct kk_set *x, int32_t n, struct kk_set *tmp)
{
	struct kk_set *src = x, *dst = tmp, *t;
	int64_t w, i;   /* 2 * w may pass INT32_MAX */

	for (w = 1; w < n; w *= 2) {
		for (i = 0; i < n; i += 2 * w) {
			int64_t mid = i + w < n ? i + w : n;
			int64_t end = i + 2 * w < n ? i + 2 * w : n;

			merge_desc(src + i, (int32_t)(mid - i), src + mid,
				   (int32_t)(end - mid), dst + i);
		}
		t = src;
		src = dst;
		dst = t;
	}
	if (src != x)
		memcpy(x, src, sizeof(*x) * (size_t)n);
}

static int64_t state_spread(const struct kk_state *s, int32_t k)
{
	/* An implied empty set is the smallest when there is one. */
	return s->sets[0].sum - (s->n < k ? 0 : s->sets[s->n - 1].sum);
}

/* verl State.__lt__ (heapq is a min-heap, so "less" pops first): larger
 * spread first, then the state whose largest set is larger. */
static bool state_lt(const struct kk_state *a, const struct kk_state *b, int32_t k)
{
	int64_t sa = state_spread(a, k), sb = state_spread(b, k);

	if (sa != sb)
		return sa > sb;
	return set_lt(&b->sets[0], &a->sets[0]);
}

/* heapq._siftdown: move heap[pos] up towards start while it is less. */
static void heap_siftdown(struct kk *kk, int32_t start, int32_t pos)
{
	struct kk_state item = kk->heap[pos];

	while (pos > start) {
		int32_t parent = (pos - 1) >> 1;

		if (!state_lt(&item, &kk->heap[parent], kk->k))
			break;
		kk->heap[pos] = kk->heap[parent];
		pos = parent;
	}
	kk->heap[pos] = item;
}

/* heapq._siftup: move the smaller child up to a leaf, then sift down. */
static void heap_siftup(struct kk *kk, int32_t pos)
{
	int32_t end = kk->heap_len, start = pos, child = 2 * pos + 1;
	struct kk_state item = kk->heap[pos];

	while (child < end) {
		int32_t right = child + 1;

		if (right < end && !state_lt(&kk->heap[child], &kk->heap[right], kk->k))
			child = right;
		kk->heap[pos] = kk->heap[child];
		pos = child;
		child = 2 * pos + 1;
	}
	kk->heap[pos] = item;
	heap_siftdown(kk, start, pos);
}

static void heap_push(struct kk *kk, struct kk_state s)
{
	kk->heap[kk->heap_len++] = s;
	heap_siftdown(kk, 0, kk->heap_len - 1);
}

static struct kk_state heap_pop(struct kk *kk)
{
	struct kk_state last = kk->heap[--kk->heap_len], top;

	if (kk->heap_len == 0)
		return last;
	top = kk->heap[0];
	kk->heap[0] = last;
	heap_siftup(kk, 0);
	return top;
}

/* dst absorbs src's items, appended after its own (Set.merge). */
static void set_merge(struct kk *kk, struct kk_set *dst, const struct kk_set *src)
{
	if (src->count == 0)
		return;
	if (dst->count == 0) {
		*dst = *src;
		return;
	}
	kk->next[dst->tail] = src->head;
	dst->tail = src->tail;
	dst->sum += src->sum;
	dst->count += src->count;
}

/* State.merge: set i of a absorbs set k-1-i of b, then the sets are
 * sorted; the result replaces a's sets and b's are freed. On -ENOMEM
 * nothing has changed.
 *
 * Rather than sorting all k positions, use their structure: with
 * lo = k - b->n the first position that receives one of b's sets,
 * positions [0, lo) hold a's sets alone (sorted), [lo, a->n) pairs
 * (unsorted), and [a->n, k) b's sets b[k-1-a->n] .. b[0] alone (b's
 * largest, sorted). Only the pairs need sorting before two merges. */
static int state_merge(struct kk *kk, struct kk_state *a, struct kk_state *b)
{
	int32_t k = kk->k, na = a->n, nb = b->n, lo = k - nb, npair, i;
	int32_t m = na + nb < k ? na + nb : k;
	struct kk_set *sets = malloc(sizeof(*sets) * (size_t)m);
	struct kk_set *pairs = kk->tmp1, *tmp = kk->tmp2;

	if (!sets)
		return -ENOMEM;
	if (lo >= na) {
		/* na + nb <= k: no position holds sets of both. */
		merge_desc(a->sets, na, b->sets, nb, sets);
	} else {
		npair = na - lo;
		for (i = lo; i < na; i++) {
			pairs[i - lo] = a->sets[i];
			set_merge(kk, &pairs[i - lo], &b->sets[k - 1 - i]);
		}
		sort_desc(pairs, npair, tmp);
		merge_desc(a->sets, lo, pairs, npair, tmp);
		merge_desc(tmp, na, b->sets, k - na, sets);
	}
	free(a->sets);
	free(b->sets);
	b->sets = NULL;
	b->n = 0;
	a->sets = sets;
	a->n = m;
	return 0;
}

static void kk_free_states(struct kk *kk)
{
	int32_t i;

	for (i = 0; i < kk->heap_len; i++)
		free(kk->heap[i].sets);
	kk->heap_len = 0;
}

/* The order verl starts from: sorted((seqlen, i)). */
struct len_idx {
	int32_t len, idx;
};

static int len_idx_cmp(const void *pa, const void *pb)
{
	const struct len_idx *a = pa, *b = pb;

	if (a->len != b->len)
		return a->len < b->len ? -1 : 1;
	return a->idx < b->idx ? -1 : a->idx > b->idx;
}

/* Run Karmarkar–Karp for k (1 <= k <= num_seqs) over the sequences in
 * `order` (already sorted by (len, idx)). On success *ret holds the final
 * state (caller frees ret->sets); the item lists run through kk->next. */
static int kk_run(struct kk *kk, const struct len_idx *order, int32_t num_seqs,
		  int32_t k, struct kk_state *ret)
{
	int32_t i;
	int rc;

	kk->k = k;
	kk->heap_len = 0;
	for (i = 0; i < num_seqs; i++) {
		struct kk_state s = { .n = 1 };

		s.sets = malloc(sizeof(*s.sets));
		if (!s.sets) {
			kk_free_states(kk);
			return -ENOMEM;
		}
		s.sets[0].sum = order[i].len;
		s.sets[0].count = 1;
		s.sets[0].head = order[i].idx;
		s.sets[0].tail = order[i].idx;
		kk->next[order[i].idx] = -1;
		heap_push(kk, s);
	}
	while (kk->heap_len > 1) {
		struct kk_state a = heap_pop(kk), b = heap_pop(kk);

		rc = state_merge(kk, &a, &b);
		if (rc < 0) {
			free(a.sets);
			free(b.sets);
			kk_free_states(kk);
			return rc;
		}
		heap_push(kk, a);
	}
	*ret = heap_pop(kk);
	return 0;
}

void mb_plan_free(struct mb_plan *p)
{
	if (!p)
		return;
	free(p->mb_start);
	free(p->seq_order);
	free(p->mb_tokens);
	free(p->seq_offset);
	memset(p, 0, sizeof(*p));
}

/* Turn the best run into a plan: micro-batches ordered by their first
 * (lowest) request index, sequences in request order within each. */
static int plan_from_best(const struct kk *kk, const int32_t *seq_lens,
			  int32_t num_seqs, struct mb_plan *ret)
{
	const int32_t nmb = kk->best_k, *mb_of = kk->best_of;
	struct mb_plan p = { .num_micro_batches = nmb };
	int32_t *mb_id = NULL, *fill = NULL;
	int32_t i, next_id = 0;
	int64_t off = 0;
	int rc = -ENOMEM;

	p.mb_start = calloc((size_t)nmb + 1, sizeof(*p.mb_start));
	p.seq_order = malloc(sizeof(*p.seq_order) * (size_t)num_seqs);
	p.mb_tokens = calloc((size_t)nmb, sizeof(*p.mb_tokens));
	p.seq_offset = malloc(sizeof(*p.seq_offset) * (size_t)num_seqs);
	mb_id = malloc(sizeof(*mb_id) * (size_t)nmb);     /* set -> mb index */
	fill = malloc(sizeof(*fill) * (size_t)nmb);
	if (!p.mb_start || !p.seq_order || !p.mb_tokens || !p.seq_offset ||
	    !mb_id || !fill)
		goto out;

	for (i = 0; i < nmb; i++)
		mb_id[i] = -1;
	/* Number the micro-batches in order of their first sequence. */
	for (i = 0; i < num_seqs; i++) {
		int32_t set = mb_of[i];

		if (mb_id[set] < 0)
			mb_id[set] = next_id++;
		p.mb_start[mb_id[set] + 1]++;
		p.mb_tokens[mb_id[set]] += seq_lens[i];
		p.seq_offset[i] = off;
		off += seq_lens[i];
	}
	for (i = 0; i < nmb; i++) {
		p.mb_start[i + 1] += p.mb_start[i];
		fill[i] = p.mb_start[i];
	}
	for (i = 0; i < num_seqs; i++)
		p.seq_order[fill[mb_id[mb_of[i]]]++] = i;
	*ret = p;
	rc = 0;
out:
	if (rc < 0)
		mb_plan_free(&p);
	free(mb_id);
	free(fill);
	return rc;
}

/* Run k and, if it fits, record it as the best run: 1 = fits, 0 = does
 * not fit, < 0 = error. */
static int try_k(struct kk *kk, const struct len_idx *order, int32_t num_seqs,
		 int32_t k, int64_t budget)
{
	struct kk_state st;
	int32_t i, s;
	int rc = kk_run(kk, order, num_seqs, k, &st);

	if (rc < 0)
		return rc;
	rc = st.sets[0].sum <= budget;
	if (rc) {
		for (i = 0; i < st.n; i++)
			for (s = st.sets[i].head; s >= 0; s = kk->next[s])
				kk->best_of[s] = i;
		kk->best_k = st.n;
	}
	free(st.sets);
	return rc;
}

/* Find the k to use, starting at k_lo, and leave its run as the best. */
static int search_k(struct kk *kk, const struct len_idx *order, int32_t num_seqs,
		    int32_t k_lo, int64_t budget)
{
	int32_t k, lo, hi, mid;
	int rc;

	for (k = k_lo; k <= num_seqs && k < k_lo + LINEAR_TRIES; k++) {
		rc = try_k(kk, order, num_seqs, k, budget);
		if (rc != 0)
			return rc < 0 ? rc : 0;
	}
	/* Invariant: lo does not fit (or is below k_lo), hi is not known to
	 * fit until tried; num_seqs always fits. */
	lo = k - 1;
	hi = num_seqs;
	while (hi - lo > 1) {
		mid = lo + (hi - lo) / 2;
		rc = try_k(kk, order, num_seqs, mid, budget);
		if (rc < 0)
			return rc;
		if (rc)
			hi = mid;
		else
			lo = mid;
	}
	if (kk->best_k == hi)
		return 0;
	rc = try_k(kk, order, num_seqs, hi, budget);
	if (rc < 0)
		return rc;
	/* One sequence per micro-batch cannot exceed the budget. */
	return rc ? 0 : -EIO;
}

int mb_plan_make(const int32_t *seq_lens, int32_t num_seqs, int64_t budget,
		 struct mb_plan *ret, struct eng_error *err)
{
	struct kk kk = { 0 };
	struct len_idx *order = NULL;
	int64_t total = 0, k_lo, big = 0;
	int32_t i;
	int rc;

	if (!ret)
		return eng_fail(err, -EINVAL, "mb_plan: missing result");
	if (budget <= 0)
		return eng_fail(err, -EINVAL,
				"max_tokens_per_micro_batch: %lld must be > 0",
				(long long)budget);
	/* seq_lens (each >= 1, at least one) were checked by
	 * engine_batch_check. */
	for (i = 0; i < num_seqs; i++) {
		if (seq_lens[i] > budget)
			return eng_fail(err, -EINVAL,
					"seq_lens[%d]: sequence of %d tokens exceeds max_tokens_per_micro_batch %lld",
					i, seq_lens[i], (long long)budget);
		total += seq_lens[i];
		/* No two of these share a micro-batch. */
		if (2 * (int64_t)seq_lens[i] > budget)
			big++;
	}
	/* No partition into fewer micro-batches fits. */
	k_lo = total / budget + (total % budget != 0);  /* no overflow for any budget */
	if (big > k_lo)
		k_lo = big;
	if (k_lo > num_seqs)
		k_lo = num_seqs;

	order = malloc(sizeof(*order) * (size_t)num_seqs);
	kk.next = malloc(sizeof(*kk.next) * (size_t)num_seqs);
	kk.heap = malloc(sizeof(*kk.heap) * (size_t)num_seqs);
	kk.best_of = malloc(sizeof(*kk.best_of) * (size_t)num_seqs);
	kk.tmp1 = malloc(sizeof(*kk.tmp1) * (size_t)num_seqs);
	kk.tmp2 = malloc(sizeof(*kk.tmp2) * (size_t)num_seqs);
	if (!order || !kk.next || !kk.heap || !kk.best_of || !kk.tmp1 || !kk.tmp2) {
		rc = -ENOMEM;
		goto out;
	}
	for (i = 0; i < num_seqs; i++) {
		order[i].len = seq_lens[i];
		order[i].idx = i;
	}
	qsort(order, (size_t)num_seqs, sizeof(*order), len_idx_cmp);

	rc = search_k(&kk, order, num_seqs, (int32_t)k_lo, budget);
	if (rc == 0)
		rc = plan_from_best(&kk, seq_lens, num_seqs, ret);
out:
	if (rc == -ENOMEM)
		eng_fail(err, rc, "mb_plan: out of memory planning %d sequences",
			 num_seqs);
	else if (rc < 0)
		eng_fail(err, rc, "mb_plan: no partition fits (internal error)");
	free(order);
	free(kk.next);
	free(kk.heap);
	free(kk.best_of);
	free(kk.tmp1);
	free(kk.tmp2);
	return rc;
}
