/* config.h — Llama-family model configuration, read from a Hugging Face
 * config.json (llama, qwen2, qwen3, mistral; qwen3_moe, qwen2_moe, mixtral
 * and olmoe with experts). */
#ifndef ENGINED_MODEL_CONFIG_H
#define ENGINED_MODEL_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "err.h"

enum model_arch {
	ARCH_LLAMA = 0,
	ARCH_QWEN2 = 1,   /* q/k/v projections carry a bias */
	ARCH_QWEN3 = 2,   /* q_norm / k_norm RMSNorm over head_dim */
	ARCH_MISTRAL = 3, /* llama layout; sliding window not supported (refused when smaller than max_position_embeddings) */
	ARCH_QWEN3_MOE = 4, /* qwen3 attention; experts (mlp.gate, mlp.experts.N.*_proj) */
	ARCH_MIXTRAL = 5, /* mistral attention; experts (block_sparse_moe.gate, .experts.N.w1/w2/w3) */
	ARCH_QWEN2_MOE = 6, /* qwen2 attention; experts as qwen3_moe's plus a shared expert */
	ARCH_OLMOE = 7,   /* q_norm / k_norm over the whole projections; experts as qwen3_moe's */
};

/* The RMSNorm of the query and key projections before RoPE: none, one
 * per head over head_dim (qwen3), or one over each whole projection
 * (olmoe: q_norm [H*D], k_norm [KV*D]). */
enum model_qk_norm {
	MODEL_QK_NORM_NONE = 0,
	MODEL_QK_NORM_HEAD,
	MODEL_QK_NORM_PROJ,
};

/* Upper bounds of the dimensions a config.json may give (a config comes
 * from the network): every size the engine derives from them (products of
 * two or three, summed over the layers) fits int64 with a wide margin, and
 * a model at these bounds is far larger than any allocation can hold, so
 * a too-large but valid config fails with ENOMEM, never by overflow. */
#define MODEL_MAX_VOCAB (INT64_C(1) << 22)
#define MODEL_MAX_HIDDEN (INT64_C(1) << 16)
#define MODEL_MAX_INTERMEDIATE (INT64_C(1) << 18)
#define MODEL_MAX_LAYERS (INT64_C(1) << 10)
#define MODEL_MAX_HEADS (INT64_C(1) << 10)
#define MODEL_MAX_HEAD_DIM (INT64_C(1) << 10)
#define MODEL_MAX_POSITIONS (INT64_C(1) << 24)
/* Labels of a *ForTokenClassification config (id2label's entries or
 * num_labels): read to be checked (a value model has one) and written
 * back one entry each. */
#define MODEL_MAX_LABELS (INT64_C(1) << 10)
#define MODEL_MAX_EXPERTS (INT64_C(1) << 10)
#define MODEL_MAX_EXPERTS_PER_TOK 64
/* Tensors of a model's parameter table (Qwen3-235B-A22B has 36.9k, a
 * 61-layer model of 384 experts 70k): its entries take ~170 bytes each. */
#define MODEL_MAX_TENSORS (INT64_C(1) << 18)

/* What a decoder layer's MLP is: dense (one SwiGLU MLP), or a mixture of
 * experts (a router over SwiGLU experts: qwen3_moe, qwen2_moe, mixtral,
 * olmoe), chosen per
 * layer (Qwen's decoder_sparse_step and mlp_only_layers; model_layer_mlp). */
enum model_mlp {
	MODEL_MLP_DENSE = 0,
	MODEL_MLP_MOE,
};

/* The model class a config.json names in "architectures"[0]: the family
 * table of config.c gives each family's two names. */
enum model_head {
	MODEL_HEAD_UNSTATED = 0, /* no architectures, or a class engined does not name */
	MODEL_HEAD_CAUSAL_LM,    /* <Family>ForCausalLM: lm_head (a language model) */
	MODEL_HEAD_TOKEN_CLS,    /* <Family>ForTokenClassification: score (a value model) */
};

struct model_config {
	enum model_arch arch;
	char model_type[32];        /* as written in config.json */
	int64_t vocab_size;         /* V */
	int64_t hidden_size;        /* C */
	int64_t intermediate_size;  /* F */
	int64_t num_layers;         /* L = num_hidden_layers */
	int64_t num_heads;          /* H = num_attention_heads */
	int64_t num_kv_heads;       /* KV = num_key_value_heads (default H) */
	int64_t head_dim;           /* D = head_dim (default C / H) */
	int64_t max_position_embeddings;
	double rms_norm_eps;        /* default 1e-6 */
	double rope_theta;          /* default 10000 */
	bool tie_word_embeddings;   /* default false */
	/* pad_token_id: transformers' padding_idx of the embedding, whose row
	 * takes no gradient from its tokens; -1: none (null, or absent where
	 * the family's default is None; olmoe's is 1). */
	int64_t pad_token_id;
	bool attention_bias;        /* q/k/v bias: qwen2 always, llama/qwen3 if "attention_bias" */
	enum model_qk_norm qk_norm; /* qwen3 and qwen3_moe: HEAD; olmoe: PROJ */
	enum model_mlp mlp;         /* MOE: the family has experts (model_layer_mlp) */
	/* Mixture of experts: num_experts (E) SwiGLU experts of
	 * moe_intermediate_size (I; mixtral, olmoe: intermediate_size) each; a token
	 * goes to the experts_per_tok (k) of highest softmax probability of
	 * the router's logits, weighted by those probabilities, renormalised
	 * to sum to 1 when norm_topk_prob (mixtral: always). A qwen layer
	 * l is sparse unless dense_layers has it (mlp_only_layers) and when
	 * (l + 1) % decoder_sparse_step == 0. output_router_logits: training
	 * adds router_aux_loss_coef times the router's auxiliary loss, as
	 * transformers does (llama.h). qwen2_moe's experts layers also have a
	 * shared expert, a SwiGLU MLP of shared_expert_size (S; 0: none) every
	 * token goes through, its output scaled by the sigmoid of a gate
	 * [1, C] and added to the experts'. */
	int64_t num_experts, experts_per_tok, moe_intermediate_size, decoder_sparse_step;
	int64_t shared_expert_size;
	bool norm_topk_prob;
	uint64_t dense_layers[MODEL_MAX_LAYERS / 64];
	double router_aux_loss_coef;
	bool output_router_logits;
	/* rope_scaling {"rope_type"|"type": "llama3", factor, low_freq_factor,
	 * high_freq_factor, original_max_position_embeddings} */
	bool rope_llama3;
	double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
	int64_t rope_original_max_pos;
	double initializer_range;   /* default 0.02, for random init */
	/* o_proj bias: HF gives llama and qwen3 a bias on o_proj too when
	 * "attention_bias" is true (qwen2: q/k/v only; mistral: never). */
	bool o_proj_bias;
	enum model_head head;       /* what "architectures"[0] names */
	/* MODEL_HEAD_TOKEN_CLS: the labels as transformers counts them, from
	 * labels_key: "id2label" (its entries), else "num_labels", else NULL
	 * (transformers' default, 2). 0 for other heads. */
	int64_t num_labels;
	const char *labels_key;
};

/* The MLP of decoder layer `layer` (0 <= layer < num_layers). */
static inline enum model_mlp model_layer_mlp(const struct model_config *c, int64_t layer)
{
	if (c->mlp != MODEL_MLP_MOE || (c->dense_layers[layer / 64] >> (layer % 64) & 1))
		return MODEL_MLP_DENSE;
	return (layer + 1) % c->decoder_sparse_step == 0 ? MODEL_MLP_MOE : MODEL_MLP_DENSE;
}

/* Whether any layer is a mixture of experts; whether any is dense. */
bool model_has_experts(const struct model_config *c);
bool model_has_dense(const struct model_config *c);

/* Parse the text of a config.json. Unknown model_type, missing required
 * fields, non-positive sizes, H % KV != 0, odd head_dim, unsupported
 * rope_scaling type, "architectures"[0] another family's class, a
 * *ForTokenClassification config's id2label or num_labels out of
 * [1, MODEL_MAX_LABELS]: -EINVAL with a message naming the key. The head
 * is recorded, not yet held against the engine (model_config_set_head). */
int model_config_parse(const char *json_text, struct model_config *ret,
		       struct eng_error *err);

/* Check cfg's head against the engine's kind and make it the engine's: a
 * value model (value_model) takes a config of no stated head, a
 * *ForCausalLM one (verl's critic built from the actor) or a
 * *ForTokenClassification one of one label; a language model refuses a
 * *ForTokenClassification one (no lm_head). On success cfg->head is
 * MODEL_HEAD_TOKEN_CLS with one label (value model) or MODEL_HEAD_CAUSAL_LM,
 * what model_config_to_json then writes. -EINVAL with a message naming the
 * key (cfg untouched). */
int model_config_set_head(struct model_config *cfg, bool value_model, struct eng_error *err);

/* Serialize back to config.json text (HF keys; for checkpoints): for
 * MODEL_HEAD_TOKEN_CLS "architectures" ["<Family>ForTokenClassification"]
 * with id2label {"0": "LABEL_0", ...} and label2id, as transformers'
 * to_dict writes them; else ["<Family>ForCausalLM"]. Returns a
 * malloc'ed string owned by the caller, or NULL on allocation failure. */
char *model_config_to_json(const struct model_config *cfg);

/* RoPE inverse frequencies inv_freq[D/2] (fp32, as HF computes them,
 * including llama3 scaling). */
void model_config_rope_inv_freq(const struct model_config *cfg, float *inv_freq);

#endif
