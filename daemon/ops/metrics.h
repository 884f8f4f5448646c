/* metrics.h — counters of the daemon and the Prometheus text endpoint
 * (HTTP GET /metrics, libmicrohttpd, on its own address).
 *
 * RPC counters are lock-free (atomic adds from any thread); the engine
 * figures (tokens, step time, grad norm, last checkpoint) are written by
 * the engine thread under `lock`. The page also shows a sample of the
 * daemon's state (step, lr, queue depth, memory by placement) taken by a
 * callback that the daemon hands to metrics_start: this module knows
 * nothing of the daemon. */
#ifndef ENGINED_DAEMON_METRICS_H
#define ENGINED_DAEMON_METRICS_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "engine.h"

#define METRICS_METHODS 24      /* method table rows + 1 for unknown ones */
#define METRICS_CODES 17
#define METRICS_BUCKETS 12

/* What the page shows of the daemon, sampled per request. */
struct metrics_sample {
	struct engine_status st;      /* after the last job */
	int64_t queued, in_flight;
	bool busy;
	double job_seconds;           /* of the running job, 0 when idle */
	double uptime_seconds;
	int64_t bytes_streamed;
	int64_t inflight_request_bytes;  /* received, not yet released by their calls */
	int pending_shares;           /* ShareWeights handles not yet picked up */
	int64_t pending_share_bytes;  /* the shared memory they hold */
};
typedef void (*metrics_sample_fn)(void *ctx, struct metrics_sample *out);

struct metrics {
	/* atomic */
	int64_t calls[METRICS_METHODS][METRICS_CODES];
	int64_t micros[METRICS_METHODS][METRICS_CODES];   /* summed duration */
	int64_t hist[METRICS_METHODS][METRICS_BUCKETS];   /* per bucket, not cumulative */
	int64_t auth_failures;

	pthread_mutex_t lock;
	int64_t tokens_trained;       /* lock: tokens of training ForwardBackward calls */
	int64_t optimizer_steps;      /* lock */
	double step_seconds;          /* lock: engine time of the last step (its
				       * ForwardBackward calls + OptimizerStep) */
	double step_accum;            /* lock: since the last OptimizerStep */
	double grad_norm;             /* lock: of the last OptimizerStep */
	int64_t checkpoints_saved;    /* lock */
	double last_checkpoint_unix;  /* lock: 0: none yet */

	const char *const *labels;    /* method labels by row */
	int n_labels;
	metrics_sample_fn sample;
	void *sample_ctx;
	struct MHD_Daemon *http;
	int http_port;
	/* The endpoint's connections (metrics.c: the server's thread only). */
	struct http_conn *conns;      /* oldest first */
	int max_conns, max_conns_per_addr;  /* beyond: an idle one is closed */
	int idle_timeout_s;
	uint64_t conn_seq;
};

/* labels: the method names by row (borrowed; at most METRICS_METHODS - 1);
 * rows outside are "unknown". */
void metrics_init(struct metrics *m, const char *const *labels, int n_labels);
void metrics_fini(struct metrics *m);   /* stops the endpoint */

/* One finished RPC (method index, -1: unknown method). */
void metrics_rpc(struct metrics *m, int method, int code, double seconds);

/* Engine thread: a training ForwardBackward of `tokens` tokens that took
 * `seconds`; an OptimizerStep; a saved checkpoint. */
void metrics_forward_backward(struct metrics *m, int64_t tokens, double seconds);
void metrics_optimizer_step(struct metrics *m, double seconds, double grad_norm);
void metrics_checkpoint_saved(struct metrics *m);

/* Serve GET /metrics on `addr` (host:port; port 0 picks one); each page
 * calls sample(ctx) (from the server's thread). A connection without a
 * byte for idle_timeout_s is closed; idle connections never keep a scraper
 * out (metrics.c). Returns 0 and sets m->http_port, m->max_conns and
 * m->max_conns_per_addr, or a negative errno with a message. */
int metrics_start(struct metrics *m, const char *addr, int idle_timeout_s,
		  metrics_sample_fn sample, void *ctx, char *errbuf, size_t errlen);

#endif
