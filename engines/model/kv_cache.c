/* kv_cache.c — the paged key/value cache's memory and block bookkeeping
 * (see kv_cache.h). */
#include "kv_cache.h"

#include <stdlib.h>
#include <string.h>

#include "checked.h"

int64_t kv_cache_block_bytes(const struct model_config *cfg, int64_t block)
{
	int64_t n;

	if (!ck_mul_i64(cfg->num_kv_heads, cfg->head_dim, &n) || !ck_mul_i64(n, block, &n) ||
	    !ck_mul_i64(n, 2 * cfg->num_layers, &n) || !ck_mul_i64(n, (int64_t)sizeof(float), &n))
		return 0;
	return n;
}

int kv_cache_init(struct kv_cache *c, struct device *dev, const struct model_config *cfg,
		  int64_t block, int64_t nblocks, struct eng_error *err)
{
	int64_t bb = kv_cache_block_bytes(cfg, block), bytes, layer;

	memset(c, 0, sizeof(*c));
	if (bb <= 0 || nblocks <= 0 || nblocks > INT32_MAX || !ck_mul_i64(bb, nblocks, &bytes))
		return eng_fail(err, -EINVAL, "key/value cache: %lld blocks do not fit",
				(long long)nblocks);
	c->dev = dev;
	c->layers = cfg->num_layers;
	c->block = block;
	c->nblocks = nblocks;
	c->row_floats = cfg->num_kv_heads * cfg->head_dim;
	c->mem = dev->ops->alloc(dev, (size_t)bytes);
	c->k = calloc((size_t)c->layers, sizeof(*c->k));
	c->v = calloc((size_t)c->layers, sizeof(*c->v));
	c->refs = calloc((size_t)nblocks, sizeof(*c->refs));
	c->free_ids = malloc((size_t)nblocks * sizeof(*c->free_ids));
	if (!c->mem || !c->k || !c->v || !c->refs || !c->free_ids) {
		kv_cache_release(c);
		return eng_fail(err, -ENOMEM, "key/value cache: cannot allocate %lld MiB",
				(long long)(bytes >> 20));
	}
	layer = nblocks * block * c->row_floats;
	for (int64_t l = 0; l < c->layers; l++) {
		c->k[l] = c->mem + 2 * l * layer;
		c->v[l] = c->k[l] + layer;
	}
	/* Popped from the top: block 0 first. */
	for (int64_t i = 0; i < nblocks; i++)
		c->free_ids[i] = (int32_t)(nblocks - 1 - i);
	c->nfree = nblocks;
	return 0;
}

void kv_cache_release(struct kv_cache *c)
{
	if (c->mem)
		c->dev->ops->free(c->dev, c->mem);
	free(c->k);
	free(c->v);
	free(c->refs);
	free(c->free_ids);
	memset(c, 0, sizeof(*c));
}

int32_t kv_cache_alloc(struct kv_cache *c)
{
	int32_t b;

	if (c->nfree == 0)
		return -1;
	b = c->free_ids[--c->nfree];
	c->refs[b] = 1;
	if (c->nblocks - c->nfree > c->peak_used)
		c->peak_used = c->nblocks - c->nfree;
	return b;
}

void kv_cache_hold(struct kv_cache *c, int32_t b)
{
	c->refs[b]++;
}

void kv_cache_drop(struct kv_cache *c, int32_t b)
{
	if (--c->refs[b] == 0)
		c->free_ids[c->nfree++] = b;
}

int kv_cache_copy(struct kv_cache *c, int32_t dst, int32_t src)
{
	size_t n = (size_t)(c->block * c->row_floats);
	int rc = 0;

	for (int64_t l = 0; l < c->layers && !rc; l++) {
		rc = c->dev->ops->copy_d2d(c->dev, c->k[l] + dst * n, c->k[l] + src * n,
					   n * sizeof(float));
		if (!rc)
			rc = c->dev->ops->copy_d2d(c->dev, c->v[l] + dst * n, c->v[l] + src * n,
						   n * sizeof(float));
	}
	return rc;
}
