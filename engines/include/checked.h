/* checked.h — arithmetic on sizes that come from clients (token counts,
 * model dimensions, byte lengths): every product and sum of such values
 * goes through these, which report overflow instead of wrapping. Each
 * returns true when the result fits and stores it in *r. */
#ifndef ENGINED_CHECKED_H
#define ENGINED_CHECKED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

static inline bool ck_mul_i64(int64_t a, int64_t b, int64_t *r)
{
	return !__builtin_mul_overflow(a, b, r);
}

static inline bool ck_add_i64(int64_t a, int64_t b, int64_t *r)
{
	return !__builtin_add_overflow(a, b, r);
}

static inline bool ck_mul_size(size_t a, size_t b, size_t *r)
{
	return !__builtin_mul_overflow(a, b, r);
}

#endif
