/* native_ckpt.c — SaveCheckpoint / LoadCheckpoint of the native engine
 * (docs/DESIGN.md §6): HF config.json + model.safetensors, optimizer moments in
 * optimizer.safetensors, engine_state.json with steps, scheduler, RNG and
 * hyper-parameters. The directory protocol (temp dir, fsync, rename,
 * latest, rotation, checksums) is engines/checkpoint's. */
#include "native_engine.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../checkpoint/checkpoint.h"
#include "../io/safetensors.h"

#define ENGINE_STATE_FORMAT 1

/* Write one safetensors file holding the table's tensors of `nfam` state
 * families (data[f], names prefixed by prefix[f]) and record it. */
static int write_families(struct native *n, struct ckpt_writer *w, const char *file,
			  int nfam, const char *const *prefix, const float *const *data,
			  struct eng_error *err)
{
	struct st_writer *sw;
	uint64_t bytes, xxh;
	char name[160];
	int rc;

	rc = st_writer_new(ckpt_writer_path(w, file), &sw, err);
	if (rc)
		return rc;
	for (int f = 0; f < nfam; f++) {
		for (int64_t i = 0; i < n->table.count && !rc; i++) {
			const struct param_entry *p = &n->table.entries[i];

			snprintf(name, sizeof(name), "%s%s", prefix[f], p->name);
			rc = st_writer_add(sw, name, ST_F32, p->ndim, p->shape,
					   data[f] + p->offset, err);
		}
	}
	if (rc == 0)
		rc = st_writer_meta(sw, "format", "pt", err);
	if (rc) {
		st_writer_abort(sw);
		return rc;
	}
	rc = st_writer_finish(sw, &bytes, &xxh, err);
	if (rc)
		return rc;
	return ckpt_writer_record(w, file, bytes, xxh, err);
}

static json_t *state_json(struct native *n, int64_t global_step, unsigned contents)
{
	json_t *s = json_object(), *rng = json_array(), *c = json_array();
	uint64_t st[RNG_STATE_WORDS];
	char hex[32];

	rng_get_state(&n->rng, st);
	for (int i = 0; i < 4; i++) {
		snprintf(hex, sizeof(hex), "%016" PRIx64, st[i]);
		json_array_append_new(rng, json_string(hex));
	}
	if (contents & CKPT_MODEL)
		json_array_append_new(c, json_string("model"));
	if (contents & CKPT_OPTIMIZER)
		json_array_append_new(c, json_string("optimizer"));
	if (contents & CKPT_EXTRA)
		json_array_append_new(c, json_string("extra"));
	json_object_set_new(s, "format_version", json_integer(ENGINE_STATE_FORMAT));
	json_object_set_new(s, "engine_key", json_string(n->key));
	json_object_set_new(s, "world_size", json_integer(1));
	json_object_set_new(s, "global_step", json_integer(global_step));
	json_object_set_new(s, "optimizer_step", json_integer(n->optim_step));
	json_object_set_new(s, "lr_scheduler_step", json_integer(n->sched_step));
	json_object_set_new(s, "num_parameters", json_integer(n->table.total));
	json_object_set_new(s, "seed", json_integer((json_int_t)n->seed));
	json_object_set_new(s, "rng_state", rng);
	json_object_set_new(s, "contents", c);
	json_object_set_new(s, "optimizer", json_pack("{s:s, s:f, s:f, s:f, s:f, s:f, s:f}",
		"type", "adamw", "lr", n->optim.lr, "beta1", n->optim.beta1,
		"beta2", n->optim.beta2, "eps", n->optim.eps,
		"weight_decay", n->optim.weight_decay, "clip_grad", n->optim.clip_grad));
	json_object_set_new(s, "lr_scheduler", json_pack("{s:i, s:I, s:I, s:f, s:f}",
		"type", (int)n->sched.type, "warmup_steps", (json_int_t)n->sched.warmup_steps,
		"total_steps", (json_int_t)n->sched.total_steps,
		"min_lr_ratio", n->sched.min_lr_ratio, "num_cycles", n->sched.num_cycles));
	return s;
}

int native_save_checkpoint(struct engine *e, const char *dir, int64_t global_step,
			   int max_to_keep, unsigned contents, size_t *ret_bytes,
			   struct eng_error *err)
{
	struct native *n = engine_impl(e);
	struct ckpt_writer *w;
	static const char *const model_prefix[1] = {""};
	static const char *const optim_prefix[2] = {"exp_avg.", "exp_avg_sq."};
	const float *data[2];
	float *owned[2] = {NULL, NULL};
	uint64_t total = 0;
	json_t *state;
	char *cfg;
	int rc;

	rc = ckpt_writer_begin(dir, &w, err);
	if (rc)
		return rc;
	if (contents & CKPT_MODEL) {
		cfg = model_config_to_json(&n->cfg);
		rc = cfg ? ckpt_writer_put(w, "config.json", cfg, strlen(cfg), err)
			 : eng_fail(err, -ENOMEM, "checkpoint: out of memory");
		free(cfg);
		if (rc == 0)
			rc = native_family_read(n, FAM_PARAMS, &data[0], &owned[0], err);
		if (rc == 0)
			rc = write_families(n, w, "model.safetensors", 1, model_prefix, data, err);
		n->dev->ops->host_free(n->dev, owned[0]);
		owned[0] = NULL;
	}
	if (rc == 0 && (contents & CKPT_OPTIMIZER)) {
		rc = native_family_read(n, FAM_EXP_AVG, &data[0], &owned[0], err);
		if (rc == 0)
			rc = native_family_read(n, FAM_EXP_AVG_SQ, &data[1], &owned[1], err);
		if (rc == 0)
			rc = write_families(n, w, "optimizer.safetensors", 2, optim_prefix, data, err);
		n->dev->ops->host_free(n->dev, owned[0]);
		n->dev->ops->host_free(n->dev, owned[1]);
	}
	if (rc) {
		ckpt_writer_abort(w);
		return rc;
	}
	state = state_json(n, global_step, contents);
	if (!state) {
		ckpt_writer_abort(w);
		return eng_fail(err, -ENOMEM, "checkpoint: out of memory");
	}
	rc = ckpt_writer_commit(w, state, max_to_keep, &total, err);
	json_decref(state);
	if (rc == 0 && ret_bytes)
		*ret_bytes = total;
	return rc;
}

/* --- load --------------------------------------------------------------- */

static bool has_content(json_t *state, const char *what)
{
	json_t *c = json_object_get(state, "contents"), *v;
	size_t i;

	json_array_foreach(c, i, v)
		if (json_is_string(v) && !strcmp(json_string_value(v), what))
			return true;
	return false;
}

struct family_file {
	const char *file;
	const char *prefix;
	enum native_fam family;
	struct st_reader *r;
};

/* Check that every tensor of the table is in f->r with the right shape. */
static int check_shapes(struct native *n, const struct family_file *f,
			struct eng_error *err)
{
	const char *file = f->file;
	char name[160];

	for (int64_t i = 0; i < n->table.count; i++) {
		const struct param_entry *p = &n->table.entries[i];
		const struct st_tensor_info *t;

		snprintf(name, sizeof(name), "%s%s", f->prefix, p->name);
		t = st_reader_find(f->r, name);
		if (!t)
			return eng_fail(err, -EBADMSG, "%s: tensor %s is missing", file, name);
		if (t->ndim != p->ndim || t->shape[0] != p->shape[0] ||
		    (p->ndim > 1 && t->shape[1] != p->shape[1]))
			return eng_fail(err, -EINVAL,
					"%s: tensor %s has shape [%lld, %lld], the engine's is [%lld, %lld]",
					file, p->name, (long long)t->shape[0],
					(long long)(t->ndim > 1 ? t->shape[1] : 0),
					(long long)p->shape[0], (long long)(p->ndim > 1 ? p->shape[1] : 0));
	}
	return 0;
}

/* Read f's tensors into `host` (the family itself when host-readable, else
 * a staging buffer then copied to the device). */
static int read_family(struct native *n, struct family_file *f, float *staging,
		       struct eng_error *err)
{
	float *host = native_family_host_ptr(n, f->family);
	char name[160];
	int rc = 0;

	if (!host)
		host = staging;
	for (int64_t i = 0; i < n->table.count && !rc; i++) {
		const struct param_entry *p = &n->table.entries[i];

		snprintf(name, sizeof(name), "%s%s", f->prefix, p->name);
		rc = st_reader_read_f32(f->r, name, host + p->offset, p->numel, err);
	}
	if (rc == 0 && host == staging)
		rc = native_family_write(n, f->family, host, err);
	return rc;
}

/* The step counters a checkpoint restores count up by one per call: at
 * most 2^53 (exact in any JSON reader), far from int64's end. */
#define STATE_MAX_STEP (INT64_C(1) << 53)

/* A step of engine_state.json: an integer in [0, max]. */
static int parse_step(json_t *state, const char *key, int64_t max, int64_t *ret,
		      struct eng_error *err)
{
	json_t *v = json_object_get(state, key);

	if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > max)
		return eng_fail(err, -EBADMSG, "engine_state.json: %s must be an integer in "
				"[0, %lld]", key, (long long)max);
	*ret = json_integer_value(v);
	return 0;
}

static int parse_rng(json_t *state, uint64_t s[4], struct eng_error *err)
{
	json_t *a = json_object_get(state, "rng_state");

	if (!json_is_array(a) || json_array_size(a) != 4)
		return eng_fail(err, -EBADMSG, "engine_state.json: rng_state must be 4 hex strings");
	for (int i = 0; i < 4; i++) {
		const char *h = json_string_value(json_array_get(a, i));
		char *end;

		if (!h)
			return eng_fail(err, -EBADMSG, "engine_state.json: rng_state[%d] is not a string", i);
		s[i] = strtoull(h, &end, 16);
		if (*end || !*h)
			return eng_fail(err, -EBADMSG, "engine_state.json: rng_state[%d] is not hex", i);
	}
	if (!(s[0] | s[1] | s[2] | s[3]))
		return eng_fail(err, -EBADMSG, "engine_state.json: rng_state is all zero");
	return 0;
}

int native_load_checkpoint(struct engine *e, const char *dir, unsigned contents,
			   int64_t *ret_global_step, struct eng_error *err)
{
	struct native *n = engine_impl(e);
	struct family_file files[3] = {
		{"model.safetensors", "", FAM_PARAMS, NULL},
		{"optimizer.safetensors", "exp_avg.", FAM_EXP_AVG, NULL},
		{"optimizer.safetensors", "exp_avg_sq.", FAM_EXP_AVG_SQ, NULL},
	};
	bool want[3] = {contents & CKPT_MODEL, contents & CKPT_OPTIMIZER, contents & CKPT_OPTIMIZER};
	json_t *state = NULL, *key;
	char *resolved = NULL, path[4200];
	int64_t gstep = 0, ostep = 0, sstep = 0;
	uint64_t rng[4];
	float *host = NULL;
	bool staging = false;
	int rc;

	rc = ckpt_open(dir, (void *)&state, &resolved, err);
	if (rc)
		return rc;
	key = json_object_get(state, "engine_key");
	if (!json_is_string(key) || strcmp(json_string_value(key), n->key)) {
		rc = eng_fail(err, -EINVAL, "path: checkpoint is for engine %s, this engine is %s",
			      json_is_string(key) ? json_string_value(key) : "?", n->key);
		goto out;
	}
	/* global_step is only handed back (SaveCheckpoint takes any >= 0);
	 * the counters are restored and counted on. */
	rc = parse_step(state, "global_step", INT64_MAX, &gstep, err);
	if (rc == 0)
		rc = parse_step(state, "optimizer_step", STATE_MAX_STEP, &ostep, err);
	if (rc == 0)
		rc = parse_step(state, "lr_scheduler_step", STATE_MAX_STEP, &sstep, err);
	if (rc)
		goto out;
	if ((contents & CKPT_MODEL) && !has_content(state, "model"))
		rc = eng_fail(err, -EINVAL, "contents: checkpoint %s holds no model", resolved);
	else if ((contents & CKPT_OPTIMIZER) && !has_content(state, "optimizer"))
		rc = eng_fail(err, -EINVAL, "contents: checkpoint %s holds no optimizer state", resolved);
	else if ((contents & CKPT_EXTRA) && !has_content(state, "extra"))
		rc = eng_fail(err, -EINVAL, "contents: checkpoint %s holds no engine state", resolved);
	if (rc == 0 && (contents & CKPT_EXTRA))
		rc = parse_rng(state, rng, err);
	/* Validate everything before the first byte of engine state changes. */
	for (int f = 0; f < 3 && !rc; f++) {
		if (!want[f])
			continue;
		snprintf(path, sizeof(path), "%s/%s", resolved, files[f].file);
		rc = st_reader_open(path, &files[f].r, err);
		if (rc == 0)
			rc = check_shapes(n, &files[f], err);
	}
	for (int f = 0; f < 3 && !rc; f++)
		if (want[f] && !native_family_host_ptr(n, files[f].family))
			staging = true;
	if (rc == 0 && staging && !(host = malloc(n->table.total * sizeof(float))))
		rc = eng_fail(err, -ENOMEM, "checkpoint: out of host memory");
	for (int f = 0; f < 3 && !rc; f++)
		if (want[f])
			rc = read_family(n, &files[f], host, err);
	if (rc == 0 && (contents & CKPT_EXTRA)) {
		n->optim_step = ostep;
		n->sched_step = sstep;
		(void)rng_set_state(&n->rng, rng, NULL);  /* checked in parse_rng */
	}
	if (rc == 0 && (contents & CKPT_MODEL)) {
		n->dev->param_version++;
		rc = native_zero_grad(e, err);
	}
	if (rc == 0 && ret_global_step)
		*ret_global_step = gstep;
out:
	for (int f = 0; f < 3; f++)
		st_reader_close(files[f].r);
	free(host);
	free(resolved);
	json_decref(state);
	return rc;
}
