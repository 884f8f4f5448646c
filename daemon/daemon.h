/* daemon.h — engined's state shared by the dispatcher, the handlers and
 * main: configuration, the engine (owned by the engine thread), the job
 * queue and the status snapshot that cheap RPCs read without waiting (the
 * lifecycle that starts and stops it: lifecycle.h). The job and method
 * types are job.h's; the ops services (ops/) are handed what they need.
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

#include "adapters.h"
#include "auth.h"
#include "config.h"
#include "engine.h"
#include "err.h"
#include "health.h"
#include "job.h"
#include "metrics.h"
#include "rpc.h"
#include "share_socket.h"
#include "share_table.h"

/* What the running job reported last (engine_progress_fn): `done` of
 * `total` `unit` in `phase`; all empty / 0 until it reports. */
struct daemon_progress {
	char phase[48];
	char unit[16];
	int64_t done, total;
};

/* The running job as GetStatus and the slow-job log line see it. */
struct daemon_job_view {
	bool busy;
	char job[48];                 /* method name, "" when idle */
	uint64_t seq;                 /* which job: one more for each job run */
	double seconds;               /* since it started */
	struct daemon_progress progress;
};

struct daemon {
	struct daemon_config cfg;     /* borrowed from main */
	struct rpc_server *rpc;
	struct timespec started;      /* CLOCK_MONOTONIC */
	struct auth auth;
	struct metrics metrics;
	struct health health;
	/* TLS PEM text for the server (borrowed from main; NULL: no TLS). */
	const char *tls_cert, *tls_key, *tls_client_ca;
	/* Reflection: the embedded descriptor set, indexed (reflection.c). */
	struct reflection *refl;
	/* Outcomes of recent request ids (replay.c). */
	struct replay *replay;
	/* ShareWeights (share.c): the pending shares and the side socket that
	 * hands them out; both NULL without server.share_socket. */
	struct share_table *shares;
	struct share_socket *share_sock;

	/* Engine thread only. */
	struct engine *engine;
	int64_t num_tensors;
	struct adapters adapters;     /* LoRA adapters over engine */
	struct adapter_status *adapter_work;  /* [cfg.max_adapters]: the next snapshot */
	struct sample_batch *samples; /* the running Sample calls (sample_batch.h), or NULL */

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
	uint64_t job_seq;             /* lock: jobs started so far */
	struct daemon_progress progress;  /* lock: the running job's */
	int64_t in_flight;            /* lock: engine jobs queued + running */
	bool engine_done;             /* lock: the engine thread has finished */
	struct engine_status snap;    /* lock: status after the last job */
	/* lock: each live adapter's status after the last job, in creation
	 * order ([cfg.max_adapters], swapped with adapter_work). */
	struct adapter_status *adapter_snap;
	int n_adapter_snap;
	pthread_t engine_thread;
	bool engine_thread_started;

	/* Zero-copy stream buffers still referenced by gRPC (stream.c). */
	pthread_mutex_t zc_lock;
	pthread_cond_t zc_cond;
	int64_t zc_outstanding;       /* zc_lock */
};

/* jobs.c: the running job as the rest of the daemon sees it */
/* Seconds the running job has been running, 0 when idle. */
double daemon_job_seconds(struct daemon *d);
/* The running job, its time and its progress (any thread). */
void daemon_job_view(struct daemon *d, struct daemon_job_view *ret);
/* An engine_progress_fn (ctx: the daemon): the running job's progress,
 * stored for GetStatus and the slow-job log line (engine thread). */
void daemon_progress(void *ctx, const char *phase, int64_t done, int64_t total,
		     const char *unit);
/* d->lock held: a job starts (its name static): busy, its sequence
 * number, its start time, no progress yet. */
void daemon_job_started_locked(struct daemon *d, const char *name);
/* Refresh the status snapshot from the engine and its adapters (engine
 * thread). */
void daemon_update_snapshot(struct daemon *d);
/* The engine a call naming adapter `name` runs on (engine thread): the
 * adapter, or the base model for "". -ENOENT naming the field `adapter`
 * when there is no such adapter. */
int daemon_engine_of(struct daemon *d, const char *name, struct engine **ret,
		     struct eng_error *err);

/* lent.c: the engine's memory lent to gRPC by a zero-copy stream. Lend n
 * slices; gRPC's release callback for one (ctx: the daemon); wait (engine
 * thread, before anything may change or free parameter memory) until gRPC
 * has let go of every slice (logs after 30 s, and goes on). */
void daemon_lend_engine_mem(struct daemon *d, int64_t n);
void daemon_engine_mem_released(void *ctx);
void daemon_wait_engine_mem(struct daemon *d);

#endif
