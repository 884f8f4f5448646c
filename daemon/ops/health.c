/* health.c — grpc.health.v1.Health/Watch: a server stream that sends the
 * serving status at once and again when it changes (SERVING ->
 * NOT_SERVING when the daemon starts draining), ended with UNAVAILABLE
 * when the server goes away; Check answers the same status once.
 *
 * A new watcher sends its first message on the poller thread, then joins
 * h->watches (under h->lock, never held while sending). Once the daemon
 * stops serving no watcher joins any more: the main thread takes the list over,
 * sends NOT_SERVING (waiting for a first message still in flight: a poller
 * completes it, and no poller ever waits for the main thread) and at exit
 * ends the streams. A watcher whose client left (gRPC's RECV_CLOSE_ON_SERVER
 * completed cancelled: rpc_call_cancelled) is answered and freed by the
 * main thread's next tick (health_reap) or the next Watch, whichever comes
 * first, so that it does not stay open until shutdown.
 */
#include "health.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "grpc/health/v1/health.pb-c.h"

struct health_watch {
	struct health_watch *next;
	struct rpc_call *call;
	struct metrics *metrics;
	const struct method *m;
	bool unknown_service;
	int last_sent;          /* serving status last sent, -1: none */
	char identity[AUTH_NAME_MAX + 300];
};

void health_init(struct health *h, bool (*serving)(void *ctx), void *ctx)
{
	h->serving = serving;
	h->ctx = ctx;
	pthread_mutex_init(&h->lock, NULL);
	h->watches = h->draining = NULL;
}

void health_fini(struct health *h)
{
	pthread_mutex_destroy(&h->lock);
}

static bool known_service(const char *service)
{
	return !service[0] || !strcmp(service, HEALTH_SERVICE);
}

static int serving_status(struct health *h)
{
	return h->serving(h->ctx) ?
	       GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING :
	       GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
}

int health_check(struct health *h, struct job *j, struct eng_error *err)
{
	const Grpc__Health__V1__HealthCheckRequest *q = (const void *)j->req;
	Grpc__Health__V1__HealthCheckResponse resp = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;

	if (!known_service(q->service))
		return eng_fail(err, -ENOENT, "service: unknown '%s'", q->service);
	resp.status = serving_status(h);
	return job_set_reply(j, &resp.base);
}

static int current_status(struct health *h, const struct health_watch *w)
{
	if (w->unknown_service)
		return GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN;
	return serving_status(h);
}

/* Send the status if it changed. wait: first let a message in flight go
 * out (main thread only; a poller must never wait). */
static void send_status(struct health *h, struct health_watch *w, bool wait)
{
	Grpc__Health__V1__HealthCheckResponse resp = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
	uint8_t buf[16];
	struct rpc_piece piece;
	int st = current_status(h, w);

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

static void end_watch(struct health_watch *w, enum rpc_code code, const char *msg)
{
	job_log_rpc(w->metrics, w->call, w->m, w->identity, code, msg);
	rpc_reply_status(w->call, code, msg);
	free(w);
}

/* h->lock held: unlink the watches whose client went away; returns them. */
static struct health_watch *take_gone_locked(struct health *h)
{
	struct health_watch **pp, *x, *gone = NULL;

	for (pp = &h->watches; (x = *pp) != NULL;) {
		if (rpc_call_cancelled(x->call)) {
			*pp = x->next;
			x->next = gone;
			gone = x;
		} else {
			pp = &x->next;
		}
	}
	return gone;
}

static void end_gone(struct health_watch *gone)
{
	struct health_watch *x;

	while (gone) {
		x = gone->next;
		end_watch(gone, RPC_CANCELLED, "client went away");
		gone = x;
	}
}

void health_reap(struct health *h)
{
	struct health_watch *gone;

	pthread_mutex_lock(&h->lock);
	gone = take_gone_locked(h);
	pthread_mutex_unlock(&h->lock);
	end_gone(gone);
}

int health_watch(struct health *h, struct job *j, struct eng_error *err)
{
	const Grpc__Health__V1__HealthCheckRequest *q = (const void *)j->req;
	struct health_watch *w = calloc(1, sizeof(*w)), *gone;

	(void)err;
	if (!w)
		return -ENOMEM;
	w->call = j->call;
	w->metrics = j->metrics;
	w->m = j->m;
	w->last_sent = -1;
	w->unknown_service = !known_service(q->service);
	memcpy(w->identity, j->identity, sizeof(w->identity));
	job_release(j);
	send_status(h, w, false);

	pthread_mutex_lock(&h->lock);
	gone = take_gone_locked(h);
	w->next = h->watches;
	h->watches = w;
	pthread_mutex_unlock(&h->lock);
	end_gone(gone);
	return 0;
}

void health_broadcast(struct health *h, bool at_exit)
{
	struct health_watch *w, *next, *taken;

	/* The daemon stopped serving: no watcher joins after this. */
	pthread_mutex_lock(&h->lock);
	taken = h->watches;
	h->watches = NULL;
	pthread_mutex_unlock(&h->lock);
	while (taken) {
		next = taken->next;
		taken->next = h->draining;
		h->draining = taken;
		taken = next;
	}
	for (w = h->draining; w; w = w->next)
		send_status(h, w, true);
	if (!at_exit)
		return;
	for (w = h->draining; w; w = next) {
		next = w->next;
		(void)rpc_stream_wait(w->call);
		end_watch(w, RPC_UNAVAILABLE, "server shutting down");
	}
	h->draining = NULL;
}
