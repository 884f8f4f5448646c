/* test_engine_dist.c — the native engine in a data-parallel group on the
 * CPU's collective backend (Gloo), with forked processes as ranks:
 * W = 2 and 3 ranks, each on its shard of a packed batch with per-token
 * gradients scaled by W (the dp_size convention), match one engine on the
 * whole batch after 3 steps (grad norm and parameters, clipping engaged);
 * all ranks end bit-identical; each holds 1/W of the moments; a rank that
 * never arrives times out Initialize; a rank that dies makes the step fail
 * fast, leaves the parameters as they were and the group broken (-ENOTCONN
 * after), and the engine still serves forward passes. Checkpoints: a
 * group's (each rank writes its optimizer shard; or rank 0 writes the
 * shards of ranks that cannot reach the directory, byte for byte the same
 * files) reloads bit for bit into the same group, by either path, and
 * loads into one engine; one engine's loads into a group. A
 * ForwardBackward with reduce_gradients (buckets reduced during its
 * backward) trains as the step's reduction does; a refusal on one rank
 * fails it on every rank with no gradients changed. Exit 77 when the
 * build has no CPU backend. */
#include <math.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dist/dist.h"
#include "test_helpers.h"

#define NSEQ 5
#define NTOK 24
static const int32_t LENS[NSEQ] = {5, 3, 7, 4, 5};

static char root[256];

static void setup(void)
{
	snprintf(root, sizeof(root), "/tmp/engined-dist-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(root));
}

static void teardown(void)
{
	char cmd[300];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	ck_assert_int_eq(system(cmd), 0);
}

/* The batch of `step`: token ids and upstream gradients (log-prob, entropy). */
static void make_batch(int step, int32_t *ids, float *gl, float *ge)
{
	uint32_t s = 77u + (uint32_t)step * 7919u;

	for (int i = 0; i < NTOK; i++) {
		s = s * 1664525u + 1013904223u;
		ids[i] = (int32_t)((s >> 8) % 97);
		gl[i] = (float)((s >> 4) & 0xff) / 64.0f - 2.0f;
		ge[i] = (float)((s >> 12) & 0xff) / 512.0f - 0.25f;
	}
}

static void init_config(struct engine_init_config *cfg)
{
	engine_init_config_defaults(cfg);
	cfg->hf_config_json = TINY_QWEN2;
	cfg->seed = 11;
	cfg->optim.lr = 1e-3;
	cfg->optim.clip_grad = 0.5;   /* the norms below are larger: clipping on */
	cfg->threads = 1;
	cfg->max_tokens_per_micro_batch = 8;
}

/* The dist.zero_stage the ranks of the next run_group form their group
 * with (0: not given, ZeRO-1); set before the fork, so each rank has it. */
static int zero_stage;
/* The group's ranks keep their parameters and optimizer state in host
 * memory (param_offload, optimizer_offload) on a CPU device that keeps
 * device and host allocations apart (ENGINED_CPU_DISCRETE, as CUDA). */
static bool offload;

static void dist_config(struct engine_init_config *cfg, const struct dist_group_id *id,
			int rank, int W, double timeout_s)
{
	cfg->dist.zero_stage = zero_stage;
	cfg->dist.rank = rank;
	cfg->dist.world_size = W;
	cfg->dist.id = *id;
	cfg->dist.timeout_s = timeout_s;
	cfg->dist.store_root = root;
}

/* How fb_call runs: a reducing call; the loss refusing its n-th
 * micro-batch; a token id outside the vocabulary. */
struct fb_opts {
	bool reduce;
	int fail_call;
	bool bad_id;
};

/* Forward-backward over sequences [s0, s1) of the batch of `step`, the
 * upstream gradients times `scale`. */
static int fb_call(struct engine *e, int step, int s0, int s1, float scale, bool fwd_only,
		   const struct fb_opts *o, struct eng_error *err)
{
	int32_t ids[NTOK];
	float gl[NTOK], ge[NTOK];
	int t0 = 0, n = 0;

	make_batch(step, ids, gl, ge);
	for (int s = 0; s < s0; s++)
		t0 += LENS[s];
	for (int s = s0; s < s1; s++)
		n += LENS[s];
	for (int i = 0; i < NTOK; i++) {
		gl[i] *= scale;
		ge[i] *= scale;
	}
	if (o && o->bad_id)
		ids[t0 + n - 1] = 1 << 20;
	struct given_grads gg = {.g_logp = gl + t0, .g_ent = ge + t0,
				 .fail_call = o ? o->fail_call : 0};
	struct engine_batch b = {.n = n, .input_ids = ids + t0, .num_seqs = s1 - s0,
				 .seq_lens = LENS + s0, .temperature = 1.0f,
				 .loss_fn = given_loss, .loss_ctx = &gg, .forward_only = fwd_only,
				 .reduce_gradients = o && o->reduce,
				 .max_tokens_per_micro_batch = 8};
	struct engine_fb_result r = {0};

	return engine_forward_backward(e, &b, &r, err);
}

static int fb_range(struct engine *e, int step, int s0, int s1, float scale, bool fwd_only,
		    struct eng_error *err)
{
	return fb_call(e, step, s0, s1, scale, fwd_only, NULL, err);
}

static double max_abs_diff(struct engine *a, struct engine *b)
{
	struct engine_param_view va, vb;
	double m = 0;

	for (int64_t i = 0; i < engine_num_params(a); i++) {
		ck_assert_int_eq(engine_param(a, i, &va, NULL), 0);
		ck_assert_int_eq(engine_param(b, i, &vb, NULL), 0);
		for (int64_t j = 0; j < va.numel; j++) {
			double d = fabs((double)va.host_data[j] - vb.host_data[j]);

			if (d > m || d != d)
				m = d != d ? INFINITY : d;
		}
	}
	return m;
}

#define CHILD_CHECK(cond, ...)                                                   \
	do {                                                                     \
		if (!(cond)) {                                                   \
			fprintf(stderr, "rank %d: %s:%d: ", rank, __FILE__, __LINE__); \
			fprintf(stderr, __VA_ARGS__);                            \
			fputc('\n', stderr);                                     \
			_exit(1);                                                \
		}                                                                \
	} while (0)

/* One rank of the equivalence test: 3 steps on its shard, then checks
 * against one engine on the whole batch; its parameter digest to a file. */
static void run_rank(const struct dist_group_id *id, int rank, int W)
{
	struct engine_init_config cfg;
	struct engine *e = NULL, *ref = NULL;
	struct engine_status st;
	struct eng_error err = {0};
	int s0 = rank * NSEQ / W, s1 = (rank + 1) * NSEQ / W;
	char path[300];
	FILE *f;

	init_config(&cfg);
	dist_config(&cfg, id, rank, W, 60);
	cfg.param_offload = cfg.optimizer_offload = offload;
	if (offload)
		setenv("ENGINED_CPU_DISCRETE", "1", 1);
	CHILD_CHECK(engine_create(&cfg, &e, &err) == 0, "engine_create: %s", err.msg);
	unsetenv("ENGINED_CPU_DISCRETE");
	init_config(&cfg);
	CHILD_CHECK(engine_create(&cfg, &ref, &err) == 0, "reference: %s", err.msg);
	engine_status(e, &st);
	CHILD_CHECK(st.dist_world_size == W && st.dist_rank == rank && st.dist_backend &&
		    !strcmp(st.dist_backend, "gloo") && !st.dist_broken, "status");
	CHILD_CHECK(st.optim_shard_params == (st.num_parameters + W - 1) / W,
		    "shard %lld of %lld", (long long)st.optim_shard_params,
		    (long long)st.num_parameters);
	CHILD_CHECK(st.optim_bytes == 8 * (size_t)st.optim_shard_params, "optimizer bytes");
	/* Rank 0's initial parameters everywhere: equal to the reference's. */
	CHILD_CHECK(max_abs_diff(e, ref) == 0, "initial parameters differ");
	for (int step = 0; step < 3; step++) {
		struct engine_step_result a, b;

		CHILD_CHECK(fb_range(e, step, s0, s1, (float)W, false, &err) == 0, "fb: %s",
			    err.msg);
		CHILD_CHECK(fb_range(ref, step, 0, NSEQ, 1.0f, false, &err) == 0, "ref fb: %s",
			    err.msg);
		CHILD_CHECK(engine_optimizer_step(e, &a, &err) == 0, "step: %s", err.msg);
		CHILD_CHECK(engine_optimizer_step(ref, &b, &err) == 0, "ref step: %s", err.msg);
		CHILD_CHECK(!a.skipped && a.step == step + 1, "step result");
		CHILD_CHECK(b.grad_norm > 1.0, "clipping engaged (norm %g)", b.grad_norm);
		CHILD_CHECK(fabs(a.grad_norm - b.grad_norm) <= 1e-5 * b.grad_norm,
			    "step %d: grad norm %.9g, one engine %.9g", step, a.grad_norm,
			    b.grad_norm);
	}
	double d = max_abs_diff(e, ref);

	CHILD_CHECK(d <= 1e-6, "parameters differ from one engine by %g", d);
	if (offload) {
		/* Between calls the slices are on the host: this rank's
		 * parameters, gradients and moments, 4 x 4 bytes a float of
		 * the slice; the device keeps the part buffers and less than
		 * one family's slice (small tables: RoPE's, the arenas). */
		engine_status(e, &st);
		CHILD_CHECK(!st.placement.model && !st.placement.optimizer && !st.placement.grad,
			    "placement after the steps");
		CHILD_CHECK(st.host_memory == 16 * (size_t)st.optim_shard_params,
			    "host memory %zu, slice %lld floats", st.host_memory,
			    (long long)st.optim_shard_params);
		CHILD_CHECK(st.device_memory < st.gathered_bytes + 4 * (size_t)st.optim_shard_params,
			    "device memory %zu, part buffers %zu", st.device_memory,
			    st.gathered_bytes);
	}
	snprintf(path, sizeof(path), "%s/digest-%d", root, rank);
	f = fopen(path, "w");
	CHILD_CHECK(f && fprintf(f, "%016llx\n", (unsigned long long)state_digest(e, false)) > 0,
		    "digest");
	fclose(f);
	fprintf(stderr, "rank %d of %d: max |param - one engine| = %.3g\n", rank, W, d);
	engine_destroy(ref);
	engine_destroy(e);
	_exit(0);
}

/* Steps [from, to) on a group rank (its shard, gradients x W) or alone. */
static void steps(struct engine *e, int rank, int W, int from, int to)
{
	struct engine_step_result sr;
	struct eng_error err = {0};

	for (int step = from; step < to; step++) {
		int s0 = W > 1 ? rank * NSEQ / W : 0, s1 = W > 1 ? (rank + 1) * NSEQ / W : NSEQ;

		CHILD_CHECK(fb_range(e, step, s0, s1, (float)W, false, &err) == 0, "fb: %s",
			    err.msg);
		CHILD_CHECK(engine_optimizer_step(e, &sr, &err) == 0, "step: %s", err.msg);
	}
}

/* The whole of file `path` (malloc'ed), its length in *len; NULL if unreadable. */
static char *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	char *buf = NULL;
	long n;

	if (!f)
		return NULL;
	if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
	    (buf = malloc((size_t)n + 1)) && fread(buf, 1, (size_t)n, f) == (size_t)n) {
		*len = (size_t)n;
	} else {
		free(buf);
		buf = NULL;
	}
	fclose(f);
	return buf;
}

/* Rank 0: the group's checkpoint holds one optimizer shard per rank (no
 * one-engine optimizer file), byte for byte the same in both saves. */
static void check_shards(const char *gdir, const char *rdir, int W)
{
	const int rank = 0;   /* for CHILD_CHECK */
	char a[400], b[400];

	snprintf(a, sizeof(a), "%s/optimizer.safetensors", gdir);
	CHILD_CHECK(access(a, F_OK) != 0, "%s exists", a);
	for (int r = 0; r < W; r++) {
		size_t la = 0, lb = 0;
		char *x, *y;

		snprintf(a, sizeof(a), "%s/optimizer-%05d-of-%05d.safetensors", gdir, r, W);
		snprintf(b, sizeof(b), "%s/optimizer-%05d-of-%05d.safetensors", rdir, r, W);
		x = slurp(a, &la);
		y = slurp(b, &lb);
		CHILD_CHECK(x && y && la > 8 && la == lb && !memcmp(x, y, la),
			    "shard %d: %s and %s differ", r, a, b);
		free(x);
		free(y);
	}
}

/* One rank of the checkpoint test: a group checkpoint reloads bit for bit
 * into the same group, loads into one engine (W -> 1), and one engine's
 * checkpoint loads into the group (1 -> W), both matching one engine. */
static void run_rank_ckpt(const struct dist_group_id *id, int rank, int W)
{
	struct engine_init_config cfg;
	struct engine *e = NULL, *ref = NULL, *one = NULL;
	struct eng_error err = {0};
	char gdir[300], sdir[300], rdir[300];
	size_t bytes = 1;
	uint64_t after;
	int64_t gstep = -1;
	double d;

	snprintf(gdir, sizeof(gdir), "%s/group", root);
	snprintf(rdir, sizeof(rdir), "%s/relayed", root);
	snprintf(sdir, sizeof(sdir), "%s/single-%d", root, rank);
	init_config(&cfg);
	dist_config(&cfg, id, rank, W, 60);
	CHILD_CHECK(engine_create(&cfg, &e, &err) == 0, "engine_create: %s", err.msg);
	init_config(&cfg);
	CHILD_CHECK(engine_create(&cfg, &ref, &err) == 0, "reference: %s", err.msg);
	steps(e, rank, W, 0, 2);
	steps(ref, 0, 1, 0, 2);
	/* Every rank saves, each its own shard (one filesystem here)... */
	CHILD_CHECK(engine_save_checkpoint(e, gdir, 2, 0, CKPT_ALL, &bytes, &err) == 0,
		    "group save: %s", err.msg);
	CHILD_CHECK(bytes > 0, "bytes %zu", bytes);
	/* ...or, where a rank cannot reach the directory (NULL), rank 0
	 * writes its shard from the slices it sends. */
	CHILD_CHECK(engine_save_checkpoint(e, rank == 0 ? rdir : NULL, 2, 0, CKPT_ALL, &bytes,
					   &err) == 0, "relayed save: %s", err.msg);
	CHILD_CHECK(rank == 0 ? bytes > 0 : bytes == 0, "relayed bytes %zu", bytes);
	if (rank == 0)
		check_shards(gdir, rdir, W);
	CHILD_CHECK(engine_save_checkpoint(ref, sdir, 2, 0, CKPT_ALL, NULL, &err) == 0,
		    "save: %s", err.msg);
	steps(e, rank, W, 2, 3);
	steps(ref, 0, 1, 2, 3);
	after = state_digest(e, false);

	/* W -> W: back to step 2 and on, bit for bit. */
	CHILD_CHECK(engine_load_checkpoint(e, gdir, CKPT_ALL, &gstep, &err) == 0, "load: %s",
		    err.msg);
	CHILD_CHECK(gstep == 2, "global step %lld", (long long)gstep);
	steps(e, rank, W, 2, 3);
	CHILD_CHECK(state_digest(e, false) == after, "reloaded group diverged");
	/* The same where the other ranks cannot reach it: rank 0 reads their
	 * slices and sends them. */
	CHILD_CHECK(engine_load_checkpoint(e, rank == 0 ? rdir : NULL, CKPT_ALL, &gstep, &err) == 0,
		    "relayed load: %s", err.msg);
	steps(e, rank, W, 2, 3);
	CHILD_CHECK(state_digest(e, false) == after, "relayed reload diverged");

	/* W -> 1: the group's checkpoint into one engine of another seed. */
	init_config(&cfg);
	cfg.seed = 99;
	CHILD_CHECK(engine_create(&cfg, &one, &err) == 0, "one: %s", err.msg);
	CHILD_CHECK(engine_load_checkpoint(one, gdir, CKPT_ALL, &gstep, &err) == 0,
		    "load into one: %s", err.msg);
	steps(one, 0, 1, 2, 3);
	d = max_abs_diff(one, e);
	CHILD_CHECK(d <= 1e-6, "W -> 1: parameters differ from the group by %g", d);

	/* 1 -> W: rank 0's single-engine checkpoint into the group. */
	snprintf(sdir, sizeof(sdir), "%s/single-0", root);
	CHILD_CHECK(engine_load_checkpoint(e, sdir, CKPT_ALL, &gstep, &err) == 0,
		    "load single: %s", err.msg);
	steps(e, rank, W, 2, 3);
	d = max_abs_diff(e, ref);
	CHILD_CHECK(d <= 1e-6, "1 -> W: parameters differ from one engine by %g", d);
	/* A name rank 0 refuses (too long for a checkpoint): INVALID_ARGUMENT
	 * on every rank, the others saying it was rank 0's, nothing saved,
	 * and the group goes on (the steps below). */
	{
		char longdir[600];

		snprintf(longdir, sizeof(longdir), "%s/%0250d", root, 7);
		CHILD_CHECK(engine_save_checkpoint(e, longdir, 3, 0, CKPT_ALL, NULL, &err) ==
			    -EINVAL && strstr(err.msg, rank == 0 ? "checkpoint name" : "rank 0 could "
					      "not begin"), "long name: %s", err.msg);
		eng_error_clear(&err);
		CHILD_CHECK(access(longdir, F_OK) != 0, "%s was saved", longdir);
	}
	/* A refused load (no such checkpoint on rank 0) fails every rank and
	 * leaves the group usable. */
	snprintf(sdir, sizeof(sdir), "%s/missing", root);
	CHILD_CHECK(engine_load_checkpoint(e, sdir, CKPT_ALL, &gstep, &err) == -ENOENT,
		    "missing: %s", err.msg);
	eng_error_clear(&err);
	steps(e, rank, W, 3, 4);
	fprintf(stderr, "rank %d of %d: checkpoints W->W bit-exact, W->1 and 1->W within %.3g\n",
		rank, W, d);
	engine_destroy(one);
	engine_destroy(ref);
	engine_destroy(e);
	_exit(0);
}

/* A second group the ranks of run_group also join (made by the parent
 * before it forks). */
static struct dist_group_id second_id;

/* One rank of the reduce-in-backward test: engine A reduces during its
 * backward passes (buckets of 1 KiB: many, some spanning two ranks'
 * slices), engine B, in another group, reduces in its optimizer steps;
 * the same calls on both, mixing reducing and non-reducing calls before
 * a step. With 2 ranks a sum of two terms is the same either way: A and B
 * end bit for bit equal; with 3 the ring sums in another order than the
 * reduce-scatter (within 1e-6). Both match one engine. */
static void run_rank_reduce(const struct dist_group_id *id, int rank, int W)
{
	struct engine_init_config cfg;
	struct engine *a = NULL, *b = NULL, *ref = NULL;
	struct engine_status st;
	struct eng_error err = {0};
	const struct fb_opts red = {.reduce = true};
	int s0 = rank * NSEQ / W, s1 = (rank + 1) * NSEQ / W, mid = (s0 + s1 + 1) / 2;
	double d = 0;

	init_config(&cfg);
	dist_config(&cfg, id, rank, W, 60);
	cfg.dist.bucket_bytes = 1024;
	CHILD_CHECK(engine_create(&cfg, &a, &err) == 0, "engine_create A: %s", err.msg);
	init_config(&cfg);
	dist_config(&cfg, &second_id, rank, W, 60);
	CHILD_CHECK(engine_create(&cfg, &b, &err) == 0, "engine_create B: %s", err.msg);
	init_config(&cfg);
	CHILD_CHECK(engine_create(&cfg, &ref, &err) == 0, "reference: %s", err.msg);
	for (int step = 0; step < 3; step++) {
		struct engine_step_result ra, rb, rr;
		/* step 0: one reducing call; 1: a plain call, then a reducing
		 * one; 2: a reducing call, then a plain one (the step reduces
		 * what the plain one added). A rank of one sequence makes the
		 * reducing call only. */
		bool first_reduces = step != 1, second_reduces = step != 2;
		int cut = step == 0 ? s0 : s1 - s0 > 1 ? mid : step == 1 ? s0 : s1;

		if (cut > s0) {
			struct fb_opts o = {.reduce = first_reduces};

			CHILD_CHECK(fb_call(a, step, s0, cut, (float)W, false, &o, &err) == 0,
				    "A fb 1: %s", err.msg);
			CHILD_CHECK(fb_range(b, step, s0, cut, (float)W, false, &err) == 0,
				    "B fb 1: %s", err.msg);
		}
		struct fb_opts o2 = {.reduce = second_reduces};

		if (cut < s1) {
			CHILD_CHECK(fb_call(a, step, cut, s1, (float)W, false, &o2, &err) == 0,
				    "A fb 2: %s", err.msg);
			CHILD_CHECK(fb_range(b, step, cut, s1, (float)W, false, &err) == 0,
				    "B fb 2: %s", err.msg);
		}
		CHILD_CHECK(fb_range(ref, step, 0, NSEQ, 1.0f, false, &err) == 0, "ref fb: %s",
			    err.msg);
		if (step == 0) {
			engine_status(a, &st);
			CHILD_CHECK(st.reduce_bytes == 4 * W * st.optim_shard_params,
				    "reduced %lld bytes of %lld", (long long)st.reduce_bytes,
				    (long long)(4 * W * st.optim_shard_params));
			CHILD_CHECK(st.reduce_buckets >= st.reduce_bytes / 1024 &&
				    st.dist_bucket_bytes == 1024, "%lld buckets of %lld bytes",
				    (long long)st.reduce_buckets, (long long)st.dist_bucket_bytes);
		}
		CHILD_CHECK(engine_optimizer_step(a, &ra, &err) == 0, "A step: %s", err.msg);
		CHILD_CHECK(engine_optimizer_step(b, &rb, &err) == 0, "B step: %s", err.msg);
		CHILD_CHECK(engine_optimizer_step(ref, &rr, &err) == 0, "ref step: %s", err.msg);
		CHILD_CHECK(fabs(ra.grad_norm - rr.grad_norm) <= 1e-5 * rr.grad_norm,
			    "step %d: grad norm %.9g, one engine %.9g", step, ra.grad_norm,
			    rr.grad_norm);
		/* Two ranks sum the same two terms either way until step 2,
		 * whose plain call adds to sums already made. */
		if (W == 2 && step < 2)
			CHILD_CHECK(ra.grad_norm == rb.grad_norm && max_abs_diff(a, b) == 0,
				    "step %d: A and B differ (norms %.17g %.17g)", step,
				    ra.grad_norm, rb.grad_norm);
	}
	d = max_abs_diff(a, b);
	CHILD_CHECK(d <= 1e-6, "A and B differ by %g", d);
	d = max_abs_diff(a, ref);
	CHILD_CHECK(d <= 1e-6, "A differs from one engine by %g", d);
	/* A reducing call alone in a step, one micro-batch per rank. */
	{
		struct engine_step_result ra, rb;

		CHILD_CHECK(fb_call(a, 5, s0, s0 + 1, (float)W, false, &red, &err) == 0,
			    "A small: %s", err.msg);
		CHILD_CHECK(fb_range(b, 5, s0, s0 + 1, (float)W, false, &err) == 0, "B small: %s",
			    err.msg);
		CHILD_CHECK(engine_optimizer_step(a, &ra, &err) == 0, "A step: %s", err.msg);
		CHILD_CHECK(engine_optimizer_step(b, &rb, &err) == 0, "B step: %s", err.msg);
		d = max_abs_diff(a, b);
		CHILD_CHECK(d <= 1e-6, "A and B differ by %g", d);
	}
	fprintf(stderr, "rank %d of %d: reduced in the backward vs in the step: %.3g\n", rank,
		W, d);
	engine_destroy(ref);
	engine_destroy(b);
	engine_destroy(a);
	_exit(0);
}

/* One rank of the agreement test: a reducing call that fails on one rank
 * (a token outside the vocabulary: refused up front; a loss that refuses
 * its second micro-batch, after the first added to gradients of an
 * earlier call) fails on every rank with that rank's code and leaves
 * every rank's gradients as they were; the group goes on. */
static void run_rank_refused(const struct dist_group_id *id, int rank, int W)
{
	struct engine_init_config cfg;
	struct engine *e = NULL;
	struct engine_status st;
	struct engine_step_result sr;
	struct eng_error err = {0};
	const struct fb_opts bad = {.reduce = true, .bad_id = rank == 0};
	const struct fb_opts late = {.reduce = true, .fail_call = rank == W - 1 ? 2 : 0};
	const struct fb_opts red = {.reduce = true};
	int s0 = rank * NSEQ / W, s1 = (rank + 1) * NSEQ / W;
	uint64_t grads;
	int rc;

	init_config(&cfg);
	dist_config(&cfg, id, rank, W, 60);
	CHILD_CHECK(engine_create(&cfg, &e, &err) == 0, "engine_create: %s", err.msg);
	CHILD_CHECK(fb_range(e, 0, s0, s1, (float)W, false, &err) == 0, "fb: %s", err.msg);
	/* With the gradients sharded (zero_stage 2, 3) they cannot be read
	 * whole: the step's norm below against one engine shows them. */
	grads = zero_stage >= 2 ? 0 : state_digest(e, true);

	rc = fb_call(e, 1, s0, s1, (float)W, false, &bad, &err);
	CHILD_CHECK(rc == -EINVAL && strstr(err.msg, rank == 0 ? "vocab" : "failed on rank 0"),
		    "bad id: %d %s", rc, err.msg);
	eng_error_clear(&err);
	CHILD_CHECK(zero_stage >= 2 || state_digest(e, true) == grads,
		    "gradients changed by a refused call");

	rc = fb_call(e, 1, s0, s1, (float)W, false, &late, &err);
	CHILD_CHECK(rc == -EINVAL && (rank == W - 1 ? strstr(err.msg, "refused") != NULL :
				      strstr(err.msg, "failed on rank") != NULL),
		    "late failure: %d %s", rc, err.msg);
	eng_error_clear(&err);
	CHILD_CHECK(zero_stage >= 2 || state_digest(e, true) == grads,
		    "gradients changed by a failed call");
	engine_status(e, &st);
	CHILD_CHECK(!st.dist_broken && st.accumulated_calls == 1, "status after refusals");

	CHILD_CHECK(fb_call(e, 1, s0, s1, (float)W, false, &red, &err) == 0, "fb: %s", err.msg);
	CHILD_CHECK(engine_optimizer_step(e, &sr, &err) == 0 && sr.step == 1, "step: %s",
		    err.msg);
	if (zero_stage >= 2) {
		/* The two calls that succeeded, and nothing of the refused ones:
		 * the norm of one engine fed both batches whole. */
		struct engine *ref = NULL;
		struct engine_step_result rr;

		init_config(&cfg);
		CHILD_CHECK(engine_create(&cfg, &ref, &err) == 0, "reference: %s", err.msg);
		CHILD_CHECK(fb_range(ref, 0, 0, NSEQ, 1.0f, false, &err) == 0 &&
			    fb_range(ref, 1, 0, NSEQ, 1.0f, false, &err) == 0 &&
			    engine_optimizer_step(ref, &rr, &err) == 0, "reference: %s", err.msg);
		CHILD_CHECK(fabs(sr.grad_norm - rr.grad_norm) <= 1e-5 * rr.grad_norm,
			    "grad norm %.9g, one engine %.9g", sr.grad_norm, rr.grad_norm);
		engine_destroy(ref);
	}
	engine_destroy(e);
	_exit(0);
}

static void new_group(int W, struct dist_group_id *id)
{
	const struct dist_ops *ops = dist_for_device("cpu");
	struct dist_config c = {.rank = 0, .world_size = W, .timeout_s = 60, .store_root = root};
	struct eng_error err = {0};

	ck_assert_int_eq(ops->create_id(&c, id, &err), 0);
}

/* Fork W ranks running fn; each must exit 0. */
static void run_group(int W, void (*fn)(const struct dist_group_id *, int, int))
{
	struct dist_group_id id;
	pid_t pids[4];

	new_group(W, &id);
	for (int r = 0; r < W; r++) {
		pids[r] = fork();
		ck_assert_int_ge(pids[r], 0);
		if (pids[r] == 0)
			fn(&id, r, W);
	}
	for (int r = 0; r < W; r++) {
		int status;

		ck_assert_int_eq(waitpid(pids[r], &status, 0), pids[r]);
		ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "rank %d failed", r);
	}
}

static void equivalence(int W)
{
	char first[32] = "", buf[32], path[300];

	run_group(W, run_rank);
	/* Every rank ends with the same parameters, bit for bit. */
	for (int r = 0; r < W; r++) {
		FILE *f;

		snprintf(path, sizeof(path), "%s/digest-%d", root, r);
		f = fopen(path, "r");
		ck_assert_ptr_nonnull(f);
		ck_assert_ptr_nonnull(fgets(buf, sizeof(buf), f));
		fclose(f);
		if (r == 0)
			snprintf(first, sizeof(first), "%s", buf);
		ck_assert_str_eq(buf, first);
	}
}

START_TEST(two_ranks_equal_one_engine)
{
	equivalence(2);
}
END_TEST

START_TEST(three_ranks_equal_one_engine)
{
	equivalence(3);
}
END_TEST

/* dist.zero_stage 2 and 3 (native_shard.c): the same equivalence, the
 * ranks running unequal numbers of 8-token micro-batches (5 + 3 tokens
 * against 7, 4, 5 at W = 2), and the same refusals (up front, and a loss
 * failing in a later micro-batch after earlier ones were reduced). */
START_TEST(sharded_ranks_equal_one_engine)
{
	for (zero_stage = 2; zero_stage <= 3; zero_stage++) {
		equivalence(2);
		equivalence(3);
	}
	zero_stage = 0;
}
END_TEST

/* ZeRO-3 with the parameters and the optimizer state offloaded (verl's
 * param_offload and optimizer_offload): each rank's slices live in host
 * memory between calls and move in around each call, and the group ends
 * bit for bit where the group that kept them resident ends. */
START_TEST(sharded_offloaded_equal_resident)
{
	char resident[32], path[300];
	FILE *f;

	zero_stage = 3;
	equivalence(2);
	snprintf(path, sizeof(path), "%s/digest-0", root);
	f = fopen(path, "r");
	ck_assert_ptr_nonnull(f);
	ck_assert_ptr_nonnull(fgets(resident, sizeof(resident), f));
	fclose(f);
	offload = true;
	equivalence(2);
	offload = false;
	zero_stage = 0;
	f = fopen(path, "r");
	ck_assert_ptr_nonnull(f);
	ck_assert_ptr_nonnull(fgets(path, sizeof(path), f));
	fclose(f);
	ck_assert_str_eq(path, resident);
}
END_TEST

START_TEST(sharded_refused_on_one_rank)
{
	for (zero_stage = 2; zero_stage <= 3; zero_stage++) {
		run_group(2, run_rank_refused);
		run_group(3, run_rank_refused);
	}
	zero_stage = 0;
}
END_TEST

START_TEST(checkpoints_two_ranks)
{
	run_group(2, run_rank_ckpt);
}
END_TEST

START_TEST(checkpoints_three_ranks)
{
	run_group(3, run_rank_ckpt);
}
END_TEST

START_TEST(reduce_in_backward_two_ranks)
{
	new_group(2, &second_id);
	run_group(2, run_rank_reduce);
}
END_TEST

START_TEST(reduce_in_backward_three_ranks)
{
	new_group(3, &second_id);
	run_group(3, run_rank_reduce);
}
END_TEST

START_TEST(reduce_refused_on_one_rank)
{
	run_group(2, run_rank_refused);
	run_group(3, run_rank_refused);
}
END_TEST

START_TEST(rank_never_arrives)
{
	struct engine_init_config cfg;
	struct dist_group_id id;
	struct engine *e = (struct engine *)0x1;
	struct eng_error err = {0};
	int rc;

	new_group(2, &id);
	init_config(&cfg);
	dist_config(&cfg, &id, 0, 2, 1.5);
	rc = engine_create(&cfg, &e, &err);
	ck_assert_msg(rc == -ETIMEDOUT, "rc %d: %s", rc, err.msg);
	ck_assert_ptr_eq(e, (struct engine *)0x1);
	ck_assert(err.msg[0]);
}
END_TEST

/* Rank 0 of a group of 2 whose rank 1 joined and then exited (without a
 * step: its connections closed); collectives time out after 5 s. */
static struct engine *survivor_of_two(void)
{
	struct engine_init_config cfg;
	struct dist_group_id id;
	struct engine *e = NULL;
	struct eng_error err = {0};
	pid_t pid;
	int status;

	new_group(2, &id);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		int rank = 1;

		init_config(&cfg);
		dist_config(&cfg, &id, 1, 2, 60);
		CHILD_CHECK(engine_create(&cfg, &e, &err) == 0, "engine_create: %s", err.msg);
		_exit(0);
	}
	init_config(&cfg);
	dist_config(&cfg, &id, 0, 2, 5);
	ck_assert_msg(engine_create(&cfg, &e, &err) == 0, "%s", err.msg);
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	return e;
}

START_TEST(rank_dies)
{
	struct engine *e = survivor_of_two();
	struct engine_step_result sr;
	struct engine_status st;
	struct eng_error err = {0};
	uint64_t before;
	int rc;

	ck_assert_int_eq(fb_range(e, 0, 0, 2, 2.0f, false, &err), 0);
	before = state_digest(e, false);
	rc = engine_optimizer_step(e, &sr, &err);
	ck_assert_msg(rc == -ECONNRESET || rc == -ETIMEDOUT, "rc %d: %s", rc, err.msg);
	engine_status(e, &st);
	ck_assert(st.dist_broken);
	ck_assert_uint_eq(state_digest(e, false), before);
	ck_assert_uint_eq(st.accumulated_calls, 0);
	eng_error_clear(&err);
	ck_assert_int_eq(fb_range(e, 1, 0, 2, 2.0f, false, &err), 0);
	rc = engine_optimizer_step(e, &sr, &err);
	ck_assert_msg(rc == -ENOTCONN, "rc %d: %s", rc, err.msg);
	ck_assert_uint_eq(state_digest(e, false), before);
	/* Forward passes need no group. */
	eng_error_clear(&err);
	ck_assert_int_eq(fb_range(e, 1, 0, NSEQ, 1.0f, true, &err), 0);
	engine_destroy(e);
}
END_TEST

/* A reducing call whose peer died: it fails fast with the peer's loss
 * (at the agreement, before any reduction), the gradients as they were,
 * the group broken; forward passes go on. */
START_TEST(reduce_rank_dies)
{
	struct engine *e = survivor_of_two();
	struct engine_status st;
	struct eng_error err = {0};
	const struct fb_opts red = {.reduce = true};
	uint64_t grads;
	int rc;

	ck_assert_int_eq(fb_range(e, 0, 0, 2, 2.0f, false, &err), 0);
	grads = state_digest(e, true);
	rc = fb_call(e, 1, 0, 5, 2.0f, false, &red, &err);
	ck_assert_msg(rc == -ECONNRESET || rc == -ETIMEDOUT, "rc %d: %s", rc, err.msg);
	ck_assert_uint_eq(state_digest(e, true), grads);
	engine_status(e, &st);
	ck_assert(st.dist_broken && st.accumulated_calls == 1);
	eng_error_clear(&err);
	rc = fb_call(e, 1, 0, 5, 2.0f, false, &red, &err);
	ck_assert_msg(rc == -ENOTCONN, "rc %d: %s", rc, err.msg);
	ck_assert_uint_eq(state_digest(e, true), grads);
	eng_error_clear(&err);
	ck_assert_int_eq(fb_range(e, 1, 0, NSEQ, 1.0f, true, &err), 0);
	engine_destroy(e);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("engine_dist");
	TCase *tc = tcase_create("gloo");

	if (!dist_for_device("cpu")) {
		printf("no collective backend for the CPU in this build (%s)\n", dist_names());
		return 77;
	}
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 240);
	tcase_add_test(tc, two_ranks_equal_one_engine);
	tcase_add_test(tc, three_ranks_equal_one_engine);
	tcase_add_test(tc, checkpoints_two_ranks);
	tcase_add_test(tc, checkpoints_three_ranks);
	tcase_add_test(tc, reduce_in_backward_two_ranks);
	tcase_add_test(tc, reduce_in_backward_three_ranks);
	tcase_add_test(tc, reduce_refused_on_one_rank);
	tcase_add_test(tc, sharded_ranks_equal_one_engine);
	tcase_add_test(tc, sharded_offloaded_equal_resident);
	tcase_add_test(tc, sharded_refused_on_one_rank);
	tcase_add_test(tc, rank_never_arrives);
	tcase_add_test(tc, rank_dies);
	tcase_add_test(tc, reduce_rank_dies);
	suite_add_tcase(s, tc);
	return check_run(s);
}
