/* kv_cache.h — the paged key/value cache of generation: every layer's keys
 * and values in blocks of `block` positions, one device allocation, and
 * the host's bookkeeping of which blocks are free and how many sequences
 * hold each (a prompt's full blocks are shared by its samples; a sequence
 * that writes into a shared block first copies it: kv_cache_copy).
 *
 * Layout: layer l's keys are k[l] = [nblocks, block, KV, D], its values
 * v[l] the same (struct llama_kv reads them). Position j of a sequence
 * whose blocks are table[0 ..] lies at slot table[j / block] * block +
 * j % block.
 */
#ifndef ENGINED_MODEL_KV_CACHE_H
#define ENGINED_MODEL_KV_CACHE_H

#include <stdint.h>

#include "../device/device.h"
#include "config.h"
#include "err.h"

/* Positions per block: small enough that a sequence wastes little of its
 * last block, large enough that a block's rows stream well. */
#define KV_CACHE_BLOCK 16

struct kv_cache {
	struct device *dev;
	int64_t layers, block, nblocks;
	int64_t row_floats;         /* KV x D: one position of one layer */
	float *mem;                 /* device: [L][k|v][nblocks, block, KV, D] */
	float **k, **v;             /* [L] into mem */
	int32_t *refs;              /* [nblocks] host: holders of each block */
	int32_t *free_ids;          /* [nblocks] host: a stack of free blocks */
	int64_t nfree;
	int64_t peak_used;          /* blocks in use at most */
};

/* Bytes of one block (all layers, keys and values); 0 when it overflows. */
int64_t kv_cache_block_bytes(const struct model_config *cfg, int64_t block);

/* A cache of nblocks blocks on dev (-ENOMEM naming its size). */
int kv_cache_init(struct kv_cache *c, struct device *dev, const struct model_config *cfg,
		  int64_t block, int64_t nblocks, struct eng_error *err);
void kv_cache_release(struct kv_cache *c);    /* frees everything; idempotent */

/* A free block, held once; -1 when none is free. */
int32_t kv_cache_alloc(struct kv_cache *c);
/* One more holder of block b / one fewer (the last frees it). */
void kv_cache_hold(struct kv_cache *c, int32_t b);
void kv_cache_drop(struct kv_cache *c, int32_t b);
/* Every layer's keys and values of block src into block dst. */
int kv_cache_copy(struct kv_cache *c, int32_t dst, int32_t src);

#endif
