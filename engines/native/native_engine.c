/* native_engine.c — engine_ops of the native engine: initialization (random
 * or from a Hugging Face directory), forward/backward over planned
 * micro-batches, AdamW with global-norm clipping, LR schedule, placement,
 * parameter views and status. Checkpoints are in native_ckpt.c.
 *
 * Random init (seeded, documented in README): every matrix and embedding
 * ~ N(0, initializer_range^2), RMSNorm weights 1, biases 0 (transformers'
 * _init_weights); see random_init for how the draws are made.
 */
#include "native_engine.h"

#include <omp.h>

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../batch/planner.h"
#include "../checked.h"
#include "../io/fileio.h"
#include "../io/safetensors.h"
#include "../optim/schedule.h"

static struct native *N(struct engine *e)
{
	return engine_impl(e);
}

double native_current_lr(const struct native *n)
{
	return n->optim.lr * lr_schedule_factor(&n->sched, n->sched_step);
}

/* --- memory ------------------------------------------------------------ */

static void *dalloc(struct native *n, size_t bytes)
{
	return n->dev->ops->alloc(n->dev, bytes ? bytes : 1);
}

static void dfree(struct native *n, void *p)
{
	n->dev->ops->free(n->dev, p);
}

void native_io_release(struct native *n)
{
	struct native_io *io = &n->io;

	dfree(n, io->ids);
	dfree(n, io->pos);
	dfree(n, io->targets);
	dfree(n, io->cu_seqlens);
	dfree(n, io->rows);
	dfree(n, io->drows);
	memset(io, 0, sizeof(*io));
}

/* Make the micro-batch scratch hold T tokens and B sequences. */
static int io_reserve(struct native *n, int64_t T, int64_t B, struct eng_error *err)
{
	struct native_io io = {0};

	if (T <= n->io.cap_tokens && B <= n->io.cap_seqs)
		return 0;
	if (T < n->io.cap_tokens)
		T = n->io.cap_tokens;
	if (B < n->io.cap_seqs)
		B = n->io.cap_seqs;
	io.cap_tokens = T;
	io.cap_seqs = B;
	io.ids = dalloc(n, T * sizeof(int32_t));
	io.pos = dalloc(n, T * sizeof(int32_t));
	io.targets = dalloc(n, T * sizeof(int32_t));
	io.cu_seqlens = dalloc(n, (B + 1) * sizeof(int32_t));
	io.rows = dalloc(n, 3 * T * sizeof(float));
	io.drows = dalloc(n, 3 * T * sizeof(float));
	if (!io.ids || !io.pos || !io.targets || !io.cu_seqlens || !io.rows || !io.drows) {
		struct native_io old = n->io;

		n->io = io;
		native_io_release(n);
		n->io = old;
		return eng_fail(err, -ENOMEM, "micro-batch buffers: out of memory for %lld tokens",
				(long long)T);
	}
	native_io_release(n);
	n->io = io;
	return 0;
}

static void native_destroy(struct engine *e)
{
	struct native *n = N(e);

	if (!n)
		return;
	if (n->model_fd >= 0)
		close(n->model_fd);
	native_dist_leave(n);
	if (n->dev) {
		llama_release(&n->model);
		native_io_release(n);
		native_families_free(n);
		n->dev->ops->close(n->dev);
	}
	free(n->stage);
	free(n->wl);
	free(n->gl);
	param_table_free(&n->table);
	free(n);
	engine_set_impl(e, NULL);
}

/* --- initialization ---------------------------------------------------- */

/* model_path's config.json (under 64 MiB), read beneath the directory's
 * descriptor: never through a symlink. */
static char *read_model_config(int dfd, const char *dir, struct eng_error *err, int *rc)
{
	char *buf = NULL;
	int r = io_read_file_at(dfd, "config.json", (64u << 20) - 1, &buf, NULL);

	*rc = 0;
	if (r == -EFBIG)
		*rc = eng_fail(err, -EINVAL, "model_path: %s/config.json is larger than 64 MiB",
			       dir);
	else if (r == -EISDIR)
		*rc = eng_fail(err, -EINVAL, "model_path: %s/config.json is a directory", dir);
	else if (r < 0)
		*rc = eng_fail(err, eng_errno_code(-r),
			       "model_path: cannot read %s/config.json: %s", dir,
			       eng_errno_text(-r));
	return r < 0 ? NULL : buf;
}

/* Random init in fixed chunks of RANDOM_INIT_CHUNK elements. Chunk j of
 * parameter i draws from its own generator seeded with
 * seed ^ (i << 40) ^ j (expanded by splitmix64 in rng_seed), so the values
 * depend only on the seed, not on the thread count, and the chunks of a
 * tensor are filled in parallel. */
#define RANDOM_INIT_CHUNK (1 << 20)

/* Draw parameter i into host (see above). */
static void random_init_tensor(struct native *n, float *host, int64_t i)
{
	const struct param_entry *p = &n->table.entries[i];
	int64_t nchunks = (p->numel + RANDOM_INIT_CHUNK - 1) / RANDOM_INIT_CHUNK;
	float std = (float)n->cfg.initializer_range;

#pragma omp parallel for schedule(dynamic, 1) if (nchunks > 1)
	for (int64_t j = 0; j < nchunks; j++) {
		int64_t start = j * RANDOM_INIT_CHUNK;
		int64_t len = p->numel - start < RANDOM_INIT_CHUNK ? p->numel - start
								    : RANDOM_INIT_CHUNK;
		float *x = host + p->offset + start;
		struct rng r;

		if (p->init_ones) {
			for (int64_t q = 0; q < len; q++)
				x[q] = 1.0f;
		} else if (p->init_zero) {
			memset(x, 0, len * sizeof(float));
		} else {
			rng_seed(&r, n->seed ^ ((uint64_t)i << 40) ^ (uint64_t)j);
			rng_normal_fill(&r, x, len, 0.0f, std);
		}
	}
}

/* The caller's progress hook: tensor i of the table is next. */
static void init_progress(const struct native *n, const struct engine_init_config *cfg,
			  const char *phase, int64_t i)
{
	if (cfg->progress)
		cfg->progress(cfg->progress_ctx, phase, i, n->table.count, "tensors");
}

/* -ECANCELED when the caller's cancel hook says so (before tensor i). */
static int init_cancelled(const struct native *n, const struct engine_init_config *cfg,
			  int64_t i, struct eng_error *err)
{
	if (!cfg->cancelled || !cfg->cancelled(cfg->cancel_ctx))
		return 0;
	return eng_fail(err, -ECANCELED,
			"Initialize: cancelled (the client went away or its deadline passed) "
			"after %lld of %lld tensors", (long long)i, (long long)n->table.count);
}

/* Refuse at once a model whose state cannot fit in the device's free
 * memory: fp32 weights, gradients and the two AdamW moments (16 bytes a
 * parameter; 18 with the bf16 copy of bf16 matmuls). Activations come on
 * top and are reserved per call. */
static int check_fits(const struct native *n, const struct engine_init_config *cfg,
		      struct eng_error *err)
{
	/* Weights, gradients (and bf16 copy) of every parameter; in a group,
	 * the moments of this rank's slice only (ZeRO-1). */
	size_t per = cfg->bf16_matmul ? 10 : 8, need, moments, avail;

	if (!ck_mul_size((size_t)n->padded_total, per, &need) ||
	    !ck_mul_size((size_t)n->shard_len, 8, &moments) || need > SIZE_MAX - moments)
		need = SIZE_MAX;
	else
		need += moments;
	avail = n->dev->ops->mem_free ? n->dev->ops->mem_free(n->dev) : SIZE_MAX;
	if (need <= avail)
		return 0;
	return eng_fail(err, -ENOMEM,
			"model: %lld parameters need about %.1f GiB (fp32 weights, gradients and "
			"AdamW moments%s); the %s device has %.1f GiB free",
			(long long)n->table.total, (double)need / (1 << 30),
			cfg->bf16_matmul ? ", bf16 copy" : "", cfg->device,
			(double)avail / (1 << 30));
}

/* Load every tensor of the table from a HF directory (descriptor dfd)
 * into host[total]. Tied models have no lm_head.weight; a value model may
 * lack score.* (a critic initialized from an actor): those keep their
 * random init. Polls the cancel hook of cfg between tensors. */
static int load_hf_weights(struct native *n, const struct engine_init_config *cfg, int dfd,
			   float *host, struct eng_error *err)
{
	const char *dir = cfg->model_path;
	struct st_reader *r;
	int rc;

	rc = st_reader_open_at(dfd, ".", dir, &r, err);
	if (rc)
		return rc;
	st_reader_set_threads(r, n->io_threads);
	for (int64_t i = 0; i < n->table.count && !rc; i++) {
		const struct param_entry *p = &n->table.entries[i];
		const struct st_tensor_info *t = st_reader_find(r, p->name);

		init_progress(n, cfg, "load weights", i);
		rc = init_cancelled(n, cfg, i, err);
		if (rc)
			break;
		if (!t) {
			if (n->value_model && !strncmp(p->name, "score.", 6)) {
				random_init_tensor(n, host, i);
				continue;
			}
			rc = eng_fail(err, -EINVAL, "model_path: tensor %s missing from %s",
				      p->name, dir);
			break;
		}
		if (t->ndim != p->ndim || t->shape[0] != p->shape[0] ||
		    (p->ndim > 1 && t->shape[1] != p->shape[1])) {
			rc = eng_fail(err, -EINVAL,
				      "model_path: tensor %s has shape [%lld, %lld], config says [%lld, %lld]",
				      p->name, (long long)t->shape[0],
				      (long long)(t->ndim > 1 ? t->shape[1] : 0),
				      (long long)p->shape[0], (long long)(p->ndim > 1 ? p->shape[1] : 0));
			break;
		}
		rc = st_reader_read_f32(r, p->name, host + p->offset, p->numel, err);
	}
	if (rc == 0)
		init_progress(n, cfg, "load weights", n->table.count);
	st_reader_close(r);
	return rc;
}

static int native_initialize(struct engine *e, const struct engine_init_config *cfg,
			     struct eng_error *err)
{
	const struct engine_ops *ops_self;
	const struct device_ops *dops;
	struct native *n;
	char *json = NULL;
	float *host = NULL;
	size_t bytes;
	int rc;

	rc = engine_registry_lookup(cfg->model_type, cfg->backend, cfg->device, &ops_self, err);
	if (rc)
		return rc;
	/* engine_create applied engine_init_config_check. */
	dops = device_find(cfg->device);
	if (!dops)
		return eng_fail(err, -ENODEV, "device: %s is not built into this binary (built: %s)",
				cfg->device, device_names());

	n = calloc(1, sizeof(*n));
	if (!n)
		return eng_fail(err, -ENOMEM, "engine: out of memory");
	n->model_fd = -1;
	engine_set_impl(e, n);
	snprintf(n->key, sizeof(n->key), "%s/%s/%s", cfg->model_type, cfg->backend, cfg->device);
	n->value_model = !strcmp(cfg->model_type, "value_model");
	n->optim = cfg->optim;
	n->sched = cfg->sched;
	n->seed = cfg->seed;
	rng_seed(&n->rng, cfg->seed);
	n->default_budget = cfg->max_tokens_per_micro_batch;

	if (cfg->model_path) {
		/* The directory as given (the daemon's pinned one); its files
		 * are opened beneath this descriptor. */
		n->model_fd = open(cfg->model_path, O_PATH | O_DIRECTORY | O_CLOEXEC);
		if (n->model_fd < 0)
			return eng_fail(err, errno == ENOTDIR ? -EINVAL : eng_errno_code(errno),
					"model_path: %s: %s", cfg->model_path, strerror(errno));
		json = read_model_config(n->model_fd, cfg->model_path, err, &rc);
		if (!json)
			return rc;
	}
	rc = model_config_parse(json ? json : cfg->hf_config_json, &n->cfg, err);
	free(json);
	/* The config's head must suit the engine's kind; a checkpoint's
	 * config.json then names the engine's class. */
	if (rc == 0)
		rc = model_config_set_head(&n->cfg, n->value_model, err);
	if (rc)
		return rc;
	rc = param_table_build(&n->cfg, n->value_model, &n->table, err);
	if (rc)
		return rc;

	rc = dops->open(&n->dev, cfg->threads, cfg->bf16_matmul ? MATMUL_BF16 : MATMUL_FP32);
	if (rc) {
		n->dev = NULL;
		return eng_fail(err, rc, "device %s: open failed (%s%s)", cfg->device,
				eng_strerror(rc),
				rc == -ENODEV ? ": no such device or driver"
				: rc == -ELIBACC ? ": a device library is missing" : "");
	}
	/* After the device's open: the CPU device sets OpenMP's thread count
	 * to its budget. */
	n->io_threads = cfg->threads > 0 ? cfg->threads : omp_get_max_threads();
	bytes = n->table.total * sizeof(float);
	rc = native_dist_shape(n, cfg, err);
	if (rc == 0)
		rc = check_fits(n, cfg, err);
	if (rc == 0)
		rc = native_dist_join(n, cfg, err);
	if (rc)
		return rc;
	n->wl = calloc(n->cfg.num_layers, sizeof(*n->wl));
	n->gl = calloc(n->cfg.num_layers, sizeof(*n->gl));
	if (!n->wl || !n->gl)
		return eng_fail(err, -ENOMEM, "engine: out of memory");
	rc = native_families_alloc(n, err);
	if (rc)
		return rc;

	host = native_family_host_ptr(n, FAM_PARAMS);
	if (!host)
		host = malloc(bytes);
	if (!host)
		return eng_fail(err, -ENOMEM, "parameters: out of host memory");
	if (cfg->model_path) {
		rc = load_hf_weights(n, cfg, n->model_fd, host, err);
		close(n->model_fd);
		n->model_fd = -1;
	} else {
		for (int64_t i = 0; i < n->table.count && !rc; i++) {
			init_progress(n, cfg, "build", i);
			rc = init_cancelled(n, cfg, i, err);
			if (!rc)
				random_init_tensor(n, host, i);
		}
		if (rc == 0)
			init_progress(n, cfg, "build", n->table.count);
	}
	if (rc == 0 && host != native_family_host_ptr(n, FAM_PARAMS))
		rc = native_family_write(n, FAM_PARAMS, host, err);
	if (host != native_family_host_ptr(n, FAM_PARAMS))
		free(host);
	/* Every rank starts from rank 0's parameters. */
	if (rc == 0)
		rc = native_dist_sync_params(n, err);
	if (rc)
		return rc;

	n->model.w.layers = n->wl;
	n->model.g.layers = n->gl;
	rc = llama_init(&n->model, n->dev, &n->cfg, n->value_model, err);
	if (cfg->lm_tile_floats > 0)
		n->model.lm_tile = cfg->lm_tile_floats;
	if (cfg->lm_cache_floats != 0)
		n->model.lm_cache = cfg->lm_cache_floats > 0 ? cfg->lm_cache_floats : 0;
	native_rebind(n);
	if (rc)
		return rc;
	n->place = (struct engine_placement){true, true, true};
	return 0;
}

/* --- forward / backward ------------------------------------------------ */

/* engine_forward_backward applied engine_batch_check; what needs the
 * model is checked here. */
static int validate_batch(struct native *n, const struct engine_batch *b,
			  struct eng_error *err)
{
	for (int k = 0; k < 2; k++) {
		const int32_t *ids = k ? b->target_ids : b->input_ids;

		for (int64_t t = 0; ids && t < b->n; t++)
			if (ids[t] < 0 || ids[t] >= n->cfg.vocab_size)
				return eng_fail(err, -EINVAL,
						"%s[%lld]: token %d outside the vocabulary [0, %lld)",
						k ? "target_ids" : "input_ids", (long long)t, ids[t],
						(long long)n->cfg.vocab_size);
	}
	return 0;
}

/* Host-side description of one micro-batch. */
struct mb_host {
	int64_t T;
	int32_t B;
	int32_t *ids, *pos, *targets, *cu, *seq_lens, *seq_index; /* [T] / [B+1] / [B] */
	int64_t *token_index;                                   /* [T] */
	float *out;                                             /* [3, T] target-aligned outputs */
	float *dout;                                            /* [3, T] loss gradients */
	float *rows;                                            /* [3, T] row-aligned */
};

static void mb_host_free(struct mb_host *h)
{
	free(h->ids);
	free(h->pos);
	free(h->targets);
	free(h->cu);
	free(h->seq_lens);
	free(h->seq_index);
	free(h->token_index);
	free(h->out);
	free(h->dout);
	free(h->rows);
}

static int mb_host_alloc(struct mb_host *h, int64_t T, int64_t B)
{
	memset(h, 0, sizeof(*h));
	h->ids = malloc(T * sizeof(int32_t));
	h->pos = malloc(T * sizeof(int32_t));
	h->targets = malloc(T * sizeof(int32_t));
	h->cu = malloc((B + 1) * sizeof(int32_t));
	h->seq_lens = malloc(B * sizeof(int32_t));
	h->seq_index = malloc(B * sizeof(int32_t));
	h->token_index = malloc(T * sizeof(int64_t));
	h->out = malloc(3 * T * sizeof(float));
	h->dout = malloc(3 * T * sizeof(float));
	h->rows = malloc(3 * T * sizeof(float));
	if (!h->ids || !h->pos || !h->targets || !h->cu || !h->seq_lens || !h->seq_index ||
	    !h->token_index || !h->out || !h->dout || !h->rows) {
		mb_host_free(h);
		return -ENOMEM;
	}
	return 0;
}

/* Gather micro-batch `k` of the plan from the request. */
static void mb_gather(const struct engine_batch *b, const struct mb_plan *p, int32_t k,
		      struct mb_host *h)
{
	int64_t t = 0;

	h->B = p->mb_start[k + 1] - p->mb_start[k];
	h->cu[0] = 0;
	for (int32_t j = 0; j < h->B; j++) {
		int32_t s = p->seq_order[p->mb_start[k] + j];
		int64_t off = p->seq_offset[s];
		int32_t len = b->seq_lens[s];

		h->seq_index[j] = s;
		h->seq_lens[j] = len;
		for (int32_t i = 0; i < len; i++, t++) {
			h->ids[t] = b->input_ids[off + i];
			h->pos[t] = i;
			h->token_index[t] = off + i;
			h->targets[t] = i + 1 >= len ? -1 :
					b->target_ids ? b->target_ids[off + i + 1] :
					b->input_ids[off + i + 1];
		}
		h->cu[j + 1] = (int32_t)t;
	}
	h->T = t;
}

/* rows (row-aligned: row r predicts token r+1) -> target-aligned out:
 * out[t] = rows[t-1] inside a sequence, 0 at each sequence start. */
static void rows_to_targets(const struct mb_host *h, const float *rows, float *out)
{
	for (int32_t j = 0; j < h->B; j++) {
		int64_t s = h->cu[j], e = h->cu[j + 1];

		out[s] = 0.0f;
		for (int64_t t = s + 1; t < e; t++)
			out[t] = rows[t - 1];
	}
}

/* The transpose: rows[r] = d[r+1] inside a sequence, 0 on its last row. */
static void targets_to_rows(const struct mb_host *h, const float *d, float *rows)
{
	for (int32_t j = 0; j < h->B; j++) {
		int64_t s = h->cu[j], e = h->cu[j + 1];

		for (int64_t t = s; t + 1 < e; t++)
			rows[t] = d[t + 1];
		rows[e - 1] = 0.0f;
	}
}

static int upload_mb(struct native *n, const struct mb_host *h)
{
	const struct device_ops *o = n->dev->ops;
	int rc;

	if ((rc = o->copy_h2d(n->dev, n->io.ids, h->ids, h->T * sizeof(int32_t))) ||
	    (rc = o->copy_h2d(n->dev, n->io.pos, h->pos, h->T * sizeof(int32_t))) ||
	    (rc = o->copy_h2d(n->dev, n->io.targets, h->targets, h->T * sizeof(int32_t))))
		return rc;
	return o->copy_h2d(n->dev, n->io.cu_seqlens, h->cu, (h->B + 1) * sizeof(int32_t));
}

/* One micro-batch up to its backward pass: inputs up, forward, outputs
 * into res, the loss and its gradients down to the device (mb_backward
 * then runs the pass). */
static int mb_forward(struct native *n, const struct engine_batch *b,
		      struct engine_fb_result *res, struct mb_host *h,
		      float inv_temp, struct eng_error *err)
{
	const struct device_ops *o = n->dev->ops;
	int64_t T = h->T, cap = n->io.cap_tokens;
	struct llama_batch lb = {
		.T = T, .B = h->B, .ids = n->io.ids, .pos = n->io.pos,
		.cu_seqlens = n->io.cu_seqlens, .targets = n->io.targets,
	};
	float *rows = n->io.rows, *drows = n->io.drows;
	float *out_logp = h->out, *out_ent = h->out + T, *out_val = h->out + 2 * T;
	struct engine_loss_io io;
	int rc;

	rc = upload_mb(n, h);
	if (rc)
		return eng_fail(err, rc, "device: copy of micro-batch inputs failed");
	rc = llama_forward(&n->model, &lb, inv_temp, !b->forward_only, rows, rows + cap,
			   rows + 2 * cap);
	if (rc)
		return eng_fail(err, rc, "forward: device kernel failed (%s)", eng_strerror(rc));
	if (n->value_model) {
		rc = o->copy_d2h(n->dev, h->rows + 2 * T, rows + 2 * cap, T * sizeof(float));
		memset(out_logp, 0, 2 * T * sizeof(float));
		rows_to_targets(h, h->rows + 2 * T, out_val);
	} else {
		if (!(rc = o->copy_d2h(n->dev, h->rows, rows, T * sizeof(float))))
			rc = o->copy_d2h(n->dev, h->rows + T, rows + cap, T * sizeof(float));
		rows_to_targets(h, h->rows, out_logp);
		rows_to_targets(h, h->rows + T, out_ent);
		memset(out_val, 0, T * sizeof(float));
	}
	if (rc)
		return eng_fail(err, rc, "device: copy of outputs failed");

	for (int64_t t = 0; t < T; t++) {
		int64_t dst = h->token_index[t];

		if (res->log_probs)
			res->log_probs[dst] = out_logp[t];
		if (res->entropy)
			res->entropy[dst] = out_ent[t];
		if (res->values && n->value_model)
			res->values[dst] = out_val[t];
	}
	if (!b->loss_fn)
		return 0;

	memset(h->dout, 0, 3 * T * sizeof(float));
	io = (struct engine_loss_io){
		.n = T, .num_seqs = h->B, .seq_lens = h->seq_lens, .seq_index = h->seq_index,
		.token_index = h->token_index, .log_probs = out_logp, .entropy = out_ent,
		.values = n->value_model ? out_val : NULL, .d_log_probs = h->dout,
		.d_entropy = h->dout + T, .d_values = n->value_model ? h->dout + 2 * T : NULL,
		.forward_only = b->forward_only,
	};
	rc = b->loss_fn(b->loss_ctx, &io, err);
	if (rc)
		return rc;
	if (b->forward_only)
		return 0;

	for (int k = 0; k < 3; k++)
		targets_to_rows(h, h->dout + k * T, h->rows + k * T);
	for (int k = 0; k < 3 && !rc; k++)
		rc = o->copy_h2d(n->dev, drows + k * cap, h->rows + k * T, T * sizeof(float));
	if (rc)
		return eng_fail(err, rc, "device: copy of loss gradients failed");
	return 0;
}

/* The backward pass of the micro-batch mb_forward ran last. */
static int mb_backward(struct native *n, const struct mb_host *h, float inv_temp,
		       struct eng_error *err)
{
	int64_t cap = n->io.cap_tokens;
	struct llama_batch lb = {
		.T = h->T, .B = h->B, .ids = n->io.ids, .pos = n->io.pos,
		.cu_seqlens = n->io.cu_seqlens, .targets = n->io.targets,
	};
	float *drows = n->io.drows;
	int rc = llama_backward(&n->model, &lb, inv_temp, drows, drows + cap, drows + 2 * cap);

	return rc ? eng_fail(err, rc, "backward: device kernel failed (%s)", eng_strerror(rc)) : 0;
}

/* A training call that failed or was cancelled after some micro-batches:
 * the gradients back to what they were (zero, or the copy in undo). A
 * failure here is the device's: the error says the gradients are lost. */
static void undo_gradients(struct native *n, const float *undo, struct eng_error *err)
{
	size_t gbytes = (size_t)n->table.total * sizeof(float);
	int rc;

	if (undo)
		rc = n->dev->ops->copy_d2d(n->dev, n->fam[FAM_GRADS].dev, undo, gbytes);
	else if (n->grad_calls == 0)
		rc = n->dev->ops->memset0(n->dev, n->fam[FAM_GRADS].dev, gbytes);
	else
		return;  /* not cancellable, and not a cancellation: as before */
	if (rc) {
		eng_error_clear(err);
		eng_fail(err, rc, "ForwardBackward: failed and its gradients could not be undone");
	}
}

/* The last micro-batch's backward pass of a reducing call, with its
 * gradients reduced across the group in buckets as the pass completes
 * them (native_grad_sync.c). Any failure here breaks the group: the
 * peers agreed to reduce. */
static int reduce_pass(struct native *n, const struct mb_host *h, float inv_temp,
		       struct eng_error *err)
{
	int rc;

	native_sync_begin(n);
	rc = mb_backward(n, h, inv_temp, err);
	if (rc) {
		native_sync_abandon(n);
		return rc;
	}
	return native_sync_finish(n, err);
}

static int native_forward_backward(struct engine *e, const struct engine_batch *b,
				   struct engine_fb_result *res, struct eng_error *err)
{
	struct native *n = N(e);
	int64_t budget = b->max_tokens_per_micro_batch > 0 ? b->max_tokens_per_micro_batch
							   : n->default_budget;
	float temp = b->temperature > 0 ? b->temperature : 1.0f;
	/* A reducing call is a collective: it is not cancelled once it runs,
	 * and every exit before its reduction tells the peers (agree). */
	bool reducing = n->dist && b->reduce_gradients && !b->forward_only;
	bool (*cancelled)(void *) = reducing ? NULL : b->cancelled;
	bool agreed = false, reduced = false;
	struct mb_plan plan = {0};
	struct mb_host h = {0};
	int64_t max_T = 0, max_B = 0;
	float *undo = NULL;
	int32_t k = 0;
	int rc;

	rc = validate_batch(n, b, err);
	if (rc == 0)
		rc = native_require_placed(n, !b->forward_only, false, err);
	if (rc == 0)
		rc = mb_plan_make(b->seq_lens, b->num_seqs, budget, &plan, err);
	for (int32_t i = 0; rc == 0 && i < plan.num_micro_batches; i++) {
		if (plan.mb_tokens[i] > max_T)
			max_T = plan.mb_tokens[i];
		if (plan.mb_start[i + 1] - plan.mb_start[i] > max_B)
			max_B = plan.mb_start[i + 1] - plan.mb_start[i];
	}
	/* Everything the call needs is reserved before any state changes, so
	 * that a failure here leaves gradients untouched. */
	if (rc == 0)
		rc = llama_reserve(&n->model, max_T, !b->forward_only, err);
	if (rc == 0)
		rc = io_reserve(n, max_T, max_B, err);
	if (rc == 0 && mb_host_alloc(&h, max_T, max_B))
		rc = eng_fail(err, -ENOMEM, "micro-batch: out of host memory");
	if (rc == 0 && reducing)
		rc = native_sync_prepare(n, err);
	/* A training call that may stop part-way keeps what undoes it: nothing
	 * when the gradients are zero now (undo = zero them), else a copy. */
	if (rc == 0 && !b->forward_only && (cancelled || reducing) && n->grad_calls > 0 &&
	    plan.num_micro_batches > 1) {
		size_t gbytes = (size_t)n->table.total * sizeof(float);

		undo = dalloc(n, gbytes);
		rc = undo ? n->dev->ops->copy_d2d(n->dev, undo, n->fam[FAM_GRADS].dev, gbytes) :
		     eng_fail(err, -ENOMEM, "cancellable call: no memory for a copy of the "
			      "gradients (%zu bytes)", gbytes);
	}
	/* grad_calls == 0: the gradients are zero (every path that leaves
	 * them otherwise counts a call or zeroes them), so the first backward
	 * pass writes its weight products instead of adding them. */
	n->model.grads_zero = n->grad_calls == 0;
	for (k = 0; k < plan.num_micro_batches && !rc; k++) {
		bool last = k == plan.num_micro_batches - 1;

		if (b->progress)
			b->progress(b->progress_ctx, "forward_backward", k, plan.num_micro_batches,
				    "micro-batches");
		if (k > 0 && cancelled && cancelled(b->cancel_ctx)) {
			rc = eng_fail(err, -ECANCELED,
				      "ForwardBackward: cancelled after %d of %d micro-batches (the "
				      "client went away or its deadline passed); gradients as before",
				      k, plan.num_micro_batches);
			break;
		}
		mb_gather(b, &plan, k, &h);
		rc = mb_forward(n, b, res, &h, 1.0f / temp, err);
		if (rc || b->forward_only)
			continue;
		if (!(reducing && last)) {
			rc = mb_backward(n, &h, 1.0f / temp, err);
			continue;
		}
		agreed = true;
		rc = native_dist_agree(n, 0, "ForwardBackward", err);
		if (rc == 0) {
			reduced = true;
			rc = reduce_pass(n, &h, 1.0f / temp, err);
		}
	}
	if (reducing && !agreed)
		rc = native_dist_agree(n, rc, "ForwardBackward", err);
	if (rc == 0 && b->progress)
		b->progress(b->progress_ctx, "forward_backward", k, plan.num_micro_batches,
			    "micro-batches");
	if (rc && reduced) {
		/* Reduced in part (the group is broken): dropped, as a failed step
		 * drops them. */
		(void)native_zero_grads(n, NULL);
	} else if (rc && !b->forward_only && k > 0) {
		undo_gradients(n, undo, err);
	}
	dfree(n, undo);
	res->num_micro_batches = plan.num_micro_batches;
	if (rc == 0 && !b->forward_only) {
		n->grad_calls++;
		n->grad_tokens += b->n;
		n->grads_reduced = reducing;
	}
	mb_host_free(&h);
	mb_plan_free(&plan);
	return rc;
}

/* --- optimizer --------------------------------------------------------- */

/* The step once the gradient norm is known: ret gets the norm and lr; a
 * non-finite norm skips the update and drops the gradients (1); else
 * *coef is the clip coefficient (0). */
static int step_norm(struct native *n, double norm, double lr, double clip,
		     struct engine_step_result *ret, float *coef, struct eng_error *err)
{
	int rc;

	memset(ret, 0, sizeof(*ret));
	ret->grad_norm = norm;
	ret->lr = lr;
	if (!isfinite(norm)) {
		/* verl: a non-finite norm skips the update and drops the grads. */
		ret->skipped = true;
		ret->step = n->optim_step;
		rc = native_zero_grads(n, err);
		return rc ? rc : 1;
	}
	/* torch.nn.utils.clip_grad_norm_: coef = max_norm / (norm + 1e-6),
	 * clamped to 1, computed in fp32. */
	*coef = 1.0f;
	if (clip > 0) {
		float c = (float)clip / ((float)norm + 1e-6f);

		*coef = c < 1.0f ? c : 1.0f;
	}
	return 0;
}

/* The one AdamW step, alone or in a group of W ranks (native_dist.c's
 * hooks; ZeRO-1): the gradients this rank updates are its slice
 * [shard_off, shard_off + shard_len) of the table (alone: all of it),
 * summed over the ranks first; the norm is that of the mean gradient,
 * sqrt(sum of the slices' squares) / W, and the mean is folded into the
 * kernel's grad_scale (coef / W: no extra pass); the updated slices are
 * then gathered on every rank. In a group a failure before the update
 * zeroes the gradients (they were partly reduced). */
static int native_optimizer_step(struct engine *e, const struct engine_step_params *p,
				 struct engine_step_result *ret, struct eng_error *err)
{
	struct native *n = N(e);
	const struct kernel_table *k = n->dev->k;
	struct engine_optim_config o = n->optim;  /* this step's */
	double sumsq = 0, lr = p && p->has_lr ? p->lr : native_current_lr(n);
	const int W = n->dist ? n->dist->world_size : 1;
	float *grads = n->fam[FAM_GRADS].dev, *params = n->fam[FAM_PARAMS].dev;
	float coef = 1.0f;
	int rc;

	engine_step_params_apply(p, &o);
	rc = native_require_placed(n, true, true, err);
	if (rc == 0 && n->dist)
		rc = native_dist_reduce_grads(n, err);
	if (rc)
		return rc;
	rc = k->sumsq(n->dev, &sumsq, grads + n->shard_off, n->shard_len);
	if (rc) {
		if (n->dist)
			(void)native_zero_grads(n, NULL);
		return eng_fail(err, rc, "optimizer: gradient norm failed");
	}
	if (n->dist && (rc = native_dist_sum_norm(n, &sumsq, err)))
		return rc;
	rc = step_norm(n, sqrt(sumsq) / W, lr, o.clip_grad, ret, &coef, err);
	if (rc)
		return rc < 0 ? rc : 0;
	n->optim_step++;
	/* Announced before the kernel runs, so that a device may refresh its
	 * derived copies in the update's own pass when it covers the whole
	 * table (device.h, adamw); a group's slice does not, and the copy is
	 * made again from the gathered parameters. */
	n->dev->param_version++;
	rc = k->adamw(n->dev, params + n->shard_off, grads + n->shard_off,
		      n->fam[FAM_EXP_AVG].dev, n->fam[FAM_EXP_AVG_SQ].dev, n->shard_len,
		      lr, o.beta1, o.beta2, o.eps, o.weight_decay, n->optim_step,
		      coef / (float)W);
	if (rc) {
		n->optim_step--;
		if (n->dist)
			(void)native_zero_grads(n, NULL);
		return eng_fail(err, rc, "optimizer: AdamW kernel failed");
	}
	if (n->dist)
		rc = native_dist_gather_params(n, err);
	ret->step = n->optim_step;
	/* The kernel zeroed the gradients as it read them. */
	n->grad_calls = n->grad_tokens = 0;
	return rc;
}

static int native_lr_scheduler_step(struct engine *e, double *ret_lr, struct eng_error *err)
{
	struct native *n = N(e);

	n->sched_step++;
	*ret_lr = native_current_lr(n);
	return 0;
}

/* --- parameters, status -------------------------------------------------- */

static int64_t native_num_params(struct engine *e)
{
	return N(e)->table.count;
}

/* The parameters are in host memory, in the region where the device keeps
 * its bf16 copy of them. */
static bool bf16_copy_region(struct native *n)
{
	return native_family_host_ptr(n, FAM_PARAMS) &&
	       n->dev->param_base == n->fam[FAM_PARAMS].dev;
}

static void fill_info(struct native *n, enum native_fam f, int64_t i,
		      struct engine_param_view *ret)
{
	const struct param_entry *p = &n->table.entries[i];
	const float *h = native_family_host_ptr(n, f);

	memset(ret, 0, sizeof(*ret));
	ret->name = p->name;
	ret->ndim = p->ndim;
	ret->shape[0] = p->shape[0];
	ret->shape[1] = p->shape[1];
	ret->numel = p->numel;
	ret->host_resident = h != NULL;
	ret->host_data = h ? h + p->offset : NULL;
	if (f == FAM_PARAMS && n->dev->ops->params_bf16 && bf16_copy_region(n)) {
		const uint16_t *copy = n->dev->ops->params_bf16(n->dev);

		ret->host_bf16 = copy ? copy + p->offset : NULL;
	}
}

static int native_param_info(struct engine *e, int64_t i, struct engine_param_view *ret)
{
	fill_info(N(e), FAM_PARAMS, i, ret);
	return 0;
}

/* A host-readable view of tensor i of family f: in place when the family is
 * host-readable, else staged (one tensor at a time) through n->stage. */
static int view(struct native *n, enum native_fam f, int64_t i,
		struct engine_param_view *ret, struct eng_error *err)
{
	const struct param_entry *p = &n->table.entries[i];
	const float *h = native_family_host_ptr(n, f);
	const float *src;

	if (h) {
		src = h + p->offset;
	} else {
		float *s = realloc(n->stage, p->numel * sizeof(float));
		int rc;

		if (!s)
			return eng_fail(err, -ENOMEM, "%s: out of host memory", p->name);
		n->stage = s;
		rc = n->dev->ops->copy_d2h(n->dev, s, n->fam[f].dev + p->offset,
					   p->numel * sizeof(float));
		if (rc == 0)
			rc = n->dev->ops->sync(n->dev);
		if (rc)
			return eng_fail(err, rc, "%s: copy from device failed", p->name);
		src = s;
	}
	fill_info(n, f, i, ret);
	ret->host_data = src;
	return 0;
}

static int native_param(struct engine *e, int64_t i, struct engine_param_view *ret,
			struct eng_error *err)
{
	return view(N(e), FAM_PARAMS, i, ret, err);
}

static int native_grad(struct engine *e, int64_t i, struct engine_param_view *ret,
		       struct eng_error *err)
{
	return view(N(e), FAM_GRADS, i, ret, err);
}

static int bf16_copy_possible(struct native *n, bool op, struct eng_error *err)
{
	if (!op || !bf16_copy_region(n))
		return eng_fail(err, -ENOTSUP,
				"the parameters are not in host memory with a bf16 copy "
				"(device %s)", n->dev->ops->name);
	return 0;
}

static int native_keep_params_bf16(struct engine *e, struct eng_error *err)
{
	struct native *n = N(e);
	int r = bf16_copy_possible(n, n->dev->ops->params_bf16_keep != NULL, err);

	if (r == 0 && (r = n->dev->ops->params_bf16_keep(n->dev)) < 0)
		return eng_fail(err, r, "the bf16 copy of the parameters: %s", strerror(-r));
	return r;
}

static int native_lend_params_bf16(struct engine *e, struct engine_lent_file *ret,
				   struct eng_error *err)
{
	struct native *n = N(e);
	struct device_lent_file f;
	int r = bf16_copy_possible(n, n->dev->ops->params_bf16_lend != NULL, err);

	if (r < 0)
		return r;
	r = n->dev->ops->params_bf16_lend(n->dev, &f);
	if (r < 0)
		return eng_fail(err, r, "lending the bf16 copy of the parameters: %s",
				strerror(-r));
	ret->fd = f.fd;
	ret->bytes = (int64_t)f.bytes;
	ret->base = f.base;
	return 0;
}

/* Convert on the device when the parameters are there (into a scratch
 * allocation unless device memory is host memory), else on the host; then
 * copy the slice to dst. */
static int native_param_copy(struct engine *e, int64_t i, enum engine_dtype dtype,
			     int64_t start, int64_t count, void *dst, struct eng_error *err)
{
	struct native *n = N(e);
	const struct param_entry *p = &n->table.entries[i];
	const float *h = native_family_host_ptr(n, FAM_PARAMS);
	const struct device_ops *o = n->dev->ops;
	const float *src;
	void *tmp;
	int rc;

	if (h) {
		src = h + p->offset + start;
		if (dtype == ENGINE_DTYPE_F32)
			memcpy(dst, src, count * sizeof(float));
		else if (dtype == ENGINE_DTYPE_BF16)
			f32_to_bf16_n(src, dst, count);
		else
			f32_to_f16_n(src, dst, count);
		return 0;
	}
	src = n->fam[FAM_PARAMS].dev + p->offset + start;
	if (dtype == ENGINE_DTYPE_F32) {
		rc = o->copy_d2h(n->dev, dst, src, count * sizeof(float));
		if (rc == 0)
			rc = o->sync(n->dev);
		return rc ? eng_fail(err, rc, "%s: copy from device failed", p->name) : 0;
	}
	tmp = dalloc(n, count * sizeof(uint16_t));
	if (!tmp)
		return eng_fail(err, -ENOMEM, "%s: out of device memory for conversion", p->name);
	rc = dtype == ENGINE_DTYPE_BF16 ? n->dev->k->to_bf16(n->dev, tmp, src, count)
					: n->dev->k->to_f16(n->dev, tmp, src, count);
	if (rc == 0)
		rc = o->copy_d2h(n->dev, dst, tmp, count * sizeof(uint16_t));
	if (rc == 0)
		rc = o->sync(n->dev);
	dfree(n, tmp);
	return rc ? eng_fail(err, rc, "%s: conversion failed", p->name) : 0;
}

static void native_status(struct engine *e, struct engine_status *ret)
{
	struct native *n = N(e);

	snprintf(ret->key, sizeof(ret->key), "%s", n->key);
	ret->initialized = true;
	ret->placement = n->place;
	ret->step = n->optim_step;
	ret->sched_step = n->sched_step;
	ret->lr = native_current_lr(n);
	ret->accumulated_calls = n->grad_calls;
	ret->accumulated_tokens = n->grad_tokens;
	ret->num_parameters = n->table.total;
	snprintf(ret->matmul, sizeof(ret->matmul), "%s", n->dev->matmul ? n->dev->matmul : "");
	ret->device_memory = n->dev->ops->mem_in_use(n->dev);
	ret->failed = n->dev->failed;
	ret->host_memory = 0;
	for (int f = 0; f < FAM_COUNT; f++)
		if (n->fam[f].host)
			ret->host_memory += (size_t)native_family_len(n, f) * sizeof(float);
	ret->dist_world_size = n->dist ? n->dist->world_size : 1;
	ret->dist_rank = n->dist ? n->dist->rank : 0;
	ret->dist_backend = n->dist ? n->dist->ops->name : NULL;
	ret->dist_broken = n->dist && n->dist->broken;
	ret->optim_shard_params = n->shard_len;
	ret->optim_bytes = 2 * (size_t)n->shard_len * sizeof(float);
	if (n->dist) {
		ret->dist_bucket_bytes = n->dist_bucket_bytes;
		ret->reduce_buckets = n->sync_last.buckets;
		ret->reduce_bytes = n->sync_last.bytes;
		ret->reduce_s = n->sync_last.reduce_s;
		ret->reduce_wait_s = n->sync_last.wait_s;
	}
}

#define NATIVE_OPS(mt, dv)                                      \
	{                                                       \
		.model_type = mt, .backend = "native", .device = dv, \
		.initialize = native_initialize,                \
		.forward_backward = native_forward_backward,    \
		.optimizer_step = native_optimizer_step,        \
		.lr_scheduler_step = native_lr_scheduler_step,  \
		.to = native_to,                                \
		.zero_grad = native_zero_grad,                  \
		.num_params = native_num_params,                \
		.param = native_param,                          \
		.grad = native_grad,                            \
		.param_info = native_param_info,                \
		.param_copy = native_param_copy,                \
		.keep_params_bf16 = native_keep_params_bf16,    \
		.lend_params_bf16 = native_lend_params_bf16,    \
		.save_checkpoint = native_save_checkpoint,      \
		.load_checkpoint = native_load_checkpoint,      \
		.status = native_status,                        \
		.destroy = native_destroy,                      \
	}

const struct engine_ops native_lm_cpu_ops = NATIVE_OPS("language_model", "cpu");
const struct engine_ops native_value_cpu_ops = NATIVE_OPS("value_model", "cpu");
const struct engine_ops native_lm_cuda_ops = NATIVE_OPS("language_model", "cuda");
const struct engine_ops native_value_cuda_ops = NATIVE_OPS("value_model", "cuda");
