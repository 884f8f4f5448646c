/* lora.c — LoRA module names, dimensions, table and bindings (lora.h). */
#include "lora.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const module_names[LORA_MODULES] = {
	"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
};

const char *lora_module_name(int mod)
{
	return mod >= 0 && mod < LORA_MODULES ? module_names[mod] : NULL;
}

const char *lora_module_parent(int mod)
{
	return mod < LORA_GATE ? "self_attn" : "mlp";
}

unsigned lora_module_bits(const char *name)
{
	size_t n = strlen(name);

	if (!strcmp(name, "all-linear"))
		return (1u << LORA_MODULES) - 1;
	for (int i = 0; i < LORA_MODULES; i++) {
		size_t k = strlen(module_names[i]);

		if (n >= k && !strcmp(name + n - k, module_names[i]) &&
		    (n == k || name[n - k - 1] == '.'))
			return 1u << i;
	}
	return 0;
}

void lora_module_dims(const struct model_config *cfg, int mod, int64_t *in, int64_t *out)
{
	int64_t C = cfg->hidden_size, F = cfg->intermediate_size;
	int64_t QD = cfg->num_heads * cfg->head_dim, KD = cfg->num_kv_heads * cfg->head_dim;

	switch (mod) {
	case LORA_Q: *in = C; *out = QD; break;
	case LORA_K:
	case LORA_V: *in = C; *out = KD; break;
	case LORA_O: *in = QD; *out = C; break;
	case LORA_GATE:
	case LORA_UP: *in = C; *out = F; break;
	default: *in = F; *out = C; break;
	}
}

int64_t lora_max_rank(const struct model_config *cfg, int mod)
{
	int64_t in, out;

	lora_module_dims(cfg, mod, &in, &out);
	return in < out ? in : out;
}

void lora_tensor_name(char *buf, size_t cap, int64_t layer, int mod, char which)
{
	snprintf(buf, cap, "base_model.model.model.layers.%lld.%s.%s.lora_%c.weight",
		 (long long)layer, lora_module_parent(mod), module_names[mod], which);
}

int lora_table_build(const struct model_config *cfg, int64_t rank,
		     const unsigned *layer_targets, bool value_model,
		     struct param_table *ret, struct eng_error *err)
{
	struct param_table t = {0};
	int64_t cap = 0, in, out;
	char name[96];
	int rc = 0;

	for (int64_t l = 0; l < cfg->num_layers && !rc; l++)
		for (int m = 0; m < LORA_MODULES && !rc; m++) {
			if (!(layer_targets[l] & (1u << m)))
				continue;
			lora_module_dims(cfg, m, &in, &out);
			lora_tensor_name(name, sizeof(name), l, m, 'A');
			rc = param_table_append(&t, &cap, name, 2, rank, in, l);
			lora_tensor_name(name, sizeof(name), l, m, 'B');
			if (!rc)
				rc = param_table_append(&t, &cap, name, 2, out, rank, l);
		}
	if (!rc && value_model)
		rc = param_table_append(&t, &cap, LORA_SCORE_WEIGHT, 2, 1, cfg->hidden_size, -1);
	if (!rc && value_model)
		rc = param_table_append(&t, &cap, LORA_SCORE_BIAS, 1, 1, 0, -1);
	if (rc) {
		free(t.entries);
		return eng_fail(err, rc, rc == -E2BIG ? "adapter: its size overflows"
					      : "adapter: out of memory for its table");
	}
	*ret = t;
	return 0;
}

void lora_bind(const struct param_table *t, const struct model_config *cfg,
	       const unsigned *layer_targets, const float *params, float *grads,
	       struct lora_layer *layers)
{
	int64_t i = 0;

	for (int64_t l = 0; l < cfg->num_layers; l++) {
		struct lora_layer *y = &layers[l];

		memset(y, 0, sizeof(*y));
		for (int m = 0; m < LORA_MODULES; m++) {
			if (!(layer_targets[l] & (1u << m)))
				continue;
			y->A[m] = params + t->entries[i].offset;
			y->dA[m] = grads ? grads + t->entries[i].offset : NULL;
			i++;
			y->B[m] = params + t->entries[i].offset;
			y->dB[m] = grads ? grads + t->entries[i].offset : NULL;
			i++;
		}
	}
}
