/* daemon.h — engined's state shared by the dispatcher, the handlers and
 * main: configuration, the engine (owned by the engine thread), the job
 * queue and the status snapshot that cheap RPCs read without waiting.
 *
 * Threads: poller threads decode and validate requests (handlers'
 * `validate`), answer inline methods (GetStatus, Health) and enqueue the
 * rest; the engine thread runs jobs in FIFO order and is the only thread
 * that touches `engine`. Fields under `lock` are marked.
 */
#ifndef ENGINED_DAEMON_DAEMON_H
#define ENGINED_DAEMON_DAEMON_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <protobuf-c/protobuf-c.h>

#include "engine.h"
#include "err.h"
#include "rpc.h"

struct daemon_config {
	const char *listen;
	const char *checkpoint_root;  /* realpath'ed at start */
	const char *model_root;
	int threads;                  /* engine compute threads; <= 0 default */
	int pollers;
	int64_t max_request_bytes;    /* default 512 MiB */
	int64_t max_send_bytes;
	int64_t default_micro_batch_tokens;
};

struct job;
struct daemon;

enum method_where {
	RUN_INLINE,  /* answered on the poller thread (never waits) */
	RUN_ENGINE,  /* queued for the engine thread */
};

/* Bits of the modes a method may run in (gate). */
enum {
	MODES_IDLE = 1 << ENGINE_MODE_IDLE,
	MODES_TRAIN = 1 << ENGINE_MODE_TRAIN,
	MODES_EVAL = 1 << ENGINE_MODE_EVAL,
	MODES_ANY = MODES_IDLE | MODES_TRAIN | MODES_EVAL,
};

/* One row of the dispatch table. validate runs on a poller thread before
 * anything is queued; it may attach derived data to the job (job->prep). run
 * does the work: for unary methods it leaves the packed reply in
 * job->reply; for streaming methods it sends the messages itself and the
 * dispatcher ends the stream with the returned status. */
struct method {
	const char *path;
	const char *name;
	const ProtobufCMessageDescriptor *req_desc;
	bool server_streaming;
	enum method_where where;
	bool needs_init;
	unsigned modes;
	int (*validate)(struct daemon *d, struct job *j, struct eng_error *err);
	int (*run)(struct daemon *d, struct job *j, struct eng_error *err);
};

struct job {
	struct job *next;
	const struct method *m;
	struct rpc_call *call;
	ProtobufCMessage *req;        /* unpacked request, owned */
	void *prep;                   /* from validate, owned */
	void (*prep_free)(void *prep);
	uint8_t *reply;               /* packed reply (malloc), owned */
	size_t reply_len;
};

struct daemon {
	struct daemon_config cfg;
	struct rpc_server *rpc;
	struct timespec started;      /* CLOCK_MONOTONIC */

	/* Engine thread only. */
	struct engine *engine;
	int64_t num_tensors;

	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct job *head, *tail;      /* lock */
	int64_t queued;               /* lock */
	bool stopping;                /* lock: refuse new work */
	bool busy;                    /* lock */
	const char *current_job;      /* lock: method name or NULL */
	struct engine_status snap;    /* lock: status after the last job */
	pthread_t engine_thread;
	bool engine_thread_started;

	/* Zero-copy stream buffers still referenced by gRPC (stream.c). */
	pthread_mutex_t zc_lock;
	pthread_cond_t zc_cond;
	int64_t zc_outstanding;       /* zc_lock */
};

/* dispatch.c */
extern const struct method daemon_methods[];
extern const int daemon_n_methods;

int daemon_init(struct daemon *d, const struct daemon_config *cfg,
		char *errbuf, size_t errlen);
/* Start serving: the engine thread, then the gRPC server. */
int daemon_start(struct daemon *d, char *errbuf, size_t errlen);
/* Graceful stop: refuse new calls with UNAVAILABLE, let the running job
 * finish, answer queued jobs UNAVAILABLE, stop the server. Blocks. */
void daemon_stop(struct daemon *d);
void daemon_fini(struct daemon *d);

/* Map an engine error code to a gRPC status code. */
enum rpc_code daemon_rpc_code(int err);

/* Pack `msg` into a new malloc'ed buffer as the job's reply; -ENOMEM. */
int job_set_reply(struct job *j, const ProtobufCMessage *msg);

/* Refresh the status snapshot from the engine (engine thread). */
void daemon_update_snapshot(struct daemon *d);

/* handlers.c */
int h_validate_initialize(struct daemon *d, struct job *j, struct eng_error *err);
int h_run_initialize(struct daemon *d, struct job *j, struct eng_error *err);
int h_validate_set_mode(struct daemon *d, struct job *j, struct eng_error *err);
int h_run_set_mode(struct daemon *d, struct job *j, struct eng_error *err);
int h_validate_forward_backward(struct daemon *d, struct job *j, struct eng_error *err);
int h_run_forward_backward(struct daemon *d, struct job *j, struct eng_error *err);
int h_run_optimizer_step(struct daemon *d, struct job *j, struct eng_error *err);
int h_run_lr_scheduler_step(struct daemon *d, struct job *j, struct eng_error *err);
int h_validate_to_device(struct daemon *d, struct job *j, struct eng_error *err);
int h_run_to_device(struct daemon *d, struct job *j, struct eng_error *err);
int h_validate_save_checkpoint(struct daemon *d, struct job *j, struct eng_error *err);
int h_run_save_checkpoint(struct daemon *d, struct job *j, struct eng_error *err);
int h_validate_load_checkpoint(struct daemon *d, struct job *j, struct eng_error *err);
int h_run_load_checkpoint(struct daemon *d, struct job *j, struct eng_error *err);
int h_run_get_status(struct daemon *d, struct job *j, struct eng_error *err);
int h_run_health_check(struct daemon *d, struct job *j, struct eng_error *err);

/* stream.c */
int h_validate_get_params(struct daemon *d, struct job *j, struct eng_error *err);
int h_run_get_params(struct daemon *d, struct job *j, struct eng_error *err);
/* Wait until gRPC has released every zero-copy buffer (engine thread,
 * before anything may change or free parameter memory). */
void stream_wait_released(struct daemon *d);

#endif
