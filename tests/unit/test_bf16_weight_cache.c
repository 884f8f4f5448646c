/* test_bf16_weight_cache.c — MATMUL_BF16 rounds the parameter region once
 * per param_version: products with a weight inside the region match the
 * per-call rounding exactly, follow new values only after a version bump
 * (the contract the engine keeps), AdamW over the whole region refreshes
 * the copy in its own pass (and an update of a slice marks nothing), and
 * an engine that trained in bf16 gives the same log-probs as a fresh
 * engine loaded from its checkpoint; the engine shows the copy (to the
 * weight stream) only while it is current; an fp32 engine keeps one once
 * asked (engine_keep_params_bf16); and a lent copy
 * (engine_lend_params_bf16, ShareWeights) is a sealed file holding exactly
 * those values that no later step, load or product changes. */
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cpu_test_util.h"
#include "io/safetensors.h"
#include "test_helpers.h"

#define M 8
#define K 24
#define N 16

/* C[M,N] = A[M,K] W[N,K]^T with W at `w` inside or outside the region. */
static void product(struct device *dev, const float *A, const float *W, float *C)
{
	ck_assert_int_eq(dev->k->gemm(dev, false, true, M, N, K, A, K, W, K, 0.0f, C, N), 0);
}

/* The product with W in the region (its cached copy) equals the product
 * with W's current values rounded per call (copied to `outside`). */
static void expect_current(struct device *dev, const float *A, const float *W, float *outside)
{
	float C0[M * N], C1[M * N];

	product(dev, A, W, C1);
	memcpy(outside, W, N * K * sizeof(float));
	product(dev, A, outside, C0);
	ck_assert_mem_eq(C0, C1, sizeof(C0));
}

START_TEST(region_rounded_once_per_version)
{
	struct device *dev = tu_open(2, MATMUL_BF16);
	float *region = dev->ops->alloc(dev, 3 * N * K * sizeof(float));
	float *outside = dev->ops->alloc(dev, N * K * sizeof(float));
	float A[M * K], C0[M * N], C1[M * N];
	float *W = region + N * K;   /* the middle tensor of the region */

	tu_seed(5);
	tu_fill(A, M * K, -1.0f, 1.0f);
	tu_fill(region, 3 * N * K, -1.0f, 1.0f);
	memcpy(outside, W, N * K * sizeof(float));
	dev->param_base = region;
	dev->param_bytes = 3 * N * K * sizeof(float);
	dev->param_version = 1;

	/* cached (inside) and per-call (outside) rounding agree bit for bit */
	product(dev, A, W, C0);
	product(dev, A, outside, C1);
	ck_assert_mem_eq(C0, C1, sizeof(C0));

	/* new values without a bump: the cached copy is used (contract) */
	for (int i = 0; i < N * K; i++)
		W[i] += 0.25f;
	product(dev, A, W, C1);
	ck_assert_mem_eq(C0, C1, sizeof(C0));
	/* after the bump the product follows the new values */
	dev->param_version++;
	expect_current(dev, A, W, outside);
	dev->ops->free(dev, region);
	dev->ops->free(dev, outside);
	tu_close(dev);
}
END_TEST

/* The region spans several AdamW chunks and ends mid-chunk; W is its
 * last tensor. */
#define LEAD 17001

static void adamw(struct device *dev, float *p, float *g, float *m, float *v, int64_t n)
{
	ck_assert_int_eq(dev->k->adamw(dev, p, g, m, v, n, 1e-2, 0.9, 0.999, 1e-8, 0.01, 1, 1.0f),
			 0);
}

START_TEST(adamw_refreshes_the_copy)
{
	struct device *dev = tu_open(2, MATMUL_BF16);
	int64_t total = LEAD + N * K;
	size_t bytes = (size_t)total * sizeof(float);
	float *region = dev->ops->alloc(dev, bytes), *g = dev->ops->alloc(dev, bytes);
	float *m = dev->ops->alloc(dev, bytes), *v = dev->ops->alloc(dev, bytes);
	float *outside = dev->ops->alloc(dev, N * K * sizeof(float));
	float A[M * K], C0[M * N], C1[M * N], before[N * K];
	float *W0 = region, *W = region + LEAD;

	tu_seed(6);
	tu_fill(A, M * K, -1.0f, 1.0f);
	tu_fill(region, total, -1.0f, 1.0f);
	tu_fill(g, total, -1.0f, 1.0f);
	memset(m, 0, bytes);
	memset(v, 0, bytes);
	dev->param_base = region;
	dev->param_bytes = bytes;
	dev->param_version = 1;
	product(dev, A, W, C0);   /* the copy exists */

	/* the whole region: the copy holds AdamW's result without a sweep
	 * (values changed afterwards without a bump stay unseen) */
	memcpy(before, W, sizeof(before));
	dev->param_version++;
	adamw(dev, region, g, m, v, total);
	memcpy(outside, W, N * K * sizeof(float));
	for (int i = 0; i < N * K; i++)
		W[i] += 0.25f;
	product(dev, A, W, C1);
	product(dev, A, outside, C0);
	ck_assert_mem_eq(C0, C1, sizeof(C0));
	ck_assert_msg(memcmp(before, outside, sizeof(before)) != 0, "AdamW changed nothing");

	/* a slice (ZeRO-1's shard): nothing is marked, so a tensor outside the
	 * slice that changed under the same bump is rounded again */
	dev->param_version++;
	for (int i = 0; i < N * K; i++)
		W0[i] -= 0.5f;
	tu_fill(g, total, -1.0f, 1.0f);
	adamw(dev, W, g + LEAD, m + LEAD, v + LEAD, N * K);
	expect_current(dev, A, W0, outside);
	dev->ops->free(dev, region);
	dev->ops->free(dev, g);
	dev->ops->free(dev, m);
	dev->ops->free(dev, v);
	dev->ops->free(dev, outside);
	tu_close(dev);
}
END_TEST

/* Two sequences of 9 and 7 tokens, ids[i] = (i * mul + add) % 97, with
 * given log-prob gradients (i % g) / g - off: `train` runs them with those
 * gradients, `fwd` forward only. */
struct two_seqs {
	int32_t lens[2], ids[16];
	float gl[16];
	struct given_grads gg;
	struct engine_batch train, fwd;
};

static void two_seqs_init(struct two_seqs *b, int mul, int add, int g, float off)
{
	memset(b, 0, sizeof(*b));
	b->lens[0] = 9;
	b->lens[1] = 7;
	for (int i = 0; i < 16; i++) {
		b->ids[i] = (i * mul + add) % 97;
		b->gl[i] = (float)(i % g) / (float)g - off;
	}
	b->gg.g_logp = b->gl;
	b->train = (struct engine_batch){.n = 16, .input_ids = b->ids, .num_seqs = 2,
					 .seq_lens = b->lens, .loss_fn = given_loss,
					 .loss_ctx = &b->gg};
	b->fwd = (struct engine_batch){.n = 16, .input_ids = b->ids, .num_seqs = 2,
				       .seq_lens = b->lens, .forward_only = true};
}

START_TEST(trained_engine_matches_reloaded)
{
	struct engine_init_config cfg;
	struct eng_error err = {0};
	struct engine *a, *b;
	char root[] = "/tmp/engined-bf16-XXXXXX", dir[64], cmd[96];
	float la[16], lb[16];
	struct engine_fb_result r = {0}, ra = {.log_probs = la}, rb = {.log_probs = lb};
	struct engine_step_result sr;
	struct two_seqs sq;

	two_seqs_init(&sq, 29, 3, 5, 0.4f);
	engine_init_config_defaults(&cfg);
	cfg.hf_config_json = TINY_QWEN2;
	cfg.bf16_matmul = true;
	cfg.optim.lr = 1e-2;
	ck_assert_int_eq(engine_create(&cfg, &a, &err), 0);
	/* resident in TRAIN: only the optimizer step can refresh the copy */
	ck_assert_int_eq(engine_set_mode(a, ENGINE_MODE_TRAIN, false, &err), 0);
	ck_assert_int_eq(engine_forward_backward(a, &sq.fwd, &ra, &err), 0);
	for (int s = 0; s < 3; s++) {
		ck_assert_int_eq(engine_forward_backward(a, &sq.train, &r, &err), 0);
		ck_assert_int_eq(engine_optimizer_step(a, &sr, &err), 0);
	}
	ck_assert_int_eq(engine_forward_backward(a, &sq.fwd, &rb, &err), 0);
	ck_assert_msg(memcmp(la, lb, sizeof(la)) != 0, "training changed nothing");

	ck_assert_ptr_nonnull(mkdtemp(root));
	snprintf(dir, sizeof(dir), "%s/ck", root);
	ck_assert_int_eq(engine_save_checkpoint(a, dir, 3, 0, CKPT_MODEL, NULL, &err), 0);
	cfg.seed = 77;
	ck_assert_int_eq(engine_create(&cfg, &b, &err), 0);
	/* resident in EVAL: no per-call placement refreshes the copy, so only
	 * the load itself can tell the device that the weights changed */
	ck_assert_int_eq(engine_set_mode(b, ENGINE_MODE_EVAL, false, &err), 0);
	ck_assert_int_eq(engine_forward_backward(b, &sq.fwd, &ra, &err), 0);   /* caches old weights */
	ck_assert_int_eq(engine_load_checkpoint(b, dir, CKPT_MODEL, NULL, &err), 0);
	ck_assert_int_eq(engine_forward_backward(b, &sq.fwd, &ra, &err), 0);
	ck_assert_mem_eq(la, lb, sizeof(la));
	engine_destroy(a);
	engine_destroy(b);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* engine_param_info's host_bf16 of every parameter: NULL, or exactly its
 * fp32 values rounded by engines/io (what the weight stream sends). */
static int copy_state(struct engine *e)
{
	int64_t n = engine_num_params(e), have = 0;

	for (int64_t i = 0; i < n; i++) {
		struct engine_param_view v;
		uint16_t *ref;

		ck_assert_int_eq(engine_param_info(e, i, &v, NULL), 0);
		if (!v.host_bf16)
			continue;
		ck_assert_ptr_nonnull(v.host_data);
		ref = malloc((size_t)v.numel * sizeof(*ref));
		f32_to_bf16_n(v.host_data, ref, (size_t)v.numel);
		ck_assert_msg(memcmp(ref, v.host_bf16, (size_t)v.numel * sizeof(*ref)) == 0,
			      "%s: the bf16 copy is not its values rounded", v.name);
		free(ref);
		have++;
	}
	ck_assert_msg(have == 0 || have == n, "%lld of %lld parameters have a copy",
		      (long long)have, (long long)n);
	return have == n && n > 0;
}

/* The copy is exposed only while it holds the current values: none before
 * the first bf16 product, current after one and after an optimizer step
 * over the whole region, none after a load until the next product; never
 * in an fp32 engine. */
START_TEST(engine_exposes_the_current_copy)
{
	struct engine_init_config cfg;
	struct eng_error err = {0};
	struct engine *e;
	char root[] = "/tmp/engined-bf16v-XXXXXX", dir[64], cmd[96];
	struct engine_fb_result r = {0};
	struct engine_step_result sr;
	struct two_seqs sq;

	two_seqs_init(&sq, 31, 5, 3, 0.3f);
	engine_init_config_defaults(&cfg);
	cfg.hf_config_json = TINY_QWEN2;
	cfg.optim.lr = 1e-2;
	for (int bf16 = 0; bf16 < 2; bf16++) {
		cfg.bf16_matmul = bf16;
		ck_assert_int_eq(engine_create(&cfg, &e, &err), 0);
		/* resident, as a controller's training loop keeps it (placement
		 * changes are parameter changes too) */
		ck_assert_int_eq(engine_set_mode(e, ENGINE_MODE_TRAIN, false, &err), 0);
		ck_assert_int_eq(copy_state(e), 0);
		ck_assert_int_eq(engine_forward_backward(e, &sq.train, &r, &err), 0);
		ck_assert_int_eq(copy_state(e), bf16);
		ck_assert_ptr_nonnull(mkdtemp(strcpy(root, "/tmp/engined-bf16v-XXXXXX")));
		snprintf(dir, sizeof(dir), "%s/ck", root);
		ck_assert_int_eq(engine_save_checkpoint(e, dir, 0, 0, CKPT_MODEL, NULL, &err), 0);
		ck_assert_int_eq(engine_optimizer_step(e, &sr, &err), 0);
		ck_assert_int_eq(copy_state(e), bf16);
		ck_assert_int_eq(engine_load_checkpoint(e, dir, CKPT_MODEL, NULL, &err), 0);
		ck_assert_int_eq(copy_state(e), 0);
		ck_assert_int_eq(engine_forward_backward(e, &sq.train, &r, &err), 0);
		ck_assert_int_eq(copy_state(e), bf16);
		engine_destroy(e);
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
		ck_assert_int_eq(system(cmd), 0);
	}
}
END_TEST

/* A lent file: sealed for good, of the parameters' size, every
 * parameter's host_bf16 inside it at its byte offset with the values the
 * engine shows; returns a private copy of its bytes. */
static uint8_t *check_lent(struct engine *e, const struct engine_lent_file *f)
{
	int64_t n = engine_num_params(e), numel = 0;
	int want = F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
	struct stat sb;
	uint8_t *map, *snap;

	ck_assert_int_ge(f->fd, 0);
	ck_assert_int_eq(fcntl(f->fd, F_GET_SEALS) & want, want);
	ck_assert_int_eq(fstat(f->fd, &sb), 0);
	ck_assert_int_eq(sb.st_size, f->bytes);
	map = mmap(NULL, (size_t)f->bytes, PROT_READ, MAP_PRIVATE, f->fd, 0);
	ck_assert_ptr_ne(map, MAP_FAILED);
	ck_assert_int_eq(copy_state(e), 1);
	for (int64_t i = 0; i < n; i++) {
		struct engine_param_view v;
		int64_t off;

		ck_assert_int_eq(engine_param_info(e, i, &v, NULL), 0);
		off = (int64_t)(v.host_bf16 - f->base) * 2;
		ck_assert_int_ge(off, 0);
		ck_assert_int_le(off + v.numel * 2, f->bytes);
		ck_assert_mem_eq(map + off, v.host_bf16, (size_t)v.numel * 2);
		numel += v.numel;
	}
	ck_assert_int_eq(f->bytes, numel * 2);
	/* nobody can write it: not through the descriptor, not by a mapping */
	ck_assert_int_eq(pwrite(f->fd, map, 2, 0), -1);
	ck_assert_int_eq(errno, EPERM);
	ck_assert_ptr_eq(mmap(NULL, (size_t)f->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, f->fd,
			      0), MAP_FAILED);
	snap = malloc((size_t)f->bytes);
	memcpy(snap, map, (size_t)f->bytes);
	munmap(map, (size_t)f->bytes);
	return snap;
}

/* The file's bytes now. */
static void expect_file(int fd, const uint8_t *want, int64_t bytes)
{
	uint8_t *map = mmap(NULL, (size_t)bytes, PROT_READ, MAP_PRIVATE, fd, 0);

	ck_assert_ptr_ne(map, MAP_FAILED);
	ck_assert_msg(memcmp(map, want, (size_t)bytes) == 0, "a lent file changed");
	munmap(map, (size_t)bytes);
}

/* Lending in a bf16 engine (the copy of its products) and an fp32 one
 * (made by the lend, then kept current by AdamW): the same file until the
 * parameters change, products unchanged by the lend, a new file after a
 * step (the lent one as it was), the copy stale after a load until the
 * next lend. */
START_TEST(lent_copy_never_changes)
{
	struct engine_init_config cfg;
	struct eng_error err = {0};
	struct engine *e;
	char root[] = "/tmp/engined-lend-XXXXXX", dir[64], cmd[96];
	float la[16], lb[16];
	struct engine_fb_result r = {0}, ra = {.log_probs = la}, rb = {.log_probs = lb};
	struct engine_step_result sr;
	struct two_seqs sq;

	two_seqs_init(&sq, 37, 11, 4, 0.3f);
	engine_init_config_defaults(&cfg);
	cfg.hf_config_json = TINY_QWEN2;
	cfg.optim.lr = 1e-2;
	for (int bf16 = 0; bf16 < 2; bf16++) {
		struct engine_lent_file f1, f2, f3;
		struct stat s1, s2;
		uint8_t *b1, *b3;

		cfg.bf16_matmul = bf16;
		ck_assert_int_eq(engine_create(&cfg, &e, &err), 0);
		ck_assert_int_eq(engine_set_mode(e, ENGINE_MODE_TRAIN, false, &err), 0);
		ck_assert_int_eq(engine_forward_backward(e, &sq.fwd, &ra, &err), 0);
		ck_assert_int_eq(copy_state(e), bf16);
		ck_assert_int_eq(engine_lend_params_bf16(e, &f1, &err), 0);
		b1 = check_lent(e, &f1);
		ck_assert_int_eq(engine_forward_backward(e, &sq.fwd, &rb, &err), 0);
		ck_assert_mem_eq(la, lb, sizeof(la));
		ck_assert_int_eq(engine_lend_params_bf16(e, &f2, &err), 0);
		ck_assert_int_eq(fstat(f1.fd, &s1), 0);
		ck_assert_int_eq(fstat(f2.fd, &s2), 0);
		ck_assert_msg(s1.st_ino == s2.st_ino && f1.base == f2.base,
			      "nothing changed, yet a second file");
		close(f2.fd);

		ck_assert_int_eq(engine_forward_backward(e, &sq.train, &r, &err), 0);
		ck_assert_int_eq(engine_optimizer_step(e, &sr, &err), 0);
		ck_assert_int_eq(copy_state(e), 1);    /* AdamW wrote a new copy */
		expect_file(f1.fd, b1, f1.bytes);
		ck_assert_int_eq(engine_lend_params_bf16(e, &f3, &err), 0);
		ck_assert_ptr_ne(f3.base, f1.base);
		b3 = check_lent(e, &f3);
		ck_assert_msg(memcmp(b1, b3, (size_t)f1.bytes) != 0, "the step changed nothing");
		close(f3.fd);

		/* a load: stale until lent again; the lent files as they were */
		ck_assert_ptr_nonnull(mkdtemp(strcpy(root, "/tmp/engined-lend-XXXXXX")));
		snprintf(dir, sizeof(dir), "%s/ck", root);
		ck_assert_int_eq(engine_save_checkpoint(e, dir, 0, 0, CKPT_MODEL, NULL, &err), 0);
		ck_assert_int_eq(engine_forward_backward(e, &sq.train, &r, &err), 0);
		ck_assert_int_eq(engine_optimizer_step(e, &sr, &err), 0);
		ck_assert_int_eq(engine_load_checkpoint(e, dir, CKPT_MODEL, NULL, &err), 0);
		ck_assert_int_eq(copy_state(e), 0);
		ck_assert_int_eq(engine_lend_params_bf16(e, &f3, &err), 0);
		free(check_lent(e, &f3));
		expect_file(f1.fd, b1, f1.bytes);
		close(f3.fd);
		close(f1.fd);
		free(b1);
		free(b3);
		engine_destroy(e);
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
		ck_assert_int_eq(system(cmd), 0);
	}
}
END_TEST

/* An fp32 engine has no copy until asked to keep one; from then on AdamW
 * keeps it current (no second rounding sweep: the values are checked). */
START_TEST(fp32_engine_keeps_the_copy_once_asked)
{
	struct engine_init_config cfg;
	struct eng_error err = {0};
	struct engine *e;
	struct engine_fb_result r = {0};
	struct engine_step_result sr;
	struct two_seqs sq;

	two_seqs_init(&sq, 13, 1, 3, 0.2f);
	engine_init_config_defaults(&cfg);
	cfg.hf_config_json = TINY_QWEN2;
	cfg.optim.lr = 1e-2;
	ck_assert_int_eq(engine_create(&cfg, &e, &err), 0);
	ck_assert_int_eq(engine_set_mode(e, ENGINE_MODE_TRAIN, false, &err), 0);
	ck_assert_int_eq(engine_forward_backward(e, &sq.train, &r, &err), 0);
	ck_assert_int_eq(engine_optimizer_step(e, &sr, &err), 0);
	ck_assert_int_eq(copy_state(e), 0);
	ck_assert_int_eq(engine_keep_params_bf16(e, &err), 0);
	ck_assert_int_eq(copy_state(e), 1);
	for (int s = 0; s < 2; s++) {
		ck_assert_int_eq(engine_forward_backward(e, &sq.train, &r, &err), 0);
		ck_assert_int_eq(engine_optimizer_step(e, &sr, &err), 0);
		ck_assert_int_eq(copy_state(e), 1);
	}
	engine_destroy(e);
}
END_TEST

/* An engine whose parameters are not in host memory lends nothing. */
START_TEST(lend_needs_host_memory)
{
	struct engine_init_config cfg;
	struct eng_error err = {0};
	struct engine *e;
	struct engine_lent_file f;

	setenv("ENGINED_CPU_DISCRETE", "1", 1);
	engine_init_config_defaults(&cfg);
	cfg.hf_config_json = TINY_QWEN2;
	cfg.bf16_matmul = true;
	ck_assert_int_eq(engine_create(&cfg, &e, &err), 0);
	ck_assert_int_eq(engine_set_mode(e, ENGINE_MODE_TRAIN, false, &err), 0);
	ck_assert_int_eq(engine_lend_params_bf16(e, &f, &err), -ENOTSUP);
	ck_assert_msg(strstr(err.msg, "bf16 copy"), "%s", err.msg);
	ck_assert_int_eq(engine_keep_params_bf16(e, &err), -ENOTSUP);
	ck_assert_int_eq(copy_state(e), 0);
	engine_destroy(e);
	unsetenv("ENGINED_CPU_DISCRETE");
}
END_TEST

int main(void)
{
	Suite *s = suite_create("bf16_weight_cache");
	TCase *tc = tcase_create("core");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, region_rounded_once_per_version);
	tcase_add_test(tc, adamw_refreshes_the_copy);
	tcase_add_test(tc, trained_engine_matches_reloaded);
	tcase_add_test(tc, engine_exposes_the_current_copy);
	tcase_add_test(tc, lent_copy_never_changes);
	tcase_add_test(tc, fp32_engine_keeps_the_copy_once_asked);
	tcase_add_test(tc, lend_needs_host_memory);
	suite_add_tcase(s, tc);
	return check_run(s);
}
