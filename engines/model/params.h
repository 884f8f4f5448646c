/* params.h — the parameter table of a Llama-family model.
 *
 * Every parameter lives in one flat fp32 array (one allocation per state
 * family: parameters, gradients, Adam first and second moments all share
 * this layout). The table gives each tensor its Hugging Face name, shape and
 * offset; `struct model_weights` resolves the offsets against a base
 * pointer, so the same code addresses parameters and gradients.
 */
#ifndef ENGINED_MODEL_PARAMS_H
#define ENGINED_MODEL_PARAMS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"

/* What the optimizer does with a tensor. Every tensor of a model is
 * trainable today; a LoRA base (its adapters trainable) is frozen: no
 * gradient and no optimizer state (docs/HACKING.md, where adapters plug in). */
enum param_role {
	PARAM_TRAINABLE = 0,
	PARAM_FROZEN,
};

struct param_entry {
	char name[96];        /* HF name, e.g. model.layers.3.mlp.up_proj.weight */
	int ndim;
	int64_t shape[2];
	int64_t numel;
	int64_t offset;       /* element offset into the flat array */
	bool init_ones;       /* RMSNorm weights start at 1 */
	bool init_zero;       /* biases start at 0 */
	int64_t layer;        /* its decoder layer, or -1 (embedding, final norm, head) */
	enum param_role role;
	/* The elements of the whole tensor (numel, row-major) that this rank
	 * holds: [held_start, held_start + held_numel). Whole today (0,
	 * numel); a parameter sharded over a group's ranks holds one rank's
	 * rows (docs/HACKING.md, where sharded parameters plug in). */
	int64_t held_start, held_numel;
};

struct param_table {
	struct param_entry *entries;
	int64_t count;
	int64_t total;        /* elements in the flat array */
};

/* Pointers into one flat array laid out by a param_table. NULL for tensors
 * the architecture does not have. */
struct layer_weights {
	float *ln1;           /* [C] input_layernorm */
	float *wq, *bq;       /* [H*D, C], [H*D] */
	float *wk, *bk;       /* [KV*D, C], [KV*D] */
	float *wv, *bv;       /* [KV*D, C], [KV*D] */
	float *q_norm;        /* [D] (qwen3), [H*D] (olmoe) */
	float *k_norm;        /* [D] (qwen3), [KV*D] (olmoe) */
	float *wo, *bo;       /* [C, H*D], [C] (o_proj bias: llama/qwen3 attention_bias) */
	float *ln2;           /* [C] post_attention_layernorm */
	float *w_gate;        /* [F, C] (a dense layer) */
	float *w_up;          /* [F, C] */
	float *w_down;        /* [C, F] */
	/* A mixture-of-experts layer (model_layer_mlp): the router [E, C],
	 * and the experts one after the other, expert e's gate [I, C], up
	 * [I, C] and down [C, I] at experts + e * 3 I C (moe_expert_w). */
	float *router;
	float *experts;
	/* qwen2_moe's shared expert: gate and up [S, C], down [C, S], and the
	 * gate of its share, sh_score [1, C] (config.h). */
	float *sh_gate, *sh_up, *sh_down, *sh_score;
};

/* Expert e's projection j (0 gate, 1 up, 2 down) in a layer's experts. */
static inline float *moe_expert_w(float *experts, const struct model_config *c, int64_t e,
				  int j)
{
	return experts ? experts + (3 * e + j) * c->moe_intermediate_size * c->hidden_size
		       : NULL;   /* a frozen model's gradients */
}

struct model_weights {
	float *wte;                    /* [V, C] model.embed_tokens */
	struct layer_weights *layers;  /* [L] */
	float *norm;                   /* [C] model.norm */
	float *lm_head;                /* [V, C]; == wte when tied; NULL for value models */
	float *score;                  /* [1, C] value head; NULL for language models */
	float *score_bias;             /* [1] */
};

/* Build the table for cfg; value_model replaces lm_head by score.{weight,bias}.
 * The caller frees with param_table_free. */
int param_table_build(const struct model_config *cfg, bool value_model,
		      struct param_table *ret, struct eng_error *err);
void param_table_free(struct param_table *t);

/* Append a trainable entry holding the whole tensor (d1 ignored when ndim
 * is 1) to t, whose entries array has room for *cap (grown as needed):
 * -ENOMEM, -E2BIG when the total overflows. The LoRA table (lora.c) is
 * built with it too. */
int param_table_append(struct param_table *t, int64_t *cap, const char *name, int ndim,
		       int64_t d0, int64_t d1, int64_t layer);

/* Whether `name` is expert e's projection j (0 gate, 1 up, 2 down) of
 * layer l under cfg's family's names (the table's own). */
bool param_expert_of(const struct model_config *cfg, const char *name, int64_t *l,
		     int64_t *e, int *j);

/* Index of a name, or -1. */
int64_t param_table_find(const struct param_table *t, const char *name);
/* The LM head is the embedding (no lm_head.weight, not a value model). */
bool param_table_tied(const struct param_table *t);

/* Resolve pointers against `base` (a flat array of t->total floats).
 * ret->layers must point to an array of cfg->num_layers. */
void model_weights_bind(const struct param_table *t, const struct model_config *cfg,
			float *base, struct model_weights *ret);

/* The same for the tensors that lie wholly in the table's elements
 * [lo, hi), held at base (base[0] is element lo); the other pointers stay
 * as they are (a tied head follows the embedding). A sharded group binds
 * each part of the model to the buffer it gathers that part in. */
void model_weights_bind_range(const struct param_table *t, const struct model_config *cfg,
			      float *base, int64_t lo, int64_t hi, struct model_weights *ret);

#endif
