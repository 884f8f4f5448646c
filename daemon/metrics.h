/* metrics.h — counters of the daemon and the Prometheus text endpoint
 * (HTTP GET /metrics, libmicrohttpd, on its own address).
 *
 * RPC counters are lock-free (atomic adds from any thread); the engine
 * figures (tokens, step time, grad norm, last checkpoint) are written by
 * the engine thread under `lock`. The page also shows the status snapshot
 * (step, lr, queue depth, memory by placement) read under the daemon lock.
 */
#ifndef ENGINED_DAEMON_METRICS_H
#define ENGINED_DAEMON_METRICS_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#define METRICS_METHODS 24      /* daemon_methods rows + 1 for unknown ones */
#define METRICS_CODES 17
#define METRICS_BUCKETS 12

struct daemon;

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

	struct MHD_Daemon *http;
	int http_port;
};

void metrics_init(struct metrics *m);
void metrics_fini(struct metrics *m);   /* stops the endpoint */

/* One finished RPC (method index, -1: unknown method). */
void metrics_rpc(struct metrics *m, int method, int code, double seconds);

/* Engine thread: a training ForwardBackward of `tokens` tokens that took
 * `seconds`; an OptimizerStep; a saved checkpoint. */
void metrics_forward_backward(struct metrics *m, int64_t tokens, double seconds);
void metrics_optimizer_step(struct metrics *m, double seconds, double grad_norm);
void metrics_checkpoint_saved(struct metrics *m);

/* Serve GET /metrics on `addr` (host:port; port 0 picks one). Returns 0
 * and sets m->http_port, or a negative errno with a message. */
int metrics_start(struct daemon *d, const char *addr, char *errbuf, size_t errlen);

#endif
