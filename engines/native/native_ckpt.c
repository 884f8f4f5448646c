/* native_ckpt.c — SaveCheckpoint / LoadCheckpoint of the native engine
 * (docs/DESIGN.md §6): HF config.json + model.safetensors, optimizer moments in
 * optimizer.safetensors, engine_state.json with steps, scheduler, RNG and
 * hyper-parameters (its members and their schema: native_state.c). The
 * directory protocol (temp dir, fsync, rename, latest, rotation,
 * checksums, the state file's seal) is engines/checkpoint's. */
#include "native_engine.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../checkpoint/checkpoint.h"
#include "../io/safetensors.h"

/* Progress of a save or load: tensor data bytes, `base` of them in files
 * before this one (engine_set_progress). */
struct ckpt_progress {
	struct engine *e;
	const char *file;
	int64_t base, total;
};

static void file_progress(void *ctx, uint64_t data_bytes)
{
	struct ckpt_progress *p = ctx;

	engine_progress(p->e, p->file, p->base + (int64_t)data_bytes, p->total, "bytes");
}

/* Write one safetensors file holding the table's tensors of `nfam` state
 * families (data[f], names prefixed by prefix[f]) and record it. */
static int write_families(struct native *n, struct ckpt_writer *w, const char *file,
			  int nfam, const char *const *prefix, const float *const *data,
			  struct ckpt_progress *pr, struct eng_error *err)
{
	struct st_writer *sw;
	uint64_t bytes, xxh;
	char name[160];
	int rc;

	rc = st_writer_new_at(ckpt_writer_dirfd(w), file, ckpt_writer_path(w, file), &sw, err);
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
	pr->file = file;
	file_progress(pr, 0);
	st_writer_set_progress(sw, file_progress, pr);
	rc = st_writer_finish(sw, &bytes, &xxh, err);
	pr->base += (int64_t)nfam * n->table.total * (int64_t)sizeof(float);
	if (rc)
		return rc;
	return ckpt_writer_record(w, file, bytes, xxh, err);
}

/* A safe point of a save: cancelled, the temporary directory goes and
 * nothing was saved. */
static int save_cancelled(struct engine *e, const char *after, struct eng_error *err)
{
	if (!engine_cancelled(e))
		return 0;
	return eng_fail(err, -ECANCELED,
			"SaveCheckpoint: cancelled after writing %s (the client went away or its "
			"deadline passed); nothing was saved", after);
}

/* In a group every rank calls SaveCheckpoint; the moment slices are
 * gathered to rank 0 (a collective, before anything is written), which
 * alone writes the checkpoint, in the format of one engine with every
 * moment: any world size loads it. gathered[] are rank 0's full copies;
 * the other ranks are done once their slices were sent. */
static int group_save_gather(struct native *n, unsigned contents, float *gathered[2],
			     struct eng_error *err)
{
	size_t bytes = (size_t)n->padded_total * sizeof(float);
	enum native_fam fam[2] = {FAM_EXP_AVG, FAM_EXP_AVG_SQ};
	int rc;

	if (!(contents & CKPT_OPTIMIZER))
		return 0;
	rc = native_require_placed(n, false, true, err);
	for (int i = 0; i < 2 && rc == 0; i++) {
		if (n->dist->rank == 0 && !(gathered[i] = malloc(bytes)))
			return eng_fail(err, -ENOMEM, "checkpoint: out of host memory for the "
					"optimizer state (%zu MiB)", bytes >> 20);
		rc = native_dist_gather_moments(n, fam[i], gathered[i], err);
	}
	return rc;
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
	int64_t fam_bytes = n->table.total * (int64_t)sizeof(float);
	struct ckpt_progress pr = {
		e, "model.safetensors", 0,
		((contents & CKPT_MODEL) ? fam_bytes : 0) +
		((contents & CKPT_OPTIMIZER) ? 2 * fam_bytes : 0),
	};
	json_t *state;
	char *cfg;
	float *gathered[2] = {NULL, NULL};
	int rc;

	if (n->dist) {
		rc = group_save_gather(n, contents, gathered, err);
		if (rc || n->dist->rank != 0) {
			free(gathered[0]);
			free(gathered[1]);
			if (rc == 0 && ret_bytes)
				*ret_bytes = 0;
			return rc;
		}
	}
	rc = ckpt_writer_begin(dir, &w, err);
	if (rc) {
		free(gathered[0]);
		free(gathered[1]);
		return rc;
	}
	if (contents & CKPT_MODEL) {
		cfg = model_config_to_json(&n->cfg);
		rc = cfg ? ckpt_writer_put(w, "config.json", cfg, strlen(cfg), err)
			 : eng_fail(err, -ENOMEM, "checkpoint: out of memory");
		free(cfg);
		if (rc == 0)
			rc = native_family_read(n, FAM_PARAMS, &data[0], &owned[0], err);
		if (rc == 0)
			rc = write_families(n, w, "model.safetensors", 1, model_prefix, data, &pr,
					    err);
		n->dev->ops->host_free(n->dev, owned[0]);
		owned[0] = NULL;
	}
	if (rc == 0 && (contents & CKPT_MODEL))
		rc = save_cancelled(e, "model.safetensors", err);
	if (rc == 0 && (contents & CKPT_OPTIMIZER)) {
		if (gathered[0]) {
			data[0] = gathered[0];
			data[1] = gathered[1];
		} else {
			rc = native_family_read(n, FAM_EXP_AVG, &data[0], &owned[0], err);
			if (rc == 0)
				rc = native_family_read(n, FAM_EXP_AVG_SQ, &data[1], &owned[1],
							err);
		}
		if (rc == 0)
			rc = write_families(n, w, "optimizer.safetensors", 2, optim_prefix, data,
					    &pr, err);
		n->dev->ops->host_free(n->dev, owned[0]);
		n->dev->ops->host_free(n->dev, owned[1]);
	}
	free(gathered[0]);
	free(gathered[1]);
	if (rc == 0)
		rc = save_cancelled(e, "the files", err);
	if (rc) {
		ckpt_writer_abort(w);
		return rc;
	}
	engine_progress(e, "commit", pr.total, pr.total, "bytes");
	state = native_state_json(n, global_step, contents);
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
		       struct ckpt_progress *pr, struct eng_error *err)
{
	float *host = native_family_host_ptr(n, f->family);
	char name[160];
	int rc = 0;

	if (!host)
		host = staging;
	pr->file = f->file;
	for (int64_t i = 0; i < n->table.count && !rc; i++) {
		const struct param_entry *p = &n->table.entries[i];

		snprintf(name, sizeof(name), "%s%s", f->prefix, p->name);
		rc = st_reader_read_f32(f->r, name, host + p->offset, p->numel, err);
		pr->base += p->numel * (int64_t)sizeof(float);
		if (rc == 0)
			file_progress(pr, 0);
	}
	if (rc == 0 && host == staging)
		rc = native_family_write(n, f->family, host, err);
	return rc;
}

/* In a group every rank calls LoadCheckpoint; rank 0 alone reads the
 * checkpoint (a single engine's format, saved by any world size: the
 * optimizer is resharded as it is scattered) and sends, in this order,
 * the header (its verdict, the contents it loads, the steps and RNG),
 * the slices of exp_avg and exp_avg_sq, then the parameters. */
struct group_load_header {
	int64_t rc, contents, global_step, optim_step, sched_step;
	uint64_t rng[4];
};

/* What rank 0's load leaves on a rank: steps, RNG, zeroed gradients. */
static int group_load_apply(struct engine *e, struct native *n,
			    const struct group_load_header *h, struct eng_error *err)
{
	if (h->contents & CKPT_EXTRA) {
		n->optim_step = h->optim_step;
		n->sched_step = h->sched_step;
		(void)rng_set_state(&n->rng, h->rng, NULL);  /* rank 0 checked it */
	}
	if (h->contents & CKPT_MODEL) {
		n->dev->param_version++;
		return native_zero_grad(e, err);
	}
	return 0;
}

static int group_load_follow(struct engine *e, struct native *n, int64_t *ret_global_step,
			     struct eng_error *err)
{
	struct group_load_header h;
	int rc;

	rc = native_dist_bcast_words(n, &h, sizeof(h), err);
	if (rc)
		return rc;
	if (h.rc < 0)
		return eng_fail(err, eng_strerror((int)h.rc)[1] != '?' ? (int)h.rc : -EIO,
				"LoadCheckpoint: rank 0 refused the checkpoint (%s); rank 0's "
				"reply says why", eng_strerror((int)h.rc));
	if (h.contents & CKPT_OPTIMIZER) {
		rc = native_dist_scatter_moments(n, FAM_EXP_AVG, NULL, err);
		if (rc == 0)
			rc = native_dist_scatter_moments(n, FAM_EXP_AVG_SQ, NULL, err);
	}
	if (rc == 0 && (h.contents & CKPT_MODEL))
		rc = native_dist_sync_params(n, err);
	if (rc == 0)
		rc = group_load_apply(e, n, &h, err);
	if (rc == 0 && ret_global_step)
		*ret_global_step = h.global_step;
	return rc;
}

/* Rank 0's half: the header, then the full moments read from their file
 * into `full` (padded_total floats) and scattered. */
static int group_load_send(struct native *n, struct family_file *files, const bool want[3],
			   const struct group_load_header *h, struct eng_error *err)
{
	struct group_load_header copy = *h;
	float *full = NULL;
	char name[160];
	int rc;

	rc = native_dist_bcast_words(n, &copy, sizeof(copy), err);
	if (rc || h->rc)
		return rc;
	if (want[1] && !(full = calloc((size_t)n->padded_total, sizeof(float))))
		rc = eng_fail(err, -ENOMEM, "checkpoint: out of host memory for the optimizer state");
	for (int f = 1; f < 3 && rc == 0; f++) {
		if (!want[f])
			continue;
		for (int64_t i = 0; i < n->table.count && !rc; i++) {
			const struct param_entry *p = &n->table.entries[i];

			snprintf(name, sizeof(name), "%s%s", files[f].prefix, p->name);
			rc = st_reader_read_f32(files[f].r, name, full + p->offset, p->numel, err);
		}
		if (rc == 0)
			rc = native_dist_scatter_moments(n, files[f].family, full, err);
	}
	free(full);
	return rc;
}

/* The verification's part of a load's progress: its bytes, then the
 * tensor data (pr->total) on top. */
struct verify_total {
	struct ckpt_progress *pr;
	uint64_t total;
};

static void verify_progress(void *ctx, uint64_t done, uint64_t total)
{
	struct verify_total *v = ctx;

	v->total = total;
	engine_progress(v->pr->e, "verify", (int64_t)done, (int64_t)total + v->pr->total,
			"bytes");
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
	json_t *state = NULL;
	struct native_saved_state saved;
	char *resolved = NULL, path[4200];
	float *host = NULL;
	bool staging = false;
	int64_t fam_bytes = n->table.total * (int64_t)sizeof(float);
	struct ckpt_progress pr = {     /* total: the tensor data until verified */
		e, "verify", 0,
		((contents & CKPT_MODEL) ? fam_bytes : 0) +
		((contents & CKPT_OPTIMIZER) ? 2 * fam_bytes : 0),
	};
	struct verify_total vcount = { &pr, 0 };
	const struct ckpt_open_progress vp = { verify_progress, &vcount };
	int rc, ckfd = -1;

	if (n->dist && n->dist->rank != 0)
		return group_load_follow(e, n, ret_global_step, err);
	/* ckpt_open reads every file once for its checksum ("verify"): its
	 * bytes come first, then the tensor data read. */
	rc = ckpt_open_progress(dir, &vp, (void *)&state, &resolved, &ckfd, err);
	pr.base = (int64_t)vcount.total;
	pr.total += pr.base;
	if (rc && n->dist) {
		struct group_load_header h = {.rc = rc};

		(void)group_load_send(n, files, want, &h, NULL);
	}
	if (rc)
		return rc;
	snprintf(path, sizeof(path), "%s/engine_state.json", resolved);
	memset(&saved, 0, sizeof(saved));
	rc = native_state_check(n, state, path, &saved, err);
	/* Each refusal below is also rank 0's verdict for its group. */
	if (rc == 0 && (contents & CKPT_MODEL) && !(saved.contents & CKPT_MODEL))
		rc = eng_fail(err, -EINVAL, "contents: checkpoint %s holds no model", resolved);
	else if (rc == 0 && (contents & CKPT_OPTIMIZER) && !(saved.contents & CKPT_OPTIMIZER))
		rc = eng_fail(err, -EINVAL, "contents: checkpoint %s holds no optimizer state", resolved);
	else if (rc == 0 && (contents & CKPT_EXTRA) && !(saved.contents & CKPT_EXTRA))
		rc = eng_fail(err, -EINVAL, "contents: checkpoint %s holds no engine state", resolved);
	/* Validate everything before the first byte of engine state changes. */
	for (int f = 0; f < 3 && !rc; f++) {
		if (!want[f])
			continue;
		snprintf(path, sizeof(path), "%s/%s", resolved, files[f].file);
		rc = st_reader_open_at(ckfd, files[f].file, path, &files[f].r, err);
		if (rc == 0) {
			st_reader_set_threads(files[f].r, n->io_threads);
			rc = check_shapes(n, &files[f], err);
		}
	}
	/* The load's one safe point: everything is checked, nothing changed. */
	if (rc == 0 && engine_cancelled(e))
		rc = eng_fail(err, -ECANCELED,
			      "LoadCheckpoint: cancelled before it changed anything (the client went "
			      "away or its deadline passed)");
	if (rc == 0 && n->dist && want[1])
		rc = native_require_placed(n, false, true, err);
	if (n->dist) {
		struct group_load_header h = {
			.rc = rc, .contents = contents, .global_step = saved.global_step,
			.optim_step = saved.optim_step, .sched_step = saved.sched_step,
		};
		int r2;

		memcpy(h.rng, saved.rng, sizeof(h.rng));
		r2 = group_load_send(n, files, want, &h, err);
		if (rc == 0)
			rc = r2;
		if (rc == 0)
			want[1] = want[2] = false;   /* scattered: not read again below */
	}
	for (int f = 0; f < 3 && !rc; f++)
		if (want[f] && !native_family_host_ptr(n, files[f].family))
			staging = true;
	if (rc == 0 && staging && !(host = malloc(n->table.total * sizeof(float))))
		rc = eng_fail(err, -ENOMEM, "checkpoint: out of host memory");
	for (int f = 0; f < 3 && !rc; f++)
		if (want[f])
			rc = read_family(n, &files[f], host, &pr, err);
	if (rc == 0 && (contents & CKPT_EXTRA)) {
		n->optim_step = saved.optim_step;
		n->sched_step = saved.sched_step;
		(void)rng_set_state(&n->rng, saved.rng, NULL);  /* checked: not all zero */
	}
	if (rc == 0 && (contents & CKPT_MODEL) && n->dist)
		rc = native_dist_sync_params(n, err);
	if (rc == 0 && (contents & CKPT_MODEL)) {
		n->dev->param_version++;
		rc = native_zero_grad(e, err);
	}
	if (rc == 0 && ret_global_step)
		*ret_global_step = saved.global_step;
	for (int f = 0; f < 3; f++)
		st_reader_close(files[f].r);
	free(host);
	free(resolved);
	if (ckfd >= 0)
		close(ckfd);
	json_decref(state);
	return rc;
}
