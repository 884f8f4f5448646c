/* loss_spec.c — parsing and validation of loss specs (see loss.h).
 *
 * The daemon receives a loss as a name and a map of options whose values
 * are strings or numbers; both arrive here as text. Defaults are verl's
 * (verl-project/verl 018f23b5f83a: verl/trainer/config/actor/actor.yaml,
 * critic cliprange_value 0.5) and, for the Tinker names, Tinker's (sums,
 * no normalization).
 */
#include "loss.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char *const name_strs[] = {
	[LOSS_SFT] = "sft",
	[LOSS_CROSS_ENTROPY] = "cross_entropy",
	[LOSS_PPO] = "ppo",
	[LOSS_VALUE] = "value",
	[LOSS_DRO] = "dro",
	[LOSS_CUSTOM] = "custom",
};

static const char *const policy_strs[] = {
	[LOSS_PG_VANILLA] = "vanilla",
	[LOSS_PG_GSPO] = "gspo",
	[LOSS_PG_CISPO] = "cispo",
	[LOSS_PG_GPG] = "gpg",
	[LOSS_PG_SAPO] = "sapo",
	[LOSS_PG_CLIP_COV] = "clip_cov",
	[LOSS_PG_KL_COV] = "kl_cov",
	[LOSS_PG_GEO_MEAN] = "geo_mean",
	[LOSS_PG_IMPORTANCE_SAMPLING] = "importance_sampling",
};

static const char *const agg_strs[] = {
	[LOSS_AGG_TOKEN_MEAN] = "token-mean",
	[LOSS_AGG_TOKEN_SUM] = "token-sum",
	[LOSS_AGG_SEQ_MEAN_TOKEN_SUM] = "seq-mean-token-sum",
	[LOSS_AGG_SEQ_MEAN_TOKEN_MEAN] = "seq-mean-token-mean",
	[LOSS_AGG_SEQ_MEAN_TOKEN_SUM_NORM] = "seq-mean-token-sum-norm",
};

static const char *const kl_strs[] = {
	[LOSS_KL_K1] = "k1",
	[LOSS_KL_ABS] = "abs",
	[LOSS_KL_K2] = "k2",
	[LOSS_KL_K3] = "k3",
};

#define LOSS_IN_ROW(id, name, read_by) [LOSS_IN_##id] = { name, read_by },
const struct loss_input_info loss_inputs[LOSS_IN_COUNT] = {
	LOSS_REQUEST_INPUTS(LOSS_IN_ROW)
	[LOSS_IN_ENTROPY] = { "entropy", "ppo with entropy_coeff != 0 (model output)" },
	[LOSS_IN_VALUES] = { "values", "value (model output of a value model)" },
};
#undef LOSS_IN_ROW

static const char *const metric_strs[] = {
	[LOSS_M_LOSS] = "loss",
	[LOSS_M_PG_LOSS] = "pg_loss",
	[LOSS_M_PG_CLIPFRAC] = "pg_clipfrac",
	[LOSS_M_PG_CLIPFRAC_LOWER] = "pg_clipfrac_lower",
	[LOSS_M_PPO_KL] = "ppo_kl",
	[LOSS_M_ENTROPY] = "entropy",
	[LOSS_M_KL_LOSS] = "kl_loss",
	[LOSS_M_VF_LOSS] = "vf_loss",
	[LOSS_M_VF_CLIPFRAC] = "vf_clipfrac",
	[LOSS_M_NUM_TOKENS] = "num_tokens",
	[LOSS_M_NUM_SEQUENCES] = "num_sequences",
};

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

static const char *table_str(const char *const *t, size_t len, int i)
{
	if (i < 0 || (size_t)i >= len)
		return "?";
	return t[i];
}

const char *loss_name_str(enum loss_name n)
{
	return table_str(name_strs, ARRAY_LEN(name_strs), (int)n);
}

const char *loss_policy_str(enum loss_policy p)
{
	return table_str(policy_strs, ARRAY_LEN(policy_strs), (int)p);
}

const char *loss_agg_str(enum loss_agg a)
{
	return table_str(agg_strs, ARRAY_LEN(agg_strs), (int)a);
}

const char *loss_kl_type_str(enum loss_kl_type k)
{
	return table_str(kl_strs, ARRAY_LEN(kl_strs), (int)k);
}

const char *loss_input_str(enum loss_input i)
{
	return i >= 0 && i < LOSS_IN_COUNT ? loss_inputs[i].name : "?";
}

const char *loss_metric_str(enum loss_metric_id m)
{
	return table_str(metric_strs, ARRAY_LEN(metric_strs), (int)m);
}

bool loss_metric_is_mean(enum loss_metric_id m)
{
	return m == LOSS_M_PG_CLIPFRAC || m == LOSS_M_PG_CLIPFRAC_LOWER ||
	       m == LOSS_M_PPO_KL || m == LOSS_M_VF_CLIPFRAC;
}

enum loss_agg loss_spec_pg_agg(const struct loss_spec *s)
{
	if (s->name == LOSS_PPO &&
	    (s->policy_loss == LOSS_PG_GSPO || s->policy_loss == LOSS_PG_SAPO))
		return LOSS_AGG_SEQ_MEAN_TOKEN_MEAN;
	return s->agg;
}

void loss_inputs_present_init(struct loss_inputs_present *p, int64_t n)
{
	p->n = n;
	for (int i = 0; i < LOSS_IN_COUNT; i++)
		p->len[i] = -1;
}

/* Index of `str` in table t, or -1. */
static int table_find(const char *const *t, size_t len, const char *str)
{
	for (size_t i = 0; i < len; i++)
		if (t[i] && strcmp(t[i], str) == 0)
			return (int)i;
	return -1;
}

static void list_table(char *buf, size_t size, const char *const *t, size_t len)
{
	size_t used = 0;

	buf[0] = '\0';
	for (size_t i = 0; i < len && used < size; i++) {
		int w = snprintf(buf + used, size - used, "%s%s", i ? ", " : "", t[i]);

		if (w < 0)
			break;
		used += (size_t)w;
	}
}

int loss_spec_init(struct loss_spec *s, const char *name, struct eng_error *err)
{
	struct loss_spec d = {
		.name = LOSS_PPO,
		.policy_loss = LOSS_PG_VANILLA,
		.agg = LOSS_AGG_TOKEN_MEAN,
		.clip_ratio = 0.2,
		.clip_ratio_low = NAN,
		.clip_ratio_high = NAN,
		.clip_ratio_c = 3.0,
		.entropy_coeff = 0.0,
		.kl_coef = 0.0,
		.kl_type = LOSS_KL_K3,
		.kl_straight_through = false,
		.cliprange_value = 0.5,
		.loss_scale_factor = 0.0,
		.global_num_tokens = 0,
		.global_batch_size = 0,
		.dp_size = 1,
		.clip_cov_ratio = 0.0002,
		.clip_cov_lb = 1.0,
		.clip_cov_ub = 5.0,
		.kl_cov_ratio = 0.0002,
		.ppo_kl_coef = 0.1,
		.tau_pos = 1.0,
		.tau_neg = 1.05,
		.beta = 0.05,
		.seed = 0,
	};
	char known[160];
	int i;

	if (!name)
		return eng_fail(err, -EINVAL, "loss.name: missing");
	if (strcmp(name, "importance_sampling") == 0) {
		/* Tinker's importance_sampling: -(r * A), summed. */
		d.name = LOSS_PPO;
		d.policy_loss = LOSS_PG_IMPORTANCE_SAMPLING;
		d.agg = LOSS_AGG_TOKEN_SUM;
		*s = d;
		return 0;
	}
	i = table_find(name_strs, ARRAY_LEN(name_strs), name);
	if (i < 0) {
		list_table(known, sizeof(known), name_strs, ARRAY_LEN(name_strs));
		return eng_fail(err, -EINVAL,
				"loss.name: unknown loss \"%s\" (known: %s, importance_sampling)",
				name, known);
	}
	d.name = (enum loss_name)i;
	/* Tinker's losses are sums over tokens; verl's are token means. */
	if (d.name == LOSS_CROSS_ENTROPY || d.name == LOSS_DRO)
		d.agg = LOSS_AGG_TOKEN_SUM;
	*s = d;
	return 0;
}

/* Parse a finite double; the whole text must be consumed. */
static int parse_double(const char *key, const char *value, double *ret,
			struct eng_error *err)
{
	char *end;
	double v;

	if (!value || !*value)
		return eng_fail(err, -EINVAL, "loss.%s: empty value", key);
	errno = 0;
	v = strtod(value, &end);
	while (*end == ' ' || *end == '\t')
		end++;
	if (end == value || *end != '\0' || errno == ERANGE || !isfinite(v))
		return eng_fail(err, -EINVAL, "loss.%s: \"%s\" is not a finite number",
				key, value);
	*ret = v;
	return 0;
}

/* Parse a non-negative integer count; "4096" and "4096.0" both accepted
 * because the daemon's option map carries numbers as doubles. */
static int parse_count(const char *key, const char *value, int64_t *ret,
		       struct eng_error *err)
{
	double v = 0.0;
	int r = parse_double(key, value, &v, err);

	if (r < 0)
		return r;
	if (v < 0 || v != floor(v) || v > 9.0e15)
		return eng_fail(err, -EINVAL,
				"loss.%s: \"%s\" is not a non-negative integer", key, value);
	*ret = (int64_t)v;
	return 0;
}

static int parse_seed(const char *key, const char *value, uint64_t *ret,
		      struct eng_error *err)
{
	int64_t v = 0;
	char *end;
	unsigned long long u;

	/* Seeds may exceed 2^53: take plain unsigned integers exactly. */
	if (value && *value && *value != '-') {
		errno = 0;
		u = strtoull(value, &end, 10);
		if (end != value && *end == '\0' && errno == 0) {
			*ret = (uint64_t)u;
			return 0;
		}
	}
	if (parse_count(key, value, &v, err) < 0)
		return -EINVAL;
	*ret = (uint64_t)v;
	return 0;
}

/* Option table: key, field kind, offset. */
enum opt_kind {
	OPT_DOUBLE,
	OPT_COUNT,
	OPT_SEED,
	OPT_POLICY,
	OPT_AGG,
	OPT_KL_TYPE,
};

struct opt {
	const char *key;
	enum opt_kind kind;
	size_t off;
};

#define OPT(k, kind, field) { k, kind, offsetof(struct loss_spec, field) }

static const struct opt opts[] = {
	OPT("policy_loss", OPT_POLICY, policy_loss),
	OPT("loss_mode", OPT_POLICY, policy_loss),
	OPT("loss_agg_mode", OPT_AGG, agg),
	OPT("clip_ratio", OPT_DOUBLE, clip_ratio),
	OPT("clip_ratio_low", OPT_DOUBLE, clip_ratio_low),
	OPT("clip_ratio_high", OPT_DOUBLE, clip_ratio_high),
	OPT("clip_ratio_c", OPT_DOUBLE, clip_ratio_c),
	OPT("entropy_coeff", OPT_DOUBLE, entropy_coeff),
	OPT("kl_coef", OPT_DOUBLE, kl_coef),
	OPT("kl_loss_coef", OPT_DOUBLE, kl_coef),
	OPT("kl_type", OPT_KL_TYPE, kl_type),
	OPT("kl_loss_type", OPT_KL_TYPE, kl_type),
	OPT("cliprange_value", OPT_DOUBLE, cliprange_value),
	OPT("loss_scale_factor", OPT_DOUBLE, loss_scale_factor),
	OPT("global_num_tokens", OPT_COUNT, global_num_tokens),
	OPT("global_batch_size", OPT_COUNT, global_batch_size),
	OPT("dp_size", OPT_COUNT, dp_size),
	OPT("clip_cov_ratio", OPT_DOUBLE, clip_cov_ratio),
	OPT("clip_cov_lb", OPT_DOUBLE, clip_cov_lb),
	OPT("clip_cov_ub", OPT_DOUBLE, clip_cov_ub),
	OPT("kl_cov_ratio", OPT_DOUBLE, kl_cov_ratio),
	OPT("ppo_kl_coef", OPT_DOUBLE, ppo_kl_coef),
	OPT("tau_pos", OPT_DOUBLE, tau_pos),
	OPT("tau_neg", OPT_DOUBLE, tau_neg),
	OPT("beta", OPT_DOUBLE, beta),
	OPT("seed", OPT_SEED, seed),
};

static int parse_kl_type(const char *key, const char *value,
			 enum loss_kl_type *ret, bool *ret_st, struct eng_error *err)
{
	static const struct { const char *s; enum loss_kl_type k; } names[] = {
		{ "k1", LOSS_KL_K1 }, { "kl", LOSS_KL_K1 },
		{ "abs", LOSS_KL_ABS },
		{ "k2", LOSS_KL_K2 }, { "mse", LOSS_KL_K2 },
		{ "k3", LOSS_KL_K3 }, { "low_var_kl", LOSS_KL_K3 },
	};
	char base[32];
	size_t len = value ? strlen(value) : 0;
	bool st = false;

	if (len > 0 && value[len - 1] == '+') {
		st = true;
		len--;
	}
	if (len == 0 || len >= sizeof(base))
		goto bad;
	memcpy(base, value, len);
	base[len] = '\0';
	for (size_t i = 0; i < ARRAY_LEN(names); i++) {
		if (strcmp(base, names[i].s) == 0) {
			*ret = names[i].k;
			*ret_st = st;
			return 0;
		}
	}
bad:
	return eng_fail(err, -EINVAL,
			"loss.%s: unknown KL type \"%s\" (known: k1|kl, abs, k2|mse, "
			"k3|low_var_kl, each optionally with a '+' suffix)",
			key, value ? value : "");
}

int loss_spec_set(struct loss_spec *s, const char *key, const char *value,
		  struct eng_error *err)
{
	const struct opt *o = NULL;
	char *field;
	char known[256];
	int i, r;

	if (!key)
		return eng_fail(err, -EINVAL, "loss: option without a key");
	for (size_t k = 0; k < ARRAY_LEN(opts); k++) {
		if (strcmp(opts[k].key, key) == 0) {
			o = &opts[k];
			break;
		}
	}
	if (!o)
		return eng_fail(err, -EINVAL, "loss.%s: unknown option for loss %s",
				key, loss_name_str(s->name));
	field = (char *)s + o->off;

	/* verl's configs leave these null ("use the default"). */
	if (value && (strcasecmp(value, "null") == 0 || strcasecmp(value, "none") == 0)) {
		if (o->off == offsetof(struct loss_spec, clip_ratio_low)) {
			s->clip_ratio_low = NAN;
			return 0;
		}
		if (o->off == offsetof(struct loss_spec, clip_ratio_high)) {
			s->clip_ratio_high = NAN;
			return 0;
		}
		if (o->off == offsetof(struct loss_spec, loss_scale_factor)) {
			s->loss_scale_factor = 0.0;
			return 0;
		}
		if (o->off == offsetof(struct loss_spec, global_num_tokens)) {
			s->global_num_tokens = 0;
			return 0;
		}
		if (o->off == offsetof(struct loss_spec, global_batch_size)) {
			s->global_batch_size = 0;
			return 0;
		}
	}

	switch (o->kind) {
	case OPT_DOUBLE: {
		double v = 0.0;

		r = parse_double(key, value, &v, err);
		if (r < 0)
			return r;
		memcpy(field, &v, sizeof(v));
		return 0;
	}
	case OPT_COUNT: {
		int64_t v = 0;

		r = parse_count(key, value, &v, err);
		if (r < 0)
			return r;
		memcpy(field, &v, sizeof(v));
		return 0;
	}
	case OPT_SEED: {
		uint64_t v = 0;

		r = parse_seed(key, value, &v, err);
		if (r < 0)
			return r;
		memcpy(field, &v, sizeof(v));
		return 0;
	}
	case OPT_POLICY:
		i = value ? table_find(policy_strs, ARRAY_LEN(policy_strs), value) : -1;
		if (i < 0) {
			list_table(known, sizeof(known), policy_strs, ARRAY_LEN(policy_strs));
			return eng_fail(err, -EINVAL,
					"loss.%s: unknown policy loss \"%s\" (known: %s)",
					key, value ? value : "", known);
		}
		s->policy_loss = (enum loss_policy)i;
		return 0;
	case OPT_AGG:
		i = value ? table_find(agg_strs, ARRAY_LEN(agg_strs), value) : -1;
		if (i < 0) {
			list_table(known, sizeof(known), agg_strs, ARRAY_LEN(agg_strs));
			return eng_fail(err, -EINVAL,
					"loss.%s: unknown aggregation \"%s\" (known: %s)",
					key, value ? value : "", known);
		}
		s->agg = (enum loss_agg)i;
		return 0;
	case OPT_KL_TYPE:
		return parse_kl_type(key, value, &s->kl_type, &s->kl_straight_through, err);
	}
	return eng_fail(err, -EINVAL, "loss.%s: unhandled option", key);
}

static int check_nonneg(const char *key, double v, struct eng_error *err)
{
	if (!(v >= 0.0) || !isfinite(v))
		return eng_fail(err, -EINVAL, "loss.%s: %g must be a finite value >= 0",
				key, v);
	return 0;
}

static int check_pos(const char *key, double v, struct eng_error *err)
{
	if (!(v > 0.0) || !isfinite(v))
		return eng_fail(err, -EINVAL, "loss.%s: %g must be > 0", key, v);
	return 0;
}

/* A fraction of the tokens (clip_cov / kl_cov choose ratio x tokens). */
static int check_fraction(const char *key, double v, struct eng_error *err)
{
	if (!(v > 0.0 && v <= 1.0))
		return eng_fail(err, -EINVAL, "loss.%s: %g must be in (0, 1] (a fraction of the tokens)",
				key, v);
	return 0;
}

static int check_ranges(const struct loss_spec *s, struct eng_error *err)
{
	bool pg = s->name == LOSS_PPO;
	enum loss_policy p = s->policy_loss;
	int r = 0;

	if ((unsigned)s->name >= ARRAY_LEN(name_strs))
		return eng_fail(err, -EINVAL, "loss.name: invalid value %d", (int)s->name);
	if ((unsigned)p >= ARRAY_LEN(policy_strs))
		return eng_fail(err, -EINVAL, "loss.policy_loss: invalid value %d", (int)p);
	if ((unsigned)s->agg >= ARRAY_LEN(agg_strs))
		return eng_fail(err, -EINVAL, "loss.loss_agg_mode: invalid value %d",
				(int)s->agg);
	if ((unsigned)s->kl_type >= ARRAY_LEN(kl_strs))
		return eng_fail(err, -EINVAL, "loss.kl_type: invalid value %d",
				(int)s->kl_type);

	r = r ? r : check_nonneg("clip_ratio", s->clip_ratio, err);
	if (!isnan(s->clip_ratio_low))
		r = r ? r : check_nonneg("clip_ratio_low", s->clip_ratio_low, err);
	if (!isnan(s->clip_ratio_high))
		r = r ? r : check_nonneg("clip_ratio_high", s->clip_ratio_high, err);
	r = r ? r : check_nonneg("cliprange_value", s->cliprange_value, err);
	r = r ? r : check_nonneg("kl_coef", s->kl_coef, err);
	r = r ? r : check_nonneg("loss_scale_factor", s->loss_scale_factor, err);
	r = r ? r : check_nonneg("ppo_kl_coef", s->ppo_kl_coef, err);
	r = r ? r : check_nonneg("beta", s->beta, err);
	if (r)
		return r;
	if (!isfinite(s->entropy_coeff))
		return eng_fail(err, -EINVAL, "loss.entropy_coeff: must be finite");
	if (!isfinite(s->clip_cov_lb) || !isfinite(s->clip_cov_ub))
		return eng_fail(err, -EINVAL, "loss.clip_cov_lb/clip_cov_ub: must be finite");
	if (s->dp_size < 1)
		return eng_fail(err, -EINVAL, "loss.dp_size: %lld must be >= 1",
				(long long)s->dp_size);
	if (s->global_num_tokens < 0 || s->global_batch_size < 0)
		return eng_fail(err, -EINVAL, "loss.global_%s: must be >= 0",
				s->global_num_tokens < 0 ? "num_tokens" : "batch_size");
	/* verl asserts this for the dual clip only. */
	if (pg && p == LOSS_PG_VANILLA && !(s->clip_ratio_c > 1.0 && isfinite(s->clip_ratio_c)))
		return eng_fail(err, -EINVAL,
				"loss.clip_ratio_c: %g must be > 1 (dual-clip PPO)",
				s->clip_ratio_c);
	if (pg && p == LOSS_PG_CLIP_COV &&
	    (r = check_fraction("clip_cov_ratio", s->clip_cov_ratio, err)))
		return r;
	if (pg && p == LOSS_PG_KL_COV && (r = check_fraction("kl_cov_ratio", s->kl_cov_ratio, err)))
		return r;
	if (pg && p == LOSS_PG_SAPO) {
		r = check_pos("tau_pos", s->tau_pos, err);
		r = r ? r : check_pos("tau_neg", s->tau_neg, err);
		if (r)
			return r;
	}
	return 0;
}

/* The aggregation modes a spec uses: the policy/value/sft term's and, for
 * ppo, the entropy and KL terms' (s->agg). */
static int check_dp(const struct loss_spec *s, enum loss_agg a, struct eng_error *err)
{
	if (s->dp_size <= 1)
		return 0;
	if (a == LOSS_AGG_TOKEN_MEAN && s->global_num_tokens == 0)
		return eng_fail(err, -EINVAL,
				"loss.global_num_tokens: required with dp_size %lld and %s",
				(long long)s->dp_size, loss_agg_str(a));
	if (a != LOSS_AGG_TOKEN_MEAN && a != LOSS_AGG_TOKEN_SUM &&
	    s->global_batch_size == 0)
		return eng_fail(err, -EINVAL,
				"loss.global_batch_size: required with dp_size %lld and %s",
				(long long)s->dp_size, loss_agg_str(a));
	return 0;
}

static bool has(const struct loss_inputs_present *p, enum loss_input i)
{
	return p->len[i] >= 0;
}

static int need(const struct loss_spec *s, const struct loss_inputs_present *p,
		enum loss_input i, const char *why, struct eng_error *err)
{
	if (has(p, i))
		return 0;
	return eng_fail(err, -EINVAL, "%s: required by %s", loss_input_str(i), why);
}

int loss_spec_validate(const struct loss_spec *s,
		       const struct loss_inputs_present *present,
		       struct eng_error *err)
{
	char why[96];
	int r;

	r = check_ranges(s, err);
	if (r)
		return r;
	r = check_dp(s, s->agg, err);
	if (r)
		return r;
	if (s->name == LOSS_PPO) {
		r = check_dp(s, loss_spec_pg_agg(s), err);
		if (r)
			return r;
		/* geo_mean averages over sequences. */
		if (s->policy_loss == LOSS_PG_GEO_MEAN &&
		    (r = check_dp(s, LOSS_AGG_SEQ_MEAN_TOKEN_MEAN, err)))
			return r;
	}
	if (!present)
		return 0;

	if (present->n < 0)
		return eng_fail(err, -EINVAL, "n: %lld tokens", (long long)present->n);
	for (int i = 0; i < LOSS_IN_COUNT; i++) {
		if (present->len[i] >= 0 && present->len[i] != present->n)
			return eng_fail(err, -EINVAL,
					"%s: %lld elements, expected %lld (one per token)",
					loss_input_str((enum loss_input)i),
					(long long)present->len[i], (long long)present->n);
	}

	switch (s->name) {
	case LOSS_SFT:
	case LOSS_CROSS_ENTROPY:
		return 0;
	case LOSS_PPO:
		snprintf(why, sizeof(why), "loss ppo/%s", loss_policy_str(s->policy_loss));
		r = need(s, present, LOSS_IN_ADVANTAGES, why, err);
		if (!r && s->policy_loss != LOSS_PG_GPG)
			r = need(s, present, LOSS_IN_OLD_LOG_PROBS, why, err);
		if (!r && s->kl_coef != 0.0)
			r = need(s, present, LOSS_IN_REF_LOG_PROBS, "kl_coef != 0", err);
		if (!r && s->entropy_coeff != 0.0)
			r = need(s, present, LOSS_IN_ENTROPY, "entropy_coeff != 0", err);
		return r;
	case LOSS_VALUE:
		r = need(s, present, LOSS_IN_RETURNS, "loss value", err);
		r = r ? r : need(s, present, LOSS_IN_OLD_VALUES, "loss value", err);
		r = r ? r : need(s, present, LOSS_IN_VALUES,
				 "loss value (model_type value_model)", err);
		return r;
	case LOSS_DRO:
		r = need(s, present, LOSS_IN_ADVANTAGES, "loss dro", err);
		r = r ? r : need(s, present, LOSS_IN_OLD_LOG_PROBS, "loss dro", err);
		return r;
	case LOSS_CUSTOM:
		if (!has(present, LOSS_IN_GRAD_LOG_PROBS) && !has(present, LOSS_IN_GRAD_ENTROPY) &&
		    !has(present, LOSS_IN_GRAD_VALUES))
			return eng_fail(err, -EINVAL,
					"grad_log_probs, grad_entropy, grad_values: loss custom needs "
					"at least one");
		/* Log-probs and entropy come from a language model, values from
		 * a value model. */
		if (has(present, LOSS_IN_GRAD_LOG_PROBS) || has(present, LOSS_IN_GRAD_ENTROPY))
			r = need(s, present, LOSS_IN_ENTROPY,
				 "grad_log_probs / grad_entropy (model_type language_model)", err);
		if (!r && has(present, LOSS_IN_GRAD_VALUES))
			r = need(s, present, LOSS_IN_VALUES,
				 "grad_values (model_type value_model)", err);
		return r;
	}
	return 0;
}
