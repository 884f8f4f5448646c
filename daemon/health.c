/* health.c — grpc.health.v1.Health/Watch: a server stream that sends the
 * serving status at once and again when it changes (SERVING ->
 * NOT_SERVING when the daemon starts draining), ended with UNAVAILABLE
 * when the server goes away. Check is in handlers.c.
 *
 * A new watcher sends its first message on the poller thread, then joins
 * d->watches (under d->lock, never held while sending). Once `stopping` is
 * set no watcher joins any more: the main thread takes the list over,
 * sends NOT_SERVING (waiting for a first message still in flight: a poller
 * completes it, and no poller ever waits for the main thread) and at exit
 * ends the streams. A watcher whose client left is answered and freed by
 * the next Watch, so that clients coming and going cannot grow the list.
 */
#include "daemon.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "grpc/health/v1/health.pb-c.h"
#include "log.h"

struct health_watch {
	struct health_watch *next;
	struct rpc_call *call;
	int method_idx;
	bool unknown_service;
	int last_sent;          /* serving status last sent, -1: none */
	char identity[AUTH_NAME_MAX + 300];
};

static int current_status(struct daemon *d, const struct health_watch *w)
{
	bool stopping;

	if (w->unknown_service)
		return GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN;
	pthread_mutex_lock(&d->lock);
	stopping = d->stopping || d->engine_failed;
	pthread_mutex_unlock(&d->lock);
	return stopping ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING :
			  GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
}

/* Send the status if it changed. wait: first let a message in flight go
 * out (main thread only; a poller must never wait). */
static void send_status(struct daemon *d, struct health_watch *w, bool wait)
{
	Grpc__Health__V1__HealthCheckResponse resp = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
	uint8_t buf[16];
	struct rpc_piece piece;
	int st = current_status(d, w);

	if (st == w->last_sent)
		return;
	if (wait && rpc_stream_wait(w->call) < 0)
		return;
	resp.status = st;
	piece.len = protobuf_c_message_pack(&resp.base, buf);
	piece.data = buf;
	piece.release = NULL;  /* copied */
	piece.user = NULL;
	if (rpc_stream_send(w->call, &piece, 1) == 0)
		w->last_sent = st;
}

static void end_watch(struct daemon *d, struct health_watch *w, enum rpc_code code,
		      const char *msg)
{
	daemon_log_rpc(d, w->call, w->method_idx, w->identity, code, msg);
	rpc_reply_status(w->call, code, msg);
	free(w);
}

int h_run_health_watch(struct daemon *d, struct job *j, struct eng_error *err)
{
	const Grpc__Health__V1__HealthCheckRequest *q = (const void *)j->req;
	struct health_watch *w = calloc(1, sizeof(*w)), **pp, *x, *gone = NULL;

	if (!w)
		return -ENOMEM;
	w->call = j->call;
	w->method_idx = (int)(j->m - daemon_methods);
	w->last_sent = -1;
	w->unknown_service = q->service[0] && strcmp(q->service, "engined.v1.TrainingEngine");
	memcpy(w->identity, j->identity, sizeof(w->identity));
	daemon_job_release(j);
	send_status(d, w, false);

	pthread_mutex_lock(&d->lock);
	for (pp = &d->watches; (x = *pp) != NULL;) {
		if (rpc_call_cancelled(x->call)) {
			*pp = x->next;
			x->next = gone;
			gone = x;
		} else {
			pp = &x->next;
		}
	}
	w->next = d->watches;
	d->watches = w;
	pthread_mutex_unlock(&d->lock);
	while (gone) {
		x = gone->next;
		end_watch(d, gone, RPC_CANCELLED, "client went away");
		gone = x;
	}
	return 0;
}

void health_watch_broadcast(struct daemon *d, bool at_exit)
{
	struct health_watch *w, *next, *taken;

	/* `stopping` is set: no watcher joins after this. */
	pthread_mutex_lock(&d->lock);
	taken = d->watches;
	d->watches = NULL;
	pthread_mutex_unlock(&d->lock);
	while (taken) {
		next = taken->next;
		taken->next = d->watches_draining;
		d->watches_draining = taken;
		taken = next;
	}
	for (w = d->watches_draining; w; w = w->next)
		send_status(d, w, true);
	if (!at_exit)
		return;
	for (w = d->watches_draining; w; w = next) {
		next = w->next;
		(void)rpc_stream_wait(w->call);
		end_watch(d, w, RPC_UNAVAILABLE, "server shutting down");
	}
	d->watches_draining = NULL;
}
