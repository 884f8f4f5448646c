/* test_hold.h — a test-only hook that holds engine jobs deterministically.
 *
 * ENGINED_TEST_HOLD_FILE=PATH (environment, read once at start; the
 * systemd unit never sets it): a job that comes up to run while PATH
 * exists waits, after its deadline and state checks and before it runs,
 * until PATH is removed. Tests that need a long job (a queued call whose
 * deadline passes, the watchdog held back, a shutdown grace that runs out)
 * hold one instead of sizing it to the machine's speed. A hold lasts at
 * most TEST_HOLD_MAX_S; the daemon logs a warning at start when the hook
 * is set.
 * ENGINED_TEST_SAFE_POINT_FILE=PATH: at each safe point of a running job
 * (between a ForwardBackward's micro-batches, a SaveCheckpoint's files,
 * before each tensor Initialize builds, between the messages of a weight
 * stream), wait while PATH exists and the
 * call is not cancelled: a test cancels a call part-way, and the job goes
 * on only once the daemon has seen the cancellation. When PATH holds a
 * number N, the first N safe points reached while it exists are let by
 * (a test reads a job's progress at a chosen point); write it whole
 * (rename) so that the hook never reads it half-written. */
#ifndef ENGINED_DAEMON_TEST_HOLD_H
#define ENGINED_DAEMON_TEST_HOLD_H

#include <stdbool.h>

#define TEST_HOLD_MAX_S 300

/* Read the environment; log a warning when the hook is set. */
void test_hold_init(void);
/* Engine thread: wait while the hold file exists (no-op when unset). */
void test_hold_wait(const char *job);
/* Engine thread, at a safe point: wait while the safe-point file exists
 * and gone(ctx) is false. */
void test_hold_safe_point(bool (*gone)(void *ctx), void *ctx);

#endif
