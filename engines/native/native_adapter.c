/* native_adapter.c — LoRA adapters of the native engine: an adapter is a
 * `struct native` of its own whose parameter table holds its A and B
 * matrices (model/lora.h) and whose families (parameters, gradients, AdamW
 * moments) are its own, over a frozen base it borrows: a ForwardBackward
 * runs the base's model with the adapter attached (native_fb_model), and
 * the step, ZeroGrad, the schedule, placement and the parameter views are
 * the native engine's own functions acting on the adapter's table. */
#include "native_engine.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/fileio.h"
#include "io/safetensors.h"
#include "native_peft.h"

int native_refuse_frozen(const struct native *n, const char *call, struct eng_error *err)
{
	if (!n->frozen)
		return 0;
	return eng_fail(err, -EALREADY,
			"%s: the base model is frozen (Initialize frozen_base): name an adapter "
			"to train%s", call,
			strcmp(call, "ForwardBackward") ? "" : ", or make the call forward_only");
}

void native_adapter_rebind(struct native *n)
{
	struct native_lora *a = n->lora;
	float *p = n->fam[FAM_PARAMS].dev ? n->fam[FAM_PARAMS].dev : n->fam[FAM_PARAMS].host;
	float *g = n->fam[FAM_GRADS].dev ? n->fam[FAM_GRADS].dev : n->fam[FAM_GRADS].host;

	int64_t s = param_table_find(&n->table, LORA_SCORE_WEIGHT);
	int64_t sb = param_table_find(&n->table, LORA_SCORE_BIAS);

	lora_bind(&n->table, &n->cfg, a->layer_targets, p, g, a->layers);
	a->pass.score = s < 0 ? NULL : p + n->table.entries[s].offset;
	a->pass.dscore = s < 0 ? NULL : g + n->table.entries[s].offset;
	a->pass.score_bias = sb < 0 ? NULL : p + n->table.entries[sb].offset;
	a->pass.dscore_bias = sb < 0 ? NULL : g + n->table.entries[sb].offset;
	native_adapter_changed(n);
}

int native_fb_model(struct native *n, int64_t T, struct llama_model **ret,
		    struct eng_error *err)
{
	struct native_lora *a = n->lora;
	int64_t need;
	float *s;
	int rc;

	if (!a) {
		*ret = &n->model;
		return 0;
	}
	rc = native_require_placed(n->base, false, false, err);
	if (rc)
		return rc;
	need = llama_lora_scratch_floats(a->pass.rank, T);
	if (need > a->scratch_floats) {
		s = native_dalloc(n, (size_t)need * sizeof(float));
		if (!s)
			return eng_fail(err, -ENOMEM, "adapter %s: no memory for its scratch "
					"(%lld floats)", a->name, (long long)need);
		native_dfree(n, a->pass.scratch);
		a->pass.scratch = s;
		a->scratch_floats = need;
	}
	n->base->model.lora = &a->pass;
	*ret = &n->base->model;
	return 0;
}

void native_adapter_detach(struct native *n)
{
	if (n->lora)
		n->base->model.lora = NULL;
}

/* A value model adapter's score head starts as its base's (PEFT's
 * modules_to_save copies the module). */
static int copy_base_score(struct native *n, float *host, struct eng_error *err)
{
	static const char *const names[2][2] = {{LORA_SCORE_WEIGHT, "score.weight"},
						{LORA_SCORE_BIAS, "score.bias"}};
	int rc = 0;

	for (int k = 0; k < 2 && !rc; k++) {
		int64_t i = param_table_find(&n->table, names[k][0]);
		int64_t j = param_table_find(&n->base->table, names[k][1]);

		if (i < 0)
			continue;
		if (j < 0)
			return eng_fail(err, -EINVAL, "adapter: the base has no %s", names[k][1]);
		rc = native_param_copy_of(n->base, j, ENGINE_DTYPE_F32, 0,
					  n->table.entries[i].numel,
					  host + n->table.entries[i].offset, err);
	}
	return rc;
}

/* A drawn as PEFT draws it: kaiming_uniform_(a = sqrt(5)) is
 * U(-1/sqrt(in), 1/sqrt(in)); matrix i of the table takes its own stream
 * seed ^ (i << 40), one draw (rng_uniform) per element in row-major order.
 * B is 0; a value model's score head is its base's. */
static void random_init(struct native *n, float *host)
{
	for (int64_t i = 0; i < n->table.count; i++) {
		const struct param_entry *p = &n->table.entries[i];
		float *x = host + p->offset;

		if (!strstr(p->name, ".lora_")) {
			continue;
		} else if (strstr(p->name, ".lora_B.")) {
			memset(x, 0, p->numel * sizeof(float));
		} else {
			double bound = 1.0 / sqrt((double)p->shape[1]);
			struct rng r;

			rng_seed(&r, n->seed ^ ((uint64_t)i << 40));
			for (int64_t k = 0; k < p->numel; k++)
				x[k] = (float)((2.0 * rng_uniform(&r) - 1.0) * bound);
		}
	}
}

static void adapter_destroy(struct engine *e)
{
	struct native *n = native_of(e);

	if (!n)
		return;
	if (n->lora) {
		native_dfree(n, n->lora->pass.scratch);
		native_dfree(n, n->lora->merged);
		free(n->lora->base_names);
		free(n->lora->layer_targets);
		free(n->lora->layers);
		free(n->lora);
	}
	if (n->dev) {
		native_io_release(n);
		native_families_free(n);
	}
	if (n->base)
		n->base->adapters--;
	free(n->stage);
	param_table_free(&n->table);
	free(n);
	engine_set_impl(e, NULL);
}

static int adapter_forward_backward(struct engine *e, const struct engine_batch *b,
				    struct engine_fb_result *res, struct eng_error *err)
{
	return native_forward_backward(e, b, res, err);
}

static int adapter_no_bf16(struct engine *e, struct eng_error *err)
{
	(void)e;
	return eng_fail(err, -ENOTSUP, "an adapter keeps no bf16 copy of its parameters");
}

static int adapter_no_lend(struct engine *e, struct engine_lent_file *ret,
			   struct eng_error *err)
{
	(void)ret;
	return adapter_no_bf16(e, err);
}

int native_adapter_info(struct engine *e, struct engine_adapter_config *ret)
{
	struct native *n = native_of(e);

	if (!n->lora)
		return -EINVAL;
	*ret = n->lora->info;
	return 0;
}

#define ADAPTER_OPS(mt)                                                 \
	{                                                               \
		.model_type = mt, .backend = "native", .device = "adapter", \
		.forward_backward = adapter_forward_backward,           \
		.optimizer_step = native_optimizer_step,                \
		.lr_scheduler_step = native_lr_scheduler_step,          \
		.to = native_to,                                        \
		.zero_grad = native_zero_grad,                          \
		.num_params = native_adapter_num_params,                \
		.param = native_adapter_param,                          \
		.grad = native_adapter_grad,                            \
		.param_info = native_adapter_param_info,                \
		.param_copy = native_adapter_param_copy,                \
		.keep_params_bf16 = adapter_no_bf16,                    \
		.lend_params_bf16 = adapter_no_lend,                    \
		.save_checkpoint = native_save_checkpoint,              \
		.load_checkpoint = native_load_checkpoint,              \
		.status = native_status,                                \
		.destroy = adapter_destroy,                             \
		.adapter_info = native_adapter_info,                    \
		.adapter_view = native_adapter_set_view,                \
		.sampler_open = native_sampler_open,                    \
		.sampler_add = native_sampler_add,                      \
		.sampler_step = native_sampler_step,                    \
		.sampler_calls = native_sampler_calls,                  \
		.sampler_close = native_sampler_close,                  \
	}

static const struct engine_ops adapter_lm_ops = ADAPTER_OPS("language_model");
static const struct engine_ops adapter_value_ops = ADAPTER_OPS("value_model");

/* The rank, alpha, targets and rsLoRA of cfg checked against the base, and
 * the per-layer targets (every layer: cfg's targets). */
static int shape_fresh(struct native *n, const struct engine_adapter_config *cfg,
		       struct eng_error *err)
{
	struct native_lora *a = n->lora;

	for (int m = 0; m < ENGINE_LORA_MODULES; m++)
		if ((cfg->targets & (1u << m)) && cfg->rank > lora_max_rank(&n->cfg, m))
			return eng_fail(err, -EINVAL,
					"rank: %lld is larger than %s allows (min(in, out) = %lld)",
					(long long)cfg->rank, lora_module_name(m),
					(long long)lora_max_rank(&n->cfg, m));
	for (int64_t l = 0; l < n->cfg.num_layers; l++)
		a->layer_targets[l] = cfg->targets;
	a->info.rank = cfg->rank;
	a->info.alpha = cfg->alpha;
	a->info.targets = cfg->targets;
	a->info.rslora = cfg->rslora;
	return 0;
}

int native_adapter_create(struct engine *base, const struct engine_adapter_config *cfg,
			  struct engine *ad, const struct engine_ops **ret_ops,
			  struct eng_error *err)
{
	struct native *b = native_of(base), *n;
	struct native_lora *a;
	struct native_peft peft = {.dfd = -1};
	float *host = NULL;
	bool joined = false;
	int rc;

	if (!b->frozen)
		return eng_fail(err, -EALREADY,
				"CreateAdapter: the base model is trainable; Initialize it with "
				"frozen_base to train adapters over it");
	if (model_has_experts(&b->cfg))
		return eng_fail(err, -ENOSYS, "CreateAdapter: LoRA over a mixture-of-experts "
				"model (%s) is not built yet", b->cfg.model_type);
	n = calloc(1, sizeof(*n));
	a = calloc(1, sizeof(*a));
	if (!n || !a) {
		free(n);
		free(a);
		return eng_fail(err, -ENOMEM, "adapter: out of memory");
	}
	engine_set_impl(ad, n);
	n->lora = a;
	n->base = b;
	b->adapters++;
	n->model_fd = -1;
	n->dev = b->dev;
	n->cfg = b->cfg;
	n->value_model = b->value_model;
	snprintf(n->key, sizeof(n->key), "%s", b->key);
	snprintf(a->name, sizeof(a->name), "%s", cfg->name);
	a->info = *cfg;
	a->info.name = a->name;
	a->info.peft_dir = NULL;
	n->optim = cfg->has_optim ? cfg->optim : b->optim;
	n->sched = cfg->has_sched ? cfg->sched : b->sched;
	n->seed = cfg->seed;
	rng_seed(&n->rng, cfg->seed);
	n->default_budget = b->default_budget;
	n->kv_cache_bytes = b->kv_cache_bytes;
	n->recompute = b->recompute;
	n->io_threads = b->io_threads;
	a->layer_targets = calloc(n->cfg.num_layers, sizeof(*a->layer_targets));
	a->layers = calloc(n->cfg.num_layers, sizeof(*a->layers));
	if (!a->layer_targets || !a->layers) {
		rc = eng_fail(err, -ENOMEM, "adapter: out of memory");
		goto fail;
	}
	rc = cfg->peft_dir ? native_peft_open(n, cfg, &peft, err) : shape_fresh(n, cfg, err);
	if (rc == 0)
		rc = lora_table_build(&n->cfg, a->info.rank, a->layer_targets, n->value_model,
				      &n->table, err);
	if (rc)
		goto fail;
	native_dist_adapter_shape(n, b);
	rc = native_families_alloc(n, err);
	if (rc)
		goto fail;
	host = native_family_host_ptr(n, FAM_PARAMS);
	if (!host && !(host = malloc((size_t)n->table.total * sizeof(float)))) {
		rc = eng_fail(err, -ENOMEM, "adapter: out of host memory");
		goto fail;
	}
	/* ZeRO-3: the base's score head is gathered (a collective), so the
	 * ranks agree first that every one got this far. */
	if (n->value_model && native_shard_params(b)) {
		rc = native_dist_agree(b, 0, "CreateAdapter", err);
		joined = rc != 0;   /* a failed agreement has told the peers */
	}
	if (rc == 0)
		rc = copy_base_score(n, host, err);
	if (rc == 0 && cfg->peft_dir)
		rc = native_peft_read(n, &peft, host, err);
	else if (rc == 0)
		random_init(n, host);
	if (rc == 0 && host != native_family_host_ptr(n, FAM_PARAMS))
		rc = native_family_write(n, FAM_PARAMS, host, err);
	if (host != native_family_host_ptr(n, FAM_PARAMS))
		free(host);
	if (rc)
		goto fail;
	/* In a group: every rank's verdict, then rank 0's matrices. */
	joined = true;
	rc = native_dist_adapter_join(n, 0, err);
	if (rc)
		goto fail;
	a->pass.rank = a->info.rank;
	a->pass.scale = (float)(a->info.rslora ? a->info.alpha / sqrt((double)a->info.rank)
					       : a->info.alpha / (double)a->info.rank);
	a->pass.layers = a->layers;
	n->place = (struct engine_placement){true, true, true};
	a->merged_index = -1;
	native_adapter_rebind(n);
	native_peft_close(&peft);
	*ret_ops = n->value_model ? &adapter_value_ops : &adapter_lm_ops;
	return 0;
fail:
	if (!joined && b->group.dist) {
		struct eng_error ignored;

		/* The peers learn of this rank's failure instead of waiting. */
		eng_error_clear(&ignored);
		(void)native_dist_agree(b, rc, "CreateAdapter", &ignored);
	}
	native_peft_close(&peft);
	adapter_destroy(ad);
	return rc;
}
