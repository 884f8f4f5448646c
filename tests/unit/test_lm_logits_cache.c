/* test_lm_logits_cache.c — the LM head's logits kept from a training
 * forward for the backward (engines/model/llama.c, "logits cache"):
 * gradients and outputs are bit for bit those of the recomputing backward
 * (tied and untied heads, several row blocks and vocabulary chunks, a
 * last row block shorter than the others, a pass shorter than the
 * reservation), the backward really skips the recompute (one product
 * fewer per tile), the budget is T x V floats exactly, the arena counts
 * the cache, and value models (no LM head) are unchanged; through the
 * engine, lm_cache_floats reaches the model (-1: never) and is checked. */
#include <stdio.h>

#include "cpu_test_util.h"
#include "model/llama.h"
#include "test_helpers.h"

/* A qwen2 of 2 layers whose vocabulary needs three chunks of the tile
 * below (2048 + 2048 + 904 columns). */
static const char *const CFG_FMT =
	"{\"model_type\": \"qwen2\", \"vocab_size\": 5000, \"hidden_size\": 32,"
	" \"intermediate_size\": 48, \"num_hidden_layers\": 2,"
	" \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
	" \"rms_norm_eps\": 1e-6, \"rope_theta\": 10000.0,"
	" \"tie_word_embeddings\": %s, \"max_position_embeddings\": 512}";
#define VOCAB 5000
/* 4 rows x 2048 columns (llama.c: lm_rows = tile / 2048) */
#define TILE (4 * 2048)
/* Two sequences, 10 tokens: row blocks of 4, 4 and 2 rows. */
#define NTOK 10
#define TILES_PER_PASS (3 * 3)

/* The device's gemm, counted: the backward's products with and without
 * the cache differ by the recomputed tiles. */
static int (*real_gemm)(struct device *, bool, bool, int64_t, int64_t, int64_t,
			const float *, int64_t, const float *, int64_t, float, float *,
			int64_t);
static int gemm_calls;

static int counting_gemm(struct device *dev, bool ta, bool tb, int64_t M, int64_t N,
			 int64_t K, const float *A, int64_t lda, const float *B, int64_t ldb,
			 float beta, float *C, int64_t ldc)
{
	gemm_calls++;
	return real_gemm(dev, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
}

struct fixture {
	struct device *dev;
	const struct kernel_table *k;  /* the device's own */
	struct kernel_table kt;        /* a copy of it, gemm counted */
	struct model_config cfg;
	struct param_table table;
	struct layer_weights wl[2], gl[2];
	float *params, *grads;         /* [total] */
	struct llama_model m;
	/* the batch, device memory (host memory on the CPU) */
	int32_t *ids, *pos, *cu, *targets;
	float *dlogp, *dent, *logp, *ent;
};

static void fixture_open(struct fixture *f, bool tied, bool value_model)
{
	char json[1024];
	struct eng_error err = {0};
	int32_t lens[2] = {6, 4};

	memset(f, 0, sizeof(*f));
	f->dev = tu_open(2, MATMUL_FP32);
	f->k = f->dev->k;
	f->kt = *f->k;
	real_gemm = f->kt.gemm;
	f->kt.gemm = counting_gemm;
	f->dev->k = &f->kt;
	snprintf(json, sizeof(json), CFG_FMT, tied ? "true" : "false");
	ck_assert_int_eq(model_config_parse(json, &f->cfg, &err), 0);
	ck_assert_int_eq(model_config_set_head(&f->cfg, value_model, &err), 0);
	ck_assert_int_eq(param_table_build(&f->cfg, value_model, &f->table, &err), 0);
	f->params = tu_falloc(f->dev, f->table.total);
	f->grads = tu_falloc(f->dev, f->table.total);
	tu_seed(tied ? 11 : 12);
	tu_fill(f->params, f->table.total, -0.2f, 0.2f);
	f->m.w.layers = f->wl;
	model_weights_bind(&f->table, &f->cfg, f->params, &f->m.w);
	f->m.g.layers = f->gl;
	model_weights_bind(&f->table, &f->cfg, f->grads, &f->m.g);
	ck_assert_int_eq(llama_init(&f->m, f->dev, &f->cfg, value_model, &err), 0);
	f->m.lm_tile = TILE;

	f->ids = (int32_t *)tu_falloc(f->dev, NTOK);
	f->pos = (int32_t *)tu_falloc(f->dev, NTOK);
	f->targets = (int32_t *)tu_falloc(f->dev, NTOK);
	f->cu = (int32_t *)tu_falloc(f->dev, 3);
	f->dlogp = tu_falloc(f->dev, NTOK);
	f->dent = tu_falloc(f->dev, NTOK);
	f->logp = tu_falloc(f->dev, NTOK);
	f->ent = tu_falloc(f->dev, NTOK);
	f->cu[0] = 0;
	for (int s = 0, t = 0; s < 2; s++) {
		f->cu[s + 1] = f->cu[s] + lens[s];
		for (int i = 0; i < lens[s]; i++, t++)
			f->pos[t] = i;
	}
	for (int t = 0; t < NTOK; t++)
		f->ids[t] = (int32_t)(tu_u64() % VOCAB);
	for (int t = 0; t < NTOK; t++)
		f->targets[t] = t + 1 < NTOK && f->pos[t + 1] != 0 ? f->ids[t + 1] : -1;
	tu_fill(f->dlogp, NTOK, -1.0f, 1.0f);
	tu_fill(f->dent, NTOK, -0.5f, 0.5f);   /* the entropy's backward too */
}

static void fixture_close(struct fixture *f)
{
	llama_release(&f->m);
	f->dev->ops->free(f->dev, f->params);
	f->dev->ops->free(f->dev, f->grads);
	f->dev->ops->free(f->dev, f->ids);
	f->dev->ops->free(f->dev, f->pos);
	f->dev->ops->free(f->dev, f->targets);
	f->dev->ops->free(f->dev, f->cu);
	f->dev->ops->free(f->dev, f->dlogp);
	f->dev->ops->free(f->dev, f->dent);
	f->dev->ops->free(f->dev, f->logp);
	f->dev->ops->free(f->dev, f->ent);
	param_table_free(&f->table);
	f->dev->k = f->k;
	tu_close(f->dev);
}

struct pass_out {
	float *grads;          /* [total], malloc'd */
	float logp[NTOK], ent[NTOK];
	int bwd_gemms;         /* products made by llama_backward */
	bool cached;           /* the reservation kept the logits */
};

/* Reserve for `cap` tokens with a budget of `cache` floats, then one
 * training forward + backward over the first `n` tokens (whole
 * sequences) from zero gradients. */
static void pass(struct fixture *f, int64_t cache, int64_t cap, int64_t n, struct pass_out *o)
{
	struct eng_error err = {0};
	struct llama_batch b = { .T = n, .B = n == NTOK ? 2 : 1, .ids = f->ids, .pos = f->pos,
				 .cu_seqlens = f->cu, .targets = f->targets };

	f->m.lm_cache = cache;
	ck_assert_int_eq(llama_reserve(&f->m, cap, true, &err), 0);
	memset(f->grads, 0, (size_t)f->table.total * sizeof(float));
	ck_assert_int_eq(llama_forward(&f->m, &b, 1.0f / 0.7f, true, f->logp, f->ent, NULL), 0);
	gemm_calls = 0;
	ck_assert_int_eq(llama_backward(&f->m, &b, 1.0f / 0.7f, f->dlogp, f->dent, NULL), 0);
	o->bwd_gemms = gemm_calls;
	o->cached = f->m.cap_lm_cache;
	o->grads = malloc((size_t)f->table.total * sizeof(float));
	ck_assert_ptr_nonnull(o->grads);
	memcpy(o->grads, f->grads, (size_t)f->table.total * sizeof(float));
	memcpy(o->logp, f->logp, sizeof(o->logp));
	memcpy(o->ent, f->ent, sizeof(o->ent));
}

/* The two passes agree bit for bit, and the cached one made one product
 * fewer per tile. */
static void expect_same(const struct fixture *f, const struct pass_out *kept,
			const struct pass_out *recomputed, int tiles)
{
	ck_assert(kept->cached);
	ck_assert(!recomputed->cached);
	ck_assert_mem_eq(kept->grads, recomputed->grads, (size_t)f->table.total * sizeof(float));
	ck_assert_mem_eq(kept->logp, recomputed->logp, sizeof(kept->logp));
	ck_assert_mem_eq(kept->ent, recomputed->ent, sizeof(kept->ent));
	ck_assert_int_eq(recomputed->bwd_gemms - kept->bwd_gemms, tiles);
}

static void same_gradients(bool tied)
{
	struct fixture f;
	struct pass_out kept, recomputed;
	bool nonzero = false;

	fixture_open(&f, tied, false);
	pass(&f, LLAMA_LM_CACHE_DEFAULT, NTOK, NTOK, &kept);
	pass(&f, 0, NTOK, NTOK, &recomputed);
	expect_same(&f, &kept, &recomputed, TILES_PER_PASS);
	for (int64_t i = 0; i < f.table.total && !nonzero; i++)
		nonzero = kept.grads[i] != 0.0f;
	ck_assert_msg(nonzero, "no gradient reached the parameters");
	free(kept.grads);
	free(recomputed.grads);

	/* a micro-batch shorter than the call's longest (the first sequence,
	 * 6 tokens: row blocks of 4 and 2, under a reservation of NTOK) */
	pass(&f, LLAMA_LM_CACHE_DEFAULT, NTOK, 6, &kept);
	pass(&f, 0, NTOK, 6, &recomputed);
	expect_same(&f, &kept, &recomputed, 2 * 3);
	free(kept.grads);
	free(recomputed.grads);
	fixture_close(&f);
}

START_TEST(untied_head_same_gradients)
{
	same_gradients(false);
}
END_TEST

START_TEST(tied_head_same_gradients)
{
	same_gradients(true);
}
END_TEST

/* The budget is T x V floats: exactly that keeps the logits, one float
 * less recomputes them; the arena grows by the cache, less the tile it
 * replaces; forward-only passes never keep them. */
START_TEST(budget_and_arena)
{
	struct fixture f;
	struct eng_error err = {0};
	size_t with, without;

	fixture_open(&f, false, false);
	f.m.lm_cache = (int64_t)NTOK * VOCAB;
	with = llama_activation_bytes(&f.m, NTOK, true);
	ck_assert_int_eq(llama_reserve(&f.m, NTOK, true, &err), 0);
	ck_assert(f.m.cap_lm_cache);
	f.m.lm_cache = (int64_t)NTOK * VOCAB - 1;
	without = llama_activation_bytes(&f.m, NTOK, true);
	ck_assert_int_eq(llama_reserve(&f.m, NTOK, true, &err), 0);
	ck_assert(!f.m.cap_lm_cache);
	/* [T, V] in place of one tile of 4 x 2048, each rounded up to 16 floats */
	ck_assert_uint_eq(with - without, sizeof(float) * ((NTOK * VOCAB + 15) / 16 * 16 - TILE));
	ck_assert_uint_ge(f.m.arena_floats * sizeof(float), without);

	f.m.lm_cache = 0;
	without = llama_activation_bytes(&f.m, NTOK, false);
	f.m.lm_cache = LLAMA_LM_CACHE_DEFAULT;
	ck_assert_uint_eq(llama_activation_bytes(&f.m, NTOK, false), without);
	ck_assert_int_eq(llama_reserve(&f.m, NTOK, false, &err), 0);
	ck_assert(!f.m.cap_lm_cache);
	fixture_close(&f);
}
END_TEST

/* A value model has no LM head: its activations do not depend on the
 * budget. */
START_TEST(value_model_unchanged)
{
	struct fixture f;
	size_t with;

	fixture_open(&f, false, true);
	f.m.lm_cache = LLAMA_LM_CACHE_DEFAULT;
	with = llama_activation_bytes(&f.m, NTOK, true);
	f.m.lm_cache = 0;
	ck_assert_uint_eq(with, llama_activation_bytes(&f.m, NTOK, true));
	fixture_close(&f);
}
END_TEST

/* An engine with the default budget keeps the logits (more device memory
 * after a training call) and trains exactly as one with -1 (never): the
 * same gradients over micro-batches of several tiles each. */
static struct engine *engine_with(int64_t lm_cache_floats)
{
	struct engine_init_config cfg;
	struct eng_error err = {0};
	struct engine *e = NULL;

	engine_init_config_defaults(&cfg);
	cfg.hf_config_json = TINY_QWEN2;   /* vocabulary 97 */
	cfg.seed = 3;
	cfg.threads = 2;
	cfg.max_tokens_per_micro_batch = 8;
	cfg.lm_tile_floats = 64;           /* 1 row x 64 columns: 2 chunks a row */
	cfg.lm_cache_floats = lm_cache_floats;
	ck_assert_msg(engine_create(&cfg, &e, &err) == 0, "engine_create: %s", err.msg);
	ck_assert_int_eq(engine_set_mode(e, ENGINE_MODE_TRAIN, false, &err), 0);
	return e;
}

static void train_call(struct engine *e, struct engine_status *ret)
{
	int32_t ids[14], lens[3] = {5, 4, 5};
	float g_logp[14], g_ent[14];
	struct given_grads gg = {.g_logp = g_logp, .g_ent = g_ent};
	struct engine_batch b = {
		.n = 14, .input_ids = ids, .num_seqs = 3, .seq_lens = lens,
		.temperature = 0.8f, .loss_fn = given_loss, .loss_ctx = &gg,
	};
	struct engine_fb_result res = {0};
	struct eng_error err = {0};

	tu_seed(21);
	for (int i = 0; i < 14; i++)
		ids[i] = (int32_t)(tu_u64() % 97);
	tu_fill(g_logp, 14, -1.0f, 1.0f);
	tu_fill(g_ent, 14, -0.5f, 0.5f);
	ck_assert_msg(engine_forward_backward(e, &b, &res, &err) == 0, "%s", err.msg);
	ck_assert_int_gt(res.num_micro_batches, 1);
	engine_status(e, ret);
}

START_TEST(engine_budget_reaches_the_model)
{
	struct engine *kept = engine_with(0), *recomputed = engine_with(-1);
	struct engine_status sk, sr;

	train_call(kept, &sk);
	train_call(recomputed, &sr);
	ck_assert_uint_eq(state_digest(kept, true), state_digest(recomputed, true));
	/* the micro-batch's [T, 97] logits in place of a 64-float tile */
	ck_assert_uint_gt(sk.device_memory, sr.device_memory);
	engine_destroy(kept);
	engine_destroy(recomputed);
}
END_TEST

START_TEST(engine_budget_checked)
{
	struct engine_init_config cfg;
	struct eng_error err = {0};

	engine_init_config_defaults(&cfg);
	cfg.hf_config_json = TINY_QWEN2;
	cfg.lm_cache_floats = -2;
	ck_assert_int_eq(engine_init_config_check(&cfg, &err), -EINVAL);
	ck_assert_msg(strstr(err.msg, "lm_cache_floats: -2"), "%s", err.msg);
	cfg.lm_cache_floats = ENGINE_MAX_LM_CACHE_FLOATS + 1;
	ck_assert_int_eq(engine_init_config_check(&cfg, &err), -EINVAL);
	cfg.lm_cache_floats = ENGINE_MAX_LM_CACHE_FLOATS;
	ck_assert_msg(engine_init_config_check(&cfg, &err) == 0, "%s", err.msg);
	cfg.lm_cache_floats = -1;
	ck_assert_msg(engine_init_config_check(&cfg, &err) == 0, "%s", err.msg);
}
END_TEST

/* What the model cannot compute is refused, not run: a batch that
 * continues a key/value cache it was not given, a mixture of experts
 * whose sizes a config made by hand leaves out. */
START_TEST(model_refuses_what_it_cannot_run)
{
	struct fixture f;
	struct eng_error err = {0};
	struct llama_model moe = {0};
	struct model_config cfg;
	struct llama_batch b;

	fixture_open(&f, true, false);
	b = (struct llama_batch){ .T = NTOK, .B = 2, .ids = f.ids, .pos = f.pos,
				  .cu_seqlens = f.cu, .targets = f.targets,
				  .kv = (struct llama_kv *)&f };
	ck_assert_int_eq(llama_reserve(&f.m, NTOK, false, &err), 0);
	ck_assert_int_eq(llama_forward(&f.m, &b, 1.0f, false, f.logp, f.ent, NULL), -EINVAL);
	b.kv = NULL;
	ck_assert_int_eq(llama_forward(&f.m, &b, 1.0f, false, f.logp, f.ent, NULL), 0);
	cfg = f.cfg;
	cfg.mlp = MODEL_MLP_MOE;
	moe.w = f.m.w;
	cfg.num_experts = 4;
	cfg.experts_per_tok = 2;
	cfg.moe_intermediate_size = 8;
	cfg.decoder_sparse_step = 0;
	ck_assert_int_eq(llama_init(&moe, f.dev, &cfg, false, &err), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err.msg, "decoder_sparse_step (0)"));
	fixture_close(&f);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("lm_logits_cache");
	TCase *tc = tcase_create("core");

	/* Check's default is 4 s a test: products on a slow or busy CPU (the
	 * AVX2 paths) may need more; meson's timeout bounds the whole. */
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, untied_head_same_gradients);
	tcase_add_test(tc, tied_head_same_gradients);
	tcase_add_test(tc, budget_and_arena);
	tcase_add_test(tc, value_model_unchanged);
	tcase_add_test(tc, engine_budget_reaches_the_model);
	tcase_add_test(tc, engine_budget_checked);
	tcase_add_test(tc, model_refuses_what_it_cannot_run);
	suite_add_tcase(s, tc);
	return check_run(s);
}
