/* lent.c — the engine's memory lent to gRPC: a zero-copy parameter stream
 * (export/stream.c) hands gRPC slices of the engine's own parameters, and
 * gRPC lets go of each when it has sent it. Every job that may change or
 * free parameter memory waits here first (engine thread). Layer 3: below
 * the handlers, the exports and the dispatcher that all use it. */
#include "daemon.h"

#include <errno.h>
#include <time.h>

#include "log.h"

void daemon_lend_engine_mem(struct daemon *d, int64_t n)
{
	pthread_mutex_lock(&d->zc_lock);
	d->zc_outstanding += n;
	pthread_mutex_unlock(&d->zc_lock);
}

void daemon_engine_mem_released(void *ctx)
{
	struct daemon *d = ctx;

	pthread_mutex_lock(&d->zc_lock);
	if (--d->zc_outstanding == 0)
		pthread_cond_broadcast(&d->zc_cond);
	pthread_mutex_unlock(&d->zc_lock);
}

void daemon_wait_engine_mem(struct daemon *d)
{
	struct timespec until;
	int waited = 0;

	pthread_mutex_lock(&d->zc_lock);
	while (d->zc_outstanding > 0 && waited < 30) {
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_sec += 1;
		if (pthread_cond_timedwait(&d->zc_cond, &d->zc_lock, &until) == ETIMEDOUT)
			waited++;
	}
	if (d->zc_outstanding > 0)
		log_msg(LOG_LVL_ERROR,
			"stream: gRPC still holds %lld parameter slices after 30 s",
			(long long)d->zc_outstanding);
	pthread_mutex_unlock(&d->zc_lock);
}
