/* config.c — Llama-family model configuration from a Hugging Face
 * config.json (see config.h): parsing with the defaults of the matching
 * transformers config class, serialization back to config.json, and the
 * RoPE inverse frequencies computed as transformers computes them.
 *
 * Defaults follow transformers where a key is absent (or null):
 *   num_key_value_heads = num_attention_heads
 *   head_dim = hidden_size / num_attention_heads (qwen3: 128, Qwen3Config)
 *   max_position_embeddings = 2048 (llama), 32768 (qwen2, qwen3),
 *                             131072 (mistral)
 *   rms_norm_eps = 1e-6, rope_theta = 10000, tie_word_embeddings = false,
 *   initializer_range = 0.02, hidden_act = "silu".
 * What the engine cannot run is refused rather than approximated:
 * sliding-window attention, rope_scaling types other than default/llama3,
 * mlp_bias, activations other than silu, and of the experts'
 * (parse_experts) the router's jitter and other families' routings.
 * The head: "architectures"[0] names a family's *ForCausalLM (lm_head) or
 * *ForTokenClassification (score: a value model) class, both in the family
 * table; model_config_set_head holds it against the engine's kind, and a
 * checkpoint's config.json names the engine's class (transformers'
 * AutoModelForCausalLM / AutoModelForTokenClassification load it).
 */
#include "config.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The families: "architectures"[0] of a language model (causal_lm) and of
 * a value model (token_cls), read and written back. */
static const struct {
	const char *model_type;
	enum model_arch arch;
	const char *causal_lm, *token_cls;
	int64_t default_max_pos;
} arch_table[] = {
	{ "llama", ARCH_LLAMA, "LlamaForCausalLM", "LlamaForTokenClassification", 2048 },
	{ "qwen2", ARCH_QWEN2, "Qwen2ForCausalLM", "Qwen2ForTokenClassification", 32768 },
	{ "qwen3", ARCH_QWEN3, "Qwen3ForCausalLM", "Qwen3ForTokenClassification", 32768 },
	{ "mistral", ARCH_MISTRAL, "MistralForCausalLM", "MistralForTokenClassification",
	  131072 },
	{ "qwen3_moe", ARCH_QWEN3_MOE, "Qwen3MoeForCausalLM", "Qwen3MoeForTokenClassification",
	  32768 },
	{ "mixtral", ARCH_MIXTRAL, "MixtralForCausalLM", "MixtralForTokenClassification",
	  131072 },
	{ "qwen2_moe", ARCH_QWEN2_MOE, "Qwen2MoeForCausalLM", "Qwen2MoeForTokenClassification",
	  32768 },
	/* transformers has no OlmoeForTokenClassification: no value model */
	{ "olmoe", ARCH_OLMOE, "OlmoeForCausalLM", NULL, 4096 },
};
#define SUPPORTED "llama, qwen2, qwen3, mistral, qwen3_moe, qwen2_moe, mixtral, olmoe"
#define N_ARCH (sizeof(arch_table) / sizeof(arch_table[0]))

/* Qwen's families: a sliding window takes effect only with
 * use_sliding_window; experts (qwen3_moe, qwen2_moe) sized by
 * moe_intermediate_size and placed by decoder_sparse_step and
 * mlp_only_layers. */
static bool qwen_family(enum model_arch a)
{
	return a == ARCH_QWEN2 || a == ARCH_QWEN3 || a == ARCH_QWEN3_MOE || a == ARCH_QWEN2_MOE;
}

static bool qwen_experts(enum model_arch a)
{
	return a == ARCH_QWEN3_MOE || a == ARCH_QWEN2_MOE;
}

/* The family table's row of c->arch (row 0 for an arch out of range). */
static size_t family_of(const struct model_config *c)
{
	size_t k;

	for (k = 0; k < N_ARCH; k++)
		if (arch_table[k].arch == c->arch)
			return k;
	return 0;
}

/* A key counts as absent when missing or JSON null (HF writes nulls for
 * unset optional fields). */
static json_t *get(json_t *obj, const char *key)
{
	json_t *v = json_object_get(obj, key);

	return json_is_null(v) ? NULL : v;
}

/* Integer `key` of `obj` (reported as prefix+key). Absent: `def`, or
 * -EINVAL when def < 0 (required). Must be an integer in [min, max], the
 * default too: one derived from other keys (head_dim = hidden_size /
 * num_attention_heads) can fall outside, and the config written back
 * (model_config_to_json) states it. */
static int get_int(json_t *obj, const char *prefix, const char *key, int64_t def,
		   int64_t min, int64_t max, int64_t *out, struct eng_error *err)
{
	json_t *v = get(obj, key);

	if (!v) {
		if (def < 0)
			return eng_fail(err, -EINVAL, "%s%s: required key missing", prefix, key);
		if (def < min || def > max)
			return eng_fail(err, -EINVAL, "%s%s: not given, and its default %lld is "
					"not in [%lld, %lld]", prefix, key, (long long)def,
					(long long)min, (long long)max);
		*out = def;
		return 0;
	}
	if (!json_is_integer(v))
		return eng_fail(err, -EINVAL, "%s%s: must be an integer", prefix, key);
	if (json_integer_value(v) < min || json_integer_value(v) > max)
		return eng_fail(err, -EINVAL, "%s%s: %lld, must be in [%lld, %lld]", prefix, key,
				(long long)json_integer_value(v), (long long)min, (long long)max);
	*out = json_integer_value(v);
	return 0;
}

/* Number `key` (integer or real); absent: `def`, or -EINVAL when required.
 * Must be finite and > 0 when `positive`. */
static int get_num(json_t *obj, const char *prefix, const char *key, bool required,
		   double def, bool positive, double *out, struct eng_error *err)
{
	json_t *v = get(obj, key);
	double x;

	if (!v) {
		if (required)
			return eng_fail(err, -EINVAL, "%s%s: required key missing", prefix, key);
		*out = def;
		return 0;
	}
	if (!json_is_number(v))
		return eng_fail(err, -EINVAL, "%s%s: must be a number", prefix, key);
	x = json_number_value(v);
	if (!isfinite(x) || (positive && !(x > 0)))
		return eng_fail(err, -EINVAL, "%s%s: %g, must be a positive number", prefix,
				key, x);
	*out = x;
	return 0;
}

static int get_bool(json_t *obj, const char *key, bool def, bool *out,
		    struct eng_error *err)
{
	json_t *v = get(obj, key);

	if (!v) {
		*out = def;
		return 0;
	}
	if (!json_is_boolean(v))
		return eng_fail(err, -EINVAL, "%s: must be true or false", key);
	*out = json_is_true(v);
	return 0;
}

/* rope_scaling (or transformers 5's rope_parameters): default or llama3. */
static int parse_rope(json_t *root, struct model_config *c, struct eng_error *err)
{
	const char *pre = "rope_scaling.";
	json_t *rs = get(root, "rope_scaling"), *params = get(root, "rope_parameters");
	json_t *jt;
	const char *type, *tkey;
	int rc;

	if (params && !json_is_object(params))
		return eng_fail(err, -EINVAL, "rope_parameters: must be an object or null");
	/* transformers 5 keeps rope_theta inside rope_parameters. */
	if (!get(root, "rope_theta") && params)
		rc = get_num(params, "rope_parameters.", "rope_theta", false, 10000.0, true,
			     &c->rope_theta, err);
	else
		rc = get_num(root, "", "rope_theta", false, 10000.0, true, &c->rope_theta, err);
	if (rc)
		return rc;
	if (!rs && params) {
		rs = params;
		pre = "rope_parameters.";
	}
	if (!rs)
		return 0;
	if (!json_is_object(rs))
		return eng_fail(err, -EINVAL, "rope_scaling: must be an object or null");
	tkey = get(rs, "rope_type") ? "rope_type" : "type";
	jt = get(rs, tkey);
	if (!jt)
		return eng_fail(err, -EINVAL, "%stype: missing (rope_type or type)", pre);
	type = json_string_value(jt);
	if (!type)
		return eng_fail(err, -EINVAL, "%s%s: must be a string", pre, tkey);
	if (!strcmp(type, "default"))
		return 0;
	if (strcmp(type, "llama3"))
		return eng_fail(err, -EINVAL, "%s%s: '%s' is not supported (default, llama3)",
				pre, tkey, type);
	c->rope_llama3 = true;
	rc = get_num(rs, pre, "factor", true, 0, true, &c->rope_factor, err);
	if (!rc)
		rc = get_num(rs, pre, "low_freq_factor", true, 0, true,
			     &c->rope_low_freq_factor, err);
	if (!rc)
		rc = get_num(rs, pre, "high_freq_factor", true, 0, true,
			     &c->rope_high_freq_factor, err);
	if (!rc)
		rc = get_int(rs, pre, "original_max_position_embeddings", -1, 1,
			     MODEL_MAX_POSITIONS, &c->rope_original_max_pos, err);
	if (rc)
		return rc;
	/* transformers refuses high <= low: the interpolation divides by it. */
	if (!(c->rope_high_freq_factor > c->rope_low_freq_factor))
		return eng_fail(err, -EINVAL, "%shigh_freq_factor: %g must exceed "
				"low_freq_factor %g", pre, c->rope_high_freq_factor,
				c->rope_low_freq_factor);
	return 0;
}

/* A *ForTokenClassification config's labels, counted as transformers 5
 * counts them (PreTrainedConfig.__init__): id2label's entries; without it
 * num_labels; without either 2. */
static int parse_labels(json_t *root, struct model_config *c, struct eng_error *err)
{
	json_t *ids = get(root, "id2label");

	if (ids) {
		if (!json_is_object(ids) || json_object_size(ids) < 1 ||
		    json_object_size(ids) > (size_t)MODEL_MAX_LABELS)
			return eng_fail(err, -EINVAL, "id2label: must be an object of 1 to %lld "
					"labels", (long long)MODEL_MAX_LABELS);
		c->num_labels = (int64_t)json_object_size(ids);
		c->labels_key = "id2label";
		return 0;
	}
	if (get(root, "num_labels")) {
		c->labels_key = "num_labels";
		return get_int(root, "", "num_labels", -1, 1, MODEL_MAX_LABELS, &c->num_labels,
			       err);
	}
	c->num_labels = 2;
	c->labels_key = NULL;
	return 0;
}

/* "architectures" (absent, null or an array of strings): [0] names the
 * head when it is one of the family table's classes, and must then be one
 * of row k's (model_type's); another class states no head (transformers'
 * Auto classes go by model_type). */
static int parse_head(json_t *root, size_t k, struct model_config *c, struct eng_error *err)
{
	json_t *a = get(root, "architectures");
	const char *name;
	size_t i, j;

	c->head = MODEL_HEAD_UNSTATED;
	if (!a)
		return 0;
	if (!json_is_array(a))
		return eng_fail(err, -EINVAL, "architectures: must be an array of strings or null");
	for (i = 0; i < json_array_size(a); i++)
		if (!json_is_string(json_array_get(a, i)))
			return eng_fail(err, -EINVAL, "architectures[%zu]: must be a string", i);
	if (!json_array_size(a))
		return 0;
	name = json_string_value(json_array_get(a, 0));
	for (j = 0; j < N_ARCH; j++) {
		enum model_head h = !strcmp(name, arch_table[j].causal_lm) ? MODEL_HEAD_CAUSAL_LM
				    : arch_table[j].token_cls && !strcmp(name, arch_table[j].token_cls)
				    ? MODEL_HEAD_TOKEN_CLS
				    : MODEL_HEAD_UNSTATED;

		if (h == MODEL_HEAD_UNSTATED)
			continue;
		if (j != k)
			return eng_fail(err, -EINVAL, "architectures[0]: '%s' is a %s class, "
					"model_type is '%s' (%s%s%s)", name,
					arch_table[j].model_type, arch_table[k].model_type,
					arch_table[k].causal_lm, arch_table[k].token_cls ? " or " : "",
					arch_table[k].token_cls ? arch_table[k].token_cls : "");
		c->head = h;
	}
	return c->head == MODEL_HEAD_TOKEN_CLS ? parse_labels(root, c, err) : 0;
}

/* Each experts family's defaults (transformers' Qwen3MoeConfig,
 * Qwen2MoeConfig, MixtralConfig, OlmoeConfig): experts, top-k, the
 * router's auxiliary loss coefficient. */
static void experts_defaults(enum model_arch a, int64_t *E, int64_t *k, double *coef)
{
	*E = a == ARCH_QWEN3_MOE ? 128 : a == ARCH_QWEN2_MOE ? 60 : a == ARCH_OLMOE ? 64 : 8;
	*k = a == ARCH_QWEN3_MOE || a == ARCH_OLMOE ? 8 : a == ARCH_QWEN2_MOE ? 4 : 2;
	*coef = a == ARCH_OLMOE ? 0.01 : 0.001;
}

/* The experts of a qwen3_moe, qwen2_moe, mixtral or olmoe config
 * (config.h), with transformers' defaults; what engined cannot run is
 * refused naming the key: mixtral's router jitter, olmoe's clip_qkv, and
 * routings of other families (a grouped top-k, sigmoid scores). */
static int parse_experts(json_t *root, struct model_config *c, struct eng_error *err)
{
	bool mx = c->arch == ARCH_MIXTRAL, qwen = qwen_experts(c->arch);
	const char *ekey = get(root, "num_experts") || (!mx && !get(root, "num_local_experts"))
			   ? "num_experts" : "num_local_experts";
	int64_t dE, dk;
	double dcoef;
	json_t *v;
	int rc;

	experts_defaults(c->arch, &dE, &dk, &dcoef);
	rc = get_int(root, "", ekey, dE, 1, MODEL_MAX_EXPERTS, &c->num_experts, err);
	if (!rc)
		rc = get_int(root, "", "num_experts_per_tok", dk, 1, MODEL_MAX_EXPERTS_PER_TOK,
			     &c->experts_per_tok, err);
	if (rc)
		return rc;
	if (c->experts_per_tok > c->num_experts)
		return eng_fail(err, -EINVAL, "num_experts_per_tok: %lld, more than %s %lld",
				(long long)c->experts_per_tok, ekey, (long long)c->num_experts);
	c->moe_intermediate_size = c->intermediate_size;
	c->decoder_sparse_step = 1;
	c->norm_topk_prob = mx;
	if (c->arch == ARCH_QWEN2_MOE)
		rc = get_int(root, "", "shared_expert_intermediate_size", 5632, 1,
			     MODEL_MAX_INTERMEDIATE, &c->shared_expert_size, err);
	if (!rc && c->arch == ARCH_OLMOE)
		rc = get_bool(root, "norm_topk_prob", false, &c->norm_topk_prob, err);
	if (!rc && c->arch == ARCH_OLMOE && (v = get(root, "clip_qkv")) && !json_is_null(v))
		return eng_fail(err, -EINVAL, "clip_qkv: only null is supported (clipping the "
				"projections is not implemented)");
	if (rc)
		return rc;
	if (qwen) {
		rc = get_int(root, "", "moe_intermediate_size",
			     c->arch == ARCH_QWEN3_MOE ? 768 : 1408, 1, MODEL_MAX_INTERMEDIATE,
			     &c->moe_intermediate_size, err);
		if (!rc)
			rc = get_int(root, "", "decoder_sparse_step", 1, 1, MODEL_MAX_LAYERS,
				     &c->decoder_sparse_step, err);
		if (!rc)
			rc = get_bool(root, "norm_topk_prob", false, &c->norm_topk_prob, err);
		if (rc)
			return rc;
		v = get(root, "mlp_only_layers");
		if (v && !json_is_array(v))
			return eng_fail(err, -EINVAL, "mlp_only_layers: must be an array of layer "
					"indices");
		for (size_t i = 0; v && i < json_array_size(v); i++) {
			json_t *x = json_array_get(v, i);
			int64_t l = json_is_integer(x) ? json_integer_value(x) : -1;

			if (l < 0 || l >= c->num_layers)
				return eng_fail(err, -EINVAL, "mlp_only_layers[%zu]: must be a layer "
						"index in [0, %lld)", i, (long long)c->num_layers);
			c->dense_layers[l / 64] |= UINT64_C(1) << (l % 64);
		}
	} else if (mx) {
		double jitter;

		rc = get_num(root, "", "router_jitter_noise", false, 0.0, false, &jitter, err);
		if (rc)
			return rc;
		if (jitter != 0.0)
			return eng_fail(err, -EINVAL, "router_jitter_noise: %g; only 0 is "
					"supported (jitter makes the routing random)", jitter);
	}
	rc = get_num(root, "", "router_aux_loss_coef", false, dcoef, false,
		     &c->router_aux_loss_coef, err);
	if (!rc)
		rc = get_bool(root, "output_router_logits", false, &c->output_router_logits, err);
	if (rc)
		return rc;
	if (c->router_aux_loss_coef < 0)
		return eng_fail(err, -EINVAL, "router_aux_loss_coef: %g is negative",
				c->router_aux_loss_coef);
	v = get(root, "scoring_func");
	if (v && (!json_is_string(v) || strcmp(json_string_value(v), "softmax")))
		return eng_fail(err, -EINVAL, "scoring_func: only \"softmax\" routing is "
				"supported");
	v = get(root, "topk_group");
	if (v && !(json_is_integer(v) && json_integer_value(v) == 1))
		return eng_fail(err, -EINVAL, "topk_group: a grouped top-k is not supported");
	return 0;
}

/* pad_token_id (config.h): an id of the vocabulary, or null; negative
 * ids count from its end, as torch's padding_idx does. */
static int parse_pad(json_t *root, struct model_config *c, struct eng_error *err)
{
	json_t *v = json_object_get(root, "pad_token_id");   /* null is not absent */
	int64_t V = c->vocab_size, p;

	c->pad_token_id = !v && c->arch == ARCH_OLMOE ? 1 : -1;
	if (!v || json_is_null(v))
		return c->pad_token_id < V ? 0 : eng_fail(err, -EINVAL, "pad_token_id: not "
							  "given, and its default %lld is "
							  "outside the vocabulary",
							  (long long)c->pad_token_id);
	p = json_is_integer(v) ? json_integer_value(v) : INT64_MIN;
	if (p < -V || p >= V)
		return eng_fail(err, -EINVAL, "pad_token_id: must be null or a token id in "
				"[-%lld, %lld) (the embedding's padding_idx)", (long long)V,
				(long long)V);
	c->pad_token_id = p < 0 ? V + p : p;
	return 0;
}

static bool has_mlp(const struct model_config *c, enum model_mlp kind)
{
	for (int64_t l = 0; l < c->num_layers; l++)
		if (model_layer_mlp(c, l) == kind)
			return true;
	return false;
}

bool model_has_experts(const struct model_config *c)
{
	return has_mlp(c, MODEL_MLP_MOE);
}

bool model_has_dense(const struct model_config *c)
{
	return has_mlp(c, MODEL_MLP_DENSE);
}

static int parse_root(json_t *root, struct model_config *c, struct eng_error *err)
{
	const char *mt;
	json_t *v;
	size_t k;
	int rc;

	if (!json_is_object(root))
		return eng_fail(err, -EINVAL, "config.json: not a JSON object");
	mt = json_string_value(get(root, "model_type"));
	if (!mt)
		return eng_fail(err, -EINVAL, "model_type: required string missing "
				"(supported: " SUPPORTED ")");
	for (k = 0; k < N_ARCH; k++)
		if (!strcmp(mt, arch_table[k].model_type))
			break;
	if (k == N_ARCH)
		return eng_fail(err, -EINVAL, "model_type: '%s' is not supported "
				"(supported: " SUPPORTED ")", mt);
	c->arch = arch_table[k].arch;
	snprintf(c->model_type, sizeof(c->model_type), "%s", mt);

	rc = parse_head(root, k, c, err);
	if (!rc)
		rc = get_int(root, "", "vocab_size", -1, 1, MODEL_MAX_VOCAB, &c->vocab_size, err);
	if (!rc)
		rc = get_int(root, "", "hidden_size", -1, 1, MODEL_MAX_HIDDEN, &c->hidden_size, err);
	if (!rc)
		rc = get_int(root, "", "intermediate_size", -1, 1, MODEL_MAX_INTERMEDIATE,
			     &c->intermediate_size, err);
	if (!rc)
		rc = get_int(root, "", "num_hidden_layers", -1, 1, MODEL_MAX_LAYERS, &c->num_layers,
			     err);
	if (!rc)
		rc = get_int(root, "", "num_attention_heads", -1, 1, MODEL_MAX_HEADS, &c->num_heads,
			     err);
	if (!rc)
		rc = get_int(root, "", "num_key_value_heads", c->num_heads, 1, MODEL_MAX_HEADS,
			     &c->num_kv_heads, err);
	if (rc)
		return rc;
	if (c->num_heads % c->num_kv_heads)
		return eng_fail(err, -EINVAL, "num_key_value_heads: %lld does not divide "
				"num_attention_heads %lld", (long long)c->num_kv_heads,
				(long long)c->num_heads);
	if (!get(root, "head_dim") && c->arch != ARCH_QWEN3 &&
	    c->hidden_size % c->num_heads)
		return eng_fail(err, -EINVAL, "hidden_size: %lld is not a multiple of "
				"num_attention_heads %lld (and no head_dim given)",
				(long long)c->hidden_size, (long long)c->num_heads);
	rc = get_int(root, "", "head_dim",
		     c->arch == ARCH_QWEN3 ? 128 : c->hidden_size / c->num_heads, 1,
		     MODEL_MAX_HEAD_DIM, &c->head_dim, err);
	if (rc)
		return rc;
	if (c->head_dim % 2)
		return eng_fail(err, -EINVAL, "head_dim: %lld is odd (RoPE rotates pairs)",
				(long long)c->head_dim);
	rc = get_int(root, "", "max_position_embeddings", arch_table[k].default_max_pos, 1,
		     MODEL_MAX_POSITIONS, &c->max_position_embeddings, err);
	if (!rc)
		rc = get_num(root, "", "rms_norm_eps", false, 1e-6, true, &c->rms_norm_eps, err);
	if (!rc)
		rc = get_num(root, "", "initializer_range", false, 0.02, false,
			     &c->initializer_range, err);
	if (!rc)
		rc = get_bool(root, "tie_word_embeddings", false, &c->tie_word_embeddings, err);
	if (!rc)
		rc = get_bool(root, "attention_bias", false, &c->attention_bias, err);
	if (!rc)
		rc = parse_pad(root, c, err);
	if (rc)
		return rc;
	if (c->initializer_range < 0)
		return eng_fail(err, -EINVAL, "initializer_range: %g is negative",
				c->initializer_range);
	switch (c->arch) {
	case ARCH_LLAMA:
		c->o_proj_bias = c->attention_bias;
		break;
	case ARCH_QWEN2:
		/* Qwen2Attention: q/k/v always carry a bias, o_proj never. */
		c->attention_bias = true;
		break;
	case ARCH_QWEN2_MOE:
		/* Qwen2MoeAttention: q/k/v's bias is "qkv_bias" (default true) */
		rc = get_bool(root, "qkv_bias", true, &c->attention_bias, err);
		if (rc)
			return rc;
		c->mlp = MODEL_MLP_MOE;
		break;
	case ARCH_QWEN3:
		c->qk_norm = MODEL_QK_NORM_HEAD;
		c->o_proj_bias = c->attention_bias;
		break;
	case ARCH_QWEN3_MOE:
		c->qk_norm = MODEL_QK_NORM_HEAD;
		c->o_proj_bias = c->attention_bias;
		c->mlp = MODEL_MLP_MOE;
		break;
	case ARCH_OLMOE:
		/* OlmoeAttention: attention_bias on all four projections; q_norm
		 * over hidden_size, so head_dim must be hidden_size / heads */
		if (c->head_dim * c->num_heads != c->hidden_size)
			return eng_fail(err, -EINVAL, "head_dim: %lld; olmoe's q_norm spans "
					"hidden_size %lld, so head_dim must be hidden_size / "
					"num_attention_heads", (long long)c->head_dim,
					(long long)c->hidden_size);
		c->qk_norm = MODEL_QK_NORM_PROJ;
		c->o_proj_bias = c->attention_bias;
		c->mlp = MODEL_MLP_MOE;
		break;
	case ARCH_MISTRAL:
	case ARCH_MIXTRAL:
		/* MistralAttention has no bias, whatever the config says. */
		c->attention_bias = false;
		c->mlp = c->arch == ARCH_MIXTRAL ? MODEL_MLP_MOE : MODEL_MLP_DENSE;
		break;
	}
	rc = c->mlp == MODEL_MLP_MOE ? parse_experts(root, c, err) : 0;
	if (rc)
		return rc;

	v = get(root, "hidden_act");
	if (v && (!json_is_string(v) || strcmp(json_string_value(v), "silu")))
		return eng_fail(err, -EINVAL, "hidden_act: only \"silu\" is supported");
	v = get(root, "mlp_bias");
	if (v && !json_is_false(v))
		return eng_fail(err, -EINVAL, "mlp_bias: MLP biases are not supported");

	/* Sliding-window attention is not implemented: refuse a window that
	 * could take effect (one at least max_position_embeddings long never
	 * masks anything, so it is accepted). */
	v = get(root, "sliding_window");
	if (v && !json_is_integer(v))
		return eng_fail(err, -EINVAL, "sliding_window: must be an integer or null");
	if (v && json_integer_value(v) < c->max_position_embeddings) {
		bool used = c->arch == ARCH_MISTRAL || c->arch == ARCH_MIXTRAL;

		if (qwen_family(c->arch)) {
			json_t *u = get(root, "use_sliding_window");

			used = json_is_true(u);
		}
		if (used)
			return eng_fail(err, -EINVAL, "sliding_window: %lld is smaller than "
					"max_position_embeddings %lld and sliding-window "
					"attention is not supported",
					(long long)json_integer_value(v),
					(long long)c->max_position_embeddings);
	}
	return parse_rope(root, c, err);
}

int model_config_parse(const char *json_text, struct model_config *ret,
		       struct eng_error *err)
{
	struct model_config c;
	json_error_t jerr;
	json_t *root;
	int rc;

	if (!json_text)
		return eng_fail(err, -EINVAL, "config.json: no text");
	root = json_loads(json_text, JSON_REJECT_DUPLICATES, &jerr);
	if (!root)
		return eng_fail(err, -EINVAL, "config.json: invalid JSON at line %d: %s",
				jerr.line, jerr.text);
	memset(&c, 0, sizeof(c));
	rc = parse_root(root, &c, err);
	json_decref(root);
	if (rc)
		return rc;
	*ret = c;
	return 0;
}

int model_config_set_head(struct model_config *c, bool value_model, struct eng_error *err)
{
	const char *cls = arch_table[family_of(c)].token_cls;

	if (value_model && !cls)
		return eng_fail(err, -EINVAL, "model_type: transformers has no token-classification "
				"class for %s, so a value model of it could not be saved as one",
				arch_table[family_of(c)].model_type);
	if (c->head == MODEL_HEAD_TOKEN_CLS && !value_model)
		return eng_fail(err, -EINVAL, "architectures[0]: %s is a value model's class "
				"(a score head, no lm_head); initialize it with model_type "
				"value_model", cls);
	if (c->head == MODEL_HEAD_TOKEN_CLS && c->num_labels != 1) {
		if (!c->labels_key)
			return eng_fail(err, -EINVAL, "id2label: absent (and no num_labels), so "
					"%s has transformers' default of 2 labels; engined's "
					"value head has one output (num_labels 1)", cls);
		return eng_fail(err, -EINVAL, "%s: %lld labels (%s); engined's value head has "
				"one output (num_labels 1)", c->labels_key,
				(long long)c->num_labels, cls);
	}
	c->head = value_model ? MODEL_HEAD_TOKEN_CLS : MODEL_HEAD_CAUSAL_LM;
	c->num_labels = value_model ? 1 : 0;
	c->labels_key = value_model ? "id2label" : NULL;
	return 0;
}

/* id2label {"0": "LABEL_0", ...} and label2id {"LABEL_0": 0, ...} of n
 * labels, the names transformers gives (PreTrainedConfig.num_labels). */
static int put_labels(json_t *o, int64_t n)
{
	json_t *ids = json_object(), *labels = json_object();
	char key[24], name[32];
	int bad = !ids || !labels;

	for (int64_t i = 0; i < n && !bad; i++) {
		snprintf(key, sizeof(key), "%lld", (long long)i);
		snprintf(name, sizeof(name), "LABEL_%lld", (long long)i);
		bad |= json_object_set_new(ids, key, json_string(name));
		bad |= json_object_set_new(labels, name, json_integer(i));
	}
	bad |= json_object_set_new(o, "id2label", ids);
	bad |= json_object_set_new(o, "label2id", labels);
	return bad;
}

/* The experts' keys, as the family's transformers config names them. */
static int put_experts(json_t *o, const struct model_config *c)
{
	bool qwen = qwen_experts(c->arch);
	json_t *dense = json_array();
	int bad = !dense;

	for (int64_t l = 0; dense && l < c->num_layers; l++)
		if (c->dense_layers[l / 64] >> (l % 64) & 1)
			bad |= json_array_append_new(dense, json_integer(l));
	bad |= json_object_set_new(o, c->arch == ARCH_MIXTRAL ? "num_local_experts" : "num_experts",
				   json_integer(c->num_experts));
	bad |= json_object_set_new(o, "num_experts_per_tok", json_integer(c->experts_per_tok));
	if (qwen) {
		bad |= json_object_set_new(o, "moe_intermediate_size",
					   json_integer(c->moe_intermediate_size));
		bad |= json_object_set_new(o, "decoder_sparse_step",
					   json_integer(c->decoder_sparse_step));
		bad |= json_object_set_new(o, "norm_topk_prob", json_boolean(c->norm_topk_prob));
		bad |= json_object_set_new(o, "mlp_only_layers", dense);
		dense = NULL;
	}
	json_decref(dense);
	if (c->arch == ARCH_QWEN2_MOE) {
		bad |= json_object_set_new(o, "shared_expert_intermediate_size",
					   json_integer(c->shared_expert_size));
		bad |= json_object_set_new(o, "qkv_bias", json_boolean(c->attention_bias));
	}
	if (c->arch == ARCH_OLMOE) {
		bad |= json_object_set_new(o, "norm_topk_prob", json_boolean(c->norm_topk_prob));
		bad |= json_object_set_new(o, "clip_qkv", json_null());
	}
	if (c->arch == ARCH_MIXTRAL)
		bad |= json_object_set_new(o, "router_jitter_noise", json_real(0.0));
	bad |= json_object_set_new(o, "router_aux_loss_coef", json_real(c->router_aux_loss_coef));
	bad |= json_object_set_new(o, "output_router_logits",
				   json_boolean(c->output_router_logits));
	return bad;
}

static json_t *config_object(const struct model_config *c)
{
	size_t k = family_of(c);
	const char *arch = c->head == MODEL_HEAD_TOKEN_CLS ? arch_table[k].token_cls
			   : arch_table[k].causal_lm;
	const char *mt = c->model_type[0] ? c->model_type : arch_table[k].model_type;
	json_t *o = json_object(), *rs = json_null();
	int bad = 0;

	if (c->rope_llama3) {
		json_decref(rs);
		rs = json_pack("{s:s, s:f, s:f, s:f, s:I}", "rope_type", "llama3",
			       "factor", c->rope_factor,
			       "low_freq_factor", c->rope_low_freq_factor,
			       "high_freq_factor", c->rope_high_freq_factor,
			       "original_max_position_embeddings",
			       (json_int_t)c->rope_original_max_pos);
	}
	if (!o || !rs) {
		json_decref(o);
		json_decref(rs);
		return NULL;
	}
	bad |= json_object_set_new(o, "architectures", json_pack("[s]", arch));
	if (c->head == MODEL_HEAD_TOKEN_CLS)
		bad |= put_labels(o, c->num_labels);
	bad |= json_object_set_new(o, "model_type", json_string(mt));
	bad |= json_object_set_new(o, "vocab_size", json_integer(c->vocab_size));
	bad |= json_object_set_new(o, "hidden_size", json_integer(c->hidden_size));
	bad |= json_object_set_new(o, "intermediate_size", json_integer(c->intermediate_size));
	bad |= json_object_set_new(o, "num_hidden_layers", json_integer(c->num_layers));
	bad |= json_object_set_new(o, "num_attention_heads", json_integer(c->num_heads));
	bad |= json_object_set_new(o, "num_key_value_heads", json_integer(c->num_kv_heads));
	bad |= json_object_set_new(o, "head_dim", json_integer(c->head_dim));
	bad |= json_object_set_new(o, "max_position_embeddings",
				   json_integer(c->max_position_embeddings));
	bad |= json_object_set_new(o, "rms_norm_eps", json_real(c->rms_norm_eps));
	bad |= json_object_set_new(o, "rope_theta", json_real(c->rope_theta));
	bad |= json_object_set_new(o, "rope_scaling", rs);
	bad |= json_object_set_new(o, "tie_word_embeddings",
				   json_boolean(c->tie_word_embeddings));
	bad |= json_object_set_new(o, "pad_token_id", c->pad_token_id >= 0 ?
				   json_integer(c->pad_token_id) : json_null());
	bad |= json_object_set_new(o, "attention_bias", json_boolean(c->attention_bias));
	bad |= json_object_set_new(o, "hidden_act", json_string("silu"));
	bad |= json_object_set_new(o, "initializer_range", json_real(c->initializer_range));
	if (c->arch == ARCH_MISTRAL || c->arch == ARCH_MIXTRAL)
		bad |= json_object_set_new(o, "sliding_window", json_null());
	if (qwen_family(c->arch))
		bad |= json_object_set_new(o, "use_sliding_window", json_false());
	if (c->mlp == MODEL_MLP_MOE)
		bad |= put_experts(o, c);
	bad |= json_object_set_new(o, "torch_dtype", json_string("float32"));
	if (bad) {
		json_decref(o);
		return NULL;
	}
	return o;
}

static bool same_reals(const struct model_config *a, const struct model_config *b)
{
	return a->rms_norm_eps == b->rms_norm_eps && a->rope_theta == b->rope_theta &&
	       a->rope_factor == b->rope_factor &&
	       a->rope_low_freq_factor == b->rope_low_freq_factor &&
	       a->rope_high_freq_factor == b->rope_high_freq_factor &&
	       a->initializer_range == b->initializer_range &&
	       a->router_aux_loss_coef == b->router_aux_loss_coef;
}

char *model_config_to_json(const struct model_config *cfg)
{
	json_t *o = config_object(cfg);
	char *text = NULL;
	int prec;

	if (!o)
		return NULL;
	/* The shortest precision that reads back to the same doubles, so that
	 * 1e-06 is written as such rather than 9.9999999999999995e-07. */
	for (prec = 15; prec <= 17; prec++) {
		struct model_config back;

		free(text);
		text = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER |
				  JSON_REAL_PRECISION(prec));
		if (!text || prec == 17)
			break;
		if (model_config_parse(text, &back, NULL) == 0 && same_reals(cfg, &back))
			break;
	}
	json_decref(o);
	return text;
}

void model_config_rope_inv_freq(const struct model_config *cfg, float *inv_freq)
{
	/* transformers, _compute_default_rope_parameters:
	 *   1.0 / (base ** (torch.arange(0, dim, 2).float() / dim))
	 * in float32: the exponent is a float32 quotient, the power is taken
	 * in double here and rounded once (torch's float pow is within an ulp
	 * of that), and Python's `scalar / tensor` is reciprocal(tensor) *
	 * scalar, all with the scalars cast to float32. */
	int64_t D = cfg->head_dim, i;
	float base = (float)cfg->rope_theta;

	for (i = 0; i < D / 2; i++) {
		float e = (float)(2 * i) / (float)D;
		float p = (float)pow((double)base, (double)e);

		inv_freq[i] = 1.0f / p;
	}
	if (!cfg->rope_llama3)
		return;
	/* _compute_llama3_parameters, op for op in float32:
	 *   wavelen = 2 * math.pi / inv_freq
	 *   inv_freq_llama = where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
	 *   smooth = (old_context_len / wavelen - low) / (high - low)
	 *   smoothed = (1 - smooth) * inv_freq_llama / factor + smooth * inv_freq_llama
	 *   medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen)
	 *   inv_freq_llama = where(medium, smoothed, inv_freq_llama) */
	{
		float factor = (float)cfg->rope_factor;
		float low = (float)cfg->rope_low_freq_factor;
		double old = (double)cfg->rope_original_max_pos;
		float low_wavelen = (float)(old / cfg->rope_low_freq_factor);
		float high_wavelen = (float)(old / cfg->rope_high_freq_factor);
		float span = (float)(cfg->rope_high_freq_factor - cfg->rope_low_freq_factor);
		float two_pi = (float)(2.0 * M_PI);

		for (i = 0; i < D / 2; i++) {
			float f = inv_freq[i];
			float wavelen = (1.0f / f) * two_pi;
			float scaled = wavelen > low_wavelen ? f / factor : f;

			if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
				float smooth = ((1.0f / wavelen) * (float)old - low) / span;

				scaled = (1.0f - smooth) * scaled / factor + smooth * scaled;
			}
			inv_freq[i] = scaled;
		}
	}
}
