/* native_group.h — the native engine's data-parallel group state (ZeRO-1):
 * the collective group, this rank's shard geometry and the reduction of a
 * reducing ForwardBackward. native_dist.c owns it (shape, join, leave);
 * the step, checkpoints and the gradient reduction read it. */
#ifndef ENGINED_NATIVE_GROUP_H
#define ENGINED_NATIVE_GROUP_H

#include <stdbool.h>
#include <stdint.h>

#include "../dist/dist.h"
#include "engine.h"

struct native;

/* The last reducing ForwardBackward's reduction (GetStatus.dist). */
struct native_sync_stats {
	int64_t buckets, bytes;    /* reduced (a bucket spanning two slices: 1) */
	double reduce_s;           /* the reductions' own time */
	double wait_s;             /* the call's wait for them after its backward */
	double pass_s;             /* from the last backward's start to the end */
};

struct grad_sync;

/* Alone: dist NULL, shard_len = padded_total = the table's total,
 * shard_off 0. In a group of W ranks the parameter and gradient families
 * hold padded_total = W * shard_len floats (the tail past the table's
 * total stays 0) and the two moments shard_len: this rank's slice
 * [shard_off, shard_off + shard_len). */
struct native_group {
	struct dist *dist;
	int64_t shard_len, shard_off, padded_total;
	/* True when the gradients are the group's sum already (a
	 * ForwardBackward with reduce_gradients, and no training call since):
	 * this rank's slice holds the sum, the rest zeros; the step then
	 * skips its reduce-scatter. */
	bool grads_reduced;
	int64_t bucket_bytes;              /* dist.bucket_bytes, the default resolved */
	struct grad_sync *sync;            /* native_grad_sync.c; NULL until used */
	struct native_sync_stats sync_last;  /* of the last reducing call */
	/* dist.zero_stage 2 and 3 (native_shard.c): the part buffers; NULL
	 * with ZeRO-1 and alone. shard_err: why a part's collective failed in
	 * a pass (the pass's hook has no error of its own). */
	int zero_stage;                    /* 1 alone; dist.zero_stage in a group */
	struct native_shard *shard;
	struct eng_error shard_err;
};

/* native_dist.c: the data-parallel group (ZeRO-1). */
/* Shard geometry for cfg->dist (alone too). */
int native_dist_shape(struct native *n, const struct engine_init_config *cfg,
		      struct eng_error *err);
/* In a group, join it (blocks until all ranks joined or the timeout) and
 * check that every rank built the same model. Alone: nothing. */
int native_dist_join(struct native *n, const struct engine_init_config *cfg,
		     struct eng_error *err);
/* Rank 0's parameters to every rank (after init or load). */
int native_dist_sync_params(struct native *n, struct eng_error *err);
/* The group's parts of the one optimizer step (native_step.c), each
 * leaving the gradients zeroed when it fails: the sums of this rank's
 * slice of the gradients (a reduce-scatter, unless a reducing
 * ForwardBackward left them in place on every rank); the sum of the
 * slices' squares over the ranks (*sumsq, in place); the updated slices
 * to every rank (all-gather), the other ranks' gradient slices dropped. */
int native_dist_reduce_grads(struct native *n, struct eng_error *err);
int native_dist_sum_norm(struct native *n, double *sumsq, struct eng_error *err);
/* The factor on the gradients a loss writes: 1 alone, 1/W in a group of W
 * ranks, so that the step's sum over the ranks is the mean of the
 * dp_size-scaled gradients (native_dist.c). */
double native_grad_scale(const struct native *n);
int native_dist_gather_params(struct native *n, struct eng_error *err);
void native_dist_leave(struct native *n);
/* LoRA adapters in a group (docs/LORA.md): an adapter shares its base's
 * group and has ZeRO-1 slices of its own table. adapter_shape: its shard
 * geometry from the base's group (alone: the whole table). adapter_join:
 * every rank's CreateAdapter code rc agreed (so a rank that failed locally
 * fails the others instead of leaving them waiting), the same adapter on
 * every rank checked, rank 0's parameters to every rank. reduce_now: a
 * reducing ForwardBackward's reduction after its backward pass (an
 * adapter's gradients are small: one reduce-scatter, not buckets during
 * the pass), leaving the state the bucketed one leaves. */
void native_dist_adapter_shape(struct native *n, const struct native *base);
int native_dist_adapter_join(struct native *n, int rc, struct eng_error *err);
int native_dist_reduce_now(struct native *n, struct eng_error *err);
/* Every rank's code rc of `what` (an all-gather): 0 when all are 0; this
 * rank's own rc (err already says why); else the first failing peer's
 * code, err naming that rank and that nothing changed. */
int native_dist_agree(struct native *n, int rc, const char *what, struct eng_error *err);
/* A code from a peer as this rank reports it (a code of err.h, else -EIO). */
int native_dist_peer_code(int64_t rc);

/* native_shard.c: ZeRO-2 and ZeRO-3. setup (group.zero_stage 2 or 3 in a
 * group; else nothing; a frozen base (frozen_base: LoRA) has no gradients,
 * so 2 is 1 for it and 3 gathers its weights only) makes the part buffers
 * after native_dist_join; bind points
 * the model's gradients (and with 3 its weights) at them and installs the
 * part hooks; invalidate forgets the gathered weights (the parameters
 * changed); free at release. */
int native_shard_setup(struct native *n, struct eng_error *err);
void native_shard_bind(struct native *n);
void native_shard_invalidate(struct native *n);
void native_shard_free(struct native *n);
/* Whether the gradients / the parameters are held as this rank's slice
 * only; the part buffers' bytes. */
bool native_shard_grads(const struct native *n);
bool native_shard_params(const struct native *n);
size_t native_shard_bytes(const struct native *n);
/* The table's elements [lo, hi) gathered from their holders into buf (a
 * device buffer of hi - lo floats): a collective (ZeRO-3). */
int native_shard_gather(struct native *n, float *buf, int64_t lo, int64_t hi,
			struct eng_error *err);
/* A sharded call's bracket: call_begin clears the collectives'
 * statistics; drain waits for every posted gather and reduction and adds
 * the pending sums to the slice (before the engine thread's own
 * collectives, and at the end of a call: -> the first failure);
 * call_end puts the statistics in group.sync_last (GetStatus.dist). */
void native_shard_call_begin(struct native *n);
int native_shard_drain(struct native *n, struct eng_error *err);
void native_shard_call_end(struct native *n);

/* native_shard_comm.c: the thread of the part collectives. post queues a
 * gather (broadcasts from the holders into buf) or a reduction (sums to
 * the holders from buf) of the table's elements [lo, hi), model part
 * `part` (llama.h; -1: a tensor an export reads, for the failure's
 * message), and returns its ticket; wait blocks until that ticket's op ran (-> the first failure
 * since the last stats reset, err its message); drain waits for all. */
struct shard_comm;
int shard_comm_start(struct native *n, struct shard_comm **ret, struct eng_error *err);
void shard_comm_stop(struct shard_comm *c);
int64_t shard_comm_post(struct shard_comm *c, bool reduce, float *buf, int64_t lo, int64_t hi,
			int64_t part);
int shard_comm_wait(struct shard_comm *c, int64_t ticket, struct eng_error *err);
int shard_comm_drain(struct shard_comm *c, struct eng_error *err);
/* ops, bytes, busy seconds (reduce_s), the engine's waits (wait_s);
 * reset: zero them and forget a failure. */
void shard_comm_stats(struct shard_comm *c, struct native_sync_stats *ret, bool reset);

/* -ENOSYS naming `call` when the group shards what it needs (stage 2:
 * the gradients; 3: the parameters) and it is not built for that yet. */
int native_refuse_sharded(const struct native *n, int stage, const char *call,
			  struct eng_error *err);
/* ZeRO-3: parameter tensor i whole in device memory (*ret, valid until
 * the next call or a change of the parameters), gathered from its holders
 * unless it was the last one asked for: a collective, so every rank asks
 * for the same tensors in the same order. */
int native_shard_tensor(struct native *n, int64_t i, const float **ret, struct eng_error *err);
/* Tensor i's elements this rank holds, as table offsets [*a, *b). */
void native_shard_held(const struct native *n, int64_t i, int64_t *a, int64_t *b);

/* native_grad_sync.c: the gradient reduction of a reducing ForwardBackward,
 * in buckets during its last backward pass. prepare (before the call
 * changes anything) starts the module's thread once; begin hooks the
 * model's backward; finish waits for the last bucket (the gradients are
 * then the group's sum in this rank's slice, zero elsewhere); abandon
 * (the backward failed) stops and breaks the group. stop at leave. */
int native_sync_prepare(struct native *n, struct eng_error *err);
void native_sync_begin(struct native *n);
int native_sync_finish(struct native *n, struct eng_error *err);
void native_sync_abandon(struct native *n);
void native_sync_stop(struct native *n);
/* Rank 0's bytes (a multiple of 4) to every rank, bit for bit. */
int native_dist_bcast_words(struct native *n, void *buf, size_t bytes, struct eng_error *err);
/* The same from rank `root`, of a host buffer on every rank. */
int native_dist_bcast_host(struct native *n, void *buf, size_t bytes, int root,
			   struct eng_error *err);
/* Every rank's `bytes` (a multiple of 4) at mine into all[world x bytes]
 * on every rank, bit for bit (host buffers). */
int native_dist_gather_host(struct native *n, void *all, const void *mine, size_t bytes,
			    struct eng_error *err);

#endif
