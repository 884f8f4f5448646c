/* native_engine.h — the native engine: the Llama family on any device of
 * the device table. One implementation, registered once per (model_type,
 * device); this header is shared by its files (engine ops, checkpoints). */
#ifndef ENGINED_NATIVE_ENGINE_H
#define ENGINED_NATIVE_ENGINE_H

#include "../device/device.h"
#include "../engine.h"
#include "../model/config.h"
#include "../model/llama.h"
#include "../model/params.h"
#include "../rng.h"

extern const struct engine_ops native_lm_cpu_ops;
extern const struct engine_ops native_value_cpu_ops;

/* Device scratch for one micro-batch's inputs and outputs. */
struct native_io {
	int64_t cap_tokens, cap_seqs;
	int32_t *ids, *pos, *targets;  /* [cap_tokens] device */
	int32_t *cu_seqlens;           /* [cap_seqs + 1] device */
	float *rows;                   /* [3, cap_tokens] device: logp, ent, val */
	float *drows;                  /* [3, cap_tokens] device: their gradients */
};

struct native {
	char key[96];
	struct model_config cfg;
	bool value_model;
	struct device *dev;

	struct param_table table;
	/* One allocation per state family, each [table.total] on the device. */
	float *params, *grads, *exp_avg, *exp_avg_sq;
	struct layer_weights *wl, *gl; /* [L] bound layer pointers */
	struct llama_model model;
	struct native_io io;
	float *stage;                  /* host staging for non-host devices */

	struct engine_optim_config optim;
	struct engine_sched_config sched;
	int64_t optim_step;            /* AdamW steps taken */
	int64_t sched_step;            /* lr_scheduler_step calls */
	uint64_t seed;
	struct rng rng;
	int64_t default_budget;
	struct engine_placement place;
};

/* native_ckpt.c */
int native_save_checkpoint(struct engine *e, const char *dir, int64_t global_step,
			   int max_to_keep, unsigned contents, size_t *ret_bytes,
			   struct eng_error *err);
int native_load_checkpoint(struct engine *e, const char *dir, unsigned contents,
			   int64_t *ret_global_step, struct eng_error *err);

/* Current lr = peak lr * schedule factor at sched_step. */
double native_current_lr(const struct native *n);

#endif
