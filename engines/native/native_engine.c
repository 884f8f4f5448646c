/* native_engine.c — the native engine's ops table, its micro-batch
 * buffers, destroy and status. Each call is in a file of its own:
 * native_init.c (Initialize), native_fb.c (ForwardBackward), native_step.c
 * (OptimizerStep, LrSchedulerStep), native_place.c (placement, ZeroGrad),
 * native_params.c (parameter views and copies), native_ckpt.c and
 * native_ckpt_group.c (checkpoints), native_dist.c and native_grad_sync.c
 * (the data-parallel group).
 */
#include "native_engine.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../optim/schedule.h"

double native_current_lr(const struct native *n)
{
	return n->optim.lr * lr_schedule_factor(&n->sched, n->sched_step);
}

/* --- memory ------------------------------------------------------------ */

void native_io_release(struct native *n)
{
	struct native_io *io = &n->io;

	native_dfree(n, io->ids);
	native_dfree(n, io->pos);
	native_dfree(n, io->targets);
	native_dfree(n, io->cu_seqlens);
	native_dfree(n, io->rows);
	native_dfree(n, io->drows);
	memset(io, 0, sizeof(*io));
}

int native_io_reserve(struct native *n, int64_t T, int64_t B, struct eng_error *err)
{
	struct native_io io = {0};

	if (T <= n->io.cap_tokens && B <= n->io.cap_seqs)
		return 0;
	if (T < n->io.cap_tokens)
		T = n->io.cap_tokens;
	if (B < n->io.cap_seqs)
		B = n->io.cap_seqs;
	io.cap_tokens = T;
	io.cap_seqs = B;
	io.ids = native_dalloc(n, T * sizeof(int32_t));
	io.pos = native_dalloc(n, T * sizeof(int32_t));
	io.targets = native_dalloc(n, T * sizeof(int32_t));
	io.cu_seqlens = native_dalloc(n, (B + 1) * sizeof(int32_t));
	io.rows = native_dalloc(n, 3 * T * sizeof(float));
	io.drows = native_dalloc(n, 3 * T * sizeof(float));
	if (!io.ids || !io.pos || !io.targets || !io.cu_seqlens || !io.rows || !io.drows) {
		struct native_io old = n->io;

		n->io = io;
		native_io_release(n);
		n->io = old;
		return eng_fail(err, -ENOMEM, "micro-batch buffers: out of memory for %lld tokens",
				(long long)T);
	}
	native_io_release(n);
	n->io = io;
	return 0;
}

static void native_destroy(struct engine *e)
{
	struct native *n = native_of(e);

	if (!n)
		return;
	if (n->model_fd >= 0)
		close(n->model_fd);
	native_dist_leave(n);
	if (n->dev) {
		llama_release(&n->model);
		native_io_release(n);
		native_shard_free(n);
		native_families_free(n);
		n->dev->ops->close(n->dev);
	}
	free(n->stage);
	free(n->wl);
	free(n->gl);
	param_table_free(&n->table);
	free(n);
	engine_set_impl(e, NULL);
}

void native_status(struct engine *e, struct engine_status *ret)
{
	struct native *n = native_of(e);

	snprintf(ret->key, sizeof(ret->key), "%s", n->key);
	ret->initialized = true;
	ret->placement = n->place;
	ret->step = n->optim_step;
	ret->sched_step = n->sched_step;
	ret->lr = native_current_lr(n);
	ret->accumulated_calls = n->grad_calls;
	ret->accumulated_tokens = n->grad_tokens;
	ret->num_parameters = n->table.total;
	snprintf(ret->matmul, sizeof(ret->matmul), "%s", n->dev->matmul ? n->dev->matmul : "");
	ret->device_memory = n->dev->ops->mem_in_use(n->dev);
	ret->failed = n->dev->failed;
	ret->activation_bytes = n->last_activation_bytes;
	ret->param_bytes = (size_t)native_family_len(n, FAM_PARAMS) * sizeof(float);
	ret->grad_bytes = (size_t)native_family_len(n, FAM_GRADS) * sizeof(float);
	ret->gathered_bytes = native_shard_bytes(n);
	ret->host_memory = 0;
	for (int f = 0; f < FAM_COUNT; f++)
		if (n->fam[f].host)
			ret->host_memory += (size_t)native_family_len(n, f) * sizeof(float);
	ret->dist_world_size = n->group.dist ? n->group.dist->world_size : 1;
	ret->dist_rank = n->group.dist ? n->group.dist->rank : 0;
	ret->dist_zero_stage = n->group.dist ? n->group.zero_stage : 0;
	ret->dist_backend = n->group.dist ? n->group.dist->ops->name : NULL;
	ret->dist_broken = n->group.dist && n->group.dist->broken;
	ret->optim_shard_params = native_family_len(n, FAM_EXP_AVG);
	ret->optim_bytes = 2 * (size_t)ret->optim_shard_params * sizeof(float);
	if (n->group.dist) {
		ret->dist_bucket_bytes = n->group.bucket_bytes;
		ret->reduce_buckets = n->group.sync_last.buckets;
		ret->reduce_bytes = n->group.sync_last.bytes;
		ret->reduce_s = n->group.sync_last.reduce_s;
		ret->reduce_wait_s = n->group.sync_last.wait_s;
	}
}

static int native_group_agree(struct engine *e, int rc, const char *what,
			      struct eng_error *err)
{
	struct native *n = native_of(e);

	return n->group.dist ? native_dist_agree(n, rc, what, err) : rc;
}

#define NATIVE_OPS(mt, dv)                                      \
	{                                                       \
		.model_type = mt, .backend = "native", .device = dv, \
		.initialize = native_initialize,                \
		.forward_backward = native_forward_backward,    \
		.optimizer_step = native_optimizer_step,        \
		.lr_scheduler_step = native_lr_scheduler_step,  \
		.to = native_to,                                \
		.zero_grad = native_zero_grad,                  \
		.num_params = native_num_params,                \
		.param = native_param,                          \
		.grad = native_grad,                            \
		.param_info = native_param_info,                \
		.param_copy = native_param_copy,                \
		.keep_params_bf16 = native_keep_params_bf16,    \
		.lend_params_bf16 = native_lend_params_bf16,    \
		.save_checkpoint = native_save_checkpoint,      \
		.load_checkpoint = native_load_checkpoint,      \
		.status = native_status,                        \
		.destroy = native_destroy,                      \
		.adapter_create = native_adapter_create,        \
		.adapter_info = native_adapter_info,            \
		.group_agree = native_group_agree,              \
		.sampler_open = native_sampler_open,            \
		.sampler_add = native_sampler_add,              \
		.sampler_step = native_sampler_step,            \
		.sampler_calls = native_sampler_calls,          \
		.sampler_close = native_sampler_close,          \
	}

const struct engine_ops native_lm_cpu_ops = NATIVE_OPS("language_model", "cpu");
const struct engine_ops native_value_cpu_ops = NATIVE_OPS("value_model", "cpu");
const struct engine_ops native_lm_cuda_ops = NATIVE_OPS("language_model", "cuda");
const struct engine_ops native_value_cuda_ops = NATIVE_OPS("value_model", "cuda");
