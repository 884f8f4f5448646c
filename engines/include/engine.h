/* engine.h — the training-engine interface, its registry and mode context.
 *
 * One `struct engine_ops` vtable mirrors verl's BaseEngine
 * (verl/workers/engine/base.py); engines register it under
 * (model_type, backend, device). Callers use the engine_*() wrappers below,
 * which hold the argument checks (engine_init_config_check and
 * engine_batch_check, the one validation, engine_check.c), the mode context
 * (IDLE/TRAIN/EVAL with auto-offload, written once here rather than per
 * engine) and the rule "a rejected call changes nothing".
 *
 * Threading: an engine is used by one thread at a time (the daemon's engine
 * thread). engine_status() reads only plain fields and may be called from
 * another thread while a job runs.
 *
 * Ownership: buffers passed in are borrowed for the duration of the call;
 * buffers returned are owned by the caller unless said otherwise.
 */
#ifndef ENGINED_ENGINE_H
#define ENGINED_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine_dist.h"
#include "err.h"

enum engine_mode {
	ENGINE_MODE_IDLE = 0,
	ENGINE_MODE_TRAIN = 1,
	ENGINE_MODE_EVAL = 2,
};

enum lr_schedule_type {
	LR_SCHEDULE_CONSTANT = 0,
	LR_SCHEDULE_LINEAR = 1,
	LR_SCHEDULE_COSINE = 2,
};

struct engine_optim_config {
	double lr;            /* peak learning rate */
	double beta1, beta2;  /* torch defaults 0.9, 0.999 */
	double eps;           /* 1e-8 */
	double weight_decay;  /* decoupled (AdamW), 0.01 */
	double clip_grad;     /* max global grad norm; <= 0 disables clipping */
};

struct engine_sched_config {
	enum lr_schedule_type type;
	int64_t warmup_steps;
	int64_t total_steps;
	double min_lr_ratio;  /* cosine/linear floor as a fraction of lr */
	double num_cycles;    /* cosine: 0.5 = half a cosine wave (verl default) */
};

/* Where each state family lives: true = on the compute device. */
struct engine_placement {
	bool model;
	bool optimizer;
	bool grad;
};

enum engine_dtype {
	ENGINE_DTYPE_F32 = 1,
	ENGINE_DTYPE_BF16 = 2,
	ENGINE_DTYPE_F16 = 3,
};

/* Progress of a long call: `done` of `total` units (`unit`: "tensors",
 * "bytes", "micro-batches") in `phase` ("build", "load weights", a file's
 * name, "commit"). The engine calls it on the calling thread, from 0 up to
 * total, with phase and unit in static storage; the callee copies what it
 * keeps and must not call back into the engine. */
typedef void (*engine_progress_fn)(void *ctx, const char *phase, int64_t done,
				   int64_t total, const char *unit);

struct engine_init_config {
	const char *model_type;     /* "language_model" | "value_model" */
	const char *backend;        /* "native" */
	const char *device;         /* "cpu" | "cuda" */
	/* Exactly one of: the text of a HF config.json (random init from seed),
	 * or a directory holding config.json + *.safetensors. The caller has
	 * already confined model_path to its root. */
	const char *hf_config_json;
	const char *model_path;
	uint64_t seed;
	struct engine_optim_config optim;
	struct engine_sched_config sched;
	bool param_offload;         /* offload policy applied when leaving a mode */
	bool optimizer_offload;
	int64_t max_tokens_per_micro_batch;  /* default budget; > 0 */
	int threads;                /* <= 0: device default */
	bool bf16_matmul;           /* matmul inputs in bf16, fp32 accumulate */
	/* The model is a frozen base for LoRA adapters (engine_adapter_create):
	 * no gradients and no optimizer state are kept for it, a training
	 * ForwardBackward or an OptimizerStep of the base itself is refused
	 * (-EALREADY), and forward-only calls score with the base alone
	 * (verl's disable_adapter()). Alone only (not in a group). */
	bool frozen_base;
	/* Floats of one LM-head logits tile (rows x vocabulary chunk); bounds
	 * the head's working memory. 0 = 2M (8 MiB). */
	int64_t lm_tile_floats;
	/* Floats of LM-head logits (tokens x vocabulary) a training
	 * micro-batch may keep from its forward for its backward, which then
	 * skips recomputing them (2 x vocabulary x hidden flops a token): a
	 * memory budget, counted with the activations. 0 = 256M (1 GiB);
	 * -1 = never keep them. */
	int64_t lm_cache_floats;
	/* Bytes the paged key/value cache of engine_sample may hold at most;
	 * 0 = ENGINE_KV_CACHE_DEFAULT. */
	int64_t kv_cache_bytes;
	/* Activation recompute (gradient checkpointing) for training calls
	 * that do not choose: a forward keeps each layer's input only and the
	 * backward recomputes the layer; the gradients are bit for bit those
	 * without it. */
	bool activation_recompute;
	/* Polled between tensors while the model is built (random init or
	 * loading): true stops engine_create with -ECANCELED, nothing kept.
	 * The daemon passes "the client went away or its deadline passed".
	 * NULL: never. */
	bool (*cancelled)(void *ctx);
	void *cancel_ctx;
	/* Data parallelism (docs/DISTRIBUTED.md): world_size <= 1 runs alone.
	 * Else engine_create joins the group of dist.id (blocking until every
	 * rank joined or dist.timeout_s passed) on the device's collective
	 * backend; device fields of dist (stream) are the engine's to set. */
	struct dist_config dist;
	/* Tensors built ("build": random init; "load weights": from
	 * model_path), reported before the first and after each. NULL: none. */
	engine_progress_fn progress;
	void *progress_ctx;
};

/* Defaults used when a field is left 0: lr 1e-5, betas (0.9, 0.999),
 * eps 1e-8, weight_decay 0.01, clip 1.0, constant schedule, 4096 tokens. */
void engine_init_config_defaults(struct engine_init_config *cfg);

/* Limits of sizes that come from clients: tokens in one call and in one
 * micro-batch; floats of one LM-head tile and of the kept logits. Every size derived from them
 * (with the model bounds of model/config.h) fits int64 and size_t. */
#define ENGINE_MAX_TOKENS (INT64_C(1) << 30)
/* Decoder layers a model may have (model/config.h's MODEL_MAX_LAYERS):
 * the bound of engine_fb_result.expert_load's entries. */
#define ENGINE_MAX_LAYERS 1024
/* Experts a token goes to (MODEL_MAX_EXPERTS_PER_TOK): a routing replay's
 * last dimension. */
#define ENGINE_MAX_EXPERTS_PER_TOK 64
#define ENGINE_MAX_LM_TILE_FLOATS (INT64_C(1) << 32)
#define ENGINE_MAX_LM_CACHE_FLOATS (INT64_C(1) << 36)
#define ENGINE_KV_CACHE_DEFAULT (INT64_C(1) << 30)
#define ENGINE_MAX_KV_CACHE_BYTES (INT64_C(1) << 40)

/* The one validation of an init config: model_type, exactly one model
 * source, optimizer and schedule ranges, micro-batch budget, LM tile and
 * logits cache within their limits, hf_config_json parsed (model/config.c's
 * rules).
 * engine_create applies it; callers may apply it earlier. */
int engine_init_config_check(const struct engine_init_config *cfg, struct eng_error *err);
/* Its optimizer part (the ranges of lr, betas, eps, weight_decay,
 * clip_grad), also applied to hyper-parameters read from a checkpoint. */
int engine_optim_config_check(const struct engine_optim_config *o, struct eng_error *err);

/* The loss seam. The engine calls `fn` once per micro-batch after the
 * forward pass with the model outputs in micro-batch order; the loss writes
 * dL/d(output) per token (the engine zeroed those arrays) and keeps its
 * scalar value and metrics in its own context. token_index[i] is the position of micro-batch
 * token i in the request, so the loss can read the request's per-token
 * arrays (mask, advantages, ...). The loss library (engines/loss) provides
 * one implementation; tests provide others. */
struct engine_loss_io {
	int64_t n;                  /* tokens in this micro-batch */
	int32_t num_seqs;
	const int32_t *seq_lens;    /* [num_seqs], micro-batch order */
	const int32_t *seq_index;   /* [num_seqs] index of each sequence in the request */
	const int64_t *token_index; /* [n] */
	const float *log_probs;     /* [n] target-aligned; 0 at sequence starts */
	const float *entropy;       /* [n] */
	const float *values;        /* [n] value model only, else NULL */
	float *d_log_probs;         /* [n] out */
	float *d_entropy;           /* [n] out */
	float *d_values;            /* [n] out, value model only, else NULL */
	bool forward_only;          /* gradients are ignored when set */
	/* Multiplies every gradient the loss writes (not the loss or its
	 * metrics): 1 alone; 1/W in a data-parallel group of W ranks, whose
	 * step sums the ranks' gradients (native_dist.c). 0 means 1. */
	double grad_scale;
};
typedef int (*engine_loss_fn)(void *ctx, struct engine_loss_io *io,
			      struct eng_error *err);

enum { ENGINE_RECOMPUTE_DEFAULT = 0, ENGINE_RECOMPUTE_OFF = 1, ENGINE_RECOMPUTE_ON = 2 };

struct engine_batch {
	int64_t n;                  /* tokens */
	const int32_t *input_ids;   /* [n] packed */
	/* [n] or NULL: entry t's log-prob is of target_ids[t] (from the tokens
	 * before t) instead of input_ids[t]; entry 0 of a sequence is unused. */
	const int32_t *target_ids;
	int32_t num_seqs;
	const int32_t *seq_lens;    /* [num_seqs], sum = n, each >= 1 */
	float temperature;          /* > 0; 0 means 1 */
	bool forward_only;
	/* In a data-parallel group, the last accumulation before the optimizer
	 * step: the gradients are reduced across the ranks while the last
	 * micro-batch's backward pass runs, in buckets (docs/DISTRIBUTED.md),
	 * and the step skips its own reduction. A collective call: every rank
	 * makes it, the ranks agree before the reduction (a failure on one
	 * fails all, with nothing changed), and once it runs it is not
	 * cancelled (cancelled is not polled). Alone: no effect. Not with
	 * forward_only. */
	bool reduce_gradients;
	/* Activation recompute for this call: ENGINE_RECOMPUTE_DEFAULT (the
	 * engine's activation_recompute), ENGINE_RECOMPUTE_OFF or _ON. */
	int activation_recompute;
	int64_t max_tokens_per_micro_batch;  /* 0 = engine default */
	engine_loss_fn loss_fn;     /* may be NULL when forward_only */
	void *loss_ctx;
	/* Polled between micro-batches (the call's safe points): true stops
	 * the call with -ECANCELED and the gradients exactly as they were
	 * before it (see the README: the cost is one gradient-sized copy when
	 * the call adds to gradients of earlier calls, none otherwise). A
	 * call past its last safe point completes. NULL: never. */
	bool (*cancelled)(void *ctx);
	void *cancel_ctx;
	/* Micro-batches done ("forward_backward"), reported before the first
	 * and after each. NULL: none. */
	engine_progress_fn progress;
	void *progress_ctx;
	/* A mixture of experts' routing replay: [n, routed_layers, routed_k]
	 * (NULL: the routers choose), token t's experts in each experts layer
	 * (routed_layers: the experts layers, or every decoder layer, the
	 * dense ones' rows unread). The engine checks the shape against its
	 * model (routed_k its experts_per_tok) and each row's ids (in [0,
	 * num_experts), distinct): -EINVAL naming "routed_experts". */
	const int32_t *routed_experts;
	int64_t routed_layers, routed_k;
};

/* The one validation of a batch: 1 <= n <= ENGINE_MAX_TOKENS, every
 * sequence >= 1 token and the lengths summing to n, temperature finite and
 * >= 0, max_tokens_per_micro_batch in [0, ENGINE_MAX_TOKENS], a loss unless
 * forward_only. engine_forward_backward applies it; callers may apply it
 * earlier. Engines add what needs their state (ids inside the vocabulary;
 * the planner: each sequence fits the micro-batch budget). */
int engine_batch_check(const struct engine_batch *b, struct eng_error *err);

struct engine_fb_result {
	/* Caller-provided buffers of n floats, original order; NULL = not wanted.
	 * values is only written by value models. */
	float *log_probs;
	float *entropy;
	float *values;
	int32_t num_micro_batches;  /* out */
	/* A mixture of experts (out; 0 without): the router's auxiliary loss
	 * of the call, transformers' load_balancing_loss_func of each
	 * micro-batch (one forward) weighted by its share of the tokens,
	 * without the coefficient; router_aux_coef, the coefficient training
	 * added its gradient with (router_aux_loss_coef when the config's
	 * output_router_logits and a training call; else 0). expert_load: a
	 * caller's buffer of expert_layers doubles (in: its capacity; NULL:
	 * not wanted) that gets each experts layer's load, the most tokens an
	 * expert took over the mean (T k / E), the call's micro-batches
	 * counted together; expert_layers (out) their number. */
	double router_aux_loss, router_aux_coef;
	double *expert_load;
	int32_t expert_layers;
	/* want_routed_experts (in): routed_experts (out) gets the routing the
	 * call used, [n, routed_layers, routed_k] in original order (the
	 * experts layers; malloc'ed, the caller frees; NULL for a dense
	 * model or without want_routed_experts). */
	bool want_routed_experts;
	int32_t *routed_experts;
	int64_t routed_layers, routed_k;
};

/* Hyper-parameters of one optimizer step that replace, for that step only,
 * the configured ones (lr: the schedule's). Unset fields keep theirs. */
struct engine_step_params {
	bool has_lr, has_beta1, has_beta2, has_eps, has_weight_decay, has_clip_grad;
	double lr, beta1, beta2, eps, weight_decay, clip_grad;
};

/* The optimizer rules of engine_init_config_check applied to the fields
 * that are set (NULL: nothing set, 0). */
int engine_step_params_check(const struct engine_step_params *p, struct eng_error *err);
/* The one overlay of a step's parameters: each field p sets replaces o's
 * (p NULL: o unchanged). The lr is not in o: a step's has_lr replaces the
 * schedule's lr, which the engine computes. */
void engine_step_params_apply(const struct engine_step_params *p,
			      struct engine_optim_config *o);

/* A step's parameters once checked: engine_step_call_prepare runs
 * engine_step_params_check (p NULL: nothing set) and copies them;
 * engine_optimizer_step_call runs the step without checking them again.
 * A host that validates a request before queueing it (the daemon) checks
 * once this way. */
struct engine_step_call {
	struct engine_step_params params;
};
int engine_step_call_prepare(const struct engine_step_params *p, struct engine_step_call *ret,
			     struct eng_error *err);

struct engine_step_result {
	double grad_norm;           /* before clipping */
	bool skipped;               /* non-finite norm: no update, grads zeroed */
	double lr;                  /* lr used by this step */
	int64_t step;               /* optimizer steps taken so far */
};

/* Checkpoint contents flags. */
enum {
	CKPT_MODEL = 1 << 0,
	CKPT_OPTIMIZER = 1 << 1,
	CKPT_EXTRA = 1 << 2,        /* scheduler, RNG, step */
	CKPT_ALL = CKPT_MODEL | CKPT_OPTIMIZER | CKPT_EXTRA,
};

struct engine_status {
	char key[96];               /* "language_model/native/cpu" */
	bool initialized;
	enum engine_mode mode;
	struct engine_placement placement;
	int64_t step;               /* optimizer steps */
	int64_t sched_step;         /* lr scheduler steps */
	double lr;                  /* current lr */
	/* Training forward_backward calls and tokens whose gradients are held
	 * (since the last optimizer step or zeroing). */
	int64_t accumulated_calls, accumulated_tokens;
	int64_t num_parameters;
	/* How the device's matrix products run (device.matmul), e.g. bf16
	 * emulated through fp32 products where the CPU has no bf16 matmul. */
	char matmul[192];
	size_t device_memory;       /* bytes in use on the device */
	size_t host_memory;         /* bytes held in host memory by the engine */
	/* Activation bytes the last ForwardBackward needed (its longest
	 * micro-batch; with activation recompute, one layer's and each layer's
	 * input); 0 before the first. */
	size_t activation_bytes;
	/* This rank's fp32 parameters and gradients (whole, or its shard of
	 * them with dist.zero_stage 3 / 2 and 3), and the buffers a sharded
	 * group gathers layers and reduces their gradients in (0 with ZeRO-1);
	 * the AdamW moments are optim_bytes. */
	size_t param_bytes, grad_bytes, gathered_bytes;
	/* NULL while healthy; after an unrecoverable device error (a sticky
	 * CUDA error) the error's name: every later call fails and the process
	 * should answer, report NOT_SERVING and exit for a restart. */
	const char *failed;
	/* Data parallelism: world_size 1 when alone (the rest then 0). */
	int dist_rank, dist_world_size;
	int dist_zero_stage;        /* DistConfig.zero_stage: 1, 2 or 3 */
	const char *dist_backend;   /* "gloo" | "nccl" */
	int64_t optim_shard_params; /* AdamW moments held by this rank */
	size_t optim_bytes;
	bool dist_broken;           /* a collective failed: re-initialize */
	int64_t dist_bucket_bytes;  /* of a reducing ForwardBackward */
	/* The last reducing ForwardBackward: buckets and bytes reduced, the
	 * reductions' time, and how long the call waited for them after its
	 * backward pass (the part not overlapped). */
	int64_t reduce_buckets, reduce_bytes;
	double reduce_s, reduce_wait_s;
};

/* One parameter tensor, in Hugging Face naming, borrowed from the engine:
 * valid until the next call that changes parameters or placement. */
struct engine_param_view {
	const char *name;
	int ndim;
	int64_t shape[4];
	int64_t numel;
	const float *host_data;     /* fp32, host-readable (the engine stages it) */
	/* True when host_data is the engine's own state in host memory (not a
	 * staged copy): it stays valid, and may be read from other threads,
	 * until parameters or placement change. */
	bool host_resident;
	/* Parameters only, when host_resident: the values rounded to bf16
	 * (engines/io/round.h), when the engine keeps that copy current (bf16
	 * matmuls on the CPU, after their first product or an optimizer step
	 * that refreshed it); else NULL. Valid as host_data is. */
	const uint16_t *host_bf16;
};

/* The engine's bf16 copy of its parameters, lent as a file that can never
 * change (engine_lend_params_bf16). */
struct engine_lent_file {
	int fd;                     /* the caller's: sealed with F_SEAL_WRITE,
				     * F_SEAL_SHRINK, F_SEAL_GROW, F_SEAL_SEAL */
	int64_t bytes;              /* the file's size */
	/* The copy in this process: a parameter whose host_bf16 is p lies at
	 * byte (p - base) * 2 of the file. */
	const uint16_t *base;
};

/* Which tensors an adapter's parameter views (engine_num_params,
 * engine_param_info, engine_param, engine_param_copy) show, the three
 * ways verl syncs a LoRA model to its rollout (engine_adapter_set_view,
 * below). */
enum engine_adapter_view {
	/* Its A and B matrices alone, PEFT's names (verl's base_sync_done). */
	ENGINE_ADAPTER_VIEW_ADAPTER = 0,
	/* The base alone, in Hugging Face names but every projection's
	 * weight and bias named <module>.base_layer.weight / .bias (verl's
	 * first sync: replace_lora_wrapper). */
	ENGINE_ADAPTER_VIEW_BASE = 1,
	/* The base with each targeted weight merged, W + scale B A, in
	 * Hugging Face names (verl's lora.merge). */
	ENGINE_ADAPTER_VIEW_MERGED = 2,
};
struct engine;  /* opaque */
struct engine_adapter_config;  /* LoRA adapters, below */
struct engine_sample_params;   /* generation, below */

struct engine_ops {
	const char *model_type, *backend, *device;
	int (*initialize)(struct engine *e, const struct engine_init_config *cfg,
			  struct eng_error *err);
	int (*forward_backward)(struct engine *e, const struct engine_batch *b,
				struct engine_fb_result *res, struct eng_error *err);
	/* p: this step's overrides (checked), NULL for none. */
	int (*optimizer_step)(struct engine *e, const struct engine_step_params *p,
			      struct engine_step_result *ret, struct eng_error *err);
	int (*lr_scheduler_step)(struct engine *e, double *ret_lr,
				 struct eng_error *err);
	/* Move state families to the device (to_device=true) or the host.
	 * Families whose flag is false are left where they are. */
	int (*to)(struct engine *e, bool to_device, bool model, bool optimizer,
		  bool grad, struct eng_error *err);
	/* Zero the accumulated gradients (leaving TRAIN, after a step). */
	int (*zero_grad)(struct engine *e, struct eng_error *err);
	/* Parameter iteration: count, then view i (0-based, stable order). */
	int64_t (*num_params)(struct engine *e);
	int (*param)(struct engine *e, int64_t i, struct engine_param_view *ret,
		     struct eng_error *err);
	int (*grad)(struct engine *e, int64_t i, struct engine_param_view *ret,
		    struct eng_error *err);
	int (*param_info)(struct engine *e, int64_t i, struct engine_param_view *ret);
	int (*param_copy)(struct engine *e, int64_t i, enum engine_dtype dtype,
			  int64_t start, int64_t count, void *dst, struct eng_error *err);
	/* Optional (NULL: -ENOTSUP from the wrappers). */
	int (*keep_params_bf16)(struct engine *e, struct eng_error *err);
	int (*lend_params_bf16)(struct engine *e, struct engine_lent_file *ret,
				struct eng_error *err);
	/* `dir` is an absolute path already confined by the caller; NULL on a
	 * rank other than 0 of a group that cannot reach the checkpoint (rank 0
	 * writes or reads its part), refused alone or on rank 0. */
	int (*save_checkpoint)(struct engine *e, const char *dir, int64_t global_step,
			       int max_to_keep, unsigned contents, size_t *ret_bytes,
			       struct eng_error *err);
	int (*load_checkpoint)(struct engine *e, const char *dir, unsigned contents,
			       int64_t *ret_global_step, struct eng_error *err);
	void (*status)(struct engine *e, struct engine_status *ret);
	void (*destroy)(struct engine *e);
	/* Optional (NULL: adapters are -ENOSYS): make adapter `ad` (an engine
	 * object without ops yet) over base e, its ops in *ret_ops; on failure
	 * the implementation has freed what it made. */
	int (*adapter_create)(struct engine *e, const struct engine_adapter_config *cfg,
			      struct engine *ad, const struct engine_ops **ret_ops,
			      struct eng_error *err);
	int (*adapter_info)(struct engine *e, struct engine_adapter_config *ret);
	int (*adapter_view)(struct engine *e, enum engine_adapter_view view,
			    struct eng_error *err);
	/* Optional (NULL: -EALREADY): the engine_sampler_* calls, on the
	 * implementation's batch object. */
	int (*sampler_open)(struct engine *e, void **ret, struct eng_error *err);
	int (*sampler_add)(void *impl, const struct engine_sample_params *p,
			   struct eng_error *err);
	int (*sampler_step)(void *impl, struct eng_error *err);
	int64_t (*sampler_calls)(void *impl);
	void (*sampler_close)(void *impl);
	/* Optional (NULL: the engine is never in a group): engine_group_agree. */
	int (*group_agree)(struct engine *e, int rc, const char *what, struct eng_error *err);
};

/* --- registry ----------------------------------------------------------- */

/* Find the ops for a key. On failure returns -ENODEV and a message listing
 * the registered keys. */
int engine_registry_lookup(const char *model_type, const char *backend,
			   const char *device, const struct engine_ops **ret,
			   struct eng_error *err);
/* Registered keys as "a/b/c, d/e/f" (static storage). */
const char *engine_registry_keys(void);

/* --- a ForwardBackward with the engine's own loss (engine_request.c) ---- */

/* The per-token FLOAT32 inputs a request may carry, by name (the
 * ForwardBackwardRequest fields of the same names): loss_mask,
 * old_log_probs, ... (engine_fb_input_name(i), i < ENGINE_FB_INPUTS). */
#define ENGINE_FB_INPUTS 11
const char *engine_fb_input_name(int i);

/* A request as its sender states it: the batch (its loss_fn and loss_ctx
 * are the engine's; its hooks the caller's), the per-token inputs, and the
 * loss as data (a name and option strings, as LossSpec carries them). */
struct engine_fb_request {
	struct engine_batch batch;
	const float *inputs[ENGINE_FB_INPUTS];   /* [n] each, NULL = absent */
	const char *loss;                        /* NULL or "": no loss */
	size_t num_options;
	const char *const *option_keys;          /* [num_options] */
	const char *const *option_values;
};

/* A request checked once and ready to run (opaque): engine_batch_check's
 * rules, the loss's name and options parsed and the inputs it reads
 * present (value_model: the model yields values, else entropy). -EINVAL
 * naming the field ("loss.name: ...", "loss.options[key]: ...", "loss:
 * ..."); -ENOMEM. The request's arrays and strings are borrowed and must
 * outlive the call; free with engine_fb_call_free (accepts NULL). */
struct engine_fb_call;
int engine_fb_call_prepare(const struct engine_fb_request *r, bool value_model,
			   struct engine_fb_call **ret, struct eng_error *err);
void engine_fb_call_free(struct engine_fb_call *c);

/* The call's loss and its metrics (name: static storage), after a run. */
#define ENGINE_FB_MAX_METRICS 16
struct engine_fb_loss {
	double loss;
	int num_metrics;
	struct { const char *name; double value; } metrics[ENGINE_FB_MAX_METRICS];
};

/* Run a prepared call on e (engine_forward_backward with the call's loss);
 * ret_loss (may be NULL) gets its loss and metrics (all zero without a
 * loss). A call may run once. */
int engine_fb_call_run(struct engine *e, struct engine_fb_call *c,
		       struct engine_fb_result *res, struct engine_fb_loss *ret_loss,
		       struct eng_error *err);

/* --- generation (engine_sample.c; docs/SAMPLING.md) -------------------- */

/* Bounds of a Sample's sizes from clients. */
#define ENGINE_SAMPLE_MAX_SAMPLES 65536       /* completions per prompt */
#define ENGINE_SAMPLE_MAX_NEW_TOKENS (1 << 20)
#define ENGINE_SAMPLE_MAX_TOP_LOGPROBS 20
#define ENGINE_SAMPLE_MAX_STOPS 64            /* stop ids; stop sequences */
#define ENGINE_SAMPLE_MAX_STOP_LEN 64         /* tokens of a stop sequence */

enum engine_finish {
	ENGINE_FINISH_STOP = 1,      /* a stop token or sequence */
	ENGINE_FINISH_LENGTH = 2,    /* max_tokens */
};

/* One finished completion, borrowed for the emit callback. */
struct engine_completion {
	int32_t prompt_index, sample_index;
	int32_t num_tokens;
	const int32_t *tokens;       /* [num_tokens] */
	const float *logprobs;       /* [num_tokens] */
	/* [num_tokens * top_logprobs] each, NULL when top_logprobs is 0 */
	const int32_t *top_ids;
	const float *top_logprobs;
	/* [prompt length] on sample 0 when asked, else NULL */
	const float *prompt_logprobs;
	int32_t prompt_len;
	enum engine_finish finish;
	int64_t weights_version;     /* the optimizer steps behind the weights */
};

/* What SampleRequest says (its fields' meanings, docs/SAMPLING.md). */
struct engine_sample_params {
	const int32_t *input_ids;    /* [n] packed prompts */
	int64_t n;
	const int32_t *seq_lens;     /* [num_prompts], each >= 1, sum n */
	int32_t num_prompts;
	int32_t num_samples;         /* >= 1 */
	int32_t max_tokens;          /* >= 1 */
	float temperature;           /* 0: greedy; else > 0 */
	int32_t top_k;               /* 0: off */
	float top_p;                 /* (0, 1]; 1: off */
	uint64_t seed;
	const int32_t *stop_ids;     /* [num_stop_ids] */
	int32_t num_stop_ids;
	/* Stop sequence i: stop_seq_tokens[stop_seq_off[i] .. stop_seq_off[i+1]) */
	const int32_t *stop_seq_tokens;
	const int32_t *stop_seq_off; /* [num_stop_seqs + 1] */
	int32_t num_stop_seqs;
	int32_t top_logprobs;        /* 0 .. ENGINE_SAMPLE_MAX_TOP_LOGPROBS */
	bool prompt_logprobs;
	int64_t max_tokens_per_micro_batch;  /* prefill chunk; 0: engine default */
	/* Each completion as it finishes; a nonzero return ends the call with
	 * that code (err set by the callback). */
	int (*emit)(void *ctx, const struct engine_completion *c, struct eng_error *err);
	/* Called once when the call ends, from engine_sampler_step or _close:
	 * rc 0 once its last completion is out, else why it ended (err). The
	 * params may be freed from then on. */
	void (*done)(void *ctx, int rc, const struct eng_error *err);
	void *emit_ctx;              /* emit's and done's */
	/* Polled before each step: true ends the call (-ECANCELED) and frees
	 * its cache at once. NULL: never. */
	bool (*cancelled)(void *ctx);
	void *cancel_ctx;
};

/* The rules on params alone (ranges, sizes, stop lists), checked
 * arithmetic: -EINVAL naming the field as SampleRequest does. */
int engine_sample_params_check(const struct engine_sample_params *p, struct eng_error *err);

/* A running batch of Sample calls over one engine (or adapter), which
 * share every decode step (continuous batching): calls join at any step,
 * and each completion of each call is emitted as it finishes. The weights
 * must not change while it is open (the daemon runs nothing else on the
 * engine meanwhile). Open: the paged key/value cache of kv_cache_bytes is
 * made, the mode entered for the batch (EVAL when IDLE). A language model
 * only (a value model: -EALREADY); -E2BIG when the cache holds no block;
 * -EALREADY when the model is not on the device; -ENOMEM. */
struct engine_sampler;
int engine_sampler_open(struct engine *e, struct engine_sampler **ret, struct eng_error *err);
/* Join a call: engine_sample_params_check's rules, token ids inside the
 * vocabulary (-EINVAL), a prompt that alone could never fit the cache
 * (-E2BIG naming kv_cache_bytes), -ENOMEM; on failure nothing joined and
 * done is not called. Its prompts are admitted in order of arrival, after
 * those of the calls before it, as the cache has room. */
int engine_sampler_add(struct engine_sampler *s, const struct engine_sample_params *p,
		       struct eng_error *err);
/* One step: cancelled calls ended, prompts admitted and prefilled, every
 * running completion advanced by one token. A failure of the engine's own
 * (memory, the device) ends every call (done with it) and is returned. */
int engine_sampler_step(struct engine_sampler *s, struct eng_error *err);
/* Calls in the batch that have not ended. */
int64_t engine_sampler_calls(const struct engine_sampler *s);
/* End what remains (done with -ECANCELED), free the cache, leave the mode
 * entered at open. Accepts NULL. */
void engine_sampler_close(struct engine_sampler *s);

/* One call alone: open, add, step until it ends, close; its end code. */
int engine_sample(struct engine *e, const struct engine_sample_params *p,
		  struct eng_error *err);

/* --- LoRA adapters over a frozen base (engine_adapter.c; docs/LORA.md) --- */

/* The modules an adapter may target, by PEFT's names: bit i of
 * engine_adapter_config.targets is engine_lora_module_name(i), i <
 * ENGINE_LORA_MODULES ("q_proj", "k_proj", "v_proj", "o_proj",
 * "gate_proj", "up_proj", "down_proj"); "all-linear" is all of them. */
#define ENGINE_LORA_MODULES 7
#define ENGINE_LORA_ALL_LINEAR ((1u << ENGINE_LORA_MODULES) - 1)
const char *engine_lora_module_name(int i);
/* The bit of a PEFT module name, or of a full module path that ends in one
 * ("model.layers.0.self_attn.q_proj", as peft writes "all-linear" into
 * adapter_config.json); "all-linear" gives every bit. 0: unknown. */
unsigned engine_lora_module_bits(const char *name);

/* An adapter name: 1 to ENGINE_ADAPTER_NAME_MAX characters of
 * [A-Za-z0-9._-], not starting with '.'. */
#define ENGINE_ADAPTER_NAME_MAX 64

struct engine_adapter_config {
	const char *name;
	/* Without peft_dir: rank >= 1 (and at most min(in, out) of every
	 * targeted projection), alpha > 0, targets != 0. With peft_dir, its
	 * adapter_config.json gives them: each here is 0 (take the file's)
	 * or must equal the file's. */
	int64_t rank;
	double alpha;
	unsigned targets;          /* ENGINE_LORA_* bits */
	/* scale = alpha / sqrt(rank) (rsLoRA) instead of alpha / rank; with
	 * peft_dir the file's use_rslora. */
	bool rslora;
	/* A is drawn as PEFT draws it (Kaiming-uniform with a = sqrt(5):
	 * U(-1/sqrt(in), 1/sqrt(in))) from this seed; B starts at 0. */
	uint64_t seed;
	/* NULL, or a PEFT adapter directory (adapter_config.json,
	 * adapter_model.safetensors) already confined by the caller: the
	 * adapter starts from its weights. */
	const char *peft_dir;
	/* The adapter's own AdamW and schedule; unset: the base's. */
	bool has_optim, has_sched;
	struct engine_optim_config optim;
	struct engine_sched_config sched;
};

/* What needs no base: the name, non-negative rank, a finite alpha >= 0,
 * known target bits, the optimizer and schedule ranges. -EINVAL naming
 * the field ("name: ...", "rank: ...", "alpha: ...", "target_modules:
 * ..."). */
int engine_adapter_config_check(const struct engine_adapter_config *c, struct eng_error *err);

/* A LoRA adapter over base (an engine made with frozen_base), as an engine
 * of its own: ForwardBackward runs the base with the adapter added to its
 * targets (y = x W^T + scale (x A^T) B^T) and accumulates gradients into
 * the adapter only; OptimizerStep, ZeroGrad, LrSchedulerStep, ToDevice and
 * the mode context act on the adapter's own parameters, gradients, AdamW
 * moments, step and schedule; the parameter views are its A and B
 * matrices in PEFT's names
 * (base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight), and a
 * value model's adapter owns and trains its score head too (PEFT's
 * modules_to_save: base_model.model.score.weight, .bias; it starts as the
 * base's); its checkpoint is a PEFT directory (adapter_config.json,
 * adapter_model.safetensors) with the optimizer files and
 * engine_state.json beside it. It keeps no bf16 copy (-ENOTSUP). The base
 * is never changed through it, and a frozen base has no checkpoints of
 * its own (-ENOSYS: its weights never change). Destroy every adapter
 * (engine_destroy) before its base. Errors: engine_adapter_config_check's;
 * -EALREADY when base is not a frozen base; -EINVAL for a rank larger than
 * a target allows, or a PEFT directory that does not fit the base (naming
 * the file and key or tensor); -ENOENT / -EPERM / -EBADMSG from its files;
 * -ENOMEM. */
int engine_adapter_create(struct engine *base, const struct engine_adapter_config *cfg,
			  struct engine **ret, struct eng_error *err);

/* The rank, alpha, targets and rslora an adapter was made with (from its
 * PEFT directory, when it came from one). -EINVAL when e is no adapter. */
int engine_adapter_info(struct engine *e, struct engine_adapter_config *ret);

/* Set the view until set again (an adapter starts with
 * ENGINE_ADAPTER_VIEW_ADAPTER; gradients exist in that view only).
 * -EINVAL when e is no adapter or view is unknown; -ENOMEM. */
int engine_adapter_set_view(struct engine *e, enum engine_adapter_view view,
			    struct eng_error *err);

/* In a data-parallel group, every rank's code rc of `what` (a collective
 * every rank must reach, also after a local failure, so that no rank waits
 * for a peer that gave up): 0 when all are 0; this rank's own rc (err
 * already says why); else the first failing peer's code, err naming that
 * rank. Alone: rc. The daemon's parts of a collective call (CreateAdapter:
 * its PEFT directory on this host, its slot and bytes bounds) go through
 * it. */
int engine_group_agree(struct engine *e, int rc, const char *what, struct eng_error *err);

/* --- data-parallel groups (engine_host.c) -------------------------------- */

/* A group of cfg->world_size ranks on `device` may be formed: the size in
 * [2, DIST_MAX_WORLD] and a collective backend built for the device
 * (-EINVAL / -ENODEV naming `world_size` / `device`). */
int engine_group_check(const char *device, int world_size, struct eng_error *err);
/* A new group id from the device's backend (rank 0 of cfg; its store root,
 * host and timeout), and the backend's name (static storage). */
int engine_group_create(const char *device, const struct dist_config *cfg,
			struct dist_group_id *ret_id, const char **ret_backend,
			struct eng_error *err);

/* --- the host, as the engine library sees it (engine_host.c) ------------ */

/* Whether device `name` ("cpu", "cuda") is built into this binary, and the
 * comma-separated names of those that are (static storage). */
bool engine_device_built(const char *name);
const char *engine_device_names(void);
/* Host memory available now (MemAvailable within the cgroup's limit), or
 * SIZE_MAX when unknown. */
size_t engine_host_mem_free(void);
/* The process's CPU budget (affinity and cgroup quota): the threads an
 * engine with threads = 0 runs, and a description of how they were
 * counted into desc (for the log). */
int engine_cpu_budget(char *desc, size_t len);

/* --- engine object and wrappers ---------------------------------------- */

/* Create and initialize an engine for cfg (registry lookup included).
 * On failure *ret is untouched. Destroy with engine_destroy. */
int engine_create(const struct engine_init_config *cfg, struct engine **ret,
		  struct eng_error *err);
void engine_destroy(struct engine *e);  /* accepts NULL */

/* Mode context (verl BaseEngineCtx). Entering TRAIN places model, optimizer
 * and grads on the device; EVAL the model only. Leaving a mode moves to the
 * host what param_offload / optimizer_offload say (grads follow the
 * parameters); leaving TRAIN zeroes grads. disable_auto_offload makes
 * placement changes no-ops. Setting the current mode again only updates
 * disable_auto_offload. Switching TRAIN <-> EVAL leaves the first mode, then
 * enters the second. */
int engine_set_mode(struct engine *e, enum engine_mode mode,
		    bool disable_auto_offload, struct eng_error *err);
enum engine_mode engine_mode(const struct engine *e);

/* Compute calls. Made while IDLE, they enter the mode they need (TRAIN, or
 * EVAL for forward_only) for the duration of the call and leave it after,
 * with auto-offload. Unlike an explicit SetMode, this per-call context keeps
 * the gradients: over RPC, ForwardBackward and OptimizerStep are separate
 * calls (verl's worker runs both inside one context), so zeroing there would
 * silently drop every gradient. forward_backward (not forward_only) or
 * optimizer_step while in EVAL fail with -EALREADY. */
int engine_forward_backward(struct engine *e, const struct engine_batch *b,
			    struct engine_fb_result *res, struct eng_error *err);
int engine_optimizer_step(struct engine *e, struct engine_step_result *ret,
			  struct eng_error *err);
/* The same with this step's hyper-parameters (NULL: the configured ones),
 * checked first; engine_optimizer_step_call with ones already checked. */
int engine_optimizer_step_with(struct engine *e, const struct engine_step_params *p,
			       struct engine_step_result *ret, struct eng_error *err);
int engine_optimizer_step_call(struct engine *e, const struct engine_step_call *c,
			       struct engine_step_result *ret, struct eng_error *err);
/* Drop the accumulated gradients (verl's optimizer_zero_grad); not in EVAL
 * (-EALREADY). Made while IDLE, it enters TRAIN for the call. */
int engine_zero_grad(struct engine *e, struct eng_error *err);
int engine_lr_scheduler_step(struct engine *e, double *ret_lr,
			     struct eng_error *err);
/* model=false requires optimizer=false and grad=false (-EINVAL). */
int engine_to(struct engine *e, bool to_device, bool model, bool optimizer,
	      bool grad, struct eng_error *err);
int64_t engine_num_params(struct engine *e);
int engine_param(struct engine *e, int64_t i, struct engine_param_view *ret,
		 struct eng_error *err);
/* Name, shape and numel of parameter i without copying anything: host_data
 * is set only when host_resident (else NULL). */
int engine_param_info(struct engine *e, int64_t i, struct engine_param_view *ret,
		      struct eng_error *err);
/* Copy elements [start, start + count) of parameter i, converted to `dtype`
 * (bf16 / f16 rounded to nearest even by the device), into host memory
 * dst (count * element size bytes). For weight streaming: the conversion
 * runs on the device, and only the slice asked for is copied. */
int engine_param_copy(struct engine *e, int64_t i, enum engine_dtype dtype,
		      int64_t start, int64_t count, void *dst, struct eng_error *err);
/* Make the engine's bf16 copy of its parameters (engines/io/round.h;
 * engine_param_view.host_bf16) current now, rounding them if it is stale
 * or absent, and keep it current from then on (also an fp32 engine, at 2
 * bytes per parameter: AdamW writes it in its own pass), for the weight
 * exports to send it as it is. -ENOTSUP when the engine keeps no such copy
 * (parameters not in host memory, a device without it), -ENOMEM. */
int engine_keep_params_bf16(struct engine *e, struct eng_error *err);
/* Lend the parameters rounded to bf16 as a sealed file, for consumers on
 * this host (ShareWeights): the engine's own copy, made current first
 * (engine_keep_params_bf16). Nothing is copied: the file is the memory
 * the engine reads, made immutable; the engine writes later values into a
 * new file, and the lent one lives as long as a holder of its descriptor
 * or a mapping. Afterwards every parameter's host_bf16 points into `base`
 * until the parameters change. -ENOTSUP when the engine keeps no such
 * copy (parameters not in host memory, a device without it), -ENOMEM, or
 * another -errno, each with a message. */
int engine_lend_params_bf16(struct engine *e, struct engine_lent_file *ret,
			    struct eng_error *err);
/* Bytes per element of a dtype (4 or 2); 0 for an unknown dtype. */
size_t engine_dtype_size(enum engine_dtype dtype);
/* Gradient of parameter i (same view; host_data = accumulated gradient).
 * For tests and diagnostics. */
int engine_grad(struct engine *e, int64_t i, struct engine_param_view *ret,
		struct eng_error *err);
int engine_save_checkpoint(struct engine *e, const char *dir, int64_t global_step,
			   int max_to_keep, unsigned contents, size_t *ret_bytes,
			   struct eng_error *err);
int engine_load_checkpoint(struct engine *e, const char *dir, unsigned contents,
			   int64_t *ret_global_step, struct eng_error *err);
void engine_status(struct engine *e, struct engine_status *ret);

/* Cancellation of the calls that follow (SaveCheckpoint's safe points:
 * between its files and before it commits; LoadCheckpoint's: once the
 * checkpoint is checked, before any state changes): true stops the call
 * with -ECANCELED and nothing of it visible. NULL: never. engine_cancelled
 * polls it (for implementations). */
void engine_set_cancel(struct engine *e, bool (*cancelled)(void *ctx), void *ctx);
bool engine_cancelled(struct engine *e);

/* Progress of the calls that follow: SaveCheckpoint and LoadCheckpoint
 * report tensor data bytes (headers and JSON files not counted) with the
 * file as the phase, then "commit" (save); a load counts the checksums of
 * every file first ("verify", the files' whole bytes). NULL: none.
 * engine_progress reports (for implementations). */
void engine_set_progress(struct engine *e, engine_progress_fn fn, void *ctx);
void engine_progress(struct engine *e, const char *phase, int64_t done, int64_t total,
		     const char *unit);

/* For engine implementations: the per-engine private pointer and the
 * offload policy the mode context applies. */
void *engine_impl(struct engine *e);
void engine_set_impl(struct engine *e, void *impl);

#endif
