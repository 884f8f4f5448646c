/* dispatch.c — the dispatch table, the gate, the job queue and the engine
 * thread.
 *
 * Every RPC goes through on_call(): decode (protobuf-c), the static gate
 * (shutting down -> UNAVAILABLE), the method's validate (a rejected request
 * never reaches the engine), then either an inline answer (GetStatus,
 * Health: never queued behind a long job) or a FIFO job for the engine
 * thread, which re-checks the state gate (initialized, mode) when the job
 * comes up, runs it and replies. Engine error codes become gRPC status codes
 * only here, and each RPC is logged once here.
 */
#include "daemon.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engined/v1/engine.pb-c.h"
#include "grpc/health/v1/health.pb-c.h"
#include "log.h"

#define SVC "/engined.v1.TrainingEngine/"

const struct method daemon_methods[] = {
	{ SVC "Initialize", "Initialize", &engined__v1__initialize_request__descriptor,
	  false, RUN_ENGINE, false, MODES_ANY,
	  h_validate_initialize, h_run_initialize },
	{ SVC "SetMode", "SetMode", &engined__v1__set_mode_request__descriptor,
	  false, RUN_ENGINE, true, MODES_ANY,
	  h_validate_set_mode, h_run_set_mode },
	{ SVC "ForwardBackward", "ForwardBackward",
	  &engined__v1__forward_backward_request__descriptor,
	  false, RUN_ENGINE, true, MODES_ANY,
	  h_validate_forward_backward, h_run_forward_backward },
	{ SVC "OptimizerStep", "OptimizerStep",
	  &engined__v1__optimizer_step_request__descriptor,
	  false, RUN_ENGINE, true, MODES_IDLE | MODES_TRAIN,
	  NULL, h_run_optimizer_step },
	{ SVC "LrSchedulerStep", "LrSchedulerStep",
	  &engined__v1__lr_scheduler_step_request__descriptor,
	  false, RUN_ENGINE, true, MODES_ANY,
	  NULL, h_run_lr_scheduler_step },
	{ SVC "ToDevice", "ToDevice", &engined__v1__to_device_request__descriptor,
	  false, RUN_ENGINE, true, MODES_ANY,
	  h_validate_to_device, h_run_to_device },
	{ SVC "GetPerTensorParam", "GetPerTensorParam",
	  &engined__v1__get_per_tensor_param_request__descriptor,
	  true, RUN_ENGINE, true, MODES_ANY,
	  h_validate_get_params, h_run_get_params },
	{ SVC "SaveCheckpoint", "SaveCheckpoint",
	  &engined__v1__save_checkpoint_request__descriptor,
	  false, RUN_ENGINE, true, MODES_ANY,
	  h_validate_save_checkpoint, h_run_save_checkpoint },
	{ SVC "LoadCheckpoint", "LoadCheckpoint",
	  &engined__v1__load_checkpoint_request__descriptor,
	  false, RUN_ENGINE, true, MODES_ANY,
	  h_validate_load_checkpoint, h_run_load_checkpoint },
	{ SVC "GetStatus", "GetStatus", &engined__v1__get_status_request__descriptor,
	  false, RUN_INLINE, false, MODES_ANY,
	  NULL, h_run_get_status },
	{ "/grpc.health.v1.Health/Check", "Health.Check",
	  &grpc__health__v1__health_check_request__descriptor,
	  false, RUN_INLINE, false, MODES_ANY,
	  NULL, h_run_health_check },
};
const int daemon_n_methods = sizeof(daemon_methods) / sizeof(daemon_methods[0]);

static const char *const mode_names[] = { "IDLE", "TRAIN", "EVAL" };

enum rpc_code daemon_rpc_code(int err)
{
	switch (-err) {
	case 0: return RPC_OK;
	case EINVAL: return RPC_INVALID_ARGUMENT;
	case ENOENT: return RPC_NOT_FOUND;
	case ENOMEM: return RPC_RESOURCE_EXHAUSTED;
	case E2BIG: return RPC_RESOURCE_EXHAUSTED;
	case EPERM: return RPC_PERMISSION_DENIED;
	case EACCES: return RPC_PERMISSION_DENIED;
	case EBADMSG: return RPC_DATA_LOSS;
	case ENODEV: return RPC_FAILED_PRECONDITION;
	case EALREADY: return RPC_FAILED_PRECONDITION;
	case ECANCELED: return RPC_CANCELLED;
	case ETIMEDOUT: return RPC_DEADLINE_EXCEEDED;
	case EEXIST: return RPC_ALREADY_EXISTS;
	case ENOSYS: return RPC_UNIMPLEMENTED;
	case ESHUTDOWN: return RPC_UNAVAILABLE;
	case ENOSPC: return RPC_RESOURCE_EXHAUSTED;
	case EIO: return RPC_INTERNAL;
	default: return RPC_INTERNAL;
	}
}

int job_set_reply(struct job *j, const ProtobufCMessage *msg)
{
	size_t len = protobuf_c_message_get_packed_size(msg);
	uint8_t *buf = malloc(len ? len : 1);

	if (!buf)
		return -ENOMEM;
	protobuf_c_message_pack(msg, buf);
	free(j->reply);
	j->reply = buf;
	j->reply_len = len;
	return 0;
}

static void job_free(struct job *j)
{
	if (!j)
		return;
	if (j->req)
		protobuf_c_message_free_unpacked(j->req, NULL);
	if (j->prep_free)
		j->prep_free(j->prep);
	free(j->reply);
	free(j);
}

/* Reply, log the outcome once and free the job. */
static void job_finish(struct job *j, int r, const struct eng_error *err)
{
	enum rpc_code code = daemon_rpc_code(r);
	const char *msg = err && err->code ? err->msg : "";
	const char *name = j->m ? j->m->name : rpc_call_method(j->call);
	double ms = rpc_call_elapsed(j->call) * 1e3;

	if (r == 0) {
		log_msg(LOG_LVL_INFO, "rpc %s peer=%s status=OK %.1f ms", name,
			rpc_call_peer(j->call), ms);
	} else {
		log_msg(code == RPC_INTERNAL ? LOG_LVL_ERROR : LOG_LVL_INFO,
			"rpc %s peer=%s status=%s %.1f ms: %s", name,
			rpc_call_peer(j->call), rpc_code_name(code), ms,
			msg[0] ? msg : eng_strerror(r));
	}
	if (r < 0)
		rpc_reply_status(j->call, code, msg[0] ? msg : eng_strerror(r));
	else if (j->m && j->m->server_streaming)
		rpc_reply_status(j->call, RPC_OK, NULL);
	else
		rpc_reply(j->call, j->reply, j->reply_len);
	j->call = NULL;
	job_free(j);
}

/* The state gate, checked when the job is about to run. */
static int gate(struct daemon *d, const struct method *m, struct eng_error *err)
{
	enum engine_mode mode;

	if (!m->needs_init)
		return 0;
	if (!d->engine)
		return eng_fail(err, -EALREADY,
				"engine: not initialized (call Initialize first)");
	mode = engine_mode(d->engine);
	if (!(m->modes & (1u << mode)))
		return eng_fail(err, -EALREADY, "mode: %s is not allowed in mode %s",
				m->name, mode_names[mode]);
	return 0;
}

/* Run one job; the status snapshot is refreshed before the reply goes out,
 * so that a GetStatus sent after the reply sees the job's effects. */
static void run_job(struct daemon *d, struct job *j)
{
	struct eng_error err;
	int r;

	eng_error_clear(&err);
	if (rpc_call_cancelled(j->call)) {
		r = eng_fail(&err, -ECANCELED, "call cancelled before it ran");
	} else {
		r = gate(d, j->m, &err);
		if (r == 0)
			r = j->m->run(d, j, &err);
	}
	daemon_update_snapshot(d);
	pthread_mutex_lock(&d->lock);
	d->busy = false;
	d->current_job = NULL;
	pthread_mutex_unlock(&d->lock);
	job_finish(j, r, &err);
}

void daemon_update_snapshot(struct daemon *d)
{
	struct engine_status st;

	memset(&st, 0, sizeof(st));
	if (d->engine)
		engine_status(d->engine, &st);
	pthread_mutex_lock(&d->lock);
	d->snap = st;
	pthread_mutex_unlock(&d->lock);
}

static void *engine_thread_main(void *arg)
{
	struct daemon *d = arg;
	struct job *j;
	bool streaming;

	for (;;) {
		pthread_mutex_lock(&d->lock);
		while (!d->head && !d->stopping)
			pthread_cond_wait(&d->cond, &d->lock);
		if (d->stopping) {
			pthread_mutex_unlock(&d->lock);
			break;
		}
		j = d->head;
		d->head = j->next;
		if (!d->head)
			d->tail = NULL;
		d->queued--;
		d->busy = true;
		d->current_job = j->m->name;
		pthread_mutex_unlock(&d->lock);

		streaming = j->m->server_streaming;
		run_job(d, j);
		/* gRPC may still be writing zero-copy slices of the parameters
		 * after the last send completed: nothing may change them before
		 * it lets go. */
		if (streaming)
			stream_wait_released(d);
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
		j = next;
	}
	/* Parameters may be freed below: let gRPC drop zero-copy slices first. */
	stream_wait_released(d);
	engine_destroy(d->engine);
	d->engine = NULL;
	return NULL;
}

/* Poller thread: a new call. Never blocks. */
static void on_call(void *ctx, struct rpc_call *call, int method,
		    const uint8_t *req, size_t len, bool has_message)
{
	struct daemon *d = ctx;
	const struct method *m = &daemon_methods[method];
	struct eng_error err;
	struct job *j;
	int r;

	eng_error_clear(&err);
	j = calloc(1, sizeof(*j));
	if (!j) {
		rpc_reply_status(call, RPC_RESOURCE_EXHAUSTED, "out of memory");
		return;
	}
	j->m = m;
	j->call = call;

	pthread_mutex_lock(&d->lock);
	r = d->stopping ? -ESHUTDOWN : 0;
	pthread_mutex_unlock(&d->lock);
	if (r < 0) {
		eng_fail(&err, r, "daemon is shutting down");
		job_finish(j, r, &err);
		return;
	}
	if (!has_message) {
		job_finish(j, eng_fail(&err, -EINVAL, "request: no message"), &err);
		return;
	}
	j->req = protobuf_c_message_unpack(m->req_desc, NULL, len, req);
	if (!j->req) {
		job_finish(j, eng_fail(&err, -EINVAL,
				       "request: not a valid %s message (%zu bytes)",
				       m->req_desc->name, len), &err);
		return;
	}
	if (m->validate) {
		r = m->validate(d, j, &err);
		if (r < 0) {
			job_finish(j, r, &err);
			return;
		}
	}
	if (m->where == RUN_INLINE) {
		r = m->run(d, j, &err);
		job_finish(j, r, &err);
		return;
	}

	pthread_mutex_lock(&d->lock);
	if (d->stopping) {
		pthread_mutex_unlock(&d->lock);
		eng_fail(&err, -ESHUTDOWN, "daemon is shutting down");
		job_finish(j, -ESHUTDOWN, &err);
		return;
	}
	if (d->tail)
		d->tail->next = j;
	else
		d->head = j;
	d->tail = j;
	d->queued++;
	pthread_cond_signal(&d->cond);
	pthread_mutex_unlock(&d->lock);
}

int daemon_init(struct daemon *d, const struct daemon_config *cfg,
		char *errbuf, size_t errlen)
{
	memset(d, 0, sizeof(*d));
	d->cfg = *cfg;
	clock_gettime(CLOCK_MONOTONIC, &d->started);
	pthread_mutex_init(&d->lock, NULL);
	pthread_cond_init(&d->cond, NULL);
	pthread_mutex_init(&d->zc_lock, NULL);
	pthread_cond_init(&d->zc_cond, NULL);
	return 0;
}

int daemon_start(struct daemon *d, char *errbuf, size_t errlen)
{
	static struct rpc_method_reg regs[32];
	struct rpc_server_config rc;
	int r;

	if (pthread_create(&d->engine_thread, NULL, engine_thread_main, d) != 0) {
		snprintf(errbuf, errlen, "cannot start the engine thread");
		return -EAGAIN;
	}
	d->engine_thread_started = true;
	for (int i = 0; i < daemon_n_methods; i++) {
		regs[i].path = daemon_methods[i].path;
		regs[i].server_streaming = daemon_methods[i].server_streaming;
	}
	memset(&rc, 0, sizeof(rc));
	rc.listen = d->cfg.listen;
	rc.max_recv_bytes = d->cfg.max_request_bytes;
	rc.max_send_bytes = d->cfg.max_send_bytes;
	rc.pollers = d->cfg.pollers;
	rc.max_concurrent_streams = 64;
	r = rpc_server_start(&rc, regs, daemon_n_methods, on_call, d, &d->rpc,
			     errbuf, errlen);
	if (r < 0) {
		pthread_mutex_lock(&d->lock);
		d->stopping = true;
		pthread_cond_broadcast(&d->cond);
		pthread_mutex_unlock(&d->lock);
		pthread_join(d->engine_thread, NULL);
		d->engine_thread_started = false;
		return r;
	}
	return 0;
}

void daemon_stop(struct daemon *d)
{
	/* New calls: gRPC refuses them once shut down; calls racing with us
	 * see `stopping`. The running job finishes, queued ones are refused. */
	pthread_mutex_lock(&d->lock);
	d->stopping = true;
	pthread_cond_broadcast(&d->cond);
	pthread_mutex_unlock(&d->lock);
	if (d->rpc)
		rpc_server_shutdown(d->rpc);
	if (d->engine_thread_started) {
		pthread_join(d->engine_thread, NULL);
		d->engine_thread_started = false;
	}
	if (d->rpc) {
		rpc_server_destroy(d->rpc, 2000);
		d->rpc = NULL;
	}
}

void daemon_fini(struct daemon *d)
{
	pthread_cond_destroy(&d->zc_cond);
	pthread_mutex_destroy(&d->zc_lock);
	pthread_cond_destroy(&d->cond);
	pthread_mutex_destroy(&d->lock);
}
