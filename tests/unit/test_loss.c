/* test_loss.c — hand-computed cases, normalization properties and spec
 * errors of the loss library (engines/loss). The torch comparison of every
 * loss lives in tests/loss/loss_ref.py. */
#include "check_run.h"
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "loss/loss.h"
#include "loss/loss_engine.h"

static struct loss_spec spec_of(const char *name, const char *const *kv)
{
	struct eng_error err = {0};
	struct loss_spec s;

	ck_assert_msg(loss_spec_init(&s, name, &err) == 0, "%s", err.msg);
	for (; kv && kv[0]; kv += 2)
		ck_assert_msg(loss_spec_set(&s, kv[0], kv[1], &err) == 0, "%s", err.msg);
	ck_assert_msg(loss_spec_validate(&s, NULL, &err) == 0, "%s", err.msg);
	return s;
}

#define NEAR(a, b, tol) ck_assert_msg(fabs((double)(a) - (double)(b)) <= (tol), \
	"%s = %.9g, expected %.9g", #a, (double)(a), (double)(b))

/* One sequence of 4 tokens, token 0 masked out (and NaN there: masked
 * tokens must not matter). clip 0.2, dual clip C = 3, token-mean over the
 * 3 masked tokens:
 *   t1  A =  1, r = 1.5: l1 = -1.5, l2 = -1.2 -> max = -1.2 (clipped),
 *       gradient 0; pg_clipfrac counts it.
 *   t2  A = -2, r = 4:   l1 = 8, l2 = -(-2)(1.2) = 2.4 -> max = 8;
 *       A < 0: min(-A C = 6, 8) = 6 (dual clip), gradient 0; lower counts it.
 *   t3  A =  2, r = 1.1: inside the clip, l = -2.2, dl/dlogp = -A r = -2.2.
 *   loss = (-1.2 + 6 - 2.2) / 3 = 2.6 / 3, d_logp = [0, 0, 0, -2.2 / 3],
 *   pg_clipfrac = 1/3, pg_clipfrac_lower = 1/3,
 *   ppo_kl = -(ln 1.5 + ln 4 + ln 1.1) / 3 = -ln(6.6) / 3. */
START_TEST(ppo_three_tokens_by_hand)
{
	struct loss_spec s = spec_of("ppo", NULL);
	int32_t lens[] = { 4 };
	float lp[] = { 0.0f, -1.0f, -2.0f, -0.5f };
	float old[4], adv[] = { 5.0f, 1.0f, -2.0f, 2.0f }, mask[] = { 0, 1, 1, 1 };
	float dl[4], de[4];
	struct loss_batch b = {
		.n = 4, .num_seqs = 1, .seq_lens = lens, .log_probs = lp,
		.in[LOSS_IN_LOSS_MASK] = mask, .in[LOSS_IN_OLD_LOG_PROBS] = old, .in[LOSS_IN_ADVANTAGES] = adv,
	};
	struct loss_result res = { .d_log_probs = dl, .d_entropy = de };
	struct eng_error err = {0};

	old[0] = NAN;
	old[1] = (float)(-1.0 - log(1.5));
	old[2] = (float)(-2.0 - log(4.0));
	old[3] = (float)(-0.5 - log(1.1));
	ck_assert_msg(loss_compute(&s, &b, &res, &err) == 0, "%s", err.msg);
	NEAR(res.loss, 2.6 / 3.0, 1e-6);
	NEAR(res.metrics[LOSS_M_PG_LOSS].value, 2.6 / 3.0, 1e-6);
	NEAR(dl[0], 0.0, 0.0);
	NEAR(dl[1], 0.0, 0.0);
	NEAR(dl[2], 0.0, 0.0);
	NEAR(dl[3], -2.2 / 3.0, 1e-6);
	NEAR(de[3], 0.0, 0.0);
	NEAR(res.metrics[LOSS_M_PG_CLIPFRAC].value, 1.0 / 3.0, 1e-12);
	NEAR(res.metrics[LOSS_M_PG_CLIPFRAC].weight, 3.0, 0.0);
	NEAR(res.metrics[LOSS_M_PG_CLIPFRAC_LOWER].value, 1.0 / 3.0, 1e-12);
	NEAR(res.metrics[LOSS_M_PPO_KL].value, -log(6.6) / 3.0, 1e-6);
	NEAR(res.metrics[LOSS_M_NUM_TOKENS].value, 3.0, 0.0);
	NEAR(res.metrics[LOSS_M_NUM_SEQUENCES].value, 1.0, 0.0);
	ck_assert(!res.metrics[LOSS_M_ENTROPY].present);
	ck_assert(!res.metrics[LOSS_M_KL_LOSS].present);
	ck_assert(!res.metrics[LOSS_M_VF_LOSS].present);
}
END_TEST

/* Value loss, cliprange 0.5, token-mean over 3 tokens, old values 0:
 *   t0  v = 1,    R = 2:  vc = 0.5, (v-R)^2 = 1, (vc-R)^2 = 2.25 -> clipped
 *       term wins, d/dv = 0 (vc does not move with v).
 *   t1  v = 0.2,  R = -1: inside, both terms 1.44 (a tie: autograd splits,
 *       both halves are 2(v - R)), d/dv = 2.4.
 *   t2  v = -1,   R = 1:  vc = -0.5, 4 > 2.25 -> unclipped, d/dv = -4.
 *   vf_loss = 0.5 (2.25 + 1.44 + 4) / 3, d_values = 0.5 [0, 2.4, -4] / 3,
 *   vf_clipfrac = 1/3. */
START_TEST(value_clipping_by_hand)
{
	struct loss_spec s = spec_of("value", NULL);
	int32_t lens[] = { 3 };
	float v[] = { 1.0f, 0.2f, -1.0f }, ov[] = { 0, 0, 0 }, ret[] = { 2.0f, -1.0f, 1.0f };
	float mask[] = { 1, 1, 1 }, dv[3], dl[3];
	struct loss_batch b = {
		.n = 3, .num_seqs = 1, .seq_lens = lens, .values = v, .in[LOSS_IN_OLD_VALUES] = ov,
		.in[LOSS_IN_RETURNS] = ret, .in[LOSS_IN_LOSS_MASK] = mask,
	};
	struct loss_result res = { .d_values = dv, .d_log_probs = dl };
	struct eng_error err = {0};

	ck_assert_msg(loss_compute(&s, &b, &res, &err) == 0, "%s", err.msg);
	NEAR(res.loss, 0.5 * (2.25 + 1.44 + 4.0) / 3.0, 1e-6);
	NEAR(res.metrics[LOSS_M_VF_LOSS].value, res.loss, 0.0);
	NEAR(res.metrics[LOSS_M_VF_CLIPFRAC].value, 1.0 / 3.0, 1e-12);
	NEAR(dv[0], 0.0, 0.0);
	NEAR(dv[1], 0.5 * 2.4 / 3.0, 1e-6);
	NEAR(dv[2], 0.5 * -4.0 / 3.0, 1e-6);
	NEAR(dl[1], 0.0, 0.0);
	ck_assert(!res.metrics[LOSS_M_PG_LOSS].present);
}
END_TEST

/* sft on two sequences [3, 2] with mask [1 1 1 | 1 0] and logp
 * [-1 -2 -3 | -4 -5]: per-token losses 1 2 3 | 4, sequence sums 6 and 4.
 *   token-mean               10 / 4 = 2.5       d = -1/4 each
 *   token-sum                10                 d = -1
 *   seq-mean-token-sum       (6 + 4) / 2 = 5    d = -1/2
 *   seq-mean-token-mean      (6/3 + 4/1) / 2 = 3  d = -1/6 | -1/2
 *   seq-mean-token-sum-norm  5 / H, H = longest sequence = 3; 5/10 with
 *                            loss_scale_factor 10. */
START_TEST(aggregation_normalizers)
{
	static const struct {
		const char *mode;
		const char *scale;
		double loss, d0, d3;
	} cases[] = {
		{ "token-mean", NULL, 2.5, -0.25, -0.25 },
		{ "token-sum", NULL, 10.0, -1.0, -1.0 },
		{ "seq-mean-token-sum", NULL, 5.0, -0.5, -0.5 },
		{ "seq-mean-token-mean", NULL, 3.0, -1.0 / 6.0, -0.5 },
		{ "seq-mean-token-sum-norm", NULL, 5.0 / 3.0, -1.0 / 6.0, -1.0 / 6.0 },
		{ "seq-mean-token-sum-norm", "10", 0.5, -0.05, -0.05 },
	};
	int32_t lens[] = { 3, 2 };
	float lp[] = { -1, -2, -3, -4, -5 }, mask[] = { 1, 1, 1, 1, 0 }, dl[5];

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const char *kv[] = { "loss_agg_mode", cases[i].mode,
				     cases[i].scale ? "loss_scale_factor" : NULL,
				     cases[i].scale, NULL };
		struct loss_spec s = spec_of("sft", kv);
		struct loss_batch b = {
			.n = 5, .num_seqs = 2, .seq_lens = lens, .log_probs = lp,
			.in[LOSS_IN_LOSS_MASK] = mask,
		};
		struct loss_result res = { .d_log_probs = dl };
		struct eng_error err = {0};

		ck_assert_msg(loss_compute(&s, &b, &res, &err) == 0, "%s", err.msg);
		/* 1e-7: seq-mean-token-mean divides by n_i + 1e-8, as verl */
		ck_assert_msg(fabs(res.loss - cases[i].loss) < 1e-7, "%s: loss %g, expected %g",
			      cases[i].mode, res.loss, cases[i].loss);
		ck_assert_msg(fabs(dl[0] - cases[i].d0) < 1e-7 && fabs(dl[3] - cases[i].d3) < 1e-7,
			      "%s: d = %g %g, expected %g %g", cases[i].mode, dl[0], dl[3],
			      cases[i].d0, cases[i].d3);
		ck_assert_msg(dl[4] == 0.0f, "%s: masked token has a gradient", cases[i].mode);
	}
}
END_TEST

/* A deterministic batch: 6 sequences, varied lengths, a fully masked one. */
enum { NSEQ = 6, NTOK = 33, PLAN_W = 16 };
static const int32_t P_LENS[NSEQ] = { 7, 3, 9, 1, 8, 5 };
static float P_LP[NTOK], P_OLD[NTOK], P_REF[NTOK], P_ADV[NTOK], P_ENT[NTOK];
static float P_MASK[NTOK], P_V[NTOK], P_OV[NTOK], P_RET[NTOK];

static void make_batch(void)
{
	uint64_t st = 12345;

	for (int t = 0; t < NTOK; t++) {
		double u[6];

		for (int k = 0; k < 6; k++) {
			st = st * 6364136223846793005ull + 1442695040888963407ull;
			u[k] = (double)(st >> 11) / 9007199254740992.0;
		}
		P_LP[t] = (float)(-3.0 * u[0]);
		P_OLD[t] = (float)(P_LP[t] - (u[1] - 0.5) * 1.2);
		P_REF[t] = (float)(P_LP[t] + (u[2] - 0.5));
		P_ADV[t] = (float)((u[3] - 0.5) * 3.0);
		P_ENT[t] = (float)(2.0 * u[4]);
		P_MASK[t] = u[5] < 0.8 ? 1.0f : 0.0f;
		P_OV[t] = (float)(u[1] - 0.5);
		P_V[t] = (float)(P_OV[t] + (u[2] - 0.5) * 1.5);
		P_RET[t] = (float)((u[3] - 0.5) * 2.0);
	}
	/* sequence 1 (tokens 7..9) fully masked */
	for (int t = 7; t < 10; t++)
		P_MASK[t] = 0.0f;
}

/* Results of the whole batch through loss_compute: the reference of the
 * splitting tests. */
static void full_batch(const struct loss_spec *s, double *ret_loss, float *dl,
		       float *de, float *dv)
{
	struct loss_batch b = {
		.n = NTOK, .num_seqs = NSEQ, .seq_lens = P_LENS, .log_probs = P_LP,
		.entropy = P_ENT, .values = P_V, .in[LOSS_IN_LOSS_MASK] = P_MASK,
		.in[LOSS_IN_OLD_LOG_PROBS] = P_OLD, .in[LOSS_IN_REF_LOG_PROBS] = P_REF, .in[LOSS_IN_ADVANTAGES] = P_ADV,
		.in[LOSS_IN_RETURNS] = P_RET, .in[LOSS_IN_OLD_VALUES] = P_OV,
	};
	struct loss_result res = { .d_log_probs = dl, .d_entropy = de, .d_values = dv };
	struct eng_error err = {0};

	ck_assert_msg(loss_compute(s, &b, &res, &err) == 0, "%s", err.msg);
	*ret_loss = res.loss;
}

static const char *const AGGS[] = {
	"token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean",
	"seq-mean-token-sum-norm",
};

/* Two half-batches normalized by the full batch's counts (global_num_tokens,
 * global_batch_size, loss_scale_factor) sum to the full batch: loss and
 * every gradient. */
START_TEST(global_normalizers_two_halves)
{
	make_batch();
	for (size_t a = 0; a < 5; a++) {
		for (int value = 0; value < 2; value++) {
			const char *base[] = { "loss_agg_mode", AGGS[a], "entropy_coeff", "0.03",
					       "kl_coef", "0.2", NULL };
			const char *glob[] = { "loss_agg_mode", AGGS[a], "entropy_coeff", "0.03",
					       "kl_coef", "0.2", "global_num_tokens", "26",
					       "global_batch_size", "5", "loss_scale_factor", "9",
					       NULL };
			struct loss_spec s = spec_of(value ? "value" : "ppo", base);
			struct loss_spec g = spec_of(value ? "value" : "ppo", glob);
			float dl[NTOK], de[NTOK], dv[NTOK], hl[NTOK], he[NTOK], hv[NTOK];
			double full, sum = 0;
			int tok_split = 7 + 3 + 9;  /* sequences 0..2 | 3..5 */
			int count = 0, seqs = 0, t0 = 0;

			/* the globals above are the full batch's counts */
			for (int i = 0; i < NSEQ; i++) {
				int c = 0;

				for (int t = t0; t < t0 + P_LENS[i]; t++)
					c += P_MASK[t] != 0.0f;
				count += c;
				seqs += c > 0;
				t0 += P_LENS[i];
			}
			ck_assert_int_eq(count, 26);
			ck_assert_int_eq(seqs, 5);
			full_batch(&s, &full, dl, de, dv);
			for (int h = 0; h < 2; h++) {
				int off = h ? tok_split : 0, ns = 3;
				struct loss_batch b = {
					.n = h ? NTOK - tok_split : tok_split, .num_seqs = ns,
					.seq_lens = P_LENS + (h ? 3 : 0), .log_probs = P_LP + off,
					.entropy = P_ENT + off, .values = P_V + off,
					.in[LOSS_IN_LOSS_MASK] = P_MASK + off, .in[LOSS_IN_OLD_LOG_PROBS] = P_OLD + off,
					.in[LOSS_IN_REF_LOG_PROBS] = P_REF + off, .in[LOSS_IN_ADVANTAGES] = P_ADV + off,
					.in[LOSS_IN_RETURNS] = P_RET + off, .in[LOSS_IN_OLD_VALUES] = P_OV + off,
				};
				struct loss_result res = {
					.d_log_probs = hl + off, .d_entropy = he + off,
					.d_values = hv + off,
				};
				struct eng_error err = {0};

				ck_assert_msg(loss_compute(&g, &b, &res, &err) == 0, "%s", err.msg);
				sum += res.loss;
			}
			ck_assert_msg(fabs(sum - full) <= 1e-12 * fmax(1.0, fabs(full)),
				      "%s %s: halves %.17g, full %.17g", value ? "value" : "ppo",
				      AGGS[a], sum, full);
			for (int t = 0; t < NTOK; t++) {
				ck_assert_msg(hl[t] == dl[t] && he[t] == de[t] && hv[t] == dv[t],
					      "%s %s: token %d gradient differs", value ? "value" : "ppo",
					      AGGS[a], t);
			}
		}
	}
}
END_TEST

/* Runs the batch through the engine adapter as `ncalls` calls; call c holds
 * the sequences of parts[c], split into micro-batches at the sequence
 * boundaries listed in mb_cuts[c] (-1 terminated). Gradients are scattered
 * to request order. */
static double run_engine(const struct loss_spec *s, int ncalls, const int (*calls)[PLAN_W],
			 float *gl, float *ge, float *gv, struct loss_metric *ret_m)
{
	int64_t seq_off[NSEQ];
	double total = 0, msum[LOSS_M_COUNT] = {0}, mw[LOSS_M_COUNT] = {0};
	int64_t o = 0;

	for (int i = 0; i < NSEQ; i++) {
		seq_off[i] = o;
		o += P_LENS[i];
	}
	for (int c = 0; c < ncalls; c++) {
		/* calls[c]: sequence ids, -2 = micro-batch break, -1 = end */
		int32_t lens[NSEQ], ids[NSEQ], nseq = 0;
		int64_t req_off[NSEQ], n = 0;
		float arr[6][NTOK];
		struct loss_request q = {0};
		struct loss_engine_ctx lc;
		struct eng_error err = {0};
		struct loss_metric m[LOSS_M_COUNT];
		double l;
		int k = 0;

		for (int j = 0; calls[c][j] != -1; j++) {
			int sq = calls[c][j];

			if (sq < 0)
				continue;
			ids[nseq] = sq;
			lens[nseq] = P_LENS[sq];
			req_off[nseq] = n;
			for (int t = 0; t < P_LENS[sq]; t++) {
				int64_t fp = seq_off[sq] + t;

				arr[0][n + t] = P_MASK[fp];
				arr[1][n + t] = P_OLD[fp];
				arr[2][n + t] = P_REF[fp];
				arr[3][n + t] = P_ADV[fp];
				arr[4][n + t] = P_RET[fp];
				arr[5][n + t] = P_OV[fp];
			}
			n += P_LENS[sq];
			nseq++;
		}
		q.n = n;
		q.num_seqs = nseq;
		q.seq_lens = lens;
		q.in[LOSS_IN_LOSS_MASK] = arr[0];
		q.in[LOSS_IN_OLD_LOG_PROBS] = arr[1];
		q.in[LOSS_IN_REF_LOG_PROBS] = arr[2];
		q.in[LOSS_IN_ADVANTAGES] = arr[3];
		q.in[LOSS_IN_RETURNS] = arr[4];
		q.in[LOSS_IN_OLD_VALUES] = arr[5];
		ck_assert_msg(loss_engine_ctx_init(&lc, s, &q, &err) == 0, "%s", err.msg);

		while (calls[c][k] != -1) {
			int32_t ml[NSEQ], mi[NSEQ], ms = 0;
			int64_t tok[NTOK], mn = 0;
			float lp[NTOK], en[NTOK], va[NTOK], dl[NTOK], de[NTOK], dv[NTOK];
			struct engine_loss_io io = {0};

			for (; calls[c][k] >= 0; k++) {
				int sq = calls[c][k], ci = 0;

				while (ids[ci] != sq)
					ci++;
				ml[ms] = P_LENS[sq];
				mi[ms++] = ci;
				for (int t = 0; t < P_LENS[sq]; t++, mn++) {
					tok[mn] = req_off[ci] + t;
					lp[mn] = P_LP[seq_off[sq] + t];
					en[mn] = P_ENT[seq_off[sq] + t];
					va[mn] = P_V[seq_off[sq] + t];
				}
			}
			if (calls[c][k] == -2)
				k++;
			io.n = mn;
			io.num_seqs = ms;
			io.seq_lens = ml;
			io.seq_index = mi;
			io.token_index = tok;
			io.log_probs = lp;
			io.entropy = en;
			io.values = va;
			io.d_log_probs = dl;
			io.d_entropy = de;
			io.d_values = dv;
			ck_assert_msg(loss_engine_fn(&lc, &io, &err) == 0, "%s", err.msg);
			for (int64_t i = 0; i < mn; i++) {
				int ci = 0, sq;
				int64_t rt = tok[i];

				while (ci + 1 < nseq && req_off[ci + 1] <= rt)
					ci++;
				sq = ids[ci];
				gl[seq_off[sq] + rt - req_off[ci]] = dl[i];
				ge[seq_off[sq] + rt - req_off[ci]] = de[i];
				gv[seq_off[sq] + rt - req_off[ci]] = dv[i];
			}
		}
		loss_engine_ctx_result(&lc, &l, m);
		loss_engine_ctx_destroy(&lc);
		total += l;
		for (int id = 0; id < LOSS_M_COUNT; id++) {
			if (!m[id].present)
				continue;
			ret_m[id].present = true;
			if (loss_metric_is_mean((enum loss_metric_id)id)) {
				msum[id] += m[id].value * m[id].weight;
				mw[id] += m[id].weight;
			} else {
				msum[id] += m[id].value;
			}
		}
	}
	for (int id = 0; id < LOSS_M_COUNT; id++)
		ret_m[id].value = loss_metric_is_mean((enum loss_metric_id)id) ?
				  (mw[id] > 0 ? msum[id] / mw[id] : 0) : msum[id];
	return total;
}

/* The property of the issue: one batch split into 1, 2 and 5 micro-batches
 * (one call) and into 3 calls with global normalization gives the full
 * batch's loss, metrics and gradients, for every aggregation mode and for
 * the value loss (fp32 round-off: the gradients are computed in double and
 * rounded once, so they agree bit for bit here). */
START_TEST(micro_batch_property)
{
	static const int one[][PLAN_W] = { { 0, 1, 2, 3, 4, 5, -1 } };
	static const int two[][PLAN_W] = { { 4, 1, 5, -2, 0, 3, 2, -1 } };
	static const int five[][PLAN_W] = { { 2, -2, 0, -2, 5, 1, -2, 3, -2, 4, -1 } };
	static const int three[][PLAN_W] = {
		{ 1, 4, -2, 2, -1 }, { 0, -1 }, { 5, -2, 3, -1 },
	};
	static const char *const names[] = { "ppo", "value", "sft" };

	make_batch();
	for (size_t a = 0; a < 5; a++) {
		for (size_t nm = 0; nm < 3; nm++) {
			const char *base[] = { "loss_agg_mode", AGGS[a],
					       nm == 0 ? "entropy_coeff" : NULL, "0.02",
					       "kl_coef", "0.1", NULL };
			const char *glob[] = { "loss_agg_mode", AGGS[a], "global_num_tokens", "26",
					       "global_batch_size", "5", "loss_scale_factor", "9",
					       nm == 0 ? "entropy_coeff" : NULL, "0.02",
					       "kl_coef", "0.1", NULL };
			struct loss_spec s = spec_of(names[nm], base);
			struct loss_spec g = spec_of(names[nm], glob);
			float dl[NTOK], de[NTOK], dv[NTOK];
			double full;
			struct {
				const struct loss_spec *s;
				int ncalls;
				const int (*calls)[PLAN_W];
				const char *what;
			} runs[] = {
				{ &s, 1, one, "1 micro-batch" },
				{ &s, 1, two, "2 micro-batches" },
				{ &s, 1, five, "5 micro-batches" },
				{ &g, 3, three, "3 calls, global normalization" },
			};

			full_batch(&s, &full, dl, de, dv);
			for (size_t r = 0; r < 4; r++) {
				float gl[NTOK], ge[NTOK], gv[NTOK];
				struct loss_metric m[LOSS_M_COUNT] = {0};
				double l;

				memset(gl, 0xff, sizeof(gl));
				memset(ge, 0xff, sizeof(ge));
				memset(gv, 0xff, sizeof(gv));
				l = run_engine(runs[r].s, runs[r].ncalls, runs[r].calls, gl, ge, gv, m);
				ck_assert_msg(fabs(l - full) <= 1e-12 * fmax(1.0, fabs(full)),
					      "%s %s %s: loss %.17g, full batch %.17g", names[nm],
					      AGGS[a], runs[r].what, l, full);
				ck_assert(m[LOSS_M_NUM_TOKENS].value == 26.0);
				ck_assert(m[LOSS_M_NUM_SEQUENCES].value == NSEQ);
				for (int t = 0; t < NTOK; t++) {
					ck_assert_msg(fabsf(gl[t] - dl[t]) <= 1e-6f * fabsf(dl[t]) &&
						      fabsf(ge[t] - de[t]) <= 1e-6f * fabsf(de[t]) &&
						      fabsf(gv[t] - dv[t]) <= 1e-6f * fabsf(dv[t]),
						      "%s %s %s: token %d: %g %g %g vs %g %g %g",
						      names[nm], AGGS[a], runs[r].what, t, gl[t], ge[t],
						      gv[t], dl[t], de[t], dv[t]);
				}
			}
		}
	}
}
END_TEST

/* Micro-batch metrics combine to the full batch's: means token-weighted. */
START_TEST(metrics_combine_to_full_batch)
{
	static const int five[][PLAN_W] = { { 2, -2, 0, -2, 5, 1, -2, 3, -2, 4, -1 } };
	const char *kv[] = { "entropy_coeff", "0.01", "kl_coef", "0.1", NULL };
	struct loss_spec s;
	struct loss_batch b;
	struct loss_result res = {0};
	struct loss_metric m[LOSS_M_COUNT] = {0};
	float gl[NTOK], ge[NTOK], gv[NTOK];
	struct eng_error err = {0};

	make_batch();
	s = spec_of("ppo", kv);
	b = (struct loss_batch){
		.n = NTOK, .num_seqs = NSEQ, .seq_lens = P_LENS, .log_probs = P_LP,
		.entropy = P_ENT, .in[LOSS_IN_LOSS_MASK] = P_MASK, .in[LOSS_IN_OLD_LOG_PROBS] = P_OLD,
		.in[LOSS_IN_REF_LOG_PROBS] = P_REF, .in[LOSS_IN_ADVANTAGES] = P_ADV,
	};
	ck_assert(loss_compute(&s, &b, &res, &err) == 0);
	run_engine(&s, 1, five, gl, ge, gv, m);
	for (int id = 0; id < LOSS_M_COUNT; id++) {
		ck_assert_msg(m[id].present == res.metrics[id].present, "%s presence",
			      loss_metric_str((enum loss_metric_id)id));
		ck_assert_msg(fabs(m[id].value - res.metrics[id].value) <=
			      1e-12 * fmax(1.0, fabs(res.metrics[id].value)),
			      "%s: micro-batched %.17g, full %.17g",
			      loss_metric_str((enum loss_metric_id)id), m[id].value,
			      res.metrics[id].value);
	}
	ck_assert(res.metrics[LOSS_M_PG_CLIPFRAC].value > 0.0);
	ck_assert(res.metrics[LOSS_M_PG_CLIPFRAC].value < 1.0);
}
END_TEST

START_TEST(spec_parsing)
{
	struct eng_error err = {0};
	struct loss_spec s, before;

	ck_assert_int_eq(loss_spec_init(&s, "ppo", &err), 0);
	ck_assert_int_eq(s.policy_loss, LOSS_PG_VANILLA);
	ck_assert_int_eq(s.agg, LOSS_AGG_TOKEN_MEAN);
	ck_assert(s.clip_ratio == 0.2 && s.clip_ratio_c == 3.0 && s.kl_type == LOSS_KL_K3);
	ck_assert(s.clip_cov_ratio == 0.0002 && s.clip_cov_lb == 1.0 && s.clip_cov_ub == 5.0);
	ck_assert(s.tau_pos == 1.0 && s.tau_neg == 1.05 && s.cliprange_value == 0.5);
	ck_assert(isnan(s.clip_ratio_low) && isnan(s.clip_ratio_high));

	ck_assert_int_eq(loss_spec_set(&s, "loss_mode", "gspo", &err), 0);
	ck_assert_int_eq(s.policy_loss, LOSS_PG_GSPO);
	ck_assert_int_eq(loss_spec_pg_agg(&s), LOSS_AGG_SEQ_MEAN_TOKEN_MEAN);
	ck_assert_int_eq(loss_spec_set(&s, "kl_loss_type", "low_var_kl+", &err), 0);
	ck_assert(s.kl_type == LOSS_KL_K3 && s.kl_straight_through);
	ck_assert_int_eq(loss_spec_set(&s, "kl_loss_coef", "0.001", &err), 0);
	ck_assert(s.kl_coef == 0.001);
	ck_assert_int_eq(loss_spec_set(&s, "global_num_tokens", "4096.0", &err), 0);
	ck_assert(s.global_num_tokens == 4096);
	ck_assert_int_eq(loss_spec_set(&s, "seed", "18446744073709551615", &err), 0);
	ck_assert(s.seed == UINT64_MAX);
	ck_assert_int_eq(loss_spec_set(&s, "clip_ratio_low", "0.1", &err), 0);
	ck_assert(s.clip_ratio_low == 0.1);
	ck_assert_int_eq(loss_spec_set(&s, "clip_ratio_low", "null", &err), 0);
	ck_assert(isnan(s.clip_ratio_low));
	ck_assert_int_eq(loss_spec_set(&s, "global_num_tokens", "None", &err), 0);
	ck_assert(s.global_num_tokens == 0);
	ck_assert_int_eq(loss_spec_set(&s, "global_num_tokens", "4096", &err), 0);
	ck_assert_int_eq(loss_spec_set(&s, "clip_ratio", "null", &err), -EINVAL);
	eng_error_clear(&err);

	/* failures name the key and leave the spec unchanged */
	before = s;
	ck_assert_int_eq(loss_spec_set(&s, "clip_ratio_hgih", "0.3", &err), -EINVAL);
	ck_assert_msg(strstr(err.msg, "clip_ratio_hgih"), "%s", err.msg);
	eng_error_clear(&err);
	ck_assert_int_eq(loss_spec_set(&s, "clip_ratio", "0.2x", &err), -EINVAL);
	ck_assert_msg(strstr(err.msg, "loss.clip_ratio"), "%s", err.msg);
	eng_error_clear(&err);
	ck_assert_int_eq(loss_spec_set(&s, "clip_ratio", "nan", &err), -EINVAL);
	eng_error_clear(&err);
	ck_assert_int_eq(loss_spec_set(&s, "global_batch_size", "-4", &err), -EINVAL);
	ck_assert_msg(strstr(err.msg, "global_batch_size"), "%s", err.msg);
	eng_error_clear(&err);
	ck_assert_int_eq(loss_spec_set(&s, "loss_agg_mode", "seq-mean", &err), -EINVAL);
	ck_assert_msg(strstr(err.msg, "loss_agg_mode") && strstr(err.msg, "token-mean"),
		      "%s", err.msg);
	eng_error_clear(&err);
	ck_assert_int_eq(loss_spec_set(&s, "kl_type", "k3++", &err), -EINVAL);
	eng_error_clear(&err);
	ck_assert(s.policy_loss == before.policy_loss && s.clip_ratio == before.clip_ratio &&
		  s.global_batch_size == before.global_batch_size && s.agg == before.agg &&
		  s.kl_type == before.kl_type && s.kl_straight_through == before.kl_straight_through);

	ck_assert_int_eq(loss_spec_init(&s, "grpo", &err), -EINVAL);
	ck_assert_msg(strstr(err.msg, "loss.name") && strstr(err.msg, "grpo") &&
		      strstr(err.msg, "ppo"), "%s", err.msg);
	eng_error_clear(&err);

	/* Tinker names sum; importance_sampling is the ppo variant */
	ck_assert_int_eq(loss_spec_init(&s, "importance_sampling", &err), 0);
	ck_assert(s.name == LOSS_PPO && s.policy_loss == LOSS_PG_IMPORTANCE_SAMPLING &&
		  s.agg == LOSS_AGG_TOKEN_SUM);
	ck_assert_int_eq(loss_spec_init(&s, "cross_entropy", &err), 0);
	ck_assert(s.agg == LOSS_AGG_TOKEN_SUM);
	ck_assert_int_eq(loss_spec_init(&s, "sft", &err), 0);
	ck_assert(s.agg == LOSS_AGG_TOKEN_MEAN);
}
END_TEST

static int validate_with(const char *name, const char *key, const char *val,
			 const int *present, int64_t n, struct eng_error *err)
{
	struct loss_inputs_present p;
	struct loss_spec s;

	eng_error_clear(err);
	ck_assert_int_eq(loss_spec_init(&s, name, err), 0);
	if (key)
		ck_assert_int_eq(loss_spec_set(&s, key, val, err), 0);
	loss_inputs_present_init(&p, 10);
	for (; *present >= 0; present++)
		p.len[*present] = n;
	return loss_spec_validate(&s, &p, err);
}

START_TEST(spec_validation_names_the_field)
{
	static const int ppo_in[] = { LOSS_IN_LOSS_MASK, LOSS_IN_OLD_LOG_PROBS,
				      LOSS_IN_ADVANTAGES, LOSS_IN_ENTROPY, -1 };
	static const int no_adv[] = { LOSS_IN_OLD_LOG_PROBS, LOSS_IN_ENTROPY, -1 };
	static const int no_ent[] = { LOSS_IN_OLD_LOG_PROBS, LOSS_IN_ADVANTAGES, -1 };
	static const int value_in[] = { LOSS_IN_RETURNS, LOSS_IN_OLD_VALUES, -1 };
	static const int gpg_in[] = { LOSS_IN_ADVANTAGES, -1 };
	static const struct {
		const char *name, *key, *val;
		const int *present;
		int64_t n;
		const char *needle;  /* NULL: must pass */
	} cases[] = {
		{ "ppo", NULL, NULL, ppo_in, 10, NULL },
		{ "ppo", NULL, NULL, no_adv, 10, "advantages: required by loss ppo/vanilla" },
		{ "ppo", "policy_loss", "gpg", gpg_in, 10, NULL },
		{ "ppo", "policy_loss", "cispo", gpg_in, 10, "old_log_probs" },
		{ "ppo", NULL, NULL, ppo_in, 9, "loss_mask: 9 elements, expected 10" },
		{ "ppo", "clip_ratio", "-0.2", ppo_in, 10, "loss.clip_ratio: -0.2" },
		{ "ppo", "clip_ratio_low", "-0.1", ppo_in, 10, "loss.clip_ratio_low" },
		{ "ppo", "clip_ratio_high", "-0.1", ppo_in, 10, "loss.clip_ratio_high" },
		{ "ppo", "clip_ratio_c", "1", ppo_in, 10, "loss.clip_ratio_c" },
		{ "ppo", "kl_coef", "0.1", ppo_in, 10, "ref_log_probs: required by kl_coef" },
		{ "ppo", "entropy_coeff", "0.1", no_ent, 10, "entropy: required by entropy_coeff" },
		{ "ppo", "kl_coef", "-1", ppo_in, 10, "loss.kl_coef" },
		{ "ppo", "dp_size", "0", ppo_in, 10, "loss.dp_size" },
		{ "ppo", "dp_size", "8", ppo_in, 10, "loss.global_num_tokens" },
		{ "value", NULL, NULL, value_in, 10, "values: required by loss value" },
		{ "value", "cliprange_value", "-1", value_in, 10, "loss.cliprange_value" },
		{ "sft", NULL, NULL, gpg_in, 10, NULL },
		{ "dro", NULL, NULL, gpg_in, 10, "old_log_probs: required by loss dro" },
	};
	struct eng_error err = {0};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		int r = validate_with(cases[i].name, cases[i].key, cases[i].val,
				      cases[i].present, cases[i].n, &err);

		if (!cases[i].needle) {
			ck_assert_msg(r == 0, "case %zu: %s", i, err.msg);
			continue;
		}
		ck_assert_msg(r == -EINVAL && strstr(err.msg, cases[i].needle),
			      "case %zu: rc %d, message \"%s\", expected \"%s\"", i, r,
			      err.msg, cases[i].needle);
	}
}
END_TEST

/* clip_cov's and kl_cov's ratios are fractions of the tokens, in (0, 1]:
 * a huge one made ratio x tokens overflow the int64 conversion of the
 * token count (undefined; found by tests/fuzz/fuzz_loss_spec). */
START_TEST(cov_ratios_are_fractions)
{
	static const int ppo_in[] = { LOSS_IN_OLD_LOG_PROBS, LOSS_IN_ADVANTAGES, -1 };
	static const struct { const char *policy, *key, *val; bool ok; } cases[] = {
		{ "clip_cov", "clip_cov_ratio", "1", true },
		{ "clip_cov", "clip_cov_ratio", "1e300", false },
		{ "clip_cov", "clip_cov_ratio", "1.5", false },
		{ "kl_cov", "kl_cov_ratio", "1", true },
		{ "kl_cov", "kl_cov_ratio", "1e300", false },
		{ "kl_cov", "kl_cov_ratio", "0", false },
		{ "vanilla", "kl_cov_ratio", "1e300", true },   /* not used by vanilla */
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct loss_inputs_present p;
		struct loss_spec s;
		struct eng_error err = {0};
		int r;

		ck_assert_int_eq(loss_spec_init(&s, "ppo", &err), 0);
		ck_assert_int_eq(loss_spec_set(&s, "policy_loss", cases[i].policy, &err), 0);
		ck_assert_int_eq(loss_spec_set(&s, cases[i].key, cases[i].val, &err), 0);
		loss_inputs_present_init(&p, 4);
		for (const int *k = ppo_in; *k >= 0; k++)
			p.len[*k] = 4;
		r = loss_spec_validate(&s, &p, &err);
		if (cases[i].ok)
			ck_assert_msg(r == 0, "case %zu: %s", i, err.msg);
		else
			ck_assert_msg(r == -EINVAL && strstr(err.msg, cases[i].key) &&
				      strstr(err.msg, "(0, 1]"), "case %zu: %d %s", i, r, err.msg);
	}
}
END_TEST

/* Bad batches fail before anything is written. */
START_TEST(batch_errors_leave_outputs_untouched)
{
	struct loss_spec s = spec_of("ppo", NULL);
	int32_t lens[] = { 2, 2 }, bad_lens[] = { 2, 3 };
	float lp[] = { 0, -1, 0, -2 }, old[] = { 0, -1, 0, -2 }, adv[] = { 1, 1, 1, 1 };
	float mask[] = { 0, 1, 0.5f, 1 }, dl[4] = { 7, 7, 7, 7 };
	struct loss_batch b = {
		.n = 4, .num_seqs = 2, .seq_lens = lens, .log_probs = lp,
		.in[LOSS_IN_OLD_LOG_PROBS] = old, .in[LOSS_IN_ADVANTAGES] = adv, .in[LOSS_IN_LOSS_MASK] = mask,
	};
	struct loss_result res = { .loss = 42.0, .d_log_probs = dl };
	struct eng_error err = {0};

	ck_assert_int_eq(loss_compute(&s, &b, &res, &err), -EINVAL);
	ck_assert_msg(strstr(err.msg, "loss_mask[2]"), "%s", err.msg);
	eng_error_clear(&err);
	mask[2] = 0;
	b.seq_lens = bad_lens;
	ck_assert_int_eq(loss_compute(&s, &b, &res, &err), -EINVAL);
	ck_assert_msg(strstr(err.msg, "seq_lens"), "%s", err.msg);
	eng_error_clear(&err);
	b.seq_lens = lens;
	b.in[LOSS_IN_ADVANTAGES] = NULL;
	ck_assert_int_eq(loss_compute(&s, &b, &res, &err), -EINVAL);
	ck_assert_msg(strstr(err.msg, "advantages"), "%s", err.msg);
	ck_assert(res.loss == 42.0 && dl[0] == 7 && dl[1] == 7 && dl[3] == 7);

	/* without loss_mask, each sequence's first token is out */
	eng_error_clear(&err);
	b.in[LOSS_IN_ADVANTAGES] = adv;
	b.in[LOSS_IN_LOSS_MASK] = NULL;
	ck_assert_int_eq(loss_compute(&s, &b, &res, &err), 0);
	ck_assert(res.metrics[LOSS_M_NUM_TOKENS].value == 2.0);
	ck_assert(dl[0] == 0.0f && dl[2] == 0.0f && dl[1] != 0.0f);
}
END_TEST

/* clip_cov: the choice is a function of the seed; its size follows verl's
 * max(int(ratio * tokens), 1) capped by the candidates. */
START_TEST(clip_cov_seeded_choice)
{
	enum { N = 400 };
	const char *kv[] = { "policy_loss", "clip_cov", "clip_cov_ratio", "0.01",
			     "clip_cov_lb", "0.2", NULL };
	struct loss_spec s = spec_of("ppo", kv);
	static float lp[N], old[N], adv[N];
	static uint8_t sel[3][N];
	int32_t lens[] = { N };
	uint64_t st = 99;
	int count[3] = {0};

	for (int t = 0; t < N; t++) {
		st = st * 6364136223846793005ull + 1442695040888963407ull;
		lp[t] = -(float)((st >> 40) % 1000) / 250.0f;
		old[t] = lp[t];  /* r = 1: nothing clipped */
		adv[t] = (float)((int)((st >> 20) % 2001) - 1000) / 250.0f;
	}
	for (int k = 0; k < 3; k++) {
		float dl[N];
		struct loss_batch b = {
			.n = N, .num_seqs = 1, .seq_lens = lens, .log_probs = lp,
			.in[LOSS_IN_OLD_LOG_PROBS] = old, .in[LOSS_IN_ADVANTAGES] = adv,
			.rng_seed = k == 2 ? 8 : 7,
		};
		struct loss_result res = { .d_log_probs = dl, .selected = sel[k] };
		struct eng_error err = {0};

		ck_assert_msg(loss_compute(&s, &b, &res, &err) == 0, "%s", err.msg);
		for (int t = 0; t < N; t++) {
			count[k] += sel[k][t];
			if (sel[k][t])
				ck_assert(dl[t] == 0.0f);  /* chosen tokens carry no gradient */
		}
		/* 399 masked tokens (token 0 has no prediction): int(0.01 * 399) = 3 */
		ck_assert_int_eq(count[k], 3);
		ck_assert(fabs(res.metrics[LOSS_M_PG_CLIPFRAC].value - 3.0 / 399.0) < 1e-12);
	}
	ck_assert(memcmp(sel[0], sel[1], N) == 0);
	ck_assert(memcmp(sel[0], sel[2], N) != 0);
}
END_TEST

/* The adapter checks io against the request and writes nothing when
 * forward_only (the loss and metrics are still accumulated). */
START_TEST(adapter_io_checks_and_forward_only)
{
	int32_t lens[] = { 2, 3 };
	float mask[] = { 0, 1, 0, 1, 1 }, old[] = { 0, -1, 0, -2, -1 };
	float adv[] = { 0, 1, 0, -1, 2 }, lp[] = { 0, -0.9f, 0, -2.1f, -1.2f };
	float dl[5] = { 9, 9, 9, 9, 9 }, de[5] = { 9, 9, 9, 9, 9 };
	int64_t tok[] = { 2, 3, 4, 0, 1 };
	int32_t mlens[] = { 3, 2 }, midx[] = { 1, 0 }, bad_lens[] = { 2, 3 };
	struct loss_request q = {
		.n = 5, .num_seqs = 2, .seq_lens = lens, .in[LOSS_IN_LOSS_MASK] = mask,
		.in[LOSS_IN_OLD_LOG_PROBS] = old, .in[LOSS_IN_ADVANTAGES] = adv,
	};
	struct loss_spec s = spec_of("ppo", NULL);
	struct loss_engine_ctx lc;
	struct engine_loss_io io = {
		.n = 5, .num_seqs = 2, .seq_lens = mlens, .seq_index = midx,
		.token_index = tok, .log_probs = lp, .d_log_probs = dl, .d_entropy = de,
	};
	struct loss_metric m[LOSS_M_COUNT];
	struct eng_error err = {0};
	double loss;

	ck_assert_int_eq(loss_engine_ctx_init(&lc, &s, &q, &err), 0);
	io.seq_lens = bad_lens;
	ck_assert_int_eq(loss_engine_fn(&lc, &io, &err), -EINVAL);
	ck_assert_msg(strstr(err.msg, "seq_lens"), "%s", err.msg);
	eng_error_clear(&err);
	io.seq_lens = mlens;
	tok[0] = 5;
	ck_assert_int_eq(loss_engine_fn(&lc, &io, &err), -EINVAL);
	ck_assert_msg(strstr(err.msg, "token_index[0]"), "%s", err.msg);
	eng_error_clear(&err);
	tok[0] = 2;
	io.forward_only = true;
	ck_assert_int_eq(loss_engine_fn(&lc, &io, &err), 0);
	for (int i = 0; i < 5; i++)
		ck_assert(dl[i] == 9.0f && de[i] == 9.0f);
	loss_engine_ctx_result(&lc, &loss, m);
	ck_assert_int_eq(lc.num_micro_batches, 1);
	ck_assert(m[LOSS_M_NUM_TOKENS].value == 3.0 && loss != 0.0);
	ck_assert(m[LOSS_M_PG_CLIPFRAC].present && !m[LOSS_M_VF_LOSS].present);
	loss_engine_ctx_destroy(&lc);

	mask[1] = 2.0f;
	ck_assert_int_eq(loss_engine_ctx_init(&lc, &s, &q, &err), -EINVAL);
	ck_assert_msg(strstr(err.msg, "loss_mask[1]"), "%s", err.msg);
	loss_engine_ctx_destroy(&lc);
}
END_TEST

int main(void)
{
	Suite *su = suite_create("loss");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, ppo_three_tokens_by_hand);
	tcase_add_test(tc, value_clipping_by_hand);
	tcase_add_test(tc, aggregation_normalizers);
	tcase_add_test(tc, global_normalizers_two_halves);
	tcase_add_test(tc, micro_batch_property);
	tcase_add_test(tc, metrics_combine_to_full_batch);
	tcase_add_test(tc, spec_parsing);
	tcase_add_test(tc, spec_validation_names_the_field);
	tcase_add_test(tc, cov_ratios_are_fractions);
	tcase_add_test(tc, batch_errors_leave_outputs_untouched);
	tcase_add_test(tc, clip_cov_seeded_choice);
	tcase_add_test(tc, adapter_io_checks_and_forward_only);
	suite_add_tcase(su, tc);
	return check_run(su);
}
