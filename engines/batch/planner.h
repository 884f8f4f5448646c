/* planner.h — micro-batch planning for packed batches.
 *
 * Sequences are grouped into micro-batches whose token counts stay within a
 * budget, never splitting a sequence, balanced by token count
 * (Karmarkar–Karp largest differencing over k bins, k the smallest count
 * that fits the budget). Within a micro-batch sequences keep their request
 * order; micro-batches are ordered by their first sequence.
 */
#ifndef ENGINED_BATCH_PLANNER_H
#define ENGINED_BATCH_PLANNER_H

#include <stdint.h>

#include "err.h"

struct mb_plan {
	int32_t num_micro_batches;
	int32_t *mb_start;     /* [num_micro_batches + 1] offsets into seq_order */
	int32_t *seq_order;    /* [num_seqs] request sequence indices, grouped by micro-batch */
	int64_t *mb_tokens;    /* [num_micro_batches] tokens per micro-batch */
	int64_t *seq_offset;   /* [num_seqs] first token of request sequence i in input_ids */
};

/* Plan micro-batches for seq_lens[num_seqs] within `budget` tokens (> 0,
 * any int64; else -EINVAL). The lengths are a checked batch's
 * (engine_batch_check: num_seqs >= 1, each >= 1). A sequence longer than
 * the budget: -EINVAL "seq_lens[i]: ...".
 * The caller frees with mb_plan_free. */
int mb_plan_make(const int32_t *seq_lens, int32_t num_seqs, int64_t budget,
		 struct mb_plan *ret, struct eng_error *err);
void mb_plan_free(struct mb_plan *p);   /* accepts zeroed/freed plans */

#endif
