/* handlers.h — the TrainingEngine methods: a validate (poller thread,
 * before anything is queued) and a run (engine thread, or inline for
 * GetStatus) each, as the method table (methods.c) names them. */
#ifndef ENGINED_DAEMON_HANDLERS_H
#define ENGINED_DAEMON_HANDLERS_H

#include "daemon.h"

/* handlers.c */
int h_validate_initialize(struct daemon *d, struct job *j, struct eng_error *err);
int h_run_initialize(struct daemon *d, struct job *j, struct eng_error *err);
int h_validate_set_mode(struct daemon *d, struct job *j, struct eng_error *err);
int h_run_set_mode(struct daemon *d, struct job *j, struct eng_error *err);
int h_validate_forward_backward(struct daemon *d, struct job *j, struct eng_error *err);
int h_run_forward_backward(struct daemon *d, struct job *j, struct eng_error *err);
int h_validate_optimizer_step(struct daemon *d, struct job *j, struct eng_error *err);
int h_run_optimizer_step(struct daemon *d, struct job *j, struct eng_error *err);
int h_run_zero_grad(struct daemon *d, struct job *j, struct eng_error *err);
int h_run_lr_scheduler_step(struct daemon *d, struct job *j, struct eng_error *err);
int h_validate_to_device(struct daemon *d, struct job *j, struct eng_error *err);
int h_run_to_device(struct daemon *d, struct job *j, struct eng_error *err);
int h_validate_save_checkpoint(struct daemon *d, struct job *j, struct eng_error *err);
int h_run_save_checkpoint(struct daemon *d, struct job *j, struct eng_error *err);
int h_validate_load_checkpoint(struct daemon *d, struct job *j, struct eng_error *err);
int h_run_load_checkpoint(struct daemon *d, struct job *j, struct eng_error *err);
int h_run_get_status(struct daemon *d, struct job *j, struct eng_error *err);
int h_validate_create_adapter(struct daemon *d, struct job *j, struct eng_error *err);
int h_run_create_adapter(struct daemon *d, struct job *j, struct eng_error *err);
int h_validate_delete_adapter(struct daemon *d, struct job *j, struct eng_error *err);
int h_run_delete_adapter(struct daemon *d, struct job *j, struct eng_error *err);

/* A running call's safe point (between a ForwardBackward's micro-batches,
 * a SaveCheckpoint's files, a Sample's decode steps, before each tensor
 * Initialize builds): the test hold (test_hold.h), then whether the client
 * went away or its deadline passed (call: the job's rpc_call). */
bool h_call_gone(void *call);

/* sample.c: Sample. The engine thread runs it in a batch (sample_batch.h),
 * with the parameters validate made (emit's context: the job); run, the
 * call alone, is the method row's mark. */
int h_validate_sample(struct daemon *d, struct job *j, struct eng_error *err);
int h_run_sample(struct daemon *d, struct job *j, struct eng_error *err);
struct engine_sample_params *h_sample_params(struct job *j);

/* group.c: CreateGroup */
int h_validate_create_group(struct daemon *d, struct job *j, struct eng_error *err);
int h_run_create_group(struct daemon *d, struct job *j, struct eng_error *err);

/* handlers.c: save e's checkpoint (the base engine's or an adapter's) to
 * `rel` under the checkpoint root, confined (engine thread):
 * SaveCheckpoint and shutdown.save_on_stop. */
int daemon_save_checkpoint(struct daemon *d, struct engine *e, const char *rel,
			   int64_t global_step, int max_to_keep, unsigned contents,
			   size_t *ret_bytes, struct eng_error *err);
#endif
