/* sample.c — Sample's request and replies: a SampleRequest decoded into
 * the engine's parameters on the poller thread (every field's rule checked
 * there, by engine_sample_params_check), and each completion the engine
 * emits streamed as one SampleResponse (one send in flight per call: each
 * waits for the previous, the flow control of docs/GRPC_NOTES.md). The
 * engine thread runs Sample calls in batches (sample_batch.h). */
#include "handlers.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "engined/v1/engine.pb-c.h"
#include "fb_request.h"
#include "pb_has.h"

/* A Sample job's own part: the engine's parameters (borrowing the
 * request; emit's context is the job). */
struct sample_prep {
	struct engine_sample_params p;
	int32_t *stop_off;           /* [num_stop_seqs + 1] */
	int32_t *stop_tokens;        /* the stop sequences end to end */
};

static void sample_prep_free(void *v)
{
	struct sample_prep *sp = v;

	if (!sp)
		return;
	free(sp->stop_off);
	free(sp->stop_tokens);
	free(sp);
}

static int emit(void *ctx, const struct engine_completion *c, struct eng_error *err);

/* The stop sequences end to end (engine_sample_params' layout). Their
 * count and lengths are bounded here, before they are summed into int32
 * offsets; engine_sample_params_check applies the same bounds again. */
static int decode_stops(struct sample_prep *sp, const Engined__V1__SampleRequest *q,
			struct eng_error *err)
{
	size_t n = q->n_stop_sequences, total = 0;

	if (n > ENGINE_SAMPLE_MAX_STOPS)
		return eng_fail(err, -EINVAL, "stop_sequences: %zu, at most %d", n,
				ENGINE_SAMPLE_MAX_STOPS);
	sp->stop_off = malloc((n + 1) * sizeof(int32_t));
	if (!sp->stop_off)
		return -ENOMEM;
	sp->stop_off[0] = 0;
	for (size_t i = 0; i < n; i++) {
		size_t len = q->stop_sequences[i]->n_token_ids;

		if (len > ENGINE_SAMPLE_MAX_STOP_LEN)
			return eng_fail(err, -EINVAL, "stop_sequences[%zu]: %zu tokens, must be 1 "
					"to %d", i, len, ENGINE_SAMPLE_MAX_STOP_LEN);
		total += len;
		sp->stop_off[i + 1] = (int32_t)total;
	}
	sp->stop_tokens = malloc((total ? total : 1) * sizeof(int32_t));
	if (!sp->stop_tokens)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++)
		if (q->stop_sequences[i]->n_token_ids)   /* an empty one: refused by the check */
			memcpy(sp->stop_tokens + sp->stop_off[i], q->stop_sequences[i]->token_ids,
			       q->stop_sequences[i]->n_token_ids * sizeof(int32_t));
	sp->p.stop_seq_tokens = sp->stop_tokens;
	sp->p.stop_seq_off = sp->stop_off;
	sp->p.num_stop_seqs = (int32_t)n;
	return 0;
}

int h_validate_sample(struct daemon *d, struct job *j, struct eng_error *err)
{
	const Engined__V1__SampleRequest *q = (const void *)j->req;
	struct sample_prep *sp = calloc(1, sizeof(*sp));
	struct engine_sample_params *p;
	int r;

	(void)d;
	if (!sp)
		return -ENOMEM;
	j->prep = sp;
	j->prep_free = sample_prep_free;
	p = &sp->p;
	r = fb_decode_ids(q->input_ids, "input_ids", -1, &p->input_ids, &p->n, err);
	if (r < 0)
		return r;
	if (q->n_seq_lens > INT32_MAX)
		return eng_fail(err, -EINVAL, "seq_lens: too many");
	p->seq_lens = q->seq_lens;
	p->num_prompts = (int32_t)q->n_seq_lens;
	p->num_samples = q->num_samples ? q->num_samples : 1;
	p->max_tokens = q->max_tokens;
	p->temperature = PB_HAS(q, temperature) ? q->temperature : 1.0f;
	p->top_k = q->top_k;
	p->top_p = PB_HAS(q, top_p) ? q->top_p : 1.0f;
	p->seed = q->seed;
	if (q->n_stop_token_ids > ENGINE_SAMPLE_MAX_STOPS)
		return eng_fail(err, -EINVAL, "stop_token_ids: %zu, at most %d",
				q->n_stop_token_ids, ENGINE_SAMPLE_MAX_STOPS);
	p->stop_ids = q->stop_token_ids;
	p->num_stop_ids = (int32_t)q->n_stop_token_ids;
	r = decode_stops(sp, q, err);
	if (r < 0)
		return r;
	p->top_logprobs = q->top_logprobs;
	p->prompt_logprobs = q->prompt_logprobs;
	p->max_tokens_per_micro_batch = q->max_tokens_per_micro_batch;
	p->emit = emit;
	p->emit_ctx = j;
	p->cancelled = h_call_gone;   /* polled before each decode step */
	p->cancel_ctx = j->call;
	return engine_sample_params_check(p, err);
}

static void free_piece(void *buf)
{
	free(buf);
}

static int emit(void *ctx, const struct engine_completion *c, struct eng_error *err)
{
	const struct job *j = ctx;
	const struct sample_prep *sp = j->prep;
	struct rpc_call *call = j->call;
	Engined__V1__SampleResponse resp = ENGINED__V1__SAMPLE_RESPONSE__INIT;
	Engined__V1__Completion comp = ENGINED__V1__COMPLETION__INIT;
	Engined__V1__Completion *cp = &comp;
	size_t k = c->top_ids ? (size_t)c->num_tokens : 0, len;	/* rows of top log-probs */
	struct rpc_piece piece;
	uint8_t *buf;

	comp.prompt_index = c->prompt_index;
	comp.sample_index = c->sample_index;
	comp.n_token_ids = comp.n_logprobs = (size_t)c->num_tokens;
	comp.token_ids = (int32_t *)c->tokens;
	comp.logprobs = (float *)c->logprobs;
	comp.finish_reason = c->finish == ENGINE_FINISH_STOP ?
			     ENGINED__V1__FINISH_REASON__FINISH_REASON_STOP :
			     ENGINED__V1__FINISH_REASON__FINISH_REASON_LENGTH;
	comp.n_top_token_ids = comp.n_top_logprobs = k * (size_t)sp->p.top_logprobs;
	comp.top_token_ids = (int32_t *)c->top_ids;
	comp.top_logprobs = (float *)c->top_logprobs;
	if (c->prompt_logprobs) {
		comp.n_prompt_logprobs = (size_t)c->prompt_len;
		comp.prompt_logprobs = (float *)c->prompt_logprobs;
	}
	resp.n_completions = 1;
	resp.completions = &cp;
	resp.weights_version = c->weights_version;
	len = protobuf_c_message_get_packed_size(&resp.base);
	buf = malloc(len ? len : 1);
	if (!buf)
		return eng_fail(err, -ENOMEM, "Sample: out of memory for a reply");
	protobuf_c_message_pack(&resp.base, buf);
	if (rpc_stream_wait(call) < 0) {
		free(buf);
		return eng_fail(err, -ECANCELED, "Sample: the client went away (cancelled or "
				"deadline)");
	}
	piece = (struct rpc_piece){ buf, len, free_piece, buf };
	if (rpc_stream_send(call, &piece, 1) < 0)
		return eng_fail(err, -ECANCELED, "Sample: the client went away (cancelled or "
				"deadline)");
	return 0;
}

struct engine_sample_params *h_sample_params(struct job *j)
{
	return &((struct sample_prep *)j->prep)->p;
}

int h_run_sample(struct daemon *d, struct job *j, struct eng_error *err)
{
	struct engine *e;
	int r;

	r = daemon_engine_of(d, job_adapter(j), &e, err);
	return r < 0 ? r : engine_sample(e, h_sample_params(j), err);
}
