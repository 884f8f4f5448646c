/* jobs.c — the running job as the rest of the daemon sees it: the status
 * snapshot, which job runs and since when, its progress. The engine
 * thread (dispatch.c) and the engines (through daemon_progress) write
 * these under d->lock; GetStatus (handlers.c) and the slow-job log line
 * (main.c) read them. Below the handlers and the dispatcher, so that
 * neither calls up a layer to reach them. */
#include "daemon.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

void daemon_update_snapshot(struct daemon *d)
{
	struct engine_status st;
	struct adapter_status *as = d->adapter_work;
	int n = 0;

	memset(&st, 0, sizeof(st));
	if (d->engine)
		engine_status(d->engine, &st);
	if (as)
		n = adapters_status(&d->adapters, as);
	pthread_mutex_lock(&d->lock);
	d->snap = st;
	d->adapter_work = d->adapter_snap;
	d->adapter_snap = as;
	d->n_adapter_snap = n;
	pthread_mutex_unlock(&d->lock);
}

int daemon_engine_of(struct daemon *d, const char *name, struct engine **ret,
		     struct eng_error *err)
{
	struct engine *e = name[0] ? adapters_find(&d->adapters, name) : d->engine;

	if (!e)
		return eng_fail(err, -ENOENT, "adapter: no adapter named '%s'", name);
	*ret = e;
	return 0;
}

static double since(const struct timespec *t0)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return (double)(now.tv_sec - t0->tv_sec) + (double)(now.tv_nsec - t0->tv_nsec) * 1e-9;
}

void daemon_job_started_locked(struct daemon *d, const char *name)
{
	d->busy = true;
	d->current_job = name;
	d->job_seq++;
	memset(&d->progress, 0, sizeof(d->progress));
	clock_gettime(CLOCK_MONOTONIC, &d->job_started);
}

void daemon_progress(void *ctx, const char *phase, int64_t done, int64_t total,
		     const char *unit)
{
	struct daemon *d = ctx;

	pthread_mutex_lock(&d->lock);
	snprintf(d->progress.phase, sizeof(d->progress.phase), "%s", phase ? phase : "");
	snprintf(d->progress.unit, sizeof(d->progress.unit), "%s", unit ? unit : "");
	d->progress.done = done;
	d->progress.total = total;
	pthread_mutex_unlock(&d->lock);
}

void daemon_job_view(struct daemon *d, struct daemon_job_view *ret)
{
	memset(ret, 0, sizeof(*ret));
	pthread_mutex_lock(&d->lock);
	ret->busy = d->busy;
	ret->seq = d->job_seq;
	if (d->busy) {
		snprintf(ret->job, sizeof(ret->job), "%s", d->current_job ? d->current_job : "");
		ret->seconds = since(&d->job_started);
		ret->progress = d->progress;
	}
	pthread_mutex_unlock(&d->lock);
}

double daemon_job_seconds(struct daemon *d)
{
	struct timespec now;
	double s = 0;

	clock_gettime(CLOCK_MONOTONIC, &now);
	pthread_mutex_lock(&d->lock);
	if (d->busy)
		s = (double)(now.tv_sec - d->job_started.tv_sec) +
		    (double)(now.tv_nsec - d->job_started.tv_nsec) * 1e-9;
	pthread_mutex_unlock(&d->lock);
	return s;
}
