/* dist_table.c — the collective backends built into this binary, found by
 * the device they serve, and the one check of a group's configuration.
 *
 * As in the device table: each entry is defined either by its backend
 * (engines/dist/gloo/, engines/dist/nccl/) or by a stub (gloo_stub.c,
 * nccl_stub.c) whose name is NULL, and NULL entries are skipped.
 */
#include "dist/dist.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"

static const struct dist_ops *const backends[] = {
	&gloo_dist_ops,
	&nccl_dist_ops,
};

#define N_BACKENDS (sizeof(backends) / sizeof(backends[0]))

const struct dist_ops *dist_for_device(const char *device)
{
	if (!device)
		return NULL;
	for (size_t i = 0; i < N_BACKENDS; i++)
		if (backends[i]->name && strcmp(backends[i]->device, device) == 0)
			return backends[i];
	return NULL;
}

/* At most "gloo,nccl". */
static char names[64];
static pthread_once_t names_once = PTHREAD_ONCE_INIT;

static void build_names(void)
{
	size_t len = 0;

	for (size_t i = 0; i < N_BACKENDS; i++) {
		const char *n = backends[i]->name;
		size_t nl = n ? strlen(n) : 0;

		if (!n || len + nl + 2 > sizeof(names))
			continue;
		if (len)
			names[len++] = ',';
		memcpy(names + len, n, nl);
		len += nl;
	}
	names[len] = '\0';
}

const char *dist_names(void)
{
	(void)pthread_once(&names_once, build_names);
	return names;
}

int dist_backend_check(const char *field, const char *device, const struct dist_ops **ret,
		       struct eng_error *err)
{
	const struct dist_ops *ops = dist_for_device(device);

	if (!ops)
		return eng_fail(err, -ENODEV, "%s: no collective backend for device %s in this "
				"build (built: %s)", field, device ? device : "?",
				dist_names()[0] ? dist_names() : "none");
	if (ret)
		*ret = ops;
	return 0;
}

int dist_world_size_check(const char *field, int world_size, int min_world,
			  struct eng_error *err)
{
	if (world_size < min_world || world_size > DIST_MAX_WORLD)
		return eng_fail(err, -EINVAL, "%s: %d, must be in [%d, %d]", field, world_size,
				min_world, DIST_MAX_WORLD);
	return 0;
}

int dist_group_id_check(const struct dist_group_id *id, bool required, struct eng_error *err)
{
	if ((required && id->len == 0) || id->len > DIST_GROUP_ID_MAX)
		return eng_fail(err, -EINVAL, "dist.group_id: %zu bytes, must be %d to %d (the "
				"id CreateGroup returned)", id->len, required ? 1 : 0,
				DIST_GROUP_ID_MAX);
	return 0;
}

int dist_zero_stage_check(int zero_stage, struct eng_error *err)
{
	if (zero_stage < 1 || zero_stage > 3)
		return eng_fail(err, -EINVAL, "dist.zero_stage: %d, must be 1 (the AdamW moments "
				"sharded, the default), 2 (and the gradients) or 3 (and the "
				"parameters)", zero_stage);
	return 0;
}

int dist_config_check(const struct dist_config *cfg, struct eng_error *err)
{
	return dist_config_check_min(cfg, 2, err);
}

int dist_config_check_min(const struct dist_config *cfg, int min_world, struct eng_error *err)
{
	int rc;

	if (!cfg)
		return eng_fail(err, -EINVAL, "dist: no config");
	rc = dist_world_size_check("dist.world_size", cfg->world_size, min_world, err);
	if (rc)
		return rc;
	if (cfg->rank < 0 || cfg->rank >= cfg->world_size)
		return eng_fail(err, -EINVAL, "dist.rank: %d, must be in [0, %d)", cfg->rank,
				cfg->world_size);
	if (!(cfg->timeout_s > 0) || cfg->timeout_s > 86400)
		return eng_fail(err, -EINVAL, "dist.timeout_s: %g, must be in (0, 86400]",
				cfg->timeout_s);
	rc = dist_group_id_check(&cfg->id, true, err);
	if (rc)
		return rc;
	if (cfg->bucket_bytes != 0 && (cfg->bucket_bytes < DIST_BUCKET_MIN ||
				       cfg->bucket_bytes > DIST_BUCKET_MAX))
		return eng_fail(err, -EINVAL, "dist.bucket_bytes: %lld, must be 0 (default %lld) "
				"or in [%lld, %lld]", (long long)cfg->bucket_bytes,
				(long long)DIST_BUCKET_DEFAULT, (long long)DIST_BUCKET_MIN,
				(long long)DIST_BUCKET_MAX);
	return cfg->zero_stage ? dist_zero_stage_check(cfg->zero_stage, err) : 0;
}

/* ENGINED_TEST_DIST_EXIT_AT="op:N", for the failure tests (as the CPU
 * device's ENGINED_CPU_FAIL_AT_ALLOC): the process kills itself (SIGKILL,
 * its sockets closed by the kernel) on entering its N-th collective named
 * op, counted from 0, so that a test kills a rank inside a given
 * collective deterministically rather than by timing. */
static char fault_op[32];
static long fault_at = -1;
static atomic_long fault_seen;
static pthread_once_t fault_once = PTHREAD_ONCE_INIT;

static void fault_read(void)
{
	const char *e = getenv("ENGINED_TEST_DIST_EXIT_AT");
	const char *colon = e ? strchr(e, ':') : NULL;

	if (!colon || colon == e || (size_t)(colon - e) >= sizeof(fault_op))
		return;
	memcpy(fault_op, e, (size_t)(colon - e));
	fault_at = atol(colon + 1);
}

static void fault_point(const char *op)
{
	(void)pthread_once(&fault_once, fault_read);
	if (fault_at < 0 || strcmp(op, fault_op) != 0 ||
	    atomic_fetch_add(&fault_seen, 1) != fault_at)
		return;
	fprintf(stderr, "engined: ENGINED_TEST_DIST_EXIT_AT: killed at %s %ld\n", op, fault_at);
	raise(SIGKILL);
}

int dist_call_check(const struct dist *d, const char *op, int64_t count, int t,
		    size_t slices, size_t *ret_bytes, struct eng_error *err)
{
	size_t bytes = 0;

	fault_point(op);
	if (!d)
		return eng_fail(err, -EINVAL, "dist %s: no group", op);
	if (d->broken)
		return eng_fail(err, -ENOTCONN, "dist %s: the group was broken by an earlier "
				"failure", op);
	if (count < 0)
		return eng_fail(err, -EINVAL, "dist %s: count %lld < 0", op, (long long)count);
	if (t != DIST_F32 && t != DIST_F64)
		return eng_fail(err, -EINVAL, "dist %s: unknown dtype %d", op, t);
	if (!ck_mul_size((size_t)count, dist_dtype_size((enum dist_dtype)t), &bytes) ||
	    !ck_mul_size(bytes, slices, &bytes) || bytes > (size_t)INT64_MAX)
		return eng_fail(err, -EINVAL, "dist %s: count %lld is too large", op,
				(long long)count);
	if (ret_bytes)
		*ret_bytes = bytes;
	return 0;
}

int dist_root_check(const struct dist *d, const char *op, int root, struct eng_error *err)
{
	if (root < 0 || root >= d->world_size)
		return eng_fail(err, -EINVAL, "dist %s: root %d, must be in [0, %d)", op, root,
				d->world_size);
	return 0;
}

int dist_rooted_check(const struct dist *d, const char *op, const void *buf, int64_t count,
		      int t, int root, size_t *ret_bytes, struct eng_error *err)
{
	int r = dist_call_check(d, op, count, t, 1, ret_bytes, err);

	if (r == 0)
		r = dist_root_check(d, op, root, err);
	if (r == 0 && count == 0)
		return 1;
	if (r == 0 && !buf)
		r = eng_fail(err, -EINVAL, "dist %s: buf is NULL", op);
	return r;
}
