/* native_engine.h — the native engine: the Llama family on any device of
 * the device table. One implementation, registered once per (model_type,
 * device); this header is shared by its files (engine ops, checkpoints). */
#ifndef ENGINED_NATIVE_ENGINE_H
#define ENGINED_NATIVE_ENGINE_H

#include <jansson.h>

#include "../device/device.h"
#include "../dist/dist.h"
#include "native_group.h"
#include "engine.h"
#include "../model/config.h"
#include "../model/llama.h"
#include "../model/params.h"
#include "../rng.h"

extern const struct engine_ops native_lm_cpu_ops;
extern const struct engine_ops native_value_cpu_ops;
extern const struct engine_ops native_lm_cuda_ops;
extern const struct engine_ops native_value_cuda_ops;

/* Device scratch for one micro-batch's inputs and outputs. */
struct native_io {
	int64_t cap_tokens, cap_seqs;
	int32_t *ids, *pos, *targets;  /* [cap_tokens] device */
	int32_t *cu_seqlens;           /* [cap_seqs + 1] device */
	float *rows;                   /* [3, cap_tokens] device: logp, ent, val */
	float *drows;                  /* [3, cap_tokens] device: their gradients */
};

/* State families, one allocation each, laid out by the parameter table. */
enum native_fam {
	FAM_PARAMS = 0,
	FAM_GRADS,
	FAM_EXP_AVG,
	FAM_EXP_AVG_SQ,
	FAM_COUNT,
};

/* Where a family lives: `dev` on the device, or `host` when offloaded
 * (exactly one is set). On host-memory devices it always stays in `dev`
 * and offload only changes the placement flags. */
struct native_family {
	float *dev;
	float *host;
};

struct native {
	char key[96];
	struct model_config cfg;
	bool value_model;
	struct device *dev;

	struct param_table table;
	struct native_family fam[FAM_COUNT];   /* each [table.total] floats */
	struct layer_weights *wl, *gl; /* [L] bound layer pointers */
	struct llama_model model;
	struct native_io io;
	float *stage;                  /* host staging for non-host devices */
	/* Training forward_backward calls and their tokens since the gradients
	 * were last zeroed (a step, zero_grad, leaving TRAIN, a load). */
	int64_t grad_calls, grad_tokens;

	struct engine_optim_config optim;
	struct engine_sched_config sched;
	int64_t optim_step;            /* AdamW steps taken */
	int64_t sched_step;            /* lr_scheduler_step calls */
	uint64_t seed;
	struct rng rng;
	int64_t default_budget;
	int64_t kv_cache_bytes;        /* engine_sample's cache at most */
	bool recompute;                /* activation_recompute's default */
	/* Activation bytes the last ForwardBackward reserved for its longest
	 * micro-batch (on the base for an adapter's call too: GetStatus). */
	size_t last_activation_bytes;
	/* A ForwardBackward of a mixture of experts: each experts layer's
	 * choices per expert so far, [L][E] (native_fb.c), NULL between calls. */
	int64_t *moe_counts;
	int io_threads;                /* safetensors reads (the CPU budget) */
	struct engine_placement place;
	int model_fd;                  /* model_path while initializing, else -1 */
	struct native_group group;       /* native_dist.c */
	/* A frozen base (engine_init_config.frozen_base): only FAM_PARAMS is
	 * allocated; adapters (native_adapter.c) train over it. */
	bool frozen;
	int64_t adapters;              /* live adapters over this base */
	/* Set on an adapter: its base, and what it adds to the base's
	 * projections (the table lists its A and B matrices). */
	struct native *base;
	struct native_lora *lora;
};

/* An adapter's own part (native_adapter.c). */
struct native_lora {
	struct engine_adapter_config info;   /* as made (name: its copy) */
	char name[ENGINE_ADAPTER_NAME_MAX + 1];
	unsigned *layer_targets;             /* [L] ENGINE_LORA bits */
	struct lora_layer *layers;           /* [L] bound to the families */
	struct llama_lora pass;              /* what llama.c reads */
	int64_t scratch_floats;              /* of pass.scratch */
	/* The parameter views (native_adapter_views.c): which, the base's
	 * names in the BASE view, and the last merged weight (base tensor
	 * merged_index, -1: none) in a device buffer of merged_floats. */
	enum engine_adapter_view view;
	char (*base_names)[96];
	float *merged;
	int64_t merged_floats, merged_index;
};

/* The checkpoint file of the parameters: an adapter's is PEFT's. */
static inline const char *native_model_file(const struct native *n)
{
	return n->lora ? "adapter_model.safetensors" : "model.safetensors";
}

static inline struct native *native_of(struct engine *e)
{
	return engine_impl(e);
}

/* Device memory of at least one byte (NULL when out of memory). */
static inline void *native_dalloc(struct native *n, size_t bytes)
{
	return n->dev->ops->alloc(n->dev, bytes ? bytes : 1);
}

static inline void native_dfree(struct native *n, void *p)
{
	n->dev->ops->free(n->dev, p);
}

/* native_engine.c: the ops table, the micro-batch buffers, status. */
void native_status(struct engine *e, struct engine_status *ret);
void native_io_release(struct native *n);
/* Make the micro-batch buffers hold T tokens and B sequences. */
int native_io_reserve(struct native *n, int64_t T, int64_t B, struct eng_error *err);

/* The engine calls, one file each (engine_ops in engine.h). */
int native_initialize(struct engine *e, const struct engine_init_config *cfg,
		      struct eng_error *err);                             /* native_init.c */
int native_forward_backward(struct engine *e, const struct engine_batch *b,
			    struct engine_fb_result *res, struct eng_error *err); /* native_fb.c */
/* -EINVAL "field[t]: token ... outside the vocabulary" for the first of
 * ids[count] (NULL: none) that is not a token of n's model (native_fb.c). */
int native_check_tokens(const struct native *n, const char *field, const int32_t *ids,
			int64_t count, struct eng_error *err);
int native_optimizer_step(struct engine *e, const struct engine_step_params *p,
			  struct engine_step_result *ret, struct eng_error *err); /* native_step.c */
int native_lr_scheduler_step(struct engine *e, double *ret_lr, struct eng_error *err);
/* native_sample.c: the engine_sampler_* calls (engine.h). */
int native_sampler_open(struct engine *e, void **ret, struct eng_error *err);
int native_sampler_add(void *impl, const struct engine_sample_params *p, struct eng_error *err);
int native_sampler_step(void *impl, struct eng_error *err);
int64_t native_sampler_calls(void *impl);
void native_sampler_close(void *impl);
/* native_params.c */
int64_t native_num_params(struct engine *e);
int native_param_info(struct engine *e, int64_t i, struct engine_param_view *ret);
int native_param(struct engine *e, int64_t i, struct engine_param_view *ret,
		 struct eng_error *err);
int native_grad(struct engine *e, int64_t i, struct engine_param_view *ret,
		struct eng_error *err);
int native_keep_params_bf16(struct engine *e, struct eng_error *err);
int native_lend_params_bf16(struct engine *e, struct engine_lent_file *ret,
			    struct eng_error *err);
int native_param_copy(struct engine *e, int64_t i, enum engine_dtype dtype,
		      int64_t start, int64_t count, void *dst, struct eng_error *err);
/* The same of a native: tensor i's view of family f (host-resident or
 * staged), its name/shape alone, a parameter's slice copied out. */
int native_view(struct native *n, enum native_fam f, int64_t i,
		struct engine_param_view *ret, struct eng_error *err);
void native_fill_info(struct native *n, enum native_fam f, int64_t i,
		      struct engine_param_view *ret);
int native_param_copy_of(struct native *n, int64_t i, enum engine_dtype dtype, int64_t start,
			 int64_t count, void *dst, struct eng_error *err);
/* count floats at src (host memory, or the device's) converted to dtype
 * into host dst; name for messages. */
int native_copy_out(struct native *n, const float *src, bool host, enum engine_dtype dtype,
		    int64_t count, void *dst, const char *name, struct eng_error *err);

/* native_adapter.c: LoRA adapters over a frozen base. */
int native_adapter_create(struct engine *base, const struct engine_adapter_config *cfg,
			  struct engine *ad, const struct engine_ops **ret_ops,
			  struct eng_error *err);
int native_adapter_info(struct engine *e, struct engine_adapter_config *ret);
/* The model a ForwardBackward of n runs: its own, or its base's with the
 * adapter attached for the call (native_adapter_detach after it), its
 * scratch made to hold T tokens. */
int native_fb_model(struct native *n, int64_t T, struct llama_model **ret,
		    struct eng_error *err);
void native_adapter_detach(struct native *n);
/* The adapter's matrices bound to its families' current memory. */
void native_adapter_rebind(struct native *n);
/* native_adapter_views.c: the adapter's parameter views (engine_ops). */
int native_adapter_set_view(struct engine *e, enum engine_adapter_view view,
			    struct eng_error *err);
int64_t native_adapter_num_params(struct engine *e);
int native_adapter_param_info(struct engine *e, int64_t i, struct engine_param_view *ret);
int native_adapter_param(struct engine *e, int64_t i, struct engine_param_view *ret,
			 struct eng_error *err);
int native_adapter_param_copy(struct engine *e, int64_t i, enum engine_dtype dtype,
			      int64_t start, int64_t count, void *dst, struct eng_error *err);
int native_adapter_grad(struct engine *e, int64_t i, struct engine_param_view *ret,
			struct eng_error *err);
/* Forget a merged weight (the adapter's parameters changed). */
static inline void native_adapter_changed(struct native *n)
{
	if (n->lora)
		n->lora->merged_index = -1;
}
/* -EALREADY naming the call when n is a frozen base. */
int native_refuse_frozen(const struct native *n, const char *call, struct eng_error *err);

/* native_place.c: placement of the state families. */
int native_families_alloc(struct native *n, struct eng_error *err);
void native_families_free(struct native *n);
int native_to(struct engine *e, bool to_device, bool model, bool optimizer,
	      bool grad, struct eng_error *err);
int native_zero_grad(struct engine *e, struct eng_error *err);
int native_zero_grads(struct native *n, struct eng_error *err);
/* Host-readable view of family f (the table's parameters; this rank's
 * slice of the moments): the family itself when host-readable, else a
 * staged copy returned in *ret_owned (caller frees). */
int native_family_read(struct native *n, enum native_fam f, const float **ret,
		       float **ret_owned, struct eng_error *err);
/* Replace family f's values with host[total]. */
int native_family_write(struct native *n, enum native_fam f, const float *host,
			struct eng_error *err);
/* Host pointer to write family f in place, or NULL when it is in device
 * memory (then stage and use native_family_write). */
float *native_family_host_ptr(struct native *n, enum native_fam f);
/* -EALREADY unless the families a computation needs are on the device. */
int native_require_placed(struct native *n, bool grads, bool optimizer,
			  struct eng_error *err);
/* Point the model at the families' current memory; bump param_version. */
void native_rebind(struct native *n);

/* Floats of family f's allocation / of its meaningful part. */
int64_t native_family_len(const struct native *n, enum native_fam f);
/* Family f holds this rank's slice only (the moments in a group; with
 * ZeRO-2/3 the gradients, with ZeRO-3 the parameters), not the table. */
bool native_family_sliced(const struct native *n, enum native_fam f);
/* This rank's slice [shard_off, shard_off + shard_len) of family f
 * (native_shard.c): inside a whole family, or the family itself. */
float *native_slice(struct native *n, enum native_fam f);

/* native_ckpt.c: one engine's SaveCheckpoint / LoadCheckpoint, and the
 * parts a group's (native_ckpt_group.c) shares. */
int native_save_checkpoint(struct engine *e, const char *dir, int64_t global_step,
			   int max_to_keep, unsigned contents, size_t *ret_bytes,
			   struct eng_error *err);
int native_load_checkpoint(struct engine *e, const char *dir, unsigned contents,
			   int64_t *ret_global_step, struct eng_error *err);
/* Progress of a save or load: tensor data bytes, `base` of them before the
 * current file (engine_progress). */
struct native_ckpt_progress {
	struct engine *e;
	const char *file;
	int64_t base, total;
};
void native_ckpt_file_progress(void *ctx, uint64_t data_bytes);
struct ckpt_writer;
/* config.json and model.safetensors into the writer. */
int native_ckpt_write_model(struct native *n, struct ckpt_writer *w,
			    struct native_ckpt_progress *pr, struct eng_error *err);
/* A save's safe point: -ECANCELED (nothing saved) once the engine's
 * cancel callback says so. */
int native_ckpt_cancelled(struct engine *e, const char *after, struct eng_error *err);
/* engine_state.json, then the writer's commit (frees it either way). */
int native_ckpt_commit(struct engine *e, struct native *n, struct ckpt_writer *w,
		       int64_t global_step, int max_to_keep, unsigned contents,
		       const struct native_ckpt_progress *pr, uint64_t *ret_total,
		       struct eng_error *err);

/* An open, verified, checked checkpoint to load from. */
struct native_saved_state {
	int64_t global_step, optim_step, sched_step;
	uint64_t rng[4];
	unsigned contents;     /* CKPT_* held */
};
struct st_reader;
struct native_optim_src {      /* native_optim_files.c */
	int world;             /* 1: optimizer.safetensors; W: W shard files */
	struct st_reader **r;  /* [world]; NULL where not opened */
};
struct native_load {
	json_t *state;
	struct native_saved_state saved;
	char *resolved;                /* the checkpoint directory, for messages */
	int ckfd;
	struct st_reader *model;       /* with CKPT_MODEL */
	struct native_optim_src opt;   /* with CKPT_OPTIMIZER */
	struct native_ckpt_progress pr;
};
/* Which listed files to verify (NULL: all of them). */
struct native_load_filter {
	bool (*fn)(void *ctx, json_t *state, const char *name);
	void *ctx;
};
/* Open `dir` (or what its `latest` names), verify its files, check its
 * state and the files of `contents` against this engine; the optimizer
 * files opened are those that hold the flat range [first, first + count).
 * safe_point: -ECANCELED at the end if the client is gone. Nothing of the
 * engine changes. Close with native_load_close, whatever it returned. */
int native_load_open(struct engine *e, struct native *n, const char *dir, unsigned contents,
		     const struct native_load_filter *filter, int64_t first, int64_t count,
		     bool safe_point, struct native_load *L, struct eng_error *err);
/* The parameters, read into the engine. */
int native_load_model(struct native *n, struct native_load *L, struct eng_error *err);
/* The flat range [first, first + count) of moment `which` (0 exp_avg,
 * 1 exp_avg_sq) into host memory dst[count] (zero past the table). */
int native_load_moment(struct native *n, struct native_load *L, int which, int64_t first,
		       int64_t count, float *dst, struct eng_error *err);
void native_load_close(struct native_load *L);
/* A load's last part: steps and RNG (CKPT_EXTRA), zeroed gradients. */
int native_load_apply(struct engine *e, struct native *n, unsigned contents,
		      const struct native_saved_state *saved, struct eng_error *err);

/* native_ckpt_group.c: SaveCheckpoint / LoadCheckpoint on every rank of a
 * group. dir is NULL on a rank other than 0 that cannot reach the
 * checkpoint's directory (rank 0 then writes or reads its part). */
/* ZeRO-3's model file: rank 0 names each tensor in turn (a broadcast of
 * its index) and every rank gathers it (native_shard_tensor); fetch_tensor
 * is rank 0's st_writer_add_fill callback (ctx a struct native_fetch). */
struct native_fetch {
	struct native *n;
	int64_t i;
};
int native_group_fetch_tensor(void *ctx, float *dst, uint64_t numel, struct eng_error *err);
int native_group_save(struct engine *e, struct native *n, const char *dir,
		      int64_t global_step, int max_to_keep, unsigned contents,
		      size_t *ret_bytes, struct eng_error *err);
int native_group_load(struct engine *e, struct native *n, const char *dir, unsigned contents,
		      int64_t *ret_global_step, struct eng_error *err);

/* native_optim_files.c: the moments' two layouts. */
#define NATIVE_OPTIM_FILE "optimizer.safetensors"
/* "optimizer-<rank>-of-<world>.safetensors" */
void native_shard_name(char *buf, size_t cap, int rank, int world);
/* Rank `rank`'s shard of a group of `world` (its moments m and v, each
 * its slice's length) as a file beneath dirfd (`shown` in messages). */
int native_shard_write(struct native *n, int dirfd, const char *shown, int rank, int world,
		       const float *m, const float *v,
		       void (*progress)(void *ctx, uint64_t data_bytes), void *ctx,
		       uint64_t *ret_bytes, uint64_t *ret_xxh, struct eng_error *err);
/* The layout of a checkpoint's optimizer: 1 (one file) or the world size
 * that wrote shards; -EBADMSG when its files list neither. */
int native_optim_layout(json_t *state, const char *shown, int *ret_world,
			struct eng_error *err);
/* Whether listed file `name` holds part of the range (a verify filter). */
bool native_optim_file_needed(const struct native *n, json_t *state, const char *name,
			      int64_t first, int64_t count);
/* Tensor `tname` of reader r is there (-EBADMSG naming `file`) with the
 * engine's shape (ndim dimensions; -EINVAL naming both shapes). */
int native_check_tensor(struct st_reader *r, const char *file, const char *tname, int ndim,
			const int64_t *shape, struct eng_error *err);
int native_optim_open(struct native *n, int ckfd, const char *dir, json_t *state,
		      int64_t first, int64_t count, struct native_optim_src *src,
		      struct eng_error *err);
int native_optim_read(struct native *n, struct native_optim_src *src, int which,
		      int64_t first, int64_t count, float *dst, struct eng_error *err);
void native_optim_close(struct native_optim_src *src);

/* native_state.c: the engine's members of engine_state.json. */
json_t *native_state_json(struct native *n, int64_t global_step, unsigned contents);
/* Check a loaded (sealed) state against the schema: -EBADMSG naming
 * `shown` (the file) and the key; -EINVAL for another engine key, world
 * size or model size. */
int native_state_check(struct native *n, json_t *state, const char *shown,
		       struct native_saved_state *ret, struct eng_error *err);

/* Current lr = peak lr * schedule factor at sched_step. */
double native_current_lr(const struct native *n);

#endif
