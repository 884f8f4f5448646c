/* job_run.h — an engine job's start and end on the engine thread: the
 * checks before it runs, and what follows its run (metrics, the status
 * snapshot, the engine's busy state, a failed device, the reply). The
 * dispatcher's run of one job and the batch of Sample calls (whose jobs
 * end one by one while the batch goes on) share them. */
#ifndef ENGINED_DAEMON_JOB_RUN_H
#define ENGINED_DAEMON_JOB_RUN_H

#include "daemon.h"

/* Engine thread: the checks a job passes before it runs (not cancelled,
 * deadline not passed, the engine's state, the test hold); 0 when it may
 * run (j->ran set). */
int job_run_admit(struct daemon *d, struct job *j, struct eng_error *err);
/* Engine thread: a job that ran for dt seconds (or was refused) ends with
 * r: its metrics, the status snapshot refreshed before its reply goes out
 * (a GetStatus sent after the reply sees its effects), the engine marked
 * idle unless another job still runs (idle false: the rest of a Sample
 * batch), a device failure taken down, the reply, the job freed. */
void job_run_done(struct daemon *d, struct job *j, int r, struct eng_error *err,
		  double dt, bool idle);

#endif
