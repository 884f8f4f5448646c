/* native_peft.h — a PEFT LoRA adapter directory as an adapter's start
 * (native_adapter.c): adapter_config.json read and checked against the
 * base and the request, adapter_model.safetensors's matrices found and
 * read. */
#ifndef ENGINED_NATIVE_PEFT_H
#define ENGINED_NATIVE_PEFT_H

#include "native_engine.h"

struct st_reader;

#define NATIVE_PEFT_CONFIG "adapter_config.json"
#define NATIVE_PEFT_WEIGHTS "adapter_model.safetensors"

struct native_peft {
	int dfd;                  /* the directory; -1 when closed */
	struct st_reader *r;      /* adapter_model.safetensors */
};

/* Open cfg->peft_dir and set n->lora's info (rank, alpha, targets,
 * rslora) and per-layer targets from it: the file's values, each of which
 * cfg may repeat but not contradict (-EINVAL naming the field and the
 * file's value). The tensors must be PEFT LoRA matrices of this base's
 * projections, A and B of each, shaped [rank, in] and [out, rank]
 * (-EINVAL naming the file and tensor); a configuration this engine does
 * not train (DoRA, biases, modules_to_save, rank or alpha patterns,
 * fan_in_fan_out) is -EINVAL naming its key. Close with native_peft_close
 * whatever it returned. */
int native_peft_open(struct native *n, const struct engine_adapter_config *cfg,
		     struct native_peft *p, struct eng_error *err);
/* The matrices into host[table.total], laid out by n's table. */
int native_peft_read(struct native *n, struct native_peft *p, float *host,
		     struct eng_error *err);
void native_peft_close(struct native_peft *p);

/* adapter n's adapter_config.json as peft writes it (text, caller frees;
 * NULL when out of memory): r, lora_alpha, use_rslora, and target_modules
 * as module names, or as full module paths
 * (model.layers.<l>.self_attn.q_proj) when the layers differ. */
char *native_peft_config_json(const struct native *n);

#endif
