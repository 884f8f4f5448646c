/* native_sample.c — generation in the native engine (docs/SAMPLING.md): a
 * batch of Sample calls that share every decode step (continuous
 * batching).
 *
 * Calls join the batch at any step (engine_sampler_add). Their prompts are
 * admitted in order of arrival while the cache blocks each may need at
 * most (every sample at max_tokens) fit beside those already admitted, so
 * that no completion runs out of blocks half-way and none overtakes an
 * earlier call's waiting prompt. An admitted prompt is prefilled once, in
 * chunks of its call's prefill budget, into the paged cache (kv_cache.h);
 * its samples then fork from its blocks (full blocks shared, the last
 * partial one copied) and draw their first token from its last row. Every
 * running completion of every call advances one token per step; one that
 * stops is emitted and its blocks freed at once, and a call ends (done)
 * when its last completion is out, when its client goes away, or when
 * emitting fails; the other calls go on. Nothing of the training state is
 * touched: the forwards are forward-only and the random streams the
 * completions' own (sampler_stream_seed), never the engine's RNG.
 */
#include "native_sample.h"

#include <errno.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "../model/sampler.h"

struct call;

/* One completion in flight. */
struct seq {
	struct call *call;
	int32_t prompt, sample;
	int32_t *blocks;             /* its cache blocks, in position order */
	int32_t nblocks;
	int64_t len;                 /* positions cached */
	struct rng rng;
	int32_t ntok;                /* tokens sampled (<= max_tokens) */
	int32_t *tokens, *top_ids;   /* [max_tokens], [max_tokens * top_logprobs] */
	float *logp, *top_lp;
};

struct prompt {
	int64_t off;                 /* in input_ids */
	int32_t len;
	int64_t need;                /* blocks reserved for it and its samples */
	int32_t *blocks;             /* while it is prefilled */
	int32_t nblocks;
	int32_t live;                /* samples not yet emitted */
	bool forked;                 /* its samples made: need released at live 0 */
};

/* One Sample call in the batch; p is the caller's until done is called. */
struct call {
	const struct engine_sample_params *p;
	struct sampler_params sp;
	float inv_temp;              /* of its prompt log-probs */
	int64_t chunk;               /* prompt tokens per prefill forward */
	struct prompt *prompts;
	int32_t admitted;            /* prompts admitted so far, in order */
	int64_t pending;             /* completions not yet emitted */
	float *prompt_lp;            /* [n]: prompt log-probs, when asked */
	bool ended;                  /* done was called: p is gone */
	struct call *next;
};

struct native_sampler {
	struct native *n;
	struct sample_pass pass;
	struct sampler_work **w;     /* [threads]: one a thread of the draws */
	int threads;
	int64_t reserved;            /* blocks of the admitted prompts */
	int64_t version;             /* the weights' optimizer steps */
	struct call *calls;          /* in order of arrival */
	struct seq **run;            /* running completions ([nblocks]: each holds one) */
	int64_t nrun;
	int64_t *src;                /* [cap]: a prefill token's index in input_ids */
	int32_t *last;               /* [cap]: prompts whose last token a chunk holds */
};

static int64_t ceil_div(int64_t a, int64_t b)
{
	return (a + b - 1) / b;
}

/* Blocks prompt i's prefill and samples may hold at once, at most: with one
 * sample it keeps the prompt's blocks; with more, they share its full
 * blocks and each has its own from the partial one on (a copy of it, then
 * what its tokens need), the partial one itself held until they fork. The
 * last sampled token is never fed back: len + max_tokens - 1 positions.
 * Every running completion holds at least one block of its own (max_tokens
 * >= 2 gives it one past the shared ones). */
static bool prompt_need(const struct engine_sample_params *p, int64_t B, int64_t len,
			int64_t *ret)
{
	int64_t S = p->num_samples, end = len + p->max_tokens - 1;
	int64_t per = ceil_div(end, B) - len / B, n;

	if (S == 1) {
		*ret = ceil_div(end, B);
		return true;
	}
	return ck_mul_i64(S, per, &n) && ck_add_i64(n, ceil_div(len, B), ret);
}

/* --- completions --------------------------------------------------------- */

static void seq_free(struct native_sampler *s, struct seq *q)
{
	if (!q)
		return;
	for (int32_t b = 0; b < q->nblocks; b++)
		kv_cache_drop(&s->pass.kv, q->blocks[b]);
	free(q->blocks);
	free(q->tokens);
	free(q->logp);
	free(q->top_ids);
	free(q->top_lp);
	free(q);
}

static struct seq *seq_new(struct native_sampler *s, struct call *c, int32_t prompt,
			   int32_t sample)
{
	const struct engine_sample_params *p = c->p;
	int64_t len = c->prompts[prompt].len;
	size_t k = (size_t)p->top_logprobs, M = (size_t)p->max_tokens;
	struct seq *q = calloc(1, sizeof(*q));

	if (!q)
		return NULL;
	q->call = c;
	q->prompt = prompt;
	q->sample = sample;
	q->blocks = malloc((size_t)ceil_div(len + p->max_tokens, s->pass.kv.block) *
			   sizeof(int32_t));
	q->tokens = malloc(M * sizeof(int32_t));
	q->logp = malloc(M * sizeof(float));
	if (k) {
		q->top_ids = malloc(M * k * sizeof(int32_t));
		q->top_lp = malloc(M * k * sizeof(float));
	}
	rng_seed(&q->rng, sampler_stream_seed(p->seed, prompt, sample));
	if (!q->blocks || !q->tokens || !q->logp || (k && (!q->top_ids || !q->top_lp))) {
		seq_free(s, q);
		return NULL;
	}
	return q;
}

/* Drop a prompt's own holds on its blocks and its block list (its samples
 * keep theirs). */
static void prompt_drop(struct native_sampler *s, struct prompt *pr)
{
	for (int32_t b = 0; b < pr->nblocks; b++)
		kv_cache_drop(&s->pass.kv, pr->blocks[b]);
	pr->nblocks = 0;
	free(pr->blocks);
	pr->blocks = NULL;
}

/* End call c with rc (0: all its completions are out): its completions
 * and prompts dropped with their blocks and reservations, done called.
 * The call stays listed (ended) until the step reaps it. */
static void end_call(struct native_sampler *s, struct call *c, int rc,
		     const struct eng_error *why)
{
	if (c->ended)
		return;
	for (int64_t i = 0; i < s->nrun; i++)
		if (s->run[i] && s->run[i]->call == c) {
			seq_free(s, s->run[i]);
			s->run[i] = NULL;
		}
	for (int32_t i = 0; i < c->admitted; i++) {
		struct prompt *pr = &c->prompts[i];

		prompt_drop(s, pr);
		if (!pr->forked || pr->live > 0)
			s->reserved -= pr->need;
		pr->live = 0;
	}
	c->ended = true;
	c->p->done(c->p->emit_ctx, rc, why);
}

/* Whether q's tokens end with a stop token or sequence. */
static bool stopped(const struct engine_sample_params *p, const struct seq *q)
{
	int32_t last = q->tokens[q->ntok - 1];

	for (int32_t i = 0; i < p->num_stop_ids; i++)
		if (p->stop_ids[i] == last)
			return true;
	for (int32_t i = 0; i < p->num_stop_seqs; i++) {
		int32_t a = p->stop_seq_off[i], len = p->stop_seq_off[i + 1] - a;

		if (len <= q->ntok &&
		    !memcmp(p->stop_seq_tokens + a, q->tokens + q->ntok - len,
			    (size_t)len * sizeof(int32_t)))
			return true;
	}
	return false;
}

/* Emit q and free it; its prompt's reservation goes with its last sample,
 * and its call ends with its last completion (or when emitting fails). */
static void finish(struct native_sampler *s, struct seq *q, enum engine_finish why)
{
	struct call *c = q->call;
	const struct engine_sample_params *p = c->p;
	struct prompt *pr = &c->prompts[q->prompt];
	struct engine_completion out = {
		.prompt_index = q->prompt, .sample_index = q->sample, .num_tokens = q->ntok,
		.tokens = q->tokens, .logprobs = q->logp, .top_ids = q->top_ids,
		.top_logprobs = q->top_lp, .finish = why, .prompt_len = pr->len,
		.prompt_logprobs = c->prompt_lp && q->sample == 0 ? c->prompt_lp + pr->off : NULL,
		.weights_version = s->version,
	};
	struct eng_error err;
	int rc;

	eng_error_clear(&err);
	rc = p->emit(p->emit_ctx, &out, &err);
	seq_free(s, q);
	if (--pr->live == 0 && pr->forked)
		s->reserved -= pr->need;
	if (rc)
		end_call(s, c, rc, &err);
	else if (--c->pending == 0)
		end_call(s, c, 0, NULL);
}

/* Draw q's next token from logits z[V] into its arrays (with w: any
 * thread, one completion each). */
static void pick(const struct native_sampler *s, struct seq *q, const float *z,
		 struct sampler_work *w)
{
	int32_t k = q->call->p->top_logprobs, i = q->ntok;

	sampler_pick(&q->call->sp, z, s->pass.V, rng_uniform(&q->rng), w, &q->tokens[i],
		     &q->logp[i], k ? q->top_ids + (int64_t)i * k : NULL,
		     k ? q->top_lp + (int64_t)i * k : NULL);
}

/* Take the token pick drew; true when q is then complete. */
static bool advance(struct seq *q, enum engine_finish *why)
{
	const struct engine_sample_params *p = q->call->p;

	q->ntok++;
	if (stopped(p, q)) {
		*why = ENGINE_FINISH_STOP;
		return true;
	}
	*why = ENGINE_FINISH_LENGTH;
	return q->ntok == p->max_tokens;
}

/* --- prefill ------------------------------------------------------------- */

/* Prompt i of c's samples from its last row's logits z, forked from its
 * blocks. A failure here is the engine's (memory, device). */
static int fork_samples(struct native_sampler *s, struct call *c, int32_t i, const float *z,
			struct eng_error *err)
{
	struct prompt *pr = &c->prompts[i];
	int32_t full = (int32_t)(pr->len / s->pass.kv.block), S = c->p->num_samples;
	int rc = 0;

	for (int32_t k = 0; k < S && !rc && !c->ended; k++) {
		struct seq *q = seq_new(s, c, i, k);
		enum engine_finish why;

		if (!q)
			return eng_fail(err, -ENOMEM, "Sample: out of host memory");
		pr->live++;
		q->len = pr->len;
		if (S == 1) {
			memcpy(q->blocks, pr->blocks, (size_t)pr->nblocks * sizeof(int32_t));
			q->nblocks = pr->nblocks;
			pr->nblocks = 0;   /* handed over */
		} else {
			for (int32_t b = 0; b < full; b++)
				kv_cache_hold(&s->pass.kv, q->blocks[q->nblocks++] = pr->blocks[b]);
			if (full < pr->nblocks) {
				rc = sample_take_block(&s->pass, q->blocks, &q->nblocks, err);
				if (!rc && kv_cache_copy(&s->pass.kv, q->blocks[full], pr->blocks[full]))
					rc = eng_fail(err, -EIO, "Sample: device copy of a block failed");
			}
		}
		if (rc) {
			pr->live--;
			seq_free(s, q);
		} else if (pick(s, q, z, s->w[0]), advance(q, &why)) {
			finish(s, q, why);
		} else {
			s->run[s->nrun++] = q;
		}
	}
	if (c->ended)
		return rc;
	prompt_drop(s, pr);
	pr->forked = true;
	if (pr->live == 0)
		s->reserved -= pr->need;
	return rc;
}

/* Prefill c's prompts [a, b) (admitted, not started) in chunks, forking
 * each one's samples once its last token is in. */
static int prefill(struct native_sampler *s, struct call *c, int32_t a, int32_t b,
		   struct eng_error *err)
{
	struct sample_pass *sp = &s->pass;
	const struct engine_sample_params *p = c->p;
	int32_t *rows = sample_col(sp, SP_ROWS), *targets = sample_col(sp, SP_TARGETS);
	int32_t *done = calloc((size_t)(b - a), sizeof(int32_t));   /* positions in */
	const int32_t first = a;
	int rc = 0;

	if (!done)
		return eng_fail(err, -ENOMEM, "Sample: out of host memory");
	for (int32_t i = a; i < b && !rc; i++) {
		c->prompts[i].blocks = malloc((size_t)ceil_div(c->prompts[i].len, sp->kv.block) *
					      sizeof(int32_t));
		if (!c->prompts[i].blocks)
			rc = eng_fail(err, -ENOMEM, "Sample: out of host memory");
	}
	while (a < b && !rc && !c->ended) {
		int64_t T = 0, nlast = 0;

		/* The chunk's tokens, prompt by prompt; blocks as positions need them. */
		for (int32_t i = a; i < b && T < c->chunk && !rc; i++) {
			struct prompt *pr = &c->prompts[i];
			int64_t from = done[i - first], end = from + (c->chunk - T), toff;

			end = end < pr->len ? end : pr->len;
			for (int64_t j = from; j < end && !rc; j++)
				if (j % sp->kv.block == 0)
					rc = sample_take_block(sp, pr->blocks, &pr->nblocks, err);
			if (!rc)
				rc = sample_add_table(sp, pr->blocks, pr->nblocks, &toff, err);
			if (rc)
				break;
			for (int64_t j = from; j < end; j++) {
				s->src[T] = pr->off + j;
				sample_put_token(sp, T++, p->input_ids[pr->off + j], j, pr->blocks, toff,
						 j + 1 < pr->len ? p->input_ids[pr->off + j + 1] : -1);
			}
			done[i - first] = (int32_t)end;
			if (end == pr->len) {
				rows[nlast] = (int32_t)(T - 1);
				s->last[nlast++] = i;
				a = i + 1;
			}
		}
		if (!rc)
			rc = sample_forward(sp, T, c->inv_temp, p->prompt_logprobs, err);
		/* Prompt log-probs: entry j + 1 is row j's (entry 0 stays 0). */
		for (int64_t t = 0; !rc && p->prompt_logprobs && t < T; t++)
			if (targets[t] >= 0)
				c->prompt_lp[s->src[t] + 1] = sp->h_rowlogp[t];
		for (int64_t r0 = 0; r0 < nlast && !rc && !c->ended; r0 += sp->lrows) {
			int64_t R = nlast - r0 < sp->lrows ? nlast - r0 : sp->lrows;

			rc = sample_logits(sp, T, r0, R, err);
			for (int64_t r = 0; r < R && !rc && !c->ended; r++)
				rc = fork_samples(s, c, s->last[r0 + r], sp->h_logits + r * sp->V, err);
		}
	}
	free(done);
	return rc;
}

/* --- decode -------------------------------------------------------------- */

/* One decode step: every running completion fed its last token, in
 * forwards of up to cap tokens; the finished ones emitted and removed. */
static int decode_step(struct native_sampler *s, struct eng_error *err)
{
	struct sample_pass *sp = &s->pass;
	int32_t *rows = sample_col(sp, SP_ROWS);
	int64_t kept = 0;
	int rc = 0;

	for (int64_t g0 = 0; g0 < s->nrun && !rc; g0 += sp->cap) {
		int64_t G = s->nrun - g0 < sp->cap ? s->nrun - g0 : sp->cap, T = 0;
		struct seq **grp = s->run + g0;

		for (int64_t t = 0; t < G && !rc; t++) {
			struct seq *q = grp[t];
			int64_t toff;

			if (!q)
				continue;    /* its call ended */
			if (q->len % sp->kv.block == 0)
				rc = sample_take_block(sp, q->blocks, &q->nblocks, err);
			if (!rc)
				rc = sample_add_table(sp, q->blocks, q->nblocks, &toff, err);
			if (rc)
				break;
			s->src[T] = t;          /* row T of the forward is grp[t] */
			rows[T] = (int32_t)T;
			sample_put_token(sp, T++, q->tokens[q->ntok - 1], q->len, q->blocks, toff, -1);
		}
		if (!rc && T)
			rc = sample_forward(sp, T, 1.0f, false, err);
		for (int64_t r0 = 0; r0 < T && !rc; r0 += sp->lrows) {
			int64_t R = T - r0 < sp->lrows ? T - r0 : sp->lrows;

			rc = sample_logits(sp, T, r0, R, err);
			if (rc)
				break;
			/* The draws in parallel (each completion its own stream), then
			 * the ends in row order. */
#pragma omp parallel for num_threads(s->threads) schedule(dynamic, 1)
			for (int64_t r = 0; r < R; r++) {
				struct seq *q = grp[s->src[r0 + r]];

				if (q)
					pick(s, q, sp->h_logits + r * sp->V, s->w[omp_get_thread_num()]);
			}
			for (int64_t r = 0; r < R; r++) {
				int64_t at = s->src[r0 + r];
				struct seq *q = grp[at];
				enum engine_finish why;

				if (!q)
					continue;   /* ended by an earlier emit's failure */
				q->len++;
				if (advance(q, &why)) {
					grp[at] = NULL;
					finish(s, q, why);
				}
			}
		}
	}
	for (int64_t i = 0; i < s->nrun; i++)
		if (s->run[i])
			s->run[kept++] = s->run[i];
	s->nrun = kept;
	return rc;
}

/* --- the batch ----------------------------------------------------------- */

static void call_free(struct call *c)
{
	free(c->prompts);
	free(c->prompt_lp);
	free(c);
}

/* Admit prompts in order of arrival while they fit; prefill them. */
static int admit(struct native_sampler *s, struct eng_error *err)
{
	int rc = 0;

	for (struct call *c = s->calls; c && !rc; c = c->next) {
		int32_t from = c->admitted;

		if (c->ended)
			continue;
		while (c->admitted < c->p->num_prompts &&
		       s->reserved + c->prompts[c->admitted].need <= s->pass.kv.nblocks)
			s->reserved += c->prompts[c->admitted++].need;
		if (from < c->admitted)
			rc = prefill(s, c, from, c->admitted, err);
		if (c->ended)
			continue;    /* done was called: c->p is the caller's again */
		if (c->admitted < c->p->num_prompts)
			break;    /* the next prompt waits: none overtakes it */
	}
	return rc;
}

int native_sampler_step(void *impl, struct eng_error *err)
{
	struct native_sampler *s = impl;
	struct call **pc;
	int rc;

	for (struct call *c = s->calls; c; c = c->next)
		if (!c->ended && c->p->cancelled && c->p->cancelled(c->p->cancel_ctx)) {
			struct eng_error why;

			eng_error_clear(&why);
			eng_fail(&why, -ECANCELED, "Sample: cancelled (the client went away or its "
				 "deadline passed)");
			end_call(s, c, -ECANCELED, &why);
		}
	rc = admit(s, err);
	if (!rc && s->nrun)
		rc = decode_step(s, err);
	/* A failure of the engine's (memory, the device) ends every call. */
	for (struct call *c = s->calls; c && rc; c = c->next)
		end_call(s, c, rc, err);
	for (pc = &s->calls; *pc;) {
		struct call *c = *pc;

		if (c->ended) {
			*pc = c->next;
			call_free(c);
		} else {
			pc = &c->next;
		}
	}
	return rc;
}

int native_sampler_add(void *impl, const struct engine_sample_params *p,
		       struct eng_error *err)
{
	struct native_sampler *s = impl;
	int64_t off = 0, limit = s->pass.kv.nblocks;
	int64_t ctx = s->n->cfg.max_position_embeddings;
	struct call *c, **pc;

	int rc = native_check_tokens(s->n, "input_ids", p->input_ids, p->n, err);

	if (!rc)
		rc = native_check_tokens(s->n, "stop_token_ids", p->stop_ids, p->num_stop_ids, err);
	for (int32_t i = 0; i < p->num_stop_seqs && !rc; i++) {
		char field[48];

		snprintf(field, sizeof(field), "stop_sequences[%d]", i);
		rc = native_check_tokens(s->n, field, p->stop_seq_tokens + p->stop_seq_off[i],
					 p->stop_seq_off[i + 1] - p->stop_seq_off[i], err);
	}
	if (rc)
		return rc;
	c = calloc(1, sizeof(*c));
	if (!c || !(c->prompts = calloc((size_t)p->num_prompts, sizeof(*c->prompts))) ||
	    (p->prompt_logprobs && !(c->prompt_lp = calloc((size_t)p->n, sizeof(float))))) {
		if (c)
			call_free(c);
		return eng_fail(err, -ENOMEM, "Sample: out of host memory");
	}
	for (int32_t i = 0; i < p->num_prompts; i++) {
		struct prompt *pr = &c->prompts[i];

		pr->off = off;
		pr->len = p->seq_lens[i];
		off += pr->len;
		if ((int64_t)pr->len + p->max_tokens > ctx) {
			call_free(c);
			return eng_fail(err, -EINVAL,
					"max_tokens: prompt %d has %d tokens, and %d more pass the "
					"model's context of %lld positions (max_position_embeddings)",
					i, p->seq_lens[i], p->max_tokens, (long long)ctx);
		}
		if (!prompt_need(p, s->pass.kv.block, pr->len, &pr->need) || pr->need > limit) {
			int64_t bb = kv_cache_block_bytes(&s->n->cfg, s->pass.kv.block);

			eng_fail(err, -E2BIG,
					"Sample: prompt %d (%d tokens) with num_samples %d and "
					"max_tokens %d needs up to %lld key/value cache blocks "
					"(%.1f MiB); the cache holds %lld (kv_cache_bytes %lld, "
					"%lld bytes a block of %lld positions)", i, pr->len,
					p->num_samples, p->max_tokens, (long long)pr->need,
					(double)pr->need * (double)bb / (1 << 20), (long long)limit,
					(long long)s->n->kv_cache_bytes, (long long)bb,
					(long long)s->pass.kv.block);
			call_free(c);
			return -E2BIG;
		}
	}
	c->p = p;
	c->sp = (struct sampler_params){ .temperature = p->temperature, .top_k = p->top_k,
					 .top_p = p->top_p, .top_logprobs = p->top_logprobs };
	c->inv_temp = p->temperature > 0.0f ? 1.0f / p->temperature : 1.0f;
	c->chunk = p->max_tokens_per_micro_batch > 0 &&
		   p->max_tokens_per_micro_batch < s->pass.cap ? p->max_tokens_per_micro_batch
							      : s->pass.cap;
	c->pending = (int64_t)p->num_prompts * p->num_samples;
	for (pc = &s->calls; *pc; pc = &(*pc)->next)
		;
	*pc = c;
	return 0;
}

int64_t native_sampler_calls(void *impl)
{
	const struct native_sampler *s = impl;
	int64_t k = 0;

	for (const struct call *c = s->calls; c; c = c->next)
		k += !c->ended;
	return k;
}

void native_sampler_close(void *impl)
{
	struct native_sampler *s = impl;
	struct eng_error why;

	if (!s)
		return;
	eng_error_clear(&why);
	eng_fail(&why, -ECANCELED, "Sample: the engine closed its sampler");
	for (struct call *c = s->calls; c; c = c->next)
		end_call(s, c, -ECANCELED, &why);
	while (s->calls) {
		struct call *c = s->calls;

		s->calls = c->next;
		call_free(c);
	}
	for (int64_t i = 0; i < s->nrun; i++)
		seq_free(s, s->run[i]);
	free(s->run);
	free(s->src);
	free(s->last);
	for (int i = 0; s->w && i < s->threads; i++)
		sampler_work_free(s->w[i]);
	free(s->w);
	sample_pass_close(&s->pass);
	free(s);
}

int native_sampler_open(struct engine *e, void **ret, struct eng_error *err)
{
	struct native *n = native_of(e);
	int64_t bb = kv_cache_block_bytes(&n->cfg, KV_CACHE_BLOCK);
	int64_t nblocks = bb > 0 ? n->kv_cache_bytes / bb : 0;
	struct native_sampler *s;
	int rc = 0;

	rc = native_refuse_sharded(n->base ? n->base : n, 3, "Sample", err);
	if (rc)
		return rc;
	if (nblocks > INT32_MAX)
		nblocks = INT32_MAX;
	if (nblocks < 1)
		return eng_fail(err, -E2BIG, "Sample: kv_cache_bytes %lld holds no block of "
				"%lld bytes", (long long)n->kv_cache_bytes, (long long)bb);
	if (!n->lora)
		rc = native_require_placed(n, false, false, err);
	if (rc)
		return rc;
	s = calloc(1, sizeof(*s));
	if (!s)
		return eng_fail(err, -ENOMEM, "Sample: out of host memory");
	s->n = n;
	s->version = n->optim_step;
	rc = sample_pass_open(&s->pass, n, n->default_budget, nblocks, err);
	if (rc) {
		free(s);
		return rc;
	}
	s->run = malloc((size_t)nblocks * sizeof(*s->run));
	s->src = malloc((size_t)s->pass.cap * sizeof(*s->src));
	s->last = malloc((size_t)s->pass.cap * sizeof(*s->last));
	s->threads = omp_get_max_threads();
	s->w = calloc((size_t)s->threads, sizeof(*s->w));
	for (int i = 0; s->w && i < s->threads; i++)
		if (!(s->w[i] = sampler_work_new(s->pass.V)))
			break;
	if (!s->run || !s->src || !s->last || !s->w || !s->w[s->threads - 1]) {
		native_sampler_close(s);
		return eng_fail(err, -ENOMEM, "Sample: out of host memory");
	}
	*ret = s;
	return 0;
}
