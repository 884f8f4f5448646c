/* group.c — CreateGroup: a new data-parallel group id on rank 0's daemon
 * (docs/DISTRIBUTED.md). The id comes from the collective backend of the
 * group's device (engines/dist/): NCCL's unique id, whose bootstrap root
 * listens in this process, or a Gloo group in the FileStore root
 * ([dist] store_root). Each rank's Initialize then joins with it. */
#include "handlers.h"

#include "engined/v1/engine.pb-c.h"
#include "job.h"

static const char *group_device(struct daemon *d, const Engined__V1__CreateGroupRequest *q)
{
	if (q->device && q->device[0])
		return q->device;
	return d->cfg.default_device ? d->cfg.default_device : "cpu";
}

int h_validate_create_group(struct daemon *d, struct job *j, struct eng_error *err)
{
	const Engined__V1__CreateGroupRequest *q = (const void *)j->req;
	return engine_group_check(group_device(d, q), q->world_size, err);
}

int h_run_create_group(struct daemon *d, struct job *j, struct eng_error *err)
{
	const Engined__V1__CreateGroupRequest *q = (const void *)j->req;
	Engined__V1__CreateGroupResponse resp = ENGINED__V1__CREATE_GROUP_RESPONSE__INIT;
	struct dist_config cfg = {
		.rank = 0, .world_size = q->world_size,
		.timeout_s = (double)d->cfg.dist_timeout_ms / 1000.0,
		.store_root = d->cfg.dist_store_root, .host = d->cfg.dist_host,
	};
	struct dist_group_id id = { .len = 0 };
	const char *backend = "";
	int r;

	r = engine_group_create(group_device(d, q), &cfg, &id, &backend, err);
	if (r < 0)
		return r;
	resp.group_id.data = id.bytes;
	resp.group_id.len = id.len;
	resp.backend = (char *)backend;
	return job_set_reply(j, &resp.base);
}
