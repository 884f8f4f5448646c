/* engined_client.h — libengined-client: a small synchronous C API for
 * engined (proto package engined.v1, service TrainingEngine).
 *
 * One function per RPC. Requests and replies are the protobuf-c messages
 * generated from proto/engined/v1/engine.proto; a reply handed out in
 * *ret is owned by the caller (free it with ec_free).
 *
 * Every function returns a gRPC status code: 0 (OK) or > 0, with the
 * server's message (which names the offending field) in st->message. On
 * failure *ret is untouched. A client may be used by one thread at a time.
 */
#ifndef ENGINED_CLIENT_H
#define ENGINED_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "engined/v1/engine.pb-c.h"

/* gRPC status codes, for comparisons. */
enum {
	EC_OK = 0, EC_CANCELLED = 1, EC_UNKNOWN = 2, EC_INVALID_ARGUMENT = 3,
	EC_DEADLINE_EXCEEDED = 4, EC_NOT_FOUND = 5, EC_ALREADY_EXISTS = 6,
	EC_PERMISSION_DENIED = 7, EC_RESOURCE_EXHAUSTED = 8,
	EC_FAILED_PRECONDITION = 9, EC_ABORTED = 10, EC_OUT_OF_RANGE = 11,
	EC_UNIMPLEMENTED = 12, EC_INTERNAL = 13, EC_UNAVAILABLE = 14,
	EC_DATA_LOSS = 15, EC_UNAUTHENTICATED = 16,
};

struct ec_status {
	int code;
	char message[512];
};

struct ec_client;

/* target: "127.0.0.1:50051", "unix:/run/engined.sock". The connection is
 * made lazily; an unreachable daemon shows as UNAVAILABLE on the first call. */
int ec_connect(const char *target, struct ec_client **ret, struct ec_status *st);
/* Security options of ec_connect_opts; every field may be NULL. */
struct ec_options {
	const char *tls_ca_file;      /* CA of the server's certificate: TLS */
	const char *tls_cert_file;    /* client certificate chain (mutual TLS) */
	const char *tls_key_file;     /* its private key */
	const char *tls_server_name;  /* name to check the certificate against */
	const char *token;            /* bearer token */
	const char *token_file;       /* or: the first line of this file */
};
/* Like ec_connect with TLS and/or a bearer token. Files are read here:
 * a missing file is INVALID_ARGUMENT naming it. */
int ec_connect_opts(const char *target, const struct ec_options *o,
		    struct ec_client **ret, struct ec_status *st);
void ec_close(struct ec_client *c);                  /* accepts NULL */
/* Deadline of each later call in ms; <= 0: none (the default is 0). */
void ec_set_timeout_ms(struct ec_client *c, int64_t ms);
const char *ec_code_name(int code);                  /* "INVALID_ARGUMENT" */
void ec_free(void *reply);                           /* accepts NULL */

int ec_initialize(struct ec_client *c, const Engined__V1__InitializeRequest *req,
		  Engined__V1__InitializeResponse **ret, struct ec_status *st);
int ec_set_mode(struct ec_client *c, const Engined__V1__SetModeRequest *req,
		Engined__V1__SetModeResponse **ret, struct ec_status *st);
int ec_forward_backward(struct ec_client *c, const Engined__V1__ForwardBackwardRequest *req,
			Engined__V1__ForwardBackwardResponse **ret, struct ec_status *st);
int ec_optimizer_step(struct ec_client *c, Engined__V1__OptimizerStepResponse **ret,
		      struct ec_status *st);
/* Drop the accumulated gradients (verl's optimizer_zero_grad). */
int ec_zero_grad(struct ec_client *c, struct ec_status *st);
int ec_lr_scheduler_step(struct ec_client *c, Engined__V1__LrSchedulerStepResponse **ret,
			 struct ec_status *st);
int ec_to_device(struct ec_client *c, const Engined__V1__ToDeviceRequest *req,
		 Engined__V1__ToDeviceResponse **ret, struct ec_status *st);
int ec_save_checkpoint(struct ec_client *c, const Engined__V1__SaveCheckpointRequest *req,
		       Engined__V1__SaveCheckpointResponse **ret, struct ec_status *st);
int ec_load_checkpoint(struct ec_client *c, const Engined__V1__LoadCheckpointRequest *req,
		       Engined__V1__LoadCheckpointResponse **ret, struct ec_status *st);
int ec_get_status(struct ec_client *c, Engined__V1__GetStatusResponse **ret,
		  struct ec_status *st);

/* LoRA adapters over a frozen base (InitializeRequest.frozen_base; engine.proto
 * CreateAdapterRequest). The requests of ForwardBackward, SetMode,
 * ToDevice and GetPerTensorParam name an adapter in their `adapter` field;
 * the calls without a request take it as an argument here (NULL or "":
 * the base model). */
int ec_create_adapter(struct ec_client *c, const Engined__V1__CreateAdapterRequest *req,
		      Engined__V1__CreateAdapterResponse **ret, struct ec_status *st);
int ec_delete_adapter(struct ec_client *c, const char *name, struct ec_status *st);
int ec_optimizer_step_adapter(struct ec_client *c, const char *adapter,
			      Engined__V1__OptimizerStepResponse **ret, struct ec_status *st);
int ec_zero_grad_adapter(struct ec_client *c, const char *adapter, struct ec_status *st);
int ec_lr_scheduler_step_adapter(struct ec_client *c, const char *adapter,
				 Engined__V1__LrSchedulerStepResponse **ret, struct ec_status *st);
/* GetStatus with the adapter's own step, lr, mode, placement, ... */
int ec_get_status_adapter(struct ec_client *c, const char *adapter,
			  Engined__V1__GetStatusResponse **ret, struct ec_status *st);
/* grpc.health.v1.Health/Check; *ret_serving: 1 SERVING, 2 NOT_SERVING. */
int ec_health_check(struct ec_client *c, const char *service, int *ret_serving,
		    struct ec_status *st);
/* Any method with raw request bytes (tests, tools); *ret is malloc'ed. */
int ec_call_raw(struct ec_client *c, const char *method, const void *req, size_t len,
		uint8_t **ret, size_t *ret_len, struct ec_status *st);
/* The same with a request id (NULL: none), retried as ec_set_retries says. */
int ec_call_raw_id(struct ec_client *c, const char *method, const void *req, size_t len,
		   const char *request_id, uint8_t **ret, size_t *ret_len, struct ec_status *st);

/* Exactly-once calls (engine.proto's header): every state-changing call
 * carries a fresh request id; a call that fails UNAVAILABLE or
 * DEADLINE_EXCEEDED is sent again with the same id up to `retries` times,
 * backoff_ms apart (doubling). The default is no retry. */
#define EC_REQUEST_ID_LEN 33           /* 32 hex digits and the NUL */
void ec_set_retries(struct ec_client *c, int retries, int64_t backoff_ms);
int ec_new_request_id(char buf[EC_REQUEST_ID_LEN]);

/* --- weights: GetPerTensorParam as an iterator of whole tensors -------- */

struct ec_weights;

struct ec_tensor {
	const char *name;
	Engined__V1__DType dtype;
	int ndim;
	int64_t shape[8];
	const uint8_t *data;   /* little-endian; valid until the next ec_weights_next */
	size_t nbytes;
};

int ec_weights_open(struct ec_client *c, const Engined__V1__GetPerTensorParamRequest *req,
		    struct ec_weights **ret, struct ec_status *st);
/* Returns 0 with the next tensor in *ret and *ret_done = 0; 0 with
 * *ret_done = 1 at the end; a status code (> 0) when the stream failed. */
int ec_weights_next(struct ec_weights *w, struct ec_tensor *ret, int *ret_done,
		    struct ec_status *st);
/* Bytes of tensor data received so far and messages (for progress). */
int64_t ec_weights_bytes(const struct ec_weights *w);
int64_t ec_weights_messages(const struct ec_weights *w);
/* Cancels the stream when it has not ended. Accepts NULL. The buffer that
 * held the tensors (the size of the largest) stays with the client for
 * its next weight stream, until ec_close: pulling the weights again does
 * not fault fresh pages in. */
void ec_weights_close(struct ec_weights *w);

/* --- sampling: Sample's stream of completions --------------------------- */

/* Completions of packed prompts (engine.proto SampleRequest; the weights
 * as of the call's start, no training state changed): one SampleResponse
 * per finished completion (or a few), in the order they finish, not the
 * prompts'. ec_sample_open sends the request (no request id: not a
 * state-changing call); the client's timeout covers the whole stream. */
struct ec_sample;

int ec_sample_open(struct ec_client *c, const Engined__V1__SampleRequest *req,
		   struct ec_sample **ret, struct ec_status *st);
/* Returns 0 with the next reply in *ret (the caller's: ec_free) and
 * *ret_done = 0; 0 with *ret_done = 1 at the end; a status code (> 0)
 * when the stream failed (the daemon's refusal of the request arrives
 * here, at the first call). */
int ec_sample_next(struct ec_sample *s, Engined__V1__SampleResponse **ret, int *ret_done,
		   struct ec_status *st);
/* Cancels the call when the stream has not ended. Accepts NULL. */
void ec_sample_close(struct ec_sample *s);

/* --- same-host weights (ShareWeights) --------------------------------- */

/* The weights in a sealed memfd of the daemon's host (README "Same-host
 * weights"; the daemon needs [server] share_socket). ec_share_weights is
 * the RPC alone: its reply (free with ec_free) carries the handle, the
 * socket's path and the index, and may be handed to another process of the
 * host; ec_share_open picks it up there (one use of the handle): the
 * descriptor over the unix socket, its seals (write, shrink, grow) and size
 * checked, mapped read-only. ec_share_weights_open does both. Errors:
 * NOT_FOUND for an unknown, used up or expired handle, UNAVAILABLE when the
 * socket cannot be reached, PERMISSION_DENIED when its mode refuses this
 * user, FAILED_PRECONDITION for a file that is not sealed. */
struct ec_share;

int ec_share_weights(struct ec_client *c, const Engined__V1__ShareWeightsRequest *req,
		     Engined__V1__ShareWeightsResponse **ret, struct ec_status *st);
int ec_share_open(const Engined__V1__ShareWeightsResponse *reply, struct ec_share **ret,
		  struct ec_status *st);
int ec_share_weights_open(struct ec_client *c, const Engined__V1__ShareWeightsRequest *req,
			  struct ec_share **ret, struct ec_status *st);
/* The tensors, in the share's order: tensor i's data points into the
 * mapping (valid until ec_share_close; never write it). -ERANGE past the
 * last. */
size_t ec_share_count(const struct ec_share *s);
int ec_share_tensor(const struct ec_share *s, size_t i, struct ec_tensor *ret);
int64_t ec_share_step(const struct ec_share *s);   /* the engine step of the weights */
void ec_share_close(struct ec_share *s);            /* unmaps; accepts NULL */

/* --- progress of a long call ------------------------------------------- */

/* While one long call runs on c (Initialize, SaveCheckpoint,
 * LoadCheckpoint, GetPerTensorParam, ForwardBackward), a thread of its own
 * polls GetStatus on c's channel every interval_ms and calls fn(ctx, p)
 * with GetStatusResponse.progress whenever the running job is one of
 * `method` (the name, "SaveCheckpoint"); p is borrowed for the call. fn
 * runs on that thread. This is the one exception to "one thread at a
 * time": the watch only reads c. A failed poll is skipped. */
struct ec_watch;
typedef void (*ec_progress_fn)(void *ctx, const Engined__V1__JobProgress *p);
int ec_watch_start(struct ec_client *c, const char *method, int64_t interval_ms,
		   ec_progress_fn fn, void *ctx, struct ec_watch **ret, struct ec_status *st);
/* Stop polling and join the thread (no fn call after it returns). Accepts NULL. */
void ec_watch_stop(struct ec_watch *w);

/* --- helpers ---------------------------------------------------------- */

/* A Tensor over caller memory (borrowed; nothing is copied). shape[0] = n. */
void ec_tensor_1d(Engined__V1__Tensor *t, Engined__V1__DType dtype, int64_t *shape_n,
		  const void *data, size_t nbytes);

#endif
