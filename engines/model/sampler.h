/* sampler.h — the host-side token sampler of generation: one row of raw
 * logits in, the next token, its log-probability and the best log-probs out.
 *
 * Definitions clients rely on (t = temperature, t = 1 when greedy):
 * - z / t is computed as zz = (double)z[i] * (double)inv with the float
 *   inv = 1.0f / t, as the engine's forward pass scales its logits; the
 *   product of two floats is exact in double, so zz keeps z's order.
 * - log softmax in double: m = max zz, lse = m + log(sum exp(zz - m)),
 *   logp[i] = zz[i] - lse, always over the whole vocabulary (before any
 *   top_k / top_p cut).
 * - "best first" orders tokens by z descending, ties by lower token id; for
 *   probabilities this is their descending order without the false ties
 *   that rounding of exp() could make.
 *
 * Parameters are validated by the caller (engines/ checks each field once);
 * the sampler does not fail and never allocates once its work area exists.
 * A struct sampler_work is used by one thread at a time.
 */
#ifndef ENGINED_MODEL_SAMPLER_H
#define ENGINED_MODEL_SAMPLER_H

#include <stdint.h>

struct sampler_params {
	float temperature;      /* 0: greedy (argmax); else > 0 */
	int32_t top_k;          /* 0: off; else keep the k most likely tokens */
	float top_p;            /* (0, 1]; 1: off */
	int32_t top_logprobs;   /* 0..20: how many best log-probs to report */
};

/* Host scratch for a vocabulary of V, reused across rows. */
struct sampler_work;

/* A work area for rows of up to V logits (1 <= V <= INT32_MAX), owned by
 * the caller and freed with sampler_work_free. NULL: out of memory, or V
 * out of range. */
struct sampler_work *sampler_work_new(int64_t V);

/* Frees w; accepts NULL. */
void sampler_work_free(struct sampler_work *w);

/* The seed of completion (prompt, sample)'s random stream: a function of
 * the three alone. Each is folded in through splitmix64's finalizer in
 * turn, so different triples (prompt and sample swapped included) give
 * unrelated streams. */
uint64_t sampler_stream_seed(uint64_t seed, int32_t prompt, int32_t sample);

/* Picks the next token from one row of raw logits z[V] (host floats, finite
 * or -inf, at least one finite; V at most the work area's).
 *
 * Greedy (temperature 0): the argmax of z, ties to the lowest id (as
 * torch.argmax); u is ignored.
 *
 * Otherwise, with u a uniform draw in [0, 1):
 * 1. candidates: every token; with 0 < top_k < V, the top_k best tokens;
 * 2. with top_p < 1, the candidates sorted best first, their probabilities
 *    renormalized over the candidates alone (top-p after top-k, as
 *    transformers and vLLM apply them): the shortest prefix whose
 *    cumulative probability is >= top_p is kept (with the token that
 *    crosses it);
 * 3. draw: over the kept tokens renormalized, accumulate probabilities and
 *    return the first token whose cumulative sum exceeds u * total (the
 *    last kept token should rounding leave none). The walk is in ascending
 *    id order when nothing is cut (neither top_k nor top_p active), best
 *    first whenever top_k or top_p is active.
 *
 * Writes *token and *logp = logp[token] (un-cut log softmax, see above).
 * top_ids / top_logps [p->top_logprobs] (may be NULL when top_logprobs is
 * 0): the top_logprobs best tokens and their logp, best first, ties by
 * lower id; entries past V are left untouched.
 */
void sampler_pick(const struct sampler_params *p, const float *z, int64_t V, double u,
		  struct sampler_work *w, int32_t *token, float *logp,
		  int32_t *top_ids, float *top_logps);

#endif
