/* native_init.c — Initialize of the native engine: the model from a
 * Hugging Face config (inline or a model directory's config.json), its
 * state families placed on the device, the weights from the directory's
 * safetensors or a seeded random init, the group joined.
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

#include "checked.h"
#include "io/fileio.h"
#include "io/safetensors.h"
#include "../optim/schedule.h"

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

/* Draw elements [first, first + count) of parameter i into dst[count]
 * (see above): the chunks that overlap them, a chunk that the range cuts
 * drawn whole into a scratch first (a ZeRO-3 rank's slice). -ENOMEM. */
static int random_init_range(struct native *n, float *dst, int64_t i, int64_t first,
			     int64_t count)
{
	const struct param_entry *p = &n->table.entries[i];
	int64_t j0 = first / RANDOM_INIT_CHUNK;
	int64_t j1 = (first + count + RANDOM_INIT_CHUNK - 1) / RANDOM_INIT_CHUNK;
	float std = (float)n->cfg.initializer_range;
	int rc = 0;

#pragma omp parallel for schedule(dynamic, 1) if (j1 - j0 > 1)
	for (int64_t j = j0; j < j1; j++) {
		int64_t start = j * RANDOM_INIT_CHUNK;
		int64_t len = p->numel - start < RANDOM_INIT_CHUNK ? p->numel - start
								    : RANDOM_INIT_CHUNK;
		int64_t lo = start > first ? start : first;
		int64_t hi = start + len < first + count ? start + len : first + count;
		bool cut = lo != start || hi != start + len;
		float *x = cut ? malloc((size_t)len * sizeof(float)) : dst + (start - first);
		struct rng r;

		if (!x) {
#pragma omp atomic write
			rc = -ENOMEM;
			continue;
		}
		if (p->init_ones) {
			for (int64_t q = 0; q < len; q++)
				x[q] = 1.0f;
		} else if (p->init_zero) {
			memset(x, 0, len * sizeof(float));
		} else {
			rng_seed(&r, n->seed ^ ((uint64_t)i << 40) ^ (uint64_t)j);
			rng_normal_fill(&r, x, len, 0.0f, std);
		}
		if (cut) {
			memcpy(dst + (lo - first), x + (lo - start), (size_t)(hi - lo) * sizeof(float));
			free(x);
		}
	}
	return rc;
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
 * parameter; 18 with the bf16 copy of bf16 matmuls), of the families as
 * this rank holds them (whole, or its slice in a group: the moments with
 * ZeRO-1, the gradients too with ZeRO-2, everything with ZeRO-3).
 * Activations and a sharded group's part buffers (a few layers, the
 * embedding and the head) come on top. */
static int check_fits(const struct native *n, const struct engine_init_config *cfg,
		      struct eng_error *err)
{
	size_t need = 0, bytes, avail;

	for (int f = 0; f < FAM_COUNT && need != SIZE_MAX; f++)
		if (!ck_mul_size((size_t)native_family_len(n, f), 4, &bytes) ||
		    need > SIZE_MAX - bytes)
			need = SIZE_MAX;
		else
			need += bytes;
	if (cfg->bf16_matmul && !native_shard_params(n) && need != SIZE_MAX)
		need = ck_mul_size((size_t)n->table.total, 2, &bytes) && need <= SIZE_MAX - bytes
		       ? need + bytes : SIZE_MAX;
	avail = n->dev->ops->mem_free ? n->dev->ops->mem_free(n->dev) : SIZE_MAX;
	if (need <= avail)
		return 0;
	return eng_fail(err, -ENOMEM,
			"model: %lld parameters need about %.1f GiB (fp32 weights%s%s); the %s "
			"device has %.1f GiB free",
			(long long)n->table.total, (double)need / (1 << 30),
			n->frozen ? "" : ", gradients and AdamW moments",
			cfg->bf16_matmul ? ", bf16 copy" : "", cfg->device,
			(double)avail / (1 << 30));
}

/* The elements of tensor i that this rank keeps, [*first, *first +
 * *count) of the tensor, and where they go in host: the whole tensor at
 * its offset, or with ZeRO-3 (host is this rank's slice) the part of it in
 * the slice (*count 0: none). */
static float *tensor_dst(struct native *n, float *host, int64_t i, int64_t *first,
			 int64_t *count)
{
	const struct param_entry *p = &n->table.entries[i];
	int64_t a, b;

	if (!native_shard_params(n)) {
		*first = 0;
		*count = p->numel;
		return host + p->offset;
	}
	native_shard_held(n, i, &a, &b);
	*first = a - p->offset;
	*count = b - a;
	return host + (a - n->group.shard_off);
}

/* The seeded init of tensor i into host (above). */
static int init_tensor(struct native *n, float *host, int64_t i, struct eng_error *err)
{
	int64_t first, count;
	float *dst = tensor_dst(n, host, i, &first, &count);

	if (count && random_init_range(n, dst, i, first, count))
		return eng_fail(err, -ENOMEM, "%s: out of memory for its random init",
				n->table.entries[i].name);
	return 0;
}

/* Mixtral's router under transformers 5's in-memory name (its
 * block_sparse_moe module is mlp there), which a packed directory uses. */
static const struct st_tensor_info *mixtral_v5_name(struct st_reader *r, const char *name)
{
	const char *at = strstr(name, ".block_sparse_moe.");
	char alias[96];

	if (!at)
		return NULL;
	snprintf(alias, sizeof(alias), "%.*s.mlp.%s", (int)(at - name), name,
		 at + strlen(".block_sparse_moe."));
	return st_reader_find(r, alias);
}

/* Where expert tensor p lies when a directory holds transformers 5's
 * packed layout instead of one tensor per expert: each layer's
 * mlp.experts.gate_up_proj [E, 2I, C] (expert e's gate rows, then its up
 * rows) and mlp.experts.down_proj [E, C, I], so that each expert's
 * projection is one run of the packed tensor's elements. Finds the packed
 * tensor (under mlp., or mixtral's block_sparse_moe.) and sets *start, its
 * element where p begins; NULL for a tensor that is not an expert's. */
static const struct st_tensor_info *packed_expert(const struct native *n, struct st_reader *r,
						  const struct param_entry *p, int64_t *start)
{
	const struct model_config *c = &n->cfg;
	int64_t I = c->moe_intermediate_size, C = c->hidden_size, l, e;
	const struct st_tensor_info *t = NULL;
	char packed[96];
	int j;

	if (!param_expert_of(c, p->name, &l, &e, &j))
		return NULL;
	for (int k = 0; k < 2 && !t; k++) {
		snprintf(packed, sizeof(packed), "model.layers.%lld.%s.experts.%s", (long long)l,
			 k && c->arch == ARCH_MIXTRAL ? "block_sparse_moe" : "mlp",
			 j < 2 ? "gate_up_proj" : "down_proj");
		t = st_reader_find(r, packed);
	}
	if (!t || t->ndim != 3 || t->shape[0] != c->num_experts ||
	    t->shape[1] != (j < 2 ? 2 * I : C) || t->shape[2] != (j < 2 ? C : I))
		return NULL;
	*start = j < 2 ? (e * 2 + j) * I * C : e * C * I;
	return t;
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
	int64_t first, count;
	float *dst;
	int rc;

	rc = st_reader_open_at(dfd, ".", dir, &r, err);
	if (rc)
		return rc;
	st_reader_set_threads(r, n->io_threads);
	for (int64_t i = 0; i < n->table.count && !rc; i++) {
		const struct param_entry *p = &n->table.entries[i];
		const struct st_tensor_info *t = st_reader_find(r, p->name);
		int64_t start = 0;

		if (!t)
			t = mixtral_v5_name(r, p->name);

		init_progress(n, cfg, "load weights", i);
		rc = init_cancelled(n, cfg, i, err);
		if (rc)
			break;
		if (!t && (t = packed_expert(n, r, p, &start)) != NULL) {
			/* one run of the packed tensor, or this rank's part of it */
			dst = tensor_dst(n, host, i, &first, &count);
			if (count)
				rc = st_reader_read_f32_range(r, t->name, start + first, count, dst,
							      err);
			continue;
		}
		if (!t) {
			if (n->value_model && !strncmp(p->name, "score.", 6)) {
				rc = init_tensor(n, host, i, err);
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
		dst = tensor_dst(n, host, i, &first, &count);
		if (count == p->numel)
			rc = st_reader_read_f32(r, t->name, dst, p->numel, err);
		else if (count)
			rc = st_reader_read_f32_range(r, t->name, first, count, dst, err);
	}
	if (rc == 0)
		init_progress(n, cfg, "load weights", n->table.count);
	st_reader_close(r);
	return rc;
}

int native_initialize(struct engine *e, const struct engine_init_config *cfg,
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
	n->kv_cache_bytes = cfg->kv_cache_bytes ? cfg->kv_cache_bytes : ENGINE_KV_CACHE_DEFAULT;
	n->recompute = cfg->activation_recompute;
	n->frozen = cfg->frozen_base;
	n->model.frozen = n->frozen;

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
	rc = native_dist_shape(n, cfg, err);
	if (rc == 0)
		rc = check_fits(n, cfg, err);
	if (rc == 0)
		rc = native_dist_join(n, cfg, err);
	if (rc == 0)
		rc = native_shard_setup(n, err);
	/* ZeRO-3: each rank draws or reads its own slice; the seed is rank
	 * 0's, as the whole parameters are rank 0's with ZeRO-1 and 2. */
	if (rc == 0 && native_shard_params(n)) {
		rc = native_dist_bcast_host(n, &n->seed, sizeof(n->seed), 0, err);
		rng_seed(&n->rng, n->seed);
	}
	if (rc)
		return rc;
	bytes = (size_t)native_family_len(n, FAM_PARAMS) * sizeof(float);
	n->wl = calloc(n->cfg.num_layers, sizeof(*n->wl));
	n->gl = calloc(n->cfg.num_layers, sizeof(*n->gl));
	if (!n->wl || !n->gl)
		return eng_fail(err, -ENOMEM, "engine: out of memory");
	rc = native_families_alloc(n, err);
	if (rc)
		return rc;

	host = native_family_host_ptr(n, FAM_PARAMS);
	if (!host)
		host = calloc(1, bytes);   /* a slice's padding past the table stays 0 */
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
				rc = init_tensor(n, host, i, err);
		}
		if (rc == 0)
			init_progress(n, cfg, "build", n->table.count);
	}
	if (rc == 0 && host != native_family_host_ptr(n, FAM_PARAMS))
		rc = native_family_write(n, FAM_PARAMS, host, err);
	if (host != native_family_host_ptr(n, FAM_PARAMS))
		free(host);
	/* Every rank starts from rank 0's parameters (ZeRO-3: its slice of
	 * the same files or seed). */
	if (rc == 0 && !native_shard_params(n))
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
