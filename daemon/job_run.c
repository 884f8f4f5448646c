/* job_run.c — an engine job's start and end on the engine thread (see
 * job_run.h). */
#include "job_run.h"

#include <signal.h>
#include <unistd.h>

#include "clock.h"
#include "log.h"
#include "test_hold.h"

/* The state gate, checked when the job is about to run: an engine that
 * works. Which calls each mode allows is the engine's rule (engine.c). */
static int gate(struct daemon *d, const struct method *m, struct eng_error *err)
{
	const char *failed;

	if (!m->needs_init)
		return 0;
	pthread_mutex_lock(&d->lock);
	failed = d->engine_failed;
	pthread_mutex_unlock(&d->lock);
	if (failed)
		return eng_fail(err, -EIO,
				"engine: the device failed (%s); engined is exiting to be restarted",
				failed);
	if (!d->engine)
		return eng_fail(err, -EALREADY,
				"engine: not initialized (call Initialize first)");
	return 0;
}

int job_run_admit(struct daemon *d, struct job *j, struct eng_error *err)
{
	int r;

	if (rpc_call_cancelled(j->call))
		return eng_fail(err, -ECANCELED, "call cancelled before it ran");
	if (rpc_call_expired(j->call))
		return eng_fail(err, -ETIMEDOUT,
				"deadline passed after %.3f s in the queue; the job did not run",
				rpc_call_elapsed(j->call));
	r = gate(d, j->m, err);
	if (r == 0) {
		test_hold_wait(j->m->name);
		j->ran = true;
	}
	return r;
}

void job_run_done(struct daemon *d, struct job *j, int r, struct eng_error *err_in,
		  double dt, bool idle)
{
	struct eng_error err = *err_in;
	bool newly_failed;

	if (r == 0) {
		if (j->m_tokens > 0)
			metrics_forward_backward(&d->metrics, j->m_tokens, dt);
		if (j->m_step)
			metrics_optimizer_step(&d->metrics, dt, j->m_grad_norm);
		if (j->m_saved)
			metrics_checkpoint_saved(&d->metrics);
	}
	daemon_update_snapshot(d);
	pthread_mutex_lock(&d->lock);
	if (idle) {
		d->busy = false;
		d->current_job = NULL;
	}
	newly_failed = d->snap.failed && !d->engine_failed;
	if (newly_failed)
		d->engine_failed = d->snap.failed;
	pthread_mutex_unlock(&d->lock);
	if (newly_failed) {
		/* The reply names the failure; then the process goes down for a
		 * restart (SIGTERM takes the normal drain path, exit code 1). */
		eng_error_clear(&err);
		r = eng_fail(&err, -EIO,
			     "engine: the device failed (%s); engined is exiting to be restarted",
			     d->snap.failed);
		log_msg(LOG_LVL_ERROR, "device failed: %s; exiting for a restart",
			d->snap.failed);
	}
	job_finish(j, r, &err);
	if (newly_failed)
		kill(getpid(), SIGTERM);
	pthread_mutex_lock(&d->lock);
	d->in_flight--;
	pthread_mutex_unlock(&d->lock);
}
