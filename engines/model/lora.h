/* lora.h — LoRA adapters over the Llama family: the projections an adapter
 * may target (PEFT's module names), its parameter table in PEFT's tensor
 * names, and the pointers llama.c's forward and backward read.
 *
 * An adapter adds to a targeted projection y = x W^T the product
 * scale * (x A^T) B^T, A [rank, in] and B [out, rank]; scale is alpha /
 * rank (alpha / sqrt(rank) with rsLoRA). Its table lists, layer by layer
 * and in enum lora_module order, lora_A then lora_B of every targeted
 * projection, named as PEFT saves them:
 * base_model.model.model.layers.<l>.self_attn.q_proj.lora_A.weight;
 * a value model's adapter then owns the score head (PEFT's
 * modules_to_save), base_model.model.score.weight and .bias.
 */
#ifndef ENGINED_MODEL_LORA_H
#define ENGINED_MODEL_LORA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "params.h"

/* The order of engine.h's ENGINE_LORA bits. */
enum lora_module {
	LORA_Q = 0,
	LORA_K,
	LORA_V,
	LORA_O,
	LORA_GATE,
	LORA_UP,
	LORA_DOWN,
	LORA_MODULES,
};

/* "q_proj" ... "down_proj"; NULL past the last. */
const char *lora_module_name(int mod);
/* "self_attn" or "mlp": the module's parent in the Hugging Face model. */
const char *lora_module_parent(int mod);
/* The bit of a module name or of a module path ending in ".<name>";
 * "all-linear": every bit; 0 when unknown. */
unsigned lora_module_bits(const char *name);
/* The projection's in and out features. */
void lora_module_dims(const struct model_config *cfg, int mod, int64_t *in, int64_t *out);

/* The largest rank a projection allows: min(in, out). */
int64_t lora_max_rank(const struct model_config *cfg, int mod);

/* The table of an adapter of `rank` whose layer l targets the modules of
 * bits layer_targets[l] (L entries), with the score head last for a value
 * model. The caller has checked the rank against lora_max_rank. -ENOMEM /
 * -E2BIG with a message. */
int lora_table_build(const struct model_config *cfg, int64_t rank,
		     const unsigned *layer_targets, bool value_model,
		     struct param_table *ret, struct eng_error *err);
/* The names of a value model adapter's score head. */
#define LORA_SCORE_WEIGHT "base_model.model.score.weight"
#define LORA_SCORE_BIAS "base_model.model.score.bias"
/* PEFT's name of layer l's module `mod` matrix 'A' or 'B' into buf. */
void lora_tensor_name(char *buf, size_t cap, int64_t layer, int mod, char which);

/* One layer's adapter matrices (NULL where the module is not targeted). */
struct lora_layer {
	const float *A[LORA_MODULES];   /* [rank, in] */
	const float *B[LORA_MODULES];   /* [out, rank] */
	float *dA[LORA_MODULES];        /* gradients, same shapes */
	float *dB[LORA_MODULES];
};

/* Point layers[L] at the table's matrices in `params` and `grads` (flat
 * arrays laid out by the table; grads may be NULL). */
void lora_bind(const struct param_table *t, const struct model_config *cfg,
	       const unsigned *layer_targets, const float *params, float *grads,
	       struct lora_layer *layers);

#endif
