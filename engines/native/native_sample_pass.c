/* native_sample_pass.c — the forwards of generation (native_sample.h): the
 * per-token inputs and block tables of up to cap tokens gathered on the
 * host, copied to the device, run through llama_forward with the paged
 * cache, and the LM head's logits of the wanted rows copied back, lrows
 * rows (at most the engine's LM tile) at a time. */
#include "native_sample.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Floats of logits one LM-head product of a step may write (64 MiB, on
 * the device and on the host): 110 rows of Qwen's 151936 tokens. */
#define SAMPLE_LOGITS_FLOATS (INT64_C(16) << 20)

int sample_pass_open(struct sample_pass *sp, struct native *n, int64_t cap, int64_t nblocks,
		     struct eng_error *err)
{
	int64_t r;
	int rc;

	memset(sp, 0, sizeof(*sp));
	sp->n = n;
	sp->cap = cap;
	sp->V = n->cfg.vocab_size;
	rc = kv_cache_init(&sp->kv, n->dev, &n->cfg, KV_CACHE_BLOCK, nblocks, err);
	if (!rc)
		rc = native_fb_model(n, cap, &sp->m, err);
	if (!rc)
		rc = llama_reserve(sp->m, cap, false, err);
	if (rc) {
		sample_pass_close(sp);
		return rc;
	}
	/* Every row of a decode step in one LM-head product where the logits
	 * fit SAMPLE_LOGITS_FLOATS: each product reads the whole head weight
	 * (Qwen's 545 MB), so 13 rows at a time (the training tile) made a
	 * step at batch 64 read it 5 times. */
	r = SAMPLE_LOGITS_FLOATS / sp->V;
	sp->lrows = r < 1 ? 1 : r < cap ? r : cap;
	sp->h_i32 = malloc((size_t)(SP_COLS * cap) * sizeof(int32_t));
	sp->h_rowlogp = malloc((size_t)cap * sizeof(float));
	sp->h_logits = malloc((size_t)(sp->lrows * sp->V) * sizeof(float));
	sp->d_i32 = native_dalloc(n, (size_t)(SP_COLS * cap) * sizeof(int32_t));
	sp->d_rowlogp = native_dalloc(n, (size_t)(2 * cap) * sizeof(float));
	sp->d_logits = native_dalloc(n, (size_t)(sp->lrows * sp->V) * sizeof(float));
	if (!sp->h_i32 || !sp->h_rowlogp || !sp->h_logits || !sp->d_i32 || !sp->d_rowlogp ||
	    !sp->d_logits) {
		sample_pass_close(sp);
		return eng_fail(err, -ENOMEM, "Sample: out of memory for %lld-token forwards",
				(long long)cap);
	}
	return 0;
}

void sample_pass_close(struct sample_pass *sp)
{
	if (!sp->n)
		return;
	free(sp->h_i32);
	free(sp->h_tables);
	free(sp->h_rowlogp);
	free(sp->h_logits);
	native_dfree(sp->n, sp->d_i32);
	native_dfree(sp->n, sp->d_tables);
	native_dfree(sp->n, sp->d_rowlogp);
	native_dfree(sp->n, sp->d_logits);
	kv_cache_release(&sp->kv);
	native_adapter_detach(sp->n);
	memset(sp, 0, sizeof(*sp));
}

void sample_put_token(struct sample_pass *sp, int64_t t, int32_t id, int64_t pos,
		      const int32_t *blocks, int64_t toff, int32_t target)
{
	int64_t B = sp->kv.block;

	sample_col(sp, SP_IDS)[t] = id;
	sample_col(sp, SP_POS)[t] = (int32_t)pos;
	sample_col(sp, SP_SLOTS)[t] = (int32_t)(blocks[pos / B] * B + pos % B);
	sample_col(sp, SP_TOFF)[t] = (int32_t)toff;
	sample_col(sp, SP_TARGETS)[t] = target;
}

int sample_add_table(struct sample_pass *sp, const int32_t *blocks, int32_t nblocks,
		     int64_t *ret_off, struct eng_error *err)
{
	int64_t need = sp->ntab + nblocks;

	if (need > sp->tables_cap) {
		int64_t cap = need > 2 * sp->tables_cap ? need : 2 * sp->tables_cap;
		int32_t *h = realloc(sp->h_tables, (size_t)cap * sizeof(int32_t));
		int32_t *d;

		if (!h)
			return eng_fail(err, -ENOMEM, "Sample: out of memory for block tables");
		sp->h_tables = h;
		d = native_dalloc(sp->n, (size_t)cap * sizeof(int32_t));
		if (!d)
			return eng_fail(err, -ENOMEM, "Sample: out of memory for block tables");
		native_dfree(sp->n, sp->d_tables);
		sp->d_tables = d;
		sp->tables_cap = cap;
	}
	memcpy(sp->h_tables + sp->ntab, blocks, (size_t)nblocks * sizeof(int32_t));
	*ret_off = sp->ntab;
	sp->ntab = need;
	return 0;
}

int sample_take_block(struct sample_pass *sp, int32_t *blocks, int32_t *nblocks,
		      struct eng_error *err)
{
	int32_t b = kv_cache_alloc(&sp->kv);

	if (b < 0)
		return eng_fail(err, -EIO, "Sample: key/value cache out of blocks");
	blocks[(*nblocks)++] = b;
	return 0;
}

int sample_forward(struct sample_pass *sp, int64_t T, float inv_temp, bool logp,
		   struct eng_error *err)
{
	const struct device_ops *o = sp->n->dev->ops;
	int32_t *d = sp->d_i32;
	struct llama_kv kv = {
		.block = sp->kv.block, .k = sp->kv.k, .v = sp->kv.v, .tables = sp->d_tables,
		.table_off = d + SP_TOFF * sp->cap, .slots = d + SP_SLOTS * sp->cap,
	};
	struct llama_batch lb = {
		.T = T, .B = 1, .ids = d + SP_IDS * sp->cap, .pos = d + SP_POS * sp->cap,
		.targets = d + SP_TARGETS * sp->cap, .kv = &kv,
	};
	int64_t ntab = sp->ntab;
	int rc = 0;

	sp->ntab = 0;
	for (int k = 0; k < SP_COLS && !rc; k++)
		rc = o->copy_h2d(sp->n->dev, d + k * sp->cap, sample_col(sp, k),
				 (size_t)T * sizeof(int32_t));
	if (!rc)
		rc = o->copy_h2d(sp->n->dev, sp->d_tables, sp->h_tables,
				 (size_t)ntab * sizeof(int32_t));
	if (rc)
		return eng_fail(err, rc, "Sample: device copy of a step's inputs failed");
	rc = llama_forward(sp->m, &lb, inv_temp, false, logp ? sp->d_rowlogp : NULL,
			   logp ? sp->d_rowlogp + sp->cap : NULL, NULL);
	if (!rc && logp)
		rc = o->copy_d2h(sp->n->dev, sp->h_rowlogp, sp->d_rowlogp, (size_t)T * sizeof(float));
	return rc ? eng_fail(err, rc, "Sample: forward failed (%s)", eng_strerror(rc)) : 0;
}

int sample_logits(struct sample_pass *sp, int64_t T, int64_t r0, int64_t R,
		  struct eng_error *err)
{
	int rc = llama_logits(sp->m, T, sp->d_i32 + SP_ROWS * sp->cap + r0, R, sp->d_logits);

	if (!rc)
		rc = sp->n->dev->ops->copy_d2h(sp->n->dev, sp->h_logits, sp->d_logits,
					       (size_t)(R * sp->V) * sizeof(float));
	return rc ? eng_fail(err, rc, "Sample: LM head failed (%s)", eng_strerror(rc)) : 0;
}
