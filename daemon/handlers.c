/* handlers.c — validate and run functions of the unary RPCs.
 *
 * validate_*() run on a poller thread and only read the request and the
 * daemon's configuration: whatever they reject never reaches the engine.
 * run_*() run on the engine thread (or inline for GetStatus / Health) and
 * leave the packed reply in the job. Messages name the request field.
 */
#include "handlers.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engined/v1/engine.pb-c.h"
#include "fb_request.h"
#include "log.h"
#include "pb_has.h"
#include "paths.h"
#include "presets.h"
#include "replay.h"
#include "test_hold.h"

#ifndef ENGINED_VERSION
#define ENGINED_VERSION "unknown"
#endif

/* --- helpers ------------------------------------------------------------- */

static Engined__V1__Mode mode_to_proto(enum engine_mode m)
{
	switch (m) {
	case ENGINE_MODE_TRAIN: return ENGINED__V1__MODE__MODE_TRAIN;
	case ENGINE_MODE_EVAL: return ENGINED__V1__MODE__MODE_EVAL;
	default: return ENGINED__V1__MODE__MODE_IDLE;
	}
}

static void placement_to_proto(const struct engine_placement *p,
			       Engined__V1__Placement *out)
{
	engined__v1__placement__init(out);
	out->model = p->model;
	out->optimizer = p->optimizer;
	out->grad = p->grad;
}

static int parse_contents(char **items, size_t n, const char *field,
			  unsigned *ret, struct eng_error *err)
{
	unsigned c = 0;

	for (size_t i = 0; i < n; i++) {
		if (strcmp(items[i], "model") == 0)
			c |= CKPT_MODEL;
		else if (strcmp(items[i], "optimizer") == 0)
			c |= CKPT_OPTIMIZER;
		else if (strcmp(items[i], "extra") == 0)
			c |= CKPT_EXTRA;
		else
			return eng_fail(err, -EINVAL,
					"%s[%zu]: unknown '%s' (model, optimizer, extra)",
					field, i, items[i]);
	}
	*ret = c ? c : CKPT_ALL;
	return 0;
}

/* OptimizerConfig's fields that are set, over c's (Initialize,
 * CreateAdapter); the ranges are engine_init_config_check's and
 * engine_adapter_config_check's. */
static void optim_from_proto(const Engined__V1__OptimizerConfig *o,
			     struct engine_optim_config *c)
{
	if (PB_HAS(o, lr))
		c->lr = o->lr;
	if (PB_HAS(o, beta1))
		c->beta1 = o->beta1;
	if (PB_HAS(o, beta2))
		c->beta2 = o->beta2;
	if (PB_HAS(o, eps))
		c->eps = o->eps;
	if (PB_HAS(o, weight_decay))
		c->weight_decay = o->weight_decay;
	if (PB_HAS(o, clip_grad))
		c->clip_grad = o->clip_grad;
}

/* LrSchedulerConfig over c (Initialize, CreateAdapter); -EINVAL for an
 * unknown type. */
static int sched_from_proto(const Engined__V1__LrSchedulerConfig *s,
			    struct engine_sched_config *c, struct eng_error *err)
{
	if (!s->type[0] || strcmp(s->type, "constant") == 0)
		c->type = LR_SCHEDULE_CONSTANT;
	else if (strcmp(s->type, "cosine") == 0)
		c->type = LR_SCHEDULE_COSINE;
	else if (strcmp(s->type, "linear") == 0)
		c->type = LR_SCHEDULE_LINEAR;
	else
		return eng_fail(err, -EINVAL,
				"lr_scheduler.type: unknown '%s' (constant, cosine, linear)",
				s->type);
	c->warmup_steps = s->warmup_steps;
	c->total_steps = s->total_steps;
	if (PB_HAS(s, min_lr_ratio))
		c->min_lr_ratio = s->min_lr_ratio;
	if (PB_HAS(s, num_cycles))
		c->num_cycles = s->num_cycles;
	return 0;
}

/* --- Initialize ---------------------------------------------------------- */

struct init_prep {
	struct engine_init_config cfg;
	struct paths_pin model;       /* model_path pinned beneath the root, owned */
};

static void init_prep_free(void *p)
{
	struct init_prep *ip = p;

	if (!ip)
		return;
	paths_unpin(&ip->model);
	free(ip);
}

int h_validate_initialize(struct daemon *d, struct job *j, struct eng_error *err)
{
	const Engined__V1__InitializeRequest *q = (const void *)j->req;
	const struct engine_ops *ops;
	struct init_prep *ip;
	struct engine_init_config *c;
	int sources = 0, r;

	ip = calloc(1, sizeof(*ip));
	if (!ip)
		return -ENOMEM;
	ip->model.fd = -1;
	j->prep = ip;
	j->prep_free = init_prep_free;
	c = &ip->cfg;
	engine_init_config_defaults(c);

	if (q->model_type[0])
		c->model_type = q->model_type;
	if (q->backend[0])
		c->backend = q->backend;
	if (q->device[0])
		c->device = q->device;
	else if (d->cfg.default_device)
		c->device = d->cfg.default_device;
	sources = (q->hf_config_json[0] != 0) + (q->model_path[0] != 0) + (q->preset[0] != 0);
	if (sources != 1)
		return eng_fail(err, -EINVAL,
				"hf_config_json, model_path, preset: exactly one must be set (%d given)",
				sources);
	if (q->preset[0]) {
		c->hf_config_json = preset_config_json(q->preset);
		if (!c->hf_config_json)
			return eng_fail(err, -EINVAL, "preset: unknown '%s' (%s)", q->preset,
					preset_names());
	} else if (q->hf_config_json[0]) {
		c->hf_config_json = q->hf_config_json;
	} else {
		/* Pinned now, read on the engine thread through the pin. */
		r = paths_pin(d->cfg.model_root, q->model_path, "model_path", PIN_DIR,
			      &ip->model, err);
		if (r < 0)
			return r;
		c->model_path = ip->model.path;
	}
	c->seed = q->seed;
	/* Unset fields keep the defaults; set ones (0 included) go to the one
	 * validation (engine_init_config_check). */
	if (q->optimizer)
		optim_from_proto(q->optimizer, &c->optim);
	if (q->lr_scheduler && (r = sched_from_proto(q->lr_scheduler, &c->sched, err)) < 0)
		return r;
	if (q->offload) {
		c->param_offload = q->offload->param_offload;
		c->optimizer_offload = q->offload->optimizer_offload;
	} else {
		c->param_offload = d->cfg.param_offload;
		c->optimizer_offload = d->cfg.optimizer_offload;
	}
	if (q->max_tokens_per_micro_batch != 0)
		c->max_tokens_per_micro_batch = q->max_tokens_per_micro_batch;
	else if (d->cfg.default_micro_batch_tokens > 0)
		c->max_tokens_per_micro_batch = d->cfg.default_micro_batch_tokens;
	if (q->dist) {
		const Engined__V1__DistConfig *g = q->dist;

		c->dist.rank = g->rank;
		c->dist.world_size = g->world_size;
		/* Copied only if it fits (data is NULL when empty); the length
		 * stays, and engine_init_config_check refuses a long id. */
		if (g->group_id.len && g->group_id.len <= DIST_GROUP_ID_MAX)
			memcpy(c->dist.id.bytes, g->group_id.data, g->group_id.len);
		c->dist.id.len = g->group_id.len;
		c->dist.timeout_s = PB_HAS(g, timeout_s) ? g->timeout_s
			: (double)d->cfg.dist_timeout_ms / 1000.0;
		c->dist.store_root = d->cfg.dist_store_root;
		c->dist.host = d->cfg.dist_host;
		c->dist.bucket_bytes = g->bucket_bytes;
		if (PB_HAS(g, zero_stage)) {
			/* Given: 0 is refused too (c's 0 would mean "not given"). */
			r = dist_zero_stage_check(g->zero_stage, err);
			if (r < 0)
				return r;
			c->dist.zero_stage = g->zero_stage;
		}
	}
	c->threads = d->cfg.threads;
	c->bf16_matmul = q->bf16_matmul;
	c->frozen_base = q->frozen_base;
	c->kv_cache_bytes = q->kv_cache_bytes;
	c->activation_recompute = q->_activation_recompute_case ==
		ENGINED__V1__INITIALIZE_REQUEST___ACTIVATION_RECOMPUTE_ACTIVATION_RECOMPUTE &&
		q->activation_recompute;
	r = engine_init_config_check(c, err);
	if (r < 0)
		return r;
	return engine_registry_lookup(c->model_type, c->backend, c->device, &ops, err);
}

static bool call_gone(void *call)
{
	return rpc_call_cancelled(call);
}

bool h_call_gone(void *call)
{
	test_hold_safe_point(call_gone, call);
	return rpc_call_cancelled(call);
}

int h_run_initialize(struct daemon *d, struct job *j, struct eng_error *err)
{
	struct init_prep *ip = j->prep;
	const Engined__V1__InitializeRequest *q = (const void *)j->req;
	Engined__V1__InitializeResponse resp = ENGINED__V1__INITIALIZE_RESPONSE__INIT;
	struct engine_status st;
	struct engine *e = NULL, *old = d->engine;
	int r;

	/* A failed Initialize leaves the previous engine as it was; on
	 * success the old one is replaced. Zero-copy slices of a finished
	 * stream may still point at the old parameters. */
	if (old && !q->replace) {
		struct engine_status cur;

		engine_status(old, &cur);
		return eng_fail(err, -EALREADY,
				"Initialize: an engine is already initialized (%s, step %lld); set "
				"replace to replace it", cur.key, (long long)cur.step);
	}
	/* A long build stops when its client goes away or its deadline passes. */
	ip->cfg.cancelled = h_call_gone;
	ip->cfg.cancel_ctx = j->call;
	ip->cfg.progress = daemon_progress;
	ip->cfg.progress_ctx = d;
	r = engine_create(&ip->cfg, &e, err);
	/* A model_path error names the file as the client knows it (the
	 * engine saw "/proc/self/fd/N/..."). */
	r = paths_pin_result(&ip->model, r, err);
	if (r < 0)
		return r;
	daemon_wait_engine_mem(d);
	/* The old engine's adapters go first, before their base. */
	for (int i = 0; i < d->adapters.n; i++)
		replay_forget_scope(d->replay, d->adapters.v[i].name);
	adapters_clear(&d->adapters);
	d->engine = e;
	engine_destroy(old);
	d->num_tensors = engine_num_params(e);
	engine_status(e, &st);
	log_msg(LOG_LVL_INFO, "engine %s: %lld parameters in %lld tensors; matmul: %s", st.key,
		(long long)st.num_parameters, (long long)d->num_tensors, st.matmul);
	resp.engine_key = st.key;
	resp.num_parameters = st.num_parameters;
	resp.num_tensors = d->num_tensors;
	return job_set_reply(j, &resp.base);
}

/* --- SetMode ------------------------------------------------------------- */

static int mode_from_proto(Engined__V1__Mode m, enum engine_mode *ret)
{
	switch (m) {
	case ENGINED__V1__MODE__MODE_IDLE: *ret = ENGINE_MODE_IDLE; return 0;
	case ENGINED__V1__MODE__MODE_TRAIN: *ret = ENGINE_MODE_TRAIN; return 0;
	case ENGINED__V1__MODE__MODE_EVAL: *ret = ENGINE_MODE_EVAL; return 0;
	default: return -EINVAL;
	}
}

int h_validate_set_mode(struct daemon *d, struct job *j, struct eng_error *err)
{
	const Engined__V1__SetModeRequest *q = (const void *)j->req;
	enum engine_mode m;

	if (mode_from_proto(q->mode, &m) < 0)
		return eng_fail(err, -EINVAL,
				"mode: must be MODE_IDLE, MODE_TRAIN or MODE_EVAL (got %d)",
				(int)q->mode);
	return 0;
}

int h_run_set_mode(struct daemon *d, struct job *j, struct eng_error *err)
{
	const Engined__V1__SetModeRequest *q = (const void *)j->req;
	Engined__V1__SetModeResponse resp = ENGINED__V1__SET_MODE_RESPONSE__INIT;
	Engined__V1__Placement pl;
	struct engine_status st;
	enum engine_mode m = ENGINE_MODE_IDLE;
	int r;

	struct engine *e;

	(void)mode_from_proto(q->mode, &m);
	r = daemon_engine_of(d, q->adapter, &e, err);
	if (r < 0)
		return r;
	r = engine_set_mode(e, m, q->disable_auto_offload, err);
	if (r < 0)
		return r;
	engine_status(e, &st);
	placement_to_proto(&st.placement, &pl);
	resp.mode = mode_to_proto(st.mode);
	resp.placement = &pl;
	return job_set_reply(j, &resp.base);
}

/* --- ForwardBackward ----------------------------------------------------- */

int h_validate_forward_backward(struct daemon *d, struct job *j, struct eng_error *err)
{
	const Engined__V1__ForwardBackwardRequest *q = (const void *)j->req;
	struct fb_prep *p;
	bool value_model;

	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	j->prep = p;
	j->prep_free = fb_prep_free;
	pthread_mutex_lock(&d->lock);
	value_model = strncmp(d->snap.key, "value_model/", 12) == 0;
	pthread_mutex_unlock(&d->lock);
	/* A long call stops when its client goes away or its deadline passes,
	 * and reports its micro-batches. */
	p->req.batch.cancelled = h_call_gone;
	p->req.batch.cancel_ctx = j->call;
	p->req.batch.progress = daemon_progress;
	p->req.batch.progress_ctx = d;
	return fb_request_decode(p, q, value_model, err);
}

int h_run_forward_backward(struct daemon *d, struct job *j, struct eng_error *err)
{
	const Engined__V1__ForwardBackwardRequest *q = (const void *)j->req;
	struct fb_prep *p = j->prep;
	Engined__V1__ForwardBackwardResponse resp = ENGINED__V1__FORWARD_BACKWARD_RESPONSE__INIT;
	Engined__V1__Tensor t_lp = ENGINED__V1__TENSOR__INIT;
	Engined__V1__Tensor t_ent = ENGINED__V1__TENSOR__INIT;
	Engined__V1__Tensor t_val = ENGINED__V1__TENSOR__INIT;
	Engined__V1__Tensor t_route = ENGINED__V1__TENSOR__INIT;
	Engined__V1__ForwardBackwardResponse__MetricsEntry ment[FB_MAX_METRICS];
	Engined__V1__ForwardBackwardResponse__MetricsEntry *mptr[FB_MAX_METRICS];
	const int64_t n = p->req.batch.n;
	struct engine_fb_result res;
	struct engine_fb_loss fl;
	double load[ENGINE_MAX_LAYERS];  /* each experts layer's load */
	int64_t shape_n = n, shape_route[3];
	float *lp = NULL, *ent = NULL, *val = NULL;
	struct engine *e;
	int r;

	r = daemon_engine_of(d, q->adapter, &e, err);
	if (r < 0)
		return r;
	memset(&res, 0, sizeof(res));
	if (q->return_log_probs && !(lp = malloc((size_t)n * sizeof(float))))
		goto nomem;
	if (q->return_entropy && !(ent = malloc((size_t)n * sizeof(float))))
		goto nomem;
	if (q->return_values && !(val = calloc((size_t)n, sizeof(float))))
		goto nomem;
	res.log_probs = lp;
	res.entropy = ent;
	res.values = val;
	res.expert_load = load;
	res.expert_layers = (int32_t)(sizeof(load) / sizeof(load[0]));
	res.want_routed_experts = q->return_routed_experts;
	r = engine_fb_call_run(e, p->call, &res, &fl, err);
	if (r < 0)
		goto out;

	resp.num_micro_batches = res.num_micro_batches;
	resp.n_expert_load = (size_t)res.expert_layers;
	resp.expert_load = load;
	if (lp) {
		t_lp.dtype = ENGINED__V1__DTYPE__FLOAT32;
		t_lp.n_shape = 1;
		t_lp.shape = &shape_n;
		t_lp.data.data = (uint8_t *)lp;
		t_lp.data.len = (size_t)n * 4;
		resp.log_probs = &t_lp;
	}
	if (ent) {
		t_ent = t_lp;
		t_ent.data.data = (uint8_t *)ent;
		t_ent.dtype = ENGINED__V1__DTYPE__FLOAT32;
		t_ent.n_shape = 1;
		t_ent.shape = &shape_n;
		t_ent.data.len = (size_t)n * 4;
		resp.entropy = &t_ent;
	}
	if (val) {
		t_val.dtype = ENGINED__V1__DTYPE__FLOAT32;
		t_val.n_shape = 1;
		t_val.shape = &shape_n;
		t_val.data.data = (uint8_t *)val;
		t_val.data.len = (size_t)n * 4;
		resp.values = &t_val;
	}
	if (res.routed_experts) {   /* the engine sized it: n x layers x k fits */
		shape_route[0] = n;
		shape_route[1] = res.routed_layers;
		shape_route[2] = res.routed_k;
		t_route.dtype = ENGINED__V1__DTYPE__INT32;
		t_route.n_shape = 3;
		t_route.shape = shape_route;
		t_route.data.data = (uint8_t *)res.routed_experts;
		t_route.data.len = (size_t)(n * res.routed_layers * res.routed_k) * 4;
		resp.routed_experts = &t_route;
	}
	if (!p->req.batch.forward_only)
		j->m_tokens = n;
	resp.loss = fl.loss;
	for (int i = 0; i < fl.num_metrics; i++) {
		engined__v1__forward_backward_response__metrics_entry__init(&ment[i]);
		ment[i].key = (char *)fl.metrics[i].name;
		ment[i].value = fl.metrics[i].value;
		mptr[i] = &ment[i];
	}
	resp.n_metrics = (size_t)fl.num_metrics;
	resp.metrics = mptr;
	r = job_set_reply(j, &resp.base);
	goto out;
nomem:
	r = eng_fail(err, -ENOMEM, "out of memory for %lld per-token outputs", (long long)n);
out:
	free(lp);
	free(ent);
	free(val);
	free(res.routed_experts);
	return r;
}

/* --- OptimizerStep / LrSchedulerStep ------------------------------------- */

/* The step's own hyper-parameters (unset: the configured ones). */
static void step_params(const Engined__V1__OptimizerStepRequest *q, struct engine_step_params *p)
{
	memset(p, 0, sizeof(*p));
#define STEP_FIELD(f) \
	do { \
		p->has_##f = PB_HAS(q, f); \
		p->f = q->f; \
	} while (0)
	STEP_FIELD(lr);
	STEP_FIELD(beta1);
	STEP_FIELD(beta2);
	STEP_FIELD(eps);
	STEP_FIELD(weight_decay);
	STEP_FIELD(clip_grad);
#undef STEP_FIELD
}

/* The step's parameters, checked once here and kept for the run. */
int h_validate_optimizer_step(struct daemon *d, struct job *j, struct eng_error *err)
{
	struct engine_step_params p;
	struct engine_step_call *c;
	int r;

	(void)d;
	step_params((const void *)j->req, &p);
	c = malloc(sizeof(*c));
	if (!c)
		return eng_fail(err, -ENOMEM, "out of memory");
	r = engine_step_call_prepare(&p, c, err);
	if (r < 0) {
		free(c);
		return r;
	}
	j->prep = c;
	j->prep_free = free;
	return 0;
}

int h_run_optimizer_step(struct daemon *d, struct job *j, struct eng_error *err)
{
	const Engined__V1__OptimizerStepRequest *q = (const void *)j->req;
	Engined__V1__OptimizerStepResponse resp = ENGINED__V1__OPTIMIZER_STEP_RESPONSE__INIT;
	struct engine_step_result sr;
	struct engine *e;
	int r;

	memset(&sr, 0, sizeof(sr));
	r = daemon_engine_of(d, q->adapter, &e, err);
	if (r < 0)
		return r;
	r = engine_optimizer_step_call(e, j->prep, &sr, err);
	if (r < 0)
		return r;
	j->m_step = true;
	j->m_grad_norm = sr.grad_norm;
	resp.grad_norm = sr.grad_norm;
	resp.skipped = sr.skipped;
	resp.lr = sr.lr;
	resp.step = sr.step;
	return job_set_reply(j, &resp.base);
}

int h_run_zero_grad(struct daemon *d, struct job *j, struct eng_error *err)
{
	const Engined__V1__ZeroGradRequest *q = (const void *)j->req;
	Engined__V1__ZeroGradResponse resp = ENGINED__V1__ZERO_GRAD_RESPONSE__INIT;
	struct engine *e;
	int r = daemon_engine_of(d, q->adapter, &e, err);

	if (r == 0)
		r = engine_zero_grad(e, err);
	return r < 0 ? r : job_set_reply(j, &resp.base);
}

int h_run_lr_scheduler_step(struct daemon *d, struct job *j, struct eng_error *err)
{
	const Engined__V1__LrSchedulerStepRequest *q = (const void *)j->req;
	Engined__V1__LrSchedulerStepResponse resp = ENGINED__V1__LR_SCHEDULER_STEP_RESPONSE__INIT;
	struct engine *e;
	double lr = 0;
	int r;

	r = daemon_engine_of(d, q->adapter, &e, err);
	if (r < 0)
		return r;
	r = engine_lr_scheduler_step(e, &lr, err);
	if (r < 0)
		return r;
	resp.lr = lr;
	return job_set_reply(j, &resp.base);
}

/* --- ToDevice ------------------------------------------------------------ */

int h_validate_to_device(struct daemon *d, struct job *j, struct eng_error *err)
{
	const Engined__V1__ToDeviceRequest *q = (const void *)j->req;

	if (strcmp(q->device, "cpu") && strcmp(q->device, "host") &&
	    strcmp(q->device, "cuda") && strcmp(q->device, "device"))
		return eng_fail(err, -EINVAL,
				"device: unknown '%s' (cpu or host: offload; cuda or device: load)",
				q->device);
	if (!q->model && (q->optimizer || q->grad))
		return eng_fail(err, -EINVAL,
				"model: model=false requires optimizer=false and grad=false");
	return 0;
}

int h_run_to_device(struct daemon *d, struct job *j, struct eng_error *err)
{
	const Engined__V1__ToDeviceRequest *q = (const void *)j->req;
	Engined__V1__ToDeviceResponse resp = ENGINED__V1__TO_DEVICE_RESPONSE__INIT;
	Engined__V1__Placement pl;
	struct engine_status st;
	bool to_device = !strcmp(q->device, "cuda") || !strcmp(q->device, "device");
	struct engine *e;
	int r;

	r = daemon_engine_of(d, q->adapter, &e, err);
	if (r < 0)
		return r;
	if (!strcmp(q->device, "cuda")) {
		engine_status(e, &st);
		if (!strstr(st.key, "/cuda"))
			return eng_fail(err, -ENODEV,
					"device: 'cuda' but the engine is %s", st.key);
	}
	daemon_wait_engine_mem(d);
	r = engine_to(e, to_device, q->model, q->optimizer, q->grad, err);
	if (r < 0)
		return r;
	engine_status(e, &st);
	placement_to_proto(&st.placement, &pl);
	resp.placement = &pl;
	return job_set_reply(j, &resp.base);
}

/* --- checkpoints --------------------------------------------------------- */

struct ckpt_prep {
	char *rel;       /* normalized relative path, owned */
	unsigned contents;
};

static void ckpt_prep_free(void *p)
{
	struct ckpt_prep *c = p;

	if (!c)
		return;
	free(c->rel);
	free(c);
}

/* A rank other than 0 of a data-parallel group: its Save/LoadCheckpoint
 * write or read its own optimizer shard where its checkpoint root is the
 * one rank 0 uses (a shared filesystem), and otherwise leave that to rank
 * 0; so the path need not exist on it, and a path it cannot pin hands the
 * engine NULL instead of failing. `snap`: from the status snapshot (the
 * poller), else from the engine (the engine thread). */
static bool group_follower(struct daemon *d, bool snap)
{
	struct engine_status st;

	if (snap) {
		pthread_mutex_lock(&d->lock);
		st = d->snap;
		pthread_mutex_unlock(&d->lock);
	} else if (d->engine) {
		engine_status(d->engine, &st);
	} else {
		return false;
	}
	return st.initialized && st.dist_world_size > 1 && st.dist_rank != 0;
}

/* A follower's pin: its path, or NULL where it cannot reach `rel`. */
static const char *follower_pin(struct daemon *d, const char *rel, enum paths_pin_mode mode,
				struct paths_pin *pin)
{
	struct eng_error ignored = {0};

	if (paths_pin(d->cfg.checkpoint_root, rel, "path", mode, pin, &ignored) < 0) {
		pin->fd = -1;
		return NULL;
	}
	return pin->path;
}

static int ckpt_prep_new(struct job *j, const char *path, char **contents,
			 size_t n_contents, bool must_exist, struct daemon *d,
			 struct eng_error *err)
{
	struct ckpt_prep *c = calloc(1, sizeof(*c));
	char *abs = NULL;
	int r;

	if (!c)
		return -ENOMEM;
	j->prep = c;
	j->prep_free = ckpt_prep_free;
	r = parse_contents(contents, n_contents, "contents", &c->contents, err);
	if (r < 0)
		return r;
	r = path_confine(d->cfg.checkpoint_root, path, "path",
			 must_exist && !group_follower(d, true), &abs, err);
	if (r < 0)
		return r;
	free(abs);
	c->rel = paths_normalize(path);
	return c->rel ? 0 : -ENOMEM;
}

int h_validate_save_checkpoint(struct daemon *d, struct job *j, struct eng_error *err)
{
	const Engined__V1__SaveCheckpointRequest *q = (const void *)j->req;

	if (q->global_step < 0)
		return eng_fail(err, -EINVAL, "global_step: must be >= 0");
	if (q->max_to_keep < 0)
		return eng_fail(err, -EINVAL, "max_to_keep: must be >= 0");
	return ckpt_prep_new(j, q->path, q->contents, q->n_contents, false, d, err);
}

int h_run_save_checkpoint(struct daemon *d, struct job *j, struct eng_error *err)
{
	const Engined__V1__SaveCheckpointRequest *q = (const void *)j->req;
	struct ckpt_prep *c = j->prep;
	Engined__V1__SaveCheckpointResponse resp = ENGINED__V1__SAVE_CHECKPOINT_RESPONSE__INIT;
	size_t bytes = 0;
	int r;

	/* Its safe points (between files, before the commit) stop it when the
	 * client is gone, with nothing saved. */
	struct engine *e;

	r = daemon_engine_of(d, q->adapter, &e, err);
	if (r < 0)
		return r;
	engine_set_cancel(e, h_call_gone, j->call);
	r = daemon_save_checkpoint(d, e, c->rel, q->global_step, q->max_to_keep, c->contents,
				   &bytes, err);
	engine_set_cancel(e, NULL, NULL);
	if (r < 0)
		return r;
	j->m_saved = true;
	resp.path = c->rel;
	resp.bytes = (int64_t)bytes;
	return job_set_reply(j, &resp.base);
}

int daemon_save_checkpoint(struct daemon *d, struct engine *e, const char *rel,
			   int64_t global_step, int max_to_keep, unsigned contents,
			   size_t *ret_bytes, struct eng_error *err)
{
	struct paths_pin pin = { .fd = -1 };
	int r;

	if (group_follower(d, false)) {
		const char *dir = follower_pin(d, rel, PIN_PARENT_CREATE, &pin);

		engine_set_progress(e, daemon_progress, d);
		r = engine_save_checkpoint(e, dir, global_step, max_to_keep, contents,
					   ret_bytes, err);
		engine_set_progress(e, NULL, NULL);
		if (dir)
			r = paths_pin_result(&pin, r, err);
		paths_unpin(&pin);
		return r;
	}
	/* Resolved again now (the tree may have changed since validation)
	 * and pinned: the writer works through the parent's descriptor, so
	 * a component swapped for a symlink mid-save cannot redirect it. */
	r = paths_pin(d->cfg.checkpoint_root, rel, "path", PIN_PARENT_CREATE, &pin, err);
	if (r < 0)
		return r;
	engine_set_progress(e, daemon_progress, d);
	r = engine_save_checkpoint(e, pin.path, global_step, max_to_keep,
				   contents, ret_bytes, err);
	engine_set_progress(e, NULL, NULL);
	r = paths_pin_result(&pin, r, err);
	paths_unpin(&pin);
	return r;
}

int h_validate_load_checkpoint(struct daemon *d, struct job *j, struct eng_error *err)
{
	const Engined__V1__LoadCheckpointRequest *q = (const void *)j->req;

	return ckpt_prep_new(j, q->path, q->contents, q->n_contents, true, d, err);
}

int h_run_load_checkpoint(struct daemon *d, struct job *j, struct eng_error *err)
{
	const Engined__V1__LoadCheckpointRequest *q = (const void *)j->req;
	struct ckpt_prep *c = j->prep;
	struct engine *e;
	Engined__V1__LoadCheckpointResponse resp = ENGINED__V1__LOAD_CHECKPOINT_RESPONSE__INIT;
	struct paths_pin pin = { .fd = -1 };
	int64_t step = 0;
	const char *dir = pin.path;
	int r;

	if ((r = daemon_engine_of(d, q->adapter, &e, err)) < 0)
		return r;
	if (group_follower(d, false))
		dir = follower_pin(d, c->rel, PIN_DIR, &pin);
	else if ((r = paths_pin(d->cfg.checkpoint_root, c->rel, "path", PIN_DIR, &pin, err)) < 0)
		return r;
	daemon_wait_engine_mem(d);
	engine_set_cancel(e, h_call_gone, j->call);
	engine_set_progress(e, daemon_progress, d);
	r = engine_load_checkpoint(e, dir, c->contents, &step, err);
	engine_set_progress(e, NULL, NULL);
	engine_set_cancel(e, NULL, NULL);
	r = paths_pin_result(&pin, r, err);
	paths_unpin(&pin);
	if (r < 0)
		return r;
	resp.global_step = step;
	return job_set_reply(j, &resp.base);
}

/* --- CreateAdapter / DeleteAdapter ---------------------------------------- */

/* PEFT LoraConfig's default lora_alpha. */
#define ADAPTER_DEFAULT_ALPHA 8.0

struct adapter_prep {
	struct engine_adapter_config cfg;
	struct paths_pin peft;        /* peft_dir pinned beneath the model root, owned */
	int pin_rc;                   /* its failure, reported by the run (a group's */
	struct eng_error pin_err;     /* ranks agree on it: engine_group_agree) */
};

static void adapter_prep_free(void *p)
{
	struct adapter_prep *ap = p;

	if (!ap)
		return;
	paths_unpin(&ap->peft);
	free(ap);
}

/* target_modules: PEFT module names (or paths ending in one, or
 * "all-linear") into engine_lora_module_bits' bits. */
static int targets_from_proto(char **names, size_t n, unsigned *ret, struct eng_error *err)
{
	unsigned bits = 0;

	for (size_t i = 0; i < n; i++) {
		unsigned b = engine_lora_module_bits(names[i]);

		if (!b)
			return eng_fail(err, -EINVAL,
					"target_modules[%zu]: unknown module '%s' (q_proj, "
					"k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, a "
					"module path ending in one, or all-linear)", i, names[i]);
		bits |= b;
	}
	*ret = bits;
	return 0;
}

/* The whole configuration, checked once here (engine_adapter_config_check)
 * and the PEFT directory pinned; what needs the base (a rank larger than a
 * target allows, the directory's contents) is the engine's on the run. */
int h_validate_create_adapter(struct daemon *d, struct job *j, struct eng_error *err)
{
	const Engined__V1__CreateAdapterRequest *q = (const void *)j->req;
	struct engine_init_config defaults;
	struct engine_adapter_config *c;
	struct adapter_prep *ap;
	int r;

	ap = calloc(1, sizeof(*ap));
	if (!ap)
		return -ENOMEM;
	ap->peft.fd = -1;
	j->prep = ap;
	j->prep_free = adapter_prep_free;
	c = &ap->cfg;
	c->name = q->name;
	c->rank = q->rank;
	c->alpha = PB_HAS(q, alpha) ? q->alpha : q->peft_dir[0] ? 0 : ADAPTER_DEFAULT_ALPHA;
	c->rslora = q->use_rslora;
	c->seed = q->seed;
	r = targets_from_proto(q->target_modules, q->n_target_modules, &c->targets, err);
	if (r < 0)
		return r;
	/* A message that is present replaces the base's configuration; its
	 * unset fields are Initialize's defaults. */
	engine_init_config_defaults(&defaults);
	if (q->optimizer) {
		c->has_optim = true;
		c->optim = defaults.optim;
		optim_from_proto(q->optimizer, &c->optim);
	}
	if (q->lr_scheduler) {
		c->has_sched = true;
		c->sched = defaults.sched;
		r = sched_from_proto(q->lr_scheduler, &c->sched, err);
		if (r < 0)
			return r;
	}
	/* The client's path for the check (which only asks whether there is
	 * one); pinned then, and read on the engine thread through the pin. */
	c->peft_dir = q->peft_dir[0] ? q->peft_dir : NULL;
	r = engine_adapter_config_check(c, err);
	if (r < 0 || !q->peft_dir[0])
		return r;
	c->peft_dir = NULL;
	/* A directory this host lacks fails the call on the engine thread,
	 * where the ranks of a group agree on it. */
	ap->pin_rc = paths_pin(d->cfg.model_root, q->peft_dir, "peft_dir", PIN_DIR, &ap->peft,
			       &ap->pin_err);
	if (ap->pin_rc == 0)
		c->peft_dir = ap->peft.path;
	if (ap->pin_rc == -ENOMEM) {
		*err = ap->pin_err;    /* this host's trouble, not the request's */
		return ap->pin_rc;
	}
	return 0;
}

static void put_targets(unsigned bits, char **ret, size_t *ret_n)
{
	size_t n = 0;

	for (int i = 0; i < ENGINE_LORA_MODULES; i++)
		if (bits & (1u << i))
			ret[n++] = (char *)engine_lora_module_name(i);
	*ret_n = n;
}

int h_run_create_adapter(struct daemon *d, struct job *j, struct eng_error *err)
{
	struct adapter_prep *ap = j->prep;
	Engined__V1__CreateAdapterResponse resp = ENGINED__V1__CREATE_ADAPTER_RESPONSE__INIT;
	struct engine_adapter_config info;
	struct engine_status st;
	char *targets[ENGINE_LORA_MODULES];
	struct engine *e = NULL;
	int r;

	/* A peft_dir this host lacks, a taken name or no free slot: refused
	 * before anything is built (in a group, on every rank). */
	if (ap->pin_rc < 0) {
		*err = ap->pin_err;
		r = ap->pin_rc;
	} else {
		r = adapters_may_add(&d->adapters, ap->cfg.name, err);
	}
	r = engine_group_agree(d->engine, r, "CreateAdapter", err);
	if (r < 0)
		return r;
	r = engine_adapter_create(d->engine, &ap->cfg, &e, err);
	/* A peft_dir error names the file as the client knows it. */
	if (ap->cfg.peft_dir)
		r = paths_pin_result(&ap->peft, r, err);
	if (r < 0)
		return r;
	/* Over max_adapter_bytes: measured, then destroyed; nothing changed
	 * (on any rank of a group). */
	r = adapters_add(&d->adapters, ap->cfg.name, e, err);
	r = engine_group_agree(d->engine, r, "CreateAdapter", err);
	if (r < 0) {
		if (adapters_find(&d->adapters, ap->cfg.name))
			(void)adapters_delete(&d->adapters, ap->cfg.name, "name", NULL);
		else
			engine_destroy(e);
		return r;
	}
	memset(&info, 0, sizeof(info));
	(void)engine_adapter_info(e, &info);
	engine_status(e, &st);
	log_msg(LOG_LVL_INFO, "adapter %s: rank %lld, alpha %g%s, %lld parameters in %lld tensors",
		ap->cfg.name, (long long)info.rank, info.alpha, info.rslora ? " (rsLoRA)" : "",
		(long long)st.num_parameters, (long long)engine_num_params(e));
	resp.name = (char *)ap->cfg.name;
	resp.num_parameters = st.num_parameters;
	resp.num_tensors = engine_num_params(e);
	resp.rank = info.rank;
	resp.alpha = info.alpha;
	resp.use_rslora = info.rslora;
	put_targets(info.targets, targets, &resp.n_target_modules);
	resp.target_modules = targets;
	return job_set_reply(j, &resp.base);
}

int h_validate_delete_adapter(struct daemon *d, struct job *j, struct eng_error *err)
{
	const Engined__V1__DeleteAdapterRequest *q = (const void *)j->req;

	(void)d;
	if (!q->name[0])
		return eng_fail(err, -EINVAL, "name: empty (the adapter to delete)");
	return 0;
}

int h_run_delete_adapter(struct daemon *d, struct job *j, struct eng_error *err)
{
	const Engined__V1__DeleteAdapterRequest *q = (const void *)j->req;
	Engined__V1__DeleteAdapterResponse resp = ENGINED__V1__DELETE_ADAPTER_RESPONSE__INIT;
	int r;

	if (!adapters_find(&d->adapters, q->name))
		return eng_fail(err, -ENOENT, "name: no adapter named '%s'", q->name);
	/* Its parameters may still be lent to gRPC by a finished stream. */
	daemon_wait_engine_mem(d);
	r = adapters_delete(&d->adapters, q->name, "name", err);
	if (r < 0)
		return r;
	replay_forget_scope(d->replay, q->name);
	log_msg(LOG_LVL_INFO, "adapter %s: deleted", q->name);
	return job_set_reply(j, &resp.base);
}

/* --- inline: GetStatus, Health ------------------------------------------- */

static int64_t rss_bytes(void)
{
	long pages = 0, rss = 0;
	FILE *f = fopen("/proc/self/statm", "r");

	if (!f)
		return 0;
	if (fscanf(f, "%ld %ld", &pages, &rss) != 2)
		rss = 0;
	fclose(f);
	return (int64_t)rss * sysconf(_SC_PAGESIZE);
}

/* The live adapters' names a caller may see (all, or its token's), in
 * creation order, and the status of `name` ("": none) from the snapshot.
 * ret_names: one malloc'ed block, NULL when there are none. -ENOENT
 * naming `adapter` when `name` is not live. */
static int adapter_view(struct daemon *d, const char *tenant, const char *name,
			char ***ret_names, size_t *ret_n, struct engine_status *ret_st,
			struct eng_error *err)
{
	const size_t each = sizeof(d->adapter_snap[0].name);
	char **names = NULL, *buf;
	size_t n = 0;
	bool found = !name[0];

	pthread_mutex_lock(&d->lock);
	if (d->n_adapter_snap > 0)
		names = malloc((size_t)d->n_adapter_snap * (sizeof(char *) + each));
	buf = names ? (char *)(names + d->n_adapter_snap) : NULL;
	for (int i = 0; i < d->n_adapter_snap; i++) {
		const struct adapter_status *a = &d->adapter_snap[i];

		if (name[0] && !strcmp(a->name, name)) {
			*ret_st = a->st;
			found = true;
		}
		if (names && auth_adapter_allowed(tenant, a->name)) {
			names[n] = buf + n * each;
			memcpy(names[n++], a->name, each);
		}
	}
	pthread_mutex_unlock(&d->lock);
	*ret_names = names;
	*ret_n = n;
	if (!found)
		return eng_fail(err, -ENOENT, "adapter: no adapter named '%s'", name);
	return d->n_adapter_snap > 0 && !names ? eng_fail(err, -ENOMEM, "out of memory") : 0;
}

int h_run_get_status(struct daemon *d, struct job *j, struct eng_error *err)
{
	const Engined__V1__GetStatusRequest *q = (const void *)j->req;
	Engined__V1__GetStatusResponse resp = ENGINED__V1__GET_STATUS_RESPONSE__INIT;
	Engined__V1__Placement pl;
	Engined__V1__Memory mem = ENGINED__V1__MEMORY__INIT;
	Engined__V1__DistStatus ds = ENGINED__V1__DIST_STATUS__INIT;
	Engined__V1__JobProgress prog = ENGINED__V1__JOB_PROGRESS__INIT;
	struct engine_status st, own;
	struct daemon_job_view jv;
	char last_id[RPC_REQUEST_ID_MAX + 1];
	char **names = NULL;
	size_t n_names = 0;
	struct timespec now;
	int64_t queued;
	int r;

	pthread_mutex_lock(&d->lock);
	st = d->snap;
	queued = d->queued;
	pthread_mutex_unlock(&d->lock);
	own = st;
	/* An adapter's own step, schedule, gradients, size, placement, mode
	 * and request ids; the rest is the daemon's. */
	r = adapter_view(d, j->tenant, q->adapter, &names, &n_names, &own, err);
	if (r < 0) {
		free(names);
		return r;
	}
	daemon_job_view(d, &jv);

	clock_gettime(CLOCK_MONOTONIC, &now);
	resp.engine_key = st.key;
	resp.initialized = st.initialized;
	resp.mode = mode_to_proto(own.mode);
	placement_to_proto(&own.placement, &pl);
	resp.placement = &pl;
	resp.step = own.step;
	resp.sched_step = own.sched_step;
	resp.accumulated_calls = own.accumulated_calls;
	resp.accumulated_tokens = own.accumulated_tokens;
	replay_last_applied(d->replay, q->adapter, last_id, sizeof(last_id));
	resp.last_request_id = last_id;
	resp.lr = own.lr;
	resp.num_parameters = own.num_parameters;
	resp.n_adapters = n_names;
	resp.adapters = names;
	resp.matmul = st.matmul;
	mem.device_bytes = (int64_t)st.device_memory;
	mem.host_bytes = (int64_t)st.host_memory;
	mem.activation_bytes = (int64_t)st.activation_bytes;
	mem.param_bytes = (int64_t)st.param_bytes;
	mem.grad_bytes = (int64_t)st.grad_bytes;
	mem.optimizer_bytes = (int64_t)st.optim_bytes;
	mem.gathered_bytes = (int64_t)st.gathered_bytes;
	mem.rss_bytes = rss_bytes();
	resp.memory = &mem;
	resp.version = (char *)ENGINED_VERSION;
	resp.uptime = (double)(now.tv_sec - d->started.tv_sec) +
		      (double)(now.tv_nsec - d->started.tv_nsec) * 1e-9;
	resp.busy = jv.busy;
	resp.current_job = jv.job;
	resp.queued_jobs = queued;
	if (d->shares)
		share_table_counts(d->shares, &resp.pending_shares, &resp.pending_share_bytes);
	if (st.initialized && st.dist_world_size > 1) {
		ds.rank = st.dist_rank;
		ds.world_size = st.dist_world_size;
		ds.backend = (char *)(st.dist_backend ? st.dist_backend : "");
		ds.optimizer_shard_parameters = st.optim_shard_params;
		ds.optimizer_bytes = (int64_t)st.optim_bytes;
		ds.broken = st.dist_broken;
		ds.bucket_bytes = st.dist_bucket_bytes;
		ds.reduce_buckets = st.reduce_buckets;
		ds.reduce_bytes = st.reduce_bytes;
		ds.reduce_s = st.reduce_s;
		ds.reduce_wait_s = st.reduce_wait_s;
		ds.zero_stage = st.dist_zero_stage;
		resp.dist = &ds;
	}
	if (jv.busy) {
		prog.phase = jv.progress.phase;
		prog.done = jv.progress.done;
		prog.total = jv.progress.total;
		prog.unit = jv.progress.unit;
		prog.elapsed_s = jv.seconds;
		resp.progress = &prog;
	}
	r = job_set_reply(j, &resp.base);
	free(names);
	return r;
}
