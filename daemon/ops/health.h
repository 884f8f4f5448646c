/* health.h — grpc.health.v1.Health: Check answers the serving status at
 * once; Watch streams it, again whenever it changes, and ends with
 * UNAVAILABLE when the server goes away. The status comes from a callback
 * of the daemon's: this module knows nothing of the daemon. */
#ifndef ENGINED_DAEMON_HEALTH_H
#define ENGINED_DAEMON_HEALTH_H

#include <pthread.h>
#include <stdbool.h>

#include "job.h"

/* The service name the health service reports on ("" means the server). */
#define HEALTH_SERVICE "engined.v1.TrainingEngine"

struct health_watch;

struct health {
	bool (*serving)(void *ctx);   /* false: NOT_SERVING */
	void *ctx;
	pthread_mutex_t lock;
	struct health_watch *watches;   /* lock: streams being watched */
	struct health_watch *draining;  /* main thread, while stopping */
};

void health_init(struct health *h, bool (*serving)(void *ctx), void *ctx);
void health_fini(struct health *h);
/* Health/Check (inline). */
int health_check(struct health *h, struct job *j, struct eng_error *err);
/* Health/Watch (RUN_OWN): take the job's call over. */
int health_watch(struct health *h, struct job *j, struct eng_error *err);
/* Send the current status to every watcher (once serving() changed, when
 * the daemon starts stopping); at_exit: end the streams (the server is
 * going away). Main thread. */
void health_broadcast(struct health *h, bool at_exit);
/* End the watches whose client went away (cancelled, deadline, peer
 * gone): answered CANCELLED and freed. Main thread, on its timer. */
void health_reap(struct health *h);

#endif
