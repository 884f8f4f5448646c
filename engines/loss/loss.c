/* loss.c — loss values, metrics and per-token gradients (see loss.h).
 *
 * Reference: verl-project/verl commit 018f23b5f83a,
 * verl/trainer/ppo/core_algos.py (agg_loss, compute_policy_loss_* ,
 * compute_value_loss, kl_penalty) and verl/workers/utils/losses.py
 * (02de5fec2042: ppo_loss, value_loss, sft_loss), plus Tinker's loss docs.
 *
 * Conventions. All arithmetic is in double from the float inputs; results
 * are rounded to float once when written. x = logp - old_logp. Gradients
 * follow torch autograd exactly, including its tie rules, because the tests
 * compare against autograd: clamp passes the gradient on the closed
 * interval, maximum/minimum split it in half on ties, abs has gradient 0
 * at 0. Only masked tokens (m = 1) are evaluated: masked-out tokens get zero
 * gradient and never enter a statistic, so garbage (even inf) there is
 * harmless (verl multiplies by the mask, which turns inf into NaN).
 *
 * Per-token policy losses l_t, then pg_loss = sum_t c_t l_t with the
 * aggregation coefficients of loss.h. A = advantage, r = exp(clamp(x,±20)),
 * lo/hi = clip_ratio_low/high (default clip_ratio), C = clip_ratio_c:
 *   vanilla   l = max(-A r, -A clip(r, 1-lo, 1+hi)); A < 0: min(l, -A C).
 *             pg_clipfrac: -A clip(r) > -A r; pg_clipfrac_lower: A < 0 and
 *             l > -A C; ppo_kl: mean(-clamp(x)).
 *   gspo      s_i = sum_t m x / max(n_i, 1) (unclamped);
 *             s_it = exp(min(sg(s_i) + logp - sg(logp), 10)) so ds/dlogp_t
 *             = s_it for that token only; l = max(-A s, -A clip(s));
 *             aggregation forced to seq-mean-token-mean; clipfrac_lower 0.
 *   cispo     l = -sg(clip(r, 1-lo, 1+hi)) A logp; clipfrac: r != clip(r).
 *   gpg       l = -A logp; no metrics (verl returns none).
 *   sapo      l = -A * sigmoid(tau (r-1)) * 4/tau, tau = tau_pos if A > 0
 *             else tau_neg; seq-mean-token-mean; clipfracs reported as 0.
 *   clip_cov  r = exp(x) unclamped (as verl); l = max(-A r, -A clip(r)) * corr
 *             where corr = 0 on up to max(int(clip_cov_ratio * N), 1) tokens
 *             drawn uniformly from {m, not clipped, lb < cov < ub},
 *             cov = (A - mean A)(logp - mean logp) over this batch's masked
 *             tokens. verl draws with torch.randperm; engined draws with the
 *             engine's xoshiro256** (rng.h) seeded by batch->rng_seed, so a
 *             run is reproducible.
 *             Metrics pg_clipfrac (= chosen / N) and ppo_kl (unclamped).
 *   kl_cov    r = exp(x) unclamped; l = -A r, plus ppo_kl_coef |x| on the
 *             max(1, int(N * kl_cov_ratio)) tokens of largest cov (ties:
 *             lowest position first; torch.topk leaves ties unspecified).
 *             No clipping. Metric ppo_kl = mean |x|.
 *   geo_mean  per sequence: k_t = sgn(A) min(sgn(A) x, sgn(A) clamp(x, -lo, hi))
 *             (0 where A = 0), R_i = exp(sum m k / n_i), Abar_i = sum m A / n_i
 *             (n_i + 1e-8 in both denominators, as verl),
 *             l_i = -Abar_i R_i (times the geometric mean of is_weights).
 *             verl takes torch.mean over all rows; engined divides by the
 *             sequence normalizer N_seq (global_batch_size, or the sequences
 *             with a masked token) times dp_size, so that micro-batches add
 *             up. The two agree unless a sequence is fully masked.
 *             pg_clipfrac / _lower: x != clamp(x) with A > 0 / A < 0.
 *   importance_sampling (Tinker)  l = -r A; metric ppo_kl.
 * is_weights multiply l_t (per token; geo_mean: per sequence, as verl).
 * ppo total: pg_loss - entropy_coeff * agg(entropy) + kl_coef * agg(kl),
 * entropy and KL aggregated with loss_agg_mode even when the policy term is
 * forced to seq-mean-token-mean (as verl's ppo_loss). KL per token, d = logp - ref:
 *   k1 d; abs |d|; k2 d^2/2; k3 clamp(e^y - y - 1, -10, 10), y = clamp(-d, ±20).
 *   A '+' suffix keeps the value and takes k2's gradient d (straight-through).
 * The kl_loss metric is reported whenever ref_log_probs is given.
 * sft / cross_entropy: l = -w logp (w = token_weights or 1).
 * value: l = max((v - R)^2, (vc - R)^2) / 2, vc = max(min(v, ov + e), ov - e)
 *   (verl's clip_by_value, e = cliprange_value); vf_clipfrac: clipped > unclipped.
 * dro (Tinker): l = -(logp A - beta/2 (logp - old)^2), x unclamped.
 */
#include "loss.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../rng.h"

/* --- torch-semantics helpers --------------------------------------------- */

/* torch.clamp: value, and in *pass whether the gradient flows (closed range). */
static double clamp_g(double x, double lo, double hi, double *pass)
{
	*pass = (x >= lo && x <= hi) ? 1.0 : 0.0;
	if (x < lo)
		return lo;
	if (x > hi)
		return hi;
	return x;
}

/* torch.maximum(a, b) with gradient: ties split the gradient in half. */
static void tmax(double a, double da, double b, double db, double *v, double *dv)
{
	if (a > b) {
		*v = a;
		*dv = da;
	} else if (b > a) {
		*v = b;
		*dv = db;
	} else {
		*v = a;
		*dv = 0.5 * (da + db);
	}
}

static void tmin(double a, double da, double b, double db, double *v, double *dv)
{
	tmax(-a, -da, -b, -db, v, dv);
	*v = -*v;
	*dv = -*dv;
}

static double sgn(double x)
{
	return x > 0 ? 1.0 : x < 0 ? -1.0 : 0.0;
}

/* --- random choice ------------------------------------------------------ */

/* Uniform integer in [0, bound), bound >= 1: Lemire's multiply-shift with
 * rejection (exactly uniform) on the engine's xoshiro256** stream. */
static uint64_t rand_below(struct rng *g, uint64_t bound)
{
	unsigned __int128 m;
	uint64_t lo, thresh;

	m = (unsigned __int128)rng_next_u64(g) * bound;
	lo = (uint64_t)m;
	if (lo < bound) {
		thresh = -bound % bound;
		while (lo < thresh) {
			m = (unsigned __int128)rng_next_u64(g) * bound;
			lo = (uint64_t)m;
		}
	}
	return (uint64_t)(m >> 64);
}

/* --- batch context ------------------------------------------------------- */

struct norm {
	double ntok;     /* N_tok */
	double nseq;     /* N_seq */
	double horizon;  /* H */
	double dp;
};

struct lctx {
	const struct loss_spec *s;
	const struct loss_batch *b;
	uint8_t *m;          /* [n] effective mask (owned) */
	int64_t *seq_off;    /* [num_seqs] first token of each sequence (owned) */
	int64_t *seq_cnt;    /* [num_seqs] masked tokens per sequence (owned) */
	uint8_t *sel;        /* [n] clip_cov / kl_cov choice, or NULL (owned) */
	int64_t own_tokens;  /* masked tokens in the batch */
	int64_t own_seqs;    /* sequences with a masked token */
	int64_t max_len;     /* longest sequence */
	struct norm nm;
	double lo, hi;       /* effective clip ratios */
};

/* c_t / m_t of loss.h for a token of a sequence with n_i masked tokens. */
static double agg_coef(enum loss_agg a, const struct norm *nm, double n_i)
{
	switch (a) {
	case LOSS_AGG_TOKEN_MEAN:
		return nm->ntok > 0 ? nm->dp / nm->ntok : 0.0;
	case LOSS_AGG_TOKEN_SUM:
		return nm->dp;
	case LOSS_AGG_SEQ_MEAN_TOKEN_SUM:
		return nm->nseq > 0 ? nm->dp / nm->nseq : 0.0;
	case LOSS_AGG_SEQ_MEAN_TOKEN_SUM_NORM:
		return nm->nseq > 0 && nm->horizon > 0 ?
		       nm->dp / (nm->nseq * nm->horizon) : 0.0;
	case LOSS_AGG_SEQ_MEAN_TOKEN_MEAN:
		/* verl's token mean is sum / (n_i + 1e-8); kept for exactness. */
		return nm->nseq > 0 && n_i > 0 ? nm->dp / (nm->nseq * (n_i + 1e-8)) : 0.0;
	}
	return 0.0;
}

static void lctx_free(struct lctx *c)
{
	free(c->m);
	free(c->seq_off);
	free(c->seq_cnt);
	free(c->sel);
}

int loss_seq_lens_check(const int32_t *seq_lens, int32_t num_seqs, int64_t n,
			struct eng_error *err)
{
	int64_t sum = 0;

	if (n < 0 || num_seqs < 0 || (num_seqs > 0 && !seq_lens))
		return eng_fail(err, -EINVAL, "seq_lens: missing, or negative counts (%d sequences, "
				"%lld tokens)", (int)num_seqs, (long long)n);
	for (int32_t i = 0; i < num_seqs && sum <= n; i++) {
		if (seq_lens[i] < 1)
			return eng_fail(err, -EINVAL, "seq_lens[%d]: %d, must be >= 1", (int)i,
					(int)seq_lens[i]);
		sum += seq_lens[i];
	}
	if (sum > n)
		return eng_fail(err, -EINVAL, "seq_lens: the lengths add up to more than the %lld "
				"tokens", (long long)n);
	if (sum != n)
		return eng_fail(err, -EINVAL, "seq_lens: sum %lld != %lld tokens", (long long)sum,
				(long long)n);
	return 0;
}

int loss_mask_check(const float *mask, int64_t n, struct eng_error *err)
{
	for (int64_t t = 0; mask && t < n; t++)
		if (mask[t] != 0.0f && mask[t] != 1.0f)
			return eng_fail(err, -EINVAL, "loss_mask[%lld]: %g must be 0 or 1",
					(long long)t, (double)mask[t]);
	return 0;
}

static int check_array(const float *a, const char *name, const char *why,
		       struct eng_error *err)
{
	if (a)
		return 0;
	return eng_fail(err, -EINVAL, "%s: required by %s", name, why);
}

/* Inputs loss_compute needs beyond loss_spec_validate's presence check
 * (which the daemon runs once per request). */
static int check_batch(const struct loss_spec *s, const struct loss_batch *b,
		       struct eng_error *err)
{
	const char *why = loss_name_str(s->name);
	int r;

	r = loss_seq_lens_check(b->seq_lens, b->num_seqs, b->n, err);
	if (r)
		return r;
	if (b->n == 0)
		return 0;

	switch (s->name) {
	case LOSS_SFT:
	case LOSS_CROSS_ENTROPY:
		r = check_array(b->log_probs, "log_probs", why, err);
		break;
	case LOSS_PPO:
		r = check_array(b->log_probs, "log_probs", why, err);
		r = r ? r : check_array(b->in[LOSS_IN_ADVANTAGES], "advantages", why, err);
		if (s->policy_loss != LOSS_PG_GPG)
			r = r ? r : check_array(b->in[LOSS_IN_OLD_LOG_PROBS], "old_log_probs", why, err);
		if (s->kl_coef != 0.0)
			r = r ? r : check_array(b->in[LOSS_IN_REF_LOG_PROBS], "ref_log_probs",
						"kl_coef != 0", err);
		if (s->entropy_coeff != 0.0)
			r = r ? r : check_array(b->entropy, "entropy", "entropy_coeff != 0", err);
		break;
	case LOSS_VALUE:
		r = check_array(b->values, "values", why, err);
		r = r ? r : check_array(b->in[LOSS_IN_RETURNS], "returns", why, err);
		r = r ? r : check_array(b->in[LOSS_IN_OLD_VALUES], "old_values", why, err);
		break;
	case LOSS_DRO:
		r = check_array(b->log_probs, "log_probs", why, err);
		r = r ? r : check_array(b->in[LOSS_IN_ADVANTAGES], "advantages", why, err);
		r = r ? r : check_array(b->in[LOSS_IN_OLD_LOG_PROBS], "old_log_probs", why, err);
		break;
	case LOSS_CUSTOM:
		if (b->in[LOSS_IN_GRAD_LOG_PROBS])
			r = check_array(b->log_probs, "log_probs", "grad_log_probs", err);
		if (!r && b->in[LOSS_IN_GRAD_ENTROPY])
			r = check_array(b->entropy, "entropy", "grad_entropy", err);
		if (!r && b->in[LOSS_IN_GRAD_VALUES])
			r = check_array(b->values, "values", "grad_values", err);
		break;
	}
	return r ? r : loss_mask_check(b->in[LOSS_IN_LOSS_MASK], b->n, err);
}

static int lctx_init(struct lctx *c, const struct loss_spec *s,
		     const struct loss_batch *b, struct eng_error *err)
{
	int64_t n = b->n, t = 0;
	size_t ns = b->num_seqs > 0 ? (size_t)b->num_seqs : 1;

	memset(c, 0, sizeof(*c));
	c->s = s;
	c->b = b;
	c->m = malloc(n > 0 ? (size_t)n : 1);
	c->seq_off = malloc(ns * sizeof(int64_t));
	c->seq_cnt = malloc(ns * sizeof(int64_t));
	if (!c->m || !c->seq_off || !c->seq_cnt) {
		lctx_free(c);
		return eng_fail(err, -ENOMEM, "loss: out of memory for %lld tokens",
				(long long)n);
	}
	for (int32_t i = 0; i < b->num_seqs; i++) {
		int64_t cnt = 0;

		c->seq_off[i] = t;
		for (int32_t j = 0; j < b->seq_lens[i]; j++, t++) {
			c->m[t] = loss_token_counts(b->in[LOSS_IN_LOSS_MASK], t, j);
			cnt += c->m[t];
		}
		c->seq_cnt[i] = cnt;
		c->own_tokens += cnt;
		c->own_seqs += cnt > 0;
		if (b->seq_lens[i] > c->max_len)
			c->max_len = b->seq_lens[i];
	}

	c->nm.dp = (double)s->dp_size;
	c->nm.ntok = s->global_num_tokens > 0 ? (double)s->global_num_tokens :
		     b->norm_tokens > 0 ? b->norm_tokens : (double)c->own_tokens;
	c->nm.nseq = s->global_batch_size > 0 ? (double)s->global_batch_size :
		     b->norm_seqs > 0 ? b->norm_seqs : (double)c->own_seqs;
	c->nm.horizon = s->loss_scale_factor > 0 ? s->loss_scale_factor :
			b->norm_horizon > 0 ? b->norm_horizon : (double)c->max_len;
	c->lo = isnan(s->clip_ratio_low) ? s->clip_ratio : s->clip_ratio_low;
	c->hi = isnan(s->clip_ratio_high) ? s->clip_ratio : s->clip_ratio_high;
	return 0;
}

/* --- clip_cov / kl_cov token choice -------------------------------------- */

/* Masked means of advantages and log-probs over the batch. */
static void cov_means(const struct lctx *c, double *ret_a, double *ret_lp)
{
	const struct loss_batch *b = c->b;
	double sa = 0, sl = 0;

	for (int64_t t = 0; t < b->n; t++) {
		if (!c->m[t])
			continue;
		sa += b->in[LOSS_IN_ADVANTAGES][t];
		sl += b->log_probs[t];
	}
	*ret_a = c->own_tokens ? sa / (double)c->own_tokens : 0.0;
	*ret_lp = c->own_tokens ? sl / (double)c->own_tokens : 0.0;
}

static int select_clip_cov(struct lctx *c, struct eng_error *err)
{
	const struct loss_batch *b = c->b;
	const struct loss_spec *s = c->s;
	double ma, ml;
	int64_t *cand, ncand = 0, k;
	struct rng g;

	rng_seed(&g, b->rng_seed);
	c->sel = calloc(b->n > 0 ? (size_t)b->n : 1, 1);
	cand = malloc((b->n > 0 ? (size_t)b->n : 1) * sizeof(*cand));
	if (!c->sel || !cand) {
		free(cand);
		return eng_fail(err, -ENOMEM, "loss clip_cov: out of memory");
	}
	cov_means(c, &ma, &ml);
	for (int64_t t = 0; t < b->n; t++) {
		double a = b->in[LOSS_IN_ADVANTAGES][t], x, r, rc, pass, cov;

		if (!c->m[t])
			continue;
		x = (double)b->log_probs[t] - (double)b->in[LOSS_IN_OLD_LOG_PROBS][t];
		r = exp(x);
		rc = clamp_g(r, 1.0 - c->lo, 1.0 + c->hi, &pass);
		if (-a * rc > -a * r)  /* clipped by the PPO clip: not a candidate */
			continue;
		cov = (a - ma) * ((double)b->log_probs[t] - ml);
		if (cov > s->clip_cov_lb && cov < s->clip_cov_ub)
			cand[ncand++] = t;
	}
	/* verl: clip_num = max(int(clip_cov_ratio * mask.sum()), 1). */
	k = (int64_t)(s->clip_cov_ratio * (double)c->own_tokens);
	if (k < 1)
		k = 1;
	if (k > ncand)
		k = ncand;
	/* Partial Fisher-Yates: the first k entries become a uniform k-subset. */
	for (int64_t i = 0; i < k; i++) {
		int64_t j = i + (int64_t)rand_below(&g, (uint64_t)(ncand - i));
		int64_t tmp = cand[i];

		cand[i] = cand[j];
		cand[j] = tmp;
		c->sel[cand[i]] = 1;
	}
	free(cand);
	return 0;
}

struct cov_item {
	double cov;
	int64_t t;
};

static int cov_item_cmp(const void *pa, const void *pb)
{
	const struct cov_item *a = pa, *b = pb;

	if (a->cov > b->cov)
		return -1;
	if (a->cov < b->cov)
		return 1;
	return a->t < b->t ? -1 : a->t > b->t;
}

static int select_kl_cov(struct lctx *c, struct eng_error *err)
{
	const struct loss_batch *b = c->b;
	struct cov_item *items;
	double ma, ml;
	int64_t nv = 0, k;

	c->sel = calloc(b->n > 0 ? (size_t)b->n : 1, 1);
	items = malloc((c->own_tokens > 0 ? (size_t)c->own_tokens : 1) * sizeof(*items));
	if (!c->sel || !items) {
		free(items);
		return eng_fail(err, -ENOMEM, "loss kl_cov: out of memory");
	}
	if (c->own_tokens == 0) {
		free(items);
		return 0;
	}
	cov_means(c, &ma, &ml);
	for (int64_t t = 0; t < b->n; t++) {
		if (!c->m[t])
			continue;
		items[nv].cov = ((double)b->in[LOSS_IN_ADVANTAGES][t] - ma) *
				((double)b->log_probs[t] - ml);
		items[nv].t = t;
		nv++;
	}
	/* verl: k_percent_nums = max(1, int(len * kl_cov_ratio)). */
	k = (int64_t)((double)nv * c->s->kl_cov_ratio);
	if (k < 1)
		k = 1;
	qsort(items, (size_t)nv, sizeof(*items), cov_item_cmp);
	for (int64_t i = 0; i < k && i < nv; i++)
		c->sel[items[i].t] = 1;
	free(items);
	return 0;
}

/* --- per-token policy terms ---------------------------------------------- */

struct pg_tok {
	double l;       /* per-token loss l_t */
	double dl;      /* dl_t / dlogp_t */
	double clip;    /* pg_clipfrac indicator */
	double lower;   /* pg_clipfrac_lower indicator */
	double kl;      /* ppo_kl summand */
};

/* seq_lr: gspo's sequence log-ratio s_i of t's sequence. */
static void pg_token(const struct lctx *c, int64_t t, double seq_lr,
		     struct pg_tok *o)
{
	const struct loss_spec *s = c->s;
	const struct loss_batch *b = c->b;
	double a = b->in[LOSS_IN_ADVANTAGES][t], lp = b->log_probs[t];
	double x = b->in[LOSS_IN_OLD_LOG_PROBS] ? lp - (double)b->in[LOSS_IN_OLD_LOG_PROBS][t] : 0.0;
	double lo = 1.0 - c->lo, hi = 1.0 + c->hi;
	double xc, p, r, dr, rc, q, l1, dl1, l2, dl2, v, dv;

	memset(o, 0, sizeof(*o));
	switch (s->policy_loss) {
	case LOSS_PG_VANILLA:
		xc = clamp_g(x, -20.0, 20.0, &p);
		r = exp(xc);
		dr = p * r;
		rc = clamp_g(r, lo, hi, &q);
		l1 = -a * r;
		dl1 = -a * dr;
		l2 = -a * rc;
		dl2 = -a * q * dr;
		tmax(l1, dl1, l2, dl2, &v, &dv);
		o->clip = l2 > l1;
		if (a < 0) {
			double l3 = -a * s->clip_ratio_c;

			o->lower = v > l3;
			tmin(l3, 0.0, v, dv, &v, &dv);
		}
		o->l = v;
		o->dl = dv;
		o->kl = -xc;
		break;
	case LOSS_PG_GSPO: {
		double lv = clamp_g(seq_lr, -INFINITY, 10.0, &p);

		r = exp(lv);
		dr = p * r;
		rc = clamp_g(r, lo, hi, &q);
		l1 = -a * r;
		dl1 = -a * dr;
		l2 = -a * rc;
		dl2 = -a * q * dr;
		tmax(l1, dl1, l2, dl2, &o->l, &o->dl);
		o->clip = l2 > l1;
		o->kl = -x;
		break;
	}
	case LOSS_PG_CISPO:
		xc = clamp_g(x, -20.0, 20.0, &p);
		r = exp(xc);
		rc = clamp_g(r, lo, hi, &q);
		o->l = -rc * a * lp;
		o->dl = -rc * a;
		o->clip = r != rc;
		o->kl = -xc;
		break;
	case LOSS_PG_GPG:
		o->l = -lp * a;
		o->dl = -a;
		break;
	case LOSS_PG_SAPO: {
		double tau = a > 0 ? s->tau_pos : s->tau_neg, sg;

		xc = clamp_g(x, -20.0, 20.0, &p);
		r = exp(xc);
		dr = p * r;
		sg = 1.0 / (1.0 + exp(-tau * (r - 1.0)));
		o->l = -a * sg * 4.0 / tau;
		o->dl = -a * 4.0 * sg * (1.0 - sg) * dr;
		o->kl = -xc;
		break;
	}
	case LOSS_PG_CLIP_COV:
		r = exp(x);
		rc = clamp_g(r, lo, hi, &q);
		l1 = -a * r;
		dl1 = -a * r;
		l2 = -a * rc;
		dl2 = -a * q * r;
		tmax(l1, dl1, l2, dl2, &v, &dv);
		if (c->sel[t]) {
			v = 0.0;
			dv = 0.0;
			o->clip = 1.0;
		}
		o->l = v;
		o->dl = dv;
		o->kl = -x;
		break;
	case LOSS_PG_KL_COV:
		r = exp(x);
		o->l = -a * r;
		o->dl = -a * r;
		if (c->sel[t]) {
			o->l += s->ppo_kl_coef * fabs(x);
			o->dl += s->ppo_kl_coef * sgn(x);
		}
		o->kl = fabs(x);
		break;
	case LOSS_PG_IMPORTANCE_SAMPLING:
		xc = clamp_g(x, -20.0, 20.0, &p);
		r = exp(xc);
		o->l = -r * a;
		o->dl = -a * p * r;
		o->kl = -xc;
		break;
	case LOSS_PG_GEO_MEAN:
		break;  /* sequence level: geo_mean_seq */
	}
	if (b->in[LOSS_IN_IS_WEIGHTS] && s->policy_loss != LOSS_PG_GEO_MEAN) {
		o->l *= b->in[LOSS_IN_IS_WEIGHTS][t];
		o->dl *= b->in[LOSS_IN_IS_WEIGHTS][t];
	}
}

/* Which metrics each variant reports (verl's pg_metrics keys). */
static void pg_metric_flags(enum loss_policy p, bool *clip, bool *lower, bool *kl)
{
	*clip = *lower = *kl = true;
	switch (p) {
	case LOSS_PG_GPG:
		*clip = *lower = *kl = false;
		break;
	case LOSS_PG_CLIP_COV:
		*lower = false;
		break;
	case LOSS_PG_KL_COV:
	case LOSS_PG_IMPORTANCE_SAMPLING:
		*clip = *lower = false;
		break;
	default:
		break;
	}
}

/* KL estimator value and d/dlogp (kl_penalty of core_algos.py). */
static void kl_token(const struct loss_spec *s, double lp, double ref,
		     double *ret_v, double *ret_d)
{
	double d = lp - ref, v, g, y, p, e, kld;

	switch (s->kl_type) {
	case LOSS_KL_K1:
		v = d;
		g = 1.0;
		break;
	case LOSS_KL_ABS:
		v = fabs(d);
		g = sgn(d);
		break;
	case LOSS_KL_K2:
		v = 0.5 * d * d;
		g = d;
		break;
	case LOSS_KL_K3:
	default:
		y = clamp_g(ref - lp, -20.0, 20.0, &p);
		e = exp(y);
		kld = e - y - 1.0;
		v = clamp_g(kld, -10.0, 10.0, &g);
		g *= -(e - 1.0) * p;
		break;
	}
	if (s->kl_straight_through)
		g = d;
	*ret_v = v;
	*ret_d = g;
}

/* --- the computation ----------------------------------------------------- */

struct acc {
	double pg, ent, kl, vf;
	double clip, lower, ppo_kl, vf_clip;
};

static void set_metric(struct loss_result *res, enum loss_metric_id id,
		       double value, double weight)
{
	res->metrics[id].value = value;
	res->metrics[id].weight = weight;
	res->metrics[id].present = true;
}

/* A mean over `count` masked tokens of indicators/values summing to `sum`. */
static void set_mean(struct loss_result *res, enum loss_metric_id id,
		     double sum, int64_t count)
{
	set_metric(res, id, count > 0 ? sum / (double)count : 0.0, (double)count);
}

/* A gradient, times the batch's grad_scale (loss.h), rounded once. */
static void put(const struct loss_batch *b, float *a, int64_t t, double v)
{
	if (a)
		a[t] = (float)(b->grad_scale > 0 ? v * b->grad_scale : v);
}

/* geo_mean: one sequence's loss and gradients. Returns c_i * l_i. */
static double geo_mean_seq(const struct lctx *c, int32_t i, double ci,
			   double *dlogp, struct acc *acc)
{
	const struct loss_batch *b = c->b;
	int64_t off = c->seq_off[i], len = b->seq_lens[i];
	double n_i = (double)c->seq_cnt[i], sk = 0, sa = 0, slw = 0, ratio, abar,
	       isw = 1.0, li;

	if (c->seq_cnt[i] == 0)
		return 0.0;
	for (int64_t t = off; t < off + len; t++) {
		double a = b->in[LOSS_IN_ADVANTAGES][t], x, xcl, p, sa_, mn, dmn;

		if (!c->m[t])
			continue;
		x = (double)b->log_probs[t] - (double)b->in[LOSS_IN_OLD_LOG_PROBS][t];
		xcl = clamp_g(x, -c->lo, c->hi, &p);
		sa_ = sgn(a);
		tmin(sa_ * x, sa_, sa_ * xcl, sa_ * p, &mn, &dmn);
		sk += sa_ * mn;
		dlogp[t - off] = sa_ * dmn;  /* dk_t/dx, scaled below */
		sa += a;
		if (b->in[LOSS_IN_IS_WEIGHTS])
			slw += log((double)b->in[LOSS_IN_IS_WEIGHTS][t] + 1e-10);
		acc->clip += (x != xcl && a > 0);
		acc->lower += (x != xcl && a < 0);
		acc->ppo_kl += -x;
	}
	/* verl divides these sequence means by (n_i + 1e-8); so do we. */
	n_i += 1e-8;
	ratio = exp(sk / n_i);
	abar = sa / n_i;
	if (b->in[LOSS_IN_IS_WEIGHTS])
		isw = exp(slw / n_i);
	li = -abar * ratio * isw;
	for (int64_t t = off; t < off + len; t++)
		dlogp[t - off] = c->m[t] ? ci * li * dlogp[t - off] / n_i : 0.0;
	return ci * li;
}

/* The custom loss: the client differentiated its own loss L over the
 * model's outputs and sends dL/dlog_probs, dL/dentropy, dL/dvalues; they
 * are the gradients, as given (no mask, no normalization: the client
 * applied its own). The loss reported is the first-order surrogate
 * sum(g * output), whose gradient they are. */
static int custom_compute(const struct loss_batch *b, struct loss_result *res)
{
	const float *g[3] = { b->in[LOSS_IN_GRAD_LOG_PROBS], b->in[LOSS_IN_GRAD_ENTROPY],
			      b->in[LOSS_IN_GRAD_VALUES] };
	const float *out[3] = { b->log_probs, b->entropy, b->values };
	float *d[3] = { res->d_log_probs, res->d_entropy, res->d_values };
	double loss = 0.0;

	for (int k = 0; k < 3; k++) {
		for (int64_t t = 0; t < b->n; t++) {
			double gt = g[k] ? (double)g[k][t] : 0.0;

			if (g[k])
				loss += gt * (double)out[k][t];
			put(b, d[k], t, gt);
		}
	}
	memset(res->metrics, 0, sizeof(res->metrics));
	for (int k = 0; k < LOSS_M_COUNT; k++)
		res->metrics[k].weight = 1.0;
	set_metric(res, LOSS_M_LOSS, loss, 1.0);
	set_metric(res, LOSS_M_NUM_TOKENS, (double)b->n, 1.0);
	set_metric(res, LOSS_M_NUM_SEQUENCES, (double)b->num_seqs, 1.0);
	res->loss = loss;
	if (res->selected)
		memset(res->selected, 0, (size_t)b->n);
	return 0;
}

int loss_compute(const struct loss_spec *s, const struct loss_batch *b,
		 struct loss_result *res, struct eng_error *err)
{
	int r = loss_spec_validate(s, NULL, err);

	r = r ? r : check_batch(s, b, err);
	return r ? r : loss_compute_checked(s, b, res, err);
}

int loss_compute_checked(const struct loss_spec *s, const struct loss_batch *b,
			 struct loss_result *res, struct eng_error *err)
{
	struct lctx c;
	struct acc acc = {0};
	enum loss_agg pg_agg = loss_spec_pg_agg(s), agg = s->agg;
	bool is_ppo = s->name == LOSS_PPO, geo = is_ppo && s->policy_loss == LOSS_PG_GEO_MEAN;
	bool want_ent = is_ppo && b->entropy, want_kl = is_ppo && b->in[LOSS_IN_REF_LOG_PROBS];
	double *geo_d = NULL, loss;
	int r;

	if (s->name == LOSS_CUSTOM)
		return custom_compute(b, res);
	r = lctx_init(&c, s, b, err);
	if (r)
		return r;
	if (is_ppo && s->policy_loss == LOSS_PG_CLIP_COV)
		r = select_clip_cov(&c, err);
	else if (is_ppo && s->policy_loss == LOSS_PG_KL_COV)
		r = select_kl_cov(&c, err);
	if (!r && geo) {
		int64_t maxl = c.max_len > 0 ? c.max_len : 1;

		geo_d = malloc((size_t)maxl * sizeof(*geo_d));
		if (!geo_d)
			r = eng_fail(err, -ENOMEM, "loss geo_mean: out of memory");
	}
	if (r) {
		lctx_free(&c);
		return r;
	}

	for (int32_t i = 0; i < b->num_seqs; i++) {
		int64_t off = c.seq_off[i], len = b->seq_lens[i];
		double n_i = (double)c.seq_cnt[i];
		double c_pg = agg_coef(pg_agg, &c.nm, n_i);
		double c_ag = agg_coef(agg, &c.nm, n_i);
		double seq_lr = 0.0;

		if (is_ppo && s->policy_loss == LOSS_PG_GSPO) {
			for (int64_t t = off; t < off + len; t++)
				if (c.m[t])
					seq_lr += (double)b->log_probs[t] -
						  (double)b->in[LOSS_IN_OLD_LOG_PROBS][t];
			seq_lr /= n_i > 1 ? n_i : 1.0;
		}
		if (geo)
			acc.pg += geo_mean_seq(&c, i, agg_coef(LOSS_AGG_SEQ_MEAN_TOKEN_SUM,
							       &c.nm, n_i), geo_d, &acc);

		for (int64_t t = off; t < off + len; t++) {
			double dlp = 0.0, dent = 0.0, dval = 0.0;

			if (!c.m[t]) {
				put(b, res->d_log_probs, t, 0.0);
				put(b, res->d_entropy, t, 0.0);
				put(b, res->d_values, t, 0.0);
				continue;
			}
			switch (s->name) {
			case LOSS_SFT:
			case LOSS_CROSS_ENTROPY: {
				double w = b->in[LOSS_IN_TOKEN_WEIGHTS] ? b->in[LOSS_IN_TOKEN_WEIGHTS][t] : 1.0;

				acc.pg += c_pg * -w * (double)b->log_probs[t];
				dlp = c_pg * -w;
				break;
			}
			case LOSS_CUSTOM:  /* custom_compute, above */
				break;
			case LOSS_DRO: {
				double a = b->in[LOSS_IN_ADVANTAGES][t], lp = b->log_probs[t];
				double d = lp - (double)b->in[LOSS_IN_OLD_LOG_PROBS][t];

				acc.pg += c_pg * -(lp * a - 0.5 * s->beta * d * d);
				dlp = c_pg * (-a + s->beta * d);
				break;
			}
			case LOSS_VALUE: {
				double v = b->values[t], ret = b->in[LOSS_IN_RETURNS][t], ov = b->in[LOSS_IN_OLD_VALUES][t];
				double e = s->cliprange_value, vc, dvc, vf1, vf2, vm, dvm;

				/* clip_by_value: max(min(v, ov + e), ov - e) */
				tmin(v, 1.0, ov + e, 0.0, &vc, &dvc);
				tmax(vc, dvc, ov - e, 0.0, &vc, &dvc);
				vf1 = (v - ret) * (v - ret);
				vf2 = (vc - ret) * (vc - ret);
				tmax(vf1, 2.0 * (v - ret), vf2, 2.0 * (vc - ret) * dvc, &vm, &dvm);
				acc.vf += 0.5 * c_pg * vm;
				dval = 0.5 * c_pg * dvm;
				acc.vf_clip += vf2 > vf1;
				break;
			}
			case LOSS_PPO: {
				struct pg_tok pt;

				if (geo) {
					dlp = geo_d[t - off];
				} else {
					pg_token(&c, t, seq_lr, &pt);
					acc.pg += c_pg * pt.l;
					dlp = c_pg * pt.dl;
					acc.clip += pt.clip;
					acc.lower += pt.lower;
					acc.ppo_kl += pt.kl;
				}
				if (want_ent) {
					acc.ent += c_ag * (double)b->entropy[t];
					dent = -s->entropy_coeff * c_ag;
				}
				if (want_kl) {
					double kv, kd;

					kl_token(s, b->log_probs[t], b->in[LOSS_IN_REF_LOG_PROBS][t], &kv, &kd);
					acc.kl += c_ag * kv;
					dlp += s->kl_coef * c_ag * kd;
				}
				break;
			}
			}
			put(b, res->d_log_probs, t, dlp);
			put(b, res->d_entropy, t, dent);
			put(b, res->d_values, t, dval);
		}
	}

	/* Everything below only writes res. */
	memset(res->metrics, 0, sizeof(res->metrics));
	for (int k = 0; k < LOSS_M_COUNT; k++)
		res->metrics[k].weight = 1.0;
	switch (s->name) {
	case LOSS_SFT:
	case LOSS_CROSS_ENTROPY:
	case LOSS_DRO:
		loss = acc.pg;
		break;
	case LOSS_VALUE:
		loss = acc.vf;
		set_metric(res, LOSS_M_VF_LOSS, acc.vf, 1.0);
		set_mean(res, LOSS_M_VF_CLIPFRAC, acc.vf_clip, c.own_tokens);
		break;
	case LOSS_PPO:
	default: {
		bool clip, lower, kl;

		loss = acc.pg - s->entropy_coeff * acc.ent + s->kl_coef * acc.kl;
		set_metric(res, LOSS_M_PG_LOSS, acc.pg, 1.0);
		pg_metric_flags(s->policy_loss, &clip, &lower, &kl);
		if (clip)
			set_mean(res, LOSS_M_PG_CLIPFRAC, acc.clip, c.own_tokens);
		if (lower)
			set_mean(res, LOSS_M_PG_CLIPFRAC_LOWER, acc.lower, c.own_tokens);
		if (kl)
			set_mean(res, LOSS_M_PPO_KL, acc.ppo_kl, c.own_tokens);
		if (want_ent)
			set_metric(res, LOSS_M_ENTROPY, acc.ent, 1.0);
		if (want_kl)
			set_metric(res, LOSS_M_KL_LOSS, acc.kl, 1.0);
		break;
	}
	}
	set_metric(res, LOSS_M_LOSS, loss, 1.0);
	set_metric(res, LOSS_M_NUM_TOKENS, (double)c.own_tokens, 1.0);
	set_metric(res, LOSS_M_NUM_SEQUENCES, (double)b->num_seqs, 1.0);
	res->loss = loss;
	if (res->selected) {
		for (int64_t t = 0; t < b->n; t++)
			res->selected[t] = c.sel ? c.sel[t] : 0;
	}
	free(geo_d);
	lctx_free(&c);
	return 0;
}
