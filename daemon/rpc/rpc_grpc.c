/* rpc_grpc.c — rpc.h on top of the gRPC C core (grpc/grpc.h).
 *
 * The only file of the daemon that calls grpc_*. Life of a call:
 *   accept slot (one request_registered_call posted per slot, re-armed on
 *   each new call) -> struct rpc_call with a refcount: one reference for
 *   the owner (released by rpc_reply*), one for the RECV_CLOSE_ON_SERVER
 *   batch posted at accept (completes when the call is over, tells whether
 *   it was cancelled), one per batch in flight. The last reference unrefs
 *   the grpc_call.
 * Every method is registered with GRPC_SRM_PAYLOAD_NONE: a new call brings
 * its metadata only, and the request is read by a RECV_MESSAGE batch that
 * the owner asks for (rpc_recv_next) once it has accepted the call. A
 * refused call is answered without its body being read: gRPC's flow
 * control stops the client after the stream's window.
 * Request bytes in flight: a unary or server-streaming call's message is
 * charged to srv->inflight_bytes when it has arrived (its size is known
 * only then) and refused at once, dropped, when the charge would pass
 * max_inflight_bytes; the charge ends when the owner hands the call back or
 * releases the request. Reserving max_recv_bytes before each receive would
 * bound the bytes gRPC buffers while messages arrive too, but would also
 * refuse every small call while two large ones are queued.
 * Several poller threads may see events of one call at once, and the
 * engine thread sends on streams: every field of a call is under its lock,
 * and start_batch is only called with that lock held.
 *
 * TLS: each TCP address gets its own credentials with a certificate-config
 * fetcher (gRPC calls it at every handshake); rpc_server_set_tls bumps a
 * generation and each listener's fetcher hands gRPC the new config once.
 * Established connections keep their session, so running calls go on.
 */
#include "rpc.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/string_util.h>
#include <grpc/support/time.h>

#include "grpc_bytes.h"
#include "log.h"

#define SLOTS_PER_METHOD 4
#define GENERIC_SLOTS 2
#define MAX_POLLERS 8
#define MAX_LISTEN 8
#define AUTHZ_MAX 4096  /* rpc.h: rpc_call_authorization */

enum tag_kind {
	TAG_ACCEPT,        /* obj: struct accept_slot (registered method) */
	TAG_ACCEPT_GENERIC,/* obj: struct accept_slot (any other method) */
	TAG_CLOSE,         /* obj: struct rpc_call */
	TAG_SEND,          /* obj: struct rpc_call, one stream message */
	TAG_RECV,          /* obj: struct rpc_call, one client message */
	TAG_FINISH,        /* obj: struct rpc_call, the status batch */
	TAG_SHUTDOWN,      /* obj: struct rpc_server */
};

struct tag {
	enum tag_kind kind;
	void *obj;
};

struct accept_slot {
	struct tag tag;
	struct rpc_server *srv;
	int method;                 /* -1: generic */
	grpc_call *call;
	gpr_timespec deadline;
	grpc_metadata_array md;
	grpc_call_details details;  /* generic only */
};

struct rpc_call {
	struct rpc_server *srv;
	grpc_call *call;
	int method;
	char *method_path;          /* malloc'ed */
	char *peer;                 /* gpr_malloc'ed */
	char *authz;                /* `authorization` header, malloc'ed or NULL */
	int n_authz;                /* `authorization` headers received */
	char *req_id;               /* `engined-request-id` header, malloc'ed or NULL */
	int n_req_id;               /* `engined-request-id` headers received */
	char *cert_ident;           /* verified client certificate CN or NULL */
	struct timespec t0;
	gpr_timespec deadline;      /* GPR_CLOCK_MONOTONIC; infinite: none */

	pthread_mutex_t lock;
	pthread_cond_t cond;
	int refs;
	int close_cancelled;        /* written by RECV_CLOSE_ON_SERVER */
	bool closed;
	bool initial_md_sent;
	bool send_pending;
	bool send_failed;
	bool finished;              /* status sent (owner gave the call back) */
	grpc_byte_buffer *send_bb;
	grpc_byte_buffer *reply_bb;
	grpc_slice status_details;
	bool has_status_details;
	/* client streaming */
	rpc_recv_fn recv_fn;
	void *recv_user;
	bool recv_wanted;           /* asked for, posted once no send is in flight */
	bool recv_pending;          /* RECV_MESSAGE batch in flight */
	grpc_byte_buffer *recv_bb;
	int64_t charged;            /* request bytes counted in srv->inflight_bytes */
	struct tag close_tag, send_tag, finish_tag, recv_tag;
};

struct tls_listener {
	struct rpc_server *srv;
	unsigned gen_seen;          /* tls_lock */
};

struct rpc_server {
	grpc_server *server;
	grpc_completion_queue *cq;
	const struct rpc_method_reg *methods;
	int n_methods;
	void **method_handles;
	rpc_on_call_fn on_call;
	void *ctx;
	int ports[MAX_LISTEN];
	int n_listen;
	int64_t default_deadline_ms;
	int64_t bytes_streamed;     /* atomic */
	int64_t inflight_bytes;     /* atomic: request bytes charged to calls */
	int64_t max_inflight_bytes; /* 0: no bound */
	int n_pollers;
	pthread_t pollers[MAX_POLLERS];

	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool shutting_down;
	bool shutdown_done;
	int live_calls;             /* rpc_call structs not yet freed */
	struct tag shutdown_tag;
	struct accept_slot *slots;  /* n_methods * SLOTS_PER_METHOD + GENERIC_SLOTS */
	int n_slots;

	/* TLS (tls_on: TCP addresses use it) */
	bool tls_on;
	pthread_mutex_t tls_lock;
	unsigned tls_gen;           /* tls_lock: bumped by each new config */
	char *tls_cert, *tls_key, *tls_ca;  /* tls_lock, malloc'ed */
	struct tls_listener listeners[MAX_LISTEN];
};

static const char *const code_names[] = {
	"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
	"NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
	"FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED",
	"INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
};

const char *rpc_code_name(enum rpc_code code)
{
	if ((int)code < 0 || (int)code > RPC_UNAUTHENTICATED)
		return "?";
	return code_names[code];
}

/* --- accepting ----------------------------------------------------------- */

static int slot_post(struct accept_slot *s)
{
	struct rpc_server *srv = s->srv;
	grpc_call_error e;

	s->tag.obj = s;
	s->call = NULL;
	grpc_metadata_array_init(&s->md);
	if (s->method >= 0) {
		/* No payload: methods are registered with GRPC_SRM_PAYLOAD_NONE. */
		s->tag.kind = TAG_ACCEPT;
		e = grpc_server_request_registered_call(srv->server,
				srv->method_handles[s->method], &s->call, &s->deadline,
				&s->md, NULL, srv->cq, srv->cq, &s->tag);
	} else {
		s->tag.kind = TAG_ACCEPT_GENERIC;
		grpc_call_details_init(&s->details);
		e = grpc_server_request_call(srv->server, &s->call, &s->details,
				&s->md, srv->cq, srv->cq, &s->tag);
	}
	if (e != GRPC_CALL_OK) {
		log_msg(LOG_LVL_ERROR, "rpc: cannot post an accept (grpc_call_error %d)", e);
		return -EIO;
	}
	return 0;
}

static void slot_reset(struct accept_slot *s)
{
	grpc_metadata_array_destroy(&s->md);
	if (s->method < 0)
		grpc_call_details_destroy(&s->details);
}

static void call_unref_locked_release(struct rpc_call *c);

/* Charge n request bytes to the server; false when that would pass the
 * bound (nothing charged then). */
static bool inflight_charge(struct rpc_server *srv, int64_t n)
{
	int64_t cur = __atomic_load_n(&srv->inflight_bytes, __ATOMIC_RELAXED);

	do {
		if (srv->max_inflight_bytes > 0 && cur + n > srv->max_inflight_bytes)
			return false;
	} while (!__atomic_compare_exchange_n(&srv->inflight_bytes, &cur, cur + n, true,
					      __ATOMIC_RELAXED, __ATOMIC_RELAXED));
	return true;
}

/* End the call's charge; with c->lock held (or the last reference). */
static void uncharge_locked(struct rpc_call *c)
{
	if (c->charged) {
		__atomic_sub_fetch(&c->srv->inflight_bytes, c->charged, __ATOMIC_RELAXED);
		c->charged = 0;
	}
}

static void call_free(struct rpc_call *c)
{
	struct rpc_server *srv = c->srv;

	uncharge_locked(c);
	grpc_call_unref(c->call);
	if (c->has_status_details)
		grpc_slice_unref(c->status_details);
	if (c->send_bb)
		grpc_byte_buffer_destroy(c->send_bb);
	if (c->reply_bb)
		grpc_byte_buffer_destroy(c->reply_bb);
	if (c->recv_bb)
		grpc_byte_buffer_destroy(c->recv_bb);
	gpr_free(c->peer);
	free(c->authz);
	free(c->req_id);
	free(c->cert_ident);
	free(c->method_path);
	pthread_cond_destroy(&c->cond);
	pthread_mutex_destroy(&c->lock);
	free(c);

	pthread_mutex_lock(&srv->lock);
	srv->live_calls--;
	pthread_cond_broadcast(&srv->cond);
	pthread_mutex_unlock(&srv->lock);
}

/* Drop one reference; called with c->lock held, returns with it released. */
static void call_unref_locked_release(struct rpc_call *c)
{
	bool last = --c->refs == 0;

	pthread_mutex_unlock(&c->lock);
	if (last)
		call_free(c);
}

/* The value of header `key` (bounded copy, kept only when the call carries
 * exactly one such header of at most `max` bytes and no NUL) and the number
 * of such headers (rpc.h: the owner refuses a call with more than one). */
static int take_header(const grpc_metadata_array *md, const char *key, size_t max,
		       char **ret, int *ret_count)
{
	const grpc_slice *val = NULL;
	size_t klen = strlen(key), n;

	for (size_t i = 0; i < md->count; i++) {
		const grpc_slice k = md->metadata[i].key;

		if (GRPC_SLICE_LENGTH(k) != klen ||
		    memcmp(GRPC_SLICE_START_PTR(k), key, klen) != 0)
			continue;
		if ((*ret_count)++ == 0)
			val = &md->metadata[i].value;
	}
	if (*ret_count != 1 || GRPC_SLICE_LENGTH(*val) > max)
		return 0;
	n = GRPC_SLICE_LENGTH(*val);
	*ret = strndup((const char *)GRPC_SLICE_START_PTR(*val), n);
	if (!*ret)
		return -ENOMEM;
	if (strlen(*ret) != n) {
		free(*ret);
		*ret = NULL;
	}
	return 0;
}

/* The `authorization` and `engined-request-id` headers and the deadline
 * of a new call. */
static int call_take_request_info(struct rpc_call *c, const grpc_metadata_array *md,
				  gpr_timespec deadline)
{
	if (take_header(md, "authorization", AUTHZ_MAX, &c->authz, &c->n_authz) < 0 ||
	    take_header(md, RPC_REQUEST_ID_HEADER, RPC_REQUEST_ID_MAX, &c->req_id,
			&c->n_req_id) < 0)
		return -ENOMEM;
	if (gpr_time_cmp(deadline, gpr_inf_future(deadline.clock_type)) != 0)
		c->deadline = gpr_convert_clock_type(deadline, GPR_CLOCK_MONOTONIC);
	else if (c->srv->default_deadline_ms > 0)
		c->deadline = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
				gpr_time_from_millis(c->srv->default_deadline_ms, GPR_TIMESPAN));
	return 0;
}

/* CN of a verified client certificate (mutual TLS), else NULL. */
static char *call_cert_identity(grpc_call *gc)
{
	grpc_auth_context *ctx = grpc_call_auth_context(gc);
	grpc_auth_property_iterator it;
	const grpc_auth_property *p;
	char *out = NULL;

	if (!ctx)
		return NULL;
	if (grpc_auth_context_peer_is_authenticated(ctx)) {
		it = grpc_auth_context_find_properties_by_name(ctx, GRPC_X509_CN_PROPERTY_NAME);
		p = grpc_auth_property_iterator_next(&it);
		if (p && p->value_length > 0 && p->value_length < 256)
			out = strndup(p->value, p->value_length);
	}
	grpc_auth_context_release(ctx);
	return out;
}

static struct rpc_call *call_new(struct rpc_server *srv, grpc_call *gc,
				 int method, const char *path, size_t path_len)
{
	struct rpc_call *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	c->deadline = gpr_inf_future(GPR_CLOCK_MONOTONIC);
	c->method_path = strndup(path, path_len);
	if (!c->method_path) {
		free(c);
		return NULL;
	}
	c->srv = srv;
	c->call = gc;
	c->method = method;
	c->peer = grpc_call_get_peer(gc);
	clock_gettime(CLOCK_MONOTONIC, &c->t0);
	pthread_mutex_init(&c->lock, NULL);
	pthread_cond_init(&c->cond, NULL);
	c->close_tag = (struct tag){ TAG_CLOSE, c };
	c->send_tag = (struct tag){ TAG_SEND, c };
	c->finish_tag = (struct tag){ TAG_FINISH, c };
	c->recv_tag = (struct tag){ TAG_RECV, c };
	if (srv->tls_on)
		c->cert_ident = call_cert_identity(gc);
	pthread_mutex_lock(&srv->lock);
	srv->live_calls++;
	pthread_mutex_unlock(&srv->lock);
	return c;
}

/* Post RECV_CLOSE_ON_SERVER (plus `extra` ops); holds one reference. */
static int call_post_close(struct rpc_call *c, grpc_op *extra, size_t n_extra)
{
	grpc_op ops[4];
	size_t n = 0;
	grpc_call_error e;

	memset(ops, 0, sizeof(ops));
	for (size_t i = 0; i < n_extra; i++)
		ops[n++] = extra[i];
	ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
	ops[n].data.recv_close_on_server.cancelled = &c->close_cancelled;
	n++;
	e = grpc_call_start_batch(c->call, ops, n, &c->close_tag, NULL);
	if (e != GRPC_CALL_OK) {
		log_msg(LOG_LVL_ERROR, "rpc: %s: start_batch(close) failed (%d)",
			c->method_path, e);
		return -EIO;
	}
	return 0;
}

static void on_accept(struct rpc_server *srv, struct accept_slot *s)
{
	const struct rpc_method_reg *m = &srv->methods[s->method];
	struct rpc_call *c;
	int r = 0;

	c = call_new(srv, s->call, s->method, m->path, strlen(m->path));
	if (c)
		r = call_take_request_info(c, &s->md, s->deadline);
	if (!c || r < 0) {
		grpc_call_cancel_with_status(s->call, GRPC_STATUS_RESOURCE_EXHAUSTED,
					     "out of memory accepting the call", NULL);
		if (c)
			call_free(c);
		else
			grpc_call_unref(s->call);
	}
	slot_reset(s);

	/* Re-arm before running the handler so that accepting never stalls. */
	pthread_mutex_lock(&srv->lock);
	if (!srv->shutting_down)
		(void)slot_post(s);
	pthread_mutex_unlock(&srv->lock);
	if (!c || r < 0)
		return;

	c->refs = 2;  /* owner + close batch */
	pthread_mutex_lock(&c->lock);
	if (call_post_close(c, NULL, 0) < 0)
		c->refs--;
	pthread_mutex_unlock(&c->lock);

	srv->on_call(srv->ctx, c, c->method);
}

/* A method nobody registered: the owner answers it (UNIMPLEMENTED, or
 * UNAUTHENTICATED to a caller without a valid token). */
static void on_accept_generic(struct rpc_server *srv, struct accept_slot *s)
{
	struct rpc_call *c;
	grpc_call *gc = s->call;
	const char *path = (const char *)GRPC_SLICE_START_PTR(s->details.method);
	size_t path_len = GRPC_SLICE_LENGTH(s->details.method);

	c = call_new(srv, gc, -1, path, path_len);
	if (c && call_take_request_info(c, &s->md, s->details.deadline) < 0) {
		grpc_call_cancel_with_status(gc, GRPC_STATUS_RESOURCE_EXHAUSTED,
					     "out of memory", NULL);
		call_free(c);  /* unrefs gc */
		slot_reset(s);
		pthread_mutex_lock(&srv->lock);
		if (!srv->shutting_down)
			(void)slot_post(s);
		pthread_mutex_unlock(&srv->lock);
		return;
	}
	slot_reset(s);
	pthread_mutex_lock(&srv->lock);
	if (!srv->shutting_down)
		(void)slot_post(s);
	pthread_mutex_unlock(&srv->lock);
	if (!c) {
		grpc_call_cancel_with_status(gc, GRPC_STATUS_RESOURCE_EXHAUSTED,
					     "out of memory", NULL);
		grpc_call_unref(gc);
		return;
	}
	c->refs = 2;  /* owner + close batch */
	pthread_mutex_lock(&c->lock);
	if (call_post_close(c, NULL, 0) < 0)
		c->refs--;
	pthread_mutex_unlock(&c->lock);
	srv->on_call(srv->ctx, c, -1);
}

/* Post RECV_MESSAGE; called with c->lock held. Returns false when the
 * batch could not be started (the caller then delivers the end). */
static bool post_recv_locked(struct rpc_call *c)
{
	grpc_op op;

	c->recv_wanted = false;
	if (c->closed)
		return false;
	memset(&op, 0, sizeof(op));
	op.op = GRPC_OP_RECV_MESSAGE;
	op.data.recv_message.recv_message = &c->recv_bb;
	c->refs++;
	c->recv_pending = true;
	if (grpc_call_start_batch(c->call, &op, 1, &c->recv_tag, NULL) != GRPC_CALL_OK) {
		log_msg(LOG_LVL_ERROR, "rpc: %s: start_batch(recv) failed", c->method_path);
		c->refs--;
		c->recv_pending = false;
		return false;
	}
	return true;
}

/* No receive could be posted (the call is over): deliver that; takes its
 * own reference. */
static void deliver_gone_locked_release(struct rpc_call *c)
{
	rpc_recv_fn fn = c->recv_fn;
	void *user = c->recv_user;

	c->refs++;
	pthread_mutex_unlock(&c->lock);
	fn(user, c, RPC_RECV_GONE, NULL, 0);
	pthread_mutex_lock(&c->lock);
	call_unref_locked_release(c);
}

static void on_recv(struct rpc_call *c, bool success)
{
	grpc_byte_buffer *bb;
	rpc_recv_fn fn;
	void *user;
	uint8_t *buf = NULL;
	size_t len = 0;
	enum rpc_recv_result res;
	bool charge = c->method >= 0 && !c->srv->methods[c->method].client_streaming;

	pthread_mutex_lock(&c->lock);
	c->recv_pending = false;
	bb = c->recv_bb;
	c->recv_bb = NULL;
	fn = c->recv_fn;
	user = c->recv_user;
	res = bb ? RPC_RECV_MESSAGE : success && !c->closed ? RPC_RECV_END : RPC_RECV_GONE;
	pthread_mutex_unlock(&c->lock);
	/* The batch's reference keeps c alive through the callback. */
	if (bb) {
		len = grpc_byte_buffer_length(bb);
		if (charge && !inflight_charge(c->srv, (int64_t)len)) {
			res = RPC_RECV_OVER_BOUND;
		} else {
			if (grpc_bytes_flatten(bb, &buf, &len) < 0)
				res = RPC_RECV_NO_MEMORY;
			if (charge) {
				pthread_mutex_lock(&c->lock);
				c->charged += (int64_t)grpc_byte_buffer_length(bb);
				if (res != RPC_RECV_MESSAGE)
					uncharge_locked(c);
				pthread_mutex_unlock(&c->lock);
			}
		}
		/* Dropped at once, also when refused: only the copy lives on. */
		grpc_byte_buffer_destroy(bb);
	}
	fn(user, c, res, res == RPC_RECV_MESSAGE ? buf : NULL,
	   res == RPC_RECV_MESSAGE || res == RPC_RECV_OVER_BOUND ? len : 0);
	free(buf);
	pthread_mutex_lock(&c->lock);
	call_unref_locked_release(c);
}

int rpc_recv_next(struct rpc_call *c, rpc_recv_fn fn, void *user)
{
	pthread_mutex_lock(&c->lock);
	if (c->recv_pending || c->recv_wanted) {
		pthread_mutex_unlock(&c->lock);
		return -EBUSY;
	}
	c->recv_fn = fn;
	c->recv_user = user;
	if (c->send_pending && !c->closed) {
		c->recv_wanted = true;  /* posted by the send's completion */
		pthread_mutex_unlock(&c->lock);
		return 0;
	}
	if (!post_recv_locked(c)) {
		deliver_gone_locked_release(c);
		return 0;
	}
	pthread_mutex_unlock(&c->lock);
	return 0;
}

/* --- pollers ------------------------------------------------------------- */

static void handle_event(struct rpc_server *srv, grpc_event ev)
{
	struct tag *t = ev.tag;
	struct accept_slot *s;
	struct rpc_call *c;

	switch (t->kind) {
	case TAG_ACCEPT:
	case TAG_ACCEPT_GENERIC:
		s = t->obj;
		if (!ev.success) {
			/* Shutdown: the slot is not re-armed. */
			slot_reset(s);
			return;
		}
		if (t->kind == TAG_ACCEPT)
			on_accept(srv, s);
		else
			on_accept_generic(srv, s);
		return;
	case TAG_CLOSE:
		c = t->obj;
		pthread_mutex_lock(&c->lock);
		c->closed = true;
		pthread_cond_broadcast(&c->cond);
		call_unref_locked_release(c);
		return;
	case TAG_SEND:
		c = t->obj;
		pthread_mutex_lock(&c->lock);
		c->send_pending = false;
		if (!ev.success)
			c->send_failed = true;
		if (c->send_bb) {
			/* Drops our hold on the slices; each piece's release runs
			 * once gRPC has let go too. */
			grpc_byte_buffer_destroy(c->send_bb);
			c->send_bb = NULL;
		}
		pthread_cond_broadcast(&c->cond);
		if (c->recv_wanted && !post_recv_locked(c)) {
			deliver_gone_locked_release(c);
			pthread_mutex_lock(&c->lock);
		}
		call_unref_locked_release(c);
		return;
	case TAG_RECV:
		on_recv(t->obj, ev.success);
		return;
	case TAG_FINISH:
		c = t->obj;
		pthread_mutex_lock(&c->lock);
		if (c->reply_bb) {
			grpc_byte_buffer_destroy(c->reply_bb);
			c->reply_bb = NULL;
		}
		call_unref_locked_release(c);
		return;
	case TAG_SHUTDOWN:
		pthread_mutex_lock(&srv->lock);
		srv->shutdown_done = true;
		pthread_cond_broadcast(&srv->cond);
		pthread_mutex_unlock(&srv->lock);
		return;
	}
}

static void *poller_main(void *arg)
{
	struct rpc_server *srv = arg;

	for (;;) {
		grpc_event ev = grpc_completion_queue_next(srv->cq,
				gpr_inf_future(GPR_CLOCK_REALTIME), NULL);

		if (ev.type == GRPC_QUEUE_SHUTDOWN)
			break;
		if (ev.type == GRPC_OP_COMPLETE)
			handle_event(srv, ev);
	}
	return NULL;
}

/* --- TLS ----------------------------------------------------------------- */

static grpc_ssl_certificate_config_reload_status fetch_tls_config(
		void *user, grpc_ssl_server_certificate_config **config)
{
	struct tls_listener *l = user;
	struct rpc_server *srv = l->srv;
	grpc_ssl_pem_key_cert_pair pair;
	grpc_ssl_certificate_config_reload_status st = GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_UNCHANGED;

	pthread_mutex_lock(&srv->tls_lock);
	if (l->gen_seen != srv->tls_gen) {
		pair.private_key = srv->tls_key;
		pair.cert_chain = srv->tls_cert;
		/* Copies the strings; gRPC owns the config from here. gRPC 1.51
		 * asserts non-NULL roots on this path even when no client
		 * certificate is requested: the server's own chain stands in
		 * (unused: the credentials never ask for a client certificate). */
		*config = grpc_ssl_server_certificate_config_create(
				srv->tls_ca ? srv->tls_ca : srv->tls_cert, &pair, 1);
		if (*config) {
			l->gen_seen = srv->tls_gen;
			st = GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_NEW;
		} else {
			st = GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_FAIL;
		}
	}
	pthread_mutex_unlock(&srv->tls_lock);
	return st;
}

static void wipe_free(char *s)
{
	if (s) {
		explicit_bzero(s, strlen(s));
		free(s);
	}
}

int rpc_server_set_tls(struct rpc_server *s, const char *cert, const char *key,
		       const char *client_ca)
{
	char *c2, *k2, *ca2 = NULL;

	if (!s->tls_on || !cert || !key)
		return -EINVAL;
	c2 = strdup(cert);
	k2 = strdup(key);
	if (client_ca)
		ca2 = strdup(client_ca);
	if (!c2 || !k2 || (client_ca && !ca2)) {
		free(c2);
		wipe_free(k2);
		free(ca2);
		return -ENOMEM;
	}
	pthread_mutex_lock(&s->tls_lock);
	free(s->tls_cert);
	wipe_free(s->tls_key);
	free(s->tls_ca);
	s->tls_cert = c2;
	s->tls_key = k2;
	s->tls_ca = ca2;
	s->tls_gen++;
	pthread_mutex_unlock(&s->tls_lock);
	return 0;
}

static grpc_server_credentials *tls_creds(struct rpc_server *srv, int listener,
					  const struct rpc_server_config *cfg)
{
	grpc_ssl_client_certificate_request_type req = GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE;
	grpc_ssl_server_credentials_options *o;
	struct tls_listener *l = &srv->listeners[listener];

	if (cfg->tls_client_ca)
		req = cfg->tls_require_client_cert ?
		      GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY :
		      GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY;
	l->srv = srv;
	l->gen_seen = 0;
	o = grpc_ssl_server_credentials_create_options_using_config_fetcher(req,
			fetch_tls_config, l);
	if (!o)
		return NULL;
	return grpc_ssl_server_credentials_create_with_options(o);
}

static bool addr_is_unix(const char *a)
{
	return strncmp(a, "unix:", 5) == 0 || strncmp(a, "unix-abstract:", 14) == 0;
}

/* --- server -------------------------------------------------------------- */

/* Free what rpc_server_start allocated and initialized for `s` itself, and
 * `s`: the one teardown of the struct, after the gRPC server and queue (if
 * any) are gone. */
static void server_free(struct rpc_server *s)
{
	free(s->slots);
	free(s->method_handles);
	free(s->tls_cert);
	wipe_free(s->tls_key);
	free(s->tls_ca);
	pthread_cond_destroy(&s->cond);
	pthread_mutex_destroy(&s->lock);
	pthread_mutex_destroy(&s->tls_lock);
	free(s);
}

int rpc_server_start(const struct rpc_server_config *cfg,
		     const struct rpc_method_reg *methods, int n_methods,
		     rpc_on_call_fn on_call, void *ctx,
		     struct rpc_server **ret, char *errbuf, size_t errlen)
{
	struct rpc_server *srv;
	grpc_server_credentials *creds;
	grpc_arg args[6];
	grpc_channel_args ca;
	int n_args = 0, i, k;

	srv = calloc(1, sizeof(*srv));
	if (!srv)
		return -ENOMEM;
	pthread_mutex_init(&srv->tls_lock, NULL);
	pthread_mutex_init(&srv->lock, NULL);
	pthread_cond_init(&srv->cond, NULL);
	if (cfg->n_listen < 1 || cfg->n_listen > MAX_LISTEN) {
		server_free(srv);
		snprintf(errbuf, errlen, "between 1 and %d listen addresses", MAX_LISTEN);
		return -EINVAL;
	}
	srv->methods = methods;
	srv->n_methods = n_methods;
	srv->n_listen = cfg->n_listen;
	srv->default_deadline_ms = cfg->default_deadline_ms;
	srv->max_inflight_bytes = cfg->max_inflight_recv_bytes;
	if (cfg->tls_cert && cfg->tls_key) {
		srv->tls_on = true;
		if (rpc_server_set_tls(srv, cfg->tls_cert, cfg->tls_key,
				       cfg->tls_client_ca) < 0) {
			server_free(srv);
			return -ENOMEM;
		}
	}
	srv->on_call = on_call;
	srv->ctx = ctx;
	srv->n_pollers = cfg->pollers < 1 ? 1 :
			 cfg->pollers > MAX_POLLERS ? MAX_POLLERS : cfg->pollers;
	srv->n_slots = n_methods * SLOTS_PER_METHOD + GENERIC_SLOTS;
	srv->slots = calloc((size_t)srv->n_slots, sizeof(*srv->slots));
	srv->method_handles = calloc((size_t)n_methods, sizeof(void *));
	if (!srv->slots || !srv->method_handles) {
		server_free(srv);
		return -ENOMEM;
	}
	srv->shutdown_tag = (struct tag){ TAG_SHUTDOWN, srv };

	grpc_init();

	memset(args, 0, sizeof(args));
	args[n_args].type = GRPC_ARG_INTEGER;
	args[n_args].key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
	args[n_args++].value.integer = (int)cfg->max_recv_bytes;
	args[n_args].type = GRPC_ARG_INTEGER;
	args[n_args].key = (char *)GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
	args[n_args++].value.integer = (int)cfg->max_send_bytes;
	args[n_args].type = GRPC_ARG_INTEGER;
	args[n_args].key = (char *)GRPC_ARG_MAX_CONCURRENT_STREAMS;
	args[n_args++].value.integer = cfg->max_concurrent_streams > 0 ?
				       cfg->max_concurrent_streams : 64;
	args[n_args].type = GRPC_ARG_INTEGER;
	args[n_args].key = (char *)GRPC_ARG_KEEPALIVE_TIME_MS;
	args[n_args++].value.integer = 60 * 1000;
	args[n_args].type = GRPC_ARG_INTEGER;
	args[n_args].key = (char *)GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS;
	args[n_args++].value.integer = 10 * 1000;
	ca.num_args = (size_t)n_args;
	ca.args = args;

	srv->server = grpc_server_create(&ca, NULL);
	srv->cq = grpc_completion_queue_create_for_next(NULL);
	grpc_server_register_completion_queue(srv->server, srv->cq, NULL);
	for (i = 0; i < n_methods; i++) {
		srv->method_handles[i] = grpc_server_register_method(srv->server,
				methods[i].path, NULL, GRPC_SRM_PAYLOAD_NONE, 0);
		if (!srv->method_handles[i]) {
			snprintf(errbuf, errlen, "cannot register method %s",
				 methods[i].path);
			goto fail;
		}
	}
	for (i = 0; i < cfg->n_listen; i++) {
		const char *a = cfg->listen[i];
		bool unix_sock = addr_is_unix(a);

		creds = srv->tls_on && !unix_sock ? tls_creds(srv, i, cfg) :
			grpc_insecure_server_credentials_create();
		if (!creds) {
			snprintf(errbuf, errlen, "cannot create the TLS credentials for %s", a);
			goto fail;
		}
		srv->ports[i] = grpc_server_add_http2_port(srv->server, a, creds);
		grpc_server_credentials_release(creds);
		if (srv->ports[i] == 0) {
			snprintf(errbuf, errlen, "cannot listen on %s%s", a,
				 srv->tls_on && !unix_sock ?
				 " (or the TLS certificate/key were refused)" : "");
			goto fail;
		}
		if (unix_sock)
			srv->ports[i] = 0;
	}
	grpc_server_start(srv->server);

	k = 0;
	for (i = 0; i < n_methods; i++) {
		for (int j = 0; j < SLOTS_PER_METHOD; j++, k++) {
			srv->slots[k].srv = srv;
			srv->slots[k].method = i;
			if (slot_post(&srv->slots[k]) < 0)
				goto fail_started;
		}
	}
	for (int j = 0; j < GENERIC_SLOTS; j++, k++) {
		srv->slots[k].srv = srv;
		srv->slots[k].method = -1;
		if (slot_post(&srv->slots[k]) < 0)
			goto fail_started;
	}
	for (i = 0; i < srv->n_pollers; i++) {
		if (pthread_create(&srv->pollers[i], NULL, poller_main, srv) != 0) {
			srv->n_pollers = i;
			snprintf(errbuf, errlen, "cannot start poller threads");
			rpc_server_shutdown(srv);
			rpc_server_destroy(srv, 0);
			return -EAGAIN;
		}
	}
	*ret = srv;
	return 0;

fail_started:
	snprintf(errbuf, errlen, "cannot post accepts");
	srv->n_pollers = 0;
	/* No poller runs yet: start one so that shutdown can drain. */
	if (pthread_create(&srv->pollers[0], NULL, poller_main, srv) == 0)
		srv->n_pollers = 1;
	rpc_server_shutdown(srv);
	rpc_server_destroy(srv, 0);
	return -EIO;
fail:
	grpc_server_shutdown_and_notify(srv->server, srv->cq, &srv->shutdown_tag);
	grpc_server_cancel_all_calls(srv->server);
	grpc_completion_queue_shutdown(srv->cq);
	while (grpc_completion_queue_next(srv->cq, gpr_inf_future(GPR_CLOCK_REALTIME),
					  NULL).type != GRPC_QUEUE_SHUTDOWN)
		;
	grpc_server_destroy(srv->server);
	grpc_completion_queue_destroy(srv->cq);
	grpc_shutdown();
	server_free(srv);
	return -EADDRINUSE;
}

int rpc_server_port_of(const struct rpc_server *s, int i)
{
	return i >= 0 && i < s->n_listen ? s->ports[i] : 0;
}

int rpc_server_port(const struct rpc_server *s)
{
	for (int i = 0; i < s->n_listen; i++)
		if (s->ports[i] > 0)
			return s->ports[i];
	return 0;
}

int64_t rpc_server_bytes_streamed(const struct rpc_server *s)
{
	return __atomic_load_n(&s->bytes_streamed, __ATOMIC_RELAXED);
}

int64_t rpc_server_inflight_bytes(const struct rpc_server *s)
{
	return __atomic_load_n(&s->inflight_bytes, __ATOMIC_RELAXED);
}

void rpc_server_shutdown(struct rpc_server *s)
{
	pthread_mutex_lock(&s->lock);
	if (s->shutting_down) {
		pthread_mutex_unlock(&s->lock);
		return;
	}
	s->shutting_down = true;
	pthread_mutex_unlock(&s->lock);
	grpc_server_shutdown_and_notify(s->server, s->cq, &s->shutdown_tag);
}

/* Wait until shutdown is notified and no call is alive, up to ms (< 0: for
 * ever). Called with s->lock held. Returns true when done. */
static bool wait_idle_locked(struct rpc_server *s, int ms)
{
	struct timespec until;

	clock_gettime(CLOCK_REALTIME, &until);
	if (ms >= 0) {
		until.tv_sec += ms / 1000;
		until.tv_nsec += (long)(ms % 1000) * 1000000L;
		if (until.tv_nsec >= 1000000000L) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000L;
		}
	}
	while (!(s->shutdown_done && s->live_calls == 0)) {
		if (ms < 0) {
			pthread_cond_wait(&s->cond, &s->lock);
		} else if (pthread_cond_timedwait(&s->cond, &s->lock, &until) == ETIMEDOUT) {
			return s->shutdown_done && s->live_calls == 0;
		}
	}
	return true;
}

void rpc_server_destroy(struct rpc_server *s, int grace_ms)
{
	if (!s)
		return;
	rpc_server_shutdown(s);
	pthread_mutex_lock(&s->lock);
	if (!wait_idle_locked(s, grace_ms)) {
		pthread_mutex_unlock(&s->lock);
		log_msg(LOG_LVL_WARN, "rpc: cancelling calls still running after %d ms",
			grace_ms);
		grpc_server_cancel_all_calls(s->server);
		pthread_mutex_lock(&s->lock);
		(void)wait_idle_locked(s, 10000);
	}
	pthread_mutex_unlock(&s->lock);
	grpc_completion_queue_shutdown(s->cq);
	for (int i = 0; i < s->n_pollers; i++)
		pthread_join(s->pollers[i], NULL);
	grpc_server_destroy(s->server);
	grpc_completion_queue_destroy(s->cq);
	grpc_shutdown();
	server_free(s);
}

/* --- replies ------------------------------------------------------------- */

static void finish_batch_locked(struct rpc_call *c, grpc_byte_buffer *bb,
				enum rpc_code code, const char *msg)
{
	grpc_op ops[3];
	size_t n = 0;
	grpc_call_error e;

	if (c->finished) {
		/* A second reply is a bug of the caller; keep the call sane. */
		log_msg(LOG_LVL_ERROR, "rpc: %s replied twice", c->method_path);
		if (bb)
			grpc_byte_buffer_destroy(bb);
		pthread_mutex_unlock(&c->lock);
		return;
	}
	c->finished = true;
	uncharge_locked(c);
	if (c->closed || (c->send_pending && c->send_failed) ||
	    (c->send_pending && c->closed)) {
		/* The call is over: nothing can be sent; drop the owner ref. */
		if (bb)
			grpc_byte_buffer_destroy(bb);
		call_unref_locked_release(c);
		return;
	}
	memset(ops, 0, sizeof(ops));
	if (!c->initial_md_sent) {
		ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
		c->initial_md_sent = true;
	}
	if (bb) {
		ops[n].op = GRPC_OP_SEND_MESSAGE;
		ops[n++].data.send_message.send_message = bb;
		c->reply_bb = bb;
	}
	c->status_details = grpc_slice_from_copied_string(msg ? msg : "");
	c->has_status_details = true;
	ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
	ops[n].data.send_status_from_server.status = (grpc_status_code)code;
	ops[n++].data.send_status_from_server.status_details = &c->status_details;
	/* The owner's reference now belongs to the batch. */
	e = grpc_call_start_batch(c->call, ops, n, &c->finish_tag, NULL);
	if (e != GRPC_CALL_OK) {
		log_msg(LOG_LVL_ERROR, "rpc: %s: start_batch(status) failed (%d)",
			c->method_path, e);
		grpc_call_cancel_with_status(c->call, GRPC_STATUS_INTERNAL,
					     "cannot send the reply", NULL);
		call_unref_locked_release(c);
		return;
	}
	pthread_mutex_unlock(&c->lock);
}

void rpc_reply(struct rpc_call *c, const void *msg, size_t len)
{
	grpc_slice s = grpc_slice_from_copied_buffer(msg, len);
	grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);

	grpc_slice_unref(s);
	pthread_mutex_lock(&c->lock);
	finish_batch_locked(c, bb, RPC_OK, NULL);
}

void rpc_reply_status(struct rpc_call *c, enum rpc_code code, const char *msg)
{
	pthread_mutex_lock(&c->lock);
	finish_batch_locked(c, NULL, code, msg);
}

/* --- streaming ----------------------------------------------------------- */

static void release_pieces(const struct rpc_piece *p, int n)
{
	for (int i = 0; i < n; i++)
		if (p[i].release)
			p[i].release(p[i].user);
}

int rpc_stream_send(struct rpc_call *c, const struct rpc_piece *pieces, int n)
{
	grpc_slice stack_slices[64], *slices = stack_slices;
	grpc_byte_buffer *bb;
	grpc_op ops[2];
	size_t nops = 0;
	int ns = 0;
	grpc_call_error e;

	if (n > 64) {
		slices = malloc((size_t)n * sizeof(*slices));
		if (!slices) {
			release_pieces(pieces, n);
			return -ENOMEM;
		}
	}
	pthread_mutex_lock(&c->lock);
	if (c->closed || c->send_failed || c->finished || c->send_pending) {
		int r = c->send_pending && !c->closed ? -EBUSY : -ECANCELED;

		pthread_mutex_unlock(&c->lock);
		release_pieces(pieces, n);
		if (slices != stack_slices)
			free(slices);
		return r;
	}
	for (int i = 0; i < n; i++) {
		if (pieces[i].len == 0) {
			if (pieces[i].release)
				pieces[i].release(pieces[i].user);
			continue;
		}
		if (pieces[i].release)
			slices[ns++] = grpc_slice_new_with_user_data(
					(void *)pieces[i].data, pieces[i].len,
					pieces[i].release, pieces[i].user);
		else
			slices[ns++] = grpc_slice_from_copied_buffer(pieces[i].data,
								     pieces[i].len);
	}
	bb = grpc_raw_byte_buffer_create(slices, (size_t)ns);
	for (int i = 0; i < ns; i++) {
		__atomic_add_fetch(&c->srv->bytes_streamed, (int64_t)GRPC_SLICE_LENGTH(slices[i]),
				   __ATOMIC_RELAXED);
		grpc_slice_unref(slices[i]);
	}
	if (slices != stack_slices)
		free(slices);

	memset(ops, 0, sizeof(ops));
	if (!c->initial_md_sent) {
		ops[nops++].op = GRPC_OP_SEND_INITIAL_METADATA;
		c->initial_md_sent = true;
	}
	ops[nops].op = GRPC_OP_SEND_MESSAGE;
	ops[nops++].data.send_message.send_message = bb;
	c->send_bb = bb;
	c->send_pending = true;
	c->refs++;
	e = grpc_call_start_batch(c->call, ops, nops, &c->send_tag, NULL);
	if (e != GRPC_CALL_OK) {
		/* After a failed start_batch the call stays broken: cancel it. */
		log_msg(LOG_LVL_ERROR, "rpc: %s: start_batch(send) failed (%d)",
			c->method_path, e);
		c->send_pending = false;
		c->send_failed = true;
		c->send_bb = NULL;
		c->refs--;
		grpc_call_cancel_with_status(c->call, GRPC_STATUS_INTERNAL,
					     "stream send failed", NULL);
		pthread_mutex_unlock(&c->lock);
		grpc_byte_buffer_destroy(bb);
		return -ECANCELED;
	}
	pthread_mutex_unlock(&c->lock);
	return 0;
}

int rpc_stream_wait(struct rpc_call *c)
{
	int r;

	pthread_mutex_lock(&c->lock);
	while (c->send_pending && !c->closed)
		pthread_cond_wait(&c->cond, &c->lock);
	r = (c->send_pending || c->send_failed || (c->closed && c->close_cancelled)) ?
	    -ECANCELED : 0;
	pthread_mutex_unlock(&c->lock);
	return r;
}

bool rpc_call_cancelled(struct rpc_call *c)
{
	bool r;

	pthread_mutex_lock(&c->lock);
	r = (c->closed && c->close_cancelled) || c->send_failed;
	pthread_mutex_unlock(&c->lock);
	return r;
}

const char *rpc_call_peer(const struct rpc_call *c)
{
	return c->peer ? c->peer : "?";
}

const char *rpc_call_method(const struct rpc_call *c)
{
	return c->method_path;
}

const char *rpc_call_authorization(const struct rpc_call *c)
{
	return c->authz;
}

int rpc_call_authorization_count(const struct rpc_call *c)
{
	return c->n_authz;
}

const char *rpc_call_request_id(const struct rpc_call *c)
{
	return c->req_id;
}

int rpc_call_request_id_count(const struct rpc_call *c)
{
	return c->n_req_id;
}

void rpc_call_release_request(struct rpc_call *c)
{
	pthread_mutex_lock(&c->lock);
	uncharge_locked(c);
	pthread_mutex_unlock(&c->lock);
}

int64_t rpc_call_inflight_bytes(const struct rpc_call *c)
{
	return rpc_server_inflight_bytes(c->srv);
}

const char *rpc_call_cert_identity(const struct rpc_call *c)
{
	return c->cert_ident;
}

bool rpc_call_expired(const struct rpc_call *c)
{
	return gpr_time_cmp(gpr_now(GPR_CLOCK_MONOTONIC), c->deadline) >= 0;
}

double rpc_call_elapsed(const struct rpc_call *c)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return (double)(now.tv_sec - c->t0.tv_sec) +
	       (double)(now.tv_nsec - c->t0.tv_nsec) * 1e-9;
}
