/* native_place.c — placement of the native engine's state families
 * (parameters, gradients, Adam moments) between device and host memory:
 * the `to()` of verl's engine interface, which the mode context in
 * engine.c drives for offload.
 *
 * On devices with their own memory, moving a family to the host copies it
 * into host memory from the device's host_alloc (page-locked on CUDA) and
 * frees the device allocation, so the device memory really comes back;
 * moving the model also drops the activation arena and micro-batch
 * buffers (they are re-made on the next call). On host-memory devices only
 * the placement flags change. A failed move (-ENOMEM) leaves the family
 * where it was; the flags always say where each family is. */
#include "native_engine.h"

#include <string.h>

/* The bytes of family f's allocation: every parameter, or this rank's
 * slice of the moments in a data-parallel group (native_dist.c). */
static size_t family_bytes(const struct native *n, enum native_fam f)
{
	return (size_t)native_family_len(n, f) * sizeof(float);
}

int native_families_alloc(struct native *n, struct eng_error *err)
{
	int rc;

	for (int f = 0; f < FAM_COUNT; f++) {
		size_t bytes = family_bytes(n, f);

		n->fam[f].dev = n->dev->ops->alloc(n->dev, bytes ? bytes : 1);
		if (!n->fam[f].dev)
			return eng_fail(err, -ENOMEM,
					"parameters: cannot allocate %zu MiB for %lld parameters",
					bytes >> 20, (long long)n->table.total);
		/* Everything but the parameters starts at 0, and so does the
		 * parameters' padding past the table in a group. */
		size_t skip = f == FAM_PARAMS && !native_shard_params(n) ?
			      (size_t)n->table.total * sizeof(float) : 0;

		rc = bytes > skip ? n->dev->ops->memset0(n->dev, (char *)n->fam[f].dev + skip,
							 bytes - skip) : 0;
		if (rc)
			return eng_fail(err, rc, "device: memset failed");
	}
	return 0;
}

void native_families_free(struct native *n)
{
	for (int f = 0; f < FAM_COUNT; f++) {
		n->dev->ops->free(n->dev, n->fam[f].dev);
		n->dev->ops->host_free(n->dev, n->fam[f].host);
		n->fam[f].dev = NULL;
		n->fam[f].host = NULL;
	}
}

static const char *family_name(enum native_fam f)
{
	static const char *const names[FAM_COUNT] = {
		"parameters", "gradients", "exp_avg", "exp_avg_sq",
	};

	return names[f];
}

static int move(struct native *n, enum native_fam f, bool to_device,
		struct eng_error *err)
{
	const struct device_ops *o = n->dev->ops;
	struct native_family *F = &n->fam[f];
	size_t bytes = family_bytes(n, f);
	void *p;
	int rc;

	if (n->dev->host_memory)
		return 0;
	if (to_device && !F->dev) {
		p = o->alloc(n->dev, bytes ? bytes : 1);
		if (!p)
			return eng_fail(err, -ENOMEM, "to: out of device memory for %s (%zu MiB)",
					family_name(f), bytes >> 20);
		rc = o->copy_h2d(n->dev, p, F->host, bytes);
		if (rc) {
			o->free(n->dev, p);
			return eng_fail(err, rc, "to: copy of %s to the device failed",
					family_name(f));
		}
		o->host_free(n->dev, F->host);
		F->dev = p;
		F->host = NULL;
	} else if (!to_device && !F->host) {
		p = o->host_alloc(n->dev, bytes ? bytes : 1);
		if (!p)
			return eng_fail(err, -ENOMEM, "to: out of host memory for %s (%zu MiB)",
					family_name(f), bytes >> 20);
		rc = o->copy_d2h(n->dev, p, F->dev, bytes);
		if (rc == 0)
			rc = o->sync(n->dev);
		if (rc) {
			o->host_free(n->dev, p);
			return eng_fail(err, rc, "to: copy of %s to the host failed",
					family_name(f));
		}
		o->free(n->dev, F->dev);
		F->dev = NULL;
		F->host = p;
	}
	return 0;
}

void native_rebind(struct native *n)
{
	float *p = n->fam[FAM_PARAMS].dev ? n->fam[FAM_PARAMS].dev : n->fam[FAM_PARAMS].host;
	float *g = n->fam[FAM_GRADS].dev ? n->fam[FAM_GRADS].dev : n->fam[FAM_GRADS].host;

	if (n->lora) {
		/* an adapter: its matrices; the device's region is its base's */
		native_adapter_rebind(n);
		return;
	}
	if (!native_shard_params(n))
		model_weights_bind(&n->table, &n->cfg, p, &n->model.w);
	if (n->group.shard)   /* ZeRO-2/3: gradients (and weights) in the part buffers */
		native_shard_bind(n);
	if (n->frozen) {
		/* no gradients: llama.c reads none (model.frozen) */
		memset(n->gl, 0, n->cfg.num_layers * sizeof(*n->gl));
		memset(&n->model.g, 0, sizeof(n->model.g));
		n->model.g.layers = n->gl;
	} else if (!native_shard_grads(n)) {
		model_weights_bind(&n->table, &n->cfg, g, &n->model.g);
	}
	/* the region where the device may cache derived copies (bf16) */
	n->dev->param_base = native_shard_params(n) ? NULL : n->fam[FAM_PARAMS].dev;
	n->dev->param_bytes = n->dev->param_base ? n->table.total * sizeof(float) : 0;
	n->dev->param_version++;
}

static void drop_activations(struct native *n);

int native_to(struct engine *e, bool to_device, bool model, bool optimizer,
	      bool grad, struct eng_error *err)
{
	struct native *n = engine_impl(e);
	int rc = 0;

	if (model && (rc = move(n, FAM_PARAMS, to_device, err)) == 0)
		n->place.model = to_device;
	if (rc == 0 && grad && (rc = move(n, FAM_GRADS, to_device, err)) == 0)
		n->place.grad = to_device;
	if (rc == 0 && optimizer && (rc = move(n, FAM_EXP_AVG, to_device, err)) == 0) {
		rc = move(n, FAM_EXP_AVG_SQ, to_device, err);
		/* the two moments travel together: undo the first on failure */
		if (rc == 0)
			n->place.optimizer = to_device;
		else
			(void)move(n, FAM_EXP_AVG, !to_device, NULL);
	}
	if (!n->dev->host_memory) {
		/* the flags follow the memory, even after a partial failure */
		n->place.model = n->fam[FAM_PARAMS].dev != NULL;
		n->place.grad = n->fam[FAM_GRADS].dev != NULL;
		n->place.optimizer = n->fam[FAM_EXP_AVG].dev && n->fam[FAM_EXP_AVG_SQ].dev;
	}
	if (model && !to_device && !n->dev->host_memory)
		drop_activations(n);
	native_rebind(n);
	return rc;
}

static void drop_activations(struct native *n)
{
	if (!n->lora)
		llama_drop_activations(&n->model);
	native_io_release(n);
}

int native_zero_grads(struct native *n, struct eng_error *err)
{
	struct native_family *G = &n->fam[FAM_GRADS];
	int rc;

	if (G->host) {
		memset(G->host, 0, family_bytes(n, FAM_GRADS));
	} else {
		rc = n->dev->ops->memset0(n->dev, G->dev, family_bytes(n, FAM_GRADS));
		if (rc)
			return eng_fail(err, rc, "device: zeroing gradients failed");
	}
	n->grad_calls = n->grad_tokens = 0;
	n->group.grads_reduced = false;
	return 0;
}

int native_zero_grad(struct engine *e, struct eng_error *err)
{
	return native_zero_grads(engine_impl(e), err);
}

/* What family_read / family_write move: the table's parameters or
 * gradients (not the padding of a group), or this rank's slice of a
 * sharded family (the moments; with ZeRO-2/3 the gradients; with ZeRO-3
 * the parameters). */
static size_t meaningful_bytes(const struct native *n, enum native_fam f)
{
	return (size_t)(native_family_sliced(n, f) ? n->group.shard_len : n->table.total) *
	       sizeof(float);
}

float *native_family_host_ptr(struct native *n, enum native_fam f)
{
	if (n->fam[f].host)
		return n->fam[f].host;
	return n->dev->host_memory ? n->fam[f].dev : NULL;
}

int native_family_read(struct native *n, enum native_fam f, const float **ret,
		       float **ret_owned, struct eng_error *err)
{
	float *h = native_family_host_ptr(n, f);
	int rc;

	*ret_owned = NULL;
	if (h) {
		*ret = h;
		return 0;
	}
	h = n->dev->ops->host_alloc(n->dev, meaningful_bytes(n, f));
	if (!h)
		return eng_fail(err, -ENOMEM, "%s: out of host memory for staging", family_name(f));
	rc = n->dev->ops->copy_d2h(n->dev, h, n->fam[f].dev, meaningful_bytes(n, f));
	if (rc == 0)
		rc = n->dev->ops->sync(n->dev);
	if (rc) {
		n->dev->ops->host_free(n->dev, h);
		return eng_fail(err, rc, "%s: copy from device failed", family_name(f));
	}
	*ret = h;
	*ret_owned = h;
	return 0;
}

int native_family_write(struct native *n, enum native_fam f, const float *host,
			struct eng_error *err)
{
	float *h = native_family_host_ptr(n, f);
	int rc;

	if (h) {
		if (h != host)
			memcpy(h, host, meaningful_bytes(n, f));
		return 0;
	}
	rc = n->dev->ops->copy_h2d(n->dev, n->fam[f].dev, host, meaningful_bytes(n, f));
	if (rc == 0)
		rc = n->dev->ops->sync(n->dev);
	return rc ? eng_fail(err, rc, "%s: copy to device failed", family_name(f)) : 0;
}

int native_require_placed(struct native *n, bool grads, bool optimizer,
			  struct eng_error *err)
{
	if (!n->place.model)
		return eng_fail(err, -EALREADY,
				"placement: parameters are offloaded to the host; "
				"ToDevice(model) or SetMode first");
	if (grads && !n->place.grad)
		return eng_fail(err, -EALREADY,
				"placement: gradients are offloaded to the host; "
				"ToDevice(grad) or SetMode(TRAIN) first");
	if (optimizer && !n->place.optimizer)
		return eng_fail(err, -EALREADY,
				"placement: optimizer state is offloaded to the host; "
				"ToDevice(optimizer) or SetMode(TRAIN) first");
	return 0;
}
