/* native_params.c — the native engine's parameters as the engine API
 * shows them: views of each tensor (host-resident or staged), fp32 / bf16
 * / f16 copies, and the device's bf16 copy kept current or lent.
 */
#include "native_engine.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"

int64_t native_num_params(struct engine *e)
{
	return native_of(e)->table.count;
}

/* The parameters are in host memory, in the region where the device keeps
 * its bf16 copy of them. */
static bool bf16_copy_region(struct native *n)
{
	return native_family_host_ptr(n, FAM_PARAMS) &&
	       n->dev->param_base == n->fam[FAM_PARAMS].dev;
}

void native_fill_info(struct native *n, enum native_fam f, int64_t i,
		      struct engine_param_view *ret)
{
	const struct param_entry *p = &n->table.entries[i];
	const float *h = native_family_host_ptr(n, f);

	memset(ret, 0, sizeof(*ret));
	ret->name = p->name;
	ret->ndim = p->ndim;
	ret->shape[0] = p->shape[0];
	ret->shape[1] = p->shape[1];
	ret->numel = p->numel;
	if (native_family_sliced(n, f))
		h = NULL;   /* this rank's slice only: gathered by native_view */
	ret->host_resident = h != NULL;
	ret->host_data = h ? h + p->offset : NULL;
	if (h && f == FAM_PARAMS && n->dev->ops->params_bf16 && bf16_copy_region(n)) {
		const uint16_t *copy = n->dev->ops->params_bf16(n->dev);

		ret->host_bf16 = copy ? copy + p->offset : NULL;
	}
}

int native_param_info(struct engine *e, int64_t i, struct engine_param_view *ret)
{
	native_fill_info(native_of(e), FAM_PARAMS, i, ret);
	return 0;
}

/* A host-readable view of tensor i of family f: in place when the family is
 * host-readable, else staged (one tensor at a time) through n->stage. */
int native_view(struct native *n, enum native_fam f, int64_t i,
		struct engine_param_view *ret, struct eng_error *err)
{
	const struct param_entry *p = &n->table.entries[i];
	const float *h = native_family_host_ptr(n, f), *d = NULL;
	const float *src;
	bool sharded = native_family_sliced(n, f);

	if (sharded && f != FAM_PARAMS)
		return eng_fail(err, -ENOSYS, "%s: this rank holds a slice of it only", p->name);
	if (h && !sharded) {
		src = h + p->offset;
	} else {
		float *s = realloc(n->stage, p->numel * sizeof(float));
		int rc = 0;

		if (sharded)   /* a collective: before any local failure returns */
			rc = native_shard_tensor(n, i, &d, err);
		else
			d = n->fam[f].dev + p->offset;   /* not host-readable: on the device */

		if (rc)
			return rc;
		if (!s)
			return eng_fail(err, -ENOMEM, "%s: out of host memory", p->name);
		n->stage = s;
		rc = n->dev->ops->copy_d2h(n->dev, s, d, p->numel * sizeof(float));
		if (rc == 0)
			rc = n->dev->ops->sync(n->dev);
		if (rc)
			return eng_fail(err, rc, "%s: copy from device failed", p->name);
		src = s;
	}
	native_fill_info(n, f, i, ret);
	ret->host_data = src;
	return 0;
}

int native_param(struct engine *e, int64_t i, struct engine_param_view *ret,
		 struct eng_error *err)
{
	return native_view(native_of(e), FAM_PARAMS, i, ret, err);
}

int native_grad(struct engine *e, int64_t i, struct engine_param_view *ret,
		struct eng_error *err)
{
	int rc = native_refuse_frozen(native_of(e), "gradients", err);

	if (rc == 0)
		rc = native_refuse_sharded(native_of(e), 2, "gradients", err);
	return rc ? rc : native_view(native_of(e), FAM_GRADS, i, ret, err);
}

static int bf16_copy_possible(struct native *n, bool op, struct eng_error *err)
{
	int rc = native_refuse_sharded(n, 3, "the parameters' bf16 copy (ShareWeights)", err);

	if (rc)
		return rc;
	if (!op || !bf16_copy_region(n))
		return eng_fail(err, -ENOTSUP,
				"the parameters are not in host memory with a bf16 copy "
				"(device %s)", n->dev->ops->name);
	return 0;
}

int native_keep_params_bf16(struct engine *e, struct eng_error *err)
{
	struct native *n = native_of(e);
	int r = bf16_copy_possible(n, n->dev->ops->params_bf16_keep != NULL, err);

	if (r == 0 && (r = n->dev->ops->params_bf16_keep(n->dev)) < 0)
		return eng_fail(err, r, "the bf16 copy of the parameters: %s", strerror(-r));
	return r;
}

int native_lend_params_bf16(struct engine *e, struct engine_lent_file *ret,
			    struct eng_error *err)
{
	struct native *n = native_of(e);
	struct device_lent_file f;
	int r = bf16_copy_possible(n, n->dev->ops->params_bf16_lend != NULL, err);

	if (r < 0)
		return r;
	r = n->dev->ops->params_bf16_lend(n->dev, &f);
	if (r < 0)
		return eng_fail(err, r, "lending the bf16 copy of the parameters: %s",
				strerror(-r));
	ret->fd = f.fd;
	ret->bytes = (int64_t)f.bytes;
	ret->base = f.base;
	return 0;
}

int native_copy_out(struct native *n, const float *src, bool host, enum engine_dtype dtype,
		    int64_t count, void *dst, const char *name, struct eng_error *err)
{
	const struct device_ops *o = n->dev->ops;
	void *tmp;
	int rc;

	if (host) {
		if (dtype == ENGINE_DTYPE_F32)
			memcpy(dst, src, count * sizeof(float));
		else if (dtype == ENGINE_DTYPE_BF16)
			f32_to_bf16_n(src, dst, count);
		else
			f32_to_f16_n(src, dst, count);
		return 0;
	}
	if (dtype == ENGINE_DTYPE_F32) {
		rc = o->copy_d2h(n->dev, dst, src, count * sizeof(float));
		if (rc == 0)
			rc = o->sync(n->dev);
		return rc ? eng_fail(err, rc, "%s: copy from device failed", name) : 0;
	}
	tmp = native_dalloc(n, count * sizeof(uint16_t));
	if (!tmp)
		return eng_fail(err, -ENOMEM, "%s: out of device memory for conversion", name);
	rc = dtype == ENGINE_DTYPE_BF16 ? n->dev->k->to_bf16(n->dev, tmp, src, count)
					: n->dev->k->to_f16(n->dev, tmp, src, count);
	if (rc == 0)
		rc = o->copy_d2h(n->dev, dst, tmp, count * sizeof(uint16_t));
	if (rc == 0)
		rc = o->sync(n->dev);
	native_dfree(n, tmp);
	return rc ? eng_fail(err, rc, "%s: conversion failed", name) : 0;
}

int native_param_copy_of(struct native *n, int64_t i, enum engine_dtype dtype, int64_t start,
			 int64_t count, void *dst, struct eng_error *err)
{
	const struct param_entry *p = &n->table.entries[i];
	const float *h = native_family_host_ptr(n, FAM_PARAMS), *d;
	int rc;

	if (native_shard_params(n)) {
		rc = native_shard_tensor(n, i, &d, err);
		return rc ? rc : native_copy_out(n, d + start, false, dtype, count, dst, p->name,
						 err);
	}
	if (h)
		return native_copy_out(n, h + p->offset + start, true, dtype, count, dst, p->name,
				       err);
	return native_copy_out(n, n->fam[FAM_PARAMS].dev + p->offset + start, false, dtype,
			       count, dst, p->name, err);
}

/* Convert on the device when the parameters are there (into a scratch
 * allocation unless device memory is host memory), else on the host; then
 * copy the slice to dst. */
int native_param_copy(struct engine *e, int64_t i, enum engine_dtype dtype,
		      int64_t start, int64_t count, void *dst, struct eng_error *err)
{
	return native_param_copy_of(native_of(e), i, dtype, start, count, dst, err);
}
