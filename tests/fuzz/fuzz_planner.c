/* fuzz_planner.c — libFuzzer harness: micro-batch planning
 * (engines/batch/planner.c, mb_plan_make) of a batch that passed the one
 * validation (engine_batch_check), as the native engine plans a
 * ForwardBackward.
 *
 * Input: 8 bytes, the budget (little-endian int64, passed as it is: the
 * planner takes any int64 and refuses <= 0); then one little-endian int32
 * per sequence length (at most 4096 of them). The batch's token count is
 * the lengths' sum when it fits in int64 (else the batch check refuses it
 * anyway); its ids are never read by the check or the planner.
 * Checks on a plan: every sequence exactly once, micro-batches non-empty,
 * each within the budget, mb_tokens the sum of its sequences, seq_offset
 * the prefix sums of seq_lens, sequences in request order within a
 * micro-batch, micro-batches ordered by their first sequence (planner.h).
 * Seeds: tests/fuzz/corpus/fuzz_planner (tests/fuzz/make_corpus.py). */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "batch/planner.h"
#include "engine.h"
#include "fuzz_util.h"

#define MAX_SEQS 4096

static void check_plan(const struct mb_plan *p, const int32_t *lens, int32_t ns, int64_t budget)
{
	static uint8_t seen[MAX_SEQS];
	int64_t off = 0;

	FUZZ_CHECK(p->num_micro_batches >= 1 && p->num_micro_batches <= ns, "%d micro-batches",
		   p->num_micro_batches);
	FUZZ_CHECK(p->mb_start[0] == 0 && p->mb_start[p->num_micro_batches] == ns,
		   "mb_start ends");
	for (int32_t i = 0; i < ns; i++) {
		FUZZ_CHECK(p->seq_offset[i] == off, "seq_offset[%d]", i);
		off += lens[i];
	}
	memset(seen, 0, (size_t)ns);
	for (int32_t k = 0; k < p->num_micro_batches; k++) {
		int64_t tok = 0;

		FUZZ_CHECK(p->mb_start[k] < p->mb_start[k + 1], "micro-batch %d empty", k);
		for (int32_t j = p->mb_start[k]; j < p->mb_start[k + 1]; j++) {
			int32_t s = p->seq_order[j];

			FUZZ_CHECK(s >= 0 && s < ns && !seen[s], "sequence %d twice or out of range", s);
			seen[s] = 1;
			FUZZ_CHECK(j == p->mb_start[k] || s > p->seq_order[j - 1],
				   "micro-batch %d out of request order", k);
			tok += lens[s];
		}
		FUZZ_CHECK(tok == p->mb_tokens[k], "mb_tokens[%d] %lld != %lld", k,
			   (long long)p->mb_tokens[k], (long long)tok);
		FUZZ_CHECK(tok <= budget, "micro-batch %d: %lld tokens > budget %lld", k,
			   (long long)tok, (long long)budget);
		FUZZ_CHECK(k == 0 || p->seq_order[p->mb_start[k]] > p->seq_order[p->mb_start[k - 1]],
			   "micro-batches out of order at %d", k);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static int32_t lens[MAX_SEQS];
	static const int32_t one_id;
	struct engine_batch b = { .temperature = 1.0f, .forward_only = true };
	struct eng_error err = {0};
	struct mb_plan plan;
	int64_t budget, n = 0;
	int32_t ns;
	int r;

	if (size < 8)
		return 0;
	memcpy(&budget, data, 8);
	data += 8;
	size -= 8;
	ns = (int32_t)(size / 4 < MAX_SEQS ? size / 4 : MAX_SEQS);
	memcpy(lens, data, (size_t)ns * 4);
	for (int32_t i = 0; i < ns; i++)
		if (__builtin_add_overflow(n, (int64_t)lens[i], &n))
			return 0;
	b.n = n;
	b.input_ids = &one_id;      /* never read: only the lengths matter */
	b.num_seqs = ns;
	b.seq_lens = lens;
	if (engine_batch_check(&b, &err) < 0)
		return 0;
	memset(&plan, 0, sizeof(plan));
	eng_error_clear(&err);
	r = mb_plan_make(lens, ns, budget, &plan, &err);
	if (r == 0)
		check_plan(&plan, lens, ns, budget);
	else
		FUZZ_CHECK(r == -EINVAL || r == -ENOMEM, "mb_plan_make: %d", r);
	FUZZ_CHECK(r != -EINVAL || err.msg[0], "mb_plan_make: -EINVAL without a message");
	mb_plan_free(&plan);
	return 0;
}
