/* test_cpu_logprob_chunks.c — the LM head's online log-softmax over
 * vocabulary chunks against the whole-row kernels (themselves checked
 * against double-precision loops in test_cpu_kernels): the same log-probs,
 * entropies and logit gradients however the vocabulary is split. */
#include "check_run.h"
#include "cpu_test_util.h"

#define R 6
#define V 1000

static void run_split(struct device *dev, const float *logits, const int32_t *tgt,
		      const float *dlogp, const float *dent, const int64_t *cuts, int ncuts,
		      float inv_temp, float *logp, float *ent, float *dlogits)
{
	struct logprob_stats st[R] = {{0}};
	float lse[R], ez[R], tile[R * V];

	for (int c = 0; c < ncuts; c++) {
		int64_t v0 = c ? cuts[c - 1] : 0, Vc = cuts[c] - v0;

		for (int r = 0; r < R; r++)
			memcpy(tile + r * Vc, logits + r * V + v0, Vc * sizeof(float));
		ck_assert_int_eq(dev->k->logprob_chunk_fwd(dev, st, tile, tgt, R, v0, Vc,
							   inv_temp, c == 0), 0);
	}
	ck_assert_int_eq(dev->k->logprob_chunk_finish(dev, logp, ent, lse, ez, st, tgt, R), 0);
	for (int c = 0; c < ncuts; c++) {
		int64_t v0 = c ? cuts[c - 1] : 0, Vc = cuts[c] - v0;

		for (int r = 0; r < R; r++)
			memcpy(tile + r * Vc, logits + r * V + v0, Vc * sizeof(float));
		ck_assert_int_eq(dev->k->logprob_chunk_bwd(dev, tile, tgt, lse, ez, dlogp, dent,
							   R, v0, Vc, inv_temp), 0);
		for (int r = 0; r < R; r++)
			memcpy(dlogits + r * V + v0, tile + r * Vc, Vc * sizeof(float));
	}
}

START_TEST(chunks_match_whole_rows)
{
	static const int64_t one[] = {V}, three[] = {400, 800, V}, many[] = {1, 2, 333, 334, 999, V};
	struct { const int64_t *cuts; int n; } splits[] = {{one, 1}, {three, 3}, {many, 6}};
	struct device *dev = tu_open(2, MATMUL_FP32);
	static float logits[R * V], full_d[R * V], d[R * V];
	int32_t tgt[R] = {3, -1, 999, 0, 400, 799};
	float dlogp[R], dent[R], lp0[R], en0[R], lp[R], en[R];
	const float inv_temp = 1.0f / 0.7f;

	tu_seed(11);
	tu_fill(logits, R * V, -6.0f, 6.0f);
	logits[2 * V + 999] = 30.0f;   /* a dominant logit: max changes across chunks */
	tu_fill(dlogp, R, -1.0f, 1.0f);
	tu_fill(dent, R, -0.5f, 0.5f);
	ck_assert_int_eq(dev->k->logprob_fwd(dev, lp0, en0, logits, tgt, R, V, inv_temp), 0);
	memcpy(full_d, logits, sizeof(logits));
	ck_assert_int_eq(dev->k->logprob_bwd(dev, full_d, tgt, dlogp, dent, R, V, inv_temp), 0);

	for (size_t s = 0; s < sizeof(splits) / sizeof(splits[0]); s++) {
		run_split(dev, logits, tgt, dlogp, dent, splits[s].cuts, splits[s].n, inv_temp,
			  lp, en, d);
		for (int r = 0; r < R; r++) {
			/* both sum in double per block; 2e-6 covers fp32 rounding of z */
			ck_assert_msg(fabsf(lp[r] - lp0[r]) < 2e-6f * (1 + fabsf(lp0[r])),
				      "split %zu row %d logp %g vs %g", s, r, lp[r], lp0[r]);
			ck_assert_msg(fabsf(en[r] - en0[r]) < 2e-6f * (1 + fabsf(en0[r])),
				      "split %zu row %d ent %g vs %g", s, r, en[r], en0[r]);
		}
		ck_assert_float_eq(lp[1], 0.0f);
		for (int i = 0; i < R * V; i++)
			ck_assert_msg(fabsf(d[i] - full_d[i]) < 1e-6f,
				      "split %zu elem %d: %g vs %g", s, i, d[i], full_d[i]);
	}
	tu_close(dev);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("cpu_logprob_chunks");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, chunks_match_whole_rows);
	suite_add_tcase(s, tc);
	return check_run(s);
}
