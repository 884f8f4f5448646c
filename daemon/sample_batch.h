/* sample_batch.h — the engine thread's batch of Sample calls (sample_batch.c): a
 * Sample that comes up to run starts a batch over its model (the base or
 * an adapter), and while the batch runs the engine thread steps it, one
 * decode step at a time, letting each next job join when it is a Sample of
 * the same model; any other job waits until the batch has drained, so
 * that the weights never change under a running Sample and a Sample queued
 * behind an OptimizerStep samples the update. */
#ifndef ENGINED_DAEMON_SAMPLE_BATCH_H
#define ENGINED_DAEMON_SAMPLE_BATCH_H

#include <stdbool.h>

#include "daemon.h"

/* Whether j is a Sample (run in a batch, not by run_job). */
bool sample_batched(const struct job *j);
/* Whether j joins the running batch (d->lock held or not: engine thread). */
bool sample_joins(const struct daemon *d, const struct job *j);
/* Engine thread: start a batch with j, or join the running one; a call
 * that cannot join ends at once with why. */
void sample_job(struct daemon *d, struct job *j);
/* Engine thread: one step of the running batch; the batch closes (the
 * engine idle again) once its last call has ended. */
void sample_step(struct daemon *d);

#endif
