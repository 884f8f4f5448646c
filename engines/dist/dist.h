/* dist.h — collectives between the ranks of one data-parallel group, on
 * existing libraries only: NCCL for device memory (the CUDA device), Gloo
 * for host memory (the CPU device). Backends sit in a table like the
 * devices (dist_table.c): a backend that was not built has a NULL name and
 * is never found, so callers have no #ifdefs.
 *
 * A group is formed in two steps, driven by the controller:
 *   1. on rank 0's daemon, `create_id` makes a group id (NCCL: the unique
 *      id of ncclGetUniqueId, whose bootstrap root listens in that process;
 *      Gloo: a random 128-bit secret naming the group's directory in the
 *      shared FileStore root);
 *   2. every rank calls `open` with that id, its rank and the world size;
 *      open returns once all ranks are connected, or fails at the timeout.
 * The id is a secret: who holds it can join the group (docs/DISTRIBUTED.md).
 *
 * Every collective is blocking, in place where it can be, works on `count`
 * elements of `dtype`, and returns within the group's timeout: 0, or
 *   -ETIMEDOUT   a rank did not arrive in time (the message names it when
 *                the library says which),
 *   -ECONNRESET  a peer closed its connection (a rank died),
 *   -ENOTCONN    the group was broken by an earlier failure,
 *   -EINVAL      a bad argument (count < 0, root out of range),
 *   -EIO         any other library failure (the message carries its text).
 * After any failure but -EINVAL the group is broken (NCCL: the communicator
 * was aborted with ncclCommAbort): every later call returns -ENOTCONN at
 * once, and only dist_close is left to do. Nothing hangs.
 */
#ifndef ENGINED_DIST_H
#define ENGINED_DIST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine_dist.h"
#include "err.h"

enum dist_dtype {
	DIST_F32 = 0,
	DIST_F64,
};

struct dist;

struct dist_ops {
	const char *name;       /* "gloo", "nccl"; NULL: not built */
	const char *device;     /* the device (device.h) whose memory it reduces */
	/* On rank 0: a new group id (cfg gives the timeout, store_root). */
	int (*create_id)(const struct dist_config *cfg, struct dist_group_id *ret,
			 struct eng_error *err);
	int (*open)(const struct dist_config *cfg, struct dist **ret, struct eng_error *err);
	void (*close)(struct dist *d);            /* accepts NULL */
	/* Sum over ranks, in place: buf[count]. */
	int (*all_reduce)(struct dist *d, void *buf, int64_t count, enum dist_dtype t,
			  struct eng_error *err);
	/* Sum over ranks of in[world_size * count]; rank r gets its slice
	 * [r * count, (r + 1) * count) in out[count]. out may be that slice of in. */
	int (*reduce_scatter)(struct dist *d, void *out, const void *in, int64_t count,
			      enum dist_dtype t, struct eng_error *err);
	/* out[world_size * count] = every rank's in[count], in rank order. in may
	 * be rank's own slice of out. */
	int (*all_gather)(struct dist *d, void *out, const void *in, int64_t count,
			  enum dist_dtype t, struct eng_error *err);
	int (*broadcast)(struct dist *d, void *buf, int64_t count, enum dist_dtype t, int root,
			 struct eng_error *err);
	/* Sum over ranks of buf[count] into rank `root`'s buf, in place; on
	 * every other rank buf is zero afterwards (its part was handed to the
	 * root). `after`: a device mark (device.h, mark) that the reduction
	 * waits for before it reads buf, where the device runs its work on a
	 * stream of its own (NULL: buf is ready now). It and broadcast are
	 * the calls that may run on another thread than the engine's: while
	 * one runs, no other collective of the group may (native_grad_sync.c
	 * and native_shard_comm.c keep that rule). */
	int (*reduce)(struct dist *d, void *buf, int64_t count, enum dist_dtype t, int root,
		      const void *after, struct eng_error *err);
	int (*barrier)(struct dist *d, struct eng_error *err);
};

/* The common head of every backend's group. */
struct dist {
	const struct dist_ops *ops;
	int rank, world_size;
	double timeout_s;
	bool broken;
};

extern const struct dist_ops gloo_dist_ops;   /* gloo/ or gloo_stub.c */
extern const struct dist_ops nccl_dist_ops;   /* nccl/ or nccl_stub.c */

/* The backend that serves device `device` ("cpu" -> gloo, "cuda" -> nccl),
 * or NULL when none was built. */
const struct dist_ops *dist_for_device(const char *device);
/* Comma-separated names of the backends built ("gloo,nccl"). */
const char *dist_names(void);
/* The one rule that a group needs a backend for its device: the backend
 * (-ENODEV when none was built; the message names `field`, the device and
 * what was built). */
int dist_backend_check(const char *field, const char *device, const struct dist_ops **ret,
		       struct eng_error *err);
/* The one rule on a group's size: world_size in [min_world, DIST_MAX_WORLD]
 * (-EINVAL naming `field`). */
int dist_world_size_check(const char *field, int world_size, int min_world,
			  struct eng_error *err);
/* The group id rule, one place: at most DIST_GROUP_ID_MAX bytes, and at
 * least one when the config forms a group (required). A caller copying a
 * client's id copies only an id that fits and keeps its length for this. */
int dist_group_id_check(const struct dist_group_id *id, bool required, struct eng_error *err);
/* Check a config against the rules above (ranks, timeout, id length). */
int dist_config_check(const struct dist_config *cfg, struct eng_error *err);
/* The same rules with world_size >= min_world: the backends' open takes a
 * group of one (min_world 1: tests, a GPU smoke test); a group the daemon
 * forms has at least 2 ranks (dist_config_check). */
int dist_config_check_min(const struct dist_config *cfg, int min_world, struct eng_error *err);

/* The checks every backend's collective makes first, one rule for all:
 * a group that is not broken (-ENOTCONN), count >= 0, a known dtype (t
 * as an int: a C caller may pass any), and count elements times `slices`
 * within INT64_MAX bytes (-EINVAL); *ret_bytes (may be NULL) gets them.
 * Also the failure tests' hook: ENGINED_TEST_DIST_EXIT_AT="op:N" kills
 * the process (SIGKILL) as it enters its N-th collective named op. */
int dist_call_check(const struct dist *d, const char *op, int64_t count, int t,
		    size_t slices, size_t *ret_bytes, struct eng_error *err);
/* A broadcast's root: in [0, world_size) (-EINVAL). */
int dist_root_check(const struct dist *d, const char *op, int root, struct eng_error *err);
/* Every check of a collective on buf[count] with a root (broadcast,
 * reduce): dist_call_check, the root, and a buf (NULL only with count 0).
 * 0: go on, with *ret_bytes; 1: nothing to do (count 0); else the error. */
int dist_rooted_check(const struct dist *d, const char *op, const void *buf, int64_t count,
		      int t, int root, size_t *ret_bytes, struct eng_error *err);

/* Bytes of one element of t. */
static inline size_t dist_dtype_size(enum dist_dtype t)
{
	return t == DIST_F64 ? 8 : 4;
}

#endif
