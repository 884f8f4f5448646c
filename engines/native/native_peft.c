/* native_peft.c — a PEFT LoRA adapter directory read into an adapter
 * (native_peft.h). PEFT's files: adapter_config.json (r, lora_alpha,
 * target_modules as names or, for "all-linear", as full module paths,
 * use_rslora, ...) and adapter_model.safetensors, whose tensors are named
 * base_model.model.model.layers.<l>.<self_attn|mlp>.<module>.lora_<A|B>.weight
 * (saved without the adapter's ".default" infix). */
#include "native_peft.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "io/fileio.h"
#include "io/safetensors.h"

#define PEFT_CONFIG NATIVE_PEFT_CONFIG
#define PEFT_WEIGHTS NATIVE_PEFT_WEIGHTS

/* A key whose value must be absent, null, false, empty or `fine`. */
static int unsupported(json_t *c, const char *dir, const char *key, const char *fine,
		       struct eng_error *err)
{
	json_t *v = json_object_get(c, key);

	if (!v || json_is_null(v) || json_is_false(v) ||
	    (json_is_array(v) && json_array_size(v) == 0) ||
	    (json_is_object(v) && json_object_size(v) == 0) ||
	    (fine && json_is_string(v) && !strcmp(json_string_value(v), fine)))
		return 0;
	return eng_fail(err, -EINVAL, "peft_dir: %s/%s: %s is set; engined trains plain LoRA "
			"only (no DoRA, biases, modules_to_save, rank or alpha patterns, "
			"fan_in_fan_out, layers_to_transform)", dir, PEFT_CONFIG, key);
}

static int targets_of(json_t *c, const char *dir, unsigned *ret, struct eng_error *err)
{
	json_t *t = json_object_get(c, "target_modules"), *v;
	size_t i;

	*ret = 0;
	if (json_is_string(t)) {
		*ret = lora_module_bits(json_string_value(t));
		if (!*ret)
			return eng_fail(err, -EINVAL, "peft_dir: %s/%s: target_modules '%s' is "
					"not a module name or all-linear (regular expressions are "
					"not read)", dir, PEFT_CONFIG, json_string_value(t));
		return 0;
	}
	if (!json_is_array(t) || json_array_size(t) == 0)
		return eng_fail(err, -EINVAL, "peft_dir: %s/%s: target_modules must be a "
				"non-empty list or a string", dir, PEFT_CONFIG);
	json_array_foreach(t, i, v) {
		unsigned bit = json_is_string(v) ? lora_module_bits(json_string_value(v)) : 0;

		if (!bit)
			return eng_fail(err, -EINVAL, "peft_dir: %s/%s: target_modules[%zu] is "
					"not a projection of this model (%s)", dir, PEFT_CONFIG, i,
					json_is_string(v) ? json_string_value(v) : "not a string");
		*ret |= bit;
	}
	return 0;
}

/* modules_to_save: none for a language model; a value model's adapter
 * owns its score head, which PEFT lists as "score" (and "classifier", the
 * name of other models' heads, with TOKEN_CLS). */
static int modules_to_save(json_t *c, const char *dir, bool value_model,
			   struct eng_error *err)
{
	json_t *m = json_object_get(c, "modules_to_save"), *v;
	size_t i;

	if (!value_model)
		return unsupported(c, dir, "modules_to_save", NULL, err);
	if (!m || json_is_null(m))
		return 0;
	if (json_is_array(m))
		json_array_foreach(m, i, v)
			if (!json_is_string(v) || (strcmp(json_string_value(v), "score") &&
						   strcmp(json_string_value(v), "classifier")))
				break;
	if (json_is_array(m) && i == json_array_size(m))
		return 0;
	return eng_fail(err, -EINVAL, "peft_dir: %s/%s: modules_to_save may name the value "
			"head (score) only", dir, PEFT_CONFIG);
}

/* rank, alpha, targets and rslora from the file, checked against cfg. */
static int read_config(struct native *n, const struct engine_adapter_config *cfg,
		       const char *dir, int dfd, struct eng_error *err)
{
	struct engine_adapter_config *info = &n->lora->info;
	static const char *const keys[] = {
		"use_dora", "rank_pattern", "alpha_pattern",
		"fan_in_fan_out", "layers_to_transform", "layers_pattern", "target_parameters",
	};
	json_error_t je;
	json_t *c, *peft_type;
	char *text = NULL;
	int r = io_read_file_at(dfd, PEFT_CONFIG, 1 << 20, &text, NULL), rc = 0;

	if (r < 0)
		return eng_fail(err, r == -EFBIG ? -EINVAL : eng_errno_code(-r),
				"peft_dir: cannot read %s/%s: %s", dir, PEFT_CONFIG,
				r == -EFBIG ? "larger than 1 MiB" : eng_errno_text(-r));
	c = json_loads(text, 0, &je);
	free(text);
	if (!json_is_object(c)) {
		json_decref(c);
		return eng_fail(err, -EINVAL, "peft_dir: %s/%s: not a JSON object (%s)", dir,
				PEFT_CONFIG, je.text);
	}
	peft_type = json_object_get(c, "peft_type");
	if (peft_type && (!json_is_string(peft_type) || strcmp(json_string_value(peft_type), "LORA")))
		rc = eng_fail(err, -EINVAL, "peft_dir: %s/%s: peft_type is not LORA", dir,
			      PEFT_CONFIG);
	for (size_t i = 0; rc == 0 && i < sizeof(keys) / sizeof(keys[0]); i++)
		rc = unsupported(c, dir, keys[i], NULL, err);
	if (rc == 0)
		rc = unsupported(c, dir, "bias", "none", err);
	if (rc == 0)
		rc = modules_to_save(c, dir, n->value_model, err);
	if (rc == 0 && (!json_is_integer(json_object_get(c, "r")) ||
			json_integer_value(json_object_get(c, "r")) < 1))
		rc = eng_fail(err, -EINVAL, "peft_dir: %s/%s: r must be an integer >= 1", dir,
			      PEFT_CONFIG);
	if (rc == 0 && !json_is_number(json_object_get(c, "lora_alpha")))
		rc = eng_fail(err, -EINVAL, "peft_dir: %s/%s: lora_alpha must be a number", dir,
			      PEFT_CONFIG);
	if (rc == 0)
		rc = targets_of(c, dir, &info->targets, err);
	if (rc == 0) {
		info->rank = json_integer_value(json_object_get(c, "r"));
		info->alpha = json_number_value(json_object_get(c, "lora_alpha"));
		info->rslora = json_is_true(json_object_get(c, "use_rslora"));
		if (!(info->alpha > 0) || !isfinite(info->alpha))
			rc = eng_fail(err, -EINVAL, "peft_dir: %s/%s: lora_alpha %g must be > 0",
				      dir, PEFT_CONFIG, info->alpha);
	}
	json_decref(c);
	if (rc)
		return rc;
	if (cfg->rank && cfg->rank != info->rank)
		return eng_fail(err, -EINVAL, "rank: %lld, but %s/%s has r = %lld",
				(long long)cfg->rank, dir, PEFT_CONFIG, (long long)info->rank);
	if (cfg->alpha != 0 && cfg->alpha != info->alpha)
		return eng_fail(err, -EINVAL, "alpha: %g, but %s/%s has lora_alpha = %g",
				cfg->alpha, dir, PEFT_CONFIG, info->alpha);
	if (cfg->targets && cfg->targets != info->targets)
		return eng_fail(err, -EINVAL, "target_modules: differ from %s/%s's", dir,
				PEFT_CONFIG);
	if (cfg->rslora && !info->rslora)
		return eng_fail(err, -EINVAL, "use_rslora: set, but %s/%s has use_rslora false",
				dir, PEFT_CONFIG);
	return 0;
}

/* Which layer and module a tensor of the file is (and its matrix): the
 * layer read from the name, then the name compared with that layer's
 * canonical ones (no sign, no leading zeros: exactly lora_tensor_name's). */
static int parse_name(const struct model_config *cfg, const char *name, int64_t *layer,
		      int *mod, char *which)
{
	static const char prefix[] = "base_model.model.model.layers.";
	const char *p;
	char buf[96];
	int64_t l = 0;

	if (strncmp(name, prefix, sizeof(prefix) - 1))
		return -1;
	for (p = name + sizeof(prefix) - 1; *p >= '0' && *p <= '9' && l < cfg->num_layers; p++)
		l = l * 10 + (*p - '0');
	if (l >= cfg->num_layers)
		return -1;
	for (int m = 0; m < LORA_MODULES; m++)
		for (int k = 0; k < 2; k++) {
			lora_tensor_name(buf, sizeof(buf), l, m, "AB"[k]);
			if (!strcmp(buf, name)) {
				*layer = l;
				*mod = m;
				*which = "AB"[k];
				return 0;
			}
		}
	return -1;
}

int native_peft_open(struct native *n, const struct engine_adapter_config *cfg,
		     struct native_peft *p, struct eng_error *err)
{
	struct native_lora *a = n->lora;
	const char *dir = cfg->peft_dir;
	int rc;

	p->dfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (p->dfd < 0)
		return eng_fail(err, errno == ENOTDIR ? -EINVAL : eng_errno_code(errno),
				"peft_dir: %s: %s", dir, strerror(errno));
	rc = read_config(n, cfg, dir, p->dfd, err);
	if (rc == 0)
		rc = st_reader_open_at(p->dfd, PEFT_WEIGHTS, dir, &p->r, err);
	if (rc)
		return rc;
	/* Every tensor a LoRA matrix of this base, each module's pair whole
	 * and of the file's rank. */
	for (int i = 0; i < st_reader_count(p->r); i++) {
		const struct st_tensor_info *t = st_reader_tensor(p->r, i);
		int64_t l, in, out;
		int m;
		char which;

		if (n->value_model && (!strcmp(t->name, LORA_SCORE_WEIGHT) ||
					!strcmp(t->name, LORA_SCORE_BIAS))) {
			bool w = !strcmp(t->name, LORA_SCORE_WEIGHT);

			if (t->ndim != (w ? 2 : 1) || t->shape[0] != 1 ||
			    (w && t->shape[1] != n->cfg.hidden_size))
				return eng_fail(err, -EINVAL, "peft_dir: %s/%s: tensor %s has the "
						"wrong shape", dir, PEFT_WEIGHTS, t->name);
			continue;
		}
		if (parse_name(&n->cfg, t->name, &l, &m, &which))
			return eng_fail(err, -EINVAL, "peft_dir: %s/%s: tensor %s is not a LoRA "
					"matrix of this model's projections", dir, PEFT_WEIGHTS,
					t->name);
		if (!(a->info.targets & (1u << m)))
			return eng_fail(err, -EINVAL, "peft_dir: %s/%s: tensor %s is of a module "
					"target_modules does not name", dir, PEFT_WEIGHTS, t->name);
		lora_module_dims(&n->cfg, m, &in, &out);
		if (t->ndim != 2 || t->shape[0] != (which == 'A' ? a->info.rank : out) ||
		    t->shape[1] != (which == 'A' ? in : a->info.rank))
			return eng_fail(err, -EINVAL, "peft_dir: %s/%s: tensor %s must be [%lld, "
					"%lld] (r = %lld)", dir, PEFT_WEIGHTS, t->name,
					(long long)(which == 'A' ? a->info.rank : out),
					(long long)(which == 'A' ? in : a->info.rank),
					(long long)a->info.rank);
		a->layer_targets[l] |= 1u << m;
	}
	if (st_reader_count(p->r) == 0)
		return eng_fail(err, -EINVAL, "peft_dir: %s/%s holds no tensor", dir, PEFT_WEIGHTS);
	for (int64_t l = 0; l < n->cfg.num_layers; l++)
		for (int m = 0; m < LORA_MODULES; m++) {
			char nm[96];

			if (!(a->layer_targets[l] & (1u << m)))
				continue;
			for (int k = 0; k < 2; k++) {
				lora_tensor_name(nm, sizeof(nm), l, m, "AB"[k]);
				if (!st_reader_find(p->r, nm))
					return eng_fail(err, -EINVAL, "peft_dir: %s/%s: tensor %s is "
							"missing (its pair is there)", dir,
							PEFT_WEIGHTS, nm);
			}
			if (a->info.rank > lora_max_rank(&n->cfg, m))
				return eng_fail(err, -EINVAL, "peft_dir: r = %lld is larger than %s "
						"allows", (long long)a->info.rank, lora_module_name(m));
		}
	return 0;
}

int native_peft_read(struct native *n, struct native_peft *p, float *host,
		     struct eng_error *err)
{
	int rc = 0;

	st_reader_set_threads(p->r, n->io_threads);
	for (int64_t i = 0; i < n->table.count && !rc; i++) {
		const struct param_entry *e = &n->table.entries[i];

		/* a score head the file lacks stays the base's */
		if (e->layer < 0 && !st_reader_find(p->r, e->name))
			continue;
		rc = st_reader_read_f32(p->r, e->name, host + e->offset, e->numel, err);
	}
	return rc;
}

void native_peft_close(struct native_peft *p)
{
	st_reader_close(p->r);
	p->r = NULL;
	if (p->dfd >= 0)
		close(p->dfd);
	p->dfd = -1;
}

char *native_peft_config_json(const struct native *n)
{
	const struct native_lora *a = n->lora;
	json_t *c = json_object(), *t = json_array();
	bool uniform = true;
	char path[96], *text;

	for (int64_t l = 1; l < n->cfg.num_layers; l++)
		uniform = uniform && a->layer_targets[l] == a->layer_targets[0];
	for (int64_t l = 0; l < (uniform ? 1 : n->cfg.num_layers); l++)
		for (int m = 0; m < LORA_MODULES; m++) {
			if (!(a->layer_targets[l] & (1u << m)))
				continue;
			if (uniform)
				snprintf(path, sizeof(path), "%s", lora_module_name(m));
			else
				snprintf(path, sizeof(path), "model.layers.%lld.%s.%s", (long long)l,
					 lora_module_parent(m), lora_module_name(m));
			json_array_append_new(t, json_string(path));
		}
	json_object_set_new(c, "peft_type", json_string("LORA"));
	json_object_set_new(c, "task_type", json_string(n->value_model ? "TOKEN_CLS"
									: "CAUSAL_LM"));
	json_object_set_new(c, "base_model_name_or_path", json_null());
	json_object_set_new(c, "r", json_integer(a->info.rank));
	json_object_set_new(c, "lora_alpha", json_real(a->info.alpha));
	json_object_set_new(c, "use_rslora", json_boolean(a->info.rslora));
	json_object_set_new(c, "target_modules", t);
	json_object_set_new(c, "lora_dropout", json_real(0.0));
	json_object_set_new(c, "bias", json_string("none"));
	json_object_set_new(c, "fan_in_fan_out", json_false());
	json_object_set_new(c, "use_dora", json_false());
	json_object_set_new(c, "init_lora_weights", json_true());
	json_object_set_new(c, "inference_mode", json_true());
	json_object_set_new(c, "modules_to_save", n->value_model ?
			    json_pack("[s]", "score") : json_null());
	json_object_set_new(c, "layers_to_transform", json_null());
	json_object_set_new(c, "layers_pattern", json_null());
	json_object_set_new(c, "rank_pattern", json_object());
	json_object_set_new(c, "alpha_pattern", json_object());
	text = json_dumps(c, JSON_INDENT(2) | JSON_SORT_KEYS);
	json_decref(c);
	return text;
}
