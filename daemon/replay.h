/* replay.h — exactly-once state-changing calls: the outcomes of recent
 * request ids (engine.proto: the `engined-request-id` metadata).
 *
 * A call of an M_REPLAY method that carries a request id is looked up
 * before it is queued:
 *  - a new id is entered as pending; the call runs, and its outcome (the
 *    status, message and reply bytes) is recorded when it is answered;
 *  - a duplicate of a pending id waits for the original and gets its
 *    outcome; a duplicate of a recorded id gets the recorded outcome at
 *    once; neither runs;
 *  - an id reused for another method or other request bytes is refused
 *    (INVALID_ARGUMENT);
 *  - an outcome whose bytes were evicted answers ALREADY_EXISTS ("already
 *    applied").
 * Each adapter has an id space of its own: an id is looked up with the
 * adapter its request names (job_adapter: "" for the base model), so the
 * same id on two adapters names two calls.
 * Only calls that had an effect are recorded (job_had_effect): one refused
 * before running (deadline passed in the queue, cancelled, shutting down,
 * invalid) or stopped by its client's cancellation or deadline before it
 * changed anything (-ECANCELED from the engine: gradients as before,
 * nothing saved, nothing loaded) leaves no entry, so that its retry runs,
 * as idempotency keys work elsewhere; a duplicate waiting on it runs in its
 * place (handed back to the dispatcher through `requeue`).
 *
 * Bounds: at most `max_entries` ids (the oldest recorded ones are forgotten
 * first: a retry older than that window runs again) and `max_bytes` of
 * stored replies (the oldest replies are dropped first, their ids kept).
 * Thread-safe (its own lock); pollers and the engine thread use it. */
#ifndef ENGINED_DAEMON_REPLAY_H
#define ENGINED_DAEMON_REPLAY_H

#include <stdbool.h>
#include <stdint.h>

#include "job.h"

struct replay;

int replay_new(int64_t max_entries, int64_t max_bytes,
	       void (*requeue)(void *ctx, struct job *j), void *ctx, struct replay **ret);
void replay_free(struct replay *r);   /* accepts NULL; no call may be pending */

enum replay_verdict {
	REPLAY_RUN,       /* a new id (or none): the caller runs the job */
	REPLAY_ANSWERED,  /* a duplicate: answered now or when the original is */
};

/* Poller thread, after decode and validation: look up the job's request
 * id (none: REPLAY_RUN, nothing recorded). req/len: the request bytes,
 * hashed with the method. On REPLAY_ANSWERED the job is no longer the
 * caller's. -EINVAL (err naming the id) for a bad or reused id; -ENOMEM. */
int replay_begin(struct replay *r, struct job *j, const uint8_t *req, size_t len,
		 enum replay_verdict *ret, struct eng_error *err);

/* The last request id of adapter `scope` ("": the base model) whose call
 * ran and succeeded ("" when none), copied into buf. */
void replay_last_applied(struct replay *r, const char *scope, char *buf, size_t len);

/* An adapter was deleted: forget its last applied id (its recorded
 * outcomes stay, so a retry of an applied call still gets its outcome). */
void replay_forget_scope(struct replay *r, const char *scope);

/* Entries and stored reply bytes, for tests and metrics. */
void replay_usage(struct replay *r, int64_t *ret_entries, int64_t *ret_bytes);

#endif
