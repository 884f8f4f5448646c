/* dispatch.c — the dispatcher, the gate, the job queue and the engine
 * thread (the daemon's lifecycle, which starts and stops them, is
 * lifecycle.c's).
 *
 * Every RPC goes through dispatch_on_call(), with the call's metadata only:
 * authentication (bearer token, read-only vs full), the static gate
 * (shutting down -> UNAVAILABLE, a full queue); only then is the request
 * received (on_request: a refused caller's body is never read), decoded
 * (protobuf-c) and passed to the method's validate (a rejected request
 * never reaches the engine), then either an inline answer (GetStatus, Health: never
 * queued behind a long job), a handler that takes the call over (Health
 * Watch, reflection), or a FIFO job for the engine thread, which checks the
 * call's deadline and the state gate (initialized, mode) when the job comes
 * up, runs it and replies. The method table is methods.c's; engine error
 * codes become gRPC status codes and each RPC is logged once in job.c.
 */
#include "dispatch.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "handlers.h"
#include "job_run.h"
#include "log.h"
#include "methods.h"
#include "reflection.h"
#include "replay.h"
#include "sample_batch.h"
#include "test_hold.h"
#include "tls.h"
#include "wire_check.h"

/* Run one job. */
static void run_job(struct daemon *d, struct job *j)
{
	struct eng_error err;
	double t0 = eng_now_s();
	int r;

	eng_error_clear(&err);
	r = job_run_admit(d, j, &err);
	if (r == 0)
		r = j->m->run(d, j, &err);
	job_run_done(d, j, r, &err, eng_now_s() - t0, true);
}

/* Engine thread, stopping: the checkpoint of shutdown.save_on_stop. */
static void save_on_stop(struct daemon *d)
{
	struct eng_error err;
	struct engine_status st;
	size_t bytes = 0;
	double t0 = eng_now_s();
	int r;

	if (!d->cfg.save_on_stop)
		return;
	if (d->engine_failed) {
		log_msg(LOG_LVL_ERROR, "save_on_stop: skipped, the device failed (%s)",
			d->engine_failed);
		return;
	}
	if (!d->engine) {
		log_msg(LOG_LVL_INFO, "save_on_stop: engine not initialized, nothing to save");
		return;
	}
	eng_error_clear(&err);
	engine_status(d->engine, &st);
	pthread_mutex_lock(&d->lock);
	daemon_job_started_locked(d, "save_on_stop");
	pthread_mutex_unlock(&d->lock);
	r = daemon_save_checkpoint(d, d->engine, d->cfg.save_on_stop, st.step, 0, CKPT_ALL, &bytes, &err);
	pthread_mutex_lock(&d->lock);
	d->busy = false;
	d->current_job = NULL;
	pthread_mutex_unlock(&d->lock);
	if (r < 0) {
		log_msg(LOG_LVL_ERROR, "save_on_stop: checkpoint '%s' failed: %s",
			d->cfg.save_on_stop, err.msg[0] ? err.msg : eng_strerror(r));
		return;
	}
	metrics_checkpoint_saved(&d->metrics);
	log_msg(LOG_LVL_INFO, "save_on_stop: saved step %lld to '%s' (%zu bytes, %.2f s)",
		(long long)st.step, d->cfg.save_on_stop, bytes, eng_now_s() - t0);
}

static struct job *pop_locked(struct daemon *d)
{
	struct job *j = d->head;

	d->head = j->next;
	if (!d->head)
		d->tail = NULL;
	d->queued--;
	return j;
}

void *dispatch_engine_thread(void *arg)
{
	struct daemon *d = arg;
	struct job *j;
	bool streaming;

	for (;;) {
		pthread_mutex_lock(&d->lock);
		while (!d->head && !d->stopping && !d->samples)
			pthread_cond_wait(&d->cond, &d->lock);
		if (d->samples) {
			/* A batch of Sample calls runs: the next job joins it when it
			 * is a Sample of the same model, else it waits for the batch
			 * to drain (first come, first served). */
			j = d->head && !d->stopping && sample_joins(d, d->head) ? pop_locked(d) : NULL;
			pthread_mutex_unlock(&d->lock);
			if (j)
				sample_job(d, j);
			if (d->samples)
				sample_step(d);
			continue;
		}
		if (d->stopping) {
			pthread_mutex_unlock(&d->lock);
			break;
		}
		j = pop_locked(d);
		daemon_job_started_locked(d, method_label(j->m));
		pthread_mutex_unlock(&d->lock);

		streaming = j->m->server_streaming;
		if (sample_batched(j)) {
			sample_job(d, j);    /* starts a batch */
			continue;
		}
		run_job(d, j);
		/* gRPC may still be writing zero-copy slices of the parameters
		 * after the last send completed: nothing may change them before
		 * it lets go. */
		if (streaming)
			daemon_wait_engine_mem(d);
	}

	/* Stopping: whatever is still queued is refused. */
	pthread_mutex_lock(&d->lock);
	j = d->head;
	d->head = d->tail = NULL;
	d->queued = 0;
	pthread_mutex_unlock(&d->lock);
	while (j) {
		struct job *next = j->next;
		struct eng_error err;

		eng_error_clear(&err);
		eng_fail(&err, -ESHUTDOWN, "daemon is shutting down");
		job_finish(j, -ESHUTDOWN, &err);
		pthread_mutex_lock(&d->lock);
		d->in_flight--;
		pthread_mutex_unlock(&d->lock);
		j = next;
	}
	/* Parameters are read below and may be freed: let gRPC drop
	 * zero-copy slices first. */
	daemon_wait_engine_mem(d);
	save_on_stop(d);
	adapters_clear(&d->adapters);  /* each adapter before its base */
	engine_destroy(d->engine);
	d->engine = NULL;
	pthread_mutex_lock(&d->lock);
	d->engine_done = true;
	pthread_cond_broadcast(&d->cond);
	pthread_mutex_unlock(&d->lock);
	return NULL;
}

/* Who the caller is, for the log: the token's name, the certificate's CN. */
static void set_identity(struct job *j, const char *token_name, const char *cert)
{
	if (token_name[0] && cert)
		snprintf(j->identity, sizeof(j->identity), "token:%s,cert:%s", token_name, cert);
	else if (token_name[0])
		snprintf(j->identity, sizeof(j->identity), "token:%s", token_name);
	else if (cert)
		snprintf(j->identity, sizeof(j->identity), "cert:%s", cert);
	else
		snprintf(j->identity, sizeof(j->identity), "-");
}

/* Token check, from the call's metadata only (its body is not read yet).
 * Returns 0, or the refusal in err (-EACCES: no valid token ->
 * UNAUTHENTICATED is set by the caller; -EPERM: read-only token). */
static int authorize(struct daemon *d, struct job *j, struct rpc_call *call,
		     struct eng_error *err, enum rpc_code *ret_code)
{
	const struct method *m = j->m;
	const char *hdr = rpc_call_authorization(call);
	int n_hdr = rpc_call_authorization_count(call);
	char name[AUTH_NAME_MAX];
	enum auth_level lvl;

	lvl = n_hdr > 1 ? AUTH_NONE : auth_check_tenant(&d->auth, hdr, name, j->tenant);
	if (n_hdr > 1)
		name[0] = j->tenant[0] = '\0';
	snprintf(j->token, sizeof(j->token), "%s", name);
	set_identity(j, name, rpc_call_cert_identity(call));
	if (!auth_enabled(&d->auth) || (m && (m->flags & M_HEALTH) && d->cfg.health_exempt))
		return 0;
	if (lvl == AUTH_NONE) {
		__atomic_add_fetch(&d->metrics.auth_failures, 1, __ATOMIC_RELAXED);
		*ret_code = RPC_UNAUTHENTICATED;
		return eng_fail(err, -EACCES, n_hdr > 1 ?
				"authorization: more than one header" : n_hdr ?
				"authorization: bearer token not accepted" :
				"authorization: missing (send 'authorization: Bearer <token>')");
	}
	if (m && lvl == AUTH_READ && !(m->flags & M_READ_ONLY)) {
		*ret_code = RPC_PERMISSION_DENIED;
		return eng_fail(err, -EPERM, "authorization: token '%s' is read-only; %s needs a full token",
				name, method_label(m));
	}
	/* A token limited to adapters, on a method that names none: refused
	 * before the body is read (the rest once it is: authorize_adapter). */
	if (m && j->tenant[0] && !m->adapter_fd && !(m->flags & M_TENANT_FREE)) {
		*ret_code = RPC_PERMISSION_DENIED;
		return eng_fail(err, -EPERM,
				"adapter: token '%s' is limited to adapters %s; %s acts on the "
				"base model", name, j->tenant, method_label(m));
	}
	return 0;
}

/* A token limited to adapters (auth.h), once the request is decoded: the
 * adapter it names must be one of the token's; naming none (the base
 * model) only for the methods flagged M_TENANT_FREE. -EPERM naming the
 * adapter. */
static int authorize_adapter(const struct job *j, struct eng_error *err)
{
	const char *name = job_adapter(j);
	const char *field = j->m->adapter_fd ? j->m->adapter_fd->name : "adapter";

	if (!j->tenant[0] || (name[0] ? auth_adapter_allowed(j->tenant, name) :
			      (j->m->flags & M_TENANT_FREE) != 0))
		return 0;
	if (name[0])
		return eng_fail(err, -EPERM,
				"%s: token '%s' may not use adapter '%s' (it is limited to "
				"adapters %s)", field, j->token, name, j->tenant);
	return eng_fail(err, -EPERM,
			"%s: token '%s' is limited to adapters %s; %s without one acts on the "
			"base model", field, j->token, j->tenant,
			method_label(j->m));
}

/* server.max_concurrent_calls; with d->lock held. */
static int queue_full_locked(struct daemon *d, struct eng_error *err)
{
	if (d->cfg.max_concurrent_calls > 0 && d->in_flight >= d->cfg.max_concurrent_calls)
		return eng_fail(err, -E2BIG, "server: %lld calls queued or running (server.max_concurrent_calls = %d); retry later",
				(long long)d->in_flight, d->cfg.max_concurrent_calls);
	return 0;
}

/* Poller thread: the request of an accepted call has arrived (or not).
 * Decode, validate, then answer inline or queue. Never blocks. */
/* Queue a validated job for the engine thread, or answer it (shutting
 * down, queue full). Any thread; d->lock not held. */
static void enqueue(struct daemon *d, struct job *j)
{
	struct eng_error err;
	int r;

	eng_error_clear(&err);
	pthread_mutex_lock(&d->lock);
	r = d->stopping ? eng_fail(&err, -ESHUTDOWN, "daemon is shutting down") :
	    queue_full_locked(d, &err);
	if (r < 0) {
		pthread_mutex_unlock(&d->lock);
		job_finish(j, r, &err);
		return;
	}
	j->next = NULL;
	if (d->tail)
		d->tail->next = j;
	else
		d->head = j;
	d->tail = j;
	d->queued++;
	d->in_flight++;
	pthread_cond_signal(&d->cond);
	pthread_mutex_unlock(&d->lock);
}

/* replay.c: a duplicate whose original never ran runs in its place. */
void dispatch_replay_requeue(void *ctx, struct job *j)
{
	enqueue(ctx, j);
}

static void on_request(void *user, struct rpc_call *call, enum rpc_recv_result res,
		       const uint8_t *req, size_t len)
{
	struct job *j = user;
	struct daemon *d = j->d;
	const struct method *m = j->m;
	enum replay_verdict verdict;
	struct eng_error err;
	int r;

	eng_error_clear(&err);
	switch (res) {
	case RPC_RECV_MESSAGE:
		break;
	case RPC_RECV_END:
		job_finish(j, eng_fail(&err, -EINVAL, "request: no message"), &err);
		return;
	case RPC_RECV_GONE:
		if (rpc_call_expired(call))
			r = eng_fail(&err, -ETIMEDOUT, "deadline passed before the request arrived");
		else
			r = eng_fail(&err, -ECANCELED, "call cancelled before the request arrived");
		job_finish(j, r, &err);
		return;
	case RPC_RECV_OVER_BOUND:
		job_finish(j, eng_fail(&err, -E2BIG,
			   "server: a request of %zu bytes with %lld bytes of requests in flight would pass server.max_inflight_request_bytes = %lld; retry later",
			   len, (long long)rpc_call_inflight_bytes(call),
			   (long long)d->cfg.max_inflight_request_bytes), &err);
		return;
	case RPC_RECV_NO_MEMORY:
		job_finish(j, eng_fail(&err, -ENOMEM, "out of memory reading the request (%zu bytes)",
				       len), &err);
		return;
	}
	pthread_mutex_lock(&d->lock);
	r = d->stopping ? -ESHUTDOWN : 0;
	pthread_mutex_unlock(&d->lock);
	if (r < 0) {
		job_finish(j, eng_fail(&err, r, "daemon is shutting down"), &err);
		return;
	}
	r = wire_check_strings(m->req_desc, req, len, &err);
	if (r < 0) {
		job_finish(j, r, &err);
		return;
	}
	j->req = protobuf_c_message_unpack(m->req_desc, NULL, len, req);
	if (!j->req) {
		job_finish(j, eng_fail(&err, -EINVAL,
					  "request: not a valid %s message (%zu bytes)",
					  m->req_desc->name, len), &err);
		return;
	}
	r = authorize_adapter(j, &err);
	if (r < 0) {
		job_finish(j, r, &err);
		return;
	}
	if (m->validate) {
		r = m->validate(d, j, &err);
		if (r < 0) {
			job_finish(j, r, &err);
			return;
		}
	}
	/* No adapter has a longer name (nor could the replay table scope
	 * one): answered before anything is queued. */
	if (strlen(job_adapter(j)) > ENGINE_ADAPTER_NAME_MAX) {
		job_finish(j, eng_fail(&err, -ENOENT, "%s: no adapter named '%.*s...' (names "
				       "have at most %d characters)", m->adapter_fd->name,
				       ENGINE_ADAPTER_NAME_MAX, job_adapter(j),
				       ENGINE_ADAPTER_NAME_MAX), &err);
		return;
	}
	/* Exactly once: a duplicate request id gets the original's outcome. */
	r = replay_begin(d->replay, j, req, len, &verdict, &err);
	if (r < 0) {
		job_finish(j, r, &err);
		return;
	}
	if (verdict == REPLAY_ANSWERED)
		return;
	if (m->where == RUN_INLINE) {
		r = m->run(d, j, &err);
		job_finish(j, r, &err);
		return;
	}
	if (m->where == RUN_OWN) {
		r = m->run(d, j, &err);
		if (r < 0)
			job_finish(j, r, &err);
		return;
	}
	enqueue(d, j);
}

/* Poller thread: a new call, with its metadata only. Who may call is
 * decided before a byte of the request is read; then the request is asked
 * for (on_request). Never blocks. */
void dispatch_on_call(void *ctx, struct rpc_call *call, int method)
{
	struct daemon *d = ctx;
	const struct method *m = method >= 0 ? &daemon_methods[method] : NULL;
	enum rpc_code code = RPC_OK;
	struct eng_error err;
	struct job *j;
	int r;

	eng_error_clear(&err);
	j = job_new(call, m, &d->metrics);
	if (!j) {
		rpc_reply_status(call, RPC_RESOURCE_EXHAUSTED, "out of memory");
		return;
	}
	j->d = d;

	/* Who may call: before anything else, even for unknown methods. */
	if (authorize(d, j, call, &err, &code) < 0) {
		job_refuse(j, code, err.msg);
		return;
	}
	if (!m) {
		char msg[300];

		snprintf(msg, sizeof(msg), "unknown method %s", rpc_call_method(call));
		job_refuse(j, RPC_UNIMPLEMENTED, msg);
		return;
	}

	pthread_mutex_lock(&d->lock);
	r = d->stopping ? eng_fail(&err, -ESHUTDOWN, "daemon is shutting down") : 0;
	/* A full queue refuses an engine call before its body is read (and
	 * again when it would be queued). */
	if (r == 0 && m->where == RUN_ENGINE)
		r = queue_full_locked(d, &err);
	pthread_mutex_unlock(&d->lock);
	if (r < 0) {
		job_finish(j, r, &err);
		return;
	}
	if (m->client_streaming) {
		/* The handler reads the messages itself. */
		r = m->run(d, j, &err);
		if (r < 0)
			job_finish(j, r, &err);
		return;
	}
	if (rpc_recv_next(call, on_request, j) < 0)
		job_finish(j, eng_fail(&err, -EIO, "rpc: cannot receive the request"), &err);
}
