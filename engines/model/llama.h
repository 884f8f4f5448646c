/* llama.h — forward and backward of a Llama-family decoder over one packed
 * micro-batch, written once over the device kernel table.
 *
 * Row conventions: the model computes one output per token position r of
 * the micro-batch ("row-aligned"): row_logp[r] = log p(ids[r+1] | ids[..r])
 * when r+1 is in the same sequence (targets[r] = ids[r+1]), else the row has
 * no target (targets[r] = -1, row_logp[r] = 0). The engine turns these into
 * the target-aligned outputs of docs/DESIGN.md §3 (entry t <- row t-1).
 * Values are row-aligned too: row_val[r] = score · h_final[r] + bias.
 *
 * Gradient convention: llama_backward ACCUMULATES (+=) into the gradient
 * arrays, so micro-batches and calls sum until the optimizer zeroes them.
 */
#ifndef ENGINED_MODEL_LLAMA_H
#define ENGINED_MODEL_LLAMA_H

#include <stdbool.h>
#include <stdint.h>

#include "../device/device.h"
#include "config.h"
#include "lora.h"
#include "params.h"

/* A paged key/value cache for decoding (engines/model/kv_cache.h owns its
 * memory): a forward over a batch that names one writes each token's keys
 * and values into the token's slot and attends over its sequence's cached
 * positions 0 .. pos (written first, its own included), so a sequence may
 * be fed a chunk at a time or a token at a time. All arrays device. */
struct llama_kv {
	int64_t block;             /* positions per block */
	float *const *k, *const *v;/* [L]: a layer's [nblocks, block, KV, D] */
	const int32_t *tables;     /* the sequences' block lists, end to end */
	const int32_t *table_off;  /* [T]: where token t's sequence's list starts */
	const int32_t *slots;      /* [T]: block x block size + offset of pos */
};

/* One micro-batch, all arrays in device memory. */
struct llama_batch {
	int64_t T;                 /* tokens */
	int64_t B;                 /* sequences */
	const int32_t *ids;        /* [T] */
	const int32_t *pos;        /* [T] position inside its sequence */
	const int32_t *cu_seqlens; /* [B+1] */
	const int32_t *targets;    /* [T] next token in the same sequence, or -1 */
	/* NULL: every sequence starts in this batch (training, scoring);
	 * pos[] counts from 0 within it. Else the cache its sequences
	 * continue (decoding). */
	struct llama_kv *kv;
	/* A mixture of experts' routing, [experts layers, T, k] (the experts
	 * layers in order, model_layer_mlp): route (device; NULL: the router
	 * chooses) forces each token's k experts, ids in [0, E) distinct per
	 * token (the caller's check), their weights still the router's live
	 * probabilities (routing replay); route_out (host; NULL: not wanted)
	 * receives the choice each layer made. */
	const int32_t *route;
	int32_t *route_out;
};

/* Default LM-head logits tile: 2M floats (8 MiB), so that a tile the
 * product writes is still in the last-level cache when the log-prob pass
 * reads it, and the products are of a size oneDNN's AVX2 kernels run well
 * (16M before: forward-only 54-61% of the AVX2 FMA peak against 67-69%
 * with 2M, training 63-68% against 66-70%; AVX-512 forward 82-83% against
 * 84-85%, training 76-77% against 81-83%; tests/bench/bench_train
 * --lm-tile, 6 layers of the 0.5B shape, 1 x 256, docs/PERF.md). The
 * weight is re-read once per row block (1024 rows here): 2% of a block's
 * product time at most. */
#define LLAMA_LM_TILE_DEFAULT (2 << 20)
/* Default bound of the logits a training forward keeps for its backward:
 * 256M floats (1 GiB), so T x V <= 256M: with Qwen's 151936-token
 * vocabulary, micro-batches up to 1766 tokens keep them (+40% on the other
 * activations of Qwen2.5-0.5B, 13% of its fp32 training state); 4096-token
 * micro-batches (2.5 GiB of logits) recompute them. */
#define LLAMA_LM_CACHE_DEFAULT (INT64_C(256) << 20)

/* The LoRA adapter a pass runs with (llama_model.lora; lora.h): its
 * matrices and their gradients per layer, its scale, and device scratch
 * of at least llama_lora_scratch_floats(rank, T) floats for a pass of T
 * tokens. */
struct llama_lora {
	int64_t rank;
	float scale;
	const struct lora_layer *layers;   /* [L] */
	float *scratch;
	/* A value model's head, the adapter's own (PEFT's modules_to_save)
	 * and trained with it; NULL in a language model's adapter. */
	const float *score, *score_bias;   /* [1, C], [1] */
	float *dscore, *dscore_bias;
};

static inline int64_t llama_lora_scratch_floats(int64_t rank, int64_t T)
{
	return 2 * rank * T;
}

struct llama_model {
	struct device *dev;
	struct model_config cfg;
	bool value_model;
	struct model_weights w;    /* parameters (device) */
	struct model_weights g;    /* gradients (device), same layout */
	float *inv_freq;           /* [D/2] device */
	int64_t lm_tile;           /* floats per LM-head logits tile */
	/* Floats of LM-head logits [T, V] a training forward may keep for the
	 * backward, which then skips recomputing them (llama.c); 0: never. */
	int64_t lm_cache;

	/* Activation arena (device), sized for `cap_tokens` tokens. */
	float *arena;
	size_t arena_floats;
	int64_t cap_tokens;
	bool cap_training;
	bool cap_lm_cache;         /* the arena keeps [cap_tokens, V] logits */
	/* Set by the caller before llama_reserve: the next training pass
	 * keeps each layer's input only and its backward recomputes the layer
	 * (llama.c). cap_recompute: what the reservation was made for. */
	bool recompute;
	bool cap_recompute;
	int rc;                    /* first kernel error of the running pass */
	/* NULL, or called by llama_backward on the calling thread as the
	 * gradients of a part of the model are complete for this pass: with
	 * layer = L (num_layers) once the head and the final norm are done,
	 * then with each layer l = L-1 .. 0 once layers l..L-1 are done. The
	 * embedding (and a head tied to it) is complete when llama_backward
	 * returns. Work queued on a device stream may still be running. */
	void (*grads_done)(void *ctx, int64_t layer);
	void *grads_done_ctx;
	/* NULL, or called on the calling thread around each part of the
	 * model a pass uses, for a data-parallel group that shards the
	 * parameters or gradients (engines/native/native_shard.c): before
	 * (end false) the part's weights (and, backward, its gradients) are
	 * read or written, and after (end true) the pass is done with them.
	 * Parts: the layers 0 .. L-1, LLAMA_PART_HEAD(L) (the final norm and
	 * the LM or value head), LLAMA_PART_EMBED(L) (the embedding). A
	 * forward walks EMBED, 0 .. L-1, HEAD; a backward HEAD, L-1 .. 0,
	 * EMBED (llama_walk_parts runs that order with no tokens). A non-zero
	 * return becomes the pass's error (m->rc) and the pass calls no more
	 * hooks. */
	int (*part)(void *ctx, int64_t part, bool backward, bool end);
	void *part_ctx;
	/* Set by the caller when every gradient is zero: llama_backward then
	 * writes each weight's product-gradient (dy^T x) instead of adding it
	 * to the zeroes (its first product into that weight; biases, norms
	 * and the embedding's rows still add), and clears it on return. */
	bool grads_zero;
	/* The base is frozen: llama_backward computes no gradient of its
	 * weights (g is not read or written), only the input gradients the
	 * adapter's need. */
	bool frozen;
	/* NULL, or the adapter the passes run with: each projection it targets
	 * adds scale (x A^T) B^T, and llama_backward accumulates its A and B
	 * gradients (written, not added, under grads_zero). */
	const struct llama_lora *lora;
	/* Mixture of experts (host memory): each experts layer's row ranges
	 * by expert from the last pass through it, [L][E + 1] (the backward
	 * and a recompute read and rewrite them); the grouping's scratch, 3
	 * ints per choice of cap_tokens. */
	int64_t *moe_off;
	int32_t *moe_host;
	int64_t moe_host_cap;
	struct gemm_group *moe_groups;   /* [E] a grouped product's groups */
	/* The router's auxiliary loss, transformers' load_balancing_loss_func
	 * over a pass's tokens and experts layers: llama_forward leaves its
	 * value (without the coefficient) in moe_aux, and each expert's
	 * choices over the layers in moe_counts [E] (host); a training
	 * llama_backward adds moe_aux_scale (the caller's: the coefficient
	 * times the pass's weight; 0: none) times its gradient. */
	double moe_aux;
	double moe_aux_scale;
	int64_t *moe_counts;
	float *moe_host_e;         /* [E] host scratch */
};

/* Set up a model over already-bound weights and gradients (layers arrays
 * owned by the caller). Uploads the RoPE frequencies. A layer whose MLP is
 * not dense (model_layer_mlp) is refused: -EINVAL. */
int llama_init(struct llama_model *m, struct device *dev,
	       const struct model_config *cfg, bool value_model,
	       struct eng_error *err);
void llama_release(struct llama_model *m);   /* frees arena and inv_freq */

/* Free the activation arena (llama_reserve makes a new one). */
void llama_drop_activations(struct llama_model *m);

/* Bytes of activations needed for T tokens (training keeps every layer's
 * activations, or with m->recompute one layer's and every layer's input,
 * and, within lm_cache, the LM head's logits; forward-only keeps one
 * layer's). */
size_t llama_activation_bytes(const struct llama_model *m, int64_t T, bool training);
/* Make the arena hold T tokens; -ENOMEM leaves the old arena in place. */
int llama_reserve(struct llama_model *m, int64_t T, bool training,
		  struct eng_error *err);

/* Forward. row_logp/row_ent [T] (language model) or row_val [T] (value
 * model), device memory, overwritten. With training=true the activations are
 * kept for llama_backward of the same batch. A batch with a cache (kv) is
 * forward-only (training: -EINVAL), its cu_seqlens unused; its row_logp
 * and row_ent may be NULL (no LM head: llama_logits then reads the final
 * norm's rows). */
int llama_forward(struct llama_model *m, const struct llama_batch *b,
		  float inv_temp, bool training, float *row_logp, float *row_ent,
		  float *row_val);
/* After a forward-only llama_forward of T tokens: logits[R, V] (device) =
 * the LM head at rows[R] (device) of its final norm, raw (no
 * temperature). A value model: -EINVAL. */
int llama_logits(struct llama_model *m, int64_t T, const int32_t *rows, int64_t R,
		 float *logits);

#define LLAMA_PART_HEAD(L) (L)
#define LLAMA_PART_EMBED(L) ((L) + 1)

/* The part a pass of L layers uses after part p (p < 0: its first; -1
 * after its last), in the order above: the one place for that order. */
int64_t llama_part_next(int64_t L, int64_t p, bool backward);

/* The hooks (m->part) of a forward (backward false) or a backward pass in
 * their order, with no tokens and no kernels: a rank of a sharded group
 * with fewer micro-batches than its peers takes part in their gathers and
 * reductions with this (its gradients then add nothing). Returns m->rc. */
int llama_walk_parts(struct llama_model *m, bool backward);

/* Backward from row-aligned upstream gradients (device [T]: drow_logp and
 * drow_ent for language models, drow_val for value models);
 * accumulates into m->g. */
int llama_backward(struct llama_model *m, const struct llama_batch *b,
		   float inv_temp, const float *drow_logp, const float *drow_ent,
		   const float *drow_val);

#endif
