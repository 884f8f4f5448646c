/* native_sample.h — private to the native engine's generation: the forwards
 * of a batch of Sample calls over the paged key/value cache
 * (native_sample_pass.c), which the batch itself (native_sample.c) fills
 * token by token and runs. */
#ifndef ENGINED_NATIVE_SAMPLE_H
#define ENGINED_NATIVE_SAMPLE_H

#include "native_engine.h"
#include "../model/kv_cache.h"

/* Columns of a forward's per-token inputs: ids, pos, slots, table_off,
 * targets, and the rows whose logits are wanted. */
enum { SP_IDS, SP_POS, SP_SLOTS, SP_TOFF, SP_TARGETS, SP_ROWS, SP_COLS };

/* One forward of up to cap tokens over the cache, and its logits. */
struct sample_pass {
	struct native *n;
	struct llama_model *m;
	struct kv_cache kv;
	int64_t cap;                 /* tokens (and rows) per forward */
	int64_t lrows;               /* logits rows per LM-head product */
	int64_t V;
	int32_t *h_i32, *d_i32;      /* [SP_COLS][cap] */
	int32_t *h_tables, *d_tables;/* the block lists of a forward, end to end */
	int64_t ntab, tables_cap;
	float *d_rowlogp, *h_rowlogp;/* [2 cap] device (logp, entropy), [cap] host */
	float *d_logits, *h_logits;  /* [lrows, V] */
};

/* The model with n's adapter attached (until sample_pass_close), its
 * activations for cap tokens, a cache of nblocks blocks, the buffers. */
int sample_pass_open(struct sample_pass *sp, struct native *n, int64_t cap, int64_t nblocks,
		     struct eng_error *err);
void sample_pass_close(struct sample_pass *sp);   /* frees all; idempotent */

static inline int32_t *sample_col(const struct sample_pass *sp, int k)
{
	return sp->h_i32 + k * sp->cap;
}

/* Token t of the next forward: token id at position pos of the sequence
 * whose blocks are blocks[] (listed at offset toff of the tables), with
 * its next token as target (-1: none). */
void sample_put_token(struct sample_pass *sp, int64_t t, int32_t id, int64_t pos,
		      const int32_t *blocks, int64_t toff, int32_t target);
/* Append a sequence's block list to the forward's tables, its offset
 * there in *ret_off; -ENOMEM. */
int sample_add_table(struct sample_pass *sp, const int32_t *blocks, int32_t nblocks,
		     int64_t *ret_off, struct eng_error *err);
/* A free block appended to blocks[*nblocks]; -EIO when none is free (the
 * batch's admission reserves every block it takes). */
int sample_take_block(struct sample_pass *sp, int32_t *blocks, int32_t *nblocks,
		      struct eng_error *err);

/* Run the T tokens put so far (and the tables added; both are then reset)
 * at inv_temp; with logp, the log-probs of their targets into h_rowlogp. */
int sample_forward(struct sample_pass *sp, int64_t T, float inv_temp, bool logp,
		   struct eng_error *err);
/* Logits of the rows column's entries [r0, r0 + R) (R <= lrows) of the
 * last forward of T tokens into h_logits. */
int sample_logits(struct sample_pass *sp, int64_t T, int64_t r0, int64_t R,
		  struct eng_error *err);

#endif
