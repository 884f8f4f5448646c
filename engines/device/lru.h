/* lru.h — the lookup of the devices' small product caches (cpu_gemm.c's
 * oneDNN primitives, cuda_gemm.c's cuBLASLt plans): a fixed array of
 * entries, each beginning with a struct lru_slot, searched by key; a miss
 * names an unused entry, else the least recently used one, for the caller
 * to clear and fill. Header-only; private to engines/device/. */
#ifndef ENGINED_DEVICE_LRU_H
#define ENGINED_DEVICE_LRU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct lru_slot {
	bool used;                  /* holds a built entry */
	uint64_t last_use;          /* the cache's clock at its last use */
};

/* Advance *clock; return the entry among `n` (each `stride` bytes) that is
 * used and whose key `matches`, its last_use now the clock, with *ret_hit
 * true; else the entry to fill (an unused one, else the least recently
 * used) with *ret_hit false: the caller clears it, builds it, and on
 * success sets used and last_use = *clock. */
static inline void *lru_find(void *entries, size_t stride, int n, uint64_t *clock,
			     bool (*matches)(const void *entry, const void *key),
			     const void *key, bool *ret_hit)
{
	struct lru_slot *victim = entries;

	++*clock;
	for (int i = 0; i < n; i++) {
		struct lru_slot *s = (void *)((char *)entries + (size_t)i * stride);

		if (s->used && matches(s, key)) {
			s->last_use = *clock;
			*ret_hit = true;
			return s;
		}
		if (!s->used)
			victim = s;
		else if (victim->used && s->last_use < victim->last_use)
			victim = s;
	}
	*ret_hit = false;
	return victim;
}

#endif
