/* sample_batch.c — the engine thread's batch of Sample calls (see
 * sample_batch.h).
 *
 * A call's end (the engine's done) is only noted; its reply goes out after
 * the step that ended it, and after the batch has closed when it was the
 * last call, so that a GetStatus sent after the reply sees the engine as
 * the reply left it (the cache freed, the engine idle). */
#include "sample_batch.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "handlers.h"
#include "job_run.h"
#include "log.h"

struct ended {
	struct job *job;
	int rc;
	struct eng_error err;
	struct ended *next;
};

struct sample_batch {
	struct engine_sampler *s;
	char adapter[ENGINE_ADAPTER_NAME_MAX + 1];
	struct ended *ended, **tail;   /* calls ended, in order, not yet answered */
};

/* The engine's done (ctx: the job): noted for batch_answer. */
static void done(void *ctx, int rc, const struct eng_error *why)
{
	struct job *j = ctx;
	struct sample_batch *b = j->d->samples;
	struct ended *e = calloc(1, sizeof(*e));

	if (!e) {   /* answered at once, out of order */
		struct eng_error err;

		eng_error_clear(&err);
		if (why)
			err = *why;
		job_run_done(j->d, j, rc, &err, eng_now_s() - j->t_start, false);
		return;
	}
	e->job = j;
	e->rc = rc;
	eng_error_clear(&e->err);
	if (why)
		e->err = *why;
	*b->tail = e;
	b->tail = &e->next;
}

/* Answer the ended calls: each one's last message out (or why not), then
 * its status; the last one leaves the engine idle when idle. */
static void answer(struct daemon *d, struct ended *e, bool idle)
{
	while (e) {
		struct ended *next = e->next;
		struct job *j = e->job;

		if (rpc_stream_wait(j->call) < 0 && e->rc == 0)
			e->rc = eng_fail(&e->err, -ECANCELED, "Sample: the client went away "
					 "(cancelled or deadline)");
		job_run_done(d, j, e->rc, &e->err, eng_now_s() - j->t_start, idle && !next);
		free(e);
		e = next;
	}
}

bool sample_batched(const struct job *j)
{
	return j->m && j->m->run == h_run_sample;
}

bool sample_joins(const struct daemon *d, const struct job *j)
{
	return d->samples && sample_batched(j) && !strcmp(job_adapter(j), d->samples->adapter);
}

/* After a step or a join: answer what ended; close the batch first when
 * no call is left. */
static void settle(struct daemon *d)
{
	struct sample_batch *b = d->samples;
	struct ended *e = b->ended;
	bool empty = engine_sampler_calls(b->s) == 0;

	b->ended = NULL;
	b->tail = &b->ended;
	if (!empty) {
		answer(d, e, false);
		return;
	}
	engine_sampler_close(b->s);     /* ends nothing: no call is left */
	d->samples = NULL;
	free(b);
	if (e) {
		answer(d, e, true);
		return;
	}
	daemon_update_snapshot(d);
	pthread_mutex_lock(&d->lock);
	d->busy = false;
	d->current_job = NULL;
	pthread_mutex_unlock(&d->lock);
}

void sample_job(struct daemon *d, struct job *j)
{
	struct engine_sample_params *p = h_sample_params(j);
	struct eng_error err;
	struct engine *e;
	int r;

	eng_error_clear(&err);
	j->t_start = eng_now_s();
	p->done = done;
	r = job_run_admit(d, j, &err);
	if (r == 0 && !d->samples) {
		struct sample_batch *b = calloc(1, sizeof(*b));

		r = b ? daemon_engine_of(d, job_adapter(j), &e, &err)
		      : eng_fail(&err, -ENOMEM, "out of memory");
		if (r == 0)
			r = engine_sampler_open(e, &b->s, &err);
		if (r == 0) {
			snprintf(b->adapter, sizeof(b->adapter), "%s", job_adapter(j));
			b->tail = &b->ended;
			d->samples = b;
		} else {
			free(b);
		}
	}
	if (r == 0)
		r = engine_sampler_add(d->samples->s, p, &err);
	if (r == 0)
		return;
	/* It never joined: answered now (the batch closed first if it was
	 * opened for it alone). */
	if (d->samples && engine_sampler_calls(d->samples->s) == 0)
		settle(d);
	job_run_done(d, j, r, &err, eng_now_s() - j->t_start, !d->samples);
}

void sample_step(struct daemon *d)
{
	struct eng_error err;

	eng_error_clear(&err);
	if (engine_sampler_calls(d->samples->s) > 0 &&
	    engine_sampler_step(d->samples->s, &err) < 0)
		log_msg(LOG_LVL_WARN, "Sample: the batch failed: %s", err.msg);
	settle(d);
}
