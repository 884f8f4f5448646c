/* loss.h — the loss library (docs/DESIGN.md §5): policy, value, SFT and Tinker
 * losses on per-token arrays, with verl's aggregation modes.
 *
 * A loss is a pure function of per-token arrays: the model outputs
 * (log-prob, entropy, value) and the request's inputs (loss_mask,
 * old_log_probs, ...), for a packed batch of whole sequences. It returns
 * the scalar loss, named metrics and the per-token gradients dL/dlogp,
 * dL/dentropy, dL/dvalue that the engine back-propagates, so every loss
 * runs on every device and is testable alone.
 *
 * Formulas follow verl (verl-project/verl commit 018f23b5f83a, file
 * verl/trainer/ppo/core_algos.py; verl/workers/utils/losses.py at
 * 02de5fec2042 for how pg, entropy and KL terms are combined) and the
 * Tinker loss documentation (cross_entropy, importance_sampling, dro).
 * Each formula, with the places where engined deliberately differs, is
 * written next to its code in loss.c.
 *
 * Normalization. Every aggregation is linear in the per-token losses:
 * L = sum_t c_t * l_t with c_t from the mode and a normalizer:
 *   token-mean               c_t = m_t * dp / N_tok
 *   token-sum                c_t = m_t * dp
 *   seq-mean-token-sum       c_t = m_t * dp / N_seq
 *   seq-mean-token-sum-norm  c_t = m_t * dp / (N_seq * H)
 *   seq-mean-token-mean      c_t = m_t * dp / (N_seq * (n_i + 1e-8))
 * where m_t is the loss mask, n_i the masked tokens of t's sequence (the
 * 1e-8 is verl's guard, kept so that results agree with it), dp the
 * spec's dp_size, N_tok / N_seq the normalizers and H loss_scale_factor.
 * N_tok is, in this order of preference: spec.global_num_tokens,
 * batch->norm_tokens, the batch's own masked-token count. N_seq likewise:
 * spec.global_batch_size, batch->norm_seqs, the batch's count of sequences
 * with at least one masked token (verl excludes fully masked sequences).
 * H: spec.loss_scale_factor, batch->norm_horizon, the batch's longest
 * sequence (verl's default is the padded response length).
 * The explicit normalizers are what make micro-batching exact: a caller that
 * splits one call into micro-batches passes the whole call's counts, so the
 * micro-batch losses and gradients sum to the call's objective (the engine
 * adapter in loss_engine.h does this). A zero normalizer means an empty
 * sum: the term is 0 with zero gradient (verl would produce NaN).
 *
 * Threading: all functions are reentrant; nothing is global.
 */
#ifndef ENGINED_LOSS_LOSS_H
#define ENGINED_LOSS_LOSS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"

enum loss_name {
	LOSS_SFT = 0,            /* verl sft_loss: -w*logp, token-mean */
	LOSS_CROSS_ENTROPY,      /* Tinker cross_entropy: same term, token-sum */
	LOSS_PPO,                /* policy loss of variant policy_loss (+ entropy, KL) */
	LOSS_VALUE,              /* clipped value loss (critic) */
	LOSS_DRO,                /* Tinker direct reward optimization */
	LOSS_CUSTOM,             /* the client's own loss: its gradients, as given */
};

enum loss_policy {
	LOSS_PG_VANILLA = 0,
	LOSS_PG_GSPO,
	LOSS_PG_CISPO,
	LOSS_PG_GPG,
	LOSS_PG_SAPO,
	LOSS_PG_CLIP_COV,
	LOSS_PG_KL_COV,
	LOSS_PG_GEO_MEAN,
	LOSS_PG_IMPORTANCE_SAMPLING,
};

enum loss_agg {
	LOSS_AGG_TOKEN_MEAN = 0,
	LOSS_AGG_TOKEN_SUM,
	LOSS_AGG_SEQ_MEAN_TOKEN_SUM,
	LOSS_AGG_SEQ_MEAN_TOKEN_MEAN,
	LOSS_AGG_SEQ_MEAN_TOKEN_SUM_NORM,
};

enum loss_kl_type {
	LOSS_KL_K1 = 0,          /* "k1" | "kl":  logp - ref */
	LOSS_KL_ABS,             /* "abs":        |logp - ref| */
	LOSS_KL_K2,              /* "k2" | "mse": (logp - ref)^2 / 2 */
	LOSS_KL_K3,              /* "k3" | "low_var_kl" */
};

/* A parsed loss: the name plus every option, defaults as verl's actor and
 * critic configs (verl/trainer/config/actor/actor.yaml) unless said. */
struct loss_spec {
	enum loss_name name;
	enum loss_policy policy_loss;    /* "policy_loss" | "loss_mode"; vanilla */
	enum loss_agg agg;               /* "loss_agg_mode"; token-mean (Tinker names: token-sum) */
	double clip_ratio;               /* 0.2 */
	double clip_ratio_low;           /* NaN = clip_ratio */
	double clip_ratio_high;          /* NaN = clip_ratio */
	double clip_ratio_c;             /* 3.0, dual clip; must be > 1 for vanilla */
	double entropy_coeff;            /* 0; loss -= entropy_coeff * agg(entropy) */
	double kl_coef;                  /* "kl_coef" | "kl_loss_coef"; 0 = no KL term */
	enum loss_kl_type kl_type;       /* "kl_type" | "kl_loss_type"; k3 (low_var_kl) */
	bool kl_straight_through;        /* type given with a '+' suffix ("k3+") */
	double cliprange_value;          /* 0.5 (critic.yaml) */
	double loss_scale_factor;        /* H of seq-mean-token-sum-norm; 0 = unset */
	int64_t global_num_tokens;       /* N_tok override; 0 = unset */
	int64_t global_batch_size;       /* N_seq override; 0 = unset */
	int64_t dp_size;                 /* 1; verl's factor for averaged gradients */
	double clip_cov_ratio;           /* 0.0002; a fraction of the tokens, in (0, 1] */
	double clip_cov_lb;              /* 1.0 */
	double clip_cov_ub;              /* 5.0 */
	double kl_cov_ratio;             /* 0.0002; a fraction of the tokens, in (0, 1] */
	double ppo_kl_coef;              /* 0.1 (actor.yaml; the code default is 1.0) */
	double tau_pos;                  /* 1.0 (sapo) */
	double tau_neg;                  /* 1.05 (sapo) */
	double beta;                     /* 0.05 (dro; Tinker's documented example) */
	uint64_t seed;                   /* clip_cov's random token choice */
};

/* The per-token inputs a loss can read: the one table of them.
 * X(ID, name, read by): each is FLOAT32 [n] (one value per token of the
 * packed batch, target-aligned); `name` is the ForwardBackward request's
 * field (the daemon finds it in the proto's descriptor by that name, and
 * messages use it); `read by` says which losses read it (the exact rule,
 * e.g. ref_log_probs only with kl_coef != 0, is loss_spec_validate's).
 * The request carries these; ENTROPY and VALUES below are model outputs (a
 * language model always yields entropy, only a value model yields values). */
#define LOSS_REQUEST_INPUTS(X) \
	X(LOSS_MASK, "loss_mask", "every loss (0/1; absent: all but each sequence's first token)") \
	X(OLD_LOG_PROBS, "old_log_probs", "ppo (all but gpg), dro") \
	X(REF_LOG_PROBS, "ref_log_probs", "ppo with kl_coef != 0") \
	X(ADVANTAGES, "advantages", "ppo, dro") \
	X(RETURNS, "returns", "value") \
	X(OLD_VALUES, "old_values", "value") \
	X(IS_WEIGHTS, "is_weights", "ppo (rollout importance-sampling weights)") \
	X(TOKEN_WEIGHTS, "token_weights", "sft, cross_entropy (per-token weights)") \
	X(GRAD_LOG_PROBS, "grad_log_probs", "custom: dL/dlog_probs of the client's loss") \
	X(GRAD_ENTROPY, "grad_entropy", "custom: dL/dentropy of the client's loss") \
	X(GRAD_VALUES, "grad_values", "custom (value model): dL/dvalues of the client's loss")

enum loss_input {
#define LOSS_IN_ENUM(id, name, read_by) LOSS_IN_##id,
	LOSS_REQUEST_INPUTS(LOSS_IN_ENUM)
#undef LOSS_IN_ENUM
	LOSS_IN_ENTROPY,
	LOSS_IN_VALUES,
	LOSS_IN_COUNT,
};
/* Inputs [0, LOSS_IN_REQUEST_COUNT) come with the request. */
#define LOSS_IN_REQUEST_COUNT LOSS_IN_ENTROPY

struct loss_input_info {
	const char *name;
	const char *read_by;
};
extern const struct loss_input_info loss_inputs[LOSS_IN_COUNT];

/* What a request carries, for loss_spec_validate: n tokens and each input's
 * element count, -1 when absent (loss_inputs_present_init sets all absent). */
struct loss_inputs_present {
	int64_t n;
	int64_t len[LOSS_IN_COUNT];
};

enum loss_metric_id {
	LOSS_M_LOSS = 0,
	LOSS_M_PG_LOSS,
	LOSS_M_PG_CLIPFRAC,
	LOSS_M_PG_CLIPFRAC_LOWER,
	LOSS_M_PPO_KL,
	LOSS_M_ENTROPY,
	LOSS_M_KL_LOSS,
	LOSS_M_VF_LOSS,
	LOSS_M_VF_CLIPFRAC,
	LOSS_M_NUM_TOKENS,
	LOSS_M_NUM_SEQUENCES,
	LOSS_M_COUNT,
};

/* One metric of one batch. Two kinds (loss_metric_is_mean):
 *  - contributions (loss, pg_loss, entropy, kl_loss, vf_loss, num_tokens,
 *    num_sequences): value is this batch's share of the normalized
 *    objective; shares of micro-batches or calls add up (weight unused, 1);
 *  - means (pg_clipfrac, pg_clipfrac_lower, ppo_kl, vf_clipfrac): value is
 *    the mean over this batch's masked tokens and weight that token count;
 *    combine as sum(value * weight) / sum(weight), which equals the value
 *    over the whole batch. (verl averages micro-batch means unweighted, which
 *    depends on how the batch was split; engined reports the full-batch mean.)
 * Absent metrics (present = false) do not apply to the loss or lack their
 * input (entropy without entropy array, kl_loss without ref_log_probs). */
struct loss_metric {
	double value;
	double weight;
	bool present;
};

struct loss_batch {
	int64_t n;                    /* tokens */
	int32_t num_seqs;
	const int32_t *seq_lens;      /* [num_seqs], each >= 1, sum = n; whole sequences */
	/* model outputs, [n] */
	const float *log_probs;       /* required except for the value loss */
	const float *entropy;         /* NULL when not computed */
	const float *values;          /* value model only, else NULL */
	/* request inputs (LOSS_REQUEST_INPUTS), [n] each, NULL = absent */
	const float *in[LOSS_IN_REQUEST_COUNT];
	/* normalizers (see the top of this file); <= 0: this batch's own counts */
	double norm_tokens;
	double norm_seqs;
	double norm_horizon;
	uint64_t rng_seed;            /* clip_cov's random choice for this batch */
	/* Multiplies every gradient written into loss_result's d_* (in double,
	 * before the one rounding to float), not the loss or the metrics;
	 * <= 0 means 1 (engine_loss_io.grad_scale). */
	double grad_scale;
};

struct loss_result {
	double loss;                                   /* out */
	struct loss_metric metrics[LOSS_M_COUNT];      /* out */
	/* Caller-provided [n] buffers, overwritten (zeros where a term has no
	 * gradient); NULL = not wanted. */
	float *d_log_probs;
	float *d_entropy;
	float *d_values;
	uint8_t *selected;  /* clip_cov / kl_cov: 1 where the token was chosen */
};

/* --- spec ---------------------------------------------------------------- */

/* Set *s to the defaults of loss `name`: "sft", "cross_entropy", "ppo",
 * "importance_sampling" (Tinker: ppo with that variant and token-sum),
 * "value", "dro". Unknown name: -EINVAL listing the known ones. */
int loss_spec_init(struct loss_spec *s, const char *name, struct eng_error *err);

/* Set one option from its text ("0.2", "seq-mean-token-mean", "k3+").
 * Keys are the loss_spec fields, plus verl's spellings "loss_mode",
 * "kl_loss_coef", "kl_loss_type". "null" / "none" unsets clip_ratio_low,
 * clip_ratio_high, loss_scale_factor, global_num_tokens, global_batch_size.
 * Unknown key or a bad value: -EINVAL naming the key; *s is unchanged on
 * failure. */
int loss_spec_set(struct loss_spec *s, const char *key, const char *value,
		  struct eng_error *err);

/* Check the spec against what the request carries: value ranges (negative
 * clip ratios, clip_ratio_c <= 1 for vanilla, ...), inputs the loss needs
 * (ppo: old_log_probs and advantages, kl_coef != 0: ref_log_probs, ...),
 * array lengths != n, dp_size > 1 without the global normalizer its mode
 * needs. -EINVAL naming the field. present may be NULL (ranges only). */
int loss_spec_validate(const struct loss_spec *s,
		       const struct loss_inputs_present *present,
		       struct eng_error *err);

void loss_inputs_present_init(struct loss_inputs_present *p, int64_t n);

/* The aggregation the policy term of s uses: gspo and sapo force
 * seq-mean-token-mean (as verl), everything else s->agg. */
enum loss_agg loss_spec_pg_agg(const struct loss_spec *s);

const char *loss_name_str(enum loss_name n);
const char *loss_policy_str(enum loss_policy p);
const char *loss_agg_str(enum loss_agg a);
const char *loss_kl_type_str(enum loss_kl_type k);
const char *loss_input_str(enum loss_input i);     /* "advantages", ... */
const char *loss_metric_str(enum loss_metric_id m); /* "pg_clipfrac", ... */
bool loss_metric_is_mean(enum loss_metric_id m);

/* --- the batch's rules, one place each (the engine's batch check and the
 * loss adapter use them too) ------------------------------------------- */

/* A packed batch's sequences: num_seqs >= 0 lengths (given when
 * num_seqs > 0), each >= 1, adding up to n >= 0 tokens. -EINVAL naming
 * seq_lens (the sum stops as soon as it passes n: no overflow). */
int loss_seq_lens_check(const int32_t *seq_lens, int32_t num_seqs, int64_t n,
			struct eng_error *err);
/* A loss mask's values: 0 or 1 (-EINVAL naming the first other one). */
int loss_mask_check(const float *mask, int64_t n, struct eng_error *err);
/* Whether token t, the j-th of its sequence, is a loss token: mask[t] != 0
 * where a mask is given, else every token but each sequence's first (it
 * has no prediction). */
static inline bool loss_token_counts(const float *mask, int64_t t, int32_t j)
{
	return mask ? mask[t] != 0.0f : j > 0;
}

/* --- compute ------------------------------------------------------------- */

/* Compute loss, metrics and gradients of batch b under spec s (validated).
 * -EINVAL naming the field for inconsistent batches (seq_lens not summing to
 * n, a required array NULL, loss_mask not 0/1); -ENOMEM. On failure res and
 * its buffers are untouched. */
int loss_compute(const struct loss_spec *s, const struct loss_batch *b,
		 struct loss_result *res, struct eng_error *err);
/* loss_compute without its checks, for a micro-batch of a call whose rules
 * were checked once for the whole call: the spec validated against the
 * inputs present, seq_lens and loss_mask checked (engine_fb_call_prepare),
 * the model's outputs present by construction (loss_engine_fn). */
int loss_compute_checked(const struct loss_spec *s, const struct loss_batch *b,
			 struct loss_result *res, struct eng_error *err);

#endif
