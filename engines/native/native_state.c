/* native_state.c — the native engine's members of engine_state.json
 * (docs/DESIGN.md §6): written from the engine's state, and on load
 * checked against their schema before anything changes. Every key is
 * required with its JSON type, no unknown key is allowed (besides the
 * checkpoint library's format_version, files, state_xxh64, whose checksum
 * engines/checkpoint verified first), and the values must hold: steps
 * >= 0 (the two counters <= 2^53), 4 non-zero RNG words of 16 hex digits, contents without repeats
 * that match the files listed, hyper-parameters in the ranges an init
 * config must have (engine_optim_config_check, lr_schedule_validate).
 * Such a violation is -EBADMSG naming the file and the key. An intact
 * checkpoint of another engine or model size is -EINVAL; any world size
 * loads (the file holds every moment).
 * optimizer_step and lr_scheduler_step are independent (a skipped step
 * does not count; a controller may call either alone): no rule ties them.
 */
#include "native_engine.h"

#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "../checkpoint/checkpoint.h"
#include "../optim/schedule.h"
#include "native_peft.h"

#define STATE_MAX_STEP (INT64_C(1) << 53)

json_t *native_state_json(struct native *n, int64_t global_step, unsigned contents)
{
	json_t *s = json_object(), *rng = json_array(), *c = json_array();
	uint64_t st[RNG_STATE_WORDS];
	char hex[32];

	if (!s || !rng || !c) {
		json_decref(s);
		json_decref(rng);
		json_decref(c);
		return NULL;
	}
	rng_get_state(&n->rng, st);
	for (int i = 0; i < 4; i++) {
		snprintf(hex, sizeof(hex), "%016" PRIx64, st[i]);
		json_array_append_new(rng, json_string(hex));
	}
	if (contents & CKPT_MODEL)
		json_array_append_new(c, json_string("model"));
	if (contents & CKPT_OPTIMIZER)
		json_array_append_new(c, json_string("optimizer"));
	if (contents & CKPT_EXTRA)
		json_array_append_new(c, json_string("extra"));
	json_object_set_new(s, "engine_key", json_string(n->key));
	json_object_set_new(s, "world_size", json_integer(n->group.dist ? n->group.dist->world_size : 1));
	json_object_set_new(s, "global_step", json_integer(global_step));
	json_object_set_new(s, "optimizer_step", json_integer(n->optim_step));
	json_object_set_new(s, "lr_scheduler_step", json_integer(n->sched_step));
	json_object_set_new(s, "num_parameters", json_integer(n->table.total));
	json_object_set_new(s, "seed", json_integer((json_int_t)n->seed));
	json_object_set_new(s, "rng_state", rng);
	json_object_set_new(s, "contents", c);
	json_object_set_new(s, "optimizer", json_pack("{s:s, s:f, s:f, s:f, s:f, s:f, s:f}",
		"type", "adamw", "lr", n->optim.lr, "beta1", n->optim.beta1,
		"beta2", n->optim.beta2, "eps", n->optim.eps,
		"weight_decay", n->optim.weight_decay, "clip_grad", n->optim.clip_grad));
	json_object_set_new(s, "lr_scheduler", json_pack("{s:i, s:I, s:I, s:f, s:f}",
		"type", (int)n->sched.type, "warmup_steps", (json_int_t)n->sched.warmup_steps,
		"total_steps", (json_int_t)n->sched.total_steps,
		"min_lr_ratio", n->sched.min_lr_ratio, "num_cycles", n->sched.num_cycles));
	if (json_object_size(s) != 11 || !json_object_get(s, "optimizer") ||
	    !json_object_get(s, "lr_scheduler")) {
		json_decref(s);
		return NULL;
	}
	return s;
}

/* --- the schema ---------------------------------------------------------- */

struct state_key {
	const char *name;
	json_type type;
};

static const struct state_key top_keys[] = {
	{"engine_key", JSON_STRING}, {"world_size", JSON_INTEGER},
	{"global_step", JSON_INTEGER}, {"optimizer_step", JSON_INTEGER},
	{"lr_scheduler_step", JSON_INTEGER}, {"num_parameters", JSON_INTEGER},
	{"seed", JSON_INTEGER}, {"rng_state", JSON_ARRAY}, {"contents", JSON_ARRAY},
	{"optimizer", JSON_OBJECT}, {"lr_scheduler", JSON_OBJECT},
};
static const struct state_key optim_keys[] = {
	{"type", JSON_STRING}, {"lr", JSON_REAL}, {"beta1", JSON_REAL}, {"beta2", JSON_REAL},
	{"eps", JSON_REAL}, {"weight_decay", JSON_REAL}, {"clip_grad", JSON_REAL},
};
static const struct state_key sched_keys[] = {
	{"type", JSON_INTEGER}, {"warmup_steps", JSON_INTEGER}, {"total_steps", JSON_INTEGER},
	{"min_lr_ratio", JSON_REAL}, {"num_cycles", JSON_REAL},
};
#define NKEYS(a) (sizeof(a) / sizeof((a)[0]))

static const char *type_name(json_type t)
{
	switch (t) {
	case JSON_OBJECT: return "an object";
	case JSON_ARRAY: return "an array";
	case JSON_STRING: return "a string";
	case JSON_INTEGER: return "an integer";
	case JSON_REAL: return "a real number";
	default: return "?";
	}
}

/* Every key of keys[] present with its type; nothing else (but the
 * library's members at the top). prefix: "" or "optimizer." */
static int check_keys(json_t *obj, const struct state_key *keys, size_t n, const char *prefix,
		      bool top, const char *shown, struct eng_error *err)
{
	const char *name;
	json_t *v;
	size_t i;

	for (i = 0; i < n; i++) {
		v = json_object_get(obj, keys[i].name);
		if (!v)
			return eng_fail(err, -EBADMSG, "%s: key '%s%s' is missing", shown, prefix,
					keys[i].name);
		if (json_typeof(v) != keys[i].type)
			return eng_fail(err, -EBADMSG, "%s: %s%s: must be %s", shown, prefix,
					keys[i].name, type_name(keys[i].type));
	}
	json_object_foreach(obj, name, v) {
		for (i = 0; i < n && strcmp(keys[i].name, name); i++)
			;
		if (i == n && !(top && ckpt_reserved_key(name)))
			return eng_fail(err, -EBADMSG, "%s: unknown key '%s%s'", shown, prefix,
					name);
	}
	return 0;
}

static int64_t int_of(json_t *obj, const char *key)
{
	return json_integer_value(json_object_get(obj, key));
}

static double real_of(json_t *obj, const char *key)
{
	return json_real_value(json_object_get(obj, key));
}

static int check_rng(json_t *a, const char *shown, uint64_t s[4], struct eng_error *err)
{
	if (json_array_size(a) != 4)
		return eng_fail(err, -EBADMSG, "%s: rng_state: must be 4 hex strings", shown);
	for (int i = 0; i < 4; i++)
		if (!ckpt_hex64(json_string_value(json_array_get(a, i)), &s[i]))
			return eng_fail(err, -EBADMSG, "%s: rng_state[%d]: not 16 lowercase hex "
					"digits", shown, i);
	if (!(s[0] | s[1] | s[2] | s[3]))
		return eng_fail(err, -EBADMSG, "%s: rng_state: all zero", shown);
	return 0;
}

/* `name` is an optimizer file of this checkpoint: one engine's, or a
 * shard of its world size. */
static bool is_optim_file(json_t *state, const char *name)
{
	json_int_t W = json_integer_value(json_object_get(state, "world_size"));
	json_int_t nfiles = (json_int_t)json_object_size(json_object_get(state, "files"));
	char want[64];

	if (!strcmp(name, NATIVE_OPTIM_FILE))
		return true;
	for (json_int_t r = 0; r < W && r < nfiles; r++) {
		native_shard_name(want, sizeof(want), (int)r, (int)W);
		if (!strcmp(name, want))
			return true;
	}
	return false;
}

/* contents: known names, each once, matching the files listed (the
 * model's files: an adapter's are PEFT's). */
static int check_contents(const struct native *n, json_t *state, const char *shown,
			  unsigned *ret, struct eng_error *err)
{
	static const struct {
		const char *name;
		unsigned flag;
	} names[] = {{"model", CKPT_MODEL}, {"optimizer", CKPT_OPTIMIZER}, {"extra", CKPT_EXTRA}};
	const struct {
		const char *file;
		unsigned needs;
	} files[] = {{n->lora ? NATIVE_PEFT_CONFIG : "config.json", CKPT_MODEL},
		     {native_model_file(n), CKPT_MODEL}};
	json_t *c = json_object_get(state, "contents"), *fl = json_object_get(state, "files"), *v;
	unsigned got = 0;
	const char *name;
	size_t i, k;

	json_array_foreach(c, i, v) {
		for (k = 0; k < NKEYS(names); k++)
			if (json_is_string(v) && !strcmp(json_string_value(v), names[k].name))
				break;
		if (k == NKEYS(names))
			return eng_fail(err, -EBADMSG, "%s: contents[%zu]: not one of model, "
					"optimizer, extra", shown, i);
		if (got & names[k].flag)
			return eng_fail(err, -EBADMSG, "%s: contents[%zu]: '%s' listed twice",
					shown, i, names[k].name);
		got |= names[k].flag;
	}
	if (!got)
		return eng_fail(err, -EBADMSG, "%s: contents: empty", shown);
	for (k = 0; k < NKEYS(files); k++) {
		bool listed = json_object_get(fl, files[k].file) != NULL;

		if (listed != !!(got & files[k].needs))
			return eng_fail(err, -EBADMSG, "%s: files %s %s, but contents %s '%s'",
					shown, listed ? "lists" : "lacks", files[k].file,
					listed ? "lacks" : "lists",
					files[k].needs == CKPT_MODEL ? "model" : "optimizer");
	}
	/* The optimizer: one engine's file or a group's shards
	 * (native_optim_files.c), exactly when contents lists it. */
	if (got & CKPT_OPTIMIZER) {
		int W, rc = native_optim_layout(state, shown, &W, err);

		if (rc)
			return rc;
	}
	json_object_foreach(fl, name, v) {
		for (k = 0; k < NKEYS(files) && strcmp(files[k].file, name); k++)
			;
		if (k == NKEYS(files) && !is_optim_file(state, name))
			return eng_fail(err, -EBADMSG, "%s: files: '%s' is not a file of this "
					"engine's checkpoints%s", shown, name,
					got & CKPT_OPTIMIZER ? "" : " without the optimizer");
		if (k == NKEYS(files) && !(got & CKPT_OPTIMIZER))
			return eng_fail(err, -EBADMSG, "%s: files lists %s, but contents lacks "
					"'optimizer'", shown, name);
	}
	*ret = got;
	return 0;
}

static int check_hyper(json_t *state, const char *shown, struct eng_error *err)
{
	json_t *o = json_object_get(state, "optimizer");
	json_t *l = json_object_get(state, "lr_scheduler");
	struct engine_optim_config oc;
	struct engine_sched_config sc;
	struct eng_error e2 = {0};
	int64_t type;

	if (strcmp(json_string_value(json_object_get(o, "type")), "adamw"))
		return eng_fail(err, -EBADMSG, "%s: optimizer.type: must be \"adamw\"", shown);
	oc.lr = real_of(o, "lr");
	oc.beta1 = real_of(o, "beta1");
	oc.beta2 = real_of(o, "beta2");
	oc.eps = real_of(o, "eps");
	oc.weight_decay = real_of(o, "weight_decay");
	oc.clip_grad = real_of(o, "clip_grad");
	if (engine_optim_config_check(&oc, &e2))
		return eng_fail(err, -EBADMSG, "%s: %s", shown, e2.msg);
	type = int_of(l, "type");
	if (type < INT_MIN || type > INT_MAX)
		return eng_fail(err, -EBADMSG, "%s: lr_scheduler.type: %lld is not a schedule",
				shown, (long long)type);
	sc.type = (enum lr_schedule_type)type;
	sc.warmup_steps = int_of(l, "warmup_steps");
	sc.total_steps = int_of(l, "total_steps");
	sc.min_lr_ratio = real_of(l, "min_lr_ratio");
	sc.num_cycles = real_of(l, "num_cycles");
	if (lr_schedule_validate(&sc, &e2))
		return eng_fail(err, -EBADMSG, "%s: %s", shown, e2.msg);
	return 0;
}

int native_state_check(struct native *n, json_t *state, const char *shown,
		       struct native_saved_state *ret, struct eng_error *err)
{
	static const char *const steps[] = {"global_step", "optimizer_step", "lr_scheduler_step"};
	const char *key;
	int rc;

	rc = check_keys(state, top_keys, NKEYS(top_keys), "", true, shown, err);
	if (!rc)
		rc = check_keys(json_object_get(state, "optimizer"), optim_keys,
				NKEYS(optim_keys), "optimizer.", false, shown, err);
	if (!rc)
		rc = check_keys(json_object_get(state, "lr_scheduler"), sched_keys,
				NKEYS(sched_keys), "lr_scheduler.", false, shown, err);
	if (rc)
		return rc;
	/* global_step is only handed back (SaveCheckpoint takes any >= 0); the
	 * two counters are restored and counted on: at most 2^53 (exact in any
	 * JSON reader), far from int64's end. */
	for (size_t i = 0; i < NKEYS(steps); i++) {
		int64_t v = int_of(state, steps[i]), max = i == 0 ? INT64_MAX : STATE_MAX_STEP;

		if (v < 0 || v > max)
			return eng_fail(err, -EBADMSG, "%s: %s: %lld, must be in [0, %lld]", shown,
					steps[i], (long long)v, (long long)max);
	}
	if (int_of(state, "world_size") < 1 || int_of(state, "num_parameters") < 1)
		return eng_fail(err, -EBADMSG, "%s: %s: must be >= 1", shown,
				int_of(state, "world_size") < 1 ? "world_size" : "num_parameters");
	rc = check_rng(json_object_get(state, "rng_state"), shown, ret->rng, err);
	if (!rc)
		rc = check_contents(n, state, shown, &ret->contents, err);
	if (!rc)
		rc = check_hyper(state, shown, err);
	if (rc)
		return rc;
	/* An intact checkpoint, but not one for this engine. */
	key = json_string_value(json_object_get(state, "engine_key"));
	if (strcmp(key, n->key))
		return eng_fail(err, -EINVAL, "path: %s: a checkpoint of engine %s, this engine "
				"is %s", shown, key, n->key);
	/* world_size says how many ranks trained it: the checkpoint itself
	 * holds every moment (a group's rank 0 gathered them), so any world
	 * size loads it. */
	if (int_of(state, "num_parameters") != n->table.total)
		return eng_fail(err, -EINVAL, "path: %s: a checkpoint of a model with %lld "
				"parameters, this engine's has %lld", shown,
				(long long)int_of(state, "num_parameters"),
				(long long)n->table.total);
	ret->global_step = int_of(state, "global_step");
	ret->optim_step = int_of(state, "optimizer_step");
	ret->sched_step = int_of(state, "lr_scheduler_step");
	return 0;
}
