/* native_ckpt.c — SaveCheckpoint / LoadCheckpoint of the native engine
 * (docs/DESIGN.md §6): HF config.json + model.safetensors (an adapter's:
 * PEFT's adapter_config.json + adapter_model.safetensors), optimizer moments in
 * optimizer files (their two layouts: native_optim_files.c),
 * engine_state.json with steps, scheduler, RNG and hyper-parameters (its
 * members and their schema: native_state.c). The directory protocol (temp
 * dir, fsync, rename, latest, rotation, checksums, the state file's seal)
 * is engines/checkpoint's. A group's save and load (every rank takes part)
 * are native_ckpt_group.c's; this file has one engine's and the parts
 * both share. */
#include "native_engine.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../checkpoint/checkpoint.h"
#include "io/safetensors.h"
#include "native_peft.h"

void native_ckpt_file_progress(void *ctx, uint64_t data_bytes)
{
	struct native_ckpt_progress *p = ctx;

	engine_progress(p->e, p->file, p->base + (int64_t)data_bytes, p->total, "bytes");
}

/* Write one safetensors file holding the table's tensors of `nfam` state
 * families (data[f], names prefixed by prefix[f]) and record it. data[f]
 * NULL: the parameters of a ZeRO-3 rank 0, each tensor gathered from the
 * group as the file is written (native_group_fetch_tensor). */
static int write_families(struct native *n, struct ckpt_writer *w, const char *file,
			  int nfam, const char *const *prefix, const float *const *data,
			  struct native_ckpt_progress *pr, struct eng_error *err)
{
	struct native_fetch *fetch = NULL;
	struct st_writer *sw;
	uint64_t bytes, xxh;
	char name[160];
	int rc;

	rc = st_writer_new_at(ckpt_writer_dirfd(w), file, ckpt_writer_path(w, file), &sw, err);
	if (rc)
		return rc;
	for (int f = 0; f < nfam && !rc; f++) {
		if (!data[f] && !(fetch = calloc((size_t)n->table.count, sizeof(*fetch))))
			rc = eng_fail(err, -ENOMEM, "checkpoint: out of memory");
		for (int64_t i = 0; i < n->table.count && !rc; i++) {
			const struct param_entry *p = &n->table.entries[i];

			snprintf(name, sizeof(name), "%s%s", prefix[f], p->name);
			if (data[f]) {
				rc = st_writer_add(sw, name, ST_F32, p->ndim, p->shape,
						   data[f] + p->offset, err);
				continue;
			}
			fetch[i] = (struct native_fetch){ n, i };
			rc = st_writer_add_fill(sw, name, ST_F32, p->ndim, p->shape,
						native_group_fetch_tensor, &fetch[i], err);
		}
	}
	if (rc == 0)
		rc = st_writer_meta(sw, "format", "pt", err);
	if (rc) {
		st_writer_abort(sw);
		free(fetch);
		return rc;
	}
	pr->file = file;
	native_ckpt_file_progress(pr, 0);
	st_writer_set_progress(sw, native_ckpt_file_progress, pr);
	rc = st_writer_finish(sw, &bytes, &xxh, err);
	free(fetch);
	pr->base += (int64_t)nfam * n->table.total * (int64_t)sizeof(float);
	if (rc)
		return rc;
	return ckpt_writer_record(w, file, bytes, xxh, err);
}

int native_ckpt_write_model(struct native *n, struct ckpt_writer *w,
			    struct native_ckpt_progress *pr, struct eng_error *err)
{
	static const char *const prefix[1] = {""};
	const float *data[1];
	float *owned = NULL;
	char *cfg = n->lora ? native_peft_config_json(n) : model_config_to_json(&n->cfg);
	int rc;

	rc = cfg ? ckpt_writer_put(w, n->lora ? NATIVE_PEFT_CONFIG : "config.json", cfg,
				   strlen(cfg), err)
		 : eng_fail(err, -ENOMEM, "checkpoint: out of memory");
	free(cfg);
	data[0] = NULL;            /* ZeRO-3: gathered tensor by tensor */
	if (rc == 0 && !native_shard_params(n))
		rc = native_family_read(n, FAM_PARAMS, &data[0], &owned, err);
	if (rc == 0)
		rc = write_families(n, w, native_model_file(n), 1, prefix, data, pr, err);
	n->dev->ops->host_free(n->dev, owned);
	return rc;
}

int native_ckpt_cancelled(struct engine *e, const char *after, struct eng_error *err)
{
	if (!engine_cancelled(e))
		return 0;
	return eng_fail(err, -ECANCELED,
			"SaveCheckpoint: cancelled after writing %s (the client went away or its "
			"deadline passed); nothing was saved", after);
}

int native_ckpt_commit(struct engine *e, struct native *n, struct ckpt_writer *w,
		       int64_t global_step, int max_to_keep, unsigned contents,
		       const struct native_ckpt_progress *pr, uint64_t *ret_total,
		       struct eng_error *err)
{
	json_t *state;
	int rc;

	engine_progress(e, "commit", pr->total, pr->total, "bytes");
	state = native_state_json(n, global_step, contents);
	if (!state) {
		ckpt_writer_abort(w);
		return eng_fail(err, -ENOMEM, "checkpoint: out of memory");
	}
	rc = ckpt_writer_commit(w, state, max_to_keep, ret_total, err);
	json_decref(state);
	return rc;
}

int native_save_checkpoint(struct engine *e, const char *dir, int64_t global_step,
			   int max_to_keep, unsigned contents, size_t *ret_bytes,
			   struct eng_error *err)
{
	struct native *n = engine_impl(e);
	static const char *const optim_prefix[2] = {"exp_avg.", "exp_avg_sq."};
	const float *data[2];
	float *owned[2] = {NULL, NULL};
	struct ckpt_writer *w;
	uint64_t total = 0;
	int64_t fam_bytes = n->table.total * (int64_t)sizeof(float);
	struct native_ckpt_progress pr = {
		e, native_model_file(n), 0,
		((contents & CKPT_MODEL) ? fam_bytes : 0) +
		((contents & CKPT_OPTIMIZER) ? 2 * fam_bytes : 0),
	};
	int rc;

	if (n->frozen)
		return eng_fail(err, -ENOSYS, "SaveCheckpoint: checkpoints of a frozen base are "
				"not built yet (its weights never change)");
	if (n->group.dist)
		return native_group_save(e, n, dir, global_step, max_to_keep, contents, ret_bytes,
					 err);
	rc = ckpt_writer_begin(dir, &w, err);
	if (rc)
		return rc;
	if (contents & CKPT_MODEL) {
		rc = native_ckpt_write_model(n, w, &pr, err);
		if (rc == 0)
			rc = native_ckpt_cancelled(e, native_model_file(n), err);
	}
	if (rc == 0 && (contents & CKPT_OPTIMIZER)) {
		rc = native_family_read(n, FAM_EXP_AVG, &data[0], &owned[0], err);
		if (rc == 0)
			rc = native_family_read(n, FAM_EXP_AVG_SQ, &data[1], &owned[1], err);
		if (rc == 0)
			rc = write_families(n, w, NATIVE_OPTIM_FILE, 2, optim_prefix, data, &pr,
					    err);
		n->dev->ops->host_free(n->dev, owned[0]);
		n->dev->ops->host_free(n->dev, owned[1]);
	}
	if (rc == 0)
		rc = native_ckpt_cancelled(e, "the files", err);
	if (rc) {
		ckpt_writer_abort(w);
		return rc;
	}
	rc = native_ckpt_commit(e, n, w, global_step, max_to_keep, contents, &pr, &total, err);
	if (rc == 0 && ret_bytes)
		*ret_bytes = total;
	return rc;
}

/* --- load --------------------------------------------------------------- */

/* The verification's part of a load's progress: its bytes, then the
 * tensor data (pr->total) on top. */
struct verify_total {
	struct native_ckpt_progress *pr;
	uint64_t total;
	const struct native_load_filter *filter;
};

static void verify_progress(void *ctx, uint64_t done, uint64_t total)
{
	struct verify_total *v = ctx;

	v->total = total;
	engine_progress(v->pr->e, "verify", (int64_t)done, (int64_t)total + v->pr->total,
			"bytes");
}

static bool verify_wanted(void *ctx, json_t *state, const char *name)
{
	struct verify_total *v = ctx;

	return !v->filter || v->filter->fn(v->filter->ctx, state, name);
}

/* Check that every tensor of the table is in the model file. */
static int check_model_shapes(struct native *n, struct st_reader *r, const char *file,
			      struct eng_error *err)
{
	int rc = 0;

	for (int64_t i = 0; i < n->table.count && !rc; i++) {
		const struct param_entry *p = &n->table.entries[i];

		rc = native_check_tensor(r, file, p->name, p->ndim, p->shape, err);
	}
	return rc;
}

int native_load_open(struct engine *e, struct native *n, const char *dir, unsigned contents,
		     const struct native_load_filter *filter, int64_t first, int64_t count,
		     bool safe_point, struct native_load *L, struct eng_error *err)
{
	int64_t fam_bytes = n->table.total * (int64_t)sizeof(float);
	struct verify_total vcount = { &L->pr, 0, filter };
	const struct ckpt_open_opts opts = { verify_progress, &vcount, verify_wanted };
	char path[4200];
	int rc;

	memset(L, 0, sizeof(*L));
	L->ckfd = -1;
	if (!dir)
		return eng_fail(err, -EINVAL, "path: empty checkpoint path");
	L->pr = (struct native_ckpt_progress){     /* total: the tensor data until verified */
		e, "verify", 0,
		((contents & CKPT_MODEL) ? fam_bytes : 0) +
		((contents & CKPT_OPTIMIZER) ? 2 * count * (int64_t)sizeof(float) : 0),
	};
	/* ckpt_open reads every file once for its checksum ("verify"): its
	 * bytes come first, then the tensor data read. */
	rc = ckpt_open_with(dir, &opts, &L->state, &L->resolved, &L->ckfd, err);
	L->pr.base = (int64_t)vcount.total;
	L->pr.total += L->pr.base;
	if (rc)
		return rc;
	snprintf(path, sizeof(path), "%s/engine_state.json", L->resolved);
	rc = native_state_check(n, L->state, path, &L->saved, err);
	if (rc == 0 && (contents & CKPT_MODEL) && !(L->saved.contents & CKPT_MODEL))
		rc = eng_fail(err, -EINVAL, "contents: checkpoint %s holds no model", L->resolved);
	else if (rc == 0 && (contents & CKPT_OPTIMIZER) && !(L->saved.contents & CKPT_OPTIMIZER))
		rc = eng_fail(err, -EINVAL, "contents: checkpoint %s holds no optimizer state",
			      L->resolved);
	else if (rc == 0 && (contents & CKPT_EXTRA) && !(L->saved.contents & CKPT_EXTRA))
		rc = eng_fail(err, -EINVAL, "contents: checkpoint %s holds no engine state",
			      L->resolved);
	/* Validate everything before the first byte of engine state changes. */
	if (rc == 0 && (contents & CKPT_MODEL)) {
		snprintf(path, sizeof(path), "%s/%s", L->resolved, native_model_file(n));
		rc = st_reader_open_at(L->ckfd, native_model_file(n), path, &L->model, err);
		if (rc == 0) {
			st_reader_set_threads(L->model, n->io_threads);
			rc = check_model_shapes(n, L->model, native_model_file(n), err);
		}
	}
	if (rc == 0 && (contents & CKPT_OPTIMIZER))
		rc = native_optim_open(n, L->ckfd, L->resolved, L->state, first, count, &L->opt,
				       err);
	/* The load's one safe point: everything is checked, nothing changed. */
	if (rc == 0 && safe_point && engine_cancelled(e))
		rc = eng_fail(err, -ECANCELED,
			      "LoadCheckpoint: cancelled before it changed anything (the client went "
			      "away or its deadline passed)");
	return rc;
}

/* Into dst (a family's host memory, or staging) or through staging into
 * the device: the flat range [first, first + count) of moment `which`. */
int native_load_moment(struct native *n, struct native_load *L, int which, int64_t first,
		       int64_t count, float *dst, struct eng_error *err)
{
	int rc;

	L->pr.file = NATIVE_OPTIM_FILE;
	rc = native_optim_read(n, &L->opt, which, first, count, dst, err);
	L->pr.base += count * (int64_t)sizeof(float);
	if (rc == 0)
		native_ckpt_file_progress(&L->pr, 0);
	return rc;
}

int native_load_model(struct native *n, struct native_load *L, struct eng_error *err)
{
	float *host = native_family_host_ptr(n, FAM_PARAMS), *staging = NULL;
	int rc = 0;

	if (!host && !(host = staging = malloc((size_t)n->table.total * sizeof(float))))
		return eng_fail(err, -ENOMEM, "checkpoint: out of host memory");
	L->pr.file = native_model_file(n);
	for (int64_t i = 0; i < n->table.count && !rc; i++) {
		const struct param_entry *p = &n->table.entries[i];

		rc = st_reader_read_f32(L->model, p->name, host + p->offset, p->numel, err);
		L->pr.base += p->numel * (int64_t)sizeof(float);
		if (rc == 0)
			native_ckpt_file_progress(&L->pr, 0);
	}
	if (rc == 0 && staging)
		rc = native_family_write(n, FAM_PARAMS, staging, err);
	free(staging);
	return rc;
}

void native_load_close(struct native_load *L)
{
	st_reader_close(L->model);
	native_optim_close(&L->opt);
	free(L->resolved);
	if (L->ckfd >= 0)
		close(L->ckfd);
	json_decref(L->state);
	memset(L, 0, sizeof(*L));
	L->ckfd = -1;
}

/* What a load leaves on an engine: steps, RNG, zeroed gradients. */
int native_load_apply(struct engine *e, struct native *n, unsigned contents,
		      const struct native_saved_state *saved, struct eng_error *err)
{
	if (contents & CKPT_EXTRA) {
		n->optim_step = saved->optim_step;
		n->sched_step = saved->sched_step;
		(void)rng_set_state(&n->rng, saved->rng, NULL);  /* checked: not all zero */
	}
	if (contents & CKPT_MODEL) {
		if (!n->lora)
			n->dev->param_version++;
		native_adapter_changed(n);
		return native_zero_grad(e, err);
	}
	return 0;
}

int native_load_checkpoint(struct engine *e, const char *dir, unsigned contents,
			   int64_t *ret_global_step, struct eng_error *err)
{
	struct native *n = engine_impl(e);
	enum native_fam fam[2] = {FAM_EXP_AVG, FAM_EXP_AVG_SQ};
	struct native_load L;
	float *staging = NULL;
	int rc;

	if (n->frozen)
		return eng_fail(err, -ENOSYS, "LoadCheckpoint: checkpoints of a frozen base are "
				"not built yet (Initialize it from the model directory)");
	if (n->group.dist)
		return native_group_load(e, n, dir, contents, ret_global_step, err);
	rc = native_load_open(e, n, dir, contents, NULL, 0, n->table.total, true, &L, err);
	if (rc == 0 && (contents & CKPT_MODEL))
		rc = native_load_model(n, &L, err);
	for (int f = 0; f < 2 && rc == 0 && (contents & CKPT_OPTIMIZER); f++) {
		float *host = native_family_host_ptr(n, fam[f]);

		if (!host && !staging &&
		    !(staging = malloc((size_t)n->table.total * sizeof(float))))
			rc = eng_fail(err, -ENOMEM, "checkpoint: out of host memory");
		if (rc == 0)
			rc = native_load_moment(n, &L, f, 0, n->table.total, host ? host : staging,
						err);
		if (rc == 0 && !host)
			rc = native_family_write(n, fam[f], staging, err);
	}
	if (rc == 0)
		rc = native_load_apply(e, n, contents, &L.saved, err);
	if (rc == 0 && ret_global_step)
		*ret_global_step = L.saved.global_step;
	free(staging);
	native_load_close(&L);
	return rc;
}
