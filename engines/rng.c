/* rng.c — xoshiro256** seeded by splitmix64 (see rng.h).
 *
 * The generator, its jump polynomial and the seeding follow the public-domain
 * reference code at https://prng.di.unimi.it/ (xoshiro256starstar.c,
 * splitmix64.c); the test pins the first outputs against that definition.
 */
#include "rng.h"

#include <math.h>

static inline uint64_t rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

static uint64_t splitmix64_next(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

void rng_seed(struct rng *r, uint64_t seed)
{
	int i;

	/* splitmix64 is a bijection on its counter, and four consecutive
	 * outputs are never all zero, so every seed gives a valid state. */
	for (i = 0; i < RNG_STATE_WORDS; i++)
		r->s[i] = splitmix64_next(&seed);
}

uint64_t rng_next_u64(struct rng *r)
{
	uint64_t *s = r->s;
	uint64_t result = rotl(s[1] * 5, 7) * 9;
	uint64_t t = s[1] << 17;

	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = rotl(s[3], 45);
	return result;
}

double rng_uniform(struct rng *r)
{
	return (double)(rng_next_u64(r) >> 11) * 0x1.0p-53;
}

void rng_normal_fill(struct rng *r, float *x, int64_t n, float mean, float std)
{
	int64_t i;

	for (i = 0; i < n; i += 2) {
		/* 1 - u1 lies in (0, 1], so the log is finite. */
		double u1 = rng_uniform(r), u2 = rng_uniform(r);
		double rad = sqrt(-2.0 * log(1.0 - u1));
		double th = 2.0 * M_PI * u2;

		x[i] = (float)(mean + std * rad * cos(th));
		if (i + 1 < n)
			x[i + 1] = (float)(mean + std * rad * sin(th));
	}
}

void rng_jump(struct rng *r)
{
	static const uint64_t jump[RNG_STATE_WORDS] = {
		0x180ec6d33cfd0abaull, 0xd5a61266f0c9392cull,
		0xa9582618e03fc9aaull, 0x39abdc4529b1661cull,
	};
	uint64_t t[RNG_STATE_WORDS] = { 0 };
	int i, b, w;

	for (i = 0; i < RNG_STATE_WORDS; i++) {
		for (b = 0; b < 64; b++) {
			if (jump[i] & (1ull << b))
				for (w = 0; w < RNG_STATE_WORDS; w++)
					t[w] ^= r->s[w];
			rng_next_u64(r);
		}
	}
	for (w = 0; w < RNG_STATE_WORDS; w++)
		r->s[w] = t[w];
}

void rng_get_state(const struct rng *r, uint64_t ret_state[RNG_STATE_WORDS])
{
	int i;

	for (i = 0; i < RNG_STATE_WORDS; i++)
		ret_state[i] = r->s[i];
}

int rng_set_state(struct rng *r, const uint64_t state[RNG_STATE_WORDS],
		  struct eng_error *err)
{
	int i;

	if (!state)
		return eng_fail(err, -EINVAL, "rng_state: missing");
	if (!(state[0] | state[1] | state[2] | state[3]))
		return eng_fail(err, -EINVAL,
				"rng_state: all four words are zero (not a reachable state)");
	for (i = 0; i < RNG_STATE_WORDS; i++)
		r->s[i] = state[i];
	return 0;
}
