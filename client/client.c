/* client.c — libengined-client (see engined_client.h): protobuf-c encoding
 * and the weight-stream reassembly over transport.h. */
#include "engined_client.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <time.h>

#include "grpc/health/v1/health.pb-c.h"
#include "io/fileio.h"
#include "param_bucket.h"
#include "service_method.h"
#include "transport.h"


/* The reassembly buffer a weight stream leaves for the next one (see
 * ec_weights_open): taken and given back whole, so that concurrent
 * streams of one client never share it. */
struct weights_buf {
	uint8_t *p;
	size_t cap;
};

struct ec_client {
	struct ect_channel *ch;
	int64_t timeout_ms;
	int retries;                  /* ec_set_retries */
	int64_t backoff_ms;
	pthread_mutex_t wlock;        /* guards wkeep */
	struct weights_buf wkeep;
};

/* The calls that change the engine's state: each carries a fresh request
 * id, with which it is retried (engine.proto's header). */
static const char *const state_changing[] = {
	"Initialize", "SetMode", "ForwardBackward", "OptimizerStep", "ZeroGrad",
	"LrSchedulerStep", "ToDevice", "SaveCheckpoint", "LoadCheckpoint", "CreateAdapter",
	"DeleteAdapter",
};

static bool changes_state(const char *name)
{
	for (size_t i = 0; i < sizeof(state_changing) / sizeof(state_changing[0]); i++)
		if (!strcmp(state_changing[i], name))
			return true;
	return false;
}

int ec_new_request_id(char buf[EC_REQUEST_ID_LEN])
{
	uint8_t b[16];
	ssize_t n = getrandom(b, sizeof(b), 0);

	if (n != (ssize_t)sizeof(b))
		return -EIO;
	for (int i = 0; i < 16; i++)
		snprintf(buf + 2 * i, 3, "%02x", b[i]);
	return 0;
}

void ec_set_retries(struct ec_client *c, int retries, int64_t backoff_ms)
{
	c->retries = retries > 0 ? retries : 0;
	c->backoff_ms = backoff_ms > 0 ? backoff_ms : 0;
}

static const char *const code_names[] = {
	"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
	"NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
	"FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED",
	"INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
};

const char *ec_code_name(int code)
{
	if (code < 0 || code > EC_UNAUTHENTICATED)
		return "?";
	return code_names[code];
}

static int set_st(struct ec_status *st, int code, const char *msg)
{
	if (st) {
		st->code = code;
		snprintf(st->message, sizeof(st->message), "%s", msg ? msg : "");
	}
	return code;
}

int ec_connect(const char *target, struct ec_client **ret, struct ec_status *st)
{
	struct ec_client *c = calloc(1, sizeof(*c));
	char msg[ECT_MSG_MAX] = "";
	int r;

	if (!c)
		return set_st(st, EC_RESOURCE_EXHAUSTED, "out of memory");
	pthread_mutex_init(&c->wlock, NULL);
	r = ect_open(target, 1LL << 30, &c->ch, msg);
	if (r)
		pthread_mutex_destroy(&c->wlock);
	if (r) {
		free(c);
		return set_st(st, r, msg);
	}
	*ret = c;
	return set_st(st, 0, "");
}

/* A PEM or token file (at most 16 MiB), or NULL. */
static char *slurp(const char *path)
{
	char *buf = NULL;

	return io_read_file(path, 16u << 20, &buf, NULL) < 0 ? NULL : buf;
}

int ec_connect_opts(const char *target, const struct ec_options *o,
		    struct ec_client **ret, struct ec_status *st)
{
	struct ect_security sec;
	struct ec_client *c;
	char *ca = NULL, *cert = NULL, *key = NULL, *tok = NULL;
	char msg[ECT_MSG_MAX] = "";
	int r = 0;

	memset(&sec, 0, sizeof(sec));
	if (o && o->tls_ca_file && !(ca = slurp(o->tls_ca_file)))
		r = set_st(st, EC_INVALID_ARGUMENT, "tls_ca_file: cannot read");
	if (!r && o && o->tls_cert_file && !(cert = slurp(o->tls_cert_file)))
		r = set_st(st, EC_INVALID_ARGUMENT, "tls_cert_file: cannot read");
	if (!r && o && o->tls_key_file && !(key = slurp(o->tls_key_file)))
		r = set_st(st, EC_INVALID_ARGUMENT, "tls_key_file: cannot read");
	if (!r && o && o->token_file && !o->token) {
		tok = slurp(o->token_file);
		if (!tok)
			r = set_st(st, EC_INVALID_ARGUMENT, "token_file: cannot read");
		else
			tok[strcspn(tok, "\r\n")] = '\0';
	}
	if (r)
		goto out;
	sec.root_pem = ca;
	sec.cert_pem = cert;
	sec.key_pem = key;
	sec.server_name = o ? o->tls_server_name : NULL;
	sec.token = o && o->token ? o->token : tok;
	c = calloc(1, sizeof(*c));
	if (!c) {
		r = set_st(st, EC_RESOURCE_EXHAUSTED, "out of memory");
		goto out;
	}
	pthread_mutex_init(&c->wlock, NULL);
	r = ect_open_secure(target, 1LL << 30, &sec, &c->ch, msg);
	if (r) {
		pthread_mutex_destroy(&c->wlock);
		free(c);
		r = set_st(st, r, msg);
		goto out;
	}
	*ret = c;
	r = set_st(st, 0, "");
out:
	free(ca);
	free(cert);
	if (key) {
		explicit_bzero(key, strlen(key));
		free(key);
	}
	if (tok) {
		explicit_bzero(tok, strlen(tok));
		free(tok);
	}
	return r;
}

void ec_close(struct ec_client *c)
{
	if (!c)
		return;
	ect_close(c->ch);
	free(c->wkeep.p);
	pthread_mutex_destroy(&c->wlock);
	free(c);
}

void ec_set_timeout_ms(struct ec_client *c, int64_t ms)
{
	c->timeout_ms = ms;
}

void ec_free(void *reply)
{
	if (reply)
		protobuf_c_message_free_unpacked(reply, NULL);
}

int ec_call_raw(struct ec_client *c, const char *method, const void *req, size_t len,
		uint8_t **ret, size_t *ret_len, struct ec_status *st)
{
	return ec_call_raw_id(c, method, req, len, NULL, ret, ret_len, st);
}

int ec_call_raw_id(struct ec_client *c, const char *method, const void *req, size_t len,
		   const char *request_id, uint8_t **ret, size_t *ret_len, struct ec_status *st)
{
	char msg[ECT_MSG_MAX] = "";
	int64_t delay = c->backoff_ms;
	int r;

	for (int attempt = 0;; attempt++) {
		r = ect_unary(c->ch, method, req, len, c->timeout_ms, request_id, ret, ret_len, msg);
		/* Only a call with an id is safe to send again. */
		if (!request_id || attempt >= c->retries ||
		    (r != EC_UNAVAILABLE && r != EC_DEADLINE_EXCEEDED))
			break;
		if (delay > 0) {
			struct timespec ts = { delay / 1000, (delay % 1000) * 1000000L };

			nanosleep(&ts, NULL);
			delay *= 2;
		}
	}
	return set_st(st, r, msg);
}

/* One unary call of `svc`'s method `name`: its path and reply type come
 * from protobuf-c's service descriptor (service_method.h). */
/* `svc`'s method `name`: its path (path[128]) and descriptor, and req
 * packed into *ret_buf (malloc, the caller frees) of *ret_len bytes. */
static int pack_call(const ProtobufCServiceDescriptor *svc, const char *name,
		     const ProtobufCMessage *req, char *path,
		     const ProtobufCMethodDescriptor **ret_md, uint8_t **ret_buf,
		     size_t *ret_len, struct ec_status *st)
{
	const ProtobufCMethodDescriptor *md = service_method(svc, NULL, name, path, 128);
	size_t len = protobuf_c_message_get_packed_size(req);
	uint8_t *buf;

	if (!md)
		return set_st(st, EC_INTERNAL, "client: no such method");
	buf = malloc(len ? len : 1);
	if (!buf)
		return set_st(st, EC_RESOURCE_EXHAUSTED, "out of memory");
	protobuf_c_message_pack(req, buf);
	*ret_md = md;
	*ret_buf = buf;
	*ret_len = len;
	return 0;
}

static int call_msg(struct ec_client *c, const ProtobufCServiceDescriptor *svc,
		    const char *name, const ProtobufCMessage *req, void **ret,
		    struct ec_status *st)
{
	char path[128], rid[EC_REQUEST_ID_LEN];
	const ProtobufCMethodDescriptor *md;
	size_t len, rlen = 0;
	uint8_t *buf, *resp = NULL;
	ProtobufCMessage *m;
	int r = pack_call(svc, name, req, path, &md, &buf, &len, st);

	if (r)
		return r;
	if (changes_state(name) && ec_new_request_id(rid) < 0) {
		free(buf);
		return set_st(st, EC_INTERNAL, "client: no random bytes for a request id");
	}
	r = ec_call_raw_id(c, path, buf, len, changes_state(name) ? rid : NULL, &resp, &rlen,
			   st);
	free(buf);
	if (r)
		return r;
	m = protobuf_c_message_unpack(md->output, NULL, rlen, resp);
	free(resp);
	if (!m)
		return set_st(st, EC_INTERNAL, "cannot decode the reply");
	*ret = m;
	return 0;
}

#define ENGINE_SVC &engined__v1__training_engine__descriptor

/* Open a server stream of `svc`'s method `name` with req (no request id:
 * a stream is never state-changing). *ret_out, when not NULL, is the
 * method's reply type. On failure *ret and *ret_out are untouched. */
static int stream_open(struct ec_client *c, const ProtobufCServiceDescriptor *svc,
		       const char *name, const ProtobufCMessage *req, struct ect_stream **ret,
		       const ProtobufCMessageDescriptor **ret_out, struct ec_status *st)
{
	char path[128], msg[ECT_MSG_MAX] = "";
	const ProtobufCMethodDescriptor *md;
	size_t len;
	uint8_t *buf;
	int r = pack_call(svc, name, req, path, &md, &buf, &len, st);

	if (r)
		return r;
	r = ect_stream_open(c->ch, path, buf, len, c->timeout_ms, ret, msg);
	free(buf);
	if (r)
		return set_st(st, r, msg);
	if (ret_out)
		*ret_out = md->output;
	return set_st(st, 0, "");
}

/* The next message of a stream, decoded as `type`: 0 with *ret (the
 * caller's, ec_free) and *ret_done = 0; 0 with *ret_done = 1 at the end
 * of a stream that ended OK; a status code when it failed (*ret and
 * *ret_done untouched). */
static int stream_next_msg(struct ect_stream *s, const ProtobufCMessageDescriptor *type,
			   void **ret, int *ret_done, struct ec_status *st)
{
	char msg[ECT_MSG_MAX] = "";
	uint8_t *raw = NULL;
	size_t len = 0;
	ProtobufCMessage *m;
	int r = ect_stream_next(s, &raw, &len, msg);

	if (r == 0) {
		*ret_done = 1;
		return set_st(st, 0, "");
	}
	if (r != 1)
		return set_st(st, r, msg);
	m = protobuf_c_message_unpack(type, NULL, len, raw);
	free(raw);
	if (!m)
		return set_st(st, EC_DATA_LOSS, "cannot decode a message of the stream");
	*ret = m;
	*ret_done = 0;
	return set_st(st, 0, "");
}

int ec_share_weights(struct ec_client *c, const Engined__V1__ShareWeightsRequest *req,
		     Engined__V1__ShareWeightsResponse **ret, struct ec_status *st)
{
	return call_msg(c, ENGINE_SVC, "ShareWeights", &req->base, (void **)ret, st);
}

int ec_initialize(struct ec_client *c, const Engined__V1__InitializeRequest *req,
		  Engined__V1__InitializeResponse **ret, struct ec_status *st)
{
	return call_msg(c, ENGINE_SVC, "Initialize", &req->base, (void **)ret, st);
}

int ec_set_mode(struct ec_client *c, const Engined__V1__SetModeRequest *req,
		Engined__V1__SetModeResponse **ret, struct ec_status *st)
{
	return call_msg(c, ENGINE_SVC, "SetMode", &req->base, (void **)ret, st);
}

int ec_forward_backward(struct ec_client *c, const Engined__V1__ForwardBackwardRequest *req,
			Engined__V1__ForwardBackwardResponse **ret, struct ec_status *st)
{
	return call_msg(c, ENGINE_SVC, "ForwardBackward", &req->base, (void **)ret, st);
}

/* An `adapter` argument: NULL is the base model, as "". */
static char *adapter_arg(const char *adapter)
{
	return (char *)(adapter ? adapter : "");
}

int ec_optimizer_step(struct ec_client *c, Engined__V1__OptimizerStepResponse **ret,
		      struct ec_status *st)
{
	return ec_optimizer_step_adapter(c, NULL, ret, st);
}

int ec_optimizer_step_adapter(struct ec_client *c, const char *adapter,
			      Engined__V1__OptimizerStepResponse **ret, struct ec_status *st)
{
	Engined__V1__OptimizerStepRequest req = ENGINED__V1__OPTIMIZER_STEP_REQUEST__INIT;

	req.adapter = adapter_arg(adapter);
	return call_msg(c, ENGINE_SVC, "OptimizerStep", &req.base, (void **)ret, st);
}

int ec_zero_grad(struct ec_client *c, struct ec_status *st)
{
	return ec_zero_grad_adapter(c, NULL, st);
}

int ec_zero_grad_adapter(struct ec_client *c, const char *adapter, struct ec_status *st)
{
	Engined__V1__ZeroGradRequest req = ENGINED__V1__ZERO_GRAD_REQUEST__INIT;
	Engined__V1__ZeroGradResponse *resp = NULL;
	int r;

	req.adapter = adapter_arg(adapter);
	r = call_msg(c, ENGINE_SVC, "ZeroGrad", &req.base, (void **)&resp, st);
	if (!r)
		ec_free(resp);
	return r;
}

int ec_lr_scheduler_step(struct ec_client *c, Engined__V1__LrSchedulerStepResponse **ret,
			 struct ec_status *st)
{
	return ec_lr_scheduler_step_adapter(c, NULL, ret, st);
}

int ec_lr_scheduler_step_adapter(struct ec_client *c, const char *adapter,
				 Engined__V1__LrSchedulerStepResponse **ret, struct ec_status *st)
{
	Engined__V1__LrSchedulerStepRequest req = ENGINED__V1__LR_SCHEDULER_STEP_REQUEST__INIT;

	req.adapter = adapter_arg(adapter);
	return call_msg(c, ENGINE_SVC, "LrSchedulerStep", &req.base, (void **)ret, st);
}

int ec_create_adapter(struct ec_client *c, const Engined__V1__CreateAdapterRequest *req,
		      Engined__V1__CreateAdapterResponse **ret, struct ec_status *st)
{
	return call_msg(c, ENGINE_SVC, "CreateAdapter", &req->base, (void **)ret, st);
}

int ec_delete_adapter(struct ec_client *c, const char *name, struct ec_status *st)
{
	Engined__V1__DeleteAdapterRequest req = ENGINED__V1__DELETE_ADAPTER_REQUEST__INIT;
	Engined__V1__DeleteAdapterResponse *resp = NULL;
	int r;

	req.name = adapter_arg(name);
	r = call_msg(c, ENGINE_SVC, "DeleteAdapter", &req.base, (void **)&resp, st);
	if (!r)
		ec_free(resp);
	return r;
}

int ec_to_device(struct ec_client *c, const Engined__V1__ToDeviceRequest *req,
		 Engined__V1__ToDeviceResponse **ret, struct ec_status *st)
{
	return call_msg(c, ENGINE_SVC, "ToDevice", &req->base, (void **)ret, st);
}

int ec_save_checkpoint(struct ec_client *c, const Engined__V1__SaveCheckpointRequest *req,
		       Engined__V1__SaveCheckpointResponse **ret, struct ec_status *st)
{
	return call_msg(c, ENGINE_SVC, "SaveCheckpoint", &req->base, (void **)ret, st);
}

int ec_load_checkpoint(struct ec_client *c, const Engined__V1__LoadCheckpointRequest *req,
		       Engined__V1__LoadCheckpointResponse **ret, struct ec_status *st)
{
	return call_msg(c, ENGINE_SVC, "LoadCheckpoint", &req->base, (void **)ret, st);
}

int ec_get_status(struct ec_client *c, Engined__V1__GetStatusResponse **ret,
		  struct ec_status *st)
{
	return ec_get_status_adapter(c, NULL, ret, st);
}

int ec_get_status_adapter(struct ec_client *c, const char *adapter,
			  Engined__V1__GetStatusResponse **ret, struct ec_status *st)
{
	Engined__V1__GetStatusRequest req = ENGINED__V1__GET_STATUS_REQUEST__INIT;

	req.adapter = adapter_arg(adapter);
	return call_msg(c, ENGINE_SVC, "GetStatus", &req.base, (void **)ret, st);
}

/* --- progress: a thread polling GetStatus -------------------------------- */

struct ec_watch {
	struct ec_client *c;
	char method[64];
	int64_t interval_ms;
	ec_progress_fn fn;
	void *ctx;
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool stop;                  /* lock */
};

/* One GetStatus on the channel (its own deadline, no retries: the next
 * poll is the retry). */
static void watch_poll(struct ec_watch *w)
{
	Engined__V1__GetStatusRequest req = ENGINED__V1__GET_STATUS_REQUEST__INIT;
	Engined__V1__GetStatusResponse *s;
	char msg[ECT_MSG_MAX], path[128];
	uint8_t buf[8], *resp = NULL;
	size_t len = protobuf_c_message_pack(&req.base, buf), rlen = 0;

	if (!service_method(ENGINE_SVC, NULL, "GetStatus", path, sizeof(path)) ||
	    ect_unary(w->c->ch, path, buf, len, 10000, NULL, &resp, &rlen, msg) != 0)
		return;
	s = engined__v1__get_status_response__unpack(NULL, rlen, resp);
	free(resp);
	if (!s)
		return;
	if (s->busy && s->progress && !strcmp(s->current_job, w->method))
		w->fn(w->ctx, s->progress);
	engined__v1__get_status_response__free_unpacked(s, NULL);
}

static void *watch_main(void *arg)
{
	struct ec_watch *w = arg;
	struct timespec until;

	pthread_mutex_lock(&w->lock);
	while (!w->stop) {
		pthread_mutex_unlock(&w->lock);
		watch_poll(w);
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_sec += w->interval_ms / 1000;
		until.tv_nsec += (w->interval_ms % 1000) * 1000000L;
		if (until.tv_nsec >= 1000000000L) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000L;
		}
		pthread_mutex_lock(&w->lock);
		while (!w->stop && pthread_cond_timedwait(&w->cond, &w->lock, &until) == 0)
			;
	}
	pthread_mutex_unlock(&w->lock);
	return NULL;
}

int ec_watch_start(struct ec_client *c, const char *method, int64_t interval_ms,
		   ec_progress_fn fn, void *ctx, struct ec_watch **ret, struct ec_status *st)
{
	struct ec_watch *w = calloc(1, sizeof(*w));

	if (!w)
		return set_st(st, EC_RESOURCE_EXHAUSTED, "out of memory");
	w->c = c;
	snprintf(w->method, sizeof(w->method), "%s", method);
	w->interval_ms = interval_ms > 0 ? interval_ms : 200;
	w->fn = fn;
	w->ctx = ctx;
	pthread_mutex_init(&w->lock, NULL);
	pthread_cond_init(&w->cond, NULL);
	if (pthread_create(&w->thread, NULL, watch_main, w) != 0) {
		pthread_cond_destroy(&w->cond);
		pthread_mutex_destroy(&w->lock);
		free(w);
		return set_st(st, EC_RESOURCE_EXHAUSTED, "no thread for the progress watch");
	}
	*ret = w;
	return set_st(st, 0, "");
}

void ec_watch_stop(struct ec_watch *w)
{
	if (!w)
		return;
	pthread_mutex_lock(&w->lock);
	w->stop = true;
	pthread_cond_broadcast(&w->cond);
	pthread_mutex_unlock(&w->lock);
	pthread_join(w->thread, NULL);
	pthread_cond_destroy(&w->cond);
	pthread_mutex_destroy(&w->lock);
	free(w);
}

int ec_health_check(struct ec_client *c, const char *service, int *ret_serving,
		    struct ec_status *st)
{
	Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
	Grpc__Health__V1__HealthCheckResponse *resp = NULL;
	int r;

	req.service = (char *)(service ? service : "");
	r = call_msg(c, &grpc__health__v1__health__descriptor, "Check", &req.base,
		     (void **)&resp, st);
	if (r)
		return r;
	*ret_serving = (int)resp->status;
	ec_free(resp);
	return 0;
}

void ec_tensor_1d(Engined__V1__Tensor *t, Engined__V1__DType dtype, int64_t *shape_n,
		  const void *data, size_t nbytes)
{
	engined__v1__tensor__init(t);
	t->dtype = dtype;
	t->n_shape = 1;
	t->shape = shape_n;
	t->data.data = (uint8_t *)data;
	t->data.len = nbytes;
}

/* --- weights -------------------------------------------------------------- */

/* Each ParamBucket is decoded where gRPC received it (param_bucket.h):
 * its TensorSlices are copied once, from gRPC's buffers into the tensor
 * being assembled. */

/* The tensor being assembled, or the one last handed out. */
struct partial {
	char *name;
	Engined__V1__DType dtype;
	int ndim;
	int64_t shape[8];
	int64_t nbytes, filled;
};

struct ec_weights {
	struct ec_client *c;
	struct ect_stream *s;
	struct ecb_bucket b;               /* being consumed (b.msg != NULL) */
	size_t next_slice;
	struct partial t;
	bool assembling;                   /* t is incomplete */
	/* The tensor's bytes: one buffer, reused (the caller's view of the
	 * previous tensor ends with the next call), taken from the client at
	 * open and given back at close: a rollout worker that pulls the
	 * weights every step faults it in once, not every pull (fresh pages
	 * cost the kernel a zeroing each: on a VM that is slower than the
	 * network). */
	uint8_t *buf;                      /* [buf_cap] */
	size_t buf_cap;
	bool ended;
	int64_t bytes, messages;
};

int ec_weights_open(struct ec_client *c, const Engined__V1__GetPerTensorParamRequest *req,
		    struct ec_weights **ret, struct ec_status *st)
{
	struct ec_weights *w = calloc(1, sizeof(*w));
	int r;

	if (!w)
		return set_st(st, EC_RESOURCE_EXHAUSTED, "out of memory");
	r = stream_open(c, ENGINE_SVC, "GetPerTensorParam", &req->base, &w->s, NULL, st);
	if (r) {
		free(w);
		return r;
	}
	w->c = c;
	pthread_mutex_lock(&c->wlock);
	w->buf = c->wkeep.p;
	w->buf_cap = c->wkeep.cap;
	c->wkeep = (struct weights_buf){ NULL, 0 };
	pthread_mutex_unlock(&c->wlock);
	*ret = w;
	return set_st(st, 0, "");
}

/* Room for a tensor of n bytes in w->buf (contents not kept). Large
 * tensors (an embedding is hundreds of MiB) get transparent huge pages
 * where the kernel offers them: 512x fewer first-touch faults. */
static int buf_reserve(struct ec_weights *w, size_t n)
{
	const size_t huge = 2 << 20;
	size_t cap = n < 64 ? 64 : n;
	uint8_t *p;

	if (n <= w->buf_cap && w->buf)
		return 0;
	free(w->buf);
	w->buf = NULL;
	w->buf_cap = 0;
	if (cap >= huge) {
		cap = (cap + huge - 1) / huge * huge;
		p = aligned_alloc(huge, cap);
		if (p)
			(void)madvise(p, cap, MADV_HUGEPAGE);
	} else {
		p = malloc(cap);
	}
	if (!p)
		return -ENOMEM;
	w->buf = p;
	w->buf_cap = cap;
	return 0;
}

/* Start assembling the tensor that slice sl opens. */
static int tensor_start(struct ec_weights *w, const Engined__V1__TensorSlice *sl,
			struct ec_status *st)
{
	struct partial *t = &w->t;

	free(t->name);
	memset(t, 0, sizeof(*t));
	w->assembling = false;
	if (sl->tensor_bytes < 0)
		return set_st(st, EC_DATA_LOSS, "inconsistent TensorSlice in stream");
	t->name = strdup(sl->name);
	if (!t->name || buf_reserve(w, (size_t)sl->tensor_bytes) < 0)
		return set_st(st, EC_RESOURCE_EXHAUSTED, "out of memory");
	t->dtype = sl->dtype;
	t->ndim = sl->n_shape > 8 ? 8 : (int)sl->n_shape;
	for (int k = 0; k < t->ndim; k++)
		t->shape[k] = sl->shape[k];
	t->nbytes = sl->tensor_bytes;
	w->assembling = true;
	return 0;
}

int ec_weights_next(struct ec_weights *w, struct ec_tensor *ret, int *ret_done,
		    struct ec_status *st)
{
	char msg[ECT_MSG_MAX] = "";
	struct partial *t = &w->t;

	for (;;) {
		const struct ect_seg *segs;
		const Engined__V1__TensorSlice *sl;
		size_t n = 0, mlen = 0;
		int r;

		if (w->b.msg && w->next_slice < w->b.msg->n_slices) {
			sl = w->b.msg->slices[w->next_slice++];
			if (sl->tensor_offset == 0) {
				r = tensor_start(w, sl, st);
				if (r)
					return r;
			}
			if (!w->assembling || strcmp(t->name, sl->name) ||
			    sl->tensor_offset != t->filled || sl->length < 0 ||
			    sl->tensor_offset + sl->length > t->nbytes || sl->data_offset < 0 ||
			    ecb_copy(&w->b, (size_t)sl->data_offset, w->buf + sl->tensor_offset,
				     (size_t)sl->length) < 0)
				return set_st(st, EC_DATA_LOSS, "inconsistent TensorSlice in stream");
			t->filled += sl->length;
			if (t->filled == t->nbytes) {
				w->assembling = false;
				ret->name = t->name;
				ret->dtype = t->dtype;
				ret->ndim = t->ndim;
				memcpy(ret->shape, t->shape, sizeof(ret->shape));
				ret->data = w->buf;
				ret->nbytes = (size_t)t->nbytes;
				*ret_done = 0;
				return set_st(st, 0, "");
			}
			continue;
		}
		if (w->b.msg) {
			if (w->b.msg->last)
				w->ended = true;
			ecb_clear(&w->b);
		}
		r = ect_stream_next_segs(w->s, &segs, &n, &mlen, msg);
		if (w->ended) {
			if (r == 1)
				return set_st(st, EC_DATA_LOSS, "message after the last bucket");
			if (r)
				return set_st(st, r, msg);
			*ret_done = 1;
			return set_st(st, 0, "");
		}
		if (r == 0)
			return set_st(st, EC_DATA_LOSS, "stream ended without a last bucket");
		if (r != 1)
			return set_st(st, r, msg);
		r = ecb_parse(&w->b, segs, n, mlen);
		if (r == -ENOMEM)
			return set_st(st, EC_RESOURCE_EXHAUSTED, "out of memory");
		if (r < 0)
			return set_st(st, EC_DATA_LOSS, "cannot decode a ParamBucket");
		w->next_slice = 0;
		w->bytes += (int64_t)w->b.data_len;
		w->messages++;
	}
}

int64_t ec_weights_bytes(const struct ec_weights *w)
{
	return w->bytes;
}

int64_t ec_weights_messages(const struct ec_weights *w)
{
	return w->messages;
}

void ec_weights_close(struct ec_weights *w)
{
	if (!w)
		return;
	ecb_free(&w->b);
	ect_stream_close(w->s);
	free(w->t.name);
	/* The larger of this buffer and one another stream gave back stays. */
	pthread_mutex_lock(&w->c->wlock);
	if (w->buf_cap > w->c->wkeep.cap) {
		uint8_t *old = w->c->wkeep.p;

		w->c->wkeep = (struct weights_buf){ w->buf, w->buf_cap };
		w->buf = old;
	}
	pthread_mutex_unlock(&w->c->wlock);
	free(w->buf);
	free(w);
}

/* --- sampling ------------------------------------------------------------- */

/* Sample's replies are small (a completion's tokens and log-probs): each
 * is copied out of gRPC's buffers and decoded whole. */
struct ec_sample {
	struct ect_stream *s;
	const ProtobufCMessageDescriptor *type;    /* SampleResponse */
};

int ec_sample_open(struct ec_client *c, const Engined__V1__SampleRequest *req,
		   struct ec_sample **ret, struct ec_status *st)
{
	struct ec_sample *s = calloc(1, sizeof(*s));
	int r;

	if (!s)
		return set_st(st, EC_RESOURCE_EXHAUSTED, "out of memory");
	r = stream_open(c, ENGINE_SVC, "Sample", &req->base, &s->s, &s->type, st);
	if (r) {
		free(s);
		return r;
	}
	*ret = s;
	return 0;
}

int ec_sample_next(struct ec_sample *s, Engined__V1__SampleResponse **ret, int *ret_done,
		   struct ec_status *st)
{
	return stream_next_msg(s->s, s->type, (void **)ret, ret_done, st);
}

void ec_sample_close(struct ec_sample *s)
{
	if (!s)
		return;
	ect_stream_close(s->s);
	free(s);
}
