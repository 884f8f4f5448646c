/* native_ckpt_group.c — SaveCheckpoint and LoadCheckpoint in a
 * data-parallel group (docs/DISTRIBUTED.md, Checkpoints). Every rank takes
 * part in every call, and every collective below is reached by every rank
 * whatever failed locally (a failure travels as a code in the next
 * exchange), so no rank waits for a peer that gave up.
 *
 * Save: rank 0 begins the checkpoint (engines/checkpoint's temporary
 * directory) and sends its name. A rank that sees that directory under its
 * own checkpoint root (one shared filesystem) writes its optimizer shard
 * there itself, in parallel with the others; rank 0 writes the shards of
 * the ranks that do not (their moments sent to it, one slice at a time),
 * config.json and model.safetensors, then records every file (checking
 * that each shard is there, with its size), writes engine_state.json and
 * commits. Its verdict goes to every rank.
 *
 * Load: rank 0 opens and verifies the whole checkpoint and sends its
 * verdict, the steps and RNG and the state's checksum. A rank that sees
 * the same checkpoint (the same sealed engine_state.json) verifies and
 * reads the files that hold its slice of the moments, from whatever world
 * size saved them; rank 0 reads the slices of the ranks that cannot and
 * sends them. Only once every rank holds its slice (an exchange of codes)
 * does anything change: the moments, then rank 0's parameters broadcast,
 * steps, RNG. */
#include "native_engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../checkpoint/checkpoint.h"
#include "io/safetensors.h"

enum { TEMP_NAME_MAX = 256 };

struct save_begin {            /* rank 0 -> every rank */
	int64_t rc;
	char temp[TEMP_NAME_MAX];  /* the temporary directory's name */
};

struct rank_report {           /* every rank -> every rank */
	int64_t rc;                /* 0, or this rank's failure */
	int64_t self;              /* 1: it writes (reads) its shard itself */
	uint64_t bytes, xxh;       /* its shard file */
};

struct load_header {           /* rank 0 -> every rank */
	int64_t rc, contents, global_step, optim_step, sched_step;
	uint64_t rng[4];
	uint64_t state_xxh;        /* engine_state.json's seal */
};

static int64_t slice_of(const struct native *n, int r)
{
	return (int64_t)r * n->group.shard_len;
}

/* --- ZeRO-3's parameters ----------------------------------------------- */

/* Rank 0's next tensor index to every rank (-1: no more). */
static int announce(struct native *n, int64_t *i, struct eng_error *err)
{
	return native_dist_bcast_words(n, i, sizeof(*i), err);
}

int native_group_fetch_tensor(void *ctx, float *dst, uint64_t numel, struct eng_error *err)
{
	struct native_fetch *f = ctx;
	struct native *n = f->n;
	int64_t i = f->i;
	const float *d;
	int rc = announce(n, &i, err);

	if (rc == 0)
		rc = native_shard_tensor(n, f->i, &d, err);
	if (rc == 0 && (rc = n->dev->ops->copy_d2h(n->dev, dst, d, numel * sizeof(float))) == 0)
		rc = n->dev->ops->sync(n->dev);
	return rc < 0 && !err->code ? eng_fail(err, rc, "%s: copy from device failed",
					       n->table.entries[f->i].name) : rc;
}

/* The other side of a ZeRO-3 model file: every rank but 0 gathers the
 * tensors rank 0 names until it says there are no more; rank 0 says so
 * (done), whether its file was written or not. */
static int serve_fetches(struct native *n, struct eng_error *err)
{
	const float *d;
	int64_t i;
	int rc;

	if (n->group.dist->rank == 0) {
		i = -1;
		return announce(n, &i, err);
	}
	for (;;) {
		rc = announce(n, &i, err);
		if (rc || i < 0)
			return rc;
		if (i >= n->table.count)
			return eng_fail(err, -EIO, "SaveCheckpoint: rank 0 named tensor %lld of %lld",
					(long long)i, (long long)n->table.count);
		rc = native_shard_tensor(n, i, &d, err);
		if (rc)
			return rc;
	}
}

/* ZeRO-3's load of the parameters: rank 0 reads each tensor whole and
 * broadcasts it (after its read's code, so a failure stops every rank at
 * the same tensor); every rank keeps its slice's part, staged, and
 * replaces its slice only once every tensor came. */
static int load_sliced_params(struct native *n, struct native_load *L, struct eng_error *err)
{
	float *slice = calloc((size_t)n->group.shard_len, sizeof(float)), *buf = NULL;
	int me = n->group.dist->rank, rc = 0;

	for (int64_t i = 0; i < n->table.count && rc == 0; i++) {
		const struct param_entry *p = &n->table.entries[i];
		float *nb = realloc(buf, (size_t)p->numel * sizeof(float));
		int64_t code = 0, a, b;

		if (!nb || !slice) {
			/* no buffer to take part with: the peers time out */
			n->group.dist->broken = true;
			rc = eng_fail(err, -ENOMEM, "LoadCheckpoint: out of host memory for %s; "
				      "the group is broken", p->name);
			break;
		}
		buf = nb;
		if (me == 0) {
			code = st_reader_read_f32(L->model, p->name, buf, p->numel, err);
			L->pr.base += p->numel * (int64_t)sizeof(float);
			if (code == 0)
				native_ckpt_file_progress(&L->pr, 0);
		}
		rc = native_dist_bcast_words(n, &code, sizeof(code), err);
		if (rc == 0 && code)
			rc = me == 0 ? (int)code
				     : eng_fail(err, native_dist_peer_code(code), "LoadCheckpoint: "
						"rank 0 could not read %s (%s); the group is "
						"inconsistent: load again", p->name,
						eng_strerror(native_dist_peer_code(code)));
		if (rc == 0)
			rc = native_dist_bcast_host(n, buf, (size_t)p->numel * sizeof(float), 0, err);
		native_shard_held(n, i, &a, &b);
		if (rc == 0 && a < b)
			memcpy(slice + (a - n->group.shard_off), buf + (a - p->offset),
			       (size_t)(b - a) * sizeof(float));
	}
	if (rc == 0)
		rc = native_family_write(n, FAM_PARAMS, slice, err);
	native_shard_invalidate(n);
	free(buf);
	free(slice);
	return rc;
}

/* --- save ---------------------------------------------------------------- */

struct group_save {
	struct engine *e;
	struct native *n;
	struct ckpt_writer *w;         /* rank 0 */
	int tfd;                       /* another rank's handle on rank 0's directory */
	const float *mv[2];            /* this rank's moments (host views) */
	float *owned[2];
	struct rank_report *all;       /* [world] */
	struct native_ckpt_progress pr;
};

/* Rank 0 writes shard r from the slices r sends (a broadcast from r;
 * the other ranks receive into their scratch and drop it). *rc0: rank
 * 0's own code, which a failure to write sets (and a set one skips the
 * write; the broadcasts happen either way). */
static int relay_shard(struct group_save *s, int r, float *buf, int64_t *rc0,
		       struct eng_error *err)
{
	struct native *n = s->n;
	size_t bytes = (size_t)n->group.shard_len * sizeof(float);
	int me = n->group.dist->rank, rc = 0;
	uint64_t fbytes, xxh;
	char name[64];

	for (int k = 0; k < 2 && rc == 0; k++) {
		if (me == r && s->mv[k])
			memcpy(buf + (size_t)k * n->group.shard_len, s->mv[k], bytes);
		rc = native_dist_bcast_host(n, buf + (size_t)k * n->group.shard_len, bytes, r, err);
	}
	if (rc || me != 0 || *rc0)
		return rc;
	native_shard_name(name, sizeof(name), r, n->group.dist->world_size);
	s->pr.file = name;
	*rc0 = native_shard_write(n, ckpt_writer_dirfd(s->w), ckpt_writer_path(s->w, name), r,
				  n->group.dist->world_size, buf, buf + n->group.shard_len,
				  native_ckpt_file_progress, &s->pr, &fbytes, &xxh, err);
	s->pr.base += 2 * (int64_t)bytes;
	if (*rc0 == 0)
		*rc0 = ckpt_writer_record(s->w, name, fbytes, xxh, err);
	return 0;
}

/* This rank's own shard, into rank 0's directory (rank 0's writer, or the
 * joined descriptor). */
static int write_own_shard(struct group_save *s, struct rank_report *mine,
			   struct eng_error *err)
{
	struct native *n = s->n;
	int me = n->group.dist->rank;
	char name[64];
	int rc;

	native_shard_name(name, sizeof(name), me, n->group.dist->world_size);
	s->pr.file = name;
	rc = native_shard_write(n, me == 0 ? ckpt_writer_dirfd(s->w) : s->tfd,
				me == 0 ? ckpt_writer_path(s->w, name) : name, me,
				n->group.dist->world_size, s->mv[0], s->mv[1], native_ckpt_file_progress,
				&s->pr, &mine->bytes, &mine->xxh, err);
	s->pr.base += 2 * n->group.shard_len * (int64_t)sizeof(float);
	if (rc == 0 && me == 0)
		rc = ckpt_writer_record(s->w, name, mine->bytes, mine->xxh, err);
	return rc;
}

/* Rank 0: record the shards the others wrote and commit, or abort. */
static int save_commit(struct group_save *s, int64_t global_step, int max_to_keep,
		       unsigned contents, uint64_t *total, struct eng_error *err)
{
	struct native *n = s->n;
	int W = n->group.dist->world_size, rc = (int)s->all[0].rc;
	char name[64];

	for (int r = 1; r < W && rc == 0; r++)
		if (s->all[r].rc)
			rc = eng_fail(err, native_dist_peer_code(s->all[r].rc), "SaveCheckpoint: "
				      "rank %d failed (%s; its reply says why); nothing was saved",
				      r, eng_strerror(native_dist_peer_code(s->all[r].rc)));
	for (int r = 1; r < W && rc == 0 && (contents & CKPT_OPTIMIZER); r++) {
		struct eng_error lerr = {0};

		if (!s->all[r].self)
			continue;
		native_shard_name(name, sizeof(name), r, W);
		if (ckpt_writer_record(s->w, name, s->all[r].bytes, s->all[r].xxh, &lerr))
			rc = eng_fail(err, -EALREADY, "SaveCheckpoint: rank %d wrote %s, but rank 0 "
				      "does not see it (%s): the ranks' checkpoint roots are not "
				      "one shared filesystem; nothing was saved", r, name, lerr.msg);
	}
	if (rc == 0)
		rc = native_ckpt_cancelled(s->e, "the files", err);
	if (rc) {
		ckpt_writer_abort(s->w);
		s->w = NULL;
		return rc;
	}
	rc = native_ckpt_commit(s->e, n, s->w, global_step, max_to_keep, contents, &s->pr, total,
				err);
	s->w = NULL;
	return rc;
}

/* Rank 0 begins; every rank learns the temporary directory, or that
 * there is none (rank 0's code). */
static int save_begin(struct group_save *s, const char *dir, struct save_begin *b,
		      struct eng_error *err)
{
	struct native *n = s->n;
	int rc = 0;

	memset(b, 0, sizeof(*b));
	if (n->group.dist->rank == 0) {
		rc = dir ? ckpt_writer_begin(dir, &s->w, err)
			 : eng_fail(err, -EINVAL, "path: empty checkpoint path");
		if (rc == 0 && (size_t)snprintf(b->temp, sizeof(b->temp), "%s",
						ckpt_writer_temp_name(s->w)) >= sizeof(b->temp))
			rc = eng_fail(err, -EINVAL, "path: the checkpoint's name is too long "
				      "for a group (%d bytes at most)", TEMP_NAME_MAX - 16);
		b->rc = rc;
	}
	rc = native_dist_bcast_words(n, b, sizeof(*b), err);
	if (rc == 0 && b->rc && n->group.dist->rank != 0)
		rc = eng_fail(err, native_dist_peer_code(b->rc), "SaveCheckpoint: rank 0 could not "
			      "begin the checkpoint (%s; its reply says why)",
			      eng_strerror(native_dist_peer_code(b->rc)));
	return rc ? rc : (int)b->rc;
}

int native_group_save(struct engine *e, struct native *n, const char *dir,
		      int64_t global_step, int max_to_keep, unsigned contents,
		      size_t *ret_bytes, struct eng_error *err)
{
	int W = n->group.dist->world_size, me = n->group.dist->rank, nrelay = 0;
	bool opt = contents & CKPT_OPTIMIZER;
	struct group_save s = { .e = e, .n = n, .tfd = -1 };
	struct rank_report mine = {0}, verdict = {0};
	struct save_begin b;
	uint64_t total = 0;
	float *buf = NULL;
	int rc;

	s.all = calloc((size_t)W, sizeof(*s.all));
	if (!s.all)
		return eng_fail(err, -ENOMEM, "SaveCheckpoint: out of memory");
	/* Exchange 1: rank 0's temporary directory. */
	rc = save_begin(&s, dir, &b, err);
	if (rc)
		goto out;
	/* This rank's moments, and whether it reaches rank 0's directory. */
	if (opt)
		mine.rc = native_require_placed(n, false, true, err);
	for (int k = 0; k < 2 && opt && mine.rc == 0; k++)
		mine.rc = native_family_read(n, k ? FAM_EXP_AVG_SQ : FAM_EXP_AVG, &s.mv[k],
					     &s.owned[k], err);
	if (opt && me != 0 && dir && ckpt_join_temp(dir, b.temp, &s.tfd, NULL) == 0)
		mine.self = 1;
	/* Exchange 2: who writes its own shard. */
	rc = native_dist_gather_host(n, s.all, &mine, sizeof(mine), err);
	if (rc)
		goto out;
	for (int r = 1; r < W && opt; r++)
		nrelay += !s.all[r].self;
	s.pr = (struct native_ckpt_progress){
		e, "model.safetensors", 0,
		(me == 0 && (contents & CKPT_MODEL) ? n->table.total * (int64_t)sizeof(float) : 0) +
		(opt ? (me == 0 ? 1 + nrelay : mine.self) * 2 * n->group.shard_len *
		 (int64_t)sizeof(float) : 0),
	};
	/* Rank 0 writes the shards of the ranks that cannot, their slices
	 * sent one rank at a time (a broadcast each: every rank takes part). */
	if (nrelay && !(buf = malloc(2 * (size_t)n->group.shard_len * sizeof(float)))) {
		/* No buffer to take part with: the peers time out in the
		 * exchange this rank cannot join, and the group is broken. */
		n->group.dist->broken = true;
		rc = eng_fail(err, -ENOMEM, "SaveCheckpoint: out of host memory for a "
			      "%lld-float slice; the group is broken", (long long)n->group.shard_len);
		goto out;
	}
	for (int r = 1; r < W && opt && rc == 0; r++)
		if (!s.all[r].self)
			rc = relay_shard(&s, r, buf, &mine.rc, err);
	if (rc)
		goto out;
	/* Every writer's own files, in parallel. */
	if (opt && mine.rc == 0 && (me == 0 || mine.self))
		mine.rc = write_own_shard(&s, &mine, err);
	if (me == 0 && mine.rc == 0 && (contents & CKPT_MODEL)) {
		mine.rc = native_ckpt_write_model(n, s.w, &s.pr, err);
		if (mine.rc == 0)
			mine.rc = native_ckpt_cancelled(e, "model.safetensors", err);
	}
	/* ZeRO-3: the model file's tensors were gathered from every rank (a
	 * gather failing broke the group: the exchange below says so) */
	if ((contents & CKPT_MODEL) && native_shard_params(n)) {
		struct eng_error served = {0};

		if (serve_fetches(n, me == 0 ? &served : err) && me != 0)
			mine.rc = mine.rc ? mine.rc : err->code;
	}
	/* Exchange 3: every rank's outcome and shard; rank 0 commits. */
	rc = native_dist_gather_host(n, s.all, &mine, sizeof(mine), err);
	if (rc)
		goto out;
	if (me == 0)
		verdict.rc = save_commit(&s, global_step, max_to_keep, contents, &total, err);
	/* Exchange 4: rank 0's verdict. */
	rc = native_dist_bcast_words(n, &verdict, sizeof(verdict), err);
	if (rc == 0 && me != 0)
		rc = (int)mine.rc;
	if (rc == 0 && verdict.rc)
		rc = eng_fail(err, native_dist_peer_code(verdict.rc), "SaveCheckpoint: rank 0 did "
			      "not commit the checkpoint (%s; its reply says why); nothing was saved",
			      eng_strerror(native_dist_peer_code(verdict.rc)));
	if (rc == 0 && ret_bytes)
		*ret_bytes = me == 0 ? (size_t)total : mine.self ? (size_t)mine.bytes : 0;
out:
	if (s.w)
		ckpt_writer_abort(s.w);
	if (s.tfd >= 0)
		close(s.tfd);
	for (int k = 0; k < 2; k++)
		n->dev->ops->host_free(n->dev, s.owned[k]);
	free(buf);
	free(s.all);
	return rc;
}

/* --- load ---------------------------------------------------------------- */

struct slice_filter {
	const struct native *n;
	int64_t first, count;
};

static bool slice_file(void *ctx, json_t *state, const char *name)
{
	struct slice_filter *f = ctx;

	return native_optim_file_needed(f->n, state, name, f->first, f->count);
}

/* Another rank reads its slice itself when it sees the checkpoint rank 0
 * verified (the same seal): 0 and the slice in m, v; otherwise it asks
 * rank 0 (any failure here only means that). */
static int read_own_slice(struct engine *e, struct native *n, const char *dir,
			  const struct load_header *h, float *m, float *v)
{
	struct slice_filter sf = { n, n->group.shard_off, n->group.shard_len };
	const struct native_load_filter filter = { slice_file, &sf };
	struct eng_error lerr = {0};
	struct native_load L;
	uint64_t xxh = 0;
	int rc;

	rc = native_load_open(e, n, dir, CKPT_OPTIMIZER, &filter, n->group.shard_off, n->group.shard_len,
			      false, &L, &lerr);
	if (rc == 0 && (!ckpt_hex64(json_string_value(json_object_get(L.state, "state_xxh64")),
				    &xxh) || xxh != h->state_xxh))
		rc = -ESTALE;
	if (rc == 0)
		rc = native_load_moment(n, &L, 0, n->group.shard_off, n->group.shard_len, m, &lerr);
	if (rc == 0)
		rc = native_load_moment(n, &L, 1, n->group.shard_off, n->group.shard_len, v, &lerr);
	native_load_close(&L);
	return rc;
}

/* Rank 0 reads slice r for it and sends it (a broadcast from rank 0 of
 * each moment; rank r receives into m, v, the others into scratch). */
static int send_slice(struct native *n, struct native_load *L, int r, int64_t *rc0,
		      float *m, float *v, float *scratch, struct eng_error *err)
{
	size_t bytes = (size_t)n->group.shard_len * sizeof(float);
	int me = n->group.dist->rank, rc = 0;

	for (int k = 0; k < 2 && rc == 0; k++) {
		float *dst = me == r ? (k ? v : m) : scratch;

		if (me == 0 && *rc0 == 0)
			*rc0 = native_load_moment(n, L, k, slice_of(n, r), n->group.shard_len, dst, err);
		rc = native_dist_bcast_host(n, dst, bytes, 0, err);
	}
	return rc;
}

/* Rank 0's header: its verdict on the checkpoint and what every rank
 * applies. */
static void fill_header(const struct native_load *L, unsigned contents, int rc,
			struct load_header *h)
{
	memset(h, 0, sizeof(*h));
	h->rc = rc;
	if (rc)
		return;
	h->contents = contents;
	h->global_step = L->saved.global_step;
	h->optim_step = L->saved.optim_step;
	h->sched_step = L->saved.sched_step;
	memcpy(h->rng, L->saved.rng, sizeof(h->rng));
	(void)ckpt_hex64(json_string_value(json_object_get(L->state, "state_xxh64")),
			 &h->state_xxh);
}

/* Every rank's slice of the moments into m, v (this rank's, staged):
 * read here, or sent by rank 0; all[]: every rank's code after. A rank
 * with a local failure (local_rc) takes part with its code and reads
 * nothing. */
static int gather_slices(struct engine *e, struct native *n, const char *dir,
			 struct native_load *L, const struct load_header *h, int local_rc,
			 float *m, float *v, struct rank_report *all, struct eng_error *err)
{
	int W = n->group.dist->world_size, me = n->group.dist->rank, rc;
	struct rank_report mine = { .rc = local_rc };
	float *scratch = NULL;
	bool relay = false;

	if (local_rc == 0 && me == 0) {
		mine.rc = native_load_moment(n, L, 0, n->group.shard_off, n->group.shard_len, m, err);
		if (mine.rc == 0)
			mine.rc = native_load_moment(n, L, 1, n->group.shard_off, n->group.shard_len, v, err);
	} else if (local_rc == 0) {
		mine.self = dir && read_own_slice(e, n, dir, h, m, v) == 0;
	}
	rc = native_dist_gather_host(n, all, &mine, sizeof(mine), err);
	for (int r = 1; r < W && rc == 0; r++)
		relay |= !all[r].self;
	if (relay && !(scratch = malloc((size_t)n->group.shard_len * sizeof(float))))
		rc = eng_fail(err, -ENOMEM, "LoadCheckpoint: out of host memory");
	for (int r = 1; r < W && rc == 0; r++)
		if (!all[r].self)
			rc = send_slice(n, L, r, &mine.rc, m, v, scratch, err);
	free(scratch);
	if (rc)
		return rc;
	/* The agreement: every rank's code. */
	return native_dist_gather_host(n, all, &mine, sizeof(mine), err);
}

int native_group_load(struct engine *e, struct native *n, const char *dir, unsigned contents,
		      int64_t *ret_global_step, struct eng_error *err)
{
	int W = n->group.dist->world_size, me = n->group.dist->rank, rc = 0;
	struct native_load L = { .ckfd = -1 };
	struct native_saved_state saved;
	struct rank_report *all = NULL;
	struct load_header h;
	int64_t model_rc = 0;
	float *mv = NULL;

	/* Exchange 1: rank 0 opens and verifies everything. */
	if (me == 0) {
		rc = dir ? native_load_open(e, n, dir, contents, NULL, 0, n->table.total, true, &L,
					    err)
			 : eng_fail(err, -EINVAL, "path: empty checkpoint path");
		if (rc == 0 && (contents & CKPT_OPTIMIZER))
			rc = native_require_placed(n, false, true, err);
	}
	fill_header(&L, contents, rc, &h);
	rc = native_dist_bcast_words(n, &h, sizeof(h), err);
	if (rc == 0 && h.rc)
		rc = me == 0 ? (int)h.rc
			     : eng_fail(err, native_dist_peer_code(h.rc), "LoadCheckpoint: rank 0 "
					"refused the checkpoint (%s; its reply says why); nothing "
					"changed",
					eng_strerror(native_dist_peer_code(h.rc)));
	if (rc)
		goto out;
	contents = (unsigned)h.contents;
	/* Exchanges 2-3: every rank's slice of the moments, staged. */
	if (contents & CKPT_OPTIMIZER) {
		all = calloc((size_t)W, sizeof(*all));
		mv = malloc(2 * (size_t)n->group.shard_len * sizeof(float));
		if (!all || !mv) {
			/* No buffer to take part with: the peers time out in the
			 * exchange this rank cannot join, and the group is broken. */
			n->group.dist->broken = true;
			rc = eng_fail(err, -ENOMEM, "LoadCheckpoint: out of host memory for the "
				      "optimizer slice; the group is broken");
			goto out;
		}
		rc = gather_slices(e, n, dir, &L, &h, native_require_placed(n, false, true, err),
				   mv, mv + n->group.shard_len, all, err);
		for (int r = 0; r < W && rc == 0; r++)
			if (all[r].rc)
				rc = r == me ? (int)all[r].rc
					     : eng_fail(err, native_dist_peer_code(all[r].rc),
							"LoadCheckpoint: rank %d could not load its "
							"optimizer slice (%s); nothing changed", r,
							eng_strerror(native_dist_peer_code(all[r].rc)));
		if (rc)
			goto out;
		rc = native_family_write(n, FAM_EXP_AVG, mv, err);
		if (rc == 0)
			rc = native_family_write(n, FAM_EXP_AVG_SQ, mv + n->group.shard_len, err);
		if (rc)
			goto out;
	}
	/* Exchange 4: rank 0's parameters. */
	if ((contents & CKPT_MODEL) && native_shard_params(n)) {
		rc = load_sliced_params(n, &L, err);
		if (rc)
			goto out;
	} else if (contents & CKPT_MODEL) {
		if (me == 0)
			model_rc = native_load_model(n, &L, err);
		rc = native_dist_bcast_words(n, &model_rc, sizeof(model_rc), err);
		if (rc == 0 && model_rc)
			rc = me == 0 ? (int)model_rc
				     : eng_fail(err, native_dist_peer_code(model_rc),
						"LoadCheckpoint: rank 0 could not read the parameters "
						"(%s); the group is inconsistent: load again",
						eng_strerror(native_dist_peer_code(model_rc)));
		if (rc == 0)
			rc = native_dist_sync_params(n, err);
		if (rc)
			goto out;
	}
	saved = (struct native_saved_state){ h.global_step, h.optim_step, h.sched_step,
					     {h.rng[0], h.rng[1], h.rng[2], h.rng[3]}, contents };
	rc = native_load_apply(e, n, contents, &saved, err);
	if (rc == 0 && ret_global_step)
		*ret_global_step = h.global_step;
out:
	native_load_close(&L);
	free(all);
	free(mv);
	return rc;
}
