/* parity_driver.c — runs one parity case through the native engine and
 * dumps what the torch reference (ref_model.py) is compared against.
 *
 * Usage: parity_driver CASE_DIR
 *
 * Input (written by test_parity.py):
 *   CASE_DIR/model/config.json, CASE_DIR/model/model.safetensors
 *       the HF config and the initial fp32 weights (the engine loads them);
 *   CASE_DIR/batch.safetensors, all F32 (ids are exact in F32 below 2^24):
 *       input_ids [N], seq_lens [S], and either (gradient mode)
 *       g_logp [N], g_ent [N], g_val [N] (upstream gradients dL/dlogp,
 *       dL/dentropy, dL/dvalue, request order), or (loss mode) any of the
 *       request arrays loss_mask, old_log_probs, ref_log_probs, advantages,
 *       returns, old_values, is_weights, token_weights [N];
 *   CASE_DIR/case.json: {"model_type", "temperature", "lr", "beta1", "beta2",
 *       "eps", "weight_decay", "clip_grad", "max_tokens_per_micro_batch",
 *       "steps", "threads"} and optionally "lm_tile_floats",
 *       "lm_cache_floats" and
 *       "loss": {"name": "ppo", "options": [["key", "value"], ...]}, which
 *       selects loss mode.
 *
 * What it does: engine_create (device "cpu", backend "native"), TRAIN mode
 * (so that grads survive between calls), forward_backward, dumps outputs
 * and every parameter's gradient, then takes `steps` optimizer steps, each
 * but the first preceded by the same forward_backward, and dumps the
 * parameters. The loss of forward_backward is, in gradient mode, one that
 * writes the given upstream gradients (loss = sum g*output); in loss mode,
 * the loss library driven exactly as the daemon drives it (daemon/fb_loss.c,
 * h_run_forward_backward): loss_spec_init + loss_spec_set per option +
 * loss_spec_validate against the arrays present, then per call
 * loss_engine_ctx_init, loss_engine_fn as the engine's loss,
 * loss_engine_ctx_result.
 *
 * Output: CASE_DIR/results.safetensors (F32):
 *   log_probs [N], entropy [N] (language model) or values [N] (value model),
 *   grad/<hf name>, param/<hf name> (after the steps);
 *   metadata: num_micro_batches, losses (one per forward_backward call),
 *   loss (the first call's), grad_norms, skipped, lrs (one per step); in
 *   loss mode also metric/<name> (one per call) for each metric the loss
 *   library reports present.
 * Exit status 0 on success, 1 with a message on stderr otherwise.
 */
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "io/safetensors.h"
#include "loss/loss_engine.h"

struct parity_case {
	char model_type[32];
	double temperature;
	struct engine_optim_config optim;
	int64_t max_tokens;
	int64_t lm_tile;
	int64_t lm_cache;       /* engine_init_config.lm_cache_floats */
	int steps;
	int threads;
	bool has_loss;          /* loss mode: "loss" in case.json */
	struct loss_spec spec;  /* parsed, validated against the batch later */
};

/* The request arrays of loss mode are the first LOSS_IN_ENTROPY entries of
 * enum loss_input, named by loss_input_str. */
enum { NUM_REQ_ARRAYS = LOSS_IN_ENTROPY };

struct parity_batch {
	int64_t n;
	int32_t num_seqs;
	int32_t *input_ids;  /* [n] */
	int32_t *seq_lens;   /* [num_seqs] */
	float *g_logp;       /* [n] */
	float *g_ent;        /* [n] */
	float *g_val;        /* [n] */
	float *req[NUM_REQ_ARRAYS];  /* [n] each or NULL (loss mode) */
};

/* The loss seam: upstream gradients are given per request token. */
struct grad_loss {
	const struct parity_batch *b;
	double loss;
};

static int grad_loss_fn(void *ctx, struct engine_loss_io *io, struct eng_error *err)
{
	struct grad_loss *gl = ctx;
	const struct parity_batch *b = gl->b;
	int64_t i;

	for (i = 0; i < io->n; i++) {
		int64_t t = io->token_index[i];

		if (t < 0 || t >= b->n)
			return eng_fail(err, -EINVAL, "token_index[%lld] = %lld out of range",
					(long long)i, (long long)t);
		if (io->d_log_probs)
			io->d_log_probs[i] = b->g_logp[t];
		if (io->d_entropy)
			io->d_entropy[i] = b->g_ent[t];
		if (io->d_values)
			io->d_values[i] = b->g_val[t];
		if (io->log_probs)
			gl->loss += (double)b->g_logp[t] * io->log_probs[i];
		if (io->entropy)
			gl->loss += (double)b->g_ent[t] * io->entropy[i];
		if (io->values)
			gl->loss += (double)b->g_val[t] * io->values[i];
	}
	return 0;
}

static int json_num(json_t *root, const char *key, double *ret)
{
	json_t *v = json_object_get(root, key);

	if (!json_is_number(v)) {
		fprintf(stderr, "case.json: \"%s\" missing or not a number\n", key);
		return -1;
	}
	*ret = json_number_value(v);
	return 0;
}

/* "loss": {"name", "options": [[key, value], ...]} -> c->spec. */
static int read_loss(json_t *loss, struct parity_case *c)
{
	struct eng_error err = { 0 };
	const char *name = json_string_value(json_object_get(loss, "name"));
	json_t *opts = json_object_get(loss, "options");
	size_t i;

	if (!name || (opts && !json_is_array(opts))) {
		fprintf(stderr, "case.json: \"loss\" needs a \"name\" and an options array\n");
		return -1;
	}
	if (loss_spec_init(&c->spec, name, &err)) {
		fprintf(stderr, "case.json: loss: %s\n", err.msg);
		return -1;
	}
	for (i = 0; opts && i < json_array_size(opts); i++) {
		json_t *kv = json_array_get(opts, i);
		const char *k = json_string_value(json_array_get(kv, 0));
		const char *v = json_string_value(json_array_get(kv, 1));

		if (!k || !v) {
			fprintf(stderr, "case.json: loss.options[%zu] is not [key, value]\n", i);
			return -1;
		}
		if (loss_spec_set(&c->spec, k, v, &err)) {
			fprintf(stderr, "case.json: loss.options[%s]: %s\n", k, err.msg);
			return -1;
		}
	}
	c->has_loss = true;
	return 0;
}

static int read_case(const char *dir, struct parity_case *c)
{
	char path[4096];
	json_error_t jerr;
	json_t *root;
	const char *mt;
	double steps, mt_tokens, threads;
	int rc = 0;

	snprintf(path, sizeof(path), "%s/case.json", dir);
	root = json_load_file(path, 0, &jerr);
	if (!root) {
		fprintf(stderr, "%s:%d: %s\n", path, jerr.line, jerr.text);
		return -1;
	}
	mt = json_string_value(json_object_get(root, "model_type"));
	if (!mt || strlen(mt) >= sizeof(c->model_type)) {
		fprintf(stderr, "case.json: \"model_type\" missing\n");
		json_decref(root);
		return -1;
	}
	strcpy(c->model_type, mt);
	rc |= json_num(root, "temperature", &c->temperature);
	rc |= json_num(root, "lr", &c->optim.lr);
	rc |= json_num(root, "beta1", &c->optim.beta1);
	rc |= json_num(root, "beta2", &c->optim.beta2);
	rc |= json_num(root, "eps", &c->optim.eps);
	rc |= json_num(root, "weight_decay", &c->optim.weight_decay);
	rc |= json_num(root, "clip_grad", &c->optim.clip_grad);
	rc |= json_num(root, "max_tokens_per_micro_batch", &mt_tokens);
	rc |= json_num(root, "steps", &steps);
	rc |= json_num(root, "threads", &threads);
	/* optional: LM-head tile size, small to force row and vocabulary chunks */
	c->lm_tile = json_is_number(json_object_get(root, "lm_tile_floats"))
		     ? (int64_t)json_number_value(json_object_get(root, "lm_tile_floats")) : 0;
	/* optional: -1 recomputes the LM head's logits in the backward */
	c->lm_cache = json_is_number(json_object_get(root, "lm_cache_floats"))
		      ? (int64_t)json_number_value(json_object_get(root, "lm_cache_floats")) : 0;
	c->has_loss = false;
	if (json_object_get(root, "loss") && read_loss(json_object_get(root, "loss"), c))
		rc = -1;
	json_decref(root);
	if (rc)
		return -1;
	c->max_tokens = (int64_t)mt_tokens;
	c->steps = (int)steps;
	c->threads = (int)threads;
	return 0;
}

/* Read an F32 tensor of integers into int32. */
static int read_ints(struct st_reader *r, const char *name, int32_t **ret, int64_t *ret_n,
		     struct eng_error *err)
{
	const struct st_tensor_info *ti = st_reader_find(r, name);
	float *f;
	int32_t *v;
	int64_t n, i;
	int rc;

	if (!ti || ti->ndim != 1)
		return eng_fail(err, -EINVAL, "batch: %s missing or not 1-D", name);
	n = ti->shape[0];
	f = malloc((size_t)(n ? n : 1) * sizeof(*f));
	v = malloc((size_t)(n ? n : 1) * sizeof(*v));
	if (!f || !v) {
		free(f);
		free(v);
		return eng_fail(err, -ENOMEM, "batch: %s", name);
	}
	rc = st_reader_read_f32(r, name, f, n, err);
	for (i = 0; rc == 0 && i < n; i++) {
		v[i] = (int32_t)f[i];
		if ((float)v[i] != f[i])
			rc = eng_fail(err, -EINVAL, "batch: %s[%lld] = %g is not an integer",
				      name, (long long)i, f[i]);
	}
	free(f);
	if (rc) {
		free(v);
		return rc;
	}
	*ret = v;
	*ret_n = n;
	return 0;
}

static int read_floats(struct st_reader *r, const char *name, int64_t n, float **ret,
		       struct eng_error *err)
{
	float *f = malloc((size_t)(n ? n : 1) * sizeof(*f));
	int rc;

	if (!f)
		return eng_fail(err, -ENOMEM, "batch: %s", name);
	rc = st_reader_read_f32(r, name, f, n, err);
	if (rc) {
		free(f);
		return rc;
	}
	*ret = f;
	return 0;
}

static void batch_free(struct parity_batch *b)
{
	int k;

	free(b->input_ids);
	free(b->seq_lens);
	free(b->g_logp);
	free(b->g_ent);
	free(b->g_val);
	for (k = 0; k < NUM_REQ_ARRAYS; k++)
		free(b->req[k]);
}

/* loss mode: the request arrays present in the file (1-D of n each). */
static int read_request(struct st_reader *r, struct parity_batch *b, struct eng_error *err)
{
	int k, rc;

	for (k = 0; k < NUM_REQ_ARRAYS; k++) {
		const char *name = loss_input_str((enum loss_input)k);
		const struct st_tensor_info *ti = st_reader_find(r, name);

		if (!ti)
			continue;
		if (ti->ndim != 1 || ti->shape[0] != b->n)
			return eng_fail(err, -EINVAL, "batch: %s is not [%lld]", name,
					(long long)b->n);
		rc = read_floats(r, name, b->n, &b->req[k], err);
		if (rc)
			return rc;
	}
	return 0;
}

static int read_batch(const char *dir, bool loss_mode, struct parity_batch *b,
		      struct eng_error *err)
{
	char path[4096];
	struct st_reader *r = NULL;
	int64_t ns = 0;
	int rc;

	snprintf(path, sizeof(path), "%s/batch.safetensors", dir);
	rc = st_reader_open(path, &r, err);
	if (rc)
		return rc;
	rc = read_ints(r, "input_ids", &b->input_ids, &b->n, err);
	if (!rc)
		rc = read_ints(r, "seq_lens", &b->seq_lens, &ns, err);
	b->num_seqs = (int32_t)ns;
	if (loss_mode) {
		if (!rc)
			rc = read_request(r, b, err);
		st_reader_close(r);
		return rc;
	}
	if (!rc)
		rc = read_floats(r, "g_logp", b->n, &b->g_logp, err);
	if (!rc)
		rc = read_floats(r, "g_ent", b->n, &b->g_ent, err);
	if (!rc)
		rc = read_floats(r, "g_val", b->n, &b->g_val, err);
	st_reader_close(r);
	return rc;
}

/* Owned copies of the tensors to write (st_writer_add borrows its data);
 * capacity fixed by dump_init. */
struct dump {
	int count, cap;
	char **names;
	float **data;
	int *ndim;
	int64_t (*shape)[4];
};

static int dump_init(struct dump *d, int cap)
{
	d->names = calloc((size_t)cap, sizeof(*d->names));
	d->data = calloc((size_t)cap, sizeof(*d->data));
	d->ndim = calloc((size_t)cap, sizeof(*d->ndim));
	d->shape = calloc((size_t)cap, sizeof(*d->shape));
	if (!d->names || !d->data || !d->ndim || !d->shape)
		return -ENOMEM;
	d->cap = cap;
	return 0;
}

static int dump_add(struct dump *d, const char *prefix, const char *name, int ndim,
		    const int64_t *shape, const float *src, int64_t numel)
{
	size_t len = strlen(prefix) + strlen(name) + 1;

	if (ndim < 0 || ndim > 4)
		return -EINVAL;
	if (d->count == d->cap)
		return -ENOSPC;
	d->names[d->count] = malloc(len);
	d->data[d->count] = malloc((size_t)(numel ? numel : 1) * sizeof(float));
	if (!d->names[d->count] || !d->data[d->count]) {
		free(d->names[d->count]);
		free(d->data[d->count]);
		return -ENOMEM;
	}
	snprintf(d->names[d->count], len, "%s%s", prefix, name);
	memcpy(d->data[d->count], src, (size_t)numel * sizeof(float));
	d->ndim[d->count] = ndim;
	memset(d->shape[d->count], 0, sizeof(d->shape[0]));
	memcpy(d->shape[d->count], shape, (size_t)ndim * sizeof(*shape));  /* shape has ndim */
	d->count++;
	return 0;
}

static void dump_free(struct dump *d)
{
	int i;

	for (i = 0; i < d->count; i++) {
		free(d->names[i]);
		free(d->data[i]);
	}
	free(d->names);
	free(d->data);
	free(d->ndim);
	free(d->shape);
}

/* Copy every parameter (grad=false) or gradient (grad=true) into d. */
static int dump_params(struct engine *e, struct dump *d, bool grad, struct eng_error *err)
{
	int64_t i, np = engine_num_params(e);

	if (np <= 0)
		return eng_fail(err, -EINVAL, "engine reports %lld parameters", (long long)np);
	for (i = 0; i < np; i++) {
		struct engine_param_view v;
		int rc = grad ? engine_grad(e, i, &v, err) : engine_param(e, i, &v, err);

		if (rc)
			return rc;
		if (v.ndim < 1 || v.ndim > 4)
			return eng_fail(err, -EINVAL, "%s: ndim %d", v.name, v.ndim);
		rc = dump_add(d, grad ? "grad/" : "param/", v.name, v.ndim, v.shape,
			      v.host_data, v.numel);
		if (rc)
			return eng_fail(err, rc, "copying %s", v.name);
	}
	return 0;
}

/* Append printf output to a fixed buffer; silently truncates (metadata). */
static void appendf(char *buf, size_t size, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void appendf(char *buf, size_t size, const char *fmt, ...)
{
	size_t len = strlen(buf);
	va_list ap;

	if (len + 1 >= size)
		return;
	va_start(ap, fmt);
	vsnprintf(buf + len, size - len, fmt, ap);
	va_end(ap);
}

static int dump_outputs(struct dump *d, bool value_model, int64_t n, const float *lp,
			const float *ent, const float *val)
{
	int64_t shape[1] = { n };
	int rc;

	if (value_model)
		return dump_add(d, "", "values", 1, shape, val, n);
	rc = dump_add(d, "", "log_probs", 1, shape, lp, n);
	if (!rc)
		rc = dump_add(d, "", "entropy", 1, shape, ent, n);
	return rc;
}

/* Metadata of loss mode: one comma-separated list of per-call values per
 * metric the loss library reported present. */
struct call_metrics {
	bool present[LOSS_M_COUNT];
	char text[LOSS_M_COUNT][512];
};

static int write_results(const char *dir, const struct dump *d, const char *mb,
			 const char *loss, const char *losses, const char *norms,
			 const char *skipped, const char *lrs,
			 const struct call_metrics *cm, struct eng_error *err)
{
	char path[4096];
	struct st_writer *w = NULL;
	int i, rc;

	snprintf(path, sizeof(path), "%s/results.safetensors", dir);
	rc = st_writer_new(path, &w, err);
	if (rc)
		return rc;
	for (i = 0; i < d->count && !rc; i++)
		rc = st_writer_add(w, d->names[i], ST_F32, d->ndim[i], d->shape[i],
				   d->data[i], err);
	if (!rc)
		rc = st_writer_meta(w, "num_micro_batches", mb, err);
	if (!rc)
		rc = st_writer_meta(w, "loss", loss, err);
	if (!rc)
		rc = st_writer_meta(w, "losses", losses, err);
	for (i = 0; i < LOSS_M_COUNT && !rc; i++) {
		char key[64];

		if (!cm->present[i])
			continue;
		snprintf(key, sizeof(key), "metric/%s", loss_metric_str((enum loss_metric_id)i));
		rc = st_writer_meta(w, key, cm->text[i], err);
	}
	if (!rc)
		rc = st_writer_meta(w, "grad_norms", norms, err);
	if (!rc)
		rc = st_writer_meta(w, "skipped", skipped, err);
	if (!rc)
		rc = st_writer_meta(w, "lrs", lrs, err);
	if (rc) {
		st_writer_abort(w);
		return rc;
	}
	return st_writer_finish(w, NULL, NULL, err);
}

/* loss mode: check the spec against the arrays present, as daemon/fb_loss.c. */
static int validate_loss(const struct parity_case *c, const struct parity_batch *b,
			 bool value_model, struct eng_error *err)
{
	struct loss_inputs_present present;
	int k;

	loss_inputs_present_init(&present, b->n);
	for (k = 0; k < NUM_REQ_ARRAYS; k++)
		present.len[k] = b->req[k] ? b->n : -1;
	present.len[LOSS_IN_ENTROPY] = value_model ? -1 : b->n;
	present.len[LOSS_IN_VALUES] = value_model ? b->n : -1;
	return loss_spec_validate(&c->spec, &present, err);
}

/* loss mode: one forward_backward with a fresh loss context, as
 * h_run_forward_backward. ret_metrics [LOSS_M_COUNT]; outputs untouched on
 * failure. */
static int fb_with_loss(struct engine *e, struct engine_batch *eb,
			struct engine_fb_result *res, const struct parity_case *c,
			const struct parity_batch *b, double *ret_loss,
			struct loss_metric *ret_metrics, struct eng_error *err)
{
	struct loss_engine_ctx lc;
	struct loss_request q;
	int rc;

	memset(&q, 0, sizeof(q));
	q.n = b->n;
	q.num_seqs = b->num_seqs;
	q.seq_lens = b->seq_lens;
	for (int k = 0; k < LOSS_IN_REQUEST_COUNT; k++)
		q.in[k] = b->req[k];
	rc = loss_engine_ctx_init(&lc, &c->spec, &q, err);
	if (rc)
		return rc;
	eb->loss_fn = loss_engine_fn;
	eb->loss_ctx = &lc;
	rc = engine_forward_backward(e, eb, res, err);
	if (!rc)
		loss_engine_ctx_result(&lc, ret_loss, ret_metrics);
	eb->loss_ctx = NULL;
	loss_engine_ctx_destroy(&lc);
	return rc;
}

static int run_case(const char *dir, struct eng_error *err)
{
	struct parity_case c;
	struct parity_batch b = { 0 };
	struct engine_init_config cfg;
	struct engine *e = NULL;
	struct engine_batch eb = { 0 };
	struct engine_fb_result res = { 0 };
	struct grad_loss gl = { 0 };
	struct dump d = { 0 };
	struct call_metrics cm;
	char model_dir[4096];
	char mb[256] = "", loss[64] = "", losses[512] = "", norms[512] = "", skipped[64] = "";
	char lrs[512] = "";
	float *lp = NULL, *ent = NULL, *val = NULL;
	bool value_model;
	int64_t np;
	int i, k, rc;

	memset(&cm, 0, sizeof(cm));
	if (read_case(dir, &c))
		return eng_fail(err, -EINVAL, "%s/case.json unreadable", dir);
	value_model = strcmp(c.model_type, "value_model") == 0;
	rc = read_batch(dir, c.has_loss, &b, err);
	if (!rc && c.has_loss)
		rc = validate_loss(&c, &b, value_model, err);
	if (rc)
		goto out;

	engine_init_config_defaults(&cfg);
	snprintf(model_dir, sizeof(model_dir), "%s/model", dir);
	cfg.model_type = c.model_type;
	cfg.backend = "native";
	cfg.device = "cpu";
	cfg.model_path = model_dir;
	cfg.seed = 1;
	cfg.optim = c.optim;
	cfg.sched.type = LR_SCHEDULE_CONSTANT;
	cfg.max_tokens_per_micro_batch = c.max_tokens;
	cfg.threads = c.threads;
	cfg.lm_tile_floats = c.lm_tile;
	cfg.lm_cache_floats = c.lm_cache;
	rc = engine_create(&cfg, &e, err);
	if (rc)
		goto out;
	/* Stay in TRAIN: a call made while IDLE would zero grads on exit. */
	rc = engine_set_mode(e, ENGINE_MODE_TRAIN, false, err);
	if (rc)
		goto out;

	np = engine_num_params(e);
	lp = calloc((size_t)b.n, sizeof(float));
	ent = calloc((size_t)b.n, sizeof(float));
	val = calloc((size_t)b.n, sizeof(float));
	if (np <= 0 || !lp || !ent || !val || dump_init(&d, (int)(2 * np + 2))) {
		rc = eng_fail(err, -ENOMEM, "outputs (%lld parameters)", (long long)np);
		goto out;
	}
	eb.n = b.n;
	eb.input_ids = b.input_ids;
	eb.num_seqs = b.num_seqs;
	eb.seq_lens = b.seq_lens;
	eb.temperature = (float)c.temperature;
	eb.max_tokens_per_micro_batch = c.max_tokens;
	eb.loss_fn = grad_loss_fn;
	eb.loss_ctx = &gl;
	gl.b = &b;
	if (value_model)
		res.values = val;
	else {
		res.log_probs = lp;
		res.entropy = ent;
	}

	/* Call i: forward_backward, then (i < steps) optimizer step i + 1.
	 * Outputs and gradients are those of call 0 (initial weights). */
	for (i = 0; i == 0 || i < c.steps; i++) {
		struct engine_step_result sr;
		struct loss_metric m[LOSS_M_COUNT];
		double call_loss = 0;

		if (c.has_loss) {
			rc = fb_with_loss(e, &eb, &res, &c, &b, &call_loss, m, err);
		} else {
			gl.loss = 0;
			rc = engine_forward_backward(e, &eb, &res, err);
			call_loss = gl.loss;
		}
		if (rc)
			goto out;
		appendf(mb, sizeof(mb), "%s%d", i ? "," : "", res.num_micro_batches);
		appendf(losses, sizeof(losses), "%s%.17g", i ? "," : "", call_loss);
		for (k = 0; c.has_loss && k < LOSS_M_COUNT; k++) {
			if (!m[k].present)
				continue;
			cm.present[k] = true;
			appendf(cm.text[k], sizeof(cm.text[k]), "%s%.17g", i ? "," : "",
				m[k].value);
		}
		if (i == 0) {
			snprintf(loss, sizeof(loss), "%.17g", call_loss);
			rc = dump_outputs(&d, value_model, b.n, lp, ent, val);
			if (rc) {
				rc = eng_fail(err, rc, "copying outputs");
				goto out;
			}
			rc = dump_params(e, &d, true, err);
			if (rc)
				goto out;
		}
		if (i >= c.steps)
			break;
		rc = engine_optimizer_step(e, &sr, err);
		if (rc)
			goto out;
		appendf(norms, sizeof(norms), "%s%.17g", i ? "," : "", sr.grad_norm);
		appendf(skipped, sizeof(skipped), "%s%d", i ? "," : "", sr.skipped ? 1 : 0);
		appendf(lrs, sizeof(lrs), "%s%.17g", i ? "," : "", sr.lr);
	}
	rc = dump_params(e, &d, false, err);
	if (!rc)
		rc = write_results(dir, &d, mb, loss, losses, norms, skipped, lrs, &cm, err);
out:
	engine_destroy(e);
	dump_free(&d);
	batch_free(&b);
	free(lp);
	free(ent);
	free(val);
	return rc;
}

int main(int argc, char **argv)
{
	struct eng_error err = { 0 };
	int rc;

	if (argc != 2) {
		fprintf(stderr, "usage: %s CASE_DIR\n", argv[0]);
		return 2;
	}
	rc = run_case(argv[1], &err);
	if (rc) {
		fprintf(stderr, "parity_driver: %s: %s (%s)\n", argv[1],
			err.msg[0] ? err.msg : "failed", eng_strerror(rc));
		return 1;
	}
	return 0;
}
