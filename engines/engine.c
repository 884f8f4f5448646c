/* engine.c — the engine object: thin engine_*() wrappers over the ops
 * table holding argument checks and the mode context (verl BaseEngineCtx),
 * written once for every engine. */
#include "engine.h"
#include "engine_calls.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct engine {
	const struct engine_ops *ops;
	void *impl;
	enum engine_mode mode;
	bool no_auto_offload;      /* disable_auto_offload of the current mode */
	bool param_offload;
	bool optimizer_offload;
	bool (*cancelled)(void *ctx);   /* engine_set_cancel */
	void *cancel_ctx;
	engine_progress_fn progress;    /* engine_set_progress */
	void *progress_ctx;
};

void engine_init_config_defaults(struct engine_init_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	cfg->model_type = "language_model";
	cfg->backend = "native";
	cfg->device = "cpu";
	cfg->seed = 0;
	cfg->optim.lr = 1e-5;
	cfg->optim.beta1 = 0.9;
	cfg->optim.beta2 = 0.999;
	cfg->optim.eps = 1e-8;
	cfg->optim.weight_decay = 0.01;
	cfg->optim.clip_grad = 1.0;
	cfg->sched.type = LR_SCHEDULE_CONSTANT;
	cfg->sched.num_cycles = 0.5;
	cfg->max_tokens_per_micro_batch = 4096;
}

void engine_set_cancel(struct engine *e, bool (*cancelled)(void *ctx), void *ctx)
{
	e->cancelled = cancelled;
	e->cancel_ctx = ctx;
}

bool engine_cancelled(struct engine *e)
{
	return e->cancelled && e->cancelled(e->cancel_ctx);
}

void engine_set_progress(struct engine *e, engine_progress_fn fn, void *ctx)
{
	e->progress = fn;
	e->progress_ctx = ctx;
}

void engine_progress(struct engine *e, const char *phase, int64_t done, int64_t total,
		     const char *unit)
{
	if (e->progress)
		e->progress(e->progress_ctx, phase, done, total, unit);
}

void *engine_impl(struct engine *e)
{
	return e->impl;
}

void engine_set_impl(struct engine *e, void *impl)
{
	e->impl = impl;
}

int engine_create(const struct engine_init_config *cfg, struct engine **ret,
		  struct eng_error *err)
{
	const struct engine_ops *ops;
	struct engine *e;
	int rc;

	rc = engine_init_config_check(cfg, err);
	if (rc)
		return rc;
	rc = engine_registry_lookup(cfg->model_type, cfg->backend ? cfg->backend : "",
				    cfg->device ? cfg->device : "", &ops, err);
	if (rc)
		return rc;
	e = calloc(1, sizeof(*e));
	if (!e)
		return eng_fail(err, -ENOMEM, "engine: out of memory");
	e->ops = ops;
	e->param_offload = cfg->param_offload;
	e->optimizer_offload = cfg->optimizer_offload;
	rc = ops->initialize(e, cfg, err);
	if (rc == 0)
		rc = ops->to(e, false, cfg->param_offload, cfg->optimizer_offload,
			     cfg->param_offload, err);
	if (rc) {
		ops->destroy(e);
		free(e);
		return rc;
	}
	*ret = e;
	return 0;
}

struct engine *engine_new(const struct engine_ops *ops, const struct engine *like)
{
	struct engine *e = calloc(1, sizeof(*e));

	if (!e)
		return NULL;
	e->ops = ops;
	if (like) {
		e->param_offload = like->param_offload;
		e->optimizer_offload = like->optimizer_offload;
	}
	return e;
}

void engine_set_ops(struct engine *e, const struct engine_ops *ops)
{
	e->ops = ops;
}

const struct engine_ops *engine_ops_of(const struct engine *e)
{
	return e->ops;
}

void engine_destroy(struct engine *e)
{
	if (!e)
		return;
	e->ops->destroy(e);
	free(e);
}

enum engine_mode engine_mode(const struct engine *e)
{
	return e->mode;
}

/* --- mode context ------------------------------------------------------ */

static int mode_enter(struct engine *e, enum engine_mode mode, bool no_offload,
		      struct eng_error *err)
{
	int rc = 0;

	if (!no_offload && mode == ENGINE_MODE_TRAIN)
		rc = e->ops->to(e, true, true, true, true, err);
	else if (!no_offload && mode == ENGINE_MODE_EVAL)
		rc = e->ops->to(e, true, true, false, false, err);
	if (rc)
		return rc;
	e->mode = mode;
	e->no_auto_offload = no_offload;
	return 0;
}

static int mode_exit(struct engine *e, bool zero_grad, struct eng_error *err)
{
	int rc = 0;

	if (zero_grad && e->mode == ENGINE_MODE_TRAIN)
		rc = e->ops->zero_grad(e, err);
	if (rc == 0 && !e->no_auto_offload)
		rc = e->ops->to(e, false, e->param_offload, e->optimizer_offload,
				e->param_offload, err);
	e->mode = ENGINE_MODE_IDLE;
	e->no_auto_offload = false;
	return rc;
}

int engine_set_mode(struct engine *e, enum engine_mode mode,
		    bool disable_auto_offload, struct eng_error *err)
{
	int rc;

	if (mode != ENGINE_MODE_IDLE && mode != ENGINE_MODE_TRAIN && mode != ENGINE_MODE_EVAL)
		return eng_fail(err, -EINVAL, "mode: unknown mode %d", (int)mode);
	if (mode == e->mode) {
		e->no_auto_offload = disable_auto_offload;
		return 0;
	}
	if (e->mode != ENGINE_MODE_IDLE) {
		rc = mode_exit(e, true, err);
		if (rc)
			return rc;
	}
	if (mode == ENGINE_MODE_IDLE)
		return 0;
	return mode_enter(e, mode, disable_auto_offload, err);
}

/* Run `fn` inside the per-call context when IDLE (see engine.h). */
struct call_ctx {
	bool entered;
};

static int call_begin(struct engine *e, enum engine_mode need, struct call_ctx *c,
		      struct eng_error *err)
{
	c->entered = false;
	if (e->mode != ENGINE_MODE_IDLE)
		return 0;
	c->entered = true;
	return mode_enter(e, need, false, err);
}

static int call_end(struct engine *e, const struct call_ctx *c, int rc,
		    struct eng_error *err)
{
	int rc2;

	if (!c->entered)
		return rc;
	rc2 = mode_exit(e, false, err);
	return rc ? rc : rc2;
}

/* --- compute ----------------------------------------------------------- */

int engine_forward_backward(struct engine *e, const struct engine_batch *b,
			    struct engine_fb_result *res, struct eng_error *err)
{
	int rc = engine_batch_check(b, err);

	return rc ? rc : engine_forward_backward_checked(e, b, res, err);
}

bool engine_is_value_model(const struct engine *e)
{
	return strcmp(e->ops->model_type, "value_model") == 0;
}

int engine_forward_backward_checked(struct engine *e, const struct engine_batch *b,
				    struct engine_fb_result *res, struct eng_error *err)
{
	struct call_ctx c;
	int rc;

	if (!b->forward_only && e->mode == ENGINE_MODE_EVAL)
		return eng_fail(err, -EALREADY,
				"forward_only: a training forward_backward is not allowed in EVAL mode");
	rc = call_begin(e, b->forward_only ? ENGINE_MODE_EVAL : ENGINE_MODE_TRAIN, &c, err);
	if (rc)
		return rc;
	rc = e->ops->forward_backward(e, b, res, err);
	return call_end(e, &c, rc, err);
}

/* --- generation ---------------------------------------------------------- */

struct engine_sampler {
	struct engine *e;
	struct call_ctx c;
	void *impl;
};

int engine_sampler_open(struct engine *e, struct engine_sampler **ret, struct eng_error *err)
{
	struct engine_sampler *s;
	int rc;

	if (!e->ops->sampler_open || engine_is_value_model(e))
		return eng_fail(err, -EALREADY, "Sample: a %s has no language model head to sample",
				e->ops->model_type);
	s = calloc(1, sizeof(*s));
	if (!s)
		return eng_fail(err, -ENOMEM, "Sample: out of host memory");
	s->e = e;
	rc = call_begin(e, ENGINE_MODE_EVAL, &s->c, err);
	if (!rc)
		rc = e->ops->sampler_open(e, &s->impl, err);
	if (rc) {
		(void)call_end(e, &s->c, rc, err);
		free(s);
		return rc;
	}
	*ret = s;
	return 0;
}

int engine_sampler_add(struct engine_sampler *s, const struct engine_sample_params *p,
		       struct eng_error *err)
{
	int rc = engine_sample_params_check(p, err);

	if (!rc && !p->done)
		rc = eng_fail(err, -EINVAL, "sample: no done callback");
	return rc ? rc : s->e->ops->sampler_add(s->impl, p, err);
}

int engine_sampler_step(struct engine_sampler *s, struct eng_error *err)
{
	return s->e->ops->sampler_step(s->impl, err);
}

int64_t engine_sampler_calls(const struct engine_sampler *s)
{
	return s->e->ops->sampler_calls(s->impl);
}

void engine_sampler_close(struct engine_sampler *s)
{
	struct eng_error err;

	if (!s)
		return;
	s->e->ops->sampler_close(s->impl);
	eng_error_clear(&err);
	(void)call_end(s->e, &s->c, 0, &err);
	free(s);
}

/* engine_sample's done: the call's end code and message. */
struct sample_end {
	int rc;
	bool ended;
	struct eng_error *err;
	int (*emit)(void *ctx, const struct engine_completion *c, struct eng_error *err);
	void *ctx;
};

static int sample_emit(void *ctx, const struct engine_completion *c, struct eng_error *err)
{
	struct sample_end *end = ctx;

	return end->emit(end->ctx, c, err);
}

static void sample_done(void *ctx, int rc, const struct eng_error *err)
{
	struct sample_end *end = ctx;

	end->ended = true;
	end->rc = rc;
	if (rc && err)
		*end->err = *err;
}

int engine_sample(struct engine *e, const struct engine_sample_params *p,
		  struct eng_error *err)
{
	struct sample_end end = { .err = err, .emit = p->emit, .ctx = p->emit_ctx };
	struct engine_sample_params q = *p;
	struct engine_sampler *s;
	int rc;

	q.emit = sample_emit;
	q.done = sample_done;
	q.emit_ctx = &end;
	rc = engine_sampler_open(e, &s, err);
	if (rc)
		return rc;
	rc = engine_sampler_add(s, &q, err);
	while (!rc && !end.ended)
		rc = engine_sampler_step(s, err);
	engine_sampler_close(s);
	return rc ? rc : end.rc;
}

int engine_optimizer_step(struct engine *e, struct engine_step_result *ret,
			  struct eng_error *err)
{
	return engine_optimizer_step_with(e, NULL, ret, err);
}

int engine_optimizer_step_with(struct engine *e, const struct engine_step_params *p,
			       struct engine_step_result *ret, struct eng_error *err)
{
	struct engine_step_call call;
	int rc = engine_step_call_prepare(p, &call, err);

	return rc ? rc : engine_optimizer_step_call(e, &call, ret, err);
}

int engine_optimizer_step_call(struct engine *e, const struct engine_step_call *sc,
			       struct engine_step_result *ret, struct eng_error *err)
{
	struct call_ctx c;
	int rc;

	if (e->mode == ENGINE_MODE_EVAL)
		return eng_fail(err, -EALREADY, "mode: optimizer_step is not allowed in EVAL mode");
	rc = call_begin(e, ENGINE_MODE_TRAIN, &c, err);
	if (rc)
		return rc;
	rc = e->ops->optimizer_step(e, &sc->params, ret, err);
	return call_end(e, &c, rc, err);
}

int engine_zero_grad(struct engine *e, struct eng_error *err)
{
	struct call_ctx c;
	int rc;

	if (e->mode == ENGINE_MODE_EVAL)
		return eng_fail(err, -EALREADY, "mode: zero_grad is not allowed in EVAL mode");
	rc = call_begin(e, ENGINE_MODE_TRAIN, &c, err);
	if (rc)
		return rc;
	rc = e->ops->zero_grad(e, err);
	return call_end(e, &c, rc, err);
}

int engine_lr_scheduler_step(struct engine *e, double *ret_lr, struct eng_error *err)
{
	return e->ops->lr_scheduler_step(e, ret_lr, err);
}

int engine_to(struct engine *e, bool to_device, bool model, bool optimizer,
	      bool grad, struct eng_error *err)
{
	if (!model && (optimizer || grad))
		return eng_fail(err, -EINVAL,
				"model: model=false requires optimizer=false and grad=false");
	return e->ops->to(e, to_device, model, optimizer, grad, err);
}

int64_t engine_num_params(struct engine *e)
{
	return e->ops->num_params(e);
}

int engine_param(struct engine *e, int64_t i, struct engine_param_view *ret,
		 struct eng_error *err)
{
	if (i < 0 || i >= e->ops->num_params(e))
		return eng_fail(err, -EINVAL, "index: parameter %lld out of range", (long long)i);
	return e->ops->param(e, i, ret, err);
}

size_t engine_dtype_size(enum engine_dtype dtype)
{
	switch (dtype) {
	case ENGINE_DTYPE_F32: return 4;
	case ENGINE_DTYPE_BF16: return 2;
	case ENGINE_DTYPE_F16: return 2;
	default: return 0;
	}
}

int engine_param_info(struct engine *e, int64_t i, struct engine_param_view *ret,
		      struct eng_error *err)
{
	if (i < 0 || i >= e->ops->num_params(e))
		return eng_fail(err, -EINVAL, "index: parameter %lld out of range", (long long)i);
	return e->ops->param_info(e, i, ret);
}

int engine_keep_params_bf16(struct engine *e, struct eng_error *err)
{
	if (!e->ops->keep_params_bf16)
		return eng_fail(err, -ENOTSUP, "the %s engine keeps no bf16 copy",
				e->ops->backend);
	return e->ops->keep_params_bf16(e, err);
}

int engine_lend_params_bf16(struct engine *e, struct engine_lent_file *ret,
			    struct eng_error *err)
{
	if (!e->ops->lend_params_bf16)
		return eng_fail(err, -ENOTSUP, "the %s engine keeps no bf16 copy to lend",
				e->ops->backend);
	return e->ops->lend_params_bf16(e, ret, err);
}

int engine_param_copy(struct engine *e, int64_t i, enum engine_dtype dtype,
		      int64_t start, int64_t count, void *dst, struct eng_error *err)
{
	struct engine_param_view v;
	int rc;

	if (!engine_dtype_size(dtype))
		return eng_fail(err, -EINVAL, "dtype: unsupported dtype %d", (int)dtype);
	rc = engine_param_info(e, i, &v, err);
	if (rc)
		return rc;
	if (start < 0 || count < 0 || start + count > v.numel)
		return eng_fail(err, -EINVAL, "%s: slice [%lld, %lld) outside %lld elements",
				v.name, (long long)start, (long long)(start + count),
				(long long)v.numel);
	return e->ops->param_copy(e, i, dtype, start, count, dst, err);
}

int engine_grad(struct engine *e, int64_t i, struct engine_param_view *ret,
		struct eng_error *err)
{
	if (i < 0 || i >= e->ops->num_params(e))
		return eng_fail(err, -EINVAL, "index: parameter %lld out of range", (long long)i);
	return e->ops->grad(e, i, ret, err);
}

int engine_save_checkpoint(struct engine *e, const char *dir, int64_t global_step,
			   int max_to_keep, unsigned contents, size_t *ret_bytes,
			   struct eng_error *err)
{
	if (dir && !*dir)
		return eng_fail(err, -EINVAL, "path: empty checkpoint path");
	if (contents == 0)
		contents = CKPT_ALL;
	if (contents & ~(unsigned)CKPT_ALL)
		return eng_fail(err, -EINVAL, "contents: unknown flags 0x%x", contents);
	if (max_to_keep < 0)
		return eng_fail(err, -EINVAL, "max_to_keep: must be >= 0");
	if (global_step < 0)
		return eng_fail(err, -EINVAL, "global_step: must be >= 0");
	return e->ops->save_checkpoint(e, dir, global_step, max_to_keep, contents,
				       ret_bytes, err);
}

int engine_load_checkpoint(struct engine *e, const char *dir, unsigned contents,
			   int64_t *ret_global_step, struct eng_error *err)
{
	if (dir && !*dir)
		return eng_fail(err, -EINVAL, "path: empty checkpoint path");
	if (contents == 0)
		contents = CKPT_ALL;
	if (contents & ~(unsigned)CKPT_ALL)
		return eng_fail(err, -EINVAL, "contents: unknown flags 0x%x", contents);
	return e->ops->load_checkpoint(e, dir, contents, ret_global_step, err);
}

void engine_status(struct engine *e, struct engine_status *ret)
{
	memset(ret, 0, sizeof(*ret));
	e->ops->status(e, ret);
	ret->mode = e->mode;
}
