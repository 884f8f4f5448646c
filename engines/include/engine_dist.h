/* engine_dist.h — the public half of the engine's data-parallel groups:
 * a group's id and the configuration an engine joins its group with
 * (engine_config.dist, engine_group_create). The collectives themselves
 * are private to the engine library (engines/dist/dist.h).
 */
#ifndef ENGINED_ENGINE_DIST_H
#define ENGINED_ENGINE_DIST_H

#include <stddef.h>
#include <stdint.h>

/* NCCL_UNIQUE_ID_BYTES; a Gloo id is shorter. */
#define DIST_GROUP_ID_MAX 128
#define DIST_MAX_WORLD 4096

struct dist_group_id {
	uint8_t bytes[DIST_GROUP_ID_MAX];
	size_t len;
};

struct dist_config {
	int rank, world_size;          /* 0 <= rank < world_size <= DIST_MAX_WORLD */
	struct dist_group_id id;
	double timeout_s;              /* > 0: every open and collective */
	/* Gloo: the FileStore root every rank reaches (same host, or a shared
	 * file system); the group's store is root/<hex of the id>. */
	const char *store_root;
	/* Gloo: the address this rank's TCP pairs listen on (NULL: the host
	 * name's address). */
	const char *host;
	/* NCCL: the CUDA stream (cudaStream_t) the collectives are ordered on,
	 * and the CUDA device ordinal. */
	void *stream;
	int cuda_device;
	/* The engine's, not the backend's: the gradient bucket of a
	 * ForwardBackward that reduces during its backward pass
	 * (native_grad_sync.c), in bytes; 0 = DIST_BUCKET_DEFAULT, else in
	 * [DIST_BUCKET_MIN, DIST_BUCKET_MAX]. */
	int64_t bucket_bytes;
	/* The engine's: what the ranks shard (engine.proto DistConfig): 1
	 * the AdamW moments (ZeRO-1), 2 the gradients too, 3 the parameters
	 * too; 0 = not given (1). dist_zero_stage_check is the rule. */
	int zero_stage;
};

struct eng_error;

/* The rule on a given dist.zero_stage: 1, 2 or 3 (-EINVAL naming the
 * field; engines/dist/dist_table.c). A config's 0 means "not given" (1);
 * a client's explicit 0 is checked here by whoever reads the wire. */
int dist_zero_stage_check(int zero_stage, struct eng_error *err);

#define DIST_BUCKET_DEFAULT (INT64_C(25) << 20)   /* torch DDP's bucket_cap_mb */
#define DIST_BUCKET_MIN INT64_C(1024)
#define DIST_BUCKET_MAX (INT64_C(1) << 32)

#endif
