/* native_optim_files.c — the files that hold a checkpoint's AdamW moments,
 * in either of two layouts (docs/DISTRIBUTED.md, Checkpoints):
 *   one engine:  optimizer.safetensors, "exp_avg.<name>" and
 *                "exp_avg_sq.<name>" per tensor of the parameter table;
 *   a group of W: optimizer-<r>-of-<W>.safetensors per rank r (5 digits
 *                each), "exp_avg" and "exp_avg_sq" flat over the rank's
 *                slice [r x S, min((r + 1) x S, P)) of the flat table,
 *                S = ceil(P / W), P the parameter count.
 * Any range of the flat table reads from either layout, so any world size
 * loads any checkpoint: the reader opens only the files that cover the
 * range it wants. */
#include "native_engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../checkpoint/checkpoint.h"
#include "io/safetensors.h"

static const char *const one_prefix[2] = {"exp_avg.", "exp_avg_sq."};
static const char *const shard_tensor[2] = {"exp_avg", "exp_avg_sq"};

void native_shard_name(char *buf, size_t cap, int rank, int world)
{
	snprintf(buf, cap, "optimizer-%05d-of-%05d.safetensors", rank, world);
}

/* Rank r's slice of P parameters over W ranks: [*off, *off + *len). */
static void shard_range(int64_t P, int W, int r, int64_t *off, int64_t *len)
{
	int64_t S = (P + W - 1) / W, lo = (int64_t)r * S, hi = lo + S;

	if (lo > P)
		lo = P;
	if (hi > P)
		hi = P;
	*off = lo;
	*len = hi - lo;
}

int native_shard_write(struct native *n, int dirfd, const char *shown, int rank, int world,
		       const float *m, const float *v,
		       void (*progress)(void *ctx, uint64_t data_bytes), void *ctx,
		       uint64_t *ret_bytes, uint64_t *ret_xxh, struct eng_error *err)
{
	struct st_writer *sw;
	char name[64], num[3][24];
	int64_t off, len;
	int rc;

	native_shard_name(name, sizeof(name), rank, world);
	shard_range(n->table.total, world, rank, &off, &len);
	rc = st_writer_new_at(dirfd, name, shown, &sw, err);
	if (rc)
		return rc;
	rc = st_writer_add(sw, shard_tensor[0], ST_F32, 1, &len, m, err);
	if (rc == 0)
		rc = st_writer_add(sw, shard_tensor[1], ST_F32, 1, &len, v, err);
	snprintf(num[0], sizeof(num[0]), "%lld", (long long)off);
	snprintf(num[1], sizeof(num[1]), "%lld", (long long)n->table.total);
	snprintf(num[2], sizeof(num[2]), "%d", world);
	if (rc == 0)
		rc = st_writer_meta(sw, "format", "pt", err);
	if (rc == 0)
		rc = st_writer_meta(sw, "shard_offset", num[0], err);
	if (rc == 0)
		rc = st_writer_meta(sw, "num_parameters", num[1], err);
	if (rc == 0)
		rc = st_writer_meta(sw, "world_size", num[2], err);
	if (rc) {
		st_writer_abort(sw);
		return rc;
	}
	if (progress)
		st_writer_set_progress(sw, progress, ctx);
	return st_writer_finish(sw, ret_bytes, ret_xxh, err);
}

int native_optim_layout(json_t *state, const char *shown, int *ret_world,
			struct eng_error *err)
{
	json_t *files = json_object_get(state, "files");
	json_int_t W = json_integer_value(json_object_get(state, "world_size"));
	char name[64];

	if (json_object_get(files, NATIVE_OPTIM_FILE)) {
		*ret_world = 1;
		return 0;
	}
	/* At most one shard per listed file. */
	if (W <= 1 || W > (json_int_t)json_object_size(files))
		return eng_fail(err, -EBADMSG, "%s: files lacks %s%s, but contents lists "
				"'optimizer'", shown, NATIVE_OPTIM_FILE,
				W > 1 ? " and the group's optimizer shards" : "");
	for (int r = 0; r < (int)W; r++) {
		native_shard_name(name, sizeof(name), r, (int)W);
		if (!json_object_get(files, name))
			return eng_fail(err, -EBADMSG, "%s: optimizer shard %s is not listed "
					"(world_size %lld)", shown, name, (long long)W);
	}
	*ret_world = (int)W;
	return 0;
}

/* Whether shard r of W holds part of [first, first + count). */
static bool shard_covers(int64_t P, int W, int r, int64_t first, int64_t count)
{
	int64_t off, len;

	shard_range(P, W, r, &off, &len);
	return len > 0 && off < first + count && first < off + len;
}

bool native_optim_file_needed(const struct native *n, json_t *state, const char *name,
			      int64_t first, int64_t count)
{
	char want[64];
	int W;

	if (native_optim_layout(state, "", &W, NULL))
		return false;
	if (W == 1)
		return !strcmp(name, NATIVE_OPTIM_FILE);
	for (int r = 0; r < W; r++) {
		native_shard_name(want, sizeof(want), r, W);
		if (!strcmp(name, want))
			return shard_covers(n->table.total, W, r, first, count);
	}
	return false;
}

int native_check_tensor(struct st_reader *r, const char *file, const char *tname, int ndim,
			const int64_t *shape, struct eng_error *err)
{
	const struct st_tensor_info *t = st_reader_find(r, tname);

	if (!t)
		return eng_fail(err, -EBADMSG, "%s: tensor %s is missing", file, tname);
	if (t->ndim != ndim || t->shape[0] != shape[0] || (ndim > 1 && t->shape[1] != shape[1]))
		return eng_fail(err, -EINVAL,
				"%s: tensor %s has shape [%lld, %lld], the engine's is [%lld, %lld]",
				file, tname, (long long)t->shape[0],
				(long long)(t->ndim > 1 ? t->shape[1] : 0), (long long)shape[0],
				(long long)(ndim > 1 ? shape[1] : 0));
	return 0;
}

static int open_one(struct native *n, int ckfd, const char *dir, const char *file,
		    struct st_reader **ret, struct eng_error *err)
{
	char path[4200];
	int rc;

	snprintf(path, sizeof(path), "%s/%s", dir, file);
	rc = st_reader_open_at(ckfd, file, path, ret, err);
	if (rc == 0)
		st_reader_set_threads(*ret, n->io_threads);
	return rc;
}

int native_optim_open(struct native *n, int ckfd, const char *dir, json_t *state,
		      int64_t first, int64_t count, struct native_optim_src *src,
		      struct eng_error *err)
{
	char shown[4200], name[160];
	int rc, W;

	memset(src, 0, sizeof(*src));
	snprintf(shown, sizeof(shown), "%s/engine_state.json", dir);
	rc = native_optim_layout(state, shown, &W, err);
	if (rc)
		return rc;
	src->world = W;
	src->r = calloc((size_t)W, sizeof(*src->r));
	if (!src->r)
		return eng_fail(err, -ENOMEM, "checkpoint: out of memory");
	if (W == 1) {
		rc = open_one(n, ckfd, dir, NATIVE_OPTIM_FILE, &src->r[0], err);
		for (int f = 0; f < 2 && !rc; f++)
			for (int64_t i = 0; i < n->table.count && !rc; i++) {
				const struct param_entry *p = &n->table.entries[i];

				snprintf(name, sizeof(name), "%s%s", one_prefix[f], p->name);
				rc = native_check_tensor(src->r[0], NATIVE_OPTIM_FILE, name, p->ndim,
						  p->shape, err);
			}
		return rc;
	}
	for (int r = 0; r < W && !rc; r++) {
		int64_t off, len;

		if (!shard_covers(n->table.total, W, r, first, count))
			continue;
		shard_range(n->table.total, W, r, &off, &len);
		native_shard_name(name, sizeof(name), r, W);
		rc = open_one(n, ckfd, dir, name, &src->r[r], err);
		for (int f = 0; f < 2 && !rc; f++)
			rc = native_check_tensor(src->r[r], name, shard_tensor[f], 1, &len, err);
	}
	return rc;
}

int native_optim_read(struct native *n, struct native_optim_src *src, int which,
		      int64_t first, int64_t count, float *dst, struct eng_error *err)
{
	int64_t P = n->table.total, end = first + count, pend = end < P ? end : P;
	char name[160];
	int rc = 0;

	if (src->world == 1) {
		for (int64_t i = 0; i < n->table.count && !rc; i++) {
			const struct param_entry *p = &n->table.entries[i];
			int64_t lo = p->offset > first ? p->offset : first;
			int64_t hi = p->offset + p->numel < pend ? p->offset + p->numel : pend;

			if (lo >= hi)
				continue;
			snprintf(name, sizeof(name), "%s%s", one_prefix[which], p->name);
			rc = st_reader_read_f32_range(src->r[0], name, lo - p->offset, hi - lo,
						      dst + (lo - first), err);
		}
	} else {
		for (int r = 0; r < src->world && !rc; r++) {
			int64_t off, len, lo, hi;

			shard_range(P, src->world, r, &off, &len);
			lo = off > first ? off : first;
			hi = off + len < pend ? off + len : pend;
			if (lo >= hi)
				continue;
			if (!src->r[r])
				return eng_fail(err, -EINVAL, "checkpoint: optimizer shard %d was not "
						"opened for [%lld, %lld)", r, (long long)first,
						(long long)end);
			rc = st_reader_read_f32_range(src->r[r], shard_tensor[which], lo - off,
						      hi - lo, dst + (lo - first), err);
		}
	}
	/* The padding past the table (a group's last slice) stays zero. */
	if (rc == 0 && end > pend)
		memset(dst + (pend > first ? pend - first : 0), 0,
		       (size_t)(end - (pend > first ? pend : first)) * sizeof(float));
	return rc;
}

void native_optim_close(struct native_optim_src *src)
{
	for (int r = 0; src->r && r < src->world; r++)
		st_reader_close(src->r[r]);
	free(src->r);
	memset(src, 0, sizeof(*src));
}
