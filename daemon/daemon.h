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

#include "auth.h"
#include "config.h"
#include "engine.h"
#include "err.h"
#include "metrics.h"
#include "rpc.h"

struct job;
struct daemon;

enum method_where {
	RUN_INLINE,  /* answered on the poller thread (never waits) */
	RUN_ENGINE,  /* queued for the engine thread */
	RUN_OWN,     /* run takes the call over and answers it later itself
		      * (Health/Watch, reflection): returns 0 once it has, or
		      * an error for dispatch to answer */
};

/* Method flags. */
enum {
	M_READ_ONLY = 1 << 0,  /* allowed with a read-only token */
	M_HEALTH = 1 << 1,     /* exempt from tokens with auth.health_exempt */
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
	const ProtobufCMessageDescriptor *req_desc;  /* NULL: client streaming */
	bool server_streaming;
	bool client_streaming;
	unsigned flags;
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
	char identity[AUTH_NAME_MAX + 300];  /* "token:NAME", "cert:CN" or "-" */
	/* Set by handlers for the metrics (engine thread). */
	int64_t m_tokens;             /* training ForwardBackward: tokens */
	bool m_step;                  /* an OptimizerStep ran */
	double m_grad_norm;
	bool m_saved;                 /* a checkpoint was saved */
};

struct health_watch;

struct daemon {
	struct daemon_config cfg;     /* borrowed from main */
	struct rpc_server *rpc;
	struct timespec started;      /* CLOCK_MONOTONIC */
	struct auth auth;
	struct metrics metrics;
	/* TLS PEM text for the server (borrowed from main; NULL: no TLS). */
	const char *tls_cert, *tls_key, *tls_client_ca;
	/* Reflection: the embedded descriptor set, indexed (reflection.c). */
	struct reflection *refl;

	/* Engine thread only. */
	struct engine *engine;
	int64_t num_tensors;

	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct job *head, *tail;      /* lock */
	int64_t queued;               /* lock */
	bool stopping;                /* lock: refuse new work */
	/* lock: set once the engine's device failed for good (a sticky CUDA
	 * error): calls get INTERNAL, health NOT_SERVING, and the daemon exits
	 * non-zero after answering so that systemd restarts it. */
	const char *engine_failed;
	bool busy;                    /* lock */
	const char *current_job;      /* lock: method name or NULL */
	struct timespec job_started;  /* lock: CLOCK_MONOTONIC, when busy */
	int64_t in_flight;            /* lock: engine jobs queued + running */
	bool engine_done;             /* lock: the engine thread has finished */
	struct health_watch *watches; /* lock: Health/Watch streams */
	struct health_watch *watches_draining;  /* main thread, while stopping */
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
 * finish (and save_on_stop), answer queued jobs UNAVAILABLE, stop the
 * server. Blocks up to cfg.grace_ms for the engine thread; returns
 * -ETIMEDOUT when it is still running then (the process must exit without
 * freeing what that thread uses), else 0. */
int daemon_stop(struct daemon *d);
/* SIGHUP: re-read the token file and the TLS files. The old ones stay in
 * force when the new ones are bad. Returns 0 or the first error. */
int daemon_reload(struct daemon *d, struct eng_error *err);
/* Seconds the running job has been running, 0 when idle. */
double daemon_job_seconds(struct daemon *d);
/* One log line per RPC: method, peer, identity, status, duration; also
 * counts it in the metrics. method_idx: index in daemon_methods or -1. */
void daemon_log_rpc(struct daemon *d, struct rpc_call *call, int method_idx,
		    const char *identity, enum rpc_code code, const char *msg);
void daemon_fini(struct daemon *d);

/* RUN_OWN handlers: free the job once its call has been handed over. */
void daemon_job_release(struct job *j);

/* Save a checkpoint to `rel` under the checkpoint root, confined (engine
 * thread): SaveCheckpoint and shutdown.save_on_stop. */
int daemon_save_checkpoint(struct daemon *d, const char *rel, int64_t global_step,
			   int max_to_keep, unsigned contents, size_t *ret_bytes,
			   struct eng_error *err);

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
/* health.c: grpc.health.v1.Health/Watch */
int h_run_health_watch(struct daemon *d, struct job *j, struct eng_error *err);
/* Send the current status to every watcher (after `stopping` changed);
 * at_exit: end the streams (the server is going away). */
void health_watch_broadcast(struct daemon *d, bool at_exit);
/* reflection.c: grpc.reflection.v1alpha and v1 ServerReflectionInfo,
 * answered from the descriptor set embedded at build time. */
int reflection_init(struct daemon *d, struct eng_error *err);
void reflection_fini(struct daemon *d);
int h_run_reflection(struct daemon *d, struct job *j, struct eng_error *err);

/* stream.c */
int h_validate_get_params(struct daemon *d, struct job *j, struct eng_error *err);
int h_run_get_params(struct daemon *d, struct job *j, struct eng_error *err);
/* Wait until gRPC has released every zero-copy buffer (engine thread,
 * before anything may change or free parameter memory). */
void stream_wait_released(struct daemon *d);

#endif
