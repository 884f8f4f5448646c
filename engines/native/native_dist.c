/* native_dist.c — the native engine in a data-parallel group of W ranks
 * (docs/DISTRIBUTED.md), with a ZeRO-1 optimizer: every rank holds the
 * full parameters and gradients, and the AdamW moments of its slice
 * [shard_off, shard_off + shard_len) of the flat parameter table, where
 * shard_len = ceil(total / W). An OptimizerStep (native_step.c's one
 * step, which calls the group's hooks defined here)
 *   1. reduce-scatters the gradients (sum): rank r gets the sum of slice r;
 *   2. all-reduces the sum of squares of the slices: the global norm of the
 *      summed gradient is reported and clipped against;
 *   3. runs AdamW on its slice;
 *   4. all-gathers the parameter slices, so that every rank ends with the
 *      same parameters.
 * Each rank's loss is scaled by dp_size / global counts (the loss
 * library's global_num_tokens, global_batch_size, dp_size, as verl does),
 * so that the MEAN of the ranks' gradients is the gradient of the whole
 * batch. The mean is taken where the gradients are made, not at the step:
 * the loss writes its gradients times 1/W (native_grad_scale, in double
 * before their one rounding to float), so with dp_size = W a rank's
 * gradients are what one engine computes for the same tokens with dp_size
 * 1, and the step's sum is the whole batch's gradient with no other
 * rounding than the sum's order. (Scaling by W in the loss and dividing
 * by W at the step was exact only for W a power of two: at W = 3 the
 * roundings of x3 and /3 moved elements whose gradients are near AdamW's
 * eps by up to ~0.05 lr after 3 steps.)
 * The collectives come from engines/dist (Gloo on the CPU, NCCL on CUDA).
 *
 * Failure: a collective that fails breaks the group (dist.h). A failure in
 * steps 1-2 leaves the parameters and moments as they were and zeroes the
 * gradients (they were partly reduced); one in step 4 leaves this rank's
 * slice updated and the others as far as they arrived: the ranks may then
 * disagree, and GetStatus says the group is broken (re-initialize or load
 * a checkpoint). */
#include "native_engine.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"

double native_grad_scale(const struct native *n)
{
	return n->group.dist && n->group.dist->world_size > 1 ?
	       1.0 / (double)n->group.dist->world_size : 1.0;
}

int64_t native_family_len(const struct native *n, enum native_fam f)
{
	if (n->frozen && f != FAM_PARAMS)
		return 0;
	if (f == FAM_EXP_AVG || f == FAM_EXP_AVG_SQ ||
	    (f == FAM_GRADS && native_shard_grads(n)) ||
	    (f == FAM_PARAMS && native_shard_params(n)))
		return n->group.shard_len;
	return n->group.padded_total;
}

bool native_family_sliced(const struct native *n, enum native_fam f)
{
	return native_family_len(n, f) != n->group.padded_total;
}

/* Sum a host double over the ranks (through a device scratch where the
 * device has its own memory). */
static int sum_scalar(struct native *n, double *v, struct eng_error *err)
{
	const struct device_ops *o = n->dev->ops;
	double *d;
	int rc;

	if (n->dev->host_memory)
		return n->group.dist->ops->all_reduce(n->group.dist, v, 1, DIST_F64, err);
	d = o->alloc(n->dev, sizeof(*d));
	if (!d)
		return eng_fail(err, -ENOMEM, "dist: out of device memory");
	rc = o->copy_h2d(n->dev, d, v, sizeof(*d));
	if (rc == 0)
		rc = o->sync(n->dev);
	if (rc == 0)
		rc = n->group.dist->ops->all_reduce(n->group.dist, d, 1, DIST_F64, err);
	if (rc == 0 && (rc = o->copy_d2h(n->dev, v, d, sizeof(*d))) == 0)
		rc = o->sync(n->dev);
	o->free(n->dev, d);
	return rc < 0 ? eng_fail(err, rc, "dist: scalar reduction failed") : 0;
}

/* Every rank must hold the same model: compare (parameters, tensors,
 * value model) across the group with an all-gather of small integers
 * (exact in F64). */
static int check_same_model(struct native *n, struct eng_error *err)
{
	enum { K = 3 };
	int W = n->group.dist->world_size, rc;
	double mine[K] = { (double)n->table.total, (double)n->table.count, n->value_model };
	double *all = calloc((size_t)W * K, sizeof(double));

	if (!all)
		return eng_fail(err, -ENOMEM, "dist: out of memory");
	rc = native_dist_gather_host(n, all, mine, sizeof(mine), err);
	for (int r = 0; r < W && rc == 0; r++)
		if (memcmp(all + (size_t)r * K, mine, sizeof(mine)))
			rc = eng_fail(err, -EINVAL, "dist: rank %d built another model (%.0f "
				      "parameters in %.0f tensors%s) than rank %d (%lld in %lld%s)",
				      r, all[r * K], all[r * K + 1],
				      all[r * K + 2] != 0 ? ", value model" : "", n->group.dist->rank,
				      (long long)n->table.total, (long long)n->table.count,
				      n->value_model ? ", value model" : "");
	free(all);
	return rc;
}

int native_dist_shape(struct native *n, const struct engine_init_config *cfg,
		      struct eng_error *err)
{
	int64_t W = cfg->dist.world_size > 1 ? cfg->dist.world_size : 1;

	n->group.shard_len = (n->table.total + W - 1) / W;
	n->group.shard_off = W > 1 ? (int64_t)cfg->dist.rank * n->group.shard_len : 0;
	n->group.zero_stage = W > 1 && cfg->dist.zero_stage ? cfg->dist.zero_stage : 1;
	if (!ck_mul_i64(n->group.shard_len, W, &n->group.padded_total))
		return eng_fail(err, -EINVAL, "dist: %lld parameters over %lld ranks overflow",
				(long long)n->table.total, (long long)W);
	return 0;
}

int native_dist_join(struct native *n, const struct engine_init_config *cfg,
		     struct eng_error *err)
{
	const struct dist_ops *ops;
	struct dist_config dc = cfg->dist;
	int rc;

	if (dc.world_size <= 1)
		return 0;
	rc = dist_backend_check("dist", cfg->device, &ops, err);
	if (rc == 0)
		rc = ops->open(&dc, &n->group.dist, err);
	if (rc) {
		n->group.dist = NULL;
		return rc;
	}
	n->group.bucket_bytes = dc.bucket_bytes ? dc.bucket_bytes : DIST_BUCKET_DEFAULT;
	return check_same_model(n, err);
}

void native_dist_adapter_shape(struct native *n, const struct native *base)
{
	int64_t W = base->group.dist ? base->group.dist->world_size : 1;

	n->group.dist = base->group.dist;      /* the base's: closed with it */
	n->group.bucket_bytes = base->group.bucket_bytes;
	n->group.zero_stage = 1;
	n->group.shard_len = (n->table.total + W - 1) / W;
	n->group.shard_off = W > 1 ? (int64_t)base->group.dist->rank * n->group.shard_len : 0;
	n->group.padded_total = n->group.shard_len * W;   /* W <= DIST_MAX_WORLD: no overflow */
}

int native_dist_adapter_join(struct native *n, int rc, struct eng_error *err)
{
	if (!n->group.dist)
		return rc;
	rc = native_dist_agree(n, rc, "CreateAdapter", err);
	if (rc == 0)
		rc = check_same_model(n, err);
	if (rc == 0)
		rc = n->dev->ops->sync(n->dev);
	/* Not native_dist_sync_params: the base's derived copies (the device's
	 * param_version) do not change with an adapter. */
	if (rc == 0)
		rc = n->group.dist->ops->broadcast(n->group.dist, n->fam[FAM_PARAMS].dev,
						   n->table.total, DIST_F32, 0, err);
	return rc;
}

int native_dist_reduce_now(struct native *n, struct eng_error *err)
{
	float *g = n->fam[FAM_GRADS].dev;
	const struct device_ops *o = n->dev->ops;
	int64_t off = n->group.shard_off, len = n->group.shard_len;
	int rc = o->sync(n->dev);

	if (rc == 0)
		rc = n->group.dist->ops->reduce_scatter(n->group.dist, g + off, g, len, DIST_F32,
							err);
	if (rc == 0 && off > 0)
		rc = o->memset0(n->dev, g, (size_t)off * sizeof(float));
	if (rc == 0 && off + len < n->group.padded_total)
		rc = o->memset0(n->dev, g + off + len,
				(size_t)(n->group.padded_total - off - len) * sizeof(float));
	return rc < 0 && !err->code ? eng_fail(err, rc, "gradient reduction failed") : rc;
}

int native_dist_sync_params(struct native *n, struct eng_error *err)
{
	int rc;

	if (!n->group.dist)
		return 0;
	rc = n->dev->ops->sync(n->dev);
	if (rc == 0)
		rc = n->group.dist->ops->broadcast(n->group.dist, n->fam[FAM_PARAMS].dev, n->table.total,
					     DIST_F32, 0, err);
	if (rc == 0)
		n->dev->param_version++;
	return rc;
}

int native_dist_reduce_grads(struct native *n, struct eng_error *err)
{
	float *g = n->fam[FAM_GRADS].dev;
	double unreduced = n->group.grads_reduced ? 0 : 1;
	int rc;

	if (native_shard_grads(n))
		return 0;   /* ZeRO-2/3: each backward reduced them to their holders */
	rc = n->dev->ops->sync(n->dev);
	/* Skipped when a reducing ForwardBackward left the sums in place on
	 * every rank: a rank's plain calls after it (their number may differ
	 * between ranks) make it reduce again, so the ranks agree first. */
	if (rc == 0)
		rc = sum_scalar(n, &unreduced, err);
	if (rc == 0 && unreduced > 0)
		rc = n->group.dist->ops->reduce_scatter(n->group.dist, g + n->group.shard_off, g, n->group.shard_len,
						  DIST_F32, err);
	n->group.grads_reduced = false;
	if (rc)
		(void)native_zero_grads(n, NULL);
	return rc;
}

int native_dist_sum_norm(struct native *n, double *sumsq, struct eng_error *err)
{
	int rc = sum_scalar(n, sumsq, err);

	if (rc)
		(void)native_zero_grads(n, NULL);
	return rc;
}

int native_dist_gather_params(struct native *n, struct eng_error *err)
{
	float *g = n->fam[FAM_GRADS].dev, *p = n->fam[FAM_PARAMS].dev;
	int rc;

	if (native_shard_params(n)) {
		native_shard_invalidate(n);   /* ZeRO-3: the slices are all there is */
		return 0;
	}
	if ((rc = n->dev->ops->sync(n->dev)) == 0)
		rc = n->group.dist->ops->all_gather(n->group.dist, p, p + n->group.shard_off, n->group.shard_len,
					      DIST_F32, err);
	/* AdamW zeroed this rank's slice of the gradients; the rest (the other
	 * ranks' slices, reduced there) is dropped here (ZeRO-2: there is no
	 * rest). */
	if (native_shard_grads(n))
		return rc;
	if (n->group.shard_off > 0)
		(void)n->dev->ops->memset0(n->dev, g, (size_t)n->group.shard_off * sizeof(float));
	if (n->group.shard_off + n->group.shard_len < n->group.padded_total)
		(void)n->dev->ops->memset0(n->dev, g + n->group.shard_off + n->group.shard_len,
					   (size_t)(n->group.padded_total - n->group.shard_off - n->group.shard_len) *
					   sizeof(float));
	return rc;
}

/* The collective `op` on host buffers: directly on a host-memory device,
 * else through a device scratch of `dev_bytes` (the buffers' words copied
 * in at in_off, the result out from out_off). Collectives move words bit
 * for bit (F32 with no arithmetic). */
enum host_op { HOST_BCAST, HOST_GATHER };

static int host_collective(struct native *n, enum host_op op, void *out, const void *in,
			   size_t in_bytes, int root, struct eng_error *err)
{
	struct dist *d = n->group.dist;
	const struct device_ops *o = n->dev->ops;
	size_t out_bytes = op == HOST_GATHER ? in_bytes * (size_t)d->world_size : in_bytes;
	int64_t words = (int64_t)(in_bytes / 4);
	char *dv;
	int rc;

	if (n->dev->host_memory)
		return op == HOST_BCAST
		       ? d->ops->broadcast(d, out, words, DIST_F32, root, err)
		       : d->ops->all_gather(d, out, in, words, DIST_F32, err);
	/* [out_bytes of result | in_bytes of input] */
	dv = o->alloc(n->dev, out_bytes + in_bytes);
	if (!dv)
		return eng_fail(err, -ENOMEM, "dist: out of device memory (%zu bytes)",
				out_bytes + in_bytes);
	rc = o->copy_h2d(n->dev, op == HOST_BCAST ? dv : dv + out_bytes,
			 op == HOST_BCAST ? out : in, in_bytes);
	if (rc == 0 && (rc = o->sync(n->dev)) == 0)
		rc = op == HOST_BCAST
		     ? d->ops->broadcast(d, dv, words, DIST_F32, root, err)
		     : d->ops->all_gather(d, dv, dv + out_bytes, words, DIST_F32, err);
	if (rc == 0 && (rc = o->copy_d2h(n->dev, out, dv, out_bytes)) == 0)
		rc = o->sync(n->dev);
	o->free(n->dev, dv);
	return rc < 0 ? eng_fail(err, rc, "dist: %s failed", op == HOST_BCAST ? "broadcast"
				 : "all-gather") : 0;
}

int native_dist_bcast_host(struct native *n, void *buf, size_t bytes, int root,
			   struct eng_error *err)
{
	return host_collective(n, HOST_BCAST, buf, buf, bytes, root, err);
}

int native_dist_bcast_words(struct native *n, void *buf, size_t bytes, struct eng_error *err)
{
	return host_collective(n, HOST_BCAST, buf, buf, bytes, 0, err);
}

int native_dist_gather_host(struct native *n, void *all, const void *mine, size_t bytes,
			    struct eng_error *err)
{
	return host_collective(n, HOST_GATHER, all, mine, bytes, 0, err);
}

int native_dist_peer_code(int64_t rc)
{
	return rc < 0 && eng_strerror((int)rc)[1] != '?' ? (int)rc : -EIO;
}

int native_dist_agree(struct native *n, int rc, const char *what, struct eng_error *err)
{
	int W = n->group.dist->world_size, me = n->group.dist->rank, got;
	int64_t mine = rc, *all = calloc((size_t)W, sizeof(*all));

	if (!all) {
		/* No buffer to take part with: the peers time out in the
		 * exchange, and the group is broken. */
		n->group.dist->broken = true;
		return eng_fail(err, -ENOMEM, "%s: out of host memory for the group's agreement; "
				"the group is broken", what);
	}
	got = native_dist_gather_host(n, all, &mine, sizeof(mine), err);
	for (int r = 0; r < W && got == 0 && rc == 0; r++)
		if (all[r] && r != me)
			rc = eng_fail(err, native_dist_peer_code(all[r]), "%s failed on rank %d "
				      "(%s; its reply says why); nothing changed on any rank", what,
				      r, eng_strerror(native_dist_peer_code(all[r])));
	free(all);
	/* A local failure stays the answer (err has its message) also when
	 * the exchange failed too: a dead peer's broadcast is UNAVAILABLE,
	 * not the broken group's FAILED_PRECONDITION that followed it. */
	return rc ? rc : got;
}

void native_dist_leave(struct native *n)
{
	native_sync_stop(n);
	if (n->group.dist)
		n->group.dist->ops->close(n->group.dist);
	n->group.dist = NULL;
}
