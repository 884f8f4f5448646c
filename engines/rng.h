/* rng.h — the engine's seeded pseudo-random generator.
 *
 * xoshiro256** 1.0 (Blackman & Vigna, https://prng.di.unimi.it/), seeded by
 * expanding a 64-bit seed with splitmix64 as its authors recommend. The
 * whole state is four uint64 words, so it round-trips through
 * engine_state.json exactly and a resumed run draws the same numbers as an
 * uninterrupted one. Nothing is cached between calls (rng_normal_fill keeps
 * no spare Box–Muller value), for the same reason.
 *
 * Not for cryptography. A struct rng is used by one thread at a time.
 */
#ifndef ENGINED_RNG_H
#define ENGINED_RNG_H

#include <stdint.h>

#include "err.h"

#define RNG_STATE_WORDS 4

struct rng {
	uint64_t s[RNG_STATE_WORDS];
};

/* Seed from any 64-bit value (0 included). */
void rng_seed(struct rng *r, uint64_t seed);

/* Next 64 random bits. */
uint64_t rng_next_u64(struct rng *r);

/* Uniform double in [0, 1) with 53 random bits: (next >> 11) * 2^-53. */
double rng_uniform(struct rng *r);

/* x[n] = mean + std * N(0, 1), by Box–Muller in double precision: each pair
 * (x[2i], x[2i+1]) takes two draws u1, u2 = rng_uniform(); with
 * rad = sqrt(-2 ln(1 - u1)), x[2i] = rad cos(2 pi u2), x[2i+1] = rad sin(2 pi u2).
 * An odd n draws a last pair and drops its sine. n <= 0 draws nothing. */
void rng_normal_fill(struct rng *r, float *x, int64_t n, float mean, float std);

/* Advance by 2^128 draws (the reference jump()): from one seed, rank i can
 * take the stream jumped i times and never overlap another rank's. */
void rng_jump(struct rng *r);

/* Serialize / restore the state (for engine_state.json). rng_set_state
 * rejects the all-zero state, which xoshiro can never leave: -EINVAL
 * "rng_state: ..." and *r untouched. */
void rng_get_state(const struct rng *r, uint64_t ret_state[RNG_STATE_WORDS]);
int rng_set_state(struct rng *r, const uint64_t state[RNG_STATE_WORDS],
		  struct eng_error *err);

#endif
