/* native_adapter_views.c — an adapter's parameter views
 * (engine_adapter_set_view): its own A and B matrices, its base alone
 * under verl's base_layer names, or its base with every targeted weight
 * merged (W + scale B A), and a value model's score head the adapter's
 * own (PEFT's modules_to_save). The base's tensors are shown as the base shows
 * them (in place when host-resident, its bf16 copy included; gathered from
 * the ranks, one at a time, when a ZeRO-3 group shards them); a merged
 * weight is computed on the device into the adapter's merge buffer, one
 * tensor at a time, and is never host-resident. */
#include "native_engine.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Which layer's module a base tensor is the weight (or bias) of: its
 * module, or -1. */
static int base_module(const struct native *b, int64_t i, bool *ret_weight)
{
	const struct param_entry *p = &b->table.entries[i];
	char suffix[64];

	if (p->layer < 0)
		return -1;
	for (int m = 0; m < LORA_MODULES; m++)
		for (int k = 0; k < 2; k++) {
			size_t n = strlen(p->name), s;

			snprintf(suffix, sizeof(suffix), ".%s.%s", lora_module_name(m),
				 k ? "bias" : "weight");
			s = strlen(suffix);
			if (n > s && !strcmp(p->name + n - s, suffix)) {
				*ret_weight = !k;
				return m;
			}
		}
	return -1;
}

/* Base tensor i's name in the BASE view (verl's replace_lora_wrapper:
 * every projection, targeted or not). */
static void base_view_name(const struct native *b, int64_t i, char *buf, size_t cap)
{
	const char *name = b->table.entries[i].name, *dot = strrchr(name, '.');
	bool weight;

	if (base_module(b, i, &weight) < 0 || !dot)
		snprintf(buf, cap, "%s", name);
	else
		snprintf(buf, cap, "%.*s.base_layer%s", (int)(dot - name), name, dot);
}

int native_adapter_set_view(struct engine *e, enum engine_adapter_view view, struct eng_error *err)
{
	struct native *n = native_of(e);
	struct native_lora *a = n->lora;
	struct native *b = n->base;

	if (view == ENGINE_ADAPTER_VIEW_BASE && !a->base_names) {
		a->base_names = calloc(b->table.count, sizeof(*a->base_names));
		if (!a->base_names)
			return eng_fail(err, -ENOMEM, "adapter_view: out of memory");
		for (int64_t i = 0; i < b->table.count; i++)
			base_view_name(b, i, a->base_names[i], sizeof(a->base_names[i]));
	}
	a->view = view;
	a->merged_index = -1;
	return 0;
}

/* Base tensor i merged, into the adapter's merge buffer: 1 when it is a
 * targeted weight (now in a->merged), 0 when the base's own is shown. */
static int merged(struct native *n, int64_t i, struct eng_error *err)
{
	struct native_lora *a = n->lora;
	struct native *b = n->base;
	const struct param_entry *p = &b->table.entries[i];
	const float *W = native_family_host_ptr(b, FAM_PARAMS);
	const struct lora_layer *y;
	int64_t r = a->info.rank, nin, nout;
	bool weight;
	int m = base_module(b, i, &weight), rc;
	float *As;

	if (m < 0 || !weight || !(a->layer_targets[p->layer] & (1u << m)))
		return 0;
	if (a->merged_index == i)
		return 1;
	y = &a->layers[p->layer];
	lora_module_dims(&n->cfg, m, &nin, &nout);
	if (a->merged_floats < p->numel + r * nin) {
		float *buf = native_dalloc(n, (size_t)(p->numel + r * nin) * sizeof(float));

		if (!buf)
			return eng_fail(err, -ENOMEM, "%s: no memory to merge it", p->name);
		native_dfree(n, a->merged);
		a->merged = buf;
		a->merged_floats = p->numel + r * nin;
	}
	a->merged_index = -1;
	if (native_shard_params(b)) {   /* ZeRO-3: gathered (a collective) */
		rc = native_shard_tensor(b, i, &W, err);
		if (rc)
			return rc;
	} else {
		W = W ? W + p->offset : b->fam[FAM_PARAMS].dev + p->offset;
	}
	As = a->merged + p->numel;
	/* W + B (scale A): scale A into the buffer's tail, then one product
	 * added to the copy of W */
	rc = n->dev->ops->copy_d2d(n->dev, a->merged, W, p->numel * sizeof(float));
	if (rc == 0)
		rc = n->dev->k->axpby(n->dev, As, a->pass.scale, y->A[m], 0.0f, r * nin);
	if (rc == 0)
		rc = n->dev->k->gemm(n->dev, false, false, nout, nin, r, y->B[m], r, As, nin,
				     1.0f, a->merged, nin);
	if (rc)
		return eng_fail(err, rc, "%s: merging the adapter failed", p->name);
	a->merged_index = i;
	return 1;
}

/* In the MERGED view, the adapter's own score head stands for the base's:
 * the adapter's index of base tensor i, or -1. */
static int64_t own_score(struct native *n, int64_t i)
{
	const char *name = n->base->table.entries[i].name;

	if (n->lora->view != ENGINE_ADAPTER_VIEW_MERGED || !n->value_model)
		return -1;
	if (!strcmp(name, "score.weight"))
		return param_table_find(&n->table, LORA_SCORE_WEIGHT);
	if (!strcmp(name, "score.bias"))
		return param_table_find(&n->table, LORA_SCORE_BIAS);
	return -1;
}

int64_t native_adapter_num_params(struct engine *e)
{
	struct native *n = native_of(e);

	return n->lora->view == ENGINE_ADAPTER_VIEW_ADAPTER ? n->table.count
							   : n->base->table.count;
}

static const char *view_name(struct native *n, int64_t i)
{
	struct native_lora *a = n->lora;

	return a->view == ENGINE_ADAPTER_VIEW_BASE ? a->base_names[i]
						  : n->base->table.entries[i].name;
}

int native_adapter_param_info(struct engine *e, int64_t i, struct engine_param_view *ret)
{
	struct native *n = native_of(e);
	bool weight;
	int m;

	int64_t own;

	if (n->lora->view == ENGINE_ADAPTER_VIEW_ADAPTER)
		return native_param_info(e, i, ret);
	if ((own = own_score(n, i)) >= 0) {
		native_fill_info(n, FAM_PARAMS, own, ret);
		ret->name = view_name(n, i);
		return 0;
	}
	native_fill_info(n->base, FAM_PARAMS, i, ret);
	ret->name = view_name(n, i);
	m = base_module(n->base, i, &weight);
	if (n->lora->view == ENGINE_ADAPTER_VIEW_MERGED && m >= 0 && weight &&
	    (n->lora->layer_targets[n->base->table.entries[i].layer] & (1u << m))) {
		ret->host_resident = false;
		ret->host_data = NULL;
		ret->host_bf16 = NULL;
	}
	return 0;
}

int native_adapter_param(struct engine *e, int64_t i, struct engine_param_view *ret,
			 struct eng_error *err)
{
	struct native *n = native_of(e);
	const struct param_entry *p;
	int64_t own;
	float *s;
	int rc;

	/* i indexes the adapter's own table in its view, else the base's */
	if (n->lora->view == ENGINE_ADAPTER_VIEW_ADAPTER)
		return native_param(e, i, ret, err);
	p = &n->base->table.entries[i];
	own = own_score(n, i);
	if (own >= 0) {
		rc = native_view(n, FAM_PARAMS, own, ret, err);
		ret->name = view_name(n, i);
		return rc;
	}
	rc = n->lora->view == ENGINE_ADAPTER_VIEW_MERGED ? merged(n, i, err) : 0;
	if (rc < 0)
		return rc;
	if (rc == 0) {
		rc = native_view(n->base, FAM_PARAMS, i, ret, err);
		ret->name = view_name(n, i);
		return rc;
	}
	s = realloc(n->stage, p->numel * sizeof(float));
	if (!s)
		return eng_fail(err, -ENOMEM, "%s: out of host memory", p->name);
	n->stage = s;
	rc = native_copy_out(n, n->lora->merged, n->dev->host_memory, ENGINE_DTYPE_F32,
			     p->numel, s, p->name, err);
	if (rc)
		return rc;
	native_adapter_param_info(e, i, ret);
	ret->host_data = s;
	return 0;
}

int native_adapter_param_copy(struct engine *e, int64_t i, enum engine_dtype dtype,
			      int64_t start, int64_t count, void *dst, struct eng_error *err)
{
	struct native *n = native_of(e);
	int64_t own;
	int rc;

	if (n->lora->view == ENGINE_ADAPTER_VIEW_ADAPTER)
		return native_param_copy(e, i, dtype, start, count, dst, err);
	if ((own = own_score(n, i)) >= 0)
		return native_param_copy_of(n, own, dtype, start, count, dst, err);
	rc = n->lora->view == ENGINE_ADAPTER_VIEW_MERGED ? merged(n, i, err) : 0;
	if (rc < 0)
		return rc;
	if (rc == 0)
		return native_param_copy_of(n->base, i, dtype, start, count, dst, err);
	return native_copy_out(n, n->lora->merged + start, n->dev->host_memory, dtype, count,
			       dst, n->base->table.entries[i].name, err);
}

int native_adapter_grad(struct engine *e, int64_t i, struct engine_param_view *ret,
			struct eng_error *err)
{
	if (native_of(e)->lora->view != ENGINE_ADAPTER_VIEW_ADAPTER)
		return eng_fail(err, -EINVAL, "gradients: an adapter's are in its own view only");
	return native_grad(e, i, ret, err);
}
