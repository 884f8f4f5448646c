/* registry.c — engines by (model_type, backend, device).
 *
 * A static table: each engine implementation exports its ops and is listed
 * here once per device it supports; the key's device is the entry's. The
 * native engine is device-independent (it opens cfg->device): its ops
 * tables differ only in the key they report. An entry whose device was not built into this
 * binary is skipped (device_find() returns NULL for it: the CUDA device's
 * ops come from a stub with a NULL name when nvcc was not found — see
 * engines/device/device_table.c), so lookups of its keys fail with the list
 * of what is registered, and no caller #ifdefs anything. */
#include "engine.h"
#include "device/device.h"
#include "native/native_engine.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

struct registry_entry {
	const struct engine_ops *ops;
	const char *device;
};

static const struct registry_entry registry[] = {
	{ &native_lm_cpu_ops, "cpu" },
	{ &native_value_cpu_ops, "cpu" },
	{ &native_lm_cuda_ops, "cuda" },
	{ &native_value_cuda_ops, "cuda" },
};

#define REGISTRY_LEN (sizeof(registry) / sizeof(registry[0]))

static bool entry_built(const struct registry_entry *r)
{
	return device_find(r->device) != NULL;
}

static char keys[512];
static pthread_once_t keys_once = PTHREAD_ONCE_INIT;

static void build_keys(void)
{
	for (size_t i = 0; i < REGISTRY_LEN; i++) {
		size_t len = strlen(keys);

		if (!entry_built(&registry[i]))
			continue;
		snprintf(keys + len, sizeof(keys) - len, "%s(%s, %s, %s)", len ? ", " : "",
			 registry[i].ops->model_type, registry[i].ops->backend,
			 registry[i].device);
	}
}

const char *engine_registry_keys(void)
{
	(void)pthread_once(&keys_once, build_keys);
	return keys;
}

int engine_registry_lookup(const char *model_type, const char *backend,
			   const char *device, const struct engine_ops **ret,
			   struct eng_error *err)
{
	for (size_t i = 0; i < REGISTRY_LEN; i++) {
		const struct engine_ops *o = registry[i].ops;

		if (!strcmp(o->model_type, model_type) && !strcmp(o->backend, backend) &&
		    !strcmp(registry[i].device, device) && entry_built(&registry[i])) {
			*ret = o;
			return 0;
		}
	}
	return eng_fail(err, -ENODEV,
			"engine (%s, %s, %s) is not registered; registered: %s",
			model_type, backend, device, engine_registry_keys());
}
